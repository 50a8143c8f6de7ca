//! What an agent does to files, as AHP clients see it, through the real
//! binary on both backends: the scripted agent edits a file (an ACP
//! `Diff`) and writes one through the host's `fs/write_text_file`; each
//! is a `FileEdit` with both sides stored once, in the turn's changeset
//! (`ahp-changeset:/<session>/<turn>`); reads and writes outside the
//! session's directories are refused; a client reverts a changeset, and a
//! file changed since is left alone.

use std::path::Path;

use serde_json::{Value, json};
use tether_tests::ahp_raw::Ahp;
use tether_tests::{ServerProcess, TestDb, alive, backend_tests, gone};

backend_tests!(
    file_edits_are_changesets_with_both_sides_and_clients_revert_them,
    the_hosts_file_access_stays_in_the_sessions_directories,
    terminals_run_confined_stream_their_output_and_end_at_their_limit,
    a_command_a_killed_server_left_running_is_stopped_at_its_next_start,
);

const FAKE: &str = env!("CARGO_BIN_EXE_fake-acp-agent");

async fn start(db: &TestDb, ahp_id: &str, session: &str, dir: &Path) -> (ServerProcess, Ahp) {
    start_with(db, ahp_id, session, dir, &[]).await
}

async fn start_with(
    db: &TestDb,
    ahp_id: &str,
    session: &str,
    dir: &Path,
    flags: &[&str],
) -> (ServerProcess, Ahp) {
    let spec = format!("fake={FAKE}");
    let mut args = vec!["--agent", spec.as_str()];
    args.extend_from_slice(flags);
    let server = ServerProcess::start(db, &args).await;
    let response = reqwest::Client::new()
        .post(format!("{}/v1/sessions", server.base_url()))
        .json(&json!({"id": session, "provider": "fake", "workingDirectories": [dir]}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status().as_u16(), 201);
    let mut ahp = Ahp::connect(&server.ws_url(), ahp_id).await;
    for channel in [
        format!("ahp-session:/{session}"),
        format!("ahp-chat:/{session}.main"),
    ] {
        ahp.call("subscribe", json!({"channel": channel}))
            .await
            .unwrap();
    }
    (server, ahp)
}

async fn stored(base: &str, session: &str, uri: &Value) -> String {
    let digest = uri
        .as_str()
        .and_then(|u| u.strip_prefix("tether-attachment:"))
        .unwrap_or_else(|| panic!("{uri} is a stored attachment"));
    reqwest::get(format!("{base}/v1/sessions/{session}/attachments/{digest}"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap()
}

fn file_uri(path: &Path) -> String {
    format!("file://{}", path.display())
}

async fn file_edits_are_changesets_with_both_sides_and_clients_revert_them(db: TestDb) {
    let dir = tempfile::tempdir().unwrap();
    let work = dir.path().canonicalize().unwrap();
    let a = work.join("a.txt");
    std::fs::write(&a, "one\ntwo\n").unwrap();
    let (server, mut ahp) = start(&db, "reviewer", "ed", &work).await;
    let base = server.base_url();
    let chat = "ahp-chat:/ed.main";

    // The agent edits a.txt itself and reports the diff.
    let said = ahp
        .ask(
            chat,
            "t1",
            &format!("edit {} one\\nTWO\\nthree\\n", a.display()),
            None,
        )
        .await;
    assert_eq!(said, "edited");
    let done = ahp
        .action("chat/toolCallComplete", |a| a["turnId"] == "t1")
        .await;
    let edit = &done["result"]["content"][0];
    assert_eq!(edit["type"], "fileEdit", "{done}");
    assert_eq!(edit["before"]["uri"], file_uri(&a));
    assert_eq!(edit["after"]["uri"], file_uri(&a));
    assert_eq!(edit["diff"], json!({"added": 2, "removed": 1}));
    assert_eq!(
        stored(&base, "ed", &edit["before"]["content"]["uri"]).await,
        "one\ntwo\n"
    );
    assert_eq!(
        stored(&base, "ed", &edit["after"]["content"]["uri"]).await,
        "one\nTWO\nthree\n"
    );
    let catalogue = ahp.action("session/changesetsChanged", |_| true).await;
    assert_eq!(
        catalogue["changesets"][0]["uriTemplate"],
        "ahp-changeset:/ed/{turnId}"
    );
    assert_eq!(catalogue["changesets"][0]["changeKind"], "turn");
    let snapshot = ahp
        .call("subscribe", json!({"channel": "ahp-changeset:/ed/t1"}))
        .await
        .unwrap();
    let changeset = &snapshot["snapshot"]["state"];
    assert_eq!(changeset["status"], "ready");
    assert_eq!(changeset["files"][0]["id"], file_uri(&a), "{changeset}");
    assert_eq!(changeset["files"][0]["edit"]["diff"]["added"], 2);
    assert_eq!(changeset["operations"][0]["id"], "revert");
    let session: Value = reqwest::get(format!("{base}/v1/sessions/ed"))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(session["turns"], 1);

    // A write through the host's fs/write_text_file is a FileEdit too: a
    // created file has no before side.
    let b = work.join("sub/b.txt");
    let said = ahp
        .ask(
            chat,
            "t2",
            &format!("fs-write {} hello there", b.display()),
            None,
        )
        .await;
    assert_eq!(said, format!("fs-write {}: ok", b.display()));
    assert_eq!(std::fs::read_to_string(&b).unwrap(), "hello there");
    let t2 = ahp
        .call("subscribe", json!({"channel": "ahp-changeset:/ed/t2"}))
        .await
        .unwrap();
    let created = &t2["snapshot"]["state"]["files"][0];
    assert_eq!(created["id"], file_uri(&b), "{t2}");
    assert!(created["edit"].get("before").is_none(), "{created}");
    assert_eq!(created["edit"]["diff"]["added"], 1);
    let said = ahp
        .ask(chat, "t3", &format!("fs-read {}", b.display()), None)
        .await;
    assert_eq!(said, format!("fs-read {}: hello there", b.display()));

    // A revert is refused while the file differs from the agent's edit,
    // and leaves it alone.
    std::fs::write(&a, "someone else's\n").unwrap();
    let refused = ahp
        .call(
            "invokeChangesetOperation",
            json!({"channel": "ahp-changeset:/ed/t1", "operationId": "revert"}),
        )
        .await
        .unwrap_err();
    assert!(refused.contains("changed since"), "{refused}");
    assert_eq!(std::fs::read_to_string(&a).unwrap(), "someone else's\n");
    let unknown = ahp
        .call(
            "invokeChangesetOperation",
            json!({"channel": "ahp-changeset:/ed/t1", "operationId": "stage"}),
        )
        .await
        .unwrap_err();
    assert!(unknown.contains("not offered"), "{unknown}");

    // Put back as the agent left it: the revert writes the old text.
    std::fs::write(&a, "one\nTWO\nthree\n").unwrap();
    let reverted = ahp
        .call(
            "invokeChangesetOperation",
            json!({"channel": "ahp-changeset:/ed/t1", "operationId": "revert",
                   "target": {"kind": "resource", "resource": file_uri(&a)}}),
        )
        .await
        .unwrap();
    assert_eq!(reverted["message"], "Reverted 1 file.");
    assert_eq!(std::fs::read_to_string(&a).unwrap(), "one\ntwo\n");
    ahp.action("changeset/fileRemoved", |x| x["fileId"] == file_uri(&a))
        .await;
    // The whole of t2: the file it created is removed.
    ahp.call(
        "invokeChangesetOperation",
        json!({"channel": "ahp-changeset:/ed/t2", "operationId": "revert"}),
    )
    .await
    .unwrap();
    assert!(!b.exists());

    // After a restart the changesets are as they were left.
    drop(ahp);
    let mut server = server;
    server.restart().await;
    let mut ahp = Ahp::connect(&server.ws_url(), "later").await;
    let snapshot = ahp
        .call("subscribe", json!({"channel": "ahp-changeset:/ed/t1"}))
        .await
        .unwrap();
    assert_eq!(snapshot["snapshot"]["state"]["files"], json!([]));
    let other = ahp
        .call("subscribe", json!({"channel": "ahp-changeset:/nobody/t1"}))
        .await;
    assert!(other.is_err(), "{other:?}");

    // The export takes the changesets out with the conversation.
    let exported = exported(&server.base_url(), "ed").await;
    for turn in ["t1", "t2"] {
        let channel = format!("ahp-changeset:/ed/{turn}");
        assert!(
            exported.iter().any(|e| e["channel"] == channel.as_str()
                && e["action"]["type"] == "changeset/fileRemoved"),
            "{channel}'s revert is exported"
        );
    }
}

/// A session's JSON Lines export, checked to be in seq order, each
/// envelope once.
async fn exported(base: &str, session: &str) -> Vec<Value> {
    let body = reqwest::get(format!("{base}/v1/sessions/{session}/export"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let exported: Vec<Value> = body
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect();
    let seqs: Vec<u64> = exported
        .iter()
        .map(|e| e["serverSeq"].as_u64().unwrap())
        .collect();
    assert!(seqs.windows(2).all(|w| w[0] < w[1]), "{seqs:?}");
    exported
}

async fn the_hosts_file_access_stays_in_the_sessions_directories(db: TestDb) {
    let dir = tempfile::tempdir().unwrap();
    let outside = tempfile::tempdir().unwrap();
    let work = dir.path().canonicalize().unwrap();
    let secret = outside.path().canonicalize().unwrap().join("secret");
    std::fs::write(&secret, "no").unwrap();
    std::os::unix::fs::symlink(outside.path(), work.join("link")).unwrap();
    let (_server, mut ahp) = start(&db, "watcher", "fs", &work).await;
    let chat = "ahp-chat:/fs.main";
    for (turn, script) in [
        ("t1", format!("fs-read {}", secret.display())),
        ("t2", format!("fs-read {}/link/secret", work.display())),
        ("t3", format!("fs-write {} overwritten", secret.display())),
        ("t4", format!("fs-write {}/../escape yes", work.display())),
    ] {
        let said = ahp.ask(chat, turn, &script, None).await;
        assert!(said.contains(": error "), "{script}: {said}");
    }
    assert_eq!(std::fs::read_to_string(&secret).unwrap(), "no");
    assert!(!work.parent().unwrap().join("escape").exists());
    let view = ahp
        .call("subscribe", json!({"channel": "ahp-changeset:/fs/t3"}))
        .await
        .unwrap();
    assert_eq!(view["snapshot"]["state"]["files"], json!([]));
}

async fn terminals_run_confined_stream_their_output_and_end_at_their_limit(db: TestDb) {
    let dir = tempfile::tempdir().unwrap();
    let outside = tempfile::tempdir().unwrap();
    let work = dir.path().canonicalize().unwrap();
    let flags = [
        "--agent-confinement",
        "require",
        "--terminal-timeout-secs",
        "2",
    ];
    let (server, mut ahp) = start_with(&db, "ops", "tm", &work, &flags).await;
    let chat = "ahp-chat:/tm.main";

    // The agent runs a command; its tool call shows the terminal, whose
    // state has the output and the exit.
    let said = ahp
        .ask(chat, "t1", "term sh -c pwd;echo${IFS}hello", None)
        .await;
    assert_eq!(said, format!("exit 0: {}\nhello", work.display()));
    let started = ahp
        .action("chat/toolCallStart", |a| a["turnId"] == "t1")
        .await;
    let done = ahp
        .action("chat/toolCallContentChanged", |a| a["turnId"] == "t1")
        .await;
    let content = &done["content"][0];
    assert_eq!(content["type"], "terminal", "{done}");
    assert_eq!(content["title"], "sh -c pwd;echo${IFS}hello");
    let terminal = content["resource"].as_str().unwrap().to_owned();
    assert!(terminal.starts_with("ahp-terminal:/tm/t-"), "{terminal}");
    assert_eq!(started["toolName"], "execute");
    let state = ahp
        .call("subscribe", json!({"channel": terminal}))
        .await
        .unwrap()["snapshot"]["state"]
        .clone();
    let output: String = state["content"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|p| p["value"].as_str())
        .collect();
    assert_eq!(output, format!("{}\nhello\n", work.display()), "{state}");
    assert_eq!(
        state["lifecycle"],
        json!({"status": "exited", "exitCode": 0})
    );
    assert_eq!(state["claim"]["kind"], "session");
    assert_eq!(state["claim"]["turnId"], "t1");

    // Past the time limit it is killed, and says so.
    let said = ahp.ask(chat, "t2", "term sleep 30", None).await;
    assert!(said.starts_with("signal"), "{said}");
    assert!(said.contains("time limit of 2 s"), "{said}");

    // Confined: it cannot write outside the session, nor start elsewhere.
    let target = outside.path().join("escaped");
    let said = ahp
        .ask(
            chat,
            "t3",
            &format!("term touch {}", target.display()),
            None,
        )
        .await;
    assert!(said.starts_with("exit 1"), "{said}");
    assert!(!target.exists());
    let said = ahp
        .ask(
            chat,
            "t4",
            &format!("term cwd={} pwd", outside.path().display()),
            None,
        )
        .await;
    assert!(said.contains("not a directory of this session"), "{said}");

    // An operator's own shell on the session: what it types runs there.
    let shell = "ahp-terminal:/tm/console-1";
    ahp.call(
        "createTerminal",
        json!({"channel": shell, "claim": {"kind": "client", "clientId": "ops"}, "name": "Console"}),
    )
    .await
    .unwrap();
    ahp.call("subscribe", json!({"channel": shell}))
        .await
        .unwrap();
    let typed = json!({"type": "terminal/input", "data": "echo from-the-console; pwd\n"});
    assert_eq!(ahp.dispatch(shell, typed).await, None);
    let mut seen = String::new();
    while !seen.contains(&work.display().to_string()) {
        let data = ahp
            .action("terminal/data", |a| {
                !a["data"].as_str().unwrap_or_default().is_empty()
            })
            .await;
        seen.push_str(data["data"].as_str().unwrap());
        ahp.seen.retain(|m| m["params"]["action"] != data);
    }
    assert!(seen.starts_with("from-the-console\n"), "{seen}");
    let again = ahp
        .call(
            "createTerminal",
            json!({"channel": shell, "claim": {"kind": "client", "clientId": "ops"}}),
        )
        .await
        .unwrap_err();
    assert!(again.contains("exists already"), "{again}");
    ahp.call("disposeTerminal", json!({"channel": shell}))
        .await
        .unwrap();
    let exited = ahp.action("terminal/exited", |_| true).await;
    assert!(exited.get("exitCode").is_none(), "killed: {exited}");
    let refused = ahp
        .dispatch(shell, json!({"type": "terminal/input", "data": "ls\n"}))
        .await;
    assert!(refused.is_some_and(|r| r.contains("not running")));

    // The export takes the terminals out: the agent's and the operator's,
    // their output and their end.
    let exported = exported(&server.base_url(), "tm").await;
    let output: String = exported
        .iter()
        .filter(|e| e["channel"] == shell && e["action"]["type"] == "terminal/data")
        .filter_map(|e| e["action"]["data"].as_str())
        .collect();
    assert!(output.starts_with("from-the-console\n"), "{output}");
    assert!(
        exported
            .iter()
            .any(|e| e["channel"] == shell && e["action"]["type"] == "terminal/exited")
    );
    let agents = exported
        .iter()
        .filter(|e| {
            e["channel"]
                .as_str()
                .is_some_and(|c| c.starts_with("ahp-terminal:/tm/t-"))
        })
        .count();
    assert!(agents > 0, "the agent's terminals are exported");
    drop(server);
}

/// A process killed when the test ends, however it ends.
struct KilledAtTheEnd(u32);

impl Drop for KilledAtTheEnd {
    fn drop(&mut self) {
        let _ = std::process::Command::new("kill")
            .args(["-9", &self.0.to_string()])
            .stderr(std::process::Stdio::null())
            .status();
    }
}

/// A server killed with SIGKILL cannot stop the commands its terminals
/// run; the next start on the same scratch root stops them: by the
/// variable naming their server, or, for one that cleared its environment,
/// by the process group its server wrote down.
async fn a_command_a_killed_server_left_running_is_stopped_at_its_next_start(db: TestDb) {
    let dir = tempfile::tempdir().unwrap();
    let work = dir.path().canonicalize().unwrap();
    let (mut server, mut ahp) = start(&db, "ops", "tk", &work).await;
    let shell = "ahp-terminal:/tk/console-1";
    ahp.call(
        "createTerminal",
        json!({"channel": shell, "claim": {"kind": "client", "clientId": "ops"}}),
    )
    .await
    .unwrap();
    ahp.call("subscribe", json!({"channel": shell}))
        .await
        .unwrap();
    // Commands in the background, which outlive their shell's input: one
    // that keeps its environment, one that clears it (found by its group).
    let typed = json!({"type": "terminal/input",
        "data": "sleep 600 & echo pid=$!; env -i sleep 601 & echo cleared=$!\n"});
    assert_eq!(ahp.dispatch(shell, typed).await, None);
    let mut seen = String::new();
    let number = |seen: &str, name: &str| {
        seen.split_once(name)
            .and_then(|(_, rest)| rest.split_once('\n'))
            .and_then(|(pid, _)| pid.trim().parse::<u32>().ok())
    };
    let pids = loop {
        if let (Some(pid), Some(cleared)) = (number(&seen, "pid="), number(&seen, "cleared=")) {
            break [pid, cleared];
        }
        let data = ahp.action("terminal/data", |_| true).await;
        seen.push_str(data["data"].as_str().unwrap());
        ahp.seen.retain(|m| m["params"]["action"] != data);
    };
    let _gone = pids.map(KilledAtTheEnd);
    for pid in pids {
        assert!(alive(pid), "the command runs: {seen}");
    }
    drop(ahp);
    server.kill().await;
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    for pid in pids {
        assert!(alive(pid), "a killed server left its command {pid} running");
    }
    server.restart().await;
    for pid in pids {
        assert!(
            gone(pid).await,
            "the next start stopped the command {pid} the killed server left: {seen}"
        );
    }
    assert!(server.log().contains("left running"), "and said so");
    server.terminate().await;
}
