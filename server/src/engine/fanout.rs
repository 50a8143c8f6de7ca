//! The hub every committed envelope passes through on its way to the
//! connections, in `serverSeq` order.
//!
//! Each envelope is serialised once, into the exact text frame every
//! subscriber receives; connections never re-encode. The hub routes by
//! channel: a connection's inbox receives only the channels it has routed,
//! so the work of a publish is proportional to the subscribers of that
//! channel, not to every connection of the host.
//!
//! An inbox is bounded. When it is full the envelope is not queued and the
//! inbox is marked lagged (and woken); its connection then catches up from
//! the store, which holds everything the hub ever carried (commit happens
//! before publish).

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, Waker};

use axum::extract::ws::Utf8Bytes;

pub use super::frames::{
    action_frame, envelope_json, envelope_text, published_from_store, write_envelope,
};
use super::mailbox::Waiting;
use super::route::ChannelRoute;

/// One committed envelope, ready to send.
#[derive(Debug)]
pub struct Published {
    /// Its `serverSeq`.
    pub seq: u64,
    /// Its channel URI.
    pub channel: String,
    /// The whole JSON-RPC `action` notification.
    pub frame: Utf8Bytes,
    /// The notification one client receives instead (`Directed`), if any.
    pub directed: Option<DirectedFrame>,
    /// When this host learnt it was committed (for the delivery latency).
    pub committed: std::time::Instant,
    /// It begins a session ([`creates_session`]): a subscription of its
    /// channel from before it was of a session deleted since, and ends.
    pub creates: bool,
}

/// `channels` and, after them, for each default chat among them whose
/// session's channel is not, that channel (where a session made again
/// would say so first; see [`creates_session`]), each once.
pub fn with_their_sessions(channels: &[String]) -> Vec<String> {
    use tether_protocol::channel::Channel;
    // A set, not a scan of the list for each chat: a catch-up may cover a
    // connection's every subscription (a thousand).
    let given: HashSet<&str> = channels.iter().map(String::as_str).collect();
    let mut ids = HashSet::new();
    let mut read = channels.to_vec();
    for chat in channels {
        let Some(id) = chat
            .strip_prefix("ahp-chat:/")
            .and_then(|id| id.strip_suffix(Channel::DEFAULT_CHAT_SUFFIX))
        else {
            continue;
        };
        let session = Channel::session_uri(id);
        if ids.insert(id) && !given.contains(session.as_str()) {
            read.push(session);
        }
    }
    read
}

/// The channels whose subscriptions end when `session_channel`'s session is
/// made again: its own and its default chat's.
pub fn ended_by_creation(session_channel: &str) -> [String; 2] {
    let id = session_channel
        .strip_prefix("ahp-session:/")
        .unwrap_or_default();
    [
        session_channel.to_owned(),
        tether_protocol::channel::Channel::default_chat_uri(id),
    ]
}

/// Whether an envelope of `channel` with `action` (JSON text) begins a
/// session: the session's first record, on its own channel. Its type is
/// read exactly (a title or any other text holding the type's name is not
/// one), the text parsed only when it holds that name at all.
pub fn creates_session(channel: &str, action: &str) -> bool {
    #[derive(serde::Deserialize)]
    struct Typed<'a> {
        #[serde(borrow, rename = "type")]
        kind: Option<std::borrow::Cow<'a, str>>,
    }
    use tether_protocol::actions::SESSION_CREATED;
    channel.starts_with("ahp-session:/")
        && action.contains(SESSION_CREATED)
        && serde_json::from_str::<Typed<'_>>(action)
            .is_ok_and(|typed| typed.kind.as_deref() == Some(SESSION_CREATED))
}

/// The frame of a `Directed` copy, and who receives it.
#[derive(Debug)]
pub struct DirectedFrame {
    /// The client.
    pub client_id: String,
    /// Its principal, when known.
    pub sub: Option<String>,
    /// The `action` notification it receives.
    pub frame: Utf8Bytes,
}

impl Published {
    /// The frame a connection of `client_id`, authenticated as `sub`,
    /// receives.
    pub fn frame_for(&self, client_id: Option<&str>, sub: &str) -> &Utf8Bytes {
        match (&self.directed, client_id) {
            (Some(d), Some(client))
                if d.client_id == client && d.sub.as_deref().is_none_or(|s| s == sub) =>
            {
                &d.frame
            }
            _ => &self.frame,
        }
    }
}

/// What the hub carries: one pointer, since every connection's inbox
/// allocates room for 32 items when it is made.
#[derive(Debug, Clone)]
pub enum HubItem {
    /// A committed envelope.
    Envelope(Arc<Published>),
    /// A protocol notification for a channel's subscribers (root
    /// notifications); not part of the log and never replayed.
    Notice(Arc<Notice>),
    /// The channel's session was deleted (retention): its subscriptions
    /// from before `before` end, so a session made again with the same id
    /// (in any project) is not delivered to them. Given to a connection
    /// before anything queued, and never dropped by a full inbox.
    Gone(Arc<Ended>),
}

/// A channel whose subscriptions end ([`HubItem::Gone`]).
#[derive(Debug)]
pub struct Ended {
    /// The channel.
    pub channel: String,
    /// Subscriptions whose snapshot is older than this seq end (`u64::MAX`:
    /// every one).
    pub before: u64,
}

/// A notification on its way to a channel's subscribers.
#[derive(Debug)]
pub struct Notice {
    /// The channel whose subscribers get it.
    pub channel: String,
    /// The whole JSON-RPC notification.
    pub frame: Utf8Bytes,
    /// The project it tells of: only principals who may see it get it.
    pub project: String,
}

/// One connection's inbox: a bounded queue the hub pushes to and the
/// connection's task pops from. Hand-built rather than a channel (see
/// `mailbox`): it allocates nothing until an item arrives.
#[derive(Debug)]
struct Inbox {
    id: u64,
    capacity: usize,
    state: Mutex<InboxState>,
}

#[derive(Debug, Default)]
struct InboxState {
    items: Waiting<HubItem>,
    /// An item was dropped since the receiver last heard so.
    lagged: bool,
    /// Channels whose subscriptions end, taken before anything else (a
    /// catch-up after a lag would otherwise read a deleted session's
    /// channel from the store, its successor's envelopes included).
    ended: Vec<Arc<Ended>>,
}

impl Inbox {
    fn state(&self) -> MutexGuard<'_, InboxState> {
        // Nothing panics while holding it; recover the data if it ever did.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Queues `item`, or marks the inbox lagged when it is full; returns
    /// the receiver's waker if it was waiting (the caller wakes it).
    fn offer(&self, item: HubItem) -> Option<Waker> {
        let mut state = self.state();
        if state.items.len() < self.capacity {
            state.items.push(item)
        } else if !state.lagged {
            state.lagged = true;
            state.items.unpark()
        } else {
            None
        }
    }

    /// Tells the receiver, ahead of what is queued and whether or not the
    /// inbox is full, that a channel's subscriptions end; returns its
    /// waker as [`Inbox::offer`] does.
    fn end(&self, ended: Arc<Ended>) -> Option<Waker> {
        let mut state = self.state();
        // One per channel (bounded by the connection's subscriptions),
        // the later end kept.
        match state.ended.iter_mut().find(|e| e.channel == ended.channel) {
            Some(kept) if kept.before >= ended.before => {}
            Some(kept) => *kept = ended,
            None => state.ended.push(ended),
        }
        state.items.unpark()
    }
}

/// The connections a publish gave something to, woken once the hub's lock
/// is released and every envelope of the batch is in their inboxes (so a
/// connection that takes several is woken once).
///
/// They are woken a chunk at a time, and the waking task yields between
/// chunks. A worker that wakes a thousand tasks at once overflows its run
/// queue (256 tasks) into the runtime's shared queue, and everything woken
/// from outside the runtime after that (the group committer, when the
/// database answers) then waits behind the whole overflow: with 1,000
/// subscribers at 200 envelopes/s, 2.5 ms of each commit's 4.5 ms was that
/// wait (BENCHMARKS.md, "The fan-out's wakes").
#[derive(Debug, Default)]
pub struct Wakes(Vec<Waker>);

/// How many connections are woken before the waker yields.
const WAKE_CHUNK: usize = 64;

impl Wakes {
    fn add(&mut self, waker: Option<Waker>) {
        if let Some(waker) = waker {
            self.0.push(waker);
        }
    }

    /// Wakes them all now, for a caller that cannot yield (`Hub::notify`).
    fn wake_at_once(self) {
        self.0.into_iter().for_each(Waker::wake);
    }

    /// Wakes them all, yielding between chunks.
    pub async fn wake(self) {
        let mut wakers = self.0.into_iter();
        loop {
            wakers.by_ref().take(WAKE_CHUNK).for_each(Waker::wake);
            if wakers.len() == 0 {
                return;
            }
            tokio::task::yield_now().await;
        }
    }
}

#[derive(Debug, Default)]
struct Routes {
    by_channel: HashMap<String, ChannelRoute<Arc<Inbox>>, foldhash::fast::RandomState>,
}

/// The routing hub.
#[derive(Debug)]
pub struct Hub {
    routes: Mutex<Routes>,
    next_inbox: AtomicU64,
    published: AtomicU64,
    capacity: usize,
}

impl Hub {
    /// A hub whose inboxes hold `capacity` items each.
    pub fn new(capacity: usize, last_seq: u64) -> Self {
        Self {
            routes: Mutex::new(Routes::default()),
            next_inbox: AtomicU64::new(1),
            published: AtomicU64::new(last_seq),
            capacity: capacity.max(16),
        }
    }

    /// A new, unrouted inbox for one connection: the handle that routes
    /// channels to it, and its receiving end.
    pub fn subscribe(self: &Arc<Self>) -> (Routing, InboxReceiver) {
        let inbox = Arc::new(Inbox {
            id: self.next_inbox.fetch_add(1, Ordering::Relaxed),
            capacity: self.capacity,
            state: Mutex::new(InboxState::default()),
        });
        let routing = Routing {
            hub: self.clone(),
            inbox: inbox.clone(),
            channels: HashSet::default(),
        };
        (routing, InboxReceiver { inbox })
    }

    /// The highest seq published.
    pub fn published(&self) -> u64 {
        self.published.load(Ordering::Acquire)
    }

    /// Publishes a committed envelope; callers publish in seq order, and
    /// then wake the connections `wakes` gathered.
    pub fn publish(&self, item: Arc<Published>, wakes: &mut Wakes) {
        let mut routes = self.routes();
        // Under the lock, so a route taken concurrently either sees this seq
        // as published (and bridges it from the store) or receives it.
        self.published.fetch_max(item.seq, Ordering::AcqRel);
        if item.creates {
            // A session made again with a deleted one's id: whoever still
            // subscribes to the deleted one's channels is told they ended
            // (this host may not have heard of the deletion yet), and a
            // subscription of its default chat routed later reads the log,
            // where the creation ends it too.
            for channel in ended_by_creation(&item.channel) {
                end_routes(&routes, &channel, item.seq, wakes);
                if let Some(route) = routes.by_channel.get_mut(&channel) {
                    route.saw(item.seq);
                }
            }
        }
        if let Some(route) = routes.by_channel.get_mut(&item.channel) {
            route.saw(item.seq);
            for inbox in &route.inboxes {
                wakes.add(inbox.offer(HubItem::Envelope(item.clone())));
            }
        }
    }

    /// Publishes a notification to a channel's subscribers; `frame`
    /// renders it, only when the channel has a subscriber here (it is
    /// rendered outside the lock, so one taken meanwhile may miss it, as
    /// it would had it subscribed a moment later).
    pub fn notify(&self, channel: &str, project: &str, frame: impl FnOnce() -> String) {
        if !self.routes().by_channel.contains_key(channel) {
            return;
        }
        let frame = frame();
        let routes = self.routes();
        if let Some(route) = routes.by_channel.get(channel) {
            let notice = Arc::new(Notice {
                channel: channel.to_owned(),
                frame: frame.into(),
                project: project.to_owned(),
            });
            let mut wakes = Wakes::default();
            for inbox in &route.inboxes {
                wakes.add(inbox.offer(HubItem::Notice(notice.clone())));
            }
            drop(routes);
            wakes.wake_at_once();
        }
    }

    /// Ends every subscription here to the channels `gone` says are gone
    /// whose snapshot is older than seq `before` (a session made again
    /// with a deleted one's id since is newer).
    pub fn end_channels(&self, gone: impl Fn(&str) -> bool, before: u64) {
        let routes = self.routes();
        let mut wakes = Wakes::default();
        for channel in routes.by_channel.keys().filter(|c| gone(c)) {
            end_routes(&routes, channel, before, &mut wakes);
        }
        drop(routes);
        wakes.wake_at_once();
    }

    fn routes(&self) -> std::sync::MutexGuard<'_, Routes> {
        // Nothing panics while holding it; recover the data if it ever did.
        self.routes.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Which channels the hub routes to one connection's inbox. Dropping it
/// removes every route.
#[derive(Debug)]
pub struct Routing {
    hub: Arc<Hub>,
    inbox: Arc<Inbox>,
    channels: HashSet<String, foldhash::fast::RandomState>,
}

impl Routing {
    /// Routes `channel` here and returns the highest seq published before:
    /// every envelope of the channel above it arrives in the inbox (or
    /// marks it lagged).
    pub fn route(&mut self, channel: &str) -> u64 {
        // A subscription that has everything there is: nothing is quiet
        // above the hub's seq, so it is routed there.
        self.route_after(channel, u64::MAX)
    }

    /// Routes `channel` here for a subscription that has every envelope of
    /// it up to `after` (its snapshot's seq), and returns the seq from
    /// which the inbox brings the rest: the highest seq published, as
    /// [`Routing::route`] does, or `after` itself when the hub knows the
    /// channel had nothing in between (see `engine/route.rs`), so there is
    /// nothing to read from the log.
    pub fn route_after(&mut self, channel: &str, after: u64) -> u64 {
        let mut routes = self.hub.routes();
        let published = self.hub.published();
        let route = routes
            .by_channel
            .entry(channel.to_owned())
            .or_insert_with(|| ChannelRoute::new(published));
        if self.channels.insert(channel.to_owned()) {
            route.inboxes.push(self.inbox.clone());
        }
        if route.quiet_after(after) {
            after.min(published)
        } else {
            published
        }
    }

    /// What a read of the log up to `through` found: `channel`'s last seq
    /// up to it is at most `last` (for a default chat, with no creation of
    /// its session after `last` either). Later subscriptions whose
    /// snapshot is at or above it need not read.
    pub fn learn(&mut self, channel: &str, through: u64, last: u64) {
        if !self.channels.contains(channel) {
            return;
        }
        if let Some(route) = self.hub.routes().by_channel.get_mut(channel) {
            route.learn(through, last);
        }
    }

    /// Stops routing `channel` here.
    pub fn unroute(&mut self, channel: &str) {
        if self.channels.remove(channel) {
            let mut routes = self.hub.routes();
            remove_inbox(&mut routes, channel, self.inbox.id);
        }
    }
}

impl Drop for Routing {
    fn drop(&mut self) {
        let mut routes = self.hub.routes();
        for channel in &self.channels {
            remove_inbox(&mut routes, channel, self.inbox.id);
        }
    }
}

/// What a connection's inbox gives it next.
#[derive(Debug)]
pub enum Inbound {
    /// An item routed here, in publish order.
    Item(HubItem),
    /// The inbox dropped items since the last `Lagged`: the connection must
    /// catch up from the store (which covers the items still queued; they
    /// follow, and are skipped as already delivered).
    Lagged,
}

/// A connection's inbox: what the hub routes to it, in publish order.
#[derive(Debug)]
pub struct InboxReceiver {
    inbox: Arc<Inbox>,
}

impl InboxReceiver {
    /// The next item routed here, or the news that some were dropped.
    pub async fn next(&mut self) -> Inbound {
        std::future::poll_fn(|cx| self.poll_next(cx)).await
    }

    /// The next item if one is there now, without waiting.
    pub fn try_next(&mut self) -> Option<Inbound> {
        take_next(&mut self.inbox.state())
    }

    fn poll_next(&mut self, cx: &mut Context<'_>) -> Poll<Inbound> {
        let mut state = self.inbox.state();
        if let Some(inbound) = take_next(&mut state) {
            return Poll::Ready(inbound);
        }
        state.items.park(cx);
        Poll::Pending
    }
}

/// Tells every inbox routed `channel` that its subscriptions from before
/// `before` end.
fn end_routes(routes: &Routes, channel: &str, before: u64, wakes: &mut Wakes) {
    if let Some(route) = routes.by_channel.get(channel) {
        let ended = Arc::new(Ended {
            channel: channel.to_owned(),
            before,
        });
        for inbox in &route.inboxes {
            wakes.add(inbox.end(ended.clone()));
        }
    }
}

fn take_next(state: &mut InboxState) -> Option<Inbound> {
    if let Some(ended) = state.ended.pop() {
        return Some(Inbound::Item(HubItem::Gone(ended)));
    }
    if std::mem::take(&mut state.lagged) {
        return Some(Inbound::Lagged);
    }
    state.items.pop().map(Inbound::Item)
}

fn remove_inbox(routes: &mut Routes, channel: &str, id: u64) {
    if let Some(route) = routes.by_channel.get_mut(channel) {
        route.inboxes.retain(|inbox| inbox.id != id);
        if route.inboxes.is_empty() {
            routes.by_channel.remove(channel);
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};

    use super::*;
    use crate::store::Origin;

    /// The envelope written by hand is the JSON a value tree would give,
    /// in the same key order, escaping included.
    #[test]
    fn an_envelope_is_the_json_of_its_parts() {
        let origin = Origin {
            client_id: "tab \"1\"\n\\".into(),
            client_seq: 7,
            scope: "conn:x".into(),
        };
        let cases = [
            ("ahp://session/s1", None, None),
            ("ahp://session/é☃", Some(&origin), None),
            ("ahp://chat/c\u{1}", Some(&origin), Some("no \"way\"\t")),
        ];
        for (channel, origin, rejection) in cases {
            let action = r#"{"type":"session/titleChanged","title":"x"}"#;
            let text = envelope_text(42, channel, action, origin, rejection);
            let mut want = json!({"channel": channel, "serverSeq": 42});
            if let Some(o) = origin {
                want["origin"] = json!({"clientId": o.client_id, "clientSeq": o.client_seq});
            }
            if let Some(reason) = rejection {
                want["rejectionReason"] = json!(reason);
            }
            want["action"] = serde_json::from_str(action).unwrap();
            assert_eq!(text, serde_json::to_string(&want).unwrap());
            let frame: Value =
                serde_json::from_str(&action_frame(42, channel, action, origin, rejection))
                    .unwrap();
            assert_eq!(frame["params"], want);
            assert_eq!(frame["method"], "action");
        }
    }

    fn published(seq: u64) -> Arc<Published> {
        Arc::new(Published {
            seq,
            channel: "ahp://session/s1".into(),
            frame: format!("frame {seq}").into(),
            directed: None,
            committed: std::time::Instant::now(),
            creates: false,
        })
    }

    fn seq_of(inbound: Inbound) -> Option<u64> {
        match inbound {
            Inbound::Item(HubItem::Envelope(published)) => Some(published.seq),
            _ => None,
        }
    }

    /// A hub with one inbox of 16 routed `ahp://session/s1`, and 20 of its
    /// envelopes published: the inbox is full and lagged.
    fn overfilled() -> (Arc<Hub>, Routing, InboxReceiver, Wakes) {
        let hub = Arc::new(Hub::new(16, 0));
        let (mut routing, inbox) = hub.subscribe();
        routing.route("ahp://session/s1");
        let mut wakes = Wakes::default();
        for seq in 1..=20 {
            hub.publish(published(seq), &mut wakes);
        }
        (hub, routing, inbox, wakes)
    }

    /// A full inbox drops what does not fit and says so before anything
    /// else; what it kept follows in publish order, and a waiting receiver
    /// is woken by the next offer.
    #[tokio::test]
    async fn an_inbox_keeps_order_and_reports_what_it_dropped() {
        let (hub, routing, mut inbox, wakes) = overfilled();
        wakes.wake().await;
        assert!(matches!(inbox.next().await, Inbound::Lagged));
        for seq in 1..=16 {
            assert_eq!(seq_of(inbox.next().await), Some(seq));
        }
        let waiting = tokio::spawn(async move { seq_of(inbox.next().await) });
        tokio::task::yield_now().await;
        assert!(!waiting.is_finished());
        let mut wakes = Wakes::default();
        hub.publish(published(21), &mut wakes);
        assert!(!waiting.is_finished());
        wakes.wake().await;
        assert_eq!(waiting.await.unwrap(), Some(21));
        drop(routing);
        assert_eq!(hub.routes().by_channel.len(), 0);
    }

    #[test]
    fn a_default_chats_session_is_read_once_beside_it() {
        let channels: Vec<String> = [
            "ahp-chat:/a.main",
            "ahp-chat:/b.main",
            "ahp-session:/b",
            "ahp-chat:/a-side",
        ]
        .map(str::to_owned)
        .to_vec();
        let mut read = with_their_sessions(&channels);
        assert_eq!(read.len(), 5, "{read:?}");
        // The channels first, then what is read beside them (a connection
        // sends only the first).
        assert_eq!(read[..4], channels[..]);
        assert_eq!(read[4], "ahp-session:/a");
        read.sort();
        read.dedup();
        assert_eq!(read.len(), 5, "each once: {read:?}");
        assert!(read.contains(&"ahp-session:/a".to_owned()));
    }

    fn ended_of(inbound: Option<Inbound>) -> Option<(String, u64)> {
        match inbound {
            Some(Inbound::Item(HubItem::Gone(ended))) => {
                Some((ended.channel.clone(), ended.before))
            }
            _ => None,
        }
    }

    /// A channel's end reaches a full, lagged inbox, and before the lag
    /// and what is queued: the catch-up a lag starts would otherwise read
    /// the deleted session's channel, its successor's envelopes included.
    #[test]
    fn a_channels_end_comes_before_a_lag_and_anything_queued() {
        let (hub, _routing, mut inbox, _) = overfilled();
        hub.end_channels(|channel| channel == "ahp://session/s1", 21);
        hub.end_channels(|channel| channel == "ahp://session/s1", 7);
        assert_eq!(
            ended_of(inbox.try_next()),
            Some(("ahp://session/s1".to_owned(), 21)),
            "one end a channel, the later kept"
        );
        assert!(matches!(inbox.try_next(), Some(Inbound::Lagged)));
        assert_eq!(inbox.try_next().and_then(seq_of), Some(1));
    }

    /// A session made again with a deleted one's id ends the older
    /// subscriptions of its channel and its default chat, from its seq.
    #[test]
    fn a_session_made_again_ends_the_older_subscriptions() {
        let hub = Arc::new(Hub::new(16, 0));
        let (mut routing, mut inbox) = hub.subscribe();
        routing.route("ahp-session:/s2");
        routing.route("ahp-chat:/s2.main");
        let created = Arc::new(Published {
            seq: 30,
            channel: "ahp-session:/s2".into(),
            frame: "created".into(),
            directed: None,
            committed: std::time::Instant::now(),
            creates: creates_session(
                "ahp-session:/s2",
                r#"{"type":"x-tether/sessionCreated","project":"p"}"#,
            ),
        });
        assert!(created.creates);
        hub.publish(created, &mut Wakes::default());
        let mut ended = vec![
            ended_of(inbox.try_next()).unwrap(),
            ended_of(inbox.try_next()).unwrap(),
        ];
        ended.sort();
        assert_eq!(
            ended,
            [
                ("ahp-chat:/s2.main".to_owned(), 30),
                ("ahp-session:/s2".to_owned(), 30)
            ]
        );
        assert_eq!(inbox.try_next().and_then(seq_of), Some(30));
        assert!(!creates_session(
            "ahp-chat:/s2.main",
            r#"{"type":"x-tether/sessionCreated"}"#
        ));
        // Text that names the type is not the type.
        for action in [
            r#"{"type":"session/titleChanged","title":"x-tether/sessionCreated"}"#,
            r#"{"type":"session/metaChanged","_meta":{"type":"x-tether/sessionCreated"}}"#,
            r#"{"_meta":{"type":"x-tether/sessionCreated"},"type":"session/metaChanged"}"#,
        ] {
            assert!(!creates_session("ahp-session:/s2", action), "{action}");
        }
        assert!(creates_session(
            "ahp-session:/s2",
            r#"{"_meta":{"type":"x"},"project":"p","type":"x-tether/sessionCreated"}"#
        ));
    }

    /// Every waiting connection is woken, however many chunks its wakes
    /// take, and none before the publisher wakes them.
    #[tokio::test]
    async fn every_waiting_connection_is_woken_chunk_after_chunk() {
        let hub = Arc::new(Hub::new(16, 0));
        let count = 3 * WAKE_CHUNK + 5;
        let mut routings = Vec::new();
        let mut waiting = Vec::new();
        for _ in 0..count {
            let (mut routing, mut inbox) = hub.subscribe();
            routing.route("ahp://session/s1");
            routings.push(routing);
            waiting.push(tokio::spawn(async move { seq_of(inbox.next().await) }));
        }
        // Each yield lets the runtime poll a few dozen of them.
        for _ in 0..count {
            tokio::task::yield_now().await;
        }
        let mut wakes = Wakes::default();
        hub.publish(published(1), &mut wakes);
        assert_eq!(wakes.0.len(), count);
        tokio::task::yield_now().await;
        assert!(waiting.iter().all(|w| !w.is_finished()));
        wakes.wake().await;
        for w in waiting {
            let woken = tokio::time::timeout(std::time::Duration::from_secs(5), w).await;
            assert_eq!(
                woken.expect("a connection was never woken").unwrap(),
                Some(1)
            );
        }
    }
}
