//! `/v1/projects/{project}/webhooks`: who a project's events are posted
//! to, and how their deliveries went. Admins, and operators of that
//! project.

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use serde::Deserialize;
use tether_protocol::events::KINDS;
use tether_protocol::rest::{
    DeliveryList, DeliveryView, Problem, WebhookList, WebhookRequest, WebhookView,
};
use tether_protocol::validate_name;
use utoipa::IntoParams;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::contexts::ProjectPath;
use super::error::ApiError;
use super::extract::{ApiJson, ApiPath, ApiQuery, bounded_integer};
use crate::AppState;
use crate::auth::Principal;
use crate::store::rfc3339;
use crate::store::webhooks::{DeliveryRow, Webhook};

/// Webhooks a project may have.
const MAX_WEBHOOKS: usize = 20;
/// Longest webhook URL.
const MAX_URL: usize = 2048;

/// The routes of this module.
pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(list_webhooks, create_webhook))
        .routes(routes!(delete_webhook))
        .routes(routes!(list_deliveries))
}

/// Path of one webhook.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Path)]
pub struct WebhookPath {
    /// Project name.
    #[param(min_length = 1, max_length = 128, pattern = "^[A-Za-z0-9._:-]{1,128}$")]
    project: String,
    /// The webhook's id.
    #[param(min_length = 1, max_length = 64)]
    id: String,
}

/// Query of the deliveries list.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct DeliveriesQuery {
    /// How many, 1 to 500 (default 50).
    #[param(value_type = Option<u32>, minimum = 1, maximum = 500)]
    limit: Option<String>,
}

/// The caller may manage the project's webhooks: it sees the project (else
/// 404, as if it did not exist) and is an operator or admin (else 403).
fn manager(caller: &Principal, project: &str) -> Result<(), ApiError> {
    validate_name("project", project)?;
    if !caller.can_see(project) {
        return Err(ApiError::not_found(format!(
            "Project {project} does not exist."
        )));
    }
    if !caller.can_write() {
        return Err(ApiError::new(
            StatusCode::FORBIDDEN,
            "forbidden",
            "Webhooks are managed by admins and the project's operators.",
        ));
    }
    Ok(())
}

fn view(w: Webhook, with_secret: bool) -> WebhookView {
    WebhookView {
        events: serde_json::from_str(&w.events).unwrap_or_default(),
        secret: with_secret.then_some(w.secret),
        created_at: rfc3339(w.created_ms),
        id: w.id,
        project: w.project,
        url: w.url,
        created_by: w.created_by,
    }
}

/// A new webhook's secret: 32 random bytes as hex (two v4 UUIDs' worth of
/// the system's randomness).
fn new_secret() -> String {
    let bytes = [uuid::Uuid::new_v4(), uuid::Uuid::new_v4()];
    bytes
        .iter()
        .flat_map(|u| u.as_bytes().to_vec())
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// A project's webhooks (without their secrets).
#[utoipa::path(
    get,
    path = "/v1/projects/{project}/webhooks",
    tag = "projects",
    params(ProjectPath),
    responses(
        (status = 200, description = "The webhooks, oldest first.", body = WebhookList),
        (status = 400, description = "Malformed path.", body = Problem, content_type = "application/problem+json"),
        (status = 403, description = "A viewer.", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "A project the caller may not see.", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "Invalid project name.", body = Problem, content_type = "application/problem+json"),
    )
)]
pub async fn list_webhooks(
    State(state): State<AppState>,
    caller: Principal,
    ApiPath(path): ApiPath<ProjectPath>,
) -> Result<Json<WebhookList>, ApiError> {
    manager(&caller, &path.project)?;
    let items = state.store.webhooks(&path.project).await?;
    Ok(Json(WebhookList {
        items: items.into_iter().map(|w| view(w, false)).collect(),
    }))
}

/// Adds a webhook: the project's events (those it names, or all) are
/// posted to its URL as JSON, each with `Tether-Event`, `Tether-Delivery`
/// (the event's id, for deduplication) and `Tether-Signature` (`sha256=`
/// and the hex HMAC-SHA256 of the body with the secret answered here,
/// once), until the receiver answers 2xx; failed attempts are retried with
/// a doubling wait.
#[utoipa::path(
    post,
    path = "/v1/projects/{project}/webhooks",
    tag = "projects",
    params(ProjectPath),
    request_body = WebhookRequest,
    responses(
        (status = 201, description = "Created, with its secret.", body = WebhookView),
        (status = 400, description = "Malformed JSON or path.", body = Problem, content_type = "application/problem+json"),
        (status = 403, description = "A viewer.", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "A project the caller may not see.", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "The project has as many webhooks as it may.", body = Problem, content_type = "application/problem+json"),
        (status = 415, description = "The body is not application/json.", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "A bad URL or event kind (named).", body = Problem, content_type = "application/problem+json"),
    )
)]
pub async fn create_webhook(
    State(state): State<AppState>,
    caller: Principal,
    ApiPath(path): ApiPath<ProjectPath>,
    ApiJson(request): ApiJson<WebhookRequest>,
) -> Result<(StatusCode, Json<WebhookView>), ApiError> {
    manager(&caller, &path.project)?;
    if request.url.len() > MAX_URL {
        return Err(ApiError::invalid(format!(
            "url is longer than {MAX_URL} characters."
        )));
    }
    let url = reqwest::Url::parse(&request.url)
        .map_err(|e| ApiError::invalid(format!("url is not a URL ({e}): {:?}.", request.url)))?;
    if !matches!(url.scheme(), "http" | "https") || url.host().is_none() {
        return Err(ApiError::invalid(format!(
            "url must be an http or https URL with a host; got {:?}.",
            request.url
        )));
    }
    let mut events = Vec::new();
    for kind in &request.events {
        if !KINDS.contains(&kind.as_str()) {
            return Err(ApiError::invalid(format!(
                "events lists {}; got {kind:?}.",
                KINDS.join(", ")
            )));
        }
        if !events.contains(kind) {
            events.push(kind.clone());
        }
    }
    let webhook = Webhook {
        id: uuid::Uuid::new_v4().to_string(),
        project: path.project.clone(),
        url: url.to_string(),
        secret: new_secret(),
        events: serde_json::to_string(&events).unwrap_or_else(|_| "[]".into()),
        created_ms: crate::store::now_ms(),
        created_by: caller.sub.clone(),
    };
    if !state.store.create_webhook(&webhook, MAX_WEBHOOKS).await? {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            "too_many_webhooks",
            format!(
                "Project {} has {MAX_WEBHOOKS} webhooks, as many as it may; remove one first.",
                path.project
            ),
        ));
    }
    tracing::info!(project = %webhook.project, webhook = %webhook.id, by = %caller.sub, "webhook added");
    Ok((StatusCode::CREATED, Json(view(webhook, true))))
}

/// Removes a webhook; its pending deliveries are dropped.
#[utoipa::path(
    delete,
    path = "/v1/projects/{project}/webhooks/{id}",
    tag = "projects",
    params(WebhookPath),
    responses(
        (status = 204, description = "Removed."),
        (status = 400, description = "Malformed path.", body = Problem, content_type = "application/problem+json"),
        (status = 403, description = "A viewer.", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such webhook in a project the caller may see.", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "Invalid project name.", body = Problem, content_type = "application/problem+json"),
    )
)]
pub async fn delete_webhook(
    State(state): State<AppState>,
    caller: Principal,
    ApiPath(path): ApiPath<WebhookPath>,
) -> Result<StatusCode, ApiError> {
    manager(&caller, &path.project)?;
    if !state.store.delete_webhook(&path.project, &path.id).await? {
        return Err(ApiError::not_found(format!(
            "Project {} has no webhook {}.",
            path.project, path.id
        )));
    }
    tracing::info!(project = %path.project, webhook = %path.id, by = %caller.sub, "webhook removed");
    Ok(StatusCode::NO_CONTENT)
}

fn delivery(row: DeliveryRow) -> DeliveryView {
    let state = if row.delivered_ms.is_some() {
        "delivered"
    } else if row.failed_ms.is_some() {
        "failed"
    } else {
        "pending"
    };
    DeliveryView {
        event_id: row.event_id,
        kind: row.kind,
        session_id: row.session_id,
        created_at: rfc3339(row.at_ms),
        state: state.to_owned(),
        attempts: u64::try_from(row.attempts).unwrap_or_default(),
        next_attempt_at: (state == "pending").then(|| rfc3339(row.next_ms)),
        delivered_at: row.delivered_ms.map(rfc3339),
        last_status: row.last_status.and_then(|s| u16::try_from(s).ok()),
        last_error: row.last_error,
    }
}

/// A webhook's latest deliveries, newest first: each event's state,
/// attempts and last error.
#[utoipa::path(
    get,
    path = "/v1/projects/{project}/webhooks/{id}/deliveries",
    tag = "projects",
    params(WebhookPath, DeliveriesQuery),
    responses(
        (status = 200, description = "The deliveries.", body = DeliveryList),
        (status = 400, description = "Malformed query or path.", body = Problem, content_type = "application/problem+json"),
        (status = 403, description = "A viewer.", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such webhook in a project the caller may see.", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "Invalid project name or limit.", body = Problem, content_type = "application/problem+json"),
    )
)]
pub async fn list_deliveries(
    State(state): State<AppState>,
    caller: Principal,
    ApiPath(path): ApiPath<WebhookPath>,
    ApiQuery(query): ApiQuery<DeliveriesQuery>,
) -> Result<Json<DeliveryList>, ApiError> {
    manager(&caller, &path.project)?;
    let known = state.store.webhooks(&path.project).await?;
    if !known.iter().any(|w| w.id == path.id) {
        return Err(ApiError::not_found(format!(
            "Project {} has no webhook {}.",
            path.project, path.id
        )));
    }
    let limit = bounded_integer("limit", query.limit.as_deref(), 1, 500)?.unwrap_or(50) as u32;
    let rows = state.store.deliveries(&path.id, limit).await?;
    Ok(Json(DeliveryList {
        items: rows.into_iter().map(delivery).collect(),
    }))
}
