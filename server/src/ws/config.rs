//! AHP `resolveSessionConfig` and `sessionConfigCompletions`: what a new
//! session of an agent can be configured with, before it is created.

use serde_json::{Value, json};

use super::connection::Connection;
use super::rpc::RpcError;

impl Connection {
    /// `resolveSessionConfig {provider?, config?}`: the agent's options (its
    /// modes, models and settings as its probe session showed them) with
    /// the given values, checked, as the `{schema, values}` to pass on to
    /// `createSession`.
    pub(super) async fn resolve_session_config(
        &mut self,
        params: Value,
    ) -> Result<Value, RpcError> {
        let provider = params.get("provider").and_then(Value::as_str);
        let values = config_param(&params)?;
        self.engine
            .resolve_config(provider, values.as_ref())
            .map_err(RpcError::from)
    }

    /// `sessionConfigCompletions {provider?, property, query?}`: the choices
    /// of one property whose text contains the query (case-insensitive).
    pub(super) async fn session_config_completions(
        &mut self,
        params: Value,
    ) -> Result<Value, RpcError> {
        let provider = params.get("provider").and_then(Value::as_str);
        let property = params
            .get("property")
            .and_then(Value::as_str)
            .ok_or_else(|| RpcError::invalid("params.property (a property name) is required."))?;
        let query = params
            .get("query")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_lowercase();
        let config = self
            .engine
            .resolve_config(provider, config_param(&params)?.as_ref())
            .map_err(RpcError::from)?;
        let schema = config
            .pointer(&format!("/schema/properties/{property}"))
            .ok_or_else(|| {
                RpcError::invalid(&format!(
                    "The agent has no configuration property {property:?}."
                ))
            })?;
        let choices = schema["enum"].as_array().cloned().unwrap_or_default();
        let items: Vec<Value> = choices
            .iter()
            .enumerate()
            .filter_map(|(i, value)| {
                let value = value.as_str()?;
                let label = schema["enumLabels"][i].as_str().unwrap_or(value);
                let description = schema["enumDescriptions"][i]
                    .as_str()
                    .filter(|d| !d.is_empty());
                let matches = query.is_empty()
                    || value.to_lowercase().contains(&query)
                    || label.to_lowercase().contains(&query);
                matches.then(|| {
                    let mut item = json!({"value": value, "label": label});
                    if let Some(description) = description {
                        item["description"] = json!(description);
                    }
                    item
                })
            })
            .collect();
        Ok(json!({ "items": items }))
    }
}

/// The optional `config` object of a request's params.
fn config_param(params: &Value) -> Result<Option<serde_json::Map<String, Value>>, RpcError> {
    match params.get("config") {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Object(config)) => Ok(Some(config.clone())),
        Some(_) => Err(RpcError::invalid(
            "params.config must be an object of configuration values.",
        )),
    }
}
