//! Message attachments: what a session's agent can take, and their bytes
//! stored once, outside the envelopes.
//!
//! A client's message (`chat/turnStarted`, `chat/pendingMessageSet`) may
//! carry attachments. An embedded one (base64 bytes) is checked against
//! the agent's prompt capabilities (images, audio, other embedded content)
//! and the size limits, its bytes are stored under their SHA-256 digest,
//! and the message keeps a `resource` attachment pointing at them
//! (`tether-attachment:<digest>`, [`crate::store::ATTACHMENT_SCHEME`], served by `GET
//! /v1/sessions/{id}/attachments/{digest}`): the transcript, every replay
//! and every snapshot carry the reference, not the bytes. References to
//! other resources and simple (textual) attachments pass as they are;
//! kinds the host cannot hand to an agent are refused.

use base64::Engine as _;
use serde_json::{Value, json};

use crate::agents::AgentSpec;
use crate::store::Attachment;

/// The limits on attachments.
#[derive(Debug, Clone, Copy)]
pub struct AttachmentLimits {
    /// Largest single attachment, in bytes (decoded).
    pub per_attachment: usize,
    /// Most bytes of attachments one session may hold.
    pub per_session: u64,
}

impl Default for AttachmentLimits {
    fn default() -> Self {
        Self {
            per_attachment: 8 * 1024 * 1024,
            per_session: 256 * 1024 * 1024,
        }
    }
}

/// A message's attachments, checked: embedded ones rewritten into
/// references; the bytes to store before the message is committed.
pub fn take_in(
    session: &str,
    agent: Option<&AgentSpec>,
    limits: AttachmentLimits,
    message: &mut Value,
) -> Result<Vec<Attachment>, String> {
    let Some(list) = message.get_mut("attachments").and_then(Value::as_array_mut) else {
        return Ok(Vec::new());
    };
    let caps = agent.and_then(AgentSpec::acp_capabilities);
    let mut stored = Vec::new();
    for attachment in list.iter_mut() {
        let label = attachment["label"]
            .as_str()
            .unwrap_or("attachment")
            .to_owned();
        match attachment["type"].as_str() {
            Some("embeddedResource") => {
                let content_type = attachment["contentType"]
                    .as_str()
                    .unwrap_or("application/octet-stream")
                    .to_owned();
                let media = content_type.len() <= 255
                    && content_type.contains('/')
                    && content_type
                        .bytes()
                        .all(|b| b.is_ascii_graphic() || b == b' ');
                if !media {
                    return Err(format!(
                        "Attachment {label:?}: {content_type:?} is not a media type (type/subtype)."
                    ));
                }
                if let Some(caps) = caps {
                    let (allowed, what) = if content_type.starts_with("image/") {
                        (caps.image, "images")
                    } else if content_type.starts_with("audio/") {
                        (caps.audio, "audio")
                    } else {
                        (caps.embedded_context, "embedded files")
                    };
                    if !allowed {
                        return Err(format!(
                            "Attachment {label:?} ({content_type}) cannot be sent: this session's \
                             agent does not take {what}."
                        ));
                    }
                }
                let data = base64::engine::general_purpose::STANDARD
                    .decode(attachment["data"].as_str().unwrap_or_default())
                    .map_err(|e| format!("Attachment {label:?}: its data is not base64 ({e})."))?;
                if data.len() > limits.per_attachment {
                    return Err(format!(
                        "Attachment {label:?} is {} bytes; the most this host takes is {} \
                         (--max-attachment-bytes).",
                        data.len(),
                        limits.per_attachment
                    ));
                }
                let size = data.len();
                let bytes = Attachment::new(session, &content_type, data);
                let Value::Object(map) = attachment else {
                    return Err(format!("Attachment {label:?} is not an object."));
                };
                map.remove("data");
                map.insert("type".into(), json!("resource"));
                map.insert("uri".into(), json!(bytes.uri()));
                map.insert("sizeHint".into(), json!(size));
                stored.push(bytes);
            }
            Some("resource" | "simple") => {}
            other => {
                return Err(format!(
                    "Attachment {label:?} of kind {:?} cannot be handed to an agent; send files \
                     as embedded resources or references, and text as a simple attachment.",
                    other.unwrap_or("(none)")
                ));
            }
        }
    }
    Ok(stored)
}

/// An action as it is stored: a message's embedded attachments replaced
/// by references to their bytes, as [`take_in`] replaces them (for telling
/// a retry from a different dispatch with the same origin).
pub fn as_stored(action: &Value) -> Value {
    let mut stored = action.clone();
    let message_kind = matches!(
        tether_protocol::actions::action_type(action),
        Some("chat/turnStarted" | "chat/pendingMessageSet")
    );
    if message_kind && let Some(message) = stored.get_mut("message") {
        let unbounded = AttachmentLimits {
            per_attachment: usize::MAX,
            per_session: u64::MAX,
        };
        // Compared only: what does not convert stays as sent.
        let _ = take_in("", None, unbounded, message);
    }
    stored
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn embedded_bytes_become_a_reference_and_limits_hold() {
        let data = base64::engine::general_purpose::STANDARD.encode(b"hello");
        let mut message = json!({"text": "see", "attachments": [
            {"type": "embeddedResource", "label": "a.txt", "contentType": "text/plain", "data": data},
            {"type": "simple", "label": "note", "modelRepresentation": "a note"},
        ]});
        let stored = take_in("s", None, AttachmentLimits::default(), &mut message).unwrap();
        assert_eq!(stored.len(), 1);
        assert_eq!(stored[0].data, b"hello");
        let reference = &message["attachments"][0];
        assert_eq!(reference["type"], "resource");
        assert!(reference.get("data").is_none());
        assert_eq!(reference["sizeHint"], 5);
        assert_eq!(
            crate::store::attachment_digest(reference["uri"].as_str().unwrap()),
            Some(stored[0].digest.as_str())
        );
        let small = AttachmentLimits {
            per_attachment: 4,
            per_session: 100,
        };
        let mut again = json!({"attachments": [
            {"type": "embeddedResource", "label": "a.txt", "contentType": "text/plain", "data": data}]});
        assert!(
            take_in("s", None, small, &mut again)
                .unwrap_err()
                .contains("5 bytes")
        );
        let mut odd = json!({"attachments": [{"type": "chat", "label": "x"}]});
        assert!(take_in("s", None, AttachmentLimits::default(), &mut odd).is_err());
    }
}
