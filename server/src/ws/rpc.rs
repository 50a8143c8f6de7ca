//! JSON-RPC errors and parameter helpers.

use ahp_types::errors::{ahp_error_codes, json_rpc_error_codes};
use serde_json::Value;
use tether_protocol::channel::Channel;

use crate::engine::EngineError;

/// A JSON-RPC error answer.
#[derive(Debug)]
pub(super) struct RpcError {
    pub(super) code: i32,
    pub(super) message: String,
    pub(super) data: Option<Value>,
}

impl RpcError {
    pub(super) fn new(code: i32, message: String) -> Self {
        Self {
            code,
            message,
            data: None,
        }
    }

    pub(super) fn invalid(message: &str) -> Self {
        Self::new(json_rpc_error_codes::INVALID_PARAMS, message.to_owned())
    }

    pub(super) fn unavailable(err: impl std::fmt::Display) -> Self {
        tracing::warn!(error = %err, "request failed on storage");
        Self::new(
            json_rpc_error_codes::INTERNAL_ERROR,
            "Storage unavailable; try again.".to_owned(),
        )
    }
}

impl From<EngineError> for RpcError {
    fn from(err: EngineError) -> Self {
        let code = match &err {
            EngineError::NotFound(_) => ahp_error_codes::SESSION_NOT_FOUND,
            EngineError::AlreadyExists(_) => ahp_error_codes::SESSION_ALREADY_EXISTS,
            EngineError::Conflict(_) => ahp_error_codes::CONFLICT,
            EngineError::InvalidParams(_) => json_rpc_error_codes::INVALID_PARAMS,
            EngineError::ProviderNotFound(_) => ahp_error_codes::PROVIDER_NOT_FOUND,
            EngineError::Forbidden(_) => ahp_error_codes::PERMISSION_DENIED,
            EngineError::Unavailable(_) => json_rpc_error_codes::INTERNAL_ERROR,
        };
        Self::new(code, err.to_string())
    }
}

/// `params.clientId`: 1 to 256 characters.
pub(super) fn client_id_param(params: &Value) -> Result<String, RpcError> {
    params
        .get("clientId")
        .and_then(Value::as_str)
        .filter(|c| !c.is_empty() && c.len() <= 256)
        .map(str::to_owned)
        .ok_or_else(|| RpcError::invalid("params.clientId (1 to 256 characters) is required."))
}

/// The largest sequence number AHP carries: its integers are signed 64-bit.
pub(super) const MAX_SEQ: u64 = i64::MAX as u64;

/// A required sequence-number parameter, `0..=2^63-1`.
pub(super) fn u64_param(params: &Value, name: &str) -> Result<u64, RpcError> {
    params
        .get(name)
        .and_then(Value::as_u64)
        .filter(|n| *n <= MAX_SEQ)
        .ok_or_else(|| {
            RpcError::invalid(&format!(
                "params.{name} (an integer from 0 to {MAX_SEQ}) is required."
            ))
        })
}

/// `params.channel`: a string (parsed by the caller).
pub(super) fn channel_param(params: &Value) -> Result<String, RpcError> {
    params
        .get("channel")
        .and_then(Value::as_str)
        .map(str::to_owned)
        .ok_or_else(|| RpcError::invalid("params.channel (a channel URI) is required."))
}

/// `params.channel` as a session id: an `ahp-session:/<id>` URI.
pub(super) fn session_param(params: &Value) -> Result<String, RpcError> {
    match Channel::parse(&channel_param(params)?) {
        Ok(Channel::Session(id)) => Ok(id),
        Ok(_) => Err(RpcError::invalid(
            "params.channel must be an ahp-session:/<id> URI.",
        )),
        Err(err) => Err(RpcError::invalid(&format!("{err}."))),
    }
}

/// A required `params.<name>` array of strings; `what` describes it.
pub(super) fn strings_param(
    params: &Value,
    name: &str,
    what: &str,
) -> Result<Vec<String>, RpcError> {
    params
        .get(name)
        .cloned()
        .and_then(|v| serde_json::from_value(v).ok())
        .ok_or_else(|| RpcError::invalid(&format!("params.{name} ({what}) is required.")))
}
