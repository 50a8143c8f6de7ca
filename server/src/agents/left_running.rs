//! What a killed server left running: every process the sandbox starts
//! (an agent, a terminal's command) carries its server in [`STARTED_BY`],
//! and what those start inherits it. A server killed outright (SIGKILL,
//! the OOM killer) cannot stop them; the next server on the same scratch
//! root finds them by that variable and kills them.
//!
//! Only what is surely the gone server's is touched: a process of this
//! user, in the session (`setsid`) its server ran in, so a daemon that
//! detached (a tmux server, a gpg-agent started by `git commit -S`) is
//! left alone; whose server ran in this pid namespace and no longer runs
//! (a reused pid does not count as the server: its start time must
//! match); never this server nor its ancestors. Each is stopped (SIGSTOP,
//! through a pidfd, so a pid reused meanwhile is never signalled) until a
//! scan finds none new, so none forks past the scan, then all are killed.
//!
//! A process that clears its environment, or writes its title over it
//! (as postgres and nginx do), escapes this; one that claims another
//! server's variable only makes itself stoppable.

use std::collections::{HashMap, HashSet};
use std::ffi::OsString;
use std::os::fd::OwnedFd;
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use rustix::process::{Pid, PidfdFlags, Signal, pidfd_open, pidfd_send_signal};

/// The variable naming the server that started a process:
/// `SERVER_PID SERVER_START SESSION PID_NAMESPACE SCRATCH_ROOT` (the
/// start time in clock ticks since boot, `/proc/PID/stat`'s 22nd field;
/// the session id its 6th; the namespace as `/proc/self/ns/pid` names it;
/// the scratch root resolved, last, as it may hold spaces). Not named
/// `TETHER_…`: no variable of the server's own configuration reaches an
/// agent, and none is named like one.
pub const STARTED_BY: &str = "STARTED_BY_AHP_HOST";

/// Scans of `/proc` at most: each stops what it found, so a process that
/// forks cannot outrun them for long.
const SCANS: usize = 20;

/// The value of [`STARTED_BY`] for processes this server starts on
/// `scratch_root`; `None` where `/proc` cannot say (nothing is marked).
pub fn marker(scratch_root: &Path) -> Option<OsString> {
    let me = std::process::id();
    let stat = Stat::of(me)?;
    let root = std::fs::canonicalize(scratch_root).ok()?;
    let mut value =
        format!("{me} {} {} {} ", stat.start, stat.session, pid_namespace()?).into_bytes();
    value.extend_from_slice(root.as_os_str().as_bytes());
    Some(OsString::from_vec(value))
}

/// Stops what a server of `scratch_root` that is gone left running (see
/// the module's doc); returns how many processes were killed.
pub fn stop(scratch_root: &Path) -> usize {
    let (Ok(root), Some(namespace)) = (std::fs::canonicalize(scratch_root), pid_namespace()) else {
        // No root yet: no server used it.
        return 0;
    };
    let me = std::process::id();
    let spared = ancestors(me);
    let uid = rustix::process::getuid().as_raw();
    let mut held: HashMap<u32, (OwnedFd, String)> = HashMap::new();
    for _ in 0..SCANS {
        let Ok(entries) = std::fs::read_dir("/proc") else {
            break;
        };
        let mut found = 0;
        for pid in entries.flatten().filter_map(|entry| {
            entry
                .file_name()
                .to_str()
                .and_then(|name| name.parse::<u32>().ok())
        }) {
            if held.contains_key(&pid) || spared.contains(&pid) {
                continue;
            }
            let ours = std::fs::metadata(format!("/proc/{pid}")).is_ok_and(|m| m.uid() == uid);
            let Some(raw) = ours.then(|| Pid::from_raw(pid as i32)).flatten() else {
                continue;
            };
            // Opened before it is read: the signal goes to the process
            // read, or, were it gone meanwhile, to none.
            let Ok(fd) = pidfd_open(raw, PidfdFlags::empty()) else {
                continue;
            };
            if left_by_a_server_gone(pid, &root, &namespace)
                && pidfd_send_signal(&fd, Signal::STOP).is_ok()
            {
                let name = std::fs::read_to_string(format!("/proc/{pid}/comm"))
                    .map(|name| name.trim_end().to_owned())
                    .unwrap_or_default();
                held.insert(pid, (fd, name));
                found += 1;
            }
        }
        if found == 0 {
            break;
        }
    }
    for (pid, (fd, name)) in &held {
        let _ = pidfd_send_signal(fd, Signal::KILL);
        tracing::warn!(
            pid,
            process = %name,
            "stopped a process (an agent, or what it ran) a server that is gone left running"
        );
    }
    held.len()
}

/// Whether process `pid` carries a [`STARTED_BY`] of a server of `root`,
/// in this pid namespace, that no longer runs, and is still in the
/// session that server ran in.
fn left_by_a_server_gone(pid: u32, root: &Path, namespace: &str) -> bool {
    let Ok(environ) = std::fs::read(format!("/proc/{pid}/environ")) else {
        return false;
    };
    let prefix = format!("{STARTED_BY}=");
    let Some(value) = environ
        .split(|b| *b == 0)
        .find_map(|var| var.strip_prefix(prefix.as_bytes()))
    else {
        return false;
    };
    let mut parts = value.splitn(5, |b| *b == b' ');
    let mut number = || {
        parts
            .next()
            .and_then(|p| std::str::from_utf8(p).ok())
            .and_then(|p| p.parse::<u64>().ok())
    };
    let (Some(server), Some(start), Some(session)) = (number(), number(), number()) else {
        return false;
    };
    let (Some(its_namespace), Some(its_root)) = (parts.next(), parts.next()) else {
        return false;
    };
    its_root == root.as_os_str().as_bytes()
        && its_namespace == namespace.as_bytes()
        && Stat::of(pid).is_some_and(|stat| stat.session == session)
        && u32::try_from(server)
            .ok()
            .and_then(Stat::of)
            .is_none_or(|stat| stat.start != start)
}

/// What `/proc/PID/stat` says of a process.
#[derive(Debug, Clone, Copy)]
struct Stat {
    parent: u32,
    session: u64,
    start: u64,
}

impl Stat {
    /// Process `pid`'s, if it runs (a zombie's too).
    fn of(pid: u32) -> Option<Self> {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        // After the command's name, which may hold spaces and parentheses:
        // the state is the 3rd field, the parent the 4th, the session the
        // 6th, the start time the 22nd.
        let (_, fields) = stat.rsplit_once(')')?;
        let fields: Vec<&str> = fields.split_whitespace().collect();
        Some(Self {
            parent: fields.get(1)?.parse().ok()?,
            session: fields.get(3)?.parse().ok()?,
            start: fields.get(19)?.parse().ok()?,
        })
    }
}

/// This process's pid namespace, as `/proc/self/ns/pid` names it.
fn pid_namespace() -> Option<String> {
    std::fs::read_link("/proc/self/ns/pid")
        .ok()
        .map(|link| link.to_string_lossy().into_owned())
}

/// `pid` and its ancestors: a server started from a command another
/// server ran inherits its variable, and must not stop what started it.
fn ancestors(pid: u32) -> HashSet<u32> {
    let mut seen = HashSet::from([pid]);
    let mut at = pid;
    while let Some(parent) = Stat::of(at).map(|stat| stat.parent) {
        if parent == 0 || !seen.insert(parent) {
            break;
        }
        at = parent;
    }
    seen
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::process::ExitStatusExt;

    /// A child killed when the test ends, however it ends.
    struct Reaped(std::process::Child);

    impl Drop for Reaped {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }

    #[test]
    fn a_start_stops_what_a_gone_server_of_its_scratch_root_left_running() {
        let root = tempfile::tempdir().unwrap();
        let other = tempfile::tempdir().unwrap();
        let mine = marker(root.path()).unwrap().into_vec();
        let text = String::from_utf8(mine.clone()).unwrap();
        let [me, start, session, namespace, _] = text.splitn(5, ' ').collect::<Vec<_>>()[..] else {
            panic!("{text}");
        };
        let start: u64 = start.parse().unwrap();
        let here = root.path().canonicalize().unwrap();
        let spawn = |value: String, detach: bool| {
            // `setsid` runs it in a session of its own, as a daemon does.
            let mut command = std::process::Command::new(if detach { "setsid" } else { "sleep" });
            if detach {
                command.arg("sleep");
            }
            let child = command.arg("60").env(STARTED_BY, value).spawn().unwrap();
            // Until it is `sleep` (its own environment) in its session.
            let pid = child.id();
            for _ in 0..400 {
                let named = std::fs::read_to_string(format!("/proc/{pid}/comm"))
                    .is_ok_and(|name| name.trim_end() == "sleep");
                let own =
                    Stat::of(pid).is_some_and(|stat| (stat.session == u64::from(pid)) == detach);
                if named && own {
                    break;
                }
                std::thread::sleep(std::time::Duration::from_millis(5));
            }
            Reaped(child)
        };
        let gone = |root: &Path| {
            format!(
                "{me} {} {session} {namespace} {}",
                start + 1,
                root.display()
            )
        };
        // A server that is gone: this pid, but not this start.
        let mut left = spawn(gone(&here), false);
        // This server (it runs), another root's gone server, a daemon that
        // detached from the gone server's session, another namespace's.
        let kept = [
            spawn(text.clone(), false),
            spawn(gone(&other.path().canonicalize().unwrap()), false),
            spawn(gone(&here), true),
            spawn(gone(&here).replace(namespace, "pid:[1]"), false),
        ];
        assert_eq!(stop(root.path()), 1);
        assert_eq!(left.0.wait().unwrap().signal(), Some(9));
        for mut child in kept {
            assert!(
                child.0.try_wait().unwrap().is_none(),
                "{:?} was kept",
                child.0.id()
            );
        }
    }
}
