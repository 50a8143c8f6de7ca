//! Usage reports through the real binary on both backends, with
//! authentication on: what agents report (`chat/usage`: a turn's tokens at
//! its end, the session's cost so far) is summed per project, principal,
//! agent and model, equals the sum of the transcripts' reports, stays
//! within the caller's projects, comes as CSV and from `tether usage`, and
//! is counted for Prometheus.

use std::process::Stdio;
use std::time::Duration;

use serde_json::{Value, json};
use tether_server::auth::Role;
use tether_server::auth::token::Authenticator;
use tether_tests::ahp_raw::Ahp;
use tether_tests::{ServerProcess, TestDb, backend_tests, metric_value, tether_bin};

backend_tests!(
    usage_is_summed_per_project_principal_agent_and_model,
    cost_is_summed_over_a_sessions_chats,
);

const FAKE: &str = env!("CARGO_BIN_EXE_fake-acp-agent");
const SECRET: &[u8] = b"a usage test secret that is long enough, 256 bits";

fn mint(sub: &str, role: Role, projects: &[&str]) -> String {
    let projects: Vec<String> = projects.iter().map(|p| (*p).to_owned()).collect();
    Authenticator::new(SECRET)
        .unwrap()
        .mint(sub, role, &projects, Duration::from_secs(600))
        .unwrap()
}

async fn get(base: &str, path: &str, token: &str) -> (u16, String) {
    let response = reqwest::Client::new()
        .get(format!("{base}{path}"))
        .bearer_auth(token)
        .send()
        .await
        .unwrap();
    (
        response.status().as_u16(),
        response.text().await.unwrap_or_default(),
    )
}

async fn report(base: &str, query: &str, token: &str) -> Value {
    let (status, body) = get(base, &format!("/v1/usage{query}"), token).await;
    assert_eq!(status, 200, "{query}: {body}");
    serde_json::from_str(&body).unwrap()
}

/// An operator's AHP connection with a session of `project` running the
/// fake agent.
async fn session_of(server: &ServerProcess, token: &str, id: &str, project: &str) -> Ahp {
    let mut ahp = Ahp::connect(
        &format!("{}?access_token={token}", server.ws_url()),
        &format!("usage-{id}"),
    )
    .await;
    ahp.call(
        "createSession",
        json!({"channel": format!("ahp-session:/{id}"), "provider": "fake",
               "_meta": {"tether/project": project}}),
    )
    .await
    .unwrap();
    ahp.call(
        "subscribe",
        json!({"channel": format!("ahp-chat:/{id}.main")}),
    )
    .await
    .unwrap();
    ahp
}

/// Sums the `chat/usage` actions of a session's transcript: tokens of each
/// report, and the session's cost as last reported (ACP's is cumulative).
async fn reported(base: &str, id: &str, token: &str) -> (u64, u64, f64) {
    let (_, body) = get(
        base,
        &format!("/v1/sessions/{id}/transcript?limit=1000"),
        token,
    )
    .await;
    let page: Value = serde_json::from_str(&body).unwrap();
    let (mut input, mut output, mut cost) = (0, 0, 0.0);
    for envelope in page["envelopes"].as_array().unwrap() {
        let action = &envelope["action"];
        if action["type"] == "chat/usage" {
            let usage = &action["usage"];
            input += usage["inputTokens"].as_u64().unwrap_or(0);
            output += usage["outputTokens"].as_u64().unwrap_or(0);
            if let Some(amount) = usage.pointer("/_meta/tether~1cost/amount") {
                cost = amount.as_f64().unwrap();
            }
        }
    }
    (input, output, cost)
}

async fn usage_is_summed_per_project_principal_agent_and_model(db: TestDb) {
    let dir = tempfile::tempdir().unwrap();
    let secret = dir.path().join("secret");
    std::fs::write(&secret, SECRET).unwrap();
    let log = dir.path().join("agent.log");
    let server = ServerProcess::start(
        &db,
        &[
            "--auth-secret-file",
            secret.to_str().unwrap(),
            "--agent",
            &format!("fake=FAKE_ACP_LOG={} {FAKE}", log.display()),
            "--agent-confinement",
            "off",
        ],
    )
    .await;
    let base = server.base_url();
    let alice = mint("alice", Role::Operator, &["books", "farm"]);
    let bob = mint("bob", Role::Operator, &["farm"]);
    let viewer = mint("vera", Role::Viewer, &["books"]);
    let admin = mint("root", Role::Admin, &[]);

    // Alice: two turns in books; Bob: one in farm.
    let mut a = session_of(&server, &alice, "ledger", "books").await;
    a.ask("ahp-chat:/ledger.main", "t1", "usage", None).await;
    a.ask("ahp-chat:/ledger.main", "t2", "usage", None).await;
    let mut b = session_of(&server, &bob, "barn", "farm").await;
    b.ask("ahp-chat:/barn.main", "t1", "usage", None).await;

    // The transcripts' own reports.
    let ledger = reported(&base, "ledger", &admin).await;
    let barn = reported(&base, "barn", &admin).await;
    assert_eq!(ledger, (2000, 1000, 0.042), "two turns of 1000 in, 500 out");
    assert_eq!(barn, (1000, 500, 0.042));

    // Per project, equal to them.
    let by_project = report(&base, "?by=project", &admin).await;
    let rows = by_project["rows"].as_array().unwrap();
    assert_eq!(rows.len(), 2, "{by_project}");
    for (row, (project, (input, output, cost), sessions)) in
        rows.iter().zip([("books", ledger, 1), ("farm", barn, 1)])
    {
        assert_eq!(row["project"], project, "{row}");
        assert_eq!(row["inputTokens"], input, "{row}");
        assert_eq!(row["outputTokens"], output, "{row}");
        assert!((row["cost"].as_f64().unwrap() - cost).abs() < 1e-9, "{row}");
        assert_eq!(row["currency"], "USD");
        assert_eq!(row["sessions"], sessions);
        assert!(row.get("principal").is_none(), "not grouped by it");
    }
    // Per principal, agent and model: who started the turns.
    let by_all = report(&base, "?by=principal,agent,model", &admin).await;
    let mut who: Vec<(String, String, u64)> = by_all["rows"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            assert!(r["model"].is_string(), "{r}");
            (
                r["principal"].as_str().unwrap().to_owned(),
                r["agent"].as_str().unwrap().to_owned(),
                r["inputTokens"].as_u64().unwrap(),
            )
        })
        .collect();
    who.sort();
    assert_eq!(
        who,
        [
            ("alice".into(), "fake".into(), 2000),
            ("bob".into(), "fake".into(), 1000)
        ]
    );
    // One total; a range with nothing in it.
    let total = report(&base, "?by=", &admin).await;
    assert_eq!(total["rows"][0]["inputTokens"], 3000, "{total}");
    assert!((total["rows"][0]["cost"].as_f64().unwrap() - 0.084).abs() < 1e-9);
    let later = report(&base, "?since=2099-01-01T00:00:00Z", &admin).await;
    assert_eq!(later["rows"], json!([]));
    assert_eq!(later["since"], "2099-01-01T00:00:00.000Z");

    // Each caller sees only its projects; a viewer none.
    let bobs = report(&base, "", &bob).await;
    let projects: Vec<&str> = bobs["rows"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["project"].as_str().unwrap())
        .collect();
    assert_eq!(projects, ["farm"]);
    let foreign = report(&base, "?project=books", &bob).await;
    assert_eq!(foreign["rows"], json!([]));
    let (status, body) = get(&base, "/v1/usage", &viewer).await;
    assert_eq!(status, 403, "{body}");
    for bad in [
        "?by=cost",
        "?since=yesterday",
        "?format=xml",
        "?project=no%20spaces",
    ] {
        let (status, body) = get(&base, &format!("/v1/usage{bad}"), &admin).await;
        assert_eq!(status, 422, "{bad}: {body}");
    }

    // CSV, over REST and from the command line.
    let (status, csv) = get(&base, "/v1/usage?by=project&format=csv", &admin).await;
    assert_eq!(status, 200);
    assert_eq!(
        csv,
        "project,currency,input_tokens,output_tokens,cost,reports,sessions\r\n\
         books,USD,2000,1000,0.042000,3,1\r\n\
         farm,USD,1000,500,0.042000,2,1\r\n"
    );
    let cli = tokio::process::Command::new(tether_bin())
        .args(["usage", "--url", &base, "--token", &admin, "--csv"])
        .env("XDG_STATE_HOME", dir.path())
        .stdin(Stdio::null())
        .output()
        .await
        .unwrap();
    assert!(cli.status.success(), "{cli:?}");
    assert_eq!(String::from_utf8_lossy(&cli.stdout), csv);
    let table = tokio::process::Command::new(tether_bin())
        .args([
            "usage",
            "--url",
            &base,
            "--token",
            &bob,
            "--by",
            "project,principal",
        ])
        .env("XDG_STATE_HOME", dir.path())
        .stdin(Stdio::null())
        .output()
        .await
        .unwrap();
    let printed = String::from_utf8_lossy(&table.stdout);
    assert!(table.status.success(), "{table:?}");
    assert!(printed.starts_with("PROJECT · PRINCIPAL"), "{printed}");
    assert!(
        printed.contains("farm · bob") && printed.contains("0.0420 USD"),
        "{printed}"
    );
    assert!(!printed.contains("books"), "{printed}");

    // Prometheus counts what this host committed.
    let (status, metrics) = get(&base, "/metrics", &admin).await;
    assert_eq!(status, 200);
    let tokens = metric_value(
        &metrics,
        r#"tether_usage_tokens_total{project="books",agent="fake",direction="input"}"#,
    );
    assert_eq!(tokens, Some(2000.0), "{metrics}");
    let cost = metric_value(
        &metrics,
        r#"tether_usage_cost_total{project="farm",agent="fake",currency="USD"}"#,
    );
    assert!((cost.unwrap_or_default() - 0.042).abs() < 1e-9, "{metrics}");
}

/// ACP's cost is each agent session's so far, and each chat has its own:
/// a session's cost is the sum of its chats', and the ledger counts what
/// each chat spent since its own last report (not since another chat's).
async fn cost_is_summed_over_a_sessions_chats(db: TestDb) {
    let dir = tempfile::tempdir().unwrap();
    let secret = dir.path().join("secret");
    std::fs::write(&secret, SECRET).unwrap();
    let mut server = ServerProcess::start(
        &db,
        &[
            "--auth-secret-file",
            secret.to_str().unwrap(),
            "--agent",
            &format!("fake={FAKE}"),
            "--agent-confinement",
            "off",
        ],
    )
    .await;
    let base = server.base_url();
    let alice = mint("alice", Role::Operator, &["books"]);
    let admin = mint("root", Role::Admin, &[]);
    let mut ahp = session_of(&server, &alice, "chats", "books").await;
    let side = "ahp-chat:/chats-side";
    ahp.call(
        "createChat",
        json!({"channel": "ahp-session:/chats", "chat": side}),
    )
    .await
    .unwrap();
    ahp.call("subscribe", json!({"channel": side}))
        .await
        .unwrap();
    // Main spends 0.25, the side chat 0.25, main 0.25 more (0.50 so far).
    let main = "ahp-chat:/chats.main";
    for (chat, turn, said) in [
        (main, "t1", "spent 25"),
        (side, "s1", "spent 25"),
        (main, "t2", "spent 50"),
    ] {
        let answer = ahp.ask(chat, turn, "spend", None).await;
        assert!(answer.contains(said), "{chat} {turn}: {answer}");
    }
    let (status, body) = get(&base, "/v1/sessions/chats", &admin).await;
    assert_eq!(status, 200, "{body}");
    let view: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(
        view["projection"]["usage"]["cost"],
        json!({"amount": 0.75, "currency": "USD"}),
        "{view}"
    );
    let total = report(&base, "?by=", &admin).await;
    let cost = total["rows"][0]["cost"].as_f64().unwrap();
    assert!((cost - 0.75).abs() < 1e-9, "the ledger: {total}");
    // A restarted host folds the same.
    server.restart().await;
    let (_, body) = get(&server.base_url(), "/v1/sessions/chats", &admin).await;
    let view: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(
        view["projection"]["usage"]["cost"]["amount"], 0.75,
        "{view}"
    );
}
