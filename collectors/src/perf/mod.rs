//! `perf`: hardware counters per workload cgroup (cycles, instructions,
//! last-level cache misses) from the CPU's performance monitoring unit, for
//! the detector's cycles-per-instruction signal (the CPI² method: a victim's
//! CPI rises while a neighbour takes its caches and memory bandwidth).
//!
//! Linux counts a cgroup only per CPU (`perf_event_open` with a cgroup's
//! directory and a CPU, `PERF_FLAG_PID_CGROUP`), so each cgroup costs one
//! counter per event per online CPU; a row sums them. Counters are opened for
//! the *leaves* of the cgroups that `[collectors.cgroups]` selects (its depth,
//! patterns, `max_cgroups` and rescan cadence): perf counts a cgroup's
//! descendants too (seen on this project's Linux 6.18: a counter on a parent
//! counted a process in its child), so parents would repeat what their leaves
//! hold at the price of as many counters again. Which hierarchy: cgroup v2's
//! root; on v1 the `perf_event` controller's mount, else `unified/` on a hybrid
//! system that left `perf_event` to v2. Only user mode is counted (the crate's
//! default, and what the workload's own code is slowed in).
//!
//! Counters are not grouped: the `perf-event` crate's `Group` always counts the
//! calling process, and a group's members must watch what its leader watches.
//! Each counter instead reports how long it was enabled and how long it really
//! counted; when the kernel multiplexed the PMU the two differ, and each tick's
//! increase is scaled by their ratio before it is added to the cgroup's total.
//! Totals are kept by the collector, so they only grow: a reading that went
//! backwards or is inconsistent is skipped and reported, never a panic.
//!
//! Where the kernel has no PMU (most VMs; this project's VM answers ENOENT for
//! every hardware event, while software events work) or refuses the calls
//! (`kernel.perf_event_paranoid` above 0 without CAP_PERFMON), `probe` says so
//! with the errno and what to change, and the collector stays off. The system
//! calls sit behind [`CounterSource`], so the tests drive the collector with
//! scripted counters.

use std::collections::BTreeMap;
use std::fs::File;
use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use vtax_store::schema::{FieldDef, FieldType, TableDef, TagDef, Unit};
use vtax_store::{Batch, BatchBuilder};

use super::cgroups::{classify, leaves, on_cgroupfs, CgroupsConfig, Selection};
use super::{Availability, Collector, Roots};

mod source;
mod collector;

pub use source::*;
pub use collector::*;

#[cfg(test)]
mod tests;

/// Default bound on open counters. Each is a file descriptor and a `struct
/// perf_event` in kernel memory (1352-byte objects in the `perf_event` slab
/// on this project's Linux 6.18), so 8192 hold the agent to about 11 MiB of
/// kernel memory and a few thousand descriptors beside its kept-open cgroup
/// files, far under the open-file limit it raises itself to. That is 2730
/// cgroup-CPUs at three events: 42 leaf cgroups on a 64-CPU node, 21 on a
/// 128-CPU one; a GPU server runs a handful of jobs.
pub const DEFAULT_MAX_COUNTERS: u32 = 8192;

/// `[collectors.perf]`. Which cgroups come from `[collectors.cgroups]`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PerfConfig {
    /// Whether the collector runs (it turns itself off where the PMU is hidden).
    pub enabled: bool,
    /// Seconds between two reads.
    pub interval_secs: f64,
    /// At most this many counters (file descriptors) are open.
    pub max_counters: u32,
}

impl Default for PerfConfig {
    fn default() -> Self {
        PerfConfig {
            enabled: true,
            interval_secs: super::DEFAULT_INTERVAL_SECS,
            max_counters: DEFAULT_MAX_COUNTERS,
        }
    }
}

crate::common_settings!(PerfConfig);

impl crate::Registered for PerfConfig {
    fn tables() -> &'static [&'static vtax_store::TableDef] {
        TABLES
    }
    fn key_docs() -> &'static [(&'static str, &'static str)] {
        KEY_DOCS
    }
    fn key_ranges() -> crate::keys::KeyRanges {
        KEY_RANGES
    }
    fn build(
        &self,
        all: &crate::CollectorsConfig,
        roots: &crate::Roots,
    ) -> Box<dyn crate::Collector> {
        Box::new(Perf::new(self, &all.cgroups, roots))
    }
    fn check(&self) -> Result<(), (String, String)> {
        self.validate()
    }
    fn shared_settings_equal(a: &crate::CollectorsConfig, b: &crate::CollectorsConfig) -> bool {
        a.cgroups == b.cgroups
    }
}

/// Ranges of this collector's own numeric keys (at least one cgroup's counters).
pub static KEY_RANGES: crate::keys::KeyRanges = &[(
    "max_counters",
    crate::keys::KeyRange::between(3.0, 1_000_000.0),
)];

/// Comments for this collector's own keys in the example config.
pub static KEY_DOCS: &[(&str, &str)] = &[(
    "max_counters",
    "At most this many perf counters (one file descriptor and about 1.3 KiB of kernel memory each) are open: a cgroup takes one per event per online CPU, 3 x CPUs. Leaf cgroups past the bound are not counted and `vtax doctor` says so. The cgroups themselves are the leaves of what [collectors.cgroups] selects (max_depth, include, exclude, max_cgroups, rescan_interval_secs).",
)];

impl PerfConfig {
    /// Checks what serde cannot; the error names the key.
    pub fn validate(&self) -> Result<(), (String, String)> {
        let per_cgroup = HwEvent::ALL.len() as u32;
        if !(per_cgroup..=1_000_000).contains(&self.max_counters) {
            return Err((
                "collectors.perf.max_counters".into(),
                format!(
                    "collectors.perf.max_counters = {}: must be between {per_cgroup} and 1000000",
                    self.max_counters
                ),
            ));
        }
        Ok(())
    }
}

/// Tables of this collector.
pub static TABLES: &[&TableDef] = &[&CGROUP_PERF];

const fn events(name: &'static str, help: &'static str) -> FieldDef {
    FieldDef::counter(name, FieldType::U64, Unit::None, help)
}

vtax_store::table! {
    /// One row per counted cgroup per tick.
    pub static CGROUP_PERF: TableDef, pub struct CgroupPerfRow {
        name: "cgroup_perf",
        help: "One row per leaf workload cgroup per tick, from the CPU's hardware counters (perf_event_open in cgroup mode, one counter per event per online CPU, summed; user mode only). Counts are scaled for multiplexing, so they are estimates when the PMU was shared. No rows where the PMU is hidden (most VMs) or perf_event_open is refused.",
        tags: [
            path = TagDef {
                name: "path",
                help: "The cgroup's path below the cgroup root, as in the `cgroup` table.",
            },
            workload = TagDef {
                name: "workload",
                help: "What the cgroup holds, from its path, as in the `cgroup` table.",
            },
        ],
        fields: [
            cycles: Option<u64> = events(
                "CPU cycles while the cgroup's tasks ran (PERF_COUNT_HW_CPU_CYCLES).",
            ),
            instructions: Option<u64> = events(
                "Instructions the cgroup's tasks retired (PERF_COUNT_HW_INSTRUCTIONS); cycles / instructions is their CPI.",
            ),
            llc_misses: Option<u64> = events(
                "Last-level cache misses of the cgroup's tasks (PERF_COUNT_HW_CACHE_MISSES); null where the CPU has no such generic event.",
            ),
            counter_running_ratio: Option<f64> = FieldDef::gauge(
                FieldType::F64,
                Unit::Ratio,
                "Share of the time the cgroup's counters were enabled this tick that they counted: below 1 the PMU was shared and the increase was scaled up; null when the cgroup did not run.",
            ),
        ],
        exported: true,
    }
}

/// Online CPUs from a kernel CPU list (`0-3,8`).
fn parse_cpu_list(text: &str) -> Result<Vec<usize>, String> {
    let mut cpus = Vec::new();
    for part in text.trim().split(',').filter(|p| !p.is_empty()) {
        let number = |s: &str| {
            s.parse::<usize>()
                .map_err(|_| format!("{part:?} is not a CPU or a range of CPUs"))
        };
        match part.split_once('-') {
            Some((a, b)) => {
                let (a, b) = (number(a)?, number(b)?);
                if a > b || b - a > 65_536 {
                    return Err(format!("{part:?} is not a range of CPUs"));
                }
                cpus.extend(a..=b);
            }
            None => cpus.push(number(part)?),
        }
    }
    if cpus.is_empty() {
        return Err("no CPU listed".into());
    }
    cpus.sort_unstable();
    cpus.dedup();
    Ok(cpus)
}

/// The hierarchy perf counts cgroups in, under `<sysfs>/fs/cgroup`, and its
/// name for messages.
fn perf_hierarchy(root: &Path) -> Result<(PathBuf, String), String> {
    if root.join("cgroup.controllers").is_file() {
        return Ok((root.to_path_buf(), "cgroup v2".into()));
    }
    let entries = std::fs::read_dir(root)
        .map_err(|e| format!("no cgroup filesystem at {}: {e}", root.display()))?;
    let mut names: Vec<String> = entries
        .flatten()
        .filter_map(|e| e.file_name().into_string().ok())
        .collect();
    names.sort();
    if let Some(name) = names
        .iter()
        .find(|n| n.split(',').any(|c| c == "perf_event") && root.join(n).is_dir())
    {
        return Ok((root.join(name), format!("cgroup v1 {name}")));
    }
    let unified = root.join("unified");
    if unified.join("cgroup.controllers").is_file() {
        return Ok((unified, "cgroup v2 (unified, hybrid)".into()));
    }
    Err(format!(
        "no cgroup hierarchy perf can count in under {}: neither cgroup v2 nor a v1 perf_event mount",
        root.display()
    ))
}

/// One counter of a cgroup, and its last reading.
struct Slot {
    event: HwEvent,
    cpu: usize,
    counter: Box<dyn EventCounter>,
    last: Reading,
}

/// A counted cgroup.
struct Target {
    path: String,
    workload: &'static str,
    dir: PathBuf,
    /// The directory's inode when its counters were opened: another one at
    /// the same path is a cgroup made again, whose tasks those counters miss.
    inode: u64,
    slots: Vec<Slot>,
    /// Counts since the counters were opened, scaled for multiplexing; by event.
    totals: [u64; 3],
}

/// Adds one counter's increase since its last reading to `totals`; returns
/// the increase's (enabled, running) nanoseconds, or why the reading is bad.
fn advance(slot: &mut Slot, now: Reading, totals: &mut [u64; 3]) -> Result<(u64, u64), String> {
    if now.running_ns > now.enabled_ns {
        // Garbage: the next reading is measured from the last sound one.
        return Err(format!(
            "ran {} ns of {} ns enabled",
            now.running_ns, now.enabled_ns
        ));
    }
    // A reading below the last is a counter that started over: what it
    // counted since is unknown, so nothing is added and it is the new base.
    let last = std::mem::replace(&mut slot.last, now);
    let (Some(count), Some(enabled), Some(running)) = (
        now.count.checked_sub(last.count),
        now.enabled_ns.checked_sub(last.enabled_ns),
        now.running_ns.checked_sub(last.running_ns),
    ) else {
        return Err(format!("went backwards from {last:?} to {now:?}"));
    };
    let scaled = if running == 0 || running >= enabled {
        count
    } else {
        let estimate = u128::from(count) * u128::from(enabled) / u128::from(running);
        u64::try_from(estimate).unwrap_or(u64::MAX)
    };
    let total = &mut totals[slot.event.index()];
    *total = total.saturating_add(scaled);
    Ok((enabled, running))
}
