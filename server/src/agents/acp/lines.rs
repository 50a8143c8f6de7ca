//! A guard on what an agent writes to its stdout: newline-delimited JSON-RPC
//! objects, each line bounded. The first line that is not (garbage, a log
//! line printed to the wrong stream, an endless line) ends the connection
//! with a reason a person can read, which the bridge records in the session.

use std::io;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use futures_util::io::AsyncRead;

/// Why the guard ended the stream, if it did.
pub type Verdict = Arc<Mutex<Option<String>>>;

/// Wraps an agent's stdout.
#[derive(Debug)]
pub struct Guarded<R> {
    inner: R,
    max_line: usize,
    /// Bytes of the current line so far.
    line: usize,
    /// Whether the current line has shown its first non-blank byte.
    started: bool,
    verdict: Verdict,
}

impl<R> Guarded<R> {
    /// Guards `inner`, refusing lines longer than `max_line` bytes.
    pub fn new(inner: R, max_line: usize, verdict: Verdict) -> Self {
        Self {
            inner,
            max_line,
            line: 0,
            started: false,
            verdict,
        }
    }

    fn check(&mut self, bytes: &[u8]) -> Result<(), String> {
        for &byte in bytes {
            if byte == b'\n' {
                self.line = 0;
                self.started = false;
                continue;
            }
            self.line += 1;
            if self.line > self.max_line {
                return Err(format!(
                    "the agent wrote a line longer than {} bytes to stdout",
                    self.max_line
                ));
            }
            if !self.started && !byte.is_ascii_whitespace() {
                self.started = true;
                if byte != b'{' {
                    return Err(format!(
                        "the agent wrote something that is not an ACP message to stdout \
                         (a line starting with {:?}); agents must write only JSON-RPC there \
                         and log to stderr",
                        char::from(byte)
                    ));
                }
            }
        }
        Ok(())
    }
}

impl<R: AsyncRead + Unpin> AsyncRead for Guarded<R> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut [u8],
    ) -> Poll<io::Result<usize>> {
        let this = &mut *self;
        match Pin::new(&mut this.inner).poll_read(cx, buf) {
            Poll::Ready(Ok(n)) => match this.check(&buf[..n]) {
                Ok(()) => Poll::Ready(Ok(n)),
                Err(reason) => {
                    if let Ok(mut verdict) = this.verdict.lock() {
                        verdict.get_or_insert(reason.clone());
                    }
                    Poll::Ready(Err(io::Error::new(io::ErrorKind::InvalidData, reason)))
                }
            },
            other => other,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn guard() -> Guarded<&'static [u8]> {
        Guarded::new(&b""[..], 16, Verdict::default())
    }

    #[test]
    fn json_rpc_lines_pass_and_anything_else_is_refused() {
        let mut g = guard();
        assert!(g.check(b"{\"a\":1}\n\n  {\"b\"").is_ok());
        assert!(g.check(b":2}\n").is_ok());
        let err = g.check(b"hello\n").expect_err("garbage");
        assert!(err.contains("not an ACP message"), "{err}");
    }

    #[test]
    fn a_line_over_the_bound_is_refused() {
        let mut g = guard();
        assert!(g.check(b"{0123456789abcd}\n").is_ok());
        let err = g.check(b"{0123456789abcdef}").expect_err("too long");
        assert!(err.contains("longer than 16 bytes"), "{err}");
    }
}
