//! Delivery to this host's subscribers in `serverSeq` order, whichever host
//! committed each envelope.
//!
//! On one host the committer publishes its own batches. With several hosts
//! on one Postgres, the log is the truth: every publication passes a gate.
//! The committer holds it across its append, so while a batch of this host
//! is in the database but not yet published nobody else publishes; before
//! publishing its batch it publishes, from the log, what other hosts
//! committed below it. The tailer takes the gate between commits and
//! publishes, from the log, everything above what was published. Every
//! envelope the gate lets through from the log is therefore another host's.
//! Postgres commits appends one after another (the host row's lock), so the
//! log below the highest committed seq has no holes a reader could pass.

use std::sync::Arc;
use std::time::Duration;

use tether_protocol::actions::{SESSION_CREATED, SESSION_SETTLED};
use tether_protocol::channel::ROOT;
use tokio::sync::{Mutex, MutexGuard, mpsc};

use super::fanout::{Hub, Published, Wakes, published_from_store};
use crate::cluster::Cluster;
use crate::store::{Store, StoreError, StoredEnvelope};

/// Envelopes one read of the log takes.
const PAGE: u32 = 1_000;
/// How often a host looks at the log when no notification woke it.
const POLL: Duration = Duration::from_millis(250);

/// The ordered way onto the hub.
#[derive(Debug)]
pub(crate) struct Delivery {
    hub: Arc<Hub>,
    store: Arc<dyn Store>,
    cluster: Option<Arc<Cluster>>,
    gate: Mutex<()>,
    /// Other hosts' envelopes this host's root state and root
    /// notifications must hear of.
    remote: mpsc::UnboundedSender<StoredEnvelope>,
}

impl Delivery {
    /// The delivery path, and the receiver of the other hosts' envelopes
    /// that concern the root channel.
    pub(crate) fn new(
        hub: Arc<Hub>,
        store: Arc<dyn Store>,
        cluster: Option<Arc<Cluster>>,
    ) -> (Arc<Self>, mpsc::UnboundedReceiver<StoredEnvelope>) {
        let (remote, receiver) = mpsc::unbounded_channel();
        let delivery = Arc::new(Self {
            hub,
            store,
            cluster,
            gate: Mutex::new(()),
            remote,
        });
        (delivery, receiver)
    }

    /// Held by the committer across an append, with several hosts.
    pub(crate) async fn enter(&self) -> Option<MutexGuard<'_, ()>> {
        match self.cluster {
            Some(_) => Some(self.gate.lock().await),
            None => None,
        }
    }

    /// Publishes a batch this host just committed (consecutive seqs), after
    /// whatever other hosts committed below it, and gives back the
    /// connections to wake: the caller answers the batch's dispatchers
    /// first, so their answers do not wait behind a large fan-out.
    pub(crate) async fn publish_local(&self, batch: Vec<Arc<Published>>) -> Wakes {
        let mut wakes = Wakes::default();
        let (Some(first), Some(last)) = (batch.first(), batch.last()) else {
            return wakes;
        };
        let last = last.seq;
        if self.cluster.is_some() {
            // Retries until it succeeds: never fails.
            let _ = self.catch_up(Some(first.seq - 1)).await;
        }
        for published in batch {
            if published.seq > self.hub.published() {
                self.hub.publish(published, &mut wakes);
            }
        }
        if let Some(cluster) = &self.cluster {
            cluster.committed(last);
        }
        wakes
    }

    /// Publishes, from the log, every envelope above what was published,
    /// up to `upto` (everything when `None`). The caller holds the gate.
    /// Below a batch of this host's (`upto` given) nothing may be skipped,
    /// so a failing read is retried until it succeeds; the tailer's read
    /// (`None`) gives up and says why, to be tried at the next wake-up.
    async fn catch_up(&self, upto: Option<u64>) -> Result<(), StoreError> {
        let mut failures = 0u32;
        loop {
            let after = self.hub.published();
            if upto.is_some_and(|upto| after >= upto) {
                return Ok(());
            }
            let page = match self.store.read_after(after, None, PAGE).await {
                Ok(page) => page,
                Err(err) if upto.is_none() => return Err(err),
                Err(err) => {
                    failures += 1;
                    if failures == 1 || failures.is_multiple_of(100) {
                        tracing::warn!(error = %err, after, "cannot read the log to deliver other hosts' envelopes before this host's; retrying");
                    }
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            };
            let full = page.len() as u32 == PAGE;
            let mut wakes = Wakes::default();
            let mut reached = false;
            for envelope in page {
                if upto.is_some_and(|upto| envelope.seq > upto) {
                    reached = true;
                    break;
                }
                if envelope.seq != self.hub.published() + 1 {
                    // Cannot happen with appends serialised on the host
                    // row; say so loudly rather than stall delivery.
                    tracing::error!(
                        expected = self.hub.published() + 1,
                        found = envelope.seq,
                        "the log has a gap; delivering on"
                    );
                }
                self.hub
                    .publish(Arc::new(published_from_store(&envelope)), &mut wakes);
                if concerns_root(&envelope) {
                    let _ = self.remote.send(envelope);
                }
            }
            wakes.wake().await;
            if reached || !full {
                return Ok(());
            }
        }
    }

    /// The tailer: publishes other hosts' envelopes as they are committed,
    /// woken by `LISTEN/NOTIFY` and by a short poll.
    pub(crate) fn start_tailer(self: &Arc<Self>) {
        let Some(cluster) = self.cluster.clone() else {
            return;
        };
        let delivery = Arc::downgrade(self);
        let stop = cluster.stop.clone();
        tokio::spawn(stop.run_until_cancelled_owned(async move {
            let mut failing = false;
            loop {
                let woken = tokio::time::timeout(POLL, cluster.wake.log.notified())
                    .await
                    .is_ok();
                let Some(delivery) = delivery.upgrade() else {
                    return;
                };
                // Woken for what is published already (this host's own
                // commits): nothing to read, and the committer keeps the
                // gate. The poll reads the log whatever was announced.
                if woken && !failing && cluster.announced() <= delivery.hub.published() {
                    continue;
                }
                let _gate = delivery.gate.lock().await;
                match delivery.catch_up(None).await {
                    Ok(()) if failing => {
                        failing = false;
                        tracing::info!("reading the log again; other hosts' envelopes delivered");
                    }
                    Ok(()) => {}
                    Err(err) if !failing => {
                        failing = true;
                        tracing::warn!(error = %err, "cannot read the log for other hosts' envelopes; retrying every {POLL:?}");
                    }
                    Err(_) => {}
                }
            }
        }));
    }
}

/// Whether another host's envelope changes this host's root state or root
/// notifications: root actions, session creation and disposal.
fn concerns_root(envelope: &StoredEnvelope) -> bool {
    envelope.channel == ROOT
        || envelope.action.contains(SESSION_CREATED)
        || (envelope.action.contains(SESSION_SETTLED) && envelope.action.contains("disposed"))
}
