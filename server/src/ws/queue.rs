//! The outbound queue of one connection: bounded in bytes, drained by a
//! writer task. A client that cannot keep up is closed with code 4000 and
//! a reason telling it to reconnect and replay, never silently dropped.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use axum::extract::ws::{CloseFrame, Message, Utf8Bytes, WebSocket};
use futures_util::SinkExt;
use tokio::sync::mpsc;

/// What the writer task sends.
pub(super) enum Outbound {
    Frame(Utf8Bytes),
    Ping,
    Close(u16, String),
}

/// How long a connection's queue may stay over its byte limit before the
/// connection counts as unable to drain. A group commit can publish a burst
/// larger than the limit at once; a client that keeps reading drains it well
/// within this time, one that does not read never does.
const DRAIN_GRACE: Duration = Duration::from_secs(2);

/// Past this many times the limit the connection is closed at once.
const HARD_LIMIT_FACTOR: usize = 4;

/// What the connection task and its writer share about the queue.
pub(super) struct Backlog {
    pub(super) bytes: AtomicUsize,
    /// Milliseconds after `epoch` when the queue went over the limit; 0 when
    /// it is under it.
    pub(super) over_since: AtomicU64,
    pub(super) epoch: Instant,
    pub(super) limit: usize,
}

impl Backlog {
    fn now_ms(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_millis())
            .unwrap_or(u64::MAX)
            .max(1)
    }

    fn drained(&self, size: usize) {
        let left = self
            .bytes
            .fetch_sub(size, Ordering::AcqRel)
            .saturating_sub(size);
        if left <= self.limit {
            self.over_since.store(0, Ordering::Release);
        }
    }
}

/// The sending half: a queue bounded in bytes, drained by the writer task.
pub(super) struct Queue {
    pub(super) sender: mpsc::UnboundedSender<Outbound>,
    pub(super) backlog: Arc<Backlog>,
}

impl Queue {
    /// Queues a frame of the live stream; `false` when the client is not
    /// draining: the queue has been over its byte limit for longer than
    /// [`DRAIN_GRACE`], or is over [`HARD_LIMIT_FACTOR`] times it.
    pub(super) fn push(&self, frame: Utf8Bytes) -> bool {
        let backlog = &self.backlog;
        let size = frame.len();
        let queued = backlog.bytes.fetch_add(size, Ordering::AcqRel) + size;
        let _ = self.sender.send(Outbound::Frame(frame));
        if queued <= backlog.limit {
            return true;
        }
        if queued > backlog.limit.saturating_mul(HARD_LIMIT_FACTOR) {
            return false;
        }
        let now = backlog.now_ms();
        match backlog
            .over_since
            .compare_exchange(0, now, Ordering::AcqRel, Ordering::Acquire)
        {
            Ok(_) => true,
            Err(since) => now.saturating_sub(since) <= DRAIN_GRACE.as_millis() as u64,
        }
    }

    /// Queues an answer to the client's own request. Answers are bounded by
    /// their own limits (replay size), not by the live-stream allowance, or a
    /// large replay could never be delivered.
    pub(super) fn reply(&self, frame: Utf8Bytes) {
        self.backlog.bytes.fetch_add(frame.len(), Ordering::AcqRel);
        let _ = self.sender.send(Outbound::Frame(frame));
    }

    pub(super) fn control(&self, message: Outbound) {
        let _ = self.sender.send(message);
    }
}

/// Drains the queue to the socket, flushing once per burst.
pub(super) async fn write_loop(
    mut sink: futures_util::stream::SplitSink<WebSocket, Message>,
    mut receiver: mpsc::UnboundedReceiver<Outbound>,
    backlog: Arc<Backlog>,
) -> u64 {
    let mut written = 0u64;
    while let Some(first) = receiver.recv().await {
        let mut next = Some(first);
        // Feed everything queued, then flush once.
        while let Some(item) = next {
            let sent = match item {
                Outbound::Frame(frame) => {
                    let size = frame.len();
                    written += size as u64;
                    let result = sink.feed(Message::Text(frame)).await;
                    backlog.drained(size);
                    result
                }
                Outbound::Ping => sink.feed(Message::Ping(Default::default())).await,
                Outbound::Close(code, reason) => {
                    let frame = CloseFrame {
                        code,
                        reason: reason.into(),
                    };
                    let _ = sink.send(Message::Close(Some(frame))).await;
                    let _ = sink.close().await;
                    return written;
                }
            };
            if sent.is_err() {
                return written;
            }
            next = receiver.try_recv().ok();
        }
        if sink.flush().await.is_err() {
            return written;
        }
    }
    written
}
