//! Faults against the real binary: kill -9 under durable ingest, twenty
//! times in a row, and SQLite on a file system that fills up. In each,
//! every acknowledged action is present once with its serverSeq, nothing
//! reaches a subscriber that was not committed, and service comes back by
//! itself. (A stopped Postgres is `fault_postgres.rs`: it stops the shared
//! cluster, so it runs alone in its own test binary.)

use std::time::{Duration, Instant};

use serde_json::{Value, json};
use tether_tests::ledger::{
    Attempt, Writer, assert_broadcast_was_committed, audit, transcript, watch,
};
use tether_tests::{ServerProcess, TestDb, backend_tests, create_session};

backend_tests!(
    kill_9_under_durable_ingest_twenty_times_loses_nothing,
    a_turn_accepted_before_its_agent_started_fails_after_a_kill,
);

const FAKE: &str = env!("CARGO_BIN_EXE_fake-acp-agent");
const KILLS: usize = 20;
const WRITERS: usize = 8;

async fn start_hanging_turn(base: &str, session: &str, client_seq: u64) {
    let answer = reqwest::Client::new()
        .post(format!("{base}/v1/sessions/{session}/actions"))
        .json(&json!({"clientId": "faults-turns", "clientSeq": client_seq,
            "channel": format!("ahp-chat:/{session}.main"),
            "action": {"type": "chat/turnStarted", "turnId": "t1",
                "startedAt": "2026-12-01T10:00:00.000Z",
                "message": {"text": "hang", "origin": {"kind": "user"}}}}))
        .send()
        .await
        .expect("start a turn");
    assert_eq!(answer.status(), 200);
}

/// Whether the transcript of `session` ends its turn `t1` with an error.
async fn turn_failed(base: &str, session: &str) -> bool {
    transcript(base, session)
        .await
        .iter()
        .any(|(_, e)| e["action"]["type"] == "chat/error" && e["action"]["turnId"] == "t1")
}

/// The host dies after committing a turn and before its agent is up (the
/// agent takes seconds to start): the session is still dormant, as it was
/// created, with the turn open. The next start fails that turn.
async fn a_turn_accepted_before_its_agent_started_fails_after_a_kill(db: TestDb) {
    let agent = format!("slow=sh -c 'sleep 30 && exec {FAKE}'");
    // The start-up probe of an agent this slow gives up after a second.
    let mut server = ServerProcess::start(
        &db,
        &[
            "--agent",
            &agent,
            "--host-id",
            "slow-host",
            "--agent-init-timeout-ms",
            "1000",
        ],
    )
    .await;
    let base = server.base_url();
    create_session(&base, "slow", "slow").await;
    start_hanging_turn(&base, "slow", 1).await;
    server.kill().await;
    server.restart().await;
    let deadline = Instant::now() + Duration::from_secs(20);
    while !turn_failed(&base, "slow").await {
        assert!(Instant::now() < deadline, "the open turn was not swept");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let view: Value = reqwest::get(format!("{base}/v1/sessions/slow"))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(view["projection"]["openTurnId"], Value::Null, "{view}");
    assert_ne!(view["state"], "live", "{view}");
}

async fn kill_9_under_durable_ingest_twenty_times_loses_nothing(db: TestDb) {
    let agent = format!("fake={FAKE}");
    // A stable host identity (Postgres; SQLite has one writer anyway): the
    // restarted process is the same host, so it takes its own sessions'
    // leases back at once instead of waiting out the default 10 s lease.
    let mut server =
        ServerProcess::start(&db, &["--agent", &agent, "--host-id", "faults-host"]).await;
    let base = server.base_url();
    let mut writers = Vec::new();
    for n in 0..WRITERS {
        let session = format!("ingest-{n}");
        create_session(&base, &session, "echo").await;
        writers.push(Writer::new(&session, &format!("w{n}")).padded(64));
    }
    let mut lost_answers = 0;
    let mut recoveries = Vec::new();
    for round in 0..KILLS {
        // An agent mid-turn when the process dies: the next start sweeps it.
        let turn = format!("turn-{round}");
        create_session(&base, &turn, "fake").await;
        start_hanging_turn(&base, &turn, round as u64 + 1).await;
        // Durable ingest from every writer, until the kill.
        let load: Vec<_> = writers
            .drain(..)
            .map(|mut writer| {
                let base = base.clone();
                tokio::spawn(async move {
                    loop {
                        if let Attempt::Lost(_) = writer.attempt(&base).await {
                            return (writer, true);
                        }
                    }
                })
            })
            .collect();
        tokio::time::sleep(Duration::from_millis(150 + 37 * (round as u64 % 7))).await;
        server.kill().await;
        for task in load {
            let (writer, lost) = task.await.expect("writer");
            lost_answers += usize::from(lost);
            writers.push(writer);
        }
        let down = Instant::now();
        server.restart().await;
        recoveries.push(down.elapsed());
        // Each writer sends its in-doubt action again: applied at most once.
        for writer in &mut writers {
            writer.settle(&base, Duration::from_secs(20)).await;
        }
        assert!(
            turn_failed(&base, &turn).await,
            "round {round}: the open turn was swept"
        );
    }
    let checked = audit(&base, &writers).await;
    // Nothing reissued: every serverSeq above all acknowledged ones is new.
    let highest = writers
        .iter()
        .flat_map(|w| w.acked.values())
        .max()
        .copied()
        .unwrap();
    let mut fresh = Writer::new("ingest-0", "after");
    fresh.settle(&base, Duration::from_secs(5)).await;
    assert!(fresh.acked[&1] > highest, "a serverSeq was reissued");
    server.terminate().await;
    // Projections equal a rebuild of the transcript.
    let store = db.open().await;
    let report = tether_server::engine::rebuild::rebuild_projections(store.as_ref())
        .await
        .expect("rebuild");
    store.close().await;
    assert_eq!(
        report.changed, 0,
        "a projection differed from its transcript"
    );
    recoveries.sort();
    let slowest = *recoveries.last().unwrap();
    assert!(
        slowest < Duration::from_secs(5),
        "a restart took {slowest:?} to be ready: it waited out its own leases (10 s)"
    );
    eprintln!(
        "kill -9 x{KILLS} ({:?}): {checked} acknowledged actions all present, {lost_answers} answers \
         lost and retried once, restart to ready p50 {:?} max {:?}",
        db.backend(),
        recoveries[recoveries.len() / 2],
        recoveries.last().unwrap()
    );
}

/// A small tmpfs the test mounts (root only) and unmounts whatever happens.
struct SmallDisk {
    dir: tempfile::TempDir,
}

impl SmallDisk {
    fn mount(bytes: usize) -> Option<Self> {
        let dir = tempfile::tempdir().ok()?;
        let mounted = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={bytes}"), "tmpfs"])
            .arg(dir.path())
            .status()
            .ok()?
            .success();
        mounted.then_some(Self { dir })
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount")
            .arg("-l")
            .arg(self.dir.path())
            .status();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_on_a_full_disk_refuses_clearly_loses_nothing_and_recovers() {
    let Some(disk) = SmallDisk::mount(24 << 20) else {
        assert!(
            std::env::var_os("TETHER_TEST_REQUIRE_FAULTS").is_none(),
            "cannot mount a tmpfs (needs root)"
        );
        eprintln!("skipped: cannot mount a tmpfs (needs root)");
        return;
    };
    // Ballast, freed later to let the store grow again.
    let ballast = disk.dir.path().join("ballast");
    std::fs::write(&ballast, vec![0u8; 6 << 20]).unwrap();
    let db = TestDb::sqlite_in(disk.dir.path());
    let mut server = ServerProcess::start(&db, &[]).await;
    let base = server.base_url();
    create_session(&base, "full", "echo").await;
    // A subscriber that records everything broadcast.
    let watcher = tether_tests::raw_at(&server.ws_url()).await;
    let seen = tokio::spawn(watch(watcher, "ahp-session:/full"));
    let mut writer = Writer::new("full", "filler").padded(16 * 1024);
    let started = Instant::now();
    let refusal = loop {
        match writer.attempt(&base).await {
            Attempt::Acked(_) => {}
            Attempt::Refused(503, problem) => break problem,
            other => panic!("unexpected: {other:?}"),
        }
        assert!(
            started.elapsed() < Duration::from_secs(120),
            "the disk never filled"
        );
    };
    let detail = refusal["detail"].as_str().unwrap_or_default().to_owned();
    assert!(
        detail.to_lowercase().contains("storage unavailable") && detail.contains("full"),
        "an operator-readable refusal: {refusal}"
    );
    let ready = reqwest::get(format!("{base}/readyz")).await.unwrap();
    assert_eq!(ready.status(), 503, "not ready while writes fail");
    let problem: Value = ready.json().await.unwrap();
    assert!(
        problem["detail"]
            .as_str()
            .unwrap_or_default()
            .contains("full"),
        "{problem}"
    );
    // Reads still work.
    assert!(!transcript(&base, "full").await.is_empty());
    // Space comes back: service resumes without a restart.
    std::fs::remove_file(&ballast).unwrap();
    let freed = Instant::now();
    writer.settle(&base, Duration::from_secs(30)).await;
    let resumed = freed.elapsed();
    for _ in 0..5 {
        writer.settle(&base, Duration::from_secs(5)).await;
    }
    let mut ready = false;
    for _ in 0..200 {
        if reqwest::get(format!("{base}/readyz"))
            .await
            .unwrap()
            .status()
            == 200
        {
            ready = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(ready, "/readyz recovered");
    audit(&base, std::slice::from_ref(&writer)).await;
    // Everything broadcast was committed, in order.
    let stored: Vec<u64> = transcript(&base, "full")
        .await
        .iter()
        .map(|(s, _)| *s)
        .collect();
    server.terminate().await;
    let broadcast = seen.await.expect("watcher");
    assert_broadcast_was_committed(&broadcast, &stored);
    eprintln!(
        "full disk: {} acknowledged before the refusal ({detail}); resumed {resumed:?} after \
         space was freed; {} envelopes broadcast, all committed",
        writer.acked.len(),
        broadcast.len()
    );
}
