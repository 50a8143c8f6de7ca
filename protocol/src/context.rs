//! Working context (from velesdb-memory's `LoadedWorkingContext`): what an
//! agent was doing in a session, saved per `(project, session)` so a later
//! session can pick it up.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use utoipa::ToSchema;

/// The largest saved working context, in bytes of JSON. Checked before any
/// write.
pub const MAX_CONTEXT_BYTES: usize = 1024 * 1024;

/// A fact with an optional source.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ContextFact {
    /// The fact.
    pub text: String,
    /// Where it came from (a source reference object).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Object>)]
    pub source: Option<Map<String, Value>>,
}

/// What an agent was doing: goal, constraints, facts, hypotheses,
/// decisions, evidence and next actions. Every field may be absent.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
#[schema(example = json!({"goal": "Ship the login fix", "activeConstraints": [{"text": "No schema changes"}], "pendingActions": ["Run the e2e suite"]}))]
pub struct WorkingContext {
    /// What the work is for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub goal: Option<String>,
    /// Constraints in force.
    #[serde(default)]
    pub active_constraints: Vec<ContextFact>,
    /// Facts checked to be true.
    #[serde(default)]
    pub verified_facts: Vec<ContextFact>,
    /// Ideas not yet checked.
    #[serde(default)]
    pub open_hypotheses: Vec<ContextFact>,
    /// Decisions taken (decision reference objects).
    #[serde(default)]
    #[schema(value_type = Vec<Object>)]
    pub decisions: Vec<Map<String, Value>>,
    /// Exact evidence (source reference objects).
    #[serde(default)]
    #[schema(value_type = Vec<Object>)]
    pub exact_evidence: Vec<Map<String, Value>>,
    /// What to do next.
    #[serde(default)]
    pub pending_actions: Vec<String>,
}

/// A goal counts when it holds a character other than ASCII whitespace
/// (space, tab, line feed, carriage return), as an ECMA-262 pattern. The
/// rule is this narrow so that every JSON Schema validator, whatever its
/// idea of Unicode whitespace, agrees with [`WorkingContext::is_empty`].
pub const GOAL_PATTERN: &str = r"[^ \t\n\r]";

/// The lists of a working context, by their JSON names; one non-empty list
/// makes a context non-empty.
const LISTS: [&str; 6] = [
    "activeConstraints",
    "verifiedFacts",
    "openHypotheses",
    "decisions",
    "exactEvidence",
    "pendingActions",
];

fn is_blank(goal: &str) -> bool {
    goal.bytes()
        .all(|b| matches!(b, b' ' | b'\t' | b'\n' | b'\r'))
}

impl WorkingContext {
    /// True when there is nothing in it: saving it would erase earlier
    /// state, so saving an empty context is refused.
    pub fn is_empty(&self) -> bool {
        self.goal.as_deref().is_none_or(is_blank)
            && self.active_constraints.is_empty()
            && self.verified_facts.is_empty()
            && self.open_hypotheses.is_empty()
            && self.decisions.is_empty()
            && self.exact_evidence.is_empty()
            && self.pending_actions.is_empty()
    }
}

/// What [`WorkingContext::is_empty`] refuses, as JSON Schema: a goal with
/// a character other than ASCII whitespace, or at least one entry in one of
/// the lists (`anyOf`). The OpenAPI document adds it to the derived schema
/// of a saved context, so a client generated from it never sends an empty one.
pub fn non_empty_schema() -> utoipa::openapi::schema::Schema {
    use utoipa::openapi::schema::{AnyOfBuilder, ArrayBuilder, ObjectBuilder, SchemaType, Type};
    let goal = ObjectBuilder::new()
        .schema_type(Type::String)
        .pattern(Some(GOAL_PATTERN));
    let mut rule =
        AnyOfBuilder::new().item(ObjectBuilder::new().required("goal").property("goal", goal));
    for list in LISTS {
        let entries = ArrayBuilder::new()
            // Any entry: the derived schema beside this rule types them.
            .items(ObjectBuilder::new().schema_type(SchemaType::AnyValue))
            .min_items(Some(1));
        rule = rule.item(ObjectBuilder::new().required(list).property(list, entries));
    }
    rule.into()
}

/// The answer to a working-context lookup.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct LoadedWorkingContext {
    /// Whether a context was saved under exactly this project and session.
    pub found: bool,
    /// The saved context, or null for a fresh start.
    pub working: Option<WorkingContext>,
    /// The project's other saved sessions, most recently saved first; never
    /// the requested one; listed on a hit and on a miss (a typo in the
    /// session name should not silently start fresh).
    #[serde(default)]
    pub other_sessions: Vec<String>,
}

/// One saved working context in a project listing.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct WorkingContextSession {
    /// Session name.
    pub session: String,
    /// When it was last saved (RFC 3339).
    pub saved_at: String,
}

/// A page of a project's saved working contexts, most recently saved
/// first.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct WorkingContextList {
    /// The sessions.
    pub sessions: Vec<WorkingContextSession>,
    /// Pass as `cursor` for the next page; absent on the last one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_cursor: Option<String>,
}

/// The answer to a save.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct SavedWorkingContext {
    /// Project name.
    pub project: String,
    /// Session name.
    pub session: String,
    /// When it was saved (RFC 3339).
    pub saved_at: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn emptiness_ignores_a_blank_goal() {
        assert!(WorkingContext::default().is_empty());
        let blank = WorkingContext {
            goal: Some("  ".into()),
            ..Default::default()
        };
        assert!(blank.is_empty());
        let todo = WorkingContext {
            pending_actions: vec!["x".into()],
            ..Default::default()
        };
        assert!(!todo.is_empty());
        let ideographic_space = WorkingContext {
            goal: Some("\u{3000}".into()),
            ..Default::default()
        };
        assert!(
            !ideographic_space.is_empty(),
            "only ASCII whitespace is blank"
        );
    }

    #[test]
    fn the_schema_names_every_list() {
        let mut full = serde_json::to_value(WorkingContext::default()).unwrap();
        let object = full.as_object_mut().unwrap();
        object.remove("goal");
        let mut names: Vec<&str> = object.keys().map(String::as_str).collect();
        names.sort_unstable();
        let mut lists = LISTS.to_vec();
        lists.sort_unstable();
        assert_eq!(names, lists);
    }
}
