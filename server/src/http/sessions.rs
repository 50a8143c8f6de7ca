//! `/v1/sessions`: projections, transcripts, dispatch, resume, tool context.

use agent_client_protocol::v1::schema::{ResumeSessionRequest, ResumeSessionResponse};
use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use serde::Deserialize;
use serde_json::Value;
use tether_protocol::channel::Channel;
use tether_protocol::rest::{
    CreateSessionRequest, DispatchRequest, DispatchResponse, Problem, SessionPage, TranscriptPage,
};
use tether_protocol::toolctx::ToolCallContext;
use tether_protocol::validate_name;
use tether_protocol::view::SessionView;
use tether_protocol::workdir::{
    canonical_file_uri, file_uri_path, is_absolute_path, path_to_file_uri,
};
use utoipa::IntoParams;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::error::ApiError;
use super::extract::{ApiJson, ApiPath, ApiQuery, bounded_integer};
use crate::AppState;
use crate::auth::Principal;
use crate::engine::fanout::envelope_json;
use crate::engine::{CreateSession, DispatchOutcome, Refusal, RefusalKind};
use crate::store::{Origin, SessionFilter, SessionRow};

/// Largest page a caller may ask for.
const MAX_PAGE: u32 = 1_000;
/// Page size when the caller names none.
const DEFAULT_PAGE: u32 = 50;
/// Longest REST `clientId`, in characters: an idempotency key, not a
/// document; the bound keeps the origin index small.
const MAX_CLIENT_ID_CHARS: usize = 256;

/// The routes of this module.
pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(list_sessions, create_session))
        .routes(routes!(get_session, delete_session))
        .routes(routes!(transcript))
        .routes(routes!(dispatch))
        .routes(routes!(resume))
        .routes(routes!(tool_context))
        .routes(routes!(attachment))
        .routes(routes!(super::export::export))
}

/// A session's read-model row as a view, with the row's seq and time.
fn view_of(row: &SessionRow) -> Result<SessionView, ApiError> {
    Ok(row.view()?)
}

/// The visible read-model row of a session, or 404.
pub(super) async fn visible(
    state: &AppState,
    caller: &Principal,
    id: &str,
) -> Result<SessionView, ApiError> {
    validate_name("session id", id)?;
    let row = state.store.session(id).await?;
    let view = row.as_ref().map(view_of).transpose()?;
    view.filter(|v| caller.can_see(&v.project))
        .ok_or_else(|| ApiError::not_found(format!("Session {id} does not exist.")))
}

/// The page size a caller asked for (`limit`), 1 to [`MAX_PAGE`].
fn page_limit(limit: Option<&str>) -> Result<u32, ApiError> {
    let limit = bounded_integer("limit", limit, 1, u64::from(MAX_PAGE))?;
    // In range, so it fits.
    Ok(limit.map_or(DEFAULT_PAGE, |n| n as u32))
}

/// The longest cursor: 19 digits always fit a `u64`.
const MAX_CURSOR_LEN: usize = 19;

/// Query of `GET /v1/sessions`.
///
/// Integers are read as text and checked by [`bounded_integer`], so a bad
/// one is a 422 naming its range; the `param` attributes state the same
/// bounds in the OpenAPI document.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct ListQuery {
    /// Only this project's sessions.
    #[param(min_length = 1, max_length = 128, pattern = "^[A-Za-z0-9._:-]{1,128}$")]
    project: Option<String>,
    /// Only sessions in this state.
    #[param(value_type = Option<tether_protocol::projection::SessionLifeState>)]
    state: Option<String>,
    /// Page size, 1 to 1000 (default 50).
    #[param(value_type = Option<u32>, minimum = 1, maximum = 1000)]
    limit: Option<String>,
    /// The `nextCursor` of the previous page (decimal digits).
    #[param(min_length = 1, max_length = 19, pattern = "^[0-9]{1,19}$")]
    cursor: Option<String>,
}

/// Lists sessions, most recently updated first, from the read model's index.
#[utoipa::path(
    get,
    path = "/v1/sessions",
    tag = "sessions",
    params(ListQuery),
    responses(
        (status = 200, description = "A page of sessions.", body = SessionPage),
        (status = 400, description = "Malformed query.", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "A parameter breaks a rule.", body = Problem, content_type = "application/problem+json"),
    )
)]
pub async fn list_sessions(
    State(state): State<AppState>,
    caller: Principal,
    ApiQuery(query): ApiQuery<ListQuery>,
) -> Result<Json<SessionPage>, ApiError> {
    if let Some(project) = &query.project {
        validate_name("project", project)?;
    }
    if let Some(s) = &query.state
        && !matches!(s.as_str(), "live" | "dormant" | "closed" | "ended")
    {
        return Err(ApiError::invalid(format!(
            "state must be one of live, dormant, closed, ended; got {s:?}."
        )));
    }
    let before = match &query.cursor {
        None => None,
        Some(c) => Some(
            c.parse::<u64>()
                .ok()
                .filter(|_| {
                    (1..=MAX_CURSOR_LEN).contains(&c.len()) && c.bytes().all(|b| b.is_ascii_digit())
                })
                .ok_or_else(|| {
                    ApiError::invalid(
                        "cursor is not one this server issued (1 to 19 digits); \
                         pass nextCursor back as is.",
                    )
                })?,
        ),
    };
    // Only the caller's projects: another project's sessions are absent.
    let filter = SessionFilter {
        project: query.project.clone(),
        state: query.state.clone(),
        projects: caller.project_scope(),
    };
    let page = state
        .store
        .sessions(&filter, before, page_limit(query.limit.as_deref())?)
        .await?;
    let items = page
        .items
        .iter()
        .map(view_of)
        .collect::<Result<Vec<_>, _>>()?
        .into_iter()
        .collect();
    Ok(Json(SessionPage {
        items,
        next_cursor: page.next_before.map(|n| n.to_string()),
    }))
}

/// Draws on `caller`'s dispatch rate: every dispatch, and every request
/// that commits or makes or stops what will (a session, its disposal, a
/// saved working context, a resume), counts against it.
pub(super) fn charge(state: &AppState, caller: &Principal) -> Result<(), ApiError> {
    state
        .auth
        .limits
        .dispatch(&caller.sub)
        .map_err(|wait| ApiError::TooMany {
            retry_after_secs: wait.as_secs().max(1),
            detail: format!(
                "Over this principal's dispatch rate; retry in {} ms.",
                wait.as_millis().max(1)
            ),
        })
}

/// Creates a session (with its default chat) and answers its summary.
#[utoipa::path(
    post,
    path = "/v1/sessions",
    tag = "sessions",
    request_body = CreateSessionRequest,
    responses(
        (status = 400, description = "Malformed JSON or path.", body = Problem, content_type = "application/problem+json"),
        (status = 415, description = "The body is not application/json.", body = Problem, content_type = "application/problem+json"),
        (status = 201, description = "Created.", body = SessionView),
        (status = 409, description = "The id is taken.", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "Invalid name, directory or provider.", body = Problem, content_type = "application/problem+json"),
    )
)]
pub async fn create_session(
    State(state): State<AppState>,
    caller: Principal,
    ApiJson(request): ApiJson<CreateSessionRequest>,
) -> Result<(StatusCode, Json<SessionView>), ApiError> {
    let mut directories = Vec::new();
    for dir in &request.working_directories {
        let uri = if dir.starts_with("file:") {
            canonical_file_uri(dir)
        } else {
            path_to_file_uri(dir)
        };
        directories.push(uri.map_err(|e| ApiError::invalid(format!("{e}.")))?);
    }
    let create = CreateSession {
        id: request
            .id
            .clone()
            .unwrap_or_else(|| uuid::Uuid::new_v4().to_string()),
        project: request
            .project
            .clone()
            .unwrap_or_else(|| "default".to_owned()),
        provider: request.provider.clone(),
        working_directories: directories,
        title: request.title.clone(),
        config: request.config.clone(),
        active_client: None,
    };
    validate_name("session id", &create.id)?;
    validate_name("project", &create.project)?;
    charge(&state, &caller)?;
    let view = state.engine.create_session(&caller, create).await?;
    Ok((StatusCode::CREATED, Json(view)))
}

/// The path parameter naming a session.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Path)]
pub struct SessionPath {
    /// Session id.
    #[param(min_length = 1, max_length = 128, pattern = "^[A-Za-z0-9._:-]{1,128}$")]
    pub(super) id: String,
}

/// A session's projection.
#[utoipa::path(
    get,
    path = "/v1/sessions/{id}",
    tag = "sessions",
    params(SessionPath),
    responses(
        (status = 400, description = "Malformed path.", body = Problem, content_type = "application/problem+json"),
        (status = 200, description = "The session.", body = SessionView),
        (status = 404, description = "No such session.", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "Invalid id.", body = Problem, content_type = "application/problem+json"),
    )
)]
pub async fn get_session(
    State(state): State<AppState>,
    caller: Principal,
    ApiPath(path): ApiPath<SessionPath>,
) -> Result<Json<SessionView>, ApiError> {
    Ok(Json(visible(&state, &caller, &path.id).await?))
}

/// Puts a session away: settles it `closed` when it can be resumed, else
/// `ended`. Nothing is erased: the session stays readable (`GET` answers it
/// in its settled state, its transcript is kept), it stays in listings, and
/// deleting an `ended` session again answers 409.
#[utoipa::path(
    delete,
    path = "/v1/sessions/{id}",
    tag = "sessions",
    params(SessionPath),
    responses(
        (status = 400, description = "Malformed path.", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "An invalid id or name (the rule is named).", body = Problem, content_type = "application/problem+json"),
        (status = 200, description = "Settled.", body = SessionView),
        (status = 404, description = "No such session.", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "Already ended.", body = Problem, content_type = "application/problem+json"),
    )
)]
pub async fn delete_session(
    State(state): State<AppState>,
    caller: Principal,
    ApiPath(path): ApiPath<SessionPath>,
) -> Result<Json<SessionView>, ApiError> {
    visible(&state, &caller, &path.id).await?;
    charge(&state, &caller)?;
    Ok(Json(state.engine.dispose_session(&caller, &path.id).await?))
}

/// Query of the transcript endpoint (integers as text: see [`ListQuery`]).
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct TranscriptQuery {
    /// Only envelopes with a greater `serverSeq`, 0 to 2^63−1 (default 0).
    #[param(value_type = Option<u64>, minimum = 0, maximum = 9223372036854775807_i64)]
    after: Option<String>,
    /// Page size, 1 to 1000 (default 50).
    #[param(value_type = Option<u32>, minimum = 1, maximum = 1000)]
    limit: Option<String>,
}

/// A page of a session's transcript (the session and its chats), oldest first.
#[utoipa::path(
    get,
    path = "/v1/sessions/{id}/transcript",
    tag = "sessions",
    params(SessionPath, TranscriptQuery),
    responses(
        (status = 400, description = "Malformed query or path.", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "An invalid id or name (the rule is named).", body = Problem, content_type = "application/problem+json"),
        (status = 200, description = "Envelopes.", body = TranscriptPage),
        (status = 404, description = "No such session.", body = Problem, content_type = "application/problem+json"),
    )
)]
pub async fn transcript(
    State(state): State<AppState>,
    caller: Principal,
    ApiPath(path): ApiPath<SessionPath>,
    ApiQuery(query): ApiQuery<TranscriptQuery>,
) -> Result<Json<TranscriptPage>, ApiError> {
    let limit = page_limit(query.limit.as_deref())?;
    // serverSeq is a signed 64-bit integer in both stores.
    let after = bounded_integer("after", query.after.as_deref(), 0, i64::MAX as u64)?;
    visible(&state, &caller, &path.id).await?;
    let envelopes = state
        .store
        .transcript(&path.id, after.unwrap_or(0), limit)
        .await?;
    let next_after = (envelopes.len() == limit as usize)
        .then(|| envelopes.last().map(|e| e.seq))
        .flatten();
    Ok(Json(TranscriptPage {
        envelopes: envelopes.iter().map(envelope_json).collect(),
        next_after,
    }))
}

/// Dispatches an action through the same pipeline and idempotency as the
/// WebSocket: a retry with the same `clientId` and `clientSeq` answers the
/// original outcome.
#[utoipa::path(
    post,
    path = "/v1/sessions/{id}/actions",
    tag = "sessions",
    params(SessionPath),
    request_body = DispatchRequest,
    responses(
        (status = 400, description = "Malformed JSON or path.", body = Problem, content_type = "application/problem+json"),
        (status = 415, description = "The body is not application/json.", body = Problem, content_type = "application/problem+json"),
        (status = 200, description = "Accepted and committed.", body = DispatchResponse),
        (status = 404, description = "No such session.", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "Refused: the session's state does not allow it.", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "Refused: the action is invalid, or the channel is not this session or one of its chats.", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "Storage or a side-effect backend is unavailable.", body = Problem, content_type = "application/problem+json"),
    )
)]
pub async fn dispatch(
    State(state): State<AppState>,
    caller: Principal,
    ApiPath(path): ApiPath<SessionPath>,
    ApiJson(request): ApiJson<DispatchRequest>,
) -> Result<Json<DispatchResponse>, ApiError> {
    let view = visible(&state, &caller, &path.id).await?;
    // Characters, as the OpenAPI document's maxLength counts them.
    if !(1..=MAX_CLIENT_ID_CHARS).contains(&request.client_id.chars().count()) {
        return Err(ApiError::invalid(format!(
            "clientId must be 1 to {MAX_CLIENT_ID_CHARS} characters."
        )));
    }
    if !request.action.is_object() {
        return Err(ApiError::invalid("action must be an AHP action object."));
    }
    let channel = request
        .channel
        .clone()
        .unwrap_or_else(|| view.resource.clone());
    // A chat of another session (or of none) is not this session's. A 422
    // like a foreign session channel, not a 404: the session in the path
    // exists; it is the body that names something else.
    match Channel::parse(&channel) {
        Ok(
            parsed @ (Channel::Session(_) | Channel::Changeset { .. } | Channel::Terminal { .. }),
        ) if parsed.named_session() == Some(path.id.as_str()) => {}
        Ok(parsed @ Channel::Chat(_)) => {
            if state.engine.session_of(&parsed).await?.as_deref() != Some(path.id.as_str()) {
                return Err(ApiError::invalid(format!(
                    "Chat {channel} is not a chat of session {}.",
                    path.id
                )));
            }
        }
        _ => {
            return Err(ApiError::invalid(format!(
                "channel must be this session ({}) or one of its chats, changesets or terminals.",
                view.resource
            )));
        }
    }
    charge(&state, &caller)?;
    // REST callers name their own origin: it is durable (per principal).
    let origin = Origin {
        client_id: request.client_id.clone(),
        client_seq: request.client_seq,
        scope: caller.durable_scope(),
    };
    match state
        .engine
        .dispatch(&caller, Some(origin), &channel, request.action)
        .await
    {
        DispatchOutcome::Accepted(published) => {
            let frame: Value = serde_json::from_str(published.frame.as_str()).unwrap_or_default();
            Ok(Json(DispatchResponse {
                server_seq: published.seq,
                envelope: frame.get("params").cloned().unwrap_or_default(),
            }))
        }
        DispatchOutcome::Rejected(refusal) => Err(rejection(refusal)),
    }
}

/// The status of a refused dispatch: 503 when storage or a backend was
/// unavailable (retry), 404 when the channel does not exist, 409 when the
/// session's state forbids it or the sequence number was reused, else 422.
fn rejection(refusal: Refusal) -> ApiError {
    match refusal.kind {
        RefusalKind::Unavailable => ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "unavailable",
            refusal.reason,
        ),
        RefusalKind::Conflict => ApiError::new(StatusCode::CONFLICT, "rejected", refusal.reason),
        RefusalKind::NotFound => ApiError::new(StatusCode::NOT_FOUND, "not_found", refusal.reason),
        RefusalKind::Forbidden => ApiError::new(StatusCode::FORBIDDEN, "forbidden", refusal.reason),
        RefusalKind::Invalid => {
            ApiError::new(StatusCode::UNPROCESSABLE_ENTITY, "rejected", refusal.reason)
        }
    }
}

/// How the OpenAPI document describes the body of `resume`: the fields of
/// ACP's `ResumeSessionRequest` this host reads, with the rules it applies.
/// The handler decodes the ACP type itself; this type is only a schema.
#[derive(Debug, utoipa::ToSchema)]
#[schema(as = ResumeSessionRequest, rename_all = "camelCase")]
#[allow(dead_code)] // A schema only: never built, never read.
pub struct ResumeSessionBody {
    /// The session's id: must equal the id in the path.
    #[schema(min_length = 1, max_length = 128, pattern = "^[A-Za-z0-9._:-]{1,128}$")]
    session_id: String,
    /// The session's primary working directory, as an absolute path.
    #[schema(pattern = "^/")]
    cwd: String,
    /// The complete new list of the session's other directories, absolute
    /// paths (absent or null: none).
    #[schema(value_type = Option<Vec<AbsolutePath>>)]
    additional_directories: Option<Vec<String>>,
    /// ACP `McpServer` objects; this host does not connect them.
    #[schema(value_type = Option<Vec<Object>>)]
    mcp_servers: Option<Vec<Value>>,
    /// ACP `_meta`.
    #[schema(rename = "_meta", value_type = Option<Object>)]
    meta: Option<Value>,
}

/// An absolute path, as the OpenAPI document describes one.
#[derive(Debug, utoipa::ToSchema)]
#[schema(pattern = "^/")]
#[allow(dead_code)] // A schema only.
pub struct AbsolutePath(String);

/// Resumes the session's agent with ACP `session/resume` semantics: `cwd`
/// must be the session's primary directory; `additionalDirectories` is the
/// complete new list of its other directories. No history is replayed.
#[utoipa::path(
    post,
    path = "/v1/sessions/{id}/resume",
    tag = "sessions",
    params(SessionPath),
    request_body(content = ResumeSessionBody, description = "An ACP ResumeSessionRequest.",
        example = json!({"sessionId": "s-1", "cwd": "/home/me/web", "additionalDirectories": ["/home/me/lib"], "mcpServers": []})),
    responses(
        (status = 400, description = "Malformed JSON or path.", body = Problem, content_type = "application/problem+json"),
        (status = 415, description = "The body is not application/json.", body = Problem, content_type = "application/problem+json"),
        (status = 200, description = "An ACP ResumeSessionResponse.", body = Object, example = json!({})),
        (status = 404, description = "No such session.", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "Not resumable, or ended.", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "cwd is not the primary directory, or a directory is not absolute.", body = Problem, content_type = "application/problem+json"),
    )
)]
pub async fn resume(
    State(state): State<AppState>,
    caller: Principal,
    ApiPath(path): ApiPath<SessionPath>,
    ApiJson(request): ApiJson<ResumeSessionRequest>,
) -> Result<Json<ResumeSessionResponse>, ApiError> {
    visible(&state, &caller, &path.id).await?;
    if request.session_id.to_string() != path.id {
        return Err(ApiError::invalid(format!(
            "sessionId {:?} does not match the session in the path ({}).",
            request.session_id.to_string(),
            path.id
        )));
    }
    let as_uri = |p: &std::path::Path, what: &str| -> Result<String, ApiError> {
        let text = p.to_string_lossy();
        if !is_absolute_path(&text) {
            return Err(ApiError::invalid(format!(
                "{what} {text:?} must be an absolute path."
            )));
        }
        path_to_file_uri(&text).map_err(|e| ApiError::invalid(format!("{e}.")))
    };
    let cwd = as_uri(&request.cwd, "cwd")?;
    let additional = request
        .additional_directories
        .iter()
        .map(|d| as_uri(d, "additional directory"))
        .collect::<Result<Vec<_>, _>>()?;
    // It may start the session's agent.
    charge(&state, &caller)?;
    state
        .engine
        .resume(&caller, &path.id, cwd, additional)
        .await?;
    Ok(Json(ResumeSessionResponse::new()))
}

/// The host context a client-contributed tool receives for this session:
/// the primary working directory (as a path) and the session id.
#[utoipa::path(
    get,
    path = "/v1/sessions/{id}/tool-context",
    tag = "sessions",
    params(SessionPath),
    responses(
        (status = 400, description = "Malformed path.", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "An invalid id or name (the rule is named).", body = Problem, content_type = "application/problem+json"),
        (status = 200, description = "The tool-call context.", body = ToolCallContext),
        (status = 404, description = "No such session.", body = Problem, content_type = "application/problem+json"),
    )
)]
pub async fn tool_context(
    State(state): State<AppState>,
    caller: Principal,
    ApiPath(path): ApiPath<SessionPath>,
) -> Result<Json<ToolCallContext>, ApiError> {
    let view = visible(&state, &caller, &path.id).await?;
    let cwd = view
        .working_directories
        .first()
        .and_then(|uri| file_uri_path(uri).ok());
    let mut context = ToolCallContext::new(cwd.as_deref());
    context.set_session_id(&view.id);
    Ok(Json(context))
}

/// The path naming one of a session's stored attachments.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Path)]
pub struct AttachmentPath {
    /// Session id.
    #[param(min_length = 1, max_length = 128, pattern = "^[A-Za-z0-9._:-]{1,128}$")]
    id: String,
    /// The attachment's SHA-256 digest, as its `tether-attachment:<digest>`
    /// URI in the message names it.
    #[param(min_length = 64, max_length = 64, pattern = "^[0-9a-f]{64}$")]
    digest: String,
}

/// A message attachment's bytes (an embedded attachment is stored once,
/// and the message refers to it as `tether-attachment:<digest>`). Served
/// as a download (`Content-Disposition: attachment`, no sniffing, a
/// sandboxing CSP), so an uploaded page never runs in this origin.
#[utoipa::path(
    get,
    path = "/v1/sessions/{id}/attachments/{digest}",
    tag = "sessions",
    params(AttachmentPath),
    responses(
        (status = 200, description = "The attachment's bytes, with its media type.", body = Vec<u8>, content_type = "application/octet-stream"),
        (status = 400, description = "Malformed path.", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such session, or no such attachment in it.", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "An invalid id or digest (the rule is named).", body = Problem, content_type = "application/problem+json"),
    )
)]
pub async fn attachment(
    State(state): State<AppState>,
    caller: Principal,
    ApiPath(path): ApiPath<AttachmentPath>,
) -> Result<axum::response::Response, ApiError> {
    use axum::http::{HeaderValue, header};
    use axum::response::IntoResponse;
    visible(&state, &caller, &path.id).await?;
    let uri = format!("{}{}", crate::store::ATTACHMENT_SCHEME, path.digest);
    if crate::store::attachment_digest(&uri).is_none() {
        return Err(ApiError::invalid(
            "digest must be 64 lower-case hexadecimal digits (a SHA-256).",
        ));
    }
    let stored = state
        .store
        .attachment(&path.id, &path.digest)
        .await?
        .ok_or_else(|| {
            ApiError::not_found(format!(
                "Session {} has no attachment {}.",
                path.id, path.digest
            ))
        })?;
    let media = HeaderValue::from_str(&stored.content_type)
        .unwrap_or_else(|_| HeaderValue::from_static("application/octet-stream"));
    Ok((
        [
            (header::CONTENT_TYPE, media),
            (
                header::CONTENT_DISPOSITION,
                HeaderValue::from_static("attachment"),
            ),
            (
                header::X_CONTENT_TYPE_OPTIONS,
                HeaderValue::from_static("nosniff"),
            ),
            (
                header::CONTENT_SECURITY_POLICY,
                HeaderValue::from_static("sandbox"),
            ),
            (
                header::CACHE_CONTROL,
                HeaderValue::from_static("private, max-age=31536000, immutable"),
            ),
        ],
        stored.data,
    )
        .into_response())
}
