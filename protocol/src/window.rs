//! The loaded window of a chat's turns (AHP 1.0 `turnsNextCursor`).
//!
//! A chat's live state and its snapshots hold only its most recent
//! [`TURN_WINDOW`] turns; older ones live in the transcript's turn archive
//! and are loaded on demand with `fetchTurns` (the host commits
//! `chat/turnsLoaded` before it answers), or eagerly before an action that
//! refers to one of them. Without it a long chat's snapshot, its replay and
//! every chat action (the reducer runs on a copy of the chat) grow with its
//! history.
//!
//! Turns are numbered by their position in the chat: the window holds
//! ordinals `archived..archived + turns.len()`, the archive those below
//! `archived`. Truncating the whole chat starts a new generation, so a
//! cursor issued before it is recognisably stale.

use ahp_types::state::{ChatState, Turn};
use serde::{Deserialize, Serialize};

/// How many completed turns a chat keeps in live state and snapshots.
/// A console shows far fewer at once; older ones are a `fetchTurns` away.
/// Fixed, not configured: every rebuild must trim at the same place.
pub const TURN_WINDOW: usize = 50;

/// How many turns one `fetchTurns` loads.
pub const TURNS_PAGE: u64 = 50;

/// Where a chat's window starts.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TurnWindow {
    /// Bumped when the whole chat is truncated.
    pub generation: u64,
    /// The ordinal of the window's oldest turn: how many older turns the
    /// archive holds for this generation.
    pub archived: u64,
    /// Every ordinal below this was archived once already (loaded turns
    /// trimmed again need not be written again).
    #[serde(default)]
    pub archived_high: u64,
}

/// A turn moved out of the window, to be kept in the archive.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ArchivedTurn {
    /// The chat's URI.
    pub chat: String,
    /// Its window's generation.
    pub generation: u64,
    /// Its position in the chat.
    pub ordinal: u64,
    /// The turn's id.
    pub turn_id: String,
    /// The AHP `Turn` as JSON text.
    pub body: String,
}

impl TurnWindow {
    /// The cursor for the turns below `ordinal` in this generation.
    pub fn cursor(&self, ordinal: u64) -> Option<String> {
        (ordinal > 0).then(|| format!("{}.{ordinal}", self.generation))
    }

    /// Parses a cursor this window issued: the ordinal it points below.
    /// `None` for anything else (another generation, or not a cursor).
    pub fn parse(&self, cursor: &str) -> Option<u64> {
        let (generation, ordinal) = cursor.split_once('.')?;
        let generation: u64 = generation.parse().ok()?;
        let ordinal: u64 = ordinal.parse().ok()?;
        (generation == self.generation && ordinal > 0).then_some(ordinal)
    }

    /// Trims `chat` to the window, returning the turns moved out that the
    /// archive does not hold yet.
    pub fn trim(&mut self, uri: &str, chat: &mut ChatState) -> Vec<ArchivedTurn> {
        if chat.turns.len() <= TURN_WINDOW {
            return Vec::new();
        }
        let excess = chat.turns.len() - TURN_WINDOW;
        let first = self.archived;
        let moved: Vec<Turn> = chat.turns.drain(..excess).collect();
        self.archived += moved.len() as u64;
        chat.turns_next_cursor = self.cursor(self.archived);
        let mut archived = Vec::new();
        for (offset, turn) in moved.into_iter().enumerate() {
            let ordinal = first + offset as u64;
            if ordinal < self.archived_high {
                continue;
            }
            archived.push(ArchivedTurn {
                chat: uri.to_owned(),
                generation: self.generation,
                ordinal,
                turn_id: turn.id.clone(),
                body: serde_json::to_string(&turn).unwrap_or_default(),
            });
        }
        self.archived_high = self.archived_high.max(self.archived);
        archived
    }

    /// Follows `chat/turnsLoaded`: `loaded` older turns now lead the window.
    pub fn loaded(&mut self, loaded: u64) {
        self.archived = self.archived.saturating_sub(loaded);
    }

    /// Follows a truncation of the whole chat: a new generation, empty.
    pub fn cleared(&mut self) {
        *self = TurnWindow {
            generation: self.generation + 1,
            archived: 0,
            archived_high: 0,
        };
    }

    /// The ordinals one `fetchTurns` with a cursor below `ordinal` loads:
    /// a page below the window's start (or below the cursor, when the
    /// caller's window reaches further back), through to the window, so
    /// that the host's own window stays one unbroken run.
    pub fn page(&self, ordinal: u64) -> std::ops::Range<u64> {
        let below = ordinal.min(self.archived);
        let start = below.saturating_sub(TURNS_PAGE);
        // A cursor far behind a window trimmed since loads at most this.
        let start = start.max(self.archived.saturating_sub(MAX_LOAD));
        start..self.archived
    }
}

/// The most turns one load brings back at once.
const MAX_LOAD: u64 = 1_000;

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn chat(turns: usize) -> ChatState {
        let turns: Vec<_> = (0..turns)
            .map(|i| {
                json!({"id": format!("t{i}"), "message": {"text": "q", "origin": {"kind": "user"}},
                "responseParts": [], "usage": null, "state": "complete"})
            })
            .collect();
        serde_json::from_value(json!({
            "resource": "ahp-chat:/c", "title": "", "status": 1,
            "modifiedAt": "2026-01-01T00:00:00.000Z", "turns": turns,
        }))
        .unwrap()
    }

    #[test]
    fn trimming_moves_the_oldest_turns_out_once() {
        let mut window = TurnWindow::default();
        let mut state = chat(TURN_WINDOW + 3);
        let moved = window.trim("ahp-chat:/c", &mut state);
        assert_eq!(moved.len(), 3);
        assert_eq!(moved[0].turn_id, "t0");
        assert_eq!(moved[2].ordinal, 2);
        assert_eq!(state.turns.len(), TURN_WINDOW);
        assert_eq!(state.turns_next_cursor.as_deref(), Some("0.3"));
        assert_eq!(window.parse("0.3"), Some(3));
        assert_eq!(window.parse("1.3"), None, "another generation");
        assert_eq!(window.page(3), 0..3);
        // Loaded back and trimmed again: nothing to write twice.
        window.loaded(3);
        assert_eq!(window.archived, 0);
        let mut reloaded = chat(TURN_WINDOW + 3);
        assert!(window.trim("ahp-chat:/c", &mut reloaded).is_empty());
        window.cleared();
        assert_eq!(window.parse("0.3"), None, "stale after a truncation");
    }
}
