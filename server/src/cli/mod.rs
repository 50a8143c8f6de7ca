//! The client half of the `tether` binary: commands that talk to a running
//! server over REST and AHP, for people at a terminal and for scripts.
//!
//! Output goes to stdout (a table or readable lines, or JSON with `--json`);
//! errors are one line on stderr and a distinct exit code ([`Exit`]).
//! Progress and reconnect notices go to stderr, and only when it is a
//! terminal.

mod token;

pub use token::token;

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
    /// List sessions, newest first.
    Sessions(SessionsArgs),
    /// Show one session's projection.
    Show(ShowArgs),
    /// Follow a session live, one line per envelope; survives server
    /// restarts without gaps.
    Tail(TailArgs),
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
        RemoteCommand::Sessions(args) => sessions(args).await,
        RemoteCommand::Show(args) => show(args).await,
        RemoteCommand::Tail(args) => tail(args).await,
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

async fn sessions(args: SessionsArgs) -> Outcome {
    let client = args.remote.client()?;
    let mut query = SessionQuery {
        project: args.project,
        state: args.state,
        limit: Some(if args.all { 1000 } else { args.limit }),
        cursor: None,
    };
    let mut items = Vec::new();
    loop {
        let page = client.sessions(&query).await?;
        items.extend(page.items);
        match page.next_cursor {
            Some(cursor) if args.all => {
                note(&format!("… {} sessions so far", items.len()));
                query.cursor = Some(cursor);
            }
            _ => break,
        }
    }
    if args.remote.json {
        return out_json(&items, false);
    }
    let rows: Vec<[String; 6]> = items
        .iter()
        .map(|s| {
            [
                s.id.clone(),
                clip(s.title.as_deref().unwrap_or("-"), 40),
                s.state.as_str().to_owned(),
                s.turns.to_string(),
                if s.resumable { "yes" } else { "no" }.to_owned(),
                s.updated_at.clone(),
            ]
        })
        .collect();
    print_table(
        ["ID", "TITLE", "STATE", "TURNS", "RESUMABLE", "UPDATED"],
        &rows,
    )
}

fn print_table<const N: usize>(header: [&str; N], rows: &[[String; N]]) -> Outcome {
    let mut widths = header.map(|h| h.chars().count());
    for row in rows {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.chars().count());
        }
    }
    let line = |cells: Vec<&str>| {
        let mut text = String::new();
        for (i, (cell, width)) in cells.iter().zip(widths).enumerate() {
            if i + 1 == N {
                text.push_str(cell);
            } else {
                text.push_str(&format!("{cell:<width$}  "));
            }
        }
        text
    };
    out(&line(header.to_vec()))?;
    for row in rows {
        out(&line(row.iter().map(String::as_str).collect()))?;
    }
    Ok(())
}

async fn show(args: ShowArgs) -> Outcome {
    let view = args.remote.client()?.session(&args.id).await?;
    if args.remote.json {
        return out_json(&view, true);
    }
    print_view(&view)
}

fn print_view(view: &SessionView) -> Outcome {
    let state = match &view.cause {
        Some(cause) => format!("{} ({cause})", view.state.as_str()),
        None => view.state.as_str().to_owned(),
    };
    let mut lines = vec![
        format!("session     {}", view.id),
        format!("title       {}", view.title.as_deref().unwrap_or("-")),
        format!("project     {}", view.project),
        format!("provider    {}", view.provider),
        format!("state       {state}"),
        format!("resumable   {}", if view.resumable { "yes" } else { "no" }),
        format!("turns       {}", view.turns),
    ];
    if let Some(turn) = &view.projection.open_turn_id {
        lines.push(format!("open turn   {turn}"));
    }
    for (i, dir) in view.working_directories.iter().enumerate() {
        let label = if i == 0 { "directories" } else { "" };
        let shown = workdir::file_uri_path(dir).unwrap_or_else(|_| dir.clone());
        lines.push(format!(
            "{label:<11} {shown}{}",
            if i == 0 { "  (primary)" } else { "" }
        ));
    }
    if view.working_directories.is_empty() {
        lines.push("directories -".to_owned());
    }
    if let Some(chat) = &view.default_chat {
        lines.push(format!("chat        {chat}"));
    }
    if !view.projection.commands.is_empty() {
        let names: Vec<&str> = view
            .projection
            .commands
            .iter()
            .map(|c| c.name.as_str())
            .collect();
        lines.push(format!("commands    {}", names.join(", ")));
    }
    lines.push(format!("last seq    {}", view.last_seq));
    lines.push(format!("created     {}", view.created_at));
    lines.push(format!("updated     {}", view.updated_at));
    for line in lines {
        out(&line)?;
    }
    Ok(())
}

async fn tail(args: TailArgs) -> Outcome {
    let client = args.remote.client()?;
    let view = client.session(&args.id).await?;
    let session_uri = view.resource.clone();
    let mut channels = vec![session_uri.clone()];
    channels.extend(view.default_chat.clone());
    let mut printer = TailPrinter {
        json: args.remote.json,
        session: session_uri,
        left: args.count,
    };

    let start = if args.from_start {
        let mut after = 0;
        loop {
            let page = client.transcript(&args.id, after, 1000).await?;
            for envelope in &page.envelopes {
                if let Some(channel) = envelope["channel"].as_str()
                    && !channels.iter().any(|c| c == channel)
                {
                    channels.push(channel.to_owned());
                }
                if printer.envelope(envelope)? {
                    return Ok(());
                }
            }
            match page.next_after {
                Some(next) => {
                    after = next;
                    note(&format!("… {after} (serverSeq) read"));
                }
                None => {
                    after = page
                        .envelopes
                        .last()
                        .and_then(|e| e["serverSeq"].as_u64())
                        .unwrap_or(after);
                    break;
                }
            }
        }
        Start::After(after)
    } else {
        Start::Now
    };

    // Tail only reads: an ephemeral identity, no identity file.
    let config = args
        .remote
        .with_token(StreamConfig::new(args.remote.url.clone()));
    let mut stream = SessionStream::open(config, channels, start).await?;
    while let Some(event) = stream.next().await {
        match event {
            StreamEvent::Snapshot(snapshot) => printer.snapshot(&snapshot)?,
            StreamEvent::Envelope(envelope) => {
                let value = serde_json::to_value(&*envelope)
                    .map_err(|e| Failed::new(Exit::Failure, e.to_string()))?;
                // A chat the session gains is followed from then on.
                if let Some(chat) = added_chat(&value, &printer.session)
                    && let Err(err) = stream.subscribe(chat).await
                {
                    eprintln!("tether: cannot follow the new chat {chat}: {err}");
                }
                if printer.envelope(&value)? {
                    return Ok(());
                }
            }
            StreamEvent::Disconnected { reason, retry_in } => note(&format!(
                "tether: connection lost ({reason}); reconnecting in {:.1}s",
                retry_in.as_secs_f64()
            )),
            StreamEvent::Resumed { replayed } => {
                note(&format!(
                    "tether: reconnected; {replayed} missed envelopes follow"
                ));
            }
            StreamEvent::Resynced => eprintln!(
                "tether: reconnected after too long a gap to replay; showing fresh snapshots"
            ),
            StreamEvent::Gone { channels } => {
                eprintln!("tether: the server no longer has {}", channels.join(", "));
            }
            StreamEvent::Failed { reason } => {
                return Err(Failed::new(Exit::Unreachable, reason));
            }
            _ => {}
        }
    }
    Err(Failed::new(Exit::Unreachable, "the session stream ended"))
}

/// The chat a `session/chatAdded` envelope on `session` brings.
fn added_chat<'a>(envelope: &'a Value, session: &str) -> Option<&'a str> {
    let action = &envelope["action"];
    (envelope["channel"] == session && action["type"] == "session/chatAdded")
        .then(|| action["summary"]["resource"].as_str())
        .flatten()
}

struct TailPrinter {
    json: bool,
    session: String,
    left: Option<u64>,
}

impl TailPrinter {
    /// Prints one envelope; true once `--count` envelopes have been printed.
    fn envelope(&mut self, envelope: &Value) -> Result<bool, Failed> {
        if self.json {
            out_json(envelope, false)?;
        } else {
            let channel = envelope["channel"].as_str().unwrap_or_default();
            let action = &envelope["action"];
            out(&format!(
                "{:>8}  {:<12}  {:<34}  {}",
                envelope["serverSeq"].as_u64().unwrap_or_default(),
                self.label(channel),
                action["type"].as_str().unwrap_or("?"),
                summary(action),
            ))?;
        }
        Ok(match &mut self.left {
            Some(left) => {
                *left = left.saturating_sub(1);
                *left == 0
            }
            None => false,
        })
    }

    fn snapshot(&self, snapshot: &ahp_types::state::Snapshot) -> Outcome {
        if self.json {
            return out_json(&json!({"snapshot": snapshot}), false);
        }
        out(&format!(
            "# {} at serverSeq {}",
            snapshot.resource, snapshot.from_seq
        ))
    }

    /// `session`, `chat:<name>` or the channel URI.
    fn label(&self, channel: &str) -> String {
        if channel == self.session {
            return "session".to_owned();
        }
        match Channel::parse(channel) {
            Ok(Channel::Chat(id)) => match id.rsplit_once('.') {
                Some((_, name)) => format!("chat:{name}"),
                None => format!("chat:{id}"),
            },
            _ => channel.to_owned(),
        }
    }
}

/// A short, single-line gist of an action.
fn summary(action: &Value) -> String {
    let text = |v: &Value| v.as_str().map(str::to_owned);
    let found = text(&action["title"])
        .or_else(|| text(&action["message"]["text"]))
        .or_else(|| text(&action["part"]["content"]))
        .or_else(|| {
            let directory = text(&action["directory"])?;
            Some(match text(&action["replacement"]) {
                Some(replacement) => format!("{directory} -> {replacement}"),
                None => directory,
            })
        })
        .or_else(|| text(&action["cause"]))
        .or_else(|| text(&action["reason"]))
        .or_else(|| text(&action["error"]["message"]))
        .or_else(|| text(&action["turnId"]).map(|t| format!("turn {t}")))
        .or_else(|| text(&action["acpSessionRef"]).map(|r| format!("agent session {r}")))
        .or_else(|| {
            let names: Vec<&str> = action["commands"]
                .as_array()?
                .iter()
                .filter_map(|c| c["name"].as_str())
                .collect();
            Some(format!("commands: {}", names.join(", ")))
        });
    found.map(|t| clip(&t, 80)).unwrap_or_default()
}

/// `text` on one line, at most `max` characters.
fn clip(text: &str, max: usize) -> String {
    let flat: String = text
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    if flat.chars().count() <= max {
        flat
    } else {
        let mut cut: String = flat.chars().take(max.saturating_sub(1)).collect();
        cut.push('…');
        cut
    }
}

async fn send(args: SendArgs) -> Outcome {
    let client = args.remote.client()?;
    let view = client.session(&args.id).await?;
    let chat = view.default_chat.clone().ok_or_else(|| {
        Failed::new(
            Exit::Failure,
            format!("session {} has no chat to send to", view.id),
        )
    })?;
    let mut stream =
        SessionStream::open(args.remote.stream_config()?, vec![chat.clone()], Start::Now).await?;
    let turn_id = format!("turn-{}", uuid::Uuid::new_v4());
    let started_at = jiff::Timestamp::now()
        .strftime("%Y-%m-%dT%H:%M:%S%.3fZ")
        .to_string();
    let action = json!({
        "type": "chat/turnStarted",
        "turnId": turn_id,
        "startedAt": started_at,
        "message": {"text": args.text, "origin": {"kind": "user"}},
    });
    match stream.dispatch(&chat, action).await? {
        Dispatched::Rejected { reason, .. } => return Err(Failed::new(Exit::Rejected, reason)),
        Dispatched::Accepted(_) => {}
    }
    note("… waiting for the agent");
    let answer = tokio::time::timeout(
        Duration::from_secs(args.timeout_secs),
        follow_turn(&mut stream, &turn_id, args.remote.json),
    )
    .await;
    match answer {
        Ok(result) => result,
        Err(_) => Err(Failed::new(
            Exit::Failure,
            format!(
                "no end of turn {turn_id} within {}s; it continues on the server",
                args.timeout_secs
            ),
        )),
    }
}

/// Prints the agent's answer to `turn_id` as it streams, until the turn ends.
async fn follow_turn(stream: &mut SessionStream, turn_id: &str, json: bool) -> Outcome {
    let mut open_line = false;
    while let Some(event) = stream.next().await {
        let envelope = match event {
            StreamEvent::Envelope(envelope) => envelope,
            StreamEvent::Failed { reason } => return Err(Failed::new(Exit::Unreachable, reason)),
            StreamEvent::Disconnected { reason, .. } => {
                note(&format!("tether: connection lost ({reason}); reconnecting"));
                continue;
            }
            _ => continue,
        };
        let action = serde_json::to_value(&envelope.action)
            .map_err(|e| Failed::new(Exit::Failure, e.to_string()))?;
        if action["turnId"].as_str() != Some(turn_id) {
            continue;
        }
        if json {
            out_json(&*envelope, false)?;
        }
        match action["type"].as_str().unwrap_or_default() {
            "chat/responsePart" if !json => {
                if let Some(content) = action["part"]["content"].as_str() {
                    write_stdout(content)?;
                    open_line = !content.ends_with('\n');
                }
            }
            "chat/turnComplete" => {
                if open_line {
                    out("")?;
                }
                return Ok(());
            }
            "chat/turnCancelled" => {
                return Err(Failed::new(Exit::Failure, "the turn was cancelled"));
            }
            "chat/error" => {
                let message = summary(&action);
                return Err(Failed::new(
                    Exit::Failure,
                    format!("the agent failed: {message}"),
                ));
            }
            _ => {}
        }
    }
    Err(Failed::new(Exit::Unreachable, "the session stream ended"))
}

async fn dirs(args: DirsArgs) -> Outcome {
    let client = args.remote.client()?;
    let identity = args.remote.identity()?;
    let actions: Vec<Value> = match &args.change {
        DirsChange::Add { dirs } => dirs
            .iter()
            .map(|d| Ok(json!({"type": "session/workingDirectorySet", "directory": dir_uri(d)?})))
            .collect::<Result<_, Failed>>()?,
        DirsChange::Remove { dirs } => dirs
            .iter()
            .map(|d| {
                Ok(json!({"type": "session/workingDirectoryRemoved", "directory": dir_uri(d)?}))
            })
            .collect::<Result<_, Failed>>()?,
        DirsChange::Replace { old, new } => vec![json!({
            "type": "session/workingDirectoryReplaced",
            "directory": dir_uri(old)?,
            "replacement": dir_uri(new)?,
        })],
    };
    for action in actions {
        let request = DispatchRequest {
            client_id: identity.client_id().to_owned(),
            client_seq: identity.next_seq()?,
            channel: None,
            action,
        };
        client.dispatch(&args.id, &request).await?;
    }
    let view = client.session(&args.id).await?;
    if args.remote.json {
        return out_json(&view.working_directories, false);
    }
    for dir in &view.working_directories {
        out(&workdir::file_uri_path(dir).unwrap_or_else(|_| dir.clone()))?;
    }
    Ok(())
}

/// A directory argument as a `file:` URI: URIs as given, paths made
/// absolute against the current directory (the server resolves symlinks).
fn dir_uri(arg: &str) -> Result<String, Failed> {
    if arg.starts_with("file:") {
        return Ok(arg.to_owned());
    }
    let absolute = std::path::absolute(arg)
        .map_err(|e| Failed::new(Exit::Usage, format!("{arg:?} is not a usable path: {e}")))?;
    let text = absolute
        .to_str()
        .ok_or_else(|| Failed::new(Exit::Usage, format!("{arg:?} is not valid UTF-8")))?;
    workdir::path_to_file_uri(text).map_err(|e| Failed::new(Exit::Usage, e.to_string()))
}

async fn context_get(args: ContextGetArgs) -> Outcome {
    let loaded = args
        .remote
        .client()?
        .working_context(&args.project, &args.session)
        .await?;
    if !loaded.found {
        let others = if loaded.other_sessions.is_empty() {
            "none of its sessions has one".to_owned()
        } else {
            format!("sessions with one: {}", loaded.other_sessions.join(", "))
        };
        return Err(Failed::new(
            Exit::NotFound,
            format!(
                "no working context saved for session {} in project {}; {others}",
                args.session, args.project
            ),
        ));
    }
    out_json(&loaded, !args.remote.json)
}

async fn context_put(args: ContextPutArgs) -> Outcome {
    let mut body = Vec::new();
    let read = if args.file == "-" {
        std::io::stdin().read_to_end(&mut body).map(|_| ())
    } else {
        std::fs::read(&args.file).map(|bytes| body = bytes)
    };
    read.map_err(|e| Failed::new(Exit::Usage, format!("cannot read {}: {e}", args.file)))?;
    let context: WorkingContext = serde_json::from_slice(&body).map_err(|e| {
        Failed::new(
            Exit::Usage,
            format!("{} is not a working context: {e}", args.file),
        )
    })?;
    let saved = args
        .remote
        .client()?
        .save_working_context(&args.project, &args.session, &context)
        .await?;
    if args.remote.json {
        return out_json(&saved, false);
    }
    out(&format!(
        "saved working context of session {} in project {} at {}",
        saved.session, saved.project, saved.saved_at
    ))
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
