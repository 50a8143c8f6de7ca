//! Pages of the log, read on a blocking thread through connections of
//! rusqlite's own: a page of a thousand rows crosses threads once. sqlx's
//! SQLite driver hands every row from its worker thread to the async side,
//! and a catch-up spent most of its time in those hand-offs (see
//! BENCHMARKS.md, "Catch-up").

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use rusqlite::{Connection, OpenFlags};
use tokio::sync::Semaphore;

use super::BUSY_TIMEOUT;
use crate::store::{Origin, StoreError, StoredEnvelope, clamp_limit, seq_from_db, seq_to_db};

/// Read-only connections for log pages, and how many may read at once.
#[derive(Debug)]
pub(super) struct Pages {
    path: PathBuf,
    /// Connections not reading now (at most `readers` of them).
    idle: Mutex<Vec<Connection>>,
    /// Bounds the pages read at once, and so the connections open.
    readers: Semaphore,
}

impl Pages {
    /// Pages of the database at `path`, at most `readers` read at once.
    pub(super) fn new(path: &Path, readers: usize) -> Arc<Self> {
        Arc::new(Self {
            path: path.to_owned(),
            idle: Mutex::new(Vec::new()),
            readers: Semaphore::new(readers.max(1)),
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
        let _permit = self
            .readers
            .acquire()
            .await
            .map_err(|_| StoreError::Corrupt("the store is closed".into()))?;
        let pages = self.clone();
        tokio::task::spawn_blocking(move || {
            pages.read(after, channels.as_deref(), limit, max_bytes)
        })
        .await
        .map_err(|e| StoreError::Corrupt(format!("a log page read failed: {e}")))?
    }

    fn read(
        &self,
        after: u64,
        channels: Option<&str>,
        limit: u32,
        max_bytes: usize,
    ) -> Result<Vec<StoredEnvelope>, StoreError> {
        let idle = self.idle.lock().ok().and_then(|mut idle| idle.pop());
        let db = match idle {
            Some(db) => db,
            None => self.open()?,
        };
        let page = read_page(&db, after, channels, limit, max_bytes)?;
        // Kept only after a read that worked: a broken connection goes.
        if let Ok(mut idle) = self.idle.lock() {
            idle.push(db);
        }
        Ok(page)
    }

    fn open(&self) -> Result<Connection, StoreError> {
        let db = Connection::open_with_flags(
            &self.path,
            OpenFlags::SQLITE_OPEN_READ_ONLY
                | OpenFlags::SQLITE_OPEN_NO_MUTEX
                | OpenFlags::SQLITE_OPEN_URI,
        )?;
        db.busy_timeout(BUSY_TIMEOUT)?;
        db.set_prepared_statement_cache_capacity(4);
        Ok(db)
    }
}

fn read_page(
    db: &Connection,
    after: u64,
    channels: Option<&str>,
    limit: u32,
    max_bytes: usize,
) -> Result<Vec<StoredEnvelope>, StoreError> {
    let (after, limit) = (seq_to_db(after), clamp_limit(limit));
    let mut page = Vec::with_capacity(usize::try_from(limit).unwrap_or(0).min(1024));
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
