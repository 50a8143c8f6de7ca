//! The load tool's one error type.

/// Why a scenario could not run (a failed check is not an error: it is
/// reported with the figures).
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Anything with a sentence of its own.
    #[error("{0}")]
    Msg(String),
    /// The operating system refused something (files, sockets).
    #[error(transparent)]
    Io(#[from] std::io::Error),
    /// The WebSocket failed.
    #[error("websocket: {0}")]
    Ws(#[from] tokio_tungstenite::tungstenite::Error),
    /// JSON that could not be read or written.
    #[error("json: {0}")]
    Json(#[from] serde_json::Error),
    /// A REST call failed.
    #[error("http: {0}")]
    Http(#[from] reqwest::Error),
    /// The upstream AHP client failed.
    #[error("ahp client: {0}")]
    Ahp(#[from] ahp::ClientError),
}

impl Error {
    /// An error from a sentence.
    pub fn msg(text: impl Into<String>) -> Self {
        Self::Msg(text.into())
    }
}

/// The load tool's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;
