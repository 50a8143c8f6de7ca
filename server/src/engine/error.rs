//! What engine operations answer when they do not succeed: refused
//! dispatches (with the kind that decides their REST status) and errors of
//! the other operations.

/// What kind of refusal a dispatch got; it decides the REST status and
/// whether the refusal is recorded as the origin's final outcome.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RefusalKind {
    /// The action is invalid (or not allowed) as sent.
    Invalid,
    /// The session's state forbids it (ended) or the sequence number was
    /// reused for another action.
    Conflict,
    /// Storage or a side-effect backend was unavailable. Not recorded: the
    /// same dispatch may succeed when retried.
    Unavailable,
    /// The channel does not exist (or the caller may not see it). AHP
    /// requires a host to ignore such a dispatch silently, with no echo;
    /// REST answers 404. Not recorded.
    NotFound,
    /// The caller's role may not dispatch (a viewer). REST answers 403. Not
    /// recorded: the same origin may be sent again with another token.
    Forbidden,
}

impl RefusalKind {
    /// Its label in `/metrics` and logs.
    pub fn code(self) -> &'static str {
        match self {
            RefusalKind::Invalid => "invalid",
            RefusalKind::Conflict => "conflict",
            RefusalKind::Unavailable => "unavailable",
            RefusalKind::NotFound => "not_found",
            RefusalKind::Forbidden => "forbidden",
        }
    }
}

/// A refused dispatch.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{reason}")]
pub struct Refusal {
    /// Its kind.
    pub kind: RefusalKind,
    /// A sentence a person can act on.
    pub reason: String,
}

impl Refusal {
    /// A refusal of `kind`.
    pub fn new(kind: RefusalKind, reason: impl Into<String>) -> Self {
        Self {
            kind,
            reason: reason.into(),
        }
    }
}

impl From<String> for Refusal {
    fn from(reason: String) -> Self {
        Self::new(RefusalKind::Invalid, reason)
    }
}

impl From<&str> for Refusal {
    fn from(reason: &str) -> Self {
        Self::new(RefusalKind::Invalid, reason)
    }
}

impl From<crate::effects::EffectError> for Refusal {
    fn from(err: crate::effects::EffectError) -> Self {
        match err {
            crate::effects::EffectError::Refused(reason) => Self::new(RefusalKind::Invalid, reason),
            crate::effects::EffectError::Unavailable(reason) => {
                Self::new(RefusalKind::Unavailable, reason)
            }
        }
    }
}

/// Errors of engine operations other than dispatch (which answers with a
/// [`DispatchOutcome`]).
#[derive(Debug, Clone, thiserror::Error)]
pub enum EngineError {
    /// The session or channel does not exist (or the caller may not see it).
    #[error("{0}")]
    NotFound(String),
    /// The session already exists.
    #[error("{0}")]
    AlreadyExists(String),
    /// The state does not allow it.
    #[error("{0}")]
    Conflict(String),
    /// The request is malformed or breaks a rule.
    #[error("{0}")]
    InvalidParams(String),
    /// No agent serves the provider.
    #[error("{0}")]
    ProviderNotFound(String),
    /// The caller may not do this.
    #[error("{0}")]
    Forbidden(String),
    /// Storage or a backend is unavailable.
    #[error("{0}")]
    Unavailable(String),
}
