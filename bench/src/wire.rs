//! A lean AHP client on a raw tokio-tungstenite socket, for the places
//! where the upstream `ahp` client would measure itself instead of the
//! server:
//!
//! * the upstream client decodes every inbound frame twice (into a JSON
//!   value, then into typed structs that own every string) and copies it
//!   into a per-subscription broadcast ring, which silently skips what a
//!   slow reader missed. In trials it took 1.6 to 2 times the CPU per
//!   delivery of this client, on the two cores the server shares; and a
//!   skipped envelope would be blamed on the server;
//! * its `dispatch` re-serialises the typed action for every call;
//! * its 16 MiB frame limit cannot take a 100,000-envelope `reconnect`
//!   reply (about 20 MiB in one frame), and its double decode of that
//!   reply would be timed as replay.
//!
//! It speaks the same protocol: JSON-RPC 2.0 text frames, `initialize`
//! (with `initialSubscriptions`), `subscribe`, `dispatchAction` as a
//! notification and `reconnect`; inbound envelopes are read only as far as
//! their head (`channel`, `serverSeq`, `origin`, `rejectionReason`) and the
//! action is skipped unparsed. `ingest` and `fanout` can run on the
//! upstream client instead (`--client ahp`) to compare.

use std::borrow::Cow;
use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use serde::Deserialize;
use serde_json::{Value, json};
use tokio_tungstenite::tungstenite::{Message, Utf8Bytes};

use crate::error::{Error, Result};
use crate::net::Ws;

/// How long a setup request (initialize, createSession, ...) may take.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(60);

/// One raw AHP connection.
#[derive(Debug)]
pub struct RawConn {
    ws: Ws,
    next_id: u64,
}

/// Why a connection stopped delivering frames.
#[derive(Debug, Clone)]
pub enum Ended {
    /// The server closed it with this code and reason.
    Closed(u16, String),
    /// The socket failed.
    Failed(String),
}

impl std::fmt::Display for Ended {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Ended::Closed(code, reason) => write!(f, "closed by the server ({code}: {reason})"),
            Ended::Failed(err) => write!(f, "socket failed: {err}"),
        }
    }
}

impl RawConn {
    /// Wraps a connected WebSocket.
    pub fn new(ws: Ws) -> Self {
        Self { ws, next_id: 1 }
    }

    /// Sends a request and waits for its answer; frames before it (live
    /// envelopes, notifications) are dropped, so call it only while the
    /// connection carries nothing the caller counts.
    pub async fn request(&mut self, method: &str, params: Value) -> Result<Value> {
        let id = self.next_id;
        self.next_id += 1;
        let text = json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params});
        self.send(text.to_string()).await?;
        let answer = tokio::time::timeout(REQUEST_TIMEOUT, async {
            loop {
                let frame = self
                    .next_text()
                    .await
                    .map_err(|e| Error::msg(format!("{method}: {e}")))?;
                let value: Value = serde_json::from_str(&frame)?;
                if value.get("id").and_then(Value::as_u64) == Some(id) {
                    return Ok::<_, Error>(value);
                }
            }
        })
        .await
        .map_err(|_| Error::msg(format!("{method}: no answer in {REQUEST_TIMEOUT:?}")))??;
        if let Some(error) = answer.get("error") {
            return Err(Error::msg(format!("{method} refused: {error}")));
        }
        Ok(answer.get("result").cloned().unwrap_or(Value::Null))
    }

    /// `initialize` as `client_id`, subscribed to `channels`.
    pub async fn initialize(&mut self, client_id: &str, channels: &[&str]) -> Result<Value> {
        self.request(
            "initialize",
            json!({
                "channel": ahp_types::ROOT_RESOURCE_URI,
                "protocolVersions": [ahp_types::PROTOCOL_VERSION],
                "clientId": client_id,
                "initialSubscriptions": channels,
            }),
        )
        .await
    }

    /// Sends one text frame and flushes.
    pub async fn send(&mut self, text: String) -> Result<()> {
        self.ws.send(Message::Text(text.into())).await?;
        Ok(())
    }

    /// Queues one text frame without flushing (see [`RawConn::flush`]).
    pub async fn feed(&mut self, text: String) -> Result<()> {
        self.ws.feed(Message::Text(text.into())).await?;
        Ok(())
    }

    /// Writes everything queued.
    pub async fn flush(&mut self) -> Result<()> {
        self.ws.flush().await?;
        Ok(())
    }

    /// The next text frame (pings are answered by tungstenite as it reads).
    pub async fn next_text(&mut self) -> Result<Utf8Bytes, Ended> {
        loop {
            match self.ws.next().await {
                Some(Ok(Message::Text(text))) => return Ok(text),
                Some(Ok(Message::Close(frame))) => {
                    let (code, reason) = frame
                        .map(|f| (u16::from(f.code), f.reason.to_string()))
                        .unwrap_or((1005, String::new()));
                    return Err(Ended::Closed(code, reason));
                }
                Some(Ok(_)) => continue,
                Some(Err(err)) => return Err(Ended::Failed(err.to_string())),
                None => return Err(Ended::Failed("connection closed".to_owned())),
            }
        }
    }

    /// Closes the connection politely (best effort).
    pub async fn close(mut self) {
        let _ = self.ws.close(None).await;
    }

    /// Splits into a writer and a reader half.
    pub fn split(
        self,
    ) -> (
        futures_util::stream::SplitSink<Ws, Message>,
        futures_util::stream::SplitStream<Ws>,
    ) {
        self.ws.split()
    }
}

/// The head of an inbound frame: enough to account for an envelope; the
/// action itself is skipped without being built.
#[derive(Debug, Deserialize)]
pub struct FrameHead<'a> {
    /// The notification method (`action` for envelopes).
    #[serde(borrow, default)]
    pub method: Option<Cow<'a, str>>,
    /// Its params, when they look like an envelope.
    #[serde(borrow, default)]
    pub params: Option<EnvelopeHead<'a>>,
}

/// The head of an `ActionEnvelope`.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct EnvelopeHead<'a> {
    /// Its channel.
    #[serde(borrow, default)]
    pub channel: Option<Cow<'a, str>>,
    /// Its `serverSeq`.
    #[serde(default)]
    pub server_seq: Option<u64>,
    /// Who dispatched it.
    #[serde(borrow, default)]
    pub origin: Option<OriginHead<'a>>,
    /// Set when the dispatch was refused.
    #[serde(borrow, default)]
    pub rejection_reason: Option<Cow<'a, str>>,
}

/// An envelope's `origin`.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct OriginHead<'a> {
    /// The dispatcher's `clientId`.
    #[serde(borrow)]
    pub client_id: Cow<'a, str>,
    /// Its `clientSeq`.
    pub client_seq: u64,
}

/// The envelope head of an `action` notification, `None` for any other
/// frame.
pub fn action_head(text: &str) -> Option<EnvelopeHead<'_>> {
    let head: FrameHead<'_> = serde_json::from_str(text).ok()?;
    (head.method.as_deref() == Some("action"))
        .then_some(head.params)
        .flatten()
}

/// A `dispatchAction` notification. `channel_json` is the channel already
/// as a JSON string (quoted), `action_json` the action object's JSON.
pub fn dispatch_frame(channel_json: &str, client_seq: u64, action_json: &str) -> String {
    format!(
        r#"{{"jsonrpc":"2.0","method":"dispatchAction","params":{{"channel":{channel_json},"clientSeq":{client_seq},"action":{action_json}}}}}"#
    )
}

/// The action every scenario dispatches: a session title change, which is
/// client-dispatchable, cheap to validate and needs no side effect, so the
/// figures are about transport, commit and fan-out.
pub fn title_action(title: &str) -> String {
    json!({"type": "session/titleChanged", "title": title}).to_string()
}

/// A JSON string literal.
pub fn quoted(text: &str) -> String {
    Value::String(text.to_owned()).to_string()
}

/// Creates a session through AHP `createSession` in project `bench`, with
/// the built-in echo agent and no working directory.
pub async fn create_session(conn: &mut RawConn, id: &str) -> Result<String> {
    let channel = format!("ahp-session:/{id}");
    conn.request(
        "createSession",
        json!({
            "channel": channel,
            "provider": "echo",
            "workingDirectories": [],
            "_meta": {"tether/project": "bench"},
        }),
    )
    .await?;
    Ok(channel)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_envelope_head_is_read_without_the_action() {
        let text = r#"{"jsonrpc":"2.0","method":"action","params":{"channel":"ahp-session:/s","origin":{"clientId":"c\"1","clientSeq":7},"serverSeq":42,"action":{"type":"session/titleChanged","title":"x"}}}"#;
        let head = action_head(text).unwrap();
        assert_eq!(head.server_seq, Some(42));
        let origin = head.origin.unwrap();
        assert_eq!(origin.client_id, "c\"1");
        assert_eq!(origin.client_seq, 7);
        assert!(head.rejection_reason.is_none());
    }

    #[test]
    fn other_frames_are_not_envelopes() {
        assert!(action_head(r#"{"jsonrpc":"2.0","id":1,"result":null}"#).is_none());
        assert!(
            action_head(r#"{"jsonrpc":"2.0","method":"root/sessionAdded","params":{}}"#).is_none()
        );
        assert!(action_head("not json").is_none());
    }

    #[test]
    fn a_dispatch_frame_is_what_the_upstream_types_read() {
        let frame = dispatch_frame(&quoted("ahp-session:/s"), 3, &title_action("t 3"));
        let value: Value = serde_json::from_str(&frame).unwrap();
        let params: ahp_types::commands::DispatchActionParams =
            serde_json::from_value(value["params"].clone()).unwrap();
        assert_eq!(params.client_seq, 3);
        assert_eq!(params.channel, "ahp-session:/s");
        assert_eq!(value["method"], "dispatchAction");
    }
}
