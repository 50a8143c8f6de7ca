//! The tool calls of a turn: each one's AHP life (streaming → running or
//! pending confirmation → done), from ACP's tool call updates and
//! permission requests.

use agent_client_protocol::v1::schema::{
    ContentBlock, PermissionOptionKind, RequestPermissionRequest, ToolCallContent, ToolCallStatus,
    ToolKind,
};
use serde_json::{Value, json};
use tether_protocol::channel::Channel;

use super::{Actions, ToolCall, ToolPhase, TurnMap};

impl TurnMap {
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
        // The edits it will make, for the person to see before answering:
        // the request's own, else those its pending updates proposed.
        let asked = diffs_of(fields.content.as_deref().unwrap_or_default());
        let diffs = match self.tools.get_mut(&id) {
            Some(tool) if asked.is_empty() => std::mem::take(&mut tool.proposed),
            _ => asked,
        };
        let proposed = self.proposals(&diffs);
        if !proposed.is_empty() {
            ready["edits"] = json!({"items": proposed});
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

    pub(super) fn start_tool(&mut self, id: &str, title: &str, kind: Option<ToolKind>) -> Actions {
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
                proposed: Vec::new(),
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

    pub(super) fn tool_delta(&mut self, id: &str, input: &Value) -> Actions {
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

    pub(super) fn ready(&mut self, id: &str) -> Actions {
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

    pub(super) fn tool_content(&mut self, id: &str, content: &[ToolCallContent]) -> Actions {
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

    pub(super) fn tool_status(
        &mut self,
        id: &str,
        status: ToolCallStatus,
        content: &[ToolCallContent],
        output: Option<&Value>,
    ) -> Actions {
        match status {
            ToolCallStatus::Pending => {
                // Not started: its diffs are proposals, kept for the
                // confirmation the agent may ask for.
                let proposed = diffs_of(content);
                if let Some(tool) = self.tools.get_mut(id)
                    && !proposed.is_empty()
                {
                    tool.proposed = proposed;
                }
                Vec::new()
            }
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

    /// The diffs of a tool call not yet confirmed, as AHP `FileEdit`s.
    fn proposals(&mut self, content: &[ToolCallContent]) -> Vec<Value> {
        content
            .iter()
            .filter_map(|c| match c {
                ToolCallContent::Diff(diff) => {
                    Some(self.edit_preview(&diff.path, diff.old_text.as_deref(), &diff.new_text))
                }
                _ => None,
            })
            .collect()
    }

    /// ACP tool-call content as AHP tool result content: text, diffs as
    /// `fileEdit` (both sides stored, the turn's changeset told), terminals
    /// by id; and the changeset's actions.
    pub(super) fn result_content(&mut self, content: &[ToolCallContent]) -> (Vec<Value>, Actions) {
        let mut changes = Vec::new();
        let parts = content
            .iter()
            .filter_map(|c| match c {
                ToolCallContent::Content(c) => match &c.content {
                    ContentBlock::Text(text) => Some(json!({"type": "text", "text": text.text})),
                    ContentBlock::ResourceLink(link) => Some(
                        json!({"type": "text", "text": format!("[{}]({})", link.name, link.uri)}),
                    ),
                    // An image, audio clip or file: stored, by reference.
                    other => self.store_block(other).map(|(uri, media, size)| {
                        json!({"type": "resource", "uri": uri, "contentType": media,
                               "sizeHint": size})
                    }),
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

/// The diffs of a tool call's content.
fn diffs_of(content: &[ToolCallContent]) -> Vec<ToolCallContent> {
    content
        .iter()
        .filter(|c| matches!(c, ToolCallContent::Diff(_)))
        .cloned()
        .collect()
}
