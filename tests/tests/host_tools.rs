//! The host's own MCP tools, through the real binary on both backends: the
//! scripted agent saves a working context in one session and loads it
//! from another session of the same project with seed 000's rules (the
//! same answers REST gives), never sees another project's, and reads its
//! session's projection; an agent that takes only stdio MCP servers is
//! told to run `tether mcp-stdio`, confined, and reaches the host's tools
//! and a client's tool through it.

use serde_json::{Value, json};
use tether_tests::ahp_raw::Ahp;
use tether_tests::{ServerProcess, TestDb, backend_tests};

backend_tests!(
    agents_keep_working_context_through_the_hosts_tools_within_their_project,
    an_agent_that_takes_only_stdio_reaches_the_host_and_client_tools,
);

const FAKE: &str = env!("CARGO_BIN_EXE_fake-acp-agent");
const HOST_TOOLS: &str =
    "load_working_context,save_working_context,list_working_contexts,session_context";

/// Creates session `id` of `project` over REST, then subscribes `ahp` to
/// its default chat.
async fn create(ahp: &mut Ahp, base: &str, id: &str, project: &str, dir: &std::path::Path) {
    let response = reqwest::Client::new()
        .post(format!("{base}/v1/sessions"))
        .json(&json!({"id": id, "project": project, "provider": "fake",
                      "workingDirectories": [dir]}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status().as_u16(), 201, "{id}");
    ahp.call(
        "subscribe",
        json!({"channel": format!("ahp-chat:/{id}.main")}),
    )
    .await
    .unwrap();
}

/// Has the agent of session `id` call host tool `name` with `args`; the
/// structured result the agent got (or its error text, as a string).
async fn call(ahp: &mut Ahp, id: &str, turn: &str, name: &str, args: Value) -> Value {
    let said = ahp
        .ask(
            &format!("ahp-chat:/{id}.main"),
            turn,
            &format!("mcp {name} {args}"),
            None,
        )
        .await;
    serde_json::from_str(&said).unwrap_or(Value::String(said))
}

async fn agents_keep_working_context_through_the_hosts_tools_within_their_project(db: TestDb) {
    let spec = format!("fake=FAKE_ACP_CAPS=mcp {FAKE}");
    let server = ServerProcess::start(&db, &["--agent", &spec]).await;
    let base = server.base_url();
    let dirs: Vec<_> = (0..3).map(|_| tempfile::tempdir().unwrap()).collect();
    let mut ahp = Ahp::connect(&server.ws_url(), "host-tools").await;
    create(&mut ahp, &base, "w1", "alpha", dirs[0].path()).await;
    create(&mut ahp, &base, "w2", "alpha", dirs[1].path()).await;
    create(&mut ahp, &base, "w3", "beta", dirs[2].path()).await;

    let listed = ahp.ask("ahp-chat:/w1.main", "t1", "mcp-list", None).await;
    assert_eq!(listed, format!("tools: {HOST_TOOLS}"));

    // Saved in w1 (its own name by default), in its project.
    let context = json!({"goal": "Ship the login fix", "pendingActions": ["Run the e2e suite"]});
    let saved = call(
        &mut ahp,
        "w1",
        "t2",
        "save_working_context",
        json!({"context": context}),
    )
    .await;
    assert_eq!(saved["project"], "alpha", "{saved}");
    assert_eq!(saved["session"], "w1");
    let refused = call(
        &mut ahp,
        "w1",
        "t3",
        "save_working_context",
        json!({"context": {"goal": "  "}}),
    )
    .await;
    assert!(
        refused
            .as_str()
            .unwrap()
            .starts_with("error: The working context is empty"),
        "{refused}"
    );

    // Loaded from w2: found, and the requested session is never listed.
    let loaded = call(
        &mut ahp,
        "w2",
        "t1",
        "load_working_context",
        json!({"session": "w1"}),
    )
    .await;
    assert_eq!(loaded["found"], true, "{loaded}");
    assert_eq!(loaded["working"]["goal"], "Ship the login fix");
    assert_eq!(loaded["otherSessions"], json!([]));
    call(
        &mut ahp,
        "w2",
        "t2",
        "save_working_context",
        json!({"context": {"goal": "Review it"}}),
    )
    .await;
    // Other sessions are listed on a hit and on a miss, never the one asked.
    let hit = call(
        &mut ahp,
        "w2",
        "t3",
        "load_working_context",
        json!({"session": "w1"}),
    )
    .await;
    assert_eq!(hit["otherSessions"], json!(["w2"]), "{hit}");
    let miss = call(
        &mut ahp,
        "w2",
        "t4",
        "load_working_context",
        json!({"session": "nobody"}),
    )
    .await;
    assert_eq!(miss["found"], false);
    assert_eq!(miss["otherSessions"], json!(["w2", "w1"]), "{miss}");
    // The same answer REST gives for the same lookup.
    let rest: Value = reqwest::get(format!(
        "{base}/v1/projects/alpha/sessions/nobody/working-context"
    ))
    .await
    .unwrap()
    .json()
    .await
    .unwrap();
    assert_eq!(rest, miss);

    // Another project's agent sees none of it, even by name.
    let other = call(
        &mut ahp,
        "w3",
        "t1",
        "load_working_context",
        json!({"session": "w1"}),
    )
    .await;
    assert_eq!(
        other,
        json!({"found": false, "working": null, "otherSessions": []}),
        "{other}"
    );
    let listed = call(&mut ahp, "w3", "t2", "list_working_contexts", json!({})).await;
    assert_eq!(listed, json!({"sessions": []}));
    let listed = call(&mut ahp, "w1", "t4", "list_working_contexts", json!({})).await;
    let names: Vec<&str> = listed["sessions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["session"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["w2", "w1"]);

    // The session's projection, as REST's detail has it.
    let own = call(&mut ahp, "w1", "t5", "session_context", json!({})).await;
    assert_eq!(own["id"], "w1", "{own}");
    assert_eq!(own["project"], "alpha");
    assert!(own["state"].is_string(), "{own}");
    assert_eq!(own["turns"], 5, "the turn asking is counted");
    assert_eq!(own["projection"]["firstTurnText"], "mcp-list");
    let detail: Value = reqwest::get(format!("{base}/v1/sessions/w1"))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(detail["projection"]["firstTurnText"], "mcp-list");
    assert_eq!(detail["turns"], own["turns"]);
    drop(server);
}

async fn an_agent_that_takes_only_stdio_reaches_the_host_and_client_tools(db: TestDb) {
    // No `mcp` capability: the agent is given the stdio bridge, which it
    // runs under its own confinement.
    let spec = format!("fake={FAKE}");
    let server = ServerProcess::start(&db, &["--agent", &spec]).await;
    let base = server.base_url();
    let dir = tempfile::tempdir().unwrap();
    let mut ahp = Ahp::connect(&server.ws_url(), "console").await;
    create(&mut ahp, &base, "st", "alpha", dir.path()).await;
    ahp.call("subscribe", json!({"channel": "ahp-session:/st"}))
        .await
        .unwrap();
    let tools = json!({"type": "session/activeClientSet", "activeClient": {"clientId": "console",
        "displayName": "Console", "tools": [{"name": "lookup", "inputSchema": {"type": "object"}}]}});
    assert_eq!(ahp.dispatch("ahp-session:/st", tools).await, None);

    let listed = ahp.ask("ahp-chat:/st.main", "t1", "mcp-list", None).await;
    assert_eq!(listed, format!("tools: {HOST_TOOLS},lookup"));
    let own = call(&mut ahp, "st", "t2", "session_context", json!({})).await;
    assert_eq!(own["id"], "st", "{own}");

    // A client tool, called through the bridge, runs on the console.
    let rejected = ahp
        .dispatch(
            "ahp-chat:/st.main",
            json!({"type": "chat/turnStarted", "turnId": "t3", "startedAt": "2026-12-02T10:00:00.000Z",
                   "message": {"text": "mcp lookup {\"q\": 7}", "origin": {"kind": "user"}}}),
        )
        .await;
    assert_eq!(rejected, None);
    let ready = ahp
        .action("chat/toolCallReady", |a| a["turnId"] == "t3")
        .await;
    let tool_call = ready["toolCallId"].as_str().unwrap().to_owned();
    let done = json!({"type": "chat/toolCallComplete", "turnId": "t3", "toolCallId": tool_call,
        "result": {"success": true, "pastTenseMessage": "Looked up",
                   "content": [{"type": "text", "text": "found 7"}]}});
    assert_eq!(ahp.dispatch("ahp-chat:/st.main", done).await, None);
    ahp.action("chat/turnComplete", |a| a["turnId"] == "t3")
        .await;
    let said: String = ahp
        .seen
        .iter()
        .map(|m| &m["params"]["action"])
        .filter(|a| a["turnId"] == "t3")
        .filter_map(|a| match a["type"].as_str() {
            Some("chat/delta") => a["content"].as_str(),
            Some("chat/responsePart") => a["part"]["content"].as_str(),
            _ => None,
        })
        .collect();
    assert_eq!(said, "found 7");
    drop(server);
}
