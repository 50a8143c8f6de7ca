//! The validation pipeline a dispatch goes through before its commit, and
//! the outcomes of refusals and retries.

use std::sync::Arc;

use ahp::reducers::ReduceOutcome;
use serde_json::Value;
use tether_protocol::actions::action_type;
use tether_protocol::channel::Channel;
use tether_protocol::model::{SessionModel, typed_action};

use super::actor::{Dispatch, DispatchOutcome};
use super::fanout::published_from_store;
use super::rules::{check_dispatchable, check_workdirs};
use super::turns::check_new_turn_id;
use super::{Ctx, Refusal, RefusalKind};
use crate::auth::Principal;
use crate::effects::EffectRequest;
use crate::store::{Origin, OriginOutcome, Rejection, now_ms};

/// The answer to a dispatch whose origin already has an outcome: that
/// outcome when it is a true retry (the same channel and the same action),
/// otherwise a refusal that names the reused sequence number and nothing of
/// the other dispatch (it may be on a channel the caller cannot see). Either
/// way nothing is applied.
pub(super) fn retry_outcome(
    known: &OriginOutcome,
    channel: &str,
    action: &Value,
) -> DispatchOutcome {
    let (first_channel, first_action, origin) = match known {
        OriginOutcome::Accepted(original) => (
            original.channel.as_str(),
            original.action.as_str(),
            original.origin.as_ref(),
        ),
        OriginOutcome::Rejected(first) => (
            first.channel.as_str(),
            first.action.as_str(),
            Some(&first.origin),
        ),
    };
    // The stored action has a message's embedded attachments as references.
    let same = first_channel == channel
        && serde_json::from_str::<Value>(first_action)
            .is_ok_and(|o| &o == action || o == super::attachments::as_stored(action));
    match known {
        OriginOutcome::Accepted(original) if same => {
            DispatchOutcome::Accepted(Arc::new(published_from_store(original)))
        }
        OriginOutcome::Rejected(first) if same => {
            DispatchOutcome::Rejected(Refusal::new(RefusalKind::Invalid, first.reason.clone()))
        }
        _ => DispatchOutcome::Rejected(reused_seq(origin)),
    }
}

/// The refusal of a dispatch whose origin another, different dispatch
/// already took; it names nothing of that one (it may be on a channel the
/// caller cannot see).
pub(super) fn reused_seq(origin: Option<&Origin>) -> Refusal {
    Refusal::new(
        RefusalKind::Conflict,
        format!(
            "clientSeq {} of client {:?} was already used for a different dispatch; a client \
             must not reuse sequence numbers: continue above its highest clientSeq or use a new \
             clientId.",
            origin.map_or(0, |o| o.client_seq),
            origin.map_or("", |o| o.client_id.as_str()),
        ),
    )
}

/// Runs the whole validation pipeline for one dispatch and, when it passes,
/// applies it to `model` and returns the action's type. Client dispatches
/// get every rule and the side effect; host-originated ones only the
/// reducer.
pub(super) async fn check_dispatch(
    ctx: &Ctx,
    model: &mut SessionModel,
    agent: Option<&crate::agents::AgentSpec>,
    process: Option<&crate::agents::acp::AgentProcess>,
    owners: &std::collections::HashMap<String, String>,
    d: &mut Dispatch,
    follow: &mut Vec<(String, Value)>,
) -> Result<String, Refusal> {
    if let Some(principal) = &d.principal
        && !principal.can_see(&model.created.project)
    {
        return Err(Refusal::new(
            RefusalKind::NotFound,
            format!("Channel {} does not exist.", d.channel),
        ));
    }
    let channel = Channel::parse(&d.channel).map_err(|e| e.to_string())?;
    if matches!(channel, Channel::Chat(_)) && !model.chats.contains_key(&d.channel) {
        // A chat the session removed (or never had).
        return Err(Refusal::new(
            RefusalKind::NotFound,
            format!("Channel {} does not exist.", d.channel),
        ));
    }
    // The bytes of the message's attachments, stored as its side effect.
    let mut attachments = Vec::new();
    let kind = if d.origin.is_some() {
        let host_actions = d
            .principal
            .as_ref()
            .is_some_and(Principal::can_dispatch_host_actions);
        let kind = check_dispatchable(&channel, &d.action, host_actions)?.to_owned();
        if matches!(model.projection.settled.as_ref(), Some(s) if s.state == tether_protocol::projection::SessionLifeState::Ended)
        {
            return Err(Refusal::new(
                RefusalKind::Conflict,
                format!(
                    "Session {} has ended; it accepts no more actions. Start a new session.",
                    model.id
                ),
            ));
        }
        let caps = agent.map(|a| a.workdirs).unwrap_or_default();
        check_workdirs(model, caps, &kind, &mut d.action)?;
        if let Some(origin) = &d.origin {
            let caller = super::client_tools::Caller {
                client_id: &origin.client_id,
                sub: d.principal.as_ref().map(|p| p.sub.as_str()),
            };
            super::client_tools::check(model, owners, &d.channel, caller, &kind, &d.action)?;
        }
        if kind == "chat/turnStarted" {
            check_new_turn_id(ctx, model, &d.channel, &d.action).await?;
            check_turn_model(model, &d.action)?;
        }
        if matches!(kind.as_str(), "chat/turnStarted" | "chat/pendingMessageSet")
            && let Some(message) = d.action.get_mut("message")
        {
            let limits = ctx.config.attachments;
            let taken = super::attachments::take_in(&model.id, agent, limits, message)
                .map_err(|reason| Refusal::new(RefusalKind::Invalid, reason))?;
            if !taken.is_empty() {
                let digests: Vec<String> = taken.iter().map(|a| a.digest.clone()).collect();
                let (held, again) = ctx
                    .store
                    .attachment_bytes(&model.id, &digests)
                    .await
                    .map_err(|e| Refusal::new(RefusalKind::Unavailable, e.to_string()))?;
                // Bytes the session holds already are stored once.
                let adding = taken
                    .iter()
                    .map(|a| a.data.len() as u64)
                    .sum::<u64>()
                    .saturating_sub(again);
                if held + adding > limits.per_session {
                    return Err(Refusal::new(
                        RefusalKind::Invalid,
                        format!(
                            "This session already holds {held} bytes of attachments; {adding} \
                             more would pass its limit of {} (--max-session-attachment-bytes).",
                            limits.per_session
                        ),
                    ));
                }
            }
            attachments = taken;
        }
        if kind == "session/configChanged" {
            check_config_change(model, &d.action)?;
        }
        if kind == "chat/truncated"
            && let Some(agent) = agent.filter(|a| a.acp_command().is_some())
        {
            // ACP cannot take turns back from an agent's session: its next
            // prompt would carry on from the turns removed here.
            return Err(Refusal::new(
                RefusalKind::Invalid,
                format!(
                    "Agent {} cannot forget turns (ACP has no way to take them back from its \
                     session); fork the chat at an earlier turn instead.",
                    agent.provider
                ),
            ));
        }
        if kind == "chat/pendingMessageSet" {
            check_queue_room(model, &d.channel, &d.action)?;
        }
        kind
    } else {
        let kind = action_type(&d.action).unwrap_or_default().to_owned();
        if kind == "session/metaChanged" {
            merge_meta(model, &mut d.action);
        }
        kind
    };
    let typed = typed_action(&d.action);
    if matches!(typed, ahp_types::actions::StateAction::Unknown(_)) && !kind.starts_with("x-") {
        return Err(format!(
            "Action {kind} is malformed: a field is missing or has the wrong type (see the AHP \
             1.0 action reference)."
        )
        .into());
    }
    let (outcome, trial) = model.try_apply(&d.channel, &d.action, &typed);
    let trial = match (outcome, trial) {
        (ReduceOutcome::Applied | ReduceOutcome::NoOp, Some(trial)) => trial,
        (ReduceOutcome::Invalid(err), _) => {
            return Err(format!(
                "Action {kind} is not valid in the session's current state: {err:?}."
            )
            .into());
        }
        _ => {
            return Err(format!("Action {kind} does not apply to {}.", d.channel).into());
        }
    };
    if d.origin.is_some() {
        // The roots (and the scratch root kept out) hold whatever backend
        // applies the change.
        for directory in crate::effects::added_directories(&d.action) {
            ctx.config
                .roots
                .check_uri(&model.created.project, directory)
                .await
                .map_err(|reason| Refusal::new(RefusalKind::Invalid, reason))?;
        }
    }
    if d.origin.is_some() && kind == "session/configChanged" && process.is_some() {
        // The agent's settings: a running ACP agent is moved to the values
        // before they are recorded (its refusal refuses the change); one
        // not running gets them when it next opens the session.
        if let (Some(process), Some(values)) = (
            process,
            d.action.get("config").and_then(Value::as_object).cloned(),
        ) {
            let moved = match process.configure(values).await {
                Ok(moved) => moved,
                Err(refused) => {
                    // What it took before refusing is recorded after the
                    // refusal, as the agent's own change.
                    follow.extend(refused.moved);
                    // No answer is not the dispatch's outcome: not recorded,
                    // a retry may pass.
                    let kind = if refused.transient {
                        RefusalKind::Unavailable
                    } else {
                        RefusalKind::Invalid
                    };
                    return Err(Refusal::new(
                        kind,
                        format!(
                            "The agent did not accept the configuration: {}.",
                            refused.reason
                        ),
                    ));
                }
            };
            follow.extend(moved);
        }
    } else if d.origin.is_some() && kind == "terminal/input" {
        // What a client types goes to the terminal's process, which must
        // run on this host (the session's holder) to take it.
        let data = d.action["data"].as_str().unwrap_or_default();
        let terminal = ctx.terminals.get(&d.channel).ok_or_else(|| {
            Refusal::new(
                RefusalKind::Conflict,
                format!("Terminal {} is not running; it takes no input.", d.channel),
            )
        })?;
        terminal
            .input(data)
            .await
            .map_err(|reason| Refusal::new(RefusalKind::Conflict, reason))?;
    } else if let Some(origin) = &d.origin
        && ctx.effects.concerns(&kind)
    {
        let request = EffectRequest {
            channel: &d.channel,
            action: &d.action,
            state: &model.session,
            origin: Some((&origin.client_id, origin.client_seq)),
            after: trial.session_state(),
            // Only an ACP agent applies changes; a running echo has none.
            agent: process
                .filter(|_| agent.is_some_and(|a| a.acp_command().is_some()))
                .map(|p| p as &dyn crate::effects::SessionAgent),
        };
        let timeout = ctx.config.effect_timeout;
        let started = std::time::Instant::now();
        let applied = tokio::time::timeout(timeout, ctx.effects.apply(&request)).await;
        ctx.effect_seconds.observe(started.elapsed().as_secs_f64());
        if !matches!(applied, Ok(Ok(()))) {
            ctx.effect_failures.inc();
        }
        match applied {
            Ok(result) => result?,
            Err(_) => {
                return Err(Refusal::new(
                    RefusalKind::Unavailable,
                    format!(
                        "The side-effect backend is unavailable: it did not answer within {} ms; \
                         try again later.",
                        timeout.as_millis()
                    ),
                ));
            }
        }
    }
    for attachment in &attachments {
        ctx.store.put_attachment(attachment).await.map_err(|e| {
            Refusal::new(
                RefusalKind::Unavailable,
                format!("The attachment could not be stored ({e}); retry."),
            )
        })?;
    }
    model.accept(trial, &d.action, &typed);
    Ok(kind)
}

/// A client's `session/configChanged` must name properties the session's
/// configuration has, that may change during a session, with values of
/// their type and among their choices; `replace` must name all of them
/// (an agent's option cannot be left without a value).
fn check_config_change(model: &SessionModel, action: &Value) -> Result<(), Refusal> {
    let invalid = |reason: String| Refusal::new(RefusalKind::Invalid, reason);
    let Some(config) = model
        .session
        .config
        .as_ref()
        .and_then(|c| serde_json::to_value(c).ok())
    else {
        return Err(invalid(
            "This session's agent offers no configuration (yet: an ACP agent's appears when it \
             opens the session)."
                .to_owned(),
        ));
    };
    let change = action
        .get("config")
        .and_then(Value::as_object)
        .ok_or_else(|| invalid("session/configChanged needs a \"config\" object.".to_owned()))?;
    tether_protocol::config::check_values(&config, change, false).map_err(invalid)?;
    if action.get("replace") == Some(&Value::Bool(true))
        && let Some(properties) = config
            .pointer("/schema/properties")
            .and_then(Value::as_object)
        && let Some(missing) = properties.keys().find(|k| !change.contains_key(*k))
    {
        return Err(invalid(format!(
            "A replacing session/configChanged must give every option; it lacks {missing:?}."
        )));
    }
    Ok(())
}

/// A chat's queue is bounded ([`super::rules::MAX_QUEUED`]); replacing a
/// queued message keeps its place.
fn check_queue_room(model: &SessionModel, chat: &str, action: &Value) -> Result<(), Refusal> {
    if action.get("kind").and_then(Value::as_str) != Some("queued") {
        return Ok(());
    }
    let id = action.get("id").and_then(Value::as_str).unwrap_or_default();
    let queue = model
        .chats
        .get(chat)
        .and_then(|c| c.queued_messages.as_ref());
    let full =
        queue.is_some_and(|q| q.len() >= super::rules::MAX_QUEUED && !q.iter().any(|m| m.id == id));
    if full {
        return Err(Refusal::new(
            RefusalKind::Invalid,
            format!(
                "This chat already holds {} queued messages, the most it takes; wait for one \
                 to start or remove one.",
                super::rules::MAX_QUEUED
            ),
        ));
    }
    Ok(())
}

/// A turn's `message.model` must be one the session's agent offers.
fn check_turn_model(model: &SessionModel, action: &Value) -> Result<(), Refusal> {
    let Some(wanted) = action.pointer("/message/model/id").and_then(Value::as_str) else {
        return Ok(());
    };
    let categories = model
        .session
        .meta
        .as_ref()
        .and_then(|m| m.get(tether_protocol::actions::CONFIG_CATEGORIES_META));
    let option = categories.and_then(Value::as_object).and_then(|c| {
        c.iter()
            .find(|(_, v)| *v == "model")
            .map(|(k, _)| k.clone())
    });
    let config = model
        .session
        .config
        .as_ref()
        .and_then(|c| serde_json::to_value(c).ok());
    let choices = option
        .as_ref()
        .zip(config.as_ref())
        .and_then(|(o, c)| c.pointer(&format!("/schema/properties/{o}/enum")).cloned());
    match choices.as_ref().and_then(Value::as_array) {
        Some(choices) if choices.iter().any(|c| c == wanted) => Ok(()),
        Some(choices) => Err(Refusal::new(
            RefusalKind::Invalid,
            format!(
                "The agent offers no model {wanted:?}; it offers: {}.",
                choices
                    .iter()
                    .filter_map(Value::as_str)
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        )),
        None => Err(Refusal::new(
            RefusalKind::Invalid,
            format!("This session's agent offers no choice of model; {wanted:?} cannot be used."),
        )),
    }
}

/// A host-originated `session/metaChanged` names only the keys it changes
/// (a key with `null` is removed): it becomes the full `_meta` AHP's
/// action carries, the keys it does not name kept as they are.
fn merge_meta(model: &SessionModel, action: &mut Value) {
    let mut meta = model.session.meta.clone().unwrap_or_default();
    if let Some(given) = action.get("_meta").and_then(Value::as_object) {
        for (key, value) in given {
            if value.is_null() {
                meta.remove(key);
            } else {
                meta.insert(key.clone(), value.clone());
            }
        }
    }
    action["_meta"] = Value::Object(meta);
}

impl Ctx {
    /// Records a rejection (for client dispatches) and returns the outcome
    /// that holds: an earlier acceptance of the same origin wins.
    pub(super) async fn reject(
        &self,
        origin: Option<&Origin>,
        channel: &str,
        action: &Value,
        refusal: Refusal,
    ) -> DispatchOutcome {
        let Some(origin) = origin else {
            tracing::warn!(%channel, reason = %refusal.reason, "host-originated action refused");
            return DispatchOutcome::Rejected(refusal);
        };
        // A transient failure is not the origin's outcome: a retry may pass.
        // Nor is a missing channel: it may exist by the time of the retry.
        if matches!(
            refusal.kind,
            RefusalKind::Unavailable | RefusalKind::NotFound
        ) {
            return DispatchOutcome::Rejected(refusal);
        }
        let reason = refusal.reason.clone();
        let rejection = Rejection {
            origin: origin.clone(),
            channel: channel.to_owned(),
            action: action.to_string(),
            reason: reason.clone(),
            at_ms: now_ms(),
        };
        match self.store.record_rejection(rejection).await {
            Ok(OriginOutcome::Rejected(first)) if first.reason == refusal.reason => {
                DispatchOutcome::Rejected(refusal)
            }
            Ok(known) => retry_outcome(&known, channel, action),
            Err(err) => {
                tracing::warn!(error = %err, "rejection not recorded");
                DispatchOutcome::Rejected(refusal)
            }
        }
    }
}
