//! Whether one of a connection's sources of wakes may have anything.
//!
//! A connection's one task wakes for many reasons: the hub routing an
//! envelope to it, a dispatch's answer, its timers, bytes from its client.
//! On each wake `select!` polls every branch, and most are dear to poll for
//! nothing. The socket's read side is the dearest: the WebSocket, its codec,
//! hyper's upgraded stream and the listener's deadline each take a turn
//! before the TCP stream says it has nothing (~1,300 instructions). The
//! timers (the ping interval, the token's expiry) and the shutdown wait
//! take ~620 more between them. A subscriber under fan-out wakes once an
//! envelope and finds nothing in any of them on almost every wake
//! (BENCHMARKS.md, "The floor").
//!
//! So each such source is polled with a waker of its own, which notes that
//! it fired before it wakes the task. The source is polled again only when
//! that waker fired, or when its last poll was ready (the codec may hold
//! more than the socket signalled; a ticking interval may be behind).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll, Wake, Waker};

use futures_util::task::AtomicWaker;

/// A source's waker and what it noted.
#[derive(Debug)]
pub(super) struct Readiness {
    inner: Arc<Flag>,
    /// A waker of `inner`, made once.
    waker: Waker,
}

#[derive(Debug)]
struct Flag {
    /// Whether the source may have something: its waker fired, or its last
    /// poll was not `Pending`.
    woken: AtomicBool,
    /// The connection's task, woken with the flag.
    task: AtomicWaker,
}

impl Wake for Flag {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.woken.store(true, Ordering::Release);
        self.task.wake();
    }
}

impl Readiness {
    pub(super) fn new() -> Self {
        let inner = Arc::new(Flag {
            // The first poll registers the waker.
            woken: AtomicBool::new(true),
            task: AtomicWaker::new(),
        });
        let waker = Waker::from(Arc::clone(&inner));
        Self { inner, waker }
    }

    /// Polls `read` when its source may have something, with the waker that
    /// notes its readiness; `Pending` without polling it otherwise.
    pub(super) fn poll<T>(
        &self,
        cx: &mut Context<'_>,
        read: impl FnOnce(&mut Context<'_>) -> Poll<T>,
    ) -> Poll<T> {
        if !self.inner.woken.swap(false, Ordering::AcqRel) {
            return Poll::Pending;
        }
        self.inner.task.register(cx.waker());
        let polled = read(&mut Context::from_waker(&self.waker));
        if polled.is_ready() {
            self.inner.woken.store(true, Ordering::Release);
        }
        polled
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicUsize;

    use super::*;

    /// A task waker that counts its wakes.
    struct Count(AtomicUsize);

    impl Wake for Count {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    #[test]
    fn the_read_side_is_polled_again_only_after_its_waker_fires_or_a_message() {
        let count = Arc::new(Count(AtomicUsize::new(0)));
        let task = Waker::from(Arc::clone(&count));
        let mut cx = Context::from_waker(&task);
        let readiness = Readiness::new();
        let mut registered: Option<Waker> = None;
        let mut polls = 0;

        // The first poll reaches the socket, which has nothing.
        let first: Poll<()> = readiness.poll(&mut cx, |cx| {
            polls += 1;
            registered = Some(cx.waker().clone());
            Poll::Pending
        });
        assert!(first.is_pending());
        // Woken for something else: the socket is left alone.
        let again: Poll<()> = readiness.poll(&mut cx, |_| {
            polls += 1;
            Poll::Ready(())
        });
        assert!(again.is_pending());
        assert_eq!(polls, 1);

        // Bytes arrive: the socket's waker wakes the task and the next
        // poll reaches the socket.
        registered.take().unwrap().wake();
        assert_eq!(count.0.load(Ordering::SeqCst), 1);
        let read = readiness.poll(&mut cx, |_| {
            polls += 1;
            Poll::Ready(7)
        });
        assert_eq!(read, Poll::Ready(7));
        // After a message the codec may hold another: polled again.
        let more: Poll<()> = readiness.poll(&mut cx, |_| {
            polls += 1;
            Poll::Pending
        });
        assert!(more.is_pending());
        assert_eq!(polls, 3);
    }
}
