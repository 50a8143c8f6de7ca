//! A dispatcher: one connection subscribed to one session, keeping up to
//! `in_flight` dispatches unacknowledged. A dispatch counts as durable when
//! its echo arrives: the envelope the server broadcasts after the commit,
//! carrying this client's `clientId` and `clientSeq` (or, refused, the
//! echo with a `rejectionReason`). Used by `ingest` and to seed sessions.
//! The raw dispatcher speaks either server's [`Dialect`]; the bookkeeping
//! (window, order, latency) is one for both.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use ahp::{SessionSubscription, SubscriptionEvent};

use crate::dialect::Dialect;
use crate::error::{Error, Result};
use crate::measure::Latency;
use crate::wire::{RawConn, quoted, title_action};

/// Longest wait for the next acknowledgement before the run is abandoned.
pub const ACK_WAIT: Duration = Duration::from_secs(30);

/// What one dispatcher is to do.
#[derive(Debug, Clone)]
pub struct Plan {
    /// Dispatches kept unacknowledged at once.
    pub in_flight: usize,
    /// Stop after this many dispatches.
    pub max_actions: u64,
    /// Stop sending at this instant; outstanding ones are still awaited.
    pub stop_at: Instant,
    /// Acknowledgements arriving in `[from, until)` are measured.
    pub window: (Instant, Instant),
    /// Counts every acknowledgement, for the progress line.
    pub progress: Arc<AtomicU64>,
}

/// What one dispatcher saw.
#[derive(Debug, Default)]
pub struct Stats {
    /// Acknowledgements (accepted or refused) in the measured window.
    pub acked_in_window: u64,
    /// Acknowledgements overall.
    pub acked: u64,
    /// Refused dispatches.
    pub rejected: u64,
    /// The first refusal's reason.
    pub first_rejection: Option<String>,
    /// Echoes that did not come in the order their dispatches were sent.
    pub out_of_order: u64,
    /// Dispatch → echo latency of the measured acknowledgements.
    pub latency: Latency,
    /// The lowest and highest log position (`serverSeq`, the peer's `seq`)
    /// among the accepted acknowledgements that carried one.
    pub seqs: Option<(u64, u64)>,
}

impl Stats {
    /// Adds another dispatcher's figures.
    pub fn merge(&mut self, other: &Stats) {
        self.acked_in_window += other.acked_in_window;
        self.acked += other.acked;
        self.rejected += other.rejected;
        if self.first_rejection.is_none() {
            self.first_rejection.clone_from(&other.first_rejection);
        }
        self.out_of_order += other.out_of_order;
        self.latency.merge(&other.latency);
        if let Some(seqs) = other.seqs {
            self.saw_seqs(seqs);
        }
    }

    fn saw_seqs(&mut self, (low, high): (u64, u64)) {
        self.seqs = Some(match self.seqs {
            Some((l, h)) => (l.min(low), h.max(high)),
            None => (low, high),
        });
    }
}

/// The bookkeeping both client kinds share.
struct Outstanding {
    plan: Plan,
    sent: VecDeque<(u64, Instant)>,
    stats: Stats,
}

impl Outstanding {
    fn new(plan: Plan) -> Self {
        Self {
            sent: VecDeque::with_capacity(plan.in_flight),
            plan,
            stats: Stats::default(),
        }
    }

    fn sending(&self, next_seq: u64) -> bool {
        next_seq <= self.plan.max_actions && Instant::now() < self.plan.stop_at
    }

    fn room(&self) -> bool {
        self.sent.len() < self.plan.in_flight
    }

    fn acknowledged(&mut self, client_seq: u64, rejection: Option<&str>, log_seq: Option<u64>) {
        let now = Instant::now();
        let sent = match self.sent.front() {
            Some(&(seq, sent)) if seq == client_seq => {
                self.sent.pop_front();
                sent
            }
            _ => {
                self.stats.out_of_order += 1;
                match self.sent.iter().position(|(seq, _)| *seq == client_seq) {
                    Some(at) => self.sent.remove(at).map_or(now, |(_, sent)| sent),
                    // An echo of nothing outstanding (a duplicate): ignore.
                    None => return,
                }
            }
        };
        self.stats.acked += 1;
        self.plan.progress.fetch_add(1, Ordering::Relaxed);
        match (rejection, log_seq) {
            (Some(reason), _) => {
                self.stats.rejected += 1;
                if self.stats.first_rejection.is_none() {
                    self.stats.first_rejection = Some(reason.to_owned());
                }
            }
            (None, Some(at)) => self.stats.saw_seqs((at, at)),
            (None, None) => {}
        }
        let (from, until) = self.plan.window;
        if now >= from && now < until {
            self.stats.acked_in_window += 1;
            self.stats.latency.record(now - sent);
        }
    }
}

/// Runs a dispatcher on a raw connection to a `dialect` server, already
/// subscribed to `channel` as `client_id`.
pub async fn run_raw(
    mut conn: RawConn,
    dialect: Dialect,
    client_id: String,
    channel: String,
    plan: Plan,
) -> Result<Stats> {
    let channel_json = quoted(&channel);
    let client_id_json = quoted(&client_id);
    let mut book = Outstanding::new(plan);
    let mut next_seq = 1u64;
    loop {
        if book.sending(next_seq) && book.room() {
            while book.room() && next_seq <= book.plan.max_actions {
                let frame = dialect.dispatch_frame(
                    &channel_json,
                    &client_id_json,
                    next_seq,
                    &title_action(&format!("load {next_seq}")),
                );
                book.sent.push_back((next_seq, Instant::now()));
                conn.feed(frame).await?;
                next_seq += 1;
            }
            conn.flush().await?;
        }
        if book.sent.is_empty() {
            break;
        }
        let text = tokio::time::timeout(ACK_WAIT, conn.next_text())
            .await
            .map_err(|_| no_ack(&client_id))?
            .map_err(|e| Error::msg(format!("dispatcher {client_id}: {e}")))?;
        if let Some(echo) = dialect.echo(&text)
            && echo.acknowledges(&client_id)
        {
            book.acknowledged(echo.client_seq, echo.rejection.as_deref(), echo.seq);
        }
    }
    conn.close().await;
    Ok(book.stats)
}

/// Runs a dispatcher on the upstream AHP client, initialized as
/// `client_id` and subscribed to `channel` through `subscription`.
pub async fn run_ahp(
    client: ahp::Client,
    mut subscription: SessionSubscription,
    client_id: String,
    channel: String,
    plan: Plan,
) -> Result<Stats> {
    let mut book = Outstanding::new(plan);
    let mut next_seq = 1u64;
    loop {
        while book.sending(next_seq) && book.room() {
            let action = serde_json::from_str(&title_action(&format!("load {next_seq}")))?;
            let sent = Instant::now();
            let handle = client.dispatch(channel.clone(), action).await?;
            book.sent
                .push_back((u64::try_from(handle.client_seq).unwrap_or(0), sent));
            next_seq += 1;
        }
        if book.sent.is_empty() {
            break;
        }
        let event = tokio::time::timeout(ACK_WAIT, subscription.recv())
            .await
            .map_err(|_| no_ack(&client_id))?
            .ok_or_else(|| Error::msg(format!("dispatcher {client_id}: connection closed")))?;
        if let SubscriptionEvent::Action(envelope) = event
            && let Some(origin) = &envelope.origin
            && origin.client_id == client_id
        {
            book.acknowledged(
                u64::try_from(origin.client_seq).unwrap_or(0),
                envelope.rejection_reason.as_deref(),
                Some(envelope.server_seq),
            );
        }
    }
    client.shutdown().await;
    Ok(book.stats)
}

fn no_ack(client_id: &str) -> Error {
    Error::msg(format!(
        "dispatcher {client_id}: no acknowledgement in {ACK_WAIT:?}; the server stalled or \
         dropped the connection"
    ))
}
