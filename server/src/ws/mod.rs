//! AHP 1.0 over WebSocket at `GET /ahp`: JSON-RPC 2.0, one message per text
//! frame.
//!
//! Each connection is one task reading requests and hub items in turn, plus
//! a writer task draining its outbound queue to the socket. The queue is
//! bounded in bytes: a client that cannot keep up is closed with code 4000
//! and a reason telling it to reconnect and replay, never silently dropped.
//! The hub routes only the channels a connection subscribes to into its
//! inbox; an inbox that overflows is marked lagged and its connection
//! catches up from the store.
//!
//! Delivery bookkeeping: each subscription remembers the seq its subscriber
//! already has everything up to (its snapshot's, its replay's, then each
//! envelope's) and the hub seq it was routed at; it gets exactly the
//! envelopes above the first, from the store up to the second and from the
//! inbox after it.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use ahp_types::errors::{ahp_error_codes, json_rpc_error_codes};
use axum::Router;
use axum::extract::State;
use axum::extract::ws::{CloseFrame, Message, Utf8Bytes, WebSocket, WebSocketUpgrade};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use futures_util::{SinkExt, StreamExt};
use serde_json::{Value, json};
use tether_protocol::channel::Channel;
use tether_protocol::view::SessionView;
use tokio::sync::{OwnedSemaphorePermit, mpsc};

use crate::AppState;
use crate::auth::Principal;
use crate::engine::fanout::{HubItem, Routing, action_frame, envelope_text};
use crate::engine::{CreateSession, DispatchOutcome, Engine, EngineError, summary};
use crate::http::error::problem;
use crate::store::{Origin, SessionFilter};

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
/// Standard close code for an oversize message.
pub const CLOSE_TOO_BIG: u16 = 1009;

/// How long a closing connection waits for the client's close frame.
const CLOSE_LINGER: Duration = Duration::from_secs(2);

/// Dispatches one connection may have waiting for their outcome: enough to
/// fill a group commit, small enough to bound the memory one client holds.
const MAX_INFLIGHT_DISPATCHES: usize = 1024;

/// How many envelopes one catch-up read takes.
const CATCH_UP_PAGE: u32 = 1_000;

/// The route of this module.
pub fn router() -> Router<AppState> {
    Router::new().route("/ahp", get(upgrade))
}

async fn upgrade(State(state): State<AppState>, ws: WebSocketUpgrade) -> Response {
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
    let limit = state.ws.max_frame_bytes;
    ws.max_message_size(limit)
        .max_frame_size(limit)
        .read_buffer_size(READ_CHUNK)
        .on_upgrade(move |socket| {
            let tracker = state.tasks.clone();
            tracker.track_future(Connection::run(socket, state, permit))
        })
        .into_response()
}

/// Bytes read from a socket at a time. The WebSocket codec zero-fills this
/// much before every read and keeps it for the connection's life: its
/// 128 KiB default cost a third of the server's CPU in memset under load and
/// 128 KiB of RSS per idle connection. Client messages are small; a larger
/// one is still read whole, in several reads.
const READ_CHUNK: usize = 4 * 1024;

enum Outbound {
    Frame(Utf8Bytes),
    Ping,
    Close(u16, String),
}

/// How long a connection's queue may stay over its byte limit before the
/// connection counts as unable to drain. A group commit can publish a burst
/// larger than the limit at once; a client that keeps reading drains it well
/// within this time, one that does not read never does.
const DRAIN_GRACE: Duration = Duration::from_secs(2);

/// Past this many times the limit the connection is closed at once.
const HARD_LIMIT_FACTOR: usize = 4;

/// What the connection task and its writer share about the queue.
struct Backlog {
    bytes: AtomicUsize,
    /// Milliseconds after `epoch` when the queue went over the limit; 0 when
    /// it is under it.
    over_since: std::sync::atomic::AtomicU64,
    epoch: Instant,
    limit: usize,
}

impl Backlog {
    fn now_ms(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_millis())
            .unwrap_or(u64::MAX)
            .max(1)
    }

    fn drained(&self, size: usize) {
        let left = self
            .bytes
            .fetch_sub(size, Ordering::AcqRel)
            .saturating_sub(size);
        if left <= self.limit {
            self.over_since.store(0, Ordering::Release);
        }
    }
}

/// The sending half: a queue bounded in bytes, drained by the writer task.
struct Queue {
    sender: mpsc::UnboundedSender<Outbound>,
    backlog: Arc<Backlog>,
}

impl Queue {
    /// Queues a frame of the live stream; `false` when the client is not
    /// draining: the queue has been over its byte limit for longer than
    /// [`DRAIN_GRACE`], or is over [`HARD_LIMIT_FACTOR`] times it.
    fn push(&self, frame: Utf8Bytes) -> bool {
        let backlog = &self.backlog;
        let size = frame.len();
        let queued = backlog.bytes.fetch_add(size, Ordering::AcqRel) + size;
        let _ = self.sender.send(Outbound::Frame(frame));
        if queued <= backlog.limit {
            return true;
        }
        if queued > backlog.limit.saturating_mul(HARD_LIMIT_FACTOR) {
            return false;
        }
        let now = backlog.now_ms();
        match backlog
            .over_since
            .compare_exchange(0, now, Ordering::AcqRel, Ordering::Acquire)
        {
            Ok(_) => true,
            Err(since) => now.saturating_sub(since) <= DRAIN_GRACE.as_millis() as u64,
        }
    }

    /// Queues an answer to the client's own request. Answers are bounded by
    /// their own limits (replay size), not by the live-stream allowance, or a
    /// large replay could never be delivered.
    fn reply(&self, frame: Utf8Bytes) {
        self.backlog.bytes.fetch_add(frame.len(), Ordering::AcqRel);
        let _ = self.sender.send(Outbound::Frame(frame));
    }

    fn control(&self, message: Outbound) {
        let _ = self.sender.send(message);
    }
}

async fn write_loop(
    mut sink: futures_util::stream::SplitSink<WebSocket, Message>,
    mut receiver: mpsc::UnboundedReceiver<Outbound>,
    backlog: Arc<Backlog>,
) {
    while let Some(first) = receiver.recv().await {
        let mut next = Some(first);
        // Feed everything queued, then flush once.
        while let Some(item) = next {
            let sent = match item {
                Outbound::Frame(frame) => {
                    let size = frame.len();
                    let result = sink.feed(Message::Text(frame)).await;
                    backlog.drained(size);
                    result
                }
                Outbound::Ping => sink.feed(Message::Ping(Default::default())).await,
                Outbound::Close(code, reason) => {
                    let frame = CloseFrame {
                        code,
                        reason: reason.into(),
                    };
                    let _ = sink.send(Message::Close(Some(frame))).await;
                    let _ = sink.close().await;
                    return;
                }
            };
            if sent.is_err() {
                return;
            }
            next = receiver.try_recv().ok();
        }
        if sink.flush().await.is_err() {
            return;
        }
    }
}

struct Connection {
    engine: Engine,
    limits: crate::ws::WsLimits,
    principal: Principal,
    queue: Queue,
    client_id: Option<String>,
    /// Channel → the seq its subscriber already has everything up to.
    subscriptions: HashMap<String, Subscription>,
    /// Which channels the hub routes to this connection.
    routing: Routing,
    closing: bool,
    /// Subscriptions opened by the current request whose gap between
    /// snapshot and cursor is sent from the store after the reply.
    after_reply: Vec<String>,
    /// Where pipelined dispatch outcomes come back.
    answers: mpsc::UnboundedSender<Answered>,
    /// Permits for dispatches awaiting their outcome.
    inflight: Arc<tokio::sync::Semaphore>,
}

/// A dispatch's outcome on its way back to the connection that sent it.
struct Answered {
    channel: String,
    action: Value,
    origin: Origin,
    /// The hub seq its channel was routed here at, if it was subscribed
    /// when the dispatch was submitted: a fresh commit is above it and
    /// reaches the subscriber through the inbox.
    routed_at: Option<u64>,
    outcome: DispatchOutcome,
    /// The JSON-RPC id when it was sent as a request.
    id: Option<Value>,
}

/// A subscription's delivery state.
#[derive(Debug, Clone, Copy)]
struct Subscription {
    /// The subscriber has every envelope of the channel up to this seq.
    after: u64,
    /// The hub seq the channel was routed to this connection at: envelopes
    /// above it arrive in the inbox, those at or below it come from the store.
    routed_at: u64,
}

/// A successful answer.
enum Reply {
    /// A value to serialise.
    Json(Value),
    /// Result JSON already rendered.
    Raw(String),
}

/// What handling one message decided.
enum Next {
    Continue,
    Close(u16, String),
}

impl Connection {
    async fn run(socket: WebSocket, state: AppState, _permit: OwnedSemaphorePermit) {
        let (sink, mut stream) = socket.split();
        let (sender, receiver) = mpsc::unbounded_channel();
        let backlog = Arc::new(Backlog {
            bytes: AtomicUsize::new(0),
            over_since: std::sync::atomic::AtomicU64::new(0),
            epoch: Instant::now(),
            limit: state.ws.max_outbound_bytes,
        });
        let writer = tokio::spawn(write_loop(sink, receiver, backlog.clone()));
        let (routing, mut inbox) = state.engine.hub().subscribe();
        let lag = inbox.lag_signal();
        let (answers, mut answered) = mpsc::unbounded_channel();
        let mut connection = Connection {
            engine: state.engine.clone(),
            limits: state.ws.clone(),
            principal: Principal::loopback_admin(),
            queue: Queue { sender, backlog },
            client_id: None,
            subscriptions: HashMap::new(),
            routing,
            closing: false,
            after_reply: Vec::new(),
            answers,
            inflight: Arc::new(tokio::sync::Semaphore::new(MAX_INFLIGHT_DISPATCHES)),
        };
        let mut ping = tokio::time::interval(state.ws.ping_interval);
        ping.tick().await;
        let mut last_heard = Instant::now();
        let shutdown = state.shutdown.clone();
        let verdict = loop {
            let next = tokio::select! {
                incoming = stream.next() => match incoming {
                    Some(Ok(Message::Text(text))) => {
                        last_heard = Instant::now();
                        connection.on_text(text.as_str()).await
                    }
                    Some(Ok(Message::Binary(_))) => {
                        last_heard = Instant::now();
                        connection.send_error(Value::Null, json_rpc_error_codes::INVALID_REQUEST,
                            "AHP messages are JSON text frames, not binary frames.", None);
                        Next::Continue
                    }
                    Some(Ok(Message::Ping(_) | Message::Pong(_))) => {
                        last_heard = Instant::now();
                        Next::Continue
                    }
                    Some(Ok(Message::Close(_))) | None => break None,
                    Some(Err(err)) => {
                        let text = err.to_string();
                        if text.contains("too long") || text.contains("too big") || text.contains("Space limit") {
                            Next::Close(CLOSE_TOO_BIG, format!(
                                "message too big: the limit is {} bytes", connection.limits.max_frame_bytes))
                        } else {
                            tracing::debug!(error = %text, "websocket read failed");
                            break None;
                        }
                    }
                },
                Some(item) = inbox.recv() => connection.on_hub(item),
                () = lag.lagged() => connection.catch_up_all().await,
                Some(reply) = answered.recv() => connection.on_answer(reply),
                _ = ping.tick() => {
                    if last_heard.elapsed() > connection.limits.ping_timeout {
                        Next::Close(CLOSE_PING_TIMEOUT, "ping timeout: no frame or pong received in time".into())
                    } else {
                        connection.queue.control(Outbound::Ping);
                        Next::Continue
                    }
                }
                () = shutdown.cancelled() => Next::Close(1001, "server shutting down".into()),
            };
            match next {
                Next::Continue if connection.closing => {
                    break Some((
                        CLOSE_UNSUPPORTED_VERSION,
                        "unsupported protocol version".to_owned(),
                    ));
                }
                Next::Continue => {}
                Next::Close(code, reason) => break Some((code, reason)),
            }
        };
        if let Some((code, reason)) = verdict {
            tracing::info!(code, %reason, client = ?connection.client_id, "closing connection");
            connection.queue.control(Outbound::Close(code, reason));
            // The closing handshake: keep reading (and discarding) until the
            // client answers with its own close, so it reads our close frame
            // instead of a reset connection. Bounded.
            let _ = tokio::time::timeout(CLOSE_LINGER, async {
                while let Some(Ok(message)) = stream.next().await {
                    if matches!(message, Message::Close(_)) {
                        break;
                    }
                }
            })
            .await;
        }
        drop(connection);
        let _ = writer.await;
    }

    fn send(&self, frame: String) -> Next {
        self.queue.reply(frame.into());
        Next::Continue
    }

    /// The verdict for a connection whose queue is over its byte limit.
    fn overflow(&self) -> Next {
        self.engine
            .metrics()
            .slow_closes
            .fetch_add(1, Ordering::Relaxed);
        Next::Close(
            CLOSE_SLOW_CONSUMER,
            format!(
                "slow consumer: more than {} bytes queued; reconnect and replay from your \
                 lastSeenServerSeq",
                self.limits.max_outbound_bytes
            ),
        )
    }

    fn send_result(&self, id: Value, result: Value) -> Next {
        self.send(json!({"jsonrpc": "2.0", "id": id, "result": result}).to_string())
    }

    fn send_error(&self, id: Value, code: i32, message: &str, data: Option<Value>) -> Next {
        let mut error = json!({"code": code, "message": message});
        if let Some(data) = data {
            error["data"] = data;
        }
        self.send(json!({"jsonrpc": "2.0", "id": id, "error": error}).to_string())
    }

    fn on_hub(&mut self, item: HubItem) -> Next {
        match item {
            HubItem::Envelope(published) => match self.subscriptions.get_mut(&published.channel) {
                Some(subscription) if published.seq > subscription.after => {
                    subscription.after = published.seq;
                    if self.queue.push(published.frame.clone()) {
                        Next::Continue
                    } else {
                        self.overflow()
                    }
                }
                _ => Next::Continue,
            },
            HubItem::Notice { channel, frame } => {
                if self.subscriptions.contains_key(&*channel) && !self.queue.push(frame) {
                    return self.overflow();
                }
                Next::Continue
            }
        }
    }

    /// After the inbox dropped items: delivers, from the store, every
    /// envelope of the subscribed channels their subscriptions do not have,
    /// up to what the store holds now.
    async fn catch_up_all(&mut self) -> Next {
        tracing::debug!("connection lagged behind the hub; catching up from the store");
        self.engine
            .metrics()
            .catch_ups
            .fetch_add(1, Ordering::Relaxed);
        let Ok(host) = self.engine.store().host().await else {
            return Next::Close(1011, "storage unavailable; reconnect".into());
        };
        let channels: Vec<String> = self.subscriptions.keys().cloned().collect();
        let from = self
            .subscriptions
            .values()
            .map(|s| s.after)
            .min()
            .unwrap_or(host.last_seq);
        self.deliver_from_store(&channels, from, host.last_seq)
            .await
    }

    /// Sends stored envelopes of `channels` in `(after, upto]` that their
    /// subscriptions do not have yet.
    async fn deliver_from_store(&mut self, channels: &[String], after: u64, upto: u64) -> Next {
        let mut after = after;
        while after < upto && !channels.is_empty() {
            let page = match self
                .engine
                .store()
                .read_after(after, Some(channels), CATCH_UP_PAGE)
                .await
            {
                Ok(page) => page,
                Err(_) => return Next::Close(1011, "storage unavailable; reconnect".into()),
            };
            let Some(last) = page.last() else { break };
            after = last.seq;
            for envelope in page.iter().filter(|e| e.seq <= upto) {
                let wanted = self
                    .subscriptions
                    .get(&envelope.channel)
                    .is_some_and(|have| envelope.seq > have.after);
                if wanted {
                    let frame = action_frame(
                        envelope.seq,
                        &envelope.channel,
                        &envelope.action,
                        envelope.origin.as_ref(),
                        None,
                    );
                    if !self.queue.push(frame.into()) {
                        return self.overflow();
                    }
                }
            }
        }
        for channel in channels {
            if let Some(have) = self.subscriptions.get_mut(channel) {
                have.after = have.after.max(upto);
            }
        }
        Next::Continue
    }

    async fn on_text(&mut self, text: &str) -> Next {
        let message: Value = match serde_json::from_str(text) {
            Ok(message) => message,
            Err(err) => {
                return self.send_error(
                    Value::Null,
                    json_rpc_error_codes::PARSE_ERROR,
                    &format!("Malformed JSON: {err}."),
                    None,
                );
            }
        };
        let id = message.get("id").cloned();
        let Some(method) = message.get("method").and_then(Value::as_str) else {
            return self.send_error(
                id.unwrap_or(Value::Null),
                json_rpc_error_codes::INVALID_REQUEST,
                "A JSON-RPC 2.0 request or notification needs a \"method\".",
                None,
            );
        };
        let params = message.get("params").cloned().unwrap_or(Value::Null);
        let method = method.to_owned();
        if self.client_id.is_none()
            && !matches!(method.as_str(), "initialize" | "reconnect" | "ping")
        {
            return match id {
                Some(id) => self.send_error(
                    id,
                    json_rpc_error_codes::INVALID_REQUEST,
                    "Send initialize (or reconnect) first.",
                    None,
                ),
                None => Next::Continue,
            };
        }
        let result = match method.as_str() {
            "reconnect" => self.reconnect(params).await,
            other => match self.call(other, params, &id).await {
                Ok(Some(value)) => Ok(Reply::Json(value)),
                // A dispatch: answered when its outcome arrives (requests)
                // or never (notifications).
                Ok(None) => return Next::Continue,
                Err(err) => Err(err),
            },
        };
        // Notifications (no id) get no answer, errors included.
        let Some(id) = id else {
            return self.bridge().await;
        };
        let next = match result {
            Ok(Reply::Json(value)) => self.send_result(id, value),
            Ok(Reply::Raw(result)) => self.send(format!(
                r#"{{"jsonrpc":"2.0","id":{id},"result":{result}}}"#
            )),
            Err(err) => {
                let closing = err.code == ahp_error_codes::UNSUPPORTED_PROTOCOL_VERSION;
                let next = self.send_error(id, err.code, &err.message, err.data);
                if closing {
                    self.closing = true;
                }
                next
            }
        };
        match next {
            Next::Continue => self.bridge().await,
            close => close,
        }
    }

    /// Runs one method other than `reconnect`; `None` for a dispatch, which
    /// is answered later (see [`Connection::on_answer`]).
    async fn call(
        &mut self,
        method: &str,
        params: Value,
        id: &Option<Value>,
    ) -> Result<Option<Value>, RpcError> {
        if method == "dispatchAction" {
            return self.dispatch(params, id.clone()).await.map(|()| None);
        }
        let value = match method {
            "initialize" => self.initialize(params).await,
            "subscribe" => self.subscribe(params).await,
            "unsubscribe" => {
                if let Some(channel) = params.get("channel").and_then(Value::as_str) {
                    self.subscriptions.remove(channel);
                    self.routing.unroute(channel);
                }
                Ok(Value::Null)
            }
            "createSession" => self.create_session(params).await,
            "disposeSession" => self.dispose_session(params).await,
            "listSessions" => self.list_sessions(params).await,
            "createChat" => self.create_chat(params).await,
            "ping" => Ok(Value::Null),
            other => Err(RpcError::new(
                json_rpc_error_codes::METHOD_NOT_FOUND,
                format!("Unknown method {other:?}."),
            )),
        };
        value.map(Some)
    }

    /// Sends, from the store, what subscriptions opened by the last request
    /// need between their snapshot and the hub seq they were routed at:
    /// envelopes published before the route existed.
    async fn bridge(&mut self) -> Next {
        for channel in std::mem::take(&mut self.after_reply) {
            let Some(subscription) = self.subscriptions.get(&channel).copied() else {
                continue;
            };
            if subscription.after < subscription.routed_at
                && let Next::Close(code, reason) = self
                    .deliver_from_store(&[channel], subscription.after, subscription.routed_at)
                    .await
            {
                return Next::Close(code, reason);
            }
        }
        Next::Continue
    }

    fn client_id_param(params: &Value) -> Result<String, RpcError> {
        params
            .get("clientId")
            .and_then(Value::as_str)
            .filter(|c| !c.is_empty() && c.len() <= 256)
            .map(str::to_owned)
            .ok_or_else(|| RpcError::invalid("params.clientId (1 to 256 characters) is required."))
    }

    fn u64_param(params: &Value, name: &str) -> Result<u64, RpcError> {
        params.get(name).and_then(Value::as_u64).ok_or_else(|| {
            RpcError::invalid(&format!(
                "params.{name} (a non-negative integer) is required."
            ))
        })
    }

    fn channel_param(params: &Value) -> Result<String, RpcError> {
        params
            .get("channel")
            .and_then(Value::as_str)
            .map(str::to_owned)
            .ok_or_else(|| RpcError::invalid("params.channel (a channel URI) is required."))
    }

    async fn initialize(&mut self, params: Value) -> Result<Value, RpcError> {
        let offered: Vec<String> = params
            .get("protocolVersions")
            .cloned()
            .and_then(|v| serde_json::from_value(v).ok())
            .ok_or_else(|| {
                RpcError::invalid("params.protocolVersions (an array of strings) is required.")
            })?;
        let client_id = Self::client_id_param(&params)?;
        let version = match ahp_types::negotiate_protocol_version(&offered) {
            Ok(Some(version)) => version.to_owned(),
            Ok(None) => {
                return Err(RpcError {
                    code: ahp_error_codes::UNSUPPORTED_PROTOCOL_VERSION,
                    message: format!(
                        "None of the offered protocol versions {offered:?} is supported."
                    ),
                    data: Some(
                        json!({"supportedVersions": ahp_types::SUPPORTED_PROTOCOL_VERSIONS}),
                    ),
                });
            }
            Err(err) => return Err(RpcError::invalid(&format!("Bad protocol version: {err}."))),
        };
        self.client_id = Some(client_id);
        let server_seq = self.engine.hub().published();
        let mut snapshots = Vec::new();
        let initial: Vec<String> = params
            .get("initialSubscriptions")
            .cloned()
            .and_then(|v| serde_json::from_value(v).ok())
            .unwrap_or_default();
        for channel in initial {
            snapshots.push(self.open_subscription(&channel).await?);
        }
        let host = self
            .engine
            .store()
            .host()
            .await
            .map_err(RpcError::unavailable)?;
        Ok(json!({
            "protocolVersion": version,
            "serverSeq": server_seq,
            "serverInfo": {"name": "tether", "version": env!("CARGO_PKG_VERSION")},
            "snapshots": snapshots,
            "_meta": {"tether/hostEpoch": host.epoch.to_string()},
        }))
    }

    /// Takes a channel's snapshot and registers the subscription; the gap
    /// up to the cursor is bridged after the reply.
    async fn open_subscription(&mut self, channel: &str) -> Result<Value, RpcError> {
        if !self.subscriptions.contains_key(channel)
            && self.subscriptions.len() >= self.limits.max_subscriptions
        {
            return Err(RpcError::invalid(&format!(
                "This connection already has {} subscriptions, the limit; unsubscribe from one first.",
                self.limits.max_subscriptions
            )));
        }
        let snapshot = self
            .engine
            .snapshot(&self.principal, channel)
            .await
            .map_err(RpcError::from)?;
        // Routed after the snapshot succeeded: envelopes published between
        // the two arrive in the inbox and are skipped as covered.
        let routed_at = self.routing.route(channel);
        self.subscriptions.insert(
            channel.to_owned(),
            Subscription {
                after: snapshot.from_seq,
                routed_at,
            },
        );
        self.after_reply.push(channel.to_owned());
        Ok(
            json!({"resource": snapshot.resource, "state": snapshot.state, "fromSeq": snapshot.from_seq}),
        )
    }

    async fn subscribe(&mut self, params: Value) -> Result<Value, RpcError> {
        let channel = Self::channel_param(&params)?;
        let snapshot = self.open_subscription(&channel).await?;
        Ok(json!({"snapshot": snapshot}))
    }

    async fn reconnect(&mut self, params: Value) -> Result<Reply, RpcError> {
        let client_id = Self::client_id_param(&params)?;
        let last_seen = Self::u64_param(&params, "lastSeenServerSeq")?;
        let wanted: Vec<String> = params
            .get("subscriptions")
            .cloned()
            .and_then(|v| serde_json::from_value(v).ok())
            .ok_or_else(|| {
                RpcError::invalid("params.subscriptions (an array of channel URIs) is required.")
            })?;
        if wanted.len() > self.limits.max_subscriptions {
            return Err(RpcError::invalid(&format!(
                "At most {} subscriptions per connection.",
                self.limits.max_subscriptions
            )));
        }
        self.client_id = Some(client_id);
        let mut present = Vec::new();
        let mut missing = Vec::new();
        for channel in wanted {
            if self.engine.visible(&self.principal, &channel).await {
                present.push(channel);
            } else {
                missing.push(channel);
            }
        }
        // Routed first, then the store is read: everything up to `horizon`
        // comes from the store, the inbox brings what is above it (a seq is
        // published only after it is committed, so `horizon` is at least
        // every route's seq).
        let routed: Vec<(String, u64)> = present
            .iter()
            .map(|channel| (channel.clone(), self.routing.route(channel)))
            .collect();
        let host = self
            .engine
            .store()
            .host()
            .await
            .map_err(RpcError::unavailable)?;
        let horizon = host.last_seq;
        let limit = self.limits.max_replay;
        let mut bytes = 0;
        let mut actions = Vec::new();
        let mut after = last_seen;
        let mut too_many = false;
        while after < horizon && !present.is_empty() {
            let page = self
                .engine
                .store()
                .read_after(after, Some(&present), CATCH_UP_PAGE)
                .await
                .map_err(RpcError::unavailable)?;
            let Some(last) = page.last() else { break };
            after = last.seq;
            for envelope in page.iter().filter(|e| e.seq <= horizon) {
                let text = envelope_text(
                    envelope.seq,
                    &envelope.channel,
                    &envelope.action,
                    envelope.origin.as_ref(),
                    None,
                );
                bytes += text.len() + 1;
                actions.push(text);
            }
            if actions.len() > limit as usize || bytes > self.limits.max_replay_bytes {
                too_many = true;
                break;
            }
        }
        if too_many {
            let mut snapshots = Vec::new();
            for channel in &present {
                snapshots.push(self.open_subscription(channel).await?);
            }
            return Ok(Reply::Json(
                json!({"type": "snapshot", "snapshots": snapshots}),
            ));
        }
        for (channel, routed_at) in routed {
            self.subscriptions.insert(
                channel,
                Subscription {
                    after: horizon,
                    routed_at,
                },
            );
        }
        // Rendered as text around the stored actions: a large replay is
        // never parsed into a value tree and serialised again.
        let missing = serde_json::to_string(&missing).unwrap_or_else(|_| "[]".into());
        Ok(Reply::Raw(format!(
            r#"{{"type":"replay","actions":[{}],"missing":{missing}}}"#,
            actions.join(",")
        )))
    }

    /// Submits a dispatch in order and returns at once; its outcome comes
    /// back through `answers` (see [`Connection::on_answer`]), so a client's
    /// dispatches are pipelined instead of one commit per round trip.
    async fn dispatch(&mut self, params: Value, id: Option<Value>) -> Result<(), RpcError> {
        let channel = Self::channel_param(&params)?;
        let client_seq = Self::u64_param(&params, "clientSeq")?;
        let action = params
            .get("action")
            .cloned()
            .filter(Value::is_object)
            .ok_or_else(|| RpcError::invalid("params.action (an action object) is required."))?;
        let origin = Origin {
            client_id: self.client_id.clone().unwrap_or_default(),
            client_seq,
        };
        // Bounded: past this many unanswered dispatches the connection stops
        // reading until one is answered.
        let permit = self
            .inflight
            .clone()
            .acquire_owned()
            .await
            .map_err(|_| RpcError::unavailable("connection closing"))?;
        let submitted = self
            .engine
            .submit(
                &self.principal,
                Some(origin.clone()),
                &channel,
                action.clone(),
            )
            .await;
        let answers = self.answers.clone();
        let routed_at = self.subscriptions.get(&channel).map(|s| s.routed_at);
        tokio::spawn(async move {
            let outcome = submitted.outcome().await;
            drop(permit);
            let _ = answers.send(Answered {
                channel,
                action,
                origin,
                routed_at,
                outcome,
                id,
            });
        });
        Ok(())
    }

    /// Delivers a dispatch's outcome to its sender.
    fn on_answer(&mut self, answered: Answered) -> Next {
        let next = match answered.outcome {
            DispatchOutcome::Accepted(published) => {
                // A subscriber gets its echo from the hub, in seq order; a
                // retry of an old envelope, or a client not subscribed to
                // the channel, gets the original envelope directly.
                let via_hub = self.subscriptions.contains_key(&published.channel)
                    && answered.routed_at.is_some_and(|at| published.seq > at);
                if via_hub || self.queue.push(published.frame.clone()) {
                    Next::Continue
                } else {
                    self.overflow()
                }
            }
            DispatchOutcome::Rejected(refusal) => {
                let frame = action_frame(
                    self.engine.hub().published(),
                    &answered.channel,
                    &answered.action.to_string(),
                    Some(&answered.origin),
                    Some(&refusal.reason),
                );
                self.send(frame)
            }
        };
        match (next, answered.id) {
            (Next::Continue, Some(id)) => self.send_result(id, Value::Null),
            (next, _) => next,
        }
    }

    fn session_param(params: &Value) -> Result<String, RpcError> {
        match Channel::parse(&Self::channel_param(params)?) {
            Ok(Channel::Session(id)) => Ok(id),
            Ok(_) => Err(RpcError::invalid(
                "params.channel must be an ahp-session:/<id> URI.",
            )),
            Err(err) => Err(RpcError::invalid(&format!("{err}."))),
        }
    }

    async fn create_session(&mut self, params: Value) -> Result<Value, RpcError> {
        let id = Self::session_param(&params)?;
        let text_list = |key: &str| -> Result<Vec<String>, RpcError> {
            match params.get(key) {
                None | Some(Value::Null) => Ok(Vec::new()),
                Some(value) => serde_json::from_value(value.clone()).map_err(|_| {
                    RpcError::invalid(&format!("params.{key} must be an array of URIs."))
                }),
            }
        };
        let request = CreateSession {
            id,
            project: params
                .pointer("/_meta/tether~1project")
                .and_then(Value::as_str)
                .unwrap_or("default")
                .to_owned(),
            provider: params
                .get("provider")
                .and_then(Value::as_str)
                .map(str::to_owned),
            working_directories: text_list("workingDirectories")?,
            title: None,
            active_client: params.get("activeClient").cloned().filter(|v| !v.is_null()),
        };
        self.engine
            .create_session(&self.principal, request)
            .await
            .map_err(RpcError::from)?;
        Ok(Value::Null)
    }

    async fn dispose_session(&mut self, params: Value) -> Result<Value, RpcError> {
        let id = Self::session_param(&params)?;
        self.engine
            .dispose_session(&self.principal, &id)
            .await
            .map_err(RpcError::from)?;
        Ok(Value::Null)
    }

    async fn list_sessions(&mut self, params: Value) -> Result<Value, RpcError> {
        let limit = params
            .get("limit")
            .and_then(Value::as_u64)
            .unwrap_or(100)
            .clamp(1, 1000);
        let before = match params.get("cursor").and_then(Value::as_str) {
            None => None,
            Some(cursor) => Some(cursor.parse::<u64>().map_err(|_| {
                RpcError::invalid("params.cursor is not a cursor this host issued.")
            })?),
        };
        let page = self
            .engine
            .store()
            .sessions(&SessionFilter::default(), before, limit as u32)
            .await
            .map_err(RpcError::unavailable)?;
        let items: Vec<Value> = page
            .items
            .iter()
            .filter(|row| self.principal.can_see(&row.record.project))
            .filter_map(|row| {
                let mut view: SessionView = serde_json::from_str(&row.record.projection).ok()?;
                view.last_seq = row.last_seq;
                view.updated_at = crate::engine::rfc3339(row.updated_ms);
                Some(summary(&view))
            })
            .collect();
        let mut result = json!({"items": items});
        if let Some(next) = page.next_before {
            result["nextCursor"] = Value::String(next.to_string());
        }
        Ok(result)
    }

    async fn create_chat(&mut self, params: Value) -> Result<Value, RpcError> {
        let session = Self::session_param(&params)?;
        let chat = params
            .get("chat")
            .and_then(Value::as_str)
            .ok_or_else(|| RpcError::invalid("params.chat (the new chat's URI) is required."))?
            .to_owned();
        self.engine
            .create_chat(&self.principal, &session, &chat)
            .await
            .map_err(RpcError::from)?;
        Ok(Value::Null)
    }
}

struct RpcError {
    code: i32,
    message: String,
    data: Option<Value>,
}

impl RpcError {
    fn new(code: i32, message: String) -> Self {
        Self {
            code,
            message,
            data: None,
        }
    }

    fn invalid(message: &str) -> Self {
        Self::new(json_rpc_error_codes::INVALID_PARAMS, message.to_owned())
    }

    fn unavailable(err: impl std::fmt::Display) -> Self {
        tracing::warn!(error = %err, "request failed on storage");
        Self::new(
            json_rpc_error_codes::INTERNAL_ERROR,
            "Storage unavailable; try again.".to_owned(),
        )
    }
}

impl From<EngineError> for RpcError {
    fn from(err: EngineError) -> Self {
        let code = match &err {
            EngineError::NotFound(_) => ahp_error_codes::SESSION_NOT_FOUND,
            EngineError::AlreadyExists(_) => ahp_error_codes::SESSION_ALREADY_EXISTS,
            EngineError::Conflict(_) => ahp_error_codes::CONFLICT,
            EngineError::InvalidParams(_) => json_rpc_error_codes::INVALID_PARAMS,
            EngineError::ProviderNotFound(_) => ahp_error_codes::PROVIDER_NOT_FOUND,
            EngineError::Forbidden(_) => ahp_error_codes::PERMISSION_DENIED,
            EngineError::Unavailable(_) => json_rpc_error_codes::INTERNAL_ERROR,
        };
        Self::new(code, err.to_string())
    }
}
