//! The SQLite writer: one thread owns the database's one write connection
//! and runs every write, whole, as a job.
//!
//! A job is a closure that runs on that thread from its first statement to
//! its commit. The async side hands it over and awaits one answer, so a
//! group commit costs one hop between tokio and the writer, not one per
//! statement (with sqlx's per-statement hops, each statement waited for a
//! busy tokio worker to pick its answer up). Statements are prepared once
//! and cached on the connection.
//!
//! The writer never checkpoints the WAL inside a commit: the checkpointer
//! thread ([`super::checkpoint`]) does, on a connection of its own.

use std::path::Path;
use std::sync::Mutex;
use std::sync::mpsc;
use std::thread::JoinHandle;

use rusqlite::{Connection, OpenFlags, Transaction, TransactionBehavior};
use tokio::sync::oneshot;

use super::BUSY_TIMEOUT;
use super::checkpoint::{self, Checkpointer};
use super::keys::LogKeys;
use crate::store::StoreError;

type Job = Box<dyn FnOnce(&mut Connection, &mut LogKeys) + Send>;

/// The handle the store hands writes to.
#[derive(Debug)]
pub(super) struct Writer {
    jobs: Mutex<Option<mpsc::Sender<Job>>>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

/// Opens a connection to `path` with the pragmas every Tether connection
/// that writes uses: WAL, `synchronous = FULL` (an acknowledged commit
/// survives power loss) and no automatic checkpoints.
pub(super) fn connect(path: &Path) -> Result<Connection, rusqlite::Error> {
    let db = Connection::open_with_flags(
        path,
        OpenFlags::SQLITE_OPEN_READ_WRITE
            | OpenFlags::SQLITE_OPEN_CREATE
            | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )?;
    db.busy_timeout(BUSY_TIMEOUT)?;
    db.pragma_update(None, "journal_mode", "WAL")?;
    db.pragma_update(None, "synchronous", "FULL")?;
    db.pragma_update(None, "foreign_keys", true)?;
    // Checkpoints run on the checkpointer's connection, off the commit path
    // (the writer's WAL hook replaces this setting too).
    db.pragma_update(None, "wal_autocheckpoint", 0)?;
    Ok(db)
}

impl Writer {
    /// Opens the write connection and starts its thread and the
    /// checkpointer's.
    pub(super) fn start(path: &Path) -> Result<Self, StoreError> {
        let mut db = connect(path)?;
        // Each connection caches up to 32 MiB of pages (the default is
        // 2 MiB): the log's index pages stay in memory between commits.
        db.pragma_update(None, "cache_size", -32768)?;
        // A WAL that grew under load shrinks back to this once it starts over.
        db.pragma_update(None, "journal_size_limit", 64 * 1024 * 1024)?;
        // Room for the commit's statements, a search document upsert of
        // each row count (append::DOCS_PER_STATEMENT shapes) and the rest.
        db.set_prepared_statement_cache_capacity(64 + super::append::DOCS_PER_STATEMENT);
        let checkpointer = Checkpointer::start(path)?;
        let (jobs, queue) = mpsc::channel::<Job>();
        let thread = std::thread::Builder::new()
            .name("tether-sqlite-writer".into())
            .spawn(move || {
                checkpoint::track_frames(&db);
                let mut keys = LogKeys::default();
                // The WAL's size when the checkpointer was last woken.
                let mut woken_at = 0;
                while let Ok(job) = queue.recv() {
                    job(&mut db, &mut keys);
                    let frames = checkpoint::frames();
                    if frames < woken_at {
                        woken_at = 0; // the WAL started over
                    }
                    if frames - woken_at >= checkpoint::WAKE_FRAMES {
                        if frames >= checkpoint::RESET_FRAMES {
                            // Failures are the checkpointer's to report.
                            let _ = checkpoint::passive(&db);
                        } else {
                            checkpointer.wake();
                        }
                        woken_at = frames;
                    }
                }
                checkpointer.stop();
            })
            .map_err(|e| StoreError::Open {
                target: format!("SQLite database {}", path.display()),
                reason: format!("cannot start the writer thread: {e}"),
            })?;
        Ok(Self {
            jobs: Mutex::new(Some(jobs)),
            thread: Mutex::new(Some(thread)),
        })
    }

    /// Runs `write` on the writer thread inside one `BEGIN IMMEDIATE`
    /// transaction, committed when it returns `Ok` and rolled back when it
    /// returns `Err`.
    pub(super) async fn transaction<T, F>(&self, write: F) -> Result<T, StoreError>
    where
        T: Send + 'static,
        F: FnOnce(&Transaction<'_>) -> Result<T, StoreError> + Send + 'static,
    {
        self.run(move |db, _| in_transaction(db, write)).await
    }

    /// Runs `write` as [`Writer::transaction`] does, then has the writer
    /// forget the log's keys, whatever the outcome: for a write that
    /// deletes channels' or origins' names ([`LogKeys::forget`]).
    pub(super) async fn transaction_forgetting_keys<T, F>(&self, write: F) -> Result<T, StoreError>
    where
        T: Send + 'static,
        F: FnOnce(&Transaction<'_>) -> Result<T, StoreError> + Send + 'static,
    {
        self.run(move |db, keys| {
            let done = in_transaction(db, write);
            keys.forget();
            done
        })
        .await
    }

    /// Runs `write` as [`Writer::transaction`] does, with the log's keys
    /// (see [`LogKeys`]), except that when it answers `None` its
    /// transaction is rolled back and it runs again, in a new one (it is
    /// the one to make its next attempt differ).
    pub(super) async fn transaction_until<T, F>(&self, mut write: F) -> Result<T, StoreError>
    where
        T: Send + 'static,
        F: FnMut(&Transaction<'_>, &mut LogKeys) -> Result<Option<T>, StoreError> + Send + 'static,
    {
        self.run(move |db, keys| {
            loop {
                keys.begin();
                let tx = db.transaction_with_behavior(TransactionBehavior::Immediate)?;
                if let Some(value) = write(&tx, keys)? {
                    tx.commit()?;
                    keys.settle();
                    return Ok(value);
                }
                tx.rollback()?;
            }
        })
        .await
    }

    /// Runs `job` on the writer thread and returns its answer.
    async fn run<T, F>(&self, job: F) -> Result<T, StoreError>
    where
        T: Send + 'static,
        F: FnOnce(&mut Connection, &mut LogKeys) -> Result<T, StoreError> + Send + 'static,
    {
        let (answer, answered) = oneshot::channel();
        let sent = self
            .jobs
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
            .map(|jobs| {
                jobs.send(Box::new(move |db: &mut Connection, keys: &mut LogKeys| {
                    let _ = answer.send(job(db, keys));
                }))
            });
        match sent {
            Some(Ok(())) => answered.await.map_err(|_| stopped())?,
            _ => Err(stopped()),
        }
    }

    /// Lets the writer finish the jobs it has, then stops it (and the
    /// checkpointer, which checkpoints once more) and closes its connection.
    pub(super) async fn close(&self) {
        drop(self.jobs.lock().unwrap_or_else(|e| e.into_inner()).take());
        let thread = self.thread.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(thread) = thread {
            let _ = tokio::task::spawn_blocking(move || thread.join()).await;
        }
    }
}

/// Runs `write` in one `BEGIN IMMEDIATE` transaction, committed when it
/// returns `Ok` and rolled back (dropped) when it returns `Err`.
fn in_transaction<T>(
    db: &mut Connection,
    write: impl FnOnce(&Transaction<'_>) -> Result<T, StoreError>,
) -> Result<T, StoreError> {
    let tx = db.transaction_with_behavior(TransactionBehavior::Immediate)?;
    let value = write(&tx)?;
    tx.commit()?;
    Ok(value)
}

fn stopped() -> StoreError {
    StoreError::Open {
        target: "the SQLite writer".into(),
        reason: "it has stopped (the store is closing)".into(),
    }
}
