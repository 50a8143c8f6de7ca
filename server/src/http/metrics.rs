//! `GET /metrics`: the server's metrics in the OpenMetrics text format
//! (`telemetry::metrics`), which Prometheus scrapes.

use axum::extract::State;
use axum::http::header;
use axum::response::IntoResponse;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::AppState;
use crate::telemetry::metrics::CONTENT_TYPE;

/// The routes of this module.
pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new().routes(routes!(metrics))
}

/// Counters and gauges in the Prometheus text format.
#[utoipa::path(
    get,
    path = "/metrics",
    tag = "operations",
    responses(
        (status = 200, description = "OpenMetrics text exposition.", body = String,
         content_type = "application/openmetrics-text"),
        (status = 401, description = "With authentication on: no valid token.", body = tether_protocol::rest::Problem,
         content_type = "application/problem+json"),
        (status = 403, description = "A valid token that is neither an admin's nor the metrics token.",
         body = tether_protocol::rest::Problem, content_type = "application/problem+json"),
    )
)]
pub async fn metrics(
    State(state): State<AppState>,
    headers: axum::http::HeaderMap,
) -> Result<impl IntoResponse, crate::http::error::ApiError> {
    state.auth.authorize_metrics(&headers)?;
    let open = state.ws.max_connections.max(1) - state.connections.available_permits();
    state.engine.metrics().connections.set(open as i64);
    state.engine.sample_metrics();
    let ready = !state.draining.is_cancelled() && state.engine.writer_health().is_ok();
    state.engine.metrics().ready.set(i64::from(ready));
    Ok((
        [(header::CONTENT_TYPE, CONTENT_TYPE)],
        state.engine.metrics().encode(),
    ))
}
