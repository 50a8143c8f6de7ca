//! `tether doctor`: checks what `tether serve` would run with, the same
//! flags and environment, without serving or changing anything, and says
//! in plain words what is wrong. It exits non-zero when any check fails.
//!
//! Checked: the configuration as a whole, the auth secret's strength, the
//! bind address, the store (reachable, migrations, free disk), the allowed
//! roots, agent confinement (Landlock here, and whether any agent could
//! reach Tether's data or secret files), every configured ACP agent (it
//! starts, confined, and answers `initialize`), the clock, and the
//! open-file limit.

mod store;

use std::fmt;
use std::process::ExitCode;

use crate::agents::sandbox::Sandbox;
use crate::config::{EffectsConfig, ServeArgs, ServeConfig};

/// How a check came out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Fine.
    Ok,
    /// Works, but an operator should know.
    Warn,
    /// `tether serve` would fail or misbehave.
    Fail,
}

/// One checked thing and what was found.
#[derive(Debug, Clone)]
pub struct Check {
    /// What was checked, in a word or two.
    pub subject: String,
    /// The outcome.
    pub verdict: Verdict,
    /// What was found, in a sentence.
    pub detail: String,
}

impl fmt::Display for Check {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mark = match self.verdict {
            Verdict::Ok => "ok  ",
            Verdict::Warn => "warn",
            Verdict::Fail => "FAIL",
        };
        write!(f, "{mark}  {:<14} {}", self.subject, self.detail)
    }
}

/// Every check's outcome, in order.
#[derive(Debug, Default)]
pub struct Report {
    /// The checks.
    pub checks: Vec<Check>,
}

impl Report {
    fn add(&mut self, subject: &str, verdict: Verdict, detail: impl Into<String>) {
        self.checks.push(Check {
            subject: subject.to_owned(),
            verdict,
            detail: detail.into(),
        });
    }

    fn ok(&mut self, subject: &str, detail: impl Into<String>) {
        self.add(subject, Verdict::Ok, detail);
    }

    fn warn(&mut self, subject: &str, detail: impl Into<String>) {
        self.add(subject, Verdict::Warn, detail);
    }

    fn fail(&mut self, subject: &str, detail: impl Into<String>) {
        self.add(subject, Verdict::Fail, detail);
    }

    /// Whether any check failed.
    pub fn failed(&self) -> bool {
        self.checks.iter().any(|c| c.verdict == Verdict::Fail)
    }
}

/// Runs every check and prints the report: one line per check, then a
/// summary. Fails when any check failed.
pub async fn run(args: &ServeArgs) -> ExitCode {
    let report = diagnose(args).await;
    for check in &report.checks {
        println!("{check}");
    }
    let (fails, warns) = report
        .checks
        .iter()
        .fold((0, 0), |(f, w), c| match c.verdict {
            Verdict::Fail => (f + 1, w),
            Verdict::Warn => (f, w + 1),
            Verdict::Ok => (f, w),
        });
    if fails > 0 {
        println!(
            "\n{fails} check(s) failed, {warns} warning(s): tether serve would not run well as configured."
        );
        ExitCode::FAILURE
    } else {
        println!("\nAll checks passed ({warns} warning(s)).");
        ExitCode::SUCCESS
    }
}

/// Every check, without printing.
pub async fn diagnose(args: &ServeArgs) -> Report {
    let mut report = Report::default();
    let config = match args.check_bind().and_then(|()| args.serve_config()) {
        Ok(config) => {
            report.ok(
                "configuration",
                format!(
                    "valid: bind {}, effects {}, {} configured agent(s)",
                    args.bind,
                    effects_name(&config.effects),
                    config.agents.len()
                ),
            );
            Some(config)
        }
        Err(err) => {
            report.fail("configuration", format!("{err}."));
            None
        }
    };
    check_auth(args, config.as_ref(), &mut report);
    check_bind(args, &mut report);
    store::check(&args.database, &mut report).await;
    if let Some(config) = &config {
        check_roots(config, &mut report);
        let sandbox = config.sandbox.sandbox("doctor");
        check_confinement(config, &sandbox, &mut report);
        check_agents(config, &sandbox, &mut report).await;
        check_open_files(config, &mut report);
    }
    check_clock(&mut report);
    report
}

fn effects_name(effects: &EffectsConfig) -> &'static str {
    match effects {
        EffectsConfig::Local => "local",
        EffectsConfig::Webhook { .. } => "webhook",
        EffectsConfig::Agent => "agent",
    }
}

/// The secret's strength beyond its length (which the configuration
/// check enforces): a secret of few distinct bytes is guessable.
fn check_auth(args: &ServeArgs, config: Option<&ServeConfig>, report: &mut Report) {
    let secret = args.auth_secret().ok().flatten();
    let enabled = config.is_some_and(|c| c.auth.enabled());
    match secret {
        Some(secret) => {
            let mut distinct = secret.clone();
            distinct.sort_unstable();
            distinct.dedup();
            if secret.len() < crate::auth::token::MIN_SECRET_BYTES {
                report.fail(
                    "auth secret",
                    format!(
                        "{} bytes; it needs at least {} (256 bits). Make one with `openssl rand \
                         -base64 48`.",
                        secret.len(),
                        crate::auth::token::MIN_SECRET_BYTES
                    ),
                );
            } else if distinct.len() < 12 {
                report.fail(
                    "auth secret",
                    format!(
                        "{} bytes but only {} distinct ones: it is guessable. Make one with \
                         `openssl rand -base64 48`.",
                        secret.len(),
                        distinct.len()
                    ),
                );
            } else {
                report.ok(
                    "auth secret",
                    format!("{} bytes, {} distinct", secret.len(), distinct.len()),
                );
            }
            if args.auth_secret.is_some() {
                report.warn(
                    "auth secret",
                    "given on the command line or in TETHER_AUTH_SECRET; a file \
                     (--auth-secret-file) keeps it out of process listings",
                );
            }
        }
        None if enabled => report.ok("authentication", "on, with a JWKS file"),
        None if args.bind.ip().is_loopback() => report.warn(
            "authentication",
            "off: every caller on this machine is an admin (fine for a laptop; set \
             --auth-secret-file before exposing the port)",
        ),
        None => report.warn(
            "authentication",
            format!(
                "off on {}, a non-loopback address: anyone who can reach the port can read and \
                 drive every session",
                args.bind
            ),
        ),
    }
}

fn check_bind(args: &ServeArgs, report: &mut Report) {
    match std::net::TcpListener::bind(args.bind) {
        Ok(_) => report.ok("bind address", format!("{} is free", args.bind)),
        Err(err) if err.kind() == std::io::ErrorKind::AddrInUse => report.fail(
            "bind address",
            format!(
                "{} is already in use (another tether, or another program); choose another \
                 --bind",
                args.bind
            ),
        ),
        Err(err) => report.fail(
            "bind address",
            format!("cannot listen on {}: {err}", args.bind),
        ),
    }
}

fn check_roots(config: &ServeConfig, report: &mut Report) {
    let roots = config.engine.roots.list();
    if roots.is_empty() {
        report.warn(
            "allowed roots",
            "none set: sessions may use any directory this user can read (--allowed-roots \
             restricts them)",
        );
        return;
    }
    for root in roots {
        match std::fs::read_dir(&root.path) {
            Ok(_) => report.ok("allowed root", format!("{root} is a readable directory")),
            Err(err) => report.fail("allowed root", format!("{root} cannot be used: {err}")),
        }
    }
}

/// Whether agent processes would be confined, and whether what each agent
/// may always reach (system directories, its program, its configured
/// paths) keeps clear of Tether's data and secret files.
fn check_confinement(config: &ServeConfig, sandbox: &Sandbox, report: &mut Report) {
    use crate::agents::sandbox::ConfinementMode;
    let support = sandbox.support();
    match (sandbox.mode(), support.enforced()) {
        (ConfinementMode::Off, _) => report.warn(
            "confinement",
            "off (--agent-confinement off): agent processes can read and write whatever this \
             user can, Tether's database and secret files included",
        ),
        (ConfinementMode::Require, false) => report.fail(
            "confinement",
            format!(
                "required but not available: {}; ACP agents will not start",
                support.describe()
            ),
        ),
        (_, false) => report.warn(
            "confinement",
            format!(
                "not available: {}; agent processes would run unconfined",
                support.describe()
            ),
        ),
        (_, true) => report.ok(
            "confinement",
            format!("agent processes are confined: {}", support.describe()),
        ),
    }
    for spec in &config.agents {
        let Some(command) = spec.acp_command() else {
            continue;
        };
        let grants = sandbox.static_grants(command);
        let exposed: Vec<String> = sandbox
            .protected()
            .iter()
            .filter_map(|file| {
                let grant = grants.iter().find(|g| file.starts_with(g))?;
                Some(format!("{} (inside {})", file.display(), grant.display()))
            })
            .collect();
        if exposed.is_empty() {
            report.ok(
                "reach",
                format!(
                    "{}: none of Tether's data or secret files is within its reach",
                    spec.provider
                ),
            );
        } else {
            report.fail(
                "reach",
                format!(
                    "{} could reach {}; it will not start until they are moved",
                    spec.provider,
                    exposed.join(", ")
                ),
            );
        }
    }
}

async fn check_agents(config: &ServeConfig, sandbox: &Sandbox, report: &mut Report) {
    let asks = config.agents.iter().filter_map(|spec| {
        let command = spec.acp_command()?;
        Some(async move {
            let answer = crate::agents::acp::probe(command, &config.engine.acp, sandbox).await;
            (spec.provider.clone(), command.display(), answer)
        })
    });
    for (name, command, answer) in futures_util::future::join_all(asks).await {
        match answer {
            Ok(capabilities) if capabilities.session_error.is_some() => report.fail(
                "agent",
                format!(
                    "{name} ({command}) answered initialize but cannot open a session: {}",
                    capabilities.session_error.unwrap_or_default()
                ),
            ),
            Ok(capabilities) => report.ok(
                "agent",
                format!(
                    "{name} ({command}) started and answered initialize: {}",
                    capabilities.summary()
                ),
            ),
            Err(reason) => report.fail(
                "agent",
                format!("{name} ({command}) did not answer initialize: {reason}"),
            ),
        }
    }
}

/// File descriptors: `tether serve` raises its soft limit to the hard one
/// at start (`raise_open_file_limit`), so the hard limit is what counts.
/// Each connection holds one; the store, agents' pipes and the rest need
/// a few hundred more.
fn check_open_files(config: &ServeConfig, report: &mut Report) {
    let limit = rustix::process::getrlimit(rustix::process::Resource::Nofile);
    let Some(hard) = limit.maximum else {
        report.ok("open files", "no limit");
        return;
    };
    let base = 3 * config.engine.max_agents as u64 + 256;
    let wanted = config.ws.max_connections as u64 + base;
    if hard < base + 64 {
        report.fail(
            "open files",
            format!(
                "the hard limit is {hard}: too few for the store, agents and any connections; \
                 raise it (LimitNOFILE=, docker --ulimit nofile=)"
            ),
        );
    } else if hard < wanted {
        report.warn(
            "open files",
            format!(
                "the hard limit {hard} allows about {} connections, fewer than \
                 --max-connections {}: past that, accepts fail with EMFILE",
                hard - base,
                config.ws.max_connections
            ),
        );
    } else {
        report.ok(
            "open files",
            format!(
                "limit {hard}, enough for --max-connections {}",
                config.ws.max_connections
            ),
        );
    }
}

/// Raises this process's soft open-file limit to its hard limit (each
/// WebSocket holds a descriptor). Returns the limit now in force.
pub fn raise_open_file_limit() -> Option<u64> {
    use rustix::process::{Resource, Rlimit, getrlimit, setrlimit};
    let limit = getrlimit(Resource::Nofile);
    if limit.current < limit.maximum || (limit.maximum.is_none() && limit.current.is_some()) {
        let raised = Rlimit {
            current: limit.maximum,
            maximum: limit.maximum,
        };
        if setrlimit(Resource::Nofile, raised).is_ok() {
            return limit.maximum;
        }
    }
    limit.current
}

/// Token expiry and timestamps need a sane clock; with Postgres the store
/// check also compares it with the database's.
fn check_clock(report: &mut Report) {
    let now = jiff::Timestamp::now();
    // Older than this binary's protocol: the clock was never set.
    let floor: jiff::Timestamp = "2025-01-01T00:00:00Z".parse().expect("a valid timestamp");
    if now < floor {
        report.fail(
            "system clock",
            format!("the system clock says {now}: it is not set (tokens would be refused)"),
        );
    } else {
        report.ok("system clock", format!("{now}"));
    }
}
