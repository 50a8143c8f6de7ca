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
    /// Session id; generated when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// Project name (default `default`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub project: Option<String>,
    /// Agent provider (default `echo`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provider: Option<String>,
    /// Absolute paths or `file:` URIs; the first is the primary.
    #[serde(default)]
    pub working_directories: Vec<String>,
    /// A title.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub title: Option<String>,
}

/// `POST /v1/sessions/{id}/actions`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[schema(example = json!({"clientId": "script-1", "clientSeq": 1, "action": {"type": "session/titleChanged", "title": "Renamed"}}))]
pub struct DispatchRequest {
    /// The dispatching client; with `clientSeq`, the idempotency key.
    pub client_id: String,
    /// The client's sequence number for this action.
    pub client_seq: u64,
    /// The session's channel or one of its chats (default: the session).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub channel: Option<String>,
    /// An AHP action object.
    #[schema(value_type = Object)]
    pub action: serde_json::Value,
}

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
