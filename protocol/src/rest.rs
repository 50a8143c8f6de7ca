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
