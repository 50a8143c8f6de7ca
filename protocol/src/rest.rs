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

/// A whole number of days, written as JSON's integers or as a number with
/// no fraction (`30.0` is JSON Schema's integer too).
fn whole_days<'de, D: serde::Deserializer<'de>>(deserializer: D) -> Result<u32, D::Error> {
    struct Days;
    impl serde::de::Visitor<'_> for Days {
        type Value = u32;
        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            write!(f, "a whole number of days")
        }
        fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<u32, E> {
            u32::try_from(v)
                .map_err(|_| E::invalid_value(serde::de::Unexpected::Unsigned(v), &self))
        }
        fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<u32, E> {
            u32::try_from(v).map_err(|_| E::invalid_value(serde::de::Unexpected::Signed(v), &self))
        }
        fn visit_f64<E: serde::de::Error>(self, v: f64) -> Result<u32, E> {
            if v.fract() == 0.0 && (0.0..=f64::from(u32::MAX)).contains(&v) {
                Ok(v as u32)
            } else {
                Err(E::invalid_value(serde::de::Unexpected::Float(v), &self))
            }
        }
    }
    deserializer.deserialize_any(Days)
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

/// One search hit: a document of a session that matched, where it was said
/// and an extract around the match.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct SearchHit {
    /// The session.
    pub session_id: String,
    /// Its project.
    pub project: String,
    /// Its agent (provider).
    pub agent: String,
    /// Its title, when it has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub title: Option<String>,
    /// Its state (`live`, `dormant`, `closed`, `ended`).
    pub state: String,
    /// The chat it was said in; absent for the session's own title.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub chat: Option<String>,
    /// The turn it belongs to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub turn_id: Option<String>,
    /// What matched: `title`, `message`, `answer`, `tool`, `edit` (the paths
    /// a tool call edited) or `question`.
    pub kind: String,
    /// The `serverSeq` of the envelope that last wrote it.
    pub seq: u64,
    /// When that envelope was committed (RFC 3339).
    pub at: String,
    /// An extract around the first match, as plain text.
    pub snippet: String,
    /// The same extract as HTML: the text escaped, each matching word in
    /// `<mark>`.
    pub snippet_html: String,
}

/// A page of search hits, best first.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct SearchPage {
    /// The hits.
    pub items: Vec<SearchHit>,
    /// Pass as `cursor` for the next page; absent on the last page.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_cursor: Option<String>,
}

/// Usage totals over a time range, grouped.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct UsageReport {
    /// The range's start (RFC 3339), when one was given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub since: Option<String>,
    /// The range's end (RFC 3339, exclusive), when one was given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub until: Option<String>,
    /// What the rows are grouped by, in order: `project`, `principal`,
    /// `agent`, `model`.
    pub by: Vec<String>,
    /// One row per group and currency, in the order of `by`.
    pub rows: Vec<UsageLine>,
}

/// One group's totals.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct UsageLine {
    /// The project (when grouped by it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub project: Option<String>,
    /// Who started the turns, the token's `sub` (when grouped by it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub principal: Option<String>,
    /// The agent (when grouped by it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent: Option<String>,
    /// The model (when grouped by it; empty when the agent names none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// The cost's currency; empty for usage that reported no cost.
    pub currency: String,
    /// Input tokens.
    pub input_tokens: u64,
    /// Output tokens.
    pub output_tokens: u64,
    /// The cost, in `currency`.
    pub cost: f64,
    /// Usage reports summed.
    pub reports: u64,
    /// Sessions they came from.
    pub sessions: u64,
}

/// How long a project keeps its settled sessions.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Retention {
    /// The project.
    pub project: String,
    /// Days a session stays after it settled (dormant, closed or ended)
    /// with nothing written to it; absent: kept for good.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub days: Option<u32>,
}

/// Sets a project's retention.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RetentionRequest {
    /// Days a session stays after it settled with nothing written to it,
    /// 1 to 36,500.
    #[serde(deserialize_with = "whole_days")]
    #[schema(minimum = 1, maximum = 36500)]
    pub days: u32,
}

/// Adds a webhook to a project.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct WebhookRequest {
    /// Where events are posted (`http` or `https`, at most 2,048
    /// characters).
    pub url: String,
    /// The event kinds wanted: `turn.completed`, `turn.failed`,
    /// `input.needed`, `session.settled`, `agent.failed`; absent or empty:
    /// all.
    #[serde(default)]
    pub events: Vec<String>,
}

/// A project's webhook.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct WebhookView {
    /// Its id.
    pub id: String,
    /// Its project.
    pub project: String,
    /// Where events are posted.
    pub url: String,
    /// The event kinds it gets (empty: all).
    pub events: Vec<String>,
    /// The key deliveries are signed with (`Tether-Signature: sha256=` and
    /// the hex HMAC-SHA256 of the body): given once, when the webhook is
    /// created.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret: Option<String>,
    /// When it was created (RFC 3339).
    pub created_at: String,
    /// Who created it.
    pub created_by: String,
}

/// A project's webhooks.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct WebhookList {
    /// Oldest first.
    pub items: Vec<WebhookView>,
}

/// One event's delivery to a webhook.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct DeliveryView {
    /// The event's id (the `Tether-Delivery` header; the same on every
    /// attempt).
    pub event_id: String,
    /// Its kind.
    pub kind: String,
    /// Its session.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_id: Option<String>,
    /// When the event was raised (RFC 3339).
    pub created_at: String,
    /// `pending`, `delivered` or `failed` (given up).
    pub state: String,
    /// Attempts made.
    pub attempts: u64,
    /// When the next attempt is due (pending).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_attempt_at: Option<String>,
    /// When it was delivered.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delivered_at: Option<String>,
    /// The receiver's last HTTP status.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_status: Option<u16>,
    /// The last error.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_error: Option<String>,
}

/// A webhook's latest deliveries.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct DeliveryList {
    /// Newest first.
    pub items: Vec<DeliveryView>,
}
