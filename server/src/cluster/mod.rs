//! Several hosts on one Postgres database (DESIGN.md, "Several hosts on one
//! Postgres"): the database is the only thing hosts share, and the only way
//! they reach each other.
//!
//! * **Leases** make one host a session's single writer: the host running
//!   the session's actor holds its lease; a lease lives as long as its
//!   holder's row in `cluster_hosts`, which the host renews (one row, however
//!   many sessions it holds); another host takes a lease only once it was
//!   released or its holder's row expired by the database's clock. Every append fences on the leases of the sessions it writes
//!   (see `store/postgres.rs`), so a host that lost a lease cannot write.
//! * **Forwards** carry a write that reached a host which does not hold the
//!   session's lease to the host that does ([`forward`] has the protocol).
//! * **Wake-ups**: `LISTEN/NOTIFY` only wakes hosts up. `tether_log` carries
//!   the new high seq after a commit (sent after the commit, coalesced, off
//!   the committing path); `tether_forward` / `tether_answer` carry the id of
//!   the host to wake. Every waiter also polls, so a lost notification (a
//!   reconnect of the listening connection) costs latency, never data.

pub mod forward;
mod listen;

use std::collections::{HashMap, HashSet};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use sqlx::{AssertSqlSafe, PgPool};
use tokio::sync::{Notify, watch};
use tokio_util::sync::CancellationToken;

use crate::store::StoreError;

/// The channel that wakes tailing hosts after a commit (payload: new high seq).
pub const LOG_CHANNEL: &str = "tether_log";
/// The channel that wakes a host holding forwarded writes (payload: its id).
pub const FORWARD_CHANNEL: &str = "tether_forward";
/// The channel that wakes a host whose forwarded writes were answered.
pub const ANSWER_CHANNEL: &str = "tether_answer";
/// The channel that tells every host which sessions retention deleted
/// (payload: the deleting host's id, a seq above all their envelopes and
/// below any of a session made again since, then the session ids,
/// space-separated).
pub const GONE_CHANNEL: &str = "tether_gone";

/// Largest `tether_gone` payload (Postgres refuses one of 8,000 bytes).
const GONE_PAYLOAD: usize = 7_000;

/// When a lease row is held: not released, and either renewed by its
/// holder's row in `cluster_hosts` (expiry 'infinity', this version) or
/// still within an expiry an older version set and renews itself.
const LIVE: &str = "(leases.expires_at >= now() AND (leases.expires_at < 'infinity' \
     OR EXISTS (SELECT 1 FROM cluster_hosts h \
                WHERE h.id = leases.holder AND h.expires_at >= now())))";

/// Advisory-lock key that serialises root-channel writes across hosts.
const ROOT_LOCK: i64 = 0x7465_7468_6572_0001;

/// What [`Cluster::acquire`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Lease {
    /// This host holds it now. `from` is the host that held it before,
    /// when that was another host (a take-over).
    Mine {
        /// The previous holder, if another host.
        from: Option<String>,
    },
    /// Another host holds it and its lease has not expired.
    HeldBy(String),
}

/// The wake-ups the listener hands out.
#[derive(Debug, Default)]
pub struct Wakeups {
    /// Something was committed (by any host).
    pub log: Notify,
    /// A forwarded write is waiting for this host.
    pub forward: Notify,
    /// A write this host forwarded was answered.
    pub answer: Notify,
    /// Another host's retention deleted sessions ([`Cluster::take_gone`]).
    pub gone: Notify,
}

/// This host's view of the cluster.
#[derive(Debug)]
pub struct Cluster {
    pool: PgPool,
    host: String,
    ttl: Duration,
    /// Sessions whose lease this host holds, each with the moment until
    /// which it is certainly still this host's: when the acquisition or the
    /// last renewal was sent, plus the lease time. The database sets a later
    /// expiry (it runs the statement after it was sent), so no other host
    /// can take the lease before this passes.
    held: Mutex<HashMap<String, Instant>>,
    /// Until when this host's row (and so each of its leases) is certainly
    /// live: the last renewal's moment plus the lease time.
    renewed_until: Mutex<Option<Instant>>,
    /// The listener's wake-ups.
    pub wake: Wakeups,
    /// The newest seq this host committed, for the coalescing notifier.
    committed: watch::Sender<u64>,
    /// The highest seq any host announced (`tether_log` payloads), so the
    /// tailer does not read the log for this host's own commits.
    announced: std::sync::atomic::AtomicU64,
    /// Stops every task of the cluster (and the engine's that use it).
    pub stop: CancellationToken,
    /// Sessions other hosts said they deleted, not yet taken.
    gone: Mutex<Vec<(u64, Vec<String>)>>,
}

impl Cluster {
    /// Joins the cluster on `pool` as `host` (the id the store writes as)
    /// and starts the listener, the lease renewer and the commit notifier.
    pub async fn join(
        pool: PgPool,
        host: String,
        ttl: Duration,
    ) -> Result<std::sync::Arc<Self>, StoreError> {
        let ttl = ttl.max(Duration::from_millis(500));
        // Rows of hosts gone for a day are of no use to anyone: their
        // leases are not live either way.
        sqlx::query("DELETE FROM cluster_hosts WHERE expires_at < now() - interval '1 day'")
            .execute(&pool)
            .await?;
        let (committed, _) = watch::channel(0);
        let cluster = std::sync::Arc::new(Self {
            pool,
            host,
            ttl,
            held: Mutex::new(HashMap::new()),
            renewed_until: Mutex::new(None),
            wake: Wakeups::default(),
            committed,
            announced: std::sync::atomic::AtomicU64::new(0),
            stop: CancellationToken::new(),
            gone: Mutex::new(Vec::new()),
        });
        cluster.renew().await?;
        listen::start(&cluster).await?;
        tokio::spawn(
            cluster
                .stop
                .clone()
                .run_until_cancelled_owned(renew_loop(std::sync::Arc::downgrade(&cluster), ttl)),
        );
        tokio::spawn(cluster.stop.clone().run_until_cancelled_owned(notify_loop(
            cluster.pool.clone(),
            cluster.committed.subscribe(),
        )));
        tracing::info!(host = %cluster.host, lease_ms = ttl.as_millis() as u64, "joined the cluster");
        Ok(cluster)
    }

    /// This host's id (a UUID chosen at start).
    pub fn host(&self) -> &str {
        &self.host
    }

    /// How long a lease lasts without renewal.
    pub fn ttl(&self) -> Duration {
        self.ttl
    }

    /// Whether this host's last renewal is recent enough that its row, and
    /// so each of its leases, is certainly still live. False once renewals
    /// have failed (or hung) for a lease time: another host may be taking
    /// its sessions over.
    pub fn in_contact(&self) -> bool {
        self.renewed_until
            .lock()
            .ok()
            .and_then(|until| *until)
            .is_some_and(|until| Instant::now() < until)
    }

    pub(crate) fn pool(&self) -> &PgPool {
        &self.pool
    }

    /// The highest seq a `tether_log` notification announced.
    pub fn announced(&self) -> u64 {
        self.announced.load(std::sync::atomic::Ordering::Acquire)
    }

    /// Tells the other hosts that this host deleted sessions `ids`, so
    /// that they end their subscriptions to them and forget their chats
    /// (a session made again with one of the ids, in any project, is not
    /// delivered to a subscriber of the deleted one). Sent after the
    /// delete committed; a host whose `LISTEN` connection was down then
    /// does not hear it (see DESIGN.md).
    pub async fn announce_gone(&self, ids: &[String], before: u64) -> Result<(), StoreError> {
        let mut payload = String::new();
        let mut failed = None;
        for (i, id) in ids.iter().enumerate() {
            if payload.is_empty() {
                payload = format!("{} {before}", self.host);
            }
            payload.push(' ');
            payload.push_str(id);
            let next = ids.get(i + 1).map_or(0, |next| next.len() + 1);
            if next == 0 || payload.len() + next > GONE_PAYLOAD {
                // Every chunk is tried: one that fails leaves the others.
                let sent = sqlx::query("SELECT pg_notify($1, $2)")
                    .bind(GONE_CHANNEL)
                    .bind(std::mem::take(&mut payload))
                    .execute(&self.pool)
                    .await;
                if let Err(err) = sent {
                    failed = Some(err);
                }
            }
        }
        failed.map_or(Ok(()), |err| Err(err.into()))
    }

    /// A `tether_gone` payload heard: another host's ids are kept for
    /// [`Cluster::take_gone`] (this host's own were handled when it
    /// deleted them).
    fn heard_gone(&self, payload: &str) {
        let mut words = payload.split(' ');
        if words.next().is_none_or(|host| host == self.host) {
            return;
        }
        let Some(before) = words.next().and_then(|seq| seq.parse().ok()) else {
            tracing::warn!(
                payload,
                "a tether_gone notification without its seq; ignored"
            );
            return;
        };
        let ids: Vec<String> = words
            .filter(|id| !id.is_empty())
            .map(str::to_owned)
            .collect();
        if let Ok(mut gone) = self.gone.lock() {
            gone.push((before, ids));
        }
        self.wake.gone.notify_one();
    }

    /// The sessions other hosts deleted since the last call, each batch
    /// with its seq (see [`GONE_CHANNEL`]).
    pub fn take_gone(&self) -> Vec<(u64, Vec<String>)> {
        self.gone
            .lock()
            .map(|mut gone| std::mem::take(&mut *gone))
            .unwrap_or_default()
    }

    fn heard_of(&self, seq: u64) {
        self.announced
            .fetch_max(seq, std::sync::atomic::Ordering::AcqRel);
    }

    /// Tells other hosts that `seq` is committed. Returns at once; the
    /// notification goes out after the commit, and several commits in a row
    /// share one.
    pub fn committed(&self, seq: u64) {
        self.committed.send_if_modified(|last| {
            let newer = seq > *last;
            if newer {
                *last = seq;
            }
            newer
        });
    }

    /// Takes the session's lease if it is free, expired or already ours.
    pub async fn acquire(&self, session: &str) -> Result<Lease, StoreError> {
        let sent = Instant::now();
        // A lease changes hands only under the host row's lock, which every
        // append holds for its whole transaction: an append's fence check
        // (see `store/postgres.rs`) therefore holds until it commits,
        // without locking lease rows on every append.
        let mut tx = self.pool.begin().await?;
        sqlx::query("SELECT last_seq FROM host WHERE id = 1 FOR UPDATE")
            .execute(&mut *tx)
            .await?;
        // The lease lives as long as this host's row: until the last
        // renewal's moment plus the lease time (see `renewed_until`).
        let statement = format!(
            "WITH old AS (SELECT holder FROM leases WHERE session_id = $1) \
             INSERT INTO leases (session_id, holder, expires_at) \
             VALUES ($1, $2, 'infinity') \
             ON CONFLICT (session_id) DO UPDATE \
                 SET holder = excluded.holder, expires_at = excluded.expires_at \
                 WHERE leases.holder = excluded.holder OR NOT {LIVE} \
             RETURNING (SELECT holder FROM old)"
        );
        let taken: Option<(Option<String>,)> = sqlx::query_as(AssertSqlSafe(statement))
            .bind(session)
            .bind(&self.host)
            .fetch_optional(&mut *tx)
            .await?;
        tx.commit().await?;
        match taken {
            Some((previous,)) => {
                let until = self
                    .renewed_until
                    .lock()
                    .ok()
                    .and_then(|u| *u)
                    .map_or(sent, |renewed| renewed.min(sent + self.ttl));
                if let Ok(mut held) = self.held.lock() {
                    held.insert(session.to_owned(), until);
                }
                Ok(Lease::Mine {
                    from: previous.filter(|p| p != &self.host),
                })
            }
            None => {
                let holder: Option<String> =
                    sqlx::query_scalar("SELECT holder FROM leases WHERE session_id = $1")
                        .bind(session)
                        .fetch_optional(&self.pool)
                        .await?;
                match holder {
                    Some(holder) if holder != self.host => Ok(Lease::HeldBy(holder)),
                    // Released or expired in between: try again once more.
                    _ => Box::pin(self.acquire(session)).await,
                }
            }
        }
    }

    /// Whether this host holds the session's lease for at least `margin`
    /// more (by its own clock, which errs early).
    pub fn holds(&self, session: &str, margin: Duration) -> bool {
        let until = self.held.lock().ok().and_then(|h| h.get(session).copied());
        until.is_some_and(|until| Instant::now() + margin < until)
    }

    /// Who holds the session's lease now, if anyone does (an expired or
    /// released lease counts as nobody's).
    pub async fn holder(&self, session: &str) -> Result<Option<String>, StoreError> {
        Ok(sqlx::query_scalar(AssertSqlSafe(format!(
            "SELECT holder FROM leases WHERE session_id = $1 AND {LIVE}"
        )))
        .bind(session)
        .fetch_optional(&self.pool)
        .await?)
    }

    /// Lets the session's lease go at once (its actor stopped), keeping this
    /// host as the last holder so a late write of ours is still fenced;
    /// with `forget` (a disposed session) the row goes: the actor has
    /// stopped, so no write of this host is in flight for it.
    pub async fn release(&self, session: &str, forget: bool) {
        if let Ok(mut held) = self.held.lock() {
            held.remove(session);
        }
        let statement = if forget {
            "DELETE FROM leases WHERE session_id = $1 AND holder = $2"
        } else {
            "UPDATE leases SET expires_at = '-infinity' WHERE session_id = $1 AND holder = $2"
        };
        let released = sqlx::query(statement)
            .bind(session)
            .bind(&self.host)
            .execute(&self.pool)
            .await;
        if let Err(err) = released {
            tracing::warn!(session, error = %err, "lease not released; it expires by itself");
        }
    }

    /// Leaves the cluster (shutdown): stops its tasks and lets every lease
    /// go, so other hosts take the sessions over at once instead of after
    /// the lease time.
    pub async fn leave(&self) {
        self.stop.cancel();
        self.release_all().await;
    }

    async fn release_all(&self) {
        if let Ok(mut held) = self.held.lock() {
            held.clear();
        }
        let released = sqlx::query("UPDATE leases SET expires_at = '-infinity' WHERE holder = $1")
            .bind(&self.host)
            .execute(&self.pool)
            .await;
        if let Err(err) = released {
            tracing::warn!(error = %err, "leases not released; they expire by themselves");
        }
        let gone = sqlx::query("DELETE FROM cluster_hosts WHERE id = $1")
            .bind(&self.host)
            .execute(&self.pool)
            .await;
        if let Err(err) = gone {
            tracing::warn!(error = %err, "host row not removed; it expires by itself");
        }
    }

    /// Renews every lease this host holds, by renewing its own row; forgets
    /// the leases it no longer holds.
    async fn renew(&self) -> Result<(), StoreError> {
        let sent = Instant::now();
        let was_alive: bool = sqlx::query_scalar(
            "WITH old AS (SELECT expires_at >= now() AS alive FROM cluster_hosts WHERE id = $1) \
             INSERT INTO cluster_hosts (id, expires_at) \
             VALUES ($1, now() + make_interval(secs => $2)) \
             ON CONFLICT (id) DO UPDATE SET expires_at = excluded.expires_at \
             RETURNING COALESCE((SELECT alive FROM old), FALSE)",
        )
        .bind(&self.host)
        .bind(self.ttl.as_secs_f64())
        .fetch_one(&self.pool)
        .await?;
        if let Ok(mut renewed) = self.renewed_until.lock() {
            *renewed = Some(sent + self.ttl);
        }
        if was_alive {
            // Nobody could take a lease of a live host: all still ours.
            if let Ok(mut held) = self.held.lock() {
                for until in held.values_mut() {
                    *until = (*until).max(sent + self.ttl);
                }
            }
            return Ok(());
        }
        // This host's row had run out (a pause longer than the lease, or
        // its first renewal): other hosts may have taken some of its leases.
        let still: Vec<String> = sqlx::query_scalar(
            "SELECT session_id FROM leases WHERE holder = $1 AND expires_at > '-infinity'",
        )
        .bind(&self.host)
        .fetch_all(&self.pool)
        .await?;
        let still: HashSet<String> = still.into_iter().collect();
        if let Ok(mut held) = self.held.lock() {
            held.retain(|session, until| {
                if still.contains(session) {
                    *until = sent + self.ttl;
                    true
                } else if *until >= sent + self.ttl {
                    // Acquired after this renewal was sent.
                    true
                } else {
                    // Taken while this host could not renew (a pause
                    // longer than the lease): its actor re-acquires or
                    // steps down at its next write.
                    tracing::warn!(session, "lease lost to another host");
                    false
                }
            });
        }
        Ok(())
    }

    /// Serialises root-channel writes across hosts until the guard is
    /// released. Held by a transaction of its own (a transaction-level
    /// advisory lock) that a task keeps busy with a `SELECT 1` twice a
    /// second while the batch runs: the database's stalled-transaction
    /// limit (`StoreOptions::stalled_transaction`) then ends it only when
    /// this host cannot reach the database (it died, or is cut off), and
    /// the lock goes with it, so no other host waits on it for longer
    /// than that.
    pub async fn lock_root(&self) -> Result<RootLock, StoreError> {
        let (acquired_tx, acquired) = tokio::sync::oneshot::channel();
        let (release, mut released) = tokio::sync::oneshot::channel::<()>();
        let pool = self.pool.clone();
        let task = tokio::spawn(async move {
            let locked = async {
                let mut tx = pool.begin().await?;
                sqlx::query("SELECT pg_advisory_xact_lock($1)")
                    .bind(ROOT_LOCK)
                    .execute(&mut *tx)
                    .await?;
                Ok::<_, sqlx::Error>(tx)
            }
            .await;
            let mut tx = match locked {
                Ok(tx) => tx,
                Err(err) => {
                    let _ = acquired_tx.send(Err(StoreError::from(err)));
                    return;
                }
            };
            // The caller gave up waiting (it was cancelled): let go at once.
            if acquired_tx.send(Ok(())).is_err() {
                let _ = tx.rollback().await;
                return;
            }
            loop {
                tokio::select! {
                    _ = &mut released => break,
                    () = tokio::time::sleep(ROOT_LOCK_KEEPALIVE) => {
                        if let Err(err) = sqlx::query("SELECT 1").execute(&mut *tx).await {
                            tracing::warn!(
                                error = %err,
                                "the root lock was lost while held; another host may write \
                                 the root channel in between"
                            );
                            return;
                        }
                    }
                }
            }
            if let Err(err) = tx.commit().await {
                tracing::warn!(error = %err, "the root lock was lost while held");
            }
        });
        match acquired.await {
            Ok(Ok(())) => Ok(RootLock {
                release: Some(release),
                task: Some(task),
            }),
            Ok(Err(err)) => Err(err),
            Err(_) => Err(StoreError::Corrupt("the root lock's task ended".into())),
        }
    }
}

/// How often a held root lock's transaction shows the database it is alive.
const ROOT_LOCK_KEEPALIVE: Duration = Duration::from_millis(500);

/// A held root lock; [`RootLock::release`] lets it go (dropping it does
/// too, without waiting).
#[derive(Debug)]
pub struct RootLock {
    release: Option<tokio::sync::oneshot::Sender<()>>,
    task: Option<tokio::task::JoinHandle<()>>,
}

impl RootLock {
    /// Releases the lock and waits until the database has let it go.
    pub async fn release(mut self) {
        if let Some(release) = self.release.take() {
            let _ = release.send(());
        }
        if let Some(task) = self.task.take() {
            let _ = task.await;
        }
    }
}

impl Drop for RootLock {
    fn drop(&mut self) {
        if let Some(release) = self.release.take() {
            let _ = release.send(());
        }
    }
}

async fn renew_loop(cluster: std::sync::Weak<Cluster>, ttl: Duration) {
    let every = ttl / 3;
    loop {
        let Some(cluster) = cluster.upgrade() else {
            return;
        };
        if let Err(err) = cluster.renew().await {
            tracing::warn!(error = %err, "lease renewal failed; retrying");
        }
        drop(cluster);
        tokio::time::sleep(every).await;
    }
}

async fn notify_loop(pool: PgPool, mut committed: watch::Receiver<u64>) {
    while committed.changed().await.is_ok() {
        let seq = *committed.borrow_and_update();
        let sent = sqlx::query("SELECT pg_notify($1, $2)")
            .bind(LOG_CHANNEL)
            .bind(seq.to_string())
            .execute(&pool)
            .await;
        if let Err(err) = sent {
            // Other hosts poll as well: this costs them latency only.
            tracing::debug!(error = %err, "commit notification not sent");
        }
    }
}
