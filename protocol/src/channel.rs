//! AHP channel URIs as Tether uses them.

use crate::ids::{NameError, validate_name};

/// The root channel.
pub const ROOT: &str = "ahp-root://";
const SESSION_PREFIX: &str = "ahp-session:/";
const CHAT_PREFIX: &str = "ahp-chat:/";
const CHANGESET_PREFIX: &str = "ahp-changeset:/";
const TERMINAL_PREFIX: &str = "ahp-terminal:/";

/// A parsed channel URI.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Channel {
    /// `ahp-root://`
    Root,
    /// `ahp-session:/<id>`
    Session(String),
    /// `ahp-chat:/<id>`
    Chat(String),
    /// `ahp-changeset:/<session>/<name>`: one of a session's changesets
    /// (a turn's changes are `<name>` = the turn id).
    Changeset {
        /// The session it belongs to.
        session: String,
        /// Its name within the session.
        name: String,
    },
    /// `ahp-terminal:/<session>/<name>`: one of a session's terminals.
    Terminal {
        /// The session it belongs to.
        session: String,
        /// Its name within the session.
        name: String,
    },
}

/// Why a channel URI was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ChannelError {
    /// Not one of the channel kinds Tether serves.
    #[error(
        "unknown channel {0:?}: expected ahp-root://, ahp-session:/<id>, ahp-chat:/<id>, \
         ahp-changeset:/<session>/<name> or ahp-terminal:/<session>/<name>"
    )]
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
        for (prefix, kind) in [
            (CHANGESET_PREFIX, "changeset name"),
            (TERMINAL_PREFIX, "terminal name"),
        ] {
            let Some(rest) = uri.strip_prefix(prefix) else {
                continue;
            };
            let bad = |error| ChannelError::BadId {
                uri: uri.to_owned(),
                error,
            };
            let (session, name) = rest.split_once('/').unwrap_or((rest, ""));
            validate_name("session id", session).map_err(bad)?;
            validate_name(kind, name).map_err(bad)?;
            let (session, name) = (session.to_owned(), name.to_owned());
            return Ok(if prefix == CHANGESET_PREFIX {
                Channel::Changeset { session, name }
            } else {
                Channel::Terminal { session, name }
            });
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
        // Not `format!`: its machinery costs ten times the copy, and a
        // session's URI is built on every actor batch.
        [SESSION_PREFIX, id].concat()
    }

    /// Whether `uri` is the channel of session `id` (what comparing it with
    /// [`Channel::session_uri`] says, without building that URI).
    pub fn is_session_uri(uri: &str, id: &str) -> bool {
        uri.strip_prefix(SESSION_PREFIX) == Some(id)
    }

    /// The URI of a chat channel.
    pub fn chat_uri(id: &str) -> String {
        format!("{CHAT_PREFIX}{id}")
    }

    /// The URI of one of a session's changesets.
    pub fn changeset_uri(session: &str, name: &str) -> String {
        format!("{CHANGESET_PREFIX}{session}/{name}")
    }

    /// The URI template of a session's per-turn changesets (AHP
    /// `Changeset.uriTemplate`, expanded with a turn id).
    pub fn turn_changesets_template(session: &str) -> String {
        format!("{CHANGESET_PREFIX}{session}/{{turnId}}")
    }

    /// The URI of one of a session's terminals.
    pub fn terminal_uri(session: &str, name: &str) -> String {
        format!("{TERMINAL_PREFIX}{session}/{name}")
    }

    /// The session a channel belongs to, when its URI says (every kind but
    /// the root and chats, whose session the store knows).
    pub fn named_session(&self) -> Option<&str> {
        match self {
            Channel::Session(id)
            | Channel::Changeset { session: id, .. }
            | Channel::Terminal { session: id, .. } => Some(id),
            Channel::Root | Channel::Chat(_) => None,
        }
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

    /// The channel kind's name, as AHP action types spell their scope
    /// (`chat` for `chat/turnStarted`).
    pub fn kind(&self) -> &'static str {
        match self {
            Channel::Root => "root",
            Channel::Session(_) => "session",
            Channel::Chat(_) => "chat",
            Channel::Changeset { .. } => "changeset",
            Channel::Terminal { .. } => "terminal",
        }
    }

    /// The channel's URI.
    pub fn uri(&self) -> String {
        match self {
            Channel::Root => ROOT.to_owned(),
            Channel::Session(id) => Self::session_uri(id),
            Channel::Chat(id) => Self::chat_uri(id),
            Channel::Changeset { session, name } => Self::changeset_uri(session, name),
            Channel::Terminal { session, name } => Self::terminal_uri(session, name),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_session_uri_is_told_without_building_it() {
        for (uri, id) in [("ahp-session:/s-1", "s-1"), ("ahp-session:/", "")] {
            assert_eq!(uri, Channel::session_uri(id));
            assert!(Channel::is_session_uri(uri, id));
        }
        for (uri, id) in [
            ("ahp-session:/s-10", "s-1"),
            ("ahp-session:/s", "s-1"),
            ("ahp-chat:/s-1", "s-1"),
            ("s-1", "s-1"),
        ] {
            assert!(
                !Channel::is_session_uri(uri, id),
                "{uri} is not session {id}'s"
            );
        }
    }

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
            Channel::parse("ahp-canvas:/t"),
            Err(ChannelError::Unknown(_))
        ));
        assert!(matches!(
            Channel::parse("ahp-terminal:/t"),
            Err(ChannelError::BadId { .. })
        ));
        assert_eq!(
            Channel::parse("ahp-changeset:/s-1/t1"),
            Ok(Channel::Changeset {
                session: "s-1".into(),
                name: "t1".into()
            })
        );
        assert_eq!(
            Channel::parse("ahp-terminal:/s-1/term.1").unwrap().uri(),
            "ahp-terminal:/s-1/term.1"
        );
        assert!(matches!(
            Channel::parse("ahp-changeset:/s-1/a/b"),
            Err(ChannelError::BadId { .. })
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
