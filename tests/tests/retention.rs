//! Retention through the real binary on both backends: a project that
//! keeps settled sessions N days loses exactly those settled longer ago,
//! with everything they own (transcript, chats, snapshots, search
//! documents); live sessions, recent ones and other projects' stay; the
//! round is logged and counted; only admins set it.

use std::time::{Duration, Instant};

use serde_json::json;
use sqlx::Row as _;
use tether_tests::{Backend, ServerProcess, TestDb, backend_tests, call, metric};

backend_tests!(
    settled_sessions_past_the_limit_go_with_everything_they_own,
    a_text_naming_a_sessions_creation_ends_no_subscription,
    an_older_versions_probe_home_goes_unless_a_session_holds_its_id,
);

const DAY_MS: i64 = 86_400_000;

/// Rows a session owns, table by table.
async fn owned(db: &TestDb, id: &str) -> Vec<(&'static str, i64)> {
    let mut out = Vec::new();
    for (table, sql) in [
        (
            "sessions",
            format!("SELECT count(*) FROM sessions WHERE id = '{id}'"),
        ),
        (
            "log",
            format!("SELECT count(*) FROM log WHERE session_id = '{id}'"),
        ),
        (
            "log on its chat",
            format!("SELECT count(*) FROM log WHERE channel = 'ahp-chat:/{id}.main'"),
        ),
        (
            "chats",
            format!("SELECT count(*) FROM chats WHERE session_id = '{id}'"),
        ),
        (
            "snapshots",
            format!("SELECT count(*) FROM snapshots WHERE channel = 'ahp-session:/{id}'"),
        ),
        (
            "search_docs",
            format!("SELECT count(*) FROM search_docs WHERE session_id = '{id}'"),
        ),
    ] {
        out.push((table, db.count(&sql).await));
    }
    // SQLite names each channel and client once for its log's indexes
    // (migration 0014); a session's go with it.
    if db.backend() == Backend::Sqlite {
        for (table, sql) in [
            (
                "channels",
                format!("SELECT count(*) FROM channels WHERE uri = 'ahp-session:/{id}'"),
            ),
            (
                "origins",
                format!("SELECT count(*) FROM origins WHERE client_id = 'retention-{id}'"),
            ),
        ] {
            out.push((table, db.count(&sql).await));
        }
    }
    out
}

/// Writes a row on a changeset's and a terminal's channel of session `id`
/// (the channels under a session, which retention finds by prefix) and a
/// snapshot of the changeset's, as the host would have. Their seqs are
/// taken from the host's counter first, so no append can be given them.
async fn plant_under(db: &TestDb, id: &str) {
    db.execute("UPDATE host SET last_seq = last_seq + 2 WHERE id = 1")
        .await;
    let (changeset, terminal) = (
        format!("ahp-changeset:/{id}/c1"),
        format!("ahp-terminal:/{id}/t1"),
    );
    let rows =
        format!("SELECT 0 AS k, '{changeset}' AS ch UNION ALL SELECT 1 AS k, '{terminal}' AS ch");
    if db.backend() == Backend::Sqlite {
        // SQLite's log is found through its channels' numbers (migration 0014).
        db.execute(&format!(
            "INSERT INTO channels (uri) VALUES ('{changeset}'), ('{terminal}')"
        ))
        .await;
        db.execute(&format!(
            "INSERT INTO log (seq, channel, session_id, action, at_ms, channel_id) \
             SELECT (SELECT last_seq FROM host WHERE id = 1) - k, ch, '{id}', \
                    '{{\"type\":\"x\"}}', 0, (SELECT id FROM channels WHERE uri = ch) \
             FROM ({rows}) AS planted"
        ))
        .await;
    } else {
        db.execute(&format!(
            "INSERT INTO log (seq, channel, session_id, action, at_ms) \
             SELECT (SELECT last_seq FROM host WHERE id = 1) - k, ch, '{id}', \
                    '{{\"type\":\"x\"}}', 0 \
             FROM ({rows}) AS planted"
        ))
        .await;
    }
    db.execute(&format!(
        "INSERT INTO snapshots (channel, seq, state, at_ms) VALUES ('{changeset}', 1, '{{}}', 0)"
    ))
    .await;
    db.execute(&format!(
        "INSERT INTO rejections (client_id, client_seq, channel, action, reason, at_ms) \
         VALUES ('planted-{id}', 1, '{terminal}', '{{}}', 'refused', 0)"
    ))
    .await;
}

/// On Postgres retention runs with the host row, and so every append,
/// locked: each statement it runs per deleted session finds its rows
/// through an index (a partial one, in byte order, for the changesets' and
/// terminals' prefixes: migration 0017). With sequential scans priced out, a
/// statement no index can serve still shows one; and the plans are the
/// generic ones a prepared statement settles on.
#[tokio::test]
async fn postgres_retention_reads_through_indexes() {
    let Some(db) = TestDb::postgres().await else {
        return;
    };
    db.open().await.close().await;
    let pool = sqlx::PgPool::connect(db.url()).await.expect("connect");
    let mut conn = pool.acquire().await.expect("a connection");
    sqlx::raw_sql("SET enable_seqscan = off; SET plan_cache_mode = force_generic_plan")
        .execute(&mut *conn)
        .await
        .expect("settings");
    let statements = tether_server::store::PostgresStore::retention_statements();
    assert!(statements.len() > 4, "{statements:?}");
    // Gathered, then asserted with the connection closed (a panic holding
    // it would leave the test's database in use).
    let mut wrong = Vec::new();
    for (i, sql) in statements.iter().enumerate() {
        let explained = sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
            "PREPARE r{i}(text) AS {sql}; EXPLAIN EXECUTE r{i}('old-1')"
        )))
        .fetch_all(&mut *conn)
        .await;
        let plan = match explained {
            Ok(rows) => rows
                .iter()
                .map(|row| row.get::<String, _>(0))
                .collect::<Vec<_>>()
                .join("\n"),
            Err(err) => {
                wrong.push(format!("{sql}: {err}"));
                continue;
            }
        };
        if plan.contains("Seq Scan") {
            wrong.push(format!("{sql}:\n{plan}"));
        }
    }
    drop(conn);
    pool.close().await;
    assert!(
        wrong.is_empty(),
        "statements that read a whole table:\n{}",
        wrong.join("\n\n")
    );
}

/// The rows [`plant_under`] wrote for session `id` that are left: the
/// log's, the snapshots' and the refused dispatches'.
async fn under(db: &TestDb, id: &str) -> (i64, i64, i64) {
    let log = format!(
        "SELECT count(*) FROM log \
         WHERE channel IN ('ahp-changeset:/{id}/c1', 'ahp-terminal:/{id}/t1')"
    );
    let snapshots =
        format!("SELECT count(*) FROM snapshots WHERE channel = 'ahp-changeset:/{id}/c1'");
    let rejections =
        format!("SELECT count(*) FROM rejections WHERE channel = 'ahp-terminal:/{id}/t1'");
    (
        db.count(&log).await,
        db.count(&snapshots).await,
        db.count(&rejections).await,
    )
}

const FAKE: &str = env!("CARGO_BIN_EXE_fake-acp-agent");

async fn settled_sessions_past_the_limit_go_with_everything_they_own(db: TestDb) {
    let dir = tempfile::tempdir().unwrap();
    let agent = format!(
        "fake=FAKE_ACP_LOG={} {FAKE}",
        dir.path().join("log").display()
    );
    // The agents' scratch directories (their HOMEs), one per session that
    // ran an agent here: old-1's goes with it, fresh-1's stays.
    let scratch = tempfile::tempdir().unwrap();
    for id in ["old-1", "fresh-1"] {
        let home = scratch.path().join(format!("s-{id}"));
        std::fs::create_dir_all(home.join(".agent")).unwrap();
        std::fs::write(home.join(".agent/login"), "a login of the agent's").unwrap();
    }
    let server = ServerProcess::start(
        &db,
        &[
            "--agent-scratch-dir",
            scratch.path().to_str().unwrap(),
            "--retention-interval-secs",
            "1",
            "--snapshot-every",
            "4",
            "--actor-idle-secs",
            "1",
            "--agent",
            &agent,
            "--agent-confinement",
            "off",
        ],
    )
    .await;
    let base = server.base_url();
    for (id, project) in [
        ("old-1", "keep"),
        ("old-2", "keep"),
        ("live-1", "keep"),
        ("fresh-1", "keep"),
        ("other-1", "forever"),
    ] {
        // live-1 runs an ACP agent, live as long as its process runs.
        let provider = if id == "live-1" { "fake" } else { "echo" };
        let (status, body) = call(
            &base,
            "POST",
            "/v1/sessions",
            Some(json!({"id": id, "project": project, "provider": provider,
                        "title": format!("aardvark {id}")})),
        )
        .await;
        assert_eq!(status, 201, "{body}");
        // Enough envelopes for a snapshot, and a turn.
        for seq in 1..=6 {
            let (status, body) = call(
                &base,
                "POST",
                &format!("/v1/sessions/{id}/actions"),
                Some(json!({"clientId": format!("retention-{id}"), "clientSeq": seq,
                            "action": {"type": "session/titleChanged", "title": format!("aardvark {id} {seq}")}})),
            )
            .await;
            assert_eq!(status, 200, "{body}");
        }
        if id != "live-1" {
            // A turn: envelopes on its chat's channel too (SQLite deletes
            // a session's log rows channel by channel).
            let (status, body) = call(
                &base,
                "POST",
                &format!("/v1/sessions/{id}/actions"),
                Some(json!({"clientId": format!("retention-{id}"), "clientSeq": 7,
                            "channel": format!("ahp-chat:/{id}.main"),
                            "action": {"type": "chat/turnStarted", "turnId": "t1",
                                       "startedAt": "2026-12-03T10:00:00.000Z",
                                       "message": {"text": "aardvark", "origin": {"kind": "user"}}}})),
            )
            .await;
            assert_eq!(status, 200, "{body}");
        }
        if id.starts_with("old") {
            let (status, body) = call(&base, "DELETE", &format!("/v1/sessions/{id}"), None).await;
            assert!(status == 200 || status == 204, "{status} {body}");
        }
    }
    // Its agent is started by a turn that stays open.
    let (status, body) = call(
        &base,
        "POST",
        "/v1/sessions/live-1/actions",
        Some(
            json!({"clientId": "retention-turn", "clientSeq": 1, "channel": "ahp-chat:/live-1.main",
                    "action": {"type": "chat/turnStarted", "turnId": "t1",
                               "startedAt": "2026-12-03T10:00:00.000Z",
                               "message": {"text": "hang", "origin": {"kind": "user"}}}}),
        ),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let (_, live) = call(&base, "GET", "/v1/sessions/live-1", None).await;
        if live["state"] == "live" {
            break;
        }
        assert!(Instant::now() < deadline, "not live: {live}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let (_, settled) = call(&base, "GET", "/v1/sessions/old-1", None).await;
    assert_ne!(settled["state"], "live", "{settled}");
    plant_under(&db, "old-1").await;
    // A neighbour whose id extends old-1's: none of its rows are old-1's.
    plant_under(&db, "old-10").await;
    assert_eq!(under(&db, "old-1").await, (2, 1, 1));
    let owned_before = owned(&db, "old-1").await;
    for (table, n) in &owned_before {
        assert!(*n > 0, "old-1 owns {table} rows before: {owned_before:?}");
    }

    // Finished webhook deliveries older than 30 days go too; newer ones and
    // pending ones stay (rows as the outbox writes them).
    let old = "strftime('%s','now') * 1000 - 31 * 86400000";
    let now = "strftime('%s','now') * 1000";
    let (old, now) = match db.backend() {
        Backend::Sqlite => (old.to_owned(), now.to_owned()),
        Backend::Postgres => (
            "(extract(epoch from now()) * 1000)::bigint - 31::bigint * 86400000".to_owned(),
            "(extract(epoch from now()) * 1000)::bigint".to_owned(),
        ),
    };
    for (event, at, delivered) in [
        ("evt-old-done", &old, "1"),
        ("evt-old-pending", &old, "NULL"),
        ("evt-new-done", &now, "1"),
    ] {
        db.execute(&format!(
            "INSERT INTO outbox (event_id, kind, project, session_id, seq, at_ms, data) \
             VALUES ('{event}', 'turn.completed', 'keep', 'old-1', 1, {at}, '{{}}')"
        ))
        .await;
        db.execute(&format!(
            "INSERT INTO deliveries (event_id, webhook_id, next_ms, delivered_ms) \
             VALUES ('{event}', 'w', 0, {delivered})"
        ))
        .await;
    }

    // Days pass for all but fresh-1; keep keeps 30 days. SQLite's writer
    // keeps the hour the index holds (Postgres generates it).
    let ago = 31 * DAY_MS;
    let hour = match db.backend() {
        Backend::Sqlite => format!(", idle_hour = (updated_ms - {ago}) / 3600000"),
        Backend::Postgres => String::new(),
    };
    db.execute(&format!(
        "UPDATE sessions SET updated_ms = updated_ms - {ago}{hour} WHERE id <> 'fresh-1'"
    ))
    .await;
    // A subscriber of old-1 (its session and its chat), connected before
    // the deletion: it is told nothing of a session made again with that
    // id, which may be another project's.
    let mut watcher = tether_tests::ahp_raw::Ahp::connect(&server.ws_url(), "watcher").await;
    for channel in ["ahp-session:/old-1", "ahp-chat:/old-1.main"] {
        watcher
            .call("subscribe", json!({"channel": channel}))
            .await
            .unwrap();
    }
    let (status, body) = call(
        &base,
        "PUT",
        "/v1/projects/keep/retention",
        Some(json!({"days": 30})),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body, json!({"project": "keep", "days": 30}));
    let (_, read) = call(&base, "GET", "/v1/projects/keep/retention", None).await;
    assert_eq!(read, json!({"project": "keep", "days": 30}));
    let (_, forever) = call(&base, "GET", "/v1/projects/forever/retention", None).await;
    assert_eq!(forever, json!({"project": "forever"}));
    for bad in [
        json!({"days": 0}),
        json!({"days": 40000}),
        json!({"days": "ten"}),
        json!({}),
    ] {
        let (status, body) = call(
            &base,
            "PUT",
            "/v1/projects/keep/retention",
            Some(bad.clone()),
        )
        .await;
        assert!(status == 422 || status == 400, "{bad}: {status} {body}");
    }

    // The next rounds delete exactly the two settled, expired sessions.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (one, _) = call(&base, "GET", "/v1/sessions/old-1", None).await;
        let (two, _) = call(&base, "GET", "/v1/sessions/old-2", None).await;
        if one == 404 && two == 404 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "still there: old-1 {one}, old-2 {two}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    for id in ["old-1", "old-2"] {
        let owned = owned(&db, id).await;
        assert!(
            owned.iter().all(|(_, n)| *n == 0),
            "{id} left rows: {owned:?}"
        );
    }
    assert_eq!(under(&db, "old-1").await, (0, 0, 0), "left under old-1");
    assert!(
        !scratch.path().join("s-old-1").exists(),
        "old-1's agent scratch directory was left for an id made again"
    );
    assert!(scratch.path().join("s-fresh-1/.agent/login").exists());
    assert_eq!(under(&db, "old-10").await, (2, 1, 1), "lost under old-10");
    if db.backend() == Backend::Sqlite {
        let sql = "SELECT count(*) FROM channels WHERE uri = 'ahp-changeset:/old-10/c1'";
        assert_eq!(db.count(sql).await, 1, "old-10's channel keeps its name");
    }
    // Another round changes nothing more.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    for id in ["live-1", "fresh-1", "other-1"] {
        let (status, _) = call(&base, "GET", &format!("/v1/sessions/{id}"), None).await;
        assert_eq!(status, 200, "{id} is kept");
        let owned = owned(&db, id).await;
        assert!(
            owned.iter().all(|(_, n)| *n > 0),
            "{id} lost rows: {owned:?}"
        );
    }
    assert_eq!(
        metric(&base, "tether_retention_deleted_sessions_total").await,
        2
    );
    let (_, found) = call(&base, "GET", "/v1/search?q=aardvark&limit=100", None).await;
    let mut sessions: Vec<&str> = found["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|h| h["sessionId"].as_str().unwrap())
        .collect();
    sessions.sort();
    // A session's title, its message and the answer to it each match.
    sessions.dedup();
    assert_eq!(sessions, ["fresh-1", "live-1", "other-1"]);
    assert!(
        server.log().contains("retention: settled session deleted"),
        "the deletions are logged"
    );

    // Kept for good again: nothing more goes.
    let (status, _) = call(&base, "DELETE", "/v1/projects/keep/retention", None).await;
    assert_eq!(status, 204);
    let (_, cleared) = call(&base, "GET", "/v1/projects/keep/retention", None).await;
    assert_eq!(cleared, json!({"project": "keep"}));

    // A client of a deleted session writes again, elsewhere: its origin
    // is named afresh (SQLite's writer forgot the deleted name's number),
    // so its retry is still answered with the original outcome.
    let mut answers = Vec::new();
    for _ in 0..2 {
        let (status, body) = call(
            &base,
            "POST",
            "/v1/sessions/fresh-1/actions",
            Some(json!({"clientId": "retention-old-1", "clientSeq": 1,
                        "action": {"type": "session/titleChanged", "title": "aardvark again"}})),
        )
        .await;
        assert_eq!(status, 200, "{body}");
        answers.push(body["serverSeq"].as_u64().expect("a serverSeq"));
    }
    assert_eq!(answers[0], answers[1], "the retry is the original");

    // A deleted session's id may be used again: it starts afresh.
    let (status, body) = call(
        &base,
        "POST",
        "/v1/sessions",
        Some(json!({"id": "old-1", "project": "keep", "provider": "echo"})),
    )
    .await;
    assert_eq!(status, 201, "{body}");
    let (status, page) = call(&base, "GET", "/v1/sessions/old-1/transcript", None).await;
    assert_eq!(status, 200, "{page}");
    let titles = page["envelopes"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["action"]["type"] == "session/titleChanged")
        .count();
    assert_eq!(titles, 0, "none of the deleted session's envelopes: {page}");
    let (status, body) = call(
        &base,
        "POST",
        "/v1/sessions/old-1/actions",
        Some(json!({"clientId": "new-owner", "clientSeq": 1,
                    "action": {"type": "session/titleChanged", "title": "the new owner's"}})),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    tokio::time::sleep(Duration::from_millis(300)).await;
    watcher.call("listSessions", json!({})).await.unwrap();
    let leaked: Vec<&serde_json::Value> = watcher
        .seen
        .iter()
        .filter(|m| m["method"] == "action" && m.to_string().contains("new owner"))
        .collect();
    assert!(
        leaked.is_empty(),
        "the deleted session's subscriber got its successor's: {leaked:?}"
    );
}

/// A session made again with a deleted one's id ends the older
/// subscriptions of its channel (the creation's type read exactly): a
/// writer's title, or anything else, that names that type ends nobody's.
async fn a_text_naming_a_sessions_creation_ends_no_subscription(db: TestDb) {
    let mut server = ServerProcess::start(&db, &[]).await;
    let base = server.base_url();
    tether_tests::create_session(&base, "named", "echo").await;
    let mut watcher = tether_tests::ahp_raw::Ahp::connect(&server.ws_url(), "watcher").await;
    for channel in ["ahp-session:/named", "ahp-chat:/named.main"] {
        watcher
            .call("subscribe", json!({"channel": channel}))
            .await
            .unwrap();
    }
    let mut writer = tether_tests::ahp_raw::Ahp::connect(&server.ws_url(), "writer").await;
    for title in [
        "x-tether/sessionCreated",
        "\"type\":\"x-tether/sessionCreated\"",
    ] {
        let refused = writer
            .dispatch(
                "ahp-session:/named",
                json!({"type": "session/titleChanged", "title": title}),
            )
            .await;
        assert_eq!(refused, None);
    }
    let refused = writer
        .dispatch(
            "ahp-session:/named",
            json!({"type": "session/titleChanged", "title": "still heard"}),
        )
        .await;
    assert_eq!(refused, None);
    let heard = watcher
        .action("session/titleChanged", |a| a["title"] == "still heard")
        .await;
    assert_eq!(heard["title"], "still heard");
    server.terminate().await;
}

/// An older version's start-up probe ran its agent in `s-probe-<agent>`,
/// the scratch directory (HOME) a session named `probe-<agent>` would get:
/// a start removes each such directory no session holds, and keeps the
/// one of a session that has that id.
async fn an_older_versions_probe_home_goes_unless_a_session_holds_its_id(db: TestDb) {
    let scratch = tempfile::tempdir().unwrap();
    let args = ["--agent-scratch-dir", scratch.path().to_str().unwrap()];
    let mut server = ServerProcess::start(&db, &args).await;
    let (status, body) = call(
        &server.base_url(),
        "POST",
        "/v1/sessions",
        Some(json!({"id": "probe-kept", "project": "p", "provider": "echo"})),
    )
    .await;
    assert_eq!(status, 201, "{body}");
    server.terminate().await;
    let home = |id: &str| scratch.path().join(format!("s-{id}"));
    for id in ["probe-codex", "probe-kept", "probing"] {
        std::fs::create_dir_all(home(id).join(".agent")).unwrap();
        std::fs::write(home(id).join(".agent/login"), "planted").unwrap();
    }
    server.restart().await;
    assert!(
        !home("probe-codex").exists(),
        "no session holds probe-codex: its HOME went"
    );
    assert!(
        home("probe-kept").join(".agent/login").exists(),
        "the session probe-kept keeps its HOME"
    );
    assert!(home("probing").exists(), "not a probe's name: left");
    assert!(
        server
            .log()
            .contains("removed an older version's probe scratch directory")
    );
    server.terminate().await;
}
