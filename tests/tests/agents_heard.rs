//! What an ACP agent says beyond its text, both ways over AHP, through the
//! real binary on both backends: the scripted agent offers modes and
//! options (a model among them), changes them itself, refuses some values,
//! advertises commands, reports usage with a cost and takes
//! `session/close`, and asks questions (elicitations) that clients answer;
//! messages queued while a turn runs start the next turns in order; a
//! message's attachments reach the agent as content blocks, stored once.

use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use tether_tests::ahp_raw::Ahp;
use tether_tests::{ServerProcess, TestDb, backend_tests};

backend_tests!(
    an_agents_modes_and_options_are_the_sessions_configuration_both_ways,
    commands_answer_completions_and_usage_keeps_its_cost,
    queued_messages_start_the_next_turns_in_queue_order,
    an_agents_question_waits_for_an_answer_and_times_out_as_the_agent_is_told,
    attachments_reach_the_agent_as_content_blocks_and_are_stored_once,
    an_agent_that_needs_a_login_is_logged_in_from_its_configuration_or_says_how,
    a_configuration_change_while_the_agent_streams_is_applied_at_once,
    an_agent_that_does_not_answer_a_change_in_time_leaves_it_to_a_retry,
);

const FAKE: &str = env!("CARGO_BIN_EXE_fake-acp-agent");
use tether_tests::ahp_raw::WAIT;

fn agent(log: &Path) -> String {
    format!(
        "fake=FAKE_ACP_CAPS=config,close,title FAKE_ACP_LOG={} {FAKE}",
        log.display()
    )
}

async fn get(base: &str, path: &str) -> Value {
    reqwest::get(format!("{base}{path}"))
        .await
        .expect("GET")
        .json()
        .await
        .expect("JSON")
}

/// A session's summary as AHP `listSessions` answers it.
async fn summary_of(ahp: &mut Ahp, resource: &str) -> Value {
    let listed = ahp.call("listSessions", json!({})).await.unwrap();
    listed["items"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["resource"] == resource)
        .cloned()
        .unwrap_or_else(|| panic!("{resource} is not listed: {listed}"))
}

fn log_lines(log: &Path) -> Vec<String> {
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .lines()
        .map(str::to_owned)
        .collect()
}

async fn an_agents_modes_and_options_are_the_sessions_configuration_both_ways(db: TestDb) {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("agent.log");
    // Unconfined: the agent writes its log outside any session's folders.
    let server = ServerProcess::start(
        &db,
        &["--agent", &agent(&log), "--agent-confinement", "off"],
    )
    .await;
    let base = server.base_url();

    // What the agent offers, before any session: REST, the root state and
    // resolveSessionConfig.
    let agents = get(&base, "/v1/agents").await;
    let fake = agents["agents"]
        .as_array()
        .unwrap()
        .iter()
        .find(|a| a["provider"] == "fake")
        .cloned()
        .expect("listed");
    let properties = &fake["capabilities"]["config"]["schema"]["properties"];
    assert_eq!(properties["mode"]["enum"], json!(["ask", "code"]), "{fake}");
    assert_eq!(properties["model"]["enum"], json!(["fast", "smart"]));
    assert_eq!(properties["thought"]["enum"], json!(["low", "high"]));
    assert_eq!(fake["capabilities"]["configCategories"]["model"], "model");
    let mut ahp = Ahp::connect(&server.ws_url(), "config-test").await;
    let root = ahp
        .call("subscribe", json!({"channel": "ahp-root://"}))
        .await
        .unwrap();
    let models = root["snapshot"]["state"]["agents"]
        .as_array()
        .unwrap()
        .iter()
        .find(|a| a["provider"] == "fake")
        .map(|a| a["models"].clone())
        .unwrap();
    assert_eq!(
        models[1],
        json!({"id": "smart", "provider": "fake", "name": "Smart"})
    );
    let resolved = ahp
        .call(
            "resolveSessionConfig",
            json!({"channel": "ahp-root://", "provider": "fake", "config": {"model": "smart"}}),
        )
        .await
        .unwrap();
    assert_eq!(resolved["values"]["model"], "smart");
    assert_eq!(resolved["values"]["mode"], "ask");
    let refused = ahp
        .call(
            "resolveSessionConfig",
            json!({"channel": "ahp-root://", "provider": "fake", "config": {"model": "huge"}}),
        )
        .await
        .unwrap_err();
    assert!(refused.contains("\"fast\", \"smart\""), "{refused}");
    let completions = ahp
        .call(
            "sessionConfigCompletions",
            json!({"channel": "ahp-root://", "provider": "fake", "property": "model", "query": "SM"}),
        )
        .await
        .unwrap();
    assert_eq!(
        completions["items"],
        json!([{"value": "smart", "label": "Smart"}])
    );

    // Created with a chosen mode and model: its state says so, and the
    // agent is moved to them when it opens.
    let work = tempfile::tempdir().unwrap();
    ahp.call(
        "createSession",
        json!({"channel": "ahp-session:/cfg", "provider": "fake",
               "workingDirectories": [format!("file://{}", work.path().display())],
               "config": {"mode": "code", "model": "smart"}}),
    )
    .await
    .unwrap();
    let refused = ahp
        .call(
            "createSession",
            json!({"channel": "ahp-session:/cfg-bad", "provider": "fake", "config": {"colour": "red"}}),
        )
        .await
        .unwrap_err();
    assert!(refused.contains("no option \"colour\""), "{refused}");
    let session = ahp
        .call("subscribe", json!({"channel": "ahp-session:/cfg"}))
        .await
        .unwrap();
    let state = &session["snapshot"]["state"];
    assert_eq!(
        state["config"]["values"],
        json!({"mode": "code", "model": "smart", "thought": "low"})
    );
    assert_eq!(
        state["_meta"]["tether/configCategories"]["thought"],
        "thought_level"
    );
    ahp.call("subscribe", json!({"channel": "ahp-chat:/cfg.main"}))
        .await
        .unwrap();
    let answer = ahp.ask("ahp-chat:/cfg.main", "t1", "settings", None).await;
    assert_eq!(answer, "mode=code model=smart thought=low");

    // A client's change is validated, applied to the agent before it is
    // recorded, and reaches every subscriber.
    let bad = ahp
        .dispatch(
            "ahp-session:/cfg",
            json!({"type": "session/configChanged", "config": {"model": "huge"}}),
        )
        .await;
    assert!(bad.is_some_and(|r| r.contains("cannot be \"huge\"")));
    assert_eq!(
        ahp.dispatch(
            "ahp-session:/cfg",
            json!({"type": "session/configChanged", "config": {"thought": "deep"}})
        )
        .await,
        None
    );
    assert!(log_lines(&log).contains(&"set_config_option thought deep".to_owned()));
    assert_eq!(
        ahp.ask("ahp-chat:/cfg.main", "t2", "settings", None).await,
        "mode=code model=smart thought=deep"
    );
    // Changing the model takes deep thinking away: the agent answers with a
    // new shape and a new value, both recorded after the client's change.
    assert_eq!(
        ahp.dispatch(
            "ahp-session:/cfg",
            json!({"type": "session/configChanged", "config": {"model": "fast"}})
        )
        .await,
        None
    );
    // (At the open, the shape grew `deep`, which `smart` allows.)
    ahp.action("x-tether/configSchemaChanged", |a| {
        a["config"]["schema"]["properties"]["thought"]["enum"] == json!(["low", "high", "deep"])
    })
    .await;
    let shape = ahp
        .action("x-tether/configSchemaChanged", |a| {
            a["config"]["schema"]["properties"]["thought"]["enum"] == json!(["low", "high"])
        })
        .await;
    assert_eq!(shape["config"]["values"]["model"], "fast");
    ahp.action("session/configChanged", |a| {
        a["config"]["thought"] == "high"
    })
    .await;
    // The agent refuses a value it listed: nothing is recorded.
    let refused = ahp
        .dispatch(
            "ahp-session:/cfg",
            json!({"type": "session/configChanged", "config": {"thought": "deep"}}),
        )
        .await;
    assert!(refused.is_some(), "deep is no longer offered");

    // The agent changes its own mode: every subscriber hears it.
    ahp.ask("ahp-chat:/cfg.main", "t3", "switch ask", None)
        .await;
    ahp.action("session/configChanged", |a| a["config"]["mode"] == "ask")
        .await;
    // A turn's message picks the model.
    assert_eq!(
        ahp.ask("ahp-chat:/cfg.main", "t4", "settings", Some("smart"))
            .await,
        "mode=ask model=smart thought=high"
    );
    let bad_model = ahp
        .dispatch(
            "ahp-chat:/cfg.main",
            json!({"type": "chat/turnStarted", "turnId": "t5", "startedAt": "2026-12-02T10:00:00.000Z",
                   "message": {"text": "hi", "origin": {"kind": "user"}, "model": {"id": "gigantic"}}}),
        )
        .await;
    assert!(bad_model.is_some_and(|r| r.contains("no model \"gigantic\"")));

    // The projection and a new subscriber see the state as it is.
    let view = get(&base, "/v1/sessions/cfg").await;
    assert_eq!(view["state"], "live", "{view}");
    let mut late = Ahp::connect(&server.ws_url(), "late").await;
    let session = late
        .call("subscribe", json!({"channel": "ahp-session:/cfg"}))
        .await
        .unwrap();
    assert_eq!(
        session["snapshot"]["state"]["config"]["values"],
        json!({"mode": "ask", "model": "smart", "thought": "high"})
    );
    // Two values at once (applied one at a time), the second refused by
    // the agent once it took the first: the client's change is refused,
    // and what the agent did move to is recorded all the same.
    let refused = ahp
        .dispatch(
            "ahp-session:/cfg",
            json!({"type": "session/configChanged", "config": {"model": "fast", "thought": "deep"}}),
        )
        .await;
    assert!(
        refused
            .as_deref()
            .is_some_and(|r| r.contains("did not accept")),
        "{refused:?}"
    );
    late.action("session/configChanged", |a| a["config"]["model"] == "fast")
        .await;
    assert_eq!(
        ahp.ask("ahp-chat:/cfg.main", "t6", "settings", None).await,
        "mode=ask model=fast thought=high"
    );
    let session = late
        .call("subscribe", json!({"channel": "ahp-session:/cfg"}))
        .await
        .unwrap();
    assert_eq!(
        session["snapshot"]["state"]["config"]["values"],
        json!({"mode": "ask", "model": "fast", "thought": "high"}),
        "the state says where the agent is"
    );

    // A client's new title reaches the agent (it takes session/set_title).
    assert_eq!(
        ahp.dispatch(
            "ahp-session:/cfg",
            json!({"type": "session/titleChanged", "title": "Renamed by a person"})
        )
        .await,
        None
    );
    let deadline = Instant::now() + WAIT;
    while !log_lines(&log).contains(&"set_title Renamed by a person".to_owned()) {
        assert!(
            Instant::now() < deadline,
            "no set_title: {:?}",
            log_lines(&log)
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // Disposing closes the agent's session (it takes session/close).
    ahp.call("disposeSession", json!({"channel": "ahp-session:/cfg"}))
        .await
        .unwrap();
    let deadline = Instant::now() + WAIT;
    while !log_lines(&log).iter().any(|l| l.starts_with("close ")) {
        assert!(
            Instant::now() < deadline,
            "no session/close: {:?}",
            log_lines(&log)
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn commands_answer_completions_and_usage_keeps_its_cost(db: TestDb) {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("agent.log");
    // Unconfined: the agent writes its log outside any session's folders.
    let server = ServerProcess::start(
        &db,
        &["--agent", &agent(&log), "--agent-confinement", "off"],
    )
    .await;
    let base = server.base_url();
    let mut ahp = Ahp::connect(&server.ws_url(), "commands-test").await;
    ahp.call(
        "createSession",
        json!({"channel": "ahp-session:/cmd", "provider": "fake"}),
    )
    .await
    .unwrap();
    ahp.call("subscribe", json!({"channel": "ahp-session:/cmd"}))
        .await
        .unwrap();
    ahp.call("subscribe", json!({"channel": "ahp-chat:/cmd.main"}))
        .await
        .unwrap();
    ahp.ask("ahp-chat:/cmd.main", "t1", "commands", None).await;
    ahp.action("session/metaChanged", |a| {
        a["_meta"]["tether/commands"][0]["name"] == "test"
    })
    .await;
    let completions = ahp
        .call(
            "completions",
            json!({"channel": "ahp-chat:/cmd.main", "kind": "userMessage", "text": "/te", "offset": 3}),
        )
        .await
        .unwrap();
    let item = &completions["items"][0];
    assert_eq!(item["insertText"], "/test ");
    assert_eq!(item["rangeEnd"], 3);
    assert_eq!(item["attachment"]["type"], "simple");
    assert_eq!(item["attachment"]["_meta"]["tether/inputHint"], "filter");
    let none = ahp
        .call(
            "completions",
            json!({"channel": "ahp-chat:/cmd.main", "kind": "userMessage", "text": "/xyz", "offset": 4}),
        )
        .await
        .unwrap();
    assert_eq!(none["items"], json!([]));
    let plain = ahp
        .call(
            "completions",
            json!({"channel": "ahp-chat:/cmd.main", "kind": "userMessage", "text": "hello /te", "offset": 9}),
        )
        .await
        .unwrap();
    assert_eq!(plain["items"], json!([]), "a command starts the message");
    // The echo agent advertises its own commands the same way.
    ahp.call(
        "createSession",
        json!({"channel": "ahp-session:/echo-cmd", "provider": "echo"}),
    )
    .await
    .unwrap();
    ahp.call("subscribe", json!({"channel": "ahp-chat:/echo-cmd.main"}))
        .await
        .unwrap();
    ahp.ask("ahp-chat:/echo-cmd.main", "e1", "hi", None).await;
    let echo = ahp
        .call(
            "completions",
            json!({"channel": "ahp-session:/echo-cmd", "kind": "userMessage", "text": "/", "offset": 1}),
        )
        .await
        .unwrap();
    let names: Vec<&str> = echo["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|i| i["attachment"]["_meta"]["tether/command"].as_str())
        .collect();
    assert_eq!(names, ["echo", "tool"]);

    // Usage with a cost: within the turn as chat/usage, kept by the
    // projection.
    ahp.ask("ahp-chat:/cmd.main", "t2", "usage", None).await;
    let usage = ahp.action("chat/usage", |a| a["turnId"] == "t2").await;
    assert_eq!(
        usage["usage"]["_meta"]["tether/cost"],
        json!({"amount": 0.042, "currency": "USD"})
    );
    assert_eq!(usage["usage"]["_meta"]["tether/contextWindow"], 200000);
    // The turn's own tokens, reported with its end (ACP's
    // PromptResponse.usage): AHP's fields, the rest in _meta.
    let tokens = ahp
        .action("chat/usage", |a| {
            a["turnId"] == "t2" && a["usage"]["inputTokens"].is_u64()
        })
        .await;
    let mut tokens = tokens;
    // The agent session the cost is of (each chat has its own).
    let of = tokens["usage"]["_meta"]
        .as_object_mut()
        .unwrap()
        .remove("tether/costOf");
    assert!(of.as_ref().is_some_and(Value::is_string), "{of:?}");
    assert_eq!(
        tokens["usage"],
        json!({"inputTokens": 1000, "outputTokens": 500, "cacheReadTokens": 250,
               "_meta": {"tether/totalTokens": 1500, "tether/thoughtTokens": 40,
                         // The turn keeps only its latest usage: the context
                         // and cost reported before come with it.
                         "tether/contextUsed": 1200, "tether/contextWindow": 200000,
                         "tether/cost": {"amount": 0.042, "currency": "USD"}}})
    );
    let view = get(&base, "/v1/sessions/cmd").await;
    let totals = &view["projection"]["usage"];
    assert_eq!(totals["cost"], json!({"amount": 0.042, "currency": "USD"}));
    assert_eq!(totals["contextUsed"], 1200);
    assert_eq!(totals["inputTokens"], 1000);
    assert_eq!(totals["outputTokens"], 500);
    assert_eq!(view["projection"]["commands"][0]["name"], "test");
    // Nothing non-standard was written for the commands.
    let transcript = get(&base, "/v1/sessions/cmd/transcript?after=0&limit=1000").await;
    assert!(
        !transcript
            .to_string()
            .contains("x-tether/commandsAdvertised"),
        "{transcript}"
    );
}

async fn queued_messages_start_the_next_turns_in_queue_order(db: TestDb) {
    let server = ServerProcess::start(&db, &["--agent", &format!("fake={FAKE}")]).await;
    let mut ahp = Ahp::connect(&server.ws_url(), "queue-test").await;
    ahp.call(
        "createSession",
        json!({"channel": "ahp-session:/q", "provider": "fake"}),
    )
    .await
    .unwrap();
    ahp.call("subscribe", json!({"channel": "ahp-chat:/q.main"}))
        .await
        .unwrap();
    let chat = "ahp-chat:/q.main";
    let message = |text: &str| json!({"text": text, "origin": {"kind": "user"}});
    // A slow turn; three messages queued behind it, one removed, the rest
    // reordered, all before it ends.
    assert_eq!(
        ahp.dispatch(
            chat,
            json!({"type": "chat/turnStarted", "turnId": "t1", "startedAt": "2026-12-02T10:00:00.000Z",
                   "message": message("stream 100")})
        )
        .await,
        None
    );
    for (id, text) in [("q1", "first"), ("q2", "second"), ("q3", "third")] {
        let set = json!({"type": "chat/pendingMessageSet", "kind": "queued", "id": id,
                         "message": message(text)});
        assert_eq!(ahp.dispatch(chat, set).await, None, "{id}");
    }
    let removed = json!({"type": "chat/pendingMessageRemoved", "kind": "queued", "id": "q2"});
    assert_eq!(ahp.dispatch(chat, removed).await, None);
    let reordered = json!({"type": "chat/queuedMessagesReordered", "order": ["q3", "q1"]});
    assert_eq!(ahp.dispatch(chat, reordered).await, None);
    ahp.action("chat/turnComplete", |a| a["turnId"] == "t1")
        .await;
    // Each queued message becomes a turn once the one before has ended.
    let mut started = Vec::new();
    for _ in 0..2 {
        let turn = ahp
            .action("chat/turnStarted", |a| {
                a["queuedMessageId"]
                    .as_str()
                    .is_some_and(|id| !started.contains(&id.to_owned()))
            })
            .await;
        let id = turn["queuedMessageId"].as_str().unwrap().to_owned();
        let turn_id = turn["turnId"].as_str().unwrap().to_owned();
        ahp.action("chat/turnComplete", |a| a["turnId"] == turn_id.as_str())
            .await;
        started.push(id);
    }
    assert_eq!(started, ["q3", "q1"]);
    let texts: Vec<String> = ahp
        .seen
        .iter()
        .filter(|m| m["params"]["action"]["type"] == "chat/responsePart")
        .filter_map(|m| {
            m["params"]["action"]["part"]["content"]
                .as_str()
                .map(str::to_owned)
        })
        .filter(|t| ["first", "second", "third"].contains(&t.as_str()))
        .collect();
    assert_eq!(texts, ["third", "first"], "the removed message never ran");
    let state = ahp
        .call("subscribe", json!({"channel": chat}))
        .await
        .unwrap();
    assert!(
        state["snapshot"]["state"]["queuedMessages"]
            .as_array()
            .is_none_or(|q| q.is_empty()),
        "{state}"
    );

    // An idle chat starts a queued message at once (the echo agent).
    ahp.call(
        "createSession",
        json!({"channel": "ahp-session:/qe", "provider": "echo"}),
    )
    .await
    .unwrap();
    ahp.call("subscribe", json!({"channel": "ahp-chat:/qe.main"}))
        .await
        .unwrap();
    let set = json!({"type": "chat/pendingMessageSet", "kind": "queued", "id": "now",
                     "message": message("right away")});
    assert_eq!(ahp.dispatch("ahp-chat:/qe.main", set).await, None);
    let turn = ahp
        .action("chat/turnStarted", |a| a["queuedMessageId"] == "now")
        .await;
    let turn_id = turn["turnId"].as_str().unwrap().to_owned();
    ahp.action("chat/turnComplete", |a| a["turnId"] == turn_id.as_str())
        .await;
}

async fn an_agents_question_waits_for_an_answer_and_times_out_as_the_agent_is_told(db: TestDb) {
    let server = ServerProcess::start(
        &db,
        &[
            "--agent",
            &format!("fake={FAKE}"),
            "--input-timeout-secs",
            "2",
        ],
    )
    .await;
    let mut ahp = Ahp::connect(&server.ws_url(), "asker").await;
    ahp.call(
        "createSession",
        json!({"channel": "ahp-session:/ask", "provider": "fake"}),
    )
    .await
    .unwrap();
    ahp.call("subscribe", json!({"channel": "ahp-session:/ask"}))
        .await
        .unwrap();
    ahp.call("subscribe", json!({"channel": "ahp-chat:/ask.main"}))
        .await
        .unwrap();
    let chat = "ahp-chat:/ask.main";
    let turn = |id: &str| {
        json!({"type": "chat/turnStarted", "turnId": id, "startedAt": "2026-12-02T10:00:00.000Z",
               "message": {"text": "ask", "origin": {"kind": "user"}}})
    };
    assert_eq!(ahp.dispatch(chat, turn("t1")).await, None);
    let asked = ahp.action("chat/inputRequested", |_| true).await;
    let request = &asked["request"];
    let id = request["id"].as_str().unwrap().to_owned();
    assert_eq!(request["message"], "Where should this deploy?");
    let questions = request["questions"].as_array().unwrap();
    let env = questions.iter().find(|q| q["id"] == "env").unwrap();
    assert_eq!(env["kind"], "single-select");
    assert_eq!(env["required"], true);
    let replicas = questions.iter().find(|q| q["id"] == "replicas").unwrap();
    assert_eq!(replicas["kind"], "integer");
    // The session says it needs input, in its state and its summary.
    ahp.action("session/inputNeededSet", |a| {
        a["request"]["kind"] == "chatInput"
    })
    .await;
    let summary = summary_of(&mut ahp, "ahp-session:/ask").await;
    assert_eq!(
        summary["status"].as_u64().unwrap() & 24,
        24,
        "input needed: {summary}"
    );

    // Another client answers: a draft, then the completion.
    let mut other = Ahp::connect(&server.ws_url(), "answerer").await;
    let draft = json!({"type": "chat/inputAnswerChanged", "requestId": id, "questionId": "env",
        "answer": {"state": "draft", "value": {"kind": "selected", "value": "prod"}}});
    assert_eq!(other.dispatch(chat, draft).await, None);
    let done = json!({"type": "chat/inputCompleted", "requestId": id, "response": "accept",
        "answers": {"replicas": {"state": "submitted", "value": {"kind": "number", "value": 3}},
                    "note": {"state": "skipped"}}});
    assert_eq!(other.dispatch(chat, done).await, None);
    let answer = answer_of(&mut ahp, "t1").await;
    assert_eq!(answer, "answered: accept env=\"prod\" replicas=3");
    ahp.action("session/inputNeededRemoved", |a| {
        a["id"] == format!("{chat}#{id}").as_str()
    })
    .await;
    // Answered and ended: the summary is idle again (not "in progress").
    let summary = summary_of(&mut ahp, "ahp-session:/ask").await;
    assert_eq!(
        summary["status"].as_u64().unwrap() & 31,
        1,
        "idle: {summary}"
    );

    // Nobody answers the next one: after the timeout it is cancelled, as
    // the agent is told, and the session goes on.
    assert_eq!(ahp.dispatch(chat, turn("t2")).await, None);
    let completed = ahp
        .action("chat/inputCompleted", |a| a["response"] == "cancel")
        .await;
    assert_ne!(completed["requestId"], json!(id));
    let answer = answer_of(&mut ahp, "t2").await;
    assert_eq!(answer, "answered: cancel");

    // A URL question the person answers at the URL: when the agent says it
    // is done, it is completed (accepted) without a client's answer.
    let url_turn = json!({"type": "chat/turnStarted", "turnId": "t3",
        "startedAt": "2026-12-02T10:00:00.000Z",
        "message": {"text": "login-url", "origin": {"kind": "user"}}});
    assert_eq!(ahp.dispatch(chat, url_turn).await, None);
    let asked = ahp
        .action("chat/inputRequested", |a| {
            a["request"]["url"] == "https://login.example/device"
        })
        .await;
    let url_id = asked["request"]["id"].clone();
    let completed = ahp
        .action("chat/inputCompleted", |a| a["requestId"] == url_id)
        .await;
    assert_eq!(completed["response"], "accept");
    ahp.action("session/inputNeededRemoved", |a| {
        a["id"] == format!("{chat}#{}", url_id.as_str().unwrap()).as_str()
    })
    .await;
    let answer = answer_of(&mut ahp, "t3").await;
    assert_eq!(answer, "url: accept");
}

async fn attachments_reach_the_agent_as_content_blocks_and_are_stored_once(db: TestDb) {
    use base64::Engine as _;
    let b64 = |bytes: &[u8]| base64::engine::general_purpose::STANDARD.encode(bytes);
    let server = ServerProcess::start(
        &db,
        &[
            "--agent",
            &format!("plain={FAKE}"),
            "--agent",
            &format!("seeing=FAKE_ACP_CAPS=image {FAKE}"),
            "--max-attachment-bytes",
            "64",
            "--max-session-attachment-bytes",
            "100",
        ],
    )
    .await;
    let base = server.base_url();
    let mut ahp = Ahp::connect(&server.ws_url(), "attacher").await;
    for (session, provider) in [("plain", "plain"), ("seeing", "seeing")] {
        ahp.call(
            "createSession",
            json!({"channel": format!("ahp-session:/{session}"), "provider": provider}),
        )
        .await
        .unwrap();
        ahp.call(
            "subscribe",
            json!({"channel": format!("ahp-chat:/{session}.main")}),
        )
        .await
        .unwrap();
    }
    let png = [0x89, b'P', b'N', b'G', 0];
    let image = json!({"type": "embeddedResource", "label": "dot.png", "contentType": "image/png",
                       "data": b64(&png)});
    let notes = json!({"type": "embeddedResource", "label": "notes.txt", "contentType": "text/plain",
                       "data": b64(b"hello notes")});
    let link = json!({"type": "resource", "label": "spec", "uri": "https://example.com/spec"});
    let simple = json!({"type": "simple", "label": "note", "modelRepresentation": "a simple note"});
    let turn = |id: &str, text: &str, attachments: Value| {
        json!({"type": "chat/turnStarted", "turnId": id, "startedAt": "2026-12-02T10:00:00.000Z",
               "message": {"text": text, "origin": {"kind": "user"}, "attachments": attachments}})
    };
    // An agent that takes no images is not sent one: refused before commit.
    let refused = ahp
        .dispatch("ahp-chat:/plain.main", turn("p1", "look", json!([image])))
        .await;
    assert!(
        refused
            .as_deref()
            .is_some_and(|r| r.contains("does not take images")),
        "{refused:?}"
    );

    // One that does gets each attachment as the content block it takes.
    let rejected = ahp
        .dispatch(
            "ahp-chat:/seeing.main",
            turn("s1", "blocks", json!([image, notes, link, simple])),
        )
        .await;
    assert_eq!(rejected, None);
    ahp.action("chat/turnComplete", |a| a["turnId"] == "s1")
        .await;
    let answer: String = ahp
        .seen
        .iter()
        .filter(|m| m["params"]["action"]["turnId"] == "s1")
        .filter_map(|m| m["params"]["action"]["part"]["content"].as_str())
        .collect();
    assert_eq!(
        answer,
        "text \"blocks\"; image image/png 5 bytes; resource text/plain \"hello notes\"; \
         link https://example.com/spec; text \"a simple note\""
    );

    // The transcript keeps references, not bytes; the bytes are served.
    let transcript = get(&base, "/v1/sessions/seeing/transcript?after=0&limit=100").await;
    let started = transcript["envelopes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["action"]["turnId"] == "s1" && e["action"]["type"] == "chat/turnStarted")
        .cloned()
        .unwrap();
    let stored = &started["action"]["message"]["attachments"][0];
    assert_eq!(stored["type"], "resource");
    assert!(stored.get("data").is_none(), "{stored}");
    assert_eq!(stored["sizeHint"], 5);
    let uri = stored["uri"].as_str().unwrap();
    let digest = uri
        .strip_prefix("tether-attachment:")
        .expect("a stored reference");
    let served = reqwest::get(format!("{base}/v1/sessions/seeing/attachments/{digest}"))
        .await
        .unwrap();
    assert_eq!(served.status(), 200);
    assert_eq!(served.headers()["content-type"], "image/png");
    assert_eq!(served.headers()["content-disposition"], "attachment");
    assert_eq!(served.bytes().await.unwrap().as_ref(), png);
    let missing = reqwest::get(format!("{base}/v1/sessions/plain/attachments/{digest}"))
        .await
        .unwrap();
    assert_eq!(missing.status(), 404, "another session's attachment");

    // A turn with an embedded attachment, retried with the same origin (a
    // client that lost the answer): the original's outcome, not a refusal
    // of a reused clientSeq (the stored action holds a reference where the
    // retry holds the bytes).
    let http = reqwest::Client::new();
    let retried = json!({"clientId": "retrier", "clientSeq": 1, "channel": "ahp-chat:/seeing.main",
                         "action": turn("r1", "once", json!([notes]))});
    let mut seqs = Vec::new();
    for attempt in 0..2 {
        let answer = http
            .post(format!("{base}/v1/sessions/seeing/actions"))
            .json(&retried)
            .send()
            .await
            .unwrap();
        assert_eq!(answer.status(), 200, "attempt {attempt}");
        let body: Value = answer.json().await.unwrap();
        seqs.push(body["serverSeq"].clone());
    }
    assert_eq!(seqs[0], seqs[1], "the retry is the original: {seqs:?}");

    // What the agent sends of its own (an image, a file) is kept the same
    // way and shown as content references.
    assert_eq!(
        ahp.dispatch("ahp-chat:/plain.main", turn("s0", "picture", json!([])))
            .await,
        None
    );
    ahp.action("chat/turnComplete", |a| a["turnId"] == "s0")
        .await;
    let refs: Vec<Value> = ahp
        .seen
        .iter()
        .map(|m| m["params"]["action"].clone())
        .filter(|a| a["turnId"] == "s0" && a["part"]["kind"] == "contentRef")
        .map(|a| a["part"].clone())
        .collect();
    assert_eq!(refs.len(), 2, "{refs:?}");
    assert_eq!(refs[0]["contentType"], "image/png");
    assert_eq!(refs[1]["contentType"], "text/markdown");
    let file = stored_bytes(&base, "plain", &refs[1]["uri"]).await;
    assert_eq!(file, b"# Notes\nfrom the agent");
    // A tool's image result too: stored, and the result names it.
    assert_eq!(
        ahp.dispatch("ahp-chat:/plain.main", turn("s1", "screenshot", json!([])))
            .await,
        None
    );
    let complete = ahp
        .action("chat/toolCallComplete", |a| a["turnId"] == "s1")
        .await;
    let content = &complete["result"]["content"];
    assert_eq!(
        content[0],
        json!({"type": "text", "text": "the page"}),
        "{complete}"
    );
    assert_eq!(content[1]["type"], "resource", "{complete}");
    assert_eq!(content[1]["contentType"], "image/png");
    let image = stored_bytes(&base, "plain", &content[1]["uri"]).await;
    assert_eq!(image, b"\x89PNG\r\n\x1a\n");

    // The limits: one attachment, and what a session may hold in all.
    let big = json!({"type": "embeddedResource", "label": "big.txt", "contentType": "text/plain",
                     "data": b64(&[b'x'; 65])});
    let refused = ahp
        .dispatch("ahp-chat:/seeing.main", turn("s2", "hi", json!([big])))
        .await;
    assert!(
        refused.as_deref().is_some_and(|r| r.contains("65 bytes")),
        "{refused:?}"
    );
    let sixty = |c: u8| {
        json!({"type": "embeddedResource", "label": "f.txt", "contentType": "text/plain",
                               "data": b64(&[c; 60])})
    };
    assert_eq!(
        ahp.dispatch(
            "ahp-chat:/seeing.main",
            turn("s3", "hi", json!([sixty(b'a')]))
        )
        .await,
        None
    );
    ahp.action("chat/turnComplete", |a| a["turnId"] == "s3")
        .await;
    let refused = ahp
        .dispatch(
            "ahp-chat:/seeing.main",
            turn("s4", "hi", json!([sixty(b'b')])),
        )
        .await;
    assert!(
        refused.as_deref().is_some_and(|r| r.contains("limit")),
        "{refused:?}"
    );
    // The same bytes again are stored once: they fit.
    assert_eq!(
        ahp.dispatch(
            "ahp-chat:/seeing.main",
            turn("s5", "hi", json!([sixty(b'a')]))
        )
        .await,
        None,
        "already stored bytes take no more room"
    );
}

async fn an_agent_that_needs_a_login_is_logged_in_from_its_configuration_or_says_how(db: TestDb) {
    let keyed = format!("keyed=FAKE_ACP_AUTH=FAKE_KEY FAKE_KEY=sk-test {FAKE}");
    let locked = format!("locked=FAKE_ACP_AUTH=FAKE_KEY {FAKE}");
    let server = ServerProcess::start(&db, &["--agent", &keyed, "--agent", &locked]).await;
    let base = server.base_url();
    let agents = get(&base, "/v1/agents").await;
    let find = |provider: &str| {
        agents["agents"]
            .as_array()
            .unwrap()
            .iter()
            .find(|a| a["provider"] == provider)
            .cloned()
            .unwrap()
    };
    // Its login methods are shown as the agent wrote them.
    let methods = &find("keyed")["capabilities"]["authMethods"];
    assert_eq!(methods[0]["type"], "env_var", "{methods}");
    assert_eq!(methods[0]["vars"][0]["name"], "FAKE_KEY");
    assert!(find("keyed")["capabilities"].get("sessionError").is_none());
    let error = find("locked")["capabilities"]["sessionError"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(error.contains("needs a login"), "{error}");
    assert!(
        error.contains("set FAKE_KEY in the agent's configuration"),
        "{error}"
    );
    assert!(error.contains("Browser login"), "{error}");
    assert!(
        !agents.to_string().contains("sk-test"),
        "the key is never shown"
    );
    // AHP clients see the same in the root state.
    let mut ahp = Ahp::connect(&server.ws_url(), "login-test").await;
    let root = ahp
        .call("subscribe", json!({"channel": "ahp-root://"}))
        .await
        .unwrap();
    let logins = &root["snapshot"]["state"]["_meta"]["tether/agents"];
    assert_eq!(logins["keyed"]["authMethods"][1]["id"], "fake-browser");
    assert!(logins["locked"]["sessionError"].is_string(), "{logins}");

    // The configured key logs the agent in (`authenticate`) and its turns
    // run; the other's turns fail with its words and how to log it in.
    for provider in ["keyed", "locked"] {
        ahp.call(
            "createSession",
            json!({"channel": format!("ahp-session:/{provider}"), "provider": provider}),
        )
        .await
        .unwrap();
        ahp.call(
            "subscribe",
            json!({"channel": format!("ahp-chat:/{provider}.main")}),
        )
        .await
        .unwrap();
    }
    assert_eq!(
        ahp.ask("ahp-chat:/keyed.main", "k1", "hello", None).await,
        "hello"
    );
    let rejected = ahp
        .dispatch(
            "ahp-chat:/locked.main",
            json!({"type": "chat/turnStarted", "turnId": "l1", "startedAt": "2026-12-02T10:00:00.000Z",
                   "message": {"text": "hello", "origin": {"kind": "user"}}}),
        )
        .await;
    assert_eq!(rejected, None, "the turn is recorded, then fails");
    let failed = ahp.action("chat/error", |a| a["turnId"] == "l1").await;
    let message = failed["part"]["error"]["message"].as_str().unwrap();
    assert!(message.contains("log in first: no API key"), "{message}");
    assert!(message.contains("FAKE_KEY"), "{message}");
    // The session goes on: the next action is accepted.
    let renamed = ahp
        .dispatch(
            "ahp-session:/locked",
            json!({"type": "session/titleChanged", "title": "needs a key"}),
        )
        .await;
    assert_eq!(renamed, None);

    // tether doctor says which agent cannot open a session.
    let output = tokio::process::Command::new(tether_tests::tether_bin())
        .args(["doctor", "--database-url", db.url(), "--agent", &locked])
        .env_remove("TETHER_AGENTS")
        .output()
        .await
        .unwrap();
    let report = String::from_utf8_lossy(&output.stdout);
    assert!(
        report
            .lines()
            .any(|l| l.starts_with("FAIL") && l.contains("cannot open a session")),
        "{report}"
    );
}

/// A client changes the agent's mode while the agent streams a long
/// answer: the session waits for the agent's answer to `set_mode`, and
/// what the agent streams meanwhile is set aside, not left to block the
/// agent's connection (with the answer stuck behind it the change was
/// refused after the agent's time limit, the session frozen till then).
async fn a_configuration_change_while_the_agent_streams_is_applied_at_once(db: TestDb) {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("log");
    // It answers set_mode after 500 ms: its stream fills what the host
    // buffers meanwhile.
    let server = slow_to_change_modes(&db, &log, 500, 10_000).await;
    let mut ahp = Ahp::connect(&server.ws_url(), "streamer").await;
    ahp.call(
        "createSession",
        json!({"channel": "ahp-session:/talk", "provider": "fake"}),
    )
    .await
    .unwrap();
    for channel in ["ahp-session:/talk", "ahp-chat:/talk.main"] {
        ahp.call("subscribe", json!({"channel": channel}))
            .await
            .unwrap();
    }
    let started = ahp
        .dispatch(
            "ahp-chat:/talk.main",
            json!({"type": "chat/turnStarted", "turnId": "t1", "startedAt": "2026-12-07T10:00:00.000Z",
                   "message": {"text": "chatter", "origin": {"kind": "user"}}}),
        )
        .await;
    assert_eq!(started, None);
    // Well into the stream (more than the host buffers).
    ahp.action("chat/delta", |_| true).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let since = Instant::now();
    let changed = ahp
        .dispatch(
            "ahp-session:/talk",
            json!({"type": "session/configChanged", "config": {"mode": "code"}}),
        )
        .await;
    assert_eq!(changed, None, "refused after {:?}", since.elapsed());
    let lines = log_lines(&log);
    assert!(lines.contains(&"set_mode code".to_owned()), "{lines:?}");
    let cancelled = ahp
        .dispatch(
            "ahp-chat:/talk.main",
            json!({"type": "chat/turnCancelled", "turnId": "t1", "duration": 1}),
        )
        .await;
    assert_eq!(cancelled, None);
    assert_eq!(
        ahp.ask("ahp-chat:/talk.main", "t2", "settings", None).await,
        "mode=code model=fast thought=low",
        "the session goes on, in the new mode"
    );
}

/// An agent that does not answer `set_mode` in time: the change is refused
/// as unavailable, not recorded as the origin's outcome, so the same
/// dispatch retried asks the agent again (it was answered with the first
/// refusal from then on, the agent never asked).
async fn an_agent_that_does_not_answer_a_change_in_time_leaves_it_to_a_retry(db: TestDb) {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("log");
    let server = slow_to_change_modes(&db, &log, 1500, 500).await;
    let base = server.base_url();
    let mut ahp = Ahp::connect(&server.ws_url(), "slow-config").await;
    ahp.call(
        "createSession",
        json!({"channel": "ahp-session:/slow", "provider": "fake"}),
    )
    .await
    .unwrap();
    ahp.call("subscribe", json!({"channel": "ahp-chat:/slow.main"}))
        .await
        .unwrap();
    ahp.ask("ahp-chat:/slow.main", "t1", "settings", None).await;
    let change = json!({"clientId": "slow-client", "clientSeq": 1,
        "action": {"type": "session/configChanged", "config": {"mode": "code"}}});
    let http = reqwest::Client::new();
    for attempt in 1..=2 {
        let answer = http
            .post(format!("{base}/v1/sessions/slow/actions"))
            .json(&change)
            .send()
            .await
            .unwrap();
        let status = answer.status().as_u16();
        let body = answer.text().await.unwrap();
        assert_eq!(status, 503, "attempt {attempt}: {body}");
        assert!(body.contains("in time"), "attempt {attempt}: {body}");
        // The agent takes its requests one at a time: the second is read
        // once it has slept through the first.
        let deadline = Instant::now() + WAIT;
        while log_lines(&log)
            .iter()
            .filter(|l| l.as_str() == "set_mode code")
            .count()
            < attempt
        {
            assert!(
                Instant::now() < deadline,
                "attempt {attempt} never reached the agent"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// A server whose agent answers `set_mode` after `answer_ms`, and which
/// waits `limit_ms` for an agent's answer.
async fn slow_to_change_modes(
    db: &TestDb,
    log: &Path,
    answer_ms: u64,
    limit_ms: u64,
) -> ServerProcess {
    let agent = agent(log).replace("fake=", &format!("fake=FAKE_ACP_SLOW_MODES={answer_ms} "));
    let limit = limit_ms.to_string();
    ServerProcess::start(
        db,
        &[
            "--agent",
            &agent,
            "--agent-confinement",
            "off",
            "--agent-init-timeout-ms",
            &limit,
        ],
    )
    .await
}

/// The bytes a session's `tether-attachment:` URI names, as served.
async fn stored_bytes(base: &str, session: &str, uri: &Value) -> Vec<u8> {
    let digest = uri
        .as_str()
        .and_then(|u| u.strip_prefix("tether-attachment:"))
        .unwrap_or_else(|| panic!("not a stored reference: {uri}"));
    let served = reqwest::get(format!("{base}/v1/sessions/{session}/attachments/{digest}"))
        .await
        .unwrap();
    assert_eq!(served.status(), 200, "{uri}");
    served.bytes().await.unwrap().to_vec()
}

/// What the agent answered in `turn`, once the turn has completed.
async fn answer_of(ahp: &mut Ahp, turn: &str) -> String {
    ahp.action("chat/turnComplete", |a| a["turnId"] == turn)
        .await;
    ahp.seen
        .iter()
        .filter(|m| m["params"]["action"]["turnId"] == turn)
        .filter_map(|m| m["params"]["action"]["part"]["content"].as_str())
        .collect()
}
