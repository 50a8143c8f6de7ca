//! Bearer tokens for a server with authentication on.
//!
//! A [`TokenProvider`] is asked for a token before every REST request and
//! before every WebSocket connection. The session stream also reconnects
//! (and replays, so nothing is missed) shortly before a token expires, with
//! a fresh one: the server closes a connection whose token has expired.

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

/// A bearer token and, when known, when it expires.
#[derive(Clone, PartialEq, Eq)]
pub struct Token {
    /// The token itself.
    pub value: String,
    /// When it stops being valid; `None` when unknown (no early refresh).
    pub expires_at: Option<SystemTime>,
}

impl fmt::Debug for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // A token is a credential: never printed.
        f.debug_struct("Token")
            .field("value", &"***")
            .field("expires_at", &self.expires_at)
            .finish()
    }
}

/// Where a client gets its bearer tokens.
pub trait TokenProvider: Send + Sync + fmt::Debug {
    /// A token valid now; an error is a sentence saying why there is none.
    fn token(&self) -> Result<Token, String>;
}

/// One fixed token (the command line's `--token`).
#[derive(Clone)]
pub struct StaticToken(Token);

impl StaticToken {
    /// A provider that always answers `token`.
    pub fn new(token: impl Into<String>) -> Self {
        Self(Token {
            value: token.into(),
            expires_at: None,
        })
    }
}

impl fmt::Debug for StaticToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("StaticToken(***)")
    }
}

impl TokenProvider for StaticToken {
    fn token(&self) -> Result<Token, String> {
        Ok(self.0.clone())
    }
}

/// A shared provider.
pub type Tokens = Arc<dyn TokenProvider>;

/// How long before a token's expiry the stream switches to a fresh one:
/// a tenth of its remaining life, between 1 s and 60 s.
pub(crate) fn refresh_after(token: &Token) -> Option<Duration> {
    let left = token.expires_at?.duration_since(SystemTime::now()).ok()?;
    let margin = (left / 10).clamp(Duration::from_secs(1), Duration::from_secs(60));
    Some(left.saturating_sub(margin))
}
