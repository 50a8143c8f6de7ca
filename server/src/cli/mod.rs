//! The client half of the `tether` binary: commands that talk to a running
//! server over REST and AHP, for people at a terminal and for scripts.
//!
//! Output goes to stdout (a table or readable lines, or JSON with `--json`);
//! errors are one line on stderr and a distinct exit code ([`Exit`]).
//! Progress and reconnect notices go to stderr, and only when it is a
//! terminal.

mod context;
mod send;
mod sessions;
mod tail;

use context::{context_get, context_put};
use send::{dirs, send};
use sessions::{agents, search, sessions, show, usage};
use tail::{clip, summary, tail};

use std::io::{IsTerminal, Read, Write};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use clap::{Args, Subcommand};
use serde_json::{Value, json};
use tether_client::stream::{Dispatched, SessionStream, Start, StreamConfig, StreamEvent};
use tether_client::{Client, ClientIdentity, Error as ClientError, SessionQuery};
use tether_protocol::channel::Channel;
use tether_protocol::context::WorkingContext;
use tether_protocol::rest::DispatchRequest;
use tether_protocol::view::SessionView;
use tether_protocol::workdir;

/// How to reach the server, shared by every client command.
#[derive(Debug, Clone, Args)]
pub struct Remote {
    /// The server's base URL.
    #[arg(
        long,
        env = "TETHER_URL",
        default_value = "http://127.0.0.1:7878",
        global = true
    )]
    pub url: String,
    /// Print JSON for scripts instead of readable text.
    #[arg(long, global = true)]
    pub json: bool,
    /// The file keeping this client's id and `clientSeq` counter, so that
    /// dispatches are numbered uniquely across runs. Default:
    /// `$XDG_STATE_HOME/tether/identity.json` (or under `~/.local/state`).
    #[arg(long, env = "TETHER_IDENTITY", global = true)]
    pub identity: Option<PathBuf>,
    /// The bearer token for a server with authentication on (see
    /// `tether token`).
    #[arg(long, env = "TETHER_TOKEN", global = true, hide_env_values = true)]
    pub token: Option<String>,
}

/// The client commands.
#[derive(Debug, Subcommand)]
pub enum RemoteCommand {
    /// List the agents sessions can run (echo and the configured ACP agents).
    Agents(AgentsArgs),
    /// List sessions, newest first.
    Sessions(SessionsArgs),
    /// Show one session's projection.
    Show(ShowArgs),
    /// Follow a session live, one line per envelope; survives server
    /// restarts without gaps.
    Tail(TailArgs),
    /// Print a session's whole transcript: JSON Lines (every envelope) or
    /// Markdown (the conversation as a person reads it).
    Export(ExportArgs),
    /// Find what was said in the sessions of your projects: words (all must
    /// match), "quoted phrases", prefix*.
    Search(SearchArgs),
    /// What the agents of your projects used and cost, grouped (operators
    /// and admins).
    Usage(UsageArgs),
    /// Start a turn with TEXT and print the agent's answer as it streams.
    Send(SendArgs),
    /// Change a session's working directories.
    Dirs(DirsArgs),
    /// Read or save working context.
    #[command(subcommand)]
    Context(ContextCommand),
}

/// `tether sessions`.
#[derive(Debug, Args)]
pub struct SessionsArgs {
    #[command(flatten)]
    remote: Remote,
    /// Only this project's sessions.
    #[arg(long)]
    project: Option<String>,
    /// Only sessions in this state: live, dormant, closed or ended.
    #[arg(long)]
    state: Option<String>,
    /// At most this many sessions (1 to 1000).
    #[arg(long, default_value_t = 50)]
    limit: u32,
    /// Every matching session, following pages.
    #[arg(long, conflicts_with = "limit")]
    all: bool,
}

/// `tether show`.
#[derive(Debug, Args)]
pub struct ShowArgs {
    #[command(flatten)]
    remote: Remote,
    /// The session id.
    id: String,
}

/// `tether export`.
#[derive(Debug, Args)]
pub struct ExportArgs {
    #[command(flatten)]
    remote: Remote,
    /// The session id.
    id: String,
    /// `jsonl` (every envelope, one per line) or `markdown`.
    #[arg(long, default_value = "jsonl", value_parser = ["jsonl", "markdown"])]
    format: String,
}

/// `tether search`.
#[derive(Debug, Args)]
pub struct SearchArgs {
    #[command(flatten)]
    remote: Remote,
    /// What to find.
    query: String,
    /// Only this project's sessions.
    #[arg(long)]
    project: Option<String>,
    /// Only sessions of this agent.
    #[arg(long)]
    agent: Option<String>,
    /// Only sessions in this state: live, dormant, closed or ended.
    #[arg(long)]
    state: Option<String>,
    /// Only what was written at or after this time (RFC 3339).
    #[arg(long)]
    since: Option<String>,
    /// Only what was written before this time (RFC 3339).
    #[arg(long)]
    until: Option<String>,
    /// At most this many hits (1 to 100).
    #[arg(long, default_value_t = 20)]
    limit: u32,
}

/// `tether usage`.
#[derive(Debug, Args)]
pub struct UsageArgs {
    #[command(flatten)]
    remote: Remote,
    /// Only usage reported at or after this time (RFC 3339).
    #[arg(long)]
    since: Option<String>,
    /// Only usage reported before this time (RFC 3339).
    #[arg(long)]
    until: Option<String>,
    /// Only this project.
    #[arg(long)]
    project: Option<String>,
    /// Only this agent.
    #[arg(long)]
    agent: Option<String>,
    /// Group by these, comma-separated: project, principal, agent, model.
    #[arg(long, default_value = "project")]
    by: String,
    /// Print CSV (as the server writes it) instead of a table.
    #[arg(long, conflicts_with = "json")]
    csv: bool,
}

/// `tether agents`.
#[derive(Debug, Args)]
pub struct AgentsArgs {
    #[command(flatten)]
    remote: Remote,
}

/// `tether tail`.
#[derive(Debug, Args)]
pub struct TailArgs {
    #[command(flatten)]
    remote: Remote,
    /// The session id.
    id: String,
    /// Print the whole transcript first, then follow.
    #[arg(long)]
    from_start: bool,
    /// Exit after this many envelopes.
    #[arg(long)]
    count: Option<u64>,
}

/// `tether send`.
#[derive(Debug, Args)]
pub struct SendArgs {
    #[command(flatten)]
    remote: Remote,
    /// The session id.
    id: String,
    /// What to say.
    text: String,
    /// Give up waiting for the answer after this many seconds.
    #[arg(long, default_value_t = 300)]
    timeout_secs: u64,
    /// Approve the agent's permission requests (the first option that
    /// approves). Without it a terminal is asked; otherwise the request
    /// waits for another client to answer.
    #[arg(long)]
    yes: bool,
}

/// `tether dirs`.
#[derive(Debug, Args)]
pub struct DirsArgs {
    #[command(flatten)]
    remote: Remote,
    /// The session id.
    id: String,
    #[command(subcommand)]
    change: DirsChange,
}

/// What `tether dirs` does.
#[derive(Debug, Subcommand)]
pub enum DirsChange {
    /// Add directories (paths or file: URIs).
    Add {
        /// The directories.
        #[arg(required = true)]
        dirs: Vec<String>,
    },
    /// Remove directories.
    Remove {
        /// The directories.
        #[arg(required = true)]
        dirs: Vec<String>,
    },
    /// Replace OLD with NEW, in place.
    Replace {
        /// The directory to replace.
        old: String,
        /// Its replacement.
        new: String,
    },
}

/// `tether context`.
#[derive(Debug, Subcommand)]
pub enum ContextCommand {
    /// Print a session's working context (or the project's latest).
    Get(ContextGetArgs),
    /// Save a session's working context from a JSON file or stdin.
    Put(ContextPutArgs),
}

/// `tether context get`.
#[derive(Debug, Args)]
pub struct ContextGetArgs {
    #[command(flatten)]
    remote: Remote,
    /// The project.
    project: String,
    /// The session.
    session: String,
}

/// `tether context put`.
#[derive(Debug, Args)]
pub struct ContextPutArgs {
    #[command(flatten)]
    remote: Remote,
    /// The project.
    project: String,
    /// The session.
    session: String,
    /// The JSON file to save; `-` (the default) reads stdin.
    #[arg(default_value = "-")]
    file: String,
}

/// The exit codes of client commands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Exit {
    /// Done.
    Ok = 0,
    /// Anything else: a server error, an unexpected answer.
    Failure = 1,
    /// Bad usage or invalid input (clap uses 2 for usage errors too).
    Usage = 2,
    /// The session (or other thing named) does not exist.
    NotFound = 3,
    /// The server refused the action; the reason is printed.
    Rejected = 4,
    /// The server could not be reached.
    Unreachable = 5,
}

/// A failed command: its exit code and its one-line message.
#[derive(Debug)]
pub struct Failed {
    exit: Exit,
    message: String,
}

impl Failed {
    fn new(exit: Exit, message: impl Into<String>) -> Self {
        Self {
            exit,
            message: message.into(),
        }
    }
}

impl From<ClientError> for Failed {
    fn from(err: ClientError) -> Self {
        let exit = match &err {
            ClientError::Unreachable(_)
            | ClientError::Connect { .. }
            | ClientError::Disconnected(_)
            | ClientError::StreamClosed => Exit::Unreachable,
            ClientError::Api { status: 404, .. } => Exit::NotFound,
            ClientError::Api { code, .. } if code == "rejected" => Exit::Rejected,
            ClientError::Api {
                status: 400 | 413 | 422,
                ..
            }
            | ClientError::InvalidUrl { .. } => Exit::Usage,
            ClientError::Rpc { code, .. } if *code == ahp_error_codes::SESSION_NOT_FOUND => {
                Exit::NotFound
            }
            _ => Exit::Failure,
        };
        let message = match &err {
            // The detail alone reads best ("Session x does not exist.").
            ClientError::Api {
                detail: Some(detail),
                ..
            } => detail.clone(),
            _ => err.to_string(),
        };
        Self { exit, message }
    }
}

mod ahp_error_codes {
    /// AHP's "no such session" JSON-RPC error code.
    pub const SESSION_NOT_FOUND: i32 = -32001;
}

type Outcome = Result<(), Failed>;

/// Runs a client command and returns the process exit code.
pub async fn run(command: RemoteCommand) -> ExitCode {
    let result = match command {
        RemoteCommand::Agents(args) => agents(args).await,
        RemoteCommand::Sessions(args) => sessions(args).await,
        RemoteCommand::Show(args) => show(args).await,
        RemoteCommand::Tail(args) => tail(args).await,
        RemoteCommand::Export(args) => export(args).await,
        RemoteCommand::Search(args) => search(args).await,
        RemoteCommand::Usage(args) => usage(args).await,
        RemoteCommand::Send(args) => send(args).await,
        RemoteCommand::Dirs(args) => dirs(args).await,
        RemoteCommand::Context(ContextCommand::Get(args)) => context_get(args).await,
        RemoteCommand::Context(ContextCommand::Put(args)) => context_put(args).await,
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        // A closed stdout pipe is a normal end, not an error.
        Err(failed) if failed.exit == Exit::Ok => ExitCode::SUCCESS,
        Err(failed) => {
            eprintln!("tether: error: {}", failed.message);
            ExitCode::from(failed.exit as u8)
        }
    }
}

impl Remote {
    fn client(&self) -> Result<Client, Failed> {
        let client = Client::new(&self.url)?;
        Ok(match self.tokens() {
            Some(tokens) => client.with_tokens(tokens),
            None => client,
        })
    }

    fn tokens(&self) -> Option<tether_client::token::Tokens> {
        self.token.as_ref().map(|token| {
            Arc::new(tether_client::token::StaticToken::new(token.clone()))
                as tether_client::token::Tokens
        })
    }

    /// A stream configuration with this command's token, if any.
    fn with_token(&self, config: StreamConfig) -> StreamConfig {
        match self.tokens() {
            Some(tokens) => config.with_tokens(tokens),
            None => config,
        }
    }

    /// The persistent identity, or an ephemeral one where no state
    /// directory is known.
    fn identity(&self) -> Result<Arc<ClientIdentity>, Failed> {
        let path = self.identity.clone().or_else(|| {
            let state = std::env::var_os("XDG_STATE_HOME")
                .map(PathBuf::from)
                .filter(|p| p.is_absolute())
                .or_else(|| {
                    std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".local/state"))
                })?;
            Some(state.join("tether/identity.json"))
        });
        Ok(Arc::new(match path {
            Some(path) => ClientIdentity::persistent(path)?,
            None => ClientIdentity::ephemeral(),
        }))
    }

    fn stream_config(&self) -> Result<StreamConfig, Failed> {
        Ok(self.with_token(StreamConfig::new(self.url.clone()).with_identity(self.identity()?)))
    }
}

/// `tether export`: the transcript, as the server renders it, to stdout.
async fn export(args: ExportArgs) -> Outcome {
    let format = match args.format.as_str() {
        "markdown" => tether_client::ExportFormat::Markdown,
        _ => tether_client::ExportFormat::Jsonl,
    };
    let text = args.remote.client()?.export(&args.id, format).await?;
    write_stdout(&text)
}

/// Writes one line to stdout.
fn out(line: &str) -> Outcome {
    write_stdout(&format!("{line}\n"))
}

/// Writes to stdout and flushes; a closed pipe (`| head`) ends the command
/// quietly.
fn write_stdout(text: &str) -> Outcome {
    let mut stdout = std::io::stdout().lock();
    match stdout
        .write_all(text.as_bytes())
        .and_then(|()| stdout.flush())
    {
        Ok(()) => Ok(()),
        Err(err) if err.kind() == std::io::ErrorKind::BrokenPipe => {
            Err(Failed::new(Exit::Ok, String::new()))
        }
        Err(err) => Err(Failed::new(Exit::Failure, format!("cannot write: {err}"))),
    }
}

fn out_json(value: &impl serde::Serialize, pretty: bool) -> Outcome {
    let text = if pretty {
        serde_json::to_string_pretty(value)
    } else {
        serde_json::to_string(value)
    }
    .map_err(|e| Failed::new(Exit::Failure, format!("cannot encode JSON: {e}")))?;
    out(&text)
}

/// A progress or status note on stderr, only for a person watching.
fn note(message: &str) {
    if std::io::stderr().is_terminal() {
        eprintln!("{message}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn summaries_pick_the_telling_field() {
        assert_eq!(
            summary(&json!({"type": "session/titleChanged", "title": "Hi"})),
            "Hi"
        );
        assert_eq!(
            summary(&json!({"type": "session/workingDirectoryReplaced",
                "directory": "file:///a", "replacement": "file:///b"})),
            "file:///a -> file:///b"
        );
        assert_eq!(
            summary(&json!({"part": {"content": "line one\nline two"}})),
            "line one line two"
        );
        assert_eq!(summary(&json!({"type": "x"})), "");
        assert_eq!(clip("abcdef", 4), "abc…");
    }

    #[test]
    fn client_errors_map_to_distinct_exit_codes() {
        let api = |status, code: &str| ClientError::Api {
            status,
            code: code.into(),
            detail: Some("why".into()),
        };
        assert_eq!(Failed::from(api(404, "not_found")).exit, Exit::NotFound);
        assert_eq!(Failed::from(api(422, "rejected")).exit, Exit::Rejected);
        assert_eq!(Failed::from(api(409, "rejected")).exit, Exit::Rejected);
        assert_eq!(Failed::from(api(422, "invalid_id")).exit, Exit::Usage);
        assert_eq!(Failed::from(api(500, "internal")).exit, Exit::Failure);
        assert_eq!(Failed::from(api(404, "not_found")).message, "why");
        let unreachable = ClientError::Connect {
            url: "ws://x".into(),
            reason: "refused".into(),
        };
        assert_eq!(Failed::from(unreachable).exit, Exit::Unreachable);
    }
}
