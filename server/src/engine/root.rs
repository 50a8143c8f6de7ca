//! The root channel (`ahp-root://`): its state (agents, the count of
//! active sessions), loaded from snapshot plus log at start, and its
//! actions, committed under one lock.

use ahp::reducers::{ReduceOutcome, apply_action_to_root};
use ahp_types::state::RootState;
use serde_json::{Value, json};
use tether_protocol::actions::{SESSION_CREATED, SESSION_SETTLED, action_type};
use tether_protocol::channel::{Channel, ROOT};
use tether_protocol::model::typed_action;
use tether_protocol::view::SessionView;
use tokio::sync::{mpsc, oneshot};

use super::commit::CommitOutcome;
use super::{DispatchOutcome, Engine, Refusal, RefusalKind, STORAGE_UNAVAILABLE, rules, validate};
use crate::store::{NewEnvelope, Origin, Snapshot, Store, StoreError, StoredEnvelope, now_ms};

/// A root write waiting for the next batch: its action, computed from the
/// state the writes before it leave, and where its outcome goes.
pub(super) struct QueuedRoot {
    action: Box<dyn FnOnce(&RootState) -> Value + Send>,
    origin: Option<Origin>,
    answer: oneshot::Sender<Result<DispatchOutcome, Refusal>>,
}

/// The root state with the seq it includes.
pub(super) struct RootModel {
    pub(super) state: RootState,
    pub(super) last_seq: u64,
    /// Root envelopes this host wrote since its last root snapshot.
    since_snapshot: u32,
}

impl Engine {
    pub(super) async fn dispatch_root(
        &self,
        origin: Option<Origin>,
        action: Value,
    ) -> DispatchOutcome {
        // The root channel is the host's alone: no token dispatches its
        // host-originated actions.
        match rules::check_dispatchable(&Channel::Root, &action, false) {
            Ok(_) => {}
            Err(reason) => {
                return self
                    .ctx
                    .reject(origin.as_ref(), ROOT, &action, reason.into())
                    .await;
            }
        }
        match self.commit_root(action.clone(), origin.clone()).await {
            Ok(outcome) => outcome,
            Err(reason) => {
                self.ctx
                    .reject(origin.as_ref(), ROOT, &action, reason)
                    .await
            }
        }
    }

    /// Validates, commits and applies a root action under the root lock.
    /// With several hosts the lock is the cluster's, and the root state is
    /// brought up to date from the log under it first: root actions are
    /// computed from the state (the count of active sessions), so two hosts
    /// must never compute them from the same old state.
    pub(super) async fn commit_root(
        &self,
        action: Value,
        origin: Option<Origin>,
    ) -> Result<DispatchOutcome, Refusal> {
        self.commit_root_from(move |_| action, origin).await
    }

    /// As [`Engine::commit_root`], with the action computed from the root
    /// state under the lock (and, with several hosts, after catching up),
    /// so two writers never compute it from the same old state.
    ///
    /// Root writes are group-committed: each queues, and whichever writer
    /// gets the host's lock commits every queued write in one batch, under
    /// one take of the cluster's lock. Every session's creation and end
    /// writes the root's count, so one lock, catch-up and commit per write
    /// capped how fast sessions could be created at about one fsync each.
    async fn commit_root_from(
        &self,
        action: impl FnOnce(&RootState) -> Value + Send + 'static,
        origin: Option<Origin>,
    ) -> Result<DispatchOutcome, Refusal> {
        let (answer, mut answered) = oneshot::channel();
        if let Ok(mut queued) = self.ctx.root_queue.lock() {
            queued.push(QueuedRoot {
                action: Box::new(action),
                origin,
                answer,
            });
        }
        // The host's own lock first: only one task per host then waits on
        // the cluster's lock, holding one pooled connection. Waiting on the
        // cluster's lock first, each concurrent root write held a connection
        // while it waited, and enough of them left the holder none to
        // commit with (sessions created 32 at a time timed the pool out).
        let mut root = self.ctx.root.lock().await;
        if let Ok(done) = answered.try_recv() {
            // Committed in another writer's batch.
            return done;
        }
        let batch = match self.ctx.root_queue.lock() {
            Ok(mut queued) => std::mem::take(&mut *queued),
            Err(_) => Vec::new(),
        };
        self.commit_root_batch(&mut root, batch).await;
        drop(root);
        answered
            .try_recv()
            .unwrap_or_else(|_| Err(Refusal::new(RefusalKind::Unavailable, STORAGE_UNAVAILABLE)))
    }

    /// Commits `batch` in order, each action computed from the state the
    /// ones before it leave, and answers each.
    async fn commit_root_batch(&self, root: &mut RootModel, batch: Vec<QueuedRoot>) {
        let unavailable = || Refusal::new(RefusalKind::Unavailable, STORAGE_UNAVAILABLE);
        let fail_all = |batch: Vec<QueuedRoot>| {
            for queued in batch {
                let _ = queued.answer.send(Err(unavailable()));
            }
        };
        let cluster_lock = match &self.ctx.cluster {
            Some(cluster) => match cluster.lock_root().await {
                Ok(lock) => Some(lock),
                Err(_) => return fail_all(batch),
            },
            None => None,
        };
        if cluster_lock.is_some() && catch_up_root(self.ctx.store.as_ref(), root).await.is_err() {
            return fail_all(batch);
        }
        let mut trial = root.state.clone();
        let mut writes = Vec::with_capacity(batch.len());
        for queued in batch {
            let action = (queued.action)(&trial);
            match apply_action_to_root(&mut trial, &typed_action(&action)) {
                ReduceOutcome::Applied | ReduceOutcome::NoOp => {
                    writes.push((action, queued.origin, queued.answer));
                }
                other => {
                    let _ = queued.answer.send(Err(Refusal::from(format!(
                        "Action {} does not apply to the root channel ({other:?}).",
                        action_type(&action).unwrap_or("?")
                    ))));
                }
            }
        }
        let envelopes = writes
            .iter()
            .map(|(action, origin, _)| NewEnvelope {
                channel: ROOT.to_owned(),
                session_id: None,
                action: action.to_string(),
                origin: origin.clone(),
                session: None,
                chats: Vec::new(),
                turns: Vec::new(),
                directed: None,
                owner: None,
                search: Vec::new(),
                usage: None,
                events: Vec::new(),
            })
            .collect::<Vec<_>>();
        let outcomes = if envelopes.is_empty() {
            Ok(Vec::new())
        } else {
            self.ctx.committer.append(envelopes).await
        };
        match outcomes {
            Ok(outcomes) if outcomes.len() == writes.len() => {
                let all_committed = outcomes
                    .iter()
                    .all(|o| matches!(o, CommitOutcome::Committed(_)));
                for ((action, _, answer), outcome) in writes.into_iter().zip(outcomes) {
                    let answered = match outcome {
                        CommitOutcome::Committed(published) => {
                            root.since_snapshot += 1;
                            root.last_seq = root.last_seq.max(published.seq);
                            Ok(DispatchOutcome::Accepted(published))
                        }
                        CommitOutcome::Duplicate(known) => {
                            Ok(validate::retry_outcome(&known, ROOT, &action))
                        }
                        CommitOutcome::Fenced => Err(unavailable()),
                    };
                    let _ = answer.send(answered);
                }
                if all_committed {
                    root.state = trial;
                } else if let Ok(fresh) = load_root(self.ctx.store.as_ref()).await {
                    // Some were not written: the trial state assumed they
                    // were, so the state is read back from the store.
                    *root = fresh;
                }
                if root.since_snapshot >= 64 {
                    root.since_snapshot = 0;
                    self.snapshot_root(root).await;
                }
            }
            Ok(_) => {
                for (_, _, answer) in writes {
                    let _ = answer.send(Err(unavailable()));
                }
            }
            Err(err) => {
                let reason = super::storage_unavailable(&err.0);
                for (_, _, answer) in writes {
                    let _ = answer.send(Err(Refusal::from(reason.clone())));
                }
            }
        }
        if let Some(lock) = cluster_lock {
            lock.release().await;
        }
    }

    async fn snapshot_root(&self, root: &RootModel) {
        let Ok(state) = serde_json::to_string(&root.state) else {
            return;
        };
        let snapshot = Snapshot {
            channel: ROOT.to_owned(),
            seq: root.last_seq,
            state,
            at_ms: now_ms(),
        };
        if let Err(err) = self.ctx.store.put_snapshot(snapshot).await {
            tracing::warn!(error = %err, "root snapshot not written");
        }
    }

    pub(super) async fn change_active_sessions(&self, delta: i64) {
        let action = move |state: &RootState| {
            let current = state.active_sessions.unwrap_or(0);
            json!({"type": "root/activeSessionsChanged", "activeSessions": (current + delta).max(0)})
        };
        if let Err(err) = self.commit_root_from(action, None).await {
            tracing::warn!(error = %err.reason, "active session count not recorded");
        }
    }
}

pub(super) async fn load_root(store: &dyn Store) -> Result<RootModel, StoreError> {
    let mut root = match store.latest_snapshot(ROOT).await? {
        Some(snapshot) => RootModel {
            state: serde_json::from_str(&snapshot.state)
                .map_err(|e| StoreError::Corrupt(format!("root snapshot: {e}")))?,
            last_seq: snapshot.seq,
            since_snapshot: 0,
        },
        None => RootModel {
            state: serde_json::from_value(json!({"agents": [], "activeSessions": 0}))
                .map_err(|e| StoreError::Corrupt(e.to_string()))?,
            last_seq: 0,
            since_snapshot: 0,
        },
    };
    catch_up_root(store, &mut root).await?;
    Ok(root)
}

/// Folds the root envelopes after `root.last_seq` into it.
async fn catch_up_root(store: &dyn Store, root: &mut RootModel) -> Result<(), StoreError> {
    let channels = [ROOT.to_owned()];
    loop {
        let page = store
            .read_after(root.last_seq, Some(&channels), 2_000)
            .await?;
        let Some(last) = page.last() else { break };
        let last = last.seq;
        for envelope in page {
            apply_root(root, &envelope)?;
        }
        root.last_seq = last;
    }
    Ok(())
}

fn apply_root(root: &mut RootModel, envelope: &StoredEnvelope) -> Result<(), StoreError> {
    let action: Value = serde_json::from_str(&envelope.action)
        .map_err(|e| StoreError::Corrupt(format!("root envelope {}: {e}", envelope.seq)))?;
    apply_action_to_root(&mut root.state, &typed_action(&action));
    root.last_seq = envelope.seq;
    Ok(())
}

impl Engine {
    /// Hears of other hosts' root envelopes and of sessions they created or
    /// disposed: keeps the root state current and tells this host's root
    /// subscribers, as the host that wrote them told its own.
    pub(super) fn start_remote(&self, mut remote: mpsc::UnboundedReceiver<StoredEnvelope>) {
        let engine = self.clone();
        tokio::spawn(async move {
            while let Some(envelope) = remote.recv().await {
                engine.heard(envelope).await;
            }
        });
    }

    async fn heard(&self, envelope: StoredEnvelope) {
        if envelope.channel == ROOT {
            let mut root = self.ctx.root.lock().await;
            if envelope.seq > root.last_seq
                && let Err(err) = apply_root(&mut root, &envelope)
            {
                tracing::warn!(error = %err, "another host's root envelope is unreadable");
            }
            return;
        }
        let Some(session) = envelope.session_id.as_deref() else {
            return;
        };
        let kind = serde_json::from_str::<Value>(&envelope.action)
            .ok()
            .and_then(|a| {
                let kind = action_type(&a)?.to_owned();
                let cause = a.get("cause").and_then(Value::as_str).map(str::to_owned);
                Some((kind, cause))
            });
        let Ok(Some(row)) = self.ctx.store.session(session).await else {
            return;
        };
        match kind.as_ref().map(|(k, c)| (k.as_str(), c.as_deref())) {
            Some((SESSION_CREATED, _)) => {
                let Ok(view) = serde_json::from_str::<SessionView>(&row.record.projection) else {
                    return;
                };
                self.ctx.hub.notify(ROOT, &row.record.project, || {
                    super::notification(
                        "root/sessionAdded",
                        json!({"channel": ROOT, "summary": super::summary(&view)}),
                    )
                });
            }
            Some((SESSION_SETTLED, Some("disposed"))) => {
                self.ctx.hub.notify(ROOT, &row.record.project, || {
                    super::notification(
                        "root/sessionRemoved",
                        json!({"channel": ROOT, "session": Channel::session_uri(session)}),
                    )
                });
            }
            _ => {}
        }
    }
}
