//! Tool-call context (from rpi's `ToolCallContext`): per-session host facts
//! injected under a reserved key into the arguments of a tool call the host
//! routes to a client-contributed tool.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use utoipa::ToSchema;

/// The reserved argument key the context is injected under.
pub const HOST_CONTEXT_KEY: &str = "__tether";

/// What the host knows about the session a tool runs for. Unknown facts are
/// absent, never empty strings.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
#[schema(example = json!({"cwd": "/home/me/project", "sessionId": "s-1"}))]
pub struct ToolCallContext {
    /// The session's primary working directory, as a path.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cwd: Option<String>,
    /// The session id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_id: Option<String>,
}

impl ToolCallContext {
    /// A context that knows the working directory (an empty one is unknown)
    /// but not yet the session.
    pub fn new(cwd: Option<&str>) -> Self {
        Self {
            cwd: cwd.filter(|c| !c.is_empty()).map(str::to_owned),
            session_id: None,
        }
    }

    /// Records the session id once the session exists; safe to call again.
    pub fn set_session_id(&mut self, session_id: &str) {
        self.session_id = Some(session_id.to_owned()).filter(|s| !s.is_empty());
    }

    /// The object to inject, or `None` when nothing is known (then nothing
    /// is injected, not even `{}`).
    pub fn to_json(&self) -> Option<Value> {
        if self.cwd.is_none() && self.session_id.is_none() {
            return None;
        }
        serde_json::to_value(self).ok()
    }

    /// Injects the context into tool-call arguments: an object gains the key
    /// (the host's value wins over one the model supplied), `null` becomes an
    /// object holding only the key, arrays and scalars pass untouched, and
    /// nothing changes when nothing is known.
    pub fn inject(&self, arguments: Value) -> Value {
        let Some(context) = self.to_json() else {
            return arguments;
        };
        match arguments {
            Value::Object(mut map) => {
                map.insert(HOST_CONTEXT_KEY.to_owned(), context);
                Value::Object(map)
            }
            Value::Null => {
                let mut map = Map::new();
                map.insert(HOST_CONTEXT_KEY.to_owned(), context);
                Value::Object(map)
            }
            other => other,
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn known() -> ToolCallContext {
        let mut ctx = ToolCallContext::new(Some("/w"));
        ctx.set_session_id("s");
        ctx
    }

    #[test]
    fn objects_gain_the_key_and_the_host_wins() {
        let out = known().inject(json!({"a": 1, HOST_CONTEXT_KEY: {"cwd": "/model/guess"}}));
        assert_eq!(
            out,
            json!({"a": 1, HOST_CONTEXT_KEY: {"cwd": "/w", "sessionId": "s"}})
        );
    }

    #[test]
    fn null_becomes_an_object_with_only_the_key() {
        assert_eq!(
            known().inject(Value::Null),
            json!({HOST_CONTEXT_KEY: {"cwd": "/w", "sessionId": "s"}})
        );
    }

    #[test]
    fn arrays_and_scalars_pass_untouched() {
        for value in [json!([1, 2]), json!("text"), json!(3), json!(true)] {
            assert_eq!(known().inject(value.clone()), value);
        }
    }

    #[test]
    fn nothing_known_injects_nothing() {
        let empty = ToolCallContext::new(Some(""));
        assert_eq!(empty.to_json(), None);
        assert_eq!(empty.inject(json!({"a": 1})), json!({"a": 1}));
        assert_eq!(empty.inject(Value::Null), Value::Null);
        let only_session = {
            let mut c = ToolCallContext::new(None);
            c.set_session_id("s");
            c
        };
        assert_eq!(
            only_session.inject(Value::Null),
            json!({HOST_CONTEXT_KEY: {"sessionId": "s"}})
        );
    }
}
