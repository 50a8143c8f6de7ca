//! Tether's validation rules for client-dispatched actions, on top of the
//! reducers: channel/action match, who may dispatch what, and the
//! working-directory rules. Each refusal is a sentence a person can act on.

use serde_json::Value;
use tether_protocol::actions::{
    EXTENSION_PREFIX, action_scope, action_type, check_extension, is_client_dispatchable,
    is_session_workdir_action,
};
use tether_protocol::channel::Channel;
use tether_protocol::model::SessionModel;
use tether_protocol::workdir::canonical_file_uri;

use crate::agents::WorkdirCapability;

/// Most messages one chat may hold queued: each starts a turn of its own
/// when the one before ends, so the queue is work promised to an agent.
pub const MAX_QUEUED: usize = 64;

/// Most chats one session may have (its default chat included): each is a
/// channel a transcript page and an export read.
pub const MAX_CHATS: usize = 256;

/// Host-originated actions no token may dispatch, an agent's included:
/// they change which chats a session owns, load archived turns, or record
/// the host's own view of the session's life. Only the host writes them.
const HOST_ONLY: [&str; 9] = [
    "session/chatAdded",
    "session/chatRemoved",
    "session/chatsReordered",
    "session/creationFailed",
    "chat/turnsLoaded",
    "x-tether/sessionCreated",
    "x-tether/sessionSettled",
    "x-tether/agentOpened",
    "x-tether/documentEdited",
];

/// Checks that a client may dispatch `action` on `channel` at all: it has a
/// type, belongs on this kind of channel and is client-dispatchable (or the
/// caller may dispatch host-originated actions: `host_actions`, an agent's
/// token). Returns the action type.
pub fn check_dispatchable<'a>(
    channel: &Channel,
    action: &'a Value,
    host_actions: bool,
) -> Result<&'a str, String> {
    let Some(kind) = action_type(action) else {
        return Err(
            "The action has no \"type\"; send an AHP action object such as \
                    {\"type\":\"session/titleChanged\",\"title\":\"...\"}."
                .to_owned(),
        );
    };
    let host_actions = host_actions && !HOST_ONLY.contains(&kind);
    if kind.starts_with(EXTENSION_PREFIX) {
        if !host_actions && !is_client_dispatchable(kind) {
            return Err(format!(
                "Action {kind} is recorded by the host itself; clients cannot dispatch it."
            ));
        }
        if !matches!(channel, Channel::Session(_)) {
            return Err(format!(
                "Action {kind} belongs on a session channel, not on {}.",
                channel.uri()
            ));
        }
        check_extension(action)?;
        return Ok(kind);
    }
    match action_scope(kind) {
        Some(scope) if scope == channel.kind() => {}
        Some(scope) => {
            return Err(format!(
                "Action {kind} belongs on a {scope} channel, not on {}.",
                channel.uri()
            ));
        }
        None => return Err(format!("Unknown action type {kind:?}.")),
    }
    if !host_actions && !is_client_dispatchable(kind) {
        return Err(format!(
            "Action {kind} is host-originated: only the host or the session's agent may \
             dispatch it."
        ));
    }
    Ok(kind)
}

/// Rewrites the working-directory URIs of a session or chat
/// working-directory action to canonical form and applies the host's rules.
pub fn check_workdirs(
    model: &SessionModel,
    caps: WorkdirCapability,
    kind: &str,
    action: &mut Value,
) -> Result<(), String> {
    let fields: &[&str] = match kind {
        "session/workingDirectorySet"
        | "session/workingDirectoryRemoved"
        | "chat/workingDirectorySet"
        | "chat/workingDirectoryRemoved" => &["directory"],
        "session/workingDirectoryReplaced" => &["directory", "replacement"],
        _ => return Ok(()),
    };
    if is_session_workdir_action(kind) && !caps.multiple {
        return Err(format!(
            "This session's agent ({}) works in a single directory; it cannot add, remove or \
             replace working directories.",
            model.session.provider
        ));
    }
    for field in fields {
        let given = action
            .get(*field)
            .and_then(Value::as_str)
            .ok_or_else(|| format!("Action {kind} needs a \"{field}\" URI."))?;
        let canonical = canonical_file_uri(given).map_err(|e| capitalise(&e.to_string()))?;
        action[*field] = Value::String(canonical);
    }
    let directory = action
        .get("directory")
        .and_then(Value::as_str)
        .unwrap_or_default();
    let primary = model.primary_directory();
    let targets_primary = primary == Some(directory);
    match kind {
        "session/workingDirectoryRemoved" if targets_primary => Err(if caps.primary_replacement {
            format!(
                "The primary working directory {directory} cannot be removed; replace it with \
                 session/workingDirectoryReplaced instead."
            )
        } else {
            format!("The primary working directory {directory} cannot be removed.")
        }),
        "session/workingDirectoryReplaced" if targets_primary && !caps.primary_replacement => {
            Err(if caps.immutable_primary {
                format!(
                    "The primary working directory {directory} is immutable for this agent; it \
                     cannot be replaced."
                )
            } else {
                format!(
                    "This session's agent does not support replacing the primary working \
                     directory {directory}."
                )
            })
        }
        "chat/workingDirectorySet" => {
            let in_session = model
                .session
                .working_directories
                .as_ref()
                .is_some_and(|dirs| dirs.iter().any(|d| d == directory));
            if in_session {
                Ok(())
            } else {
                Err(format!(
                    "A chat's working directories must be the session's; add {directory} to \
                     the session first."
                ))
            }
        }
        _ => Ok(()),
    }
}

fn capitalise(text: &str) -> String {
    let mut chars = text.chars();
    match chars.next() {
        Some(first) => {
            let mut out: String = first.to_uppercase().collect();
            out.push_str(chars.as_str());
            if !out.ends_with('.') {
                out.push('.');
            }
            out
        }
        None => String::new(),
    }
}
