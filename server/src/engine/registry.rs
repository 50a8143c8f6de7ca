//! Reaching a session's actor: the registry of actors in memory (one per
//! session on this host, started on the first command, evicted when idle,
//! never started for a session retention is deleting) and the routing of
//! a command to it.

use std::sync::Arc;

use tokio::sync::oneshot;

use super::actor::SessionActor;
use super::{Command, Ctx, Engine, EngineError, mailbox};
use crate::auth::Principal;

/// Mailbox size of a session actor: a burst larger than this waits.
const MAILBOX: usize = 1024;

impl Ctx {
    /// The mailbox of a session's actor, started if needed. Not async: an
    /// actor re-routes commands through it, and an async fn here would make
    /// the actor's future contain itself.
    pub(super) fn mailbox(self: &Arc<Self>, id: &str) -> Option<mailbox::Sender<Command>> {
        let mut actors = self.actors.lock().ok()?;
        // A running actor's session is never retiring (`begin_retiring`
        // refuses one in memory, under this lock).
        if let Some(sender) = actors.get(id) {
            return Some(sender.clone());
        }
        // A session retention is deleting gets no actor (the lock order is
        // `actors`, then `retiring`).
        if self.retiring.lock().ok()?.contains(id) {
            return None;
        }
        Some(
            actors
                .entry(id.to_owned())
                .or_insert_with(|| {
                    let (sender, mailbox) = mailbox::mailbox(MAILBOX);
                    tokio::spawn(SessionActor::run(id.to_owned(), self.clone(), mailbox));
                    sender
                })
                .clone(),
        )
    }

    /// Marks a session as being deleted, unless its actor is in memory
    /// (then `false`): until [`Ctx::end_retiring`], no actor starts for it.
    pub(super) fn begin_retiring(&self, id: &str) -> bool {
        let Ok(actors) = self.actors.lock() else {
            return false;
        };
        if actors.contains_key(id) {
            return false;
        }
        self.retiring
            .lock()
            .map(|mut r| r.insert(id.to_owned()))
            .unwrap_or(false)
    }

    pub(super) fn end_retiring(&self, id: &str) {
        if let Ok(mut retiring) = self.retiring.lock() {
            retiring.remove(id);
        }
    }

    /// The mailbox of a session's actor if it is in memory.
    fn running(&self, id: &str) -> Option<mailbox::Sender<Command>> {
        self.actors.lock().ok()?.get(id).cloned()
    }

    /// Whether a session's actor is in memory here.
    pub(super) fn in_memory(&self, id: &str) -> bool {
        self.actors.lock().is_ok_and(|a| a.contains_key(id))
    }

    pub(super) fn forget_actor(&self, id: &str) {
        if let Ok(mut actors) = self.actors.lock() {
            actors.remove(id);
        }
    }

    /// Removes an idle actor from the registry if nothing is queued for it.
    /// Under the registry lock no new sender can be handed out, so a
    /// command sent after this returns fails and is re-routed to a new actor.
    pub(super) fn evict_if_idle(&self, id: &str, mailbox: &mailbox::Receiver<Command>) -> bool {
        let Ok(mut actors) = self.actors.lock() else {
            return false;
        };
        if mailbox.is_empty() {
            actors.remove(id);
            true
        } else {
            false
        }
    }
}

impl Engine {
    /// Whether the store has a session. Only then may a command start an
    /// actor (and, with several hosts, take a lease): a lookup of an id
    /// nobody created leaves no trace.
    async fn stored(&self, id: &str) -> Result<bool, EngineError> {
        self.ctx
            .store
            .session(id)
            .await
            .map(|row| row.is_some())
            .map_err(|e| EngineError::Unavailable(e.to_string()))
    }

    /// Whether `principal` may name session `id`: its actor is in memory
    /// here (it then checks the principal itself), or the store has it in
    /// a project the principal sees. Another project's session answers as
    /// a missing one, before anything starts its actor (which would keep it
    /// from retention) or takes its lease.
    pub(super) async fn in_scope(
        &self,
        principal: &Principal,
        id: &str,
    ) -> Result<(), EngineError> {
        if principal.project_scope().is_none() || self.ctx.in_memory(id) {
            return Ok(());
        }
        let row = self
            .ctx
            .store
            .session(id)
            .await
            .map_err(|e| EngineError::Unavailable(e.to_string()))?;
        match row {
            Some(row) if principal.can_see(&row.record.project) => Ok(()),
            _ => Err(EngineError::NotFound(format!(
                "Session {id} does not exist."
            ))),
        }
    }

    /// Sends a command to a session's actor, starting it if needed; a
    /// command for a session that does not exist is answered as such
    /// (only `Create` starts an actor for an unknown id). A session whose
    /// actor is in memory exists: its mailbox is taken under one lock.
    pub(super) async fn send(&self, id: &str, mut command: Command) {
        let mut checked = command.creates();
        for _ in 0..3 {
            let sender = match self.ctx.running(id) {
                Some(sender) => sender,
                None => {
                    if !checked {
                        match self.stored(id).await {
                            Ok(true) => checked = true,
                            Ok(false) => return command.answer_missing(id),
                            Err(err) => return command.fail(err),
                        }
                    }
                    let Some(sender) = self.ctx.mailbox(id) else {
                        return;
                    };
                    sender
                }
            };
            match sender.send(command).await {
                Ok(()) => return,
                // The actor was evicted between lookup and send: start anew.
                Err(mailbox::Closed(returned)) => {
                    self.ctx.forget_actor(id);
                    command = returned;
                }
            }
        }
    }

    pub(super) async fn ask<T>(
        &self,
        id: &str,
        make: impl FnOnce(oneshot::Sender<Result<T, EngineError>>) -> Command,
    ) -> Result<T, EngineError> {
        let (reply, answer) = oneshot::channel();
        self.send(id, make(reply)).await;
        answer
            .await
            .map_err(|_| EngineError::Unavailable("the session stopped unexpectedly".to_owned()))?
    }
}
