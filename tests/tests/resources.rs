//! What a crowd of clients may take of the host's own resources, through
//! the real binary on both backends: a burst of subscribers, each of whom
//! reads the log, is served by the store's own readers, not by a thread
//! started for each; and subscribers of a quiet channel do not read the
//! log for the envelopes between their snapshot and their route (there
//! are none), while those arriving as it commits miss nothing; and a
//! default chat's read, which takes in its session's channel, sends that
//! channel's envelopes to no one (its own subscription has them).

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use serde_json::json;
use tether_tests::ahp_raw::Ahp;
use tether_tests::{ServerProcess, TestDb, backend_tests};

backend_tests!(
    a_burst_of_subscribers_starts_no_thread_per_read,
    subscribers_of_a_quiet_channel_read_the_log_once_and_miss_nothing,
    a_chat_subscribed_while_its_session_commits_duplicates_nothing
);

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
    // Each of the crowd reconnects from the log's start: each reads it
    // (a replay; a subscription's own gap may need no read, see below).
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
                    .call(
                        "reconnect",
                        json!({"clientId": format!("crowd-{i}"), "lastSeenServerSeq": 0,
                               "subscriptions": ["ahp-session:/crowd"]}),
                    )
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
    all_hear(&mut control, &mut held, "ahp-session:/crowd", "heard").await;
}

/// `control` sets `channel`'s title, and each of `held` receives it.
async fn all_hear(control: &mut Ahp, held: &mut [Ahp], channel: &str, title: &str) {
    let refused = control
        .dispatch(
            channel,
            json!({"type": "session/titleChanged", "title": title}),
        )
        .await;
    assert_eq!(refused, None);
    for ahp in held {
        ahp.action("session/titleChanged", |a| a["title"] == title)
            .await;
    }
}

const QUIET: &str = "ahp-session:/quiet";

/// The seqs of `channel`'s envelopes among `messages`.
fn seqs_of(messages: &[serde_json::Value], channel: &str) -> Vec<u64> {
    messages
        .iter()
        .filter(|m| m["method"] == "action" && m["params"]["channel"] == channel)
        .filter_map(|m| m["params"]["serverSeq"].as_u64())
        .collect()
}

async fn subscribers_of_a_quiet_channel_read_the_log_once_and_miss_nothing(db: TestDb) {
    let server = ServerProcess::start(&db, &[]).await;
    let base = server.base_url();
    let mut control = Ahp::connect(&server.ws_url(), "quiet-control").await;
    for session in [QUIET, "ahp-session:/busy"] {
        control
            .call("createSession", json!({"channel": session}))
            .await
            .unwrap();
    }
    // Every subscription's snapshot is below the hub's seq (the busy
    // session came later): the first reads the log and finds nothing of
    // the quiet channel there; the hub learns it, and the rest need not.
    // (Each connection subscribes to the root too, counted apart.)
    let reads = || async {
        let text = reqwest::get(format!("{base}/metrics"))
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        let name = r#"tether_subscription_bridge_reads_total{kind="session"}"#;
        tether_tests::metric_value(&text, name).unwrap_or(0.0) as u64
    };
    let before = reads().await;
    let mut held = Vec::new();
    for i in 0..40 {
        let mut ahp = Ahp::connect(&server.ws_url(), &format!("quiet-{i}")).await;
        ahp.call("subscribe", json!({"channel": QUIET}))
            .await
            .unwrap();
        if i == 0 {
            // The read follows the answer: once the next request is
            // answered it is done, and the hub has learnt from it.
            ahp.call("ping", json!({})).await.unwrap();
        }
        held.push(ahp);
    }
    assert_eq!(
        reads().await - before,
        1,
        "40 subscriptions of a quiet channel"
    );
    // Still quiet after another session's commits; not once it commits.
    let busy = control
        .dispatch(
            "ahp-session:/busy",
            json!({"type": "session/titleChanged", "title": "b"}),
        )
        .await;
    assert_eq!(busy, None);
    let mut late = Ahp::connect(&server.ws_url(), "quiet-late").await;
    late.call("subscribe", json!({"channel": QUIET}))
        .await
        .unwrap();
    assert_eq!(reads().await - before, 1, "another channel's commit");
    held.push(late);
    all_hear(&mut control, &mut held, QUIET, "q").await;

    // Subscribers arriving while the channel commits: each has, after its
    // snapshot, exactly the channel's envelopes, in order, once. The last
    // title waits for every one of them to be subscribed.
    const ARRIVALS: usize = 60;
    let subscribed = Arc::new(tokio::sync::Barrier::new(ARRIVALS + 1));
    let title = |writer: u64, seq: u64, title: String| tether_protocol::rest::DispatchRequest {
        client_id: format!("writer-{writer}"),
        client_seq: seq,
        channel: None,
        action: json!({"type": "session/titleChanged", "title": title}),
    };
    // Eight writers at once: the channel commits all the time, so some
    // arrive between a subscription's snapshot and its route.
    let writers: Vec<_> = (0..8u64)
        .map(|w| {
            let client = server.client();
            tokio::spawn(async move {
                for i in 1..=50 {
                    client
                        .dispatch("quiet", &title(w, i, format!("w{w}-{i}")))
                        .await
                        .expect("a title");
                }
            })
        })
        .collect();
    let writer = {
        let subscribed = subscribed.clone();
        let client = server.client();
        tokio::spawn(async move {
            for writer in writers {
                writer.await.expect("a writer");
            }
            subscribed.wait().await;
            client
                .dispatch("quiet", &title(8, 1, "done".into()))
                .await
                .expect("the last title");
        })
    };
    let url = server.ws_url();
    let arrivals: Vec<_> = (0..ARRIVALS as u64)
        .map(|i| {
            let url = url.clone();
            let subscribed = subscribed.clone();
            tokio::spawn(async move {
                tokio::time::sleep(Duration::from_millis(i * 5)).await;
                let mut ahp = Ahp::connect(&url, &format!("arrival-{i}")).await;
                let answer = ahp
                    .call("subscribe", json!({"channel": QUIET}))
                    .await
                    .unwrap();
                let from = answer["snapshot"]["fromSeq"].as_u64().expect("fromSeq");
                subscribed.wait().await;
                let mut messages = std::mem::take(&mut ahp.seen);
                while !messages
                    .iter()
                    .any(|m| m["params"]["action"]["title"] == "done")
                {
                    messages.push(tether_tests::raw_next(&mut ahp.ws).await.expect("open"));
                }
                (from, seqs_of(&messages, QUIET))
            })
        })
        .collect();
    writer.await.expect("the writer");
    let mut transcript = Vec::new();
    let mut after = 0;
    loop {
        let page = server
            .client()
            .transcript("quiet", after, 1000)
            .await
            .unwrap();
        transcript.extend(page.envelopes);
        match page.next_after {
            Some(next) => after = next,
            None => break,
        }
    }
    let wrapped: Vec<_> = transcript
        .into_iter()
        .map(|envelope| json!({"method": "action", "params": envelope}))
        .collect();
    let stored = seqs_of(&wrapped, QUIET);
    for arrival in arrivals {
        let (from, got) = arrival.await.expect("an arrival");
        let want: Vec<u64> = stored.iter().copied().filter(|&seq| seq > from).collect();
        assert_eq!(
            got, want,
            "a subscriber at {from}: no gap, no duplicate, in order"
        );
    }
}

async fn a_chat_subscribed_while_its_session_commits_duplicates_nothing(db: TestDb) {
    const SESSION: &str = "ahp-session:/dup";
    const CHAT: &str = "ahp-chat:/dup.main";
    let server = ServerProcess::start(&db, &[]).await;
    let mut watcher = Ahp::connect(&server.ws_url(), "dup-watcher").await;
    watcher
        .call("createSession", json!({"channel": SESSION}))
        .await
        .unwrap();
    let answer = watcher
        .call("subscribe", json!({"channel": SESSION}))
        .await
        .unwrap();
    let from = answer["snapshot"]["fromSeq"].as_u64().expect("fromSeq");
    // The session commits all the time while the watcher subscribes to its
    // default chat, and leaves it, again and again: each subscription
    // reads the chat's gap with the session's channel, and the session's
    // envelopes then waiting in the watcher's inbox must not be sent twice.
    let writers: Vec<_> = (0..8u64)
        .map(|w| {
            let client = server.client();
            tokio::spawn(async move {
                for i in 1..=60 {
                    let request = tether_protocol::rest::DispatchRequest {
                        client_id: format!("dup-writer-{w}"),
                        client_seq: i,
                        channel: None,
                        action: json!({"type": "session/titleChanged", "title": format!("w{w}-{i}")}),
                    };
                    client.dispatch("dup", &request).await.expect("a title");
                }
            })
        })
        .collect();
    let client = server.client();
    let writer = tokio::spawn(async move {
        for writer in writers {
            writer.await.expect("a writer");
        }
        let request = tether_protocol::rest::DispatchRequest {
            client_id: "dup-writer-8".into(),
            client_seq: 1,
            channel: None,
            action: json!({"type": "session/titleChanged", "title": "done"}),
        };
        client
            .dispatch("dup", &request)
            .await
            .expect("the last title");
    });
    while !writer.is_finished() {
        watcher
            .call("subscribe", json!({"channel": CHAT}))
            .await
            .unwrap();
        watcher
            .call("unsubscribe", json!({"channel": CHAT}))
            .await
            .unwrap();
    }
    writer.await.expect("the writer");
    let mut messages = std::mem::take(&mut watcher.seen);
    while !messages
        .iter()
        .any(|m| m["params"]["action"]["title"] == "done")
    {
        messages.push(tether_tests::raw_next(&mut watcher.ws).await.expect("open"));
    }
    let page = server.client().transcript("dup", from, 1000).await.unwrap();
    let wrapped: Vec<_> = page
        .envelopes
        .into_iter()
        .map(|envelope| json!({"method": "action", "params": envelope}))
        .collect();
    let got = seqs_of(&messages, SESSION);
    let twice: Vec<_> = got.windows(2).filter(|w| w[0] >= w[1]).collect();
    assert_eq!(
        got,
        seqs_of(&wrapped, SESSION),
        "the session's envelopes after the snapshot: each once, in order (out of order or again: {twice:?})"
    );
}
