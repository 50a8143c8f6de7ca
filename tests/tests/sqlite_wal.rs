//! The SQLite store's WAL under sustained appends: checkpoints run off the
//! commit path, and the WAL file still stays bounded and starts over, so a
//! busy server neither loses appends nor grows its WAL without end.

use std::sync::Arc;

use tether_server::store::{Appended, NewEnvelope, Origin};
use tether_tests::TestDb;

/// About 150 MiB of WAL frames: several times the bound below, so a WAL
/// that never started over would be caught.
const BATCHES: u64 = 90;
const PER_BATCH: u64 = 1_000;
const CHANNELS: u64 = 200;

#[tokio::test]
async fn the_wal_stays_bounded_under_sustained_appends() {
    let db = TestDb::sqlite();
    let store = db.open().await;
    let path = db
        .url()
        .strip_prefix("sqlite:")
        .expect("a SQLite URL")
        .to_owned();
    let wal = format!("{path}-wal");
    let mut committed = 0u64;
    let mut largest = 0u64;
    for batch in 0..BATCHES {
        let envelopes: Vec<NewEnvelope> = (0..PER_BATCH)
            .map(|i| {
                let n = batch * PER_BATCH + i;
                let channel = format!("ahp-session:/s{}", n % CHANNELS);
                NewEnvelope {
                    session_id: channel.strip_prefix("ahp-session:/").map(str::to_owned),
                    channel,
                    action: format!(
                        r#"{{"type":"session/titleChanged","title":"title {n} of a session with a longer name"}}"#
                    ),
                    origin: Some(Origin::durable(format!("client-{}", n % CHANNELS), n)),
                    session: None,
                    chats: Vec::new(),
                    turns: Vec::new(),
                    directed: None,
                    owner: None,
                    search: Vec::new(),
                    usage: None,
                    events: Vec::new(),
                }
            })
            .collect();
        let outcomes = store
            .append_with_snapshots(Arc::new(envelopes), Vec::new())
            .await
            .expect("append");
        committed += outcomes
            .iter()
            .filter(|o| matches!(o, Appended::Committed { .. }))
            .count() as u64;
        largest = largest.max(std::fs::metadata(&wal).map_or(0, |m| m.len()));
    }
    assert_eq!(committed, BATCHES * PER_BATCH, "every append committed");
    // The writer makes the WAL start over at 8,192 frames (32 MiB of pages);
    // a WAL that never started over would be well past 100 MiB here.
    assert!(
        largest < 64 << 20,
        "the WAL file reached {largest} bytes; it must start over near 32 MiB"
    );
    let host = store.host().await.expect("host");
    assert_eq!(host.last_seq, BATCHES * PER_BATCH);
    let tail = store
        .read_after(host.last_seq - 10, None, 100)
        .await
        .expect("read the tail");
    assert_eq!(tail.len(), 10, "the last envelopes read back");
    store.close().await;
}
