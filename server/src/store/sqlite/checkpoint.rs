//! WAL checkpoints off the commit path.
//!
//! With SQLite's automatic checkpoints, the commit that crosses 1,000 WAL
//! frames copies them into the database file and fsyncs it before it
//! returns: under load, every few group commits paid for a checkpoint.
//! Here the writer's connection never checkpoints on its own. A WAL hook
//! tells the writer thread how many frames the WAL holds after each commit
//! ([`frames`]); every [`WAKE_FRAMES`] new frames it wakes this thread,
//! which checkpoints on its own connection while the writer goes on.
//!
//! A passive checkpoint never blocks the writer, but the WAL file only
//! starts over from its beginning when a write transaction begins with
//! every frame already copied. A writer that never pauses never sees that,
//! so once the WAL holds [`RESET_FRAMES`] the writer runs one passive
//! checkpoint itself (cheap: this thread has copied nearly everything by
//! then), and its next transaction starts the WAL over. That bounds the
//! WAL's size without ever blocking the writer on readers (a `RESTART`
//! checkpoint would).

use std::path::Path;
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::Duration;

use std::cell::Cell;

use rusqlite::Connection;
use rusqlite::hooks::Wal;

use super::writer::connect;
use crate::store::StoreError;

/// The least time between two background checkpoints. Pages written again
/// and again (the log's index leaves) are copied once per checkpoint, so a
/// checkpoint after every commit would copy the same pages many times.
const INTERVAL: Duration = Duration::from_millis(100);

/// New WAL frames that make a checkpoint due: SQLite's own automatic
/// checkpoint threshold, so a lightly loaded store checkpoints as rarely as
/// it did (each checkpoint fsyncs the database file beside the commits'
/// fsyncs of the WAL).
pub(super) const WAKE_FRAMES: i64 = 1_000;

/// WAL frames (about 32 MiB) at which the writer checkpoints itself so that
/// the WAL starts over (see the module doc).
pub(super) const RESET_FRAMES: i64 = 8_192;

thread_local! {
    /// The frames in the WAL after the last commit of this thread's
    /// connection (the writer's), as the WAL hook reported them.
    static FRAMES: Cell<i64> = const { Cell::new(0) };
}

/// Makes the WAL hook of `db` (the writer's connection, on the writer
/// thread) record the WAL's size for [`frames`]. Setting the hook turns
/// SQLite's automatic checkpoints off.
pub(super) fn track_frames(db: &Connection) {
    fn hook(_: &Wal, frames: std::ffi::c_int) -> rusqlite::Result<()> {
        FRAMES.set(i64::from(frames));
        Ok(())
    }
    db.wal_hook(Some(hook));
}

/// The frames in the WAL after this thread's last commit.
pub(super) fn frames() -> i64 {
    FRAMES.get()
}

/// The handle the writer wakes the checkpointer with.
#[derive(Debug)]
pub(super) struct Checkpointer {
    wake: mpsc::SyncSender<()>,
    thread: JoinHandle<()>,
}

impl Checkpointer {
    /// Opens its connection and starts its thread.
    pub(super) fn start(path: &Path) -> Result<Self, StoreError> {
        let db = connect(path)?;
        let (wake, woken) = mpsc::sync_channel::<()>(1);
        let thread = std::thread::Builder::new()
            .name("tether-sqlite-checkpoint".into())
            .spawn(move || run(&db, &woken))
            .map_err(|e| StoreError::Open {
                target: format!("SQLite database {}", path.display()),
                reason: format!("cannot start the checkpoint thread: {e}"),
            })?;
        Ok(Self { wake, thread })
    }

    /// Says the WAL grew; wake-ups while a checkpoint is due coalesce.
    pub(super) fn wake(&self) {
        let _ = self.wake.try_send(());
    }

    /// Stops the thread once its current checkpoint is done.
    pub(super) fn stop(self) {
        drop(self.wake);
        let _ = self.thread.join();
    }
}

fn run(db: &Connection, woken: &mpsc::Receiver<()>) {
    let mut failing = false;
    while woken.recv().is_ok() {
        match passive(db) {
            Ok(_) if failing => {
                failing = false;
                tracing::info!("WAL checkpoints succeed again");
            }
            Ok(_) => {}
            Err(err) if !failing => {
                failing = true;
                tracing::warn!(error = %err, "WAL checkpoint failed; the WAL grows until one succeeds");
            }
            Err(_) => {}
        }
        std::thread::sleep(INTERVAL);
    }
}

/// Copies what it can of the WAL into the database without waiting for
/// anyone; returns the WAL's frames and how many of them are copied.
pub(super) fn passive(db: &Connection) -> Result<(i64, i64), rusqlite::Error> {
    db.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |row| {
        Ok((row.get(1)?, row.get(2)?))
    })
}
