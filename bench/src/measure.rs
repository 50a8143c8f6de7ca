//! What the load tool measures besides its own counters: CPU time of itself
//! and of the server (`/proc/<pid>/stat`), resident memory
//! (`/proc/<pid>/status`), latency histograms and the progress line.

use std::io::IsTerminal as _;
use std::sync::Arc;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use serde::Serialize;

use crate::error::{Error, Result};

/// Clock ticks per second of the `utime`/`stime` fields in `/proc/*/stat`.
/// This is the kernel's `USER_HZ`, which Linux fixes at 100 for user space
/// whatever the kernel's internal tick rate; reading it with
/// `sysconf(_SC_CLK_TCK)` would need `unsafe`, which the workspace forbids.
pub const USER_HZ: f64 = 100.0;

/// CPU time (user + system) a process has used so far, in clock ticks.
/// `None` reads this process.
pub fn cpu_ticks(pid: Option<u32>) -> Result<u64> {
    let path = match pid {
        Some(pid) => format!("/proc/{pid}/stat"),
        None => "/proc/self/stat".to_owned(),
    };
    let text = std::fs::read_to_string(&path)
        .map_err(|e| Error::msg(format!("cannot read {path}: {e}")))?;
    parse_stat_ticks(&text).ok_or_else(|| Error::msg(format!("{path} has an unexpected format")))
}

/// `utime + stime` from the text of `/proc/<pid>/stat`.
pub fn parse_stat_ticks(text: &str) -> Option<u64> {
    // The command name (field 2) is in parentheses and may hold spaces, so
    // count fields from the last ')': the next is field 3 (state), so
    // utime (14) and stime (15) are the 12th and 13th after it.
    let rest = &text[text.rfind(')')? + 1..];
    let mut fields = rest.split_whitespace().skip(11);
    let utime: u64 = fields.next()?.parse().ok()?;
    let stime: u64 = fields.next()?.parse().ok()?;
    Some(utime + stime)
}

/// CPU time all cores spent busy so far (everything but idle and iowait),
/// in clock ticks, from the first line of `/proc/stat`.
pub fn machine_busy_ticks() -> Result<u64> {
    let text = std::fs::read_to_string("/proc/stat")
        .map_err(|e| Error::msg(format!("cannot read /proc/stat: {e}")))?;
    parse_proc_stat_busy(&text).ok_or_else(|| Error::msg("/proc/stat has an unexpected format"))
}

/// `user + nice + system + irq + softirq + steal` of the `cpu` line
/// (guest time is already counted in user).
pub fn parse_proc_stat_busy(text: &str) -> Option<u64> {
    let line = text.lines().find(|l| l.starts_with("cpu "))?;
    let fields: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .map(|f| f.parse().ok())
        .collect::<Option<_>>()?;
    let at = |i: usize| fields.get(i).copied().unwrap_or(0);
    Some(at(0) + at(1) + at(2) + at(5) + at(6) + at(7))
}

/// A process's resident set (`VmRSS`), in KiB. `None` reads this process.
pub fn rss_kib(pid: Option<u32>) -> Result<u64> {
    let path = match pid {
        Some(pid) => format!("/proc/{pid}/status"),
        None => "/proc/self/status".to_owned(),
    };
    let text = std::fs::read_to_string(&path)
        .map_err(|e| Error::msg(format!("cannot read {path}: {e}")))?;
    parse_status_kib(&text, "VmRSS:").ok_or_else(|| Error::msg(format!("{path} has no VmRSS line")))
}

/// The value of a `Name:   123 kB` line of `/proc/<pid>/status`.
pub fn parse_status_kib(text: &str, name: &str) -> Option<u64> {
    text.lines()
        .find_map(|line| line.strip_prefix(name))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|n| n.parse().ok())
}

/// How many CPU cores this machine has (for "x of N cores").
pub fn cores() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// CPU used over a window of wall time, by the load tool and the server.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct CpuShare {
    /// Wall time of the window, seconds.
    pub wall_seconds: f64,
    /// Cores the load tool kept busy on average (1.0 = one whole core).
    pub load_tool_cores: f64,
    /// Cores the server kept busy on average (every host's together);
    /// `None` without `--server-pid`.
    pub server_cores: Option<f64>,
    /// Each host's share, in `--server-pid` order (several hosts).
    pub server_cores_each: Vec<f64>,
    /// Cores the whole machine kept busy (load tool, server and anything
    /// else: a compiler running meanwhile shows here).
    pub machine_busy_cores: f64,
    /// Cores on this machine.
    pub machine_cores: usize,
}

impl CpuShare {
    /// Adds another window (for measurements taken in several pieces).
    pub fn combine(self, other: CpuShare) -> CpuShare {
        let wall = self.wall_seconds + other.wall_seconds;
        let weigh = |a: f64, b: f64| {
            if wall > 0.0 {
                (a * self.wall_seconds + b * other.wall_seconds) / wall
            } else {
                0.0
            }
        };
        CpuShare {
            wall_seconds: wall,
            load_tool_cores: weigh(self.load_tool_cores, other.load_tool_cores),
            server_cores: match (self.server_cores, other.server_cores) {
                (Some(a), Some(b)) => Some(weigh(a, b)),
                _ => None,
            },
            server_cores_each: self
                .server_cores_each
                .iter()
                .zip(&other.server_cores_each)
                .map(|(a, b)| weigh(*a, *b))
                .collect(),
            machine_busy_cores: weigh(self.machine_busy_cores, other.machine_busy_cores),
            machine_cores: self.machine_cores,
        }
    }

    /// Cores busy on the machine with neither the load tool nor the server
    /// (everything of it without `--server-pid`); never below zero.
    pub fn other_cores(&self) -> f64 {
        (self.machine_busy_cores - self.load_tool_cores - self.server_cores.unwrap_or(0.0)).max(0.0)
    }

    /// One line: `load tool 0.62, server 1.21, everything else 0.05 cores
    /// busy (of 2; over 10.0 s)`.
    pub fn describe(&self) -> String {
        let server = match self.server_cores {
            Some(c) if self.server_cores_each.len() > 1 => format!(
                "servers {c:.2} ({})",
                self.server_cores_each
                    .iter()
                    .map(|c| format!("{c:.2}"))
                    .collect::<Vec<_>>()
                    .join(" + ")
            ),
            Some(c) => format!("server {c:.2}"),
            None => "server ? (pass --server-pid)".to_owned(),
        };
        format!(
            "load tool {:.2}, {server}, everything else {:.2} cores busy (of {}; over {:.1} s)",
            self.load_tool_cores,
            self.other_cores(),
            self.machine_cores,
            self.wall_seconds
        )
    }
}

/// The start of a CPU measurement window.
#[derive(Debug, Clone)]
pub struct CpuWindow {
    started: Instant,
    load_ticks: u64,
    machine_ticks: u64,
    servers: Vec<(u32, u64)>,
}

impl CpuWindow {
    /// Starts a window now. A server pid that cannot be read is an error:
    /// a figure without the server's CPU would be reported as complete.
    /// Several hosts: one pid each, in host order.
    pub fn start(server_pids: &[u32]) -> Result<Self> {
        let servers = server_pids
            .iter()
            .map(|pid| Ok((*pid, cpu_ticks(Some(*pid))?)))
            .collect::<Result<Vec<_>>>()?;
        Ok(Self {
            started: Instant::now(),
            load_ticks: cpu_ticks(None)?,
            machine_ticks: machine_busy_ticks()?,
            servers,
        })
    }

    /// Ends the window now.
    pub fn finish(&self) -> Result<CpuShare> {
        let wall = self.started.elapsed().as_secs_f64().max(1e-9);
        let share = |ticks: u64| ticks as f64 / USER_HZ / wall;
        let load = cpu_ticks(None)?.saturating_sub(self.load_ticks);
        let each = self
            .servers
            .iter()
            .map(|(pid, before)| Ok(share(cpu_ticks(Some(*pid))?.saturating_sub(*before))))
            .collect::<Result<Vec<f64>>>()?;
        let server = (!each.is_empty()).then(|| each.iter().sum());
        let machine = machine_busy_ticks()?.saturating_sub(self.machine_ticks);
        Ok(CpuShare {
            wall_seconds: wall,
            load_tool_cores: share(load),
            server_cores: server,
            server_cores_each: each,
            machine_busy_cores: share(machine),
            machine_cores: cores(),
        })
    }
}

/// Highest latency a histogram records (longer ones count as this).
const MAX_RECORDED: Duration = Duration::from_secs(600);

/// A latency histogram in microseconds, three significant figures.
#[derive(Debug, Clone)]
pub struct Latency(Histogram<u64>);

impl Default for Latency {
    fn default() -> Self {
        Self::new()
    }
}

impl Latency {
    /// An empty histogram.
    pub fn new() -> Self {
        let max = u64::try_from(MAX_RECORDED.as_micros()).unwrap_or(u64::MAX);
        // Bounds and precision are constants that hdrhistogram accepts.
        Self(Histogram::new_with_bounds(1, max, 3).expect("valid histogram bounds"))
    }

    /// Records one latency.
    pub fn record(&mut self, latency: Duration) {
        let micros = u64::try_from(latency.as_micros()).unwrap_or(u64::MAX);
        self.0.saturating_record(micros.max(1));
    }

    /// Records one latency given in microseconds.
    pub fn record_micros(&mut self, micros: u64) {
        self.0.saturating_record(micros.max(1));
    }

    /// Adds every sample of `other`.
    pub fn merge(&mut self, other: &Latency) {
        // Same bounds on both sides, so adding cannot fail; saturate anyway.
        if self.0.add(&other.0).is_err() {
            for value in other.0.iter_recorded() {
                self.0
                    .saturating_record_n(value.value_iterated_to(), value.count_at_value());
            }
        }
    }

    /// How many samples.
    pub fn count(&self) -> u64 {
        self.0.len()
    }

    /// Percentiles in milliseconds.
    pub fn summary(&self) -> LatencySummary {
        let ms = |micros: u64| micros as f64 / 1000.0;
        LatencySummary {
            count: self.0.len(),
            p50_ms: ms(self.0.value_at_quantile(0.50)),
            p99_ms: ms(self.0.value_at_quantile(0.99)),
            p999_ms: ms(self.0.value_at_quantile(0.999)),
            max_ms: ms(self.0.max()),
            mean_ms: self.0.mean() / 1000.0,
        }
    }
}

/// Latency percentiles, in milliseconds.
#[derive(Debug, Clone, Copy, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct LatencySummary {
    /// Samples.
    pub count: u64,
    /// Median.
    pub p50_ms: f64,
    /// 99th percentile.
    pub p99_ms: f64,
    /// 99.9th percentile.
    pub p999_ms: f64,
    /// Largest sample.
    pub max_ms: f64,
    /// Mean.
    pub mean_ms: f64,
}

impl LatencySummary {
    /// `p50 1.23  p99 4.56  p99.9 7.89  max 12.3 ms (n=1000)`.
    pub fn describe(&self) -> String {
        format!(
            "p50 {}  p99 {}  p99.9 {}  max {} ms  (n={})",
            fmt_ms(self.p50_ms),
            fmt_ms(self.p99_ms),
            fmt_ms(self.p999_ms),
            fmt_ms(self.max_ms),
            self.count
        )
    }
}

fn fmt_ms(ms: f64) -> String {
    if ms < 10.0 {
        format!("{ms:.3}")
    } else if ms < 1000.0 {
        format!("{ms:.1}")
    } else {
        format!("{ms:.0}")
    }
}

/// A progress line on stderr, redrawn twice a second while it lives, only
/// when stderr is a terminal (a log file gets no carriage-return noise).
#[derive(Debug)]
pub struct Progress {
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: Option<tokio::task::JoinHandle<()>>,
}

impl Progress {
    /// Starts redrawing `line()` until [`Progress::finish`] or drop.
    pub fn start(line: impl Fn() -> String + Send + Sync + 'static) -> Self {
        if !std::io::stderr().is_terminal() {
            return Self {
                stop: None,
                task: None,
            };
        }
        let line = Arc::new(line);
        let (stop, mut stopped) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_millis(500));
            loop {
                tokio::select! {
                    _ = tick.tick() => eprint!("\r\x1b[K{}", line()),
                    _ = &mut stopped => break,
                }
            }
            eprint!("\r\x1b[K");
        });
        Self {
            stop: Some(stop),
            task: Some(task),
        }
    }

    /// Stops and erases the line.
    pub async fn finish(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(task) = self.task.take() {
            let _ = task.await;
        }
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_ticks_skip_a_command_name_with_spaces_and_parentheses() {
        let text = "4242 (tether (x) y) S 1 2 3 4 5 6 7 8 9 10 250 50 0 0 20 0 9 0 100 0 0";
        assert_eq!(parse_stat_ticks(text), Some(300));
    }

    #[test]
    fn status_lines_are_read_by_name() {
        let text = "Name:\ttether\nVmPeak:\t  9000 kB\nVmRSS:\t  1234 kB\n";
        assert_eq!(parse_status_kib(text, "VmRSS:"), Some(1234));
        assert_eq!(parse_status_kib(text, "VmSwap:"), None);
    }

    #[test]
    fn machine_busy_time_leaves_out_idle_and_iowait() {
        let text = "cpu  100 5 50 9000 300 7 3 2 0 0\ncpu0 50 2 25 4500 150 3 1 1 0 0\n";
        assert_eq!(parse_proc_stat_busy(text), Some(167));
    }

    #[test]
    fn this_process_can_be_measured() {
        assert!(cpu_ticks(None).is_ok());
        assert!(rss_kib(None).unwrap() > 0);
    }

    #[test]
    fn percentiles_come_out_in_milliseconds() {
        let mut h = Latency::new();
        for micros in 1..=1000 {
            h.record_micros(micros * 10);
        }
        let s = h.summary();
        assert_eq!(s.count, 1000);
        assert!((s.p50_ms - 5.0).abs() < 0.01, "{s:?}");
        assert!((s.max_ms - 10.0).abs() < 0.01, "{s:?}");
        let mut other = Latency::new();
        other.record(Duration::from_millis(20));
        h.merge(&other);
        assert_eq!(h.count(), 1001);
    }
}
