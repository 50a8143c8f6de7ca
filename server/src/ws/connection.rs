//! One AHP connection: its read loop, its subscriptions and the delivery
//! of hub items to it (stored envelopes: `from_store`).
//!
//! Delivery bookkeeping: each subscription remembers the seq its subscriber
//! already has everything up to (its snapshot's, its replay's, then each
//! envelope's) and the hub seq it was routed at; it gets exactly the
//! envelopes above the first, from the store up to the second and from the
//! inbox after it.

use std::collections::HashMap;
use std::future::{Future, poll_fn};
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use ahp_types::errors::{ahp_error_codes, json_rpc_error_codes};
use axum::extract::ws::{Message, WebSocket};
use futures_util::stream::FuturesUnordered;
use futures_util::{SinkExt, StreamExt};
use serde_json::{Value, json};
use tokio::sync::OwnedSemaphorePermit;

use super::frame::{self, Params, Request};
use super::queue::{Gone, Outbound, Queue};
use super::readiness::Readiness;
use super::rpc::RpcError;
use super::{
    CLOSE_LINGER, CLOSE_PING_TIMEOUT, CLOSE_SLOW_CONSUMER, CLOSE_TOKEN_EXPIRED, CLOSE_TOO_BIG,
    CLOSE_UNSUPPORTED_VERSION, INBOX_BATCH, MAX_INFLIGHT_DISPATCHES, WsLimits,
};
use crate::AppState;
use crate::auth::Principal;
use crate::auth::limits::{ConnectionSlot, PrincipalLimits};
use crate::engine::fanout::{HubItem, Inbound, Routing};
use crate::engine::{DispatchOutcome, Engine, Metrics};
use crate::store::Origin;

/// The optional AHP 1.0 commands Tether does not offer. Each is gated by a
/// capability Tether does not advertise, and the specification answers a
/// command outside every advertised capability with JSON-RPC -32601.
pub(super) const NOT_OFFERED: [&str; 16] = [
    "authenticate",
    "disposeChat",
    "moveChat",
    "resourceRead",
    "resourceWrite",
    "resourceList",
    "resourceCopy",
    "resourceDelete",
    "resourceMove",
    "resourceResolve",
    "resourceMkdir",
    "resourceRequest",
    "createResourceWatch",
    "listAutomationTriggerDefinitions",
    "runAutomation",
    "fetchAutomationRuns",
];

/// Whether an envelope of `channel` is kept from `principal`: the root
/// channel's count of active sessions counts every project's sessions, so a
/// principal limited to some projects is never sent it (`text` is the
/// envelope's action or its whole frame).
pub(super) fn hidden_from(principal: &Principal, channel: &str, text: &str) -> bool {
    channel == tether_protocol::channel::ROOT
        && principal.project_scope().is_some()
        && text.contains("\"root/activeSessionsChanged\"")
}

/// One connection's state, owned by its task.
pub(super) struct Connection {
    pub(super) engine: Engine,
    pub(super) limits: WsLimits,
    pub(super) principal: Principal,
    /// The client's socket, read and written by this connection's task.
    pub(super) socket: WebSocket,
    /// What waits to be written to it.
    pub(super) queue: Queue,
    pub(super) client_id: Option<String>,
    /// The scope this connection's origins are unique in: its own token
    /// unless the client asked for durable origins (see `methods::ORIGINS_META`).
    pub(super) origin_scope: String,
    /// The token of this connection's own scope.
    pub(super) connection_scope: String,
    /// Channel → the seq its subscriber already has everything up to.
    pub(super) subscriptions: HashMap<String, Subscription, foldhash::fast::RandomState>,
    /// Which channels the hub routes to this connection.
    pub(super) routing: Routing,
    pub(super) closing: bool,
    /// Subscriptions opened by the current request whose gap between
    /// snapshot and cursor is sent from the store after the reply.
    pub(super) after_reply: Vec<String>,
    /// Pipelined dispatches awaiting their outcome, polled by the
    /// connection's own loop (no task per dispatch, no channel back); at
    /// most [`MAX_INFLIGHT_DISPATCHES`]: past that the connection stops
    /// reading until one is answered.
    pub(super) pending: FuturesUnordered<PendingAnswer>,
    /// Per-principal bounds.
    pub(super) principal_limits: PrincipalLimits,
}

/// A dispatch waiting for its outcome.
pub(super) type PendingAnswer = Pin<Box<dyn Future<Output = Answered> + Send>>;

/// A dispatch's outcome on its way back to the connection that sent it.
pub(super) struct Answered {
    pub(super) channel: String,
    /// The action's text as it was sent, for the echo of its refusal.
    pub(super) action_text: String,
    pub(super) origin: Origin,
    /// Its channel's subscription's `routed_at`, if it was subscribed when
    /// the dispatch was submitted: a fresh commit is above it and reaches
    /// the subscriber through the inbox.
    pub(super) routed_at: Option<u64>,
    pub(super) outcome: DispatchOutcome,
    /// The JSON-RPC id when it was sent as a request.
    pub(super) id: Option<Value>,
}

/// A subscription's delivery state.
#[derive(Debug)]
pub(super) struct Subscription {
    /// The subscriber has every envelope of the channel up to this seq.
    pub(super) after: u64,
    /// The seq its snapshot was taken at: every envelope above it reaches
    /// the subscriber as an envelope (from the store, then the inbox).
    pub(super) from: u64,
    /// Where the inbox takes over: the hub seq the channel was routed to
    /// this connection at, or the snapshot's seq when the hub knew the
    /// channel had nothing between the two. Envelopes above it arrive in
    /// the inbox; those at or below it, above `after`, come from the store.
    pub(super) routed_at: u64,
    /// The highest seq of the channel read from the store for it (at least
    /// its snapshot's): after the read up to `routed_at`, the channel's last
    /// seq up to there.
    pub(super) last_read: u64,
    /// Holds its place in the `tether_subscriptions` gauge.
    _counted: Counted,
}

impl Subscription {
    /// A subscription of `channel` at these seqs, counted in `metrics`.
    pub(super) fn new(channel: &str, after: u64, routed_at: u64, metrics: &Metrics) -> Self {
        let kind = tether_protocol::channel::Channel::parse(channel).map_or("other", |c| c.kind());
        let gauge = metrics
            .subscriptions
            .get_or_create(&[("kind", kind)])
            .clone();
        gauge.inc();
        Self {
            after,
            from: after,
            routed_at,
            last_read: after,
            _counted: Counted(gauge),
        }
    }
}

/// A close code's label in `tether_ws_closes_total` (a bounded set).
fn close_label(code: u16) -> &'static str {
    match code {
        1000 => "1000",
        1001 => "1001",
        1008 => "1008",
        1009 => "1009",
        1011 => "1011",
        CLOSE_SLOW_CONSUMER => "slow_consumer",
        CLOSE_PING_TIMEOUT => "ping_timeout",
        CLOSE_TOKEN_EXPIRED => "token_expired",
        CLOSE_UNSUPPORTED_VERSION => "unsupported_version",
        _ => "other",
    }
}

/// A place in a gauge, given back when dropped.
#[derive(Debug)]
struct Counted(prometheus_client::metrics::gauge::Gauge);

impl Drop for Counted {
    fn drop(&mut self) {
        self.0.dec();
    }
}

/// A successful answer.
pub(super) enum Reply {
    /// A value to serialise.
    Json(Value),
    /// The whole response frame, written by the method itself: a large
    /// replay is written once, never copied into a frame around it.
    Frame(String),
}

/// What handling one message decided.
pub(super) enum Next {
    Continue,
    Close(u16, String),
}

/// Commands that commit, or make or stop what will: each counts against
/// the principal's dispatch rate as a dispatch does.
const CHARGED: [&str; 7] = [
    "createSession",
    "disposeSession",
    "createChat",
    "createTerminal",
    "disposeTerminal",
    "fetchTurns",
    "invokeChangesetOperation",
];

impl Connection {
    pub(super) async fn run(
        socket: WebSocket,
        state: AppState,
        principal: Principal,
        _permit: OwnedSemaphorePermit,
        _slot: ConnectionSlot,
    ) {
        let opened = Instant::now();
        let mut bytes_in = 0u64;
        let (routing, mut inbox) = state.engine.hub().subscribe();
        let mut connection = Connection {
            engine: state.engine.clone(),
            limits: state.ws.clone(),
            principal,
            socket,
            queue: Queue::new(state.ws.max_outbound_bytes),
            client_id: None,
            origin_scope: String::new(),
            connection_scope: format!("conn:{}", uuid::Uuid::new_v4().simple()),
            subscriptions: HashMap::default(),
            routing,
            closing: false,
            after_reply: Vec::new(),
            pending: FuturesUnordered::new(),
            principal_limits: state.auth.limits.clone(),
        };
        tracing::info!(connection = %connection.connection_scope, sub = %connection.principal.sub,
            role = %connection.principal.role, "websocket opened");
        let mut ping = tokio::time::interval(state.ws.ping_interval);
        ping.tick().await;
        let mut last_heard = Instant::now();
        // Waited on once for the connection's life: a `cancelled()` made
        // anew each turn joins and leaves the token's waiters every time.
        let shutdown = state.shutdown.clone().cancelled_owned();
        tokio::pin!(shutdown);
        // A connection lives no longer than its token.
        let leeway = state.auth.leeway();
        let expiry = connection.principal.expires_at.map(|exp| {
            let now = jsonwebtoken::get_current_timestamp();
            tokio::time::Instant::now() + Duration::from_secs(exp.saturating_sub(now)) + leeway
        });
        let expired = async move {
            match expiry {
                Some(at) => tokio::time::sleep_until(at).await,
                None => std::future::pending().await,
            }
        };
        tokio::pin!(expired);
        // The socket's read side, and the timers with the shutdown wait,
        // are polled only when their wakers fired (see `Readiness`).
        let readiness = Readiness::new();
        let timers = Readiness::new();
        let verdict = loop {
            // What the socket takes now is written before anything else.
            if connection.write_what_fits().await.is_err() {
                break None;
            }
            let reading = connection.pending.len() < MAX_INFLIGHT_DISPATCHES;
            let next = tokio::select! {
                io = poll_fn(|cx| poll_io(cx, &mut connection.socket, &mut connection.queue, reading, &readiness)) => match io {
                    Io::Gone => break None,
                    Io::Read(Some(Ok(Message::Text(text)))) => {
                        last_heard = Instant::now();
                        bytes_in += text.len() as u64;
                        // Boxed: the handlers' state lives on the heap
                        // only while a message is handled, so an idle
                        // connection's task stays small (this future is
                        // its size for the connection's whole life).
                        Box::pin(connection.on_text(text.as_str())).await
                    }
                    Io::Read(Some(Ok(Message::Binary(_)))) => {
                        last_heard = Instant::now();
                        connection.send_error(Value::Null, json_rpc_error_codes::INVALID_REQUEST,
                            "AHP messages are JSON text frames, not binary frames.", None);
                        Next::Continue
                    }
                    Io::Read(Some(Ok(Message::Ping(_) | Message::Pong(_)))) => {
                        last_heard = Instant::now();
                        Next::Continue
                    }
                    Io::Read(Some(Ok(Message::Close(_))) | None) => break None,
                    Io::Read(Some(Err(err))) => {
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
                inbound = inbox.next() => {
                    // What else the hub has routed here already goes out
                    // with it, in one write to the socket.
                    let mut next = connection.on_inbound(inbound).await;
                    let mut taken = 1;
                    while matches!(next, Next::Continue) && taken < INBOX_BATCH {
                        let Some(more) = inbox.try_next() else { break };
                        next = connection.on_inbound(more).await;
                        taken += 1;
                    }
                    next
                }
                Some(reply) = connection.pending.next(), if !connection.pending.is_empty() => {
                    connection.on_answer(reply)
                }
                due = poll_fn(|cx| timers.poll(cx, |cx| poll_timers(cx, &mut ping, shutdown.as_mut(), expired.as_mut()))) => match due {
                    Due::Ping if last_heard.elapsed() > connection.limits.ping_timeout => {
                        Next::Close(CLOSE_PING_TIMEOUT, "ping timeout: no frame or pong received in time".into())
                    }
                    Due::Ping => {
                        connection.queue.control(Outbound::Ping);
                        Next::Continue
                    }
                    Due::Shutdown => Next::Close(1001, "server shutting down".into()),
                    Due::Expired => Next::Close(
                        CLOSE_TOKEN_EXPIRED,
                        "token expired: reconnect with a fresh token and replay".into(),
                    ),
                },
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
        if let Some((code, reason)) = &verdict {
            connection
                .engine
                .metrics()
                .closes
                .get_or_create(&[("code", close_label(*code))])
                .inc();
            // A slow consumer replays what it was not sent; anyone else
            // gets what was queued before the close (an error's answer).
            if *code == CLOSE_SLOW_CONSUMER {
                connection.queue.discard_frames();
            }
            connection
                .queue
                .control(Outbound::Close(*code, reason.clone()));
            // The closing handshake: write the close frame (a client that
            // reads again within the ping deadline gets it after what it
            // was already sent), then keep reading (and discarding) until
            // the client answers with its own, so it reads our close frame
            // instead of a reset connection. Bounded.
            let Connection {
                socket,
                queue,
                limits,
                ..
            } = &mut connection;
            let written = tokio::time::timeout(
                limits.ping_timeout,
                poll_fn(|cx| queue.poll_write(cx, socket)),
            )
            .await;
            if let Ok(Ok(())) = written {
                let _ = tokio::time::timeout(CLOSE_LINGER, async {
                    while let Some(Ok(message)) = socket.next().await {
                        if matches!(message, Message::Close(_)) {
                            break;
                        }
                    }
                })
                .await;
            }
        } else {
            // The client closed: answer its close frame (the codec queued
            // the answer), briefly.
            let _ = tokio::time::timeout(CLOSE_LINGER, connection.socket.close()).await;
        }
        if let Some(client_id) = &connection.client_id {
            connection.engine.client_disconnected(client_id);
        }
        let scope = std::mem::take(&mut connection.connection_scope);
        let sub = std::mem::take(&mut connection.principal.sub);
        let client = connection.client_id.take();
        let bytes_out = connection.queue.written;
        drop(connection);
        let (code, reason) = verdict.map_or((None, "closed by the client".to_owned()), |(c, r)| {
            (Some(c), r)
        });
        tracing::info!(connection = %scope, %sub, client = client.as_deref().unwrap_or("-"),
            code, %reason, bytes_in, bytes_out, duration_ms = opened.elapsed().as_millis() as u64,
            "websocket closed");
    }

    /// Hands the socket what it takes now, without waiting for it.
    pub(super) async fn write_what_fits(&mut self) -> Result<(), Gone> {
        let wrote = poll_fn(|cx| Poll::Ready(self.queue.poll_write(cx, &mut self.socket))).await;
        match wrote {
            Poll::Ready(Err(Gone)) => Err(Gone),
            _ => Ok(()),
        }
    }

    pub(super) fn send(&mut self, frame: String) -> Next {
        self.queue.reply(frame.into());
        Next::Continue
    }

    /// The verdict for a connection whose queue is over its byte limit.
    pub(super) fn overflow(&self) -> Next {
        self.engine.metrics().slow_closes.inc();
        Next::Close(
            CLOSE_SLOW_CONSUMER,
            format!(
                "slow consumer: more than {} bytes queued; reconnect and replay from your \
                 lastSeenServerSeq",
                self.limits.max_outbound_bytes
            ),
        )
    }

    pub(super) fn send_result(&mut self, id: Value, result: Value) -> Next {
        self.send(json!({"jsonrpc": "2.0", "id": id, "result": result}).to_string())
    }

    pub(super) fn send_error(
        &mut self,
        id: Value,
        code: i32,
        message: &str,
        data: Option<Value>,
    ) -> Next {
        let mut error = json!({"code": code, "message": message});
        if let Some(data) = data {
            error["data"] = data;
        }
        self.send(json!({"jsonrpc": "2.0", "id": id, "error": error}).to_string())
    }

    async fn on_inbound(&mut self, inbound: Inbound) -> Next {
        match inbound {
            Inbound::Item(item) => self.on_hub(item),
            Inbound::Lagged => Box::pin(self.catch_up_all()).await,
        }
    }

    fn on_hub(&mut self, item: HubItem) -> Next {
        match item {
            HubItem::Envelope(published) => match self.subscriptions.get_mut(&published.channel) {
                Some(subscription) if published.seq > subscription.after => {
                    subscription.after = published.seq;
                    if hidden_from(&self.principal, &published.channel, &published.frame) {
                        return Next::Continue;
                    }
                    let frame = published
                        .frame_for(self.client_id.as_deref(), &self.principal.sub)
                        .clone();
                    self.engine
                        .metrics()
                        .delivery_seconds
                        .observe(published.committed.elapsed().as_secs_f64());
                    if self.queue.push(frame) {
                        Next::Continue
                    } else {
                        self.overflow()
                    }
                }
                _ => Next::Continue,
            },
            HubItem::Gone(ended) => {
                self.end_subscription(&ended.channel, ended.before);
                Next::Continue
            }
            HubItem::Notice(notice) => {
                // Another project's session is never told of.
                if self.subscriptions.contains_key(&notice.channel)
                    && self.principal.can_see(&notice.project)
                    && !self.queue.push(notice.frame.clone())
                {
                    return self.overflow();
                }
                Next::Continue
            }
        }
    }

    async fn on_text(&mut self, text: &str) -> Next {
        let Request { id, method, params } = match frame::read(text) {
            Ok(message) => message,
            Err((id, code, reason)) => return self.send_error(id, code, &reason, None),
        };
        if self.client_id.is_none() && !matches!(&*method, "initialize" | "reconnect" | "ping") {
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
        let result = match &*method {
            "reconnect" => match params.into_value() {
                Ok(params) => self.reconnect(params, id.as_ref()).await,
                Err(err) => Err(err),
            },
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
            Ok(Reply::Frame(frame)) => self.send(frame),
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
        params: Params<'_>,
        id: &Option<Value>,
    ) -> Result<Option<Value>, RpcError> {
        if method == "dispatchAction" {
            let dispatched = frame::dispatch_params(params)?;
            return self.dispatch(dispatched, id.clone()).await.map(|()| None);
        }
        let params = params.into_value()?;
        if CHARGED.contains(&method) {
            self.charge()?;
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
            "fetchTurns" => self.fetch_turns(params).await,
            "resolveSessionConfig" => self.resolve_session_config(params).await,
            "sessionConfigCompletions" => self.session_config_completions(params).await,
            "completions" => self.completions(params).await,
            "invokeChangesetOperation" => self.invoke_changeset_operation(params).await,
            "createTerminal" => {
                let channel = super::rpc::channel_param(&params)?;
                self.engine
                    .create_terminal(&self.principal, &channel, &params)
                    .await
                    .map_err(RpcError::from)
            }
            "disposeTerminal" => {
                let channel = super::rpc::channel_param(&params)?;
                self.engine
                    .dispose_terminal(&self.principal, &channel)
                    .await
                    .map_err(RpcError::from)
            }
            "ping" => Ok(Value::Null),
            other if NOT_OFFERED.contains(&other) => Err(RpcError::new(
                json_rpc_error_codes::METHOD_NOT_FOUND,
                format!(
                    "Tether does not offer {other} (an optional AHP 1.0 command; its capability \
                     is not advertised)."
                ),
            )),
            other => Err(RpcError::new(
                json_rpc_error_codes::METHOD_NOT_FOUND,
                format!("Unknown method {other:?}."),
            )),
        };
        value.map(Some)
    }
}

/// What the socket did.
enum Io {
    /// A message read, the end of the stream, or a read error.
    Read(Option<Result<Message, axum::Error>>),
    /// Writing failed: the client is gone.
    Gone,
}

/// What came due among a connection's timers and the host's shutdown.
enum Due {
    Ping,
    Shutdown,
    Expired,
}

/// Polls the shutdown wait, the token's expiry and the ping interval, in
/// that order: the first that is due.
fn poll_timers(
    cx: &mut Context<'_>,
    ping: &mut tokio::time::Interval,
    shutdown: Pin<&mut impl Future<Output = ()>>,
    expired: Pin<&mut impl Future<Output = ()>>,
) -> Poll<Due> {
    if shutdown.poll(cx).is_ready() {
        return Poll::Ready(Due::Shutdown);
    }
    if expired.poll(cx).is_ready() {
        return Poll::Ready(Due::Expired);
    }
    ping.poll_tick(cx).map(|_| Due::Ping)
}

/// Writes what the socket takes, then reads the next message when
/// `reading` and the socket may have one (see [`Readiness`]); pending
/// until one arrives (or the socket fails).
fn poll_io(
    cx: &mut Context<'_>,
    socket: &mut WebSocket,
    queue: &mut Queue,
    reading: bool,
    readiness: &Readiness,
) -> Poll<Io> {
    if let Poll::Ready(Err(Gone)) = queue.poll_write(cx, socket) {
        return Poll::Ready(Io::Gone);
    }
    if reading {
        readiness
            .poll(cx, |cx| socket.poll_next_unpin(cx))
            .map(Io::Read)
    } else {
        Poll::Pending
    }
}
