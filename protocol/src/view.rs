//! The session summary Tether serves (REST and the read model).

use std::borrow::Cow;

use serde::{Deserialize, Serialize, Serializer};
use utoipa::ToSchema;

use crate::model::SessionModel;
use crate::projection::{Projection, SessionLifeState};

/// A session as listed and inspected: identity, projected state and the
/// facts folded from its transcript.
// Serialised as `SessionViewRef`, which names its fields once.
#[derive(Debug, Clone, PartialEq, Deserialize, ToSchema)]
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
        let view = SessionViewRef::of(model, live, updated_at);
        Self {
            id: view.id.to_owned(),
            resource: view.resource.into_owned(),
            project: view.project.to_owned(),
            provider: view.provider.to_owned(),
            title: view.title.map(Cow::into_owned),
            state: view.state,
            cause: view.cause.map(str::to_owned),
            resumable: view.resumable,
            turns: view.turns,
            status: view.status,
            working_directories: view.working_directories.to_vec(),
            default_chat: view.default_chat.map(str::to_owned),
            last_seq: view.last_seq,
            created_at: view.created_at.to_owned(),
            updated_at: view.updated_at.to_owned(),
            projection: view.projection.clone(),
        }
    }
}

impl Serialize for SessionView {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        SessionViewRef {
            id: &self.id,
            resource: Cow::Borrowed(&self.resource),
            project: &self.project,
            provider: &self.provider,
            title: self.title.as_deref().map(Cow::Borrowed),
            state: self.state,
            cause: self.cause.as_deref(),
            resumable: self.resumable,
            turns: self.turns,
            status: self.status,
            working_directories: &self.working_directories,
            default_chat: self.default_chat.as_deref(),
            last_seq: self.last_seq,
            created_at: &self.created_at,
            updated_at: &self.updated_at,
            projection: &self.projection,
        }
        .serialize(serializer)
    }
}

/// A [`SessionView`] borrowed from its model: the one definition of how a
/// view is serialised, and what the read model serialises on every commit
/// without copying the model's strings and projection first. Its fields
/// are [`SessionView`]'s.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SessionViewRef<'a> {
    pub id: &'a str,
    pub resource: Cow<'a, str>,
    pub project: &'a str,
    pub provider: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub title: Option<Cow<'a, str>>,
    pub state: SessionLifeState,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cause: Option<&'a str>,
    pub resumable: bool,
    pub turns: u64,
    pub status: u32,
    pub working_directories: &'a [String],
    #[serde(skip_serializing_if = "Option::is_none")]
    pub default_chat: Option<&'a str>,
    pub last_seq: u64,
    pub created_at: &'a str,
    pub updated_at: &'a str,
    pub projection: &'a Projection,
}

impl<'a> SessionViewRef<'a> {
    /// The view of a model; `live` says whether its agent is attached.
    pub fn of(model: &'a SessionModel, live: bool, updated_at: &'a str) -> Self {
        let (state, cause) = model.projection.state_ref(live);
        Self {
            id: &model.id,
            resource: Cow::Owned(model.uri()),
            project: &model.created.project,
            provider: &model.session.provider,
            title: model.projection.title_ref(),
            state,
            cause,
            resumable: model.projection.resumable(),
            turns: model.projection.turns,
            status: model.summary_status(),
            working_directories: model.session.working_directories.as_deref().unwrap_or(&[]),
            default_chat: model.session.default_chat.as_deref(),
            last_seq: model.last_seq,
            created_at: &model.created.created_at,
            updated_at,
            projection: &model.projection,
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};

    use super::*;
    use crate::model::{test_model, typed_action};

    fn model() -> SessionModel {
        let mut m = test_model(&["file:///a", "file:///b"]);
        m.created.project = "p\"q".into();
        m
    }

    fn apply(m: &mut SessionModel, channel: &str, action: Value) {
        m.apply(channel, &action, &typed_action(&action));
    }

    /// The borrowed view is the view: the same text, read back as the same
    /// value, with the first turn's text as the title, then an explicit one
    /// (escaped), live and settled.
    #[test]
    fn the_borrowed_view_serialises_as_the_view_and_reads_back_as_it() {
        let mut m = model();
        let mut seen = Vec::new();
        let mut check = |m: &SessionModel| {
            for live in [false, true] {
                let view = SessionView::of(m, live, "2026-01-02T00:00:00.000Z");
                let text = serde_json::to_string(&view).unwrap();
                let borrowed =
                    serde_json::to_string(&SessionViewRef::of(m, live, "2026-01-02T00:00:00.000Z"))
                        .unwrap();
                assert_eq!(text, borrowed);
                assert_eq!(serde_json::from_str::<SessionView>(&text).unwrap(), view);
                seen.push(serde_json::from_str::<Value>(&text).unwrap());
            }
        };
        check(&m);
        apply(
            &mut m,
            "ahp-chat:/s.main",
            json!({"type": "chat/turnStarted", "turnId": "t1",
                   "startedAt": "2026-01-01T00:00:01.000Z",
                   "message": {"text": "  fix the \"build\"\n please ", "origin": {"kind": "user"}}}),
        );
        check(&m);
        apply(
            &mut m,
            "ahp-session:/s",
            json!({"type": "session/titleChanged", "title": "a \\ title"}),
        );
        check(&m);
        assert_eq!(seen[0]["cause"], crate::projection::NO_SETTLING_RECORD);
        assert!(seen[0].get("title").is_none(), "{}", seen[0]);
        assert!(seen[1].get("cause").is_none(), "live: {}", seen[1]);
        assert_eq!(seen[2]["title"], "fix the \"build\"\n please");
        assert_eq!(seen[4]["title"], "a \\ title");
        assert_eq!(
            seen[4]["workingDirectories"],
            json!(["file:///a", "file:///b"])
        );
        assert_eq!(seen[4]["resource"], "ahp-session:/s");
        assert_eq!(seen[4]["defaultChat"], "ahp-chat:/s.main");
        // The names rows already stored and every client read.
        let mut keys: Vec<&str> = seen[4]
            .as_object()
            .unwrap()
            .keys()
            .map(String::as_str)
            .collect();
        keys.sort_unstable();
        assert_eq!(
            keys,
            [
                "cause",
                "createdAt",
                "defaultChat",
                "id",
                "lastSeq",
                "project",
                "projection",
                "provider",
                "resource",
                "resumable",
                "state",
                "status",
                "title",
                "turns",
                "updatedAt",
                "workingDirectories",
            ]
        );
    }
}
