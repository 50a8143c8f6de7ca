//! A real agent no one here wrote, `@zed-industries/codex-acp` from the npm
//! registry, through the real binary on both backends, confined, against a
//! scripted model server on loopback (never the internet): its login by the
//! configured key, its modes, models and commands over REST and AHP, a mode
//! changed from an AHP client, a refused model request failing the turn in
//! its own words (the session going on), and real turns: an answer, a plan
//! and a shell command.
//!
//! `.ci/run` installs the package and sets `TETHER_TEST_CODEX_DIR` to the
//! folder holding its `node_modules`. Without it the test skips with a
//! message, unless `TETHER_TEST_REQUIRE_CODEX=1`.

use std::collections::VecDeque;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use tether_tests::{ServerProcess, TestDb, backend_tests};

backend_tests!(codex_logs_in_shows_its_settings_and_runs_real_turns);

const WAIT: Duration = Duration::from_secs(60);

fn codex_dir() -> Option<PathBuf> {
    match std::env::var_os("TETHER_TEST_CODEX_DIR") {
        Some(dir) => Some(PathBuf::from(dir)),
        None if std::env::var("TETHER_TEST_REQUIRE_CODEX").as_deref() == Ok("1") => {
            panic!("TETHER_TEST_REQUIRE_CODEX=1 but TETHER_TEST_CODEX_DIR is not set")
        }
        None => {
            eprintln!(
                "SKIPPED: the codex-acp test: set TETHER_TEST_CODEX_DIR to a folder where \
                 `npm install @zed-industries/codex-acp@0.16.0` ran"
            );
            None
        }
    }
}

/// What the scripted model answers to one request.
#[derive(Debug, Clone)]
enum Reply {
    /// HTTP 500.
    Refuse,
    /// A message with this text.
    Text(String),
    /// A call of one of codex's tools.
    Call(String, Value),
}

/// A model server speaking the Responses API (server-sent events) on
/// loopback, answering from a script (text "done" when it runs out) and
/// keeping every request.
#[derive(Clone, Default)]
struct Model {
    script: Arc<Mutex<VecDeque<Reply>>>,
    requests: Arc<Mutex<Vec<Value>>>,
}

impl Model {
    async fn start(&self) -> std::net::SocketAddr {
        let model = self.clone();
        let app = axum::Router::new().route(
            "/v1/responses",
            axum::routing::post(move |body: axum::Json<Value>| {
                let model = model.clone();
                async move { model.answer(body.0) }
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await });
        addr
    }

    fn script(&self, replies: &[Reply]) {
        self.script.lock().unwrap().extend(replies.iter().cloned());
    }

    fn answer(&self, request: Value) -> axum::response::Response {
        use axum::response::IntoResponse;
        self.requests.lock().unwrap().push(request);
        let reply = self
            .script
            .lock()
            .unwrap()
            .pop_front()
            .unwrap_or_else(|| Reply::Text("done".into()));
        let item = match reply {
            Reply::Refuse => {
                return (axum::http::StatusCode::INTERNAL_SERVER_ERROR, "refused").into_response();
            }
            Reply::Text(text) => json!({"type": "message", "id": "msg_1", "role": "assistant",
                "status": "completed", "content": [{"type": "output_text", "text": text, "annotations": []}]}),
            Reply::Call(name, arguments) => json!({"type": "function_call", "id": "fc_1",
                "call_id": format!("call_{name}"), "name": name, "arguments": arguments.to_string(),
                "status": "completed"}),
        };
        let usage = json!({"input_tokens": 10, "output_tokens": 5, "total_tokens": 15,
            "input_tokens_details": {"cached_tokens": 0}, "output_tokens_details": {"reasoning_tokens": 0}});
        let events = [
            json!({"type": "response.created", "response": {"id": "resp_1", "status": "in_progress", "output": []}}),
            json!({"type": "response.output_item.added", "output_index": 0, "item": item}),
            json!({"type": "response.output_item.done", "output_index": 0, "item": item}),
            json!({"type": "response.completed", "response": {"id": "resp_1", "status": "completed",
                "output": [item], "usage": usage}}),
        ];
        let body: String = events
            .iter()
            .map(|e| format!("event: {}\ndata: {e}\n\n", e["type"].as_str().unwrap()))
            .collect();
        ([("content-type", "text/event-stream")], body).into_response()
    }
}

/// REST with the server's answers as JSON.
async fn call(method: reqwest::Method, url: String, body: Option<Value>) -> (u16, Value) {
    let mut request = reqwest::Client::new().request(method, url);
    if let Some(body) = body {
        request = request.json(&body);
    }
    let response = request.send().await.expect("the server answers");
    let status = response.status().as_u16();
    (status, response.json().await.unwrap_or(Value::Null))
}

/// Runs a turn over REST; its actions once it has ended.
async fn turn(base: &str, session: &str, id: &str, text: &str) -> Vec<Value> {
    let body = json!({"clientId": format!("codex-{id}"), "clientSeq": 1,
        "channel": format!("ahp-chat:/{session}.main"),
        "action": {"type": "chat/turnStarted", "turnId": id, "startedAt": "2026-12-02T10:00:00.000Z",
                   "message": {"text": text, "origin": {"kind": "user"}}}});
    let (status, answer) = call(
        reqwest::Method::POST,
        format!("{base}/v1/sessions/{session}/actions"),
        Some(body),
    )
    .await;
    assert_eq!(status, 200, "{answer}");
    turn_end(base, session, id).await
}

/// A turn's actions once it has ended.
async fn turn_end(base: &str, session: &str, id: &str) -> Vec<Value> {
    let deadline = Instant::now() + WAIT;
    loop {
        let (_, page) = call(
            reqwest::Method::GET,
            format!("{base}/v1/sessions/{session}/transcript?after=0&limit=1000"),
            None,
        )
        .await;
        let mine: Vec<Value> = page["envelopes"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e["action"].clone())
            .filter(|a| a["turnId"] == id)
            .collect();
        if mine
            .iter()
            .any(|a| matches!(a["type"].as_str(), Some("chat/turnComplete" | "chat/error")))
        {
            return mine;
        }
        assert!(
            Instant::now() < deadline,
            "turn {id} never ended: {mine:#?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn text_of(actions: &[Value]) -> String {
    actions
        .iter()
        .filter_map(|a| match a["type"].as_str() {
            Some("chat/responsePart") => a["part"]["content"].as_str(),
            Some("chat/delta") => a["content"].as_str(),
            _ => None,
        })
        .collect()
}

async fn codex_logs_in_shows_its_settings_and_runs_real_turns(db: TestDb) {
    let Some(dir) = codex_dir() else { return };
    let binary = dir.join("node_modules/@zed-industries/codex-acp-linux-x64/bin/codex-acp");
    assert!(binary.exists(), "{} is missing", binary.display());
    let model = Model::default();
    let addr = model.start().await;
    let config = tempfile::tempdir().unwrap();
    let codex_home = config.path().join("codex-home");
    std::fs::create_dir_all(&codex_home).unwrap();
    // Only the loopback model server; no retries, so a refusal is quick.
    std::fs::write(
        codex_home.join("config.toml"),
        format!(
            "model = \"gpt-5.4-mini\"\nmodel_provider = \"loopback\"\n\n\
             [model_providers.loopback]\nname = \"loopback\"\nbase_url = \"http://{addr}/v1\"\n\
             env_key = \"CODEX_API_KEY\"\nwire_api = \"responses\"\n\
             request_max_retries = 0\nstream_max_retries = 0\n"
        ),
    )
    .unwrap();
    let agents = config.path().join("agents.toml");
    std::fs::write(
        &agents,
        format!(
            "[agents.codex]\ncommand = [{:?}]\nenv = {{ CODEX_API_KEY = \"sk-test-not-real\", CODEX_HOME = {:?} }}\n\
             write = [{:?}]\n",
            binary.display().to_string(),
            codex_home.display().to_string(),
            codex_home.display().to_string()
        ),
    )
    .unwrap();
    let mut server = ServerProcess::start(
        &db,
        &[
            "--agents-file",
            agents.to_str().unwrap(),
            "--agent-confinement",
            "require",
            "--agent-init-timeout-ms",
            "30000",
        ],
    )
    .await;
    let base = server.base_url();

    // What it offers, learned at start-up: its logins, modes, models.
    let (_, listed) = call(reqwest::Method::GET, format!("{base}/v1/agents"), None).await;
    let codex = listed["agents"]
        .as_array()
        .unwrap()
        .iter()
        .find(|a| a["provider"] == "codex")
        .cloned()
        .expect("listed");
    let caps = &codex["capabilities"];
    assert!(caps.get("sessionError").is_none(), "{codex}");
    let logins: Vec<&str> = caps["authMethods"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|m| m["id"].as_str())
        .collect();
    assert!(logins.contains(&"codex-api-key"), "{logins:?}");
    let categories = caps["configCategories"].as_object().expect("categories");
    let mode_key = categories
        .iter()
        .find(|(_, c)| *c == "mode")
        .map(|(k, _)| k.clone())
        .expect("a mode option");
    let modes = &caps["config"]["schema"]["properties"][&mode_key]["enum"];
    for mode in ["read-only", "auto", "full-access"] {
        assert!(modes.as_array().unwrap().contains(&json!(mode)), "{modes}");
    }
    assert!(!caps["models"].as_array().unwrap().is_empty(), "{caps}");
    assert!(!listed.to_string().contains("sk-test-not-real"));

    let work = tempfile::tempdir().unwrap();
    let (status, created) = call(
        reqwest::Method::POST,
        format!("{base}/v1/sessions"),
        Some(json!({"id": "cx", "provider": "codex", "workingDirectories": [work.path()]})),
    )
    .await;
    assert_eq!(status, 201, "{created}");

    // A refused model request fails the turn with codex's own words; the
    // session takes the next action.
    model.script(&[Reply::Refuse]);
    let failed = turn(&base, "cx", "t1", "hello").await;
    let error = failed
        .iter()
        .find(|a| a["type"] == "chat/error")
        .expect("the turn failed");
    assert!(
        error["part"]["error"]["message"]
            .as_str()
            .unwrap()
            .contains("The agent failed the turn"),
        "{error}"
    );
    let (status, renamed) = call(
        reqwest::Method::POST,
        format!("{base}/v1/sessions/cx/actions"),
        Some(json!({"clientId": "codex-title", "clientSeq": 1,
                    "action": {"type": "session/titleChanged", "title": "Real codex"}})),
    )
    .await;
    assert_eq!(status, 200, "{renamed}");

    // A real answer, with usage.
    model.script(&[Reply::Text("hello from the loopback model".into())]);
    let answered = turn(&base, "cx", "t2", "say hello").await;
    assert!(
        text_of(&answered).contains("hello from the loopback model"),
        "{answered:#?}"
    );
    assert!(answered.iter().any(|a| a["type"] == "chat/turnComplete"));
    assert!(
        answered.iter().any(|a| a["type"] == "chat/usage"),
        "{answered:#?}"
    );

    // A plan it makes with its own tool.
    let plan = json!({"plan": [{"step": "look around", "status": "completed"},
                               {"step": "fix it", "status": "in_progress"}]});
    model.script(&[
        Reply::Call("update_plan".into(), plan),
        Reply::Text("planned".into()),
    ]);
    let planned = turn(&base, "cx", "t3", "make a plan").await;
    assert!(text_of(&planned).contains("planned"), "{planned:?}");
    let view: Value = reqwest::get(format!("{base}/v1/sessions/cx"))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let entries = &view["projection"]["plan"]["entries"];
    assert_eq!(entries[0]["content"], "look around", "{view}");
    assert_eq!(entries[0]["status"], "completed");
    assert_eq!(entries[1]["content"], "fix it");
    assert_eq!(entries[1]["status"], "in_progress");

    // Its commands and settings over AHP; the mode changed from a client.
    let mut ws = tether_tests::raw_at(&server.ws_url()).await;
    let send = |id: u64, method: &str, params: Value| {
        json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}).to_string()
    };
    tether_tests::raw_send(
        &mut ws,
        &send(
            1,
            "initialize",
            json!({"clientId": "codex-console", "protocolVersions": [ahp_types::PROTOCOL_VERSION]}),
        ),
    )
    .await;
    let state = loop {
        let message = tether_tests::raw_next(&mut ws).await.unwrap();
        if message["id"] == 1 {
            tether_tests::raw_send(
                &mut ws,
                &send(2, "subscribe", json!({"channel": "ahp-session:/cx"})),
            )
            .await;
        }
        if message["id"] == 2 {
            break message["result"]["snapshot"]["state"].clone();
        }
    };
    let commands: Vec<&str> = state["_meta"]["tether/commands"]
        .as_array()
        .expect("commands")
        .iter()
        .filter_map(|c| c["name"].as_str())
        .collect();
    assert!(commands.contains(&"review"), "{commands:?}");
    assert_eq!(state["config"]["values"][&mode_key], "read-only", "{state}");
    let change = json!({"jsonrpc": "2.0", "method": "dispatchAction", "params": {
        "channel": "ahp-session:/cx", "clientSeq": 1,
        "action": {"type": "session/configChanged", "config": {mode_key.clone(): "full-access"}}}});
    tether_tests::raw_send(&mut ws, &change.to_string()).await;
    let echo = loop {
        let message = tether_tests::raw_next(&mut ws).await.unwrap();
        if message["params"]["origin"]["clientSeq"] == 1 {
            break message;
        }
    };
    assert!(
        echo["params"].get("rejectionReason").is_none(),
        "the mode change: {echo}"
    );
    let (_, page) = call(
        reqwest::Method::GET,
        format!("{base}/v1/sessions/cx/transcript?after=0&limit=1000"),
        None,
    )
    .await;
    assert!(
        page.to_string().contains("full-access"),
        "the change is recorded"
    );

    // A shell command, in the session's directory, in full-access mode.
    model.script(&[
        Reply::Call(
            "exec_command".into(),
            json!({"cmd": "echo tether-exec > made-by-codex.txt && cat made-by-codex.txt"}),
        ),
        Reply::Text("ran it".into()),
    ]);
    let ran = turn(&base, "cx", "t4", "run a command").await;
    assert!(
        ran.iter()
            .any(|a| a["type"] == "chat/toolCallStart" && a["toolName"] == "execute"),
        "{ran:#?}"
    );
    assert!(text_of(&ran).contains("ran it"), "{ran:#?}");
    assert_eq!(
        std::fs::read_to_string(work.path().join("made-by-codex.txt"))
            .unwrap()
            .trim(),
        "tether-exec"
    );
    // In `auto` mode a command that asks to leave its sandbox waits for a
    // person: a permission request, answered by a client.
    let change = json!({"jsonrpc": "2.0", "method": "dispatchAction", "params": {
        "channel": "ahp-session:/cx", "clientSeq": 2,
        "action": {"type": "session/configChanged", "config": {mode_key.clone(): "auto"}}}});
    tether_tests::raw_send(&mut ws, &change.to_string()).await;
    model.script(&[
        Reply::Call(
            "exec_command".into(),
            json!({"cmd": "echo escalated > escalated.txt", "sandbox_permissions": "require_escalated",
                   "justification": "write outside the sandbox"}),
        ),
        Reply::Text("asked first".into()),
    ]);
    let body = json!({"clientId": "codex-t5", "clientSeq": 1, "channel": "ahp-chat:/cx.main",
        "action": {"type": "chat/turnStarted", "turnId": "t5", "startedAt": "2026-12-02T10:00:00.000Z",
                   "message": {"text": "run it outside", "origin": {"kind": "user"}}}});
    let (status, _) = call(
        reqwest::Method::POST,
        format!("{base}/v1/sessions/cx/actions"),
        Some(body),
    )
    .await;
    assert_eq!(status, 200);
    let deadline = Instant::now() + WAIT;
    let pending = loop {
        let (_, page) = call(
            reqwest::Method::GET,
            format!("{base}/v1/sessions/cx/transcript?after=0&limit=1000"),
            None,
        )
        .await;
        let found = page["envelopes"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e["action"].clone())
            .find(|a| {
                a["turnId"] == "t5"
                    && a["type"] == "chat/toolCallReady"
                    && a.get("options").is_some()
            });
        if let Some(found) = found {
            break found;
        }
        assert!(Instant::now() < deadline, "no permission request: {page:#}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let confirm = json!({"clientId": "codex-t5-ok", "clientSeq": 1, "channel": "ahp-chat:/cx.main",
        "action": {"type": "chat/toolCallConfirmed", "turnId": "t5",
                   "toolCallId": pending["toolCallId"], "approved": true}});
    let (status, confirmed) = call(
        reqwest::Method::POST,
        format!("{base}/v1/sessions/cx/actions"),
        Some(confirm),
    )
    .await;
    assert_eq!(status, 200, "{confirmed}");
    let asked = turn_end(&base, "cx", "t5").await;
    assert!(text_of(&asked).contains("asked first"), "{asked:#?}");

    let requests = model.requests.lock().unwrap().clone();
    let output = requests
        .iter()
        .flat_map(|r| r["input"].as_array().cloned().unwrap_or_default())
        .find(|i| i["type"] == "function_call_output" && i["call_id"] == "call_exec_command")
        .expect("codex sent the command's output back");
    assert!(output.to_string().contains("tether-exec"), "{output}");
    // Stopped as a host is: its agent goes with it (a test that only
    // dropped the server killed it, and left codex-acp running).
    server.terminate().await;
}
