//! `tether-floor`: the floor Tether's benchmarks are measured against.
//!
//! An in-memory broadcast server on the reference peer's wire
//! (`../shared/reference/peer/README.md`): one JSON object per WebSocket text
//! frame at `ws://ADDR/ws`, `sub` / `subscribed` / `dispatch` / `event` /
//! `rejected`, and `GET /healthz`. It keeps no storage and validates only
//! what the peer validates (a session and an `action.type`), deduplicates
//! `(clientId, clientSeq)` in memory, numbers events with one counter, and
//! sends each event to its session's subscribers in order. Whatever a
//! durable server costs beyond this is the price of its storage and its
//! work, so a fan-out figure divided by the floor's says how much of the
//! wire's best a server keeps.
//!
//! ```sh
//! cargo build --release -p tether-bench
//! target/release/tether-floor --bind 127.0.0.1:7979 &
//! target/release/tether-load --target peer --url ws://127.0.0.1:7979/ws fanout --subscribers 1000 --rate 50
//! ```

use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, PoisonError};

use clap::Parser;
use futures_util::{SinkExt, StreamExt};
use serde_json::Value;
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio_tungstenite::tungstenite::{Message, Utf8Bytes};

/// The storage-free floor: an in-memory broadcast server on the reference
/// peer's wire.
#[derive(Parser)]
#[command(name = "tether-floor", version)]
struct Args {
    /// The address to listen on.
    #[arg(long, default_value = "127.0.0.1:7979")]
    bind: SocketAddr,
}

/// A connection's outgoing frames.
type Outbox = mpsc::UnboundedSender<Utf8Bytes>;

/// One session: its events (for replay) and who listens.
#[derive(Default)]
struct Session {
    events: Vec<(u64, Utf8Bytes)>,
    subscribers: Vec<(u64, Outbox)>,
}

/// Everything the floor knows, behind one lock: an event's number, its
/// place in its session's log and its sends happen in one critical section,
/// so every subscriber sees one order.
#[derive(Default)]
struct Floor {
    last_seq: u64,
    sessions: HashMap<String, Session>,
    origins: HashSet<(String, u64)>,
}

#[tokio::main]
async fn main() -> std::io::Result<()> {
    let args = Args::parse();
    let listener = TcpListener::bind(args.bind).await?;
    println!("floor listening on {}", args.bind);
    let floor = Arc::new(Mutex::new(Floor::default()));
    let mut next_id = 0u64;
    loop {
        let (stream, _) = listener.accept().await?;
        let _ = stream.set_nodelay(true);
        next_id += 1;
        tokio::spawn(serve(stream, Arc::clone(&floor), next_id));
    }
}

/// Serves one TCP connection: `GET /healthz`, or a WebSocket.
async fn serve(mut stream: TcpStream, floor: Arc<Mutex<Floor>>, id: u64) {
    let mut head = [0u8; 12];
    if let Ok(n) = stream.peek(&mut head).await
        && head[..n] == *b"GET /healthz"
    {
        let _ = stream
            .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\nconnection: close\r\n\r\n")
            .await;
        return;
    }
    let Ok(ws) = tokio_tungstenite::accept_async(stream).await else {
        return;
    };
    let (mut sink, mut frames) = ws.split();
    let (outbox, mut queued) = mpsc::unbounded_channel::<Utf8Bytes>();
    // Writes whatever is queued, flushing once the queue is empty.
    let writer = tokio::spawn(async move {
        while let Some(text) = queued.recv().await {
            if sink.feed(Message::Text(text)).await.is_err() {
                return;
            }
            while let Ok(text) = queued.try_recv() {
                if sink.feed(Message::Text(text)).await.is_err() {
                    return;
                }
            }
            if sink.flush().await.is_err() {
                return;
            }
        }
    });
    while let Some(Ok(frame)) = frames.next().await {
        if let Message::Text(text) = frame {
            lock(&floor).on_frame(id, &outbox, &text);
        }
    }
    for session in lock(&floor).sessions.values_mut() {
        session.subscribers.retain(|(who, _)| *who != id);
    }
    drop(outbox);
    let _ = writer.await;
}

impl Floor {
    /// Answers one frame from connection `id`.
    fn on_frame(&mut self, id: u64, outbox: &Outbox, text: &str) {
        let Ok(message) = serde_json::from_str::<Value>(text) else {
            let _ = outbox.send(r#"{"t":"error","reason":"bad json"}"#.into());
            return;
        };
        let session = message["session"].as_str();
        match message["t"].as_str() {
            Some("sub") => {
                let name = session.unwrap_or_default();
                let entry = self.sessions.entry(name.to_owned()).or_default();
                entry.subscribers.push((id, outbox.clone()));
                if let Some(after) = message["after"].as_u64() {
                    for (_, event) in entry.events.iter().filter(|(seq, _)| *seq > after) {
                        let _ = outbox.send(event.clone());
                    }
                }
                let subscribed = serde_json::json!({"t": "subscribed", "session": name});
                let _ = outbox.send(subscribed.to_string().into());
            }
            Some("dispatch") => {
                let client_seq = message["clientSeq"].as_u64().unwrap_or_default();
                let (Some(session), Some(_)) = (session, message["action"]["type"].as_str()) else {
                    return reject(outbox, client_seq, "invalid action");
                };
                let client_id = match &message["clientId"] {
                    Value::String(id) => id.clone(),
                    other => other.to_string(),
                };
                if !self.origins.insert((client_id.clone(), client_seq)) {
                    return reject(outbox, client_seq, "duplicate");
                }
                self.last_seq += 1;
                let seq = self.last_seq;
                let event = format!(
                    r#"{{"t":"event","session":{},"seq":{seq},"clientId":{},"clientSeq":{client_seq},"action":{}}}"#,
                    Value::from(session),
                    Value::from(client_id),
                    message["action"],
                );
                let event = Utf8Bytes::from(event);
                let entry = self.sessions.entry(session.to_owned()).or_default();
                for (_, subscriber) in &entry.subscribers {
                    let _ = subscriber.send(event.clone());
                }
                entry.events.push((seq, event));
            }
            _ => {}
        }
    }
}

/// The floor's state, even after a panic elsewhere (nothing in it can be
/// left half-written).
fn lock(floor: &Mutex<Floor>) -> std::sync::MutexGuard<'_, Floor> {
    floor.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Tells a dispatcher its action was not taken.
fn reject(outbox: &Outbox, client_seq: u64, reason: &str) {
    let rejected = serde_json::json!({"t": "rejected", "clientSeq": client_seq, "reason": reason});
    let _ = outbox.send(rejected.to_string().into());
}

#[cfg(test)]
mod tests {
    use super::*;

    fn connection() -> (Outbox, mpsc::UnboundedReceiver<Utf8Bytes>) {
        mpsc::unbounded_channel()
    }

    fn drain(queue: &mut mpsc::UnboundedReceiver<Utf8Bytes>) -> Vec<Value> {
        std::iter::from_fn(|| queue.try_recv().ok())
            .map(|text| serde_json::from_str(&text).unwrap())
            .collect()
    }

    #[test]
    fn events_reach_subscribers_in_order_and_origins_are_taken_once() {
        let mut floor = Floor::default();
        let (a, mut a_in) = connection();
        let (b, mut b_in) = connection();
        floor.on_frame(1, &a, r#"{"t":"sub","session":"s"}"#);
        assert_eq!(
            drain(&mut a_in),
            vec![serde_json::json!({"t":"subscribed","session":"s"})]
        );
        let dispatch = |seq: u64| {
            format!(
                r#"{{"t":"dispatch","session":"s","clientId":"c","clientSeq":{seq},"action":{{"type":"x","n":{seq}}}}}"#
            )
        };
        floor.on_frame(2, &b, &dispatch(1));
        floor.on_frame(2, &b, &dispatch(2));
        floor.on_frame(2, &b, &dispatch(1));
        let events = drain(&mut a_in);
        assert_eq!(events.len(), 2);
        assert_eq!(events[0]["seq"], 1);
        assert_eq!(events[1]["seq"], 2);
        assert_eq!(events[1]["clientId"], "c");
        assert_eq!(events[1]["action"], serde_json::json!({"type":"x","n":2}));
        // The dispatcher is not subscribed: it hears only the refusal.
        let refused = drain(&mut b_in);
        assert_eq!(refused.len(), 1);
        assert_eq!(refused[0]["t"], "rejected");
        assert_eq!(refused[0]["reason"], "duplicate");
    }

    #[test]
    fn a_subscriber_with_after_gets_what_it_missed_first() {
        let mut floor = Floor::default();
        let (a, mut a_in) = connection();
        for seq in 1..=3 {
            let frame = format!(
                r#"{{"t":"dispatch","session":"s","clientId":"c","clientSeq":{seq},"action":{{"type":"x"}}}}"#
            );
            floor.on_frame(1, &a, &frame);
        }
        floor.on_frame(
            1,
            &a,
            r#"{"t":"dispatch","session":"s","clientId":"c","clientSeq":4}"#,
        );
        assert_eq!(drain(&mut a_in)[0]["reason"], "invalid action");
        floor.on_frame(2, &a, r#"{"t":"sub","session":"s","after":1}"#);
        let heard = drain(&mut a_in);
        let seqs: Vec<&Value> = heard.iter().map(|m| &m["seq"]).collect();
        assert_eq!(
            seqs,
            [&serde_json::json!(2), &serde_json::json!(3), &Value::Null]
        );
        assert_eq!(heard[2]["t"], "subscribed");
    }
}
