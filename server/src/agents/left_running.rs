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
//! (as postgres and nginx do), loses the variable, but not its process
//! group: every process the sandbox starts leads a group of its own, and
//! the server writes the groups it started to a file in the scratch root
//! ([`record`]). The next server stops every process of a group a gone
//! server recorded, whatever its environment, as long as the group can be
//! only that one: its leader still the process recorded, or gone (the
//! kernel does not give a group's id to a new process while the group has
//! a member). What leaves the group (`setsid`, `setpgid`) and clears its
//! environment escapes; one that claims another server's variable only
//! makes itself stoppable.

use std::collections::{HashMap, HashSet};
use std::ffi::OsString;
use std::os::fd::OwnedFd;
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

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

/// The file of a scratch root naming the process groups a server started:
/// `.groups-SERVER_PID-SERVER_START`, its first line the server's pid
/// namespace, then a line `GROUP LEADER_START` for each group.
const GROUPS_FILE: &str = ".groups-";

/// Groups recorded past this many, the file keeps only those that still
/// have a member.
const GROUPS_KEPT: usize = 256;

/// A process group this server started: its id and its leader's start.
type Group = (u32, u64);

/// The groups this server started, by scratch root.
static GROUPS: Mutex<Vec<(PathBuf, Vec<Group>)>> = Mutex::new(Vec::new());

/// Writes down that this server started process `pid`, the leader of a
/// process group of its own, on `scratch_root` (see the module's doc). A
/// failure is logged: the process still carries [`STARTED_BY`].
pub fn record(scratch_root: &Path, pid: u32) {
    let (Some(me), Some(namespace), Some(leader)) =
        (Stat::of(std::process::id()), pid_namespace(), Stat::of(pid))
    else {
        return;
    };
    let mut all = GROUPS.lock().unwrap_or_else(|e| e.into_inner());
    let at = match all.iter().position(|(root, _)| root == scratch_root) {
        Some(at) => at,
        None => {
            all.push((scratch_root.to_path_buf(), Vec::new()));
            all.len() - 1
        }
    };
    let groups = &mut all[at].1;
    groups.push((pid, leader.start));
    if groups.len() > GROUPS_KEPT {
        let living = groups_with_members();
        groups.retain(|(group, _)| living.contains(group));
    }
    let mut text = format!("{namespace}\n");
    for (group, start) in groups.iter() {
        text.push_str(&format!("{group} {start}\n"));
    }
    let name = format!("{GROUPS_FILE}{}-{}", std::process::id(), me.start);
    let path = scratch_root.join(&name);
    // Whole or not at all: written aside, then renamed over the last.
    let new = scratch_root.join(format!("{name}.new"));
    let written = std::fs::write(&new, text).and_then(|()| std::fs::rename(&new, &path));
    if let Err(err) = written {
        tracing::warn!(error = %err, file = %path.display(), "cannot write down the process groups this server started; one whose processes clear their environment cannot be stopped after a crash");
    }
}

/// The process groups of a gone server of `root` in `namespace` that can
/// be only its own (see the module's doc), and the files that named them.
fn groups_left(root: &Path, namespace: &str) -> (HashSet<u32>, Vec<PathBuf>) {
    let mut left = HashSet::new();
    let mut files = Vec::new();
    let Ok(entries) = std::fs::read_dir(root) else {
        return (left, files);
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some((server, start)) = name
            .to_str()
            .and_then(|name| name.strip_prefix(GROUPS_FILE))
            .and_then(|rest| pid_and_start(rest, '-'))
        else {
            continue;
        };
        if Stat::of(server).is_some_and(|stat| stat.start == start) {
            // Its server runs.
            continue;
        }
        let Ok(text) = std::fs::read_to_string(entry.path()) else {
            continue;
        };
        let mut lines = text.lines();
        if lines.next() != Some(namespace) {
            continue;
        }
        files.push(entry.path());
        for line in lines {
            let Some((group, start)) = pid_and_start(line, ' ') else {
                continue;
            };
            // Its leader is the process recorded, or gone: then no other
            // group can have its id while one of its members lives.
            if Stat::of(group).is_none_or(|stat| stat.start == start) {
                left.insert(group);
            }
        }
    }
    (left, files)
}

/// `PID<separator>START`, as the groups files write a process.
fn pid_and_start(text: &str, separator: char) -> Option<(u32, u64)> {
    let (pid, start) = text.split_once(separator)?;
    Some((pid.parse().ok()?, start.parse().ok()?))
}

/// The process groups with a member now.
fn groups_with_members() -> HashSet<u32> {
    pids()
        .filter_map(|pid| Stat::of(pid).map(|stat| stat.group))
        .collect()
}

/// The processes `/proc` lists now (none when it cannot be read).
fn pids() -> impl Iterator<Item = u32> {
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|entry| entry.file_name().to_str()?.parse::<u32>().ok())
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
    let (groups, files) = groups_left(&root, &namespace);
    let mut held: HashMap<u32, (OwnedFd, String)> = HashMap::new();
    for _ in 0..SCANS {
        let mut found = 0;
        for pid in pids() {
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
            let in_a_group_left = || {
                !groups.is_empty() && Stat::of(pid).is_some_and(|stat| groups.contains(&stat.group))
            };
            if (left_by_a_server_gone(pid, &root, &namespace) || in_a_group_left())
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
    for file in files {
        let _ = std::fs::remove_file(file);
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
    /// Its process group.
    group: u32,
    session: u64,
    start: u64,
}

impl Stat {
    /// Process `pid`'s, if it runs (a zombie's too).
    fn of(pid: u32) -> Option<Self> {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        // After the command's name, which may hold spaces and parentheses:
        // the state is the 3rd field, the parent the 4th, the group the
        // 5th, the session the 6th, the start time the 22nd.
        let (_, fields) = stat.rsplit_once(')')?;
        let fields: Vec<&str> = fields.split_whitespace().collect();
        Some(Self {
            parent: fields.get(1)?.parse().ok()?,
            group: fields.get(2)?.parse().ok()?,
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

    /// A group of its own whose shell starts `sleep 60` with an empty
    /// environment and prints its pid: (the shell, the sleep's pid).
    fn group_with_a_cleared_child(shell_stays: bool) -> (Reaped, u32) {
        use std::io::BufRead;
        use std::os::unix::process::CommandExt;
        let script = if shell_stays {
            "env -i sleep 60 & echo $!; wait"
        } else {
            "env -i sleep 60 & echo $!"
        };
        let mut child = std::process::Command::new("sh")
            .args(["-c", script])
            .stdout(std::process::Stdio::piped())
            .process_group(0)
            .spawn()
            .unwrap();
        let mut line = String::new();
        std::io::BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let sleep: u32 = line.trim().parse().unwrap();
        // Until it is `sleep`, with the environment it cleared.
        for _ in 0..400 {
            if std::fs::read_to_string(format!("/proc/{sleep}/comm"))
                .is_ok_and(|name| name.trim_end() == "sleep")
            {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        if !shell_stays {
            child.wait().unwrap();
        }
        (Reaped(child), sleep)
    }

    fn alive(pid: u32) -> bool {
        // A killed child of another process is a zombie until reaped.
        std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
            !stat
                .rsplit_once(')')
                .is_some_and(|(_, f)| f.trim_start().starts_with('Z'))
        })
    }

    /// What clears its environment is found by its group: a gone server's
    /// recorded group is stopped whether its leader lives or is gone, and
    /// not when its id is another process's now, nor when its server runs.
    #[test]
    fn a_gone_servers_groups_are_stopped_though_their_processes_cleared_their_environment() {
        let root = tempfile::tempdir().unwrap();
        let me = std::process::id();
        let start = Stat::of(me).unwrap().start;
        let namespace = pid_namespace().unwrap();
        let (mut led, led_sleep) = group_with_a_cleared_child(true);
        let (_orphaned, orphan_sleep) = group_with_a_cleared_child(false);
        let (_other, other_sleep) = group_with_a_cleared_child(true);
        let (_running, running_sleep) = group_with_a_cleared_child(true);
        let led_start = Stat::of(led.0.id()).unwrap().start;
        let other_group = _other.0.id();
        let gone_file = format!(
            "{namespace}\n{} {led_start}\n{} 7\n{other_group} {}\n",
            led.0.id(),
            _orphaned.0.id(),
            // Not its leader's start: its id is another process's now.
            Stat::of(other_group).unwrap().start + 1,
        );
        // A gone server: this pid, not this start.
        std::fs::write(
            root.path().join(format!("{GROUPS_FILE}{me}-{}", start + 1)),
            gone_file,
        )
        .unwrap();
        // This server, which runs.
        std::fs::write(
            root.path().join(format!("{GROUPS_FILE}{me}-{start}")),
            format!("{namespace}\n{} 0\n", _running.0.id()),
        )
        .unwrap();
        for pid in [led_sleep, orphan_sleep, other_sleep, running_sleep] {
            assert!(alive(pid), "{pid} runs");
        }
        assert_eq!(stop(root.path()), 3, "the leader and two cleared sleeps");
        assert_eq!(led.0.wait().unwrap().signal(), Some(9));
        for _ in 0..400 {
            if !alive(led_sleep) && !alive(orphan_sleep) {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        assert!(
            !alive(led_sleep),
            "the live leader's cleared sleep was stopped"
        );
        assert!(
            !alive(orphan_sleep),
            "the gone leader's cleared sleep was stopped"
        );
        assert!(
            alive(other_sleep),
            "a group whose id is another's now is kept"
        );
        assert!(alive(running_sleep), "a running server's group is kept");
        assert!(
            !root
                .path()
                .join(format!("{GROUPS_FILE}{me}-{}", start + 1))
                .exists(),
            "the gone server's file is done with"
        );
        for pid in [other_sleep, running_sleep] {
            let _ = rustix::process::kill_process(Pid::from_raw(pid as i32).unwrap(), Signal::KILL);
        }
    }

    /// A server's own file names the groups it started, pruned to those
    /// with a member once it holds more than it keeps.
    #[test]
    fn a_server_writes_down_the_groups_it_starts() {
        let root = tempfile::tempdir().unwrap();
        let (leader, sleep) = group_with_a_cleared_child(true);
        record(root.path(), leader.0.id());
        let me = std::process::id();
        let file = root
            .path()
            .join(format!("{GROUPS_FILE}{me}-{}", Stat::of(me).unwrap().start));
        let text = std::fs::read_to_string(&file).unwrap();
        let start = Stat::of(leader.0.id()).unwrap().start;
        assert_eq!(
            text,
            format!("{}\n{} {start}\n", pid_namespace().unwrap(), leader.0.id())
        );
        // Groups long gone (this test's own pid leads none) are pruned.
        for _ in 0..GROUPS_KEPT {
            record(root.path(), me);
        }
        let text = std::fs::read_to_string(&file).unwrap();
        assert!(
            text.contains(&format!("\n{} {start}\n", leader.0.id())),
            "{text}"
        );
        assert!(text.lines().count() < GROUPS_KEPT, "pruned: {text}");
        drop(leader);
        let _ = rustix::process::kill_process(Pid::from_raw(sleep as i32).unwrap(), Signal::KILL);
    }
}
