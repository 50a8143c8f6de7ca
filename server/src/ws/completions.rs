//! AHP `completions`: the agent's slash commands, as the user types one.
//! The commands are what the agent advertised last (ACP
//! `available_commands_update`), kept in the session state's `_meta`.

use serde_json::{Value, json};
use tether_protocol::actions::COMMANDS_META;
use tether_protocol::channel::Channel;

use super::connection::Connection;
use super::rpc::{RpcError, channel_param};
use crate::engine::EngineError;

/// The character that starts a command in a message.
pub const COMMAND_TRIGGER: &str = "/";

impl Connection {
    /// `completions {channel, kind: "userMessage", text, offset}`: when the
    /// text up to `offset` is `/` and a command name's start, the commands
    /// that start so, each replacing that text with `/name `.
    pub(super) async fn completions(&mut self, params: Value) -> Result<Value, RpcError> {
        let channel = channel_param(&params)?;
        let text = params
            .get("text")
            .and_then(Value::as_str)
            .unwrap_or_default();
        let offset = params
            .get("offset")
            .and_then(Value::as_u64)
            .map_or(text.encode_utf16().count(), |o| o as usize);
        let parsed = Channel::parse(&channel).map_err(|e| RpcError::invalid(&format!("{e}.")))?;
        let missing = || EngineError::NotFound(format!("Channel {channel} does not exist."));
        let session = self
            .engine
            .session_of(&parsed)
            .await
            .map_err(RpcError::from)?
            .ok_or_else(|| RpcError::from(missing()))?;
        // Another project's chat answers as a missing one: its session's
        // id is not named.
        let state = self
            .engine
            .snapshot(&self.principal, &Channel::session_uri(&session))
            .await
            .map_err(|err| match err {
                EngineError::NotFound(_) => RpcError::from(missing()),
                other => RpcError::from(other),
            })?
            .state;
        // The text before the cursor, counted in UTF-16 units as AHP does.
        let typed: String = char::decode_utf16(text.encode_utf16().take(offset))
            .filter_map(Result::ok)
            .collect();
        let Some(prefix) = typed
            .strip_prefix(COMMAND_TRIGGER)
            .filter(|p| !p.contains(char::is_whitespace))
        else {
            return Ok(json!({"items": []}));
        };
        let commands = state
            .pointer(&format!("/_meta/{}", COMMANDS_META.replace('/', "~1")))
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        let items: Vec<Value> = commands
            .iter()
            .filter_map(|command| {
                let name = command["name"].as_str()?;
                name.starts_with(prefix).then(|| {
                    let mut meta = json!({"tether/command": name});
                    if let Some(hint) = command["inputHint"].as_str() {
                        meta["tether/inputHint"] = json!(hint);
                    }
                    json!({
                        "insertText": format!("/{name} "),
                        "rangeStart": 0,
                        "rangeEnd": offset,
                        "attachment": {
                            "type": "simple",
                            "label": format!("/{name}"),
                            "displayKind": "command",
                            "modelRepresentation": command["description"],
                            "_meta": meta,
                        },
                    })
                })
            })
            .collect();
        Ok(json!({ "items": items }))
    }
}
