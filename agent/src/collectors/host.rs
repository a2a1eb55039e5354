//! `host`: per-CPU time from `/proc/stat`, steal included: the first sign that a
//! hypervisor is taking time from this guest.

use std::path::Path;

use serde::{Deserialize, Serialize};
use vtax_store::schema::{FieldDef, FieldType, MetricKind, TableDef, TagDef, Unit};
use vtax_store::{Batch, BatchBuilder, Value};

use super::{Availability, Collector, CollectorConfig, Roots};

/// `[collectors.host]`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct HostConfig {
    /// Whether the collector runs.
    pub enabled: bool,
    /// Seconds between two reads.
    pub interval_secs: f64,
}

impl Default for HostConfig {
    fn default() -> Self {
        HostConfig {
            enabled: true,
            interval_secs: super::DEFAULT_INTERVAL_SECS,
        }
    }
}

impl CollectorConfig for HostConfig {
    fn enabled(&self) -> bool {
        self.enabled
    }
    fn interval_secs(&self) -> f64 {
        self.interval_secs
    }
}

/// The host collector.
pub struct Host {
    procfs: std::path::PathBuf,
}

impl Host {
    /// A host collector reading under `roots`.
    pub fn new(_config: &HostConfig, roots: &Roots) -> Self {
        Host {
            procfs: roots.procfs.clone(),
        }
    }
}

impl Collector for Host {
    fn name(&self) -> &'static str {
        "host"
    }

    fn probe(&mut self) -> Availability {
        match collect(&self.procfs, 0) {
            Ok(batch) => Availability::Available(format!("{} CPUs", batch.len())),
            Err(e) => Availability::Absent(e.to_string()),
        }
    }

    fn collect(&mut self, time_us: i64) -> anyhow::Result<Vec<Batch>> {
        Ok(vec![collect(&self.procfs, time_us)?])
    }
}

/// Comments for this collector's own keys in the example config.
pub static KEY_DOCS: &[(&str, &str)] = &[];

/// Tables of this collector.
pub static TABLES: &[&TableDef] = &[&CPU];

const fn seconds_counter(name: &'static str, help: &'static str) -> FieldDef {
    FieldDef {
        name,
        ty: FieldType::F64,
        kind: MetricKind::Counter,
        unit: Unit::Seconds,
        help,
    }
}

/// Columns of `/proc/stat` cpu lines, in the kernel's order.
pub static CPU: TableDef = TableDef {
    name: "cpu",
    help: "One row per logical CPU per tick: time spent in each mode since boot, from /proc/stat.",
    tags: &[TagDef {
        name: "cpu",
        help: "Logical CPU number.",
    }],
    fields: &[
        seconds_counter("user_seconds", "Time in user mode, guest time included."),
        seconds_counter("nice_seconds", "Time in user mode at low priority."),
        seconds_counter("system_seconds", "Time in kernel mode."),
        seconds_counter("idle_seconds", "Time idle."),
        seconds_counter("iowait_seconds", "Time idle with I/O outstanding."),
        seconds_counter("irq_seconds", "Time servicing hardware interrupts."),
        seconds_counter("softirq_seconds", "Time servicing softirqs."),
        seconds_counter(
            "steal_seconds",
            "Time the hypervisor ran something else while this virtual CPU wanted to run.",
        ),
    ],
    exported: true,
};

/// Why a read failed: the file, the line and what was wrong.
#[derive(Debug, thiserror::Error)]
#[error("{path}:{line}: {reason}")]
pub struct ParseError {
    path: String,
    line: usize,
    reason: String,
}

/// Kernel clock ticks per second (`USER_HZ`).
fn ticks_per_second() -> f64 {
    // SAFETY: sysconf has no memory effects.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if hz > 0 {
        hz as f64
    } else {
        100.0
    }
}

/// Reads `<procfs>/stat` into one row per CPU at `time_us`.
pub fn collect(procfs: &Path, time_us: i64) -> Result<Batch, ParseError> {
    let path = procfs.join("stat");
    let text = std::fs::read_to_string(&path).map_err(|e| ParseError {
        path: path.display().to_string(),
        line: 0,
        reason: e.to_string(),
    })?;
    parse(
        &text,
        &path.display().to_string(),
        time_us,
        ticks_per_second(),
    )
}

fn parse(text: &str, path: &str, time_us: i64, hz: f64) -> Result<Batch, ParseError> {
    let mut builder = BatchBuilder::new(&CPU);
    let fail = |line: usize, reason: String| ParseError {
        path: path.to_string(),
        line,
        reason,
    };
    for (n, line) in text.lines().enumerate() {
        let mut words = line.split_ascii_whitespace();
        let Some(cpu) = words.next().and_then(|w| w.strip_prefix("cpu")) else {
            continue;
        };
        if cpu.is_empty() {
            continue; // the all-CPU total line
        }
        if cpu.parse::<u32>().is_err() {
            return Err(fail(n + 1, format!("bad CPU number {cpu:?}")));
        }
        let mut values = [Value::Null; 8];
        for (slot, word) in values.iter_mut().zip(words.by_ref()) {
            let ticks: u64 = word
                .parse()
                .map_err(|_| fail(n + 1, format!("{word:?} is not a tick count")))?;
            *slot = Value::F64(ticks as f64 / hz);
        }
        if values[3] == Value::Null {
            return Err(fail(n + 1, "fewer than 4 columns".into()));
        }
        builder
            .push(time_us, &[cpu], &values)
            .map_err(|e| fail(n + 1, e.to_string()))?;
    }
    if builder.is_empty() {
        return Err(fail(0, "no per-CPU lines".into()));
    }
    Ok(builder.finish())
}

#[cfg(test)]
mod tests {
    use super::*;
    use vtax_store::batch::Values;

    const STAT: &str = "cpu  100 0 50 1000 5 1 2 30 0 0\n\
        cpu0 60 0 30 500 3 1 1 20 0 0\n\
        cpu1 40 0 20 500 2 0 1 10 0 0\n\
        intr 12345\nctxt 999\n";

    #[test]
    fn one_row_per_cpu_in_seconds() {
        let batch = parse(STAT, "stat", 7, 100.0).unwrap();
        assert_eq!(batch.len(), 2);
        assert_eq!(batch.tags[0].dict, ["0", "1"]);
        let steal = CPU.field_index("steal_seconds").unwrap();
        assert_eq!(batch.fields[steal].values, Values::F64(vec![0.2, 0.1]));
    }

    #[test]
    fn old_kernels_without_steal_leave_it_null() {
        let batch = parse("cpu0 1 2 3 4\n", "stat", 7, 100.0).unwrap();
        let steal = CPU.field_index("steal_seconds").unwrap();
        assert!(!batch.fields[steal].is_valid(0));
    }

    #[test]
    fn garbage_names_the_file_and_line() {
        let err = parse("cpu0 1 2 x 4\n", "/proc/stat", 7, 100.0)
            .unwrap_err()
            .to_string();
        assert_eq!(err, "/proc/stat:1: \"x\" is not a tick count");
        assert!(parse("intr 1\n", "/proc/stat", 7, 100.0).is_err());
    }
}
