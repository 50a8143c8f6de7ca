//! Search on Postgres (`tsvector` and its GIN index): the backend's pieces
//! of the one search statement (`store::search::search_sql`) and its
//! parameters.

use sqlx::AssertSqlSafe;
use sqlx::PgPool;

use crate::store::search::{self, SearchHit, SearchRequest};
use crate::store::{StoreError, clamp_limit};

/// The hits of `request`, best first.
pub(super) async fn search(
    pool: &PgPool,
    request: &SearchRequest,
) -> Result<Vec<SearchHit>, StoreError> {
    let terms = request.query.terms.len();
    let sql = search::search_sql(
        &search::TextIndex {
            from: |n| format!("search_docs d CROSS JOIN to_tsquery('simple', ${n}::text) q"),
            matches: |_| "d.words @@ q".into(),
            score: "ts_rank(d.words, q)",
            newest: "d.seq DESC",
            term_docs: |n, filters| {
                format!(
                    "SELECT d.session_id, d.key AS doc, d.chat, d.turn_id, d.kind \
                     FROM search_docs d LEFT JOIN sessions s ON s.id = d.session_id \
                     WHERE d.words @@ to_tsquery('simple', ${n}::text) {filters} \
                     ORDER BY d.seq DESC LIMIT {}",
                    search::RANKED_WINDOW
                )
            },
            is_piece: "d.session_id = p.session_id AND d.key = p.doc",
        },
        terms,
        super::param,
        |p| super::in_projects("s.project", p),
    );
    // Planned for each query's own words (not a cached generic plan):
    // a word most documents hold is found by walking the newest
    // documents, a rare one through the GIN index.
    let mut statement = sqlx::query_as::<_, SearchHit>(AssertSqlSafe(sql))
        .persistent(false)
        .bind(request.query.tsquery())
        .bind(request.projects.as_deref())
        .bind(request.project.as_deref())
        .bind(request.agent.as_deref())
        .bind(request.state.as_deref())
        .bind(request.since_ms)
        .bind(request.until_ms)
        .bind(clamp_limit(request.limit))
        .bind(i64::from(request.offset));
    if terms > 1 {
        statement = statement.bind(request.query.tsquery_any());
        for term in request.query.tsquery_terms() {
            statement = statement.bind(term);
        }
    }
    Ok(statement.fetch_all(pool).await?)
}
