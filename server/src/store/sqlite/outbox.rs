//! The webhook outbox's writes on the SQLite writer (DESIGN.md, "Finding,
//! notifying, keeping"): each runs inside the writer's transaction; the
//! store's methods only hand them over.

use rusqlite::Transaction;

use super::super::webhooks::{Attempt, Webhook};
use super::super::{StoreError, now_ms};

/// Adds a webhook.
pub(super) fn create_webhook(
    tx: &Transaction<'_>,
    w: &Webhook,
    most: usize,
) -> Result<bool, StoreError> {
    // The writer runs one transaction at a time: the count holds.
    let added = tx
        .prepare_cached(
            "INSERT INTO webhooks (id, project, url, secret, events, created_ms, created_by) \
             SELECT ?1, ?2, ?3, ?4, ?5, ?6, ?7 \
             WHERE (SELECT count(*) FROM webhooks WHERE project = ?2) < ?8",
        )?
        .execute(rusqlite::params![
            w.id,
            w.project,
            w.url,
            w.secret,
            w.events,
            w.created_ms,
            w.created_by,
            i64::try_from(most).unwrap_or(i64::MAX)
        ])?;
    Ok(added == 1)
}

/// Deletes a project's webhook, its deliveries and the events no delivery
/// needs any more; whether it was there.
pub(super) fn delete_webhook(
    tx: &Transaction<'_>,
    project: &str,
    id: &str,
) -> Result<bool, StoreError> {
    let gone = tx
        .prepare_cached("DELETE FROM webhooks WHERE id = ?1 AND project = ?2")?
        .execute([id, project])?;
    if gone > 0 {
        tx.prepare_cached("DELETE FROM deliveries WHERE webhook_id = ?1")?
            .execute([id])?;
        tx.prepare_cached(
            "DELETE FROM outbox WHERE project = ?1 AND NOT EXISTS \
             (SELECT 1 FROM deliveries d WHERE d.event_id = outbox.event_id)",
        )?
        .execute([project])?;
    }
    Ok(gone > 0)
}

/// Claims up to `limit` deliveries that are due for `claimer` until
/// `now_ms + hold_ms`; their `(event, webhook)` keys.
pub(super) fn claim_deliveries(
    tx: &Transaction<'_>,
    claimer: &str,
    now_ms: i64,
    hold_ms: i64,
    limit: u32,
) -> Result<Vec<(String, String)>, StoreError> {
    let mut claim = tx.prepare_cached(
        "UPDATE deliveries SET claimed_by = ?1, claimed_until = ?2 + ?3, \
             attempts = attempts + 1 \
         WHERE rowid IN (SELECT rowid FROM deliveries \
             WHERE delivered_ms IS NULL AND failed_ms IS NULL AND next_ms <= ?2 \
               AND (claimed_until IS NULL OR claimed_until < ?2) \
             ORDER BY next_ms LIMIT ?4) \
         RETURNING event_id, webhook_id",
    )?;
    let rows = claim
        .query_map(
            rusqlite::params![claimer, now_ms, hold_ms, i64::from(limit)],
            |row| Ok((row.get(0)?, row.get(1)?)),
        )?
        .collect::<Result<Vec<_>, _>>()?;
    Ok(rows)
}

/// Records how an attempt to deliver went.
pub(super) fn record_attempt(
    tx: &Transaction<'_>,
    event: &str,
    webhook: &str,
    attempt: &Attempt,
) -> Result<(), StoreError> {
    match attempt {
        Attempt::Delivered { status } => tx
            .prepare_cached(
                "UPDATE deliveries SET delivered_ms = ?3, last_status = ?4, \
                     last_error = NULL, claimed_by = NULL, claimed_until = NULL \
                 WHERE event_id = ?1 AND webhook_id = ?2",
            )?
            .execute(rusqlite::params![event, webhook, now_ms(), status])?,
        Attempt::Failed {
            status,
            error,
            retry_ms,
        } => tx
            .prepare_cached(
                "UPDATE deliveries SET next_ms = COALESCE(?3, next_ms), \
                     failed_ms = CASE WHEN ?3 IS NULL THEN ?4 END, \
                     last_status = ?5, last_error = ?6, \
                     claimed_by = NULL, claimed_until = NULL \
                 WHERE event_id = ?1 AND webhook_id = ?2",
            )?
            .execute(rusqlite::params![
                event,
                webhook,
                retry_ms,
                now_ms(),
                status,
                error
            ])?,
    };
    Ok(())
}

/// Deletes up to `limit` finished deliveries of events older than
/// `before_ms`, and the events no delivery needs any more; how many
/// deliveries went.
pub(super) fn prune_deliveries(
    tx: &Transaction<'_>,
    before_ms: i64,
    limit: u32,
) -> Result<u64, StoreError> {
    let gone = tx
        .prepare_cached(
            "DELETE FROM deliveries WHERE rowid IN (SELECT d.rowid FROM deliveries d \
                 JOIN outbox o ON o.event_id = d.event_id \
                 WHERE (d.delivered_ms IS NOT NULL OR d.failed_ms IS NOT NULL) \
                   AND o.at_ms < ?1 LIMIT ?2)",
        )?
        .execute(rusqlite::params![before_ms, i64::from(limit)])?;
    tx.prepare_cached(
        "DELETE FROM outbox WHERE at_ms < ?1 AND NOT EXISTS \
         (SELECT 1 FROM deliveries d WHERE d.event_id = outbox.event_id)",
    )?
    .execute([before_ms])?;
    Ok(gone as u64)
}
