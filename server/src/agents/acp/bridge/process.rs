//! An agent's process: started through the sandbox, its stderr copied to
//! the log, stopped (its whole process group) and reaped.

use std::path::PathBuf;

use tokio::io::AsyncBufReadExt;
use tokio::process::{Child, ChildStderr};

use super::super::AcpLimits;
use crate::agents::AgentCommand;
use crate::agents::sandbox::{Launch, Sandbox, signal_group};

/// Stderr lines of one process copied to the log; the rest are dropped.
const STDERR_LINES: usize = 2_000;

/// Starts the agent's process through the sandbox (environment, directory,
/// confinement) and copies its stderr to the log; the process and the
/// directory it runs in.
pub(super) fn start(
    command: &AgentCommand,
    scratch: &str,
    dirs: &[PathBuf],
    sandbox: &Sandbox,
) -> Result<(Child, PathBuf), String> {
    let started = sandbox.launch(&Launch {
        command,
        scratch,
        dirs,
    })?;
    let mut child = started.child;
    if let Some(stderr) = child.stderr.take() {
        tokio::spawn(copy_stderr(command.name.clone(), stderr));
    }
    Ok((child, started.cwd))
}

async fn copy_stderr(name: String, stderr: ChildStderr) {
    let mut lines = tokio::io::BufReader::new(stderr).lines();
    let mut copied = 0;
    while let Ok(Some(line)) = lines.next_line().await {
        if copied < STDERR_LINES {
            let line: String = line.chars().take(2_000).collect();
            tracing::info!(agent = %name, stderr = %line, "agent");
            copied += 1;
        }
    }
}

/// Stops the process group (TERM, then KILL after the grace period) and
/// reaps the child; its exit status, when it had one.
pub(super) async fn stop_child(
    child: &mut Child,
    pid: Option<u32>,
    limits: &AcpLimits,
) -> Option<String> {
    if let Ok(Some(status)) = child.try_wait() {
        signal_group(pid, rustix::process::Signal::KILL);
        return Some(describe(status));
    }
    signal_group(pid, rustix::process::Signal::TERM);
    let status = match tokio::time::timeout(limits.stop_grace, child.wait()).await {
        Ok(Ok(status)) => Some(status),
        _ => {
            signal_group(pid, rustix::process::Signal::KILL);
            let _ = child.kill().await;
            child.wait().await.ok()
        }
    };
    signal_group(pid, rustix::process::Signal::KILL);
    status.map(describe)
}

fn describe(status: std::process::ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(code), _) => format!("exited with status {code}"),
        (None, Some(signal)) => format!("killed by signal {signal}"),
        _ => "exited".to_owned(),
    }
}
