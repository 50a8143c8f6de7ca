//! The HTTP surface: one module per resource, each owning its router; this
//! module only merges them, adds the cross-cutting layers and the OpenAPI
//! document.

pub mod agents;
pub mod console;
pub mod contexts;
pub mod error;
pub mod export;
pub mod extract;
pub mod guard;
pub mod health;
pub mod listener;
mod mcp;
pub mod metrics;
pub mod projects;
pub mod search;
pub mod sessions;
pub mod usage;
pub mod webhooks;

use std::sync::{Arc, OnceLock};

use axum::Router;
use axum::extract::{MatchedPath, Request};
use axum::http::{HeaderName, Method, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use tower_http::limit::RequestBodyLimitLayer;
use tower_http::request_id::{MakeRequestUuid, PropagateRequestIdLayer, SetRequestIdLayer};
use tower_http::trace::TraceLayer;
use utoipa::OpenApi;
use utoipa::openapi::OpenApi as OpenApiDoc;
use utoipa_axum::router::OpenApiRouter;

use crate::AppState;

/// The header carrying the request id, set when the client sent none and
/// echoed on the response.
const REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");

#[derive(OpenApi)]
#[openapi(
    info(
        title = "Tether",
        description = "A durable, multi-user session host for coding agents. \
                       AHP 1.0 over WebSocket at /ahp; this document covers the REST API. \
                       Every request body is a JSON object; every error is an RFC 9457 \
                       problem document (application/problem+json). Sessions are never \
                       erased: DELETE /v1/sessions/{id} settles a session (closed or ended) \
                       and it stays readable, transcript and all.",
        license(name = "MIT OR Apache-2.0", identifier = "MIT OR Apache-2.0"),
    ),
    tags(
        (name = "operations", description = "Liveness, readiness, metrics and this document."),
        (name = "sessions", description = "Session projections, transcripts, dispatch, resume and tool context."),
        (name = "agents", description = "The agents sessions can run: echo and the configured ACP agents."),
        (name = "working context", description = "What an agent was doing, saved per project and session."),
        (name = "projects", description = "What each project keeps and whom it calls: retention and webhooks."),
    )
)]
struct ApiDoc;

/// All documented routes with their OpenAPI description.
fn documented() -> OpenApiRouter<AppState> {
    OpenApiRouter::with_openapi(ApiDoc::openapi())
        .merge(health::router())
        .merge(agents::router())
        .merge(metrics::router())
        .merge(sessions::router())
        .merge(contexts::router())
        .merge(search::router())
        .merge(usage::router())
        .merge(projects::router())
        .merge(webhooks::router())
}

/// The OpenAPI document of a server with authentication on (the one
/// committed in `openapi/openapi.json`).
pub fn openapi() -> OpenApiDoc {
    openapi_for(true)
}

/// The OpenAPI document of a server with authentication on or off: it
/// states the security the server enforces, so a server without
/// authentication does not claim that its operations need a token.
pub fn openapi_for(authenticated: bool) -> OpenApiDoc {
    let (_, mut doc) = documented().split_for_parts();
    // The version follows the crate so the committed file changes with releases.
    doc.info.version = env!("CARGO_PKG_VERSION").to_owned();
    require_non_empty_working_context(&mut doc);
    if authenticated {
        document_authentication(&mut doc);
    } else {
        doc.info.description = doc.info.description.map(|d| {
            format!(
                "{d} This server runs without authentication: it serves loopback callers, \
                 and no operation needs a token."
            )
        });
    }
    doc
}

/// States the bearer authentication of `/v1` and `/metrics` in the
/// document: the security scheme, a security requirement on each of their
/// operations, and the refusals every one of them may answer (401 without a
/// valid token, 403 for a role that may not, 429 over a per-principal
/// rate on dispatch). The health routes and this document stay open.
fn document_authentication(doc: &mut OpenApiDoc) {
    use utoipa::openapi::security::{
        HttpAuthScheme, HttpBuilder, SecurityRequirement, SecurityScheme,
    };
    use utoipa::openapi::{ContentBuilder, Ref, ResponseBuilder};
    let components = doc.components.get_or_insert_with(Default::default);
    components.security_schemes.insert(
        "bearer".to_owned(),
        SecurityScheme::Http(
            HttpBuilder::new()
                .scheme(HttpAuthScheme::Bearer)
                .bearer_format("JWT")
                .description(Some(
                    "Required when the server runs with an auth secret (TETHER_AUTH_SECRET).",
                ))
                .build(),
        )
        .into(),
    );
    let refusal = |description: &str| {
        ResponseBuilder::new()
            .description(description)
            .content(
                error::PROBLEM_JSON,
                ContentBuilder::new()
                    .schema(Some(Ref::from_schema_name("Problem")))
                    .build(),
            )
            .build()
    };
    for (path, item) in doc.paths.paths.iter_mut() {
        if !(path.starts_with("/v1/") || path == "/metrics") {
            continue;
        }
        let operations = [
            ("get", item.get.as_mut()),
            ("put", item.put.as_mut()),
            ("post", item.post.as_mut()),
            ("delete", item.delete.as_mut()),
        ];
        for (method, operation) in operations {
            let Some(operation) = operation else {
                continue;
            };
            operation.security = Some(vec![SecurityRequirement::new(
                "bearer",
                Vec::<String>::new(),
            )]);
            let responses = &mut operation.responses.responses;
            responses.entry("401".to_owned()).or_insert_with(|| {
                refusal("With authentication on: no valid bearer token.").into()
            });
            responses
                .entry("403".to_owned())
                .or_insert_with(|| refusal("The token's role may not do this.").into());
            // What draws on the principal's dispatch rate (`sessions::charge`).
            let charged = path.ends_with("/actions")
                || path.ends_with("/resume")
                || (method == "post" && path == "/v1/sessions")
                || (method == "delete" && path == "/v1/sessions/{id}")
                || (method == "put" && path.ends_with("/working-context"));
            if charged {
                responses.entry("429".to_owned()).or_insert_with(|| {
                    refusal("Over this principal's dispatch rate; Retry-After says when to retry.")
                        .into()
                });
            }
        }
    }
}

/// Adds to the derived `WorkingContext` schema the rule the save handler
/// enforces and no field attribute can state: at least a goal or one entry
/// (`allOf` the derived schema and [`non_empty_schema`]'s `anyOf`).
///
/// [`non_empty_schema`]: tether_protocol::context::non_empty_schema
fn require_non_empty_working_context(doc: &mut OpenApiDoc) {
    use utoipa::openapi::schema::{AllOfBuilder, Schema};
    let Some(components) = doc.components.as_mut() else {
        return;
    };
    let Some(derived) = components.schemas.remove("WorkingContext") else {
        return;
    };
    let rule = tether_protocol::context::non_empty_schema();
    let mut both = AllOfBuilder::new().item(derived).item(rule).build();
    both.description = Some("What an agent was doing; at least a goal or one entry.".to_owned());
    components
        .schemas
        .insert("WorkingContext".to_owned(), Schema::AllOf(both).into());
}

/// The OpenAPI document as the pretty JSON committed in `openapi/openapi.json`.
pub fn openapi_json() -> String {
    openapi_json_for(true)
}

/// [`openapi_for`] as pretty JSON.
pub fn openapi_json_for(authenticated: bool) -> String {
    let mut json = openapi_for(authenticated)
        .to_pretty_json()
        .unwrap_or_else(|e| format!("{{\"error\": \"{e}\"}}"));
    json.push('\n');
    json
}

/// Builds the whole application router: the REST surface, the console
/// and `beside` (the AHP surface, given by the caller so this module does
/// not reach into it), under one set of layers.
pub fn router(state: AppState, beside: Router<AppState>) -> Router {
    // Built once per form: with and without authentication.
    static SPECS: [OnceLock<Arc<str>>; 2] = [OnceLock::new(), OnceLock::new()];
    let authenticated = state.auth.enabled();
    let spec = SPECS[usize::from(authenticated)]
        .get_or_init(|| openapi_json_for(authenticated).into())
        .clone();
    let max_body = state.config.max_body_bytes;
    let browsers = state
        .config
        .browsers
        .clone()
        .checking_hosts(!state.auth.enabled());
    let cors = guard::cors(&browsers);
    let (routes, _) = documented().split_for_parts();
    let app = routes
        .route(
            "/openapi.json",
            get(move || {
                let spec = spec.clone();
                async move { ([("content-type", "application/json")], spec.to_string()) }
            }),
        )
        .merge(beside)
        .merge(console::router())
        .route("/mcp/{session}", axum::routing::any(mcp::serve))
        .fallback(not_found)
        .with_state(state)
        .layer(RequestBodyLimitLayer::new(max_body))
        // Before any handler: a foreign page's request goes no further.
        .layer(axum::middleware::from_fn_with_state(browsers, guard::guard));
    // Outside the guard, so an allowed origin's preflight is answered and
    // its refusals carry CORS headers it can read.
    let app = match cors {
        Some(cors) => app.layer(cors),
        None => app,
    };
    app
        // Outside the body limit, so its 413 is reached too.
        .layer(axum::middleware::map_response(
            problem_for_bare_client_errors,
        ))
        .layer(
            TraceLayer::new_for_http()
                .make_span_with(|request: &Request| {
                    let route = request
                        .extensions()
                        .get::<MatchedPath>()
                        .map(MatchedPath::as_str)
                        .unwrap_or("unmatched");
                    let id = request
                        .headers()
                        .get(&REQUEST_ID)
                        .and_then(|v| v.to_str().ok())
                        .unwrap_or("-");
                    tracing::info_span!("http", method = %request.method(), route, request_id = id,
                    sub = tracing::field::Empty)
                })
                // One line per request, with its status and latency, inside the
                // span that names the route, the request id and the principal.
                .on_response(
                    |response: &Response, latency: std::time::Duration, _: &tracing::Span| {
                        tracing::info!(
                            status = response.status().as_u16(),
                            latency_us = latency.as_micros() as u64,
                            "request"
                        );
                    },
                ),
        )
        .layer(PropagateRequestIdLayer::new(REQUEST_ID))
        .layer(SetRequestIdLayer::new(REQUEST_ID, MakeRequestUuid))
}

/// The largest bare error body read to become a problem's detail: these
/// bodies are short sentences from axum or a tower layer.
const BARE_DETAIL_BYTES: usize = 1024;

/// Answers every 4xx that is not already a problem document as one, keeping
/// its status and headers (`Allow` on a 405). Such answers come from below
/// the handlers: axum's 405 for a method a route lacks (empty body),
/// tower-http's 413 for a declared `Content-Length` over the limit (plain
/// text), a refused WebSocket upgrade. Every error is problem+json, these
/// included.
async fn problem_for_bare_client_errors(method: Method, response: Response) -> Response {
    let status = response.status();
    let is_problem = response
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with(error::PROBLEM_JSON));
    if !status.is_client_error() || is_problem {
        return response;
    }
    let (mut parts, body) = response.into_parts();
    let text = axum::body::to_bytes(body, BARE_DETAIL_BYTES)
        .await
        .map(|b| String::from_utf8_lossy(&b).trim().to_owned())
        .unwrap_or_default();
    let (code, detail) = match status {
        StatusCode::METHOD_NOT_ALLOWED => (
            "method_not_allowed",
            format!("{method} is not allowed here; the Allow header lists what is."),
        ),
        StatusCode::PAYLOAD_TOO_LARGE => (
            "payload_too_large",
            "The request body is larger than this server accepts (--max-body-bytes).".to_owned(),
        ),
        _ if text.is_empty() => ("bad_request", "The request was refused.".to_owned()),
        _ => ("bad_request", format!("{text}.")),
    };
    let problem = error::problem(status, code, Some(detail));
    let (problem_parts, problem_body) = problem.into_parts();
    parts.headers.remove(header::CONTENT_LENGTH);
    parts.headers.extend(problem_parts.headers);
    Response::from_parts(parts, problem_body)
}

async fn not_found(request: Request) -> Response {
    error::problem(
        StatusCode::NOT_FOUND,
        "not_found",
        Some(format!(
            "There is no route for {} {}.",
            request.method(),
            request.uri().path()
        )),
    )
    .into_response()
}

#[cfg(test)]
mod tests {
    use serde_json::Value;
    use tether_protocol::ids::{MAX_NAME_LEN, NAME_PATTERN};

    /// Calls `visit` on every object in `value`.
    fn objects<'a>(value: &'a Value, visit: &mut impl FnMut(&'a serde_json::Map<String, Value>)) {
        match value {
            Value::Object(map) => {
                visit(map);
                map.values().for_each(|v| objects(v, visit));
            }
            Value::Array(items) => items.iter().for_each(|v| objects(v, visit)),
            _ => {}
        }
    }

    /// utoipa's attributes take only literals, so the document repeats the
    /// name rule and the 2^63−1 bound; this keeps each copy equal to the
    /// code's.
    #[test]
    fn the_documented_bounds_are_the_enforced_ones() {
        let doc = serde_json::to_value(super::openapi()).unwrap();
        let channel = format!("^ahp-(session|chat):/{}", &NAME_PATTERN[1..]);
        let (mut names, mut maxima) = (0, 0);
        objects(&doc, &mut |schema| {
            if let Some(pattern) = schema.get("pattern").and_then(Value::as_str)
                && pattern.contains("A-Za-z0-9._:-")
            {
                assert!(pattern == NAME_PATTERN || pattern == channel, "{pattern}");
                if pattern == NAME_PATTERN {
                    names += 1;
                    assert_eq!(schema["minLength"], 1, "{schema:?}");
                    assert_eq!(schema["maxLength"], MAX_NAME_LEN, "{schema:?}");
                }
            }
            if let Some(max) = schema.get("maximum").and_then(Value::as_u64)
                && max > u64::from(u32::MAX)
            {
                maxima += 1;
                assert_eq!(max, tether_protocol::rest::MAX_CLIENT_SEQ, "{schema:?}");
            }
        });
        assert!(names >= 7, "ids, projects and session names are documented");
        assert_eq!(maxima, 2, "clientSeq and after");
    }
}
