//! Slow and hostile clients over real sockets, each bounded and answered
//! with a clear error or close reason, while a well-behaved bystander on
//! the same server measures its own dispatch → broadcast latency. Each
//! test prints the bystander's p50/p99 during the attack (RELIABILITY.md
//! records them); the assertions are on behaviour: the attacker is
//! stopped, the bystander keeps being served.
//!
//! Transport-level, so they run on SQLite only: the store is not what is
//! attacked.

use std::time::{Duration, Instant};

use futures_util::{SinkExt, StreamExt};
use serde_json::{Value, json};
use tether_server::config::ServeConfig;
use tether_tests::{TestDb, TestServer, action, metric, next_envelope, raw_at, raw_next, raw_send};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_tungstenite::tungstenite::Message;

/// A server with short ping deadlines and small queues, so the bounds are
/// reached in seconds.
async fn server() -> (TestServer, TestDb) {
    server_with_ping_timeout(Duration::from_secs(2)).await
}

async fn server_with_ping_timeout(ping_timeout: Duration) -> (TestServer, TestDb) {
    let mut config = ServeConfig::default();
    config.ws.ping_interval = Duration::from_millis(500);
    config.ws.ping_timeout = ping_timeout;
    config.ws.max_outbound_bytes = 1024 * 1024;
    config.ws.max_subscriptions = 100;
    let db = TestDb::sqlite();
    (TestServer::start_with(db.open().await, config).await, db)
}

/// A well-behaved client: dispatches a title to its own session and
/// waits to see it broadcast, until `stop`; returns each round trip.
struct Bystander {
    stop: tokio::sync::watch::Sender<bool>,
    task: tokio::task::JoinHandle<Vec<Duration>>,
}

impl Bystander {
    async fn start(server: &TestServer, name: &str) -> Self {
        let session = format!("bystander-{name}");
        tether_tests::create_session(&server.base_url(), &session, "echo").await;
        let client = server.initialized(&format!("bystander-{name}")).await;
        let channel = format!("ahp-session:/{session}");
        let (_, mut stream) = client.subscribe(channel.clone()).await.expect("subscribe");
        let (stop, mut stopped) = tokio::sync::watch::channel(false);
        let task = tokio::spawn(async move {
            let mut trips = Vec::new();
            let mut n = 0u64;
            while !*stopped.borrow_and_update() {
                n += 1;
                let sent = Instant::now();
                client
                    .dispatch(
                        channel.clone(),
                        action(json!({"type": "session/titleChanged", "title": format!("b{n}")})),
                    )
                    .await
                    .expect("the bystander's dispatch");
                next_envelope(&mut stream).await;
                trips.push(sent.elapsed());
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            trips
        });
        Self { stop, task }
    }

    /// Stops it and prints its latency during `what`.
    async fn report(self, what: &str) -> Vec<Duration> {
        let _ = self.stop.send(true);
        let mut trips = self.task.await.expect("the bystander kept being served");
        assert!(!trips.is_empty(), "the bystander was served during {what}");
        trips.sort();
        let at = |q: f64| trips[((trips.len() - 1) as f64 * q) as usize];
        eprintln!(
            "bystander during {what}: {} round trips, p50 {:?}, p99 {:?}, max {:?}",
            trips.len(),
            at(0.5),
            at(0.99),
            trips.last().unwrap()
        );
        trips
    }
}

/// A raw AHP connection, initialized as `client_id`.
async fn initialized(server: &TestServer, client_id: &str) -> tether_tests::RawWs {
    let mut ws = raw_at(&server.ws_url()).await;
    let init = json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
        "channel": "ahp-root://", "protocolVersions": ["1.0.0"], "clientId": client_id}});
    raw_send(&mut ws, &init.to_string()).await;
    loop {
        let message = raw_next(&mut ws).await.expect("initialized");
        if message["id"] == 0 {
            return ws;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_never_reads_is_closed_as_slow_and_others_are_served() {
    // A reader that never reads answers no ping either: with the short
    // ping deadline of the other tests, a busy machine (the flood test
    // running beside it) closed it for its silence before its queue
    // reached the byte limit, and this test saw no slow-consumer close.
    let (server, _db) = server_with_ping_timeout(Duration::from_secs(120)).await;
    let base = server.base_url();
    tether_tests::create_session(&base, "busy", "echo").await;
    let bystander = Bystander::start(&server, "never-reads").await;
    // Subscribes, then never reads again.
    let mut idle = initialized(&server, "never-reads").await;
    let subscribe = json!({"jsonrpc": "2.0", "id": 1, "method": "subscribe",
        "params": {"channel": "ahp-session:/busy"}});
    raw_send(&mut idle, &subscribe.to_string()).await;
    let writer = server.initialized("busy-writer").await;
    let padding = "x".repeat(8 * 1024);
    let started = Instant::now();
    let mut closed = false;
    for n in 0..4000 {
        writer
            .dispatch(
                "ahp-session:/busy".into(),
                action(json!({"type": "session/titleChanged", "title": format!("{n}{padding}")})),
            )
            .await
            .expect("the writer is served");
        if n % 100 == 0 && metric(&base, "tether_slow_consumer_closes_total").await > 0 {
            closed = true;
            break;
        }
    }
    assert!(closed, "the reader that never reads was closed as slow");
    let took = started.elapsed();
    bystander.report("a client that never reads").await;
    // Its close names the reason, once it reads at last.
    let mut reason = None;
    while let Some(Ok(message)) = idle.next().await {
        if let Message::Close(Some(frame)) = message {
            reason = Some((u16::from(frame.code), frame.reason.to_string()));
            break;
        }
    }
    let (code, reason) = reason.expect("a close frame after the queued ones");
    assert_eq!(code, 4000, "{reason}");
    assert!(reason.contains("slow consumer"), "{reason}");
    eprintln!("never reads: closed as slow after {took:?}");
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_megabyte_frames_are_refused_with_1009() {
    let (server, _db) = server().await;
    let bystander = Bystander::start(&server, "big-frames").await;
    let huge = format!(
        r#"{{"jsonrpc":"2.0","id":1,"method":"subscribe","params":{{"channel":"{}"}}}}"#,
        "a".repeat(10 * 1024 * 1024)
    );
    for round in 0..3 {
        let mut ws = initialized(&server, &format!("big-{round}")).await;
        // The server may close before the whole frame is written.
        let _ = ws.send(Message::Text(huge.clone().into())).await;
        let closed = raw_next(&mut ws).await;
        match closed {
            Err((1009, reason)) => assert!(reason.contains("too big"), "{reason}"),
            // Closed while the client was still writing: the reset is the answer.
            Err((0, _)) => {}
            other => panic!("a 10 MB frame was not refused: {other:?}"),
        }
    }
    bystander.report("10 MB frames").await;
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn thousands_of_subscriptions_stop_at_the_limit_with_a_clear_error() {
    let (server, _db) = server().await;
    let base = server.base_url();
    for n in 0..150 {
        tether_tests::create_session(&base, &format!("many-{n}"), "echo").await;
    }
    let bystander = Bystander::start(&server, "subscriptions").await;
    let mut ws = initialized(&server, "greedy").await;
    // 3,000 subscribe requests, pipelined, over 150 channels.
    for n in 0..3000 {
        let subscribe = json!({"jsonrpc": "2.0", "id": n + 1, "method": "subscribe",
            "params": {"channel": format!("ahp-session:/many-{}", n % 150)}});
        raw_send(&mut ws, &subscribe.to_string()).await;
    }
    let (mut ok, mut refused, mut message) = (0, 0, String::new());
    while ok + refused < 3000 {
        let answer = raw_next(&mut ws).await.expect("an answer to each");
        if answer.get("id").is_none() {
            continue;
        }
        if answer["result"].is_object() {
            ok += 1;
        } else {
            refused += 1;
            message = answer["error"]["message"]
                .as_str()
                .unwrap_or_default()
                .to_owned();
        }
    }
    assert!(refused > 0, "the limit was reached");
    assert!(
        message.contains("100") && message.to_lowercase().contains("subscription"),
        "the refusal names the limit: {message}"
    );
    let live = metric(&base, "tether_subscriptions").await;
    assert!(live <= 100 + 1, "at most the limit is held: {live}");
    bystander.report("3,000 subscribe requests").await;
    eprintln!("subscriptions: {ok} answered, {refused} refused ({message})");
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dispatch_flood_is_answered_in_order_without_starving_others() {
    let (server, _db) = server().await;
    tether_tests::create_session(&server.base_url(), "flood", "echo").await;
    let bystander = Bystander::start(&server, "flood").await;
    let ws = initialized(&server, "flooder").await;
    let (mut sink, mut stream) = ws.split();
    const FLOOD: u64 = 20_000;
    let reader = tokio::spawn(async move {
        let mut answered = 0u64;
        while answered < FLOOD {
            match tokio::time::timeout(Duration::from_secs(60), stream.next()).await {
                Ok(Some(Ok(Message::Text(text)))) => {
                    let value: Value = serde_json::from_str(&text).unwrap();
                    if value.get("id").is_some() {
                        answered += 1;
                    }
                }
                Ok(Some(Ok(_))) => {}
                other => panic!("the flood's connection ended: {other:?}"),
            }
        }
        answered
    });
    let started = Instant::now();
    for n in 1..=FLOOD {
        let dispatch = json!({"jsonrpc": "2.0", "id": n, "method": "dispatchAction", "params": {
            "channel": "ahp-session:/flood", "clientSeq": n,
            "action": {"type": "session/titleChanged", "title": format!("f{n}")}}});
        sink.send(Message::Text(dispatch.to_string().into()))
            .await
            .expect("the flood is read");
    }
    let answered = reader.await.expect("every dispatch answered");
    let took = started.elapsed();
    assert_eq!(answered, FLOOD);
    bystander.report("a 20,000-dispatch flood").await;
    eprintln!(
        "flood: {FLOOD} dispatches answered in {took:?} ({:.0}/s)",
        FLOOD as f64 / took.as_secs_f64()
    );
    server.stop().await;
}

/// The address of the server, for raw TCP.
fn addr(server: &TestServer) -> String {
    server.base_url().trim_start_matches("http://").to_owned()
}

/// Reads until EOF or `limit`; whether the server closed the socket, and
/// what it sent.
async fn closed_within(tcp: &mut tokio::net::TcpStream, limit: Duration) -> (bool, Vec<u8>) {
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    let read = tokio::time::timeout(limit, async {
        loop {
            match tcp.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => got.extend_from_slice(&buf[..n]),
            }
        }
    })
    .await;
    (read.is_ok(), got)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn half_a_frame_then_silence_is_closed_at_the_ping_deadline() {
    let (server, _db) = server().await;
    let bystander = Bystander::start(&server, "half-frame").await;
    let mut tcp = tokio::net::TcpStream::connect(addr(&server)).await.unwrap();
    let upgrade = format!(
        "GET /ahp HTTP/1.1\r\nHost: {}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
         Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\
         Sec-WebSocket-Protocol: ahp\r\n\r\n",
        addr(&server)
    );
    tcp.write_all(upgrade.as_bytes()).await.unwrap();
    let mut head = vec![0u8; 1024];
    let n = tcp.read(&mut head).await.unwrap();
    assert!(
        String::from_utf8_lossy(&head[..n]).starts_with("HTTP/1.1 101"),
        "upgraded"
    );
    // A masked text frame announcing 64 KiB, two bytes of its mask, then nothing.
    tcp.write_all(&[0x81, 0xFE, 0x00, 0x01, 0x12, 0x34])
        .await
        .unwrap();
    let started = Instant::now();
    let (closed, sent) = closed_within(&mut tcp, Duration::from_secs(10)).await;
    assert!(closed, "the stalled socket was closed");
    let took = started.elapsed();
    // Its close frame: 0x88, then the code 4001 (ping timeout).
    let close = sent
        .windows(4)
        .any(|w| w[0] == 0x88 && w[2..4] == 4001u16.to_be_bytes());
    assert!(close, "a close frame with 4001: {sent:?}");
    bystander.report("half a frame then silence").await;
    eprintln!("half a frame: closed after {took:?}");
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn half_a_request_head_then_silence_is_closed() {
    let (server, _db) = server().await;
    let mut tcp = tokio::net::TcpStream::connect(addr(&server)).await.unwrap();
    tcp.write_all(b"GET /ahp HTTP/1.1\r\nHost: x\r\nUpgr")
        .await
        .unwrap();
    let started = Instant::now();
    let (closed, _) = closed_within(&mut tcp, Duration::from_secs(40)).await;
    assert!(closed, "a request head that never ends is closed");
    eprintln!("half a request head: closed after {:?}", started.elapsed());
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_connections_a_second_opened_and_dropped_leak_nothing() {
    let (server, _db) = server().await;
    let base = server.base_url();
    let bystander = Bystander::start(&server, "churn").await;
    let baseline = metric(&base, "tether_ws_connections").await;
    let url = server.ws_url();
    let started = Instant::now();
    let mut opened = 0u64;
    for _second in 0..3 {
        let tick = Instant::now();
        let batch: Vec<_> = (0..1000)
            .map(|_| {
                let url = url.clone();
                tokio::spawn(async move { tokio_tungstenite::connect_async(url).await.is_ok() })
            })
            .collect();
        for task in batch {
            opened += u64::from(task.await.unwrap());
        }
        if let Some(rest) = Duration::from_secs(1).checked_sub(tick.elapsed()) {
            tokio::time::sleep(rest).await;
        }
    }
    let took = started.elapsed();
    assert!(
        opened >= 2900,
        "the server accepted the churn: {opened} of 3000"
    );
    let mut left = u64::MAX;
    for _ in 0..200 {
        left = metric(&base, "tether_ws_connections").await;
        if left <= baseline {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        left <= baseline,
        "{left} connections left open (baseline {baseline})"
    );
    bystander
        .report("3,000 connections opened and dropped in 3 s")
        .await;
    eprintln!("churn: {opened} connections in {took:?}");
    server.stop().await;
}
