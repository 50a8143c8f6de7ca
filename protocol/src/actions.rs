//! Which actions exist where, who may dispatch them, and Tether's own
//! `x-tether/` extension actions.

use serde_json::Value;

/// `x-tether/sessionCreated {project, provider, title?, workingDirectories[],
/// activeClient?, defaultChat, createdAt}`: the first record of every
/// session; the session's initial AHP state is a pure function of it.
pub const SESSION_CREATED: &str = "x-tether/sessionCreated";
/// `x-tether/agentOpened {acpSessionRef?, loadSession, resumed, chat?}`:
/// with `chat`, the agent's own session of that chat (one other than the
/// default chat, which has the session's).
pub const AGENT_OPENED: &str = "x-tether/agentOpened";
/// `x-tether/sessionSettled {state: dormant|ended|closed, cause?}`.
pub const SESSION_SETTLED: &str = "x-tether/sessionSettled";
/// `x-tether/contextShared {context, source}`.
pub const CONTEXT_SHARED: &str = "x-tether/contextShared";
/// `x-tether/documentEdited {edits[], revision}`.
pub const DOCUMENT_EDITED: &str = "x-tether/documentEdited";
/// `x-tether/commandsAdvertised {commands[]}`: how commands were recorded
/// before they moved to the session's `_meta` (see [`COMMANDS_META`]); still
/// folded when an old transcript is read, never written.
pub const COMMANDS_ADVERTISED: &str = "x-tether/commandsAdvertised";
/// `x-tether/configSchemaChanged {config: {schema, values}}`: the agent's
/// configuration changed shape (options appeared, went, or offer other
/// choices). AHP 1.0 has no action that changes a session config's schema,
/// so Tether's fold replaces `SessionState.config` whole; the values are
/// also sent as a standard `session/configChanged`.
pub const CONFIG_SCHEMA_CHANGED: &str = "x-tether/configSchemaChanged";

/// The key of the session state's `_meta` holding the agent's slash
/// commands `[{name, description, inputHint?}]` (AHP `completions`
/// answers from it), written with the standard `session/metaChanged`.
pub const COMMANDS_META: &str = "tether/commands";
/// The key of the session state's `_meta` holding each configuration
/// property's ACP category (`mode`, `model`, `thought_level`, ...), which a
/// config property schema has no field for.
pub const CONFIG_CATEGORIES_META: &str = "tether/configCategories";
/// The key of the session state's `_meta` holding the latest usage the
/// agent reported: `{used, size, cost?: {amount, currency}}`.
pub const USAGE_META: &str = "tether/usage";
/// The key of the session state's `_meta` holding the agent's current plan
/// as structured state: `{chat, turnId, entries: [{content, priority,
/// status}]}` (ACP's plan entries; each report replaces the whole plan).
pub const PLAN_META: &str = "tether/plan";

/// The prefix AHP reserves for extensions.
pub const EXTENSION_PREFIX: &str = "x-";

/// The `type` of an action object, if it has one.
pub fn action_type(action: &Value) -> Option<&str> {
    field(action, "type").and_then(Value::as_str)
}

/// Objects up to this many keys are searched key by key.
const SCANNED_KEYS: usize = 8;

/// `value.get(key)` for an object, found by comparing keys in a small one:
/// an action has a handful of keys, and the map's lookup hashes the key
/// first (SipHash, ~240 instructions), where comparing a few short keys
/// costs a tenth of that. An action's type is read about nine times on its
/// way through the host (BENCHMARKS.md, "Timers polled only when they
/// fire, an action's type found without hashing").
pub fn field<'a>(value: &'a Value, key: &str) -> Option<&'a Value> {
    let object = value.as_object()?;
    if object.len() > SCANNED_KEYS {
        return object.get(key);
    }
    object.iter().find_map(|(k, v)| (k == key).then_some(v))
}

/// An action's text as it is stored and sent: compact JSON, the same text
/// `Value::to_string` writes, written straight into a buffer rather than
/// through a formatter piece by piece.
pub fn action_text(action: &Value) -> String {
    serde_json::to_string(action).expect("a JSON value always serialises")
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
    "changeset/filesReviewChanged",
    "terminal/input",
    "terminal/resized",
    "terminal/titleChanged",
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

/// Tether extensions a client may dispatch on a session channel: the
/// operator shares what is on screen, and edits to the shared document.
const CLIENT_EXTENSIONS: &[&str] = &[CONTEXT_SHARED, DOCUMENT_EDITED];

/// Whether a client may dispatch actions of this type.
pub fn is_client_dispatchable(action_type: &str) -> bool {
    CLIENT_DISPATCHABLE.contains(&action_type) || CLIENT_EXTENSIONS.contains(&action_type)
}

/// Checks the shape of a client-dispatched Tether extension action; the
/// message names what is wrong.
pub fn check_extension(action: &Value) -> Result<(), String> {
    match action_type(action) {
        Some(CONTEXT_SHARED) => {
            let context = action
                .get("context")
                .and_then(Value::as_object)
                .ok_or("x-tether/contextShared needs a \"context\" object.")?;
            if context.get("url").is_some_and(|u| !u.is_string()) {
                return Err("context.url must be a string.".into());
            }
            let concepts_ok = context
                .get("concepts")
                .is_none_or(|c| c.as_array().is_some_and(|a| a.iter().all(Value::is_string)));
            if !concepts_ok {
                return Err("context.concepts must be an array of strings.".into());
            }
            if let Some(document) = context.get("document") {
                let ok = document.get("path").is_some_and(Value::is_string)
                    && document.get("text").is_some_and(Value::is_string);
                if !ok {
                    return Err("context.document needs string \"path\" and \"text\".".into());
                }
            }
            match action.get("source").and_then(Value::as_str) {
                Some("turn" | "push") => Ok(()),
                _ => Err("x-tether/contextShared needs \"source\": \"turn\" or \"push\".".into()),
            }
        }
        Some(DOCUMENT_EDITED) => {
            if !action.get("edits").is_some_and(Value::is_array) {
                return Err("x-tether/documentEdited needs an \"edits\" array.".into());
            }
            if !action.get("revision").is_some_and(Value::is_u64) {
                return Err(
                    "x-tether/documentEdited needs a non-negative integer \"revision\".".into(),
                );
            }
            Ok(())
        }
        _ => Ok(()),
    }
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
    fn a_field_is_what_the_maps_lookup_finds_in_small_and_large_objects() {
        let small = serde_json::json!({"type": "session/titleChanged", "title": "t"});
        let mut large = serde_json::Map::new();
        for n in 0..=SCANNED_KEYS {
            large.insert(format!("k{n}"), Value::from(n));
        }
        large.insert("type".into(), Value::from("x/y"));
        let large = Value::Object(large);
        for value in [&small, &large] {
            for key in ["type", "title", "k3", "missing", ""] {
                assert_eq!(field(value, key), value.get(key), "{key} in {value}");
            }
        }
        assert_eq!(action_type(&large), Some("x/y"));
        assert_eq!(field(&Value::from("type"), "type"), None);
        assert_eq!(field(&serde_json::json!(["type"]), "type"), None);
    }

    #[test]
    fn an_actions_text_is_what_its_value_displays() {
        let action = serde_json::json!({
            "type": "session/titleChanged", "title": "é☃\"\n\u{1}", "n": [1, -2, 0.5, 1e300],
            "nested": {"z": null, "a": true}, "big": u64::MAX,
        });
        assert_eq!(action_text(&action), action.to_string());
    }

    #[test]
    fn scopes_and_dispatchability() {
        assert_eq!(action_scope("chat/turnStarted"), Some("chat"));
        assert_eq!(action_scope("x-tether/agentOpened"), None);
        assert!(is_client_dispatchable("chat/turnStarted"));
        assert!(!is_client_dispatchable("chat/turnComplete"));
        assert!(!is_client_dispatchable("root/agentsChanged"));
        assert!(!is_client_dispatchable(AGENT_OPENED));
        assert!(is_client_dispatchable(CONTEXT_SHARED));
        assert!(
            check_extension(
                &serde_json::json!({"type": CONTEXT_SHARED, "context": {}, "source": "push"})
            )
            .is_ok()
        );
        assert!(check_extension(&serde_json::json!({"type": CONTEXT_SHARED, "context": {"concepts": [1]}, "source": "push"})).is_err());
        assert!(
            check_extension(
                &serde_json::json!({"type": DOCUMENT_EDITED, "edits": [], "revision": -1})
            )
            .is_err()
        );
        assert_eq!(
            action_type(&serde_json::json!({"type": "a/b"})),
            Some("a/b")
        );
    }
}
