//! Tether's server: the HTTP and AHP host, the session engine and the store.
//!
//! The binary (`src/main.rs`) only parses the command line; everything it runs
//! lives here so tests can start the real server on a port-0 listener with
//! [`serve`] and stop it with a future they control.

pub mod config;
pub mod http;
pub mod store;
pub mod telemetry;

use std::future::Future;
use std::sync::Arc;
use std::time::Instant;

use tokio::net::TcpListener;

use crate::config::ServeConfig;
use crate::store::Store;

/// Everything a request handler may need; cheap to clone.
#[derive(Debug, Clone)]
pub struct AppState {
    /// The durable store.
    pub store: Arc<dyn Store>,
    /// The configuration the server was started with.
    pub config: Arc<ServeConfig>,
    /// When the server started.
    pub started: Instant,
}

impl AppState {
    /// Builds the state for a server on `store`.
    pub fn new(store: Arc<dyn Store>, config: ServeConfig) -> Self {
        Self {
            store,
            config: Arc::new(config),
            started: Instant::now(),
        }
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
    let grace = state.config.shutdown_grace;
    let app = http::router(state);
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let server = axum::serve(listener, app).with_graceful_shutdown(async move {
        shutdown.await;
        tracing::info!("shutdown requested; draining in-flight requests");
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
    store.close().await;
    tracing::info!("store closed; server stopped");
    match result {
        Ok(served) => served,
        Err(join) => Err(std::io::Error::other(join)),
    }
}
