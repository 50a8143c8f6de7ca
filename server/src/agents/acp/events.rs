//! What an agent says, as its session's actor reads it.
//!
//! The bridge hands each event over a bounded channel: beyond it the
//! agent's messages wait, ACP's dispatch loop held, so a flood is paced by
//! what the store commits. That same loop carries the agent's answers. So
//! while the actor waits for an answer (a configuration change, a fork, a
//! directory change applied through `session/resume`), it keeps reading
//! the events and sets them aside, in order, for after: else a full channel
//! would hold the answer behind it until the agent's time limit.

use std::collections::VecDeque;
use std::sync::Mutex;

use tokio::sync::mpsc;

use super::AgentEvent;

/// Most events set aside while an answer is awaited (each a few actions of
/// the agent's stream).
const HELD: usize = 4096;

/// An agent's events, read by its session's actor alone.
#[derive(Debug)]
pub struct AgentEvents {
    channel: tokio::sync::Mutex<mpsc::Receiver<AgentEvent>>,
    /// Read while an answer was awaited; delivered before the channel's.
    held: Mutex<VecDeque<AgentEvent>>,
}

impl AgentEvents {
    pub(super) fn new(channel: mpsc::Receiver<AgentEvent>) -> Self {
        Self {
            channel: tokio::sync::Mutex::new(channel),
            held: Mutex::new(VecDeque::new()),
        }
    }

    /// The next event; `None` once the bridge has stopped. Cancel-safe.
    pub async fn recv(&self) -> Option<AgentEvent> {
        if let Some(event) = self.take_held() {
            return Some(event);
        }
        self.channel.lock().await.recv().await
    }

    /// The next event if one is there now.
    pub fn try_recv(&self) -> Option<AgentEvent> {
        self.take_held()
            .or_else(|| self.channel.try_lock().ok()?.try_recv().ok())
    }

    /// Waits for `answer`, setting aside the events that come meanwhile,
    /// at most [`HELD`] of them: past that the agent waits again (as it
    /// would behind a full channel) until the answer or its time limit.
    pub(super) async fn meanwhile<T>(&self, answer: impl Future<Output = T>) -> T {
        let mut channel = self.channel.lock().await;
        let mut answer = std::pin::pin!(answer);
        loop {
            let room = self.held.lock().is_ok_and(|held| held.len() < HELD);
            if !room {
                return answer.await;
            }
            tokio::select! {
                biased;
                out = &mut answer => return out,
                event = channel.recv() => match event {
                    Some(event) => {
                        if let Ok(mut held) = self.held.lock() {
                            held.push_back(event);
                        }
                    }
                    // The bridge has stopped: its answer comes (or fails)
                    // without more events.
                    None => return answer.await,
                },
            }
        }
    }

    fn take_held(&self) -> Option<AgentEvent> {
        self.held.lock().ok()?.pop_front()
    }
}
