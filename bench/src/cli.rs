//! The command line of `tether-load`.

use clap::{Args, Parser, Subcommand, ValueEnum};

use crate::dialect::Dialect;

/// Drives a running Tether server (or, with --target peer, the reference
/// peer) over real sockets and reports throughput,
/// latency percentiles (HDR histogram) and the CPU the load tool and the
/// server used. Run it on the server's machine: the server's CPU and memory
/// are read from /proc/<--server-pid>.
#[derive(Debug, Parser)]
#[command(name = "tether-load", version)]
pub struct Cli {
    /// Where the server is and how to report.
    #[command(flatten)]
    pub common: Common,
    /// The scenario.
    #[command(subcommand)]
    pub scenario: Scenario,
}

/// Flags every scenario takes.
#[derive(Debug, Args)]
pub struct Common {
    /// Which server is at --url: Tether, or the reference peer (a
    /// hand-rolled Node.js server, BENCHMARKS.md "The reference peer"; its
    /// URL is ws://host:port/ws; it runs only ingest and fanout).
    #[arg(
        long,
        global = true,
        env = "TETHER_LOAD_TARGET",
        value_enum,
        default_value_t = Dialect::Tether
    )]
    pub target: Dialect,

    /// The server's AHP WebSocket (the peer's: ws://host:port/ws). Several
    /// hosts on one database:
    /// comma-separated, one per host; connections are spread over them
    /// round-robin (REST goes to the first).
    #[arg(
        long,
        global = true,
        env = "TETHER_LOAD_URL",
        default_value = "ws://127.0.0.1:7878/ahp",
        value_delimiter = ','
    )]
    pub url: Vec<String>,

    /// The server's REST base URL (default: the --url host and port).
    #[arg(long, global = true, env = "TETHER_LOAD_HTTP")]
    pub http: Option<String>,

    /// The server's process id: its CPU share (/proc/<pid>/stat) is reported
    /// with every figure, and `connections` reads its memory.
    /// Several hosts: comma-separated, in `--url` order; each host's CPU is
    /// reported.
    #[arg(
        long,
        global = true,
        env = "TETHER_LOAD_SERVER_PID",
        value_delimiter = ','
    )]
    pub server_pid: Vec<u32>,

    /// Spread connections over this many source addresses, 127.0.0.1 to
    /// 127.0.0.N (each adds about 28,000 ephemeral ports).
    #[arg(long, global = true, default_value_t = 16)]
    pub sources: usize,

    /// Print one JSON line with the result instead of the human report.
    #[arg(long, global = true)]
    pub json: bool,

    /// Also append the JSON result line to this file (the human report
    /// still goes to stdout).
    #[arg(long, global = true)]
    pub json_file: Option<std::path::PathBuf>,
}

/// Which AHP client drives the sockets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ClientKind {
    /// A lean client on raw tokio-tungstenite: reads only envelope heads,
    /// so the load tool's own CPU does not cap the figures.
    Raw,
    /// The upstream `ahp` + `ahp-ws` client.
    Ahp,
}

impl ClientKind {
    /// Its name in reports.
    pub fn name(self) -> &'static str {
        match self {
            ClientKind::Raw => "raw",
            ClientKind::Ahp => "ahp",
        }
    }
}

/// The scenarios.
#[derive(Debug, Subcommand)]
pub enum Scenario {
    /// N sessions, one dispatcher each, sending as fast as acknowledgements
    /// allow: durable actions/s and ack latency.
    Ingest(IngestArgs),
    /// One session, many subscribers, a steady dispatch rate:
    /// dispatch→delivery latency at every subscriber, deliveries/s, and a
    /// check that nobody missed or reordered an envelope.
    Fanout(FanoutArgs),
    /// N idle subscribers held open: server RSS per connection.
    Connections(ConnectionsArgs),
    /// A session seeded with many envelopes, then clients reconnecting far
    /// behind: envelopes/s replayed.
    Catchup(CatchupArgs),
    /// Many sessions in the store: session-page and projection latency
    /// over REST.
    List(ListArgs),
    /// One long chat: subscribe time, snapshot size and one turn's round
    /// trip as the chat's history grows.
    Chat(ChatArgs),
    /// Typical full-text searches over a store seeded beforehand (the
    /// seed example): latency of each, one at a time.
    Search(SearchArgs),
}

impl Scenario {
    /// Its name on the command line and in reports.
    pub fn name(&self) -> &'static str {
        match self {
            Scenario::Ingest(_) => "ingest",
            Scenario::Fanout(_) => "fanout",
            Scenario::Connections(_) => "connections",
            Scenario::Catchup(_) => "catchup",
            Scenario::List(_) => "list",
            Scenario::Chat(_) => "chat",
            Scenario::Search(_) => "search",
        }
    }
}

/// `search`.
#[derive(Debug, Args)]
pub struct SearchArgs {
    /// Requests timed per query.
    #[arg(long, default_value_t = 200)]
    pub repeat: usize,
    /// Hits per page.
    #[arg(long, default_value_t = 20)]
    pub limit: usize,
}

/// `chat`.
#[derive(Debug, Args)]
pub struct ChatArgs {
    /// Echo turns the chat runs before anything is measured.
    #[arg(long, default_value_t = 10_000)]
    pub turns: u64,
    /// Subscribes measured, each from a fresh connection.
    #[arg(long, default_value_t = 20)]
    pub subscribes: usize,
    /// Turns measured after the seeding.
    #[arg(long, default_value_t = 100)]
    pub probe_turns: usize,
}

/// `ingest`.
#[derive(Debug, Args)]
pub struct IngestArgs {
    /// Sessions, each with its own dispatcher connection.
    #[arg(long, default_value_t = 100)]
    pub sessions: usize,
    /// Dispatches each dispatcher keeps unacknowledged (1: one at a time).
    #[arg(long, default_value_t = 16)]
    pub in_flight: usize,
    /// Seconds measured.
    #[arg(long, default_value_t = 10.0)]
    pub duration: f64,
    /// Seconds of load before measuring starts.
    #[arg(long, default_value_t = 2.0)]
    pub warmup: f64,
    /// The client the dispatchers use.
    #[arg(long, value_enum, default_value_t = ClientKind::Raw)]
    pub client: ClientKind,
}

/// `fanout`.
#[derive(Debug, Args)]
pub struct FanoutArgs {
    /// Subscribers of the one session.
    #[arg(long, default_value_t = 1000)]
    pub subscribers: usize,
    /// Dispatches per second.
    #[arg(long, default_value_t = 200.0)]
    pub rate: f64,
    /// Seconds of dispatching.
    #[arg(long, default_value_t = 10.0)]
    pub duration: f64,
    /// Seconds at the start whose envelopes are checked but not timed.
    #[arg(long, default_value_t = 1.0)]
    pub warmup: f64,
    /// Seconds to wait after the last dispatch for every delivery.
    #[arg(long, default_value_t = 10.0)]
    pub drain: f64,
    /// The client the subscribers use.
    #[arg(long, value_enum, default_value_t = ClientKind::Raw)]
    pub client: ClientKind,
}

/// `connections`.
#[derive(Debug, Args)]
pub struct ConnectionsArgs {
    /// Idle subscribers to open.
    #[arg(long, default_value_t = 10_000)]
    pub connections: usize,
    /// Connections being opened at once.
    #[arg(long, default_value_t = 64)]
    pub concurrency: usize,
    /// Seconds to hold them open (RSS is sampled meanwhile).
    #[arg(long, default_value_t = 5.0)]
    pub hold: f64,
}

/// `catchup`.
#[derive(Debug, Args)]
pub struct CatchupArgs {
    /// Envelopes to seed the session with.
    #[arg(long, default_value_t = 100_000)]
    pub envelopes: u64,
    /// Reconnect this many envelopes behind the end (default: from
    /// serverSeq 0, i.e. the whole session).
    #[arg(long)]
    pub behind: Option<u64>,
    /// Reconnects measured.
    #[arg(long, default_value_t = 5)]
    pub repeat: usize,
    /// Dispatches kept in flight while seeding.
    #[arg(long, default_value_t = 512)]
    pub seed_in_flight: usize,
}

/// `list`.
#[derive(Debug, Args)]
pub struct ListArgs {
    /// Sessions to create (REST `POST /v1/sessions`).
    #[arg(long, default_value_t = 100_000)]
    pub sessions: usize,
    /// Envelopes in the session whose projection is read.
    #[arg(long, default_value_t = 100_000)]
    pub envelopes: u64,
    /// Concurrent REST requests while seeding.
    #[arg(long, default_value_t = 32)]
    pub concurrency: usize,
    /// Requests measured per kind (pages, projections), one at a time.
    #[arg(long, default_value_t = 2_000)]
    pub requests: usize,
    /// Sessions per page.
    #[arg(long, default_value_t = 50)]
    pub page_size: usize,
    /// Dispatches kept in flight while seeding the big session.
    #[arg(long, default_value_t = 512)]
    pub seed_in_flight: usize,
}
