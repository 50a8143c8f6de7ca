//! `connections`: N idle subscribers of one session held open. Figures: the
//! server's RSS (`/proc/<pid>/status` VmRSS) before connecting and while
//! holding them, per connection; then one envelope is dispatched and every
//! connection must receive it, proving they were live, not just open.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use serde_json::json;
use tokio::sync::watch;

use super::open_all;
use crate::Ctx;
use crate::cli::ConnectionsArgs;
use crate::error::{Error, Result};
use crate::measure::{CpuWindow, Progress, rss_kib};
use crate::net::small_buffers;
use crate::report::{Phase, Report};
use crate::wire::{RawConn, action_head, create_session, dispatch_frame, quoted, title_action};

/// How long the probe envelope may take to reach every connection.
const PROBE_WAIT: Duration = Duration::from_secs(60);

/// Runs the scenario.
pub async fn run(ctx: &Ctx, args: &ConnectionsArgs) -> Result<Report> {
    let pid = ctx.target.server_pid.ok_or_else(|| {
        Error::msg("connections needs --server-pid: it reads the server's memory from /proc")
    })?;
    let n = args.connections.max(1);
    let params = json!({"connections": n, "hold": args.hold, "sources": ctx.target.sources.len()});
    let mut report = Report::new("connections", Some(ctx.backend.clone()), params);
    crate::net::check_fd_budget(n + 1, Some(pid));

    let mut control = RawConn::new(ctx.target.ws(0, small_buffers()).await?);
    let control_id = ctx.id("control", 0);
    control.initialize(&control_id, &[]).await?;
    let channel = create_session(&mut control, &ctx.id("idle", 0)).await?;
    // Let the server settle after the session's creation before the baseline.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let server_before = rss_kib(Some(pid))?;
    let load_before = rss_kib(None)?;

    // Raw connections: the upstream client costs a task, rings and 128 KiB
    // buffers per connection in the load tool, which at 10,000 connections
    // is memory and CPU taken from the server being measured.
    let received = Arc::new(AtomicU64::new(0));
    let (stop_tx, stop_rx) = watch::channel(false);
    let connect_started = Instant::now();
    let opened = open_all(n, args.concurrency, "connecting", |i| {
        let channel = channel.clone();
        async move {
            let mut conn = RawConn::new(ctx.target.ws(i + 1, small_buffers()).await?);
            conn.initialize(&ctx.id("idle", i), &[&channel]).await?;
            Ok::<_, Error>(conn)
        }
    })
    .await;
    let conns = match opened {
        Ok(conns) => conns,
        Err(err) => {
            return Err(Error::msg(format!(
                "{err}\n(server RSS before connecting: {server_before} KiB)"
            )));
        }
    };
    let connect_seconds = connect_started.elapsed().as_secs_f64();
    let probe_client = control_id.clone();
    let tasks: Vec<_> = conns
        .into_iter()
        .map(|mut conn| {
            let received = received.clone();
            let mut stop = stop_rx.clone();
            let probe_client = probe_client.clone();
            tokio::spawn(async move {
                loop {
                    tokio::select! {
                        _ = stop.changed() => break None,
                        text = conn.next_text() => match text {
                            Ok(text) => {
                                let probe = action_head(&text)
                                    .and_then(|h| h.origin)
                                    .is_some_and(|o| o.client_id == probe_client);
                                if probe {
                                    received.fetch_add(1, Ordering::Relaxed);
                                }
                            }
                            Err(ended) => break Some(ended.to_string()),
                        }
                    }
                }
            })
        })
        .collect();

    let cpu = CpuWindow::start(&[pid])?;
    let hold_until = Instant::now() + Duration::from_secs_f64(args.hold.max(0.5));
    let mut server_peak = 0u64;
    let mut server_last = 0u64;
    let progress = Progress::start(move || format!("holding {n} connections"));
    while Instant::now() < hold_until {
        server_last = rss_kib(Some(pid))?;
        server_peak = server_peak.max(server_last);
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let idle_share = cpu.finish()?;
    progress.finish().await;
    let load_held = rss_kib(None)?;

    // The probe: one envelope must reach all of them.
    let probe_cpu = CpuWindow::start(&[pid])?;
    let probe_started = Instant::now();
    control
        .send(dispatch_frame(&quoted(&channel), 1, &title_action("probe")))
        .await?;
    let deadline = probe_started + PROBE_WAIT;
    while received.load(Ordering::Relaxed) < n as u64 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let probe_seconds = probe_started.elapsed().as_secs_f64();
    let probe_share = probe_cpu.finish()?;
    let got = received.load(Ordering::Relaxed);
    let _ = stop_tx.send(true);
    let mut ended = Vec::new();
    for task in tasks {
        if let Ok(Some(why)) = task.await {
            ended.push(why);
        }
    }
    control.close().await;

    let grown = server_last.saturating_sub(server_before);
    report.phases.push(
        Phase::new(
            format!("{n} idle subscribers held {:.1} s", args.hold),
            idle_share,
        )
        .figure("server RSS before connecting", server_before as f64, "KiB")
        .figure("server RSS holding them", server_last as f64, "KiB")
        .figure("server RSS peak", server_peak as f64, "KiB")
        .figure("server RSS per connection", grown as f64 / n as f64, "KiB")
        .figure(
            "load tool RSS per connection",
            load_held.saturating_sub(load_before) as f64 / n as f64,
            "KiB",
        )
        .figure("connections opened/s", n as f64 / connect_seconds, "conn/s"),
    );
    report.phases.push(
        Phase::new("one envelope to every idle subscriber", probe_share).figure(
            "time until the last one had it",
            probe_seconds * 1000.0,
            "ms",
        ),
    );
    report.check(
        "every connection was live (got the probe envelope)",
        got == n as u64 && ended.is_empty(),
        format!(
            "{got} of {n} got it; {} ended early{}",
            ended.len(),
            ended
                .first()
                .map(|w| format!(" (first: {w})"))
                .unwrap_or_default()
        ),
    );
    Ok(report)
}
