//! What one principal may take of the host: simultaneous WebSocket
//! connections, and dispatches as a token bucket (a steady rate with room
//! for bursts). Keyed by the token's `sub`; off without authentication (the
//! loopback admin is the only caller then).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The per-principal bounds.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LimitsConfig {
    /// Simultaneous WebSocket connections of one principal.
    pub connections: usize,
    /// Dispatches per second one principal may sustain.
    pub dispatch_rate: f64,
    /// Dispatches one principal may send at once above the rate.
    pub dispatch_burst: f64,
}

impl Default for LimitsConfig {
    fn default() -> Self {
        Self {
            connections: 64,
            dispatch_rate: 1_000.0,
            dispatch_burst: 5_000.0,
        }
    }
}

#[derive(Debug)]
struct Bucket {
    tokens: f64,
    at: Instant,
}

#[derive(Debug, Default)]
struct Counters {
    connections: HashMap<String, usize>,
    buckets: HashMap<String, Bucket>,
}

/// Principals whose buckets are kept before idle ones are dropped: a full
/// bucket is the same as no bucket, so forgetting one costs nothing.
const MAX_TRACKED: usize = 100_000;

/// The live counters; cheap to clone.
#[derive(Debug, Clone)]
pub struct PrincipalLimits {
    config: Option<LimitsConfig>,
    counters: Arc<Mutex<Counters>>,
}

/// One open connection of a principal; dropping it frees the slot.
#[derive(Debug)]
pub struct ConnectionSlot {
    sub: Option<String>,
    counters: Arc<Mutex<Counters>>,
}

impl Drop for ConnectionSlot {
    fn drop(&mut self) {
        let Some(sub) = self.sub.take() else { return };
        let mut counters = self.counters.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(count) = counters.connections.get_mut(&sub) {
            *count = count.saturating_sub(1);
            if *count == 0 {
                counters.connections.remove(&sub);
            }
        }
    }
}

impl PrincipalLimits {
    /// Limits enforced with `config`; `None`: unlimited.
    pub fn new(config: Option<LimitsConfig>) -> Self {
        Self {
            config,
            counters: Arc::default(),
        }
    }

    /// Takes a connection slot for `sub`; `Err` with the limit when it has
    /// them all.
    pub fn connect(&self, sub: &str) -> Result<ConnectionSlot, usize> {
        let Some(config) = self.config else {
            return Ok(ConnectionSlot {
                sub: None,
                counters: self.counters.clone(),
            });
        };
        let mut counters = self.counters.lock().unwrap_or_else(|e| e.into_inner());
        let count = counters.connections.entry(sub.to_owned()).or_insert(0);
        if *count >= config.connections {
            return Err(config.connections);
        }
        *count += 1;
        Ok(ConnectionSlot {
            sub: Some(sub.to_owned()),
            counters: self.counters.clone(),
        })
    }

    /// Takes one dispatch from `sub`'s bucket; `Err` with how long until
    /// one is available.
    pub fn dispatch(&self, sub: &str) -> Result<(), Duration> {
        let Some(config) = self.config else {
            return Ok(());
        };
        let now = Instant::now();
        let mut counters = self.counters.lock().unwrap_or_else(|e| e.into_inner());
        if counters.buckets.len() >= MAX_TRACKED && !counters.buckets.contains_key(sub) {
            counters.buckets.retain(|_, b| {
                b.tokens + now.duration_since(b.at).as_secs_f64() * config.dispatch_rate
                    < config.dispatch_burst
            });
        }
        let bucket = counters.buckets.entry(sub.to_owned()).or_insert(Bucket {
            tokens: config.dispatch_burst,
            at: now,
        });
        let refill = now.duration_since(bucket.at).as_secs_f64() * config.dispatch_rate;
        bucket.tokens = (bucket.tokens + refill).min(config.dispatch_burst);
        bucket.at = now;
        if bucket.tokens >= 1.0 {
            bucket.tokens -= 1.0;
            Ok(())
        } else {
            let wait = (1.0 - bucket.tokens) / config.dispatch_rate.max(f64::MIN_POSITIVE);
            Err(Duration::from_secs_f64(wait.min(3_600.0)).max(Duration::from_millis(1)))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connections_are_counted_per_principal() {
        let limits = PrincipalLimits::new(Some(LimitsConfig {
            connections: 2,
            ..LimitsConfig::default()
        }));
        let a = limits.connect("a").unwrap();
        let _b = limits.connect("a").unwrap();
        assert_eq!(limits.connect("a").unwrap_err(), 2);
        assert!(limits.connect("other").is_ok());
        drop(a);
        assert!(limits.connect("a").is_ok());
    }

    #[test]
    fn a_burst_then_the_rate() {
        let limits = PrincipalLimits::new(Some(LimitsConfig {
            connections: 1,
            dispatch_rate: 10.0,
            dispatch_burst: 3.0,
        }));
        for _ in 0..3 {
            assert!(limits.dispatch("a").is_ok());
        }
        let wait = limits.dispatch("a").unwrap_err();
        assert!(wait <= Duration::from_millis(101), "{wait:?}");
        assert!(limits.dispatch("b").is_ok(), "buckets are per principal");
        assert!(PrincipalLimits::new(None).dispatch("a").is_ok());
    }
}
