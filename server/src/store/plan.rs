//! How a batch of envelopes is written, decided once for both backends.
//!
//! The plan decides, from the batch, the host's `last_seq`, the origins the
//! store already has and the fenced sessions, which envelope gets which seq
//! and which rows are written; each backend then writes it its own way.
//! Postgres sends a constant number of statements per batch, a network
//! round trip each: the `BEGIN` that takes the host lock, one query for the
//! last seq and the known origins (the log's unique index decides most of
//! them: `postgres::append`), one statement of `UNNEST` inserts for the
//! log, the sessions, the chats, the owners and the host's last seq, and
//! the `COMMIT`; one more each for what a batch may also carry (search
//! documents, turns, usage, events, snapshots, a cluster's lease fence).
//! SQLite runs the whole batch on its writer thread with prepared
//! statements, one row at a time, where a statement costs no hop.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU32, Ordering};

/// The sets and maps of a commit's plan: keyed by origins and session ids
/// from clients, hashed with foldhash (SipHash cost ~2 % of the writer's
/// time).
pub type Set<T> = HashSet<T, foldhash::fast::RandomState>;
/// See [`Set`].
pub type Map<K, V> = HashMap<K, V, foldhash::fast::RandomState>;

use super::search::{DocRow, latest_docs};
use super::usage::UsageRow;
use super::webhooks::OutboxEvent;
use super::{
    Appended, ArchivedTurn, NewEnvelope, Origin, OriginOutcome, SessionRecord, StoreError, rows,
};

/// How a group commit finds the origins of its batch that already have
/// an outcome (DESIGN.md: an origin is accepted once). Both backends start
/// with [`Probe::Index`] ([`Probing`] says when not).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Probe {
    /// Look each origin up in the log and in the rejections first.
    Everything,
    /// Let the log's unique origin index decide, and look the rejections
    /// up only: an origin the log has fails the attempt, which is rolled
    /// back and made again with [`Probe::Everything`]. A probe of the log
    /// costs as much as the index insert it duplicates (a descent into the
    /// largest index), and retries reach the store rarely: the engine
    /// answers those it knows.
    Index,
}

/// After a group commit met an origin the log already had, this many
/// commits probe every origin first ([`Probe::Everything`]): a client that
/// keeps retrying costs at most one wasted attempt in this many.
const PROBES_AFTER_A_DUPLICATE: u32 = 64;

/// A store's choice of [`Probe`] for each group commit: the index, but
/// every origin probed for [`PROBES_AFTER_A_DUPLICATE`] commits after one
/// met an origin the log already had.
#[derive(Debug, Default)]
pub struct Probing(AtomicU32);

impl Probing {
    /// The probe for the next attempt of a commit.
    pub fn next(&self) -> Probe {
        match self
            .0
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1))
        {
            Ok(_) => Probe::Everything,
            Err(_) => Probe::Index,
        }
    }

    /// An attempt with [`Probe::Index`] met an origin the log already had
    /// (and was undone): it and the next commits probe every origin.
    pub fn met_a_duplicate(&self) -> Probe {
        self.0.store(PROBES_AFTER_A_DUPLICATE, Ordering::Release);
        Probe::Everything
    }
}

/// One row for the log.
#[derive(Debug)]
pub struct LogRow<'a> {
    /// Its `serverSeq`.
    pub seq: i64,
    /// The envelope.
    pub envelope: &'a NewEnvelope,
}

/// What becomes of each envelope of the batch, in batch order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Slot {
    /// Written with this seq.
    Committed(i64),
    /// Its origin already has an outcome (in the store, or earlier in this
    /// batch); nothing is written for it.
    Duplicate,
    /// Its session's lease is another host's; nothing is written for it.
    Fenced,
}

/// The writes a batch makes.
#[derive(Debug)]
pub struct Plan<'a> {
    /// Fresh log rows, in seq order.
    pub rows: Vec<LogRow<'a>>,
    /// Read-model rows to write: each changed session's latest record, with
    /// the seq of its latest fresh envelope in the batch.
    pub sessions: Vec<(&'a SessionRecord, i64)>,
    /// Chats to record: (chat URI, owning session).
    pub chats: Vec<(&'a str, &'a str)>,
    /// Client owners to record: (session, clientId, sub).
    pub owners: Vec<(&'a str, &'a str, &'a str)>,
    /// Turns to archive, from the fresh envelopes.
    pub turns: Vec<&'a ArchivedTurn>,
    /// Search documents to write, the latest per key.
    pub docs: Vec<DocRow<'a>>,
    /// Usage ledger rows: (seq, session, row).
    pub usage: Vec<(i64, &'a str, &'a UsageRow)>,
    /// Notification events: (seq, session, event).
    pub events: Vec<(i64, Option<&'a str>, &'a OutboxEvent)>,
    /// One per envelope.
    pub slots: Vec<Slot>,
    /// The host's `last_seq` after the batch.
    pub last_seq: i64,
}

/// The origins of a batch, for the query that finds which ones the store
/// already has.
pub fn origins(batch: &[NewEnvelope]) -> Vec<&Origin> {
    batch.iter().filter_map(|e| e.origin.as_ref()).collect()
}

/// Plans `batch` on top of `last_seq`, given the origins the store already
/// has (`existing`) and the sessions whose lease another host holds
/// (`fenced`).
///
/// A session's record rides on the last envelope of its actor's batch. When
/// that envelope turns out to be a duplicate, the record still describes the
/// session after the batch, so it is written with the session's latest fresh
/// envelope instead of being dropped.
pub fn plan<'a>(
    batch: &'a [NewEnvelope],
    last_seq: i64,
    existing: &Set<Origin>,
    fenced: &Set<String>,
) -> Plan<'a> {
    let mut rows = Vec::with_capacity(batch.len());
    let mut slots = Vec::with_capacity(batch.len());
    let mut chats = Vec::new();
    // The latest owner per (session, client): a statement may write each
    // key once.
    let mut owners = Map::default();
    let mut turns = Vec::new();
    let mut taken: Set<&Origin> = Set::default();
    // Session id → its latest fresh seq in this batch, and its latest record.
    let mut latest_seq: Map<&str, i64> = Map::default();
    let mut records: Map<&str, &SessionRecord> = Map::default();
    let mut next = last_seq;
    for envelope in batch {
        if envelope
            .session_id
            .as_ref()
            .is_some_and(|id| fenced.contains(id))
        {
            slots.push(Slot::Fenced);
            continue;
        }
        if let Some(record) = &envelope.session {
            records.insert(&record.id, record);
        }
        if let Some(origin) = &envelope.origin
            && (existing.contains(origin) || !taken.insert(origin))
        {
            slots.push(Slot::Duplicate);
            continue;
        }
        next += 1;
        rows.push(LogRow {
            seq: next,
            envelope,
        });
        slots.push(Slot::Committed(next));
        turns.extend(envelope.turns.iter());
        if let Some(session_id) = &envelope.session_id {
            latest_seq.insert(session_id, next);
            chats.extend(
                envelope
                    .chats
                    .iter()
                    .map(|c| (c.as_str(), session_id.as_str())),
            );
            if let Some((client_id, sub)) = &envelope.owner {
                owners.insert((session_id.as_str(), client_id.as_str()), sub.as_str());
            }
        }
    }
    let turns = latest_turns(turns.into_iter());
    let mut sessions: Vec<(&SessionRecord, i64)> = records
        .into_values()
        .filter_map(|record| Some((record, *latest_seq.get(record.id.as_str())?)))
        .collect();
    sessions.sort_by_key(|(_, seq)| *seq);
    let docs = latest_docs(&rows);
    let usage = rows
        .iter()
        .filter_map(|r| {
            let e = r.envelope;
            Some((r.seq, e.session_id.as_deref()?, e.usage.as_ref()?))
        })
        .collect();
    let events = rows
        .iter()
        .flat_map(|r| {
            let session = r.envelope.session_id.as_deref();
            r.envelope.events.iter().map(move |e| (r.seq, session, e))
        })
        .collect();
    Plan {
        docs,
        usage,
        events,
        rows,
        sessions,
        chats,
        owners: owners
            .into_iter()
            .map(|((session, client), sub)| (session, client, sub))
            .collect(),
        turns,
        slots,
        last_seq: next,
    }
}

/// One row per archive key, the latest, in order: a chat truncated into
/// its archive and grown again archives the same ordinal twice, and
/// Postgres refuses an upsert that touches one row twice.
pub fn latest_turns<'a>(
    turns: impl DoubleEndedIterator<Item = &'a ArchivedTurn>,
) -> Vec<&'a ArchivedTurn> {
    let mut seen = Set::default();
    let mut latest: Vec<&ArchivedTurn> = turns
        .rev()
        .filter(|t| seen.insert((t.chat.as_str(), t.generation, t.ordinal)))
        .collect();
    latest.reverse();
    latest
}

/// The origins of the batch's duplicates, in batch order: the store looks
/// each one's outcome up (inside the append's transaction, so a duplicate of
/// an envelope earlier in the batch finds that one) for [`outcomes`].
pub fn duplicates<'a>(plan: &Plan<'_>, batch: &'a [NewEnvelope]) -> Vec<&'a Origin> {
    plan.slots
        .iter()
        .zip(batch)
        .filter(|(slot, _)| **slot == Slot::Duplicate)
        .filter_map(|(_, envelope)| envelope.origin.as_ref())
        .collect()
}

/// Each envelope's outcome once the plan is written: committed ones with
/// their seq, duplicates with the outcomes found for [`duplicates`], in order.
pub fn outcomes(
    plan: &Plan<'_>,
    at_ms: i64,
    found: Vec<Option<OriginOutcome>>,
) -> Result<Vec<Appended>, StoreError> {
    let mut found = found.into_iter();
    plan.slots
        .iter()
        .map(|slot| match slot {
            Slot::Committed(seq) => Ok(Appended::Committed {
                seq: rows::seq(*seq)?,
                at_ms,
            }),
            Slot::Fenced => Ok(Appended::Fenced),
            Slot::Duplicate => found
                .next()
                .flatten()
                .map(Appended::Duplicate)
                .ok_or_else(|| {
                    StoreError::Corrupt("origin conflict without a recorded outcome".into())
                }),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn envelope(origin: Option<(&str, u64)>, session: Option<&str>) -> NewEnvelope {
        NewEnvelope {
            channel: "ahp-session:/s".into(),
            session_id: Some("s".into()),
            action: "{}".into(),
            origin: origin.map(|(id, seq)| Origin::durable(id, seq)),
            session: session.map(|title| SessionRecord {
                id: "s".into(),
                project: "p".into(),
                provider: "echo".into(),
                title: Some(title.into()),
                state: "live".into(),
                turns: 0,
                resumable: true,
                created_ms: 0,
                projection: "{}".into(),
            }),
            chats: Vec::new(),
            turns: Vec::new(),
            directed: None,
            owner: None,
            search: Vec::new(),
            usage: None,
            events: Vec::new(),
        }
    }

    #[test]
    fn duplicates_take_no_seq_and_the_record_moves_to_the_last_fresh_envelope() {
        let batch = vec![
            envelope(Some(("a", 1)), None),
            envelope(None, None),
            envelope(Some(("a", 1)), None), // repeated within the batch
            envelope(Some(("a", 2)), Some("after the batch")), // already stored
        ];
        let existing = Set::from_iter([Origin::durable("a", 2)]);
        let plan = plan(&batch, 10, &existing, &Set::default());
        assert_eq!(
            plan.slots,
            [
                Slot::Committed(11),
                Slot::Committed(12),
                Slot::Duplicate,
                Slot::Duplicate
            ]
        );
        assert_eq!(plan.rows.len(), 2);
        assert_eq!(plan.last_seq, 12);
        assert_eq!(plan.sessions.len(), 1);
        assert_eq!(plan.sessions[0].1, 12, "written with the latest fresh seq");
        assert_eq!(plan.sessions[0].0.title.as_deref(), Some("after the batch"));
    }

    #[test]
    fn a_fenced_session_writes_nothing_and_takes_no_seq() {
        let mut other = envelope(Some(("b", 1)), Some("other"));
        other.session_id = Some("t".into());
        if let Some(record) = &mut other.session {
            record.id = "t".into();
        }
        let batch = vec![
            envelope(Some(("a", 1)), Some("fenced")),
            other,
            envelope(None, None),
        ];
        let plan = plan(
            &batch,
            3,
            &Set::default(),
            &Set::from_iter(["s".to_owned()]),
        );
        assert_eq!(plan.slots, [Slot::Fenced, Slot::Committed(4), Slot::Fenced]);
        assert_eq!(plan.rows.len(), 1);
        assert_eq!(plan.last_seq, 4);
        assert_eq!(plan.sessions.len(), 1, "only the unfenced session's row");
        assert_eq!(plan.sessions[0].0.id, "t");
    }

    #[test]
    fn a_batch_of_only_duplicates_writes_nothing() {
        let batch = vec![envelope(Some(("a", 1)), Some("t"))];
        let plan = plan(
            &batch,
            5,
            &Set::from_iter([Origin::durable("a", 1)]),
            &Set::default(),
        );
        assert!(plan.rows.is_empty() && plan.sessions.is_empty());
        assert_eq!(plan.last_seq, 5);
    }
}
