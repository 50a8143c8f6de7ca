//! A page of one session's envelopes: its transcript (its channel and its
//! chats), or its whole log (its changesets and terminals too), merged
//! from its channels' ranges of `log_channel`.

use tether_protocol::channel::Channel;

use super::PostgresStore;
use crate::store::{StoreError, StoredEnvelope, clamp_limit, rows, seq_to_db};

/// A page of a session's envelopes on the channels `channels` lists (`$1`:
/// the session's channel, `$2`: its id; `with`: the `WITH` clauses it
/// needs, each followed by a comma). A row of another session's on one of
/// them (none is: a channel is one session's) would shorten the page. The log has no session
/// index (migration 0006): each channel's first `$4` seqs above `$3` are
/// read off `log_channel` (index only, where the visibility map allows),
/// the page ends at the `$4`-th of them all, and only the rows up to it
/// are read, one range of `log_channel` per channel, merged by seq (not a
/// page of rows from every chat, changeset and terminal).
fn session_page_sql(with: &str, channels: &str) -> String {
    format!(
        "WITH RECURSIVE {with} \
         c AS MATERIALIZED ({channels}), \
         bound AS (SELECT max(f.seq) AS last FROM \
                   (SELECT s.seq FROM c CROSS JOIN LATERAL \
                        (SELECT seq FROM log WHERE log.channel = c.channel AND log.seq > $3 \
                         ORDER BY log.seq LIMIT $4) AS s \
                    ORDER BY s.seq LIMIT $4) AS f) \
         SELECT l.seq, l.channel, l.session_id, l.action, l.client_id, l.client_seq, \
                l.origin_scope, l.at_ms \
         FROM c CROSS JOIN LATERAL (SELECT * FROM log \
                                    WHERE log.channel = c.channel AND log.seq > $3 \
                                      AND log.seq <= (SELECT last FROM bound) \
                                      AND log.session_id = $2) AS l \
         ORDER BY l.seq"
    )
}

/// A transcript's channels: the session's and its chats'.
const TRANSCRIPT_CHANNELS: &str =
    "SELECT $1::text AS channel UNION SELECT chat FROM chats WHERE session_id = $2";

/// [`Store::transcript`]'s page: a page of the session's rows from each
/// of its channels (two, or a few chats), merged. The session's rows are
/// filtered before each channel's limit, so a page is short only at the
/// end (the rebuild's fold and the lease check read it so), and with so
/// few channels reading seqs first gains nothing (BENCHMARKS.md).
pub(super) static TRANSCRIPT: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    format!(
        "SELECT l.seq, l.channel, l.session_id, l.action, l.client_id, l.client_seq, \
                l.origin_scope, l.at_ms \
         FROM ({TRANSCRIPT_CHANNELS}) AS c \
         CROSS JOIN LATERAL (SELECT * FROM log \
                             WHERE log.channel = c.channel AND log.seq > $3 \
                               AND log.session_id = $2 \
                             ORDER BY log.seq LIMIT $4) AS l \
         ORDER BY l.seq LIMIT $4"
    )
});

/// [`Store::session_log`]'s page: the transcript's channels, and those
/// under the session. Each kind of those is found by skipping through its
/// partial index (migration 0017) from one channel to the next, one probe
/// a channel, however many rows each holds (a terminal's output may be
/// thousands).
pub(super) static SESSION_LOG: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    let of =
        |column: &str| crate::store::under_session(column, "$2", crate::store::Prefixes::Collated);
    let (outer, inner) = (of("channel"), of("l.channel"));
    let skip = |name: &str, kind: usize| {
        format!(
            "{name}(channel) AS ( \
                 SELECT min(channel COLLATE \"C\") FROM log WHERE {} \
                 UNION ALL \
                 SELECT (SELECT min(l.channel COLLATE \"C\") FROM log l \
                         WHERE {} AND l.channel COLLATE \"C\" > k.channel) \
                 FROM {name} k WHERE k.channel IS NOT NULL)",
            outer[kind], inner[kind]
        )
    };
    let with = format!("{}, {},", skip("changesets", 0), skip("terminals", 1));
    let found = |name: &str| {
        format!(" UNION SELECT channel COLLATE \"default\" FROM {name} WHERE channel IS NOT NULL")
    };
    session_page_sql(
        &with,
        &format!(
            "{TRANSCRIPT_CHANNELS}{}{}",
            found("changesets"),
            found("terminals")
        ),
    )
});

impl PostgresStore {
    /// A page of a session's envelopes, read with `sql` (see
    /// [`session_page_sql`]).
    pub(super) async fn session_page(
        &self,
        sql: &str,
        session_id: &str,
        after: u64,
        limit: u32,
    ) -> Result<Vec<StoredEnvelope>, StoreError> {
        let mut tx = self.begin_channel_read().await?;
        let found: Vec<rows::Envelope> = sqlx::query_as(sqlx::AssertSqlSafe(sql))
            .bind(Channel::session_uri(session_id))
            .bind(session_id)
            .bind(seq_to_db(after))
            .bind(clamp_limit(limit))
            .fetch_all(&mut *tx)
            .await?;
        tx.commit().await?;
        found.into_iter().map(TryInto::try_into).collect()
    }
}
