//! Webhook delivery: the outbox's events posted to their receivers, at
//! least once, signed, retried with backoff, by one host per delivery
//! (DESIGN.md, "Finding, notifying, keeping").
//!
//! Each host runs one deliverer. It wakes when a commit raised events (and
//! polls, for events other hosts committed or retries that came due),
//! claims due deliveries in the store for a while (another host skips
//! them), posts each with the event's id for deduplication and an
//! HMAC-SHA256 signature, and records the outcome: delivered, or the next
//! attempt's time with the error, until it gives up. Commits never wait
//! for any of it.

pub mod sign;

use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use serde_json::{Value, json};
use tokio::sync::Notify;

use crate::store::webhooks::{Attempt, Due};
use crate::store::{Store, now_ms, rfc3339};
use crate::telemetry::metrics::Metrics;

/// Deliveries claimed per round.
const ROUND: u32 = 64;
/// Deliveries posted at once.
const PARALLEL: usize = 8;

/// How deliveries are made.
#[derive(Debug, Clone)]
pub struct WebhookConfig {
    /// How often to look for due deliveries without being woken.
    pub poll: Duration,
    /// The first retry's delay; each next one doubles, up to an hour.
    pub retry_base: Duration,
    /// Attempts before a delivery is given up.
    pub max_attempts: u32,
    /// How long one attempt may take.
    pub timeout: Duration,
}

impl Default for WebhookConfig {
    fn default() -> Self {
        Self {
            poll: Duration::from_secs(1),
            retry_base: Duration::from_secs(1),
            max_attempts: 15,
            timeout: Duration::from_secs(10),
        }
    }
}

/// The body of an event as posted: the same bytes on every attempt.
pub fn body(due: &Due) -> String {
    let data: Value = serde_json::from_str(&due.data).unwrap_or(Value::Null);
    json!({
        "id": due.event_id,
        "type": due.kind,
        "createdAt": rfc3339(due.at_ms),
        "project": due.project,
        "sessionId": due.session_id,
        "seq": due.seq,
        "data": data,
    })
    .to_string()
}

/// When the attempt after `attempts` failed ones is due, or `None` when it
/// is time to give up.
fn retry_at(config: &WebhookConfig, attempts: i64, now: i64) -> Option<i64> {
    if attempts >= i64::from(config.max_attempts) {
        return None;
    }
    let base = config.retry_base.as_millis() as i64;
    let delay = base
        .saturating_mul(1 << (attempts - 1).clamp(0, 20))
        .min(3_600_000);
    Some(now + delay)
}

/// Starts the deliverer of this host (`claimer`: its identity).
pub fn start(
    store: Arc<dyn Store>,
    metrics: Arc<Metrics>,
    config: WebhookConfig,
    claimer: String,
    wake: Arc<Notify>,
) {
    tokio::spawn(async move {
        let http = match reqwest::Client::builder()
            .timeout(config.timeout)
            .redirect(reqwest::redirect::Policy::none())
            .user_agent(concat!("Tether-Webhook/", env!("CARGO_PKG_VERSION")))
            .build()
        {
            Ok(http) => http,
            Err(err) => {
                tracing::error!(error = %err, "webhook deliveries disabled: no HTTP client");
                return;
            }
        };
        // What this host claimed before it stopped is due again at once.
        if let Err(err) = store.release_deliveries(&claimer).await {
            tracing::warn!(error = %err, "cannot release earlier webhook claims");
        }
        // A claim outlives any attempt, so no other host posts it meanwhile.
        let hold = (config.timeout * 3).as_millis() as i64;
        loop {
            let claimed = store
                .claim_deliveries(&claimer, now_ms(), hold, ROUND)
                .await;
            let due = match claimed {
                Ok(due) => due,
                Err(err) => {
                    metrics.store_error("webhook_claim");
                    tracing::warn!(error = %err, "cannot claim webhook deliveries");
                    Vec::new()
                }
            };
            let full = due.len() == ROUND as usize;
            futures_util::stream::iter(due)
                .for_each_concurrent(PARALLEL, |due| {
                    let (store, http, metrics, config) = (&store, &http, &metrics, &config);
                    async move {
                        let attempt = post(http, &due).await;
                        let outcome = match attempt {
                            Ok(status) => {
                                metrics.webhook("delivered");
                                let took = (now_ms() - due.at_ms).max(0) as f64 / 1000.0;
                                metrics.webhook_seconds.observe(took);
                                Attempt::Delivered { status }
                            }
                            Err((status, error)) => {
                                let retry_ms = retry_at(config, due.attempts, now_ms());
                                metrics.webhook(if retry_ms.is_some() {
                                    "retried"
                                } else {
                                    "gave_up"
                                });
                                tracing::warn!(event = %due.event_id, webhook = %due.webhook_id,
                                    attempt = due.attempts, %error, gave_up = retry_ms.is_none(),
                                    "webhook delivery failed");
                                Attempt::Failed {
                                    status,
                                    error,
                                    retry_ms,
                                }
                            }
                        };
                        if let Err(err) = store
                            .record_attempt(&due.event_id, &due.webhook_id, &outcome)
                            .await
                        {
                            // Its claim runs out and it is tried again.
                            metrics.store_error("webhook_record");
                            tracing::warn!(error = %err, "cannot record a webhook attempt");
                        }
                    }
                })
                .await;
            if !full {
                let _ = tokio::time::timeout(config.poll, wake.notified()).await;
            }
        }
    });
}

/// Posts one delivery: `Ok` with a 2xx status, else the status (when the
/// receiver answered) and what went wrong.
async fn post(http: &reqwest::Client, due: &Due) -> Result<u16, (Option<u16>, String)> {
    let body = body(due);
    let response = http
        .post(&due.url)
        .header("content-type", "application/json")
        .header("tether-event", &due.kind)
        .header("tether-delivery", &due.event_id)
        .header("tether-attempt", due.attempts.to_string())
        .header(
            "tether-signature",
            sign::signature(&due.secret, body.as_bytes()),
        )
        .body(body)
        .send()
        .await
        .map_err(|e| (None, format!("no answer: {e}")))?;
    let status = response.status();
    if status.is_success() {
        Ok(status.as_u16())
    } else {
        Err((
            Some(status.as_u16()),
            format!("the receiver answered {status}"),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retries_back_off_and_give_up() {
        let config = WebhookConfig {
            retry_base: Duration::from_millis(100),
            max_attempts: 4,
            ..WebhookConfig::default()
        };
        assert_eq!(retry_at(&config, 1, 0), Some(100));
        assert_eq!(retry_at(&config, 2, 0), Some(200));
        assert_eq!(retry_at(&config, 3, 0), Some(400));
        assert_eq!(retry_at(&config, 4, 0), None);
        let slow = WebhookConfig {
            max_attempts: 100,
            ..WebhookConfig::default()
        };
        assert_eq!(retry_at(&slow, 60, 0), Some(3_600_000), "at most an hour");
    }
}
