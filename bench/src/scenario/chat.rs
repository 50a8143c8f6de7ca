//! `chat`: one session whose default chat runs `--turns` echo turns (one
//! after another: a chat has one active turn at a time), then the figures a
//! long chat costs: the time to subscribe to it and the size of the
//! snapshot a subscriber is sent (fresh connections, `--subscribes` times),
//! and the round trip of one more turn (`chat/turnStarted` sent →
//! `chat/turnComplete` received, `--probe-turns` times). With the turn
//! window (AHP 1.0 `turnsNextCursor`) all three stay flat as the chat grows.

use std::time::Instant;

use serde_json::{Value, json};

use crate::Ctx;
use crate::cli::ChatArgs;
use crate::error::{Error, Result};
use crate::measure::{CpuShare, CpuWindow, Latency, Progress};
use crate::net::small_buffers;
use crate::report::{Phase, Report};
use crate::wire::{REQUEST_TIMEOUT, RawConn, create_session, quoted};

/// Runs the scenario.
pub async fn run(ctx: &Ctx, args: &ChatArgs) -> Result<Report> {
    let params = json!({
        "turns": args.turns, "subscribes": args.subscribes, "probeTurns": args.probe_turns,
    });
    let mut report = Report::new("chat", Some(ctx.backend.clone()), params);
    let id = ctx.id("chat", 0);
    let mut conn = RawConn::new(ctx.target.ws(0, small_buffers()).await?);
    conn.initialize(&ctx.id("chatter", 0), &[]).await?;
    let session = create_session(&mut conn, &id).await?;
    let chat = format!("ahp-chat:/{id}.main");
    conn.request("subscribe", json!({"channel": chat})).await?;

    // Seed: one turn at a time, each waiting for the echo agent's answer.
    let done = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    let progress = {
        let done = done.clone();
        let total = args.turns;
        Progress::start(move || {
            format!(
                "seeding turns: {}/{total}",
                done.load(std::sync::atomic::Ordering::Relaxed)
            )
        })
    };
    let cpu = CpuWindow::start(&ctx.target.server_pids)?;
    let started = Instant::now();
    let mut seq = 0;
    for _ in 0..args.turns {
        seq += 1;
        run_turn(&mut conn, &chat, seq).await?;
        done.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }
    let seeding = started.elapsed().as_secs_f64();
    let share = cpu.finish()?;
    progress.finish().await;
    report.phases.push(
        Phase::new(format!("{} echo turns, one at a time", args.turns), share).figure(
            "turns/s",
            args.turns as f64 / seeding.max(1e-9),
            "turns/s",
        ),
    );

    // One more turn, measured: what every chat action of a long chat costs.
    let mut turns = Latency::new();
    let cpu = CpuWindow::start(&ctx.target.server_pids)?;
    for _ in 0..args.probe_turns.max(1) {
        seq += 1;
        let began = Instant::now();
        run_turn(&mut conn, &chat, seq).await?;
        turns.record(began.elapsed());
    }
    let share = cpu.finish()?;
    report.phases.push(
        Phase::new(
            format!(
                "{} more turns on a chat of {} turns",
                args.probe_turns.max(1),
                args.turns
            ),
            share,
        )
        .latency("turnStarted sent -> turnComplete received", turns.summary()),
    );
    conn.close().await;

    // Subscribes from fresh connections.
    let mut subscribes = Latency::new();
    let mut bytes = 0;
    let mut window_turns = 0;
    let mut cpu: Option<CpuShare> = None;
    for attempt in 0..args.subscribes.max(1) {
        let mut reader = RawConn::new(ctx.target.ws(attempt + 1, small_buffers()).await?);
        reader
            .initialize(&ctx.id("chat-reader", attempt), &[])
            .await?;
        let window = CpuWindow::start(&ctx.target.server_pids)?;
        let began = Instant::now();
        let result = reader
            .request("subscribe", json!({"channel": chat}))
            .await?;
        subscribes.record(began.elapsed());
        let share = window.finish()?;
        cpu = Some(match cpu {
            Some(sum) => sum.combine(share),
            None => share,
        });
        bytes = result.to_string().len();
        window_turns = result
            .pointer("/snapshot/state/turns")
            .and_then(Value::as_array)
            .map_or(0, Vec::len);
        reader.close().await;
    }
    let cpu = cpu.ok_or_else(|| Error::msg("no subscribe measured"))?;
    report.phases.push(
        Phase::new(
            format!(
                "subscribe to the chat of {} turns, {} fresh connections",
                args.turns + args.probe_turns.max(1) as u64,
                args.subscribes.max(1)
            ),
            cpu,
        )
        .figure("snapshot size", bytes as f64 / 1024.0, "KiB")
        .figure("turns in the snapshot", window_turns as f64, "turns")
        .latency("subscribe sent -> snapshot received", subscribes.summary()),
    );
    report.check(
        "the snapshot holds a bounded window of turns",
        window_turns as u64 <= args.turns + args.probe_turns as u64,
        format!("{window_turns} turns of {session}'s default chat"),
    );
    Ok(report)
}

/// Starts turn `seq` on `chat` and waits for its `chat/turnComplete`.
async fn run_turn(conn: &mut RawConn, chat: &str, seq: u64) -> Result<()> {
    let turn_id = format!("t{seq}");
    let frame = format!(
        r#"{{"jsonrpc":"2.0","method":"dispatchAction","params":{{"channel":{},"clientSeq":{seq},"action":{{"type":"chat/turnStarted","turnId":{},"startedAt":"2026-12-01T00:00:00.000Z","message":{{"text":"question {seq}: what does this function do?","origin":{{"kind":"user"}}}}}}}}}}"#,
        quoted(chat),
        quoted(&turn_id)
    );
    conn.send(frame).await?;
    let complete = format!(r#""turnId":{}"#, quoted(&turn_id));
    tokio::time::timeout(REQUEST_TIMEOUT, async {
        loop {
            let text = conn
                .next_text()
                .await
                .map_err(|e| Error::msg(format!("turn {seq}: {e}")))?;
            if text.contains("rejectionReason") {
                return Err(Error::msg(format!("turn {seq} was refused: {text}")));
            }
            if text.contains("chat/turnComplete") && text.contains(&complete) {
                return Ok::<_, Error>(());
            }
        }
    })
    .await
    .map_err(|_| {
        Error::msg(format!(
            "turn {seq}: no turnComplete in {REQUEST_TIMEOUT:?}"
        ))
    })?
}
