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

use serde_json::Value;
use tether_protocol::actions::{AGENT_OPENED, SESSION_SETTLED, action_type};
use tether_protocol::channel::{Channel, ROOT};
use tether_protocol::model::{SessionCreated, SessionModel, typed_action};
use tether_protocol::view::SessionView;
use tokio::sync::{mpsc, oneshot};

pub use super::command::{Command, Dispatch, DispatchOutcome};
use super::commit::CommitOutcome;
use super::forward::ProxyEnd;
use super::summary::{Announcer, SUMMARY_COALESCE};
use super::turns::{ARCHIVE_CHUNK, TURNS_LOADED, eager_load, turns_loaded};
use super::validate::{check_dispatch, retry_outcome};
use super::{Ctx, EngineError, Refusal, RefusalKind};

use crate::store::{NewEnvelope, SessionRecord, Snapshot, now_ms};

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
    /// What root subscribers last heard of its summary.
    announcer: Announcer,
    /// Another host took the lease: stop after the current command.
    stepped_down: bool,
}

impl SessionActor {
    /// Loads the session from the store and runs until evicted.
    ///
    /// With several hosts it starts as a proxy (see `forward`) and becomes
    /// the session's writer only once it holds the lease; it lets the lease
    /// go when it stops.
    pub(super) async fn run(id: String, ctx: Arc<Ctx>, mut mailbox: mpsc::Receiver<Command>) {
        let mut first = None;
        let mut taken_from = None;
        if let Some(cluster) = ctx.cluster.clone() {
            match super::forward::run_proxy(&id, &ctx, &cluster, &mut mailbox).await {
                ProxyEnd::Stopped => return,
                ProxyEnd::TakeOver { command, from } => {
                    first = Some(command);
                    taken_from = from;
                }
            }
        }
        let mut actor = SessionActor {
            uri: Channel::session_uri(&id),
            id,
            ctx,
            model: None,
            agent_live: false,
            since_snapshot: 0,
            follow_ups: Vec::new(),
            announcer: Announcer::new(),
            stepped_down: false,
        };
        if let Err(err) = actor.reload().await {
            tracing::error!(session = %actor.id, error = %err, "cannot load session");
            actor.ctx.forget_actor(&actor.id);
            // Answer what is queued so nobody waits for a dead actor.
            mailbox.close();
            if let Some(command) = first {
                actor.fail(command, EngineError::Unavailable(err.clone()));
            }
            while let Some(command) = mailbox.recv().await {
                actor.fail(command, EngineError::Unavailable(err.clone()));
            }
            actor.release().await;
            return;
        }
        actor.announce(true);
        if let Some(from) = taken_from {
            // The host that held the session before let it go or died: its
            // agent is gone with it, so the session is settled as the boot
            // sweep settles a restarted host's.
            match actor.sweep().await {
                Ok(true) => tracing::info!(session = %actor.id, from = %from,
                    "took the session over from another host and settled it"),
                Ok(false) => {
                    tracing::debug!(session = %actor.id, from = %from, "took the session over")
                }
                Err(err) => {
                    tracing::warn!(session = %actor.id, error = %err, "take-over sweep failed")
                }
            }
        }
        if let Some(command) = first {
            actor.handle(command).await;
        }
        loop {
            if actor.stepped_down {
                actor.step_down(mailbox).await;
                return;
            }
            let wait = if actor.announcer.pending {
                SUMMARY_COALESCE
            } else {
                actor.ctx.config.actor_idle
            };
            let command = match tokio::time::timeout(wait, mailbox.recv()).await {
                Ok(Some(command)) => command,
                Ok(None) => break,
                Err(_) => {
                    if actor.announcer.pending {
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
        if actor.announcer.pending {
            actor.announce(true);
        }
        actor.write_snapshot().await;
        actor.release().await;
    }

    /// Lets the lease go (several hosts): the actor has stopped.
    async fn release(&self) {
        if let Some(cluster) = &self.ctx.cluster {
            cluster.release(&self.id).await;
        }
    }

    /// Another host holds the lease now: stop, and hand what is queued to
    /// a new actor, which forwards it to that host.
    async fn step_down(self, mut mailbox: mpsc::Receiver<Command>) {
        tracing::warn!(session = %self.id, "another host holds this session's lease now; stepping down");
        self.ctx.forget_actor(&self.id);
        mailbox.close();
        while let Some(command) = mailbox.recv().await {
            if let Some(sender) = self.ctx.mailbox(&self.id) {
                let _ = sender.send(command).await;
            }
        }
    }

    /// Whether this host still holds the lease long enough to validate and
    /// run side effects on its state (several hosts); re-acquires it when
    /// it is about to run out.
    async fn still_writer(&mut self) -> bool {
        let Some(cluster) = &self.ctx.cluster else {
            return true;
        };
        if self.stepped_down {
            return false;
        }
        if cluster.holds(&self.id, cluster.ttl() / 2) {
            return true;
        }
        match cluster.acquire(&self.id).await {
            Ok(crate::cluster::Lease::Mine { from: None }) => true,
            Ok(_) => {
                self.stepped_down = true;
                false
            }
            Err(err) => {
                tracing::warn!(session = %self.id, error = %err, "cannot renew the session's lease");
                false
            }
        }
    }

    /// Tells root subscribers what changed in the session's summary.
    fn announce(&mut self, now: bool) {
        if let Some(model) = &self.model {
            self.announcer.announce(&self.ctx.hub, model, now);
        }
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
        match outcome.first() {
            Some(CommitOutcome::Committed(published)) => model.last_seq = published.seq,
            Some(CommitOutcome::Fenced) => {
                self.stepped_down = true;
                return Err(EngineError::Unavailable(format!(
                    "Session {} is now served by another host; retry.",
                    self.id
                )));
            }
            _ => {}
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
        let view = self.view(model);
        // Told here, by the session's writer: other hosts hear of it from
        // the log (see `root`), whichever host the request came through.
        self.engine().change_active_sessions(1).await;
        self.ctx.hub.notify(
            ROOT,
            &view.project,
            super::notification(
                "root/sessionAdded",
                serde_json::json!({"channel": ROOT, "summary": super::summary(&view)}),
            ),
        );
        Ok(view)
    }

    fn engine(&self) -> super::Engine {
        super::Engine {
            ctx: self.ctx.clone(),
        }
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
        let view = self.view(model);
        self.engine().change_active_sessions(-1).await;
        self.ctx.hub.notify(
            ROOT,
            &view.project,
            super::notification(
                "root/sessionRemoved",
                serde_json::json!({"channel": ROOT, "session": view.resource}),
            ),
        );
        Ok(view)
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
        if !self.still_writer().await {
            let reason = if self.stepped_down {
                format!("Session {} is now served by another host; retry.", self.id)
            } else {
                super::STORAGE_UNAVAILABLE.to_owned()
            };
            for d in batch {
                let refusal = Refusal::new(RefusalKind::Unavailable, reason.clone());
                reply(d.reply, DispatchOutcome::Rejected(refusal));
            }
            return;
        }
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
                        CommitOutcome::Fenced => {
                            self.stepped_down = true;
                            let reason = format!(
                                "Session {} is now served by another host; retry.",
                                self.id
                            );
                            let refusal = Refusal::new(RefusalKind::Unavailable, reason);
                            reply(d.reply, DispatchOutcome::Rejected(refusal));
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

fn reply(to: Option<oneshot::Sender<DispatchOutcome>>, outcome: DispatchOutcome) {
    if let Some(to) = to {
        let _ = to.send(outcome);
    }
}
