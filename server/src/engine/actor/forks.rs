//! Forked chats (AHP `createChat {source: {kind: "fork", chat, turnId}}`):
//! the new chat starts with the source chat's turns through the chosen
//! one, and an ACP agent's conversation is forked with it
//! (`session/fork`) before anything is committed.

use serde_json::{Value, json};
use tether_protocol::actions::AGENT_OPENED;

use super::super::EngineError;
use super::super::command::ChatFork;
use super::super::turns::{MAX_LOAD_BYTES, TURNS_LOADED};
use super::{DispatchOutcome, SessionActor};
use crate::agents::AgentSpec;
use crate::store::now_ms;

impl SessionActor {
    /// Creates `chat` as a fork of `fork.chat` through `fork.turn_id`:
    /// checks the source, forks the agent's session of it when the agent
    /// is an ACP one, then commits the new chat (`session/chatAdded` with
    /// its origin), its copied turns (`chat/turnsLoaded`) and the agent's
    /// new session (`x-tether/agentOpened` with the chat).
    pub(super) async fn fork_chat(
        &mut self,
        chat: String,
        fork: &ChatFork,
    ) -> Result<(), EngineError> {
        let (spec, turns) = self.fork_source(fork)?;
        self.claim_chat(&chat).await?;
        let reference = match spec.acp_command() {
            Some(_) => match self.fork_agent(&spec, fork, &chat).await {
                Ok(reference) => Some(reference),
                Err(err) => {
                    self.release_chat(&chat).await;
                    return Err(err);
                }
            },
            None => None,
        };
        let summary = json!({
            "resource": chat,
            "title": "",
            "status": 1,
            "modifiedAt": super::super::rfc3339(now_ms()),
            "origin": {"kind": "fork", "chat": fork.chat, "turnId": fork.turn_id},
        });
        self.follow_ups.push((
            self.uri.clone(),
            json!({"type": "session/chatAdded", "summary": summary}),
        ));
        if !turns.is_empty() {
            self.follow_ups
                .push((chat.clone(), json!({"type": TURNS_LOADED, "turns": turns})));
        }
        if let Some(reference) = reference {
            self.follow_ups.push((
                self.uri.clone(),
                json!({"type": AGENT_OPENED, "acpSessionRef": reference, "resumed": false,
                       "chat": chat}),
            ));
        }
        let outcomes = self.run_follow_ups().await;
        if outcomes.is_empty() {
            return Err(EngineError::Unavailable(
                "the forked chat was not recorded".to_owned(),
            ));
        }
        if let Some(DispatchOutcome::Rejected(_)) = outcomes.first() {
            // The chat itself was refused: nothing was committed under it.
            self.release_chat(&chat).await;
        }
        for outcome in outcomes {
            if let DispatchOutcome::Rejected(refusal) = outcome {
                return Err(EngineError::Unavailable(refusal.reason));
            }
        }
        Ok(())
    }

    /// The session's agent and the turns a fork of `fork` copies (the
    /// source chat's loaded turns through the chosen one, the newest that
    /// fit one load), or why it cannot be forked there.
    fn fork_source(&self, fork: &ChatFork) -> Result<(AgentSpec, Vec<Value>), EngineError> {
        let Some(model) = &self.model else {
            return Err(EngineError::NotFound(format!(
                "Session {} does not exist.",
                self.id
            )));
        };
        let invalid = |why: String| Err(EngineError::InvalidParams(why));
        let provider = &model.session.provider;
        let Some(spec) = self.ctx.agents.get(provider).cloned() else {
            return invalid(format!(
                "Agent {provider} is not configured on this host; its chats cannot be forked."
            ));
        };
        if !spec.forks() {
            return invalid(format!(
                "Agent {provider} cannot fork chats: it does not offer session/fork \
                 (its AgentInfo has no capabilities.multipleChats.fork)."
            ));
        }
        let Some(source) = model.chats.get(&fork.chat) else {
            return invalid(format!(
                "params.source.chat {} is not a chat of session {}.",
                fork.chat, self.id
            ));
        };
        if source
            .active_turn
            .as_ref()
            .is_some_and(|t| t.id == fork.turn_id)
        {
            return invalid(format!(
                "Turn {} of {} is still running; a fork starts from a completed turn.",
                fork.turn_id, fork.chat
            ));
        }
        let Some(position) = source.turns.iter().position(|t| t.id == fork.turn_id) else {
            return invalid(format!(
                "Turn {} is not a completed turn among the loaded turns of {} (load older \
                 turns with fetchTurns first).",
                fork.turn_id, fork.chat
            ));
        };
        let latest = position + 1 == source.turns.len() && source.active_turn.is_none();
        if spec.acp_command().is_some() && !latest {
            return invalid(format!(
                "Agent {provider} forks a chat only from its latest turn, with no turn \
                 running: ACP's session/fork copies the agent's whole conversation. The \
                 latest completed turn of {} is {}.",
                fork.chat,
                source.turns.last().map_or("none", |t| t.id.as_str())
            ));
        }
        let mut turns = Vec::new();
        let mut bytes = 0;
        for turn in source.turns[..=position].iter().rev() {
            let turn = serde_json::to_value(turn).unwrap_or(Value::Null);
            bytes += turn.to_string().len();
            if bytes > MAX_LOAD_BYTES && !turns.is_empty() {
                break;
            }
            turns.push(turn);
        }
        turns.reverse();
        Ok((spec, turns))
    }

    /// Forks the agent's session of the source chat for `chat`, starting
    /// the agent (reopening its session) when it is not running: the new
    /// session's id.
    async fn fork_agent(
        &mut self,
        spec: &AgentSpec,
        fork: &ChatFork,
        chat: &str,
    ) -> Result<String, EngineError> {
        let unavailable = |why: String| EngineError::Unavailable(why);
        if self.running.is_none() {
            let reopens = self.model.as_ref().is_some_and(|m| {
                m.projection.load_session && m.projection.acp_session_ref.is_some()
            });
            if !reopens {
                return Err(unavailable(format!(
                    "The agent's conversation of {} ended with its process and the agent \
                     cannot reopen sessions: a fork would not carry it.",
                    fork.chat
                )));
            }
            self.start_agent(spec, true, None)
                .map_err(|why| unavailable(format!("The agent could not be started: {why}.")))?;
        }
        let Some(running) = &mut self.running else {
            return Err(unavailable("The agent is not running.".to_owned()));
        };
        // Opening the source's session may come first, each within the
        // agent's own time limit.
        let wait = 2 * self.ctx.config.acp.init_timeout + std::time::Duration::from_secs(1);
        let forked = tokio::time::timeout(wait, running.process.fork(&fork.chat, chat)).await;
        running.last_active = tokio::time::Instant::now();
        match forked {
            Ok(Ok(reference)) => Ok(reference),
            Ok(Err(why)) => Err(unavailable(format!(
                "The agent could not fork {}: {why}.",
                fork.chat
            ))),
            Err(_) => Err(unavailable(format!(
                "The agent did not fork {} in time.",
                fork.chat
            ))),
        }
    }
}
