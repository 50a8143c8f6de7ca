//! The hub every committed envelope passes through on its way to the
//! connections, in `serverSeq` order.
//!
//! Each envelope is serialised once, into the exact text frame every
//! subscriber receives; connections filter by channel and never re-encode. A
//! connection whose receiver lags behind the hub's buffer is told so
//! (`Lagged`) and catches up from the store, which holds everything the hub
//! ever carried (commit happens before publish).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use axum::extract::ws::Utf8Bytes;
use tokio::sync::broadcast;

use crate::store::{Origin, StoredEnvelope};

/// One committed envelope, ready to send.
#[derive(Debug)]
pub struct Published {
    /// Its `serverSeq`.
    pub seq: u64,
    /// Its channel URI.
    pub channel: String,
    /// The whole JSON-RPC `action` notification.
    pub frame: Utf8Bytes,
}

/// What the hub carries.
#[derive(Debug, Clone)]
pub enum HubItem {
    /// A committed envelope.
    Envelope(Arc<Published>),
    /// A protocol notification for a channel's subscribers (root
    /// notifications); not part of the log and never replayed.
    Notice {
        /// The channel whose subscribers get it.
        channel: Arc<str>,
        /// The whole JSON-RPC notification.
        frame: Utf8Bytes,
    },
}

/// The broadcast hub.
#[derive(Debug)]
pub struct Hub {
    sender: broadcast::Sender<HubItem>,
    published: AtomicU64,
}

impl Hub {
    /// A hub that buffers `capacity` items for slow receivers.
    pub fn new(capacity: usize, last_seq: u64) -> Self {
        let (sender, _) = broadcast::channel(capacity.max(16));
        Self {
            sender,
            published: AtomicU64::new(last_seq),
        }
    }

    /// A receiver and the highest seq published before it: every envelope
    /// above that seq will reach the receiver (or make it lag).
    pub fn subscribe(&self) -> (broadcast::Receiver<HubItem>, u64) {
        let receiver = self.sender.subscribe();
        (receiver, self.published.load(Ordering::Acquire))
    }

    /// The highest seq published.
    pub fn published(&self) -> u64 {
        self.published.load(Ordering::Acquire)
    }

    /// Publishes committed envelopes; callers publish in seq order.
    pub fn publish(&self, item: Arc<Published>) {
        self.published.fetch_max(item.seq, Ordering::AcqRel);
        // No receivers is fine: nobody is subscribed.
        let _ = self.sender.send(HubItem::Envelope(item));
    }

    /// Publishes a notification to a channel's subscribers.
    pub fn notify(&self, channel: &str, frame: String) {
        let _ = self.sender.send(HubItem::Notice {
            channel: channel.into(),
            frame: frame.into(),
        });
    }
}

/// The `action` notification text of an envelope. `action` is JSON text.
pub fn action_frame(
    seq: u64,
    channel: &str,
    action: &str,
    origin: Option<&Origin>,
    rejection: Option<&str>,
) -> String {
    let mut params = serde_json::json!({
        "channel": channel,
        "serverSeq": seq,
    });
    if let Some(origin) = origin {
        params["origin"] =
            serde_json::json!({"clientId": origin.client_id, "clientSeq": origin.client_seq});
    }
    if let Some(reason) = rejection {
        params["rejectionReason"] = serde_json::Value::String(reason.to_owned());
    }
    let mut params = serde_json::to_string(&params).unwrap_or_default();
    // Splice the stored action text in as-is: it is JSON the host wrote, and
    // it is re-sent byte for byte.
    params.pop();
    params.push_str(",\"action\":");
    params.push_str(action);
    params.push('}');
    format!(r#"{{"jsonrpc":"2.0","method":"action","params":{params}}}"#)
}

/// The envelope object (`params` of an `action` notification) of a stored
/// envelope, for replies that list envelopes.
pub fn envelope_json(envelope: &StoredEnvelope) -> serde_json::Value {
    let action: serde_json::Value =
        serde_json::from_str(&envelope.action).unwrap_or(serde_json::Value::Null);
    let mut value = serde_json::json!({
        "channel": envelope.channel,
        "action": action,
        "serverSeq": envelope.seq,
    });
    if let Some(origin) = &envelope.origin {
        value["origin"] =
            serde_json::json!({"clientId": origin.client_id, "clientSeq": origin.client_seq});
    }
    value
}

/// The published form of a stored envelope (catch-up from the store).
pub fn published_from_store(envelope: &StoredEnvelope) -> Published {
    Published {
        seq: envelope.seq,
        channel: envelope.channel.clone(),
        frame: action_frame(
            envelope.seq,
            &envelope.channel,
            &envelope.action,
            envelope.origin.as_ref(),
            None,
        )
        .into(),
    }
}
