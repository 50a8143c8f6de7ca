//! The registry of per-session MCP endpoints: which sessions have one, the
//! random bearer token only that session's agent process is given, and a
//! signal for when its tool list changes. The serving of the endpoints
//! (MCP over streamable HTTP) is `http::mcp`'s; what they offer is the
//! engine's (`host_tools`, client tools).

use std::any::Any;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use tokio::sync::watch;

/// The MCP endpoints of this host's sessions.
#[derive(Default)]
pub struct McpHub {
    /// `http://host:port` of this server, once it listens.
    base: OnceLock<String>,
    sessions: Mutex<HashMap<String, Entry>>,
}

impl std::fmt::Debug for McpHub {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("McpHub")
            .field("base", &self.base.get())
            .finish_non_exhaustive()
    }
}

struct Entry {
    token: String,
    tools: watch::Sender<u64>,
    /// What the serving layer keeps for this endpoint (its MCP sessions),
    /// made on first use and dropped with the entry.
    served: Option<Arc<dyn Any + Send + Sync>>,
}

/// Where an agent reaches its session's tools, and with what.
#[derive(Debug, Clone)]
pub struct McpEndpoint {
    /// The URL.
    pub url: String,
    /// The bearer token.
    pub token: String,
}

impl McpHub {
    /// Records the address this server listens on (a wildcard bind is
    /// reached on loopback, where the agents run).
    pub fn listening(&self, addr: std::net::SocketAddr) {
        let host = if addr.ip().is_unspecified() {
            std::net::SocketAddr::new(std::net::Ipv4Addr::LOCALHOST.into(), addr.port())
        } else {
            addr
        };
        let _ = self.base.set(format!("http://{host}"));
    }

    /// The session's endpoint, made on first use; `None` before the server
    /// listens.
    pub fn endpoint(&self, session: &str) -> Option<McpEndpoint> {
        let base = self.base.get()?;
        let mut sessions = self.sessions.lock().ok()?;
        let entry = sessions.entry(session.to_owned()).or_insert_with(|| Entry {
            token: uuid::Uuid::new_v4().simple().to_string()
                + &uuid::Uuid::new_v4().simple().to_string(),
            tools: watch::channel(0).0,
            served: None,
        });
        Some(McpEndpoint {
            url: format!("{base}/mcp/{session}"),
            token: entry.token.clone(),
        })
    }

    /// The session's actor stopped (no agent runs for it any more): its
    /// endpoint and token go.
    pub fn forget(&self, session: &str) {
        if let Ok(mut sessions) = self.sessions.lock() {
            sessions.remove(session);
        }
    }

    /// The session's client tools changed: connected MCP clients are told.
    pub fn tools_changed(&self, session: &str) {
        if let Ok(sessions) = self.sessions.lock()
            && let Some(entry) = sessions.get(session)
        {
            entry.tools.send_modify(|version| *version += 1);
        }
    }

    /// For the bearer of the session's token: what the serving layer keeps
    /// for the endpoint (made by `make` on first use, from a receiver of
    /// tool-list changes); `None` for anyone else.
    pub fn served<T, F>(&self, session: &str, token: Option<&str>, make: F) -> Option<Arc<T>>
    where
        T: Send + Sync + 'static,
        F: FnOnce(watch::Receiver<u64>) -> T,
    {
        let mut sessions = self.sessions.lock().ok()?;
        let entry = sessions.get_mut(session)?;
        let given = token?;
        // Compared in full whatever the first difference: no timing hint.
        let same = given.len() == entry.token.len()
            && given
                .bytes()
                .zip(entry.token.bytes())
                .fold(0u8, |acc, (a, b)| acc | (a ^ b))
                == 0;
        if !same {
            return None;
        }
        if let Some(kept) = entry.served.clone().and_then(|k| k.downcast::<T>().ok()) {
            return Some(kept);
        }
        let kept = Arc::new(make(entry.tools.subscribe()));
        entry.served = Some(kept.clone());
        Some(kept)
    }
}
