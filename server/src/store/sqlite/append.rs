//! The SQLite writes, as they run on the writer thread: each takes the
//! open `BEGIN IMMEDIATE` transaction and uses statements prepared once per
//! connection.

use std::sync::OnceLock;

use rusqlite::{OptionalExtension as _, Row, Transaction, params};
use tether_protocol::search::{self, SearchDoc};

use super::keys::LogKeys;
use crate::store::plan::{self, Probe};
use crate::store::rows::{self, IDLE_HOUR_MS, RECENCY_SEQS};
use crate::store::webhooks::{self, OutboxEvent};
use crate::store::{
    Appended, ArchivedTurn, NewEnvelope, Origin, OriginOutcome, Rejection, SNAPSHOTS_KEPT,
    SessionRecord, Snapshot, StoreError, StoredEnvelope, now_ms, seq_to_db,
};

/// Appends `batch` and writes `snapshots` (see `Store::append_with_snapshots`).
/// `None` when `probe` left an origin the log already had to its unique
/// index: the attempt must be undone and made again with
/// [`Probe::Everything`].
pub(super) fn append(
    tx: &Transaction<'_>,
    keys: &mut LogKeys,
    batch: &[NewEnvelope],
    snapshots: &[Snapshot],
    probe: Probe,
) -> Result<Option<Vec<Appended>>, StoreError> {
    let last: i64 = tx
        .prepare_cached("SELECT last_seq FROM host WHERE id = 1")?
        .query_row([], |row| row.get(0))?;
    let at_ms = now_ms();
    let origins = plan::origins(batch);
    let existing = match probe {
        Probe::Everything => existing_origins(tx, &origins)?,
        Probe::Index => rejected_origins(tx, &origins)?,
    };
    let plan = plan::plan(batch, last, &existing, &plan::Set::default());
    {
        let mut insert = tx.prepare_cached(
            "INSERT INTO log (seq, channel, session_id, action, client_id, client_seq, \
                              origin_scope, at_ms, channel_id, origin_id) \
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)",
        )?;
        for row in &plan.rows {
            let e = row.envelope;
            let origin = e.origin.as_ref();
            let channel_id = keys.channel(tx, &e.channel)?;
            let origin_id = match origin {
                Some(o) => Some(keys.origin(tx, &o.client_id, &o.scope)?),
                None => None,
            };
            let inserted = insert.execute(params![
                row.seq,
                e.channel,
                e.session_id,
                e.action,
                origin.map(|o| &o.client_id),
                origin.map(|o| seq_to_db(o.client_seq)),
                origin.map_or("", |o| o.scope.as_str()),
                at_ms,
                channel_id,
                origin_id,
            ]);
            match inserted {
                // The log's one unique index besides its key: `log_origin_id`.
                Err(rusqlite::Error::SqliteFailure(err, _))
                    if probe == Probe::Index
                        && err.extended_code == rusqlite::ffi::SQLITE_CONSTRAINT_UNIQUE =>
                {
                    return Ok(None);
                }
                inserted => inserted?,
            };
        }
    }
    if !plan.sessions.is_empty() {
        write_sessions(tx, &plan.sessions, at_ms)?;
    }
    if !plan.chats.is_empty() {
        let mut chat = tx.prepare_cached(
            "INSERT INTO chats (chat, session_id) VALUES (?1, ?2) ON CONFLICT (chat) DO NOTHING",
        )?;
        for (uri, session_id) in &plan.chats {
            chat.execute(params![uri, session_id])?;
        }
    }
    if !plan.owners.is_empty() {
        let mut owner = tx.prepare_cached(
            "INSERT INTO client_owners (session_id, client_id, sub) VALUES (?1, ?2, ?3) \
             ON CONFLICT (session_id, client_id) DO UPDATE SET sub = excluded.sub",
        )?;
        for (session_id, client_id, sub) in &plan.owners {
            owner.execute(params![session_id, client_id, sub])?;
        }
    }
    archive(tx, &plan.turns)?;
    let docs: Vec<_> = plan
        .docs
        .iter()
        .map(|d| (d.session_id, d.seq, at_ms, d.doc))
        .collect();
    write_docs(tx, &docs, false)?;
    if !plan.usage.is_empty() {
        let mut insert = tx.prepare_cached(
            "INSERT INTO usage (seq, session_id, project, agent, model, sub, at_ms, \
                                input_tokens, output_tokens, cost_micros, currency) \
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11)",
        )?;
        for (seq, session_id, u) in &plan.usage {
            insert.execute(params![
                seq,
                session_id,
                u.project,
                u.agent,
                u.model,
                u.sub,
                at_ms,
                u.input_tokens,
                u.output_tokens,
                u.cost_micros,
                u.currency,
            ])?;
        }
    }
    for (seq, session_id, event) in &plan.events {
        write_event(tx, *seq, *session_id, at_ms, event)?;
    }
    if plan.last_seq != last {
        tx.prepare_cached("UPDATE host SET last_seq = ?1 WHERE id = 1")?
            .execute([plan.last_seq])?;
    }
    for snapshot in snapshots {
        write_snapshot(tx, snapshot)?;
    }
    let found = plan::duplicates(&plan, batch)
        .into_iter()
        .map(|origin| outcome(tx, origin))
        .collect::<Result<Vec<_>, _>>()?;
    plan::outcomes(&plan, at_ms, found).map(Some)
}

/// Writes each session's row as it stands after the batch. A row that
/// keeps its project, state and buckets (`recency`, `idle_hour`: nearly
/// every commit) is updated in the columns no index holds, which rewrites
/// the row alone; SQLite would otherwise move the row's entry in each index
/// whose columns the statement sets, even to the same value (migration
/// 0013). Any other row (a new session, a new bucket, a new state) is
/// upserted whole.
fn write_sessions(
    tx: &Transaction<'_>,
    sessions: &[(&SessionRecord, i64)],
    at_ms: i64,
) -> Result<(), StoreError> {
    let mut within = tx.prepare_cached(
        "UPDATE sessions SET provider = ?2, title = ?3, turns = ?4, resumable = ?5, \
             last_seq = ?6, updated_ms = ?7, projection = ?8 \
         WHERE id = ?1 AND project = ?9 AND state = ?10 AND recency = ?11 AND idle_hour = ?12",
    )?;
    let mut whole = tx.prepare_cached(
        "INSERT INTO sessions (id, project, provider, title, state, turns, resumable, \
                               last_seq, created_ms, updated_ms, projection, recency, idle_hour) \
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13) \
         ON CONFLICT (id) DO UPDATE SET project = excluded.project, \
             provider = excluded.provider, title = excluded.title, state = excluded.state, \
             turns = excluded.turns, resumable = excluded.resumable, \
             last_seq = excluded.last_seq, updated_ms = excluded.updated_ms, \
             projection = excluded.projection, recency = excluded.recency, \
             idle_hour = excluded.idle_hour",
    )?;
    for (r, seq) in sessions {
        let recency = seq / RECENCY_SEQS;
        let idle_hour = at_ms / IDLE_HOUR_MS;
        let updated = within.execute(params![
            r.id,
            r.provider,
            r.title,
            seq_to_db(r.turns),
            r.resumable,
            seq,
            at_ms,
            r.projection,
            r.project,
            r.state,
            recency,
            idle_hour,
        ])?;
        if updated == 1 {
            continue;
        }
        whole.execute(params![
            r.id,
            r.project,
            r.provider,
            r.title,
            r.state,
            seq_to_db(r.turns),
            r.resumable,
            seq,
            r.created_ms,
            at_ms,
            r.projection,
            recency,
            idle_hour,
        ])?;
    }
    Ok(())
}

/// Which of `origins` have a recorded rejection: one range read of the
/// rejections' key per client and scope in the batch (usually no row), not
/// a lookup per origin.
fn rejected_origins(
    tx: &Transaction<'_>,
    origins: &[&Origin],
) -> Result<plan::Set<Origin>, StoreError> {
    let mut ranges: plan::Map<(&str, &str), (u64, u64)> = plan::Map::default();
    for origin in origins {
        let seq = origin.client_seq;
        ranges
            .entry((&origin.client_id, &origin.scope))
            .and_modify(|(low, high)| (*low, *high) = ((*low).min(seq), (*high).max(seq)))
            .or_insert((seq, seq));
    }
    let mut read = tx.prepare_cached(
        "SELECT client_seq FROM rejections \
         WHERE client_id = ?1 AND origin_scope = ?2 AND client_seq BETWEEN ?3 AND ?4",
    )?;
    let mut found = plan::Set::default();
    for ((client_id, scope), (low, high)) in ranges {
        let seqs = read.query_map(
            params![client_id, scope, seq_to_db(low), seq_to_db(high)],
            |row| row.get::<_, i64>(0),
        )?;
        for seq in seqs {
            found.insert(Origin {
                client_id: client_id.to_owned(),
                client_seq: u64::try_from(seq?).unwrap_or_default(),
                scope: scope.to_owned(),
            });
        }
    }
    Ok(found)
}

/// Which of `origins` already have an outcome (a log row or a recorded
/// rejection): one indexed lookup each.
fn existing_origins(
    tx: &Transaction<'_>,
    origins: &[&Origin],
) -> Result<plan::Set<Origin>, StoreError> {
    if origins.is_empty() {
        return Ok(plan::Set::default());
    }
    let mut probe = tx.prepare_cached(
        "SELECT EXISTS (SELECT 1 FROM log WHERE origin_id = \
                            (SELECT id FROM origins WHERE client_id = ?1 AND scope = ?2) \
                        AND client_seq = ?3) \
             OR EXISTS (SELECT 1 FROM rejections WHERE client_id = ?1 AND origin_scope = ?2 \
                                                   AND client_seq = ?3)",
    )?;
    let mut found = plan::Set::default();
    for origin in origins {
        let exists: bool = probe.query_row(
            params![origin.client_id, origin.scope, seq_to_db(origin.client_seq)],
            |row| row.get(0),
        )?;
        if exists {
            found.insert((*origin).clone());
        }
    }
    Ok(found)
}

/// The outcome recorded for `origin`, if any.
pub(super) fn outcome(
    tx: &Transaction<'_>,
    origin: &Origin,
) -> Result<Option<OriginOutcome>, StoreError> {
    let seq = seq_to_db(origin.client_seq);
    let accepted = tx
        .prepare_cached(
            "SELECT seq, channel, session_id, action, client_id, client_seq, origin_scope, at_ms \
             FROM log WHERE origin_id = \
                 (SELECT id FROM origins WHERE client_id = ?1 AND scope = ?2) \
             AND client_seq = ?3",
        )?
        .query_row(params![origin.client_id, origin.scope, seq], envelope)
        .optional()?;
    if let Some(row) = accepted {
        return Ok(Some(OriginOutcome::Accepted(row?)));
    }
    let rejected = tx
        .prepare_cached(
            "SELECT channel, action, reason, at_ms FROM rejections \
             WHERE client_id = ?1 AND origin_scope = ?2 AND client_seq = ?3",
        )?
        .query_row(params![origin.client_id, origin.scope, seq], |row| {
            Ok(Rejection {
                origin: origin.clone(),
                channel: row.get(0)?,
                action: row.get(1)?,
                reason: row.get(2)?,
                at_ms: row.get(3)?,
            })
        })
        .optional()?;
    Ok(rejected.map(OriginOutcome::Rejected))
}

/// Records a refused dispatch unless its origin already has an outcome;
/// returns the outcome that holds.
pub(super) fn reject(
    tx: &Transaction<'_>,
    rejection: Rejection,
) -> Result<OriginOutcome, StoreError> {
    if let Some(existing) = outcome(tx, &rejection.origin)? {
        return Ok(existing);
    }
    let origin = &rejection.origin;
    tx.prepare_cached(
        "INSERT INTO rejections (client_id, client_seq, origin_scope, channel, action, \
                                 reason, at_ms) \
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
    )?
    .execute(params![
        origin.client_id,
        seq_to_db(origin.client_seq),
        origin.scope,
        rejection.channel,
        rejection.action,
        rejection.reason,
        rejection.at_ms,
    ])?;
    Ok(OriginOutcome::Rejected(rejection))
}

/// A log row as a stored envelope (the outer error is SQLite's, the inner
/// one a row that does not decode).
fn envelope(row: &Row<'_>) -> rusqlite::Result<Result<StoredEnvelope, StoreError>> {
    let decoded = rows::Envelope {
        seq: row.get(0)?,
        channel: row.get(1)?,
        session_id: row.get(2)?,
        action: row.get(3)?,
        client_id: row.get(4)?,
        client_seq: row.get(5)?,
        origin_scope: row.get(6)?,
        at_ms: row.get(7)?,
    };
    Ok(decoded.try_into())
}

/// Writes a snapshot and prunes all but the newest few.
pub(super) fn write_snapshot(tx: &Transaction<'_>, snapshot: &Snapshot) -> Result<(), StoreError> {
    tx.prepare_cached(
        "INSERT INTO snapshots (channel, seq, state, at_ms) VALUES (?1, ?2, ?3, ?4) \
         ON CONFLICT (channel, seq) DO UPDATE SET state = excluded.state, at_ms = excluded.at_ms",
    )?
    .execute(params![
        snapshot.channel,
        seq_to_db(snapshot.seq),
        snapshot.state,
        snapshot.at_ms,
    ])?;
    tx.prepare_cached(
        "DELETE FROM snapshots WHERE channel = ?1 AND seq NOT IN \
             (SELECT seq FROM snapshots WHERE channel = ?1 ORDER BY seq DESC LIMIT ?2)",
    )?
    .execute(params![snapshot.channel, SNAPSHOTS_KEPT])?;
    Ok(())
}

/// The most search documents one statement writes. Every statement that
/// writes the full-text index makes FTS5 flush what it holds to a new
/// segment first (its `xSavepoint`), so a batch's documents go in as few
/// statements as it takes: one of exactly as many rows up to this many (a
/// shape per count, each prepared on first use and kept in the writer's
/// statement cache), evenly split above it. Within a statement FTS5 flushes
/// again whenever a row's rowid is below the last one's, so each statement
/// writes its rows in rowid order (see [`upsert_docs`]).
pub(super) const DOCS_PER_STATEMENT: usize = 64;

/// Upserts search documents `(session, seq, at_ms, document)`; with
/// `newer_only`, keeps a stored one that a later seq wrote.
pub(super) fn write_docs(
    tx: &Transaction<'_>,
    docs: &[(&str, i64, i64, &SearchDoc)],
    newer_only: bool,
) -> Result<(), StoreError> {
    if docs.is_empty() {
        return Ok(());
    }
    let statements = docs.len().div_ceil(DOCS_PER_STATEMENT);
    for chunk in docs.chunks(docs.len().div_ceil(statements)) {
        let mut statement = tx.prepare_cached(docs_sql(chunk.len(), newer_only))?;
        for (row, (session_id, seq, at_ms, doc)) in chunk.iter().enumerate() {
            let at = row * 9;
            statement.raw_bind_parameter(at + 1, session_id)?;
            statement.raw_bind_parameter(at + 2, &doc.key)?;
            statement.raw_bind_parameter(at + 3, &doc.chat)?;
            statement.raw_bind_parameter(at + 4, &doc.turn_id)?;
            statement.raw_bind_parameter(at + 5, doc.kind)?;
            statement.raw_bind_parameter(at + 6, seq)?;
            statement.raw_bind_parameter(at + 7, at_ms)?;
            statement.raw_bind_parameter(at + 8, &doc.text)?;
            statement.raw_bind_parameter(at + 9, search::normalized(&doc.text))?;
        }
        statement.raw_execute()?;
    }
    Ok(())
}

/// The upsert of `rows` (1 to [`DOCS_PER_STATEMENT`]) search documents,
/// rendered once, on first use.
fn docs_sql(rows: usize, newer_only: bool) -> &'static str {
    static SQL: [[OnceLock<String>; DOCS_PER_STATEMENT]; 2] =
        [const { [const { OnceLock::new() }; DOCS_PER_STATEMENT] }; 2];
    SQL[usize::from(newer_only)][rows - 1].get_or_init(|| upsert_docs(rows, newer_only))
}

/// The upsert of `rows` search documents, nine parameters a row.
///
/// The rows go in by the rowid of the document each replaces, then the new
/// ones in the order given: FTS5 keeps a statement's entries in memory only
/// while rowids ascend, and flushes a segment to disk at each descent (a
/// batch of title changes in session order cost one flush every other row,
/// BENCHMARKS.md). `LEFT JOIN` finds each stored rowid through the
/// `(session_id, key)` index the upsert probes anyway; `WHERE true` is
/// SQLite's way to let `ON CONFLICT` follow a `SELECT`.
fn upsert_docs(rows: usize, newer_only: bool) -> String {
    let values: Vec<String> = (0..rows)
        .map(|row| {
            let params: Vec<String> = (1..=9).map(|n| format!("?{}", row * 9 + n)).collect();
            format!("({}, {row})", params.join(", "))
        })
        .collect();
    format!(
        "INSERT INTO search_docs (session_id, key, chat, turn_id, kind, seq, at_ms, body, words) \
         SELECT v.column1, v.column2, v.column3, v.column4, v.column5, v.column6, v.column7, \
                v.column8, v.column9 \
         FROM (VALUES {}) AS v \
         LEFT JOIN search_docs d ON d.session_id = v.column1 AND d.key = v.column2 \
         WHERE true ORDER BY d.id IS NULL, d.id, v.column10 {}",
        values.join(", "),
        crate::store::search::doc_conflict(newer_only)
    )
}

/// Writes an event to the outbox with one delivery per webhook of its
/// project that wants it; nothing when there is none.
fn write_event(
    tx: &Transaction<'_>,
    seq: i64,
    session_id: Option<&str>,
    at_ms: i64,
    event: &OutboxEvent,
) -> Result<(), StoreError> {
    let id = OutboxEvent::id(seq, event.kind);
    let written = tx
        .prepare_cached(&format!(
            "INSERT INTO outbox (event_id, kind, project, session_id, seq, at_ms, data) \
             SELECT ?1, ?2, ?3, ?4, ?5, ?6, ?7 \
             WHERE EXISTS (SELECT 1 FROM webhooks w WHERE w.project = ?3 AND {})",
            webhooks::wants("w", "?2")
        ))?
        .execute(params![
            id,
            event.kind,
            event.project,
            session_id,
            seq,
            at_ms,
            event.data
        ])?;
    if written > 0 {
        tx.prepare_cached(&format!(
            "INSERT INTO deliveries (event_id, webhook_id, next_ms) \
             SELECT ?1, w.id, ?3 FROM webhooks w WHERE w.project = ?2 AND {}",
            webhooks::wants("w", "?4")
        ))?
        .execute(params![id, event.project, at_ms, event.kind])?;
    }
    Ok(())
}

/// Upserts archived turns.
pub(super) fn archive(tx: &Transaction<'_>, turns: &[&ArchivedTurn]) -> Result<(), StoreError> {
    if turns.is_empty() {
        return Ok(());
    }
    let mut upsert = tx.prepare_cached(
        "INSERT INTO chat_turns (chat, generation, ordinal, turn_id, body) \
         VALUES (?1, ?2, ?3, ?4, ?5) \
         ON CONFLICT (chat, generation, ordinal) DO UPDATE \
             SET turn_id = excluded.turn_id, body = excluded.body",
    )?;
    for t in turns {
        upsert.execute(params![
            t.chat,
            seq_to_db(t.generation),
            seq_to_db(t.ordinal),
            t.turn_id,
            t.body,
        ])?;
    }
    Ok(())
}
