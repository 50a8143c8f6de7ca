//! What an operator sees: `/metrics` counting what happens (with bounded
//! labels), one structured log line per request and per WebSocket
//! connection, and the SIGTERM sequence: not ready first, new connections
//! refused, open sockets closed 1001, the process gone within its grace.

use std::time::Duration;

use serde_json::{Value, json};
use tether_tests::{
    ServerProcess, TestDb, TestServer, action, backend_tests, metric_value, raw_at, raw_next,
    raw_send,
};

backend_tests!(
    doctor_passes_a_sound_setup_and_names_each_fault,
    metrics_count_dispatches_subscriptions_and_deliveries,
    sigterm_turns_not_ready_refuses_new_sockets_and_closes_open_ones,
    the_runtime_has_the_workers_its_backend_or_flag_gives,
);

async fn the_runtime_has_the_workers_its_backend_or_flag_gives(db: TestDb) {
    // SQLite commits on a thread of its own, so its host leaves that
    // thread a core; a Postgres host takes them all.
    let cores = std::thread::available_parallelism().map_or(1, std::num::NonZero::get);
    let expected = if db.url().starts_with("postgres") {
        cores
    } else {
        cores.saturating_sub(1).max(1)
    };
    let json = ["--log-format", "json"];
    for (flag, workers) in [(vec![], expected), (vec!["--worker-threads", "3"], 3)] {
        let args = [&json[..], &flag].concat();
        let mut server = ServerProcess::start(&db, &args).await;
        tether_tests::create_session(
            &server.base_url(),
            &format!("ops-workers-{workers}"),
            "echo",
        )
        .await;
        let serving = log_lines(&server.log())
            .into_iter()
            .find(|l| l["message"] == "tether is serving")
            .expect("the start line");
        assert_eq!(serving["workers"], workers, "{serving}");
        server.terminate().await;
    }
}

async fn exposition(base: &str) -> String {
    reqwest::get(format!("{base}/metrics"))
        .await
        .expect("GET /metrics")
        .text()
        .await
        .expect("the exposition")
}

fn series(text: &str, name: &str) -> f64 {
    metric_value(text, name).unwrap_or_else(|| panic!("{name} missing from {text}"))
}

async fn metrics_count_dispatches_subscriptions_and_deliveries(db: TestDb) {
    let server = TestServer::start(&db).await;
    let base = server.base_url();
    tether_tests::create_session(&base, "ops-metrics", "echo").await;
    let watcher = server.initialized("ops-watcher").await;
    let (_, mut stream) = watcher
        .subscribe("ahp-session:/ops-metrics".into())
        .await
        .expect("subscribe");
    watcher
        .subscribe("ahp-chat:/ops-metrics.main".into())
        .await
        .expect("subscribe the chat");
    let writer = server.initialized("ops-writer").await;
    for n in 0..3 {
        writer
            .dispatch(
                "ahp-session:/ops-metrics".into(),
                action(json!({"type": "session/titleChanged", "title": format!("t{n}")})),
            )
            .await
            .expect("dispatch");
        tether_tests::next_envelope(&mut stream).await;
    }
    // Refused as invalid: a turn on the session channel.
    let refused = reqwest::Client::new()
        .post(format!("{base}/v1/sessions/ops-metrics/actions"))
        .json(&json!({"clientId": "ops-rest", "clientSeq": 1,
            "action": {"type": "chat/turnStarted", "turnId": "x", "message": {"text": "hi"}}}))
        .send()
        .await
        .expect("dispatch");
    assert_eq!(refused.status(), 422);
    let text = exposition(&base).await;
    assert!(
        series(
            &text,
            r#"tether_dispatches_total{outcome="accepted",reason="none"}"#
        ) >= 3.0
    );
    assert_eq!(
        series(
            &text,
            r#"tether_dispatches_total{outcome="rejected",reason="invalid"}"#
        ),
        1.0
    );
    assert!(series(&text, "tether_dispatch_to_commit_seconds_count") >= 4.0);
    assert!(series(&text, "tether_commit_to_delivery_seconds_count") >= 3.0);
    assert!(series(&text, "tether_commit_batch_envelopes_count") >= 1.0);
    // The local backend has no effect on a title or a turn: it is not
    // called, so not timed. A working directory it checks is.
    let local_effects = r#"tether_effect_duration_seconds_count{backend="local"}"#;
    assert_eq!(series(&text, local_effects), 0.0);
    let directory = tempfile::tempdir().expect("a directory");
    writer
        .dispatch(
            "ahp-session:/ops-metrics".into(),
            action(json!({"type": "session/workingDirectorySet",
                "directory": format!("file://{}", directory.path().display())})),
        )
        .await
        .expect("dispatch");
    // Committed: the watcher sees it (a refusal reaches its sender only).
    let committed = tether_tests::next_envelope(&mut stream).await;
    assert!(
        matches!(
            committed.action,
            ahp_types::actions::StateAction::SessionWorkingDirectorySet(_)
        ),
        "{committed:?}"
    );
    let text = exposition(&base).await;
    assert_eq!(series(&text, local_effects), 1.0);
    assert_eq!(
        series(&text, r#"tether_subscriptions{kind="session"}"#),
        1.0
    );
    assert_eq!(series(&text, r#"tether_subscriptions{kind="chat"}"#), 1.0);
    assert_eq!(series(&text, "tether_ws_connections"), 2.0);
    assert_eq!(series(&text, "tether_ready"), 1.0);
    assert!(series(&text, "tether_server_seq") >= 3.0);
    assert!(series(&text, "tether_session_actors") >= 1.0);
    // Low-cardinality labels only: no session, client or principal.
    for id in ["ops-metrics", "ops-watcher", "ops-writer", "ops-rest"] {
        assert!(!text.contains(id), "{id} appears in /metrics");
    }
    // Closing the subscriber gives its subscriptions back.
    drop(stream);
    drop(watcher);
    let mut left = f64::NAN;
    for _ in 0..200 {
        left = series(&exposition(&base).await, "tether_subscriptions");
        if left == 0.0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    assert_eq!(left, 0.0, "the closed connection's subscriptions are gone");
    server.stop().await;
}

/// The lines of a JSON log.
fn log_lines(log: &str) -> Vec<Value> {
    log.lines()
        .filter_map(|line| serde_json::from_str(line).ok())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_request_and_connection_is_one_structured_line_naming_the_principal() {
    let db = TestDb::sqlite();
    let secret = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(
        secret.path(),
        "a log test secret that is long enough, 256 bits+",
    )
    .unwrap();
    let mut server = ServerProcess::start(
        &db,
        &[
            "--log-format",
            "json",
            "--auth-secret-file",
            secret.path().to_str().unwrap(),
        ],
    )
    .await;
    let token = tether_server::auth::token::Authenticator::new(
        b"a log test secret that is long enough, 256 bits+",
    )
    .unwrap()
    .mint(
        "ops-alice",
        tether_server::auth::Role::Operator,
        &["ops".to_owned()],
        Duration::from_secs(600),
    )
    .unwrap();
    let answer = reqwest::Client::new()
        .post(format!("{}/v1/sessions", server.base_url()))
        .bearer_auth(&token)
        .header("x-request-id", "ops-request-1")
        .json(&json!({"id": "ops-logged", "project": "ops", "provider": "echo"}))
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status(), 201);
    assert_eq!(answer.headers()["x-request-id"], "ops-request-1");
    let refused = reqwest::get(format!("{}/v1/sessions", server.base_url()))
        .await
        .unwrap();
    assert_eq!(refused.status(), 401);
    let mut ws = raw_at(&format!("{}?access_token={token}", server.ws_url())).await;
    raw_send(
        &mut ws,
        r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"channel":"ahp-root://","protocolVersions":["1.0.0"],"clientId":"ops-c"}}"#,
    )
    .await;
    raw_next(&mut ws).await.expect("initialized");
    drop(ws);
    let mut lines = Vec::new();
    for _ in 0..100 {
        lines = log_lines(&server.log());
        if lines.iter().any(|l| l["message"] == "websocket closed") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let request = lines
        .iter()
        .find(|l| l["message"] == "request" && l["span"]["request_id"] == "ops-request-1")
        .unwrap_or_else(|| panic!("no line for the request: {lines:#?}"));
    assert_eq!(request["status"], 201);
    assert_eq!(request["span"]["route"], "/v1/sessions");
    assert_eq!(request["span"]["method"], "POST");
    assert_eq!(request["span"]["sub"], "ops-alice");
    assert!(request["latency_us"].is_u64());
    assert!(
        lines
            .iter()
            .any(|l| l["message"] == "request" && l["status"] == 401),
        "the refused request has its line too"
    );
    let closed = lines
        .iter()
        .find(|l| l["message"] == "websocket closed")
        .expect("the connection's close line");
    assert_eq!(closed["sub"], "ops-alice");
    assert_eq!(closed["client"], "ops-c");
    assert!(closed["bytes_in"].as_u64().unwrap() > 50, "{closed}");
    assert!(closed["bytes_out"].as_u64().unwrap() > 10, "{closed}");
    assert!(closed["duration_ms"].is_u64(), "{closed}");
    assert!(
        lines.iter().any(|l| l["message"] == "websocket opened"),
        "the open line"
    );
    let log = server.log();
    assert!(!log.contains(&token), "a token was logged");
    server.terminate().await;
}

async fn sigterm_turns_not_ready_refuses_new_sockets_and_closes_open_ones(db: TestDb) {
    let mut server = ServerProcess::start(
        &db,
        &["--drain-delay-ms", "1500", "--shutdown-grace-secs", "5"],
    )
    .await;
    tether_tests::create_session(&server.base_url(), "ops-drain", "echo").await;
    let mut ws = raw_at(&server.ws_url()).await;
    raw_send(
        &mut ws,
        r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"channel":"ahp-root://","protocolVersions":["1.0.0"],"clientId":"ops-d","initialSubscriptions":["ahp-session:/ops-drain"]}}"#,
    )
    .await;
    raw_next(&mut ws).await.expect("initialized");
    let started = std::time::Instant::now();
    server.begin_terminate();
    // Not ready first, while the socket is still open.
    let http = reqwest::Client::new();
    let mut not_ready = None;
    for _ in 0..100 {
        let answer = http
            .get(format!("{}/readyz", server.base_url()))
            .send()
            .await
            .expect("readyz during the drain delay");
        if answer.status() == 503 {
            not_ready = Some(answer.json::<Value>().await.unwrap());
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let not_ready = not_ready.expect("/readyz turned 503");
    assert_eq!(not_ready["code"], "shutting_down", "{not_ready}");
    // New connections are refused with a reason while draining.
    let refused = tokio_tungstenite::connect_async(server.ws_url()).await;
    match refused {
        Err(tokio_tungstenite::tungstenite::Error::Http(response)) => {
            assert_eq!(response.status(), 503);
        }
        other => panic!("a new socket was accepted while draining: {other:?}"),
    }
    // The open socket is closed 1001 after the drain delay.
    let closed = raw_next(&mut ws).await;
    assert_eq!(
        closed,
        Err((1001, "server shutting down".to_owned())),
        "the open socket's close"
    );
    assert!(
        started.elapsed() >= Duration::from_millis(1400),
        "closed before the drain delay ran out: {:?}",
        started.elapsed()
    );
    let status = server
        .wait_exit(Duration::from_secs(10))
        .await
        .expect("the process exited within its grace period");
    assert!(status.success(), "{status}");
    // Nothing was lost: a restart serves the session.
    server.restart().await;
    let view = reqwest::get(format!("{}/v1/sessions/ops-drain", server.base_url()))
        .await
        .unwrap();
    assert_eq!(view.status(), 200);
    server.terminate().await;
}

/// `tether doctor` with `args` (and nothing from the environment): its
/// exit code and output.
async fn doctor(args: &[&str]) -> (i32, String) {
    let mut command = tokio::process::Command::new(tether_tests::tether_bin());
    for (key, _) in std::env::vars() {
        if key.starts_with("TETHER_") {
            command.env_remove(key);
        }
    }
    let output = command
        .arg("doctor")
        .args(args)
        .stdin(std::process::Stdio::null())
        .output()
        .await
        .expect("run tether doctor");
    let text = String::from_utf8_lossy(&output.stdout).into_owned()
        + &String::from_utf8_lossy(&output.stderr);
    (output.status.code().unwrap_or(-1), text)
}

/// The report's line about `subject`, which must exist.
fn line<'a>(report: &'a str, mark: &str, subject: &str) -> &'a str {
    report
        .lines()
        .find(|l| l.starts_with(mark) && l[6..].starts_with(subject))
        .unwrap_or_else(|| panic!("no {mark} line for {subject}: {report}"))
}

async fn doctor_passes_a_sound_setup_and_names_each_fault(db: TestDb) {
    // A migrated store (a server ran on it), a free port, a real agent,
    // a strong secret, a root that exists.
    TestServer::start(&db).await.stop().await;
    let fake = env!("CARGO_BIN_EXE_fake-acp-agent");
    let root = tempfile::tempdir().unwrap();
    let secret = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(
        secret.path(),
        "9f8e7d6c5b4a39281706f5e4d3c2b1a0-strong-enough",
    )
    .unwrap();
    let free = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = free.local_addr().unwrap().to_string();
    drop(free);
    let agent = format!("fake={fake}");
    let sound = [
        "--database-url",
        db.url(),
        "--bind",
        &port,
        "--auth-secret-file",
        secret.path().to_str().unwrap(),
        "--agent",
        &agent,
        "--allowed-roots",
        root.path().to_str().unwrap(),
        "--max-connections",
        "1000",
    ];
    let (code, report) = doctor(&sound).await;
    assert_eq!(code, 0, "{report}");
    assert!(
        line(&report, "ok", "store").contains("answers")
            || line(&report, "ok", "store").contains("opens")
    );
    assert!(
        line(&report, "ok", "migrations").contains("applied"),
        "{report}"
    );
    assert!(
        line(&report, "ok", "agent").contains("answered initialize"),
        "{report}"
    );
    line(&report, "ok", "auth secret");
    line(&report, "ok", "bind address");
    line(&report, "ok", "allowed root");
    line(&report, "ok", "open files");
    assert!(
        line(&report, "ok", "confinement").contains("Landlock"),
        "{report}"
    );
    assert!(
        line(&report, "ok", "reach").contains("none of Tether's"),
        "{report}"
    );
    assert!(!report.contains("FAIL"), "{report}");

    // Each fault, in plain words, and a failing exit.
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let taken_port = taken.local_addr().unwrap().to_string();
    let weak = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(weak.path(), "a".repeat(40)).unwrap();
    let broken = format!("broken=FAKE_ACP_MODE=never-init {fake}");
    // An agent told of the folder holding the secret file could read it.
    let exposed = format!("exposed={fake} {}", weak.path().parent().unwrap().display());
    let unreachable = match db.backend() {
        tether_tests::Backend::Postgres => "postgres://postgres@127.0.0.1:1/none".to_owned(),
        tether_tests::Backend::Sqlite => "sqlite:/nonexistent-dir/x/tether.db".to_owned(),
    };
    let (code, report) = doctor(&[
        "--database-url",
        &unreachable,
        "--database-connect-timeout-secs",
        "2",
        "--bind",
        &taken_port,
        "--auth-secret-file",
        weak.path().to_str().unwrap(),
        "--agent",
        &broken,
        "--agent",
        &exposed,
        "--agent-init-timeout-ms",
        "500",
        "--allowed-roots",
        "/nonexistent-root",
    ])
    .await;
    assert_eq!(code, 1, "{report}");
    assert!(
        line(&report, "FAIL", "auth secret").contains("guessable"),
        "{report}"
    );
    assert!(
        line(&report, "FAIL", "bind address").contains("already in use"),
        "{report}"
    );
    assert!(
        line(&report, "FAIL", "store").contains("cannot"),
        "{report}"
    );
    assert!(
        line(&report, "FAIL", "allowed root").contains("/nonexistent-root"),
        "{report}"
    );
    assert!(
        line(&report, "FAIL", "agent").contains("broken"),
        "{report}"
    );
    assert!(
        line(&report, "FAIL", "reach").contains("exposed could reach"),
        "{report}"
    );
    assert!(report.contains("check(s) failed"), "{report}");
    drop(taken);
    // A bad configuration is named before anything else is tried.
    let (code, report) = doctor(&["--database-url", db.url(), "--effects", "webhook"]).await;
    assert_eq!(code, 1, "{report}");
    line(&report, "FAIL", "configuration");
}
