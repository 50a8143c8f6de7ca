//! The session engine: session actors, the root state, the dispatch
//! pipeline, group commit and fan-out.
//!
//! ```text
//! dispatch ─► principal check ─► channel/action match ─► client-dispatchable?
//!   ─► Tether rules + reducer on a copy ─► side effect (bounded) ─► group commit
//!   ─► apply to live state ─► publish to the hub (seq order) ─► subscribers
//! ```

mod actor;
pub mod attachments;
mod chat_owners;
pub(crate) mod client_tools;
mod clients;
mod command;
mod commit;
pub mod contexts;
mod delivery;
mod error;
pub mod fanout;
mod forward;
mod frames;
pub mod host_tools;
pub mod indexing;
mod mailbox;
pub mod mcp;
mod notify;
mod operations;
pub mod rebuild;
mod registry;
mod retention;
mod root;
mod route;
mod rules;
mod sessions;
mod summary;
mod turns;
mod usage;
mod validate;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use tether_protocol::channel::{Channel, ROOT};
use tether_protocol::view::SessionView;
use tokio::sync::oneshot;

pub use actor::DispatchOutcome;
pub use error::{EngineError, Refusal, RefusalKind};
pub use summary::summary;

use actor::{Command, Dispatch};
use commit::Committer;
use delivery::Delivery;
use fanout::Hub;
use root::{RootModel, load_root};

use crate::agents::Agents;
use crate::auth::Principal;
use crate::cluster::Cluster;
use crate::cluster::forward::Pending;
use crate::effects::Effects;
use crate::store::{Origin, Store, StoreError};
pub use crate::telemetry::metrics::Metrics;

/// How long a leaving host waits for its claim of forwarded requests to
/// finish (a claim is one statement; the store may be unreachable).
const FORWARDER_STOPS_WITHIN: std::time::Duration = std::time::Duration::from_secs(5);

/// Engine settings.
#[derive(Debug, Clone)]
pub struct EngineConfig {
    /// Most envelopes in one transaction.
    pub commit_batch: usize,
    /// Most dispatches one actor validates before appending them together.
    pub actor_batch: usize,
    /// Items the hub buffers for a slow connection before it lags.
    pub hub_buffer: usize,
    /// How long an actor with nothing to do stays in memory.
    pub actor_idle: Duration,
    /// Envelopes between two snapshots of a session.
    pub snapshot_every: u64,
    /// Longest a side effect may take.
    pub effect_timeout: Duration,
    /// With several hosts on one Postgres: how long a session's lease lasts
    /// unrenewed, which bounds how long a dead host's sessions wait.
    pub lease_ttl: Duration,
    /// Most ACP agent processes running at once on this host.
    pub max_agents: usize,
    /// How long an agent process may sit with no turn before it is stopped
    /// and its session settled.
    pub agent_idle: Duration,
    /// Working limits of each ACP agent process.
    pub acp: crate::agents::acp::AcpLimits,
    /// Longest a client may take to answer a call of its tool.
    pub client_tool_timeout: Duration,
    /// How long a client that disconnected stays among a session's active
    /// clients (its tools kept) before it is removed.
    pub client_grace: Duration,
    /// How long an agent's question waits for an answer before the agent is
    /// told it was cancelled.
    pub input_timeout: Duration,
    /// How often the retention round runs.
    pub retention_interval: Duration,
    /// How webhook deliveries are made.
    pub webhooks: crate::webhooks::WebhookConfig,
    /// Whether appends write search documents.
    pub search_index: bool,
    /// Limits on message attachments.
    pub attachments: attachments::AttachmentLimits,
    /// Where working directories may be, whatever the side-effect backend
    /// (empty: anywhere).
    pub roots: crate::effects::Roots,
    /// How agent processes are started: environment, directory,
    /// confinement.
    pub sandbox: crate::agents::sandbox::Sandbox,
}

impl Default for EngineConfig {
    fn default() -> Self {
        Self {
            commit_batch: 1024,
            actor_batch: 256,
            hub_buffer: 16_384,
            actor_idle: Duration::from_secs(300),
            snapshot_every: 256,
            effect_timeout: Duration::from_secs(5),
            lease_ttl: Duration::from_secs(10),
            max_agents: 16,
            agent_idle: Duration::from_secs(1800),
            acp: crate::agents::acp::AcpLimits::default(),
            client_tool_timeout: Duration::from_secs(60),
            client_grace: Duration::from_secs(30),
            input_timeout: Duration::from_secs(600),
            retention_interval: Duration::from_secs(3600),
            webhooks: crate::webhooks::WebhookConfig::default(),
            search_index: true,
            attachments: attachments::AttachmentLimits::default(),
            roots: crate::effects::Roots::default(),
            sandbox: crate::agents::sandbox::Sandbox::default(),
        }
    }
}

/// A submitted dispatch: answered already, or waiting for its session.
/// Its outcome is counted in the metrics when it is taken.
#[derive(Debug)]
pub struct Submitted {
    answer: Answer,
    since: Instant,
    metrics: Arc<Metrics>,
}

#[derive(Debug)]
enum Answer {
    /// Refused (or answered) before reaching a session.
    Done(DispatchOutcome),
    /// In its session's queue; the outcome arrives here.
    Pending(oneshot::Receiver<DispatchOutcome>),
}

impl Submitted {
    /// Waits for the outcome.
    pub async fn outcome(self) -> DispatchOutcome {
        let outcome = match self.answer {
            Answer::Done(outcome) => outcome,
            Answer::Pending(answer) => answer.await.unwrap_or_else(|_| {
                DispatchOutcome::Rejected(Refusal::new(
                    RefusalKind::Unavailable,
                    "The session stopped unexpectedly; retry.",
                ))
            }),
        };
        let (label, reason) = match &outcome {
            DispatchOutcome::Accepted(_) => ("accepted", "none"),
            DispatchOutcome::Rejected(refusal) => ("rejected", refusal.kind.code()),
        };
        self.metrics.dispatched(label, reason, self.since.elapsed());
        outcome
    }
}

/// A channel's state with the seq it includes.
#[derive(Debug, Clone)]
pub struct ChannelSnapshot {
    /// The channel URI.
    pub resource: String,
    /// Its AHP state.
    pub state: Value,
    /// Envelopes above this seq are not in `state`.
    pub from_seq: u64,
}

/// What `createSession` asks for.
#[derive(Debug, Clone)]
pub struct CreateSession {
    /// Session id.
    pub id: String,
    /// Project name.
    pub project: String,
    /// Agent provider (`echo` when absent).
    pub provider: Option<String>,
    /// Working-directory URIs.
    pub working_directories: Vec<String>,
    /// Initial title.
    pub title: Option<String>,
    /// Initial values of the agent's configuration.
    pub config: Option<serde_json::Map<String, Value>>,
    /// AHP `SessionActiveClient`: the creating client itself, checked by
    /// `client_tools::check_creation`, and owned by the creator.
    pub active_client: Option<Value>,
}

pub(crate) struct Ctx {
    store: Arc<dyn Store>,
    /// With several hosts on one Postgres: leases and forwarding.
    cluster: Option<Arc<Cluster>>,
    /// Forwarded writes waiting for their answers.
    pending: Arc<Pending>,
    committer: Committer,
    hub: Arc<Hub>,
    agents: Agents,
    effects: Arc<dyn Effects>,
    /// The effects backend's latency and failure series, looked up once
    /// (finding a labelled series hashes its labels).
    effect_seconds: prometheus_client::metrics::histogram::Histogram,
    effect_failures: prometheus_client::metrics::counter::Counter,
    config: EngineConfig,
    metrics: Arc<Metrics>,
    actors: Mutex<HashMap<String, mailbox::Sender<Command>>>,
    /// One permit per running ACP agent process.
    agent_slots: Arc<tokio::sync::Semaphore>,
    /// Which clients are connected, and where they are active.
    clients: clients::Presence,
    /// The per-session MCP endpoints agents reach client tools through.
    mcp: mcp::McpHub,
    /// This host's terminals (agents' and clients').
    terminals: crate::agents::terminals::Terminals,
    /// Which session owns each chat, as far as this host has looked.
    /// Trusted only while the owner is in use here (see
    /// `Engine::chat_session`).
    chats: chat_owners::ChatOwners,
    /// Sessions being deleted by retention: no actor starts for them.
    retiring: Mutex<std::collections::HashSet<String>>,
    root: tokio::sync::Mutex<RootModel>,
    /// Root writes waiting for the next batch (see `root`).
    root_queue: Mutex<Vec<root::QueuedRoot>>,
    /// With several hosts: the task that claims and runs the writes other
    /// hosts forward here, until `Engine::leave` stops it.
    forwarder: Mutex<Option<tokio::task::JoinHandle<()>>>,
}

impl std::fmt::Debug for Ctx {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ctx").field("config", &self.config).finish()
    }
}

/// The refusal for a dispatch whose commit failed.
pub(crate) const STORAGE_UNAVAILABLE: &str =
    "Storage unavailable: the action was not recorded; retry it.";

/// The refusal for a dispatch whose commit failed, with the store's words
/// (what an operator needs: "database or disk is full", "connection
/// refused").
pub(crate) fn storage_unavailable(cause: &impl std::fmt::Display) -> String {
    format!("Storage unavailable: the action was not recorded ({cause}); retry it.")
}

/// The engine handle; cheap to clone.
#[derive(Debug, Clone)]
pub struct Engine {
    ctx: Arc<Ctx>,
}

pub(crate) use crate::store::rfc3339;

/// Parses an RFC 3339 time to milliseconds since the epoch (0 if unreadable).
pub(crate) fn parse_ms(text: &str) -> i64 {
    text.parse::<jiff::Timestamp>()
        .map(|t| t.as_millisecond())
        .unwrap_or(0)
}

impl Engine {
    /// The agents this host offers.
    pub fn agents(&self) -> &Agents {
        &self.ctx.agents
    }

    /// Starts the engine on `store`: loads the root state, advertises the
    /// agents and starts the group committer.
    pub async fn start(
        store: Arc<dyn Store>,
        agents: Agents,
        effects: Arc<dyn Effects>,
        config: EngineConfig,
        metrics: Arc<Metrics>,
    ) -> Result<Self, StoreError> {
        let cluster = match store.join_cluster() {
            Some((pool, host)) => Some(Cluster::join(pool, host, config.lease_ttl).await?),
            None => None,
        };
        let host = store.host().await?;
        let hub = Arc::new(Hub::new(config.hub_buffer, host.last_seq));
        let (delivery, remote) = Delivery::new(hub.clone(), store.clone(), cluster.clone());
        let outbox = Arc::new(tokio::sync::Notify::new());
        let committer = Committer::start(
            store.clone(),
            delivery.clone(),
            metrics.clone(),
            outbox.clone(),
            config.commit_batch,
            4096,
        );
        let root = load_root(store.as_ref()).await?;
        let pending = Arc::new(Pending::default());
        let agent_slots = Arc::new(tokio::sync::Semaphore::new(config.max_agents.max(1)));
        let backend = [("backend", effects.backend())];
        let effect_seconds = metrics.effect_seconds.get_or_create(&backend).clone();
        let effect_failures = metrics.effect_failures.get_or_create(&backend).clone();
        let ctx = Arc::new(Ctx {
            store,
            cluster: cluster.clone(),
            pending: pending.clone(),
            committer,
            hub,
            agents,
            effects,
            effect_seconds,
            effect_failures,
            config,
            metrics,
            actors: Mutex::new(HashMap::new()),
            agent_slots,
            clients: clients::Presence::default(),
            mcp: mcp::McpHub::default(),
            terminals: crate::agents::terminals::Terminals::default(),
            chats: chat_owners::ChatOwners::default(),
            retiring: Mutex::new(std::collections::HashSet::new()),
            root: tokio::sync::Mutex::new(root),
            root_queue: Mutex::new(Vec::new()),
            forwarder: Mutex::new(None),
        });
        let engine = Self { ctx };
        delivery.start_tailer();
        engine.start_remote(remote);
        if let Some(cluster) = cluster {
            cluster.start_collector(pending);
            let forwarder = forward::start_server(engine.clone(), cluster);
            if let Ok(mut slot) = engine.ctx.forwarder.lock() {
                *slot = Some(forwarder);
            }
        }
        engine
            .boot_sweep()
            .await
            .map_err(|e| StoreError::Corrupt(format!("boot sweep failed: {e}")))?;
        indexing::start(engine.ctx.store.clone());
        retention::start(engine.ctx.clone(), engine.ctx.config.retention_interval);
        retention::start_hearing(engine.ctx.clone());
        crate::webhooks::start(
            engine.ctx.store.clone(),
            engine.ctx.metrics.clone(),
            engine.ctx.config.webhooks.clone(),
            engine.cluster_host().unwrap_or("local").to_owned(),
            outbox,
        );
        let infos = engine.ctx.agents.infos();
        let current =
            serde_json::to_value(&engine.ctx.root.lock().await.state.agents).unwrap_or(Value::Null);
        if current != Value::Array(infos.clone()) {
            engine
                .commit_root(json!({"type": "root/agentsChanged", "agents": infos}), None)
                .await
                .map_err(|e| StoreError::Corrupt(format!("cannot advertise agents: {e}")))?;
        }
        Ok(engine)
    }

    /// Leaves the cluster (shutdown): stops tailing and forwarding and lets
    /// every session lease of this host go.
    pub async fn leave(&self) {
        if let Some(cluster) = &self.ctx.cluster {
            // Forwarded requests claimed and not yet answered are handed
            // back before the leases go, so their senders need not wait;
            // first the claiming stops, so none is claimed after that.
            cluster.stop.cancel();
            let forwarder = self.ctx.forwarder.lock().ok().and_then(|mut f| f.take());
            if let Some(forwarder) = forwarder
                && tokio::time::timeout(FORWARDER_STOPS_WITHIN, forwarder)
                    .await
                    .is_err()
            {
                tracing::warn!("forwarded requests were still being claimed at shutdown");
            }
            forward::recover_claimed(cluster).await;
            cluster.leave().await;
        }
    }

    /// Whether this host may serve its sessions: alone, always; among
    /// several hosts, while its leases are certainly its own (see
    /// [`crate::cluster::Cluster::in_contact`]).
    pub fn holds_its_leases(&self) -> bool {
        self.ctx.cluster.as_ref().is_none_or(|c| c.in_contact())
    }

    /// This host's id among several hosts on one Postgres.
    pub fn cluster_host(&self) -> Option<&str> {
        self.ctx.cluster.as_deref().map(|c| c.host())
    }

    /// The fan-out hub.
    pub fn hub(&self) -> &Arc<Hub> {
        &self.ctx.hub
    }

    /// The engine's counters.
    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.ctx.metrics
    }

    /// `Err` with the store's words while group commits are failing.
    pub fn writer_health(&self) -> Result<(), String> {
        self.ctx.committer.health()
    }

    /// Sets the metrics read at scrape time: session actors, agents
    /// running, the high seq and, with several hosts, the tail lag.
    pub fn sample_metrics(&self) {
        let m = &self.ctx.metrics;
        m.session_actors.set(self.active_actors() as i64);
        let free = self.ctx.agent_slots.available_permits();
        m.agents_running
            .set(self.ctx.config.max_agents.max(1).saturating_sub(free) as i64);
        let published = self.ctx.hub.published();
        m.server_seq.set(published as i64);
        let announced = self.ctx.cluster.as_ref().map_or(0, |c| c.announced());
        m.tail_lag.set(announced.saturating_sub(published) as i64);
    }

    /// How many session actors are in memory.
    pub fn active_actors(&self) -> usize {
        self.ctx.actors.lock().map(|a| a.len()).unwrap_or(0)
    }

    /// The store.
    pub fn store(&self) -> &Arc<dyn Store> {
        &self.ctx.store
    }

    /// The session that owns a chat, if known.
    ///
    /// What this host remembers is trusted only while the owner is in use
    /// here: its actor in memory and, with several hosts, its lease held
    /// by this host. A session in use is not deleted (retention leaves
    /// alone what is in memory on its host or leased by any), but one gone
    /// idle may since have been deleted by another host's retention and
    /// its chat's id taken by another session: the store is asked then, as
    /// a session's actor would ask it to load anyway. A proxy actor (the
    /// lease another host's, or nobody's) proves nothing: reads keep it in
    /// memory while the session it copies is deleted elsewhere.
    async fn chat_session(&self, chat: &str) -> Result<Option<String>, EngineError> {
        if let Some(found) = self.ctx.chats.get(chat)
            && self.ctx.in_memory(&found)
            && self
                .ctx
                .cluster
                .as_ref()
                .is_none_or(|c| c.holds(&found, std::time::Duration::ZERO))
        {
            return Ok(Some(found));
        }
        let found = self.stored_chat_session(chat).await?;
        if let Some(session) = &found {
            self.ctx.chats.remember(chat, session);
        }
        Ok(found)
    }

    /// The session that owns a chat, asked of the store (whatever this
    /// host remembers).
    async fn stored_chat_session(&self, chat: &str) -> Result<Option<String>, EngineError> {
        self.ctx
            .store
            .chat_session(chat)
            .await
            .map_err(|e| EngineError::Unavailable(e.to_string()))
    }

    /// The session a channel belongs to (none for the root).
    pub async fn session_of(&self, channel: &Channel) -> Result<Option<String>, EngineError> {
        match channel {
            Channel::Root => Ok(None),
            Channel::Chat(_) => self.chat_session(&channel.uri()).await,
            named => Ok(named.named_session().map(str::to_owned)),
        }
    }

    /// The view of a session the principal may see.
    pub async fn session_view(
        &self,
        principal: &Principal,
        id: &str,
    ) -> Result<SessionView, EngineError> {
        self.in_scope(principal, id).await?;
        let view = self
            .ask(id, |reply| Command::View { reply })
            .await?
            .filter(|v| principal.can_see(&v.project));
        view.ok_or_else(|| EngineError::NotFound(format!("Session {id} does not exist.")))
    }

    /// Dispatches an action through the whole pipeline and waits for its
    /// outcome.
    pub async fn dispatch(
        &self,
        principal: &Principal,
        origin: Option<Origin>,
        channel: &str,
        action: Value,
    ) -> DispatchOutcome {
        self.submit(principal, origin, channel, action)
            .await
            .outcome()
            .await
    }

    /// Hands an action to its session in order and returns without waiting
    /// for the commit: a connection submits its dispatches one after another
    /// (so they reach the session in the order sent) and collects the
    /// outcomes as they come, instead of one commit per round trip.
    pub async fn submit(
        &self,
        principal: &Principal,
        origin: Option<Origin>,
        channel: &str,
        action: Value,
    ) -> Submitted {
        let since = Instant::now();
        let answer = self.hand_over(principal, origin, channel, action).await;
        Submitted {
            answer,
            since,
            metrics: self.ctx.metrics.clone(),
        }
    }

    async fn hand_over(
        &self,
        principal: &Principal,
        origin: Option<Origin>,
        channel: &str,
        action: Value,
    ) -> Answer {
        let missing = || {
            Answer::Done(DispatchOutcome::Rejected(Refusal::new(
                RefusalKind::NotFound,
                format!("Channel {channel} does not exist."),
            )))
        };
        if !principal.can_write() {
            return Answer::Done(DispatchOutcome::Rejected(Refusal::new(
                RefusalKind::Forbidden,
                "Viewers cannot dispatch actions.",
            )));
        }
        // A channel that is not a URI of this host cannot exist.
        let Ok(parsed) = Channel::parse(channel) else {
            return missing();
        };
        if parsed == Channel::Root {
            // The root state is every project's: a principal limited to
            // some projects may not change it.
            if principal.project_scope().is_some() {
                return Answer::Done(DispatchOutcome::Rejected(Refusal::new(
                    RefusalKind::Forbidden,
                    "Only a principal of every project may change the root state.",
                )));
            }
            return Answer::Done(self.dispatch_root(origin, action).await);
        }
        let session = match self.session_of(&parsed).await {
            Ok(Some(session)) => session,
            Ok(None) => return missing(),
            Err(err) => {
                return Answer::Done(DispatchOutcome::Rejected(Refusal::new(
                    RefusalKind::Unavailable,
                    err.to_string(),
                )));
            }
        };
        match self.in_scope(principal, &session).await {
            Ok(()) => {}
            Err(EngineError::NotFound(_)) => return missing(),
            Err(err) => {
                return Answer::Done(DispatchOutcome::Rejected(Refusal::new(
                    RefusalKind::Unavailable,
                    err.to_string(),
                )));
            }
        }
        let (reply, answer) = oneshot::channel();
        self.send(
            &session,
            Command::Dispatch(Box::new(Dispatch {
                origin,
                channel: channel.to_owned(),
                action,
                principal: Some(principal.clone()),
                reply: Some(reply),
                directed: None,
            })),
        )
        .await;
        Answer::Pending(answer)
    }

    /// A channel's state and the seq it includes, taken atomically.
    pub async fn snapshot(
        &self,
        principal: &Principal,
        channel: &str,
    ) -> Result<ChannelSnapshot, EngineError> {
        let parsed =
            Channel::parse(channel).map_err(|e| EngineError::InvalidParams(e.to_string()))?;
        if parsed == Channel::Root {
            let root = self.ctx.root.lock().await;
            let mut state = serde_json::to_value(&root.state).unwrap_or(Value::Null);
            // The count of active sessions counts every project's: a
            // principal limited to some projects is not told it.
            if principal.project_scope().is_some()
                && let Value::Object(map) = &mut state
            {
                map.remove("activeSessions");
            }
            // What AHP's AgentInfo has no field for: how each agent logs
            // in, and why it could not open a session (a login it needs).
            let logins: serde_json::Map<String, Value> = self
                .ctx
                .agents
                .list()
                .iter()
                .filter_map(|spec| {
                    let caps = spec.acp_capabilities()?;
                    let mut entry = json!({"authMethods": caps.auth_methods});
                    if let Some(error) = &caps.session_error {
                        entry["sessionError"] = json!(error);
                    }
                    Some((spec.provider.clone(), entry))
                })
                .collect();
            if !logins.is_empty() {
                state["_meta"]["tether/agents"] = Value::Object(logins);
            }
            return Ok(ChannelSnapshot {
                resource: ROOT.to_owned(),
                state,
                from_seq: root.last_seq,
            });
        }
        let not_found = || EngineError::NotFound(format!("Channel {channel} does not exist."));
        let session = self.session_of(&parsed).await?.ok_or_else(not_found)?;
        // Another project's channel answers exactly as a missing one.
        self.session_view(principal, &session)
            .await
            .map_err(|err| match err {
                EngineError::NotFound(_) => not_found(),
                other => other,
            })?;
        let found = self
            .ask(&session, |reply| Command::Snapshot {
                channel: channel.to_owned(),
                reply,
            })
            .await?;
        let (state, from_seq) = found.ok_or_else(not_found)?;
        Ok(ChannelSnapshot {
            resource: channel.to_owned(),
            state,
            from_seq,
        })
    }

    /// Whether a channel exists and the principal may see it.
    pub async fn visible(&self, principal: &Principal, channel: &str) -> bool {
        self.snapshot(principal, channel).await.is_ok()
    }
}

/// A JSON-RPC notification's text.
pub fn notification(method: &str, params: Value) -> String {
    json!({"jsonrpc": "2.0", "method": method, "params": params}).to_string()
}

#[cfg(test)]
mod item_sizes {
    /// Every session actor's mailbox and every connection's inbox keep
    /// the slots their last burst needed (up to eight after a large one),
    /// so an item's size is paid several times by every session in memory
    /// and every connection, busy or idle. A large variant goes in a box.
    #[test]
    fn queued_items_stay_small() {
        let command = std::mem::size_of::<super::actor::Command>();
        assert!(
            command <= 64,
            "a session command is {command} bytes; box the large variant"
        );
        let item = std::mem::size_of::<super::fanout::HubItem>();
        assert!(
            item <= 16,
            "a hub item is {item} bytes; box the large variant"
        );
    }
}
