//! What clients ask of a session's host beyond actions (AHP commands):
//! `invokeChangesetOperation`, `createTerminal`, `disposeTerminal`.
//! Checked here (role, visibility, shape), run by the session's actor on
//! the host that holds it.

use serde_json::Value;
use tether_protocol::channel::Channel;

use super::command::{Command, Operation};
use super::{Engine, EngineError};
use crate::agents::acp::edits::REVERT;
use crate::auth::Principal;

impl Engine {
    /// `invokeChangesetOperation` on `channel` (one of a session's
    /// changesets): `revert`, of the whole changeset or of one file
    /// (`target: {kind: "resource", resource}`). Its result
    /// (`{message}`), or why it was refused.
    pub async fn invoke_changeset_operation(
        &self,
        principal: &Principal,
        channel: &str,
        operation_id: &str,
        target: Option<&Value>,
    ) -> Result<Value, EngineError> {
        let invalid = |m: String| EngineError::InvalidParams(m);
        let Ok(Channel::Changeset { session, .. }) = Channel::parse(channel) else {
            return Err(invalid(format!(
                "{channel} is not a changeset; changesets are ahp-changeset:/<session>/<name>."
            )));
        };
        // The session first: a changeset is told of only to a caller who
        // may see its session.
        self.session_view(principal, &session).await?;
        if !principal.can_write() {
            return Err(EngineError::Forbidden(
                "Viewers cannot change files; reverting needs an operator.".into(),
            ));
        }
        if operation_id != REVERT {
            return Err(invalid(format!(
                "Changeset operation {operation_id:?} is not offered; Tether offers {REVERT:?}."
            )));
        }
        let resource = match target {
            None | Some(Value::Null) => None,
            Some(target) if target["kind"] == "resource" => Some(
                target["resource"]
                    .as_str()
                    .ok_or_else(|| invalid("target.resource must be a file URI.".into()))?
                    .to_owned(),
            ),
            Some(target) => {
                return Err(invalid(format!(
                    "{REVERT:?} applies to a whole changeset or one file (target kind \
                     \"resource\"), not to {}.",
                    target["kind"]
                )));
            }
        };
        let operation = Operation::Revert {
            changeset: channel.to_owned(),
            resource,
        };
        self.ask(&session, |reply| Command::Operate {
            operation: Box::new(operation),
            reply,
        })
        .await
    }
}

impl Engine {
    /// `createTerminal` on `channel` (`ahp-terminal:/<session>/<name>`): a
    /// shell in the session's directories (`cwd`, a `file:` URI, or the
    /// primary one), confined as its agent would be. Operators and up.
    pub async fn create_terminal(
        &self,
        principal: &Principal,
        channel: &str,
        params: &Value,
    ) -> Result<Value, EngineError> {
        let session = self.terminal_session(principal, channel).await?;
        let claim = params
            .get("claim")
            .filter(|c| c.is_object())
            .cloned()
            .ok_or_else(|| {
                EngineError::InvalidParams(
                    "params.claim (who holds the terminal: {kind: \"client\", clientId}) is \
                     required."
                        .into(),
                )
            })?;
        if serde_json::from_value::<ahp_types::state::TerminalClaim>(claim.clone()).is_err() {
            return Err(EngineError::InvalidParams(
                "params.claim must be an AHP TerminalClaim: {kind: \"client\", clientId} or \
                 {kind: \"session\", session, chat}."
                    .into(),
            ));
        }
        let title = params
            .get("name")
            .and_then(Value::as_str)
            .unwrap_or("Shell")
            .to_owned();
        let cwd = params.get("cwd").and_then(Value::as_str).map(str::to_owned);
        let operation = Operation::CreateTerminal {
            terminal: channel.to_owned(),
            claim,
            title,
            cwd,
        };
        self.ask(&session, |reply| Command::Operate {
            operation: Box::new(operation),
            reply,
        })
        .await
    }

    /// `disposeTerminal`: kills the terminal's process and forgets it (its
    /// recorded output stays).
    pub async fn dispose_terminal(
        &self,
        principal: &Principal,
        channel: &str,
    ) -> Result<Value, EngineError> {
        let session = self.terminal_session(principal, channel).await?;
        let operation = Operation::DisposeTerminal {
            terminal: channel.to_owned(),
        };
        self.ask(&session, |reply| Command::Operate {
            operation: Box::new(operation),
            reply,
        })
        .await
    }

    /// The session of terminal `channel`, for a caller who may see it and
    /// change it.
    async fn terminal_session(
        &self,
        principal: &Principal,
        channel: &str,
    ) -> Result<String, EngineError> {
        let Ok(Channel::Terminal { session, .. }) = Channel::parse(channel) else {
            return Err(EngineError::InvalidParams(format!(
                "{channel} is not a terminal URI; terminals are ahp-terminal:/<session>/<name>."
            )));
        };
        self.session_view(principal, &session).await?;
        if !principal.can_write() {
            return Err(EngineError::Forbidden(
                "Viewers cannot open or close terminals; that needs an operator.".into(),
            ));
        }
        Ok(session)
    }

    /// Records host-originated actions on `session`'s channels, in order
    /// (a terminal's output, as it comes).
    pub(super) async fn record_host(&self, actions: Vec<(String, Value)>) {
        for (channel, action) in actions {
            let outcome = self
                .dispatch(&Principal::loopback_admin(), None, &channel, action)
                .await;
            if let super::DispatchOutcome::Rejected(refusal) = outcome {
                tracing::warn!(%channel, reason = %refusal.reason, "a host action was not recorded");
            }
        }
    }
}
