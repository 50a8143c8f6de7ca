//! `/v1/projects/{project}/retention`: how long a project keeps its settled
//! sessions. Anyone who may see the project reads it; admins set it.

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use tether_protocol::rest::{Problem, Retention, RetentionRequest};
use tether_protocol::validate_name;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::contexts::ProjectPath;
use super::error::ApiError;
use super::extract::{ApiJson, ApiPath};
use crate::AppState;
use crate::auth::Principal;

/// Longest retention, in days (a hundred years).
const MAX_DAYS: u32 = 36_500;

/// The routes of this module.
pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new().routes(routes!(get_retention, set_retention, clear_retention))
}

/// The project, named and visible to the caller (else 404, as if it did
/// not exist).
fn project_of(caller: &Principal, path: &ProjectPath) -> Result<(), ApiError> {
    validate_name("project", &path.project)?;
    if caller.can_see(&path.project) {
        Ok(())
    } else {
        Err(ApiError::not_found(format!(
            "Project {} does not exist.",
            path.project
        )))
    }
}

/// Only admins change how long data is kept.
fn admin(caller: &Principal) -> Result<(), ApiError> {
    if caller.is_admin() {
        Ok(())
    } else {
        Err(ApiError::new(
            StatusCode::FORBIDDEN,
            "forbidden",
            "Only admins set how long a project keeps its sessions.",
        ))
    }
}

/// How long the project keeps its settled sessions.
#[utoipa::path(
    get,
    path = "/v1/projects/{project}/retention",
    tag = "projects",
    params(ProjectPath),
    responses(
        (status = 200, description = "The retention (no `days`: kept for good).", body = Retention),
        (status = 400, description = "Malformed path.", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "A project the caller may not see.", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "Invalid project name.", body = Problem, content_type = "application/problem+json"),
    )
)]
pub async fn get_retention(
    State(state): State<AppState>,
    caller: Principal,
    ApiPath(path): ApiPath<ProjectPath>,
) -> Result<Json<Retention>, ApiError> {
    project_of(&caller, &path)?;
    let days = state.store.retention(&path.project).await?;
    Ok(Json(Retention {
        project: path.project,
        days,
    }))
}

/// Keeps the project's settled sessions `days` days after their last
/// write; older ones are deleted with everything they own (transcript,
/// chats, archived turns, snapshots, attachments, search documents) by the
/// retention round. Live sessions and sessions in use are never deleted.
#[utoipa::path(
    put,
    path = "/v1/projects/{project}/retention",
    tag = "projects",
    params(ProjectPath),
    request_body = RetentionRequest,
    responses(
        (status = 200, description = "Set.", body = Retention),
        (status = 400, description = "Malformed JSON or path.", body = Problem, content_type = "application/problem+json"),
        (status = 403, description = "Not an admin.", body = Problem, content_type = "application/problem+json"),
        (status = 415, description = "The body is not application/json.", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "Days out of range, or an invalid project name.", body = Problem, content_type = "application/problem+json"),
    )
)]
pub async fn set_retention(
    State(state): State<AppState>,
    caller: Principal,
    ApiPath(path): ApiPath<ProjectPath>,
    ApiJson(request): ApiJson<RetentionRequest>,
) -> Result<Json<Retention>, ApiError> {
    project_of(&caller, &path)?;
    admin(&caller)?;
    if !(1..=MAX_DAYS).contains(&request.days) {
        return Err(ApiError::invalid(format!(
            "days must be from 1 to {MAX_DAYS}; got {}.",
            request.days
        )));
    }
    state
        .store
        .set_retention(&path.project, Some(request.days))
        .await?;
    tracing::info!(project = %path.project, days = request.days, by = %caller.sub, "retention set");
    Ok(Json(Retention {
        project: path.project,
        days: Some(request.days),
    }))
}

/// Keeps the project's sessions for good.
#[utoipa::path(
    delete,
    path = "/v1/projects/{project}/retention",
    tag = "projects",
    params(ProjectPath),
    responses(
        (status = 204, description = "Sessions are kept for good."),
        (status = 400, description = "Malformed path.", body = Problem, content_type = "application/problem+json"),
        (status = 403, description = "Not an admin.", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "Invalid project name.", body = Problem, content_type = "application/problem+json"),
    )
)]
pub async fn clear_retention(
    State(state): State<AppState>,
    caller: Principal,
    ApiPath(path): ApiPath<ProjectPath>,
) -> Result<StatusCode, ApiError> {
    project_of(&caller, &path)?;
    admin(&caller)?;
    state.store.set_retention(&path.project, None).await?;
    tracing::info!(project = %path.project, by = %caller.sub, "retention cleared");
    Ok(StatusCode::NO_CONTENT)
}
