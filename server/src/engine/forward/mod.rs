//! Writes for a session another host holds: what is forwarded (the wire
//! form of actor commands), the sending side (a session's proxy actor) and
//! the serving side (the holder runs forwarded commands through its actor).

use std::sync::Arc;
use std::time::{Duration, Instant};

use tether_protocol::model::SessionModel;
use tether_protocol::view::SessionView;
use tokio::sync::oneshot;

use super::command::{Command, Dispatch, DispatchOutcome};
use super::{Ctx, Engine, EngineError};
use crate::cluster::forward::Reclaimed;
use crate::cluster::{Cluster, Lease};
use crate::store::now_ms;

mod wire;

use wire::{Answer, ReplyTo, Request, failed, join, refusal_name, split};

/// How a proxy actor ended.
pub(super) enum ProxyEnd {
    /// Evicted idle, or its mailbox closed.
    Stopped,
    /// This host took the lease: it becomes the session's writer and runs
    /// `command` first. `from` is the host that held the lease before.
    TakeOver {
        command: Box<Command>,
        from: Option<String>,
    },
}

/// The actor of a session this host does not hold: reads are answered from
/// a copy folded from the store (the log is shared, so it is never behind
/// what this host has delivered); the first write takes the lease when it
/// is free, and is forwarded to the holder when it is not.
pub(super) async fn run_proxy(
    id: &str,
    ctx: &Arc<Ctx>,
    cluster: &Arc<Cluster>,
    mailbox: &mut super::mailbox::Receiver<Command>,
) -> ProxyEnd {
    let mut model: Option<SessionModel> = None;
    let mut holder: Option<String> = None;
    loop {
        let command = match tokio::time::timeout(ctx.config.actor_idle, mailbox.recv()).await {
            Ok(Some(command)) => command,
            Ok(None) => return ProxyEnd::Stopped,
            Err(_) if ctx.evict_if_idle(id, mailbox) => return ProxyEnd::Stopped,
            Err(_) => continue,
        };
        let (mut request, mut reply) = match split(command) {
            Ok(write) => write,
            Err(read) => {
                if let Err(err) = refresh(ctx, id, &mut model).await {
                    tracing::warn!(session = id, error = %err, "cannot read session");
                }
                answer_read(*read, model.as_ref());
                continue;
            }
        };
        loop {
            let Some(to) = holder.clone() else {
                match cluster.acquire(id).await {
                    Ok(Lease::Mine { from }) => {
                        return ProxyEnd::TakeOver {
                            command: Box::new(join(request, reply)),
                            from,
                        };
                    }
                    Ok(Lease::HeldBy(other)) => {
                        holder = Some(other);
                        continue;
                    }
                    Err(err) => {
                        reply.fail(EngineError::Unavailable(format!(
                            "Storage unavailable: {err}; retry."
                        )));
                        break;
                    }
                }
            };
            match forward_one(ctx, cluster, id, &to, request, reply).await {
                Sent::Answered => break,
                Sent::Moved {
                    to,
                    request: r,
                    reply: back,
                } => {
                    holder = to;
                    request = *r;
                    reply = back;
                }
            }
        }
    }
}

async fn refresh(ctx: &Ctx, id: &str, model: &mut Option<SessionModel>) -> Result<(), String> {
    let folded = match model.take() {
        None => super::rebuild::load_model(ctx.store.as_ref(), id, true).await?,
        Some(current) => super::rebuild::fold_tail(ctx.store.as_ref(), id, Some(current)).await?,
    };
    *model = folded.map(|mut m| {
        // The holder archives; a copy only keeps its windows bounded.
        m.take_trimmed();
        m
    });
    Ok(())
}

fn answer_read(read: Command, model: Option<&SessionModel>) {
    // The agent runs on the holder: the copy calls it attached while the
    // transcript says it was opened and not settled since.
    let view = |m: &SessionModel| {
        let live = m.projection.settled.is_none() && m.projection.acp_session_ref.is_some();
        SessionView::of(m, live, &super::rfc3339(now_ms()))
    };
    match read {
        Command::View { reply } => drop(reply.send(Ok(model.map(view)))),
        Command::Snapshot { channel, reply } => {
            let found = model.and_then(|m| super::actor::channel_state(m, &channel));
            drop(reply.send(Ok(found)));
        }
        Command::ClientGone { .. } => {}
        // A proxy runs no agent.
        Command::Shutdown { reply } => {
            let _ = reply.send(());
        }
        Command::CallTool { reply, .. } => {
            let _ = reply.send(Err("the session's agent runs on another host".to_owned()));
        }
        other => {
            if let Ok((_, reply)) = split(other) {
                reply.fail(EngineError::Unavailable("internal: not a read".into()));
            }
        }
    }
}

enum Sent {
    Answered,
    /// The holder let the lease go before claiming it: send it again, to
    /// `to` (`None`: nobody holds the lease now).
    Moved {
        to: Option<String>,
        request: Box<Request>,
        reply: ReplyTo,
    },
}

/// Longest a forwarded command waits for its holder once claimed.
fn answer_limit(ctx: &Ctx, cluster: &Cluster) -> Duration {
    cluster.ttl() + ctx.config.effect_timeout * 2 + Duration::from_secs(5)
}

async fn forward_one(
    ctx: &Ctx,
    cluster: &Cluster,
    id: &str,
    holder: &str,
    request: Request,
    reply: ReplyTo,
) -> Sent {
    let text = match serde_json::to_string(&request) {
        Ok(text) => text,
        Err(err) => {
            reply.fail(EngineError::Unavailable(err.to_string()));
            return Sent::Answered;
        }
    };
    let (row, mut answer) = match cluster.forward(&ctx.pending, id, holder, &text).await {
        Ok(sent) => sent,
        Err(err) => {
            reply.fail(EngineError::Unavailable(format!(
                "Storage unavailable: the request was not passed on; retry it. ({err})"
            )));
            return Sent::Answered;
        }
    };
    let started = Instant::now();
    let check = (cluster.ttl() / 4).min(Duration::from_millis(500));
    loop {
        if let Ok(Ok(text)) = tokio::time::timeout(check, &mut answer).await {
            match serde_json::from_str::<Answer>(&text) {
                Ok(decoded) => reply.deliver(decoded),
                Err(err) => reply.fail(EngineError::Unavailable(format!(
                    "the session's host answered garbage: {err}"
                ))),
            }
            return Sent::Answered;
        }
        // Nobody waits for the answer any more (the client gave up, and
        // retries with the same clientSeq if it cares): the session's
        // later writes from this host must not queue behind it.
        if reply.abandoned() {
            cluster.abandon(&ctx.pending, row).await;
            return Sent::Answered;
        }
        if started.elapsed() > answer_limit(ctx, cluster) {
            cluster.abandon(&ctx.pending, row).await;
            reply.fail(EngineError::Unavailable(format!(
                "The host serving session {id} did not answer in time; retry (a retry with the \
                 same clientSeq applies at most once)."
            )));
            return Sent::Answered;
        }
        // Still held by the host we sent it to: keep waiting.
        let now = match cluster.holder(id).await {
            Ok(now) => now,
            Err(_) => continue,
        };
        if now.as_deref() == Some(holder) {
            continue;
        }
        match cluster.withdraw(&ctx.pending, row).await {
            Ok(true) => {
                return Sent::Moved {
                    to: now.filter(|other| other != cluster.host()),
                    request: Box::new(request),
                    reply,
                };
            }
            // Claimed already, and the lease is no longer the holder's. A
            // holder that is still live (it released the lease: a dispose,
            // an eviction) answers what it claimed: wait. One that left or
            // stopped renewing (dead, or cut off from the database) may
            // never answer; waiting would hold every write of the session
            // behind it. Its answer, if it wrote one, is taken; otherwise
            // the request is withdrawn (the holder's answer then goes
            // nowhere). An action with an origin is sent on: the new
            // holder applies it once (it finds it in the log if the old
            // holder committed it; and once the new holder takes the lease
            // the old one cannot commit). Anything else is in doubt: said
            // at once.
            Ok(false) if matches!(cluster.host_alive(holder).await, Ok(false)) => {
                match cluster.reclaim(&ctx.pending, row).await {
                    Ok(Reclaimed::Answered(text)) => {
                        match serde_json::from_str::<Answer>(&text) {
                            Ok(decoded) => reply.deliver(decoded),
                            Err(err) => reply.fail(EngineError::Unavailable(format!(
                                "the session's host answered garbage: {err}"
                            ))),
                        }
                        return Sent::Answered;
                    }
                    Ok(Reclaimed::Withdrawn)
                        if matches!(
                            &request,
                            Request::Dispatch {
                                origin: Some(_),
                                ..
                            }
                        ) =>
                    {
                        return Sent::Moved {
                            to: now.filter(|other| other != cluster.host()),
                            request: Box::new(request),
                            reply,
                        };
                    }
                    Ok(Reclaimed::Withdrawn) => {
                        reply.fail(EngineError::Unavailable(format!(
                            "The host serving session {id} went away before answering; the \
                             request may or may not have been applied: read the session \
                             before retrying."
                        )));
                        return Sent::Answered;
                    }
                    Ok(Reclaimed::Arriving) | Err(_) => continue,
                }
            }
            // The answer is on its way.
            Ok(false) | Err(_) => continue,
        }
    }
}

/// What this host id claimed and never answered: at start, what a previous
/// process left (it was stopped or killed with them in hand; its senders
/// see this host id alive again and wait); at leave, what this one will
/// not finish. An action with an origin is put back, to run once wherever
/// it is claimed next (the log has it if it was committed); anything else
/// is answered as in doubt.
pub(super) async fn recover_claimed(cluster: &Cluster) {
    let stale = match cluster.claimed_unanswered().await {
        Ok(stale) => stale,
        Err(err) => {
            tracing::warn!(error = %err, "cannot look for forwarded requests left unanswered");
            return;
        }
    };
    for (row, request) in stale {
        let retried = matches!(
            serde_json::from_str::<Request>(&request),
            Ok(Request::Dispatch {
                origin: Some(_),
                ..
            })
        );
        let recovered = if retried {
            cluster.unclaim(row).await
        } else {
            let answer = failed(EngineError::Unavailable(
                "The session's host stopped before answering; the request may or may not \
                 have been applied: read the session before retrying."
                    .into(),
            ));
            let text = serde_json::to_string(&answer).unwrap_or_default();
            cluster.answer(row, &text).await
        };
        if let Err(err) = recovered {
            tracing::warn!(error = %err, "a forwarded request left unanswered stays so; its sender times out");
        }
    }
}

/// Writes the answer to a claimed request, again and again while the
/// store is unreachable: its sender waits for it (holding its session's
/// later writes from that host behind it) and cannot tell an answer that
/// was never written from one that is slow. Given up after
/// [`ANSWER_RETRIES`]; the sender's own limit then answers its client.
async fn deliver_answer(cluster: &Cluster, row: i64, session: &str, text: &str) {
    let mut pause = Duration::from_millis(100);
    for attempt in 1..=ANSWER_RETRIES {
        match cluster.answer(row, text).await {
            Ok(()) => {
                if attempt > 1 {
                    tracing::info!(session, attempt, "forwarded answer written after all");
                }
                return;
            }
            Err(err) if attempt == ANSWER_RETRIES => {
                tracing::warn!(session, error = %err, "forwarded answer lost; the sender times out and its client retries");
            }
            Err(err) => {
                tracing::debug!(session, attempt, error = %err, "forwarded answer not written yet; retrying");
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(Duration::from_secs(1));
            }
        }
    }
}

/// How often the answer to a forwarded request is tried (about 30 s when
/// each attempt fails at once, longer when each waits for a connection).
const ANSWER_RETRIES: u32 = 32;

/// Serves forwarded commands for the sessions this host holds.
pub(super) fn start_server(engine: Engine, cluster: Arc<Cluster>) -> tokio::task::JoinHandle<()> {
    let stop = cluster.stop.clone();
    tokio::spawn(async move {
        if stop
            .run_until_cancelled(recover_claimed(&cluster))
            .await
            .is_none()
        {
            return;
        }
        let mut swept = Instant::now();
        loop {
            // Stops between claims, never inside one: a claim sent is a
            // claim read and run, so a host that is leaving has claimed
            // nothing its hand-back (`Engine::leave`) does not see.
            tokio::select! {
                () = stop.cancelled() => return,
                _ = tokio::time::timeout(Duration::from_secs(1), cluster.wake.forward.notified()) => {}
            }
            match cluster.claim().await {
                Ok(claimed) => {
                    for (row, session, request) in claimed {
                        let engine = engine.clone();
                        let cluster = cluster.clone();
                        tokio::spawn(async move {
                            let answer = match serde_json::from_str::<Request>(&request) {
                                Ok(request) => engine.run_forwarded(&session, request).await,
                                Err(err) => failed(EngineError::InvalidParams(format!(
                                    "unreadable forwarded request: {err}"
                                ))),
                            };
                            let text = serde_json::to_string(&answer).unwrap_or_default();
                            deliver_answer(&cluster, row, &session, &text).await;
                        });
                    }
                }
                Err(err) => {
                    tracing::warn!(error = %err, "cannot claim forwarded requests; retrying");
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
            }
            if swept.elapsed() > Duration::from_secs(60) {
                stop.run_until_cancelled(cluster.sweep_forwards(Duration::from_secs(600)))
                    .await;
                swept = Instant::now();
            }
        }
    })
}

impl Engine {
    /// Runs a forwarded command through the session's actor here.
    async fn run_forwarded(&self, session: &str, request: Request) -> Answer {
        match request {
            Request::Dispatch {
                origin,
                channel,
                action,
                principal,
            } => {
                let (reply, answer) = oneshot::channel();
                let dispatch = Dispatch {
                    origin,
                    channel,
                    action,
                    principal,
                    reply: Some(reply),
                    directed: None,
                };
                self.send(session, Command::Dispatch(Box::new(dispatch)))
                    .await;
                match answer.await {
                    Ok(DispatchOutcome::Accepted(published)) => Answer::Accepted {
                        seq: published.seq,
                        channel: published.channel.clone(),
                        frame: published.frame.to_string(),
                    },
                    Ok(DispatchOutcome::Rejected(refusal)) => Answer::Rejected {
                        refusal: refusal_name(refusal.kind).to_owned(),
                        reason: refusal.reason,
                    },
                    Err(_) => failed(EngineError::Unavailable(
                        "the session stopped unexpectedly; retry".into(),
                    )),
                }
            }
            Request::Create { created, owner } => {
                let asked = self.ask(session, |reply| Command::Create {
                    created,
                    owner,
                    reply,
                });
                viewed(asked.await)
            }
            Request::Dispose => viewed(self.ask(session, |reply| Command::Dispose { reply }).await),
            Request::Resume { cwd, additional } => {
                let asked = self.ask(session, |reply| Command::Resume {
                    cwd,
                    additional,
                    reply,
                });
                viewed(asked.await)
            }
            Request::CreateChat { chat, fork } => {
                match self
                    .ask(session, |reply| Command::CreateChat { chat, fork, reply })
                    .await
                {
                    Ok(()) => Answer::Done,
                    Err(err) => failed(err),
                }
            }
            Request::Sweep => match self.ask(session, |reply| Command::Sweep { reply }).await {
                Ok(swept) => Answer::Swept { swept },
                Err(err) => failed(err),
            },
            Request::FetchTurns { chat, cursor } => {
                match self
                    .ask(session, |reply| Command::FetchTurns {
                        chat,
                        cursor,
                        reply,
                    })
                    .await
                {
                    Ok(seq) => Answer::Loaded { seq },
                    Err(err) => failed(err),
                }
            }
            Request::Operate { operation } => {
                match self
                    .ask(session, |reply| Command::Operate {
                        operation: Box::new(operation),
                        reply,
                    })
                    .await
                {
                    Ok(value) => Answer::Result { value },
                    Err(err) => failed(err),
                }
            }
        }
    }
}

fn viewed(result: Result<SessionView, EngineError>) -> Answer {
    match result {
        Ok(view) => Answer::View {
            view: Box::new(view),
        },
        Err(err) => failed(err),
    }
}
