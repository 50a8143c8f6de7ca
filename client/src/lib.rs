//! A Rust client for Tether's REST API.
//!
//! ```no_run
//! # async fn demo() -> Result<(), tether_client::Error> {
//! let client = tether_client::Client::new("http://127.0.0.1:7878")?;
//! let ready = client.readiness().await?;
//! println!("{} at serverSeq {}", ready.backend, ready.server_seq);
//! # Ok(()) }
//! ```

use reqwest::StatusCode;
use serde::de::DeserializeOwned;
use tether_protocol::rest::{Health, Problem, Readiness};

/// What can go wrong talking to a Tether server.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The base URL is not a valid URL.
    #[error("invalid server URL {url:?}: {reason}")]
    InvalidUrl {
        /// The URL given.
        url: String,
        /// Why it was refused.
        reason: String,
    },
    /// The server could not be reached or the connection broke.
    #[error("cannot reach the server: {0}")]
    Unreachable(#[source] reqwest::Error),
    /// The server answered with a problem document.
    #[error("{status}: {code}{}", detail.as_deref().map(|d| format!(": {d}")).unwrap_or_default())]
    Api {
        /// HTTP status.
        status: u16,
        /// The problem's stable machine-readable code.
        code: String,
        /// The problem's detail, if any.
        detail: Option<String>,
    },
    /// The server answered with something that is not the expected JSON.
    #[error("unexpected response ({status}): {reason}")]
    Decode {
        /// HTTP status.
        status: u16,
        /// What was wrong with it.
        reason: String,
    },
}

/// A client for one Tether server.
#[derive(Debug, Clone)]
pub struct Client {
    base: reqwest::Url,
    http: reqwest::Client,
}

impl Client {
    /// A client for the server at `base_url` (for example `http://127.0.0.1:7878`).
    pub fn new(base_url: &str) -> Result<Self, Error> {
        let base = reqwest::Url::parse(base_url).map_err(|e| Error::InvalidUrl {
            url: base_url.to_owned(),
            reason: e.to_string(),
        })?;
        if base.cannot_be_a_base() || !matches!(base.scheme(), "http" | "https") {
            return Err(Error::InvalidUrl {
                url: base_url.to_owned(),
                reason: "expected an http:// or https:// URL".to_owned(),
            });
        }
        Ok(Self {
            base,
            http: reqwest::Client::new(),
        })
    }

    /// `GET /healthz`.
    pub async fn health(&self) -> Result<Health, Error> {
        self.get("healthz").await
    }

    /// `GET /readyz`.
    pub async fn readiness(&self) -> Result<Readiness, Error> {
        self.get("readyz").await
    }

    async fn get<T: DeserializeOwned>(&self, path: &str) -> Result<T, Error> {
        let url = self.base.join(path).map_err(|e| Error::InvalidUrl {
            url: path.to_owned(),
            reason: e.to_string(),
        })?;
        let response = self
            .http
            .get(url)
            .send()
            .await
            .map_err(Error::Unreachable)?;
        decode(response).await
    }
}

async fn decode<T: DeserializeOwned>(response: reqwest::Response) -> Result<T, Error> {
    let status = response.status();
    let bytes = response.bytes().await.map_err(Error::Unreachable)?;
    if status.is_success() {
        return serde_json::from_slice(&bytes).map_err(|e| Error::Decode {
            status: status.as_u16(),
            reason: e.to_string(),
        });
    }
    match serde_json::from_slice::<Problem>(&bytes) {
        Ok(problem) => Err(Error::Api {
            status: problem.status,
            code: problem.code,
            detail: problem.detail,
        }),
        Err(_) => Err(Error::Api {
            status: status.as_u16(),
            code: code_for(status).to_owned(),
            detail: Some(String::from_utf8_lossy(&bytes).into_owned()),
        }),
    }
}

/// A code for error answers that carried no problem document.
fn code_for(status: StatusCode) -> &'static str {
    match status {
        StatusCode::PAYLOAD_TOO_LARGE => "payload_too_large",
        StatusCode::NOT_FOUND => "not_found",
        _ => "http_error",
    }
}
