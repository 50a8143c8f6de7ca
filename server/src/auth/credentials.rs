//! Finding and checking a caller's token.
//!
//! Programs send `Authorization: Bearer <token>` (REST and the WebSocket
//! upgrade). Browsers cannot set headers on a WebSocket, so `/ahp` also
//! takes the token as a subprotocol (`bearer.<token>`, offered next to a
//! real one, [`WS_PROTOCOLS`], which the server selects) or as an
//! `access_token` query parameter. No form of the token is ever logged; a
//! refusal says only that a valid token is required.

use std::sync::Arc;

use axum::http::{HeaderMap, header};

use super::limits::PrincipalLimits;
use super::token::Authenticator;
use super::{AuthError, Principal};

/// The subprotocols `/ahp` selects, so a browser that offers
/// `bearer.<token>` has a real one to get back.
pub const WS_PROTOCOLS: [&str; 2] = ["ahp", "jsonrpc"];

/// The subprotocol prefix that carries a token.
pub const BEARER_PROTOCOL: &str = "bearer.";

/// The query parameter that carries a token on `/ahp`.
pub const ACCESS_TOKEN_PARAM: &str = "access_token";

/// The host's authentication: off (every caller is the loopback admin) or
/// a token authenticator; cheap to clone.
#[derive(Debug, Clone)]
pub struct Auth {
    tokens: Option<Arc<Authenticator>>,
    metrics_token: Option<Arc<str>>,
    /// Per-principal bounds (off with authentication off).
    pub limits: PrincipalLimits,
    failures: crate::telemetry::metrics::Counters,
}

impl Default for Auth {
    fn default() -> Self {
        Self::new(None, None, PrincipalLimits::new(None))
    }
}

impl Auth {
    /// Authentication with `tokens` (`None`: off), a separate token for
    /// `/metrics`, and per-principal limits.
    pub fn new(
        tokens: Option<Authenticator>,
        metrics_token: Option<String>,
        limits: PrincipalLimits,
    ) -> Self {
        Self {
            tokens: tokens.map(Arc::new),
            metrics_token: metrics_token.map(Into::into),
            limits,
            failures: Default::default(),
        }
    }

    /// Whether tokens are required.
    pub fn enabled(&self) -> bool {
        self.tokens.is_some()
    }

    /// The clock skew tokens are allowed; a connection is closed this long
    /// after its token's `exp`.
    pub fn leeway(&self) -> std::time::Duration {
        std::time::Duration::from_secs(self.tokens.as_ref().map_or(0, |t| t.leeway()))
    }

    /// Failed authentications by reason (registered in `/metrics`).
    pub fn failures(&self) -> &crate::telemetry::metrics::Counters {
        &self.failures
    }

    /// The principal `token` names: the loopback admin with authentication
    /// off, else the token's principal or a 401 that tells nothing more.
    pub fn authenticate(
        &self,
        token: Option<&str>,
        via: &'static str,
    ) -> Result<Principal, AuthError> {
        let Some(tokens) = &self.tokens else {
            let principal = Principal::loopback_admin();
            tracing::Span::current().record("sub", principal.sub.as_str());
            return Ok(principal);
        };
        let refused = match token {
            None => "missing",
            Some(token) => match tokens.verify(token) {
                Ok(principal) => {
                    // The request's log line names who made it (never the token).
                    tracing::Span::current().record("sub", principal.sub.as_str());
                    return Ok(principal);
                }
                Err(refused) => refused.as_str(),
            },
        };
        self.failures.get_or_create(&[("reason", refused)]).inc();
        tracing::info!(reason = refused, via, "authentication failed");
        Err(AuthError::Unauthorized)
    }

    /// Checks a `/metrics` caller: anyone with authentication off, else the
    /// metrics token or an admin's token.
    pub fn authorize_metrics(&self, headers: &HeaderMap) -> Result<(), AuthError> {
        if !self.enabled() {
            return Ok(());
        }
        let token = bearer(headers);
        if let (Some(expected), Some(given)) = (&self.metrics_token, token)
            && constant_time_eq(expected.as_bytes(), given.as_bytes())
        {
            return Ok(());
        }
        let principal = self.authenticate(token, "metrics")?;
        if principal.is_admin() {
            Ok(())
        } else {
            Err(AuthError::Forbidden(
                "/metrics needs an admin token or the metrics token.".to_owned(),
            ))
        }
    }
}

/// The token of an `Authorization: Bearer` header.
pub fn bearer(headers: &HeaderMap) -> Option<&str> {
    let value = headers.get(header::AUTHORIZATION)?.to_str().ok()?;
    let (scheme, token) = value.split_once(' ')?;
    scheme
        .eq_ignore_ascii_case("bearer")
        .then(|| token.trim())
        .filter(|t| !t.is_empty())
}

/// The token a WebSocket upgrade carries: the header, else a
/// `bearer.<token>` subprotocol, else the `access_token` query parameter.
pub fn ws_token<'a>(headers: &'a HeaderMap, query: Option<&'a str>) -> Option<&'a str> {
    if let Some(token) = bearer(headers) {
        return Some(token);
    }
    let offered = headers
        .get_all(header::SEC_WEBSOCKET_PROTOCOL)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(str::trim)
        .find_map(|p| p.strip_prefix(BEARER_PROTOCOL));
    if offered.is_some() {
        return offered;
    }
    query?
        .split('&')
        .filter_map(|pair| pair.split_once('='))
        .find(|(key, _)| *key == ACCESS_TOKEN_PARAM)
        .map(|(_, token)| token)
        .filter(|t| !t.is_empty())
}

/// Compares without stopping at the first difference, so the time taken
/// tells nothing of how much of a guess was right.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0_u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    #[test]
    fn tokens_are_found_where_clients_put_them() {
        let mut headers = HeaderMap::new();
        assert_eq!(ws_token(&headers, Some("x=1&access_token=q")), Some("q"));
        headers.insert(
            header::SEC_WEBSOCKET_PROTOCOL,
            HeaderValue::from_static("ahp, bearer.p"),
        );
        assert_eq!(ws_token(&headers, Some("access_token=q")), Some("p"));
        headers.insert(header::AUTHORIZATION, HeaderValue::from_static("Bearer h"));
        assert_eq!(ws_token(&headers, None), Some("h"));
        headers.insert(header::AUTHORIZATION, HeaderValue::from_static("Basic h"));
        assert_eq!(bearer(&headers), None);
        assert!(constant_time_eq(b"abc", b"abc") && !constant_time_eq(b"abc", b"abd"));
    }
}
