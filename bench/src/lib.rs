//! `tether-load`: drives a running Tether server over real sockets with
//! real AHP clients and reports what it measured (see `BENCHMARKS.md` at
//! the repository root for the scenarios, commands and targets).
//!
//! The binary is a thin wrapper around [`run`]. Each scenario lives in its
//! own module under [`scenario`]; what they share is here: the server
//! ([`net::Target`]), the lean client ([`wire`]), the dispatcher
//! ([`dispatch`]), measurement ([`measure`]) and the report ([`report`]).

pub mod cli;
pub mod dispatch;
pub mod error;
pub mod measure;
pub mod net;
pub mod report;
pub mod rest;
pub mod scenario;
pub mod wire;

use std::time::{SystemTime, UNIX_EPOCH};

pub use error::{Error, Result};

use crate::cli::{Cli, Scenario};
use crate::net::Target;
use crate::report::Report;
use crate::rest::Rest;

/// What every scenario needs.
#[derive(Debug, Clone)]
pub struct Ctx {
    /// The server.
    pub target: Target,
    /// Its REST API.
    pub rest: Rest,
    /// Its backend, from `/readyz`.
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
    let ready = rest.ready().await?;
    let millis = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis())
        .unwrap_or(0);
    let ctx = Ctx {
        target,
        rest,
        backend: ready.backend,
        run_id: format!("{millis:x}"),
    };
    match &cli.scenario {
        Scenario::Ingest(args) => scenario::ingest::run(&ctx, args).await,
        Scenario::Fanout(args) => scenario::fanout::run(&ctx, args).await,
        Scenario::Connections(args) => scenario::connections::run(&ctx, args).await,
        Scenario::Catchup(args) => scenario::catchup::run(&ctx, args).await,
        Scenario::List(args) => scenario::list::run(&ctx, args).await,
        Scenario::Chat(args) => scenario::chat::run(&ctx, args).await,
    }
}
