//! Hostile input over REST, on both backends: every such request answers a
//! 4xx problem document that names the problem, and changes nothing (no
//! session created, nothing appended, nothing saved).

use reqwest::StatusCode;
use serde_json::{Value, json};
use tether_tests::{TestDb, TestServer, backend_tests};

backend_tests!(
    bodies_that_are_not_objects_are_refused_on_every_route,
    integers_out_of_range_are_422_naming_the_field_and_range,
    bad_names_ids_and_client_ids_are_refused,
    empty_working_contexts_are_refused,
);

/// The seeded session every test works against.
const SESSION: &str = "target-1";

/// One answer: status, whether it was problem+json, and the body.
struct Answer {
    status: StatusCode,
    problem: bool,
    body: Value,
}

impl Answer {
    /// Asserts a problem document with this status; returns its detail.
    fn refused(&self, status: u16, what: &str) -> String {
        assert_eq!(self.status.as_u16(), status, "{what}: {}", self.body);
        assert!(self.problem, "{what}: an error is problem+json");
        assert!(self.body["code"].is_string(), "{what}: {}", self.body);
        assert_eq!(self.body["status"], status, "{what}");
        self.body["detail"].as_str().unwrap_or_default().to_owned()
    }
}

struct Api {
    base: String,
    http: reqwest::Client,
}

impl Api {
    fn new(server: &TestServer) -> Self {
        Self {
            base: server.base_url(),
            http: reqwest::Client::new(),
        }
    }

    /// Sends `body` as it is, with `content_type` when given.
    async fn raw(
        &self,
        method: reqwest::Method,
        path: &str,
        content_type: Option<&str>,
        body: Option<&str>,
    ) -> Answer {
        let mut request = self.http.request(method, format!("{}{path}", self.base));
        if let Some(content_type) = content_type {
            request = request.header("content-type", content_type);
        }
        if let Some(body) = body {
            request = request.body(body.to_owned());
        }
        let response = request.send().await.unwrap();
        let status = response.status();
        let problem = response
            .headers()
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.starts_with("application/problem+json"));
        let text = response.text().await.unwrap();
        let body = serde_json::from_str(&text).unwrap_or(Value::String(text));
        Answer {
            status,
            problem,
            body,
        }
    }

    async fn json(&self, method: reqwest::Method, path: &str, body: &str) -> Answer {
        self.raw(method, path, Some("application/json"), Some(body))
            .await
    }

    async fn get(&self, path: &str) -> Answer {
        self.raw(reqwest::Method::GET, path, None, None).await
    }

    /// What the tests compare before and after: every session id, the
    /// seeded session's transcript, and one working context.
    async fn state(&self) -> Value {
        let sessions = self.get("/v1/sessions?limit=1000").await;
        assert_eq!(sessions.status, 200, "{}", sessions.body);
        let mut ids: Vec<String> = sessions.body["items"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| s["id"].as_str().unwrap().to_owned())
            .collect();
        ids.sort();
        let transcript = self
            .get(&format!("/v1/sessions/{SESSION}/transcript?limit=1000"))
            .await;
        assert_eq!(transcript.status, 200, "{}", transcript.body);
        let context = self
            .get("/v1/projects/p1/sessions/s1/working-context")
            .await;
        assert_eq!(context.status, 200, "{}", context.body);
        json!({
            "sessions": ids,
            "transcript": transcript.body["envelopes"],
            "context": context.body,
        })
    }
}

/// A server with one session (`SESSION`, with a real working directory, so
/// resume can reach it) and one saved working context (`p1/s1`).
async fn seeded(db: &TestDb) -> (TestServer, Api, tempfile::TempDir) {
    let server = TestServer::start(db).await;
    let api = Api::new(&server);
    let dir = tempfile::tempdir().unwrap();
    let body = json!({"id": SESSION, "project": "p1", "workingDirectories": [dir.path()]});
    let created = api
        .json(reqwest::Method::POST, "/v1/sessions", &body.to_string())
        .await;
    assert_eq!(created.status, 201, "{}", created.body);
    let saved = api
        .json(
            reqwest::Method::PUT,
            "/v1/projects/p1/sessions/s1/working-context",
            r#"{"goal": "keep me"}"#,
        )
        .await;
    assert_eq!(saved.status, 200, "{}", saved.body);
    (server, api, dir)
}

/// Every route that takes a body, with its method.
fn body_routes() -> Vec<(reqwest::Method, String)> {
    vec![
        (reqwest::Method::POST, "/v1/sessions".to_owned()),
        (
            reqwest::Method::POST,
            format!("/v1/sessions/{SESSION}/actions"),
        ),
        (
            reqwest::Method::POST,
            format!("/v1/sessions/{SESSION}/resume"),
        ),
        (
            reqwest::Method::PUT,
            "/v1/projects/p1/sessions/s1/working-context".to_owned(),
        ),
    ]
}

async fn bodies_that_are_not_objects_are_refused_on_every_route(db: TestDb) {
    let (server, api, _dir) = seeded(&db).await;
    let before = api.state().await;
    for (method, path) in body_routes() {
        for body in [
            "[null, null]",
            "[]",
            "[{}]",
            "null",
            "true",
            "7",
            "\"text\"",
        ] {
            let answer = api.json(method.clone(), &path, body).await;
            let detail = answer.refused(422, &format!("{method} {path} {body}"));
            assert!(
                detail.contains("must be a JSON object"),
                "{method} {path} {body}: {detail}"
            );
            assert_eq!(answer.body["code"], "body_not_an_object");
        }
        // Broken before any field is read, so every route sees a syntax error.
        for body in ["{", "", "[1,", "{,}", "{]", "nul", "\u{feff}{}"] {
            let answer = api.json(method.clone(), &path, body).await;
            answer.refused(400, &format!("{method} {path} {body:?}"));
        }
        // Not declared as JSON: 415, whatever the body.
        for content_type in [
            None,
            Some("text/plain"),
            Some("application/x-www-form-urlencoded"),
        ] {
            let answer = api
                .raw(method.clone(), &path, content_type, Some("{}"))
                .await;
            answer.refused(415, &format!("{method} {path} {content_type:?}"));
        }
    }
    // Over the body limit (2 MiB by default), declared up front: the limit
    // layer answers, as a problem document too.
    // Only the head is sent: the server answers from `Content-Length`
    // without reading the body (a client still writing a body the server
    // will not read may see its connection closed under it instead).
    for (method, path) in body_routes() {
        let head = oversize_head(&api.base, method.as_str(), &path, 3 * 1024 * 1024).await;
        assert!(head.starts_with("HTTP/1.1 413"), "{method} {path}: {head}");
        assert!(
            head.to_ascii_lowercase()
                .contains("content-type: application/problem+json"),
            "{method} {path}: {head}"
        );
    }
    // A method a route lacks: 405 with Allow, as a problem document.
    for path in ["/v1/sessions", "/v1/sessions/target-1/actions", "/healthz"] {
        let response = api
            .http
            .request(reqwest::Method::PATCH, format!("{}{path}", api.base))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 405, "{path}");
        assert!(response.headers().contains_key("allow"), "{path}");
        let content_type = response.headers()["content-type"]
            .to_str()
            .unwrap()
            .to_owned();
        assert!(
            content_type.starts_with("application/problem+json"),
            "{path}"
        );
    }
    assert_eq!(api.state().await, before, "nothing changed");
    server.stop().await;
}

async fn integers_out_of_range_are_422_naming_the_field_and_range(db: TestDb) {
    let (server, api, _dir) = seeded(&db).await;
    let before = api.state().await;
    let actions = format!("/v1/sessions/{SESSION}/actions");
    for seq in [
        "9223372036854775808",
        "18446744073709551615",
        "18446744073709551616",
        "1e30",
        "-1",
        "1.5",
        "\"1\"",
        "null",
    ] {
        let body = format!(
            r#"{{"clientId": "c", "clientSeq": {seq}, "action": {{"type": "session/titleChanged", "title": "x"}}}}"#
        );
        let answer = api.json(reqwest::Method::POST, &actions, &body).await;
        let detail = answer.refused(422, &format!("clientSeq {seq}"));
        assert!(
            detail.contains("clientSeq") && detail.contains("0 to 9223372036854775807"),
            "clientSeq {seq}: {detail}"
        );
    }
    let mut queries = vec![];
    for (param, range) in [
        ("limit", "1 to 1000"),
        ("after", "0 to 9223372036854775807"),
    ] {
        for value in [
            "-1",
            "1.5",
            "abc",
            "",
            "%2B1",
            "9223372036854775808",
            "99999999999999999999999",
        ] {
            queries.push((
                format!("/v1/sessions/{SESSION}/transcript?{param}={value}"),
                format!("{param} must be an integer from {range}"),
            ));
        }
    }
    for value in ["0", "1001"] {
        queries.push((
            format!("/v1/sessions?limit={value}"),
            "limit must be an integer from 1 to 1000".to_owned(),
        ));
    }
    for value in ["abc", "-1", "12345678901234567890", ""] {
        queries.push((format!("/v1/sessions?cursor={value}"), "cursor".to_owned()));
    }
    for (path, expected) in queries {
        let detail = api.get(&path).await.refused(422, &path);
        assert!(detail.contains(&expected), "{path}: {detail}");
    }
    assert_eq!(api.state().await, before, "nothing changed");

    // The largest clientSeq itself is accepted, once.
    let body = r#"{"clientId": "c", "clientSeq": 9223372036854775807, "action": {"type": "session/titleChanged", "title": "max"}}"#;
    let answer = api.json(reqwest::Method::POST, &actions, body).await;
    assert_eq!(answer.status, 200, "{}", answer.body);
    let again = api.json(reqwest::Method::POST, &actions, body).await;
    assert_eq!(again.status, 200, "a retry answers the original outcome");
    assert_eq!(again.body["serverSeq"], answer.body["serverSeq"]);
    let page = api
        .get(&format!(
            "/v1/sessions/{SESSION}/transcript?after=9223372036854775807"
        ))
        .await;
    assert_eq!(page.status, 200, "{}", page.body);
    assert_eq!(page.body["envelopes"], json!([]));
    server.stop().await;
}

async fn bad_names_ids_and_client_ids_are_refused(db: TestDb) {
    let (server, api, _dir) = seeded(&db).await;
    let before = api.state().await;
    let long = "a".repeat(129);
    for body in [
        json!({"id": "a b"}),
        json!({"id": ""}),
        json!({"id": long}),
        json!({"id": "é"}),
        json!({"project": "x/y"}),
        json!({"project": ""}),
        json!({"workingDirectories": ["relative"]}),
        json!({"workingDirectories": ["file://elsewhere/x"]}),
        json!({"workingDirectories": ["file:///a%2"]}),
        json!({"workingDirectories": [7]}),
        json!({"provider": "nobody"}),
        json!({"title": 7}),
        json!({"unknown": true}),
    ] {
        let answer = api
            .json(reqwest::Method::POST, "/v1/sessions", &body.to_string())
            .await;
        answer.refused(422, &body.to_string());
    }
    let actions = format!("/v1/sessions/{SESSION}/actions");
    let title = json!({"type": "session/titleChanged", "title": "x"});
    for body in [
        json!({"clientId": "", "clientSeq": 1, "action": title}),
        json!({"clientId": "é".repeat(257), "clientSeq": 1, "action": title}),
        json!({"clientId": 7, "clientSeq": 1, "action": title}),
        json!({"clientSeq": 1, "action": title}),
        json!({"clientId": "c", "clientSeq": 1, "action": [title]}),
        json!({"clientId": "c", "clientSeq": 1, "action": title, "channel": "ahp-session:/other"}),
        json!({"clientId": "c", "clientSeq": 1, "action": title, "channel": "nonsense"}),
        json!({"clientId": "c", "clientSeq": 1, "action": title, "channel": "ahp-chat:/not-ours"}),
        json!({"clientId": "c", "clientSeq": 1, "action": {"type": "session/nonsense"}}),
    ] {
        let answer = api
            .json(reqwest::Method::POST, &actions, &body.to_string())
            .await;
        answer.refused(422, &body.to_string());
    }
    // 256 characters of a two-byte letter are 512 bytes and still allowed:
    // the limit counts characters, as the OpenAPI document's maxLength does.
    let body = json!({"clientId": "é".repeat(256), "clientSeq": 1, "action": {"type": "session/nonsense"}});
    let answer = api
        .json(reqwest::Method::POST, &actions, &body.to_string())
        .await;
    let detail = answer.refused(422, "256 two-byte characters");
    assert!(!detail.contains("clientId"), "{detail}");
    for path in [
        "/v1/sessions/bad%20id",
        "/v1/sessions/%C3%A9",
        "/v1/projects/a%2Fb/working-contexts",
        "/v1/projects/p1/sessions/x%20y/working-context",
    ] {
        api.get(path).await.refused(422, path);
    }
    let path = format!("/v1/sessions/{long}");
    api.get(&path).await.refused(422, "a 129-character id");
    assert_eq!(api.state().await, before, "nothing changed");
    server.stop().await;
}

async fn empty_working_contexts_are_refused(db: TestDb) {
    let (server, api, _dir) = seeded(&db).await;
    let before = api.state().await;
    let path = "/v1/projects/p1/sessions/s1/working-context";
    for body in [
        json!({}),
        json!({"goal": ""}),
        json!({"goal": " \t\r\n"}),
        json!({"goal": null, "decisions": [], "pendingActions": []}),
        json!({"unknownField": "is not content"}),
    ] {
        let answer = api
            .json(reqwest::Method::PUT, path, &body.to_string())
            .await;
        answer.refused(422, &body.to_string());
        assert_eq!(answer.body["code"], "empty_working_context", "{body}");
    }
    for body in [
        json!({"goal": 7}),
        json!({"pendingActions": "one"}),
        json!({"decisions": [1]}),
        json!({"activeConstraints": [{"source": {}}]}),
    ] {
        let answer = api
            .json(reqwest::Method::PUT, path, &body.to_string())
            .await;
        answer.refused(422, &body.to_string());
    }
    assert_eq!(api.state().await, before, "nothing changed");
    server.stop().await;
}

/// Sends only the head of a request declaring a `length`-byte JSON body and
/// returns the head of the answer.
async fn oversize_head(base: &str, method: &str, path: &str, length: usize) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let host = base.trim_start_matches("http://");
    let mut tcp = tokio::net::TcpStream::connect(host).await.unwrap();
    let head = format!(
        "{method} {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n\
         Content-Length: {length}\r\nConnection: close\r\n\r\n"
    );
    tcp.write_all(head.as_bytes()).await.unwrap();
    let mut answer = Vec::new();
    let mut buffer = [0_u8; 4096];
    while !answer.windows(4).any(|w| w == b"\r\n\r\n") {
        let n = tokio::time::timeout(std::time::Duration::from_secs(10), tcp.read(&mut buffer))
            .await
            .expect("an answer in time")
            .unwrap();
        if n == 0 {
            break;
        }
        answer.extend_from_slice(&buffer[..n]);
    }
    String::from_utf8_lossy(&answer).into_owned()
}
