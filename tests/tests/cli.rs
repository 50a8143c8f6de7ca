//! The `tether` client commands, run as the real binary against a real
//! server, on both backends: output, `--json`, and the exit codes of every
//! kind of failure.

use std::process::{Output, Stdio};
use std::time::Duration;

use serde_json::Value;
use tether_client::Client;
use tether_protocol::rest::CreateSessionRequest;
use tether_tests::{ServerProcess, TestDb, TestServer, backend_tests, produce_titles, tether_bin};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

backend_tests!(
    sessions_and_show_print_tables_and_json,
    send_prints_the_streamed_answer,
    dirs_change_directories_and_report_refusals,
    context_round_trips_through_stdin,
    tail_follows_across_a_server_restart,
    tail_from_start_prints_the_whole_transcript,
    tail_follows_chats_created_while_it_runs,
    export_gives_every_envelope_as_jsonl_and_the_conversation_as_markdown,
);

/// A `tether` command against `url`, with its own state directory.
fn tether(url: &str, state: &std::path::Path, args: &[&str]) -> tokio::process::Command {
    let mut command = tokio::process::Command::new(tether_bin());
    for (key, _) in std::env::vars() {
        if key.starts_with("TETHER_") {
            command.env_remove(key);
        }
    }
    command
        .args(args)
        .env("TETHER_URL", url)
        .env("XDG_STATE_HOME", state)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    command
}

async fn run(url: &str, state: &std::path::Path, args: &[&str]) -> Output {
    tokio::time::timeout(Duration::from_secs(60), tether(url, state, args).output())
        .await
        .expect("the command finished")
        .expect("run tether")
}

fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// Asserts a failure with `code` and one `tether: error:` line containing
/// `needle`.
fn assert_fails(output: &Output, code: i32, needle: &str) {
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(code), "stderr: {stderr}");
    let lines: Vec<&str> = stderr.lines().collect();
    assert_eq!(lines.len(), 1, "one line: {stderr}");
    assert!(lines[0].starts_with("tether: error: "), "{stderr}");
    assert!(lines[0].contains(needle), "{needle:?} not in {stderr}");
}

fn assert_ok(output: &Output) {
    assert!(
        output.status.success(),
        "exit {:?}; stderr: {}",
        output.status.code(),
        String::from_utf8_lossy(&output.stderr)
    );
}

async fn create(client: &Client, id: &str, project: &str, dirs: &[&std::path::Path]) {
    client
        .create_session(&CreateSessionRequest {
            id: Some(id.into()),
            project: Some(project.into()),
            provider: None,
            working_directories: dirs.iter().map(|d| d.display().to_string()).collect(),
            title: None,
            config: None,
        })
        .await
        .expect("create");
}

async fn sessions_and_show_print_tables_and_json(db: TestDb) {
    let server = TestServer::start(&db).await;
    let url = server.base_url();
    let state = tempfile::tempdir().unwrap();
    let client = server.client();
    create(&client, "alpha", "web", &[]).await;
    create(&client, "beta", "api", &[]).await;

    let table = run(&url, state.path(), &["sessions"]).await;
    assert_ok(&table);
    let text = stdout(&table);
    let lines: Vec<&str> = text.lines().collect();
    assert!(
        lines[0].starts_with("ID") && lines[0].contains("RESUMABLE"),
        "{text}"
    );
    assert_eq!(lines.len(), 3, "{text}");
    assert!(lines[1].starts_with("beta"), "newest first: {text}");

    let json = run(
        &url,
        state.path(),
        &["sessions", "--project", "web", "--json"],
    )
    .await;
    assert_ok(&json);
    let items: Vec<Value> = serde_json::from_slice(&json.stdout).unwrap();
    assert_eq!(items.len(), 1);
    assert_eq!(items[0]["id"], "alpha");

    let all = run(
        &url,
        state.path(),
        &["sessions", "--all", "--state", "dormant", "--json"],
    )
    .await;
    assert_eq!(
        serde_json::from_slice::<Vec<Value>>(&all.stdout)
            .unwrap()
            .len(),
        2
    );

    let shown = run(&url, state.path(), &["show", "alpha"]).await;
    assert_ok(&shown);
    assert!(
        stdout(&shown).contains("project     web"),
        "{}",
        stdout(&shown)
    );
    let shown = run(&url, state.path(), &["show", "alpha", "--json"]).await;
    let view: Value = serde_json::from_slice(&shown.stdout).unwrap();
    assert_eq!(view["resource"], "ahp-session:/alpha");

    assert_fails(
        &run(&url, state.path(), &["show", "nope"]).await,
        3,
        "does not exist",
    );
    assert_fails(
        &run(&url, state.path(), &["sessions", "--state", "sleeping"]).await,
        2,
        "sleeping",
    );
    server.stop().await;
}

async fn send_prints_the_streamed_answer(db: TestDb) {
    let server = TestServer::start(&db).await;
    let url = server.base_url();
    let state = tempfile::tempdir().unwrap();
    let client = server.client();
    create(&client, "talk", "web", &[]).await;

    let sent = run(&url, state.path(), &["send", "talk", "hello echo"]).await;
    assert_ok(&sent);
    assert_eq!(stdout(&sent), "hello echo\n");
    let second = run(&url, state.path(), &["send", "talk", "again", "--json"]).await;
    assert_ok(&second);
    let types: Vec<String> = stdout(&second)
        .lines()
        .map(|l| {
            serde_json::from_str::<Value>(l).unwrap()["action"]["type"]
                .as_str()
                .unwrap()
                .to_owned()
        })
        .collect();
    assert_eq!(
        types,
        ["chat/turnStarted", "chat/responsePart", "chat/turnComplete"]
    );
    let view = client.session("talk").await.unwrap();
    assert_eq!(view.turns, 2, "one turn per send");

    // The identity file numbers the two runs' dispatches apart: both applied.
    let identity: Value =
        serde_json::from_slice(&std::fs::read(state.path().join("tether/identity.json")).unwrap())
            .unwrap();
    assert!(
        identity["reservedUpTo"].as_u64().unwrap() >= 128,
        "{identity}"
    );

    // An ended session refuses the turn (one that never ran ends when
    // deleted; "talk" would only close).
    create(&client, "over", "web", &[]).await;
    client.delete_session("over").await.unwrap();
    assert_fails(
        &run(&url, state.path(), &["send", "over", "late"]).await,
        4,
        "ended",
    );
    server.stop().await;
}

async fn dirs_change_directories_and_report_refusals(db: TestDb) {
    let server = TestServer::start(&db).await;
    let url = server.base_url();
    let state = tempfile::tempdir().unwrap();
    let work = tempfile::tempdir().unwrap();
    let (a, b, c) = (
        work.path().join("a"),
        work.path().join("b"),
        work.path().join("c"),
    );
    for dir in [&a, &b, &c] {
        std::fs::create_dir(dir).unwrap();
    }
    create(&server.client(), "dirs", "web", &[&a]).await;
    let path = |p: &std::path::Path| p.display().to_string();

    let added = run(
        &url,
        state.path(),
        &["dirs", "dirs", "add", &path(&b), &path(&c)],
    )
    .await;
    assert_ok(&added);
    assert_eq!(
        stdout(&added),
        format!("{}\n{}\n{}\n", path(&a), path(&b), path(&c))
    );

    let replaced = run(
        &url,
        state.path(),
        &["dirs", "dirs", "replace", &path(&b), &path(&c), "--json"],
    )
    .await;
    assert_ok(&replaced);
    let list: Vec<String> = serde_json::from_slice(&replaced.stdout).unwrap();
    assert_eq!(list.len(), 2, "B→C where C is present dedupes: {list:?}");

    let removed = run(&url, state.path(), &["dirs", "dirs", "remove", &path(&c)]).await;
    assert_ok(&removed);
    assert_eq!(stdout(&removed), format!("{}\n", path(&a)));

    let missing = work.path().join("not-there");
    assert_fails(
        &run(
            &url,
            state.path(),
            &["dirs", "dirs", "add", &path(&missing)],
        )
        .await,
        4,
        "does not exist",
    );
    assert_fails(
        &run(&url, state.path(), &["dirs", "ghost", "add", &path(&a)]).await,
        3,
        "does not exist",
    );
    // Usage: clap's own code.
    let usage = run(&url, state.path(), &["dirs", "dirs", "add"]).await;
    assert_eq!(usage.status.code(), Some(2));
    server.stop().await;
}

async fn context_round_trips_through_stdin(db: TestDb) {
    let server = TestServer::start(&db).await;
    let url = server.base_url();
    let state = tempfile::tempdir().unwrap();
    let mut put = tether(&url, state.path(), &["context", "put", "web", "s-1"])
        .stdin(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = put.stdin.take().unwrap();
    stdin
        .write_all(br#"{"goal": "ship it", "pendingActions": ["write docs"]}"#)
        .await
        .unwrap();
    drop(stdin);
    let put = put.wait_with_output().await.unwrap();
    assert_ok(&put);
    assert!(stdout(&put).starts_with("saved working context of session s-1"));

    let got = run(
        &url,
        state.path(),
        &["context", "get", "web", "s-1", "--json"],
    )
    .await;
    assert_ok(&got);
    let loaded: Value = serde_json::from_slice(&got.stdout).unwrap();
    assert_eq!(loaded["working"]["goal"], "ship it");
    // Another session of the project is told where to look.
    assert_fails(
        &run(&url, state.path(), &["context", "get", "web", "s-2"]).await,
        3,
        "sessions with one: s-1",
    );

    assert_fails(
        &run(&url, state.path(), &["context", "get", "elsewhere", "s-1"]).await,
        3,
        "no working context",
    );
    let file = state.path().join("bad.json");
    std::fs::write(&file, "{\"goal\": 5}").unwrap();
    assert_fails(
        &run(
            &url,
            state.path(),
            &["context", "put", "web", "s-1", &file.display().to_string()],
        )
        .await,
        2,
        "not a working context",
    );
    server.stop().await;
}

/// Reads `count` JSON lines from a running `tether tail --json`.
async fn read_lines(
    lines: &mut tokio::io::Lines<BufReader<tokio::process::ChildStdout>>,
    count: usize,
) -> Vec<Value> {
    let mut out = Vec::new();
    while out.len() < count {
        let line = tokio::time::timeout(Duration::from_secs(30), lines.next_line())
            .await
            .unwrap_or_else(|_| panic!("stalled after {} lines: {out:?}", out.len()))
            .unwrap()
            .expect("tail is running");
        out.push(serde_json::from_str(&line).unwrap());
    }
    out
}

async fn tail_follows_across_a_server_restart(db: TestDb) {
    let mut server = ServerProcess::start(&db, &[]).await;
    let url = server.base_url();
    let state = tempfile::tempdir().unwrap();
    let client = Client::new(&url).unwrap();
    create(&client, "tailed", "web", &[]).await;

    let mut tail = tether(
        &url,
        state.path(),
        &["tail", "tailed", "--json", "--count", "60"],
    )
    .spawn()
    .unwrap();
    let mut lines = BufReader::new(tail.stdout.take().unwrap()).lines();
    let first = read_lines(&mut lines, 2).await;
    assert!(
        first[0]["snapshot"].is_object(),
        "the session snapshot first: {first:?}"
    );

    produce_titles(&client, "tailed", 0..30).await;
    let mut seen = read_lines(&mut lines, 10).await;
    server.kill().await;
    server.restart().await;
    produce_titles(&client, "tailed", 30..60).await;
    seen.extend(read_lines(&mut lines, 50).await);
    let status = tokio::time::timeout(Duration::from_secs(30), tail.wait())
        .await
        .unwrap()
        .unwrap();
    assert!(status.success(), "--count ends it: {status:?}");

    let titles: Vec<&str> = seen
        .iter()
        .map(|e| e["action"]["title"].as_str().unwrap())
        .collect();
    let expected: Vec<String> = (0..60).map(|i| format!("t{i}")).collect();
    assert_eq!(titles, expected, "no gap, no repeat across the restart");
    let seqs: Vec<u64> = seen
        .iter()
        .map(|e| e["serverSeq"].as_u64().unwrap())
        .collect();
    assert!(seqs.windows(2).all(|w| w[0] < w[1]), "{seqs:?}");
    server.kill().await;
}

async fn tail_from_start_prints_the_whole_transcript(db: TestDb) {
    let server = TestServer::start(&db).await;
    let url = server.base_url();
    let state = tempfile::tempdir().unwrap();
    let client = server.client();
    create(&client, "history", "web", &[]).await;
    produce_titles(&client, "history", 0..5).await;
    let transcript = client.transcript("history", 0, 1000).await.unwrap();
    let total = transcript.envelopes.len();

    // History, then live envelopes, in one ordered run of lines.
    let mut tail = tether(
        &url,
        state.path(),
        &[
            "tail",
            "history",
            "--from-start",
            "--count",
            &(total + 2).to_string(),
        ],
    )
    .spawn()
    .unwrap();
    let mut lines = BufReader::new(tail.stdout.take().unwrap()).lines();
    let mut text = Vec::new();
    for _ in 0..total {
        text.push(lines.next_line().await.unwrap().unwrap());
    }
    produce_titles(&client, "history", 5..7).await;
    while let Some(line) = tokio::time::timeout(Duration::from_secs(30), lines.next_line())
        .await
        .unwrap()
        .unwrap()
    {
        text.push(line);
    }
    assert!(tail.wait().await.unwrap().success());
    assert_eq!(text.len(), total + 2, "{text:#?}");
    assert!(text[0].contains("x-tether/sessionCreated"), "{}", text[0]);
    assert!(text[total + 1].contains("session/titleChanged") && text[total + 1].ends_with("t6"));
    let seqs: Vec<u64> = text
        .iter()
        .map(|l| l.split_whitespace().next().unwrap().parse().unwrap())
        .collect();
    assert!(seqs.windows(2).all(|w| w[0] < w[1]), "{seqs:?}");

    // Failures: unreachable server, unknown session.
    assert_fails(
        &run("http://127.0.0.1:1", state.path(), &["tail", "history"]).await,
        5,
        "cannot reach the server",
    );
    assert_fails(
        &run(&url, state.path(), &["tail", "nope"]).await,
        3,
        "does not exist",
    );
    server.stop().await;
}

async fn tail_follows_chats_created_while_it_runs(db: TestDb) {
    let server = TestServer::start(&db).await;
    let url = server.base_url();
    let state = tempfile::tempdir().unwrap();
    create(&server.client(), "grows", "web", &[]).await;
    let mut tail = tether(
        &url,
        state.path(),
        &["tail", "grows", "--json", "--count", "2"],
    )
    .spawn()
    .unwrap();
    let mut lines = BufReader::new(tail.stdout.take().unwrap()).lines();
    read_lines(&mut lines, 2).await; // the session's and the main chat's snapshots

    let ahp = server.initialized("maker").await;
    let _: Value = ahp
        .request(
            "createChat",
            serde_json::json!({"channel": "ahp-session:/grows", "chat": "ahp-chat:/grows.side"}),
        )
        .await
        .unwrap();
    let turn = serde_json::json!({"type": "chat/turnStarted", "turnId": "s1",
        "startedAt": "2026-11-29T10:00:00.000Z",
        "message": {"text": "on the side", "origin": {"kind": "user"}}});
    // Dispatched once tail has had time to subscribe to the new chat.
    let mut seen = read_lines(&mut lines, 1).await;
    assert_eq!(seen[0]["action"]["type"], "session/chatAdded", "{seen:?}");
    let snapshot = read_lines(&mut lines, 1).await;
    assert_eq!(snapshot[0]["snapshot"]["resource"], "ahp-chat:/grows.side");
    ahp.dispatch("ahp-chat:/grows.side".into(), tether_tests::action(turn))
        .await
        .unwrap();
    seen.extend(read_lines(&mut lines, 1).await);
    assert_eq!(seen[1]["channel"], "ahp-chat:/grows.side");
    assert_eq!(seen[1]["action"]["message"]["text"], "on the side");
    assert!(tail.wait().await.unwrap().success());
    server.stop().await;
}

async fn export_gives_every_envelope_as_jsonl_and_the_conversation_as_markdown(db: TestDb) {
    let server = TestServer::start(&db).await;
    let url = server.base_url();
    let state = tempfile::tempdir().unwrap();
    let client = server.client();
    create(&client, "exported", "web", &[]).await;
    assert_ok(&run(&url, state.path(), &["send", "exported", "hello **echo**"]).await);
    // More than one page of the store (1,000), so the export pages through.
    produce_titles(&client, "exported", 0..1100).await;
    assert_ok(&run(&url, state.path(), &["send", "exported", "and again"]).await);

    // The whole transcript, page by page, as the transcript endpoint gives it.
    let mut expected: Vec<Value> = Vec::new();
    let mut after = 0;
    loop {
        let page = client.transcript("exported", after, 1000).await.unwrap();
        expected.extend(page.envelopes);
        match page.next_after {
            Some(next) => after = next,
            None => break,
        }
    }
    assert!(expected.len() > 1100, "{}", expected.len());

    // JSON Lines over REST: every envelope, once, in order, as JSON.
    let response = reqwest::get(format!("{url}/v1/sessions/exported/export"))
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(response.headers()["content-type"], "application/jsonl");
    assert_eq!(
        response.headers()["content-disposition"],
        "attachment; filename=\"exported.jsonl\""
    );
    let body = response.text().await.unwrap();
    let exported: Vec<Value> = body
        .lines()
        .map(|line| serde_json::from_str(line).expect("each line is one JSON envelope"))
        .collect();
    assert_eq!(exported, expected, "the export round-trips every envelope");

    // The command line prints the same bytes.
    let cli = run(&url, state.path(), &["export", "exported"]).await;
    assert_ok(&cli);
    assert_eq!(stdout(&cli), body);

    // Markdown: the conversation as a person reads it.
    let markdown = run(
        &url,
        state.path(),
        &["export", "exported", "--format", "markdown"],
    )
    .await;
    assert_ok(&markdown);
    let text = stdout(&markdown);
    assert!(
        text.starts_with("# t1099\n"),
        "{}",
        &text[..200.min(text.len())]
    );
    assert!(
        text.contains(&format!("{} envelopes", expected.len())),
        "{text}"
    );
    assert_eq!(text.matches("## You").count(), 2, "{text}");
    assert!(
        text.contains("hello **echo**\n\n## Agent\n\nhello **echo**"),
        "{text}"
    );
    assert!(text.contains("and again"), "{text}");
    let response = reqwest::get(format!("{url}/v1/sessions/exported/export?format=markdown"))
        .await
        .unwrap();
    assert_eq!(
        response.headers()["content-type"],
        "text/markdown; charset=utf-8"
    );
    assert_eq!(response.text().await.unwrap(), text);

    // Clear refusals: an unknown format, an unknown session.
    let refused = reqwest::get(format!("{url}/v1/sessions/exported/export?format=pdf"))
        .await
        .unwrap();
    assert_eq!(refused.status(), 400);
    let problem: Value = refused.json().await.unwrap();
    assert!(
        problem["detail"]
            .as_str()
            .unwrap()
            .contains("jsonl or markdown"),
        "{problem}"
    );
    assert_fails(
        &run(&url, state.path(), &["export", "nope"]).await,
        3,
        "does not exist",
    );
    server.stop().await;
}
