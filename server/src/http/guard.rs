//! The browser boundary: what a web page on another origin, or a page that
//! rebound its own name to this host's address, may send.
//!
//! Without authentication the loopback caller is an admin, and a browser
//! lets any page it shows open a WebSocket to `127.0.0.1` and send requests
//! there. Two checks keep such pages out (SECURITY.md, "Browsers"):
//!
//! * **Origin.** A request that carries an `Origin` (browsers send it on
//!   every WebSocket upgrade and every cross-origin request) is refused with
//!   403 unless that origin is the server's own (its authority is the
//!   request's `Host`) or one of `--allowed-origins`. Programs send no
//!   `Origin` and are not affected.
//! * **Host** (authentication off). A page that rebinds its DNS name to this
//!   host's address still sends its own name as `Host`. Only IP literals,
//!   `localhost` (and names under it) and `--allowed-hosts` are served;
//!   anything else gets 421. With authentication on the check is off: such
//!   a page has no token.
//!
//! The health routes answer whatever the `Host`: load balancers probe them
//! by address or by a name of their own, and they tell nothing.

use std::net::IpAddr;

use axum::extract::{Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware::Next;
use axum::response::Response;

use super::error::problem;

/// The browser boundary's settings.
#[derive(Debug, Clone, Default)]
pub struct BrowserPolicy {
    /// Origins besides the server's own that may send requests and open
    /// WebSockets (`scheme://host[:port]`, lower case, no trailing slash).
    allowed_origins: Vec<String>,
    /// Host names served besides IP literals and `localhost` when the Host
    /// check is on (lower case, no port).
    allowed_hosts: Vec<String>,
    /// Whether the Host check runs (authentication off).
    check_host: bool,
}

/// Why an `--allowed-origins` or `--allowed-hosts` entry cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct PolicyError(String);

impl BrowserPolicy {
    /// A policy allowing `origins` (as `scheme://host[:port]`) and `hosts`
    /// (names, optionally with a port, which is ignored); the Host check
    /// runs once [`BrowserPolicy::checking_hosts`] turns it on.
    pub fn new(origins: &[String], hosts: &[String]) -> Result<Self, PolicyError> {
        let allowed_origins = origins
            .iter()
            .map(|o| o.trim())
            .filter(|o| !o.is_empty())
            .map(normalise_origin)
            .collect::<Result<_, _>>()?;
        let allowed_hosts = hosts
            .iter()
            .map(|h| h.trim())
            .filter(|h| !h.is_empty())
            .map(|h| {
                let name = host_name(h).to_ascii_lowercase();
                if name.is_empty() || name.contains('/') {
                    Err(PolicyError(format!(
                        "--allowed-hosts: {h:?} is not a host name (give names like \
                         tether.example.com, without a scheme)"
                    )))
                } else {
                    Ok(name)
                }
            })
            .collect::<Result<_, _>>()?;
        Ok(Self {
            allowed_origins,
            allowed_hosts,
            check_host: false,
        })
    }

    /// The policy with the Host check on or off (on without authentication).
    pub fn checking_hosts(mut self, check: bool) -> Self {
        self.check_host = check;
        self
    }

    /// The origins a separately hosted console may use (for CORS).
    pub fn allowed_origins(&self) -> &[String] {
        &self.allowed_origins
    }

    /// Whether requests with `origin` are served on a request for `host`.
    pub fn origin_allowed(&self, origin: &str, host: Option<&str>) -> bool {
        let origin = origin.trim().trim_end_matches('/').to_ascii_lowercase();
        let own = host.is_some_and(|host| {
            let host = host.to_ascii_lowercase();
            origin
                .strip_prefix("http://")
                .or_else(|| origin.strip_prefix("https://"))
                .is_some_and(|authority| same_authority(authority, &host))
        });
        own || self.allowed_origins.contains(&origin)
    }

    /// Whether a request naming `host` is served.
    pub fn host_allowed(&self, host: &str) -> bool {
        if !self.check_host {
            return true;
        }
        let name = host_name(host).to_ascii_lowercase();
        let name = name.trim_end_matches('.');
        let literal = name
            .strip_prefix('[')
            .and_then(|n| n.strip_suffix(']'))
            .unwrap_or(name);
        literal.parse::<IpAddr>().is_ok()
            || name == "localhost"
            || name.ends_with(".localhost")
            || self.allowed_hosts.iter().any(|h| h == name)
    }
}

/// `a` and `b` name the same authority, a default port matching none.
fn same_authority(origin_authority: &str, host: &str) -> bool {
    let strip = |a: &str| -> String {
        a.strip_suffix(":80")
            .or_else(|| a.strip_suffix(":443"))
            .unwrap_or(a)
            .to_owned()
    };
    origin_authority == host || strip(origin_authority) == strip(host)
}

/// The name part of a `Host` value (`name`, `name:port`, `[v6]:port`).
fn host_name(host: &str) -> &str {
    if host.starts_with('[') {
        return host.split_inclusive(']').next().unwrap_or(host);
    }
    match host.rsplit_once(':') {
        Some((name, port)) if port.chars().all(|c| c.is_ascii_digit()) => name,
        _ => host,
    }
}

fn normalise_origin(origin: &str) -> Result<String, PolicyError> {
    let lower = origin.trim_end_matches('/').to_ascii_lowercase();
    let authority = lower
        .strip_prefix("http://")
        .or_else(|| lower.strip_prefix("https://"));
    match authority {
        Some(authority) if !authority.is_empty() && !authority.contains('/') => Ok(lower),
        _ => Err(PolicyError(format!(
            "--allowed-origins: {origin:?} is not an origin; give scheme://host[:port], for \
             example https://console.example.com"
        ))),
    }
}

/// The routes every `Host` may reach.
fn host_exempt(path: &str) -> bool {
    matches!(path, "/healthz" | "/readyz")
}

/// Refuses what a foreign page could send (see the module's doc).
pub async fn guard(State(policy): State<BrowserPolicy>, request: Request, next: Next) -> Response {
    let host = request
        .headers()
        .get(header::HOST)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned)
        .or_else(|| request.uri().authority().map(|a| a.as_str().to_owned()));
    if let Some(host) = &host
        && !host_exempt(request.uri().path())
        && !policy.host_allowed(host)
    {
        tracing::info!(host = %host, "refused a request for a host name this server does not serve");
        return problem(
            StatusCode::MISDIRECTED_REQUEST,
            "host_not_allowed",
            Some(format!(
                "This server does not answer for the host name {:?}: without authentication it \
                 serves loopback names and IP addresses only. Add the name to --allowed-hosts \
                 (TETHER_ALLOWED_HOSTS) to serve it.",
                host_name(host)
            )),
        );
    }
    if let Some(origin) = request.headers().get(header::ORIGIN) {
        let allowed = origin
            .to_str()
            .is_ok_and(|o| policy.origin_allowed(o, host.as_deref()));
        if !allowed {
            let shown = origin.to_str().unwrap_or("(not text)").to_owned();
            tracing::info!(origin = %shown, "refused a request from a foreign origin");
            return problem(
                StatusCode::FORBIDDEN,
                "origin_not_allowed",
                Some(format!(
                    "Requests from the web origin {shown:?} are not accepted: only this \
                     server's own pages and --allowed-origins (TETHER_ALLOWED_ORIGINS) may \
                     call it from a browser."
                )),
            );
        }
    }
    next.run(request).await
}

/// CORS for the allowed origins (a separately hosted console), or none.
pub fn cors(policy: &BrowserPolicy) -> Option<tower_http::cors::CorsLayer> {
    use axum::http::Method;
    use tower_http::cors::{AllowOrigin, CorsLayer};
    let origins: Vec<HeaderValue> = policy
        .allowed_origins
        .iter()
        .filter_map(|o| HeaderValue::from_str(o).ok())
        .collect();
    if origins.is_empty() {
        return None;
    }
    Some(
        CorsLayer::new()
            .allow_origin(AllowOrigin::list(origins))
            .allow_methods([Method::GET, Method::POST, Method::PUT, Method::DELETE])
            .allow_headers([
                header::AUTHORIZATION,
                header::CONTENT_TYPE,
                header::HeaderName::from_static("x-request-id"),
            ])
            .expose_headers([
                header::HeaderName::from_static("x-request-id"),
                header::RETRY_AFTER,
                header::LOCATION,
            ])
            .max_age(std::time::Duration::from_secs(600)),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(origins: &[&str], hosts: &[&str], check_host: bool) -> BrowserPolicy {
        let own = |list: &[&str]| list.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
        BrowserPolicy::new(&own(origins), &own(hosts))
            .expect("valid policy")
            .checking_hosts(check_host)
    }

    #[test]
    fn own_and_listed_origins_pass_and_others_do_not() {
        let p = policy(&["https://Console.example.com/"], &[], true);
        let host = Some("127.0.0.1:7878");
        assert!(p.origin_allowed("http://127.0.0.1:7878", host));
        assert!(p.origin_allowed("https://console.example.com", host));
        assert!(!p.origin_allowed("http://evil.example", host));
        assert!(!p.origin_allowed("null", host));
        assert!(!p.origin_allowed("http://127.0.0.1:7879", host));
        assert!(!p.origin_allowed("http://127.0.0.1:7878", None));
        // Behind a TLS proxy the page is https and Host has no port.
        assert!(p.origin_allowed("https://tether.example:443", Some("tether.example")));
    }

    #[test]
    fn hosts_are_ip_literals_localhost_or_listed() {
        let p = policy(&[], &["tether.internal:7878"], true);
        for host in [
            "127.0.0.1:7878",
            "[::1]:7878",
            "localhost",
            "LOCALHOST:1",
            "app.localhost",
            "10.0.0.5",
            "tether.internal",
        ] {
            assert!(p.host_allowed(host), "{host}");
        }
        for host in [
            "evil.example",
            "evil.example:7878",
            "localhost.evil.example",
        ] {
            assert!(!p.host_allowed(host), "{host}");
        }
        assert!(policy(&[], &[], false).host_allowed("evil.example"));
    }

    #[test]
    fn bad_entries_are_refused() {
        let own = |s: &str| vec![s.to_owned()];
        assert!(BrowserPolicy::new(&own("console.example.com"), &[]).is_err());
        assert!(BrowserPolicy::new(&own("https://a/b"), &[]).is_err());
        assert!(BrowserPolicy::new(&[], &own("http://x/")).is_err());
    }
}
