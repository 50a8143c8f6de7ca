//! The ACP bridge: Tether as the ACP client of a session's agent process.
//!
//! One [`AgentProcess`] per session with a running agent. It spawns the
//! configured command with piped stdio, speaks ACP over it with the
//! `agent-client-protocol` SDK (client side, protocol v1), and turns what
//! the agent says into [`AgentEvent`]s for the session's actor, in the
//! order the agent said it. The actor commits them as host-originated
//! actions, so they are recorded before anyone sees them. What the actor
//! asks of the agent ([`AgentProcess::prompt`], `cancel`, `resume`) goes
//! the other way through a queue.
//!
//! Bounds: `initialize` and session setup each get [`AcpLimits::init_timeout`];
//! a stdout line is bounded and must be a JSON-RPC object (`lines`); a turn
//! may carry at most [`AcpLimits::max_updates_per_turn`] updates. Breaking
//! one stops the process with a reason the session records. The child is
//! killed when its handle is dropped, so no agent outlives its session or
//! the host, whether or not it honours stdin EOF.

mod bridge;
pub mod config;
pub mod edits;
pub mod elicit;
mod events;
mod lines;
pub mod map;

use std::path::PathBuf;
use std::time::Duration;

use serde_json::Value;
use tokio::sync::{mpsc, oneshot};

pub use bridge::{probe, spawn};
pub use events::AgentEvents;

use crate::agents::sandbox::Sandbox;

/// Asks every configured ACP agent what it can do (concurrently, each
/// bounded by the init timeout). One that does not answer is still offered,
/// with no optional capabilities, and the reason is logged: its sessions'
/// turns fail with that reason until it is fixed.
pub async fn probe_all(
    specs: &[crate::agents::AgentSpec],
    limits: &AcpLimits,
    sandbox: &Sandbox,
) -> Vec<crate::agents::AgentSpec> {
    let asks = specs.iter().map(|spec| async move {
        let Some(command) = spec.acp_command() else {
            return spec.clone();
        };
        match probe(command, limits, sandbox).await {
            Ok(capabilities) => {
                tracing::info!(agent = %spec.provider, capabilities = %capabilities.summary(), "ACP agent answered initialize");
                spec.clone().with_capabilities(capabilities)
            }
            Err(reason) => {
                tracing::error!(agent = %spec.provider, command = %command.display(), %reason, "ACP agent did not answer initialize; its turns will fail until it does");
                spec.clone()
            }
        }
    });
    futures_util::future::join_all(asks).await
}

/// What an ACP agent reported at `initialize`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AcpCapabilities {
    /// `agentCapabilities.loadSession`.
    pub load_session: bool,
    /// `agentCapabilities.sessionCapabilities.resume`.
    pub resume: bool,
    /// `sessionCapabilities.additionalDirectories`: sessions can have more
    /// working directories than `cwd`.
    pub additional_directories: bool,
    /// `promptCapabilities.image`.
    pub image: bool,
    /// `promptCapabilities.audio`.
    pub audio: bool,
    /// `promptCapabilities.embeddedContext`.
    pub embedded_context: bool,
    /// `mcpCapabilities.http`: it can reach Tether's per-session MCP
    /// server (the session's client tools).
    pub mcp_http: bool,
    /// `agentInfo.title` (or name), when it sent one.
    pub title: Option<String>,
    /// `sessionCapabilities.close`: it takes `session/close`.
    pub close: bool,
    /// `sessionCapabilities.fork`: it takes `session/fork` (AHP
    /// `createChat` with a fork source).
    pub fork: bool,
    /// How it says users log in (`authMethods`, as ACP sends them).
    pub auth_methods: Vec<Value>,
    /// Its configuration as a session of its opened at the probe:
    /// the AHP `{schema, values}`, when it offers any.
    pub config: Option<Value>,
    /// Each configuration property's ACP category.
    pub categories: Option<Value>,
    /// The models it offers (its `model` option's values), as AHP
    /// `SessionModelInfo`s.
    pub models: Vec<Value>,
    /// Why it could not open a session at the probe (often: it needs a
    /// login), in its own words.
    pub session_error: Option<String>,
}

impl AcpCapabilities {
    /// Takes in what a session of the agent showed of its settings.
    pub fn learn_config(&mut self, config: &config::AgentConfig, provider: &str) {
        if config.is_empty() {
            return;
        }
        self.config = Some(config.to_ahp());
        self.categories = Some(config.categories());
        self.models = config.models(provider);
    }

    /// A short list for people: "loadSession, resume, …" or "no extras".
    pub fn summary(&self) -> String {
        let flags = [
            (self.load_session, "loadSession"),
            (self.resume, "resume"),
            (self.additional_directories, "additional directories"),
            (self.image, "images"),
            (self.audio, "audio"),
            (self.embedded_context, "embedded context"),
            (self.mcp_http, "MCP over HTTP"),
            (self.fork, "fork"),
        ];
        let on: Vec<&str> = flags
            .iter()
            .filter(|(on, _)| *on)
            .map(|(_, n)| *n)
            .collect();
        if on.is_empty() {
            "no optional capabilities".to_owned()
        } else {
            on.join(", ")
        }
    }

    /// As JSON, for `GET /v1/agents` and `tether agents`.
    pub fn to_json(&self) -> Value {
        let mut json = serde_json::json!({
            "loadSession": self.load_session,
            "resume": self.resume,
            "close": self.close,
            "fork": self.fork,
            "additionalDirectories": self.additional_directories,
            "promptCapabilities": {"image": self.image, "audio": self.audio, "embeddedContext": self.embedded_context},
            "mcpCapabilities": {"http": self.mcp_http},
            "authMethods": self.auth_methods,
            "models": self.models,
        });
        if let Some(config) = &self.config {
            json["config"] = config.clone();
        }
        if let Some(categories) = &self.categories {
            json["configCategories"] = categories.clone();
        }
        if let Some(error) = &self.session_error {
            json["sessionError"] = Value::String(error.clone());
        }
        json
    }
}

/// Working limits of agent processes.
#[derive(Debug, Clone)]
pub struct AcpLimits {
    /// Longest `initialize` and session setup may take.
    pub init_timeout: Duration,
    /// Longest line an agent may write to stdout.
    pub max_line_bytes: usize,
    /// Most `session/update`s in one turn.
    pub max_updates_per_turn: u64,
    /// How long a stopped agent gets to exit before it is killed.
    pub stop_grace: Duration,
    /// The bounds of the terminals it (and clients) open.
    pub terminals: crate::agents::terminals::TerminalLimits,
}

impl Default for AcpLimits {
    fn default() -> Self {
        Self {
            init_timeout: Duration::from_secs(30),
            max_line_bytes: 8 * 1024 * 1024,
            max_updates_per_turn: 100_000,
            stop_grace: Duration::from_secs(2),
            terminals: crate::agents::terminals::TerminalLimits::default(),
        }
    }
}

/// How the agent should open the session.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OpenMode {
    /// `session/new`.
    New,
    /// Reopen the agent's own session `acpSessionRef`: `session/resume`
    /// when the agent can, else `session/load` (its replay is not recorded).
    Reopen(String),
}

/// What a process needs to open its session.
#[derive(Debug, Clone)]
pub struct OpenRequest {
    /// The Tether session's channel URI (commands and titles go there).
    pub session_uri: String,
    /// The session's id (names the agent's scratch directory).
    pub session_id: String,
    /// The working directories, resolved and checked against the allowed
    /// roots, primary first; empty: the agent runs in its scratch
    /// directory. The others are sent only when the agent supports them.
    pub dirs: Vec<PathBuf>,
    /// New or reopened.
    pub mode: OpenMode,
    /// The session's MCP endpoint `(url, bearer token)`, passed in
    /// `mcpServers`: over HTTP when the agent takes it, else as the stdio
    /// bridge (`tether mcp-stdio`).
    pub mcp: Option<(String, String)>,
    /// The session's configuration `{schema, values}` as recorded: the
    /// agent is moved to these values once it has opened the session, and
    /// whatever it reports that differs is recorded.
    pub config: Option<Value>,
    /// The agent's session of each chat other than the default one, as
    /// recorded (reopened when the chat next has a turn).
    pub chats: std::collections::BTreeMap<String, String>,
}

/// How a client answered a permission request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PermissionAnswer {
    /// The option the client chose (or the first of the kind it approved or denied).
    Selected(String),
    /// The turn was cancelled or the request cannot be answered.
    Cancelled,
}

/// How a client completed a question.
#[derive(Debug, Clone, PartialEq)]
pub struct InputAnswer {
    /// `accept`, `decline` or `cancel`.
    pub response: String,
    /// The answers by question id (AHP `ChatInputAnswer`s), when accepted.
    pub answers: Value,
}

impl InputAnswer {
    /// The answer when nobody can answer any more (a cancelled turn, a
    /// timeout).
    pub fn cancelled() -> Self {
        Self {
            response: "cancel".to_owned(),
            answers: Value::Null,
        }
    }
}

/// What the agent said, for the session's actor, in order.
#[derive(Debug)]
pub enum AgentEvent {
    /// The agent opened the session (record `x-tether/agentOpened`).
    Opened {
        /// The agent's own session id.
        acp_session_ref: String,
        /// Whether the agent can reopen it later.
        load_session: bool,
        /// Whether it was reopened rather than new.
        resumed: bool,
    },
    /// The agent opened a chat's own session, new or reopened, when the
    /// chat first had a turn in this process (record `x-tether/agentOpened`
    /// with the chat).
    ChatOpened {
        /// The chat.
        chat: String,
        /// The agent's session for it.
        acp_session_ref: String,
        /// Whether it was reopened rather than new.
        resumed: bool,
    },
    /// Actions to commit, host-originated: `(channel, action)`.
    Actions(Vec<(String, Value)>),
    /// A permission request: commit `actions` (the tool call put in pending
    /// confirmation), then answer on `answer` when a client confirms.
    Permission {
        /// The chat, the turn and the tool call.
        chat: String,
        /// The AHP turn.
        turn_id: String,
        /// The tool call awaiting confirmation.
        tool_call_id: String,
        /// The option ids offered, with whether each approves.
        options: Vec<(String, bool)>,
        /// What to commit first.
        actions: Vec<(String, Value)>,
        /// Where the answer goes.
        answer: oneshot::Sender<PermissionAnswer>,
    },
    /// A question (ACP elicitation): commit `actions` (the chat input
    /// request and the session's input-needed entry), then answer on
    /// `answer` when a client completes it.
    Input {
        /// The chat of the turn it belongs to.
        chat: String,
        /// The AHP turn.
        turn_id: String,
        /// The AHP input request's id.
        request_id: String,
        /// What to commit first.
        actions: Vec<(String, Value)>,
        /// Where the answer goes.
        answer: oneshot::Sender<InputAnswer>,
    },
    /// The agent says a URL question is done (`elicitation/complete`: the
    /// person finished at the URL): it is completed, accepted, if it still
    /// waits.
    InputDone {
        /// The chat of the turn it belongs to.
        chat: String,
        /// The AHP input request's id.
        request_id: String,
    },
    /// The process is gone (exited, killed, or stopped for breaking a
    /// limit); the actor fails its open turns and settles the session.
    Exited {
        /// Why, for logs and the session's record.
        reason: String,
    },
}

/// Host-originated actions recording what an agent changed of its own
/// accord or with a client's values, as `(channel, action)`.
pub type Moved = Vec<(String, Value)>;

/// An agent's refusal of configuration values, with what it had already
/// moved to before it refused (values are applied one at a time): that is
/// recorded all the same, so clients never see settings the agent left.
#[derive(Debug)]
pub struct ConfigRefused {
    /// Why, in the agent's words.
    pub reason: String,
    /// What moved before the refusal.
    pub moved: Moved,
    /// Whether it is no answer rather than a refusal (the process stopped,
    /// or did not answer in time): not the dispatch's outcome for good, a
    /// retry may pass.
    pub transient: bool,
}

/// What the actor asks of the agent.
#[derive(Debug)]
pub(crate) enum ToAgent {
    Prompt {
        chat: String,
        turn_id: String,
        text: String,
        /// The model the turn's message asks for (`message.model.id`).
        model: Option<String>,
        /// The message's attachments (stored ones by reference).
        attachments: Vec<Value>,
    },
    Configure {
        values: serde_json::Map<String, Value>,
        reply: oneshot::Sender<Result<Moved, ConfigRefused>>,
    },
    Close {
        reply: oneshot::Sender<()>,
    },
    Fork {
        source: String,
        chat: String,
        reply: oneshot::Sender<Result<String, String>>,
    },
    SetTitle {
        title: String,
    },
    Cancel {
        turn_id: String,
    },
    Resume {
        cwd: PathBuf,
        additional: Vec<PathBuf>,
        reply: oneshot::Sender<Result<(), String>>,
    },
}

/// A running agent process of one session. Dropping it kills the process.
#[derive(Debug)]
pub struct AgentProcess {
    commands: mpsc::UnboundedSender<ToAgent>,
    /// What the agent says, in order.
    pub events: AgentEvents,
    /// Dropping this stops the bridge (and kills the child).
    _stop: oneshot::Sender<()>,
    /// Its process group (the child's pid), killed when this is dropped.
    group: Option<u32>,
}

impl Drop for AgentProcess {
    /// Kills the whole process group at once: an agent that ignores stdin
    /// EOF, or a wrapper's grandchild (`npx`), goes too. The bridge reaps
    /// the child.
    fn drop(&mut self) {
        crate::agents::sandbox::signal_group(self.group, rustix::process::Signal::KILL);
    }
}

impl AgentProcess {
    /// Sends the turn's message as one `session/prompt` (queued while an
    /// earlier prompt runs): its text and its attachments as content
    /// blocks, first moving the agent to the model the message asks for.
    pub fn prompt(&self, chat: &str, turn_id: &str, message: &Value) -> bool {
        self.commands
            .send(ToAgent::Prompt {
                chat: chat.to_owned(),
                turn_id: turn_id.to_owned(),
                text: message["text"].as_str().unwrap_or_default().to_owned(),
                model: message
                    .pointer("/model/id")
                    .and_then(Value::as_str)
                    .map(str::to_owned),
                attachments: message["attachments"]
                    .as_array()
                    .cloned()
                    .unwrap_or_default(),
            })
            .is_ok()
    }

    /// Applies configuration values (`session/set_mode`,
    /// `session/set_config_option`); the agent's refusal is the error. On
    /// success, the actions recording what else the agent changed with
    /// them (other values, or the options' shape).
    pub async fn configure(
        &self,
        values: serde_json::Map<String, Value>,
    ) -> Result<Moved, ConfigRefused> {
        let stopped = || ConfigRefused {
            reason: "the agent's process has stopped".to_owned(),
            moved: Vec::new(),
            transient: true,
        };
        let (reply, answer) = oneshot::channel();
        self.commands
            .send(ToAgent::Configure { values, reply })
            .map_err(|_| stopped())?;
        self.events
            .meanwhile(answer)
            .await
            .unwrap_or_else(|_| Err(stopped()))
    }

    /// Forks the agent's session of chat `source` (`session/fork`) for the
    /// new chat `chat`: the new session's id, or the agent's refusal.
    pub async fn fork(&self, source: &str, chat: &str) -> Result<String, String> {
        let (reply, answer) = oneshot::channel();
        self.commands
            .send(ToAgent::Fork {
                source: source.to_owned(),
                chat: chat.to_owned(),
                reply,
            })
            .map_err(|_| "the agent's process has stopped".to_owned())?;
        self.events
            .meanwhile(answer)
            .await
            .unwrap_or_else(|_| Err("the agent's process has stopped".to_owned()))
    }

    /// Tells an agent that takes `session/set_title` the session's new
    /// title (a client renamed it); an agent that does not is not told.
    pub fn set_title(&self, title: &str) {
        let _ = self.commands.send(ToAgent::SetTitle {
            title: title.to_owned(),
        });
    }

    /// Tells an agent that takes it that its session is over
    /// (`session/close`), waiting at most its init timeout.
    pub async fn close(&self) {
        let (reply, answer) = oneshot::channel();
        if self.commands.send(ToAgent::Close { reply }).is_ok() {
            let _ = answer.await;
        }
    }

    /// Cancels the turn (`session/cancel`) if it is the one running, or
    /// drops it from the queue.
    pub fn cancel(&self, turn_id: &str) {
        let _ = self.commands.send(ToAgent::Cancel {
            turn_id: turn_id.to_owned(),
        });
    }

    /// Applies a new list of additional directories with `session/resume`
    /// (same `cwd`); the agent's refusal is the error.
    pub async fn resume(&self, cwd: PathBuf, additional: Vec<PathBuf>) -> Result<(), String> {
        let (reply, answer) = oneshot::channel();
        self.commands
            .send(ToAgent::Resume {
                cwd,
                additional,
                reply,
            })
            .map_err(|_| "the agent's process has stopped".to_owned())?;
        self.events
            .meanwhile(answer)
            .await
            .unwrap_or_else(|_| Err("the agent's process has stopped".to_owned()))
    }
}

#[async_trait::async_trait]
impl crate::effects::SessionAgent for AgentProcess {
    async fn resume(&self, cwd: PathBuf, additional: Vec<PathBuf>) -> Result<(), String> {
        AgentProcess::resume(self, cwd, additional).await
    }
}
