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

/// A field of a summary, by its AHP key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Key {
    Resource,
    Provider,
    Title,
    Status,
    Project,
    WorkingDirectories,
    CreatedAt,
    ModifiedAt,
    DefaultChat,
}

impl Key {
    /// Every field, in the order a summary lists them.
    const ALL: [Key; 9] = [
        Key::Resource,
        Key::Provider,
        Key::Title,
        Key::Status,
        Key::Project,
        Key::WorkingDirectories,
        Key::CreatedAt,
        Key::ModifiedAt,
        Key::DefaultChat,
    ];

    fn name(self) -> &'static str {
        match self {
            Key::Resource => "resource",
            Key::Provider => "provider",
            Key::Title => "title",
            Key::Status => "status",
            Key::Project => "project",
            Key::WorkingDirectories => "workingDirectories",
            Key::CreatedAt => "createdAt",
            Key::ModifiedAt => "modifiedAt",
            Key::DefaultChat => "defaultChat",
        }
    }
}

impl Fields<'_> {
    fn to_json(&self) -> Value {
        self.object_of(&Key::ALL)
    }

    /// The summary's `keys` as a JSON object.
    fn object_of(&self, keys: &[Key]) -> Value {
        Value::Object(
            keys.iter()
                .map(|key| (key.name().to_owned(), self.value_of(*key)))
                .collect(),
        )
    }

    /// One field of the summary.
    fn value_of(&self, key: Key) -> Value {
        match key {
            Key::Resource => json!(self.resource),
            Key::Provider => json!(self.provider),
            Key::Title => json!(self.title),
            Key::Status => json!(self.status),
            Key::Project => {
                json!({"uri": format!("tether-project:/{}", self.project), "displayName": self.project})
            }
            Key::WorkingDirectories => json!(self.working_directories),
            Key::CreatedAt => json!(self.created_at),
            Key::ModifiedAt => json!(self.modified_at),
            Key::DefaultChat => json!(self.default_chat),
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
    fn changed_since(&self, heard: &Heard) -> Vec<Key> {
        let mut keys = Vec::new();
        if self.title != heard.title {
            keys.push(Key::Title);
        }
        if self.status != heard.status {
            keys.push(Key::Status);
        }
        if self.project != heard.project {
            keys.push(Key::Project);
        }
        if self.working_directories != heard.working_directories.as_slice() {
            keys.push(Key::WorkingDirectories);
        }
        if self.modified_at != heard.modified_at {
            keys.push(Key::ModifiedAt);
        }
        if self.default_chat != heard.default_chat.as_deref() {
            keys.push(Key::DefaultChat);
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
            let only_time = changed == [Key::ModifiedAt];
            if only_time && !now && self.at.elapsed() < SUMMARY_COALESCE {
                self.pending = true;
                return;
            }
            hub.notify(ROOT, &model.created.project, || {
                let changes = fields.object_of(&changed);
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
