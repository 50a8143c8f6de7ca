//! A SQLite database written before the log's integer keys (migration
//! 0014) keeps working after the upgrade: its envelopes are read back by
//! channel and by session, its origins still refuse a retry, and new
//! envelopes on its old channels join them.

use sqlx::sqlite::{SqliteConnectOptions, SqlitePoolOptions};
use tether_server::store::{Appended, OriginOutcome};
use tether_tests::TestDb;
use tether_tests::store_reads::{assert_read_back, envelope, from_client};

#[tokio::test]
async fn a_log_written_before_its_integer_keys_is_read_and_deduplicated_after() {
    let db = TestDb::sqlite();
    let path = db.url().strip_prefix("sqlite:").expect("a SQLite URL");
    let pool = SqlitePoolOptions::new()
        .max_connections(1)
        .connect_with(
            SqliteConnectOptions::new()
                .filename(path)
                .create_if_missing(true),
        )
        .await
        .unwrap();
    // The schema as the release before 0014 left it, and a log in it: two
    // sessions, two clients, and one envelope of the host's own.
    sqlx::migrate!("../migrations/sqlite")
        .run_to(13, &pool)
        .await
        .unwrap();
    sqlx::query("INSERT INTO host (id, epoch, last_seq) VALUES (1, 'before', 4)")
        .execute(&pool)
        .await
        .unwrap();
    for (seq, session, client, client_seq) in [
        (1, "a", Some("c"), Some(1)),
        (2, "b", Some("d"), Some(1)),
        (3, "a", None, None),
        (4, "a", Some("c"), Some(2)),
    ] {
        sqlx::query(
            "INSERT INTO log (seq, channel, session_id, action, client_id, client_seq, \
                              origin_scope, at_ms) \
             VALUES (?, ?, ?, ?, ?, ?, '', 1700000000000)",
        )
        .bind(seq)
        .bind(format!("ahp-session:/{session}"))
        .bind(session)
        .bind(format!(r#"{{"type":"x-test/n","n":{seq}}}"#))
        .bind(client)
        .bind(client_seq)
        .execute(&pool)
        .await
        .unwrap();
    }
    pool.close().await;

    let store = db.open().await;
    let retried = store
        .append(vec![
            from_client(envelope("ahp-session:/b", 99), "d", 1),
            from_client(envelope("ahp-session:/b", 5), "d", 2),
            from_client(envelope("ahp-session:/c", 6), "c", 3),
        ])
        .await
        .unwrap();
    assert!(
        matches!(&retried[0], Appended::Duplicate(OriginOutcome::Accepted(e)) if e.seq == 2),
        "an origin from before the upgrade is still known: {retried:?}"
    );
    assert!(
        matches!(retried[1], Appended::Committed { seq: 5, .. }),
        "{retried:?}"
    );
    assert!(
        matches!(retried[2], Appended::Committed { seq: 6, .. }),
        "{retried:?}"
    );
    for (channel, seqs) in [
        ("ahp-session:/a", &[1, 3, 4][..]),
        ("ahp-session:/b", &[2, 5]),
        ("ahp-session:/c", &[6]),
    ] {
        assert_read_back(store.as_ref(), channel, seqs).await;
    }
    let both = store
        .read_after(
            1,
            Some(&["ahp-session:/a".to_owned(), "ahp-session:/c".to_owned()]),
            100,
        )
        .await
        .unwrap();
    assert_eq!(
        both.iter().map(|e| e.seq).collect::<Vec<_>>(),
        vec![3, 4, 6]
    );
}
