//! `ingest`: N sessions, one dispatcher connection each, every dispatcher
//! keeping `--in-flight` dispatches unacknowledged. Figures: durable
//! actions/s (echoes received in the measured window) and dispatch → echo
//! latency; the server's `serverSeq` is read before and after to check
//! that every acknowledged action was committed.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use serde_json::json;

use super::{open_all, sleep_until};
use crate::Ctx;
use crate::cli::{ClientKind, IngestArgs};
use crate::dispatch::{self, Plan, Stats};
use crate::error::{Error, Result};
use crate::measure::{CpuWindow, Progress};
use crate::report::{Phase, Report};
use crate::wire::{RawConn, create_session};

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
        let mut setup = RawConn::new(ctx.target.ws(h, crate::net::small_buffers()).await?);
        setup.initialize(&ctx.id("setup", h), &[]).await?;
        setups.push(setup);
    }
    let mut channels = Vec::with_capacity(sessions);
    for i in 0..sessions {
        let setup = &mut setups[ctx.target.host_index(i + 1)];
        channels.push(create_session(setup, &ctx.id("ingest", i)).await?);
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
                    let mut conn = RawConn::new(ctx.target.ws(i + 1, Default::default()).await?);
                    conn.initialize(&client_id, &[&channel]).await?;
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

    let before = ctx.rest.ready().await?;
    let acked = Arc::new(AtomicU64::new(0));
    let start = Instant::now() + Duration::from_millis(50);
    let measure_from = start + Duration::from_secs_f64(args.warmup.max(0.0));
    let stop_at = measure_from + Duration::from_secs_f64(args.duration.max(0.1));
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
                Dispatcher::Raw(conn) => dispatch::run_raw(*conn, client_id, channel, plan).await,
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
    let after = ctx.rest.ready().await?;
    if let Some(first) = failures.first() {
        return Err(Error::msg(format!(
            "{} of {sessions} dispatchers failed; first: {first}",
            failures.len()
        )));
    }

    let seconds = stop_at.duration_since(measure_from).as_secs_f64();
    report.phases.push(
        Phase::new(
            format!("{sessions} sessions x {in_flight} in flight, {seconds:.1} s measured"),
            share,
        )
        .figure(
            "durable actions/s",
            total.acked_in_window as f64 / seconds,
            "actions/s",
        )
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
    let committed = after.server_seq.saturating_sub(before.server_seq);
    report.check(
        "every acknowledged action is committed",
        committed >= total.acked - total.rejected,
        format!(
            "serverSeq advanced by {committed}; {} accepted acknowledgements",
            total.acked - total.rejected
        ),
    );
    Ok(report)
}
