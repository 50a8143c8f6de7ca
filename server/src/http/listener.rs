//! The listening socket, with the deadlines hyper's server (as axum runs
//! it) has none of: a client must send each whole request head within
//! [`HEAD_TIMEOUT`] of starting it (the first one from connecting, every
//! later one on a kept-alive connection from its first byte), and an HTTP
//! connection that does nothing for [`IDLE_TIMEOUT`] is closed. Without
//! them a client that sends half a request head and then a byte now and
//! then holds a socket and a task forever.
//!
//! Once a response upgrades the connection (`101 Switching Protocols`),
//! it is a WebSocket and its own ping deadline governs it (`ws`).

use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::time::{Instant, Sleep};

/// How long a new connection has to send its first request head.
pub const HEAD_TIMEOUT: Duration = Duration::from_secs(10);
/// How long an HTTP (not upgraded) connection may do nothing.
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(60);

/// Accepts TCP connections with `TCP_NODELAY` and the deadlines above.
#[derive(Debug)]
pub struct Guarded {
    inner: TcpListener,
}

impl Guarded {
    /// Wraps a bound listener.
    pub fn new(inner: TcpListener) -> Self {
        Self { inner }
    }
}

impl axum::serve::Listener for Guarded {
    type Io = Deadlined;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        // axum's own accept loop: it logs and backs off on errors (EMFILE).
        let (tcp, addr) = axum::serve::Listener::accept(&mut self.inner).await;
        // Small frames (acknowledgements, envelopes) go out at once instead
        // of waiting for Nagle's algorithm to fill a segment.
        if let Err(err) = tcp.set_nodelay(true) {
            tracing::debug!(error = %err, "cannot set TCP_NODELAY");
        }
        (Deadlined::new(tcp), addr)
    }

    fn local_addr(&self) -> io::Result<Self::Addr> {
        self.inner.local_addr()
    }
}

/// Where a connection is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Waiting for the end of a request head; `matched` bytes of
    /// `\r\n\r\n` seen so far.
    Head { matched: u8 },
    /// Serving a request (its body, its handler).
    Http,
    /// A response was written: the next byte read starts a request head.
    Idle,
    /// Upgraded: no deadline here.
    Upgraded,
}

/// A TCP stream that fails its reads with `TimedOut` past its deadline.
#[derive(Debug)]
pub struct Deadlined {
    tcp: TcpStream,
    phase: Phase,
    deadline: Pin<Box<Sleep>>,
}

impl Deadlined {
    fn new(tcp: TcpStream) -> Self {
        Self {
            tcp,
            phase: Phase::Head { matched: 0 },
            deadline: Box::pin(tokio::time::sleep(HEAD_TIMEOUT)),
        }
    }

    /// Activity while serving or idle moves the idle deadline; a request
    /// head keeps its own.
    fn touched(&mut self) {
        if matches!(self.phase, Phase::Http | Phase::Idle) {
            self.deadline.as_mut().reset(Instant::now() + IDLE_TIMEOUT);
        }
    }

    /// Before a write: a `101` response makes the connection a WebSocket;
    /// another final response ends the request, so the next bytes read
    /// start a new head; any write moves the idle deadline.
    fn writing(&mut self, bytes: &[u8]) {
        if self.phase != Phase::Upgraded && bytes.starts_with(b"HTTP/1.1 101") {
            self.phase = Phase::Upgraded;
        } else if self.phase == Phase::Http
            && bytes.starts_with(b"HTTP/1.")
            && bytes.get(9) != Some(&b'1')
        {
            self.phase = Phase::Idle;
        }
        self.touched();
    }

    /// Bytes arrived on an idle connection: a new request head starts, with
    /// its own deadline.
    fn head_starts(&mut self) {
        if self.phase == Phase::Idle {
            self.phase = Phase::Head { matched: 0 };
            self.deadline.as_mut().reset(Instant::now() + HEAD_TIMEOUT);
        }
    }

    /// Follows a request head through `bytes`.
    fn scan(&mut self, bytes: &[u8]) {
        let Phase::Head { mut matched } = self.phase else {
            return;
        };
        const END: &[u8; 4] = b"\r\n\r\n";
        for &byte in bytes {
            matched = if byte == END[matched as usize] {
                matched + 1
            } else if byte == b'\r' {
                1
            } else {
                0
            };
            if matched == 4 {
                self.phase = Phase::Http;
                self.touched();
                return;
            }
        }
        self.phase = Phase::Head { matched };
    }
}

impl AsyncRead for Deadlined {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        match Pin::new(&mut self.tcp).poll_read(cx, buf) {
            Poll::Ready(result) => {
                let this = &mut *self;
                let read = &buf.filled()[before..];
                if !read.is_empty() {
                    this.head_starts();
                    this.scan(read);
                    this.touched();
                }
                Poll::Ready(result)
            }
            Poll::Pending if self.phase == Phase::Upgraded => Poll::Pending,
            Poll::Pending => match self.deadline.as_mut().poll(cx) {
                Poll::Ready(()) => {
                    let what = match self.phase {
                        Phase::Head { .. } => "no complete request head in time",
                        _ => "idle HTTP connection",
                    };
                    tracing::debug!(reason = what, "closing an HTTP connection");
                    Poll::Ready(Err(io::Error::new(io::ErrorKind::TimedOut, what)))
                }
                Poll::Pending => Poll::Pending,
            },
        }
    }
}

impl AsyncWrite for Deadlined {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.writing(buf);
        Pin::new(&mut self.tcp).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        if let Some(first) = bufs.iter().find(|b| !b.is_empty()) {
            self.writing(first);
        }
        Pin::new(&mut self.tcp).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.tcp.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.tcp).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.tcp).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_first_head_ends_at_a_blank_line_split_anywhere() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let _client = TcpStream::connect(addr).await.unwrap();
        let (tcp, _) = listener.accept().await.unwrap();
        let mut io = Deadlined::new(tcp);
        io.scan(b"GET / HTTP/1.1\r\nHost: x\r");
        assert!(matches!(io.phase, Phase::Head { .. }));
        io.scan(b"\n\r");
        assert!(matches!(io.phase, Phase::Head { matched: 3 }));
        io.scan(b"\n");
        assert_eq!(io.phase, Phase::Http);
        // A final response ends the request; an interim one does not.
        io.writing(b"HTTP/1.1 100 Continue\r\n\r\n");
        assert_eq!(io.phase, Phase::Http);
        io.writing(b"HTTP/1.1 200 OK\r\n");
        assert_eq!(io.phase, Phase::Idle);
        // The next request's head has a deadline of its own again.
        io.head_starts();
        assert_eq!(io.phase, Phase::Head { matched: 0 });
        io.scan(b"GET / HTTP/1.1\r\n\r\n");
        assert_eq!(io.phase, Phase::Http);
        io.writing(b"HTTP/1.1 101 Switching Protocols\r\n");
        assert_eq!(io.phase, Phase::Upgraded);
    }
}
