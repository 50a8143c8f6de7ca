//! The small queues between tasks of the engine: a session actor's
//! mailbox, and the waiting items under a connection's hub inbox.
//!
//! Hand-built rather than tokio channels: a tokio channel allocates a block
//! of 32 slots and its shared state when it is made, which every session in
//! memory and every connection would pay while idle. These allocate nothing
//! until an item arrives, and give their slots back after a burst.

use std::collections::VecDeque;
use std::future::poll_fn;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, Waker};

use tokio::sync::Semaphore;

/// A queue emptied after a burst keeps at most this many slots.
const KEPT_SLOTS: usize = 8;

/// Items waiting for one task, in order, and that task's waker.
#[derive(Debug)]
pub(super) struct Waiting<T> {
    items: VecDeque<T>,
    waker: Option<Waker>,
}

impl<T> Default for Waiting<T> {
    fn default() -> Self {
        Self {
            items: VecDeque::new(),
            waker: None,
        }
    }
}

impl<T> Waiting<T> {
    pub(super) fn len(&self) -> usize {
        self.items.len()
    }

    pub(super) fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    /// Queues `item`; returns the waker to wake once the lock is released.
    pub(super) fn push(&mut self, item: T) -> Option<Waker> {
        self.items.push_back(item);
        self.waker.take()
    }

    /// The oldest item, if any.
    pub(super) fn pop(&mut self) -> Option<T> {
        let item = self.items.pop_front()?;
        if self.items.is_empty() && self.items.capacity() > 8 * KEPT_SLOTS {
            self.items.shrink_to(KEPT_SLOTS);
        }
        Some(item)
    }

    /// Remembers the task to wake when an item arrives.
    pub(super) fn park(&mut self, cx: &Context<'_>) {
        match &mut self.waker {
            Some(waker) => waker.clone_from(cx.waker()),
            none => *none = Some(cx.waker().clone()),
        }
    }

    /// The parked task's waker, taken.
    pub(super) fn unpark(&mut self) -> Option<Waker> {
        self.waker.take()
    }

    /// Every item, taken.
    fn take_all(&mut self) -> VecDeque<T> {
        std::mem::take(&mut self.items)
    }
}

/// A session actor's mailbox: bounded (a sender waits for room), in order,
/// many senders and one receiver, with the closing rules of a tokio channel:
/// a send fails once the receiver has closed it or is gone, and the receiver
/// hears `None` once it is closed and empty, or every sender is gone.
pub(super) fn mailbox<T>(capacity: usize) -> (Sender<T>, Receiver<T>) {
    let shared = Arc::new(Shared {
        state: Mutex::new(State {
            waiting: Waiting::default(),
            closed: false,
        }),
        room: Semaphore::new(capacity),
        senders: AtomicUsize::new(1),
    });
    (Sender(shared.clone()), Receiver(shared))
}

#[derive(Debug)]
struct Shared<T> {
    state: Mutex<State<T>>,
    /// Free slots; closed with the mailbox.
    room: Semaphore,
    senders: AtomicUsize,
}

#[derive(Debug)]
struct State<T> {
    waiting: Waiting<T>,
    closed: bool,
}

impl<T> Shared<T> {
    fn state(&self) -> MutexGuard<'_, State<T>> {
        // Nothing panics while holding it; recover the data if it ever did.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// The sending side of a mailbox; cheap to clone.
#[derive(Debug)]
pub(super) struct Sender<T>(Arc<Shared<T>>);

/// A send to a closed mailbox: the item, returned.
#[derive(Debug)]
pub(super) struct Closed<T>(pub(super) T);

impl<T> Sender<T> {
    /// Queues `item`, waiting while the mailbox is full.
    pub(super) async fn send(&self, item: T) -> Result<(), Closed<T>> {
        let Ok(slot) = self.0.room.acquire().await else {
            return Err(Closed(item));
        };
        let waker = {
            let mut state = self.0.state();
            if state.closed {
                return Err(Closed(item));
            }
            // The slot is given back when the item is received.
            slot.forget();
            state.waiting.push(item)
        };
        if let Some(waker) = waker {
            waker.wake();
        }
        Ok(())
    }
}

impl<T> Clone for Sender<T> {
    fn clone(&self) -> Self {
        self.0.senders.fetch_add(1, Ordering::Relaxed);
        Self(self.0.clone())
    }
}

impl<T> Drop for Sender<T> {
    fn drop(&mut self) {
        if self.0.senders.fetch_sub(1, Ordering::AcqRel) == 1 {
            // The last sender: a receiver waiting hears the end.
            let waker = self.0.state().waiting.unpark();
            if let Some(waker) = waker {
                waker.wake();
            }
        }
    }
}

/// The receiving side of a mailbox.
#[derive(Debug)]
pub(super) struct Receiver<T>(Arc<Shared<T>>);

impl<T> Receiver<T> {
    /// The next item; `None` once the mailbox is closed and empty, or every
    /// sender is gone.
    pub(super) async fn recv(&mut self) -> Option<T> {
        poll_fn(|cx| self.poll_recv(cx)).await
    }

    fn poll_recv(&mut self, cx: &Context<'_>) -> Poll<Option<T>> {
        let mut state = self.0.state();
        if let Some(item) = state.waiting.pop() {
            self.0.room.add_permits(1);
            return Poll::Ready(Some(item));
        }
        if state.closed || self.0.senders.load(Ordering::Acquire) == 0 {
            return Poll::Ready(None);
        }
        state.waiting.park(cx);
        Poll::Pending
    }

    /// The next item if one is there now.
    pub(super) fn try_recv(&mut self) -> Option<T> {
        let item = self.0.state().waiting.pop()?;
        self.0.room.add_permits(1);
        Some(item)
    }

    /// Refuses further sends; what is queued can still be received.
    pub(super) fn close(&mut self) {
        self.0.state().closed = true;
        self.0.room.close();
    }

    /// Whether nothing is queued.
    pub(super) fn is_empty(&self) -> bool {
        self.0.state().waiting.is_empty()
    }
}

impl<T> Drop for Receiver<T> {
    fn drop(&mut self) {
        self.close();
        // What was queued is dropped here, outside the lock (an item may
        // hold a reply channel whose drop wakes its asker).
        let left = self.0.state().waiting.take_all();
        drop(left);
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    /// Items arrive in order; a full mailbox makes the sender wait until
    /// the receiver takes one.
    #[tokio::test]
    async fn a_mailbox_keeps_order_and_holds_senders_back_when_full() {
        let (sender, mut receiver) = mailbox(2);
        sender.send(1).await.unwrap();
        sender.send(2).await.unwrap();
        let third = {
            let sender = sender.clone();
            tokio::spawn(async move { sender.send(3).await.is_ok() })
        };
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(!third.is_finished(), "a full mailbox takes no more");
        assert_eq!(receiver.recv().await, Some(1));
        assert!(third.await.unwrap());
        assert_eq!(receiver.try_recv(), Some(2));
        assert_eq!(receiver.recv().await, Some(3));
        assert!(receiver.is_empty());
        assert_eq!(receiver.try_recv(), None);
    }

    /// Closing refuses new sends (even one waiting for room) and leaves
    /// what is queued to be received; then the receiver hears the end.
    #[tokio::test]
    async fn a_closed_mailbox_refuses_sends_and_drains() {
        let (sender, mut receiver) = mailbox(1);
        sender.send("kept").await.unwrap();
        let waiting = {
            let sender = sender.clone();
            tokio::spawn(async move { sender.send("refused").await.map_err(|Closed(item)| item) })
        };
        tokio::time::sleep(Duration::from_millis(20)).await;
        receiver.close();
        assert_eq!(waiting.await.unwrap(), Err("refused"));
        assert!(matches!(sender.send("late").await, Err(Closed("late"))));
        assert_eq!(receiver.recv().await, Some("kept"));
        assert_eq!(receiver.recv().await, None);
    }

    /// A receiver waiting hears the end when the last sender goes; a
    /// sender hears it when the receiver goes, and what it queued is
    /// dropped with it.
    #[tokio::test]
    async fn either_side_going_ends_the_other() {
        let (sender, mut receiver) = mailbox::<u32>(4);
        let second = sender.clone();
        let ended = tokio::spawn(async move { receiver.recv().await });
        tokio::time::sleep(Duration::from_millis(20)).await;
        drop(sender);
        assert!(!ended.is_finished(), "one sender is left");
        drop(second);
        assert_eq!(ended.await.unwrap(), None);

        let (sender, receiver) = mailbox(4);
        let (reply, answer) = tokio::sync::oneshot::channel::<()>();
        sender.send(reply).await.unwrap();
        drop(receiver);
        assert!(answer.await.is_err(), "the queued item was dropped");
        assert!(
            sender
                .send(tokio::sync::oneshot::channel().0)
                .await
                .is_err()
        );
    }
}
