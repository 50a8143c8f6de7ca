//! Session summaries (AHP `SessionSummary`) and their live changes
//! (`root/sessionSummaryChanged`, only the changed mutable fields).

use std::time::{Duration, Instant};

use serde_json::{Value, json};
use tether_protocol::channel::ROOT;
use tether_protocol::model::SessionModel;
use tether_protocol::view::SessionView;

use super::fanout::Hub;

/// How often a session's summary changes of `modifiedAt` alone (every
/// streamed chunk of a turn bumps it) reach root subscribers: at most once
/// per this window, the last one trailing. Every other change goes at once.
pub(super) const SUMMARY_COALESCE: Duration = Duration::from_secs(1);

/// The fields of a summary, wherever they are read from.
struct Fields<'a> {
    resource: &'a str,
    provider: &'a str,
    title: &'a str,
    status: u32,
    project: &'a str,
    working_directories: &'a [String],
    created_at: &'a str,
    modified_at: &'a str,
    default_chat: Option<&'a str>,
}

impl Fields<'_> {
    fn to_json(&self) -> Value {
        let keys = [
            "resource",
            "provider",
            "title",
            "status",
            "project",
            "workingDirectories",
            "createdAt",
            "modifiedAt",
            "defaultChat",
        ];
        Value::Object(
            keys.into_iter()
                .map(|key| (key.to_owned(), self.value_of(key)))
                .collect(),
        )
    }

    /// One field of the summary, by its key.
    fn value_of(&self, key: &str) -> Value {
        match key {
            "resource" => json!(self.resource),
            "provider" => json!(self.provider),
            "title" => json!(self.title),
            "status" => json!(self.status),
            "project" => {
                json!({"uri": format!("tether-project:/{}", self.project), "displayName": self.project})
            }
            "workingDirectories" => json!(self.working_directories),
            "createdAt" => json!(self.created_at),
            "modifiedAt" => json!(self.modified_at),
            "defaultChat" => json!(self.default_chat),
            _ => Value::Null,
        }
    }
}

/// The AHP `SessionSummary` of a view (a read-model row's).
pub fn summary(view: &SessionView) -> Value {
    Fields {
        resource: &view.resource,
        provider: &view.provider,
        title: view.title.as_deref().unwrap_or_default(),
        status: view.status,
        project: &view.project,
        working_directories: &view.working_directories,
        created_at: &view.created_at,
        modified_at: &view.updated_at,
        default_chat: view.default_chat.as_deref(),
    }
    .to_json()
}

/// The summary fields of a live model, read from it directly (the actor
/// looks at them after every batch, and a whole view would copy the
/// projection), handed to `f`.
fn with_fields_of<R>(model: &SessionModel, modified_at: &str, f: impl FnOnce(&Fields) -> R) -> R {
    let title = model.projection.title();
    f(&Fields {
        resource: &model.uri(),
        provider: &model.session.provider,
        title: title.as_deref().unwrap_or_default(),
        status: model.summary_status(),
        project: &model.created.project,
        working_directories: model
            .session
            .working_directories
            .as_deref()
            .unwrap_or_default(),
        created_at: &model.created.created_at,
        modified_at,
        default_chat: model.session.default_chat.as_deref(),
    })
}

/// The summary fields that can change (those `root/sessionSummaryChanged`
/// carries), as root subscribers last heard them. Kept as plain values,
/// not as the summary's JSON: every session in memory holds one.
#[derive(Debug, Clone, PartialEq)]
struct Heard {
    title: String,
    status: u32,
    project: String,
    working_directories: Vec<String>,
    modified_at: String,
    default_chat: Option<String>,
}

impl Fields<'_> {
    fn heard(&self) -> Heard {
        Heard {
            title: self.title.to_owned(),
            status: self.status,
            project: self.project.to_owned(),
            working_directories: self.working_directories.to_vec(),
            modified_at: self.modified_at.to_owned(),
            default_chat: self.default_chat.map(str::to_owned),
        }
    }

    /// The summary's keys whose values differ from what was heard.
    fn changed_since(&self, heard: &Heard) -> Vec<&'static str> {
        let mut keys = Vec::new();
        if self.title != heard.title {
            keys.push("title");
        }
        if self.status != heard.status {
            keys.push("status");
        }
        if self.project != heard.project {
            keys.push("project");
        }
        if self.working_directories != heard.working_directories.as_slice() {
            keys.push("workingDirectories");
        }
        if self.modified_at != heard.modified_at {
            keys.push("modifiedAt");
        }
        if self.default_chat != heard.default_chat.as_deref() {
            keys.push("defaultChat");
        }
        keys
    }
}

/// What root subscribers last heard of one session's summary.
#[derive(Debug)]
pub(super) struct Announcer {
    /// The summary they last heard of (`listSessions`, `root/sessionAdded`,
    /// then each `root/sessionSummaryChanged`); `None` before the baseline.
    announced: Option<Heard>,
    /// When the last change went out.
    at: Instant,
    /// A change of `modifiedAt` alone is waiting for the coalescing window.
    pub(super) pending: bool,
}

impl Announcer {
    pub(super) fn new() -> Self {
        Self {
            announced: None,
            at: Instant::now(),
            pending: false,
        }
    }

    /// Tells root subscribers which summary fields of `model` changed since
    /// they last heard. A change of `modifiedAt` alone waits for the
    /// coalescing window unless `now` says it is due. The first call sets
    /// the baseline. The change is compared field by field and only its
    /// fields are rendered, and only when a root subscriber is here to
    /// hear it: every actor batch comes through here.
    pub(super) fn announce(&mut self, hub: &Hub, model: &SessionModel, now: bool) {
        let modified_at = super::rfc3339(crate::store::now_ms());
        with_fields_of(model, &modified_at, |fields| {
            let Some(before) = &self.announced else {
                self.announced = Some(fields.heard());
                return;
            };
            let changed = fields.changed_since(before);
            if changed.is_empty() {
                self.pending = false;
                return;
            }
            let only_time = changed == ["modifiedAt"];
            if only_time && !now && self.at.elapsed() < SUMMARY_COALESCE {
                self.pending = true;
                return;
            }
            hub.notify(ROOT, &model.created.project, || {
                let changes: serde_json::Map<String, Value> = changed
                    .iter()
                    .map(|key| ((*key).to_owned(), fields.value_of(key)))
                    .collect();
                super::notification(
                    "root/sessionSummaryChanged",
                    json!({"channel": ROOT, "session": model.uri(), "changes": changes}),
                )
            });
            self.announced = Some(fields.heard());
            self.at = Instant::now();
            self.pending = false;
        });
    }
}
