//! Bearer tokens: JWTs validated with `jsonwebtoken`.
//!
//! Two kinds of key, each accepting exactly one algorithm: the shared
//! secret (HS256; `tether token` mints with it), and the public keys of an
//! identity provider's JWKS file (RS256 for an RSA key, ES256 for a P-256
//! key, chosen by the token's `kid`). A token whose header names any other
//! algorithm — `none` among them — is refused before its signature is
//! looked at. `exp` and `sub` are required, `nbf` is honoured, both with a
//! small leeway for clock skew. Claims: `sub`, `role`, `projects` (names,
//! or `["*"]`), `exp`.

use std::collections::BTreeSet;
use std::fmt;
use std::time::Duration;

use jsonwebtoken::errors::ErrorKind;
use jsonwebtoken::{Algorithm, DecodingKey, EncodingKey, Header, Validation};
use serde::{Deserialize, Serialize};

use super::{Principal, Role};

/// The shortest secret accepted: 256 bits, HS256's key size.
pub const MIN_SECRET_BYTES: usize = 32;

/// Seconds of clock skew allowed on `exp` and `nbf`.
pub const LEEWAY_SECS: u64 = 30;

/// The `projects` entry that means every project.
pub const ALL_PROJECTS: &str = "*";

/// A token's claims.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Claims {
    /// Who the token is for.
    pub sub: String,
    /// Its role.
    pub role: Role,
    /// The projects it may see, or `["*"]`.
    pub projects: Vec<String>,
    /// Expiry, seconds since the Unix epoch.
    pub exp: u64,
    /// Not valid before, seconds since the Unix epoch.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nbf: Option<u64>,
    /// Issued at, seconds since the Unix epoch.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub iat: Option<u64>,
}

/// Why a token was refused. Logged and counted by kind; never sent to the
/// caller, who only learns that a valid token is required.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refused {
    /// Not a JWT at all, or its claims are missing or malformed.
    Malformed,
    /// The header names an algorithm other than HS256.
    Algorithm,
    /// The signature does not match the secret.
    Signature,
    /// Past `exp`.
    Expired,
    /// Before `nbf`.
    NotYetValid,
}

impl Refused {
    /// The reason's label in logs and `/metrics`.
    pub fn as_str(self) -> &'static str {
        match self {
            Refused::Malformed => "malformed",
            Refused::Algorithm => "algorithm",
            Refused::Signature => "signature",
            Refused::Expired => "expired",
            Refused::NotYetValid => "not_yet_valid",
        }
    }
}

/// Errors of setting up or minting tokens.
#[derive(Debug, thiserror::Error)]
pub enum TokenError {
    /// The secret is too short.
    #[error("the auth secret has {0} bytes; it needs at least {MIN_SECRET_BYTES} (256 bits)")]
    WeakSecret(usize),
    /// A claim is not acceptable.
    #[error("{0}")]
    Claim(String),
    /// Signing failed.
    #[error("cannot sign the token: {0}")]
    Sign(String),
}

/// Validates tokens (and mints them with the secret).
pub struct Authenticator {
    /// The shared secret's keys, when one is configured.
    hmac: Option<(EncodingKey, DecodingKey)>,
    /// An identity provider's public keys by `kid`, with the one algorithm
    /// each accepts.
    jwks: Vec<(String, Algorithm, DecodingKey)>,
    validation: Validation,
    /// What the identity provider's tokens must say of themselves: its
    /// issuer (`iss`) and this server as their audience (`aud`), so a
    /// token it issued for another application is refused.
    provider: Validation,
}

/// The identity provider whose tokens are accepted.
#[derive(Debug, Clone, Copy)]
pub struct Provider<'a> {
    /// Its JWKS document, as JSON text.
    pub jwks: &'a str,
    /// The `iss` its tokens carry.
    pub issuer: &'a str,
    /// The `aud` its tokens for this server carry.
    pub audience: &'a str,
}

impl fmt::Debug for Authenticator {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The keys are the secret: never printed.
        f.debug_struct("Authenticator")
            .field("algorithm", &"HS256")
            .finish_non_exhaustive()
    }
}

impl Authenticator {
    /// An authenticator for `secret` (at least [`MIN_SECRET_BYTES`]).
    pub fn new(secret: &[u8]) -> Result<Self, TokenError> {
        Self::with_keys(Some(secret), None)
    }

    /// An authenticator for a secret and/or an identity provider's keys;
    /// at least one of the two.
    pub fn with_keys(
        secret: Option<&[u8]>,
        provider: Option<Provider<'_>>,
    ) -> Result<Self, TokenError> {
        let hmac = match secret {
            None => None,
            Some(secret) if secret.len() < MIN_SECRET_BYTES => {
                return Err(TokenError::WeakSecret(secret.len()));
            }
            Some(secret) => {
                let key = |e: jsonwebtoken::errors::Error| TokenError::Sign(e.to_string());
                Some((
                    EncodingKey::from_secret(secret).map_err(key)?,
                    DecodingKey::from_secret(secret).map_err(key)?,
                ))
            }
        };
        let jwks = match &provider {
            None => Vec::new(),
            Some(provider) => jwks_keys(provider.jwks)?,
        };
        if hmac.is_none() && jwks.is_empty() {
            return Err(TokenError::Claim(
                "authentication needs a secret or a JWKS file with at least one key".to_owned(),
            ));
        }
        let mut validation = Validation::new(Algorithm::HS256);
        validation.leeway = LEEWAY_SECS;
        validation.validate_nbf = true;
        validation.validate_aud = false;
        validation.set_required_spec_claims(&["exp", "sub"]);
        let mut for_provider = validation.clone();
        if let Some(provider) = provider {
            if provider.issuer.is_empty() || provider.audience.is_empty() {
                return Err(TokenError::Claim(
                    "a JWKS needs the issuer and the audience its tokens must name".to_owned(),
                ));
            }
            for_provider.validate_aud = true;
            for_provider.set_issuer(&[provider.issuer]);
            for_provider.set_audience(&[provider.audience]);
            for_provider.set_required_spec_claims(&["exp", "sub", "iss", "aud"]);
        }
        Ok(Self {
            hmac,
            jwks,
            validation,
            provider: for_provider,
        })
    }

    /// The same authenticator allowing `secs` of clock skew instead of
    /// [`LEEWAY_SECS`] (tests use 0 to see expiry at once).
    pub fn with_leeway(mut self, secs: u64) -> Self {
        self.validation.leeway = secs;
        self.provider.leeway = secs;
        self
    }

    /// The clock skew allowed, in seconds.
    pub fn leeway(&self) -> u64 {
        self.validation.leeway
    }

    /// The principal a token names, or why it is refused.
    pub fn verify(&self, token: &str) -> Result<Principal, Refused> {
        let header = jsonwebtoken::decode_header(token).map_err(|err| match err.kind() {
            ErrorKind::InvalidAlgorithm | ErrorKind::InvalidAlgorithmName => Refused::Algorithm,
            _ => Refused::Malformed,
        })?;
        // The key decides the one algorithm it accepts: the secret HS256,
        // a JWKS key the algorithm its type implies.
        let (key, algorithm) = match header.alg {
            Algorithm::HS256 => (
                &self.hmac.as_ref().ok_or(Refused::Algorithm)?.1,
                Algorithm::HS256,
            ),
            _ => {
                let kid = header.kid.as_deref().ok_or(Refused::Algorithm)?;
                let (_, algorithm, key) = self
                    .jwks
                    .iter()
                    .find(|(id, algorithm, _)| id == kid && *algorithm == header.alg)
                    .ok_or(Refused::Algorithm)?;
                (key, *algorithm)
            }
        };
        let mut validation = if algorithm == Algorithm::HS256 {
            self.validation.clone()
        } else {
            self.provider.clone()
        };
        validation.algorithms = vec![algorithm];
        let data =
            jsonwebtoken::decode::<Claims>(token, key, &validation).map_err(|err| {
                match err.kind() {
                    ErrorKind::InvalidAlgorithm | ErrorKind::InvalidAlgorithmName => {
                        Refused::Algorithm
                    }
                    ErrorKind::InvalidSignature => Refused::Signature,
                    ErrorKind::ExpiredSignature => Refused::Expired,
                    ErrorKind::ImmatureSignature => Refused::NotYetValid,
                    _ => Refused::Malformed,
                }
            })?;
        principal_of(data.claims).ok_or(Refused::Malformed)
    }

    /// Mints a token for `sub` with `role` on `projects`, valid for `ttl`.
    pub fn mint(
        &self,
        sub: &str,
        role: Role,
        projects: &[String],
        ttl: Duration,
    ) -> Result<String, TokenError> {
        let now = jsonwebtoken::get_current_timestamp();
        let claims = Claims {
            sub: sub.to_owned(),
            role,
            projects: projects.to_vec(),
            exp: now + ttl.as_secs().max(1),
            nbf: None,
            iat: Some(now),
        };
        if principal_of(claims.clone()).is_none() {
            return Err(TokenError::Claim(
                "a token needs a non-empty sub and project names (1-128 of [A-Za-z0-9._:-]) or *"
                    .to_owned(),
            ));
        }
        self.sign(&claims)
    }

    /// Signs arbitrary claims with the secret (tests and tools;
    /// [`Authenticator::mint`] checks them first).
    pub fn sign(&self, claims: &Claims) -> Result<String, TokenError> {
        let (encoding, _) = self.hmac.as_ref().ok_or_else(|| {
            TokenError::Claim("minting needs the auth secret, not only a JWKS".to_owned())
        })?;
        jsonwebtoken::encode(&Header::new(Algorithm::HS256), claims, encoding)
            .map_err(|e| TokenError::Sign(e.to_string()))
    }
}

/// The signing keys of a JWKS document with the one algorithm each
/// accepts: RS256 for RSA keys, ES256 for P-256 keys. Keys of other kinds,
/// without a `kid`, for encryption, or naming another `alg` are refused.
fn jwks_keys(text: &str) -> Result<Vec<(String, Algorithm, DecodingKey)>, TokenError> {
    use jsonwebtoken::jwk::{
        AlgorithmParameters, EllipticCurve, JwkSet, KeyAlgorithm, PublicKeyUse,
    };
    let bad = |why: String| TokenError::Claim(format!("the JWKS file: {why}"));
    let set: JwkSet = serde_json::from_str(text).map_err(|e| bad(e.to_string()))?;
    let mut keys = Vec::new();
    for jwk in &set.keys {
        let kid = jwk
            .common
            .key_id
            .clone()
            .ok_or_else(|| bad("every key needs a \"kid\"".to_owned()))?;
        if matches!(jwk.common.public_key_use, Some(PublicKeyUse::Encryption)) {
            continue;
        }
        let (algorithm, named) = match &jwk.algorithm {
            AlgorithmParameters::RSA(_) => (Algorithm::RS256, KeyAlgorithm::RS256),
            AlgorithmParameters::EllipticCurve(ec) if ec.curve == EllipticCurve::P256 => {
                (Algorithm::ES256, KeyAlgorithm::ES256)
            }
            _ => {
                return Err(bad(format!(
                    "key {kid}: only RSA and P-256 keys are accepted"
                )));
            }
        };
        if jwk.common.key_algorithm.is_some_and(|alg| alg != named) {
            return Err(bad(format!(
                "key {kid} names an algorithm other than {algorithm:?}"
            )));
        }
        let key = DecodingKey::from_jwk(jwk).map_err(|e| bad(format!("key {kid}: {e}")))?;
        keys.push((kid, algorithm, key));
    }
    if keys.is_empty() {
        return Err(bad("no signing key".to_owned()));
    }
    Ok(keys)
}

impl Authenticator {
    /// Whether it can mint tokens (it has the secret).
    pub fn can_mint(&self) -> bool {
        self.hmac.is_some()
    }
}

/// The principal of valid claims; `None` when a claim is unacceptable.
fn principal_of(claims: Claims) -> Option<Principal> {
    if claims.sub.trim().is_empty() || claims.sub.len() > 256 {
        return None;
    }
    let projects = if claims.projects.iter().any(|p| p == ALL_PROJECTS) {
        None
    } else {
        let mut set = BTreeSet::new();
        for project in claims.projects {
            tether_protocol::validate_name("project", &project).ok()?;
            set.insert(project);
        }
        Some(set)
    };
    Some(Principal {
        sub: claims.sub,
        role: claims.role,
        projects,
        expires_at: Some(claims.exp),
    })
}

/// Parses a duration such as `90s`, `30m`, `24h` or `7d` (a bare number is
/// seconds).
pub fn parse_ttl(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let (number, unit) = match text.find(|c: char| !c.is_ascii_digit()) {
        Some(at) => text.split_at(at),
        None => (text, "s"),
    };
    let number: u64 = number
        .parse()
        .map_err(|_| format!("{text:?} is not a duration such as 90s, 30m, 24h or 7d"))?;
    let scale = match unit {
        "s" => 1,
        "m" => 60,
        "h" => 3_600,
        "d" => 86_400,
        _ => return Err(format!("{text:?}: the unit is one of s, m, h, d")),
    };
    number
        .checked_mul(scale)
        .filter(|s| *s > 0)
        .map(Duration::from_secs)
        .ok_or_else(|| format!("{text:?} is not a positive duration"))
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECRET: &[u8] = b"0123456789abcdef0123456789abcdef";

    #[test]
    fn a_minted_token_verifies_and_names_its_principal() {
        let auth = Authenticator::new(SECRET).unwrap();
        let token = auth
            .mint("ci", Role::Operator, &["a".into()], Duration::from_secs(60))
            .unwrap();
        let principal = auth.verify(&token).unwrap();
        assert_eq!(principal.sub, "ci");
        assert_eq!(principal.role, Role::Operator);
        assert!(principal.can_see("a") && !principal.can_see("b"));
        let all = auth
            .mint("ci", Role::Viewer, &["*".into()], Duration::from_secs(60))
            .unwrap();
        assert!(auth.verify(&all).unwrap().can_see("b"));
    }

    #[test]
    fn bad_tokens_are_refused_by_kind() {
        let auth = Authenticator::new(SECRET).unwrap();
        let other = Authenticator::new(b"another secret, also 32 bytes long!").unwrap();
        let forged = other
            .mint("x", Role::Admin, &["*".into()], Duration::from_secs(60))
            .unwrap();
        assert_eq!(auth.verify(&forged), Err(Refused::Signature));
        let now = jsonwebtoken::get_current_timestamp();
        let claims = |exp: u64, nbf: Option<u64>| Claims {
            sub: "x".into(),
            role: Role::Viewer,
            projects: vec!["a".into()],
            exp,
            nbf,
            iat: None,
        };
        let expired = auth.sign(&claims(now - 3_600, None)).unwrap();
        assert_eq!(auth.verify(&expired), Err(Refused::Expired));
        let early = auth.sign(&claims(now + 7_200, Some(now + 3_600))).unwrap();
        assert_eq!(auth.verify(&early), Err(Refused::NotYetValid));
        assert_eq!(auth.verify("not.a.token"), Err(Refused::Malformed));
        assert_eq!(auth.verify(""), Err(Refused::Malformed));
        assert!(matches!(
            Authenticator::new(b"short"),
            Err(TokenError::WeakSecret(5))
        ));
    }

    #[test]
    fn ttls_parse() {
        assert_eq!(parse_ttl("24h"), Ok(Duration::from_secs(86_400)));
        assert_eq!(parse_ttl("90"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_ttl("7d"), Ok(Duration::from_secs(604_800)));
        assert!(parse_ttl("0s").is_err());
        assert!(parse_ttl("1w").is_err());
        assert!(parse_ttl("h").is_err());
    }
}
