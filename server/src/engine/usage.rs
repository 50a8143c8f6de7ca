//! What a committed action adds to the usage ledger: the difference its
//! fold made to the session's usage totals (tokens, and the cost the agent
//! reports cumulatively), with the project, agent, model and the principal
//! that started the turn (DESIGN.md, "Finding, notifying, keeping").

use tether_protocol::model::SessionModel;
use tether_protocol::projection::{Cost, UsageTotals};

use crate::store::usage::UsageRow;

/// A session's usage totals before an action that may change them.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Before(UsageTotals);

/// The totals before an action of `kind`, when that kind can change them.
pub(super) fn before(model: &SessionModel, kind: &str) -> Option<Before> {
    matches!(kind, "chat/usage" | "session/metaChanged")
        .then(|| Before(model.projection.usage.clone()))
}

/// In millionths, rounded.
fn micros(amount: f64) -> i64 {
    (amount * 1e6).round() as i64
}

/// What was spent between two totals, and in which currency. ACP's cost
/// is each agent session's so far (each chat has one): per agent session,
/// the difference is what was spent, unless the currency changed or the
/// figure went down (counting from zero again): then all of it is new. A
/// session's first named report continues the unnamed ones before it
/// (reports from before sessions were told apart). What is carried (agent
/// sessions no longer kept apart) was counted when it was reported.
fn spent(then: &UsageTotals, now: &UsageTotals) -> (i64, String) {
    let Some(currency) = now.cost.as_ref().map(|c| c.currency.clone()) else {
        return (0, String::new());
    };
    // Totals folded before costs were kept per agent session hold one
    // figure, the unnamed source's (`UsageTotals::costs_from_before`).
    let before = |of: &str| {
        then.costs.get(of).or_else(|| {
            (of.is_empty() && then.costs.is_empty() && then.carried.is_none())
                .then_some(then.cost.as_ref())
                .flatten()
        })
    };
    let unnamed = before("").filter(|_| !now.costs.contains_key(""));
    let since = |before: Option<&Cost>, after: &Cost| match before {
        Some(a) if a.currency == after.currency && after.amount >= a.amount => {
            micros(after.amount) - micros(a.amount)
        }
        _ => micros(after.amount),
    };
    let micros = now
        .costs
        .iter()
        .filter(|(of, after)| after.currency == currency && before(of) != Some(after))
        .map(|(of, after)| since(before(of).or(unnamed), after))
        .sum();
    (micros, currency)
}

/// The ledger row for what the action added, `None` when it added nothing.
/// `sub` started the turn (empty when not known).
pub(super) fn row(model: &SessionModel, before: Before, sub: &str) -> Option<UsageRow> {
    let (then, now) = (&before.0, &model.projection.usage);
    let input = now.input_tokens as i64 - then.input_tokens as i64;
    let output = now.output_tokens as i64 - then.output_tokens as i64;
    let (cost_micros, currency) = spent(then, now);
    if input == 0 && output == 0 && cost_micros == 0 {
        return None;
    }
    let model_name = model
        .session
        .config
        .as_ref()
        .and_then(|c| c.values.get("model"))
        .and_then(|v| v.as_str())
        .unwrap_or_default();
    Some(UsageRow {
        project: model.created.project.clone(),
        agent: model.session.provider.clone(),
        model: model_name.to_owned(),
        sub: sub.to_owned(),
        input_tokens: input,
        output_tokens: output,
        cost_micros,
        currency,
    })
}
