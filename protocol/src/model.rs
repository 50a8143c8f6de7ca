//! A session's whole state (the AHP session state, its chats and the
//! projection), changed only by folding accepted actions through the `ahp`
//! reducers and Tether's own fold. The server's session actor and every
//! rebuild (snapshot plus transcript tail) use this one fold, so a snapshot
//! at seq N plus the envelopes after it always gives the live state
//! (invariant 4).

use std::collections::BTreeMap;

use ahp::reducers::{
    ReduceOutcome, apply_action_to_changeset, apply_action_to_chat, apply_action_to_session,
    apply_action_to_terminal,
};
use ahp_types::actions::StateAction;
use ahp_types::state::{
    ChangesetState, ChangesetStatus, ChatState, ResponsePart, SessionState, TerminalLifecycleState,
    TerminalRunningLifecycleState, TerminalState, ToolCallState,
};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::actions::{CONFIG_SCHEMA_CHANGED, EXTENSION_PREFIX, SESSION_CREATED, action_type};
use crate::channel::Channel;
use crate::projection::Projection;
use crate::window::{ArchivedTurn, TurnWindow};

/// The body of `x-tether/sessionCreated`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SessionCreated {
    /// Project name.
    pub project: String,
    /// Agent provider.
    pub provider: String,
    /// Initial title (may be empty).
    #[serde(default)]
    pub title: String,
    /// Canonical working-directory URIs; index 0 is the primary.
    #[serde(default)]
    pub working_directories: Vec<String>,
    /// The active client, as AHP's `SessionActiveClient`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub active_client: Option<Value>,
    /// The default chat's URI.
    pub default_chat: String,
    /// Creation time, RFC 3339.
    pub created_at: String,
    /// The session's initial AHP configuration `{schema, values}` (the
    /// agent's modes and options), when its agent has any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config: Option<Value>,
    /// The session state's initial `_meta` (the agent's commands and its
    /// options' categories).
    #[serde(default, rename = "_meta", skip_serializing_if = "Option::is_none")]
    pub meta: Option<Value>,
}

impl SessionCreated {
    /// The action as it is appended to the transcript.
    pub fn to_action(&self) -> Value {
        let mut value = serde_json::to_value(self).unwrap_or_else(|_| json!({}));
        if let Value::Object(map) = &mut value {
            map.insert("type".into(), Value::String(SESSION_CREATED.into()));
        }
        value
    }
}

/// A session's state.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SessionModel {
    /// Session id.
    pub id: String,
    /// How it was created.
    pub created: SessionCreated,
    /// The AHP session state.
    pub session: SessionState,
    /// Each chat's AHP state, by chat URI. Boxed, as the other states: a
    /// B-tree node holds room for eleven values, and an AHP state is over
    /// a kilobyte, so a session's one chat cost a 17 KiB node unboxed.
    pub chats: BTreeMap<String, Box<ChatState>>,
    /// Each changeset's AHP state, by its URI (`ahp-changeset:/<id>/<name>`):
    /// one comes to be with the first action on it.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub changesets: BTreeMap<String, Box<ChangesetState>>,
    /// Each terminal's AHP state, by its URI (`ahp-terminal:/<id>/<name>`):
    /// one comes to be when it is first claimed (`terminal/claimed`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub terminals: BTreeMap<String, Box<TerminalState>>,
    /// What the transcript says about the session.
    pub projection: Projection,
    /// The seq of the last envelope folded in.
    pub last_seq: u64,
    /// Where each chat's loaded window of turns starts (see
    /// [`crate::window`]); chats that never outgrew it have no entry.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub windows: BTreeMap<String, TurnWindow>,
    /// Turns moved out of their chat's window by the actions folded since
    /// the last [`SessionModel::take_trimmed`], for the turn archive.
    #[serde(skip)]
    pub trimmed: Vec<ArchivedTurn>,
}

/// Why a model could not be built or an action could not be folded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ModelError {
    /// A stored record does not have the expected shape.
    #[error("malformed record: {0}")]
    Malformed(String),
}

fn chat_state(resource: &str, modified_at: &str) -> Result<ChatState, ModelError> {
    serde_json::from_value(json!({
        "resource": resource,
        "title": "",
        "status": 1,
        "modifiedAt": modified_at,
        "turns": [],
    }))
    .map_err(|e| ModelError::Malformed(e.to_string()))
}

impl SessionModel {
    /// The model right after `x-tether/sessionCreated` with seq `seq`.
    pub fn created(id: &str, created: SessionCreated, seq: u64) -> Result<Self, ModelError> {
        let chat = json!({
            "resource": created.default_chat,
            "title": "",
            "status": 1,
            "modifiedAt": created.created_at,
        });
        let mut session = json!({
            "provider": created.provider,
            "title": created.title,
            "status": 1,
            "project": {
                "uri": format!("tether-project:/{}", created.project),
                "displayName": created.project,
            },
            "workingDirectories": created.working_directories,
            "lifecycle": "ready",
            "activeClients": created.active_client.iter().collect::<Vec<_>>(),
            "chats": [chat],
            "defaultChat": created.default_chat,
        });
        if let Some(config) = &created.config {
            session["config"] = config.clone();
        }
        if let Some(meta) = &created.meta {
            session["_meta"] = meta.clone();
        }
        let session: SessionState =
            serde_json::from_value(session).map_err(|e| ModelError::Malformed(e.to_string()))?;
        let mut chats = BTreeMap::new();
        chats.insert(
            created.default_chat.clone(),
            Box::new(chat_state(&created.default_chat, &created.created_at)?),
        );
        let mut projection = Projection::default();
        if !created.title.trim().is_empty() {
            projection.explicit_title = Some(created.title.clone());
        }
        Ok(Self {
            id: id.to_owned(),
            created,
            session,
            chats,
            changesets: BTreeMap::new(),
            terminals: BTreeMap::new(),
            projection,
            last_seq: seq,
            windows: BTreeMap::new(),
            trimmed: Vec::new(),
        })
    }

    /// Builds the model from its first record (`x-tether/sessionCreated`).
    pub fn from_first_record(id: &str, action: &Value, seq: u64) -> Result<Self, ModelError> {
        if action_type(action) != Some(SESSION_CREATED) {
            return Err(ModelError::Malformed(format!(
                "session {id} does not start with {SESSION_CREATED}"
            )));
        }
        let created: SessionCreated = serde_json::from_value(action.clone())
            .map_err(|e| ModelError::Malformed(e.to_string()))?;
        Self::created(id, created, seq)
    }

    /// The session's channel URI.
    pub fn uri(&self) -> String {
        Channel::session_uri(&self.id)
    }

    /// Whether `channel` is the session's own channel (no URI is built).
    pub fn is_own_channel(&self, channel: &str) -> bool {
        Channel::is_session_uri(channel, &self.id)
    }

    /// Folds one action on `channel` (this session, one of its chats,
    /// changesets or terminals) and
    /// reports the reducer's outcome. `Applied` and `NoOp` change (or keep)
    /// the state and the projection; `OutOfScope` and `Invalid` leave both
    /// untouched.
    pub fn apply(&mut self, channel: &str, action: &Value, typed: &StateAction) -> ReduceOutcome {
        let (outcome, trial) = self.try_apply(channel, action, typed);
        if let Some(trial) = trial {
            self.accept(trial, action, typed);
        }
        outcome
    }

    /// Runs the reducer on a copy of the part of the state `channel` names
    /// (not the whole model: a chat with a long history is copied only when
    /// the action targets it). Returns the outcome and, when it is `Applied`
    /// or `NoOp`, the changed part for [`SessionModel::accept`].
    pub fn try_apply(
        &self,
        channel: &str,
        action: &Value,
        typed: &StateAction,
    ) -> (ReduceOutcome, Option<Trial>) {
        let kind = action_type(action).unwrap_or_default();
        let (outcome, target) = if kind.starts_with(EXTENSION_PREFIX) {
            // Tether's extensions live on the session channel and only move
            // the projection; AHP state has no slot for them.
            if self.is_own_channel(channel) && kind != SESSION_CREATED {
                (ReduceOutcome::Applied, Target::Extension)
            } else {
                (ReduceOutcome::OutOfScope, Target::Extension)
            }
        } else if self.is_own_channel(channel) {
            let mut session = self.session.clone();
            let outcome = apply_action_to_session(&mut session, typed);
            (outcome, Target::Session(Box::new(session)))
        } else if let Some(chat) = self.chats.get(channel) {
            match streamed_part(chat, typed) {
                // A streamed piece of a part: AHP's reducer changes nothing
                // unless it applies, so it is applied to the chat itself on
                // acceptance, not to a copy of the whole chat (every turn
                // in its window, the answer so far) made for each delta.
                Some(found) => {
                    let outcome = if found {
                        ReduceOutcome::Applied
                    } else {
                        ReduceOutcome::NoOp
                    };
                    (outcome, Target::ChatInPlace(channel.to_owned()))
                }
                None => {
                    let mut chat = chat.clone();
                    let outcome = apply_action_to_chat(&mut chat, typed);
                    (outcome, Target::Chat(channel.to_owned(), chat))
                }
            }
        } else if let Some(mut changeset) = self.changeset(channel) {
            let outcome = apply_action_to_changeset(&mut changeset, typed);
            (outcome, Target::Changeset(channel.to_owned(), changeset))
        } else if let Some(mut terminal) = self.terminal(channel, typed) {
            let outcome = apply_action_to_terminal(&mut terminal, typed);
            (outcome, Target::Terminal(channel.to_owned(), terminal))
        } else {
            (ReduceOutcome::OutOfScope, Target::Extension)
        };
        match outcome {
            ReduceOutcome::Applied | ReduceOutcome::NoOp => (outcome, Some(Trial { target })),
            _ => (outcome, None),
        }
    }

    /// Adopts a trial from [`SessionModel::try_apply`] of the same action.
    pub fn accept(&mut self, trial: Trial, action: &Value, typed: &StateAction) {
        match trial.target {
            Target::Session(session) => {
                self.session = *session;
                self.follow_chat_catalogue(typed);
            }
            Target::ChatInPlace(uri) => {
                if let Some(mut chat) = self.chats.remove(&uri) {
                    apply_action_to_chat(&mut chat, typed);
                    self.adopt_chat(uri, chat, typed);
                }
            }
            Target::Chat(uri, chat) => self.adopt_chat(uri, chat, typed),
            Target::Changeset(uri, changeset) => {
                self.changesets.insert(uri, changeset);
            }
            Target::Terminal(uri, terminal) => {
                self.terminals.insert(uri, terminal);
            }
            Target::Extension => {
                if action_type(action) == Some(CONFIG_SCHEMA_CHANGED) {
                    // AHP has no action for a config's shape; this is
                    // Tether's fold of its own record.
                    self.session.config = action
                        .get("config")
                        .cloned()
                        .and_then(|c| serde_json::from_value(c).ok());
                }
            }
        }
        self.projection.observe(action);
    }

    /// Takes a chat's state after an action into the model, its window of
    /// turns trimmed.
    fn adopt_chat(&mut self, uri: String, mut chat: Box<ChatState>, typed: &StateAction) {
        let window = self.windows.entry(uri.clone()).or_default();
        match typed {
            // Loaded turns lead the window until the next trim.
            StateAction::ChatTurnsLoaded(_) => {
                let before = self.chats.get(&uri).map_or(0, |c| c.turns.len());
                window.loaded(chat.turns.len().saturating_sub(before) as u64);
            }
            StateAction::ChatTruncated(truncated) if truncated.turn_id.is_none() => {
                window.cleared();
            }
            other => {
                if matches!(other, StateAction::ChatTruncated(_)) {
                    // Ordinals past the kept turns will be reused.
                    let kept = window.archived + chat.turns.len() as u64;
                    window.archived_high = window.archived_high.min(kept);
                }
                let moved = window.trim(&uri, &mut chat);
                self.trimmed.extend(moved);
            }
        }
        if *window == TurnWindow::default() {
            self.windows.remove(&uri);
        }
        self.chats.insert(uri, chat);
    }

    /// A copy of the changeset `channel` names, if it is one of this
    /// session's: the one there is, or a new, empty one.
    fn changeset(&self, channel: &str) -> Option<Box<ChangesetState>> {
        if let Some(existing) = self.changesets.get(channel) {
            return Some(existing.clone());
        }
        match Channel::parse(channel) {
            Ok(Channel::Changeset { session, .. }) if session == self.id => {
                Some(Box::new(ChangesetState {
                    status: ChangesetStatus::Ready,
                    error: None,
                    files: Vec::new(),
                    operations: None,
                }))
            }
            _ => None,
        }
    }

    /// A copy of the terminal `channel` names, if it is one of this
    /// session's: the one there is, or, for the claim that makes it, a new
    /// one, running, titled by its name.
    fn terminal(&self, channel: &str, typed: &StateAction) -> Option<Box<TerminalState>> {
        if let Some(existing) = self.terminals.get(channel) {
            return Some(existing.clone());
        }
        let StateAction::TerminalClaimed(claimed) = typed else {
            return None;
        };
        match Channel::parse(channel) {
            Ok(Channel::Terminal { session, name }) if session == self.id => {
                Some(Box::new(TerminalState {
                    title: name,
                    cwd: None,
                    cols: None,
                    rows: None,
                    content: Vec::new(),
                    lifecycle: TerminalLifecycleState::Running(TerminalRunningLifecycleState {}),
                    claim: claimed.claim.clone(),
                    supports_command_detection: None,
                    is_pty: Some(false),
                }))
            }
            _ => None,
        }
    }

    /// Keeps a chat state for every chat in the session's catalogue.
    fn follow_chat_catalogue(&mut self, typed: &StateAction) {
        match typed {
            StateAction::SessionChatAdded(added) => {
                let summary = &added.summary;
                if !self.chats.contains_key(&summary.resource)
                    && let Ok(chat) = chat_state(&summary.resource, &summary.modified_at)
                {
                    self.chats.insert(summary.resource.clone(), Box::new(chat));
                }
            }
            StateAction::SessionChatRemoved(removed) => {
                self.chats.remove(&removed.chat);
                self.windows.remove(&removed.chat);
            }
            _ => {}
        }
    }

    /// The session's status bits as its summary shows them: the session's
    /// own flags (read, archived, error, its input queue) with the busiest
    /// activity of any of its chats (input needed, then in progress), as
    /// the chat reducers keep them on each chat.
    pub fn summary_status(&self) -> u32 {
        // The session's own activity counts while it waits for the person
        // (its own input requests). The in-progress bit the reducer leaves
        // behind when the last of them is answered says nothing once no
        // chat is busy: without this, a session that was asked a question
        // showed "in progress" after its turn had ended.
        let own = self.session.status & STATUS_ACTIVITY;
        let waiting = if activity_rank(own) == 2 { own } else { IDLE };
        let busiest = self
            .chats
            .values()
            .map(|chat| chat.status & STATUS_ACTIVITY)
            .chain([waiting])
            .max_by_key(|activity| activity_rank(*activity))
            .unwrap_or(IDLE);
        match (activity_rank(busiest), activity_rank(own)) {
            // Nothing is busy and the session's own bits say so: they stand.
            (0, 0) => self.session.status,
            // Nothing is busy: idle, whatever activity bit was left.
            (0, _) => (self.session.status & !STATUS_ACTIVITY) | IDLE,
            _ => (self.session.status & !STATUS_ACTIVITY) | busiest,
        }
    }

    /// The turns moved out of their windows since the last call.
    pub fn take_trimmed(&mut self) -> Vec<ArchivedTurn> {
        std::mem::take(&mut self.trimmed)
    }

    /// A chat's window (the default when it never outgrew it).
    pub fn window(&self, chat: &str) -> TurnWindow {
        self.windows.get(chat).copied().unwrap_or_default()
    }

    /// The primary (index 0) working directory, if any.
    pub fn primary_directory(&self) -> Option<&str> {
        self.session
            .working_directories
            .as_ref()
            .and_then(|dirs| dirs.first())
            .map(String::as_str)
    }
}

/// The activity bits of an AHP status (the low five, as the `ahp` reducers
/// mask them): idle, error, in progress, input needed.
const STATUS_ACTIVITY: u32 = (1 << 5) - 1;
const IDLE: u32 = 1;
const IN_PROGRESS: u32 = 8;
const INPUT_NEEDED: u32 = 24;

/// How busy an activity is: input needed over in progress over the rest.
fn activity_rank(activity: u32) -> u8 {
    if activity & INPUT_NEEDED == INPUT_NEEDED {
        2
    } else if activity & IN_PROGRESS == IN_PROGRESS {
        1
    } else {
        0
    }
}

/// A reducer result not yet adopted by the model.
#[derive(Debug, Clone)]
pub struct Trial {
    target: Target,
}

impl Trial {
    /// The session's state after the action, when it moves the session.
    pub fn session_state(&self) -> Option<&SessionState> {
        match &self.target {
            Target::Session(session) => Some(session),
            _ => None,
        }
    }
}

#[derive(Debug, Clone)]
enum Target {
    Session(Box<SessionState>),
    Chat(String, Box<ChatState>),
    /// The action is applied to the chat itself when accepted (see
    /// [`streamed_part`]).
    ChatInPlace(String),
    Changeset(String, Box<ChangesetState>),
    Terminal(String, Box<TerminalState>),
    Extension,
}

/// For a streamed piece of a response part (`chat/delta`,
/// `chat/reasoning`), whether AHP's reducer applies it: the chat has an
/// active turn of that id with a part of that id (as `update_response_part`
/// in `ahp::reducers` finds it; it changes nothing when it does not).
/// `None` for any other action.
fn streamed_part(chat: &ChatState, typed: &StateAction) -> Option<bool> {
    let (turn_id, part_id) = match typed {
        StateAction::ChatDelta(a) => (&a.turn_id, &a.part_id),
        StateAction::ChatReasoning(a) => (&a.turn_id, &a.part_id),
        _ => return None,
    };
    let found = chat.active_turn.as_ref().is_some_and(|active| {
        active.id == *turn_id
            && active.response_parts.iter().any(|part| {
                let id = match part {
                    ResponsePart::ToolCall(tc) => tool_call_id(&tc.tool_call),
                    ResponsePart::Markdown(m) => &m.id,
                    ResponsePart::Reasoning(r) => &r.id,
                    _ => return false,
                };
                id == part_id
            })
    });
    Some(found)
}

/// A tool call's id, as AHP's reducer reads it.
fn tool_call_id(call: &ToolCallState) -> &str {
    match call {
        ToolCallState::Streaming(s) => &s.tool_call_id,
        ToolCallState::PendingConfirmation(s) => &s.tool_call_id,
        ToolCallState::Running(s) => &s.tool_call_id,
        ToolCallState::AuthRequired(s) => &s.tool_call_id,
        ToolCallState::PendingResultConfirmation(s) => &s.tool_call_id,
        ToolCallState::Completed(s) => &s.tool_call_id,
        ToolCallState::Cancelled(s) => &s.tool_call_id,
        ToolCallState::Unknown(_) => "",
    }
}

/// Parses an action object into AHP's typed action.
pub fn typed_action(action: &Value) -> StateAction {
    // Deserialises from the borrowed value: no copy of the action on the
    // dispatch path.
    StateAction::deserialize(action).unwrap_or_else(|_| StateAction::Unknown(action.clone()))
}

/// A session `s` of project `p` just created with these working
/// directories (the crate's tests start from it).
#[cfg(test)]
pub(crate) fn test_model(dirs: &[&str]) -> SessionModel {
    SessionModel::created(
        "s",
        SessionCreated {
            project: "p".into(),
            provider: "echo".into(),
            title: String::new(),
            working_directories: dirs.iter().map(|d| d.to_string()).collect(),
            active_client: None,
            default_chat: "ahp-chat:/s.main".into(),
            created_at: "2026-01-01T00:00:00.000Z".into(),
            config: None,
            meta: None,
        },
        1,
    )
    .unwrap()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn model(dirs: &[&str]) -> SessionModel {
        test_model(dirs)
    }

    fn apply(m: &mut SessionModel, channel: &str, action: Value) -> ReduceOutcome {
        let typed = typed_action(&action);
        m.apply(channel, &action, &typed)
    }

    /// A streamed piece, applied to the chat itself, does what AHP's
    /// reducer does to a copy: the same outcome and the same chat, for
    /// markdown, reasoning and tool-call parts, an unknown part, another
    /// turn, and no turn at all.
    #[test]
    fn a_streamed_piece_applied_in_place_is_the_reducers_fold() {
        let chat = "ahp-chat:/s.main";
        let mut m = model(&[]);
        for action in [
            json!({"type": "chat/turnStarted", "turnId": "t1", "startedAt": "2026-01-01T00:00:01.000Z",
                   "message": {"text": "go", "origin": {"kind": "user"}}}),
            json!({"type": "chat/responsePart", "turnId": "t1",
                   "part": {"kind": "markdown", "id": "p1", "content": "It "}}),
            json!({"type": "chat/responsePart", "turnId": "t1",
                   "part": {"kind": "reasoning", "id": "r1", "content": "Hm"}}),
            json!({"type": "chat/toolCallStart", "turnId": "t1", "toolCallId": "c1",
                   "toolName": "sh", "displayName": "Run"}),
        ] {
            assert_eq!(apply(&mut m, chat, action), ReduceOutcome::Applied);
        }
        let piece = |kind: &str, turn: &str, part: &str, content: &str| json!({"type": kind, "turnId": turn, "partId": part, "content": content});
        let pieces = [
            (
                piece("chat/delta", "t1", "p1", "works"),
                ReduceOutcome::Applied,
            ),
            (
                piece("chat/reasoning", "t1", "r1", "m."),
                ReduceOutcome::Applied,
            ),
            (piece("chat/delta", "t1", "c1", "x"), ReduceOutcome::Applied),
            (
                piece("chat/reasoning", "t1", "p1", "y"),
                ReduceOutcome::Applied,
            ),
            (piece("chat/delta", "t1", "nope", "z"), ReduceOutcome::NoOp),
            (piece("chat/delta", "t2", "p1", "z"), ReduceOutcome::NoOp),
        ];
        let check = |m: &mut SessionModel, action: &Value, expected: ReduceOutcome| {
            let typed = typed_action(action);
            let mut copy = m.chats[chat].clone();
            let reducer = apply_action_to_chat(&mut copy, &typed);
            assert_eq!(reducer, expected, "{action}");
            assert_eq!(m.apply(chat, action, &typed), reducer, "{action}");
            assert_eq!(m.chats[chat], copy, "{action}");
        };
        for (action, expected) in &pieces {
            check(&mut m, action, expected.clone());
        }
        let Some(ResponsePart::Markdown(answer)) = m.chats[chat]
            .active_turn
            .as_ref()
            .and_then(|t| t.response_parts.first())
        else {
            panic!("no answer");
        };
        assert_eq!(answer.content, "It works");
        // With no turn running, nothing applies.
        let done = json!({"type": "chat/turnComplete", "turnId": "t1", "duration": 1});
        assert_eq!(apply(&mut m, chat, done), ReduceOutcome::Applied);
        for (action, _) in &pieces {
            check(&mut m, action, ReduceOutcome::NoOp);
        }
    }

    #[test]
    fn replacement_dedupes_as_the_reducer_says() {
        let mut m = model(&["file:///a", "file:///b", "file:///c"]);
        let out = apply(
            &mut m,
            "ahp-session:/s",
            json!({"type": "session/workingDirectoryReplaced", "directory": "file:///b", "replacement": "file:///c"}),
        );
        assert_eq!(out, ReduceOutcome::Applied);
        assert_eq!(
            m.session.working_directories.clone().unwrap(),
            vec!["file:///a", "file:///c"]
        );
        let mut m = model(&["file:///a", "file:///b", "file:///c"]);
        apply(
            &mut m,
            "ahp-session:/s",
            json!({"type": "session/workingDirectoryReplaced", "directory": "file:///c", "replacement": "file:///a"}),
        );
        assert_eq!(
            m.session.working_directories.clone().unwrap(),
            vec!["file:///a", "file:///b"]
        );
        let out = apply(
            &mut m,
            "ahp-session:/s",
            json!({"type": "session/workingDirectoryReplaced", "directory": "file:///zzz", "replacement": "file:///a"}),
        );
        assert_eq!(out, ReduceOutcome::NoOp);
    }

    #[test]
    fn a_turn_runs_on_the_default_chat_and_the_projection_follows() {
        let mut m = model(&[]);
        let started = json!({"type": "chat/turnStarted", "turnId": "t1", "startedAt": "2026-01-01T00:00:01.000Z",
            "message": {"text": "hi", "origin": {"kind": "user"}}});
        assert_eq!(
            apply(&mut m, "ahp-chat:/s.main", started),
            ReduceOutcome::Applied
        );
        assert_eq!(m.projection.open_turn_id.as_deref(), Some("t1"));
        let done = json!({"type": "chat/turnComplete", "turnId": "t1", "duration": 5});
        assert_eq!(
            apply(&mut m, "ahp-chat:/s.main", done),
            ReduceOutcome::Applied
        );
        assert_eq!(m.chats["ahp-chat:/s.main"].turns.len(), 1);
        assert_eq!(m.projection.open_turn_id, None);
        assert_eq!(
            apply(
                &mut m,
                "ahp-chat:/other",
                json!({"type": "chat/draftChanged"})
            ),
            ReduceOutcome::OutOfScope
        );
    }

    #[test]
    fn snapshots_round_trip() {
        let m = model(&["file:///a"]);
        let text = serde_json::to_string(&m).unwrap();
        let back: SessionModel = serde_json::from_str(&text).unwrap();
        assert_eq!(back, m);
    }
}
