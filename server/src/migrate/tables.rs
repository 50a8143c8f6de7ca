//! The tables `tether migrate` copies, column by column, and the checks
//! that both databases have exactly these columns.
//!
//! The list is written out rather than discovered: each column's type on
//! each side is known, and a table or column added by a later migration
//! that this list does not name makes the migration refuse to start
//! instead of silently leaving data behind (a unit test below fails first).

use serde_json::Value;

/// A column's type as both backends store it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Kind {
    /// `INTEGER` / `BIGINT`, never null.
    Int,
    /// `INTEGER` / `BIGINT`, nullable.
    OptInt,
    /// `TEXT`, never null.
    Text,
    /// `TEXT`, nullable.
    OptText,
    /// `INTEGER` 0/1 on SQLite, `BOOLEAN` on Postgres.
    Bool,
    /// `BLOB` / `BYTEA`, never null.
    Bytes,
}

impl Kind {
    /// The Postgres array type `UNNEST` takes this column as.
    pub(super) fn pg_array(self) -> &'static str {
        match self {
            Kind::Int | Kind::OptInt => "bigint[]",
            Kind::Text | Kind::OptText => "text[]",
            Kind::Bool => "boolean[]",
            Kind::Bytes => "bytea[]",
        }
    }
}

/// One column.
#[derive(Debug, Clone, Copy)]
pub(super) struct Column {
    pub name: &'static str,
    pub kind: Kind,
}

const fn col(name: &'static str, kind: Kind) -> Column {
    Column { name, kind }
}

/// One copied table: its columns and its primary key, which orders the
/// copy (and so is the resume point).
#[derive(Debug, Clone, Copy)]
pub(super) struct Table {
    pub name: &'static str,
    pub columns: &'static [Column],
    /// Indexes into `columns`, in primary-key order.
    pub key: &'static [usize],
}

use Kind::{Bool, Bytes, Int, OptInt, OptText, Text};

/// Every table but `host` (copied on its own, last), the log first.
pub(super) const TABLES: &[Table] = &[
    Table {
        name: "log",
        columns: &[
            col("seq", Int),
            col("channel", Text),
            col("session_id", OptText),
            col("action", Text),
            col("client_id", OptText),
            col("client_seq", OptInt),
            col("origin_scope", Text),
            col("at_ms", Int),
        ],
        key: &[0],
    },
    Table {
        name: "rejections",
        columns: &[
            col("client_id", Text),
            col("origin_scope", Text),
            col("client_seq", Int),
            col("channel", Text),
            col("action", Text),
            col("reason", Text),
            col("at_ms", Int),
        ],
        key: &[0, 1, 2],
    },
    Table {
        name: "snapshots",
        columns: &[
            col("channel", Text),
            col("seq", Int),
            col("state", Text),
            col("at_ms", Int),
        ],
        key: &[0, 1],
    },
    Table {
        name: "sessions",
        columns: &[
            col("id", Text),
            col("project", Text),
            col("provider", Text),
            col("title", OptText),
            col("state", Text),
            col("turns", Int),
            col("resumable", Bool),
            col("last_seq", Int),
            col("created_ms", Int),
            col("updated_ms", Int),
            col("projection", Text),
        ],
        key: &[0],
    },
    Table {
        name: "chats",
        columns: &[col("chat", Text), col("session_id", Text)],
        key: &[0],
    },
    Table {
        name: "client_owners",
        columns: &[
            col("session_id", Text),
            col("client_id", Text),
            col("sub", Text),
        ],
        key: &[0, 1],
    },
    Table {
        name: "attachments",
        columns: &[
            col("session_id", Text),
            col("digest", Text),
            col("content_type", Text),
            col("size", Int),
            col("data", Bytes),
            col("created_ms", Int),
        ],
        key: &[0, 1],
    },
    Table {
        name: "chat_turns",
        columns: &[
            col("chat", Text),
            col("generation", Int),
            col("ordinal", Int),
            col("turn_id", Text),
            col("body", Text),
        ],
        key: &[0, 1, 2],
    },
    Table {
        name: "usage",
        columns: &[
            col("seq", Int),
            col("session_id", Text),
            col("project", Text),
            col("agent", Text),
            col("model", Text),
            col("sub", Text),
            col("at_ms", Int),
            col("input_tokens", Int),
            col("output_tokens", Int),
            col("cost_micros", Int),
            col("currency", Text),
        ],
        key: &[0],
    },
    Table {
        name: "retention",
        columns: &[
            col("project", Text),
            col("days", Int),
            col("updated_ms", Int),
        ],
        key: &[0],
    },
    Table {
        name: "webhooks",
        columns: &[
            col("id", Text),
            col("project", Text),
            col("url", Text),
            col("secret", Text),
            col("events", Text),
            col("created_ms", Int),
            col("created_by", Text),
        ],
        key: &[0],
    },
    Table {
        name: "outbox",
        columns: &[
            col("event_id", Text),
            col("kind", Text),
            col("project", Text),
            col("session_id", OptText),
            col("seq", Int),
            col("at_ms", Int),
            col("data", Text),
        ],
        key: &[0],
    },
    Table {
        name: "deliveries",
        columns: &[
            col("event_id", Text),
            col("webhook_id", Text),
            col("attempts", Int),
            col("next_ms", Int),
            col("delivered_ms", OptInt),
            col("failed_ms", OptInt),
            col("last_status", OptInt),
            col("last_error", OptText),
            col("claimed_by", OptText),
            col("claimed_until", OptInt),
        ],
        key: &[0, 1],
    },
    Table {
        name: "working_contexts",
        columns: &[
            col("project", Text),
            col("session", Text),
            col("body", Text),
            col("saved_ms", Int),
        ],
        key: &[0, 1],
    },
];

/// The `host` table's columns.
pub(super) const HOST_COLUMNS: &[&str] = &["id", "epoch", "last_seq"];

/// Tables the migration itself and sqlx keep, never copied.
/// `leases`, `forwards` and `cluster_hosts` exist only on Postgres (several
/// hosts) and hold nothing a copy needs: leases of a stopped server, writes
/// in flight, hosts' liveness.
///
/// The search index is derived from the log and written differently by
/// each backend (an FTS5 table and its shadow tables on SQLite, a
/// `tsvector` on Postgres): it is not copied; the copy lists every session
/// as pending, and the first host on the target indexes them.
///
/// SQLite's `channels` and `origins` name the numbers its log's indexes
/// hold ([`DERIVED_COLUMNS`]); the log's rows carry the names themselves.
pub(super) const BOOKKEEPING: &[&str] = &[
    "_sqlx_migrations",
    super::target::PROGRESS_TABLE,
    "leases",
    "forwards",
    "cluster_hosts",
    "search_docs",
    "search_pending",
    "search_fts",
    "search_fts_data",
    "search_fts_idx",
    "search_fts_docsize",
    "search_fts_config",
    "channels",
    "origins",
];

impl Table {
    /// `a, b, c`.
    pub(super) fn column_list(&self) -> String {
        self.columns
            .iter()
            .map(|c| c.name)
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// The primary key columns, in order, with `suffix` after each
    /// (`COLLATE "C"` for a byte-wise Postgres order, `""` for SQLite).
    pub(super) fn key_list(&self, text_suffix: &str) -> String {
        self.key
            .iter()
            .map(|&i| {
                let c = self.columns[i];
                match c.kind {
                    Kind::Text | Kind::OptText => format!("{}{text_suffix}", c.name),
                    _ => c.name.to_owned(),
                }
            })
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// The expected column names.
    pub(super) fn names(&self) -> Vec<&'static str> {
        self.columns.iter().map(|c| c.name).collect()
    }
}

/// One value, as read from either side and compared across them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Cell {
    Null,
    Int(i64),
    Text(String),
    Bool(bool),
    Bytes(Vec<u8>),
}

impl Cell {
    /// Bytes this value holds (to bound a batch's memory).
    pub(super) fn size(&self) -> usize {
        match self {
            Cell::Text(text) => text.len(),
            Cell::Bytes(bytes) => bytes.len(),
            _ => 8,
        }
    }

    /// As a JSON value: how a resume key is stored.
    pub(super) fn to_json(&self) -> Value {
        match self {
            Cell::Null => Value::Null,
            Cell::Int(n) => Value::from(*n),
            Cell::Text(t) => Value::from(t.as_str()),
            Cell::Bool(b) => Value::from(*b),
            // Never part of a key; shown by size.
            Cell::Bytes(b) => Value::from(b.len()),
        }
    }

    /// From a stored resume key's JSON value.
    pub(super) fn from_json(value: &Value) -> Option<Cell> {
        match value {
            Value::Null => Some(Cell::Null),
            Value::Number(n) => n.as_i64().map(Cell::Int),
            Value::String(s) => Some(Cell::Text(s.clone())),
            Value::Bool(b) => Some(Cell::Bool(*b)),
            _ => None,
        }
    }

    /// Short, for a mismatch message.
    pub(super) fn show(&self) -> String {
        match self {
            Cell::Null => "NULL".to_owned(),
            Cell::Int(n) => n.to_string(),
            Cell::Bool(b) => b.to_string(),
            Cell::Text(t) if t.chars().count() > 60 => {
                format!("{:?}…", t.chars().take(60).collect::<String>())
            }
            Cell::Text(t) => format!("{t:?}"),
            Cell::Bytes(b) => format!("{} bytes", b.len()),
        }
    }
}

/// Decodes column `i` of a row as `kind`.
pub(super) fn cell<'r, R>(row: &'r R, i: usize, kind: Kind) -> Result<Cell, sqlx::Error>
where
    R: sqlx::Row,
    usize: sqlx::ColumnIndex<R>,
    i64: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    bool: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    String: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    Vec<u8>: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
{
    Ok(match kind {
        Kind::Int => Cell::Int(row.try_get(i)?),
        Kind::OptInt => row
            .try_get::<Option<i64>, _>(i)?
            .map_or(Cell::Null, Cell::Int),
        Kind::Text => Cell::Text(row.try_get(i)?),
        Kind::OptText => row
            .try_get::<Option<String>, _>(i)?
            .map_or(Cell::Null, Cell::Text),
        Kind::Bool => Cell::Bool(row.try_get(i)?),
        Kind::Bytes => Cell::Bytes(row.try_get(i)?),
    })
}

/// Decodes a whole row of `table`.
pub(super) fn cells<'r, R>(row: &'r R, table: &Table) -> Result<Vec<Cell>, sqlx::Error>
where
    R: sqlx::Row,
    usize: sqlx::ColumnIndex<R>,
    i64: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    bool: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    String: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    Vec<u8>: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
{
    table
        .columns
        .iter()
        .enumerate()
        .map(|(i, c)| cell(row, i, c.kind))
        .collect()
}

/// Columns a backend derives from others in the same row: the session
/// indexes' buckets of `last_seq` and `updated_ms` (Postgres generates
/// them; SQLite's writer sets them, its migration 0013), and SQLite's
/// integer keys of the log's channel and origin (its migration 0014; the
/// names are in `channels` and `origins`). Never copied: the target
/// computes its own.
pub(super) const DERIVED_COLUMNS: &[(&str, &str)] = &[
    ("sessions", "recency"),
    ("sessions", "idle_hour"),
    ("log", "channel_id"),
    ("log", "origin_id"),
];

/// Compares a database's tables and columns with [`TABLES`]: `Err` names
/// the first table or column the migration does not know (it would be left
/// behind) or expects and cannot find.
pub(super) fn check_schema(side: &str, found: &[(String, Vec<String>)]) -> Result<(), String> {
    for (table, columns) in found {
        if BOOKKEEPING.contains(&table.as_str()) {
            continue;
        }
        let expected: Vec<&str> = if table == "host" {
            HOST_COLUMNS.to_vec()
        } else if let Some(t) = TABLES.iter().find(|t| t.name == table) {
            t.names()
        } else {
            return Err(format!(
                "the {side} has a table {table:?} this version of tether migrate does not \
                 copy; refusing to leave it behind (use the tether release that wrote it)"
            ));
        };
        let derived = |c: &str| DERIVED_COLUMNS.contains(&(table.as_str(), c));
        if let Some(extra) = columns
            .iter()
            .find(|c| !expected.contains(&c.as_str()) && !derived(c))
        {
            return Err(format!(
                "the {side}'s table {table} has a column {extra:?} this version of tether \
                 migrate does not copy; refusing to leave it behind"
            ));
        }
        if let Some(missing) = expected.iter().find(|c| !columns.iter().any(|f| f == *c)) {
            return Err(format!(
                "the {side}'s table {table} lacks the column {missing:?}: its schema is not the \
                 one this tether writes"
            ));
        }
    }
    let names: Vec<&str> = found.iter().map(|(t, _)| t.as_str()).collect();
    if let Some(missing) = TABLES
        .iter()
        .map(|t| t.name)
        .chain(["host"])
        .find(|t| !names.contains(t))
    {
        return Err(format!(
            "the {side} has no table {missing:?}: its schema is not the one this tether writes"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A freshly migrated SQLite database has exactly the tables and
    /// columns listed here: a migration that adds one fails this test until
    /// `tether migrate` copies it.
    #[tokio::test]
    async fn the_list_matches_the_sqlite_migrations() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.db");
        let pool = sqlx::SqlitePool::connect_with(
            sqlx::sqlite::SqliteConnectOptions::new()
                .filename(&path)
                .create_if_missing(true),
        )
        .await
        .unwrap();
        sqlx::migrate!("../migrations/sqlite")
            .run(&pool)
            .await
            .unwrap();
        let found = super::super::source::schema(&pool).await.unwrap();
        check_schema("source", &found).unwrap();
        pool.close().await;
    }

    #[test]
    fn unknown_tables_and_columns_are_refused() {
        let mut found: Vec<(String, Vec<String>)> = TABLES
            .iter()
            .map(|t| {
                (
                    t.name.to_owned(),
                    t.names().into_iter().map(str::to_owned).collect(),
                )
            })
            .collect();
        found.push((
            "host".into(),
            HOST_COLUMNS.iter().map(|c| (*c).to_owned()).collect(),
        ));
        assert!(check_schema("source", &found).is_ok());
        // A column the backend derives (SQLite's buckets) is not copied,
        // and not refused; the same name on another table is.
        let mut derived = found.clone();
        let sessions = derived.iter_mut().find(|(t, _)| t == "sessions").unwrap();
        sessions
            .1
            .extend(["recency".to_owned(), "idle_hour".to_owned()]);
        assert!(check_schema("source", &derived).is_ok());
        derived[0].1.push("recency".into());
        assert!(
            check_schema("source", &derived)
                .unwrap_err()
                .contains("recency")
        );
        let mut extra_column = found.clone();
        extra_column[0].1.push("added_later".into());
        let err = check_schema("source", &extra_column).unwrap_err();
        assert!(err.contains("added_later"), "{err}");
        let mut extra_table = found.clone();
        extra_table.push(("later".into(), vec!["x".into()]));
        assert!(
            check_schema("source", &extra_table)
                .unwrap_err()
                .contains("later")
        );
        let missing: Vec<_> = found.iter().skip(1).cloned().collect();
        assert!(
            check_schema("source", &missing)
                .unwrap_err()
                .contains("log")
        );
    }

    #[test]
    fn keys_round_trip_through_json() {
        for cell in [Cell::Int(-5), Cell::Text("a\"b".into()), Cell::Null] {
            assert_eq!(Cell::from_json(&cell.to_json()), Some(cell));
        }
    }
}
