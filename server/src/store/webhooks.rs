//! Webhooks, their outbox and deliveries, for both backends (DESIGN.md,
//! "Finding, notifying, keeping"). An event is written with the envelope
//! that raised it, with one delivery per webhook of its project that wants
//! it; hosts claim due deliveries (one host each), post them and record the
//! outcome.

/// A project's webhook.
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct Webhook {
    /// Its id.
    pub id: String,
    /// Its project.
    pub project: String,
    /// Where events are posted.
    pub url: String,
    /// The key its deliveries are signed with.
    pub secret: String,
    /// The event kinds it wants, as a JSON array (empty: all).
    pub events: String,
    /// When it was created, ms since the epoch.
    pub created_ms: i64,
    /// Who created it (the token's `sub`).
    pub created_by: String,
}

/// An event an envelope raises, for the outbox.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutboxEvent {
    /// Its kind (`turn.completed`, …).
    pub kind: &'static str,
    /// The session's project.
    pub project: String,
    /// Its data, JSON text.
    pub data: String,
}

impl OutboxEvent {
    /// The event's id once its envelope has a seq: the same for every
    /// delivery and attempt, the receivers' deduplication key.
    pub fn id(seq: i64, kind: &str) -> String {
        format!("evt-{seq}-{kind}")
    }
}

/// A delivery claimed for an attempt, with what its request needs.
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct Due {
    /// The event.
    pub event_id: String,
    /// The webhook.
    pub webhook_id: String,
    /// This attempt's number (1 for the first).
    pub attempts: i64,
    /// The webhook's URL.
    pub url: String,
    /// The webhook's secret.
    pub secret: String,
    /// The event's kind.
    pub kind: String,
    /// Its project.
    pub project: String,
    /// Its session.
    pub session_id: Option<String>,
    /// The seq of the envelope that raised it.
    pub seq: i64,
    /// When that envelope was committed.
    pub at_ms: i64,
    /// Its data, JSON text.
    pub data: String,
}

/// How an attempt went.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Attempt {
    /// The receiver answered 2xx.
    Delivered {
        /// Its status.
        status: u16,
    },
    /// It did not: tried again at `retry_ms`, or given up when `None`.
    Failed {
        /// The receiver's status, when it answered.
        status: Option<u16>,
        /// What went wrong, in a line.
        error: String,
        /// When to try again.
        retry_ms: Option<i64>,
    },
}

/// A delivery as listed for its webhook.
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct DeliveryRow {
    /// The event.
    pub event_id: String,
    /// Its kind.
    pub kind: String,
    /// Its session.
    pub session_id: Option<String>,
    /// When the event was raised.
    pub at_ms: i64,
    /// Attempts made.
    pub attempts: i64,
    /// When the next attempt is due (pending deliveries).
    pub next_ms: i64,
    /// When it was delivered.
    pub delivered_ms: Option<i64>,
    /// When it was given up.
    pub failed_ms: Option<i64>,
    /// The receiver's last status.
    pub last_status: Option<i64>,
    /// The last error.
    pub last_error: Option<String>,
}

/// The condition that a webhook `w` wants events of kind `kind` (a SQL
/// expression).
pub(super) fn wants(w: &str, kind: &str) -> String {
    format!("({w}.events = '[]' OR {w}.events LIKE '%\"' || {kind} || '\"%')")
}

/// The columns of a claimed delivery, from `deliveries d`, `webhooks w`
/// and `outbox o`.
pub(super) const DUE_COLUMNS: &str = "d.event_id, d.webhook_id, d.attempts, w.url, w.secret, \
     o.kind, o.project, o.session_id, o.seq, o.at_ms, o.data";

/// The columns of a listed delivery.
pub(super) const DELIVERY_COLUMNS: &str = "d.event_id, o.kind, o.session_id, o.at_ms, \
     d.attempts, d.next_ms, d.delivered_ms, d.failed_ms, d.last_status, d.last_error";
