//! Search on SQLite (FTS5): the backend's pieces of the one search
//! statement (`store::search::search_sql`) and its parameters.

use sqlx::AssertSqlSafe;
use sqlx::sqlite::SqlitePool;

use crate::store::search::{self, SearchHit, SearchRequest};
use crate::store::{StoreError, clamp_limit};

/// The hits of `request`, best first.
pub(super) async fn search(
    pool: &SqlitePool,
    request: &SearchRequest,
) -> Result<Vec<SearchHit>, StoreError> {
    let terms = request.query.terms.len();
    let sql = search::search_sql(
        &search::TextIndex {
            from: |_| "search_fts JOIN search_docs d ON d.id = search_fts.rowid".into(),
            matches: |n| format!("search_fts MATCH ?{n}"),
            // bm25 is lower for better matches.
            score: "-bm25(search_fts)",
            // The index's rowids grow with each new document.
            newest: "search_fts.rowid DESC",
            term_docs: |n, filters| {
                format!(
                    "SELECT d.session_id, d.id AS doc, d.chat, d.turn_id, d.kind \
                     FROM search_fts JOIN search_docs d ON d.id = search_fts.rowid \
                     LEFT JOIN sessions s ON s.id = d.session_id \
                     WHERE search_fts MATCH ?{n} {filters} \
                     ORDER BY search_fts.rowid DESC LIMIT {}",
                    search::RANKED_WINDOW
                )
            },
            is_piece: "search_fts.rowid = p.doc",
        },
        terms,
        super::param,
        |p| super::in_projects("s.project", p),
    );
    let scope = super::projects_json(request.projects.as_deref());
    let mut statement = sqlx::query_as::<_, SearchHit>(AssertSqlSafe(sql))
        .bind(request.query.fts5())
        .bind(scope)
        .bind(request.project.as_deref())
        .bind(request.agent.as_deref())
        .bind(request.state.as_deref())
        .bind(request.since_ms)
        .bind(request.until_ms)
        .bind(clamp_limit(request.limit))
        .bind(i64::from(request.offset));
    if terms > 1 {
        statement = statement.bind(request.query.fts5_any());
        for term in request.query.fts5_terms() {
            statement = statement.bind(term);
        }
    }
    Ok(statement.fetch_all(pool).await?)
}
