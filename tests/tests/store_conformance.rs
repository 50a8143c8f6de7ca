//! The `Store` contract, run against SQLite always and Postgres when
//! configured. Every case gets a fresh database.

use std::collections::BTreeSet;
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tether_server::store::{
    Appended, ArchivedTurn, Origin, OriginOutcome, Rejection, SessionFilter, SessionRecord,
    Snapshot, Store, StoreOptions,
};
use tether_tests::store_reads::{assert_read_back, envelope, from_client};
use tether_tests::{TestDb, backend_tests};

backend_tests!(
    seqs_are_monotonic_and_gap_free_across_batches_and_restarts,
    concurrent_appends_never_share_a_seq,
    an_origin_is_accepted_once_and_its_outcome_is_kept,
    names_first_seen_in_a_commit_that_met_a_duplicate_read_back_as_their_own,
    read_after_returns_exactly_the_suffix_in_order,
    transcript_pages_hold_one_session_in_order,
    session_pages_list_every_session_once_newest_first,
    session_pages_keep_their_order_across_thousands_of_seqs,
    the_read_model_is_written_with_the_log,
    one_batch_writing_a_key_twice_keeps_the_latest,
    a_refused_origin_in_a_fresh_batch_is_refused_and_the_rest_commit,
    snapshots_return_the_newest,
    working_contexts_upsert_and_list_most_recent_first,
    a_killed_writer_loses_no_acknowledged_append,
    the_turn_archive_upserts_and_reads_ranges,
    a_batch_of_many_search_documents_is_all_found,
    a_long_answer_is_found_across_its_pieces_however_busy_other_projects_are,
);

fn record(id: &str, project: &str, state: &str) -> SessionRecord {
    SessionRecord {
        id: id.to_owned(),
        project: project.to_owned(),
        provider: "echo".to_owned(),
        title: Some(format!("title of {id}")),
        state: state.to_owned(),
        turns: 0,
        resumable: false,
        created_ms: 1_700_000_000_000,
        projection: format!(r#"{{"id":"{id}"}}"#),
    }
}

fn committed(outcomes: &[Appended]) -> Vec<u64> {
    outcomes
        .iter()
        .map(|o| match o {
            Appended::Committed { seq, .. } => *seq,
            Appended::Duplicate(d) => panic!("unexpected duplicate: {d:?}"),
            Appended::Fenced => panic!("unexpected fence"),
        })
        .collect()
}

async fn seqs_are_monotonic_and_gap_free_across_batches_and_restarts(db: TestDb) {
    let store = db.open().await;
    let first_host = store.host().await.unwrap();
    assert_eq!(first_host.last_seq, 0);
    let mut seen = Vec::new();
    let mut n = 0;
    for size in [1_u64, 5, 20] {
        let batch = (0..size)
            .map(|i| {
                n += 1;
                if i % 2 == 0 {
                    from_client(envelope("ahp-session:/s1", n), "c1", n)
                } else {
                    envelope("ahp-session:/s1", n)
                }
            })
            .collect();
        seen.extend(committed(&store.append(batch).await.unwrap()));
    }
    assert_eq!(seen, (1..=26).collect::<Vec<_>>());
    assert_eq!(store.append(Vec::new()).await.unwrap(), Vec::new());
    assert_eq!(store.host().await.unwrap().last_seq, 26);
    store.close().await;

    let reopened = db.open().await;
    let host = reopened.host().await.unwrap();
    assert_eq!(host.epoch, first_host.epoch, "the epoch survives a restart");
    assert_eq!(host.last_seq, 26);
    let more = committed(
        &reopened
            .append(vec![envelope("ahp-root://", 1), envelope("ahp-root://", 2)])
            .await
            .unwrap(),
    );
    assert_eq!(more, vec![27, 28]);
    reopened.close().await;
}

async fn concurrent_appends_never_share_a_seq(db: TestDb) {
    const TASKS: u64 = 16;
    const BATCHES: u64 = 20;
    const SIZE: u64 = 4;
    let store = db.open().await;
    let mut tasks = Vec::new();
    for task in 0..TASKS {
        let store = store.clone();
        tasks.push(tokio::spawn(async move {
            let mut mine = Vec::new();
            for batch in 0..BATCHES {
                let envelopes = (0..SIZE)
                    .map(|i| {
                        let n = (batch * SIZE + i) + 1;
                        from_client(
                            envelope(&format!("ahp-session:/t{task}"), n),
                            &format!("client-{task}"),
                            n,
                        )
                    })
                    .collect();
                mine.extend(committed(&store.append(envelopes).await.unwrap()));
            }
            (task, mine)
        }));
    }
    let mut all = BTreeSet::new();
    for joined in tasks {
        let (task, mine) = joined.await.unwrap();
        assert!(
            mine.windows(2).all(|w| w[0] < w[1]),
            "task {task} saw its seqs out of order"
        );
        for seq in mine {
            assert!(all.insert(seq), "seq {seq} was issued twice");
        }
    }
    let total = TASKS * BATCHES * SIZE;
    assert_eq!(all, (1..=total).collect::<BTreeSet<_>>());
    let log = store.read_after(0, None, 10_000).await.unwrap();
    assert_eq!(log.len() as u64, total);
    assert!(log.windows(2).all(|w| w[0].seq + 1 == w[1].seq));
    // Each task's own envelopes appear in the order it appended them.
    for task in 0..TASKS {
        let channel = format!("ahp-session:/t{task}");
        let mine: Vec<_> = log
            .iter()
            .filter(|e| e.channel == channel)
            .map(|e| e.origin.as_ref().unwrap().client_seq)
            .collect();
        assert_eq!(mine, (1..=BATCHES * SIZE).collect::<Vec<_>>());
    }
    store.close().await;
}

async fn an_origin_is_accepted_once_and_its_outcome_is_kept(db: TestDb) {
    let store = db.open().await;
    let first = store
        .append(vec![from_client(envelope("ahp-session:/s", 1), "c", 1)])
        .await
        .unwrap();
    assert_eq!(committed(&first), vec![1]);

    // The same origin again, alone and inside a batch with a new one.
    let mut retry = envelope("ahp-session:/s", 99);
    retry.session = Some(record("s", "p", "live"));
    let again = store
        .append(vec![
            from_client(retry, "c", 1),
            from_client(envelope("ahp-session:/s", 2), "c", 2),
            from_client(envelope("ahp-session:/s", 3), "c", 2),
        ])
        .await
        .unwrap();
    match &again[0] {
        Appended::Duplicate(OriginOutcome::Accepted(original)) => {
            assert_eq!(original.seq, 1);
            assert_eq!(
                original.action, r#"{"type":"x-test/n","n":1}"#,
                "the original is returned"
            );
        }
        other => panic!("expected the original acceptance, got {other:?}"),
    }
    assert!(
        matches!(again[1], Appended::Committed { seq: 2, .. }),
        "seqs stay gap-free: {again:?}"
    );
    assert!(
        matches!(&again[2], Appended::Duplicate(OriginOutcome::Accepted(e)) if e.seq == 2),
        "a duplicate inside one batch: {again:?}"
    );
    // The record rode on a duplicate; it describes the session after the
    // batch, so it is written with the session's latest fresh envelope.
    assert_eq!(
        store.session("s").await.unwrap().map(|row| row.last_seq),
        Some(2),
        "the read model follows the batch's last fresh envelope"
    );
    let mut alone = envelope("ahp-session:/t", 98);
    alone.session = Some(record("t", "p", "live"));
    let only_duplicate = store
        .append(vec![from_client(alone, "c", 1)])
        .await
        .unwrap();
    assert!(matches!(only_duplicate[0], Appended::Duplicate(_)));
    assert!(
        store.session("t").await.unwrap().is_none(),
        "a batch of duplicates writes no read model"
    );

    // Rejections: first outcome wins, in both directions.
    let rejection = |seq: u64, reason: &str| Rejection {
        origin: Origin::durable("c", seq),
        channel: "ahp-session:/s".into(),
        action: r#"{"type":"x-test/bad"}"#.into(),
        reason: reason.into(),
        at_ms: 5,
    };
    assert!(matches!(
        store.record_rejection(rejection(1, "too late")).await.unwrap(),
        OriginOutcome::Accepted(e) if e.seq == 1
    ));
    let refused = store
        .record_rejection(rejection(7, "first reason"))
        .await
        .unwrap();
    assert_eq!(
        refused,
        OriginOutcome::Rejected(rejection(7, "first reason"))
    );
    assert_eq!(
        store
            .record_rejection(rejection(7, "second reason"))
            .await
            .unwrap(),
        OriginOutcome::Rejected(rejection(7, "first reason"))
    );
    let after_reject = store
        .append(vec![from_client(envelope("ahp-session:/s", 7), "c", 7)])
        .await
        .unwrap();
    assert_eq!(
        after_reject,
        vec![Appended::Duplicate(OriginOutcome::Rejected(rejection(
            7,
            "first reason"
        )))]
    );
    assert_eq!(
        store
            .origin_outcome(&Origin::durable("c", 7))
            .await
            .unwrap(),
        Some(OriginOutcome::Rejected(rejection(7, "first reason")))
    );
    assert!(matches!(
        store.origin_outcome(&Origin::durable("c", 2)).await.unwrap(),
        Some(OriginOutcome::Accepted(e)) if e.seq == 2
    ));
    assert_eq!(
        store
            .origin_outcome(&Origin::durable("c", 8))
            .await
            .unwrap(),
        None
    );
    assert_eq!(
        store
            .origin_outcome(&Origin::durable("other", 1))
            .await
            .unwrap(),
        None
    );
    assert_eq!(store.host().await.unwrap().last_seq, 2);

    // Scopes: the same (clientId, clientSeq) in another scope (a plain AHP
    // client's next connection) is a new origin; within a scope it is a
    // duplicate, and a rejection in one scope does not bind another.
    let scoped = |scope: &str, seq: u64| {
        let mut e = from_client(envelope("ahp-session:/s", 100 + seq), "c", seq);
        if let Some(origin) = e.origin.as_mut() {
            origin.scope = scope.to_owned();
        }
        e
    };
    let first = store
        .append(vec![
            scoped("conn-1", 1),
            scoped("conn-2", 1),
            scoped("conn-1", 1),
        ])
        .await
        .unwrap();
    assert!(matches!(first[0], Appended::Committed { seq: 3, .. }));
    assert!(matches!(first[1], Appended::Committed { seq: 4, .. }));
    assert!(
        matches!(&first[2], Appended::Duplicate(OriginOutcome::Accepted(e)) if e.seq == 3),
        "{first:?}"
    );
    let mut stored = store.read_after(2, None, 10).await.unwrap();
    assert_eq!(stored.len(), 2);
    assert_eq!(
        stored
            .remove(0)
            .origin
            .map(|o| (o.client_id, o.client_seq, o.scope)),
        Some(("c".into(), 1, "conn-1".into()))
    );
    let mut scoped_rejection = rejection(7, "scoped");
    scoped_rejection.origin.scope = "conn-3".into();
    assert_eq!(
        store
            .record_rejection(scoped_rejection.clone())
            .await
            .unwrap(),
        OriginOutcome::Rejected(scoped_rejection),
        "the durable scope's rejection of clientSeq 7 does not bind conn-3"
    );
    store.close().await;
}

/// A batch that meets a duplicate origin is written twice (SQLite: the
/// log's unique index refuses the first attempt, which is rolled back).
/// A channel and a client first seen in it are named by their first
/// attempt; the retry and every later commit must name them afresh, or a
/// channel's envelopes would be read back under another channel's name.
async fn names_first_seen_in_a_commit_that_met_a_duplicate_read_back_as_their_own(db: TestDb) {
    let store = db.open().await;
    let first = store
        .append(vec![from_client(envelope("ahp-session:/a", 1), "c", 1)])
        .await
        .unwrap();
    assert_eq!(committed(&first), vec![1]);
    let mixed = store
        .append(vec![
            from_client(envelope("ahp-session:/fresh", 2), "d", 1),
            from_client(envelope("ahp-session:/a", 99), "c", 1),
        ])
        .await
        .unwrap();
    assert!(
        matches!(mixed[0], Appended::Committed { seq: 2, .. }),
        "{mixed:?}"
    );
    assert!(matches!(mixed[1], Appended::Duplicate(_)), "{mixed:?}");
    let later = store
        .append(vec![
            from_client(envelope("ahp-session:/later", 3), "e", 1),
            from_client(envelope("ahp-session:/fresh", 4), "d", 2),
        ])
        .await
        .unwrap();
    assert_eq!(committed(&later), vec![3, 4]);
    for (channel, seqs) in [
        ("ahp-session:/a", &[1][..]),
        ("ahp-session:/fresh", &[2, 4]),
        ("ahp-session:/later", &[3]),
    ] {
        assert_read_back(store.as_ref(), channel, seqs).await;
    }
    // The clients' origins are still each their own.
    let again = store
        .append(vec![
            from_client(envelope("ahp-session:/later", 98), "d", 2),
            from_client(envelope("ahp-session:/later", 5), "e", 2),
        ])
        .await
        .unwrap();
    assert!(
        matches!(&again[0], Appended::Duplicate(OriginOutcome::Accepted(e)) if e.seq == 4),
        "{again:?}"
    );
    assert!(
        matches!(again[1], Appended::Committed { seq: 5, .. }),
        "{again:?}"
    );
}

async fn read_after_returns_exactly_the_suffix_in_order(db: TestDb) {
    let store = db.open().await;
    let channels = ["ahp-root://", "ahp-session:/a", "ahp-chat:/a-1"];
    let batch = (1..=60)
        .map(|n| envelope(channels[(n % 3) as usize], n))
        .collect();
    store.append(batch).await.unwrap();
    let all = store.read_after(0, None, 1000).await.unwrap();
    assert_eq!(
        all.iter().map(|e| e.seq).collect::<Vec<_>>(),
        (1..=60).collect::<Vec<_>>()
    );
    for after in [0_u64, 1, 17, 59, 60, 500] {
        let suffix = store.read_after(after, None, 1000).await.unwrap();
        let expected: Vec<_> = all.iter().filter(|e| e.seq > after).cloned().collect();
        assert_eq!(suffix, expected, "after {after}");
    }
    let limited = store.read_after(10, None, 5).await.unwrap();
    assert_eq!(
        limited.iter().map(|e| e.seq).collect::<Vec<_>>(),
        vec![11, 12, 13, 14, 15]
    );
    let wanted = vec!["ahp-session:/a".to_owned(), "ahp-chat:/a-1".to_owned()];
    let filtered = store.read_after(20, Some(&wanted), 1000).await.unwrap();
    let expected: Vec<_> = all
        .iter()
        .filter(|e| e.seq > 20 && wanted.contains(&e.channel))
        .cloned()
        .collect();
    assert_eq!(filtered, expected);
    // Merged across channels, a page is the lowest seqs of them all; a
    // channel named twice is read once.
    let twice = vec![
        "ahp-chat:/a-1".to_owned(),
        "ahp-session:/a".to_owned(),
        "ahp-chat:/a-1".to_owned(),
    ];
    let page = store.read_after(20, Some(&twice), 7).await.unwrap();
    assert_eq!(page, expected[..7].to_vec());
    assert!(
        store
            .read_after(0, Some(&[]), 1000)
            .await
            .unwrap()
            .is_empty()
    );
    // Within a byte budget: up to and including the envelope that takes
    // the read past it, whatever the row limit, on all channels or some.
    for channels in [None, Some(&wanted[..])] {
        let whole = store.read_after(20, channels, 1000).await.unwrap();
        let bytes: Vec<usize> = whole
            .iter()
            .scan(0, |sum, e| {
                *sum += e.read_bytes();
                Some(*sum)
            })
            .collect();
        for max in [0, bytes[0], bytes[0] + 1, bytes[4], bytes[bytes.len() - 1]] {
            let cut = store
                .read_after_within(20, channels, 1000, max)
                .await
                .unwrap();
            let taken = bytes.iter().take_while(|&&b| b <= max).count();
            let expected = &whole[..(taken + 1).min(whole.len())];
            assert_eq!(cut, expected, "{channels:?} within {max}");
        }
    }
    store.close().await;
}

async fn transcript_pages_hold_one_session_in_order(db: TestDb) {
    let store = db.open().await;
    let mut batch = Vec::new();
    for n in 1..=30 {
        let mut e = envelope(
            if n % 2 == 0 {
                "ahp-session:/x"
            } else {
                "ahp-session:/y"
            },
            n,
        );
        if n % 5 == 0 {
            // A chat envelope belongs to its session's transcript (the
            // chat is recorded by the envelope that first names it).
            e.channel = "ahp-chat:/x-chat".into();
            e.session_id = Some("x".into());
            e.chats = vec!["ahp-chat:/x-chat".into()];
        }
        batch.push(e);
    }
    store.append(batch).await.unwrap();
    let mut pages = Vec::new();
    let mut after = 0;
    loop {
        let page = store.transcript("x", after, 4).await.unwrap();
        let Some(last) = page.last() else { break };
        after = last.seq;
        pages.extend(page);
    }
    let seqs: Vec<u64> = pages.iter().map(|e| e.seq).collect();
    let expected: Vec<u64> = (1..=30).filter(|n| n % 2 == 0 || n % 5 == 0).collect();
    assert_eq!(seqs, expected);
    assert!(pages.iter().all(|e| e.session_id.as_deref() == Some("x")));
    assert!(store.transcript("missing", 0, 10).await.unwrap().is_empty());

    // Its changesets and terminals are in its log (what an export takes
    // out), not in its transcript; those of sessions whose ids begin as
    // its does are in neither.
    let under = [
        ("ahp-changeset:/x/t1", "x"),
        ("ahp-terminal:/x/console-1", "x"),
        ("ahp-terminal:/x2/console-1", "x2"),
        ("ahp-changeset:/x.y/t1", "x.y"),
        ("ahp-terminal:/x/t-2", "x"),
    ];
    let batch = (31..=60)
        .map(|n| {
            let (channel, session) = under[n as usize % under.len()];
            let mut e = envelope(channel, n);
            e.session_id = Some(session.to_owned());
            e
        })
        .collect();
    store.append(batch).await.unwrap();
    let mut logged = Vec::new();
    let mut after = 0;
    loop {
        let page = store.session_log("x", after, 4).await.unwrap();
        let Some(last) = page.last() else { break };
        after = last.seq;
        logged.extend(page.into_iter().map(|e| e.seq));
    }
    let ours = |n: &u64| under[*n as usize % under.len()].1 == "x";
    let expected_log: Vec<u64> = expected
        .iter()
        .copied()
        .chain((31..=60).filter(ours))
        .collect();
    assert_eq!(logged, expected_log);
    let transcript: Vec<u64> = store
        .transcript("x", 0, 100)
        .await
        .unwrap()
        .iter()
        .map(|e| e.seq)
        .collect();
    assert_eq!(transcript, expected, "the transcript is the conversation");
    store.close().await;
}

async fn session_pages_list_every_session_once_newest_first(db: TestDb) {
    const SESSIONS: usize = 57;
    let store = db.open().await;
    let mut batch = Vec::new();
    for i in 0..SESSIONS {
        let id = format!("s{i:03}");
        let mut e = envelope(&format!("ahp-session:/{id}"), i as u64);
        let project = if i % 3 == 0 { "alpha" } else { "beta" };
        let state = if i % 4 == 0 { "ended" } else { "dormant" };
        e.session = Some(record(&id, project, state));
        batch.push(e);
    }
    store.append(batch).await.unwrap();
    // Touch a few: they move to the front.
    let mut touch = envelope("ahp-session:/s010", 1000);
    touch.session = Some(record("s010", "beta", "live"));
    store.append(vec![touch]).await.unwrap();

    let page_all = |filter: SessionFilter| {
        let store = store.clone();
        async move {
            let mut out = Vec::new();
            let mut before = None;
            loop {
                let page = store.sessions(&filter, before, 10).await.unwrap();
                assert!(page.items.len() <= 10);
                out.extend(page.items);
                match page.next_before {
                    Some(next) => before = Some(next),
                    None => break,
                }
            }
            out
        }
    };
    let all = page_all(SessionFilter::default()).await;
    assert_eq!(all.len(), SESSIONS);
    let ids: BTreeSet<_> = all.iter().map(|r| r.record.id.clone()).collect();
    assert_eq!(ids.len(), SESSIONS, "every session exactly once");
    assert!(
        all.windows(2).all(|w| w[0].last_seq > w[1].last_seq),
        "newest first"
    );
    assert_eq!(all[0].record.id, "s010");
    assert_eq!(all[0].record.state, "live");

    let alpha = page_all(SessionFilter {
        project: Some("alpha".into()),
        ..SessionFilter::default()
    })
    .await;
    assert_eq!(alpha.len(), SESSIONS.div_ceil(3));
    assert!(alpha.iter().all(|r| r.record.project == "alpha"));
    let ended = page_all(SessionFilter {
        state: Some("ended".into()),
        ..SessionFilter::default()
    })
    .await;
    assert_eq!(ended.len(), SESSIONS.div_ceil(4));
    let both = page_all(SessionFilter {
        project: Some("alpha".into()),
        state: Some("ended".into()),
        ..SessionFilter::default()
    })
    .await;
    // A principal's scope: only its projects, paged like any filter.
    let scoped = page_all(SessionFilter {
        projects: Some(vec!["alpha".into(), "nowhere".into()]),
        ..SessionFilter::default()
    })
    .await;
    assert_eq!(scoped.len(), alpha.len());
    assert!(scoped.iter().all(|r| r.record.project == "alpha"));
    let none = page_all(SessionFilter {
        projects: Some(Vec::new()),
        ..SessionFilter::default()
    })
    .await;
    assert!(none.is_empty(), "an empty scope sees nothing");
    assert_eq!(
        both.len(),
        (0..SESSIONS).filter(|i| i % 3 == 0 && i % 4 == 0).count()
    );
    let exact = store
        .sessions(&SessionFilter::default(), None, SESSIONS as u32)
        .await
        .unwrap();
    assert_eq!(exact.items.len(), SESSIONS);
    assert_eq!(exact.next_before, None, "no empty trailing page");
    store.close().await;
}

/// Both backends order sessions by `last_seq` in buckets of 4,096 seqs,
/// then within a bucket (Postgres's migration 0016, SQLite's 0013): pages
/// whose sessions and cursors
/// lie in different buckets, of one, must still be newest first, each
/// session once.
async fn session_pages_keep_their_order_across_thousands_of_seqs(db: TestDb) {
    const SESSIONS: usize = 7;
    const FILLER: u64 = 1_500;
    let store = db.open().await;
    let mut n = 0;
    let mut append_session = |id: &str, project: &str| {
        let mut batch = Vec::new();
        let mut e = envelope(&format!("ahp-session:/{id}"), n);
        e.session = Some(record(id, project, "dormant"));
        batch.push(e);
        // Envelopes of no session, so that sessions lie thousands of seqs
        // apart.
        for _ in 0..FILLER {
            n += 1;
            batch.push(envelope("ahp-root", n));
        }
        batch
    };
    for i in 0..SESSIONS {
        let batch = append_session(&format!("s{i}"), if i % 2 == 0 { "even" } else { "odd" });
        store.append(batch).await.unwrap();
    }
    // Touched again: they move to the front, past several buckets.
    for id in ["s1", "s4"] {
        let project = if id == "s4" { "even" } else { "odd" };
        let batch = append_session(id, project);
        store.append(batch).await.unwrap();
    }
    for (filter, expected) in [
        (SessionFilter::default(), SESSIONS),
        (
            SessionFilter {
                project: Some("even".into()),
                ..SessionFilter::default()
            },
            SESSIONS.div_ceil(2),
        ),
    ] {
        for limit in [1, 2, 3] {
            let mut out = Vec::new();
            let mut before = None;
            loop {
                let page = store.sessions(&filter, before, limit).await.unwrap();
                out.extend(page.items);
                match page.next_before {
                    Some(next) => before = Some(next),
                    None => break,
                }
            }
            let ids: Vec<_> = out.iter().map(|r| r.record.id.as_str()).collect();
            assert_eq!(
                out.len(),
                expected,
                "every session once, limit {limit}: {ids:?}"
            );
            assert!(
                out.windows(2).all(|w| w[0].last_seq > w[1].last_seq),
                "newest first, limit {limit}: {ids:?}"
            );
            assert_eq!(ids[0], "s4", "the last touched first, limit {limit}");
        }
    }
    let (ids, _) = first_page(store.as_ref()).await;
    assert_eq!(ids, ["s4", "s1", "s6", "s5", "s3", "s2", "s0"]);
    // Touched twice more, one envelope each: the second stays in the
    // first's bucket, so only the columns no index holds are rewritten
    // (SQLite's migration 0013); the row must still say all of it.
    let mut seqs = Vec::new();
    for title in ["first", "second"] {
        n += 1;
        let mut again = envelope("ahp-session:/s6", n);
        let mut row = record("s6", "even", "dormant");
        row.title = Some(title.to_owned());
        again.session = Some(row);
        seqs.extend(committed(&store.append(vec![again]).await.unwrap()));
    }
    assert_eq!(seqs[0] / 4096, seqs[1] / 4096, "one bucket: {seqs:?}");
    let (ids, seqs_listed) = first_page(store.as_ref()).await;
    assert_eq!(ids, ["s6", "s4", "s1", "s5", "s3", "s2", "s0"]);
    let s6 = store.session("s6").await.unwrap().expect("s6");
    assert_eq!(s6.record.title.as_deref(), Some("second"));
    assert_eq!(s6.last_seq, seqs[1]);
    assert_eq!(seqs_listed[0], seqs[1]);
    store.close().await;
}

/// The ids and last seqs of the first page of every session, newest first.
async fn first_page(store: &dyn Store) -> (Vec<String>, Vec<u64>) {
    let page = store
        .sessions(&SessionFilter::default(), None, 100)
        .await
        .unwrap();
    page.items
        .into_iter()
        .map(|r| (r.record.id, r.last_seq))
        .unzip()
}

async fn the_read_model_is_written_with_the_log(db: TestDb) {
    let store = db.open().await;
    let mut create = envelope("ahp-session:/m", 1);
    create.session = Some(record("m", "p", "dormant"));
    create.chats = vec!["ahp-chat:/m.main".to_owned()];
    let seq = committed(&store.append(vec![create]).await.unwrap())[0];
    let row = store.session("m").await.unwrap().unwrap();
    assert_eq!(row.last_seq, seq);
    assert_eq!(
        store
            .chat_session("ahp-chat:/m.main")
            .await
            .unwrap()
            .as_deref(),
        Some("m")
    );
    assert_eq!(store.chat_session("ahp-chat:/other").await.unwrap(), None);
    assert_eq!(row.record, record("m", "p", "dormant"));

    let mut update = envelope("ahp-session:/m", 2);
    let mut changed = record("m", "p", "ended");
    changed.turns = 3;
    changed.resumable = true;
    changed.title = None;
    changed.created_ms = 42; // ignored: creation time is kept from the first write
    update.session = Some(changed.clone());
    let seq2 = committed(&store.append(vec![update]).await.unwrap())[0];
    let row = store.session("m").await.unwrap().unwrap();
    assert_eq!(row.last_seq, seq2);
    assert_eq!(row.record.state, "ended");
    assert_eq!(row.record.turns, 3);
    assert!(row.record.resumable);
    assert_eq!(row.record.title, None);
    assert_eq!(row.record.created_ms, 1_700_000_000_000);
    assert!(row.updated_ms >= row.record.created_ms);
    assert!(store.session("nope").await.unwrap().is_none());
    store.close().await;
}

/// A group commit writes each table in one statement (Postgres); a batch
/// that names the same session, chat or owner twice still commits, with
/// the latest record and owner and the first chat's session.
async fn one_batch_writing_a_key_twice_keeps_the_latest(db: TestDb) {
    let store = db.open().await;
    let mut first = from_client(envelope("ahp-session:/k", 1), "c1", 1);
    first.session = Some(record("k", "p", "dormant"));
    first.chats = vec!["ahp-chat:/k.main".to_owned()];
    first.owner = Some(("c1".to_owned(), "alice".to_owned()));
    let mut second = from_client(envelope("ahp-session:/k", 2), "c1", 2);
    second.session = Some(record("k", "p", "active"));
    second.chats = vec!["ahp-chat:/k.main".to_owned()];
    second.owner = Some(("c1".to_owned(), "bob".to_owned()));
    let mut other = from_client(envelope("ahp-session:/j", 3), "c1", 3);
    other.session = Some(record("j", "p", "dormant"));
    other.chats = vec!["ahp-chat:/k.main".to_owned()];
    let seqs = committed(&store.append(vec![first, second, other]).await.unwrap());
    assert_eq!(seqs.len(), 3);
    let row = store.session("k").await.unwrap().unwrap();
    assert_eq!(row.record.state, "active");
    assert_eq!(row.last_seq, seqs[1]);
    assert_eq!(store.session("j").await.unwrap().unwrap().last_seq, seqs[2]);
    assert_eq!(
        store
            .chat_session("ahp-chat:/k.main")
            .await
            .unwrap()
            .as_deref(),
        Some("k"),
        "a chat keeps the session that named it first"
    );
    assert_eq!(
        store.client_owners("k").await.unwrap(),
        vec![("c1".to_owned(), "bob".to_owned())]
    );
    store.close().await;
}

/// On a fresh store a group commit first writes without probing the log
/// (`plan::Probe::Index`): an origin refused earlier, in a batch of fresh
/// ones, must still come back refused, and the fresh ones commit gap-free.
async fn a_refused_origin_in_a_fresh_batch_is_refused_and_the_rest_commit(db: TestDb) {
    let store = db.open().await;
    let refused = Rejection {
        origin: Origin::durable("c", 5),
        channel: "ahp-session:/r".into(),
        action: r#"{"type":"x-test/bad"}"#.into(),
        reason: "refused".into(),
        at_ms: 5,
    };
    store.record_rejection(refused.clone()).await.unwrap();
    let outcomes = store
        .append(vec![
            from_client(envelope("ahp-session:/r", 1), "c", 4),
            from_client(envelope("ahp-session:/r", 2), "c", 5),
            from_client(envelope("ahp-session:/r", 3), "c", 6),
        ])
        .await
        .unwrap();
    assert!(
        matches!(outcomes[0], Appended::Committed { seq: 1, .. }),
        "{outcomes:?}"
    );
    assert_eq!(
        outcomes[1],
        Appended::Duplicate(OriginOutcome::Rejected(refused))
    );
    assert!(
        matches!(outcomes[2], Appended::Committed { seq: 2, .. }),
        "{outcomes:?}"
    );
    assert_eq!(store.host().await.unwrap().last_seq, 2);
    let stored = store.read_after(0, None, 10).await.unwrap();
    assert_eq!(stored.iter().map(|e| e.seq).collect::<Vec<_>>(), vec![1, 2]);
    store.close().await;
}

async fn snapshots_return_the_newest(db: TestDb) {
    let store = db.open().await;
    assert!(
        store
            .latest_snapshot("ahp-session:/s")
            .await
            .unwrap()
            .is_none()
    );
    for seq in [3_u64, 9, 5, 12] {
        store
            .put_snapshot(Snapshot {
                channel: "ahp-session:/s".into(),
                seq,
                state: format!(r#"{{"at":{seq}}}"#),
                at_ms: 1,
            })
            .await
            .unwrap();
    }
    store
        .put_snapshot(Snapshot {
            channel: "ahp-root://".into(),
            seq: 100,
            state: "{}".into(),
            at_ms: 1,
        })
        .await
        .unwrap();
    let latest = store
        .latest_snapshot("ahp-session:/s")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(latest.seq, 12);
    assert_eq!(latest.state, r#"{"at":12}"#);

    // Written with a group commit: in the same transaction as its envelopes.
    let appended = store
        .append_with_snapshots(
            std::sync::Arc::new(vec![envelope("ahp-session:/s", 1)]),
            vec![Snapshot {
                channel: "ahp-session:/s".into(),
                seq: 20,
                state: r#"{"at":20}"#.into(),
                at_ms: 2,
            }],
        )
        .await
        .unwrap();
    assert_eq!(committed(&appended).len(), 1);
    let latest = store
        .latest_snapshot("ahp-session:/s")
        .await
        .unwrap()
        .unwrap();
    assert_eq!((latest.seq, latest.state.as_str()), (20, r#"{"at":20}"#));
    // A snapshot alone is a transaction too.
    store
        .append_with_snapshots(
            std::sync::Arc::new(Vec::new()),
            vec![Snapshot {
                channel: "ahp-root://".into(),
                seq: 101,
                state: "{}".into(),
                at_ms: 3,
            }],
        )
        .await
        .unwrap();
    assert_eq!(
        store
            .latest_snapshot("ahp-root://")
            .await
            .unwrap()
            .map(|s| s.seq),
        Some(101)
    );
    store.close().await;
}

async fn working_contexts_upsert_and_list_most_recent_first(db: TestDb) {
    let store = db.open().await;
    assert!(store.working_context("p", "a").await.unwrap().is_none());
    assert!(
        store
            .working_contexts("p", None, 100)
            .await
            .unwrap()
            .is_empty()
    );
    store
        .save_working_context("p", "a", r#"{"goal":"one"}"#)
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(5)).await;
    store
        .save_working_context("p", "b", r#"{"goal":"two"}"#)
        .await
        .unwrap();
    store
        .save_working_context("q", "c", r#"{"goal":"other project"}"#)
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(5)).await;
    let resaved = store
        .save_working_context("p", "a", r#"{"goal":"three"}"#)
        .await
        .unwrap();
    let a = store.working_context("p", "a").await.unwrap().unwrap();
    assert_eq!(a.body, r#"{"goal":"three"}"#);
    assert_eq!(a.saved_ms, resaved);
    let listed: Vec<_> = store
        .working_contexts("p", None, 100)
        .await
        .unwrap()
        .into_iter()
        .map(|c| c.session)
        .collect();
    assert_eq!(
        listed,
        vec!["a", "b"],
        "a resave moves a session to the front"
    );
    store.close().await;
}

/// The child half of the crash test: appends until killed, printing each
/// acknowledged seq. Does nothing unless started by the parent.
#[test]
fn crash_child() {
    let Ok(url) = std::env::var("TETHER_CRASH_CHILD_URL") else {
        return;
    };
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async move {
        let store = tether_server::store::open(&url, &StoreOptions::default())
            .await
            .unwrap();
        let mut n = 0_u64;
        loop {
            let batch = (0..10)
                .map(|_| {
                    n += 1;
                    from_client(envelope("ahp-session:/crash", n), "crasher", n)
                })
                .collect();
            for seq in committed(&store.append(batch).await.unwrap()) {
                println!("acked {seq}");
            }
        }
    });
}

async fn a_killed_writer_loses_no_acknowledged_append(db: TestDb) {
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "crash_child", "--nocapture", "--test-threads=1"])
        .env("TETHER_CRASH_CHILD_URL", db.url())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let acked = tokio::task::spawn_blocking(move || {
        let mut acked = Vec::new();
        let deadline = Instant::now() + Duration::from_secs(60);
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if let Some(seq) = line.strip_prefix("acked ") {
                acked.push(seq.parse::<u64>().unwrap());
            }
            if acked.len() >= 300 || Instant::now() > deadline {
                break;
            }
        }
        // SIGKILL in the middle of the next batch: no graceful close.
        child.kill().unwrap();
        child.wait().unwrap();
        acked
    })
    .await
    .unwrap();
    assert!(
        acked.len() >= 300,
        "the child acknowledged only {} appends",
        acked.len()
    );

    let store: Arc<dyn Store> = db.open().await;
    let log = store.read_after(0, None, 10_000).await.unwrap();
    let stored: Vec<u64> = log.iter().map(|e| e.seq).collect();
    assert_eq!(
        stored,
        (1..=stored.len() as u64).collect::<Vec<_>>(),
        "no gap after the crash"
    );
    for seq in &acked {
        let e = &log[(*seq - 1) as usize];
        assert_eq!(
            e.origin.as_ref().unwrap().client_seq,
            *seq,
            "acknowledged seq {seq} intact"
        );
    }
    let host = store.host().await.unwrap();
    assert!(host.last_seq >= *acked.last().unwrap());
    let next = committed(
        &store
            .append(vec![envelope("ahp-root://", 0)])
            .await
            .unwrap(),
    );
    assert_eq!(
        next,
        vec![host.last_seq + 1],
        "seq continues above everything issued"
    );
    store.close().await;
}

async fn the_turn_archive_upserts_and_reads_ranges(db: TestDb) {
    let store = db.open().await;
    let turn = |generation: u64, ordinal: u64, body: &str| ArchivedTurn {
        chat: "ahp-chat:/c".into(),
        generation,
        ordinal,
        turn_id: format!("t{ordinal}"),
        body: body.into(),
    };
    // Through an append: written with the envelope, in its transaction.
    let mut first = envelope("ahp-session:/s", 1);
    first.turns = (0..3).map(|n| turn(0, n, "{}")).collect();
    store.append(vec![first]).await.unwrap();
    // Outside one: an upsert (a reused ordinal takes the new turn).
    store
        .archive_turns(&[
            turn(0, 2, r#"{"again":true}"#),
            turn(0, 3, "{}"),
            turn(1, 0, "{}"),
        ])
        .await
        .unwrap();
    let range = store.archived_turns("ahp-chat:/c", 0, 1..4).await.unwrap();
    assert_eq!(
        range.iter().map(|t| t.ordinal).collect::<Vec<_>>(),
        [1, 2, 3]
    );
    assert_eq!(range[1].body, r#"{"again":true}"#);
    assert_eq!(
        store
            .archived_turns("ahp-chat:/c", 1, 0..10)
            .await
            .unwrap()
            .len(),
        1,
        "generations are apart"
    );
    assert_eq!(
        store
            .archived_ordinal("ahp-chat:/c", 0, "t2")
            .await
            .unwrap(),
        Some(2)
    );
    assert_eq!(
        store
            .archived_ordinal("ahp-chat:/c", 0, "t9")
            .await
            .unwrap(),
        None
    );
    assert!(
        store
            .archived_turns("ahp-chat:/other", 0, 0..10)
            .await
            .unwrap()
            .is_empty()
    );
    store.close().await;
}

/// Finds `words` within the store's search, every project, newest first;
/// returns the documents' bodies, sorted.
async fn found(store: &Arc<dyn Store>, words: &str) -> Vec<String> {
    let request = tether_server::store::search::SearchRequest {
        query: tether_protocol::search::Query::parse(words).unwrap(),
        projects: None,
        project: None,
        agent: None,
        state: None,
        since_ms: None,
        until_ms: None,
        offset: 0,
        limit: 1000,
    };
    let mut bodies: Vec<String> = store
        .search(&request)
        .await
        .unwrap()
        .into_iter()
        .map(|hit| hit.body)
        .collect();
    bodies.sort();
    bodies
}

fn doc(key: &str, text: &str) -> tether_protocol::search::SearchDoc {
    tether_protocol::search::SearchDoc {
        key: key.to_owned(),
        chat: None,
        turn_id: None,
        kind: "message",
        text: text.to_owned(),
    }
}

/// The documents of one group commit are written a few statements at a
/// time (SQLite: chunks of 32, 16, ... 1); every one of an uneven count is
/// written, a later batch rewrites some, and a rebuild's older document
/// does not replace a newer one.
async fn a_batch_of_many_search_documents_is_all_found(db: TestDb) {
    let store = db.open().await;
    let mut create = envelope("ahp-session:/d", 0);
    create.session = Some(record("d", "p", "live"));
    let mut batch = vec![create];
    for n in 0..55_u64 {
        let mut e = envelope("ahp-session:/d", n + 1);
        e.search = vec![doc(&format!("k{n}"), &format!("zephyr number{n}"))];
        batch.push(e);
    }
    committed(&store.append(batch).await.unwrap());
    let all = found(&store, "zephyr").await;
    assert_eq!(all.len(), 55, "every document of the batch is found");
    assert_eq!(found(&store, "number54").await, vec!["zephyr number54"]);

    let mut rewrite = Vec::new();
    for n in [3_u64, 40, 54] {
        let mut e = envelope("ahp-session:/d", 100 + n);
        e.search = vec![doc(&format!("k{n}"), &format!("zephyr renamed{n}"))];
        rewrite.push(e);
    }
    let seqs = committed(&store.append(rewrite).await.unwrap());
    assert_eq!(
        found(&store, "zephyr").await.len(),
        55,
        "rewritten, not added"
    );
    assert!(found(&store, "number40").await.is_empty());
    assert_eq!(found(&store, "renamed40").await, vec!["zephyr renamed40"]);

    // A rebuild writes only where its seq is not older than the stored one.
    let older = seqs[0] - 1;
    store
        .put_search_docs(
            "d",
            &[
                (older, 1, doc("k3", "zephyr stale3")),
                (older, 1, doc("k77", "zephyr fresh77")),
            ],
        )
        .await
        .unwrap();
    assert!(
        found(&store, "stale3").await.is_empty(),
        "the newer document stays"
    );
    assert_eq!(found(&store, "fresh77").await, vec!["zephyr fresh77"]);
    assert_eq!(found(&store, "zephyr").await.len(), 56);
    store.close().await;
}

/// A query's terms match across the pieces of one long answer among each
/// term's newest matches: those of the caller's projects and filters, so
/// another project's newer documents (more than the window) do not push a
/// project's answer out of its own search.
async fn a_long_answer_is_found_across_its_pieces_however_busy_other_projects_are(db: TestDb) {
    let store = db.open().await;
    let piece = |n: u64, text: &str| tether_protocol::search::SearchDoc {
        key: format!("answer:t1:{n}"),
        chat: Some("ahp-chat:/mine.main".to_owned()),
        turn_id: Some("t1".to_owned()),
        kind: "answer",
        text: text.to_owned(),
    };
    let mut create = envelope("ahp-session:/mine", 0);
    create.session = Some(record("mine", "a", "live"));
    let mut first = envelope("ahp-session:/mine", 1);
    first.search = vec![piece(0, "quokka begins"), piece(1, "and ends with wombat")];
    committed(&store.append(vec![create, first]).await.unwrap());
    // Another project's, newer and more than the window.
    let mut create = envelope("ahp-session:/theirs", 0);
    create.session = Some(record("theirs", "b", "live"));
    let mut batch = vec![create];
    for n in 0..=u64::from(tether_server::store::search::RANKED_WINDOW) {
        let mut e = envelope("ahp-session:/theirs", n + 1);
        e.search = vec![doc(&format!("k{n}"), "quokka and wombat")];
        batch.push(e);
    }
    committed(&store.append(batch).await.unwrap());
    let request = tether_server::store::search::SearchRequest {
        query: tether_protocol::search::Query::parse("quokka wombat").unwrap(),
        projects: Some(vec!["a".to_owned()]),
        project: Some("a".to_owned()),
        agent: None,
        state: None,
        since_ms: None,
        until_ms: None,
        offset: 0,
        limit: 10,
    };
    let hits = store.search(&request).await.unwrap();
    assert_eq!(hits.len(), 1, "{hits:?}");
    assert_eq!(hits[0].session_id, "mine");
    assert_eq!(hits[0].turn_id.as_deref(), Some("t1"));
    store.close().await;
}
