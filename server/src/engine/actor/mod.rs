//! The session actor: one task per active session, the single writer of its
//! state on this host. It validates dispatches, runs their side effects,
//! appends them through the group committer and applies them, in order.
//!
//! Dispatches that are ready together are handled as one batch: each is
//! validated against the state left by the ones before it, then the batch is
//! appended in one request. If the append fails, or the store reports that
//! an origin already had an outcome (a retry), the actor rebuilds its state
//! from the store, so its state is always the fold of what was committed.
//!
//! This file holds the actor's life (its loop, commands, loading and
//! snapshots); the dispatch path is in `dispatch`, the session's life
//! cycle in `lifecycle`, its agent in `agent`.

use std::sync::Arc;

use serde_json::Value;
use tether_protocol::channel::Channel;
use tether_protocol::model::SessionModel;
use tether_protocol::view::SessionView;

pub use super::command::{Command, Dispatch, DispatchOutcome};
mod agent;
mod changesets;
mod dispatch;
mod forks;
mod lifecycle;
mod retries;
mod terminals;
mod tools;

use super::forward::ProxyEnd;
use super::summary::{Announcer, SUMMARY_COALESCE};
use super::turns::ARCHIVE_CHUNK;
use super::{Ctx, EngineError};

use crate::store::{SessionRecord, Snapshot, now_ms};

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
    /// The session's ACP agent process, while one runs.
    running: Option<agent::Running>,
    /// Client tool calls waiting for their clients.
    client_calls: tools::ClientCalls,
    /// Directed copies of queued host actions, by their place in
    /// `follow_ups` (taken with them).
    directed: std::collections::HashMap<usize, crate::store::Directed>,
    /// Who registered each active client's tools: `clientId` → token `sub`
    /// (recorded with each `activeClientSet`, loaded with the session).
    tool_owners: std::collections::HashMap<String, String>,
    /// Origins of actions that act before their commit, seen here.
    seen_origins: retries::SeenOrigins,
    /// Who started the latest turn (the token's `sub`), for the usage
    /// ledger; empty until a principal starts one here.
    turn_by: String,
}

/// What woke the actor.
enum Wake {
    Command(Option<Command>),
    Agent(Option<crate::agents::acp::AgentEvent>),
    Timeout,
}

impl SessionActor {
    /// Loads the session from the store and runs until evicted.
    ///
    /// With several hosts it starts as a proxy (see `forward`) and becomes
    /// the session's writer only once it holds the lease; it lets the lease
    /// go when it stops.
    ///
    /// Every step is boxed: this future is the task's size for as long as
    /// the session stays in memory, and unboxed it held room for the
    /// largest step's state (kilobytes) while it waited idle.
    pub(super) async fn run(
        id: String,
        ctx: Arc<Ctx>,
        mut mailbox: super::mailbox::Receiver<Command>,
    ) {
        let mut first = None;
        let mut taken_from = None;
        if let Some(cluster) = ctx.cluster.clone() {
            match Box::pin(super::forward::run_proxy(&id, &ctx, &cluster, &mut mailbox)).await {
                ProxyEnd::Stopped => return,
                ProxyEnd::TakeOver { command, from } => {
                    first = Some(*command);
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
            running: None,
            client_calls: tools::ClientCalls::new(),
            directed: std::collections::HashMap::new(),
            tool_owners: std::collections::HashMap::new(),
            seen_origins: retries::SeenOrigins::default(),
            turn_by: String::new(),
        };
        if let Err(err) = Box::pin(actor.reload()).await {
            tracing::error!(session = %actor.id, error = %err, "cannot load session");
            actor.ctx.forget_actor(&actor.id);
            // Answer what is queued so nobody waits for a dead actor.
            mailbox.close();
            if let Some(command) = first {
                command.fail(EngineError::Unavailable(err.clone()));
            }
            while let Some(command) = mailbox.recv().await {
                command.fail(EngineError::Unavailable(err.clone()));
            }
            Box::pin(actor.release()).await;
            return;
        }
        actor.announce(true);
        if let Some(from) = taken_from {
            // The host that held the session before let it go or died: its
            // agent is gone with it, so the session is settled as the boot
            // sweep settles a restarted host's.
            match Box::pin(actor.sweep()).await {
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
            Box::pin(actor.handle(command)).await;
        }
        loop {
            if actor.stepped_down {
                Box::pin(actor.step_down(mailbox)).await;
                return;
            }
            let wait = if actor.announcer.pending {
                SUMMARY_COALESCE
            } else {
                actor.ctx.config.actor_idle
            };
            let wait = match &actor.running {
                Some(_) => wait.min(actor.ctx.config.agent_idle),
                None => wait,
            };
            let deadline = [actor.next_client_deadline(), actor.next_question_deadline()]
                .into_iter()
                .flatten()
                .min();
            let wait = match deadline {
                Some(deadline) => {
                    wait.min(deadline.saturating_duration_since(tokio::time::Instant::now()))
                }
                None => wait,
            };
            let wake = match &mut actor.running {
                Some(running) => tokio::select! {
                    command = mailbox.recv() => Wake::Command(command),
                    event = running.process.events.recv() => Wake::Agent(event),
                    () = tokio::time::sleep(wait) => Wake::Timeout,
                },
                None => match tokio::time::timeout(wait, mailbox.recv()).await {
                    Ok(command) => Wake::Command(command),
                    Err(_) => Wake::Timeout,
                },
            };
            let command = match wake {
                Wake::Command(Some(command)) => command,
                Wake::Command(None) => break,
                Wake::Agent(event) => {
                    Box::pin(actor.on_agent_event(event)).await;
                    continue;
                }
                Wake::Timeout => {
                    if !actor.client_calls.is_empty() {
                        actor.expire_client_calls();
                        Box::pin(actor.run_follow_ups()).await;
                    }
                    actor.expire_questions();
                    if !actor.follow_ups.is_empty() {
                        Box::pin(actor.run_follow_ups()).await;
                    }
                    if actor.announcer.pending {
                        actor.announce(true);
                        continue;
                    }
                    if Box::pin(actor.stop_idle_agent()).await
                        || actor.running.is_some()
                        || !actor.client_calls.is_empty()
                    {
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
                    let mut batch = vec![*first];
                    let mut other = None;
                    while batch.len() < actor.ctx.config.actor_batch {
                        match mailbox.try_recv() {
                            Some(Command::Dispatch(next)) => batch.push(*next),
                            Some(command) => {
                                other = Some(command);
                                break;
                            }
                            None => break,
                        }
                    }
                    Box::pin(actor.dispatch_batch(batch)).await;
                    if !actor.follow_ups.is_empty() {
                        Box::pin(actor.run_follow_ups()).await;
                    }
                    if let Some(command) = other {
                        Box::pin(actor.handle(command)).await;
                    }
                }
                command => Box::pin(actor.handle(command)).await,
            }
        }
        if actor.announcer.pending {
            actor.announce(true);
        }
        Box::pin(actor.write_snapshot()).await;
        actor.ctx.mcp.forget(&actor.id);
        Box::pin(actor.release()).await;
    }

    /// Lets the lease go (several hosts): the actor has stopped. A session
    /// that was disposed (settled closed or ended) loses its lease row
    /// altogether, so rows do not pile up for sessions nobody writes; a
    /// later writer detects another host's writes by the log (see
    /// `still_writer`), not by the row.
    async fn release(&self) {
        if let Some(cluster) = &self.ctx.cluster {
            let disposed = self.model.as_ref().is_some_and(|m| {
                m.projection
                    .settled
                    .as_ref()
                    .is_some_and(|s| s.cause.as_deref() == Some("disposed"))
            });
            cluster.release(&self.id, disposed).await;
        }
    }

    /// Another host holds the lease now: stop, and hand what is queued to
    /// a new actor, which forwards it to that host.
    async fn step_down(self, mut mailbox: super::mailbox::Receiver<Command>) {
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
    ///
    /// Every batch asks, and nearly always the answer needs no I/O: that
    /// path awaits nothing, and the renewal's large future is boxed, so
    /// that each batch's future stays small (it is moved into a box of its
    /// own by the actor's loop).
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
        let cluster = cluster.clone();
        Box::pin(self.renew_lease(&cluster)).await
    }

    /// Re-acquires the lease (several hosts); see [`Self::still_writer`].
    async fn renew_lease(&mut self, cluster: &crate::cluster::Cluster) -> bool {
        match cluster.acquire(&self.id).await {
            Ok(crate::cluster::Lease::Mine { from: None }) => {
                // The lease was this host's when it was last looked at, or
                // nobody's: a released lease row may have been removed
                // since (see `release`), so another host may have written
                // in between without a trace in the lease. The log tells:
                // anything above this actor's state is another writer's,
                // and the actor steps down to reload it.
                let after = self.model.as_ref().map_or(0, |m| m.last_seq);
                match self.ctx.store.transcript(&self.id, after, 1).await {
                    Ok(newer) if newer.is_empty() => true,
                    Ok(_) => {
                        self.stepped_down = true;
                        false
                    }
                    Err(err) => {
                        tracing::warn!(session = %self.id, error = %err, "cannot check the session's log");
                        false
                    }
                }
            }
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

    async fn handle(&mut self, command: Command) {
        match command {
            Command::Dispatch(d) => {
                self.dispatch_batch(vec![*d]).await;
                self.run_follow_ups().await;
            }
            Command::Create {
                created,
                owner,
                reply,
            } => {
                let _ = reply.send(self.create(*created, owner).await);
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
            Command::CreateChat { chat, fork, reply } => {
                let _ = reply.send(self.create_chat(chat, fork).await);
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
            Command::Operate { operation, reply } => {
                let answer = match *operation {
                    super::command::Operation::Revert {
                        changeset,
                        resource,
                    } => self.revert(&changeset, resource.as_deref()).await,
                    super::command::Operation::CreateTerminal {
                        terminal,
                        claim,
                        title,
                        cwd,
                    } => self.create_terminal(&terminal, claim, title, cwd.as_deref()),
                    super::command::Operation::DisposeTerminal { terminal } => {
                        self.dispose_terminal(&terminal)
                    }
                };
                let _ = reply.send(answer);
            }
            Command::CallTool {
                name,
                arguments,
                reply,
            } => {
                self.agent_tool_call(&name, *arguments, reply);
                self.run_follow_ups().await;
            }
            Command::Shutdown { reply } => {
                self.stop_agent_for_shutdown().await;
                let _ = reply.send(());
            }
            Command::ClientGone { client_id } => {
                if !self.ctx.clients.connected(&client_id) {
                    self.client_gone(&client_id);
                    self.run_follow_ups().await;
                }
            }
        }
    }

    fn snapshot(&self, channel: &str) -> Option<(Value, u64)> {
        channel_state(self.model.as_ref()?, channel)
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
                self.ctx.chats.remember(chat, &self.id);
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
        if let Some(m) = &model {
            for client in &m.session.active_clients {
                self.ctx.client_active(&client.client_id, &self.id);
            }
            // Who registered each client's tools, as recorded with the
            // registration: the host context and the answers stay theirs
            // across evictions, restarts and hosts.
            self.tool_owners = self
                .ctx
                .store
                .client_owners(&self.id)
                .await
                .map_err(|e| e.to_string())?
                .into_iter()
                .collect();
        }
        self.model = model;
        Ok(())
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

/// The state of the session's channel or one of its chats, with the seq it
/// includes; `None` when the channel is not the session's.
pub(super) fn channel_state(model: &SessionModel, channel: &str) -> Option<(Value, u64)> {
    let state = if channel == Channel::session_uri(&model.id) {
        serde_json::to_value(&model.session).ok()?
    } else if let Some(chat) = model.chats.get(channel) {
        serde_json::to_value(chat).ok()?
    } else if let Some(terminal) = model.terminals.get(channel) {
        serde_json::to_value(terminal).ok()?
    } else {
        match (model.changesets.get(channel), Channel::parse(channel)) {
            (Some(changeset), _) => serde_json::to_value(changeset).ok()?,
            // A changeset of the session with nothing in it yet (a turn
            // that changed no file): empty, and computed.
            (None, Ok(Channel::Changeset { session, .. })) if session == model.id => {
                serde_json::json!({"status": "ready", "files": []})
            }
            _ => return None,
        }
    };
    Some((state, model.last_seq))
}
