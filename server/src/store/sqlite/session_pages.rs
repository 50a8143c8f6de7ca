//! A page of one session's envelopes: its transcript (its channel and its
//! chats), or its whole log (its changesets and terminals too), merged
//! from its channels' ranges of `log_channel_id`.

use tether_protocol::channel::Channel;

use super::SqliteStore;
use crate::store::{StoreError, StoredEnvelope, clamp_limit, rows, seq_to_db};

/// The names of a session's changesets' and terminals' channels (`?1`: its
/// id), through the index of their names (a prefix is a range of it).
static UNDER_SESSION: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    let under = crate::store::under_session("uri", "?1", crate::store::Prefixes::Ranges);
    format!("SELECT uri FROM channels WHERE {}", under.join(" OR "))
});

impl SqliteStore {
    /// A page of a session's transcript ([`Store::transcript`]), with its
    /// changesets' and terminals' envelopes when `work`
    /// ([`Store::session_log`]).
    pub(super) async fn session_page(
        &self,
        session_id: &str,
        after: u64,
        limit: u32,
        work: bool,
    ) -> Result<Vec<StoredEnvelope>, StoreError> {
        // A session's rows are on its channel and its chats' (the log has
        // no session index: see migration 0005), and its changesets' and
        // terminals' (their names begin with its id). Each channel is one
        // ordered range of log_channel_id; the ranges are merged by seq.
        let limit = clamp_limit(limit);
        // One snapshot for every read of the page (WAL: the first read
        // fixes it), so no append lands between them.
        let mut tx = self.readers.begin().await?;
        let mut channels: Vec<String> =
            sqlx::query_scalar("SELECT chat FROM chats WHERE session_id = ?")
                .bind(session_id)
                .fetch_all(&mut *tx)
                .await?;
        channels.push(Channel::session_uri(session_id));
        if work {
            channels.extend(
                sqlx::query_scalar::<_, String>(sqlx::AssertSqlSafe(UNDER_SESSION.as_str()))
                    .bind(session_id)
                    .fetch_all(&mut *tx)
                    .await?,
            );
        }
        // Which rows make the page: each channel's first `limit` seqs, read
        // off its index alone (a seq is the rowid), merged; then only the
        // rows up to the page's last seq are read, not `limit` rows of
        // every channel.
        let after = seq_to_db(after);
        let mut firsts: Vec<(i64, usize)> = Vec::new();
        for (n, channel) in channels.iter().enumerate() {
            let seqs: Vec<i64> = sqlx::query_scalar(
                "SELECT seq FROM log WHERE channel_id = (SELECT id FROM channels WHERE uri = ?) \
                       AND seq > ? ORDER BY seq LIMIT ?",
            )
            .bind(channel)
            .bind(after)
            .bind(limit)
            .fetch_all(&mut *tx)
            .await?;
            firsts.extend(seqs.into_iter().map(|seq| (seq, n)));
        }
        firsts.sort_unstable();
        firsts.truncate(usize::try_from(limit).unwrap_or(usize::MAX));
        let Some(&(last, _)) = firsts.last() else {
            tx.commit().await?;
            return Ok(Vec::new());
        };
        let mut read: Vec<usize> = firsts.iter().map(|(_, n)| *n).collect();
        read.sort_unstable();
        read.dedup();
        let mut found: Vec<rows::Envelope> = Vec::with_capacity(firsts.len());
        for channel in read.into_iter().map(|n| &channels[n]) {
            let rows: Vec<rows::Envelope> = sqlx::query_as(
                "SELECT seq, channel, session_id, action, client_id, client_seq, origin_scope, \
                        at_ms \
                 FROM log WHERE channel_id = (SELECT id FROM channels WHERE uri = ?) \
                       AND seq > ? AND seq <= ? ORDER BY seq",
            )
            .bind(channel)
            .bind(after)
            .bind(last)
            .fetch_all(&mut *tx)
            .await?;
            found.extend(
                rows.into_iter()
                    .filter(|row| row.session_id.as_deref() == Some(session_id)),
            );
        }
        tx.commit().await?;
        found.sort_unstable_by_key(|row| row.seq);
        found.truncate(usize::try_from(limit).unwrap_or(usize::MAX));
        found.into_iter().map(TryInto::try_into).collect()
    }
}
