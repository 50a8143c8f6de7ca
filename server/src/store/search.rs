//! What the search index holds and how it is asked, for both backends.
//!
//! Documents ([`tether_protocol::search::SearchDoc`]) ride on the envelope
//! they come from and are upserted in its transaction (the plan keeps the
//! latest per key of a batch). A query joins the documents to the session
//! read model, so it is always limited to the projects the caller may see
//! and filtered on what the read model says.

use tether_protocol::search::{Query, SearchDoc};

use super::plan::LogRow;

/// How a document upsert resolves an existing `(session_id, key)`, the
/// same on both backends: the new document replaces it, or with
/// `newer_only` only when the stored one is not from a later seq.
pub fn doc_conflict(newer_only: bool) -> &'static str {
    macro_rules! replace {
        () => {
            "ON CONFLICT (session_id, key) DO UPDATE SET chat = excluded.chat, \
             turn_id = excluded.turn_id, kind = excluded.kind, seq = excluded.seq, \
             at_ms = excluded.at_ms, body = excluded.body, words = excluded.words"
        };
    }
    if newer_only {
        concat!(replace!(), " WHERE search_docs.seq <= excluded.seq")
    } else {
        replace!()
    }
}

/// One document to write: its session, seq and time.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DocRow<'a> {
    /// The session it belongs to.
    pub session_id: &'a str,
    /// The seq of the envelope that wrote it last.
    pub seq: i64,
    /// The document.
    pub doc: &'a SearchDoc,
}

/// The documents of a batch's fresh rows, the latest per (session, key):
/// a streamed answer's deltas in one batch write each of its pieces once.
pub fn latest_docs<'a>(rows: &[LogRow<'a>]) -> Vec<DocRow<'a>> {
    let mut seen = super::plan::Set::default();
    let mut docs: Vec<DocRow<'a>> = rows
        .iter()
        .rev()
        .filter_map(|row| Some((row, row.envelope.session_id.as_deref()?)))
        .flat_map(|(row, session_id)| {
            row.envelope
                .search
                .iter()
                .rev()
                .map(move |doc| (row.seq, session_id, doc))
        })
        .filter_map(|(seq, session_id, doc)| {
            seen.insert((session_id, doc.key.as_str()))
                .then_some(DocRow {
                    session_id,
                    seq,
                    doc,
                })
        })
        .collect();
    docs.reverse();
    docs
}

/// A search: the query, the caller's scope and the filters.
#[derive(Debug, Clone)]
pub struct SearchRequest {
    /// What to find.
    pub query: Query,
    /// Only sessions of these projects (the caller's scope); `None`: all.
    pub projects: Option<Vec<String>>,
    /// Only this project's sessions.
    pub project: Option<String>,
    /// Only sessions of this agent (provider).
    pub agent: Option<String>,
    /// Only sessions in this projected state.
    pub state: Option<String>,
    /// Only documents written at or after this time (ms since the epoch).
    pub since_ms: Option<i64>,
    /// Only documents written before this time.
    pub until_ms: Option<i64>,
    /// Hits to skip (the page cursor).
    pub offset: u32,
    /// Hits to return at most.
    pub limit: u32,
}

/// One document that matched, best first.
#[derive(Debug, Clone, PartialEq, sqlx::FromRow)]
pub struct SearchHit {
    /// The session.
    pub session_id: String,
    /// Its project.
    pub project: String,
    /// Its agent.
    pub provider: String,
    /// Its title.
    pub title: Option<String>,
    /// Its projected state.
    pub state: String,
    /// The chat it was said in.
    pub chat: Option<String>,
    /// The turn.
    pub turn_id: Option<String>,
    /// What it is (`message`, `answer`, …).
    pub kind: String,
    /// The seq of the envelope that wrote it last.
    pub seq: i64,
    /// When, ms since the epoch.
    pub at_ms: i64,
    /// The text as said.
    pub body: String,
}

/// The most recent matches a query ranks: a word most documents hold
/// would otherwise cost a score for each of them (a second for a million
/// envelopes); past this many, the newest matches are ranked and the rest
/// are not found. A rarer query has fewer matches and is ranked whole.
pub const RANKED_WINDOW: u32 = 5_000;

/// How a backend finds documents, for [`search_sql`]. Each is a piece of
/// SQL; `p(n)` is the backend's n-th parameter, as [`search_sql`] says.
pub(super) struct TextIndex<'a> {
    /// The documents `d`, joined to the text index where the backend
    /// keeps one (and to the query text of parameter n): `from(n)`.
    pub from: fn(usize) -> String,
    /// `d` matches the query text of parameter n: `matches(n)`.
    pub matches: fn(usize) -> String,
    /// `d`'s relevance to that text (larger is better).
    pub score: &'a str,
    /// Orders the newest match first (the window of [`RANKED_WINDOW`]).
    pub newest: &'a str,
    /// The newest [`RANKED_WINDOW`] documents `d` (of sessions `s`, a
    /// left join, which the planner drops when no filter is given)
    /// matching the query text of parameter n and meeting `filters` (the
    /// caller's scope and filters, as `AND …`), as `session_id, doc, chat,
    /// turn_id, kind` (`doc` names the document within its session):
    /// `term_docs(n, filters)`.
    pub term_docs: fn(usize, &str) -> String,
    /// `d` is the piece `p` (of `pieces`: `session_id, doc`).
    pub is_piece: &'a str,
}

/// The search statement, its parameters in a fixed order: 1 the query,
/// 2 the scope (a list, or null for all projects), 3 the project, 4 the
/// agent, 5 the state, 6 since, 7 until (each null when not given), 8 the
/// limit, 9 the offset; with `terms` over 1, also 10 what matches any one
/// of them, and from 11 each term. `p(n)` is the backend's n-th parameter
/// with its type (`kind`: `text`, `list` or `int`), and `in_list(p)` tests
/// `s.project` against a list parameter.
///
/// Every term must match one document, except in an answer: a long answer
/// is indexed in pieces (`search::pieces`), so a query's terms also match
/// across the pieces of one turn's answer, however far apart (among the
/// newest [`RANKED_WINDOW`] matches of each term within the caller's
/// scope and filters).
pub(super) fn search_sql(
    index: &TextIndex<'_>,
    terms: usize,
    p: impl Fn(usize, &str) -> String,
    in_list: impl Fn(&str) -> String,
) -> String {
    let scope = p(2, "list");
    let filters = format!(
        "AND ({scope} IS NULL OR {in_list}) \
         AND ({project} IS NULL OR s.project = {project}) \
         AND ({agent} IS NULL OR s.provider = {agent}) \
         AND ({state} IS NULL OR s.state = {state}) \
         AND ({since} IS NULL OR d.at_ms >= {since}) \
         AND ({until} IS NULL OR d.at_ms < {until})",
        in_list = in_list(&scope),
        project = p(3, "text"),
        agent = p(4, "text"),
        state = p(5, "text"),
        since = p(6, "int"),
        until = p(7, "int"),
    );
    // The newest matches of the query text of parameter n, scored, each
    // from `before` (the documents or, led by them, `pieces`) meeting `and`.
    let matching = |n: usize, before: &str, and: &str| {
        format!(
            "SELECT * FROM (SELECT d.session_id, s.project, s.provider, s.title, s.state, d.chat, \
                    d.turn_id, d.kind, d.key, d.seq, d.at_ms, d.body, {score} AS score \
             FROM {before}{from} JOIN sessions s ON s.id = d.session_id \
             WHERE {matches} {and} {filters} \
             ORDER BY {newest} LIMIT {RANKED_WINDOW}) m{n}",
            from = (index.from)(n),
            matches = (index.matches)(n),
            score = index.score,
            newest = index.newest,
        )
    };
    let (with, ranked) = if terms > 1 {
        // Each term's newest matches, then the answers' pieces among them
        // whose turn's pieces match every term between them: those pieces
        // are hits too, scored by the terms each holds.
        let each = (1..=terms)
            .map(|t| {
                format!(
                    "SELECT {t} AS i, h.* FROM ({}) h",
                    (index.term_docs)(10 + t, &filters)
                )
            })
            .collect::<Vec<_>>()
            .join(" UNION ALL ");
        (
            format!(
                "WITH term_docs AS ({each}), \
                 pieces AS (SELECT session_id, doc FROM term_docs WHERE kind = 'answer' \
                   AND (session_id, COALESCE(chat, ''), turn_id) IN \
                       (SELECT session_id, COALESCE(chat, ''), turn_id FROM term_docs \
                        WHERE kind = 'answer' \
                        GROUP BY session_id, COALESCE(chat, ''), turn_id \
                        HAVING COUNT(DISTINCT i) = {terms})) "
            ),
            format!(
                "{} UNION ALL {}",
                matching(1, "", ""),
                matching(
                    10,
                    "pieces p CROSS JOIN ",
                    &format!("AND {}", index.is_piece)
                )
            ),
        )
    } else {
        (String::new(), matching(1, "", ""))
    };
    // The answers of one turn (and each one's pieces, `search::pieces`)
    // are one hit, the best of them; every other document is its own.
    format!(
        "{with}SELECT session_id, project, provider, title, state, chat, turn_id, kind, seq, at_ms, body \
         FROM (SELECT ranked.*, ROW_NUMBER() OVER ( \
                 PARTITION BY session_id, kind, chat, turn_id, \
                              CASE WHEN kind = 'answer' THEN '' ELSE key END \
                 ORDER BY score DESC, seq DESC) AS nth \
         FROM ({ranked}) ranked) hits \
         WHERE nth = 1 \
         ORDER BY score DESC, seq DESC LIMIT {limit} OFFSET {offset}",
        limit = p(8, "int"),
        offset = p(9, "int"),
    )
}
