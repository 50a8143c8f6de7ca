//! The AHP WebSocket host, driven by the upstream `ahp` + `ahp-ws` client
//! (and a raw WebSocket for malformed input), on both backends.

use std::time::Duration;

use ahp::{Client, ClientError, SessionSubscription, SubscriptionEvent};
use ahp_types::actions::ActionEnvelope;
use ahp_types::commands::ReconnectResult;
use ahp_types::state::SnapshotState;
use ahp_types::{PROTOCOL_VERSION, ROOT_RESOURCE_URI};
use serde_json::{Value, json};
use tether_server::agents::{AgentSpec, WorkdirCapability};
use tether_server::config::{EffectsConfig, ServeConfig};
use tether_tests::{
    TestDb, TestServer, action, backend_tests, next_envelope, raw, raw_next, raw_send, title_of,
};

backend_tests!(
    a_console_creates_a_session_and_runs_an_echo_turn,
    two_clients_see_one_order_and_rejections_reach_only_the_originator,
    working_directory_rules_follow_the_agent_capabilities,
    reconnect_replays_after_a_disconnect_and_after_a_restart,
    a_retried_dispatch_is_applied_once,
    bad_input_gets_an_error_and_the_connection_keeps_working,
    the_local_side_effect_refuses_missing_directories,
    chats_listing_and_disposal_work_through_ahp_commands,
);

const WAIT: Duration = Duration::from_secs(10);

async fn create_session(
    client: &Client,
    id: &str,
    provider: &str,
    dirs: &[&str],
) -> Result<Value, ClientError> {
    client
        .request(
            "createSession",
            json!({
                "channel": format!("ahp-session:/{id}"),
                "provider": provider,
                "workingDirectories": dirs,
                "_meta": {"tether/project": "proj"},
            }),
        )
        .await
}

/// Dispatches and waits for the originator's echo; returns it.
async fn dispatch_and_echo(
    client: &Client,
    subscription: &mut SessionSubscription,
    channel: &str,
    value: Value,
) -> ActionEnvelope {
    let handle = client
        .dispatch(channel.to_owned(), action(value))
        .await
        .expect("dispatch");
    loop {
        let envelope = next_envelope(subscription).await;
        if envelope
            .origin
            .as_ref()
            .is_some_and(|o| o.client_seq == handle.client_seq)
        {
            return envelope;
        }
    }
}

fn action_type(envelope: &ActionEnvelope) -> String {
    serde_json::to_value(&envelope.action).unwrap()["type"]
        .as_str()
        .unwrap_or_default()
        .to_owned()
}

fn file_uri(path: &std::path::Path) -> String {
    format!("file://{}", path.display())
}

async fn a_console_creates_a_session_and_runs_an_echo_turn(db: TestDb) {
    let server = TestServer::start(&db).await;
    let dir = tempfile::tempdir().unwrap();
    let client = server.ahp().await;
    let init = client
        .initialize(
            "console".into(),
            vec![PROTOCOL_VERSION.into()],
            vec![ROOT_RESOURCE_URI.into()],
        )
        .await
        .unwrap();
    let SnapshotState::Root(root_state) = &init.snapshots[0].state else {
        panic!("root snapshot expected: {:?}", init.snapshots);
    };
    assert!(root_state.agents.iter().any(|a| a.provider == "echo"));
    let mut root = client.attach_subscription(ROOT_RESOURCE_URI).await;

    let uri = file_uri(dir.path());
    create_session(&client, "s1", "echo", &[&uri])
        .await
        .unwrap();
    loop {
        let event = tokio::time::timeout(WAIT, root.recv())
            .await
            .unwrap()
            .unwrap();
        if let SubscriptionEvent::SessionAdded(added) = event {
            assert_eq!(added.summary.resource, "ahp-session:/s1");
            break;
        }
    }
    let (subscribed, mut session) = client.subscribe("ahp-session:/s1".into()).await.unwrap();
    let snapshot = subscribed.snapshot.unwrap();
    let SnapshotState::Session(state) = snapshot.state else {
        panic!("session snapshot")
    };
    assert_eq!(state.working_directories.clone().unwrap().len(), 1);
    let default_chat = state.default_chat.clone().unwrap();
    assert_eq!(default_chat, "ahp-chat:/s1.main");

    let (chat_subscribed, mut chat) = client.subscribe(default_chat.clone()).await.unwrap();
    let SnapshotState::Chat(chat_state) = chat_subscribed.snapshot.unwrap().state else {
        panic!("chat snapshot")
    };
    let mut chat_state = *chat_state;
    let turn = json!({
        "type": "chat/turnStarted", "turnId": "t1", "startedAt": "2026-11-29T10:00:00.000Z",
        "message": {"text": "hello echo", "origin": {"kind": "user"}},
    });
    let started = dispatch_and_echo(&client, &mut chat, &default_chat, turn).await;
    assert_eq!(started.rejection_reason, None);
    let mut seqs = vec![started.server_seq];
    ahp::reducers::apply_action_to_chat(&mut chat_state, &started.action);
    let part = next_envelope(&mut chat).await;
    assert_eq!(action_type(&part), "chat/responsePart");
    assert!(
        part.origin.is_none(),
        "the agent's answer is host-originated"
    );
    assert_eq!(
        serde_json::to_value(&part.action).unwrap()["part"]["content"],
        "hello echo"
    );
    ahp::reducers::apply_action_to_chat(&mut chat_state, &part.action);
    let complete = next_envelope(&mut chat).await;
    assert_eq!(action_type(&complete), "chat/turnComplete");
    ahp::reducers::apply_action_to_chat(&mut chat_state, &complete.action);
    seqs.extend([part.server_seq, complete.server_seq]);
    assert!(seqs.windows(2).all(|w| w[0] < w[1]), "{seqs:?}");
    assert_eq!(chat_state.turns.len(), 1);
    assert!(chat_state.active_turn.is_none());

    // The agent's opening is on the session channel.
    let opened = next_envelope(&mut session).await;
    assert_eq!(action_type(&opened), "x-tether/agentOpened");

    // A fresh subscriber's snapshot equals the state the client folded.
    let (again, _) = server
        .ahp()
        .await
        .subscribe(default_chat.clone())
        .await
        .map_or_else(|_| (None, None), |(r, s)| (r.snapshot, Some(s)));
    assert!(again.is_none(), "subscribing before initialize is refused");
    let fresh = server.initialized("viewer").await;
    let (fresh_snapshot, _) = fresh.subscribe(default_chat).await.unwrap();
    let SnapshotState::Chat(fresh_state) = fresh_snapshot.snapshot.unwrap().state else {
        panic!("chat snapshot")
    };
    assert_eq!(*fresh_state, chat_state);
    server.stop().await;
}

async fn two_clients_see_one_order_and_rejections_reach_only_the_originator(db: TestDb) {
    let server = TestServer::start(&db).await;
    let a = server.initialized("alice").await;
    let b = server.initialized("bob").await;
    create_session(&a, "shared", "echo", &[]).await.unwrap();
    let (_, mut sub_a) = a.subscribe("ahp-session:/shared".into()).await.unwrap();
    let (_, mut sub_b) = b.subscribe("ahp-session:/shared".into()).await.unwrap();
    const EACH: usize = 15;
    let send = |client: Client, who: &'static str| {
        tokio::spawn(async move {
            for i in 0..EACH {
                client
                    .dispatch(
                        "ahp-session:/shared".into(),
                        action(
                            json!({"type": "session/titleChanged", "title": format!("{who}-{i}")}),
                        ),
                    )
                    .await
                    .unwrap();
            }
        })
    };
    let (ta, tb) = (send(a.clone(), "a"), send(b.clone(), "b"));
    ta.await.unwrap();
    tb.await.unwrap();
    let mut seen_a = Vec::new();
    let mut seen_b = Vec::new();
    for _ in 0..2 * EACH {
        let ea = next_envelope(&mut sub_a).await;
        let eb = next_envelope(&mut sub_b).await;
        seen_a.push((ea.server_seq, title_of(&ea)));
        seen_b.push((eb.server_seq, title_of(&eb)));
    }
    assert_eq!(
        seen_a, seen_b,
        "both clients see the same envelopes in the same order"
    );
    assert!(seen_a.windows(2).all(|w| w[0].0 < w[1].0));
    for who in ["a", "b"] {
        let mine: Vec<_> = seen_a
            .iter()
            .filter(|(_, t)| t.starts_with(who))
            .map(|(_, t)| t.clone())
            .collect();
        let expected: Vec<_> = (0..EACH).map(|i| format!("{who}-{i}")).collect();
        assert_eq!(mine, expected, "each client's actions keep their order");
    }

    // A host-originated action from a client is refused, to its sender only.
    let refused = dispatch_and_echo(
        &a,
        &mut sub_a,
        "ahp-session:/shared",
        json!({"type": "session/ready"}),
    )
    .await;
    let reason = refused.rejection_reason.expect("a rejection reason");
    assert!(reason.contains("host-originated"), "{reason}");
    let after = dispatch_and_echo(
        &a,
        &mut sub_a,
        "ahp-session:/shared",
        json!({"type": "session/titleChanged", "title": "after"}),
    )
    .await;
    let next_b = next_envelope(&mut sub_b).await;
    assert_eq!(
        next_b.server_seq, after.server_seq,
        "bob never saw the refused action"
    );
    assert!(next_b.rejection_reason.is_none());
    server.stop().await;
}

fn rules_config() -> ServeConfig {
    let agent = |name: &str, multiple, immutable_primary, primary_replacement| {
        AgentSpec::echo_variant(
            name,
            WorkdirCapability {
                multiple,
                immutable_primary,
                primary_replacement,
            },
        )
    };
    ServeConfig {
        agents: vec![
            agent("solo", false, false, false),
            agent("plain", true, false, false),
            agent("fixed", true, true, false),
            agent("both", true, true, true),
        ],
        // The rules, not the file system, are under test here.
        effects: EffectsConfig::Agent,
        ..ServeConfig::default()
    }
}

async fn dirs_of(client: &Client, session: &str) -> Vec<String> {
    let fresh = client
        .subscribe(format!("ahp-session:/{session}"))
        .await
        .unwrap()
        .0;
    let SnapshotState::Session(state) = fresh.snapshot.unwrap().state else {
        panic!()
    };
    client
        .unsubscribe(format!("ahp-session:/{session}"))
        .await
        .unwrap();
    state.working_directories.unwrap_or_default()
}

async fn working_directory_rules_follow_the_agent_capabilities(db: TestDb) {
    let server = TestServer::start_with(db.open().await, rules_config()).await;
    let client = server.initialized("dirs").await;
    let (a, b, c) = ("file:///w/a", "file:///w/b", "file:///w/c");
    let try_on = |session: &'static str, value: Value| {
        let client = client.clone();
        async move {
            let uri = format!("ahp-session:/{session}");
            let (_, mut sub) = client.subscribe(uri.clone()).await.unwrap();
            let echo = dispatch_and_echo(&client, &mut sub, &uri, value).await;
            client.unsubscribe(uri).await.unwrap();
            echo.rejection_reason
        }
    };
    let replace = |d: &str, r: &str| json!({"type": "session/workingDirectoryReplaced", "directory": d, "replacement": r});
    let remove = |d: &str| json!({"type": "session/workingDirectoryRemoved", "directory": d});
    let set = |d: &str| json!({"type": "session/workingDirectorySet", "directory": d});

    // Reducer dedupe: [A,B,C] B→C is [A,C]; C→A is [A,B]; absent target: no-op.
    create_session(&client, "r1", "echo", &[a, b, c])
        .await
        .unwrap();
    assert_eq!(try_on("r1", replace(b, c)).await, None);
    assert_eq!(dirs_of(&client, "r1").await, vec![a, c]);
    create_session(&client, "r2", "echo", &[a, b, c])
        .await
        .unwrap();
    assert_eq!(try_on("r2", replace(c, a)).await, None);
    assert_eq!(dirs_of(&client, "r2").await, vec![a, b]);
    assert_eq!(
        try_on("r2", replace("file:///w/zzz", c)).await,
        None,
        "absent target: accepted no-op"
    );
    assert_eq!(dirs_of(&client, "r2").await, vec![a, b]);

    // Percent-encoded spelling of an existing entry is that entry.
    create_session(&client, "enc", "echo", &["file:///w/my dir"])
        .await
        .unwrap();
    assert_eq!(try_on("enc", set("file:///w/my%20dir/")).await, None);
    assert_eq!(dirs_of(&client, "enc").await, vec!["file:///w/my%20dir"]);
    assert_eq!(try_on("enc", set("file:///w/x/../b")).await, None);
    assert_eq!(
        dirs_of(&client, "enc").await,
        vec!["file:///w/my%20dir", "file:///w/b"]
    );

    // Non-file and relative URIs are refused.
    let reason = try_on("enc", set("https://example.com/x")).await.unwrap();
    assert!(reason.contains("file: URI"), "{reason}");
    let reason = try_on("enc", set("file:relative/dir")).await.unwrap();
    assert!(reason.contains("absolute"), "{reason}");

    // The primary (index 0) with each capability combination.
    create_session(&client, "p-echo", "echo", &[a, b])
        .await
        .unwrap();
    let reason = try_on("p-echo", remove(a)).await.unwrap();
    assert!(reason.contains("cannot be removed"), "{reason}");
    assert_eq!(
        try_on("p-echo", replace(a, c)).await,
        None,
        "primaryReplacement allows replace"
    );
    assert_eq!(dirs_of(&client, "p-echo").await, vec![c, b]);
    assert_eq!(
        try_on("p-echo", remove(b)).await,
        None,
        "a non-primary entry may go"
    );

    create_session(&client, "p-plain", "plain", &[a, b])
        .await
        .unwrap();
    let reason = try_on("p-plain", replace(a, c)).await.unwrap();
    assert!(reason.contains("does not support replacing"), "{reason}");
    assert!(try_on("p-plain", remove(a)).await.is_some());
    assert_eq!(try_on("p-plain", replace(b, c)).await, None);

    create_session(&client, "p-fixed", "fixed", &[a, b])
        .await
        .unwrap();
    let reason = try_on("p-fixed", replace(a, c)).await.unwrap();
    assert!(reason.contains("immutable"), "{reason}");
    assert!(try_on("p-fixed", remove(a)).await.is_some());
    assert_eq!(dirs_of(&client, "p-fixed").await, vec![a, b]);

    create_session(&client, "p-both", "both", &[a, b])
        .await
        .unwrap();
    assert_eq!(
        try_on("p-both", replace(a, c)).await,
        None,
        "primaryReplacement wins"
    );

    // A single-directory agent refuses every working-directory action.
    create_session(&client, "p-solo", "solo", &[a])
        .await
        .unwrap();
    for value in [set(b), remove(a), replace(a, b)] {
        let reason = try_on("p-solo", value).await.unwrap();
        assert!(reason.contains("single directory"), "{reason}");
    }
    let err = create_session(&client, "p-solo2", "solo", &[a, b])
        .await
        .unwrap_err();
    assert!(matches!(err, ClientError::Rpc(e) if e.code == -32602));
    server.stop().await;
}

async fn reconnect_replays_after_a_disconnect_and_after_a_restart(db: TestDb) {
    let server = TestServer::start(&db).await;
    let first = server.initialized("roamer").await;
    create_session(&first, "rc", "echo", &[]).await.unwrap();
    let (_, mut sub) = first.subscribe("ahp-session:/rc".into()).await.unwrap();
    let mut last_seen = 0;
    for i in 0..5 {
        let echo = dispatch_and_echo(
            &first,
            &mut sub,
            "ahp-session:/rc",
            json!({"type": "session/titleChanged", "title": format!("seen-{i}")}),
        )
        .await;
        last_seen = echo.server_seq;
    }
    first.shutdown().await;

    let other = server.initialized("other").await;
    for i in 0..7 {
        other
            .dispatch(
                "ahp-session:/rc".into(),
                action(json!({"type": "session/titleChanged", "title": format!("missed-{i}")})),
            )
            .await
            .unwrap();
    }
    // Let the dispatches land.
    let (_, mut watch) = other.subscribe("ahp-session:/rc".into()).await.unwrap();
    let _ = watch.recv().await;

    let expect_replay = |result: ReconnectResult| match result {
        ReconnectResult::Replay(replay) => replay,
        other => panic!("expected a replay, got {other:?}"),
    };
    let back = server.ahp().await;
    let replay = expect_replay(
        back.reconnect(
            "roamer".into(),
            last_seen as i64,
            vec!["ahp-session:/rc".into(), "ahp-session:/gone".into()],
        )
        .await
        .unwrap(),
    );
    let titles: Vec<String> = replay.actions.iter().map(title_of).collect();
    assert_eq!(
        titles,
        (0..7).map(|i| format!("missed-{i}")).collect::<Vec<_>>()
    );
    assert!(replay.actions.iter().all(|e| e.server_seq > last_seen));
    assert!(
        replay
            .actions
            .windows(2)
            .all(|w| w[0].server_seq < w[1].server_seq)
    );
    assert_eq!(replay.missing, vec!["ahp-session:/gone".to_owned()]);
    let before_restart = replay.actions.last().unwrap().server_seq;
    back.shutdown().await;
    other.shutdown().await;
    server.stop().await;

    // The same replay comes from the durable transcript after a restart.
    let server = TestServer::start(&db).await;
    let after = server.ahp().await;
    // The upstream client restarts its clientSeq at 1 on every new Client,
    // so a fresh one takes a fresh client id (reusing "roamer" would make its
    // first dispatches look like retries of the old ones).
    let replay = expect_replay(
        after
            .reconnect(
                "roamer-2".into(),
                last_seen as i64,
                vec!["ahp-session:/rc".into()],
            )
            .await
            .unwrap(),
    );
    assert_eq!(
        replay.actions.iter().map(title_of).collect::<Vec<_>>(),
        titles
    );
    assert!(replay.missing.is_empty());
    let mut live = after.attach_subscription("ahp-session:/rc").await;
    let handle = after
        .dispatch(
            "ahp-session:/rc".into(),
            action(json!({"type": "session/titleChanged", "title": "post-restart"})),
        )
        .await
        .unwrap();
    let echo = next_envelope(&mut live).await;
    assert_eq!(echo.origin.unwrap().client_seq, handle.client_seq);
    assert!(
        echo.server_seq > before_restart,
        "seq continues above every seq sent before"
    );
    after.shutdown().await;
    server.stop().await;

    // A gap larger than the replay bound gets snapshots instead.
    let config = ServeConfig {
        ws: tether_server::ws::WsLimits {
            max_replay: 3,
            ..Default::default()
        },
        ..ServeConfig::default()
    };
    let server = TestServer::start_with(db.open().await, config).await;
    let client = server.ahp().await;
    match client
        .reconnect(
            "roamer".into(),
            last_seen as i64,
            vec!["ahp-session:/rc".into()],
        )
        .await
        .unwrap()
    {
        ReconnectResult::Snapshot(snapshots) => {
            assert_eq!(snapshots.snapshots.len(), 1);
            assert_eq!(snapshots.snapshots[0].resource, "ahp-session:/rc");
            let SnapshotState::Session(state) = &snapshots.snapshots[0].state else {
                panic!()
            };
            assert_eq!(state.title, "post-restart");
        }
        other => panic!("expected snapshots, got {other:?}"),
    }
    client.shutdown().await;
    server.stop().await;
}

async fn a_retried_dispatch_is_applied_once(db: TestDb) {
    let server = TestServer::start(&db).await;
    // A client that asks for durable origins (as Tether's SDK does).
    let first = server.initialized_durable("retrier").await;
    create_session(&first, "once", "echo", &[]).await.unwrap();
    let mut sub = first.subscribe("ahp-session:/once".into()).await.unwrap().1;
    let params = |seq: u64, value: Value| json!({"channel": "ahp-session:/once", "clientSeq": seq, "action": value});
    first
        .notify(
            "dispatchAction",
            params(77, json!({"type": "session/titleChanged", "title": "once"})),
        )
        .await
        .unwrap();
    let original = next_envelope(&mut sub).await;
    assert_eq!(title_of(&original), "once");
    first
        .notify(
            "dispatchAction",
            params(78, json!({"type": "session/ready"})),
        )
        .await
        .unwrap();
    let refused = next_envelope(&mut sub).await;
    let reason = refused.rejection_reason.clone().expect("refused");
    first.shutdown().await;

    // Same client id on a new connection retries both.
    let again = server.initialized_durable("retrier").await;
    let mut sub = again.subscribe("ahp-session:/once".into()).await.unwrap().1;
    again
        .notify(
            "dispatchAction",
            params(77, json!({"type": "session/titleChanged", "title": "once"})),
        )
        .await
        .unwrap();
    let echo = next_envelope(&mut sub).await;
    assert_eq!(
        echo.server_seq, original.server_seq,
        "the original envelope is re-sent"
    );
    assert_eq!(title_of(&echo), "once");
    assert!(echo.rejection_reason.is_none());
    // Reusing the number for another action is not a retry: refused, and
    // nothing is applied.
    again
        .notify(
            "dispatchAction",
            params(
                77,
                json!({"type": "session/titleChanged", "title": "twice"}),
            ),
        )
        .await
        .unwrap();
    let reuse = next_envelope(&mut sub).await;
    let why = reuse.rejection_reason.expect("reuse refused");
    assert!(why.contains("already used"), "{why}");
    // A refused origin retried gets the same refusal; its number reused for
    // another action is refused as a reuse, and nothing is applied.
    again
        .notify(
            "dispatchAction",
            params(78, json!({"type": "session/ready"})),
        )
        .await
        .unwrap();
    let echo = next_envelope(&mut sub).await;
    assert_eq!(
        echo.rejection_reason.as_deref(),
        Some(reason.as_str()),
        "the same rejection"
    );
    again
        .notify(
            "dispatchAction",
            params(
                78,
                json!({"type": "session/titleChanged", "title": "valid now"}),
            ),
        )
        .await
        .unwrap();
    let echo = next_envelope(&mut sub).await;
    let why = echo.rejection_reason.expect("reuse refused");
    assert!(why.contains("already used"), "{why}");

    let fresh = server.ahp().await;
    let ReconnectResult::Replay(all) = fresh
        .reconnect("auditor".into(), 0, vec!["ahp-session:/once".into()])
        .await
        .unwrap()
    else {
        panic!("replay expected")
    };
    let applied = all
        .actions
        .iter()
        .filter(|e| e.origin.as_ref().is_some_and(|o| o.client_id == "retrier"))
        .count();
    assert_eq!(applied, 1, "applied exactly once");
    let SnapshotState::Session(state) = again
        .subscribe("ahp-session:/once".into())
        .await
        .unwrap()
        .0
        .snapshot
        .unwrap()
        .state
    else {
        panic!()
    };
    assert_eq!(state.title, "once");
    server.stop().await;
}

async fn bad_input_gets_an_error_and_the_connection_keeps_working(db: TestDb) {
    let config = ServeConfig {
        ws: tether_server::ws::WsLimits {
            max_frame_bytes: 4096,
            ..Default::default()
        },
        ..ServeConfig::default()
    };
    let server = TestServer::start_with(db.open().await, config).await;
    let mut ws = raw(&server).await;
    raw_send(&mut ws, "{not json").await;
    assert_eq!(raw_next(&mut ws).await.unwrap()["error"]["code"], -32700);
    raw_send(
        &mut ws,
        r#"{"jsonrpc":"2.0","id":1,"method":"subscribe","params":{"channel":"ahp-root://"}}"#,
    )
    .await;
    let early = raw_next(&mut ws).await.unwrap();
    assert_eq!(
        early["error"]["code"], -32600,
        "initialize comes first: {early}"
    );
    raw_send(&mut ws, r#"{"jsonrpc":"2.0","id":2,"method":"initialize","params":{"channel":"ahp-root://","protocolVersions":["1.0.0"],"clientId":"raw"}}"#).await;
    let init = raw_next(&mut ws).await.unwrap();
    assert_eq!(init["result"]["protocolVersion"], "1.0.0", "{init}");
    raw_send(
        &mut ws,
        r#"{"jsonrpc":"2.0","id":3,"method":"noSuchMethod","params":{}}"#,
    )
    .await;
    assert_eq!(raw_next(&mut ws).await.unwrap()["error"]["code"], -32601);
    raw_send(&mut ws, r#"{"jsonrpc":"2.0","id":4,"method":"subscribe","params":{"channel":"ahp-session:/missing"}}"#).await;
    assert_eq!(raw_next(&mut ws).await.unwrap()["error"]["code"], -32001);
    raw_send(
        &mut ws,
        r#"{"jsonrpc":"2.0","id":5,"method":"subscribe","params":{"channel":"bogus:/x"}}"#,
    )
    .await;
    let bogus = raw_next(&mut ws).await.unwrap();
    assert_eq!(bogus["error"]["code"], -32602, "{bogus}");
    // An action on the wrong kind of channel is refused to its sender.
    // The echo carries the action as it was sent (its text, spaces and
    // escapes included, is spliced in) and its origin.
    raw_send(&mut ws, r#"{"jsonrpc":"2.0","method":"dispatchAction","params":{"channel":"ahp-root://","clientSeq":1,"action":{ "type": "session/titleChanged", "title": "x\u00e9" }}}"#).await;
    let refused = raw_next(&mut ws).await.unwrap();
    assert_eq!(refused["method"], "action");
    assert_eq!(
        refused["params"]["action"],
        json!({"type": "session/titleChanged", "title": "x\u{e9}"}),
        "{refused}"
    );
    assert_eq!(refused["params"]["origin"]["clientSeq"], 1, "{refused}");
    let reason = refused["params"]["rejectionReason"].as_str().unwrap();
    assert!(reason.contains("session channel"), "{reason}");
    raw_send(
        &mut ws,
        r#"{"jsonrpc":"2.0","id":6,"method":"ping","params":{}}"#,
    )
    .await;
    assert_eq!(raw_next(&mut ws).await.unwrap()["result"], Value::Null);

    // An unsupported protocol version: -32005 with the supported list.
    let mut old = raw(&server).await;
    raw_send(&mut old, r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"channel":"ahp-root://","protocolVersions":["9.0.0"],"clientId":"old"}}"#).await;
    let refused = raw_next(&mut old).await.unwrap();
    assert_eq!(refused["error"]["code"], -32005);
    assert!(
        refused["error"]["data"]["supportedVersions"]
            .as_array()
            .unwrap()
            .contains(&json!("1.0.0"))
    );
    assert!(
        raw_next(&mut old).await.is_err(),
        "the connection closes after -32005"
    );

    // An oversize frame closes that connection with 1009 and a reason ...
    let mut big = raw(&server).await;
    raw_send(&mut big, &format!(r#"{{"pad":"{}"}}"#, "x".repeat(10_000))).await;
    let (code, reason) = raw_next(&mut big).await.unwrap_err();
    assert_eq!(code, 1009, "{reason}");
    assert!(reason.contains("4096"), "{reason}");
    // ... and the other connection keeps working.
    raw_send(
        &mut ws,
        r#"{"jsonrpc":"2.0","id":7,"method":"ping","params":{}}"#,
    )
    .await;
    assert_eq!(raw_next(&mut ws).await.unwrap()["id"], 7);
    server.stop().await;
}

async fn the_local_side_effect_refuses_missing_directories(db: TestDb) {
    let allowed = tempfile::tempdir().unwrap();
    let outside = tempfile::tempdir().unwrap();
    let inside = allowed.path().join("project");
    std::fs::create_dir(&inside).unwrap();
    std::os::unix::fs::symlink(outside.path(), allowed.path().join("sneaky")).unwrap();
    let mut config = ServeConfig::default();
    config.engine.roots = tether_server::effects::Roots::new(&[allowed.path().to_owned()]);
    let server = TestServer::start_with(db.open().await, config).await;
    let client = server.initialized("local").await;
    create_session(&client, "l1", "echo", &[&file_uri(&inside)])
        .await
        .unwrap();
    let err = create_session(
        &client,
        "l2",
        "echo",
        &[&file_uri(&allowed.path().join("nope"))],
    )
    .await
    .unwrap_err();
    assert!(
        matches!(&err, ClientError::Rpc(e) if e.message.contains("does not exist")),
        "{err:?}"
    );
    let (_, mut sub) = client.subscribe("ahp-session:/l1".into()).await.unwrap();
    let set = |path: &std::path::Path| json!({"type": "session/workingDirectorySet", "directory": file_uri(path)});
    let echo = dispatch_and_echo(
        &client,
        &mut sub,
        "ahp-session:/l1",
        set(&allowed.path().join("sneaky")),
    )
    .await;
    let reason = echo
        .rejection_reason
        .expect("a symlink out of the roots is refused");
    assert!(reason.contains("outside the allowed roots"), "{reason}");
    let file = allowed.path().join("file.txt");
    std::fs::write(&file, b"x").unwrap();
    let echo = dispatch_and_echo(&client, &mut sub, "ahp-session:/l1", set(&file)).await;
    assert!(echo.rejection_reason.unwrap().contains("not a directory"));
    let second = allowed.path().join("second");
    std::fs::create_dir(&second).unwrap();
    let echo = dispatch_and_echo(&client, &mut sub, "ahp-session:/l1", set(&second)).await;
    assert_eq!(echo.rejection_reason, None);
    server.stop().await;
}

async fn chats_listing_and_disposal_work_through_ahp_commands(db: TestDb) {
    let server = TestServer::start(&db).await;
    let client = server.ahp().await;
    client
        .initialize(
            "catalogue".into(),
            vec![PROTOCOL_VERSION.into()],
            vec![ROOT_RESOURCE_URI.into()],
        )
        .await
        .unwrap();
    let mut root = client.attach_subscription(ROOT_RESOURCE_URI).await;
    for i in 0..5 {
        create_session(&client, &format!("cat{i}"), "echo", &[])
            .await
            .unwrap();
    }
    let err = create_session(&client, "cat0", "echo", &[])
        .await
        .unwrap_err();
    assert!(
        matches!(&err, ClientError::Rpc(e) if e.code == -32003),
        "{err:?}"
    );
    let err = create_session(&client, "cat9", "no-such-agent", &[])
        .await
        .unwrap_err();
    assert!(
        matches!(&err, ClientError::Rpc(e) if e.code == -32002),
        "{err:?}"
    );

    // listSessions pages newest first, every session once.
    let mut listed = Vec::new();
    let mut cursor: Option<String> = None;
    loop {
        let mut params = json!({"channel": ROOT_RESOURCE_URI, "limit": 2});
        if let Some(c) = &cursor {
            params["cursor"] = json!(c);
        }
        let page: Value = client.request("listSessions", params).await.unwrap();
        for item in page["items"].as_array().unwrap() {
            listed.push(item["resource"].as_str().unwrap().to_owned());
        }
        match page["nextCursor"].as_str() {
            Some(next) => cursor = Some(next.to_owned()),
            None => break,
        }
    }
    let expected: Vec<String> = (0..5)
        .rev()
        .map(|i| format!("ahp-session:/cat{i}"))
        .collect();
    assert_eq!(listed, expected);

    // createChat adds a chat that takes turns like the default one.
    let _: Value = client
        .request(
            "createChat",
            json!({"channel": "ahp-session:/cat1", "chat": "ahp-chat:/side-1"}),
        )
        .await
        .unwrap();
    let err = client
        .request::<_, Value>(
            "createChat",
            json!({"channel": "ahp-session:/cat1", "chat": "ahp-chat:/side-1"}),
        )
        .await
        .unwrap_err();
    assert!(
        matches!(&err, ClientError::Rpc(e) if e.code == -32003),
        "{err:?}"
    );
    let (_, mut side) = client.subscribe("ahp-chat:/side-1".into()).await.unwrap();
    let turn = json!({"type": "chat/turnStarted", "turnId": "s1", "startedAt": "2026-11-29T10:00:00.000Z",
        "message": {"text": "side question", "origin": {"kind": "user"}}});
    let echo = dispatch_and_echo(&client, &mut side, "ahp-chat:/side-1", turn).await;
    assert_eq!(echo.rejection_reason, None);
    let SnapshotState::Session(state) = client
        .subscribe("ahp-session:/cat1".into())
        .await
        .unwrap()
        .0
        .snapshot
        .unwrap()
        .state
    else {
        panic!()
    };
    assert!(state.chats.iter().any(|c| c.resource == "ahp-chat:/side-1"));

    // disposeSession settles it (cat2 never opened an agent, so it cannot be
    // resumed: ended), tells root subscribers, and refuses more work.
    let _: Value = client
        .request("disposeSession", json!({"channel": "ahp-session:/cat2"}))
        .await
        .unwrap();
    // Root subscribers hear of it, and the root state's count of active
    // sessions follows (5 created, 1 gone), in whichever order they come.
    let (mut removed, mut counted) = (false, false);
    while !(removed && counted) {
        let event = tokio::time::timeout(WAIT, root.recv())
            .await
            .unwrap()
            .unwrap();
        match event {
            SubscriptionEvent::SessionRemoved(gone) => {
                assert_eq!(gone.session, "ahp-session:/cat2");
                removed = true;
            }
            SubscriptionEvent::Action(envelope) => {
                if let ahp_types::actions::StateAction::RootActiveSessionsChanged(changed) =
                    &envelope.action
                {
                    counted = changed.active_sessions == 4;
                }
            }
            _ => {}
        }
    }
    let (_, mut session) = client.subscribe("ahp-session:/cat2".into()).await.unwrap();
    let late = dispatch_and_echo(
        &client,
        &mut session,
        "ahp-session:/cat2",
        json!({"type": "session/titleChanged", "title": "too late"}),
    )
    .await;
    assert!(late.rejection_reason.unwrap().contains("has ended"));
    let err = client
        .request::<_, Value>("disposeSession", json!({"channel": "ahp-session:/cat2"}))
        .await
        .unwrap_err();
    assert!(
        matches!(&err, ClientError::Rpc(e) if e.code == -32011),
        "disposing twice: {err:?}"
    );
    let err = client
        .request::<_, Value>("disposeSession", json!({"channel": "ahp-session:/nope"}))
        .await
        .unwrap_err();
    assert!(
        matches!(&err, ClientError::Rpc(e) if e.code == -32001),
        "{err:?}"
    );
    server.stop().await;
}
