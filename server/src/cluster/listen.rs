//! The one `LISTEN` connection of a host: it turns notifications into
//! wake-ups. After the connection was lost and re-established, every
//! waiter is woken, since notifications sent meanwhile are gone.

use std::sync::{Arc, Weak};
use std::time::Duration;

use sqlx::postgres::{PgListener, PgPoolOptions};

use super::{ANSWER_CHANNEL, Cluster, FORWARD_CHANNEL, GONE_CHANNEL, LOG_CHANNEL};
use crate::store::StoreError;

/// Connects the listener and starts its task.
pub(super) async fn start(cluster: &Arc<Cluster>) -> Result<(), StoreError> {
    // A pool of its own: the LISTEN connection is held for good, and the
    // store's pool must be able to close without waiting for it.
    // Its acquire timeout bounds each reconnection attempt (sqlx backs off
    // within it up to a fifth of it): the connection comes back within
    // about a second of Postgres, not after a 30 s default's 6 s backoff.
    let own = PgPoolOptions::new()
        .max_connections(1)
        .acquire_timeout(RECONNECT_ATTEMPT)
        .connect_lazy_with((*cluster.pool().connect_options()).clone());
    let mut listener = PgListener::connect_with(&own).await?;
    listener
        .listen_all([LOG_CHANNEL, FORWARD_CHANNEL, ANSWER_CHANNEL, GONE_CHANNEL])
        .await?;
    tokio::spawn(
        cluster
            .stop
            .clone()
            .run_until_cancelled_owned(run(listener, Arc::downgrade(cluster))),
    );
    Ok(())
}

/// How long one attempt to connect the listener again may take.
const RECONNECT_ATTEMPT: Duration = Duration::from_secs(1);

async fn run(mut listener: PgListener, weak: Weak<Cluster>) {
    loop {
        let received = listener.try_recv().await;
        let Some(cluster) = weak.upgrade() else {
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
                GONE_CHANNEL => cluster.heard_gone(notification.payload()),
                _ => {}
            },
            // Lost and connected again (sqlx reconnects before it says so).
            Ok(None) => {
                tracing::warn!("the LISTEN connection was lost and is back; catching up by seq");
                wake_all(&cluster);
            }
            Err(err) => {
                tracing::warn!(error = %err, "LISTEN failed; reconnecting");
                drop(cluster);
                if !reconnect(&mut listener, &weak).await {
                    return;
                }
            }
        }
    }
}

/// Connects `listener` again (its queries reconnect it and `LISTEN` anew),
/// then wakes every waiter: notifications sent meanwhile are gone. False
/// when the cluster is gone.
async fn reconnect(listener: &mut PgListener, cluster: &Weak<Cluster>) -> bool {
    loop {
        tokio::time::sleep(Duration::from_millis(250)).await;
        let connected = sqlx::query("SELECT 1").execute(&mut *listener).await;
        let Some(cluster) = cluster.upgrade() else {
            return false;
        };
        match connected {
            Ok(_) => {
                tracing::info!("the LISTEN connection is back; catching up by seq");
                wake_all(&cluster);
                return true;
            }
            Err(err) => tracing::debug!(error = %err, "LISTEN not connected yet"),
        }
    }
}
fn wake_all(cluster: &Cluster) {
    cluster.wake.log.notify_one();
    cluster.wake.forward.notify_one();
    cluster.wake.answer.notify_one();
}
