//! Durable storage: the transcript log, the session read model, snapshots,
//! recorded rejections and working contexts.
//!
//! [`Store`] is object-safe and held as `Arc<dyn Store>`. Each backend is
//! written by hand against its own SQL and runs its own migrations when it
//! opens; one conformance suite (`tests/tests/store_conformance.rs`) holds them
//! to the same contract.
//!
//! The contract every backend keeps:
//! * `serverSeq` is host-wide, strictly increasing in commit order, gap-free
//!   and never reused, also across restarts and hosts sharing one database.
//! * [`Store::append`] commits a whole batch in one transaction (group commit)
//!   and returns only once it is durable.
//! * An origin `(clientId, scope, clientSeq)` is accepted at most once and is
//!   never both accepted and rejected: the first recorded outcome wins.
//! * A session's read-model row is written in the same transaction as the log
//!   row it summarises.

mod attachment;
#[cfg(test)]
mod expand;
pub mod identity;
mod open;
mod plan;
pub(crate) mod postgres;
mod retention;
mod rfc3339;
mod rows;
pub mod search;
pub(crate) mod sqlite;
pub mod usage;
pub mod webhooks;

pub use attachment::{ATTACHMENT_SCHEME, Attachment, attachment_digest};

use std::fmt;
use std::sync::Arc;

use async_trait::async_trait;
use uuid::Uuid;

pub use tether_protocol::window::ArchivedTurn;

pub use open::{StoreOptions, backup, data_files, has_writer_thread, open, redact_url};
pub(crate) use open::{Target, parse_url};
pub use postgres::PostgresStore;
pub use retention::Expired;
pub(crate) use retention::{
    Prefixes, owned_rows_sql, session_channels, session_rows_sql, under_session,
};
pub use rfc3339::rfc3339;
pub use sqlite::SqliteStore;
pub use sqlite::backup::BackupReport;

/// How many rows one read may return at most, whatever the caller asks for.
/// Keeps a single reply bounded in memory (invariant 7).
pub const MAX_READ_LIMIT: u32 = 10_000;

/// Snapshots kept per channel; older ones are pruned when a new one is written.
/// Two, so a reader that just fetched the previous one can still use it.
pub(crate) const SNAPSHOTS_KEPT: i64 = 2;

/// Errors of the storage layer.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The database URL names a scheme Tether does not speak.
    #[error(
        "unsupported database URL {0:?}: use sqlite:PATH (or a plain file path) or postgres://USER@HOST/DB"
    )]
    UnsupportedUrl(String),
    /// The database could not be opened or prepared for use.
    #[error("cannot open {target}: {reason}")]
    Open {
        /// The database, with any password redacted.
        target: String,
        /// Why, in one line.
        reason: String,
    },
    /// A query failed (connection lost, disk full, constraint broken, ...).
    #[error("database error: {0}")]
    Database(#[from] sqlx::Error),
    /// A statement of the SQLite writer failed (disk full, I/O error, ...).
    #[error("database error: {0}")]
    Sqlite(#[from] rusqlite::Error),
    /// A stored row could not be decoded.
    #[error("corrupt stored record: {0}")]
    Corrupt(String),
}

/// Which backend a store runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    /// Embedded SQLite.
    Sqlite,
    /// PostgreSQL.
    Postgres,
}

impl Backend {
    /// The backend's name as reported by `/readyz`.
    pub fn as_str(self) -> &'static str {
        match self {
            Backend::Sqlite => "sqlite",
            Backend::Postgres => "postgres",
        }
    }
}

/// The host record: created once per database.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HostRecord {
    /// A UUID created when the database was first opened. Clients compare it
    /// to know whether their `serverSeq` still means anything.
    pub epoch: Uuid,
    /// The highest `serverSeq` ever issued.
    pub last_seq: u64,
}

/// The client that dispatched an action, and its sequence number.
///
/// An origin is accepted at most once within its scope (DESIGN.md,
/// invariant 3). Durable origins (REST callers, the SDK's persistent
/// identity) have the empty scope and are unique for good; a plain AHP
/// client numbers `clientSeq` per connection, so each of its connections is
/// a scope of its own. The scope is never sent: on the wire an origin is
/// `{clientId, clientSeq}`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub struct Origin {
    /// The AHP client id.
    pub client_id: String,
    /// The client's own sequence number for the dispatch.
    pub client_seq: u64,
    /// Where `client_seq` is unique: for durable origins the empty scope
    /// (no authentication) or `sub:<token sub>`, otherwise `conn:` and a
    /// connection's own token.
    pub scope: String,
}

impl Origin {
    /// A durable origin: unique across connections, hosts and restarts.
    pub fn durable(client_id: impl Into<String>, client_seq: u64) -> Self {
        Self {
            client_id: client_id.into(),
            client_seq,
            scope: String::new(),
        }
    }
}

/// One envelope to append.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct NewEnvelope {
    /// The channel URI (`ahp-session:/<id>`, `ahp-chat:/<id>`, `ahp-root://`).
    pub channel: String,
    /// The session the envelope belongs to, if any (root envelopes have none).
    pub session_id: Option<String>,
    /// The action as JSON text, stored and re-sent byte for byte.
    pub action: String,
    /// Who dispatched it; `None` for host-originated actions.
    pub origin: Option<Origin>,
    /// The session's read-model row after this envelope, written in the same
    /// transaction. The store fills in `last_seq` and the update time.
    pub session: Option<SessionRecord>,
    /// Chat URIs this envelope brings into being, recorded as owned by
    /// `session_id` in the same transaction.
    pub chats: Vec<String>,
    /// Turns its fold moved out of their chat's window, archived (upserted)
    /// in the same transaction.
    pub turns: Vec<ArchivedTurn>,
    /// Another copy of the action for one client's connections only (a
    /// client tool's arguments with the host's context). Never stored.
    pub directed: Option<Directed>,
    /// A client whose tools this envelope registers (`session/activeClientSet`,
    /// or a session created with an active client) and the principal (token
    /// `sub`) that registers them, as `(clientId, sub)`: recorded as that
    /// client's owner in the session, in the same transaction, so the
    /// ownership outlives the actor and the host.
    pub owner: Option<(String, String)>,
    /// The search documents the envelope writes (or rewrites), in the
    /// same transaction, so what is committed is searchable at once.
    pub search: Vec<tether_protocol::search::SearchDoc>,
    /// What the envelope added to its session's usage, for the ledger, in
    /// the same transaction.
    pub usage: Option<usage::UsageRow>,
    /// The notification events it raises, for the outbox, in the same
    /// transaction (written only for projects with a webhook that wants
    /// them).
    pub events: Vec<webhooks::OutboxEvent>,
}

/// A copy of an envelope's action that only one client receives: the
/// connections that named `client_id` at `initialize`, and, when `sub` is
/// known, whose principal is that one. Everyone else, the transcript and
/// every replay get the stored action.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Directed {
    /// The client it is for.
    pub client_id: String,
    /// The principal (token `sub`) that registered the client's tools.
    pub sub: Option<String>,
    /// The action JSON text that client receives instead.
    pub action: String,
}

/// An envelope as stored in the log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredEnvelope {
    /// Its `serverSeq`.
    pub seq: u64,
    /// The channel URI.
    pub channel: String,
    /// The session it belongs to, if any.
    pub session_id: Option<String>,
    /// The action JSON text, exactly as appended.
    pub action: String,
    /// Who dispatched it; `None` for host-originated actions.
    pub origin: Option<Origin>,
    /// Commit time, milliseconds since the Unix epoch.
    pub at_ms: i64,
}

impl StoredEnvelope {
    /// What it counts against a read's byte budget
    /// ([`Store::read_after_within`]): its action's and channel's bytes.
    pub fn read_bytes(&self) -> usize {
        self.action.len() + self.channel.len()
    }
}

/// A read's byte budget ([`Store::read_after_within`]), spent envelope by
/// envelope: the read stops after the one that goes past it.
pub(crate) struct ByteBudget {
    left: usize,
}

impl ByteBudget {
    pub(crate) fn new(max_bytes: usize) -> Self {
        Self { left: max_bytes }
    }

    /// Counts `envelope`; `true` once the read has gone past its budget.
    pub(crate) fn spend(&mut self, envelope: &StoredEnvelope) -> bool {
        match self.left.checked_sub(envelope.read_bytes()) {
            Some(left) => {
                self.left = left;
                false
            }
            None => true,
        }
    }
}

/// A refused dispatch, recorded so a retry gets the same answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rejection {
    /// The origin that was refused.
    pub origin: Origin,
    /// The channel it was aimed at.
    pub channel: String,
    /// The refused action JSON text.
    pub action: String,
    /// Why, as a sentence a person can act on.
    pub reason: String,
    /// When it was recorded, milliseconds since the Unix epoch.
    pub at_ms: i64,
}

/// What a store already knows about an origin.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OriginOutcome {
    /// The origin was accepted as this envelope.
    Accepted(StoredEnvelope),
    /// The origin was refused.
    Rejected(Rejection),
}

/// The result of appending one envelope of a batch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Appended {
    /// Committed with this `serverSeq`.
    Committed {
        /// The seq it was given.
        seq: u64,
        /// Commit time, milliseconds since the Unix epoch.
        at_ms: i64,
    },
    /// Not appended: its origin already has an outcome, returned here. Nothing
    /// of the envelope (nor its read-model row) was written.
    Duplicate(OriginOutcome),
    /// Not appended: another host holds the lease of the envelope's session
    /// (several hosts on one Postgres). Nothing of it was written.
    Fenced,
}

/// A session's read-model row as the writer supplies it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionRecord {
    /// Session id (the path of `ahp-session:/<id>`).
    pub id: String,
    /// Project name.
    pub project: String,
    /// Agent provider.
    pub provider: String,
    /// Title, explicit or derived.
    pub title: Option<String>,
    /// Projected state (`live`, `dormant`, `ended`, `closed`).
    pub state: String,
    /// Turns started.
    pub turns: u64,
    /// Whether the session can be resumed.
    pub resumable: bool,
    /// Creation time, milliseconds since the Unix epoch; kept from the first
    /// write of the row.
    pub created_ms: i64,
    /// The whole projection as JSON text.
    pub projection: String,
}

/// A session's read-model row as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionRow {
    /// The row as last written.
    pub record: SessionRecord,
    /// The seq of the session's latest envelope; unique across sessions.
    pub last_seq: u64,
    /// Time of the latest envelope, milliseconds since the Unix epoch.
    pub updated_ms: i64,
}

impl SessionRow {
    /// The row as a view (what REST and the host's `session_context` tool
    /// answer), with the row's seq and time.
    pub fn view(&self) -> Result<tether_protocol::view::SessionView, StoreError> {
        let mut view: tether_protocol::view::SessionView =
            serde_json::from_str(&self.record.projection).map_err(|e| {
                StoreError::Corrupt(format!("read model of {}: {e}", self.record.id))
            })?;
        view.last_seq = self.last_seq;
        view.updated_at = rfc3339(self.updated_ms);
        Ok(view)
    }
}

/// Which sessions a page holds.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SessionFilter {
    /// Only this project's sessions.
    pub project: Option<String>,
    /// Only sessions in this projected state.
    pub state: Option<String>,
    /// Only sessions of these projects (a principal's scope); `None`: all.
    pub projects: Option<Vec<String>>,
}

/// One page of sessions, most recently updated first.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionPage {
    /// The sessions.
    pub items: Vec<SessionRow>,
    /// Pass as `before` to get the next page; `None` on the last page.
    pub next_before: Option<u64>,
}

/// A channel's state at a seq.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Snapshot {
    /// The channel URI.
    pub channel: String,
    /// The state includes every envelope of the channel up to this seq.
    pub seq: u64,
    /// The state as JSON text.
    pub state: String,
    /// When it was written, milliseconds since the Unix epoch.
    pub at_ms: i64,
}

/// A saved working context.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SavedContext {
    /// Project name.
    pub project: String,
    /// Session name.
    pub session: String,
    /// The context as JSON text.
    pub body: String,
    /// When it was last saved, milliseconds since the Unix epoch.
    pub saved_ms: i64,
}

/// Durable storage for one Tether database.
#[async_trait]
pub trait Store: Send + Sync + fmt::Debug {
    /// Which backend this is.
    fn backend(&self) -> Backend;

    /// With a database several hosts may share (Postgres): joins the
    /// cluster, returning its pool and the id this process writes as; from
    /// now on appends skip envelopes of sessions whose lease another host
    /// holds. `None` for a single-host backend.
    fn join_cluster(&self) -> Option<(sqlx::PgPool, String)> {
        None
    }

    /// The host record.
    async fn host(&self) -> Result<HostRecord, StoreError>;

    /// Checks that the database answers.
    async fn ping(&self) -> Result<(), StoreError>;

    /// Appends a batch in one transaction and returns one outcome per
    /// envelope, in order. Committed envelopes get consecutive seqs; an
    /// envelope whose origin already has an outcome is skipped and reported.
    /// Returns only once the transaction is durable.
    async fn append(&self, batch: Vec<NewEnvelope>) -> Result<Vec<Appended>, StoreError> {
        self.append_with_snapshots(Arc::new(batch), Vec::new())
            .await
    }

    /// [`Store::append`], writing `snapshots` (as [`Store::put_snapshot`]
    /// does) in the same transaction: under load, snapshots in transactions
    /// of their own cost the single SQLite writer a commit and an fsync each.
    /// The batch is shared, not borrowed, because a backend may write it on a
    /// thread of its own; the store drops its handle before it answers, so
    /// the caller gets sole ownership back.
    async fn append_with_snapshots(
        &self,
        batch: Arc<Vec<NewEnvelope>>,
        snapshots: Vec<Snapshot>,
    ) -> Result<Vec<Appended>, StoreError>;

    /// Records a refused dispatch. The first outcome recorded for an origin
    /// wins: the returned outcome is the one that holds, which is an earlier
    /// acceptance or rejection when there was one.
    async fn record_rejection(&self, rejection: Rejection) -> Result<OriginOutcome, StoreError>;

    /// What is known about an origin, if anything.
    async fn origin_outcome(&self, origin: &Origin) -> Result<Option<OriginOutcome>, StoreError>;

    /// How many envelopes a long replay asks [`Store::read_after`] for at
    /// once, at most (it starts with fewer and doubles). Measured with
    /// `tether-load catchup` (`BENCHMARKS.md`): SQLite reads fastest in
    /// pages of 1,000 (larger ones leave the caches), Postgres in pages as
    /// large as it reads (each page a transaction of round trips and a
    /// plan).
    fn replay_page_rows(&self) -> u32 {
        1_000
    }

    /// Envelopes with seq above `after`, oldest first, at most `limit`
    /// (capped at [`MAX_READ_LIMIT`]); only those on `channels` when given.
    async fn read_after(
        &self,
        after: u64,
        channels: Option<&[String]>,
        limit: u32,
    ) -> Result<Vec<StoredEnvelope>, StoreError> {
        self.read_after_within(after, channels, limit, usize::MAX)
            .await
    }

    /// As [`Store::read_after`], stopping after the envelope whose action
    /// and channel take the read's bytes past `max_bytes`: a read for a
    /// reply with a byte budget holds at most one envelope more than the
    /// reply may, however large the envelopes after the first ones are.
    async fn read_after_within(
        &self,
        after: u64,
        channels: Option<&[String]>,
        limit: u32,
        max_bytes: usize,
    ) -> Result<Vec<StoredEnvelope>, StoreError>;

    /// A page of one session's transcript (the session channel and the chats
    /// recorded for it by the envelopes that named them), seq above `after`,
    /// oldest first.
    async fn transcript(
        &self,
        session_id: &str,
        after: u64,
        limit: u32,
    ) -> Result<Vec<StoredEnvelope>, StoreError>;

    /// A page of every envelope of one session: its transcript's, and its
    /// changesets' and terminals' (`ahp-changeset:/<id>/…`,
    /// `ahp-terminal:/<id>/…`), seq above `after`, oldest first. What an
    /// export takes out.
    async fn session_log(
        &self,
        session_id: &str,
        after: u64,
        limit: u32,
    ) -> Result<Vec<StoredEnvelope>, StoreError>;

    /// The session that owns a chat URI.
    async fn chat_session(&self, chat: &str) -> Result<Option<String>, StoreError>;

    /// Claims a chat URI for a session before its `session/chatAdded` is
    /// committed: true when the chat is now the session's (or already
    /// was), false when another session holds it. One claim wins however
    /// many sessions ask at once, so no two sessions write one chat's
    /// channel. A claim that could not be given back after its chat's
    /// commit failed stays the session's: the session may ask for the
    /// chat again, and the claim goes with the session.
    async fn claim_chat(&self, chat: &str, session_id: &str) -> Result<bool, StoreError>;

    /// Gives back a session's claim on a chat under which nothing was
    /// committed (a fork the agent refused, a `session/chatAdded` the
    /// session refused), so that the URI is free again.
    async fn release_chat(&self, chat: &str, session_id: &str) -> Result<(), StoreError>;

    /// Stores an attachment's bytes for a session, once (keyed by their
    /// digest: storing the same bytes again changes nothing).
    async fn put_attachment(&self, attachment: &Attachment) -> Result<(), StoreError>;

    /// An attachment of a session, by digest.
    async fn attachment(
        &self,
        session: &str,
        digest: &str,
    ) -> Result<Option<Attachment>, StoreError>;

    /// How many bytes of attachments a session holds, and of those the
    /// bytes of `digests` it holds already (bytes sent again take no room).
    async fn attachment_bytes(
        &self,
        session: &str,
        digests: &[String],
    ) -> Result<(u64, u64), StoreError>;

    /// Who owns each client of a session that registered tools:
    /// `(clientId, sub)` (see [`NewEnvelope::owner`]).
    async fn client_owners(&self, session: &str) -> Result<Vec<(String, String)>, StoreError>;

    /// Archives (upserts) turns moved out of their chat's window outside an
    /// append: what a reload re-derived and the archive may lack.
    async fn archive_turns(&self, turns: &[ArchivedTurn]) -> Result<(), StoreError>;

    /// A chat's archived turns of `generation` with ordinals in `ordinals`,
    /// oldest first.
    async fn archived_turns(
        &self,
        chat: &str,
        generation: u64,
        ordinals: std::ops::Range<u64>,
    ) -> Result<Vec<ArchivedTurn>, StoreError>;

    /// The ordinal of an archived turn of `generation`, by its id.
    async fn archived_ordinal(
        &self,
        chat: &str,
        generation: u64,
        turn_id: &str,
    ) -> Result<Option<u64>, StoreError>;

    /// Rewrites a session's read-model row in place (keeping its `last_seq`
    /// and update time); `false` when there is no such row. Used by the
    /// projection rebuild, never by the append path.
    async fn replace_session_record(&self, record: &SessionRecord) -> Result<bool, StoreError>;

    /// One session's read-model row.
    async fn session(&self, id: &str) -> Result<Option<SessionRow>, StoreError>;

    /// A page of sessions, most recently updated first, each with `last_seq`
    /// below `before` when given.
    async fn sessions(
        &self,
        filter: &SessionFilter,
        before: Option<u64>,
        limit: u32,
    ) -> Result<SessionPage, StoreError>;

    /// Writes a channel snapshot and prunes all but the newest few.
    async fn put_snapshot(&self, snapshot: Snapshot) -> Result<(), StoreError>;

    /// The newest snapshot of a channel.
    async fn latest_snapshot(&self, channel: &str) -> Result<Option<Snapshot>, StoreError>;

    /// Saves (upserts) a working context; returns the save time.
    async fn save_working_context(
        &self,
        project: &str,
        session: &str,
        body: &str,
    ) -> Result<i64, StoreError>;

    /// One saved working context.
    async fn working_context(
        &self,
        project: &str,
        session: &str,
    ) -> Result<Option<SavedContext>, StoreError>;

    /// A page of a project's saved working contexts (bodies left empty),
    /// most recently saved first, ties broken by session name: at most
    /// `limit`, after `after` (the last one of the previous page, as
    /// `(saved_ms, session)`).
    async fn working_contexts(
        &self,
        project: &str,
        after: Option<(i64, &str)>,
        limit: u32,
    ) -> Result<Vec<SavedContext>, StoreError>;

    /// The documents that match a search, best first (see
    /// [`search::SearchRequest`]).
    async fn search(
        &self,
        request: &search::SearchRequest,
    ) -> Result<Vec<search::SearchHit>, StoreError>;

    /// Writes documents of a session outside an append (indexing a
    /// transcript written before the index existed): each replaces the
    /// stored one of its key unless that one was written by a later seq.
    async fn put_search_docs(
        &self,
        session: &str,
        docs: &[(u64, i64, tether_protocol::search::SearchDoc)],
    ) -> Result<(), StoreError>;

    /// Usage totals over a time range, grouped (see [`usage::UsageQuery`]).
    async fn usage(&self, query: &usage::UsageQuery) -> Result<Vec<usage::UsageTotal>, StoreError>;

    /// Sets how many days a project keeps settled sessions (`None`: for
    /// good).
    async fn set_retention(&self, project: &str, days: Option<u32>) -> Result<(), StoreError>;

    /// How many days a project keeps settled sessions, if it is limited.
    async fn retention(&self, project: &str) -> Result<Option<u32>, StoreError>;

    /// Settled sessions past their project's retention at `now_ms`, oldest
    /// first, at most `limit`.
    async fn expired_sessions(&self, now_ms: i64, limit: u32) -> Result<Vec<Expired>, StoreError>;

    /// Deletes sessions with everything they own (transcript, chats,
    /// archived turns, snapshots, recorded refusals, attachments, search
    /// documents; the usage ledger stays), in one transaction, each only if
    /// it is still settled and nothing was written to it since `last_seq`
    /// (and, with several hosts, no host holds it). One caller at a time:
    /// another's concurrent call deletes nothing. Returns the ids deleted.
    async fn delete_sessions(&self, sessions: &[Expired]) -> Result<Vec<String>, StoreError>;

    /// Adds a webhook unless its project has `most` already (then
    /// `false`): counted and added at once, so concurrent additions never
    /// pass the bound.
    async fn create_webhook(
        &self,
        webhook: &webhooks::Webhook,
        most: usize,
    ) -> Result<bool, StoreError>;

    /// A project's webhooks, oldest first.
    async fn webhooks(&self, project: &str) -> Result<Vec<webhooks::Webhook>, StoreError>;

    /// Removes a webhook of a project and its deliveries; `false` when
    /// there was none.
    async fn delete_webhook(&self, project: &str, id: &str) -> Result<bool, StoreError>;

    /// Claims up to `limit` due deliveries for `claimer` until
    /// `now_ms + hold_ms` (a delivery claimed by another and not yet
    /// released waits until its claim runs out), counting the attempt.
    async fn claim_deliveries(
        &self,
        claimer: &str,
        now_ms: i64,
        hold_ms: i64,
        limit: u32,
    ) -> Result<Vec<webhooks::Due>, StoreError>;

    /// Releases the claims `claimer` holds (a host starting again).
    async fn release_deliveries(&self, claimer: &str) -> Result<(), StoreError>;

    /// Records an attempt's outcome and releases its claim.
    async fn record_attempt(
        &self,
        event_id: &str,
        webhook_id: &str,
        attempt: &webhooks::Attempt,
    ) -> Result<(), StoreError>;

    /// Deletes up to `limit` finished deliveries (delivered or given up) of
    /// events raised before `before_ms`, and the events left with none;
    /// returns how many deliveries went.
    async fn prune_deliveries(&self, before_ms: i64, limit: u32) -> Result<u64, StoreError>;

    /// A webhook's latest deliveries, newest first.
    async fn deliveries(
        &self,
        webhook_id: &str,
        limit: u32,
    ) -> Result<Vec<webhooks::DeliveryRow>, StoreError>;

    /// Sessions still to be indexed (at most `limit`).
    async fn search_pending(&self, limit: u32) -> Result<Vec<String>, StoreError>;

    /// Marks a session indexed.
    async fn search_indexed(&self, session: &str) -> Result<(), StoreError>;

    /// Refreshes the query planner's statistics after a bulk write (the
    /// search index built for a whole store): Postgres analyses `search_docs`,
    /// without which a store written in bulk plans common-word searches
    /// badly until autovacuum gets to it; SQLite's plans are chosen
    /// without statistics, so it does nothing.
    async fn analyze(&self) -> Result<(), StoreError> {
        Ok(())
    }

    /// Closes every connection after in-flight work finishes.
    async fn close(&self);
}

/// A session's attachment sizes summed: all of them, and those whose digest
/// is among `digests`.
pub(crate) fn sum_sizes(sizes: &[(String, i64)], digests: &[String]) -> (u64, u64) {
    sizes.iter().fold((0, 0), |(all, again), (digest, size)| {
        let size = u64::try_from(*size).unwrap_or(0);
        let repeated = if digests.contains(digest) { size } else { 0 };
        (all + size, again + repeated)
    })
}

/// Milliseconds since the Unix epoch, now.
pub(crate) fn now_ms() -> i64 {
    jiff::Timestamp::now().as_millisecond()
}

/// Converts a stored `BIGINT` seq to `u64`.
pub(crate) fn seq_from_db(value: i64) -> Result<u64, StoreError> {
    u64::try_from(value).map_err(|_| StoreError::Corrupt(format!("negative seq {value}")))
}

/// Converts a seq to the database's signed `BIGINT`.
pub(crate) fn seq_to_db(value: u64) -> i64 {
    // Seqs start at 1 and grow by one per envelope; 2^63 is out of reach.
    i64::try_from(value).unwrap_or(i64::MAX)
}

/// Clamps a caller's limit to `1..=MAX_READ_LIMIT`.
pub(crate) fn clamp_limit(limit: u32) -> i64 {
    i64::from(limit.clamp(1, MAX_READ_LIMIT))
}

/// The page of a project's saved working contexts (see
/// [`Store::working_contexts`]), its parameters rendered by the backend's
/// `param`: the project, the previous page's last `saved_ms` and session,
/// the limit. `saved_ms <= ` lets the recent index seek to the page.
pub(crate) fn working_contexts_sql(param: fn(usize, &str) -> String) -> String {
    let (project, ms, session, limit) = (
        param(1, "text"),
        param(2, "int"),
        param(3, "text"),
        param(4, "int"),
    );
    format!(
        "SELECT project, session, '' AS body, saved_ms FROM working_contexts \
         WHERE project = {project} AND saved_ms <= {ms} \
           AND (saved_ms < {ms} OR (saved_ms = {ms} AND session > {session})) \
         ORDER BY saved_ms DESC, session LIMIT {limit}"
    )
}
