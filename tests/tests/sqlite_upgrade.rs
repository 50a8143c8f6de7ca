//! A SQLite database written before the log's integer keys (migration
//! 0014) keeps working after the upgrade: its envelopes are read back by
//! channel and by session, its origins still refuse a retry, and new
//! envelopes on its old channels join them.

use sqlx::sqlite::{SqliteConnectOptions, SqlitePoolOptions};
use tether_server::store::{Appended, NewEnvelope, Origin, OriginOutcome};
use tether_tests::TestDb;

fn envelope(channel: &str, n: u64, client: &str, client_seq: u64) -> NewEnvelope {
    NewEnvelope {
        channel: channel.to_owned(),
        session_id: channel.strip_prefix("ahp-session:/").map(str::to_owned),
        action: format!(r#"{{"type":"x-test/n","n":{n}}}"#),
        origin: Some(Origin::durable(client, client_seq)),
        session: None,
        chats: Vec::new(),
        turns: Vec::new(),
        directed: None,
        owner: None,
        search: None,
        usage: None,
        events: Vec::new(),
    }
}

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
            envelope("ahp-session:/b", 99, "d", 1),
            envelope("ahp-session:/b", 5, "d", 2),
            envelope("ahp-session:/c", 6, "c", 3),
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
    for (session, seqs) in [("a", vec![1, 3, 4]), ("b", vec![2, 5]), ("c", vec![6])] {
        let channel = format!("ahp-session:/{session}");
        let read = store
            .read_after(0, Some(std::slice::from_ref(&channel)), 100)
            .await
            .unwrap();
        assert_eq!(
            read.iter().map(|e| e.seq).collect::<Vec<_>>(),
            seqs,
            "{channel} read by channel"
        );
        assert!(read.iter().all(|e| e.channel == channel));
        let page = store.transcript(session, 0, 100).await.unwrap();
        assert_eq!(
            page.iter().map(|e| e.seq).collect::<Vec<_>>(),
            seqs,
            "{session}'s transcript"
        );
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
