//! The command line. Every flag has a `TETHER_*` environment fallback, so a
//! container is configured with environment variables alone.

use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};

use crate::store::{StoreOptions, redact_url};

/// Tether: a durable, multi-user session host for coding agents.
#[derive(Debug, Parser)]
#[command(name = "tether", version, about, propagate_version = true)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the server.
    Serve(Box<ServeArgs>),
    /// Check what `tether serve` would run with (the same flags and
    /// environment) and say in plain words what is wrong: configuration,
    /// store and migrations, bind address, allowed roots, agents, auth
    /// secret, clock, open-file limit. Exits non-zero when a check fails.
    Doctor(Box<ServeArgs>),
    /// Print the OpenAPI document the server serves at /openapi.json.
    Openapi,
    /// Mint a bearer token from the server's auth secret and print it (and
    /// only it) on stdout.
    Token(TokenArgs),
    /// Re-fold every session's transcript and rewrite the read-model rows
    /// that differ. Run it with the server stopped.
    RebuildProjections(DatabaseArgs),
    /// Copy the SQLite database to PATH, a new file, while the server
    /// runs: a consistent copy as of one moment, integrity-checked before
    /// it is named PATH. (Postgres: pg_dump; see the README's "Backups".)
    Backup(BackupArgs),
    /// Copy a SQLite database into an empty Postgres one and verify the
    /// copy. Run it with the server stopped; an interrupted run resumes.
    Migrate(crate::migrate::MigrateArgs),
    /// The session's MCP server on stdio, for an agent that takes only stdio
    /// MCP servers: Tether tells such agents to run it (with the session's
    /// token in `TETHER_MCP_TOKEN`); not for people.
    #[command(hide = true)]
    McpStdio(crate::agents::mcp_stdio::McpStdioArgs),
    /// Client commands, talking to a running server at `--url`.
    #[command(flatten)]
    Remote(crate::cli::RemoteCommand),
}

/// Flags of `tether backup`.
#[derive(Clone, Debug, Args)]
pub struct BackupArgs {
    /// The new file to write the copy to (never overwritten).
    pub path: std::path::PathBuf,
    /// The database to copy.
    #[command(flatten)]
    pub database: DatabaseArgs,
}

/// Database flags, shared by every command that opens the store.
#[derive(Clone, Args)]
pub struct DatabaseArgs {
    /// The database: `sqlite:PATH` (or a plain path) for embedded SQLite, or
    /// `postgres://USER:PASSWORD@HOST/DB`.
    #[arg(
        long,
        env = "TETHER_DATABASE_URL",
        default_value = "sqlite:./tether.db"
    )]
    pub database_url: String,

    /// Seconds to wait for a database connection, also at start-up.
    #[arg(
        long,
        env = "TETHER_DATABASE_CONNECT_TIMEOUT_SECS",
        default_value_t = 5
    )]
    pub database_connect_timeout_secs: u64,

    /// Largest number of database connections (read pool for SQLite).
    #[arg(long, env = "TETHER_DATABASE_MAX_CONNECTIONS", default_value_t = 8)]
    pub database_max_connections: u32,
}

impl fmt::Debug for DatabaseArgs {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DatabaseArgs")
            .field("database_url", &redact_url(&self.database_url))
            .finish_non_exhaustive()
    }
}

impl DatabaseArgs {
    /// The store connection settings.
    pub fn store_options(&self) -> StoreOptions {
        StoreOptions {
            connect_timeout: Duration::from_secs(self.database_connect_timeout_secs),
            max_connections: self.database_max_connections,
            host_id: None,
            stalled_transaction: None,
        }
    }
}

/// Flags of `tether token`.
#[derive(Clone, Args)]
pub struct TokenArgs {
    /// Who the token is for (its `sub`).
    #[arg(long)]
    pub sub: String,
    /// Its role: viewer, operator, agent or admin.
    #[arg(long)]
    pub role: crate::auth::Role,
    /// A project it may see (repeat for more); `*` for every project.
    #[arg(long = "project", required = true)]
    pub projects: Vec<String>,
    /// How long it is valid: 90s, 30m, 24h, 7d.
    #[arg(long, default_value = "24h", value_parser = crate::auth::token::parse_ttl)]
    pub ttl: Duration,
    /// The secret, as `tether serve` takes it.
    #[arg(long, env = "TETHER_AUTH_SECRET", hide_env_values = true)]
    pub auth_secret: Option<String>,
    /// A file holding the secret, as `tether serve` takes it.
    #[arg(long, env = "TETHER_AUTH_SECRET_FILE", conflicts_with = "auth_secret")]
    pub auth_secret_file: Option<PathBuf>,
}

impl fmt::Debug for TokenArgs {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TokenArgs")
            .field("sub", &self.sub)
            .field("role", &self.role)
            .field("projects", &self.projects)
            .field("ttl", &self.ttl)
            .finish_non_exhaustive()
    }
}

/// Reads a secret from a flag's value or a file (a trailing newline is
/// ignored); `None` when neither is given.
pub fn read_secret(
    value: Option<&String>,
    file: Option<&PathBuf>,
) -> Result<Option<Vec<u8>>, ConfigError> {
    if let Some(secret) = value {
        return Ok(Some(secret.as_bytes().to_vec()));
    }
    let Some(path) = file else {
        return Ok(None);
    };
    let mut bytes = std::fs::read(path).map_err(|e| {
        ConfigError::AuthSecret(format!(
            "cannot read the auth secret file {}: {e}",
            path.display()
        ))
    })?;
    while bytes.last().is_some_and(|b| *b == b'\n' || *b == b'\r') {
        bytes.pop();
    }
    Ok(Some(bytes))
}

mod command_line;
mod serve;

pub use command_line::hide_command_line;
pub use serve::*;

/// Every `TETHER_*` environment variable the command line reads, for checks
/// that deployment files only set variables that exist.
pub fn env_vars() -> Vec<String> {
    use clap::CommandFactory;
    let mut out = Vec::new();
    let mut stack = vec![Cli::command()];
    while let Some(command) = stack.pop() {
        out.extend(
            command
                .get_arguments()
                .filter_map(|arg| arg.get_env())
                .map(|env| env.to_string_lossy().into_owned()),
        );
        stack.extend(command.get_subcommands().cloned());
    }
    out.sort();
    out.dedup();
    out
}
