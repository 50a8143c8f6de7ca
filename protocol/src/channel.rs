//! AHP channel URIs as Tether uses them.

use crate::ids::{NameError, validate_name};

/// The root channel.
pub const ROOT: &str = "ahp-root://";
const SESSION_PREFIX: &str = "ahp-session:/";
const CHAT_PREFIX: &str = "ahp-chat:/";

/// A parsed channel URI.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Channel {
    /// `ahp-root://`
    Root,
    /// `ahp-session:/<id>`
    Session(String),
    /// `ahp-chat:/<id>`
    Chat(String),
}

/// Why a channel URI was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ChannelError {
    /// Not one of the three channel kinds Tether serves.
    #[error("unknown channel {0:?}: expected ahp-root://, ahp-session:/<id> or ahp-chat:/<id>")]
    Unknown(String),
    /// The id part breaks the identifier rule.
    #[error("invalid channel {uri:?}: {error}")]
    BadId {
        /// The URI given.
        uri: String,
        /// The rule it broke.
        error: NameError,
    },
}

impl Channel {
    /// Parses and validates a channel URI.
    pub fn parse(uri: &str) -> Result<Self, ChannelError> {
        if uri == ROOT {
            return Ok(Channel::Root);
        }
        let (kind, id): (&str, &str) = if let Some(id) = uri.strip_prefix(SESSION_PREFIX) {
            ("session id", id)
        } else if let Some(id) = uri.strip_prefix(CHAT_PREFIX) {
            ("chat id", id)
        } else {
            return Err(ChannelError::Unknown(uri.to_owned()));
        };
        validate_name(kind, id).map_err(|error| ChannelError::BadId {
            uri: uri.to_owned(),
            error,
        })?;
        Ok(if kind == "session id" {
            Channel::Session(id.to_owned())
        } else {
            Channel::Chat(id.to_owned())
        })
    }

    /// The URI of a session channel.
    pub fn session_uri(id: &str) -> String {
        format!("{SESSION_PREFIX}{id}")
    }

    /// The URI of a chat channel.
    pub fn chat_uri(id: &str) -> String {
        format!("{CHAT_PREFIX}{id}")
    }

    /// What a session's default chat id adds to the session id.
    pub const DEFAULT_CHAT_SUFFIX: &str = ".main";

    /// The URI of a session's default chat: `ahp-chat:/<session>.main`.
    /// Names of this form belong to the session they name: no chat may be
    /// created under one (see [`Channel::is_default_chat_id`]), so nobody
    /// can take a session's default chat before the session exists.
    pub fn default_chat_uri(session: &str) -> String {
        Self::chat_uri(&format!("{session}{}", Self::DEFAULT_CHAT_SUFFIX))
    }

    /// Whether a chat id has the reserved form of a default chat.
    pub fn is_default_chat_id(chat: &str) -> bool {
        chat.ends_with(Self::DEFAULT_CHAT_SUFFIX)
    }

    /// The channel's URI.
    pub fn uri(&self) -> String {
        match self {
            Channel::Root => ROOT.to_owned(),
            Channel::Session(id) => Self::session_uri(id),
            Channel::Chat(id) => Self::chat_uri(id),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_three_kinds_and_refuses_the_rest() {
        assert_eq!(Channel::parse("ahp-root://"), Ok(Channel::Root));
        assert_eq!(
            Channel::parse("ahp-session:/s-1"),
            Ok(Channel::Session("s-1".into()))
        );
        assert_eq!(
            Channel::parse("ahp-chat:/c.1"),
            Ok(Channel::Chat("c.1".into()))
        );
        assert!(matches!(
            Channel::parse("ahp-terminal:/t"),
            Err(ChannelError::Unknown(_))
        ));
        assert!(matches!(
            Channel::parse("ahp-session:/"),
            Err(ChannelError::BadId { .. })
        ));
        assert!(matches!(
            Channel::parse("ahp-session:/a/b"),
            Err(ChannelError::BadId { .. })
        ));
        assert_eq!(Channel::parse("ahp-chat:/x").unwrap().uri(), "ahp-chat:/x");
        assert_eq!(Channel::default_chat_uri("s.1"), "ahp-chat:/s.1.main");
        assert!(Channel::is_default_chat_id("other.main"));
        assert!(!Channel::is_default_chat_id("side-1"));
    }
}
