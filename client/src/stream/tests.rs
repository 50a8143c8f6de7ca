//! Unit tests of the session stream's pure parts.

use super::*;

fn driver(channels: &[(&str, u64)]) -> (Driver, mpsc::UnboundedReceiver<StreamEvent>) {
    let (events, events_rx) = mpsc::unbounded_channel();
    let (_, commands) = mpsc::unbounded_channel();
    let driver = Driver {
        url: String::new(),
        config: StreamConfig::new("http://h")
            .with_identity(Arc::new(ClientIdentity::in_memory("me"))),
        covered: channels
            .iter()
            .map(|(c, s)| ((*c).to_owned(), *s))
            .collect(),
        aligned: false,
        pending: BTreeMap::new(),
        events,
        commands,
    };
    (driver, events_rx)
}

fn envelope(
    channel: &str,
    seq: u64,
    origin: Option<(&str, i64)>,
    rejected: bool,
) -> ActionEnvelope {
    serde_json::from_value(json!({
        "channel": channel,
        "serverSeq": seq,
        "action": {"type": "session/titleChanged", "title": format!("t{seq}")},
        "origin": origin.map(|(id, seq)| json!({"clientId": id, "clientSeq": seq})),
        "rejectionReason": rejected.then_some("no"),
    }))
    .unwrap()
}

#[test]
fn duplicates_and_rejections_are_never_yielded() {
    let (mut driver, _events) = driver(&[("a", 10), ("b", 3)]);
    assert!(
        driver.accept(envelope("a", 10, None, false)).is_none(),
        "covered by the snapshot"
    );
    assert!(driver.accept(envelope("a", 11, None, false)).is_some());
    assert!(
        driver.accept(envelope("a", 11, None, false)).is_none(),
        "twice"
    );
    // Not aligned: b's gap below a's seq is still to come, out of order.
    assert!(driver.accept(envelope("b", 5, None, false)).is_some());
    assert!(driver.accept(envelope("b", 4, None, false)).is_none());
    assert!(
        driver.accept(envelope("c", 50, None, false)).is_none(),
        "not subscribed"
    );
    assert!(
        driver.accept(envelope("a", 12, None, true)).is_none(),
        "a rejection"
    );
    assert_eq!(driver.covered["a"], 11);

    // Aligned (after a replay): one envelope covers every channel.
    driver.aligned = true;
    assert!(driver.accept(envelope("a", 20, None, false)).is_some());
    assert_eq!(driver.covered["b"], 20);
    assert!(driver.accept(envelope("b", 19, None, false)).is_none());
}

#[tokio::test]
async fn an_envelope_settles_its_dispatch_even_when_it_is_a_duplicate() {
    let (mut driver, _events) = driver(&[("a", 10)]);
    let (reply, answer) = oneshot::channel();
    driver.pending.insert(
        7,
        Pending {
            channel: "a".into(),
            client_seq: 7,
            action: json!({}),
            reply,
        },
    );
    // The consumer already has seq 9 (say, from a replay).
    assert!(
        driver
            .accept(envelope("a", 9, Some(("me", 7)), false))
            .is_none()
    );
    let Ok(Ok(Dispatched::Accepted(accepted))) = answer.await else {
        panic!("settled")
    };
    assert_eq!(accepted.server_seq, 9);
    assert!(driver.pending.is_empty());

    let (reply, answer) = oneshot::channel();
    driver.pending.insert(
        8,
        Pending {
            channel: "a".into(),
            client_seq: 8,
            action: json!({}),
            reply,
        },
    );
    // Another client's seq 8 settles nothing.
    assert!(
        driver
            .accept(envelope("a", 11, Some(("other", 8)), false))
            .is_some()
    );
    assert_eq!(driver.pending.len(), 1);
    driver.accept(envelope("a", 11, Some(("me", 8)), true));
    assert!(matches!(
        answer.await,
        Ok(Ok(Dispatched::Rejected { client_seq: 8, .. }))
    ));
}

#[test]
fn base_urls_become_ahp_websocket_urls() {
    assert_eq!(
        ws_url("http://127.0.0.1:7878").unwrap(),
        "ws://127.0.0.1:7878/ahp"
    );
    assert_eq!(
        ws_url("https://tether.example/base/").unwrap(),
        "wss://tether.example/base/ahp"
    );
    assert_eq!(ws_url("ws://h:1/ahp").unwrap(), "ws://h:1/ahp");
    assert!(ws_url("ftp://h").is_err());
}

#[test]
fn backoff_grows_is_capped_and_jittered() {
    let config = StreamConfig::new("http://h");
    for attempt in 0..30 {
        let base = config
            .initial_backoff
            .saturating_mul(1u32 << attempt.min(20))
            .min(config.max_backoff);
        let delay = backoff(&config, attempt);
        assert!(delay >= base / 2 && delay <= base, "{attempt}: {delay:?}");
    }
    let delays: std::collections::HashSet<Duration> =
        (0..20).map(|_| backoff(&config, 5)).collect();
    assert!(delays.len() > 1, "jittered");
}
