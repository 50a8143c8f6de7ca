//! The wire form of forwarded actor commands: a write command split into
//! what goes to the holder and where its answer goes here, the holder's
//! answer, and the names refusals and errors travel under.

use std::sync::Arc;

use serde::{Deserialize, Serialize};
use serde_json::Value;
use tether_protocol::model::SessionCreated;
use tether_protocol::view::SessionView;
use tokio::sync::oneshot;

use super::super::command::{ChatFork, Command, Dispatch, DispatchOutcome, Operation};
use super::super::fanout::Published;
use super::super::{EngineError, Refusal, RefusalKind};
use crate::auth::Principal;
use crate::store::Origin;

/// A forwarded actor command.
#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "camelCase")]
pub(super) enum Request {
    Dispatch {
        origin: Option<Origin>,
        channel: String,
        action: Value,
        principal: Option<Principal>,
    },
    Create {
        created: Box<SessionCreated>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        owner: Option<String>,
    },
    Dispose,
    CreateChat {
        chat: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        fork: Option<Box<ChatFork>>,
    },
    Resume {
        cwd: String,
        additional: Vec<String>,
    },
    Sweep,
    FetchTurns {
        chat: String,
        cursor: Option<String>,
    },
    Operate {
        operation: Operation,
    },
}

/// The holder's answer to a forwarded command.
#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "camelCase")]
pub(super) enum Answer {
    Accepted {
        seq: u64,
        channel: String,
        frame: String,
    },
    Rejected {
        refusal: String,
        reason: String,
    },
    View {
        view: Box<SessionView>,
    },
    Done,
    Swept {
        swept: bool,
    },
    Loaded {
        seq: Option<u64>,
    },
    Result {
        value: Value,
    },
    Failed {
        error: String,
        message: String,
    },
}

/// Where the answer to a forwarded command goes on the sending host.
#[derive(Debug)]
pub(super) enum ReplyTo {
    Dispatch(Option<oneshot::Sender<DispatchOutcome>>),
    View(oneshot::Sender<Result<SessionView, EngineError>>),
    Unit(oneshot::Sender<Result<(), EngineError>>),
    Bool(oneshot::Sender<Result<bool, EngineError>>),
    Seq(oneshot::Sender<Result<Option<u64>, EngineError>>),
    Value(oneshot::Sender<Result<Value, EngineError>>),
}

/// Splits a write command into what is forwarded and where its answer
/// goes; reads come back unchanged.
pub(super) fn split(command: Command) -> Result<(Request, ReplyTo), Box<Command>> {
    Ok(match command {
        Command::Dispatch(d) => {
            let d = *d;
            (
                Request::Dispatch {
                    origin: d.origin,
                    channel: d.channel,
                    action: d.action,
                    principal: d.principal,
                },
                ReplyTo::Dispatch(d.reply),
            )
        }
        Command::Create {
            created,
            owner,
            reply,
        } => (Request::Create { created, owner }, ReplyTo::View(reply)),
        Command::Dispose { reply } => (Request::Dispose, ReplyTo::View(reply)),
        Command::CreateChat { chat, fork, reply } => {
            (Request::CreateChat { chat, fork }, ReplyTo::Unit(reply))
        }
        Command::Resume {
            cwd,
            additional,
            reply,
        } => (Request::Resume { cwd, additional }, ReplyTo::View(reply)),
        Command::Sweep { reply } => (Request::Sweep, ReplyTo::Bool(reply)),
        Command::FetchTurns {
            chat,
            cursor,
            reply,
        } => (Request::FetchTurns { chat, cursor }, ReplyTo::Seq(reply)),
        Command::Operate { operation, reply } => (
            Request::Operate {
                operation: *operation,
            },
            ReplyTo::Value(reply),
        ),
        // Presence is per host: a proxy copy has no client calls to fail.
        read @ (Command::View { .. }
        | Command::Snapshot { .. }
        | Command::ClientGone { .. }
        | Command::Shutdown { .. }
        | Command::CallTool { .. }) => {
            return Err(Box::new(read));
        }
    })
}

/// The command again, to run here after all (this host took the lease).
pub(super) fn join(request: Request, reply: ReplyTo) -> Command {
    match (request, reply) {
        (
            Request::Dispatch {
                origin,
                channel,
                action,
                principal,
            },
            ReplyTo::Dispatch(reply),
        ) => Command::Dispatch(Box::new(Dispatch {
            origin,
            channel,
            action,
            principal,
            directed: None,
            reply,
        })),
        (Request::Create { created, owner }, ReplyTo::View(reply)) => Command::Create {
            created,
            owner,
            reply,
        },
        (Request::Dispose, ReplyTo::View(reply)) => Command::Dispose { reply },
        (Request::Resume { cwd, additional }, ReplyTo::View(reply)) => Command::Resume {
            cwd,
            additional,
            reply,
        },
        (Request::CreateChat { chat, fork }, ReplyTo::Unit(reply)) => {
            Command::CreateChat { chat, fork, reply }
        }
        (Request::Sweep, ReplyTo::Bool(reply)) => Command::Sweep { reply },
        (Request::FetchTurns { chat, cursor }, ReplyTo::Seq(reply)) => Command::FetchTurns {
            chat,
            cursor,
            reply,
        },
        (Request::Operate { operation }, ReplyTo::Value(reply)) => Command::Operate {
            operation: Box::new(operation),
            reply,
        },
        // `split` never pairs them otherwise.
        (_, reply) => {
            reply.fail(EngineError::Unavailable(
                "internal: mismatched forward".into(),
            ));
            Command::Sweep {
                reply: oneshot::channel().0,
            }
        }
    }
}

impl ReplyTo {
    /// Whether whoever asked stopped waiting for the answer.
    pub(super) fn abandoned(&self) -> bool {
        match self {
            // Dispatched for its effect: nobody ever waited.
            ReplyTo::Dispatch(None) => false,
            ReplyTo::Dispatch(Some(reply)) => reply.is_closed(),
            ReplyTo::View(reply) => reply.is_closed(),
            ReplyTo::Unit(reply) => reply.is_closed(),
            ReplyTo::Bool(reply) => reply.is_closed(),
            ReplyTo::Seq(reply) => reply.is_closed(),
            ReplyTo::Value(reply) => reply.is_closed(),
        }
    }

    pub(super) fn fail(self, err: EngineError) {
        match self {
            ReplyTo::Dispatch(reply) => {
                if let Some(reply) = reply {
                    let refusal = Refusal::new(RefusalKind::Unavailable, err.to_string());
                    let _ = reply.send(DispatchOutcome::Rejected(refusal));
                }
            }
            ReplyTo::View(reply) => drop(reply.send(Err(err))),
            ReplyTo::Unit(reply) => drop(reply.send(Err(err))),
            ReplyTo::Bool(reply) => drop(reply.send(Err(err))),
            ReplyTo::Seq(reply) => drop(reply.send(Err(err))),
            ReplyTo::Value(reply) => drop(reply.send(Err(err))),
        }
    }

    pub(super) fn deliver(self, answer: Answer) {
        let garbled = || EngineError::Unavailable("the session's host answered garbage".into());
        if let Answer::Failed { error, message } = answer {
            return self.fail(error_of(&error, message));
        }
        match (self, answer) {
            (ReplyTo::Dispatch(reply), answer) => {
                let outcome = match answer {
                    Answer::Accepted {
                        seq,
                        channel,
                        frame,
                    } => DispatchOutcome::Accepted(Arc::new(Published {
                        seq,
                        channel,
                        frame: frame.into(),
                        directed: None,
                        committed: std::time::Instant::now(),
                        // An answer, never published to the hub.
                        creates: false,
                    })),
                    Answer::Rejected { refusal, reason } => {
                        DispatchOutcome::Rejected(Refusal::new(refusal_kind(&refusal), reason))
                    }
                    _ => DispatchOutcome::Rejected(Refusal::new(
                        RefusalKind::Unavailable,
                        garbled().to_string(),
                    )),
                };
                if let Some(reply) = reply {
                    let _ = reply.send(outcome);
                }
            }
            (ReplyTo::View(reply), Answer::View { view }) => drop(reply.send(Ok(*view))),
            (ReplyTo::Unit(reply), Answer::Done) => drop(reply.send(Ok(()))),
            (ReplyTo::Bool(reply), Answer::Swept { swept }) => drop(reply.send(Ok(swept))),
            (ReplyTo::Seq(reply), Answer::Loaded { seq }) => drop(reply.send(Ok(seq))),
            (ReplyTo::Value(reply), Answer::Result { value }) => drop(reply.send(Ok(value))),
            (reply, _) => reply.fail(garbled()),
        }
    }
}

pub(super) fn refusal_name(kind: RefusalKind) -> &'static str {
    match kind {
        RefusalKind::Invalid => "invalid",
        RefusalKind::Conflict => "conflict",
        RefusalKind::Unavailable => "unavailable",
        RefusalKind::NotFound => "notFound",
        RefusalKind::Forbidden => "forbidden",
    }
}

fn refusal_kind(name: &str) -> RefusalKind {
    match name {
        "invalid" => RefusalKind::Invalid,
        "conflict" => RefusalKind::Conflict,
        "notFound" => RefusalKind::NotFound,
        "forbidden" => RefusalKind::Forbidden,
        _ => RefusalKind::Unavailable,
    }
}

fn error_name(err: &EngineError) -> &'static str {
    match err {
        EngineError::NotFound(_) => "notFound",
        EngineError::AlreadyExists(_) => "alreadyExists",
        EngineError::Conflict(_) => "conflict",
        EngineError::InvalidParams(_) => "invalidParams",
        EngineError::ProviderNotFound(_) => "providerNotFound",
        EngineError::Forbidden(_) => "forbidden",
        EngineError::Unavailable(_) => "unavailable",
    }
}

fn error_of(name: &str, message: String) -> EngineError {
    match name {
        "notFound" => EngineError::NotFound(message),
        "alreadyExists" => EngineError::AlreadyExists(message),
        "conflict" => EngineError::Conflict(message),
        "invalidParams" => EngineError::InvalidParams(message),
        "providerNotFound" => EngineError::ProviderNotFound(message),
        "forbidden" => EngineError::Forbidden(message),
        _ => EngineError::Unavailable(message),
    }
}

pub(super) fn failed(err: EngineError) -> Answer {
    Answer::Failed {
        error: error_name(&err).to_owned(),
        message: err.to_string(),
    }
}
