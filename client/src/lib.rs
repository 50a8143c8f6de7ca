//! A Rust client for Tether: typed calls for every REST endpoint
//! ([`Client`]) and the resumable AHP session stream
//! ([`stream::SessionStream`]).
//!
//! ```no_run
//! # async fn demo() -> Result<(), tether_client::Error> {
//! let client = tether_client::Client::new("http://127.0.0.1:7878")?;
//! let ready = client.readiness().await?;
//! println!("{} at serverSeq {}", ready.backend, ready.server_seq);
//! # Ok(()) }
//! ```

pub mod identity;
pub mod stream;
pub mod token;

pub use identity::ClientIdentity;
pub use stream::{Dispatched, SessionStream, Start, StreamConfig, StreamEvent};

use reqwest::{Method, StatusCode};
use serde::Serialize;
use serde::de::DeserializeOwned;
use tether_protocol::context::{
    LoadedWorkingContext, SavedWorkingContext, WorkingContext, WorkingContextList,
};
use tether_protocol::rest::{
    CreateSessionRequest, DispatchRequest, DispatchResponse, Health, Problem, Readiness,
    SessionPage, TranscriptPage,
};
use tether_protocol::toolctx::ToolCallContext;
use tether_protocol::view::SessionView;

/// What can go wrong talking to a Tether server.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The base URL is not a valid URL.
    #[error("invalid server URL {url:?}: {reason}")]
    InvalidUrl {
        /// The URL given.
        url: String,
        /// Why it was refused.
        reason: String,
    },
    /// The server could not be reached or the connection broke.
    #[error("cannot reach the server: {0}")]
    Unreachable(#[source] reqwest::Error),
    /// The server answered with a problem document.
    #[error("{status}: {code}{}", detail.as_deref().map(|d| format!(": {d}")).unwrap_or_default())]
    Api {
        /// HTTP status.
        status: u16,
        /// The problem's stable machine-readable code.
        code: String,
        /// The problem's detail, if any.
        detail: Option<String>,
    },
    /// The AHP WebSocket could not be opened.
    #[error("cannot reach the server at {url}: {reason}")]
    Connect {
        /// The WebSocket URL.
        url: String,
        /// Why.
        reason: String,
    },
    /// The server answered an AHP request with a JSON-RPC error.
    #[error("the server refused: {message} (JSON-RPC error {code})")]
    Rpc {
        /// The JSON-RPC error code (AHP codes: -32001 not found, and so on).
        code: i32,
        /// The server's message.
        message: String,
    },
    /// The AHP connection broke during a request.
    #[error("disconnected: {0}")]
    Disconnected(String),
    /// The session stream has ended (it gave up reconnecting).
    #[error("the session stream has ended")]
    StreamClosed,
    /// The client identity file could not be used.
    #[error("client identity {path}: {reason}")]
    Identity {
        /// The file.
        path: String,
        /// What went wrong.
        reason: String,
    },
    /// The token provider has no token.
    #[error("no token: {0}")]
    Token(String),
    /// The server answered with something that is not the expected JSON.
    #[error("unexpected response ({status}): {reason}")]
    Decode {
        /// HTTP status.
        status: u16,
        /// What was wrong with it.
        reason: String,
    },
}

/// A client for one Tether server.
#[derive(Debug, Clone)]
pub struct Client {
    base: reqwest::Url,
    http: reqwest::Client,
    tokens: Option<token::Tokens>,
}

impl Client {
    /// A client for the server at `base_url` (for example `http://127.0.0.1:7878`).
    pub fn new(base_url: &str) -> Result<Self, Error> {
        let base = reqwest::Url::parse(base_url).map_err(|e| Error::InvalidUrl {
            url: base_url.to_owned(),
            reason: e.to_string(),
        })?;
        if base.cannot_be_a_base() || !matches!(base.scheme(), "http" | "https") {
            return Err(Error::InvalidUrl {
                url: base_url.to_owned(),
                reason: "expected an http:// or https:// URL".to_owned(),
            });
        }
        Ok(Self {
            base,
            http: reqwest::Client::new(),
            tokens: None,
        })
    }

    /// The same client, sending `token` as its bearer token.
    pub fn with_token(self, token: impl Into<String>) -> Self {
        self.with_tokens(std::sync::Arc::new(token::StaticToken::new(token)))
    }

    /// The same client, asking `tokens` for a bearer token before each
    /// request.
    pub fn with_tokens(mut self, tokens: token::Tokens) -> Self {
        self.tokens = Some(tokens);
        self
    }

    /// `GET /healthz`.
    pub async fn health(&self) -> Result<Health, Error> {
        self.get("healthz").await
    }

    /// `GET /readyz`.
    pub async fn readiness(&self) -> Result<Readiness, Error> {
        self.get("readyz").await
    }

    /// `GET /v1/sessions`: a page of sessions, newest first.
    pub async fn sessions(&self, query: &SessionQuery) -> Result<SessionPage, Error> {
        let mut params = Vec::new();
        for (key, value) in [
            ("project", &query.project),
            ("state", &query.state),
            ("cursor", &query.cursor),
        ] {
            if let Some(value) = value {
                params.push((key, value.clone()));
            }
        }
        if let Some(limit) = query.limit {
            params.push(("limit", limit.to_string()));
        }
        self.send(Method::GET, "v1/sessions", &params, None::<&()>)
            .await
    }

    /// `GET /v1/search`: the transcripts of the caller's projects that
    /// match, best first.
    pub async fn search(
        &self,
        query: &SearchQuery,
    ) -> Result<tether_protocol::rest::SearchPage, Error> {
        let mut params = vec![("q", query.q.clone())];
        for (key, value) in [
            ("project", &query.project),
            ("agent", &query.agent),
            ("state", &query.state),
            ("since", &query.since),
            ("until", &query.until),
            ("cursor", &query.cursor),
        ] {
            if let Some(value) = value {
                params.push((key, value.clone()));
            }
        }
        if let Some(limit) = query.limit {
            params.push(("limit", limit.to_string()));
        }
        self.send(Method::GET, "v1/search", &params, None::<&()>)
            .await
    }

    /// `GET /v1/usage`: tokens and cost of the caller's projects, grouped.
    pub async fn usage(
        &self,
        query: &UsageParams,
    ) -> Result<tether_protocol::rest::UsageReport, Error> {
        self.send(Method::GET, "v1/usage", &query.pairs(), None::<&()>)
            .await
    }

    /// `GET /v1/usage?format=csv`: the same report as CSV.
    pub async fn usage_csv(&self, query: &UsageParams) -> Result<String, Error> {
        let mut pairs = query.pairs();
        pairs.push(("format", "csv".to_owned()));
        self.text(Method::GET, "v1/usage", &pairs).await
    }

    /// `GET /v1/agents`: the agents sessions can run.
    pub async fn agents(&self) -> Result<tether_protocol::rest::AgentList, Error> {
        self.send(Method::GET, "v1/agents", &[], None::<&()>).await
    }

    /// `POST /v1/sessions`: creates a session.
    pub async fn create_session(
        &self,
        request: &CreateSessionRequest,
    ) -> Result<SessionView, Error> {
        self.send(Method::POST, "v1/sessions", &[], Some(request))
            .await
    }

    /// `GET /v1/sessions/{id}`: a session's projection.
    pub async fn session(&self, id: &str) -> Result<SessionView, Error> {
        let path = format!("v1/sessions/{}", segment(id));
        self.send(Method::GET, &path, &[], None::<&()>).await
    }

    /// `DELETE /v1/sessions/{id}`: settles the session (closed or ended).
    pub async fn delete_session(&self, id: &str) -> Result<SessionView, Error> {
        let path = format!("v1/sessions/{}", segment(id));
        self.send(Method::DELETE, &path, &[], None::<&()>).await
    }

    /// `GET /v1/sessions/{id}/transcript`: envelopes after `after`, oldest first.
    pub async fn transcript(
        &self,
        id: &str,
        after: u64,
        limit: u32,
    ) -> Result<TranscriptPage, Error> {
        let params = [("after", after.to_string()), ("limit", limit.to_string())];
        let path = format!("v1/sessions/{}/transcript", segment(id));
        self.send(Method::GET, &path, &params, None::<&()>).await
    }

    /// `POST /v1/sessions/{id}/actions`: dispatches an action. Retrying with
    /// the same `clientId` and `clientSeq` is safe: it answers the original
    /// outcome and applies nothing again.
    pub async fn dispatch(
        &self,
        id: &str,
        request: &DispatchRequest,
    ) -> Result<DispatchResponse, Error> {
        let path = format!("v1/sessions/{}/actions", segment(id));
        self.send(Method::POST, &path, &[], Some(request)).await
    }

    /// `POST /v1/sessions/{id}/resume` with an ACP `ResumeSessionRequest`
    /// (as JSON); answers the ACP `ResumeSessionResponse`.
    pub async fn resume(
        &self,
        id: &str,
        request: &serde_json::Value,
    ) -> Result<serde_json::Value, Error> {
        let path = format!("v1/sessions/{}/resume", segment(id));
        self.send(Method::POST, &path, &[], Some(request)).await
    }

    /// `GET /v1/sessions/{id}/tool-context`.
    pub async fn tool_context(&self, id: &str) -> Result<ToolCallContext, Error> {
        let path = format!("v1/sessions/{}/tool-context", segment(id));
        self.send(Method::GET, &path, &[], None::<&()>).await
    }

    /// `GET /v1/projects/{project}/sessions/{session}/working-context`.
    pub async fn working_context(
        &self,
        project: &str,
        session: &str,
    ) -> Result<LoadedWorkingContext, Error> {
        let path = context_path(project, session);
        self.send(Method::GET, &path, &[], None::<&()>).await
    }

    /// `PUT /v1/projects/{project}/sessions/{session}/working-context`.
    pub async fn save_working_context(
        &self,
        project: &str,
        session: &str,
        context: &WorkingContext,
    ) -> Result<SavedWorkingContext, Error> {
        let path = context_path(project, session);
        self.send(Method::PUT, &path, &[], Some(context)).await
    }

    /// `GET /v1/projects/{project}/working-contexts`: the first page (the
    /// 100 most recently saved); [`Client::working_contexts_after`] reads
    /// on from its `next_cursor`.
    pub async fn working_contexts(&self, project: &str) -> Result<WorkingContextList, Error> {
        self.working_contexts_after(project, None).await
    }

    /// The page of a project's working contexts after `cursor` (a page's
    /// `next_cursor`; `None` for the first).
    pub async fn working_contexts_after(
        &self,
        project: &str,
        cursor: Option<&str>,
    ) -> Result<WorkingContextList, Error> {
        let path = format!("v1/projects/{}/working-contexts", segment(project));
        let query: Vec<(&str, String)> = cursor
            .map(|c| ("cursor", c.to_owned()))
            .into_iter()
            .collect();
        self.send(Method::GET, &path, &query, None::<&()>).await
    }

    /// `GET /v1/sessions/{id}/export`: the whole transcript as JSON Lines
    /// (every envelope) or Markdown (the conversation as a person reads it).
    pub async fn export(&self, id: &str, format: ExportFormat) -> Result<String, Error> {
        let path = format!("v1/sessions/{}/export", segment(id));
        let query = [("format", format.as_str().to_owned())];
        self.text(Method::GET, &path, &query).await
    }

    /// A request whose successful answer is text (not JSON).
    async fn text(
        &self,
        method: Method,
        path: &str,
        query: &[(&str, String)],
    ) -> Result<String, Error> {
        let response = self
            .request(method, path, query, None::<&()>)?
            .send()
            .await
            .map_err(Error::Unreachable)?;
        let status = response.status();
        let bytes = response.bytes().await.map_err(Error::Unreachable)?;
        if !status.is_success() {
            return Err(refusal(status, &bytes));
        }
        String::from_utf8(bytes.to_vec()).map_err(|e| Error::Decode {
            status: status.as_u16(),
            reason: e.to_string(),
        })
    }

    async fn get<T: DeserializeOwned>(&self, path: &str) -> Result<T, Error> {
        self.send(Method::GET, path, &[], None::<&()>).await
    }

    async fn send<T: DeserializeOwned, B: Serialize + ?Sized>(
        &self,
        method: Method,
        path: &str,
        query: &[(&str, String)],
        body: Option<&B>,
    ) -> Result<T, Error> {
        let request = self.request(method, path, query, body)?;
        let response = request.send().await.map_err(Error::Unreachable)?;
        decode(response).await
    }

    /// A request to `path` with the query, the bearer token and the body.
    fn request<B: Serialize + ?Sized>(
        &self,
        method: Method,
        path: &str,
        query: &[(&str, String)],
        body: Option<&B>,
    ) -> Result<reqwest::RequestBuilder, Error> {
        let url = self.base.join(path).map_err(|e| Error::InvalidUrl {
            url: path.to_owned(),
            reason: e.to_string(),
        })?;
        let mut request = self.http.request(method, url).query(query);
        if let Some(tokens) = &self.tokens {
            let token = tokens.token().map_err(Error::Token)?;
            request = request.bearer_auth(token.value);
        }
        if let Some(body) = body {
            request = request.json(body);
        }
        Ok(request)
    }
}

/// What [`Client::export`] gives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExportFormat {
    /// JSON Lines: one AHP `ActionEnvelope` per line, oldest first.
    Jsonl,
    /// Markdown: the conversation as a person reads it.
    Markdown,
}

impl ExportFormat {
    /// The `format` query value.
    pub fn as_str(self) -> &'static str {
        match self {
            ExportFormat::Jsonl => "jsonl",
            ExportFormat::Markdown => "markdown",
        }
    }
}

/// Filters and paging of [`Client::sessions`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SessionQuery {
    /// Only this project's sessions.
    pub project: Option<String>,
    /// Only sessions in this state (`live`, `dormant`, `closed`, `ended`).
    pub state: Option<String>,
    /// Page size, 1 to 1000.
    pub limit: Option<u32>,
    /// The previous page's `nextCursor`.
    pub cursor: Option<String>,
}

/// What [`Client::search`] looks for, and where.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SearchQuery {
    /// Words (all must match), `"quoted phrases"`, `prefix*`.
    pub q: String,
    /// Only this project's sessions.
    pub project: Option<String>,
    /// Only sessions of this agent.
    pub agent: Option<String>,
    /// Only sessions in this state.
    pub state: Option<String>,
    /// Only what was written at or after this time (RFC 3339).
    pub since: Option<String>,
    /// Only what was written before this time (RFC 3339).
    pub until: Option<String>,
    /// Hits per page, 1 to 100.
    pub limit: Option<u32>,
    /// The previous page's `nextCursor`.
    pub cursor: Option<String>,
}

/// The range, filters and grouping of [`Client::usage`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct UsageParams {
    /// Only usage reported at or after this time (RFC 3339).
    pub since: Option<String>,
    /// Only usage reported before this time (RFC 3339).
    pub until: Option<String>,
    /// Only this project.
    pub project: Option<String>,
    /// Only this agent.
    pub agent: Option<String>,
    /// Group by these, comma-separated: `project`, `principal`, `agent`,
    /// `model` (the server's default: `project`).
    pub by: Option<String>,
}

impl UsageParams {
    fn pairs(&self) -> Vec<(&'static str, String)> {
        [
            ("since", &self.since),
            ("until", &self.until),
            ("project", &self.project),
            ("agent", &self.agent),
            ("by", &self.by),
        ]
        .into_iter()
        .filter_map(|(k, v)| v.clone().map(|v| (k, v)))
        .collect()
    }
}

fn context_path(project: &str, session: &str) -> String {
    format!(
        "v1/projects/{}/sessions/{}/working-context",
        segment(project),
        segment(session)
    )
}

/// Percent-encodes one path segment (ids are validated by the server; this
/// keeps a bad one from changing the path).
fn segment(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    for byte in value.bytes() {
        if byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'.' | b'_' | b'~' | b':') {
            out.push(char::from(byte));
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}

async fn decode<T: DeserializeOwned>(response: reqwest::Response) -> Result<T, Error> {
    let status = response.status();
    let bytes = response.bytes().await.map_err(Error::Unreachable)?;
    if status.is_success() {
        return serde_json::from_slice(&bytes).map_err(|e| Error::Decode {
            status: status.as_u16(),
            reason: e.to_string(),
        });
    }
    Err(refusal(status, &bytes))
}

/// An error answer as an [`Error`]: its problem document, or its text.
fn refusal(status: StatusCode, bytes: &[u8]) -> Error {
    match serde_json::from_slice::<Problem>(bytes) {
        Ok(problem) => Error::Api {
            status: problem.status,
            code: problem.code,
            detail: problem.detail,
        },
        Err(_) => Error::Api {
            status: status.as_u16(),
            code: code_for(status).to_owned(),
            detail: Some(String::from_utf8_lossy(bytes).into_owned()),
        },
    }
}

/// A code for error answers that carried no problem document.
fn code_for(status: StatusCode) -> &'static str {
    match status {
        StatusCode::PAYLOAD_TOO_LARGE => "payload_too_large",
        StatusCode::NOT_FOUND => "not_found",
        _ => "http_error",
    }
}
