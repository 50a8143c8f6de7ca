//! The REST API through a real socket, on both backends: sessions,
//! projections, transcripts, dispatch, resume, tool context, working context
//! and the boot sweep.

use std::collections::BTreeSet;
use std::time::Duration;

use reqwest::StatusCode;
use serde_json::{Value, json};
use tether_server::agents::AgentSpec;
use tether_server::config::ServeConfig;
use tether_server::store::{NewEnvelope, SessionRecord};
use tether_tests::{TestDb, TestServer, backend_tests};

backend_tests!(
    sessions_are_created_listed_inspected_and_deleted,
    the_projection_follows_turns_and_titles,
    dispatch_over_rest_is_validated_and_idempotent,
    working_context_follows_the_lookup_rules,
    resume_refuses_what_it_must_and_sets_the_directories,
    the_tool_context_names_the_primary_directory,
    the_boot_sweep_fails_open_turns_and_settles_orphans,
    ten_thousand_sessions_page_exactly_once,
    shared_context_documents_and_commands_fold_as_the_rules_say,
);

struct Api {
    base: String,
    http: reqwest::Client,
}

impl Api {
    fn new(server: &TestServer) -> Self {
        Self {
            base: server.base_url(),
            http: reqwest::Client::new(),
        }
    }

    async fn call(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<Value>,
    ) -> (StatusCode, Value) {
        let mut request = self.http.request(method, format!("{}{path}", self.base));
        if let Some(body) = body {
            request = request.json(&body);
        }
        let response = request.send().await.unwrap();
        let status = response.status();
        let problem = response.headers().get("content-type").is_some_and(|v| {
            v.to_str()
                .unwrap_or("")
                .starts_with("application/problem+json")
        });
        let text = response.text().await.unwrap();
        let value = serde_json::from_str(&text).unwrap_or(Value::String(text));
        if !status.is_success() {
            assert!(problem, "errors are problem+json: {status} {value}");
            assert!(value["code"].is_string(), "{value}");
        }
        (status, value)
    }

    async fn get(&self, path: &str) -> (StatusCode, Value) {
        self.call(reqwest::Method::GET, path, None).await
    }

    async fn post(&self, path: &str, body: Value) -> (StatusCode, Value) {
        self.call(reqwest::Method::POST, path, Some(body)).await
    }

    async fn put(&self, path: &str, body: Value) -> (StatusCode, Value) {
        self.call(reqwest::Method::PUT, path, Some(body)).await
    }

    async fn delete(&self, path: &str) -> (StatusCode, Value) {
        self.call(reqwest::Method::DELETE, path, None).await
    }

    /// Polls a session until `done` holds (agent answers are asynchronous).
    async fn session_until(&self, id: &str, done: impl Fn(&Value) -> bool) -> Value {
        for _ in 0..200 {
            let (status, view) = self.get(&format!("/v1/sessions/{id}")).await;
            assert_eq!(status, 200, "{view}");
            if done(&view) {
                return view;
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        panic!("session {id} never reached the expected state");
    }
}

fn turn(id: &str, text: &str) -> Value {
    json!({"type": "chat/turnStarted", "turnId": id, "startedAt": "2026-11-29T10:00:00.000Z",
           "message": {"text": text, "origin": {"kind": "user"}}})
}

async fn sessions_are_created_listed_inspected_and_deleted(db: TestDb) {
    let server = TestServer::start(&db).await;
    let api = Api::new(&server);
    let dir = tempfile::tempdir().unwrap();
    let (status, created) = api
        .post("/v1/sessions", json!({"id": "rest-1", "project": "alpha", "workingDirectories": [dir.path()], "title": "First"}))
        .await;
    assert_eq!(status, 201, "{created}");
    assert_eq!(created["id"], "rest-1");
    assert_eq!(created["resource"], "ahp-session:/rest-1");
    assert_eq!(created["state"], "dormant");
    assert_eq!(created["title"], "First");
    let (status, generated) = api.post("/v1/sessions", json!({"project": "beta"})).await;
    assert_eq!(status, 201);
    assert!(
        generated["id"].as_str().unwrap().len() >= 32,
        "a generated id"
    );

    let (status, dup) = api.post("/v1/sessions", json!({"id": "rest-1"})).await;
    assert_eq!(
        (status, dup["code"].as_str()),
        (StatusCode::CONFLICT, Some("already_exists"))
    );
    let (status, bad) = api.post("/v1/sessions", json!({"id": "no spaces"})).await;
    assert_eq!(status, 422);
    assert!(
        bad["detail"]
            .as_str()
            .unwrap()
            .contains("only letters, digits"),
        "{bad}"
    );
    let (status, bad) = api
        .post(
            "/v1/sessions",
            json!({"workingDirectories": ["relative/dir"]}),
        )
        .await;
    assert_eq!(status, 422, "{bad}");
    let (status, bad) = api
        .post("/v1/sessions", json!({"provider": "nobody"}))
        .await;
    assert_eq!(
        (status, bad["code"].as_str()),
        (StatusCode::UNPROCESSABLE_ENTITY, Some("unknown_provider"))
    );
    let (status, bad) = api.post("/v1/sessions", json!({"unknownField": 1})).await;
    assert_eq!(status, 422, "{bad}");
    let response = reqwest::Client::new()
        .post(format!("{}/v1/sessions", server.base_url()))
        .header("content-type", "application/json")
        .body("{not json")
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 400);

    let (status, one) = api.get("/v1/sessions/rest-1").await;
    assert_eq!(status, 200);
    assert_eq!(one["project"], "alpha");
    assert_eq!(
        one["workingDirectories"][0],
        format!("file://{}", dir.path().display())
    );
    let (status, missing) = api.get("/v1/sessions/nope").await;
    assert_eq!(
        (status, missing["code"].as_str()),
        (StatusCode::NOT_FOUND, Some("not_found"))
    );
    let (status, bad) = api.get("/v1/sessions/bad%20id").await;
    assert_eq!(
        (status, bad["code"].as_str()),
        (StatusCode::UNPROCESSABLE_ENTITY, Some("invalid_name"))
    );

    let (_, page) = api.get("/v1/sessions?project=alpha").await;
    assert_eq!(page["items"].as_array().unwrap().len(), 1);
    let (_, all) = api.get("/v1/sessions").await;
    let ids: Vec<&str> = all["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids[1], "rest-1", "newest first");
    let (status, _) = api.get("/v1/sessions?state=weird").await;
    assert_eq!(status, 422);
    let (status, _) = api.get("/v1/sessions?limit=0").await;
    assert_eq!(status, 422);
    let (status, _) = api.get("/v1/sessions?cursor=abc").await;
    assert_eq!(status, 422);

    let (status, deleted) = api.delete("/v1/sessions/rest-1").await;
    assert_eq!(status, 200, "{deleted}");
    assert_eq!(deleted["state"], "ended", "never resumable, so ended");
    let (status, again) = api.delete("/v1/sessions/rest-1").await;
    assert_eq!(
        (status, again["code"].as_str()),
        (StatusCode::CONFLICT, Some("conflict"))
    );
    let (_, transcript) = api.get("/v1/sessions/rest-1/transcript").await;
    assert!(
        transcript["envelopes"].as_array().unwrap().len() >= 2,
        "the transcript is kept"
    );
    let (_, ended) = api.get("/v1/sessions?state=ended").await;
    assert!(
        ended["items"]
            .as_array()
            .unwrap()
            .iter()
            .any(|v| v["id"] == "rest-1")
    );
    server.stop().await;
}

async fn the_projection_follows_turns_and_titles(db: TestDb) {
    let server = TestServer::start(&db).await;
    let api = Api::new(&server);
    api.post("/v1/sessions", json!({"id": "proj"})).await;
    let long = format!("   {}   ", "word ".repeat(40));
    let (status, accepted) = api
        .post("/v1/sessions/proj/actions", json!({"clientId": "p", "clientSeq": 1, "channel": "ahp-chat:/proj.main", "action": turn("t1", &long)}))
        .await;
    assert_eq!(status, 200, "{accepted}");
    let view = api
        .session_until("proj", |v| {
            v["turns"] == 1 && v["projection"]["openTurnId"].is_null()
        })
        .await;
    assert_eq!(view["state"], "live", "the echo agent is attached");
    assert_eq!(view["resumable"], true);
    let title = view["title"].as_str().unwrap();
    assert_eq!(title.chars().count(), 80);
    assert_eq!(title, &long.trim()[..80]);
    assert_eq!(view["projection"]["firstTurnText"], long);

    api.post("/v1/sessions/proj/actions", json!({"clientId": "p", "clientSeq": 2, "channel": "ahp-chat:/proj.main", "action": turn("t2", "second")}))
        .await;
    let view = api
        .session_until("proj", |v| {
            v["turns"] == 2 && v["projection"]["openTurnId"].is_null()
        })
        .await;
    assert_eq!(
        view["title"].as_str().unwrap(),
        &long.trim()[..80],
        "the first turn names it"
    );
    api.post("/v1/sessions/proj/actions", json!({"clientId": "p", "clientSeq": 3, "action": {"type": "session/titleChanged", "title": "Explicit"}}))
        .await;
    let (_, view) = api.get("/v1/sessions/proj").await;
    assert_eq!(view["title"], "Explicit", "an explicit title wins");
    // Deleting a resumable session closes it; closed is not ended.
    let (_, closed) = api.delete("/v1/sessions/proj").await;
    assert_eq!(closed["state"], "closed");
    server.stop().await;
}

async fn dispatch_over_rest_is_validated_and_idempotent(db: TestDb) {
    let server = TestServer::start(&db).await;
    let api = Api::new(&server);
    api.post("/v1/sessions", json!({"id": "d"})).await;
    let act = |seq: u64, action: Value| json!({"clientId": "rest-client", "clientSeq": seq, "action": action});
    let title = |t: &str| json!({"type": "session/titleChanged", "title": t});
    let (status, first) = api
        .post("/v1/sessions/d/actions", act(1, title("one")))
        .await;
    assert_eq!(status, 200, "{first}");
    let seq = first["serverSeq"].as_u64().unwrap();
    assert_eq!(first["envelope"]["origin"]["clientSeq"], 1);
    let (status, retry) = api
        .post("/v1/sessions/d/actions", act(1, title("one")))
        .await;
    assert_eq!(status, 200);
    assert_eq!(
        retry["serverSeq"], seq,
        "a retry gets the original envelope"
    );
    let (status, reuse) = api
        .post("/v1/sessions/d/actions", act(1, title("other")))
        .await;
    assert_eq!(status, 409, "{reuse}");
    let (status, refused) = api
        .post(
            "/v1/sessions/d/actions",
            act(2, json!({"type": "session/ready"})),
        )
        .await;
    assert_eq!(status, 422);
    assert!(
        refused["detail"]
            .as_str()
            .unwrap()
            .contains("host-originated")
    );
    let (status, again) = api
        .post(
            "/v1/sessions/d/actions",
            act(2, json!({"type": "session/ready"})),
        )
        .await;
    assert_eq!(status, 422, "the original rejection stands");
    assert_eq!(again["detail"], refused["detail"]);
    let (status, reused) = api
        .post("/v1/sessions/d/actions", act(2, title("valid now")))
        .await;
    assert_eq!(status, 409, "a refused number reused for another action");
    assert!(
        reused["detail"].as_str().unwrap().contains("already used"),
        "{reused}"
    );
    let (status, _) = api
        .post("/v1/sessions/d/actions", act(3, json!("not an object")))
        .await;
    assert_eq!(status, 422);
    let (status, _) = api
        .post("/v1/sessions/d/actions", json!({"clientId": "x", "clientSeq": 4, "channel": "ahp-chat:/elsewhere", "action": title("x")}))
        .await;
    assert_eq!(status, 422, "a chat that is not this session's");
    let (status, _) = api
        .post("/v1/sessions/missing/actions", act(5, title("x")))
        .await;
    assert_eq!(status, 404);
    for i in 0..20 {
        api.post(
            "/v1/sessions/d/actions",
            act(10 + i, title(&format!("t{i}"))),
        )
        .await;
    }
    // Transcript pages: every envelope once, oldest first.
    let mut after = 0;
    let mut seen = Vec::new();
    loop {
        let (status, page) = api
            .get(&format!("/v1/sessions/d/transcript?after={after}&limit=7"))
            .await;
        assert_eq!(status, 200);
        let envelopes = page["envelopes"].as_array().unwrap();
        seen.extend(envelopes.iter().map(|e| e["serverSeq"].as_u64().unwrap()));
        match page["nextAfter"].as_u64() {
            Some(next) => after = next,
            None => break,
        }
    }
    assert!(seen.windows(2).all(|w| w[0] < w[1]));
    let accepted_titles = seen.len();
    assert_eq!(
        accepted_titles,
        2 + 1 + 20,
        "created, settled, one, twenty titles"
    );
    server.stop().await;
}

async fn working_context_follows_the_lookup_rules(db: TestDb) {
    let server = TestServer::start(&db).await;
    let api = Api::new(&server);
    let path = |s: &str| format!("/v1/projects/web/sessions/{s}/working-context");
    let (status, miss) = api.get(&path("task-1")).await;
    assert_eq!(status, 200);
    assert_eq!(
        miss,
        json!({"found": false, "working": null, "otherSessions": []})
    );

    let ctx = |goal: &str| json!({"goal": goal, "pendingActions": ["next"]});
    assert_eq!(api.put(&path("task-1"), ctx("one")).await.0, 200);
    tokio::time::sleep(Duration::from_millis(5)).await;
    assert_eq!(api.put(&path("task-2"), ctx("two")).await.0, 200);
    tokio::time::sleep(Duration::from_millis(5)).await;
    assert_eq!(
        api.put(
            "/v1/projects/other/sessions/task-9/working-context",
            ctx("elsewhere")
        )
        .await
        .0,
        200
    );

    let (_, hit) = api.get(&path("task-1")).await;
    assert_eq!(hit["found"], true);
    assert_eq!(hit["working"]["goal"], "one");
    assert_eq!(
        hit["otherSessions"],
        json!(["task-2"]),
        "others on a hit, never the requested one"
    );
    let (_, typo) = api.get(&path("task-3")).await;
    assert_eq!(typo["found"], false);
    assert_eq!(
        typo["otherSessions"],
        json!(["task-2", "task-1"]),
        "others on a miss, most recent first"
    );

    // Empty is refused and nothing is written.
    let (status, empty) = api.put(&path("task-1"), json!({"goal": "  "})).await;
    assert_eq!(
        (status, empty["code"].as_str()),
        (
            StatusCode::UNPROCESSABLE_ENTITY,
            Some("empty_working_context")
        )
    );
    assert_eq!(api.get(&path("task-1")).await.1["working"]["goal"], "one");
    // Over 1 MiB is refused and nothing is written.
    let mut big = String::from("x");
    while big.len() < 1024 * 1024 {
        big.push('x');
    }
    let body = json!({"goal": big});
    let (status, too_big) = api.put(&path("task-1"), body).await;
    assert_eq!(
        (status, too_big["code"].as_str()),
        (
            StatusCode::PAYLOAD_TOO_LARGE,
            Some("working_context_too_large")
        )
    );
    assert_eq!(api.get(&path("task-1")).await.1["working"]["goal"], "one");
    let (status, _) = api
        .put(&path("big-new"), json!({"goal": "y".repeat(1024 * 1024)}))
        .await;
    assert_eq!(status, 413);
    assert_eq!(api.get(&path("big-new")).await.1["found"], false);

    // A resave moves a session to the front of the listing.
    tokio::time::sleep(Duration::from_millis(5)).await;
    api.put(&path("task-1"), ctx("again")).await;
    let (_, list) = api.get("/v1/projects/web/working-contexts").await;
    let order: Vec<&str> = list["sessions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["session"].as_str().unwrap())
        .collect();
    assert_eq!(order, vec!["task-1", "task-2"]);
    let (_, none) = api.get("/v1/projects/empty/working-contexts").await;
    assert_eq!(none, json!({"sessions": []}));
    let (status, bad) = api.get("/v1/projects/bad%2Fname/working-contexts").await;
    assert_eq!(status, 422, "{bad}");

    // A large project: the listing pages (every session once, in order),
    // and a lookup names only the most recently saved hundred others.
    for n in 0..120 {
        let (status, _) = api
            .put(
                &format!("/v1/projects/big/sessions/s-{n:03}/working-context"),
                ctx("many"),
            )
            .await;
        assert_eq!(status, 200);
    }
    let mut seen = Vec::new();
    let mut cursor: Option<String> = None;
    loop {
        let query = match &cursor {
            Some(c) => format!("?limit=50&cursor={c}"),
            None => "?limit=50".to_owned(),
        };
        let (status, page) = api
            .get(&format!("/v1/projects/big/working-contexts{query}"))
            .await;
        assert_eq!(status, 200, "{page}");
        let sessions = page["sessions"].as_array().unwrap();
        assert!(sessions.len() <= 50);
        seen.extend(
            sessions
                .iter()
                .map(|s| s["session"].as_str().unwrap().to_owned()),
        );
        match page["nextCursor"].as_str() {
            Some(next) => cursor = Some(next.to_owned()),
            None => break,
        }
    }
    let mut unique = seen.clone();
    unique.sort();
    unique.dedup();
    assert_eq!(
        (seen.len(), unique.len()),
        (120, 120),
        "each once: {seen:?}"
    );
    let (_, lookup) = api
        .get("/v1/projects/big/sessions/s-000/working-context")
        .await;
    let others = lookup["otherSessions"].as_array().unwrap();
    assert_eq!(others.len(), 100, "{lookup}");
    assert!(!others.contains(&json!("s-000")));
    let (status, bad) = api
        .get("/v1/projects/big/working-contexts?cursor=not-a-cursor")
        .await;
    assert_eq!(status, 422, "{bad}");
    server.stop().await;
}

async fn resume_refuses_what_it_must_and_sets_the_directories(db: TestDb) {
    let server = TestServer::start(&db).await;
    let api = Api::new(&server);
    let root = tempfile::tempdir().unwrap();
    let (main, extra, other) = (
        root.path().join("main"),
        root.path().join("extra"),
        root.path().join("other"),
    );
    for d in [&main, &extra, &other] {
        std::fs::create_dir(d).unwrap();
    }
    let resume = |id: &str, cwd: &std::path::Path, extra: Vec<String>| json!({"sessionId": id, "cwd": cwd, "additionalDirectories": extra, "mcpServers": []});
    let (status, _) = api
        .post("/v1/sessions/ghost/resume", resume("ghost", &main, vec![]))
        .await;
    assert_eq!(status, 404);
    api.post(
        "/v1/sessions",
        json!({"id": "r", "workingDirectories": [&main, &other]}),
    )
    .await;
    let (status, fresh) = api
        .post("/v1/sessions/r/resume", resume("r", &main, vec![]))
        .await;
    assert_eq!(status, 409, "never opened, so not resumable: {fresh}");
    api.post("/v1/sessions/r/actions", json!({"clientId": "c", "clientSeq": 1, "channel": "ahp-chat:/r.main", "action": turn("t", "hi")}))
        .await;
    api.session_until("r", |v| {
        v["resumable"] == true && v["projection"]["openTurnId"].is_null()
    })
    .await;
    let (status, wrong) = api
        .post("/v1/sessions/r/resume", resume("r", &extra, vec![]))
        .await;
    assert_eq!(status, 422, "{wrong}");
    assert!(wrong["detail"].as_str().unwrap().contains("primary"));
    let (status, relative) = api
        .post("/v1/sessions/r/resume", json!({"sessionId": "r", "cwd": main, "additionalDirectories": ["rel/dir"], "mcpServers": []}))
        .await;
    assert_eq!(status, 422, "{relative}");
    let (status, mismatch) = api
        .post("/v1/sessions/r/resume", resume("other-id", &main, vec![]))
        .await;
    assert_eq!(status, 422, "{mismatch}");

    let (status, ok) = api
        .post(
            "/v1/sessions/r/resume",
            resume("r", &main, vec![extra.display().to_string()]),
        )
        .await;
    assert_eq!(status, 200, "{ok}");
    assert!(ok.is_object());
    let (_, view) = api.get("/v1/sessions/r").await;
    let dirs: Vec<String> = view["workingDirectories"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d.as_str().unwrap().to_owned())
        .collect();
    assert_eq!(
        dirs,
        vec![
            format!("file://{}", main.display()),
            format!("file://{}", extra.display())
        ],
        "the complete new list"
    );
    let (_, transcript) = api.get("/v1/sessions/r/transcript?limit=1000").await;
    assert!(
        transcript["envelopes"]
            .as_array()
            .unwrap()
            .iter()
            .any(
                |e| e["action"]["type"] == "x-tether/agentOpened" && e["action"]["resumed"] == true
            )
    );

    // Disposed twice, closed once: the root counts it out once (and says
    // so once); resumed, it is counted in again.
    let active = || async {
        let client = server.initialized("counter").await;
        let (root, _) = client.subscribe("ahp-root://".into()).await.unwrap();
        let root = serde_json::to_value(&root.snapshot).unwrap();
        root.pointer("/state/activeSessions")
            .and_then(serde_json::Value::as_u64)
            .unwrap_or_else(|| panic!("no activeSessions in {root}"))
    };
    let open = active().await;
    for _ in 0..2 {
        let (status, closed) = api.delete("/v1/sessions/r").await;
        assert_eq!(status, 200, "{closed}");
        assert_eq!(closed["state"], "closed");
    }
    assert_eq!(active().await, open - 1, "counted out once");
    let (status, ok) = api
        .post("/v1/sessions/r/resume", resume("r", &main, vec![]))
        .await;
    assert_eq!(status, 200, "{ok}");
    assert_eq!(active().await, open, "counted in again");
    // Closed again, then a turn opens its agent again: counted in again.
    api.delete("/v1/sessions/r").await;
    assert_eq!(active().await, open - 1);
    let (status, body) = api
        .post("/v1/sessions/r/actions", json!({"clientId": "c", "clientSeq": 2, "channel": "ahp-chat:/r.main", "action": turn("t2", "again")}))
        .await;
    assert_eq!(status, 200, "{body}");
    api.session_until("r", |v| v["state"] == "live").await;
    assert_eq!(active().await, open, "a turn reopened it");

    // Ended sessions are not resumed.
    api.post("/v1/sessions", json!({"id": "gone"})).await;
    api.delete("/v1/sessions/gone").await;
    let (status, _) = api
        .post("/v1/sessions/gone/resume", resume("gone", &main, vec![]))
        .await;
    assert_eq!(status, 409);
    server.stop().await;
}

async fn the_tool_context_names_the_primary_directory(db: TestDb) {
    let server = TestServer::start(&db).await;
    let api = Api::new(&server);
    let dir = tempfile::tempdir().unwrap();
    let spaced = dir.path().join("with space");
    std::fs::create_dir(&spaced).unwrap();
    api.post(
        "/v1/sessions",
        json!({"id": "tc", "workingDirectories": [&spaced]}),
    )
    .await;
    let (status, ctx) = api.get("/v1/sessions/tc/tool-context").await;
    assert_eq!(status, 200);
    assert_eq!(
        ctx,
        json!({"cwd": spaced.display().to_string(), "sessionId": "tc"})
    );
    api.post("/v1/sessions", json!({"id": "nodir"})).await;
    assert_eq!(
        api.get("/v1/sessions/nodir/tool-context").await.1,
        json!({"sessionId": "nodir"})
    );
    assert_eq!(api.get("/v1/sessions/none/tool-context").await.0, 404);
    server.stop().await;
}

async fn the_boot_sweep_fails_open_turns_and_settles_orphans(db: TestDb) {
    let config = || ServeConfig {
        agents: vec![AgentSpec::silent("mute")],
        ..ServeConfig::default()
    };
    let server = TestServer::start_with(db.open().await, config()).await;
    let api = Api::new(&server);
    api.post("/v1/sessions", json!({"id": "open", "provider": "mute"}))
        .await;
    api.post("/v1/sessions/open/actions", json!({"clientId": "c", "clientSeq": 1, "channel": "ahp-chat:/open.main", "action": turn("stuck", "never answered")}))
        .await;
    api.post("/v1/sessions", json!({"id": "answered"})).await;
    api.post("/v1/sessions/answered/actions", json!({"clientId": "c", "clientSeq": 2, "channel": "ahp-chat:/answered.main", "action": turn("t", "hi")}))
        .await;
    api.session_until("answered", |v| {
        v["state"] == "live" && v["projection"]["openTurnId"].is_null()
    })
    .await;
    let (_, open) = api.get("/v1/sessions/open").await;
    assert_eq!(open["projection"]["openTurnId"], "stuck");
    server.stop().await;

    let server = TestServer::start_with(db.open().await, config()).await;
    let api = Api::new(&server);
    let (_, open) = api.get("/v1/sessions/open").await;
    assert!(
        open["projection"]["openTurnId"].is_null(),
        "the open turn was failed: {open}"
    );
    assert_eq!(open["state"], "ended", "not resumable: ended");
    assert_eq!(open["cause"], "process_exited");
    let (_, transcript) = api.get("/v1/sessions/open/transcript?limit=1000").await;
    let failed = transcript["envelopes"].as_array().unwrap().iter().any(|e| {
        e["action"]["type"] == "chat/error"
            && e["action"]["turnId"] == "stuck"
            && e["origin"].is_null()
    });
    assert!(failed, "the failure is an ordinary transcript record");
    let (_, answered) = api.get("/v1/sessions/answered").await;
    assert_eq!(answered["state"], "dormant", "resumable: dormant");
    assert_eq!(answered["cause"], "process_exited");
    let seq = answered["lastSeq"].as_u64().unwrap();
    server.stop().await;

    // A second restart finds nothing to sweep.
    let server = TestServer::start_with(db.open().await, config()).await;
    let (_, again) = Api::new(&server).get("/v1/sessions/answered").await;
    assert_eq!(again["lastSeq"].as_u64().unwrap(), seq);
    server.stop().await;
}

async fn ten_thousand_sessions_page_exactly_once(db: TestDb) {
    const SESSIONS: usize = 10_000;
    let store = db.open().await;
    // Seed the read model directly (creating 10,000 sessions one request at
    // a time would test the engine, not the page).
    for chunk in 0..SESSIONS / 1000 {
        let batch = (0..1000)
            .map(|i| {
                let id = format!("bulk-{:05}", chunk * 1000 + i);
                let view = json!({"id": id, "resource": format!("ahp-session:/{id}"), "project": "bulk", "provider": "echo",
                    "state": "dormant", "resumable": false, "turns": 0, "status": 1, "workingDirectories": [],
                    "lastSeq": 0, "createdAt": "2026-11-29T10:00:00.000Z", "updatedAt": "2026-11-29T10:00:00.000Z",
                    "projection": {"settled": {"state": "dormant"}}});
                NewEnvelope {
                    channel: format!("ahp-session:/{id}"),
                    session_id: Some(id.clone()),
                    action: r#"{"type":"x-test/seed"}"#.into(),
                    origin: None,
                    session: Some(SessionRecord {
                        id: id.clone(),
                        project: "bulk".into(),
                        provider: "echo".into(),
                        title: None,
                        state: "dormant".into(),
                        turns: 0,
                        resumable: false,
                        created_ms: 0,
                        projection: view.to_string(),
                    }),
                    chats: Vec::new(),
                    turns: Vec::new(),
                    directed: None,
                    owner: None,
                    search: Vec::new(),
                    usage: None,
                    events: Vec::new(),
                }
            })
            .collect();
        store.append(batch).await.unwrap();
    }
    let server = TestServer::start_with(store, ServeConfig::default()).await;
    let api = Api::new(&server);
    let mut seen = BTreeSet::new();
    let mut last = u64::MAX;
    let mut cursor = String::new();
    loop {
        let (status, page) = api
            .get(&format!("/v1/sessions?project=bulk&limit=1000{cursor}"))
            .await;
        assert_eq!(status, 200);
        for item in page["items"].as_array().unwrap() {
            let seq = item["lastSeq"].as_u64().unwrap();
            assert!(seq < last, "newest first");
            last = seq;
            assert!(
                seen.insert(item["id"].as_str().unwrap().to_owned()),
                "listed twice: {item}"
            );
        }
        match page["nextCursor"].as_str() {
            Some(next) => cursor = format!("&cursor={next}"),
            None => break,
        }
    }
    assert_eq!(seen.len(), SESSIONS);
    server.stop().await;
}

async fn shared_context_documents_and_commands_fold_as_the_rules_say(db: TestDb) {
    let server = TestServer::start(&db).await;
    let api = Api::new(&server);
    let dir = tempfile::tempdir().unwrap();
    api.post(
        "/v1/sessions",
        json!({"id": "ctx", "workingDirectories": [dir.path()]}),
    )
    .await;
    let send =
        |seq: u64, action: Value| json!({"clientId": "ed", "clientSeq": seq, "action": action});
    let shared = json!({"type": "x-tether/contextShared", "source": "push",
        "context": {"url": "https://app.local/page", "concepts": ["login"], "document": {"path": "src/a.rs", "text": "fn main() {}"}}});
    let (status, _) = api.post("/v1/sessions/ctx/actions", send(1, shared)).await;
    assert_eq!(status, 200);
    let (status, bad) = api
        .post("/v1/sessions/ctx/actions", send(2, json!({"type": "x-tether/contextShared", "source": "push", "context": {"concepts": [7]}})))
        .await;
    assert_eq!(status, 422, "{bad}");
    for (seq, revision) in [(3, 3), (4, 7), (5, 5)] {
        let edit = json!({"type": "x-tether/documentEdited", "edits": [], "revision": revision});
        assert_eq!(
            api.post("/v1/sessions/ctx/actions", send(seq, edit))
                .await
                .0,
            200
        );
    }
    let (status, _) = api
        .post(
            "/v1/sessions/ctx/actions",
            send(
                6,
                json!({"type": "x-tether/commandsAdvertised", "commands": []}),
            ),
        )
        .await;
    assert_eq!(
        status, 422,
        "commands come from the agent, not from clients"
    );
    let (_, view) = api.get("/v1/sessions/ctx").await;
    assert_eq!(
        view["projection"]["documentRevision"], 7,
        "the revision never rewinds"
    );
    assert_eq!(
        view["projection"]["latestContext"]["url"],
        "https://app.local/page"
    );

    // The agent advertises its commands when it opens, and again when it is
    // resumed: the list is replaced whole, never appended to.
    api.post("/v1/sessions/ctx/actions", json!({"clientId": "ed", "clientSeq": 7, "channel": "ahp-chat:/ctx.main", "action": turn("t", "hi")}))
        .await;
    let view = api
        .session_until("ctx", |v| {
            v["projection"]["commands"]
                .as_array()
                .is_some_and(|c| !c.is_empty())
        })
        .await;
    assert_eq!(view["projection"]["commands"].as_array().unwrap().len(), 2);
    let (status, _) = api
        .post(
            "/v1/sessions/ctx/resume",
            json!({"sessionId": "ctx", "cwd": dir.path(), "mcpServers": []}),
        )
        .await;
    assert_eq!(status, 200);
    let (_, view) = api.get("/v1/sessions/ctx").await;
    assert_eq!(
        view["projection"]["commands"].as_array().unwrap().len(),
        2,
        "replaced whole"
    );
    assert_eq!(
        view["projection"]["documentRevision"], 7,
        "a resume does not reset the revision"
    );

    // Ended absorbs: an ended session stays ended whatever comes later.
    api.post("/v1/sessions", json!({"id": "over"})).await;
    let (_, ended) = api.delete("/v1/sessions/over").await;
    assert_eq!(ended["state"], "ended");
    let (status, _) = api
        .post("/v1/sessions/over/actions", json!({"clientId": "ed", "clientSeq": 8, "channel": "ahp-chat:/over.main", "action": turn("late", "hello?")}))
        .await;
    assert_eq!(status, 409);
    let (status, _) = api
        .post(
            "/v1/sessions/over/resume",
            json!({"sessionId": "over", "cwd": "/", "mcpServers": []}),
        )
        .await;
    assert_eq!(status, 409);
    let (_, still) = api.get("/v1/sessions/over").await;
    assert_eq!(still["state"], "ended");
    assert_eq!(still["turns"], 0);
    server.stop().await;
}
