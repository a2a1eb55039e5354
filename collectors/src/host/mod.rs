//! `host`: the node as a whole, from procfs. Per-CPU time from `/proc/stat`,
//! steal included: the first sign that a hypervisor is taking time from this
//! guest; pressure stall information from `/proc/pressure/*`; load from
//! `/proc/loadavg`; memory from `/proc/meminfo`; kernel activity counters from
//! `/proc/stat`; per-CPU run delay from `/proc/schedstat`.
//!
//! Counters are stored raw (seconds or counts since boot); rates are taken
//! downstream. Pressure and schedstat are optional: a kernel without them just
//! has no rows in those tables, and `problems` says why. Each file is read on
//! its own: one that reads badly (an empty `pressure/cpu`, junk in `meminfo`)
//! costs only the rows that come from it, and is named in `source_errors`;
//! the tick fails only when no file gave a row.

use std::num::IntErrorKind;
use std::path::Path;

use serde::{Deserialize, Serialize};
use vtax_store::schema::{FieldDef, FieldType, TableDef, TagDef, Unit};
use vtax_store::{Batch, BatchBuilder};

use super::{Availability, Collector, ParseError, Roots};

mod tables;
mod parse;

pub use tables::*;
pub use parse::*;

#[cfg(test)]
mod tests;

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

crate::common_settings!(HostConfig);

impl crate::Registered for HostConfig {
    fn tables() -> &'static [&'static vtax_store::TableDef] {
        TABLES
    }
    fn key_docs() -> &'static [(&'static str, &'static str)] {
        KEY_DOCS
    }
    fn build(
        &self,
        _all: &crate::CollectorsConfig,
        roots: &crate::Roots,
    ) -> Box<dyn crate::Collector> {
        Box::new(Host::new(self, roots))
    }
}

/// The host collector.
pub struct Host {
    roots: Roots,
    hz: f64,
    problems: Vec<String>,
    errors: Vec<ParseError>,
}

impl Host {
    /// A host collector reading under `roots`.
    pub fn new(_config: &HostConfig, roots: &Roots) -> Self {
        Host {
            roots: roots.clone(),
            hz: super::user_hz(),
            problems: Vec::new(),
            errors: Vec::new(),
        }
    }
}

impl Collector for Host {
    fn name(&self) -> &'static str {
        "host"
    }

    fn probe(&mut self) -> Availability {
        // No /proc/stat is no procfs there (a wrong --path.procfs); one that
        // reads badly costs its own rows, as after the start.
        let stat = self.roots.proc("stat");
        if let Err(e) = std::fs::symlink_metadata(&stat) {
            if e.kind() == std::io::ErrorKind::NotFound {
                return Availability::Absent(format!("{}: {e}", stat.display()));
            }
        }
        match sample(&self.roots, 0, self.hz) {
            Ok(sample) => {
                self.problems = sample.problems.clone();
                self.errors = sample.errors.clone();
                Availability::Available(sample.summary())
            }
            // Every file reads badly: probed again until one mends.
            Err(e) => Availability::Failed(e.to_string()),
        }
    }

    fn collect(&mut self, time_us: i64) -> anyhow::Result<Vec<Batch>> {
        self.errors.clear();
        let sample = sample(&self.roots, time_us, self.hz)?;
        self.problems = sample.problems;
        self.errors = sample.errors;
        Ok(sample.batches)
    }

    fn problems(&self) -> Vec<String> {
        self.problems.clone()
    }

    fn source_errors(&self) -> Vec<ParseError> {
        self.errors.clone()
    }

    // `procs_running`, `procs_blocked` and the loadavg's runnable count are
    // read at an instant: on the grid, they counted the agent's other
    // collector threads, woken for the same tick (about 20 runnable on an
    // idle 2-CPU node whose load average was 0.3).
    fn lead(&self) -> std::time::Duration {
        HOST_TICK_LEAD
    }
}

/// How far ahead of the grid the host collector reads: past the wake-up
/// latency of a loaded node's timers (a few milliseconds), and a negligible
/// part of any interval.
pub const HOST_TICK_LEAD: std::time::Duration = std::time::Duration::from_millis(5);

/// Comments for this collector's own keys in the example config.
pub static KEY_DOCS: &[(&str, &str)] = &[];

/// Tables of this collector.
pub static TABLES: &[&TableDef] = &[&CPU, &CPU_SCHED, &PRESSURE, &LOAD, &MEMORY, &KERNEL];
