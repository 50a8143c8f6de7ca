//! Envelopes for the store's own tests, and what reading them back must
//! give.

use tether_server::store::{NewEnvelope, Origin, Store};

/// A host-originated envelope `{"type":"x-test/n","n":n}` on `channel`
/// (of the session a session channel names), with nothing else.
pub fn envelope(channel: &str, n: u64) -> NewEnvelope {
    NewEnvelope {
        channel: channel.to_owned(),
        session_id: channel.strip_prefix("ahp-session:/").map(str::to_owned),
        action: format!(r#"{{"type":"x-test/n","n":{n}}}"#),
        ..NewEnvelope::default()
    }
}

/// `envelope` as dispatched by `client_id` with its durable `client_seq`.
pub fn from_client(mut envelope: NewEnvelope, client_id: &str, client_seq: u64) -> NewEnvelope {
    envelope.origin = Some(Origin::durable(client_id, client_seq));
    envelope
}

/// Reading the session channel `channel` back, by channel and as its
/// session's transcript, gives exactly the envelopes `seqs`, in order.
pub async fn assert_read_back(store: &dyn Store, channel: &str, seqs: &[u64]) {
    let read = store
        .read_after(0, Some(&[channel.to_owned()]), 100)
        .await
        .unwrap();
    assert_eq!(
        read.iter()
            .map(|e| (e.channel.as_str(), e.seq))
            .collect::<Vec<_>>(),
        seqs.iter().map(|seq| (channel, *seq)).collect::<Vec<_>>(),
        "{channel} read by channel"
    );
    let id = channel
        .strip_prefix("ahp-session:/")
        .expect("a session channel");
    let page = store.transcript(id, 0, 100).await.unwrap();
    assert_eq!(
        page.iter().map(|e| e.seq).collect::<Vec<_>>(),
        seqs,
        "{id}'s transcript"
    );
}
