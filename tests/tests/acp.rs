//! ACP agents behind the host, on both backends: the scripted fake agent in
//! `tests/src/bin/fake-acp-agent.rs` (the ACP SDK's agent side) driven
//! through real sockets — REST to dispatch, an AHP subscriber to watch —
//! and the real binary for restarts.

use std::time::Duration;

use serde_json::{Value, json};
use tether_server::agents::{AgentCommand, AgentSpec};
use tether_server::config::ServeConfig;
use tether_tests::{ServerProcess, TestDb, TestServer, backend_tests};

backend_tests!(
    a_streamed_turn_is_recorded_in_order_and_seen_live,
    a_permission_request_waits_for_a_client_and_its_answer_reaches_the_agent,
    a_cancelled_turn_reaches_the_agent_and_the_session_goes_on,
    a_crash_mid_turn_fails_the_turn_and_settles_the_session,
    an_agent_that_writes_garbage_or_never_answers_is_stopped_with_a_clear_error,
    unknown_providers_and_the_process_limit_are_refused_clearly,
    an_idle_agent_is_stopped_and_its_next_turn_starts_it_again,
    resume_reopens_the_agent_without_replaying_its_history,
    working_directories_change_through_the_agent,
    the_boot_sweep_settles_a_session_whose_agent_was_mid_turn,
    processes_are_killed_on_dispose_and_shutdown_even_when_they_ignore_eof,
    an_agent_a_killed_server_left_running_is_stopped_at_its_next_start,
    the_cli_lists_agents_and_streams_a_turn_approving_with_yes,
);

const FAKE: &str = env!("CARGO_BIN_EXE_fake-acp-agent");

/// `NAME=ENV… fake-acp-agent`.
fn agent(name: &str, env: &str) -> String {
    format!("{name}={env} {FAKE}")
}

fn config(agents: &[String]) -> ServeConfig {
    let mut config = ServeConfig {
        agents: agents
            .iter()
            .map(|a| AgentSpec::acp(AgentCommand::parse(a).expect("agent entry")))
            .collect(),
        ..ServeConfig::default()
    };
    config.engine.acp.init_timeout = Duration::from_secs(5);
    config
}

async fn start(db: &TestDb, config: ServeConfig) -> TestServer {
    TestServer::start_with(db.open().await, config).await
}

struct Api {
    base: String,
    http: reqwest::Client,
    seq: std::sync::atomic::AtomicU64,
}

impl Api {
    fn new(base: String) -> Self {
        Self {
            base,
            http: reqwest::Client::new(),
            seq: std::sync::atomic::AtomicU64::new(1),
        }
    }

    async fn call(&self, method: reqwest::Method, path: &str, body: Option<Value>) -> (u16, Value) {
        let mut request = self.http.request(method, format!("{}{path}", self.base));
        if let Some(body) = body {
            request = request.json(&body);
        }
        let response = request.send().await.expect("request");
        let status = response.status().as_u16();
        (status, response.json().await.unwrap_or(Value::Null))
    }

    async fn create(&self, id: &str, provider: &str, dirs: &[&std::path::Path]) -> Value {
        let (status, view) = self
            .call(
                reqwest::Method::POST,
                "/v1/sessions",
                Some(json!({"id": id, "provider": provider, "workingDirectories": dirs})),
            )
            .await;
        assert_eq!(status, 201, "{view}");
        view
    }

    /// Dispatches a client action on `channel` (the session's default chat
    /// when `None`).
    async fn dispatch(&self, id: &str, chat: bool, action: Value) -> (u16, Value) {
        let seq = self.seq.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let mut body = json!({"clientId": "acp-test", "clientSeq": seq, "action": action});
        if chat {
            body["channel"] = json!(format!("ahp-chat:/{id}.main"));
        }
        self.call(
            reqwest::Method::POST,
            &format!("/v1/sessions/{id}/actions"),
            Some(body),
        )
        .await
    }

    async fn turn(&self, id: &str, turn_id: &str, text: &str) {
        let action = json!({"type": "chat/turnStarted", "turnId": turn_id,
            "startedAt": "2026-12-01T10:00:00.000Z", "message": {"text": text, "origin": {"kind": "user"}}});
        let (status, answer) = self.dispatch(id, true, action).await;
        assert_eq!(status, 200, "{answer}");
    }

    /// The session's transcript: `(channel, action)`, oldest first.
    async fn transcript(&self, id: &str) -> Vec<(String, Value)> {
        let (status, page) = self
            .call(
                reqwest::Method::GET,
                &format!("/v1/sessions/{id}/transcript?after=0&limit=1000"),
                None,
            )
            .await;
        assert_eq!(status, 200, "{page}");
        page["envelopes"]
            .as_array()
            .expect("envelopes")
            .iter()
            .map(|e| {
                (
                    e["channel"].as_str().unwrap_or_default().to_owned(),
                    e["action"].clone(),
                )
            })
            .collect()
    }

    /// Waits until the transcript holds an action `done` accepts.
    async fn until(
        &self,
        id: &str,
        what: &str,
        done: impl Fn(&Value) -> bool,
    ) -> Vec<(String, Value)> {
        for _ in 0..400 {
            let transcript = self.transcript(id).await;
            if transcript.iter().any(|(_, a)| done(a)) {
                return transcript;
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        let transcript = self.transcript(id).await;
        panic!("{what} never came; the transcript: {transcript:#?}");
    }

    async fn view(&self, id: &str) -> Value {
        let (status, view) = self
            .call(reqwest::Method::GET, &format!("/v1/sessions/{id}"), None)
            .await;
        assert_eq!(status, 200, "{view}");
        view
    }
}

fn kind(action: &Value) -> &str {
    action["type"].as_str().unwrap_or_default()
}

fn is(kind_: &'static str) -> impl Fn(&Value) -> bool {
    move |a| kind(a) == kind_
}

fn ended(turn: &'static str) -> impl Fn(&Value) -> bool {
    move |a| {
        a["turnId"] == turn
            && matches!(
                kind(a),
                "chat/turnComplete" | "chat/error" | "chat/turnCancelled"
            )
    }
}

/// The text the agent wrote in `turn`: parts and deltas joined.
fn answer(transcript: &[(String, Value)], turn: &str) -> String {
    let mut text = String::new();
    for (_, a) in transcript.iter().filter(|(_, a)| a["turnId"] == turn) {
        match kind(a) {
            "chat/responsePart" if a["part"]["kind"] == "markdown" => {
                text.push_str(a["part"]["content"].as_str().unwrap_or_default());
            }
            "chat/delta" => text.push_str(a["content"].as_str().unwrap_or_default()),
            _ => {}
        }
    }
    text
}

fn kinds_of(transcript: &[(String, Value)], turn: &str) -> Vec<String> {
    transcript
        .iter()
        .filter(|(_, a)| a["turnId"] == turn)
        .map(|(_, a)| kind(a).to_owned())
        .collect()
}

async fn a_streamed_turn_is_recorded_in_order_and_seen_live(db: TestDb) {
    let server = start(&db, config(&[agent("fake", "FAKE_ACP_CAPS=load")])).await;
    let api = Api::new(server.base_url());
    let dir = tempfile::tempdir().unwrap();
    api.create("s1", "fake", &[dir.path()]).await;
    // A live viewer of the chat, subscribed before the turn.
    let viewer = server.initialized("viewer").await;
    let (_, mut envelopes) = viewer
        .subscribe("ahp-chat:/s1.main".into())
        .await
        .expect("subscribe");

    api.turn("s1", "t1", "stream 5").await;
    let transcript = api.until("s1", "the turn's end", ended("t1")).await;
    assert_eq!(
        kinds_of(&transcript, "t1"),
        [
            "chat/turnStarted",
            "chat/responsePart",
            "chat/delta",
            "chat/delta",
            "chat/delta",
            "chat/delta",
            "chat/turnComplete"
        ]
    );
    assert_eq!(
        answer(&transcript, "t1"),
        "chunk0 chunk1 chunk2 chunk3 chunk4 "
    );
    let opened = transcript
        .iter()
        .find(|(_, a)| kind(a) == "x-tether/agentOpened")
        .expect("the agent opened the session");
    assert_eq!(opened.0, "ahp-session:/s1");
    assert_eq!(opened.1["loadSession"], true);
    assert_eq!(opened.1["resumed"], false);
    assert!(
        opened.1["acpSessionRef"]
            .as_str()
            .unwrap()
            .starts_with("fake-")
    );

    // The viewer saw exactly the chat's records, in the same order.
    let mut seen = Vec::new();
    while seen.len() < 7 {
        let envelope = tether_tests::next_envelope(&mut envelopes).await;
        seen.push(serde_json::to_value(&envelope.action).unwrap());
    }
    let recorded: Vec<&Value> = transcript
        .iter()
        .filter(|(c, _)| c == "ahp-chat:/s1.main")
        .map(|(_, a)| a)
        .collect();
    assert_eq!(seen.iter().collect::<Vec<_>>(), recorded);

    // Thoughts, commands, titles and plans.
    api.turn("s1", "t2", "think").await;
    let transcript = api.until("s1", "t2's end", ended("t2")).await;
    let parts: Vec<&Value> = transcript
        .iter()
        .filter(|(_, a)| a["turnId"] == "t2" && kind(a) == "chat/responsePart")
        .map(|(_, a)| &a["part"])
        .collect();
    assert_eq!(parts[0]["kind"], "reasoning");
    assert_eq!(parts[0]["content"], "pondering");
    assert_eq!(parts[1]["kind"], "markdown");
    api.turn("s1", "t3", "commands").await;
    api.turn("s1", "t4", "title Fixing the build").await;
    api.turn("s1", "t5", "plan").await;
    let transcript = api.until("s1", "t5's end", ended("t5")).await;
    // The plan is structured state (the session's `_meta`), not text.
    let plan = transcript
        .iter()
        .find_map(|(_, a)| a["_meta"].get("tether/plan"))
        .expect("the plan is recorded");
    assert_eq!(plan["turnId"], "t5");
    assert_eq!(plan["chat"], "ahp-chat:/s1.main");
    assert_eq!(
        plan["entries"][0],
        json!({"content": "look", "priority": "high", "status": "completed"})
    );
    assert_eq!(plan["entries"][1]["status"], "pending");
    assert!(
        !answer(&transcript, "t5").contains("look"),
        "no markdown copy"
    );
    let view = api.view("s1").await;
    assert_eq!(view["projection"]["plan"], *plan);
    assert_eq!(view["title"], "Fixing the build");
    assert_eq!(view["projection"]["commands"][0]["name"], "test");
    assert_eq!(view["projection"]["commands"][0]["inputHint"], "filter");
    assert_eq!(view["state"], "live");
    assert_eq!(view["resumable"], true);
    assert_eq!(view["turns"], 5);
    server.stop().await;
}

async fn a_permission_request_waits_for_a_client_and_its_answer_reaches_the_agent(db: TestDb) {
    let server = start(&db, config(&[agent("fake", "FAKE_ACP_CAPS=")])).await;
    let api = Api::new(server.base_url());
    api.create("p1", "fake", &[]).await;
    api.turn("p1", "t1", "permission").await;
    let transcript = api
        .until("p1", "the pending confirmation", |a| {
            kind(a) == "chat/toolCallReady" && a["options"].is_array()
        })
        .await;
    let ready = &transcript
        .iter()
        .find(|(_, a)| kind(a) == "chat/toolCallReady")
        .unwrap()
        .1;
    assert_eq!(ready["toolCallId"], "edit-1");
    assert_eq!(
        ready["options"][0],
        json!({"id": "allow", "label": "Allow once", "kind": "approve", "group": 0})
    );
    assert!(ready.get("confirmed").is_none(), "it waits for a person");
    // The edit it asks to make is shown with the question, both sides
    // stored and readable.
    let edit = &ready["edits"]["items"][0];
    assert_eq!(
        edit["after"]["uri"], "file:///project/config.json",
        "{ready}"
    );
    assert_eq!(edit["diff"], json!({"added": 1, "removed": 1}), "{ready}");
    for (side, text) in [
        ("before", "{\"debug\": false}\n"),
        ("after", "{\"debug\": true}\n"),
    ] {
        let uri = edit[side]["content"]["uri"]
            .as_str()
            .expect("a stored side");
        let digest = uri.trim_start_matches("tether-attachment:");
        let response = reqwest::get(format!(
            "{}/v1/sessions/p1/attachments/{digest}",
            server.base_url()
        ))
        .await
        .unwrap();
        assert_eq!(response.status(), 200, "{uri}");
        assert_eq!(response.text().await.unwrap(), text, "{side}");
    }
    // Nothing moves until a client answers.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        !api.transcript("p1")
            .await
            .iter()
            .any(|(_, a)| ended("t1")(a))
    );
    let view = api.view("p1").await;
    assert_eq!(view["projection"]["openTurnId"], "t1");

    let (status, answer_) = api
        .dispatch(
            "p1",
            true,
            json!({"type": "chat/toolCallConfirmed", "turnId": "t1",
            "toolCallId": "edit-1", "approved": true, "selectedOptionId": "allow"}),
        )
        .await;
    assert_eq!(status, 200, "{answer_}");
    let transcript = api.until("p1", "t1's end", ended("t1")).await;
    assert_eq!(
        kinds_of(&transcript, "t1"),
        [
            "chat/turnStarted",
            "chat/toolCallStart",
            "chat/toolCallReady",
            "chat/toolCallConfirmed",
            "chat/toolCallComplete",
            "chat/responsePart",
            "chat/turnComplete"
        ]
    );
    assert_eq!(answer(&transcript, "t1"), "edited");

    // Denied: the agent hears "reject" (no option named, the first deny).
    api.turn("p1", "t2", "permission").await;
    api.until("p1", "t2's confirmation", |a| {
        kind(a) == "chat/toolCallReady" && a["turnId"] == "t2"
    })
    .await;
    api.dispatch(
        "p1",
        true,
        json!({"type": "chat/toolCallConfirmed", "turnId": "t2",
        "toolCallId": "edit-1", "approved": false}),
    )
    .await;
    let transcript = api.until("p1", "t2's end", ended("t2")).await;
    assert_eq!(answer(&transcript, "t2"), "not edited");
    server.stop().await;
}

async fn a_cancelled_turn_reaches_the_agent_and_the_session_goes_on(db: TestDb) {
    let server = start(&db, config(&[agent("fake", "FAKE_ACP_CAPS=")])).await;
    let api = Api::new(server.base_url());
    api.create("c1", "fake", &[]).await;
    api.turn("c1", "t1", "hang").await;
    api.until("c1", "the agent at work", |a| {
        kind(a) == "chat/responsePart"
    })
    .await;
    let (status, _) = api
        .dispatch(
            "c1",
            true,
            json!({"type": "chat/turnCancelled", "turnId": "t1", "duration": 1}),
        )
        .await;
    assert_eq!(status, 200);
    // The agent answered session/cancel with `cancelled`: its next turn is
    // served, so the prompt did end; nothing more was recorded for t1.
    api.turn("c1", "t2", "after").await;
    let transcript = api.until("c1", "t2's end", ended("t2")).await;
    assert_eq!(answer(&transcript, "t2"), "after");
    assert_eq!(
        kinds_of(&transcript, "t1"),
        [
            "chat/turnStarted",
            "chat/responsePart",
            "chat/turnCancelled"
        ]
    );
    // Cancelled while a permission request waits: the agent is told
    // `cancelled` and the session goes on.
    api.turn("c1", "t3", "permission").await;
    api.until("c1", "t3's confirmation", |a| {
        kind(a) == "chat/toolCallReady" && a["turnId"] == "t3"
    })
    .await;
    api.dispatch(
        "c1",
        true,
        json!({"type": "chat/turnCancelled", "turnId": "t3", "duration": 1}),
    )
    .await;
    api.turn("c1", "t4", "still here").await;
    let transcript = api.until("c1", "t4's end", ended("t4")).await;
    assert_eq!(answer(&transcript, "t4"), "still here");
    // Turns cannot be taken back from an ACP agent's session: a client's
    // truncation is refused, not recorded behind the agent's back.
    let (status, problem) = api
        .dispatch(
            "c1",
            true,
            json!({"type": "chat/truncated", "turnId": "t2"}),
        )
        .await;
    tether_tests::assert_refused(status, &problem, 422, "cannot forget turns");
    server.stop().await;
}

async fn a_crash_mid_turn_fails_the_turn_and_settles_the_session(db: TestDb) {
    let server = start(
        &db,
        config(&[
            agent("loader", "FAKE_ACP_CAPS=load"),
            agent("plain", "FAKE_ACP_CAPS="),
        ]),
    )
    .await;
    let api = Api::new(server.base_url());
    api.create("k1", "loader", &[]).await;
    api.turn("k1", "t1", "crash").await;
    let transcript = api.until("k1", "the failed turn", ended("t1")).await;
    let failed = &transcript.iter().find(|(_, a)| ended("t1")(a)).unwrap().1;
    assert_eq!(kind(failed), "chat/error");
    assert_eq!(failed["part"]["error"]["errorType"], "process_exited");
    assert!(
        failed["part"]["error"]["message"]
            .as_str()
            .unwrap()
            .contains("status 3"),
        "{failed}"
    );
    let settled = api
        .until("k1", "the settling", is("x-tether/sessionSettled"))
        .await;
    let last = settled
        .iter()
        .rev()
        .find(|(_, a)| kind(a) == "x-tether/sessionSettled")
        .unwrap();
    assert_eq!(last.1["state"], "dormant", "it can be resumed");
    assert_eq!(last.1["cause"], "process_exited");
    assert_eq!(api.view("k1").await["state"], "dormant");
    // Its next turn starts the agent again, which loads its own session.
    api.turn("k1", "t2", "again").await;
    let transcript = api.until("k1", "t2's end", ended("t2")).await;
    assert_eq!(answer(&transcript, "t2"), "again");
    let opens: Vec<&Value> = transcript
        .iter()
        .filter(|(_, a)| kind(a) == "x-tether/agentOpened")
        .map(|(_, a)| a)
        .collect();
    assert_eq!(opens.len(), 2);
    assert_eq!(opens[1]["resumed"], true);
    assert_eq!(opens[1]["acpSessionRef"], opens[0]["acpSessionRef"]);
    assert!(
        !transcript
            .iter()
            .any(|(_, a)| a.to_string().contains("replayed history")),
        "session/load's replay is not recorded again"
    );

    // An agent that cannot load: the session ends.
    api.create("k2", "plain", &[]).await;
    api.turn("k2", "t1", "crash").await;
    api.until("k2", "the settling", |a| {
        kind(a) == "x-tether/sessionSettled" && a["cause"] == "process_exited"
    })
    .await;
    assert_eq!(api.view("k2").await["state"], "ended");
    server.stop().await;
}

async fn an_agent_that_writes_garbage_or_never_answers_is_stopped_with_a_clear_error(db: TestDb) {
    let mut config = config(&[
        agent("noisy", "FAKE_ACP_MODE=garbage"),
        agent("mute", "FAKE_ACP_MODE=never-init"),
        agent("midway", "FAKE_ACP_CAPS="),
    ]);
    // Long enough for a normal agent to start on a loaded machine.
    config.engine.acp.init_timeout = Duration::from_secs(3);
    config.engine.acp.max_updates_per_turn = 20;
    let server = start(&db, config).await;
    let api = Api::new(server.base_url());
    for (id, provider, text, needle) in [
        ("g1", "noisy", "hello", "not an ACP message"),
        ("g2", "mute", "hello", "did not answer initialize"),
        ("g3", "midway", "garbage", "not an ACP message"),
        ("g4", "midway", "flood 50", "more than 20 updates"),
    ] {
        api.create(id, provider, &[]).await;
        api.turn(id, "t1", text).await;
        let transcript = api.until(id, "the failed turn", ended("t1")).await;
        let failed = &transcript.iter().find(|(_, a)| ended("t1")(a)).unwrap().1;
        assert_eq!(kind(failed), "chat/error", "{id}");
        let message = failed["part"]["error"]["message"].as_str().unwrap();
        assert!(message.contains(needle), "{id}: {message}");
    }
    // The host keeps serving.
    api.create("fine", "echo", &[]).await;
    api.turn("fine", "t1", "still serving").await;
    let transcript = api.until("fine", "the echo", ended("t1")).await;
    assert_eq!(answer(&transcript, "t1"), "still serving");
    server.stop().await;
}

async fn unknown_providers_and_the_process_limit_are_refused_clearly(db: TestDb) {
    let mut config = config(&[agent("fake", "FAKE_ACP_CAPS=")]);
    config.engine.max_agents = 1;
    let server = start(&db, config).await;
    let api = Api::new(server.base_url());
    let (status, problem) = api
        .call(
            reqwest::Method::POST,
            "/v1/sessions",
            Some(json!({"provider": "nobody"})),
        )
        .await;
    assert_eq!(status, 422, "{problem}");
    let detail = problem["detail"].as_str().unwrap();
    assert!(
        detail.contains("echo") && detail.contains("fake"),
        "{detail}"
    );

    // The root state advertises the agent with what it reported.
    let client = server.initialized("root-viewer").await;
    let (root, _) = client.subscribe("ahp-root://".into()).await.expect("root");
    let root = serde_json::to_value(&root.snapshot).unwrap();
    assert!(root.to_string().contains("\"provider\":\"fake\""), "{root}");
    assert!(root.to_string().contains("Fake agent"), "{root}");

    api.create("m1", "fake", &[]).await;
    api.create("m2", "fake", &[]).await;
    api.turn("m1", "t1", "hang").await;
    api.until("m1", "the first agent at work", |a| {
        kind(a) == "chat/responsePart"
    })
    .await;
    api.turn("m2", "t1", "hello").await;
    let transcript = api.until("m2", "the refused turn", ended("t1")).await;
    let failed = &transcript.iter().find(|(_, a)| ended("t1")(a)).unwrap().1;
    assert_eq!(failed["part"]["error"]["errorType"], "agent_unavailable");
    assert!(
        failed["part"]["error"]["message"]
            .as_str()
            .unwrap()
            .contains("maximum of 1"),
        "{failed}"
    );
    server.stop().await;
}

async fn an_idle_agent_is_stopped_and_its_next_turn_starts_it_again(db: TestDb) {
    let mut config = config(&[agent("fake", "FAKE_ACP_CAPS=load")]);
    config.engine.agent_idle = Duration::from_millis(600);
    let server = start(&db, config).await;
    let api = Api::new(server.base_url());
    api.create("i1", "fake", &[]).await;
    api.turn("i1", "t1", "hello").await;
    api.until("i1", "t1's end", ended("t1")).await;
    api.until("i1", "the idle stop", |a| {
        kind(a) == "x-tether/sessionSettled" && a["cause"] == "idle"
    })
    .await;
    assert_eq!(api.view("i1").await["state"], "dormant");
    api.turn("i1", "t2", "awake").await;
    let transcript = api.until("i1", "t2's end", ended("t2")).await;
    assert_eq!(answer(&transcript, "t2"), "awake");
    // A turn a client cancels frees the agent too: idle after it, the
    // process is stopped as after a turn that ended by itself.
    api.turn("i1", "t3", "hang").await;
    api.until("i1", "t3 at work", |a| {
        kind(a) == "chat/responsePart" && a["turnId"] == "t3"
    })
    .await;
    let (status, _) = api
        .dispatch(
            "i1",
            true,
            json!({"type": "chat/turnCancelled", "turnId": "t3", "duration": 1}),
        )
        .await;
    assert_eq!(status, 200);
    let idle_stops = |transcript: &[(String, Value)]| {
        transcript
            .iter()
            .filter(|(_, a)| kind(a) == "x-tether/sessionSettled" && a["cause"] == "idle")
            .count()
    };
    let mut transcript = api.transcript("i1").await;
    for _ in 0..400 {
        if idle_stops(&transcript) == 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
        transcript = api.transcript("i1").await;
    }
    assert_eq!(
        idle_stops(&transcript),
        2,
        "the agent was not stopped after its cancelled turn: {transcript:#?}"
    );
    assert_eq!(api.view("i1").await["state"], "dormant");
    server.stop().await;
}

async fn resume_reopens_the_agent_without_replaying_its_history(db: TestDb) {
    let server = start(
        &db,
        config(&[
            agent("resumer", "FAKE_ACP_CAPS=resume,dirs"),
            agent("loader", "FAKE_ACP_CAPS=load,dirs"),
            agent("single", "FAKE_ACP_CAPS=resume"),
        ]),
    )
    .await;
    let api = Api::new(server.base_url());
    let (a, b, c) = (
        tempfile::tempdir().unwrap(),
        tempfile::tempdir().unwrap(),
        tempfile::tempdir().unwrap(),
    );
    for provider in ["resumer", "loader"] {
        let id = format!("r-{provider}");
        api.create(&id, provider, &[a.path(), b.path()]).await;
        api.turn(&id, "t1", "dirs").await;
        let transcript = api.until(&id, "t1's end", ended("t1")).await;
        assert_eq!(
            answer(&transcript, "t1"),
            format!("dirs: {}", b.path().display())
        );
        api.turn(&id, "t2", "crash").await;
        api.until(&id, "the settling", |x| {
            kind(x) == "x-tether/sessionSettled" && x["cause"] == "process_exited"
        })
        .await;
        let (status, resumed) = api
            .call(
                reqwest::Method::POST,
                &format!("/v1/sessions/{id}/resume"),
                Some(json!({"sessionId": id, "cwd": a.path(), "additionalDirectories": [c.path()], "mcpServers": []})),
            )
            .await;
        assert_eq!(status, 200, "{provider}: {resumed}");
        let view = api.view(&id).await;
        assert_eq!(view["state"], "live", "{provider}");
        let dirs = view["workingDirectories"].as_array().unwrap();
        assert_eq!(dirs.len(), 2, "{view}");
        api.turn(&id, "t3", "dirs").await;
        let transcript = api.until(&id, "t3's end", ended("t3")).await;
        assert_eq!(
            answer(&transcript, "t3"),
            format!("dirs: {}", c.path().display()),
            "{provider}: the agent got the complete new list"
        );
        let opens: Vec<&Value> = transcript
            .iter()
            .filter(|(_, x)| kind(x) == "x-tether/agentOpened")
            .map(|(_, x)| x)
            .collect();
        assert_eq!(
            opens.len(),
            2,
            "{provider}: one process per open, none twice"
        );
        assert_eq!(opens[1]["resumed"], true);
        assert!(
            !transcript
                .iter()
                .any(|(_, x)| x.to_string().contains("replayed history")),
            "{provider}: no history replayed into the transcript"
        );
    }
    // An agent of a single directory is not resumed with more, as it is not
    // created with more.
    api.create("r-single", "single", &[a.path()]).await;
    api.turn("r-single", "t1", "hello").await;
    api.until("r-single", "t1's end", ended("t1")).await;
    let (status, refused) = api
        .call(
            reqwest::Method::POST,
            "/v1/sessions/r-single/resume",
            Some(json!({"sessionId": "r-single", "cwd": a.path(), "additionalDirectories": [b.path()], "mcpServers": []})),
        )
        .await;
    tether_tests::assert_refused(status, &refused, 422, "single directory");
    server.stop().await;
}

async fn working_directories_change_through_the_agent(db: TestDb) {
    let mut config = config(&[agent("fake", "FAKE_ACP_CAPS=resume,dirs,mcp")]);
    config.effects = tether_server::config::EffectsConfig::Agent;
    let server = start(&db, config).await;
    let api = Api::new(server.base_url());
    let root = tempfile::tempdir().unwrap();
    let (a, b) = (root.path().join("a"), root.path().join("b"));
    let refused = root.path().join("refuse-me");
    for dir in [&a, &b, &refused] {
        std::fs::create_dir(dir).unwrap();
    }
    api.create("w1", "fake", &[&a]).await;
    api.turn("w1", "t1", "dirs").await;
    api.until("w1", "t1's end", ended("t1")).await;
    let uri = |p: &std::path::Path| format!("file://{}", p.display());
    let (status, answer_) = api
        .dispatch(
            "w1",
            false,
            json!({"type": "session/workingDirectorySet", "directory": uri(&b)}),
        )
        .await;
    assert_eq!(status, 200, "{answer_}");
    api.turn("w1", "t2", "dirs").await;
    let transcript = api.until("w1", "t2's end", ended("t2")).await;
    assert_eq!(
        answer(&transcript, "t2"),
        format!("dirs: {}", b.display()),
        "applied through session/resume"
    );
    // A directory inside one it has: the same process, told through
    // session/resume, which names the session's MCP server too (an agent
    // that connects anew from it still has the host's tools).
    let inner = a.join("inner");
    std::fs::create_dir(&inner).unwrap();
    let (status, answer_) = api
        .dispatch(
            "w1",
            false,
            json!({"type": "session/workingDirectorySet", "directory": uri(&inner)}),
        )
        .await;
    assert_eq!(status, 200, "{answer_}");
    api.turn("w1", "t2b", "mcp-list").await;
    let transcript = api.until("w1", "t2b's end", ended("t2b")).await;
    let listed = answer(&transcript, "t2b");
    assert!(
        listed.starts_with("tools: ") && listed.contains("load_working_context"),
        "{listed}"
    );

    // The agent refuses: so does the host, with the agent's reason, and
    // nothing is recorded.
    let (status, problem) = api
        .dispatch(
            "w1",
            false,
            json!({"type": "session/workingDirectorySet", "directory": uri(&refused)}),
        )
        .await;
    tether_tests::assert_refused(status, &problem, 422, "cannot work in");
    let view = api.view("w1").await;
    assert_eq!(view["workingDirectories"].as_array().unwrap().len(), 3);

    // A primary replacement needs a capability ACP agents do not have:
    // refused before the agent is asked.
    let (status, problem) = api
        .dispatch(
            "w1",
            false,
            json!({"type": "session/workingDirectoryReplaced",
            "directory": uri(&a), "replacement": uri(&refused)}),
        )
        .await;
    tether_tests::assert_refused(status, &problem, 422, "primary");
    server.stop().await;
}

async fn the_boot_sweep_settles_a_session_whose_agent_was_mid_turn(db: TestDb) {
    let spec = agent("fake", "FAKE_ACP_CAPS=load");
    let mut server = ServerProcess::start(&db, &["--agent", &spec]).await;
    let api = Api::new(server.base_url());
    api.create("b1", "fake", &[]).await;
    api.turn("b1", "t1", "hang").await;
    api.until("b1", "the agent at work", |a| {
        kind(a) == "chat/responsePart"
    })
    .await;
    server.kill().await;
    server.restart().await;
    let transcript = api.until("b1", "the swept turn", ended("t1")).await;
    let failed = &transcript.iter().find(|(_, a)| ended("t1")(a)).unwrap().1;
    assert_eq!(failed["part"]["error"]["errorType"], "process_exited");
    assert_eq!(api.view("b1").await["state"], "dormant");
    // And it goes on with a fresh process that loads the agent's session.
    api.turn("b1", "t2", "back").await;
    let transcript = api.until("b1", "t2's end", ended("t2")).await;
    assert_eq!(answer(&transcript, "t2"), "back");
    server.terminate().await;
}

/// The fake agent's pid, from the `acpSessionRef` it made (`fake-PID-N`).
fn agent_pid(transcript: &[(String, Value)]) -> u32 {
    let reference = transcript
        .iter()
        .rev()
        .find(|(_, a)| kind(a) == "x-tether/agentOpened")
        .and_then(|(_, a)| a["acpSessionRef"].as_str())
        .expect("an opened agent");
    reference
        .split('-')
        .nth(1)
        .and_then(|p| p.parse().ok())
        .expect("a pid")
}

use tether_tests::{alive, gone};

/// A server killed with SIGKILL cannot stop its agents, and one that
/// ignores EOF and SIGTERM keeps running; the next start on the same store
/// stops it (it was noted in its scratch directory with its server).
async fn an_agent_a_killed_server_left_running_is_stopped_at_its_next_start(db: TestDb) {
    let spec = agent("fake", "FAKE_ACP_MODE=stubborn");
    let mut server = ServerProcess::start(&db, &["--agent", &spec]).await;
    let api = Api::new(server.base_url());
    api.create("k1", "fake", &[]).await;
    api.turn("k1", "t1", "hang").await;
    let pid = agent_pid(
        &api.until("k1", "k1 at work", |a| kind(a) == "chat/responsePart")
            .await,
    );
    server.kill().await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(alive(pid), "a killed server left its agent running");
    server.restart().await;
    assert!(
        gone(pid).await,
        "the next start stopped the agent the killed server left"
    );
    assert!(server.log().contains("left running"), "and said so");
    server.terminate().await;
}

async fn processes_are_killed_on_dispose_and_shutdown_even_when_they_ignore_eof(db: TestDb) {
    let spec = agent("fake", "FAKE_ACP_MODE=stubborn");
    let mut server = ServerProcess::start(&db, &["--agent", &spec]).await;
    let api = Api::new(server.base_url());
    for id in ["d1", "d2"] {
        api.create(id, "fake", &[]).await;
        api.turn(id, "t1", "hang").await;
    }
    let first = agent_pid(
        &api.until("d1", "d1 at work", |a| kind(a) == "chat/responsePart")
            .await,
    );
    let second = agent_pid(
        &api.until("d2", "d2 at work", |a| kind(a) == "chat/responsePart")
            .await,
    );
    assert!(alive(first) && alive(second) && first != second);
    let (status, _) = api
        .call(reqwest::Method::DELETE, "/v1/sessions/d1", None)
        .await;
    assert_eq!(status, 200);
    assert!(gone(first).await, "disposing the session killed its agent");
    assert!(alive(second));
    server.terminate().await;
    assert!(
        gone(second).await,
        "shutting down killed the agent that ignores SIGTERM and EOF"
    );
    // The shutdown itself failed the open turn and settled the session
    // (cause `shutdown`), before the store closed: the next start's boot
    // sweep finds nothing to do.
    server.restart().await;
    let transcript = api.transcript("d2").await;
    let failed = &transcript
        .iter()
        .find(|(_, a)| ended("t1")(a))
        .expect("the open turn failed at shutdown")
        .1;
    assert!(
        failed["part"]["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("shut down")),
        "{failed}"
    );
    let causes: Vec<&str> = transcript
        .iter()
        .filter(|(_, a)| kind(a) == "x-tether/sessionSettled")
        .filter_map(|(_, a)| a["cause"].as_str())
        .collect();
    assert_eq!(causes.last(), Some(&"shutdown"), "{transcript:#?}");
    assert_eq!(api.view("d2").await["state"], "dormant");
    server.terminate().await;
}

async fn the_cli_lists_agents_and_streams_a_turn_approving_with_yes(db: TestDb) {
    let spec = agent("fake", "FAKE_ACP_CAPS=load");
    let server = ServerProcess::start(&db, &["--agent", &spec]).await;
    let api = Api::new(server.base_url());
    api.create("cli1", "fake", &[]).await;
    let state = tempfile::tempdir().unwrap();
    let cli = |args: &[&str]| {
        let mut command = tokio::process::Command::new(tether_tests::tether_bin());
        command
            .args(args)
            .env("TETHER_URL", server.base_url())
            .env("XDG_STATE_HOME", state.path())
            .stdin(std::process::Stdio::null())
            .kill_on_drop(true);
        command
    };
    let listed = cli(&["agents"]).output().await.expect("tether agents");
    let text = String::from_utf8_lossy(&listed.stdout);
    assert!(listed.status.success(), "{listed:?}");
    assert!(
        text.lines()
            .any(|l| l.starts_with("echo") && l.contains("builtin")),
        "{text}"
    );
    assert!(
        text.lines()
            .any(|l| l.starts_with("fake") && l.contains("acp") && l.contains("loadSession")),
        "{text}"
    );

    let sent = tokio::time::timeout(
        Duration::from_secs(60),
        cli(&["send", "cli1", "permission", "--yes"]).output(),
    )
    .await
    .expect("in time")
    .expect("tether send");
    let (out, err) = (
        String::from_utf8_lossy(&sent.stdout),
        String::from_utf8_lossy(&sent.stderr),
    );
    assert!(sent.status.success(), "{out} / {err}");
    assert_eq!(out.trim(), "edited", "stderr: {err}");
    assert!(err.contains("Editing config.json"), "{err}");
    assert!(err.contains("approving"), "{err}");
    let transcript = api.transcript("cli1").await;
    let confirmed = transcript
        .iter()
        .find(|(_, a)| kind(a) == "chat/toolCallConfirmed")
        .expect("confirmed");
    assert_eq!(confirmed.1["selectedOptionId"], "allow");
}
