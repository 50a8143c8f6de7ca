//! What clients ask of a session's host beyond actions (AHP commands):
//! `invokeChangesetOperation`. Checked here (role, visibility, shape), run
//! by the session's actor on the host that holds it.

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
        self.ask(&session, |reply| Command::Operate { operation, reply })
            .await
    }
}
