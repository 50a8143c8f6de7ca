//! `GET /v1/search`: full-text search over the transcripts of the caller's
//! projects, ranked, with a snippet and the place of each hit.

use axum::Json;
use axum::extract::State;
use serde::Deserialize;
use tether_protocol::rest::{Problem, SearchHit, SearchPage};
use tether_protocol::search::{self, Query};
use tether_protocol::validate_name;
use utoipa::IntoParams;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::error::ApiError;
use super::extract::{ApiQuery, bounded_integer, timestamp};
use crate::AppState;
use crate::auth::Principal;
use crate::store::rfc3339;
use crate::store::search::SearchRequest;

/// Hits per page when the caller names none.
const DEFAULT_PAGE: u32 = 20;
/// Largest page.
const MAX_PAGE: u32 = 100;
/// How deep a caller may page: ranking every match of a common word costs
/// more the deeper the page; narrow the query instead.
const MAX_OFFSET: u64 = 1_000;
/// Snippet width, in characters.
const SNIPPET_WIDTH: usize = 160;

/// The routes of this module.
pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new().routes(routes!(search_transcripts))
}

/// Query of `GET /v1/search`.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct SearchQuery {
    /// What to find: words (all must match, in any order, any case),
    /// `"quoted phrases"` (in order), `prefix*`. Letters and digits of any
    /// script; everything else separates words.
    #[param(min_length = 1, max_length = 512)]
    q: String,
    /// Only this project's sessions.
    #[param(min_length = 1, max_length = 128, pattern = "^[A-Za-z0-9._:-]{1,128}$")]
    project: Option<String>,
    /// Only sessions of this agent.
    #[param(min_length = 1, max_length = 128, pattern = "^[A-Za-z0-9._:-]{1,128}$")]
    agent: Option<String>,
    /// Only sessions in this state.
    #[param(value_type = Option<tether_protocol::projection::SessionLifeState>)]
    state: Option<String>,
    /// Only what was written at or after this time (RFC 3339).
    #[param(value_type = Option<String>, format = DateTime)]
    since: Option<String>,
    /// Only what was written before this time (RFC 3339).
    #[param(value_type = Option<String>, format = DateTime)]
    until: Option<String>,
    /// Hits per page, 1 to 100 (default 20).
    #[param(value_type = Option<u32>, minimum = 1, maximum = 100)]
    limit: Option<String>,
    /// The `nextCursor` of the previous page.
    #[param(min_length = 1, max_length = 4, pattern = "^[0-9]{1,4}$")]
    cursor: Option<String>,
}

/// Searches the transcripts of the caller's projects: titles, messages,
/// answers, tool calls, edited paths and agents' questions. What was
/// committed a moment ago is found, on every host.
#[utoipa::path(
    get,
    path = "/v1/search",
    tag = "sessions",
    params(SearchQuery),
    responses(
        (status = 200, description = "A page of hits, best first.", body = SearchPage),
        (status = 400, description = "Malformed query (`q` missing).", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "No words to search for (a letter or digit of any script), more than 16 terms, or a parameter breaks a rule (it is named).", body = Problem, content_type = "application/problem+json"),
    )
)]
pub async fn search_transcripts(
    State(state): State<AppState>,
    caller: Principal,
    ApiQuery(query): ApiQuery<SearchQuery>,
) -> Result<Json<SearchPage>, ApiError> {
    let parsed = Query::parse(&query.q).map_err(|e| ApiError::invalid(format!("q: {e}.")))?;
    for (name, value) in [("project", &query.project), ("agent", &query.agent)] {
        if let Some(value) = value {
            validate_name(name, value)?;
        }
    }
    if let Some(s) = &query.state
        && !matches!(s.as_str(), "live" | "dormant" | "closed" | "ended")
    {
        return Err(ApiError::invalid(format!(
            "state must be one of live, dormant, closed, ended; got {s:?}."
        )));
    }
    let limit = bounded_integer("limit", query.limit.as_deref(), 1, u64::from(MAX_PAGE))?
        .map_or(DEFAULT_PAGE, |n| n as u32);
    if query.cursor.as_ref().is_some_and(|c| c.len() > 4) {
        return Err(ApiError::invalid(
            "cursor is not one this server issued (1 to 4 digits); pass nextCursor back as is.",
        ));
    }
    let offset = bounded_integer("cursor", query.cursor.as_deref(), 0, MAX_OFFSET)?.unwrap_or(0);
    let request = SearchRequest {
        query: parsed,
        // Only the caller's projects: another project's sessions are absent.
        projects: caller.project_scope(),
        project: query.project.clone(),
        agent: query.agent.clone(),
        state: query.state.clone(),
        since_ms: timestamp("since", query.since.as_deref())?,
        until_ms: timestamp("until", query.until.as_deref())?,
        offset: offset as u32,
        limit: limit + 1,
    };
    let mut found = state.store.search(&request).await?;
    let more = found.len() > limit as usize;
    found.truncate(limit as usize);
    let items = found
        .into_iter()
        .map(|hit| {
            let pieces = request.query.snippet(&hit.body, SNIPPET_WIDTH);
            SearchHit {
                session_id: hit.session_id,
                project: hit.project,
                agent: hit.provider,
                title: hit.title,
                state: hit.state,
                chat: hit.chat,
                turn_id: hit.turn_id,
                kind: hit.kind,
                seq: u64::try_from(hit.seq).unwrap_or_default(),
                at: rfc3339(hit.at_ms),
                snippet: search::plain(&pieces),
                snippet_html: search::html(&pieces),
            }
        })
        .collect();
    let next = offset + u64::from(limit);
    Ok(Json(SearchPage {
        items,
        next_cursor: (more && next <= MAX_OFFSET).then(|| next.to_string()),
    }))
}
