//! `tether-load`: drives a running Tether server over real sockets with
//! real AHP clients and reports what it measured (see `BENCHMARKS.md` at
//! the repository root for the scenarios, commands and targets).
//!
//! The binary is a thin wrapper around [`run`]. Each scenario lives in its
//! own module under [`scenario`]; what they share is here: the server
//! ([`net::Target`]), the lean client ([`wire`]), the dispatcher
//! ([`dispatch`]), measurement ([`measure`]) and the report ([`report`]).
//! `ingest` and `fanout` also drive the reference peer (`--target peer`):
//! what differs between the two servers is in [`dialect`], the peer's
//! frames in [`peer`].

pub mod cli;
pub mod dialect;
pub mod dispatch;
pub mod error;
pub mod measure;
pub mod net;
pub mod peer;
pub mod report;
pub mod rest;
pub mod scenario;
pub mod wire;

use std::time::{SystemTime, UNIX_EPOCH};

pub use error::{Error, Result};

use crate::cli::{Cli, Scenario};
use crate::dialect::Dialect;
use crate::net::Target;
use crate::report::Report;
use crate::rest::Rest;

/// What every scenario needs.
#[derive(Debug, Clone)]
pub struct Ctx {
    /// The server.
    pub target: Target,
    /// Which server it is: how to frame what goes to it and read what comes
    /// back.
    pub dialect: Dialect,
    /// Its REST API (Tether's; the peer has only `/healthz`).
    pub rest: Rest,
    /// Its backend, from `/readyz`; `peer` for the peer.
    pub backend: String,
    /// A prefix that makes this run's session and client ids unique, so
    /// runs against one database never collide.
    pub run_id: String,
}

impl Ctx {
    /// An id unique to this run: `<kind>-<run>-<n>`.
    pub fn id(&self, kind: &str, n: impl std::fmt::Display) -> String {
        format!("{kind}-{}-{n}", self.run_id)
    }
}

/// Runs the scenario the command line names and returns its report.
pub async fn run(cli: Cli) -> Result<Report> {
    let dialect = cli.common.target;
    dialect.check(&cli.scenario)?;
    let (soft, hard) = net::raise_nofile_limit();
    if !cli.common.json {
        eprintln!("open-file limit of the load tool: {soft} (hard {hard})");
    }
    let target = Target::resolve(
        &cli.common.url,
        cli.common.http.as_deref(),
        cli.common.sources,
        &cli.common.server_pid,
    )
    .await?;
    for &pid in &target.server_pids {
        measure::cpu_ticks(Some(pid)).map_err(|e| {
            Error::msg(format!(
                "--server-pid {pid}: {e}; run the load tool on the server's machine"
            ))
        })?;
    }
    let rest = Rest::new(&target.http_url, 64)?;
    let backend = match dialect {
        Dialect::Tether => rest.ready().await?.backend,
        Dialect::Peer => {
            rest.healthy().await?;
            dialect.name().to_owned()
        }
    };
    let millis = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis())
        .unwrap_or(0);
    let ctx = Ctx {
        target,
        dialect,
        rest,
        backend,
        run_id: format!("{millis:x}"),
    };
    match &cli.scenario {
        Scenario::Ingest(args) => scenario::ingest::run(&ctx, args).await,
        Scenario::Fanout(args) => scenario::fanout::run(&ctx, args).await,
        Scenario::Connections(args) => scenario::connections::run(&ctx, args).await,
        Scenario::Catchup(args) => scenario::catchup::run(&ctx, args).await,
        Scenario::List(args) => scenario::list::run(&ctx, args).await,
        Scenario::Chat(args) => scenario::chat::run(&ctx, args).await,
        Scenario::Search(args) => scenario::search::run(&ctx, args).await,
    }
}
