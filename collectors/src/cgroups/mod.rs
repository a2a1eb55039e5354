//! `cgroups`: per-workload cgroups (systemd slices and services, containers,
//! Slurm jobs, Kubernetes pods): CPU time and throttling, memory, pressure.
//!
//! Both layouts are read. cgroup v2 (the unified hierarchy, `cgroup.controllers`
//! at `<sysfs>/fs/cgroup`) gives everything from one directory per cgroup. cgroup
//! v1 has one hierarchy per controller (`cpu,cpuacct`, `memory`, …); a cgroup is
//! the union of the directories with the same path in each, and on hybrid
//! systems its pressure comes from the same path under `unified/`.
//!
//! The walk (directory listings, depth, include/exclude patterns, the
//! cardinality bound, the workload kind) runs on the first tick, after a
//! cgroup vanished, and when the inotify watch over the directories it listed
//! ([`super::cgroup_watch`]) reports a cgroup made, removed or renamed or a
//! limit written; at least every `WATCHED_WALK_INTERVAL_SECS` as a net, and
//! every `rescan_interval_secs` where there is no watch. A tick in between
//! reads only the files of the cgroups it found, each once, into one reused
//! buffer.
//!
//! Measurement files are kept open from tick to tick ([`KeptFile`]) and
//! re-read with one `pread` at offset 0, which makes the kernel regenerate
//! their text: no path walk, open or close per tick. Descriptors outlive a
//! walk for the cgroups it finds again. A cgroup removed under an open file
//! answers ENODEV, read as the cgroup being gone (or, when its directory is
//! there again, as a new cgroup at the same path, opened afresh). Limits are
//! settings rather than measurements: `cpu.max`, `cpu.cfs_quota_us`,
//! `cpu.cfs_period_us`, `memory.max` and `memory.limit_in_bytes` are read on
//! the tick of each walk and their values repeated in the rows in between; a
//! write to one is a change the watch reports, so `cpu_quota_cpus` and
//! `memory_limit_bytes` follow a changed limit at the next tick (within
//! `rescan_interval_secs` without a watch).
//!
//! Most cgroups on a node are idle in any given second, and the kernel
//! formats the whole of `memory.stat` (dozens of lines, hierarchical sums
//! on v1) for each read: it is the dearest file of a tick. So each tick
//! reads a cgroup's CPU time, memory charge, pressure and settings first.
//! When the CPU time and the charge both match its last full read, nothing
//! ran in it and no page was charged or reclaimed. The files that can only
//! move with one of those are then not read, and their last values are
//! repeated: `memory.stat`, `memory.events`, `memory.swap.current`, and on
//! v1 `cpu.stat`, `cpuacct.stat`, `memory.oom_control` and
//! `memory.kmem.usage_in_bytes`. Pressure is read on every tick, because a
//! task blocked on I/O or memory stalls without running. The kernel's own
//! memcg statistics lag by up to 2 s (they are flushed lazily), and the tick
//! after each walk and a tick every `rescan_interval_secs` read every file of
//! every cgroup. So a repeated value is never older than that.
//!
//! One file that reads badly (junk text, an error the kernel should not give)
//! costs only the fields it fills in its own cgroup's row, for that tick: the
//! other files and cgroups are read, and the file is named in
//! `source_errors`. A cgroup with such a file is read whole at the next tick,
//! and a limit that read badly is read again then, not at the next walk. A
//! cgroup that goes mid-read (its container exited) is no error at all: it has
//! no row this tick and the next tick walks.

use std::collections::{BTreeMap, BTreeSet};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use regex::RegexSet;
use serde::{Deserialize, Serialize};
use vtax_store::schema::{FieldDef, FieldType, TableDef, TagDef, Unit};
use vtax_store::{Batch, BatchBuilder};

use super::cgroup_watch::CgroupWatch;
use super::kept::KeptFile;
use super::{Availability, Collector, ParseError, Roots};

mod sources;
mod layout;
mod walk;
mod collector;

use sources::*;
pub(super) use layout::*;
pub use walk::*;
pub use collector::*;

#[cfg(test)]
mod tests;

/// Default depth below the root that the walk descends to.
pub const DEFAULT_MAX_DEPTH: u32 = 4;
/// Default bound on the number of cgroups sampled.
pub const DEFAULT_MAX_CGROUPS: u32 = 500;
/// Default seconds between two full reads of quiet cgroups (and between two
/// walks of the hierarchy where inotify cannot watch it).
pub const DEFAULT_RESCAN_INTERVAL_SECS: f64 = 10.0;

/// `[collectors.cgroups]`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct CgroupsConfig {
    /// Whether the collector runs.
    pub enabled: bool,
    /// Seconds between two reads.
    pub interval_secs: f64,
    /// How deep below the root to walk: 1 is the root's children.
    pub max_depth: u32,
    /// Regular expressions on the cgroup path: when any is given, only
    /// matching cgroups are sampled.
    pub include: Vec<String>,
    /// Regular expressions on the cgroup path: matching cgroups are skipped.
    pub exclude: Vec<String>,
    /// At most this many cgroups are sampled; the rest are skipped and reported.
    pub max_cgroups: u32,
    /// Seconds between two full reads of quiet cgroups, and between two
    /// walks of the hierarchy where inotify cannot watch it.
    pub rescan_interval_secs: f64,
}

impl Default for CgroupsConfig {
    fn default() -> Self {
        CgroupsConfig {
            enabled: true,
            interval_secs: super::DEFAULT_INTERVAL_SECS,
            max_depth: DEFAULT_MAX_DEPTH,
            include: Vec::new(),
            exclude: Vec::new(),
            max_cgroups: DEFAULT_MAX_CGROUPS,
            rescan_interval_secs: DEFAULT_RESCAN_INTERVAL_SECS,
        }
    }
}

crate::common_settings!(CgroupsConfig);

impl crate::Registered for CgroupsConfig {
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
        _all: &crate::CollectorsConfig,
        roots: &crate::Roots,
    ) -> Box<dyn crate::Collector> {
        Box::new(Cgroups::new(self, roots))
    }
    fn check(&self) -> Result<(), (String, String)> {
        self.validate()
    }
}

/// Ranges of this collector's own numeric keys.
pub static KEY_RANGES: crate::keys::KeyRanges = &[
    ("max_depth", crate::keys::KeyRange::between(1.0, 32.0)),
    (
        "max_cgroups",
        crate::keys::KeyRange::between(1.0, 100_000.0),
    ),
    (
        "rescan_interval_secs",
        crate::keys::KeyRange::between(0.0, 86_400.0),
    ),
];

/// Comments for this collector's own keys in the example config.
pub static KEY_DOCS: &[(&str, &str)] = &[
    (
        "max_depth",
        "How deep below the cgroup root to walk: 1 is the root's children (system.slice), 4 reaches kubepods pods' containers and Slurm job steps.",
    ),
    (
        "include",
        "Regular expressions on the cgroup path (\"/system.slice/docker-abc.scope\"), matched anywhere unless anchored: when any is given, only matching cgroups are sampled.",
    ),
    (
        "exclude",
        "Regular expressions on the cgroup path: matching cgroups are skipped (their children are still walked and matched on their own).",
    ),
    (
        "max_cgroups",
        "At most this many cgroups are sampled: those already sampled first (a cgroup made at the bound is left out, not swapped for one sampled), then shallowest first, then by path; the rest are skipped and reported by `vtax doctor`.",
    ),
    (
        "rescan_interval_secs",
        "Seconds between two reads of every file of a quiet cgroup (one whose CPU time and memory charge did not move, which otherwise repeats its memory.stat and kin). The hierarchy is walked, and limits read, when inotify reports a cgroup made, removed or renamed or a limit written, and at least every 60 s (or rescan_interval_secs, if longer); where inotify is unavailable, every rescan_interval_secs. 0 walks and reads everything on every read.",
    ),
];

impl CgroupsConfig {
    /// Checks what serde cannot: ranges and that the patterns compile.
    /// Messages start with the full key.
    pub fn validate(&self) -> Result<(), (String, String)> {
        let invalid =
            |key: &str, message: String| Err((format!("collectors.cgroups.{key}"), message));
        if !(1..=32).contains(&self.max_depth) {
            return invalid(
                "max_depth",
                format!(
                    "collectors.cgroups.max_depth = {}: must be between 1 and 32",
                    self.max_depth
                ),
            );
        }
        if !(1..=100_000).contains(&self.max_cgroups) {
            return invalid(
                "max_cgroups",
                format!(
                    "collectors.cgroups.max_cgroups = {}: must be between 1 and 100000",
                    self.max_cgroups
                ),
            );
        }
        let rescan = self.rescan_interval_secs;
        if !(rescan.is_finite() && (0.0..=86_400.0).contains(&rescan)) {
            return invalid(
                "rescan_interval_secs",
                format!(
                    "collectors.cgroups.rescan_interval_secs = {rescan}: must be between 0 and 86400"
                ),
            );
        }
        for (key, patterns) in [("include", &self.include), ("exclude", &self.exclude)] {
            if let Err(message) = compile(&format!("collectors.cgroups.{key}"), patterns) {
                return invalid(key, message);
            }
        }
        Ok(())
    }
}

/// Compiles a list of patterns; the error names the key and the bad pattern.
pub(super) fn compile(key: &str, patterns: &[String]) -> Result<RegexSet, String> {
    for pattern in patterns {
        if let Err(e) = regex::Regex::new(pattern) {
            // The parser's message spans lines with a caret; its last line says what.
            let text = e.to_string();
            let what = text
                .lines()
                .rev()
                .find(|l| !l.trim().is_empty())
                .unwrap_or("invalid")
                .trim()
                .trim_start_matches("error: ");
            return Err(format!(
                "{key} = {pattern:?}: not a regular expression: {what}"
            ));
        }
    }
    RegexSet::new(patterns).map_err(|e| format!("{key}: {e}"))
}

/// Tables of this collector.
pub static TABLES: &[&TableDef] = &[&CGROUP];

const fn seconds(name: &'static str, help: &'static str) -> FieldDef {
    FieldDef::counter(name, FieldType::F64, Unit::Seconds, help)
}

const fn bytes(name: &'static str, help: &'static str) -> FieldDef {
    FieldDef::gauge(name, FieldType::U64, Unit::Bytes, help)
}

const fn count(name: &'static str, help: &'static str) -> FieldDef {
    FieldDef::counter(name, FieldType::U64, Unit::None, help)
}

const fn bytes_counted(name: &'static str, help: &'static str) -> FieldDef {
    FieldDef::counter(name, FieldType::U64, Unit::Bytes, help)
}

vtax_store::table! {
    /// One row per cgroup per tick.
    pub static CGROUP: TableDef, pub struct CgroupRow {
        name: "cgroup",
        help: "One row per workload cgroup per tick (the root excluded), from cgroup v2 or the v1 cpu, cpuacct and memory hierarchies. A value the kernel does not report for this layout or cgroup is null.",
        tags: [
            path = TagDef {
                name: "path",
                help: "The cgroup's path below the cgroup root, e.g. `/system.slice/docker-abc.scope` or `/slurm/uid_1000/job_42` (v1).",
            },
            workload = TagDef {
                name: "workload",
                help: "What the cgroup holds, from its path: `slice`, `service`, `container`, `pod`, `slurm_job`, `slurm_step` (a job's steps and tasks) or `other`.",
            },
        ],
        fields: [
            cpu_usage_seconds: Option<f64> = seconds(
                "CPU time of the cgroup's tasks, descendants included (v2 cpu.stat usage_usec, v1 cpuacct.usage).",
            ),
            cpu_user_seconds: Option<f64> = seconds(
                "CPU time in user mode (v2 user_usec, v1 cpuacct.stat user in clock ticks).",
            ),
            cpu_system_seconds: Option<f64> = seconds(
                "CPU time in kernel mode (v2 system_usec, v1 cpuacct.stat system in clock ticks).",
            ),
            cpu_periods: Option<u64> = count(
                "CFS bandwidth periods that elapsed with runnable tasks (cpu.stat nr_periods); null without the cpu controller.",
            ),
            cpu_throttled_periods: Option<u64> = count(
                "Periods in which the cgroup was throttled for exhausting its quota (cpu.stat nr_throttled).",
            ),
            cpu_throttled_seconds: Option<f64> = seconds(
                "Time the cgroup's tasks were throttled (v2 throttled_usec, v1 throttled_time).",
            ),
            cpu_quota_cpus: Option<f64> = FieldDef::gauge(
                FieldType::F64,
                Unit::None,
                "CPU bandwidth limit in CPUs: quota / period (v2 cpu.max, v1 cpu.cfs_quota_us / cpu.cfs_period_us); null when unlimited.",
            ),
            memory_usage_bytes: Option<u64> = bytes(
                "Memory charged to the cgroup, page cache included (v2 memory.current, v1 memory.usage_in_bytes).",
            ),
            memory_limit_bytes: Option<u64> = bytes(
                "Memory limit (v2 memory.max, v1 memory.limit_in_bytes); null when unlimited.",
            ),
            memory_anon_bytes: Option<u64> = bytes(
                "Anonymous memory (v2 memory.stat anon; v1 total_rss, which counts swap cache too).",
            ),
            memory_file_bytes: Option<u64> = bytes(
                "Page cache, shared memory included (v2 memory.stat file, v1 total_cache).",
            ),
            memory_kernel_bytes: Option<u64> = bytes(
                "Kernel memory charged to the cgroup (v2 memory.stat kernel on Linux 5.18 and later, v1 memory.kmem.usage_in_bytes).",
            ),
            memory_slab_bytes: Option<u64> = bytes(
                "Slab allocations, part of the kernel memory (v2 memory.stat slab; null on v1).",
            ),
            memory_swap_bytes: Option<u64> = bytes(
                "Swap used (v2 memory.swap.current, v1 memory.stat total_swap); null without swap accounting.",
            ),
            memory_page_faults: Option<u64> = count(
                "Page faults, minor and major (memory.stat pgfault; v1 total_pgfault).",
            ),
            memory_major_page_faults: Option<u64> = count(
                "Major page faults: the ones that read from disk (memory.stat pgmajfault; v1 total_pgmajfault).",
            ),
            memory_max_events: Option<u64> = count(
                "Times usage was about to go over the limit and reclaim ran (v2 memory.events max; null on v1).",
            ),
            memory_oom_events: Option<u64> = count(
                "Times the cgroup ran out of memory at its limit (v2 memory.events oom; null on v1).",
            ),
            memory_oom_kills: Option<u64> = count(
                "Processes killed by the OOM killer in the cgroup (v2 memory.events oom_kill, v1 memory.oom_control oom_kill).",
            ),
            cpu_pressure_some_seconds: Option<f64> = seconds(
                "Time some runnable task waited for a CPU (cpu.pressure some total; v2, or unified/ on hybrid v1).",
            ),
            cpu_pressure_full_seconds: Option<f64> = seconds(
                "Time all non-idle tasks waited for a CPU at once (cpu.pressure full total; Linux 5.13 and later).",
            ),
            memory_pressure_some_seconds: Option<f64> = seconds(
                "Time some task stalled on memory: reclaim, refaults, swap-in (memory.pressure some total).",
            ),
            memory_pressure_full_seconds: Option<f64> = seconds(
                "Time all non-idle tasks stalled on memory at once (memory.pressure full total).",
            ),
            io_pressure_some_seconds: Option<f64> = seconds(
                "Time some task stalled on block I/O (io.pressure some total).",
            ),
            io_pressure_full_seconds: Option<f64> = seconds(
                "Time all non-idle tasks stalled on block I/O at once (io.pressure full total).",
            ),
            io_read_bytes: Option<u64> = bytes_counted(
                "Bytes read from block devices, summed over them (io.stat rbytes; v2 only: v1's blkio files count nothing on current kernels without throttle rules).",
            ),
            io_write_bytes: Option<u64> = bytes_counted(
                "Bytes written to block devices, summed over them (io.stat wbytes, page cache writeback included; v2 only).",
            ),
        ],
        exported: true,
    }
}
