//! Opening a store: the connection settings, the database URL (which
//! backend it names, its files, its redacted form) and `tether backup`.

use std::sync::Arc;
use std::time::Duration;

use super::postgres::PostgresStore;
use super::sqlite::{self, SqliteStore};
use super::{BackupReport, Store, StoreError};

/// Connection settings shared by the backends.
#[derive(Debug, Clone)]
pub struct StoreOptions {
    /// How long to wait for a connection (also when first connecting).
    pub connect_timeout: Duration,
    /// Largest read pool size.
    pub max_connections: u32,
    /// Postgres: the host identity to write as and claim (see
    /// `ServeArgs::host_id`); a fresh UUID when unset.
    pub host_id: Option<String>,
    /// Postgres: how long the database lets a transaction of this host sit
    /// waiting for its next statement before it ends the connection
    /// (`idle_in_transaction_session_timeout`). A host cut off from the
    /// database mid-transaction would otherwise keep its locks (the host
    /// row every append locks) and stop every other host for as long as
    /// the partition lasts. `None`: the server's setting.
    pub stalled_transaction: Option<Duration>,
}

impl Default for StoreOptions {
    fn default() -> Self {
        Self {
            connect_timeout: Duration::from_secs(5),
            max_connections: 8,
            host_id: None,
            stalled_transaction: None,
        }
    }
}

/// Opens the store a database URL names: `postgres://…`/`postgresql://…`,
/// `sqlite:PATH`/`sqlite://PATH`, or a plain file path (SQLite).
pub async fn open(url: &str, options: &StoreOptions) -> Result<Arc<dyn Store>, StoreError> {
    match parse_url(url)? {
        Target::Postgres => Ok(Arc::new(PostgresStore::open(url, options).await?)),
        Target::Sqlite(path) => Ok(Arc::new(SqliteStore::open(&path, options).await?)),
    }
}

/// Which backend a database URL names.
pub(crate) enum Target {
    /// Postgres.
    Postgres,
    /// SQLite, at this path.
    Sqlite(String),
}

/// The backend `url` names, or why it names none.
pub(crate) fn parse_url(url: &str) -> Result<Target, StoreError> {
    if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        return Ok(Target::Postgres);
    }
    let path = url
        .strip_prefix("sqlite://")
        .or_else(|| url.strip_prefix("sqlite:"))
        .unwrap_or(url);
    // Anything else with a scheme is a mistake, not a file name.
    if path.is_empty() || path.contains("://") {
        return Err(StoreError::UnsupportedUrl(redact_url(url)));
    }
    Ok(Target::Sqlite(path.to_owned()))
}

/// Whether the store `url` names commits on a thread of its own (SQLite's
/// writer), beside the async runtime's workers.
pub fn has_writer_thread(url: &str) -> bool {
    matches!(parse_url(url), Ok(Target::Sqlite(_)))
}

/// The files a SQLite database URL keeps its data in (the database, its
/// WAL, shared memory and lock files); none for Postgres. No agent may
/// reach them.
pub fn data_files(url: &str) -> Vec<std::path::PathBuf> {
    match parse_url(url) {
        Ok(Target::Sqlite(path)) => {
            let path = std::path::PathBuf::from(path);
            let path = std::path::absolute(&path).unwrap_or(path);
            let mut files = vec![path.clone()];
            for suffix in ["-wal", "-shm", "-lock"] {
                let mut name = path.clone().into_os_string();
                name.push(suffix);
                files.push(name.into());
            }
            files
        }
        _ => Vec::new(),
    }
}

/// Query parameters of a database URL whose values are credentials
/// (libpq's `password` and `sslpassword`, and the forms other drivers use).
const SECRET_PARAMS: [&str; 6] = [
    "password",
    "sslpassword",
    "pass",
    "passwd",
    "secret",
    "token",
];

/// The URL with every credential replaced by `***`, for logs and errors:
/// the password of its user info (`user:password@`) and the values of
/// credential query parameters (`?password=`, `&sslpassword=`, …).
pub fn redact_url(url: &str) -> String {
    let (base, query) = match url.split_once('?') {
        Some((base, query)) => (base, Some(query)),
        None => (url, None),
    };
    let mut out = match base.split_once("://") {
        Some((scheme, rest)) => match rest.rsplit_once('@') {
            Some((userinfo, host)) => match userinfo.split_once(':') {
                Some((user, _password)) => format!("{scheme}://{user}:***@{host}"),
                None => base.to_owned(),
            },
            None => base.to_owned(),
        },
        None => base.to_owned(),
    };
    if let Some(query) = query {
        let pairs: Vec<String> = query
            .split('&')
            .map(|pair| match pair.split_once('=') {
                Some((key, _)) if SECRET_PARAMS.contains(&key.to_ascii_lowercase().as_str()) => {
                    format!("{key}=***")
                }
                _ => pair.to_owned(),
            })
            .collect();
        out.push('?');
        out.push_str(&pairs.join("&"));
    }
    out
}

/// `tether backup`: copies the SQLite database `url` names to the new file
/// `target`, consistently, while the server runs. Postgres has its own
/// tools (README, "Backups"); asked for one, this says so.
pub async fn backup(url: &str, target: &std::path::Path) -> Result<BackupReport, String> {
    match parse_url(url).map_err(|e| e.to_string())? {
        Target::Sqlite(path) => sqlite::backup::backup(&path, target).await,
        Target::Postgres => Err(
            "tether backup copies a SQLite database; back Postgres up with its own tools \
             (pg_dump, or pg_basebackup with WAL archiving: README, \"Backups\")"
                .to_owned(),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_each_url_form() {
        assert!(matches!(
            parse_url("postgres://a@b/c"),
            Ok(Target::Postgres)
        ));
        assert!(matches!(
            parse_url("postgresql://a@b/c"),
            Ok(Target::Postgres)
        ));
        assert!(matches!(parse_url("sqlite://./t.db"), Ok(Target::Sqlite(p)) if p == "./t.db"));
        assert!(matches!(parse_url("sqlite:t.db"), Ok(Target::Sqlite(p)) if p == "t.db"));
        assert!(matches!(parse_url("./t.db"), Ok(Target::Sqlite(p)) if p == "./t.db"));
        assert!(matches!(
            parse_url("mysql://root@h/db"),
            Err(StoreError::UnsupportedUrl(_))
        ));
        assert!(matches!(parse_url(""), Err(StoreError::UnsupportedUrl(_))));
    }

    #[test]
    fn redacts_passwords_only() {
        assert_eq!(
            redact_url("postgres://me:secret@db:5432/t"),
            "postgres://me:***@db:5432/t"
        );
        assert_eq!(redact_url("postgres://me@db/t"), "postgres://me@db/t");
        assert_eq!(redact_url("./tether.db"), "./tether.db");
        // Every credential form libpq takes, and a password holding '@'.
        for (url, kept) in [
            (
                "postgres://db/t?user=me&password=hunter2&sslmode=require",
                "postgres://db/t?user=me&password=***&sslmode=require",
            ),
            (
                "postgresql://me@db/t?sslpassword=hunter2",
                "postgresql://me@db/t?sslpassword=***",
            ),
            ("postgres://me:hun@ter2@db/t", "postgres://me:***@db/t"),
            (
                "postgres://db/t?PASSWORD=hunter2",
                "postgres://db/t?PASSWORD=***",
            ),
        ] {
            assert_eq!(redact_url(url), kept);
            assert!(!redact_url(url).contains("hunter2"));
        }
    }
}
