//! What a scenario reports: phases (each with its figures and the CPU the
//! load tool and the server used meanwhile), checks and notes; printed for
//! people or as one JSON line (`--json`).

use serde::Serialize;
use serde_json::Value;

use crate::measure::{CpuShare, LatencySummary};

/// A scenario's result.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Report {
    /// Scenario name.
    pub scenario: &'static str,
    /// The server's storage backend, from `/readyz`.
    pub backend: Option<String>,
    /// The parameters it ran with.
    pub params: Value,
    /// Measured phases, in order.
    pub phases: Vec<Phase>,
    /// Correctness checks; any failure makes the tool exit non-zero.
    pub checks: Vec<Check>,
    /// Things the reader must know to interpret the figures.
    pub notes: Vec<String>,
}

/// One measured stretch of time.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Phase {
    /// What was measured.
    pub name: String,
    /// Plain figures (rates, counts, sizes).
    pub figures: Vec<Figure>,
    /// Latency distributions.
    pub latencies: Vec<NamedLatency>,
    /// CPU over the phase.
    pub cpu: CpuShare,
}

/// The figure [`Phase::cpu_per_action`] adds for the server.
pub const SERVER_CPU_PER_ACTION: &str = "server CPU per action";
/// The figure [`Phase::cpu_per_action`] adds for the rest of the machine.
pub const OTHER_CPU_PER_ACTION: &str = "other CPU per action";

/// A named number.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Figure {
    /// What it is.
    pub name: String,
    /// Its value.
    pub value: f64,
    /// Its unit (`actions/s`, `KiB`, ...).
    pub unit: String,
}

/// A named latency distribution.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct NamedLatency {
    /// What was timed.
    pub name: String,
    /// Its percentiles.
    #[serde(flatten)]
    pub summary: LatencySummary,
}

/// A pass/fail check.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Check {
    /// What was checked.
    pub name: String,
    /// Whether it held.
    pub ok: bool,
    /// The evidence.
    pub detail: String,
}

impl Phase {
    /// A phase with no figures yet.
    pub fn new(name: impl Into<String>, cpu: CpuShare) -> Self {
        Self {
            name: name.into(),
            figures: Vec::new(),
            latencies: Vec::new(),
            cpu,
        }
    }

    /// Adds a figure.
    pub fn figure(mut self, name: impl Into<String>, value: f64, unit: &str) -> Self {
        self.figures.push(Figure {
            name: name.into(),
            value,
            unit: unit.to_owned(),
        });
        self
    }

    /// Adds the CPU an action cost over the phase, in µs, at `rate` actions
    /// a second: the server's (its cores over the rate), and that of
    /// everything else on the machine but the load tool (on Postgres, mostly
    /// the database's own). Nothing without `--server-pid`: a figure without
    /// the server's share would read as complete.
    pub fn cpu_per_action(mut self, rate: f64) -> Self {
        let Some(server) = self.cpu.server_cores else {
            return self;
        };
        if rate <= 0.0 {
            return self;
        }
        let per = |cores: f64| cores / rate * 1e6;
        let rest = per(self.cpu.other_cores());
        self = self.figure(SERVER_CPU_PER_ACTION, per(server), "µs/action");
        self.figure(OTHER_CPU_PER_ACTION, rest, "µs/action")
    }

    /// Adds a latency distribution.
    pub fn latency(mut self, name: impl Into<String>, summary: LatencySummary) -> Self {
        self.latencies.push(NamedLatency {
            name: name.into(),
            summary,
        });
        self
    }
}

impl Report {
    /// An empty report for `scenario`.
    pub fn new(scenario: &'static str, backend: Option<String>, params: Value) -> Self {
        Self {
            scenario,
            backend,
            params,
            phases: Vec::new(),
            checks: Vec::new(),
            notes: Vec::new(),
        }
    }

    /// Records a check.
    pub fn check(&mut self, name: impl Into<String>, ok: bool, detail: impl Into<String>) {
        self.checks.push(Check {
            name: name.into(),
            ok,
            detail: detail.into(),
        });
    }

    /// Whether every check held.
    pub fn ok(&self) -> bool {
        self.checks.iter().all(|c| c.ok)
    }

    /// The report for people.
    pub fn human(&self) -> String {
        let mut out = format!(
            "{} on {}  {}\n",
            self.scenario,
            self.backend.as_deref().unwrap_or("unknown backend"),
            self.params
        );
        for phase in &self.phases {
            out.push_str(&format!("  {}\n", phase.name));
            for figure in &phase.figures {
                out.push_str(&format!(
                    "    {:<40} {} {}\n",
                    figure.name,
                    number(figure.value),
                    figure.unit
                ));
            }
            for latency in &phase.latencies {
                out.push_str(&format!(
                    "    {:<40} {}\n",
                    latency.name,
                    latency.summary.describe()
                ));
            }
            out.push_str(&format!("    {:<40} {}\n", "cpu", phase.cpu.describe()));
        }
        for check in &self.checks {
            out.push_str(&format!(
                "  check {}: {} ({})\n",
                if check.ok { "ok" } else { "FAILED" },
                check.name,
                check.detail
            ));
        }
        for note in &self.notes {
            out.push_str(&format!("  note: {note}\n"));
        }
        out
    }
}

fn number(value: f64) -> String {
    if value.fract() == 0.0 || value.abs() >= 100.0 {
        format!("{value:.0}")
    } else {
        format!("{value:.2}")
    }
}
