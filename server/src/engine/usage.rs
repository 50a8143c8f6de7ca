//! What a committed action adds to the usage ledger: the difference its
//! fold made to the session's usage totals (tokens, and the cost the agent
//! reports cumulatively), with the project, agent, model and the principal
//! that started the turn (DESIGN.md, "Finding, notifying, keeping").

use tether_protocol::model::SessionModel;
use tether_protocol::projection::UsageTotals;

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

/// The ledger row for what the action added, `None` when it added nothing.
/// `sub` started the turn (empty when not known).
pub(super) fn row(model: &SessionModel, before: Before, sub: &str) -> Option<UsageRow> {
    let (then, now) = (&before.0, &model.projection.usage);
    let input = now.input_tokens as i64 - then.input_tokens as i64;
    let output = now.output_tokens as i64 - then.output_tokens as i64;
    // ACP's cost is the session's so far: the difference is what was
    // spent, unless the currency changed or the figure went down (a new
    // agent session counting from zero): then all of it is new.
    let (cost_micros, currency) = match (&then.cost, &now.cost) {
        (_, None) => (0, String::new()),
        (Some(a), Some(b)) if a.currency == b.currency && b.amount >= a.amount => {
            (micros(b.amount) - micros(a.amount), b.currency.clone())
        }
        (_, Some(b)) => (micros(b.amount), b.currency.clone()),
    };
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
