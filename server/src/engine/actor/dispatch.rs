//! Dispatching on the session's actor: a batch validated against the
//! session's state and its agent, its side effects run, committed in one
//! group, every dispatch answered; then what the accepted actions cause
//! (the agent's answer, the next queued message, presence), committed as
//! host-originated follow-ups.

use serde_json::Value;
use tether_protocol::actions::{AGENT_OPENED, action_text, action_type};
use tether_protocol::model::typed_action;
use tether_protocol::search;
use tokio::sync::oneshot;

use super::super::commit::CommitOutcome;
use super::super::turns::{TURNS_LOADED, eager_load};
use super::super::validate::{check_dispatch, retry_outcome};
use super::super::{Refusal, RefusalKind};
use super::{Dispatch, DispatchOutcome, SessionActor, retries};
use crate::store::{NewEnvelope, now_ms};

impl SessionActor {
    /// Keeps the host's presence index in step with the session's active
    /// clients.
    pub(super) fn follow_clients(&self, kind: &str, action: &Value) {
        match kind {
            "session/activeClientSet" => {
                if let Some(client) = action
                    .pointer("/activeClient/clientId")
                    .and_then(Value::as_str)
                {
                    self.ctx.client_active(client, &self.id);
                }
            }
            "session/activeClientRemoved" => {
                if let Some(client) = action.get("clientId").and_then(Value::as_str) {
                    self.ctx.clients.left(client, &self.id);
                }
            }
            _ => {}
        }
    }

    /// Commits the queued host-originated actions (and any they cause).
    pub(super) async fn run_follow_ups(&mut self) -> Vec<DispatchOutcome> {
        let mut outcomes = Vec::new();
        // Bounded: an agent answer causes at most one more round, and a
        // chat's queue (at most MAX_QUEUED messages) two per message.
        for _ in 0..(4 + 2 * super::super::rules::MAX_QUEUED) {
            if self.follow_ups.is_empty() {
                break;
            }
            let mut waiting = Vec::new();
            let mut directed_copies = std::mem::take(&mut self.directed);
            let batch = std::mem::take(&mut self.follow_ups)
                .into_iter()
                .enumerate()
                .map(|(place, (channel, action))| {
                    let (reply, answer) = oneshot::channel();
                    waiting.push(answer);
                    let directed = directed_copies.remove(&place);
                    Dispatch {
                        origin: None,
                        channel,
                        action,
                        principal: None,
                        reply: Some(reply),
                        directed,
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

    /// The dispatches of principals who may see this session; the others
    /// are answered as for a session that does not exist, before anything
    /// of it (who writes it, an earlier outcome of a client's number) is
    /// told. A session in memory here is not looked up in the store on
    /// its way (see `in_scope`), so this is where it is checked.
    fn only_visible(&self, batch: Vec<Dispatch>) -> Vec<Dispatch> {
        let Some(project) = self.model.as_ref().map(|m| m.created.project.as_str()) else {
            return batch;
        };
        let sees = |d: &Dispatch| d.principal.as_ref().is_none_or(|p| p.can_see(project));
        if batch.iter().all(sees) {
            return batch;
        }
        batch
            .into_iter()
            .filter_map(|d| {
                if sees(&d) {
                    return Some(d);
                }
                let reason = format!("Channel {} does not exist.", d.channel);
                reply(
                    d.reply,
                    DispatchOutcome::Rejected(Refusal::new(RefusalKind::NotFound, reason)),
                );
                None
            })
            .collect()
    }

    /// Validates, applies and commits a batch; answers every dispatch.
    pub(super) async fn dispatch_batch(&mut self, batch: Vec<Dispatch>) {
        let batch = self.only_visible(batch);
        if batch.is_empty() {
            return;
        }
        if !self.still_writer().await {
            let reason = if self.stepped_down {
                format!("Session {} is now served by another host; retry.", self.id)
            } else {
                super::super::STORAGE_UNAVAILABLE.to_owned()
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
        // A disposed (closed) session whose agent opens again is open again.
        // (Its settling record decides: an agent about to be told of the
        // turn is already counted live.)
        let was_closed = model.projection.state(false).0
            == tether_protocol::projection::SessionLifeState::Closed;
        let mut reopened = false;
        let mut pending = Vec::new();
        let mut records = Vec::new();
        // Retries of a dispatch of this batch, by its place in `pending`.
        let mut twins: Vec<(usize, Dispatch)> = Vec::new();
        for mut d in batch {
            if let Some(origin) = &d.origin {
                if let Some(first) = retries::twin_of(&pending, origin) {
                    twins.push((first, d));
                    continue;
                }
                let kind = action_type(&d.action).unwrap_or_default();
                if retries::acts_before_commit(&self.ctx, kind, self.running.is_some()) {
                    let may_be_taken = self.seen_origins.may_be_taken(origin);
                    self.seen_origins.saw(origin);
                    let known = if may_be_taken {
                        self.ctx.store.origin_outcome(origin).await
                    } else {
                        Ok(None)
                    };
                    match known {
                        Ok(None) => {}
                        Ok(Some(known)) => {
                            reply(d.reply, retry_outcome(&known, &d.channel, &d.action));
                            continue;
                        }
                        Err(err) => {
                            let refusal = Refusal::new(
                                RefusalKind::Unavailable,
                                super::super::storage_unavailable(&err),
                            );
                            reply(d.reply, DispatchOutcome::Rejected(refusal));
                            continue;
                        }
                    }
                }
            }
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
                            action: action_text(&load),
                            origin: None,
                            session: None,
                            chats: Vec::new(),
                            turns: model.take_trimmed(),
                            directed: None,
                            owner: None,
                            search: Vec::new(),
                            usage: None,
                            events: Vec::new(),
                        });
                        let loaded = Dispatch {
                            origin: None,
                            channel: d.channel.clone(),
                            action: load,
                            principal: None,
                            reply: None,
                            directed: None,
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
            let usage_before =
                super::super::usage::before(model, action_type(&d.action).unwrap_or_default());
            let process = self.running.as_ref().map(|r| &r.process);
            let owners = &self.tool_owners;
            let mut follow = Vec::new();
            let checked = check_dispatch(
                &self.ctx,
                model,
                agent.as_ref(),
                process,
                owners,
                &mut d,
                &mut follow,
            )
            .await;
            self.follow_ups.extend(follow);
            match checked {
                Ok(kind) => {
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
                        self.ctx.chats.remember(chat, &self.id);
                        chats.push(chat.to_owned());
                    }
                    let owner = (kind == "session/activeClientSet")
                        .then(|| d.origin.as_ref().zip(d.principal.as_ref()))
                        .flatten()
                        .map(|(o, p)| (o.client_id.clone(), p.sub.clone()));
                    if kind == "chat/turnStarted"
                        && let Some(principal) = &d.principal
                    {
                        self.turn_by.clone_from(&principal.sub);
                    }
                    let usage = usage_before
                        .and_then(|b| super::super::usage::row(model, b, &self.turn_by));
                    records.push(NewEnvelope {
                        channel: d.channel.clone(),
                        session_id: Some(self.id.clone()),
                        action: action_text(&d.action),
                        origin: d.origin.clone(),
                        session: None,
                        chats,
                        turns: model.take_trimmed(),
                        directed: d.directed.take(),
                        owner,
                        search: if self.ctx.config.search_index {
                            search::doc(model, &d.channel, &d.action)
                        } else {
                            Vec::new()
                        },
                        usage,
                        events: super::super::notify::outbox_events(model, &d.channel, &d.action),
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
        let answer_twins = |twins: &mut Vec<(usize, Dispatch)>,
                            place: usize,
                            original: &Dispatch,
                            outcome: &DispatchOutcome| {
            for (_, twin) in twins.extract_if(.., |(first, _)| *first == place) {
                let answer = retries::twin_answer(original, outcome, &twin);
                reply(twin.reply, answer);
            }
        };
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
                for (place, (d, _)) in pending.into_iter().enumerate() {
                    let outcome = DispatchOutcome::Rejected(Refusal::new(
                        RefusalKind::Unavailable,
                        super::super::storage_unavailable(&err.0),
                    ));
                    answer_twins(&mut twins, place, &d, &outcome);
                    reply(d.reply, outcome);
                }
                reload = true;
            }
            Ok(outcomes) => {
                for (place, ((d, kind), outcome)) in pending.into_iter().zip(outcomes).enumerate() {
                    let answer = match outcome {
                        CommitOutcome::Committed(published) => {
                            if let Some(m) = self.model.as_mut() {
                                m.last_seq = published.seq;
                            }
                            reopened |= was_closed && kind == AGENT_OPENED;
                            self.since_snapshot += 1;
                            self.follow_clients(&kind, &d.action);
                            self.note_directories(&kind);
                            if matches!(
                                kind.as_str(),
                                "chat/turnComplete"
                                    | "chat/turnCancelled"
                                    | "chat/error"
                                    | "chat/pendingMessageSet"
                            ) {
                                self.start_queued(&d.channel);
                            }
                            if kind == "session/activeClientSet"
                                && let (Some(origin), Some(principal)) = (&d.origin, &d.principal)
                            {
                                self.tool_owners
                                    .insert(origin.client_id.clone(), principal.sub.clone());
                            }
                            if kind == "chat/turnStarted" {
                                self.answer_turn(&d.channel, &d.action, agent.as_ref());
                            } else if d.origin.is_some() {
                                if kind == "chat/toolCallComplete" {
                                    self.client_tool_completed(&d.channel, &d.action);
                                }
                                self.tell_agent(&d.channel, &kind, &d.action);
                            }
                            DispatchOutcome::Accepted(published)
                        }
                        CommitOutcome::Duplicate(known) => {
                            reload = true;
                            retry_outcome(&known, &d.channel, &d.action)
                        }
                        CommitOutcome::Fenced => {
                            self.stepped_down = true;
                            let reason = format!(
                                "Session {} is now served by another host; retry.",
                                self.id
                            );
                            DispatchOutcome::Rejected(Refusal::new(
                                RefusalKind::Unavailable,
                                reason,
                            ))
                        }
                    };
                    answer_twins(&mut twins, place, &d, &answer);
                    reply(d.reply, answer);
                }
            }
        }
        // Boxed: rare, and its future would make every batch's large.
        if reload && let Err(err) = Box::pin(self.reload()).await {
            tracing::error!(session = %self.id, error = %err, "cannot rebuild session state");
        }
        if reopened && let Some(model) = &self.model {
            let view = self.view(model);
            Box::pin(self.announce_open(&view)).await;
        }
        self.announce(false);
        if self.since_snapshot >= self.ctx.config.snapshot_every {
            self.write_snapshot().await;
        }
    }

    /// Queues the agent's answer to an accepted turn.
    pub(super) fn answer_turn(
        &mut self,
        chat: &str,
        turn: &Value,
        agent: Option<&crate::agents::AgentSpec>,
    ) {
        let Some(agent) = agent else { return };
        if agent.acp_command().is_some() {
            self.prompt_agent(agent, chat, turn);
            return;
        }
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
        let turn_id = turn["turnId"].as_str().unwrap_or_default();
        let text = turn
            .pointer("/message/text")
            .and_then(Value::as_str)
            .unwrap_or_default();
        if agent.answers_turns && !self.echo_tool_turn(chat, turn_id, text) {
            for action in agent.answer_turn(turn) {
                self.follow_ups.push((chat.to_owned(), action));
            }
        }
    }

    /// A chat with no turn running and a message waiting (the steering one
    /// first, then the queue in order) starts its next turn with it: the
    /// message leaves the queue and becomes the turn (`queuedMessageId`),
    /// which its agent then answers like any other. ACP cannot inject a
    /// message into a running turn, so a steering message waits for the
    /// turn's end as a queued one does.
    pub(super) fn start_queued(&mut self, chat: &str) {
        let Some(state) = self.model.as_ref().and_then(|m| m.chats.get(chat)) else {
            return;
        };
        let starting = self
            .follow_ups
            .iter()
            .any(|(c, a)| c == chat && a["type"] == "chat/turnStarted");
        if state.active_turn.is_some() || starting {
            return;
        }
        let next = state
            .steering_message
            .as_ref()
            .map(|m| ("steering", m))
            .or_else(|| {
                state
                    .queued_messages
                    .as_ref()
                    .and_then(|q| q.first())
                    .map(|m| ("queued", m))
            });
        let Some((kind, pending)) = next else {
            return;
        };
        let mut turn = serde_json::json!({
            "type": "chat/turnStarted",
            "turnId": uuid::Uuid::new_v4().to_string(),
            "startedAt": super::super::rfc3339(now_ms()),
            "message": pending.message,
        });
        if kind == "queued" {
            turn["queuedMessageId"] = Value::String(pending.id.clone());
        }
        let removed = serde_json::json!({"type": "chat/pendingMessageRemoved", "kind": kind, "id": pending.id});
        self.follow_ups.push((chat.to_owned(), removed));
        self.follow_ups.push((chat.to_owned(), turn));
    }
}

fn reply(to: Option<oneshot::Sender<DispatchOutcome>>, outcome: DispatchOutcome) {
    if let Some(to) = to {
        let _ = to.send(outcome);
    }
}
