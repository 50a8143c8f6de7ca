//! `catchup`: a session seeded with `--envelopes` envelopes, then fresh
//! clients reconnecting far behind (`reconnect` from serverSeq 0, or
//! `--behind` envelopes before the end). Figure: envelopes/s replayed, from
//! sending `reconnect` to the last byte of its reply; the reply is then
//! checked (untimed) by decoding it with the upstream AHP types.
//!
//! The server replays at most `--max-replay` envelopes and
//! `--max-replay-bytes` bytes (defaults 10,000 and 8 MiB); past either it
//! answers with snapshots, which this scenario reports as a failure naming
//! the flags to raise.
//!
//! Raw socket, not the upstream client: a 100,000-envelope reply is about
//! 20 MiB in one frame, over the upstream client's 16 MiB frame limit, and
//! its double decode of the reply would be timed as replay.

use std::time::Instant;

use ahp_types::commands::ReconnectResult;
use serde_json::{Value, json};
use tokio_tungstenite::tungstenite::protocol::WebSocketConfig;

use super::seed_session;
use crate::Ctx;
use crate::cli::CatchupArgs;
use crate::error::{Error, Result};
use crate::measure::{CpuShare, CpuWindow, Latency};
use crate::report::{Phase, Report};
use crate::wire::{REQUEST_TIMEOUT, RawConn};

/// Bytes the server counts per replayed envelope besides its action text
/// and channel (its `--max-replay-bytes` estimate).
const SERVER_ENVELOPE_OVERHEAD: usize = 64;

/// Runs the scenario.
pub async fn run(ctx: &Ctx, args: &CatchupArgs) -> Result<Report> {
    let count = args.envelopes.max(1);
    let params = json!({
        "envelopes": count, "behind": args.behind, "repeat": args.repeat,
        "seedInFlight": args.seed_in_flight,
    });
    let mut report = Report::new("catchup", Some(ctx.backend.clone()), params);
    let id = ctx.id("catchup", 0);
    let (channel, seeding) = seed_session(ctx, &id, count, args.seed_in_flight).await?;
    report.phases.push(seeding);
    let last = ctx.rest.ready().await?.server_seq;
    let from = args.behind.map_or(0, |behind| last.saturating_sub(behind));

    let mut durations = Latency::new();
    let mut cpu: Option<CpuShare> = None;
    let mut replayed = 0usize;
    let mut bytes = 0usize;
    let mut best = f64::INFINITY;
    for attempt in 0..args.repeat.max(1) {
        let config = WebSocketConfig::default()
            .max_message_size(None)
            .max_frame_size(None);
        let mut conn = RawConn::new(ctx.target.ws(attempt, config).await?);
        let request = json!({
            "jsonrpc": "2.0", "id": 1, "method": "reconnect",
            "params": {
                "channel": ahp_types::ROOT_RESOURCE_URI,
                "clientId": ctx.id("catchup-client", attempt),
                "lastSeenServerSeq": from,
                "subscriptions": [channel],
            },
        })
        .to_string();
        let window = CpuWindow::start(&ctx.target.server_pids)?;
        let started = Instant::now();
        conn.send(request).await?;
        let reply = tokio::time::timeout(REQUEST_TIMEOUT, async {
            loop {
                let text = conn
                    .next_text()
                    .await
                    .map_err(|e| Error::msg(format!("reconnect: {e}")))?;
                // The reply is the only frame with an id; check cheaply
                // before a full decode.
                if text.starts_with('{') && text.contains("\"id\"") {
                    return Ok::<_, Error>(text);
                }
            }
        })
        .await
        .map_err(|_| Error::msg(format!("reconnect: no reply in {REQUEST_TIMEOUT:?}")))??;
        let elapsed = started.elapsed();
        let share = window.finish()?;
        conn.close().await;

        // Untimed: decode with the upstream types and check it.
        let value: Value = serde_json::from_str(&reply)?;
        if let Some(error) = value.get("error") {
            return Err(Error::msg(format!("reconnect refused: {error}")));
        }
        let result: ReconnectResult = serde_json::from_value(value["result"].clone())?;
        let replay = match result {
            ReconnectResult::Replay(replay) => replay,
            ReconnectResult::Snapshot(_) => {
                let needed = count as usize * (80 + channel.len() + SERVER_ENVELOPE_OVERHEAD);
                report.check(
                    "the server replayed instead of sending snapshots",
                    false,
                    format!(
                        "it answered with a snapshot: start it with --max-replay {} \
                         --max-replay-bytes {} or more (defaults 10000 and 8388608)",
                        count + 16,
                        needed.next_power_of_two()
                    ),
                );
                return Ok(report);
            }
        };
        let seqs_ordered = replay
            .actions
            .windows(2)
            .all(|w| w[0].server_seq < w[1].server_seq);
        let seeded = replay.actions.iter().filter(|e| e.origin.is_some()).count() as u64;
        let wanted = if args.behind.is_some() {
            last - from
        } else {
            count
        };
        if !seqs_ordered || seeded < wanted.min(count) {
            report.check(
                "the replay holds every envelope once, in order",
                false,
                format!(
                    "{} envelopes, {seeded} of them dispatched ones (expected {}), in order: \
                     {seqs_ordered}",
                    replay.actions.len(),
                    wanted.min(count)
                ),
            );
            return Ok(report);
        }
        replayed = replay.actions.len();
        bytes = reply.len();
        durations.record(elapsed);
        best = best.min(elapsed.as_secs_f64());
        cpu = Some(match cpu {
            Some(sum) => sum.combine(share),
            None => share,
        });
    }
    let summary = durations.summary();
    let cpu = cpu.ok_or_else(|| Error::msg("no reconnect measured"))?;
    let median_seconds = summary.p50_ms / 1000.0;
    report.phases.push(
        Phase::new(
            format!(
                "reconnect from serverSeq {from}: {replayed} envelopes in one reply, {} times",
                args.repeat.max(1)
            ),
            cpu,
        )
        .figure(
            "envelopes/s replayed (median)",
            replayed as f64 / median_seconds.max(1e-9),
            "envelopes/s",
        )
        .figure(
            "envelopes/s replayed (best)",
            replayed as f64 / best.max(1e-9),
            "envelopes/s",
        )
        .figure("reply size", bytes as f64 / (1024.0 * 1024.0), "MiB")
        .latency("reconnect -> last byte of the reply", summary),
    );
    report.check(
        "the replay holds every envelope once, in order",
        true,
        format!("{replayed} envelopes in serverSeq order"),
    );
    report.notes.push(format!(
        "the server must run with --max-replay >= {} and --max-replay-bytes >= about {} \
         (defaults 10000 and 8388608, past which it answers with snapshots)",
        replayed,
        (bytes + bytes / 4).next_power_of_two()
    ));
    Ok(report)
}
