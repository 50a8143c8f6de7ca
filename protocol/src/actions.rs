//! Which actions exist where, who may dispatch them, and Tether's own
//! `x-tether/` extension actions.

use serde_json::Value;

/// `x-tether/sessionCreated {project, provider, title?, workingDirectories[],
/// activeClient?, defaultChat, createdAt}`: the first record of every
/// session; the session's initial AHP state is a pure function of it.
pub const SESSION_CREATED: &str = "x-tether/sessionCreated";
/// `x-tether/agentOpened {acpSessionRef?, loadSession, resumed}`.
pub const AGENT_OPENED: &str = "x-tether/agentOpened";
/// `x-tether/sessionSettled {state: dormant|ended|closed, cause?}`.
pub const SESSION_SETTLED: &str = "x-tether/sessionSettled";
/// `x-tether/contextShared {context, source}`.
pub const CONTEXT_SHARED: &str = "x-tether/contextShared";
/// `x-tether/documentEdited {edits[], revision}`.
pub const DOCUMENT_EDITED: &str = "x-tether/documentEdited";
/// `x-tether/commandsAdvertised {commands[]}`.
pub const COMMANDS_ADVERTISED: &str = "x-tether/commandsAdvertised";

/// The prefix AHP reserves for extensions.
pub const EXTENSION_PREFIX: &str = "x-";

/// The `type` of an action object, if it has one.
pub fn action_type(action: &Value) -> Option<&str> {
    action.get("type").and_then(Value::as_str)
}

/// The channel kind an action type belongs to: `root`, `session` or `chat`
/// (the part before the `/`), or `None` for extensions and unknown shapes.
pub fn action_scope(action_type: &str) -> Option<&str> {
    if action_type.starts_with(EXTENSION_PREFIX) {
        return None;
    }
    action_type.split_once('/').map(|(scope, _)| scope)
}

/// AHP 1.0's `@clientDispatchable` actions on the channels Tether serves.
/// Every other action is host-originated (the host or a session's agent) and
/// is refused from a client.
const CLIENT_DISPATCHABLE: &[&str] = &[
    "root/configChanged",
    "session/titleChanged",
    "session/isReadChanged",
    "session/isArchivedChanged",
    "session/activeClientSet",
    "session/activeClientRemoved",
    "session/configChanged",
    "session/customizationToggled",
    "session/workingDirectorySet",
    "session/workingDirectoryRemoved",
    "session/workingDirectoryReplaced",
    "session/mcpServerStartRequested",
    "session/mcpServerStopRequested",
    "chat/turnStarted",
    "chat/turnCancelled",
    "chat/toolCallConfirmed",
    "chat/toolCallResultConfirmed",
    "chat/toolCallComplete",
    "chat/toolCallContentChanged",
    "chat/pendingMessageSet",
    "chat/pendingMessageRemoved",
    "chat/queuedMessagesReordered",
    "chat/draftChanged",
    "chat/isReadChanged",
    "chat/isArchivedChanged",
    "chat/inputAnswerChanged",
    "chat/inputCompleted",
    "chat/truncated",
    "chat/workingDirectorySet",
    "chat/workingDirectoryRemoved",
];

/// Whether a client may dispatch actions of this type.
pub fn is_client_dispatchable(action_type: &str) -> bool {
    CLIENT_DISPATCHABLE.contains(&action_type)
}

/// Whether the action changes a session's working directories.
pub fn is_session_workdir_action(action_type: &str) -> bool {
    matches!(
        action_type,
        "session/workingDirectorySet"
            | "session/workingDirectoryRemoved"
            | "session/workingDirectoryReplaced"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scopes_and_dispatchability() {
        assert_eq!(action_scope("chat/turnStarted"), Some("chat"));
        assert_eq!(action_scope("x-tether/agentOpened"), None);
        assert!(is_client_dispatchable("chat/turnStarted"));
        assert!(!is_client_dispatchable("chat/turnComplete"));
        assert!(!is_client_dispatchable("root/agentsChanged"));
        assert!(!is_client_dispatchable(AGENT_OPENED));
        assert_eq!(
            action_type(&serde_json::json!({"type": "a/b"})),
            Some("a/b")
        );
    }
}
