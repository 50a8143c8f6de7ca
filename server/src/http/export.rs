//! A session's transcript taken out: JSON Lines (every envelope, as the
//! transcript endpoint gives them, streamed page by page) or Markdown (the
//! conversation as a person reads it).

use std::sync::Arc;

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use futures_util::{Stream, StreamExt};
use serde::Deserialize;
use tether_protocol::export::Markdown;
use tether_protocol::rest::Problem;
use utoipa::IntoParams;

use super::error::ApiError;
use super::extract::{ApiPath, ApiQuery};
use super::sessions::{SessionPath, visible};
use crate::AppState;
use crate::auth::Principal;
use crate::engine::fanout::{envelope_json, envelope_text};
use crate::store::{Store, StoreError, StoredEnvelope};

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

/// A session's envelopes page by page, oldest first: its transcript's, and
/// with `work` its changesets' and terminals' too; it ends after the
/// first short page or a store failure.
fn pages(
    store: Arc<dyn Store>,
    id: String,
    work: bool,
) -> impl Stream<Item = Result<Vec<StoredEnvelope>, StoreError>> {
    futures_util::stream::unfold(Some(0u64), move |after| {
        let (store, id) = (store.clone(), id.clone());
        async move {
            let page = if work {
                store.session_log(&id, after?, PAGE).await
            } else {
                store.transcript(&id, after?, PAGE).await
            };
            match page {
                Ok(page) => {
                    let next = (page.len() == PAGE as usize)
                        .then(|| page.last().map(|e| e.seq))
                        .flatten();
                    Some((Ok(page), next))
                }
                Err(err) => Some((Err(err), None)),
            }
        }
    })
}

/// What a session is exported as.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Format {
    Jsonl,
    Markdown,
}

/// A session taken out, for download: as JSON Lines, every envelope of it
/// (its transcript's, and its changesets' and terminals'); as Markdown,
/// its conversation.
#[utoipa::path(
    get,
    path = "/v1/sessions/{id}/export",
    tag = "sessions",
    params(SessionPath, ExportQuery),
    responses(
        (status = 200, description = "JSON Lines (`application/jsonl`: every envelope of the session, its chats, changesets and terminals, oldest first) or Markdown (`text/markdown`).",
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
    let view = visible(&state, &caller, &path.id).await?;
    let id = path.id;
    let disposition = |extension: &str| {
        HeaderValue::from_str(&format!("attachment; filename=\"{id}.{extension}\""))
            .unwrap_or_else(|_| HeaderValue::from_static("attachment"))
    };
    // Markdown is the conversation; JSON Lines every envelope, the file
    // edits' changesets and the terminals' output with it.
    let pages = pages(state.store.clone(), id.clone(), format == Format::Jsonl);
    if format == Format::Markdown {
        // Streamed too: each turn is sent once it is settled and a later
        // one has begun, so what is held is a page and the open turns.
        let markdown = Markdown::titled(&id, view.title.as_deref());
        let start = Some((Box::pin(pages), markdown));
        let named = disposition("md");
        let chunks = futures_util::stream::unfold(start, move |state| {
            let id = id.clone();
            async move {
                let (mut pages, mut markdown) = state?;
                match pages.next().await {
                    Some(Ok(page)) => {
                        for envelope in &page {
                            markdown.envelope(&envelope_json(envelope));
                        }
                        Some((Ok(Bytes::from(markdown.take())), Some((pages, markdown))))
                    }
                    Some(Err(err)) => Some((Err(cut_short(&id, &err)), None)),
                    None => Some((Ok(Bytes::from(markdown.finish())), None)),
                }
            }
        });
        return Ok((
            [
                (
                    header::CONTENT_TYPE,
                    HeaderValue::from_static("text/markdown; charset=utf-8"),
                ),
                (header::CONTENT_DISPOSITION, named),
            ],
            Body::from_stream(chunks),
        )
            .into_response());
    }
    // Streamed: memory stays one page whatever the session's length, and
    // each stored action is spliced in as written (never parsed again). A
    // store failure mid-way ends the body early (the client sees a cut
    // download, not a complete-looking one).
    let jsonl = disposition("jsonl");
    let lines = pages.map(move |page| match page {
        Ok(page) => {
            let mut lines = String::new();
            for e in &page {
                lines.push_str(&envelope_text(
                    e.seq,
                    &e.channel,
                    &e.action,
                    e.origin.as_ref(),
                    None,
                ));
                lines.push('\n');
            }
            Ok(Bytes::from(lines))
        }
        Err(err) => Err(cut_short(&id, &err)),
    });
    Ok((
        [
            (
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/jsonl"),
            ),
            (header::CONTENT_DISPOSITION, jsonl),
        ],
        Body::from_stream(lines),
    )
        .into_response())
}

/// A store failure mid-way through an export: logged, and the body ends
/// early (the client sees a cut download, not a complete-looking one).
fn cut_short(session: &str, err: &StoreError) -> std::io::Error {
    tracing::warn!(session, error = %err, "export cut short: the store failed");
    std::io::Error::other(err.to_string())
}
