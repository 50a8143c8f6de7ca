//! Chats of one session and forks of them, through the real binary on both
//! backends: each chat of an ACP agent's session has the agent's own
//! session (ACP has one conversation per session); `createChat` with a fork
//! source copies the source chat's turns and forks the agent's
//! conversation (`session/fork`), recorded so that a restarted host
//! reopens it; what cannot be forked is refused before anything is
//! committed.

use std::path::Path;

use serde_json::{Value, json};
use tether_tests::ahp_raw::Ahp;
use tether_tests::{ServerProcess, TestDb, backend_tests};

backend_tests!(
    a_forked_chat_carries_the_source_turns_and_the_agents_conversation,
    what_cannot_be_forked_is_refused_and_nothing_is_recorded,
    a_builtin_agents_chat_forks_from_any_completed_turn,
    chats_are_bounded_and_an_ended_session_takes_none,
    one_chat_uri_goes_to_one_session_however_many_ask_at_once,
    a_chat_whose_write_failed_can_be_asked_for_again,
);

const FAKE: &str = env!("CARGO_BIN_EXE_fake-acp-agent");

fn log_lines(log: &Path) -> Vec<String> {
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .lines()
        .map(str::to_owned)
        .collect()
}

/// The agent in the root state's `agents` with `provider`.
async fn agent_info(ahp: &mut Ahp, provider: &str) -> Value {
    let root = ahp
        .call("subscribe", json!({"channel": "ahp-root://"}))
        .await
        .unwrap();
    root["snapshot"]["state"]["agents"]
        .as_array()
        .unwrap()
        .iter()
        .find(|a| a["provider"] == provider)
        .cloned()
        .unwrap_or_else(|| panic!("{provider} is not offered: {root}"))
}

/// A chat's state, as a new subscriber gets it.
async fn chat_state(ahp: &mut Ahp, chat: &str) -> Value {
    let subscribed = ahp
        .call("subscribe", json!({"channel": chat}))
        .await
        .unwrap();
    subscribed["snapshot"]["state"].clone()
}

fn turn_ids(state: &Value) -> Vec<String> {
    state["turns"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["id"].as_str().unwrap().to_owned())
        .collect()
}

/// What the agent's `history` script said: the prompts its session was
/// given before.
fn told(answer: &str) -> &str {
    answer
        .split_once(" was told: ")
        .unwrap_or_else(|| panic!("not a history answer: {answer:?}"))
        .1
}

async fn a_forked_chat_carries_the_source_turns_and_the_agents_conversation(db: TestDb) {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("agent.log");
    let agent = format!(
        "fake=FAKE_ACP_CAPS=fork,load,config FAKE_ACP_LOG={} {FAKE}",
        log.display()
    );
    let mut server =
        ServerProcess::start(&db, &["--agent", &agent, "--agent-confinement", "off"]).await;
    let mut ahp = Ahp::connect(&server.ws_url(), "fork-test").await;
    let info = agent_info(&mut ahp, "fake").await;
    assert_eq!(
        info["capabilities"]["multipleChats"],
        json!({"fork": true}),
        "{info}"
    );
    let listed: Value = reqwest::get(format!("{}/v1/agents", server.base_url()))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let fake = listed["agents"]
        .as_array()
        .unwrap()
        .iter()
        .find(|a| a["provider"] == "fake")
        .cloned()
        .unwrap();
    assert_eq!(fake["capabilities"]["fork"], true, "{fake}");

    ahp.call(
        "createSession",
        json!({"channel": "ahp-session:/fk", "provider": "fake"}),
    )
    .await
    .unwrap();
    let main = "ahp-chat:/fk.main";
    ahp.call("subscribe", json!({"channel": main}))
        .await
        .unwrap();
    ahp.ask(main, "t1", "alpha", None).await;
    ahp.ask(main, "t2", "beta", None).await;

    // The fork: the source's turns, its origin, and the agent's
    // conversation through them.
    let fork = "ahp-chat:/fk-fork";
    ahp.call(
        "createChat",
        json!({"channel": "ahp-session:/fk", "chat": fork,
               "source": {"kind": "fork", "chat": main, "turnId": "t2"}}),
    )
    .await
    .expect("the fork is created");
    let state = chat_state(&mut ahp, fork).await;
    assert_eq!(turn_ids(&state), ["t1", "t2"], "{state}");
    assert_eq!(state["turns"][1]["message"]["text"], "beta", "{state}");
    let session = ahp
        .call("subscribe", json!({"channel": "ahp-session:/fk"}))
        .await
        .unwrap();
    let summary = session["snapshot"]["state"]["chats"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["resource"] == fork)
        .cloned()
        .unwrap_or_else(|| panic!("{fork} is not in the catalogue: {session}"));
    assert_eq!(
        summary["origin"],
        json!({"kind": "fork", "chat": main, "turnId": "t2"})
    );
    assert!(
        log_lines(&log).iter().any(|l| l.starts_with("fork ")),
        "{:?}",
        log_lines(&log)
    );
    let in_fork = ahp.ask(fork, "f1", "history", None).await;
    assert_eq!(told(&in_fork), "alpha | beta", "{in_fork}");
    let fork_session = in_fork.split_once(" was told: ").unwrap().0.to_owned();

    // The source goes on by itself, and a chat created without a source
    // has a conversation of its own.
    let in_main = ahp.ask(main, "t3", "history", None).await;
    assert_eq!(told(&in_main), "alpha | beta", "{in_main}");
    assert_ne!(in_main.split_once(" was told: ").unwrap().0, fork_session);
    // The configuration is the session's: a change reaches every chat's
    // session, and a chat opened later joins it.
    let changed = json!({"type": "session/configChanged", "config": {"thought": "high"}});
    assert_eq!(ahp.dispatch("ahp-session:/fk", changed).await, None);
    let side = "ahp-chat:/fk-side";
    ahp.call(
        "createChat",
        json!({"channel": "ahp-session:/fk", "chat": side}),
    )
    .await
    .unwrap();
    ahp.call("subscribe", json!({"channel": side}))
        .await
        .unwrap();
    let in_side = ahp.ask(side, "s1", "history", None).await;
    assert_eq!(told(&in_side), "nothing", "{in_side}");
    let in_fork = ahp.ask(fork, "f2", "history", None).await;
    assert_eq!(told(&in_fork), "alpha | beta | history", "{in_fork}");
    let changed = json!({"type": "session/configChanged", "config": {"model": "smart"}});
    assert_eq!(ahp.dispatch("ahp-session:/fk", changed).await, None);
    for (chat, turn) in [(main, "t4"), (fork, "f2b"), (side, "s2")] {
        let settings = ahp.ask(chat, turn, "settings", None).await;
        assert!(
            settings.ends_with("model=smart thought=high"),
            "{chat}: {settings}"
        );
    }

    // A restarted host reopens the fork's own session for its next turn.
    drop(ahp);
    server.restart().await;
    let mut ahp = Ahp::connect(&server.ws_url(), "fork-test-2").await;
    ahp.call("subscribe", json!({"channel": fork}))
        .await
        .unwrap();
    let after = ahp.ask(fork, "f3", "history", None).await;
    assert_eq!(
        after.split_once(" was told: ").unwrap().0,
        fork_session,
        "the fork's session is reopened, not a new one: {after}"
    );
    assert!(
        log_lines(&log)
            .iter()
            .any(|l| *l == format!("load {fork_session}")),
        "{:?}",
        log_lines(&log)
    );
    let state = chat_state(&mut ahp, fork).await;
    assert_eq!(
        turn_ids(&state),
        ["t1", "t2", "f1", "f2", "f2b", "f3"],
        "{state}"
    );
}

async fn what_cannot_be_forked_is_refused_and_nothing_is_recorded(db: TestDb) {
    let server = ServerProcess::start(
        &db,
        &[
            "--agent",
            &format!("fake=FAKE_ACP_CAPS=fork {FAKE}"),
            "--agent",
            &format!("plain={FAKE}"),
            "--agent",
            &format!("stubborn=FAKE_ACP_CAPS=fork,refuse-fork {FAKE}"),
        ],
    )
    .await;
    let mut ahp = Ahp::connect(&server.ws_url(), "fork-refusals").await;
    let plain = agent_info(&mut ahp, "plain").await;
    assert_eq!(plain["capabilities"]["multipleChats"], json!({}), "{plain}");
    for (session, provider) in [
        ("ahp-session:/rf", "fake"),
        ("ahp-session:/rp", "plain"),
        ("ahp-session:/rs", "stubborn"),
    ] {
        ahp.call(
            "createSession",
            json!({"channel": session, "provider": provider}),
        )
        .await
        .unwrap();
    }
    ahp.call("subscribe", json!({"channel": "ahp-chat:/rf.main"}))
        .await
        .unwrap();
    ahp.call("subscribe", json!({"channel": "ahp-chat:/rp.main"}))
        .await
        .unwrap();
    ahp.ask("ahp-chat:/rf.main", "r1", "one", None).await;
    ahp.ask("ahp-chat:/rf.main", "r2", "two", None).await;
    ahp.ask("ahp-chat:/rp.main", "p1", "one", None).await;
    ahp.call("subscribe", json!({"channel": "ahp-chat:/rs.main"}))
        .await
        .unwrap();
    ahp.ask("ahp-chat:/rs.main", "s1", "one", None).await;

    let fork = |session: &str, chat: &str, source: Value| json!({"channel": session, "chat": chat, "source": source});
    let refusals = [
        (
            fork(
                "ahp-session:/rf",
                "ahp-chat:/rf-a",
                json!({"kind": "fork", "chat": "ahp-chat:/rf.main", "turnId": "r1"}),
            ),
            "only from its latest turn",
        ),
        (
            fork(
                "ahp-session:/rf",
                "ahp-chat:/rf-b",
                json!({"kind": "fork", "chat": "ahp-chat:/rf.main", "turnId": "nope"}),
            ),
            "not a completed turn",
        ),
        (
            fork(
                "ahp-session:/rf",
                "ahp-chat:/rf-c",
                json!({"kind": "fork", "chat": "ahp-chat:/rp.main", "turnId": "p1"}),
            ),
            "is not a chat of session",
        ),
        (
            fork(
                "ahp-session:/rf",
                "ahp-chat:/rf-d",
                json!({"kind": "sideChat", "chat": "ahp-chat:/rf.main", "turnId": "r2"}),
            ),
            "sideChat",
        ),
        (
            fork(
                "ahp-session:/rf",
                "ahp-chat:/rf-e",
                json!({"kind": "fork", "chat": "ahp-chat:/rf.main"}),
            ),
            "needs chat",
        ),
        (
            fork(
                "ahp-session:/rp",
                "ahp-chat:/rp-a",
                json!({"kind": "fork", "chat": "ahp-chat:/rp.main", "turnId": "p1"}),
            ),
            "cannot fork chats",
        ),
        (
            // The agent's own refusal, in its words, before anything is
            // committed.
            fork(
                "ahp-session:/rs",
                "ahp-chat:/rs-a",
                json!({"kind": "fork", "chat": "ahp-chat:/rs.main", "turnId": "s1"}),
            ),
            "this agent forks nothing today",
        ),
    ];
    for (params, needle) in refusals {
        let refused = ahp
            .call("createChat", params.clone())
            .await
            .expect_err("refused");
        assert!(refused.contains(needle), "{params}: {refused}");
    }
    // None of them made a chat.
    for session in ["ahp-session:/rf", "ahp-session:/rp", "ahp-session:/rs"] {
        let state = ahp
            .call("subscribe", json!({"channel": session}))
            .await
            .unwrap();
        let chats = state["snapshot"]["state"]["chats"]
            .as_array()
            .unwrap()
            .len();
        assert_eq!(chats, 1, "{state}");
    }
    // A refused chat's URI is free: the agent's refusal came after the
    // URI was claimed, and gave it back.
    for chat in ["ahp-chat:/rf-a", "ahp-chat:/rs-a"] {
        ahp.call(
            "createChat",
            json!({"channel": "ahp-session:/rf", "chat": chat}),
        )
        .await
        .unwrap_or_else(|e| panic!("{chat} after its refusal: {e}"));
    }
    // The latest turn forks, and the session keeps serving.
    ahp.call(
        "createChat",
        fork(
            "ahp-session:/rf",
            "ahp-chat:/rf-ok",
            json!({"kind": "fork", "chat": "ahp-chat:/rf.main", "turnId": "r2"}),
        ),
    )
    .await
    .expect("the latest turn forks");
    ahp.call("subscribe", json!({"channel": "ahp-chat:/rf-ok"}))
        .await
        .unwrap();
    let answer = ahp.ask("ahp-chat:/rf-ok", "o1", "still here", None).await;
    assert!(answer.contains("still here"), "{answer}");
}

async fn a_builtin_agents_chat_forks_from_any_completed_turn(db: TestDb) {
    let server = ServerProcess::start(&db, &[]).await;
    let mut ahp = Ahp::connect(&server.ws_url(), "echo-fork").await;
    let echo = agent_info(&mut ahp, "echo").await;
    assert_eq!(
        echo["capabilities"]["multipleChats"],
        json!({"fork": true}),
        "{echo}"
    );
    ahp.call(
        "createSession",
        json!({"channel": "ahp-session:/ef", "provider": "echo"}),
    )
    .await
    .unwrap();
    let main = "ahp-chat:/ef.main";
    ahp.call("subscribe", json!({"channel": main}))
        .await
        .unwrap();
    for (turn, text) in [("e1", "one"), ("e2", "two"), ("e3", "three")] {
        ahp.ask(main, turn, text, None).await;
    }
    ahp.call(
        "createChat",
        json!({"channel": "ahp-session:/ef", "chat": "ahp-chat:/ef-b",
               "source": {"kind": "fork", "chat": main, "turnId": "e2"}}),
    )
    .await
    .expect("an earlier turn forks");
    let state = chat_state(&mut ahp, "ahp-chat:/ef-b").await;
    assert_eq!(turn_ids(&state), ["e1", "e2"], "{state}");
    // The fork goes on by itself; a copied turn's id is taken there.
    let answer = ahp.ask("ahp-chat:/ef-b", "b1", "branch", None).await;
    assert!(answer.contains("branch"), "{answer}");
    let reused = ahp
        .dispatch(
            "ahp-chat:/ef-b",
            json!({"type": "chat/turnStarted", "turnId": "e1",
                   "startedAt": "2026-12-02T10:00:00.000Z",
                   "message": {"text": "again", "origin": {"kind": "user"}}}),
        )
        .await;
    assert!(
        reused.is_some(),
        "a copied turn's id is not new to the fork"
    );
    let source = chat_state(&mut ahp, main).await;
    assert_eq!(turn_ids(&source), ["e1", "e2", "e3"], "{source}");
}

/// A session holds at most 256 chats (its default one included), and one
/// that has ended takes no new chat: each is refused with why, and nothing
/// is recorded.
async fn chats_are_bounded_and_an_ended_session_takes_none(db: TestDb) {
    let server = ServerProcess::start(&db, &[]).await;
    let mut ahp = Ahp::connect(&server.ws_url(), "chatty").await;
    ahp.call("createSession", json!({"channel": "ahp-session:/many"}))
        .await
        .unwrap();
    for i in 1..256 {
        ahp.call(
            "createChat",
            json!({"channel": "ahp-session:/many", "chat": format!("ahp-chat:/many-{i}")}),
        )
        .await
        .unwrap_or_else(|e| panic!("chat {i}: {e}"));
    }
    let refused = ahp
        .call(
            "createChat",
            json!({"channel": "ahp-session:/many", "chat": "ahp-chat:/many-256"}),
        )
        .await
        .unwrap_err();
    assert!(
        refused.contains("the most one session may have"),
        "{refused}"
    );
    let state = ahp
        .call("subscribe", json!({"channel": "ahp-session:/many"}))
        .await
        .unwrap();
    assert_eq!(
        state["snapshot"]["state"]["chats"].as_array().map(Vec::len),
        Some(256),
        "nothing recorded for the refused chat"
    );

    ahp.call("createSession", json!({"channel": "ahp-session:/done"}))
        .await
        .unwrap();
    let ended = reqwest::Client::new()
        .delete(format!("{}/v1/sessions/done", server.base_url()))
        .send()
        .await
        .unwrap();
    assert_eq!(ended.status(), 200);
    let refused = ahp
        .call(
            "createChat",
            json!({"channel": "ahp-session:/done", "chat": "ahp-chat:/done-late"}),
        )
        .await
        .unwrap_err();
    assert!(refused.contains("has ended"), "{refused}");
}

/// Sessions asking for one chat URI at the same moment: all pass the
/// engine's "does it exist" read, so the claim in the store decides. Before
/// it, several were told yes and the losers' turns went to the winner's
/// chat.
async fn one_chat_uri_goes_to_one_session_however_many_ask_at_once(db: TestDb) {
    const ASKERS: usize = 8;
    const CHATS: usize = 12;
    let server = ServerProcess::start(&db, &[]).await;
    let mut askers = Vec::new();
    for k in 0..ASKERS {
        let mut ahp = Ahp::connect(&server.ws_url(), &format!("asker-{k}")).await;
        ahp.call(
            "createSession",
            json!({"channel": format!("ahp-session:/asker-{k}")}),
        )
        .await
        .unwrap();
        askers.push(ahp);
    }
    for i in 0..CHATS {
        let chat = format!("ahp-chat:/contested-{i}");
        let asks = askers.iter_mut().enumerate().map(|(k, ahp)| {
            let params = json!({"channel": format!("ahp-session:/asker-{k}"), "chat": chat});
            ahp.call("createChat", params)
        });
        // Every third round with the database's writes held back a while,
        // so that every asker reads "no such chat" before any commit: the
        // race, made certain.
        let held = if i % 3 == 0 {
            Some(db.hold_writes("chats").await)
        } else {
            None
        };
        let (answers, ()) = tokio::join!(futures_util::future::join_all(asks), async {
            if let Some(held) = held {
                tokio::time::sleep(std::time::Duration::from_millis(700)).await;
                held.release().await;
            }
        });
        let given = answers.iter().filter(|a| a.is_ok()).count();
        assert_eq!(given, 1, "{chat}: exactly one session gets it: {answers:?}");
        for refused in answers.iter().filter_map(|a| a.as_ref().err()) {
            assert!(refused.contains("already exists"), "{refused}");
        }
    }
    // Each contested chat is listed by exactly one session.
    let mut listed = Vec::new();
    for (k, ahp) in askers.iter_mut().enumerate() {
        let state = ahp
            .call(
                "subscribe",
                json!({"channel": format!("ahp-session:/asker-{k}")}),
            )
            .await
            .unwrap();
        listed.extend(
            state["snapshot"]["state"]["chats"]
                .as_array()
                .unwrap()
                .iter()
                .filter_map(|c| c["resource"].as_str())
                .filter(|c| c.starts_with("ahp-chat:/contested-"))
                .map(str::to_owned),
        );
    }
    listed.sort();
    let before = listed.len();
    listed.dedup();
    assert_eq!((before, listed.len()), (CHATS, CHATS), "{listed:?}");
}

/// Makes writes of `unlucky`'s `session/chatAdded`, and the give-back of
/// any chat's claim, fail in the database itself (triggers), as a full
/// disk or a lost connection would.
async fn fail_writes_of(db: &TestDb, unlucky: &str) {
    match db.backend() {
        tether_tests::Backend::Sqlite => {
            db.execute(&format!(
                "CREATE TRIGGER fault_log BEFORE INSERT ON log \
                 WHEN NEW.action LIKE '%session/chatAdded%{unlucky}%' \
                 BEGIN SELECT RAISE(ABORT, 'injected fault'); END"
            ))
            .await;
            db.execute(
                "CREATE TRIGGER fault_chats BEFORE DELETE ON chats \
                 BEGIN SELECT RAISE(ABORT, 'injected fault'); END",
            )
            .await;
        }
        tether_tests::Backend::Postgres => {
            db.execute(
                "CREATE FUNCTION fault() RETURNS trigger LANGUAGE plpgsql AS \
                 $$ BEGIN RAISE EXCEPTION 'injected fault'; END $$",
            )
            .await;
            db.execute(&format!(
                "CREATE TRIGGER fault_log BEFORE INSERT ON log FOR EACH ROW \
                 WHEN (NEW.action LIKE '%session/chatAdded%{unlucky}%') EXECUTE FUNCTION fault()"
            ))
            .await;
            db.execute(
                "CREATE TRIGGER fault_chats BEFORE DELETE ON chats FOR EACH ROW \
                 EXECUTE FUNCTION fault()",
            )
            .await;
        }
    }
}

async fn heal_writes(db: &TestDb) {
    let on = |table| match db.backend() {
        tether_tests::Backend::Sqlite => String::new(),
        tether_tests::Backend::Postgres => format!(" ON {table}"),
    };
    db.execute(&format!("DROP TRIGGER fault_log{}", on("log")))
        .await;
    db.execute(&format!("DROP TRIGGER fault_chats{}", on("chats")))
        .await;
}

/// A chat whose `session/chatAdded` could not be written, and whose claim
/// could not be given back either, is refused as unavailable; asked for
/// again by its session once the store is well, it is added, once.
async fn a_chat_whose_write_failed_can_be_asked_for_again(db: TestDb) {
    let server = ServerProcess::start(&db, &[]).await;
    let mut ahp = Ahp::connect(&server.ws_url(), "unlucky").await;
    ahp.call("createSession", json!({"channel": "ahp-session:/unlucky"}))
        .await
        .unwrap();
    let chat = "ahp-chat:/unlucky-chat";
    let ask = json!({"channel": "ahp-session:/unlucky", "chat": chat});
    fail_writes_of(&db, "unlucky-chat").await;
    let refused = ahp.call("createChat", ask.clone()).await.unwrap_err();
    assert!(
        refused.to_lowercase().contains("storage unavailable"),
        "{refused}"
    );
    assert_eq!(
        db.count("SELECT count(*) FROM chats WHERE chat = 'ahp-chat:/unlucky-chat'")
            .await,
        1,
        "the claim could not be given back"
    );
    heal_writes(&db).await;
    ahp.call("createChat", ask)
        .await
        .expect("the same session asks again once the store is well");
    let added = db
        .count(
            "SELECT count(*) FROM log WHERE action LIKE '%session/chatAdded%' \
             AND action LIKE '%ahp-chat:/unlucky-chat%'",
        )
        .await;
    assert_eq!(added, 1, "one chatAdded is committed");
    let state = ahp
        .call("subscribe", json!({"channel": "ahp-session:/unlucky"}))
        .await
        .unwrap();
    let chats: Vec<&str> = state["snapshot"]["state"]["chats"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|c| c["resource"].as_str())
        .filter(|c| *c == chat)
        .collect();
    assert_eq!(chats.len(), 1, "{state}");
    ahp.call("subscribe", json!({"channel": chat}))
        .await
        .expect("the chat is there to subscribe to");
}
