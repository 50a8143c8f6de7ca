//! Several `tether serve` processes on one Postgres database behave, to
//! every client, as one host: one order, exactly once, reconnect anywhere,
//! take-over after a crash, a cluster-wide root (DESIGN.md, "Several hosts
//! on one Postgres").

use std::collections::BTreeMap;
use std::time::Duration;

use futures_util::StreamExt;
use serde_json::{Value, json};
use tether_protocol::rest::{CreateSessionRequest, DispatchRequest};
use tether_tests::{RawWs, ServerProcess, TestDb, raw_at, raw_next, raw_send};
use tokio_tungstenite::tungstenite::Message;

/// Short leases, so a dead host's sessions move within the test's patience.
const LEASE: &[&str] = &["--lease-ttl-ms", "1500"];

async fn hosts(n: usize) -> Option<(TestDb, Vec<ServerProcess>)> {
    let db = TestDb::postgres().await?;
    let mut servers = Vec::new();
    for _ in 0..n {
        servers.push(ServerProcess::start(&db, LEASE).await);
    }
    Some((db, servers))
}

fn session_uri(id: &str) -> String {
    format!("ahp-session:/{id}")
}

async fn create(server: &ServerProcess, id: &str, dirs: &[String]) {
    server
        .client()
        .create_session(&CreateSessionRequest {
            id: Some(id.into()),
            project: Some("p".into()),
            provider: None,
            working_directories: dirs.to_vec(),
            title: None,
            config: None,
        })
        .await
        .expect("create the session");
}

/// A raw connection initialized as `client_id`, subscribed to `channels`.
async fn subscriber(server: &ServerProcess, client_id: &str, channels: &[String]) -> RawWs {
    let mut ws = raw_at(&server.ws_url()).await;
    raw_send(
        &mut ws,
        &json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "channel": "ahp-root://", "protocolVersions": ["1.0.0"], "clientId": client_id,
            "initialSubscriptions": channels}})
        .to_string(),
    )
    .await;
    loop {
        let message = raw_next(&mut ws).await.expect("initialize answer");
        if message["id"] == 1 {
            assert!(message["result"].is_object(), "{message}");
            return ws;
        }
    }
}

/// `(serverSeq, action)` of every `action` notification on `channel` until
/// one at or above `last` arrived.
async fn envelopes_until(ws: &mut RawWs, channel: &str, last: u64) -> Vec<(u64, Value)> {
    let mut seen = Vec::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while seen.last().is_none_or(|(seq, _)| *seq < last) {
        let message = tokio::time::timeout_at(deadline, ws.next())
            .await
            .unwrap_or_else(|_| panic!("envelopes up to {last} in time; got {}", seen.len()))
            .expect("connection open")
            .expect("a frame");
        let Message::Text(text) = message else {
            continue;
        };
        let value: Value = serde_json::from_str(&text).expect("JSON");
        if value["method"] == "action" && value["params"]["channel"] == channel {
            let seq = value["params"]["serverSeq"].as_u64().expect("serverSeq");
            seen.push((seq, value["params"]["action"].clone()));
        }
    }
    seen
}

/// The session's whole stored transcript as `(serverSeq, action)`.
async fn transcript(server: &ServerProcess, id: &str) -> Vec<(u64, Value)> {
    let client = server.client();
    let mut all = Vec::new();
    let mut after = 0;
    loop {
        let page = client
            .transcript(id, after, 1_000)
            .await
            .expect("transcript");
        for envelope in &page.envelopes {
            all.push((
                envelope["serverSeq"].as_u64().expect("seq"),
                envelope["action"].clone(),
            ));
        }
        match page.next_after {
            Some(next) => after = next,
            None => return all,
        }
    }
}

fn title(client: &str, seq: u64) -> DispatchRequest {
    DispatchRequest {
        client_id: client.into(),
        client_seq: seq,
        channel: None,
        action: json!({"type": "session/titleChanged", "title": format!("{client}-{seq}")}),
    }
}

/// Dispatches `count` titles as `client` through `server`, one after another.
async fn titles(server: &ServerProcess, id: &str, client: &str, count: u64) -> Vec<u64> {
    let rest = server.client();
    let mut seqs = Vec::new();
    for seq in 1..=count {
        let answer = rest
            .dispatch(id, &title(client, seq))
            .await
            .expect("accepted");
        seqs.push(answer.server_seq);
    }
    seqs
}

#[tokio::test]
async fn every_host_delivers_one_gap_free_order_whichever_host_commits() {
    let Some((_db, servers)) = hosts(2).await else {
        return;
    };
    let (a, b) = (&servers[0], &servers[1]);
    create(a, "shared", &[]).await;
    let uri = session_uri("shared");
    let mut watchers = Vec::new();
    for (i, host) in [a, b, a, b].into_iter().enumerate() {
        watchers.push(subscriber(host, &format!("watch{i}"), std::slice::from_ref(&uri)).await);
    }
    // Clients on both hosts write to the one session at the same time.
    let (on_a, on_b) = tokio::join!(
        titles(a, "shared", "writer-a", 60),
        titles(b, "shared", "writer-b", 60)
    );
    assert_eq!(on_a.len() + on_b.len(), 120);
    let stored = transcript(b, "shared").await;
    let last = stored.last().expect("a transcript").0;
    let titles_stored: Vec<&(u64, Value)> = stored
        .iter()
        .filter(|(_, a)| a["type"] == "session/titleChanged")
        .collect();
    assert_eq!(
        titles_stored.len(),
        120,
        "every acknowledged dispatch is stored once"
    );
    for (seq, _) in &titles_stored {
        assert!(on_a.contains(seq) || on_b.contains(seq));
    }
    let created_at = stored.first().expect("created").0;
    for (i, watcher) in watchers.iter_mut().enumerate() {
        let seen = envelopes_until(watcher, &uri, last).await;
        let expected: Vec<&(u64, Value)> = stored.iter().filter(|(s, _)| *s > created_at).collect();
        let seen_refs: Vec<&(u64, Value)> = seen.iter().collect();
        // Subscribed after creation: each sees exactly what followed.
        let first = seen.first().expect("something").0;
        let expected: Vec<&(u64, Value)> =
            expected.into_iter().filter(|(s, _)| *s >= first).collect();
        assert_eq!(
            seen_refs, expected,
            "watcher {i}: the stored order, no gap, no duplicate"
        );
    }
    // Both hosts answer the state the transcript folds to.
    let last_title = titles_stored.last().expect("a title").1["title"].clone();
    for host in [a, b] {
        let view = host.client().session("shared").await.expect("view");
        assert_eq!(json!(view.title), last_title);
    }
}

#[tokio::test]
async fn a_compare_and_swap_sent_to_both_hosts_applies_in_one_order() {
    let Some((_db, servers)) = hosts(2).await else {
        return;
    };
    let (a, b) = (&servers[0], &servers[1]);
    let root = tempfile::tempdir().expect("a directory");
    let dir = |name: &str| {
        let path = root.path().join(name);
        std::fs::create_dir_all(&path).expect("mkdir");
        path.to_string_lossy().into_owned()
    };
    let (primary, old, via_a, via_b) = (dir("p"), dir("old"), dir("a"), dir("b"));
    for round in 0..5 {
        let id = format!("cas{round}");
        create(a, &id, &[primary.clone(), old.clone()]).await;
        let old_uri = format!("file://{old}");
        let replace = |client: &str, to: &str| DispatchRequest {
            client_id: client.into(),
            client_seq: round + 1,
            channel: None,
            action: json!({"type": "session/workingDirectoryReplaced",
                           "directory": old_uri, "replacement": format!("file://{to}")}),
        };
        let (client_a, client_b) = (a.client(), b.client());
        let (to_a, to_b) = (replace("cas-a", &via_a), replace("cas-b", &via_b));
        let (ra, rb) = tokio::join!(client_a.dispatch(&id, &to_a), client_b.dispatch(&id, &to_b));
        // The second one finds the directory gone: an accepted no-op (AHP's
        // reducer), so both are stored, in one order, and the state is the
        // first one's replacement on both hosts.
        let (ra, rb) = (ra.expect("accepted"), rb.expect("accepted"));
        let first = if ra.server_seq < rb.server_seq {
            &via_a
        } else {
            &via_b
        };
        for host in [a, b] {
            let view = host.client().session(&id).await.expect("view");
            let dirs = serde_json::to_value(&view.working_directories).expect("json");
            assert_eq!(
                dirs,
                json!([format!("file://{primary}"), format!("file://{first}")]),
                "round {round}: one order, on every host"
            );
        }
    }
}

#[tokio::test]
async fn a_client_dropped_from_one_host_replays_exactly_from_another() {
    let Some((_db, servers)) = hosts(2).await else {
        return;
    };
    let (a, b) = (&servers[0], &servers[1]);
    create(a, "roam", &[]).await;
    let uri = session_uri("roam");
    let mut ws = subscriber(a, "roamer", std::slice::from_ref(&uri)).await;
    let seqs = titles(a, "roam", "w", 5).await;
    let seen = envelopes_until(&mut ws, &uri, *seqs.last().expect("seq")).await;
    let last_seen = seen.last().expect("seen").0;
    drop(ws);
    // Missed while away: written through both hosts.
    titles(a, "roam", "w2", 3).await;
    titles(b, "roam", "w3", 3).await;
    let mut ws = raw_at(&b.ws_url()).await;
    raw_send(
        &mut ws,
        &json!({"jsonrpc": "2.0", "id": 7, "method": "reconnect", "params": {
            "channel": "ahp-root://", "clientId": "roamer", "lastSeenServerSeq": last_seen,
            "subscriptions": [uri]}})
        .to_string(),
    )
    .await;
    let answer = loop {
        let message = raw_next(&mut ws).await.expect("an answer");
        if message["id"] == 7 {
            break message;
        }
    };
    assert_eq!(answer["result"]["type"], "replay", "{answer}");
    let replayed: Vec<(u64, Value)> = answer["result"]["actions"]
        .as_array()
        .expect("actions")
        .iter()
        .map(|e| (e["serverSeq"].as_u64().expect("seq"), e["action"].clone()))
        .collect();
    let missed: Vec<(u64, Value)> = transcript(a, "roam")
        .await
        .into_iter()
        .filter(|(s, _)| *s > last_seen)
        .collect();
    assert_eq!(replayed, missed, "exactly what it missed, in order");
    // And it stays live on the new host.
    let more = titles(a, "roam", "w4", 1).await;
    let live = envelopes_until(&mut ws, &uri, more[0]).await;
    assert_eq!(
        live.first().map(|(s, _)| *s),
        Some(more[0]),
        "no gap after the replay"
    );
}

#[tokio::test]
async fn a_retry_sent_to_the_other_host_applies_once() {
    let Some((_db, servers)) = hosts(2).await else {
        return;
    };
    let (a, b) = (&servers[0], &servers[1]);
    create(a, "once", &[]).await;
    let first = a
        .client()
        .dispatch("once", &title("retrier", 1))
        .await
        .expect("accepted");
    let again = b
        .client()
        .dispatch("once", &title("retrier", 1))
        .await
        .expect("the original outcome");
    assert_eq!(first.server_seq, again.server_seq);
    assert_eq!(first.envelope, again.envelope);
    let stored = transcript(b, "once").await;
    let count = stored
        .iter()
        .filter(|(_, a)| a["title"] == "retrier-1")
        .count();
    assert_eq!(count, 1, "applied once");
    // A refused dispatch keeps its refusal on the other host too.
    let bad = DispatchRequest {
        client_id: "retrier".into(),
        client_seq: 2,
        channel: None,
        action: json!({"type": "session/noSuchAction"}),
    };
    let refused_a = a
        .client()
        .dispatch("once", &bad)
        .await
        .expect_err("refused");
    let refused_b = b
        .client()
        .dispatch("once", &bad)
        .await
        .expect_err("refused again");
    assert_eq!(refused_a.to_string(), refused_b.to_string());
}

/// A holder can answer a forwarded request before its sender has
/// registered its wait (the request is in the database first): such an
/// answer is left in the database for the sender's next collection, not
/// taken by a collection that has nobody to hand it to (the sender then
/// waited out its limit, 25 s, and answered 503).
#[tokio::test]
async fn an_answer_its_sender_does_not_wait_for_yet_is_left_for_it() {
    let Some((db, servers)) = hosts(2).await else {
        return;
    };
    let (a, b) = (&servers[0], &servers[1]);
    create(a, "early", &[]).await;
    // An answered request from each host that it has not registered yet.
    db.execute(
        "INSERT INTO forwards (session_id, holder, sender, request, claimed, answer) \
         SELECT 'early', id, id, 'not yet waited for', TRUE, '{\"kind\":\"done\"}' \
         FROM cluster_hosts",
    )
    .await;
    assert_eq!(
        db.count("SELECT count(*) FROM forwards WHERE request = 'not yet waited for'")
            .await,
        2
    );
    // B forwards a write to A, the holder, and collects A's answer.
    b.client()
        .dispatch("early", &title("forwarder", 1))
        .await
        .expect("forwarded and accepted");
    assert_eq!(
        db.count("SELECT count(*) FROM forwards WHERE request = 'not yet waited for'")
            .await,
        2,
        "a collection took an answer nobody it knew waited for"
    );
}

#[tokio::test]
async fn root_state_lists_and_notifications_cover_every_host() {
    let Some((_db, servers)) = hosts(2).await else {
        return;
    };
    let (a, b) = (&servers[0], &servers[1]);
    let mut root_b = subscriber(b, "root-watch", &["ahp-root://".to_owned()]).await;
    create(a, "made-on-a", &[]).await;
    create(b, "made-on-b", &[]).await;
    let mut added = Vec::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
    while added.len() < 2 {
        let message = tokio::time::timeout_at(deadline, raw_next(&mut root_b))
            .await
            .expect("root notifications in time")
            .expect("open");
        if message["method"] == "root/sessionAdded" {
            added.push(
                message["params"]["summary"]["resource"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned(),
            );
        }
    }
    added.sort();
    assert_eq!(added, ["ahp-session:/made-on-a", "ahp-session:/made-on-b"]);
    // Both hosts list both, and count both in the root state.
    for host in [a, b] {
        let page = host
            .client()
            .sessions(&Default::default())
            .await
            .expect("list");
        let mut ids: Vec<String> = page.items.iter().map(|s| s.id.clone()).collect();
        ids.sort();
        assert_eq!(ids, ["made-on-a", "made-on-b"]);
    }
    let counts = futures_util::future::join_all([a, b].map(root_active_sessions)).await;
    assert_eq!(
        counts,
        [2, 2],
        "activeSessions counts every host's sessions"
    );
    // Disposed on A: B's root subscriber hears of it.
    a.client()
        .delete_session("made-on-b")
        .await
        .expect("dispose");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
    loop {
        let message = tokio::time::timeout_at(deadline, raw_next(&mut root_b))
            .await
            .expect("sessionRemoved in time")
            .expect("open");
        if message["method"] == "root/sessionRemoved" {
            assert_eq!(message["params"]["session"], "ahp-session:/made-on-b");
            break;
        }
    }
    let counts = futures_util::future::join_all([a, b].map(root_active_sessions)).await;
    assert_eq!(counts, [1, 1]);
}

/// Root writes (each creation's `root/sessionAdded` and count) queue on the
/// host before they take the cluster's root lock: many creations at once on
/// a small pool never leave the lock's holder without a connection to
/// commit with (they once waited on the lock holding every pooled
/// connection, and timed the pool out with 503s). And the count of active
/// sessions is computed under the lock, so none is lost to a race.
#[tokio::test]
async fn many_sessions_created_at_once_on_a_small_pool_all_commit_and_count() {
    let Some(db) = TestDb::postgres().await else {
        return;
    };
    let args = ["--lease-ttl-ms", "1500", "--database-max-connections", "3"];
    let servers = [
        ServerProcess::start(&db, &args).await,
        ServerProcess::start(&db, &args).await,
    ];
    creation_burst(&servers, 16).await;
}

/// The same burst on one SQLite host: the count of active sessions loses
/// none of them.
#[tokio::test]
async fn many_sessions_created_at_once_on_sqlite_are_all_counted() {
    let db = TestDb::sqlite();
    let servers = [ServerProcess::start(&db, &[]).await];
    creation_burst(&servers, 32).await;
}

/// Creates `per_host` sessions at once on each server; each must commit
/// well within the pool's timeout, and every host must count them all.
async fn creation_burst(servers: &[ServerProcess], per_host: usize) {
    let creations = servers.iter().enumerate().flat_map(|(h, server)| {
        (0..per_host).map(move |i| async move {
            let started = std::time::Instant::now();
            let made = server
                .client()
                .create_session(&CreateSessionRequest {
                    id: Some(format!("burst-{h}-{i}")),
                    project: Some("p".into()),
                    provider: None,
                    working_directories: Vec::new(),
                    title: None,
                    config: None,
                })
                .await;
            (made.map(|_| ()), started.elapsed())
        })
    });
    let results = futures_util::future::join_all(creations).await;
    for (made, took) in &results {
        assert!(made.is_ok(), "a creation failed: {made:?}");
        assert!(
            *took < Duration::from_secs(4),
            "a creation waited {took:?} (the pool's timeout is 5 s)"
        );
    }
    // Each host's root state follows the other hosts' root writes through
    // its tailer, so a host may briefly count fewer; it must reach the full
    // count, and never count more.
    let expected = (servers.len() * per_host) as u64;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
    loop {
        let counts = futures_util::future::join_all(servers.iter().map(root_active_sessions)).await;
        assert!(
            counts.iter().all(|&c| c <= expected),
            "no host counts more than {expected} active sessions: {counts:?}"
        );
        if counts.iter().all(|&c| c == expected) {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "every host counts {expected} active sessions: {counts:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn root_active_sessions(server: &ServerProcess) -> u64 {
    // The root state, fetched by subscribing to it.
    let mut ws = raw_at(&server.ws_url()).await;
    raw_send(
        &mut ws,
        &json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "channel": "ahp-root://", "protocolVersions": ["1.0.0"], "clientId": "count",
            "initialSubscriptions": ["ahp-root://"]}})
        .to_string(),
    )
    .await;
    // The tailer may still be bringing the other host's root envelopes in.
    for _ in 0..50 {
        let message = raw_next(&mut ws).await.expect("answer");
        if message["id"] == 1 {
            let snapshots = message["result"]["snapshots"]
                .as_array()
                .cloned()
                .unwrap_or_default();
            return snapshots
                .iter()
                .find(|s| s["resource"] == "ahp-root://")
                .and_then(|s| s["state"]["activeSessions"].as_u64())
                .unwrap_or_default();
        }
    }
    panic!("no initialize answer")
}

#[tokio::test]
async fn a_killed_host_s_sessions_move_to_another_within_the_lease() {
    let Some((_db, mut servers)) = hosts(2).await else {
        return;
    };
    create(&servers[0], "orphan", &[]).await;
    // A holds the session's lease: it created it and writes to it.
    let before = titles(&servers[0], "orphan", "a", 20).await;
    let mut b_writer = tokio::spawn({
        let client = servers[1].client();
        async move {
            // B writes all through: forwarded to A, then, once A is gone,
            // refused as unavailable until B takes the session over.
            let mut accepted = BTreeMap::new();
            let mut seq = 1;
            let started = tokio::time::Instant::now();
            while seq <= 40 && started.elapsed() < Duration::from_secs(60) {
                match client.dispatch("orphan", &title("b", seq)).await {
                    Ok(answer) => {
                        accepted.insert(seq, answer.server_seq);
                        seq += 1;
                    }
                    Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
                }
            }
            accepted
        }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let killed_at = tokio::time::Instant::now();
    servers[0].kill().await;
    let accepted = (&mut b_writer).await.expect("writer");
    assert_eq!(
        accepted.len(),
        40,
        "B keeps serving: every dispatch eventually accepted"
    );
    let took = killed_at.elapsed();
    let stored = transcript(&servers[1], "orphan").await;
    // Nothing acknowledged is lost, and no seq is used twice.
    for seq in before.iter().chain(accepted.values()) {
        assert_eq!(
            stored.iter().filter(|(s, _)| s == seq).count(),
            1,
            "seq {seq} stored once"
        );
    }
    let mut seqs: Vec<u64> = stored.iter().map(|(s, _)| *s).collect();
    let len = seqs.len();
    seqs.dedup();
    assert_eq!(seqs.len(), len, "no seq reused");
    // B retried with the same clientSeq while A died: applied once each.
    for seq in 1..=40u64 {
        let name = format!("b-{seq}");
        assert_eq!(
            stored.iter().filter(|(_, a)| a["title"] == name).count(),
            1,
            "{name} once"
        );
    }
    assert!(took < Duration::from_secs(30), "taken over in {took:?}");
}

/// Starts another `tether serve` on `db` with `args`, which must exit at
/// once with a failure; returns what it wrote to stderr.
async fn refused_start(db: &TestDb, args: &[&str]) -> String {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port();
    let second = tokio::process::Command::new(tether_tests::tether_bin())
        .args(["serve", "--bind", &format!("127.0.0.1:{port}")])
        .args(["--database-url", db.url()])
        .args(args)
        .env_remove("TETHER_DATABASE_URL")
        .output();
    let second = tokio::time::timeout(Duration::from_secs(30), second)
        .await
        .expect("the second process exits at once")
        .expect("run tether serve");
    assert!(!second.status.success(), "refused");
    String::from_utf8_lossy(&second.stderr).into_owned()
}

#[tokio::test]
async fn a_second_host_on_one_sqlite_file_is_refused_at_start() {
    let db = TestDb::sqlite();
    let _first = ServerProcess::start(&db, &[]).await;
    let stderr = refused_start(&db, &[]).await;
    let errors: Vec<&str> = stderr
        .lines()
        .filter(|l| l.starts_with("tether: error:"))
        .collect();
    assert_eq!(errors.len(), 1, "one line: {stderr}");
    assert!(
        errors[0].contains("another Tether process already serves this file"),
        "{stderr}"
    );
}

/// A host with a configured identity (`--host-id`) killed without warning
/// and started again takes its own sessions back at once, not after the
/// lease time; while it lives, a second process claiming its identity is
/// refused at start.
#[tokio::test]
async fn a_host_keeps_its_identity_across_a_crash_and_it_is_claimed_once() {
    let Some(db) = TestDb::postgres().await else {
        return;
    };
    // A lease far longer than the test's patience for the take-back.
    let args = ["--lease-ttl-ms", "60000", "--host-id", "host-a"];
    let mut a = ServerProcess::start(&db, &args).await;
    create(&a, "kept", &[]).await;
    let before = titles(&a, "kept", "a", 5).await;

    // A second live process with the same identity is refused.
    let stderr = refused_start(&db, &args).await;
    assert!(
        stderr.contains("host id \"host-a\" is claimed by another live process"),
        "{stderr}"
    );
    // The refused twin took nothing from the live host.
    titles(&a, "kept", "a2", 1).await;

    // Killed, then started again under the same identity: the session is
    // writable at once, though its lease has most of a minute to run.
    a.kill().await;
    let started = tokio::time::Instant::now();
    a.restart().await;
    let after = titles(&a, "kept", "b", 5).await;
    let took = started.elapsed();
    assert!(
        took < Duration::from_secs(10),
        "the restarted host wrote its own session after {took:?} (lease 60 s)"
    );
    let stored = transcript(&a, "kept").await;
    for seq in before.iter().chain(after.iter()) {
        assert_eq!(
            stored.iter().filter(|(s, _)| s == seq).count(),
            1,
            "seq {seq} stored once"
        );
    }
}

#[tokio::test]
async fn an_append_for_a_session_another_host_holds_writes_nothing() {
    let Some(db) = TestDb::postgres().await else {
        return;
    };
    let store = db.open().await;
    let (pool, me) = store.join_cluster().expect("Postgres joins a cluster");
    // "other" holds s1's lease (even an expired one: it was the last writer).
    for (session, holder, expiry) in [
        ("s1", "other", "infinity"),
        ("s2", me.as_str(), "infinity"),
        ("s3", "other", "-infinity"),
    ] {
        sqlx::query(
            "INSERT INTO leases (session_id, holder, expires_at) VALUES ($1, $2, $3::timestamptz)",
        )
        .bind(session)
        .bind(holder)
        .bind(expiry)
        .execute(&pool)
        .await
        .expect("a lease");
    }
    let envelope = |session: &str| tether_server::store::NewEnvelope {
        channel: session_uri(session),
        session_id: Some(session.into()),
        action: r#"{"type":"session/titleChanged","title":"x"}"#.into(),
        origin: None,
        session: None,
        chats: Vec::new(),
        turns: Vec::new(),
        directed: None,
        owner: None,
        search: Vec::new(),
        usage: None,
        events: Vec::new(),
    };
    let outcomes = store
        .append(vec![
            envelope("s1"),
            envelope("s2"),
            envelope("s3"),
            envelope("s4"),
        ])
        .await
        .expect("append");
    use tether_server::store::Appended;
    assert!(matches!(outcomes[0], Appended::Fenced), "{outcomes:?}");
    assert!(
        matches!(outcomes[1], Appended::Committed { seq: 1, .. }),
        "{outcomes:?}"
    );
    assert!(
        matches!(outcomes[2], Appended::Fenced),
        "released by another: still fenced"
    );
    assert!(
        matches!(outcomes[3], Appended::Committed { seq: 2, .. }),
        "no lease: not fenced"
    );
    assert_eq!(
        store.host().await.expect("host").last_seq,
        2,
        "no seq taken by a fenced envelope"
    );
}
