//! Which AHP clients are connected, and which sessions count them among
//! their active clients, so a client that goes away leaves those sessions
//! once its grace period has passed (a reconnect within it keeps its tools).

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};

use serde_json::Value;
use tether_protocol::channel::Channel;
use tokio::sync::oneshot;

use super::{Command, Ctx, Engine, EngineError};
use crate::auth::Principal;

#[derive(Debug, Default)]
struct Entry {
    connections: usize,
    /// Bumped by every new connection: a grace timer from before it is stale.
    generation: u64,
    /// Sessions in which the client is active.
    sessions: HashSet<String>,
}

/// Client presence on this host.
#[derive(Debug, Default)]
pub(crate) struct Presence {
    clients: Mutex<HashMap<String, Entry>>,
}

impl Presence {
    /// Whether the client has a connection open here.
    pub(crate) fn connected(&self, client_id: &str) -> bool {
        self.clients
            .lock()
            .ok()
            .and_then(|c| c.get(client_id).map(|e| e.connections > 0))
            .unwrap_or(false)
    }

    /// Records the client as active in `session`; `true` when it has no
    /// connection open (the caller starts the grace period).
    pub(crate) fn active_in(&self, client_id: &str, session: &str) -> bool {
        let Ok(mut clients) = self.clients.lock() else {
            return false;
        };
        let entry = clients.entry(client_id.to_owned()).or_default();
        entry.sessions.insert(session.to_owned());
        entry.connections == 0
    }

    /// The client left `session`.
    pub(crate) fn left(&self, client_id: &str, session: &str) {
        if let Ok(mut clients) = self.clients.lock()
            && let Some(entry) = clients.get_mut(client_id)
        {
            entry.sessions.remove(session);
            if entry.connections == 0 && entry.sessions.is_empty() {
                clients.remove(client_id);
            }
        }
    }

    fn connect(&self, client_id: &str) {
        if let Ok(mut clients) = self.clients.lock() {
            let entry = clients.entry(client_id.to_owned()).or_default();
            entry.connections += 1;
            entry.generation += 1;
        }
    }

    /// The generation to check after the grace period, when this was the
    /// client's last connection and it is active somewhere.
    fn disconnect(&self, client_id: &str) -> Option<u64> {
        let mut clients = self.clients.lock().ok()?;
        let entry = clients.get_mut(client_id)?;
        entry.connections = entry.connections.saturating_sub(1);
        if entry.connections > 0 {
            return None;
        }
        if entry.sessions.is_empty() {
            clients.remove(client_id);
            return None;
        }
        Some(entry.generation)
    }

    /// The sessions to tell, if the client is still away since `generation`.
    fn gone(&self, client_id: &str, generation: u64) -> Vec<String> {
        let Ok(clients) = self.clients.lock() else {
            return Vec::new();
        };
        match clients.get(client_id) {
            Some(entry) if entry.connections == 0 && entry.generation == generation => {
                entry.sessions.iter().cloned().collect()
            }
            _ => Vec::new(),
        }
    }
}

impl Ctx {
    /// A connection named `client_id` at `initialize` or `reconnect`.
    pub(crate) fn client_connected(&self, client_id: &str) {
        self.clients.connect(client_id);
    }

    /// A connection of `client_id` closed: when it was the last, the
    /// sessions it is active in are told after the grace period, unless it
    /// came back.
    pub(crate) fn client_disconnected(self: &Arc<Self>, client_id: &str) {
        if let Some(generation) = self.clients.disconnect(client_id) {
            self.expect_back(client_id, generation);
        }
    }

    /// Starts the grace period of a client that is away.
    pub(crate) fn expect_back(self: &Arc<Self>, client_id: &str, generation: u64) {
        let ctx = self.clone();
        let client_id = client_id.to_owned();
        tokio::spawn(async move {
            tokio::time::sleep(ctx.config.client_grace).await;
            for session in ctx.clients.gone(&client_id, generation) {
                if let Some(mailbox) = ctx.mailbox(&session) {
                    let _ = mailbox
                        .send(Command::ClientGone {
                            client_id: client_id.clone(),
                        })
                        .await;
                }
            }
        });
    }

    /// `client_id` is active in `session` (after its `activeClientSet`, or
    /// when the session loads): a client with no connection gets a grace
    /// period from now.
    pub(crate) fn client_active(self: &Arc<Self>, client_id: &str, session: &str) {
        if self.clients.active_in(client_id, session) {
            let generation = self
                .clients
                .clients
                .lock()
                .ok()
                .and_then(|c| c.get(client_id).map(|e| e.generation))
                .unwrap_or(0);
            self.expect_back(client_id, generation);
        }
    }
}

/// What the engine offers about clients and their tools.
impl Engine {
    /// A WebSocket connection named `client_id`.
    pub fn client_connected(&self, client_id: &str) {
        self.ctx.client_connected(client_id);
    }

    /// A WebSocket connection of `client_id` closed.
    pub fn client_disconnected(&self, client_id: &str) {
        self.ctx.client_disconnected(client_id);
    }

    /// The per-session MCP endpoints.
    pub fn mcp(&self) -> &super::mcp::McpHub {
        &self.ctx.mcp
    }

    /// The tools the session's clients contribute (AHP `ToolDefinition`s).
    pub async fn client_tools(&self, session: &str) -> Result<Vec<Value>, EngineError> {
        let snapshot = self
            .snapshot(&Principal::loopback_admin(), &Channel::session_uri(session))
            .await?;
        Ok(snapshot.state["activeClients"]
            .as_array()
            .into_iter()
            .flatten()
            .flat_map(|client| client["tools"].as_array().cloned().unwrap_or_default())
            .collect())
    }

    /// Calls a client tool for the session's agent, in its running turn;
    /// the client's result, or why the call failed.
    pub async fn call_client_tool(
        &self,
        session: &str,
        name: &str,
        arguments: Value,
    ) -> Result<Value, String> {
        let (reply, answer) = oneshot::channel();
        let command = Command::CallTool {
            name: name.to_owned(),
            arguments: Box::new(arguments),
            reply,
        };
        self.send(session, command).await;
        answer
            .await
            .unwrap_or_else(|_| Err("the session stopped before the call finished".to_owned()))
    }
}
