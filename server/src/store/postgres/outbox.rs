//! Webhooks and their deliveries on Postgres (DESIGN.md, "Finding,
//! notifying, keeping"): the outbox rows a group commit wrote, claimed,
//! attempted and pruned by the deliverer (`crate::webhooks`).

use sqlx::{AssertSqlSafe, PgPool};

use crate::store::webhooks::{self, Attempt, DeliveryRow, Due, Webhook};
use crate::store::{StoreError, clamp_limit, now_ms};

pub(super) async fn create_webhook(
    pool: &PgPool,
    w: &Webhook,
    most: usize,
) -> Result<bool, StoreError> {
    // One addition to a project at a time, across hosts: the count holds
    // until the commit.
    let mut tx = pool.begin().await?;
    sqlx::query("SELECT pg_advisory_xact_lock(hashtextextended('tether-webhooks:' || $1, 0))")
        .bind(&w.project)
        .execute(&mut *tx)
        .await?;
    let added = sqlx::query(
        "INSERT INTO webhooks (id, project, url, secret, events, created_ms, created_by) \
         SELECT $1, $2, $3, $4, $5, $6, $7 \
         WHERE (SELECT count(*) FROM webhooks WHERE project = $2) < $8",
    )
    .bind(&w.id)
    .bind(&w.project)
    .bind(&w.url)
    .bind(&w.secret)
    .bind(&w.events)
    .bind(w.created_ms)
    .bind(&w.created_by)
    .bind(i64::try_from(most).unwrap_or(i64::MAX))
    .execute(&mut *tx)
    .await?;
    tx.commit().await?;
    Ok(added.rows_affected() == 1)
}

pub(super) async fn webhooks(pool: &PgPool, project: &str) -> Result<Vec<Webhook>, StoreError> {
    Ok(sqlx::query_as(
        "SELECT id, project, url, secret, events, created_ms, created_by FROM webhooks \
         WHERE project = $1 ORDER BY created_ms, id",
    )
    .bind(project)
    .fetch_all(pool)
    .await?)
}

pub(super) async fn delete_webhook(
    pool: &PgPool,
    project: &str,
    id: &str,
) -> Result<bool, StoreError> {
    let mut tx = pool.begin().await?;
    let gone = sqlx::query("DELETE FROM webhooks WHERE id = $1 AND project = $2")
        .bind(id)
        .bind(project)
        .execute(&mut *tx)
        .await?
        .rows_affected();
    if gone > 0 {
        sqlx::query("DELETE FROM deliveries WHERE webhook_id = $1")
            .bind(id)
            .execute(&mut *tx)
            .await?;
        sqlx::query(
            "DELETE FROM outbox WHERE project = $1 AND NOT EXISTS \
             (SELECT 1 FROM deliveries d WHERE d.event_id = outbox.event_id)",
        )
        .bind(project)
        .execute(&mut *tx)
        .await?;
    }
    tx.commit().await?;
    Ok(gone > 0)
}

pub(super) async fn claim_deliveries(
    pool: &PgPool,
    claimer: &str,
    now_ms: i64,
    hold_ms: i64,
    limit: u32,
) -> Result<Vec<Due>, StoreError> {
    // SKIP LOCKED: hosts claiming at once take different deliveries.
    Ok(sqlx::query_as(AssertSqlSafe(format!(
        "WITH c AS (UPDATE deliveries d SET claimed_by = $1, claimed_until = $2 + $3, \
                        attempts = d.attempts + 1 \
                    FROM (SELECT event_id, webhook_id FROM deliveries \
                          WHERE delivered_ms IS NULL AND failed_ms IS NULL AND next_ms <= $2 \
                            AND (claimed_until IS NULL OR claimed_until < $2) \
                          ORDER BY next_ms LIMIT $4 FOR UPDATE SKIP LOCKED) due \
                    WHERE d.event_id = due.event_id AND d.webhook_id = due.webhook_id \
                    RETURNING d.*) \
         SELECT {} FROM c d JOIN webhooks w ON w.id = d.webhook_id \
         JOIN outbox o ON o.event_id = d.event_id",
        webhooks::DUE_COLUMNS
    )))
    .bind(claimer)
    .bind(now_ms)
    .bind(hold_ms)
    .bind(clamp_limit(limit))
    .fetch_all(pool)
    .await?)
}

pub(super) async fn release_deliveries(pool: &PgPool, claimer: &str) -> Result<(), StoreError> {
    sqlx::query(
        "UPDATE deliveries SET claimed_by = NULL, claimed_until = NULL WHERE claimed_by = $1",
    )
    .bind(claimer)
    .execute(pool)
    .await?;
    Ok(())
}

pub(super) async fn record_attempt(
    pool: &PgPool,
    event_id: &str,
    webhook_id: &str,
    attempt: &Attempt,
) -> Result<(), StoreError> {
    let query = match attempt {
        Attempt::Delivered { status } => sqlx::query(
            "UPDATE deliveries SET delivered_ms = $3, last_status = $4, last_error = NULL, \
                 claimed_by = NULL, claimed_until = NULL \
             WHERE event_id = $1 AND webhook_id = $2",
        )
        .bind(event_id)
        .bind(webhook_id)
        .bind(now_ms())
        .bind(i64::from(*status)),
        Attempt::Failed {
            status,
            error,
            retry_ms,
        } => sqlx::query(
            "UPDATE deliveries SET next_ms = COALESCE($3, next_ms), \
                 failed_ms = CASE WHEN $3::bigint IS NULL THEN $4 END, \
                 last_status = $5, last_error = $6, claimed_by = NULL, claimed_until = NULL \
             WHERE event_id = $1 AND webhook_id = $2",
        )
        .bind(event_id)
        .bind(webhook_id)
        .bind(*retry_ms)
        .bind(now_ms())
        .bind(status.map(i64::from))
        .bind(error.as_str()),
    };
    query.execute(pool).await?;
    Ok(())
}

pub(super) async fn prune_deliveries(
    pool: &PgPool,
    before_ms: i64,
    limit: u32,
) -> Result<u64, StoreError> {
    let mut tx = pool.begin().await?;
    let gone = sqlx::query(
        "DELETE FROM deliveries WHERE (event_id, webhook_id) IN \
             (SELECT d.event_id, d.webhook_id FROM deliveries d \
              JOIN outbox o ON o.event_id = d.event_id \
              WHERE (d.delivered_ms IS NOT NULL OR d.failed_ms IS NOT NULL) \
                AND o.at_ms < $1 LIMIT $2)",
    )
    .bind(before_ms)
    .bind(i64::from(limit))
    .execute(&mut *tx)
    .await?
    .rows_affected();
    sqlx::query(
        "DELETE FROM outbox WHERE at_ms < $1 AND NOT EXISTS \
         (SELECT 1 FROM deliveries d WHERE d.event_id = outbox.event_id)",
    )
    .bind(before_ms)
    .execute(&mut *tx)
    .await?;
    tx.commit().await?;
    Ok(gone)
}

pub(super) async fn deliveries(
    pool: &PgPool,
    webhook_id: &str,
    limit: u32,
) -> Result<Vec<DeliveryRow>, StoreError> {
    Ok(sqlx::query_as(AssertSqlSafe(format!(
        "SELECT {} FROM deliveries d JOIN outbox o ON o.event_id = d.event_id \
         WHERE d.webhook_id = $1 ORDER BY o.seq DESC, o.kind LIMIT $2",
        webhooks::DELIVERY_COLUMNS
    )))
    .bind(webhook_id)
    .bind(clamp_limit(limit))
    .fetch_all(pool)
    .await?)
}
