//! `tether backup PATH`: a SQLite database copied while the server runs and
//! writes; the copy is whole (a server started on it serves what the live
//! one had committed up to some seq, nothing half written), the command
//! never overwrites a file, and it points Postgres users at Postgres's
//! own tools.

use std::process::Output;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tether_tests::ledger::{self, Writer};
use tether_tests::{ServerProcess, TestDb, tether_bin};

async fn backup(database_url: &str, path: &std::path::Path) -> Output {
    tokio::process::Command::new(tether_bin())
        .env_remove("TETHER_DATABASE_URL")
        .args(["backup", "--database-url", database_url])
        .arg(path)
        .output()
        .await
        .expect("run tether backup")
}

#[tokio::test]
async fn a_backup_taken_under_load_is_a_whole_database_as_of_one_moment() {
    let dir = tempfile::tempdir().unwrap();
    let db = TestDb::sqlite_in(dir.path());
    let server = ServerProcess::start(&db, &[]).await;
    let base = server.base_url();
    let sessions = ["b-0", "b-1", "b-2"];
    for session in sessions {
        tether_tests::create_session(&base, session, "echo").await;
    }
    let stop = Arc::new(AtomicBool::new(false));
    let mut writing = Vec::new();
    for (i, session) in sessions.iter().enumerate() {
        // Large titles, so the database grows while it is copied.
        let mut writer = Writer::new(session, &format!("w{i}")).padded(2048);
        let (base, stop) = (base.clone(), stop.clone());
        writing.push(tokio::spawn(async move {
            while !stop.load(Ordering::SeqCst) {
                writer.attempt(&base).await;
            }
            writer
        }));
    }
    tokio::time::sleep(Duration::from_millis(800)).await;
    let path = dir.path().join("copy.db");
    // Everything acknowledged before the backup began is in it.
    let ready: serde_json::Value = reqwest::get(format!("{base}/readyz"))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let committed_before = ready["serverSeq"].as_u64().expect("serverSeq");
    let taken = backup(db.url(), &path).await;
    let said = String::from_utf8_lossy(&taken.stdout).to_string();
    assert!(
        taken.status.success(),
        "backup failed: {said}{}",
        String::from_utf8_lossy(&taken.stderr)
    );
    assert!(said.contains("integrity check ok"), "{said}");
    let copied_up_to: u64 = said
        .split("up to serverSeq ")
        .nth(1)
        .and_then(|rest| rest.split(';').next())
        .and_then(|seq| seq.parse().ok())
        .expect("the highest seq copied");
    assert!(
        copied_up_to >= committed_before,
        "the copy ends at {copied_up_to}, before {committed_before}, committed before it began"
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    stop.store(true, Ordering::SeqCst);
    let mut writers = Vec::new();
    for task in writing {
        writers.push(task.await.unwrap());
    }
    let checked = ledger::audit(&base, &writers).await;

    // A second backup to the same path is refused; the file is untouched.
    let size = std::fs::metadata(&path).unwrap().len();
    let again = backup(db.url(), &path).await;
    assert!(!again.status.success());
    assert!(
        String::from_utf8_lossy(&again.stderr).contains("never overwrites"),
        "{}",
        String::from_utf8_lossy(&again.stderr)
    );
    assert_eq!(std::fs::metadata(&path).unwrap().len(), size);
    assert!(
        !dir.path().join("copy.db.partial").exists(),
        "no partial file left"
    );

    // A server on the copy serves a prefix of what the live one committed:
    // every envelope it has is the live one's, byte for byte, with no gap.
    let restore = tempfile::tempdir().unwrap();
    let copy = TestDb::sqlite_in(restore.path());
    std::fs::copy(&path, copy.url().trim_start_matches("sqlite:")).unwrap();
    let restored = ServerProcess::start(&copy, &[]).await;
    let mut kept = 0;
    for session in sessions {
        let live = ledger::transcript(&base, session).await;
        let saved = ledger::transcript(&restored.base_url(), session).await;
        assert!(!saved.is_empty(), "{session} is in the copy");
        assert!(
            saved.len() < live.len(),
            "{session}: the live one went on writing"
        );
        assert_eq!(
            saved[..],
            live[..saved.len()],
            "{session}: a prefix of the live one"
        );
        kept += saved.len();
    }
    // A client that saw the live server's newer envelopes, reconnecting to
    // the restored one, gets snapshots (the seqs it saw will be issued
    // again), not an empty replay that would let it skip them.
    let last_live = ledger::transcript(&base, sessions[0])
        .await
        .last()
        .unwrap()
        .0;
    let mut ws = tether_tests::raw_at(&restored.ws_url()).await;
    let reconnect = serde_json::json!({"jsonrpc": "2.0", "id": 7, "method": "reconnect",
        "params": {"channel": "ahp-root://", "clientId": "returning",
            "lastSeenServerSeq": last_live, "subscriptions": [format!("ahp-session:/{}", sessions[0])]}});
    tether_tests::raw_send(&mut ws, &reconnect.to_string()).await;
    let answer = loop {
        let message = tether_tests::raw_next(&mut ws).await.expect("an answer");
        if message["id"] == 7 {
            break message;
        }
    };
    assert_eq!(answer["result"]["type"], "snapshot", "{answer}");
    eprintln!(
        "backup under load: {said}{kept} envelopes of the copy match the live ones; \
         {checked} acknowledged actions audited"
    );
}

#[tokio::test]
async fn a_backup_of_postgres_points_at_its_own_tools() {
    let dir = tempfile::tempdir().unwrap();
    let refused = backup(
        "postgres://postgres@127.0.0.1:5432/postgres",
        &dir.path().join("x"),
    )
    .await;
    assert!(!refused.status.success());
    let said = String::from_utf8_lossy(&refused.stderr);
    assert!(said.contains("pg_dump"), "{said}");
    // And a missing database is named, not created.
    let missing = backup(
        &format!("sqlite:{}", dir.path().join("none.db").display()),
        &dir.path().join("y"),
    )
    .await;
    assert!(!missing.status.success());
    assert!(
        String::from_utf8_lossy(&missing.stderr).contains("no SQLite database"),
        "{}",
        String::from_utf8_lossy(&missing.stderr)
    );
    assert!(!dir.path().join("none.db").exists());
}
