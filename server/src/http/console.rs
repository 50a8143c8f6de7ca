//! The web console, served at `/` from assets embedded at build time: no
//! CDN and no network at run time, and `cargo build` needs no npm (the
//! console's TypeScript, with @tether/sdk and its libraries, is bundled by
//! esbuild into one committed `console/dist/app.js`; CI rebuilds it from
//! `console/src/` and fails if it differs). The README says how to work on
//! it.

use axum::Router;
use axum::http::header;
use axum::response::IntoResponse;
use axum::routing::get;

use crate::AppState;

const INDEX: &str = include_str!("../../../console/index.html");
const STYLE: &str = include_str!("../../../console/style.css");
const APP: &str = include_str!("../../../console/dist/app.js");

/// The console's own documents: same-origin only, no inline script.
const POLICY: &str = "default-src 'self'; connect-src 'self' ws: wss:; img-src 'self' data:; \
                      style-src 'self'; script-src 'self'; frame-ancestors 'none'";

fn asset(body: &'static str, kind: &'static str) -> impl IntoResponse {
    (
        [
            (header::CONTENT_TYPE, kind),
            (header::CONTENT_SECURITY_POLICY, POLICY),
            (header::CACHE_CONTROL, "no-cache"),
            (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
        ],
        body,
    )
}

/// `/` and the files it loads.
pub fn router() -> Router<AppState> {
    Router::new()
        .route(
            "/",
            get(|| async { asset(INDEX, "text/html; charset=utf-8") }),
        )
        .route(
            "/console/style.css",
            get(|| async { asset(STYLE, "text/css; charset=utf-8") }),
        )
        .route(
            "/console/app.js",
            get(|| async { asset(APP, "text/javascript; charset=utf-8") }),
        )
}
