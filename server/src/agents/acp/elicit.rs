//! An agent's question (ACP `elicitation/create`) as an AHP chat input
//! request, and the user's answer back.
//!
//! A form elicitation carries a restricted JSON schema: an object whose
//! properties are strings (with `enum`/`oneOf`: a choice), numbers,
//! integers, booleans and arrays of choices. Each property becomes one AHP
//! question (`text`, `number`, `integer`, `boolean`, `single-select`,
//! `multi-select`) with the property's name as its id; a URL elicitation
//! becomes a request carrying the URL. The answers come back keyed by
//! question id and go to the agent as the form's `content`, each value of
//! its property's type; skipped questions are left out.

use serde_json::{Map, Value, json};

/// The AHP `ChatInputRequest` for an ACP `CreateElicitationRequest` (as
/// JSON), with the id `id`.
pub fn input_request(id: &str, elicitation: &Value) -> Value {
    let mut request = json!({"id": id});
    if let Some(message) = elicitation["message"].as_str() {
        request["message"] = json!(message);
    }
    if let Some(url) = elicitation["url"].as_str() {
        request["url"] = json!(url);
        return request;
    }
    let schema = &elicitation["requestedSchema"];
    let required: Vec<&str> = schema["required"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .collect();
    let questions: Vec<Value> = schema["properties"]
        .as_object()
        .into_iter()
        .flatten()
        .map(|(key, property)| question(key, property, required.contains(&key.as_str())))
        .collect();
    request["questions"] = Value::Array(questions);
    request
}

/// One property as one question.
fn question(key: &str, property: &Value, required: bool) -> Value {
    let title = property["title"].as_str();
    let message = property["description"]
        .as_str()
        .or(title)
        .unwrap_or(key)
        .to_owned();
    let mut q = json!({"id": key, "message": message, "required": required});
    if let Some(title) = title {
        q["title"] = json!(title);
    }
    let copy = |q: &mut Value, from: &str, to: &str| {
        if let Some(value) = property.get(from).filter(|v| !v.is_null()) {
            q[to] = value.clone();
        }
    };
    match property["type"].as_str() {
        Some("string") if !choices(property).is_empty() => {
            q["kind"] = json!("single-select");
            q["options"] = json!(choices(property));
        }
        Some("number" | "integer") => {
            q["kind"] = property["type"].clone();
            copy(&mut q, "minimum", "min");
            copy(&mut q, "maximum", "max");
            copy(&mut q, "default", "defaultValue");
        }
        Some("boolean") => {
            q["kind"] = json!("boolean");
            copy(&mut q, "default", "defaultValue");
        }
        Some("array") => {
            q["kind"] = json!("multi-select");
            q["options"] = json!(choices(&property["items"]));
            copy(&mut q, "minItems", "min");
            copy(&mut q, "maxItems", "max");
        }
        _ => {
            q["kind"] = json!("text");
            copy(&mut q, "format", "format");
            copy(&mut q, "minLength", "min");
            copy(&mut q, "maxLength", "max");
            copy(&mut q, "default", "defaultValue");
        }
    }
    q
}

/// A property's (or an array's items') choices as AHP options: `enum`
/// values, or `oneOf`/`anyOf` entries with `const` and `title`.
fn choices(schema: &Value) -> Vec<Value> {
    if let Some(values) = schema["enum"].as_array() {
        return values
            .iter()
            .filter_map(Value::as_str)
            .map(|v| json!({"id": v, "label": v}))
            .collect();
    }
    schema["oneOf"]
        .as_array()
        .or_else(|| schema["anyOf"].as_array())
        .into_iter()
        .flatten()
        .filter_map(|entry| {
            let value = entry["const"].as_str()?;
            Some(json!({"id": value, "label": entry["title"].as_str().unwrap_or(value)}))
        })
        .collect()
}

/// The ACP `CreateElicitationResponse` (as JSON) for an AHP completion:
/// `response` (`accept`, `decline` or `cancel`) and its answers, valued as
/// the elicitation's schema types them.
pub fn response(elicitation: &Value, response: &str, answers: &Value) -> Value {
    match response {
        "accept" => {
            let properties = &elicitation["requestedSchema"]["properties"];
            let mut content = Map::new();
            for (key, answer) in answers.as_object().into_iter().flatten() {
                if answer["state"] == "skipped" {
                    continue;
                }
                if let Some(value) = answer_value(&answer["value"], &properties[key.as_str()]) {
                    content.insert(key.clone(), value);
                }
            }
            json!({"action": "accept", "content": content})
        }
        "decline" => json!({"action": "decline"}),
        _ => json!({"action": "cancel"}),
    }
}

/// One AHP answer value as the property's JSON type.
fn answer_value(value: &Value, property: &Value) -> Option<Value> {
    let inner = &value["value"];
    match value["kind"].as_str()? {
        "number" if property["type"] == "integer" => {
            inner.as_f64().map(|n| json!(n.round() as i64))
        }
        "text" | "number" | "boolean" | "selected" => Some(inner.clone()),
        "selected-many" => {
            let mut all: Vec<Value> = inner.as_array().cloned().unwrap_or_default();
            all.extend(
                value["freeformValues"]
                    .as_array()
                    .cloned()
                    .unwrap_or_default(),
            );
            Some(Value::Array(all))
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn form() -> Value {
        json!({"message": "Deploy where?", "requestedSchema": {"type": "object", "required": ["env"], "properties": {
            "env": {"type": "string", "title": "Environment", "enum": ["staging", "prod"]},
            "replicas": {"type": "integer", "minimum": 1, "maximum": 9, "default": 2},
            "note": {"type": "string", "description": "Anything else?", "maxLength": 100},
            "notify": {"type": "boolean", "default": true},
            "regions": {"type": "array", "items": {"anyOf": [
                {"const": "eu", "title": "Europe"}, {"const": "us", "title": "America"}]}, "minItems": 1},
        }}})
    }

    #[test]
    fn each_property_becomes_a_question_of_its_kind() {
        let request = input_request("q1", &form());
        assert_eq!(request["message"], "Deploy where?");
        let questions = request["questions"].as_array().unwrap();
        let by_id = |id: &str| questions.iter().find(|q| q["id"] == id).unwrap().clone();
        assert_eq!(by_id("env")["kind"], "single-select");
        assert_eq!(by_id("env")["required"], true);
        assert_eq!(
            by_id("env")["options"][1],
            json!({"id": "prod", "label": "prod"})
        );
        assert_eq!(by_id("replicas")["kind"], "integer");
        assert_eq!(by_id("replicas")["max"], 9);
        assert_eq!(by_id("note")["kind"], "text");
        assert_eq!(by_id("note")["message"], "Anything else?");
        assert_eq!(by_id("notify")["defaultValue"], true);
        assert_eq!(by_id("regions")["kind"], "multi-select");
        assert_eq!(by_id("regions")["options"][0]["label"], "Europe");
        let url = input_request(
            "q2",
            &json!({"message": "Log in", "mode": "url", "url": "https://x/login"}),
        );
        assert_eq!(url["url"], "https://x/login");
        assert!(url.get("questions").is_none());
    }

    #[test]
    fn answers_become_the_forms_content_typed_by_its_schema() {
        let answers = json!({
            "env": {"state": "submitted", "value": {"kind": "selected", "value": "prod"}},
            "replicas": {"state": "submitted", "value": {"kind": "number", "value": 3.0}},
            "notify": {"state": "draft", "value": {"kind": "boolean", "value": false}},
            "regions": {"state": "submitted", "value": {"kind": "selected-many", "value": ["eu"]}},
            "note": {"state": "skipped"},
        });
        assert_eq!(
            response(&form(), "accept", &answers),
            json!({"action": "accept", "content": {
                "env": "prod", "replicas": 3, "notify": false, "regions": ["eu"]}})
        );
        assert_eq!(
            response(&form(), "decline", &json!({})),
            json!({"action": "decline"})
        );
        assert_eq!(
            response(&form(), "cancel", &json!({})),
            json!({"action": "cancel"})
        );
    }
}
