//! The SQLite side: locked against a running server, opened read-only.

use std::path::Path;
use std::time::Duration;

use futures_util::TryStreamExt;
use sqlx::sqlite::{SqliteConnectOptions, SqlitePool, SqlitePoolOptions, SqliteRow};
use sqlx::{AssertSqlSafe, Row};

use super::MigrateError;
use super::tables::{Cell, Table, cells};

/// How long a read waits on a lock held by another process (a backup tool
/// reading the file); the server's own lock is refused before this matters.
const BUSY_TIMEOUT: Duration = Duration::from_secs(5);

/// The source database, with the server's lock held.
#[derive(Debug)]
pub(super) struct Source {
    pub path: String,
    pub pool: SqlitePool,
    /// The exclusive lock on `<path>-lock`, the one `tether serve` takes:
    /// while it is held no server can open the file, and it could not be
    /// taken while one had it open. Released when dropped.
    _lock: std::fs::File,
}

/// The host row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Host {
    pub epoch: String,
    pub last_seq: i64,
}

impl Source {
    /// Locks and opens the SQLite database at `path`, read-only, and checks
    /// it is a Tether database this release wrote.
    pub async fn open(path: &str) -> Result<Self, MigrateError> {
        let source = |reason: String| MigrateError::Source(reason);
        match std::fs::metadata(path) {
            Ok(meta) if meta.is_file() => {}
            Ok(_) => return Err(source(format!("the source {path} is not a file"))),
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => {
                return Err(source(format!("the source database {path} does not exist")));
            }
            Err(err) => return Err(source(format!("cannot read the source {path}: {err}"))),
        }
        let lock = lock(path)?;
        // Read-only: nothing here may change the source. The connection
        // still reads a write-ahead log a killed server left behind.
        let options = SqliteConnectOptions::new()
            .filename(Path::new(path))
            .read_only(true)
            .busy_timeout(BUSY_TIMEOUT);
        let pool = SqlitePoolOptions::new()
            .max_connections(2)
            .connect_with(options)
            .await
            .map_err(|e| source(format!("cannot open the source {path}: {e}")))?;
        let source = Self {
            path: path.to_owned(),
            pool,
            _lock: lock,
        };
        source.check_schema().await?;
        Ok(source)
    }

    /// The applied migrations must be exactly this release's, and the
    /// tables exactly the ones copied.
    async fn check_schema(&self) -> Result<(), MigrateError> {
        let fail = |reason: String| MigrateError::Source(reason);
        let applied: Vec<i64> = sqlx::query_scalar(
            "SELECT version FROM _sqlx_migrations WHERE success ORDER BY version",
        )
        .fetch_all(&self.pool)
        .await
        .map_err(|e| {
            fail(format!(
                "the source {} is not a Tether database ({e})",
                self.path
            ))
        })?;
        let known: Vec<i64> = sqlx::migrate!("../migrations/sqlite")
            .iter()
            .map(|m| m.version)
            .collect();
        if applied != known {
            let at = applied.last().copied().unwrap_or(0);
            let expected = known.last().copied().unwrap_or(0);
            return Err(fail(if at > expected {
                format!(
                    "the source is at schema version {at}, newer than this tether's {expected}: \
                     migrate with the release that wrote it"
                )
            } else {
                format!(
                    "the source is at schema version {at}, this tether expects {expected}: start \
                     this release's tether serve on it once (it upgrades the file), stop it, then \
                     migrate"
                )
            }));
        }
        let found = schema(&self.pool).await.map_err(MigrateError::source_db)?;
        super::tables::check_schema("source", &found).map_err(fail)
    }

    /// The host row.
    pub async fn host(&self) -> Result<Host, MigrateError> {
        let row: Option<(String, i64)> =
            sqlx::query_as("SELECT epoch, last_seq FROM host WHERE id = 1")
                .fetch_optional(&self.pool)
                .await
                .map_err(MigrateError::source_db)?;
        let (epoch, last_seq) = row.ok_or_else(|| {
            MigrateError::Source("the source has no host row: it is not a Tether database".into())
        })?;
        Ok(Host { epoch, last_seq })
    }

    /// Rows in `table`.
    pub async fn count(&self, table: &Table) -> Result<i64, MigrateError> {
        sqlx::query_scalar(AssertSqlSafe(format!(
            "SELECT count(*) FROM {}",
            table.name
        )))
        .fetch_one(&self.pool)
        .await
        .map_err(MigrateError::source_db)
    }

    /// The highest seq in the log (0 when empty).
    pub async fn max_seq(&self) -> Result<i64, MigrateError> {
        sqlx::query_scalar("SELECT coalesce(max(seq), 0) FROM log")
            .fetch_one(&self.pool)
            .await
            .map_err(MigrateError::source_db)
    }

    /// `table`'s rows with a key above `after` (all when `None`), in key
    /// order, streamed.
    pub fn rows_after<'a>(
        &'a self,
        table: &'a Table,
        after: Option<&'a [Cell]>,
    ) -> impl futures_util::Stream<Item = Result<Vec<Cell>, sqlx::Error>> + Send + 'a {
        let keys = table.key_list("");
        let mut sql = format!("SELECT {} FROM {}", table.column_list(), table.name);
        if after.is_some() {
            let marks = vec!["?"; table.key.len()].join(", ");
            sql.push_str(&format!(" WHERE ({keys}) > ({marks})"));
        }
        sql.push_str(&format!(" ORDER BY {keys}"));
        let mut query = sqlx::query(AssertSqlSafe(sql));
        for key in after.unwrap_or_default() {
            query = match key {
                Cell::Int(n) => query.bind(*n),
                Cell::Text(t) => query.bind(t.clone()),
                Cell::Bool(b) => query.bind(*b),
                Cell::Bytes(b) => query.bind(b.clone()),
                Cell::Null => query.bind(None::<String>),
            };
        }
        query
            .fetch(&self.pool)
            .and_then(move |row: SqliteRow| async move { cells(&row, table) })
    }

    /// Closes the pool; the lock goes with `self`.
    pub async fn close(self) {
        self.pool.close().await;
    }
}

/// Every table (but SQLite's own) and its columns, in no particular order.
pub(super) async fn schema(pool: &SqlitePool) -> Result<Vec<(String, Vec<String>)>, sqlx::Error> {
    let tables: Vec<String> = sqlx::query_scalar(
        "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%'",
    )
    .fetch_all(pool)
    .await?;
    let mut found = Vec::new();
    for table in tables {
        let columns: Vec<String> = sqlx::query("SELECT name FROM pragma_table_info(?)")
            .bind(&table)
            .fetch_all(pool)
            .await?
            .iter()
            .map(|row| row.try_get::<String, _>(0))
            .collect::<Result<_, _>>()?;
        found.push((table, columns));
    }
    Ok(found)
}

/// Takes the exclusive lock `tether serve` holds on `<path>-lock` (see the
/// SQLite store), so that the source cannot change during the copy.
fn lock(path: &str) -> Result<std::fs::File, MigrateError> {
    let lock_path = format!("{path}-lock");
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(&lock_path)
        .map_err(|e| MigrateError::Source(format!("cannot open the lock file {lock_path}: {e}")))?;
    match file.try_lock() {
        Ok(()) => Ok(file),
        Err(std::fs::TryLockError::WouldBlock) => Err(MigrateError::Source(format!(
            "the source {path} is in use by a running tether server (it holds {lock_path}); \
             stop the server first"
        ))),
        Err(std::fs::TryLockError::Error(err)) => Err(MigrateError::Source(format!(
            "cannot lock {lock_path}: {err}"
        ))),
    }
}
