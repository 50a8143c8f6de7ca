//! What a committed action tells the people watching a project (DESIGN.md,
//! "Finding, notifying, keeping"): the notification events webhooks
//! deliver. Pure: the host writes each event to its outbox in the
//! transaction that appends the action, and delivers it from there.

use serde_json::{Value, json};

use crate::actions::{SESSION_SETTLED, action_type};

/// A turn ended as it should.
pub const TURN_COMPLETED: &str = "turn.completed";
/// A turn ended with an error.
pub const TURN_FAILED: &str = "turn.failed";
/// A turn waits for a person: a permission prompt or an agent's question.
pub const INPUT_NEEDED: &str = "input.needed";
/// A session settled: dormant, closed or ended.
pub const SESSION_SETTLED_EVENT: &str = "session.settled";
/// An agent could not be started, or its process died.
pub const AGENT_FAILED: &str = "agent.failed";

/// Every event kind, as webhooks subscribe to them.
pub const KINDS: [&str; 5] = [
    TURN_COMPLETED,
    TURN_FAILED,
    INPUT_NEEDED,
    SESSION_SETTLED_EVENT,
    AGENT_FAILED,
];

/// Error types of a turn's error that say the agent itself failed.
const AGENT_ERRORS: [&str; 2] = ["agent_unavailable", "process_exited"];

fn str_of<'a>(value: &'a Value, pointer: &str) -> Option<&'a str> {
    value.pointer(pointer).and_then(Value::as_str)
}

/// The events an accepted action on `channel` raises, each a kind and its
/// data (what a receiver needs besides the session, seq and time).
pub fn events(channel: &str, action: &Value) -> Vec<(&'static str, Value)> {
    let turn = || json!({"chat": channel, "turnId": action.get("turnId")});
    match action_type(action) {
        Some("chat/turnComplete") => vec![(TURN_COMPLETED, turn())],
        Some("chat/error") => {
            let error = action
                .pointer("/part/error")
                .cloned()
                .unwrap_or(Value::Null);
            let error_type = str_of(action, "/part/error/errorType").unwrap_or_default();
            let mut data = turn();
            data["error"] = error;
            let mut out = vec![(TURN_FAILED, data.clone())];
            if AGENT_ERRORS.contains(&error_type) {
                out.push((AGENT_FAILED, data));
            }
            out
        }
        // A tool call that waits for a confirmation (no `confirmed`).
        Some("chat/toolCallReady") if action.get("confirmed").is_none() => {
            let mut data = turn();
            data["reason"] = json!("permission");
            data["toolCallId"] = action.get("toolCallId").cloned().unwrap_or(Value::Null);
            data["title"] = action
                .get("confirmationTitle")
                .or_else(|| action.get("invocationMessage"))
                .cloned()
                .unwrap_or(Value::Null);
            vec![(INPUT_NEEDED, data)]
        }
        Some("chat/inputRequested") => {
            let mut data = turn();
            data["reason"] = json!("question");
            data["requestId"] = action
                .pointer("/request/id")
                .cloned()
                .unwrap_or(Value::Null);
            data["title"] = action
                .pointer("/request/message")
                .cloned()
                .unwrap_or(Value::Null);
            vec![(INPUT_NEEDED, data)]
        }
        // A new session is dormant from the start: nothing to tell.
        Some(SESSION_SETTLED) if str_of(action, "/cause") != Some("created") => vec![(
            SESSION_SETTLED_EVENT,
            json!({"state": action.get("state"), "cause": action.get("cause")}),
        )],
        _ => Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_kind_comes_from_its_action() {
        let chat = "ahp-chat:/s.main";
        let kinds = |action: Value| -> Vec<&str> {
            events(chat, &action).into_iter().map(|(k, _)| k).collect()
        };
        assert_eq!(
            kinds(json!({"type": "chat/turnComplete", "turnId": "t"})),
            [TURN_COMPLETED]
        );
        assert_eq!(
            kinds(json!({"type": "chat/error", "turnId": "t",
                         "part": {"error": {"errorType": "agent_error", "message": "m"}}})),
            [TURN_FAILED]
        );
        assert_eq!(
            kinds(json!({"type": "chat/error", "turnId": "t",
                         "part": {"error": {"errorType": "agent_unavailable", "message": "m"}}})),
            [TURN_FAILED, AGENT_FAILED]
        );
        assert_eq!(
            kinds(json!({"type": "chat/toolCallReady", "turnId": "t", "toolCallId": "x"})),
            [INPUT_NEEDED]
        );
        assert!(kinds(json!({"type": "chat/toolCallReady", "confirmed": "not-needed"})).is_empty());
        assert_eq!(
            kinds(json!({"type": "chat/inputRequested", "request": {"id": "q", "message": "?"}})),
            [INPUT_NEEDED]
        );
        assert_eq!(
            kinds(json!({"type": SESSION_SETTLED, "state": "closed", "cause": "disposed"})),
            [SESSION_SETTLED_EVENT]
        );
        assert!(
            kinds(json!({"type": SESSION_SETTLED, "state": "dormant", "cause": "created"}))
                .is_empty()
        );
        assert!(kinds(json!({"type": "chat/delta"})).is_empty());
    }
}
