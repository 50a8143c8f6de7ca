//! The embedded SQLite store.
//!
//! One writer connection (SQLite has one writer anyway; a single connection
//! makes every write transaction `BEGIN IMMEDIATE` without lock retries) and a
//! pool of read-only connections that WAL lets run beside it. `synchronous =
//! FULL` makes a commit durable before it is acknowledged, so an acknowledged
//! append survives power loss, not only a process crash.

use std::collections::HashSet;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteSynchronous,
};
use sqlx::{AssertSqlSafe, Sqlite, Transaction};
use uuid::Uuid;

use super::plan;
use super::{
    Appended, ArchivedTurn, Backend, HostRecord, NewEnvelope, Origin, OriginOutcome, Rejection,
    SavedContext, SessionFilter, SessionPage, SessionRecord, SessionRow, Snapshot, Store,
    StoreError, StoreOptions, StoredEnvelope, clamp_limit, now_ms, rows, seq_from_db, seq_to_db,
};

/// How long a connection waits on a lock held by another process before
/// failing (a second `tether` on the same file, a backup tool). Long enough to
/// ride out a checkpoint, short enough to surface a stuck peer.
const BUSY_TIMEOUT: Duration = Duration::from_secs(5);

/// The SQLite store.
#[derive(Debug, Clone)]
pub struct SqliteStore {
    writer: SqlitePool,
    readers: SqlitePool,
    /// The database's lock file, locked exclusively while the store is open: SQLite serves
    /// one host (several hosts share a Postgres database instead), and a
    /// second `tether serve` on the same file would split the stream.
    lock: Arc<Mutex<Option<std::fs::File>>>,
}

impl SqliteStore {
    /// Opens (creating if needed) the database file at `path` and migrates it.
    pub async fn open(path: &str, options: &StoreOptions) -> Result<Self, StoreError> {
        let fail = |reason: String| StoreError::Open {
            target: format!("SQLite database {path}"),
            reason,
        };
        let lock = Self::lock_file(path).map_err(fail)?;
        let base = SqliteConnectOptions::new()
            .filename(Path::new(path))
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(SqliteSynchronous::Full)
            .busy_timeout(BUSY_TIMEOUT)
            .foreign_keys(true)
            // Each connection caches up to 32 MiB of pages (the default is
            // 2 MiB): under load the writer otherwise re-reads index pages
            // from the OS on every commit.
            .pragma("cache_size", "-32768");
        let writer = SqlitePoolOptions::new()
            .max_connections(1)
            .min_connections(1)
            .acquire_timeout(options.connect_timeout)
            .connect_with(base.clone().create_if_missing(true))
            .await
            .map_err(|e| fail(e.to_string()))?;
        sqlx::migrate!("../migrations/sqlite")
            .run(&writer)
            .await
            .map_err(|e| fail(format!("migration failed: {e}")))?;
        sqlx::query(
            "INSERT INTO host (id, epoch, last_seq) VALUES (1, ?, 0) ON CONFLICT (id) DO NOTHING",
        )
        .bind(Uuid::new_v4().to_string())
        .execute(&writer)
        .await
        .map_err(|e| fail(e.to_string()))?;
        let readers = SqlitePoolOptions::new()
            .max_connections(options.max_connections.max(1))
            .acquire_timeout(options.connect_timeout)
            .connect_with(base.read_only(true))
            .await
            .map_err(|e| fail(e.to_string()))?;
        Ok(Self {
            writer,
            readers,
            lock: Arc::new(Mutex::new(lock)),
        })
    }

    /// Takes the exclusive lock of the database's `-lock` file beside it;
    /// `None` for an in-memory database. A file of its own, not the
    /// database: closing any descriptor of the database file would drop the
    /// POSIX locks SQLite itself holds on it in this process.
    fn lock_file(path: &str) -> Result<Option<std::fs::File>, String> {
        if path == ":memory:" || path.starts_with("file::memory:") {
            return Ok(None);
        }
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(format!("{path}-lock"))
            .map_err(|e| e.to_string())?;
        match file.try_lock() {
            Ok(()) => Ok(Some(file)),
            Err(std::fs::TryLockError::WouldBlock) => Err(
                "another Tether process already serves this file; SQLite serves one host (use \
                 Postgres for several)"
                    .to_owned(),
            ),
            Err(std::fs::TryLockError::Error(err)) => Err(format!("cannot lock it: {err}")),
        }
    }

    async fn outcome_in(
        tx: &mut Transaction<'static, Sqlite>,
        origin: &Origin,
    ) -> Result<Option<OriginOutcome>, StoreError> {
        let seq = seq_to_db(origin.client_seq);
        let accepted: Option<rows::Envelope> = sqlx::query_as(
            "SELECT seq, channel, session_id, action, client_id, client_seq, origin_scope, at_ms \
             FROM log WHERE client_id = ? AND origin_scope = ? AND client_seq = ?",
        )
        .bind(&origin.client_id)
        .bind(&origin.scope)
        .bind(seq)
        .fetch_optional(&mut **tx)
        .await?;
        if let Some(row) = accepted {
            return Ok(Some(OriginOutcome::Accepted(row.try_into()?)));
        }
        let rejected: Option<rows::Rejection> = sqlx::query_as(
            "SELECT client_id, client_seq, origin_scope, channel, action, reason, at_ms \
             FROM rejections WHERE client_id = ? AND origin_scope = ? AND client_seq = ?",
        )
        .bind(&origin.client_id)
        .bind(&origin.scope)
        .bind(seq)
        .fetch_optional(&mut **tx)
        .await?;
        rejected
            .map(|row| Ok(OriginOutcome::Rejected(row.try_into()?)))
            .transpose()
    }

    /// Writes a snapshot and prunes all but the newest few, inside `tx`.
    async fn write_snapshot_in(
        tx: &mut Transaction<'static, Sqlite>,
        snapshot: &Snapshot,
    ) -> Result<(), StoreError> {
        sqlx::query(
            "INSERT INTO snapshots (channel, seq, state, at_ms) VALUES (?, ?, ?, ?) \
             ON CONFLICT (channel, seq) DO UPDATE SET state = excluded.state, at_ms = excluded.at_ms",
        )
        .bind(&snapshot.channel)
        .bind(seq_to_db(snapshot.seq))
        .bind(&snapshot.state)
        .bind(snapshot.at_ms)
        .execute(&mut **tx)
        .await?;
        sqlx::query(
            "DELETE FROM snapshots WHERE channel = ? AND seq NOT IN \
                 (SELECT seq FROM snapshots WHERE channel = ? ORDER BY seq DESC LIMIT ?)",
        )
        .bind(&snapshot.channel)
        .bind(&snapshot.channel)
        .bind(super::SNAPSHOTS_KEPT)
        .execute(&mut **tx)
        .await?;
        Ok(())
    }

    /// Upserts archived turns in one statement.
    async fn archive_in(
        tx: &mut Transaction<'static, Sqlite>,
        turns: &[&ArchivedTurn],
    ) -> Result<(), StoreError> {
        if turns.is_empty() {
            return Ok(());
        }
        let rows = json_rows(turns.iter().map(|t| {
            (
                &t.chat,
                seq_to_db(t.generation),
                seq_to_db(t.ordinal),
                &t.turn_id,
                &t.body,
            )
        }))?;
        sqlx::query(
            "INSERT INTO chat_turns (chat, generation, ordinal, turn_id, body) \
             SELECT value->>0, value->>1, value->>2, value->>3, value->>4 FROM json_each(?1) \
             WHERE true \
             ON CONFLICT (chat, generation, ordinal) DO UPDATE \
                 SET turn_id = excluded.turn_id, body = excluded.body",
        )
        .bind(rows)
        .execute(&mut **tx)
        .await?;
        Ok(())
    }

    /// Which of `origins` already have an outcome (a log row or a
    /// recorded rejection), in one query.
    async fn existing_origins(
        tx: &mut Transaction<'static, Sqlite>,
        origins: &[&Origin],
    ) -> Result<HashSet<Origin>, StoreError> {
        if origins.is_empty() {
            return Ok(HashSet::new());
        }
        let list = json_rows(
            origins
                .iter()
                .map(|o| (&o.client_id, seq_to_db(o.client_seq), &o.scope)),
        )?;
        let found: Vec<(String, i64, String)> = sqlx::query_as(
            "SELECT value->>0, value->>1, value->>2 FROM json_each(?1) AS o \
             WHERE EXISTS (SELECT 1 FROM log WHERE client_id = o.value->>0 \
                           AND origin_scope = o.value->>2 AND client_seq = o.value->>1) \
                OR EXISTS (SELECT 1 FROM rejections WHERE client_id = o.value->>0 \
                           AND origin_scope = o.value->>2 AND client_seq = o.value->>1)",
        )
        .bind(list)
        .fetch_all(&mut **tx)
        .await?;
        found
            .into_iter()
            .map(|(client_id, seq, scope)| {
                Ok(Origin {
                    client_id,
                    client_seq: seq_from_db(seq)?,
                    scope,
                })
            })
            .collect()
    }
}

#[async_trait]
impl Store for SqliteStore {
    fn backend(&self) -> Backend {
        Backend::Sqlite
    }

    async fn host(&self) -> Result<HostRecord, StoreError> {
        let row: rows::Host = sqlx::query_as("SELECT epoch, last_seq FROM host WHERE id = 1")
            .fetch_one(&self.readers)
            .await?;
        row.try_into()
    }

    async fn ping(&self) -> Result<(), StoreError> {
        sqlx::query("SELECT 1").execute(&self.readers).await?;
        Ok(())
    }

    async fn append_with_snapshots(
        &self,
        batch: &[NewEnvelope],
        snapshots: &[Snapshot],
    ) -> Result<Vec<Appended>, StoreError> {
        let mut tx = self.writer.begin_with("BEGIN IMMEDIATE").await?;
        let last: i64 = sqlx::query_scalar("SELECT last_seq FROM host WHERE id = 1")
            .fetch_one(&mut *tx)
            .await?;
        let at_ms = now_ms();
        let existing = Self::existing_origins(&mut tx, &plan::origins(batch)).await?;
        let plan = plan::plan(batch, last, &existing, &HashSet::new());
        // Every statement takes its rows as one JSON array: a constant number
        // of round trips to the SQLite thread per batch.
        if !plan.rows.is_empty() {
            let rows = json_rows(plan.rows.iter().map(|row| {
                let e = row.envelope;
                let origin = e.origin.as_ref();
                (
                    row.seq,
                    &e.channel,
                    &e.session_id,
                    &e.action,
                    origin.map(|o| &o.client_id),
                    origin.map(|o| seq_to_db(o.client_seq)),
                    origin.map_or("", |o| o.scope.as_str()),
                )
            }))?;
            sqlx::query(
                "INSERT INTO log (seq, channel, session_id, action, client_id, client_seq, \
                                  origin_scope, at_ms) \
                 SELECT value->>0, value->>1, value->>2, value->>3, value->>4, value->>5, \
                        value->>6, ?2 \
                 FROM json_each(?1)",
            )
            .bind(rows)
            .bind(at_ms)
            .execute(&mut *tx)
            .await?;
        }
        if !plan.sessions.is_empty() {
            let records = json_rows(plan.sessions.iter().map(|(r, seq)| {
                (
                    &r.id,
                    &r.project,
                    &r.provider,
                    &r.title,
                    &r.state,
                    seq_to_db(r.turns),
                    r.resumable,
                    seq,
                    r.created_ms,
                    &r.projection,
                )
            }))?;
            sqlx::query(
                "INSERT INTO sessions (id, project, provider, title, state, turns, resumable, \
                                       last_seq, created_ms, updated_ms, projection) \
                 SELECT value->>0, value->>1, value->>2, value->>3, value->>4, value->>5, \
                        value->>6, value->>7, value->>8, ?2, value->>9 \
                 FROM json_each(?1) WHERE true \
                 ON CONFLICT (id) DO UPDATE SET project = excluded.project, \
                     provider = excluded.provider, title = excluded.title, state = excluded.state, \
                     turns = excluded.turns, resumable = excluded.resumable, \
                     last_seq = excluded.last_seq, updated_ms = excluded.updated_ms, \
                     projection = excluded.projection",
            )
            .bind(records)
            .bind(at_ms)
            .execute(&mut *tx)
            .await?;
        }
        for (chat, session_id) in &plan.chats {
            sqlx::query(
                "INSERT INTO chats (chat, session_id) VALUES (?, ?) ON CONFLICT (chat) DO NOTHING",
            )
            .bind(chat)
            .bind(session_id)
            .execute(&mut *tx)
            .await?;
        }
        Self::archive_in(&mut tx, &plan.turns).await?;
        if plan.last_seq != last {
            sqlx::query("UPDATE host SET last_seq = ? WHERE id = 1")
                .bind(plan.last_seq)
                .execute(&mut *tx)
                .await?;
        }
        for snapshot in snapshots {
            Self::write_snapshot_in(&mut tx, snapshot).await?;
        }
        let mut found = Vec::new();
        for origin in plan::duplicates(&plan, batch) {
            found.push(Self::outcome_in(&mut tx, origin).await?);
        }
        let outcomes = plan::outcomes(&plan, at_ms, found)?;
        tx.commit().await?;
        Ok(outcomes)
    }

    async fn record_rejection(&self, rejection: Rejection) -> Result<OriginOutcome, StoreError> {
        let mut tx = self.writer.begin_with("BEGIN IMMEDIATE").await?;
        let origin = &rejection.origin;
        if let Some(existing) = Self::outcome_in(&mut tx, origin).await? {
            tx.rollback().await?;
            return Ok(existing);
        }
        sqlx::query(
            "INSERT INTO rejections (client_id, client_seq, origin_scope, channel, action, \
                                     reason, at_ms) \
             VALUES (?, ?, ?, ?, ?, ?, ?)",
        )
        .bind(&origin.client_id)
        .bind(seq_to_db(origin.client_seq))
        .bind(&origin.scope)
        .bind(&rejection.channel)
        .bind(&rejection.action)
        .bind(&rejection.reason)
        .bind(rejection.at_ms)
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(OriginOutcome::Rejected(rejection))
    }

    async fn origin_outcome(&self, origin: &Origin) -> Result<Option<OriginOutcome>, StoreError> {
        let mut tx = self.readers.begin().await?;
        let outcome = Self::outcome_in(&mut tx, origin).await?;
        tx.commit().await?;
        Ok(outcome)
    }

    async fn read_after(
        &self,
        after: u64,
        channels: Option<&[String]>,
        limit: u32,
    ) -> Result<Vec<StoredEnvelope>, StoreError> {
        let found: Vec<rows::Envelope> = match channels {
            None => {
                sqlx::query_as(
                    "SELECT seq, channel, session_id, action, client_id, client_seq, origin_scope, at_ms \
                     FROM log WHERE seq > ? ORDER BY seq LIMIT ?",
                )
                .bind(seq_to_db(after))
                .bind(clamp_limit(limit))
                .fetch_all(&self.readers)
                .await?
            }
            Some(channels) => {
                let channels = serde_json::to_string(channels)
                    .map_err(|e| StoreError::Corrupt(e.to_string()))?;
                sqlx::query_as(
                    "SELECT seq, channel, session_id, action, client_id, client_seq, origin_scope, at_ms \
                     FROM log WHERE seq > ? AND channel IN (SELECT value FROM json_each(?)) \
                     ORDER BY seq LIMIT ?",
                )
                .bind(seq_to_db(after))
                .bind(channels)
                .bind(clamp_limit(limit))
                .fetch_all(&self.readers)
                .await?
            }
        };
        found.into_iter().map(TryInto::try_into).collect()
    }

    async fn transcript(
        &self,
        session_id: &str,
        after: u64,
        limit: u32,
    ) -> Result<Vec<StoredEnvelope>, StoreError> {
        let found: Vec<rows::Envelope> = sqlx::query_as(
            "SELECT seq, channel, session_id, action, client_id, client_seq, origin_scope, at_ms \
             FROM log WHERE session_id = ? AND seq > ? ORDER BY seq LIMIT ?",
        )
        .bind(session_id)
        .bind(seq_to_db(after))
        .bind(clamp_limit(limit))
        .fetch_all(&self.readers)
        .await?;
        found.into_iter().map(TryInto::try_into).collect()
    }

    async fn chat_session(&self, chat: &str) -> Result<Option<String>, StoreError> {
        Ok(
            sqlx::query_scalar("SELECT session_id FROM chats WHERE chat = ?")
                .bind(chat)
                .fetch_optional(&self.readers)
                .await?,
        )
    }

    async fn archive_turns(&self, turns: &[ArchivedTurn]) -> Result<(), StoreError> {
        let mut tx = self.writer.begin_with("BEGIN IMMEDIATE").await?;
        let refs = plan::latest_turns(turns.iter());
        Self::archive_in(&mut tx, &refs).await?;
        tx.commit().await?;
        Ok(())
    }

    async fn archived_turns(
        &self,
        chat: &str,
        generation: u64,
        ordinals: std::ops::Range<u64>,
    ) -> Result<Vec<ArchivedTurn>, StoreError> {
        let found: Vec<rows::Turn> = sqlx::query_as(
            "SELECT chat, generation, ordinal, turn_id, body FROM chat_turns \
             WHERE chat = ? AND generation = ? AND ordinal >= ? AND ordinal < ? ORDER BY ordinal",
        )
        .bind(chat)
        .bind(seq_to_db(generation))
        .bind(seq_to_db(ordinals.start))
        .bind(seq_to_db(ordinals.end))
        .fetch_all(&self.readers)
        .await?;
        found.into_iter().map(TryInto::try_into).collect()
    }

    async fn archived_ordinal(
        &self,
        chat: &str,
        generation: u64,
        turn_id: &str,
    ) -> Result<Option<u64>, StoreError> {
        let found: Option<i64> = sqlx::query_scalar(
            "SELECT max(ordinal) FROM chat_turns WHERE chat = ? AND generation = ? AND turn_id = ?",
        )
        .bind(chat)
        .bind(seq_to_db(generation))
        .bind(turn_id)
        .fetch_one(&self.readers)
        .await?;
        found.map(seq_from_db).transpose()
    }

    async fn replace_session_record(&self, record: &SessionRecord) -> Result<bool, StoreError> {
        let updated = sqlx::query(
            "UPDATE sessions SET project = ?, provider = ?, title = ?, state = ?, turns = ?, \
                    resumable = ?, projection = ? WHERE id = ?",
        )
        .bind(&record.project)
        .bind(&record.provider)
        .bind(&record.title)
        .bind(&record.state)
        .bind(seq_to_db(record.turns))
        .bind(record.resumable)
        .bind(&record.projection)
        .bind(&record.id)
        .execute(&self.writer)
        .await?;
        Ok(updated.rows_affected() == 1)
    }

    async fn session(&self, id: &str) -> Result<Option<SessionRow>, StoreError> {
        let found: Option<rows::Session> = sqlx::query_as(
            "SELECT id, project, provider, title, state, turns, resumable, last_seq, \
                    created_ms, updated_ms, projection FROM sessions WHERE id = ?",
        )
        .bind(id)
        .fetch_optional(&self.readers)
        .await?;
        found.map(TryInto::try_into).transpose()
    }

    async fn sessions(
        &self,
        filter: &SessionFilter,
        before: Option<u64>,
        limit: u32,
    ) -> Result<SessionPage, StoreError> {
        let sql = rows::session_page_sql(
            filter,
            before,
            |_| "?".to_owned(),
            |p| format!("project IN (SELECT value FROM json_each({p}))"),
        );
        let limit = clamp_limit(limit);
        let mut query = sqlx::query_as::<_, rows::Session>(AssertSqlSafe(sql));
        if let Some(project) = &filter.project {
            query = query.bind(project);
        }
        if let Some(state) = &filter.state {
            query = query.bind(state);
        }
        if let Some(projects) = &filter.projects {
            query = query.bind(serde_json::to_string(projects).unwrap_or_else(|_| "[]".into()));
        }
        if let Some(before) = before {
            query = query.bind(seq_to_db(before));
        }
        let found = query.bind(limit + 1).fetch_all(&self.readers).await?;
        rows::session_page(found, limit)
    }

    async fn put_snapshot(&self, snapshot: Snapshot) -> Result<(), StoreError> {
        let mut tx = self.writer.begin_with("BEGIN IMMEDIATE").await?;
        Self::write_snapshot_in(&mut tx, &snapshot).await?;
        tx.commit().await?;
        Ok(())
    }

    async fn latest_snapshot(&self, channel: &str) -> Result<Option<Snapshot>, StoreError> {
        let found: Option<rows::Snapshot> = sqlx::query_as(
            "SELECT channel, seq, state, at_ms FROM snapshots WHERE channel = ? \
             ORDER BY seq DESC LIMIT 1",
        )
        .bind(channel)
        .fetch_optional(&self.readers)
        .await?;
        found.map(TryInto::try_into).transpose()
    }

    async fn save_working_context(
        &self,
        project: &str,
        session: &str,
        body: &str,
    ) -> Result<i64, StoreError> {
        let saved_ms = now_ms();
        sqlx::query(
            "INSERT INTO working_contexts (project, session, body, saved_ms) VALUES (?, ?, ?, ?) \
             ON CONFLICT (project, session) DO UPDATE SET body = excluded.body, \
                 saved_ms = excluded.saved_ms",
        )
        .bind(project)
        .bind(session)
        .bind(body)
        .bind(saved_ms)
        .execute(&self.writer)
        .await?;
        Ok(saved_ms)
    }

    async fn working_context(
        &self,
        project: &str,
        session: &str,
    ) -> Result<Option<SavedContext>, StoreError> {
        Ok(sqlx::query_as::<_, rows::Context>(
            "SELECT project, session, body, saved_ms FROM working_contexts \
             WHERE project = ? AND session = ?",
        )
        .bind(project)
        .bind(session)
        .fetch_optional(&self.readers)
        .await?
        .map(Into::into))
    }

    async fn working_contexts(&self, project: &str) -> Result<Vec<SavedContext>, StoreError> {
        Ok(sqlx::query_as::<_, rows::Context>(
            "SELECT project, session, '' AS body, saved_ms FROM working_contexts \
             WHERE project = ? ORDER BY saved_ms DESC, session",
        )
        .bind(project)
        .fetch_all(&self.readers)
        .await?
        .into_iter()
        .map(Into::into)
        .collect())
    }

    async fn close(&self) {
        self.readers.close().await;
        self.writer.close().await;
        // Another process may serve the file from now on.
        drop(self.lock.lock().unwrap_or_else(|e| e.into_inner()).take());
    }
}

/// Rows as one JSON array of arrays, the parameter of a `json_each` insert.
/// Each row is serialised straight from borrowed fields, never copied.
fn json_rows<T: serde::Serialize>(rows: impl Iterator<Item = T>) -> Result<String, StoreError> {
    serde_json::to_string(&rows.collect::<Vec<T>>())
        .map_err(|e| StoreError::Corrupt(format!("cannot encode a batch: {e}")))
}
