//! Invariant 5: the read model the server keeps incrementally equals a fresh
//! fold of the stored transcript, after a long random sequence of actions;
//! and `tether rebuild-projections` repairs a row that drifted.

use std::process::Command;
use std::time::Duration;

use serde_json::{Value, json};
use tether_server::config::{EffectsConfig, ServeConfig};
use tether_server::engine::rebuild::{load_model, rebuild_projections};
use tether_server::store::SessionRecord;
use tether_tests::{Backend, TestDb, TestServer, backend_tests, tether_bin};

backend_tests!(the_read_model_equals_a_fresh_fold_after_random_actions);

/// A small deterministic generator (no dependency, reproducible by seed).
struct Lcg(u64);

impl Lcg {
    fn next(&mut self) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        self.0 >> 33
    }

    fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[(self.next() % items.len() as u64) as usize]
    }
}

async fn post(http: &reqwest::Client, url: String, body: Value) -> (u16, Value) {
    let response = http.post(url).json(&body).send().await.unwrap();
    let status = response.status().as_u16();
    (status, response.json().await.unwrap_or(Value::Null))
}

async fn get(http: &reqwest::Client, url: String) -> Value {
    http.get(url).send().await.unwrap().json().await.unwrap()
}

/// The fields of a view the fold decides (state aside, which depends on
/// whether an agent is attached right now).
fn folded_fields(view: &Value) -> Value {
    json!({
        "projection": view["projection"],
        "title": view["title"],
        "turns": view["turns"],
        "resumable": view["resumable"],
        "workingDirectories": view["workingDirectories"],
        "status": view["status"],
        "lastSeq": view["lastSeq"],
    })
}

async fn the_read_model_equals_a_fresh_fold_after_random_actions(db: TestDb) {
    const STEPS: usize = 300;
    let config = ServeConfig {
        effects: EffectsConfig::Agent,
        ..ServeConfig::default()
    };
    let store = db.open().await;
    let server = TestServer::start_with(store.clone(), config).await;
    let http = reqwest::Client::new();
    let base = server.base_url();
    let sessions = ["rnd-a", "rnd-b", "rnd-c"];
    for id in sessions {
        let (status, _) = post(
            &http,
            format!("{base}/v1/sessions"),
            json!({"id": id, "workingDirectories": ["/w/0"]}),
        )
        .await;
        assert_eq!(status, 201);
    }
    let dirs = [
        "file:///w/0",
        "file:///w/1",
        "file:///w/2",
        "file:///w/3",
        "file:///w/1/../2",
        "https://nope",
    ];
    let mut rng = Lcg(0x7e7e_2026);
    let mut accepted = 0;
    for step in 0..STEPS {
        let id = *rng.pick(&sessions);
        let (channel, action) = match rng.next() % 6 {
            0 => (
                None,
                json!({"type": "session/titleChanged", "title": format!("title {step}")}),
            ),
            1 => (
                Some(format!("ahp-chat:/{id}.main")),
                json!({"type": "chat/turnStarted", "turnId": format!("t{step}"), "startedAt": "2026-11-29T10:00:00.000Z",
                       "message": {"text": format!("  turn number {step} with some text  "), "origin": {"kind": "user"}}}),
            ),
            2 => (
                None,
                json!({"type": "session/workingDirectorySet", "directory": rng.pick(&dirs)}),
            ),
            3 => (
                None,
                json!({"type": "session/workingDirectoryRemoved", "directory": rng.pick(&dirs)}),
            ),
            4 => (
                None,
                json!({"type": "session/workingDirectoryReplaced", "directory": rng.pick(&dirs), "replacement": rng.pick(&dirs)}),
            ),
            _ => (
                None,
                json!({"type": "session/isReadChanged", "isRead": rng.next().is_multiple_of(2)}),
            ),
        };
        let mut body = json!({"clientId": "fuzzer", "clientSeq": step, "action": action});
        if let Some(channel) = channel {
            body["channel"] = json!(channel);
        }
        let (status, _) = post(&http, format!("{base}/v1/sessions/{id}/actions"), body).await;
        assert!(
            status == 200 || status == 422 || status == 409,
            "step {step}: {status}"
        );
        if status == 200 {
            accepted += 1;
        }
    }
    assert!(
        accepted > STEPS / 3,
        "the sequence exercised the fold ({accepted} accepted)"
    );
    // Let the echo agent finish its answers.
    for id in sessions {
        for _ in 0..200 {
            let view = get(&http, format!("{base}/v1/sessions/{id}")).await;
            if view["projection"]["openTurnId"].is_null() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    for id in sessions {
        let served = get(&http, format!("{base}/v1/sessions/{id}")).await;
        let model = load_model(store.as_ref(), id, false)
            .await
            .unwrap()
            .unwrap();
        let live = served["state"] == "live";
        let view =
            serde_json::to_value(tether_protocol::view::SessionView::of(&model, live, "")).unwrap();
        assert_eq!(
            folded_fields(&served),
            folded_fields(&view),
            "session {id}: incremental != fold"
        );
        assert_eq!(served["state"], view["state"]);
        // The snapshot path (snapshot + tail) folds to the same model.
        let from_snapshot = load_model(store.as_ref(), id, true).await.unwrap().unwrap();
        assert_eq!(
            from_snapshot, model,
            "snapshot + tail != whole fold for {id}"
        );
    }
    // Settle them so no agent is attached, then stop the server.
    for id in sessions {
        let response = http
            .delete(format!("{base}/v1/sessions/{id}"))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 200);
    }
    server.stop().await;

    // Nothing to repair after a clean run ...
    let store = db.open().await;
    let report = rebuild_projections(store.as_ref()).await.unwrap();
    assert_eq!((report.sessions, report.changed), (3, 0));
    // ... and a drifted row is put right.
    let row = store.session("rnd-b").await.unwrap().unwrap();
    let drifted = SessionRecord {
        turns: 9_999,
        title: Some("drifted".into()),
        ..row.record.clone()
    };
    assert!(store.replace_session_record(&drifted).await.unwrap());
    store.close().await;
    if db.backend() == Backend::Sqlite {
        // Through the real binary.
        let output = Command::new(tether_bin())
            .args(["rebuild-projections", "--database-url", db.url()])
            .env_remove("TETHER_DATABASE_URL")
            .output()
            .unwrap();
        assert!(
            output.status.success(),
            "{}",
            String::from_utf8_lossy(&output.stderr)
        );
        let stdout = String::from_utf8_lossy(&output.stdout);
        assert!(
            stdout.contains("rebuilt 3 session projections; 1 read-model rows differed"),
            "{stdout}"
        );
    } else {
        let store = db.open().await;
        assert_eq!(
            rebuild_projections(store.as_ref()).await.unwrap().changed,
            1
        );
        store.close().await;
    }
    let store = db.open().await;
    let repaired = store.session("rnd-b").await.unwrap().unwrap().record;
    let view = |r: &SessionRecord| {
        let mut v: Value = serde_json::from_str(&r.projection).unwrap();
        v.as_object_mut().unwrap().remove("lastSeq");
        v.as_object_mut().unwrap().remove("updatedAt");
        v
    };
    assert_eq!(view(&repaired), view(&row.record));
    assert_eq!(
        (repaired.turns, &repaired.title),
        (row.record.turns, &row.record.title)
    );
    store.close().await;
}
