//! A team deployment as shipped (`deploy/`, `docker-compose.yml`), proven
//! with the real load balancer: Debian's `haproxy` runs
//! `deploy/haproxy.cfg` (only the addresses differ) in front of two
//! `tether serve` on one Postgres, with authentication on; writers and
//! subscribers reach Tether through HAProxy only.
//!
//! The test needs Postgres and the `haproxy` binary; it skips without
//! them, unless `TETHER_TEST_REQUIRE_HAPROXY=1` (set by CI, which installs
//! it).

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use tether_tests::deploy::{
    Follower, Haproxy, SECRET, admin, assert_followers_saw_everything, compose_hosts,
    create_sessions, follow, readiness_turns, write_all,
};
use tether_tests::ledger;
use tether_tests::{ServerProcess, TestDb};

/// The deploy of a new image, host by host, under load through HAProxy:
/// SIGTERM one host, start it again, wait until it is ready and HAProxy
/// routes to it, then the next. Nothing acknowledged is lost or applied
/// twice, every subscriber sees the gap-free sequence, and the time each
/// session could not be written is measured.
#[tokio::test]
async fn a_rolling_restart_behind_haproxy_loses_nothing_and_pauses_writes_briefly() {
    let Some(db) = TestDb::postgres().await else {
        return;
    };
    let (_secret, mut hosts) = compose_hosts(&db, 2, &[]).await;
    let Some(lb) = Haproxy::start(&hosts.iter().collect::<Vec<_>>()).await else {
        return;
    };
    let base = lb.base_url();
    let token = admin();
    let sessions = create_sessions(&base, &token, "roll", 4).await;
    let followers: Vec<Follower> = sessions.iter().map(|s| follow(&base, &token, s)).collect();
    let writing = write_all(&base, &token, &sessions);
    tokio::time::sleep(Duration::from_secs(2)).await;
    let mut restarts = Vec::new();
    for host in &mut hosts {
        let began = Instant::now();
        host.begin_terminate();
        let status = host.wait_exit(Duration::from_secs(40)).await;
        let exited = began.elapsed();
        assert!(
            status.is_some_and(|s| s.success()),
            "a host exits 0 after SIGTERM: {status:?}\n{}",
            host.log()
        );
        host.restart().await;
        let ready = began.elapsed();
        restarts.push((exited, ready));
        // HAProxy routes to it again after `rise` good checks.
        tokio::time::sleep(Duration::from_secs(5)).await;
    }
    writing
        .until_all_written_after(
            Instant::now(),
            Duration::from_secs(30),
            Duration::from_secs(1),
        )
        .await;
    let writers = writing.stop().await;
    let checked = ledger::audit_as(&base, &writers, Some(&token)).await;
    // Every subscriber ends with the gap-free sequence of its session.
    assert_followers_saw_everything(&base, &token, followers).await;
    let mut waits: BTreeMap<String, Duration> = BTreeMap::new();
    for writer in &writers {
        waits.insert(writer.session.clone(), writer.longest_wait);
        eprintln!(
            "{}: {} acknowledged, refused {:?}, longest wait between acknowledgements {:?}",
            writer.session,
            writer.acked.len(),
            writer.refused,
            writer.longest_wait
        );
    }
    for (i, (exited, ready)) in restarts.iter().enumerate() {
        eprintln!(
            "tether-{}: SIGTERM → exited {exited:?}, → ready {ready:?}",
            i + 1
        );
    }
    eprintln!("{checked} acknowledged actions checked");
    let worst = waits.values().max().copied().unwrap_or_default();
    assert!(
        worst <= Duration::from_secs(2),
        "a session could not be written for {worst:?} during a restart: {waits:?}\nhaproxy:\n{}",
        lb.log()
    );
}

/// `url` with its `host:port` replaced by `address`.
fn through(url: &str, address: std::net::SocketAddr) -> String {
    let at = url.find('@').expect("a user in the database URL") + 1;
    let path = at + url[at..].find('/').expect("a database name");
    format!("{}{address}{}", &url[..at], &url[path..])
}

/// The second of the day by `base`'s wall clock (its HTTP `Date` header,
/// `Thu, 03 Dec 2026 10:50:12 GMT`).
async fn clock_of(base: &str) -> i64 {
    let answer = reqwest::get(format!("{base}/healthz")).await.unwrap();
    let date = answer.headers()["date"].to_str().unwrap().to_owned();
    let time = date.split(' ').nth(4).expect("a time in the Date header");
    time.split(':')
        .map(|part| part.parse::<i64>().expect("a number"))
        .fold(0, |total, part| total * 60 + part)
}

/// One host is cut off from Postgres while it holds the leases of the
/// sessions being written (a TCP proxy in front of the database stops
/// passing bytes either way and closes nothing, as a partition does),
/// with writers and subscribers going through HAProxy.
///
/// `skew` runs that host's wall clock ahead (or behind) by that much
/// (libfaketime): leases are timed by the database's clock and the
/// host's monotonic one, so nothing changes.
async fn partition(skew: Option<&str>) {
    let Some(db) = TestDb::postgres().await else {
        return;
    };
    let faketime = skew.map(|skew| {
        let library = ["/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1"]
            .into_iter()
            .find(|path| std::path::Path::new(path).exists());
        (skew, library)
    });
    if let Some((_, None)) = faketime {
        assert!(
            std::env::var("TETHER_TEST_REQUIRE_HAPROXY").as_deref() != Ok("1"),
            "libfaketime is not installed but TETHER_TEST_REQUIRE_HAPROXY=1"
        );
        eprintln!("skipped: libfaketime is not installed (apt-get install faketime)");
        return;
    }
    let lease = Duration::from_secs(3);
    let secret = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(secret.path(), SECRET).unwrap();
    let secret_path = secret.path().to_str().unwrap().to_owned();
    let postgres: std::net::SocketAddr = {
        let at = db.url().find('@').unwrap() + 1;
        let end = at + db.url()[at..].find('/').unwrap();
        tokio::net::lookup_host(&db.url()[at..end])
            .await
            .unwrap()
            .next()
            .unwrap()
    };
    let link = tether_tests::Proxy::start(postgres).await;
    let lease_ms = lease.as_millis().to_string();
    let mut env = vec![("TETHER_LEASE_TTL_MS", lease_ms.as_str())];
    if let Some((skew, Some(library))) = faketime {
        env.extend([
            ("LD_PRELOAD", library),
            ("FAKETIME", skew),
            // Only the wall clock: the monotonic clock is the machine's.
            ("FAKETIME_DONT_FAKE_MONOTONIC", "1"),
        ]);
    }
    let args = ["--auth-secret-file", &secret_path, "--host-id", "tether-1"];
    let cut_off = ServerProcess::start_on(&through(db.url(), link.address()), &args, &env).await;
    let args = ["--auth-secret-file", &secret_path, "--host-id", "tether-2"];
    let other = ServerProcess::start_with_env(&db, &args, &env[..1]).await;
    if skew.is_some() {
        // The skew took: the two hosts' HTTP `Date` headers differ.
        let apart = clock_of(&cut_off.base_url()).await - clock_of(&other.base_url()).await;
        let apart = (apart + 43_200).rem_euclid(86_400) - 43_200;
        eprintln!("the cut-off host's clock is {apart} s off the other's");
        assert!(
            apart.abs() >= 6,
            "libfaketime did not move the clock: {apart} s"
        );
    }
    let Some(lb) = Haproxy::start(&[&cut_off, &other]).await else {
        return;
    };
    let base = lb.base_url();
    let token = admin();
    // The sessions are created on the host to be cut off: it holds them.
    let sessions = create_sessions(&cut_off.base_url(), &token, "cut", 4).await;
    let followers: Vec<Follower> = sessions.iter().map(|s| follow(&base, &token, s)).collect();
    let writing = write_all(&base, &token, &sessions);
    tokio::time::sleep(Duration::from_secs(2)).await;
    let cut = Instant::now();
    link.stall();
    // Within the lease time the host says it is not ready, however the
    // database connection hangs.
    let unready = readiness_turns(&cut_off.base_url(), false, lease * 2).await;
    let cut_for = Duration::from_secs(12);
    tokio::time::sleep(cut_for.saturating_sub(cut.elapsed())).await;
    link.heal();
    let healed = Instant::now();
    // It comes back by itself, without a restart.
    let rejoined = readiness_turns(&cut_off.base_url(), true, Duration::from_secs(30)).await;
    writing
        .until_all_written_after(healed, Duration::from_secs(30), Duration::from_secs(1))
        .await;
    let writers = writing.stop().await;
    // Nothing acknowledged is lost or applied twice; no seq is issued twice.
    let checked = ledger::audit_as(&base, &writers, Some(&token)).await;
    assert_followers_saw_everything(&base, &token, followers).await;
    let mut worst = Duration::ZERO;
    for writer in &writers {
        eprintln!(
            "{}: {} acknowledged, refused {:?}, longest wait {:?}, ending {:?} after the cut",
            writer.session,
            writer.acked.len(),
            writer.refused,
            writer.longest_wait,
            writer
                .longest_wait_ended
                .map(|at| at.saturating_duration_since(cut))
        );
        worst = worst.max(writer.longest_wait);
        // Written again after the heal, through either host.
        assert!(
            writer.last_ack.is_some_and(|at| at > healed),
            "{}: written after the heal",
            writer.session
        );
    }
    eprintln!(
        "skew {skew:?}: cut for {cut_for:?}, lease {lease:?}: not ready after {unready:?}, \
         ready again {rejoined:?} after the heal, {checked} acknowledged actions checked, \
         longest a session could not be written: {worst:?}"
    );
    assert!(unready <= lease, "not ready only after {unready:?}");
    assert!(
        worst <= lease * 2,
        "a session could not be written for {worst:?}, the lease is {lease:?}"
    );
}

#[tokio::test]
async fn a_host_cut_off_from_postgres_hands_its_sessions_over_within_the_lease() {
    partition(None).await;
}

#[tokio::test]
async fn a_host_whose_clock_runs_ahead_keeps_the_lease_guarantees() {
    partition(Some("+8s")).await;
}

#[tokio::test]
async fn a_host_whose_clock_runs_behind_keeps_the_lease_guarantees() {
    partition(Some("-8s")).await;
}
