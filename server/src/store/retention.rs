//! What retention deletes, as SQL both backends build: the settled
//! sessions past their limit, and every row a session owns, found through
//! indexes (by its channels' names and prefixes).

use super::{StoreError, seq_from_db};

/// A settled session past its project's retention.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Expired {
    /// The session.
    pub id: String,
    /// Its project.
    pub project: String,
    /// Its latest seq when it was found expired.
    pub last_seq: u64,
}

impl Expired {
    /// The rows of an expired-sessions query: `(id, project, last_seq)`.
    pub(crate) fn from_rows(rows: Vec<(String, String, i64)>) -> Result<Vec<Self>, StoreError> {
        rows.into_iter()
            .map(|(id, project, last_seq)| {
                Ok(Self {
                    id,
                    project,
                    last_seq: seq_from_db(last_seq)?,
                })
            })
            .collect()
    }
}

/// How a backend compares a session's channel prefixes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Prefixes {
    /// Text sorts by its bytes (SQLite's `BINARY`): a prefix is a range of
    /// an index's keys, `> '<scheme>:/<id>/'` and `< '<scheme>:/<id>0'`
    /// (`'0'` follows `'/'`; an id holds no `/`).
    Ranges,
    /// Text sorts by a locale (Postgres), where a prefix is no range of
    /// `log_channel`'s keys: it is the same range compared in the `"C"`
    /// collation, which partial indexes (migration 0017) hold for the
    /// channels under sessions ([`under_sessions`]) alone. The condition
    /// names their predicate, so that the planner may use them.
    Collated,
}

/// The partial indexes' predicate on `column` (Postgres, migration 0017):
/// a channel under a session, a changeset's or a terminal's.
fn under_sessions(column: &str) -> String {
    format!("({column} LIKE 'ahp-changeset:%' OR {column} LIKE 'ahp-terminal:%')")
}

/// The conditions on `column`, one per kind of channel, that together hold
/// for every channel of the session whose id is `p` (the backend's
/// placeholder for it): its own, its chats' (before they are deleted), its
/// changesets' and its terminals'.
fn session_channel_kinds(column: &str, p: &str, prefixes: Prefixes) -> [String; 4] {
    let under = |scheme: &str| match prefixes {
        Prefixes::Ranges => format!(
            "({column} > '{scheme}:/' || {p} || '/' AND {column} < '{scheme}:/' || {p} || '0')"
        ),
        Prefixes::Collated => format!(
            "({} AND {column} COLLATE \"C\" > '{scheme}:/' || {p} || '/' \
              AND {column} COLLATE \"C\" < '{scheme}:/' || {p} || '0')",
            under_sessions(column)
        ),
    };
    [
        format!("{column} = 'ahp-session:/' || {p}"),
        format!("{column} IN ({})", chats_of(p)),
        under("ahp-changeset"),
        under("ahp-terminal"),
    ]
}

/// The conditions on `column` that hold for the channels under the
/// session whose id is `p`: its changesets', and its terminals'. On
/// Postgres each is a range of a partial index only alone: joined by `OR`,
/// its planner scans every session's.
pub(crate) fn under_session(column: &str, p: &str, prefixes: Prefixes) -> [String; 2] {
    let [.., changesets, terminals] = session_channel_kinds(column, p, prefixes);
    [changesets, terminals]
}

/// The condition on `column` that holds for every channel of the session
/// whose id is `p`: [`session_channel_kinds`]' conditions, any of them.
pub(crate) fn session_channels(column: &str, p: &str, prefixes: Prefixes) -> String {
    session_channel_kinds(column, p, prefixes).join(" OR ")
}

/// The statements that delete the rows of `table` (keyed by a `channel`
/// column) on the channels of the session whose id is `p`. On Postgres one
/// per kind of channel, each through an index: its planner reads the whole
/// table for an `OR` one of whose arms is a subquery.
pub(crate) fn session_rows_sql(table: &str, p: &str, prefixes: Prefixes) -> Vec<String> {
    match prefixes {
        Prefixes::Ranges => vec![format!(
            "DELETE FROM {table} WHERE {}",
            session_channels("channel", p, prefixes)
        )],
        Prefixes::Collated => session_channel_kinds("channel", p, prefixes)
            .iter()
            .map(|kind| format!("DELETE FROM {table} WHERE {kind}"))
            .collect(),
    }
}

/// The query of the chats of the session whose id is `p`.
fn chats_of(p: &str) -> String {
    format!("SELECT chat FROM chats WHERE session_id = {p}")
}

/// The statements that delete everything a session owns but its log rows
/// (SQLite deletes those through its channels' numbers; Postgres with
/// [`session_rows_sql`]), each taking the session id as its only parameter
/// (`p`, the backend's placeholder for it), after its read-model row was
/// deleted.
pub(crate) fn owned_rows_sql(p: &str, prefixes: Prefixes) -> Vec<String> {
    let chats = chats_of(p);
    let mut statements = session_rows_sql("snapshots", p, prefixes);
    statements.extend(session_rows_sql("rejections", p, prefixes));
    statements.extend([
        format!("DELETE FROM chat_turns WHERE chat IN ({chats})"),
        format!("DELETE FROM chats WHERE session_id = {p}"),
        format!("DELETE FROM attachments WHERE session_id = {p}"),
        format!("DELETE FROM client_owners WHERE session_id = {p}"),
        format!("DELETE FROM search_docs WHERE session_id = {p}"),
        format!("DELETE FROM search_pending WHERE session_id = {p}"),
    ]);
    statements
}
