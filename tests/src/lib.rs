//! Test support: a fresh database per test on either backend, and the real
//! server started on a port-0 listener.
//!
//! Postgres tests run when `TETHER_TEST_POSTGRES_URL` names a server (any
//! database on it; each test creates and drops its own). Without it they skip
//! with a loud message, unless `TETHER_TEST_REQUIRE_POSTGRES=1` (set by CI),
//! which turns the skip into a failure.

pub mod ahp_raw;
mod db;
pub mod deploy;
pub mod ledger;
pub mod seed;
pub mod store_reads;

pub use db::{Backend, HeldWrites, POSTGRES_URL_ENV, REQUIRE_POSTGRES_ENV, TestDb};

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use tether_server::config::ServeConfig;
use tether_server::store::Store;
use tether_server::{AppState, serve};
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

/// A REST call without a token: its status and JSON body (`null` when the
/// body is not JSON).
pub async fn call(
    base: &str,
    method: &str,
    path: &str,
    body: Option<serde_json::Value>,
) -> (u16, serde_json::Value) {
    let method = reqwest::Method::from_bytes(method.as_bytes()).expect("a method");
    let mut request = reqwest::Client::new().request(method, format!("{base}{path}"));
    if let Some(body) = body {
        request = request.json(&body);
    }
    let response = request.send().await.expect("the server answers");
    let status = response.status().as_u16();
    let text = response.text().await.unwrap_or_default();
    (
        status,
        serde_json::from_str(&text).unwrap_or(serde_json::Value::Null),
    )
}

/// A server running in this process on a real socket.
#[derive(Debug)]
pub struct TestServer {
    /// Where it listens.
    pub addr: SocketAddr,
    stop: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<std::io::Result<()>>>,
}

impl TestServer {
    /// Starts a server on `db` with default settings.
    pub async fn start(db: &TestDb) -> Self {
        Self::start_with(db.open().await, ServeConfig::default()).await
    }

    /// Starts a server on an open store with the given settings.
    pub async fn start_with(store: Arc<dyn Store>, config: ServeConfig) -> Self {
        if std::env::var_os("RUST_LOG").is_some() {
            tether_server::telemetry::init(tether_server::config::LogFormat::Text);
        }
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind port 0");
        let addr = listener.local_addr().expect("local address");
        let (stop, stopped) = oneshot::channel::<()>();
        let state = AppState::new(store, config)
            .await
            .expect("start the engine");
        let task = tokio::spawn(serve(listener, state, async move {
            let _ = stopped.await;
        }));
        Self {
            addr,
            stop: Some(stop),
            task: Some(task),
        }
    }

    /// `http://<addr>`.
    pub fn base_url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// `ws://<addr>/ahp`.
    pub fn ws_url(&self) -> String {
        format!("ws://{}/ahp", self.addr)
    }

    /// An upstream AHP client connected to this server (not yet initialized).
    pub async fn ahp(&self) -> ahp::Client {
        self.ahp_with(ahp::ClientConfig::default()).await
    }

    /// An upstream AHP client whose event ring holds `buffer` events (not yet
    /// initialized): large enough, every loss a test sees is the server's.
    pub async fn ahp_buffered(&self, buffer: usize) -> ahp::Client {
        self.ahp_with(ahp::ClientConfig {
            subscription_buffer: buffer,
            ..ahp::ClientConfig::default()
        })
        .await
    }

    async fn ahp_with(&self, config: ahp::ClientConfig) -> ahp::Client {
        let transport = ahp_ws::WebSocketTransport::connect(&self.ws_url())
            .await
            .expect("connect the AHP WebSocket");
        ahp::Client::connect(transport, config)
            .await
            .expect("start the AHP client")
    }

    /// An upstream AHP client, connected and initialized as `client_id`.
    pub async fn initialized(&self, client_id: &str) -> ahp::Client {
        initialized_at(&self.ws_url(), client_id).await
    }

    /// An upstream AHP client initialized as `client_id` with durable
    /// origins (`_meta: {"tether/durableOrigins": true}`): its
    /// `(clientId, clientSeq)` pairs keep their outcome across connections.
    pub async fn initialized_durable(&self, client_id: &str) -> ahp::Client {
        let client = self.ahp().await;
        let _: serde_json::Value = client
            .request(
                "initialize",
                serde_json::json!({
                    "channel": ahp_types::ROOT_RESOURCE_URI,
                    "clientId": client_id,
                    "protocolVersions": [ahp_types::PROTOCOL_VERSION],
                    "_meta": {"tether/durableOrigins": true},
                }),
            )
            .await
            .expect("initialize with durable origins");
        client
    }

    /// A REST client for this server.
    pub fn client(&self) -> tether_client::Client {
        tether_client::Client::new(&self.base_url()).expect("valid base URL")
    }

    /// Shuts the server down gracefully and waits for it (and its store) to
    /// close.
    pub async fn stop(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(task) = self.task.take() {
            task.await.expect("server task").expect("server result");
        }
    }
}

/// The real `tether` binary serving a database on a fixed loopback port, so
/// that it can be killed and started again at the same address.
#[derive(Debug)]
pub struct ServerProcess {
    port: u16,
    database_url: String,
    args: Vec<String>,
    /// Environment variables it is started with (besides the test's own,
    /// minus every `TETHER_*`).
    env: Vec<(String, String)>,
    child: Option<tokio::process::Child>,
    /// Its stderr, kept across restarts (unless TETHER_TEST_SERVER_LOGS
    /// shows it instead).
    log: tempfile::NamedTempFile,
}

impl ServerProcess {
    /// Starts `tether serve` on a free port for `db`, with extra `args`, and
    /// waits until it is ready.
    pub async fn start(db: &TestDb, args: &[&str]) -> Self {
        Self::start_with_env(db, args, &[]).await
    }

    /// Starts `tether serve` as [`ServerProcess::start`] does, with extra
    /// environment variables.
    pub async fn start_with_env(db: &TestDb, args: &[&str], env: &[(&str, &str)]) -> Self {
        Self::start_on(db.url(), args, env).await
    }

    /// Starts `tether serve` on the database at `database_url` (a test's
    /// database reached some other way, such as through a [`Proxy`]).
    pub async fn start_on(database_url: &str, args: &[&str], env: &[(&str, &str)]) -> Self {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port")
            .port();
        let mut server = Self {
            port,
            database_url: database_url.to_owned(),
            args: args.iter().map(|a| (*a).to_owned()).collect(),
            env: env
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
            child: None,
            log: tempfile::NamedTempFile::new().expect("a log file"),
        };
        server.restart().await;
        server
    }

    /// `http://127.0.0.1:<port>`.
    pub fn base_url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// `ws://127.0.0.1:<port>/ahp`.
    pub fn ws_url(&self) -> String {
        format!("ws://127.0.0.1:{}/ahp", self.port)
    }

    /// A REST client for this process.
    pub fn client(&self) -> tether_client::Client {
        tether_client::Client::new(&self.base_url()).expect("valid base URL")
    }

    /// Stops the process with SIGTERM (a graceful shutdown) and waits.
    pub async fn terminate(&mut self) {
        let _ = self
            .terminate_within(std::time::Duration::from_secs(30))
            .await;
    }

    /// Sends SIGTERM and waits at most `limit` for the process to exit:
    /// its exit status, or `None` when it was still running (it is then
    /// killed).
    pub async fn terminate_within(
        &mut self,
        limit: std::time::Duration,
    ) -> Option<std::process::ExitStatus> {
        let mut child = self.child.take()?;
        self.signal_term(&child);
        match tokio::time::timeout(limit, child.wait()).await {
            Ok(status) => status.ok(),
            Err(_) => {
                let _ = child.kill().await;
                None
            }
        }
    }

    /// Sends SIGTERM and returns at once, leaving the process to shut down;
    /// [`ServerProcess::wait_exit`] waits for it.
    pub fn begin_terminate(&self) {
        if let Some(child) = &self.child {
            self.signal_term(child);
        }
    }

    /// Waits at most `limit` for the process to exit.
    pub async fn wait_exit(
        &mut self,
        limit: std::time::Duration,
    ) -> Option<std::process::ExitStatus> {
        let child = self.child.as_mut()?;
        let status = tokio::time::timeout(limit, child.wait()).await.ok()?.ok();
        self.child = None;
        status
    }

    fn signal_term(&self, child: &tokio::process::Child) {
        if let Some(pid) = child.id() {
            let _ = std::process::Command::new("kill")
                .args(["-TERM", &pid.to_string()])
                .status();
        }
    }

    /// The running process's id.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().and_then(tokio::process::Child::id)
    }

    /// What the process wrote to stderr so far (its log), across restarts.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.log.path()).unwrap_or_default()
    }

    /// Kills the process with SIGKILL: no graceful shutdown, no store close.
    pub async fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            child.kill().await.expect("kill the server");
        }
    }

    /// Starts the process (again) at the same address and waits until it
    /// answers `/readyz`.
    pub async fn restart(&mut self) {
        self.kill().await;
        let mut command = tokio::process::Command::new(tether_bin());
        for (key, _) in std::env::vars() {
            if key.starts_with("TETHER_") {
                command.env_remove(key);
            }
        }
        let child = command
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .args(["serve", "--bind", &format!("127.0.0.1:{}", self.port)])
            .args(["--database-url", &self.database_url])
            .args(&self.args)
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            // TETHER_TEST_SERVER_LOGS=1 shows the servers' logs (RUST_LOG
            // picks what they log).
            .stderr(if std::env::var_os("TETHER_TEST_SERVER_LOGS").is_some() {
                std::process::Stdio::inherit()
            } else {
                self.log
                    .reopen()
                    .and_then(|file| {
                        use std::io::Seek;
                        let mut file = file;
                        file.seek(std::io::SeekFrom::End(0))?;
                        Ok(file)
                    })
                    .map_or_else(|_| std::process::Stdio::null(), std::process::Stdio::from)
            })
            .kill_on_drop(true)
            .spawn()
            .expect("start tether serve");
        self.child = Some(child);
        let client = reqwest::Client::new();
        let ready = format!("{}/readyz", self.base_url());
        let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(30);
        loop {
            if let Ok(answer) = client.get(&ready).send().await
                && answer.status().is_success()
            {
                return;
            }
            if let Some(child) = self.child.as_mut()
                && let Ok(Some(status)) = child.try_wait()
            {
                panic!(
                    "tether serve exited during start-up: {status}; log:\n{}",
                    self.log()
                );
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "tether serve did not become ready on port {}",
                self.port
            );
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
    }
}

/// A TCP proxy in front of a server, whose connections a test can cut.
#[derive(Debug)]
pub struct Proxy {
    addr: SocketAddr,
    cut: tokio::sync::watch::Sender<u64>,
    /// The generation of connections whose replies are dropped (a cut
    /// starts a new generation, so muting ends with the connections muted).
    muted: Arc<std::sync::atomic::AtomicU64>,
    /// The same, for what clients send.
    muted_requests: Arc<std::sync::atomic::AtomicU64>,
    /// While true nothing passes either way and nothing is dropped: the
    /// bytes wait, as on a network path that stopped delivering while TCP
    /// retransmits (a partition), and flow again once it is false.
    stalled: tokio::sync::watch::Sender<bool>,
    task: JoinHandle<()>,
}

impl Proxy {
    /// Listens on a free loopback port and forwards every connection to
    /// `target`.
    pub async fn start(target: SocketAddr) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("proxy address");
        let (cut, _) = tokio::sync::watch::channel(0_u64);
        let muted = Arc::new(std::sync::atomic::AtomicU64::new(u64::MAX));
        let muted_requests = Arc::new(std::sync::atomic::AtomicU64::new(u64::MAX));
        let cuts = cut.clone();
        let mute = muted.clone();
        let mute_requests = muted_requests.clone();
        let (stalled, _) = tokio::sync::watch::channel(false);
        let stalls = stalled.clone();
        let task = tokio::spawn(async move {
            while let Ok((downstream, _)) = listener.accept().await {
                let mut cut = cuts.subscribe();
                let generation = *cut.borrow_and_update();
                let muted = mute.clone();
                let muted_requests = mute_requests.clone();
                let (stall_up, stall_down) = (stalls.subscribe(), stalls.subscribe());
                tokio::spawn(async move {
                    let Ok(upstream) = tokio::net::TcpStream::connect(target).await else {
                        return;
                    };
                    let (mut down_read, mut down_write) = downstream.into_split();
                    let (mut up_read, mut up_write) = upstream.into_split();
                    let to_server = forward(
                        &mut down_read,
                        &mut up_write,
                        &muted_requests,
                        generation,
                        stall_up,
                    );
                    let to_client = forward(
                        &mut up_read,
                        &mut down_write,
                        &muted,
                        generation,
                        stall_down,
                    );
                    tokio::select! {
                        _ = to_server => {}
                        _ = to_client => {}
                        _ = cut.changed() => {}
                    }
                });
            }
        });
        Self {
            addr,
            cut,
            muted,
            muted_requests,
            stalled,
            task,
        }
    }

    /// `http://<proxy address>`.
    pub fn base_url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// From now on, drops what the server sends on open connections (what
    /// the client sends still arrives), until the next [`Proxy::cut`].
    pub fn mute_replies(&self) {
        self.muted
            .store(*self.cut.borrow(), std::sync::atomic::Ordering::SeqCst);
    }

    /// From now on, drops what clients send on open connections (what the
    /// server sends still arrives), until the next [`Proxy::cut`].
    pub fn mute_requests(&self) {
        self.muted_requests
            .store(*self.cut.borrow(), std::sync::atomic::Ordering::SeqCst);
    }

    /// Drops every open connection (new ones are forwarded normally).
    pub fn cut(&self) {
        self.cut.send_modify(|n| *n += 1);
    }

    /// From now on nothing passes, either way, on any connection, open or
    /// new (new ones are accepted and hang), and nothing is lost: a
    /// partition, until [`Proxy::heal`].
    pub fn stall(&self) {
        self.stalled.send_replace(true);
    }

    /// Ends [`Proxy::stall`]: what waited flows on.
    pub fn heal(&self) {
        self.stalled.send_replace(false);
    }

    /// `host:port` of the proxy.
    pub fn address(&self) -> SocketAddr {
        self.addr
    }
}

/// Copies `from` to `to`, dropping the bytes while `muted` names this
/// connection's generation.
async fn forward(
    from: &mut tokio::net::tcp::OwnedReadHalf,
    to: &mut tokio::net::tcp::OwnedWriteHalf,
    muted: &std::sync::atomic::AtomicU64,
    generation: u64,
    mut stalled: tokio::sync::watch::Receiver<bool>,
) -> std::io::Result<()> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut buffer = vec![0_u8; 64 * 1024];
    loop {
        // Stalled: read nothing (the sender's buffers fill and it waits).
        if stalled.wait_for(|stalled| !stalled).await.is_err() {
            return Ok(());
        }
        let n = from.read(&mut buffer).await?;
        if n > 0 && *stalled.borrow() {
            // Read just as the stall began: hold these bytes until it ends.
            if stalled.wait_for(|stalled| !stalled).await.is_err() {
                return Ok(());
            }
        }
        if n == 0 {
            return Ok(());
        }
        if muted.load(std::sync::atomic::Ordering::SeqCst) != generation {
            to.write_all(&buffer[..n]).await?;
        }
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Dispatches `session/titleChanged` with titles `t<i>` for each `i` in
/// `range`, as client `producer` with `clientSeq` `i`, over REST.
pub async fn produce_titles(
    client: &tether_client::Client,
    session: &str,
    range: std::ops::Range<u64>,
) {
    for i in range {
        client
            .dispatch(
                session,
                &tether_protocol::rest::DispatchRequest {
                    client_id: "producer".into(),
                    client_seq: i,
                    channel: None,
                    action: serde_json::json!({"type": "session/titleChanged", "title": format!("t{i}")}),
                },
            )
            .await
            .expect("dispatch");
    }
}

/// The path of the `tether` binary built alongside these tests.
pub fn tether_bin() -> PathBuf {
    let exe = std::env::current_exe().expect("current test executable");
    let dir = exe
        .parent()
        .and_then(|deps| deps.parent())
        .expect("target directory");
    let bin = dir.join(format!("tether{}", std::env::consts::EXE_SUFFIX));
    assert!(
        bin.exists(),
        "{} is missing: run the tests with `cargo test --workspace`, which builds it",
        bin.display()
    );
    bin
}

/// Declares each named `async fn(TestDb)` as two tests, `sqlite::NAME` and
/// `postgres::NAME`, each on a fresh database of its backend.
#[macro_export]
macro_rules! backend_tests {
    ($($name:ident),* $(,)?) => {
        mod sqlite {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    if let Some(db) = $crate::TestDb::new($crate::Backend::Sqlite).await {
                        super::$name(db).await;
                    }
                }
            )*
        }
        mod postgres {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    if let Some(db) = $crate::TestDb::new($crate::Backend::Postgres).await {
                        super::$name(db).await;
                    }
                }
            )*
        }
    };
}

/// How long a test waits for an envelope before failing.
pub const ENVELOPE_WAIT: std::time::Duration = std::time::Duration::from_secs(20);

/// An AHP action from its JSON form.
pub fn action(value: serde_json::Value) -> ahp_types::actions::StateAction {
    serde_json::from_value(value).expect("a StateAction")
}

/// An upstream AHP client connected to `url` without a token, initialized
/// as `client_id`.
pub async fn initialized_at(url: &str, client_id: &str) -> ahp::Client {
    let transport = ahp_ws::WebSocketTransport::connect(url)
        .await
        .expect("connect the AHP WebSocket");
    initialize_on(transport, client_id, Vec::new()).await
}

/// An upstream AHP client on the WebSocket at `url` with `token` in the
/// upgrade's `Authorization` header, initialized as `client_id` with
/// `subscriptions`.
pub async fn ahp_with_token(
    url: &str,
    token: &str,
    client_id: &str,
    subscriptions: Vec<String>,
) -> ahp::Client {
    use tokio_tungstenite::tungstenite::client::IntoClientRequest;
    let mut request = url.into_client_request().expect("a WebSocket URL");
    request.headers_mut().insert(
        "authorization",
        format!("Bearer {token}").parse().expect("a header value"),
    );
    let (stream, _) = tokio_tungstenite::connect_async(request)
        .await
        .expect("the upgrade is accepted");
    let transport = ahp_ws::WebSocketTransport::from_stream(stream);
    initialize_on(transport, client_id, subscriptions).await
}

/// An upstream AHP client on `transport`, initialized as `client_id` with
/// `subscriptions`.
async fn initialize_on(
    transport: ahp_ws::WebSocketTransport,
    client_id: &str,
    subscriptions: Vec<String>,
) -> ahp::Client {
    let client = ahp::Client::connect(transport, ahp::ClientConfig::default())
        .await
        .expect("start the AHP client");
    client
        .initialize(
            client_id.into(),
            vec![ahp_types::PROTOCOL_VERSION.into()],
            subscriptions,
        )
        .await
        .expect("initialize");
    client
}

/// The next action envelope on a subscription (other events skipped).
pub async fn next_envelope(
    subscription: &mut ahp::SessionSubscription,
) -> ahp_types::actions::ActionEnvelope {
    loop {
        let event = tokio::time::timeout(ENVELOPE_WAIT, subscription.recv())
            .await
            .expect("an envelope in time")
            .expect("subscription open");
        if let ahp::SubscriptionEvent::Action(envelope) = event {
            return envelope;
        }
    }
}

/// Whether `pid` is a live process (not gone, not a zombie).
pub fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
        stat.rsplit(')')
            .next()
            .is_some_and(|rest| !rest.trim_start().starts_with('Z'))
    })
}

/// Whether `pid` is gone within 5 s.
pub async fn gone(pid: u32) -> bool {
    for _ in 0..200 {
        if !alive(pid) {
            return true;
        }
        tokio::time::sleep(std::time::Duration::from_millis(25)).await;
    }
    false
}

/// A token for `sub` with `role` in `projects` (every project when none),
/// signed with `secret` as `--auth-secret-file` holds it, valid an hour.
pub fn mint(secret: &str, sub: &str, role: tether_server::auth::Role, projects: &[&str]) -> String {
    let projects: Vec<String> = projects.iter().map(|p| (*p).to_owned()).collect();
    tether_server::auth::token::Authenticator::new(secret.as_bytes())
        .expect("a strong secret")
        .mint(sub, role, &projects, std::time::Duration::from_secs(3600))
        .expect("mint")
}

/// Creates session `id` with `provider` over REST, asserting 201.
pub async fn create_session(base: &str, id: &str, provider: &str) {
    let answer = reqwest::Client::new()
        .post(format!("{base}/v1/sessions"))
        .json(&serde_json::json!({"id": id, "provider": provider}))
        .send()
        .await
        .expect("create a session");
    let status = answer.status();
    assert_eq!(status, 201, "{}", answer.text().await.unwrap_or_default());
}

/// The value of metric `name` in an OpenMetrics exposition, summed over
/// its label sets (`name{a="b"} 3`); `None` when no series has that name.
pub fn metric_value(exposition: &str, name: &str) -> Option<f64> {
    let values: Vec<f64> = exposition
        .lines()
        .filter_map(|line| {
            let rest = line.strip_prefix(name)?;
            let value = if rest.starts_with('{') {
                rest.split_once("} ")?.1
            } else {
                rest.strip_prefix(' ')?
            };
            value.split(' ').next()?.parse().ok()
        })
        .collect();
    (!values.is_empty()).then(|| values.iter().sum())
}

/// Metric `name` of the server at `base` (authentication off), summed over
/// its label sets; panics when it is not served.
pub async fn metric(base: &str, name: &str) -> u64 {
    let text = reqwest::get(format!("{base}/metrics"))
        .await
        .expect("GET /metrics")
        .text()
        .await
        .expect("the exposition");
    metric_value(&text, name).unwrap_or_else(|| panic!("{name} missing from {text}")) as u64
}

/// Asserts a refusal: the status, and a problem whose `detail` contains
/// `needle` (compared in lower case).
pub fn assert_refused(status: u16, problem: &serde_json::Value, expected: u16, needle: &str) {
    assert_eq!(status, expected, "{problem}");
    let detail = problem["detail"]
        .as_str()
        .unwrap_or_default()
        .to_lowercase();
    assert!(
        detail.contains(&needle.to_lowercase()),
        "{needle:?} not in {problem}"
    );
}

/// The `title` field of an envelope's action (empty when absent).
pub fn title_of(envelope: &ahp_types::actions::ActionEnvelope) -> String {
    serde_json::to_value(&envelope.action).expect("serialisable")["title"]
        .as_str()
        .unwrap_or_default()
        .to_owned()
}

/// A raw WebSocket, for what no client library would send.
pub type RawWs =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

/// A raw WebSocket to the server's `/ahp` (not initialized).
pub async fn raw(server: &TestServer) -> RawWs {
    raw_at(&server.ws_url()).await
}

/// A raw WebSocket to `url` (not initialized).
pub async fn raw_at(url: &str) -> RawWs {
    tokio_tungstenite::connect_async(url)
        .await
        .expect("connect the WebSocket")
        .0
}

/// Sends one text frame.
pub async fn raw_send(ws: &mut RawWs, text: &str) {
    use futures_util::SinkExt;
    ws.send(tokio_tungstenite::tungstenite::Message::Text(text.into()))
        .await
        .expect("send a frame");
}

/// The next JSON message, or the close frame's code and reason.
pub async fn raw_next(ws: &mut RawWs) -> Result<serde_json::Value, (u16, String)> {
    use futures_util::StreamExt;
    use tokio_tungstenite::tungstenite::Message;
    loop {
        let message = tokio::time::timeout(ENVELOPE_WAIT, ws.next())
            .await
            .expect("a message in time")
            .expect("stream open");
        match message {
            Ok(Message::Text(text)) => return Ok(serde_json::from_str(&text).expect("JSON")),
            Ok(Message::Close(frame)) => {
                let frame = frame.expect("a close frame with a code");
                return Err((frame.code.into(), frame.reason.to_string()));
            }
            Ok(_) => continue,
            Err(err) => return Err((0, err.to_string())),
        }
    }
}
