//! AHP 1.0 conformance: what the specification asks of a host, each rule
//! proved over a real socket with a real client — Microsoft's multi-host
//! client and state mirror (`ahp::hosts`), the plain `ahp::Client`, or a raw
//! WebSocket for what a client library would never send. The README's
//! conformance checklist names the test for each line.

use std::time::Duration;

use ahp::hosts::{HostConfig, HostId, HostState, MultiHostClient, ReconnectPolicy};
use ahp::transport::BoxedTransport;
use ahp::{ClientError, MultiHostStateMirror, SubscriptionEvent, TransportError};
use ahp_types::ROOT_RESOURCE_URI;
use ahp_types::actions::{ActionEnvelope, StateAction};
use ahp_types::state::{ChatState, SessionState, SnapshotState};
use serde_json::{Value, json};
use tether_client::Client;
use tether_protocol::rest::{CreateSessionRequest, DispatchRequest};
use tether_protocol::window::{TURN_WINDOW, TURNS_PAGE};
use tether_server::store::NewEnvelope;
use tether_tests::{
    Proxy, RawWs, TestDb, TestServer, action, backend_tests, next_envelope, raw_next, raw_send,
    title_of,
};

backend_tests!(
    the_reference_client_keeps_writing_across_reconnects,
    a_plain_client_numbers_from_one_on_each_connection,
    a_retry_on_another_channel_is_not_the_first_channels_envelope,
    root_subscribers_see_each_summary_change,
    a_dispatch_to_a_missing_channel_is_ignored,
    initialize_leaves_out_initial_subscriptions_that_are_gone,
    optional_commands_answer_method_not_found,
    a_long_chat_keeps_a_bounded_window_and_serves_older_turns,
    sequence_numbers_past_2_63_are_invalid_params_naming_the_range,
);

const WAIT: Duration = Duration::from_secs(20);

async fn create(client: &Client, id: &str, directories: Vec<String>) {
    client
        .create_session(&CreateSessionRequest {
            id: Some(id.into()),
            project: Some("conformance".into()),
            provider: None,
            working_directories: directories,
            title: None,
            config: None,
        })
        .await
        .expect("create the session");
}

async fn rename_over_rest(client: &Client, id: &str, seq: u64, title: &str) -> u64 {
    client
        .dispatch(
            id,
            &DispatchRequest {
                client_id: "rest".into(),
                client_seq: seq,
                channel: None,
                action: json!({"type": "session/titleChanged", "title": title}),
            },
        )
        .await
        .expect("dispatch over REST")
        .server_seq
}

async fn session_state(server: &TestServer, channel: &str) -> SessionState {
    let fresh = server.initialized("auditor").await;
    let snapshot = fresh
        .subscribe(channel.into())
        .await
        .expect("subscribe")
        .0
        .snapshot
        .expect("a snapshot");
    fresh.shutdown().await;
    match snapshot.state {
        SnapshotState::Session(state) => *state,
        other => panic!("not a session state: {other:?}"),
    }
}

async fn generation(multi: &MultiHostClient, id: &HostId) -> (u64, bool) {
    let host = multi.host(id).await.expect("the host is registered");
    (host.generation, matches!(host.state, HostState::Connected))
}

/// Microsoft's multi-host client, through a proxy that cuts its connection
/// twice: it reconnects, replays, and its writes after each reconnect (its
/// `clientSeq` starts from 1 again on every connection) are accepted and
/// applied once; its mirrored state equals a fresh snapshot, and its cached
/// session summary follows `root/sessionSummaryChanged`.
async fn the_reference_client_keeps_writing_across_reconnects(db: TestDb) {
    const SESSION: &str = "ahp-session:/mirrored";
    let server = TestServer::start(&db).await;
    let rest = server.client();
    create(&rest, "mirrored", Vec::new()).await;
    let proxy = Proxy::start(server.addr).await;
    let url = format!("{}/ahp", proxy.base_url().replacen("http", "ws", 1));
    let factory = move |_host: HostId| {
        let url = url.clone();
        async move {
            let transport = ahp_ws::WebSocketTransport::connect(&url)
                .await
                .map_err(|e| TransportError::Io(e.to_string()))?;
            Ok::<_, TransportError>(BoxedTransport::new(transport))
        }
    };
    let config = HostConfig::new("tether", "Tether", factory)
        .with_client_id("console")
        .with_reconnect_policy(ReconnectPolicy::immediate_forever());
    let (multi, handle) = MultiHostClient::single(config).await.expect("connect");
    let id = handle.id.clone();
    let mut events = multi.events();
    let mut mirror = MultiHostStateMirror::new();
    let subscribed = multi
        .subscribe(&id, SESSION.into())
        .await
        .expect("subscribe");
    mirror.apply_snapshot(&id, &subscribed.snapshot.expect("a snapshot"));

    let mut written = Vec::new();
    for round in 0..3_u64 {
        if round > 0 {
            let (before, _) = generation(&multi, &id).await;
            proxy.cut();
            // Something happens while it is away: the replay brings it.
            rename_over_rest(&rest, "mirrored", round, &format!("away {round}")).await;
            tokio::time::timeout(WAIT, async {
                loop {
                    let (now, connected) = generation(&multi, &id).await;
                    if now > before && connected {
                        break;
                    }
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            })
            .await
            .expect("the reference client reconnects");
        }
        for write in 1..=3 {
            let title = format!("round {round} write {write}");
            multi
                .dispatch(
                    &id,
                    SESSION.into(),
                    action(json!({"type": "session/titleChanged", "title": title})),
                )
                .await
                .expect("dispatch");
            written.push(title);
        }
        let last = written.last().cloned().unwrap_or_default();
        tokio::time::timeout(WAIT, async {
            loop {
                let event = events.recv().await.expect("the event stream is open");
                if let SubscriptionEvent::Action(envelope) = &event.event {
                    assert_eq!(
                        envelope.rejection_reason, None,
                        "round {round}: a write of the reference client was refused"
                    );
                    mirror.apply_event(&event);
                    if envelope.channel == SESSION && title_of(envelope) == last {
                        break;
                    }
                }
            }
        })
        .await
        .unwrap_or_else(|_| panic!("round {round}: the echo of {last:?} never came"));
    }

    // Each write is in the transcript once, in order, with its origin.
    let page = rest
        .transcript("mirrored", 0, 1000)
        .await
        .expect("transcript");
    let from_console: Vec<String> = page
        .envelopes
        .iter()
        .filter(|e| e.pointer("/origin/clientId") == Some(&json!("console")))
        .filter_map(|e| e.pointer("/action/title").and_then(Value::as_str))
        .map(str::to_owned)
        .collect();
    assert_eq!(from_console, written, "every write applied exactly once");
    let mirrored = mirror
        .sessions()
        .values()
        .next()
        .cloned()
        .expect("the mirror holds the session");
    assert_eq!(mirrored, session_state(&server, SESSION).await);
    // The last round's rename reached the cached summary only through
    // `root/sessionSummaryChanged` (the runtime lists sessions on connect).
    tokio::time::timeout(WAIT, async {
        loop {
            let host = multi.host(&id).await.expect("host");
            let title = host
                .session_summaries
                .iter()
                .find(|s| s.resource == SESSION)
                .map(|s| s.title.clone());
            if title.as_deref() == written.last().map(String::as_str) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("the reference client's session list follows the rename");
    multi.remove_host(&id).await.ok();
    server.stop().await;
}

/// A plain AHP client numbers `clientSeq` from 1 on every connection; each
/// connection is a scope of its own.
async fn a_plain_client_numbers_from_one_on_each_connection(db: TestDb) {
    let server = TestServer::start(&db).await;
    create(&server.client(), "plain", Vec::new()).await;
    let mut seqs = Vec::new();
    for title in ["first connection", "second connection"] {
        let client = server.initialized("plain-client").await;
        let (_, mut sub) = client.subscribe("ahp-session:/plain".into()).await.unwrap();
        let handle = client
            .dispatch(
                "ahp-session:/plain".into(),
                action(json!({"type": "session/titleChanged", "title": title})),
            )
            .await
            .unwrap();
        assert_eq!(handle.client_seq, 1, "the reference client starts at 1");
        let echo = next_envelope(&mut sub).await;
        assert_eq!(echo.rejection_reason, None, "accepted on a new connection");
        assert_eq!(title_of(&echo), title);
        seqs.push(echo.server_seq);
        client.shutdown().await;
    }
    assert!(
        seqs[1] > seqs[0],
        "a new envelope, not the old one: {seqs:?}"
    );
    assert_eq!(
        session_state(&server, "ahp-session:/plain").await.title,
        "second connection"
    );
    server.stop().await;
}

/// The same `(clientId, clientSeq, action)` on another channel is not a
/// retry: it is refused on its own channel and never answered with the
/// first channel's envelope. Over REST the same.
async fn a_retry_on_another_channel_is_not_the_first_channels_envelope(db: TestDb) {
    let server = TestServer::start(&db).await;
    let rest = server.client();
    create(&rest, "one", Vec::new()).await;
    create(&rest, "two", Vec::new()).await;
    let client = server.initialized_durable("twin").await;
    let (_, mut one) = client.subscribe("ahp-session:/one".into()).await.unwrap();
    let (_, mut two) = client.subscribe("ahp-session:/two".into()).await.unwrap();
    let same = json!({"type": "session/titleChanged", "title": "same"});
    for channel in ["ahp-session:/one", "ahp-session:/two"] {
        client
            .notify(
                "dispatchAction",
                json!({"channel": channel, "clientSeq": 5, "action": same}),
            )
            .await
            .unwrap();
    }
    // The two sessions commit independently: whichever did first holds the
    // number, and the other is refused on its own channel, told nothing of
    // the first.
    let on_one = next_envelope(&mut one).await;
    let on_two = next_envelope(&mut two).await;
    assert_eq!(on_one.channel, "ahp-session:/one");
    assert_eq!(on_two.channel, "ahp-session:/two");
    let (accepted, refused, other) = match (&on_one.rejection_reason, &on_two.rejection_reason) {
        (None, Some(_)) => (&on_one, &on_two, "ahp-session:/one"),
        (Some(_), None) => (&on_two, &on_one, "ahp-session:/two"),
        _ => panic!("exactly one is accepted: {on_one:?} {on_two:?}"),
    };
    assert_eq!(title_of(accepted), "same");
    let why = refused.rejection_reason.clone().unwrap_or_default();
    assert!(why.contains("already used"), "{why}");
    assert!(
        !why.contains("serverSeq") && !why.contains(other),
        "the refusal tells nothing of the other session: {why}"
    );
    assert_eq!(session_state(&server, &refused.channel).await.title, "");

    rename_over_rest(&rest, "one", 9, "over rest").await;
    let err = rest
        .dispatch(
            "two",
            &DispatchRequest {
                client_id: "rest".into(),
                client_seq: 9,
                channel: None,
                action: json!({"type": "session/titleChanged", "title": "over rest"}),
            },
        )
        .await
        .expect_err("not a retry");
    assert!(err.to_string().contains("already used"), "{err}");
    assert_eq!(session_state(&server, "ahp-session:/two").await.title, "");
    server.stop().await;
}

/// Reads root notifications until one `root/sessionSummaryChanged` for
/// `session` satisfies `wanted`; returns its `changes`.
async fn summary_change(
    events: &mut ahp::ClientEventStream,
    session: &str,
    wanted: impl Fn(&Value) -> bool,
) -> Value {
    tokio::time::timeout(WAIT, async {
        loop {
            let event = events.recv().await.expect("events");
            if let SubscriptionEvent::SessionSummaryChanged(changed) = event.event
                && changed.session == session
            {
                let changes = serde_json::to_value(&changed.changes).expect("changes");
                for identity in ["resource", "provider", "createdAt"] {
                    assert!(
                        changes.get(identity).is_none(),
                        "identity field {identity} carried: {changes}"
                    );
                }
                if wanted(&changes) {
                    return changes;
                }
            }
        }
    })
    .await
    .expect("the summary change arrives")
}

fn status_of(changes: &Value) -> Option<u32> {
    changes
        .get("status")
        .and_then(Value::as_u64)
        .and_then(|s| u32::try_from(s).ok())
}

/// A root subscriber hears `root/sessionSummaryChanged` for a rename, a
/// turn starting and ending, and a working-directory change, each with the
/// changed fields only.
async fn root_subscribers_see_each_summary_change(db: TestDb) {
    let server = TestServer::start(&db).await;
    let rest = server.client();
    let dirs = tempfile::tempdir().expect("tempdir");
    let first = dirs.path().join("a");
    let second = dirs.path().join("b");
    std::fs::create_dir_all(&first).unwrap();
    std::fs::create_dir_all(&second).unwrap();
    let uri = |path: &std::path::Path| format!("file://{}", path.display());
    let watcher = server.ahp().await;
    let mut events = watcher.events();
    watcher
        .initialize(
            "watcher".into(),
            vec![ahp_types::PROTOCOL_VERSION.into()],
            vec![ROOT_RESOURCE_URI.into()],
        )
        .await
        .unwrap();
    create(&rest, "listed", vec![uri(&first)]).await;
    const SESSION: &str = "ahp-session:/listed";

    rename_over_rest(&rest, "listed", 1, "renamed").await;
    let renamed = summary_change(&mut events, SESSION, |c| c.get("title").is_some()).await;
    assert_eq!(renamed["title"], "renamed");
    assert!(
        renamed.get("workingDirectories").is_none() && renamed.get("status").is_none(),
        "only what changed: {renamed}"
    );

    let operator = server.initialized("operator").await;
    let view = rest.session("listed").await.unwrap();
    let chat = view.default_chat.expect("a default chat");
    operator
        .dispatch(
            chat.clone(),
            action(json!({
                "type": "chat/turnStarted", "turnId": "t1", "startedAt": "2026-12-01T10:00:00.000Z",
                "message": {"text": "hello", "origin": {"kind": "user"}},
            })),
        )
        .await
        .unwrap();
    let started = summary_change(&mut events, SESSION, |c| {
        status_of(c).is_some_and(|s| s & 8 == 8)
    })
    .await;
    assert!(started.get("title").is_none(), "{started}");
    // The echo agent answers and completes the turn.
    let ended = summary_change(&mut events, SESSION, |c| {
        status_of(c).is_some_and(|s| s & 8 == 0)
    })
    .await;
    assert_eq!(status_of(&ended).map(|s| s & 1), Some(1), "idle again");

    operator
        .dispatch(
            SESSION.into(),
            action(json!({"type": "session/workingDirectorySet", "directory": uri(&second)})),
        )
        .await
        .unwrap();
    let moved = summary_change(&mut events, SESSION, |c| {
        c.get("workingDirectories").is_some()
    })
    .await;
    let dirs: Vec<String> = serde_json::from_value(moved["workingDirectories"].clone()).unwrap();
    assert_eq!(dirs.len(), 2, "{moved}");
    assert!(moved.get("title").is_none(), "{moved}");
    server.stop().await;
}

/// A raw WebSocket, initialized.
async fn raw(server: &TestServer) -> RawWs {
    let mut ws = tether_tests::raw(server).await;
    send(
        &mut ws,
        json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "channel": ROOT_RESOURCE_URI, "clientId": "raw", "protocolVersions": ["1.0.0"]}}),
    )
    .await;
    let answer = next_json(&mut ws).await;
    assert!(answer.get("result").is_some(), "{answer}");
    ws
}

async fn send(ws: &mut RawWs, value: Value) {
    raw_send(ws, &value.to_string()).await;
}

async fn next_json(ws: &mut RawWs) -> Value {
    raw_next(ws).await.expect("a JSON message, not a close")
}

/// AHP: a dispatch to a channel that does not exist is ignored silently,
/// with no echo; sent as a request it gets an error. REST answers 404.
async fn a_dispatch_to_a_missing_channel_is_ignored(db: TestDb) {
    let server = TestServer::start(&db).await;
    let mut ws = raw(&server).await;
    let before = server.client().sessions(&Default::default()).await.unwrap();
    for channel in [
        "ahp-session:/nowhere",
        "ahp-chat:/nowhere",
        "not a uri",
        "ahp-session:/bad id!",
    ] {
        send(
            &mut ws,
            json!({"jsonrpc": "2.0", "method": "dispatchAction", "params": {
                "channel": channel, "clientSeq": 1,
                "action": {"type": "session/titleChanged", "title": "x"}}}),
        )
        .await;
    }
    send(
        &mut ws,
        json!({"jsonrpc": "2.0", "id": 2, "method": "dispatchAction", "params": {
            "channel": "ahp-session:/nowhere", "clientSeq": 2,
            "action": {"type": "session/titleChanged", "title": "x"}}}),
    )
    .await;
    send(
        &mut ws,
        json!({"jsonrpc": "2.0", "id": 3, "method": "ping", "params": {"channel": ROOT_RESOURCE_URI}}),
    )
    .await;
    // Nothing came back for the notifications: the next two frames are the
    // request's error and the ping's answer (in either order: a dispatch is
    // answered when its outcome is known).
    let mut answers = [next_json(&mut ws).await, next_json(&mut ws).await];
    answers.sort_by_key(|a| a["id"].as_u64());
    let [error, pong] = answers;
    assert_eq!(error["id"], 2, "no echo: {error}");
    assert_eq!(
        error["error"]["code"],
        ahp_types::errors::ahp_error_codes::NOT_FOUND
    );
    assert_eq!(pong, json!({"jsonrpc": "2.0", "id": 3, "result": null}));
    let after = server.client().sessions(&Default::default()).await.unwrap();
    assert_eq!(before.items.len(), after.items.len());
    server.stop().await;
}

/// `initialize` succeeds when an initial subscription no longer exists;
/// that channel is just absent from the snapshots.
async fn initialize_leaves_out_initial_subscriptions_that_are_gone(db: TestDb) {
    let server = TestServer::start(&db).await;
    let client = server.ahp().await;
    let result = client
        .initialize(
            "returning".into(),
            vec![ahp_types::PROTOCOL_VERSION.into()],
            vec![
                ROOT_RESOURCE_URI.into(),
                "ahp-session:/gone".into(),
                "ahp-chat:/gone".into(),
            ],
        )
        .await
        .expect("initialize succeeds");
    let resources: Vec<&str> = result
        .snapshots
        .iter()
        .map(|s| s.resource.as_str())
        .collect();
    assert_eq!(resources, [ROOT_RESOURCE_URI]);
    server.stop().await;
}

/// Every optional AHP 1.0 command Tether does not offer answers JSON-RPC
/// -32601, and the connection keeps working.
async fn optional_commands_answer_method_not_found(db: TestDb) {
    let server = TestServer::start(&db).await;
    let client = server.initialized("curious").await;
    for method in [
        "resourceRead",
        "resourceList",
        "createResourceWatch",
        "authenticate",
        "moveChat",
        "disposeChat",
        "runAutomation",
    ] {
        let err = client
            .request::<_, Value>(method, json!({"channel": ROOT_RESOURCE_URI}))
            .await
            .expect_err(method);
        match err {
            ClientError::Rpc(rpc) => {
                assert_eq!(rpc.code, -32601, "{method}: {rpc:?}");
                assert!(rpc.message.contains("does not offer"), "{}", rpc.message);
            }
            other => panic!("{method}: {other:?}"),
        }
    }
    client.ping().await.expect("still serving");
    server.stop().await;
}

/// How many turns the long-chat test writes before the server loads them.
const LONG_CHAT: usize = 10_000;

/// Writes `count` completed turns into a chat's transcript directly, as a
/// long-lived session's history (the fold, the window and the archive are
/// the server's to derive when it loads the session).
async fn seed_turns(db: &TestDb, session: &str, chat: &str, count: usize) {
    let store = db.open().await;
    let turns: Vec<NewEnvelope> = (0..count)
        .flat_map(|i| {
            let at = |action: Value| NewEnvelope {
                channel: chat.to_owned(),
                session_id: Some(session.to_owned()),
                action: action.to_string(),
                origin: None,
                session: None,
                chats: Vec::new(),
                turns: Vec::new(),
                directed: None,
                owner: None,
                search: Vec::new(),
                usage: None,
                events: Vec::new(),
            };
            [
                at(
                    json!({"type": "chat/turnStarted", "turnId": format!("t{i}"),
                    "startedAt": "2026-12-01T10:00:00.000Z",
                    "message": {"text": format!("question {i}"), "origin": {"kind": "user"}}}),
                ),
                at(json!({"type": "chat/turnComplete", "turnId": format!("t{i}"), "duration": 1})),
            ]
        })
        .collect();
    for batch in turns.chunks(2_000) {
        store.append(batch.to_vec()).await.expect("seed turns");
    }
    store.close().await;
}

async fn next_chat_envelope(sub: &mut ahp::SessionSubscription) -> ActionEnvelope {
    next_envelope(sub).await
}

async fn fetch_turns(
    client: &ahp::Client,
    chat: &str,
    cursor: Option<&str>,
) -> Result<Value, ClientError> {
    client
        .request("fetchTurns", json!({"channel": chat, "cursor": cursor}))
        .await
}

fn turn_ids(state: &ChatState) -> Vec<String> {
    state.turns.iter().map(|t| t.id.clone()).collect()
}

/// A 10,000-turn chat: its snapshot holds the bounded window and a cursor;
/// `fetchTurns` pages through every older turn exactly once (each page
/// committed as `chat/turnsLoaded` and delivered before the answer); an
/// action on a turn outside the window loads it first. The archive is
/// derived on load from a history written before the server saw it, and
/// kept by live turns.
async fn a_long_chat_keeps_a_bounded_window_and_serves_older_turns(db: TestDb) {
    const CHAT: &str = "ahp-chat:/long.main";
    let server = TestServer::start(&db).await;
    create(&server.client(), "long", Vec::new()).await;
    server.stop().await;
    seed_turns(&db, "long", CHAT, LONG_CHAT).await;
    let server = TestServer::start(&db).await;
    let client = server.initialized("reader").await;
    let (subscribed, mut sub) = client.subscribe(CHAT.into()).await.unwrap();
    let snapshot = subscribed.snapshot.expect("a snapshot");
    let size = serde_json::to_string(&snapshot).unwrap().len();
    let SnapshotState::Chat(state) = snapshot.state else {
        panic!("a chat state")
    };
    let mut state = *state;
    assert_eq!(
        state.turns.len(),
        TURN_WINDOW,
        "the snapshot holds the window"
    );
    assert_eq!(state.turns.last().map(|t| t.id.as_str()), Some("t9999"));
    assert!(
        state.turns_next_cursor.is_some(),
        "older turns are a cursor away"
    );
    assert!(size < 64 * 1024, "a bounded snapshot: {size} bytes");

    // Live turns keep the window bounded and the archive whole.
    for live in 0..2 {
        client
            .dispatch(
                CHAT.into(),
                action(
                    json!({"type": "chat/turnStarted", "turnId": format!("live{live}"),
                    "startedAt": "2026-12-01T11:00:00.000Z",
                    "message": {"text": "and now?", "origin": {"kind": "user"}}}),
                ),
            )
            .await
            .unwrap();
        loop {
            let envelope = next_chat_envelope(&mut sub).await;
            assert_eq!(envelope.rejection_reason, None);
            ahp::reducers::apply_action_to_chat(&mut state, &envelope.action);
            if matches!(envelope.action, StateAction::ChatTurnComplete(_)) {
                break;
            }
        }
    }

    // A turn id already used, in the window or archived, is refused: turns
    // are numbered by position.
    for reused in ["t9999", "t5"] {
        client
            .dispatch(
                CHAT.into(),
                action(json!({"type": "chat/turnStarted", "turnId": reused,
                    "startedAt": "2026-12-01T11:30:00.000Z",
                    "message": {"text": "again?", "origin": {"kind": "user"}}})),
            )
            .await
            .unwrap();
        let refused = next_chat_envelope(&mut sub).await;
        let why = refused.rejection_reason.unwrap_or_default();
        assert!(why.contains("already used"), "{reused}: {why:?}");
    }

    // Bad cursors are refused; nothing is loaded.
    for bad in ["nonsense", "7.100", "0.x"] {
        match fetch_turns(&client, CHAT, Some(bad)).await {
            Err(ClientError::Rpc(rpc)) => assert_eq!(rpc.code, -32602, "{bad}: {rpc:?}"),
            other => panic!("{bad}: {other:?}"),
        }
    }
    match fetch_turns(&client, "ahp-chat:/nowhere", None).await {
        Err(ClientError::Rpc(rpc)) => {
            assert_eq!(rpc.code, ahp_types::errors::ahp_error_codes::NOT_FOUND)
        }
        other => panic!("{other:?}"),
    }

    // Page back to the first turn; the real reducer folds each page in.
    let mut pages = 0;
    while let Some(cursor) = state.turns_next_cursor.clone() {
        let result = fetch_turns(&client, CHAT, Some(&cursor))
            .await
            .expect("fetchTurns");
        assert_eq!(result, json!({}));
        let loaded = next_chat_envelope(&mut sub).await;
        assert!(
            matches!(loaded.action, StateAction::ChatTurnsLoaded(_)),
            "the page arrives before the answer is used: {:?}",
            loaded.action
        );
        assert!(loaded.origin.is_none(), "host-originated");
        ahp::reducers::apply_action_to_chat(&mut state, &loaded.action);
        pages += 1;
        assert!(pages <= LONG_CHAT, "paging does not end");
    }
    let mut expected: Vec<String> = (0..LONG_CHAT).map(|i| format!("t{i}")).collect();
    expected.extend(["live0".to_owned(), "live1".to_owned()]);
    assert_eq!(
        turn_ids(&state),
        expected,
        "every turn exactly once, in order"
    );
    // Pages of TURNS_PAGE (the first one reaching up to the window, which
    // the live turns moved).
    assert!(
        pages >= (LONG_CHAT - TURN_WINDOW) / TURNS_PAGE as usize,
        "{pages} pages"
    );
    assert_eq!(fetch_turns(&client, CHAT, None).await.unwrap(), json!({}));

    // One more live turn trims the host back to its window; then a
    // truncation to a turn far outside it loads that turn first.
    client
        .dispatch(
            CHAT.into(),
            action(json!({"type": "chat/turnStarted", "turnId": "live2",
                "startedAt": "2026-12-01T12:00:00.000Z",
                "message": {"text": "last one", "origin": {"kind": "user"}}})),
        )
        .await
        .unwrap();
    loop {
        let envelope = next_chat_envelope(&mut sub).await;
        ahp::reducers::apply_action_to_chat(&mut state, &envelope.action);
        if matches!(envelope.action, StateAction::ChatTurnComplete(_)) {
            break;
        }
    }
    client
        .dispatch(
            CHAT.into(),
            action(json!({"type": "chat/truncated", "turnId": "t9000"})),
        )
        .await
        .unwrap();
    let loaded = next_chat_envelope(&mut sub).await;
    assert!(
        matches!(&loaded.action, StateAction::ChatTurnsLoaded(a) if a.turns.first().map(|t| t.id.as_str()) == Some("t9000")),
        "the old turn is loaded first: {:?}",
        loaded.action
    );
    ahp::reducers::apply_action_to_chat(&mut state, &loaded.action);
    let truncated = next_chat_envelope(&mut sub).await;
    assert_eq!(truncated.rejection_reason, None);
    assert!(matches!(truncated.action, StateAction::ChatTruncated(_)));
    ahp::reducers::apply_action_to_chat(&mut state, &truncated.action);
    assert_eq!(turn_ids(&state), expected[..=9000].to_vec());
    let fresh = server.initialized("late").await;
    let SnapshotState::Chat(host) = fresh
        .subscribe(CHAT.into())
        .await
        .unwrap()
        .0
        .snapshot
        .unwrap()
        .state
    else {
        panic!("a chat state")
    };
    assert_eq!(turn_ids(&host).last().map(String::as_str), Some("t9000"));
    assert!(host.turns.len() <= TURN_WINDOW);
    assert!(host.turns_next_cursor.is_some());
    server.stop().await;
}

/// AHP integers are signed 64-bit: a `clientSeq` or `lastSeenServerSeq`
/// above 2^63-1 is a JSON-RPC -32602 that names the field and its range,
/// never a server error, and the connection keeps working.
async fn sequence_numbers_past_2_63_are_invalid_params_naming_the_range(db: TestDb) {
    let server = TestServer::start(&db).await;
    create(&server.client(), "big", Vec::new()).await;
    let mut ws = raw(&server).await;
    let too_big = json!(9_223_372_036_854_775_808_u64);
    send(
        &mut ws,
        json!({"jsonrpc": "2.0", "id": 2, "method": "dispatchAction", "params": {
            "channel": "ahp-session:/big", "clientSeq": too_big,
            "action": {"type": "session/titleChanged", "title": "x"}}}),
    )
    .await;
    let answer = next_json(&mut ws).await;
    assert_eq!(answer["error"]["code"], -32602, "{answer}");
    let message = answer["error"]["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("clientSeq") && message.contains("9223372036854775807"),
        "{message}"
    );
    send(
        &mut ws,
        json!({"jsonrpc": "2.0", "id": 3, "method": "reconnect", "params": {
            "channel": ROOT_RESOURCE_URI, "clientId": "raw", "lastSeenServerSeq": too_big,
            "subscriptions": []}}),
    )
    .await;
    let answer = next_json(&mut ws).await;
    assert_eq!(answer["error"]["code"], -32602, "{answer}");
    send(
        &mut ws,
        json!({"jsonrpc": "2.0", "id": 4, "method": "ping", "params": {"channel": ROOT_RESOURCE_URI}}),
    )
    .await;
    assert_eq!(next_json(&mut ws).await["id"], 4, "still serving");
    assert_eq!(session_state(&server, "ahp-session:/big").await.title, "");
    server.stop().await;
}

/// A retry that reaches the session while its original waits in the same
/// batch, not yet committed, gets the original's outcome: one envelope,
/// both answered with it. (Validated on its own, it was refused, the turn
/// id now taken, and that refusal, recorded first, became the original's
/// outcome too: the turn was lost.) The engine is driven in process on one
/// thread, so both dispatches are queued before the session's actor runs.
#[tokio::test(flavor = "current_thread")]
async fn a_retry_in_its_originals_batch_gets_the_originals_outcome() {
    use tether_server::auth::Principal;
    use tether_server::engine::{CreateSession, DispatchOutcome};
    use tether_server::store::Origin;
    for backend in [
        tether_tests::Backend::Sqlite,
        tether_tests::Backend::Postgres,
    ] {
        let Some(db) = TestDb::new(backend).await else {
            continue;
        };
        let store = db.open().await;
        let state = tether_server::AppState::new(store.clone(), Default::default())
            .await
            .expect("the engine starts");
        let engine = &state.engine;
        let admin = Principal::loopback_admin();
        engine
            .create_session(
                &admin,
                CreateSession {
                    id: "twins".into(),
                    project: "default".into(),
                    provider: None,
                    working_directories: Vec::new(),
                    title: None,
                    config: None,
                    active_client: None,
                },
            )
            .await
            .expect("created");
        let origin = Origin {
            client_id: "twin-client".into(),
            client_seq: 7,
            scope: String::new(),
        };
        let turn = json!({"type": "chat/turnStarted", "turnId": "t1",
            "startedAt": "2026-12-07T10:00:00.000Z",
            "message": {"text": "once", "origin": {"kind": "user"}}});
        let chat = "ahp-chat:/twins.main";
        let original = engine
            .submit(&admin, Some(origin.clone()), chat, turn.clone())
            .await;
        let retry = engine
            .submit(&admin, Some(origin.clone()), chat, turn.clone())
            .await;
        // A different action under the same origin, in the same batch.
        let mut other = turn.clone();
        other["turnId"] = json!("t2");
        let reused = engine.submit(&admin, Some(origin), chat, other).await;
        let seq = |outcome: DispatchOutcome| match outcome {
            DispatchOutcome::Accepted(published) => published.seq,
            DispatchOutcome::Rejected(refusal) => panic!("{backend:?}: refused: {refusal:?}"),
        };
        let first = seq(original.outcome().await);
        assert_eq!(seq(retry.outcome().await), first, "{backend:?}");
        match reused.outcome().await {
            DispatchOutcome::Rejected(refusal) => {
                assert!(refusal.reason.contains("already used"), "{refusal:?}")
            }
            DispatchOutcome::Accepted(p) => {
                panic!("{backend:?}: a reused clientSeq took {}", p.seq)
            }
        }
        let transcript = store.transcript("twins", 0, 100).await.unwrap();
        let started = transcript
            .iter()
            .filter(|e| e.action.contains("chat/turnStarted"))
            .count();
        assert_eq!(started, 1, "{backend:?}: {transcript:?}");
    }
}
