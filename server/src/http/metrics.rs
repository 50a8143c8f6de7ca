//! `GET /metrics`: Prometheus text exposition of the engine's counters.

use std::fmt::Write as _;
use std::sync::atomic::Ordering;

use axum::extract::State;
use axum::http::header;
use axum::response::IntoResponse;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::AppState;

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
        (status = 200, description = "Prometheus text exposition.", body = String,
         content_type = "text/plain"),
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
    let m = state.engine.metrics();
    let open = state.ws.max_connections.max(1) - state.connections.available_permits();
    let mut out = String::new();
    let mut line = |name: &str, kind: &str, help: &str, value: u64| {
        let _ = writeln!(
            out,
            "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {value}"
        );
    };
    line(
        "tether_commits_total",
        "counter",
        "Transactions written by the group committer.",
        m.commits.load(Ordering::Relaxed),
    );
    line(
        "tether_committed_envelopes_total",
        "counter",
        "Envelopes in those transactions.",
        m.committed_envelopes.load(Ordering::Relaxed),
    );
    line(
        "tether_rejections_total",
        "counter",
        "Dispatches refused.",
        m.rejections.load(Ordering::Relaxed),
    );
    line(
        "tether_catch_ups_total",
        "counter",
        "Connections that lagged and caught up from the store.",
        m.catch_ups.load(Ordering::Relaxed),
    );
    line(
        "tether_slow_consumer_closes_total",
        "counter",
        "Connections closed because they could not drain.",
        m.slow_closes.load(Ordering::Relaxed),
    );
    line(
        "tether_ws_connections",
        "gauge",
        "Open WebSocket connections.",
        open as u64,
    );
    line(
        "tether_session_actors",
        "gauge",
        "Session actors in memory.",
        state.engine.active_actors() as u64,
    );
    line(
        "tether_server_seq",
        "gauge",
        "Highest serverSeq published by this host.",
        state.engine.hub().published(),
    );
    line(
        "tether_auth_failures_total",
        "counter",
        "Requests and connections refused for a missing or invalid token.",
        state.auth.failures(),
    );
    Ok(([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], out))
}
