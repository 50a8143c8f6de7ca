//! Terminals: commands the host runs for a session, confined as its agent
//! is (`sandbox::Sandbox::run`), whose output streams to AHP clients as
//! `terminal/*` actions on `ahp-terminal:/<session>/<name>`. An agent opens
//! them with ACP `terminal/create` (and reads, waits for, kills and
//! releases them); an operator opens one with AHP `createTerminal` (a
//! shell fed by `terminal/input`). Each is bounded: its output kept for
//! the agent and recorded for clients up to a byte limit, its run up to a
//! time limit, after which its process group is killed.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{Value, json};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::process::{Child, ChildStdin};
use tokio::sync::{Notify, mpsc, watch};

use super::sandbox::signal_group;

/// Actions for a session's channels: `(channel, action)`.
pub type Actions = Vec<(String, Value)>;

/// Where a terminal's actions go to be recorded (in order).
pub type Recorder = mpsc::Sender<Actions>;

/// The bounds of every terminal.
#[derive(Debug, Clone, Copy)]
pub struct TerminalLimits {
    /// Output recorded for clients, and the most kept for the agent.
    pub output_bytes: usize,
    /// How long a command may run before it is killed.
    pub timeout: Duration,
}

impl Default for TerminalLimits {
    fn default() -> Self {
        Self {
            output_bytes: 1024 * 1024,
            timeout: Duration::from_secs(600),
        }
    }
}

/// How a terminal's process ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Exit {
    /// Its exit code, when it exited.
    pub code: Option<i32>,
    /// The signal that ended it, when one did.
    pub signal: Option<String>,
}

/// The output kept for the agent: the latest `limit` bytes.
#[derive(Debug, Default)]
struct Kept {
    text: String,
    truncated: bool,
}

/// One running (or finished) terminal.
#[derive(Debug)]
pub struct Terminal {
    /// Its channel URI.
    pub uri: String,
    stdin: tokio::sync::Mutex<Option<ChildStdin>>,
    kept: Mutex<Kept>,
    exit: watch::Receiver<Option<Exit>>,
    kill: Arc<Notify>,
}

impl Terminal {
    /// The output kept so far, whether older output was dropped, and how
    /// it ended if it has.
    pub fn output(&self) -> (String, bool, Option<Exit>) {
        let kept = self.kept.lock().map(|k| (k.text.clone(), k.truncated));
        let (text, truncated) = kept.unwrap_or_default();
        (text, truncated, self.exit.borrow().clone())
    }

    /// Waits for the process to end (it ends at the latest at the time
    /// limit).
    pub async fn wait(&self) -> Exit {
        let mut exit = self.exit.clone();
        loop {
            if let Some(done) = exit.borrow().clone() {
                return done;
            }
            if exit.changed().await.is_err() {
                return exit.borrow().clone().unwrap_or(Exit {
                    code: None,
                    signal: Some("SIGKILL".into()),
                });
            }
        }
    }

    /// Kills its process group (the terminal and its output stay).
    pub fn kill(&self) {
        self.kill.notify_one();
    }

    /// Writes `data` to its input.
    pub async fn input(&self, data: &str) -> Result<(), String> {
        let mut stdin = self.stdin.lock().await;
        let Some(pipe) = stdin.as_mut() else {
            return Err(format!("{} takes no input.", self.uri));
        };
        if self.exit.borrow().is_some() {
            return Err(format!("{} has exited.", self.uri));
        }
        pipe.write_all(data.as_bytes())
            .await
            .map_err(|e| format!("{} did not take the input: {e}.", self.uri))?;
        pipe.flush().await.map_err(|e| e.to_string())
    }
}

/// The terminals of this host's sessions, by URI.
#[derive(Debug, Clone, Default)]
pub struct Terminals {
    open: Arc<Mutex<HashMap<String, Arc<Terminal>>>>,
}

/// What a new terminal is.
#[derive(Debug)]
pub struct NewTerminal {
    /// Its channel URI.
    pub uri: String,
    /// Who holds it (AHP `TerminalClaim`).
    pub claim: Value,
    /// Its title (the command line).
    pub title: String,
    /// Its directory, as a `file:` URI.
    pub cwd: Option<String>,
    /// The most output kept for its reader (the agent's
    /// `outputByteLimit`, at most the host's limit).
    pub keep_bytes: usize,
    /// Whether its input is open (a client's shell).
    pub interactive: bool,
}

impl Terminals {
    /// A terminal by URI.
    pub fn get(&self, uri: &str) -> Option<Arc<Terminal>> {
        self.open.lock().ok()?.get(uri).cloned()
    }

    /// Forgets a terminal, killing its process if it still runs.
    pub fn release(&self, uri: &str) -> Option<Arc<Terminal>> {
        let terminal = self.open.lock().ok()?.remove(uri)?;
        terminal.kill();
        Some(terminal)
    }

    /// Takes over a started process as terminal `new`: its output is kept
    /// and recorded through `record` (from `terminal/claimed`, which makes
    /// the terminal, to `terminal/exited`), its run bounded by `limits`.
    pub fn start(
        &self,
        new: NewTerminal,
        mut child: Child,
        limits: TerminalLimits,
        record: Recorder,
    ) -> Result<Arc<Terminal>, String> {
        let (exit_tx, exit) = watch::channel(None);
        let kill = Arc::new(Notify::new());
        let stdin = child.stdin.take().filter(|_| new.interactive);
        let terminal = Arc::new(Terminal {
            uri: new.uri.clone(),
            stdin: tokio::sync::Mutex::new(stdin),
            kept: Mutex::new(Kept::default()),
            exit,
            kill: kill.clone(),
        });
        {
            let mut open = self.open.lock().map_err(|_| "terminals unavailable")?;
            if open.contains_key(&new.uri) {
                return Err(format!("Terminal {} exists already.", new.uri));
            }
            open.insert(new.uri.clone(), terminal.clone());
        }
        let (chunks_tx, chunks) = mpsc::channel::<String>(16);
        for stream in [
            child
                .stdout
                .take()
                .map(|s| Box::new(s) as Box<dyn AsyncRead + Send + Unpin>),
            child
                .stderr
                .take()
                .map(|s| Box::new(s) as Box<dyn AsyncRead + Send + Unpin>),
        ]
        .into_iter()
        .flatten()
        {
            tokio::spawn(read_text(stream, chunks_tx.clone()));
        }
        drop(chunks_tx);
        tokio::spawn(pump(
            new,
            child,
            terminal.clone(),
            chunks,
            limits,
            record,
            kill,
            exit_tx,
        ));
        Ok(terminal)
    }
}

/// Reads a stream as text (a character split across reads is kept whole)
/// until it ends.
async fn read_text(mut stream: Box<dyn AsyncRead + Send + Unpin>, chunks: mpsc::Sender<String>) {
    let mut buffer = vec![0u8; 8192];
    let mut carry: Vec<u8> = Vec::new();
    loop {
        let read = match stream.read(&mut buffer).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        carry.extend_from_slice(&buffer[..read]);
        let whole = match std::str::from_utf8(&carry) {
            Ok(_) => carry.len(),
            // An incomplete character at the end waits for the next read.
            Err(e) if e.error_len().is_none() => e.valid_up_to(),
            Err(_) => carry.len(),
        };
        let text = String::from_utf8_lossy(&carry[..whole]).into_owned();
        carry.drain(..whole);
        if !text.is_empty() && chunks.send(text).await.is_err() {
            return;
        }
    }
    if !carry.is_empty() {
        let _ = chunks
            .send(String::from_utf8_lossy(&carry).into_owned())
            .await;
    }
}

/// Runs one terminal: records its start, its output (up to the limit) and
/// its end; kills it at the time limit or when asked.
#[allow(clippy::too_many_arguments)]
async fn pump(
    new: NewTerminal,
    mut child: Child,
    terminal: Arc<Terminal>,
    mut chunks: mpsc::Receiver<String>,
    limits: TerminalLimits,
    record: Recorder,
    kill: Arc<Notify>,
    exit_tx: watch::Sender<Option<Exit>>,
) {
    let uri = new.uri.clone();
    let mut opening = vec![
        (
            uri.clone(),
            json!({"type": "terminal/claimed", "claim": new.claim}),
        ),
        (
            uri.clone(),
            json!({"type": "terminal/titleChanged", "title": new.title}),
        ),
    ];
    if let Some(cwd) = &new.cwd {
        opening.push((
            uri.clone(),
            json!({"type": "terminal/cwdChanged", "cwd": cwd}),
        ));
    }
    let _ = record.send(opening).await;
    let group = child.id();
    let deadline = tokio::time::sleep(limits.timeout);
    tokio::pin!(deadline);
    let mut recorded = 0usize;
    let mut status = None;
    let mut note = None;
    let mut open = true;
    while open || status.is_none() {
        tokio::select! {
            chunk = chunks.recv(), if open => match chunk {
                Some(text) => {
                    keep(&terminal, &text, new.keep_bytes.min(limits.output_bytes));
                    if recorded < limits.output_bytes {
                        let room = limits.output_bytes - recorded;
                        let text = if text.len() > room {
                            let mut end = room;
                            while !text.is_char_boundary(end) {
                                end -= 1;
                            }
                            format!("{}\n[output past {} bytes is not recorded]\n", &text[..end], limits.output_bytes)
                        } else {
                            text
                        };
                        recorded += text.len();
                        let _ = record
                            .send(vec![(uri.clone(), json!({"type": "terminal/data", "data": text}))])
                            .await;
                    }
                }
                None => open = false,
            },
            done = child.wait(), if status.is_none() => {
                status = Some(done.ok());
                // What it started may hold its output open: end them too.
                signal_group(group, rustix::process::Signal::KILL);
            }
            () = &mut deadline, if status.is_none() => {
                note = Some(format!(
                    "\n[killed: it ran past the time limit of {} s]\n",
                    limits.timeout.as_secs()
                ));
                signal_group(group, rustix::process::Signal::KILL);
            }
            () = kill.notified(), if status.is_none() => {
                note = Some("\n[killed]\n".to_owned());
                signal_group(group, rustix::process::Signal::KILL);
            }
        }
    }
    let exit = exit_of(status.flatten());
    let mut closing = Vec::new();
    if let Some(note) = note {
        keep(&terminal, &note, new.keep_bytes.min(limits.output_bytes));
        closing.push((uri.clone(), json!({"type": "terminal/data", "data": note})));
    }
    let mut exited = json!({"type": "terminal/exited"});
    if let Some(code) = exit.code {
        exited["exitCode"] = json!(code);
    }
    closing.push((uri, exited));
    let _ = record.send(closing).await;
    let _ = exit_tx.send(Some(exit));
}

fn exit_of(status: Option<std::process::ExitStatus>) -> Exit {
    use std::os::unix::process::ExitStatusExt;
    match status {
        Some(status) => Exit {
            code: status.code(),
            signal: status.signal().map(|s| {
                rustix::process::Signal::from_named_raw(s)
                    .map(|n| format!("{n:?}"))
                    .unwrap_or_else(|| s.to_string())
            }),
        },
        None => Exit {
            code: None,
            signal: Some("SIGKILL".into()),
        },
    }
}

/// Appends to the output kept for the agent, dropping the oldest past
/// `limit` bytes (at a character boundary).
fn keep(terminal: &Terminal, text: &str, limit: usize) {
    let Ok(mut kept) = terminal.kept.lock() else {
        return;
    };
    kept.text.push_str(text);
    if kept.text.len() > limit {
        let mut cut = kept.text.len() - limit;
        while !kept.text.is_char_boundary(cut) {
            cut += 1;
        }
        kept.text.drain(..cut);
        kept.truncated = true;
    }
}
