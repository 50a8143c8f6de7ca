//! The embedded SQLite store.
//!
//! One writer connection on a thread of its own ([`writer`]; SQLite has one
//! writer anyway, and a single connection makes every write transaction
//! `BEGIN IMMEDIATE` without lock retries), a checkpointer thread
//! ([`checkpoint`]) and a pool of read-only connections that WAL lets run
//! beside them. `synchronous =
//! FULL` makes a commit durable before it is acknowledged, so an acknowledged
//! append survives power loss, not only a process crash.

mod append;
pub mod backup;
mod checkpoint;
mod keys;
mod outbox;
mod pages;
mod search;
mod session_pages;
mod writer;

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use sqlx::AssertSqlSafe;
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteSynchronous,
};
use uuid::Uuid;

use self::pages::Pages;
use self::writer::Writer;
use super::search::{SearchHit, SearchRequest};
use super::usage::{self, UsageQuery, UsageTotal};
use super::webhooks::{self, Attempt, DeliveryRow, Due, Webhook};
use tether_protocol::search::SearchDoc;

/// The SQLite schema's migrations, embedded in the binary.
pub static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("../migrations/sqlite");
use super::plan;
use super::{
    Appended, ArchivedTurn, Attachment, Backend, Expired, HostRecord, NewEnvelope, Origin,
    OriginOutcome, Rejection, SavedContext, SessionFilter, SessionPage, SessionRecord, SessionRow,
    Snapshot, Store, StoreError, StoreOptions, StoredEnvelope, clamp_limit, now_ms, rows,
    seq_from_db, seq_to_db,
};

/// How long a connection waits on a lock held by another process before
/// failing (a second `tether` on the same file, a backup tool). Long enough to
/// ride out a checkpoint, short enough to surface a stuck peer.
pub(super) const BUSY_TIMEOUT: Duration = Duration::from_secs(5);

/// The SQLite store.
#[derive(Debug, Clone)]
pub struct SqliteStore {
    writer: Arc<Writer>,
    readers: SqlitePool,
    /// Log pages, read a page per thread hop (catch-up, delivery).
    pages: Arc<Pages>,
    /// The database's lock file, locked exclusively while the store is open: SQLite serves
    /// one host (several hosts share a Postgres database instead), and a
    /// second `tether serve` on the same file would split the stream.
    lock: Arc<Mutex<Option<std::fs::File>>>,
    /// How the next group commit finds the origins it already has (see
    /// `plan::Probe`).
    probing: Arc<crate::store::plan::Probing>,
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
        // Migrations run on a connection of their own, closed before the
        // writer opens, so only ever one connection writes.
        let migrator = SqlitePoolOptions::new()
            .max_connections(1)
            .acquire_timeout(options.connect_timeout)
            .connect_with(base.clone().create_if_missing(true))
            .await
            .map_err(|e| fail(e.to_string()))?;
        MIGRATOR
            .run(&migrator)
            .await
            .map_err(|e| fail(format!("migration failed: {e}")))?;
        sqlx::query(
            "INSERT INTO host (id, epoch, last_seq) VALUES (1, ?, 0) ON CONFLICT (id) DO NOTHING",
        )
        .bind(Uuid::new_v4().to_string())
        .execute(&migrator)
        .await
        .map_err(|e| fail(e.to_string()))?;
        migrator.close().await;
        let writer = Writer::start(Path::new(path)).map_err(|e| fail(e.to_string()))?;
        let readers = SqlitePoolOptions::new()
            .max_connections(options.max_connections.max(1))
            .acquire_timeout(options.connect_timeout)
            .connect_with(base.read_only(true))
            .await
            .map_err(|e| fail(e.to_string()))?;
        Ok(Self {
            writer: Arc::new(writer),
            readers,
            pages: Pages::new(Path::new(path), options.max_connections.max(1) as usize),
            lock: Arc::new(Mutex::new(lock)),
            probing: Arc::default(),
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
        batch: Arc<Vec<NewEnvelope>>,
        snapshots: Vec<Snapshot>,
    ) -> Result<Vec<Appended>, StoreError> {
        let probing = Arc::clone(&self.probing);
        let mut probe = probing.next();
        // At most twice: `Probe::Everything` never leaves an origin to the
        // index.
        self.writer
            .transaction_until(move |tx, keys| {
                let appended = append::append(tx, keys, &batch, &snapshots, probe)?;
                if appended.is_none() {
                    probe = probing.met_a_duplicate();
                }
                Ok(appended)
            })
            .await
    }

    async fn record_rejection(&self, rejection: Rejection) -> Result<OriginOutcome, StoreError> {
        self.writer
            .transaction(move |tx| append::reject(tx, rejection))
            .await
    }

    async fn origin_outcome(&self, origin: &Origin) -> Result<Option<OriginOutcome>, StoreError> {
        // The writer's own lookup (a retry's rare path), not a second copy
        // of it on the read pool.
        let origin = origin.clone();
        self.writer
            .transaction(move |tx| append::outcome(tx, &origin))
            .await
    }

    async fn read_after_within(
        &self,
        after: u64,
        channels: Option<&[String]>,
        limit: u32,
        max_bytes: usize,
    ) -> Result<Vec<StoredEnvelope>, StoreError> {
        self.pages
            .read_after(after, channels, limit, max_bytes)
            .await
    }

    async fn transcript(
        &self,
        session_id: &str,
        after: u64,
        limit: u32,
    ) -> Result<Vec<StoredEnvelope>, StoreError> {
        self.session_page(session_id, after, limit, false).await
    }

    async fn session_log(
        &self,
        session_id: &str,
        after: u64,
        limit: u32,
    ) -> Result<Vec<StoredEnvelope>, StoreError> {
        self.session_page(session_id, after, limit, true).await
    }

    async fn chat_session(&self, chat: &str) -> Result<Option<String>, StoreError> {
        Ok(
            sqlx::query_scalar("SELECT session_id FROM chats WHERE chat = ?")
                .bind(chat)
                .fetch_optional(&self.readers)
                .await?,
        )
    }

    async fn claim_chat(&self, chat: &str, session_id: &str) -> Result<bool, StoreError> {
        let (chat, session_id) = (chat.to_owned(), session_id.to_owned());
        self.writer
            .transaction(move |tx| {
                tx.prepare_cached(
                    "INSERT INTO chats (chat, session_id) VALUES (?1, ?2) \
                     ON CONFLICT (chat) DO NOTHING",
                )?
                .execute(rusqlite::params![chat, session_id])?;
                let owner: String = tx
                    .prepare_cached("SELECT session_id FROM chats WHERE chat = ?1")?
                    .query_row([&chat], |row| row.get(0))?;
                Ok(owner == session_id)
            })
            .await
    }

    async fn release_chat(&self, chat: &str, session_id: &str) -> Result<(), StoreError> {
        let (chat, session_id) = (chat.to_owned(), session_id.to_owned());
        self.writer
            .transaction(move |tx| {
                tx.prepare_cached("DELETE FROM chats WHERE chat = ?1 AND session_id = ?2")?
                    .execute(rusqlite::params![chat, session_id])?;
                Ok(())
            })
            .await
    }

    async fn put_attachment(&self, attachment: &Attachment) -> Result<(), StoreError> {
        let a = attachment.clone();
        let at_ms = now_ms();
        self.writer
            .transaction(move |tx| {
                tx.prepare_cached(
                    "INSERT INTO attachments \
                     (session_id, digest, content_type, size, data, created_ms) \
                     VALUES (?1, ?2, ?3, ?4, ?5, ?6) ON CONFLICT DO NOTHING",
                )?
                .execute(rusqlite::params![
                    a.session_id,
                    a.digest,
                    a.content_type,
                    a.data.len() as i64,
                    a.data,
                    at_ms
                ])?;
                Ok(())
            })
            .await
    }

    async fn attachment(
        &self,
        session: &str,
        digest: &str,
    ) -> Result<Option<Attachment>, StoreError> {
        Ok(sqlx::query_as(
            "SELECT session_id, digest, content_type, data FROM attachments \
             WHERE session_id = ? AND digest = ?",
        )
        .bind(session)
        .bind(digest)
        .fetch_optional(&self.readers)
        .await?)
    }

    async fn attachment_bytes(
        &self,
        session: &str,
        digests: &[String],
    ) -> Result<(u64, u64), StoreError> {
        let sizes: Vec<(String, i64)> =
            sqlx::query_as("SELECT digest, size FROM attachments WHERE session_id = ?")
                .bind(session)
                .fetch_all(&self.readers)
                .await?;
        Ok(super::sum_sizes(&sizes, digests))
    }

    async fn client_owners(&self, session: &str) -> Result<Vec<(String, String)>, StoreError> {
        Ok(
            sqlx::query_as("SELECT client_id, sub FROM client_owners WHERE session_id = ?")
                .bind(session)
                .fetch_all(&self.readers)
                .await?,
        )
    }

    async fn archive_turns(&self, turns: &[ArchivedTurn]) -> Result<(), StoreError> {
        let turns = turns.to_vec();
        self.writer
            .transaction(move |tx| append::archive(tx, &plan::latest_turns(turns.iter())))
            .await
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
        let record = record.clone();
        self.writer
            .transaction(move |tx| {
                let updated = tx
                    .prepare_cached(
                        "UPDATE sessions SET project = ?1, provider = ?2, title = ?3, \
                             state = ?4, turns = ?5, resumable = ?6, projection = ?7 \
                         WHERE id = ?8",
                    )?
                    .execute(rusqlite::params![
                        record.project,
                        record.provider,
                        record.title,
                        record.state,
                        seq_to_db(record.turns),
                        record.resumable,
                        record.projection,
                        record.id,
                    ])?;
                Ok(updated == 1)
            })
            .await
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
        // A page sorts the whole recency bucket it starts in (its index
        // holds no `last_seq`, migration 0013): the sort carries rowids,
        // and only the page's rows are read whole.
        let keys = rows::session_page_sql(
            filter,
            before,
            "rowid",
            |n| param(n, ""),
            |p| in_projects("project", p),
        );
        let sql = format!(
            "SELECT {} FROM sessions WHERE rowid IN ({keys}) \
             ORDER BY recency DESC, last_seq DESC",
            rows::SESSION_COLUMNS
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
        self.writer
            .transaction(move |tx| append::write_snapshot(tx, &snapshot))
            .await
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
        let row = (project.to_owned(), session.to_owned(), body.to_owned());
        self.writer
            .transaction(move |tx| {
                tx.prepare_cached(
                    "INSERT INTO working_contexts (project, session, body, saved_ms) \
                     VALUES (?1, ?2, ?3, ?4) \
                     ON CONFLICT (project, session) DO UPDATE SET body = excluded.body, \
                         saved_ms = excluded.saved_ms",
                )?
                .execute(rusqlite::params![row.0, row.1, row.2, saved_ms])?;
                Ok(saved_ms)
            })
            .await
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

    async fn working_contexts(
        &self,
        project: &str,
        after: Option<(i64, &str)>,
        limit: u32,
    ) -> Result<Vec<SavedContext>, StoreError> {
        let (saved_ms, session) = after.unwrap_or((i64::MAX, ""));
        let sql = crate::store::working_contexts_sql(param);
        Ok(sqlx::query_as::<_, rows::Context>(sqlx::AssertSqlSafe(sql))
            .bind(project)
            .bind(saved_ms)
            .bind(session)
            .bind(i64::from(limit))
            .fetch_all(&self.readers)
            .await?
            .into_iter()
            .map(Into::into)
            .collect())
    }

    async fn search(&self, request: &SearchRequest) -> Result<Vec<SearchHit>, StoreError> {
        search::search(&self.readers, request).await
    }

    async fn put_search_docs(
        &self,
        session: &str,
        docs: &[(u64, i64, SearchDoc)],
    ) -> Result<(), StoreError> {
        let (session, docs) = (session.to_owned(), docs.to_vec());
        self.writer
            .transaction(move |tx| {
                let rows: Vec<_> = docs
                    .iter()
                    .map(|(seq, at_ms, doc)| (session.as_str(), seq_to_db(*seq), *at_ms, doc))
                    .collect();
                append::write_docs(tx, &rows, true)
            })
            .await
    }

    async fn usage(&self, query: &UsageQuery) -> Result<Vec<UsageTotal>, StoreError> {
        let sql = usage::usage_sql(query, param, |p| in_projects("project", p));
        let scope = projects_json(query.projects.as_deref());
        let rows = sqlx::query(AssertSqlSafe(sql))
            .bind(query.since_ms)
            .bind(query.until_ms)
            .bind(scope)
            .bind(query.project.as_deref())
            .bind(query.agent.as_deref())
            .fetch_all(&self.readers)
            .await?;
        Ok(rows
            .iter()
            .map(|row| usage::usage_total(row, query.by.len()))
            .collect::<Result<_, _>>()?)
    }

    async fn set_retention(&self, project: &str, days: Option<u32>) -> Result<(), StoreError> {
        let project = project.to_owned();
        self.writer
            .transaction(move |tx| {
                match days {
                    Some(days) => tx
                        .prepare_cached(
                            "INSERT INTO retention (project, days, updated_ms) VALUES (?1, ?2, ?3) \
                             ON CONFLICT (project) DO UPDATE SET days = excluded.days, \
                                 updated_ms = excluded.updated_ms",
                        )?
                        .execute(rusqlite::params![project, days, now_ms()])?,
                    None => tx
                        .prepare_cached("DELETE FROM retention WHERE project = ?1")?
                        .execute([project])?,
                };
                Ok(())
            })
            .await
    }

    async fn retention(&self, project: &str) -> Result<Option<u32>, StoreError> {
        let days: Option<i64> = sqlx::query_scalar("SELECT days FROM retention WHERE project = ?")
            .bind(project)
            .fetch_optional(&self.readers)
            .await?;
        Ok(days.and_then(|d| u32::try_from(d).ok()))
    }

    async fn expired_sessions(&self, now_ms: i64, limit: u32) -> Result<Vec<Expired>, StoreError> {
        let rows: Vec<(String, String, i64)> = sqlx::query_as(
            // `idle_hour` is `updated_ms` by the hour, which its index holds
            // (migration 0013).
            "SELECT s.id, s.project, s.last_seq FROM retention r \
             JOIN sessions s ON s.project = r.project AND s.state <> 'live' \
                 AND s.idle_hour <= (?1 - r.days * 86400000) / 3600000 \
                 AND s.updated_ms < ?1 - r.days * 86400000 \
             ORDER BY s.idle_hour, s.updated_ms LIMIT ?2",
        )
        .bind(now_ms)
        .bind(clamp_limit(limit))
        .fetch_all(&self.readers)
        .await?;
        Expired::from_rows(rows)
    }

    async fn delete_sessions(&self, sessions: &[Expired]) -> Result<Vec<String>, StoreError> {
        let sessions = sessions.to_vec();
        self.writer
            .transaction_forgetting_keys(move |tx| {
                let mut deleted = Vec::new();
                let owned = super::owned_rows_sql("?1", super::Prefixes::Ranges);
                for s in &sessions {
                    let gone = tx
                        .prepare_cached(
                            "DELETE FROM sessions WHERE id = ?1 AND last_seq = ?2 \
                             AND state <> 'live'",
                        )?
                        .execute(rusqlite::params![s.id, seq_to_db(s.last_seq)])?;
                    if gone == 0 {
                        continue;
                    }
                    // The log has no session index: its rows go by their
                    // channels' numbers, not by a scan of the whole log.
                    let names = keys::session_names(tx, &s.id)?;
                    keys::delete_log(tx, &names)?;
                    for sql in &owned {
                        tx.prepare_cached(sql)?.execute([&s.id])?;
                    }
                    keys::delete_names(tx, &names)?;
                    deleted.push(s.id.clone());
                }
                Ok(deleted)
            })
            .await
    }

    async fn create_webhook(&self, webhook: &Webhook, most: usize) -> Result<bool, StoreError> {
        let w = webhook.clone();
        self.writer
            .transaction(move |tx| outbox::create_webhook(tx, &w, most))
            .await
    }

    async fn webhooks(&self, project: &str) -> Result<Vec<Webhook>, StoreError> {
        Ok(sqlx::query_as(
            "SELECT id, project, url, secret, events, created_ms, created_by FROM webhooks \
             WHERE project = ? ORDER BY created_ms, id",
        )
        .bind(project)
        .fetch_all(&self.readers)
        .await?)
    }

    async fn delete_webhook(&self, project: &str, id: &str) -> Result<bool, StoreError> {
        let (project, id) = (project.to_owned(), id.to_owned());
        self.writer
            .transaction(move |tx| outbox::delete_webhook(tx, &project, &id))
            .await
    }

    async fn claim_deliveries(
        &self,
        claimer: &str,
        now_ms: i64,
        hold_ms: i64,
        limit: u32,
    ) -> Result<Vec<Due>, StoreError> {
        let claimer = claimer.to_owned();
        let keys: Vec<(String, String)> = self
            .writer
            .transaction({
                let claimer = claimer.clone();
                move |tx| outbox::claim_deliveries(tx, &claimer, now_ms, hold_ms, limit)
            })
            .await?;
        let mut due = Vec::with_capacity(keys.len());
        for (event, webhook) in keys {
            let found: Option<Due> = sqlx::query_as(AssertSqlSafe(format!(
                "SELECT {} FROM deliveries d JOIN webhooks w ON w.id = d.webhook_id \
                 JOIN outbox o ON o.event_id = d.event_id \
                 WHERE d.event_id = ? AND d.webhook_id = ? AND d.claimed_by = ?",
                webhooks::DUE_COLUMNS
            )))
            .bind(&event)
            .bind(&webhook)
            .bind(&claimer)
            .fetch_optional(&self.readers)
            .await?;
            due.extend(found);
        }
        Ok(due)
    }

    async fn release_deliveries(&self, claimer: &str) -> Result<(), StoreError> {
        let claimer = claimer.to_owned();
        self.writer
            .transaction(move |tx| {
                tx.prepare_cached(
                    "UPDATE deliveries SET claimed_by = NULL, claimed_until = NULL \
                     WHERE claimed_by = ?1",
                )?
                .execute([claimer])?;
                Ok(())
            })
            .await
    }

    async fn record_attempt(
        &self,
        event_id: &str,
        webhook_id: &str,
        attempt: &Attempt,
    ) -> Result<(), StoreError> {
        let (event, webhook, attempt) =
            (event_id.to_owned(), webhook_id.to_owned(), attempt.clone());
        self.writer
            .transaction(move |tx| outbox::record_attempt(tx, &event, &webhook, &attempt))
            .await
    }

    async fn prune_deliveries(&self, before_ms: i64, limit: u32) -> Result<u64, StoreError> {
        self.writer
            .transaction(move |tx| outbox::prune_deliveries(tx, before_ms, limit))
            .await
    }

    async fn deliveries(
        &self,
        webhook_id: &str,
        limit: u32,
    ) -> Result<Vec<DeliveryRow>, StoreError> {
        Ok(sqlx::query_as(AssertSqlSafe(format!(
            "SELECT {} FROM deliveries d JOIN outbox o ON o.event_id = d.event_id \
             WHERE d.webhook_id = ? ORDER BY o.seq DESC, o.kind LIMIT ?",
            webhooks::DELIVERY_COLUMNS
        )))
        .bind(webhook_id)
        .bind(clamp_limit(limit))
        .fetch_all(&self.readers)
        .await?)
    }

    async fn search_pending(&self, limit: u32) -> Result<Vec<String>, StoreError> {
        Ok(
            sqlx::query_scalar("SELECT session_id FROM search_pending LIMIT ?")
                .bind(clamp_limit(limit))
                .fetch_all(&self.readers)
                .await?,
        )
    }

    async fn search_indexed(&self, session: &str) -> Result<(), StoreError> {
        let session = session.to_owned();
        self.writer
            .transaction(move |tx| {
                tx.prepare_cached("DELETE FROM search_pending WHERE session_id = ?1")?
                    .execute([session])?;
                Ok(())
            })
            .await
    }

    async fn close(&self) {
        self.readers.close().await;
        self.writer.close().await;
        // Another process may serve the file from now on.
        drop(self.lock.lock().unwrap_or_else(|e| e.into_inner()).take());
    }
}

/// A statement's `n`th parameter: SQLite binds every kind as itself.
pub(super) fn param(n: usize, _kind: &str) -> String {
    format!("?{n}")
}

/// `column` is one of the projects bound at `p`, a JSON array
/// ([`projects_json`]).
pub(super) fn in_projects(column: &str, p: &str) -> String {
    format!("{column} IN (SELECT value FROM json_each({p}))")
}

/// A caller's project scope as the JSON array [`in_projects`] reads.
pub(super) fn projects_json(projects: Option<&[String]>) -> Option<String> {
    projects.map(|p| serde_json::to_string(p).unwrap_or_else(|_| "[]".into()))
}
