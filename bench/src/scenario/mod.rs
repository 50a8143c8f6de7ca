//! The scenarios, and what several of them do alike: open many connections
//! a few at a time, and seed a session with envelopes.

pub mod catchup;
pub mod chat;
pub mod connections;
pub mod fanout;
pub mod ingest;
pub mod list;
pub mod search;

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use futures_util::StreamExt as _;

use crate::Ctx;
use crate::dialect::Dialect;
use crate::dispatch::{self, Plan};
use crate::error::{Error, Result};
use crate::measure::{CpuWindow, Progress};
use crate::net::small_buffers;
use crate::report::Phase;
use crate::wire::{RawConn, create_session};

/// Runs `open(i)` for `0..n`, `concurrency` at a time (a burst of thousands
/// of simultaneous connects overflows the server's listen backlog, which
/// would measure the kernel, not the server); stops at the first error.
pub async fn open_all<T, F, Fut>(
    n: usize,
    concurrency: usize,
    label: &str,
    open: F,
) -> Result<Vec<T>>
where
    F: Fn(usize) -> Fut,
    Fut: Future<Output = Result<T>>,
{
    let done = Arc::new(AtomicU64::new(0));
    let progress = {
        let done = done.clone();
        let label = label.to_owned();
        Progress::start(move || format!("{label}: {}/{n}", done.load(Ordering::Relaxed)))
    };
    let mut opened = Vec::with_capacity(n);
    let mut pending =
        futures_util::stream::iter((0..n).map(&open)).buffer_unordered(concurrency.max(1));
    while let Some(result) = pending.next().await {
        match result {
            Ok(item) => {
                opened.push(item);
                done.fetch_add(1, Ordering::Relaxed);
            }
            Err(err) => {
                progress.finish().await;
                return Err(Error::msg(format!(
                    "{label}: {} of {n} open, then: {err}",
                    opened.len()
                )));
            }
        }
    }
    progress.finish().await;
    Ok(opened)
}

/// Creates a session and dispatches `count` title changes into it through
/// one pipelined dispatcher (`in_flight` unacknowledged at a time). Returns
/// its channel and the seeding phase (a durable ingest rate into one session).
pub async fn seed_session(
    ctx: &Ctx,
    id: &str,
    count: u64,
    in_flight: usize,
) -> Result<(String, Phase)> {
    let mut conn = RawConn::new(ctx.target.ws(0, small_buffers()).await?);
    let client_id = ctx.id("seeder", id);
    conn.initialize(&client_id, &[]).await?;
    let channel = create_session(&mut conn, id).await?;
    conn.request("subscribe", serde_json::json!({"channel": channel}))
        .await?;
    let progress_count = Arc::new(AtomicU64::new(0));
    let progress = {
        let seen = progress_count.clone();
        let id = id.to_owned();
        Progress::start(move || {
            format!(
                "seeding {id}: {}/{count} envelopes",
                seen.load(Ordering::Relaxed)
            )
        })
    };
    let far = Instant::now() + Duration::from_secs(365 * 24 * 3600);
    let plan = Plan {
        in_flight: in_flight.max(1),
        max_actions: count,
        stop_at: far,
        window: (Instant::now(), far),
        progress: progress_count,
    };
    let cpu = CpuWindow::start(&ctx.target.server_pids)?;
    let started = Instant::now();
    let stats = dispatch::run_raw(conn, Dialect::Tether, client_id, channel.clone(), plan).await?;
    let seconds = started.elapsed().as_secs_f64();
    let share = cpu.finish()?;
    progress.finish().await;
    if stats.rejected > 0 {
        return Err(Error::msg(format!(
            "seeding {id}: {} of {count} dispatches refused, first: {}",
            stats.rejected,
            stats.first_rejection.unwrap_or_default()
        )));
    }
    let phase = Phase::new(
        format!("seeding one session with {count} envelopes ({in_flight} in flight)"),
        share,
    )
    .figure(
        "durable actions/s",
        stats.acked as f64 / seconds,
        "actions/s",
    )
    .latency("ack latency", stats.latency.summary());
    Ok((channel, phase))
}

/// Sleeps until `at` (no-op when it has passed).
pub async fn sleep_until(at: Instant) {
    if at > Instant::now() {
        tokio::time::sleep_until(at.into()).await;
    }
}
