//! `fanout`: one session, `--subscribers` connections subscribed to it, one
//! more connection dispatching at `--rate` for `--duration`. Every
//! subscriber times dispatch → delivery for every envelope (the dispatcher
//! notes the instant it writes each `clientSeq`, in one shared table) and
//! checks that it got every envelope once, in `clientSeq` and `serverSeq`
//! order. The dispatcher is not subscribed, so it gets each accepted
//! dispatch back directly: its durable-ack latency is reported too.
//!
//! On the reference peer (`--target peer`) the same run speaks the peer's
//! frames; the peer sends events only to subscribers, so there the
//! dispatcher subscribes too, to hear its acknowledgements.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use futures_util::{SinkExt as _, StreamExt as _};
use serde_json::json;
use tokio::sync::watch;
use tokio_tungstenite::tungstenite::Message;

use super::{open_all, sleep_until};
use crate::Ctx;
use crate::cli::{ClientKind, FanoutArgs};
use crate::dialect::Dialect;
use crate::error::{Error, Result};
use crate::measure::{CpuWindow, Latency, Progress};
use crate::report::{Phase, Report};
use crate::wire::{RawConn, quoted, title_action};

/// What every subscriber shares with the dispatcher.
struct Shared {
    /// How the server's frames read.
    dialect: Dialect,
    epoch: Instant,
    /// Microseconds after `epoch` at which each `clientSeq` was written;
    /// 0 when not yet.
    sent_at: Vec<AtomicU64>,
    /// `clientSeq`s up to this one are warm-up: checked, not timed.
    warmup_seqs: u64,
    /// The dispatcher's client id.
    dispatcher: String,
    /// Deliveries so far (progress line).
    delivered: AtomicU64,
    /// Subscribers that have everything.
    complete: AtomicU64,
}

impl Shared {
    fn now_micros(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_micros()).unwrap_or(u64::MAX)
    }
}

/// One subscriber's account.
#[derive(Debug, Default)]
struct Seen {
    delivered: u64,
    missing: u64,
    duplicate_or_reordered: u64,
    server_seq_backwards: u64,
    latency: Latency,
    /// Microseconds after the epoch of the last timed delivery.
    last_delivery: u64,
    ended: Option<String>,
    expected: u64,
    last_server_seq: u64,
}

impl Seen {
    fn new() -> Self {
        Self {
            expected: 1,
            ..Self::default()
        }
    }

    fn envelope(&mut self, shared: &Shared, client_seq: u64, server_seq: u64) {
        let now = shared.now_micros();
        self.delivered += 1;
        shared.delivered.fetch_add(1, Ordering::Relaxed);
        if client_seq == self.expected {
            self.expected += 1;
        } else if client_seq > self.expected {
            self.missing += client_seq - self.expected;
            self.expected = client_seq + 1;
        } else {
            self.duplicate_or_reordered += 1;
        }
        if server_seq <= self.last_server_seq {
            self.server_seq_backwards += 1;
        }
        self.last_server_seq = server_seq;
        let sent = usize::try_from(client_seq)
            .ok()
            .and_then(|i| shared.sent_at.get(i))
            .map_or(0, |at| at.load(Ordering::Acquire));
        if sent > 0 && client_seq > shared.warmup_seqs {
            self.latency.record_micros(now.saturating_sub(sent));
            self.last_delivery = now;
        }
    }

    /// Whether everything up to `total` has arrived.
    fn has_all(&self, total: u64) -> bool {
        self.expected > total
    }
}

enum Subscriber {
    Raw(Box<RawConn>),
    Ahp(ahp::Client, ahp::SessionSubscription),
}

/// Runs one subscriber until it has all `total` envelopes or `give_up`.
async fn subscriber(
    sub: Subscriber,
    shared: Arc<Shared>,
    mut total: watch::Receiver<u64>,
    mut give_up: watch::Receiver<bool>,
) -> Seen {
    let mut seen = Seen::new();
    let mut conn_slot = None;
    let mut ahp_slot = None;
    match sub {
        Subscriber::Raw(conn) => conn_slot = Some(*conn),
        Subscriber::Ahp(client, subscription) => ahp_slot = Some((client, subscription)),
    }
    loop {
        let done_at = *total.borrow();
        if seen.has_all(done_at) {
            break;
        }
        // One envelope (client seq, server seq), or None for other traffic.
        let next: Result<Option<(u64, u64)>, String> = tokio::select! {
            biased;
            _ = give_up.changed() => break,
            _ = total.changed() => continue,
            got = async {
                if let Some(conn) = conn_slot.as_mut() {
                    let text = conn.next_text().await.map_err(|e| e.to_string())?;
                    Ok(shared.dialect.echo(&text).and_then(|echo| {
                        echo.delivers(&shared.dispatcher)
                            .then_some((echo.client_seq, echo.seq.unwrap_or(0)))
                    }))
                } else if let Some((_, subscription)) = ahp_slot.as_mut() {
                    match subscription.recv().await {
                        Some(ahp::SubscriptionEvent::Action(envelope)) => Ok(envelope
                            .origin
                            .filter(|o| o.client_id == shared.dispatcher)
                            .map(|o| (u64::try_from(o.client_seq).unwrap_or(0), envelope.server_seq))),
                        Some(_) => Ok(None),
                        None => Err("connection closed".to_owned()),
                    }
                } else {
                    Err("no connection".to_owned())
                }
            } => got,
        };
        match next {
            Ok(Some((client_seq, server_seq))) => {
                seen.envelope(&shared, client_seq, server_seq);
                if seen.has_all(*total.borrow()) {
                    shared.complete.fetch_add(1, Ordering::Relaxed);
                }
            }
            Ok(None) => {}
            Err(why) => {
                seen.ended = Some(why);
                break;
            }
        }
    }
    let total = *total.borrow();
    if total != u64::MAX && !seen.has_all(total) {
        seen.missing += total + 1 - seen.expected;
    }
    if let Some(conn) = conn_slot {
        conn.close().await;
    }
    if let Some((client, _)) = ahp_slot {
        client.shutdown().await;
    }
    seen
}

/// Runs the scenario.
pub async fn run(ctx: &Ctx, args: &FanoutArgs) -> Result<Report> {
    let subscribers = args.subscribers.max(1);
    let rate = args.rate.max(0.1);
    let duration = args.duration.max(0.1);
    let planned = ((rate * duration).ceil() as u64).max(1);
    let warmup_seqs = ((rate * args.warmup.max(0.0)).floor() as u64).min(planned - 1);
    let params = json!({
        "subscribers": subscribers, "rate": rate, "duration": duration,
        "warmup": args.warmup, "client": args.client.name(), "hosts": ctx.target.hosts.len(),
    });
    let mut report = Report::new("fanout", Some(ctx.backend.clone()), params);
    crate::net::check_fd_budget(subscribers + 2, ctx.target.server_pid);

    let dialect = ctx.dialect;
    let dispatcher_id = ctx.id("fanout-dispatcher", 0);
    let mut dispatcher = dialect
        .connect(&ctx.target, 0, Default::default(), &dispatcher_id, &[])
        .await?;
    let channel = dialect
        .create_session(&mut dispatcher, &ctx.id("fanout", 0))
        .await?;
    dialect.hear_own_acks(&mut dispatcher, &channel).await?;

    let shared = Arc::new(Shared {
        dialect,
        epoch: Instant::now(),
        sent_at: (0..=planned).map(|_| AtomicU64::new(0)).collect(),
        warmup_seqs,
        dispatcher: dispatcher_id.clone(),
        delivered: AtomicU64::new(0),
        complete: AtomicU64::new(0),
    });
    let client = args.client;
    let subs = open_all(subscribers, 64, "connecting subscribers", |i| {
        let channel = channel.clone();
        async move {
            let client_id = ctx.id("subscriber", i);
            Ok::<_, Error>(match client {
                ClientKind::Raw => {
                    // Small buffers: tungstenite zero-fills its whole read
                    // buffer before every read, so 128 KiB would cost the
                    // load tool CPU on every delivery.
                    let conn = dialect
                        .connect(
                            &ctx.target,
                            i + 1,
                            crate::net::small_buffers(),
                            &client_id,
                            &[&channel],
                        )
                        .await?;
                    Subscriber::Raw(Box::new(conn))
                }
                ClientKind::Ahp => {
                    let buffer = (rate * 10.0).ceil() as usize + 256;
                    let ahp = ctx.target.ahp(i + 1, buffer).await?;
                    ahp.initialize(
                        client_id,
                        vec![ahp_types::PROTOCOL_VERSION.into()],
                        Vec::new(),
                    )
                    .await?;
                    let (_, subscription) = ahp.subscribe(channel.clone()).await?;
                    Subscriber::Ahp(ahp, subscription)
                }
            })
        }
    })
    .await?;

    let (total_tx, total_rx) = watch::channel(u64::MAX);
    let (give_up_tx, give_up_rx) = watch::channel(false);
    // Subscriber i is on host `host_index(i + 1)`; the dispatcher on host 0.
    let tasks: Vec<_> = subs
        .into_iter()
        .enumerate()
        .map(|(i, sub)| {
            let remote = ctx.target.host_index(i + 1) != 0;
            let task = tokio::spawn(subscriber(
                sub,
                shared.clone(),
                total_rx.clone(),
                give_up_rx.clone(),
            ));
            (remote, task)
        })
        .collect();

    // The dispatcher: a writer on a schedule, a reader for its echoes.
    let (mut sink, mut stream) = dispatcher.split();
    let acks = {
        let shared = shared.clone();
        tokio::spawn(async move {
            let mut latency = Latency::new();
            let mut rejected = 0u64;
            let mut first_rejection = None;
            let mut accepted = 0u64;
            while let Some(Ok(message)) = stream.next().await {
                let Message::Text(text) = message else {
                    continue;
                };
                let Some(echo) = shared.dialect.echo(text.as_str()) else {
                    continue;
                };
                if !echo.acknowledges(&shared.dispatcher) {
                    continue;
                }
                if echo.rejection.is_some() {
                    rejected += 1;
                    if first_rejection.is_none() {
                        first_rejection = echo.rejection.map(|r| r.into_owned());
                    }
                } else {
                    accepted += 1;
                }
                let sent = usize::try_from(echo.client_seq)
                    .ok()
                    .and_then(|i| shared.sent_at.get(i))
                    .map_or(0, |at| at.load(Ordering::Acquire));
                if sent > 0 && echo.client_seq > shared.warmup_seqs {
                    latency.record_micros(shared.now_micros().saturating_sub(sent));
                }
                if accepted + rejected >= planned {
                    break;
                }
            }
            (latency, accepted, rejected, first_rejection)
        })
    };
    let progress = {
        let shared = shared.clone();
        Progress::start(move || {
            format!(
                "fanout: {} deliveries, {} subscribers complete",
                shared.delivered.load(Ordering::Relaxed),
                shared.complete.load(Ordering::Relaxed)
            )
        })
    };
    let channel_json = quoted(&channel);
    let dispatcher_json = quoted(&dispatcher_id);
    let start = Instant::now() + Duration::from_millis(50);
    let measure_from = start + Duration::from_secs_f64(warmup_seqs as f64 / rate);
    let mut cpu = None;
    let mut slip = Duration::ZERO;
    for seq in 1..=planned {
        let due = start + Duration::from_secs_f64((seq - 1) as f64 / rate);
        sleep_until(due).await;
        if seq == warmup_seqs + 1 {
            cpu = Some(CpuWindow::start(&ctx.target.server_pids)?);
        }
        slip = slip.max(Instant::now().saturating_duration_since(due));
        let frame = dialect.dispatch_frame(
            &channel_json,
            &dispatcher_json,
            seq,
            &title_action(&format!("fan {seq}")),
        );
        shared.sent_at[seq as usize].store(shared.now_micros(), Ordering::Release);
        sink.send(Message::Text(frame.into())).await?;
    }
    let dispatch_end = Instant::now();
    let _ = total_tx.send(planned);

    // Wait for every subscriber to have everything, or the drain time.
    let drain_until = dispatch_end + Duration::from_secs_f64(args.drain.max(0.0));
    while shared.complete.load(Ordering::Relaxed) < subscribers as u64
        && Instant::now() < drain_until
    {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let share = match cpu {
        Some(cpu) => cpu.finish()?,
        None => CpuWindow::start(&ctx.target.server_pids)?.finish()?,
    };
    let _ = give_up_tx.send(true);
    let mut latency = Latency::new();
    let mut cross_host = Latency::new();
    let (mut delivered, mut missing, mut reordered, mut backwards) = (0u64, 0u64, 0u64, 0u64);
    let mut last_delivery = 0u64;
    let mut incomplete = 0usize;
    let mut ended = Vec::new();
    for (remote, task) in tasks {
        let seen = task
            .await
            .map_err(|e| Error::msg(format!("subscriber task: {e}")))?;
        latency.merge(&seen.latency);
        if remote {
            cross_host.merge(&seen.latency);
        }
        delivered += seen.delivered;
        missing += seen.missing;
        reordered += seen.duplicate_or_reordered;
        backwards += seen.server_seq_backwards;
        last_delivery = last_delivery.max(seen.last_delivery);
        if seen.missing > 0 {
            incomplete += 1;
        }
        if let Some(why) = seen.ended {
            ended.push(why);
        }
    }
    let _ = sink.close().await;
    let (ack_latency, accepted, rejected, first_rejection) =
        match tokio::time::timeout(Duration::from_secs(5), acks).await {
            Ok(Ok(result)) => result,
            _ => (Latency::new(), 0, 0, None),
        };
    progress.finish().await;

    let timed_from =
        u64::try_from(measure_from.duration_since(shared.epoch).as_micros()).unwrap_or_default();
    let timed_seconds = (last_delivery.saturating_sub(timed_from)) as f64 / 1e6;
    let timed_deliveries = latency.count();
    let dispatched_seconds = dispatch_end.duration_since(start).as_secs_f64();
    let mut phase = Phase::new(
        format!(
            "1 session, {subscribers} subscribers, {rate} actions/s for {duration} s \
                 (first {warmup_seqs} envelopes untimed)"
        ),
        share,
    )
    .figure(
        "deliveries/s",
        if timed_seconds > 0.0 {
            timed_deliveries as f64 / timed_seconds
        } else {
            0.0
        },
        "deliveries/s",
    )
    .figure(
        "offered deliveries/s",
        rate * subscribers as f64,
        "deliveries/s",
    )
    .figure(
        "dispatch rate achieved",
        planned as f64 / dispatched_seconds.max(1e-9),
        "actions/s",
    )
    .figure(
        "dispatcher schedule slip (max)",
        slip.as_secs_f64() * 1000.0,
        "ms",
    )
    .latency("dispatch -> delivery, every subscriber", latency.summary())
    .latency("dispatch -> ack at the dispatcher", ack_latency.summary());
    if cross_host.count() > 0 {
        // Committed by host 0, delivered by another host's tailer.
        phase = phase.latency("dispatch -> delivery on another host", cross_host.summary());
    }
    report.phases.push(phase);
    let expected = planned * subscribers as u64;
    report.check(
        "every subscriber got every envelope once",
        missing == 0 && delivered == expected && ended.is_empty(),
        format!(
            "{delivered} of {expected} delivered; {missing} missing at {incomplete} subscribers; \
             {} connections ended early{}",
            ended.len(),
            ended
                .first()
                .map(|why| format!(" (first: {why})"))
                .unwrap_or_default()
        ),
    );
    report.check(
        "no subscriber saw an envelope reordered",
        reordered == 0 && backwards == 0,
        format!("{reordered} out of clientSeq order, {backwards} with serverSeq going backwards"),
    );
    report.check(
        "no dispatch refused",
        rejected == 0,
        match first_rejection {
            Some(reason) => format!("{rejected} refused, first: {reason}"),
            None => format!("{accepted} accepted, 0 refused"),
        },
    );
    Ok(report)
}
