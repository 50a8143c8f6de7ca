//! Tether's server: the HTTP and AHP host, the session engine and the store.
//!
//! The binary (`src/main.rs`) only parses the command line; everything it runs
//! lives here so tests can start the real server on a port-0 listener with
//! [`serve`] and stop it with a future they control.

pub mod agents;
pub mod auth;
pub mod cli;
pub mod cluster;
pub mod config;
pub mod doctor;
pub mod effects;
pub mod engine;
pub mod http;
pub mod migrate;
pub mod store;
pub mod telemetry;
pub mod webhooks;
pub mod ws;

use std::future::Future;
use std::sync::Arc;
use std::time::Instant;

use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::agents::Agents;
use crate::config::{EffectsConfig, ServeConfig};
use crate::effects::{AgentEffects, Effects, LocalEffects, WebhookEffects};
use crate::engine::Engine;
use crate::store::{Store, StoreError};
use crate::ws::WsLimits;

/// Everything a request handler may need; cheap to clone.
#[derive(Debug, Clone)]
pub struct AppState {
    /// The durable store.
    pub store: Arc<dyn Store>,
    /// The session engine.
    pub engine: Engine,
    /// The configuration the server was started with.
    pub config: Arc<ServeConfig>,
    /// WebSocket limits.
    pub ws: WsLimits,
    /// One permit per open WebSocket connection.
    pub connections: Arc<Semaphore>,
    /// Cancelled when the server shuts down; upgraded sockets watch it
    /// (axum's graceful shutdown does not wait for them).
    pub shutdown: CancellationToken,
    /// Cancelled first when shutdown begins: `/readyz` answers 503 and new
    /// WebSocket connections are refused from then on.
    pub draining: CancellationToken,
    /// Tracks connection tasks so shutdown can wait for them.
    pub tasks: TaskTracker,
    /// When the server started.
    pub started: Instant,
    /// Authentication and per-principal limits.
    pub auth: auth::credentials::Auth,
}

impl AppState {
    /// Builds the state for a server on `store`: starts the engine.
    pub async fn new(store: Arc<dyn Store>, mut config: ServeConfig) -> Result<Self, StoreError> {
        let epoch = store.host().await?.epoch.to_string();
        config.engine.sandbox = config.sandbox.sandbox(&epoch);
        // Made now (private to this user) and resolved, so the roots keep
        // sessions out of where it really is, however it was written.
        let scratch = config.engine.sandbox.scratch_root().to_path_buf();
        {
            use std::os::unix::fs::DirBuilderExt;
            if let Err(err) = std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(&scratch)
            {
                tracing::warn!(error = %err, scratch = %scratch.display(), "cannot make the agents' scratch root");
            }
        }
        let scratch = std::fs::canonicalize(&scratch).unwrap_or(scratch);
        config.engine.roots = std::mem::take(&mut config.engine.roots).keeping_out(&scratch);
        config.engine.sandbox.log_start();
        // Off the runtime's workers and not waited for: reading another
        // process's environment can block on it.
        let sandbox = config.engine.sandbox.clone();
        tokio::task::spawn_blocking(move || {
            let stopped = sandbox.stop_left_running();
            if stopped > 0 {
                tracing::warn!(
                    processes = stopped,
                    "stopped processes the last run left running (it was killed)"
                );
            }
        });
        config
            .engine
            .sandbox
            .remove_legacy_probe_scratches(&*store)
            .await;
        let effects: Arc<dyn Effects> = match &config.effects {
            EffectsConfig::Local => Arc::new(LocalEffects),
            EffectsConfig::Webhook { url } => Arc::new(
                WebhookEffects::new(url, config.engine.effect_timeout)
                    .map_err(StoreError::Corrupt)?,
            ),
            EffectsConfig::Agent => Arc::new(AgentEffects),
        };
        let agents =
            agents::acp::probe_all(&config.agents, &config.engine.acp, &config.engine.sandbox)
                .await;
        let metrics = Arc::new(engine::Metrics::new(config.auth.failures().clone()));
        let engine = Engine::start(
            store.clone(),
            Agents::new(agents),
            effects,
            config.engine.clone(),
            metrics,
        )
        .await?;
        Ok(Self {
            store,
            engine,
            ws: config.ws.clone(),
            connections: Arc::new(Semaphore::new(config.ws.max_connections.max(1))),
            auth: config.auth.clone(),
            config: Arc::new(config),
            shutdown: CancellationToken::new(),
            draining: CancellationToken::new(),
            tasks: TaskTracker::new(),
            started: Instant::now(),
        })
    }
}

/// Serves HTTP on `listener` until `shutdown` resolves, then drains in-flight
/// requests (bounded by the configured grace period) and closes the store.
pub async fn serve(
    listener: TcpListener,
    state: AppState,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let store = state.store.clone();
    let engine = state.engine.clone();
    if let Ok(addr) = listener.local_addr() {
        engine.mcp().listening(addr);
    }
    let grace = state.config.shutdown_grace;
    let drain_delay = state.config.drain_delay;
    let sockets = state.shutdown.clone();
    let draining = state.draining.clone();
    let tasks = state.tasks.clone();
    let stopping = engine.clone();
    // The AHP surface sits beside the REST one, under the same layers.
    let app = http::router(state, ws::router());
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    // TCP_NODELAY, and deadlines for request heads and idle connections.
    let listener = http::listener::Guarded::new(listener);
    // The order an operator can rely on: not ready (load balancers stop
    // sending), the drain delay, agents stopped and their sessions settled
    // while clients still watch, every socket closed with 1001, in-flight
    // requests drained; then the store closes. All within the grace period.
    let server = axum::serve(listener, app).with_graceful_shutdown(async move {
        shutdown.await;
        draining.cancel();
        tracing::info!(
            ?drain_delay,
            ?grace,
            "shutdown requested: not ready; draining"
        );
        tokio::time::sleep(drain_delay).await;
        match tokio::time::timeout(grace, stopping.stop_agents()).await {
            Ok(sessions) => tracing::info!(sessions, "agents stopped and sessions settled"),
            Err(_) => tracing::warn!("sessions still settling after the grace period"),
        }
        sockets.cancel();
        let _ = stop_tx.send(());
    });
    let server = tokio::spawn(async move { server.await });
    let result = {
        tokio::pin!(server);
        tokio::select! {
            joined = &mut server => joined,
            () = async {
                // Only once shutdown began does the grace period run.
                let _ = stop_rx.await;
                tokio::time::sleep(grace).await;
            } => {
                tracing::warn!(?grace, "requests still running after the grace period; closing anyway");
                server.abort();
                Ok(Ok(()))
            }
        }
    };
    tasks.close();
    if tokio::time::timeout(grace, tasks.wait()).await.is_err() {
        tracing::warn!("WebSocket connections still open after the grace period");
    }
    // Other hosts take this host's sessions over at once, not after the
    // lease time.
    engine.leave().await;
    store.close().await;
    tracing::info!("store closed; server stopped");
    match result {
        Ok(served) => served,
        Err(join) => Err(std::io::Error::other(join)),
    }
}
