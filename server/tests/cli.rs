//! The real `tether` binary: start-up failures are one clear line and a
//! non-zero exit; a healthy start serves and shuts down cleanly on SIGTERM.

use std::io::{BufRead, BufReader};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

const BIN: &str = env!("CARGO_BIN_EXE_tether");

/// Runs `tether serve` with `args` and a clean environment for our variables.
fn serve(args: &[&str]) -> Output {
    let mut command = Command::new(BIN);
    command.arg("serve").args(args);
    for (key, _) in std::env::vars() {
        if key.starts_with("TETHER_") {
            command.env_remove(key);
        }
    }
    command
        .env("TETHER_DATABASE_CONNECT_TIMEOUT_SECS", "2")
        .stdin(Stdio::null())
        .output()
        .expect("run tether")
}

/// Asserts a failed start: exit code 1 and exactly one line on stderr that
/// contains `needle`, with no panic trace.
fn assert_one_line_failure(output: &Output, needle: &str) {
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "stderr: {stderr}");
    let lines: Vec<&str> = stderr.lines().filter(|l| l.contains("error")).collect();
    assert_eq!(lines.len(), 1, "one error line expected, got: {stderr}");
    assert!(lines[0].starts_with("tether: error: "), "{stderr}");
    assert!(lines[0].contains(needle), "{needle:?} not in {stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
}

#[test]
fn an_unknown_database_scheme_is_refused() {
    let output = serve(&["--database-url", "mysql://root@127.0.0.1/tether"]);
    assert_one_line_failure(&output, "unsupported database URL");
}

#[test]
fn an_unreachable_postgres_is_named() {
    // Port 1 on loopback: nothing listens there, the connection is refused.
    let output = serve(&["--database-url", "postgres://u:secret@127.0.0.1:1/tether"]);
    assert_one_line_failure(
        &output,
        "cannot open Postgres database postgres://u:***@127.0.0.1:1/tether",
    );
    assert!(!String::from_utf8_lossy(&output.stderr).contains("secret"));
}

#[test]
fn an_unwritable_sqlite_path_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let blocker = dir.path().join("not-a-dir");
    std::fs::write(&blocker, b"a file where a directory should be").unwrap();
    let path = blocker.join("tether.db");
    let output = serve(&["--database-url", &format!("sqlite:{}", path.display())]);
    assert_one_line_failure(&output, "cannot open SQLite database");
}

#[test]
fn a_corrupt_sqlite_file_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tether.db");
    std::fs::write(&path, vec![0x5a_u8; 64 * 1024]).unwrap();
    let output = serve(&["--database-url", &format!("sqlite:{}", path.display())]);
    assert_one_line_failure(&output, "not a database");
}

#[test]
fn a_remote_bind_needs_the_explicit_opt_in() {
    let output = serve(&["--bind", "0.0.0.0:0", "--database-url", "sqlite::memory:"]);
    assert_one_line_failure(&output, "--insecure-allow-remote");
}

#[test]
fn serves_with_no_configuration_and_stops_on_sigterm() {
    let dir = tempfile::tempdir().unwrap();
    // No flags except a free port: the default database is ./tether.db in
    // the working directory.
    let (mut child, addr, log) = start_server(&[], dir.path());
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let ready: serde_json::Value = runtime.block_on(async {
        reqwest::get(format!("http://{addr}/readyz"))
            .await
            .unwrap()
            .json()
            .await
            .unwrap()
    });
    assert_eq!(ready["status"], "ready");
    assert_eq!(ready["backend"], "sqlite");
    assert!(
        dir.path().join("tether.db").exists(),
        "the default database file"
    );

    let status = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let exit = child.wait().unwrap();
    let rest: Vec<String> = log.try_iter().collect();
    assert!(exit.success(), "exit {exit:?}; log: {rest:?}");
    assert!(rest.iter().any(|l| l.contains("store closed")), "{rest:?}");
}

#[test]
fn the_compose_file_sets_only_variables_the_server_reads() {
    let compose = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../docker-compose.yml"
    ))
    .expect("docker-compose.yml at the repository root");
    let known = tether_server::config::env_vars();
    let mut set = Vec::new();
    for line in compose.lines() {
        let entry = line.trim().trim_start_matches("- ");
        let key = entry.split([':', '=']).next().unwrap_or("").trim();
        if key.starts_with("TETHER_") {
            set.push(key.to_owned());
        }
    }
    assert!(
        set.contains(&"TETHER_DATABASE_URL".to_owned()),
        "compose configures Postgres: {set:?}"
    );
    // Authentication on, from a secret file; no insecure opt-in.
    assert!(
        set.contains(&"TETHER_AUTH_SECRET_FILE".to_owned()),
        "{set:?}"
    );
    assert!(
        !set.contains(&"TETHER_INSECURE_ALLOW_REMOTE".to_owned()),
        "{set:?}"
    );
    for key in &set {
        assert!(
            known.contains(key),
            "docker-compose.yml sets {key}, which tether does not read"
        );
    }
    assert!(
        compose.contains("127.0.0.1:7878:7878"),
        "the port is published on the host's loopback only"
    );
}

/// Starts `tether serve` on a free port with `args`, in `dir`, without any
/// `TETHER_*` variable of the test's environment; returns the child, its
/// address once it logs it, and the rest of its log as it comes.
fn start_server(
    args: &[&str],
    dir: &std::path::Path,
) -> (
    std::process::Child,
    String,
    std::sync::mpsc::Receiver<String>,
) {
    let mut command = Command::new(BIN);
    for (key, _) in std::env::vars() {
        if key.starts_with("TETHER_") {
            command.env_remove(key);
        }
    }
    let mut child = command
        .args(["serve", "--bind", "127.0.0.1:0"])
        .args(args)
        .current_dir(dir)
        .env("RUST_LOG", "info")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id().to_string();
    std::thread::spawn(move || {
        std::thread::sleep(Duration::from_secs(120));
        let _ = Command::new("kill").args(["-KILL", &pid]).status();
    });
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let addr = loop {
        let line = lines.next().expect("the server logs its address").unwrap();
        if let Some(rest) = line.split("addr=").nth(1) {
            break rest.split_whitespace().next().unwrap().to_owned();
        }
    };
    // Keep draining its log so it never blocks on a full pipe.
    let (sender, log) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in lines.map_while(Result::ok) {
            let _ = sender.send(line);
        }
    });
    (child, addr, log)
}

#[test]
fn a_killed_server_loses_no_acknowledged_action() {
    let dir = tempfile::tempdir().unwrap();
    let database = format!("sqlite:{}", dir.path().join("tether.db").display());
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let http = reqwest::Client::new();
    let (mut first, addr, _) = start_server(&["--database-url", &database], dir.path());
    let (epoch, acked) = runtime.block_on(async {
        let ready: serde_json::Value = http
            .get(format!("http://{addr}/readyz"))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        let created = http
            .post(format!("http://{addr}/v1/sessions"))
            .json(&serde_json::json!({"id": "k9"}))
            .send()
            .await
            .unwrap();
        assert_eq!(created.status(), 201);
        let mut acked = Vec::new();
        for i in 0..25 {
            let answer: serde_json::Value = http
                .post(format!("http://{addr}/v1/sessions/k9/actions"))
                .json(&serde_json::json!({"clientId": "k", "clientSeq": i,
                    "action": {"type": "session/titleChanged", "title": format!("t{i}")}}))
                .send()
                .await
                .unwrap()
                .json()
                .await
                .unwrap();
            acked.push(answer["serverSeq"].as_u64().expect("acknowledged"));
        }
        (ready["hostEpoch"].clone(), acked)
    });
    // kill -9: no graceful shutdown, no store close.
    first.kill().unwrap();
    first.wait().unwrap();

    let (mut second, addr, _) = start_server(&["--database-url", &database], dir.path());
    runtime.block_on(async {
        let ready: serde_json::Value = http
            .get(format!("http://{addr}/readyz"))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        assert_eq!(ready["hostEpoch"], epoch, "same database, same epoch");
        let page: serde_json::Value = http
            .get(format!(
                "http://{addr}/v1/sessions/k9/transcript?limit=1000"
            ))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        let stored: Vec<u64> = page["envelopes"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e["serverSeq"].as_u64().unwrap())
            .collect();
        for seq in &acked {
            assert!(
                stored.contains(seq),
                "acknowledged seq {seq} survived the kill"
            );
        }
        let next: serde_json::Value = http
            .post(format!("http://{addr}/v1/sessions/k9/actions"))
            .json(&serde_json::json!({"clientId": "k", "clientSeq": 100,
                "action": {"type": "session/titleChanged", "title": "after"}}))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        let max = *stored.iter().max().unwrap();
        assert!(
            next["serverSeq"].as_u64().unwrap() > max,
            "seq continues above every seq issued"
        );
    });
    let _ = Command::new("kill")
        .args(["-TERM", &second.id().to_string()])
        .status();
    assert!(second.wait().unwrap().success());
}

#[test]
fn a_second_host_on_one_sqlite_file_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let db = format!("sqlite:{}", dir.path().join("one.db").display());
    let (mut first, _addr, _log) = start_server(&["--database-url", &db], dir.path());
    let second = serve(&["--bind", "127.0.0.1:0", "--database-url", &db]);
    assert_one_line_failure(&second, "SQLite serves one host");
    first.kill().unwrap();
    first.wait().unwrap();
    // Once the first is gone, the file is free again.
    let (mut again, _addr, _log) = start_server(&["--database-url", &db], dir.path());
    again.kill().unwrap();
    again.wait().unwrap();
}
