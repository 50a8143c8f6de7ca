//! `tether backup PATH`: a consistent copy of a SQLite database, taken
//! while the server runs (README, "Backups").
//!
//! The copy is SQLite's own `VACUUM INTO`: one read transaction, so the
//! copy is the database as of one moment (every committed envelope up to
//! some seq, nothing half written), compacted, in rollback-journal mode,
//! and the server goes on writing meanwhile (WAL: readers do not block the
//! writer). It is written beside the target as `PATH.partial`, checked
//! (`PRAGMA integrity_check`), synced and only then linked as `PATH`: a
//! file at `PATH` is always a whole, checked backup.

use std::path::{Path, PathBuf};
use std::time::Duration;

use sqlx::sqlite::SqliteConnectOptions;
use sqlx::{ConnectOptions, Connection, SqliteConnection};

/// What a backup holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BackupReport {
    /// Where it is.
    pub path: PathBuf,
    /// Its size in bytes.
    pub bytes: u64,
    /// Sessions in it.
    pub sessions: i64,
    /// Envelopes in it.
    pub envelopes: i64,
    /// The highest serverSeq in it.
    pub last_seq: i64,
}

impl std::fmt::Display for BackupReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(
            f,
            "backed up to {} ({} bytes): {} sessions, {} envelopes, up to serverSeq {}; \
             integrity check ok",
            self.path.display(),
            self.bytes,
            self.sessions,
            self.envelopes,
            self.last_seq
        )
    }
}

/// Copies the SQLite database at `source` to the new file `target`.
pub async fn backup(source: &str, target: &Path) -> Result<BackupReport, String> {
    if !Path::new(source).exists() {
        return Err(format!("there is no SQLite database at {source}"));
    }
    if target.exists() {
        return Err(format!(
            "{} exists already; a backup never overwrites a file: name a new one",
            target.display()
        ));
    }
    let partial = PathBuf::from(format!("{}.partial", target.display()));
    // A partial file is what an interrupted backup left behind.
    let _ = std::fs::remove_file(&partial);
    let copied = copy(source, &partial).await;
    let checked = match copied {
        Ok(()) => check(&partial).await,
        Err(err) => Err(err),
    };
    let report = match checked {
        Ok(report) => report,
        Err(err) => {
            let _ = std::fs::remove_file(&partial);
            return Err(err);
        }
    };
    let sync = |path: &Path| std::fs::File::open(path).and_then(|file| file.sync_all());
    sync(&partial).map_err(|e| format!("cannot sync {}: {e}", partial.display()))?;
    // A link, not a rename: it fails if a file appeared at `target`
    // meanwhile, where a rename would replace it.
    let linked = std::fs::hard_link(&partial, target);
    let _ = std::fs::remove_file(&partial);
    linked.map_err(|e| format!("cannot name the backup {}: {e}", target.display()))?;
    if let Some(dir) = target.parent().filter(|d| !d.as_os_str().is_empty()) {
        let _ = sync(dir);
    }
    let bytes = std::fs::metadata(target).map(|m| m.len()).unwrap_or(0);
    Ok(BackupReport {
        path: target.to_owned(),
        bytes,
        ..report
    })
}

async fn open(path: &Path, read_only: bool) -> Result<SqliteConnection, String> {
    SqliteConnectOptions::new()
        .filename(path)
        .create_if_missing(false)
        .read_only(read_only)
        // The server may be mid-checkpoint; wait for it rather than fail.
        .busy_timeout(Duration::from_secs(30))
        .disable_statement_logging()
        .connect()
        .await
        .map_err(|e| format!("cannot open {}: {e}", path.display()))
}

async fn copy(source: &str, partial: &Path) -> Result<(), String> {
    let mut conn = open(Path::new(source), false).await?;
    let into = partial
        .to_str()
        .ok_or_else(|| format!("{} is not a UTF-8 path", partial.display()))?;
    let copied = sqlx::query("VACUUM INTO ?")
        .bind(into)
        .execute(&mut conn)
        .await
        .map_err(|e| format!("the copy failed: {e}"));
    let _ = conn.close().await;
    copied.map(|_| ())
}

async fn check(copy: &Path) -> Result<BackupReport, String> {
    let mut conn = open(copy, true).await?;
    let fail = |e: sqlx::Error| format!("cannot read the copy: {e}");
    let verdict: String = sqlx::query_scalar("PRAGMA integrity_check")
        .fetch_one(&mut conn)
        .await
        .map_err(fail)?;
    if verdict != "ok" {
        return Err(format!(
            "the copy fails SQLite's integrity check: {verdict}"
        ));
    }
    let count = |table: &str| format!("SELECT COUNT(*) FROM {table}");
    let sessions: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(count("sessions")))
        .fetch_one(&mut conn)
        .await
        .map_err(fail)?;
    let envelopes: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(count("log")))
        .fetch_one(&mut conn)
        .await
        .map_err(fail)?;
    let last_seq: i64 = sqlx::query_scalar("SELECT last_seq FROM host WHERE id = 1")
        .fetch_optional(&mut conn)
        .await
        .map_err(fail)?
        .unwrap_or(0);
    let _ = conn.close().await;
    Ok(BackupReport {
        path: copy.to_owned(),
        bytes: 0,
        sessions,
        envelopes,
        last_seq,
    })
}
