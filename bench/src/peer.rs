//! The frames of the reference peer: a hand-rolled Node.js server kept
//! outside this repository, the baseline Tether is compared with
//! (`BENCHMARKS.md`, "The reference peer"). One JSON object per text frame
//! at `ws://host:port/ws`:
//!
//! * `{"t":"sub","session":S}` → `{"t":"subscribed","session":S}`;
//! * `{"t":"dispatch","session":S,"clientId":C,"clientSeq":Q,"action":A}`;
//! * after the commit, every subscriber of `S` (the dispatcher too, when
//!   it subscribed) gets `{"t":"event","session":S,"seq":N,"clientId":C,
//!   "clientSeq":Q,"action":A}`, where `seq` is one counter over every
//!   session;
//! * a refused dispatch gets `{"t":"rejected","clientSeq":Q,"reason":R}`,
//!   sent to the dispatcher's connection only, without its `clientId`.
//!
//! The peer has no handshake, no session creation (a session is any
//! string) and no REST but `/healthz`. Inbound frames are read as far as
//! their head, like Tether's envelopes in [`crate::wire`]: the action is
//! skipped unparsed.

use std::borrow::Cow;

use serde::Deserialize;

use crate::error::{Error, Result};
use crate::wire::{REQUEST_TIMEOUT, RawConn, quoted};

/// A frame from the peer, as far as the load tool reads it.
#[derive(Debug, PartialEq, Eq)]
pub enum Frame<'a> {
    /// The answer to a `sub`.
    Subscribed {
        /// The session subscribed to.
        session: Cow<'a, str>,
    },
    /// A committed action.
    Event {
        /// Its session.
        session: Cow<'a, str>,
        /// The peer's log position (one counter for every session).
        seq: u64,
        /// Who dispatched it (`None` for a replayed row stored without one).
        client_id: Option<Cow<'a, str>>,
        /// The dispatcher's `clientSeq`.
        client_seq: u64,
    },
    /// A refused dispatch of this connection.
    Rejected {
        /// Its `clientSeq` (`None` when the dispatch sent none).
        client_seq: Option<u64>,
        /// Why (`duplicate`, `invalid action`).
        reason: Cow<'a, str>,
    },
    /// Anything else (`error`, a frame the load tool does not know).
    Other,
}

/// The head of every peer frame: each kind uses some of these fields.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Head<'a> {
    #[serde(borrow, default)]
    t: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    session: Option<Cow<'a, str>>,
    #[serde(default)]
    seq: Option<u64>,
    #[serde(borrow, default)]
    client_id: Option<Cow<'a, str>>,
    #[serde(default)]
    client_seq: Option<u64>,
    #[serde(borrow, default)]
    reason: Option<Cow<'a, str>>,
}

/// Reads a frame's head; text that is not a peer frame is [`Frame::Other`].
pub fn read(text: &str) -> Frame<'_> {
    let Ok(head) = serde_json::from_str::<Head<'_>>(text) else {
        return Frame::Other;
    };
    match (head.t.as_deref(), head.session) {
        (Some("subscribed"), Some(session)) => Frame::Subscribed { session },
        (Some("event"), Some(session)) => match (head.seq, head.client_seq) {
            (Some(seq), Some(client_seq)) => Frame::Event {
                session,
                seq,
                client_id: head.client_id,
                client_seq,
            },
            _ => Frame::Other,
        },
        (Some("rejected"), _) => Frame::Rejected {
            client_seq: head.client_seq,
            reason: head.reason.unwrap_or(Cow::Borrowed("no reason given")),
        },
        _ => Frame::Other,
    }
}

/// A `sub` frame. `session_json` is the session already as a JSON string.
pub fn sub_frame(session_json: &str) -> String {
    format!(r#"{{"t":"sub","session":{session_json}}}"#)
}

/// A `dispatch` frame. `session_json` and `client_id_json` are JSON
/// strings (quoted), `action_json` the action object's JSON.
pub fn dispatch_frame(
    session_json: &str,
    client_id_json: &str,
    client_seq: u64,
    action_json: &str,
) -> String {
    format!(
        r#"{{"t":"dispatch","session":{session_json},"clientId":{client_id_json},"clientSeq":{client_seq},"action":{action_json}}}"#
    )
}

/// Subscribes `conn` to `session` and waits for `subscribed`. Frames before
/// it are dropped, so call it only while the connection carries nothing
/// the caller counts.
pub async fn subscribe(conn: &mut RawConn, session: &str) -> Result<()> {
    conn.send(sub_frame(&quoted(session))).await?;
    tokio::time::timeout(REQUEST_TIMEOUT, async {
        loop {
            let text = conn
                .next_text()
                .await
                .map_err(|e| Error::msg(format!("peer sub {session}: {e}")))?;
            if let Frame::Subscribed { session: got } = read(&text)
                && got == session
            {
                return Ok(());
            }
        }
    })
    .await
    .map_err(|_| {
        Error::msg(format!(
            "peer sub {session}: no answer in {REQUEST_TIMEOUT:?}"
        ))
    })?
}

#[cfg(test)]
mod tests {
    use serde_json::Value;

    use super::*;
    use crate::wire::title_action;

    #[test]
    fn a_dispatch_frame_is_what_the_peer_reads() {
        let frame = dispatch_frame(&quoted("s\"1"), &quoted("c-1"), 7, &title_action("load 7"));
        let value: Value = serde_json::from_str(&frame).unwrap();
        assert_eq!(value["t"], "dispatch");
        assert_eq!(value["session"], "s\"1");
        assert_eq!(value["clientId"], "c-1");
        assert_eq!(value["clientSeq"], 7);
        assert_eq!(value["action"]["type"], "session/titleChanged");
        assert_eq!(value["action"]["title"], "load 7");
    }

    #[test]
    fn a_sub_frame_names_the_session() {
        let value: Value = serde_json::from_str(&sub_frame(&quoted("fanout-1"))).unwrap();
        assert_eq!(
            value,
            serde_json::json!({"t": "sub", "session": "fanout-1"})
        );
    }

    /// The text the peer writes for a committed event (its template).
    #[test]
    fn an_event_is_read_without_its_action() {
        let text = r#"{"t":"event","session":"s","seq":42,"clientId":"c\"1","clientSeq":7,"action":{"type":"session/titleChanged","title":"x"}}"#;
        assert_eq!(
            read(text),
            Frame::Event {
                session: "s".into(),
                seq: 42,
                client_id: Some("c\"1".into()),
                client_seq: 7,
            }
        );
    }

    #[test]
    fn a_replayed_row_may_have_no_client() {
        let text =
            r#"{"t":"event","session":"s","seq":3,"clientId":null,"clientSeq":null,"action":{}}"#;
        assert_eq!(read(text), Frame::Other, "no clientSeq: nobody's ack");
        let text =
            r#"{"t":"event","session":"s","seq":3,"clientId":null,"clientSeq":1,"action":{}}"#;
        assert!(matches!(
            read(text),
            Frame::Event {
                client_id: None,
                ..
            }
        ));
    }

    #[test]
    fn a_rejection_carries_its_client_seq_and_reason() {
        assert_eq!(
            read(r#"{"t":"rejected","clientSeq":9,"reason":"duplicate"}"#),
            Frame::Rejected {
                client_seq: Some(9),
                reason: "duplicate".into()
            }
        );
        assert_eq!(
            read(r#"{"t":"rejected","reason":"invalid action"}"#),
            Frame::Rejected {
                client_seq: None,
                reason: "invalid action".into()
            }
        );
    }

    #[test]
    fn subscribed_and_other_frames() {
        assert_eq!(
            read(r#"{"t":"subscribed","session":"s"}"#),
            Frame::Subscribed {
                session: "s".into()
            }
        );
        assert_eq!(read(r#"{"t":"error","reason":"bad json"}"#), Frame::Other);
        assert_eq!(read(r#"{"jsonrpc":"2.0","method":"action"}"#), Frame::Other);
        assert_eq!(read("not json"), Frame::Other);
    }
}
