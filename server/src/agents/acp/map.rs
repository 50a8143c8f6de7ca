//! ACP `session/update` → AHP chat actions, in order.
//!
//! One [`TurnMap`] follows one ACP session: which AHP turn the current
//! `session/prompt` answers, the response part the streamed text is going
//! into, and where each tool call is in its AHP life (streaming → running or
//! pending confirmation → done), so every update becomes the actions that
//! the AHP reducers accept in that state. The README has the table.

use std::collections::HashMap;

use agent_client_protocol::v1::schema::{
    ContentBlock, PermissionOptionKind, RequestPermissionRequest, SessionUpdate, StopReason,
    ToolCallContent, ToolCallStatus, ToolKind, Usage,
};
use serde_json::{Map, Value, json};
use tether_protocol::actions::{
    COMMANDS_META, CONFIG_CATEGORIES_META, CONFIG_SCHEMA_CHANGED, PLAN_META, USAGE_META,
};

use tether_protocol::channel::Channel;

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
    /// While a `session/load` replays history: drop every update.
    pub replaying: bool,
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
            replaying: false,
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

    /// The actions one `session/update` becomes.
    pub fn update(&mut self, update: &SessionUpdate) -> Actions {
        if self.replaying {
            return Vec::new();
        }
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

    /// The actions a `session/request_permission` becomes: the tool call
    /// (started if the agent never announced it) put in pending
    /// confirmation with the agent's options.
    pub fn permission(&mut self, request: &RequestPermissionRequest) -> Actions {
        let Some(turn) = self.turn.clone() else {
            return Vec::new();
        };
        let id = request.tool_call.tool_call_id.to_string();
        let fields = &request.tool_call.fields;
        let mut actions = Vec::new();
        if !self.tools.contains_key(&id) {
            let title = fields.title.clone().unwrap_or_else(|| id.clone());
            actions.extend(self.start_tool(&id, &title, fields.kind));
        }
        let title = self
            .tools
            .get(&id)
            .map(|t| t.title.clone())
            .unwrap_or_default();
        let options: Vec<Value> = request
            .options
            .iter()
            .map(|o| {
                let (kind, group) = match o.kind {
                    PermissionOptionKind::AllowOnce => ("approve", 0),
                    PermissionOptionKind::AllowAlways => ("approve", 1),
                    PermissionOptionKind::RejectOnce => ("deny", 2),
                    _ => ("deny", 3),
                };
                json!({"id": o.option_id.to_string(), "label": o.name, "kind": kind, "group": group})
            })
            .collect();
        let mut ready = json!({
            "type": "chat/toolCallReady", "turnId": turn.turn_id, "toolCallId": id,
            "invocationMessage": title, "confirmationTitle": title, "options": options,
        });
        if let Some(input) = &fields.raw_input {
            ready["toolInput"] = json!(input.to_string());
        }
        actions.push((turn.chat.clone(), ready));
        if let Some(tool) = self.tools.get_mut(&id) {
            tool.phase = ToolPhase::Pending;
        }
        actions
    }

    /// A client answered the permission: the reducer moved the tool call on.
    pub fn confirmed(&mut self, tool_call_id: &str, approved: bool) {
        if let Some(tool) = self.tools.get_mut(tool_call_id) {
            tool.phase = if approved {
                ToolPhase::Running
            } else {
                ToolPhase::Done
            };
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
            _ => return Vec::new(),
        };
        let Some(bytes) = bytes else {
            return Vec::new();
        };
        let size = bytes.len();
        let stored = crate::store::Attachment::new(self.session_id(), media, bytes);
        let uri = stored.uri();
        self.stored.push(stored);
        self.stream = None;
        self.parts += 1;
        vec![(
            turn.chat.clone(),
            json!({"type": "chat/responsePart", "turnId": turn.turn_id,
                   "part": {"kind": "contentRef", "uri": uri, "contentType": media, "sizeHint": size}}),
        )]
    }

    fn start_tool(&mut self, id: &str, title: &str, kind: Option<ToolKind>) -> Actions {
        let Some(turn) = self.turn.clone() else {
            return Vec::new();
        };
        if self.tools.contains_key(id) {
            return Vec::new();
        }
        self.stream = None;
        self.tools.insert(
            id.to_owned(),
            ToolCall {
                phase: ToolPhase::Streaming,
                title: title.to_owned(),
            },
        );
        let tool_name = kind
            .and_then(|k| serde_json::to_value(k).ok())
            .and_then(|k| k.as_str().map(str::to_owned))
            .unwrap_or_else(|| "other".to_owned());
        vec![(
            turn.chat,
            json!({"type": "chat/toolCallStart", "turnId": turn.turn_id, "toolCallId": id,
                   "toolName": tool_name, "displayName": title}),
        )]
    }

    fn tool_delta(&mut self, id: &str, input: &Value) -> Actions {
        let Some(turn) = &self.turn else {
            return Vec::new();
        };
        match self.tools.get(id) {
            Some(tool) if tool.phase == ToolPhase::Streaming => vec![(
                turn.chat.clone(),
                json!({"type": "chat/toolCallDelta", "turnId": turn.turn_id, "toolCallId": id,
                       "content": input.to_string()}),
            )],
            _ => Vec::new(),
        }
    }

    fn ready(&mut self, id: &str) -> Actions {
        let Some(turn) = &self.turn else {
            return Vec::new();
        };
        let Some(tool) = self.tools.get_mut(id) else {
            return Vec::new();
        };
        if tool.phase != ToolPhase::Streaming {
            return Vec::new();
        }
        tool.phase = ToolPhase::Running;
        vec![(
            turn.chat.clone(),
            json!({"type": "chat/toolCallReady", "turnId": turn.turn_id, "toolCallId": id,
                   "invocationMessage": tool.title, "confirmed": "not-needed"}),
        )]
    }

    fn tool_content(&mut self, id: &str, content: &[ToolCallContent]) -> Actions {
        let mut actions = self.ready(id);
        let Some(turn) = &self.turn else {
            return actions;
        };
        let turn = turn.clone();
        if self
            .tools
            .get(id)
            .is_some_and(|t| t.phase == ToolPhase::Running)
        {
            let (parts, changes) = self.result_content(content);
            actions.push((
                turn.chat.clone(),
                json!({"type": "chat/toolCallContentChanged", "turnId": turn.turn_id,
                       "toolCallId": id, "content": parts}),
            ));
            actions.extend(changes);
        }
        actions
    }

    fn tool_status(
        &mut self,
        id: &str,
        status: ToolCallStatus,
        content: &[ToolCallContent],
        output: Option<&Value>,
    ) -> Actions {
        match status {
            ToolCallStatus::Pending => Vec::new(),
            ToolCallStatus::InProgress => {
                if content.is_empty() {
                    self.ready(id)
                } else {
                    self.tool_content(id, content)
                }
            }
            ToolCallStatus::Completed | ToolCallStatus::Failed | _ => {
                let mut actions = self.ready(id);
                let Some(turn) = self.turn.clone() else {
                    return actions;
                };
                if self
                    .tools
                    .get(id)
                    .is_none_or(|t| t.phase != ToolPhase::Running)
                {
                    // Pending (never answered) or already done: the reducer
                    // would not move it, so nothing is recorded.
                    return actions;
                }
                let (mut parts, changes) = self.result_content(content);
                let Some(tool) = self.tools.get_mut(id) else {
                    return actions;
                };
                tool.phase = ToolPhase::Done;
                let success = status == ToolCallStatus::Completed;
                let mut result = json!({"success": success, "pastTenseMessage": tool.title});
                if parts.is_empty()
                    && let Some(output) = output
                {
                    parts.push(json!({"type": "text", "text": output.to_string()}));
                }
                if !parts.is_empty() {
                    result["content"] = Value::Array(parts);
                }
                if !success {
                    result["error"] = json!({"message": format!("{} failed", tool.title)});
                }
                // The changeset's actions after the tool call's: its
                // content names the files first.
                actions.push((
                    turn.chat.clone(),
                    json!({"type": "chat/toolCallComplete", "turnId": turn.turn_id,
                           "toolCallId": id, "result": result}),
                ));
                actions.extend(changes);
                actions
            }
        }
    }

    /// ACP tool-call content as AHP tool result content: text, diffs as
    /// `fileEdit` (both sides stored, the turn's changeset told), terminals
    /// by id; and the changeset's actions.
    fn result_content(&mut self, content: &[ToolCallContent]) -> (Vec<Value>, Actions) {
        let mut changes = Vec::new();
        let parts = content
            .iter()
            .filter_map(|c| match c {
                ToolCallContent::Content(c) => match &c.content {
                    ContentBlock::Text(text) => Some(json!({"type": "text", "text": text.text})),
                    ContentBlock::ResourceLink(link) => Some(
                        json!({"type": "text", "text": format!("[{}]({})", link.name, link.uri)}),
                    ),
                    _ => None,
                },
                ToolCallContent::Diff(diff) => {
                    let (edit, actions) =
                        self.file_edited(&diff.path, diff.old_text.as_deref(), &diff.new_text);
                    changes.extend(actions);
                    Some(edit)
                }
                ToolCallContent::Terminal(terminal) => {
                    let id = terminal.terminal_id.to_string();
                    let title = self
                        .terminals
                        .get(&id)
                        .cloned()
                        .unwrap_or_else(|| id.clone());
                    Some(json!({"type": "terminal", "title": title, "isPty": false,
                        "resource": Channel::terminal_uri(self.session_id(), &id)}))
                }
                _ => None,
            })
            .collect();
        (parts, changes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn update(value: Value) -> SessionUpdate {
        serde_json::from_value(value).expect("an ACP session update")
    }

    fn kinds(actions: &Actions) -> Vec<&str> {
        actions
            .iter()
            .map(|(_, a)| a["type"].as_str().unwrap_or_default())
            .collect()
    }

    fn map() -> TurnMap {
        let mut map = TurnMap::new("ahp-session://s");
        map.begin(
            Turn {
                chat: "ahp-chat://s/main".into(),
                turn_id: "t1".into(),
            },
            1_000,
        );
        map
    }

    #[test]
    fn streamed_text_opens_a_part_then_appends_deltas_and_a_thought_opens_its_own() {
        let mut map = map();
        let chunk = |kind: &str, text: &str| {
            update(json!({"sessionUpdate": kind, "content": {"type": "text", "text": text}}))
        };
        let mut all = map.update(&chunk("agent_message_chunk", "Hel"));
        all.extend(map.update(&chunk("agent_message_chunk", "lo")));
        all.extend(map.update(&chunk("agent_thought_chunk", "hmm")));
        all.extend(map.update(&chunk("agent_thought_chunk", "...")));
        all.extend(map.update(&chunk("agent_message_chunk", "!")));
        assert_eq!(
            kinds(&all),
            [
                "chat/responsePart",
                "chat/delta",
                "chat/responsePart",
                "chat/reasoning",
                "chat/responsePart"
            ]
        );
        assert_eq!(all[1].1["partId"], all[0].1["part"]["id"]);
        assert_eq!(all[2].1["part"]["kind"], "reasoning");
        assert_ne!(all[4].1["part"]["id"], all[0].1["part"]["id"]);
        assert!(all.iter().all(|(c, _)| c == "ahp-chat://s/main"));
    }

    #[test]
    fn a_tool_call_without_permission_runs_and_completes() {
        let mut map = map();
        let mut all = map.update(&update(
            json!({"sessionUpdate": "tool_call", "toolCallId": "c1",
            "title": "Reading", "kind": "read", "status": "pending", "rawInput": {"path": "/a"}}),
        ));
        all.extend(map.update(&update(json!({"sessionUpdate": "tool_call_update", "toolCallId": "c1",
            "status": "completed", "content": [{"type": "content", "content": {"type": "text", "text": "body"}}]}))));
        assert_eq!(
            kinds(&all),
            [
                "chat/toolCallStart",
                "chat/toolCallDelta",
                "chat/toolCallReady",
                "chat/toolCallComplete"
            ]
        );
        assert_eq!(all[0].1["toolName"], "read");
        assert_eq!(all[2].1["confirmed"], "not-needed");
        assert_eq!(all[3].1["result"]["success"], true);
        assert_eq!(all[3].1["result"]["content"][0]["text"], "body");
    }

    #[test]
    fn a_permission_request_puts_the_call_in_pending_confirmation_with_the_agent_options() {
        let mut map = map();
        let request: RequestPermissionRequest = serde_json::from_value(json!({
            "sessionId": "acp1",
            "toolCall": {"toolCallId": "c2", "title": "Edit config", "kind": "edit"},
            "options": [{"optionId": "allow", "name": "Allow", "kind": "allow_once"},
                        {"optionId": "reject", "name": "Skip", "kind": "reject_once"}],
        }))
        .expect("request");
        let actions = map.permission(&request);
        assert_eq!(
            kinds(&actions),
            ["chat/toolCallStart", "chat/toolCallReady"]
        );
        let ready = &actions[1].1;
        assert!(ready.get("confirmed").is_none());
        assert_eq!(ready["options"][0]["id"], "allow");
        assert_eq!(ready["options"][0]["kind"], "approve");
        assert_eq!(ready["options"][1]["kind"], "deny");
        // Until a client answers, a completion is not recorded.
        let done = update(
            json!({"sessionUpdate": "tool_call_update", "toolCallId": "c2", "status": "completed"}),
        );
        assert!(map.update(&done).is_empty());
        map.confirmed("c2", true);
        assert_eq!(kinds(&map.update(&done)), ["chat/toolCallComplete"]);
    }

    #[test]
    fn the_stop_reason_completes_the_turn_and_later_updates_are_dropped() {
        let mut map = map();
        let end = map.finish(Ok(StopReason::EndTurn), 1_250);
        assert_eq!(kinds(&end), ["chat/turnComplete"]);
        assert_eq!(end[0].1["duration"], 250);
        let late = update(
            json!({"sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": "x"}}),
        );
        assert!(map.update(&late).is_empty());

        let mut map = self::map();
        let refused = map.finish(Ok(StopReason::Refusal), 1_000);
        assert_eq!(refused[0].1["part"]["error"]["errorType"], "refusal");
        let mut map = self::map();
        let failed = map.finish(Err("boom".into()), 1_000);
        assert_eq!(kinds(&failed), ["chat/error"]);
    }

    #[test]
    fn commands_and_titles_go_to_the_session_channel() {
        let mut map = map();
        let commands = map.update(&update(json!({"sessionUpdate": "available_commands_update",
            "availableCommands": [{"name": "web", "description": "Search", "input": {"hint": "query"}}]})));
        assert_eq!(commands[0].0, "ahp-session://s");
        assert_eq!(commands[0].1["type"], "session/metaChanged");
        assert_eq!(
            commands[0].1["_meta"]["tether/commands"][0]["inputHint"],
            "query"
        );
        let title = map.update(&update(
            json!({"sessionUpdate": "session_info_update", "title": "Fixing"}),
        ));
        assert_eq!(
            title[0].1,
            json!({"type": "session/titleChanged", "title": "Fixing"})
        );
    }

    #[test]
    fn a_replay_records_nothing() {
        let mut map = map();
        map.replaying = true;
        let chunk = update(
            json!({"sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": "old"}}),
        );
        assert!(map.update(&chunk).is_empty());
    }
}
