//! A third-party ACP agent that no one here wrote, run through the real
//! binary on both backends: the TypeScript example agent shipped in the npm
//! package `@zed-industries/agent-client-protocol@0.4.5` (it streams text,
//! a tool call and its update, asks `session/request_permission`, and
//! answers `session/cancel` with `cancelled`; about 5 s per prompt).
//!
//! `.ci/run` installs it and sets `TETHER_TEST_TS_AGENT_DIR` to the folder
//! holding its `node_modules` (with `tsx`). Without it the tests skip with
//! a message, unless `TETHER_TEST_REQUIRE_TS_AGENT=1`.

use std::path::PathBuf;
use std::time::Duration;

use serde_json::{Value, json};
use tether_tests::{ServerProcess, TestDb, backend_tests};

backend_tests!(the_typescript_example_agent_streams_asks_and_cancels);

fn agent_dir() -> Option<PathBuf> {
    match std::env::var_os("TETHER_TEST_TS_AGENT_DIR") {
        Some(dir) => Some(PathBuf::from(dir)),
        None if std::env::var("TETHER_TEST_REQUIRE_TS_AGENT").as_deref() == Ok("1") => {
            panic!("TETHER_TEST_REQUIRE_TS_AGENT=1 but TETHER_TEST_TS_AGENT_DIR is not set")
        }
        None => {
            eprintln!(
                "SKIPPED: the third-party ACP agent test: set TETHER_TEST_TS_AGENT_DIR to a \
                 folder where `npm install @zed-industries/agent-client-protocol@0.4.5 tsx` ran"
            );
            None
        }
    }
}

async fn get(http: &reqwest::Client, url: String) -> Value {
    http.get(url)
        .send()
        .await
        .expect("GET")
        .json()
        .await
        .expect("JSON")
}

async fn post(http: &reqwest::Client, url: String, body: Value) -> (u16, Value) {
    let response = http.post(url).json(&body).send().await.expect("POST");
    (
        response.status().as_u16(),
        response.json().await.unwrap_or(Value::Null),
    )
}

async fn the_typescript_example_agent_streams_asks_and_cancels(db: TestDb) {
    let Some(dir) = agent_dir() else { return };
    let spec = format!(
        "ts={} {}",
        dir.join("node_modules/.bin/tsx").display(),
        dir.join("node_modules/@zed-industries/agent-client-protocol/typescript/examples/agent.ts")
            .display()
    );
    let mut server = ServerProcess::start(&db, &["--agent", &spec]).await;
    let base = server.base_url();
    let http = reqwest::Client::new();
    let agents = get(&http, format!("{base}/v1/agents")).await;
    let ts = agents["agents"]
        .as_array()
        .unwrap()
        .iter()
        .find(|a| a["provider"] == "ts")
        .cloned();
    assert_eq!(
        ts.expect("listed")["capabilities"]["loadSession"],
        false,
        "{agents}"
    );

    let (status, created) = post(
        &http,
        format!("{base}/v1/sessions"),
        json!({"id": "ts1", "provider": "ts"}),
    )
    .await;
    assert_eq!(status, 201, "{created}");
    let mut seq = 0;
    let mut dispatch = async |action: Value| {
        seq += 1;
        let (status, answer) = post(&http, format!("{base}/v1/sessions/ts1/actions"),
            json!({"clientId": "ts-test", "clientSeq": seq, "channel": "ahp-chat:/ts1.main", "action": action})).await;
        assert_eq!(status, 200, "{answer}");
    };
    let transcript = async || -> Vec<Value> {
        let page = get(
            &reqwest::Client::new(),
            format!("{base}/v1/sessions/ts1/transcript?after=0&limit=1000"),
        )
        .await;
        page["envelopes"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e["action"].clone())
            .collect()
    };
    let until = async |what: &str, done: &dyn Fn(&Value) -> bool| -> Vec<Value> {
        for _ in 0..600 {
            let actions = transcript().await;
            if actions.iter().any(done) {
                return actions;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("{what} never came: {:#?}", transcript().await);
    };
    let turn = |id: &str, text: &str| {
        json!({"type": "chat/turnStarted", "turnId": id,
        "startedAt": "2026-12-01T10:00:00.000Z", "message": {"text": text, "origin": {"kind": "user"}}})
    };

    // A turn: text, a tool call that needs no permission, then one that does.
    dispatch(turn("t1", "Please fix the config")).await;
    let actions = until("the permission request", &|a| {
        a["type"] == "chat/toolCallReady"
            && a["toolCallId"] == "call_2"
            && a.get("confirmed").is_none()
    })
    .await;
    let ready = actions
        .iter()
        .find(|a| a["type"] == "chat/toolCallReady" && a["toolCallId"] == "call_2")
        .unwrap();
    let options: Vec<&str> = ready["options"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| o["id"].as_str().unwrap())
        .collect();
    assert_eq!(options, ["allow", "reject"]);
    let read = actions
        .iter()
        .find(|a| a["type"] == "chat/toolCallComplete" && a["toolCallId"] == "call_1");
    assert_eq!(
        read.expect("the first tool call completed")["result"]["success"],
        true
    );
    dispatch(
        json!({"type": "chat/toolCallConfirmed", "turnId": "t1", "toolCallId": "call_2",
        "approved": true, "selectedOptionId": "allow"}),
    )
    .await;
    let actions = until("t1's end", &|a| {
        a["type"] == "chat/turnComplete" && a["turnId"] == "t1"
    })
    .await;
    assert!(
        actions
            .iter()
            .any(|a| a["type"] == "chat/toolCallComplete" && a["toolCallId"] == "call_2")
    );
    let text: String = actions
        .iter()
        .filter(|a| a["turnId"] == "t1")
        .filter_map(|a| a["part"]["content"].as_str().or(a["content"].as_str()))
        .collect();
    assert!(
        text.contains("successfully updated the configuration"),
        "{text}"
    );

    // A turn cancelled mid-way: the agent answers `cancelled`, and serves on.
    dispatch(turn("t2", "Again, please")).await;
    until("t2 under way", &|a| {
        a["type"] == "chat/responsePart" && a["turnId"] == "t2"
    })
    .await;
    dispatch(json!({"type": "chat/turnCancelled", "turnId": "t2", "duration": 1})).await;
    dispatch(turn("t3", "One more")).await;
    let actions = until("t3 under way", &|a| {
        a["type"] == "chat/responsePart" && a["turnId"] == "t3"
    })
    .await;
    let t2: Vec<&str> = actions
        .iter()
        .filter(|a| a["turnId"] == "t2")
        .map(|a| a["type"].as_str().unwrap())
        .collect();
    assert_eq!(
        t2,
        [
            "chat/turnStarted",
            "chat/responsePart",
            "chat/turnCancelled"
        ],
        "nothing after the cancel"
    );
    let view = get(&reqwest::Client::new(), format!("{base}/v1/sessions/ts1")).await;
    assert_eq!(view["state"], "live");
    server.terminate().await;
}
