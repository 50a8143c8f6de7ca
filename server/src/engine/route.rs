//! One channel's route in the hub: the inboxes its envelopes go to, and
//! what the hub knows of the channel's last seq.
//!
//! A subscription takes its channel's snapshot at seq `S`, then is routed
//! when the hub has published up to `H`: envelopes above `H` arrive in its
//! inbox, and those of the channel in `(S, H]` must be read from the log.
//! The hub's seq moves with every channel's commits, so most subscriptions
//! have such a gap, and for a quiet channel the read finds nothing. The
//! route knows when it would: it keeps the highest seq published on the
//! channel since the route was made, and, once a subscription has read the
//! log up to some `H`, a bound on the channel's last seq up to that `H`.
//! Together they bound the channel's last seq now; a subscription whose
//! snapshot is at or above that bound has nothing to read.
//!
//! Everything here changes under the hub's lock, with the hub's published
//! seq: a route is made, a publish seen and a bound learnt in one order.
//!
//! What it trusts: that every envelope of the log at or below the hub's
//! published seq went through the hub. A seq the log holds that this host
//! never published (after a Postgres failover issued seqs again) is missed
//! by the live stream already; a subscription that skips its read misses
//! it too, where a read would have found it.

/// A channel's route: its inboxes (`T`), and what is known of its last seq.
#[derive(Debug)]
pub(super) struct ChannelRoute<T> {
    /// Where the channel's envelopes go.
    pub(super) inboxes: Vec<T>,
    /// The hub's published seq when the route was made: every publish of
    /// the channel above it is counted in `last_published`.
    made: u64,
    /// The highest seq published on the channel since the route was made
    /// (for a default chat, its session's creation too: a subscription of
    /// the chat must then read the log, where that creation ends it).
    last_published: u64,
    /// The channel's last seq up to a seq, as a log read found it.
    known: Option<Known>,
}

/// What a read of the log found: the channel had no envelope in
/// `(last, through]` (nor, for a default chat, a creation of its session).
#[derive(Debug, Clone, Copy)]
struct Known {
    through: u64,
    last: u64,
}

impl<T> ChannelRoute<T> {
    /// A route made when the hub had published up to `published`.
    pub(super) fn new(published: u64) -> Self {
        Self {
            inboxes: Vec::new(),
            made: published,
            last_published: 0,
            known: None,
        }
    }

    /// An envelope of the channel (or its session's creation) was
    /// published at `seq`.
    pub(super) fn saw(&mut self, seq: u64) {
        self.last_published = self.last_published.max(seq);
    }

    /// Whether the channel has no envelope above `after` up to the hub's
    /// published seq: a read of the log above `after` would find nothing.
    pub(super) fn quiet_after(&self, after: u64) -> bool {
        self.known
            .is_some_and(|known| known.last.max(self.last_published) <= after)
    }

    /// A read of the log up to `through` found the channel's last seq at
    /// or below `last`. Kept only when the route was made by then (the
    /// publishes since are all in `last_published`), and when newer than what is
    /// known.
    pub(super) fn learn(&mut self, through: u64, last: u64) {
        // A subscription learns while its inbox is on this route, so its
        // read reaches past `made`: the first test is a safeguard.
        if through < self.made || self.known.is_some_and(|known| known.through >= through) {
            return;
        }
        self.known = Some(Known {
            through,
            // Never above `through`: what is above it is counted in
            // `last_published`.
            last: last.min(through),
        });
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::engine::fanout::{Hub, Published, Wakes, ended_by_creation};

    fn publish(hub: &Hub, seq: u64, channel: &str, creates: bool) {
        hub.publish(
            Arc::new(Published {
                seq,
                channel: channel.into(),
                frame: format!("frame {seq}").into(),
                directed: None,
                committed: std::time::Instant::now(),
                creates,
            }),
            &mut Wakes::default(),
        );
    }

    /// Through the hub: a subscription reads from its snapshot to its route
    /// until one has read and found the channel quiet; a publish of the
    /// channel, or a creation of a default chat's session, makes the next
    /// read again; and a route given up by all forgets.
    #[test]
    fn the_hub_says_when_a_subscription_has_nothing_to_read() {
        const A: &str = "ahp-session:/a";
        let hub = Arc::new(Hub::new(16, 0));
        publish(&hub, 1, A, true);
        publish(&hub, 2, "ahp-session:/b", true);
        let (mut first, _inbox) = hub.subscribe();
        assert_eq!(first.route_after(A, 1), 2, "nothing known: read (1, 2]");
        first.learn(A, 2, 1);
        let (mut second, _inbox2) = hub.subscribe();
        assert_eq!(second.route_after(A, 1), 1, "known quiet: nothing to read");
        publish(&hub, 3, "ahp-session:/b", false);
        let (mut third, _inbox3) = hub.subscribe();
        assert_eq!(third.route_after(A, 1), 1, "another channel's commit");
        publish(&hub, 4, A, false);
        let (mut fourth, _inbox4) = hub.subscribe();
        assert_eq!(fourth.route_after(A, 1), 4, "A has 4: read (1, 4]");
        publish(&hub, 5, "ahp-session:/b", false);
        let (mut fifth, _inbox5) = hub.subscribe();
        assert_eq!(
            fifth.route_after(A, 4),
            4,
            "a snapshot at 4 has it all, the hub at 5"
        );
        assert_eq!(fifth.route_after(A, 9), 5, "a snapshot ahead of the hub");

        // A default chat is read when its session is made again.
        let [_, chat] = ended_by_creation(A);
        assert_eq!(fifth.route_after(&chat, 1), 5);
        fifth.learn(&chat, 5, 1);
        let (mut sixth, _inbox6) = hub.subscribe();
        assert_eq!(sixth.route_after(&chat, 1), 1);
        publish(&hub, 6, A, true);
        assert_eq!(
            sixth.route_after(&chat, 1),
            6,
            "its session was made again at 6"
        );

        // Given up by every subscriber, the route forgets what it knew.
        drop((first, second, third, fourth, fifth, sixth));
        let (mut again, _inbox7) = hub.subscribe();
        assert_eq!(again.route_after(A, 6), 6);
        publish(&hub, 7, "ahp-session:/b", false);
        assert_eq!(
            again.route_after(A, 6),
            7,
            "nothing known after the routes went"
        );

        // A connection that has left a channel teaches its route nothing.
        const C: &str = "ahp-session:/c";
        publish(&hub, 8, C, true);
        let (mut holder, _inbox8) = hub.subscribe();
        assert_eq!(holder.route_after(C, 8), 8);
        let (mut gone, _inbox9) = hub.subscribe();
        gone.route_after(C, 8);
        gone.unroute(C);
        gone.learn(C, 8, 8);
        publish(&hub, 9, "ahp-session:/b", false);
        assert_eq!(holder.route_after(C, 8), 9, "not from one that left");
        holder.learn(C, 9, 8);
        assert_eq!(holder.route_after(C, 8), 8);
    }

    #[test]
    fn nothing_is_quiet_until_a_read_says_so() {
        let mut route = ChannelRoute::<()>::new(10);
        assert!(!route.quiet_after(10), "no read yet: unknown");
        // A subscription at 4, routed at 12, read (4, 12]: the channel's
        // last is 7.
        route.learn(12, 7);
        assert!(route.quiet_after(7));
        assert!(route.quiet_after(9));
        assert!(!route.quiet_after(6), "7 is above 6");
    }

    #[test]
    fn a_publish_of_the_channel_ends_the_quiet_below_it() {
        let mut route = ChannelRoute::<()>::new(10);
        route.learn(12, 7);
        route.saw(15);
        assert!(!route.quiet_after(7));
        assert!(route.quiet_after(15));
    }

    #[test]
    fn a_read_from_before_the_route_was_made_teaches_nothing() {
        // Made at 20: a read up to 12 leaves (12, 20] unknown.
        let mut route = ChannelRoute::<()>::new(20);
        route.learn(12, 7);
        assert!(!route.quiet_after(19));
        route.learn(25, 7);
        assert!(route.quiet_after(7));
    }

    #[test]
    fn the_newer_read_is_kept_and_its_bound_never_passes_it() {
        let mut route = ChannelRoute::<()>::new(0);
        route.learn(30, 30);
        assert!(!route.quiet_after(29));
        route.learn(20, 5);
        assert!(!route.quiet_after(5), "an older read is not taken");
        route.learn(40, 99);
        assert!(route.quiet_after(40), "a bound above its read is cut to it");
    }
}
