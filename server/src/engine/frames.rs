//! An envelope's text, written once: the `action` notification frame every
//! subscriber of its channel receives, and the envelope as it stands in a
//! replay, the transcript and the export (byte for byte what serde_json
//! would write, straight from the stored action's text).

use super::fanout::{Published, creates_session};
use crate::store::{Origin, StoredEnvelope};

/// The `action` notification text of an envelope. `action` is JSON text.
pub fn action_frame(
    seq: u64,
    channel: &str,
    action: &str,
    origin: Option<&Origin>,
    rejection: Option<&str>,
) -> String {
    let envelope = Envelope(seq, channel, action, origin, rejection);
    wrapped(
        r#"{"jsonrpc":"2.0","method":"action","params":"#,
        &envelope,
        "}",
    )
}

/// The envelope object as JSON text (the `params` of an `action`
/// notification). The stored action text is spliced in as-is: it is JSON the
/// host wrote, re-sent byte for byte and never parsed again.
pub fn envelope_text(
    seq: u64,
    channel: &str,
    action: &str,
    origin: Option<&Origin>,
    rejection: Option<&str>,
) -> String {
    wrapped("", &Envelope(seq, channel, action, origin, rejection), "")
}

/// An envelope's parts: seq, channel, action text, origin, rejection.
struct Envelope<'a>(u64, &'a str, &'a str, Option<&'a Origin>, Option<&'a str>);

/// `head`, the envelope's text, then `tail`, in one allocation.
fn wrapped(head: &str, e: &Envelope<'_>, tail: &str) -> String {
    let room = head.len() + ENVELOPE_ROOM + e.1.len() + e.2.len() + tail.len();
    let mut text = String::with_capacity(room);
    text.push_str(head);
    write_envelope(&mut text, e.0, e.1, e.2, e.3, e.4);
    text.push_str(tail);
    text
}

const ENVELOPE_ROOM: usize = 128;

/// Appends the envelope object to `out`, written straight into it (no
/// value tree): `channel`, `serverSeq`, `origin`, `rejectionReason`, then
/// the action.
pub fn write_envelope(
    out: &mut String,
    seq: u64,
    channel: &str,
    action: &str,
    origin: Option<&Origin>,
    rejection: Option<&str>,
) {
    let mut number = itoa::Buffer::new();
    out.push_str(r#"{"channel":"#);
    push_json_string(out, channel);
    out.push_str(r#","serverSeq":"#);
    out.push_str(number.format(seq));
    if let Some(origin) = origin {
        out.push_str(r#","origin":{"clientId":"#);
        push_json_string(out, &origin.client_id);
        out.push_str(r#","clientSeq":"#);
        out.push_str(number.format(origin.client_seq));
        out.push('}');
    }
    if let Some(reason) = rejection {
        out.push_str(r#","rejectionReason":"#);
        push_json_string(out, reason);
    }
    out.push_str(r#","action":"#);
    out.push_str(action);
    out.push('}');
}

/// Appends `text` as a JSON string: as it is when nothing in it needs
/// escaping (channel URIs and client ids nearly always), through
/// serde_json otherwise.
fn push_json_string(out: &mut String, text: &str) {
    if text.bytes().all(|b| b >= 0x20 && b != b'"' && b != b'\\') {
        out.push('"');
        out.push_str(text);
        out.push('"');
    } else {
        out.push_str(&serde_json::to_string(text).unwrap_or_else(|_| "\"\"".into()));
    }
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
        directed: None,
        committed: std::time::Instant::now(),
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
        creates: creates_session(&envelope.channel, &envelope.action),
    }
}
