//! Copying one table: the source streams rows in key order, batches go to
//! Postgres as one `UNNEST` insert each, and the next batch is read while
//! the previous one is written.

use std::io::Write;
use std::time::{Duration, Instant};

use futures_util::TryStreamExt;
use tokio::sync::mpsc;

use super::MigrateError;
use super::source::Source;
use super::tables::Table;
use super::target::{Batch, Target};

/// Bytes of text one batch holds at most, whatever its row count: snapshot
/// states and projections can be large, and a batch lives in memory three
/// times over (being read, queued, being written).
const MAX_BATCH_BYTES: usize = 8 * 1024 * 1024;

/// Batches read ahead of the writer: one queued is enough to keep both
/// sides busy; more would only hold memory.
const READ_AHEAD: usize = 1;

/// How often a progress line is printed at most.
const PROGRESS_EVERY: Duration = Duration::from_secs(1);

/// Copies what is left of `table`, resuming after the last committed
/// batch; returns the rows this run wrote.
pub(super) async fn copy_table(
    source: &Source,
    target: &Target,
    table: &'static Table,
    batch_rows: usize,
) -> Result<i64, MigrateError> {
    let progress = target.progress(table.name).await?;
    if progress.done {
        return Ok(0);
    }
    let total = source.count(table).await?;
    if progress.rows > 0 {
        note(&format!(
            "{}: resuming after {} of {total} rows copied by an earlier run",
            table.name, progress.rows
        ));
    }
    let mut meter = Meter::new(table.name, "rows", total, progress.rows);
    let (sender, mut receiver) = mpsc::channel::<Batch>(READ_AHEAD);
    let after = progress.last_key.clone();
    let read = async move {
        let rows = source.rows_after(table, after.as_deref());
        futures_util::pin_mut!(rows);
        let mut batch = Batch::new(table, batch_rows);
        while let Some(row) = rows.try_next().await.map_err(MigrateError::source_db)? {
            batch
                .push(table, row)
                .map_err(|reason| MigrateError::Source(format!("{}: {reason}", table.name)))?;
            if batch.rows >= batch_rows || batch.bytes >= MAX_BATCH_BYTES {
                let full = std::mem::replace(&mut batch, Batch::new(table, batch_rows));
                if sender.send(full).await.is_err() {
                    // The writer stopped; its error is the one reported.
                    return Ok(());
                }
            }
        }
        if batch.rows > 0 {
            let _ = sender.send(batch).await;
        }
        Ok::<(), MigrateError>(())
    };
    let start = progress.rows;
    // Moves the receiver in: when the writer fails, the receiver drops with
    // it and the reader's next send returns instead of waiting forever.
    let write = async move {
        let mut rows = start;
        while let Some(batch) = receiver.recv().await {
            let n = batch.rows as i64;
            target.write(table, batch, rows + n).await?;
            rows += n;
            meter.add(n);
        }
        Ok::<_, MigrateError>((rows, meter))
    };
    let (read, write) = tokio::join!(read, write);
    let (rows, meter) = write?;
    read?;
    target.done(table.name).await?;
    meter.finish();
    Ok(rows - start)
}

/// Progress lines on stderr, at most one a second, for one table (or the
/// sessions being folded).
pub(super) struct Meter {
    label: String,
    unit: &'static str,
    total: i64,
    done: i64,
    this_run: i64,
    started: Instant,
    printed: Instant,
}

impl Meter {
    /// Counts `unit`s of `label` up to `total`, `already` of them done.
    pub(super) fn new(
        label: impl Into<String>,
        unit: &'static str,
        total: i64,
        already: i64,
    ) -> Self {
        let now = Instant::now();
        Self {
            label: label.into(),
            unit,
            total,
            done: already,
            this_run: 0,
            started: now,
            printed: now,
        }
    }

    fn rate(&self) -> f64 {
        self.this_run as f64 / self.started.elapsed().as_secs_f64().max(1e-3)
    }

    /// Counts `n` more, printing a line if the last one is a second old.
    pub(super) fn add(&mut self, n: i64) {
        self.done += n;
        self.this_run += n;
        if self.printed.elapsed() >= PROGRESS_EVERY {
            self.printed = Instant::now();
            let percent = if self.total > 0 {
                self.done as f64 * 100.0 / self.total as f64
            } else {
                100.0
            };
            note(&format!(
                "{}: {}/{} {} ({percent:.0}%), {:.0} {}/s",
                self.label,
                self.done,
                self.total,
                self.unit,
                self.rate(),
                self.unit
            ));
        }
    }

    /// The closing line.
    pub(super) fn finish(&self) {
        let earlier = if self.this_run == self.done {
            String::new()
        } else {
            format!(" ({} this run)", self.this_run)
        };
        note(&format!(
            "{}: {} {}{earlier} in {:.1} s, {:.0} {}/s",
            self.label,
            self.done,
            self.unit,
            self.started.elapsed().as_secs_f64(),
            self.rate(),
            self.unit
        ));
    }
}

/// One progress line on stderr.
pub(super) fn note(line: &str) {
    let _ = writeln!(std::io::stderr().lock(), "tether migrate: {line}");
}
