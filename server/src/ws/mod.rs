//! AHP 1.0 over WebSocket at `GET /ahp`: JSON-RPC 2.0, one message per text
//! frame.
//!
//! Each connection is one task reading requests and hub items in turn and
//! writing its outbound queue to the socket as the socket takes it. The
//! queue is bounded in bytes: a client that cannot keep up is closed with
//! code 4000 and a reason telling it to reconnect and replay, never silently
//! dropped.
//! The hub routes only the channels a connection subscribes to into its
//! inbox; an inbox that overflows is marked lagged and its connection
//! catches up from the store.
//!
//! `queue` holds the outbound queue and its writing, `connection` the loop
//! and delivery, `methods` the AHP methods, `rpc` errors and params.

mod completions;
mod config;
mod connection;
mod frame;
mod from_store;
mod methods;
mod queue;
mod readiness;
mod rpc;

use std::time::Duration;

use axum::Router;
use axum::extract::ws::WebSocketUpgrade;
use axum::extract::{RawQuery, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;

use crate::AppState;
use crate::auth::credentials;
use crate::http::error::{ApiError, problem};
use connection::Connection;

/// WebSocket limits.
#[derive(Debug, Clone)]
pub struct WsLimits {
    /// Largest accepted message, in bytes; larger ones close the connection
    /// with 1009.
    pub max_frame_bytes: usize,
    /// Most channels one connection may subscribe to.
    pub max_subscriptions: usize,
    /// Most simultaneous connections.
    pub max_connections: usize,
    /// Bytes queued for a connection beyond which it is closed as too slow
    /// when it does not drain within 2 s (at once past 4 times this).
    pub max_outbound_bytes: usize,
    /// How often the server pings.
    pub ping_interval: Duration,
    /// Silence (no frame, no pong) after which the connection is closed.
    pub ping_timeout: Duration,
    /// Largest gap `reconnect` replays; beyond it, it answers with snapshots.
    pub max_replay: u32,
    /// Largest replay, in bytes of envelope JSON; beyond it, snapshots.
    /// Clients cap message sizes (the upstream Rust client at 16 MiB).
    pub max_replay_bytes: usize,
}

impl Default for WsLimits {
    fn default() -> Self {
        Self {
            max_frame_bytes: 1024 * 1024,
            max_subscriptions: 1024,
            max_connections: 20_000,
            max_outbound_bytes: 8 * 1024 * 1024,
            ping_interval: Duration::from_secs(30),
            ping_timeout: Duration::from_secs(90),
            max_replay: 10_000,
            max_replay_bytes: 8 * 1024 * 1024,
        }
    }
}

/// Close code for a client that cannot drain its queue.
pub const CLOSE_SLOW_CONSUMER: u16 = 4000;
/// Close code for a client that stopped answering pings.
pub const CLOSE_PING_TIMEOUT: u16 = 4001;
/// Close code after an unsupported protocol version.
pub const CLOSE_UNSUPPORTED_VERSION: u16 = 4002;
/// Close code when the connection's token expires: reconnect with a fresh
/// token and replay from `lastSeenServerSeq`.
pub const CLOSE_TOKEN_EXPIRED: u16 = 4003;
/// Standard close code for an oversize message.
pub const CLOSE_TOO_BIG: u16 = 1009;

/// How long a closing connection waits for the client's close frame.
const CLOSE_LINGER: Duration = Duration::from_secs(2);

/// Dispatches one connection may have waiting for their outcome: enough to
/// fill a group commit, small enough to bound the memory one client holds.
const MAX_INFLIGHT_DISPATCHES: usize = 1024;

/// How many envelopes one catch-up read takes.
const CATCH_UP_PAGE: u32 = 1_000;

/// Hub items a connection takes in one turn of its loop, when that many
/// are waiting: they reach the socket in one write, not one each.
const INBOX_BATCH: usize = 64;

/// The route of this module.
pub fn router() -> Router<AppState> {
    Router::new().route("/ahp", get(upgrade))
}

async fn upgrade(
    State(state): State<AppState>,
    headers: HeaderMap,
    RawQuery(query): RawQuery,
    ws: WebSocketUpgrade,
) -> Response {
    if state.draining.is_cancelled() {
        return problem(
            StatusCode::SERVICE_UNAVAILABLE,
            "shutting_down",
            Some("This host is shutting down; connect to another host.".into()),
        );
    }
    // The token is checked before the upgrade: a refused one is a 401, not
    // a socket. Its query form is never logged (the request span names the
    // route only).
    let principal = match state
        .auth
        .authenticate(credentials::ws_token(&headers, query.as_deref()), "ws")
    {
        Ok(principal) => principal,
        Err(err) => return ApiError::from(err).into_response(),
    };
    let slot = match state.auth.limits.connect(&principal.sub) {
        Ok(slot) => slot,
        Err(limit) => {
            return ApiError::TooMany {
                retry_after_secs: 5,
                detail: format!(
                    "This principal already holds {limit} WebSocket connections, its limit; close \
                     one or retry later."
                ),
            }
            .into_response();
        }
    };
    let Ok(permit) = state.connections.clone().try_acquire_owned() else {
        return problem(
            StatusCode::SERVICE_UNAVAILABLE,
            "too_many_connections",
            Some(format!(
                "This host already serves {} WebSocket connections; try again later.",
                state.ws.max_connections
            )),
        );
    };
    tracing::debug!(sub = %principal.sub, role = %principal.role, "websocket upgrade");
    let limit = state.ws.max_frame_bytes;
    ws.protocols(credentials::WS_PROTOCOLS)
        .max_message_size(limit)
        .max_frame_size(limit)
        .read_buffer_size(READ_CHUNK)
        .on_upgrade(move |socket| {
            let tracker = state.tasks.clone();
            tracker.track_future(Connection::run(socket, state, principal, permit, slot))
        })
        .into_response()
}

/// Bytes read from a socket at a time. The WebSocket codec zero-fills this
/// much before every read and keeps it for the connection's life: its
/// 128 KiB default cost a third of the server's CPU in memset under load and
/// 128 KiB of RSS per idle connection; at 4 KiB the zero-filling was still
/// ~5,600 instructions per ingested action (callgrind, BENCHMARKS.md). A
/// dispatch is a few hundred bytes, so a read rarely holds more than a
/// kilobyte of them; a larger message is still read whole, in several reads.
const READ_CHUNK: usize = 1024;
