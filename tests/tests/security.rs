//! Authentication, roles and tenancy over real sockets, on both backends:
//! every cell of the role matrix over HTTP and over the WebSocket, another
//! project's sessions invisible everywhere, bad tokens refused, expiring
//! tokens closing sockets (and the SDK resuming with no gap), per-principal
//! bounds, and a query-string token never written to the log.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime};

use ahp_types::commands::ReconnectResult;
use futures_util::{SinkExt, StreamExt};
use serde_json::{Value, json};
use tether_client::stream::{SessionStream, Start, StreamConfig, StreamEvent};
use tether_client::token::{Token, TokenProvider};
use tether_server::auth::Role;
use tether_server::auth::credentials::Auth;
use tether_server::auth::limits::{LimitsConfig, PrincipalLimits};
use tether_server::auth::token::Authenticator;
use tether_server::config::ServeConfig;
use tether_tests::{TestDb, TestServer, backend_tests};
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;

backend_tests!(
    every_cell_of_the_role_matrix_holds_over_rest_and_the_websocket,
    another_projects_sessions_do_not_exist_for_a_principal,
    bad_tokens_are_refused_without_a_hint,
    an_expired_token_closes_its_socket_and_the_sdk_resumes_with_no_gap,
    per_principal_bounds_answer_429_with_when_to_retry,
    identity_provider_tokens_are_checked_against_the_jwks,
    client_tools_stay_with_their_principal_and_project,
);

const SECRET: &[u8] = b"a test secret that is long enough, 256 bits+";
const METRICS_TOKEN: &str = "scrape-me-please";
const WAIT: Duration = Duration::from_secs(20);

fn authenticator() -> Authenticator {
    Authenticator::new(SECRET)
        .expect("a strong secret")
        .with_leeway(0)
}

fn mint(sub: &str, role: Role, projects: &[&str], ttl: Duration) -> String {
    let projects: Vec<String> = projects.iter().map(|p| (*p).to_owned()).collect();
    authenticator()
        .mint(sub, role, &projects, ttl)
        .expect("mint")
}

fn token(role: Role, projects: &[&str]) -> String {
    mint(
        &format!("{role}-user"),
        role,
        projects,
        Duration::from_secs(3600),
    )
}

async fn secured(db: &TestDb, limits: LimitsConfig) -> TestServer {
    let config = ServeConfig {
        auth: Auth::new(
            Some(authenticator()),
            Some(METRICS_TOKEN.to_owned()),
            PrincipalLimits::new(Some(limits)),
        ),
        ..ServeConfig::default()
    };
    TestServer::start_with(db.open().await, config).await
}

/// A REST caller with a fixed token (or none).
struct Api {
    base: String,
    token: Option<String>,
    http: reqwest::Client,
}

impl Api {
    fn new(server: &TestServer, token: Option<String>) -> Self {
        Self {
            base: server.base_url(),
            token,
            http: reqwest::Client::new(),
        }
    }

    async fn call(
        &self,
        method: &str,
        path: &str,
        body: Option<Value>,
    ) -> (u16, reqwest::header::HeaderMap, Value) {
        let method = reqwest::Method::from_bytes(method.as_bytes()).unwrap();
        let mut request = self.http.request(method, format!("{}{path}", self.base));
        if let Some(token) = &self.token {
            request = request.bearer_auth(token);
        }
        if let Some(body) = body {
            request = request.json(&body);
        }
        let response = request.send().await.expect("the server answers");
        let status = response.status().as_u16();
        let headers = response.headers().clone();
        let text = response.text().await.unwrap_or_default();
        (
            status,
            headers,
            serde_json::from_str(&text).unwrap_or(Value::String(text)),
        )
    }
}

fn create_body(id: &str, project: &str) -> Value {
    json!({"id": id, "project": project})
}

fn title(seq: u64, text: &str) -> Value {
    json!({"clientId": "matrix", "clientSeq": seq, "action": {"type": "session/titleChanged", "title": text}})
}

/// A WebSocket upgrade request for `url` carrying `token` in its header.
fn authorized(
    url: &str,
    token: &str,
) -> tokio_tungstenite::tungstenite::handshake::client::Request {
    let mut request = url.into_client_request().unwrap();
    request
        .headers_mut()
        .insert("authorization", format!("Bearer {token}").parse().unwrap());
    request
}

/// An upstream AHP client on `/ahp` with `token` in the upgrade's header,
/// subscribed to the root.
async fn ahp_with(server: &TestServer, token: &str, client_id: &str) -> ahp::Client {
    let root = vec![ahp_types::ROOT_RESOURCE_URI.into()];
    tether_tests::ahp_with_token(&server.ws_url(), token, client_id, root).await
}

/// What a cell expects.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Cell {
    /// Past authorisation (whatever the state then answers).
    Allowed,
    /// Refused for the role.
    Refused,
}

use Cell::{Allowed, Refused};

const ROLES: [Role; 4] = [Role::Viewer, Role::Operator, Role::Agent, Role::Admin];

/// The role matrix, as the README states it: one row per REST route, AHP
/// method and kind of action, one column per role.
async fn every_cell_of_the_role_matrix_holds_over_rest_and_the_websocket(db: TestDb) {
    let server = secured(&db, LimitsConfig::default()).await;
    let admin = Api::new(&server, Some(token(Role::Admin, &[])));
    for role in ROLES {
        let (status, _, body) = admin
            .call(
                "POST",
                "/v1/sessions",
                Some(create_body(&format!("m-{role}"), "p1")),
            )
            .await;
        assert_eq!(status, 201, "{body}");
        admin
            .call(
                "POST",
                "/v1/sessions",
                Some(create_body(&format!("gone-{role}"), "p1")),
            )
            .await;
    }
    let host_action = json!({"type": "x-tether/commandsAdvertised", "commands": []});
    let resume = json!({"sessionId": "m-x", "cwd": "/tmp", "additionalDirectories": []});
    // (row, [viewer, operator, agent, admin])
    type Row = (&'static str, [Cell; 4]);
    let rest_rows: [Row; 20] = [
        ("GET /v1/sessions", [Allowed; 4]),
        ("GET /v1/sessions/{id}", [Allowed; 4]),
        ("GET /v1/sessions/{id}/transcript", [Allowed; 4]),
        ("GET /v1/sessions/{id}/export", [Allowed; 4]),
        ("GET /v1/search", [Allowed; 4]),
        ("GET /v1/sessions/{id}/tool-context", [Allowed; 4]),
        ("GET working-context", [Allowed; 4]),
        ("GET working-contexts", [Allowed; 4]),
        ("POST /v1/sessions", [Refused, Allowed, Allowed, Allowed]),
        (
            "POST actions (client action)",
            [Refused, Allowed, Allowed, Allowed],
        ),
        (
            "POST actions (host-originated)",
            [Refused, Refused, Allowed, Allowed],
        ),
        ("PUT working-context", [Refused, Allowed, Allowed, Allowed]),
        ("POST resume", [Refused, Allowed, Allowed, Allowed]),
        (
            "DELETE /v1/sessions/{id}",
            [Refused, Allowed, Allowed, Allowed],
        ),
        ("GET /metrics", [Refused, Refused, Refused, Allowed]),
        ("GET /v1/usage", [Refused, Allowed, Allowed, Allowed]),
        ("GET retention", [Allowed; 4]),
        ("PUT retention", [Refused, Refused, Refused, Allowed]),
        ("GET webhooks", [Refused, Allowed, Allowed, Allowed]),
        ("POST webhooks", [Refused, Allowed, Allowed, Allowed]),
    ];
    for (column, role) in ROLES.into_iter().enumerate() {
        let api = Api::new(&server, Some(token(role, &["p1"])));
        let own = format!("m-{role}");
        for (seq, (row, cells)) in rest_rows.iter().enumerate() {
            let seq = seq as u64 + 1;
            let (status, _, body) = match *row {
                "GET /v1/sessions" => api.call("GET", "/v1/sessions", None).await,
                "GET /v1/sessions/{id}" => {
                    api.call("GET", &format!("/v1/sessions/{own}"), None).await
                }
                "GET /v1/sessions/{id}/transcript" => {
                    api.call("GET", &format!("/v1/sessions/{own}/transcript"), None)
                        .await
                }
                "GET /v1/sessions/{id}/export" => {
                    api.call("GET", &format!("/v1/sessions/{own}/export"), None)
                        .await
                }
                "GET /v1/sessions/{id}/tool-context" => {
                    api.call("GET", &format!("/v1/sessions/{own}/tool-context"), None)
                        .await
                }
                "GET /v1/search" => api.call("GET", "/v1/search?q=anything", None).await,
                "GET working-context" => {
                    api.call("GET", "/v1/projects/p1/sessions/x/working-context", None)
                        .await
                }
                "GET working-contexts" => {
                    api.call("GET", "/v1/projects/p1/working-contexts", None)
                        .await
                }
                "POST /v1/sessions" => {
                    api.call(
                        "POST",
                        "/v1/sessions",
                        Some(create_body(&format!("new-{role}"), "p1")),
                    )
                    .await
                }
                "POST actions (client action)" => {
                    api.call(
                        "POST",
                        &format!("/v1/sessions/{own}/actions"),
                        Some(title(seq, "by role")),
                    )
                    .await
                }
                "POST actions (host-originated)" => {
                    let body =
                        json!({"clientId": "matrix", "clientSeq": seq, "action": host_action});
                    api.call("POST", &format!("/v1/sessions/{own}/actions"), Some(body))
                        .await
                }
                "PUT working-context" => {
                    api.call(
                        "PUT",
                        "/v1/projects/p1/sessions/x/working-context",
                        Some(json!({"goal": "g"})),
                    )
                    .await
                }
                "POST resume" => {
                    let mut body = resume.clone();
                    body["sessionId"] = json!(own);
                    api.call("POST", &format!("/v1/sessions/{own}/resume"), Some(body))
                        .await
                }
                "DELETE /v1/sessions/{id}" => {
                    api.call("DELETE", &format!("/v1/sessions/gone-{role}"), None)
                        .await
                }
                "GET /metrics" => api.call("GET", "/metrics", None).await,
                "GET /v1/usage" => api.call("GET", "/v1/usage", None).await,
                "GET retention" => api.call("GET", "/v1/projects/p1/retention", None).await,
                "PUT retention" => {
                    api.call(
                        "PUT",
                        "/v1/projects/p1/retention",
                        Some(json!({"days": 3650})),
                    )
                    .await
                }
                "GET webhooks" => api.call("GET", "/v1/projects/p1/webhooks", None).await,
                "POST webhooks" => {
                    api.call(
                        "POST",
                        "/v1/projects/p1/webhooks",
                        Some(json!({"url": "http://127.0.0.1:9/hook"})),
                    )
                    .await
                }
                other => unreachable!("{other}"),
            };
            assert_ne!(status, 401, "{role} {row}: a valid token is authenticated");
            // Allowed: a success; resume of a session that never opened an
            // agent is past authorisation when the state refuses it (409).
            // Refused: 403 for the role; the host-originated row refuses
            // operators as AHP does (422: host-originated).
            let got = match (*row, status) {
                (_, 200..=299) | ("POST resume", 409) => Allowed,
                (_, 403) | ("POST actions (host-originated)", 422) => Refused,
                _ => panic!("{role} {row}: unexpected {status} {body}"),
            };
            assert_eq!(got, cells[column], "{role} {row}: {status} {body}");
        }
    }
    // /metrics also takes the metrics token, and nothing else without one.
    let scraper = Api::new(&server, Some(METRICS_TOKEN.into()));
    assert_eq!(scraper.call("GET", "/metrics", None).await.0, 200);
    assert_eq!(
        Api::new(&server, None)
            .call("GET", "/metrics", None)
            .await
            .0,
        401
    );

    // The same matrix over the WebSocket.
    for role in ROLES {
        let client = ahp_with(&server, &token(role, &["p1"]), &format!("ws-{role}")).await;
        let own = format!("ahp-session:/m-{role}");
        let (_, mut sub) = client
            .subscribe(own.clone())
            .await
            .expect("viewers subscribe");
        let sessions: Value = client
            .request(
                "listSessions",
                json!({"channel": ahp_types::ROOT_RESOURCE_URI}),
            )
            .await
            .expect("everyone lists");
        assert!(sessions["items"].as_array().is_some_and(|a| !a.is_empty()));
        let writer = role >= Role::Operator;
        let agent = role >= Role::Agent;
        for (action, allowed) in [
            (
                json!({"type": "session/titleChanged", "title": "over ws"}),
                writer,
            ),
            (host_action.clone(), agent),
        ] {
            client
                .dispatch(own.clone(), serde_json::from_value(action.clone()).unwrap())
                .await
                .unwrap();
            let echo = tether_tests::next_envelope(&mut sub).await;
            assert_eq!(
                echo.rejection_reason.is_none(),
                allowed,
                "{role} dispatching {action}: {:?}",
                echo.rejection_reason
            );
        }
        // Host-only actions stay the host's, an agent's token or not: no
        // token adopts a chat (another tenant's among them).
        client
            .dispatch(
                own.clone(),
                serde_json::from_value(json!({"type": "session/chatAdded", "summary": {
                    "resource": "ahp-chat:/m-viewer.main", "title": "mine now",
                    "modifiedAt": "2026-12-01T00:00:00.000Z"}}))
                .unwrap(),
            )
            .await
            .unwrap();
        let echo = tether_tests::next_envelope(&mut sub).await;
        let why = echo.rejection_reason.unwrap_or_default();
        let expected = if writer {
            "host-originated"
        } else {
            "Viewers cannot"
        };
        assert!(
            why.contains(expected),
            "{role} adopted a chat with session/chatAdded: {why:?}"
        );
        let created = client
            .request::<_, Value>(
                "createSession",
                json!({"channel": format!("ahp-session:/ws-{role}"), "provider": "echo",
                       "_meta": {"tether/project": "p1"}}),
            )
            .await;
        assert_eq!(created.is_ok(), writer, "{role} createSession: {created:?}");
        let chat = client
            .request::<_, Value>(
                "createChat",
                json!({"channel": own, "chat": format!("ahp-chat:/side-{role}")}),
            )
            .await;
        assert_eq!(chat.is_ok(), writer, "{role} createChat: {chat:?}");
        let disposed = client
            .request::<_, Value>("disposeSession", json!({"channel": own}))
            .await;
        assert_eq!(
            disposed.is_ok(),
            writer,
            "{role} disposeSession: {disposed:?}"
        );
        if let Err(ahp::ClientError::Rpc(rpc)) = &created {
            assert_eq!(
                rpc.code,
                ahp_types::errors::ahp_error_codes::PERMISSION_DENIED
            );
        }
        client.shutdown().await;
    }
    server.stop().await;
}

/// A principal of project p1 never learns that p2's sessions exist: 404 on
/// REST, absent from lists and root notifications, `missing` in reconnect,
/// the unknown-channel error on subscribe, and refused creation in p2.
async fn another_projects_sessions_do_not_exist_for_a_principal(db: TestDb) {
    let server = secured(&db, LimitsConfig::default()).await;
    let admin = Api::new(&server, Some(token(Role::Admin, &[])));
    admin
        .call("POST", "/v1/sessions", Some(create_body("mine", "p1")))
        .await;
    admin
        .call("POST", "/v1/sessions", Some(create_body("theirs", "p2")))
        .await;
    admin
        .call(
            "PUT",
            "/v1/projects/p2/sessions/theirs/working-context",
            Some(json!({"goal": "secret"})),
        )
        .await;
    let operator = token(Role::Operator, &["p1"]);
    let api = Api::new(&server, Some(operator.clone()));
    let missing = api.call("GET", "/v1/sessions/nonexistent", None).await;
    for path in [
        "/v1/sessions/theirs",
        "/v1/sessions/theirs/transcript",
        "/v1/sessions/theirs/export",
        "/v1/sessions/theirs/export?format=markdown",
        "/v1/sessions/theirs/tool-context",
        "/v1/projects/p2/sessions/theirs/working-context",
        "/v1/projects/p2/working-contexts",
        "/v1/projects/p2/retention",
        "/v1/projects/p2/webhooks",
    ] {
        let (status, _, body) = api.call("GET", path, None).await;
        assert_eq!(status, 404, "{path}: {body}");
    }
    let (status, _, _) = api
        .call("POST", "/v1/sessions/theirs/actions", Some(title(1, "x")))
        .await;
    assert_eq!(status, 404);
    assert_eq!(missing.0, 404);
    let (status, _, listed) = api.call("GET", "/v1/sessions?limit=1000", None).await;
    assert_eq!(status, 200);
    let ids: Vec<&str> = listed["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|s| s["id"].as_str())
        .collect();
    assert_eq!(ids, ["mine"], "only its project's sessions");
    let (status, _, foreign) = api.call("GET", "/v1/sessions?project=p2", None).await;
    assert_eq!(status, 200);
    assert_eq!(
        foreign["items"],
        json!([]),
        "another project lists as empty"
    );
    let (status, _, _) = api
        .call("POST", "/v1/sessions", Some(create_body("sneak", "p2")))
        .await;
    assert_eq!(status, 403, "no creating in another project");

    // Search finds what its own project says, never another's.
    for (id, seq) in [("mine", 901), ("theirs", 902)] {
        let (status, _, body) = admin
            .call(
                "POST",
                &format!("/v1/sessions/{id}/actions"),
                Some(title(seq, &format!("zebra crossing {id}"))),
            )
            .await;
        assert_eq!(status, 200, "{body}");
    }
    let (status, _, everything) = admin.call("GET", "/v1/search?q=zebra", None).await;
    assert_eq!(status, 200, "{everything}");
    assert_eq!(
        everything["items"].as_array().unwrap().len(),
        2,
        "{everything}"
    );
    for query in ["zebra", "zebra&project=p2", "theirs", "zeb*"] {
        let (status, _, found) = api
            .call("GET", &format!("/v1/search?q={query}"), None)
            .await;
        assert_eq!(status, 200, "{found}");
        let sessions: Vec<&str> = found["items"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|h| h["sessionId"].as_str())
            .collect();
        let expected: &[&str] = if query.starts_with("zebra&") || query == "theirs" {
            &[]
        } else {
            &["mine"]
        };
        assert_eq!(
            sessions, expected,
            "{query}: only its project's sessions: {found}"
        );
    }

    // Over the WebSocket.
    let watcher = ahp_with(&server, &operator, "watcher").await;
    let mut root = watcher.events();
    let unknown = watcher
        .subscribe("ahp-session:/nonexistent".into())
        .await
        .err();
    let foreign = watcher.subscribe("ahp-session:/theirs".into()).await.err();
    let code = |e: &Option<ahp::ClientError>| match e {
        Some(ahp::ClientError::Rpc(rpc)) => Some(rpc.code),
        _ => None,
    };
    assert!(code(&foreign).is_some());
    assert_eq!(
        code(&foreign),
        code(&unknown),
        "the same error as an unknown channel"
    );
    let message = |e: &Option<ahp::ClientError>| match e {
        Some(ahp::ClientError::Rpc(rpc)) => rpc
            .message
            .replace("theirs", "X")
            .replace("nonexistent", "X"),
        _ => String::new(),
    };
    assert_eq!(message(&foreign), message(&unknown), "the same words too");
    // A chat of theirs answers as a chat that does not exist.
    let foreign_chat = watcher
        .subscribe("ahp-chat:/theirs.main".into())
        .await
        .err();
    let unknown_chat = watcher
        .subscribe("ahp-chat:/nonexistent.main".into())
        .await
        .err();
    assert!(code(&foreign_chat).is_some());
    assert_eq!(code(&foreign_chat), code(&unknown_chat));
    assert_eq!(message(&foreign_chat), message(&unknown_chat));
    let root_state = watcher
        .subscribe(ahp_types::ROOT_RESOURCE_URI.into())
        .await
        .unwrap()
        .0
        .snapshot
        .unwrap()
        .state;
    let ahp_types::state::SnapshotState::Root(root_state) = root_state else {
        panic!("a root state")
    };
    assert_eq!(root_state.active_sessions, None, "no host-wide count");
    let listed: Value = watcher
        .request(
            "listSessions",
            json!({"channel": ahp_types::ROOT_RESOURCE_URI}),
        )
        .await
        .unwrap();
    let ids: Vec<&str> = listed["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|s| s["resource"].as_str())
        .collect();
    assert_eq!(ids, ["ahp-session:/mine"]);
    let fresh = {
        let request = authorized(&server.ws_url(), &operator);
        let (stream, _) = tokio_tungstenite::connect_async(request).await.unwrap();
        ahp::Client::connect(
            ahp_ws::WebSocketTransport::from_stream(stream),
            ahp::ClientConfig::default(),
        )
        .await
        .unwrap()
    };
    let ReconnectResult::Replay(replay) = fresh
        .reconnect(
            "again".into(),
            0,
            vec!["ahp-session:/mine".into(), "ahp-session:/theirs".into()],
        )
        .await
        .unwrap()
    else {
        panic!("a replay")
    };
    assert_eq!(replay.missing, ["ahp-session:/theirs"]);
    assert!(
        replay
            .actions
            .iter()
            .all(|e| e.channel != "ahp-session:/theirs")
    );

    // Root notifications: p2's changes are never told; p1's are.
    admin
        .call("POST", "/v1/sessions", Some(create_body("theirs-2", "p2")))
        .await;
    admin
        .call(
            "POST",
            "/v1/sessions/theirs/actions",
            Some(json!({"clientId": "a", "clientSeq": 1,
            "action": {"type": "session/titleChanged", "title": "hidden"}})),
        )
        .await;
    admin
        .call("POST", "/v1/sessions", Some(create_body("mine-2", "p1")))
        .await;
    tokio::time::timeout(WAIT, async {
        loop {
            let event = root.recv().await.expect("events");
            if let ahp::SubscriptionEvent::Action(envelope) = &event.event {
                assert!(
                    !matches!(
                        envelope.action,
                        ahp_types::actions::StateAction::RootActiveSessionsChanged(_)
                    ),
                    "the host-wide session count is not told to a scoped principal"
                );
            }
            let told = match &event.event {
                ahp::SubscriptionEvent::SessionAdded(added) => Some(added.summary.resource.clone()),
                ahp::SubscriptionEvent::SessionSummaryChanged(changed) => {
                    Some(changed.session.clone())
                }
                ahp::SubscriptionEvent::SessionRemoved(removed) => Some(removed.session.clone()),
                _ => None,
            };
            if let Some(session) = told {
                assert!(!session.contains("theirs"), "told of {session}");
                if session == "ahp-session:/mine-2" {
                    break;
                }
            }
        }
    })
    .await
    .expect("its own project's session is announced");
    fresh.shutdown().await;
    watcher.shutdown().await;
    server.stop().await;
}

/// base64url without padding, for hand-made token headers.
fn b64(bytes: &[u8]) -> String {
    const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    let mut out = String::new();
    for chunk in bytes.chunks(3) {
        let n = chunk
            .iter()
            .enumerate()
            .fold(0u32, |n, (i, b)| n | (u32::from(*b) << (16 - 8 * i)));
        for i in 0..=chunk.len() {
            out.push(ALPHABET[((n >> (18 - 6 * i)) & 63) as usize] as char);
        }
    }
    out
}

/// Forged, expired, not yet valid, `alg: none`, RS256, role-less and
/// malformed tokens all get the same 401 (problem+json, `WWW-Authenticate:
/// Bearer`, nothing that says why), on REST and on the upgrade, and are
/// counted; a token for another project reads that project as empty.
async fn bad_tokens_are_refused_without_a_hint(db: TestDb) {
    let server = secured(&db, LimitsConfig::default()).await;
    let now = jsonwebtoken::get_current_timestamp();
    let hs = |claims: Value, secret: &[u8]| {
        jsonwebtoken::encode(
            &jsonwebtoken::Header::new(jsonwebtoken::Algorithm::HS256),
            &claims,
            &jsonwebtoken::EncodingKey::from_secret(secret).unwrap(),
        )
        .unwrap()
    };
    let claims = json!({"sub": "eve", "role": "admin", "projects": ["*"], "exp": now + 3600});
    let valid = hs(claims.clone(), SECRET);
    let payload = valid.split('.').nth(1).unwrap().to_owned();
    let signature = valid.split('.').nth(2).unwrap().to_owned();
    let with_header = |header: Value, signature: &str| {
        format!(
            "{}.{payload}.{signature}",
            b64(header.to_string().as_bytes())
        )
    };
    let bad = [
        (
            "forged",
            hs(claims.clone(), b"not the server's secret, but long enough"),
        ),
        (
            "expired",
            hs(
                json!({"sub": "eve", "role": "admin", "projects": ["*"], "exp": now - 60}),
                SECRET,
            ),
        ),
        (
            "not yet valid",
            hs(
                json!({"sub": "eve", "role": "admin", "projects": ["*"], "exp": now + 7200, "nbf": now + 3600}),
                SECRET,
            ),
        ),
        (
            "alg none",
            with_header(json!({"alg": "none", "typ": "JWT"}), ""),
        ),
        (
            "RS256 header",
            with_header(json!({"alg": "RS256", "typ": "JWT"}), &signature),
        ),
        (
            "no role",
            hs(
                json!({"sub": "eve", "projects": ["*"], "exp": now + 3600}),
                SECRET,
            ),
        ),
        (
            "no exp",
            hs(
                json!({"sub": "eve", "role": "admin", "projects": ["*"]}),
                SECRET,
            ),
        ),
        (
            "unknown role",
            hs(
                json!({"sub": "eve", "role": "root", "projects": ["*"], "exp": now + 3600}),
                SECRET,
            ),
        ),
        (
            "bad project",
            hs(
                json!({"sub": "eve", "role": "admin", "projects": ["a b"], "exp": now + 3600}),
                SECRET,
            ),
        ),
        ("garbage", "garbage".to_owned()),
    ];
    let before = metric(&server, "tether_auth_failures_total").await;
    for (what, token) in &bad {
        let api = Api::new(&server, Some(token.clone()));
        let (status, headers, body) = api.call("GET", "/v1/sessions", None).await;
        assert_eq!(status, 401, "{what}: {body}");
        assert_eq!(
            headers["www-authenticate"], "Bearer realm=\"tether\"",
            "{what}"
        );
        assert!(
            headers["content-type"]
                .to_str()
                .unwrap()
                .starts_with("application/problem+json")
        );
        assert_eq!(
            body["detail"], "A valid bearer token is required.",
            "{what}: no hint"
        );
        let request = authorized(&server.ws_url(), token);
        match tokio_tungstenite::connect_async(request).await {
            Err(tokio_tungstenite::tungstenite::Error::Http(response)) => {
                assert_eq!(response.status(), 401, "{what} on /ahp")
            }
            other => panic!("{what}: the upgrade was not refused: {other:?}"),
        }
    }
    let (status, _, _) = Api::new(&server, None)
        .call("GET", "/v1/sessions", None)
        .await;
    assert_eq!(status, 401, "no token at all");
    let after = metric(&server, "tether_auth_failures_total").await;
    assert!(
        after > before + 2 * bad.len() as u64,
        "counted: {before} -> {after}"
    );
    // The valid token itself passes, and a p2 token sees nothing of p1.
    assert_eq!(
        Api::new(&server, Some(valid))
            .call("GET", "/v1/sessions", None)
            .await
            .0,
        200
    );
    let admin = Api::new(&server, Some(token(Role::Admin, &[])));
    admin
        .call("POST", "/v1/sessions", Some(create_body("p1-only", "p1")))
        .await;
    let other = Api::new(&server, Some(token(Role::Viewer, &["p2"])));
    assert_eq!(other.call("GET", "/v1/sessions/p1-only", None).await.0, 404);
    server.stop().await;
}

async fn metric(server: &TestServer, name: &str) -> u64 {
    let scraper = Api::new(server, Some(METRICS_TOKEN.into()));
    let (_, _, body) = scraper.call("GET", "/metrics", None).await;
    let text = body.as_str().unwrap_or_default();
    assert!(text.ends_with("# EOF\n"), "an exposition: {text}");
    // A family with no series yet (nothing counted) is not listed.
    tether_tests::metric_value(text, name).unwrap_or(0.0) as u64
}

/// Mints short-lived operator tokens, counting how many it handed out.
#[derive(Debug)]
struct ShortTokens {
    ttl: Duration,
    minted: AtomicU64,
}

impl TokenProvider for ShortTokens {
    fn token(&self) -> Result<Token, String> {
        self.minted.fetch_add(1, Ordering::Relaxed);
        Ok(Token {
            value: mint("streamer", Role::Operator, &["p1"], self.ttl),
            expires_at: Some(SystemTime::now() + self.ttl),
        })
    }
}

/// A socket lives no longer than its token: closed with 4003 at expiry.
/// The SDK, given a token provider, moves to a fresh token before expiry
/// and resumes from where it was: every envelope exactly once, no gap.
async fn an_expired_token_closes_its_socket_and_the_sdk_resumes_with_no_gap(db: TestDb) {
    let server = secured(&db, LimitsConfig::default()).await;
    let admin = Api::new(&server, Some(token(Role::Admin, &[])));
    admin
        .call("POST", "/v1/sessions", Some(create_body("flow", "p1")))
        .await;

    let short = mint("short", Role::Viewer, &["p1"], Duration::from_secs(2));
    let request = authorized(&server.ws_url(), &short);
    let (mut ws, _) = tokio_tungstenite::connect_async(request).await.unwrap();
    ws.send(Message::Text(
        json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "channel": "ahp-root://", "clientId": "short", "protocolVersions": ["1.0.0"]}})
        .to_string()
        .into(),
    ))
    .await
    .unwrap();
    let closed = tokio::time::timeout(Duration::from_secs(10), async {
        while let Some(Ok(message)) = ws.next().await {
            if let Message::Close(frame) = message {
                return frame;
            }
        }
        None
    })
    .await
    .expect("closed within the token's life and a little");
    let frame = closed.expect("a close frame");
    assert_eq!(u16::from(frame.code), 4003, "{frame:?}");
    assert!(frame.reason.contains("token expired"), "{frame:?}");

    // The SDK with 3 s tokens, for longer than two of them live.
    let tokens = Arc::new(ShortTokens {
        ttl: Duration::from_secs(3),
        minted: AtomicU64::new(0),
    });
    let config = StreamConfig::new(server.base_url()).with_tokens(tokens.clone());
    let mut stream = SessionStream::open(config, vec!["ahp-session:/flow".into()], Start::Now)
        .await
        .expect("the stream opens");
    const TITLES: u64 = 160;
    let producer = {
        let admin = Api::new(&server, Some(token(Role::Admin, &[])));
        tokio::spawn(async move {
            for n in 1..=TITLES {
                let (status, _, body) = admin
                    .call("POST", "/v1/sessions/flow/actions", Some(json!({"clientId": "producer",
                        "clientSeq": n, "action": {"type": "session/titleChanged", "title": format!("t{n}")}})))
                    .await;
                assert_eq!(status, 200, "{body}");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        })
    };
    let mut titles = Vec::new();
    let mut seqs = Vec::new();
    let mut resumed = 0;
    tokio::time::timeout(Duration::from_secs(60), async {
        while titles.len() < TITLES as usize {
            match stream.next().await.expect("the stream goes on") {
                StreamEvent::Envelope(envelope) => {
                    seqs.push(envelope.server_seq);
                    if let ahp_types::actions::StateAction::SessionTitleChanged(changed) =
                        &envelope.action
                    {
                        titles.push(changed.title.clone());
                    }
                }
                StreamEvent::Resumed { .. } => resumed += 1,
                StreamEvent::Failed { reason } => panic!("the stream failed: {reason}"),
                _ => {}
            }
        }
    })
    .await
    .expect("every title arrives");
    producer.await.unwrap();
    let expected: Vec<String> = (1..=TITLES).map(|n| format!("t{n}")).collect();
    assert_eq!(titles, expected, "each exactly once, in order");
    assert!(
        seqs.windows(2).all(|w| w[0] < w[1]),
        "seq order, no duplicate"
    );
    assert!(resumed >= 2, "it moved to fresh tokens ({resumed} resumes)");
    assert!(tokens.minted.load(Ordering::Relaxed) >= 3);
    server.stop().await;
}

/// Per-principal bounds: connections beyond the limit and dispatches beyond
/// the rate get 429 (REST, the upgrade) or a JSON-RPC error with
/// `retryAfterMs` (WebSocket requests), and other principals are not slowed.
async fn per_principal_bounds_answer_429_with_when_to_retry(db: TestDb) {
    let server = secured(
        &db,
        LimitsConfig {
            connections: 2,
            // One token refills every 20 s: none can refill during the test.
            dispatch_rate: 0.05,
            dispatch_burst: 3.0,
        },
    )
    .await;
    let admin = Api::new(&server, Some(token(Role::Admin, &[])));
    admin
        .call("POST", "/v1/sessions", Some(create_body("busy", "p1")))
        .await;
    let greedy = token(Role::Operator, &["p1"]);
    let api = Api::new(&server, Some(greedy.clone()));
    for n in 1..=3 {
        let (status, _, body) = api
            .call("POST", "/v1/sessions/busy/actions", Some(title(n, "ok")))
            .await;
        assert_eq!(status, 200, "within the burst: {body}");
    }
    let (status, headers, body) = api
        .call("POST", "/v1/sessions/busy/actions", Some(title(4, "no")))
        .await;
    assert_eq!(status, 429, "{body}");
    let retry: u64 = headers["retry-after"].to_str().unwrap().parse().unwrap();
    assert!((1..=20).contains(&retry), "Retry-After {retry}");
    // Another principal is not slowed.
    let (status, _, _) = admin
        .call(
            "POST",
            "/v1/sessions/busy/actions",
            Some(json!({"clientId": "admin",
        "clientSeq": 1, "action": {"type": "session/titleChanged", "title": "admin"}})),
        )
        .await;
    assert_eq!(status, 200);
    // Over the WebSocket, a dispatch sent as a request gets a JSON-RPC error.
    let first = ahp_with(&server, &greedy, "greedy-1").await;
    let err = first
        .request::<_, Value>(
            "dispatchAction",
            json!({"channel": "ahp-session:/busy", "clientSeq": 9,
            "action": {"type": "session/titleChanged", "title": "no"}}),
        )
        .await
        .expect_err("over the rate");
    match err {
        ahp::ClientError::Rpc(rpc) => {
            assert_eq!(rpc.code, -32050, "{rpc:?}");
            assert!(
                rpc.data
                    .as_ref()
                    .and_then(|d| d.get("retryAfterMs"))
                    .is_some(),
                "{rpc:?}"
            );
        }
        other => panic!("{other:?}"),
    }
    // So does every command that commits or makes what will, and REST's
    // creations: nothing is made over the rate.
    for (method, params) in [
        (
            "createSession",
            json!({"channel": "ahp-session:/greedy-ws", "project": "p1"}),
        ),
        (
            "createChat",
            json!({"channel": "ahp-session:/busy", "chat": "ahp-chat:/greedy-chat"}),
        ),
        (
            "createTerminal",
            json!({"channel": "ahp-terminal:/busy/greedy", "claim": {"kind": "client", "clientId": "greedy-1"}}),
        ),
        ("disposeSession", json!({"channel": "ahp-session:/busy"})),
        (
            "invokeChangesetOperation",
            json!({"channel": "ahp-changeset:/busy/t1", "operationId": "revert"}),
        ),
    ] {
        match first.request::<_, Value>(method, params).await {
            Err(ahp::ClientError::Rpc(rpc)) => assert_eq!(rpc.code, -32050, "{method}: {rpc:?}"),
            other => panic!("{method} over the rate: {other:?}"),
        }
    }
    let (status, _, body) = api
        .call(
            "POST",
            "/v1/sessions",
            Some(create_body("greedy-rest", "p1")),
        )
        .await;
    assert_eq!(status, 429, "{body}");
    let (status, _, body) = api
        .call(
            "PUT",
            "/v1/projects/p1/sessions/busy/working-context",
            Some(json!({"goal": "more than the rate"})),
        )
        .await;
    assert_eq!(status, 429, "{body}");
    let (_, _, before) = admin.call("GET", "/v1/sessions/busy", None).await;
    assert!(before["state"].is_string(), "{before}");
    let (status, _, body) = api.call("DELETE", "/v1/sessions/busy", None).await;
    assert_eq!(status, 429, "{body}");
    let (_, _, after) = admin.call("GET", "/v1/sessions/busy", None).await;
    assert_eq!(
        after["state"], before["state"],
        "not disposed over the rate"
    );
    for id in ["greedy-ws", "greedy-rest"] {
        let (status, _, _) = admin.call("GET", &format!("/v1/sessions/{id}"), None).await;
        assert_eq!(status, 404, "{id} was not made over the rate");
    }
    let _second = ahp_with(&server, &greedy, "greedy-2").await;
    let request = authorized(&server.ws_url(), &greedy);
    match tokio_tungstenite::connect_async(request).await {
        Err(tokio_tungstenite::tungstenite::Error::Http(response)) => {
            assert_eq!(response.status(), 429);
            assert!(response.headers().contains_key("retry-after"));
        }
        other => panic!("a third connection was not refused: {other:?}"),
    }
    // Closing one frees its slot.
    first.shutdown().await;
    drop(first);
    tokio::time::timeout(WAIT, async {
        loop {
            let request = authorized(&server.ws_url(), &greedy);
            if tokio_tungstenite::connect_async(request).await.is_ok() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await
    .expect("a freed slot is reusable");
    server.stop().await;
}

/// The real binary with authentication on, its log captured at `trace`: a
/// token passed as `?access_token=` (and a bad one) never appears in it.
/// `tether token` mints what `tether serve` accepts; a short secret file is
/// refused at start.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn query_tokens_never_reach_the_log_and_the_binary_mints_and_checks_secrets() {
    let dir = tempfile::tempdir().unwrap();
    let secret_file = dir.path().join("secret");
    std::fs::write(&secret_file, [SECRET, b"\n"].concat()).unwrap();
    let weak = dir.path().join("weak");
    std::fs::write(&weak, b"too short\n").unwrap();
    let bin = tether_tests::tether_bin();
    let clean = |command: &mut std::process::Command| {
        for (key, _) in std::env::vars() {
            if key.starts_with("TETHER_") || key == "RUST_LOG" {
                command.env_remove(key);
            }
        }
    };

    // A secret shorter than 32 bytes: refused, with the reason.
    let mut refused = std::process::Command::new(&bin);
    clean(&mut refused);
    let out = refused
        .args(["serve", "--bind", "127.0.0.1:0", "--database-url"])
        .arg(format!("sqlite:{}", dir.path().join("weak.db").display()))
        .arg("--auth-secret-file")
        .arg(&weak)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("at least 32"), "{stderr}");

    // `tether token` prints only the token.
    let mut mint = std::process::Command::new(&bin);
    clean(&mut mint);
    let out = mint
        .args([
            "token",
            "--sub",
            "ci",
            "--role",
            "viewer",
            "--project",
            "p1",
            "--ttl",
            "1h",
        ])
        .arg("--auth-secret-file")
        .arg(&secret_file)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let minted = String::from_utf8(out.stdout).unwrap();
    assert_eq!(minted.lines().count(), 1, "only the token: {minted:?}");
    let minted = minted.trim().to_owned();
    let principal = authenticator()
        .verify(&minted)
        .expect("the minted token verifies");
    assert_eq!(
        (principal.sub.as_str(), principal.role),
        ("ci", Role::Viewer)
    );

    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .unwrap()
        .port();
    let log = dir.path().join("server.log");
    let mut serve = tokio::process::Command::new(&bin);
    for (key, _) in std::env::vars() {
        if key.starts_with("TETHER_") {
            serve.env_remove(key);
        }
    }
    let mut child = serve
        .args([
            "serve",
            "--bind",
            &format!("127.0.0.1:{port}"),
            "--database-url",
        ])
        .arg(format!("sqlite:{}", dir.path().join("t.db").display()))
        .arg("--auth-secret-file")
        .arg(&secret_file)
        .env("RUST_LOG", "trace")
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let base = format!("http://127.0.0.1:{port}");
    let http = reqwest::Client::new();
    tokio::time::timeout(WAIT, async {
        while !http
            .get(format!("{base}/readyz"))
            .send()
            .await
            .is_ok_and(|r| r.status().is_success())
        {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await
    .expect("the server starts");
    let bogus = format!("{minted}x");
    for token in [&minted, &bogus] {
        let url = format!("ws://127.0.0.1:{port}/ahp?access_token={token}");
        if let Ok((mut ws, _)) = tokio_tungstenite::connect_async(url).await {
            ws.send(Message::Text(
                json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
                    "channel": "ahp-root://", "clientId": "q", "protocolVersions": ["1.0.0"]}})
                .to_string()
                .into(),
            ))
            .await
            .unwrap();
            let answer = tokio::time::timeout(WAIT, ws.next()).await.unwrap();
            assert!(matches!(answer, Some(Ok(Message::Text(_)))), "{answer:?}");
        }
        let answer = http
            .get(format!("{base}/v1/sessions?access_token={token}"))
            .bearer_auth(token)
            .send()
            .await
            .unwrap();
        assert!(answer.status() == 200 || answer.status() == 401);
    }
    // The subprotocol form: `bearer.<token>` next to a real protocol, and
    // the server selects the real one.
    let mut request = format!("ws://127.0.0.1:{port}/ahp")
        .into_client_request()
        .unwrap();
    request.headers_mut().insert(
        "sec-websocket-protocol",
        format!("ahp, bearer.{minted}").parse().unwrap(),
    );
    let (_, response) = tokio_tungstenite::connect_async(request)
        .await
        .expect("the subprotocol token is accepted");
    assert_eq!(response.headers()["sec-websocket-protocol"], "ahp");
    tokio::time::sleep(Duration::from_millis(300)).await;
    child.kill().await.unwrap();
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(
        text.contains("authentication failed"),
        "the bad token is logged as a failure"
    );
    let signature = minted.rsplit('.').next().unwrap();
    assert!(
        !text.contains(signature) && !text.contains(&bogus),
        "a token reached the log"
    );
}

fn fixture(name: &str) -> Vec<u8> {
    std::fs::read(format!(
        "{}/fixtures/jwks/{name}",
        env!("CARGO_MANIFEST_DIR")
    ))
    .unwrap()
}

/// With `TETHER_AUTH_JWKS_FILE`, RS256 and ES256 tokens of an identity
/// provider are accepted when their `kid` names a key of that type; one key
/// accepts one algorithm, and a `kid`-less, mismatched or tampered token is
/// refused like any other.
async fn identity_provider_tokens_are_checked_against_the_jwks(db: TestDb) {
    let jwks = String::from_utf8(fixture("jwks.json")).unwrap();
    let provider = tether_server::auth::token::Provider {
        jwks: &jwks,
        issuer: "https://idp.test",
        audience: "tether",
    };
    let tokens = Authenticator::with_keys(None, Some(provider)).expect("the JWKS loads");
    assert!(!tokens.can_mint(), "a JWKS alone cannot mint");
    let config = ServeConfig {
        auth: Auth::new(
            Some(tokens),
            None,
            PrincipalLimits::new(Some(LimitsConfig::default())),
        ),
        ..ServeConfig::default()
    };
    let server = TestServer::start_with(db.open().await, config).await;
    let now = jsonwebtoken::get_current_timestamp();
    let claims = json!({"sub": "idp-user", "role": "viewer", "projects": ["p1"], "exp": now + 600,
        "iss": "https://idp.test", "aud": "tether"});
    let sign_claims = |alg: jsonwebtoken::Algorithm,
                       kid: Option<&str>,
                       key: &jsonwebtoken::EncodingKey,
                       claims: &Value| {
        let mut header = jsonwebtoken::Header::new(alg);
        header.kid = kid.map(str::to_owned);
        jsonwebtoken::encode(&header, claims, key).unwrap()
    };
    let sign = |alg, kid, key| sign_claims(alg, kid, key, &claims);
    let rsa = jsonwebtoken::EncodingKey::from_rsa_der(&fixture("rsa.der"));
    let ec = jsonwebtoken::EncodingKey::from_ec_der(&fixture("ec.der"));
    let good = [
        (
            "RS256",
            sign(jsonwebtoken::Algorithm::RS256, Some("rsa-1"), &rsa),
        ),
        (
            "ES256",
            sign(jsonwebtoken::Algorithm::ES256, Some("ec-1"), &ec),
        ),
    ];
    for (what, token) in &good {
        let (status, _, body) = Api::new(&server, Some(token.clone()))
            .call("GET", "/v1/sessions", None)
            .await;
        assert_eq!(status, 200, "{what}: {body}");
        let client = ahp_with(&server, token, &format!("idp-{what}")).await;
        client.ping().await.expect("the WebSocket takes it too");
        client.shutdown().await;
    }
    let tampered = {
        let token = &good[0].1;
        let mut parts: Vec<String> = token.split('.').map(str::to_owned).collect();
        let claims =
            json!({"sub": "idp-user", "role": "admin", "projects": ["*"], "exp": now + 600});
        parts[1] = b64(claims.to_string().as_bytes());
        parts.join(".")
    };
    let bad = [
        ("no kid", sign(jsonwebtoken::Algorithm::RS256, None, &rsa)),
        (
            "RSA kid on an ES256 token",
            sign(jsonwebtoken::Algorithm::ES256, Some("rsa-1"), &ec),
        ),
        (
            "unknown kid",
            sign(jsonwebtoken::Algorithm::RS256, Some("rsa-2"), &rsa),
        ),
        (
            "HS256 with no secret configured",
            mint("x", Role::Admin, &["*"], Duration::from_secs(60)),
        ),
        ("tampered claims", tampered),
        ("another application's audience", {
            let mut other = claims.clone();
            other["aud"] = json!("another-app");
            sign_claims(jsonwebtoken::Algorithm::RS256, Some("rsa-1"), &rsa, &other)
        }),
        ("another issuer", {
            let mut other = claims.clone();
            other["iss"] = json!("https://evil.test");
            sign_claims(jsonwebtoken::Algorithm::RS256, Some("rsa-1"), &rsa, &other)
        }),
        ("no audience", {
            let mut other = claims.clone();
            other.as_object_mut().unwrap().remove("aud");
            sign_claims(jsonwebtoken::Algorithm::RS256, Some("rsa-1"), &rsa, &other)
        }),
    ];
    for (what, token) in &bad {
        let (status, _, _) = Api::new(&server, Some(token.clone()))
            .call("GET", "/v1/sessions", None)
            .await;
        assert_eq!(status, 401, "{what}");
    }
    server.stop().await;
}

/// The next envelope of `kind` on a subscription, as JSON.
async fn next_action_of(subscription: &mut ahp::SessionSubscription, kind: &str) -> Value {
    loop {
        let envelope = tether_tests::next_envelope(subscription).await;
        let value = serde_json::to_value(&envelope.action).unwrap();
        if value["type"] == kind {
            return value;
        }
    }
}

async fn client_tools_stay_with_their_principal_and_project(db: TestDb) {
    let server = secured(&db, LimitsConfig::default()).await;
    let admin = Api::new(&server, Some(token(Role::Admin, &["*"])));
    let dir = tempfile::tempdir().unwrap();
    let (status, _, body) = admin
        .call(
            "POST",
            "/v1/sessions",
            Some(json!({"id": "tools", "project": "alpha", "workingDirectories": [dir.path()]})),
        )
        .await;
    assert_eq!(status, 201, "{body}");
    let tool = json!({"type": "session/activeClientSet", "activeClient": {"clientId": "console",
        "tools": [{"name": "lookup", "inputSchema": {"type": "object"}}]}});

    // Another project's principal cannot register tools there: the session
    // does not exist for it.
    let carol = Api::new(
        &server,
        Some(mint(
            "carol",
            Role::Operator,
            &["beta"],
            Duration::from_secs(3600),
        )),
    );
    let (status, _, _) = carol
        .call(
            "POST",
            "/v1/sessions/tools/actions",
            Some(json!({"clientId": "console", "clientSeq": 1, "action": tool})),
        )
        .await;
    assert_eq!(status, 404);

    // Alice registers; Mallory, in the same project, names the same clientId.
    let alice = ahp_with(
        &server,
        &mint(
            "alice",
            Role::Operator,
            &["alpha"],
            Duration::from_secs(3600),
        ),
        "console",
    )
    .await;
    let mallory = ahp_with(
        &server,
        &mint(
            "mallory",
            Role::Operator,
            &["alpha"],
            Duration::from_secs(3600),
        ),
        "console",
    )
    .await;
    let (_, mut alice_chat) = alice
        .subscribe("ahp-chat:/tools.main".into())
        .await
        .unwrap();
    let (_, mut mallory_chat) = mallory
        .subscribe("ahp-chat:/tools.main".into())
        .await
        .unwrap();
    let (_, mut alice_session) = alice.subscribe("ahp-session:/tools".into()).await.unwrap();
    alice
        .dispatch("ahp-session:/tools".into(), tether_tests::action(tool))
        .await
        .unwrap();
    next_action_of(&mut alice_session, "session/activeClientSet").await;
    let turn = json!({"clientId": "rest", "clientSeq": 1, "channel": "ahp-chat:/tools.main",
        "action": {"type": "chat/turnStarted", "turnId": "t1", "startedAt": "2026-12-01T10:00:00.000Z",
                   "message": {"text": "/tool lookup {}", "origin": {"kind": "user"}}}});
    let (status, _, body) = admin
        .call("POST", "/v1/sessions/tools/actions", Some(turn))
        .await;
    assert_eq!(status, 200, "{body}");
    let input = |ready: &Value| -> Value {
        serde_json::from_str(ready["toolInput"].as_str().unwrap()).unwrap()
    };
    let theirs = next_action_of(&mut alice_chat, "chat/toolCallReady").await;
    assert_eq!(
        input(&theirs)["__tether"]["sessionId"],
        "tools",
        "the principal that registered the tool"
    );
    let spoofed = next_action_of(&mut mallory_chat, "chat/toolCallReady").await;
    assert_eq!(
        input(&spoofed),
        json!({}),
        "the same clientId under another principal sees no context"
    );
}
