//! The trust boundary (SECURITY.md), through the real binary on both
//! backends: no web page on another origin, no principal of another
//! project and no agent process reaches past what it is given.
//!
//! * Browsers: a foreign `Origin` is refused on the WebSocket and on REST,
//!   a foreign `Host` (a rebound DNS name) without authentication; the
//!   server's own pages, programs and an allowed console keep working.
//! * Names: a session's default chat cannot be taken first, another
//!   project's chat cannot be subscribed to, created or replayed, on one
//!   host and across two; unknown ids start no actor and take no lease,
//!   and a disposed session's lease goes.
//! * Agents: an empty environment plus an allow-list and their own keys;
//!   confined by Landlock to their session's directories; started on the
//!   resolved directory, inside the allowed roots, for every backend.
//! * Client tools: after a restart the host context and the answer stay
//!   with the principal that registered the tool.
//! * Small ones: a request-head deadline on kept-alive connections; the
//!   served OpenAPI document states the security the server enforces.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use tether_server::auth::Role;
use tether_server::auth::credentials::Auth;
use tether_server::auth::limits::{LimitsConfig, PrincipalLimits};
use tether_server::auth::token::Authenticator;
use tether_server::config::ServeConfig;
use tether_tests::{Backend, ServerProcess, TestDb, TestServer, backend_tests};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_tungstenite::tungstenite::client::IntoClientRequest;

backend_tests!(
    a_chat_named_first_by_another_project_leaks_nothing,
    a_projects_root_is_kept_for_it,
    unknown_ids_start_no_actor_and_take_no_lease,
    an_agent_sees_none_of_the_servers_secrets_and_reaches_only_its_own_directories,
    every_backend_keeps_sessions_and_agents_inside_the_allowed_roots,
    a_client_tools_context_stays_with_its_principal_after_a_restart,
    another_projects_session_named_starts_no_actor,
    a_session_created_with_its_client_active_is_its_creators,
);

const FAKE: &str = env!("CARGO_BIN_EXE_fake-acp-agent");
const SECRET: &str = "a trust-boundary test secret, well over 32 bytes long";
const WAIT: Duration = Duration::from_secs(20);
/// A secret given as a flag, which no agent may read off the server's
/// command line.
const METRICS_TOKEN_ON_THE_COMMAND_LINE: &str = "a-metrics-token-given-on-the-command-line";

fn mint(sub: &str, role: Role, projects: &[&str]) -> String {
    tether_tests::mint(SECRET, sub, role, projects)
}

/// A secret file for `--auth-secret-file`, in a folder of its own.
fn secret_file() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("secret");
    std::fs::write(&path, SECRET).unwrap();
    (dir, path)
}

/// A REST caller of one server with one token (or none).
struct Rest {
    base: String,
    token: Option<String>,
    http: reqwest::Client,
}

impl Rest {
    fn new(base: String, token: Option<String>) -> Self {
        Self {
            base,
            token,
            http: reqwest::Client::new(),
        }
    }

    async fn call(&self, method: &str, path: &str, body: Option<Value>) -> (u16, Value) {
        let method = reqwest::Method::from_bytes(method.as_bytes()).unwrap();
        let mut request = self.http.request(method, format!("{}{path}", self.base));
        if let Some(token) = &self.token {
            request = request.bearer_auth(token);
        }
        if let Some(body) = body {
            request = request.json(&body);
        }
        let response = request.send().await.expect("the server answers");
        let status = response.status().as_u16();
        let text = response.text().await.unwrap_or_default();
        (
            status,
            serde_json::from_str(&text).unwrap_or(Value::String(text)),
        )
    }

    async fn create(&self, body: Value) {
        let (status, answer) = self.call("POST", "/v1/sessions", Some(body)).await;
        assert_eq!(status, 201, "{answer}");
    }

    /// Starts a turn on `session`'s default chat.
    async fn turn(&self, session: &str, turn: &str, text: &str) -> (u16, Value) {
        let body = json!({"clientId": format!("rest-{session}-{turn}"), "clientSeq": 1,
            "channel": format!("ahp-chat:/{session}.main"),
            "action": {"type": "chat/turnStarted", "turnId": turn, "startedAt": "2026-12-02T10:00:00.000Z",
                       "message": {"text": text, "origin": {"kind": "user"}}}});
        self.call(
            "POST",
            &format!("/v1/sessions/{session}/actions"),
            Some(body),
        )
        .await
    }

    /// The actions of `session`'s transcript.
    async fn transcript(&self, session: &str) -> Vec<Value> {
        let (status, page) = self
            .call(
                "GET",
                &format!("/v1/sessions/{session}/transcript?after=0&limit=1000"),
                None,
            )
            .await;
        assert_eq!(status, 200, "{page}");
        page["envelopes"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e["action"].clone())
            .collect()
    }

    /// Runs a turn and returns the agent's answer (or its error).
    async fn ask(&self, session: &str, turn: &str, text: &str) -> String {
        let (status, answer) = self.turn(session, turn, text).await;
        assert_eq!(status, 200, "{answer}");
        let deadline = Instant::now() + WAIT;
        loop {
            let actions = self.transcript(session).await;
            let mine = |a: &&Value| a["turnId"] == turn;
            if let Some(error) = actions
                .iter()
                .filter(mine)
                .find(|a| a["type"] == "chat/error")
            {
                return format!("ERROR {}", error["part"]["error"]["message"]);
            }
            if actions
                .iter()
                .filter(mine)
                .any(|a| a["type"] == "chat/turnComplete")
            {
                let mut text = String::new();
                for a in actions.iter().filter(mine) {
                    match a["type"].as_str() {
                        Some("chat/responsePart") => {
                            text.push_str(a["part"]["content"].as_str().unwrap_or_default())
                        }
                        Some("chat/delta") => {
                            text.push_str(a["content"].as_str().unwrap_or_default())
                        }
                        _ => {}
                    }
                }
                return text;
            }
            assert!(
                Instant::now() < deadline,
                "turn {turn} never ended: {actions:#?}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// An upstream AHP client on `url` with `token` in the upgrade's header,
/// initialized as `client_id`.
async fn ahp_as(url: &str, token: &str, client_id: &str) -> ahp::Client {
    tether_tests::ahp_with_token(url, token, client_id, Vec::new()).await
}

fn port_of(base: &str) -> u16 {
    base.rsplit(':').next().unwrap().parse().unwrap()
}

/// The status a WebSocket upgrade to `url` gets with these extra headers.
async fn upgrade_status(url: &str, headers: &[(&str, &str)]) -> u16 {
    let mut request = url.into_client_request().unwrap();
    for (name, value) in headers {
        request.headers_mut().insert(
            axum::http::HeaderName::from_bytes(name.as_bytes()).unwrap(),
            value.parse().unwrap(),
        );
    }
    match tokio_tungstenite::connect_async(request).await {
        Ok((_, response)) => response.status().as_u16(),
        Err(tokio_tungstenite::tungstenite::Error::Http(response)) => response.status().as_u16(),
        Err(other) => panic!("the upgrade failed without an answer: {other}"),
    }
}

/// A request with a chosen `Host` (and `Origin`), as a page that rebound its
/// DNS name to this host would send it.
async fn with_host(
    base: &str,
    method: reqwest::Method,
    path: &str,
    host: &str,
    origin: Option<&str>,
) -> (u16, reqwest::header::HeaderMap, Value) {
    let mut request = reqwest::Client::new()
        .request(method, format!("{base}{path}"))
        .header("host", host);
    if let Some(origin) = origin {
        request = request.header("origin", origin);
    }
    let response = request.send().await.expect("the server answers");
    let status = response.status().as_u16();
    let headers = response.headers().clone();
    let body = response.json().await.unwrap_or(Value::Null);
    (status, headers, body)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_page_on_another_origin_cannot_drive_a_default_install() {
    let db = TestDb::sqlite();
    let console = "https://console.example.com";
    let server = ServerProcess::start(&db, &["--allowed-origins", console]).await;
    let base = server.base_url();
    let ws = server.ws_url();
    let port = port_of(&base);
    let own = format!("http://127.0.0.1:{port}");
    let evil = "http://evil.example";

    // The WebSocket: a foreign origin is refused before any AHP is spoken;
    // programs (no Origin), the server's own pages and the allowed console
    // are served.
    assert_eq!(upgrade_status(&ws, &[("origin", evil)]).await, 403);
    assert_eq!(upgrade_status(&ws, &[("origin", "null")]).await, 403);
    assert_eq!(
        upgrade_status(
            &ws,
            &[("origin", &format!("http://127.0.0.1:{}", port + 1))]
        )
        .await,
        403
    );
    assert_eq!(upgrade_status(&ws, &[]).await, 101);
    assert_eq!(upgrade_status(&ws, &[("origin", &own)]).await, 101);
    assert_eq!(upgrade_status(&ws, &[("origin", console)]).await, 101);
    // A page that rebound its own name to 127.0.0.1 is same-origin with
    // itself, but names itself in Host.
    let rebound = format!("evil.example:{port}");
    assert_eq!(
        upgrade_status(
            &ws,
            &[("host", &rebound), ("origin", &format!("http://{rebound}"))]
        )
        .await,
        421
    );

    // REST: the same rules; nothing a refused request asked for happens.
    let get = reqwest::Method::GET;
    let (status, headers, body) =
        with_host(&base, get.clone(), "/v1/sessions", &rebound, None).await;
    assert_eq!(status, 421, "{body}");
    assert_eq!(body["code"], "host_not_allowed");
    assert_eq!(
        headers["content-type"].to_str().unwrap(),
        "application/problem+json"
    );
    for host in [format!("localhost:{port}"), format!("127.0.0.1:{port}")] {
        let (status, _, body) = with_host(&base, get.clone(), "/v1/sessions", &host, None).await;
        assert_eq!(status, 200, "{host}: {body}");
    }
    let (status, _, _) = with_host(&base, get.clone(), "/", &rebound, None).await;
    assert_eq!(
        status, 421,
        "the console is not served under a foreign name"
    );
    let (status, _, _) = with_host(&base, get.clone(), "/healthz", &rebound, None).await;
    assert_eq!(status, 200, "load balancers probe health by any name");
    let created = reqwest::Client::new()
        .post(format!("{base}/v1/sessions"))
        .header("origin", evil)
        .json(&json!({"id": "from-evil"}))
        .send()
        .await
        .unwrap();
    assert_eq!(created.status().as_u16(), 403);
    let problem: Value = created.json().await.unwrap();
    assert_eq!(problem["code"], "origin_not_allowed");
    let (status, _, _) = with_host(
        &base,
        get.clone(),
        "/v1/sessions/from-evil",
        &format!("127.0.0.1:{port}"),
        None,
    )
    .await;
    assert_eq!(status, 404, "the refused request created nothing");

    // The built-in console (same origin) and a program keep working.
    let page = reqwest::get(format!("{base}/")).await.unwrap();
    assert_eq!(page.status().as_u16(), 200);
    let created = reqwest::Client::new()
        .post(format!("{base}/v1/sessions"))
        .header("origin", &own)
        .json(&json!({"id": "from-console"}))
        .send()
        .await
        .unwrap();
    assert_eq!(created.status().as_u16(), 201);

    // The allowed console gets CORS, a foreign page does not.
    let preflight = |origin: &str| {
        reqwest::Client::new()
            .request(reqwest::Method::OPTIONS, format!("{base}/v1/sessions"))
            .header("origin", origin)
            .header("access-control-request-method", "POST")
            .header(
                "access-control-request-headers",
                "authorization, content-type",
            )
            .send()
    };
    let allowed = preflight(console).await.unwrap();
    assert!(allowed.status().is_success(), "{}", allowed.status());
    assert_eq!(
        allowed.headers()["access-control-allow-origin"]
            .to_str()
            .unwrap(),
        console
    );
    let foreign = preflight(evil).await.unwrap();
    assert!(
        !foreign
            .headers()
            .contains_key("access-control-allow-origin"),
        "{:?}",
        foreign.headers()
    );
    drop(server);

    // With authentication on, the Host check is off (a page has no token);
    // the Origin check stays.
    let (_dir, secret) = secret_file();
    let server = ServerProcess::start(
        &TestDb::sqlite(),
        &["--auth-secret-file", secret.to_str().unwrap()],
    )
    .await;
    let base = server.base_url();
    let rebound = format!("evil.example:{}", port_of(&base));
    let (status, _, _) = with_host(&base, get.clone(), "/v1/sessions", &rebound, None).await;
    assert_eq!(status, 401, "no Host refusal with authentication on");
    assert_eq!(
        upgrade_status(&server.ws_url(), &[("origin", evil)]).await,
        403
    );
}

async fn a_chat_named_first_by_another_project_leaks_nothing(db: TestDb) {
    let (_dir, secret) = secret_file();
    let args = ["--auth-secret-file", secret.to_str().unwrap()];
    let host1 = ServerProcess::start(&db, &args).await;
    // On Postgres the victim works on a second host of the same database.
    let host2 = match db.backend() {
        Backend::Postgres => Some(ServerProcess::start(&db, &args).await),
        Backend::Sqlite => None,
    };
    let victim_host = host2.as_ref().unwrap_or(&host1);
    let alice = mint("alice", Role::Operator, &["a"]);
    let bob = mint("bob", Role::Operator, &["b"]);
    let a_rest = Rest::new(host1.base_url(), Some(alice.clone()));
    let b_rest = Rest::new(victim_host.base_url(), Some(bob.clone()));
    a_rest.create(json!({"id": "a-own", "project": "a"})).await;

    // Alice names the default chat of a session that does not exist yet,
    // in her own session, and subscribes to it ahead of time.
    let a = ahp_as(&host1.ws_url(), &alice, "alice").await;
    let squat = a
        .request::<_, Value>(
            "createChat",
            json!({"channel": "ahp-session:/a-own", "chat": "ahp-chat:/victim.main"}),
        )
        .await;
    let err = format!(
        "{:?}",
        squat.expect_err("a default chat's name is reserved")
    );
    assert!(err.contains("reserved"), "{err}");
    assert!(a.subscribe("ahp-chat:/victim.main".into()).await.is_err());

    // Bob creates the session and talks in it.
    b_rest.create(json!({"id": "victim", "project": "b"})).await;
    let answer = b_rest.ask("victim", "t1", "the secret plan").await;
    assert_eq!(answer, "the secret plan");
    b_rest
        .call(
            "POST",
            "/v1/sessions/victim/actions",
            Some(json!({"clientId": "bob", "clientSeq": 1, "action": {"type": "session/titleChanged", "title": "plan"}})),
        )
        .await;

    // Nothing of it reaches Alice, live or replayed, on either host, and
    // nothing she is told depends on its existence.
    for host in [Some(&host1), host2.as_ref()].into_iter().flatten() {
        let a = ahp_as(&host.ws_url(), &alice, "alice-2").await;
        for channel in ["ahp-chat:/victim.main", "ahp-session:/victim"] {
            let Err(err) = a.subscribe(channel.into()).await else {
                panic!("{channel} was subscribed to");
            };
            assert!(format!("{err:?}").contains("does not exist"), "{err:?}");
        }
        let ghost = a
            .request::<_, Value>(
                "createChat",
                json!({"channel": "ahp-session:/victim", "chat": "ahp-chat:/side"}),
            )
            .await
            .expect_err("another project's session");
        let nothing = a
            .request::<_, Value>(
                "createChat",
                json!({"channel": "ahp-session:/nobody", "chat": "ahp-chat:/side"}),
            )
            .await
            .expect_err("no session");
        assert_eq!(
            format!("{ghost:?}").replace("victim", "X"),
            format!("{nothing:?}").replace("nobody", "X"),
            "another project's session answers as a missing one"
        );
        let replay: Value = a
            .request(
                "reconnect",
                json!({"clientId": "alice-2", "lastSeenServerSeq": 0,
                       "subscriptions": ["ahp-chat:/victim.main", "ahp-session:/victim", "ahp-session:/a-own"]}),
            )
            .await
            .expect("reconnect");
        let text = replay.to_string();
        assert!(!text.contains("secret plan"), "{text}");
        assert!(!text.contains("\"plan\""), "{text}");
        let missing = replay["missing"].as_array().expect("missing").clone();
        assert!(
            missing.contains(&json!("ahp-chat:/victim.main"))
                && missing.contains(&json!("ahp-session:/victim")),
            "{replay}"
        );
        let rest = Rest::new(host.base_url(), Some(alice.clone()));
        let (status, _) = rest
            .call("GET", "/v1/sessions/victim/transcript", None)
            .await;
        assert_eq!(status, 404);
    }
    // Bob's own view is whole.
    let (status, view) = b_rest.call("GET", "/v1/sessions/victim", None).await;
    assert_eq!(status, 200, "{view}");
    assert_eq!(view["title"], "plan");
}

async fn unknown_ids_start_no_actor_and_take_no_lease(db: TestDb) {
    // Actors stay for the default five minutes: any started by a lookup
    // would still be counted below.
    let mut server = ServerProcess::start(&db, &[]).await;
    let base = server.base_url();
    let rest = Rest::new(base.clone(), None);
    let ws = server.ws_url();
    let ahp = ahp_as(&ws, "unused", "prober").await;
    refused_everywhere(&rest, &ahp, "ghost").await;
    let reconnect: Value = ahp
        .request(
            "reconnect",
            json!({"clientId": "prober", "lastSeenServerSeq": 0, "subscriptions": ["ahp-session:/ghost"]}),
        )
        .await
        .unwrap();
    assert_eq!(reconnect["missing"], json!(["ahp-session:/ghost"]));
    assert_eq!(
        tether_tests::metric(&base, "tether_session_actors").await,
        0,
        "no actor was started for an id nobody created"
    );
    let leases = |pool: sqlx::PgPool, session: &'static str| async move {
        let count: i64 = sqlx::query_scalar("SELECT count(*) FROM leases WHERE session_id = $1")
            .bind(session)
            .fetch_one(&pool)
            .await
            .unwrap();
        count
    };
    let pool = match db.backend() {
        Backend::Postgres => Some(sqlx::PgPool::connect(db.url()).await.unwrap()),
        Backend::Sqlite => None,
    };
    if let Some(pool) = &pool {
        assert_eq!(leases(pool.clone(), "ghost").await, 0, "no lease row");
    }

    // A disposed session's lease goes once its actor has stopped (here
    // after a second of idleness).
    server.terminate().await;
    let server = ServerProcess::start(&db, &["--actor-idle-secs", "1"]).await;
    let base = server.base_url();
    let rest = Rest::new(base.clone(), None);
    rest.create(json!({"id": "gone"})).await;
    let (status, _) = rest.call("DELETE", "/v1/sessions/gone", None).await;
    assert_eq!(status, 200);
    let deadline = Instant::now() + WAIT;
    loop {
        let actors = tether_tests::metric(&base, "tether_session_actors").await;
        let rows = match &pool {
            Some(pool) => leases(pool.clone(), "gone").await,
            None => 0,
        };
        if actors == 0 && rows == 0 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{actors} actor(s) and {rows} lease row(s) left for a disposed session"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // It is still there to read.
    let (status, _) = rest.call("GET", "/v1/sessions/gone", None).await;
    assert_eq!(status, 200);
}

/// A principal of another project naming a session that exists is
/// answered as if it did not, and starts nothing: an actor started for it
/// would keep the session from retention, and on a cluster take its lease.
async fn another_projects_session_named_starts_no_actor(db: TestDb) {
    let (_dir, secret) = secret_file();
    let mut server =
        ServerProcess::start(&db, &["--auth-secret-file", secret.to_str().unwrap()]).await;
    let admin_token = mint("admin", Role::Admin, &["*"]);
    let admin = Rest::new(server.base_url(), Some(admin_token.clone()));
    admin.create(json!({"id": "b-own", "project": "b"})).await;
    // A new process: no actor is in memory.
    server.restart().await;
    let base = server.base_url();
    let admin = Rest::new(base.clone(), Some(admin_token));
    let actors = || async {
        let (status, text) = admin.call("GET", "/metrics", None).await;
        assert_eq!(status, 200, "{text}");
        tether_tests::metric_value(text.as_str().unwrap_or_default(), "tether_session_actors")
            .expect("the actors gauge")
    };
    assert_eq!(actors().await, 0.0, "no actor before anyone asks");

    let alice = mint("alice", Role::Operator, &["a"]);
    let a_rest = Rest::new(base.clone(), Some(alice.clone()));
    let a = ahp_as(&server.ws_url(), &alice, "alice").await;
    refused_everywhere(&a_rest, &a, "b-own").await;
    assert_eq!(
        actors().await,
        0.0,
        "another project's session was named, and its actor started"
    );
    // Its own project's principal still reaches it (and its actor).
    let b = ahp_as(
        &server.ws_url(),
        &mint("bob", Role::Operator, &["b"]),
        "bob",
    )
    .await;
    b.subscribe("ahp-session:/b-own".into())
        .await
        .expect("its own project's session");
    assert_eq!(actors().await, 1.0);
}

/// A session created over AHP with its client active: that client is
/// the creating connection's own, its tools are checked, and it is owned
/// by the creator, so no other principal takes its clientId over.
async fn a_session_created_with_its_client_active_is_its_creators(db: TestDb) {
    let (_dir, secret) = secret_file();
    let server = ServerProcess::start(&db, &["--auth-secret-file", secret.to_str().unwrap()]).await;
    let alice_token = mint("alice", Role::Operator, &["alpha"]);
    let mallory_token = mint("mallory", Role::Operator, &["alpha"]);
    let alice = ahp_as(&server.ws_url(), &alice_token, "alice-console").await;
    let create = |id: &str, client: Value| {
        json!({"channel": format!("ahp-session:/{id}"), "_meta": {"tether/project": "alpha"},
               "activeClient": client})
    };
    let tools = json!([{"name": "lookup", "inputSchema": {"type": "object"}}]);
    let refused = alice
        .request::<_, Value>(
            "createSession",
            create(
                "made-1",
                json!({"clientId": "someone-else", "tools": tools}),
            ),
        )
        .await
        .expect_err("another client's name");
    assert!(
        format!("{refused:?}").contains("own clientId"),
        "{refused:?}"
    );
    let refused = alice
        .request::<_, Value>(
            "createSession",
            create(
                "made-2",
                json!({"clientId": "alice-console", "tools": [{"name": ""}]}),
            ),
        )
        .await
        .expect_err("a tool without a name");
    assert!(format!("{refused:?}").contains("name"), "{refused:?}");
    alice
        .request::<_, Value>(
            "createSession",
            create("made", json!({"clientId": "alice-console", "tools": tools})),
        )
        .await
        .expect("created with its own client active");
    let register = |token: String| {
        let rest = Rest::new(server.base_url(), Some(token));
        async move {
            rest.call(
                "POST",
                "/v1/sessions/made/actions",
                Some(
                    json!({"clientId": "alice-console", "clientSeq": 1, "action":
                    {"type": "session/activeClientSet", "activeClient": {"clientId": "alice-console",
                     "tools": []}}}),
                ),
            )
            .await
        }
    };
    let (status, refused) = register(mallory_token).await;
    assert_eq!(status, 422, "{refused}");
    assert!(
        refused.to_string().contains("another principal"),
        "{refused}"
    );
    // Its creator still may.
    let (status, answer) = register(alice_token).await;
    assert_eq!(status, 200, "{answer}");
}

/// Names session `id` every way a client can, REST and AHP, each answered
/// as a session that does not exist (the dispatches' refusals go to
/// subscribers, of whom there are none: what matters is what they start).
async fn refused_everywhere(rest: &Rest, ahp: &ahp::Client, id: &str) {
    let action = json!({"clientId": "c", "clientSeq": 1,
                        "action": {"type": "session/titleChanged", "title": "x"}});
    let resume = json!({"sessionId": id, "cwd": "/tmp", "mcpServers": []});
    for (method, path, body) in [
        ("GET", "", None),
        ("GET", "/transcript", None),
        ("GET", "/export", None),
        ("GET", "/tool-context", None),
        ("DELETE", "", None),
        ("POST", "/actions", Some(action)),
        ("POST", "/resume", Some(resume)),
    ] {
        let path = format!("/v1/sessions/{id}{path}");
        let (status, answer) = rest.call(method, &path, body).await;
        assert_eq!(status, 404, "{method} {path}: {answer}");
    }
    let (session, chat) = (format!("ahp-session:/{id}"), format!("ahp-chat:/{id}.main"));
    for channel in [&session, &chat] {
        assert!(ahp.subscribe(channel.clone()).await.is_err(), "{channel}");
        let _ = ahp
            .dispatch(
                channel.clone(),
                tether_tests::action(json!({"type": "session/titleChanged", "title": "x"})),
            )
            .await;
    }
    for (method, params) in [
        (
            "createChat",
            json!({"channel": session, "chat": format!("ahp-chat:/{id}-side")}),
        ),
        ("fetchTurns", json!({"channel": chat})),
        (
            "completions",
            json!({"channel": chat, "kind": "userMessage", "text": "/", "offset": 1}),
        ),
        ("disposeSession", json!({"channel": session})),
    ] {
        assert!(
            ahp.request::<_, Value>(method, params).await.is_err(),
            "{method}"
        );
    }
}

/// The SQLite database file of `db`, if it has one.
fn database_file(db: &TestDb) -> Option<PathBuf> {
    db.url().strip_prefix("sqlite:").map(PathBuf::from)
}

async fn an_agent_sees_none_of_the_servers_secrets_and_reaches_only_its_own_directories(
    db: TestDb,
) {
    let (_secret_dir, secret) = secret_file();
    let roots = tempfile::tempdir().unwrap();
    let mine = roots.path().join("mine");
    let theirs = roots.path().join("theirs");
    std::fs::create_dir_all(&mine).unwrap();
    std::fs::create_dir_all(&theirs).unwrap();
    std::fs::write(theirs.join("notes.txt"), "another session's notes").unwrap();
    let config = tempfile::tempdir().unwrap();
    let env_file = config.path().join("fake.env");
    std::fs::write(&env_file, "FILE_KEY=from-the-env-file\n").unwrap();
    let agents_file = config.path().join("agents.toml");
    std::fs::write(
        &agents_file,
        format!(
            "[agents.fake]\ncommand = [{FAKE:?}]\ntitle = \"Fake\"\n\
             env = {{ AGENT_KEY = \"from-the-agents-file\" }}\nenv_files = [{:?}]\n",
            env_file.display().to_string()
        ),
    )
    .unwrap();
    let server = ServerProcess::start_with_env(
        &db,
        &[
            "--agent-confinement",
            "require",
            "--allowed-roots",
            roots.path().to_str().unwrap(),
            "--metrics-token",
            METRICS_TOKEN_ON_THE_COMMAND_LINE,
        ],
        &[
            ("TETHER_AUTH_SECRET_FILE", secret.to_str().unwrap()),
            ("TETHER_AGENTS_FILE", agents_file.to_str().unwrap()),
            ("SERVER_ONLY_API_KEY", "server-only-value"),
        ],
    )
    .await;
    let rest = Rest::new(server.base_url(), Some(mint("admin", Role::Admin, &["*"])));

    // What is shown of the agent: never its command or its environment.
    let (_, agents) = rest.call("GET", "/v1/agents", None).await;
    let fake = agents["agents"]
        .as_array()
        .unwrap()
        .iter()
        .find(|a| a["provider"] == "fake")
        .cloned()
        .expect("listed");
    assert_eq!(fake["displayName"], "Fake");
    assert!(fake.get("command").is_none(), "{fake}");
    let shown = agents.to_string();
    for hidden in [FAKE, "from-the-agents-file", "AGENT_KEY", "fake.env"] {
        assert!(!shown.contains(hidden), "{hidden} shown in {shown}");
    }

    rest.create(json!({"id": "mine", "provider": "fake", "workingDirectories": [mine]}))
        .await;
    rest.create(json!({"id": "theirs", "provider": "fake", "workingDirectories": [theirs]}))
        .await;

    let env = rest.ask("mine", "env", "env").await;
    assert!(env.contains("AGENT_KEY=from-the-agents-file"), "{env}");
    assert!(env.contains("FILE_KEY=from-the-env-file"), "{env}");
    for leaked in [
        SECRET,
        "TETHER_",
        "server-only-value",
        "SERVER_ONLY",
        db.url(),
    ] {
        assert!(!env.contains(leaked), "{leaked:?} reached the agent: {env}");
    }
    // Nor does the server's command line show it a secret given there:
    // the server blanked its arguments past `tether serve` once read.
    let args = rest.ask("mine", "args", "server-args").await;
    assert!(args.starts_with("server-args: "), "{args}");
    assert!(args.contains("serve"), "{args}");
    for leaked in [
        METRICS_TOKEN_ON_THE_COMMAND_LINE,
        "--metrics-token",
        "--allowed-roots",
    ] {
        assert!(
            !args.contains(leaked),
            "{leaked:?} reached the agent: {args}"
        );
    }
    let home = env
        .lines()
        .find_map(|l| l.strip_prefix("HOME="))
        .expect("a HOME");
    assert_ne!(Some(home), std::env::var("HOME").ok().as_deref());

    let cwd = rest.ask("mine", "cwd", "cwd").await;
    assert_eq!(
        cwd,
        format!("cwd: {}", std::fs::canonicalize(&mine).unwrap().display())
    );

    let denied = |answer: &str| answer.contains("error PermissionDenied");
    let mut forbidden = vec![
        secret.clone(),
        theirs.join("notes.txt"),
        theirs.clone(),
        env_file.clone(),
        agents_file.clone(),
    ];
    forbidden.extend(database_file(&db));
    for (i, path) in forbidden.iter().enumerate() {
        let answer = rest
            .ask(
                "mine",
                &format!("r{i}"),
                &format!("read {}", path.display()),
            )
            .await;
        assert!(denied(&answer), "{}: {answer}", path.display());
    }
    let answer = rest
        .ask("mine", "child", &format!("child-read {}", secret.display()))
        .await;
    assert!(answer.contains("error"), "a child process: {answer}");
    let answer = rest.ask("mine", "sys", "read /etc/passwd").await;
    assert!(answer.starts_with("read /etc/passwd: ok"), "{answer}");

    let own = mine.join("made-by-the-agent.txt");
    let answer = rest
        .ask("mine", "w1", &format!("write {}", own.display()))
        .await;
    assert_eq!(answer, format!("write {}: ok", own.display()));
    assert_eq!(
        std::fs::read_to_string(&own).unwrap(),
        "written by the agent"
    );
    let answer = rest
        .ask(
            "mine",
            "w2",
            &format!("write {}", theirs.join("x").display()),
        )
        .await;
    assert!(denied(&answer), "{answer}");
    assert!(!theirs.join("x").exists());
    let answer = rest
        .ask(
            "mine",
            "w3",
            &format!("write {}", roots.path().join("x").display()),
        )
        .await;
    assert!(denied(&answer), "{answer}");
}

async fn every_backend_keeps_sessions_and_agents_inside_the_allowed_roots(db: TestDb) {
    let roots = tempfile::tempdir().unwrap();
    let outside = tempfile::tempdir().unwrap();
    let inside = roots.path().join("project");
    std::fs::create_dir_all(inside.join("real")).unwrap();
    let link = inside.join("link");
    std::os::unix::fs::symlink(inside.join("real"), &link).unwrap();
    for effects in ["local", "agent", "webhook"] {
        let mut args = vec![
            "--allowed-roots",
            roots.path().to_str().unwrap(),
            "--effects",
            effects,
            "--agent",
        ];
        let agent = format!("fake=FAKE_ACP_CAPS=dirs {FAKE}");
        args.push(&agent);
        if effects == "webhook" {
            // Nobody listens there: what reaches the backend fails as
            // unavailable, so a refusal naming the roots is the roots'.
            args.extend(["--webhook-url", "http://127.0.0.1:9/never"]);
        }
        let mut server = ServerProcess::start(&db, &args).await;
        let rest = Rest::new(server.base_url(), None);
        let id = |name: &str| format!("{effects}-{name}");
        let (status, answer) = rest
            .call("POST", "/v1/sessions", Some(json!({"id": id("none")})))
            .await;
        tether_tests::assert_refused(status, &answer, 422, "allowed roots");
        let (status, answer) = rest
            .call(
                "POST",
                "/v1/sessions",
                Some(json!({"id": id("out"), "workingDirectories": [outside.path()]})),
            )
            .await;
        tether_tests::assert_refused(status, &answer, 422, "outside the allowed roots");
        if effects == "webhook" {
            server.terminate().await;
            continue;
        }
        rest.create(json!({"id": id("in"), "provider": "fake", "workingDirectories": [inside]}))
            .await;
        // A client of its own each round: one origin is one dispatch.
        let body = json!({"clientId": format!("roots-{effects}"), "clientSeq": 1, "channel": format!("ahp-session:/{}", id("in")),
            "action": {"type": "session/workingDirectorySet", "directory": format!("file://{}", outside.path().display())}});
        let (status, answer) = rest
            .call(
                "POST",
                &format!("/v1/sessions/{}/actions", id("in")),
                Some(body),
            )
            .await;
        assert_eq!(status, 422, "{effects}: {answer}");
        assert!(
            answer.to_string().contains("outside the allowed roots"),
            "{answer}"
        );

        // The agent starts on the resolved directory, checked again when
        // it starts: a symlink turned outside the roots since is refused.
        rest.create(json!({"id": id("link"), "provider": "fake", "workingDirectories": [link]}))
            .await;
        let cwd = rest.ask(&id("link"), "c1", "cwd").await;
        assert_eq!(
            cwd,
            format!(
                "cwd: {}",
                std::fs::canonicalize(inside.join("real"))
                    .unwrap()
                    .display()
            )
        );
        rest.create(json!({"id": id("moved"), "provider": "fake", "workingDirectories": [link]}))
            .await;
        std::fs::remove_file(&link).unwrap();
        std::os::unix::fs::symlink(outside.path(), &link).unwrap();
        let answer = rest.ask(&id("moved"), "c1", "cwd").await;
        assert!(
            answer.starts_with("ERROR") && answer.contains("outside the allowed roots"),
            "{answer}"
        );
        std::fs::remove_file(&link).unwrap();
        std::os::unix::fs::symlink(inside.join("real"), &link).unwrap();
        // Gone before the next round's server opens the same store.
        server.terminate().await;
    }
}

async fn a_client_tools_context_stays_with_its_principal_after_a_restart(db: TestDb) {
    let auth = || {
        Auth::new(
            Some(Authenticator::new(SECRET.as_bytes()).unwrap()),
            None,
            PrincipalLimits::new(Some(LimitsConfig::default())),
        )
    };
    let config = || ServeConfig {
        auth: auth(),
        ..ServeConfig::default()
    };
    let server = TestServer::start_with(db.open().await, config()).await;
    let admin = Rest::new(server.base_url(), Some(mint("admin", Role::Admin, &["*"])));
    let dir = tempfile::tempdir().unwrap();
    admin
        .create(json!({"id": "tools", "project": "alpha", "workingDirectories": [dir.path()]}))
        .await;
    let alice_token = mint("alice", Role::Operator, &["alpha"]);
    let mallory_token = mint("mallory", Role::Operator, &["alpha"]);
    let tool = json!({"type": "session/activeClientSet", "activeClient": {"clientId": "console",
        "tools": [{"name": "lookup", "inputSchema": {"type": "object"}}]}});
    let alice = ahp_as(&server.ws_url(), &alice_token, "console").await;
    let (_, mut session) = alice.subscribe("ahp-session:/tools".into()).await.unwrap();
    alice
        .dispatch(
            "ahp-session:/tools".into(),
            tether_tests::action(tool.clone()),
        )
        .await
        .unwrap();
    loop {
        let envelope = tether_tests::next_envelope(&mut session).await;
        if serde_json::to_value(&envelope.action).unwrap()["type"] == "session/activeClientSet" {
            break;
        }
    }
    drop(alice);
    server.stop().await;

    // A new process: the actor and its memory are gone; the ownership is not.
    let server = TestServer::start_with(db.open().await, config()).await;
    let admin = Rest::new(server.base_url(), Some(mint("admin", Role::Admin, &["*"])));
    let mallory = ahp_as(&server.ws_url(), &mallory_token, "console").await;
    let (_, mut mallory_chat) = mallory
        .subscribe("ahp-chat:/tools.main".into())
        .await
        .unwrap();
    let alice = ahp_as(&server.ws_url(), &alice_token, "console").await;
    let (_, mut alice_chat) = alice
        .subscribe("ahp-chat:/tools.main".into())
        .await
        .unwrap();
    // Mallory cannot take the clientId over while Alice's client is active.
    let (status, refused) = Rest::new(server.base_url(), Some(mallory_token.clone()))
        .call(
            "POST",
            "/v1/sessions/tools/actions",
            Some(json!({"clientId": "console", "clientSeq": 1, "action": tool})),
        )
        .await;
    assert_eq!(status, 422, "{refused}");
    assert!(
        refused.to_string().contains("another principal"),
        "{refused}"
    );
    let (status, body) = admin.turn("tools", "t1", "/tool lookup {}").await;
    assert_eq!(status, 200, "{body}");
    let ready = |envelope: &ahp_types::actions::ActionEnvelope| {
        let action = serde_json::to_value(&envelope.action).unwrap();
        (action["type"] == "chat/toolCallReady").then(|| {
            let input: Value = serde_json::from_str(action["toolInput"].as_str().unwrap()).unwrap();
            (action["toolCallId"].as_str().unwrap().to_owned(), input)
        })
    };
    let (call, theirs) = loop {
        if let Some(found) = ready(&tether_tests::next_envelope(&mut alice_chat).await) {
            break found;
        }
    };
    assert_eq!(theirs["__tether"]["sessionId"], "tools", "{theirs}");
    let (_, spoofed) = loop {
        if let Some(found) = ready(&tether_tests::next_envelope(&mut mallory_chat).await) {
            break found;
        }
    };
    assert_eq!(
        spoofed,
        json!({}),
        "the same clientId under another principal"
    );
    // Only Alice may answer.
    let complete = json!({"type": "chat/toolCallComplete", "turnId": "t1", "toolCallId": call,
        "result": {"success": true, "pastTenseMessage": "looked up"}});
    let (status, answer) = Rest::new(server.base_url(), Some(mallory_token))
        .call(
            "POST",
            "/v1/sessions/tools/actions",
            Some(json!({"clientId": "console", "clientSeq": 2, "channel": "ahp-chat:/tools.main", "action": complete})),
        )
        .await;
    assert_eq!(status, 422, "{answer}");
    let (status, answer) = Rest::new(server.base_url(), Some(alice_token))
        .call(
            "POST",
            "/v1/sessions/tools/actions",
            Some(json!({"clientId": "console", "clientSeq": 3, "channel": "ahp-chat:/tools.main", "action": complete})),
        )
        .await;
    assert_eq!(status, 200, "{answer}");
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_request_head_on_a_kept_alive_connection_has_a_deadline() {
    let server = ServerProcess::start(&TestDb::sqlite(), &[]).await;
    let addr = format!("127.0.0.1:{}", port_of(&server.base_url()));
    let mut tcp = tokio::net::TcpStream::connect(&addr).await.unwrap();
    tcp.write_all(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        .await
        .unwrap();
    let mut buf = [0_u8; 4096];
    let n = tcp.read(&mut buf).await.unwrap();
    assert!(buf[..n].starts_with(b"HTTP/1.1 200"));
    // A second head, one byte every second, never finished: the idle
    // deadline (60 s) would keep moving; the head's own (10 s) does not.
    let started = Instant::now();
    tcp.write_all(b"GET /healthz HTTP/1.1\r\n").await.unwrap();
    let closed = loop {
        if started.elapsed() > Duration::from_secs(30) {
            break false;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
        if tcp.write_all(b"X").await.is_err() {
            break true;
        }
        match tokio::time::timeout(Duration::from_millis(10), tcp.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => break true,
            _ => {}
        }
    };
    assert!(closed, "a dribbled request head held the connection");
    let took = started.elapsed();
    assert!(
        took >= Duration::from_secs(9) && took < Duration::from_secs(20),
        "closed after {took:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_served_openapi_document_states_the_security_the_server_enforces() {
    let operations_with_security = |doc: &Value| {
        doc["paths"]
            .as_object()
            .unwrap()
            .values()
            .flat_map(|item| item.as_object().unwrap().values())
            .filter(|op| op.get("security").is_some())
            .count()
    };
    let open = TestServer::start(&TestDb::sqlite()).await;
    let doc: Value = reqwest::get(format!("{}/openapi.json", open.base_url()))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(operations_with_security(&doc), 0, "no token is needed");
    assert!(doc["components"]["securitySchemes"].get("bearer").is_none());
    open.stop().await;
    let config = ServeConfig {
        auth: Auth::new(
            Some(Authenticator::new(SECRET.as_bytes()).unwrap()),
            None,
            PrincipalLimits::new(None),
        ),
        ..ServeConfig::default()
    };
    let db = TestDb::sqlite();
    let secured = TestServer::start_with(db.open().await, config).await;
    let doc: Value = reqwest::get(format!("{}/openapi.json", secured.base_url()))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert!(operations_with_security(&doc) > 10);
    assert_eq!(
        doc,
        serde_json::from_str::<Value>(&tether_server::http::openapi_json()).unwrap(),
        "the committed document is the authenticated server's"
    );
    secured.stop().await;
}

/// A root kept for one project (`PROJECT=PATH` in `--allowed-roots`) is
/// that project's alone, even inside a root open to all: another
/// project's session cannot be made there, moved there or resumed there.
async fn a_projects_root_is_kept_for_it(db: TestDb) {
    let (_secret_dir, secret) = secret_file();
    let top = tempfile::tempdir().unwrap();
    let open = std::fs::canonicalize(top.path()).unwrap().join("open");
    for dir in ["alpha/work", "beta/work", "shared"] {
        std::fs::create_dir_all(open.join(dir)).unwrap();
    }
    let roots = format!(
        "{},alpha={},beta={}",
        open.display(),
        open.join("alpha").display(),
        open.join("beta").display()
    );
    let mut server = ServerProcess::start(
        &db,
        &[
            "--auth-secret-file",
            secret.to_str().unwrap(),
            "--allowed-roots",
            &roots,
        ],
    )
    .await;
    let alice = Rest::new(
        server.base_url(),
        Some(mint("alice", Role::Operator, &["alpha"])),
    );
    let bob = Rest::new(
        server.base_url(),
        Some(mint("bob", Role::Operator, &["beta"])),
    );
    let session = |id: &str, project: &str, dir: PathBuf| json!({"id": id, "project": project, "workingDirectories": [dir]});
    // Each project its own root and the open one's.
    alice
        .create(session("a-own", "alpha", open.join("alpha/work")))
        .await;
    alice
        .create(session("a-shared", "alpha", open.join("shared")))
        .await;
    bob.create(session("b-own", "beta", open.join("beta/work")))
        .await;
    // Never another project's: its root or anything in it.
    for dir in [open.join("beta"), open.join("beta/work")] {
        let (status, answer) = alice
            .call(
                "POST",
                "/v1/sessions",
                Some(session("a-theirs", "alpha", dir)),
            )
            .await;
        tether_tests::assert_refused(status, &answer, 422, "kept for another project");
        // Nor is beta's root offered to alpha.
        let offered = answer["detail"].as_str().unwrap().split("may use").nth(1);
        assert!(
            offered.is_some_and(|roots| !roots.contains("beta")),
            "{answer}"
        );
    }
    let beta_work = format!("file://{}", open.join("beta/work").display());
    let body = json!({"clientId": "alice-1", "clientSeq": 1, "channel": "ahp-session:/a-own",
        "action": {"type": "session/workingDirectorySet", "directory": beta_work}});
    let (status, answer) = alice
        .call("POST", "/v1/sessions/a-own/actions", Some(body))
        .await;
    assert_eq!(status, 422, "{answer}");
    assert!(
        answer.to_string().contains("kept for another project"),
        "{answer}"
    );
    let (status, answer) = alice
        .call(
            "POST",
            "/v1/sessions/a-own/resume",
            Some(json!({"sessionId": "a-own", "cwd": open.join("alpha/work"),
                "additionalDirectories": [open.join("beta/work")], "mcpServers": []})),
        )
        .await;
    tether_tests::assert_refused(status, &answer, 422, "kept for another project");
    // Nothing refused was recorded.
    let directories: Vec<String> = alice
        .transcript("a-own")
        .await
        .iter()
        .filter(|a| a["type"] == "session/workingDirectorySet")
        .map(|a| a["directory"].to_string())
        .collect();
    assert!(directories.is_empty(), "{directories:?}");
    server.terminate().await;
}
