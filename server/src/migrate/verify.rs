//! Checking the copy: every table row for row, the host row, the highest
//! seq, and the read model against a fresh fold of the copied log.

use futures_util::{StreamExt, TryStreamExt};
use serde_json::Value;

use super::MigrateError;
use super::copy::Meter;
use super::source::{Host, Source};
use super::tables::{Cell, TABLES, Table};
use super::target::Target;
use crate::engine::rebuild::{load_model, record_of};
use crate::engine::rfc3339;
use crate::store::{PostgresStore, SessionFilter, SessionRecord, SessionRow, Store, StoreOptions};

/// Sessions folded at once, each a task of its own: the fold is CPU work
/// on the runtime's worker threads (beside the row comparison) and its
/// reads wait on Postgres, so a few in flight keep every core busy.
const FOLD_CONCURRENCY: usize = 4;

/// Mismatches listed at most; a broken copy usually breaks many rows alike.
const MAX_LISTED: usize = 20;

/// What was checked.
#[derive(Debug, Clone, Default)]
pub(super) struct Verified {
    /// Rows per table, equal on both sides.
    pub counts: Vec<(&'static str, i64)>,
    /// The highest seq, equal on both sides.
    pub max_seq: i64,
    /// Sessions whose copied read-model row equals a fold of the copied log.
    pub sessions: usize,
}

/// Compares the source and the target; `Err(Mismatch)` lists what differs.
pub(super) async fn verify(
    source: &Source,
    target: &Target,
    host: &Host,
    options: &StoreOptions,
) -> Result<Verified, MigrateError> {
    let mut problems = Vec::new();
    let mut verified = Verified::default();
    let mut comparable = Vec::new();
    for table in TABLES {
        let (theirs, ours) = (source.count(table).await?, target.count(table).await?);
        if theirs == ours {
            comparable.push((table, ours));
            verified.counts.push((table.name, ours));
        } else {
            problems.push(format!(
                "{}: {theirs} rows in the source, {ours} in the target",
                table.name
            ));
        }
    }
    let (theirs, ours) = (source.max_seq().await?, target.max_seq().await?);
    if theirs != ours {
        problems.push(format!(
            "highest seq: {theirs} in the source, {ours} in the target"
        ));
    }
    verified.max_seq = ours;
    match target.host().await? {
        Some(h) if h == *host => {}
        Some(h) => problems.push(format!(
            "host row: epoch {} last seq {} in the source, epoch {} last seq {} in the target",
            host.epoch, host.last_seq, h.epoch, h.last_seq
        )),
        None => problems.push("host row: missing in the target".into()),
    }
    let sessions_total = verified
        .counts
        .iter()
        .find(|(t, _)| *t == "sessions")
        .map_or(0, |(_, n)| *n);
    // Row by row and the fold at once: the comparison mostly waits on the
    // two databases, the fold is mostly this process's CPU.
    let compare = async {
        let mut found = Vec::new();
        for (table, rows) in comparable {
            let mut meter = Meter::new(format!("verify {}", table.name), "rows", rows, 0);
            let problem = compare_rows(source, target, table, &mut meter).await?;
            meter.finish();
            found.extend(problem);
        }
        Ok::<_, MigrateError>(found)
    };
    let (compared, folded) = tokio::join!(compare, fold_sessions(target, options, sessions_total));
    problems.extend(compared?);
    let (sessions, differing) = folded?;
    verified.sessions = sessions;
    problems.extend(differing);
    if problems.is_empty() {
        Ok(verified)
    } else {
        Err(MigrateError::Mismatch(problems))
    }
}

/// Streams both sides in key order and compares them row by row; the first
/// differing row, if any.
async fn compare_rows(
    source: &Source,
    target: &Target,
    table: &'static Table,
    meter: &mut Meter,
) -> Result<Option<String>, MigrateError> {
    let theirs = source.rows_after(table, None);
    let ours = target.rows(table);
    futures_util::pin_mut!(theirs, ours);
    loop {
        let (a, b) = tokio::join!(theirs.try_next(), ours.try_next());
        let a = a.map_err(MigrateError::source_db)?;
        let b = b.map_err(|e| MigrateError::Target(format!("reading {}: {e}", table.name)))?;
        match (a, b) {
            (None, None) => return Ok(None),
            (Some(a), Some(b)) if a == b => meter.add(1),
            (Some(a), Some(b)) => {
                let key = show_key(table, &a);
                let column = table
                    .columns
                    .iter()
                    .zip(a.iter().zip(&b))
                    .find(|(_, (x, y))| x != y)
                    .map(|(c, (x, y))| {
                        format!(
                            "{} is {} in the source, {} in the target",
                            c.name,
                            x.show(),
                            y.show()
                        )
                    })
                    .unwrap_or_default();
                return Ok(Some(format!(
                    "{}: the row at key {key} differs: {column}",
                    table.name
                )));
            }
            (Some(a), None) => {
                return Ok(Some(format!(
                    "{}: the target lacks the row at key {}",
                    table.name,
                    show_key(table, &a)
                )));
            }
            (None, Some(b)) => {
                return Ok(Some(format!(
                    "{}: the target has a row the source lacks, at key {}",
                    table.name,
                    show_key(table, &b)
                )));
            }
        }
    }
}

fn show_key(table: &Table, row: &[Cell]) -> String {
    let parts: Vec<String> = table.key.iter().map(|&i| row[i].show()).collect();
    format!("({})", parts.join(", "))
}

/// Folds every session's copied transcript and compares the result with
/// its copied read-model row. Returns the sessions checked and a line per
/// difference.
async fn fold_sessions(
    target: &Target,
    options: &StoreOptions,
    total: i64,
) -> Result<(usize, Vec<String>), MigrateError> {
    let store = PostgresStore::open(target.url(), options)
        .await
        .map_err(|e| MigrateError::Target(e.to_string()))?;
    let mut meter = Meter::new("verify the read model by folding", "sessions", total, 0);
    let result = fold_all(&store, &mut meter).await;
    meter.finish();
    store.close().await;
    result
}

async fn fold_all(
    store: &PostgresStore,
    meter: &mut Meter,
) -> Result<(usize, Vec<String>), MigrateError> {
    let mut checked = 0;
    let mut problems = Vec::new();
    let mut before = None;
    loop {
        let page = store
            .sessions(&SessionFilter::default(), before, 500)
            .await
            .map_err(|e| MigrateError::Target(e.to_string()))?;
        let mut found = Vec::with_capacity(page.items.len());
        let mut folds = futures_util::stream::iter(page.items.iter().cloned())
            .map(|row| {
                let store = store.clone();
                tokio::spawn(async move { fold_one(&store, &row).await })
            })
            .buffer_unordered(FOLD_CONCURRENCY);
        while let Some(joined) = folds.next().await {
            let problem =
                joined.map_err(|e| MigrateError::Target(format!("a fold task failed: {e}")))??;
            found.push(problem);
            meter.add(1);
        }
        checked += page.items.len();
        problems.extend(found.into_iter().flatten());
        if problems.len() > MAX_LISTED {
            let shown: Vec<String> = problems.drain(..MAX_LISTED).collect();
            return Ok((checked, shown));
        }
        match page.next_before {
            Some(next) => before = Some(next),
            None => return Ok((checked, problems)),
        }
    }
}

/// One session: `None` when its row equals the fold.
async fn fold_one(store: &PostgresStore, row: &SessionRow) -> Result<Option<String>, MigrateError> {
    let id = &row.record.id;
    let model = load_model(store, id, false)
        .await
        .map_err(|e| MigrateError::Target(format!("folding session {id}: {e}")))?;
    let Some(model) = model else {
        return Ok(Some(format!(
            "session {id}: a read-model row but no transcript"
        )));
    };
    // Whether an agent was attached is not in the log: a row the server
    // left `live` is compared with the live fold, every other row with the
    // settled one (its state comes from the settling records).
    let live = row.record.state == "live";
    let fresh = record_of(&model, live, &rfc3339(row.updated_ms));
    let differs = differing_fields(&fresh, &row.record);
    Ok((!differs.is_empty()).then(|| {
        format!(
            "session {id}: the copied read-model row differs from a fold of the copied log in {}",
            differs.join(", ")
        )
    }))
}

/// The fields in which two rows differ, compared as `tether
/// rebuild-projections` compares them: the projection as JSON without
/// `lastSeq` and `updatedAt`, which readers take from the row's columns.
fn differing_fields(a: &SessionRecord, b: &SessionRecord) -> Vec<&'static str> {
    let view = |text: &str| {
        let mut view = serde_json::from_str::<Value>(text).ok()?;
        if let Some(map) = view.as_object_mut() {
            map.remove("lastSeq");
            map.remove("updatedAt");
        }
        Some(view)
    };
    let mut differs = Vec::new();
    if a.project != b.project {
        differs.push("project");
    }
    if a.provider != b.provider {
        differs.push("provider");
    }
    if a.title != b.title {
        differs.push("title");
    }
    if a.state != b.state {
        differs.push("state");
    }
    if a.turns != b.turns {
        differs.push("turns");
    }
    if a.resumable != b.resumable {
        differs.push("resumable");
    }
    if view(&a.projection) != view(&b.projection) {
        differs.push("projection");
    }
    differs
}
