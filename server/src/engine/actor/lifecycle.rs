//! The session's life as its actor writes it: creation, chats, resume,
//! the sweep that settles a session nobody settled, disposal, and loading
//! older turns. Each commits host-originated actions through the actor's
//! own pipeline (`run_follow_ups`).

use serde_json::Value;
use tether_protocol::actions::{AGENT_OPENED, SESSION_SETTLED};
use tether_protocol::channel::ROOT;
use tether_protocol::model::{SessionCreated, SessionModel};
use tether_protocol::view::SessionView;

use super::super::EngineError;
use super::super::command::ChatFork;
use super::super::commit::CommitOutcome;
use super::super::turns::turns_loaded;
use super::super::{self as engine};
use super::{DispatchOutcome, SessionActor};
use crate::store::{NewEnvelope, now_ms};

impl SessionActor {
    /// Loads older turns of `chat` into its window (`fetchTurns`): commits
    /// `chat/turnsLoaded` and returns its seq, or `None` when nothing older
    /// is left.
    pub(super) async fn fetch_turns(
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

    pub(super) async fn create(
        &mut self,
        created: SessionCreated,
        owner: Option<String>,
    ) -> Result<SessionView, EngineError> {
        if self.model.is_some() {
            return Err(EngineError::AlreadyExists(format!(
                "Session {} already exists.",
                self.id
            )));
        }
        // The active client it is created with is its creator's, as if it
        // had registered itself.
        let owner = created
            .active_client
            .as_ref()
            .and_then(|c| c.get("clientId"))
            .and_then(serde_json::Value::as_str)
            .map(str::to_owned)
            .zip(owner);
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
            directed: None,
            owner: owner.clone(),
            search: Vec::new(),
            usage: None,
            events: Vec::new(),
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
            self.ctx.chats.remember(chat, &self.id);
        }
        if let Some((client_id, sub)) = owner {
            self.tool_owners.insert(client_id, sub);
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
        self.announce_open(&view).await;
        Ok(view)
    }

    /// A session open again (created, or its agent opened again after it
    /// was closed, by a resume or a turn):
    /// counted among the root's active sessions and told to root
    /// subscribers. Told here, by the session's writer: other hosts hear of
    /// it from the log (see `root`), whichever host the request came through.
    pub(super) async fn announce_open(&self, view: &SessionView) {
        self.engine().change_active_sessions(1).await;
        self.ctx.hub.notify(ROOT, &view.project, || {
            engine::notification(
                "root/sessionAdded",
                serde_json::json!({"channel": ROOT, "summary": engine::summary(view)}),
            )
        });
    }

    pub(super) fn engine(&self) -> engine::Engine {
        engine::Engine {
            ctx: self.ctx.clone(),
        }
    }

    /// Commits host-originated actions now and reports the first refusal.
    pub(super) async fn host_actions(
        &mut self,
        actions: Vec<(String, Value)>,
    ) -> Result<(), EngineError> {
        self.follow_ups.extend(actions);
        for outcome in self.run_follow_ups().await {
            if let DispatchOutcome::Rejected(refusal) = outcome {
                return Err(EngineError::Unavailable(refusal.reason));
            }
        }
        Ok(())
    }

    pub(super) async fn resume(
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
        let spec = self.ctx.agents.get(&model.session.provider).cloned();
        if wanted.len() > 1 && spec.as_ref().is_some_and(|a| !a.workdirs.multiple) {
            return Err(EngineError::InvalidParams(format!(
                "Agent {} works in a single directory; resume with no additional directories.",
                model.session.provider
            )));
        }
        let opened = serde_json::json!({
            "type": AGENT_OPENED,
            "acpSessionRef": model.projection.acp_session_ref,
            "loadSession": model.projection.load_session,
            "resumed": true,
        });
        let mut actions = Vec::new();
        match &spec {
            Some(agent) if agent.acp_command().is_some() => {
                let opened = self.reopen_agent(agent, &wanted).await.map_err(|reason| {
                    EngineError::Conflict(format!(
                        "Session {}'s agent could not be resumed: {reason}.",
                        self.id
                    ))
                })?;
                self.agent_live = true;
                actions.push((self.uri.clone(), opened));
            }
            Some(agent) => {
                actions.push((self.uri.clone(), opened));
                actions.push((self.uri.clone(), agent.commands_advertisement()));
            }
            None => actions.push((self.uri.clone(), opened)),
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
    pub(super) async fn sweep(&mut self) -> Result<bool, EngineError> {
        let Some(model) = &self.model else {
            return Ok(false);
        };
        // A settled session may still hold a turn its agent never took up
        // (the host died between accepting the turn and starting the agent):
        // the turn fails; the session stays as it settled.
        let settled = model.projection.settled.is_some();
        if self.agent_live || (settled && model.projection.open_turn_id.is_none()) {
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
        if !settled {
            let settle = if model.projection.resumable() {
                "dormant"
            } else {
                "ended"
            };
            actions.push((
                self.uri.clone(),
                serde_json::json!({"type": SESSION_SETTLED, "state": settle, "cause": "process_exited"}),
            ));
        }
        if actions.is_empty() {
            return Ok(false);
        }
        self.host_actions(actions).await?;
        Ok(true)
    }

    pub(super) async fn create_chat(
        &mut self,
        chat: String,
        fork: Option<Box<ChatFork>>,
    ) -> Result<(), EngineError> {
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
        let (state, _) = model.projection.state(self.agent_live);
        if state == tether_protocol::projection::SessionLifeState::Ended {
            return Err(EngineError::Conflict(format!(
                "Session {} has ended; it takes no new chats.",
                self.id
            )));
        }
        if model.chats.len() >= engine::rules::MAX_CHATS {
            return Err(EngineError::Conflict(format!(
                "Session {} has {} chats, the most one session may have; dispose of the session \
                 or work in the chats it has.",
                self.id,
                model.chats.len()
            )));
        }
        if let Some(fork) = fork {
            return self.fork_chat(chat, &fork).await;
        }
        self.claim_chat(&chat).await?;
        let action = serde_json::json!({
            "type": "session/chatAdded",
            "summary": {"resource": chat, "title": "", "status": 1, "modifiedAt": engine::rfc3339(now_ms())},
        });
        self.follow_ups.push((self.uri.clone(), action));
        match self.run_follow_ups().await.into_iter().next() {
            Some(DispatchOutcome::Accepted(_)) => Ok(()),
            Some(DispatchOutcome::Rejected(refusal)) => {
                self.release_chat(&chat).await;
                Err(EngineError::Unavailable(refusal.reason))
            }
            None => Err(EngineError::Unavailable(
                "the chat was not recorded".to_owned(),
            )),
        }
    }

    /// Claims `chat` in the store for this session before its
    /// `session/chatAdded` is committed: sessions asking for one chat URI
    /// at once all pass the engine's read, and without the claim each
    /// would be told yes and write on the winner's chat.
    pub(super) async fn claim_chat(&self, chat: &str) -> Result<(), EngineError> {
        let claimed = self
            .ctx
            .store
            .claim_chat(chat, &self.id)
            .await
            .map_err(|e| EngineError::Unavailable(e.to_string()))?;
        if claimed {
            Ok(())
        } else {
            Err(EngineError::AlreadyExists(format!(
                "Chat {chat} already exists."
            )))
        }
    }

    /// Gives back a claim under which nothing was committed; a failure
    /// leaves the URI taken by this session, which is logged.
    pub(super) async fn release_chat(&self, chat: &str) {
        if let Err(err) = self.ctx.store.release_chat(chat, &self.id).await {
            tracing::warn!(session = %self.id, chat, error = %err, "a refused chat's URI stays claimed");
        }
    }

    pub(super) async fn dispose(&mut self) -> Result<SessionView, EngineError> {
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
        if state == tether_protocol::projection::SessionLifeState::Closed {
            // Disposed already (and not resumed since): nothing more to do,
            // nor to count or tell again.
            return Ok(self.view(model));
        }
        let settle = if model.projection.resumable() {
            "closed"
        } else {
            "ended"
        };
        let action =
            serde_json::json!({"type": SESSION_SETTLED, "state": settle, "cause": "disposed"});
        self.agent_live = false;
        // Its agent goes with it: told its session is over when it takes
        // `session/close` (bounded), then its process group is killed as
        // the handle drops.
        if let Some(running) = self.running.take() {
            let limit = self.ctx.config.acp.stop_grace;
            let _ = tokio::time::timeout(limit, running.process.close()).await;
        }
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
        self.ctx.hub.notify(ROOT, &view.project, || {
            engine::notification(
                "root/sessionRemoved",
                serde_json::json!({"channel": ROOT, "session": view.resource}),
            )
        });
        Ok(view)
    }
}
