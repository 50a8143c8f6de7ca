//! The session actor: one task per active session, the single writer of its
//! state on this host. It validates dispatches, runs their side effects,
//! appends them through the group committer and applies them, in order.
//!
//! Dispatches that are ready together are handled as one batch: each is
//! validated against the state left by the ones before it, then the batch is
//! appended in one request. If the append fails, or the store reports that
//! an origin already had an outcome (a retry), the actor rebuilds its state
//! from the store, so its state is always the fold of what was committed.

use std::sync::Arc;
use std::time::{Duration, Instant};

use ahp::reducers::ReduceOutcome;
use serde_json::Value;
use tether_protocol::actions::{AGENT_OPENED, SESSION_SETTLED, action_type};
use tether_protocol::channel::Channel;
use tether_protocol::model::{SessionCreated, SessionModel, typed_action};
use tether_protocol::view::SessionView;
use tether_protocol::window::TurnWindow;
use tokio::sync::{mpsc, oneshot};

use super::commit::CommitOutcome;
use super::fanout::{Published, published_from_store};
use super::rules::{check_dispatchable, check_workdirs};
use super::{Ctx, EngineError, Refusal, RefusalKind};
use crate::auth::Principal;
use crate::effects::EffectRequest;
use crate::store::{
    NewEnvelope, Origin, OriginOutcome, Rejection, SessionRecord, Snapshot, now_ms,
};

/// The answer to a dispatch.
#[derive(Debug, Clone)]
pub enum DispatchOutcome {
    /// Accepted (now or, for a retry, originally) as this envelope.
    Accepted(Arc<Published>),
    /// Refused, with its kind and a reason a person can act on.
    Rejected(Refusal),
}

/// One action to validate, apply and commit.
#[derive(Debug)]
pub struct Dispatch {
    /// The dispatching client; `None` for host-originated actions.
    pub origin: Option<Origin>,
    /// Target channel (the session or one of its chats).
    pub channel: String,
    /// The action object.
    pub action: Value,
    /// The caller, checked against the session's project (`None` for the host).
    pub principal: Option<Principal>,
    /// Where the outcome goes.
    pub reply: Option<oneshot::Sender<DispatchOutcome>>,
}

/// A message to a session actor.
#[derive(Debug)]
pub enum Command {
    /// Validate, apply and commit an action.
    Dispatch(Dispatch),
    /// Create the session.
    Create {
        /// Its first record.
        created: SessionCreated,
        /// The outcome.
        reply: oneshot::Sender<Result<SessionView, EngineError>>,
    },
    /// Settle the session for good (closed when resumable, else ended).
    Dispose {
        /// The outcome.
        reply: oneshot::Sender<Result<SessionView, EngineError>>,
    },
    /// A channel's state and the seq it includes, taken together.
    Snapshot {
        /// The session or one of its chats.
        channel: String,
        /// `(state, fromSeq)`, or `None` when the channel is not this session's.
        reply: oneshot::Sender<Result<Option<(Value, u64)>, EngineError>>,
    },
    /// Adds a chat to the session (`session/chatAdded`, host-originated).
    CreateChat {
        /// The new chat's URI.
        chat: String,
        /// The outcome.
        reply: oneshot::Sender<Result<(), EngineError>>,
    },
    /// Resumes the session's agent (ACP `session/resume` semantics).
    Resume {
        /// The caller's primary directory, canonical `file:` URI.
        cwd: String,
        /// The complete new list of additional directories (canonical URIs).
        additional: Vec<String>,
        /// The outcome.
        reply: oneshot::Sender<Result<SessionView, EngineError>>,
    },
    /// At start-up: fail an open turn and settle a session nobody settled.
    Sweep {
        /// Whether anything was written.
        reply: oneshot::Sender<Result<bool, EngineError>>,
    },
    /// Loads older turns of a chat into its window (`fetchTurns`).
    FetchTurns {
        /// The chat's URI.
        chat: String,
        /// A `turnsNextCursor` this host issued; `None`: the next page.
        cursor: Option<String>,
        /// The seq of the `chat/turnsLoaded` committed, if any.
        reply: oneshot::Sender<Result<Option<u64>, EngineError>>,
    },
    /// The session's view.
    View {
        /// `None` when the session does not exist.
        reply: oneshot::Sender<Result<Option<SessionView>, EngineError>>,
    },
}

pub(super) struct SessionActor {
    id: String,
    uri: String,
    ctx: Arc<Ctx>,
    model: Option<SessionModel>,
    /// Whether this process opened the session's agent (it is attached).
    agent_live: bool,
    /// Envelopes committed since the last snapshot was written.
    since_snapshot: u64,
    /// Host-originated actions waiting to be committed (agent answers).
    follow_ups: Vec<(String, Value)>,
    /// The summary root subscribers last heard of (`listSessions`,
    /// `root/sessionAdded`, then each `root/sessionSummaryChanged`).
    announced: Option<Value>,
    /// When the last `root/sessionSummaryChanged` went out.
    announced_at: Instant,
    /// A change of `modifiedAt` alone is waiting for the coalescing window.
    summary_pending: bool,
}

/// How often a session's summary changes of `modifiedAt` alone (every
/// streamed chunk of a turn bumps it) reach root subscribers: at most once
/// per this window, the last one trailing. Every other change goes at once.
const SUMMARY_COALESCE: Duration = Duration::from_secs(1);

/// Summary fields that never change and are never carried in
/// `root/sessionSummaryChanged`.
const SUMMARY_IDENTITY: [&str; 3] = ["resource", "provider", "createdAt"];

/// The mutable fields of `now` that differ from `before`.
fn summary_changes(before: &Value, now: &Value) -> serde_json::Map<String, Value> {
    let mut changes = serde_json::Map::new();
    if let Value::Object(now) = now {
        for (key, value) in now {
            if !SUMMARY_IDENTITY.contains(&key.as_str()) && before.get(key) != Some(value) {
                changes.insert(key.clone(), value.clone());
            }
        }
    }
    changes
}

impl SessionActor {
    /// Loads the session from the store and runs until evicted.
    pub(super) async fn run(id: String, ctx: Arc<Ctx>, mut mailbox: mpsc::Receiver<Command>) {
        let mut actor = SessionActor {
            uri: Channel::session_uri(&id),
            id,
            ctx,
            model: None,
            agent_live: false,
            since_snapshot: 0,
            follow_ups: Vec::new(),
            announced: None,
            announced_at: Instant::now(),
            summary_pending: false,
        };
        if let Err(err) = actor.reload().await {
            tracing::error!(session = %actor.id, error = %err, "cannot load session");
            actor.ctx.forget_actor(&actor.id);
            // Answer what is queued so nobody waits for a dead actor.
            mailbox.close();
            while let Some(command) = mailbox.recv().await {
                actor.fail(command, EngineError::Unavailable(err.clone()));
            }
            return;
        }
        actor.announce(true);
        loop {
            let wait = if actor.summary_pending {
                SUMMARY_COALESCE
            } else {
                actor.ctx.config.actor_idle
            };
            let command = match tokio::time::timeout(wait, mailbox.recv()).await {
                Ok(Some(command)) => command,
                Ok(None) => break,
                Err(_) => {
                    if actor.summary_pending {
                        actor.announce(true);
                        continue;
                    }
                    if actor.ctx.evict_if_idle(&actor.id, &mailbox) {
                        break;
                    }
                    continue;
                }
            };
            match command {
                Command::Dispatch(first) => {
                    let mut batch = vec![first];
                    let mut other = None;
                    while batch.len() < actor.ctx.config.actor_batch {
                        match mailbox.try_recv() {
                            Ok(Command::Dispatch(next)) => batch.push(next),
                            Ok(command) => {
                                other = Some(command);
                                break;
                            }
                            Err(_) => break,
                        }
                    }
                    actor.dispatch_batch(batch).await;
                    actor.run_follow_ups().await;
                    if let Some(command) = other {
                        actor.handle(command).await;
                    }
                }
                command => actor.handle(command).await,
            }
        }
        if actor.summary_pending {
            actor.announce(true);
        }
        actor.write_snapshot().await;
    }

    /// Tells root subscribers which summary fields changed since they last
    /// heard (`root/sessionSummaryChanged`, only the changed mutable
    /// fields). A change of `modifiedAt` alone waits for the coalescing
    /// window unless `now` says it is due. The first call sets the baseline.
    fn announce(&mut self, now: bool) {
        let Some(model) = &self.model else { return };
        let current = super::summary(&self.view(model));
        let Some(before) = &self.announced else {
            self.announced = Some(current);
            return;
        };
        let changes = summary_changes(before, &current);
        if changes.is_empty() {
            self.summary_pending = false;
            return;
        }
        let only_time = changes.keys().all(|key| key == "modifiedAt");
        if only_time && !now && self.announced_at.elapsed() < SUMMARY_COALESCE {
            self.summary_pending = true;
            return;
        }
        self.ctx.hub.notify(
            tether_protocol::channel::ROOT,
            &model.created.project,
            super::notification(
                "root/sessionSummaryChanged",
                serde_json::json!({
                    "channel": tether_protocol::channel::ROOT,
                    "session": self.uri,
                    "changes": changes,
                }),
            ),
        );
        self.announced = Some(current);
        self.announced_at = Instant::now();
        self.summary_pending = false;
    }

    fn fail(&self, command: Command, err: EngineError) {
        match command {
            Command::Dispatch(d) => {
                if let Some(reply) = d.reply {
                    let refusal = Refusal::new(RefusalKind::Unavailable, err.to_string());
                    let _ = reply.send(DispatchOutcome::Rejected(refusal));
                }
            }
            Command::Create { reply, .. } | Command::Dispose { reply } => {
                let _ = reply.send(Err(err));
            }
            Command::Snapshot { reply, .. } => {
                let _ = reply.send(Err(err));
            }
            Command::View { reply } => {
                let _ = reply.send(Err(err));
            }
            Command::CreateChat { reply, .. } => {
                let _ = reply.send(Err(err));
            }
            Command::Resume { reply, .. } => {
                let _ = reply.send(Err(err));
            }
            Command::Sweep { reply } => {
                let _ = reply.send(Err(err));
            }
            Command::FetchTurns { reply, .. } => {
                let _ = reply.send(Err(err));
            }
        }
    }

    async fn handle(&mut self, command: Command) {
        match command {
            Command::Dispatch(d) => {
                self.dispatch_batch(vec![d]).await;
                self.run_follow_ups().await;
            }
            Command::Create { created, reply } => {
                let _ = reply.send(self.create(created).await);
            }
            Command::Dispose { reply } => {
                let _ = reply.send(self.dispose().await);
            }
            Command::Snapshot { channel, reply } => {
                let _ = reply.send(Ok(self.snapshot(&channel)));
            }
            Command::View { reply } => {
                let _ = reply.send(Ok(self.model.as_ref().map(|m| self.view(m))));
            }
            Command::CreateChat { chat, reply } => {
                let _ = reply.send(self.create_chat(chat).await);
            }
            Command::Resume {
                cwd,
                additional,
                reply,
            } => {
                let _ = reply.send(self.resume(cwd, additional).await);
            }
            Command::Sweep { reply } => {
                let _ = reply.send(self.sweep().await);
            }
            Command::FetchTurns {
                chat,
                cursor,
                reply,
            } => {
                let _ = reply.send(self.fetch_turns(chat, cursor).await);
            }
        }
    }

    fn snapshot(&self, channel: &str) -> Option<(Value, u64)> {
        let model = self.model.as_ref()?;
        let state = if channel == self.uri {
            serde_json::to_value(&model.session).ok()?
        } else {
            serde_json::to_value(model.chats.get(channel)?).ok()?
        };
        Some((state, model.last_seq))
    }

    fn view(&self, model: &SessionModel) -> SessionView {
        SessionView::of(model, self.agent_live, &super::rfc3339(now_ms()))
    }

    fn record(&self, model: &SessionModel) -> SessionRecord {
        super::rebuild::record_of(model, self.agent_live, &super::rfc3339(now_ms()))
    }

    /// Rebuilds the model from the latest snapshot plus the transcript tail.
    /// Turns the fold moved out of their windows are archived again (an
    /// upsert): the archive is a cache of the log, and this keeps it whole
    /// after a failed append, a restored database, or a log written before
    /// windows existed.
    async fn reload(&mut self) -> Result<(), String> {
        let mut model = super::rebuild::load_model(self.ctx.store.as_ref(), &self.id, true).await?;
        if let Some(m) = &mut model {
            for chat in m.chats.keys() {
                self.ctx.remember_chat(chat, &self.id);
            }
            for chunk in m.take_trimmed().chunks(ARCHIVE_CHUNK) {
                // The session serves on without them: the archive is a
                // cache of the log, filled again at the next load.
                if let Err(err) = self.ctx.store.archive_turns(chunk).await {
                    tracing::warn!(session = %self.id, error = %err, "turns not archived");
                    break;
                }
            }
        }
        self.model = model;
        Ok(())
    }

    /// Loads older turns of `chat` into its window (`fetchTurns`): commits
    /// `chat/turnsLoaded` and returns its seq, or `None` when nothing older
    /// is left.
    async fn fetch_turns(
        &mut self,
        chat: String,
        cursor: Option<String>,
    ) -> Result<Option<u64>, EngineError> {
        let Some(model) = &self.model else {
            return Err(EngineError::NotFound(format!(
                "Chat {chat} does not exist."
            )));
        };
        if !model.chats.contains_key(&chat) {
            return Err(EngineError::NotFound(format!(
                "Chat {chat} does not exist."
            )));
        }
        let window = model.window(&chat);
        let below = match &cursor {
            None => window.archived,
            Some(cursor) => window.parse(cursor).ok_or_else(|| {
                EngineError::InvalidParams(format!(
                    "params.cursor {cursor:?} is not a turnsNextCursor this host issued for \
                     {chat} (or the chat was truncated since); take the cursor from the chat's \
                     current state."
                ))
            })?,
        };
        if below == 0 || window.archived == 0 {
            return Ok(None);
        }
        let action = turns_loaded(&self.ctx, &chat, window, window.page(below), true)
            .await
            .map_err(|refusal| EngineError::Unavailable(refusal.reason))?;
        self.follow_ups.push((chat, action));
        let outcomes = self.run_follow_ups().await;
        match outcomes.into_iter().next() {
            Some(DispatchOutcome::Accepted(published)) => Ok(Some(published.seq)),
            Some(DispatchOutcome::Rejected(refusal)) => {
                Err(EngineError::Unavailable(refusal.reason))
            }
            None => Err(EngineError::Unavailable(
                "the loaded turns were not recorded; retry".into(),
            )),
        }
    }

    async fn create(&mut self, created: SessionCreated) -> Result<SessionView, EngineError> {
        if self.model.is_some() {
            return Err(EngineError::AlreadyExists(format!(
                "Session {} already exists.",
                self.id
            )));
        }
        let model = SessionModel::created(&self.id, created, 0)
            .map_err(|e| EngineError::InvalidParams(e.to_string()))?;
        let envelope = NewEnvelope {
            channel: self.uri.clone(),
            session_id: Some(self.id.clone()),
            action: model.created.to_action().to_string(),
            origin: None,
            session: Some(self.record(&model)),
            chats: model.chats.keys().cloned().collect(),
            turns: Vec::new(),
        };
        let outcome = self
            .ctx
            .committer
            .append(vec![envelope])
            .await
            .map_err(|e| EngineError::Unavailable(e.to_string()))?;
        let mut model = model;
        if let Some(CommitOutcome::Committed(published)) = outcome.first() {
            model.last_seq = published.seq;
        }
        for chat in model.chats.keys() {
            self.ctx.remember_chat(chat, &self.id);
        }
        self.model = Some(model);
        self.since_snapshot += 1;
        // A new session has no agent yet: it starts dormant, with a settling
        // record, so a restart does not mistake it for an orphan.
        self.follow_ups.push((
            self.uri.clone(),
            serde_json::json!({"type": SESSION_SETTLED, "state": "dormant", "cause": "created"}),
        ));
        self.run_follow_ups().await;
        let model = self.model.as_ref().ok_or_else(|| {
            EngineError::Unavailable("the session could not be reloaded".to_owned())
        })?;
        Ok(self.view(model))
    }

    /// Commits host-originated actions now and reports the first refusal.
    async fn host_actions(&mut self, actions: Vec<(String, Value)>) -> Result<(), EngineError> {
        self.follow_ups.extend(actions);
        for outcome in self.run_follow_ups().await {
            if let DispatchOutcome::Rejected(refusal) = outcome {
                return Err(EngineError::Unavailable(refusal.reason));
            }
        }
        Ok(())
    }

    async fn resume(
        &mut self,
        cwd: String,
        additional: Vec<String>,
    ) -> Result<SessionView, EngineError> {
        let Some(model) = &self.model else {
            return Err(EngineError::NotFound(format!(
                "Session {} does not exist.",
                self.id
            )));
        };
        let (state, _) = model.projection.state(self.agent_live);
        if state == tether_protocol::projection::SessionLifeState::Ended {
            return Err(EngineError::Conflict(format!(
                "Session {} has ended; it cannot be resumed.",
                self.id
            )));
        }
        if !model.projection.resumable() {
            return Err(EngineError::Conflict(format!(
                "Session {} cannot be resumed: its agent never opened it with loadSession.",
                self.id
            )));
        }
        let primary = model.primary_directory().unwrap_or_default().to_owned();
        if primary != cwd {
            return Err(EngineError::InvalidParams(format!(
                "cwd must be the session's primary working directory ({}); a resumed session keeps its primary.",
                tether_protocol::workdir::file_uri_path(&primary).unwrap_or(primary.clone())
            )));
        }
        let current: Vec<String> = model
            .session
            .working_directories
            .clone()
            .unwrap_or_default();
        let mut wanted = vec![primary.clone()];
        for dir in additional {
            if !wanted.contains(&dir) {
                wanted.push(dir);
            }
        }
        let mut actions = vec![(
            self.uri.clone(),
            serde_json::json!({
                "type": AGENT_OPENED,
                "acpSessionRef": model.projection.acp_session_ref,
                "loadSession": model.projection.load_session,
                "resumed": true,
            }),
        )];
        if let Some(agent) = self.ctx.agents.get(&model.session.provider) {
            actions.push((self.uri.clone(), agent.commands_advertisement()));
        }
        // The additional directories are the complete new list.
        for dir in current.iter().skip(1).filter(|d| !wanted.contains(d)) {
            actions.push((
                self.uri.clone(),
                serde_json::json!({"type": "session/workingDirectoryRemoved", "directory": dir}),
            ));
        }
        for dir in wanted.iter().skip(1).filter(|d| !current.contains(d)) {
            actions.push((
                self.uri.clone(),
                serde_json::json!({"type": "session/workingDirectorySet", "directory": dir}),
            ));
        }
        self.host_actions(actions).await?;
        let model = self.model.as_ref().ok_or_else(|| {
            EngineError::Unavailable("the session could not be reloaded".to_owned())
        })?;
        Ok(self.view(model))
    }

    /// The boot sweep: a session with no live agent and no settling record
    /// gets its open turn failed and is settled dormant (resumable) or ended.
    async fn sweep(&mut self) -> Result<bool, EngineError> {
        let Some(model) = &self.model else {
            return Ok(false);
        };
        if self.agent_live || model.projection.settled.is_some() {
            return Ok(false);
        }
        let mut actions = Vec::new();
        if let Some(turn) = &model.projection.open_turn_id {
            let chat = model
                .chats
                .iter()
                .find(|(_, c)| c.active_turn.as_ref().is_some_and(|t| &t.id == turn))
                .map(|(uri, _)| uri.clone());
            if let Some(chat) = chat {
                actions.push((
                    chat,
                    serde_json::json!({
                        "type": "chat/error", "turnId": turn, "duration": 0,
                        "part": {"kind": "error", "error": {
                            "errorType": "process_exited",
                            "message": "The agent's process exited (the host restarted) before the turn finished."
                        }},
                    }),
                ));
            }
        }
        let settle = if model.projection.resumable() {
            "dormant"
        } else {
            "ended"
        };
        actions.push((
            self.uri.clone(),
            serde_json::json!({"type": SESSION_SETTLED, "state": settle, "cause": "process_exited"}),
        ));
        self.host_actions(actions).await?;
        Ok(true)
    }

    async fn create_chat(&mut self, chat: String) -> Result<(), EngineError> {
        let Some(model) = &self.model else {
            return Err(EngineError::NotFound(format!(
                "Session {} does not exist.",
                self.id
            )));
        };
        if model.chats.contains_key(&chat) {
            return Err(EngineError::AlreadyExists(format!(
                "Chat {chat} already exists."
            )));
        }
        let action = serde_json::json!({
            "type": "session/chatAdded",
            "summary": {"resource": chat, "title": "", "status": 1, "modifiedAt": super::rfc3339(now_ms())},
        });
        self.follow_ups.push((self.uri.clone(), action));
        match self.run_follow_ups().await.into_iter().next() {
            Some(DispatchOutcome::Accepted(_)) => Ok(()),
            Some(DispatchOutcome::Rejected(refusal)) => {
                Err(EngineError::Unavailable(refusal.reason))
            }
            None => Err(EngineError::Unavailable(
                "the chat was not recorded".to_owned(),
            )),
        }
    }

    async fn dispose(&mut self) -> Result<SessionView, EngineError> {
        let Some(model) = &self.model else {
            return Err(EngineError::NotFound(format!(
                "Session {} does not exist.",
                self.id
            )));
        };
        let (state, _) = model.projection.state(false);
        if state == tether_protocol::projection::SessionLifeState::Ended
            && model.projection.settled.is_some()
        {
            return Err(EngineError::Conflict(format!(
                "Session {} has already ended.",
                self.id
            )));
        }
        let settle = if model.projection.resumable() {
            "closed"
        } else {
            "ended"
        };
        let action =
            serde_json::json!({"type": SESSION_SETTLED, "state": settle, "cause": "disposed"});
        self.agent_live = false;
        self.follow_ups.push((self.uri.clone(), action));
        let outcomes = self.run_follow_ups().await;
        if let Some(DispatchOutcome::Rejected(refusal)) = outcomes.first() {
            return Err(EngineError::Unavailable(refusal.reason.clone()));
        }
        let model = self.model.as_ref().ok_or_else(|| {
            EngineError::Unavailable("the session could not be reloaded".to_owned())
        })?;
        Ok(self.view(model))
    }

    /// Commits the queued host-originated actions (and any they cause).
    async fn run_follow_ups(&mut self) -> Vec<DispatchOutcome> {
        let mut outcomes = Vec::new();
        // Bounded: an agent answer never causes more than one more round.
        for _ in 0..4 {
            if self.follow_ups.is_empty() {
                break;
            }
            let mut waiting = Vec::new();
            let batch = std::mem::take(&mut self.follow_ups)
                .into_iter()
                .map(|(channel, action)| {
                    let (reply, answer) = oneshot::channel();
                    waiting.push(answer);
                    Dispatch {
                        origin: None,
                        channel,
                        action,
                        principal: None,
                        reply: Some(reply),
                    }
                })
                .collect();
            self.dispatch_batch(batch).await;
            for answer in waiting {
                if let Ok(outcome) = answer.await {
                    outcomes.push(outcome);
                }
            }
        }
        outcomes
    }

    /// Validates, applies and commits a batch; answers every dispatch.
    async fn dispatch_batch(&mut self, batch: Vec<Dispatch>) {
        let Some(model) = self.model.as_mut() else {
            for d in batch {
                let reason = format!("Channel {} does not exist.", d.channel);
                let refusal = Refusal::new(RefusalKind::NotFound, reason);
                reply(d.reply, DispatchOutcome::Rejected(refusal));
            }
            return;
        };
        let agent = self.ctx.agents.get(&model.session.provider).cloned();
        let mut pending = Vec::new();
        let mut records = Vec::new();
        for mut d in batch {
            // An action on a turn outside the loaded window: that turn is
            // loaded first (AHP 1.0), in the same batch, before the action.
            match eager_load(&self.ctx, model, &d).await {
                Ok(Some(load)) => {
                    let typed = typed_action(&load);
                    if let (_, Some(trial)) = model.try_apply(&d.channel, &load, &typed) {
                        model.accept(trial, &load, &typed);
                        records.push(NewEnvelope {
                            channel: d.channel.clone(),
                            session_id: Some(self.id.clone()),
                            action: load.to_string(),
                            origin: None,
                            session: None,
                            chats: Vec::new(),
                            turns: model.take_trimmed(),
                        });
                        let loaded = Dispatch {
                            origin: None,
                            channel: d.channel.clone(),
                            action: load,
                            principal: None,
                            reply: None,
                        };
                        pending.push((loaded, TURNS_LOADED.to_owned()));
                    }
                }
                Ok(None) => {}
                Err(refusal) => {
                    let outcome = self
                        .ctx
                        .reject(d.origin.as_ref(), &d.channel, &d.action, refusal)
                        .await;
                    reply(d.reply, outcome);
                    continue;
                }
            }
            let checked = check_dispatch(&self.ctx, model, agent.as_ref(), &mut d).await;
            match checked {
                Ok(()) => {
                    let kind = action_type(&d.action).unwrap_or_default().to_owned();
                    if kind == AGENT_OPENED {
                        self.agent_live = true;
                    }
                    let mut chats = Vec::new();
                    if kind == "session/chatAdded"
                        && let Some(chat) = d
                            .action
                            .pointer("/summary/resource")
                            .and_then(Value::as_str)
                    {
                        self.ctx.remember_chat(chat, &self.id);
                        chats.push(chat.to_owned());
                    }
                    records.push(NewEnvelope {
                        channel: d.channel.clone(),
                        session_id: Some(self.id.clone()),
                        action: d.action.to_string(),
                        origin: d.origin.clone(),
                        session: None,
                        chats,
                        turns: model.take_trimmed(),
                    });
                    pending.push((d, kind));
                }
                Err(reason) => {
                    let outcome = self
                        .ctx
                        .reject(d.origin.as_ref(), &d.channel, &d.action, reason)
                        .await;
                    reply(d.reply, outcome);
                }
            }
        }
        if pending.is_empty() {
            return;
        }
        // Each envelope carries the read model as it stands after it; the
        // last one's row is what remains, written in the same transaction.
        if let Some(last) = records.last_mut() {
            last.session = Some(self.record(self.model.as_ref().expect("model checked above")));
        }
        let result = self.ctx.committer.append(records).await;
        let mut reload = false;
        match result {
            Err(err) => {
                tracing::warn!(session = %self.id, error = %err, "append failed; rebuilding state");
                for (d, _) in pending {
                    reply(
                        d.reply,
                        DispatchOutcome::Rejected(Refusal::new(
                            RefusalKind::Unavailable,
                            super::STORAGE_UNAVAILABLE,
                        )),
                    );
                }
                reload = true;
            }
            Ok(outcomes) => {
                for ((d, kind), outcome) in pending.into_iter().zip(outcomes) {
                    match outcome {
                        CommitOutcome::Committed(published) => {
                            if let Some(m) = self.model.as_mut() {
                                m.last_seq = published.seq;
                            }
                            self.since_snapshot += 1;
                            if kind == "chat/turnStarted" {
                                self.answer_turn(&d.channel, &d.action, agent.as_ref());
                            }
                            reply(d.reply, DispatchOutcome::Accepted(published));
                        }
                        CommitOutcome::Duplicate(known) => {
                            reload = true;
                            reply(d.reply, retry_outcome(&known, &d.channel, &d.action));
                        }
                    }
                }
            }
        }
        if reload && let Err(err) = self.reload().await {
            tracing::error!(session = %self.id, error = %err, "cannot rebuild session state");
        }
        self.announce(false);
        if self.since_snapshot >= self.ctx.config.snapshot_every {
            self.write_snapshot().await;
        }
    }

    /// Queues the agent's answer to an accepted turn.
    fn answer_turn(&mut self, chat: &str, turn: &Value, agent: Option<&crate::agents::AgentSpec>) {
        let Some(agent) = agent else { return };
        let Some(model) = &self.model else { return };
        if !self.agent_live {
            self.follow_ups.push((
                self.uri.clone(),
                serde_json::json!({
                    "type": AGENT_OPENED,
                    "acpSessionRef": format!("{}:{}", agent.provider, self.id),
                    "loadSession": agent.load_session,
                    "resumed": model.projection.acp_session_ref.is_some(),
                }),
            ));
            self.agent_live = true;
            self.follow_ups
                .push((self.uri.clone(), agent.commands_advertisement()));
        }
        if agent.answers_turns {
            for action in agent.answer_turn(turn) {
                self.follow_ups.push((chat.to_owned(), action));
            }
        }
    }

    async fn write_snapshot(&mut self) {
        let Some(model) = &self.model else { return };
        if self.since_snapshot == 0 {
            return;
        }
        let Ok(state) = serde_json::to_string(model) else {
            return;
        };
        let snapshot = Snapshot {
            channel: self.uri.clone(),
            seq: model.last_seq,
            state,
            at_ms: now_ms(),
        };
        // Written with the next group commit, not in a transaction of its own.
        match self.ctx.committer.snapshot(snapshot).await {
            Ok(()) => self.since_snapshot = 0,
            Err(err) => tracing::warn!(session = %self.id, error = %err, "snapshot not written"),
        }
    }
}

/// The answer to a dispatch whose origin already has an outcome: that
/// outcome when it is a true retry (the same channel and the same action),
/// otherwise a refusal that names the reused sequence number and nothing of
/// the other dispatch (it may be on a channel the caller cannot see). Either
/// way nothing is applied.
pub(super) fn retry_outcome(
    known: &OriginOutcome,
    channel: &str,
    action: &Value,
) -> DispatchOutcome {
    let (first_channel, first_action, origin) = match known {
        OriginOutcome::Accepted(original) => (
            original.channel.as_str(),
            original.action.as_str(),
            original.origin.as_ref(),
        ),
        OriginOutcome::Rejected(first) => (
            first.channel.as_str(),
            first.action.as_str(),
            Some(&first.origin),
        ),
    };
    let same = first_channel == channel
        && serde_json::from_str::<Value>(first_action).is_ok_and(|o| &o == action);
    match known {
        OriginOutcome::Accepted(original) if same => {
            DispatchOutcome::Accepted(Arc::new(published_from_store(original)))
        }
        OriginOutcome::Rejected(first) if same => {
            DispatchOutcome::Rejected(Refusal::new(RefusalKind::Invalid, first.reason.clone()))
        }
        _ => DispatchOutcome::Rejected(Refusal::new(
            RefusalKind::Conflict,
            format!(
                "clientSeq {} of client {:?} was already used for a different dispatch; a client \
                 must not reuse sequence numbers: continue above its highest clientSeq or use a \
                 new clientId.",
                origin.map_or(0, |o| o.client_seq),
                origin.map_or("", |o| o.client_id.as_str()),
            ),
        )),
    }
}

/// The type of the action that loads older turns into a chat's window.
const TURNS_LOADED: &str = "chat/turnsLoaded";

/// Archived turns written per statement when a reload re-archives them.
const ARCHIVE_CHUNK: usize = 500;

/// The most bytes of turns one `chat/turnsLoaded` carries: clients cap the
/// messages they read (the upstream Rust client at 16 MiB), and a page of
/// turns must fit one with room to spare.
const MAX_LOAD_BYTES: usize = 4 * 1024 * 1024;

/// The `chat/turnsLoaded` that brings `ordinals` of `chat` back from the
/// archive into its window. With `partial`, a range over the byte budget is
/// cut from its old end (the cursor then points at what is left); without,
/// it is refused.
async fn turns_loaded(
    ctx: &Ctx,
    chat: &str,
    window: TurnWindow,
    ordinals: std::ops::Range<u64>,
    partial: bool,
) -> Result<Value, Refusal> {
    let unavailable = |reason: String| Refusal::new(RefusalKind::Unavailable, reason);
    let turns = ctx
        .store
        .archived_turns(chat, window.generation, ordinals.clone())
        .await
        .map_err(|e| unavailable(format!("The turn archive is unavailable ({e}); retry.")))?;
    let contiguous = turns
        .iter()
        .zip(ordinals.clone())
        .all(|(turn, ordinal)| turn.ordinal == ordinal);
    if turns.len() as u64 != ordinals.end - ordinals.start || !contiguous {
        return Err(unavailable(format!(
            "The turn archive of {chat} lacks turns {}..{}; it is rebuilt from the transcript \
             when the session next loads.",
            ordinals.start, ordinals.end
        )));
    }
    let mut bytes = 0;
    let mut start = ordinals.end;
    for turn in turns.iter().rev() {
        if bytes + turn.body.len() > MAX_LOAD_BYTES && start < ordinals.end {
            if !partial {
                return Err(Refusal::new(
                    RefusalKind::Invalid,
                    format!(
                        "The turn this action refers to is {} turns back, more than one load \
                         of {MAX_LOAD_BYTES} bytes holds; load older turns with fetchTurns first.",
                        ordinals.end - ordinals.start
                    ),
                ));
            }
            break;
        }
        bytes += turn.body.len();
        start = turn.ordinal;
    }
    let mut bodies = Vec::with_capacity(turns.len());
    for turn in turns.iter().filter(|t| t.ordinal >= start) {
        bodies.push(serde_json::from_str::<Value>(&turn.body).map_err(|e| {
            unavailable(format!(
                "Archived turn {} of {chat} is unreadable: {e}.",
                turn.ordinal
            ))
        })?);
    }
    let mut action = serde_json::json!({"type": TURNS_LOADED, "turns": bodies});
    if let Some(cursor) = window.cursor(start) {
        action["turnsNextCursor"] = Value::String(cursor);
    }
    Ok(action)
}

/// A new turn's id must be new to its chat, the archived turns included:
/// turns are numbered by position and `chat/turnsLoaded` drops the ids a
/// window already has, so a reused id would shift every older turn.
async fn check_new_turn_id(
    ctx: &Ctx,
    model: &SessionModel,
    chat: &str,
    action: &Value,
) -> Result<(), Refusal> {
    let Some(turn_id) = action.get("turnId").and_then(Value::as_str) else {
        return Ok(());
    };
    let Some(state) = model.chats.get(chat) else {
        return Ok(());
    };
    let reused = || {
        Refusal::new(
            RefusalKind::Invalid,
            format!("Turn id {turn_id:?} is already used in {chat}; start the turn with a new id."),
        )
    };
    if state.turns.iter().any(|t| t.id == turn_id)
        || state.active_turn.as_ref().is_some_and(|t| t.id == turn_id)
    {
        return Err(reused());
    }
    let window = model.window(chat);
    if window.archived == 0 {
        return Ok(());
    }
    match ctx
        .store
        .archived_ordinal(chat, window.generation, turn_id)
        .await
    {
        Ok(Some(ordinal)) if ordinal < window.archived => Err(reused()),
        Ok(_) => Ok(()),
        Err(err) => Err(Refusal::new(
            RefusalKind::Unavailable,
            format!("The turn archive is unavailable ({err}); retry."),
        )),
    }
}

/// AHP 1.0: before applying an action that refers to a turn outside the
/// loaded window, the host loads that turn (and those after it, so the
/// window stays unbroken). Today `chat/truncated {turnId}` is the one such
/// action a client may dispatch.
async fn eager_load(
    ctx: &Ctx,
    model: &SessionModel,
    d: &Dispatch,
) -> Result<Option<Value>, Refusal> {
    if d.origin.is_none() || action_type(&d.action) != Some("chat/truncated") {
        return Ok(None);
    }
    // Nothing is loaded for a caller the dispatch itself would refuse: one
    // that may not see or drive the session, or a session that has ended
    // (`check_dispatch` then answers, as for any dispatch).
    let ended = matches!(model.projection.settled.as_ref(),
        Some(s) if s.state == tether_protocol::projection::SessionLifeState::Ended);
    let allowed = d
        .principal
        .as_ref()
        .is_some_and(|p| p.can_write() && p.can_see(&model.created.project));
    if ended || !allowed {
        return Ok(None);
    }
    let Some(turn_id) = d.action.get("turnId").and_then(Value::as_str) else {
        return Ok(None);
    };
    let Some(chat) = model.chats.get(&d.channel) else {
        return Ok(None);
    };
    let window = model.window(&d.channel);
    if window.archived == 0 || chat.turns.iter().any(|t| t.id == turn_id) {
        return Ok(None);
    }
    let ordinal = ctx
        .store
        .archived_ordinal(&d.channel, window.generation, turn_id)
        .await
        .map_err(|e| {
            Refusal::new(
                RefusalKind::Unavailable,
                format!("The turn archive is unavailable ({e}); retry."),
            )
        })?;
    match ordinal {
        Some(ordinal) if ordinal < window.archived => {
            turns_loaded(ctx, &d.channel, window, ordinal..window.archived, false)
                .await
                .map(Some)
        }
        _ => Ok(None),
    }
}

fn reply(to: Option<oneshot::Sender<DispatchOutcome>>, outcome: DispatchOutcome) {
    if let Some(to) = to {
        let _ = to.send(outcome);
    }
}

/// Runs the whole validation pipeline for one dispatch and, when it passes,
/// applies it to `model`. Client dispatches get every rule and the side
/// effect; host-originated ones only the reducer.
async fn check_dispatch(
    ctx: &Ctx,
    model: &mut SessionModel,
    agent: Option<&crate::agents::AgentSpec>,
    d: &mut Dispatch,
) -> Result<(), Refusal> {
    if let Some(principal) = &d.principal
        && !principal.can_see(&model.created.project)
    {
        return Err(Refusal::new(
            RefusalKind::NotFound,
            format!("Channel {} does not exist.", d.channel),
        ));
    }
    let channel = Channel::parse(&d.channel).map_err(|e| e.to_string())?;
    if matches!(channel, Channel::Chat(_)) && !model.chats.contains_key(&d.channel) {
        // A chat the session removed (or never had).
        return Err(Refusal::new(
            RefusalKind::NotFound,
            format!("Channel {} does not exist.", d.channel),
        ));
    }
    let kind = if d.origin.is_some() {
        let host_actions = d
            .principal
            .as_ref()
            .is_some_and(Principal::can_dispatch_host_actions);
        let kind = check_dispatchable(&channel, &d.action, host_actions)?.to_owned();
        if matches!(model.projection.settled.as_ref(), Some(s) if s.state == tether_protocol::projection::SessionLifeState::Ended)
        {
            return Err(Refusal::new(
                RefusalKind::Conflict,
                format!(
                    "Session {} has ended; it accepts no more actions. Start a new session.",
                    model.id
                ),
            ));
        }
        let caps = agent.map(|a| a.workdirs).unwrap_or_default();
        check_workdirs(model, caps, &kind, &mut d.action)?;
        if kind == "chat/turnStarted" {
            check_new_turn_id(ctx, model, &d.channel, &d.action).await?;
        }
        kind
    } else {
        action_type(&d.action).unwrap_or_default().to_owned()
    };
    let typed = typed_action(&d.action);
    if matches!(typed, ahp_types::actions::StateAction::Unknown(_)) && !kind.starts_with("x-") {
        return Err(format!(
            "Action {kind} is malformed: a field is missing or has the wrong type (see the AHP \
             1.0 action reference)."
        )
        .into());
    }
    let (outcome, trial) = model.try_apply(&d.channel, &d.action, &typed);
    let trial = match (outcome, trial) {
        (ReduceOutcome::Applied | ReduceOutcome::NoOp, Some(trial)) => trial,
        (ReduceOutcome::Invalid(err), _) => {
            return Err(format!(
                "Action {kind} is not valid in the session's current state: {err:?}."
            )
            .into());
        }
        _ => {
            return Err(format!("Action {kind} does not apply to {}.", d.channel).into());
        }
    };
    if let Some(origin) = &d.origin {
        let request = EffectRequest {
            channel: &d.channel,
            action: &d.action,
            state: &model.session,
            origin: Some((&origin.client_id, origin.client_seq)),
        };
        let timeout = ctx.config.effect_timeout;
        match tokio::time::timeout(timeout, ctx.effects.apply(&request)).await {
            Ok(result) => result?,
            Err(_) => {
                return Err(Refusal::new(
                    RefusalKind::Unavailable,
                    format!(
                        "The side-effect backend is unavailable: it did not answer within {} ms; \
                         try again later.",
                        timeout.as_millis()
                    ),
                ));
            }
        }
    }
    model.accept(trial, &d.action, &typed);
    Ok(())
}

impl Ctx {
    /// Records a rejection (for client dispatches) and returns the outcome
    /// that holds: an earlier acceptance of the same origin wins.
    pub(super) async fn reject(
        &self,
        origin: Option<&Origin>,
        channel: &str,
        action: &Value,
        refusal: Refusal,
    ) -> DispatchOutcome {
        self.metrics
            .rejections
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let Some(origin) = origin else {
            tracing::warn!(%channel, reason = %refusal.reason, "host-originated action refused");
            return DispatchOutcome::Rejected(refusal);
        };
        // A transient failure is not the origin's outcome: a retry may pass.
        // Nor is a missing channel: it may exist by the time of the retry.
        if matches!(
            refusal.kind,
            RefusalKind::Unavailable | RefusalKind::NotFound
        ) {
            return DispatchOutcome::Rejected(refusal);
        }
        let reason = refusal.reason.clone();
        let rejection = Rejection {
            origin: origin.clone(),
            channel: channel.to_owned(),
            action: action.to_string(),
            reason: reason.clone(),
            at_ms: now_ms(),
        };
        match self.store.record_rejection(rejection).await {
            Ok(OriginOutcome::Rejected(first)) if first.reason == refusal.reason => {
                DispatchOutcome::Rejected(refusal)
            }
            Ok(known) => retry_outcome(&known, channel, action),
            Err(err) => {
                tracing::warn!(error = %err, "rejection not recorded");
                DispatchOutcome::Rejected(refusal)
            }
        }
    }
}
