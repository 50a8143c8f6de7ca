//! How an agent process is started: its environment, its working
//! directory and its confinement (SECURITY.md, "Agents").
//!
//! * **Environment.** It starts empty. The host passes on a short
//!   allow-list of its own ([`PASSED_ENV`]: `PATH`, the locale, `TERM`,
//!   `TZ`, `USER`), sets `HOME` and `TMPDIR` to the agent's scratch
//!   directory, then adds what the agent's configuration gives it (its
//!   `env`, then its env files, read at each start). Nothing else of the
//!   server's environment (its secret, its database URL, other agents'
//!   keys) reaches it.
//! * **Directories.** It runs in its session's primary working directory,
//!   resolved (symlinks followed) and checked against the allowed roots at
//!   start, or in its scratch directory when the session has none.
//! * **Confinement** (Linux Landlock, on by default where the kernel has
//!   it). The agent may write only its session's working directories, its
//!   scratch directory and the agents file's `write` paths; it may read
//!   and run the system's directories ([`SYSTEM_READ`]), its own program
//!   and the absolute paths in its arguments (for a program inside
//!   `node_modules`, the folder holding that `node_modules`), and the
//!   agents file's `read` paths; nothing else: not Tether's database, not
//!   its secret files, not other sessions' directories. It cannot signal
//!   or trace processes outside its confinement. Everything it starts
//!   inherits the confinement. The network is not confined.
//!
//! Landlock restricts the thread that asks and what that thread starts, so
//! each agent is started from a thread of its own that confines itself
//! first ([`spawn_on_confined_thread`]); the server's other threads are
//! untouched and no `unsafe` code runs between fork and exec.

use std::path::{Path, PathBuf};
use std::process::Stdio;

use landlock::{
    ABI, Access, AccessFs, BitFlags, PathBeneath, PathFd, RestrictionStatus, Ruleset, RulesetAttr,
    RulesetCreatedAttr, RulesetStatus, Scope,
};
use tokio::process::Child;

use super::AgentCommand;

/// The Landlock ABI whose rights Tether asks for (file system rights up to
/// device ioctls, and the signal and abstract-socket scopes); a kernel
/// with less gets what it has ("best effort", reported by `tether doctor`).
const ABI_WANTED: ABI = ABI::V6;

/// Variables of the server's own environment an agent gets.
pub const PASSED_ENV: [&str; 9] = [
    "PATH",
    "LANG",
    "LANGUAGE",
    "LC_ALL",
    "LC_CTYPE",
    "LC_MESSAGES",
    "TERM",
    "TZ",
    "USER",
];

/// Directories an agent may read and run from: the system's programs,
/// libraries and configuration (those that exist here).
pub const SYSTEM_READ: [&str; 12] = [
    "/usr",
    "/bin",
    "/sbin",
    "/lib",
    "/lib32",
    "/lib64",
    "/libx32",
    "/etc",
    "/opt",
    "/nix/store",
    "/snap",
    // The resolver's file, where /etc/resolv.conf points on systemd hosts.
    "/run/systemd/resolve",
];

/// Directories an agent may read (not run from): the kernel's views of
/// itself and the process. Other processes' private files there are
/// guarded by Landlock's tracing restriction.
pub const SYSTEM_INFO: [&str; 2] = ["/proc", "/sys"];

/// Devices an agent may read, write and control (`/dev/null`, terminals,
/// random numbers).
pub const DEVICES: &str = "/dev";

/// Whether agents are confined.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum ConfinementMode {
    /// Confined where the kernel offers Landlock; elsewhere agents run
    /// unconfined and the server says so at start (and `tether doctor`).
    #[default]
    Auto,
    /// Confined, or not started at all.
    Require,
    /// Not confined (an explicit choice, logged at start).
    Off,
}

/// What the running kernel offers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Support {
    /// Landlock enforces everything Tether asks for.
    Full,
    /// Landlock enforces part of it (an older kernel).
    Partial,
    /// No Landlock here; the reason for people.
    None(String),
}

impl Support {
    /// Asks the kernel, on a thread that confines itself and ends.
    pub fn detect() -> Self {
        let probe = std::thread::spawn(|| -> Result<RestrictionStatus, String> {
            Ruleset::default()
                .handle_access(AccessFs::from_all(ABI_WANTED))
                .and_then(|r| r.scope(Scope::from_all(ABI_WANTED)))
                .and_then(|r| r.create())
                .and_then(|r| r.restrict_self())
                .map_err(|e| e.to_string())
        });
        match probe.join() {
            Ok(Ok(status)) => match status.ruleset {
                RulesetStatus::FullyEnforced => Support::Full,
                RulesetStatus::PartiallyEnforced => Support::Partial,
                RulesetStatus::NotEnforced => Support::None(format!(
                    "the kernel does not enforce Landlock ({:?})",
                    status.landlock
                )),
            },
            Ok(Err(err)) => Support::None(format!("Landlock refused a ruleset: {err}")),
            Err(_) => Support::None("the Landlock probe failed".to_owned()),
        }
    }

    /// Whether agents can be confined at all.
    pub fn enforced(&self) -> bool {
        !matches!(self, Support::None(_))
    }

    /// For logs and `tether doctor`.
    pub fn describe(&self) -> String {
        match self {
            Support::Full => "Landlock enforces it fully".to_owned(),
            Support::Partial => {
                "Landlock enforces it in part (an older kernel: some rights are not confined)"
                    .to_owned()
            }
            Support::None(reason) => reason.clone(),
        }
    }
}

/// How agent processes are to be started, as configured.
#[derive(Debug, Clone, Default)]
pub struct SandboxConfig {
    /// Whether they are confined.
    pub mode: ConfinementMode,
    /// Where scratch directories go; `None`: a folder of the system's
    /// temporary directory named after the host's database (its epoch), so
    /// two servers on one machine never share one.
    pub scratch_root: Option<PathBuf>,
    /// Files no agent may reach.
    pub protected: Vec<PathBuf>,
}

impl SandboxConfig {
    /// The sandbox of a host whose database has `epoch`.
    pub fn sandbox(&self, epoch: &str) -> Sandbox {
        let root = self
            .scratch_root
            .clone()
            .unwrap_or_else(|| std::env::temp_dir().join("tether-agents").join(epoch));
        Sandbox::new(self.mode, root, self.protected.clone())
    }
}

/// The scratch directory's name of agent `agent`'s start-up probe: `+` is
/// in no session id, so no session shares (or plants files in) it.
pub fn probe_scratch(agent: &str) -> String {
    format!("probe+{agent}")
}

/// What a scratch directory's name starts with (`s-<name>`).
const SCRATCH_PREFIX: &str = "s-";

/// How this host starts agent processes; cheap to clone.
#[derive(Debug, Clone)]
pub struct Sandbox {
    mode: ConfinementMode,
    support: Support,
    /// Where each session's scratch directory is made.
    scratch_root: PathBuf,
    /// Files no agent may reach: the database, the secret files, the
    /// agents file and env files.
    protected: Vec<PathBuf>,
}

impl Default for Sandbox {
    /// Confined where supported, scratch under the system's temporary
    /// directory, nothing named as protected.
    fn default() -> Self {
        Self::new(
            ConfinementMode::Auto,
            std::env::temp_dir().join("tether-agents"),
            Vec::new(),
        )
    }
}

/// One agent start.
#[derive(Debug)]
pub struct Launch<'a> {
    /// What to run.
    pub command: &'a AgentCommand,
    /// Its scratch directory's name (a session id, or `probe+<agent>`, [`probe_scratch`]).
    pub scratch: &'a str,
    /// The session's working directories, resolved, primary first.
    pub dirs: &'a [PathBuf],
}

/// What every start shares: the scratch directory, the environment and
/// the policy.
type Prepared = (PathBuf, Vec<(String, String)>, Policy);

/// A command run on an agent's behalf.
#[derive(Debug)]
pub struct Run<'a> {
    /// The program.
    pub program: &'a str,
    /// Its arguments.
    pub args: &'a [String],
    /// Variables on top of the agent's environment.
    pub env: &'a [(String, String)],
    /// Where it runs; `None`: the session's primary directory.
    pub cwd: Option<&'a Path>,
}

/// A started agent process.
#[derive(Debug)]
pub struct Started {
    /// The process, its stdio piped.
    pub child: Child,
    /// The directory it runs in (the session's primary working directory,
    /// or its scratch directory).
    pub cwd: PathBuf,
}

impl Sandbox {
    /// A sandbox in `mode`, asking the kernel what it offers now.
    pub fn new(mode: ConfinementMode, scratch_root: PathBuf, protected: Vec<PathBuf>) -> Self {
        let support = if mode == ConfinementMode::Off {
            Support::None("confinement is off (--agent-confinement off)".to_owned())
        } else {
            Support::detect()
        };
        Self {
            mode,
            support,
            scratch_root,
            protected: protected
                .into_iter()
                .map(|p| std::fs::canonicalize(&p).unwrap_or(p))
                .collect(),
        }
    }

    /// Removes a deleted session's scratch directory (its agent's HOME:
    /// histories, caches, logins), so a session made later with the same
    /// id, in any project, starts with none of it. Nothing when there is
    /// none on this host.
    pub fn remove_scratch(&self, session: &str) -> std::io::Result<()> {
        match std::fs::remove_dir_all(self.scratch_path(session)) {
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => Ok(()),
            removed => removed,
        }
    }

    /// Removes the scratch directories an older version's start-up probes
    /// made under a name a session could take, `probe-<agent>` (now
    /// `probe+<agent>`, [`probe_scratch`], a name no session can take),
    /// unless a session holds that id: a session made with it later would
    /// otherwise start in a HOME the probe (or an earlier holder of the
    /// name) filled. Run at start (`AppState::new`).
    pub async fn remove_legacy_probe_scratches(&self, store: &dyn crate::store::Store) {
        let legacy: Vec<String> = std::fs::read_dir(&self.scratch_root)
            .into_iter()
            .flatten()
            .flatten()
            .filter(|entry| entry.file_type().is_ok_and(|t| t.is_dir()))
            .filter_map(|entry| {
                let name = entry.file_name().into_string().ok()?;
                let id = name.strip_prefix(SCRATCH_PREFIX)?;
                id.starts_with("probe-").then(|| id.to_owned())
            })
            .collect();
        for id in legacy {
            match store.session(&id).await {
                Ok(None) => match self.remove_scratch(&id) {
                    Ok(()) => {
                        tracing::info!(scratch = %id, "removed an older version's probe scratch directory")
                    }
                    Err(err) => {
                        tracing::warn!(error = %err, scratch = %id, "cannot remove an older version's probe scratch directory")
                    }
                },
                Ok(Some(_)) => {}
                Err(err) => {
                    tracing::warn!(error = %err, scratch = %id, "cannot tell whether a session holds a probe scratch directory; left")
                }
            }
        }
    }

    /// The configured mode.
    pub fn mode(&self) -> ConfinementMode {
        self.mode
    }

    /// What the kernel offers.
    pub fn support(&self) -> &Support {
        &self.support
    }

    /// Whether agents started now are confined.
    pub fn confines(&self) -> bool {
        self.mode != ConfinementMode::Off && self.support.enforced()
    }

    /// Where scratch directories are made.
    pub fn scratch_root(&self) -> &Path {
        &self.scratch_root
    }

    /// Says at start-up how agents will run.
    pub fn log_start(&self) {
        match (self.mode, &self.support) {
            (ConfinementMode::Off, _) => tracing::warn!(
                "agent confinement is off (--agent-confinement off): agent processes can read \
                 and write whatever this server's user can"
            ),
            (_, Support::None(reason)) if self.mode == ConfinementMode::Require => tracing::error!(
                %reason,
                "agent confinement is required but not available: ACP agents will not start"
            ),
            (_, Support::None(reason)) => tracing::warn!(
                %reason,
                "agent confinement is not available on this kernel: agent processes run \
                 unconfined (--agent-confinement require refuses to start them instead)"
            ),
            (_, support) => tracing::info!(
                support = %support.describe(),
                scratch = %self.scratch_root.display(),
                "agent processes are confined with Landlock"
            ),
        }
    }

    /// Starts an agent: its environment, directory and confinement as the
    /// module's doc says. Refuses (with a reason a person can act on)
    /// when confinement is required and unavailable, or when what the
    /// agent would be given reaches a protected file.
    pub fn launch(&self, launch: &Launch<'_>) -> Result<Started, String> {
        let command = launch.command;
        let (scratch, env, policy) = self.prepare(launch)?;
        let cwd = launch
            .dirs
            .first()
            .cloned()
            .unwrap_or_else(|| scratch.clone());
        let mut process = tokio::process::Command::new(&command.program);
        process.args(&command.args).env_clear().envs(env);
        let child = self.spawn(process, &cwd, policy).map_err(|e| {
            format!(
                "cannot start agent {} ({}): {e}",
                command.name,
                command.display()
            )
        })?;
        Ok(Started { child, cwd })
    }

    /// Stops what a server of this scratch root that is gone left
    /// running ([`super::left_running`]); returns how many processes.
    pub fn stop_left_running(&self) -> usize {
        super::left_running::stop(&self.scratch_root)
    }

    /// Starts a command on an agent's behalf (a terminal): with the
    /// agent's environment (and `run.env` on top) and its confinement, in
    /// `run.cwd`, which must be inside the session's directories or its
    /// scratch directory.
    pub fn run(&self, launch: &Launch<'_>, run: &Run<'_>) -> Result<Child, String> {
        let (scratch, mut env, policy) = self.prepare(launch)?;
        let mut places = launch.dirs.to_vec();
        places.push(scratch.clone());
        let cwd = match run.cwd {
            None => launch.dirs.first().cloned().unwrap_or(scratch),
            Some(cwd) => {
                let resolved = std::fs::canonicalize(cwd)
                    .map_err(|e| format!("{} cannot be used: {e}", cwd.display()))?;
                if !places.iter().any(|p| resolved.starts_with(p)) || !resolved.is_dir() {
                    return Err(format!(
                        "{} is not a directory of this session; commands run in the session's \
                         working directories",
                        cwd.display()
                    ));
                }
                resolved
            }
        };
        env.extend(run.env.iter().cloned());
        let mut process = tokio::process::Command::new(run.program);
        process.args(run.args).env_clear().envs(env);
        self.spawn(process, &cwd, policy)
            .map_err(|e| format!("cannot run {}: {e}", run.program))
    }

    /// What every start shares: the refusal when confinement is required
    /// and missing, the scratch directory, the environment, and the
    /// policy (checked against the protected files).
    fn prepare(&self, launch: &Launch<'_>) -> Result<Prepared, String> {
        if self.mode == ConfinementMode::Require && !self.support.enforced() {
            return Err(format!(
                "agent confinement is required (--agent-confinement require) but not available: \
                 {}",
                self.support.describe()
            ));
        }
        let scratch = self.scratch_dir(launch.scratch)?;
        let env = environment(launch.command, &scratch)?;
        let policy = Policy::of(launch.command, &env, launch.dirs, &scratch);
        self.check_protected(&policy)?;
        Ok((scratch, env, policy))
    }

    /// Spawns `process` in `cwd` with its stdio piped, in its own process
    /// group (stopping it stops what it started: `npx` runs the agent as a
    /// grandchild), confined to `policy` when confinement is on.
    fn spawn(
        &self,
        mut process: tokio::process::Command,
        cwd: &Path,
        policy: Policy,
    ) -> Result<Child, String> {
        process
            .current_dir(cwd)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .process_group(0);
        if let Some(marker) = super::left_running::marker(&self.scratch_root) {
            // Last, so neither the agent's nor a command's own variables
            // replace it.
            process.env(super::left_running::STARTED_BY, marker);
        }
        let confined = self.confines().then_some(policy);
        let child = spawn_on_confined_thread(process, confined)?;
        if let Some(pid) = child.id() {
            // It leads its group: written down, the group is stopped after
            // a crash even where its processes clear their environment.
            super::left_running::record(&self.scratch_root, pid);
        }
        Ok(child)
    }

    /// Where scratch directory `name` is: `s-<name>`. Session ids are
    /// `[A-Za-z0-9._:-]`: the prefix keeps `.` and `..` ordinary names,
    /// and a name with any other character (a probe's, [`probe_scratch`])
    /// is no session's.
    fn scratch_path(&self, name: &str) -> PathBuf {
        self.scratch_root.join(format!("{SCRATCH_PREFIX}{name}"))
    }

    /// The scratch directory `name` (made, private to this user, if new).
    fn scratch_dir(&self, name: &str) -> Result<PathBuf, String> {
        use std::os::unix::fs::DirBuilderExt;
        let dir = self.scratch_path(name);
        for path in [&self.scratch_root, &dir, &dir.join("tmp")] {
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(path)
                .map_err(|e| {
                    format!("cannot make the scratch directory {}: {e}", path.display())
                })?;
        }
        std::fs::canonicalize(&dir).map_err(|e| format!("scratch directory {}: {e}", dir.display()))
    }

    /// Refuses a policy that would let the agent reach a protected file.
    fn check_protected(&self, policy: &Policy) -> Result<(), String> {
        for protected in &self.protected {
            if let Some((granted, _)) = policy
                .grants
                .iter()
                .find(|(granted, _)| protected.starts_with(granted))
            {
                return Err(format!(
                    "{} lies inside {}, which the agent would be allowed to reach; move Tether's \
                     data and secret files out of the agent's directories (and out of the \
                     system directories it may read)",
                    protected.display(),
                    granted.display()
                ));
            }
        }
        Ok(())
    }

    /// Every path an agent of `command` may reach whatever its session:
    /// for `tether doctor` to check against the protected files.
    pub fn static_grants(&self, command: &AgentCommand) -> Vec<PathBuf> {
        let env = environment(command, &self.scratch_root).unwrap_or_default();
        Policy::of(command, &env, &[], &self.scratch_root)
            .grants
            .into_iter()
            .map(|(path, _)| path)
            .filter(|path| path != &self.scratch_root)
            .collect()
    }

    /// The protected files, resolved.
    pub fn protected(&self) -> &[PathBuf] {
        &self.protected
    }
}

/// The agent's environment (see the module's doc).
fn environment(command: &AgentCommand, scratch: &Path) -> Result<Vec<(String, String)>, String> {
    let mut env: Vec<(String, String)> = PASSED_ENV
        .iter()
        .filter_map(|key| std::env::var(key).ok().map(|v| ((*key).to_owned(), v)))
        .collect();
    env.push(("HOME".to_owned(), scratch.display().to_string()));
    env.push((
        "TMPDIR".to_owned(),
        scratch.join("tmp").display().to_string(),
    ));
    env.extend(command.env.iter().cloned());
    env.extend(command.file_env()?);
    // Later entries win, as in a shell.
    let mut seen = std::collections::HashSet::new();
    let mut unique: Vec<(String, String)> = env
        .into_iter()
        .rev()
        .filter(|(key, _)| seen.insert(key.clone()))
        .collect();
    unique.reverse();
    Ok(unique)
}

/// What one agent may reach: each path with its rights.
#[derive(Debug, Clone)]
struct Policy {
    grants: Vec<(PathBuf, BitFlags<AccessFs>)>,
}

impl Policy {
    fn of(
        command: &AgentCommand,
        env: &[(String, String)],
        dirs: &[PathBuf],
        scratch: &Path,
    ) -> Self {
        let read = AccessFs::from_read(ABI_WANTED);
        let all = AccessFs::from_all(ABI_WANTED);
        let info = AccessFs::ReadFile | AccessFs::ReadDir;
        let devices = info | AccessFs::WriteFile | AccessFs::IoctlDev;
        let mut grants: Vec<(PathBuf, BitFlags<AccessFs>)> = Vec::new();
        let mut grant = |path: PathBuf, access: BitFlags<AccessFs>| {
            if let Ok(path) = std::fs::canonicalize(&path) {
                grants.push((path, access));
            }
        };
        for dir in SYSTEM_READ {
            grant(dir.into(), read);
        }
        for dir in SYSTEM_INFO {
            grant(dir.into(), info);
        }
        grant(DEVICES.into(), devices);
        let path = env
            .iter()
            .rev()
            .find(|(k, _)| k == "PATH")
            .map(|(_, v)| v.as_str());
        if let Some(program) = find_program(&command.program, path) {
            grant(own_files(&program), read);
        }
        // This program, which agents run as their stdio MCP bridge.
        if let Ok(me) = std::env::current_exe() {
            grant(me, read);
        }
        for arg in command.args.iter().map(Path::new) {
            if arg.is_absolute() && arg.exists() {
                grant(own_files(arg), read);
            }
        }
        for path in &command.read {
            grant(path.clone(), read);
        }
        for path in command.write.iter().chain(dirs) {
            grant(path.clone(), all);
        }
        grant(scratch.to_path_buf(), all);
        Self { grants }
    }

    /// Confines the calling thread (and what it starts) to this policy.
    fn restrict_this_thread(&self) -> Result<RestrictionStatus, String> {
        let rules = self.grants.iter().filter_map(|(path, access)| {
            let fd = PathFd::new(path).ok()?;
            let access = if path.is_dir() {
                *access
            } else {
                *access & AccessFs::from_file(ABI_WANTED)
            };
            Some(PathBeneath::new(fd, access))
        });
        Ruleset::default()
            .handle_access(AccessFs::from_all(ABI_WANTED))
            .and_then(|r| r.scope(Scope::from_all(ABI_WANTED)))
            .and_then(|r| r.create())
            .and_then(|r| r.add_rules(rules.map(Ok::<_, landlock::RulesetError>)))
            .and_then(|r| r.restrict_self())
            .map_err(|e| format!("cannot confine it: {e}"))
    }
}

/// The file a command runs: the path given, or the first executable file
/// of that name on `path`; resolved.
fn find_program(program: &str, path: Option<&str>) -> Option<PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    let candidates: Vec<PathBuf> = if program.contains('/') {
        vec![PathBuf::from(program)]
    } else {
        path.unwrap_or_default()
            .split(':')
            .filter(|dir| !dir.is_empty())
            .map(|dir| Path::new(dir).join(program))
            .collect()
    };
    candidates.into_iter().find_map(|candidate| {
        let resolved = std::fs::canonicalize(&candidate).ok()?;
        let meta = std::fs::metadata(&resolved).ok()?;
        (meta.is_file() && meta.permissions().mode() & 0o111 != 0).then_some(resolved)
    })
}

/// What an agent may read for a file it runs or names: the file (or
/// folder) itself, or, inside a `node_modules`, the folder holding the
/// outermost `node_modules` (a package needs its dependencies).
fn own_files(path: &Path) -> PathBuf {
    let resolved = std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf());
    resolved
        .ancestors()
        .filter(|a| a.file_name().is_some_and(|n| n == "node_modules"))
        .last()
        .and_then(Path::parent)
        .map_or(resolved.clone(), Path::to_path_buf)
}

/// Sends `signal` to the process group `pid` leads (every process started
/// through the sandbox leads its own).
pub fn signal_group(pid: Option<u32>, signal: rustix::process::Signal) {
    if let Some(pid) = pid
        .and_then(|p| i32::try_from(p).ok())
        .and_then(rustix::process::Pid::from_raw)
    {
        let _ = rustix::process::kill_process_group(pid, signal);
    }
}

/// Spawns `process` from a new thread that first confines itself to
/// `policy` (when given): the child inherits the confinement, the rest of
/// the server does not. The thread enters the current Tokio runtime so the
/// child's pipes are registered with it.
fn spawn_on_confined_thread(
    mut process: tokio::process::Command,
    policy: Option<Policy>,
) -> Result<Child, String> {
    let runtime = tokio::runtime::Handle::current();
    let spawner = std::thread::Builder::new()
        .name("tether-agent-start".to_owned())
        .spawn(move || {
            let _entered = runtime.enter();
            if let Some(policy) = &policy {
                let status = policy.restrict_this_thread()?;
                if status.ruleset == RulesetStatus::NotEnforced {
                    return Err("the kernel did not enforce its confinement".to_owned());
                }
            }
            process.spawn().map_err(|e| e.to_string())
        })
        .map_err(|e| format!("cannot start a thread to launch it: {e}"))?;
    spawner
        .join()
        .map_err(|_| "the thread launching it failed".to_owned())?
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_environment_is_the_allow_list_the_scratch_and_the_agents_own() {
        let agent = AgentCommand::parse("a=KEY=v PATH=/only prog").unwrap();
        let env = environment(&agent, Path::new("/scratch")).unwrap();
        let get = |k: &str| {
            env.iter()
                .find(|(key, _)| key == k)
                .map(|(_, v)| v.as_str())
        };
        assert_eq!(get("KEY"), Some("v"));
        assert_eq!(get("PATH"), Some("/only"));
        assert_eq!(get("HOME"), Some("/scratch"));
        assert_eq!(get("TMPDIR"), Some("/scratch/tmp"));
        assert_eq!(env.iter().filter(|(k, _)| k == "PATH").count(), 1);
        for (key, _) in &env {
            assert!(
                PASSED_ENV.contains(&key.as_str())
                    || ["HOME", "TMPDIR", "KEY"].contains(&key.as_str()),
                "{key} leaked into the agent's environment"
            );
        }
    }

    #[test]
    fn a_program_in_node_modules_may_read_its_package_folder() {
        let dir = tempfile::tempdir().unwrap();
        let bin = dir
            .path()
            .join("pkg/node_modules/tool/node_modules/dep/bin.js");
        std::fs::create_dir_all(bin.parent().unwrap()).unwrap();
        std::fs::write(&bin, "").unwrap();
        let root = std::fs::canonicalize(dir.path().join("pkg")).unwrap();
        assert_eq!(own_files(&bin), root);
        let plain = dir.path().join("agent");
        std::fs::write(&plain, "").unwrap();
        assert_eq!(own_files(&plain), std::fs::canonicalize(&plain).unwrap());
    }
}
