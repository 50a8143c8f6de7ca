//! Search over transcripts, through the real binary on both backends: what
//! was said a moment ago is found (a streamed answer too, its words cut
//! across deltas, a long one in pieces that are one hit and whose words
//! match together however far apart), phrases, prefixes and non-Latin
//! text work, no query
//! breaks the backend's syntax, filters narrow, pages follow; what was
//! written before the index existed is indexed when a host starts; and on
//! several hosts, what one host commits is found through the other.
//! (Another project's sessions never show: `security.rs`.)

use std::path::Path;
use std::process::Stdio;

use serde_json::{Value, json};

use tether_tests::ahp_raw::Ahp;
use tether_tests::{ServerProcess, TestDb, backend_tests, seed, tether_bin};

backend_tests!(
    what_was_said_a_moment_ago_is_found_with_its_place,
    phrases_prefixes_filters_and_any_script,
    transcripts_written_before_the_index_are_indexed_at_start,
);

const FAKE: &str = env!("CARGO_BIN_EXE_fake-acp-agent");

fn agent(log: &Path) -> String {
    format!("fake=FAKE_ACP_LOG={} {FAKE}", log.display())
}

async fn search(base: &str, query: &str) -> Value {
    let response = reqwest::Client::new()
        .get(format!("{base}/v1/search"))
        .query(&[("q", query)])
        .send()
        .await
        .expect("GET /v1/search");
    assert_eq!(response.status(), 200, "{query}");
    response.json().await.expect("JSON")
}

async fn search_with(base: &str, params: &[(&str, &str)]) -> (u16, Value) {
    let response = reqwest::Client::new()
        .get(format!("{base}/v1/search"))
        .query(params)
        .send()
        .await
        .expect("GET /v1/search");
    let status = response.status().as_u16();
    (status, response.json().await.expect("JSON"))
}

/// `(sessionId, kind, turnId)` of each hit.
fn places(found: &Value) -> Vec<(String, String, String)> {
    found["items"]
        .as_array()
        .expect("items")
        .iter()
        .map(|h| {
            (
                h["sessionId"].as_str().unwrap_or_default().to_owned(),
                h["kind"].as_str().unwrap_or_default().to_owned(),
                h["turnId"].as_str().unwrap_or_default().to_owned(),
            )
        })
        .collect()
}

/// Searches for `query`, which must find only the long answer of
/// `ledger`'s turn `t3`, and gives the hit's snippet.
async fn only_the_long_answer(base: &str, query: &str) -> String {
    let found = search(base, query).await;
    assert_eq!(
        places(&found),
        [("ledger".into(), "answer".into(), "t3".into())],
        "{query}: {found}"
    );
    found["items"][0]["snippet"].as_str().unwrap().to_owned()
}

async fn session(ahp: &mut Ahp, id: &str, project: &str) {
    ahp.call(
        "createSession",
        json!({"channel": format!("ahp-session:/{id}"), "provider": "fake",
               "_meta": {"tether/project": project}}),
    )
    .await
    .unwrap();
    ahp.call(
        "subscribe",
        json!({"channel": format!("ahp-chat:/{id}.main")}),
    )
    .await
    .unwrap();
}

async fn what_was_said_a_moment_ago_is_found_with_its_place(db: TestDb) {
    let dir = tempfile::tempdir().unwrap();
    let server = ServerProcess::start(
        &db,
        &[
            "--agent",
            &agent(&dir.path().join("agent.log")),
            "--agent-confinement",
            "off",
        ],
    )
    .await;
    let base = server.base_url();
    let mut ahp = Ahp::connect(&server.ws_url(), "search-test").await;
    session(&mut ahp, "ledger", "books").await;
    // The agent streams the words back three characters at a time.
    let answer = ahp
        .ask(
            "ahp-chat:/ledger.main",
            "t1",
            "split the quarterly reconciliation spreadsheet",
            None,
        )
        .await;
    assert_eq!(answer, "the quarterly reconciliation spreadsheet");

    let found = search(&base, "reconciliation").await;
    let mut kinds: Vec<(String, String, String)> = places(&found);
    kinds.sort();
    assert_eq!(
        kinds,
        [
            ("ledger".into(), "answer".into(), "t1".into()),
            ("ledger".into(), "message".into(), "t1".into()),
        ],
        "the message and the streamed answer, whose word no single delta holds: {found}"
    );
    let hit = &found["items"][0];
    assert_eq!(hit["chat"], "ahp-chat:/ledger.main");
    assert_eq!(hit["project"], "books");
    assert_eq!(hit["agent"], "fake");
    assert!(hit["seq"].as_u64().unwrap() > 0);
    assert!(
        hit["snippetHtml"]
            .as_str()
            .unwrap()
            .contains("<mark>reconciliation</mark>"),
        "{hit}"
    );
    assert!(hit["snippet"].as_str().unwrap().contains("reconciliation"));
    // The hit's seq is an envelope of that session's transcript.
    let transcript: Value = reqwest::get(format!("{base}/v1/sessions/ledger/transcript"))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let seqs: Vec<u64> = transcript["envelopes"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|e| e["serverSeq"].as_u64())
        .collect();
    for hit in found["items"].as_array().unwrap() {
        assert!(seqs.contains(&hit["seq"].as_u64().unwrap()), "{hit}");
    }

    // An answer longer than a document, streamed: every word of it is
    // found, the last too, in the piece that holds it (a delta rewrites
    // only the piece it extends).
    let long = ahp
        .ask("ahp-chat:/ledger.main", "t3", "flood 14000", None)
        .await;
    assert!(
        long.len() > tether_protocol::search::MAX_DOC_BYTES,
        "{} bytes",
        long.len()
    );
    for word in ["1", "7001", "13999"] {
        let snippet = only_the_long_answer(&base, word).await;
        assert!(snippet.contains(word), "{word}: {snippet}");
    }
    // Across a piece's end: the last word of one piece and the first of
    // the next are found as a phrase (the later piece holds the end of the
    // one before), and the word both pieces hold is one hit, not two.
    let ranges = tether_protocol::search::pieces(&long);
    assert!(ranges.len() > 2, "{ranges:?}");
    let last = long[ranges[0].clone()].split_whitespace().last().unwrap();
    let first = long[ranges[1].clone()].split_whitespace().next().unwrap();
    for query in [format!("\"{last} {first}\""), last.to_owned()] {
        only_the_long_answer(&base, &query).await;
    }

    // Words of one answer far apart, in pieces 60 KiB apart, are found
    // together, as that answer's one hit; a word of another turn's answer
    // or of the turn's own message does not complete a query, and a word
    // said nowhere leaves nothing.
    for query in ["1 13999", "13999 \"7001 7002\" 1"] {
        let snippet = only_the_long_answer(&base, query).await;
        assert!(
            query
                .split([' ', '"'])
                .any(|w| !w.is_empty() && snippet.contains(w)),
            "{query}: {snippet}"
        );
    }
    for query in ["1 quarterly", "flood 13999", "13999 nowhere", "\"1 13999\""] {
        let found = search(&base, query).await;
        assert_eq!(places(&found), [], "{query}: {found}");
    }
    // Filters hold for them as for any hit.
    for (filter, value) in [("project", "elsewhere"), ("agent", "other")] {
        let (status, found) = search_with(&base, &[("q", "1 13999"), (filter, value)]).await;
        assert_eq!((status, places(&found)), (200, vec![]), "{filter}: {found}");
    }

    // A tool call's title, and the command line.
    ahp.ask("ahp-chat:/ledger.main", "t2", "tool", None).await;
    assert_eq!(
        places(&search(&base, "notes.txt").await),
        [("ledger".into(), "tool".into(), "t2".into())]
    );
    let output = tokio::process::Command::new(tether_bin())
        .args(["search", "spreadsheet", "--url", &base])
        .env("XDG_STATE_HOME", dir.path())
        .stdin(Stdio::null())
        .output()
        .await
        .unwrap();
    assert!(output.status.success(), "{output:?}");
    let printed = String::from_utf8_lossy(&output.stdout);
    assert!(printed.starts_with("SESSION"), "{printed}");
    assert!(printed.contains("[spreadsheet]"), "{printed}");
    assert_eq!(
        printed.lines().count(),
        3,
        "a header and two hits: {printed}"
    );
    let json_out = tokio::process::Command::new(tether_bin())
        .args(["search", "nothing-like-this", "--url", &base, "--json"])
        .env("XDG_STATE_HOME", dir.path())
        .stdin(Stdio::null())
        .output()
        .await
        .unwrap();
    assert!(json_out.status.success());
    assert_eq!(String::from_utf8_lossy(&json_out.stdout).trim(), "[]");
}

async fn phrases_prefixes_filters_and_any_script(db: TestDb) {
    let dir = tempfile::tempdir().unwrap();
    let server = ServerProcess::start(
        &db,
        &[
            "--agent",
            &agent(&dir.path().join("agent.log")),
            "--agent-confinement",
            "off",
        ],
    )
    .await;
    let base = server.base_url();
    let mut ahp = Ahp::connect(&server.ws_url(), "search-test").await;
    session(&mut ahp, "alpha", "one").await;
    session(&mut ahp, "beta", "two").await;
    ahp.ask("ahp-chat:/alpha.main", "a1", "split flux capacitor", None)
        .await;
    ahp.ask("ahp-chat:/beta.main", "b1", "split capacitor flux", None)
        .await;
    ahp.ask(
        "ahp-chat:/beta.main",
        "b2",
        "split Привет, мир! 東京タワー Café",
        None,
    )
    .await;

    let sessions = |found: &Value| -> Vec<String> {
        let mut s: Vec<String> = places(found).into_iter().map(|p| p.0).collect();
        s.sort();
        s.dedup();
        s
    };
    // Words in any order; a phrase in order.
    assert_eq!(
        sessions(&search(&base, "capacitor flux").await),
        ["alpha", "beta"]
    );
    assert_eq!(
        sessions(&search(&base, "\"flux capacitor\"").await),
        ["alpha"]
    );
    assert_eq!(
        sessions(&search(&base, "\"capacitor flux\"").await),
        ["beta"]
    );
    // Prefixes; case does not matter.
    assert_eq!(sessions(&search(&base, "CAPAC*").await), ["alpha", "beta"]);
    assert_eq!(
        sessions(&search(&base, "capac").await),
        Vec::<String>::new()
    );
    // Other scripts.
    for word in ["мир", "привет", "東京タワー", "café", "CAFÉ"] {
        assert_eq!(sessions(&search(&base, word).await), ["beta"], "{word}");
    }
    // Nothing a person types breaks the query.
    for odd in [
        "\"unclosed flux",
        "flux\" OR \"x",
        "NEAR(flux capacitor)",
        "flux' OR 1=1 --",
        "flux AND",
        "-flux",
        "flux:*",
        "a\\b",
    ] {
        let (status, found) = search_with(&base, &[("q", odd)]).await;
        assert_eq!(status, 200, "{odd}: {found}");
    }
    for (params, needle) in [
        (vec![("q", " \" * ")], "no words"),
        (vec![("q", "x"), ("limit", "0")], "limit"),
        (vec![("q", "x"), ("since", "yesterday")], "RFC 3339"),
        (vec![("q", "x"), ("state", "asleep")], "state"),
        (vec![("q", "x"), ("cursor", "99999")], "cursor"),
    ] {
        let (status, problem) = search_with(&base, &params).await;
        assert_eq!(status, 422, "{params:?}: {problem}");
        assert!(
            problem["detail"]
                .as_str()
                .unwrap_or_default()
                .contains(needle),
            "{params:?}: {problem}"
        );
    }

    let (status, problem) = search_with(&base, &[]).await;
    assert_eq!(status, 400, "q is required: {problem}");
    assert!(
        problem["detail"].as_str().unwrap_or_default().contains("q"),
        "{problem}"
    );

    // Filters: project, agent, state, time.
    let (_, found) = search_with(&base, &[("q", "capacitor"), ("project", "two")]).await;
    assert_eq!(sessions(&found), ["beta"]);
    let (_, found) = search_with(&base, &[("q", "capacitor"), ("agent", "echo")]).await;
    assert_eq!(sessions(&found), Vec::<String>::new());
    let (_, found) = search_with(&base, &[("q", "capacitor"), ("state", "live")]).await;
    assert_eq!(sessions(&found), ["alpha", "beta"]);
    let (_, found) = search_with(&base, &[("q", "capacitor"), ("state", "ended")]).await;
    assert_eq!(sessions(&found), Vec::<String>::new());
    let (_, found) = search_with(
        &base,
        &[("q", "capacitor"), ("since", "2099-01-01T00:00:00Z")],
    )
    .await;
    assert_eq!(sessions(&found), Vec::<String>::new());
    let (_, found) = search_with(
        &base,
        &[("q", "capacitor"), ("until", "2099-01-01T00:00:00Z")],
    )
    .await;
    assert_eq!(sessions(&found), ["alpha", "beta"]);

    // Pages: one hit each, every hit once.
    let mut seen = Vec::new();
    let mut cursor: Option<String> = None;
    loop {
        let mut params = vec![("q", "capacitor"), ("limit", "1")];
        if let Some(c) = &cursor {
            params.push(("cursor", c.as_str()));
        }
        let (status, page) = search_with(&base, &params).await;
        assert_eq!(status, 200);
        assert!(page["items"].as_array().unwrap().len() <= 1);
        seen.extend(places(&page));
        match page["nextCursor"].as_str() {
            Some(c) => cursor = Some(c.to_owned()),
            None => break,
        }
    }
    let whole = places(&search(&base, "capacitor").await);
    assert_eq!(seen.len(), whole.len(), "{seen:?}");
    assert_eq!(whole.len(), 4, "two messages, two answers: {whole:?}");
}

async fn transcripts_written_before_the_index_are_indexed_at_start(db: TestDb) {
    // Sessions and turns written as a store without the index would have:
    // no documents; the migration that made the index lists them pending.
    seed::seed(db.url(), 3, 30).await;
    db.execute("DELETE FROM search_docs").await;
    db.execute("INSERT INTO search_pending (session_id) SELECT id FROM sessions")
        .await;
    let before = db.count("SELECT count(*) FROM search_docs").await;
    assert_eq!(before, 0, "nothing indexed before the host starts");
    let server = ServerProcess::start(&db, &[]).await;
    let base = server.base_url();
    // The host indexes in the background: soon, every seeded session.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    loop {
        let found = search(&base, "question").await;
        let mut sessions: Vec<String> = places(&found).into_iter().map(|p| p.0).collect();
        sessions.sort();
        sessions.dedup();
        if sessions.len() == 3 {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "not indexed: {found}");
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    // Written in bulk: Postgres's planner statistics are refreshed after
    // (its common-word plans were many times slower without them).
    if db.backend() == tether_tests::Backend::Postgres {
        let analyzed = "SELECT count(*) FROM pg_stat_user_tables \
                        WHERE relname = 'search_docs' AND last_analyze IS NOT NULL";
        while db.count(analyzed).await == 0 {
            assert!(
                std::time::Instant::now() < deadline,
                "the index was built, the statistics never refreshed"
            );
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
    }
    // Titles too: the latest of each session.
    let found = search(&base, "title").await;
    assert_eq!(places(&found).len(), 3, "{found}");
    assert!(
        found["items"]
            .as_array()
            .unwrap()
            .iter()
            .all(|h| h["kind"] == "title"),
        "{found}"
    );
}

/// Two hosts on one Postgres: a word committed through one is found
/// through the other at once.
#[tokio::test]
async fn what_one_host_commits_the_other_finds_at_once() {
    let Some(db) = TestDb::postgres().await else {
        return;
    };
    let first = ServerProcess::start(&db, &[]).await;
    let second = ServerProcess::start(&db, &[]).await;
    tether_tests::create_session(&first.base_url(), "shared", "echo").await;
    let answer = first
        .client()
        .dispatch(
            "shared",
            &tether_protocol::rest::DispatchRequest {
                client_id: "writer".into(),
                client_seq: 1,
                channel: None,
                action: json!({"type": "session/titleChanged", "title": "kumquat harvest"}),
            },
        )
        .await
        .expect("accepted");
    let found = search(&second.base_url(), "kumquat").await;
    assert_eq!(
        places(&found),
        [("shared".into(), "title".into(), String::new())],
        "{found}"
    );
    assert_eq!(found["items"][0]["seq"], answer.server_seq);
}
