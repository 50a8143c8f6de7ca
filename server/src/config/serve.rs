//! `tether serve`: its flags, and the configuration they make.

use std::fmt;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, ValueEnum};

use super::{DatabaseArgs, read_secret};
use crate::agents::AgentSpec;
use crate::agents::sandbox::{ConfinementMode, SandboxConfig};
use crate::engine::EngineConfig;
use crate::store::redact_url;
use crate::ws::WsLimits;

pub use crate::telemetry::LogFormat;

/// Flags of `tether serve`.
#[derive(Clone, Args)]
pub struct ServeArgs {
    /// Address to listen on. Only loopback addresses are accepted unless
    /// --insecure-allow-remote is given.
    #[arg(long, env = "TETHER_BIND", default_value = "127.0.0.1:7878")]
    pub bind: SocketAddr,

    /// Allow listening on a non-loopback address without authentication.
    /// Anyone who can reach the port can then read and drive every session.
    /// Not needed with an auth secret.
    #[arg(long, env = "TETHER_INSECURE_ALLOW_REMOTE", default_value_t = false)]
    pub insecure_allow_remote: bool,

    /// Web origins besides the server's own that may call it from a
    /// browser (comma-separated `scheme://host[:port]`): a separately
    /// hosted console. They get CORS; any other page's WebSocket or
    /// request is refused (403).
    #[arg(long, env = "TETHER_ALLOWED_ORIGINS", value_delimiter = ',')]
    pub allowed_origins: Vec<String>,

    /// Host names served besides IP addresses and `localhost` when
    /// authentication is off (comma-separated); a request naming another
    /// host gets 421 (it may be a page that rebound its DNS name here).
    #[arg(long, env = "TETHER_ALLOWED_HOSTS", value_delimiter = ',')]
    pub allowed_hosts: Vec<String>,

    /// The secret HS256 tokens are signed with (at least 32 bytes); setting
    /// it turns authentication on. Prefer --auth-secret-file.
    #[arg(long, env = "TETHER_AUTH_SECRET", hide_env_values = true)]
    pub auth_secret: Option<String>,

    /// A file holding the auth secret (a trailing newline is ignored), so
    /// the secret need not sit in the environment.
    #[arg(long, env = "TETHER_AUTH_SECRET_FILE", conflicts_with = "auth_secret")]
    pub auth_secret_file: Option<PathBuf>,

    /// An identity provider's public keys (a JWKS document): RS256 and
    /// ES256 tokens signed by them are accepted, chosen by `kid`. Turns
    /// authentication on, with or without a secret.
    #[arg(long, env = "TETHER_AUTH_JWKS_FILE", requires_all = ["auth_jwks_issuer", "auth_jwks_audience"])]
    pub auth_jwks_file: Option<PathBuf>,

    /// The `iss` the identity provider's tokens must carry.
    #[arg(long, env = "TETHER_AUTH_JWKS_ISSUER")]
    pub auth_jwks_issuer: Option<String>,

    /// The `aud` the identity provider's tokens for this server must carry.
    #[arg(long, env = "TETHER_AUTH_JWKS_AUDIENCE")]
    pub auth_jwks_audience: Option<String>,

    /// A separate bearer token for `/metrics` (for a scraper), besides
    /// admin tokens.
    #[arg(long, env = "TETHER_METRICS_TOKEN", hide_env_values = true)]
    pub metrics_token: Option<String>,

    /// Simultaneous WebSocket connections one principal (token `sub`) may
    /// hold; more get 429. With authentication only.
    #[arg(
        long,
        env = "TETHER_MAX_CONNECTIONS_PER_PRINCIPAL",
        default_value_t = 64
    )]
    pub max_connections_per_principal: usize,

    /// Dispatches per second one principal may sustain (a token bucket);
    /// more get 429 / a refusal saying when to retry. With authentication
    /// only.
    #[arg(long, env = "TETHER_DISPATCH_RATE", default_value_t = 1000.0)]
    pub dispatch_rate: f64,

    /// Dispatches one principal may send at once above the rate.
    #[arg(long, env = "TETHER_DISPATCH_BURST", default_value_t = 5000.0)]
    pub dispatch_burst: f64,

    /// Where the data lives.
    #[command(flatten)]
    pub database: DatabaseArgs,

    /// Threads that run connections and sessions (the async runtime's
    /// workers). Default: one per core, less one on SQLite, whose writer is
    /// a busy thread of its own under load (at least one).
    #[arg(long, env = "TETHER_WORKER_THREADS", value_parser = clap::value_parser!(u16).range(1..=1024))]
    pub worker_threads: Option<u16>,

    /// Largest accepted HTTP request body, in bytes. Larger bodies get 413.
    /// The default leaves room for a 1 MiB working context plus JSON framing.
    #[arg(long, env = "TETHER_MAX_BODY_BYTES", default_value_t = 2 * 1024 * 1024)]
    pub max_body_bytes: usize,

    /// Seconds in-flight requests get to finish after SIGINT/SIGTERM.
    #[arg(long, env = "TETHER_SHUTDOWN_GRACE_SECS", default_value_t = 10)]
    pub shutdown_grace_secs: u64,

    /// Milliseconds between `/readyz` turning not-ready at SIGTERM and the
    /// sockets closing, so load balancers stop routing here first (set it
    /// to the balancer's health-check interval).
    #[arg(long, env = "TETHER_DRAIN_DELAY_MS", default_value_t = 0)]
    pub drain_delay_ms: u64,

    /// Log format. The level is set with RUST_LOG (default `info`).
    #[arg(long, env = "TETHER_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,

    /// Side-effect backend: `local` checks working directories on this host,
    /// `webhook` asks --webhook-url, `agent` lets the session's agent decide.
    #[arg(long, env = "TETHER_EFFECTS", value_enum, default_value_t = EffectsKind::Local)]
    pub effects: EffectsKind,

    /// URL the webhook side-effect backend POSTs proposed actions to.
    #[arg(long, env = "TETHER_WEBHOOK_URL")]
    pub webhook_url: Option<String>,

    /// Longest a side effect may take, in milliseconds.
    #[arg(long, env = "TETHER_EFFECT_TIMEOUT_MS", default_value_t = 5_000)]
    pub effect_timeout_ms: u64,

    /// Several hosts on one Postgres: how long a session's lease lasts
    /// unrenewed, in milliseconds. A host that dies holds its sessions this
    /// long at most; hosts renew every third of it.
    #[arg(long, env = "TETHER_LEASE_TTL_MS", default_value_t = 10_000)]
    pub lease_ttl_ms: u64,

    /// Several hosts on one Postgres: this host's identity, kept across
    /// restarts (letters, digits, `.`, `_`, `-`; at most 64). A restarted
    /// host takes its own sessions' leases back at once instead of waiting
    /// them out; a second live process claiming the same identity is
    /// refused at start. Without it each start is a new host (a UUID).
    #[arg(long, env = "TETHER_HOST_ID")]
    pub host_id: Option<String>,

    /// An ACP agent sessions can run: `NAME=COMMAND` (repeatable). The
    /// command is split as a shell would, without a shell; leading
    /// `KEY=VALUE` words are its environment. `TETHER_AGENTS` holds entries
    /// separated by `;`.
    #[arg(
        long = "agent",
        env = "TETHER_AGENTS",
        value_delimiter = ';',
        value_name = "NAME=COMMAND"
    )]
    pub agents: Vec<String>,

    /// An agents file (TOML): agents with their commands, environment,
    /// env files and the paths their confinement lets them reach (see the
    /// README's Agents). Its agents join those of --agent.
    #[arg(long, env = "TETHER_AGENTS_FILE")]
    pub agents_file: Option<PathBuf>,

    /// Whether agent processes are confined with Landlock: `auto` (where
    /// the kernel offers it; a warning elsewhere), `require` (agents do not
    /// start without it) or `off` (an explicit, logged choice).
    #[arg(long, env = "TETHER_AGENT_CONFINEMENT", value_enum, default_value_t = ConfinementMode::Auto)]
    pub agent_confinement: ConfinementMode,

    /// Where each session's agent gets its scratch directory (its HOME and
    /// TMPDIR). Default: a folder per database under the system's
    /// temporary directory.
    #[arg(long, env = "TETHER_AGENT_SCRATCH_DIR")]
    pub agent_scratch_dir: Option<PathBuf>,

    /// Most ACP agent processes running at once; a turn beyond it fails
    /// with a clear error.
    #[arg(long, env = "TETHER_MAX_AGENTS", default_value_t = 16)]
    pub max_agents: usize,

    /// Seconds an agent process may sit with no turn before it is stopped
    /// and its session settled dormant (its next turn starts it again).
    #[arg(long, env = "TETHER_AGENT_IDLE_SECS", default_value_t = 1800)]
    pub agent_idle_secs: u64,

    /// Longest an agent may take to answer `initialize` and open a session,
    /// in milliseconds.
    #[arg(long, env = "TETHER_AGENT_INIT_TIMEOUT_MS", default_value_t = 30_000)]
    pub agent_init_timeout_ms: u64,

    /// Most `session/update`s an agent may send in one turn before it is
    /// stopped as flooding.
    #[arg(long, env = "TETHER_AGENT_MAX_UPDATES", default_value_t = 100_000)]
    pub agent_max_updates: u64,

    /// Seconds a client has to answer a call of a tool it contributed; then
    /// the call fails and the agent gets the error.
    #[arg(long, env = "TETHER_CLIENT_TOOL_TIMEOUT_SECS", default_value_t = 60)]
    pub client_tool_timeout_secs: u64,

    /// Largest message attachment, in bytes (decoded); a larger one is
    /// refused before the message is recorded.
    #[arg(long, env = "TETHER_MAX_ATTACHMENT_BYTES", default_value_t = 8 * 1024 * 1024)]
    pub max_attachment_bytes: usize,

    /// Most bytes of attachments one session may hold.
    #[arg(long, env = "TETHER_MAX_SESSION_ATTACHMENT_BYTES", default_value_t = 256 * 1024 * 1024)]
    pub max_session_attachment_bytes: u64,

    /// Seconds an agent's question (an ACP elicitation, shown as a chat
    /// input request) waits for an answer; then the agent is told it was
    /// cancelled.
    #[arg(long, env = "TETHER_INPUT_TIMEOUT_SECS", default_value_t = 600)]
    pub input_timeout_secs: u64,

    /// Seconds between two rounds of retention (deleting the settled
    /// sessions of projects that keep them a limited number of days, at
    /// most 100 a round).
    #[arg(long, env = "TETHER_RETENTION_INTERVAL_SECS", default_value_t = 3600)]
    pub retention_interval_secs: u64,

    /// Write no search documents: what is appended from now on is not
    /// found by `/v1/search` (for hosts that need no search, and to measure
    /// what indexing costs).
    #[arg(long, env = "TETHER_NO_SEARCH_INDEX")]
    pub no_search_index: bool,

    /// Milliseconds before a failed webhook delivery is tried again; each
    /// next wait doubles, up to an hour.
    #[arg(long, env = "TETHER_WEBHOOK_RETRY_BASE_MS", default_value_t = 1000)]
    pub webhook_retry_base_ms: u64,

    /// Attempts before a webhook delivery is given up (15: about nine hours
    /// with the default first wait).
    #[arg(long, env = "TETHER_WEBHOOK_MAX_ATTEMPTS", default_value_t = 15)]
    pub webhook_max_attempts: u32,

    /// Seconds one webhook delivery attempt may take.
    #[arg(long, env = "TETHER_WEBHOOK_TIMEOUT_SECS", default_value_t = 10)]
    pub webhook_timeout_secs: u64,

    /// Milliseconds between two looks for due webhook deliveries (a commit
    /// that raises events wakes this host's deliverer at once).
    #[arg(long, env = "TETHER_WEBHOOK_POLL_MS", default_value_t = 1000)]
    pub webhook_poll_ms: u64,

    /// Seconds a terminal command (an agent's `terminal/create`, or a
    /// client's `createTerminal`) may run before its processes are killed.
    #[arg(long, env = "TETHER_TERMINAL_TIMEOUT_SECS", default_value_t = 600)]
    pub terminal_timeout_secs: u64,

    /// Most bytes of a terminal's output recorded for clients (and kept
    /// for the agent); past it, output is dropped with a note.
    #[arg(long, env = "TETHER_TERMINAL_OUTPUT_BYTES", default_value_t = 1024 * 1024)]
    pub terminal_output_bytes: usize,

    /// Milliseconds a client that lost its last connection stays among a
    /// session's active clients (its tools kept, its calls waiting).
    #[arg(long, env = "TETHER_CLIENT_GRACE_MS", default_value_t = 30_000)]
    pub client_grace_ms: u64,

    /// Directories working directories must lie in (comma-separated; symlinks
    /// are resolved first). `PROJECT=PATH` keeps a root for one project:
    /// the root nearest a directory decides who may use it. Empty: no
    /// restriction.
    #[arg(long, env = "TETHER_ALLOWED_ROOTS", value_delimiter = ',')]
    pub allowed_roots: Vec<PathBuf>,

    /// Largest WebSocket message, in bytes; a larger one closes the
    /// connection with code 1009.
    #[arg(long, env = "TETHER_MAX_FRAME_BYTES", default_value_t = 1024 * 1024)]
    pub max_frame_bytes: usize,

    /// Most subscriptions per WebSocket connection.
    #[arg(long, env = "TETHER_MAX_SUBSCRIPTIONS", default_value_t = 1024)]
    pub max_subscriptions: usize,

    /// Most simultaneous WebSocket connections.
    #[arg(long, env = "TETHER_MAX_CONNECTIONS", default_value_t = 20_000)]
    pub max_connections: usize,

    /// Bytes queued for one connection before it is closed as too slow
    /// (code 4000; the client reconnects and replays).
    #[arg(long, env = "TETHER_MAX_OUTBOUND_BYTES", default_value_t = 8 * 1024 * 1024)]
    pub max_outbound_bytes: usize,

    /// Seconds between server pings.
    #[arg(long, env = "TETHER_PING_INTERVAL_SECS", default_value_t = 30)]
    pub ping_interval_secs: u64,

    /// Seconds of silence after which a connection is closed (code 4001).
    #[arg(long, env = "TETHER_PING_TIMEOUT_SECS", default_value_t = 90)]
    pub ping_timeout_secs: u64,

    /// Largest gap `reconnect` replays envelope by envelope; a larger gap
    /// gets snapshots.
    #[arg(long, env = "TETHER_MAX_REPLAY", default_value_t = 10_000)]
    pub max_replay: u32,

    /// Largest replay in bytes; a larger gap gets snapshots. Keep it below
    /// your clients' message size limit (16 MiB for the upstream Rust client).
    #[arg(long, env = "TETHER_MAX_REPLAY_BYTES", default_value_t = 8 * 1024 * 1024)]
    pub max_replay_bytes: usize,

    /// Seconds an idle session actor stays in memory.
    #[arg(long, env = "TETHER_ACTOR_IDLE_SECS", default_value_t = 300)]
    pub actor_idle_secs: u64,

    /// Envelopes between two snapshots of a session.
    #[arg(long, env = "TETHER_SNAPSHOT_EVERY", default_value_t = 256)]
    pub snapshot_every: u64,

    /// Committed envelopes one connection's inbox holds before it counts as
    /// lagging and catches up from the store instead.
    #[arg(long, env = "TETHER_INBOX_CAPACITY", default_value_t = 16_384)]
    pub inbox_capacity: usize,
}

/// Which side-effect backend runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum EffectsKind {
    /// Working directories must exist here, inside the allowed roots.
    Local,
    /// A webhook decides.
    Webhook,
    /// The session's agent decides.
    Agent,
}

impl fmt::Debug for ServeArgs {
    // Written by hand so a password in the database URL never reaches a log.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ServeArgs")
            .field("bind", &self.bind)
            .field("insecure_allow_remote", &self.insecure_allow_remote)
            .field("auth_secret", &self.auth_secret.as_ref().map(|_| "***"))
            .field("auth_secret_file", &self.auth_secret_file)
            .field("auth_jwks_file", &self.auth_jwks_file)
            .field("metrics_token", &self.metrics_token.as_ref().map(|_| "***"))
            .field("database", &self.database)
            .field("worker_threads", &self.worker_threads)
            .field("max_body_bytes", &self.max_body_bytes)
            .field("shutdown_grace_secs", &self.shutdown_grace_secs)
            .field("drain_delay_ms", &self.drain_delay_ms)
            .field("log_format", &self.log_format)
            .field("effects", &self.effects)
            .field("webhook_url", &self.webhook_url.as_deref().map(redact_url))
            .field("allowed_roots", &self.allowed_roots)
            .field("allowed_origins", &self.allowed_origins)
            .field("allowed_hosts", &self.allowed_hosts)
            .field("agents", &self.agents.len())
            .field("agents_file", &self.agents_file)
            .field("agent_confinement", &self.agent_confinement)
            .finish_non_exhaustive()
    }
}

/// Why a configuration cannot be served.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// A `--agent` / `TETHER_AGENTS` entry that cannot be used.
    #[error("--agent: {0}")]
    Agent(String),
    /// `--effects webhook` without a URL.
    #[error("--effects webhook needs --webhook-url (TETHER_WEBHOOK_URL)")]
    WebhookUrlMissing,
    /// A non-loopback bind without the explicit opt-in.
    #[error(
        "refusing to listen on {0}: it is not a loopback address and Tether has no authentication \
         configured; pass --insecure-allow-remote (TETHER_INSECURE_ALLOW_REMOTE=true) to allow it"
    )]
    RemoteBindRefused(SocketAddr),
    /// The auth secret cannot be used.
    #[error("{0}")]
    AuthSecret(String),
    /// An allowed origin or host that is not one.
    #[error(transparent)]
    Browsers(#[from] crate::http::guard::PolicyError),
}

/// The side-effect backend a server runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EffectsConfig {
    /// `local`: directories must exist here.
    Local,
    /// `webhook` at this URL.
    Webhook {
        /// Where proposed actions are POSTed.
        url: String,
    },
    /// `agent`.
    Agent,
}

/// The settings a running server uses, derived from [`ServeArgs`].
#[derive(Debug, Clone)]
pub struct ServeConfig {
    /// Largest accepted request body, in bytes.
    pub max_body_bytes: usize,
    /// How long in-flight requests may run after shutdown begins.
    pub shutdown_grace: Duration,
    /// How long the host stays up not-ready before closing its sockets.
    pub drain_delay: Duration,
    /// Engine settings.
    pub engine: EngineConfig,
    /// WebSocket limits.
    pub ws: WsLimits,
    /// Agents besides the built-in echo agent.
    pub agents: Vec<AgentSpec>,
    /// The side-effect backend.
    pub effects: EffectsConfig,
    /// Authentication (off by default) and per-principal limits.
    pub auth: crate::auth::credentials::Auth,
    /// Which web origins and host names browsers may reach the server by.
    pub browsers: crate::http::guard::BrowserPolicy,
    /// How agent processes are started.
    pub sandbox: SandboxConfig,
}

impl Default for ServeConfig {
    fn default() -> Self {
        Self {
            max_body_bytes: 2 * 1024 * 1024,
            shutdown_grace: Duration::from_secs(10),
            drain_delay: Duration::ZERO,
            engine: EngineConfig::default(),
            ws: WsLimits::default(),
            agents: Vec::new(),
            effects: EffectsConfig::Local,
            auth: crate::auth::credentials::Auth::default(),
            browsers: crate::http::guard::BrowserPolicy::default(),
            sandbox: SandboxConfig::default(),
        }
    }
}

impl ServeArgs {
    /// The async runtime's worker threads: `--worker-threads`, or one per
    /// core, less one when the store is SQLite. Its writer thread commits
    /// back to back under load; with as many workers as cores, the workers
    /// and the writer took turns on the same cores and the tasks moved
    /// between the workers with their data (on 2 cores, 13 % more CPU an
    /// action at `ingest` 100 x 16; BENCHMARKS.md, "One worker fewer on
    /// SQLite"). A Postgres host has no such thread.
    pub fn runtime_workers(&self) -> usize {
        if let Some(workers) = self.worker_threads {
            return workers.into();
        }
        let cores = std::thread::available_parallelism().map_or(1, std::num::NonZero::get);
        if crate::store::has_writer_thread(&self.database.database_url) {
            cores.saturating_sub(1).max(1)
        } else {
            cores
        }
    }

    /// Checks the bind rule: loopback, or an explicit opt-in.
    pub fn check_bind(&self) -> Result<(), ConfigError> {
        let authenticated = self.auth_secret.is_some()
            || self.auth_secret_file.is_some()
            || self.auth_jwks_file.is_some();
        if self.bind.ip().is_loopback() || self.insecure_allow_remote || authenticated {
            Ok(())
        } else {
            Err(ConfigError::RemoteBindRefused(self.bind))
        }
    }

    /// The running server's settings.
    pub fn serve_config(&self) -> Result<ServeConfig, ConfigError> {
        let agents = self.agent_specs()?;
        let protected = self.protected_files(&agents);
        let effects = match self.effects {
            EffectsKind::Local => EffectsConfig::Local,
            EffectsKind::Webhook => EffectsConfig::Webhook {
                url: self
                    .webhook_url
                    .clone()
                    .ok_or(ConfigError::WebhookUrlMissing)?,
            },
            EffectsKind::Agent => EffectsConfig::Agent,
        };
        Ok(ServeConfig {
            max_body_bytes: self.max_body_bytes,
            shutdown_grace: Duration::from_secs(self.shutdown_grace_secs),
            drain_delay: Duration::from_millis(self.drain_delay_ms),
            engine: EngineConfig {
                actor_idle: Duration::from_secs(self.actor_idle_secs.max(1)),
                snapshot_every: self.snapshot_every.max(1),
                hub_buffer: self.inbox_capacity.max(16),
                effect_timeout: Duration::from_millis(self.effect_timeout_ms.max(1)),
                lease_ttl: Duration::from_millis(self.lease_ttl_ms.max(500)),
                max_agents: self.max_agents.max(1),
                client_tool_timeout: Duration::from_secs(self.client_tool_timeout_secs.max(1)),
                client_grace: Duration::from_millis(self.client_grace_ms),
                input_timeout: Duration::from_secs(self.input_timeout_secs.max(1)),
                retention_interval: Duration::from_secs(self.retention_interval_secs.max(1)),
                search_index: !self.no_search_index,
                webhooks: crate::webhooks::WebhookConfig {
                    poll: Duration::from_millis(self.webhook_poll_ms.max(10)),
                    retry_base: Duration::from_millis(self.webhook_retry_base_ms.max(10)),
                    max_attempts: self.webhook_max_attempts.max(1),
                    timeout: Duration::from_secs(self.webhook_timeout_secs.max(1)),
                },
                attachments: crate::engine::attachments::AttachmentLimits {
                    per_attachment: self.max_attachment_bytes,
                    per_session: self.max_session_attachment_bytes,
                },
                roots: crate::effects::Roots::new(&self.allowed_roots),
                agent_idle: Duration::from_secs(self.agent_idle_secs.max(1)),
                acp: crate::agents::acp::AcpLimits {
                    init_timeout: Duration::from_millis(self.agent_init_timeout_ms.max(100)),
                    max_updates_per_turn: self.agent_max_updates.max(1),
                    terminals: crate::agents::terminals::TerminalLimits {
                        output_bytes: self.terminal_output_bytes.max(1024),
                        timeout: Duration::from_secs(self.terminal_timeout_secs.max(1)),
                    },
                    ..crate::agents::acp::AcpLimits::default()
                },
                ..EngineConfig::default()
            },
            ws: WsLimits {
                max_frame_bytes: self.max_frame_bytes,
                max_subscriptions: self.max_subscriptions,
                max_connections: self.max_connections,
                max_outbound_bytes: self.max_outbound_bytes,
                ping_interval: Duration::from_secs(self.ping_interval_secs.max(1)),
                ping_timeout: Duration::from_secs(self.ping_timeout_secs.max(1)),
                max_replay: self.max_replay,
                max_replay_bytes: self.max_replay_bytes,
            },
            agents,
            sandbox: SandboxConfig {
                mode: self.agent_confinement,
                scratch_root: self.agent_scratch_dir.clone(),
                protected,
            },
            effects,
            auth: self.auth()?,
            browsers: crate::http::guard::BrowserPolicy::new(
                &self.allowed_origins,
                &self.allowed_hosts,
            )?,
        })
    }

    /// Files no agent process may reach: the database's, the secret and
    /// key files, the agents file and every agent's env files.
    pub fn protected_files(&self, agents: &[AgentSpec]) -> Vec<PathBuf> {
        let mut files = crate::store::data_files(&self.database.database_url);
        files.extend(self.auth_secret_file.iter().cloned());
        files.extend(self.auth_jwks_file.iter().cloned());
        files.extend(self.agents_file.iter().cloned());
        for agent in agents.iter().filter_map(AgentSpec::acp_command) {
            files.extend(agent.env_files.iter().cloned());
        }
        files
            .into_iter()
            .map(|f| std::path::absolute(&f).unwrap_or(f))
            .collect()
    }

    /// The configured ACP agents (not yet asked what they can do): those
    /// of --agent, then those of the agents file.
    pub fn agent_specs(&self) -> Result<Vec<AgentSpec>, ConfigError> {
        let mut specs: Vec<AgentSpec> = Vec::new();
        let mut commands = Vec::new();
        for entry in self.agents.iter().filter(|e| !e.trim().is_empty()) {
            commands.push(crate::agents::AgentCommand::parse(entry).map_err(ConfigError::Agent)?);
        }
        if let Some(file) = &self.agents_file {
            commands
                .extend(crate::agents::AgentCommand::load_file(file).map_err(ConfigError::Agent)?);
        }
        for command in commands {
            for env_file in &command.env_files {
                std::fs::metadata(env_file).map_err(|e| {
                    ConfigError::Agent(format!(
                        "agent {}: cannot read its env file {}: {e}",
                        command.name,
                        env_file.display()
                    ))
                })?;
            }
            if specs.iter().any(|s| s.provider == command.name) {
                return Err(ConfigError::Agent(format!(
                    "agent {} is configured twice",
                    command.name
                )));
            }
            specs.push(AgentSpec::acp(command));
        }
        Ok(specs)
    }

    /// The secret, from the flag or the file; `None`: authentication off.
    pub fn auth_secret(&self) -> Result<Option<Vec<u8>>, ConfigError> {
        read_secret(self.auth_secret.as_ref(), self.auth_secret_file.as_ref())
    }

    fn auth(&self) -> Result<crate::auth::credentials::Auth, ConfigError> {
        use crate::auth::limits::{LimitsConfig, PrincipalLimits};
        let secret = self.auth_secret()?;
        let jwks = match &self.auth_jwks_file {
            None => None,
            Some(path) => Some(std::fs::read_to_string(path).map_err(|e| {
                ConfigError::AuthSecret(format!(
                    "cannot read the JWKS file {}: {e}",
                    path.display()
                ))
            })?),
        };
        if secret.is_none() && jwks.is_none() {
            return Ok(crate::auth::credentials::Auth::default());
        }
        let provider = jwks.as_deref().map(|jwks| crate::auth::token::Provider {
            jwks,
            issuer: self.auth_jwks_issuer.as_deref().unwrap_or_default(),
            audience: self.auth_jwks_audience.as_deref().unwrap_or_default(),
        });
        let tokens = crate::auth::token::Authenticator::with_keys(secret.as_deref(), provider)
            .map_err(|e| ConfigError::AuthSecret(e.to_string()))?;
        let limits = PrincipalLimits::new(Some(LimitsConfig {
            connections: self.max_connections_per_principal.max(1),
            dispatch_rate: self.dispatch_rate.max(0.001),
            dispatch_burst: self.dispatch_burst.max(1.0),
        }));
        Ok(crate::auth::credentials::Auth::new(
            Some(tokens),
            self.metrics_token.clone(),
            limits,
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::super::{Cli, Command, env_vars};
    use super::*;
    use clap::Parser as _;

    fn args(list: &[&str]) -> ServeArgs {
        let mut argv = vec!["tether", "serve"];
        argv.extend_from_slice(list);
        match Cli::try_parse_from(argv).expect("valid arguments").command {
            Command::Serve(args) => *args,
            _ => panic!("expected serve"),
        }
    }

    #[test]
    fn loopback_is_the_default_and_remote_needs_the_opt_in() {
        assert!(args(&[]).check_bind().is_ok());
        assert!(args(&["--bind", "[::1]:9000"]).check_bind().is_ok());
        let refused = args(&["--bind", "0.0.0.0:7878"]).check_bind().unwrap_err();
        assert!(refused.to_string().contains("--insecure-allow-remote"));
        assert!(
            args(&["--bind", "0.0.0.0:7878", "--insecure-allow-remote"])
                .check_bind()
                .is_ok()
        );
        // With authentication on, a remote bind needs no opt-in.
        let secret = "0123456789abcdef0123456789abcdef";
        let authenticated = args(&["--bind", "0.0.0.0:7878", "--auth-secret", secret]);
        assert!(authenticated.check_bind().is_ok());
        assert!(authenticated.serve_config().unwrap().auth.enabled());
        let weak = args(&["--auth-secret", "short"])
            .serve_config()
            .unwrap_err();
        assert!(weak.to_string().contains("at least 32"), "{weak}");
        assert!(!args(&[]).serve_config().unwrap().auth.enabled());
    }

    #[test]
    fn the_inbox_capacity_reaches_the_engine_with_a_floor() {
        let engine = |list: &[&str]| args(list).serve_config().expect("valid").engine;
        assert_eq!(engine(&[]).hub_buffer, 16_384);
        assert_eq!(engine(&["--inbox-capacity", "64"]).hub_buffer, 64);
        assert_eq!(engine(&["--inbox-capacity", "1"]).hub_buffer, 16);
    }

    #[test]
    fn a_sqlite_host_leaves_its_writer_a_core_and_the_flag_decides_when_given() {
        let cores = std::thread::available_parallelism().map_or(1, std::num::NonZero::get);
        let workers = |list: &[&str]| args(list).runtime_workers();
        assert_eq!(workers(&[]), cores.saturating_sub(1).max(1));
        assert_eq!(
            workers(&["--database-url", "/var/lib/tether.db"]),
            workers(&[])
        );
        assert_eq!(workers(&["--database-url", "postgres://u@db/t"]), cores);
        assert_eq!(workers(&["--worker-threads", "3"]), 3);
        let refused = Cli::try_parse_from(["tether", "serve", "--worker-threads", "0"]);
        assert!(refused.is_err());
    }

    #[test]
    fn debug_redacts_the_database_password() {
        let shown = format!(
            "{:?}",
            args(&["--database-url", "postgres://u:hunter2@db/t"])
        );
        assert!(!shown.contains("hunter2"), "{shown}");
    }

    #[test]
    fn every_flag_has_an_env_fallback() {
        use clap::CommandFactory;
        let command = Cli::command();
        let serve = command
            .get_subcommands()
            .find(|c| c.get_name() == "serve")
            .expect("serve exists");
        for arg in serve.get_arguments() {
            if matches!(arg.get_id().as_str(), "help" | "version") {
                continue;
            }
            assert!(
                arg.get_env().is_some(),
                "--{} has no env fallback",
                arg.get_id()
            );
        }
        assert!(env_vars().contains(&"TETHER_DATABASE_URL".to_owned()));
    }
}
