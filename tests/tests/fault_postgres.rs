//! Postgres stopped under load, and started again, with Tether left
//! running: dispatches get a clear "storage unavailable" refusal, `/readyz`
//! turns not-ready, nothing is broadcast that was not committed, and
//! service resumes by itself when Postgres is back.
//!
//! The same under three hosts behind HAProxy (`deploy/haproxy.cfg` as
//! shipped): every host refuses clearly, each recovers by itself, and the
//! audit holds.
//!
//! This stops the machine's Postgres cluster, so it is its own test binary
//! (cargo runs test binaries one after another), its tests take turns
//! (one lock), and a guard starts the cluster again however a test ends.

use std::time::{Duration, Instant};

use tether_tests::ledger::{
    Attempt, Writer, assert_broadcast_was_committed, audit, audit_as, transcript, watch,
};
use tether_tests::{Backend, ServerProcess, TestDb};

/// Held by the test that stops Postgres: one at a time.
static TURN: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// The machine's Postgres cluster (`pg_ctlcluster VERSION main`), started
/// again when dropped.
struct Cluster {
    version: String,
}

impl Cluster {
    fn find() -> Option<Self> {
        let version = std::fs::read_dir("/etc/postgresql")
            .ok()?
            .filter_map(Result::ok)
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .max()?;
        Some(Self { version })
    }

    fn ctl(&self, action: &str) -> bool {
        let mut command = std::process::Command::new("pg_ctlcluster");
        command.args(["--skip-systemctl-redirect", &self.version, "main", action]);
        if action == "stop" {
            command.args(["-m", "fast"]);
        }
        command.status().is_ok_and(|s| s.success())
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        // Whatever happened: the other tests need it.
        if !self.ctl("start") {
            // Already running is fine; anything else is loud.
            let status = std::process::Command::new("pg_lsclusters").status();
            eprintln!("restarting Postgres after the fault test: {status:?}");
        }
    }
}

/// A test database on the machine's Postgres cluster, and the cluster to
/// stop; `None` (the test skips) without them, unless CI requires them.
async fn stoppable() -> Option<(TestDb, Cluster)> {
    let db = TestDb::new(Backend::Postgres).await?;
    let Some(cluster) = Cluster::find() else {
        assert!(
            std::env::var_os("TETHER_TEST_REQUIRE_FAULTS").is_none(),
            "no Postgres cluster to stop (pg_ctlcluster)"
        );
        eprintln!("skipped: no local Postgres cluster to stop");
        return None;
    };
    Some((db, cluster))
}

async fn ready(base: &str) -> u16 {
    match reqwest::get(format!("{base}/readyz")).await {
        Ok(answer) => answer.status().as_u16(),
        Err(_) => 0,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_stopped_mid_load_refuses_clearly_and_service_resumes_by_itself() {
    let _turn = TURN.lock().await;
    let Some((db, cluster)) = stoppable().await else {
        return;
    };
    let mut server = ServerProcess::start(
        &db,
        &[
            "--lease-ttl-ms",
            "2000",
            "--database-connect-timeout-secs",
            "2",
        ],
    )
    .await;
    let base = server.base_url();
    tether_tests::create_session(&base, "pg-down", "echo").await;
    let seen = tokio::spawn(watch(
        tether_tests::raw_at(&server.ws_url()).await,
        "ahp-session:/pg-down",
    ));
    let (stop_tx, mut stop) = tokio::sync::watch::channel(false);
    let load = {
        let base = base.clone();
        tokio::spawn(async move {
            let mut writer = Writer::new("pg-down", "pg-writer");
            let mut first_refusal = None;
            let mut refusals = Vec::new();
            while !*stop.borrow_and_update() {
                match writer.attempt(&base).await {
                    Attempt::Refused(503, problem) => {
                        first_refusal.get_or_insert_with(Instant::now);
                        refusals.push(problem);
                        tokio::time::sleep(Duration::from_millis(20)).await;
                    }
                    Attempt::Refused(status, problem) => {
                        panic!("refused {status}: {problem}")
                    }
                    Attempt::Lost(_) => tokio::time::sleep(Duration::from_millis(20)).await,
                    Attempt::Acked(_) => {}
                }
            }
            (writer, first_refusal, refusals)
        })
    };
    tokio::time::sleep(Duration::from_secs(1)).await;
    let stopped = Instant::now();
    assert!(cluster.ctl("stop"), "pg_ctlcluster stop");
    // Not ready, within a few seconds.
    let mut not_ready = None;
    while stopped.elapsed() < Duration::from_secs(15) {
        if ready(&base).await == 503 {
            not_ready = Some(stopped.elapsed());
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let not_ready = not_ready.expect("/readyz turned 503 while Postgres was down");
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(cluster.ctl("start"), "pg_ctlcluster start");
    let started = Instant::now();
    // Service resumes by itself: ready again, and dispatches acknowledged.
    let mut recovered = None;
    while started.elapsed() < Duration::from_secs(60) {
        if ready(&base).await == 200 {
            recovered = Some(started.elapsed());
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let recovered = recovered.expect("/readyz recovered without a restart");
    tokio::time::sleep(Duration::from_secs(1)).await;
    stop_tx.send(true).unwrap();
    let (mut writer, first_refusal, refusals) = load.await.expect("the writer");
    let before = writer.acked.len();
    writer.settle(&base, Duration::from_secs(30)).await;
    for _ in 0..20 {
        writer.settle(&base, Duration::from_secs(10)).await;
    }
    assert!(writer.acked.len() > before, "dispatches acknowledged again");
    assert!(
        first_refusal.is_some(),
        "a dispatch was refused while Postgres was down"
    );
    for problem in &refusals {
        let detail = problem["detail"]
            .as_str()
            .unwrap_or_default()
            .to_lowercase();
        assert!(
            detail.contains("storage unavailable") || detail.contains("store could not be reached"),
            "a clear refusal: {problem}"
        );
    }
    let checked = audit(&base, std::slice::from_ref(&writer)).await;
    let stored: Vec<u64> = transcript(&base, "pg-down")
        .await
        .iter()
        .map(|(s, _)| *s)
        .collect();
    server.terminate().await;
    let broadcast = seen.await.expect("the watcher");
    assert_broadcast_was_committed(&broadcast, &stored);
    eprintln!(
        "postgres down: not ready {not_ready:?} after the stop; {} refusals (503); ready again \
         {recovered:?} after the start; {checked} acknowledged actions all present; {} broadcast, \
         all committed",
        refusals.len(),
        broadcast.len()
    );
    drop(cluster);
}

/// Polls `base`'s `/readyz` (a second at most per poll) until it answers
/// `want` or `limit` passes; the time it took.
async fn until_ready_is(base: &str, want: u16, limit: Duration) -> Option<Duration> {
    let began = Instant::now();
    while began.elapsed() < limit {
        if ready(base).await == want {
            return Some(began.elapsed());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    None
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_restarted_under_three_hosts_behind_haproxy_loses_nothing() {
    use tether_tests::deploy::{
        Follower, Haproxy, admin, assert_followers_saw_everything, compose_hosts, create_sessions,
        follow, write_all,
    };

    let _turn = TURN.lock().await;
    let Some((db, cluster)) = stoppable().await else {
        return;
    };
    let (_secret, hosts) = compose_hosts(&db, 3, &["--database-connect-timeout-secs", "2"]).await;
    let Some(lb) = Haproxy::start(&hosts.iter().collect::<Vec<_>>()).await else {
        return;
    };
    let base = lb.base_url();
    let token = admin();
    let sessions = create_sessions(&base, &token, "pg", 4).await;
    let followers: Vec<Follower> = sessions.iter().map(|s| follow(&base, &token, s)).collect();
    let writing = write_all(&base, &token, &sessions);
    tokio::time::sleep(Duration::from_secs(2)).await;

    let stopped = Instant::now();
    assert!(cluster.ctl("stop"), "pg_ctlcluster stop");
    // Every host says it is not ready, and refuses a write clearly.
    let probes = hosts.iter().map(|host| {
        let (base, token, session) = (host.base_url(), token.clone(), sessions[0].clone());
        async move {
            let took = until_ready_is(&base, 503, Duration::from_secs(15))
                .await
                .expect("/readyz turned 503 on every host while Postgres was down");
            let refused = reqwest::Client::new()
                .post(format!("{base}/v1/sessions/{session}/actions"))
                .bearer_auth(&token)
                .json(&serde_json::json!({"clientId": "probe", "clientSeq": 1,
                    "action": {"type": "session/titleChanged", "title": "probe"}}))
                .timeout(Duration::from_secs(10))
                .send()
                .await
                .expect("an answer while Postgres is down");
            assert_eq!(refused.status(), 503, "{base}");
            let problem: serde_json::Value = refused.json().await.expect("a problem document");
            let detail = problem["detail"]
                .as_str()
                .unwrap_or_default()
                .to_lowercase();
            assert!(
                detail.contains("storage unavailable")
                    || detail.contains("store could not be reached"),
                "a clear refusal: {problem}"
            );
            took
        }
    });
    let not_ready = futures_util::future::join_all(probes).await;
    tokio::time::sleep(Duration::from_secs(3).saturating_sub(stopped.elapsed())).await;
    // Timed from the moment the start is asked for (pg_ctlcluster returns
    // once Postgres accepts connections, and hosts may write before that).
    let started = Instant::now();
    let down_for = stopped.elapsed();
    assert!(cluster.ctl("start"), "pg_ctlcluster start");
    // Each recovers by itself.
    let mut recovered = Vec::new();
    for host in &hosts {
        recovered.push(
            until_ready_is(&host.base_url(), 200, Duration::from_secs(60))
                .await
                .map(|_| started.elapsed())
                .expect("/readyz recovered without a restart"),
        );
    }
    // HAProxy routes to them again after `rise` good checks; every session
    // is written again, by itself, within seconds (a forwarded request
    // whose answer was lost to the outage once held its session's writes
    // from that host for the whole answer limit, 15 s and more).
    writing
        .until_all_written_after(started, Duration::from_secs(12), Duration::from_secs(1))
        .await;
    let writers = writing.stop().await;
    let checked = audit_as(&base, &writers, Some(&token)).await;
    assert_followers_saw_everything(&base, &token, followers).await;
    let mut resumed = Vec::new();
    for writer in &writers {
        resumed.push(writer.longest_wait);
        // The longest wait is the outage's; it ended with the first write
        // acknowledged after Postgres was back.
        if let Some(ended) = writer.longest_wait_ended {
            eprintln!(
                "{}: written again {:?} after Postgres was started",
                writer.session,
                ended.saturating_duration_since(started)
            );
        }
        // Why a session took long: its attempts since the start.
        let slow = writer
            .longest_wait_ended
            .is_none_or(|ended| ended.saturating_duration_since(started) > Duration::from_secs(3));
        for (at, miss) in writer.misses.iter().filter(|_| slow) {
            if *at > started {
                let miss: String = miss.chars().take(200).collect();
                eprintln!(
                    "  {} +{:?}: {miss}",
                    writer.session,
                    at.saturating_duration_since(started)
                );
            }
        }
    }
    let worst = resumed.iter().max().copied().unwrap_or_default();
    eprintln!(
        "postgres restarted under three hosts: down {down_for:?}; not ready after {not_ready:?}; \
         ready again {recovered:?} after the start; longest a session went unwritten {worst:?}; \
         {checked} acknowledged actions all present once"
    );
    drop(lb);
    drop(cluster);
}
