//! `tether migrate`, run as the real binary: a SQLite database built by the
//! real server moves to Postgres and the server on Postgres answers every
//! read as the one on SQLite did; an interrupted copy resumes; a locked
//! source, a target holding another database and bad arguments are refused
//! with one line.
//!
//! The Postgres half needs `TETHER_TEST_POSTGRES_URL` and skips loudly
//! without it, as every Postgres test does.

use std::process::{Output, Stdio};
use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use serde_json::{Value, json};
use tether_server::store::{self, NewEnvelope, StoreOptions};
use tether_tests::{ServerProcess, TestDb, TestServer, seed, tether_bin};
use tokio_tungstenite::tungstenite::Message;

/// How long one `tether migrate` may take in these tests.
const MIGRATE_WAIT: Duration = Duration::from_secs(300);

/// `tether migrate` with `args`, without any `TETHER_` variable of ours.
fn migrate_command(args: &[&str]) -> tokio::process::Command {
    let mut command = tokio::process::Command::new(tether_bin());
    for (key, _) in std::env::vars() {
        if key.starts_with("TETHER_") {
            command.env_remove(key);
        }
    }
    command
        .arg("migrate")
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    command
}

async fn migrate(from: &str, to: &str) -> Output {
    tokio::time::timeout(
        MIGRATE_WAIT,
        migrate_command(&["--from", from, "--to", to]).output(),
    )
    .await
    .expect("tether migrate finished in time")
    .expect("run tether migrate")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// Asserts success and returns stdout.
fn succeeded(output: &Output) -> String {
    assert!(
        output.status.success(),
        "tether migrate failed ({}): {}",
        output.status,
        text(&output.stderr)
    );
    text(&output.stdout)
}

/// Asserts failure with exit status 1 and one `tether: error:` line
/// containing each of `needles`; returns the line.
fn refused(output: &Output, needles: &[&str]) -> String {
    let stderr = text(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "stderr: {stderr}");
    let errors: Vec<&str> = stderr
        .lines()
        .filter(|l| l.starts_with("tether: error:"))
        .collect();
    assert_eq!(errors.len(), 1, "one error line: {stderr}");
    for needle in needles {
        assert!(errors[0].contains(needle), "{needle:?} in {stderr}");
    }
    errors[0].to_owned()
}

/// The SQLite file of a `sqlite:` test database.
fn sqlite_path(db: &TestDb) -> String {
    db.url().trim_start_matches("sqlite:").to_owned()
}

/// Rows in `table` of the SQLite file, read with a connection of our own
/// (the server and the migration hold only the `-lock` file).
async fn sqlite_count(db: &TestDb, table: &str) -> i64 {
    let pool = sqlite_reader(db).await;
    let n = sqlx::query_scalar(sqlx::AssertSqlSafe(format!("SELECT count(*) FROM {table}")))
        .fetch_one(&pool)
        .await
        .expect("count");
    pool.close().await;
    n
}

async fn sqlite_reader(db: &TestDb) -> sqlx::SqlitePool {
    sqlx::SqlitePool::connect_with(
        sqlx::sqlite::SqliteConnectOptions::new()
            .filename(sqlite_path(db))
            .read_only(true),
    )
    .await
    .expect("open the SQLite file")
}

async fn pg(db: &TestDb) -> sqlx::PgPool {
    sqlx::PgPool::connect(db.url())
        .await
        .expect("connect to the test database")
}

async fn pg_host(db: &TestDb) -> (String, i64) {
    let pool = pg(db).await;
    let host = sqlx::query_as("SELECT epoch, last_seq FROM host WHERE id = 1")
        .fetch_one(&pool)
        .await
        .expect("the host row");
    pool.close().await;
    host
}

/// The SQLite host row, read beside a running server if need be.
async fn sqlite_host(db: &TestDb) -> (String, i64) {
    let pool = sqlite_reader(db).await;
    let host = sqlx::query_as("SELECT epoch, last_seq FROM host WHERE id = 1")
        .fetch_one(&pool)
        .await
        .expect("the host row");
    pool.close().await;
    host
}

// ---------------------------------------------------------------------------
// Refusals that need no Postgres.

/// Bad URLs, a missing source, a file that is not Tether's, an unreachable
/// target and a source a running server holds: each one line, status 1,
/// and the source untouched.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_arguments_and_a_locked_source_are_refused() {
    let src = TestDb::sqlite();
    let path = sqlite_path(&src);
    let unreachable = "postgres://postgres@127.0.0.1:1/nowhere";

    let output = migrate(src.url(), "sqlite:/tmp/x.db").await;
    refused(&output, &["--to", "not a Postgres URL"]);
    let output = migrate("postgres://me:secret@db/x", unreachable).await;
    let line = refused(&output, &["--from", "not a SQLite database"]);
    assert!(
        !line.contains("secret"),
        "the password is not echoed: {line}"
    );
    let output = migrate(src.url(), unreachable).await;
    refused(&output, &[&path, "does not exist"]);

    let dir = tempfile::tempdir().unwrap();
    let stranger = dir.path().join("other.db");
    std::fs::write(&stranger, b"").unwrap();
    let output = migrate(stranger.to_str().unwrap(), unreachable).await;
    refused(&output, &["not a Tether database"]);

    // A Tether file, a target nobody listens on.
    let mut server = ServerProcess::start(&src, &[]).await;
    let output = migrate(src.url(), unreachable).await;
    refused(
        &output,
        &[
            &path,
            "in use by a running tether server",
            "stop the server",
        ],
    );
    // Killed, its lock goes with it.
    server.kill().await;
    let output = migrate(src.url(), unreachable).await;
    refused(&output, &["cannot reach the target", "127.0.0.1:1"]);
    let output = migrate(src.url(), "postgres://me:secret@127.0.0.1:1/nowhere").await;
    let line = refused(&output, &["cannot reach the target"]);
    assert!(
        !line.contains("secret"),
        "the password is not echoed: {line}"
    );
}

// ---------------------------------------------------------------------------
// The whole move, through the real binary.

/// The sessions the move test creates: (id, project).
const SESSIONS: [(&str, &str); 3] = [("m-a", "alpha"), ("m-b", "beta"), ("m-c", "alpha")];

/// Turns on `m-a`'s default chat: more than the 50-turn window, so the
/// oldest are archived in `chat_turns`.
const TURNS: u64 = 60;

/// Titles on `m-b`: more than the 256 envelopes between two snapshots.
const TITLES: u64 = 300;

struct Api {
    http: reqwest::Client,
    base: String,
}

impl Api {
    fn new(base: String) -> Self {
        Self {
            http: reqwest::Client::new(),
            base,
        }
    }

    async fn send(&self, method: reqwest::Method, path: &str, body: Option<Value>) -> (u16, Value) {
        let mut request = self.http.request(method, format!("{}{path}", self.base));
        if let Some(body) = body {
            request = request.json(&body);
        }
        let response = request.send().await.expect("a response");
        let status = response.status().as_u16();
        (status, response.json().await.unwrap_or(Value::Null))
    }

    async fn get(&self, path: &str) -> (u16, Value) {
        self.send(reqwest::Method::GET, path, None).await
    }

    async fn post(&self, path: &str, body: Value) -> (u16, Value) {
        self.send(reqwest::Method::POST, path, Some(body)).await
    }

    async fn act(
        &self,
        session: &str,
        seq: u64,
        channel: Option<&str>,
        action: Value,
    ) -> (u16, Value) {
        let mut body = json!({"clientId": "tester", "clientSeq": seq, "action": action});
        if let Some(channel) = channel {
            body["channel"] = json!(channel);
        }
        self.post(&format!("/v1/sessions/{session}/actions"), body)
            .await
    }
}

/// An attachment's bytes (every byte value), base64: they are copied as
/// bytes, not text.
const ATTACHMENT_BASE64: &str = "AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8gISIjJCUmJygpKissLS4vMDEyMzQ1Njc4OTo7PD0+P0BBQkNERUZHSElKS0xNTk9QUVJTVFVWV1hZWltcXV5fYGFiY2RlZmdoaWprbG1ub3BxcnN0dXZ3eHl6e3x9fn+AgYKDhIWGh4iJiouMjY6PkJGSk5SVlpeYmZqbnJ2en6ChoqOkpaanqKmqq6ytrq+wsbKztLW2t7i5uru8vb6/wMHCw8TFxsfIycrLzM3Oz9DR0tPU1dbX2Nna29zd3t/g4eLj5OXm5+jp6uvs7e7v8PHy8/T19vf4+fr7/P3+/w==";

/// The attachment of `m-b`'s `with-file` turn, as served.
async fn the_attachment(base: &str) -> Vec<u8> {
    let transcript: Value = reqwest::get(format!(
        "{base}/v1/sessions/m-b/transcript?after=0&limit=1000"
    ))
    .await
    .unwrap()
    .json()
    .await
    .unwrap();
    let uri = transcript["envelopes"]
        .as_array()
        .unwrap()
        .iter()
        .find_map(|e| {
            e["action"]["message"]["attachments"][0]["uri"]
                .as_str()
                .map(str::to_owned)
        })
        .expect("the stored attachment's reference");
    let digest = uri.trim_start_matches("tether-attachment:");
    let answer = reqwest::get(format!("{base}/v1/sessions/m-b/attachments/{digest}"))
        .await
        .unwrap();
    assert_eq!(answer.status(), 200);
    answer.bytes().await.unwrap().to_vec()
}

/// Builds the source through the real server: sessions in two projects,
/// a chat with more turns than its window, enough titles for snapshots, a
/// refused dispatch, working contexts, text that is not ASCII, an
/// attachment, and one session put away.
async fn build_source(api: &Api) {
    for (id, project) in SESSIONS {
        let (status, body) = api
            .post(
                "/v1/sessions",
                json!({"id": id, "project": project, "title": format!("session {id}")}),
            )
            .await;
        assert_eq!(status, 201, "{body}");
    }
    let chat = "ahp-chat:/m-a.main";
    for turn in 0..TURNS {
        let (status, body) = api
            .act(
                "m-a",
                turn,
                Some(chat),
                json!({"type": "chat/turnStarted", "turnId": format!("turn-{turn}"),
                       "startedAt": "2026-12-01T10:00:00.000Z",
                       "message": {"text": format!("question {turn}: ça va? ✓ 🚀 \"quoted\" \\ back"),
                                   "origin": {"kind": "user"}}}),
            )
            .await;
        assert_eq!(status, 200, "turn {turn}: {body}");
        // The echo agent answers; the next turn waits for the answer.
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        loop {
            let (_, view) = api.get("/v1/sessions/m-a").await;
            if view["projection"]["openTurnId"].is_null() {
                break;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "turn {turn} was not answered"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
    // A message with an attachment: its bytes are stored outside the log.
    let (status, body) = api
        .act(
            "m-b",
            900,
            Some("ahp-chat:/m-b.main"),
            json!({"type": "chat/turnStarted", "turnId": "with-file", "startedAt": "2026-12-01T10:00:00.000Z",
                   "message": {"text": "see the file", "origin": {"kind": "user"},
                               "attachments": [{"type": "embeddedResource", "label": "bytes.bin",
                                                "contentType": "application/octet-stream",
                                                "data": ATTACHMENT_BASE64}]}}),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    for i in 0..TITLES {
        let (status, body) = api
            .act(
                "m-b",
                1_000 + i,
                None,
                json!({"type": "session/titleChanged", "title": format!("título {i} — 標題")}),
            )
            .await;
        assert_eq!(status, 200, "{body}");
    }
    let (status, body) = api
        .act("m-b", 5_000, None, json!({"type": "session/ready"}))
        .await;
    assert_eq!(status, 422, "a refused dispatch is recorded: {body}");
    for (project, session, goal) in [
        ("alpha", "m-a", "move to Postgres"),
        ("alpha", "notes", "keep every byte — ✓"),
        ("beta", "m-b", "nothing lost"),
    ] {
        let (status, body) = api
            .send(
                reqwest::Method::PUT,
                &format!("/v1/projects/{project}/sessions/{session}/working-context"),
                Some(json!({"goal": goal, "pendingActions": ["check the copy"]})),
            )
            .await;
        assert_eq!(status, 200, "{body}");
    }
    let (status, body) = api
        .send(reqwest::Method::DELETE, "/v1/sessions/m-c", None)
        .await;
    assert_eq!(status, 200, "{body}");
}

/// Every REST read the move must keep, as (what, status and body).
async fn rest_reads(api: &Api) -> Vec<(String, Value)> {
    let mut paths = vec![
        "/v1/sessions?limit=1000".to_owned(),
        "/v1/sessions?limit=1".to_owned(),
        "/v1/sessions?project=alpha".to_owned(),
        "/v1/sessions?state=dormant".to_owned(),
        "/v1/sessions?state=ended".to_owned(),
        "/v1/sessions/missing".to_owned(),
        "/v1/projects/alpha/working-contexts".to_owned(),
        "/v1/projects/beta/working-contexts".to_owned(),
        "/v1/projects/alpha/sessions/m-a/working-context".to_owned(),
        "/v1/projects/alpha/sessions/notes/working-context".to_owned(),
        "/v1/projects/beta/sessions/m-b/working-context".to_owned(),
        "/v1/projects/alpha/sessions/unsaved/working-context".to_owned(),
    ];
    for (id, _) in SESSIONS {
        paths.push(format!("/v1/sessions/{id}"));
        paths.push(format!("/v1/sessions/{id}/tool-context"));
    }
    let mut reads = Vec::new();
    for path in paths {
        let (status, body) = api.get(&path).await;
        reads.push((path, json!({"status": status, "body": body})));
    }
    // The second page of the listing, by the first page's cursor.
    let (_, first) = api.get("/v1/sessions?limit=1").await;
    let cursor = first["nextCursor"]
        .as_str()
        .expect("a second page")
        .to_owned();
    let path = format!("/v1/sessions?limit=1&cursor={cursor}");
    reads.push((path.clone(), api.get(&path).await.1));
    // Whole transcripts, page by page.
    for (id, _) in SESSIONS {
        let mut after = 0;
        loop {
            let path = format!("/v1/sessions/{id}/transcript?after={after}&limit=1000");
            let (status, page) = api.get(&path).await;
            assert_eq!(status, 200, "{page}");
            let next = page["nextAfter"].as_u64();
            reads.push((path, page));
            match next {
                Some(n) => after = n,
                None => break,
            }
        }
    }
    reads
}

/// A raw WebSocket to a server process's `/ahp`.
async fn ws(base: &str) -> tether_tests::RawWs {
    let url = format!("{}/ahp", base.replacen("http://", "ws://", 1));
    tokio_tungstenite::connect_async(url)
        .await
        .expect("connect the WebSocket")
        .0
}

/// Sends a JSON-RPC request and returns the text of its answer, as sent.
async fn request_text(
    ws: &mut tether_tests::RawWs,
    id: u64,
    method: &str,
    params: Value,
) -> String {
    let request = json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params});
    ws.send(Message::Text(request.to_string().into()))
        .await
        .expect("send");
    loop {
        let message = tokio::time::timeout(Duration::from_secs(20), ws.next())
            .await
            .expect("an answer in time")
            .expect("open")
            .expect("a frame");
        if let Message::Text(text) = message {
            let value: Value = serde_json::from_str(&text).expect("JSON");
            if value["id"] == json!(id) {
                return text.to_string();
            }
        }
    }
}

/// Every channel the source has, root first.
fn channels() -> Vec<String> {
    let mut channels = vec!["ahp-root://".to_owned()];
    for (id, _) in SESSIONS {
        channels.push(format!("ahp-session:/{id}"));
        channels.push(format!("ahp-chat:/{id}.main"));
    }
    channels
}

/// What AHP clients see: a client reconnecting from each of several old
/// `lastSeenServerSeq`s (the text of the replay, as sent), then each
/// channel's subscribe snapshot.
async fn ahp_reads(base: &str, last_seq: u64) -> Vec<(String, Value)> {
    let mut reads = Vec::new();
    for seen in [0, 1, last_seq / 3, last_seq / 2, last_seq - 5, last_seq] {
        let mut socket = ws(base).await;
        let text = request_text(
            &mut socket,
            1,
            "reconnect",
            json!({"channel": "ahp-root://", "clientId": format!("old-{seen}"),
                   "lastSeenServerSeq": seen, "subscriptions": channels()}),
        )
        .await;
        let parsed: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(parsed["result"]["type"], "replay", "{text:.300}");
        reads.push((format!("reconnect from {seen}"), Value::String(text)));
    }
    let mut socket = ws(base).await;
    let _ = request_text(
        &mut socket,
        1,
        "initialize",
        json!({"channel": "ahp-root://", "clientId": "reader",
               "protocolVersions": [ahp_types::PROTOCOL_VERSION]}),
    )
    .await;
    for (i, channel) in channels().into_iter().enumerate().skip(1) {
        let text = request_text(
            &mut socket,
            10 + i as u64,
            "subscribe",
            json!({"channel": channel}),
        )
        .await;
        let mut value: Value = serde_json::from_str(&text).unwrap();
        assert!(
            value["result"]["snapshot"].is_object(),
            "{channel}: {text:.300}"
        );
        value["id"] = Value::Null;
        reads.push((format!("subscribe {channel}"), value));
    }
    reads
}

/// Retries answered from what was recorded, identically on both: an
/// accepted dispatch gives its original envelope, the refused one its
/// refusal, and the refused number reused for another action a 409.
async fn retries(api: &Api) -> Vec<(String, Value)> {
    let chat = "ahp-chat:/m-a.main";
    let retried = [
        (
            "m-a",
            0,
            Some(chat),
            json!({"type": "chat/turnStarted", "turnId": "turn-0",
            "startedAt": "2026-12-01T10:00:00.000Z",
            "message": {"text": "question 0: ça va? ✓ 🚀 \"quoted\" \\ back", "origin": {"kind": "user"}}}),
        ),
        (
            "m-b",
            1_000,
            None,
            json!({"type": "session/titleChanged", "title": "título 0 — 標題"}),
        ),
        ("m-b", 5_000, None, json!({"type": "session/ready"})),
        (
            "m-b",
            5_000,
            None,
            json!({"type": "session/titleChanged", "title": "reuse"}),
        ),
    ];
    let mut reads = Vec::new();
    for (session, seq, channel, action) in retried {
        let (status, body) = api.act(session, seq, channel, action.clone()).await;
        reads.push((
            format!("retry {session} {seq} {action}"),
            json!({"status": status, "body": body}),
        ));
    }
    reads
}

fn assert_same(before: &[(String, Value)], after: &[(String, Value)]) {
    assert_eq!(before.len(), after.len());
    for ((what, a), (what_after, b)) in before.iter().zip(after) {
        assert_eq!(what, what_after);
        assert_eq!(a, b, "{what}: SQLite and Postgres answer differently");
    }
}

/// The move end to end: built through `tether serve` on SQLite, copied by
/// `tether migrate`, served by `tether serve` on Postgres, and every read
/// answers as before: REST listings, projections, transcripts and working
/// contexts, reconnect replays (text for text) and subscribe snapshots,
/// and retries of recorded outcomes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sqlite_database_moves_to_postgres_and_reads_the_same() {
    let Some(target) = TestDb::postgres().await else {
        return;
    };
    let src = TestDb::sqlite();
    let mut server = ServerProcess::start(&src, &[]).await;
    let api = Api::new(server.base_url());
    build_source(&api).await;
    // Stopped hard, as a crash would; the restart settles what was open
    // (the boot sweep), so both sides are read in the same settled state.
    server.kill().await;
    server.restart().await;
    let (epoch, last_seq) = sqlite_host(&src).await;
    let rest_before = rest_reads(&api).await;
    let ahp_before = ahp_reads(&server.base_url(), last_seq as u64).await;
    let attachment_before = the_attachment(&server.base_url()).await;
    assert_eq!(attachment_before, (0..=255).collect::<Vec<u8>>());
    let found_before = found(&server.base_url(), "question").await;
    assert!(!found_before.is_empty());
    server.kill().await;
    drop(server);
    for table in [
        "rejections",
        "snapshots",
        "chat_turns",
        "working_contexts",
        "chats",
        "attachments",
    ] {
        assert!(
            sqlite_count(&src, table).await > 0,
            "the source has {table} rows"
        );
    }

    let output = migrate(src.url(), target.url()).await;
    let summary = succeeded(&output);
    assert!(summary.starts_with("migrated sqlite:"), "{summary}");
    assert!(
        summary.contains(&format!("epoch {epoch}, last seq {last_seq}")),
        "{summary}"
    );
    assert!(summary.contains("envelopes/s"), "{summary}");
    assert!(summary.contains("3 session read-model rows"), "{summary}");
    assert_eq!(
        pg_host(&target).await,
        (epoch.clone(), last_seq),
        "epoch and last seq kept"
    );

    let server = ServerProcess::start(&target, &[]).await;
    let api = Api::new(server.base_url());
    let rest_after = rest_reads(&api).await;
    let ahp_after = ahp_reads(&server.base_url(), last_seq as u64).await;
    assert_same(&rest_before, &rest_after);
    assert_same(&ahp_before, &ahp_after);
    assert_eq!(the_attachment(&server.base_url()).await, attachment_before);
    // The search index is not copied: the target's first host builds it
    // from the log, to the same hits.
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while found(&server.base_url(), "question").await != found_before {
        assert!(std::time::Instant::now() < deadline, "search not rebuilt");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(
        pg_host(&target).await,
        (epoch.clone(), last_seq),
        "serving wrote nothing new"
    );
    let retried_on_postgres = retries(&api).await;
    drop(server);

    // The same retries on the source answer the same.
    let server = ServerProcess::start(&src, &[]).await;
    let retried_on_sqlite = retries(&Api::new(server.base_url())).await;
    assert_same(&retried_on_sqlite, &retried_on_postgres);
    assert_eq!(retried_on_sqlite[2].1["status"], 422);
    assert_eq!(retried_on_sqlite[3].1["status"], 409);
    drop(server);
}

/// The hits of a search, `(session, kind, seq)`, sorted.
async fn found(base: &str, q: &str) -> Vec<(String, String, u64)> {
    let page: Value = reqwest::Client::new()
        .get(format!("{base}/v1/search"))
        .query(&[("q", q), ("limit", "100")])
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let mut hits: Vec<(String, String, u64)> = page["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|h| {
            (
                h["sessionId"].as_str().unwrap().to_owned(),
                h["kind"].as_str().unwrap().to_owned(),
                h["seq"].as_u64().unwrap(),
            )
        })
        .collect();
    hits.sort();
    hits
}

// ---------------------------------------------------------------------------
// Interrupted, refused.

/// Envelopes for the interrupted copy: enough that a debug build takes a
/// few seconds to copy them in small batches.
const INTERRUPTED_ENVELOPES: u64 = 60_000;

/// Rows of the log the target has committed, and whether the log is
/// done, per the migration's progress table (`None` before it exists).
async fn log_progress(pool: &sqlx::PgPool) -> Option<(i64, bool)> {
    sqlx::query_as("SELECT rows, done FROM migration_progress WHERE table_name = 'log'")
        .fetch_optional(pool)
        .await
        .ok()
        .flatten()
}

/// Killed with SIGKILL mid-copy, the target holds part of the log and a
/// host row that does not claim the source's last seq; another source is
/// refused on it; the same command again resumes and completes, and the
/// copy is whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_interrupted_migration_resumes_and_completes() {
    let Some(target) = TestDb::postgres().await else {
        return;
    };
    let src = TestDb::sqlite();
    seed::seed(src.url(), 20, INTERRUPTED_ENVELOPES).await;
    let (epoch, last_seq) = sqlite_host(&src).await;

    let mut child = migrate_command(&[
        "--from",
        src.url(),
        "--to",
        target.url(),
        "--batch-rows",
        "500",
    ])
    .spawn()
    .expect("start tether migrate");
    let pool = pg(&target).await;
    let deadline = tokio::time::Instant::now() + MIGRATE_WAIT;
    loop {
        if let Some((rows, false)) = log_progress(&pool).await
            && rows >= 5_000
        {
            child.kill().await.expect("kill tether migrate");
            break;
        }
        if let Ok(Some(status)) = child.try_wait() {
            panic!("tether migrate ended ({status}) before it could be interrupted; seed more");
        }
        assert!(tokio::time::Instant::now() < deadline, "no progress");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let (copied, done) = log_progress(&pool).await.expect("progress recorded");
    assert!(!done);
    let in_log: i64 = sqlx::query_scalar("SELECT count(*) FROM log")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(
        in_log, copied,
        "the rows and the resume point commit together"
    );
    assert!(
        in_log < last_seq,
        "interrupted mid-copy: {in_log} of {last_seq}"
    );
    assert_eq!(
        pg_host(&target).await,
        (epoch.clone(), 0),
        "a half-copied target has the epoch but not the last seq"
    );

    // Another database is refused on the half-copied target.
    let other = TestDb::sqlite();
    other.open().await.close().await;
    let (other_epoch, _) = sqlite_host(&other).await;
    let output = migrate(other.url(), target.url()).await;
    refused(
        &output,
        &[
            "unfinished migration of another database",
            &epoch,
            &other_epoch,
        ],
    );

    // So is the same database after a server wrote to it: rows already
    // copied may have changed since.
    let dir = tempfile::tempdir().unwrap();
    let moved_on = format!("sqlite:{}", dir.path().join("moved-on.db").display());
    std::fs::copy(sqlite_path(&src), dir.path().join("moved-on.db")).unwrap();
    let store = store::open(&moved_on, &StoreOptions::default())
        .await
        .unwrap();
    store
        .append(vec![NewEnvelope {
            channel: "ahp-session:/seed-00001".into(),
            session_id: Some("seed-00001".into()),
            action: json!({"type": "session/titleChanged", "title": "later"}).to_string(),
            origin: None,
            session: None,
            chats: Vec::new(),
            turns: Vec::new(),
            directed: None,
            owner: None,
            search: Vec::new(),
            usage: None,
            events: Vec::new(),
        }])
        .await
        .unwrap();
    store.close().await;
    let output = migrate(&moved_on, target.url()).await;
    refused(
        &output,
        &["the source changed since the interrupted migration"],
    );

    let output = migrate(src.url(), target.url()).await;
    let summary = succeeded(&output);
    assert!(summary.starts_with("migrated (resumed)"), "{summary}");
    let stderr = text(&output.stderr);
    assert!(
        stderr.contains(&format!("log: resuming after {copied} of")),
        "{stderr}"
    );
    // The resumed run copied only the rest.
    assert!(
        summary.contains(&format!("copied {} envelopes", last_seq - copied)),
        "{summary}"
    );
    assert_eq!(pg_host(&target).await, (epoch.clone(), last_seq));
    let in_log: i64 = sqlx::query_scalar("SELECT count(*) FROM log")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(in_log, sqlite_count(&src, "log").await);
    assert!(
        log_progress(&pool).await.is_none(),
        "the progress table is gone once the copy is verified"
    );
    pool.close().await;

    // Run again, it verifies and changes nothing.
    let output = migrate(src.url(), target.url()).await;
    let summary = succeeded(&output);
    assert!(summary.starts_with("already migrated"), "{summary}");

    // And the store opens on it and folds the sessions as on SQLite.
    let store = store::open(target.url(), &StoreOptions::default())
        .await
        .unwrap();
    let on_pg = store.session("seed-00007").await.unwrap().unwrap();
    store.close().await;
    let store = src.open().await;
    let on_sqlite = store.session("seed-00007").await.unwrap().unwrap();
    store.close().await;
    assert_eq!(on_pg, on_sqlite);
}

/// A target that already holds another database is refused and left as
/// it was: one a server ran on, one a migration of another source filled,
/// and one holding tables that are not Tether's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_target_holding_another_database_is_refused() {
    let Some(served) = TestDb::postgres().await else {
        return;
    };
    let src = TestDb::sqlite();
    seed::seed(src.url(), 2, 10).await;
    let (epoch, _) = sqlite_host(&src).await;

    let server = TestServer::start(&served).await;
    let (status, _) = Api::new(server.base_url())
        .post("/v1/sessions", json!({"id": "theirs"}))
        .await;
    assert_eq!(status, 201);
    server.stop().await;
    let before = pg_host(&served).await;
    let output = migrate(src.url(), served.url()).await;
    refused(
        &output,
        &["already holds another Tether database", &before.0, &epoch],
    );
    assert_eq!(pg_host(&served).await, before, "left as it was");

    let other = TestDb::sqlite();
    seed::seed(other.url(), 1, 5).await;
    let migrated = TestDb::postgres().await.expect("Postgres is configured");
    succeeded(&migrate(other.url(), migrated.url()).await);
    let output = migrate(src.url(), migrated.url()).await;
    refused(&output, &["already holds another Tether database", &epoch]);

    let foreign = TestDb::postgres().await.expect("Postgres is configured");
    let pool = pg(&foreign).await;
    sqlx::query("CREATE TABLE customers (id BIGINT PRIMARY KEY)")
        .execute(&pool)
        .await
        .unwrap();
    pool.close().await;
    let output = migrate(src.url(), foreign.url()).await;
    refused(&output, &["not empty", "customers"]);
}

/// A finished copy that no longer equals its source fails verification
/// when migrate runs again: status 1 and a line naming the table, the row
/// and the column.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_copy_that_differs_from_its_source_fails_verification() {
    let Some(target) = TestDb::postgres().await else {
        return;
    };
    let src = TestDb::sqlite();
    seed::seed(src.url(), 3, 30).await;
    succeeded(&migrate(src.url(), target.url()).await);
    let pool = pg(&target).await;
    sqlx::query("UPDATE log SET action = action || ' ' WHERE seq = 20")
        .execute(&pool)
        .await
        .unwrap();
    pool.close().await;
    let output = migrate(src.url(), target.url()).await;
    refused(
        &output,
        &[
            "verification failed",
            "log: the row at key (20) differs: action is",
            "recreate it empty",
        ],
    );
}
