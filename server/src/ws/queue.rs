//! The outbound queue of one connection, written to its socket by the
//! connection's own task. It is bounded in bytes: a client that cannot keep
//! up is closed with code 4000 and a reason telling it to reconnect and
//! replay, never silently dropped.
//!
//! There is no writer task: the connection's loop hands the socket what it
//! takes whenever it wakes (and when the socket becomes writable), so an
//! idle connection holds one task, not two, and a frame reaches the socket
//! without a hop between tasks.

use std::collections::VecDeque;
use std::task::{Context, Poll, ready};
use std::time::{Duration, Instant};

use axum::extract::ws::{CloseFrame, Message, Utf8Bytes, WebSocket};
use futures_util::SinkExt;

/// What the connection writes, in order.
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

/// The socket failed or was closed under the queue.
#[derive(Debug)]
pub(super) struct Gone;

/// A connection's outbound frames not yet handed to its socket.
pub(super) struct Queue {
    items: VecDeque<Outbound>,
    /// Bytes of the frames in `items`.
    bytes: usize,
    /// When `bytes` went over `limit`; `None` while it is under.
    over_since: Option<Instant>,
    limit: usize,
    /// Frames handed to the socket and not flushed yet.
    unflushed: bool,
    /// Bytes of frames handed to the socket, for the close log.
    pub(super) written: u64,
}

impl Queue {
    pub(super) fn new(limit: usize) -> Self {
        Self {
            items: VecDeque::new(),
            bytes: 0,
            over_since: None,
            limit,
            unflushed: false,
            written: 0,
        }
    }

    /// Queues a frame of the live stream; `false` when the client is not
    /// draining: the queue has been over its byte limit for longer than
    /// [`DRAIN_GRACE`], or is over [`HARD_LIMIT_FACTOR`] times it.
    pub(super) fn push(&mut self, frame: Utf8Bytes) -> bool {
        self.reply(frame);
        if self.bytes <= self.limit {
            return true;
        }
        if self.bytes > self.limit.saturating_mul(HARD_LIMIT_FACTOR) {
            return false;
        }
        let since = *self.over_since.get_or_insert_with(Instant::now);
        since.elapsed() <= DRAIN_GRACE
    }

    /// Queues an answer to the client's own request. Answers are bounded by
    /// their own limits (replay size), not by the live-stream allowance, or a
    /// large replay could never be delivered.
    pub(super) fn reply(&mut self, frame: Utf8Bytes) {
        self.bytes += frame.len();
        self.items.push_back(Outbound::Frame(frame));
    }

    /// Queues a ping or a close behind what is queued.
    pub(super) fn control(&mut self, message: Outbound) {
        self.items.push_back(message);
    }

    /// Drops the frames not written yet: a slow consumer replays them.
    pub(super) fn discard_frames(&mut self) {
        self.items
            .retain(|item| !matches!(item, Outbound::Frame(_)));
        self.bytes = 0;
        self.over_since = None;
    }

    /// Whether more than the byte limit waits to be written.
    pub(super) fn over_limit(&self) -> bool {
        self.bytes > self.limit
    }

    /// Hands the socket everything queued and flushes it: ready once all is
    /// written (or a close frame was, after which nothing more is), pending
    /// while the socket takes no more (the task is woken when it does).
    pub(super) fn poll_write(
        &mut self,
        cx: &mut Context<'_>,
        socket: &mut WebSocket,
    ) -> Poll<Result<(), Gone>> {
        while !self.items.is_empty() {
            ready!(socket.poll_ready_unpin(cx)).map_err(|_| Gone)?;
            let message = match self.items.pop_front() {
                Some(Outbound::Frame(frame)) => {
                    self.bytes -= frame.len();
                    if self.bytes <= self.limit {
                        self.over_since = None;
                    }
                    self.written += frame.len() as u64;
                    Message::Text(frame)
                }
                Some(Outbound::Ping) => Message::Ping(Default::default()),
                Some(Outbound::Close(code, reason)) => {
                    // Nothing is written after a close frame.
                    self.items.clear();
                    Message::Close(Some(CloseFrame {
                        code,
                        reason: reason.into(),
                    }))
                }
                None => break,
            };
            socket.start_send_unpin(message).map_err(|_| Gone)?;
            self.unflushed = true;
        }
        if self.unflushed {
            ready!(socket.poll_flush_unpin(cx)).map_err(|_| Gone)?;
            self.unflushed = false;
        }
        Poll::Ready(Ok(()))
    }

    /// Writes what the socket takes until the queue is back under its byte
    /// limit; `false` when it is still over it after [`DRAIN_GRACE`] (the
    /// client is not reading) or the socket is gone.
    pub(super) async fn drain_to_limit(&mut self, socket: &mut WebSocket) -> bool {
        let drained = std::future::poll_fn(|cx| match self.poll_write(cx, socket) {
            Poll::Ready(written) => Poll::Ready(written.is_ok()),
            Poll::Pending if self.over_limit() => Poll::Pending,
            Poll::Pending => Poll::Ready(true),
        });
        tokio::time::timeout(DRAIN_GRACE, drained)
            .await
            .unwrap_or(false)
    }
}
