//! Retention on Postgres: the settled sessions past their project's limit,
//! and their deletion with everything they own, each row found through an
//! index (the host row, and so every append, is locked meanwhile).

use sqlx::{AssertSqlSafe, PgPool};

use super::PostgresStore;
use crate::store::{
    Expired, Prefixes, StoreError, clamp_limit, owned_rows_sql, seq_to_db, session_rows_sql,
};

/// The advisory lock a retention round holds (one host at a time).
const RETENTION_LOCK: i64 = 0x7465_7468_6572_0002;

/// The settled sessions past their project's limit, the longest idle first
/// (at most `limit`).
pub(super) async fn expired_sessions(
    pool: &PgPool,
    now_ms: i64,
    limit: u32,
) -> Result<Vec<Expired>, StoreError> {
    let rows: Vec<(String, String, i64)> = sqlx::query_as(
        // `idle_hour` is `updated_ms` by the hour, which its index holds
        // (migration 0016).
        "SELECT s.id, s.project, s.last_seq FROM retention r \
         JOIN sessions s ON s.project = r.project AND s.state <> 'live' \
             AND s.idle_hour <= ($1 - r.days * 86400000) / 3600000 \
             AND s.updated_ms < $1 - r.days * 86400000 \
         ORDER BY s.idle_hour, s.updated_ms LIMIT $2",
    )
    .bind(now_ms)
    .bind(clamp_limit(limit))
    .fetch_all(pool)
    .await?;
    Expired::from_rows(rows)
}

impl PostgresStore {
    /// The statements retention runs for each session it deletes, after
    /// the session's row, each taking the session's id as `$1`: its log
    /// rows, then everything else it owns. They run with the host row (and
    /// so every append) locked, so each finds its rows through an index;
    /// public for the test that holds them to that.
    pub fn retention_statements() -> Vec<String> {
        let p = "$1::text";
        let mut statements = session_rows_sql("log", p, Prefixes::Collated);
        statements.extend(owned_rows_sql(p, Prefixes::Collated));
        statements
    }

    /// Deletes those of `sessions` still settled, unwritten since they were
    /// found and held by no host, with everything they own; returns their
    /// ids (none when another host's round runs).
    pub(super) async fn delete_expired(
        &self,
        sessions: &[Expired],
    ) -> Result<Vec<String>, StoreError> {
        let mut tx = self.pool.begin().await?;
        // One deleting host at a time: another's round finds the lock
        // taken and deletes nothing.
        let mine: bool = sqlx::query_scalar("SELECT pg_try_advisory_xact_lock($1)")
            .bind(RETENTION_LOCK)
            .fetch_one(&mut *tx)
            .await?;
        if !mine {
            return Ok(Vec::new());
        }
        // Appends and lease changes wait while the host row is locked.
        Self::lock_host(&mut tx).await?;
        let statements = Self::retention_statements();
        let mut deleted = Vec::new();
        for s in sessions {
            let gone = sqlx::query(
                "DELETE FROM sessions WHERE id = $1 AND last_seq = $2 AND state <> 'live' \
                 AND NOT EXISTS (SELECT 1 FROM leases WHERE session_id = $1 \
                                                       AND expires_at > now())",
            )
            .bind(&s.id)
            .bind(seq_to_db(s.last_seq))
            .execute(&mut *tx)
            .await?;
            if gone.rows_affected() == 0 {
                continue;
            }
            for sql in &statements {
                sqlx::query(AssertSqlSafe(sql.as_str()))
                    .bind(&s.id)
                    .execute(&mut *tx)
                    .await?;
            }
            // A host that still thinks it writes the session is fenced:
            // the lease is another's (expired, so a new session of this id
            // takes it at once).
            sqlx::query(
                "INSERT INTO leases (session_id, holder, expires_at) VALUES ($1, 'retired', now()) \
                 ON CONFLICT (session_id) DO UPDATE SET holder = 'retired', expires_at = now()",
            )
            .bind(&s.id)
            .execute(&mut *tx)
            .await?;
            deleted.push(s.id.clone());
        }
        tx.commit().await?;
        Ok(deleted)
    }
}
