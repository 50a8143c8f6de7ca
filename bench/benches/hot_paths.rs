//! Criterion benchmarks of the pure paths every dispatch or delivery runs
//! through: envelope encode/decode, reducer application, the projection
//! fold and working-directory canonicalisation. `cargo bench -p tether-bench`.

use std::hint::black_box;

use ahp_types::actions::{ActionEnvelope, StateAction};
use criterion::{BatchSize, Criterion, Throughput, criterion_group, criterion_main};
use serde_json::{Value, json};
use tether_protocol::model::{SessionCreated, SessionModel, typed_action};
use tether_protocol::projection::Projection;
use tether_protocol::workdir::canonical_file_uri;

const SESSION: &str = "ahp-session:/bench";
const CHAT: &str = "ahp-chat:/bench.main";

fn created(dirs: &[&str]) -> SessionModel {
    SessionModel::created(
        "bench",
        SessionCreated {
            project: "bench".into(),
            provider: "echo".into(),
            title: String::new(),
            working_directories: dirs.iter().map(|d| (*d).to_owned()).collect(),
            active_client: None,
            default_chat: CHAT.into(),
            created_at: "2026-01-01T00:00:00.000Z".into(),
            config: None,
            meta: None,
        },
        1,
    )
    .expect("a valid session")
}

fn title(n: usize) -> Value {
    json!({"type": "session/titleChanged", "title": format!("title {n}")})
}

/// One echo turn: started, a response part, complete.
fn turn(n: usize) -> [Value; 3] {
    let id = format!("t{n}");
    [
        json!({"type": "chat/turnStarted", "turnId": id, "startedAt": "2026-01-01T00:00:01.000Z",
               "message": {"text": format!("question {n}: what does this function do?"), "origin": {"kind": "user"}}}),
        json!({"type": "chat/responsePart", "turnId": id,
               "part": {"kind": "markdown", "id": format!("{id}.echo"), "content": "It folds the transcript into the session state, one action at a time."}}),
        json!({"type": "chat/turnComplete", "turnId": id, "duration": 5}),
    ]
}

fn envelope(channel: &str, action: &Value, seq: u64) -> ActionEnvelope {
    serde_json::from_value(json!({
        "channel": channel,
        "action": action,
        "serverSeq": seq,
        "origin": {"clientId": "console-7f3a", "clientSeq": seq},
    }))
    .expect("a valid envelope")
}

fn envelopes(c: &mut Criterion) {
    let mut group = c.benchmark_group("envelope");
    let [_, part, _] = turn(1);
    for (name, channel, action) in [("title", SESSION, title(1)), ("response_part", CHAT, part)] {
        let typed = envelope(channel, &action, 42);
        let text = serde_json::to_string(&typed).expect("serialisable");
        group.throughput(Throughput::Bytes(text.len() as u64));
        group.bench_function(format!("encode/{name}"), |b| {
            b.iter(|| serde_json::to_string(black_box(&typed)).expect("serialisable"))
        });
        group.bench_function(format!("decode/{name}"), |b| {
            b.iter(|| {
                serde_json::from_str::<ActionEnvelope>(black_box(&text)).expect("an envelope")
            })
        });
    }
    group.finish();
}

fn reducers(c: &mut Criterion) {
    let mut group = c.benchmark_group("reducer");
    let dirs = [
        "file:///projects/a",
        "file:///projects/b",
        "file:///projects/c",
        "file:///projects/d",
    ];
    let state = created(&dirs).session;
    let cases: [(&str, StateAction); 2] = [
        ("session/titleChanged", typed_action(&title(1))),
        (
            "session/workingDirectoryReplaced",
            typed_action(&json!({"type": "session/workingDirectoryReplaced",
                "directory": "file:///projects/b", "replacement": "file:///projects/e"})),
        ),
    ];
    for (name, action) in cases {
        // The clone is set-up (the engine's trial copy is measured in the
        // projection fold below).
        group.bench_function(name, |b| {
            b.iter_batched_ref(
                || state.clone(),
                |session| ahp::reducers::apply_action_to_session(session, black_box(&action)),
                BatchSize::SmallInput,
            )
        });
    }
    // The chat reducer alone on a long chat (the copy is set-up), to tell
    // the reducer's own cost from the copy the model makes around it.
    let mut model = created(&[]);
    for n in 0..1000 {
        for action in turn(n) {
            model.apply(CHAT, &action, &typed_action(&action));
        }
    }
    let chat = model.chats[CHAT].clone();
    let [started, _, _] = turn(1_000_000);
    let started = typed_action(&started);
    group.bench_function("chat/turnStarted_after_1000_turns", |b| {
        b.iter_batched_ref(
            || chat.clone(),
            |chat| ahp::reducers::apply_action_to_chat(chat, black_box(&started)),
            BatchSize::LargeInput,
        )
    });
    group.finish();
}

fn projection(c: &mut Criterion) {
    let mut group = c.benchmark_group("projection");
    // A transcript as the session actor sees it: title changes and echo
    // turns on the default chat, already typed.
    let mut transcript: Vec<(&str, Value)> = Vec::new();
    for n in 0..100 {
        transcript.push((SESSION, title(n)));
        for action in turn(n) {
            transcript.push((CHAT, action));
        }
    }
    let typed: Vec<(&str, Value, StateAction)> = transcript
        .iter()
        .map(|(channel, action)| (*channel, action.clone(), typed_action(action)))
        .collect();
    group.throughput(Throughput::Elements(typed.len() as u64));
    group.bench_function("fold_400_actions", |b| {
        b.iter_batched(
            || created(&["file:///projects/a"]),
            |mut model| {
                for (channel, action, typed) in &typed {
                    model.apply(channel, action, typed);
                }
                model
            },
            BatchSize::SmallInput,
        )
    });
    let actions: Vec<&Value> = transcript.iter().map(|(_, action)| action).collect();
    group.bench_function("observe_400_actions", |b| {
        b.iter(|| {
            let mut projection = Projection::default();
            for action in &actions {
                projection.observe(black_box(action));
            }
            projection
        })
    });
    group.bench_function("type_400_actions", |b| {
        b.iter(|| {
            actions
                .iter()
                .map(|action| typed_action(black_box(action)))
                .collect::<Vec<StateAction>>()
        })
    });
    // One more chat action on a chat that already has `turns` turns: the
    // cost of a dispatch as the history grows (the model is set-up).
    let [started, _, _] = turn(1_000_000);
    let next = typed_action(&started);
    // The chat keeps a bounded window of turns (`tether_protocol::window`),
    // so past the window the cost stays flat.
    for turns in [0usize, 100, 1000, 10_000] {
        let model = chat_of(turns);
        group.bench_function(format!("chat_action_after_{turns}_turns"), |b| {
            b.iter_batched_ref(
                || model.clone(),
                |model| model.apply(CHAT, black_box(&started), &next),
                BatchSize::LargeInput,
            )
        });
    }
    group.finish();
}

/// A session whose default chat has run `turns` echo turns.
fn chat_of(turns: usize) -> SessionModel {
    let mut model = created(&["file:///projects/a"]);
    for n in 0..turns {
        for action in turn(n) {
            model.apply(CHAT, &action, &typed_action(&action));
        }
    }
    model.take_trimmed();
    model
}

/// What a subscriber to a long chat is sent: its snapshot, serialised.
/// The sizes are printed once, for BENCHMARKS.md.
fn snapshots(c: &mut Criterion) {
    let mut group = c.benchmark_group("snapshot");
    for turns in [1000usize, 10_000] {
        let model = chat_of(turns);
        let chat = &model.chats[CHAT];
        let bytes = serde_json::to_string(chat).expect("serialises").len();
        eprintln!(
            "snapshot/chat_after_{turns}_turns: {bytes} bytes, {} turns in the window",
            chat.turns.len()
        );
        group.throughput(Throughput::Bytes(bytes as u64));
        group.bench_function(format!("chat_after_{turns}_turns"), |b| {
            b.iter(|| serde_json::to_string(black_box(chat)).expect("serialises"))
        });
    }
    group.finish();
}

fn workdirs(c: &mut Criterion) {
    let mut group = c.benchmark_group("workdir");
    for (name, uri) in [
        ("canonical", "file:///home/me/projects/tether"),
        (
            "encoded_dots_slash",
            "file:///home/me/my%20dir/../x/./projects/tether/",
        ),
        ("localhost_spaces", "file://localhost/home/me/a b/c d/e"),
    ] {
        group.bench_function(name, |b| {
            b.iter(|| canonical_file_uri(black_box(uri)).expect("a valid URI"))
        });
    }
    group.finish();
}

criterion_group!(
    benches, envelopes, reducers, projection, snapshots, workdirs
);
criterion_main!(benches);
