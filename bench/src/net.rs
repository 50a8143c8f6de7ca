//! Sockets: where the server is, which loopback source address each
//! connection uses, the open-file limit, and what a failed connect means.
//!
//! One source address has about 28,000 ephemeral ports (Linux's default
//! `ip_local_port_range`), and closed client sockets sit in TIME_WAIT for a
//! minute, so thousands of connections per run, run after run, would
//! exhaust one address. Connections are spread round-robin over
//! 127.0.0.1 ..= 127.0.0.N; every 127/8 address reaches a server bound to
//! 127.0.0.1 on Linux.

use std::io;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};

use tokio::net::{TcpSocket, TcpStream};
use tokio_tungstenite::tungstenite::http::Uri;
use tokio_tungstenite::tungstenite::protocol::WebSocketConfig;
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};

use crate::error::{Error, Result};

/// How long a WebSocket upgrade may take. The kernel completes the TCP
/// handshake for a server that cannot accept (out of files), so without a
/// bound a connect would wait forever.
const HANDSHAKE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(15);

/// A client WebSocket, in the type the upstream `ahp-ws` transport wraps.
pub type Ws = WebSocketStream<MaybeTlsStream<TcpStream>>;

/// The server under load.
#[derive(Debug, Clone)]
pub struct Target {
    /// `ws://host:port/ahp` of every host (one, or several on one database).
    pub hosts: Vec<Host>,
    /// `http://host:port` for REST (the first host's).
    pub http_url: String,
    /// Source addresses, used round-robin; empty when the server is not on
    /// loopback (the system picks).
    pub sources: Vec<IpAddr>,
    /// The first host's pid, for its memory and open-file limit.
    pub server_pid: Option<u32>,
    /// Every host's pid, for their CPU.
    pub server_pids: Vec<u32>,
}

/// One host's WebSocket endpoint.
#[derive(Debug, Clone)]
pub struct Host {
    /// `ws://host:port/ahp`.
    pub ws_url: String,
    /// The resolved socket address.
    pub addr: SocketAddr,
}

impl Target {
    /// Resolves every `ws_urls`; `http_url` defaults to the first one's host
    /// and port.
    pub async fn resolve(
        ws_urls: &[String],
        http_url: Option<&str>,
        sources: usize,
        server_pids: &[u32],
    ) -> Result<Self> {
        let mut hosts = Vec::with_capacity(ws_urls.len());
        let mut first_http = None;
        for ws_url in ws_urls {
            let uri: Uri = ws_url
                .parse()
                .map_err(|e| Error::msg(format!("--url {ws_url:?} is not a URL: {e}")))?;
            if uri.scheme_str() != Some("ws") {
                return Err(Error::msg(format!(
                    "--url must be a ws:// URL (the load tool speaks plain WebSocket); got {ws_url:?}"
                )));
            }
            let host = uri
                .host()
                .ok_or_else(|| Error::msg(format!("--url {ws_url:?} names no host")))?;
            let port = uri.port_u16().unwrap_or(80);
            let addr = tokio::net::lookup_host((host, port))
                .await?
                .find(SocketAddr::is_ipv4)
                .ok_or_else(|| Error::msg(format!("{host} has no IPv4 address")))?;
            first_http.get_or_insert_with(|| format!("http://{host}:{port}"));
            hosts.push(Host {
                ws_url: ws_url.clone(),
                addr,
            });
        }
        let (Some(first), Some(default_http)) = (hosts.first(), first_http) else {
            return Err(Error::msg("--url names no host"));
        };
        let http_url = match http_url {
            Some(url) => url.trim_end_matches('/').to_owned(),
            None => default_http,
        };
        let sources = if first.addr.ip().is_loopback() {
            (1..=sources.clamp(1, 254))
                .map(|i| IpAddr::V4(Ipv4Addr::new(127, 0, 0, i as u8)))
                .collect()
        } else {
            Vec::new()
        };
        Ok(Self {
            hosts,
            http_url,
            sources,
            server_pid: server_pids.first().copied(),
            server_pids: server_pids.to_vec(),
        })
    }

    /// Which host the `index`-th connection goes to.
    pub fn host_index(&self, index: usize) -> usize {
        index % self.hosts.len()
    }

    /// The source address of the `index`-th connection.
    pub fn source(&self, index: usize) -> Option<IpAddr> {
        (!self.sources.is_empty()).then(|| self.sources[index % self.sources.len()])
    }

    /// A TCP connection from the `index`-th source address, Nagle off (the
    /// load tool measures latency of small frames).
    pub async fn tcp(&self, index: usize) -> Result<TcpStream, ConnectError> {
        let source = self.source(index);
        let fail = |stage: &'static str, err: io::Error| ConnectError { stage, source, err };
        let socket = TcpSocket::new_v4().map_err(|e| fail("socket", e))?;
        if let Some(ip) = source {
            socket
                .bind(SocketAddr::new(ip, 0))
                .map_err(|e| fail("bind", e))?;
        }
        let stream = socket
            .connect(self.hosts[self.host_index(index)].addr)
            .await
            .map_err(|e| fail("connect", e))?;
        stream.set_nodelay(true).map_err(|e| fail("nodelay", e))?;
        Ok(stream)
    }

    /// A WebSocket to `/ahp` from the `index`-th source address.
    pub async fn ws(&self, index: usize, config: WebSocketConfig) -> Result<Ws> {
        let stream = self.tcp(index).await.map_err(|e| Error::msg(e.explain()))?;
        let handshake = tokio_tungstenite::client_async_with_config(
            self.hosts[self.host_index(index)].ws_url.as_str(),
            MaybeTlsStream::Plain(stream),
            Some(config),
        );
        let (ws, _) = tokio::time::timeout(HANDSHAKE_TIMEOUT, handshake)
            .await
            .map_err(|_| {
                Error::msg(format!(
                    "no answer to the WebSocket upgrade in {HANDSHAKE_TIMEOUT:?}: the kernel \
                     accepted the connection but the server did not; it is likely out of open \
                     files (its log says `accept error: Too many open files`; start it after \
                     raising `ulimit -n`) or overloaded"
                ))
            })?
            .map_err(|e| Error::msg(explain_handshake(&e)))?;
        Ok(ws)
    }

    /// The upstream AHP client on a WebSocket from the `index`-th source
    /// address. `buffer` sizes each subscription's ring: the upstream client
    /// silently skips what a lagging subscription missed, so it must hold
    /// every envelope the caller may be behind by.
    pub async fn ahp(&self, index: usize, buffer: usize) -> Result<ahp::Client> {
        let ws = self.ws(index, WebSocketConfig::default()).await?;
        let transport = ahp_ws::WebSocketTransport::from_stream(ws);
        let config = ahp::ClientConfig {
            default_request_timeout: Some(std::time::Duration::from_secs(60)),
            subscription_buffer: buffer.max(16),
        };
        Ok(ahp::Client::connect(transport, config).await?)
    }
}

/// A small-footprint WebSocket configuration for connections that read
/// small frames: tungstenite allocates its read buffer eagerly (128 KiB by
/// default) and zero-fills all of it before every read, which costs memory
/// at 10,000 connections and CPU on every delivery.
pub fn small_buffers() -> WebSocketConfig {
    WebSocketConfig::default()
        .read_buffer_size(4 * 1024)
        .write_buffer_size(0)
}

/// A failed TCP connect, with the stage and source address it failed at.
#[derive(Debug)]
pub struct ConnectError {
    /// `socket`, `bind`, `connect` or `nodelay`.
    pub stage: &'static str,
    /// The source address tried.
    pub source: Option<IpAddr>,
    /// What the system said.
    pub err: io::Error,
}

impl ConnectError {
    /// Which limit was hit, in words a person can act on.
    pub fn explain(&self) -> String {
        let from = self
            .source
            .map(|ip| format!(" from {ip}"))
            .unwrap_or_default();
        // errno values of Linux, the only system this tool reads /proc on.
        let why = match self.err.raw_os_error() {
            Some(24) => {
                let (soft, hard) = nofile_limit();
                format!(
                    "the load tool's open-file limit was hit (RLIMIT_NOFILE soft {soft}, hard \
                     {hard}); raise the hard limit (e.g. `ulimit -Hn 1048576` as root, or \
                     LimitNOFILE= for a service) and run again"
                )
            }
            Some(23) => "the system-wide open-file table is full (fs.file-max)".to_owned(),
            Some(99) => format!(
                "no ephemeral port left on the source address{from}; pass more --sources \
                 (each 127.0.0.x adds about 28,000 ports) or wait for TIME_WAIT sockets to expire"
            ),
            Some(98) => format!("the source address{from} has no free port"),
            Some(111) => "the server refused the connection: it is not listening, or its \
                          accept queue (listen backlog) overflowed"
                .to_owned(),
            Some(104) => "the server reset the connection: its listen backlog overflowed or it \
                          hit its own open-file limit (start it after `ulimit -n` raises it; \
                          its log says `Too many open files`)"
                .to_owned(),
            Some(110) => "the connection timed out: the server's listen backlog is full \
                          (net.core.somaxconn) or it is not accepting"
                .to_owned(),
            _ => "see the system error above".to_owned(),
        };
        format!("{} failed{from}: {} — {why}", self.stage, self.err)
    }
}

fn explain_handshake(err: &tokio_tungstenite::tungstenite::Error) -> String {
    use tokio_tungstenite::tungstenite::Error as E;
    match err {
        E::Http(response) if response.status().as_u16() == 503 => format!(
            "the server's connection limit was hit (HTTP 503 on the WebSocket upgrade): raise \
             `tether serve --max-connections` ({err})"
        ),
        E::Io(io) if io.raw_os_error() == Some(104) => format!(
            "the server reset the connection during the WebSocket handshake: it is likely out \
             of open files (raise its `ulimit -n`) ({err})"
        ),
        other => format!("WebSocket handshake failed: {other}"),
    }
}

/// The open-file limit (soft, hard) of this process.
pub fn nofile_limit() -> (u64, u64) {
    rlimit::getrlimit(rlimit::Resource::NOFILE).unwrap_or((0, 0))
}

/// Raises this process's open-file soft limit to its hard limit; returns
/// the new (soft, hard).
pub fn raise_nofile_limit() -> (u64, u64) {
    let (_, hard) = nofile_limit();
    let _ = rlimit::increase_nofile_limit(hard);
    nofile_limit()
}

/// The server's "Max open files" soft limit from `/proc/<pid>/limits`.
pub fn server_nofile_limit(pid: u32) -> Option<u64> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/limits")).ok()?;
    text.lines()
        .find(|line| line.starts_with("Max open files"))
        .and_then(|line| {
            line.trim_start_matches("Max open files")
                .split_whitespace()
                .next()
        })
        .and_then(|soft| soft.parse().ok())
}

/// Warns (on stderr) when `connections` would not fit in the open-file
/// limits of this process or of the server.
pub fn check_fd_budget(connections: usize, server_pid: Option<u32>) {
    // Sockets plus what the runtime, stdio and REST keep open.
    let needed = connections as u64 + 64;
    let (soft, hard) = nofile_limit();
    if needed > soft {
        eprintln!(
            "warning: {connections} connections need about {needed} open files, but the load \
             tool may open only {soft} (hard limit {hard}); connecting will fail at that point"
        );
    }
    if let Some(limit) = server_pid.and_then(server_nofile_limit)
        && needed > limit
    {
        eprintln!(
            "warning: the server may open only {limit} files (see /proc/<pid>/limits); start \
             it after `ulimit -n {needed}` or more, or connecting will fail at that point"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn sources_spread_over_loopback() {
        let target = Target::resolve(&["ws://127.0.0.1:7878/ahp".into()], None, 3, &[])
            .await
            .unwrap();
        assert_eq!(target.http_url, "http://127.0.0.1:7878");
        let seen: Vec<_> = (0..4).map(|i| target.source(i).unwrap()).collect();
        assert_eq!(
            seen.iter().map(|ip| ip.to_string()).collect::<Vec<_>>(),
            ["127.0.0.1", "127.0.0.2", "127.0.0.3", "127.0.0.1"]
        );
    }

    #[tokio::test]
    async fn only_plain_websocket_urls_are_taken() {
        assert!(
            Target::resolve(&["http://127.0.0.1:1/ahp".into()], None, 1, &[])
                .await
                .is_err()
        );
    }

    #[tokio::test]
    async fn connections_spread_over_every_host() {
        let urls = [
            "ws://127.0.0.1:7001/ahp".into(),
            "ws://127.0.0.1:7002/ahp".into(),
        ];
        let target = Target::resolve(&urls, None, 1, &[]).await.unwrap();
        assert_eq!(
            target.http_url, "http://127.0.0.1:7001",
            "REST: the first host"
        );
        let hosts: Vec<usize> = (0..5).map(|i| target.host_index(i)).collect();
        assert_eq!(hosts, [0, 1, 0, 1, 0]);
    }

    #[test]
    fn a_full_file_table_names_the_limit() {
        let err = ConnectError {
            stage: "socket",
            source: None,
            err: io::Error::from_raw_os_error(24),
        };
        assert!(
            err.explain().contains("open-file limit"),
            "{}",
            err.explain()
        );
        let err = ConnectError {
            stage: "connect",
            source: Some(IpAddr::V4(Ipv4Addr::new(127, 0, 0, 2))),
            err: io::Error::from_raw_os_error(99),
        };
        assert!(err.explain().contains("127.0.0.2"), "{}", err.explain());
    }
}
