//! A message attachment's bytes, stored outside the envelopes, and the
//! `tether-attachment:` URI that names them.

/// The URI scheme of a stored attachment: `tether-attachment:<digest>`.
pub const ATTACHMENT_SCHEME: &str = "tether-attachment:";

/// The digest a stored attachment's URI names.
pub fn attachment_digest(uri: &str) -> Option<&str> {
    uri.strip_prefix(ATTACHMENT_SCHEME)
        .filter(|d| d.len() == 64 && d.bytes().all(|c| matches!(c, b'0'..=b'9' | b'a'..=b'f')))
}

impl Attachment {
    /// Bytes of a session's, keyed by their SHA-256.
    pub fn new(session_id: &str, content_type: &str, data: Vec<u8>) -> Self {
        use sha2::Digest as _;
        let digest = sha2::Sha256::digest(&data)
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        Self {
            session_id: session_id.to_owned(),
            digest,
            content_type: content_type.to_owned(),
            data,
        }
    }

    /// Its `tether-attachment:` URI.
    pub fn uri(&self) -> String {
        format!("{ATTACHMENT_SCHEME}{}", self.digest)
    }
}

/// A message attachment's bytes, stored outside the envelopes.
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct Attachment {
    /// The session it belongs to.
    pub session_id: String,
    /// The SHA-256 of its bytes, lower-case hex.
    pub digest: String,
    /// Its media type (`image/png`, ...).
    pub content_type: String,
    /// The bytes.
    pub data: Vec<u8>,
}
