//! The agent's sessions in one process: opening the one of the default
//! chat, one per other chat (new, reopened, or forked from another
//! chat's), moving them to the session's configuration, and a turn's
//! prompt.

use std::collections::{BTreeMap, HashMap};

use agent_client_protocol::v1::schema::ForkSessionRequest;

use super::*;

/// A stored attachment as an ACP content block (as JSON): an image or
/// audio block for those media, else an embedded resource (text when it is
/// UTF-8 text, a base64 blob otherwise).
pub(super) fn stored_block(uri: &str, stored: &crate::store::Attachment) -> Value {
    use base64::Engine as _;
    let data = base64::engine::general_purpose::STANDARD.encode(&stored.data);
    let media = stored.content_type.as_str();
    if media.starts_with("image/") {
        return serde_json::json!({"type": "image", "data": data, "mimeType": media, "uri": uri});
    }
    if media.starts_with("audio/") {
        return serde_json::json!({"type": "audio", "data": data, "mimeType": media});
    }
    let text = (media.starts_with("text/") || media.ends_with("json"))
        .then(|| String::from_utf8(stored.data.clone()).ok())
        .flatten();
    let resource = match text {
        Some(text) => serde_json::json!({"uri": uri, "text": text, "mimeType": media}),
        None => serde_json::json!({"uri": uri, "blob": data, "mimeType": media}),
    };
    serde_json::json!({"type": "resource", "resource": resource})
}

/// The agent's sessions in one process, by chat: ACP has one
/// conversation per session, AHP several chats per session, so each chat
/// other than the default one has a session of its own.
pub(super) struct Sessions {
    /// The default chat's, opened at start.
    pub(super) main: String,
    default_chat: String,
    /// Each other chat's, opened in this process.
    live: HashMap<String, String>,
    /// Each other chat's as the transcript records it (reopened when the
    /// chat next has a turn).
    recorded: BTreeMap<String, String>,
    /// Where sessions open and what they get (as the default chat's).
    cwd: PathBuf,
    additional: Vec<PathBuf>,
    /// Given at every open (new, resume, load), a directory change's too.
    pub(super) mcp_servers: Vec<McpServer>,
    logins: Logins,
    /// Whether the agent can reopen a session, and with `session/resume`.
    reopen: bool,
    resume: bool,
}

impl Sessions {
    /// Every session open in this process, the default chat's first.
    pub(super) fn all(&self) -> impl Iterator<Item = &String> {
        std::iter::once(&self.main).chain(self.live.values())
    }

    /// After `session/resume` moved the default chat's session to other
    /// directories: the others are reopened with them when next used.
    pub(super) fn moved(&mut self, cwd: PathBuf, additional: Vec<PathBuf>) {
        self.cwd = cwd;
        self.additional = additional;
        self.live.clear();
    }
}

impl Bridge {
    /// `initialize`, then `session/new`, `session/resume` or `session/load`
    /// for the default chat; the agent's sessions, that one open.
    pub(super) async fn open(
        &self,
        cx: &ConnectionTo<Agent>,
        open: OpenRequest,
        cwd: PathBuf,
    ) -> Result<Sessions, String> {
        let timeout = self.limits.init_timeout;
        let (response, raw) = initialize(cx, timeout).await?;
        let caps = capabilities_of(&response);
        let logins = Logins::of(&self.command, &raw);
        self.titles.store(
            raw.pointer("/agentCapabilities/sessionCapabilities/title")
                .is_some_and(Value::is_object),
            std::sync::atomic::Ordering::Relaxed,
        );
        self.closes
            .store(caps.close, std::sync::atomic::Ordering::Relaxed);
        let additional = if caps.additional_directories {
            open.dirs.iter().skip(1).cloned().collect()
        } else {
            Vec::new()
        };
        let mcp_servers: Vec<McpServer> = match &open.mcp {
            Some((url, token)) if caps.mcp_http => vec![McpServer::Http(
                McpServerHttp::new("tether", url.clone()).headers(vec![HttpHeader::new(
                    "Authorization",
                    format!("Bearer {token}"),
                )]),
            )],
            // Stdio, which every agent takes: this binary's bridge to the
            // same endpoint, with the token in its environment.
            Some((url, token)) => match std::env::current_exe() {
                Ok(me) => vec![McpServer::Stdio(
                    McpServerStdio::new("tether", me)
                        .args(vec!["mcp-stdio".into(), "--url".into(), url.clone()])
                        .env(vec![EnvVariable::new(
                            crate::agents::mcp_stdio::TOKEN_ENV,
                            token.clone(),
                        )]),
                )],
                Err(err) => {
                    tracing::warn!(error = %err, "the MCP bridge cannot be offered: this program's path is unknown");
                    Vec::new()
                }
            },
            None => Vec::new(),
        };
        let (session, resumed, settings) = match &open.mode {
            OpenMode::New => {
                let request = NewSessionRequest::new(cwd.clone())
                    .additional_directories(additional.clone())
                    .mcp_servers(mcp_servers.clone());
                let response = open_request(cx, timeout, "session/new", request, &logins).await?;
                let options = response.config_options.unwrap_or_default();
                let settings = AgentConfig::new(response.modes.as_ref(), &options);
                (response.session_id.to_string(), false, settings)
            }
            OpenMode::Reopen(id) if caps.resume => {
                let request = ResumeSessionRequest::new(id.clone(), cwd.clone())
                    .additional_directories(additional.clone())
                    .mcp_servers(mcp_servers.clone());
                let response =
                    open_request(cx, timeout, "session/resume", request, &logins).await?;
                let options = response.config_options.unwrap_or_default();
                let settings = AgentConfig::new(response.modes.as_ref(), &options);
                (id.clone(), true, settings)
            }
            OpenMode::Reopen(id) if caps.load_session => {
                // The agent replays the history as updates: it is already
                // in the transcript, so none of it is recorded again.
                if let Ok(mut m) = self.map.lock() {
                    m.replaying = Some(id.clone());
                }
                let request = LoadSessionRequest::new(id.clone(), cwd.clone())
                    .additional_directories(additional.clone())
                    .mcp_servers(mcp_servers.clone());
                let answer = open_request(cx, timeout, "session/load", request, &logins).await;
                if let Ok(mut m) = self.map.lock() {
                    m.replaying = None;
                }
                let response = answer?;
                let options = response.config_options.unwrap_or_default();
                let settings = AgentConfig::new(response.modes.as_ref(), &options);
                (id.clone(), true, settings)
            }
            OpenMode::Reopen(_) => {
                return Err("it can neither resume nor load sessions".to_owned());
            }
        };
        let opened = AgentEvent::Opened {
            acp_session_ref: session.clone(),
            load_session: caps.load_session || caps.resume,
            resumed,
        };
        self.events
            .send(opened)
            .await
            .map_err(|_| "the session stopped".to_owned())?;
        // The session's recorded values (chosen at creation, or changed
        // while no agent ran) are the agent's now; what it ends up with,
        // if other, is recorded.
        if let Ok(mut m) = self.map.lock() {
            m.config = settings;
            m.known_config = open.config.clone();
        }
        let wanted = open
            .config
            .as_ref()
            .and_then(|c| c["values"].as_object().cloned())
            .unwrap_or_default();
        if let Err(reason) = self.apply(cx, &session, &wanted, false).await {
            // A value the agent no longer takes: the session goes on with
            // what the agent has, which is recorded below.
            tracing::warn!(%reason, "the agent did not take the session's configuration");
        }
        self.record_config_moved().await;
        Ok(Sessions {
            main: session,
            default_chat: tether_protocol::channel::Channel::default_chat_uri(&self.session_id),
            live: HashMap::new(),
            recorded: open.chats,
            cwd,
            additional,
            mcp_servers,
            logins,
            reopen: caps.resume || caps.load_session,
            resume: caps.resume,
        })
    }

    /// The agent's session for `chat`, opened first when it is not yet:
    /// the default chat's is the one opened at start; another chat's is
    /// the one the transcript records for it, reopened (`session/resume`,
    /// or `session/load` with its replay dropped), or a new one, which the
    /// actor records (`x-tether/agentOpened` with the chat).
    pub(super) async fn session_for(
        &self,
        cx: &ConnectionTo<Agent>,
        sessions: &mut Sessions,
        chat: &str,
    ) -> Result<String, String> {
        if chat == sessions.default_chat {
            return Ok(sessions.main.clone());
        }
        if let Some(session) = sessions.live.get(chat) {
            return Ok(session.clone());
        }
        let timeout = self.limits.init_timeout;
        let (cwd, additional, mcp) = (
            sessions.cwd.clone(),
            sessions.additional.clone(),
            sessions.mcp_servers.clone(),
        );
        let recorded = sessions.recorded.get(chat).filter(|_| sessions.reopen);
        let (session, resumed) = match recorded {
            Some(id) if sessions.resume => {
                let request = ResumeSessionRequest::new(id.clone(), cwd)
                    .additional_directories(additional)
                    .mcp_servers(mcp);
                open_request(cx, timeout, "session/resume", request, &sessions.logins).await?;
                (id.clone(), true)
            }
            Some(id) => {
                if let Ok(mut m) = self.map.lock() {
                    m.replaying = Some(id.clone());
                }
                let request = LoadSessionRequest::new(id.clone(), cwd)
                    .additional_directories(additional)
                    .mcp_servers(mcp);
                let answer =
                    open_request(cx, timeout, "session/load", request, &sessions.logins).await;
                if let Ok(mut m) = self.map.lock() {
                    m.replaying = None;
                }
                answer?;
                (id.clone(), true)
            }
            None => {
                let request = NewSessionRequest::new(cwd)
                    .additional_directories(additional)
                    .mcp_servers(mcp);
                let response =
                    open_request(cx, timeout, "session/new", request, &sessions.logins).await?;
                (response.session_id.to_string(), false)
            }
        };
        self.join_settings(cx, &session).await;
        sessions.live.insert(chat.to_owned(), session.clone());
        sessions.recorded.insert(chat.to_owned(), session.clone());
        let opened = AgentEvent::ChatOpened {
            chat: chat.to_owned(),
            acp_session_ref: session.clone(),
            resumed,
        };
        self.events
            .send(opened)
            .await
            .map_err(|_| "the session stopped".to_owned())?;
        Ok(session)
    }

    /// A new chat forked from `source`'s (`session/fork` of the agent's
    /// session for that chat, which holds the whole conversation): the
    /// new session's id, which the actor records with the chat it creates.
    pub(super) async fn fork(
        &self,
        cx: &ConnectionTo<Agent>,
        sessions: &mut Sessions,
        source: &str,
        chat: &str,
    ) -> Result<String, String> {
        let from = self.session_for(cx, sessions, source).await?;
        let request = ForkSessionRequest::new(from, sessions.cwd.clone())
            .additional_directories(sessions.additional.clone())
            .mcp_servers(sessions.mcp_servers.clone());
        let response = tokio::time::timeout(
            self.limits.init_timeout,
            cx.send_request(request).block_task(),
        )
        .await
        .map_err(|_| "it did not answer session/fork in time".to_owned())?
        .map_err(|e| format!("it refused session/fork: {}", said(&e)))?;
        let session = response.session_id.to_string();
        sessions.live.insert(chat.to_owned(), session.clone());
        sessions.recorded.insert(chat.to_owned(), session.clone());
        Ok(session)
    }

    /// Fails a turn that cannot be prompted (its chat's session could not
    /// be opened), with why.
    pub(super) async fn refuse_turn(&self, turn: Queued, reason: String) {
        let actions = self
            .map
            .lock()
            .map(|mut m| {
                let turn = Turn {
                    chat: turn.chat,
                    turn_id: turn.turn_id,
                };
                m.begin(turn, now_ms());
                let why = format!("the agent could not open this chat's session: {reason}");
                m.finish(Err(why), now_ms())
            })
            .unwrap_or_default();
        if !actions.is_empty() {
            let _ = self.events.send(AgentEvent::Actions(actions)).await;
        }
    }

    /// Moves a chat's session to the session's configuration as clients
    /// know it (a configuration is the session's, whichever chat runs);
    /// a value it does not take is logged.
    async fn join_settings(&self, cx: &ConnectionTo<Agent>, session: &str) {
        let values = match self.map.lock() {
            Ok(m) => m
                .known_config
                .as_ref()
                .and_then(|c| c["values"].as_object().cloned())
                .unwrap_or_default(),
            Err(_) => return,
        };
        if let Err(reason) = self.apply(cx, session, &values, true).await {
            tracing::warn!(%reason, "a chat's agent session did not take the session's configuration");
        }
    }

    /// Sends `values`, taken by the agent's session `done`, to each of its
    /// other sessions in this process: the configuration is the AHP
    /// session's, whichever chat runs. A refusal is logged.
    pub(super) async fn spread(
        &self,
        cx: &ConnectionTo<Agent>,
        sessions: &Sessions,
        done: &str,
        values: &serde_json::Map<String, Value>,
    ) {
        for other in sessions.all().filter(|s| s.as_str() != done) {
            if let Err(reason) = self.apply(cx, other, values, true).await {
                tracing::warn!(%reason, "a chat's agent session did not take the session's configuration");
            }
        }
    }

    /// Records what the agent's configuration became, if it moved from
    /// what clients know.
    async fn record_config_moved(&self) {
        let actions = self
            .map
            .lock()
            .map(|mut m| m.config_moved())
            .unwrap_or_default();
        if !actions.is_empty() {
            let _ = self.events.send(AgentEvent::Actions(actions)).await;
        }
    }

    /// Moves the agent to `values` (`session/set_mode`,
    /// `session/set_config_option`), one request at a time, keeping what
    /// it reports in the map; stops at the first refusal, with the
    /// agent's words. With `every`, also the values the map says the agent
    /// has (they are the default chat's session's).
    pub(super) async fn apply(
        &self,
        cx: &ConnectionTo<Agent>,
        session: &str,
        values: &serde_json::Map<String, Value>,
        every: bool,
    ) -> Result<(), NotApplied> {
        let settings = match self.map.lock() {
            Ok(m) if every => m.config.every_setting(values),
            Ok(m) => m.config.settings_for(values),
            Err(_) => return Err(NotApplied::unanswered("the session's state is unavailable")),
        };
        let timeout = self.limits.init_timeout;
        for setting in settings {
            match setting {
                Setting::Mode(mode) => {
                    let request = SetSessionModeRequest::new(session.to_owned(), mode.clone());
                    tokio::time::timeout(timeout, cx.send_request(request).block_task())
                        .await
                        .map_err(|_| {
                            NotApplied::unanswered("it did not answer session/set_mode in time")
                        })?
                        .map_err(|e| {
                            NotApplied::refused(format!("it refused mode {mode:?}: {}", said(&e)))
                        })?;
                    if let Ok(mut m) = self.map.lock() {
                        m.config.set_mode(&mode);
                    }
                }
                Setting::Option(id, value) => {
                    let typed = match &value {
                        Value::Bool(on) => SessionConfigOptionValue::boolean(*on),
                        Value::String(choice) => SessionConfigOptionValue::value_id(choice.clone()),
                        other => {
                            return Err(NotApplied::refused(format!(
                                "option {id:?} cannot take {other}"
                            )));
                        }
                    };
                    let request =
                        SetSessionConfigOptionRequest::new(session.to_owned(), id.clone(), typed);
                    let response =
                        tokio::time::timeout(timeout, cx.send_request(request).block_task())
                            .await
                            .map_err(|_| {
                                NotApplied::unanswered(
                                    "it did not answer session/set_config_option in time",
                                )
                            })?
                            .map_err(|e| {
                                NotApplied::refused(format!(
                                    "it refused {id:?} = {value}: {}",
                                    said(&e)
                                ))
                            })?;
                    if let Ok(mut m) = self.map.lock() {
                        m.config.set_options(&response.config_options);
                    }
                }
            }
        }
        Ok(())
    }

    /// A client's `session/configChanged`, before it is committed: the
    /// agent is moved to the values; the answer is what else changed with
    /// them (the client's own values are recorded with its action).
    pub(super) async fn configure(
        &self,
        cx: &ConnectionTo<Agent>,
        session: &str,
        values: &serde_json::Map<String, Value>,
    ) -> Result<Moved, ConfigRefused> {
        let applied = self.apply(cx, session, values, false).await;
        let mut m = self.map.lock().map_err(|_| ConfigRefused {
            reason: "the session's state is unavailable".to_owned(),
            moved: Vec::new(),
            transient: true,
        })?;
        // What clients will know once the client's action is recorded.
        if applied.is_ok()
            && let Some(known) = m.known_config.as_mut()
        {
            for (key, value) in values {
                known["values"][key] = value.clone();
            }
        }
        // What moved, the client's values or (refused part way) those
        // taken before the refusal: recorded either way.
        let moved = m.config_moved();
        match applied {
            Ok(()) => Ok(moved),
            Err(not) => Err(ConfigRefused {
                reason: not.reason,
                moved,
                transient: not.transient,
            }),
        }
    }

    /// Moves the agent to the model a turn's message asks for (the turn's
    /// session, then the others), recording the change; a refusal is
    /// logged and the turn goes on with the current model.
    pub(super) async fn choose_model(
        &self,
        cx: &ConnectionTo<Agent>,
        sessions: &Sessions,
        session: &str,
        model: &str,
    ) {
        // The one value to move, when the agent has a model option and is
        // not on that model already.
        let values = match self.map.lock() {
            Ok(m) => m
                .config
                .model_option()
                .map(|option| {
                    let mut values = serde_json::Map::new();
                    values.insert(option.to_owned(), Value::String(model.to_owned()));
                    values
                })
                .filter(|values| !m.config.settings_for(values).is_empty()),
            Err(_) => None,
        };
        let Some(values) = values else { return };
        match self.apply(cx, session, &values, false).await {
            Ok(()) => self.spread(cx, sessions, session, &values).await,
            Err(reason) => tracing::warn!(%reason, "the agent did not take the turn's model"),
        }
        self.record_config_moved().await;
    }

    /// A message's content blocks: its text, then each attachment as the
    /// agent takes it (a stored one loaded: an image or audio block, or an
    /// embedded resource, text or blob; another reference a resource link;
    /// a simple one its text).
    pub(super) async fn content(&self, message: &Queued) -> Vec<ContentBlock> {
        let mut blocks = vec![ContentBlock::Text(TextContent::new(message.text.clone()))];
        for attachment in &message.attachments {
            let label = attachment["label"].as_str().unwrap_or("attachment");
            let uri = attachment["uri"].as_str().unwrap_or_default();
            let block = match attachment["type"].as_str() {
                Some("simple") => Some(serde_json::json!({"type": "text",
                    "text": attachment["modelRepresentation"].as_str().unwrap_or(label)})),
                Some("resource") => match crate::store::attachment_digest(uri) {
                    Some(digest) => match self.store.attachment(&self.session_id, digest).await {
                        Ok(Some(stored)) => Some(stored_block(uri, &stored)),
                        Ok(None) => None,
                        Err(err) => {
                            tracing::warn!(error = %err, "an attachment could not be read");
                            None
                        }
                    },
                    None => Some(serde_json::json!({"type": "resource_link", "uri": uri,
                        "name": label, "mimeType": attachment["contentType"],
                        "size": attachment["sizeHint"]})),
                },
                _ => None,
            };
            if let Some(block) = block.and_then(|b| serde_json::from_value(b).ok()) {
                blocks.push(block);
            }
        }
        blocks
    }

    pub(super) fn prompt(
        &self,
        cx: &ConnectionTo<Agent>,
        session: &str,
        next: Queued,
        blocks: Vec<ContentBlock>,
        done: mpsc::UnboundedSender<()>,
    ) -> Result<(), agent_client_protocol::Error> {
        if let Ok(mut m) = self.map.lock() {
            m.begin(
                Turn {
                    chat: next.chat,
                    turn_id: next.turn_id,
                },
                now_ms(),
            );
        }
        let request = PromptRequest::new(session.to_owned(), blocks);
        let (events, map) = (self.events.clone(), self.map.clone());
        let verdict = self.verdict.clone();
        cx.prepare_request(request)
            .on_receiving_result(async move |result| {
                let halted = stopping(&verdict);
                let gone = result.as_ref().is_err_and(|err| {
                    agent_client_protocol::is_incoming_transport_closed(err)
                        || agent_client_protocol::is_connection_terminated(err)
                });
                if halted || gone {
                    // The process is going (it broke a limit, or exited):
                    // its exit fails the turn, with why.
                    let _ = done.send(());
                    return Ok(());
                }
                let usage = result.as_ref().ok().and_then(|r| r.usage.clone());
                let stop = result.map(|r| r.stop_reason).map_err(|e| said(&e));
                let actions = map
                    .lock()
                    .map(|mut m| {
                        let mut actions = usage.map(|u| m.turn_tokens(&u)).unwrap_or_default();
                        actions.extend(m.finish(stop, now_ms()));
                        actions
                    })
                    .unwrap_or_default();
                if !actions.is_empty() {
                    let _ = events.send(AgentEvent::Actions(actions)).await;
                }
                let _ = done.send(());
                Ok(())
            })
    }
}

/// Why the agent did not take a configuration value: its refusal, or no
/// answer (which a later try may get past).
#[derive(Debug)]
pub(super) struct NotApplied {
    reason: String,
    transient: bool,
}

impl NotApplied {
    fn refused(reason: String) -> Self {
        Self {
            reason,
            transient: false,
        }
    }

    fn unanswered(reason: &str) -> Self {
        Self {
            reason: reason.to_owned(),
            transient: true,
        }
    }
}

impl std::fmt::Display for NotApplied {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.reason)
    }
}
