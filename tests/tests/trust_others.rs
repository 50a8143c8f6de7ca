//! What a principal reaches of what is not its own, through the real
//! binary on both backends (SECURITY.md): no session works in the agents'
//! scratch root, where every session's agent HOME is (its logins), and a
//! session of another project answers every command exactly as a missing
//! one, also while it is in memory on the host.

use std::path::PathBuf;

use serde_json::{Value, json};
use tether_server::auth::Role;
use tether_tests::{ServerProcess, TestDb, backend_tests};

backend_tests!(
    no_session_works_where_the_agents_homes_are,
    another_projects_session_in_memory_answers_as_a_missing_one,
);

const SECRET: &str = "a test secret of another project's, well over 32 bytes";

fn mint(sub: &str, role: Role, projects: &[&str]) -> String {
    tether_tests::mint(SECRET, sub, role, projects)
}

async fn create(base: &str, token: Option<&str>, body: Value) -> (u16, Value) {
    let mut request = reqwest::Client::new()
        .post(format!("{base}/v1/sessions"))
        .json(&body);
    if let Some(token) = token {
        request = request.bearer_auth(token);
    }
    let response = request.send().await.unwrap();
    let status = response.status().as_u16();
    (status, response.json().await.unwrap_or(Value::Null))
}

/// A default install (no allowed roots): the scratch root, a directory in
/// it (another session's HOME) and one holding it are refused, at creation
/// and as a directory added later; nothing refused is recorded.
async fn no_session_works_where_the_agents_homes_are(db: TestDb) {
    let top = tempfile::tempdir().unwrap();
    let top: PathBuf = top.path().canonicalize().unwrap();
    let scratch = top.join("scratch");
    let work = top.join("work");
    let home = scratch.join("s-victim");
    for dir in [&work, &home] {
        std::fs::create_dir_all(dir).unwrap();
    }
    let server =
        ServerProcess::start(&db, &["--agent-scratch-dir", scratch.to_str().unwrap()]).await;
    let base = server.base_url();
    for (n, dir) in [&scratch, &home, &top].into_iter().enumerate() {
        let id = format!("in-{n}");
        let (status, answer) = create(
            &base,
            None,
            json!({"id": id, "provider": "echo", "workingDirectories": [dir]}),
        )
        .await;
        tether_tests::assert_refused(status, &answer, 422, "agents' scratch directories");
        let (status, _) = reqwest::get(format!("{base}/v1/sessions/{id}"))
            .await
            .map(|r| (r.status().as_u16(), ()))
            .unwrap();
        assert_eq!(status, 404, "{} was not recorded", dir.display());
    }
    let (status, answer) = create(
        &base,
        None,
        json!({"id": "ok", "provider": "echo", "workingDirectories": [work]}),
    )
    .await;
    assert_eq!(status, 201, "{answer}");
    let body = json!({"clientId": "c", "clientSeq": 1, "channel": "ahp-session:/ok",
        "action": {"type": "session/workingDirectorySet",
                   "directory": format!("file://{}", home.display())}});
    let response = reqwest::Client::new()
        .post(format!("{base}/v1/sessions/ok/actions"))
        .json(&body)
        .send()
        .await
        .unwrap();
    let status = response.status().as_u16();
    let answer: Value = response.json().await.unwrap();
    assert_eq!(status, 422, "{answer}");
    assert!(
        answer.to_string().contains("agents' scratch directories"),
        "{answer}"
    );
    let view: Value = reqwest::get(format!("{base}/v1/sessions/ok"))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(view["workingDirectories"].as_array().map(Vec::len), Some(1));
}

/// Bob's session is in memory on the host (he just wrote to it); Alice,
/// of another project, is answered for it exactly as for an id nobody
/// made: a dispatch with a client number she already used (no earlier
/// outcome is told), and the completions of its chat (its session is not
/// named).
async fn another_projects_session_in_memory_answers_as_a_missing_one(db: TestDb) {
    let dir = tempfile::tempdir().unwrap();
    let secret = dir.path().join("secret");
    std::fs::write(&secret, SECRET).unwrap();
    let server = ServerProcess::start(&db, &["--auth-secret-file", secret.to_str().unwrap()]).await;
    let base = server.base_url();
    let (alice, bob) = (
        mint("alice", Role::Operator, &["a"]),
        mint("bob", Role::Operator, &["b"]),
    );
    for (token, id, project) in [(&alice, "a-own", "a"), (&bob, "b-live", "b")] {
        let (status, answer) = create(
            &base,
            Some(token),
            json!({"id": id, "provider": "echo", "project": project}),
        )
        .await;
        assert_eq!(status, 201, "{answer}");
    }
    let bobs = tether_tests::ahp_with_token(&server.ws_url(), &bob, "bob", Vec::new()).await;
    let title = json!({"channel": "ahp-session:/b-live", "clientSeq": 1,
        "action": {"type": "session/titleChanged", "title": "bob's plan"}});
    bobs.request::<_, Value>("dispatchAction", title)
        .await
        .expect("bob writes his own session");

    let a = tether_tests::ahp_with_token(&server.ws_url(), &alice, "alice", Vec::new()).await;
    let own = json!({"channel": "ahp-session:/a-own", "clientSeq": 1,
        "action": {"type": "session/titleChanged", "title": "mine"}});
    a.request::<_, Value>("dispatchAction", own)
        .await
        .expect("alice writes her own session");
    // Keys typed into a terminal act before their commit: a number seen
    // before is looked up as a possible retry.
    let answer = |channel: &str| {
        let params = json!({"channel": channel, "clientSeq": 1,
            "action": {"type": "terminal/input", "data": "ls\n"}});
        let a = &a;
        async move {
            format!(
                "{:?}",
                a.request::<_, Value>("dispatchAction", params).await
            )
        }
    };
    let theirs = answer("ahp-terminal:/b-live/console-1").await;
    let nobodys = answer("ahp-terminal:/b-none/console-1").await;
    assert!(theirs.contains("does not exist"), "{theirs}");
    assert_eq!(
        theirs.replace("b-live", "X"),
        nobodys.replace("b-none", "X"),
        "another project's session in memory answers as a missing one"
    );

    let completions = |chat: &str| {
        let params = json!({"channel": chat, "kind": "userMessage", "text": "/", "offset": 1});
        let a = &a;
        async move { format!("{:?}", a.request::<_, Value>("completions", params).await) }
    };
    let theirs = completions("ahp-chat:/b-live.main").await;
    let nobodys = completions("ahp-chat:/b-none.main").await;
    assert!(!theirs.contains("ahp-session:/b-live"), "{theirs}");
    assert_eq!(
        theirs.replace("b-live", "X"),
        nobodys.replace("b-none", "X"),
        "another project's chat answers as a missing one"
    );
    // Bob's session is as he left it.
    let view: Value = reqwest::Client::new()
        .get(format!("{base}/v1/sessions/b-live"))
        .bearer_auth(&bob)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(view["title"], "bob's plan");
}
