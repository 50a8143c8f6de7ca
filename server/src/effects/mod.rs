//! Side-effect backends: the work an action needs before it may be
//! committed and broadcast. A backend may refuse; a refusal is a rejection
//! with the backend's reason. Every call is bounded in time by the engine.
//!
//! Side effects must be idempotent: a retried dispatch (same origin) may run
//! its side effect again before the store recognises the retry.

pub mod files;
mod roots;

use std::path::PathBuf;
use std::time::Duration;

use async_trait::async_trait;
use serde_json::{Value, json};
use tether_protocol::actions::action_type;

pub use roots::Roots;

/// A session's running agent, as a side-effect backend reaches it (an ACP
/// agent's process; the `agent` backend asks it to apply working-directory
/// changes).
#[async_trait]
pub trait SessionAgent: Send + Sync {
    /// Moves the agent's session to `cwd` and exactly `additional` other
    /// directories (ACP `session/resume`); why it refused.
    async fn resume(&self, cwd: PathBuf, additional: Vec<PathBuf>) -> Result<(), String>;
}

/// What a side effect is asked to apply.
pub struct EffectRequest<'a> {
    /// The channel the action is aimed at.
    pub channel: &'a str,
    /// The action (working-directory URIs already canonical).
    pub action: &'a Value,
    /// The session's state before the action (serialised only by backends
    /// that send it, not on every dispatch).
    pub state: &'a ahp_types::state::SessionState,
    /// `(clientId, clientSeq)` of the dispatch, if client-originated.
    pub origin: Option<(&'a str, u64)>,
    /// The session's state as the action would leave it.
    pub after: Option<&'a ahp_types::state::SessionState>,
    /// The session's running agent, if one runs.
    pub agent: Option<&'a dyn SessionAgent>,
}

impl std::fmt::Debug for EffectRequest<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EffectRequest")
            .field("channel", &self.channel)
            .field("action", &self.action)
            .field("origin", &self.origin)
            .field("agent", &self.agent.is_some())
            .finish_non_exhaustive()
    }
}

/// Why a side effect did not happen.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EffectError {
    /// The backend refused the action; retrying the same action will not help.
    #[error("{0}")]
    Refused(String),
    /// The backend could not be asked (timeout, error status, garbage);
    /// the same action may succeed later, so the refusal is not recorded.
    #[error("{0}")]
    Unavailable(String),
}

impl From<String> for EffectError {
    fn from(reason: String) -> Self {
        EffectError::Refused(reason)
    }
}

/// A side-effect backend.
#[async_trait]
pub trait Effects: Send + Sync + std::fmt::Debug {
    /// Its name in `/metrics` (`local`, `webhook`, `agent`).
    fn backend(&self) -> &'static str;

    /// Applies the action's side effect, or says why it cannot.
    async fn apply(&self, request: &EffectRequest<'_>) -> Result<(), EffectError>;

    /// Whether an action of type `kind` has a side effect here at all:
    /// when not, the dispatch does not call [`Effects::apply`] (nor time
    /// it) and the action is accepted as if it had answered `Ok`.
    fn concerns(&self, _kind: &str) -> bool {
        true
    }

    /// Checks the working directories of a session about to be created.
    async fn check_directories(&self, directories: &[String]) -> Result<(), EffectError>;
}

/// The member naming the directory an action of type `kind` adds, if it
/// adds one.
fn added_directory_field(kind: &str) -> Option<&'static str> {
    match kind {
        "session/workingDirectorySet" | "chat/workingDirectorySet" => Some("directory"),
        "session/workingDirectoryReplaced" => Some("replacement"),
        _ => None,
    }
}

/// The directories an action would add.
pub fn added_directories(action: &Value) -> Vec<&str> {
    let Some(field) = action_type(action).and_then(added_directory_field) else {
        return Vec::new();
    };
    action
        .get(field)
        .and_then(Value::as_str)
        .into_iter()
        .collect()
}

/// `local`: a working directory must exist on this host and be a
/// directory (after symlinks are resolved). The allowed roots are checked
/// by the engine for every backend ([`Roots`]).
#[derive(Debug, Clone, Default)]
pub struct LocalEffects;

impl LocalEffects {
    async fn check(&self, uri: &str) -> Result<(), String> {
        // Resolved off the async threads: it touches the disk.
        let uri = uri.to_owned();
        tokio::task::spawn_blocking(move || Roots::default().resolve_uri("", &uri).map(|_| ()))
            .await
            .unwrap_or_else(|_| Err("The working directory could not be checked.".to_owned()))
    }
}

#[async_trait]
impl Effects for LocalEffects {
    fn backend(&self) -> &'static str {
        "local"
    }

    async fn apply(&self, request: &EffectRequest<'_>) -> Result<(), EffectError> {
        for directory in added_directories(request.action) {
            self.check(directory).await?;
        }
        Ok(())
    }

    fn concerns(&self, kind: &str) -> bool {
        added_directory_field(kind).is_some()
    }

    async fn check_directories(&self, directories: &[String]) -> Result<(), EffectError> {
        for directory in directories {
            self.check(directory).await?;
        }
        Ok(())
    }
}

/// `webhook`: POST the proposed envelope and the session state to a URL;
/// `2xx {"accept": true}` accepts, `{"accept": false, "reason": ...}` refuses,
/// anything else (timeout, 5xx, garbage) refuses as "backend unavailable".
/// No retries inside one dispatch.
#[derive(Debug, Clone)]
pub struct WebhookEffects {
    url: String,
    http: reqwest::Client,
}

impl WebhookEffects {
    /// A backend posting to `url`, each call bounded by `timeout`.
    pub fn new(url: &str, timeout: Duration) -> Result<Self, String> {
        let http = reqwest::Client::builder()
            .timeout(timeout)
            .build()
            .map_err(|e| format!("cannot build the webhook client: {e}"))?;
        Ok(Self {
            url: url.to_owned(),
            http,
        })
    }

    async fn ask(&self, body: Value) -> Result<(), EffectError> {
        let unavailable = |why: String| {
            tracing::warn!(url = %self.url, %why, "side-effect webhook unavailable");
            EffectError::Unavailable(
                "The side-effect backend is unavailable; try again later.".to_owned(),
            )
        };
        let response = self
            .http
            .post(&self.url)
            .json(&body)
            .send()
            .await
            .map_err(|e| unavailable(e.to_string()))?;
        let status = response.status();
        if !status.is_success() {
            return Err(unavailable(format!("status {status}")));
        }
        let answer: Value = response
            .json()
            .await
            .map_err(|e| unavailable(e.to_string()))?;
        match answer.get("accept").and_then(Value::as_bool) {
            Some(true) => Ok(()),
            Some(false) => Err(EffectError::Refused(
                answer
                    .get("reason")
                    .and_then(Value::as_str)
                    .filter(|r| !r.trim().is_empty())
                    .unwrap_or("The side-effect backend refused the action.")
                    .to_owned(),
            )),
            None => Err(unavailable("answer has no boolean \"accept\"".to_owned())),
        }
    }
}

#[async_trait]
impl Effects for WebhookEffects {
    fn backend(&self) -> &'static str {
        "webhook"
    }

    async fn apply(&self, request: &EffectRequest<'_>) -> Result<(), EffectError> {
        let origin = request
            .origin
            .map(|(client_id, client_seq)| json!({"clientId": client_id, "clientSeq": client_seq}));
        self.ask(json!({
            "envelope": {"channel": request.channel, "action": request.action, "origin": origin},
            "state": request.state,
        }))
        .await
    }

    async fn check_directories(&self, directories: &[String]) -> Result<(), EffectError> {
        self.ask(json!({"createSession": {"workingDirectories": directories}}))
            .await
    }
}

/// `agent`: the session's agent applies the side effect. An ACP agent's
/// running process is asked with `session/resume` (the same `cwd` and the
/// complete new list of directories) before a working-directory change is
/// committed; its refusal refuses the change. The built-in echo agent, or
/// an ACP agent not running now (it gets the list when it next opens the
/// session), has nothing to apply and accepts.
#[derive(Debug, Clone, Default)]
pub struct AgentEffects;

#[async_trait]
impl Effects for AgentEffects {
    fn backend(&self) -> &'static str {
        "agent"
    }

    /// Only the working directories: nothing else reaches the agent before
    /// it is committed.
    fn concerns(&self, kind: &str) -> bool {
        tether_protocol::actions::is_session_workdir_action(kind)
    }

    async fn apply(&self, request: &EffectRequest<'_>) -> Result<(), EffectError> {
        let workdirs = action_type(request.action)
            .is_some_and(tether_protocol::actions::is_session_workdir_action);
        let (true, Some(agent), Some(after)) = (workdirs, request.agent, request.after) else {
            return Ok(());
        };
        let dirs: Vec<PathBuf> = after
            .working_directories
            .iter()
            .flatten()
            .filter_map(|uri| tether_protocol::workdir::file_uri_path(uri).ok())
            .map(PathBuf::from)
            .collect();
        let cwd = dirs.first().cloned().unwrap_or_else(|| "/".into());
        let additional = dirs.into_iter().skip(1).collect();
        agent.resume(cwd, additional).await.map_err(|reason| {
            EffectError::Refused(format!(
                "The agent did not accept the working directories: {reason}."
            ))
        })
    }

    async fn check_directories(&self, _directories: &[String]) -> Result<(), EffectError> {
        Ok(())
    }
}
