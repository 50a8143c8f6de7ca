//! The in-process budget of the server's pipeline (issue 31): the engine
//! started on a real store, driven through its own API (no socket, no
//! JSON-RPC), with every heap allocation counted.
//!
//!     cargo bench -p tether-bench --bench pipeline
//!     cargo bench -p tether-bench --bench pipeline -- --actors 2000 --actions 40000
//!     # Postgres: --database-url postgres://…/a_fresh_database
//!
//! It prints, per durable action (ingest: `--sessions` sessions, each with
//! `--in-flight` actions waiting for their outcome), the process's CPU time,
//! the allocations and the bytes allocated; and, per live session actor
//! (`--actors` sessions created and left resident), the heap each holds.
//! Instructions per action come from running it under callgrind twice and
//! taking the difference (BENCHMARKS.md, "The pipeline's budget"): valgrind
//! counts instructions, which do not move with the machine's load.
//!
//! With `--serve ADDR` it runs the whole server instead (as `tether serve`
//! on a fresh SQLite store, but with the system allocator), so a heap
//! profiler sees every allocation while `tether-load` drives it.

use std::alloc::System;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use serde_json::json;
use stats_alloc::{INSTRUMENTED_SYSTEM, StatsAlloc};
use tether_bench::measure::{USER_HZ, cpu_ticks, rss_kib};
use tether_server::AppState;
use tether_server::auth::Principal;
use tether_server::config::ServeConfig;
use tether_server::engine::{CreateSession, DispatchOutcome, Engine};
use tether_server::store::{Origin, StoreOptions, open};

/// The system allocator, counting calls and bytes.
#[global_allocator]
static GLOBAL: &StatsAlloc<System> = &INSTRUMENTED_SYSTEM;

/// What the command line asks for.
struct Args {
    /// Sessions created and left resident, for the heap per live actor.
    actors: usize,
    /// Durable actions dispatched in the ingest phase.
    actions: usize,
    /// Sessions the actions are spread over.
    sessions: usize,
    /// Actions each session has waiting for their outcome.
    in_flight: usize,
    /// The store (a fresh SQLite file in a temporary directory when absent).
    database_url: Option<String>,
    /// Instead of the phases: serve on this address (as `tether serve`,
    /// with the system allocator) until interrupted, to be driven by
    /// `tether-load` under a heap profiler such as heaptrack.
    serve: Option<String>,
}

impl Args {
    fn parse() -> Self {
        let mut args = Self {
            actors: 2_000,
            actions: 20_000,
            sessions: 100,
            in_flight: 16,
            database_url: None,
            serve: None,
        };
        let mut words = std::env::args().skip(1);
        while let Some(word) = words.next() {
            let mut number = |name: &str| -> usize {
                words
                    .next()
                    .and_then(|v| v.parse().ok())
                    .unwrap_or_else(|| panic!("{name} needs a number"))
            };
            match word.as_str() {
                "--actors" => args.actors = number("--actors"),
                "--actions" => args.actions = number("--actions"),
                "--sessions" => args.sessions = number("--sessions").max(1),
                "--in-flight" => args.in_flight = number("--in-flight").max(1),
                "--database-url" => args.database_url = words.next(),
                "--serve" => args.serve = words.next(),
                // `cargo bench` passes `--bench`; filters are not used.
                _ => {}
            }
        }
        args
    }
}

/// The counters at one moment.
#[derive(Clone, Copy)]
struct Counters {
    allocations: u64,
    allocated: u64,
    live: usize,
    cpu_ns: u64,
}

impl Counters {
    fn now() -> Self {
        let stats = GLOBAL.stats();
        let live = (stats.bytes_allocated as isize - stats.bytes_deallocated as isize
            + stats.bytes_reallocated)
            .max(0);
        Self {
            allocations: (stats.allocations + stats.reallocations) as u64,
            allocated: stats.bytes_allocated as u64,
            live: live as usize,
            cpu_ns: process_cpu_ns(),
        }
    }
}

/// The process's CPU time (user and system, every thread), in
/// nanoseconds (`/proc/self/stat` counts in ticks of 10 ms).
fn process_cpu_ns() -> u64 {
    let ticks = cpu_ticks(None).unwrap_or(0);
    (ticks as f64 * 1e9 / USER_HZ) as u64
}

/// Resident set size of this process, KiB.
fn rss() -> u64 {
    rss_kib(None).unwrap_or(0)
}

fn main() {
    let args = Args::parse();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a tokio runtime");
    runtime.block_on(run(args));
}

async fn run(args: Args) {
    let dir = std::env::temp_dir().join(format!("tether-pipeline-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("a temporary directory");
    let url = args
        .database_url
        .clone()
        .unwrap_or_else(|| format!("sqlite:{}", dir.join("tether.db").display()));
    let store = open(
        &url,
        &StoreOptions {
            connect_timeout: std::time::Duration::from_secs(10),
            max_connections: 8,
            host_id: None,
            stalled_transaction: None,
        },
    )
    .await
    .expect("the store opens");
    let backend = url.split(':').next().unwrap_or("?").to_owned();
    let state = AppState::new(store, ServeConfig::default())
        .await
        .expect("the engine starts");
    if let Some(address) = &args.serve {
        let listener = tokio::net::TcpListener::bind(address)
            .await
            .expect("the address is free");
        println!("serving on {address} ({backend}) until interrupted");
        let stop = async {
            let _ = tokio::signal::ctrl_c().await;
        };
        tether_server::serve(listener, state, stop)
            .await
            .expect("the server runs");
        let _ = std::fs::remove_dir_all(&dir);
        return;
    }
    let engine = state.engine.clone();
    let admin = Principal::loopback_admin();
    println!(
        "pipeline on {backend}: {} live actors; {} actions over {} sessions, {} in flight each",
        args.actors, args.actions, args.sessions, args.in_flight
    );

    // Ingest first: its sessions are the only actors then.
    let ids: Vec<String> = (0..args.sessions).map(|i| format!("ingest-{i}")).collect();
    create_all(&engine, &admin, &ids).await;
    // One warm-up action per session: each actor has loaded and run once.
    dispatch_all(&engine, &admin, &ids, ids.len(), 1).await;
    let before = Counters::now();
    let started = Instant::now();
    let actions = dispatch_all(&engine, &admin, &ids, args.actions, args.in_flight).await;
    let seconds = started.elapsed().as_secs_f64();
    let after = Counters::now();
    let per = |a: u64, b: u64| (b.saturating_sub(a)) as f64 / actions.max(1) as f64;
    println!(
        "  ingest: {actions} actions, {:.0} durable actions/s",
        actions as f64 / seconds
    );
    println!(
        "    CPU per action         {:>9.1} µs (the whole process)",
        per(before.cpu_ns, after.cpu_ns) / 1_000.0
    );
    println!(
        "    allocations per action {:>9.1}",
        per(before.allocations, after.allocations)
    );
    println!(
        "    bytes allocated        {:>9.0} B per action",
        per(before.allocated, after.allocated)
    );

    // Live actors: sessions created and left resident.
    let ids: Vec<String> = (0..args.actors).map(|i| format!("actor-{i}")).collect();
    settle().await;
    let before = Counters::now();
    let rss_before = rss();
    create_all(&engine, &admin, &ids).await;
    settle().await;
    let after = Counters::now();
    let rss_after = rss();
    let actors = args.actors.max(1) as f64;
    println!("  {} sessions created, actors resident", args.actors);
    println!(
        "    heap per live actor    {:>9.0} B",
        after.live.saturating_sub(before.live) as f64 / actors
    );
    println!(
        "    RSS per live actor     {:>9.1} KiB (the system allocator's)",
        rss_after.saturating_sub(rss_before) as f64 / actors
    );
    println!(
        "    allocations per create {:>9.1}",
        after.allocations.saturating_sub(before.allocations) as f64 / actors
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// Lets the engine's background work (announcements, snapshots) run.
async fn settle() {
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
}

async fn create_all(engine: &Engine, admin: &Principal, ids: &[String]) {
    use futures_util::StreamExt as _;
    futures_util::stream::iter(ids)
        .map(|id| async move {
            engine
                .create_session(
                    admin,
                    CreateSession {
                        id: id.clone(),
                        project: "bench".into(),
                        provider: None,
                        working_directories: Vec::new(),
                        title: None,
                        config: None,
                        active_client: None,
                    },
                )
                .await
                .expect("the session is created");
        })
        .buffer_unordered(32)
        .collect::<Vec<()>>()
        .await;
}

/// Sequence numbers, unique across the phases (one client id per session).
static NEXT_SEQ: AtomicU64 = AtomicU64::new(1);

/// Dispatches `total` title changes spread over `ids`, each session with
/// up to `in_flight` waiting for their outcome; every one must be
/// accepted. Returns how many were dispatched (`total` rounded up to a
/// multiple of the sessions).
async fn dispatch_all(
    engine: &Engine,
    admin: &Principal,
    ids: &[String],
    total: usize,
    in_flight: usize,
) -> u64 {
    let each = total.div_ceil(ids.len());
    let accepted = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for id in ids {
        let engine = engine.clone();
        let admin = admin.clone();
        let channel = format!("ahp-session:/{id}");
        let client = format!("bench-{id}");
        let accepted = accepted.clone();
        tasks.push(tokio::spawn(async move {
            let mut waiting = std::collections::VecDeque::new();
            for n in 0..each {
                let seq = NEXT_SEQ.fetch_add(1, Ordering::Relaxed);
                let action = json!({"type": "session/titleChanged", "title": format!("title {n}")});
                let submitted = engine
                    .submit(
                        &admin,
                        Some(Origin::durable(client.clone(), seq)),
                        &channel,
                        action,
                    )
                    .await;
                waiting.push_back(submitted);
                if waiting.len() >= in_flight
                    && let Some(first) = waiting.pop_front()
                {
                    expect_accepted(first.outcome().await, &accepted);
                }
            }
            for submitted in waiting {
                expect_accepted(submitted.outcome().await, &accepted);
            }
        }));
    }
    for task in tasks {
        task.await.expect("a dispatcher");
    }
    accepted.load(Ordering::Relaxed)
}

fn expect_accepted(outcome: DispatchOutcome, accepted: &AtomicU64) {
    match outcome {
        DispatchOutcome::Accepted(_) => {
            accepted.fetch_add(1, Ordering::Relaxed);
        }
        DispatchOutcome::Rejected(refusal) => panic!("refused: {refusal:?}"),
    }
}
