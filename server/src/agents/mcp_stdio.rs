//! `tether mcp-stdio`: the session's MCP server for an agent that takes
//! only stdio MCP servers (the one transport ACP requires every agent to
//! accept). The agent starts it as told in `mcpServers`; it serves MCP on
//! its stdin and stdout and forwards every tool listing and call to the
//! session's streamable-HTTP endpoint, with the session's token (given in
//! its environment, never on its command line), and passes the endpoint's
//! tool-list changes back. It ends when either side does.

use std::sync::{Arc, OnceLock};

use rmcp::model::{
    CallToolRequestParams, CallToolResponse, ClientConfig, InitializeResult, ListToolsResult,
    PaginatedRequestParams, ServerCapabilities,
};
use rmcp::service::{NotificationContext, Peer, RequestContext};
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::{ClientHandler, ErrorData, RoleClient, RoleServer, ServerHandler, ServiceExt};

/// The environment variable carrying the endpoint's bearer token.
pub const TOKEN_ENV: &str = "TETHER_MCP_TOKEN";

/// The arguments of `tether mcp-stdio`.
#[derive(Debug, Clone, clap::Args)]
pub struct McpStdioArgs {
    /// The session's MCP endpoint (`http://host:port/mcp/<session>`).
    #[arg(long)]
    pub url: String,
}

/// Runs the bridge until the agent or the endpoint closes; why it could
/// not start, in words (on stderr, which the agent logs).
pub async fn run(args: &McpStdioArgs) -> Result<(), String> {
    let token = std::env::var(TOKEN_ENV)
        .map_err(|_| format!("{TOKEN_ENV} is not set: the session's MCP token is needed"))?;
    let agent: Arc<OnceLock<Peer<RoleServer>>> = Arc::default();
    let config = StreamableHttpClientTransportConfig::with_uri(args.url.clone()).auth_header(token);
    let endpoint = Endpoint {
        agent: agent.clone(),
    }
    .serve(StreamableHttpClientTransport::from_config(config))
    .await
    .map_err(|e| format!("cannot reach the session's MCP endpoint {}: {e}", args.url))?;
    let forward = Forward {
        endpoint: endpoint.peer().clone(),
    };
    let served = forward
        .serve(rmcp::transport::io::stdio())
        .await
        .map_err(|e| format!("the agent did not open MCP on stdio: {e}"))?;
    let _ = agent.set(served.peer().clone());
    tokio::select! {
        _ = served.waiting() => {}
        _ = endpoint.waiting() => {}
    }
    Ok(())
}

/// The client side, towards the session's endpoint.
struct Endpoint {
    agent: Arc<OnceLock<Peer<RoleServer>>>,
}

impl ClientHandler for Endpoint {
    fn get_info(&self) -> ClientConfig {
        ClientConfig::default()
    }

    async fn on_tool_list_changed(&self, _context: NotificationContext<RoleClient>) {
        if let Some(agent) = self.agent.get() {
            let _ = agent.notify_tool_list_changed().await;
        }
    }
}

/// The server side, towards the agent: every request goes to the endpoint.
#[derive(Clone)]
struct Forward {
    endpoint: Peer<RoleClient>,
}

fn upstream(err: rmcp::ServiceError) -> ErrorData {
    ErrorData::internal_error(format!("the session's MCP endpoint: {err}"), None)
}

impl ServerHandler for Forward {
    fn get_info(&self) -> InitializeResult {
        let capabilities = ServerCapabilities::builder()
            .enable_tools()
            .enable_tool_list_changed()
            .build();
        let mut info = InitializeResult::new(capabilities);
        info.instructions = self
            .endpoint
            .peer_info()
            .and_then(|i| i.instructions.clone());
        info
    }

    async fn list_tools(
        &self,
        request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        self.endpoint.list_tools(request).await.map_err(upstream)
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let result = self.endpoint.call_tool(request).await.map_err(upstream)?;
        Ok(result.into())
    }
}
