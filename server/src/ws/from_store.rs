//! What a connection sends from the store: the envelopes between a new
//! subscription's snapshot and its route (unless the hub knows its channel
//! had none), and everything its subscriptions lack after its inbox lagged.

use std::collections::HashSet;

use super::CATCH_UP_PAGE;
use super::connection::{Connection, Next, hidden_from};
use crate::engine::fanout::{
    action_frame, creates_session, ended_by_creation, with_their_sessions,
};

impl Connection {
    /// After the inbox dropped items: delivers, from the store, every
    /// envelope of the subscribed channels their subscriptions do not have,
    /// up to what the store holds now.
    pub(super) async fn catch_up_all(&mut self) -> Next {
        tracing::debug!("connection lagged behind the hub; catching up from the store");
        self.engine.metrics().catch_ups.inc();
        let Ok(host) = self.engine.store().host().await else {
            return Next::Close(1011, "storage unavailable; reconnect".into());
        };
        let channels: Vec<String> = self.subscriptions.keys().cloned().collect();
        let from = self
            .subscriptions
            .values()
            .map(|s| s.after)
            .min()
            .unwrap_or(host.last_seq);
        self.deliver_from_store(&channels, from, host.last_seq)
            .await
    }

    /// Ends the subscription of `channel` if its snapshot is older than
    /// seq `before` (a session deleted since; see [`HubItem::Gone`]).
    pub(super) fn end_subscription(&mut self, channel: &str, before: u64) {
        if self
            .subscriptions
            .get(channel)
            .is_some_and(|have| have.from < before)
        {
            self.subscriptions.remove(channel);
            self.routing.unroute(channel);
        }
    }

    /// Sends stored envelopes of `channels` in `(after, upto]` that their
    /// subscriptions do not have yet.
    pub(super) async fn deliver_from_store(
        &mut self,
        channels: &[String],
        after: u64,
        upto: u64,
    ) -> Next {
        let mut after = after;
        // A default chat's session channel too: its session made again says
        // so there. Those channels are read for that alone: what else they
        // hold is not sent (a subscription of one has it from its own
        // bridge and inbox; sent here too, it would arrive twice).
        let read = with_their_sessions(channels);
        let only_read: HashSet<&str> = read[channels.len()..].iter().map(String::as_str).collect();
        while after < upto && !channels.is_empty() {
            let page = match self
                .engine
                .store()
                .read_after(after, Some(&read), CATCH_UP_PAGE)
                .await
            {
                Ok(page) => page,
                Err(_) => return Next::Close(1011, "storage unavailable; reconnect".into()),
            };
            let Some(last) = page.last() else { break };
            after = last.seq;
            for envelope in page.iter().filter(|e| e.seq <= upto) {
                if creates_session(&envelope.channel, &envelope.action) {
                    // The session was deleted and made again since this
                    // subscription's snapshot: it ends (the hub says so
                    // too, unless this host had not heard of it yet).
                    for channel in ended_by_creation(&envelope.channel) {
                        self.end_subscription(&channel, envelope.seq);
                    }
                }
                if only_read.contains(envelope.channel.as_str()) {
                    continue;
                }
                let wanted = self
                    .subscriptions
                    .get_mut(&envelope.channel)
                    .is_some_and(|have| {
                        have.last_read = have.last_read.max(envelope.seq);
                        envelope.seq > have.after
                    });
                if wanted && !hidden_from(&self.principal, &envelope.channel, &envelope.action) {
                    let frame = action_frame(
                        envelope.seq,
                        &envelope.channel,
                        &envelope.action,
                        envelope.origin.as_ref(),
                        None,
                    );
                    if !self.queue.push(frame.into()) {
                        return self.overflow();
                    }
                }
            }
            // Paced by the client: a page that leaves the queue over its
            // limit is written before the next is read; otherwise what the
            // socket takes goes out now.
            if self.queue.over_limit() {
                if !self.queue.drain_to_limit(&mut self.socket).await {
                    return self.overflow();
                }
            } else if self.write_what_fits().await.is_err() {
                return Next::Close(1011, "the socket failed during catch-up".into());
            }
        }
        for channel in channels {
            if let Some(have) = self.subscriptions.get_mut(channel) {
                have.after = have.after.max(upto);
            }
        }
        Next::Continue
    }

    /// Sends, from the store, what subscriptions opened by the last request
    /// need between their snapshot and the hub seq they were routed at:
    /// envelopes published before the route existed.
    pub(super) async fn bridge(&mut self) -> Next {
        for channel in std::mem::take(&mut self.after_reply) {
            let Some((after, routed_at)) = self
                .subscriptions
                .get(&channel)
                .map(|s| (s.after, s.routed_at))
            else {
                continue;
            };
            if after >= routed_at {
                continue;
            }
            let kind =
                tether_protocol::channel::Channel::parse(&channel).map_or("other", |c| c.kind());
            self.engine
                .metrics()
                .bridge_reads
                .get_or_create(&[("kind", kind)])
                .inc();
            let channels = [channel];
            if let Next::Close(code, reason) =
                self.deliver_from_store(&channels, after, routed_at).await
            {
                return Next::Close(code, reason);
            }
            // Still subscribed (a creation of its session read on the way
            // would have ended it): the hub learns the channel's last seq up
            // to the route, so later subscriptions at it need not read.
            let [channel] = channels;
            if let Some(have) = self.subscriptions.get(&channel) {
                let last_read = have.last_read;
                self.routing.learn(&channel, routed_at, last_read);
            }
        }
        Next::Continue
    }
}
