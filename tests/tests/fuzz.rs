//! Bounded fuzzing that runs in `cargo test`: property tests (proptest, on
//! stable) against the real server on a real socket, plus the committed
//! seeds in `tests/fuzz-corpus/`, which every run replays first.
//!
//! Each target stops at [`BUDGET`] or its case count, whichever comes first,
//! so the three together stay well under a minute on a two-core machine. A
//! failure prints the (shrunk) input: add it to the corpus with the fix.

use std::cell::{Cell, RefCell};
use std::time::{Duration, Instant};

use futures_util::{SinkExt, StreamExt};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};
use serde_json::{Value, json};
use tether_protocol::workdir::{canonical_file_uri, file_uri_path, path_to_file_uri};
use tether_tests::{TestDb, TestServer};
use tokio_tungstenite::tungstenite::Message;

/// The longest one target runs its generated cases.
const BUDGET: Duration = Duration::from_secs(5);

/// Generated cases per target (the budget usually ends them first).
const CASES: u32 = 400;

/// Says how many generated cases ran (shown with `--nocapture`), and fails
/// when the budget let almost none run: a fuzz target that silently stopped
/// fuzzing would otherwise pass forever.
fn report(ran: &Cell<u32>) {
    eprintln!("{} generated cases", ran.get());
    assert!(ran.get() >= 10, "only {} generated cases ran", ran.get());
}

/// A committed seed list: a JSON array of strings.
fn corpus(name: &str) -> Vec<String> {
    let path = format!("{}/fuzz-corpus/{name}", env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// A runner that keeps no failure files (CI's clone is throwaway).
fn runner() -> TestRunner {
    TestRunner::new(Config {
        cases: CASES,
        failure_persistence: None,
        ..Config::default()
    })
}

/// Keys the server's request types read, so generated objects often reach
/// past the first field check.
const KEYS: &[&str] = &[
    "id",
    "project",
    "provider",
    "workingDirectories",
    "title",
    "clientId",
    "clientSeq",
    "channel",
    "action",
    "type",
    "sessionId",
    "cwd",
    "additionalDirectories",
    "mcpServers",
    "_meta",
    "goal",
    "pendingActions",
    "decisions",
    "activeConstraints",
    "text",
    "source",
    "session",
    "params",
    "method",
    "jsonrpc",
    "protocolVersions",
    "lastSeenServerSeq",
    "subscriptions",
    "turnId",
    "message",
    "index",
    "uri",
];

/// Strings the server treats specially.
const STRINGS: &[&str] = &[
    "",
    "target-1",
    "echo",
    "ahp-session:/target-1",
    "ahp-session:/fz",
    "ahp-chat:/x",
    "ahp-root://",
    "session/titleChanged",
    "session/workingDirectorySet",
    "session/workingDirectoryRemoved",
    "session/workingDirectoryReplaced",
    "chat/turnStarted",
    "x-tether/anything",
    "/",
    "/tmp",
    "file:///",
    "file:///tmp/../..",
    "..",
    "1.0",
    "2.0",
    "a b",
];

fn key() -> impl Strategy<Value = String> {
    prop_oneof![
        3 => prop::sample::select(KEYS).prop_map(str::to_owned),
        1 => "[a-zA-Z_]{0,8}",
    ]
}

/// Any JSON value, biased towards the server's own keys and strings.
fn json_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        prop::sample::select(vec![
            0_u64,
            1,
            i64::MAX as u64,
            i64::MAX as u64 + 1,
            u64::MAX
        ])
        .prop_map(Value::from),
        any::<f64>().prop_filter_map("finite", |f| serde_json::Number::from_f64(f)
            .map(Value::Number)),
        ".{0,12}".prop_map(Value::String),
        prop::sample::select(STRINGS).prop_map(|s| Value::String(s.to_owned())),
    ];
    leaf.prop_recursive(4, 48, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            prop::collection::vec((key(), inner), 0..6)
                .prop_map(|fields| Value::Object(fields.into_iter().collect())),
        ]
    })
}

/// A request body: mostly objects, sometimes any JSON, sometimes any bytes.
fn body() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        4 => prop::collection::vec((key(), json_value()), 0..7)
            .prop_map(|f| Value::Object(f.into_iter().collect()).to_string().into_bytes()),
        1 => json_value().prop_map(|v| v.to_string().into_bytes()),
        1 => prop::collection::vec(any::<u8>(), 0..48),
    ]
}

/// Every route that takes a body, on the seeded session.
const BODY_ROUTES: &[(&str, &str)] = &[
    ("POST", "/v1/sessions"),
    ("POST", "/v1/sessions/target-1/actions"),
    ("POST", "/v1/sessions/target-1/resume"),
    ("PUT", "/v1/projects/p1/sessions/s1/working-context"),
];

/// Sends one body to one route; any 5xx, or a 4xx that is not problem+json,
/// is a failure.
async fn send_body(
    http: &reqwest::Client,
    base: &str,
    route: usize,
    body: Vec<u8>,
) -> Result<(), String> {
    let (method, path) = BODY_ROUTES[route];
    let method = reqwest::Method::from_bytes(method.as_bytes()).unwrap();
    let shown = String::from_utf8_lossy(&body).into_owned();
    let response = http
        .request(method.clone(), format!("{base}{path}"))
        .header("content-type", "application/json")
        .body(body)
        .send()
        .await
        .map_err(|e| format!("{method} {path} {shown:?}: no answer: {e}"))?;
    let status = response.status();
    let problem = response
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/problem+json"));
    if status.is_server_error() {
        return Err(format!("{method} {path} {shown:?}: {status}"));
    }
    if status.is_client_error() && !problem {
        return Err(format!(
            "{method} {path} {shown:?}: {status} without problem+json"
        ));
    }
    Ok(())
}

#[test]
fn rest_bodies_never_get_a_server_error() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let db = TestDb::sqlite();
    let dir = tempfile::tempdir().unwrap();
    let server = runtime.block_on(async {
        let server = TestServer::start(&db).await;
        let created = reqwest::Client::new()
            .post(format!("{}/v1/sessions", server.base_url()))
            .json(&json!({"id": "target-1", "project": "p1", "workingDirectories": [dir.path()]}))
            .send()
            .await
            .unwrap();
        assert_eq!(created.status(), 201);
        server
    });
    let http = reqwest::Client::new();
    let base = server.base_url();
    for seed in corpus("rest-bodies.json") {
        for route in 0..BODY_ROUTES.len() {
            let outcome =
                runtime.block_on(send_body(&http, &base, route, seed.clone().into_bytes()));
            assert_eq!(outcome, Ok(()));
        }
    }
    let deadline = Instant::now() + BUDGET;
    let ran = Cell::new(0_u32);
    let strategy = (0..BODY_ROUTES.len(), body());
    let result = runner().run(&strategy, |(route, body)| {
        if Instant::now() > deadline {
            return Ok(());
        }
        ran.set(ran.get() + 1);
        runtime
            .block_on(send_body(&http, &base, route, body))
            .map_err(TestCaseError::fail)
    });
    if let Err(failure) = result {
        panic!("{failure}");
    }
    report(&ran);
    runtime.block_on(server.stop());
}

/// Strings shaped like working-directory URIs: a prefix and segments mixing
/// dots, escapes, separators and characters that need encoding.
fn uri_like() -> impl Strategy<Value = String> {
    let prefix = prop::sample::select(vec![
        "file://",
        "file:",
        "file:/",
        "file:///",
        "file://localhost",
        "file://LocalHost/",
        "file://host/",
        "/",
        "",
    ]);
    let segment = prop_oneof![
        Just(".".to_owned()),
        Just("..".to_owned()),
        Just("".to_owned()),
        "%2[eEfF]",
        "%[0-9A-Fa-f]{2}",
        "%[0-9A-Za-z]{0,2}",
        "[a-z]{1,3}",
        "[ ?#é€~_.-]{1,2}",
        ".{1,3}",
    ];
    (prefix, prop::collection::vec(segment, 0..8), any::<bool>()).prop_map(
        |(prefix, segments, trailing)| {
            let mut uri = prefix.to_owned();
            uri.push_str(&segments.join("/"));
            if trailing {
                uri.push('/');
            }
            uri
        },
    )
}

/// The properties of one input: never panics (the caller catches that);
/// when accepted, the result is an absolute `file:` URI with no dot or empty
/// segments, is its own canonical form, and round-trips through its path.
fn check_canonical(input: &str) -> Result<(), String> {
    let Ok(canonical) = canonical_file_uri(input) else {
        return Ok(());
    };
    let path = canonical
        .strip_prefix("file://")
        .filter(|p| p.starts_with('/'))
        .ok_or_else(|| format!("{input:?} -> {canonical:?}: not an absolute file: URI"))?;
    if path != "/" {
        for segment in path[1..].split('/') {
            if matches!(segment, "" | "." | "..") {
                return Err(format!(
                    "{input:?} -> {canonical:?}: segment {segment:?} survived"
                ));
            }
        }
    }
    if path.contains(['?', '#', ' ']) {
        return Err(format!("{input:?} -> {canonical:?}: unencoded character"));
    }
    let again = canonical_file_uri(&canonical);
    if again.as_deref() != Ok(canonical.as_str()) {
        return Err(format!(
            "{input:?} -> {canonical:?} -> {again:?}: not idempotent"
        ));
    }
    let decoded = file_uri_path(&canonical)
        .map_err(|e| format!("{input:?} -> {canonical:?}: its path does not decode: {e}"))?;
    if decoded.split('/').any(|s| s == "..") {
        return Err(format!("{input:?} -> {decoded:?}: a .. segment survived"));
    }
    let round = path_to_file_uri(&decoded);
    if round.as_deref() != Ok(canonical.as_str()) {
        return Err(format!(
            "{input:?} -> {canonical:?} -> {decoded:?} -> {round:?}: no round trip"
        ));
    }
    // A trailing slash or a `.` segment names the same directory.
    for variant in [format!("{canonical}/"), format!("{canonical}/.")] {
        let same = canonical_file_uri(&variant);
        if same.as_deref() != Ok(canonical.as_str()) {
            return Err(format!("{variant:?} -> {same:?}, not {canonical:?}"));
        }
    }
    Ok(())
}

fn check_without_panic(input: &str) -> Result<(), String> {
    std::panic::catch_unwind(|| check_canonical(input))
        .unwrap_or_else(|_| Err(format!("{input:?}: panicked")))
}

#[test]
fn working_directory_canonicalisation_keeps_its_properties() {
    for seed in corpus("workdir-uris.json") {
        assert_eq!(check_without_panic(&seed), Ok(()));
    }
    let deadline = Instant::now() + BUDGET;
    let ran = Cell::new(0_u32);
    let strategy = prop_oneof![4 => uri_like(), 1 => ".{0,24}"];
    let result = runner().run(&strategy, |input| {
        if Instant::now() > deadline {
            return Ok(());
        }
        ran.set(ran.get() + 1);
        check_without_panic(&input).map_err(TestCaseError::fail)
    });
    if let Err(failure) = result {
        panic!("{failure}");
    }
    report(&ran);
}

/// Close codes that are the server's answer to something a frame asked for,
/// not a failure: a frame over the size limit, an unsupported protocol
/// version in `initialize`.
const EXPECTED_CLOSES: &[u16] = &[1009, 4002];

type Socket =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

async fn connect(url: &str) -> Socket {
    tokio_tungstenite::connect_async(url)
        .await
        .expect("connect to /ahp")
        .0
}

/// What became of a connection after one fuzz frame.
enum AfterFrame {
    /// It answered the `ping` that followed the frame.
    Alive,
    /// The server closed it with an expected code; reconnect.
    Closed,
}

/// Sends `frame`, then a `ping` request, and reads until the ping's answer:
/// the connection survived and still serves requests. A close with an
/// unexpected code, or one without a close frame, is a failure.
async fn frame_then_ping(socket: &mut Socket, frame: String, n: u64) -> Result<AfterFrame, String> {
    let shown = frame.chars().take(200).collect::<String>();
    socket
        .send(Message::Text(frame.into()))
        .await
        .map_err(|e| format!("{shown:?}: send failed: {e}"))?;
    let probe = format!("probe-{n}");
    let ping = json!({"jsonrpc": "2.0", "id": probe, "method": "ping"}).to_string();
    // The ping may find the connection already closing: that is judged by
    // what the server sends, below.
    let _ = socket.send(Message::Text(ping.into())).await;
    loop {
        let next = tokio::time::timeout(Duration::from_secs(10), socket.next())
            .await
            .map_err(|_| format!("{shown:?}: no answer to the ping within 10 s"))?;
        match next {
            Some(Ok(Message::Text(text))) => {
                let reply: Value = serde_json::from_str(&text)
                    .map_err(|e| format!("{shown:?}: the server sent non-JSON {text:?}: {e}"))?;
                if reply["id"] == probe.as_str() {
                    return if reply["result"].is_null() && reply.get("error").is_none() {
                        Ok(AfterFrame::Alive)
                    } else {
                        Err(format!("{shown:?}: ping answered {reply}"))
                    };
                }
            }
            Some(Ok(Message::Close(frame))) => {
                let code = frame.as_ref().map(|f| u16::from(f.code));
                return match code {
                    Some(code) if EXPECTED_CLOSES.contains(&code) => Ok(AfterFrame::Closed),
                    _ => Err(format!("{shown:?}: closed with {frame:?}")),
                };
            }
            Some(Ok(_)) => {}
            Some(Err(e)) => return Err(format!("{shown:?}: the connection broke: {e}")),
            None => {
                return Err(format!(
                    "{shown:?}: the connection ended without a close frame"
                ));
            }
        }
    }
}

/// A WebSocket text frame: any text, any JSON, or a JSON-RPC request with a
/// real or made-up method and arbitrary params and id.
fn frame() -> impl Strategy<Value = String> {
    let method = prop_oneof![
        4 => prop::sample::select(vec![
            "initialize",
            "reconnect",
            "ping",
            "subscribe",
            "unsubscribe",
            "dispatchAction",
            "createSession",
            "disposeSession",
            "listSessions",
            "createChat",
        ])
        .prop_map(|m| Value::String(m.to_owned())),
        1 => json_value(),
    ];
    let request = (
        prop::option::of(json_value()),
        method,
        prop::option::of(json_value()),
        any::<bool>(),
    )
        .prop_map(|(id, method, params, versioned)| {
            let mut request = serde_json::Map::new();
            if versioned {
                request.insert("jsonrpc".into(), "2.0".into());
            }
            if let Some(id) = id {
                request.insert("id".into(), id);
            }
            request.insert("method".into(), method);
            if let Some(params) = params {
                request.insert("params".into(), params);
            }
            Value::Object(request).to_string()
        });
    prop_oneof![
        4 => request,
        1 => json_value().prop_map(|v| v.to_string()),
        1 => ".{0,40}",
    ]
}

#[test]
fn websocket_frames_never_break_the_connection_or_the_server() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let db = TestDb::sqlite();
    let server = runtime.block_on(TestServer::start(&db));
    let url = server.ws_url();
    // The runner takes an `Fn`, so the connection and the frame count live
    // in cells.
    let socket = RefCell::new(runtime.block_on(connect(&url)));
    let sent = Cell::new(0_u64);
    let step = |frame: String| -> Result<(), String> {
        sent.set(sent.get() + 1);
        let mut socket = socket.borrow_mut();
        match runtime.block_on(frame_then_ping(&mut socket, frame, sent.get()))? {
            AfterFrame::Alive => {}
            AfterFrame::Closed => *socket = runtime.block_on(connect(&url)),
        }
        Ok(())
    };
    // The seeds twice: once on a fresh connection, once after `initialize`
    // (a seed), where every method is reachable.
    for _ in 0..2 {
        for seed in corpus("ws-frames.json") {
            assert_eq!(step(seed), Ok(()));
        }
    }
    let deadline = Instant::now() + BUDGET;
    let ran = Cell::new(0_u32);
    let result = runner().run(&frame(), |frame| {
        if Instant::now() > deadline {
            return Ok(());
        }
        ran.set(ran.get() + 1);
        step(frame).map_err(TestCaseError::fail)
    });
    if let Err(failure) = result {
        panic!("{failure}");
    }
    report(&ran);
    // The server still serves: a fresh connection answers ping.
    let mut fresh = runtime.block_on(connect(&url));
    let ping = json!({"jsonrpc": "2.0", "id": 1, "method": "ping"}).to_string();
    runtime.block_on(async {
        fresh.send(Message::Text(ping.into())).await.unwrap();
        loop {
            let message = tokio::time::timeout(Duration::from_secs(10), fresh.next())
                .await
                .expect("an answer in time")
                .expect("open")
                .expect("no error");
            if let Message::Text(text) = message {
                let reply: Value = serde_json::from_str(&text).unwrap();
                assert_eq!(reply, json!({"jsonrpc": "2.0", "id": 1, "result": null}));
                break;
            }
        }
        let _ = fresh.close(None).await;
    });
    drop(socket);
    runtime.block_on(server.stop());
}

/// Token parsing: whatever a caller puts in `Authorization` — random text,
/// real tokens mangled by one byte, valid segments glued to others — is
/// never accepted unless it is the untouched token, and never panics.
#[test]
fn token_parsing_accepts_only_untouched_tokens() {
    use tether_server::auth::Role;
    use tether_server::auth::token::Authenticator;
    let auth = Authenticator::new(b"the fuzz target's secret, 32 bytes or more").unwrap();
    let valid = auth
        .mint(
            "fuzz",
            Role::Operator,
            &["p".into()],
            Duration::from_secs(600),
        )
        .unwrap();
    assert!(auth.verify(&valid).is_ok());
    for seed in corpus("tokens.json") {
        assert!(auth.verify(&seed).is_err(), "{seed:?} was accepted");
    }
    let deadline = Instant::now() + BUDGET;
    let ran = Cell::new(0_u32);
    let length = valid.len();
    let mangled = (0..length, any::<u8>()).prop_map({
        let valid = valid.clone();
        move |(at, byte)| {
            let mut bytes = valid.clone().into_bytes();
            bytes[at] = byte;
            String::from_utf8_lossy(&bytes).into_owned()
        }
    });
    let strategy = prop_oneof![2 => mangled, 1 => "[A-Za-z0-9_.-]{0,400}", 1 => ".{0,64}"];
    let result = runner().run(&strategy, |input| {
        if Instant::now() > deadline {
            return Ok(());
        }
        ran.set(ran.get() + 1);
        let verdict = std::panic::catch_unwind(|| auth.verify(&input))
            .map_err(|_| TestCaseError::fail(format!("verify panicked on {input:?}")))?;
        if verdict.is_ok() && input != valid {
            // A change that decodes to the same token (base64 padding bits)
            // is the same token; anything else must be refused.
            let same = auth.verify(&input).ok().map(|p| p.sub) == Some("fuzz".to_owned());
            if !same {
                return Err(TestCaseError::fail(format!("{input:?} was accepted")));
            }
        }
        Ok(())
    });
    if let Err(failure) = result {
        panic!("{failure}");
    }
    report(&ran);
}
