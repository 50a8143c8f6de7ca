//! `list`: `--sessions` sessions created through `POST /v1/sessions`
//! (concurrently; the real create path: validation, commit, read model),
//! and one session seeded with `--envelopes` envelopes over AHP. Figures:
//! latency of `GET /v1/sessions` pages, walking the cursor chain from the
//! newest to the oldest and starting over, and of `GET /v1/sessions/{id}`
//! (the projection) of the big session; one request at a time.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use futures_util::StreamExt as _;
use serde_json::json;

use super::seed_session;
use crate::Ctx;
use crate::cli::ListArgs;
use crate::error::{Error, Result};
use crate::measure::{CpuWindow, Latency, Progress, rss_kib};
use crate::report::{Phase, Report};

/// Runs the scenario.
pub async fn run(ctx: &Ctx, args: &ListArgs) -> Result<Report> {
    let params = json!({
        "sessions": args.sessions, "envelopes": args.envelopes, "requests": args.requests,
        "pageSize": args.page_size, "concurrency": args.concurrency,
    });
    let mut report = Report::new("list", Some(ctx.backend.clone()), params);

    // Seed the sessions.
    let created = Arc::new(AtomicU64::new(0));
    let progress = {
        let created = created.clone();
        let n = args.sessions;
        Progress::start(move || {
            format!("creating sessions: {}/{n}", created.load(Ordering::Relaxed))
        })
    };
    let pid = ctx.target.server_pids.first().copied();
    let rss_before = pid.map(|p| rss_kib(Some(p))).transpose()?;
    let cpu = CpuWindow::start(&ctx.target.server_pids)?;
    let started = Instant::now();
    // When each tenth of the sessions was done: whether creating one costs
    // the same however many exist.
    let tenth = (args.sessions / 10).max(1);
    let mut tenths: Vec<f64> = Vec::new();
    let mut done = 0usize;
    let mut creates = futures_util::stream::iter(0..args.sessions)
        .map(|i| {
            let created = created.clone();
            async move {
                ctx.rest.create_session(&ctx.id("list", i)).await?;
                created.fetch_add(1, Ordering::Relaxed);
                Ok::<_, Error>(())
            }
        })
        .buffer_unordered(args.concurrency.max(1));
    while let Some(result) = creates.next().await {
        result?;
        done += 1;
        if done.is_multiple_of(tenth) {
            tenths.push(started.elapsed().as_secs_f64());
        }
    }
    drop(creates);
    let seconds = started.elapsed().as_secs_f64();
    let share = cpu.finish()?;
    let rss_after = pid.map(|p| rss_kib(Some(p))).transpose()?;
    progress.finish().await;
    let rate = |i: usize| {
        let start = if i == 0 { 0.0 } else { tenths[i - 1] };
        tenth as f64 / (tenths[i] - start).max(1e-9)
    };
    let mut creating = Phase::new(
        format!(
            "creating {} sessions over REST, {} at a time",
            args.sessions, args.concurrency
        ),
        share,
    )
    .figure(
        "sessions created/s",
        args.sessions as f64 / seconds.max(1e-9),
        "sessions/s",
    );
    if tenths.len() >= 2 {
        let (first, last) = (rate(0), rate(tenths.len() - 1));
        creating = creating
            .figure("first tenth", first, "sessions/s")
            .figure("last tenth", last, "sessions/s")
            .figure("last tenth / first tenth", last / first.max(1e-9), "x");
    }
    if let (Some(before), Some(after)) = (rss_before, rss_after) {
        creating = creating.figure(
            "server RSS per session created",
            after.saturating_sub(before) as f64 / args.sessions.max(1) as f64,
            "KiB",
        );
    }
    report.phases.push(creating);

    let big_id = ctx.id("list-big", 0);
    let (_, seeding) = seed_session(ctx, &big_id, args.envelopes, args.seed_in_flight).await?;
    report.phases.push(seeding);
    // Nothing else writes meanwhile, so the big session holds the last seq.
    let seeded_to = ctx.rest.ready().await?.server_seq;

    // Pages, walking the whole list and starting over.
    let requests = args.requests.max(1);
    let done = Arc::new(AtomicU64::new(0));
    let progress = {
        let done = done.clone();
        Progress::start(move || {
            format!(
                "timing requests: {}/{}",
                done.load(Ordering::Relaxed),
                2 * requests
            )
        })
    };
    let mut pages = Latency::new();
    let mut cursor: Option<String> = None;
    let mut walked = 0u64;
    let mut full_walks = 0u64;
    let mut largest_walk = 0u64;
    let cpu = CpuWindow::start(&ctx.target.server_pids)?;
    for _ in 0..requests {
        let path = match &cursor {
            Some(c) => format!("/v1/sessions?limit={}&cursor={c}", args.page_size),
            None => format!("/v1/sessions?limit={}", args.page_size),
        };
        let (page, elapsed) = ctx.rest.timed_get(&path).await?;
        pages.record(elapsed);
        done.fetch_add(1, Ordering::Relaxed);
        walked += page["items"]
            .as_array()
            .map_or(0, |items| items.len() as u64);
        cursor = page["nextCursor"].as_str().map(str::to_owned);
        if cursor.is_none() {
            full_walks += 1;
            largest_walk = largest_walk.max(walked);
            walked = 0;
        }
    }
    let page_share = cpu.finish()?;

    // The big session's projection.
    let mut projections = Latency::new();
    let mut last_seq = 0u64;
    let path = format!("/v1/sessions/{big_id}");
    let cpu = CpuWindow::start(&ctx.target.server_pids)?;
    for _ in 0..requests {
        let (view, elapsed) = ctx.rest.timed_get(&path).await?;
        projections.record(elapsed);
        done.fetch_add(1, Ordering::Relaxed);
        last_seq = view["lastSeq"].as_u64().unwrap_or(0);
    }
    let projection_share = cpu.finish()?;
    progress.finish().await;

    report.phases.push(
        Phase::new(
            format!(
                "GET /v1/sessions?limit={} x {requests}, one at a time",
                args.page_size
            ),
            page_share,
        )
        .figure("full walks of the list", full_walks as f64, "")
        .latency("page latency", pages.summary()),
    );
    report.phases.push(
        Phase::new(
            format!(
                "GET /v1/sessions/{{id}} of a {}-envelope session x {requests}",
                args.envelopes
            ),
            projection_share,
        )
        .latency("projection latency", projections.summary()),
    );
    // A walk sees every session when the run was long enough to finish one.
    let minimum = args.sessions as u64 + 1;
    report.check(
        "a full walk of the pages lists every session",
        full_walks == 0 || largest_walk >= minimum,
        if full_walks == 0 {
            format!("no walk finished in {requests} pages (not checked)")
        } else {
            format!("a walk listed {largest_walk}; at least {minimum} exist")
        },
    );
    report.check(
        "the projection covers every seeded envelope",
        last_seq == seeded_to,
        format!("its lastSeq is {last_seq}; the last envelope seeded is {seeded_to}"),
    );
    Ok(report)
}
