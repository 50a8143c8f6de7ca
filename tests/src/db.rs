//! A fresh database per test on either backend, removed when the test
//! ends, and what a test does to it directly (statements, counts, a held
//! write lock).

use std::sync::Arc;

use tether_server::store::{self, Store, StoreOptions};

/// The environment variable naming the Postgres server for tests.
pub const POSTGRES_URL_ENV: &str = "TETHER_TEST_POSTGRES_URL";
/// Set to `1` to fail, not skip, when Postgres is not configured.
pub const REQUIRE_POSTGRES_ENV: &str = "TETHER_TEST_REQUIRE_POSTGRES";

/// Which backend a test runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    /// A SQLite file in a fresh temporary directory.
    Sqlite,
    /// A freshly created Postgres database.
    Postgres,
}

/// A fresh, empty database that is removed when dropped.
#[derive(Debug)]
pub struct TestDb {
    url: String,
    backend: Backend,
    _dir: Option<tempfile::TempDir>,
    postgres: Option<PostgresDb>,
}

#[derive(Debug)]
struct PostgresDb {
    admin_url: String,
    name: String,
}

impl TestDb {
    /// A database on `backend`, or `None` (after a loud message) when that
    /// backend is not configured for this run.
    pub async fn new(backend: Backend) -> Option<Self> {
        match backend {
            Backend::Sqlite => Some(Self::sqlite()),
            Backend::Postgres => Self::postgres().await,
        }
    }

    /// A SQLite database file in a new temporary directory.
    pub fn sqlite() -> Self {
        let dir = tempfile::tempdir().expect("create a temporary directory");
        let path = dir.path().join("tether.db");
        Self {
            url: format!("sqlite:{}", path.display()),
            backend: Backend::Sqlite,
            _dir: Some(dir),
            postgres: None,
        }
    }

    /// A SQLite database in `dir` (which the caller keeps).
    pub fn sqlite_in(dir: &std::path::Path) -> Self {
        Self {
            url: format!("sqlite:{}", dir.join("tether.db").display()),
            backend: Backend::Sqlite,
            _dir: None,
            postgres: None,
        }
    }

    /// A new Postgres database, or `None` when Postgres is not configured.
    pub async fn postgres() -> Option<Self> {
        let Ok(admin_url) = std::env::var(POSTGRES_URL_ENV) else {
            if std::env::var(REQUIRE_POSTGRES_ENV).as_deref() == Ok("1") {
                panic!("{POSTGRES_URL_ENV} is not set but {REQUIRE_POSTGRES_ENV}=1");
            }
            // Written to stderr directly: libtest captures `eprintln!` of
            // passing tests, and a skip must be seen. Once per test binary.
            static ONCE: std::sync::Once = std::sync::Once::new();
            ONCE.call_once(|| {
                use std::io::Write as _;
                let _ = writeln!(
                    std::io::stderr(),
                    "\n*** SKIPPED: the Postgres half of these tests: set {POSTGRES_URL_ENV} \
                     (e.g. postgres://postgres@127.0.0.1:5432/postgres) to run it ***\n"
                );
            });
            return None;
        };
        let name = format!("tether_t_{}", uuid::Uuid::new_v4().simple());
        let admin = sqlx::PgPool::connect(&admin_url)
            .await
            .unwrap_or_else(|e| panic!("cannot connect to {POSTGRES_URL_ENV}: {e}"));
        sqlx::query(sqlx::AssertSqlSafe(format!("CREATE DATABASE {name}")))
            .execute(&admin)
            .await
            .expect("create a test database");
        admin.close().await;
        let mut url = reqwest::Url::parse(&admin_url).expect("a valid Postgres URL");
        url.set_path(&format!("/{name}"));
        Some(Self {
            url: url.to_string(),
            backend: Backend::Postgres,
            _dir: None,
            postgres: Some(PostgresDb { admin_url, name }),
        })
    }

    /// The database URL, as `tether serve --database-url` takes it.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// Which backend this is.
    pub fn backend(&self) -> Backend {
        self.backend
    }

    /// Opens (and migrates) a store on this database. Call again after
    /// closing or abandoning one to simulate a restart.
    pub async fn open(&self) -> Arc<dyn Store> {
        store::open(&self.url, &StoreOptions::default())
            .await
            .unwrap_or_else(|e| panic!("open {}: {e}", self.url))
    }

    /// Runs a statement straight on the database (what time passing, or
    /// an older release, would have left in its rows).
    pub async fn execute(&self, sql: &str) {
        let sql = sqlx::AssertSqlSafe(sql.to_owned());
        match self.backend {
            Backend::Sqlite => {
                let pool = sqlx::SqlitePool::connect(&self.url).await.expect("connect");
                sqlx::query(sql).execute(&pool).await.expect("execute");
                pool.close().await;
            }
            Backend::Postgres => {
                let pool = sqlx::PgPool::connect(&self.url).await.expect("connect");
                sqlx::query(sql).execute(&pool).await.expect("execute");
                pool.close().await;
            }
        }
    }

    /// Takes the database's write lock and holds it until
    /// [`HeldWrites::release`] (SQLite: `BEGIN IMMEDIATE`; Postgres:
    /// `table` locked against every write): what a long transaction does
    /// to a host's commits, while its reads go on.
    pub async fn hold_writes(&self, table: &str) -> HeldWrites {
        use sqlx::Connection as _;
        match self.backend {
            Backend::Sqlite => {
                let mut db = sqlx::SqliteConnection::connect(&self.url)
                    .await
                    .expect("connect");
                sqlx::query("BEGIN IMMEDIATE")
                    .execute(&mut db)
                    .await
                    .expect("take the write lock");
                HeldWrites::Sqlite(db)
            }
            Backend::Postgres => {
                let mut db = sqlx::PgConnection::connect(&self.url)
                    .await
                    .expect("connect");
                sqlx::query("BEGIN").execute(&mut db).await.expect("begin");
                let lock = format!("LOCK TABLE {table} IN EXCLUSIVE MODE");
                sqlx::query(sqlx::AssertSqlSafe(lock))
                    .execute(&mut db)
                    .await
                    .expect("lock the table");
                HeldWrites::Postgres(db)
            }
        }
    }

    /// The single integer a query answers, straight from the database.
    pub async fn count(&self, sql: &str) -> i64 {
        let sql = sqlx::AssertSqlSafe(sql.to_owned());
        match self.backend {
            Backend::Sqlite => {
                let pool = sqlx::SqlitePool::connect(&self.url).await.expect("connect");
                let n = sqlx::query_scalar(sql)
                    .fetch_one(&pool)
                    .await
                    .expect("count");
                pool.close().await;
                n
            }
            Backend::Postgres => {
                let pool = sqlx::PgPool::connect(&self.url).await.expect("connect");
                let n = sqlx::query_scalar(sql)
                    .fetch_one(&pool)
                    .await
                    .expect("count");
                pool.close().await;
                n
            }
        }
    }
}

/// A write lock a test holds on its database (see [`TestDb::hold_writes`]).
#[derive(Debug)]
pub enum HeldWrites {
    Sqlite(sqlx::SqliteConnection),
    Postgres(sqlx::PgConnection),
}

impl HeldWrites {
    /// Lets the writes it held back go on.
    pub async fn release(self) {
        match self {
            Self::Sqlite(mut db) => {
                sqlx::query("COMMIT")
                    .execute(&mut db)
                    .await
                    .expect("commit");
            }
            Self::Postgres(mut db) => {
                sqlx::query("COMMIT")
                    .execute(&mut db)
                    .await
                    .expect("commit");
            }
        }
    }
}

impl Drop for TestDb {
    fn drop(&mut self) {
        let Some(pg) = self.postgres.take() else {
            return;
        };
        // Drop runs outside any runtime guarantee, so clean up on a thread of
        // its own. Best effort: a leftover database only costs disk.
        let cleanup = std::thread::spawn(move || {
            let Ok(runtime) = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            else {
                return;
            };
            runtime.block_on(async move {
                if let Ok(admin) = sqlx::PgPool::connect(&pg.admin_url).await {
                    let sql = format!("DROP DATABASE IF EXISTS {} WITH (FORCE)", pg.name);
                    let _ = sqlx::query(sqlx::AssertSqlSafe(sql)).execute(&admin).await;
                    admin.close().await;
                }
            });
        });
        let _ = cleanup.join();
    }
}
