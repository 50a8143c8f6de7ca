//! Backpressure, limits, group commit, side-effect backends and the
//! durability invariants of the AHP host, on both backends.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use ahp::Client;
use ahp_types::PROTOCOL_VERSION;
use ahp_types::commands::ReconnectResult;
use ahp_types::state::SnapshotState;
use futures_util::{SinkExt, StreamExt};
use serde_json::{Value, json};
use tether_server::config::{EffectsConfig, ServeConfig};
use tether_server::engine::EngineConfig;
use tether_server::ws::WsLimits;
use tether_tests::{TestDb, TestServer, action, backend_tests, next_envelope, title_of};
use tokio_tungstenite::tungstenite::Message;

backend_tests!(
    a_slow_subscriber_is_closed_and_catches_up_without_delaying_others,
    silent_connections_are_closed_after_the_ping_deadline,
    connection_and_subscription_limits_answer_clearly,
    actions_ready_together_commit_together,
    the_webhook_backend_accepts_refuses_and_times_out,
    an_evicted_or_restarted_session_rebuilds_the_same_state,
    nothing_reaches_a_subscriber_before_it_is_committed,
    a_subscriber_whose_inbox_overflows_catches_up_from_the_store,
    a_long_replay_is_whole_and_in_order_and_its_bounds_hold,
);

const WAIT: Duration = Duration::from_secs(20);

/// These tests measure behaviour under load (who keeps up, who is cut off,
/// what commits together), so they run one at a time: on two cores, a
/// neighbour's burst would make a "fast" client slow.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

async fn create(client: &Client, id: &str) {
    let _: Value = client
        .request(
            "createSession",
            json!({"channel": format!("ahp-session:/{id}"), "provider": "echo"}),
        )
        .await
        .expect("createSession");
}

type Raw =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

async fn raw_initialized(server: &TestServer, client_id: &str, subscribe: &[&str]) -> Raw {
    let (mut ws, _) = tokio_tungstenite::connect_async(server.ws_url())
        .await
        .unwrap();
    let init = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "channel": "ahp-root://", "protocolVersions": ["1.0.0"], "clientId": client_id,
        "initialSubscriptions": subscribe}});
    ws.send(Message::Text(init.to_string().into()))
        .await
        .unwrap();
    loop {
        let Some(Ok(Message::Text(text))) = ws.next().await else {
            panic!("initialize answer")
        };
        let value: Value = serde_json::from_str(&text).unwrap();
        if value["id"] == 1 {
            assert!(value["result"].is_object(), "{value}");
            return ws;
        }
    }
}

/// A raw connection whose socket receive buffer is tiny, so the server
/// cannot park megabytes in the kernel for it.
async fn raw_small_buffer(server: &TestServer, client_id: &str, subscribe: &[&str]) -> Raw {
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.set_recv_buffer_size(8 * 1024).unwrap();
    let stream = socket.connect(server.addr).await.unwrap();
    let (mut ws, _) = tokio_tungstenite::client_async(
        server.ws_url(),
        tokio_tungstenite::MaybeTlsStream::Plain(stream),
    )
    .await
    .unwrap();
    let init = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "channel": "ahp-root://", "protocolVersions": ["1.0.0"], "clientId": client_id,
        "initialSubscriptions": subscribe}});
    ws.send(Message::Text(init.to_string().into()))
        .await
        .unwrap();
    ws
}

async fn a_slow_subscriber_is_closed_and_catches_up_without_delaying_others(db: TestDb) {
    let _serial = SERIAL.lock().await;
    const WRITERS: usize = 8;
    const EACH: usize = 250;
    let config = ServeConfig {
        ws: WsLimits {
            max_outbound_bytes: 2 * 1024 * 1024,
            max_replay_bytes: 15 * 1024 * 1024,
            ..Default::default()
        },
        ..ServeConfig::default()
    };
    let server = TestServer::start_with(db.open().await, config).await;
    let setup = server.initialized("setup").await;
    create(&setup, "busy").await;
    let fast = server.ahp_buffered(100_000).await;
    fast.initialize("fast".into(), vec![PROTOCOL_VERSION.into()], Vec::new())
        .await
        .unwrap();
    let (_, mut fast_sub) = fast.subscribe("ahp-session:/busy".into()).await.unwrap();
    // The slow one subscribes, then stops reading.
    let mut slow = raw_small_buffer(&server, "slow", &["ahp-session:/busy"]).await;

    // About 16 MiB in 8 KiB titles: more than the server's socket buffer
    // (at most 4 MiB here) and the slow connection's 2 MiB queue can hold.
    let pad = "p".repeat(8 * 1024);
    let mut senders = Vec::new();
    for w in 0..WRITERS {
        let writer = server.initialized(&format!("writer-{w}")).await;
        let pad = pad.clone();
        senders.push(tokio::spawn(async move {
            for i in 0..EACH {
                // A steady rate (about 4,000 envelopes/s in all), not a
                // flood: the fast subscriber must keep up, the slow one not.
                if i % 5 == 4 {
                    tokio::time::sleep(std::time::Duration::from_millis(20)).await;
                }
                writer
                    .dispatch(
                        "ahp-session:/busy".into(),
                        action(json!({"type": "session/titleChanged", "title": format!("{w}:{i:04}:{pad}")})),
                    )
                    .await
                    .unwrap();
            }
            writer
        }));
    }
    let total = WRITERS * EACH;
    let key = |t: &str| t.splitn(3, ':').take(2).collect::<Vec<_>>().join(":");
    let mut fast_seen = Vec::new();
    for _ in 0..total {
        let envelope = next_envelope(&mut fast_sub).await;
        fast_seen.push((envelope.server_seq, key(&title_of(&envelope))));
    }
    let mut writers = Vec::new();
    for sender in senders {
        writers.push(sender.await.unwrap());
    }
    assert!(
        fast_seen.windows(2).all(|w| w[0].0 < w[1].0),
        "the fast subscriber got everything in order"
    );
    for w in 0..WRITERS {
        let mine: Vec<_> = fast_seen
            .iter()
            .filter(|(_, k)| k.starts_with(&format!("{w}:")))
            .map(|(_, k)| k.clone())
            .collect();
        assert_eq!(
            mine,
            (0..EACH).map(|i| format!("{w}:{i:04}")).collect::<Vec<_>>()
        );
    }

    // Now the slow one reads: what was queued, then a close telling it why.
    let mut slow_seen: Vec<(u64, String)> = Vec::new();
    let close = loop {
        let message = tokio::time::timeout(WAIT, slow.next())
            .await
            .expect("slow connection answers")
            .expect("open");
        match message.unwrap() {
            Message::Text(text) => {
                let value: Value = serde_json::from_str(&text).unwrap();
                if value["method"] == "action" {
                    let params = &value["params"];
                    let t = params["action"]["title"].as_str().unwrap_or_default();
                    slow_seen.push((params["serverSeq"].as_u64().unwrap(), key(t)));
                }
            }
            Message::Close(frame) => break frame.expect("a close frame"),
            _ => {}
        }
    };
    assert_eq!(u16::from(close.code), 4000, "{close:?}");
    assert!(close.reason.contains("slow consumer"), "{}", close.reason);
    assert!(
        slow_seen.len() < total,
        "the slow subscriber was cut off early"
    );

    // It reconnects from its last seen seq and the stream is complete.
    let last_seen = slow_seen.last().map_or(0, |(seq, _)| *seq);
    let transport = ahp_ws::WebSocketTransport::connect(&server.ws_url())
        .await
        .unwrap();
    let back = Client::connect(transport, ahp::ClientConfig::default())
        .await
        .unwrap();
    let ReconnectResult::Replay(replay) = back
        .reconnect(
            "slow".into(),
            last_seen as i64,
            vec!["ahp-session:/busy".into()],
        )
        .await
        .unwrap()
    else {
        panic!("replay expected")
    };
    let mut all: Vec<(u64, String)> = slow_seen;
    all.extend(
        replay
            .actions
            .iter()
            .map(|e| (e.server_seq, key(&title_of(e)))),
    );
    let titles: Vec<_> = all.iter().map(|(seq, k)| (*seq, k.clone())).collect();
    assert_eq!(
        titles, fast_seen,
        "complete and gap-free after the reconnect"
    );
    let metrics = reqwest::get(format!("{}/metrics", server.base_url()))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        tether_tests::metric_value(&metrics, "tether_slow_consumer_closes_total") == Some(1.0),
        "{metrics}"
    );
    drop(writers);
    server.stop().await;
}

async fn silent_connections_are_closed_after_the_ping_deadline(db: TestDb) {
    let _serial = SERIAL.lock().await;
    let config = ServeConfig {
        ws: WsLimits {
            ping_interval: Duration::from_millis(200),
            ping_timeout: Duration::from_millis(600),
            ..Default::default()
        },
        ..ServeConfig::default()
    };
    let server = TestServer::start_with(db.open().await, config).await;
    let mut silent = raw_initialized(&server, "silent", &[]).await;
    // Not reading means not answering pings.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let close = loop {
        match tokio::time::timeout(WAIT, silent.next()).await.unwrap() {
            Some(Ok(Message::Close(frame))) => break frame.expect("a close frame"),
            Some(Ok(_)) => continue,
            other => panic!("expected a close frame, got {other:?}"),
        }
    };
    assert_eq!(u16::from(close.code), 4001);
    assert!(close.reason.contains("ping timeout"));
    // A client that reads (and so answers pings) stays connected.
    let alive = server.initialized("alive").await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    alive.ping().await.expect("still connected");
    server.stop().await;
}

async fn connection_and_subscription_limits_answer_clearly(db: TestDb) {
    let _serial = SERIAL.lock().await;
    let config = ServeConfig {
        ws: WsLimits {
            max_connections: 2,
            max_subscriptions: 1,
            ..Default::default()
        },
        ..ServeConfig::default()
    };
    let server = TestServer::start_with(db.open().await, config).await;
    let first = server.initialized("one").await;
    let _second = raw_initialized(&server, "two", &[]).await;
    match tokio_tungstenite::connect_async(server.ws_url()).await {
        Err(tokio_tungstenite::tungstenite::Error::Http(response)) => {
            assert_eq!(response.status(), 503);
            let body = String::from_utf8_lossy(response.body().as_deref().unwrap_or_default())
                .into_owned();
            assert!(body.contains("too_many_connections"), "{body}");
        }
        other => panic!("expected 503, got {:?}", other.map(|_| ())),
    }
    create(&first, "lim").await;
    first.subscribe("ahp-root://".into()).await.unwrap();
    let Err(err) = first.subscribe("ahp-session:/lim".into()).await else {
        panic!("the second subscription is over the limit")
    };
    assert!(format!("{err:?}").contains("limit"), "{err:?}");
    first.unsubscribe("ahp-root://".into()).await.unwrap();
    first
        .subscribe("ahp-session:/lim".into())
        .await
        .expect("room again after unsubscribe");
    server.stop().await;
}

async fn metric(server: &TestServer, name: &str) -> u64 {
    tether_tests::metric(&server.base_url(), name).await
}

async fn actions_ready_together_commit_together(db: TestDb) {
    let _serial = SERIAL.lock().await;
    const SESSIONS: usize = 20;
    const EACH: usize = 25;
    let server = TestServer::start(&db).await;
    let setup = server.initialized("setup").await;
    for s in 0..SESSIONS {
        create(&setup, &format!("g{s}")).await;
    }
    let commits_before = metric(&server, "tether_commits_total").await;
    let envelopes_before = metric(&server, "tether_committed_envelopes_total").await;
    let mut tasks = Vec::new();
    for s in 0..SESSIONS {
        let client = server.initialized(&format!("g-client-{s}")).await;
        tasks.push(tokio::spawn(async move {
            let channel = format!("ahp-session:/g{s}");
            let (_, mut sub) = client.subscribe(channel.clone()).await.unwrap();
            for i in 0..EACH {
                client
                    .dispatch(
                        channel.clone(),
                        action(json!({"type": "session/titleChanged", "title": format!("{i}")})),
                    )
                    .await
                    .unwrap();
            }
            for _ in 0..EACH {
                next_envelope(&mut sub).await;
            }
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
    let commits = metric(&server, "tether_commits_total").await - commits_before;
    let envelopes = metric(&server, "tether_committed_envelopes_total").await - envelopes_before;
    assert_eq!(envelopes, (SESSIONS * EACH) as u64);
    assert!(
        commits < envelopes / 2,
        "{envelopes} envelopes took {commits} transactions: no group commit"
    );
    server.stop().await;
}

async fn the_webhook_backend_accepts_refuses_and_times_out(db: TestDb) {
    let _serial = SERIAL.lock().await;
    use axum::Json;
    use axum::routing::post;
    let calls = Arc::new(AtomicUsize::new(0));
    let seen = calls.clone();
    let hook = axum::Router::new().route(
        "/hook",
        post(move |Json(body): Json<Value>| {
            let seen = seen.clone();
            async move {
                seen.fetch_add(1, Ordering::SeqCst);
                let title = body
                    .pointer("/envelope/action/title")
                    .and_then(Value::as_str)
                    .unwrap_or("");
                assert!(body.get("state").is_some() || body.get("createSession").is_some());
                let flaky_calls = if title == "flaky" {
                    seen.fetch_add(1000, Ordering::SeqCst)
                } else {
                    0
                };
                match title {
                    "flaky" if flaky_calls < 1000 => {
                        (axum::http::StatusCode::SERVICE_UNAVAILABLE, Json(json!({})))
                    }
                    "forbidden" => (
                        axum::http::StatusCode::OK,
                        Json(json!({"accept": false, "reason": "No forbidden titles here."})),
                    ),
                    "boom" => (
                        axum::http::StatusCode::INTERNAL_SERVER_ERROR,
                        Json(json!({})),
                    ),
                    "slow" => {
                        tokio::time::sleep(Duration::from_secs(3)).await;
                        (axum::http::StatusCode::OK, Json(json!({"accept": true})))
                    }
                    _ => (axum::http::StatusCode::OK, Json(json!({"accept": true}))),
                }
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let hook_addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, hook).await });

    let config = ServeConfig {
        effects: EffectsConfig::Webhook {
            url: format!("http://{hook_addr}/hook"),
        },
        engine: EngineConfig {
            effect_timeout: Duration::from_millis(500),
            ..EngineConfig::default()
        },
        ..ServeConfig::default()
    };
    let server = TestServer::start_with(db.open().await, config).await;
    let client = server.initialized("hooked").await;
    create(&client, "w").await;
    let (_, mut sub) = client.subscribe("ahp-session:/w".into()).await.unwrap();
    let outcome = |t: &'static str| {
        let client = client.clone();
        async move {
            client
                .dispatch(
                    "ahp-session:/w".into(),
                    action(json!({"type": "session/titleChanged", "title": t})),
                )
                .await
                .unwrap();
        }
    };
    outcome("fine").await;
    assert_eq!(next_envelope(&mut sub).await.rejection_reason, None);
    outcome("forbidden").await;
    assert_eq!(
        next_envelope(&mut sub).await.rejection_reason.as_deref(),
        Some("No forbidden titles here.")
    );
    outcome("boom").await;
    let reason = next_envelope(&mut sub).await.rejection_reason.unwrap();
    assert!(reason.contains("unavailable"), "{reason}");
    outcome("slow").await;
    let reason = next_envelope(&mut sub).await.rejection_reason.unwrap();
    assert!(reason.contains("unavailable"), "{reason}");
    // A transient failure is not recorded: the same origin, retried once
    // the backend is back, is accepted (over REST, which answers statuses).
    let http = reqwest::Client::new();
    let flaky = json!({"clientId": "retry-me", "clientSeq": 1, "action": {"type": "session/titleChanged", "title": "flaky"}});
    let url = format!("{}/v1/sessions/w/actions", server.base_url());
    let first = http.post(&url).json(&flaky).send().await.unwrap();
    assert_eq!(first.status(), 503, "backend unavailable");
    let second = http.post(&url).json(&flaky).send().await.unwrap();
    assert_eq!(second.status(), 200, "the retry went through");
    let calls_before_retry = calls.load(Ordering::SeqCst);
    let third = http.post(&url).json(&flaky).send().await.unwrap();
    assert_eq!(third.status(), 200, "and stays the origin's outcome");
    assert_eq!(
        calls.load(Ordering::SeqCst),
        calls_before_retry,
        "the retry of a committed dispatch ran its side effect again"
    );
    let restore = http
        .post(&url)
        .json(&json!({"clientId": "retry-me", "clientSeq": 2, "action": {"type": "session/titleChanged", "title": "fine"}}))
        .send()
        .await
        .unwrap();
    assert_eq!(restore.status(), 200);
    let snapshot = client
        .subscribe("ahp-session:/w".into())
        .await
        .unwrap()
        .0
        .snapshot
        .unwrap();
    let SnapshotState::Session(state) = snapshot.state else {
        panic!()
    };
    assert_eq!(state.title, "fine", "refused actions changed nothing");
    assert!(
        calls.load(Ordering::SeqCst) >= 5,
        "create + four dispatches reached the hook"
    );
    server.stop().await;
}

async fn session_state(client: &Client, channel: &str) -> Value {
    let result = client.subscribe(channel.into()).await.unwrap().0;
    client.unsubscribe(channel.into()).await.unwrap();
    let snapshot = result.snapshot.unwrap();
    match snapshot.state {
        SnapshotState::Session(s) => serde_json::to_value(*s).unwrap(),
        SnapshotState::Chat(c) => serde_json::to_value(*c).unwrap(),
        other => panic!("{other:?}"),
    }
}

async fn an_evicted_or_restarted_session_rebuilds_the_same_state(db: TestDb) {
    let _serial = SERIAL.lock().await;
    let config = || ServeConfig {
        engine: EngineConfig {
            actor_idle: Duration::from_millis(300),
            snapshot_every: 3,
            ..EngineConfig::default()
        },
        ..ServeConfig::default()
    };
    let server = TestServer::start_with(db.open().await, config()).await;
    let client = server.initialized("rebuild").await;
    create(&client, "rb").await;
    let (_, mut chat) = client.subscribe("ahp-chat:/rb.main".into()).await.unwrap();
    for i in 0..4 {
        client
            .dispatch(
                "ahp-session:/rb".into(),
                action(json!({"type": "session/titleChanged", "title": format!("t{i}")})),
            )
            .await
            .unwrap();
    }
    client
        .dispatch("ahp-chat:/rb.main".into(), action(json!({"type": "chat/turnStarted", "turnId": "x1",
            "startedAt": "2026-11-29T10:00:00.000Z", "message": {"text": "persist me", "origin": {"kind": "user"}}})))
        .await
        .unwrap();
    loop {
        let envelope = next_envelope(&mut chat).await;
        if serde_json::to_value(&envelope.action).unwrap()["type"] == "chat/turnComplete" {
            break;
        }
    }
    let session_live = session_state(&client, "ahp-session:/rb").await;
    let chat_live = session_state(&client, "ahp-chat:/rb.main").await;

    // Idle long enough to be evicted, then rebuilt from snapshot + tail.
    tokio::time::sleep(Duration::from_millis(1200)).await;
    assert_eq!(
        metric(&server, "tether_session_actors").await,
        0,
        "the idle actor was evicted"
    );
    assert_eq!(
        session_state(&client, "ahp-session:/rb").await,
        session_live
    );
    assert_eq!(session_state(&client, "ahp-chat:/rb.main").await, chat_live);
    client.shutdown().await;
    server.stop().await;

    let server = TestServer::start_with(db.open().await, config()).await;
    let client = server.initialized("rebuild-2").await;
    assert_eq!(
        session_state(&client, "ahp-session:/rb").await,
        session_live
    );
    assert_eq!(session_state(&client, "ahp-chat:/rb.main").await, chat_live);
    server.stop().await;
}

async fn nothing_reaches_a_subscriber_before_it_is_committed(db: TestDb) {
    let _serial = SERIAL.lock().await;
    let store = db.open().await;
    let server = TestServer::start_with(store.clone(), ServeConfig::default()).await;
    let client = server.initialized("auditor").await;
    create(&client, "cb").await;
    let (_, mut sub) = client.subscribe("ahp-session:/cb".into()).await.unwrap();
    let writer = server.initialized("writer").await;
    let mut by_seq = BTreeMap::new();
    for i in 0..30 {
        writer
            .dispatch(
                "ahp-session:/cb".into(),
                action(json!({"type": "session/titleChanged", "title": format!("c{i}")})),
            )
            .await
            .unwrap();
    }
    for _ in 0..30 {
        let envelope = next_envelope(&mut sub).await;
        // The moment it arrives, the store already holds it.
        let stored = store
            .read_after(envelope.server_seq - 1, None, 1)
            .await
            .unwrap();
        assert_eq!(stored.first().map(|e| e.seq), Some(envelope.server_seq));
        by_seq.insert(envelope.server_seq, title_of(&envelope));
    }
    assert_eq!(by_seq.len(), 30);
    server.stop().await;
}

/// The hub's per-connection inbox is bounded; one that overflows drops
/// envelopes, and its connection must then deliver them from the store: the
/// subscriber still sees every envelope once, in order.
async fn a_subscriber_whose_inbox_overflows_catches_up_from_the_store(db: TestDb) {
    let _serial = SERIAL.lock().await;
    let store = db.open().await;
    let config = ServeConfig {
        engine: EngineConfig {
            hub_buffer: 16,
            ..EngineConfig::default()
        },
        ..ServeConfig::default()
    };
    let server = TestServer::start_with(store.clone(), config).await;
    // A client-side buffer far larger than anything sent, so every loss
    // would be the server's.
    let reader = server.ahp_buffered(1 << 16).await;
    reader
        .initialize("reader".into(), vec![PROTOCOL_VERSION.into()], Vec::new())
        .await
        .unwrap();
    create(&reader, "burst").await;
    let (subscribed, mut sub) = reader.subscribe("ahp-session:/burst".into()).await.unwrap();
    let from = u64::try_from(subscribed.snapshot.unwrap().from_seq).unwrap();
    let writer = server.initialized("writer").await;
    let http = reqwest::Client::new();
    let catch_ups = || async {
        let text = http
            .get(format!("{}/metrics", server.base_url()))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        text.lines()
            .find_map(|l| l.strip_prefix("tether_catch_ups_total "))
            .and_then(|n| n.parse::<u64>().ok())
            .unwrap()
    };

    // Bursts of pipelined dispatches commit together and are published in
    // one tight loop, far past the 16-item inbox, until one overflowed.
    let mut seen = Vec::new();
    let mut sent = 0;
    for _round in 0..20 {
        for _ in 0..300 {
            writer
                .dispatch(
                    "ahp-session:/burst".into(),
                    action(json!({"type": "session/titleChanged", "title": format!("b{sent}")})),
                )
                .await
                .unwrap();
            sent += 1;
        }
        while seen.len() < sent {
            seen.push(next_envelope(&mut sub).await);
        }
        if catch_ups().await > 0 {
            break;
        }
    }
    assert!(catch_ups().await > 0, "no inbox ever overflowed");
    let titles: Vec<String> = seen.iter().map(title_of).collect();
    let expected: Vec<String> = (0..sent).map(|i| format!("b{i}")).collect();
    assert_eq!(titles, expected, "every envelope once, in order");
    let stored: Vec<u64> = store
        .read_after(from, Some(&["ahp-session:/burst".to_owned()]), 100_000)
        .await
        .unwrap()
        .iter()
        .map(|e| e.seq)
        .collect();
    let delivered: Vec<u64> = seen.iter().map(|e| e.server_seq).collect();
    assert_eq!(delivered, stored);
    server.stop().await;
}

/// A replay longer than one read (it reads pages that grow, up to what the
/// backend reads best) holds every envelope once, in order; and the count
/// and byte bounds still turn a replay one past them into snapshots.
async fn a_long_replay_is_whole_and_in_order_and_its_bounds_hold(db: TestDb) {
    const TITLES: usize = 3_500;
    let server = TestServer::start(&db).await;
    let client = server.initialized("filler").await;
    create(&client, "long").await;
    let (_, mut sub) = client.subscribe("ahp-session:/long".into()).await.unwrap();
    for i in 0..TITLES {
        client
            .dispatch(
                "ahp-session:/long".into(),
                action(json!({"type": "session/titleChanged", "title": format!("t{i}")})),
            )
            .await
            .unwrap();
    }
    let last = format!("t{}", TITLES - 1);
    while title_of(&next_envelope(&mut sub).await) != last {}
    client.shutdown().await;
    let reconnect = |server: &TestServer| {
        let url = server.ws_url();
        async move {
            let client = tether_tests::initialized_at(&url, "reader").await;
            let result = client
                .reconnect("reader".into(), 0, vec!["ahp-session:/long".into()])
                .await
                .unwrap();
            client.shutdown().await;
            result
        }
    };
    let ReconnectResult::Replay(replay) = reconnect(&server).await else {
        panic!("a replay within the bounds")
    };
    let titles: Vec<String> = replay
        .actions
        .iter()
        .map(title_of)
        .filter(|t| !t.is_empty())
        .collect();
    assert_eq!(
        titles,
        (0..TITLES).map(|i| format!("t{i}")).collect::<Vec<_>>()
    );
    assert!(
        replay
            .actions
            .windows(2)
            .all(|w| w[0].server_seq < w[1].server_seq)
    );
    let count = replay.actions.len();
    server.stop().await;

    // One envelope past the count bound, or past the byte bound: snapshots.
    for ws in [
        WsLimits {
            max_replay: count as u32 - 1,
            ..WsLimits::default()
        },
        WsLimits {
            max_replay_bytes: 100 * 1024,
            ..WsLimits::default()
        },
    ] {
        let config = ServeConfig {
            ws,
            ..ServeConfig::default()
        };
        let server = TestServer::start_with(db.open().await, config).await;
        match reconnect(&server).await {
            ReconnectResult::Snapshot(snapshots) => {
                assert_eq!(snapshots.snapshots.len(), 1);
            }
            other => panic!("expected snapshots, got {other:?}"),
        }
        server.stop().await;
    }
    // At the count bound exactly: the whole replay.
    let config = ServeConfig {
        ws: WsLimits {
            max_replay: count as u32,
            ..WsLimits::default()
        },
        ..ServeConfig::default()
    };
    let server = TestServer::start_with(db.open().await, config).await;
    match reconnect(&server).await {
        ReconnectResult::Replay(replay) => assert_eq!(replay.actions.len(), count),
        other => panic!("expected the replay, got {other:?}"),
    }
    server.stop().await;
}
