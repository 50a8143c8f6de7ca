//! How the search index's FTS5 table costs a document upsert, in five
//! variants beside no index at all: the external-content table Tether uses
//! (migration 0009), a contentless one with `contentless_delete=1` (a
//! delete needs no old text), the external-content one with
//! `columnsize=0` (no per-document size row), and with fewer, larger
//! merges of its segments (`automerge`, `crisismerge`). Each commit upserts 30
//! documents in one statement, as the writer does (BENCHMARKS.md, "Search
//! index variants").
//!
//!     cargo run --release -p tether-server --example fts_variants

use std::time::Instant;

use rusqlite::Connection;

/// The index variants.
const VARIANTS: [(&str, &str); 6] = [
    (
        "external content (as shipped)",
        "CREATE VIRTUAL TABLE search_fts USING fts5(words, content = 'search_docs', \
         content_rowid = 'id', tokenize = 'unicode61 remove_diacritics 0');",
    ),
    (
        "contentless, contentless_delete=1",
        "CREATE VIRTUAL TABLE search_fts USING fts5(words, content = '', contentless_delete = 1, \
         tokenize = 'unicode61 remove_diacritics 0');
         CREATE TRIGGER added AFTER INSERT ON search_docs BEGIN
             INSERT INTO search_fts (rowid, words) VALUES (new.id, new.words); END;
         CREATE TRIGGER changed AFTER UPDATE OF words ON search_docs BEGIN
             UPDATE search_fts SET words = new.words WHERE rowid = old.id; END;",
    ),
    (
        "external content, columnsize=0",
        "CREATE VIRTUAL TABLE search_fts USING fts5(words, content = 'search_docs', \
         content_rowid = 'id', columnsize = 0, tokenize = 'unicode61 remove_diacritics 0');",
    ),
    (
        "external content, automerge=8",
        "CREATE VIRTUAL TABLE search_fts USING fts5(words, content = 'search_docs', \
         content_rowid = 'id', tokenize = 'unicode61 remove_diacritics 0');
         INSERT INTO search_fts (search_fts, rank) VALUES ('automerge', 8);",
    ),
    (
        "external content, automerge=16, crisismerge=64",
        "CREATE VIRTUAL TABLE search_fts USING fts5(words, content = 'search_docs', \
         content_rowid = 'id', tokenize = 'unicode61 remove_diacritics 0');
         INSERT INTO search_fts (search_fts, rank) VALUES ('automerge', 16);
         INSERT INTO search_fts (search_fts, rank) VALUES ('crisismerge', 64);",
    ),
    ("no index", ""),
];

/// The external-content table's triggers (migration 0009's).
const EXTERNAL_TRIGGERS: &str = "
    CREATE TRIGGER added AFTER INSERT ON search_docs BEGIN
        INSERT INTO search_fts (rowid, words) VALUES (new.id, new.words); END;
    CREATE TRIGGER changed AFTER UPDATE OF words ON search_docs BEGIN
        INSERT INTO search_fts (search_fts, rowid, words) VALUES ('delete', old.id, old.words);
        INSERT INTO search_fts (rowid, words) VALUES (new.id, new.words); END;";

const PER_COMMIT: usize = 30;
const COMMITS: usize = 3_000;

fn microseconds_per_doc(variant: usize, words: usize) -> rusqlite::Result<f64> {
    let dir = std::env::temp_dir().join(format!("fts-variants-{}", std::process::id()));
    std::fs::create_dir_all(&dir).ok();
    let path = dir.join(format!("{variant}-{words}.db"));
    let _ = std::fs::remove_file(&path);
    let db = Connection::open(&path)?;
    db.execute_batch(
        "PRAGMA journal_mode = WAL; PRAGMA synchronous = OFF;
         CREATE TABLE search_docs (id INTEGER PRIMARY KEY, session_id TEXT NOT NULL,
             key TEXT NOT NULL, words TEXT NOT NULL, UNIQUE (session_id, key));",
    )?;
    let (name, schema) = VARIANTS[variant];
    db.execute_batch(schema)?;
    if name.starts_with("external") {
        db.execute_batch(EXTERNAL_TRIGGERS)?;
    }
    let values: Vec<String> = (0..PER_COMMIT)
        .map(|i| format!("(?{}, 'title', ?{})", 2 * i + 1, 2 * i + 2))
        .collect();
    let sql = format!(
        "INSERT INTO search_docs (session_id, key, words) VALUES {} \
         ON CONFLICT (session_id, key) DO UPDATE SET words = excluded.words",
        values.join(", ")
    );
    let started = Instant::now();
    for commit in 0..COMMITS {
        let tx = db.unchecked_transaction()?;
        {
            let mut upsert = tx.prepare_cached(&sql)?;
            for session in 0..PER_COMMIT {
                let text: Vec<String> = (0..words)
                    .map(|w| format!("word{} title{session}", w + commit))
                    .collect();
                upsert.raw_bind_parameter(2 * session + 1, format!("session-{session:04}"))?;
                upsert.raw_bind_parameter(2 * session + 2, text.join(" "))?;
            }
            upsert.raw_execute()?;
        }
        tx.commit()?;
    }
    let elapsed = started.elapsed();
    drop(db);
    let _ = std::fs::remove_dir_all(&dir);
    Ok(elapsed.as_secs_f64() * 1e6 / (COMMITS * PER_COMMIT) as f64)
}

fn main() -> rusqlite::Result<()> {
    println!("SQLite {}", rusqlite::version());
    for words in [3, 50] {
        for round in 1..=2 {
            for (variant, (name, _)) in VARIANTS.iter().enumerate() {
                let cost = microseconds_per_doc(variant, words)?;
                println!("{words} words, round {round}, {name}: {cost:.2} us a document");
            }
        }
    }
    Ok(())
}
