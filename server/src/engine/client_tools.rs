//! Tether's rules for client-contributed tools, on top of the reducers: a
//! client registers tools, leaves, and completes a client tool call only in
//! its own name; tool lists are bounded and well formed.
//!
//! A client is its `clientId` *and* the principal that registered it (its
//! owner, recorded with the registration): while it is active, no other
//! principal may register under its `clientId` or answer its calls.

use std::collections::HashMap;

use serde_json::Value;
use tether_protocol::model::SessionModel;

/// Who dispatches: the origin's client and the caller's token `sub`
/// (`None` for the host).
#[derive(Debug, Clone, Copy)]
pub struct Caller<'a> {
    /// The origin's `clientId`.
    pub client_id: &'a str,
    /// The principal's `sub`.
    pub sub: Option<&'a str>,
}

impl Caller<'_> {
    /// Whether this caller is `client_id`'s owner (or the client has none
    /// recorded: a registration from before owners were kept).
    fn owns(&self, owners: &HashMap<String, String>, client_id: &str) -> bool {
        match (owners.get(client_id), self.sub) {
            (Some(owner), Some(sub)) => owner == sub,
            (Some(_), None) => false,
            (None, _) => true,
        }
    }
}

/// Most tools one client may contribute to a session.
pub const MAX_TOOLS: usize = 64;
/// Largest tool list one client may contribute, as JSON.
pub const MAX_TOOLS_BYTES: usize = 64 * 1024;

/// Checks a client's `session/activeClientSet`, `session/activeClientRemoved`
/// or `chat/toolCallComplete` dispatched as `client_id`.
pub fn check(
    model: &SessionModel,
    owners: &HashMap<String, String>,
    channel: &str,
    caller: Caller<'_>,
    kind: &str,
    action: &Value,
) -> Result<(), String> {
    let client_id = caller.client_id;
    match kind {
        "session/activeClientSet" => {
            let named = action
                .pointer("/activeClient/clientId")
                .and_then(Value::as_str);
            if named != Some(client_id) {
                return Err(format!(
                    "A client registers tools only under its own clientId ({client_id:?}); this \
                     one names {:?}.",
                    named.unwrap_or_default()
                ));
            }
            let active = model
                .session
                .active_clients
                .iter()
                .any(|c| c.client_id == client_id);
            if active && !caller.owns(owners, client_id) {
                return Err(format!(
                    "Client {client_id:?} is active in this session under another principal; \
                     choose another clientId."
                ));
            }
            check_tools(
                action
                    .pointer("/activeClient/tools")
                    .unwrap_or(&Value::Null),
            )
        }
        "session/activeClientRemoved" => {
            let named = action.get("clientId").and_then(Value::as_str);
            if named != Some(client_id) {
                return Err(format!(
                    "A client removes only itself ({client_id:?}) from the active clients; this \
                     names {:?}.",
                    named.unwrap_or_default()
                ));
            }
            if !caller.owns(owners, client_id) {
                return Err(format!(
                    "Client {client_id:?} was registered by another principal; only it removes \
                     the client."
                ));
            }
            Ok(())
        }
        "chat/toolCallComplete" => {
            let tool_call = action
                .get("toolCallId")
                .and_then(Value::as_str)
                .unwrap_or_default();
            match client_contributor(model, channel, tool_call) {
                Some(runner) if runner != client_id || !caller.owns(owners, &runner) => {
                    Err(format!(
                        "Tool call {tool_call} runs on client {runner:?}; only that client (under \
                         the principal that registered it) completes it."
                    ))
                }
                _ => Ok(()),
            }
        }
        _ => Ok(()),
    }
}

/// Checks the active client a session is created with (AHP
/// `createSession {activeClient}`): the creating client itself, under its
/// own `clientId` (`None` before the connection named one), with a
/// well-formed tool list, as a `session/activeClientSet` would be.
pub fn check_creation(active_client: &Value, client_id: Option<&str>) -> Result<(), String> {
    let named = active_client.get("clientId").and_then(Value::as_str);
    if named.is_none() || named != client_id {
        return Err(format!(
            "A session is created with only its creating client active, under its own clientId \
             ({:?}); this names {:?}.",
            client_id.unwrap_or_default(),
            named.unwrap_or_default()
        ));
    }
    check_tools(
        active_client
            .get("tools")
            .unwrap_or(&Value::Array(Vec::new())),
    )
}

fn check_tools(tools: &Value) -> Result<(), String> {
    let Some(list) = tools.as_array() else {
        return Err("activeClient.tools must be an array of tool definitions.".to_owned());
    };
    if list.len() > MAX_TOOLS {
        return Err(format!(
            "A client may contribute at most {MAX_TOOLS} tools; this lists {}.",
            list.len()
        ));
    }
    let size = tools.to_string().len();
    if size > MAX_TOOLS_BYTES {
        return Err(format!(
            "A client's tools may take at most {MAX_TOOLS_BYTES} bytes as JSON; these take {size}."
        ));
    }
    let mut names = std::collections::HashSet::new();
    for tool in list {
        let name = tool.get("name").and_then(Value::as_str).unwrap_or_default();
        let valid = !name.is_empty()
            && name.len() <= 64
            && name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'));
        if !valid {
            return Err(format!(
                "Tool name {name:?} must be 1 to 64 letters, digits, '_', '-' or '.'."
            ));
        }
        if super::host_tools::HOST_TOOL_NAMES.contains(&name) {
            return Err(format!(
                "Tool name {name:?} is one of the host's own tools; choose another name."
            ));
        }
        if !names.insert(name) {
            return Err(format!("Tool {name:?} is listed twice."));
        }
        if let Some(schema) = tool.get("inputSchema") {
            let object = schema.as_object().ok_or_else(|| {
                format!("Tool {name:?}: inputSchema must be a JSON Schema object.")
            })?;
            if object.get("type").is_some_and(|t| t != "object") {
                return Err(format!(
                    "Tool {name:?}: inputSchema must describe an object (\"type\": \"object\"), \
                     as tool arguments are one."
                ));
            }
        }
    }
    Ok(())
}

/// The client running `tool_call` in `chat`'s open turn, if a client does.
fn client_contributor(model: &SessionModel, chat: &str, tool_call: &str) -> Option<String> {
    let turn = model.chats.get(chat)?.active_turn.as_ref()?;
    let parts = serde_json::to_value(&turn.response_parts).ok()?;
    parts.as_array()?.iter().find_map(|part| {
        let call = part.get("toolCall")?;
        if call.get("toolCallId")?.as_str()? != tool_call {
            return None;
        }
        let contributor = call.get("contributor")?;
        (contributor.get("kind")?.as_str()? == "client")
            .then(|| contributor.get("clientId")?.as_str().map(str::to_owned))?
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn tool_lists_are_bounded_and_well_formed() {
        let ok = json!([{"name": "read_file", "inputSchema": {"type": "object"}}]);
        assert!(check_tools(&ok).is_ok());
        for (tools, needle) in [
            (json!("x"), "must be an array"),
            (json!([{"name": "has space"}]), "must be 1 to 64"),
            (json!([{"name": "a"}, {"name": "a"}]), "listed twice"),
            (
                json!([{"name": "a", "inputSchema": "string"}]),
                "JSON Schema object",
            ),
            (
                json!([{"name": "a", "inputSchema": {"type": "array"}}]),
                "describe an object",
            ),
            (
                json!(
                    (0..65)
                        .map(|i| json!({"name": format!("t{i}")}))
                        .collect::<Vec<_>>()
                ),
                "at most 64",
            ),
            (
                json!([{"name": "big", "description": "x".repeat(70_000)}]),
                "bytes as JSON",
            ),
        ] {
            let err = check_tools(&tools).expect_err(needle);
            assert!(err.contains(needle), "{needle}: {err}");
        }
    }
}
