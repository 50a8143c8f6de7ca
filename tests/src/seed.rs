//! A large database, fast: sessions created by the real server, then many
//! envelopes appended through the store API in large batches, each batch
//! carrying the read-model rows, archived turns and snapshots the server
//! itself would have written (the same fold computes them), so the result
//! passes every check `tether migrate` makes.
//!
//! Through the server, a million envelopes would take minutes of REST
//! round trips; through `Store::append` in batches of 5,000 they take
//! seconds.

use futures_util::StreamExt;
use serde_json::{Value, json};
use tether_protocol::model::{SessionModel, typed_action};
use tether_protocol::rest::CreateSessionRequest;
use tether_server::config::ServeConfig;
use tether_server::engine::rebuild::{load_model, record_of};
use tether_server::store::{self, NewEnvelope, Origin, Snapshot, StoreOptions};

use crate::TestServer;

/// Envelopes per append: one transaction each.
const BATCH: usize = 5_000;

/// Envelopes of a session between two of its snapshots, as the server's
/// default `--snapshot-every`.
const SNAPSHOT_EVERY: u64 = 256;

/// What was written.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Seeded {
    /// Sessions created.
    pub sessions: usize,
    /// Envelopes appended after the sessions were created.
    pub envelopes: u64,
    /// Turns moved into the archive.
    pub archived_turns: usize,
    /// Snapshots written (the store keeps the newest two per channel).
    pub snapshots: usize,
}

/// Fills the database at `url` (SQLite or Postgres, empty or not) with
/// `sessions` new sessions and then `envelopes` envelopes spread over them
/// round-robin: titles (with durable origins), and turns with their
/// completion on each session's default chat (about 200 bytes each), with
/// the search documents the server writes (a message names one of 997
/// topics and one of 100,003 tickets, for search benchmarks).
pub async fn seed(url: &str, sessions: usize, envelopes: u64) -> Seeded {
    let open = || async {
        // SQLite's file lock is released when the stopped server closes its
        // store; once in CI it was still held a moment later. The likeliest
        // holder: a process another test spawned then, which holds a copy
        // of the lock's descriptor from its fork until its exec.
        let mut attempts = 0;
        loop {
            match store::open(url, &StoreOptions::default()).await {
                Ok(store) => break store,
                Err(e) if attempts < 50 && e.to_string().contains("already serves this file") => {
                    attempts += 1;
                    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                }
                Err(e) => panic!("open {url}: {e}"),
            }
        }
    };
    let server = TestServer::start_with(open().await, ServeConfig::default()).await;
    let client = server.client();
    let ids: Vec<String> = (0..sessions).map(|i| format!("seed-{i:05}")).collect();
    futures_util::stream::iter(&ids)
        .map(|id| {
            let client = &client;
            async move {
                let request = CreateSessionRequest {
                    id: Some(id.clone()),
                    project: Some(format!("project-{}", id.len() % 3)),
                    provider: None,
                    working_directories: Vec::new(),
                    title: Some(format!("seeded session {id}")),
                    config: None,
                };
                client
                    .create_session(&request)
                    .await
                    .expect("create a session");
            }
        })
        .buffer_unordered(8)
        .collect::<Vec<()>>()
        .await;
    server.stop().await;

    let store = open().await;
    let mut models = Vec::with_capacity(sessions);
    for id in &ids {
        let model = load_model(store.as_ref(), id, false)
            .await
            .expect("fold a new session")
            .expect("the session exists");
        models.push(model);
    }
    let mut open_turn: Vec<Option<String>> = vec![None; sessions];
    let mut since_snapshot = vec![0_u64; sessions];
    let mut seeded = Seeded {
        sessions,
        ..Seeded::default()
    };
    let mut next_seq = store.host().await.expect("host").last_seq + 1;
    let mut written = 0_u64;
    while written < envelopes {
        let count = BATCH.min((envelopes - written) as usize);
        let mut batch = Vec::with_capacity(count);
        let mut snapshots = Vec::new();
        let mut last_of = vec![None; sessions];
        for _ in 0..count {
            let i = (written % sessions as u64) as usize;
            let n = written / sessions as u64;
            let model = &mut models[i];
            let (channel, action, origin) = next_action(model, &mut open_turn[i], n, written);
            model.apply(&channel, &action, &typed_action(&action));
            model.last_seq = next_seq;
            let turns = model.take_trimmed();
            seeded.archived_turns += turns.len();
            let search = tether_protocol::search::doc(model, &channel, &action);
            batch.push(NewEnvelope {
                channel,
                session_id: Some(model.id.clone()),
                action: action.to_string(),
                origin,
                session: None,
                chats: Vec::new(),
                turns,
                directed: None,
                owner: None,
                search,
                usage: None,
                events: Vec::new(),
            });
            last_of[i] = Some(batch.len() - 1);
            since_snapshot[i] += 1;
            if since_snapshot[i] >= SNAPSHOT_EVERY {
                since_snapshot[i] = 0;
                snapshots.push(Snapshot {
                    channel: model.uri(),
                    seq: next_seq,
                    state: serde_json::to_string(model).expect("a model serialises"),
                    at_ms: 0,
                });
            }
            next_seq += 1;
            written += 1;
        }
        // Each session's last envelope of the batch carries its row, as
        // the session actor writes it.
        for (i, last) in last_of.iter().enumerate() {
            if let Some(at) = last {
                batch[*at].session = Some(record_of(&models[i], false, ""));
            }
        }
        seeded.snapshots += snapshots.len();
        store
            .append_with_snapshots(std::sync::Arc::new(batch), snapshots)
            .await
            .expect("append a batch");
    }
    seeded.envelopes = written;
    store.close().await;
    seeded
}

/// The `n`th action of a session: a title, or the next step of a turn.
fn next_action(
    model: &SessionModel,
    open_turn: &mut Option<String>,
    n: u64,
    global: u64,
) -> (String, Value, Option<Origin>) {
    let chat = model
        .session
        .default_chat
        .clone()
        .unwrap_or_else(|| format!("ahp-chat:/{}.main", model.id));
    if let Some(turn) = open_turn.take() {
        let action = json!({"type": "chat/turnComplete", "turnId": turn, "duration": 1});
        return (chat, action, None);
    }
    if n.is_multiple_of(3) {
        let turn = format!("t{n}");
        let action = json!({"type": "chat/turnStarted", "turnId": turn,
            "startedAt": "2026-12-01T10:00:00.000Z",
            "message": {"text": format!("question {n} about topic{} and ticket{}: {}", global % 997,
                                        global % 100_003, "how does this part of the code work? ".repeat(3)),
                        "origin": {"kind": "user"}}});
        *open_turn = Some(turn);
        return (chat, action, None);
    }
    let action =
        json!({"type": "session/titleChanged", "title": format!("title {n} of {}", model.id)});
    (model.uri(), action, Some(Origin::durable("seeder", global)))
}
