//! A session's transcript taken out: JSON Lines (every envelope, as the
//! transcript endpoint gives them, streamed page by page) or Markdown (the
//! conversation as a person reads it).

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use tether_protocol::export::Markdown;
use tether_protocol::rest::Problem;
use utoipa::IntoParams;

use super::error::ApiError;
use super::extract::{ApiPath, ApiQuery};
use super::sessions::{SessionPath, visible};
use crate::AppState;
use crate::auth::Principal;
use crate::engine::fanout::envelope_json;

/// Envelopes read from the store at a time.
const PAGE: u32 = 1000;

/// Query of the export endpoint.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct ExportQuery {
    /// `jsonl` (the default: one AHP `ActionEnvelope` per line, oldest
    /// first) or `markdown` (the conversation as a person reads it).
    #[param(value_type = Option<String>, pattern = "^(jsonl|markdown)$")]
    format: Option<String>,
}

/// What a session is exported as.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Format {
    Jsonl,
    Markdown,
}

/// A session's whole transcript (the session and its chats), as JSON Lines
/// or Markdown, for download.
#[utoipa::path(
    get,
    path = "/v1/sessions/{id}/export",
    tag = "sessions",
    params(SessionPath, ExportQuery),
    responses(
        (status = 200, description = "JSON Lines (`application/jsonl`: every envelope, oldest first) or Markdown (`text/markdown`).",
         content((String = "application/jsonl"), (String = "text/markdown"))),
        (status = 400, description = "Malformed query or path, or an unknown format.", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such session.", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "An invalid id (the rule is named).", body = Problem, content_type = "application/problem+json"),
    )
)]
pub async fn export(
    State(state): State<AppState>,
    caller: Principal,
    ApiPath(path): ApiPath<SessionPath>,
    ApiQuery(query): ApiQuery<ExportQuery>,
) -> Result<Response, ApiError> {
    let format = match query.format.as_deref() {
        None | Some("jsonl") => Format::Jsonl,
        Some("markdown") => Format::Markdown,
        Some(other) => {
            return Err(ApiError::new(
                StatusCode::BAD_REQUEST,
                "invalid_query",
                format!("format must be jsonl or markdown, not {other:?}."),
            ));
        }
    };
    visible(&state, &caller, &path.id).await?;
    let id = path.id;
    let disposition = |extension: &str| {
        HeaderValue::from_str(&format!("attachment; filename=\"{id}.{extension}\""))
            .unwrap_or_else(|_| HeaderValue::from_static("attachment"))
    };
    if format == Format::Markdown {
        let mut markdown = Markdown::new(&id);
        let mut after = 0;
        loop {
            let page = state.store.transcript(&id, after, PAGE).await?;
            for envelope in &page {
                markdown.envelope(&envelope_json(envelope));
            }
            match page.last() {
                Some(last) if page.len() == PAGE as usize => after = last.seq,
                _ => break,
            }
        }
        return Ok((
            [
                (
                    header::CONTENT_TYPE,
                    HeaderValue::from_static("text/markdown; charset=utf-8"),
                ),
                (header::CONTENT_DISPOSITION, disposition("md")),
            ],
            markdown.finish(),
        )
            .into_response());
    }
    // Streamed: memory stays one page whatever the session's length. A
    // store failure mid-way ends the body early (the client sees a cut
    // download, not a complete-looking one).
    let store = state.store.clone();
    let pages = futures_util::stream::unfold((Some(0u64), id.clone()), move |(after, id)| {
        let store = store.clone();
        async move {
            let after = after?;
            match store.transcript(&id, after, PAGE).await {
                Ok(page) => {
                    let next = (page.len() == PAGE as usize)
                        .then(|| page.last().map(|e| e.seq))
                        .flatten();
                    let mut lines = String::new();
                    for envelope in &page {
                        lines.push_str(&envelope_json(envelope).to_string());
                        lines.push('\n');
                    }
                    Some((Ok::<_, std::io::Error>(Bytes::from(lines)), (next, id)))
                }
                Err(err) => {
                    tracing::warn!(session = %id, error = %err, "export cut short: the store failed");
                    Some((Err(std::io::Error::other(err.to_string())), (None, id)))
                }
            }
        }
    });
    Ok((
        [
            (
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/jsonl"),
            ),
            (header::CONTENT_DISPOSITION, disposition("jsonl")),
        ],
        Body::from_stream(pages),
    )
        .into_response())
}
