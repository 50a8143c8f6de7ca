//! `search`: the latency of typical `GET /v1/search` queries over a store
//! seeded beforehand (`tests/examples/seed_sqlite.rs`, whose messages name
//! one of 997 topics and one of 100,003 tickets and end in the same
//! sentence), one request at a time: a rare word, a topic, a phrase, a
//! prefix and a word every message holds, each `--repeat` times.

use std::time::Instant;

use serde_json::json;

use crate::Ctx;
use crate::cli::SearchArgs;
use crate::error::Result;
use crate::measure::{CpuWindow, Latency};
use crate::report::{Phase, Report};

/// The queries, by what they stand for.
const QUERIES: [(&str, &str); 6] = [
    ("a rare word (about 3 messages)", "ticket12345"),
    ("a topic (about 1 in 1,000 messages)", "topic42"),
    ("a topic and a phrase", "topic42 \"part of the code\""),
    ("a prefix (thousands of words)", "ticket1234*"),
    ("a word in every message, first page", "code"),
    ("a session title", "seed-00042"),
];

/// Runs the scenario.
pub async fn run(ctx: &Ctx, args: &SearchArgs) -> Result<Report> {
    let params = json!({"repeat": args.repeat, "limit": args.limit});
    let mut report = Report::new("search", Some(ctx.backend.clone()), params);
    let ready = ctx.rest.ready().await?;
    for (what, q) in QUERIES {
        let path = format!(
            "/v1/search?limit={}&q={}",
            args.limit,
            q.replace(' ', "+").replace('"', "%22").replace('*', "%2A")
        );
        // One untimed request warms the caches a first query pays for.
        let (first, _) = ctx.rest.timed_get(&path).await?;
        let hits = first["items"].as_array().map_or(0, Vec::len);
        let mut latency = Latency::new();
        let cpu = CpuWindow::start(&ctx.target.server_pids)?;
        let started = Instant::now();
        for _ in 0..args.repeat.max(1) {
            let (_, elapsed) = ctx.rest.timed_get(&path).await?;
            latency.record(elapsed);
        }
        let seconds = started.elapsed().as_secs_f64();
        let share = cpu.finish()?;
        report.phases.push(
            Phase::new(format!("{what}: q={q} x {}", args.repeat), share)
                .figure("hits on the page", hits as f64, "")
                .figure("queries/s", args.repeat as f64 / seconds.max(1e-9), "/s")
                .latency("query latency", latency.summary()),
        );
        report.check(
            format!("{q:?} finds something"),
            hits > 0,
            format!(
                "{hits} hits on the first page of a store at seq {}",
                ready.server_seq
            ),
        );
    }
    Ok(report)
}
