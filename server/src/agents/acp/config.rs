//! An ACP agent's modes and config options as the AHP session
//! configuration, and back.
//!
//! ACP gives a session's settings two ways: `modes` (a current mode among
//! available ones, changed with `session/set_mode`) and `configOptions`
//! (selects and booleans, each with an optional category such as `model`
//! or `thought_level`, changed with `session/set_config_option`, whose
//! answer is the full option set). AHP 1.0 has one: the session state's
//! `config {schema, values}`, a JSON-schema object whose properties a
//! client changes with `session/configChanged`.
//!
//! Each config option becomes a property named by its id (`enum` = its
//! values, `enumLabels` = their names); the modes become a property named
//! `mode`, unless an option already covers modes (category `mode`, or the
//! id `mode`), as ACP lets agents send both. Every property is
//! `sessionMutable`. The categories, which a property schema has no field
//! for, travel separately (the session state's `_meta`). A model option's
//! values are also the agent's `models` in the AHP root state.
//!
//! Options are kept as JSON so an option kind this version of the schema
//! does not know is carried, not lost.

use serde_json::{Map, Value, json};

/// The property name the modes take when no option covers them.
pub const MODE_PROPERTY: &str = "mode";

/// An ACP session's settings as the agent last reported them.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct AgentConfig {
    /// `SessionModeState` as JSON: `{currentModeId, availableModes[]}`.
    modes: Option<Value>,
    /// `SessionConfigOption`s as JSON.
    options: Vec<Value>,
}

/// One ACP request that moves the agent to a value.
#[derive(Debug, Clone, PartialEq)]
pub enum Setting {
    /// `session/set_mode` to this mode id.
    Mode(String),
    /// `session/set_config_option`: the option id and its value (a value id
    /// for a select, a boolean for a boolean).
    Option(String, Value),
}

impl AgentConfig {
    /// From what a `session/new`, `load` or `resume` answered.
    pub fn new<M: serde::Serialize, O: serde::Serialize>(modes: Option<&M>, options: &[O]) -> Self {
        Self {
            modes: modes.and_then(|m| serde_json::to_value(m).ok()),
            options: options
                .iter()
                .filter_map(|o| serde_json::to_value(o).ok())
                .collect(),
        }
    }

    /// Whether the agent offers nothing to configure.
    pub fn is_empty(&self) -> bool {
        self.modes.is_none() && self.options.is_empty()
    }

    /// The agent's current mode changed (`current_mode_update`).
    pub fn set_mode(&mut self, mode: &str) {
        if let Some(modes) = &mut self.modes {
            modes["currentModeId"] = json!(mode);
        }
    }

    /// The agent reported its full option set again (`config_option_update`,
    /// or the answer to `set_config_option`).
    pub fn set_options<O: serde::Serialize>(&mut self, options: &[O]) {
        self.options = options
            .iter()
            .filter_map(|o| serde_json::to_value(o).ok())
            .collect();
    }

    /// Whether the modes get a property of their own.
    fn modes_property(&self) -> bool {
        self.modes.is_some()
            && !self
                .options
                .iter()
                .any(|o| o["category"] == MODE_PROPERTY || o["id"].as_str() == Some(MODE_PROPERTY))
    }

    /// The AHP `SessionConfigState` (`{schema, values}`).
    pub fn to_ahp(&self) -> Value {
        let mut properties = Map::new();
        let mut values = Map::new();
        if self.modes_property()
            && let Some(modes) = &self.modes
        {
            let available = modes["availableModes"]
                .as_array()
                .cloned()
                .unwrap_or_default();
            properties.insert(
                MODE_PROPERTY.to_owned(),
                json!({
                    "type": "string",
                    "title": "Mode",
                    "enum": available.iter().map(|m| m["id"].clone()).collect::<Vec<_>>(),
                    "enumLabels": available.iter().map(|m| m["name"].clone()).collect::<Vec<_>>(),
                    "enumDescriptions": available
                        .iter()
                        .map(|m| m["description"].as_str().unwrap_or_default())
                        .collect::<Vec<_>>(),
                    "default": modes["currentModeId"],
                    "sessionMutable": true,
                }),
            );
            values.insert(MODE_PROPERTY.to_owned(), modes["currentModeId"].clone());
        }
        for option in &self.options {
            let Some(id) = option["id"].as_str() else {
                continue;
            };
            let mut property = json!({
                "title": option["name"].as_str().unwrap_or(id),
                "default": option["currentValue"],
                "sessionMutable": true,
            });
            if let Some(description) = option["description"].as_str() {
                property["description"] = json!(description);
            }
            match option["type"].as_str() {
                Some("boolean") => property["type"] = json!("boolean"),
                _ => {
                    let choices = choices(option);
                    property["type"] = json!("string");
                    property["enum"] =
                        json!(choices.iter().map(|c| &c["value"]).collect::<Vec<_>>());
                    property["enumLabels"] =
                        json!(choices.iter().map(|c| &c["name"]).collect::<Vec<_>>());
                    property["enumDescriptions"] = json!(
                        choices
                            .iter()
                            .map(|c| c["description"].as_str().unwrap_or_default())
                            .collect::<Vec<_>>()
                    );
                }
            }
            properties.insert(id.to_owned(), property);
            values.insert(id.to_owned(), option["currentValue"].clone());
        }
        json!({"schema": {"type": "object", "properties": properties}, "values": values})
    }

    /// Each property's ACP category (`mode` for the modes' own property).
    pub fn categories(&self) -> Value {
        let mut categories = Map::new();
        if self.modes_property() {
            categories.insert(MODE_PROPERTY.to_owned(), json!("mode"));
        }
        for option in &self.options {
            if let (Some(id), Some(category)) = (option["id"].as_str(), option["category"].as_str())
            {
                categories.insert(id.to_owned(), json!(category));
            }
        }
        Value::Object(categories)
    }

    /// The option that picks the model, if the agent has one.
    pub fn model_option(&self) -> Option<&str> {
        self.options
            .iter()
            .find(|o| o["category"] == "model")
            .and_then(|o| o["id"].as_str())
    }

    /// The models the agent offers, as AHP `SessionModelInfo`s.
    pub fn models(&self, provider: &str) -> Vec<Value> {
        let Some(option) = self.options.iter().find(|o| o["category"] == "model") else {
            return Vec::new();
        };
        choices(option)
            .iter()
            .map(|c| json!({"id": c["value"], "provider": provider, "name": c["name"]}))
            .collect()
    }

    /// The requests that move the agent to `values` (only those that
    /// differ from what it has now), in the order given. A key the agent
    /// does not offer is skipped: the session's config was checked against
    /// its schema, and an option an agent dropped since cannot be set.
    pub fn settings_for(&self, values: &Map<String, Value>) -> Vec<Setting> {
        self.settings(values, true)
    }

    /// The requests that set every one of `values` the agent offers, also
    /// those it has already: for another session of the agent's, which
    /// may have other values than the one this configuration follows.
    pub fn every_setting(&self, values: &Map<String, Value>) -> Vec<Setting> {
        self.settings(values, false)
    }

    fn settings(&self, values: &Map<String, Value>, only_changed: bool) -> Vec<Setting> {
        let current = self.to_ahp();
        let modes = self.modes_property();
        values
            .iter()
            .filter(|(key, value)| {
                !only_changed || current["values"].get(key.as_str()) != Some(*value)
            })
            .filter_map(|(key, value)| {
                if modes && key == MODE_PROPERTY {
                    return value.as_str().map(|m| Setting::Mode(m.to_owned()));
                }
                self.options
                    .iter()
                    .any(|o| o["id"] == key.as_str())
                    .then(|| Setting::Option(key.clone(), value.clone()))
            })
            .collect()
    }
}

/// A select option's choices, groups flattened (`[{value, name, description?}]`).
fn choices(option: &Value) -> Vec<Value> {
    let Some(list) = option["options"].as_array() else {
        return Vec::new();
    };
    list.iter()
        .flat_map(
            |entry| match entry.get("options").and_then(Value::as_array) {
                // A group: its options.
                Some(grouped) => grouped.clone(),
                None => vec![entry.clone()],
            },
        )
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> AgentConfig {
        let modes = json!({"currentModeId": "ask", "availableModes": [
            {"id": "ask", "name": "Ask"}, {"id": "code", "name": "Code", "description": "Writes code"}]});
        let options = vec![
            json!({"id": "model", "name": "Model", "category": "model", "type": "select",
                   "currentValue": "fast", "options": [
                       {"value": "fast", "name": "Fast"},
                       {"group": "big", "name": "Big ones", "options": [{"value": "smart", "name": "Smart"}]}]}),
            json!({"id": "verbose", "name": "Verbose", "type": "boolean", "currentValue": false}),
        ];
        AgentConfig::new(Some(&modes), &options)
    }

    #[test]
    fn modes_and_options_become_properties_with_values() {
        let config = sample().to_ahp();
        let properties = &config["schema"]["properties"];
        assert_eq!(properties["mode"]["enum"], json!(["ask", "code"]));
        assert_eq!(properties["mode"]["enumLabels"], json!(["Ask", "Code"]));
        assert_eq!(properties["model"]["enum"], json!(["fast", "smart"]));
        assert_eq!(properties["verbose"]["type"], "boolean");
        assert_eq!(properties["model"]["sessionMutable"], true);
        assert_eq!(
            config["values"],
            json!({"mode": "ask", "model": "fast", "verbose": false})
        );
        assert_eq!(
            sample().categories(),
            json!({"mode": "mode", "model": "model"})
        );
        assert_eq!(sample().models("fake")[1]["id"], "smart");
    }

    #[test]
    fn only_changed_values_become_requests_and_a_mode_option_replaces_modes() {
        let mut wanted = Map::new();
        wanted.insert("mode".into(), json!("code"));
        wanted.insert("model".into(), json!("fast"));
        wanted.insert("verbose".into(), json!(true));
        wanted.insert("gone".into(), json!("x"));
        assert_eq!(
            sample().settings_for(&wanted),
            vec![
                Setting::Mode("code".into()),
                Setting::Option("verbose".into(), json!(true))
            ]
        );
        let covered = AgentConfig::new(
            Some(&json!({"currentModeId": "a", "availableModes": [{"id": "a", "name": "A"}]})),
            &[
                json!({"id": "m", "name": "Mode", "category": "mode", "type": "select",
                     "currentValue": "a", "options": [{"value": "a", "name": "A"}]}),
            ],
        );
        let config = covered.to_ahp();
        assert!(config["schema"]["properties"].get("mode").is_none());
        assert!(config["schema"]["properties"].get("m").is_some());
    }
}
