//! What a crowd of clients may take of the host's own resources, through
//! the real binary on both backends: a burst of subscribers, each of whose
//! subscriptions reads the log between its snapshot and its route, is
//! served by the store's own readers, not by a thread started for each.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use serde_json::json;
use tether_tests::ahp_raw::Ahp;
use tether_tests::{ServerProcess, TestDb, backend_tests};

backend_tests!(a_burst_of_subscribers_starts_no_thread_per_read);

const SUBSCRIBERS: usize = 1500;

/// The threads process `pid` runs now.
fn threads(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .map(Iterator::count)
        .unwrap_or(0)
}

async fn a_burst_of_subscribers_starts_no_thread_per_read(db: TestDb) {
    // Two readers: the store's reads may use two connections (and, on
    // SQLite, two threads of sqlx's and two of its own).
    let server = ServerProcess::start(&db, &["--database-max-connections", "2"]).await;
    let pid = server.pid().expect("the server runs");
    let mut control = Ahp::connect(&server.ws_url(), "crowd-control").await;
    control
        .call("createSession", json!({"channel": "ahp-session:/crowd"}))
        .await
        .unwrap();
    // A later session moves the log past the crowd's, so that every
    // subscription to it reads the log from its snapshot to its route.
    control
        .call("createSession", json!({"channel": "ahp-session:/later"}))
        .await
        .unwrap();
    control
        .call("subscribe", json!({"channel": "ahp-session:/crowd"}))
        .await
        .unwrap();
    let before = threads(pid);
    let most = Arc::new(AtomicUsize::new(before));
    let watching = {
        let most = most.clone();
        tokio::spawn(async move {
            loop {
                most.fetch_max(threads(pid), Ordering::Relaxed);
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
        })
    };
    let url = server.ws_url();
    let subscribers: Vec<_> = (0..SUBSCRIBERS)
        .map(|i| {
            let url = url.clone();
            tokio::spawn(async move {
                let mut ahp = Ahp::connect(&url, &format!("crowd-{i}")).await;
                let subscribed = ahp
                    .call("subscribe", json!({"channel": "ahp-session:/crowd"}))
                    .await;
                (ahp, subscribed)
            })
        })
        .collect();
    let mut held = Vec::new();
    for subscriber in subscribers {
        let (ahp, subscribed) = subscriber.await.expect("a subscriber");
        subscribed.expect("subscribed");
        held.push(ahp);
    }
    watching.abort();
    let most = most.load(Ordering::Relaxed);
    // Of the store's readers (two of sqlx's threads and two of the log's
    // on SQLite), at least one of each was started by the control's
    // reads; one more for slack. tokio's blocking pool started a thread
    // for each page read that found none idle: 5 to 9 more here, some
    // thirty for 10,000 subscribers (BENCHMARKS.md).
    assert!(
        most <= before + 3,
        "{SUBSCRIBERS} subscribers took the server from {before} threads to {most}"
    );
    // Every one of them is live: the next title reaches them all.
    let refused = control
        .dispatch(
            "ahp-session:/crowd",
            json!({"type": "session/titleChanged", "title": "heard"}),
        )
        .await;
    assert_eq!(refused, None);
    for ahp in &mut held {
        ahp.action("session/titleChanged", |a| a["title"] == "heard")
            .await;
    }
}
