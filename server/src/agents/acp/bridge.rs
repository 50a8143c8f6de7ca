//! The bridge task: one agent process, its ACP connection, and the queue
//! between it and the session's actor.

use std::collections::VecDeque;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use agent_client_protocol::schema::ProtocolVersion;
use agent_client_protocol::v1::ConnectionTo;
use agent_client_protocol::v1::schema::{
    AuthenticateRequest, CancelNotification, ClientCapabilities, CloseSessionRequest, ContentBlock,
    CreateElicitationRequest, CreateElicitationResponse, EnvVariable, HttpHeader, Implementation,
    InitializeRequest, InitializeResponse, LoadSessionRequest, McpServer, McpServerHttp,
    McpServerStdio, NewSessionRequest, PermissionOptionKind, PromptRequest, ReadTextFileRequest,
    ReadTextFileResponse, RequestPermissionOutcome, RequestPermissionRequest,
    RequestPermissionResponse, ResumeSessionRequest, SelectedPermissionOutcome,
    SessionConfigOptionValue, SessionNotification, SetSessionConfigOptionRequest,
    SetSessionModeRequest, TextContent, WriteTextFileRequest, WriteTextFileResponse,
};
use agent_client_protocol::v1::schema::{
    CreateTerminalRequest, CreateTerminalResponse, KillTerminalRequest, KillTerminalResponse,
    ReleaseTerminalRequest, ReleaseTerminalResponse, TerminalOutputRequest, TerminalOutputResponse,
    WaitForTerminalExitRequest, WaitForTerminalExitResponse,
};
use agent_client_protocol::{Agent, ByteStreams, Client};
use serde_json::Value;
use tokio::io::AsyncBufReadExt;
use tokio::process::{Child, ChildStderr};
use tokio::sync::{mpsc, oneshot};
use tokio_util::compat::{TokioAsyncReadCompatExt, TokioAsyncWriteCompatExt};

use super::config::{AgentConfig, Setting};
use super::lines::{Guarded, Verdict};
use super::map::{Turn, TurnMap};
use super::{
    AcpCapabilities, AcpLimits, AgentEvent, AgentProcess, OpenMode, OpenRequest, PermissionAnswer,
    ToAgent,
};
use crate::agents::AgentCommand;
use crate::agents::sandbox::{Launch, Run, Sandbox, signal_group};
use crate::agents::terminals::{NewTerminal, Terminals};
use crate::effects::files::SessionFiles;
use crate::store::now_ms;

/// Events buffered between the agent and the actor: beyond this the agent's
/// messages wait (ACP's dispatch loop is held), so a flood is paced by what
/// the store commits.
const EVENTS: usize = 64;

/// Stderr lines of one process copied to the log; the rest are dropped.
const STDERR_LINES: usize = 2_000;

/// Starts `command` for a session and opens it; events arrive on the
/// returned process's `events`.
pub fn spawn(
    command: &AgentCommand,
    open: OpenRequest,
    limits: AcpLimits,
    sandbox: &Sandbox,
    store: Arc<dyn crate::store::Store>,
    terminals: Terminals,
) -> Result<AgentProcess, String> {
    let (mut child, cwd) = start(command, &open.session_id, &open.dirs, sandbox)?;
    let group = child.id();
    let (events_tx, events) = mpsc::channel(EVENTS);
    let (commands_tx, commands) = mpsc::unbounded_channel();
    let (stop, stopped) = oneshot::channel();
    let name = command.name.clone();
    let agent = command.clone();
    let sandbox = sandbox.clone();
    tokio::spawn(async move {
        let pid = child.id();
        let verdict = Verdict::default();
        let map = Arc::new(Mutex::new(TurnMap::new(&open.session_uri)));
        let bridge = Bridge {
            command: agent,
            sandbox: sandbox.clone(),
            terminals,
            store,
            session_id: open.session_id.clone(),
            events: events_tx.clone(),
            map,
            limits: limits.clone(),
            verdict: verdict.clone(),
            closes: std::sync::atomic::AtomicBool::new(false),
            titles: std::sync::atomic::AtomicBool::new(false),
        };
        let (map, terminals, session_id) = (
            bridge.map.clone(),
            bridge.terminals.clone(),
            bridge.session_id.clone(),
        );
        let result = bridge.run(&mut child, open, cwd, commands, stopped).await;
        // Its terminals end with it.
        let opened = map.lock().map(|m| m.terminal_ids()).unwrap_or_default();
        for id in opened {
            terminals.release(&tether_protocol::channel::Channel::terminal_uri(
                &session_id,
                &id,
            ));
        }
        let reason = match (verdict.lock().ok().and_then(|v| v.clone()), result) {
            (Some(reason), _) => Some(reason),
            (None, Err(err)) => Some(err),
            (None, Ok(Stop::Asked)) => None,
            (None, Ok(Stop::Ended)) => Some("the agent closed its connection".to_owned()),
        };
        let status = stop_child(&mut child, pid, &limits).await;
        if let Some(reason) = reason {
            let reason = match status {
                Some(status) if !reason.contains("exited") => format!("{reason} ({status})"),
                _ => reason,
            };
            tracing::warn!(agent = %name, %reason, "agent process stopped");
            let _ = events_tx.send(AgentEvent::Exited { reason }).await;
        } else {
            tracing::info!(agent = %name, "agent process stopped");
        }
    });
    Ok(AgentProcess {
        commands: commands_tx,
        events,
        _stop: stop,
        group,
    })
}

/// Asks a configured agent what it can do: starts it, sends `initialize`,
/// opens a session in its scratch directory to learn its settings (modes,
/// options, models) or why it cannot open one (a login it needs), stops
/// it.
pub async fn probe(
    command: &AgentCommand,
    limits: &AcpLimits,
    sandbox: &Sandbox,
) -> Result<AcpCapabilities, String> {
    let scratch = format!("probe-{}", command.name);
    let (mut child, cwd) = start(command, &scratch, &[], sandbox)?;
    let provider = command.name.clone();
    let agent = command.clone();
    let pid = child.id();
    let (stdin, stdout) = (child.stdin.take(), child.stdout.take());
    let (Some(stdin), Some(stdout)) = (stdin, stdout) else {
        return Err("its stdio could not be opened".to_owned());
    };
    let verdict = Verdict::default();
    let transport = ByteStreams::new(
        stdin.compat_write(),
        Guarded::new(stdout.compat(), limits.max_line_bytes, verdict.clone()),
    );
    let timeout = limits.init_timeout;
    let result = Client
        .v1()
        .name("tether")
        .connect_with(transport, async move |cx: ConnectionTo<Agent>| {
            let (mut capabilities, logins) = match initialize(&cx, timeout).await {
                Ok((response, raw)) => {
                    let mut capabilities = capabilities_of(&response);
                    let logins = Logins::of(&agent, &raw);
                    capabilities.auth_methods = logins.methods.clone();
                    (capabilities, logins)
                }
                Err(reason) => return Ok(Err(reason)),
            };
            let request = NewSessionRequest::new(cwd);
            match open_request(&cx, timeout, "session/new", request, &logins).await {
                Ok(session) => {
                    let options = session.config_options.unwrap_or_default();
                    let config = AgentConfig::new(session.modes.as_ref(), &options);
                    capabilities.learn_config(&config, &provider);
                }
                Err(reason) => capabilities.session_error = Some(reason),
            }
            Ok(Ok(capabilities))
        })
        .await;
    stop_child(&mut child, pid, limits).await;
    let verdict = verdict.lock().ok().and_then(|v| v.clone());
    match (verdict, result) {
        (Some(reason), _) => Err(reason),
        (None, Ok(Ok(capabilities))) => Ok(capabilities),
        (None, Ok(Err(reason))) => Err(reason),
        (None, Err(err)) => Err(format!("it did not answer initialize: {err}")),
    }
}

/// Starts the agent's process through the sandbox (environment, directory,
/// confinement) and copies its stderr to the log; the process and the
/// directory it runs in.
fn start(
    command: &AgentCommand,
    scratch: &str,
    dirs: &[PathBuf],
    sandbox: &Sandbox,
) -> Result<(Child, PathBuf), String> {
    let started = sandbox.launch(&Launch {
        command,
        scratch,
        dirs,
    })?;
    let mut child = started.child;
    if let Some(stderr) = child.stderr.take() {
        tokio::spawn(copy_stderr(command.name.clone(), stderr));
    }
    Ok((child, started.cwd))
}

async fn copy_stderr(name: String, stderr: ChildStderr) {
    let mut lines = tokio::io::BufReader::new(stderr).lines();
    let mut copied = 0;
    while let Ok(Some(line)) = lines.next_line().await {
        if copied < STDERR_LINES {
            let line: String = line.chars().take(2_000).collect();
            tracing::info!(agent = %name, stderr = %line, "agent");
            copied += 1;
        }
    }
}

/// Stops the process group (TERM, then KILL after the grace period) and
/// reaps the child; its exit status, when it had one.
async fn stop_child(child: &mut Child, pid: Option<u32>, limits: &AcpLimits) -> Option<String> {
    if let Ok(Some(status)) = child.try_wait() {
        signal_group(pid, rustix::process::Signal::KILL);
        return Some(describe(status));
    }
    signal_group(pid, rustix::process::Signal::TERM);
    let status = match tokio::time::timeout(limits.stop_grace, child.wait()).await {
        Ok(Ok(status)) => Some(status),
        _ => {
            signal_group(pid, rustix::process::Signal::KILL);
            let _ = child.kill().await;
            child.wait().await.ok()
        }
    };
    signal_group(pid, rustix::process::Signal::KILL);
    status.map(describe)
}

fn describe(status: std::process::ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(code), _) => format!("exited with status {code}"),
        (None, Some(signal)) => format!("killed by signal {signal}"),
        _ => "exited".to_owned(),
    }
}

/// Sends `initialize`; the answer, typed and as the agent wrote it (its
/// `authMethods` may be of kinds this schema version does not know, such
/// as `env_var`, which are kept whole).
async fn initialize(
    cx: &ConnectionTo<Agent>,
    timeout: std::time::Duration,
) -> Result<(InitializeResponse, Value), String> {
    // What Tether answers besides permissions: questions (form and URL
    // elicitations, shown to AHP clients as chat input requests), text
    // files in the session's directories (each write a `FileEdit`) and
    // terminals (confined as the agent is, streamed as `terminal/*`).
    let capabilities: ClientCapabilities = serde_json::from_value(serde_json::json!({
        "elicitation": {"form": {}, "url": {}},
        "fs": {"readTextFile": true, "writeTextFile": true},
        "terminal": true,
    }))
    .unwrap_or_default();
    let request = InitializeRequest::new(ProtocolVersion::V1)
        .client_capabilities(capabilities)
        .client_info(Implementation::new("tether", env!("CARGO_PKG_VERSION")).title("Tether"));
    let untyped = agent_client_protocol::UntypedMessage::new("initialize", &request)
        .map_err(|e| format!("cannot write initialize: {e}"))?;
    let raw = match tokio::time::timeout(timeout, cx.send_request(untyped).block_task()).await {
        Ok(Ok(raw)) => raw,
        Ok(Err(err)) => return Err(format!("it refused initialize: {err}")),
        Err(_) => {
            return Err(format!(
                "it did not answer initialize within {} s",
                timeout.as_secs_f64()
            ));
        }
    };
    let response = serde_json::from_value(raw.clone())
        .map_err(|e| format!("its answer to initialize is not ACP's: {e}"))?;
    Ok((response, raw))
}

/// The login an agent's configuration already provides: the first
/// `env_var` method whose every variable is in the agent's own
/// environment (`env`, the names its configuration sets).
pub(super) fn configured_login(methods: &[Value], env: &[String]) -> Option<String> {
    methods.iter().find_map(|method| {
        let vars = method["vars"].as_array()?;
        let provided = method["type"] == "env_var"
            && !vars.is_empty()
            && vars.iter().all(|v| {
                v["optional"] == true
                    || v["name"]
                        .as_str()
                        .is_some_and(|n| env.iter().any(|e| e == n))
            });
        provided.then(|| method["id"].as_str().map(str::to_owned))?
    })
}

/// How people can log an agent in, for a refusal: each method's name and
/// what it needs.
fn login_choices(methods: &[Value]) -> String {
    let shown: Vec<String> = methods
        .iter()
        .map(|m| {
            let name = m["name"].as_str().or(m["id"].as_str()).unwrap_or("?");
            match m["type"].as_str() {
                Some("env_var") => {
                    let vars: Vec<&str> = m["vars"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .filter_map(|v| v["name"].as_str())
                        .collect();
                    format!(
                        "{name} (set {} in the agent's configuration)",
                        vars.join(", ")
                    )
                }
                Some("terminal") => format!("{name} (an interactive login in a terminal)"),
                _ => format!("{name} (the agent's own login)"),
            }
        })
        .collect();
    if shown.is_empty() {
        "it lists no login methods".to_owned()
    } else {
        format!("it offers: {}", shown.join("; "))
    }
}

/// Whether an agent's error says it needs a login (ACP `auth_required`).
fn needs_login(err: &agent_client_protocol::Error) -> bool {
    serde_json::to_value(err.code).ok() == Some(serde_json::json!(-32000))
}

/// Sends a session-opening request (`session/new`, `load`, `resume`); when
/// the agent answers that it needs a login and its configuration provides
/// an `env_var` method, calls `authenticate` with it and asks once more.
/// A refusal names the login methods it offers.
async fn open_request<Req>(
    cx: &ConnectionTo<Agent>,
    timeout: std::time::Duration,
    what: &str,
    request: Req,
    logins: &Logins,
) -> Result<Req::Response, String>
where
    Req: agent_client_protocol::JsonRpcRequest + Clone,
{
    let in_time = || {
        format!(
            "it did not answer {what} within {} s",
            timeout.as_secs_f64()
        )
    };
    let first = tokio::time::timeout(timeout, cx.send_request(request.clone()).block_task())
        .await
        .map_err(|_| in_time())?;
    let err = match first {
        Ok(answer) => return Ok(answer),
        Err(err) if needs_login(&err) => err,
        Err(err) => return Err(format!("it refused {what}: {}", said(&err))),
    };
    let choices = login_choices(&logins.methods);
    let Some(method) = configured_login(&logins.methods, &logins.env) else {
        return Err(format!(
            "it needs a login: {}; {choices}",
            said(&err).trim_end_matches('.')
        ));
    };
    let login = AuthenticateRequest::new(method.clone());
    tokio::time::timeout(timeout, cx.send_request(login).block_task())
        .await
        .map_err(|_| {
            format!(
                "it did not answer authenticate within {} s",
                timeout.as_secs_f64()
            )
        })?
        .map_err(|e| format!("it refused the login {method:?}: {}; {choices}", said(&e)))?;
    tokio::time::timeout(timeout, cx.send_request(request).block_task())
        .await
        .map_err(|_| in_time())?
        .map_err(|e| format!("it refused {what} after the login {method:?}: {}", said(&e)))
}

/// What an agent offers to log in with, and the environment variables its
/// configuration gives it.
#[derive(Debug, Clone, Default)]
pub(super) struct Logins {
    /// `authMethods`, as the agent wrote them.
    pub methods: Vec<Value>,
    /// The names of the variables its configuration sets.
    pub env: Vec<String>,
}

impl Logins {
    fn of(command: &AgentCommand, raw: &Value) -> Self {
        let mut env: Vec<String> = command.env.iter().map(|(k, _)| k.clone()).collect();
        env.extend(
            command
                .file_env()
                .unwrap_or_default()
                .into_iter()
                .map(|(k, _)| k),
        );
        Self {
            methods: raw["authMethods"].as_array().cloned().unwrap_or_default(),
            env,
        }
    }
}

fn capabilities_of(response: &InitializeResponse) -> AcpCapabilities {
    let caps = &response.agent_capabilities;
    AcpCapabilities {
        load_session: caps.load_session,
        resume: caps.session_capabilities.resume.is_some(),
        additional_directories: caps.session_capabilities.additional_directories.is_some(),
        image: caps.prompt_capabilities.image,
        audio: caps.prompt_capabilities.audio,
        embedded_context: caps.prompt_capabilities.embedded_context,
        mcp_http: caps.mcp_capabilities.http,
        title: response
            .agent_info
            .as_ref()
            .map(|i| i.title.clone().unwrap_or_else(|| i.name.clone())),
        close: caps.session_capabilities.close.is_some(),
        auth_methods: response
            .auth_methods
            .iter()
            .filter_map(|m| serde_json::to_value(m).ok())
            .collect(),
        ..AcpCapabilities::default()
    }
}

/// A stored attachment as an ACP content block (as JSON): an image or
/// audio block for those media, else an embedded resource (text when it is
/// UTF-8 text, a base64 blob otherwise).
fn stored_block(uri: &str, stored: &crate::store::Attachment) -> Value {
    use base64::Engine as _;
    let data = base64::engine::general_purpose::STANDARD.encode(&stored.data);
    let media = stored.content_type.as_str();
    if media.starts_with("image/") {
        return serde_json::json!({"type": "image", "data": data, "mimeType": media, "uri": uri});
    }
    if media.starts_with("audio/") {
        return serde_json::json!({"type": "audio", "data": data, "mimeType": media});
    }
    let text = (media.starts_with("text/") || media.ends_with("json"))
        .then(|| String::from_utf8(stored.data.clone()).ok())
        .flatten();
    let resource = match text {
        Some(text) => serde_json::json!({"uri": uri, "text": text, "mimeType": media}),
        None => serde_json::json!({"uri": uri, "blob": data, "mimeType": media}),
    };
    serde_json::json!({"type": "resource", "resource": resource})
}

/// An ACP elicitation answer from its JSON form (`elicit::response`); a
/// cancel if it cannot be read.
fn elicitation_response(value: &Value) -> CreateElicitationResponse {
    serde_json::from_value(value.clone()).unwrap_or_else(|_| {
        CreateElicitationResponse::new(agent_client_protocol::v1::schema::ElicitationAction::Cancel)
    })
}

/// Why the bridge's loop ended.
enum Stop {
    /// The actor let the process go.
    Asked,
    /// The agent's side ended.
    Ended,
}

struct Bridge {
    /// The agent's configuration (its own environment, for logins).
    command: AgentCommand,
    /// How its terminals are started (confined as it is).
    sandbox: Sandbox,
    /// This host's terminals.
    terminals: Terminals,
    events: mpsc::Sender<AgentEvent>,
    /// Where a message's stored attachments are read from.
    store: Arc<dyn crate::store::Store>,
    /// The Tether session's id (stored attachments are the session's).
    session_id: String,
    map: Arc<Mutex<TurnMap>>,
    limits: AcpLimits,
    verdict: Verdict,
    /// Whether the agent takes `session/close` (learned at `initialize`).
    closes: std::sync::atomic::AtomicBool,
    /// Whether the agent takes `session/set_title` (learned at
    /// `initialize`; a capability of the schema's unstable part, read from
    /// the agent's own words).
    titles: std::sync::atomic::AtomicBool,
}

/// The agent's side of this host's terminals: ACP terminal ids are the
/// names in `ahp-terminal:/<session>/<id>`.
#[derive(Clone)]
struct AgentTerminals {
    session_id: String,
    command: AgentCommand,
    sandbox: Sandbox,
    dirs: Vec<PathBuf>,
    terminals: Terminals,
    limits: crate::agents::terminals::TerminalLimits,
    map: Arc<Mutex<TurnMap>>,
    record: mpsc::Sender<super::map::Actions>,
}

impl AgentTerminals {
    fn uri(&self, id: &str) -> String {
        tether_protocol::channel::Channel::terminal_uri(&self.session_id, id)
    }

    fn get(&self, id: &str) -> Option<Arc<crate::agents::terminals::Terminal>> {
        self.terminals.get(&self.uri(id))
    }

    fn release(&self, id: &str) -> bool {
        self.terminals.release(&self.uri(id)).is_some()
    }

    /// `terminal/create`: runs the command confined, in the session's
    /// directories; the new terminal's id.
    fn create(&self, request: &CreateTerminalRequest) -> Result<String, String> {
        let id = format!("t-{}", &uuid::Uuid::new_v4().simple().to_string()[..12]);
        let env: Vec<(String, String)> = request
            .env
            .iter()
            .map(|v| (v.name.clone(), v.value.clone()))
            .collect();
        let scratch = self.session_id.clone();
        let child = self.sandbox.run(
            &Launch {
                command: &self.command,
                scratch: &scratch,
                dirs: &self.dirs,
            },
            &Run {
                program: &request.command,
                args: &request.args,
                env: &env,
                cwd: request.cwd.as_deref(),
            },
        )?;
        let title = std::iter::once(request.command.as_str())
            .chain(request.args.iter().map(String::as_str))
            .collect::<Vec<_>>()
            .join(" ");
        let (chat, turn_id) = match self.map.lock() {
            Ok(mut m) => {
                m.terminal_opened(&id, &title);
                match m.turn() {
                    Some(turn) => (turn.chat.clone(), Some(turn.turn_id.clone())),
                    None => (
                        tether_protocol::channel::Channel::default_chat_uri(&self.session_id),
                        None,
                    ),
                }
            }
            Err(_) => return Err("the session is stopping".to_owned()),
        };
        let mut claim = serde_json::json!({"kind": "session",
            "session": tether_protocol::channel::Channel::session_uri(&self.session_id), "chat": chat});
        if let Some(turn_id) = turn_id {
            claim["turnId"] = serde_json::json!(turn_id);
        }
        let keep = request
            .output_byte_limit
            .and_then(|l| usize::try_from(l).ok())
            .unwrap_or(self.limits.output_bytes);
        let cwd = request
            .cwd
            .clone()
            .or_else(|| self.dirs.first().cloned())
            .map(|d| crate::agents::acp::edits::file_uri(&d));
        self.terminals.start(
            NewTerminal {
                uri: self.uri(&id),
                claim,
                title,
                cwd,
                keep_bytes: keep,
                interactive: false,
            },
            child,
            self.limits,
            self.record.clone(),
        )?;
        Ok(id)
    }
}

/// ACP's `TerminalExitStatus` of an exit.
fn exit_status(exit: &crate::agents::terminals::Exit) -> Value {
    serde_json::json!({"exitCode": exit.code.and_then(|c| u32::try_from(c).ok()), "signal": exit.signal})
}

fn unknown_terminal(id: &impl std::fmt::Display) -> agent_client_protocol::Error {
    agent_client_protocol::Error::invalid_params().data(serde_json::json!(format!(
        "No terminal {id} in this session."
    )))
}

struct Queued {
    chat: String,
    turn_id: String,
    text: String,
    model: Option<String>,
    attachments: Vec<Value>,
}

/// What an agent's error says: its `data` when that is text, else its
/// message (with any other data).
fn said(error: &agent_client_protocol::Error) -> String {
    match &error.data {
        Some(serde_json::Value::String(text)) if !text.is_empty() => text.clone(),
        Some(data) if !data.is_null() => format!("{} ({data})", error.message),
        _ => error.message.clone(),
    }
}

/// Whether the agent broke a limit and is being stopped: nothing more of
/// it is recorded.
fn stopping(verdict: &Verdict) -> bool {
    verdict.lock().map(|v| v.is_some()).unwrap_or(true)
}

fn fail(verdict: &Verdict, reason: String) -> agent_client_protocol::Error {
    if let Ok(mut v) = verdict.lock() {
        v.get_or_insert(reason.clone());
    }
    agent_client_protocol::Error::internal_error().data(serde_json::json!(reason))
}

impl Bridge {
    async fn run(
        self,
        child: &mut Child,
        open: OpenRequest,
        cwd: PathBuf,
        mut commands: mpsc::UnboundedReceiver<ToAgent>,
        mut stopped: oneshot::Receiver<()>,
    ) -> Result<Stop, String> {
        let (Some(stdin), Some(stdout)) = (child.stdin.take(), child.stdout.take()) else {
            return Err("its stdio could not be opened".to_owned());
        };
        let transport = ByteStreams::new(
            stdin.compat_write(),
            Guarded::new(
                stdout.compat(),
                self.limits.max_line_bytes,
                self.verdict.clone(),
            ),
        );
        let (done_tx, mut done) = mpsc::unbounded_channel::<()>();
        // A limit broken inside a handler stops the connection from the loop.
        let (abort_tx, mut abort) = mpsc::unbounded_channel::<()>();
        let notify = (
            self.events.clone(),
            self.map.clone(),
            self.verdict.clone(),
            abort_tx,
            self.store.clone(),
        );
        let limit = self.limits.max_updates_per_turn;
        // The host's file access for the agent: the session's directories
        // (or the scratch directory it runs in when it has none).
        let mut dirs = open.dirs.clone();
        dirs.push(cwd.clone());
        let files = SessionFiles::new(&dirs);
        let reading = files.clone();
        let writing = (
            files,
            self.events.clone(),
            self.map.clone(),
            self.store.clone(),
        );
        // The agent's terminals, their actions recorded as the agent's.
        let (record, mut recorded) = mpsc::channel::<super::map::Actions>(16);
        let forward = self.events.clone();
        tokio::spawn(async move {
            while let Some(actions) = recorded.recv().await {
                if forward.send(AgentEvent::Actions(actions)).await.is_err() {
                    break;
                }
            }
        });
        let agent_terminals = AgentTerminals {
            session_id: self.session_id.clone(),
            command: self.command.clone(),
            sandbox: self.sandbox.clone(),
            dirs: open.dirs.clone(),
            terminals: self.terminals.clone(),
            limits: self.limits.terminals,
            map: self.map.clone(),
            record,
        };
        let self_terminals = agent_terminals.clone();
        let output_terminals = agent_terminals.clone();
        let wait_terminals = agent_terminals.clone();
        let kill_terminals = agent_terminals.clone();
        let release_terminals = agent_terminals;
        let ask = (self.events.clone(), self.map.clone());
        let question = (self.events.clone(), self.map.clone());
        let result = Client
            .v1()
            .name("tether")
            .on_receive_notification(
                async move |notification: SessionNotification, _cx| {
                    let (events, map, verdict, abort, store) = &notify;
                    let (actions, stored) = {
                        let mut map = map.lock().map_err(|_| fail(verdict, "poisoned".into()))?;
                        if stopping(verdict) {
                            // Stopping: nothing more of this agent is recorded.
                            return Ok(());
                        }
                        if map.updates >= limit {
                            fail(verdict, format!("the agent sent more than {limit} updates in one turn"));
                            let _ = abort.send(());
                            return Ok(());
                        }
                        let actions = map.update(&notification.update);
                        (actions, std::mem::take(&mut map.stored))
                    };
                    // The bytes of the agent's images and files, before the
                    // parts that refer to them are recorded.
                    for attachment in &stored {
                        if let Err(err) = store.put_attachment(attachment).await {
                            tracing::warn!(error = %err, "an agent's attachment could not be stored");
                        }
                    }
                    if !actions.is_empty() {
                        let _ = events.send(AgentEvent::Actions(actions)).await;
                    }
                    Ok(())
                },
                agent_client_protocol::on_receive_notification!(),
            )
            .on_receive_request(
                async move |request: RequestPermissionRequest, responder, cx| {
                    let (events, map) = &ask;
                    let cancelled =
                        || RequestPermissionResponse::new(RequestPermissionOutcome::Cancelled);
                    let (actions, turn) = match map.lock() {
                        Ok(mut m) => (m.permission(&request), m.turn().cloned()),
                        Err(_) => return responder.respond(cancelled()),
                    };
                    let Some(turn) = turn else {
                        return responder.respond(cancelled());
                    };
                    let options = request
                        .options
                        .iter()
                        .map(|o| {
                            let approves = matches!(
                                o.kind,
                                PermissionOptionKind::AllowOnce | PermissionOptionKind::AllowAlways
                            );
                            (o.option_id.to_string(), approves)
                        })
                        .collect::<Vec<_>>();
                    let approving: Vec<String> = options
                        .iter()
                        .filter(|(_, a)| *a)
                        .map(|(id, _)| id.clone())
                        .collect();
                    let tool_call_id = request.tool_call.tool_call_id.to_string();
                    let (answer, answered) = oneshot::channel();
                    let event = AgentEvent::Permission {
                        chat: turn.chat,
                        turn_id: turn.turn_id,
                        tool_call_id: tool_call_id.clone(),
                        options,
                        actions,
                        answer,
                    };
                    if events.send(event).await.is_err() {
                        return responder.respond(cancelled());
                    }
                    let map = map.clone();
                    cx.spawn(async move {
                        let outcome = match answered.await {
                            Ok(PermissionAnswer::Selected(id)) => {
                                if let Ok(mut m) = map.lock() {
                                    m.confirmed(&tool_call_id, approving.contains(&id));
                                }
                                RequestPermissionOutcome::Selected(SelectedPermissionOutcome::new(id))
                            }
                            _ => RequestPermissionOutcome::Cancelled,
                        };
                        responder.respond(RequestPermissionResponse::new(outcome))
                    })?;
                    Ok(())
                },
                agent_client_protocol::on_receive_request!(),
            )
            .on_receive_request(
                async move |request: CreateElicitationRequest, responder, cx| {
                    let (events, map) = &question;
                    let elicitation = serde_json::to_value(&request).unwrap_or_default();
                    let cancel = || elicitation_response(&serde_json::json!({"action": "cancel"}));
                    let (turn, session_uri) = match map.lock() {
                        Ok(m) => (m.turn().cloned(), m.session_uri().to_owned()),
                        Err(_) => return responder.respond(cancel()),
                    };
                    // AHP places a question in a running turn; between
                    // turns nobody could be asked.
                    let Some(turn) = turn else {
                        return responder.respond(cancel());
                    };
                    let request_id = uuid::Uuid::new_v4().to_string();
                    let input = super::elicit::input_request(&request_id, &elicitation);
                    let actions = vec![
                        (
                            turn.chat.clone(),
                            serde_json::json!({"type": "chat/inputRequested", "request": input}),
                        ),
                        (
                            session_uri,
                            serde_json::json!({"type": "session/inputNeededSet", "request": {
                                "kind": "chatInput", "id": format!("{}#{request_id}", turn.chat),
                                "chat": turn.chat, "request": input}}),
                        ),
                    ];
                    let (answer, answered) = oneshot::channel();
                    let event = AgentEvent::Input {
                        chat: turn.chat,
                        turn_id: turn.turn_id,
                        request_id,
                        actions,
                        answer,
                    };
                    if events.send(event).await.is_err() {
                        return responder.respond(cancel());
                    }
                    cx.spawn(async move {
                        let response = match answered.await {
                            Ok(answer) => elicitation_response(&super::elicit::response(
                                &elicitation,
                                &answer.response,
                                &answer.answers,
                            )),
                            Err(_) => cancel(),
                        };
                        responder.respond(response)
                    })?;
                    Ok(())
                },
                agent_client_protocol::on_receive_request!(),
            )
            .on_receive_request(
                async move |request: ReadTextFileRequest, responder, _cx| {
                    let files = reading.clone();
                    let read = tokio::task::spawn_blocking(move || {
                        files.read_text(&request.path, request.line, request.limit)
                    })
                    .await
                    .unwrap_or_else(|_| Err("the read was interrupted".to_owned()));
                    match read {
                        Ok(text) => responder.respond(ReadTextFileResponse::new(text)),
                        Err(reason) => responder.respond_with_error(
                            agent_client_protocol::Error::invalid_params().data(serde_json::json!(reason)),
                        ),
                    }
                },
                agent_client_protocol::on_receive_request!(),
            )
            .on_receive_request(
                async move |request: WriteTextFileRequest, responder, _cx| {
                    let (files, events, map, store) = &writing;
                    let (files, path, content) =
                        (files.clone(), request.path.clone(), request.content.clone());
                    let written = tokio::task::spawn_blocking(move || files.write_text(&path, &content))
                        .await
                        .unwrap_or_else(|_| Err("the write was interrupted".to_owned()));
                    let old = match written {
                        Ok(old) => old,
                        Err(reason) => {
                            return responder.respond_with_error(
                                agent_client_protocol::Error::invalid_params()
                                    .data(serde_json::json!(reason)),
                            );
                        }
                    };
                    // The write is a `FileEdit` in the turn's changeset.
                    let (actions, stored) = match map.lock() {
                        Ok(mut m) => {
                            let (_, actions) =
                                m.file_edited(&request.path, old.as_deref(), &request.content);
                            (actions, std::mem::take(&mut m.stored))
                        }
                        Err(_) => (Vec::new(), Vec::new()),
                    };
                    for attachment in &stored {
                        if let Err(err) = store.put_attachment(attachment).await {
                            tracing::warn!(error = %err, "a written file's text could not be stored");
                        }
                    }
                    if !actions.is_empty() {
                        let _ = events.send(AgentEvent::Actions(actions)).await;
                    }
                    responder.respond(WriteTextFileResponse::new())
                },
                agent_client_protocol::on_receive_request!(),
            )
            .on_receive_request(
                async move |request: CreateTerminalRequest, responder, _cx| {
                    let answer = self_terminals.create(&request);
                    match answer {
                        Ok(id) => responder.respond(CreateTerminalResponse::new(id)),
                        Err(reason) => responder.respond_with_error(
                            agent_client_protocol::Error::invalid_params().data(serde_json::json!(reason)),
                        ),
                    }
                },
                agent_client_protocol::on_receive_request!(),
            )
            .on_receive_request(
                async move |request: TerminalOutputRequest, responder, _cx| {
                    match output_terminals.get(&request.terminal_id.to_string()) {
                        Some(terminal) => {
                            let (output, truncated, exit) = terminal.output();
                            let mut answer = serde_json::json!({"output": output, "truncated": truncated});
                            if let Some(exit) = exit {
                                answer["exitStatus"] = exit_status(&exit);
                            }
                            responder.respond(serde_json::from_value::<TerminalOutputResponse>(answer)
                                .map_err(|e| agent_client_protocol::Error::internal_error().data(serde_json::json!(e.to_string())))?)
                        }
                        None => responder.respond_with_error(unknown_terminal(&request.terminal_id)),
                    }
                },
                agent_client_protocol::on_receive_request!(),
            )
            .on_receive_request(
                async move |request: WaitForTerminalExitRequest, responder, cx| {
                    let Some(terminal) = wait_terminals.get(&request.terminal_id.to_string()) else {
                        return responder.respond_with_error(unknown_terminal(&request.terminal_id));
                    };
                    // Waiting must not hold the agent's other messages.
                    cx.spawn(async move {
                        let exit = terminal.wait().await;
                        let status = serde_json::from_value(exit_status(&exit)).unwrap_or_default();
                        responder.respond(WaitForTerminalExitResponse::new(status))
                    })?;
                    Ok(())
                },
                agent_client_protocol::on_receive_request!(),
            )
            .on_receive_request(
                async move |request: KillTerminalRequest, responder, _cx| {
                    match kill_terminals.get(&request.terminal_id.to_string()) {
                        Some(terminal) => {
                            terminal.kill();
                            responder.respond(KillTerminalResponse::default())
                        }
                        None => responder.respond_with_error(unknown_terminal(&request.terminal_id)),
                    }
                },
                agent_client_protocol::on_receive_request!(),
            )
            .on_receive_request(
                async move |request: ReleaseTerminalRequest, responder, _cx| {
                    match release_terminals.release(&request.terminal_id.to_string()) {
                        true => responder.respond(ReleaseTerminalResponse::default()),
                        false => responder.respond_with_error(unknown_terminal(&request.terminal_id)),
                    }
                },
                agent_client_protocol::on_receive_request!(),
            )
            .connect_with(transport, async move |cx: ConnectionTo<Agent>| {
                let session = match self.open(&cx, open, cwd).await {
                    Ok(session) => session,
                    Err(reason) => return Err(fail(&self.verdict, reason)),
                };
                let mut queue: VecDeque<Queued> = VecDeque::new();
                let mut running: Option<String> = None;
                loop {
                    if running.is_none()
                        && let Some(next) = queue.pop_front()
                    {
                        running = Some(next.turn_id.clone());
                        if let Some(model) = &next.model {
                            self.choose_model(&cx, &session, model).await;
                        }
                        let blocks = self.content(&next).await;
                        self.prompt(&cx, &session, next, blocks, done_tx.clone())?;
                    }
                    tokio::select! {
                        command = commands.recv() => match command {
                            None => return Ok(Stop::Asked),
                            Some(ToAgent::Prompt { chat, turn_id, text, model, attachments }) => {
                                queue.push_back(Queued { chat, turn_id, text, model, attachments });
                            }
                            Some(ToAgent::Configure { values, reply }) => {
                                let _ = reply.send(self.configure(&cx, &session, &values).await);
                            }
                            Some(ToAgent::SetTitle { title }) => {
                                if self.titles.load(std::sync::atomic::Ordering::Relaxed) {
                                    let params = serde_json::json!({"sessionId": session, "title": title});
                                    let request = agent_client_protocol::UntypedMessage::new(
                                        "session/set_title",
                                        params,
                                    )?;
                                    let answer = tokio::time::timeout(
                                        self.limits.init_timeout,
                                        cx.send_request(request).block_task(),
                                    )
                                    .await;
                                    if !matches!(answer, Ok(Ok(_))) {
                                        tracing::info!("the agent did not take the session's new title");
                                    }
                                }
                            }
                            Some(ToAgent::Close { reply }) => {
                                if self.closes.load(std::sync::atomic::Ordering::Relaxed) {
                                    let request = CloseSessionRequest::new(session.clone());
                                    let _ = tokio::time::timeout(
                                        self.limits.init_timeout,
                                        cx.send_request(request).block_task(),
                                    )
                                    .await;
                                }
                                let _ = reply.send(());
                            }
                            Some(ToAgent::Cancel { turn_id }) => {
                                if running.as_deref() == Some(turn_id.as_str()) {
                                    if let Ok(mut m) = self.map.lock() {
                                        m.cancelled();
                                    }
                                    cx.send_notification(CancelNotification::new(session.clone()))?;
                                } else {
                                    queue.retain(|q| q.turn_id != turn_id);
                                }
                            }
                            Some(ToAgent::Resume { cwd, additional, reply }) => {
                                let request = ResumeSessionRequest::new(session.clone(), cwd)
                                    .additional_directories(additional);
                                let answer = tokio::time::timeout(
                                    self.limits.init_timeout,
                                    cx.send_request(request).block_task(),
                                )
                                .await;
                                let _ = reply.send(match answer {
                                    Ok(Ok(_)) => Ok(()),
                                    Ok(Err(err)) => Err(format!("the agent refused: {}", said(&err))),
                                    Err(_) => Err("the agent did not answer session/resume in time".to_owned()),
                                });
                            }
                        },
                        Some(()) = done.recv() => running = None,
                        _ = &mut stopped => return Ok(Stop::Asked),
                        () = cx.incoming_closed() => return Ok(Stop::Ended),
                        Some(()) = abort.recv() => return Ok(Stop::Ended),
                    }
                }
            })
            .await;
        match result {
            Ok(stop) => Ok(stop),
            Err(err)
                if agent_client_protocol::is_connection_terminated(&err)
                    || agent_client_protocol::is_incoming_transport_closed(&err) =>
            {
                Ok(Stop::Ended)
            }
            Err(err) => Err(format!("the ACP connection failed: {err}")),
        }
    }

    /// `initialize`, then `session/new`, `session/resume` or `session/load`;
    /// the agent's session id.
    async fn open(
        &self,
        cx: &ConnectionTo<Agent>,
        open: OpenRequest,
        cwd: PathBuf,
    ) -> Result<String, String> {
        let timeout = self.limits.init_timeout;
        let (response, raw) = initialize(cx, timeout).await?;
        let caps = capabilities_of(&response);
        let logins = Logins::of(&self.command, &raw);
        self.titles.store(
            raw.pointer("/agentCapabilities/sessionCapabilities/title")
                .is_some_and(Value::is_object),
            std::sync::atomic::Ordering::Relaxed,
        );
        self.closes
            .store(caps.close, std::sync::atomic::Ordering::Relaxed);
        let additional = if caps.additional_directories {
            open.dirs.iter().skip(1).cloned().collect()
        } else {
            Vec::new()
        };
        let mcp_servers: Vec<McpServer> = match &open.mcp {
            Some((url, token)) if caps.mcp_http => vec![McpServer::Http(
                McpServerHttp::new("tether", url.clone()).headers(vec![HttpHeader::new(
                    "Authorization",
                    format!("Bearer {token}"),
                )]),
            )],
            // Stdio, which every agent takes: this binary's bridge to the
            // same endpoint, with the token in its environment.
            Some((url, token)) => match std::env::current_exe() {
                Ok(me) => vec![McpServer::Stdio(
                    McpServerStdio::new("tether", me)
                        .args(vec!["mcp-stdio".into(), "--url".into(), url.clone()])
                        .env(vec![EnvVariable::new(
                            crate::agents::mcp_stdio::TOKEN_ENV,
                            token.clone(),
                        )]),
                )],
                Err(err) => {
                    tracing::warn!(error = %err, "the MCP bridge cannot be offered: this program's path is unknown");
                    Vec::new()
                }
            },
            None => Vec::new(),
        };
        let (session, resumed, settings) = match &open.mode {
            OpenMode::New => {
                let request = NewSessionRequest::new(cwd.clone())
                    .additional_directories(additional)
                    .mcp_servers(mcp_servers);
                let response = open_request(cx, timeout, "session/new", request, &logins).await?;
                let options = response.config_options.unwrap_or_default();
                let settings = AgentConfig::new(response.modes.as_ref(), &options);
                (response.session_id.to_string(), false, settings)
            }
            OpenMode::Reopen(id) if caps.resume => {
                let request = ResumeSessionRequest::new(id.clone(), cwd.clone())
                    .additional_directories(additional)
                    .mcp_servers(mcp_servers);
                let response =
                    open_request(cx, timeout, "session/resume", request, &logins).await?;
                let options = response.config_options.unwrap_or_default();
                let settings = AgentConfig::new(response.modes.as_ref(), &options);
                (id.clone(), true, settings)
            }
            OpenMode::Reopen(id) if caps.load_session => {
                // The agent replays the history as updates: it is already
                // in the transcript, so none of it is recorded again.
                if let Ok(mut m) = self.map.lock() {
                    m.replaying = true;
                }
                let request = LoadSessionRequest::new(id.clone(), cwd.clone())
                    .additional_directories(additional)
                    .mcp_servers(mcp_servers);
                let answer = open_request(cx, timeout, "session/load", request, &logins).await;
                if let Ok(mut m) = self.map.lock() {
                    m.replaying = false;
                }
                let response = answer?;
                let options = response.config_options.unwrap_or_default();
                let settings = AgentConfig::new(response.modes.as_ref(), &options);
                (id.clone(), true, settings)
            }
            OpenMode::Reopen(_) => {
                return Err("it can neither resume nor load sessions".to_owned());
            }
        };
        let opened = AgentEvent::Opened {
            acp_session_ref: session.clone(),
            load_session: caps.load_session || caps.resume,
            resumed,
        };
        self.events
            .send(opened)
            .await
            .map_err(|_| "the session stopped".to_owned())?;
        // The session's recorded values (chosen at creation, or changed
        // while no agent ran) are the agent's now; what it ends up with,
        // if other, is recorded.
        if let Ok(mut m) = self.map.lock() {
            m.config = settings;
            m.known_config = open.config.clone();
        }
        let wanted = open
            .config
            .as_ref()
            .and_then(|c| c["values"].as_object().cloned())
            .unwrap_or_default();
        if let Err(reason) = self.apply(cx, &session, &wanted).await {
            // A value the agent no longer takes: the session goes on with
            // what the agent has, which is recorded below.
            tracing::warn!(%reason, "the agent did not take the session's configuration");
        }
        let actions = self
            .map
            .lock()
            .map(|mut m| m.config_moved())
            .unwrap_or_default();
        if !actions.is_empty() {
            let _ = self.events.send(AgentEvent::Actions(actions)).await;
        }
        Ok(session)
    }

    /// Moves the agent to `values` (`session/set_mode`,
    /// `session/set_config_option`), one request at a time, keeping what
    /// it reports in the map; stops at the first refusal, with the
    /// agent's words.
    async fn apply(
        &self,
        cx: &ConnectionTo<Agent>,
        session: &str,
        values: &serde_json::Map<String, Value>,
    ) -> Result<(), String> {
        let settings = match self.map.lock() {
            Ok(m) => m.config.settings_for(values),
            Err(_) => return Err("the session's state is unavailable".to_owned()),
        };
        let timeout = self.limits.init_timeout;
        for setting in settings {
            match setting {
                Setting::Mode(mode) => {
                    let request = SetSessionModeRequest::new(session.to_owned(), mode.clone());
                    tokio::time::timeout(timeout, cx.send_request(request).block_task())
                        .await
                        .map_err(|_| "it did not answer session/set_mode in time".to_owned())?
                        .map_err(|e| format!("it refused mode {mode:?}: {}", said(&e)))?;
                    if let Ok(mut m) = self.map.lock() {
                        m.config.set_mode(&mode);
                    }
                }
                Setting::Option(id, value) => {
                    let typed = match &value {
                        Value::Bool(on) => SessionConfigOptionValue::boolean(*on),
                        Value::String(choice) => SessionConfigOptionValue::value_id(choice.clone()),
                        other => {
                            return Err(format!("option {id:?} cannot take {other}"));
                        }
                    };
                    let request =
                        SetSessionConfigOptionRequest::new(session.to_owned(), id.clone(), typed);
                    let response =
                        tokio::time::timeout(timeout, cx.send_request(request).block_task())
                            .await
                            .map_err(|_| {
                                "it did not answer session/set_config_option in time".to_owned()
                            })?
                            .map_err(|e| format!("it refused {id:?} = {value}: {}", said(&e)))?;
                    if let Ok(mut m) = self.map.lock() {
                        m.config.set_options(&response.config_options);
                    }
                }
            }
        }
        Ok(())
    }

    /// A client's `session/configChanged`, before it is committed: the
    /// agent is moved to the values; the answer is what else changed with
    /// them (the client's own values are recorded with its action).
    async fn configure(
        &self,
        cx: &ConnectionTo<Agent>,
        session: &str,
        values: &serde_json::Map<String, Value>,
    ) -> Result<Vec<(String, Value)>, String> {
        let applied = self.apply(cx, session, values).await;
        let mut m = self
            .map
            .lock()
            .map_err(|_| "the session's state is unavailable".to_owned())?;
        // What clients will know once the client's action is recorded.
        if applied.is_ok()
            && let Some(known) = m.known_config.as_mut()
        {
            for (key, value) in values {
                known["values"][key] = value.clone();
            }
        }
        let actions = m.config_moved();
        applied.map(|()| actions)
    }

    /// Moves the agent to the model a turn's message asks for, recording
    /// the change; a refusal is logged and the turn goes on with the
    /// current model.
    async fn choose_model(&self, cx: &ConnectionTo<Agent>, session: &str, model: &str) {
        let option = match self.map.lock() {
            Ok(m) => m.config.model_option().map(str::to_owned),
            Err(_) => None,
        };
        let Some(option) = option else { return };
        let mut values = serde_json::Map::new();
        values.insert(option, Value::String(model.to_owned()));
        if let Err(reason) = self.apply(cx, session, &values).await {
            tracing::warn!(%reason, "the agent did not take the turn's model");
        }
        let actions = self
            .map
            .lock()
            .map(|mut m| m.config_moved())
            .unwrap_or_default();
        if !actions.is_empty() {
            let _ = self.events.send(AgentEvent::Actions(actions)).await;
        }
    }

    /// A message's content blocks: its text, then each attachment as the
    /// agent takes it (a stored one loaded: an image or audio block, or an
    /// embedded resource, text or blob; another reference a resource link;
    /// a simple one its text).
    async fn content(&self, message: &Queued) -> Vec<ContentBlock> {
        let mut blocks = vec![ContentBlock::Text(TextContent::new(message.text.clone()))];
        for attachment in &message.attachments {
            let label = attachment["label"].as_str().unwrap_or("attachment");
            let uri = attachment["uri"].as_str().unwrap_or_default();
            let block = match attachment["type"].as_str() {
                Some("simple") => Some(serde_json::json!({"type": "text",
                    "text": attachment["modelRepresentation"].as_str().unwrap_or(label)})),
                Some("resource") => match crate::store::attachment_digest(uri) {
                    Some(digest) => match self.store.attachment(&self.session_id, digest).await {
                        Ok(Some(stored)) => Some(stored_block(uri, &stored)),
                        Ok(None) => None,
                        Err(err) => {
                            tracing::warn!(error = %err, "an attachment could not be read");
                            None
                        }
                    },
                    None => Some(serde_json::json!({"type": "resource_link", "uri": uri,
                        "name": label, "mimeType": attachment["contentType"],
                        "size": attachment["sizeHint"]})),
                },
                _ => None,
            };
            if let Some(block) = block.and_then(|b| serde_json::from_value(b).ok()) {
                blocks.push(block);
            }
        }
        blocks
    }

    fn prompt(
        &self,
        cx: &ConnectionTo<Agent>,
        session: &str,
        next: Queued,
        blocks: Vec<ContentBlock>,
        done: mpsc::UnboundedSender<()>,
    ) -> Result<(), agent_client_protocol::Error> {
        if let Ok(mut m) = self.map.lock() {
            m.begin(
                Turn {
                    chat: next.chat,
                    turn_id: next.turn_id,
                },
                now_ms(),
            );
        }
        let request = PromptRequest::new(session.to_owned(), blocks);
        let (events, map) = (self.events.clone(), self.map.clone());
        let verdict = self.verdict.clone();
        cx.prepare_request(request)
            .on_receiving_result(async move |result| {
                let halted = stopping(&verdict);
                let gone = result.as_ref().is_err_and(|err| {
                    agent_client_protocol::is_incoming_transport_closed(err)
                        || agent_client_protocol::is_connection_terminated(err)
                });
                if halted || gone {
                    // The process is going (it broke a limit, or exited):
                    // its exit fails the turn, with why.
                    let _ = done.send(());
                    return Ok(());
                }
                let usage = result.as_ref().ok().and_then(|r| r.usage.clone());
                let stop = result.map(|r| r.stop_reason).map_err(|e| said(&e));
                let actions = map
                    .lock()
                    .map(|mut m| {
                        let mut actions = usage.map(|u| m.turn_tokens(&u)).unwrap_or_default();
                        actions.extend(m.finish(stop, now_ms()));
                        actions
                    })
                    .unwrap_or_default();
                if !actions.is_empty() {
                    let _ = events.send(AgentEvent::Actions(actions)).await;
                }
                let _ = done.send(());
                Ok(())
            })
    }
}
