//! The rules a session configuration change must keep (AHP's reducer for
//! `session/configChanged` merges whatever it is given): every key is a
//! property of the schema, the property may change during a session, and
//! the value is of its type and among its choices.

use serde_json::{Map, Value};

/// Checks `change` against the `schema` of a `SessionConfigState`
/// (`{schema, values}`); `creating` allows properties that may not change
/// mid-session. The message names the key and what it may be.
pub fn check_values(
    config: &Value,
    change: &Map<String, Value>,
    creating: bool,
) -> Result<(), String> {
    let properties = config
        .pointer("/schema/properties")
        .and_then(Value::as_object);
    for (key, value) in change {
        let Some(property) = properties.and_then(|p| p.get(key)) else {
            let offered: Vec<&String> = properties.map(|p| p.keys().collect()).unwrap_or_default();
            return Err(if offered.is_empty() {
                format!("The agent offers no configuration; {key:?} cannot be set.")
            } else {
                format!(
                    "The agent has no option {key:?}; it offers: {}.",
                    offered
                        .iter()
                        .map(|k| k.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                )
            });
        };
        if !creating && property.get("sessionMutable") != Some(&Value::Bool(true)) {
            return Err(format!(
                "Option {key:?} is set when a session is created and cannot change afterwards."
            ));
        }
        if property.get("readOnly") == Some(&Value::Bool(true)) {
            return Err(format!("Option {key:?} is read-only."));
        }
        let typed = match property.get("type").and_then(Value::as_str) {
            Some("boolean") => value.is_boolean(),
            Some("string") => value.is_string(),
            Some("number") => value.is_number(),
            Some("integer") => value.is_i64() || value.is_u64(),
            _ => true,
        };
        if !typed {
            return Err(format!(
                "Option {key:?} takes a {}, not {value}.",
                property["type"].as_str().unwrap_or("value")
            ));
        }
        if let Some(choices) = property.get("enum").and_then(Value::as_array)
            && !choices.contains(value)
        {
            let shown: Vec<String> = choices.iter().map(Value::to_string).collect();
            return Err(format!(
                "Option {key:?} cannot be {value}; it may be {}.",
                shown.join(", ")
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn keys_types_choices_and_mutability_are_checked() {
        let config = json!({"schema": {"type": "object", "properties": {
            "model": {"type": "string", "enum": ["fast", "smart"], "sessionMutable": true},
            "verbose": {"type": "boolean", "sessionMutable": true},
            "region": {"type": "string"},
        }}, "values": {}});
        let change = |v: Value| v.as_object().unwrap().clone();
        assert!(
            check_values(
                &config,
                &change(json!({"model": "smart", "verbose": true})),
                false
            )
            .is_ok()
        );
        for (bad, needle) in [
            (json!({"model": "huge"}), "it may be \"fast\", \"smart\""),
            (json!({"verbose": "yes"}), "takes a boolean"),
            (json!({"nope": 1}), "no option \"nope\""),
            (json!({"region": "eu"}), "cannot change afterwards"),
        ] {
            let err = check_values(&config, &change(bad.clone()), false).unwrap_err();
            assert!(err.contains(needle), "{bad}: {err}");
        }
        assert!(check_values(&config, &change(json!({"region": "eu"})), true).is_ok());
        let err = check_values(&json!({}), &change(json!({"a": 1})), true).unwrap_err();
        assert!(err.contains("no configuration"), "{err}");
    }
}
