//! A chat's loaded window of turns on the host side: loading archived
//! turns back (`fetchTurns`, and eagerly before an action on an archived
//! turn), and keeping turn ids unique so the archive's numbering holds
//! (see `tether_protocol::window`).

use serde_json::Value;
use tether_protocol::actions::action_type;
use tether_protocol::model::SessionModel;
use tether_protocol::window::TurnWindow;

use super::actor::Dispatch;
use super::{Ctx, Refusal, RefusalKind};

/// The type of the action that loads older turns into a chat's window.
pub(super) const TURNS_LOADED: &str = "chat/turnsLoaded";

/// Archived turns written per statement when a reload re-archives them.
pub(super) const ARCHIVE_CHUNK: usize = 500;

/// The most bytes of turns one `chat/turnsLoaded` carries: clients cap the
/// messages they read (the upstream Rust client at 16 MiB), and a page of
/// turns must fit one with room to spare.
pub(super) const MAX_LOAD_BYTES: usize = 4 * 1024 * 1024;

/// The `chat/turnsLoaded` that brings `ordinals` of `chat` back from the
/// archive into its window. With `partial`, a range over the byte budget is
/// cut from its old end (the cursor then points at what is left); without,
/// it is refused.
pub(super) async fn turns_loaded(
    ctx: &Ctx,
    chat: &str,
    window: TurnWindow,
    ordinals: std::ops::Range<u64>,
    partial: bool,
) -> Result<Value, Refusal> {
    let unavailable = |reason: String| Refusal::new(RefusalKind::Unavailable, reason);
    let turns = ctx
        .store
        .archived_turns(chat, window.generation, ordinals.clone())
        .await
        .map_err(|e| unavailable(format!("The turn archive is unavailable ({e}); retry.")))?;
    let contiguous = turns
        .iter()
        .zip(ordinals.clone())
        .all(|(turn, ordinal)| turn.ordinal == ordinal);
    if turns.len() as u64 != ordinals.end - ordinals.start || !contiguous {
        return Err(unavailable(format!(
            "The turn archive of {chat} lacks turns {}..{}; it is rebuilt from the transcript \
             when the session next loads.",
            ordinals.start, ordinals.end
        )));
    }
    let mut bytes = 0;
    let mut start = ordinals.end;
    for turn in turns.iter().rev() {
        if bytes + turn.body.len() > MAX_LOAD_BYTES && start < ordinals.end {
            if !partial {
                return Err(Refusal::new(
                    RefusalKind::Invalid,
                    format!(
                        "The turn this action refers to is {} turns back, more than one load \
                         of {MAX_LOAD_BYTES} bytes holds; load older turns with fetchTurns first.",
                        ordinals.end - ordinals.start
                    ),
                ));
            }
            break;
        }
        bytes += turn.body.len();
        start = turn.ordinal;
    }
    let mut bodies = Vec::with_capacity(turns.len());
    for turn in turns.iter().filter(|t| t.ordinal >= start) {
        bodies.push(serde_json::from_str::<Value>(&turn.body).map_err(|e| {
            unavailable(format!(
                "Archived turn {} of {chat} is unreadable: {e}.",
                turn.ordinal
            ))
        })?);
    }
    let mut action = serde_json::json!({"type": TURNS_LOADED, "turns": bodies});
    if let Some(cursor) = window.cursor(start) {
        action["turnsNextCursor"] = Value::String(cursor);
    }
    Ok(action)
}

/// A new turn's id must be new to its chat, the archived turns included:
/// turns are numbered by position and `chat/turnsLoaded` drops the ids a
/// window already has, so a reused id would shift every older turn.
pub(super) async fn check_new_turn_id(
    ctx: &Ctx,
    model: &SessionModel,
    chat: &str,
    action: &Value,
) -> Result<(), Refusal> {
    let Some(turn_id) = action.get("turnId").and_then(Value::as_str) else {
        return Ok(());
    };
    let Some(state) = model.chats.get(chat) else {
        return Ok(());
    };
    let reused = || {
        Refusal::new(
            RefusalKind::Invalid,
            format!("Turn id {turn_id:?} is already used in {chat}; start the turn with a new id."),
        )
    };
    if state.turns.iter().any(|t| t.id == turn_id)
        || state.active_turn.as_ref().is_some_and(|t| t.id == turn_id)
    {
        return Err(reused());
    }
    let window = model.window(chat);
    if window.archived == 0 {
        return Ok(());
    }
    match ctx
        .store
        .archived_ordinal(chat, window.generation, turn_id)
        .await
    {
        Ok(Some(ordinal)) if ordinal < window.archived => Err(reused()),
        Ok(_) => Ok(()),
        Err(err) => Err(Refusal::new(
            RefusalKind::Unavailable,
            format!("The turn archive is unavailable ({err}); retry."),
        )),
    }
}

/// AHP 1.0: before applying an action that refers to a turn outside the
/// loaded window, the host loads that turn (and those after it, so the
/// window stays unbroken). Today `chat/truncated {turnId}` is the one such
/// action a client may dispatch.
pub(super) async fn eager_load(
    ctx: &Ctx,
    model: &SessionModel,
    d: &Dispatch,
) -> Result<Option<Value>, Refusal> {
    if d.origin.is_none() || action_type(&d.action) != Some("chat/truncated") {
        return Ok(None);
    }
    // Nothing is loaded for a caller the dispatch itself would refuse: one
    // that may not see or drive the session, or a session that has ended
    // (`check_dispatch` then answers, as for any dispatch).
    let ended = matches!(model.projection.settled.as_ref(),
        Some(s) if s.state == tether_protocol::projection::SessionLifeState::Ended);
    let allowed = d
        .principal
        .as_ref()
        .is_some_and(|p| p.can_write() && p.can_see(&model.created.project));
    if ended || !allowed {
        return Ok(None);
    }
    let Some(turn_id) = d.action.get("turnId").and_then(Value::as_str) else {
        return Ok(None);
    };
    let Some(chat) = model.chats.get(&d.channel) else {
        return Ok(None);
    };
    let window = model.window(&d.channel);
    if window.archived == 0 || chat.turns.iter().any(|t| t.id == turn_id) {
        return Ok(None);
    }
    let ordinal = ctx
        .store
        .archived_ordinal(&d.channel, window.generation, turn_id)
        .await
        .map_err(|e| {
            Refusal::new(
                RefusalKind::Unavailable,
                format!("The turn archive is unavailable ({e}); retry."),
            )
        })?;
    match ordinal {
        Some(ordinal) if ordinal < window.archived => {
            turns_loaded(ctx, &d.channel, window, ordinal..window.archived, false)
                .await
                .map(Some)
        }
        _ => Ok(None),
    }
}
