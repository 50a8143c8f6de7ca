//! The HTTP layer's error type: the only place errors become responses.

use axum::Json;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use tether_protocol::rest::Problem;

use crate::store::StoreError;

/// The media type of RFC 9457 problem documents.
pub const PROBLEM_JSON: &str = "application/problem+json";

/// An error answered as `application/problem+json`.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// 503: the store cannot be reached. The detail goes to the log only.
    #[error("store unavailable")]
    StoreUnavailable(#[source] StoreError),
    /// 500: anything unexpected. The detail goes to the log only.
    #[error("internal error")]
    Internal(#[source] StoreError),
}

impl From<StoreError> for ApiError {
    fn from(err: StoreError) -> Self {
        match err {
            StoreError::Database(_) | StoreError::Open { .. } => ApiError::StoreUnavailable(err),
            StoreError::Corrupt(_) | StoreError::UnsupportedUrl(_) => ApiError::Internal(err),
        }
    }
}

impl ApiError {
    fn parts(&self) -> (StatusCode, &'static str, &'static str) {
        match self {
            ApiError::StoreUnavailable(_) => (
                StatusCode::SERVICE_UNAVAILABLE,
                "store_unavailable",
                "The store could not be reached; try again shortly.",
            ),
            ApiError::Internal(_) => (
                StatusCode::INTERNAL_SERVER_ERROR,
                "internal",
                "The server failed to handle the request; the details are in its log.",
            ),
        }
    }
}

/// Builds a problem response.
pub fn problem(status: StatusCode, code: &str, detail: Option<String>) -> Response {
    let body = Problem {
        kind: "about:blank".to_owned(),
        title: status.canonical_reason().unwrap_or("Error").to_owned(),
        status: status.as_u16(),
        code: code.to_owned(),
        detail,
    };
    let mut response = (status, Json(body)).into_response();
    response
        .headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(PROBLEM_JSON));
    response
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let (status, code, detail) = self.parts();
        // 5xx bodies stay generic; the cause is logged here, once.
        tracing::error!(error = %self, cause = ?std::error::Error::source(&self), code, "request failed");
        problem(status, code, Some(detail.to_owned()))
    }
}
