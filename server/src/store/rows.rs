//! Row shapes shared by the backends and their conversion to store types.
//!
//! `FromRow` derives are generic over the database, so one struct serves
//! SQLite and Postgres; only the SQL differs per backend.

use uuid::Uuid;

use super::{
    HostRecord, Origin, SavedContext, SessionFilter, SessionPage, SessionRecord, SessionRow,
    StoreError, StoredEnvelope, seq_from_db,
};

/// Converts a stored seq, naming the column in the error.
pub(super) fn seq(value: i64) -> Result<u64, StoreError> {
    seq_from_db(value)
}

#[derive(sqlx::FromRow)]
pub(super) struct Host {
    epoch: String,
    last_seq: i64,
}

impl TryFrom<Host> for HostRecord {
    type Error = StoreError;

    fn try_from(row: Host) -> Result<Self, StoreError> {
        Ok(HostRecord {
            epoch: Uuid::parse_str(&row.epoch)
                .map_err(|e| StoreError::Corrupt(format!("host epoch {:?}: {e}", row.epoch)))?,
            last_seq: seq(row.last_seq)?,
        })
    }
}

fn origin(
    client_id: Option<String>,
    client_seq: Option<i64>,
    scope: String,
) -> Result<Option<Origin>, StoreError> {
    match (client_id, client_seq) {
        (Some(client_id), Some(client_seq)) => Ok(Some(Origin {
            client_id,
            client_seq: seq(client_seq)?,
            scope,
        })),
        _ => Ok(None),
    }
}

#[derive(sqlx::FromRow)]
pub(super) struct Envelope {
    pub(super) seq: i64,
    pub(super) channel: String,
    pub(super) session_id: Option<String>,
    pub(super) action: String,
    pub(super) client_id: Option<String>,
    pub(super) client_seq: Option<i64>,
    pub(super) origin_scope: String,
    pub(super) at_ms: i64,
}

/// An envelope row decoded by position, not by column name: a catch-up
/// decodes a thousand rows a page, and sqlx looks each name up in a map.
/// The columns are [`Envelope`]'s, in its order.
pub(super) type EnvelopeColumns = (
    i64,
    String,
    Option<String>,
    String,
    Option<String>,
    Option<i64>,
    String,
    i64,
);

impl From<EnvelopeColumns> for Envelope {
    fn from(
        (seq, channel, session_id, action, client_id, client_seq, origin_scope, at_ms): EnvelopeColumns,
    ) -> Self {
        Envelope {
            seq,
            channel,
            session_id,
            action,
            client_id,
            client_seq,
            origin_scope,
            at_ms,
        }
    }
}

impl TryFrom<Envelope> for StoredEnvelope {
    type Error = StoreError;

    fn try_from(row: Envelope) -> Result<Self, StoreError> {
        Ok(StoredEnvelope {
            seq: seq(row.seq)?,
            channel: row.channel,
            session_id: row.session_id,
            action: row.action,
            origin: origin(row.client_id, row.client_seq, row.origin_scope)?,
            at_ms: row.at_ms,
        })
    }
}

#[derive(sqlx::FromRow)]
pub(super) struct Rejection {
    client_id: String,
    client_seq: i64,
    origin_scope: String,
    channel: String,
    action: String,
    reason: String,
    at_ms: i64,
}

impl TryFrom<Rejection> for super::Rejection {
    type Error = StoreError;

    fn try_from(row: Rejection) -> Result<Self, StoreError> {
        Ok(super::Rejection {
            origin: Origin {
                client_id: row.client_id,
                client_seq: seq(row.client_seq)?,
                scope: row.origin_scope,
            },
            channel: row.channel,
            action: row.action,
            reason: row.reason,
            at_ms: row.at_ms,
        })
    }
}

#[derive(sqlx::FromRow)]
pub(super) struct Session {
    id: String,
    project: String,
    provider: String,
    title: Option<String>,
    state: String,
    turns: i64,
    resumable: bool,
    last_seq: i64,
    created_ms: i64,
    updated_ms: i64,
    projection: String,
}

impl TryFrom<Session> for SessionRow {
    type Error = StoreError;

    fn try_from(row: Session) -> Result<Self, StoreError> {
        Ok(SessionRow {
            record: SessionRecord {
                id: row.id,
                project: row.project,
                provider: row.provider,
                title: row.title,
                state: row.state,
                turns: seq(row.turns)?,
                resumable: row.resumable,
                created_ms: row.created_ms,
                projection: row.projection,
            },
            last_seq: seq(row.last_seq)?,
            updated_ms: row.updated_ms,
        })
    }
}

/// How a backend's indexes order sessions by recency.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Recency {
    /// By `last_seq` itself (SQLite).
    Exact,
    /// By `recency`, `last_seq` in buckets of [`RECENCY_SEQS`], then by
    /// `last_seq` within a bucket: a rewrite of the row that keeps its
    /// bucket changes no index key (Postgres: a HOT update; its migration
    /// 0016). The same order as [`Recency::Exact`].
    Bucketed,
}

/// The seqs in one `recency` bucket (Postgres's migration 0016).
pub(super) const RECENCY_SEQS: i64 = 4096;

/// The session page query. Conditions are added only for the filters given so
/// each shape of query can use its index; `placeholder(n)` spells the n-th
/// (1-based) bind parameter in the backend's syntax. Binds, in order: project,
/// state, before, limit — each only when present. [`Recency::Bucketed`]
/// uses the `before` placeholder twice, so needs numbered placeholders.
pub(super) fn session_page_sql(
    filter: &SessionFilter,
    before: Option<u64>,
    recency: Recency,
    placeholder: impl Fn(usize) -> String,
    project_in: impl Fn(&str) -> String,
) -> String {
    let mut sql = String::from(
        "SELECT id, project, provider, title, state, turns, resumable, last_seq, \
         created_ms, updated_ms, projection FROM sessions WHERE TRUE",
    );
    let mut n = 0;
    let mut next = || {
        n += 1;
        placeholder(n)
    };
    if filter.project.is_some() {
        sql.push_str(&format!(" AND project = {}", next()));
    }
    if filter.state.is_some() {
        sql.push_str(&format!(" AND state = {}", next()));
    }
    if filter.projects.is_some() {
        sql.push_str(&format!(" AND {}", project_in(&next())));
    }
    if before.is_some() {
        let before = next();
        if recency == Recency::Bucketed {
            sql.push_str(&format!(" AND recency <= {before} / {RECENCY_SEQS}"));
        }
        sql.push_str(&format!(" AND last_seq < {before}"));
    }
    let order = match recency {
        Recency::Exact => "last_seq DESC",
        Recency::Bucketed => "recency DESC, last_seq DESC",
    };
    sql.push_str(&format!(" ORDER BY {order} LIMIT {}", next()));
    sql
}

/// Turns `limit + 1` fetched rows into a page and its cursor.
pub(super) fn session_page(mut found: Vec<Session>, limit: i64) -> Result<SessionPage, StoreError> {
    let more = i64::try_from(found.len()).unwrap_or(i64::MAX) > limit;
    if more {
        found.truncate(usize::try_from(limit).unwrap_or(usize::MAX));
    }
    let items = found
        .into_iter()
        .map(SessionRow::try_from)
        .collect::<Result<Vec<_>, _>>()?;
    let next_before = if more {
        items.last().map(|row| row.last_seq)
    } else {
        None
    };
    Ok(SessionPage { items, next_before })
}

#[derive(sqlx::FromRow)]
pub(super) struct Snapshot {
    channel: String,
    seq: i64,
    state: String,
    at_ms: i64,
}

impl TryFrom<Snapshot> for super::Snapshot {
    type Error = StoreError;

    fn try_from(row: Snapshot) -> Result<Self, StoreError> {
        Ok(super::Snapshot {
            channel: row.channel,
            seq: seq(row.seq)?,
            state: row.state,
            at_ms: row.at_ms,
        })
    }
}

#[derive(sqlx::FromRow)]
pub(super) struct Context {
    project: String,
    session: String,
    body: String,
    saved_ms: i64,
}

impl From<Context> for SavedContext {
    fn from(row: Context) -> Self {
        SavedContext {
            project: row.project,
            session: row.session,
            body: row.body,
            saved_ms: row.saved_ms,
        }
    }
}

#[derive(sqlx::FromRow)]
pub(super) struct Turn {
    chat: String,
    generation: i64,
    ordinal: i64,
    turn_id: String,
    body: String,
}

impl TryFrom<Turn> for super::ArchivedTurn {
    type Error = StoreError;

    fn try_from(row: Turn) -> Result<Self, StoreError> {
        Ok(super::ArchivedTurn {
            chat: row.chat,
            generation: seq(row.generation)?,
            ordinal: seq(row.ordinal)?,
            turn_id: row.turn_id,
            body: row.body,
        })
    }
}
