//! The few REST calls the load tool makes (plain reqwest: the tool must not
//! depend on the SDK it may one day measure).

use std::time::{Duration, Instant};

use serde::Deserialize;
use serde_json::{Value, json};

use crate::error::{Error, Result};

/// A REST client for one server.
#[derive(Debug, Clone)]
pub struct Rest {
    client: reqwest::Client,
    base: String,
}

/// `GET /readyz`.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Ready {
    /// `sqlite` or `postgres`.
    pub backend: String,
    /// The highest `serverSeq` committed.
    pub server_seq: u64,
}

impl Rest {
    /// A client keeping up to `pool` idle connections to `base`.
    pub fn new(base: &str, pool: usize) -> Result<Self> {
        let client = reqwest::Client::builder()
            .pool_max_idle_per_host(pool)
            .tcp_nodelay(true)
            .timeout(Duration::from_secs(60))
            .build()?;
        Ok(Self {
            client,
            base: base.trim_end_matches('/').to_owned(),
        })
    }

    /// The server's readiness: backend and last `serverSeq`.
    pub async fn ready(&self) -> Result<Ready> {
        let response = self
            .client
            .get(format!("{}/readyz", self.base))
            .send()
            .await
            .map_err(|e| {
                Error::msg(format!(
                    "cannot reach {}/readyz (is the server running? pass --http if REST is \
                     elsewhere): {e}",
                    self.base
                ))
            })?;
        Ok(response.error_for_status()?.json().await?)
    }

    /// `GET /healthz`: whether a server without `/readyz` (the reference
    /// peer) is up.
    pub async fn healthy(&self) -> Result<()> {
        let url = format!("{}/healthz", self.base);
        let response = self.client.get(&url).send().await.map_err(|e| {
            Error::msg(format!(
                "cannot reach {url} (is the peer running? pass --http if it is elsewhere): {e}"
            ))
        })?;
        response.error_for_status()?;
        Ok(())
    }

    /// `POST /v1/sessions` in project `bench`.
    pub async fn create_session(&self, id: &str) -> Result<()> {
        let response = self
            .client
            .post(format!("{}/v1/sessions", self.base))
            .json(&json!({"id": id, "project": "bench", "provider": "echo"}))
            .send()
            .await?;
        if !response.status().is_success() {
            let status = response.status();
            let body = response.text().await.unwrap_or_default();
            return Err(Error::msg(format!(
                "POST /v1/sessions {id}: {status}: {body}"
            )));
        }
        Ok(())
    }

    /// `GET path` (with query): the parsed body and the time to its last
    /// byte (parsing is not timed).
    pub async fn timed_get(&self, path_and_query: &str) -> Result<(Value, Duration)> {
        let started = Instant::now();
        let response = self
            .client
            .get(format!("{}{path_and_query}", self.base))
            .send()
            .await?;
        let status = response.status();
        let body = response.bytes().await?;
        let elapsed = started.elapsed();
        if !status.is_success() {
            return Err(Error::msg(format!(
                "GET {path_and_query}: {status}: {}",
                String::from_utf8_lossy(&body)
            )));
        }
        Ok((serde_json::from_slice(&body)?, elapsed))
    }
}
