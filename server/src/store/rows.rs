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

/// The seqs in one `recency` bucket. Both backends' session indexes hold
/// `recency` (`last_seq` in buckets) and `idle_hour` (`updated_ms` by the
/// hour), not the exact values, so a commit that rewrites a session's row
/// within its buckets changes no index key (Postgres: a HOT update, its
/// migration 0016; SQLite: an update of unindexed columns, its migration
/// 0013). Pages order by the bucket, then by `last_seq` within it.
pub(super) const RECENCY_SEQS: i64 = 4096;

/// The milliseconds in one `idle_hour` bucket.
pub(super) const IDLE_HOUR_MS: i64 = 3_600_000;

/// The columns a session's row is read with, in [`Session`]'s order.
pub(super) const SESSION_COLUMNS: &str = "id, project, provider, title, state, turns, \
     resumable, last_seq, created_ms, updated_ms, projection";

/// The session page query, selecting `select` (such as
/// [`SESSION_COLUMNS`]). Conditions are added only for the filters given so
/// each shape of query can use its index; `placeholder(n)` spells the n-th
/// (1-based) bind parameter in the backend's syntax. Binds, in order: project,
/// state, before, limit — each only when present. The `before` placeholder
/// is used twice, so placeholders must be numbered.
pub(super) fn session_page_sql(
    filter: &SessionFilter,
    before: Option<u64>,
    select: &str,
    placeholder: impl Fn(usize) -> String,
    project_in: impl Fn(&str) -> String,
) -> String {
    let mut sql = format!("SELECT {select} FROM sessions WHERE TRUE");
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
        sql.push_str(&format!(
            " AND recency <= {before} / {RECENCY_SEQS} AND last_seq < {before}"
        ));
    }
    sql.push_str(&format!(
        " ORDER BY recency DESC, last_seq DESC LIMIT {}",
        next()
    ));
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
