//! The session life cycle as the engine offers it: creating a session,
//! disposing of it, adding a chat, resuming, the boot sweep and loading
//! older turns. Each routes to the session's actor (`actor::lifecycle`).

use serde_json::Value;
use tether_protocol::channel::Channel;
use tether_protocol::model::SessionCreated;
use tether_protocol::view::SessionView;
use tether_protocol::workdir::canonical_file_uri;

use super::actor::Command;
use super::command::ChatFork;
use super::{CreateSession, Engine, EngineError, rfc3339};
use crate::auth::Principal;
use crate::store::now_ms;

impl Engine {
    /// Creates a session: records it, counts it in the root state and tells
    /// root subscribers.
    pub async fn create_session(
        &self,
        principal: &Principal,
        request: CreateSession,
    ) -> Result<SessionView, EngineError> {
        if !principal.can_write() {
            return Err(EngineError::Forbidden(
                "Viewers cannot create sessions.".into(),
            ));
        }
        if !principal.can_see(&request.project) {
            return Err(EngineError::Forbidden(format!(
                "You may not create sessions in project {}.",
                request.project
            )));
        }
        tether_protocol::validate_name("session id", &request.id)
            .map_err(|e| EngineError::InvalidParams(e.to_string()))?;
        tether_protocol::validate_name("project", &request.project)
            .map_err(|e| EngineError::InvalidParams(e.to_string()))?;
        let provider = request.provider.unwrap_or_else(|| "echo".to_owned());
        let agent = self.ctx.agents.get(&provider).ok_or_else(|| {
            EngineError::ProviderNotFound(format!(
                "No agent serves provider {provider:?}; available: {}.",
                self.ctx.agents.providers().join(", ")
            ))
        })?;
        let mut directories = Vec::new();
        for uri in &request.working_directories {
            let canonical = canonical_file_uri(uri)
                .map_err(|e| EngineError::InvalidParams(capitalise_first(&e.to_string())))?;
            if !directories.contains(&canonical) {
                directories.push(canonical);
            }
        }
        if directories.len() > 1 && !agent.workdirs.multiple {
            return Err(EngineError::InvalidParams(format!(
                "Agent {provider} works in a single directory; give at most one working directory."
            )));
        }
        let roots = &self.ctx.config.roots;
        if directories.is_empty() && !roots.is_empty() {
            // Its agent would run outside the roots (in a scratch
            // directory of its own): this host keeps sessions inside them.
            return Err(EngineError::InvalidParams(format!(
                "This host keeps sessions inside its allowed roots ({}); give the session a \
                 working directory there.",
                roots.display_for(&request.project)
            )));
        }
        self.check_directories(&request.project, &directories)
            .await?;
        let default_chat = Channel::default_chat_uri(&request.id);
        // Its default chat is its own from the start: no chat takes that
        // name before the session (see `create_chat`), and a chat a store
        // from before that rule holds under it is never adopted. Asked of
        // the store, not this host's memory of chats: retention (on any
        // host) may have deleted a session of this id with its chats.
        if self.stored_chat_session(&default_chat).await?.is_some() {
            return Err(EngineError::AlreadyExists(format!(
                "Session {} cannot be created: its default chat {default_chat} is already taken.",
                request.id
            )));
        }
        let (config, meta) = initial_config(agent, request.config.as_ref())?;
        let created = SessionCreated {
            project: request.project,
            provider,
            title: request.title.unwrap_or_default(),
            working_directories: directories,
            active_client: request.active_client,
            default_chat,
            created_at: rfc3339(now_ms()),
            config,
            meta,
        };
        let id = request.id;
        // Its active client is registered by its creator, who owns it.
        let owner = created
            .active_client
            .is_some()
            .then(|| principal.sub.clone());
        let created = Box::new(created);
        self.ask(&id, |reply| Command::Create {
            created,
            owner,
            reply,
        })
        .await
    }

    /// Disposes a session: settles it `closed` (resumable) or `ended`; the
    /// transcript is kept.
    pub async fn dispose_session(
        &self,
        principal: &Principal,
        id: &str,
    ) -> Result<SessionView, EngineError> {
        if !principal.can_write() {
            return Err(EngineError::Forbidden(
                "Viewers cannot dispose sessions.".into(),
            ));
        }
        self.session_view(principal, id).await?;
        self.ask(id, |reply| Command::Dispose { reply }).await
    }

    /// Adds a chat to a session; with `source` (AHP `ChatSource`), a fork
    /// of one of its chats through one of its completed turns.
    pub async fn create_chat(
        &self,
        principal: &Principal,
        session: &str,
        chat: &str,
        source: Option<&Value>,
    ) -> Result<(), EngineError> {
        if !principal.can_write() {
            return Err(EngineError::Forbidden(
                "Viewers cannot create chats.".into(),
            ));
        }
        let id = match Channel::parse(chat) {
            Ok(Channel::Chat(id)) => id,
            _ => {
                return Err(EngineError::InvalidParams(format!(
                    "Chat URI {chat:?} is not of the form ahp-chat:/<id>."
                )));
            }
        };
        // The session first: whether a chat exists is told only to a caller
        // who may see the session it would join.
        self.session_view(principal, session).await?;
        if Channel::is_default_chat_id(&id) {
            return Err(EngineError::InvalidParams(format!(
                "Chat {chat} has a name reserved for sessions' default chats (ids ending in \
                 {:?}); choose another, for example ahp-chat:/<uuid>.",
                Channel::DEFAULT_CHAT_SUFFIX
            )));
        }
        // Whether the chat is taken is decided by the session's actor: its
        // own chats, then the store's claim on the URI (another session's
        // chat, or one a concurrent ask is adding). A read here would add a
        // round trip and refuse a retry of a chat this session claimed
        // whose commit failed.
        let fork = source.map(chat_fork).transpose()?.map(Box::new);
        let chat = chat.to_owned();
        self.ask(session, |reply| Command::CreateChat { chat, fork, reply })
            .await
    }

    /// Resumes a session's agent: `cwd` must be its primary directory;
    /// `additional` becomes the complete list of other directories.
    pub async fn resume(
        &self,
        principal: &Principal,
        id: &str,
        cwd: String,
        additional: Vec<String>,
    ) -> Result<SessionView, EngineError> {
        if !principal.can_write() {
            return Err(EngineError::Forbidden(
                "Viewers cannot resume sessions.".into(),
            ));
        }
        let view = self.session_view(principal, id).await?;
        let mut added = additional.clone();
        added.retain(|d| d != &cwd);
        self.check_directories(&view.project, &added).await?;
        self.ask(id, |reply| Command::Resume {
            cwd,
            additional,
            reply,
        })
        .await
    }

    /// The boot sweep: settles every session this host finds with no live
    /// agent and no settling record, as ordinary transcript records.
    /// Returns how many sessions it settled.
    pub async fn boot_sweep(&self) -> Result<usize, EngineError> {
        let mut swept = 0;
        // Live and unsettled sessions, and settled ones with a turn still
        // open (accepted just before the host died, its agent not started).
        for state in ["live", "ended", "dormant"] {
            let filter = crate::store::SessionFilter {
                state: Some(state.to_owned()),
                ..Default::default()
            };
            let mut before = None;
            loop {
                let page = self
                    .ctx
                    .store
                    .sessions(&filter, before, 500)
                    .await
                    .map_err(|e| EngineError::Unavailable(e.to_string()))?;
                for row in &page.items {
                    let unsettled = serde_json::from_str::<SessionView>(&row.record.projection)
                        .map(|v| {
                            v.projection.settled.is_none() || v.projection.open_turn_id.is_some()
                        })
                        .unwrap_or(true);
                    if !unsettled {
                        continue;
                    }
                    match self
                        .ask(&row.record.id, |reply| Command::Sweep { reply })
                        .await
                    {
                        Ok(true) => swept += 1,
                        Ok(false) => {}
                        // A settled session's orphaned turn is failed the
                        // next time it is opened instead; it never keeps
                        // the host from starting.
                        Err(err) if state == "dormant" => {
                            tracing::warn!(session = %row.record.id, error = %err,
                                "boot sweep could not fail an open turn of a settled session");
                        }
                        Err(err) => return Err(err),
                    }
                }
                match page.next_before {
                    Some(next) => before = Some(next),
                    None => break,
                }
            }
        }
        if swept > 0 {
            tracing::info!(
                sessions = swept,
                "boot sweep settled sessions left open by the last run"
            );
        }
        Ok(swept)
    }

    /// Asks the side-effect backend whether `directories` may be used,
    /// bounded by the effect timeout: 422 for a refusal, 503 otherwise.
    async fn check_directories(
        &self,
        project: &str,
        directories: &[String],
    ) -> Result<(), EngineError> {
        // Every backend keeps to the roots, and out of the scratch root.
        for directory in directories {
            self.ctx
                .config
                .roots
                .check_uri(project, directory)
                .await
                .map_err(EngineError::InvalidParams)?;
        }
        let timeout = self.ctx.config.effect_timeout;
        match tokio::time::timeout(timeout, self.ctx.effects.check_directories(directories)).await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(crate::effects::EffectError::Refused(reason))) => {
                Err(EngineError::InvalidParams(reason))
            }
            Ok(Err(crate::effects::EffectError::Unavailable(reason))) => {
                Err(EngineError::Unavailable(reason))
            }
            Err(_) => Err(EngineError::Unavailable(
                "The side-effect backend did not answer in time; try again later.".into(),
            )),
        }
    }

    /// At shutdown: every session actor in memory stops its agent, fails
    /// the open turn and settles dormant. Returns how many actors answered.
    pub async fn stop_agents(&self) -> usize {
        let mailboxes: Vec<_> = self
            .ctx
            .actors
            .lock()
            .map(|actors| actors.values().cloned().collect())
            .unwrap_or_default();
        let asked = mailboxes.into_iter().map(|mailbox| async move {
            let (reply, answer) = tokio::sync::oneshot::channel();
            mailbox.send(Command::Shutdown { reply }).await.is_ok() && answer.await.is_ok()
        });
        futures_util::future::join_all(asked)
            .await
            .into_iter()
            .filter(|answered| *answered)
            .count()
    }

    /// Loads older turns of a chat into its window (AHP `fetchTurns`):
    /// commits `chat/turnsLoaded` before it returns, with its seq; `None`
    /// when no older turn is left.
    pub async fn fetch_turns(
        &self,
        principal: &Principal,
        chat: &str,
        cursor: Option<String>,
    ) -> Result<Option<u64>, EngineError> {
        let not_found = || EngineError::NotFound(format!("Chat {chat} does not exist."));
        let Ok(parsed @ Channel::Chat(_)) = Channel::parse(chat) else {
            return Err(EngineError::InvalidParams(format!(
                "params.channel {chat:?} is not a chat URI (ahp-chat:/<id>)."
            )));
        };
        let session = self.session_of(&parsed).await?.ok_or_else(not_found)?;
        self.session_view(principal, &session)
            .await
            .map_err(|_| not_found())?;
        let chat = chat.to_owned();
        self.ask(&session, |reply| Command::FetchTurns {
            chat,
            cursor,
            reply,
        })
        .await
    }
}

impl Engine {
    /// What a session of `provider` would be configured with given
    /// `values` (AHP `resolveSessionConfig`): the agent's options with
    /// those values, checked; an empty schema for an agent with none.
    pub fn resolve_config(
        &self,
        provider: Option<&str>,
        values: Option<&serde_json::Map<String, serde_json::Value>>,
    ) -> Result<serde_json::Value, EngineError> {
        let provider = provider.unwrap_or("echo");
        let agent = self.ctx.agents.get(provider).ok_or_else(|| {
            EngineError::ProviderNotFound(format!(
                "No agent serves provider {provider:?}; available: {}.",
                self.ctx.agents.providers().join(", ")
            ))
        })?;
        let (config, _) = initial_config(agent, values)?;
        Ok(config.unwrap_or_else(
            || serde_json::json!({"schema": {"type": "object", "properties": {}}, "values": {}}),
        ))
    }
}

/// A new session's configuration and `_meta`: the agent's configuration as
/// it was last learned (its probe), with the caller's values, checked
/// against what the agent offers.
fn initial_config(
    agent: &crate::agents::AgentSpec,
    values: Option<&serde_json::Map<String, serde_json::Value>>,
) -> Result<(Option<serde_json::Value>, Option<serde_json::Value>), EngineError> {
    let values = values.filter(|v| !v.is_empty());
    let Some(mut config) = agent.config_template() else {
        return match values {
            None => Ok((None, None)),
            Some(_) => Err(EngineError::InvalidParams(format!(
                "Agent {} offers no configuration to choose at creation.",
                agent.provider
            ))),
        };
    };
    if let Some(values) = values {
        tether_protocol::config::check_values(&config, values, true)
            .map_err(EngineError::InvalidParams)?;
        for (key, value) in values {
            config["values"][key] = value.clone();
        }
    }
    let meta = agent.config_categories().map(|categories| {
        serde_json::json!({ tether_protocol::actions::CONFIG_CATEGORIES_META: categories })
    });
    Ok((Some(config), meta))
}

fn capitalise_first(text: &str) -> String {
    let mut chars = text.chars();
    chars
        .next()
        .map(|c| c.to_uppercase().collect::<String>() + chars.as_str())
        .unwrap_or_default()
}

/// A `createChat` source: a fork (`{kind: "fork", chat, turnId}`) is
/// offered; a side chat is not (no agent advertises `sideChat`).
fn chat_fork(source: &Value) -> Result<ChatFork, EngineError> {
    let invalid = |why: &str| EngineError::InvalidParams(format!("params.source {why}"));
    match source.get("kind").and_then(Value::as_str) {
        Some("fork") => {
            let text = |key: &str| source.get(key).and_then(Value::as_str).map(str::to_owned);
            match (text("chat"), text("turnId")) {
                (Some(chat), Some(turn_id)) => Ok(ChatFork { chat, turn_id }),
                _ => Err(invalid(
                    "of kind \"fork\" needs chat (the source chat's URI) and turnId (one of its \
                     completed turns).",
                )),
            }
        }
        Some("sideChat") => Err(invalid(
            "of kind \"sideChat\" is not offered: no agent here advertises \
             capabilities.multipleChats.sideChat.",
        )),
        _ => Err(invalid("must be {kind: \"fork\", chat, turnId}.")),
    }
}
