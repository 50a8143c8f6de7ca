//! The root channel (`ahp-root://`): its state (agents, the count of
//! active sessions), loaded from snapshot plus log at start, and its
//! actions, committed under one lock.

use ahp::reducers::{ReduceOutcome, apply_action_to_root};
use ahp_types::state::RootState;
use serde_json::{Value, json};
use tether_protocol::channel::{Channel, ROOT};
use tether_protocol::model::typed_action;

use super::commit::CommitOutcome;
use super::{DispatchOutcome, Engine, Refusal, RefusalKind, STORAGE_UNAVAILABLE, rules, validate};
use crate::store::{NewEnvelope, Origin, Snapshot, Store, StoreError, now_ms};

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
    pub(super) async fn commit_root(
        &self,
        action: Value,
        origin: Option<Origin>,
    ) -> Result<DispatchOutcome, Refusal> {
        let mut root = self.ctx.root.lock().await;
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
            }])
            .await
            .map_err(|_| {
                "Storage unavailable: the action was not recorded; retry it.".to_owned()
            })?;
        match outcome.into_iter().next() {
            Some(CommitOutcome::Committed(published)) => {
                root.state = trial;
                root.last_seq = published.seq;
                if published.seq % 64 == 0 {
                    self.snapshot_root(&root).await;
                }
                Ok(DispatchOutcome::Accepted(published))
            }
            Some(CommitOutcome::Duplicate(known)) => {
                Ok(validate::retry_outcome(&known, ROOT, &action))
            }
            None => Err(Refusal::new(RefusalKind::Unavailable, STORAGE_UNAVAILABLE)),
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
        let current = self
            .ctx
            .root
            .lock()
            .await
            .state
            .active_sessions
            .unwrap_or(0);
        let action = json!({"type": "root/activeSessionsChanged", "activeSessions": (current + delta).max(0)});
        if let Err(err) = self.commit_root(action, None).await {
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
    let channels = [ROOT.to_owned()];
    loop {
        let page = store
            .read_after(root.last_seq, Some(&channels), 2_000)
            .await?;
        let Some(last) = page.last() else { break };
        let last = last.seq;
        for envelope in page {
            let action: Value = serde_json::from_str(&envelope.action)
                .map_err(|e| StoreError::Corrupt(format!("root envelope {}: {e}", envelope.seq)))?;
            apply_action_to_root(&mut root.state, &typed_action(&action));
        }
        root.last_seq = last;
    }
    Ok(root)
}
