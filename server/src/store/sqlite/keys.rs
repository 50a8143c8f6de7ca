//! The log's integer keys (migration 0014): each channel, and each client
//! within its origin scope, is named once, in `channels` and `origins`,
//! and the log's two indexes hold those numbers instead of the text. An
//! index entry is then a few bytes compared as integers, not a URI or a
//! client id compared byte by byte, at every level of the B-tree an insert
//! descends and in every page it splits.
//!
//! The writer keeps the numbers it has used in memory. A number it
//! assigns is only trusted once its transaction commits: until then the
//! row that names it could be rolled back, and SQLite would hand the same
//! number to the next name. So a transaction that assigned one and did not
//! settle (rolled back, failed, or failed to commit) has the memory
//! forgotten at the next transaction's start. The rows are never deleted
//! (retention deletes the log's rows, not the names), so a number once
//! committed names the same thing for the database's life.

use rusqlite::{OptionalExtension as _, Transaction, params};

use crate::store::StoreError;
use crate::store::plan::Map;

/// How many names of each kind the writer keeps in memory; past it the
/// memory starts over (each name is then read again once).
const REMEMBERED: usize = 65_536;

/// The numbers the writer has used for channels and origins.
#[derive(Debug, Default)]
pub(super) struct LogKeys {
    channels: Map<String, i64>,
    /// Scope → client id → number (two levels, so that a lookup borrows
    /// both names instead of building a key).
    origins: Map<String, Map<String, i64>>,
    /// How many numbers `origins` holds.
    origin_count: usize,
    /// The current transaction assigned a number it has not committed.
    unsettled: bool,
}

impl LogKeys {
    /// Starts a transaction's use: forgets everything if the last one
    /// assigned numbers and did not commit them.
    pub(super) fn begin(&mut self) {
        if self.unsettled {
            self.channels.clear();
            self.origins.clear();
            self.origin_count = 0;
            self.unsettled = false;
        }
    }

    /// The transaction committed: what it assigned holds.
    pub(super) fn settle(&mut self) {
        self.unsettled = false;
    }

    /// The number of the channel named `uri`, assigned now if it has none.
    pub(super) fn channel(&mut self, tx: &Transaction<'_>, uri: &str) -> Result<i64, StoreError> {
        if let Some(id) = self.channels.get(uri) {
            return Ok(*id);
        }
        let found = tx
            .prepare_cached("SELECT id FROM channels WHERE uri = ?1")?
            .query_row([uri], |row| row.get(0))
            .optional()?;
        let id = match found {
            Some(id) => id,
            None => {
                self.unsettled = true;
                tx.prepare_cached("INSERT INTO channels (uri) VALUES (?1) RETURNING id")?
                    .query_row([uri], |row| row.get(0))?
            }
        };
        if self.channels.len() >= REMEMBERED {
            self.channels.clear();
        }
        self.channels.insert(uri.to_owned(), id);
        Ok(id)
    }

    /// The number of the origins of `client_id` in `scope`, assigned now if
    /// they have none.
    pub(super) fn origin(
        &mut self,
        tx: &Transaction<'_>,
        client_id: &str,
        scope: &str,
    ) -> Result<i64, StoreError> {
        if let Some(id) = self.origins.get(scope).and_then(|ids| ids.get(client_id)) {
            return Ok(*id);
        }
        let found = tx
            .prepare_cached("SELECT id FROM origins WHERE client_id = ?1 AND scope = ?2")?
            .query_row(params![client_id, scope], |row| row.get(0))
            .optional()?;
        let id = match found {
            Some(id) => id,
            None => {
                self.unsettled = true;
                tx.prepare_cached(
                    "INSERT INTO origins (client_id, scope) VALUES (?1, ?2) RETURNING id",
                )?
                .query_row(params![client_id, scope], |row| row.get(0))?
            }
        };
        if self.origin_count >= REMEMBERED {
            self.origins.clear();
            self.origin_count = 0;
        }
        self.origins
            .entry(scope.to_owned())
            .or_default()
            .insert(client_id.to_owned(), id);
        self.origin_count += 1;
        Ok(id)
    }
}
