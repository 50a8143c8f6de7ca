//! The AHP session stream: envelopes of subscribed channels, in order,
//! exactly once, across dropped connections and server restarts.
//!
//! A [`SessionStream`] runs one upstream [`ahp::Client`] at a time in a
//! background task. When the connection drops it reconnects with
//! exponential backoff and jitter and resumes with AHP `reconnect` from what
//! it has already delivered: the server either replays the missed envelopes
//! ([`StreamEvent::Resumed`] then the envelopes) or, when the gap is too
//! large, sends fresh snapshots ([`StreamEvent::Resynced`] then
//! [`StreamEvent::Snapshot`]s). Envelopes the consumer has already seen are
//! never yielded again.
//!
//! [`SessionStream::dispatch`] numbers each action with the identity's next
//! `clientSeq` and resends unanswered dispatches after a reconnect; the
//! server applies each `(clientId, clientSeq)` once, so the retry is safe.
//!
//! ```no_run
//! # async fn demo() -> Result<(), tether_client::Error> {
//! use tether_client::stream::{SessionStream, Start, StreamConfig, StreamEvent};
//!
//! let config = StreamConfig::new("http://127.0.0.1:7878");
//! let mut stream =
//!     SessionStream::open(config, vec!["ahp-session:/demo".into()], Start::Now).await?;
//! let outcome = stream
//!     .dispatch(
//!         "ahp-session:/demo",
//!         serde_json::json!({"type": "session/titleChanged", "title": "Hello"}),
//!     )
//!     .await?;
//! println!("{outcome:?}");
//! while let Some(event) = stream.next().await {
//!     if let StreamEvent::Envelope(envelope) = event {
//!         println!("{} {}", envelope.server_seq, envelope.channel);
//!     }
//! }
//! # Ok(()) }
//! ```

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use ahp::{Client as AhpClient, ClientConfig, ClientError, SubscriptionEvent};
use ahp_types::ActionEnvelope;
use ahp_types::commands::{ReconnectResult, SubscribeResult};
use ahp_types::state::Snapshot;
use serde_json::{Value, json};
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;

use crate::Error;
use crate::identity::ClientIdentity;

/// How a [`SessionStream`] connects and recovers.
#[derive(Debug, Clone)]
pub struct StreamConfig {
    /// The server: an `http(s)://` base URL (the stream uses `/ahp` on it)
    /// or a `ws(s)://` URL used as given.
    pub url: String,
    /// Who this client is; see [`ClientIdentity`].
    pub identity: Arc<ClientIdentity>,
    /// First reconnect delay; it doubles per failed attempt.
    pub initial_backoff: Duration,
    /// Longest reconnect delay.
    pub max_backoff: Duration,
    /// Failed reconnect attempts in a row before the stream gives up;
    /// `None`: never.
    pub max_attempts: Option<u32>,
    /// How often an idle connection is checked with `ping`.
    pub keepalive: Duration,
    /// Longest wait for a request's answer (and for a keepalive `ping`).
    pub request_timeout: Duration,
    /// Events the upstream client buffers between the socket and this
    /// stream's task. The task drains it at once; it only fills when the
    /// process is starved of CPU.
    pub buffer: usize,
    /// Where bearer tokens come from, for a server with authentication on.
    pub tokens: Option<crate::token::Tokens>,
}

impl StreamConfig {
    /// Defaults: an ephemeral identity, backoff 100 ms doubling to 5 s,
    /// reconnecting forever, a keepalive every 15 s.
    pub fn new(url: impl Into<String>) -> Self {
        Self {
            url: url.into(),
            identity: Arc::new(ClientIdentity::ephemeral()),
            initial_backoff: Duration::from_millis(100),
            max_backoff: Duration::from_secs(5),
            max_attempts: None,
            keepalive: Duration::from_secs(15),
            request_timeout: Duration::from_secs(30),
            buffer: 8192,
            tokens: None,
        }
    }

    /// The same configuration, authenticating with `tokens`.
    pub fn with_tokens(mut self, tokens: crate::token::Tokens) -> Self {
        self.tokens = Some(tokens);
        self
    }

    /// The same configuration with `identity`.
    pub fn with_identity(mut self, identity: Arc<ClientIdentity>) -> Self {
        self.identity = identity;
        self
    }

    /// The WebSocket URL this configuration connects to.
    pub fn ws_url(&self) -> Result<String, Error> {
        ws_url(&self.url)
    }
}

/// Where a stream starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Start {
    /// A [`StreamEvent::Snapshot`] of each channel, then what follows it.
    Now,
    /// Every envelope of the channels after this `serverSeq` (or, if the
    /// server will not replay that many, snapshots), then what follows.
    After(u64),
}

/// What a [`SessionStream`] yields.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum StreamEvent {
    /// A channel's state; envelopes that follow apply on top of it.
    Snapshot(Snapshot),
    /// A committed action, in `serverSeq` order per channel, never twice.
    Envelope(Box<ActionEnvelope>),
    /// The connection dropped; the stream reconnects after `retry_in`.
    Disconnected {
        /// What happened.
        reason: String,
        /// The wait before the next attempt.
        retry_in: Duration,
    },
    /// Reconnected and resumed by replay: the next `replayed` envelopes are
    /// the ones missed while disconnected.
    Resumed {
        /// How many missed envelopes follow.
        replayed: usize,
    },
    /// Reconnected, but the gap was too large to replay: a fresh
    /// [`StreamEvent::Snapshot`] of every channel follows, and envelopes
    /// inside the gap are not delivered.
    Resynced,
    /// The server no longer knows these channels (or no longer lets this
    /// client see them); the stream has dropped them.
    Gone {
        /// The channels dropped.
        channels: Vec<String>,
    },
    /// The stream gave up reconnecting; no more events follow.
    Failed {
        /// The last error.
        reason: String,
    },
}

/// The outcome of [`SessionStream::dispatch`].
#[derive(Debug, Clone)]
pub enum Dispatched {
    /// Committed; the envelope as the server recorded it (for a retry, the
    /// original).
    Accepted(Box<ActionEnvelope>),
    /// Refused, with the server's reason; nothing was recorded.
    Rejected {
        /// The `clientSeq` it was sent with.
        client_seq: u64,
        /// Why.
        reason: String,
    },
}

/// A live, resumable subscription to one or more channels. See the module
/// documentation.
#[derive(Debug)]
pub struct SessionStream {
    events: mpsc::UnboundedReceiver<StreamEvent>,
    commands: mpsc::UnboundedSender<Command>,
    identity: Arc<ClientIdentity>,
    task: JoinHandle<()>,
}

impl SessionStream {
    /// Connects, subscribes to `channels` from `start`, and keeps the
    /// subscription alive until dropped. Fails if the first connection
    /// cannot be made or the server refuses a subscription; later drops
    /// are recovered from.
    pub async fn open(
        config: StreamConfig,
        channels: Vec<String>,
        start: Start,
    ) -> Result<Self, Error> {
        let (events_tx, events) = mpsc::unbounded_channel();
        let (commands, commands_rx) = mpsc::unbounded_channel();
        let identity = config.identity.clone();
        let mut driver = Driver {
            url: config.ws_url()?,
            config,
            covered: HashMap::new(),
            aligned: false,
            pending: BTreeMap::new(),
            events: events_tx,
            commands: commands_rx,
        };
        let connection = driver.connect().await?;
        match start {
            Start::Now => {
                for channel in channels {
                    driver.subscribe(&connection, channel).await?;
                }
            }
            Start::After(seq) => {
                for channel in channels {
                    driver.covered.insert(channel, seq);
                }
                driver.resume(&connection).await?;
            }
        }
        let task = tokio::spawn(driver.run(connection));
        Ok(Self {
            events,
            commands,
            identity,
            task,
        })
    }

    /// The next event; `None` once the stream has ended (after
    /// [`StreamEvent::Failed`]).
    pub async fn next(&mut self) -> Option<StreamEvent> {
        self.events.recv().await
    }

    /// Subscribes to one more channel; its [`StreamEvent::Snapshot`]
    /// arrives through [`SessionStream::next`].
    pub async fn subscribe(&self, channel: impl Into<String>) -> Result<(), Error> {
        let (reply, answer) = oneshot::channel();
        self.command(Command::Subscribe {
            channel: channel.into(),
            reply,
        })?;
        answer.await.map_err(|_| Error::StreamClosed)?
    }

    /// Dispatches `action` (an AHP action object) on `channel` and waits
    /// for its outcome. While disconnected it waits for the reconnect and
    /// sends it again with the same `clientSeq`; the server applies it once.
    pub async fn dispatch(&self, channel: &str, action: Value) -> Result<Dispatched, Error> {
        let client_seq = self.identity.next_seq()?;
        let (reply, answer) = oneshot::channel();
        self.command(Command::Dispatch(Pending {
            channel: channel.to_owned(),
            client_seq,
            action,
            reply,
        }))?;
        answer.await.map_err(|_| Error::StreamClosed)?
    }

    /// The identity this stream dispatches as.
    pub fn identity(&self) -> &Arc<ClientIdentity> {
        &self.identity
    }

    fn command(&self, command: Command) -> Result<(), Error> {
        self.commands.send(command).map_err(|_| Error::StreamClosed)
    }
}

impl Drop for SessionStream {
    fn drop(&mut self) {
        self.task.abort();
    }
}

enum Command {
    Dispatch(Pending),
    Subscribe {
        channel: String,
        reply: oneshot::Sender<Result<(), Error>>,
    },
}

struct Pending {
    channel: String,
    client_seq: u64,
    action: Value,
    reply: oneshot::Sender<Result<Dispatched, Error>>,
}

type PingFuture =
    std::pin::Pin<Box<dyn std::future::Future<Output = Result<(), ClientError>> + Send>>;

/// One live upstream connection.
struct Connection {
    client: AhpClient,
    events: ahp::client::ClientEventStream,
    /// When to move to a fresh token, before the server closes the
    /// connection for an expired one.
    refresh_at: Option<tokio::time::Instant>,
}

/// Why a connection stopped being used.
enum Lost {
    /// The connection failed; reconnect.
    Connection(String),
    /// Its token is about to expire: reconnect at once with a fresh one.
    Refresh,
    /// The [`SessionStream`] was dropped; stop.
    Dropped,
}

struct Driver {
    config: StreamConfig,
    url: String,
    /// Per subscribed channel, the highest `serverSeq` the consumer has been given
    /// (an envelope's, or its snapshot's `fromSeq`): anything at or below
    /// it is a duplicate.
    covered: HashMap<String, u64>,
    /// Whether deliveries on the current connection arrive in one global
    /// `serverSeq` order (true after a replayed `reconnect`; a `subscribe`
    /// bridges its channel's gap out of order). While true, an envelope on
    /// any channel proves every channel covered up to its seq.
    aligned: bool,
    /// Dispatches sent (or waiting to be) without an outcome, by clientSeq.
    pending: BTreeMap<u64, Pending>,
    events: mpsc::UnboundedSender<StreamEvent>,
    commands: mpsc::UnboundedReceiver<Command>,
}

impl Driver {
    async fn run(mut self, mut connection: Connection) {
        loop {
            let reason = match self.serve(&mut connection).await {
                Lost::Dropped => {
                    connection.client.shutdown().await;
                    return;
                }
                Lost::Connection(reason) => (reason, false),
                Lost::Refresh => ("refreshing the token".to_owned(), true),
            };
            connection.client.shutdown().await;
            connection = match self.reconnect(reason.0, reason.1).await {
                Some(connection) => connection,
                None => return,
            };
        }
    }

    /// Uses `connection` until it fails or the stream is dropped.
    async fn serve(&mut self, connection: &mut Connection) -> Lost {
        let mut keepalive = tokio::time::interval(self.config.keepalive);
        keepalive.reset();
        // At most one keepalive in flight; one still unanswered at the next
        // tick means the connection is dead even if the socket looks open.
        let mut ping: Option<PingFuture> = None;
        loop {
            tokio::select! {
                event = connection.events.recv() => match event {
                    Some(event) => self.on_event(event.event),
                    None => return Lost::Connection("the connection closed".into()),
                },
                command = self.commands.recv() => match command {
                    Some(command) => {
                        if let Err(reason) = self.on_command(connection, command).await {
                            return Lost::Connection(reason);
                        }
                    }
                    None => return Lost::Dropped,
                },
                answered = async {
                    match ping.as_mut() {
                        Some(ping) => ping.await,
                        None => std::future::pending().await,
                    }
                }, if ping.is_some() => {
                    ping = None;
                    if let Err(err) = answered {
                        return Lost::Connection(format!("keepalive failed: {err}"));
                    }
                }
                _ = keepalive.tick() => {
                    if ping.is_some() {
                        return Lost::Connection("keepalive ping unanswered".into());
                    }
                    let client = connection.client.clone();
                    let timeout = self.config.request_timeout;
                    ping = Some(Box::pin(async move {
                        tokio::time::timeout(timeout, client.ping())
                            .await
                            .unwrap_or(Err(ClientError::Cancelled))
                    }));
                }
                () = self.events.closed() => return Lost::Dropped,
                () = async {
                    match connection.refresh_at {
                        Some(at) => tokio::time::sleep_until(at).await,
                        None => std::future::pending().await,
                    }
                } => return Lost::Refresh,
            }
        }
    }

    /// Reconnects until it succeeds (and resumes), or gives up.
    /// `planned`: a token refresh, so the first attempt waits for nothing.
    async fn reconnect(&mut self, mut reason: String, planned: bool) -> Option<Connection> {
        let mut attempt: u32 = 0;
        loop {
            if self.config.max_attempts.is_some_and(|max| attempt >= max) {
                let error = format!("gave up after {attempt} reconnect attempts: {reason}");
                for (_, pending) in std::mem::take(&mut self.pending) {
                    let _ = pending.reply.send(Err(Error::Disconnected(error.clone())));
                }
                let _ = self.events.send(StreamEvent::Failed { reason: error });
                return None;
            }
            let retry_in = if planned && attempt == 0 {
                Duration::ZERO
            } else {
                backoff(&self.config, attempt)
            };
            if self
                .events
                .send(StreamEvent::Disconnected {
                    reason: reason.clone(),
                    retry_in,
                })
                .is_err()
            {
                return None;
            }
            // Dispatches made while waiting are queued for the next connection.
            let sleep = tokio::time::sleep(retry_in);
            tokio::pin!(sleep);
            loop {
                tokio::select! {
                    () = &mut sleep => break,
                    command = self.commands.recv() => match command {
                        Some(Command::Dispatch(pending)) => {
                            self.pending.insert(pending.client_seq, pending);
                        }
                        Some(Command::Subscribe { reply, .. }) => {
                            let _ = reply.send(Err(Error::Disconnected(
                                "not connected; subscribe again once the stream has resumed".into(),
                            )));
                        }
                        None => return None,
                    },
                }
            }
            attempt += 1;
            let connected = match self.connect().await {
                Ok(connection) => match self.resume(&connection).await {
                    Ok(()) => Ok(connection),
                    Err(err) => {
                        connection.client.shutdown().await;
                        Err(err)
                    }
                },
                Err(err) => Err(err),
            };
            match connected {
                Ok(connection) => return Some(connection),
                Err(err) => reason = err.to_string(),
            }
        }
    }

    /// A new, initialized connection.
    async fn connect(&self) -> Result<Connection, Error> {
        let connect_error = |reason: String| Error::Connect {
            url: self.url.clone(),
            reason,
        };
        let mut refresh_at = None;
        let transport = match &self.config.tokens {
            None => ahp_ws::WebSocketTransport::connect(&self.url)
                .await
                .map_err(|e| connect_error(e.to_string()))?,
            Some(tokens) => {
                use tokio_tungstenite::tungstenite::client::IntoClientRequest;
                let token = tokens.token().map_err(Error::Token)?;
                refresh_at = crate::token::refresh_after(&token)
                    .map(|after| tokio::time::Instant::now() + after);
                let mut request = self
                    .url
                    .as_str()
                    .into_client_request()
                    .map_err(|e| connect_error(e.to_string()))?;
                let header = format!("Bearer {}", token.value)
                    .parse()
                    .map_err(|_| connect_error("the token is not a valid header value".into()))?;
                request.headers_mut().insert("authorization", header);
                let (stream, _) = tokio_tungstenite::connect_async(request)
                    .await
                    .map_err(|e| connect_error(e.to_string()))?;
                ahp_ws::WebSocketTransport::from_stream(stream)
            }
        };
        let client = AhpClient::connect(
            transport,
            ClientConfig {
                default_request_timeout: Some(self.config.request_timeout),
                subscription_buffer: self.config.buffer.max(16),
            },
        )
        .await
        .map_err(rpc_error)?;
        // Taken before any request, so nothing sent after it is missed.
        let events = client.events();
        // Durable origins: this stream numbers dispatches from its identity
        // and resends unanswered ones on a new connection, so the server
        // must key them across connections, not per connection.
        let _: ahp_types::commands::InitializeResult = client
            .request(
                "initialize",
                json!({
                    "channel": ahp_types::ROOT_RESOURCE_URI,
                    "clientId": self.config.identity.client_id(),
                    "protocolVersions": [ahp_types::PROTOCOL_VERSION],
                    "_meta": {DURABLE_ORIGINS: true},
                }),
            )
            .await
            .map_err(rpc_error)?;
        Ok(Connection {
            client,
            events,
            refresh_at,
        })
    }

    /// Resumes every channel on a fresh connection from what the consumer
    /// has, then resends unanswered dispatches.
    async fn resume(&mut self, connection: &Connection) -> Result<(), Error> {
        if let Some(last_seen) = self.covered.values().copied().min() {
            let result: ReconnectResult = connection
                .client
                .request(
                    "reconnect",
                    json!({
                        "channel": ahp_types::ROOT_RESOURCE_URI,
                        "clientId": self.config.identity.client_id(),
                        "lastSeenServerSeq": last_seen,
                        "subscriptions": self.covered.keys().collect::<Vec<_>>(),
                        "_meta": {DURABLE_ORIGINS: true},
                    }),
                )
                .await
                .map_err(rpc_error)?;
            match result {
                ReconnectResult::Replay(replay) => {
                    let fresh: Vec<ActionEnvelope> = replay
                        .actions
                        .into_iter()
                        .filter_map(|envelope| self.accept(envelope))
                        .collect();
                    // Replayed deliveries are in global order, and so is
                    // everything after them on this connection.
                    self.aligned = true;
                    self.emit(StreamEvent::Resumed {
                        replayed: fresh.len(),
                    });
                    for envelope in fresh {
                        self.emit(StreamEvent::Envelope(Box::new(envelope)));
                    }
                    if !replay.missing.is_empty() {
                        for channel in &replay.missing {
                            self.covered.remove(channel);
                        }
                        self.emit(StreamEvent::Gone {
                            channels: replay.missing,
                        });
                    }
                }
                ReconnectResult::Snapshot(resync) => {
                    self.aligned = false;
                    self.emit(StreamEvent::Resynced);
                    for snapshot in resync.snapshots {
                        self.covered
                            .insert(snapshot.resource.clone(), seq_of(snapshot.from_seq));
                        self.emit(StreamEvent::Snapshot(snapshot));
                    }
                }
            }
        }
        let unanswered: Vec<u64> = self.pending.keys().copied().collect();
        for client_seq in unanswered {
            if let Some(pending) = self.pending.get(&client_seq) {
                send_dispatch(connection, pending).await?;
            }
        }
        Ok(())
    }

    async fn subscribe(&mut self, connection: &Connection, channel: String) -> Result<(), Error> {
        let result: SubscribeResult = connection
            .client
            .request("subscribe", json!({"channel": channel}))
            .await
            .map_err(rpc_error)?;
        let from = result.snapshot.as_ref().map_or(0, |s| seq_of(s.from_seq));
        // The server bridges this channel's gap after its reply, behind
        // envelopes of other channels with higher seqs.
        self.aligned = false;
        self.covered.insert(channel, from);
        if let Some(snapshot) = result.snapshot {
            self.emit(StreamEvent::Snapshot(snapshot));
        }
        Ok(())
    }

    async fn on_command(
        &mut self,
        connection: &Connection,
        command: Command,
    ) -> Result<(), String> {
        match command {
            Command::Dispatch(pending) => {
                let sent = send_dispatch(connection, &pending).await;
                self.pending.insert(pending.client_seq, pending);
                sent.map_err(|e| e.to_string())
            }
            Command::Subscribe { channel, reply } => {
                match self.subscribe(connection, channel).await {
                    Ok(()) => {
                        let _ = reply.send(Ok(()));
                        Ok(())
                    }
                    Err(err @ Error::Rpc { .. }) => {
                        let _ = reply.send(Err(err));
                        Ok(())
                    }
                    Err(err) => {
                        let reason = err.to_string();
                        let _ = reply.send(Err(err));
                        Err(reason)
                    }
                }
            }
        }
    }

    fn on_event(&mut self, event: SubscriptionEvent) {
        if let SubscriptionEvent::Action(envelope) = event
            && let Some(envelope) = self.accept(envelope)
        {
            self.emit(StreamEvent::Envelope(Box::new(envelope)));
        }
    }

    /// Settles the dispatch an envelope answers, and returns it if the
    /// consumer has not seen it yet.
    fn accept(&mut self, envelope: ActionEnvelope) -> Option<ActionEnvelope> {
        if let Some(origin) = &envelope.origin
            && origin.client_id == self.config.identity.client_id()
            && let Ok(client_seq) = u64::try_from(origin.client_seq)
            && let Some(pending) = self.pending.remove(&client_seq)
        {
            let outcome = match &envelope.rejection_reason {
                Some(reason) => Dispatched::Rejected {
                    client_seq,
                    reason: reason.clone(),
                },
                None => Dispatched::Accepted(Box::new(envelope.clone())),
            };
            let _ = pending.reply.send(Ok(outcome));
        }
        if envelope.rejection_reason.is_some() {
            return None;
        }
        let covered = *self.covered.get(&envelope.channel)?;
        if envelope.server_seq <= covered {
            return None;
        }
        if self.aligned {
            for seq in self.covered.values_mut() {
                *seq = (*seq).max(envelope.server_seq);
            }
        } else {
            self.covered
                .insert(envelope.channel.clone(), envelope.server_seq);
        }
        Some(envelope)
    }

    fn emit(&self, event: StreamEvent) {
        let _ = self.events.send(event);
    }
}

/// The `_meta` key with which the stream asks the server for durable
/// origins in `initialize` and `reconnect`.
const DURABLE_ORIGINS: &str = "tether/durableOrigins";

async fn send_dispatch(connection: &Connection, pending: &Pending) -> Result<(), Error> {
    connection
        .client
        .notify(
            "dispatchAction",
            json!({
                "channel": pending.channel,
                "clientSeq": pending.client_seq,
                "action": pending.action,
            }),
        )
        .await
        .map_err(rpc_error)
}

/// The delay before reconnect attempt `attempt` (0-based): exponential,
/// capped, with "equal jitter" (half fixed, half random) so that many
/// clients dropped at once do not return at once.
fn backoff(config: &StreamConfig, attempt: u32) -> Duration {
    let base = config
        .initial_backoff
        .saturating_mul(1u32 << attempt.min(20))
        .min(config.max_backoff);
    let half = base / 2;
    let random = u64::from_le_bytes(
        uuid::Uuid::new_v4().as_bytes()[..8]
            .try_into()
            .unwrap_or_default(),
    );
    let jitter_nanos = u64::try_from(half.as_nanos()).unwrap_or(u64::MAX);
    half + Duration::from_nanos(random % jitter_nanos.max(1))
}

fn seq_of(seq: i64) -> u64 {
    u64::try_from(seq).unwrap_or(0)
}

fn rpc_error(err: ClientError) -> Error {
    match err {
        ClientError::Rpc(err) => Error::Rpc {
            code: err.code,
            message: err.message,
        },
        other => Error::Disconnected(other.to_string()),
    }
}

/// The AHP WebSocket URL of a server given by its base URL.
pub fn ws_url(url: &str) -> Result<String, Error> {
    let mut parsed = reqwest::Url::parse(url).map_err(|e| Error::InvalidUrl {
        url: url.to_owned(),
        reason: e.to_string(),
    })?;
    let scheme = match parsed.scheme() {
        "ws" | "wss" => return Ok(parsed.into()),
        "http" => "ws",
        "https" => "wss",
        _ => {
            return Err(Error::InvalidUrl {
                url: url.to_owned(),
                reason: "expected an http(s):// or ws(s):// URL".into(),
            });
        }
    };
    parsed.set_scheme(scheme).map_err(|()| Error::InvalidUrl {
        url: url.to_owned(),
        reason: "cannot use it as a WebSocket URL".into(),
    })?;
    let path = format!("{}/ahp", parsed.path().trim_end_matches('/'));
    parsed.set_path(&path);
    Ok(parsed.into())
}

#[cfg(test)]
mod tests;
