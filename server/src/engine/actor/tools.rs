//! Client-contributed tools (AHP `session/activeClientSet`): routing a call
//! from the session's agent to the client that contributed the tool, with
//! the host's `ToolCallContext` injected into the copy of the arguments
//! that client alone receives, and the client's result back to the agent.
//!
//! A call is recorded as `chat/toolCallStart` (the client as contributor),
//! `chat/toolCallReady {confirmed: not-needed}` and a `toolClientExecution`
//! entry in the session's `inputNeeded`. The last two carry the arguments:
//! the stored envelopes (and so the transcript, every replay and every
//! other subscriber) have the model's arguments; the contributing client's
//! connections get a directed copy of the same envelopes whose arguments
//! hold `__tether` (`store::Directed`, chosen per connection by its
//! `clientId` in `ws::connection`). The client answers with
//! `chat/toolCallComplete`; a call it does not answer in time, or that it
//! leaves by disconnecting (past the grace period), fails with a clear
//! error, and the agent gets that error, not a hang.

use std::collections::HashMap;

use serde_json::{Value, json};
use tether_protocol::toolctx::ToolCallContext;
use tether_protocol::workdir::file_uri_path;
use tokio::sync::oneshot;
use tokio::time::Instant;

use super::SessionActor;
use crate::store::Directed;

/// Who asked for a client tool call, and where its result goes.
#[derive(Debug)]
pub(crate) enum Requester {
    /// The echo agent's `/tool` turn: answered with the result as text.
    Echo,
    /// An agent (MCP `tools/call`): the result or the error.
    Agent(oneshot::Sender<Result<Value, String>>),
}

/// A call waiting for its client.
#[derive(Debug)]
pub(super) struct ClientCall {
    turn_id: String,
    client_id: String,
    tool: String,
    input_id: String,
    deadline: Instant,
    requester: Requester,
}

/// The calls waiting, by `(chat, toolCallId)`.
pub(super) type ClientCalls = HashMap<(String, String), ClientCall>;

impl SessionActor {
    /// The host's context for a client tool: the primary working directory
    /// as a path, and the session id.
    fn tool_context(&self) -> ToolCallContext {
        let cwd = self.model.as_ref().and_then(|m| {
            m.primary_directory()
                .and_then(|uri| file_uri_path(uri).ok())
        });
        let mut context = ToolCallContext::new(cwd.as_deref());
        context.set_session_id(&self.id);
        context
    }

    /// The echo agent's trick: a turn whose text is `/tool NAME {json}`
    /// calls that client tool and answers with its result. `false` when
    /// the text is not such a turn.
    pub(super) fn echo_tool_turn(&mut self, chat: &str, turn_id: &str, text: &str) -> bool {
        let Some(rest) = text.trim().strip_prefix("/tool ") else {
            return false;
        };
        let rest = rest.trim();
        let (name, args) = rest.split_once(char::is_whitespace).unwrap_or((rest, ""));
        let arguments = if args.trim().is_empty() {
            Ok(Value::Null)
        } else {
            serde_json::from_str::<Value>(args.trim())
        };
        let outcome = match arguments {
            Ok(arguments) => self
                .call_client_tool(
                    chat,
                    turn_id,
                    format!("{turn_id}.tool"),
                    name,
                    arguments,
                    Requester::Echo,
                )
                .map_err(|(reason, _)| reason),
            Err(err) => Err(format!("its arguments are not JSON: {err}")),
        };
        if let Err(reason) = outcome {
            self.follow_ups.push((
                chat.to_owned(),
                echo_part(turn_id, &format!("/tool {name} failed: {reason}")),
            ));
            self.follow_ups.push((
                chat.to_owned(),
                json!({"type": "chat/turnComplete", "turnId": turn_id, "duration": 0}),
            ));
        }
        true
    }

    /// The session's ACP agent calls a client tool (MCP `tools/call`), in
    /// the turn it is answering.
    pub(super) fn agent_tool_call(
        &mut self,
        name: &str,
        arguments: Value,
        reply: oneshot::Sender<Result<Value, String>>,
    ) {
        let Some((chat, turn_id)) = self.running.as_ref().and_then(|r| r.turn.clone()) else {
            let _ = reply.send(Err("no turn of this session is running".to_owned()));
            return;
        };
        let id = format!("mcp-{}", uuid::Uuid::new_v4().simple());
        if let Err((reason, Requester::Agent(reply))) = self.call_client_tool(
            &chat,
            &turn_id,
            id,
            name,
            arguments,
            Requester::Agent(reply),
        ) {
            let _ = reply.send(Err(reason));
        }
    }

    /// Records a call to the client tool `name` and delivers it to the
    /// client that contributed it; refused (the requester handed back) when
    /// no client offers it.
    pub(super) fn call_client_tool(
        &mut self,
        chat: &str,
        turn_id: &str,
        tool_call_id: String,
        name: &str,
        arguments: Value,
        requester: Requester,
    ) -> Result<(), (String, Requester)> {
        let found = self.model.as_ref().and_then(|model| {
            model
                .session
                .active_clients
                .iter()
                .find_map(|c| c.tools.iter().find(|t| t.name == name).map(|t| (c, t)))
        });
        let Some((client, tool)) = found else {
            return Err((
                format!("no client of this session offers a tool named {name:?}"),
                requester,
            ));
        };
        let client_id = client.client_id.clone();
        let display = tool.title.clone().unwrap_or_else(|| name.to_owned());
        let contributor = json!({"kind": "client", "clientId": client_id});
        let input = arguments.to_string();
        let injected = self.tool_context().inject(arguments).to_string();
        let invocation = format!(
            "Running {display} on {}",
            client.display_name.as_deref().unwrap_or(&client_id)
        );
        let ready = |input: &str| {
            json!({"type": "chat/toolCallReady", "turnId": turn_id, "toolCallId": tool_call_id,
                   "contributor": contributor, "invocationMessage": invocation,
                   "toolInput": input, "confirmed": "not-needed"})
        };
        let input_id = format!("{chat}#{tool_call_id}");
        let needed = |input: &str| {
            json!({"type": "session/inputNeededSet", "request": {
            "kind": "toolClientExecution", "id": input_id, "chat": chat, "turnId": turn_id,
            "clientId": client_id, "toolCall": {
                "status": "running", "toolCallId": tool_call_id, "toolName": name,
                "displayName": display, "contributor": contributor,
                "invocationMessage": invocation, "toolInput": input, "confirmed": "not-needed",
            }}})
        };
        self.follow_ups.push((
            chat.to_owned(),
            json!({"type": "chat/toolCallStart", "turnId": turn_id, "toolCallId": tool_call_id,
                   "toolName": name, "displayName": display, "contributor": contributor}),
        ));
        for (channel, plain, directed) in [
            (chat.to_owned(), ready(&input), ready(&injected)),
            (self.uri.clone(), needed(&input), needed(&injected)),
        ] {
            self.directed.insert(
                self.follow_ups.len(),
                Directed {
                    client_id: client_id.clone(),
                    sub: self.tool_owners.get(&client_id).cloned(),
                    action: directed.to_string(),
                },
            );
            self.follow_ups.push((channel, plain));
        }
        self.client_calls.insert(
            (chat.to_owned(), tool_call_id),
            ClientCall {
                turn_id: turn_id.to_owned(),
                client_id,
                tool: name.to_owned(),
                input_id,
                deadline: Instant::now() + self.ctx.config.client_tool_timeout,
                requester,
            },
        );
        Ok(())
    }

    /// A client's `chat/toolCallComplete` was committed: the call's
    /// `inputNeeded` entry goes, and the result goes to whoever asked.
    pub(super) fn client_tool_completed(&mut self, chat: &str, action: &Value) {
        let tool_call_id = action["toolCallId"].as_str().unwrap_or_default();
        let Some(call) = self
            .client_calls
            .remove(&(chat.to_owned(), tool_call_id.to_owned()))
        else {
            return;
        };
        let result = &action["result"];
        let outcome = if result["success"] == true {
            Ok(result.clone())
        } else {
            Err(result_text(result).unwrap_or_else(|| format!("the client's {} failed", call.tool)))
        };
        self.finish_client_call(chat, call, outcome);
    }

    /// Fails every call whose client did not answer in time.
    pub(super) fn expire_client_calls(&mut self) {
        let now = Instant::now();
        let expired: Vec<_> = self
            .client_calls
            .iter()
            .filter(|(_, c)| c.deadline <= now)
            .map(|(k, _)| k.clone())
            .collect();
        let timeout = self.ctx.config.client_tool_timeout;
        for key in expired {
            if let Some(call) = self.client_calls.remove(&key) {
                let reason = format!(
                    "client {} did not answer the {} call within {} s",
                    call.client_id,
                    call.tool,
                    timeout.as_secs_f64()
                );
                self.fail_client_call(&key.0, &key.1, call, reason);
            }
        }
    }

    /// The client has gone (its last connection closed, the grace period
    /// passed): its calls fail and it leaves the session's active clients.
    pub(super) fn client_gone(&mut self, client_id: &str) {
        let keys: Vec<_> = self
            .client_calls
            .iter()
            .filter(|(_, c)| c.client_id == client_id)
            .map(|(k, _)| k.clone())
            .collect();
        for key in keys {
            if let Some(call) = self.client_calls.remove(&key) {
                let reason = format!(
                    "client {client_id} disconnected before the {} call finished",
                    call.tool
                );
                self.fail_client_call(&key.0, &key.1, call, reason);
            }
        }
        let active = self.model.as_ref().is_some_and(|m| {
            m.session
                .active_clients
                .iter()
                .any(|c| c.client_id == client_id)
        });
        if active {
            self.follow_ups.push((
                self.uri.clone(),
                json!({"type": "session/activeClientRemoved", "clientId": client_id}),
            ));
        }
    }

    /// When the next waiting call runs out of time.
    pub(super) fn next_client_deadline(&self) -> Option<Instant> {
        self.client_calls.values().map(|c| c.deadline).min()
    }

    fn fail_client_call(
        &mut self,
        chat: &str,
        tool_call_id: &str,
        call: ClientCall,
        reason: String,
    ) {
        tracing::info!(session = %self.id, %reason, "client tool call failed");
        self.follow_ups.push((
            chat.to_owned(),
            json!({"type": "chat/toolCallComplete", "turnId": call.turn_id, "toolCallId": tool_call_id,
                   "result": {"success": false, "pastTenseMessage": format!("{} failed", call.tool),
                              "error": {"message": reason}}}),
        ));
        self.finish_client_call(chat, call, Err(reason));
    }

    fn finish_client_call(&mut self, chat: &str, call: ClientCall, outcome: Result<Value, String>) {
        self.follow_ups.push((
            self.uri.clone(),
            json!({"type": "session/inputNeededRemoved", "id": call.input_id}),
        ));
        match call.requester {
            Requester::Echo => {
                let text = match &outcome {
                    Ok(result) => result_text(result).unwrap_or_default(),
                    Err(reason) => format!("/tool {} failed: {reason}", call.tool),
                };
                self.follow_ups
                    .push((chat.to_owned(), echo_part(&call.turn_id, &text)));
                self.follow_ups.push((
                    chat.to_owned(),
                    json!({"type": "chat/turnComplete", "turnId": call.turn_id, "duration": 0}),
                ));
            }
            Requester::Agent(reply) => {
                let _ = reply.send(outcome);
            }
        }
    }
}

/// A tool result's text: its text content joined, else its structured
/// content as JSON.
fn result_text(result: &Value) -> Option<String> {
    let texts: Vec<&str> = result["content"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|c| c["text"].as_str())
        .collect();
    if !texts.is_empty() {
        return Some(texts.join("\n"));
    }
    if let Some(message) = result["error"]["message"].as_str() {
        return Some(message.to_owned());
    }
    result.get("structuredContent").map(Value::to_string)
}

fn echo_part(turn_id: &str, text: &str) -> Value {
    json!({"type": "chat/responsePart", "turnId": turn_id,
           "part": {"kind": "markdown", "id": format!("{turn_id}.echo"), "content": text}})
}
