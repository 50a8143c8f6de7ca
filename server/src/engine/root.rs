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
use tokio::sync::mpsc;

use super::commit::CommitOutcome;
use super::{DispatchOutcome, Engine, Refusal, RefusalKind, STORAGE_UNAVAILABLE, rules, validate};
use crate::store::{NewEnvelope, Origin, Snapshot, Store, StoreError, StoredEnvelope, now_ms};

/// The root state with the seq it includes.
pub(super) struct RootModel {
    pub(super) state: RootState,
    pub(super) last_seq: u64,
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
    async fn commit_root_from(
        &self,
        action: impl FnOnce(&RootState) -> Value,
        origin: Option<Origin>,
    ) -> Result<DispatchOutcome, Refusal> {
        let unavailable = || Refusal::new(RefusalKind::Unavailable, STORAGE_UNAVAILABLE);
        // The host's own lock first: only one task per host then waits on
        // the cluster's lock, holding one pooled connection. Waiting on the
        // cluster's lock first, each concurrent root write held a connection
        // while it waited, and enough of them left the holder none to
        // commit with (sessions created 32 at a time timed the pool out).
        let mut root = self.ctx.root.lock().await;
        let cluster_lock = match &self.ctx.cluster {
            Some(cluster) => Some(cluster.lock_root().await.map_err(|_| unavailable())?),
            None => None,
        };
        if cluster_lock.is_some() {
            catch_up_root(self.ctx.store.as_ref(), &mut root)
                .await
                .map_err(|_| unavailable())?;
        }
        let action = action(&root.state);
        let outcome = self.commit_root_locked(&mut root, action, origin).await;
        drop(root);
        if let Some(lock) = cluster_lock {
            lock.release().await;
        }
        outcome
    }

    async fn commit_root_locked(
        &self,
        root: &mut RootModel,
        action: Value,
        origin: Option<Origin>,
    ) -> Result<DispatchOutcome, Refusal> {
        let typed = typed_action(&action);
        let mut trial = root.state.clone();
        match apply_action_to_root(&mut trial, &typed) {
            ReduceOutcome::Applied | ReduceOutcome::NoOp => {}
            other => {
                return Err(Refusal::from(format!(
                    "Action {} does not apply to the root channel ({other:?}).",
                    tether_protocol::actions::action_type(&action).unwrap_or("?")
                )));
            }
        }
        let outcome = self
            .ctx
            .committer
            .append(vec![NewEnvelope {
                channel: ROOT.to_owned(),
                session_id: None,
                action: action.to_string(),
                origin,
                session: None,
                chats: Vec::new(),
                turns: Vec::new(),
                directed: None,
                owner: None,
            }])
            .await
            .map_err(|err| super::storage_unavailable(&err))?;
        match outcome.into_iter().next() {
            Some(CommitOutcome::Committed(published)) => {
                root.state = trial;
                root.last_seq = published.seq;
                if published.seq % 64 == 0 {
                    self.snapshot_root(root).await;
                }
                Ok(DispatchOutcome::Accepted(published))
            }
            Some(CommitOutcome::Duplicate(known)) => {
                Ok(validate::retry_outcome(&known, ROOT, &action))
            }
            Some(CommitOutcome::Fenced) | None => {
                Err(Refusal::new(RefusalKind::Unavailable, STORAGE_UNAVAILABLE))
            }
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
        },
        None => RootModel {
            state: serde_json::from_value(json!({"agents": [], "activeSessions": 0}))
                .map_err(|e| StoreError::Corrupt(e.to_string()))?,
            last_seq: 0,
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
                self.ctx.hub.notify(
                    ROOT,
                    &row.record.project,
                    super::notification(
                        "root/sessionAdded",
                        json!({"channel": ROOT, "summary": super::summary(&view)}),
                    ),
                );
            }
            Some((SESSION_SETTLED, Some("disposed"))) => {
                self.ctx.hub.notify(
                    ROOT,
                    &row.record.project,
                    super::notification(
                        "root/sessionRemoved",
                        json!({"channel": ROOT, "session": Channel::session_uri(session)}),
                    ),
                );
            }
            _ => {}
        }
    }
}
