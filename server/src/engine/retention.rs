//! Retention: settled sessions past their project's limit are deleted
//! with everything they own, by a background round every
//! `retention_interval`, at most [`ROUND`] sessions a round, one host at a
//! time (the store's delete is exclusive), never a session that is live or
//! in memory on this host (its actor is kept from starting while it goes),
//! logged and counted (DESIGN.md, "Finding, notifying, keeping").

use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use tether_protocol::channel::{Channel, ROOT};

use super::Ctx;
use crate::store::now_ms;

/// Sessions deleted per round at most.
pub const ROUND: u32 = 100;

/// Days a finished webhook delivery (delivered or given up) is kept, for
/// `GET …/deliveries`; older ones are deleted by the rounds.
pub const DELIVERIES_KEPT_DAYS: i64 = 30;

/// Finished deliveries deleted per round at most.
const DELIVERIES_ROUND: u32 = 10_000;

/// Starts the rounds.
pub(super) fn start(ctx: Arc<Ctx>, every: Duration) {
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            if let Err(err) = round(&ctx).await {
                ctx.metrics.store_error("retention");
                tracing::warn!(error = %err, "retention round failed; next round retries");
            }
        }
    });
}

/// Forgets sessions deleted (here, or by another host's retention): their
/// chats are no longer theirs (the store's rows are gone), so an id made
/// again starts afresh, and no subscription here outlives them.
/// Subscriptions whose snapshot is older than seq `before` (a seq issued
/// after the sessions' last envelope and before their deletion) are of the
/// deleted sessions; a session made again since is newer.
fn forget_deleted(ctx: &Ctx, deleted: &[String], before: u64) {
    let chats = ctx.chats.forget_owned_by(deleted);
    ctx.hub.end_channels(
        |channel| {
            chats.iter().any(|c| c == channel)
                || Channel::parse(channel)
                    .ok()
                    .and_then(|c| c.named_session().map(|s| deleted.iter().any(|d| d == s)))
                    .unwrap_or(false)
        },
        before,
    );
}

/// With several hosts: forgets what the other hosts' retention deleted.
pub(super) fn start_hearing(ctx: Arc<Ctx>) {
    let Some(cluster) = ctx.cluster.clone() else {
        return;
    };
    let stop = cluster.stop.clone();
    tokio::spawn(stop.run_until_cancelled_owned(async move {
        loop {
            cluster.wake.gone.notified().await;
            for (before, deleted) in cluster.take_gone() {
                tracing::debug!(
                    sessions = deleted.len(),
                    "another host's retention deleted sessions"
                );
                forget_deleted(&ctx, &deleted, before);
            }
        }
    }));
}

/// One round: finds the expired sessions and deletes those not in use;
/// returns how many were deleted.
pub(super) async fn round(ctx: &Arc<Ctx>) -> Result<usize, crate::store::StoreError> {
    let kept_from = now_ms() - DELIVERIES_KEPT_DAYS * 86_400_000;
    let pruned = ctx
        .store
        .prune_deliveries(kept_from, DELIVERIES_ROUND)
        .await?;
    if pruned > 0 {
        tracing::info!(
            deliveries = pruned,
            "retention: finished webhook deliveries deleted"
        );
    }
    let expired = ctx.store.expired_sessions(now_ms(), ROUND).await?;
    if expired.is_empty() {
        return Ok(0);
    }
    // Sessions with an actor here are in use: left for a later round.
    let held: Vec<_> = expired
        .into_iter()
        .filter(|s| ctx.begin_retiring(&s.id))
        .collect();
    // Above every envelope of theirs (long published: they are settled
    // and not in memory), below any of a session made again with an id.
    let before = ctx.hub.published() + 1;
    let result = ctx.store.delete_sessions(&held).await;
    // Their agents' scratch directories (HOMEs: histories, caches, logins)
    // go too, before an id made again may start an agent in one; off the
    // async workers, a HOME full of caches takes a while.
    if let Ok(deleted) = &result {
        let sandbox = ctx.config.sandbox.clone();
        let ids = deleted.clone();
        let removed = tokio::task::spawn_blocking(move || {
            ids.into_iter()
                .filter_map(|id| sandbox.remove_scratch(&id).err().map(|err| (id, err)))
                .collect::<Vec<_>>()
        })
        .await
        .unwrap_or_default();
        for (id, err) in removed {
            tracing::warn!(session = %id, error = %err, "retention: the agent's scratch directory was not removed");
        }
    }
    for s in &held {
        ctx.end_retiring(&s.id);
    }
    let deleted = result?;
    forget_deleted(ctx, &deleted, before);
    if let Some(cluster) = ctx.cluster.as_ref().filter(|_| !deleted.is_empty()) {
        // The other hosts do the same.
        if let Err(err) = cluster.announce_gone(&deleted, before).await {
            tracing::warn!(error = %err, "retention: the other hosts were not told of the deleted sessions");
        }
    }
    for s in held.iter().filter(|s| deleted.contains(&s.id)) {
        tracing::info!(session = %s.id, project = %s.project, "retention: settled session deleted");
        ctx.hub.notify(ROOT, &s.project, || {
            super::notification(
                "root/sessionRemoved",
                json!({"channel": ROOT, "session": Channel::session_uri(&s.id)}),
            )
        });
    }
    ctx.metrics.retention_deleted.inc_by(deleted.len() as u64);
    Ok(deleted.len())
}
