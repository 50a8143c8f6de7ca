//! ACP `session/update` → AHP chat actions, in order.
//!
//! One [`TurnMap`] follows one ACP session: which AHP turn the current
//! `session/prompt` answers, the response part the streamed text is going
//! into, and where each tool call is in its AHP life (streaming → running or
//! pending confirmation → done), so every update becomes the actions that
//! the AHP reducers accept in that state. The README has the table.

use std::collections::HashMap;

use agent_client_protocol::v1::schema::{
    ContentBlock, SessionUpdate, StopReason, ToolCallContent, Usage,
};
use serde_json::{Map, Value, json};
use tether_protocol::actions::{
    COMMANDS_META, CONFIG_CATEGORIES_META, CONFIG_SCHEMA_CHANGED, PLAN_META, USAGE_META,
};

mod tools;

use super::config::AgentConfig;
use super::edits::TurnEdits;

/// Where a tool call is in its AHP life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ToolPhase {
    /// `chat/toolCallStart` recorded; not ready yet.
    Streaming,
    /// Ready and running (confirmed, or needing no confirmation).
    Running,
    /// Waiting for a client's `chat/toolCallConfirmed`.
    Pending,
    /// Completed, failed, denied or cancelled.
    Done,
}

#[derive(Debug)]
struct ToolCall {
    phase: ToolPhase,
    title: String,
    /// The diffs it proposes while pending, shown (stored then) with its
    /// confirmation when the agent asks for one.
    proposed: Vec<ToolCallContent>,
}

/// The streamed text's current part.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stream {
    Message,
    Thought,
}

/// The turn an ACP prompt answers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Turn {
    /// The chat channel.
    pub chat: String,
    /// The AHP turn id.
    pub turn_id: String,
}

/// Maps one ACP session's updates to AHP actions.
#[derive(Debug)]
pub struct TurnMap {
    session_uri: String,
    turn: Option<Turn>,
    started_ms: i64,
    /// The part text is streaming into, and how many parts the turn has.
    stream: Option<(Stream, String)>,
    parts: u64,
    tools: HashMap<String, ToolCall>,
    /// Updates seen in the current turn (bounded by the caller).
    pub updates: u64,
    /// While a `session/load` replays its history: that ACP session's id
    /// (its updates are dropped; another chat's session streams on).
    pub replaying: Option<String>,
    /// The agent's settings as it last reported them.
    pub config: AgentConfig,
    /// The session's configuration as clients know it (the AHP
    /// `{schema, values}` last recorded), to tell them only what changed.
    pub known_config: Option<Value>,
    /// The bytes of images and files the agent sent, and both sides of
    /// its file edits, to store before the actions that refer to them are
    /// recorded (taken by the bridge).
    pub stored: Vec<crate::store::Attachment>,
    /// The current turn's file edits (its changeset).
    edits: TurnEdits,
    /// The titles of the terminals the agent opened, by id.
    terminals: HashMap<String, String>,
    /// The context and cost figures of the agent's latest usage report
    /// (`_meta` of a `chat/usage`): a turn's token report carries them too,
    /// since a turn keeps only its latest usage.
    reported: Map<String, Value>,
}

/// The actions that tell clients a session's configuration went from
/// `before` (as they know it) to the agent's `config`: a changed shape is
/// Tether's `x-tether/configSchemaChanged` (with the categories in `_meta`)
/// and the values as a standard `session/configChanged`; changed values
/// alone are only the latter, with just those values.
pub fn config_changes(session_uri: &str, before: Option<&Value>, config: &AgentConfig) -> Actions {
    let after = config.to_ahp();
    let uri = || session_uri.to_owned();
    match before {
        None if config.is_empty() => Vec::new(),
        Some(before) if before["schema"] == after["schema"] => {
            let changed: Map<String, Value> = after["values"]
                .as_object()
                .into_iter()
                .flatten()
                .filter(|(key, value)| before["values"].get(key.as_str()) != Some(value))
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect();
            if changed.is_empty() {
                Vec::new()
            } else {
                vec![(
                    uri(),
                    json!({"type": "session/configChanged", "config": changed}),
                )]
            }
        }
        _ => vec![
            (
                uri(),
                json!({"type": CONFIG_SCHEMA_CHANGED, "config": after}),
            ),
            (
                uri(),
                json!({"type": "session/metaChanged",
                       "_meta": {CONFIG_CATEGORIES_META: config.categories()}}),
            ),
            (
                uri(),
                json!({"type": "session/configChanged", "config": after["values"]}),
            ),
        ],
    }
}

/// Actions for the session's channel and its chats: `(channel, action)`.
pub type Actions = Vec<(String, Value)>;

impl TurnMap {
    /// A map for the session whose channel is `session_uri`.
    pub fn new(session_uri: &str) -> Self {
        Self {
            session_uri: session_uri.to_owned(),
            turn: None,
            started_ms: 0,
            stream: None,
            parts: 0,
            tools: HashMap::new(),
            updates: 0,
            replaying: None,
            config: AgentConfig::default(),
            known_config: None,
            stored: Vec::new(),
            edits: TurnEdits::default(),
            terminals: HashMap::new(),
            reported: Map::new(),
        }
    }

    /// The ids of the terminals the agent opened.
    pub fn terminal_ids(&self) -> Vec<String> {
        self.terminals.keys().cloned().collect()
    }

    /// The agent opened terminal `id` running `title`.
    pub fn terminal_opened(&mut self, id: &str, title: &str) {
        self.terminals.insert(id.to_owned(), title.to_owned());
    }

    /// The session's id.
    fn session_id(&self) -> &str {
        self.session_uri
            .strip_prefix("ahp-session:/")
            .unwrap_or(&self.session_uri)
    }

    /// `path` went from `old` to `new` (a `Diff`, or a write the host
    /// served): its `FileEdit`, and the turn's changeset actions (the
    /// texts are kept in `stored`).
    pub fn file_edited(
        &mut self,
        path: &std::path::Path,
        old: Option<&str>,
        new: &str,
    ) -> (Value, Actions) {
        let session = self.session_id().to_owned();
        let edit = self
            .edits
            .edit(&session, self.turn.as_ref(), path, old, Some(new));
        self.stored.extend(edit.stored);
        (edit.content, edit.actions)
    }

    /// A file edit a tool call proposes, for preview before it is
    /// confirmed: both sides stored, nothing told to the turn's changeset
    /// (the file is unchanged until the agent acts).
    pub fn edit_preview(&mut self, path: &std::path::Path, old: Option<&str>, new: &str) -> Value {
        let session = self.session_id().to_owned();
        let (preview, stored) = crate::agents::acp::edits::preview(&session, path, old, new);
        self.stored.extend(stored);
        preview
    }

    /// What changed in the agent's settings since clients last heard:
    /// the actions to record, and the settings become what they know.
    pub fn config_moved(&mut self) -> Actions {
        let actions = config_changes(&self.session_uri, self.known_config.as_ref(), &self.config);
        if !actions.is_empty() || self.known_config.is_none() {
            self.known_config = (!self.config.is_empty() || self.known_config.is_some())
                .then(|| self.config.to_ahp());
        }
        actions
    }

    /// The session's channel URI.
    pub fn session_uri(&self) -> &str {
        &self.session_uri
    }

    /// The turn being answered.
    pub fn turn(&self) -> Option<&Turn> {
        self.turn.as_ref()
    }

    /// A prompt for `turn` was sent.
    pub fn begin(&mut self, turn: Turn, now_ms: i64) {
        self.turn = Some(turn);
        self.started_ms = now_ms;
        self.stream = None;
        self.parts = 0;
        self.tools.clear();
        self.updates = 0;
        self.edits.begin();
    }

    /// The turn was cancelled (by a client): later updates for it are
    /// dropped, since the turn is closed in AHP already.
    pub fn cancelled(&mut self) {
        self.turn = None;
    }

    /// Whether an update of ACP session `session` is a `session/load`'s
    /// replay of history already recorded.
    pub fn replays(&self, session: &str) -> bool {
        self.replaying.as_deref() == Some(session)
    }

    /// The actions one `session/update` becomes (a replay's are dropped
    /// by the caller, see [`TurnMap::replays`]).
    /// Maps one `session/update` of ACP session `acp_session` (the id a
    /// cost report is kept under: ACP's cost is per ACP session, and each
    /// chat has its own).
    pub fn update(&mut self, acp_session: &str, update: &SessionUpdate) -> Actions {
        self.updates += 1;
        match update {
            SessionUpdate::AgentMessageChunk(chunk) => self.text(Stream::Message, &chunk.content),
            SessionUpdate::AgentThoughtChunk(chunk) => self.text(Stream::Thought, &chunk.content),
            // The turn's own message is already the turn's; a replay is dropped.
            SessionUpdate::UserMessageChunk(_) => Vec::new(),
            SessionUpdate::ToolCall(call) => {
                let id = call.tool_call_id.to_string();
                let mut actions = self.start_tool(&id, &call.title, Some(call.kind));
                if let Some(input) = &call.raw_input {
                    actions.extend(self.tool_delta(&id, input));
                }
                actions.extend(self.tool_status(&id, call.status, &call.content, None));
                actions
            }
            SessionUpdate::ToolCallUpdate(update) => {
                let id = update.tool_call_id.to_string();
                let fields = &update.fields;
                let mut actions = Vec::new();
                if !self.tools.contains_key(&id) {
                    let title = fields.title.clone().unwrap_or_else(|| id.clone());
                    actions.extend(self.start_tool(&id, &title, fields.kind));
                } else if let (Some(title), Some(tool)) = (&fields.title, self.tools.get_mut(&id)) {
                    tool.title = title.clone();
                }
                let content = fields.content.clone().unwrap_or_default();
                match fields.status {
                    Some(status) => {
                        actions.extend(self.tool_status(
                            &id,
                            status,
                            &content,
                            fields.raw_output.as_ref(),
                        ));
                    }
                    None if !content.is_empty() => {
                        actions.extend(self.tool_content(&id, &content));
                    }
                    None => {}
                }
                actions
            }
            SessionUpdate::Plan(plan) => {
                // Structured state clients render (and update in place):
                // each report replaces the whole plan, in the session's
                // `_meta`, with the turn it was made in.
                let entries: Vec<Value> = plan
                    .entries
                    .iter()
                    .map(|entry| {
                        json!({"content": entry.content, "priority": entry.priority,
                               "status": entry.status})
                    })
                    .collect();
                let (chat, turn_id) = match &self.turn {
                    Some(turn) => (json!(turn.chat), json!(turn.turn_id)),
                    None => (Value::Null, Value::Null),
                };
                vec![(
                    self.session_uri.clone(),
                    json!({"type": "session/metaChanged", "_meta": {PLAN_META: {
                        "chat": chat, "turnId": turn_id, "entries": entries}}}),
                )]
            }
            SessionUpdate::CurrentModeUpdate(update) => {
                self.config.set_mode(&update.current_mode_id.to_string());
                self.config_moved()
            }
            SessionUpdate::ConfigOptionUpdate(update) => {
                self.config.set_options(&update.config_options);
                self.config_moved()
            }
            SessionUpdate::AvailableCommandsUpdate(update) => {
                let commands: Vec<Value> = update
                    .available_commands
                    .iter()
                    .map(|c| {
                        let mut command = json!({"name": c.name, "description": c.description});
                        if let Some(hint) = c
                            .input
                            .as_ref()
                            .and_then(|i| serde_json::to_value(i).ok())
                            .and_then(|i| i.get("hint").and_then(Value::as_str).map(str::to_owned))
                        {
                            command["inputHint"] = json!(hint);
                        }
                        command
                    })
                    .collect();
                // The session state's `_meta` (merged into what is there by
                // the host), which AHP `completions` answers from.
                vec![(
                    self.session_uri.clone(),
                    json!({"type": "session/metaChanged", "_meta": {COMMANDS_META: commands}}),
                )]
            }
            SessionUpdate::SessionInfoUpdate(info) => {
                match serde_json::to_value(&info.title).ok() {
                    Some(Value::String(title)) if !title.trim().is_empty() => vec![(
                        self.session_uri.clone(),
                        json!({"type": "session/titleChanged", "title": title}),
                    )],
                    _ => Vec::new(),
                }
            }
            SessionUpdate::UsageUpdate(usage) => {
                // ACP reports the context's fill and size and the session's
                // cost so far; AHP's usage has token counts only, so these
                // go in its `_meta` (within a turn) or the session's.
                let cost = usage
                    .cost
                    .as_ref()
                    .map(|c| json!({"amount": c.amount, "currency": c.currency}));
                let Some(turn) = &self.turn else {
                    let mut reported = json!({"used": usage.used, "size": usage.size});
                    if let Some(cost) = cost {
                        reported["cost"] = cost;
                        reported["costOf"] = json!(acp_session);
                    }
                    return vec![(
                        self.session_uri.clone(),
                        json!({"type": "session/metaChanged", "_meta": {USAGE_META: reported}}),
                    )];
                };
                let mut meta =
                    json!({"tether/contextUsed": usage.used, "tether/contextWindow": usage.size});
                if let Some(cost) = cost {
                    meta["tether/cost"] = cost;
                    meta["tether/costOf"] = json!(acp_session);
                }
                if let Value::Object(figures) = &meta {
                    self.reported.clone_from(figures);
                }
                vec![(
                    turn.chat.clone(),
                    json!({"type": "chat/usage", "turnId": turn.turn_id, "usage": {"_meta": meta}}),
                )]
            }
            // Notices, compaction and others: not offered to agents (Tether
            // does not advertise them), so none should come.
            _ => Vec::new(),
        }
    }

    /// The `chat/usage` of a turn's own token counts, as the agent reports
    /// them with its end (ACP's `PromptResponse.usage`): AHP's fields, and
    /// what AHP has no field for in `_meta`.
    pub fn turn_tokens(&self, usage: &Usage) -> Actions {
        let Some(turn) = &self.turn else {
            return Vec::new();
        };
        let mut meta = self.reported.clone();
        meta.insert("tether/totalTokens".into(), json!(usage.total_tokens));
        let mut info = json!({"inputTokens": usage.input_tokens, "outputTokens": usage.output_tokens,
                              "_meta": meta});
        if let Some(cached) = usage.cached_read_tokens {
            info["cacheReadTokens"] = json!(cached);
        }
        for (key, value) in [
            ("tether/thoughtTokens", usage.thought_tokens),
            ("tether/cacheWriteTokens", usage.cached_write_tokens),
        ] {
            if let Some(value) = value {
                info["_meta"][key] = json!(value);
            }
        }
        vec![(
            turn.chat.clone(),
            json!({"type": "chat/usage", "turnId": turn.turn_id, "usage": info}),
        )]
    }

    /// The actions the end of the prompt becomes, and the turn is over.
    /// `None` for a stop reason means the prompt request failed with `error`.
    pub fn finish(&mut self, stop: Result<StopReason, String>, now_ms: i64) -> Actions {
        let Some(turn) = self.turn.take() else {
            return Vec::new();
        };
        let duration = (now_ms - self.started_ms).max(0);
        let error = |error_type: &str, message: String| {
            json!({"type": "chat/error", "turnId": turn.turn_id, "duration": duration,
                   "part": {"kind": "error", "error": {"errorType": error_type, "message": message}}})
        };
        let action = match stop {
            Ok(StopReason::EndTurn) => {
                json!({"type": "chat/turnComplete", "turnId": turn.turn_id, "duration": duration})
            }
            Ok(StopReason::Cancelled) => json!({
                "type": "chat/turnCancelled", "turnId": turn.turn_id, "duration": duration
            }),
            Ok(StopReason::MaxTokens) => error(
                "max_tokens",
                "The agent stopped: it reached its maximum number of tokens.".to_owned(),
            ),
            Ok(StopReason::MaxTurnRequests) => error(
                "max_turn_requests",
                "The agent stopped: it reached its maximum number of requests in one turn."
                    .to_owned(),
            ),
            Ok(StopReason::Refusal) => error(
                "refusal",
                "The agent refused to continue this turn.".to_owned(),
            ),
            Ok(other) => error(
                "agent_error",
                format!("The agent stopped the turn: {other:?}."),
            ),
            Err(message) => error(
                "agent_error",
                format!("The agent failed the turn: {message}"),
            ),
        };
        self.stream = None;
        vec![(turn.chat, action)]
    }

    fn text(&mut self, stream: Stream, content: &ContentBlock) -> Actions {
        let Some(turn) = self.turn.clone() else {
            return Vec::new();
        };
        let text = match content {
            ContentBlock::Text(text) => text.text.clone(),
            ContentBlock::ResourceLink(link) => format!("[{}]({})", link.name, link.uri),
            other => return self.content_ref(&turn, other),
        };
        if text.is_empty() {
            return Vec::new();
        }
        match &self.stream {
            Some((current, part)) if *current == stream => {
                let kind = match stream {
                    Stream::Message => "chat/delta",
                    Stream::Thought => "chat/reasoning",
                };
                vec![(
                    turn.chat,
                    json!({"type": kind, "turnId": turn.turn_id, "partId": part, "content": text}),
                )]
            }
            _ => {
                self.parts += 1;
                let (kind, suffix) = match stream {
                    Stream::Message => ("markdown", "text"),
                    Stream::Thought => ("reasoning", "thought"),
                };
                let part = format!("{}.{suffix}{}", turn.turn_id, self.parts);
                self.stream = Some((stream, part.clone()));
                vec![(
                    turn.chat,
                    json!({"type": "chat/responsePart", "turnId": turn.turn_id,
                           "part": {"kind": kind, "id": part, "content": text}}),
                )]
            }
        }
    }

    /// An image, audio clip or embedded file the agent sent: its bytes are
    /// stored (as a message's attachments are) and the turn gets a
    /// `contentRef` part pointing at them.
    fn content_ref(&mut self, turn: &Turn, content: &ContentBlock) -> Actions {
        let Some((uri, media, size)) = self.store_block(content) else {
            return Vec::new();
        };
        self.stream = None;
        self.parts += 1;
        vec![(
            turn.chat.clone(),
            json!({"type": "chat/responsePart", "turnId": turn.turn_id,
                   "part": {"kind": "contentRef", "uri": uri, "contentType": media, "sizeHint": size}}),
        )]
    }

    /// Stores the bytes of an image, audio clip or embedded file (once, by
    /// digest, when the actions naming them are committed): their
    /// `tether-attachment:` URI, media type and size; `None` for any other
    /// block, or one whose bytes do not decode.
    pub(super) fn store_block(
        &mut self,
        content: &ContentBlock,
    ) -> Option<(String, String, usize)> {
        use base64::Engine as _;
        let block = serde_json::to_value(content).unwrap_or_default();
        let (media, bytes) = match block["type"].as_str() {
            Some("image" | "audio") => (
                block["mimeType"]
                    .as_str()
                    .unwrap_or("application/octet-stream"),
                block["data"]
                    .as_str()
                    .and_then(|d| base64::engine::general_purpose::STANDARD.decode(d).ok()),
            ),
            Some("resource") => {
                let resource = &block["resource"];
                let media = resource["mimeType"].as_str();
                match (resource["text"].as_str(), resource["blob"].as_str()) {
                    (Some(text), _) => (
                        media.unwrap_or("text/plain"),
                        Some(text.as_bytes().to_vec()),
                    ),
                    (None, Some(blob)) => (
                        media.unwrap_or("application/octet-stream"),
                        base64::engine::general_purpose::STANDARD.decode(blob).ok(),
                    ),
                    _ => (media.unwrap_or("application/octet-stream"), None),
                }
            }
            _ => return None,
        };
        let bytes = bytes?;
        let size = bytes.len();
        let stored = crate::store::Attachment::new(self.session_id(), media, bytes);
        let uri = stored.uri();
        self.stored.push(stored);
        Some((uri, media.to_owned(), size))
    }
}

#[cfg(test)]
mod tests;
