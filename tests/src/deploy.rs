//! A team deployment as shipped, for the tests that prove it
//! (`tests/tests/deploy.rs`, `tests/tests/fault_postgres.rs`): Debian's
//! `haproxy` running `deploy/haproxy.cfg` (only the addresses differ) in
//! front of `tether serve` hosts, writers and subscribers going through it.

use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use tether_client::stream::{SessionStream, Start, StreamConfig, StreamEvent};
use tether_client::token::StaticToken;
use tether_server::auth::Role;
use tether_server::auth::token::Authenticator;

use crate::ServerProcess;
use crate::ledger::{self, Writer};

/// The token secret of the deployment tests' hosts.
pub const SECRET: &[u8] = b"a deployment test secret that is long enough, 256 bits";
/// What `docker-compose.yml` gives each host, the way it gives it.
pub const COMPOSE_ENV: &[(&str, &str)] = &[
    ("TETHER_LEASE_TTL_MS", "10000"),
    ("TETHER_DRAIN_DELAY_MS", "3000"),
];

pub fn admin() -> String {
    Authenticator::new(SECRET)
        .unwrap()
        .mint(
            "deployer",
            Role::Admin,
            &["*".to_owned()],
            Duration::from_secs(3600),
        )
        .unwrap()
}

/// `haproxy -db -f <deploy/haproxy.cfg with this test's addresses>`.
#[derive(Debug)]
pub struct Haproxy {
    port: u16,
    child: tokio::process::Child,
    _config: tempfile::NamedTempFile,
    log: tempfile::NamedTempFile,
}

impl Haproxy {
    /// Runs the shipped configuration in front of `hosts`; `None` when
    /// this machine has no `haproxy`.
    pub async fn start(hosts: &[&ServerProcess]) -> Option<Self> {
        let binary = ["/usr/sbin/haproxy", "/usr/local/sbin/haproxy"]
            .into_iter()
            .find(|path| std::path::Path::new(path).exists());
        let Some(binary) = binary else {
            assert!(
                std::env::var("TETHER_TEST_REQUIRE_HAPROXY").as_deref() != Ok("1"),
                "haproxy is not installed but TETHER_TEST_REQUIRE_HAPROXY=1"
            );
            eprintln!("skipped: haproxy is not installed (apt-get install haproxy)");
            return None;
        };
        let port = free_port();
        let shipped = std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../deploy/haproxy.cfg"
        ))
        .expect("deploy/haproxy.cfg");
        let config = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(config.path(), addressed(&shipped, port, hosts)).unwrap();
        let log = tempfile::NamedTempFile::new().unwrap();
        let child = tokio::process::Command::new(binary)
            .args(["-db", "-f"])
            .arg(config.path())
            .stdin(Stdio::null())
            .stdout(log.reopen().unwrap())
            .stderr(log.reopen().unwrap())
            .kill_on_drop(true)
            .spawn()
            .expect("start haproxy");
        let mut proxy = Self {
            port,
            child,
            _config: config,
            log,
        };
        let ready = format!("{}/readyz", proxy.base_url());
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Ok(Some(status)) = proxy.child.try_wait() {
                panic!("haproxy exited: {status}\n{}", proxy.log());
            }
            if reqwest::get(&ready)
                .await
                .is_ok_and(|r| r.status().is_success())
            {
                return Some(proxy);
            }
            assert!(
                Instant::now() < deadline,
                "haproxy not serving\n{}",
                proxy.log()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    pub fn base_url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.log.path()).unwrap_or_default()
    }
}

/// The shipped configuration with only its addresses changed: the
/// frontend binds a loopback port, and the backend lists `hosts`.
fn addressed(shipped: &str, port: u16, hosts: &[&ServerProcess]) -> String {
    let mut out = String::new();
    let mut servers_written = false;
    for line in shipped.lines() {
        let trimmed = line.trim_start();
        if trimmed.starts_with("bind ") {
            out.push_str(&format!("    bind 127.0.0.1:{port}\n"));
        } else if trimmed.starts_with("server ") {
            if !servers_written {
                for (i, host) in hosts.iter().enumerate() {
                    let address = host.base_url().trim_start_matches("http://").to_owned();
                    out.push_str(&format!("    server tether-{} {address} check\n", i + 1));
                }
                servers_written = true;
            }
        } else {
            out.push_str(line);
            out.push('\n');
        }
    }
    assert!(servers_written, "deploy/haproxy.cfg lists no server");
    out
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port()
}

/// A subscriber of one session through the load balancer.
#[derive(Debug)]
pub struct Follower {
    session: String,
    /// Told the last stored seq once writing stopped.
    until: tokio::sync::oneshot::Sender<u64>,
    /// The snapshot's seq, the serverSeqs delivered after it, and how many
    /// times the connection dropped.
    task: tokio::task::JoinHandle<(i64, Vec<u64>, usize)>,
}

/// Follows `session`'s channel through `base` with the Rust SDK's stream
/// (which reconnects and replays) until it has seen the seq it is told.
pub fn follow(base: &str, token: &str, session: &str) -> Follower {
    let (until, mut until_rx) = tokio::sync::oneshot::channel::<u64>();
    let (base, token, name) = (base.to_owned(), token.to_owned(), session.to_owned());
    let task = tokio::spawn(async move {
        let session = name;
        let config = StreamConfig::new(base).with_tokens(Arc::new(StaticToken::new(token)));
        let channel = format!("ahp-session:/{session}");
        let mut stream = SessionStream::open(config, vec![channel.clone()], Start::Now)
            .await
            .expect("subscribe through haproxy");
        let mut from = -1;
        let mut seqs = Vec::new();
        let mut drops = 0;
        let mut last = None;
        loop {
            if let Some(last) = last
                && seqs.last().is_some_and(|s| *s >= last)
            {
                return (from, seqs, drops);
            }
            let event = tokio::select! {
                event = stream.next() => event,
                got = &mut until_rx, if last.is_none() => {
                    last = Some(got.expect("the last seq"));
                    continue;
                }
            };
            match event {
                Some(StreamEvent::Snapshot(snapshot)) if from < 0 => from = snapshot.from_seq,
                Some(StreamEvent::Envelope(envelope)) if envelope.channel == channel => {
                    seqs.push(envelope.server_seq);
                }
                Some(StreamEvent::Disconnected { .. }) => drops += 1,
                Some(StreamEvent::Resynced) => panic!("{session}: resynced, a gap"),
                Some(StreamEvent::Failed { reason }) => {
                    panic!("{session}: stream failed: {reason}")
                }
                None => panic!("{session}: the stream ended"),
                Some(_) => {}
            }
        }
    });
    Follower {
        session: session.to_owned(),
        until,
        task,
    }
}

/// Asserts that every follower saw its session's stored sequence after
/// its snapshot, gap-free and once.
pub async fn assert_followers_saw_everything(base: &str, token: &str, followers: Vec<Follower>) {
    for follower in followers {
        let session = &follower.session;
        let channel = format!("ahp-session:/{session}");
        let stored: Vec<u64> = ledger::transcript_as(base, session, Some(token))
            .await
            .into_iter()
            .filter(|(_, e)| e["channel"] == channel.as_str())
            .map(|(seq, _)| seq)
            .collect();
        let _ = follower
            .until
            .send(*stored.last().expect("something stored"));
        let (from, seen, drops) = tokio::time::timeout(Duration::from_secs(30), follower.task)
            .await
            .unwrap_or_else(|_| panic!("{session}: the subscriber never caught up"))
            .expect("a subscriber");
        let expected: Vec<u64> = stored.into_iter().filter(|s| *s as i64 > from).collect();
        assert_eq!(seen, expected, "{session}: what the subscriber saw");
        eprintln!(
            "{session}: subscriber saw {} envelopes across {drops} drops",
            seen.len()
        );
    }
}

/// Writers, one per session, through `base`: each retries its `clientSeq`
/// until acknowledged, an attempt giving up after 2 s as a client behind
/// a load balancer would, until stopped.
pub fn write_all(base: &str, token: &str, sessions: &[String]) -> Writing {
    let stop = Arc::new(AtomicBool::new(false));
    let acked: Arc<Vec<std::sync::Mutex<Option<Instant>>>> = Arc::new(
        sessions
            .iter()
            .map(|_| std::sync::Mutex::new(None))
            .collect(),
    );
    let tasks = sessions
        .iter()
        .enumerate()
        .map(|(i, session)| {
            let mut writer =
                Writer::new(session, &format!("w{i}")).authorized(token, Duration::from_secs(2));
            let (base, stop, acked) = (base.to_owned(), stop.clone(), acked.clone());
            tokio::spawn(async move {
                while !stop.load(Ordering::SeqCst) {
                    if matches!(writer.attempt(&base).await, ledger::Attempt::Acked(_)) {
                        *acked[i].lock().unwrap() = writer.last_ack;
                    } else {
                        tokio::time::sleep(Duration::from_millis(20)).await;
                    }
                }
                writer
            })
        })
        .collect();
    Writing { stop, tasks, acked }
}

/// The writers [`write_all`] started.
#[derive(Debug)]
pub struct Writing {
    stop: Arc<AtomicBool>,
    tasks: Vec<tokio::task::JoinHandle<Writer>>,
    /// When each writer's last action was acknowledged.
    acked: Arc<Vec<std::sync::Mutex<Option<Instant>>>>,
}

impl Writing {
    /// Waits until every session had a write acknowledged after `since`,
    /// then `settle` longer; fails after `limit`.
    pub async fn until_all_written_after(&self, since: Instant, limit: Duration, settle: Duration) {
        let began = Instant::now();
        loop {
            let behind: Vec<usize> = (0..self.acked.len())
                .filter(|&i| !self.acked[i].lock().unwrap().is_some_and(|at| at > since))
                .collect();
            if behind.is_empty() {
                break;
            }
            assert!(
                began.elapsed() < limit,
                "writers {behind:?} had nothing acknowledged within {limit:?}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        tokio::time::sleep(settle).await;
    }

    /// Stops the writers and returns them.
    pub async fn stop(self) -> Vec<Writer> {
        self.stop.store(true, Ordering::SeqCst);
        let mut writers = Vec::new();
        for task in self.tasks {
            writers.push(task.await.expect("a writer"));
        }
        writers
    }
}

/// How often `/readyz` of `base` is polled, and how long one poll may take.
pub const POLL: Duration = Duration::from_millis(100);

/// Polls `base`'s `/readyz` until its answer is (`want`) 200 or not
/// (a 503, or no answer within a second), at most `limit`; the time it took.
pub async fn readiness_turns(base: &str, want: bool, limit: Duration) -> Duration {
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(1))
        .build()
        .unwrap();
    let began = Instant::now();
    loop {
        let ready = http
            .get(format!("{base}/readyz"))
            .send()
            .await
            .is_ok_and(|r| r.status().is_success());
        if ready == want {
            return began.elapsed();
        }
        assert!(
            began.elapsed() < limit,
            "{base}/readyz still {} after {limit:?}",
            if want { "failing" } else { "ready" }
        );
        tokio::time::sleep(POLL).await;
    }
}

/// Creates `count` sessions `<prefix>-<i>` in project `p` through `base`.
pub async fn create_sessions(base: &str, token: &str, prefix: &str, count: usize) -> Vec<String> {
    let http = reqwest::Client::new();
    let sessions: Vec<String> = (0..count).map(|i| format!("{prefix}-{i}")).collect();
    for session in &sessions {
        let created = http
            .post(format!("{base}/v1/sessions"))
            .bearer_auth(token)
            .json(&serde_json::json!({"id": session, "project": "p", "workingDirectories": []}))
            .send()
            .await
            .expect("create a session");
        assert_eq!(created.status(), 201, "create {session} through {base}");
    }
    sessions
}

/// `count` hosts `tether-1`… on `db` as the compose file runs them (its
/// settings, authentication on with [`SECRET`]), with `extra` flags. The
/// secret's file lives as long as the returned handle.
pub async fn compose_hosts(
    db: &crate::TestDb,
    count: usize,
    extra: &[&str],
) -> (tempfile::NamedTempFile, Vec<ServerProcess>) {
    let secret = tempfile::NamedTempFile::new().expect("a secret file");
    std::fs::write(secret.path(), SECRET).expect("write the secret");
    let secret_path = secret.path().to_str().expect("a UTF-8 path").to_owned();
    let mut hosts = Vec::new();
    for i in 1..=count {
        let id = format!("tether-{i}");
        let mut args = vec!["--auth-secret-file", &secret_path, "--host-id", &id];
        args.extend_from_slice(extra);
        hosts.push(ServerProcess::start_with_env(db, &args, COMPOSE_ENV).await);
    }
    (secret, hosts)
}
