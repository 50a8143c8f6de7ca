//! A dispatch whose origin is already taken before its batch commits.
//!
//! The log's unique origin index decides most retries at the commit (a
//! duplicate is answered with the original's outcome and changes nothing).
//! Two cases cannot wait for it:
//! * the original is in the same batch, not yet committed: the retry would
//!   be validated against the state the original just changed (refused,
//!   say, for a turn id now in use), and its refusal recorded first would
//!   become the original's outcome too. It is answered with the original's
//!   outcome instead, once that is known;
//! * the dispatch runs a side effect before its commit (input typed into a
//!   terminal, the agent moved to a configuration, an effects backend's
//!   change): a committed original is looked up first, so the effect is
//!   never run twice.

use serde_json::Value;

use super::super::attachments::as_stored;
use super::super::validate::reused_seq;
use super::super::{Ctx, RefusalKind};
use super::{Dispatch, DispatchOutcome};
use crate::store::Origin;

/// Whether validating an action of `kind` acts beyond the session before
/// it is committed.
pub(super) fn acts_before_commit(ctx: &Ctx, kind: &str, agent_running: bool) -> bool {
    kind == "terminal/input"
        || (kind == "session/configChanged" && agent_running)
        || ctx.effects.concerns(kind)
}

/// The highest `clientSeq` each client dispatched to this session's actor
/// among actions that act before their commit, by `clientId` (with the
/// origin's scope): one above it is new, not a retry, and needs no look-up
/// in the store (a client types into a terminal key by key). Bounded: past
/// [`MAX_CLIENTS`] it starts over, which only costs look-ups.
#[derive(Debug, Default)]
pub(super) struct SeenOrigins(std::collections::HashMap<String, (String, u64)>);

/// Most clients [`SeenOrigins`] remembers.
const MAX_CLIENTS: usize = 1024;

impl SeenOrigins {
    /// Whether `origin` may be one already used (so its outcome must be
    /// looked up before anything acts on it).
    pub(super) fn may_be_taken(&self, origin: &Origin) -> bool {
        self.0
            .get(&origin.client_id)
            .is_none_or(|(scope, seq)| *scope != origin.scope || origin.client_seq <= *seq)
    }

    /// Notes that `origin` reached the session.
    pub(super) fn saw(&mut self, origin: &Origin) {
        if let Some((scope, seq)) = self.0.get_mut(&origin.client_id) {
            if *scope == origin.scope {
                *seq = (*seq).max(origin.client_seq);
            } else {
                scope.clone_from(&origin.scope);
                *seq = origin.client_seq;
            }
            return;
        }
        if self.0.len() >= MAX_CLIENTS {
            self.0.clear();
        }
        self.0.insert(
            origin.client_id.clone(),
            (origin.scope.clone(), origin.client_seq),
        );
    }
}

/// The place in the batch's accepted dispatches of one with `origin`.
pub(super) fn twin_of(pending: &[(Dispatch, String)], origin: &Origin) -> Option<usize> {
    pending
        .iter()
        .position(|(d, _)| d.origin.as_ref() == Some(origin))
}

/// The answer to `twin`, a dispatch with the origin of `original` (of the
/// same batch), whose outcome was `outcome`: that outcome for a true retry
/// (the same channel and action, as stored), else the reused sequence
/// number refused.
pub(super) fn twin_answer(
    original: &Dispatch,
    outcome: &DispatchOutcome,
    twin: &Dispatch,
) -> DispatchOutcome {
    let transient =
        matches!(outcome, DispatchOutcome::Rejected(r) if r.kind == RefusalKind::Unavailable);
    if transient || same_dispatch(original, &twin.channel, &twin.action) {
        return outcome.clone();
    }
    DispatchOutcome::Rejected(reused_seq(twin.origin.as_ref()))
}

/// Whether `channel` and `action` are what `original` carried (its action
/// as validation left it: embedded attachments become references).
fn same_dispatch(original: &Dispatch, channel: &str, action: &Value) -> bool {
    original.channel == channel
        && (&original.action == action || original.action == as_stored(action))
}
