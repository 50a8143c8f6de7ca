//! `/v1/projects/{project}/...`: working contexts, with velesdb's rules.

use axum::Json;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use serde::Deserialize;
use tether_protocol::context::{
    LoadedWorkingContext, MAX_CONTEXT_BYTES, SavedWorkingContext, WorkingContext,
    WorkingContextList,
};
use tether_protocol::rest::Problem;
use tether_protocol::validate_name;
use utoipa::IntoParams;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::error::ApiError;
use super::extract::{ApiPath, ApiQuery, decode_object, require_json_content_type};
use crate::AppState;
use crate::auth::Principal;
use crate::engine::contexts::SaveRefusal;

/// The routes of this module.
pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(load, save))
        .routes(routes!(list))
}

/// Path of one working context.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Path)]
pub struct ContextPath {
    /// Project name.
    #[param(min_length = 1, max_length = 128, pattern = "^[A-Za-z0-9._:-]{1,128}$")]
    project: String,
    /// Session name.
    #[param(min_length = 1, max_length = 128, pattern = "^[A-Za-z0-9._:-]{1,128}$")]
    session: String,
}

/// Path of a project.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Path)]
pub struct ProjectPath {
    /// Project name.
    #[param(min_length = 1, max_length = 128, pattern = "^[A-Za-z0-9._:-]{1,128}$")]
    pub project: String,
}

/// Looks a working context up. `otherSessions` lists the project's other
/// saved sessions, most recently saved first, on a hit and on a miss, never
/// the requested one.
#[utoipa::path(
    get,
    path = "/v1/projects/{project}/sessions/{session}/working-context",
    tag = "working context",
    params(ContextPath),
    responses(
        (status = 400, description = "Malformed path.", body = Problem, content_type = "application/problem+json"),
        (status = 200, description = "The lookup (found or not).", body = LoadedWorkingContext),
        (status = 422, description = "Invalid project or session name.", body = Problem, content_type = "application/problem+json"),
    )
)]
pub async fn load(
    State(state): State<AppState>,
    caller: Principal,
    ApiPath(path): ApiPath<ContextPath>,
) -> Result<Json<LoadedWorkingContext>, ApiError> {
    validate_name("project", &path.project)?;
    validate_name("session", &path.session)?;
    visible_project(&caller, &path.project)?;
    Ok(Json(
        state
            .engine
            .load_working_context(&path.project, &path.session)
            .await?,
    ))
}

#[utoipa::path(
    put,
    path = "/v1/projects/{project}/sessions/{session}/working-context",
    tag = "working context",
    params(ContextPath),
    request_body = WorkingContext,
    responses(
        (status = 200, description = "Saved.", body = SavedWorkingContext),
        (status = 400, description = "Malformed JSON or path.", body = Problem, content_type = "application/problem+json"),
        (status = 413, description = "Over 1 MiB.", body = Problem, content_type = "application/problem+json"),
        (status = 415, description = "The body is not application/json.", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "Empty context, a body that is not a working context, or an invalid name.", body = Problem, content_type = "application/problem+json"),
    )
)]
pub async fn save(
    State(state): State<AppState>,
    caller: Principal,
    ApiPath(path): ApiPath<ContextPath>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Json<SavedWorkingContext>, ApiError> {
    validate_name("project", &path.project)?;
    validate_name("session", &path.session)?;
    visible_project(&caller, &path.project)?;
    if !caller.can_write() {
        return Err(ApiError::new(
            StatusCode::FORBIDDEN,
            "forbidden",
            "Viewers cannot save working contexts.",
        ));
    }
    // The raw body, not `ApiJson`, so the size rule is checked before
    // parsing; the JSON rules are the extractor's own.
    require_json_content_type(&headers)?;
    if body.len() > MAX_CONTEXT_BYTES {
        return Err(too_large(body.len()));
    }
    let context: WorkingContext = decode_object(&body)?;
    super::sessions::charge(&state, &caller)?;
    let saved = state
        .engine
        .save_working_context(&path.project, &path.session, &context)
        .await
        .map_err(|refusal| match refusal {
            SaveRefusal::Empty => ApiError::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                "empty_working_context",
                "The working context is empty; saving it would erase the saved one. Send at least a goal or one entry.",
            ),
            SaveRefusal::TooLarge(size) => too_large(size),
            SaveRefusal::Engine(err) => err.into(),
        })?;
    Ok(Json(saved))
}

fn too_large(size: usize) -> ApiError {
    ApiError::new(
        StatusCode::PAYLOAD_TOO_LARGE,
        "working_context_too_large",
        format!(
            "The working context is {size} bytes; at most {MAX_CONTEXT_BYTES} (1 MiB) are allowed."
        ),
    )
}

/// A project's saved working contexts, most recently saved first.
#[utoipa::path(
    get,
    path = "/v1/projects/{project}/working-contexts",
    tag = "working context",
    params(ProjectPath, ListQuery),
    responses(
        (status = 400, description = "Malformed path.", body = Problem, content_type = "application/problem+json"),
        (status = 200, description = "A page of saved sessions (empty when none).", body = WorkingContextList),
        (status = 422, description = "Invalid project name.", body = Problem, content_type = "application/problem+json"),
    )
)]
pub async fn list(
    State(state): State<AppState>,
    caller: Principal,
    ApiPath(path): ApiPath<ProjectPath>,
    ApiQuery(query): ApiQuery<ListQuery>,
) -> Result<Json<WorkingContextList>, ApiError> {
    validate_name("project", &path.project)?;
    visible_project(&caller, &path.project)?;
    let limit = super::extract::bounded_integer("limit", query.limit.as_deref(), 1, 1000)?
        .map_or(100, |n| n as u32);
    Ok(Json(
        state
            .engine
            .working_contexts(&path.project, query.cursor.as_deref(), limit)
            .await?,
    ))
}

/// Query of `GET /v1/projects/{project}/working-contexts`.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct ListQuery {
    /// Page size, 1 to 1000 (default 100).
    #[param(value_type = Option<u32>, minimum = 1, maximum = 1000)]
    limit: Option<String>,
    /// The `nextCursor` of the previous page.
    #[param(min_length = 3, max_length = 160)]
    cursor: Option<String>,
}

fn visible_project(caller: &Principal, project: &str) -> Result<(), ApiError> {
    if caller.can_see(project) {
        Ok(())
    } else {
        Err(ApiError::not_found(format!(
            "Project {project} has no working contexts."
        )))
    }
}
