//! The per-session MCP server, served: how an ACP agent reaches the host's
//! own tools (`engine::host_tools`: working contexts and the session's
//! projection) and the session's client-contributed tools. One
//! streamable-HTTP endpoint per session with a running agent, at
//! `/mcp/{session}`, served with the official `rmcp` SDK and guarded by a
//! random bearer token that only that agent process is given (in
//! `mcpServers` at `session/new`, `session/resume` or `session/load`, or
//! to `tether mcp-stdio` for agents that take only stdio; the registry is
//! `engine::mcp`). `tools/list` is the host's tools, then the session's
//! current client tools; a client tool's `tools/call` is routed to the
//! contributing client like any client tool call, with the host's context
//! in the copy that client receives and never in what the agent gets back.

use std::sync::Arc;

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
use crate::engine::host_tools::host_tools;

type Endpoint = StreamableHttpService<SessionTools, LocalSessionManager>;

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
    let engine = state.engine.clone();
    let id = session.clone();
    let served = state.engine.mcp().served(&session, token, move |tools| {
        let handler = SessionTools {
            engine,
            session: id,
            tools,
        };
        StreamableHttpService::new(
            move || Ok(handler.clone()),
            Arc::new(LocalSessionManager::default()),
            StreamableHttpServerConfig::default(),
        )
    });
    let Some(served) = served else {
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
    let mut service: Endpoint = (*served).clone();
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

impl SessionTools {
    /// A client tool's call, routed to its client: its text content.
    async fn call_client_tool(&self, name: &str, arguments: Value) -> Value {
        let outcome = self
            .engine
            .call_client_tool(&self.session, name, arguments)
            .await;
        let (content, is_error) = match outcome {
            Ok(result) => (result["content"].clone(), false),
            Err(reason) => (json!([{"type": "text", "text": reason}]), true),
        };
        let content: Vec<Value> = match content {
            Value::Array(items) => items
                .into_iter()
                .filter(|c| c["type"] == "text")
                .map(|c| json!({"type": "text", "text": c["text"]}))
                .collect(),
            _ => Vec::new(),
        };
        json!({"content": content, "isError": is_error})
    }
}

impl ServerHandler for SessionTools {
    fn get_info(&self) -> InitializeResult {
        let capabilities = ServerCapabilities::builder()
            .enable_tools()
            .enable_tool_list_changed()
            .build();
        let mut info = InitializeResult::new(capabilities);
        info.instructions = Some(
            "The Tether host's tools for this session (working contexts of its project, the \
             session's own state), then the tools of the clients watching it; each client tool \
             runs on the client that contributed it."
                .to_owned(),
        );
        info
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        let clients = self
            .engine
            .client_tools(&self.session)
            .await
            .map_err(|e| ErrorData::internal_error(e.to_string(), None))?;
        let tools = host_tools()
            .into_iter()
            .chain(clients)
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
        let result = match self
            .engine
            .call_host_tool(&self.session, &request.name, &arguments)
            .await
        {
            Some(Ok(structured)) => json!({
                "content": [{"type": "text", "text": structured.to_string()}],
                "structuredContent": structured, "isError": false,
            }),
            Some(Err(reason)) => {
                json!({"content": [{"type": "text", "text": reason}], "isError": true})
            }
            None => self.call_client_tool(&request.name, arguments).await,
        };
        let result: CallToolResult = serde_json::from_value(result)
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
