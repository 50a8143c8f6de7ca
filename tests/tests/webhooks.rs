//! Webhooks through the real binary, on both backends, with real HTTP
//! receivers in the test: each event reaches the webhooks that want it,
//! signed (HMAC-SHA256 of the body with the webhook's secret), once per
//! attempt; a receiver that fails three times gets the event on the
//! fourth; a server killed while a delivery is in flight delivers after
//! its restart; two hosts on one Postgres deliver each event once between
//! them; a webhook's deliveries show their state and last error.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use serde_json::{Value, json};
use tether_server::webhooks::sign::signature;
use tether_tests::ahp_raw::Ahp;
use tether_tests::{ServerProcess, TestDb, backend_tests, call};

backend_tests!(
    each_event_reaches_the_webhooks_that_want_it_signed,
    a_receiver_that_fails_three_times_gets_the_event_on_the_fourth,
    a_server_killed_with_a_delivery_in_flight_delivers_after_restart,
    a_receiver_over_https_gets_its_events,
    a_project_holds_at_most_twenty_webhooks_however_fast_they_are_added,
);

const FAKE: &str = env!("CARGO_BIN_EXE_fake-acp-agent");
const WAIT: Duration = Duration::from_secs(30);

/// One request a receiver got.
#[derive(Debug, Clone)]
struct Got {
    event: String,
    delivery: String,
    attempt: String,
    signature: String,
    body: String,
}

/// A webhook receiver: records every request; answers 500 to the first
/// `fail` ones, never answers while `hold` is set, else 200.
#[derive(Default)]
struct Receiver {
    got: Mutex<Vec<Got>>,
    fail: AtomicUsize,
    hold: AtomicBool,
}

impl Receiver {
    async fn start() -> (Arc<Self>, String) {
        let receiver = Arc::new(Self::default());
        let app = axum::Router::new()
            .route("/hook", axum::routing::post(Self::take))
            .with_state(receiver.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/hook", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, app).await });
        (receiver, url)
    }

    async fn take(State(me): State<Arc<Self>>, headers: HeaderMap, body: Bytes) -> StatusCode {
        let header = |name: &str| {
            headers
                .get(name)
                .and_then(|v| v.to_str().ok())
                .unwrap_or_default()
                .to_owned()
        };
        me.got.lock().unwrap().push(Got {
            event: header("tether-event"),
            delivery: header("tether-delivery"),
            attempt: header("tether-attempt"),
            signature: header("tether-signature"),
            body: String::from_utf8_lossy(&body).into_owned(),
        });
        if me.hold.load(Ordering::SeqCst) {
            tokio::time::sleep(Duration::from_secs(3600)).await;
        }
        if me
            .fail
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok()
        {
            return StatusCode::INTERNAL_SERVER_ERROR;
        }
        StatusCode::OK
    }

    fn got(&self) -> Vec<Got> {
        self.got.lock().unwrap().clone()
    }

    /// Waits until `check` holds for what was received.
    async fn until(&self, what: &str, check: impl Fn(&[Got]) -> bool) -> Vec<Got> {
        let deadline = Instant::now() + WAIT;
        loop {
            let got = self.got();
            if check(&got) {
                return got;
            }
            assert!(Instant::now() < deadline, "{what}: got {got:#?}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

async fn start(db: &TestDb, dir: &std::path::Path) -> ServerProcess {
    let agent = format!("fake=FAKE_ACP_LOG={} {FAKE}", dir.join("log").display());
    ServerProcess::start(
        db,
        &[
            "--agent",
            &agent,
            "--agent-confinement",
            "off",
            "--webhook-retry-base-ms",
            "100",
            "--webhook-timeout-secs",
            "2",
        ],
    )
    .await
}

/// Adds a webhook; returns its id and secret.
async fn hook(base: &str, project: &str, url: &str, events: &[&str]) -> (String, String) {
    let (status, body) = call(
        base,
        "POST",
        &format!("/v1/projects/{project}/webhooks"),
        Some(json!({"url": url, "events": events})),
    )
    .await;
    assert_eq!(status, 201, "{body}");
    (
        body["id"].as_str().unwrap().to_owned(),
        body["secret"].as_str().unwrap().to_owned(),
    )
}

/// Starts a turn over REST on a session's default chat.
async fn turn(base: &str, session: &str, n: u64, text: &str) {
    let (status, body) = call(
        base,
        "POST",
        &format!("/v1/sessions/{session}/actions"),
        Some(
            json!({"clientId": format!("hooks-{session}"), "clientSeq": n,
                    "channel": format!("ahp-chat:/{session}.main"),
                    "action": {"type": "chat/turnStarted", "turnId": format!("t{n}"),
                               "startedAt": "2026-12-03T10:00:00.000Z",
                               "message": {"text": text, "origin": {"kind": "user"}}}}),
        ),
    )
    .await;
    assert_eq!(status, 200, "{body}");
}

/// Every request's signature checks out with `secret`, its body is the
/// event its headers name, and it says so consistently.
fn check_signed(got: &[Got], secret: &str) {
    for g in got {
        assert_eq!(
            g.signature,
            signature(secret, g.body.as_bytes()),
            "signed with the webhook's secret: {g:?}"
        );
        let body: Value = serde_json::from_str(&g.body).unwrap();
        assert_eq!(body["id"], g.delivery, "{g:?}");
        assert_eq!(body["type"], g.event, "{g:?}");
        assert!(body["seq"].as_u64().unwrap() > 0);
    }
}

/// Events by id, and how many requests each took.
fn by_event(got: &[Got]) -> BTreeMap<String, usize> {
    let mut out = BTreeMap::new();
    for g in got {
        *out.entry(g.delivery.clone()).or_default() += 1;
    }
    out
}

async fn each_event_reaches_the_webhooks_that_want_it_signed(db: TestDb) {
    let dir = tempfile::tempdir().unwrap();
    let server = start(&db, dir.path()).await;
    let base = server.base_url();
    let (all, all_url) = Receiver::start().await;
    let (done, done_url) = Receiver::start().await;
    let (_, secret) = hook(&base, "hooks", &all_url, &[]).await;
    let (_, done_secret) = hook(&base, "hooks", &done_url, &["turn.completed"]).await;
    // Another project's events go nowhere near them.
    let (other, other_url) = Receiver::start().await;
    hook(&base, "elsewhere", &other_url, &[]).await;

    let mut ahp = Ahp::connect(&server.ws_url(), "hooks").await;
    ahp.call(
        "createSession",
        json!({"channel": "ahp-session:/h1", "provider": "fake",
               "_meta": {"tether/project": "hooks"}}),
    )
    .await
    .unwrap();
    ahp.call("subscribe", json!({"channel": "ahp-chat:/h1.main"}))
        .await
        .unwrap();
    // A turn that completes; one that asks permission (answered); one
    // whose agent dies, which settles the session.
    ahp.ask("ahp-chat:/h1.main", "t1", "stream 2", None).await;
    let rejected = ahp
        .dispatch(
            "ahp-chat:/h1.main",
            json!({"type": "chat/turnStarted", "turnId": "t2",
                   "startedAt": "2026-12-03T10:00:00.000Z",
                   "message": {"text": "permission", "origin": {"kind": "user"}}}),
        )
        .await;
    assert_eq!(rejected, None);
    let asked = all
        .until("input needed", |got| {
            got.iter().any(|g| g.event == "input.needed")
        })
        .await;
    let question: Value = serde_json::from_str(
        &asked
            .iter()
            .find(|g| g.event == "input.needed")
            .unwrap()
            .body,
    )
    .unwrap();
    assert_eq!(question["data"]["reason"], "permission");
    assert_eq!(question["data"]["turnId"], "t2");
    assert_eq!(question["sessionId"], "h1");
    assert_eq!(question["project"], "hooks");
    let tool = question["data"]["toolCallId"].as_str().unwrap().to_owned();
    ahp.dispatch(
        "ahp-chat:/h1.main",
        json!({"type": "chat/toolCallConfirmed", "turnId": "t2", "toolCallId": tool,
               "approved": true, "selectedOptionId": "allow"}),
    )
    .await;
    ahp.action("chat/turnComplete", |a| a["turnId"] == "t2")
        .await;
    ahp.dispatch(
        "ahp-chat:/h1.main",
        json!({"type": "chat/turnStarted", "turnId": "t3",
               "startedAt": "2026-12-03T10:00:00.000Z",
               "message": {"text": "crash", "origin": {"kind": "user"}}}),
    )
    .await;
    let failed = ahp.action("chat/error", |a| a["turnId"] == "t3").await;
    assert_eq!(
        failed["part"]["error"]["errorType"], "process_exited",
        "{failed}"
    );
    // Its process gone, the session settled (dormant): that is an event too.

    let kinds = |got: &[Got]| -> Vec<String> {
        let mut k: Vec<String> = got.iter().map(|g| g.event.clone()).collect();
        k.sort();
        k.dedup();
        k
    };
    let got = all.until("every kind", |got| kinds(got).len() == 5).await;
    assert_eq!(
        kinds(&got),
        [
            "agent.failed",
            "input.needed",
            "session.settled",
            "turn.completed",
            "turn.failed"
        ]
    );
    check_signed(&got, &secret);
    // Each event once (the receiver always answered 200).
    assert!(by_event(&got).values().all(|n| *n == 1), "{got:#?}");
    assert!(got.iter().all(|g| g.attempt == "1"));
    // The seq of each event is the envelope that raised it.
    let (_, transcript) = call(&base, "GET", "/v1/sessions/h1/transcript?limit=1000", None).await;
    let types: BTreeMap<u64, String> = transcript["envelopes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            (
                e["serverSeq"].as_u64().unwrap(),
                e["action"]["type"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    for g in &got {
        let body: Value = serde_json::from_str(&g.body).unwrap();
        let raised_by = &types[&body["seq"].as_u64().unwrap()];
        let expected = match g.event.as_str() {
            "turn.completed" => "chat/turnComplete",
            "turn.failed" | "agent.failed" => "chat/error",
            "input.needed" => "chat/toolCallReady",
            _ => "x-tether/sessionSettled",
        };
        assert_eq!(raised_by, expected, "{g:?}");
    }
    // The second webhook wants turn.completed only.
    let completed = done.until("turns completed", |got| got.len() >= 2).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let completed_now = done.got();
    assert_eq!(completed_now.len(), completed.len().max(2));
    assert!(completed_now.iter().all(|g| g.event == "turn.completed"));
    check_signed(&completed_now, &done_secret);
    assert!(
        other.got().is_empty(),
        "another project's receiver got nothing"
    );

    // Listed, without secrets; a bad one refused.
    let (_, list) = call(&base, "GET", "/v1/projects/hooks/webhooks", None).await;
    assert_eq!(list["items"].as_array().unwrap().len(), 2);
    assert!(list["items"][0].get("secret").is_none(), "{list}");
    for (bad, needle) in [
        (json!({"url": "ftp://x/y"}), "http or https"),
        (json!({"url": "not a url"}), "not a URL"),
        (
            json!({"url": all_url, "events": ["turn.exploded"]}),
            "turn.exploded",
        ),
    ] {
        let (status, problem) = call(&base, "POST", "/v1/projects/hooks/webhooks", Some(bad)).await;
        assert_eq!(status, 422, "{problem}");
        assert!(
            problem["detail"].as_str().unwrap().contains(needle),
            "{problem}"
        );
    }
}

async fn a_receiver_that_fails_three_times_gets_the_event_on_the_fourth(db: TestDb) {
    let dir = tempfile::tempdir().unwrap();
    let server = start(&db, dir.path()).await;
    let base = server.base_url();
    let (receiver, url) = Receiver::start().await;
    receiver.fail.store(3, Ordering::SeqCst);
    let (id, secret) = hook(&base, "default", &url, &["turn.completed"]).await;
    tether_tests::create_session(&base, "r1", "echo").await;
    turn(&base, "r1", 1, "hello").await;
    let got = receiver.until("four attempts", |got| got.len() >= 4).await;
    assert_eq!(got.len(), 4, "{got:#?}");
    check_signed(&got, &secret);
    assert!(
        got.iter()
            .all(|g| g.delivery == got[0].delivery && g.body == got[0].body),
        "every attempt the same event, the same bytes"
    );
    let attempts: Vec<&str> = got.iter().map(|g| g.attempt.as_str()).collect();
    assert_eq!(attempts, ["1", "2", "3", "4"]);
    // Its delivery says so.
    let deadline = Instant::now() + WAIT;
    loop {
        let (status, list) = call(
            &base,
            "GET",
            &format!("/v1/projects/default/webhooks/{id}/deliveries"),
            None,
        )
        .await;
        assert_eq!(status, 200, "{list}");
        let d = &list["items"][0];
        if d["state"] == "delivered" {
            assert_eq!(d["attempts"], 4);
            assert_eq!(d["lastStatus"], 200);
            assert_eq!(d["eventId"], got[0].delivery.as_str());
            break;
        }
        assert!(Instant::now() < deadline, "{list}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(receiver.got().len(), 4, "nothing after the 2xx");
}

async fn a_server_killed_with_a_delivery_in_flight_delivers_after_restart(db: TestDb) {
    let dir = tempfile::tempdir().unwrap();
    let mut server = start(&db, dir.path()).await;
    let base = server.base_url();
    let (receiver, url) = Receiver::start().await;
    receiver.hold.store(true, Ordering::SeqCst);
    hook(&base, "default", &url, &["turn.completed"]).await;
    tether_tests::create_session(&base, "k1", "echo").await;
    turn(&base, "k1", 1, "hello").await;
    let held = receiver
        .until("the first attempt", |got| got.len() == 1)
        .await;
    // Killed while the receiver holds the request: committed, claimed,
    // not delivered.
    server.kill().await;
    receiver.hold.store(false, Ordering::SeqCst);
    server.restart().await;
    let got = receiver
        .until("the event after the restart", |got| got.len() >= 2)
        .await;
    assert_eq!(got[1].delivery, held[0].delivery, "the same event");
    assert_eq!(got[1].body, held[0].body, "the same bytes");
}

/// Two hosts on one Postgres: each event is delivered by one of them.
#[tokio::test]
async fn two_hosts_deliver_each_event_once_between_them() {
    let Some(db) = TestDb::postgres().await else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let first = start(&db, dir.path()).await;
    let second = start(&db, dir.path()).await;
    let (receiver, url) = Receiver::start().await;
    hook(&first.base_url(), "default", &url, &["turn.completed"]).await;
    let sessions = 6;
    let turns = 5;
    for s in 0..sessions {
        let base = if s % 2 == 0 {
            first.base_url()
        } else {
            second.base_url()
        };
        tether_tests::create_session(&base, &format!("two-{s}"), "echo").await;
    }
    let mut writers = Vec::new();
    for s in 0..sessions {
        let base = if s % 2 == 0 {
            first.base_url()
        } else {
            second.base_url()
        };
        writers.push(tokio::spawn(async move {
            for n in 1..=turns {
                turn(&base, &format!("two-{s}"), n, "hello").await;
            }
        }));
    }
    for w in writers {
        w.await.unwrap();
    }
    let total = (sessions * turns) as usize;
    let got = receiver
        .until("every turn's event", |got| by_event(got).len() == total)
        .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let got_now = receiver.got();
    let counts = by_event(&got_now);
    assert_eq!(counts.len(), total);
    assert!(
        counts.values().all(|n| *n == 1),
        "each event once between the two hosts: {counts:?} ({} requests)",
        got.len()
    );
}

/// A receiver behind TLS (as most are): the event reaches it over https,
/// its certificate checked against the roots the server trusts (here a
/// test authority, through `SSL_CERT_FILE`); one the server does not trust
/// gets nothing, and its delivery says why.
async fn a_receiver_over_https_gets_its_events(db: TestDb) {
    let dir = tempfile::tempdir().unwrap();
    let pki = dir.path();
    let openssl = |args: &[&str]| {
        let out = std::process::Command::new("openssl")
            .args(args)
            .current_dir(pki)
            .output()
            .expect("openssl runs");
        assert!(out.status.success(), "openssl {args:?}: {out:?}");
    };
    let ec = [
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:P-256",
        "-nodes",
    ];
    openssl(
        &[
            &["req", "-x509"][..],
            &ec,
            &[
                "-keyout",
                "ca.key",
                "-out",
                "ca.pem",
                "-days",
                "2",
                "-subj",
                "/CN=Tether test CA",
            ],
        ]
        .concat(),
    );
    openssl(
        &[
            &["req"][..],
            &ec,
            &[
                "-keyout",
                "leaf.key",
                "-out",
                "leaf.csr",
                "-subj",
                "/CN=localhost",
            ],
        ]
        .concat(),
    );
    std::fs::write(
        pki.join("leaf.ext"),
        "subjectAltName=DNS:localhost,IP:127.0.0.1\nbasicConstraints=CA:FALSE\n\
         keyUsage=digitalSignature\nextendedKeyUsage=serverAuth\n",
    )
    .unwrap();
    openssl(&[
        "x509",
        "-req",
        "-in",
        "leaf.csr",
        "-CA",
        "ca.pem",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
        "-out",
        "leaf.pem",
        "-days",
        "2",
        "-extfile",
        "leaf.ext",
    ]);
    // The receiver: Python's HTTP server wrapped in TLS, writing each
    // event's type to a file.
    let events = pki.join("events");
    let receiver = "import http.server, ssl, sys\n\
        class H(http.server.BaseHTTPRequestHandler):\n\
        \x20   def do_POST(self):\n\
        \x20       self.rfile.read(int(self.headers.get('content-length', 0)))\n\
        \x20       with open(sys.argv[3], 'a') as f: f.write(self.headers.get('tether-event', '') + '\\n')\n\
        \x20       self.send_response(200); self.end_headers()\n\
        \x20   def log_message(self, *a): pass\n\
        s = http.server.HTTPServer(('127.0.0.1', 0), H)\n\
        c = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER); c.load_cert_chain(sys.argv[1], sys.argv[2])\n\
        s.socket = c.wrap_socket(s.socket, server_side=True)\n\
        print(s.server_address[1], flush=True)\n\
        s.serve_forever()\n";
    let mut child = tokio::process::Command::new("python3")
        .args(["-c", receiver])
        .arg(pki.join("leaf.pem"))
        .arg(pki.join("leaf.key"))
        .arg(&events)
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("python3 runs");
    let mut port = String::new();
    {
        use tokio::io::AsyncBufReadExt;
        let stdout = child.stdout.take().unwrap();
        tokio::io::BufReader::new(stdout)
            .read_line(&mut port)
            .await
            .unwrap();
    }
    let url = format!("https://localhost:{}/hook", port.trim());

    let ca = pki.join("ca.pem");
    let mut server = ServerProcess::start_with_env(
        &db,
        &[
            "--webhook-retry-base-ms",
            "100",
            "--webhook-timeout-secs",
            "2",
        ],
        &[("SSL_CERT_FILE", ca.to_str().unwrap())],
    )
    .await;
    let base = server.base_url();
    hook(&base, "default", &url, &["turn.completed"]).await;
    tether_tests::create_session(&base, "tls-1", "echo").await;
    turn(&base, "tls-1", 1, "hello").await;
    let deadline = Instant::now() + WAIT;
    while !std::fs::read_to_string(&events)
        .unwrap_or_default()
        .contains("turn.completed")
    {
        assert!(
            Instant::now() < deadline,
            "no event over https; the server's log: {}",
            server.log()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // A server that does not trust the receiver's authority sends nothing
    // to it, and says why.
    // Stopped and waited for: SQLite serves one process at a time.
    server.terminate().await;
    std::fs::remove_file(&events).ok();
    let untrusting = ServerProcess::start_with_env(
        &db,
        &[
            "--webhook-retry-base-ms",
            "100",
            "--webhook-timeout-secs",
            "2",
        ],
        &[("SSL_CERT_FILE", pki.join("leaf.pem").to_str().unwrap())],
    )
    .await;
    let base = untrusting.base_url();
    let (id, _) = hook(&base, "other", &url, &["turn.completed"]).await;
    let (status, body) = call(
        &base,
        "POST",
        "/v1/sessions",
        Some(json!({"id": "tls-2", "project": "other"})),
    )
    .await;
    assert_eq!(status, 201, "{body}");
    turn(&base, "tls-2", 1, "hello").await;
    let deadline = Instant::now() + WAIT;
    loop {
        let (_, list) = call(
            &base,
            "GET",
            &format!("/v1/projects/other/webhooks/{id}/deliveries"),
            None,
        )
        .await;
        let error = list["items"][0]["lastError"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        if !error.is_empty() {
            assert!(
                std::fs::read_to_string(&events)
                    .unwrap_or_default()
                    .is_empty()
            );
            break;
        }
        assert!(Instant::now() < deadline, "{list}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Nineteen webhooks, then twenty additions at once: one is made, nineteen
/// refused with 409, and the project lists twenty (the bound is counted
/// where the row is added, not before).
async fn a_project_holds_at_most_twenty_webhooks_however_fast_they_are_added(db: TestDb) {
    let server = ServerProcess::start(&db, &[]).await;
    let base = server.base_url();
    let add = |n: usize| {
        let base = base.clone();
        async move {
            call(
                &base,
                "POST",
                "/v1/projects/many/webhooks",
                Some(json!({"url": format!("http://127.0.0.1:9/{n}")})),
            )
            .await
        }
    };
    for n in 0..19 {
        assert_eq!(add(n).await.0, 201);
    }
    // The adds arrive while the database's writes are held back, so each
    // would read 19 before any of them is written: a count read before
    // its insert would let them all in.
    let held = db.hold_writes("webhooks").await;
    let (added, ()) = tokio::join!(futures_util::future::join_all((19..39).map(add)), async {
        tokio::time::sleep(std::time::Duration::from_millis(700)).await;
        held.release().await;
    });
    let made = added.iter().filter(|(status, _)| *status == 201).count();
    let refused = added
        .iter()
        .filter(|(status, body)| *status == 409 && body.to_string().contains("as many as it may"))
        .count();
    assert_eq!((made, refused), (1, 19), "{added:?}");
    let (_, list) = call(&base, "GET", "/v1/projects/many/webhooks", None).await;
    assert_eq!(list["items"].as_array().unwrap().len(), 20, "{list}");
}
