//! What a session actor is asked to do, and what a dispatch answers.

use std::sync::Arc;

use serde_json::Value;
use tether_protocol::model::SessionCreated;
use tether_protocol::view::SessionView;
use tokio::sync::oneshot;

use super::fanout::Published;
use super::{EngineError, Refusal};
use crate::auth::Principal;
use crate::store::Origin;

/// The answer to a dispatch.
#[derive(Debug, Clone)]
pub enum DispatchOutcome {
    /// Accepted (now or, for a retry, originally) as this envelope.
    Accepted(Arc<Published>),
    /// Refused, with its kind and a reason a person can act on.
    Rejected(Refusal),
}

/// One action to validate, apply and commit.
#[derive(Debug)]
pub struct Dispatch {
    /// The dispatching client; `None` for host-originated actions.
    pub origin: Option<Origin>,
    /// Target channel (the session or one of its chats).
    pub channel: String,
    /// The action object.
    pub action: Value,
    /// The caller, checked against the session's project (`None` for the host).
    pub principal: Option<Principal>,
    /// Where the outcome goes.
    pub reply: Option<oneshot::Sender<DispatchOutcome>>,
    /// A copy of the action only one client receives (host-originated
    /// client tool calls); never stored.
    pub directed: Option<crate::store::Directed>,
}

/// What a client asks of a session's host beyond an action (AHP
/// commands): its effects are recorded by the actions it causes.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
#[serde(tag = "op", rename_all = "camelCase")]
pub enum Operation {
    /// `invokeChangesetOperation` `revert`: a changeset's files (or one,
    /// `resource`) are written back as they were before.
    Revert {
        /// The changeset's URI.
        changeset: String,
        /// The one file to revert (its URI); `None`: every file.
        resource: Option<String>,
    },
    /// `createTerminal`: a shell in the session's directories, confined as
    /// its agent would be, fed by `terminal/input`.
    CreateTerminal {
        /// The terminal's URI (`ahp-terminal:/<session>/<name>`).
        terminal: String,
        /// Who holds it (AHP `TerminalClaim`).
        claim: Value,
        /// Its title.
        title: String,
        /// Where it starts (a `file:` URI); `None`: the primary directory.
        cwd: Option<String>,
    },
    /// `disposeTerminal`: its process is killed and it is forgotten.
    DisposeTerminal {
        /// The terminal's URI.
        terminal: String,
    },
}

/// Where a forked chat comes from (AHP `createChat {source: {kind: fork}}`):
/// a chat of the same session and one of its completed turns.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ChatFork {
    /// The source chat's URI.
    pub chat: String,
    /// The turn through which its history is copied.
    pub turn_id: String,
}

/// A message to a session actor.
#[derive(Debug)]
pub enum Command {
    /// Validate, apply and commit an action.
    /// Boxed, as the operation below: a mailbox keeps the slots its last
    /// burst needed, so the command's size is paid several times by every
    /// live session.
    Dispatch(Box<Dispatch>),
    /// Create the session.
    Create {
        /// Its first record.
        created: Box<SessionCreated>,
        /// The principal (token `sub`) creating it with an active client:
        /// that client's owner.
        owner: Option<String>,
        /// The outcome.
        reply: oneshot::Sender<Result<SessionView, EngineError>>,
    },
    /// Settle the session for good (closed when resumable, else ended).
    Dispose {
        /// The outcome.
        reply: oneshot::Sender<Result<SessionView, EngineError>>,
    },
    /// A channel's state and the seq it includes, taken together.
    Snapshot {
        /// The session or one of its chats.
        channel: String,
        /// `(state, fromSeq)`, or `None` when the channel is not this session's.
        reply: oneshot::Sender<Result<Option<(Value, u64)>, EngineError>>,
    },
    /// Adds a chat to the session (`session/chatAdded`, host-originated).
    CreateChat {
        /// The new chat's URI.
        chat: String,
        /// The chat and turn it is forked from, if it is.
        fork: Option<Box<ChatFork>>,
        /// The outcome.
        reply: oneshot::Sender<Result<(), EngineError>>,
    },
    /// Resumes the session's agent (ACP `session/resume` semantics).
    Resume {
        /// The caller's primary directory, canonical `file:` URI.
        cwd: String,
        /// The complete new list of additional directories (canonical URIs).
        additional: Vec<String>,
        /// The outcome.
        reply: oneshot::Sender<Result<SessionView, EngineError>>,
    },
    /// At start-up: fail an open turn and settle a session nobody settled.
    Sweep {
        /// Whether anything was written.
        reply: oneshot::Sender<Result<bool, EngineError>>,
    },
    /// Loads older turns of a chat into its window (`fetchTurns`).
    FetchTurns {
        /// The chat's URI.
        chat: String,
        /// A `turnsNextCursor` this host issued; `None`: the next page.
        cursor: Option<String>,
        /// The seq of the `chat/turnsLoaded` committed, if any.
        reply: oneshot::Sender<Result<Option<u64>, EngineError>>,
    },
    /// The session's agent calls a client tool (MCP `tools/call`).
    CallTool {
        /// The tool.
        name: String,
        /// Its arguments, as the model wrote them (boxed, as a dispatch).
        arguments: Box<Value>,
        /// The client's result, or why the call failed.
        reply: oneshot::Sender<Result<Value, String>>,
    },
    /// A client's last connection closed and its grace period passed:
    /// its tool calls fail and it leaves the session's active clients.
    ClientGone {
        /// The client.
        client_id: String,
    },
    /// The server is shutting down: stop the agent, fail its open turn
    /// and settle the session dormant (resumable), then answer.
    Shutdown {
        /// Told when the records are committed.
        reply: oneshot::Sender<()>,
    },
    /// Runs an operation a client asked for (forwarded to the session's
    /// holder like a write).
    Operate {
        /// What to do.
        operation: Box<Operation>,
        /// Its result, or why it was refused.
        reply: oneshot::Sender<Result<Value, EngineError>>,
    },
    /// The session's view.
    View {
        /// `None` when the session does not exist.
        reply: oneshot::Sender<Result<Option<SessionView>, EngineError>>,
    },
}

impl Command {
    /// Whether this command may bring a session into being (the only one
    /// that may start an actor for an id the store does not know).
    pub(super) fn creates(&self) -> bool {
        matches!(self, Command::Create { .. })
    }

    /// Answers the command with `err` without running it.
    pub(super) fn fail(self, err: EngineError) {
        match self {
            Command::Dispatch(d) => {
                if let Some(reply) = d.reply {
                    let refusal = Refusal::new(super::RefusalKind::Unavailable, err.to_string());
                    let _ = reply.send(DispatchOutcome::Rejected(refusal));
                }
            }
            Command::Create { reply, .. } | Command::Dispose { reply } => {
                let _ = reply.send(Err(err));
            }
            Command::Resume { reply, .. } => {
                let _ = reply.send(Err(err));
            }
            Command::Snapshot { reply, .. } => {
                let _ = reply.send(Err(err));
            }
            Command::View { reply } => {
                let _ = reply.send(Err(err));
            }
            Command::CreateChat { reply, .. } => {
                let _ = reply.send(Err(err));
            }
            Command::Sweep { reply } => {
                let _ = reply.send(Err(err));
            }
            Command::FetchTurns { reply, .. } => {
                let _ = reply.send(Err(err));
            }
            Command::ClientGone { .. } => {}
            Command::Shutdown { reply } => {
                let _ = reply.send(());
            }
            Command::CallTool { reply, .. } => {
                let _ = reply.send(Err(err.to_string()));
            }
            Command::Operate { reply, .. } => {
                let _ = reply.send(Err(err));
            }
        }
    }

    /// Answers the command as a session that does not exist would: no
    /// actor is started and nothing is written for an unknown id.
    pub(super) fn answer_missing(self, id: &str) {
        let missing = || EngineError::NotFound(format!("Session {id} does not exist."));
        match self {
            Command::View { reply } => {
                let _ = reply.send(Ok(None));
            }
            Command::Snapshot { reply, .. } => {
                let _ = reply.send(Ok(None));
            }
            Command::Sweep { reply } => {
                let _ = reply.send(Ok(false));
            }
            Command::Dispatch(d) => {
                if let Some(reply) = d.reply {
                    let refusal = Refusal::new(
                        super::RefusalKind::NotFound,
                        format!("Channel {} does not exist.", d.channel),
                    );
                    let _ = reply.send(DispatchOutcome::Rejected(refusal));
                }
            }
            other => other.fail(missing()),
        }
    }
}
