//! A group commit on Postgres: the transaction that assigns seqs, writes the
//! log and the read model, and answers each envelope (see `plan` for what is
//! written; this file is how, in a constant number of round trips).

use std::sync::Arc;
use std::sync::atomic::Ordering;

use sqlx::{AssertSqlSafe, Postgres, Transaction};
use tether_protocol::search::SearchDoc;

use super::PostgresStore;
use crate::store::plan::{self, Probe};
use crate::store::search;
use crate::store::usage::UsageRow;
use crate::store::webhooks::{self, OutboxEvent};
use crate::store::{
    Appended, ArchivedTurn, NewEnvelope, Origin, SessionRecord, Snapshot, StoreError, now_ms,
    seq_from_db, seq_to_db,
};

/// Begins a group commit's transaction holding the host row's lock, in one
/// round trip: every writer of origins and seqs takes this lock first.
const BEGIN_LOCKED: &str = "BEGIN; SELECT 1 FROM host WHERE id = 1 FOR UPDATE";

/// A row of the origin probe: the host's last seq, the batch's sessions
/// whose lease another host holds (`NULL` when none is), and an origin found
/// (all `NULL` when none is).
type HostAndOrigin = (
    i64,
    Option<Vec<String>>,
    Option<String>,
    Option<i64>,
    Option<String>,
);

/// The statement that writes a group commit's rows: the log rows, the
/// session records, the chats, the client owners, the host's last seq
/// (`$1`–`$24`) and the search documents ([`upsert_docs`], from `$25`), in
/// one round trip. Its parts cannot see each other's rows, and need not:
/// no table here reads another.
static COMMIT_ROWS: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    format!(
        "WITH d AS ({}), {}",
        upsert_docs(25, false),
        "l AS (INSERT INTO log (seq, channel, session_id, action, client_id, client_seq, \
                                origin_scope, at_ms) \
             SELECT r.*, $8 FROM UNNEST($1::bigint[], $2::text[], $3::text[], $4::text[], \
                 $5::text[], $6::bigint[], $7::text[]) AS r), \
         s AS (INSERT INTO sessions (id, project, provider, title, state, turns, resumable, \
                                     last_seq, created_ms, projection, updated_ms) \
             SELECT r.*, $8 FROM UNNEST($9::text[], $10::text[], $11::text[], $12::text[], \
                 $13::text[], $14::bigint[], $15::boolean[], $16::bigint[], $17::bigint[], \
                 $18::text[]) AS r \
             ON CONFLICT (id) DO UPDATE SET project = excluded.project, \
                 provider = excluded.provider, title = excluded.title, state = excluded.state, \
                 turns = excluded.turns, resumable = excluded.resumable, \
                 last_seq = excluded.last_seq, updated_ms = excluded.updated_ms, \
                 projection = excluded.projection), \
         c AS (INSERT INTO chats (chat, session_id) \
             SELECT * FROM UNNEST($19::text[], $20::text[]) ON CONFLICT (chat) DO NOTHING), \
         o AS (INSERT INTO client_owners (session_id, client_id, sub) \
             SELECT * FROM UNNEST($21::text[], $22::text[], $23::text[]) \
             ON CONFLICT (session_id, client_id) DO UPDATE SET sub = excluded.sub) \
         UPDATE host SET last_seq = $24 WHERE id = 1"
    )
});

/// The constraint an origin the log already has violates.
const LOG_ORIGIN_INDEX: &str = "log_origin";

impl PostgresStore {
    /// Appends `batch` and writes `snapshots` in one transaction.
    pub(super) async fn append(
        &self,
        batch: Arc<Vec<NewEnvelope>>,
        snapshots: Vec<Snapshot>,
    ) -> Result<Vec<Appended>, StoreError> {
        let (batch, snapshots) = (batch.as_slice(), snapshots.as_slice());
        let mut probe = self.probing.next();
        // At most twice: `Probe::Everything` never leaves an origin to the
        // index.
        loop {
            if let Some(outcomes) = self.append_with(batch, snapshots, probe).await? {
                return Ok(outcomes);
            }
            probe = self.probing.met_a_duplicate();
        }
    }

    /// One attempt at a group commit; `None` when `probe` left an origin
    /// the log already had to its unique index (nothing was written).
    async fn append_with(
        &self,
        batch: &[NewEnvelope],
        snapshots: &[Snapshot],
        probe: Probe,
    ) -> Result<Option<Vec<Appended>>, StoreError> {
        // The host lock makes the origin check and the inserts race-free.
        let mut tx = self.pool.begin_with(BEGIN_LOCKED).await?;
        let at_ms = now_ms();
        // Only a host of a cluster checks leases (`fenced` stays empty).
        let leased = if self.fencing.load(Ordering::Acquire) {
            sessions_of(batch)
        } else {
            Vec::new()
        };
        let probed =
            Self::probe(&mut tx, &plan::origins(batch), &leased, &self.host, probe).await?;
        let plan = plan::plan(batch, probed.last, &probed.existing, &probed.fenced);
        if !plan.rows.is_empty() {
            let docs: Vec<(&str, i64, i64, &SearchDoc)> = plan
                .docs
                .iter()
                .map(|d| (d.session_id, d.seq, at_ms, d.doc))
                .collect();
            // One statement, one round trip ([`COMMIT_ROWS`]).
            let rows = &plan.rows;
            let column =
                |f: for<'r> fn(&'r plan::LogRow<'r>) -> Option<&'r str>| -> Vec<Option<&str>> {
                    rows.iter().map(f).collect()
                };
            let records = &plan.sessions;
            let text = |f: fn(&SessionRecord) -> Option<&str>| -> Vec<Option<&str>> {
                records.iter().map(|(r, _)| f(r)).collect()
            };
            let written = sqlx::query(AssertSqlSafe(COMMIT_ROWS.as_str()))
                .bind(rows.iter().map(|r| r.seq).collect::<Vec<i64>>())
                .bind(column(|r| Some(&r.envelope.channel)))
                .bind(column(|r| r.envelope.session_id.as_deref()))
                .bind(column(|r| Some(&r.envelope.action)))
                .bind(column(|r| {
                    r.envelope.origin.as_ref().map(|o| o.client_id.as_str())
                }))
                .bind(
                    rows.iter()
                        .map(|r| r.envelope.origin.as_ref().map(|o| seq_to_db(o.client_seq)))
                        .collect::<Vec<Option<i64>>>(),
                )
                .bind(column(|r| {
                    Some(r.envelope.origin.as_ref().map_or("", |o| &o.scope))
                }))
                .bind(at_ms)
                .bind(text(|r| Some(&r.id)))
                .bind(text(|r| Some(&r.project)))
                .bind(text(|r| Some(&r.provider)))
                .bind(text(|r| r.title.as_deref()))
                .bind(text(|r| Some(&r.state)))
                .bind(
                    records
                        .iter()
                        .map(|(r, _)| seq_to_db(r.turns))
                        .collect::<Vec<i64>>(),
                )
                .bind(
                    records
                        .iter()
                        .map(|(r, _)| r.resumable)
                        .collect::<Vec<bool>>(),
                )
                .bind(records.iter().map(|(_, seq)| *seq).collect::<Vec<i64>>())
                .bind(
                    records
                        .iter()
                        .map(|(r, _)| r.created_ms)
                        .collect::<Vec<i64>>(),
                )
                .bind(text(|r| Some(&r.projection)))
                .bind(plan.chats.iter().map(|c| c.0).collect::<Vec<&str>>())
                .bind(plan.chats.iter().map(|c| c.1).collect::<Vec<&str>>())
                .bind(plan.owners.iter().map(|o| o.0).collect::<Vec<&str>>())
                .bind(plan.owners.iter().map(|o| o.1).collect::<Vec<&str>>())
                .bind(plan.owners.iter().map(|o| o.2).collect::<Vec<&str>>())
                .bind(plan.last_seq);
            let written = bind_docs(written, &docs).execute(&mut *tx).await;
            match written {
                Err(sqlx::Error::Database(err))
                    if probe == Probe::Index && err.constraint() == Some(LOG_ORIGIN_INDEX) =>
                {
                    tx.rollback().await?;
                    return Ok(None);
                }
                written => written?,
            };
        }
        Self::archive_in(&mut tx, &plan.turns).await?;
        Self::write_usage_in(&mut tx, &plan.usage, at_ms).await?;
        for (seq, session_id, event) in &plan.events {
            Self::write_event_in(&mut tx, *seq, *session_id, at_ms, event).await?;
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
        Ok(Some(outcomes))
    }

    /// Upserts search documents `(session, seq, at_ms, doc)` inside `tx`;
    /// with `newer_only`, keeps a stored one that a later seq wrote. At most
    /// one document per key (the plan keeps the latest).
    pub(super) async fn write_docs_in(
        tx: &mut Transaction<'static, Postgres>,
        docs: &[(&str, i64, i64, &SearchDoc)],
        newer_only: bool,
    ) -> Result<(), StoreError> {
        if docs.is_empty() {
            return Ok(());
        }
        bind_docs(sqlx::query(AssertSqlSafe(upsert_docs(1, newer_only))), docs)
            .execute(&mut **tx)
            .await?;
        Ok(())
    }

    /// Writes an event to the outbox with one delivery per webhook of its
    /// project that wants it (one statement; nothing when there is none).
    pub(super) async fn write_event_in(
        tx: &mut Transaction<'static, Postgres>,
        seq: i64,
        session_id: Option<&str>,
        at_ms: i64,
        event: &OutboxEvent,
    ) -> Result<(), StoreError> {
        sqlx::query(AssertSqlSafe(format!(
            "WITH w AS (SELECT id FROM webhooks w WHERE w.project = $3 AND {}), \
                  e AS (INSERT INTO outbox (event_id, kind, project, session_id, seq, at_ms, data) \
                        SELECT $1, $2, $3, $4, $5, $6, $7 WHERE EXISTS (SELECT 1 FROM w) \
                        RETURNING event_id) \
             INSERT INTO deliveries (event_id, webhook_id, next_ms) \
             SELECT e.event_id, w.id, $6 FROM e CROSS JOIN w",
            webhooks::wants("w", "$2::text")
        )))
        .bind(OutboxEvent::id(seq, event.kind))
        .bind(event.kind)
        .bind(&event.project)
        .bind(session_id)
        .bind(seq)
        .bind(at_ms)
        .bind(&event.data)
        .execute(&mut **tx)
        .await?;
        Ok(())
    }

    /// Appends usage ledger rows `(seq, session, row)` inside `tx`.
    pub(super) async fn write_usage_in(
        tx: &mut Transaction<'static, Postgres>,
        rows: &[(i64, &str, &UsageRow)],
        at_ms: i64,
    ) -> Result<(), StoreError> {
        if rows.is_empty() {
            return Ok(());
        }
        let text =
            |f: fn(&UsageRow) -> &str| -> Vec<&str> { rows.iter().map(|r| f(r.2)).collect() };
        let int = |f: fn(&UsageRow) -> i64| -> Vec<i64> { rows.iter().map(|r| f(r.2)).collect() };
        sqlx::query(
            "INSERT INTO usage (seq, session_id, project, agent, model, sub, input_tokens, \
                                output_tokens, cost_micros, currency, at_ms) \
             SELECT r.*, $11 FROM UNNEST($1::bigint[], $2::text[], $3::text[], $4::text[], \
                 $5::text[], $6::text[], $7::bigint[], $8::bigint[], $9::bigint[], \
                 $10::text[]) AS r",
        )
        .bind(rows.iter().map(|r| r.0).collect::<Vec<i64>>())
        .bind(rows.iter().map(|r| r.1).collect::<Vec<&str>>())
        .bind(text(|u| &u.project))
        .bind(text(|u| &u.agent))
        .bind(text(|u| &u.model))
        .bind(text(|u| &u.sub))
        .bind(int(|u| u.input_tokens))
        .bind(int(|u| u.output_tokens))
        .bind(int(|u| u.cost_micros))
        .bind(text(|u| &u.currency))
        .bind(at_ms)
        .execute(&mut **tx)
        .await?;
        Ok(())
    }

    /// Writes a snapshot and prunes all but the newest few, inside `tx`.
    pub(super) async fn write_snapshot_in(
        tx: &mut Transaction<'static, Postgres>,
        snapshot: &Snapshot,
    ) -> Result<(), StoreError> {
        sqlx::query(
            "INSERT INTO snapshots (channel, seq, state, at_ms) VALUES ($1, $2, $3, $4) \
             ON CONFLICT (channel, seq) DO UPDATE SET state = excluded.state, at_ms = excluded.at_ms",
        )
        .bind(&snapshot.channel)
        .bind(seq_to_db(snapshot.seq))
        .bind(&snapshot.state)
        .bind(snapshot.at_ms)
        .execute(&mut **tx)
        .await?;
        sqlx::query(
            "DELETE FROM snapshots WHERE channel = $1 AND seq NOT IN \
                 (SELECT seq FROM snapshots WHERE channel = $1 ORDER BY seq DESC LIMIT $2)",
        )
        .bind(&snapshot.channel)
        .bind(crate::store::SNAPSHOTS_KEPT)
        .execute(&mut **tx)
        .await?;
        Ok(())
    }

    /// Upserts archived turns in one statement.
    pub(super) async fn archive_in(
        tx: &mut Transaction<'static, Postgres>,
        turns: &[&ArchivedTurn],
    ) -> Result<(), StoreError> {
        if turns.is_empty() {
            return Ok(());
        }
        let chats: Vec<&str> = turns.iter().map(|t| t.chat.as_str()).collect();
        let generations: Vec<i64> = turns.iter().map(|t| seq_to_db(t.generation)).collect();
        let ordinals: Vec<i64> = turns.iter().map(|t| seq_to_db(t.ordinal)).collect();
        let ids: Vec<&str> = turns.iter().map(|t| t.turn_id.as_str()).collect();
        let bodies: Vec<&str> = turns.iter().map(|t| t.body.as_str()).collect();
        sqlx::query(
            "INSERT INTO chat_turns (chat, generation, ordinal, turn_id, body) \
             SELECT * FROM UNNEST($1::text[], $2::bigint[], $3::bigint[], $4::text[], $5::text[]) \
             ON CONFLICT (chat, generation, ordinal) DO UPDATE \
                 SET turn_id = excluded.turn_id, body = excluded.body",
        )
        .bind(chats)
        .bind(generations)
        .bind(ordinals)
        .bind(ids)
        .bind(bodies)
        .execute(&mut **tx)
        .await?;
        Ok(())
    }

    /// The host's last issued seq, which of `leased` another host than
    /// `host` holds the lease of, and which of `origins` already have an
    /// outcome (a log row, unless `probe` leaves those to the log's index,
    /// or a recorded rejection), in one query. The caller holds the host
    /// row's lock, taken by an earlier statement, so this one sees every
    /// commit made before the lock was granted; and a lease changes hands
    /// only under that lock, so reading the leases takes no row lock.
    async fn probe(
        tx: &mut Transaction<'static, Postgres>,
        origins: &[&Origin],
        leased: &[&str],
        host: &str,
        probe: Probe,
    ) -> Result<Probed, StoreError> {
        let ids: Vec<&str> = origins.iter().map(|o| o.client_id.as_str()).collect();
        let seqs: Vec<i64> = origins.iter().map(|o| seq_to_db(o.client_seq)).collect();
        let scopes: Vec<&str> = origins.iter().map(|o| o.scope.as_str()).collect();
        // The host row and the fenced sessions (an init plan, read once),
        // joined with each origin found: one row with NULLs when none is.
        // `OFFSET 0` keeps each EXISTS a per-origin lookup in the unique
        // index. Without it the planner may turn it into a hashed subplan,
        // which reads the whole table: on a fresh database (no statistics
        // yet) the cached generic plan did so for every group commit, and
        // the probe grew with the log (3.6 ms a commit after 30,000 rows;
        // BENCHMARKS.md).
        // The probe, finding the origins (`o`) that `$found` holds for.
        macro_rules! probe {
            ($($found:expr),+) => {
                concat!(
                    "SELECT h.last_seq, (SELECT array_agg(l.session_id) FROM leases l \
                         WHERE l.session_id = ANY($4) AND l.holder <> $5), \
                         o.client_id, o.client_seq, o.scope FROM host h \
                     LEFT JOIN (SELECT o.client_id, o.client_seq, o.scope \
                         FROM UNNEST($1::text[], $2::bigint[], $3::text[]) \
                              AS o (client_id, client_seq, scope) WHERE ",
                    $($found),+,
                    ") o ON true WHERE h.id = 1"
                )
            };
        }
        macro_rules! exists_in {
            ($table:literal) => {
                concat!(
                    "EXISTS (SELECT 1 FROM ", $table, " t WHERE t.client_id = o.client_id \
                     AND t.origin_scope = o.scope AND t.client_seq = o.client_seq OFFSET 0)"
                )
            };
        }
        const EVERYTHING: &str = probe!(exists_in!("log"), " OR ", exists_in!("rejections"));
        const REJECTIONS: &str = probe!(exists_in!("rejections"));
        let sql = match probe {
            Probe::Everything => EVERYTHING,
            Probe::Index => REJECTIONS,
        };
        let mut found: Vec<HostAndOrigin> = sqlx::query_as(sql)
            .bind(ids)
            .bind(seqs)
            .bind(scopes)
            .bind(leased)
            .bind(host)
            .fetch_all(&mut **tx)
            .await?;
        let first = found.first_mut().ok_or(sqlx::Error::RowNotFound)?;
        let (last, fenced) = (first.0, first.1.take().unwrap_or_default());
        let existing = found
            .into_iter()
            .filter_map(|(_, _, client_id, seq, scope)| Some((client_id?, seq?, scope?)))
            .map(|(client_id, seq, scope)| {
                Ok(Origin {
                    client_id,
                    client_seq: seq_from_db(seq)?,
                    scope,
                })
            })
            .collect::<Result<_, StoreError>>()?;
        Ok(Probed {
            last,
            existing,
            fenced: fenced.into_iter().collect(),
        })
    }
}

/// What a group commit's probe found.
struct Probed {
    /// The host's last issued seq.
    last: i64,
    /// The batch's origins that already have an outcome.
    existing: plan::Set<Origin>,
    /// The batch's sessions whose lease another host holds.
    fenced: plan::Set<String>,
}

/// The sessions `batch` writes to, each once.
fn sessions_of(batch: &[NewEnvelope]) -> Vec<&str> {
    let mut sessions: Vec<&str> = batch
        .iter()
        .filter_map(|e| e.session_id.as_deref())
        .collect();
    sessions.sort_unstable();
    sessions.dedup();
    sessions
}

/// The statement that upserts search documents from nine arrays, the
/// parameters from `$first` on ([`bind_docs`] binds them).
fn upsert_docs(first: usize, newer_only: bool) -> String {
    const TYPES: [&str; 9] = [
        "text", "text", "text", "text", "text", "bigint", "bigint", "text", "text",
    ];
    let arrays: Vec<String> = (first..)
        .zip(TYPES)
        .map(|(n, ty)| format!("${n}::{ty}[]"))
        .collect();
    format!(
        "INSERT INTO search_docs (session_id, key, chat, turn_id, kind, seq, at_ms, body, words) \
         SELECT r.s, r.k, r.c, r.t, r.kind, r.seq, r.at, r.body, to_tsvector('simple', r.w) \
         FROM UNNEST({}) AS r (s, k, c, t, kind, seq, at, body, w) {}",
        arrays.join(", "),
        search::doc_conflict(newer_only)
    )
}

/// Binds the nine arrays of [`upsert_docs`] for `docs`, `(session, seq,
/// at_ms, doc)`.
fn bind_docs<'q>(
    query: sqlx::query::Query<'q, Postgres, sqlx::postgres::PgArguments>,
    docs: &[(&'q str, i64, i64, &'q SearchDoc)],
) -> sqlx::query::Query<'q, Postgres, sqlx::postgres::PgArguments> {
    let text = |f: fn(&SearchDoc) -> Option<&str>| -> Vec<Option<&'q str>> {
        docs.iter().map(|d| f(d.3)).collect()
    };
    query
        .bind(docs.iter().map(|d| d.0).collect::<Vec<&str>>())
        .bind(text(|d| Some(&d.key)))
        .bind(text(|d| d.chat.as_deref()))
        .bind(text(|d| d.turn_id.as_deref()))
        .bind(text(|d| Some(d.kind)))
        .bind(docs.iter().map(|d| d.1).collect::<Vec<i64>>())
        .bind(docs.iter().map(|d| d.2).collect::<Vec<i64>>())
        .bind(text(|d| Some(&d.text)))
        .bind(
            docs.iter()
                .map(|d| tether_protocol::search::normalized(&d.3.text))
                .collect::<Vec<String>>(),
        )
}
