//! Retention with several hosts on one Postgres: what one host's retention
//! deletes, the others forget (chats routed to their new owners, copies
//! folded afresh, subscriptions ended), so a session or chat made again
//! with a deleted one's id is never answered or delivered as the old one.

use std::time::{Duration, Instant};

use serde_json::json;
use tether_tests::{ServerProcess, TestDb, call, initialized_at, metric};

const DAY_MS: i64 = 86_400_000;

async fn create_chat(
    client: &ahp::Client,
    session: &str,
    chat: &str,
) -> Result<serde_json::Value, ahp::ClientError> {
    client
        .request(
            "createChat",
            json!({"channel": format!("ahp-session:/{session}"), "chat": chat}),
        )
        .await
}

/// Two hosts on one Postgres, leases of 1.5 s and actors idle after 1 s:
/// A runs no retention within a test's time, B every second.
async fn two_hosts(db: &TestDb) -> (ServerProcess, ServerProcess) {
    let args = |every| {
        [
            "--lease-ttl-ms",
            "1500",
            "--actor-idle-secs",
            "1",
            "--retention-interval-secs",
            every,
        ]
    };
    let a = ServerProcess::start(db, &args("3600")).await;
    let b = ServerProcess::start(db, &args("1")).await;
    (a, b)
}

/// Creates session `id` in project `keep` through `host`.
async fn created_in_keep(host: &str, id: &str) {
    let (status, body) = call(
        host,
        "POST",
        "/v1/sessions",
        Some(json!({"id": id, "project": "keep", "provider": "echo"})),
    )
    .await;
    assert_eq!(status, 201, "{body}");
}

/// How many turns started on `chat` the session's transcript holds.
async fn turns_started(host: &str, session: &str, chat: &str) -> usize {
    let path = format!("/v1/sessions/{session}/transcript");
    let (status, page) = call(host, "GET", &path, None).await;
    assert_eq!(status, 200, "{page}");
    page["envelopes"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["channel"] == chat && e["action"]["type"] == "chat/turnStarted")
        .count()
}

/// Ages settled session `id` (of project `keep`) past a 30-day limit, sets
/// that limit through `host` and waits until its retention deleted it.
async fn deleted_by_retention(db: &TestDb, host: &str, id: &str, deadline: Instant) {
    db.execute(&format!(
        "UPDATE sessions SET updated_ms = updated_ms - {} WHERE id = '{id}'",
        31 * DAY_MS
    ))
    .await;
    let (status, body) = call(
        host,
        "PUT",
        "/v1/projects/keep/retention",
        Some(json!({"days": 30})),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let path = format!("/v1/sessions/{id}");
    while call(host, "GET", &path, None).await.0 != 404 {
        assert!(Instant::now() < deadline, "the retention kept {id}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A task that reads session `id` through host `a` (a subscription's
/// snapshot, answered by its copy) often enough to keep the copy in memory.
async fn keep_copy_in_memory(
    a: &ServerProcess,
    client: &str,
    id: &str,
) -> tokio::task::JoinHandle<()> {
    let reader = initialized_at(&a.ws_url(), client).await;
    let channel = json!({"channel": format!("ahp-session:/{id}")});
    tokio::spawn(async move {
        loop {
            let _: Result<serde_json::Value, _> =
                reader.request("subscribe", channel.clone()).await;
            let _: Result<serde_json::Value, _> =
                reader.request("unsubscribe", channel.clone()).await;
            tokio::time::sleep(Duration::from_millis(150)).await;
        }
    })
}

/// Waits until `host` (named `name`) holds no session actor.
async fn idle_on(host: &str, name: &str, deadline: Instant) {
    while metric(host, "tether_session_actors").await > 0 {
        assert!(
            Instant::now() < deadline,
            "{name} kept the session in memory"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Two hosts on one Postgres: host A remembers which session owns a chat;
/// host B's retention deletes that session and the chat's id is taken by
/// another session. A routes the chat to its new owner and lets it be
/// created again; it does not answer from its memory of the deleted one.
#[tokio::test]
async fn a_chat_id_freed_by_another_hosts_retention_is_routed_to_its_new_owner() {
    let Some(db) = TestDb::postgres().await else {
        return;
    };
    let (a, b) = two_hosts(&db).await;
    let (on_a, on_b) = (a.base_url(), b.base_url());
    created_in_keep(&on_a, "gone").await;
    let client_a = initialized_at(&a.ws_url(), "chats-a").await;
    for chat in ["ahp-chat:/reused", "ahp-chat:/reused-2"] {
        create_chat(&client_a, "gone", chat).await.expect(chat);
    }
    let (status, body) = call(&on_a, "DELETE", "/v1/sessions/gone", None).await;
    assert!(status == 200 || status == 204, "{status} {body}");
    // A's actor goes idle and lets the session go; B's retention, which
    // leaves alone only what is leased or in memory on B, deletes it.
    let deadline = Instant::now() + Duration::from_secs(20);
    idle_on(&on_a, "A", deadline).await;
    deleted_by_retention(&db, &on_b, "gone", deadline).await;
    assert_eq!(
        db.count("SELECT count(*) FROM chats WHERE chat LIKE 'ahp-chat:/reused%'")
            .await,
        0
    );

    // Another session takes one id on B and the other on A.
    created_in_keep(&on_b, "taker").await;
    let client_b = initialized_at(&b.ws_url(), "chats-b").await;
    create_chat(&client_b, "taker", "ahp-chat:/reused")
        .await
        .expect("B creates the freed chat");
    create_chat(&client_a, "taker", "ahp-chat:/reused-2")
        .await
        .expect("A creates the freed chat: it is in no session");
    // A writes to the chat B made: it is the taker's.
    let (status, body) = call(
        &on_a,
        "POST",
        "/v1/sessions/taker/actions",
        Some(
            json!({"clientId": "chats-rest", "clientSeq": 1, "channel": "ahp-chat:/reused",
                    "action": {"type": "chat/turnStarted", "turnId": "t1",
                               "startedAt": "2026-12-06T10:00:00.000Z",
                               "message": {"text": "hello", "origin": {"kind": "user"}}}}),
        ),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(turns_started(&on_b, "taker", "ahp-chat:/reused").await, 1);
}

/// The same with the deleted owner's proxy kept in memory on A by reads:
/// B holds the session, A forwards a chat write to it and then only reads
/// it. B lets it go idle, B's retention deletes it (A's copy holds no
/// lease, so nothing stops it) and another session takes the chat's id.
/// A asks the store, not its memory of a session it does not hold.
#[tokio::test]
async fn a_chat_whose_old_owner_is_only_read_on_this_host_is_routed_to_its_new_owner() {
    let Some(db) = TestDb::postgres().await else {
        return;
    };
    let (a, b) = two_hosts(&db).await;
    let (on_a, on_b) = (a.base_url(), b.base_url());
    created_in_keep(&on_b, "watched").await;
    let client_b = initialized_at(&b.ws_url(), "watch-b").await;
    create_chat(&client_b, "watched", "ahp-chat:/watched-chat")
        .await
        .expect("B creates the chat");
    let turn = |session: &str, seq: u64| {
        (
            format!("/v1/sessions/{session}/actions"),
            json!({"clientId": "watch-rest", "clientSeq": seq, "channel": "ahp-chat:/watched-chat",
                   "action": {"type": "chat/turnStarted", "turnId": format!("t{seq}"),
                              "startedAt": "2026-12-06T10:00:00.000Z",
                              "message": {"text": "hello", "origin": {"kind": "user"}}}}),
        )
    };
    // A learns the chat's owner and forwards the write to B, its holder.
    let (path, action) = turn("watched", 1);
    let (status, body) = call(&on_a, "POST", &path, Some(action)).await;
    assert_eq!(status, 200, "{body}");
    // From now on A only reads the session (a subscription's snapshot, which
    // its copy answers), often enough to keep the copy in memory.
    let reader = keep_copy_in_memory(&a, "watch-a", "watched").await;
    let (status, body) = call(&on_b, "DELETE", "/v1/sessions/watched", None).await;
    assert!(status == 200 || status == 204, "{status} {body}");
    let deadline = Instant::now() + Duration::from_secs(20);
    idle_on(&on_b, "B", deadline).await;
    deleted_by_retention(&db, &on_b, "watched", deadline).await;
    created_in_keep(&on_b, "taker").await;
    create_chat(&client_b, "taker", "ahp-chat:/watched-chat")
        .await
        .expect("B gives the freed chat id to another session");
    assert!(
        metric(&on_a, "tether_session_actors").await > 0,
        "A's copy of the deleted session is still in memory"
    );
    let (path, action) = turn("taker", 2);
    let (status, body) = call(&on_a, "POST", &path, Some(action)).await;
    reader.abort();
    assert_eq!(status, 200, "A routes the chat to its new owner: {body}");
    assert_eq!(
        turns_started(&on_b, "taker", "ahp-chat:/watched-chat").await,
        1
    );
}

/// Two hosts on one Postgres: a subscriber on A of a session that B's
/// retention deletes is told nothing of a session made again with its id
/// (here in another project), while a subscriber of the new one on A gets
/// it: B tells A what it deleted.
#[tokio::test]
async fn another_hosts_retention_ends_the_subscriptions_here() {
    let Some(db) = TestDb::postgres().await else {
        return;
    };
    let (a, b) = two_hosts(&db).await;
    let on_b = b.base_url();
    created_in_keep(&on_b, "reborn").await;
    let mut watcher = tether_tests::ahp_raw::Ahp::connect(&a.ws_url(), "watcher-a").await;
    for channel in ["ahp-session:/reborn", "ahp-chat:/reborn.main"] {
        watcher
            .call("subscribe", json!({"channel": channel}))
            .await
            .unwrap();
    }
    // A keeps its copy of the session in memory throughout, by reads.
    let reader = keep_copy_in_memory(&a, "reader-a", "reborn").await;
    // B lets the session go idle, then its retention deletes it (A's copy
    // holds no lease).
    let deadline = Instant::now() + Duration::from_secs(20);
    idle_on(&on_b, "B", deadline).await;
    deleted_by_retention(&db, &on_b, "reborn", deadline).await;
    // Made again on B, in another project, and written to.
    let (status, body) = call(
        &on_b,
        "POST",
        "/v1/sessions",
        Some(json!({"id": "reborn", "project": "other", "provider": "echo"})),
    )
    .await;
    assert_eq!(status, 201, "{body}");
    let mut fresh = tether_tests::ahp_raw::Ahp::connect(&a.ws_url(), "fresh-a").await;
    let deadline = Instant::now() + Duration::from_secs(20);
    // A's copy, kept in memory, folds the new session's log from its
    // start: a subscriber sees the new session, not the deleted one with
    // the new one's actions folded in.
    loop {
        let snapshot = fresh
            .call("subscribe", json!({"channel": "ahp-session:/reborn"}))
            .await;
        if snapshot
            .as_ref()
            .is_ok_and(|s| s.to_string().contains("\"other\""))
        {
            break;
        }
        let _ = fresh
            .call("unsubscribe", json!({"channel": "ahp-session:/reborn"}))
            .await;
        assert!(
            Instant::now() < deadline,
            "A never saw the new session: {snapshot:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let (status, body) = call(
        &on_b,
        "POST",
        "/v1/sessions/reborn/actions",
        Some(json!({"clientId": "new-owner", "clientSeq": 1,
                    "action": {"type": "session/titleChanged", "title": "the new owner's"}})),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let told = |seen: &[serde_json::Value]| {
        seen.iter()
            .filter(|m| m["method"] == "action" && m.to_string().contains("new owner"))
            .count()
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    while told(&fresh.seen) == 0 {
        assert!(Instant::now() < deadline, "A's new subscriber got nothing");
        fresh.call("listSessions", json!({})).await.unwrap();
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    reader.abort();
    watcher.call("listSessions", json!({})).await.unwrap();
    assert_eq!(
        told(&watcher.seen),
        0,
        "the deleted session's subscriber on A got its successor's: {:?}",
        watcher.seen
    );
}
