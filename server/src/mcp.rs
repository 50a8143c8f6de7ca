//! The per-session MCP server: how an ACP agent reaches the session's
//! client-contributed tools. One streamable-HTTP endpoint per session with a
//! running agent, at `/mcp/{session}`, served with the official `rmcp` SDK
//! and guarded by a random bearer token that only that agent process is
//! given (in `mcpServers` at `session/new`, `session/resume` or
//! `session/load`). `tools/list` is the session's current client tools;
//! `tools/call` is routed to the contributing client like any client tool
//! call (`engine::actor::tools`), with the host's context in the copy that
//! client receives and never in what the agent gets back.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use axum::body::Body;
use axum::extract::{Path, Request, State};
use axum::response::{IntoResponse, Response};
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, InitializeResult, ListToolsResult,
    PaginatedRequestParams, ServerCapabilities, Tool,
};
use rmcp::service::{NotificationContext, RequestContext};
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use rmcp::{ErrorData, RoleServer, ServerHandler};
use serde_json::{Value, json};
use tokio::sync::watch;
use tower::Service;

use crate::AppState;
use crate::engine::Engine;

type Endpoint = StreamableHttpService<SessionTools, LocalSessionManager>;

/// The MCP endpoints of this host's sessions.
#[derive(Default)]
pub struct McpHub {
    /// `http://host:port` of this server, once it listens.
    base: OnceLock<String>,
    sessions: Mutex<HashMap<String, Session>>,
}

impl std::fmt::Debug for McpHub {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("McpHub")
            .field("base", &self.base.get())
            .finish_non_exhaustive()
    }
}

struct Session {
    token: String,
    tools: watch::Sender<u64>,
    service: Endpoint,
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
    pub fn endpoint(&self, engine: &Engine, session: &str) -> Option<McpEndpoint> {
        let base = self.base.get()?;
        let mut sessions = self.sessions.lock().ok()?;
        let entry = sessions.entry(session.to_owned()).or_insert_with(|| {
            let (tools, _) = watch::channel(0);
            let handler = SessionTools {
                engine: engine.clone(),
                session: session.to_owned(),
                tools: tools.subscribe(),
            };
            let service = StreamableHttpService::new(
                move || Ok(handler.clone()),
                Arc::new(LocalSessionManager::default()),
                StreamableHttpServerConfig::default(),
            );
            Session {
                token: uuid::Uuid::new_v4().simple().to_string()
                    + &uuid::Uuid::new_v4().simple().to_string(),
                tools,
                service,
            }
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

    fn service(&self, session: &str, token: Option<&str>) -> Option<Endpoint> {
        let sessions = self.sessions.lock().ok()?;
        let entry = sessions.get(session)?;
        let given = token?;
        // Compared in full whatever the first difference: no timing hint.
        let same = given.len() == entry.token.len()
            && given
                .bytes()
                .zip(entry.token.bytes())
                .fold(0u8, |acc, (a, b)| acc | (a ^ b))
                == 0;
        same.then(|| entry.service.clone())
    }
}

/// `/mcp/{session}`: the session's MCP endpoint, for the bearer of its token.
pub async fn serve(
    State(state): State<AppState>,
    Path(session): Path<String>,
    request: Request,
) -> Response {
    let token = request
        .headers()
        .get(axum::http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    let Some(mut service) = state.engine.mcp().service(&session, token) else {
        let problem = json!({"type": "about:blank", "title": "Unauthorized", "status": 401,
            "code": "unauthenticated",
            "detail": "This MCP endpoint is for the session's agent process only: send the bearer token it was given."});
        return (
            axum::http::StatusCode::UNAUTHORIZED,
            [(axum::http::header::CONTENT_TYPE, "application/problem+json")],
            problem.to_string(),
        )
            .into_response();
    };
    match service.call(request).await {
        Ok(response) => response.map(Body::new),
        Err(never) => match never {},
    }
}

/// One MCP session's handler: the Tether session's client tools.
#[derive(Clone)]
struct SessionTools {
    engine: Engine,
    session: String,
    tools: watch::Receiver<u64>,
}

impl ServerHandler for SessionTools {
    fn get_info(&self) -> InitializeResult {
        let capabilities = ServerCapabilities::builder()
            .enable_tools()
            .enable_tool_list_changed()
            .build();
        let mut info = InitializeResult::new(capabilities);
        info.instructions = Some(
            "The tools of the clients watching this Tether session; each runs on the client that \
             contributed it."
                .to_owned(),
        );
        info
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        let tools = self
            .engine
            .client_tools(&self.session)
            .await
            .map_err(|e| ErrorData::internal_error(e.to_string(), None))?;
        let tools = tools
            .into_iter()
            .filter_map(|tool| {
                let schema = tool
                    .get("inputSchema")
                    .cloned()
                    .filter(Value::is_object)
                    .unwrap_or_else(|| json!({"type": "object"}));
                serde_json::from_value::<Tool>(json!({
                    "name": tool["name"], "title": tool.get("title"),
                    "description": tool.get("description"), "inputSchema": schema,
                }))
                .ok()
            })
            .collect();
        Ok(ListToolsResult::with_all_items(tools))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let arguments = request.arguments.map(Value::Object).unwrap_or(Value::Null);
        let outcome = self
            .engine
            .call_client_tool(&self.session, &request.name, arguments)
            .await;
        let (content, is_error) = match outcome {
            Ok(result) => (result["content"].clone(), false),
            Err(reason) => (json!([{"type": "text", "text": reason}]), true),
        };
        let content = match content {
            Value::Array(items) => Value::Array(
                items
                    .into_iter()
                    .filter(|c| c["type"] == "text")
                    .map(|c| json!({"type": "text", "text": c["text"]}))
                    .collect(),
            ),
            _ => json!([]),
        };
        let result: CallToolResult =
            serde_json::from_value(json!({"content": content, "isError": is_error}))
                .map_err(|e| ErrorData::internal_error(e.to_string(), None))?;
        Ok(result.into())
    }

    async fn on_initialized(&self, context: NotificationContext<RoleServer>) {
        let mut tools = self.tools.clone();
        tokio::spawn(async move {
            while tools.changed().await.is_ok() {
                if context.peer.notify_tool_list_changed().await.is_err() {
                    break;
                }
            }
        });
    }
}
