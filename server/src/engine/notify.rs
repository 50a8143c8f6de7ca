//! The notification events an accepted action raises, as outbox rows of
//! its envelope (DESIGN.md, "Finding, notifying, keeping"): what
//! `tether_protocol::events` derives, with the session's project. The
//! webhook deliverer (`crate::webhooks`) takes them from there.

use serde_json::Value;
use tether_protocol::events::events;
use tether_protocol::model::SessionModel;

use crate::store::webhooks::OutboxEvent;

/// The outbox rows of an action on `channel` of the session `model`.
pub(super) fn outbox_events(
    model: &SessionModel,
    channel: &str,
    action: &Value,
) -> Vec<OutboxEvent> {
    events(channel, action)
        .into_iter()
        .map(|(kind, data)| OutboxEvent {
            kind,
            project: model.created.project.clone(),
            data: data.to_string(),
        })
        .collect()
}
