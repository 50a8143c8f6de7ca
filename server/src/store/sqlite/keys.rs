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
//! forgotten at the next transaction's start. Retention deletes a
//! session's names with its log rows (a client's only once no row of
//! another session names it), in a write after which the writer forgets
//! every number ([`LogKeys::forget`]).

use rusqlite::{OptionalExtension as _, Params, Transaction};

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
            self.forget();
        }
    }

    /// The transaction committed: what it assigned holds.
    pub(super) fn settle(&mut self) {
        self.unsettled = false;
    }

    /// Forgets every number: names were deleted (see [`delete_names`]), and
    /// a name written again must get a number its row has.
    pub(super) fn forget(&mut self) {
        self.channels.clear();
        self.origins.clear();
        self.origin_count = 0;
        self.unsettled = false;
    }

    /// The number of the channel named `uri`, assigned now if it has none.
    pub(super) fn channel(&mut self, tx: &Transaction<'_>, uri: &str) -> Result<i64, StoreError> {
        if let Some(id) = self.channels.get(uri) {
            return Ok(*id);
        }
        let id = self.find_or_name(
            tx,
            "SELECT id FROM channels WHERE uri = ?1",
            "INSERT INTO channels (uri) VALUES (?1) RETURNING id",
            [uri],
        )?;
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
        let id = self.find_or_name(
            tx,
            "SELECT id FROM origins WHERE client_id = ?1 AND scope = ?2",
            "INSERT INTO origins (client_id, scope) VALUES (?1, ?2) RETURNING id",
            [client_id, scope],
        )?;
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

    /// The number `find` reads for a name, or the one `name` assigns it
    /// now (which this transaction must commit before it is trusted).
    fn find_or_name<P: Params + Copy>(
        &mut self,
        tx: &Transaction<'_>,
        find: &str,
        name: &str,
        names: P,
    ) -> Result<i64, StoreError> {
        let found = tx
            .prepare_cached(find)?
            .query_row(names, |row| row.get(0))
            .optional()?;
        if let Some(id) = found {
            return Ok(id);
        }
        self.unsettled = true;
        Ok(tx
            .prepare_cached(name)?
            .query_row(names, |row| row.get(0))?)
    }
}

/// The numbers a session's log rows hold, read before the rows are deleted.
pub(super) struct SessionNames {
    channels: Vec<i64>,
    origins: Vec<i64>,
}

/// The numbers of `session_id`'s channels (its own, its chats', its
/// changesets' and terminals': `store::session_channels`) and of the
/// origins its log rows hold. Every lookup is indexed: the channels' names
/// by their URI (a prefix is a range of it), the log by `log_channel_id`.
/// Before its chats are deleted.
pub(super) fn session_names(
    tx: &Transaction<'_>,
    session_id: &str,
) -> Result<SessionNames, StoreError> {
    let mut channels: Vec<i64> = tx
        .prepare_cached(&CHANNELS_OF_SESSION)?
        .query_map([session_id], |row| row.get(0))?
        .collect::<Result<_, _>>()?;
    channels.sort_unstable();
    let mut origins = Vec::new();
    let mut read = tx.prepare_cached(ORIGINS_OF_CHANNEL)?;
    for channel in &channels {
        for origin in read.query_map([channel], |row| row.get::<_, i64>(0))? {
            origins.push(origin?);
        }
    }
    origins.sort_unstable();
    origins.dedup();
    Ok(SessionNames { channels, origins })
}

/// The numbers of a session's channels (`?1`: its id).
static CHANNELS_OF_SESSION: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    let of = crate::store::session_channels("uri", "?1", crate::store::Prefixes::Ranges);
    format!("SELECT id FROM channels WHERE {of}")
});

/// The origins a channel's log rows hold (`?1`: the channel's number).
const ORIGINS_OF_CHANNEL: &str =
    "SELECT DISTINCT origin_id FROM log WHERE channel_id = ?1 AND origin_id IS NOT NULL";

/// Deletes a channel's log rows (`?1`: its number).
const LOG_OF_CHANNEL: &str = "DELETE FROM log WHERE channel_id = ?1";

/// Deletes the log rows of a session's channels, through `log_channel_id`.
pub(super) fn delete_log(tx: &Transaction<'_>, names: &SessionNames) -> Result<(), StoreError> {
    let mut delete = tx.prepare_cached(LOG_OF_CHANNEL)?;
    for id in &names.channels {
        delete.execute([id])?;
    }
    Ok(())
}

/// After a session's log rows are deleted: deletes its channels' names
/// (a channel belongs to one session) and its clients' names that no
/// other row holds. The writer must then forget its numbers.
pub(super) fn delete_names(tx: &Transaction<'_>, names: &SessionNames) -> Result<(), StoreError> {
    let mut channel = tx.prepare_cached("DELETE FROM channels WHERE id = ?1")?;
    for id in &names.channels {
        channel.execute([id])?;
    }
    let mut origin = tx.prepare_cached(
        "DELETE FROM origins WHERE id = ?1 \
         AND NOT EXISTS (SELECT 1 FROM log WHERE origin_id = ?1)",
    )?;
    for id in &names.origins {
        origin.execute([id])?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::{CHANNELS_OF_SESSION, LOG_OF_CHANNEL, ORIGINS_OF_CHANNEL};
    use crate::store::{Prefixes, owned_rows_sql};

    /// What retention runs for each session it deletes reads through
    /// indexes, never the whole of a table that grows with the store (the
    /// log above all).
    #[test]
    fn retention_reads_through_indexes() {
        let db = rusqlite::Connection::open_in_memory().expect("a database");
        for migration in super::super::MIGRATOR.iter() {
            db.execute_batch(migration.sql.as_str())
                .expect("a migration");
        }
        let mut statements = vec![
            CHANNELS_OF_SESSION.to_string(),
            ORIGINS_OF_CHANNEL.to_owned(),
            LOG_OF_CHANNEL.to_owned(),
        ];
        statements.extend(owned_rows_sql("?1", Prefixes::Ranges));
        for sql in statements {
            let plan: Vec<String> = db
                .prepare(&format!("EXPLAIN QUERY PLAN {sql}"))
                .expect("a plan")
                .query_map(["s-1"], |row| row.get::<_, String>(3))
                .expect("its rows")
                .collect::<Result<_, _>>()
                .expect("readable");
            let scans: Vec<&String> = plan
                .iter()
                .filter(|step| step.starts_with("SCAN"))
                .collect();
            assert!(scans.is_empty(), "{sql}\nreads a whole table: {plan:?}");
        }
    }
}
