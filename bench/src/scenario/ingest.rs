//! `ingest`: N sessions, one dispatcher connection each, every dispatcher
//! keeping `--in-flight` dispatches unacknowledged. Figures: durable
//! actions/s (echoes received in the measured window) and dispatch → echo
//! latency; the server's `serverSeq` is read before and after to check
//! that every acknowledged action was committed.
//!
//! On the reference peer (`--target peer`) the same dispatchers run with
//! the peer's frames; sessions are just names, and, the peer having no
//! `/readyz`, the commit check reads the span of the `seq`s its events
//! carried instead.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use serde_json::json;

use super::{open_all, sleep_until};
use crate::Ctx;
use crate::cli::{ClientKind, IngestArgs};
use crate::dialect::Dialect;
use crate::dispatch::{self, Plan, Stats};
use crate::error::{Error, Result};
use crate::measure::{CpuWindow, Progress};
use crate::report::{Phase, Report};
use crate::wire::RawConn;

enum Dispatcher {
    Raw(Box<RawConn>),
    Ahp(ahp::Client, ahp::SessionSubscription),
}

/// Runs the scenario.
pub async fn run(ctx: &Ctx, args: &IngestArgs) -> Result<Report> {
    let sessions = args.sessions.max(1);
    let in_flight = args.in_flight.max(1);
    let params = json!({
        "sessions": sessions, "inFlight": in_flight, "duration": args.duration,
        "warmup": args.warmup, "client": args.client.name(), "hosts": ctx.target.hosts.len(),
    });
    let mut report = Report::new("ingest", Some(ctx.backend.clone()), params);
    crate::net::check_fd_budget(sessions + 1, ctx.target.server_pid);

    // Each session is created through the host its dispatcher will use, so
    // with several hosts each one writes its own sessions (a session's
    // first writer holds its lease).
    let mut setups = Vec::with_capacity(ctx.target.hosts.len());
    for h in 0..ctx.target.hosts.len() {
        let setup = ctx
            .dialect
            .connect(
                &ctx.target,
                h,
                crate::net::small_buffers(),
                &ctx.id("setup", h),
                &[],
            )
            .await?;
        setups.push(setup);
    }
    let mut channels = Vec::with_capacity(sessions);
    for i in 0..sessions {
        let setup = &mut setups[ctx.target.host_index(i + 1)];
        let id = ctx.id("ingest", i);
        channels.push(ctx.dialect.create_session(setup, &id).await?);
    }
    for setup in setups {
        setup.close().await;
    }

    let client = args.client;
    let channels = Arc::new(channels);
    let dispatchers = open_all(sessions, 32, "connecting dispatchers", |i| {
        let channels = channels.clone();
        async move {
            let channel = channels[i].clone();
            let client_id = ctx.id("dispatcher", i);
            let dispatcher = match client {
                ClientKind::Raw => {
                    let conn = ctx
                        .dialect
                        .connect(
                            &ctx.target,
                            i + 1,
                            Default::default(),
                            &client_id,
                            &[&channel],
                        )
                        .await?;
                    Dispatcher::Raw(Box::new(conn))
                }
                ClientKind::Ahp => {
                    // Its ring must hold every echo it can be behind by.
                    let ahp = ctx.target.ahp(i + 1, in_flight * 2 + 64).await?;
                    ahp.initialize(
                        client_id.clone(),
                        vec![ahp_types::PROTOCOL_VERSION.into()],
                        Vec::new(),
                    )
                    .await?;
                    let (_, subscription) = ahp.subscribe(channel.clone()).await?;
                    Dispatcher::Ahp(ahp, subscription)
                }
            };
            Ok::<_, Error>((client_id, channel, dispatcher))
        }
    })
    .await?;

    let before = match ctx.dialect {
        Dialect::Tether => Some(ctx.rest.ready().await?.server_seq),
        Dialect::Peer => None,
    };
    let acked = Arc::new(AtomicU64::new(0));
    let start = Instant::now() + Duration::from_millis(50);
    let measure_from = start + Duration::from_secs_f64(args.warmup.max(0.0));
    let stop_at = measure_from + Duration::from_secs_f64(args.duration.max(0.1));
    let dialect = ctx.dialect;
    let plan = Plan {
        in_flight,
        max_actions: u64::MAX,
        stop_at,
        window: (measure_from, stop_at),
        progress: acked.clone(),
    };
    let mut tasks = Vec::with_capacity(sessions);
    for (client_id, channel, dispatcher) in dispatchers {
        let plan = plan.clone();
        tasks.push(tokio::spawn(async move {
            sleep_until(start).await;
            match dispatcher {
                Dispatcher::Raw(conn) => {
                    dispatch::run_raw(*conn, dialect, client_id, channel, plan).await
                }
                Dispatcher::Ahp(client, sub) => {
                    dispatch::run_ahp(client, sub, client_id, channel, plan).await
                }
            }
        }));
    }
    let progress = {
        let acked = acked.clone();
        Progress::start(move || {
            let phase = if Instant::now() < measure_from {
                "warming up"
            } else {
                "measuring"
            };
            format!(
                "ingest: {phase}, {} acknowledged",
                acked.load(Ordering::Relaxed)
            )
        })
    };
    sleep_until(measure_from).await;
    let cpu = CpuWindow::start(&ctx.target.server_pids)?;
    sleep_until(stop_at).await;
    let share = cpu.finish()?;
    let mut total = Stats::default();
    let mut failures = Vec::new();
    for task in tasks {
        match task.await {
            Ok(Ok(stats)) => total.merge(&stats),
            Ok(Err(err)) => failures.push(err.to_string()),
            Err(err) => failures.push(format!("dispatcher task: {err}")),
        }
    }
    progress.finish().await;
    let after = match before {
        Some(_) => Some(ctx.rest.ready().await?.server_seq),
        None => None,
    };
    if let Some(first) = failures.first() {
        return Err(Error::msg(format!(
            "{} of {sessions} dispatchers failed; first: {first}",
            failures.len()
        )));
    }

    let seconds = stop_at.duration_since(measure_from).as_secs_f64();
    let rate = total.acked_in_window as f64 / seconds;
    report.phases.push(
        Phase::new(
            format!("{sessions} sessions x {in_flight} in flight, {seconds:.1} s measured"),
            share,
        )
        .figure("durable actions/s", rate, "actions/s")
        .cpu_per_action(rate)
        .figure("acknowledged in window", total.acked_in_window as f64, "")
        .latency("ack latency (dispatch -> echo)", total.latency.summary()),
    );
    report.check(
        "no dispatch refused",
        total.rejected == 0,
        match &total.first_rejection {
            Some(reason) => format!("{} refused, first: {reason}", total.rejected),
            None => format!("0 of {} refused", total.acked),
        },
    );
    report.check(
        "echoes in dispatch order",
        total.out_of_order == 0,
        format!("{} out of order", total.out_of_order),
    );
    let accepted = total.acked - total.rejected;
    let (committed, evidence) = match (before, after) {
        (Some(before), Some(after)) => {
            let committed = after.saturating_sub(before);
            (committed, format!("serverSeq advanced by {committed}"))
        }
        // The peer: its `seq` is one counter over every session, so the
        // span of those seen bounds how far its log advanced under load.
        _ => match total.seqs {
            Some((low, high)) => {
                let committed = high - low + 1;
                (
                    committed,
                    format!("the peer's seq advanced by {committed} ({low} to {high})"),
                )
            }
            None => (0, "no seq seen".to_owned()),
        },
    };
    report.check(
        "every acknowledged action is committed",
        committed >= accepted,
        format!("{evidence}; {accepted} accepted acknowledgements"),
    );
    Ok(report)
}
