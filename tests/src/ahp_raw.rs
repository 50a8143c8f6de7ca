//! A raw AHP client (JSON-RPC over the WebSocket) for tests that need the
//! commands and actions the upstream client has no typed call for.

use std::time::{Duration, Instant};

use serde_json::{Value, json};

/// How long a test waits for one answer or action.
pub const WAIT: Duration = Duration::from_secs(20);

/// A raw AHP client, initialized with a subscription to the root.
#[allow(missing_debug_implementations)]
pub struct Ahp {
    /// The socket.
    pub ws: crate::RawWs,
    next: u64,
    seq: u64,
    /// Notifications seen while waiting for answers.
    pub seen: Vec<Value>,
}

impl Ahp {
    /// Connects and initializes as `client_id`.
    pub async fn connect(url: &str, client_id: &str) -> Self {
        let mut ahp = Self {
            ws: crate::raw_at(url).await,
            next: 0,
            seq: 0,
            seen: Vec::new(),
        };
        ahp.call(
            "initialize",
            json!({"clientId": client_id, "protocolVersions": [ahp_types::PROTOCOL_VERSION],
                   "initialSubscriptions": ["ahp-root://"]}),
        )
        .await
        .expect("initialize");
        ahp
    }

    /// A request and its result, or its error's message.
    pub async fn call(&mut self, method: &str, params: Value) -> Result<Value, String> {
        self.next += 1;
        let id = self.next;
        let request = json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params});
        crate::raw_send(&mut self.ws, &request.to_string()).await;
        loop {
            let message = crate::raw_next(&mut self.ws)
                .await
                .expect("the connection stays open");
            if message["id"] == id {
                return match message.get("error") {
                    Some(error) => Err(error["message"].as_str().unwrap_or_default().to_owned()),
                    None => Ok(message["result"].clone()),
                };
            }
            self.seen.push(message);
        }
    }

    /// Dispatches `action` on `channel`; its echo's rejection, if any.
    pub async fn dispatch(&mut self, channel: &str, action: Value) -> Option<String> {
        self.seq += 1;
        let seq = self.seq;
        let frame = json!({"jsonrpc": "2.0", "method": "dispatchAction",
            "params": {"channel": channel, "clientSeq": seq, "action": action}});
        crate::raw_send(&mut self.ws, &frame.to_string()).await;
        let deadline = Instant::now() + WAIT;
        loop {
            assert!(Instant::now() < deadline, "no echo of clientSeq {seq}");
            let message = crate::raw_next(&mut self.ws)
                .await
                .expect("the connection stays open");
            let params = &message["params"];
            if message["method"] == "action" && params["origin"]["clientSeq"] == seq {
                return params["rejectionReason"].as_str().map(str::to_owned);
            }
            self.seen.push(message);
        }
    }

    /// Waits for an action of `kind` on a subscription (seen earlier or
    /// arriving now) that `accept` takes.
    pub async fn action(&mut self, kind: &str, accept: impl Fn(&Value) -> bool) -> Value {
        let matches = |m: &Value| {
            m["method"] == "action"
                && m["params"]["action"]["type"] == kind
                && accept(&m["params"]["action"])
        };
        if let Some(found) = self.seen.iter().find(|m| matches(m)) {
            return found["params"]["action"].clone();
        }
        let deadline = Instant::now() + WAIT;
        loop {
            assert!(Instant::now() < deadline, "no {kind} came");
            let message = crate::raw_next(&mut self.ws)
                .await
                .expect("the connection stays open");
            if matches(&message) {
                return message["params"]["action"].clone();
            }
            self.seen.push(message);
        }
    }

    /// Starts a turn on `chat` and returns the agent's answer text.
    pub async fn ask(&mut self, chat: &str, turn: &str, text: &str, model: Option<&str>) -> String {
        let mut message = json!({"text": text, "origin": {"kind": "user"}});
        if let Some(model) = model {
            message["model"] = json!({"id": model});
        }
        let rejected = self
            .dispatch(
                chat,
                json!({"type": "chat/turnStarted", "turnId": turn,
                       "startedAt": "2026-12-02T10:00:00.000Z", "message": message}),
            )
            .await;
        assert_eq!(rejected, None, "turn {turn}");
        let done = |a: &Value| a["turnId"] == turn;
        self.action("chat/turnComplete", done).await;
        let mut answer = String::new();
        for message in &self.seen {
            let action = &message["params"]["action"];
            if message["params"]["channel"] == chat && action["turnId"] == turn {
                match action["type"].as_str() {
                    Some("chat/responsePart") => {
                        answer.push_str(action["part"]["content"].as_str().unwrap_or_default())
                    }
                    Some("chat/delta") => {
                        answer.push_str(action["content"].as_str().unwrap_or_default())
                    }
                    _ => {}
                }
            }
        }
        answer
    }
}
