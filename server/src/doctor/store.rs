//! The store's checks: reachable, migrated by this binary's migrations (or
//! about to be), room on its disk, and, on Postgres, the clock against the
//! database's. Opened read-only: the doctor never migrates or writes.

use std::path::Path;

use sqlx::Connection;
use sqlx::migrate::Migrator;

use super::Report;
use crate::config::DatabaseArgs;
use crate::store::{Target, parse_url, redact_url};

/// Free space below this on the database's file system fails the check.
const FAIL_FREE_BYTES: u64 = 64 << 20;
/// And below this, warns.
const WARN_FREE_BYTES: u64 = 1 << 30;

pub(super) async fn check(args: &DatabaseArgs, report: &mut Report) {
    let shown = redact_url(&args.database_url);
    match parse_url(&args.database_url) {
        Err(err) => report.fail("store", format!("{err}")),
        Ok(Target::Sqlite(path)) => sqlite(Path::new(&path), report).await,
        Ok(Target::Postgres) => postgres(args, &shown, report).await,
    }
}

async fn sqlite(path: &Path, report: &mut Report) {
    let dir = match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir.to_path_buf(),
        _ => Path::new(".").to_path_buf(),
    };
    if !path.exists() {
        match probe_writable(&dir) {
            Ok(()) => report.ok(
                "store",
                format!(
                    "SQLite {} does not exist yet; tether serve creates and migrates it",
                    path.display()
                ),
            ),
            Err(err) => report.fail(
                "store",
                format!(
                    "SQLite {} cannot be created: {} is not writable ({err})",
                    path.display(),
                    dir.display()
                ),
            ),
        }
        free_space(&dir, report);
        return;
    }
    let options = sqlx::sqlite::SqliteConnectOptions::new()
        .filename(path)
        .read_only(true);
    let mut connection = match sqlx::SqliteConnection::connect_with(&options).await {
        Ok(connection) => connection,
        Err(err) => {
            report.fail(
                "store",
                format!("SQLite {} cannot be opened: {err}", path.display()),
            );
            return;
        }
    };
    report.ok("store", format!("SQLite {} opens", path.display()));
    if let Err(err) = probe_writable(&dir) {
        report.fail(
            "store",
            format!(
                "{} is not writable ({err}): SQLite needs to write its WAL there",
                dir.display()
            ),
        );
    }
    let rows = sqlx::query_as(APPLIED).fetch_all(&mut connection).await;
    migrations(&crate::store::sqlite::MIGRATOR, applied(rows), report);
    let _ = connection.close().await;
    free_space(&dir, report);
}

async fn postgres(args: &DatabaseArgs, shown: &str, report: &mut Report) {
    let options: sqlx::postgres::PgConnectOptions = match args.database_url.parse() {
        Ok(options) => options,
        Err(err) => {
            report.fail("store", format!("{shown} is not a Postgres URL: {err}"));
            return;
        }
    };
    let timeout = std::time::Duration::from_secs(args.database_connect_timeout_secs.max(1));
    let connected = tokio::time::timeout(timeout, sqlx::PgConnection::connect_with(&options)).await;
    let mut connection = match connected {
        Ok(Ok(connection)) => connection,
        Ok(Err(err)) => {
            report.fail(
                "store",
                format!("Postgres {shown} cannot be reached: {err}"),
            );
            return;
        }
        Err(_) => {
            report.fail(
                "store",
                format!("Postgres {shown} did not answer within {timeout:?}"),
            );
            return;
        }
    };
    let version: Result<String, _> = sqlx::query_scalar("SHOW server_version")
        .fetch_one(&mut connection)
        .await;
    report.ok(
        "store",
        format!(
            "Postgres {shown} answers (server {})",
            version.unwrap_or_else(|_| "of unknown version".into())
        ),
    );
    let rows = sqlx::query_as(APPLIED).fetch_all(&mut connection).await;
    migrations(&crate::store::postgres::MIGRATOR, applied(rows), report);
    let skew: Result<f64, _> =
        sqlx::query_scalar("SELECT extract(epoch FROM clock_timestamp())::float8")
            .fetch_one(&mut connection)
            .await;
    if let Ok(theirs) = skew {
        let ours = jiff::Timestamp::now().as_millisecond() as f64 / 1000.0;
        let skew = (ours - theirs).abs();
        if skew > 2.0 {
            report.warn(
                "clock",
                format!(
                    "this machine and the database disagree by {skew:.1} s; hosts sharing \
                     one database should run NTP (token expiry, timestamps)"
                ),
            );
        } else {
            report.ok("clock", format!("within {skew:.3} s of the database's"));
        }
    }
    let _ = connection.close().await;
}

const APPLIED: &str = "SELECT version, success FROM _sqlx_migrations ORDER BY version";

/// The versions the database records as applied, with whether each
/// succeeded; `Ok(None)` when it has no migration table (never migrated).
fn applied(
    answer: Result<Vec<(i64, bool)>, sqlx::Error>,
) -> Result<Option<Vec<(i64, bool)>>, String> {
    match answer {
        Ok(rows) => Ok(Some(rows)),
        Err(err) => {
            let text = err.to_string();
            if text.contains("no such table") || text.contains("does not exist") {
                Ok(None)
            } else {
                Err(text)
            }
        }
    }
}

/// Compares the database's applied migrations with this binary's.
fn migrations(
    migrator: &Migrator,
    applied: Result<Option<Vec<(i64, bool)>>, String>,
    report: &mut Report,
) {
    let known: Vec<i64> = migrator.iter().map(|m| m.version).collect();
    let applied = match applied {
        Ok(applied) => applied,
        Err(err) => {
            report.fail(
                "migrations",
                format!("cannot read the applied migrations: {err}"),
            );
            return;
        }
    };
    let Some(applied) = applied else {
        report.ok(
            "migrations",
            format!(
                "none applied yet; tether serve applies all {} at start",
                known.len()
            ),
        );
        return;
    };
    if let Some((version, _)) = applied.iter().find(|(_, success)| !success) {
        report.fail(
            "migrations",
            format!("migration {version} failed part-way; restore the database from a backup"),
        );
        return;
    }
    if let Some((version, _)) = applied.iter().find(|(v, _)| !known.contains(v)) {
        report.fail(
            "migrations",
            format!(
                "the database has migration {version}, which this binary does not know: it was \
                 migrated by a newer tether; run that version"
            ),
        );
        return;
    }
    let pending = known
        .iter()
        .filter(|v| !applied.iter().any(|(a, _)| a == *v))
        .count();
    if pending == 0 {
        report.ok("migrations", format!("all {} applied", known.len()));
    } else {
        report.ok(
            "migrations",
            format!(
                "{} of {} applied; tether serve applies the other {pending} at start",
                known.len() - pending,
                known.len()
            ),
        );
    }
}

/// Creates and removes a file in `dir`.
fn probe_writable(dir: &Path) -> std::io::Result<()> {
    let probe = dir.join(format!(".tether-doctor-{}", std::process::id()));
    std::fs::write(&probe, b"")?;
    std::fs::remove_file(&probe)
}

fn free_space(dir: &Path, report: &mut Report) {
    let Ok(stat) = rustix::fs::statvfs(dir) else {
        return;
    };
    let free = stat.f_bavail.saturating_mul(stat.f_frsize);
    let shown = format!(
        "{:.1} GiB free on {}",
        free as f64 / (1u64 << 30) as f64,
        dir.display()
    );
    if free < FAIL_FREE_BYTES {
        report.fail(
            "disk",
            format!("only {shown}: commits will fail when it runs out; free some space"),
        );
    } else if free < WARN_FREE_BYTES {
        report.warn("disk", format!("{shown}; the transcript only grows"));
    } else {
        report.ok("disk", shown);
    }
}
