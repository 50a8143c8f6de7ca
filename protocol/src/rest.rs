//! Bodies of Tether's REST API that are not AHP types.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// Answer of `GET /healthz`: the process is up and serving HTTP.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
#[schema(example = json!({"status": "ok", "version": "0.1.0"}))]
pub struct Health {
    /// Always `ok` when the process answers at all.
    pub status: String,
    /// The server's version.
    pub version: String,
}

/// One agent a session can run, in `GET /v1/agents`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
#[schema(example = json!({"provider": "echo", "displayName": "Echo", "kind": "builtin",
    "description": "Answers every turn with your own words; needs no model."}))]
pub struct AgentEntry {
    /// The `provider` sessions are created with.
    pub provider: String,
    /// Shown to people.
    pub display_name: String,
    /// What it is.
    pub description: String,
    /// `builtin` or `acp`.
    pub kind: String,
    /// What an ACP agent reported at `initialize` (`loadSession`, `resume`,
    /// `additionalDirectories`, `promptCapabilities`); absent when it did
    /// not answer at start-up.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Object>)]
    pub capabilities: Option<serde_json::Value>,
}

/// Answer of `GET /v1/agents`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct AgentList {
    /// Every agent this host offers, `echo` first.
    pub agents: Vec<AgentEntry>,
}

/// Answer of `GET /readyz`: whether the store can be reached.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
#[schema(example = json!({"status": "ready", "backend": "sqlite", "hostEpoch": "0b0f1f5e-7a52-4a8e-9d61-2f7b3c4d5e6f", "serverSeq": 42}))]
pub struct Readiness {
    /// `ready` when the store answered.
    pub status: String,
    /// `sqlite` or `postgres`.
    pub backend: String,
    /// The host epoch: a UUID created once per database. It changes only when
    /// the database is replaced, which tells clients their `serverSeq` is void.
    pub host_epoch: String,
    /// The highest `serverSeq` ever issued by this database.
    pub server_seq: u64,
}

/// An RFC 9457 problem document (`application/problem+json`).
///
/// `code` is stable and machine-readable; `title` and `detail` are for people.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
#[schema(example = json!({"type": "about:blank", "title": "Service Unavailable", "status": 503, "code": "store_unavailable", "detail": "The store could not be reached."}))]
pub struct Problem {
    /// A URI naming the problem type; `about:blank` when the status says it all.
    #[serde(rename = "type")]
    pub kind: String,
    /// The HTTP status phrase.
    pub title: String,
    /// The HTTP status code.
    pub status: u16,
    /// A stable, machine-readable error code (snake_case).
    pub code: String,
    /// What went wrong, in a sentence a person can act on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
}

/// A page of sessions, most recently updated first.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct SessionPage {
    /// The sessions.
    pub items: Vec<crate::view::SessionView>,
    /// Pass as `cursor` for the next page; absent on the last page.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_cursor: Option<String>,
}

/// A page of a session's transcript, oldest first.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct TranscriptPage {
    /// AHP `ActionEnvelope`s.
    #[schema(value_type = Vec<Object>)]
    pub envelopes: Vec<serde_json::Value>,
    /// Pass as `after` for the next page; absent when this page was not full.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_after: Option<u64>,
}

/// `POST /v1/sessions`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[schema(example = json!({"project": "web", "provider": "echo", "workingDirectories": ["/home/me/web"], "title": "Fix login"}))]
pub struct CreateSessionRequest {
    /// Session id (1 to 128 of `A-Za-z0-9._:-`); generated when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(min_length = 1, max_length = 128, pattern = "^[A-Za-z0-9._:-]{1,128}$")]
    pub id: Option<String>,
    /// Project name (1 to 128 of `A-Za-z0-9._:-`; default `default`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(min_length = 1, max_length = 128, pattern = "^[A-Za-z0-9._:-]{1,128}$")]
    pub project: Option<String>,
    /// Agent provider (default `echo`): one of the agents this host
    /// registers (AHP root state `agents`); another name is a 422.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provider: Option<String>,
    /// Absolute paths or absolute `file:` URIs; the first is the primary.
    /// The host's side-effect backend may refuse a directory (with the
    /// default `local` backend it must exist on the host): a 422.
    #[serde(default)]
    #[schema(value_type = Vec<WorkingDirectoryInput>)]
    pub working_directories: Vec<String>,
    /// A title.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub title: Option<String>,
    /// Values of the agent's configuration to start with (its mode, its
    /// model, ...), as `resolveSessionConfig` and `GET /v1/agents` show
    /// them; a key or value the agent does not offer is a 422.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Object>)]
    pub config: Option<serde_json::Map<String, serde_json::Value>>,
}

/// `POST /v1/sessions/{id}/actions`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[schema(example = json!({"clientId": "script-1", "clientSeq": 1, "action": {"type": "session/titleChanged", "title": "Renamed"}}))]
pub struct DispatchRequest {
    /// The dispatching client (1 to 256 characters); with `clientSeq`, the
    /// idempotency key.
    #[schema(min_length = 1, max_length = 256)]
    pub client_id: String,
    /// The client's sequence number for this action, 0 to 2^63−1 (the
    /// store keeps it as a signed 64-bit integer).
    #[serde(deserialize_with = "client_seq")]
    #[schema(minimum = 0, maximum = 9223372036854775807_i64)]
    pub client_seq: u64,
    /// The session's channel (`ahp-session:/<id>`) or one of its chats
    /// (`ahp-chat:/<id>`); default: the session.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(pattern = "^ahp-(session|chat):/[A-Za-z0-9._:-]{1,128}$")]
    pub channel: Option<String>,
    /// An AHP action object.
    #[schema(value_type = Object)]
    pub action: serde_json::Value,
}

/// The largest `clientSeq`: 2^63−1, the largest value both stores keep.
pub const MAX_CLIENT_SEQ: u64 = i64::MAX as u64;

/// Reads `clientSeq`, refusing anything but an integer in
/// `0..=MAX_CLIENT_SEQ` with a message that states the range: serde's own
/// ("expected u64") says neither the bound nor why, and a value past 2^63−1
/// would otherwise reach the store and fail there.
fn client_seq<'de, D: serde::Deserializer<'de>>(deserializer: D) -> Result<u64, D::Error> {
    struct Seq;
    impl serde::de::Visitor<'_> for Seq {
        type Value = u64;
        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            write!(f, "an integer from 0 to {MAX_CLIENT_SEQ}")
        }
        fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<u64, E> {
            if v <= MAX_CLIENT_SEQ {
                Ok(v)
            } else {
                Err(E::invalid_value(serde::de::Unexpected::Unsigned(v), &self))
            }
        }
        fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<u64, E> {
            u64::try_from(v).map_err(|_| E::invalid_value(serde::de::Unexpected::Signed(v), &self))
        }
    }
    deserializer.deserialize_u64(Seq)
}

/// One entry of `workingDirectories`, as the OpenAPI document describes
/// it: an absolute path or an absolute local `file:` URI (`file:///...`,
/// `file://localhost/...` or `file:/...`). Only a schema; the field is a
/// `String`.
#[derive(Debug, ToSchema)]
#[schema(pattern = "^(/|file:(//(localhost)?)?/)")]
pub struct WorkingDirectoryInput(pub String);

/// The accepted envelope of a dispatch.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct DispatchResponse {
    /// Its `serverSeq`.
    pub server_seq: u64,
    /// The AHP `ActionEnvelope`.
    #[schema(value_type = Object)]
    pub envelope: serde_json::Value,
}
