//! `tether-client`'s REST methods against the real server, on both backends.

use serde_json::json;
use tether_client::{Error, SessionQuery};
use tether_protocol::context::WorkingContext;
use tether_protocol::rest::{CreateSessionRequest, DispatchRequest};
use tether_tests::{TestDb, TestServer, backend_tests};

backend_tests!(the_client_drives_every_rest_endpoint);

async fn the_client_drives_every_rest_endpoint(db: TestDb) {
    let server = TestServer::start(&db).await;
    let client = server.client();
    let dir = tempfile::tempdir().unwrap();
    let created = client
        .create_session(&CreateSessionRequest {
            id: Some("sdk-1".into()),
            project: Some("sdk".into()),
            provider: None,
            working_directories: vec![dir.path().display().to_string()],
            title: None,
            config: None,
        })
        .await
        .unwrap();
    assert_eq!(created.resource, "ahp-session:/sdk-1");
    let page = client
        .sessions(&SessionQuery {
            project: Some("sdk".into()),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(page.items.len(), 1);

    let request = DispatchRequest {
        client_id: "sdk".into(),
        client_seq: 1,
        channel: None,
        action: json!({"type": "session/titleChanged", "title": "From the SDK"}),
    };
    let first = client.dispatch("sdk-1", &request).await.unwrap();
    let retry = client.dispatch("sdk-1", &request).await.unwrap();
    assert_eq!(first.server_seq, retry.server_seq, "a retry is safe");
    assert_eq!(
        client.session("sdk-1").await.unwrap().title.as_deref(),
        Some("From the SDK")
    );
    let transcript = client.transcript("sdk-1", 0, 100).await.unwrap();
    assert!(
        transcript
            .envelopes
            .iter()
            .any(|e| e["serverSeq"] == first.server_seq)
    );

    let refused = client
        .dispatch(
            "sdk-1",
            &DispatchRequest {
                client_seq: 2,
                action: json!({"type": "session/ready"}),
                ..request.clone()
            },
        )
        .await
        .unwrap_err();
    match refused {
        Error::Api {
            status,
            code,
            detail,
        } => {
            assert_eq!((status, code.as_str()), (422, "rejected"));
            assert!(detail.unwrap().contains("host-originated"));
        }
        other => panic!("expected a problem, got {other:?}"),
    }
    let missing = client.session("no-such").await.unwrap_err();
    assert!(matches!(missing, Error::Api { status: 404, ref code, .. } if code == "not_found"));
    let odd = client.session("a/b?c").await.unwrap_err();
    assert!(matches!(odd, Error::Api { status: 422, .. }), "{odd:?}");

    let tool = client.tool_context("sdk-1").await.unwrap();
    assert_eq!(tool.session_id.as_deref(), Some("sdk-1"));
    assert_eq!(tool.cwd.as_deref(), Some(dir.path().to_str().unwrap()));
    let not_resumable = client
        .resume(
            "sdk-1",
            &json!({"sessionId": "sdk-1", "cwd": dir.path(), "mcpServers": []}),
        )
        .await
        .unwrap_err();
    assert!(matches!(not_resumable, Error::Api { status: 409, .. }));

    let context = WorkingContext {
        goal: Some("Ship it".into()),
        ..Default::default()
    };
    client
        .save_working_context("sdk", "task-a", &context)
        .await
        .unwrap();
    let loaded = client.working_context("sdk", "task-b").await.unwrap();
    assert!(!loaded.found);
    assert_eq!(loaded.other_sessions, vec!["task-a".to_owned()]);
    assert_eq!(
        client.working_contexts("sdk").await.unwrap().sessions.len(),
        1
    );

    let closed = client.delete_session("sdk-1").await.unwrap();
    assert_eq!(closed.state.as_str(), "ended");
    server.stop().await;

    let unreachable =
        tether_client::Client::new(&format!("http://{}", server_addr_gone())).unwrap();
    assert!(matches!(
        unreachable.health().await,
        Err(Error::Unreachable(_))
    ));
    assert!(matches!(
        tether_client::Client::new("ftp://x"),
        Err(Error::InvalidUrl { .. })
    ));
}

/// An address nothing listens on: a port bound and released.
fn server_addr_gone() -> std::net::SocketAddr {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.local_addr().unwrap()
}
