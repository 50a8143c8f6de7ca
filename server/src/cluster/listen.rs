//! The one `LISTEN` connection of a host: it turns notifications into
//! wake-ups. After the connection was lost and re-established, every
//! waiter is woken, since notifications sent meanwhile are gone.

use std::sync::{Arc, Weak};
use std::time::Duration;

use sqlx::postgres::{PgListener, PgPoolOptions};

use super::{ANSWER_CHANNEL, Cluster, FORWARD_CHANNEL, LOG_CHANNEL};
use crate::store::StoreError;

/// Connects the listener and starts its task.
pub(super) async fn start(cluster: &Arc<Cluster>) -> Result<(), StoreError> {
    // A pool of its own: the LISTEN connection is held for good, and the
    // store's pool must be able to close without waiting for it.
    let own = PgPoolOptions::new()
        .max_connections(1)
        .connect_lazy_with((*cluster.pool().connect_options()).clone());
    let mut listener = PgListener::connect_with(&own).await?;
    listener
        .listen_all([LOG_CHANNEL, FORWARD_CHANNEL, ANSWER_CHANNEL])
        .await?;
    tokio::spawn(
        cluster
            .stop
            .clone()
            .run_until_cancelled_owned(run(listener, Arc::downgrade(cluster))),
    );
    Ok(())
}

async fn run(mut listener: PgListener, cluster: Weak<Cluster>) {
    loop {
        let received = listener.try_recv().await;
        let Some(cluster) = cluster.upgrade() else {
            return;
        };
        match received {
            Ok(Some(notification)) => match notification.channel() {
                LOG_CHANNEL => {
                    if let Ok(seq) = notification.payload().parse::<u64>() {
                        cluster.heard_of(seq);
                    }
                    cluster.wake.log.notify_one();
                }
                FORWARD_CHANNEL if notification.payload() == cluster.host() => {
                    cluster.wake.forward.notify_one();
                }
                ANSWER_CHANNEL if notification.payload() == cluster.host() => {
                    cluster.wake.answer.notify_one();
                }
                _ => {}
            },
            Ok(None) => {
                tracing::warn!(
                    "the LISTEN connection was lost; reconnecting and catching up by seq"
                );
                wake_all(&cluster);
            }
            Err(err) => {
                tracing::warn!(error = %err, "LISTEN failed; retrying");
                wake_all(&cluster);
                drop(cluster);
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        }
    }
}

fn wake_all(cluster: &Cluster) {
    cluster.wake.log.notify_one();
    cluster.wake.forward.notify_one();
    cluster.wake.answer.notify_one();
}
