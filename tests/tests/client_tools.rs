//! Client-contributed tools, on both backends: a console registers a tool
//! over AHP, the echo agent's `/tool NAME {json}` calls it, the console
//! alone receives the arguments with the host's `__tether` context (seed
//! 002's rules), and nobody else — another subscriber, the transcript, the
//! projection — ever sees it. Timeouts, disconnects and impersonation fail
//! cleanly.

use std::time::Duration;

use ahp::SessionSubscription;
use serde_json::{Value, json};
use tether_server::config::ServeConfig;
use tether_tests::{TestDb, TestServer, action, backend_tests, next_envelope};

backend_tests!(
    the_executing_client_alone_receives_the_host_context,
    a_client_acts_only_in_its_own_name,
    a_call_fails_cleanly_on_timeout_and_on_disconnect,
    tools_survive_a_reconnect_within_the_grace_period,
    an_acp_agent_calls_a_client_tool_over_mcp,
);

async fn start(db: &TestDb, tune: impl FnOnce(&mut ServeConfig)) -> TestServer {
    let mut config = ServeConfig::default();
    tune(&mut config);
    TestServer::start_with(db.open().await, config).await
}

async fn rest(
    server: &TestServer,
    method: reqwest::Method,
    path: &str,
    body: Option<Value>,
) -> (u16, Value) {
    let mut request =
        reqwest::Client::new().request(method, format!("{}{path}", server.base_url()));
    if let Some(body) = body {
        request = request.json(&body);
    }
    let response = request.send().await.expect("request");
    (
        response.status().as_u16(),
        response.json().await.unwrap_or(Value::Null),
    )
}

async fn create(server: &TestServer, id: &str, dir: &std::path::Path) {
    let (status, view) = rest(
        server,
        reqwest::Method::POST,
        "/v1/sessions",
        Some(json!({"id": id, "workingDirectories": [dir]})),
    )
    .await;
    assert_eq!(status, 201, "{view}");
}

/// Starts a turn over REST, as another client (`rest-user`).
async fn turn(server: &TestServer, id: &str, seq: u64, turn_id: &str, text: &str) {
    let body = json!({"clientId": "rest-user", "clientSeq": seq, "channel": format!("ahp-chat:/{id}.main"),
        "action": {"type": "chat/turnStarted", "turnId": turn_id, "startedAt": "2026-12-01T10:00:00.000Z",
                   "message": {"text": text, "origin": {"kind": "user"}}}});
    let (status, answer) = rest(
        server,
        reqwest::Method::POST,
        &format!("/v1/sessions/{id}/actions"),
        Some(body),
    )
    .await;
    assert_eq!(status, 200, "{answer}");
}

async fn transcript(server: &TestServer, id: &str) -> Vec<Value> {
    let (_, page) = rest(
        server,
        reqwest::Method::GET,
        &format!("/v1/sessions/{id}/transcript?after=0&limit=1000"),
        None,
    )
    .await;
    page["envelopes"]
        .as_array()
        .expect("envelopes")
        .iter()
        .map(|e| e["action"].clone())
        .collect()
}

async fn until(
    server: &TestServer,
    id: &str,
    what: &str,
    done: impl Fn(&Value) -> bool,
) -> Vec<Value> {
    for _ in 0..400 {
        let actions = transcript(server, id).await;
        if actions.iter().any(&done) {
            return actions;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    panic!("{what} never came: {:#?}", transcript(server, id).await);
}

/// The next envelope of `kind` on a subscription, as JSON.
async fn next_of(subscription: &mut SessionSubscription, kind: &str) -> Value {
    loop {
        let envelope = next_envelope(subscription).await;
        let value = serde_json::to_value(&envelope.action).unwrap();
        if value["type"] == kind {
            return value;
        }
    }
}

fn register(client_id: &str) -> Value {
    json!({"type": "session/activeClientSet", "activeClient": {"clientId": client_id, "displayName": "Console",
        "tools": [{"name": "lookup", "title": "Look up", "inputSchema": {"type": "object"}}]}})
}

/// A connected console that contributed `lookup` to session `id`, with its
/// chat and session subscriptions.
async fn console(
    server: &TestServer,
    id: &str,
    client_id: &str,
) -> (ahp::Client, SessionSubscription, SessionSubscription) {
    let client = server.initialized(client_id).await;
    let (_, mut session) = client
        .subscribe(format!("ahp-session:/{id}"))
        .await
        .unwrap();
    let (_, chat) = client
        .subscribe(format!("ahp-chat:/{id}.main"))
        .await
        .unwrap();
    client
        .dispatch(format!("ahp-session:/{id}"), action(register(client_id)))
        .await
        .unwrap();
    next_of(&mut session, "session/activeClientSet").await;
    (client, session, chat)
}

fn complete(turn_id: &str, text: &str) -> Value {
    json!({"type": "chat/toolCallComplete", "turnId": turn_id, "toolCallId": format!("{turn_id}.tool"),
           "result": {"success": true, "pastTenseMessage": "Looked up", "content": [{"type": "text", "text": text}]}})
}

fn input_of(ready: &Value) -> Value {
    serde_json::from_str(ready["toolInput"].as_str().expect("toolInput")).expect("JSON arguments")
}

fn answer(actions: &[Value], turn_id: &str) -> String {
    actions
        .iter()
        .filter(|a| a["turnId"] == turn_id && a["type"] == "chat/responsePart")
        .filter_map(|a| a["part"]["content"].as_str())
        .collect()
}

async fn the_executing_client_alone_receives_the_host_context(db: TestDb) {
    let server = start(&db, |_| {}).await;
    let dir = tempfile::tempdir().unwrap();
    create(&server, "tc", dir.path()).await;
    let (executor, mut executor_session, mut executor_chat) =
        console(&server, "tc", "console").await;
    let viewer = server.initialized("viewer").await;
    let (_, mut viewer_chat) = viewer.subscribe("ahp-chat:/tc.main".into()).await.unwrap();
    let (_, mut viewer_session) = viewer.subscribe("ahp-session:/tc".into()).await.unwrap();
    let context =
        json!({"cwd": dir.path().canonicalize().unwrap().display().to_string(), "sessionId": "tc"});

    // Object arguments gain the key, and the host's value wins over the model's.
    let cases = [
        (
            r#"{"q": 1, "__tether": "forged"}"#,
            json!({"q": 1, "__tether": context.clone()}),
            json!({"q": 1, "__tether": "forged"}),
        ),
        ("null", json!({"__tether": context.clone()}), Value::Null),
        ("[1, 2]", json!([1, 2]), json!([1, 2])),
        ("5", json!(5), json!(5)),
    ];
    for (n, (args, executor_sees, others_see)) in cases.into_iter().enumerate() {
        let turn_id = format!("t{n}");
        turn(
            &server,
            "tc",
            n as u64 + 1,
            &turn_id,
            &format!("/tool lookup {args}"),
        )
        .await;
        let ready = next_of(&mut executor_chat, "chat/toolCallReady").await;
        assert_eq!(
            ready["contributor"],
            json!({"kind": "client", "clientId": "console"})
        );
        assert_eq!(ready["confirmed"], "not-needed");
        assert_eq!(
            input_of(&ready),
            executor_sees,
            "{args}: the executor's copy"
        );
        let needed = next_of(&mut executor_session, "session/inputNeededSet").await;
        assert_eq!(needed["request"]["kind"], "toolClientExecution");
        assert_eq!(needed["request"]["clientId"], "console");
        assert_eq!(input_of(&needed["request"]["toolCall"]), executor_sees);
        let seen = next_of(&mut viewer_chat, "chat/toolCallReady").await;
        assert_eq!(
            input_of(&seen),
            others_see,
            "{args}: another subscriber's copy"
        );
        let seen = next_of(&mut viewer_session, "session/inputNeededSet").await;
        assert_eq!(input_of(&seen["request"]["toolCall"]), others_see);

        executor
            .dispatch(
                "ahp-chat:/tc.main".into(),
                action(complete(&turn_id, &format!("result {n}"))),
            )
            .await
            .unwrap();
        let actions = until(&server, "tc", "the echo of the result", |a| {
            a["type"] == "chat/turnComplete" && a["turnId"] == turn_id
        })
        .await;
        assert_eq!(answer(&actions, &turn_id), format!("result {n}"));
        assert!(
            actions
                .iter()
                .any(|a| a["type"] == "session/inputNeededRemoved")
        );
    }
    // Nobody else ever saw the context: not the transcript, not the projection.
    let stored = transcript(&server, "tc").await;
    for a in &stored {
        for input in [a.get("toolInput"), a.pointer("/request/toolCall/toolInput")]
            .into_iter()
            .flatten()
        {
            let input: Value = serde_json::from_str(input.as_str().unwrap()).unwrap();
            assert!(!input.get("__tether").is_some_and(Value::is_object), "{a}");
        }
    }
    assert!(
        !serde_json::to_string(&stored)
            .unwrap()
            .contains("sessionId")
    );
    let (_, view) = rest(&server, reqwest::Method::GET, "/v1/sessions/tc", None).await;
    assert!(!view.to_string().contains("sessionId"), "{view}");
    // A fresh subscriber's snapshot has the model's arguments only.
    let late = server.initialized("late").await;
    let (snapshot, _) = late.subscribe("ahp-chat:/tc.main".into()).await.unwrap();
    let snapshot = serde_json::to_string(&snapshot.snapshot).unwrap();
    assert!(
        snapshot.contains("forged") && !snapshot.contains("sessionId"),
        "{snapshot}"
    );
    server.stop().await;
}

async fn a_client_acts_only_in_its_own_name(db: TestDb) {
    let server = start(&db, |_| {}).await;
    let dir = tempfile::tempdir().unwrap();
    create(&server, "own", dir.path()).await;
    let dispatch = |seq: u64, client: &str, channel: &str, action: Value| json!({"clientId": client, "clientSeq": seq, "channel": channel, "action": action});
    let path = "/v1/sessions/own/actions";
    let (status, problem) = rest(
        &server,
        reqwest::Method::POST,
        path,
        Some(dispatch(
            1,
            "mallory",
            "ahp-session:/own",
            register("console"),
        )),
    )
    .await;
    tether_tests::assert_refused(status, &problem, 422, "own clientId");
    let mut bad = register("mallory");
    bad["activeClient"]["tools"] = json!([{"name": "no spaces allowed"}]);
    let (status, problem) = rest(
        &server,
        reqwest::Method::POST,
        path,
        Some(dispatch(2, "mallory", "ahp-session:/own", bad)),
    )
    .await;
    assert_eq!(status, 422, "{problem}");
    let (status, problem) = rest(
        &server,
        reqwest::Method::POST,
        path,
        Some(dispatch(
            3,
            "mallory",
            "ahp-session:/own",
            json!({"type": "session/activeClientRemoved", "clientId": "console"}),
        )),
    )
    .await;
    assert_eq!(status, 422, "{problem}");

    // Only the contributing client completes its call.
    let (_console, _session, mut chat) = console(&server, "own", "console").await;
    turn(&server, "own", 4, "t1", "/tool lookup {}").await;
    next_of(&mut chat, "chat/toolCallReady").await;
    let (status, problem) = rest(
        &server,
        reqwest::Method::POST,
        path,
        Some(dispatch(
            5,
            "mallory",
            "ahp-chat:/own.main",
            complete("t1", "fake"),
        )),
    )
    .await;
    tether_tests::assert_refused(status, &problem, 422, "only that client");
    let (_, view) = rest(&server, reqwest::Method::GET, "/v1/sessions/own", None).await;
    assert_eq!(
        view["projection"]["openTurnId"], "t1",
        "the call still waits for its client"
    );
    server.stop().await;
}

async fn a_call_fails_cleanly_on_timeout_and_on_disconnect(db: TestDb) {
    let server = start(&db, |c| {
        c.engine.client_tool_timeout = Duration::from_millis(500);
        c.engine.client_grace = Duration::from_millis(200);
    })
    .await;
    let dir = tempfile::tempdir().unwrap();
    create(&server, "late", dir.path()).await;
    let (console_, _session, mut chat) = console(&server, "late", "console").await;
    turn(&server, "late", 1, "t1", "/tool lookup {}").await;
    next_of(&mut chat, "chat/toolCallReady").await;
    let actions = until(&server, "late", "the timeout", |a| {
        a["type"] == "chat/turnComplete" && a["turnId"] == "t1"
    })
    .await;
    let failed = actions
        .iter()
        .find(|a| a["type"] == "chat/toolCallComplete")
        .expect("the failed call");
    assert_eq!(failed["result"]["success"], false);
    assert!(
        answer(&actions, "t1").contains("did not answer the lookup call within 0.5 s"),
        "{actions:?}"
    );

    // The console disconnects mid-call: past the grace period the call
    // fails and the console leaves the session's active clients.
    turn(&server, "late", 2, "t2", "/tool lookup {}").await;
    next_of(&mut chat, "chat/toolCallReady").await;
    drop((console_, chat));
    let actions = until(&server, "late", "the disconnect", |a| {
        a["type"] == "chat/turnComplete" && a["turnId"] == "t2"
    })
    .await;
    assert!(
        answer(&actions, "t2").contains("disconnected before the lookup call finished"),
        "{actions:?}"
    );
    assert!(
        actions
            .iter()
            .any(|a| a["type"] == "session/activeClientRemoved" && a["clientId"] == "console")
    );
    let (_, view) = rest(&server, reqwest::Method::GET, "/v1/sessions/late", None).await;
    assert!(view["projection"]["openTurnId"].is_null(), "{view}");
    server.stop().await;
}

async fn tools_survive_a_reconnect_within_the_grace_period(db: TestDb) {
    let server = start(&db, |c| c.engine.client_grace = Duration::from_millis(1500)).await;
    let dir = tempfile::tempdir().unwrap();
    create(&server, "back", dir.path()).await;
    let (first, session, chat) = console(&server, "back", "console").await;
    drop((first, session, chat));
    tokio::time::sleep(Duration::from_millis(300)).await;
    let again = server.initialized("console").await;
    let (_, mut chat) = again.subscribe("ahp-chat:/back.main".into()).await.unwrap();
    tokio::time::sleep(Duration::from_millis(1800)).await;
    turn(&server, "back", 1, "t1", "/tool lookup {}").await;
    let ready = next_of(&mut chat, "chat/toolCallReady").await;
    assert_eq!(
        input_of(&ready)["__tether"]["sessionId"],
        "back",
        "the reconnected console gets the call"
    );
    assert!(
        !transcript(&server, "back")
            .await
            .iter()
            .any(|a| a["type"] == "session/activeClientRemoved")
    );
    server.stop().await;
}

async fn an_acp_agent_calls_a_client_tool_over_mcp(db: TestDb) {
    let fake = env!("CARGO_BIN_EXE_fake-acp-agent");
    let spec = format!("fake=FAKE_ACP_CAPS=mcp {fake}");
    let server = start(&db, |c| {
        c.agents = vec![tether_server::agents::AgentSpec::acp(
            tether_server::agents::AgentCommand::parse(&spec).unwrap(),
        )];
    })
    .await;
    let dir = tempfile::tempdir().unwrap();
    let (status, view) = rest(
        &server,
        reqwest::Method::POST,
        "/v1/sessions",
        Some(json!({"id": "mc", "provider": "fake", "workingDirectories": [dir.path()]})),
    )
    .await;
    assert_eq!(status, 201, "{view}");
    let (executor, _session, mut chat) = console(&server, "mc", "console").await;
    let viewer = server.initialized("viewer").await;
    let (_, mut viewer_chat) = viewer.subscribe("ahp-chat:/mc.main".into()).await.unwrap();

    turn(&server, "mc", 1, "t1", "mcp-list").await;
    let actions = until(&server, "mc", "the tool list", |a| {
        a["type"] == "chat/turnComplete" && a["turnId"] == "t1"
    })
    .await;
    assert_eq!(
        answer(&actions, "t1"),
        "tools: load_working_context,save_working_context,list_working_contexts,session_context,lookup",
        "the host's tools, then the client's"
    );

    // The agent calls the tool; the console runs it with the host's context.
    turn(
        &server,
        "mc",
        2,
        "t2",
        r#"mcp lookup {"q": 2, "__tether": "from the model"}"#,
    )
    .await;
    let ready = next_of(&mut chat, "chat/toolCallReady").await;
    let context =
        json!({"cwd": dir.path().canonicalize().unwrap().display().to_string(), "sessionId": "mc"});
    assert_eq!(input_of(&ready), json!({"q": 2, "__tether": context}));
    assert_eq!(
        input_of(&next_of(&mut viewer_chat, "chat/toolCallReady").await),
        json!({"q": 2, "__tether": "from the model"})
    );
    let tool_call = ready["toolCallId"].as_str().unwrap().to_owned();
    executor
        .dispatch(
            "ahp-chat:/mc.main".into(),
            action(json!({"type": "chat/toolCallComplete", "turnId": "t2",
            "toolCallId": tool_call, "result": {"success": true, "pastTenseMessage": "Looked up",
            "content": [{"type": "text", "text": "found 2"}]}})),
        )
        .await
        .unwrap();
    let actions = until(&server, "mc", "the agent's answer", |a| {
        a["type"] == "chat/turnComplete" && a["turnId"] == "t2"
    })
    .await;
    assert_eq!(
        answer(&actions, "t2"),
        "found 2",
        "the agent got the client's result, and no context"
    );

    // The list follows the client's tools.
    let mut more = register("console");
    more["activeClient"]["tools"]
        .as_array_mut()
        .unwrap()
        .push(json!({"name": "search"}));
    executor
        .dispatch("ahp-session:/mc".into(), action(more))
        .await
        .unwrap();
    until(&server, "mc", "the new tools", |a| {
        a["type"] == "session/activeClientSet" && a.to_string().contains("search")
    })
    .await;
    turn(&server, "mc", 3, "t3", "mcp-list").await;
    let actions = until(&server, "mc", "the new list", |a| {
        a["type"] == "chat/turnComplete" && a["turnId"] == "t3"
    })
    .await;
    assert!(answer(&actions, "t3").ends_with(",lookup,search"));

    // Only the agent's token opens the endpoint.
    let url = format!("{}/mcp/mc", server.base_url());
    let body = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/list"});
    for auth in [None, Some("Bearer not-the-token")] {
        let mut request = reqwest::Client::new().post(&url).json(&body);
        if let Some(auth) = auth {
            request = request.header("authorization", auth);
        }
        assert_eq!(request.send().await.unwrap().status().as_u16(), 401);
    }
    server.stop().await;
}
