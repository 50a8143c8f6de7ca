//! Pages of the log, read on threads of their own through connections of
//! rusqlite's own: a page of a thousand rows crosses threads once. sqlx's
//! SQLite driver hands every row from its worker thread to the async side,
//! and a catch-up spent most of its time in those hand-offs (see
//! BENCHMARKS.md, "Catch-up").
//!
//! The threads are this store's, at most `readers` of them, each keeping
//! its connection: tokio's blocking pool started a thread for a read
//! whenever none had yet gone back idle, and 10,000 subscribers arriving at
//! once left some thirty threads, each with its allocator's pages, where
//! eight read at a time (BENCHMARKS.md, "Idle subscribers on SQLite").

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, mpsc};

use rusqlite::{Connection, OpenFlags};
use tokio::sync::oneshot;

use super::BUSY_TIMEOUT;
use crate::store::{Origin, StoreError, StoredEnvelope, clamp_limit, seq_from_db, seq_to_db};

/// A read for a reader thread, given the thread's connection (opened on
/// its first read, dropped after a read that failed).
type Job = Box<dyn FnOnce(&mut Option<Connection>) + Send>;

/// The reader threads of one database and the reads waiting for them.
#[derive(Debug)]
pub(super) struct Pages {
    path: PathBuf,
    /// Where reads wait; the threads end when it is dropped with the store.
    jobs: mpsc::Sender<Job>,
    /// What the threads take reads from, one thread at a time.
    queue: Arc<Mutex<mpsc::Receiver<Job>>>,
    /// Threads started, at most `readers`.
    threads: AtomicUsize,
    /// Threads not reading now (waiting for a read).
    idle: Arc<AtomicUsize>,
    readers: usize,
}

impl Pages {
    /// Pages of the database at `path`, read by at most `readers` threads
    /// (started as reads need them).
    pub(super) fn new(path: &Path, readers: usize) -> Arc<Self> {
        let (jobs, queue) = mpsc::channel();
        Arc::new(Self {
            path: path.to_owned(),
            jobs,
            queue: Arc::new(Mutex::new(queue)),
            threads: AtomicUsize::new(0),
            idle: Arc::new(AtomicUsize::new(0)),
            readers: readers.max(1),
        })
    }

    /// Envelopes with seq above `after`, oldest first, at most `limit`;
    /// only those on `channels` when given.
    pub(super) async fn read_after(
        self: &Arc<Self>,
        after: u64,
        channels: Option<&[String]>,
        limit: u32,
        max_bytes: usize,
    ) -> Result<Vec<StoredEnvelope>, StoreError> {
        let channels = channels
            .map(serde_json::to_string)
            .transpose()
            .map_err(|e| StoreError::Corrupt(e.to_string()))?;
        let path = self.path.clone();
        let (reply, answer) = oneshot::channel();
        self.submit(Box::new(move |db| {
            // The connection goes back only after a read that worked: a
            // broken one goes.
            let page = db
                .take()
                .map_or_else(|| open(&path), Ok)
                .and_then(|connection| {
                    let page = read_page(&connection, after, channels.as_deref(), limit, max_bytes);
                    if page.is_ok() {
                        *db = Some(connection);
                    }
                    page
                });
            let _ = reply.send(page);
        }))?;
        answer
            .await
            .map_err(|_| StoreError::Corrupt("a log page read failed: its reader stopped".into()))?
    }

    /// Queues `job`, and starts a thread for it when none is waiting and
    /// fewer than `readers` run.
    fn submit(&self, job: Job) -> Result<(), StoreError> {
        self.jobs
            .send(job)
            .map_err(|_| StoreError::Corrupt("the store is closed".into()))?;
        if self.idle.load(Ordering::Acquire) > 0 {
            return Ok(());
        }
        let more = self
            .threads
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < self.readers).then_some(n + 1)
            });
        if more.is_ok() {
            let (queue, idle) = (self.queue.clone(), self.idle.clone());
            let started = std::thread::Builder::new()
                .name("tether-sqlite-r".into())
                .spawn(move || serve(&queue, &idle));
            if let Err(err) = started {
                self.threads.fetch_sub(1, Ordering::AcqRel);
                // The read waits for a thread already started, if any.
                tracing::warn!(error = %err, "cannot start a SQLite reader thread");
            }
        }
        Ok(())
    }
}

/// A reader thread: takes reads until the store is dropped. A read that
/// panics loses its connection and its answer (its caller gets an error),
/// not the thread.
fn serve(queue: &Mutex<mpsc::Receiver<Job>>, idle: &AtomicUsize) {
    let mut db = None;
    loop {
        idle.fetch_add(1, Ordering::AcqRel);
        let job = match queue.lock() {
            Ok(queue) => queue.recv(),
            Err(_) => return,
        };
        idle.fetch_sub(1, Ordering::AcqRel);
        let Ok(job) = job else { return };
        let ran = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| job(&mut db)));
        if ran.is_err() {
            db = None;
        }
    }
}

fn open(path: &Path) -> Result<Connection, StoreError> {
    let db = Connection::open_with_flags(
        path,
        OpenFlags::SQLITE_OPEN_READ_ONLY
            | OpenFlags::SQLITE_OPEN_NO_MUTEX
            | OpenFlags::SQLITE_OPEN_URI,
    )?;
    db.busy_timeout(BUSY_TIMEOUT)?;
    db.set_prepared_statement_cache_capacity(4);
    Ok(db)
}

/// The rows a page has room for before it is given a whole page's.
const FEW_ROWS: usize = 16;

fn read_page(
    db: &Connection,
    after: u64,
    channels: Option<&str>,
    limit: u32,
    max_bytes: usize,
) -> Result<Vec<StoredEnvelope>, StoreError> {
    let (after, limit) = (seq_to_db(after), clamp_limit(limit));
    // Room for a few rows first, for the whole page once a page's worth
    // comes: most reads (a subscription's bridge) find none, and a page's
    // room reserved for each of them (144 KiB) kept 3 KiB of the server's
    // RSS for every idle subscriber (BENCHMARKS.md).
    let room = usize::try_from(limit).unwrap_or(0).min(1024);
    let mut page = Vec::with_capacity(room.min(FEW_ROWS));
    let mut budget = crate::store::ByteBudget::new(max_bytes);
    // Whether the page is full (its bytes past `max_bytes`).
    let mut push = |row: &rusqlite::Row<'_>| -> Result<bool, StoreError> {
        let client_id: Option<String> = row.get(4)?;
        let client_seq: Option<i64> = row.get(5)?;
        let origin = match (client_id, client_seq) {
            (Some(client_id), Some(client_seq)) => Some(Origin {
                client_id,
                client_seq: seq_from_db(client_seq)?,
                scope: row.get(6)?,
            }),
            _ => None,
        };
        let envelope = StoredEnvelope {
            seq: seq_from_db(row.get(0)?)?,
            channel: row.get(1)?,
            session_id: row.get(2)?,
            action: row.get(3)?,
            origin,
            at_ms: row.get(7)?,
        };
        let spent = budget.spend(&envelope);
        if page.len() == FEW_ROWS {
            page.reserve_exact(room - FEW_ROWS);
        }
        page.push(envelope);
        Ok(spent)
    };
    match channels {
        None => {
            let mut statement = db.prepare_cached(
                "SELECT seq, channel, session_id, action, client_id, client_seq, origin_scope, \
                        at_ms \
                 FROM log WHERE seq > ?1 ORDER BY seq LIMIT ?2",
            )?;
            let mut rows = statement.query((after, limit))?;
            while let Some(row) = rows.next()? {
                if push(row)? {
                    break;
                }
            }
        }
        Some(channels) => {
            let mut statement = db.prepare_cached(
                "SELECT seq, channel, session_id, action, client_id, client_seq, origin_scope, \
                        at_ms \
                 FROM log WHERE seq > ?1 AND channel_id IN \
                     (SELECT id FROM channels WHERE uri IN (SELECT value FROM json_each(?2))) \
                 ORDER BY seq LIMIT ?3",
            )?;
            let mut rows = statement.query((after, channels, limit))?;
            while let Some(row) = rows.next()? {
                if push(row)? {
                    break;
                }
            }
        }
    }
    Ok(page)
}
