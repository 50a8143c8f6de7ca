//! Operational endpoints: liveness, readiness.

use axum::Json;
use axum::extract::State;
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

/// Readiness: the store answers. Load balancers should route on this one.
#[utoipa::path(
    get,
    path = "/readyz",
    tag = "operations",
    responses(
        (status = 200, description = "The store answered.", body = Readiness),
        (status = 503, description = "The store cannot be reached.", body = Problem,
         content_type = "application/problem+json"),
    )
)]
pub async fn readyz(State(state): State<AppState>) -> Result<Json<Readiness>, ApiError> {
    state.store.ping().await?;
    let host = state.store.host().await?;
    Ok(Json(Readiness {
        status: "ready".to_owned(),
        backend: state.store.backend().as_str().to_owned(),
        host_epoch: host.epoch.to_string(),
        server_seq: host.last_seq,
    }))
}
