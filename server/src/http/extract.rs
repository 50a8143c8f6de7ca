//! Extractors whose rejections are problem documents, so malformed JSON, a
//! bad query string or a bad path answer `application/problem+json` like
//! every other error.

use axum::body::Bytes;
use axum::extract::rejection::{BytesRejection, JsonRejection, PathRejection, QueryRejection};
use axum::extract::{FromRequest, FromRequestParts, Request};
use axum::http::{HeaderMap, StatusCode, header};
use serde::de::DeserializeOwned;
use serde_json::Value;

use super::error::ApiError;

/// A JSON request body that must be a JSON object, with problem+json
/// rejections.
///
/// serde happily reads a struct from a JSON array (`[null, null]` fills the
/// fields in order), so `axum::Json` alone would let `[]` create a session.
/// Every REST body Tether takes is an object, so anything else is refused
/// here, once, before the handler runs: 415 without a JSON content type, 400
/// for text that is not JSON, 422 for JSON that is not an object or does not
/// fit the request type (the message names the field).
#[derive(Debug)]
pub struct ApiJson<T>(pub T);

impl<T, S> FromRequest<S> for ApiJson<T>
where
    T: DeserializeOwned,
    S: Send + Sync,
{
    type Rejection = ApiError;

    async fn from_request(request: Request, state: &S) -> Result<Self, Self::Rejection> {
        // The content type is checked before the body is read, as axum does.
        require_json_content_type(request.headers())?;
        let bytes = Bytes::from_request(request, state).await?;
        decode_object(&bytes).map(ApiJson)
    }
}

/// Checks that `headers` declare a JSON body: `application/json` or
/// `application/<anything>+json`, with any parameters (the rule of
/// `axum::Json`). Otherwise 415.
pub fn require_json_content_type(headers: &HeaderMap) -> Result<(), ApiError> {
    let essence = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .map(|v| v.trim().to_ascii_lowercase());
    let json = essence.as_deref().is_some_and(|mime| {
        mime == "application/json"
            || mime
                .strip_prefix("application/")
                .is_some_and(|sub| sub.ends_with("+json") && !sub.contains('/'))
    });
    if json {
        Ok(())
    } else {
        Err(ApiError::new(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "unsupported_media_type",
            "The request body must be JSON, sent with Content-Type: application/json.",
        ))
    }
}

/// Decodes a request body that must be one JSON object into `T`: 400 when it
/// is not JSON, 422 when it is JSON but not an object, or an object that does
/// not fit `T` (serde's message, with the path of the offending field).
pub fn decode_object<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    let first = bytes
        .iter()
        .find(|b| !matches!(b, b' ' | b'\t' | b'\n' | b'\r'));
    if first == Some(&b'{') {
        return axum::Json::<T>::from_bytes(bytes)
            .map(|axum::Json(value)| value)
            .map_err(ApiError::from);
    }
    // Not an object: tell JSON that is something else from text that is not
    // JSON at all.
    match serde_json::from_slice::<Value>(bytes) {
        Err(e) => Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            "malformed_json",
            format!("The request body is not valid JSON: {e}."),
        )),
        Ok(value) => Err(ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "body_not_an_object",
            format!(
                "The request body must be a JSON object; got {}.",
                json_kind(&value)
            ),
        )),
    }
}

/// The JSON kind of `value`, with an article, for messages.
fn json_kind(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// `axum::extract::Query` with problem+json rejections.
#[derive(Debug, FromRequestParts)]
#[from_request(via(axum::extract::Query), rejection(ApiError))]
pub struct ApiQuery<T>(pub T);

/// `axum::extract::Path` with problem+json rejections.
#[derive(Debug, FromRequestParts)]
#[from_request(via(axum::extract::Path), rejection(ApiError))]
pub struct ApiPath<T>(pub T);

/// An integer query parameter from its text: 422 naming the parameter and its
/// range when it is not a decimal integer in `min..=max`.
///
/// Query integers are taken as text and checked here rather than typed as
/// `u64` in the query struct, so that `-1`, `1.5` or a number past `u64` get
/// the same answer as one past the range: a 422 that says what is allowed.
pub fn bounded_integer(
    name: &str,
    text: Option<&str>,
    min: u64,
    max: u64,
) -> Result<Option<u64>, ApiError> {
    let Some(text) = text else {
        return Ok(None);
    };
    match text.parse::<u64>() {
        Ok(n) if (min..=max).contains(&n) && text.bytes().all(|b| b.is_ascii_digit()) => {
            Ok(Some(n))
        }
        _ => Err(ApiError::invalid(format!(
            "{name} must be an integer from {min} to {max}; got {text:?}."
        ))),
    }
}

/// A query parameter that is a time (RFC 3339), as milliseconds since the
/// epoch; a 422 naming the parameter when it is not one.
pub fn timestamp(name: &str, text: Option<&str>) -> Result<Option<i64>, ApiError> {
    text.map(|t| {
        t.parse::<jiff::Timestamp>()
            .map(|t| t.as_millisecond())
            .map_err(|_| {
                ApiError::invalid(format!(
                    "{name} must be an RFC 3339 time such as 2026-12-03T10:00:00Z; got {t:?}."
                ))
            })
    })
    .transpose()
}

impl From<JsonRejection> for ApiError {
    fn from(rejection: JsonRejection) -> Self {
        let status = rejection.status();
        let code = match status {
            StatusCode::PAYLOAD_TOO_LARGE => "payload_too_large",
            StatusCode::UNSUPPORTED_MEDIA_TYPE => "unsupported_media_type",
            StatusCode::BAD_REQUEST => "malformed_json",
            _ => "invalid_body",
        };
        ApiError::new(status, code, rejection.body_text())
    }
}

impl From<BytesRejection> for ApiError {
    fn from(rejection: BytesRejection) -> Self {
        let status = rejection.status();
        let code = match status {
            StatusCode::PAYLOAD_TOO_LARGE => "payload_too_large",
            _ => "unreadable_body",
        };
        ApiError::new(status, code, rejection.body_text())
    }
}

impl From<QueryRejection> for ApiError {
    fn from(rejection: QueryRejection) -> Self {
        ApiError::new(
            StatusCode::BAD_REQUEST,
            "invalid_query",
            rejection.body_text(),
        )
    }
}

impl From<PathRejection> for ApiError {
    fn from(rejection: PathRejection) -> Self {
        ApiError::new(
            StatusCode::BAD_REQUEST,
            "invalid_path",
            rejection.body_text(),
        )
    }
}

/// REST handlers take the caller as an extractor: the loopback admin with
/// authentication off, the token's principal with it on (else 401).
impl<S> FromRequestParts<S> for crate::auth::Principal
where
    crate::AppState: axum::extract::FromRef<S>,
    S: Send + Sync,
{
    type Rejection = ApiError;

    async fn from_request_parts(
        parts: &mut axum::http::request::Parts,
        state: &S,
    ) -> Result<Self, Self::Rejection> {
        let state = <crate::AppState as axum::extract::FromRef<S>>::from_ref(state);
        let token = crate::auth::credentials::bearer(&parts.headers);
        Ok(state.auth.authenticate(token, "rest")?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_objects_decode() {
        #[derive(Debug, serde::Deserialize)]
        #[allow(dead_code)]
        struct Two {
            a: Option<u32>,
            b: Option<u32>,
        }
        for (body, status) in [
            ("[null, null]", 422),
            ("[]", 422),
            ("null", 422),
            ("\"x\"", 422),
            ("7", 422),
            ("[1", 400),
            ("", 400),
            ("{\"a\": \"x\"}", 422),
        ] {
            let err = decode_object::<Two>(body.as_bytes()).unwrap_err();
            let ApiError::Problem { status: got, .. } = err else {
                panic!("{body}: not a problem");
            };
            assert_eq!(got.as_u16(), status, "{body}");
        }
        assert!(decode_object::<Two>(b" {\"a\": 1}").is_ok());
    }

    #[test]
    fn content_types() {
        let with = |v: &str| {
            let mut h = HeaderMap::new();
            h.insert(header::CONTENT_TYPE, v.parse().unwrap());
            require_json_content_type(&h).is_ok()
        };
        assert!(with("application/json"));
        assert!(with("Application/JSON; charset=utf-8"));
        assert!(with("application/merge-patch+json"));
        assert!(!with("text/json"));
        assert!(!with("application/jsonx"));
        assert!(require_json_content_type(&HeaderMap::new()).is_err());
    }

    #[test]
    fn bounded_integers_name_their_range() {
        assert_eq!(bounded_integer("limit", None, 1, 10).unwrap(), None);
        assert_eq!(
            bounded_integer("limit", Some("10"), 1, 10).unwrap(),
            Some(10)
        );
        for bad in ["0", "11", "-1", "+1", "1.5", "", "99999999999999999999999"] {
            let err = bounded_integer("limit", Some(bad), 1, 10).unwrap_err();
            assert!(
                err.to_string()
                    .contains("limit must be an integer from 1 to 10"),
                "{err}"
            );
        }
    }
}
