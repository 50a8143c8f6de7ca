//! The Postgres side: what it already holds, the progress table that makes
//! a copy resumable, and the batched writes.
//!
//! Every batch commits its rows together with the new resume point in
//! `migration_progress`, so after a crash at any moment the two agree and a
//! re-run continues with the first row not yet committed, never writing one
//! twice. The host row gets the source's epoch when the progress table is
//! created (in the same transaction) and its `last_seq` only at the end: a
//! half-copied target never claims the source's last seq.

use std::time::Duration;

use futures_util::TryStreamExt;
use sqlx::postgres::{PgConnectOptions, PgConnection, PgPool, PgPoolOptions, PgRow};
use sqlx::{AssertSqlSafe, Connection};

use super::MigrateError;
use super::source::Host;
use super::tables::{BOOKKEEPING, Cell, Kind, TABLES, Table, cells};
use crate::store::{PostgresStore, StoreError, StoreOptions, redact_url};

/// The table recording how far each table's copy got. Created by the
/// migration and dropped once it has verified the copy.
pub(super) const PROGRESS_TABLE: &str = "migration_progress";

/// The advisory lock key a running `tether migrate` holds on its target
/// (any constant; this is "tether-mg" in ASCII), so that two runs never
/// write the same target at once.
const ADVISORY_KEY: i64 = 0x7465_7468_6572_6d67;

/// What the target holds before the copy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Found {
    /// No Tether data: copy from the start.
    Empty,
    /// An interrupted copy of this source: resume it.
    Partial,
    /// A finished copy of this source, whose host row says `last_seq`.
    Complete { last_seq: i64 },
}

/// How far one table's copy got.
#[derive(Debug, Clone, Default)]
pub(super) struct TableProgress {
    /// The key of the last row committed; `None` before the first batch.
    pub last_key: Option<Vec<Cell>>,
    /// Rows committed so far.
    pub rows: i64,
    /// The whole table is copied.
    pub done: bool,
}

/// One batch of rows, column by column, as `UNNEST` takes them.
#[derive(Debug)]
pub(super) struct Batch {
    pub columns: Vec<Values>,
    pub rows: usize,
    pub bytes: usize,
    pub last_key: Vec<Cell>,
}

/// One column's values.
#[derive(Debug)]
pub(super) enum Values {
    Int(Vec<i64>),
    OptInt(Vec<Option<i64>>),
    Text(Vec<String>),
    OptText(Vec<Option<String>>),
    Bool(Vec<bool>),
    Bytes(Vec<Vec<u8>>),
}

impl Batch {
    /// An empty batch for `table`.
    pub fn new(table: &Table, capacity: usize) -> Self {
        let columns = table
            .columns
            .iter()
            .map(|c| match c.kind {
                Kind::Int => Values::Int(Vec::with_capacity(capacity)),
                Kind::OptInt => Values::OptInt(Vec::with_capacity(capacity)),
                Kind::Text => Values::Text(Vec::with_capacity(capacity)),
                Kind::OptText => Values::OptText(Vec::with_capacity(capacity)),
                Kind::Bool => Values::Bool(Vec::with_capacity(capacity)),
                Kind::Bytes => Values::Bytes(Vec::with_capacity(capacity)),
            })
            .collect();
        Self {
            columns,
            rows: 0,
            bytes: 0,
            last_key: Vec::new(),
        }
    }

    /// Adds a row (decoded by the table's own kinds, so the cells fit).
    pub fn push(&mut self, table: &Table, row: Vec<Cell>) -> Result<(), String> {
        self.last_key = table.key.iter().map(|&i| row[i].clone()).collect();
        for (values, cell) in self.columns.iter_mut().zip(row) {
            self.bytes += cell.size();
            match (values, cell) {
                (Values::Int(v), Cell::Int(n)) => v.push(n),
                (Values::OptInt(v), Cell::Int(n)) => v.push(Some(n)),
                (Values::OptInt(v), Cell::Null) => v.push(None),
                (Values::Text(v), Cell::Text(t)) => v.push(t),
                (Values::OptText(v), Cell::Text(t)) => v.push(Some(t)),
                (Values::OptText(v), Cell::Null) => v.push(None),
                (Values::Bool(v), Cell::Bool(b)) => v.push(b),
                (Values::Bytes(v), Cell::Bytes(b)) => v.push(b),
                (_, cell) => return Err(format!("unexpected value {}", cell.show())),
            }
        }
        self.rows += 1;
        Ok(())
    }
}

/// The target database.
#[derive(Debug)]
pub(super) struct Target {
    /// The URL as given (it may hold a password: never print it).
    url: String,
    pub pool: PgPool,
    /// Holds the advisory lock for the whole run.
    guard: PgConnection,
}

impl Target {
    /// Connects, and takes the target's migration lock.
    pub async fn connect(url: &str, connect_timeout: Duration) -> Result<Self, MigrateError> {
        let shown = redact_url(url);
        let options: PgConnectOptions = url.parse().map_err(|e: sqlx::Error| {
            MigrateError::Usage(format!("--to {shown} is not a valid Postgres URL: {e}"))
        })?;
        // A lost batch is harmless (its resume point is lost with it), so
        // batches commit without waiting for the disk; the final commit
        // waits, and with it everything before it.
        let options = options.options([("synchronous_commit", "off")]);
        let unreachable =
            |e: sqlx::Error| MigrateError::Target(format!("cannot reach the target {shown}: {e}"));
        let mut guard = tokio::time::timeout(connect_timeout, PgConnection::connect_with(&options))
            .await
            .map_err(|_| {
                MigrateError::Target(format!(
                    "cannot reach the target {shown}: no answer within {} s",
                    connect_timeout.as_secs()
                ))
            })?
            .map_err(unreachable)?;
        let locked: bool = sqlx::query_scalar("SELECT pg_try_advisory_lock($1)")
            .bind(ADVISORY_KEY)
            .fetch_one(&mut guard)
            .await
            .map_err(unreachable)?;
        if !locked {
            return Err(MigrateError::Target(format!(
                "another tether migrate is writing to {shown}; wait for it to finish"
            )));
        }
        let pool = PgPoolOptions::new()
            .max_connections(4)
            .acquire_timeout(connect_timeout)
            .connect_with(options)
            .await
            .map_err(unreachable)?;
        Ok(Self {
            url: url.to_owned(),
            pool,
            guard,
        })
    }

    /// The target as printed: its URL without a password.
    pub fn shown(&self) -> String {
        redact_url(&self.url)
    }

    fn db(&self) -> impl Fn(sqlx::Error) -> MigrateError + '_ {
        move |e| MigrateError::Target(format!("the target {}: {e}", self.shown()))
    }

    /// What the target already holds, refusing anything but an empty
    /// database or a copy of this same source.
    pub async fn inspect(&self, source: &Host) -> Result<Found, MigrateError> {
        let tables: Vec<String> = sqlx::query_scalar(
            "SELECT tablename::text FROM pg_tables WHERE schemaname = current_schema()",
        )
        .fetch_all(&self.pool)
        .await
        .map_err(self.db())?;
        let has = |name: &str| tables.iter().any(|t| t == name);
        if has(PROGRESS_TABLE) {
            let started: Vec<(String, i64)> = sqlx::query_as(AssertSqlSafe(format!(
                "SELECT DISTINCT source_epoch, source_last_seq FROM {PROGRESS_TABLE}"
            )))
            .fetch_all(&self.pool)
            .await
            .map_err(self.db())?;
            let host = self.host().await?;
            let theirs = host.as_ref().map(|h| h.epoch.as_str());
            if started.iter().any(|(e, _)| *e != source.epoch) || theirs != Some(&source.epoch) {
                return Err(MigrateError::Target(format!(
                    "the target holds an unfinished migration of another database (epoch {}); \
                     this source is epoch {}: use an empty database",
                    started
                        .first()
                        .map(|(e, _)| e.as_str())
                        .or(theirs)
                        .unwrap_or("unknown"),
                    source.epoch
                )));
            }
            // A server ran on the source since: rows already copied may
            // have changed, so the copy cannot simply go on.
            if let Some((_, then)) = started.iter().find(|(_, seq)| *seq != source.last_seq) {
                return Err(MigrateError::Target(format!(
                    "the source changed since the interrupted migration (its last seq was \
                     {then}, now {}): recreate the target database empty and migrate again",
                    source.last_seq
                )));
            }
            return Ok(Found::Partial);
        }
        if tables.is_empty() {
            return Ok(Found::Empty);
        }
        // Tables the copy leaves alone are Tether's too (BOOKKEEPING).
        let ours =
            |t: &str| t == "host" || BOOKKEEPING.contains(&t) || TABLES.iter().any(|x| x.name == t);
        if let Some(foreign) = tables.iter().find(|t| !ours(t)) {
            return Err(MigrateError::Target(format!(
                "the target database is not empty: it has a table {foreign:?} that is not \
                 Tether's; migrate into an empty database"
            )));
        }
        let mut rows = false;
        for table in TABLES.iter().filter(|t| has(t.name)) {
            let any: bool = sqlx::query_scalar(AssertSqlSafe(format!(
                "SELECT EXISTS (SELECT 1 FROM {})",
                table.name
            )))
            .fetch_one(&self.pool)
            .await
            .map_err(self.db())?;
            rows |= any;
        }
        let host = if has("host") {
            self.host().await?
        } else {
            None
        };
        match host {
            _ if !rows && host.as_ref().is_none_or(|h| h.last_seq == 0) => Ok(Found::Empty),
            Some(h) if h.epoch == source.epoch => Ok(Found::Complete {
                last_seq: h.last_seq,
            }),
            Some(h) => Err(MigrateError::Target(format!(
                "the target already holds another Tether database (epoch {}, last seq {}); this \
                 source is epoch {}: migrate into an empty database",
                h.epoch, h.last_seq, source.epoch
            ))),
            None => Err(MigrateError::Target(
                "the target database is not empty (it has Tether rows but no host row); migrate \
                 into an empty database"
                    .into(),
            )),
        }
    }

    /// The host row, if there is one.
    pub async fn host(&self) -> Result<Option<Host>, MigrateError> {
        let row: Option<(String, i64)> =
            sqlx::query_as("SELECT epoch, last_seq FROM host WHERE id = 1")
                .fetch_optional(&self.pool)
                .await
                .map_err(self.db())?;
        Ok(row.map(|(epoch, last_seq)| Host { epoch, last_seq }))
    }

    /// Runs the Postgres migrations (through the store, as `tether serve`
    /// would) and checks the resulting schema is the one copied into.
    pub async fn migrate_schema(&self, options: &StoreOptions) -> Result<(), MigrateError> {
        let store = PostgresStore::open(&self.url, options)
            .await
            .map_err(|e| match e {
                StoreError::Open { reason, .. } => MigrateError::Target(format!(
                    "cannot prepare the target {}: {reason}",
                    self.shown()
                )),
                other => MigrateError::Target(other.to_string()),
            })?;
        crate::store::Store::close(&store).await;
        // Generated columns (migration 0016's buckets) hold nothing of
        // their own: Postgres computes them as the rows are copied in.
        let columns: Vec<(String, String)> = sqlx::query_as(
            "SELECT table_name::text, column_name::text FROM information_schema.columns \
             WHERE table_schema = current_schema() AND is_generated = 'NEVER' \
             ORDER BY table_name, ordinal_position",
        )
        .fetch_all(&self.pool)
        .await
        .map_err(self.db())?;
        let mut found: Vec<(String, Vec<String>)> = Vec::new();
        for (table, column) in columns {
            match found.last_mut() {
                Some((t, cols)) if *t == table => cols.push(column),
                _ => found.push((table, vec![column])),
            }
        }
        super::tables::check_schema("target", &found).map_err(MigrateError::Target)
    }

    /// Starts a copy of `source` into the (empty, migrated) target: the
    /// progress table and the source's epoch, in one transaction.
    pub async fn begin_copy(&self, source: &Host) -> Result<(), MigrateError> {
        let db = self.db();
        let mut tx = self.pool.begin().await.map_err(&db)?;
        sqlx::query(AssertSqlSafe(format!(
            "CREATE TABLE {PROGRESS_TABLE} (
                table_name      TEXT    PRIMARY KEY,
                source_epoch    TEXT    NOT NULL,
                source_last_seq BIGINT  NOT NULL,
                last_key        TEXT,
                rows            BIGINT  NOT NULL DEFAULT 0,
                done            BOOLEAN NOT NULL DEFAULT false
            )"
        )))
        .execute(&mut *tx)
        .await
        .map_err(&db)?;
        let names: Vec<&str> = TABLES.iter().map(|t| t.name).chain(["host"]).collect();
        sqlx::query(AssertSqlSafe(format!(
            "INSERT INTO {PROGRESS_TABLE} (table_name, source_epoch, source_last_seq) \
             SELECT name, $2, $3 FROM UNNEST($1::text[]) AS name"
        )))
        .bind(names)
        .bind(&source.epoch)
        .bind(source.last_seq)
        .execute(&mut *tx)
        .await
        .map_err(&db)?;
        // The store's open inserted a host row with a fresh epoch; the
        // copy keeps the source's, and last_seq stays 0 until the end.
        sqlx::query(
            "INSERT INTO host (id, epoch, last_seq) VALUES (1, $1, 0) \
             ON CONFLICT (id) DO UPDATE SET epoch = excluded.epoch, last_seq = 0",
        )
        .bind(&source.epoch)
        .execute(&mut *tx)
        .await
        .map_err(&db)?;
        tx.commit().await.map_err(&db)?;
        Ok(())
    }

    /// How far `table`'s copy got.
    pub async fn progress(&self, table: &str) -> Result<TableProgress, MigrateError> {
        let row: Option<(Option<String>, i64, bool)> = sqlx::query_as(AssertSqlSafe(format!(
            "SELECT last_key, rows, done FROM {PROGRESS_TABLE} WHERE table_name = $1"
        )))
        .bind(table)
        .fetch_optional(&self.pool)
        .await
        .map_err(self.db())?;
        let Some((key, rows, done)) = row else {
            return Ok(TableProgress::default());
        };
        let last_key = key
            .map(|text| {
                serde_json::from_str::<Vec<serde_json::Value>>(&text)
                    .ok()
                    .and_then(|values| values.iter().map(Cell::from_json).collect())
                    .ok_or_else(|| {
                        MigrateError::Target(format!(
                            "the target's {PROGRESS_TABLE} row for {table} is unreadable: {text}"
                        ))
                    })
            })
            .transpose()?;
        Ok(TableProgress {
            last_key,
            rows,
            done,
        })
    }

    /// Inserts one batch and moves the resume point past it, atomically.
    pub async fn write(&self, table: &Table, batch: Batch, rows: i64) -> Result<(), MigrateError> {
        let fail = |e: sqlx::Error| MigrateError::Copy {
            table: table.name,
            reason: e.to_string(),
        };
        let arrays = table
            .columns
            .iter()
            .enumerate()
            .map(|(i, c)| format!("${}::{}", i + 1, c.kind.pg_array()))
            .collect::<Vec<_>>()
            .join(", ");
        let sql = format!(
            "INSERT INTO {} ({}) SELECT * FROM UNNEST({arrays})",
            table.name,
            table.column_list()
        );
        let mut insert = sqlx::query(AssertSqlSafe(sql));
        for values in batch.columns {
            insert = match values {
                Values::Int(v) => insert.bind(v),
                Values::OptInt(v) => insert.bind(v),
                Values::Text(v) => insert.bind(v),
                Values::OptText(v) => insert.bind(v),
                Values::Bool(v) => insert.bind(v),
                Values::Bytes(v) => insert.bind(v),
            };
        }
        let key = serde_json::Value::Array(batch.last_key.iter().map(Cell::to_json).collect());
        let mut tx = self.pool.begin().await.map_err(fail)?;
        insert.execute(&mut *tx).await.map_err(fail)?;
        sqlx::query(AssertSqlSafe(format!(
            "UPDATE {PROGRESS_TABLE} SET last_key = $1, rows = $2 WHERE table_name = $3"
        )))
        .bind(key.to_string())
        .bind(rows)
        .bind(table.name)
        .execute(&mut *tx)
        .await
        .map_err(fail)?;
        tx.commit().await.map_err(fail)?;
        Ok(())
    }

    /// Marks a table's copy finished.
    pub async fn done(&self, table: &str) -> Result<(), MigrateError> {
        sqlx::query(AssertSqlSafe(format!(
            "UPDATE {PROGRESS_TABLE} SET done = true WHERE table_name = $1"
        )))
        .bind(table)
        .execute(&self.pool)
        .await
        .map_err(self.db())?;
        Ok(())
    }

    /// Sets the host's `last_seq` to the source's, last of all, and waits
    /// for that commit (and so every earlier one) to be durable.
    pub async fn finish(&self, source: &Host) -> Result<(), MigrateError> {
        let db = self.db();
        let mut tx = self.pool.begin().await.map_err(&db)?;
        sqlx::query("SET LOCAL synchronous_commit = on")
            .execute(&mut *tx)
            .await
            .map_err(&db)?;
        let updated = sqlx::query("UPDATE host SET last_seq = $1 WHERE id = 1 AND epoch = $2")
            .bind(source.last_seq)
            .bind(&source.epoch)
            .execute(&mut *tx)
            .await
            .map_err(&db)?;
        if updated.rows_affected() != 1 {
            return Err(MigrateError::Target(
                "the target's host row changed during the copy (is a server running on it?)".into(),
            ));
        }
        // The search index is rebuilt from the log by the first host.
        sqlx::query(
            "INSERT INTO search_pending (session_id) SELECT id FROM sessions \
             ON CONFLICT (session_id) DO NOTHING",
        )
        .execute(&mut *tx)
        .await
        .map_err(&db)?;
        sqlx::query(AssertSqlSafe(format!(
            "UPDATE {PROGRESS_TABLE} SET done = true WHERE table_name = 'host'"
        )))
        .execute(&mut *tx)
        .await
        .map_err(&db)?;
        tx.commit().await.map_err(&db)?;
        Ok(())
    }

    /// Drops the progress table once the copy is verified: the target is
    /// then exactly a Tether database.
    pub async fn drop_progress(&self) -> Result<(), MigrateError> {
        sqlx::query(AssertSqlSafe(format!(
            "DROP TABLE IF EXISTS {PROGRESS_TABLE}"
        )))
        .execute(&self.pool)
        .await
        .map_err(self.db())?;
        Ok(())
    }

    /// Rows in `table`.
    pub async fn count(&self, table: &Table) -> Result<i64, MigrateError> {
        sqlx::query_scalar(AssertSqlSafe(format!(
            "SELECT count(*) FROM {}",
            table.name
        )))
        .fetch_one(&self.pool)
        .await
        .map_err(self.db())
    }

    /// The highest seq in the log (0 when empty).
    pub async fn max_seq(&self) -> Result<i64, MigrateError> {
        sqlx::query_scalar("SELECT coalesce(max(seq), 0) FROM log")
            .fetch_one(&self.pool)
            .await
            .map_err(self.db())
    }

    /// Every row of `table` in the source's (SQLite's byte-wise) key order:
    /// text keys compare under the `C` collation, which is byte order.
    pub fn rows<'a>(
        &'a self,
        table: &'a Table,
    ) -> impl futures_util::Stream<Item = Result<Vec<Cell>, sqlx::Error>> + Send + 'a {
        let sql = format!(
            "SELECT {} FROM {} ORDER BY {}",
            table.column_list(),
            table.name,
            table.key_list(" COLLATE \"C\"")
        );
        sqlx::query(AssertSqlSafe(sql))
            .fetch(&self.pool)
            .and_then(move |row: PgRow| async move { cells(&row, table) })
    }

    /// The URL, for opening a store on the target.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// Closes the pool and releases the lock.
    pub async fn close(self) {
        self.pool.close().await;
        let _ = self.guard.close().await;
    }
}
