//! `tether migrate`: copies a SQLite database into an empty Postgres one,
//! so a team that started on SQLite moves without losing anything.
//!
//! With the server stopped, it takes the SQLite store's own lock on the
//! source (a running server holds it, so the copy is refused while one
//! does), runs the Postgres migrations on the target through the store,
//! copies every table in primary-key order in batches, sets the host's
//! `last_seq` last, and then verifies: every table row for row, the highest
//! seq, the host epoch and `last_seq`, and every session's read-model row
//! against a fresh fold of the copied log.
//!
//! The epoch is copied, so clients' `lastSeenServerSeq` keeps its meaning
//! on the new database. An interrupted copy resumes where it stopped (see
//! [`target`]); a target holding anything else is refused.

mod copy;
mod source;
mod tables;
mod target;
mod verify;

use std::fmt;
use std::time::{Duration, Instant};

use clap::Args;

use crate::store::{StoreOptions, redact_url};
use copy::{copy_table, note};
use source::Source;
use tables::TABLES;
use target::{Found, Target};

/// Flags of `tether migrate`.
#[derive(Clone, Args)]
pub struct MigrateArgs {
    /// The SQLite database to copy: `sqlite:PATH` or a plain path. The
    /// server must be stopped; the database is only read.
    #[arg(long, env = "TETHER_MIGRATE_FROM")]
    pub from: String,

    /// The Postgres database to copy into, `postgres://USER:PASSWORD@HOST/DB`:
    /// empty, or holding an interrupted copy of the same source.
    #[arg(long, env = "TETHER_MIGRATE_TO", hide_env_values = true)]
    pub to: String,

    /// Rows per INSERT (fewer when a batch's text passes 8 MiB).
    #[arg(long, env = "TETHER_MIGRATE_BATCH_ROWS", default_value_t = 5_000,
          value_parser = clap::value_parser!(u32).range(1..=50_000))]
    pub batch_rows: u32,

    /// Seconds to wait for the Postgres connection.
    #[arg(
        long,
        env = "TETHER_DATABASE_CONNECT_TIMEOUT_SECS",
        default_value_t = 5
    )]
    pub connect_timeout_secs: u64,
}

impl fmt::Debug for MigrateArgs {
    // By hand, so a password in the target URL never reaches a log.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MigrateArgs")
            .field("from", &self.from)
            .field("to", &redact_url(&self.to))
            .field("batch_rows", &self.batch_rows)
            .finish_non_exhaustive()
    }
}

/// Why a migration did not complete. Each message is one line.
#[derive(Debug, thiserror::Error)]
pub enum MigrateError {
    /// A flag is wrong (a URL of the wrong kind).
    #[error("{0}")]
    Usage(String),
    /// The source is missing, locked by a server, or not a database this
    /// release can copy.
    #[error("{0}")]
    Source(String),
    /// The target is unreachable, not empty, or holds another database.
    #[error("{0}")]
    Target(String),
    /// A batch could not be written.
    #[error("copying {table}: {reason}")]
    Copy {
        /// The table being copied.
        table: &'static str,
        /// The database's answer.
        reason: String,
    },
    /// The copy is not equal to the source.
    #[error(
        "verification failed: {}; the target is not a faithful copy: recreate it empty and \
         migrate again",
        .0.join("; ")
    )]
    Mismatch(Vec<String>),
}

impl MigrateError {
    fn source_db(err: sqlx::Error) -> Self {
        MigrateError::Source(format!("reading the source: {err}"))
    }
}

/// What a completed migration did, printed as its summary.
#[derive(Debug, Clone)]
pub struct Summary {
    from: String,
    to: String,
    epoch: String,
    last_seq: i64,
    /// Found complete already: nothing was copied, only verified.
    already: bool,
    resumed: bool,
    counts: Vec<(&'static str, i64)>,
    envelopes_this_run: i64,
    copy: Duration,
    verify: Duration,
    sessions: usize,
}

impl fmt::Display for Summary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let how = if self.already {
            "already migrated"
        } else if self.resumed {
            "migrated (resumed)"
        } else {
            "migrated"
        };
        writeln!(
            f,
            "{how} {} to {} (epoch {}, last seq {})",
            self.from, self.to, self.epoch, self.last_seq
        )?;
        let counts: Vec<String> = self
            .counts
            .iter()
            .map(|(table, n)| format!("{table} {n}"))
            .collect();
        writeln!(f, "  rows: {}", counts.join(", "))?;
        if !self.already {
            let secs = self.copy.as_secs_f64();
            writeln!(
                f,
                "  copied {} envelopes in {secs:.1} s ({:.0} envelopes/s)",
                self.envelopes_this_run,
                self.envelopes_this_run as f64 / secs.max(1e-3)
            )?;
        }
        writeln!(
            f,
            "  verified in {:.1} s: every row of every table, the highest seq, the host epoch \
             and last seq, and {} session read-model rows against a fold of the copied log",
            self.verify.as_secs_f64(),
            self.sessions
        )
    }
}

/// Runs `tether migrate`.
pub async fn run(args: &MigrateArgs) -> Result<Summary, MigrateError> {
    let path = sqlite_path(&args.from)?;
    postgres_url(&args.to)?;
    let options = StoreOptions {
        connect_timeout: Duration::from_secs(args.connect_timeout_secs),
        max_connections: 4,
        host_id: None,
        stalled_transaction: None,
    };
    let source = Source::open(path).await?;
    let host = source.host().await?;
    let target = Target::connect(&args.to, options.connect_timeout).await?;
    let result = migrate(&source, &target, &host, args, &options).await;
    target.close().await;
    source.close().await;
    result
}

async fn migrate(
    source: &Source,
    target: &Target,
    host: &source::Host,
    args: &MigrateArgs,
    options: &StoreOptions,
) -> Result<Summary, MigrateError> {
    let found = target.inspect(host).await?;
    let mut summary = Summary {
        from: format!("sqlite:{}", source.path),
        to: target.shown(),
        epoch: host.epoch.clone(),
        last_seq: host.last_seq,
        already: false,
        resumed: found == Found::Partial,
        counts: Vec::new(),
        envelopes_this_run: 0,
        copy: Duration::ZERO,
        verify: Duration::ZERO,
        sessions: 0,
    };
    match found {
        Found::Complete { last_seq } if last_seq == host.last_seq => {
            note("the target already holds this database; verifying it");
            summary.already = true;
        }
        Found::Complete { last_seq } => {
            return Err(MigrateError::Target(format!(
                "the target already holds this database (epoch {}) and has moved on since: its \
                 last seq is {last_seq}, the source's {}",
                host.epoch, host.last_seq
            )));
        }
        Found::Empty => {
            target.migrate_schema(options).await?;
            target.begin_copy(host).await?;
        }
        Found::Partial => {
            note("resuming an interrupted migration of this source");
            target.migrate_schema(options).await?;
        }
    }
    if !summary.already {
        let started = Instant::now();
        let batch_rows = args.batch_rows as usize;
        for table in TABLES {
            let copied = copy_table(source, target, table, batch_rows).await?;
            if table.name == "log" {
                summary.envelopes_this_run = copied;
            }
        }
        target.finish(host).await?;
        summary.copy = started.elapsed();
    }
    let started = Instant::now();
    let verified = verify::verify(source, target, host, options).await?;
    summary.verify = started.elapsed();
    summary.counts = verified.counts;
    summary.sessions = verified.sessions;
    target.drop_progress().await?;
    Ok(summary)
}

/// The file `--from` names: `sqlite:PATH`, `sqlite://PATH` or a path.
fn sqlite_path(from: &str) -> Result<&str, MigrateError> {
    let path = from
        .strip_prefix("sqlite://")
        .or_else(|| from.strip_prefix("sqlite:"))
        .unwrap_or(from);
    if path.is_empty() || path.contains("://") {
        return Err(MigrateError::Usage(format!(
            "--from {} is not a SQLite database: use sqlite:PATH or a file path (tether migrate \
             copies SQLite to Postgres)",
            redact_url(from)
        )));
    }
    Ok(path)
}

/// Checks `--to` names Postgres.
fn postgres_url(to: &str) -> Result<(), MigrateError> {
    if to.starts_with("postgres://") || to.starts_with("postgresql://") {
        Ok(())
    } else {
        Err(MigrateError::Usage(format!(
            "--to {} is not a Postgres URL: use postgres://USER:PASSWORD@HOST/DB",
            redact_url(to)
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_of_the_wrong_kind_are_refused() {
        assert_eq!(sqlite_path("sqlite:a.db").unwrap(), "a.db");
        assert_eq!(sqlite_path("sqlite:///tmp/a.db").unwrap(), "/tmp/a.db");
        assert_eq!(sqlite_path("./a.db").unwrap(), "./a.db");
        assert!(matches!(
            sqlite_path("postgres://u@h/d"),
            Err(MigrateError::Usage(_))
        ));
        assert!(matches!(sqlite_path(""), Err(MigrateError::Usage(_))));
        assert!(postgres_url("postgresql://u@h/d").is_ok());
        let err = postgres_url("sqlite:b.db").unwrap_err().to_string();
        assert!(err.contains("not a Postgres URL"), "{err}");
        let err = sqlite_path("mysql://u:secret@h/d").unwrap_err().to_string();
        assert!(!err.contains("secret"), "{err}");
    }
}
