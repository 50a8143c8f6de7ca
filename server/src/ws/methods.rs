//! The AHP methods a connection answers.

use ahp_types::errors::ahp_error_codes;
use serde_json::{Value, json};
use tether_protocol::channel::Channel;
use tether_protocol::view::SessionView;

use super::CATCH_UP_PAGE;
use super::connection::{Answered, Connection, Next, Reply, Subscription, hidden_from};
use super::frame::Dispatched;
use super::rpc::{
    RpcError, channel_param, client_id_param, session_param, strings_param, u64_param,
};
use crate::engine::fanout::{action_frame, write_envelope};
use crate::engine::{CreateSession, DispatchOutcome, EngineError, RefusalKind, summary};
use crate::store::MAX_READ_LIMIT;
use crate::store::{Origin, SessionFilter};

/// The `_meta` key of `initialize` and `reconnect` with which a client asks
/// for durable origins: `{"tether/durableOrigins": true}`. Such a client
/// never reuses a `(clientId, clientSeq)` across connections, hosts or
/// restarts, and a resent dispatch gets its original outcome. Without it a
/// connection is a scope of its own, as AHP clients number `clientSeq` per
/// connection (the reference client starts again from 1 on each).
pub const ORIGINS_META: &str = "tether/durableOrigins";

/// JSON-RPC error code (in the range JSON-RPC leaves to servers) for a
/// request over its principal's rate; `data.retryAfterMs` says when to retry.
pub const TOO_MANY_REQUESTS: i32 = -32050;

impl Connection {
    /// Takes the client id and the origin scope of `initialize` or
    /// `reconnect`.
    fn start_scope(&mut self, client_id: String, params: &Value) {
        let durable = params
            .pointer("/_meta")
            .and_then(|meta| meta.get(ORIGINS_META))
            .and_then(Value::as_bool)
            .unwrap_or(false);
        self.origin_scope = if durable {
            self.principal.durable_scope()
        } else {
            self.connection_scope.clone()
        };
        if self.client_id.as_deref() != Some(client_id.as_str()) {
            if let Some(previous) = self.client_id.take() {
                self.engine.client_disconnected(&previous);
            }
            self.engine.client_connected(&client_id);
        }
        self.client_id = Some(client_id);
    }

    pub(super) async fn initialize(&mut self, params: Value) -> Result<Value, RpcError> {
        let offered = strings_param(&params, "protocolVersions", "an array of strings")?;
        let client_id = client_id_param(&params)?;
        let version = match ahp_types::negotiate_protocol_version(&offered) {
            Ok(Some(version)) => version.to_owned(),
            Ok(None) => {
                return Err(RpcError {
                    code: ahp_error_codes::UNSUPPORTED_PROTOCOL_VERSION,
                    message: format!(
                        "None of the offered protocol versions {offered:?} is supported."
                    ),
                    data: Some(
                        json!({"supportedVersions": ahp_types::SUPPORTED_PROTOCOL_VERSIONS}),
                    ),
                });
            }
            Err(err) => return Err(RpcError::invalid(&format!("Bad protocol version: {err}."))),
        };
        self.start_scope(client_id, &params);
        let server_seq = self.engine.hub().published();
        let mut snapshots = Vec::new();
        let initial: Vec<String> = params
            .get("initialSubscriptions")
            .cloned()
            .and_then(|v| serde_json::from_value(v).ok())
            .unwrap_or_default();
        for channel in initial {
            // A channel that is gone is left out, not an error: clients
            // (the reference one among them) keep their initial list and
            // would otherwise never get past `initialize`.
            if Channel::parse(&channel).is_err() {
                continue;
            }
            match self.open_subscription(&channel).await {
                Ok(snapshot) => snapshots.push(snapshot),
                Err(err) if err.code == ahp_error_codes::SESSION_NOT_FOUND => {}
                Err(err) => return Err(err),
            }
        }
        let host = self
            .engine
            .store()
            .host()
            .await
            .map_err(RpcError::unavailable)?;
        Ok(json!({
            "protocolVersion": version,
            "serverSeq": server_seq,
            "serverInfo": {"name": "tether", "version": env!("CARGO_PKG_VERSION")},
            "completionTriggerCharacters": [super::completions::COMMAND_TRIGGER],
            "snapshots": snapshots,
            "_meta": {"tether/hostEpoch": host.epoch.to_string()},
        }))
    }

    /// Takes a channel's snapshot and registers the subscription; the gap
    /// up to the cursor is bridged after the reply.
    async fn open_subscription(&mut self, channel: &str) -> Result<Value, RpcError> {
        if !self.subscriptions.contains_key(channel)
            && self.subscriptions.len() >= self.limits.max_subscriptions
        {
            return Err(RpcError::invalid(&format!(
                "This connection already has {} subscriptions, the limit; unsubscribe from one first.",
                self.limits.max_subscriptions
            )));
        }
        let snapshot = self
            .engine
            .snapshot(&self.principal, channel)
            .await
            .map_err(RpcError::from)?;
        // Routed after the snapshot succeeded: envelopes published between
        // the two arrive in the inbox and are skipped as covered; those
        // from the snapshot up to the route are read after the reply,
        // unless the hub knows the channel had none.
        let routed_at = self.routing.route_after(channel, snapshot.from_seq);
        self.subscriptions.insert(
            channel.to_owned(),
            Subscription::new(channel, snapshot.from_seq, routed_at, self.engine.metrics()),
        );
        self.after_reply.push(channel.to_owned());
        Ok(
            json!({"resource": snapshot.resource, "state": snapshot.state, "fromSeq": snapshot.from_seq}),
        )
    }

    pub(super) async fn subscribe(&mut self, params: Value) -> Result<Value, RpcError> {
        let channel = channel_param(&params)?;
        let snapshot = self.open_subscription(&channel).await?;
        Ok(json!({"snapshot": snapshot}))
    }

    pub(super) async fn reconnect(
        &mut self,
        params: Value,
        id: Option<&Value>,
    ) -> Result<Reply, RpcError> {
        let client_id = client_id_param(&params)?;
        let last_seen = u64_param(&params, "lastSeenServerSeq")?;
        let wanted = strings_param(&params, "subscriptions", "an array of channel URIs")?;
        if wanted.len() > self.limits.max_subscriptions {
            return Err(RpcError::invalid(&format!(
                "At most {} subscriptions per connection.",
                self.limits.max_subscriptions
            )));
        }
        self.start_scope(client_id, &params);
        let mut present = Vec::new();
        let mut missing = Vec::new();
        for channel in wanted {
            if self.engine.visible(&self.principal, &channel).await {
                present.push(channel);
            } else {
                missing.push(channel);
            }
        }
        // Routed first, then the store is read: everything up to `horizon`
        // comes from the store, the inbox brings what is above it (a seq is
        // published only after it is committed, so `horizon` is at least
        // every route's seq).
        let routed: Vec<(String, u64)> = present
            .iter()
            .map(|channel| (channel.clone(), self.routing.route(channel)))
            .collect();
        let host = self
            .engine
            .store()
            .host()
            .await
            .map_err(RpcError::unavailable)?;
        let horizon = host.last_seq;
        let limit = self.limits.max_replay;
        // The response frame is written into one buffer as the pages come:
        // the envelopes straight after its head, never a list joined later
        // or a result copied into its frame.
        let mut reply = String::new();
        if let Some(id) = id {
            reply.push_str(r#"{"jsonrpc":"2.0","id":"#);
            reply.push_str(&id.to_string());
            reply.push_str(r#","result":"#);
        }
        reply.push_str(r#"{"type":"replay","actions":["#);
        let head = reply.len();
        let mut count = 0usize;
        let mut after = last_seen;
        // A client that saw seqs this database never issued (it was
        // restored from a backup, or a Postgres failover lost commits the
        // old primary had acknowledged) has nothing to replay from: the
        // seqs above `horizon` will be issued again, to other envelopes.
        // It starts over from snapshots, as after too large a gap.
        let mut too_many = last_seen > horizon;
        let mut rows = CATCH_UP_PAGE.min(limit.saturating_add(1));
        let most = self.engine.store().replay_page_rows();
        while after < horizon && !present.is_empty() {
            let page = self
                .engine
                .store()
                .read_after_within(
                    after,
                    Some(&present),
                    rows,
                    self.limits
                        .max_replay_bytes
                        .saturating_sub(reply.len() - head),
                )
                .await
                .map_err(RpcError::unavailable)?;
            let Some(last) = page.last() else { break };
            after = last.seq;
            for envelope in page
                .iter()
                .filter(|e| e.seq <= horizon)
                .filter(|e| !hidden_from(&self.principal, &e.channel, &e.action))
            {
                if count > 0 {
                    reply.push(',');
                }
                write_envelope(
                    &mut reply,
                    envelope.seq,
                    &envelope.channel,
                    &envelope.action,
                    envelope.origin.as_ref(),
                    None,
                );
                count += 1;
            }
            if count > limit as usize || reply.len() - head > self.limits.max_replay_bytes {
                too_many = true;
                break;
            }
            rows = next_replay_page(rows, most, limit as usize - count);
        }
        if too_many {
            let mut snapshots = Vec::new();
            for channel in &present {
                snapshots.push(self.open_subscription(channel).await?);
            }
            return Ok(Reply::Json(
                json!({"type": "snapshot", "snapshots": snapshots}),
            ));
        }
        for (channel, routed_at) in routed {
            let subscription =
                Subscription::new(&channel, horizon, routed_at, self.engine.metrics());
            self.subscriptions.insert(channel, subscription);
        }
        // Rendered as text around the stored actions: a large replay is
        // never parsed into a value tree and serialised again.
        reply.push_str(r#"],"missing":"#);
        reply.push_str(&serde_json::to_string(&missing).unwrap_or_else(|_| "[]".into()));
        reply.push('}');
        if id.is_some() {
            reply.push('}');
        }
        Ok(Reply::Frame(reply))
    }

    /// Submits a dispatch in order and returns at once; its outcome comes
    /// back through `answers` (see [`Connection::on_answer`]), so a client's
    /// dispatches are pipelined instead of one commit per round trip.
    pub(super) async fn dispatch(
        &mut self,
        dispatched: Dispatched,
        id: Option<Value>,
    ) -> Result<(), RpcError> {
        let Dispatched {
            channel,
            client_seq,
            action,
            action_text,
        } = dispatched;
        let origin = Origin {
            client_id: self.client_id.clone().unwrap_or_default(),
            client_seq,
            scope: self.origin_scope.clone(),
        };
        if let Err(over) = self.charge() {
            match id {
                Some(_) => return Err(over),
                // A notification has no answer but its echo: refused, not
                // recorded, so the same dispatch may pass later.
                None => {
                    self.echo_refusal(&channel, &action_text, &origin, &over.message);
                    return Ok(());
                }
            }
        }
        // Bounded: past MAX_INFLIGHT_DISPATCHES unanswered dispatches the
        // connection's loop stops reading until one is answered.
        let submitted = self
            .engine
            .submit(&self.principal, Some(origin.clone()), &channel, action)
            .await;
        let routed_at = self.subscriptions.get(&channel).map(|s| s.routed_at);
        self.pending.push(Box::pin(async move {
            let outcome = submitted.outcome().await;
            Answered {
                channel,
                action_text,
                origin,
                routed_at,
                outcome,
                id,
            }
        }));
        Ok(())
    }

    /// Sends a refused dispatch back to its sender alone: the AHP echo with
    /// `rejectionReason`.
    fn echo_refusal(
        &mut self,
        channel: &str,
        action_text: &str,
        origin: &Origin,
        reason: &str,
    ) -> Next {
        let frame = action_frame(
            self.engine.hub().published(),
            channel,
            action_text,
            Some(origin),
            Some(reason),
        );
        self.send(frame)
    }

    /// Delivers a dispatch's outcome to its sender.
    pub(super) fn on_answer(&mut self, answered: Answered) -> Next {
        let next = match answered.outcome {
            DispatchOutcome::Accepted(published) => {
                // A subscriber gets its echo through its subscription, in
                // seq order: an envelope above the subscription's snapshot
                // (subscribed since the dispatch, too), unless the dispatch
                // was a retry of one the hub had published before it. A
                // retry of an old envelope, an envelope inside the snapshot,
                // or a client not subscribed to the channel, gets it
                // directly.
                let via_hub = self.subscriptions.get(&published.channel).is_some_and(|s| {
                    match answered.routed_at {
                        Some(at) => published.seq > at,
                        None => published.seq > s.from,
                    }
                });
                if via_hub || self.queue.push(published.frame.clone()) {
                    Next::Continue
                } else {
                    self.overflow()
                }
            }
            // AHP: a dispatch to a channel that does not exist is ignored
            // silently, with no echo. One sent as a request (not the
            // protocol's notification) still gets an answer: an error.
            DispatchOutcome::Rejected(refusal) if refusal.kind == RefusalKind::NotFound => {
                return match answered.id {
                    Some(id) => {
                        self.send_error(id, ahp_error_codes::NOT_FOUND, &refusal.reason, None)
                    }
                    None => Next::Continue,
                };
            }
            DispatchOutcome::Rejected(refusal) => self.echo_refusal(
                &answered.channel,
                &answered.action_text,
                &answered.origin,
                &refusal.reason,
            ),
        };
        match (next, answered.id) {
            (Next::Continue, Some(id)) => self.send_result(id, Value::Null),
            (next, _) => next,
        }
    }

    pub(super) async fn create_session(&mut self, params: Value) -> Result<Value, RpcError> {
        let id = session_param(&params)?;
        let text_list = |key: &str| -> Result<Vec<String>, RpcError> {
            match params.get(key) {
                None | Some(Value::Null) => Ok(Vec::new()),
                Some(value) => serde_json::from_value(value.clone()).map_err(|_| {
                    RpcError::invalid(&format!("params.{key} must be an array of URIs."))
                }),
            }
        };
        let request = CreateSession {
            id,
            project: params
                .pointer("/_meta/tether~1project")
                .and_then(Value::as_str)
                .unwrap_or("default")
                .to_owned(),
            provider: params
                .get("provider")
                .and_then(Value::as_str)
                .map(str::to_owned),
            working_directories: text_list("workingDirectories")?,
            title: None,
            config: match params.get("config") {
                None | Some(Value::Null) => None,
                Some(Value::Object(config)) => Some(config.clone()),
                Some(_) => {
                    return Err(RpcError::invalid(
                        "params.config must be an object of configuration values.",
                    ));
                }
            },
            active_client: params.get("activeClient").cloned().filter(|v| !v.is_null()),
        };
        if let Some(client) = &request.active_client {
            crate::engine::client_tools::check_creation(client, self.client_id.as_deref())
                .map_err(|e| RpcError::invalid(&e))?;
        }
        self.engine
            .create_session(&self.principal, request)
            .await
            .map_err(RpcError::from)?;
        Ok(Value::Null)
    }

    pub(super) async fn dispose_session(&mut self, params: Value) -> Result<Value, RpcError> {
        let id = session_param(&params)?;
        self.engine
            .dispose_session(&self.principal, &id)
            .await
            .map_err(RpcError::from)?;
        Ok(Value::Null)
    }

    pub(super) async fn list_sessions(&mut self, params: Value) -> Result<Value, RpcError> {
        let limit = params
            .get("limit")
            .and_then(Value::as_u64)
            .unwrap_or(100)
            .clamp(1, 1000);
        let before = match params.get("cursor").and_then(Value::as_str) {
            None => None,
            Some(cursor) => Some(cursor.parse::<u64>().map_err(|_| {
                RpcError::invalid("params.cursor is not a cursor this host issued.")
            })?),
        };
        let page = self
            .engine
            .store()
            .sessions(
                &SessionFilter {
                    projects: self.principal.project_scope(),
                    ..SessionFilter::default()
                },
                before,
                limit as u32,
            )
            .await
            .map_err(RpcError::unavailable)?;
        let items: Vec<Value> = page
            .items
            .iter()
            .filter_map(|row| {
                let mut view: SessionView = serde_json::from_str(&row.record.projection).ok()?;
                view.last_seq = row.last_seq;
                view.updated_at = crate::engine::rfc3339(row.updated_ms);
                Some(summary(&view))
            })
            .collect();
        let mut result = json!({"items": items});
        if let Some(next) = page.next_before {
            result["nextCursor"] = Value::String(next.to_string());
        }
        Ok(result)
    }

    pub(super) async fn create_chat(&mut self, params: Value) -> Result<Value, RpcError> {
        let session = session_param(&params)?;
        let chat = params
            .get("chat")
            .and_then(Value::as_str)
            .ok_or_else(|| RpcError::invalid("params.chat (the new chat's URI) is required."))?
            .to_owned();
        self.engine
            .create_chat(&self.principal, &session, &chat, params.get("source"))
            .await
            .map_err(RpcError::from)?;
        Ok(Value::Null)
    }

    /// `invokeChangesetOperation`: runs one of a changeset's operations
    /// (Tether offers `revert`); its effects come as `changeset/*` actions.
    pub(super) async fn invoke_changeset_operation(
        &mut self,
        params: Value,
    ) -> Result<Value, RpcError> {
        let channel = channel_param(&params)?;
        let operation = params
            .get("operationId")
            .and_then(Value::as_str)
            .ok_or_else(|| {
                RpcError::invalid("params.operationId (a changeset operation's id) is required.")
            })?;
        self.engine
            .invoke_changeset_operation(&self.principal, &channel, operation, params.get("target"))
            .await
            .map_err(RpcError::from)
    }

    /// Draws on the principal's dispatch rate: every dispatch, and every
    /// command that commits or makes what will (a session, a chat, a
    /// terminal, a load of turns), counts against it.
    pub(super) fn charge(&self) -> Result<(), RpcError> {
        self.principal_limits
            .dispatch(&self.principal.sub)
            .map_err(|wait| {
                let wait = wait.as_millis().max(1) as u64;
                RpcError {
                    code: TOO_MANY_REQUESTS,
                    message: format!("Over this principal's dispatch rate; retry in {wait} ms."),
                    data: Some(json!({"retryAfterMs": wait})),
                }
            })
    }

    /// `fetchTurns`: loads older turns of a chat into its window. The
    /// `chat/turnsLoaded` is committed, and delivered to this connection
    /// when it subscribes to the chat, before the (empty) result.
    pub(super) async fn fetch_turns(&mut self, params: Value) -> Result<Value, RpcError> {
        let chat = channel_param(&params)?;
        let cursor = match params.get("cursor") {
            None | Some(Value::Null) => None,
            Some(Value::String(cursor)) => Some(cursor.clone()),
            Some(_) => {
                return Err(RpcError::invalid(
                    "params.cursor must be a string: a chat's turnsNextCursor.",
                ));
            }
        };
        let loaded = self
            .engine
            .fetch_turns(&self.principal, &chat, cursor)
            .await
            .map_err(|err| match err {
                EngineError::NotFound(message) => {
                    RpcError::new(ahp_error_codes::NOT_FOUND, message)
                }
                other => RpcError::from(other),
            })?;
        let after = self.subscriptions.get(&chat).map(|s| s.after);
        if let (Some(seq), Some(after)) = (loaded, after)
            && seq > after
            && let Next::Close(..) = self
                .deliver_from_store(std::slice::from_ref(&chat), after, seq)
                .await
        {
            return Err(RpcError::unavailable(
                "the loaded turns could not be read back",
            ));
        }
        Ok(json!({}))
    }
}

/// How many envelopes a replay's next read takes: twice the last read, up
/// to `most` (the store's [`Store::replay_page_rows`]), and never more than
/// one past the `count_left` the reply may still hold (which tells it is
/// too long). Its bytes are bounded by the read itself
/// ([`Store::read_after_within`]).
///
/// [`Store::replay_page_rows`]: crate::store::Store::replay_page_rows
/// [`Store::read_after_within`]: crate::store::Store::read_after_within
fn next_replay_page(last: u32, most: u32, count_left: usize) -> u32 {
    let rows = (last as usize * 2).min(count_left.saturating_add(1));
    rows.clamp(1, most.clamp(1, MAX_READ_LIMIT) as usize) as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_replay_reads_larger_pages_but_never_past_its_count() {
        // Doubling, up to what the store reads best at once.
        let mut rows = CATCH_UP_PAGE;
        let mut sizes = Vec::new();
        for _ in 0..6 {
            rows = next_replay_page(rows, MAX_READ_LIMIT, 1_000_000);
            sizes.push(rows);
        }
        assert_eq!(
            sizes,
            [
                2_000,
                4_000,
                8_000,
                MAX_READ_LIMIT,
                MAX_READ_LIMIT,
                MAX_READ_LIMIT
            ]
        );
        assert_eq!(next_replay_page(1_000, 1_000, 1_000_000), 1_000);
        assert_eq!(next_replay_page(1_000, u32::MAX, 1_000_000), 2_000);
        // One past what the reply may still hold tells it is too many.
        assert_eq!(next_replay_page(8_000, MAX_READ_LIMIT, 300), 301);
        assert_eq!(next_replay_page(8_000, MAX_READ_LIMIT, 0), 1);
    }
}
