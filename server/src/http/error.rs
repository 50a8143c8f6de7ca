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
    /// Any 4xx (and 503 for unavailable backends): its status, a stable code
    /// and a detail a person can act on.
    /// 429: the caller is over a per-principal bound; `Retry-After` says
    /// when to try again.
    #[error("too many requests: {detail}")]
    TooMany {
        /// Whole seconds until a retry can pass (at least 1).
        retry_after_secs: u64,
        /// What was exceeded.
        detail: String,
    },
    #[error("{code}: {detail}")]
    Problem {
        /// HTTP status.
        status: StatusCode,
        /// Stable machine-readable code.
        code: &'static str,
        /// What went wrong.
        detail: String,
    },
}

impl ApiError {
    /// A problem with this status, code and detail.
    pub fn new(status: StatusCode, code: &'static str, detail: impl Into<String>) -> Self {
        ApiError::Problem {
            status,
            code,
            detail: detail.into(),
        }
    }

    /// 404 `not_found`.
    pub fn not_found(detail: impl Into<String>) -> Self {
        Self::new(StatusCode::NOT_FOUND, "not_found", detail)
    }

    /// 422 `invalid`.
    pub fn invalid(detail: impl Into<String>) -> Self {
        Self::new(StatusCode::UNPROCESSABLE_ENTITY, "invalid", detail)
    }
}

impl From<crate::engine::EngineError> for ApiError {
    fn from(err: crate::engine::EngineError) -> Self {
        use crate::engine::EngineError as E;
        let detail = err.to_string();
        match err {
            E::NotFound(_) => Self::not_found(detail),
            E::AlreadyExists(_) => Self::new(StatusCode::CONFLICT, "already_exists", detail),
            E::Conflict(_) => Self::new(StatusCode::CONFLICT, "conflict", detail),
            E::InvalidParams(_) => Self::invalid(detail),
            E::ProviderNotFound(_) => {
                Self::new(StatusCode::UNPROCESSABLE_ENTITY, "unknown_provider", detail)
            }
            E::Forbidden(_) => Self::new(StatusCode::FORBIDDEN, "forbidden", detail),
            E::Unavailable(_) => Self::new(StatusCode::SERVICE_UNAVAILABLE, "unavailable", detail),
        }
    }
}

impl From<crate::auth::AuthError> for ApiError {
    fn from(err: crate::auth::AuthError) -> Self {
        use crate::auth::AuthError as E;
        let detail = err.to_string();
        match err {
            E::Unauthorized => Self::new(StatusCode::UNAUTHORIZED, "unauthorized", detail),
            E::Forbidden(_) => Self::new(StatusCode::FORBIDDEN, "forbidden", detail),
        }
    }
}

impl From<tether_protocol::NameError> for ApiError {
    fn from(err: tether_protocol::NameError) -> Self {
        Self::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_name",
            err.to_string(),
        )
    }
}

impl From<StoreError> for ApiError {
    fn from(err: StoreError) -> Self {
        match err {
            StoreError::Database(_) | StoreError::Sqlite(_) | StoreError::Open { .. } => {
                ApiError::StoreUnavailable(err)
            }
            StoreError::Corrupt(_) | StoreError::UnsupportedUrl(_) => ApiError::Internal(err),
        }
    }
}

impl ApiError {
    fn parts(&self) -> (StatusCode, &'static str, &str) {
        match self {
            ApiError::Problem {
                status,
                code,
                detail,
            } => (*status, code, detail.as_str()),
            ApiError::TooMany { detail, .. } => (
                StatusCode::TOO_MANY_REQUESTS,
                "too_many_requests",
                detail.as_str(),
            ),
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
        if status.is_server_error() {
            // 5xx bodies stay generic; the cause is logged here, once.
            tracing::error!(error = %self, cause = ?std::error::Error::source(&self), code, "request failed");
        }
        let mut response = problem(status, code, Some(detail.to_owned()));
        if status == StatusCode::UNAUTHORIZED {
            response.headers_mut().insert(
                header::WWW_AUTHENTICATE,
                HeaderValue::from_static("Bearer realm=\"tether\""),
            );
        }
        if let ApiError::TooMany {
            retry_after_secs, ..
        } = &self
        {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(*retry_after_secs));
        }
        response
    }
}
