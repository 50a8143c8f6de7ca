//! The agent's side of this host's terminals (ACP `terminal/*`).

use super::*;

/// The agent's side of this host's terminals: ACP terminal ids are the
/// names in `ahp-terminal:/<session>/<id>`.
#[derive(Clone)]
pub(super) struct AgentTerminals {
    pub(super) session_id: String,
    pub(super) command: AgentCommand,
    pub(super) sandbox: Sandbox,
    pub(super) dirs: Vec<PathBuf>,
    pub(super) terminals: Terminals,
    pub(super) limits: crate::agents::terminals::TerminalLimits,
    pub(super) map: Arc<Mutex<TurnMap>>,
    pub(super) record: mpsc::Sender<crate::agents::acp::map::Actions>,
}

impl AgentTerminals {
    pub(super) fn uri(&self, id: &str) -> String {
        tether_protocol::channel::Channel::terminal_uri(&self.session_id, id)
    }

    pub(super) fn get(&self, id: &str) -> Option<Arc<crate::agents::terminals::Terminal>> {
        self.terminals.get(&self.uri(id))
    }

    pub(super) fn release(&self, id: &str) -> bool {
        self.terminals.release(&self.uri(id)).is_some()
    }

    /// `terminal/create`: runs the command confined, in the session's
    /// directories; the new terminal's id.
    pub(super) fn create(&self, request: &CreateTerminalRequest) -> Result<String, String> {
        let id = format!("t-{}", &uuid::Uuid::new_v4().simple().to_string()[..12]);
        let env: Vec<(String, String)> = request
            .env
            .iter()
            .map(|v| (v.name.clone(), v.value.clone()))
            .collect();
        let scratch = self.session_id.clone();
        let child = self.sandbox.run(
            &Launch {
                command: &self.command,
                scratch: &scratch,
                dirs: &self.dirs,
            },
            &Run {
                program: &request.command,
                args: &request.args,
                env: &env,
                cwd: request.cwd.as_deref(),
            },
        )?;
        let title = std::iter::once(request.command.as_str())
            .chain(request.args.iter().map(String::as_str))
            .collect::<Vec<_>>()
            .join(" ");
        let (chat, turn_id) = match self.map.lock() {
            Ok(mut m) => {
                m.terminal_opened(&id, &title);
                match m.turn() {
                    Some(turn) => (turn.chat.clone(), Some(turn.turn_id.clone())),
                    None => (
                        tether_protocol::channel::Channel::default_chat_uri(&self.session_id),
                        None,
                    ),
                }
            }
            Err(_) => return Err("the session is stopping".to_owned()),
        };
        let mut claim = serde_json::json!({"kind": "session",
            "session": tether_protocol::channel::Channel::session_uri(&self.session_id), "chat": chat});
        if let Some(turn_id) = turn_id {
            claim["turnId"] = serde_json::json!(turn_id);
        }
        let keep = request
            .output_byte_limit
            .and_then(|l| usize::try_from(l).ok())
            .unwrap_or(self.limits.output_bytes);
        let cwd = request
            .cwd
            .clone()
            .or_else(|| self.dirs.first().cloned())
            .map(|d| crate::agents::acp::edits::file_uri(&d));
        self.terminals.start(
            NewTerminal {
                uri: self.uri(&id),
                claim,
                title,
                cwd,
                keep_bytes: keep,
                interactive: false,
            },
            child,
            self.limits,
            self.record.clone(),
        )?;
        Ok(id)
    }
}

/// ACP's `TerminalExitStatus` of an exit.
pub(super) fn exit_status(exit: &crate::agents::terminals::Exit) -> Value {
    serde_json::json!({"exitCode": exit.code.and_then(|c| u32::try_from(c).ok()), "signal": exit.signal})
}

pub(super) fn unknown_terminal(id: &impl std::fmt::Display) -> agent_client_protocol::Error {
    agent_client_protocol::Error::invalid_params().data(serde_json::json!(format!(
        "No terminal {id} in this session."
    )))
}
