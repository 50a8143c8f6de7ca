//! Writes a large Tether database for `tether migrate` and search
//! measurements:
//!
//! ```sh
//! cargo run --release -p tether-tests --example seed_sqlite -- /tmp/big.db 1000000 1000
//! cargo run --release -p tether-tests --example seed_sqlite -- postgres://postgres@127.0.0.1/big 1000000 1000
//! ```
//!
//! Arguments: the database file (created; it must not exist yet) or a
//! Postgres URL (an empty database), the envelopes to append (default
//! 1,000,000) and the sessions to spread them over (default 1,000).

use std::time::Instant;

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let mut args = std::env::args().skip(1);
    let path = args
        .next()
        .expect("usage: seed_sqlite PATH [ENVELOPES] [SESSIONS]");
    let number = |arg: Option<String>, default: u64| {
        arg.map_or(default, |a| a.parse().expect("a whole number"))
    };
    let envelopes = number(args.next(), 1_000_000);
    let sessions = number(args.next(), 1_000) as usize;
    let url = if path.starts_with("postgres://") || path.starts_with("postgresql://") {
        path.clone()
    } else {
        assert!(
            !std::path::Path::new(&path).exists(),
            "{path} exists; seed a new file"
        );
        format!("sqlite:{path}")
    };
    let started = Instant::now();
    let seeded = tether_tests::seed::seed(&url, sessions, envelopes).await;
    println!(
        "seeded {path}: {} sessions, {} envelopes, {} archived turns, {} snapshots written, in {:.1} s",
        seeded.sessions,
        seeded.envelopes,
        seeded.archived_turns,
        seeded.snapshots,
        started.elapsed().as_secs_f64()
    );
}
