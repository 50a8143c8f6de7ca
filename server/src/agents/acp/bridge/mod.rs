//! The bridge task: one agent process, its ACP connection, and the queue
//! between it and the session's actor.

use std::collections::{HashMap, VecDeque};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use agent_client_protocol::schema::ProtocolVersion;
use agent_client_protocol::v1::ConnectionTo;
use agent_client_protocol::v1::schema::{
    AuthenticateRequest, CancelNotification, ClientCapabilities, CloseSessionRequest,
    CompleteElicitationNotification, ContentBlock, CreateElicitationRequest,
    CreateElicitationResponse, ElicitationMode, EnvVariable, HttpHeader, Implementation,
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
use tokio::process::Child;
use tokio::sync::{mpsc, oneshot};
use tokio_util::compat::{TokioAsyncReadCompatExt, TokioAsyncWriteCompatExt};

use super::config::{AgentConfig, Setting};
use super::lines::{Guarded, Verdict};
use super::map::{Turn, TurnMap};
use super::{
    AcpCapabilities, AcpLimits, AgentEvent, AgentProcess, ConfigRefused, Moved, OpenMode,
    OpenRequest, PermissionAnswer, ToAgent,
};
use crate::agents::AgentCommand;
use crate::agents::sandbox::{Launch, Run, Sandbox};
use crate::agents::terminals::{NewTerminal, Terminals};
use crate::effects::files::SessionFiles;
use crate::store::now_ms;

mod handshake;
mod process;
mod sessions;
mod terminals;

use handshake::{Logins, capabilities_of, initialize, open_request};
use process::{start, stop_child};

use terminals::{AgentTerminals, exit_status, unknown_terminal};

/// Events buffered between the agent and the actor: beyond this the agent's
/// messages wait (ACP's dispatch loop is held), so a flood is paced by what
/// the store commits.
const EVENTS: usize = 64;

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
        events: super::events::AgentEvents::new(events),
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
    let scratch = crate::agents::sandbox::probe_scratch(&command.name);
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
        let ask = (self.events.clone(), self.map.clone(), self.store.clone());
        // The URL questions waiting, by their ACP elicitation id: the
        // agent's `elicitation/complete` names one.
        let urls: Arc<Mutex<HashMap<String, (String, String)>>> = Arc::default();
        let question = (self.events.clone(), self.map.clone(), urls.clone());
        let url_done = (self.events.clone(), urls);
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
                        // A load's replay of history already recorded.
                        let acp_session = notification.session_id.to_string();
                        if map.replays(&acp_session) {
                            return Ok(());
                        }
                        let actions = map.update(&acp_session, &notification.update);
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
                    let (events, map, store) = &ask;
                    let cancelled =
                        || RequestPermissionResponse::new(RequestPermissionOutcome::Cancelled);
                    let (actions, turn, stored) = match map.lock() {
                        Ok(mut m) => {
                            let actions = m.permission(&request);
                            (actions, m.turn().cloned(), std::mem::take(&mut m.stored))
                        }
                        Err(_) => return responder.respond(cancelled()),
                    };
                    // The sides of the edits it proposes, before the
                    // question that shows them is recorded.
                    for attachment in &stored {
                        if let Err(err) = store.put_attachment(attachment).await {
                            tracing::warn!(error = %err, "a proposed edit could not be stored");
                        }
                    }
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
                    let (events, map, urls) = &question;
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
                    let url_id = match &request.mode {
                        ElicitationMode::Url(url) => Some(url.elicitation_id.to_string()),
                        _ => None,
                    };
                    if let (Some(url_id), Ok(mut urls)) = (&url_id, urls.lock()) {
                        urls.insert(url_id.clone(), (turn.chat.clone(), request_id.clone()));
                    }
                    let event = AgentEvent::Input {
                        chat: turn.chat,
                        turn_id: turn.turn_id,
                        request_id,
                        actions,
                        answer,
                    };
                    if events.send(event).await.is_err() {
                        if let (Some(url_id), Ok(mut urls)) = (&url_id, urls.lock()) {
                            urls.remove(url_id);
                        }
                        return responder.respond(cancel());
                    }
                    let urls = urls.clone();
                    cx.spawn(async move {
                        let answered = answered.await;
                        if let (Some(url_id), Ok(mut urls)) = (&url_id, urls.lock()) {
                            urls.remove(url_id);
                        }
                        let response = match answered {
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
            .on_receive_notification(
                async move |done: CompleteElicitationNotification, _cx| {
                    let (events, urls) = &url_done;
                    let waiting = urls
                        .lock()
                        .ok()
                        .and_then(|mut urls| urls.remove(&done.elicitation_id.to_string()));
                    if let Some((chat, request_id)) = waiting {
                        let _ = events.send(AgentEvent::InputDone { chat, request_id }).await;
                    }
                    Ok(())
                },
                agent_client_protocol::on_receive_notification!(),
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
                let mut sessions = match self.open(&cx, open, cwd).await {
                    Ok(sessions) => sessions,
                    Err(reason) => return Err(fail(&self.verdict, reason)),
                };
                let mut queue: VecDeque<Queued> = VecDeque::new();
                // The running turn and the agent's session it runs in.
                let mut running: Option<(String, String)> = None;
                loop {
                    if running.is_none()
                        && let Some(next) = queue.pop_front()
                    {
                        let session = match self.session_for(&cx, &mut sessions, &next.chat).await {
                            Ok(session) => session,
                            Err(reason) => {
                                // The chat's own session could not be had:
                                // its turn fails with the agent's words.
                                self.refuse_turn(next, reason).await;
                                continue;
                            }
                        };
                        running = Some((next.turn_id.clone(), session.clone()));
                        if let Some(model) = &next.model {
                            self.choose_model(&cx, &sessions, &session, model).await;
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
                                let answer = self.configure(&cx, &sessions.main, &values).await;
                                if answer.is_ok() {
                                    self.spread(&cx, &sessions, &sessions.main, &values).await;
                                }
                                let _ = reply.send(answer);
                            }
                            Some(ToAgent::Fork { source, chat, reply }) => {
                                let _ = reply.send(self.fork(&cx, &mut sessions, &source, &chat).await);
                            }
                            Some(ToAgent::SetTitle { title }) => {
                                if self.titles.load(std::sync::atomic::Ordering::Relaxed) {
                                    let params = serde_json::json!({"sessionId": sessions.main, "title": title});
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
                                    for session in sessions.all() {
                                        let request = CloseSessionRequest::new(session.clone());
                                        let _ = tokio::time::timeout(
                                            self.limits.init_timeout,
                                            cx.send_request(request).block_task(),
                                        )
                                        .await;
                                    }
                                }
                                let _ = reply.send(());
                            }
                            Some(ToAgent::Cancel { turn_id }) => {
                                match &running {
                                    Some((id, session)) if *id == turn_id => {
                                        if let Ok(mut m) = self.map.lock() {
                                            m.cancelled();
                                        }
                                        cx.send_notification(CancelNotification::new(session.clone()))?;
                                    }
                                    _ => queue.retain(|q| q.turn_id != turn_id),
                                }
                            }
                            Some(ToAgent::Resume { cwd, additional, reply }) => {
                                let request = ResumeSessionRequest::new(sessions.main.clone(), cwd.clone())
                                    .additional_directories(additional.clone())
                                    .mcp_servers(sessions.mcp_servers.clone());
                                let answer = tokio::time::timeout(
                                    self.limits.init_timeout,
                                    cx.send_request(request).block_task(),
                                )
                                .await;
                                let answer = match answer {
                                    Ok(Ok(_)) => Ok(()),
                                    Ok(Err(err)) => Err(format!("the agent refused: {}", said(&err))),
                                    Err(_) => Err("the agent did not answer session/resume in time".to_owned()),
                                };
                                if answer.is_ok() {
                                    sessions.moved(cwd, additional);
                                }
                                let _ = reply.send(answer);
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
}
