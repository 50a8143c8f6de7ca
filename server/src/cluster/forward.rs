//! Forwarding a write to the host holding the session's lease, through the
//! database.
//!
//! ```text
//! sender:  INSERT forwards (holder, request) ; NOTIFY tether_forward <holder>
//! holder:  UPDATE forwards SET claimed  (its own, unclaimed)  → run each
//!          UPDATE forwards SET answer   ; NOTIFY tether_answer <sender>
//! sender:  DELETE forwards (its own, answered) RETURNING answer
//! ```
//!
//! A sender whose holder does not answer checks the lease: if it expired,
//! the sender withdraws its unclaimed request and takes the session over.
//! A request the holder claimed but never answered (it died mid-way) times
//! out with "retry": the origin makes the retry exactly-once.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use tokio::sync::oneshot;

use super::Cluster;
use crate::store::StoreError;

/// What [`Cluster::reclaim`] found.
#[derive(Debug)]
pub enum Reclaimed {
    /// The holder had answered it: its answer.
    Answered(String),
    /// Unanswered, and withdrawn: the holder can no longer answer it.
    Withdrawn,
    /// Answered and collected: the answer is on its way to the waiter.
    Arriving,
}

/// A claimed request: (row id, session id, request JSON).
pub type Claimed = (i64, String, String);

/// Answers this host waits for, by request id.
#[derive(Debug, Default)]
pub struct Pending {
    waiting: Mutex<HashMap<i64, oneshot::Sender<String>>>,
}

impl Cluster {
    /// Sends `request` for `session` to `holder`; the answer arrives on the
    /// returned receiver (after [`Cluster::start_collector`] is running).
    pub async fn forward(
        &self,
        pending: &Pending,
        session: &str,
        holder: &str,
        request: &str,
    ) -> Result<(i64, oneshot::Receiver<String>), StoreError> {
        let id: i64 = sqlx::query_scalar(
            "WITH f AS (INSERT INTO forwards (session_id, holder, sender, request) \
                        VALUES ($1, $2, $3, $4) RETURNING id) \
             SELECT f.id FROM f, pg_notify('tether_forward', $2) AS n",
        )
        .bind(session)
        .bind(holder)
        .bind(self.host())
        .bind(request)
        .fetch_one(self.pool())
        .await?;
        let (sender, receiver) = oneshot::channel();
        if let Ok(mut waiting) = pending.waiting.lock() {
            waiting.insert(id, sender);
        }
        // An answer that raced ahead of the registration is collected now.
        self.wake.answer.notify_one();
        Ok((id, receiver))
    }

    /// Withdraws a request nobody claimed yet; `false` when it was claimed
    /// (or answered) already.
    pub async fn withdraw(&self, pending: &Pending, id: i64) -> Result<bool, StoreError> {
        let gone = sqlx::query("DELETE FROM forwards WHERE id = $1 AND NOT claimed")
            .bind(id)
            .execute(self.pool())
            .await?
            .rows_affected()
            > 0;
        if gone && let Ok(mut waiting) = pending.waiting.lock() {
            waiting.remove(&id);
        }
        Ok(gone)
    }

    /// Takes a claimed request back from a holder that is gone (see
    /// [`Cluster::host_alive`]): once its row is deleted the holder's answer
    /// has nowhere to go, so the request is either answered already (the
    /// answer is returned), or will never be.
    pub async fn reclaim(&self, pending: &Pending, id: i64) -> Result<Reclaimed, StoreError> {
        let row: Option<(Option<String>,)> =
            sqlx::query_as("DELETE FROM forwards WHERE id = $1 RETURNING answer")
                .bind(id)
                .fetch_optional(self.pool())
                .await?;
        let Some((answer,)) = row else {
            // The collector deleted it first: it is handing the answer to
            // the waiter.
            return Ok(Reclaimed::Arriving);
        };
        if let Ok(mut waiting) = pending.waiting.lock() {
            waiting.remove(&id);
        }
        Ok(answer.map_or(Reclaimed::Withdrawn, Reclaimed::Answered))
    }

    /// Whether `host`'s row is live by the database's clock: it renews, so
    /// it will answer what it claimed. A host that left (its row deleted)
    /// or stopped renewing (dead, or cut off from the database) will not.
    pub async fn host_alive(&self, host: &str) -> Result<bool, StoreError> {
        Ok(sqlx::query_scalar(
            "SELECT EXISTS (SELECT 1 FROM cluster_hosts WHERE id = $1 AND expires_at >= now())",
        )
        .bind(host)
        .fetch_one(self.pool())
        .await?)
    }

    /// Gives up on a request whatever its state (it timed out).
    pub async fn abandon(&self, pending: &Pending, id: i64) {
        if let Ok(mut waiting) = pending.waiting.lock() {
            waiting.remove(&id);
        }
        let _ = sqlx::query("DELETE FROM forwards WHERE id = $1")
            .bind(id)
            .execute(self.pool())
            .await;
    }

    /// Claims every request waiting for this host.
    pub async fn claim(&self) -> Result<Vec<Claimed>, StoreError> {
        Ok(sqlx::query_as(
            "UPDATE forwards SET claimed = TRUE WHERE holder = $1 AND NOT claimed \
             RETURNING id, session_id, request",
        )
        .bind(self.host())
        .fetch_all(self.pool())
        .await?)
    }

    /// Requests this host id claimed and never answered: a previous
    /// process of this host died (or stopped) with them in hand.
    pub async fn claimed_unanswered(&self) -> Result<Vec<(i64, String)>, StoreError> {
        Ok(sqlx::query_as(
            "SELECT id, request FROM forwards WHERE holder = $1 AND claimed AND answer IS NULL",
        )
        .bind(self.host())
        .fetch_all(self.pool())
        .await?)
    }

    /// Puts a claimed, unanswered request back to be claimed again.
    pub async fn unclaim(&self, id: i64) -> Result<(), StoreError> {
        sqlx::query("UPDATE forwards SET claimed = FALSE WHERE id = $1 AND answer IS NULL")
            .bind(id)
            .execute(self.pool())
            .await?;
        Ok(())
    }

    /// Writes the answer to a claimed request and wakes its sender.
    pub async fn answer(&self, id: i64, answer: &str) -> Result<(), StoreError> {
        sqlx::query(
            "WITH a AS (UPDATE forwards SET answer = $2 WHERE id = $1 RETURNING sender) \
             SELECT pg_notify('tether_answer', a.sender) FROM a",
        )
        .bind(id)
        .bind(answer)
        .execute(self.pool())
        .await?;
        Ok(())
    }

    /// Starts the task that collects answers for `pending`.
    pub fn start_collector(self: &Arc<Self>, pending: Arc<Pending>) {
        tokio::spawn(
            self.stop
                .clone()
                .run_until_cancelled_owned(collect_loop(Arc::downgrade(self), pending)),
        );
    }

    /// Takes the answers of the requests waited for. Only those: a request
    /// is answered as soon as its row is in the database, which can be
    /// before [`Cluster::forward`] has registered its waiter, and an answer
    /// taken then would be dropped (its sender would wait out its limit).
    /// Such an answer is taken by the next collection; rows nobody waits
    /// for any more are deleted by whoever gave up on them, or swept.
    async fn collect(&self, pending: &Pending) -> Result<(), StoreError> {
        let ids = pending.ids();
        if ids.is_empty() {
            return Ok(());
        }
        let answered: Vec<(i64, String)> = sqlx::query_as(
            "DELETE FROM forwards WHERE sender = $1 AND answer IS NOT NULL AND id = ANY($2) \
             RETURNING id, answer",
        )
        .bind(self.host())
        .bind(ids)
        .fetch_all(self.pool())
        .await?;
        if answered.is_empty() {
            return Ok(());
        }
        if let Ok(mut waiting) = pending.waiting.lock() {
            for (id, answer) in answered {
                if let Some(sender) = waiting.remove(&id) {
                    let _ = sender.send(answer);
                }
            }
        }
        Ok(())
    }

    /// Deletes requests older than `age` (their sender or holder died).
    pub async fn sweep_forwards(&self, age: Duration) {
        let _ = sqlx::query(
            "DELETE FROM forwards WHERE created_at < now() - make_interval(secs => $1)",
        )
        .bind(age.as_secs_f64())
        .execute(self.pool())
        .await;
    }
}

impl Pending {
    fn is_empty(&self) -> bool {
        self.waiting.lock().map(|w| w.is_empty()).unwrap_or(true)
    }

    /// The requests whose answers are waited for.
    fn ids(&self) -> Vec<i64> {
        self.waiting
            .lock()
            .map(|w| w.keys().copied().collect())
            .unwrap_or_default()
    }
}

async fn collect_loop(cluster: Weak<Cluster>, pending: Arc<Pending>) {
    loop {
        let Some(strong) = cluster.upgrade() else {
            return;
        };
        // Woken by a notification; polled while answers are awaited, in
        // case a notification was lost.
        let poll = if pending.is_empty() {
            Duration::from_secs(5)
        } else {
            Duration::from_millis(100)
        };
        let _ = tokio::time::timeout(poll, strong.wake.answer.notified()).await;
        if pending.is_empty() {
            continue;
        }
        if let Err(err) = strong.collect(&pending).await {
            tracing::warn!(error = %err, "cannot collect forwarded answers; retrying");
            drop(strong);
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}
