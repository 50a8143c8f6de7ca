//! The HTTP skeleton through a real socket: health, readiness, problems,
//! request ids, body limits and the OpenAPI document.

use tether_protocol::rest::Problem;
use tether_server::config::ServeConfig;
use tether_tests::{TestDb, TestServer, backend_tests};

backend_tests!(
    health_and_readiness_answer,
    unknown_routes_answer_problem_json,
    request_ids_are_set_and_propagated,
    oversize_bodies_are_refused_and_the_server_keeps_serving,
    readiness_reports_an_unreachable_store,
);

async fn health_and_readiness_answer(db: TestDb) {
    let server = TestServer::start(&db).await;
    let client = server.client();
    let health = client.health().await.unwrap();
    assert_eq!(health.status, "ok");
    let ready = client.readiness().await.unwrap();
    assert_eq!(ready.status, "ready");
    let expected = match db.backend() {
        tether_tests::Backend::Sqlite => "sqlite",
        tether_tests::Backend::Postgres => "postgres",
    };
    assert_eq!(ready.backend, expected);
    // The first start records one envelope: the agents it advertises.
    assert_eq!(ready.server_seq, 1);
    let epoch = ready.host_epoch.clone();
    server.stop().await;

    // A restart on the same database keeps the epoch and, with the same
    // agents, records nothing new.
    let server = TestServer::start(&db).await;
    let again = server.client().readiness().await.unwrap();
    assert_eq!(again.host_epoch, epoch);
    assert_eq!(again.server_seq, 1);
    server.stop().await;
}

async fn unknown_routes_answer_problem_json(db: TestDb) {
    let server = TestServer::start(&db).await;
    let response = reqwest::get(format!("{}/no/such/route", server.base_url()))
        .await
        .unwrap();
    assert_eq!(response.status(), 404);
    assert_eq!(
        response.headers()["content-type"],
        "application/problem+json"
    );
    let problem: Problem = response.json().await.unwrap();
    assert_eq!(problem.code, "not_found");
    assert_eq!(problem.status, 404);
    assert!(problem.detail.unwrap().contains("/no/such/route"));
    server.stop().await;
}

async fn request_ids_are_set_and_propagated(db: TestDb) {
    let server = TestServer::start(&db).await;
    let http = reqwest::Client::new();
    let url = format!("{}/healthz", server.base_url());
    let generated = http.get(&url).send().await.unwrap();
    let id = generated.headers()["x-request-id"]
        .to_str()
        .unwrap()
        .to_owned();
    assert_eq!(id.len(), 36, "a UUID: {id}");
    let echoed = http
        .get(&url)
        .header("x-request-id", "my-trace-1")
        .send()
        .await
        .unwrap();
    assert_eq!(echoed.headers()["x-request-id"], "my-trace-1");
    server.stop().await;
}

async fn oversize_bodies_are_refused_and_the_server_keeps_serving(db: TestDb) {
    let config = ServeConfig {
        max_body_bytes: 1024,
        ..ServeConfig::default()
    };
    let server = TestServer::start_with(db.open().await, config).await;
    let http = reqwest::Client::new();
    let response = http
        .post(format!("{}/healthz", server.base_url()))
        .body(vec![b'x'; 4096])
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 413);
    assert_eq!(server.client().health().await.unwrap().status, "ok");
    server.stop().await;
}

async fn readiness_reports_an_unreachable_store(db: TestDb) {
    let store = db.open().await;
    let server = TestServer::start_with(store.clone(), ServeConfig::default()).await;
    // Closing the pool under the server makes every query fail.
    store.close().await;
    let err = server.client().readiness().await.unwrap_err();
    match err {
        tether_client::Error::Api {
            status,
            code,
            detail,
        } => {
            assert_eq!(status, 503);
            assert_eq!(code, "store_unavailable");
            assert!(
                !detail.unwrap_or_default().contains("pool"),
                "5xx details stay generic"
            );
        }
        other => panic!("expected a 503 problem, got {other:?}"),
    }
    assert_eq!(server.client().health().await.unwrap().status, "ok");
    server.stop().await;
}

#[tokio::test]
async fn the_committed_openapi_document_is_current() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../openapi/openapi.json");
    let generated = tether_server::http::openapi_json();
    if std::env::var("TETHER_UPDATE_OPENAPI").as_deref() == Ok("1") {
        std::fs::write(path, &generated).unwrap();
    }
    let committed = std::fs::read_to_string(path).unwrap_or_default();
    assert!(
        committed == generated,
        "openapi/openapi.json is stale; regenerate it with \
         `cargo run -p tether-server -- openapi > openapi/openapi.json`"
    );

    // And a server serves exactly that document's form for its security
    // (this one runs without authentication).
    let generated = tether_server::http::openapi_json_for(false);
    let db = TestDb::sqlite();
    let server = TestServer::start(&db).await;
    let served = reqwest::get(format!("{}/openapi.json", server.base_url()))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert_eq!(served, generated);
    let doc: serde_json::Value = serde_json::from_str(&served).unwrap();
    assert!(doc["paths"]["/healthz"]["get"].is_object());
    assert!(doc["paths"]["/readyz"]["get"].is_object());
    server.stop().await;
}
