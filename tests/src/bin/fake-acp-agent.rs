//! A scripted ACP agent for Tether's tests, built on the ACP SDK's agent
//! side. What it does is chosen per test:
//!
//! * `FAKE_ACP_CAPS` (comma-separated): `load`, `resume`, `dirs`, `mcp`,
//!   `close`, `title`, `image`, `fork` — the capabilities it reports at
//!   `initialize` (`mcp`: MCP over HTTP; `title`: `session/set_title`;
//!   `fork`: `session/fork`, the new session remembering what the source
//!   was told; with `refuse-fork` too, every fork is refused); `config`:
//!   its sessions offer modes (`ask`, `code`) and
//!   options `model` (`fast`, `smart`) and `thought` (`low`, `high`, and
//!   `deep` while the model is `smart`), changed with `session/set_mode` /
//!   `session/set_config_option` (a value `broken` is refused).
//! * `FAKE_ACP_LOG`: a file it appends each `session/set_*`,
//!   `session/close`, `session/fork`, `session/load` and `authenticate` it
//!   receives to, one line each.
//! * `FAKE_ACP_MODE`: `never-init` (reads, never answers), `garbage` (writes
//!   a line that is not JSON-RPC before anything else), `stubborn` (ignores
//!   SIGTERM and stays after stdin closes); default: normal.
//! * The prompt's text is the script: `stream N`, `think`, `tool`,
//!   `permission`, `crash`, `hang`, `garbage`, `title T`, `commands`,
//!   `plan`, `flood N`, `refuse`, `dirs`, `mcp-list`, `mcp NAME {json}` (the
//!   MCP servers it was given: list their tools, or call one and say the
//!   result), `env` (its environment), `cwd`, `read PATH`, `write PATH`,
//!   `settings` (its mode and options now), `switch MODE` (it changes its
//!   own mode), `usage` (a usage update with a cost), `spend` (its
//!   session's cost so far grown by 0.25 USD, reported), `ask` (a form
//!   elicitation: where to deploy, how many replicas, a note; it says the
//!   answer it got),
//!   `child-read PATH` (`cat` in a child process; each says `ok` or the
//!   error), `edit PATH TEXT` (it writes the file and reports a tool call
//!   with the diff), `fs-write PATH TEXT` / `fs-read PATH` (through the
//!   client's `fs/*`; it says the answer), `term [cwd=DIR] CMD ARGS` (in a
//!   host terminal: it says how it ended and the output), `history` (the
//!   session's id and the prompts it was given before, in order; a fork
//!   starts with its source's);
//!   anything else is echoed back.
//!
//! `session/load` replays one old exchange (which a host must not record
//! again); `session/resume` refuses a directory whose path contains
//! `refuse`.

use std::collections::HashMap;
use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use agent_client_protocol::v1::ConnectionTo;
use agent_client_protocol::v1::schema::{
    AuthenticateRequest, AuthenticateResponse, CancelNotification, CloseSessionRequest,
    CloseSessionResponse, CreateElicitationRequest, ForkSessionRequest, ForkSessionResponse,
    LoadSessionRequest, LoadSessionResponse, NewSessionRequest, NewSessionResponse, PromptRequest,
    PromptResponse, ReadTextFileRequest, RequestPermissionOutcome, RequestPermissionRequest,
    ResumeSessionRequest, ResumeSessionResponse, SessionNotification, SessionUpdate,
    SetSessionConfigOptionRequest, SetSessionConfigOptionResponse, SetSessionModeRequest,
    SetSessionModeResponse, StopReason, WriteTextFileRequest,
};
use agent_client_protocol::v1::schema::{
    CreateTerminalRequest, ReleaseTerminalRequest, TerminalOutputRequest,
    WaitForTerminalExitRequest,
};
use agent_client_protocol::{Agent, ByteStreams, Client, Error};
use serde_json::{Value, json};
use tokio::sync::Notify;
use tokio_util::compat::{TokioAsyncReadCompatExt, TokioAsyncWriteCompatExt};

/// A session's settings (with `FAKE_ACP_CAPS=config`).
#[derive(Clone)]
struct Settings {
    mode: String,
    model: String,
    thought: String,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            mode: "ask".into(),
            model: "fast".into(),
            thought: "low".into(),
        }
    }
}

impl Settings {
    fn modes(&self) -> Value {
        json!({"currentModeId": self.mode, "availableModes": [
            {"id": "ask", "name": "Ask", "description": "Answers questions"},
            {"id": "code", "name": "Code", "description": "Writes code"}]})
    }

    fn options(&self) -> Value {
        let mut thoughts = vec![
            json!({"value": "low", "name": "Low"}),
            json!({"value": "high", "name": "High"}),
        ];
        if self.model == "smart" {
            thoughts.push(json!({"value": "deep", "name": "Deep"}));
        }
        json!([
            {"id": "model", "name": "Model", "category": "model", "type": "select",
             "currentValue": self.model, "options": [
                 {"value": "fast", "name": "Fast"}, {"value": "smart", "name": "Smart"}]},
            {"id": "thought", "name": "Thinking", "category": "thought_level", "type": "select",
             "currentValue": self.thought, "options": thoughts},
        ])
    }

    fn describe(&self) -> String {
        format!(
            "mode={} model={} thought={}",
            self.mode, self.model, self.thought
        )
    }
}

/// Appends a line to `FAKE_ACP_LOG`, if set.
fn log_line(line: &str) {
    if let Ok(path) = std::env::var("FAKE_ACP_LOG")
        && let Ok(mut file) = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
    {
        let _ = writeln!(file, "{line}");
    }
}

#[derive(Default)]
struct State {
    /// The content blocks of each session's latest prompt, as JSON.
    blocks: HashMap<String, Vec<Value>>,
    /// Settings per session.
    settings: HashMap<String, Settings>,
    /// Additional directories per session, as last opened or resumed.
    dirs: HashMap<String, Vec<String>>,
    cancels: HashMap<String, Arc<Notify>>,
    /// The HTTP MCP servers each session was opened with: `(url, token)`.
    mcp: HashMap<String, Vec<McpServer>>,
    /// The prompts each session was given, in order (a fork starts with
    /// its source's).
    history: HashMap<String, Vec<String>>,
    /// What each session spent so far (`spend`), in cents.
    spent: HashMap<String, u64>,
    next: u32,
}

type Shared = Arc<Mutex<State>>;

/// `initialize` as JSON: the fake answers it with JSON the schema's types
/// could not carry (login methods of kinds they do not know).
#[derive(Debug, Clone)]
struct RawInitialize(Value);

impl agent_client_protocol::JsonRpcMessage for RawInitialize {
    fn matches_method(method: &str) -> bool {
        method == "initialize"
    }

    fn method(&self) -> &str {
        "initialize"
    }

    fn to_untyped_message(&self) -> Result<agent_client_protocol::UntypedMessage, Error> {
        agent_client_protocol::UntypedMessage::new("initialize", &self.0)
    }

    fn parse_message(_method: &str, params: &Value) -> Result<Self, Error> {
        Ok(Self(params.clone()))
    }
}

impl agent_client_protocol::JsonRpcRequest for RawInitialize {
    type Response = Value;
}

/// `session/set_title`, which the schema Tether builds on keeps among its
/// unstable methods, as JSON.
#[derive(Debug, Clone)]
struct RawSetTitle(Value);

impl agent_client_protocol::JsonRpcMessage for RawSetTitle {
    fn matches_method(method: &str) -> bool {
        method == "session/set_title"
    }

    fn method(&self) -> &str {
        "session/set_title"
    }

    fn to_untyped_message(&self) -> Result<agent_client_protocol::UntypedMessage, Error> {
        agent_client_protocol::UntypedMessage::new("session/set_title", &self.0)
    }

    fn parse_message(_method: &str, params: &Value) -> Result<Self, Error> {
        Ok(Self(params.clone()))
    }
}

impl agent_client_protocol::JsonRpcRequest for RawSetTitle {
    type Response = Value;
}

fn update(session: &str, update: Value) -> SessionNotification {
    let update: SessionUpdate = serde_json::from_value(update).expect("a valid session update");
    SessionNotification::new(session.to_owned(), update)
}

fn chunk(session: &str, kind: &str, text: &str) -> SessionNotification {
    update(
        session,
        json!({"sessionUpdate": kind, "content": {"type": "text", "text": text}}),
    )
}

/// An MCP server a session was given.
#[derive(Debug, Clone)]
enum McpServer {
    /// Streamable HTTP: its URL and bearer token.
    Http(String, String),
    /// Stdio: the program, its arguments and environment.
    Stdio(String, Vec<String>, Vec<(String, String)>),
}

/// The MCP servers of a session, HTTP and stdio, in the order given.
fn mcp_servers(servers: &[agent_client_protocol::v1::schema::McpServer]) -> Vec<McpServer> {
    servers
        .iter()
        .filter_map(|server| {
            let value = serde_json::to_value(server).ok()?;
            if let Some(command) = value.get("command").and_then(Value::as_str) {
                let args = value["args"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(|a| a.as_str().map(str::to_owned))
                    .collect();
                let env = value["env"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(|v| {
                        Some((
                            v["name"].as_str()?.to_owned(),
                            v["value"].as_str()?.to_owned(),
                        ))
                    })
                    .collect();
                return Some(McpServer::Stdio(command.to_owned(), args, env));
            }
            let url = value.get("url")?.as_str()?.to_owned();
            let token = value["headers"]
                .as_array()?
                .iter()
                .find(|h| h["name"] == "Authorization")
                .and_then(|h| h["value"].as_str())
                .and_then(|v| v.strip_prefix("Bearer "))
                .unwrap_or_default()
                .to_owned();
            Some(McpServer::Http(url, token))
        })
        .collect()
}

/// Lists the tools of the session's first MCP server, or calls one: the
/// text to say.
async fn use_mcp(server: Option<McpServer>, call: Option<(&str, Value)>) -> String {
    use rmcp::ServiceExt;
    use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
    use rmcp::transport::{StreamableHttpClientTransport, TokioChildProcess};
    let connected = match server {
        None => return "no MCP server".to_owned(),
        Some(McpServer::Http(url, token)) => {
            let config = StreamableHttpClientTransportConfig::with_uri(url).auth_header(token);
            ().serve(StreamableHttpClientTransport::from_config(config))
                .await
        }
        Some(McpServer::Stdio(program, args, env)) => {
            let mut command = tokio::process::Command::new(program);
            command.args(args).envs(env);
            match TokioChildProcess::new(command) {
                Ok(transport) => ().serve(transport).await,
                Err(err) => return format!("MCP bridge did not start: {err}"),
            }
        }
    };
    let client = match connected {
        Ok(client) => client,
        Err(err) => return format!("MCP connect failed: {err}"),
    };
    let said = match call {
        None => match client.list_all_tools().await {
            Ok(tools) => {
                let names: Vec<&str> = tools.iter().map(|t| t.name.as_ref()).collect();
                format!("tools: {}", names.join(","))
            }
            Err(err) => format!("MCP list failed: {err}"),
        },
        Some((name, arguments)) => {
            let mut params = rmcp::model::CallToolRequestParams::new(name.to_owned());
            if let Value::Object(arguments) = arguments {
                params = params.with_arguments(arguments);
            }
            match client.call_tool(params).await {
                Ok(result) => {
                    let text: Vec<String> = result
                        .content
                        .iter()
                        .filter_map(|c| serde_json::to_value(c).ok())
                        .filter_map(|c| c["text"].as_str().map(str::to_owned))
                        .collect();
                    let error = if result.is_error == Some(true) {
                        "error: "
                    } else {
                        ""
                    };
                    format!("{error}{}", text.join(" "))
                }
                Err(err) => format!("MCP call failed: {err}"),
            }
        }
    };
    let _ = client.cancel().await;
    said
}

fn dirs_of(paths: &[std::path::PathBuf]) -> Vec<String> {
    paths.iter().map(|p| p.display().to_string()).collect()
}

fn cancel_of(state: &Shared, session: &str) -> Arc<Notify> {
    let mut state = state.lock().expect("state");
    state
        .cancels
        .entry(session.to_owned())
        .or_insert_with(|| Arc::new(Notify::new()))
        .clone()
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Error> {
    let caps = std::env::var("FAKE_ACP_CAPS").unwrap_or_default();
    let caps: Vec<String> = caps.split(',').map(str::to_owned).collect();
    let mode = std::env::var("FAKE_ACP_MODE").unwrap_or_default();
    if mode == "garbage" {
        println!("Starting fake agent v1.0 ...");
    }
    if mode == "never-init" {
        // Reads its input and never answers.
        let mut sink = tokio::io::sink();
        let _ = tokio::io::copy(&mut tokio::io::stdin(), &mut sink).await;
        return Ok(());
    }
    let stubborn = mode == "stubborn";
    let _term = if stubborn {
        // A handler replaces SIGTERM's default action: it no longer stops us.
        tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).ok()
    } else {
        None
    };
    let state: Shared = Shared::default();
    // FAKE_ACP_AUTH=VAR: it offers an env_var login on VAR (and a browser
    // one), and opens no session until `authenticate` named the env_var
    // one while VAR is set.
    let login_var = std::env::var("FAKE_ACP_AUTH").ok();
    let logged_in = Arc::new(std::sync::atomic::AtomicBool::new(login_var.is_none()));
    let (l1, l2, l3, l4) = (
        logged_in.clone(),
        logged_in.clone(),
        logged_in.clone(),
        login_var.clone(),
    );
    let configurable = std::env::var("FAKE_ACP_CAPS")
        .unwrap_or_default()
        .split(',')
        .any(|c| c == "config");
    // `refuse-fork`: it advertises `session/fork` (with `fork`) and refuses
    // every one.
    let refuses_forks = caps.iter().any(|c| c == "refuse-fork");
    let transport = ByteStreams::new(
        tokio::io::stdout().compat_write(),
        tokio::io::stdin().compat(),
    );
    let (s1, s2, s3, s4, s5) = (
        state.clone(),
        state.clone(),
        state.clone(),
        state.clone(),
        state.clone(),
    );
    let (s6, s7, s8) = (state.clone(), state.clone(), state.clone());
    Agent
        .v1()
        .name("fake-acp-agent")
        .on_receive_request(
            async move |request: RawInitialize, responder, _cx| {
                let mut session = json!({});
                if caps.iter().any(|c| c == "resume") {
                    session["resume"] = json!({});
                }
                if caps.iter().any(|c| c == "dirs") {
                    session["additionalDirectories"] = json!({});
                }
                if caps.iter().any(|c| c == "close") {
                    session["close"] = json!({});
                }
                if caps.iter().any(|c| c == "title") {
                    session["title"] = json!({});
                }
                if caps.iter().any(|c| c == "fork") {
                    session["fork"] = json!({});
                }
                let mcp_http = caps.iter().any(|c| c == "mcp");
                // Written as JSON, not through the schema's types: its login
                // methods are of a kind (`env_var`) the schema version does
                // not know, and must reach the client whole.
                let mut response = json!({
                    "protocolVersion": request.0.get("protocolVersion").cloned().unwrap_or(json!(1)),
                    "agentCapabilities": {
                        "loadSession": caps.iter().any(|c| c == "load"),
                        "sessionCapabilities": session,
                        "promptCapabilities": {"image": caps.iter().any(|c| c == "image"),
                                               "audio": false, "embeddedContext": true},
                        "mcpCapabilities": {"http": mcp_http, "sse": false},
                    },
                    "agentInfo": {"name": "fake-acp-agent", "title": "Fake agent", "version": "1.0"},
                });
                if let Some(var) = &login_var {
                    response["authMethods"] = json!([
                        {"id": "fake-key", "name": "Fake API key", "type": "env_var",
                         "vars": [{"name": var}]},
                        {"id": "fake-browser", "name": "Browser login", "type": "agent"},
                    ]);
                }
                responder.respond(response)
            },
            agent_client_protocol::on_receive_request!(),
        )
        .on_receive_request(
            async move |request: NewSessionRequest, responder, _cx| {
                if !l1.load(std::sync::atomic::Ordering::SeqCst) {
                    return responder.respond_with_error(
                        Error::auth_required().data(json!("log in first: no API key")),
                    );
                }
                let id = {
                    let mut state = s1.lock().expect("state");
                    state.next += 1;
                    let id = format!("fake-{}-{}", std::process::id(), state.next);
                    state.dirs.insert(id.clone(), dirs_of(&request.additional_directories));
                    state.mcp.insert(id.clone(), mcp_servers(&request.mcp_servers));
                    state.settings.insert(id.clone(), Settings::default());
                    id
                };
                let mut response = json!({"sessionId": id});
                if configurable {
                    let settings = Settings::default();
                    response["modes"] = settings.modes();
                    response["configOptions"] = settings.options();
                }
                responder.respond(serde_json::from_value::<NewSessionResponse>(response).expect("a response"))
            },
            agent_client_protocol::on_receive_request!(),
        )
        .on_receive_request(
            async move |request: LoadSessionRequest, responder, cx: ConnectionTo<Client>| {
                if !l3.load(std::sync::atomic::Ordering::SeqCst) {
                    return responder.respond_with_error(Error::auth_required());
                }
                let id = request.session_id.to_string();
                log_line(&format!("load {id}"));
                s2.lock()
                    .expect("state")
                    .dirs
                    .insert(id.clone(), dirs_of(&request.additional_directories));
                cx.send_notification(chunk(&id, "user_message_chunk", "an old question"))?;
                cx.send_notification(chunk(&id, "agent_message_chunk", "replayed history"))?;
                responder.respond(LoadSessionResponse::new())
            },
            agent_client_protocol::on_receive_request!(),
        )
        .on_receive_request(
            async move |request: ResumeSessionRequest, responder, _cx| {
                let dirs = dirs_of(&request.additional_directories);
                if let Some(bad) = dirs.iter().find(|d| d.contains("refuse")) {
                    return responder.respond_with_error(Error::invalid_params().data(json!(format!(
                        "this agent cannot work in {bad}"
                    ))));
                }
                let mut state = s3.lock().expect("state");
                state.dirs.insert(request.session_id.to_string(), dirs);
                // As an agent that connects its MCP servers anew from each
                // open: what the resume names replaces what it had.
                state.mcp.insert(
                    request.session_id.to_string(),
                    mcp_servers(&request.mcp_servers),
                );
                drop(state);
                responder.respond(ResumeSessionResponse::new())
            },
            agent_client_protocol::on_receive_request!(),
        )
        .on_receive_request(
            async move |request: AuthenticateRequest, responder, _cx| {
                let method = request.method_id.to_string();
                log_line(&format!("authenticate {method}"));
                let key = l4
                    .as_ref()
                    .and_then(|var| std::env::var(var).ok())
                    .filter(|v| !v.is_empty());
                if method == "fake-key" && key.is_some() {
                    l2.store(true, std::sync::atomic::Ordering::SeqCst);
                    return responder.respond(AuthenticateResponse::new());
                }
                responder.respond_with_error(
                    Error::auth_required().data(json!(format!("cannot log in with {method}"))),
                )
            },
            agent_client_protocol::on_receive_request!(),
        )
        .on_receive_request(
            async move |request: SetSessionModeRequest, responder, _cx| {
                let mode = request.mode_id.to_string();
                log_line(&format!("set_mode {mode}"));
                // `FAKE_ACP_SLOW_MODES=MS`: takes that long to answer.
                if let Some(ms) = std::env::var("FAKE_ACP_SLOW_MODES")
                    .ok()
                    .and_then(|ms| ms.parse().ok())
                {
                    tokio::time::sleep(Duration::from_millis(ms)).await;
                }
                if mode == "broken" || !["ask", "code"].contains(&mode.as_str()) {
                    return responder.respond_with_error(
                        Error::invalid_params().data(json!(format!("no mode {mode}"))),
                    );
                }
                s6.lock()
                    .expect("state")
                    .settings
                    .entry(request.session_id.to_string())
                    .or_default()
                    .mode = mode;
                responder.respond(SetSessionModeResponse::new())
            },
            agent_client_protocol::on_receive_request!(),
        )
        .on_receive_request(
            async move |request: SetSessionConfigOptionRequest, responder, _cx| {
                let id = request.config_id.to_string();
                let value = serde_json::to_value(&request.value).expect("a value");
                let value = value["value"].as_str().unwrap_or_default().to_owned();
                log_line(&format!("set_config_option {id} {value}"));
                let mut state = s7.lock().expect("state");
                let settings = state
                    .settings
                    .entry(request.session_id.to_string())
                    .or_default();
                match (id.as_str(), value.as_str()) {
                    (_, "broken") => {
                        return responder.respond_with_error(
                            Error::invalid_params().data(json!("that value is broken")),
                        );
                    }
                    ("model", "fast" | "smart") => {
                        settings.model = value.clone();
                        // A model without deep thinking cannot keep it.
                        if value == "fast" && settings.thought == "deep" {
                            settings.thought = "high".into();
                        }
                    }
                    ("thought", "low" | "high") => settings.thought = value,
                    ("thought", "deep") if settings.model == "smart" => settings.thought = value,
                    _ => {
                        return responder.respond_with_error(
                            Error::invalid_params().data(json!(format!("no {id} {value}"))),
                        );
                    }
                }
                let response = json!({"configOptions": settings.options()});
                responder.respond(
                    serde_json::from_value::<SetSessionConfigOptionResponse>(response)
                        .expect("a response"),
                )
            },
            agent_client_protocol::on_receive_request!(),
        )
        .on_receive_request(
            async move |request: RawSetTitle, responder, _cx| {
                log_line(&format!("set_title {}", request.0["title"].as_str().unwrap_or("?")));
                responder.respond(json!({}))
            },
            agent_client_protocol::on_receive_request!(),
        )
        .on_receive_request(
            async move |request: ForkSessionRequest, responder, _cx| {
                let source = request.session_id.to_string();
                log_line(&format!("fork {source}"));
                if refuses_forks {
                    return responder.respond_with_error(
                        Error::invalid_params().data(json!("this agent forks nothing today")),
                    );
                }
                let mut state = s8.lock().expect("state");
                if !state.settings.contains_key(&source) {
                    return responder.respond_with_error(
                        Error::invalid_params().data(json!(format!("no session {source} to fork"))),
                    );
                }
                state.next += 1;
                let id = format!("fake-{}-{}", std::process::id(), state.next);
                let history = state.history.get(&source).cloned().unwrap_or_default();
                let settings = state.settings.get(&source).cloned().unwrap_or_default();
                state.history.insert(id.clone(), history);
                state.dirs.insert(id.clone(), dirs_of(&request.additional_directories));
                state.mcp.insert(id.clone(), mcp_servers(&request.mcp_servers));
                let mut response = json!({"sessionId": id});
                if configurable {
                    response["modes"] = settings.modes();
                    response["configOptions"] = settings.options();
                }
                state.settings.insert(id, settings);
                responder.respond(serde_json::from_value::<ForkSessionResponse>(response).expect("a response"))
            },
            agent_client_protocol::on_receive_request!(),
        )
        .on_receive_request(
            async move |request: CloseSessionRequest, responder, _cx| {
                log_line(&format!("close {}", request.session_id));
                responder.respond(CloseSessionResponse::new())
            },
            agent_client_protocol::on_receive_request!(),
        )
        .on_receive_notification(
            async move |notification: CancelNotification, _cx| {
                cancel_of(&s4, &notification.session_id.to_string()).notify_waiters();
                Ok(())
            },
            agent_client_protocol::on_receive_notification!(),
        )
        .on_receive_request(
            async move |request: PromptRequest, responder, cx: ConnectionTo<Client>| {
                let state = s5.clone();
                let session = request.session_id.to_string();
                let blocks: Vec<Value> = request
                    .prompt
                    .iter()
                    .filter_map(|block| serde_json::to_value(block).ok())
                    .collect();
                let text = request
                    .prompt
                    .iter()
                    .filter_map(|block| serde_json::to_value(block).ok())
                    .filter_map(|b| b.get("text").and_then(Value::as_str).map(str::to_owned))
                    .collect::<Vec<_>>()
                    .join(" ");
                {
                    let mut state = state.lock().expect("state");
                    state.blocks.insert(session.clone(), blocks);
                    let history = state.history.entry(session.clone()).or_default();
                    if text == "history" {
                        let told = if history.is_empty() { "nothing".to_owned() } else { history.join(" | ") };
                        history.push(text.clone());
                        drop(state);
                        let said = format!("{session} was told: {told}");
                        cx.send_notification(chunk(&session, "agent_message_chunk", &said))?;
                        return responder.respond(PromptResponse::new(StopReason::EndTurn));
                    }
                    history.push(text.clone());
                }
                let cancel = cancel_of(&state, &session);
                let worker = cx.clone();
                cx.spawn(async move {
                    let stop = run(&worker, &state, &session, &text, &cancel).await?;
                    let mut response = PromptResponse::new(stop);
                    if text == "usage" {
                        // The turn's own tokens, at its end.
                        let mut usage = agent_client_protocol::v1::schema::Usage::new(1500, 1000, 500);
                        usage.cached_read_tokens = Some(250);
                        usage.thought_tokens = Some(40);
                        response = response.usage(usage);
                    }
                    responder.respond(response)
                })?;
                Ok(())
            },
            agent_client_protocol::on_receive_request!(),
        )
        .connect_to(transport)
        .await?;
    if stubborn {
        tokio::time::sleep(Duration::from_secs(3600)).await;
    }
    Ok(())
}

/// Plays one prompt's script.
async fn run(
    cx: &ConnectionTo<Client>,
    state: &Shared,
    session: &str,
    text: &str,
    cancel: &Notify,
) -> Result<StopReason, Error> {
    let mut words = text.split_whitespace();
    let command = words.next().unwrap_or_default();
    let rest: Vec<&str> = words.collect();
    let count = rest
        .first()
        .and_then(|n| n.parse::<usize>().ok())
        .unwrap_or(3);
    let say = |text: &str| cx.send_notification(chunk(session, "agent_message_chunk", text));
    match command {
        "stream" => {
            for i in 0..count {
                say(&format!("chunk{i} "))?;
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }
        "split" => {
            // The rest of the message, three characters a chunk: words
            // cut across deltas.
            let said: Vec<char> = rest.join(" ").chars().collect();
            for piece in said.chunks(3) {
                say(&piece.iter().collect::<String>())?;
            }
        }
        "chatter" => {
            // Streams a word every 2 ms until the turn is cancelled (a
            // minute at most).
            let cancelled = cancel.notified();
            tokio::pin!(cancelled);
            for _ in 0..30_000 {
                say("word ")?;
                tokio::select! {
                    () = tokio::time::sleep(Duration::from_millis(2)) => {}
                    () = &mut cancelled => return Ok(StopReason::Cancelled),
                }
            }
        }
        "flood" => {
            for i in 0..count {
                say(&format!("{i} "))?;
            }
        }
        "think" => {
            cx.send_notification(chunk(session, "agent_thought_chunk", "pondering"))?;
            say("decided")?;
        }
        "tool" => {
            cx.send_notification(update(session, json!({"sessionUpdate": "tool_call", "toolCallId": "read-1",
                "title": "Reading notes.txt", "kind": "read", "status": "pending", "rawInput": {"path": "notes.txt"}})))?;
            cx.send_notification(update(
                session,
                json!({"sessionUpdate": "tool_call_update", "toolCallId": "read-1",
                "status": "in_progress"}),
            ))?;
            cx.send_notification(update(session, json!({"sessionUpdate": "tool_call_update", "toolCallId": "read-1",
                "status": "completed", "content": [{"type": "content", "content": {"type": "text", "text": "the notes"}}]})))?;
            say("read it")?;
        }
        "permission" => {
            cx.send_notification(update(
                session,
                json!({"sessionUpdate": "tool_call", "toolCallId": "edit-1",
                "title": "Editing config.json", "kind": "edit", "status": "pending"}),
            ))?;
            let request: RequestPermissionRequest = serde_json::from_value(json!({
                "sessionId": session,
                "toolCall": {"toolCallId": "edit-1", "title": "Editing config.json", "kind": "edit",
                    // What it will do, for the person to see first.
                    "content": [{"type": "diff", "path": "/project/config.json",
                                 "oldText": "{\"debug\": false}\n", "newText": "{\"debug\": true}\n"}]},
                "options": [{"optionId": "allow", "name": "Allow once", "kind": "allow_once"},
                            {"optionId": "reject", "name": "Reject", "kind": "reject_once"}],
            }))
            .expect("a permission request");
            let answer = tokio::select! {
                answer = cx.send_request(request).block_task() => answer?,
                () = cancel.notified() => return Ok(StopReason::Cancelled),
            };
            match answer.outcome {
                RequestPermissionOutcome::Selected(selected)
                    if selected.option_id.to_string() == "allow" =>
                {
                    cx.send_notification(update(
                        session,
                        json!({"sessionUpdate": "tool_call_update",
                        "toolCallId": "edit-1", "status": "completed"}),
                    ))?;
                    say("edited")?;
                }
                RequestPermissionOutcome::Selected(_) => {
                    cx.send_notification(update(
                        session,
                        json!({"sessionUpdate": "tool_call_update",
                        "toolCallId": "edit-1", "status": "failed"}),
                    ))?;
                    say("not edited")?;
                }
                _ => return Ok(StopReason::Cancelled),
            }
        }
        "crash" => {
            say("about to crash")?;
            tokio::time::sleep(Duration::from_millis(100)).await;
            std::process::exit(3);
        }
        "hang" => {
            say("working")?;
            cancel.notified().await;
            return Ok(StopReason::Cancelled);
        }
        "garbage" => {
            let mut out = std::io::stdout();
            let _ = out.write_all(b"this is not json\n");
            let _ = out.flush();
            tokio::time::sleep(Duration::from_secs(5)).await;
        }
        "title" => {
            cx.send_notification(update(
                session,
                json!({"sessionUpdate": "session_info_update", "title": rest.join(" ")}),
            ))?;
        }
        "commands" => {
            cx.send_notification(update(session, json!({"sessionUpdate": "available_commands_update",
                "availableCommands": [{"name": "test", "description": "Run the tests", "input": {"hint": "filter"}}]})))?;
        }
        "plan" => {
            cx.send_notification(update(
                session,
                json!({"sessionUpdate": "plan", "entries": [
                {"content": "look", "priority": "high", "status": "completed"},
                {"content": "fix", "priority": "medium", "status": "pending"}]}),
            ))?;
        }
        "refuse" => return Ok(StopReason::Refusal),
        "mcp-list" | "mcp" => {
            let server = state
                .lock()
                .expect("state")
                .mcp
                .get(session)
                .and_then(|s| s.first().cloned());
            let call = (command == "mcp").then(|| {
                let name = rest.first().copied().unwrap_or_default();
                let args = rest.get(1..).map(|r| r.join(" ")).unwrap_or_default();
                (name, serde_json::from_str(&args).unwrap_or(Value::Null))
            });
            let said = use_mcp(server, call).await;
            say(&said)?;
        }
        "dirs" => {
            let dirs = state
                .lock()
                .expect("state")
                .dirs
                .get(session)
                .cloned()
                .unwrap_or_default();
            say(&format!("dirs: {}", dirs.join(",")))?;
        }
        "ask" => {
            let request: CreateElicitationRequest = serde_json::from_value(json!({
                "mode": "form", "sessionId": session, "message": "Where should this deploy?",
                "requestedSchema": {"type": "object", "required": ["env"], "properties": {
                    "env": {"type": "string", "title": "Environment", "enum": ["staging", "prod"]},
                    "replicas": {"type": "integer", "minimum": 1, "maximum": 9},
                    "note": {"type": "string", "description": "Anything else?"}}}}))
            .expect("an elicitation");
            let answer = cx.send_request(request).block_task().await;
            let said = match answer {
                Ok(response) => {
                    let response = serde_json::to_value(&response).expect("JSON");
                    let mut content: Vec<String> = response["content"]
                        .as_object()
                        .into_iter()
                        .flatten()
                        .map(|(k, v)| format!("{k}={v}"))
                        .collect();
                    content.sort();
                    format!(
                        "answered: {} {}",
                        response["action"].as_str().unwrap_or("?"),
                        content.join(" ")
                    )
                }
                Err(err) => format!("the question failed: {err}"),
            };
            say(said.trim_end())?;
        }
        "login-url" => {
            // A URL question the person answers at the URL: the agent says
            // it is done (`elicitation/complete`) 300 ms later, unanswered
            // by any client.
            let request: CreateElicitationRequest = serde_json::from_value(json!({
                "mode": "url", "sessionId": session, "elicitationId": "elic-1",
                "url": "https://login.example/device", "message": "Log in to continue"}))
            .expect("a URL elicitation");
            let done = async {
                tokio::time::sleep(Duration::from_millis(300)).await;
                cx.send_notification(
                    agent_client_protocol::v1::schema::CompleteElicitationNotification::new(
                        "elic-1",
                    ),
                )
            };
            let (answer, sent) = tokio::join!(cx.send_request(request).block_task(), done);
            sent?;
            let said = match answer {
                Ok(response) => format!(
                    "url: {}",
                    serde_json::to_value(&response).expect("JSON")["action"]
                        .as_str()
                        .unwrap_or("?")
                ),
                Err(err) => format!("the question failed: {err}"),
            };
            say(&said)?;
        }
        "picture" => {
            // An image and an embedded file of its own, in its answer.
            cx.send_notification(update(
                session,
                json!({"sessionUpdate": "agent_message_chunk", "content": {
                    "type": "image", "mimeType": "image/png", "data": "iVBORw0KGgo="}}),
            ))?;
            cx.send_notification(update(
                session,
                json!({"sessionUpdate": "agent_message_chunk", "content": {
                    "type": "resource", "resource": {"uri": "file:///notes.md", "mimeType": "text/markdown",
                    "text": "# Notes\nfrom the agent"}}}),
            ))?;
            say("here they are")?;
        }
        "screenshot" => {
            // A tool whose result is an image (a browser's screenshot).
            cx.send_notification(update(
                session,
                json!({"sessionUpdate": "tool_call", "toolCallId": "shot-1",
                       "title": "Screenshot", "kind": "fetch", "status": "in_progress"}),
            ))?;
            cx.send_notification(update(
                session,
                json!({"sessionUpdate": "tool_call_update", "toolCallId": "shot-1",
                       "status": "completed", "content": [
                           {"type": "content", "content": {"type": "text", "text": "the page"}},
                           {"type": "content", "content": {"type": "image",
                               "mimeType": "image/png", "data": "iVBORw0KGgo="}}]}),
            ))?;
            say("took it")?;
        }
        "blocks" => {
            // What the latest prompt carried, block by block.
            let blocks = state
                .lock()
                .expect("state")
                .blocks
                .get(session)
                .cloned()
                .unwrap_or_default();
            let described: Vec<String> = blocks
                .iter()
                .map(|b| match b["type"].as_str().unwrap_or("?") {
                    "text" => format!("text {:?}", b["text"].as_str().unwrap_or_default()),
                    "image" => format!(
                        "image {} {} bytes",
                        b["mimeType"].as_str().unwrap_or("?"),
                        b["data"].as_str().map_or(0, |d| {
                            use base64::Engine as _;
                            base64::engine::general_purpose::STANDARD
                                .decode(d)
                                .map_or(0, |bytes| bytes.len())
                        })
                    ),
                    "resource" => format!(
                        "resource {} {:?}",
                        b["resource"]["mimeType"].as_str().unwrap_or("?"),
                        b["resource"]["text"].as_str().unwrap_or("(binary)")
                    ),
                    "resource_link" => format!("link {}", b["uri"].as_str().unwrap_or("?")),
                    other => other.to_owned(),
                })
                .collect();
            say(&described.join("; "))?;
        }
        "settings" => {
            let settings = state
                .lock()
                .expect("state")
                .settings
                .get(session)
                .cloned()
                .unwrap_or_default();
            say(&settings.describe())?;
        }
        "switch" => {
            let mode = rest.first().copied().unwrap_or("code").to_owned();
            state
                .lock()
                .expect("state")
                .settings
                .entry(session.to_owned())
                .or_default()
                .mode = mode.clone();
            cx.send_notification(update(
                session,
                json!({"sessionUpdate": "current_mode_update", "currentModeId": mode}),
            ))?;
            say(&format!("switched to {mode}"))?;
        }
        "usage" => {
            // The session's cost so far; the turn's tokens come with its end.
            cx.send_notification(update(
                session,
                json!({"sessionUpdate": "usage_update", "used": 1200, "size": 200000,
                       "cost": {"amount": 0.042, "currency": "USD"}}),
            ))?;
            say("counted")?;
        }
        "spend" => {
            // A quarter more than this session spent before, reported as
            // ACP does: the session's cost so far.
            let spent = {
                let mut state = state.lock().expect("state");
                let spent = state.spent.entry(session.to_owned()).or_default();
                *spent += 25;
                *spent
            };
            cx.send_notification(update(
                session,
                json!({"sessionUpdate": "usage_update", "used": 1200, "size": 200000,
                       "cost": {"amount": spent as f64 / 100.0, "currency": "USD"}}),
            ))?;
            say(&format!("spent {spent}"))?;
        }
        "env" => {
            let mut vars: Vec<String> = std::env::vars().map(|(k, v)| format!("{k}={v}")).collect();
            vars.sort();
            say(&vars.join("\n"))?;
        }
        "server-args" => {
            // What any process can read of the server's (its parent's)
            // command line.
            let path = format!("/proc/{}/cmdline", std::os::unix::process::parent_id());
            say(&match std::fs::read(&path) {
                Ok(bytes) => format!(
                    "server-args: {}",
                    String::from_utf8_lossy(&bytes).replace('\0', " ")
                ),
                Err(e) => format!("server-args: error {:?} {e}", e.kind()),
            })?;
        }
        "cwd" => {
            let cwd = std::env::current_dir().map(|d| d.display().to_string());
            say(&format!("cwd: {}", cwd.unwrap_or_else(|e| e.to_string())))?;
        }
        "read" => {
            let path = rest.first().copied().unwrap_or_default();
            let answer = match std::fs::metadata(path) {
                Ok(meta) if meta.is_dir() => std::fs::read_dir(path).map(|d| d.count()),
                _ => std::fs::read(path).map(|b| b.len()),
            };
            say(&match answer {
                Ok(n) => format!("read {path}: ok {n}"),
                Err(e) => format!("read {path}: error {:?} {e}", e.kind()),
            })?;
        }
        "write" => {
            let path = rest.first().copied().unwrap_or_default();
            say(&match std::fs::write(path, b"written by the agent") {
                Ok(()) => format!("write {path}: ok"),
                Err(e) => format!("write {path}: error {:?} {e}", e.kind()),
            })?;
        }
        "edit" => {
            // Edits a file itself and reports it as a tool call's diff:
            // `edit PATH TEXT...` (the text's `\n` are line breaks).
            let path = rest.first().copied().unwrap_or_default();
            let new = rest
                .get(1..)
                .map(|r| r.join(" "))
                .unwrap_or_default()
                .replace("\\n", "\n");
            let old = std::fs::read_to_string(path).ok();
            if let Err(e) = std::fs::write(path, &new) {
                say(&format!("edit {path}: error {e}"))?;
                return Ok(StopReason::EndTurn);
            }
            let id = format!("edit-{}", path.len() + new.len());
            cx.send_notification(update(
                session,
                json!({"sessionUpdate": "tool_call", "toolCallId": id, "title": format!("Edit {path}"),
                       "kind": "edit", "status": "in_progress"}),
            ))?;
            cx.send_notification(update(
                session,
                json!({"sessionUpdate": "tool_call_update", "toolCallId": id, "status": "completed",
                       "content": [{"type": "diff", "path": path, "oldText": old, "newText": new}]}),
            ))?;
            say("edited")?;
        }
        "fs-write" | "fs-read" => {
            // Through the client's file system: `fs-write PATH TEXT...`,
            // `fs-read PATH`; says what the client answered.
            let path = rest.first().copied().unwrap_or_default();
            let said = if command == "fs-write" {
                let content = rest.get(1..).map(|r| r.join(" ")).unwrap_or_default();
                let request: WriteTextFileRequest = serde_json::from_value(json!({
                    "sessionId": session, "path": path, "content": content}))
                .expect("a write request");
                match cx.send_request(request).block_task().await {
                    Ok(_) => format!("fs-write {path}: ok"),
                    Err(e) => format!(
                        "fs-write {path}: error {}",
                        e.data.map(|d| d.to_string()).unwrap_or(e.message)
                    ),
                }
            } else {
                let request: ReadTextFileRequest =
                    serde_json::from_value(json!({"sessionId": session, "path": path}))
                        .expect("a read request");
                match cx.send_request(request).block_task().await {
                    Ok(read) => format!("fs-read {path}: {}", read.content),
                    Err(e) => format!(
                        "fs-read {path}: error {}",
                        e.data.map(|d| d.to_string()).unwrap_or(e.message)
                    ),
                }
            };
            say(&said)?;
        }
        "term" => {
            // Runs a command in a host terminal: `term [cwd=DIR] CMD ARGS...`;
            // says how it ended and its output.
            let mut words = rest.clone();
            let cwd = words
                .first()
                .and_then(|w| w.strip_prefix("cwd="))
                .map(str::to_owned);
            if cwd.is_some() {
                words.remove(0);
            }
            let mut request = json!({"sessionId": session, "command": words.first().copied().unwrap_or("true"),
                "args": words.get(1..).unwrap_or_default(), "outputByteLimit": 4096});
            if let Some(cwd) = cwd {
                request["cwd"] = json!(cwd);
            }
            let request: CreateTerminalRequest =
                serde_json::from_value(request).expect("a terminal request");
            let created = match cx.send_request(request).block_task().await {
                Ok(created) => created,
                Err(e) => {
                    say(&format!(
                        "term: error {}",
                        e.data.map(|d| d.to_string()).unwrap_or(e.message)
                    ))?;
                    return Ok(StopReason::EndTurn);
                }
            };
            let id = created.terminal_id.to_string();
            cx.send_notification(update(
                session,
                json!({"sessionUpdate": "tool_call", "toolCallId": format!("run-{id}"), "title": "Run a command",
                       "kind": "execute", "status": "in_progress", "content": [{"type": "terminal", "terminalId": id}]}),
            ))?;
            let ids = || json!({"sessionId": session, "terminalId": id});
            let waited: WaitForTerminalExitRequest = serde_json::from_value(ids()).expect("wait");
            let exit = cx.send_request(waited).block_task().await?;
            let output: TerminalOutputRequest = serde_json::from_value(ids()).expect("output");
            let output = cx.send_request(output).block_task().await?;
            cx.send_notification(update(
                session,
                json!({"sessionUpdate": "tool_call_update", "toolCallId": format!("run-{id}"), "status": "completed"}),
            ))?;
            let released: ReleaseTerminalRequest = serde_json::from_value(ids()).expect("release");
            cx.send_request(released).block_task().await?;
            let status = &exit.exit_status;
            let ended = match (status.exit_code, &status.signal) {
                (Some(code), _) => format!("exit {code}"),
                (None, Some(signal)) => format!("signal {signal}"),
                _ => "ended".to_owned(),
            };
            say(&format!("{ended}: {}", output.output.trim()))?;
        }
        "child-read" => {
            // A process the agent starts, reading a file: it inherits the
            // agent's confinement.
            let path = rest.first().copied().unwrap_or_default();
            let out = std::process::Command::new("cat").arg(path).output();
            say(&match out {
                Ok(out) if out.status.success() => format!("child-read {path}: ok"),
                Ok(out) => format!(
                    "child-read {path}: error {}",
                    String::from_utf8_lossy(&out.stderr).trim()
                ),
                Err(e) => format!("child-read {path}: error {e}"),
            })?;
        }
        _ => say(text)?,
    }
    Ok(StopReason::EndTurn)
}
