//! The PostgreSQL store, for teams and for several hosts on one database.
//!
//! `serverSeq` comes from the host row, read `FOR UPDATE` inside the appending
//! transaction. The row lock is held until commit, so appends from every host
//! sharing the database commit one after another in seq order: a host tailing
//! the log never sees seq N+1 committed while N is still in flight.
//!
//! Each store writes as a host id of its own. Once an engine joined the
//! cluster through it, an append skips the envelopes of sessions whose
//! lease another host holds: the fence that makes a lease a guarantee (see
//! `cluster`). Leases change hands only under the host row's lock, so the
//! fence checked at the start of an append holds until it commits. Tailing hosts are
//! woken after the commit, by `cluster`, not inside the transaction.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use async_trait::async_trait;
use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions};
use sqlx::{AssertSqlSafe, Postgres, Transaction};
use uuid::Uuid;

use super::plan;
use super::search::{SearchHit, SearchRequest};
use super::usage::{self, UsageQuery, UsageTotal};
use super::webhooks::{Attempt, DeliveryRow, Due, Webhook};
use super::{
    Appended, ArchivedTurn, Attachment, Backend, Expired, HostRecord, NewEnvelope, Origin,
    OriginOutcome, Rejection, SavedContext, SessionFilter, SessionPage, SessionRecord, SessionRow,
    Snapshot, Store, StoreError, StoreOptions, StoredEnvelope, clamp_limit, now_ms, redact_url,
    rows, seq_from_db, seq_to_db,
};
use tether_protocol::search::SearchDoc;

mod append;
mod outbox;
mod retention;
mod search;
mod session_pages;

/// The Postgres schema's migrations, embedded in the binary.
pub static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("../migrations/postgres");

/// The Postgres store.
#[derive(Debug, Clone)]
pub struct PostgresStore {
    pool: PgPool,
    /// The host id this store writes as: `--host-id`, or a UUID per
    /// process.
    host: String,
    /// The claim on a configured host id, held while the store lives.
    _claim: Option<Arc<super::identity::HostClaim>>,
    /// Whether appends fence on leases: from when an engine joined the
    /// cluster through this store. A store used on its own (tests, tools
    /// run with the servers stopped) holds no leases and is not fenced.
    fencing: Arc<AtomicBool>,
    /// Group commits left that probe the log for every origin (see
    /// `plan::Probe`).
    probing: Arc<super::plan::Probing>,
}

impl PostgresStore {
    /// Connects to the database at `url` and migrates it.
    pub async fn open(url: &str, options: &StoreOptions) -> Result<Self, StoreError> {
        let fail = |reason: String| StoreError::Open {
            target: format!("Postgres database {}", redact_url(url)),
            reason,
        };
        let connect: PgConnectOptions =
            url.parse().map_err(|e: sqlx::Error| fail(e.to_string()))?;
        // No JIT: every query here is a short indexed read or write, and the
        // planner's cost estimate for a session's transcript read (the
        // lateral join over its chats) crossed jit_above_cost as the log
        // grew, so each session load paid 15-30 ms compiling the query.
        let connect = connect.options([("jit", "off")]);
        let connect = match options.stalled_transaction {
            Some(limit) => connect.options([(
                "idle_in_transaction_session_timeout",
                limit.as_millis().to_string(),
            )]),
            None => connect,
        };
        let claim = match &options.host_id {
            Some(id) => Some(Arc::new(
                super::identity::claim(&connect, id).await.map_err(fail)?,
            )),
            None => None,
        };
        let pool = PgPoolOptions::new()
            .max_connections(options.max_connections.max(2))
            .acquire_timeout(options.connect_timeout)
            .connect_with(connect)
            .await
            .map_err(|e| fail(e.to_string()))?;
        // The migrator takes an advisory lock, so hosts starting together on
        // one database migrate it once.
        MIGRATOR
            .run(&pool)
            .await
            .map_err(|e| fail(format!("migration failed: {e}")))?;
        sqlx::query(
            "INSERT INTO host (id, epoch, last_seq) VALUES (1, $1, 0) ON CONFLICT (id) DO NOTHING",
        )
        .bind(Uuid::new_v4().to_string())
        .execute(&pool)
        .await
        .map_err(|e| fail(e.to_string()))?;
        Ok(Self {
            pool,
            host: options
                .host_id
                .clone()
                .unwrap_or_else(|| Uuid::new_v4().to_string()),
            _claim: claim,
            fencing: Arc::new(AtomicBool::new(false)),
            probing: Arc::default(),
        })
    }

    async fn outcome_in(
        tx: &mut Transaction<'static, Postgres>,
        origin: &Origin,
    ) -> Result<Option<OriginOutcome>, StoreError> {
        let seq = seq_to_db(origin.client_seq);
        let accepted: Option<rows::Envelope> = sqlx::query_as(
            "SELECT seq, channel, session_id, action, client_id, client_seq, origin_scope, at_ms \
             FROM log WHERE client_id = $1 AND origin_scope = $2 AND client_seq = $3",
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
             FROM rejections WHERE client_id = $1 AND origin_scope = $2 AND client_seq = $3",
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

    /// Locks the host row for the rest of the transaction and returns the
    /// last issued seq. Every writer of origins and seqs takes this lock first.
    async fn lock_host(tx: &mut Transaction<'static, Postgres>) -> Result<i64, StoreError> {
        Ok(
            sqlx::query_scalar("SELECT last_seq FROM host WHERE id = 1 FOR UPDATE")
                .fetch_one(&mut **tx)
                .await?,
        )
    }

    /// A transaction for reading channels' ranges of `log_channel` in seq
    /// order, with bitmap scans off. With `channel = ANY(...) ORDER BY seq`,
    /// or with statistics not yet gathered on a freshly filled log,
    /// Postgres picks a bitmap scan that reads every row of a channel above
    /// `after` and sorts them, on every page: a long catch-up became
    /// quadratic.
    async fn begin_channel_read(&self) -> Result<Transaction<'static, Postgres>, StoreError> {
        // One round trip: the setting rides on the `BEGIN`.
        Ok(self
            .pool
            .begin_with("BEGIN; SET LOCAL enable_bitmapscan = off")
            .await?)
    }
}

/// The envelopes of `rows` in order, until one takes their bytes past
/// `max_bytes` (see [`Store::read_after_within`]); the rest are not read
/// into memory.
async fn envelopes_within(
    mut rows: impl futures_util::Stream<Item = Result<rows::EnvelopeColumns, sqlx::Error>> + Unpin,
    max_bytes: usize,
) -> Result<Vec<StoredEnvelope>, StoreError> {
    use futures_util::TryStreamExt as _;
    let mut found = Vec::new();
    let mut budget = crate::store::ByteBudget::new(max_bytes);
    while let Some(columns) = rows.try_next().await? {
        let envelope: StoredEnvelope = rows::Envelope::from(columns).try_into()?;
        let spent = budget.spend(&envelope);
        found.push(envelope);
        if spent {
            break;
        }
    }
    Ok(found)
}

#[async_trait]
impl Store for PostgresStore {
    fn backend(&self) -> Backend {
        Backend::Postgres
    }

    fn join_cluster(&self) -> Option<(PgPool, String)> {
        self.fencing.store(true, Ordering::Release);
        Some((self.pool.clone(), self.host.clone()))
    }

    async fn host(&self) -> Result<HostRecord, StoreError> {
        let row: rows::Host = sqlx::query_as("SELECT epoch, last_seq FROM host WHERE id = 1")
            .fetch_one(&self.pool)
            .await?;
        row.try_into()
    }

    async fn ping(&self) -> Result<(), StoreError> {
        sqlx::query("SELECT 1").execute(&self.pool).await?;
        Ok(())
    }

    async fn append_with_snapshots(
        &self,
        batch: Arc<Vec<NewEnvelope>>,
        snapshots: Vec<Snapshot>,
    ) -> Result<Vec<Appended>, StoreError> {
        self.append(batch, snapshots).await
    }

    async fn record_rejection(&self, rejection: Rejection) -> Result<OriginOutcome, StoreError> {
        let mut tx = self.pool.begin().await?;
        Self::lock_host(&mut tx).await?;
        let origin = &rejection.origin;
        if let Some(existing) = Self::outcome_in(&mut tx, origin).await? {
            tx.rollback().await?;
            return Ok(existing);
        }
        sqlx::query(
            "INSERT INTO rejections (client_id, client_seq, origin_scope, channel, action, \
                                     reason, at_ms) \
             VALUES ($1, $2, $3, $4, $5, $6, $7)",
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
        // REPEATABLE READ: both lookups see one snapshot, so an outcome
        // committed between them cannot be missed by both.
        let mut tx = self
            .pool
            .begin_with("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
            .await?;
        let outcome = Self::outcome_in(&mut tx, origin).await?;
        tx.commit().await?;
        Ok(outcome)
    }

    fn replay_page_rows(&self) -> u32 {
        crate::store::MAX_READ_LIMIT
    }

    async fn read_after_within(
        &self,
        after: u64,
        channels: Option<&[String]>,
        limit: u32,
        max_bytes: usize,
    ) -> Result<Vec<StoredEnvelope>, StoreError> {
        let (after, limit) = (seq_to_db(after), clamp_limit(limit));
        match channels {
            None => {
                let rows = sqlx::query_as(
                    "SELECT seq, channel, session_id, action, client_id, client_seq, origin_scope, at_ms \
                     FROM log WHERE seq > $1 ORDER BY seq LIMIT $2",
                )
                .bind(after)
                .bind(limit)
                .fetch(&self.pool);
                envelopes_within(rows, max_bytes).await
            }
            Some(channels) => {
                // One ordered scan of `log_channel` per channel, merged.
                let mut tx = self.begin_channel_read().await?;
                let rows = sqlx::query_as(
                    "SELECT l.seq, l.channel, l.session_id, l.action, l.client_id, l.client_seq, \
                            l.origin_scope, l.at_ms \
                     FROM (SELECT DISTINCT UNNEST($2::text[]) AS channel) AS c \
                     CROSS JOIN LATERAL (SELECT * FROM log \
                                         WHERE log.channel = c.channel AND log.seq > $1 \
                                         ORDER BY log.seq LIMIT $3) AS l \
                     ORDER BY l.seq LIMIT $3",
                )
                .bind(after)
                .bind(channels)
                .bind(limit)
                .fetch(&mut *tx);
                let found = envelopes_within(rows, max_bytes).await?;
                tx.commit().await?;
                Ok(found)
            }
        }
    }

    async fn transcript(
        &self,
        session_id: &str,
        after: u64,
        limit: u32,
    ) -> Result<Vec<StoredEnvelope>, StoreError> {
        self.session_page(&session_pages::TRANSCRIPT, session_id, after, limit)
            .await
    }

    async fn session_log(
        &self,
        session_id: &str,
        after: u64,
        limit: u32,
    ) -> Result<Vec<StoredEnvelope>, StoreError> {
        self.session_page(&session_pages::SESSION_LOG, session_id, after, limit)
            .await
    }

    async fn chat_session(&self, chat: &str) -> Result<Option<String>, StoreError> {
        Ok(
            sqlx::query_scalar("SELECT session_id FROM chats WHERE chat = $1")
                .bind(chat)
                .fetch_optional(&self.pool)
                .await?,
        )
    }

    async fn claim_chat(&self, chat: &str, session_id: &str) -> Result<bool, StoreError> {
        // The insert either adds the row or waits on the one a concurrent
        // claim added; the CTE's read then sees only the snapshot, so the
        // owner is read by a second statement when the insert did nothing.
        let inserted = sqlx::query(
            "INSERT INTO chats (chat, session_id) VALUES ($1, $2) ON CONFLICT (chat) DO NOTHING",
        )
        .bind(chat)
        .bind(session_id)
        .execute(&self.pool)
        .await?
        .rows_affected();
        if inserted == 1 {
            return Ok(true);
        }
        let owner: Option<String> =
            sqlx::query_scalar("SELECT session_id FROM chats WHERE chat = $1")
                .bind(chat)
                .fetch_optional(&self.pool)
                .await?;
        Ok(owner.as_deref() == Some(session_id))
    }

    async fn release_chat(&self, chat: &str, session_id: &str) -> Result<(), StoreError> {
        sqlx::query("DELETE FROM chats WHERE chat = $1 AND session_id = $2")
            .bind(chat)
            .bind(session_id)
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    async fn put_attachment(&self, attachment: &Attachment) -> Result<(), StoreError> {
        sqlx::query(
            "INSERT INTO attachments (session_id, digest, content_type, size, data, created_ms) \
             VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT DO NOTHING",
        )
        .bind(&attachment.session_id)
        .bind(&attachment.digest)
        .bind(&attachment.content_type)
        .bind(attachment.data.len() as i64)
        .bind(&attachment.data)
        .bind(now_ms())
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    async fn attachment(
        &self,
        session: &str,
        digest: &str,
    ) -> Result<Option<Attachment>, StoreError> {
        Ok(sqlx::query_as(
            "SELECT session_id, digest, content_type, data FROM attachments \
             WHERE session_id = $1 AND digest = $2",
        )
        .bind(session)
        .bind(digest)
        .fetch_optional(&self.pool)
        .await?)
    }

    async fn attachment_bytes(
        &self,
        session: &str,
        digests: &[String],
    ) -> Result<(u64, u64), StoreError> {
        let sizes: Vec<(String, i64)> =
            sqlx::query_as("SELECT digest, size FROM attachments WHERE session_id = $1")
                .bind(session)
                .fetch_all(&self.pool)
                .await?;
        Ok(super::sum_sizes(&sizes, digests))
    }

    async fn client_owners(&self, session: &str) -> Result<Vec<(String, String)>, StoreError> {
        Ok(
            sqlx::query_as("SELECT client_id, sub FROM client_owners WHERE session_id = $1")
                .bind(session)
                .fetch_all(&self.pool)
                .await?,
        )
    }

    async fn archive_turns(&self, turns: &[ArchivedTurn]) -> Result<(), StoreError> {
        let mut tx = self.pool.begin().await?;
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
             WHERE chat = $1 AND generation = $2 AND ordinal >= $3 AND ordinal < $4 \
             ORDER BY ordinal",
        )
        .bind(chat)
        .bind(seq_to_db(generation))
        .bind(seq_to_db(ordinals.start))
        .bind(seq_to_db(ordinals.end))
        .fetch_all(&self.pool)
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
            "SELECT max(ordinal) FROM chat_turns \
             WHERE chat = $1 AND generation = $2 AND turn_id = $3",
        )
        .bind(chat)
        .bind(seq_to_db(generation))
        .bind(turn_id)
        .fetch_one(&self.pool)
        .await?;
        found.map(seq_from_db).transpose()
    }

    async fn replace_session_record(&self, record: &SessionRecord) -> Result<bool, StoreError> {
        let updated = sqlx::query(
            "UPDATE sessions SET project = $1, provider = $2, title = $3, state = $4, turns = $5, \
                    resumable = $6, projection = $7 WHERE id = $8",
        )
        .bind(&record.project)
        .bind(&record.provider)
        .bind(&record.title)
        .bind(&record.state)
        .bind(seq_to_db(record.turns))
        .bind(record.resumable)
        .bind(&record.projection)
        .bind(&record.id)
        .execute(&self.pool)
        .await?;
        Ok(updated.rows_affected() == 1)
    }

    async fn session(&self, id: &str) -> Result<Option<SessionRow>, StoreError> {
        let found: Option<rows::Session> = sqlx::query_as(
            "SELECT id, project, provider, title, state, turns, resumable, last_seq, \
                    created_ms, updated_ms, projection FROM sessions WHERE id = $1",
        )
        .bind(id)
        .fetch_optional(&self.pool)
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
            rows::SESSION_COLUMNS,
            |n| format!("${n}"),
            |p| in_projects("project", &format!("{p}::text[]")),
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
            query = query.bind(projects.clone());
        }
        if let Some(before) = before {
            query = query.bind(seq_to_db(before));
        }
        let found = query.bind(limit + 1).fetch_all(&self.pool).await?;
        rows::session_page(found, limit)
    }

    async fn put_snapshot(&self, snapshot: Snapshot) -> Result<(), StoreError> {
        let mut tx = self.pool.begin().await?;
        Self::write_snapshot_in(&mut tx, &snapshot).await?;
        tx.commit().await?;
        Ok(())
    }

    async fn latest_snapshot(&self, channel: &str) -> Result<Option<Snapshot>, StoreError> {
        let found: Option<rows::Snapshot> = sqlx::query_as(
            "SELECT channel, seq, state, at_ms FROM snapshots WHERE channel = $1 \
             ORDER BY seq DESC LIMIT 1",
        )
        .bind(channel)
        .fetch_optional(&self.pool)
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
            "INSERT INTO working_contexts (project, session, body, saved_ms) \
             VALUES ($1, $2, $3, $4) \
             ON CONFLICT (project, session) DO UPDATE SET body = excluded.body, \
                 saved_ms = excluded.saved_ms",
        )
        .bind(project)
        .bind(session)
        .bind(body)
        .bind(saved_ms)
        .execute(&self.pool)
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
             WHERE project = $1 AND session = $2",
        )
        .bind(project)
        .bind(session)
        .fetch_optional(&self.pool)
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
            .fetch_all(&self.pool)
            .await?
            .into_iter()
            .map(Into::into)
            .collect())
    }

    async fn search(&self, request: &SearchRequest) -> Result<Vec<SearchHit>, StoreError> {
        search::search(&self.pool, request).await
    }

    async fn put_search_docs(
        &self,
        session: &str,
        docs: &[(u64, i64, SearchDoc)],
    ) -> Result<(), StoreError> {
        let rows: Vec<(&str, i64, i64, &SearchDoc)> = docs
            .iter()
            .map(|(seq, at_ms, doc)| (session, seq_to_db(*seq), *at_ms, doc))
            .collect();
        let mut tx = self.pool.begin().await?;
        Self::write_docs_in(&mut tx, &rows, true).await?;
        tx.commit().await?;
        Ok(())
    }

    async fn usage(&self, query: &UsageQuery) -> Result<Vec<UsageTotal>, StoreError> {
        let sql = usage::usage_sql(query, param, |p| in_projects("project", p));
        let rows = sqlx::query(AssertSqlSafe(sql))
            .bind(query.since_ms)
            .bind(query.until_ms)
            .bind(query.projects.as_deref())
            .bind(query.project.as_deref())
            .bind(query.agent.as_deref())
            .fetch_all(&self.pool)
            .await?;
        Ok(rows
            .iter()
            .map(|row| usage::usage_total(row, query.by.len()))
            .collect::<Result<_, _>>()?)
    }

    async fn set_retention(&self, project: &str, days: Option<u32>) -> Result<(), StoreError> {
        match days {
            Some(days) => {
                sqlx::query(
                    "INSERT INTO retention (project, days, updated_ms) VALUES ($1, $2, $3) \
                     ON CONFLICT (project) DO UPDATE SET days = excluded.days, \
                         updated_ms = excluded.updated_ms",
                )
                .bind(project)
                .bind(i64::from(days))
                .bind(now_ms())
                .execute(&self.pool)
                .await?
            }
            None => {
                sqlx::query("DELETE FROM retention WHERE project = $1")
                    .bind(project)
                    .execute(&self.pool)
                    .await?
            }
        };
        Ok(())
    }

    async fn retention(&self, project: &str) -> Result<Option<u32>, StoreError> {
        let days: Option<i64> = sqlx::query_scalar("SELECT days FROM retention WHERE project = $1")
            .bind(project)
            .fetch_optional(&self.pool)
            .await?;
        Ok(days.and_then(|d| u32::try_from(d).ok()))
    }

    async fn expired_sessions(&self, now_ms: i64, limit: u32) -> Result<Vec<Expired>, StoreError> {
        retention::expired_sessions(&self.pool, now_ms, limit).await
    }

    async fn delete_sessions(&self, sessions: &[Expired]) -> Result<Vec<String>, StoreError> {
        self.delete_expired(sessions).await
    }

    async fn create_webhook(&self, w: &Webhook, most: usize) -> Result<bool, StoreError> {
        outbox::create_webhook(&self.pool, w, most).await
    }

    async fn webhooks(&self, project: &str) -> Result<Vec<Webhook>, StoreError> {
        outbox::webhooks(&self.pool, project).await
    }

    async fn delete_webhook(&self, project: &str, id: &str) -> Result<bool, StoreError> {
        outbox::delete_webhook(&self.pool, project, id).await
    }

    async fn claim_deliveries(
        &self,
        claimer: &str,
        now_ms: i64,
        hold_ms: i64,
        limit: u32,
    ) -> Result<Vec<Due>, StoreError> {
        outbox::claim_deliveries(&self.pool, claimer, now_ms, hold_ms, limit).await
    }

    async fn release_deliveries(&self, claimer: &str) -> Result<(), StoreError> {
        outbox::release_deliveries(&self.pool, claimer).await
    }

    async fn record_attempt(
        &self,
        event_id: &str,
        webhook_id: &str,
        attempt: &Attempt,
    ) -> Result<(), StoreError> {
        outbox::record_attempt(&self.pool, event_id, webhook_id, attempt).await
    }

    async fn prune_deliveries(&self, before_ms: i64, limit: u32) -> Result<u64, StoreError> {
        outbox::prune_deliveries(&self.pool, before_ms, limit).await
    }

    async fn deliveries(
        &self,
        webhook_id: &str,
        limit: u32,
    ) -> Result<Vec<DeliveryRow>, StoreError> {
        outbox::deliveries(&self.pool, webhook_id, limit).await
    }

    async fn search_pending(&self, limit: u32) -> Result<Vec<String>, StoreError> {
        Ok(
            sqlx::query_scalar("SELECT session_id FROM search_pending LIMIT $1")
                .bind(clamp_limit(limit))
                .fetch_all(&self.pool)
                .await?,
        )
    }

    async fn analyze(&self) -> Result<(), StoreError> {
        sqlx::query("ANALYZE search_docs")
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    async fn search_indexed(&self, session: &str) -> Result<(), StoreError> {
        sqlx::query("DELETE FROM search_pending WHERE session_id = $1")
            .bind(session)
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    async fn close(&self) {
        self.pool.close().await;
    }
}

/// A statement's `n`th parameter, cast to its kind (`list` a text array,
/// `int` a bigint, anything else text).
pub(super) fn param(n: usize, kind: &str) -> String {
    match kind {
        "list" => format!("${n}::text[]"),
        "int" => format!("${n}::bigint"),
        _ => format!("${n}::text"),
    }
}

/// `column` is one of the projects bound at `p`, a text array.
pub(super) fn in_projects(column: &str, p: &str) -> String {
    format!("{column} = ANY({p})")
}
