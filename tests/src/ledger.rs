//! Durable writers that keep a ledger of what the server acknowledged, for
//! the fault tests: kill -9 loops, a stopped Postgres, a full disk.
//!
//! A [`Writer`] dispatches titles to one session over REST and retries the
//! same `clientSeq` until it gets an answer: an action whose answer was
//! lost (the server died) is sent again and must be applied once. The
//! [`audit`] then compares the ledger with the stored transcript.

use std::collections::{BTreeMap, HashSet};
use std::time::Duration;

use serde_json::{Value, json};

/// An error and its causes, as one line.
fn chain(err: &dyn std::error::Error) -> String {
    let mut text = err.to_string();
    let mut cause = err.source();
    while let Some(err) = cause {
        text.push_str(": ");
        text.push_str(&err.to_string());
        cause = err.source();
    }
    text
}

/// What one attempt came to.
#[derive(Debug, Clone, PartialEq)]
pub enum Attempt {
    /// Committed as this serverSeq.
    Acked(u64),
    /// Refused with this status and problem (503: not recorded; retry).
    Refused(u16, Value),
    /// No answer: the connection failed.
    Lost(String),
}

/// Dispatches `session/titleChanged` to one session, one at a time.
#[derive(Debug)]
pub struct Writer {
    http: reqwest::Client,
    /// The session written to.
    pub session: String,
    /// The origin's client id.
    pub client_id: String,
    /// The clientSeq being sent (retried until answered).
    pub next: u64,
    /// clientSeq → serverSeq, for every acknowledged action.
    pub acked: BTreeMap<u64, u64>,
    /// Attempts the server refused, by status.
    pub refused: BTreeMap<u16, u64>,
    /// The last refusal's problem.
    pub last_refusal: Option<Value>,
    /// Spaces added to each title (a retry sends the same bytes).
    pub pad: usize,
    /// When the last action was acknowledged.
    pub last_ack: Option<std::time::Instant>,
    /// The longest time between two acknowledgements: how long this
    /// session could not be written (retries included).
    pub longest_wait: Duration,
    /// When that longest wait ended.
    pub longest_wait_ended: Option<std::time::Instant>,
    /// The last attempts that were not acknowledged: when each was sent
    /// and what came back (for a failing test to say why it waited).
    pub misses: std::collections::VecDeque<(std::time::Instant, String)>,
}

impl Writer {
    /// A writer for `session` as `client_id`.
    pub fn new(session: &str, client_id: &str) -> Self {
        Self {
            http: reqwest::Client::builder()
                .timeout(Duration::from_secs(10))
                .build()
                .expect("an HTTP client"),
            session: session.to_owned(),
            client_id: client_id.to_owned(),
            next: 1,
            acked: BTreeMap::new(),
            refused: BTreeMap::new(),
            last_refusal: None,
            pad: 0,
            last_ack: None,
            misses: std::collections::VecDeque::new(),
            longest_wait: Duration::ZERO,
            longest_wait_ended: None,
        }
    }

    /// The same writer sending `token` as its bearer token, and giving up
    /// on an attempt after `timeout` (then retrying it).
    pub fn authorized(mut self, token: &str, timeout: Duration) -> Self {
        let mut headers = reqwest::header::HeaderMap::new();
        headers.insert(
            reqwest::header::AUTHORIZATION,
            format!("Bearer {token}").parse().expect("a header value"),
        );
        self.http = reqwest::Client::builder()
            .timeout(timeout)
            .default_headers(headers)
            .build()
            .expect("an HTTP client");
        self
    }

    /// The same writer with `pad` bytes added to every title.
    pub fn padded(mut self, pad: usize) -> Self {
        self.pad = pad;
        self
    }

    /// The title the action with `client_seq` sets.
    pub fn title(&self, client_seq: u64) -> String {
        format!("{}#{client_seq}", self.client_id)
    }

    /// Sends the current action to `base` once. Acknowledged: the next one
    /// is current. Refused or lost: the same one is sent next time.
    pub async fn attempt(&mut self, base: &str) -> Attempt {
        let sent_at = std::time::Instant::now();
        let attempt = self.attempt_once(base).await;
        if !matches!(attempt, Attempt::Acked(_)) {
            if self.misses.len() == 16 {
                self.misses.pop_front();
            }
            self.misses.push_back((sent_at, format!("{attempt:?}")));
        }
        attempt
    }

    async fn attempt_once(&mut self, base: &str) -> Attempt {
        let title = format!("{}{}", self.title(self.next), " ".repeat(self.pad));
        let body = json!({"clientId": self.client_id, "clientSeq": self.next,
            "action": {"type": "session/titleChanged", "title": title}});
        let sent = self
            .http
            .post(format!("{base}/v1/sessions/{}/actions", self.session))
            .json(&body)
            .send()
            .await;
        let answer = match sent {
            Ok(answer) => answer,
            Err(err) => return Attempt::Lost(chain(&err)),
        };
        let status = answer.status().as_u16();
        let body: Value = match answer.json().await {
            Ok(body) => body,
            Err(err) => return Attempt::Lost(err.to_string()),
        };
        if status == 200 {
            let seq = body["serverSeq"].as_u64().expect("serverSeq");
            if let Some(before) = self.acked.insert(self.next, seq) {
                assert_eq!(before, seq, "clientSeq {} acknowledged twice", self.next);
            }
            let now = std::time::Instant::now();
            if let Some(last) = self.last_ack.replace(now)
                && now - last > self.longest_wait
            {
                self.longest_wait = now - last;
                self.longest_wait_ended = Some(now);
            }
            self.next += 1;
            Attempt::Acked(seq)
        } else {
            *self.refused.entry(status).or_default() += 1;
            self.last_refusal = Some(body.clone());
            Attempt::Refused(status, body)
        }
    }

    /// Sends until the current action is acknowledged (the server is up),
    /// for at most `limit`.
    pub async fn settle(&mut self, base: &str, limit: Duration) {
        let deadline = tokio::time::Instant::now() + limit;
        loop {
            match self.attempt(base).await {
                Attempt::Acked(_) => return,
                other => assert!(
                    tokio::time::Instant::now() < deadline,
                    "{}: no answer after {limit:?}: {other:?}",
                    self.client_id
                ),
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// The stored transcript of `session`: `(serverSeq, envelope)` in order.
pub async fn transcript(base: &str, session: &str) -> Vec<(u64, Value)> {
    transcript_as(base, session, None).await
}

/// [`transcript`], read with a bearer token.
pub async fn transcript_as(base: &str, session: &str, token: Option<&str>) -> Vec<(u64, Value)> {
    let http = reqwest::Client::new();
    let mut all = Vec::new();
    let mut after = 0;
    loop {
        let mut request = http.get(format!(
            "{base}/v1/sessions/{session}/transcript?after={after}&limit=1000"
        ));
        if let Some(token) = token {
            request = request.bearer_auth(token);
        }
        let page: Value = request
            .send()
            .await
            .expect("transcript")
            .json()
            .await
            .expect("a transcript page");
        for envelope in page["envelopes"].as_array().expect("envelopes") {
            all.push((
                envelope["serverSeq"].as_u64().expect("seq"),
                envelope.clone(),
            ));
        }
        match page["nextAfter"].as_u64() {
            Some(next) => after = next,
            None => return all,
        }
    }
}

/// Checks the store against the writers' ledgers: every acknowledged
/// action is stored once with the seq it was acknowledged with; nothing
/// of a writer is stored that it did not send; no serverSeq appears twice
/// across the sessions. Returns how many actions were checked.
pub async fn audit(base: &str, writers: &[Writer]) -> usize {
    audit_as(base, writers, None).await
}

/// [`audit`], reading with a bearer token.
pub async fn audit_as(base: &str, writers: &[Writer], token: Option<&str>) -> usize {
    let mut seqs = HashSet::new();
    let mut checked = 0;
    for writer in writers {
        let stored = transcript_as(base, &writer.session, token).await;
        let mut mine = BTreeMap::new();
        for (seq, envelope) in &stored {
            assert!(seqs.insert(*seq), "serverSeq {seq} stored twice");
            let origin = &envelope["origin"];
            if origin["clientId"] == writer.client_id.as_str() {
                let client_seq = origin["clientSeq"].as_u64().expect("clientSeq");
                let title = envelope["action"]["title"].as_str().unwrap_or_default();
                assert_eq!(title.trim_end(), writer.title(client_seq), "its own title");
                assert!(
                    mine.insert(client_seq, *seq).is_none(),
                    "{} clientSeq {client_seq} applied twice",
                    writer.client_id
                );
            }
        }
        for (client_seq, seq) in &writer.acked {
            assert_eq!(
                mine.get(client_seq),
                Some(seq),
                "{} acknowledged clientSeq {client_seq} as serverSeq {seq}",
                writer.client_id
            );
        }
        // Stored but never acknowledged: only the one whose answer was lost
        // may be, and then the writer's retry got it acknowledged.
        for client_seq in mine.keys() {
            assert!(
                *client_seq <= writer.next,
                "{} has clientSeq {client_seq} stored, never sent",
                writer.client_id
            );
        }
        checked += writer.acked.len();
    }
    checked
}

/// Asserts that every serverSeq a subscriber received (`broadcast`) was
/// committed (`stored`), in order and once.
pub fn assert_broadcast_was_committed(broadcast: &[u64], stored: &[u64]) {
    assert!(!broadcast.is_empty(), "something was broadcast");
    for seq in broadcast {
        assert!(
            stored.contains(seq),
            "serverSeq {seq} broadcast, never committed"
        );
    }
    assert!(broadcast.windows(2).all(|w| w[0] < w[1]), "in order, once");
}

/// Subscribes `ws` to `channel` and returns the serverSeqs of the actions
/// it received until the connection closed (however long that takes).
pub async fn watch(mut ws: crate::RawWs, channel: &str) -> Vec<u64> {
    use futures_util::StreamExt;
    use tokio_tungstenite::tungstenite::Message;
    let init = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "channel": "ahp-root://", "protocolVersions": ["1.0.0"], "clientId": "watcher",
        "initialSubscriptions": [channel]}});
    crate::raw_send(&mut ws, &init.to_string()).await;
    let mut seqs = Vec::new();
    while let Some(Ok(message)) = ws.next().await {
        let Message::Text(text) = message else {
            continue;
        };
        let message: Value = serde_json::from_str(&text).expect("JSON");
        if message["method"] == "action"
            && let Some(seq) = message["params"]["serverSeq"].as_u64()
        {
            seqs.push(seq);
        }
    }
    seqs
}
