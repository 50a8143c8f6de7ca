//! A client's terminals on a session (`createTerminal`, `disposeTerminal`):
//! a shell in the session's directories, started through the sandbox as
//! the session's agent would be (its environment is the host's allow-list
//! only: no agent's keys), its output recorded as `terminal/*` actions.

use std::path::PathBuf;

use serde_json::{Value, json};
use tether_protocol::channel::Channel;
use tether_protocol::workdir::file_uri_path;

use super::SessionActor;
use crate::agents::AgentCommand;
use crate::agents::sandbox::{Launch, Run};
use crate::agents::terminals::NewTerminal;
use crate::engine::EngineError;

/// The shell a client's terminal runs.
const SHELL: &str = "/bin/sh";

impl SessionActor {
    /// Opens terminal `uri` for a client.
    pub(super) fn create_terminal(
        &mut self,
        uri: &str,
        claim: Value,
        title: String,
        cwd: Option<&str>,
    ) -> Result<Value, EngineError> {
        let model = self
            .model
            .as_ref()
            .ok_or_else(|| EngineError::NotFound(format!("Session {} does not exist.", self.id)))?;
        if model.terminals.contains_key(uri) || self.ctx.terminals.get(uri).is_some() {
            return Err(EngineError::AlreadyExists(format!(
                "Terminal {uri} exists already."
            )));
        }
        let dirs: Vec<PathBuf> = model
            .session
            .working_directories
            .iter()
            .flatten()
            .filter_map(|u| {
                self.ctx
                    .config
                    .roots
                    .resolve_uri(&model.created.project, u)
                    .ok()
            })
            .collect();
        let cwd = cwd
            .map(|u| file_uri_path(u).map(PathBuf::from))
            .transpose()
            .map_err(|e| EngineError::InvalidParams(format!("cwd: {e}")))?;
        let shell =
            AgentCommand::parse(&format!("terminal={SHELL}")).map_err(EngineError::Unavailable)?;
        let child = self
            .ctx
            .config
            .sandbox
            .run(
                &Launch {
                    command: &shell,
                    scratch: &self.id,
                    dirs: &dirs,
                },
                &Run {
                    program: SHELL,
                    args: &[],
                    env: &[],
                    cwd: cwd.as_deref(),
                },
            )
            .map_err(EngineError::InvalidParams)?;
        let (record, mut recorded) = tokio::sync::mpsc::channel(16);
        let engine = self.engine();
        tokio::spawn(async move {
            while let Some(actions) = recorded.recv().await {
                engine.record_host(actions).await;
            }
        });
        let limits = self.ctx.config.acp.terminals;
        let cwd = cwd
            .or_else(|| dirs.first().cloned())
            .map(|d| crate::agents::acp::edits::file_uri(&d));
        self.ctx
            .terminals
            .start(
                NewTerminal {
                    uri: uri.to_owned(),
                    claim,
                    title,
                    cwd,
                    keep_bytes: limits.output_bytes,
                    interactive: true,
                },
                child,
                limits,
                record,
            )
            .map_err(EngineError::Conflict)?;
        tracing::info!(session = %self.id, terminal = %uri, "terminal opened");
        Ok(json!({}))
    }

    /// Closes terminal `uri` (kills what runs in it).
    pub(super) fn dispose_terminal(&mut self, uri: &str) -> Result<Value, EngineError> {
        let known = self
            .model
            .as_ref()
            .is_some_and(|m| m.terminals.contains_key(uri));
        match self.ctx.terminals.release(uri) {
            Some(_) => Ok(json!({})),
            None if known => Ok(json!({})),
            None => Err(EngineError::NotFound(format!(
                "Terminal {uri} does not exist ({}).",
                Channel::parse(uri).map_or("not a terminal URI", |_| "not on this session")
            ))),
        }
    }
}
