//! The session summary Tether serves (REST and the read model).

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::model::SessionModel;
use crate::projection::{Projection, SessionLifeState};

/// A session as listed and inspected: identity, projected state and the
/// facts folded from its transcript.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct SessionView {
    /// Session id.
    pub id: String,
    /// Its AHP channel URI, `ahp-session:/<id>`.
    pub resource: String,
    /// Project name.
    pub project: String,
    /// Agent provider.
    pub provider: String,
    /// The explicit title, else derived from the first turn.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub title: Option<String>,
    /// Projected state.
    pub state: SessionLifeState,
    /// Why it is in that state, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cause: Option<String>,
    /// Whether it can be resumed.
    pub resumable: bool,
    /// Turns started.
    pub turns: u64,
    /// AHP status bits, as the session summary shows them (the busiest
    /// chat's activity with the session's own flags).
    pub status: u32,
    /// Working directories (canonical `file:` URIs); index 0 is the primary.
    pub working_directories: Vec<String>,
    /// The default chat's URI.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default_chat: Option<String>,
    /// The seq of its latest envelope.
    pub last_seq: u64,
    /// Creation time (RFC 3339).
    pub created_at: String,
    /// Time of its latest envelope (RFC 3339).
    pub updated_at: String,
    /// Everything the transcript says about the session.
    pub projection: Projection,
}

impl SessionView {
    /// The view of a model; `live` says whether its agent is attached.
    pub fn of(model: &SessionModel, live: bool, updated_at: &str) -> Self {
        let (state, cause) = model.projection.state(live);
        Self {
            id: model.id.clone(),
            resource: model.uri(),
            project: model.created.project.clone(),
            provider: model.session.provider.clone(),
            title: model.projection.title(),
            state,
            cause,
            resumable: model.projection.resumable(),
            turns: model.projection.turns,
            status: model.summary_status(),
            working_directories: model
                .session
                .working_directories
                .clone()
                .unwrap_or_default(),
            default_chat: model.session.default_chat.clone(),
            last_seq: model.last_seq,
            created_at: model.created.created_at.clone(),
            updated_at: updated_at.to_owned(),
            projection: model.projection.clone(),
        }
    }
}
