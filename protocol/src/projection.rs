//! What a transcript says about its session: a pure fold over its actions
//! (from aion-core's `AssistantSessionProjection`).
//!
//! The server keeps the fold's result as the session read model, written in
//! the same transaction as each append; folding the stored transcript afresh
//! gives the same value (invariant 5).

use std::borrow::Cow;
use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::ToSchema;

use crate::actions::{
    AGENT_OPENED, COMMANDS_ADVERTISED, COMMANDS_META, CONTEXT_SHARED, DOCUMENT_EDITED, PLAN_META,
    SESSION_SETTLED, USAGE_META, action_type, field,
};

/// How many characters of the first turn's text make a derived title.
pub const TITLE_CHARACTERS: usize = 80;

/// The cause reported for a session with no live agent and no settling record.
pub const NO_SETTLING_RECORD: &str = "no_settling_record";

/// A session's state as the projection reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub enum SessionLifeState {
    /// An agent is attached and running.
    Live,
    /// No agent runs; the session can be continued.
    Dormant,
    /// Put away by its owner; can be reloaded, but is never "current".
    Closed,
    /// Over for good. Absorbing: nothing moves a session out of it.
    Ended,
}

impl SessionLifeState {
    /// The name stored in the read model and accepted by `?state=`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Live => "live",
            Self::Dormant => "dormant",
            Self::Closed => "closed",
            Self::Ended => "ended",
        }
    }
}

/// A command the agent advertised.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct AdvertisedCommand {
    /// Command name.
    pub name: String,
    /// What it does.
    #[serde(default)]
    pub description: String,
    /// A hint for its input.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub input_hint: Option<String>,
}

/// The fold's accumulated facts.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Projection {
    /// The last settling record: state and cause.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub settled: Option<Settled>,
    /// The agent's own session handle from its most recent open.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub acp_session_ref: Option<String>,
    /// Whether the agent said, at its most recent open, that it can load sessions.
    #[serde(default)]
    pub load_session: bool,
    /// The agent's own session handle of each chat other than the default
    /// one (ACP has one conversation per session), by chat URI.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub acp_chat_refs: BTreeMap<String, String>,
    /// Turns started.
    #[serde(default)]
    pub turns: u64,
    /// The first turn's text, the fallback title.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub first_turn_text: Option<String>,
    /// The turn that started and has not completed, failed or been cancelled.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub open_turn_id: Option<String>,
    /// The most recently shared on-screen context.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub latest_context: Option<Value>,
    /// How many document edit batches have been folded; never rewinds.
    #[serde(default)]
    pub document_revision: u64,
    /// The commands the agent advertised most recently (replaced whole).
    #[serde(default)]
    pub commands: Vec<AdvertisedCommand>,
    /// The explicit AHP title, when one was set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub explicit_title: Option<String>,
    /// What the agent reported it used: tokens summed over turns, its
    /// latest context figures and its cost.
    #[serde(default)]
    pub usage: UsageTotals,
    /// The agent's current plan, as it last reported it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub plan: Option<Plan>,
}

/// An agent's plan: what it means to do, step by step (ACP's plan,
/// replaced whole at each report).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Plan {
    /// The chat whose turn made it, when it was made in a turn.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub chat: Option<String>,
    /// The turn that made it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub turn_id: Option<String>,
    /// Its steps, in order.
    #[serde(default)]
    pub entries: Vec<PlanEntry>,
}

/// One step of a plan.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct PlanEntry {
    /// What the step is.
    pub content: String,
    /// `high`, `medium` or `low`.
    #[serde(default)]
    pub priority: String,
    /// `pending`, `in_progress` or `completed`.
    #[serde(default)]
    pub status: String,
}

/// Usage the agent reported over a session.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct UsageTotals {
    /// Input tokens, summed over turns (each turn's latest report).
    #[serde(default)]
    pub input_tokens: u64,
    /// Output tokens, summed over turns (each turn's latest report).
    #[serde(default)]
    pub output_tokens: u64,
    /// Tokens in the agent's context at its latest report.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub context_used: Option<u64>,
    /// The agent's context window at its latest report.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub context_size: Option<u64>,
    /// The session's cost so far: the sum of each agent session's latest
    /// report (ACP's cost is cumulative per ACP session, and each chat has
    /// its own), in the currency of the latest report.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cost: Option<Cost>,
    /// Each agent session's latest cost report, by its ACP session id
    /// (`""`: reports that name none, as before sessions were told apart).
    /// At most [`COST_SOURCES`]: past them, the one that spent least goes
    /// to `carried`.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schema(ignore)]
    pub costs: BTreeMap<String, Cost>,
    /// What agent sessions no longer kept apart had spent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(ignore)]
    pub carried: Option<Cost>,
    /// The turn of the latest token report and its figures, so a turn's
    /// later report replaces its earlier one in the sums.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(ignore)]
    pub last_turn: Option<(String, u64, u64)>,
}

/// An amount of money (or credits).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Cost {
    /// How much.
    pub amount: f64,
    /// ISO 4217 currency code, or a unit such as `credits`.
    pub currency: String,
}

impl UsageTotals {
    /// Folds one `chat/usage` (AHP `UsageInfo`, with Tether's `_meta`).
    fn turn_usage(&mut self, turn: &str, usage: &Value) {
        let count = |key: &str| usage.get(key).and_then(Value::as_u64);
        let (input, output) = (count("inputTokens"), count("outputTokens"));
        if input.is_some() || output.is_some() {
            let (input, output) = (input.unwrap_or(0), output.unwrap_or(0));
            let (before_in, before_out) = match &self.last_turn {
                Some((last, i, o)) if last == turn => (*i, *o),
                _ => (0, 0),
            };
            self.input_tokens = (self.input_tokens + input).saturating_sub(before_in);
            self.output_tokens = (self.output_tokens + output).saturating_sub(before_out);
            self.last_turn = Some((turn.to_owned(), input, output));
        }
        if let Some(meta) = usage.get("_meta") {
            self.reported(meta);
        }
    }

    /// Folds the context and cost figures of a report (the `_meta` of a
    /// `chat/usage`, or the session's [`USAGE_META`]).
    fn reported(&mut self, meta: &Value) {
        let count = |key: &str| meta.get(key).and_then(Value::as_u64);
        if let Some(used) = count("tether/contextUsed").or_else(|| count("used")) {
            self.context_used = Some(used);
        }
        if let Some(size) = count("tether/contextWindow").or_else(|| count("size")) {
            self.context_size = Some(size);
        }
        let cost = meta.get("tether/cost").or_else(|| meta.get("cost"));
        if let Some(cost) = cost
            .cloned()
            .and_then(|c| serde_json::from_value::<Cost>(c).ok())
        {
            let of = meta
                .get("tether/costOf")
                .or_else(|| meta.get("costOf"))
                .and_then(Value::as_str)
                .unwrap_or_default();
            self.cost_reported(of, cost);
        }
    }

    /// Keeps `cost` as agent session `of`'s latest report; the session's
    /// cost becomes the sum of them all (and what was carried) in its
    /// currency.
    fn cost_reported(&mut self, of: &str, cost: Cost) {
        self.costs_from_before();
        if !of.is_empty() {
            // Reports that named no session came before sessions were
            // told apart: a named one takes over from them.
            self.costs.remove("");
        }
        if !self.costs.contains_key(of) && self.costs.len() >= COST_SOURCES {
            // The one that spent least (the same in every fold of the same
            // reports), its amount carried.
            let least = self
                .costs
                .iter()
                .min_by(|a, b| a.1.amount.total_cmp(&b.1.amount))
                .map(|(of, _)| of.clone());
            if let Some(gone) = least.and_then(|of| self.costs.remove(&of)) {
                match &mut self.carried {
                    Some(carried) if carried.currency == gone.currency => {
                        carried.amount += gone.amount;
                    }
                    Some(_) => {}
                    None => self.carried = Some(gone),
                }
            }
        }
        let currency = cost.currency.clone();
        self.costs.insert(of.to_owned(), cost);
        let carried = self
            .carried
            .as_ref()
            .filter(|c| c.currency == currency)
            .map_or(0.0, |c| c.amount);
        let amount = self
            .costs
            .values()
            .filter(|c| c.currency == currency)
            .map(|c| c.amount)
            .sum::<f64>()
            + carried;
        self.cost = Some(Cost { amount, currency });
    }

    /// Totals folded before costs were kept per agent session (an older
    /// snapshot's) hold one figure: it becomes the unnamed source's, as a
    /// fresh fold of the same reports files it.
    pub fn costs_from_before(&mut self) {
        if self.costs.is_empty()
            && self.carried.is_none()
            && let Some(cost) = self.cost.clone()
        {
            self.costs.insert(String::new(), cost);
        }
    }
}

/// Agent sessions whose cost reports a session keeps apart at most.
pub const COST_SOURCES: usize = 256;

/// A settling record.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Settled {
    /// The state it settled to.
    pub state: SessionLifeState,
    /// Why.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cause: Option<String>,
}

impl Projection {
    /// Folds one accepted action (of the session channel or one of its chats).
    pub fn observe(&mut self, action: &Value) {
        let Some(kind) = action_type(action) else {
            return;
        };
        let text = |key: &str| {
            field(action, key)
                .and_then(Value::as_str)
                .map(str::to_owned)
        };
        match kind {
            AGENT_OPENED if action.get("chat").is_some() => {
                // A chat's own session: the session's agent is as it was.
                if let (Some(chat), Some(reference)) = (text("chat"), text("acpSessionRef")) {
                    self.acp_chat_refs.insert(chat, reference);
                }
            }
            AGENT_OPENED => {
                self.acp_session_ref = text("acpSessionRef");
                self.load_session = action
                    .get("loadSession")
                    .and_then(Value::as_bool)
                    .unwrap_or(false);
                if !self.is_ended() {
                    self.settled = None;
                }
            }
            SESSION_SETTLED => {
                if self.is_ended() {
                    return;
                }
                let state = action
                    .get("state")
                    .cloned()
                    .and_then(|s| serde_json::from_value::<SessionLifeState>(s).ok());
                if let Some(state) = state.filter(|s| *s != SessionLifeState::Live) {
                    self.settled = Some(Settled {
                        state,
                        cause: text("cause"),
                    });
                }
            }
            "chat/turnStarted" => {
                self.turns += 1;
                self.open_turn_id = text("turnId");
                if self.first_turn_text.is_none() {
                    self.first_turn_text = action
                        .pointer("/message/text")
                        .and_then(Value::as_str)
                        .map(str::to_owned);
                }
            }
            "chat/turnComplete" | "chat/turnCancelled" | "chat/error"
                if self.open_turn_id.is_some() && self.open_turn_id == text("turnId") =>
            {
                self.open_turn_id = None;
            }
            "session/titleChanged" => {
                self.explicit_title = text("title").filter(|t| !t.trim().is_empty());
            }
            CONTEXT_SHARED => {
                self.latest_context = action.get("context").cloned();
            }
            DOCUMENT_EDITED => {
                let revision = action.get("revision").and_then(Value::as_u64).unwrap_or(0);
                self.document_revision = self.document_revision.max(revision);
            }
            COMMANDS_ADVERTISED => {
                self.commands = action
                    .get("commands")
                    .cloned()
                    .and_then(|c| serde_json::from_value(c).ok())
                    .unwrap_or_default();
            }
            "session/metaChanged" => {
                let meta = action.get("_meta");
                if let Some(commands) = meta.and_then(|m| m.get(COMMANDS_META)) {
                    self.commands = serde_json::from_value(commands.clone()).unwrap_or_default();
                }
                if let Some(usage) = meta.and_then(|m| m.get(USAGE_META)) {
                    self.usage.reported(usage);
                }
                if let Some(plan) = meta.and_then(|m| m.get(PLAN_META)) {
                    self.plan = serde_json::from_value(plan.clone()).ok();
                }
            }
            "chat/usage" => {
                if let (Some(turn), Some(usage)) = (text("turnId"), action.get("usage")) {
                    self.usage.turn_usage(&turn, usage);
                }
            }
            _ => {}
        }
    }

    fn is_ended(&self) -> bool {
        matches!(&self.settled, Some(s) if s.state == SessionLifeState::Ended)
    }

    /// The state to report, given whether an agent is attached and running.
    /// A running agent wins unless the session has ended; otherwise the last
    /// settling record decides; with neither, `ended` with a cause that says
    /// no settling record exists.
    pub fn state(&self, live: bool) -> (SessionLifeState, Option<String>) {
        let (state, cause) = self.state_ref(live);
        (state, cause.map(str::to_owned))
    }

    /// [`Self::state`], its cause borrowed.
    pub fn state_ref(&self, live: bool) -> (SessionLifeState, Option<&str>) {
        if live && !self.is_ended() {
            return (SessionLifeState::Live, None);
        }
        match &self.settled {
            Some(settled) => (settled.state, settled.cause.as_deref()),
            None => (SessionLifeState::Ended, Some(NO_SETTLING_RECORD)),
        }
    }

    /// Whether the session can be resumed.
    pub fn resumable(&self) -> bool {
        self.load_session && self.acp_session_ref.is_some()
    }

    /// The title a listing shows: the explicit title, else the first
    /// [`TITLE_CHARACTERS`] characters of the trimmed first turn's text.
    pub fn title(&self) -> Option<String> {
        self.title_ref().map(Cow::into_owned)
    }

    /// [`Self::title`], borrowed when it is the explicit title.
    pub fn title_ref(&self) -> Option<Cow<'_, str>> {
        match &self.explicit_title {
            Some(title) => Some(Cow::Borrowed(title)),
            None => self
                .first_turn_text
                .as_deref()
                .map(|t| t.trim().chars().take(TITLE_CHARACTERS).collect::<String>())
                .filter(|t| !t.is_empty())
                .map(Cow::Owned),
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn fold(actions: &[Value]) -> Projection {
        let mut p = Projection::default();
        for a in actions {
            p.observe(a);
        }
        p
    }

    #[test]
    fn usage_sums_each_turns_latest_report_and_keeps_the_latest_cost() {
        let usage = |turn: &str, input: u64, output: u64, cost: f64| {
            json!({"type": "chat/usage", "turnId": turn, "usage": {
                "inputTokens": input, "outputTokens": output,
                "_meta": {"tether/contextUsed": input + output, "tether/contextWindow": 1000,
                          "tether/cost": {"amount": cost, "currency": "USD"}}}})
        };
        let p = fold(&[
            usage("t1", 10, 5, 0.01),
            usage("t1", 30, 9, 0.02),
            usage("t2", 7, 1, 0.03),
            json!({"type": "session/metaChanged", "_meta": {
                "tether/commands": [{"name": "plan", "description": "Plan first"}],
                "tether/usage": {"used": 500, "size": 2000, "cost": {"amount": 0.5, "currency": "USD"}}}}),
        ]);
        assert_eq!((p.usage.input_tokens, p.usage.output_tokens), (37, 10));
        assert_eq!(p.usage.context_used, Some(500));
        assert_eq!(p.usage.context_size, Some(2000));
        assert_eq!(p.usage.cost.as_ref().map(|c| c.amount), Some(0.5));
        assert_eq!(p.commands[0].name, "plan");
    }

    fn cost_of(of: Option<&str>, amount: f64) -> Value {
        let mut meta = json!({"tether/cost": {"amount": amount, "currency": "USD"}});
        if let Some(of) = of {
            meta["tether/costOf"] = json!(of);
        }
        json!({"type": "chat/usage", "turnId": "t", "usage": {"_meta": meta}})
    }

    /// Each agent session's cost is its own; unnamed reports (from before
    /// sessions were told apart) are taken over by the first named one,
    /// the same way whether folded afresh or from a snapshot of that time.
    #[test]
    fn costs_are_summed_per_agent_session_and_legacy_reports_fold_alike() {
        let p = fold(&[
            cost_of(Some("a"), 0.25),
            cost_of(Some("b"), 0.25),
            cost_of(Some("a"), 0.5),
        ]);
        assert_eq!(p.usage.cost.as_ref().map(|c| c.amount), Some(0.75));

        let legacy = [cost_of(None, 0.5)];
        let fresh = fold(&[legacy[0].clone(), cost_of(Some("a"), 0.75)]);
        // A snapshot from before costs were kept apart: the figure alone.
        let mut old = fold(&legacy);
        old.usage.costs.clear();
        old.observe(&cost_of(Some("a"), 0.75));
        assert_eq!(fresh.usage, old.usage);
        assert_eq!(fresh.usage.cost.as_ref().map(|c| c.amount), Some(0.75));
    }

    /// Past the bound, the agent session that spent least is carried: the
    /// total stays whole and the map bounded.
    #[test]
    fn costs_past_the_bound_are_carried() {
        let reports: Vec<Value> = (0..=COST_SOURCES)
            .map(|n| cost_of(Some(&format!("s{n:04}")), 1.0 + n as f64))
            .collect();
        let p = fold(&reports);
        assert_eq!(p.usage.costs.len(), COST_SOURCES);
        assert!(!p.usage.costs.contains_key("s0000"), "the least is carried");
        assert_eq!(p.usage.carried.as_ref().map(|c| c.amount), Some(1.0));
        let n = COST_SOURCES as f64 + 1.0;
        assert_eq!(
            p.usage.cost.as_ref().map(|c| c.amount),
            Some(n * (n + 1.0) / 2.0)
        );
    }

    #[test]
    fn turns_open_and_close() {
        let p = fold(&[
            json!({"type": "chat/turnStarted", "turnId": "t1", "message": {"text": "  hello  "}}),
            json!({"type": "chat/turnComplete", "turnId": "t1", "duration": 1}),
            json!({"type": "chat/turnStarted", "turnId": "t2", "message": {"text": "second"}}),
        ]);
        assert_eq!(p.turns, 2);
        assert_eq!(p.open_turn_id.as_deref(), Some("t2"));
        assert_eq!(p.title().as_deref(), Some("hello"));
    }

    #[test]
    fn ended_absorbs_and_live_wins_otherwise() {
        let mut p = fold(&[
            json!({"type": AGENT_OPENED, "acpSessionRef": "r", "loadSession": true, "resumed": false}),
            json!({"type": SESSION_SETTLED, "state": "dormant"}),
        ]);
        assert!(p.resumable());
        assert_eq!(p.state(false).0, SessionLifeState::Dormant);
        assert_eq!(p.state(true).0, SessionLifeState::Live);
        p.observe(&json!({"type": SESSION_SETTLED, "state": "ended", "cause": "gone"}));
        p.observe(&json!({"type": SESSION_SETTLED, "state": "dormant"}));
        p.observe(&json!({"type": AGENT_OPENED, "loadSession": true}));
        assert_eq!(
            p.state(true),
            (SessionLifeState::Ended, Some("gone".into()))
        );
        assert_eq!(
            Projection::default().state(false),
            (SessionLifeState::Ended, Some(NO_SETTLING_RECORD.into()))
        );
    }

    #[test]
    fn title_is_explicit_or_eighty_trimmed_characters() {
        let long = "x".repeat(100);
        let p = fold(&[
            json!({"type": "chat/turnStarted", "turnId": "t", "message": {"text": format!(" {long} ")}}),
        ]);
        assert_eq!(p.title().unwrap().chars().count(), TITLE_CHARACTERS);
        let p = fold(&[
            json!({"type": "chat/turnStarted", "turnId": "t", "message": {"text": "derived"}}),
            json!({"type": "session/titleChanged", "title": "Explicit"}),
        ]);
        assert_eq!(p.title().as_deref(), Some("Explicit"));
    }

    #[test]
    fn document_revision_never_rewinds_and_commands_are_replaced() {
        let p = fold(&[
            json!({"type": DOCUMENT_EDITED, "edits": [], "revision": 5}),
            json!({"type": DOCUMENT_EDITED, "edits": [], "revision": 3}),
            json!({"type": COMMANDS_ADVERTISED, "commands": [{"name": "a"}, {"name": "b"}]}),
            json!({"type": COMMANDS_ADVERTISED, "commands": [{"name": "c"}]}),
        ]);
        assert_eq!(p.document_revision, 5);
        assert_eq!(p.commands.len(), 1);
        assert_eq!(p.commands[0].name, "c");
    }
}
