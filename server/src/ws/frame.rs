//! Reading a JSON-RPC message off the socket: its parts are taken as the
//! text they came in, and each method parses its own params. A dispatch's
//! action is parsed once, straight from its text, and that text is kept for
//! an echo of its refusal; nothing builds a tree of the whole message.

use std::borrow::Cow;

use ahp_types::errors::json_rpc_error_codes;
use serde::{Deserialize, Deserializer};
use serde_json::Value;
use serde_json::value::RawValue;

use super::rpc::{MAX_SEQ, RpcError, channel_param, u64_param};

/// A message's parts: `id` (present, even as `null`, for a request),
/// `method` and its `params`.
pub(super) struct Request<'a> {
    pub(super) id: Option<Value>,
    pub(super) method: Cow<'a, str>,
    pub(super) params: Params<'a>,
}

/// A message's `params`: as text when the message was read that way,
/// already parsed, or read as a well-formed dispatch's.
pub(super) enum Params<'a> {
    /// The text of `params`; `None` when there is none.
    Text(Option<&'a RawValue>),
    /// Parsed (`Value::Null` when there is none).
    Parsed(Value),
    /// A `dispatchAction`'s, read with the message in one pass.
    Dispatch(Dispatched),
}

impl Params<'_> {
    /// The params as a JSON value (`Null` when there are none).
    pub(super) fn into_value(self) -> Result<Value, RpcError> {
        match self {
            Params::Parsed(value) => Ok(value),
            Params::Dispatch(d) => Ok(serde_json::json!({
                "channel": d.channel,
                "clientSeq": d.client_seq,
                "action": d.action,
            })),
            Params::Text(None) => Ok(Value::Null),
            Params::Text(Some(text)) => serde_json::from_str(text.get()).map_err(|err| {
                RpcError::new(
                    json_rpc_error_codes::INVALID_PARAMS,
                    format!("params do not parse: {err}."),
                )
            }),
        }
    }
}

/// A refused message: the id to answer, the JSON-RPC code and why.
pub(super) type Unread = (Value, i32, String);

/// The shape every well-formed message has; anything else is read again
/// as a JSON value to tell what is wrong with it.
#[derive(Deserialize)]
struct Frame<'a> {
    #[serde(borrow, default, deserialize_with = "present")]
    id: Option<&'a RawValue>,
    #[serde(borrow, default)]
    method: Option<Cow<'a, str>>,
    #[serde(borrow, default, deserialize_with = "present")]
    params: Option<&'a RawValue>,
}

/// A member that is present, `null` included (serde reads a `null` into an
/// `Option` as `None`).
fn present<'de, D: Deserializer<'de>>(d: D) -> Result<Option<&'de RawValue>, D::Error> {
    <&RawValue>::deserialize(d).map(Some)
}

/// A well-formed `dispatchAction`, the message most clients send most:
/// read in one pass, its params straight into their parts.
#[derive(Deserialize)]
struct DispatchFrame<'a> {
    #[serde(borrow, default, deserialize_with = "present")]
    id: Option<&'a RawValue>,
    #[serde(borrow)]
    method: Cow<'a, str>,
    #[serde(borrow)]
    params: DispatchParams<'a>,
}

/// Reads `text` as a well-formed dispatch, or `None` (then it is read the
/// general way, which tells what is wrong with it).
fn read_dispatch(text: &str) -> Option<Request<'_>> {
    if !text.contains("\"dispatchAction\"") {
        return None;
    }
    let frame = serde_json::from_str::<DispatchFrame<'_>>(text).ok()?;
    if frame.method != "dispatchAction" {
        return None;
    }
    let dispatched = frame.params.into_dispatched()?;
    Some(Request {
        // Already checked as JSON: this parse cannot fail.
        id: frame
            .id
            .map(|id| serde_json::from_str(id.get()).unwrap_or(Value::Null)),
        method: frame.method,
        params: Params::Dispatch(dispatched),
    })
}

/// Reads one text message.
pub(super) fn read(text: &str) -> Result<Request<'_>, Unread> {
    if let Some(request) = read_dispatch(text) {
        return Ok(request);
    }
    if text.trim_start().starts_with('{')
        && let Ok(frame) = serde_json::from_str::<Frame<'_>>(text)
        && let Some(method) = frame.method
    {
        // Already checked as JSON: this parse cannot fail.
        let id = frame
            .id
            .map(|id| serde_json::from_str(id.get()).unwrap_or(Value::Null));
        return Ok(Request {
            id,
            method,
            params: Params::Text(frame.params),
        });
    }
    // Not an object, a member of the wrong type, a key twice: read as a
    // value, which tells the sender what is wrong (a repeated key keeps its
    // last value, as before).
    let mut message: Value = serde_json::from_str(text).map_err(|err| {
        (
            Value::Null,
            json_rpc_error_codes::PARSE_ERROR,
            format!("Malformed JSON: {err}."),
        )
    })?;
    let id = message.get("id").cloned();
    let Some(method) = message.get("method").and_then(Value::as_str) else {
        return Err((
            id.unwrap_or(Value::Null),
            json_rpc_error_codes::INVALID_REQUEST,
            "A JSON-RPC 2.0 request or notification needs a \"method\".".to_owned(),
        ));
    };
    let method = Cow::Owned(method.to_owned());
    let params = message
        .as_object_mut()
        .and_then(|m| m.remove("params"))
        .unwrap_or(Value::Null);
    Ok(Request {
        id,
        method,
        params: Params::Parsed(params),
    })
}

/// `dispatchAction`'s params as they are read when well-formed.
#[derive(Deserialize)]
struct DispatchParams<'a> {
    #[serde(borrow)]
    channel: Cow<'a, str>,
    #[serde(rename = "clientSeq")]
    client_seq: u64,
    #[serde(borrow)]
    action: &'a RawValue,
}

/// A dispatch as read: its channel, clientSeq, action and the action's
/// text.
pub(super) struct Dispatched {
    pub(super) channel: String,
    pub(super) client_seq: u64,
    pub(super) action: Value,
    pub(super) action_text: String,
}

impl DispatchParams<'_> {
    /// The dispatch, when its clientSeq is in range and its action is an
    /// object.
    fn into_dispatched(self) -> Option<Dispatched> {
        if self.client_seq > MAX_SEQ {
            return None;
        }
        let Ok(action @ Value::Object(_)) = serde_json::from_str::<Value>(self.action.get()) else {
            return None;
        };
        Some(Dispatched {
            channel: self.channel.into_owned(),
            client_seq: self.client_seq,
            action,
            action_text: self.action.get().to_owned(),
        })
    }
}

/// Reads `dispatchAction`'s params, with an error that names what is
/// missing or wrong.
pub(super) fn dispatch_params(params: Params<'_>) -> Result<Dispatched, RpcError> {
    // A well-formed dispatch was read with its message; what is left is
    // read as a value, to tell what is wrong with it.
    if let Params::Dispatch(dispatched) = params {
        return Ok(dispatched);
    }
    let mut params = params.into_value()?;
    let channel = channel_param(&params)?;
    let client_seq = u64_param(&params, "clientSeq")?;
    let action = params
        .get_mut("action")
        .map(Value::take)
        .filter(Value::is_object)
        .ok_or_else(|| RpcError::invalid("params.action (an action object) is required."))?;
    let action_text = action.to_string();
    Ok(Dispatched {
        channel,
        client_seq,
        action,
        action_text,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn value(params: Params<'_>) -> Value {
        params.into_value().unwrap()
    }

    #[test]
    fn a_request_keeps_its_id_even_null_and_a_notification_has_none() {
        let m = read(r#"{"jsonrpc":"2.0","id":7,"method":"ping"}"#).unwrap();
        assert_eq!((m.id, m.method.as_ref()), (Some(Value::from(7)), "ping"));
        assert_eq!(value(m.params), Value::Null);
        let m = read(r#"{"jsonrpc":"2.0","id":null,"method":"ping","params":null}"#).unwrap();
        assert_eq!(m.id, Some(Value::Null));
        assert_eq!(value(m.params), Value::Null);
        let m = read(r#" {"method":"x","params":{"a":[1,2]}}"#).unwrap();
        assert_eq!(m.id, None);
        assert_eq!(value(m.params), serde_json::json!({"a": [1, 2]}));
    }

    #[test]
    fn what_is_not_a_request_is_told_why() {
        let (id, code, _) = read("{nope").err().unwrap();
        assert_eq!((id, code), (Value::Null, json_rpc_error_codes::PARSE_ERROR));
        let (id, code, _) = read(r#"{"id":3,"params":{}}"#).err().unwrap();
        assert_eq!(
            (id, code),
            (Value::from(3), json_rpc_error_codes::INVALID_REQUEST)
        );
        let (_, code, _) = read(r#"[1,"ping",null]"#).err().unwrap();
        assert_eq!(code, json_rpc_error_codes::INVALID_REQUEST);
        let (_, code, _) = read(r#"{"id":1,"method":5}"#).err().unwrap();
        assert_eq!(code, json_rpc_error_codes::INVALID_REQUEST);
        // A repeated key keeps its last value, as a JSON value reads it.
        let m = read(r#"{"id":1,"method":"a","method":"ping"}"#).unwrap();
        assert_eq!(m.method.as_ref(), "ping");
    }

    #[test]
    fn a_dispatch_reads_the_same_whichever_way_its_message_was_read() {
        let text = r#"{"method":"dispatchAction","params":{"channel":"ahp-session:/s",
            "clientSeq":4,"action":{"type":"session/titleChanged","title":"t\u00e9"}}}"#;
        let fast = dispatch_params(read(text).unwrap().params).unwrap();
        let parsed: Value = serde_json::from_str(text).unwrap();
        let slow = dispatch_params(Params::Parsed(parsed["params"].clone())).unwrap();
        for d in [&fast, &slow] {
            assert_eq!(d.channel, "ahp-session:/s");
            assert_eq!(d.client_seq, 4);
            assert_eq!(d.action["title"], "t\u{e9}");
            let echoed: Value = serde_json::from_str(&d.action_text).unwrap();
            assert_eq!(echoed, d.action);
        }
    }

    #[test]
    fn a_dispatch_is_read_in_one_pass_in_any_member_order_and_nothing_else_is() {
        let text = r#"{"params":{"action":{"type":"x"},"clientSeq":9,"channel":"c"},
            "id":[1],"jsonrpc":"2.0","method":"dispatchAction"}"#;
        let m = read(text).unwrap();
        assert_eq!(m.id, Some(serde_json::json!([1])));
        let Params::Dispatch(d) = m.params else {
            panic!("a well-formed dispatch is read in one pass");
        };
        assert_eq!((d.channel.as_str(), d.client_seq), ("c", 9));
        assert_eq!(d.action_text, r#"{"type":"x"}"#);
        // Another method whose params name a dispatch keeps its own.
        let text = r#"{"id":2,"method":"subscribe","params":{"channel":"c","clientSeq":1,
            "action":{"type":"dispatchAction"}}}"#;
        let m = read(text).unwrap();
        assert_eq!(m.method.as_ref(), "subscribe");
        assert!(matches!(m.params, Params::Text(Some(_))));
        // A repeated key is read the general way: the last one counts.
        let text = r#"{"method":"ping","method":"dispatchAction",
            "params":{"channel":"c","clientSeq":1,"action":{}}}"#;
        let m = read(text).unwrap();
        assert_eq!(m.method.as_ref(), "dispatchAction");
        assert_eq!(dispatch_params(m.params).unwrap().channel, "c");
    }

    #[test]
    fn a_dispatch_missing_a_part_names_it() {
        let cases = [
            (r#"{"channel":"c","clientSeq":1}"#, "params.action"),
            (
                r#"{"channel":"c","clientSeq":1,"action":[1]}"#,
                "params.action",
            ),
            (r#"{"clientSeq":1,"action":{}}"#, "params.channel"),
            (
                r#"{"channel":"c","clientSeq":-1,"action":{}}"#,
                "params.clientSeq",
            ),
            (
                r#"{"channel":"c","clientSeq":9223372036854775808,"action":{}}"#,
                "params.clientSeq",
            ),
        ];
        for (params, named) in cases {
            let text = format!(r#"{{"method":"dispatchAction","params":{params}}}"#);
            let err = dispatch_params(read(&text).unwrap().params).err().unwrap();
            assert!(err.message.contains(named), "{params}: {}", err.message);
        }
    }
}
