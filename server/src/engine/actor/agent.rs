//! The session actor's side of an ACP agent: starting the process on the
//! first turn, committing what it says (in order, host-originated, before
//! anyone sees it), routing a client's answer to a permission request and a
//! cancelled turn back to it, and settling the session when it goes away.

use std::collections::HashMap;
use std::path::PathBuf;

use serde_json::{Value, json};
use tether_protocol::actions::{AGENT_OPENED, SESSION_SETTLED};
use tether_protocol::workdir::file_uri_path;
use tokio::sync::{OwnedSemaphorePermit, oneshot};

use super::SessionActor;
use crate::agents::AgentSpec;
use crate::agents::acp::{
    self, AgentEvent, AgentProcess, InputAnswer, OpenMode, OpenRequest, PermissionAnswer,
};

/// A running agent process and what it holds of the session.
#[derive(Debug)]
pub(super) struct Running {
    pub(super) process: AgentProcess,
    /// The process's place in the host's limit.
    _slot: OwnedSemaphorePermit,
    /// Permission requests waiting for a client, by `(chat, toolCallId)`.
    permissions: HashMap<(String, String), Permission>,
    /// When the agent last had something to do.
    pub(super) last_active: tokio::time::Instant,
    /// Whether a turn is out with it.
    pub(super) busy: bool,
    /// The turn it is answering: `(chat, turnId)` (its MCP tool calls
    /// belong there).
    pub(super) turn: Option<(String, String)>,
    /// Questions waiting for a client, by `(chat, requestId)`.
    inputs: HashMap<(String, String), Question>,
    /// Whether it opened the session (an agent that could not, for want
    /// of a login say, leaves the session dormant, not ended).
    opened: bool,
    /// The working directories it was started on (resolved): a confined
    /// process can reach these and no others.
    dirs: Vec<PathBuf>,
    /// The session's directories changed beyond `dirs` while it ran: a
    /// confined process cannot be given more, so it is started again
    /// (reopening its session) before its next turn.
    stale: bool,
}

/// A question of the agent's waiting for an answer.
#[derive(Debug)]
struct Question {
    turn_id: String,
    answer: oneshot::Sender<InputAnswer>,
    /// When it is given up (the agent is told it was cancelled).
    deadline: tokio::time::Instant,
}

#[derive(Debug)]
struct Permission {
    turn_id: String,
    /// `(optionId, approves)`.
    options: Vec<(String, bool)>,
    answer: oneshot::Sender<PermissionAnswer>,
}

/// Most agent events committed together.
const EVENT_BATCH: usize = 256;

impl SessionActor {
    /// Starts the session's ACP agent (new, or reopening the agent's own
    /// session when the transcript holds one it can load), bounded by the
    /// host's process limit.
    /// `dirs`: the working directories to open with, when not the
    /// session's current ones (a resume's complete new list).
    pub(super) fn start_agent(
        &mut self,
        spec: &AgentSpec,
        reopen: bool,
        dirs: Option<&[String]>,
    ) -> Result<(), String> {
        let Some(command) = spec.acp_command() else {
            return Err(format!("agent {} is not an ACP agent", spec.provider));
        };
        let Some(model) = &self.model else {
            return Err("the session is not loaded".to_owned());
        };
        let slot = self
            .ctx
            .agent_slots
            .clone()
            .try_acquire_owned()
            .map_err(|_| {
                format!(
                    "this host already runs its maximum of {} agent processes (--max-agents); \
                 try again when another session's agent has stopped",
                    self.ctx.config.max_agents
                )
            })?;
        let current = model
            .session
            .working_directories
            .as_deref()
            .unwrap_or_default();
        // The directories as they are now, resolved and held to the roots
        // again: a symlink changed since they were accepted does not lead
        // the agent (or its confinement) elsewhere.
        let dirs: Vec<PathBuf> = dirs
            .unwrap_or(current)
            .iter()
            .map(|uri| {
                self.ctx
                    .config
                    .roots
                    .resolve_uri(&model.created.project, uri)
            })
            .collect::<Result<_, _>>()
            .map_err(|reason| reason.trim_end_matches('.').to_owned())?;
        let mode = match &model.projection.acp_session_ref {
            Some(reference) if reopen && model.projection.load_session => {
                OpenMode::Reopen(reference.clone())
            }
            _ => OpenMode::New,
        };
        let mcp = self.ctx.mcp.endpoint(&self.id).map(|e| (e.url, e.token));
        let open = OpenRequest {
            session_uri: self.uri.clone(),
            session_id: self.id.clone(),
            dirs: dirs.clone(),
            mode,
            mcp,
            config: model
                .session
                .config
                .as_ref()
                .and_then(|c| serde_json::to_value(c).ok()),
            chats: if reopen {
                model.projection.acp_chat_refs.clone()
            } else {
                Default::default()
            },
        };
        let process = acp::spawn(
            command,
            open,
            self.ctx.config.acp.clone(),
            &self.ctx.config.sandbox,
            self.ctx.store.clone(),
            self.ctx.terminals.clone(),
        )?;
        tracing::info!(session = %self.id, agent = %spec.provider, "agent process started");
        self.running = Some(Running {
            process,
            _slot: slot,
            permissions: HashMap::new(),
            last_active: tokio::time::Instant::now(),
            busy: false,
            turn: None,
            inputs: HashMap::new(),
            opened: false,
            dirs,
            stale: false,
        });
        Ok(())
    }

    /// After a committed working-directory change: a confined agent process
    /// that cannot reach the session's new directories is marked to be
    /// started again before its next turn (Landlock never widens a running
    /// process's reach).
    pub(super) fn note_directories(&mut self, kind: &str) {
        if !tether_protocol::actions::is_session_workdir_action(kind)
            || !self.ctx.config.sandbox.confines()
        {
            return;
        }
        let (Some(running), Some(model)) = (&mut self.running, &self.model) else {
            return;
        };
        let covered = model
            .session
            .working_directories
            .iter()
            .flatten()
            .all(|uri| {
                self.ctx
                    .config
                    .roots
                    .resolve_uri(&model.created.project, uri)
                    .is_ok_and(|dir| running.dirs.iter().any(|d| dir.starts_with(d)))
            });
        if !covered {
            running.stale = true;
        }
    }

    /// Hands an accepted turn to the ACP agent, starting it first.
    pub(super) fn prompt_agent(&mut self, spec: &AgentSpec, chat: &str, turn: &Value) {
        let turn_id = turn
            .get("turnId")
            .and_then(Value::as_str)
            .unwrap_or_default();
        if self.running.as_ref().is_some_and(|r| r.stale && !r.busy) {
            tracing::info!(session = %self.id, agent = %spec.provider,
                "starting the agent again: its confinement does not reach the session's new directories");
            self.running = None;
        }
        if self.running.is_none()
            && let Err(reason) = self.start_agent(spec, true, None)
        {
            tracing::warn!(session = %self.id, agent = %spec.provider, %reason, "agent not started");
            self.follow_ups.push((
                chat.to_owned(),
                turn_error(
                    turn_id,
                    "agent_unavailable",
                    &format!(
                        "The agent {} could not be started: {reason}.",
                        spec.provider
                    ),
                ),
            ));
            return;
        }
        if let Some(running) = &mut self.running {
            running.busy = true;
            running.turn = Some((chat.to_owned(), turn_id.to_owned()));
            running.last_active = tokio::time::Instant::now();
            running.process.prompt(chat, turn_id, &turn["message"]);
        }
    }

    /// A client's committed action that the agent must hear of: a cancelled
    /// turn, or an answer to a permission request.
    pub(super) fn tell_agent(&mut self, chat: &str, kind: &str, action: &Value) {
        let Some(running) = &mut self.running else {
            return;
        };
        match kind {
            "session/titleChanged" => {
                if let Some(title) = action.get("title").and_then(Value::as_str) {
                    running.process.set_title(title);
                }
            }
            "chat/turnCancelled" => {
                let turn_id = action
                    .get("turnId")
                    .and_then(Value::as_str)
                    .unwrap_or_default();
                running.process.cancel(turn_id);
                // The turn is over in AHP now, and the map drops what the
                // agent says of it after: its `cancelled` stop reason ends
                // nothing, so the process is free from here (else it would
                // stay busy, never stopped when idle, its slot held).
                if running
                    .turn
                    .as_ref()
                    .is_some_and(|(c, t)| c == chat && t == turn_id)
                {
                    running.busy = false;
                    running.turn = None;
                    running.last_active = tokio::time::Instant::now();
                }
                // ACP: pending permission requests of a cancelled turn are
                // answered `cancelled`.
                let keys: Vec<_> = running
                    .permissions
                    .iter()
                    .filter(|(_, p)| p.turn_id == turn_id)
                    .map(|(k, _)| k.clone())
                    .collect();
                for key in keys {
                    if let Some(p) = running.permissions.remove(&key) {
                        let _ = p.answer.send(PermissionAnswer::Cancelled);
                    }
                }
                self.drop_questions(|q| q.turn_id == turn_id, false);
            }
            "chat/inputCompleted" => {
                let request = action
                    .get("requestId")
                    .and_then(Value::as_str)
                    .unwrap_or_default();
                let Some(question) = running
                    .inputs
                    .remove(&(chat.to_owned(), request.to_owned()))
                else {
                    return;
                };
                let response = action
                    .get("response")
                    .and_then(Value::as_str)
                    .unwrap_or("cancel")
                    .to_owned();
                // The answers as the reducer settled them: drafts given
                // before, with the completion's own on top.
                let answers = self
                    .model
                    .as_ref()
                    .and_then(|m| answered(m, chat, request))
                    .or_else(|| action.get("answers").cloned())
                    .unwrap_or(Value::Null);
                let _ = question.answer.send(InputAnswer { response, answers });
                self.follow_ups.push((
                    self.uri.clone(),
                    json!({"type": "session/inputNeededRemoved", "id": format!("{chat}#{request}")}),
                ));
            }
            "chat/toolCallConfirmed" => {
                let tool = action
                    .get("toolCallId")
                    .and_then(Value::as_str)
                    .unwrap_or_default();
                let Some(p) = running
                    .permissions
                    .remove(&(chat.to_owned(), tool.to_owned()))
                else {
                    return;
                };
                let approved = action
                    .get("approved")
                    .and_then(Value::as_bool)
                    .unwrap_or(false);
                let selected = action.get("selectedOptionId").and_then(Value::as_str);
                let choice = selected
                    .and_then(|id| p.options.iter().find(|(o, _)| o == id))
                    .or_else(|| p.options.iter().find(|(_, approves)| *approves == approved))
                    .map(|(id, _)| id.clone());
                let answer = choice.map_or(PermissionAnswer::Cancelled, PermissionAnswer::Selected);
                let _ = p.answer.send(answer);
            }
            _ => {}
        }
    }

    /// Gives up the questions `which` selects: the agent is told they were
    /// cancelled, and their input-needed entries go; with `record`, a
    /// `chat/inputCompleted` (cancel) is recorded too (a timeout, while the
    /// turn still runs).
    fn drop_questions(&mut self, which: impl Fn(&Question) -> bool, record: bool) {
        let Some(running) = &mut self.running else {
            return;
        };
        let keys: Vec<_> = running
            .inputs
            .iter()
            .filter(|(_, q)| which(q))
            .map(|(k, _)| k.clone())
            .collect();
        for (chat, request) in keys {
            if let Some(question) = running.inputs.remove(&(chat.clone(), request.clone())) {
                let _ = question.answer.send(InputAnswer::cancelled());
            }
            if record {
                self.follow_ups.push((
                    chat.clone(),
                    json!({"type": "chat/inputCompleted", "requestId": request, "response": "cancel"}),
                ));
            }
            self.follow_ups.push((
                self.uri.clone(),
                json!({"type": "session/inputNeededRemoved", "id": format!("{chat}#{request}")}),
            ));
        }
    }

    /// Questions nobody answered in time are cancelled, as the agent is
    /// told.
    pub(super) fn expire_questions(&mut self) {
        let now = tokio::time::Instant::now();
        self.drop_questions(|q| q.deadline <= now, true);
    }

    /// When the next question times out, if one waits.
    pub(super) fn next_question_deadline(&self) -> Option<tokio::time::Instant> {
        self.running
            .as_ref()
            .and_then(|r| r.inputs.values().map(|q| q.deadline).min())
    }

    /// Commits what the agent said; more events that are already waiting
    /// are committed in the same batch.
    pub(super) async fn on_agent_event(&mut self, first: Option<AgentEvent>) {
        let mut event = first;
        let mut taken = 0;
        while let Some(next) = event.take() {
            taken += 1;
            if let Some(running) = &mut self.running {
                running.last_active = tokio::time::Instant::now();
            }
            match next {
                AgentEvent::Opened {
                    acp_session_ref,
                    load_session,
                    resumed,
                } => {
                    self.agent_live = true;
                    if let Some(running) = &mut self.running {
                        running.opened = true;
                    }
                    self.follow_ups.push((
                        self.uri.clone(),
                        json!({"type": AGENT_OPENED, "acpSessionRef": acp_session_ref,
                               "loadSession": load_session, "resumed": resumed}),
                    ));
                }
                AgentEvent::ChatOpened {
                    chat,
                    acp_session_ref,
                    resumed,
                } => {
                    self.follow_ups.push((
                        self.uri.clone(),
                        json!({"type": AGENT_OPENED, "acpSessionRef": acp_session_ref,
                               "resumed": resumed, "chat": chat}),
                    ));
                }
                AgentEvent::Actions(actions) => {
                    let ended: Vec<String> = actions
                        .iter()
                        .filter(|(_, a)| ends_turn(a))
                        .filter_map(|(_, a)| a["turnId"].as_str().map(str::to_owned))
                        .collect();
                    if let Some(running) = &mut self.running
                        && !ended.is_empty()
                    {
                        running.busy = false;
                        running.turn = None;
                    }
                    self.follow_ups.extend(actions);
                    // A question of a turn that ended is answered no more.
                    self.drop_questions(|q| ended.contains(&q.turn_id), false);
                }
                AgentEvent::Permission {
                    chat,
                    turn_id,
                    tool_call_id,
                    options,
                    actions,
                    answer,
                } => {
                    self.follow_ups.extend(actions);
                    if let Some(running) = &mut self.running {
                        running.permissions.insert(
                            (chat, tool_call_id),
                            Permission {
                                turn_id,
                                options,
                                answer,
                            },
                        );
                    }
                }
                AgentEvent::Input {
                    chat,
                    turn_id,
                    request_id,
                    actions,
                    answer,
                } => {
                    self.follow_ups.extend(actions);
                    if let Some(running) = &mut self.running {
                        let deadline = tokio::time::Instant::now() + self.ctx.config.input_timeout;
                        running.inputs.insert(
                            (chat, request_id),
                            Question {
                                turn_id,
                                answer,
                                deadline,
                            },
                        );
                    }
                }
                AgentEvent::InputDone { chat, request_id } => {
                    let key = (chat, request_id);
                    if let Some(question) = self
                        .running
                        .as_mut()
                        .and_then(|running| running.inputs.remove(&key))
                    {
                        let (chat, request) = key;
                        let _ = question.answer.send(InputAnswer {
                            response: "accept".to_owned(),
                            answers: Value::Null,
                        });
                        self.follow_ups.push((
                            chat.clone(),
                            json!({"type": "chat/inputCompleted", "requestId": request, "response": "accept"}),
                        ));
                        self.follow_ups.push((
                            self.uri.clone(),
                            json!({"type": "session/inputNeededRemoved", "id": format!("{chat}#{request}")}),
                        ));
                    }
                }
                AgentEvent::Exited { reason } => {
                    self.drop_questions(|_| true, false);
                    let opened = self.running.take().is_some_and(|r| r.opened);
                    if opened {
                        let message = format!(
                            "The agent's process stopped before the turn finished: {reason}."
                        );
                        self.settle_after_agent("process_exited", &message, true);
                    } else {
                        // It never opened the session: nothing of the
                        // session was lost, and the next turn tries again
                        // (once its login or command is fixed).
                        let message = format!("The agent could not open the session: {reason}.");
                        self.settle_after_agent("agent_unavailable", &message, false);
                    }
                    break;
                }
            }
            if taken >= EVENT_BATCH {
                break;
            }
            event = self
                .running
                .as_mut()
                .and_then(|r| r.process.events.try_recv());
        }
        if taken == 0 {
            // The bridge ended without a word (the actor let it go).
            self.running = None;
            self.agent_live = false;
        }
        self.run_follow_ups().await;
    }

    /// Reopens the ACP agent for `POST /v1/sessions/{id}/resume` with the
    /// complete new list of directories: a running process gets
    /// `session/resume`; otherwise a new one opens the agent's session
    /// (`session/resume`, or `session/load` with its replay dropped). The
    /// `x-tether/agentOpened` to record, or why the agent could not.
    pub(super) async fn reopen_agent(
        &mut self,
        spec: &AgentSpec,
        dirs: &[String],
    ) -> Result<Value, String> {
        let reference = self
            .model
            .as_ref()
            .and_then(|m| m.projection.acp_session_ref.clone())
            .unwrap_or_default();
        if let Some(running) = &self.running {
            let paths: Vec<PathBuf> = dirs
                .iter()
                .filter_map(|uri| file_uri_path(uri).ok().map(PathBuf::from))
                .collect();
            let cwd = paths.first().cloned().unwrap_or_else(|| PathBuf::from("/"));
            running
                .process
                .resume(cwd, paths.into_iter().skip(1).collect())
                .await?;
            return Ok(json!({"type": AGENT_OPENED, "acpSessionRef": reference,
                             "loadSession": true, "resumed": true}));
        }
        self.start_agent(spec, true, Some(dirs))?;
        let wait = self.ctx.config.acp.init_timeout + std::time::Duration::from_secs(1);
        let first = match &mut self.running {
            Some(running) => tokio::time::timeout(wait, running.process.events.recv()).await,
            None => return Err("the agent did not start".to_owned()),
        };
        match first {
            Ok(Some(AgentEvent::Opened {
                acp_session_ref,
                load_session,
                resumed,
            })) => Ok(
                json!({"type": AGENT_OPENED, "acpSessionRef": acp_session_ref,
                             "loadSession": load_session, "resumed": resumed}),
            ),
            Ok(Some(AgentEvent::Exited { reason })) => {
                self.running = None;
                Err(reason)
            }
            Ok(_) | Err(_) => {
                self.running = None;
                Err("the agent did not reopen its session in time".to_owned())
            }
        }
    }

    /// Stops an agent that has had nothing to do for `agent_idle`, and
    /// settles the session as if its process had exited.
    pub(super) async fn stop_idle_agent(&mut self) -> bool {
        let Some(running) = &self.running else {
            return false;
        };
        if running.busy || running.last_active.elapsed() < self.ctx.config.agent_idle {
            return false;
        }
        tracing::info!(session = %self.id, "stopping an idle agent process");
        self.running = None;
        self.settle_after_agent("idle", "The agent was stopped after being idle.", false);
        self.run_follow_ups().await;
        true
    }

    /// At shutdown: stops a running agent (its process group is killed
    /// when the handle drops), fails its open turn and settles the session
    /// dormant, so a client resumes it on another host or after a restart.
    pub(super) async fn stop_agent_for_shutdown(&mut self) {
        if self.running.take().is_none() {
            return;
        }
        tracing::info!(session = %self.id, "stopping the agent: the server is shutting down");
        self.settle_after_agent(
            "shutdown",
            "The server shut down during the turn; resume the session to continue.",
            false,
        );
        self.run_follow_ups().await;
    }

    /// Queues the records of an agent that is gone: every open turn failed,
    /// the session settled dormant; after a crash (`crashed`), ended unless
    /// it can be resumed. A dormant session's next turn starts the agent
    /// again.
    fn settle_after_agent(&mut self, cause: &str, message: &str, crashed: bool) {
        self.agent_live = false;
        let Some(model) = &self.model else { return };
        for (chat, state) in &model.chats {
            if let Some(turn) = &state.active_turn {
                self.follow_ups.push((
                    chat.clone(),
                    turn_error(&turn.id, "process_exited", message),
                ));
            }
        }
        let state = if model.projection.resumable() || !crashed {
            "dormant"
        } else {
            "ended"
        };
        self.follow_ups.push((
            self.uri.clone(),
            json!({"type": SESSION_SETTLED, "state": state, "cause": cause}),
        ));
    }
}

fn ends_turn(action: &Value) -> bool {
    matches!(
        action.get("type").and_then(Value::as_str),
        Some("chat/turnComplete" | "chat/turnCancelled" | "chat/error")
    )
}

/// The answers of a completed input request in a chat's current turn, as
/// its state holds them.
fn answered(
    model: &tether_protocol::model::SessionModel,
    chat: &str,
    request: &str,
) -> Option<Value> {
    let turn = model.chats.get(chat)?.active_turn.as_ref()?;
    let parts = serde_json::to_value(&turn.response_parts).ok()?;
    parts.as_array()?.iter().find_map(|part| {
        (part["kind"] == "inputRequest" && part["request"]["id"] == request)
            .then(|| part["request"]["answers"].clone())
            .filter(|a| !a.is_null())
    })
}

fn turn_error(turn_id: &str, error_type: &str, message: &str) -> Value {
    json!({"type": "chat/error", "turnId": turn_id, "duration": 0,
           "part": {"kind": "error", "error": {"errorType": error_type, "message": message}}})
}
