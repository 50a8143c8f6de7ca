//! The host's own tools, offered on every session's MCP server before the
//! clients' tools: working contexts (seed 000, with the rules REST has:
//! `engine::contexts`) and the session's projection (seed 003, what the
//! REST detail reads). Every one is scoped to the session's project: an
//! agent never names another project.

use serde_json::{Value, json};
use tether_protocol::context::WorkingContext;

use super::contexts::SaveRefusal;
use super::{Engine, EngineError};
use crate::auth::Principal;

/// The names of the host's tools; a client may not contribute a tool of
/// one of these names.
pub const HOST_TOOL_NAMES: [&str; 4] = [
    "load_working_context",
    "save_working_context",
    "list_working_contexts",
    "session_context",
];

/// The host's tools as MCP tool definitions.
pub fn host_tools() -> Vec<Value> {
    let session = json!({
        "type": "string", "pattern": "^[A-Za-z0-9._:-]{1,128}$",
        "description": "The working context's session name in this project; default: this session's id."
    });
    let fact = json!({"type": "object", "required": ["text"], "properties": {
        "text": {"type": "string"}, "source": {"type": "object"}}});
    let context = json!({
        "type": "object",
        "description": "What the work is for and where it stands; at least a goal or one entry.",
        "properties": {
            "goal": {"type": "string"},
            "activeConstraints": {"type": "array", "items": fact},
            "verifiedFacts": {"type": "array", "items": fact},
            "openHypotheses": {"type": "array", "items": fact},
            "decisions": {"type": "array", "items": {"type": "object"}},
            "exactEvidence": {"type": "array", "items": {"type": "object"}},
            "pendingActions": {"type": "array", "items": {"type": "string"}},
        }
    });
    vec![
        json!({
            "name": "load_working_context",
            "title": "Load working context",
            "description": "Looks up the working context saved for a session of this project: \
                `found`, the context (`working`) and `otherSessions`, the project's other saved \
                sessions, most recently saved first (listed on a hit too, never the one asked for).",
            "inputSchema": {"type": "object", "properties": {"session": session}},
        }),
        json!({
            "name": "save_working_context",
            "title": "Save working context",
            "description": "Saves (replaces) the working context of a session of this project, so \
                a later session can pick the work up. An empty context is refused (it would erase \
                the saved one), as is one over 1 MiB.",
            "inputSchema": {"type": "object", "required": ["context"],
                "properties": {"session": session, "context": context}},
        }),
        json!({
            "name": "list_working_contexts",
            "title": "List working contexts",
            "description": "The sessions of this project with a saved working context, most \
                recently saved first, 100 a page; pass a page's nextCursor as cursor for the next.",
            "inputSchema": {"type": "object", "properties": {
                "cursor": {"type": "string", "description": "The nextCursor of the page before."}}},
        }),
        json!({
            "name": "session_context",
            "title": "This session",
            "description": "This session's projection, as the host keeps it: state and cause, \
                turns, the open turn, the first turn's text, the latest context, commands, \
                working directories and configuration.",
            "inputSchema": {"type": "object", "properties": {}},
        }),
    ]
}

impl Engine {
    /// Calls one of the host's tools for `session`'s agent: `None` when
    /// `name` is not one, else its structured result or why it failed, in
    /// words for the agent.
    pub async fn call_host_tool(
        &self,
        session: &str,
        name: &str,
        arguments: &Value,
    ) -> Option<Result<Value, String>> {
        if !HOST_TOOL_NAMES.contains(&name) {
            return None;
        }
        Some(self.host_tool(session, name, arguments).await)
    }

    async fn host_tool(&self, session: &str, name: &str, args: &Value) -> Result<Value, String> {
        /// The page of working contexts the tool lists.
        const CONTEXTS_PAGE: u32 = 100;
        let said = |e: EngineError| e.to_string();
        let view = self
            .session_view(&Principal::loopback_admin(), session)
            .await
            .map_err(said)?;
        let project = view.project.as_str();
        let named = match args.get("session") {
            None | Some(Value::Null) => session,
            Some(Value::String(named)) => named.as_str(),
            Some(_) => return Err("`session` must be a string.".to_owned()),
        };
        let json = |value: Result<Value, serde_json::Error>| value.map_err(|e| e.to_string());
        match name {
            "load_working_context" => json(serde_json::to_value(
                self.load_working_context(project, named)
                    .await
                    .map_err(said)?,
            )),
            "save_working_context" => {
                let context = args
                    .get("context")
                    .ok_or("`context` is required: the working context to save.")?;
                let context: WorkingContext = serde_json::from_value(context.clone())
                    .map_err(|e| format!("`context` is not a working context: {e}"))?;
                let saved = self
                    .save_working_context(project, named, &context)
                    .await
                    .map_err(|refusal| match refusal {
                        SaveRefusal::Empty => {
                            "The working context is empty; saving it would erase \
                            the saved one. Send at least a goal or one entry."
                                .to_owned()
                        }
                        SaveRefusal::TooLarge(size) => format!(
                            "The working context is {size} bytes; at most {} (1 MiB) are allowed.",
                            tether_protocol::context::MAX_CONTEXT_BYTES
                        ),
                        SaveRefusal::Engine(err) => err.to_string(),
                    })?;
                json(serde_json::to_value(saved))
            }
            "list_working_contexts" => {
                let cursor = args.get("cursor").and_then(Value::as_str);
                json(serde_json::to_value(
                    self.working_contexts(project, cursor, CONTEXTS_PAGE)
                        .await
                        .map_err(said)?,
                ))
            }
            _ => json(serde_json::to_value(&view)),
        }
    }
}
