//! Operational endpoints: liveness, readiness.

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use tether_protocol::rest::{Health, Problem, Readiness};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::error::ApiError;
use crate::AppState;

/// The routes of this module.
pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(healthz))
        .routes(routes!(readyz))
}

/// Liveness: the process is up and serving HTTP. Touches nothing else.
#[utoipa::path(
    get,
    path = "/healthz",
    tag = "operations",
    responses((status = 200, description = "The process is up.", body = Health))
)]
pub async fn healthz() -> Json<Health> {
    Json(Health {
        status: "ok".to_owned(),
        version: env!("CARGO_PKG_VERSION").to_owned(),
    })
}

/// Readiness: the host is not shutting down, the store answers and group
/// commits are not failing. Load balancers should route on this one.
#[utoipa::path(
    get,
    path = "/readyz",
    tag = "operations",
    responses(
        (status = 200, description = "The store answered.", body = Readiness),
        (status = 503, description = "Shutting down, the store cannot be reached, or group \
         commits are failing; the detail says which.", body = Problem,
         content_type = "application/problem+json"),
    )
)]
pub async fn readyz(State(state): State<AppState>) -> Result<Json<Readiness>, ApiError> {
    let ready = readiness(&state).await;
    state.engine.metrics().ready.set(i64::from(ready.is_ok()));
    ready
}

/// Longest a readiness probe waits for the store.
/// (Under a load balancer's check timeout; long enough for a busy pool to
/// hand out a connection.)
const PROBE_LIMIT: std::time::Duration = std::time::Duration::from_secs(2);

async fn readiness(state: &AppState) -> Result<Json<Readiness>, ApiError> {
    if state.draining.is_cancelled() {
        return Err(ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "shutting_down",
            "The server is shutting down; connect to another host.",
        ));
    }
    if !state.engine.holds_its_leases() {
        return Err(ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "store_unavailable",
            "This host has not reached the database for a lease time; other hosts may be \
             serving its sessions. Connect to another host.",
        ));
    }
    // However the database connection hangs (a partition), the answer
    // comes within a second: a load balancer's check must not wait.
    let stalled = || {
        ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "store_unavailable",
            format!(
                "The store did not answer within {} ms.",
                PROBE_LIMIT.as_millis()
            ),
        )
    };
    tokio::time::timeout(PROBE_LIMIT, state.store.ping())
        .await
        .map_err(|_| stalled())??;
    state.engine.writer_health().map_err(|err| {
        ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "store_unavailable",
            format!("Storage is refusing writes: {err}."),
        )
    })?;
    let host = tokio::time::timeout(PROBE_LIMIT, state.store.host())
        .await
        .map_err(|_| stalled())??;
    Ok(Json(Readiness {
        status: "ready".to_owned(),
        backend: state.store.backend().as_str().to_owned(),
        host_epoch: host.epoch.to_string(),
        server_seq: host.last_seq,
    }))
}
