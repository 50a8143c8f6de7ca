//! Group commit: one writer task takes every append request that is ready,
//! from every session, and commits them in one transaction; a publisher task
//! then publishes the committed envelopes to the hub in seq order and answers
//! each request, while the writer commits the next batch.

use std::sync::Arc;

use tokio::sync::{mpsc, oneshot};

use super::Metrics;
use super::delivery::Delivery;
use super::fanout::{Published, action_frame};
use crate::store::{Appended, NewEnvelope, OriginOutcome, Snapshot, Store, StoreError};

/// The outcome of one appended envelope.
#[derive(Debug, Clone)]
pub enum CommitOutcome {
    /// Committed and published.
    Committed(Arc<Published>),
    /// Its origin already had an outcome; nothing was written.
    Duplicate(OriginOutcome),
    /// Another host holds the session's lease; nothing was written.
    Fenced,
}

/// Why a commit failed: the whole batch was not written.
#[derive(Debug, Clone, thiserror::Error)]
#[error("storage unavailable: {0}")]
pub struct CommitError(pub String);

/// Where a request's outcomes go.
type Reply = oneshot::Sender<Result<Vec<CommitOutcome>, CommitError>>;

struct Request {
    envelopes: Vec<NewEnvelope>,
    /// Written in the same transaction.
    snapshots: Vec<Snapshot>,
    /// `None` for a snapshot nobody waits for.
    reply: Option<Reply>,
}

/// The handle sessions append through.
#[derive(Debug, Clone)]
pub struct Committer {
    sender: mpsc::Sender<Request>,
    health: Arc<WriterHealth>,
}

/// How long after a failed group commit the writer counts as unhealthy
/// when no commit has succeeded since: `/readyz` answers 503 for that
/// long, then lets traffic probe the store again.
const UNHEALTHY_FOR: std::time::Duration = std::time::Duration::from_secs(5);

/// The writer's last failure, cleared by the next successful commit.
#[derive(Debug, Default)]
struct WriterHealth {
    failed: std::sync::Mutex<Option<(std::time::Instant, String)>>,
}

impl WriterHealth {
    fn record(&self, result: Result<(), &StoreError>) {
        if let Ok(mut failed) = self.failed.lock() {
            *failed = result
                .err()
                .map(|err| (std::time::Instant::now(), err.to_string()));
        }
    }
}

impl std::fmt::Debug for Request {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Request")
            .field("envelopes", &self.envelopes.len())
            .finish()
    }
}

impl Committer {
    /// Starts the writer task. `max_batch` bounds the envelopes in one
    /// transaction; `queue` bounds the requests waiting for it.
    /// `outbox` is woken once a batch that raised notification events is
    /// durable.
    pub fn start(
        store: Arc<dyn Store>,
        delivery: Arc<Delivery>,
        metrics: Arc<Metrics>,
        outbox: Arc<tokio::sync::Notify>,
        max_batch: usize,
        queue: usize,
    ) -> Self {
        let (sender, receiver) = mpsc::channel(queue.max(1));
        let health = Arc::new(WriterHealth::default());
        tokio::spawn(run(
            store,
            (delivery, outbox),
            metrics,
            health.clone(),
            receiver,
            max_batch.max(1),
        ));
        Self { sender, health }
    }

    /// `Err` with the store's words while the last group commit failed
    /// (less than a few seconds ago, and nothing committed since).
    pub fn health(&self) -> Result<(), String> {
        let failed = self
            .health
            .failed
            .lock()
            .map_err(|_| "the writer panicked")?;
        match &*failed {
            Some((at, err)) if at.elapsed() < UNHEALTHY_FOR => {
                Err(format!("the last group commit failed: {err}"))
            }
            _ => Ok(()),
        }
    }

    /// Appends envelopes durably and returns one outcome each, in order.
    pub async fn append(
        &self,
        envelopes: Vec<NewEnvelope>,
    ) -> Result<Vec<CommitOutcome>, CommitError> {
        if envelopes.is_empty() {
            return Ok(Vec::new());
        }
        let (reply, answer) = oneshot::channel();
        self.sender
            .send(Request {
                envelopes,
                snapshots: Vec::new(),
                reply: Some(reply),
            })
            .await
            .map_err(|_| CommitError("the writer has stopped".to_owned()))?;
        answer
            .await
            .map_err(|_| CommitError("the writer has stopped".to_owned()))?
    }
}

impl Committer {
    /// Queues a snapshot for the next group commit and returns at once. A
    /// snapshot is a cache (the transcript is the truth), so nobody waits
    /// for it; a failed write is logged by the writer.
    pub async fn snapshot(&self, snapshot: Snapshot) -> Result<(), CommitError> {
        self.sender
            .send(Request {
                envelopes: Vec::new(),
                snapshots: vec![snapshot],
                reply: None,
            })
            .await
            .map_err(|_| CommitError("the writer has stopped".to_owned()))
    }
}

/// A committed (or failed) batch on its way to the hub and its senders.
struct Written {
    result: Result<Vec<Appended>, StoreError>,
    envelopes: Vec<NewEnvelope>,
    snapshots: usize,
    /// Envelopes per request, in order.
    counts: Vec<usize>,
    replies: Vec<Option<Reply>>,
    /// Told once the batch is published, when the writer waits for that.
    published: Option<oneshot::Sender<()>>,
}

async fn run(
    store: Arc<dyn Store>,
    (delivery, outbox): (Arc<Delivery>, Arc<tokio::sync::Notify>),
    metrics: Arc<Metrics>,
    health: Arc<WriterHealth>,
    mut receiver: mpsc::Receiver<Request>,
    max_batch: usize,
) {
    // Publishing a batch (its frames, the hub, the answers) overlaps the
    // next batch's commit; one batch at most waits to be published.
    let (written, to_publish) = mpsc::channel(1);
    tokio::spawn(publish(
        delivery.clone(),
        outbox,
        metrics.clone(),
        to_publish,
    ));
    while let Some(first) = receiver.recv().await {
        let mut size = first.envelopes.len();
        let mut requests = vec![first];
        // Everything already waiting joins this transaction.
        while size < max_batch {
            match receiver.try_recv() {
                Ok(request) => {
                    size += request.envelopes.len();
                    requests.push(request);
                }
                Err(_) => break,
            }
        }
        let mut all = Vec::with_capacity(size);
        let mut snapshots = Vec::new();
        let mut counts = Vec::with_capacity(requests.len());
        let mut replies = Vec::with_capacity(requests.len());
        for request in requests {
            counts.push(request.envelopes.len());
            all.extend(request.envelopes);
            snapshots.extend(request.snapshots);
            replies.push(request.reply);
        }
        let snapshot_count = snapshots.len();
        // With several hosts, nothing is published while this batch is in
        // the database but not yet on the hub (see `delivery`), so the next
        // batch waits until this one is published.
        let gate = delivery.enter().await;
        let shared = Arc::new(all);
        let started = std::time::Instant::now();
        let result = store.append_with_snapshots(shared.clone(), snapshots).await;
        metrics
            .commit_seconds
            .observe(started.elapsed().as_secs_f64());
        health.record(result.as_ref().map(|_| ()));
        // The store has let go of the batch by the time it answers.
        let envelopes = Arc::try_unwrap(shared).unwrap_or_else(|still| (*still).clone());
        let (published, wait) = match gate {
            Some(_) => {
                let (tell, told) = oneshot::channel();
                (Some(tell), Some(told))
            }
            None => (None, None),
        };
        let batch = Written {
            result,
            envelopes,
            snapshots: snapshot_count,
            counts,
            replies,
            published,
        };
        if written.send(batch).await.is_err() {
            return;
        }
        if let Some(wait) = wait {
            let _ = wait.await;
        }
        drop(gate);
    }
}

/// Publishes each written batch in commit order and answers its requests.
async fn publish(
    delivery: Arc<Delivery>,
    outbox: Arc<tokio::sync::Notify>,
    metrics: Arc<Metrics>,
    mut written: mpsc::Receiver<Written>,
) {
    while let Some(batch) = written.recv().await {
        let size = batch.envelopes.len();
        match batch.result {
            Ok(appended) => {
                let committed = std::time::Instant::now();
                metrics.commits.inc();
                metrics.committed_envelopes.inc_by(size as u64);
                metrics.batch_envelopes.observe(size as f64);
                let mut fresh = Vec::with_capacity(size);
                let outcomes: Vec<CommitOutcome> = appended
                    .into_iter()
                    .zip(batch.envelopes)
                    .map(|(result, envelope)| match result {
                        Appended::Committed { seq, .. } => {
                            if !envelope.events.is_empty() {
                                outbox.notify_one();
                            }
                            if let Some(u) = &envelope.usage {
                                metrics.usage(
                                    &u.project,
                                    &u.agent,
                                    (u.input_tokens, u.output_tokens),
                                    u.cost_micros,
                                    &u.currency,
                                );
                            }
                            let frame = action_frame(
                                seq,
                                &envelope.channel,
                                &envelope.action,
                                envelope.origin.as_ref(),
                                None,
                            );
                            let directed = envelope.directed.map(|d| {
                                let frame =
                                    action_frame(seq, &envelope.channel, &d.action, None, None);
                                super::fanout::DirectedFrame {
                                    client_id: d.client_id,
                                    sub: d.sub,
                                    frame: frame.into(),
                                }
                            });
                            let published = Arc::new(Published {
                                seq,
                                creates: super::fanout::creates_session(
                                    &envelope.channel,
                                    &envelope.action,
                                ),
                                channel: envelope.channel,
                                frame: frame.into(),
                                directed,
                                committed,
                            });
                            fresh.push(published.clone());
                            CommitOutcome::Committed(published)
                        }
                        Appended::Duplicate(outcome) => CommitOutcome::Duplicate(outcome),
                        Appended::Fenced => CommitOutcome::Fenced,
                    })
                    .collect();
                let wakes = delivery.publish_local(fresh).await;
                if let Some(published) = batch.published {
                    let _ = published.send(());
                }
                // The envelopes are in their subscribers' inboxes already;
                // the answers go before the wakes, which may yield.
                let mut outcomes = outcomes.into_iter();
                for (count, reply) in batch.counts.into_iter().zip(batch.replies) {
                    let mine: Vec<_> = outcomes.by_ref().take(count).collect();
                    if let Some(reply) = reply {
                        let _ = reply.send(Ok(mine));
                    }
                }
                wakes.wake().await;
            }
            Err(err) => {
                if let Some(published) = batch.published {
                    let _ = published.send(());
                }
                metrics.commit_failures.inc();
                metrics.store_error("commit");
                tracing::error!(error = %err, envelopes = size, snapshots = batch.snapshots,
                    "group commit failed");
                let err = CommitError(err.to_string());
                for reply in batch.replies.into_iter().flatten() {
                    let _ = reply.send(Err(err.clone()));
                }
            }
        }
    }
}
