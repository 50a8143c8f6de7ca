//! What differs between the servers `tether-load` can drive (`--target`):
//! Tether, spoken to in AHP by the lean client of [`crate::wire`], and the
//! reference peer of [`crate::peer`]. The scenarios that run on both
//! (`ingest`, `fanout`) are written once; only what this module answers
//! varies: how a connection joins a session, how a session is made, how a
//! dispatch is framed and how an acknowledgement or delivery reads.

use std::borrow::Cow;

use clap::ValueEnum;
use tokio_tungstenite::tungstenite::protocol::WebSocketConfig;

use crate::cli::{ClientKind, Scenario};
use crate::error::{Error, Result};
use crate::net::Target;
use crate::peer;
use crate::wire::{self, RawConn, action_head};

/// Which server is at `--url`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Dialect {
    /// Tether: AHP at `ws://host:port/ahp`, REST `/readyz`.
    Tether,
    /// The reference peer: its own frames at `ws://host:port/ws`,
    /// `/healthz`; `ingest` and `fanout` only.
    Peer,
}

/// An acknowledgement or a delivery, whichever server sent it.
#[derive(Debug, PartialEq, Eq)]
pub struct Echo<'a> {
    /// The dispatcher's `clientId`; `None` for a refusal the server sends
    /// to the dispatching connection alone without naming the client (the
    /// peer's `rejected`).
    pub client_id: Option<Cow<'a, str>>,
    /// The dispatcher's `clientSeq`.
    pub client_seq: u64,
    /// The server's log position: Tether's `serverSeq`, the peer's `seq`
    /// (one counter for every session); `None` when refused without one.
    pub seq: Option<u64>,
    /// Set when the dispatch was refused.
    pub rejection: Option<Cow<'a, str>>,
}

impl Echo<'_> {
    /// Whether it acknowledges a dispatch of `client_id`, read on the
    /// connection that dispatched.
    pub fn acknowledges(&self, client_id: &str) -> bool {
        self.client_id.as_deref().is_none_or(|c| c == client_id)
    }

    /// Whether it delivers an action of `client_id`, read on any
    /// subscriber.
    pub fn delivers(&self, client_id: &str) -> bool {
        self.client_id.as_deref() == Some(client_id)
    }
}

impl Dialect {
    /// Its name in reports (the peer's reports give it as the backend).
    pub fn name(self) -> &'static str {
        match self {
            Dialect::Tether => "tether",
            Dialect::Peer => "peer",
        }
    }

    /// Refuses, before anything connects, what this server cannot run.
    pub fn check(self, scenario: &Scenario) -> Result<()> {
        if self == Dialect::Tether {
            return Ok(());
        }
        let client = match scenario {
            Scenario::Ingest(args) => args.client,
            Scenario::Fanout(args) => args.client,
            other => {
                return Err(Error::msg(format!(
                    "the peer supports only ingest and fanout; `{}` needs --target tether",
                    other.name()
                )));
            }
        };
        if client == ClientKind::Ahp {
            return Err(Error::msg(
                "--client ahp speaks AHP, which the peer does not; use --client raw with the peer",
            ));
        }
        Ok(())
    }

    /// A connection from the `index`-th source address that has joined
    /// `sessions`: on Tether, `initialize` as `client_id` with them as the
    /// initial subscriptions; on the peer (which has no handshake), one
    /// `sub` each.
    pub async fn connect(
        self,
        target: &Target,
        index: usize,
        config: WebSocketConfig,
        client_id: &str,
        sessions: &[&str],
    ) -> Result<RawConn> {
        let mut conn = RawConn::new(target.ws(index, config).await?);
        match self {
            Dialect::Tether => {
                conn.initialize(client_id, sessions).await?;
            }
            Dialect::Peer => {
                for session in sessions {
                    peer::subscribe(&mut conn, session).await?;
                }
            }
        }
        Ok(conn)
    }

    /// Makes session `id` and returns the name dispatches go to: Tether's
    /// `createSession` (its channel), or just `id` on the peer, where a
    /// session is any string.
    pub async fn create_session(self, conn: &mut RawConn, id: &str) -> Result<String> {
        match self {
            Dialect::Tether => wire::create_session(conn, id).await,
            Dialect::Peer => Ok(id.to_owned()),
        }
    }

    /// Makes sure a dispatcher that is not otherwise subscribed to
    /// `session` hears its acknowledgements: Tether sends a dispatcher its
    /// echo whether or not it subscribed; the peer sends events only to
    /// subscribers, so there the dispatcher subscribes (and is then one
    /// more delivery per action).
    pub async fn hear_own_acks(self, conn: &mut RawConn, session: &str) -> Result<()> {
        match self {
            Dialect::Tether => Ok(()),
            Dialect::Peer => peer::subscribe(conn, session).await,
        }
    }

    /// One dispatch. `session_json` and `client_id_json` are JSON strings
    /// (quoted, made once per connection); Tether knows the client from
    /// `initialize`, so its frame leaves the id out.
    pub fn dispatch_frame(
        self,
        session_json: &str,
        client_id_json: &str,
        client_seq: u64,
        action_json: &str,
    ) -> String {
        match self {
            Dialect::Tether => wire::dispatch_frame(session_json, client_seq, action_json),
            Dialect::Peer => {
                peer::dispatch_frame(session_json, client_id_json, client_seq, action_json)
            }
        }
    }

    /// The acknowledgement or delivery in an inbound frame; `None` for
    /// every other frame (and for actions nobody dispatched with an origin).
    pub fn echo(self, text: &str) -> Option<Echo<'_>> {
        match self {
            Dialect::Tether => {
                let head = action_head(text)?;
                let origin = head.origin?;
                Some(Echo {
                    client_id: Some(origin.client_id),
                    client_seq: origin.client_seq,
                    seq: head.server_seq,
                    rejection: head.rejection_reason,
                })
            }
            Dialect::Peer => match peer::read(text) {
                peer::Frame::Event {
                    seq,
                    client_id: Some(client_id),
                    client_seq,
                    ..
                } => Some(Echo {
                    client_id: Some(client_id),
                    client_seq,
                    seq: Some(seq),
                    rejection: None,
                }),
                peer::Frame::Rejected {
                    client_seq: Some(client_seq),
                    reason,
                } => Some(Echo {
                    client_id: None,
                    client_seq,
                    seq: None,
                    rejection: Some(reason),
                }),
                _ => None,
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser as _;

    use super::*;
    use crate::cli::Cli;
    use crate::wire::{quoted, title_action};

    fn scenario(args: &[&str]) -> Scenario {
        Cli::try_parse_from(args).unwrap().scenario
    }

    #[test]
    fn the_peer_runs_only_ingest_and_fanout_on_the_raw_client() {
        let peer = Dialect::Peer;
        assert!(peer.check(&scenario(&["t", "ingest"])).is_ok());
        assert!(peer.check(&scenario(&["t", "fanout"])).is_ok());
        let err = peer.check(&scenario(&["t", "catchup"])).unwrap_err();
        assert!(
            err.to_string()
                .contains("the peer supports only ingest and fanout"),
            "{err}"
        );
        assert!(
            peer.check(&scenario(&["t", "ingest", "--client", "ahp"]))
                .is_err()
        );
        assert!(Dialect::Tether.check(&scenario(&["t", "list"])).is_ok());
    }

    #[test]
    fn target_is_a_global_flag_defaulting_to_tether() {
        let cli = Cli::try_parse_from(["t", "ingest"]).unwrap();
        assert_eq!(cli.common.target, Dialect::Tether);
        let cli = Cli::try_parse_from(["t", "fanout", "--target", "peer"]).unwrap();
        assert_eq!(cli.common.target, Dialect::Peer);
    }

    #[test]
    fn a_peer_event_acknowledges_its_dispatcher_only() {
        let text = r#"{"t":"event","session":"s","seq":5,"clientId":"c1","clientSeq":2,"action":{"type":"x"}}"#;
        let echo = Dialect::Peer.echo(text).unwrap();
        assert_eq!(echo.seq, Some(5));
        assert_eq!(echo.client_seq, 2);
        assert!(echo.acknowledges("c1") && echo.delivers("c1"));
        assert!(!echo.acknowledges("c2") && !echo.delivers("c2"));
        assert!(Dialect::Tether.echo(text).is_none(), "not an AHP envelope");
    }

    #[test]
    fn a_peer_rejection_is_its_connections_own() {
        let echo = Dialect::Peer
            .echo(r#"{"t":"rejected","clientSeq":4,"reason":"duplicate"}"#)
            .unwrap();
        assert_eq!(echo.rejection.as_deref(), Some("duplicate"));
        assert!(echo.acknowledges("anyone"), "sent to the dispatcher alone");
        assert!(!echo.delivers("anyone"), "not a delivery");
        assert!(Dialect::Peer.echo(r#"{"t":"rejected"}"#).is_none());
    }

    #[test]
    fn a_tether_envelope_reads_the_same_way() {
        let text = r#"{"jsonrpc":"2.0","method":"action","params":{"channel":"ahp-session:/s","origin":{"clientId":"c1","clientSeq":7},"serverSeq":42,"action":{"type":"x"}}}"#;
        let echo = Dialect::Tether.echo(text).unwrap();
        assert_eq!(
            echo,
            Echo {
                client_id: Some("c1".into()),
                client_seq: 7,
                seq: Some(42),
                rejection: None
            }
        );
        assert!(Dialect::Peer.echo(text).is_none());
    }

    #[test]
    fn each_dialect_frames_its_own_dispatch() {
        let (session, client) = (quoted("s"), quoted("c1"));
        let action = title_action("load 1");
        let tether = Dialect::Tether.dispatch_frame(&session, &client, 1, &action);
        assert!(tether.contains(r#""method":"dispatchAction""#), "{tether}");
        assert!(!tether.contains("c1"), "Tether knows the client already");
        let peer = Dialect::Peer.dispatch_frame(&session, &client, 1, &action);
        assert_eq!(peer, peer::dispatch_frame(&session, &client, 1, &action));
    }
}
