//! `tether-client`'s session stream against the real server: every envelope
//! exactly once and in order across forced disconnects and a killed and
//! restarted server process; a dispatch whose answer was lost applies once.

use std::time::Duration;

use serde_json::json;
use tether_client::stream::{Dispatched, SessionStream, Start, StreamConfig, StreamEvent};
use tether_client::{Client, ClientIdentity};
use tether_protocol::rest::CreateSessionRequest;
use tether_tests::{Proxy, ServerProcess, TestDb, TestServer, backend_tests, produce_titles};

backend_tests!(
    the_stream_survives_forced_disconnects,
    the_stream_survives_a_server_restart,
    a_dispatch_whose_answer_was_lost_applies_once,
    a_persistent_identity_keeps_its_numbers_across_streams,
);

const WAIT: Duration = Duration::from_secs(30);

fn quick(url: String) -> StreamConfig {
    let mut config = StreamConfig::new(url);
    config.initial_backoff = Duration::from_millis(20);
    config.max_backoff = Duration::from_millis(200);
    config
}

async fn create(client: &Client, id: &str) {
    client
        .create_session(&CreateSessionRequest {
            id: Some(id.into()),
            project: Some("stream".into()),
            provider: None,
            working_directories: Vec::new(),
            title: None,
            config: None,
        })
        .await
        .expect("create the session");
}

/// What a consumer saw.
#[derive(Debug, Default)]
struct Seen {
    seqs: Vec<u64>,
    titles: Vec<String>,
    disconnects: usize,
    resumes: usize,
}

/// Reads the stream until `count` producer titles have arrived.
async fn read_titles(stream: &mut SessionStream, seen: &mut Seen, count: usize) {
    while seen.titles.len() < count {
        let event = tokio::time::timeout(WAIT, stream.next())
            .await
            .unwrap_or_else(|_| {
                panic!(
                    "stalled after {} of {count} titles: {seen:?}",
                    seen.titles.len()
                )
            })
            .expect("the stream is open");
        match event {
            StreamEvent::Envelope(envelope) => {
                seen.seqs.push(envelope.server_seq);
                let action = serde_json::to_value(&envelope.action).unwrap();
                if let Some(title) = action["title"].as_str() {
                    seen.titles.push(title.to_owned());
                }
            }
            StreamEvent::Disconnected { .. } => seen.disconnects += 1,
            StreamEvent::Resumed { .. } => seen.resumes += 1,
            StreamEvent::Resynced => panic!("a short gap must be replayed, not resynced"),
            _ => {}
        }
    }
}

/// The seqs the store holds for the session after `after`.
async fn stored_seqs(client: &Client, session: &str, after: u64) -> Vec<u64> {
    let page = client.transcript(session, after, 1000).await.unwrap();
    page.envelopes
        .iter()
        .map(|e| e["serverSeq"].as_u64().unwrap())
        .collect()
}

fn assert_exactly_once(seen: &Seen, stored: &[u64], count: u64) {
    let expected: Vec<String> = (0..count).map(|i| format!("t{i}")).collect();
    assert_eq!(seen.titles, expected, "every title once, in order");
    assert_eq!(seen.seqs, stored, "exactly the stored envelopes, in order");
}

async fn first_snapshot_seq(stream: &mut SessionStream) -> u64 {
    match tokio::time::timeout(WAIT, stream.next()).await.unwrap() {
        Some(StreamEvent::Snapshot(snapshot)) => u64::try_from(snapshot.from_seq).unwrap(),
        other => panic!("expected the snapshot first, got {other:?}"),
    }
}

async fn the_stream_survives_forced_disconnects(db: TestDb) {
    let server = TestServer::start(&db).await;
    let client = server.client();
    create(&client, "cut").await;
    let proxy = Proxy::start(server.addr).await;
    let mut stream = SessionStream::open(
        quick(proxy.base_url()),
        vec!["ahp-session:/cut".into()],
        Start::Now,
    )
    .await
    .unwrap();
    let from = first_snapshot_seq(&mut stream).await;

    const COUNT: u64 = 300;
    let producer = {
        let client = client.clone();
        tokio::spawn(async move { produce_titles(&client, "cut", 0..COUNT).await })
    };
    let mut seen = Seen::default();
    for round in 1..=3 {
        read_titles(&mut stream, &mut seen, round * 50).await;
        proxy.cut();
    }
    read_titles(&mut stream, &mut seen, COUNT as usize).await;
    producer.await.unwrap();

    assert_exactly_once(&seen, &stored_seqs(&client, "cut", from).await, COUNT);
    assert_eq!(seen.disconnects, 3, "{seen:?}");
    assert_eq!(seen.resumes, 3, "each reconnect resumed by replay");
    server.stop().await;
}

async fn the_stream_survives_a_server_restart(db: TestDb) {
    let mut server = ServerProcess::start(&db, &[]).await;
    let client = Client::new(&server.base_url()).unwrap();
    create(&client, "phoenix").await;
    let mut stream = SessionStream::open(
        quick(server.base_url()),
        vec!["ahp-session:/phoenix".into()],
        Start::Now,
    )
    .await
    .unwrap();
    let from = first_snapshot_seq(&mut stream).await;
    let mut seen = Seen::default();

    produce_titles(&client, "phoenix", 0..40).await;
    read_titles(&mut stream, &mut seen, 20).await;
    // Killed with 20 envelopes still unread and possibly unsent.
    server.kill().await;
    server.restart().await;
    produce_titles(&client, "phoenix", 40..80).await;
    read_titles(&mut stream, &mut seen, 80).await;

    assert_exactly_once(&seen, &stored_seqs(&client, "phoenix", from).await, 80);
    assert!(seen.disconnects >= 1 && seen.resumes >= 1, "{seen:?}");
    server.kill().await;
}

async fn a_dispatch_whose_answer_was_lost_applies_once(db: TestDb) {
    let server = TestServer::start(&db).await;
    let client = server.client();
    create(&client, "lost").await;
    let proxy = Proxy::start(server.addr).await;
    let mut stream = SessionStream::open(
        quick(proxy.base_url()),
        vec!["ahp-session:/lost".into()],
        Start::Now,
    )
    .await
    .unwrap();
    let from = first_snapshot_seq(&mut stream).await;
    let client_id = stream.identity().client_id().to_owned();

    // The server's answers are dropped: the action commits, its echo never
    // arrives, and the connection is then cut. The stream must send it again
    // after reconnecting and get the original envelope back.
    proxy.mute_replies();
    let action = json!({"type": "session/titleChanged", "title": "only once"});
    let (outcome, ()) = tokio::join!(stream.dispatch("ahp-session:/lost", action), async {
        let deadline = tokio::time::Instant::now() + WAIT;
        while stored_seqs(&client, "lost", from).await.is_empty() {
            assert!(tokio::time::Instant::now() < deadline, "never committed");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        proxy.cut();
    });
    let Dispatched::Accepted(envelope) = outcome.unwrap() else {
        panic!("accepted")
    };
    let transcript = client.transcript("lost", from, 100).await.unwrap();
    let mine: Vec<&serde_json::Value> = transcript
        .envelopes
        .iter()
        .filter(|e| e["origin"]["clientId"] == client_id.as_str())
        .collect();
    assert_eq!(mine.len(), 1, "applied once: {mine:?}");
    assert_eq!(mine[0]["serverSeq"], envelope.server_seq);

    // The consumer sees that envelope once, and the next dispatch works.
    let next = stream
        .dispatch(
            "ahp-session:/lost",
            json!({"type": "session/titleChanged", "title": "next"}),
        )
        .await
        .unwrap();
    assert!(matches!(next, Dispatched::Accepted(_)), "{next:?}");
    let mut seen = Seen::default();
    read_titles(&mut stream, &mut seen, 2).await;
    assert_eq!(seen.titles, ["only once", "next"]);

    // Now the action itself is lost on the way: the stream must send it
    // again on the new connection.
    proxy.mute_requests();
    let before = stored_seqs(&client, "lost", from).await.len();
    let (outcome, ()) = tokio::join!(
        stream.dispatch(
            "ahp-session:/lost",
            json!({"type": "session/titleChanged", "title": "sent twice"}),
        ),
        async {
            tokio::time::sleep(Duration::from_millis(200)).await;
            assert_eq!(
                stored_seqs(&client, "lost", from).await.len(),
                before,
                "the muted dispatch must not have arrived"
            );
            proxy.cut();
        }
    );
    assert!(matches!(outcome.unwrap(), Dispatched::Accepted(_)));
    read_titles(&mut stream, &mut seen, 3).await;
    assert_eq!(seen.titles, ["only once", "next", "sent twice"]);
    assert_eq!(stored_seqs(&client, "lost", from).await.len(), before + 1);
    server.stop().await;
}

async fn a_persistent_identity_keeps_its_numbers_across_streams(db: TestDb) {
    let server = TestServer::start(&db).await;
    let client = server.client();
    create(&client, "ident").await;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("identity.json");
    let mut outcomes = Vec::new();
    for title in ["first run", "second run"] {
        let identity = std::sync::Arc::new(ClientIdentity::persistent(&path).unwrap());
        let stream = SessionStream::open(
            quick(server.base_url()).with_identity(identity),
            Vec::new(),
            Start::Now,
        )
        .await
        .unwrap();
        outcomes.push(
            stream
                .dispatch(
                    "ahp-session:/ident",
                    json!({"type": "session/titleChanged", "title": title}),
                )
                .await
                .unwrap(),
        );
    }
    // With a counter restarting at 1, the second run's action would reuse
    // the first's (clientId, clientSeq) and be refused.
    for outcome in &outcomes {
        assert!(matches!(outcome, Dispatched::Accepted(_)), "{outcomes:?}");
    }
    assert_eq!(
        client.session("ident").await.unwrap().title.as_deref(),
        Some("second run")
    );

    // A refusal is an outcome, not an error.
    let stream = SessionStream::open(quick(server.base_url()), Vec::new(), Start::Now)
        .await
        .unwrap();
    let refused = stream
        .dispatch(
            "ahp-session:/ident",
            json!({"type": "session/workingDirectorySet", "directory": "relative/dir"}),
        )
        .await
        .unwrap();
    assert!(
        matches!(&refused, Dispatched::Rejected { reason, .. } if !reason.is_empty()),
        "{refused:?}"
    );
    server.stop().await;
}
