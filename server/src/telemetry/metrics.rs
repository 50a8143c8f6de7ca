//! The server's metrics, kept by the Prometheus project's own client
//! (`prometheus-client`) and served at `/metrics` in the OpenMetrics text
//! format.
//!
//! Labels are few and bounded: a refusal's kind, a channel kind, a
//! side-effect backend, a close code; the usage counters add the project,
//! the agent and the currency (as many as an operator configures). Never a
//! session, client or principal.
//! Values another part of the server already holds (open connections,
//! session actors, the high seq) are read when `/metrics` is scraped.

use std::sync::atomic::AtomicU64;
use std::time::Duration;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::{Registry, Unit};

/// One label, both halves static.
pub type Label = [(&'static str, &'static str); 1];

/// The dispatch outcomes, by `outcome` and `reason`.
pub type Outcome = [(&'static str, &'static str); 2];

/// A family of counters with one label.
pub type Counters = Family<Label, Counter>;

/// Every metric the server keeps. Cheap handles: each is an `Arc` inside.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    /// Group commits written.
    pub commits: Counter,
    /// Envelopes in them.
    pub committed_envelopes: Counter,
    /// Envelopes per group commit.
    pub batch_envelopes: Histogram,
    /// How long the store took for one group commit.
    pub commit_seconds: Histogram,
    /// Group commits the store refused (storage errors).
    pub commit_failures: Counter,
    /// Dispatches by outcome (`accepted`, `rejected`) and reason.
    pub dispatches: Family<Outcome, Counter>,
    /// The accepted series of `dispatches`, looked up once: finding a
    /// series hashes its labels, and nearly every dispatch is accepted.
    dispatches_accepted: Counter,
    /// From a dispatch reaching the engine to its outcome (after commit).
    pub dispatch_seconds: Histogram,
    /// From a commit to a subscriber's connection taking the envelope.
    pub delivery_seconds: Histogram,
    /// Subscribers caught up from the store after lagging.
    pub catch_ups: Counter,
    /// Subscriptions that read the log between their snapshot and their
    /// route (the others' channels were known to have nothing there), by
    /// channel kind.
    pub bridge_reads: Counters,
    /// Connections closed as too slow to drain.
    pub slow_closes: Counter,
    /// WebSocket connections closed by the server, by close code.
    pub closes: Counters,
    /// Side-effect latency by backend.
    pub effect_seconds: Family<Label, Histogram>,
    /// Side effects refused or timed out, by backend.
    pub effect_failures: Counters,
    /// Reads and writes the store failed, by operation.
    pub store_errors: Counters,
    /// Live subscriptions by channel kind (`root`, `session`, `chat`).
    pub subscriptions: Family<Label, Gauge>,
    /// Authentication failures by reason.
    pub auth_failures: Counters,
    /// Open WebSocket connections (read at scrape).
    pub connections: Gauge,
    /// Session actors in memory (read at scrape).
    pub session_actors: Gauge,
    /// ACP agent processes running (read at scrape).
    pub agents_running: Gauge,
    /// The highest `serverSeq` this host published (read at scrape).
    pub server_seq: Gauge,
    /// Envelopes other hosts committed that this host has not yet
    /// published (read at scrape; 0 with one host).
    pub tail_lag: Gauge,
    /// 1 while the host is not draining and group commits are not failing
    /// (set at scrape; `/readyz` also pings the store).
    pub ready: Gauge,
    /// Settled sessions retention deleted.
    pub retention_deleted: Counter,
    /// Webhook delivery attempts by outcome (`delivered`, `retried`,
    /// `gave_up`).
    pub webhook_attempts: Counters,
    /// From an event's commit to its delivery's 2xx.
    pub webhook_seconds: Histogram,
    /// Tokens agents reported, by project, agent and direction.
    pub usage_tokens: Family<Vec<(&'static str, String)>, Counter>,
    /// Cost agents reported, by project, agent and currency.
    pub usage_cost: Family<Vec<(&'static str, String)>, Counter<f64, AtomicU64>>,
}

/// Latency buckets from 100 µs to about 13 s.
fn seconds() -> Histogram {
    Histogram::new(exponential_buckets(0.0001, 2.0, 18))
}

impl Metrics {
    /// Registers every metric; `auth_failures` is the authenticator's own
    /// family (it counts before the engine exists).
    pub fn new(auth_failures: Counters) -> Self {
        let mut registry = Registry::with_prefix("tether");
        let this = Self {
            commits: Counter::default(),
            committed_envelopes: Counter::default(),
            batch_envelopes: Histogram::new(exponential_buckets(1.0, 2.0, 12)),
            commit_seconds: seconds(),
            commit_failures: Counter::default(),
            dispatches: Family::default(),
            dispatches_accepted: Counter::default(),
            dispatch_seconds: seconds(),
            delivery_seconds: seconds(),
            catch_ups: Counter::default(),
            bridge_reads: Family::default(),
            slow_closes: Counter::default(),
            closes: Family::default(),
            effect_seconds: Family::new_with_constructor(seconds),
            effect_failures: Family::default(),
            store_errors: Family::default(),
            subscriptions: Family::default(),
            auth_failures,
            connections: Gauge::default(),
            session_actors: Gauge::default(),
            agents_running: Gauge::default(),
            server_seq: Gauge::default(),
            tail_lag: Gauge::default(),
            ready: Gauge::default(),
            retention_deleted: Counter::default(),
            webhook_attempts: Family::default(),
            webhook_seconds: seconds(),
            usage_tokens: Family::default(),
            usage_cost: Family::default(),
            registry: Registry::default(),
        };
        let r = &mut registry;
        r.register("commits", "Group commits written", this.commits.clone());
        r.register(
            "committed_envelopes",
            "Envelopes in those commits",
            this.committed_envelopes.clone(),
        );
        r.register(
            "commit_batch_envelopes",
            "Envelopes per group commit",
            this.batch_envelopes.clone(),
        );
        r.register_with_unit(
            "commit_duration",
            "How long the store took for one group commit",
            Unit::Seconds,
            this.commit_seconds.clone(),
        );
        r.register(
            "commit_failures",
            "Group commits the store failed",
            this.commit_failures.clone(),
        );
        r.register(
            "dispatches",
            "Dispatches by outcome and reason",
            this.dispatches.clone(),
        );
        r.register_with_unit(
            "dispatch_to_commit",
            "From a dispatch reaching the engine to its committed outcome",
            Unit::Seconds,
            this.dispatch_seconds.clone(),
        );
        r.register_with_unit(
            "commit_to_delivery",
            "From a commit to a subscriber's connection taking the envelope",
            Unit::Seconds,
            this.delivery_seconds.clone(),
        );
        r.register(
            "catch_ups",
            "Subscribers that lagged and caught up from the store",
            this.catch_ups.clone(),
        );
        r.register(
            "subscription_bridge_reads",
            "Subscriptions that read the log between their snapshot and their route, by channel kind",
            this.bridge_reads.clone(),
        );
        r.register(
            "slow_consumer_closes",
            "Connections closed because they could not drain",
            this.slow_closes.clone(),
        );
        r.register(
            "ws_closes",
            "WebSocket connections the server closed, by close code",
            this.closes.clone(),
        );
        r.register_with_unit(
            "effect_duration",
            "Side-effect latency by backend",
            Unit::Seconds,
            this.effect_seconds.clone(),
        );
        r.register(
            "effect_failures",
            "Side effects refused or timed out, by backend",
            this.effect_failures.clone(),
        );
        r.register(
            "store_errors",
            "Store operations that failed, by operation",
            this.store_errors.clone(),
        );
        r.register(
            "subscriptions",
            "Live subscriptions by channel kind",
            this.subscriptions.clone(),
        );
        r.register(
            "auth_failures",
            "Requests and connections refused for a missing or invalid token, by reason",
            this.auth_failures.clone(),
        );
        r.register(
            "ws_connections",
            "Open WebSocket connections",
            this.connections.clone(),
        );
        r.register(
            "session_actors",
            "Session actors in memory",
            this.session_actors.clone(),
        );
        r.register(
            "agents_running",
            "ACP agent processes running",
            this.agents_running.clone(),
        );
        r.register(
            "server_seq",
            "Highest serverSeq published by this host",
            this.server_seq.clone(),
        );
        r.register(
            "cluster_tail_lag_envelopes",
            "Envelopes other hosts committed that this host has not yet published",
            this.tail_lag.clone(),
        );
        r.register(
            "ready",
            "1 while the host is not shutting down and group commits are not failing",
            this.ready.clone(),
        );
        r.register(
            "retention_deleted_sessions",
            "Settled sessions deleted by retention (with everything they own)",
            this.retention_deleted.clone(),
        );
        r.register(
            "webhook_attempts",
            "Webhook delivery attempts by outcome (delivered, retried, gave_up)",
            this.webhook_attempts.clone(),
        );
        r.register_with_unit(
            "webhook_delivery",
            "From an event's commit to its receiver's 2xx answer",
            Unit::Seconds,
            this.webhook_seconds.clone(),
        );
        r.register(
            "usage_tokens",
            "Tokens agents reported, by project, agent and direction (input, output)",
            this.usage_tokens.clone(),
        );
        r.register(
            "usage_cost",
            "Cost agents reported, by project, agent and currency",
            this.usage_cost.clone(),
        );
        let dispatches_accepted = this
            .dispatches
            .get_or_create(&[("outcome", "accepted"), ("reason", "none")])
            .clone();
        Self {
            registry,
            dispatches_accepted,
            ..this
        }
    }

    /// Counts a dispatch's outcome and, when it reached a session, its
    /// latency.
    pub fn dispatched(&self, outcome: &'static str, reason: &'static str, took: Duration) {
        if (outcome, reason) == ("accepted", "none") {
            self.dispatches_accepted.inc();
        } else {
            self.dispatches
                .get_or_create(&[("outcome", outcome), ("reason", reason)])
                .inc();
        }
        self.dispatch_seconds.observe(took.as_secs_f64());
    }

    /// Counts what a committed usage report added: tokens and cost (in
    /// millionths of `currency`).
    pub fn usage(
        &self,
        project: &str,
        agent: &str,
        (input, output): (i64, i64),
        cost_micros: i64,
        currency: &str,
    ) {
        let labels = |last: (&'static str, &str)| {
            vec![
                ("project", project.to_owned()),
                ("agent", agent.to_owned()),
                (last.0, last.1.to_owned()),
            ]
        };
        for (direction, tokens) in [("input", input), ("output", output)] {
            if tokens > 0 {
                self.usage_tokens
                    .get_or_create(&labels(("direction", direction)))
                    .inc_by(tokens as u64);
            }
        }
        if cost_micros > 0 && !currency.is_empty() {
            self.usage_cost
                .get_or_create(&labels(("currency", currency)))
                .inc_by(cost_micros as f64 / 1e6);
        }
    }

    /// Counts a webhook delivery attempt's outcome.
    pub fn webhook(&self, outcome: &'static str) {
        self.webhook_attempts
            .get_or_create(&[("outcome", outcome)])
            .inc();
    }

    /// Counts a failed store operation.
    pub fn store_error(&self, operation: &'static str) {
        self.store_errors
            .get_or_create(&[("operation", operation)])
            .inc();
    }

    /// The OpenMetrics text exposition.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        // Writing to a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }
}

/// The content type of [`Metrics::encode`]'s text.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_exposition_names_each_metric_once_with_its_labels() {
        let m = Metrics::new(Counters::default());
        m.commits.inc();
        m.dispatched("rejected", "invalid", Duration::from_millis(3));
        m.dispatched("accepted", "none", Duration::from_millis(1));
        m.dispatched("accepted", "none", Duration::from_millis(1));
        m.subscriptions.get_or_create(&[("kind", "chat")]).set(2);
        let text = m.encode();
        assert!(text.contains("tether_commits_total 1"), "{text}");
        assert!(
            text.contains("tether_dispatches_total{outcome=\"rejected\",reason=\"invalid\"} 1"),
            "{text}"
        );
        assert!(
            text.contains("tether_dispatches_total{outcome=\"accepted\",reason=\"none\"} 2"),
            "{text}"
        );
        assert!(
            text.contains("tether_subscriptions{kind=\"chat\"} 2"),
            "{text}"
        );
        assert!(
            text.contains("tether_dispatch_to_commit_seconds_count 3"),
            "{text}"
        );
        assert!(text.ends_with("# EOF\n"), "{text}");
    }
}
