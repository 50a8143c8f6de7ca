//! Agents: the backends that run a session's model work. Built in: `echo`,
//! which answers every turn with the user's own text so a new user can run a
//! turn with no model at all. Configured ones are ACP agents (`acp`): a
//! command Tether spawns and drives as the ACP client.

pub mod acp;
pub mod config;
pub mod left_running;
pub mod mcp_stdio;
pub mod sandbox;
pub mod terminals;

use serde_json::{Value, json};

pub use acp::AcpCapabilities;
pub use config::AgentCommand;

/// What runs an agent's turns.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AgentKind {
    /// Built in: answers inside the host.
    Builtin,
    /// An ACP agent process, with what it reported at `initialize`
    /// (`None` until it has been asked, or when it did not answer).
    Acp(Box<AgentCommand>, Option<Box<AcpCapabilities>>),
}

/// How an agent treats working directories (AHP `multipleWorkingDirectories`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct WorkdirCapability {
    /// The agent works in several directories; without it a session has at
    /// most one and the working-directory actions are refused.
    pub multiple: bool,
    /// Index 0 can never be removed, reordered or replaced.
    pub immutable_primary: bool,
    /// Index 0 may change, but only through `session/workingDirectoryReplaced`.
    pub primary_replacement: bool,
}

/// One registered agent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AgentSpec {
    /// The provider name sessions are created with.
    pub provider: String,
    /// Shown to people.
    pub display_name: String,
    /// What it is.
    pub description: String,
    /// Working-directory capability.
    pub workdirs: WorkdirCapability,
    /// Whether it can load (resume) a session it opened before.
    pub load_session: bool,
    /// Whether it answers turns. The echo agent does; a silent variant
    /// leaves turns open (tests of the boot sweep).
    pub answers_turns: bool,
    /// Built in, or an ACP process.
    pub kind: AgentKind,
}

impl AgentSpec {
    /// The built-in echo agent: several directories, replaceable primary,
    /// sessions it can load again.
    pub fn echo() -> Self {
        Self {
            provider: "echo".to_owned(),
            display_name: "Echo".to_owned(),
            description: "Answers every turn with your own words; needs no model.".to_owned(),
            workdirs: WorkdirCapability {
                multiple: true,
                immutable_primary: false,
                primary_replacement: true,
            },
            load_session: true,
            answers_turns: true,
            kind: AgentKind::Builtin,
        }
    }

    /// A configured ACP agent, before it has been asked what it can do:
    /// one working directory, no loading.
    pub fn acp(command: AgentCommand) -> Self {
        // Neither its command line nor its environment is shown: they are
        // the operator's (and may hold keys).
        Self {
            provider: command.name.clone(),
            display_name: command
                .title
                .clone()
                .unwrap_or_else(|| command.name.clone()),
            description: "ACP agent".to_owned(),
            workdirs: WorkdirCapability::default(),
            load_session: false,
            answers_turns: true,
            kind: AgentKind::Acp(Box::new(command), None),
        }
    }

    /// The ACP agent with what it reported at `initialize`.
    pub fn with_capabilities(mut self, capabilities: AcpCapabilities) -> Self {
        if let AgentKind::Acp(command, _) = &self.kind {
            self.workdirs = WorkdirCapability {
                multiple: capabilities.additional_directories,
                immutable_primary: true,
                primary_replacement: false,
            };
            self.load_session = capabilities.load_session || capabilities.resume;
            self.description = format!("ACP agent ({})", capabilities.summary());
            if let (None, Some(title)) = (&command.title, &capabilities.title) {
                self.display_name = title.clone();
            }
            self.kind = AgentKind::Acp(command.clone(), Some(Box::new(capabilities)));
        }
        self
    }

    /// The command when this is an ACP agent.
    pub fn acp_command(&self) -> Option<&AgentCommand> {
        match &self.kind {
            AgentKind::Acp(command, _) => Some(command),
            AgentKind::Builtin => None,
        }
    }

    /// What the ACP agent reported at `initialize`, if it did.
    pub fn acp_capabilities(&self) -> Option<&AcpCapabilities> {
        match &self.kind {
            AgentKind::Acp(_, capabilities) => capabilities.as_deref(),
            AgentKind::Builtin => None,
        }
    }

    /// An echo agent with other working-directory capabilities (tests and
    /// demos of the primary-directory rules).
    pub fn echo_variant(provider: &str, workdirs: WorkdirCapability) -> Self {
        Self {
            provider: provider.to_owned(),
            workdirs,
            ..Self::echo()
        }
    }

    /// An agent that opens on a turn and never answers it, and cannot load
    /// sessions (tests and demos of open turns).
    pub fn silent(provider: &str) -> Self {
        Self {
            provider: provider.to_owned(),
            description: "Never answers (for tests and demos of open turns).".to_owned(),
            answers_turns: false,
            load_session: false,
            ..Self::echo()
        }
    }

    /// The agent's configuration `{schema, values}` as last learned (an ACP
    /// agent's probe session), for new sessions and `resolveSessionConfig`.
    pub fn config_template(&self) -> Option<Value> {
        self.acp_capabilities().and_then(|c| c.config.clone())
    }

    /// Each configuration property's ACP category.
    pub fn config_categories(&self) -> Option<Value> {
        self.acp_capabilities().and_then(|c| c.categories.clone())
    }

    /// Whether a chat of its sessions can be forked: the built-in agents
    /// keep no conversation of their own; an ACP agent needs `session/fork`.
    pub fn forks(&self) -> bool {
        match &self.kind {
            AgentKind::Builtin => true,
            AgentKind::Acp(_, capabilities) => capabilities.as_ref().is_some_and(|c| c.fork),
        }
    }

    /// The AHP `AgentInfo` advertised in the root state.
    pub fn agent_info(&self) -> Value {
        let mut capabilities = json!({});
        if self.workdirs.multiple {
            let mut multiple = json!({});
            if self.workdirs.immutable_primary {
                multiple["immutablePrimary"] = json!(true);
            }
            if self.workdirs.primary_replacement {
                multiple["primaryReplacement"] = json!(true);
            }
            capabilities["multipleWorkingDirectories"] = multiple;
        }
        // Every session takes more chats; a fork copies the source chat's
        // turns, and an ACP agent's conversation with them
        // (`session/fork`), so it is offered where the agent has one.
        capabilities["multipleChats"] = json!({});
        if self.forks() {
            capabilities["multipleChats"]["fork"] = json!(true);
        }
        json!({
            "provider": self.provider,
            "displayName": self.display_name,
            "description": self.description,
            "models": self.acp_capabilities().map(|c| c.models.clone()).unwrap_or_default(),
            "capabilities": capabilities,
        })
    }

    /// The `session/metaChanged` with which the built-in agent advertises
    /// its commands when it opens a session (merged into the session's
    /// `_meta` by the host; AHP `completions` answers from it).
    pub fn commands_advertisement(&self) -> Value {
        json!({
            "type": "session/metaChanged",
            "_meta": {tether_protocol::actions::COMMANDS_META: [
                {"name": "echo", "description": "Repeat the message back.", "inputHint": "text to repeat"},
                {"name": "tool", "description": "Call a client's tool.", "inputHint": "NAME {json arguments}"},
            ]},
        })
    }

    /// The host-originated actions that answer an accepted
    /// `chat/turnStarted` on `chat`: the user's text echoed back as a
    /// markdown response part, then the turn's completion.
    pub fn answer_turn(&self, turn_started: &Value) -> Vec<Value> {
        let turn_id = turn_started
            .get("turnId")
            .and_then(Value::as_str)
            .unwrap_or_default();
        let text = turn_started
            .pointer("/message/text")
            .and_then(Value::as_str)
            .unwrap_or_default();
        vec![
            json!({
                "type": "chat/responsePart",
                "turnId": turn_id,
                "part": {"kind": "markdown", "id": format!("{turn_id}.echo"), "content": text},
            }),
            json!({"type": "chat/turnComplete", "turnId": turn_id, "duration": 0}),
        ]
    }
}

/// The agents a host offers.
#[derive(Debug, Clone)]
pub struct Agents {
    list: Vec<AgentSpec>,
}

impl Agents {
    /// A registry of `list`; the echo agent is always added.
    pub fn new(mut list: Vec<AgentSpec>) -> Self {
        if !list.iter().any(|a| a.provider == "echo") {
            list.insert(0, AgentSpec::echo());
        }
        Self { list }
    }

    /// The agent for a provider name.
    pub fn get(&self, provider: &str) -> Option<&AgentSpec> {
        self.list.iter().find(|a| a.provider == provider)
    }

    /// Every agent, `echo` first.
    pub fn list(&self) -> &[AgentSpec] {
        &self.list
    }

    /// The root state's `agents` list.
    pub fn infos(&self) -> Vec<Value> {
        self.list.iter().map(AgentSpec::agent_info).collect()
    }

    /// Provider names, for error messages.
    pub fn providers(&self) -> Vec<&str> {
        self.list.iter().map(|a| a.provider.as_str()).collect()
    }
}

impl Default for Agents {
    fn default() -> Self {
        Self::new(Vec::new())
    }
}
