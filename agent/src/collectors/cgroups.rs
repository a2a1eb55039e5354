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

crate::collectors::common_settings!(CgroupsConfig);

impl crate::collectors::Registered for CgroupsConfig {
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
        _all: &crate::collectors::CollectorsConfig,
        roots: &crate::collectors::Roots,
    ) -> Box<dyn crate::collectors::Collector> {
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
        "At most this many cgroups are sampled, shallowest first then by path; the rest are skipped and reported by `vtax doctor`.",
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
        ],
        exported: true,
    }
}

fn error(path: &Path, line: usize, reason: impl Into<String>) -> ParseError {
    ParseError {
        path: path.display().to_string(),
        line,
        reason: reason.into(),
    }
}

/// One file a cgroup's row is read from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Source {
    // cgroup v2
    CpuStatV2,
    CpuMax,
    MemoryCurrent,
    MemoryMax,
    MemoryStatV2,
    MemoryEvents,
    SwapCurrent,
    // v2, and v1's `unified/` on hybrid systems
    CpuPressure,
    MemoryPressure,
    IoPressure,
    // cgroup v1 cpu
    CpuStatV1,
    CfsQuota,
    CfsPeriod,
    // cgroup v1 cpuacct
    CpuacctUsage,
    CpuacctStat,
    // cgroup v1 memory
    MemoryUsage,
    MemoryLimit,
    MemoryStatV1,
    OomControl,
    KmemUsage,
}

const V2_SOURCES: &[Source] = &[
    Source::CpuStatV2,
    Source::CpuMax,
    Source::MemoryCurrent,
    Source::MemoryMax,
    Source::MemoryStatV2,
    Source::MemoryEvents,
    Source::SwapCurrent,
    Source::CpuPressure,
    Source::MemoryPressure,
    Source::IoPressure,
];
const PRESSURE_SOURCES: &[Source] = &[
    Source::CpuPressure,
    Source::MemoryPressure,
    Source::IoPressure,
];
const CPU_SOURCES: &[Source] = &[Source::CpuStatV1, Source::CfsQuota, Source::CfsPeriod];
const CPUACCT_SOURCES: &[Source] = &[Source::CpuacctUsage, Source::CpuacctStat];
const MEMORY_SOURCES: &[Source] = &[
    Source::MemoryUsage,
    Source::MemoryLimit,
    Source::MemoryStatV1,
    Source::OomControl,
    Source::KmemUsage,
];

/// A field of [`CgroupRow`] that a file's number fills.
type U64Field = for<'r, 'a> fn(&'r mut CgroupRow<'a>) -> &'r mut Option<u64>;
/// A field of [`CgroupRow`] that a file's number fills, scaled.
type F64Field = for<'r, 'a> fn(&'r mut CgroupRow<'a>) -> &'r mut Option<f64>;

/// The field a file's key fills, and how the number written becomes its value.
#[derive(Clone, Copy)]
enum Fill {
    /// A count or a size in bytes, as written.
    Count(U64Field),
    /// Seconds, written in microseconds.
    Micros(F64Field),
    /// Seconds, written in nanoseconds.
    Nanos(F64Field),
    /// Seconds, written in clock ticks (USER_HZ).
    Ticks(F64Field),
    /// CPUs, from a quota and a period: set by the parser of the file (or of
    /// the pair of files) that holds both.
    Cpus(F64Field),
}

impl Fill {
    /// Sets the field from the number `n` the file writes; `hz` is USER_HZ.
    /// A [`Fill::Cpus`] takes `n` as whole CPUs.
    fn set(self, row: &mut CgroupRow, n: u64, hz: f64) {
        match self {
            Fill::Count(field) => *field(row) = Some(n),
            Fill::Micros(field) => *field(row) = Some(n as f64 / MICROS),
            Fill::Nanos(field) => *field(row) = Some(n as f64 / NANOS),
            Fill::Ticks(field) => *field(row) = Some(n as f64 / hz),
            Fill::Cpus(field) => *field(row) = Some(n as f64),
        }
    }

    /// Copies the field of `from` into `to`.
    fn copy(self, from: &mut CgroupRow, to: &mut CgroupRow) {
        match self {
            Fill::Count(field) => *field(to) = *field(from),
            Fill::Micros(field) | Fill::Nanos(field) | Fill::Ticks(field) | Fill::Cpus(field) => {
                *field(to) = *field(from)
            }
        }
    }

    /// Sets the field to null.
    fn clear(self, row: &mut CgroupRow) {
        match self {
            Fill::Count(field) => *field(row) = None,
            Fill::Micros(field) | Fill::Nanos(field) | Fill::Ticks(field) | Fill::Cpus(field) => {
                *field(row) = None
            }
        }
    }
}

// What each file fills, key by key (see `Source::fills`): a one-value file's
// key is empty, a pressure file's are its line kinds, `some` and `full`.

static CPU_STAT_V2: &[(&str, Fill)] = &[
    ("usage_usec", Fill::Micros(|r| &mut r.cpu_usage_seconds)),
    ("user_usec", Fill::Micros(|r| &mut r.cpu_user_seconds)),
    ("system_usec", Fill::Micros(|r| &mut r.cpu_system_seconds)),
    ("nr_periods", Fill::Count(|r| &mut r.cpu_periods)),
    (
        "nr_throttled",
        Fill::Count(|r| &mut r.cpu_throttled_periods),
    ),
    (
        "throttled_usec",
        Fill::Micros(|r| &mut r.cpu_throttled_seconds),
    ),
];
static CPU_STAT_V1: &[(&str, Fill)] = &[
    ("nr_periods", Fill::Count(|r| &mut r.cpu_periods)),
    (
        "nr_throttled",
        Fill::Count(|r| &mut r.cpu_throttled_periods),
    ),
    (
        "throttled_time",
        Fill::Nanos(|r| &mut r.cpu_throttled_seconds),
    ),
];
static CPUACCT_USAGE: &[(&str, Fill)] = &[("", Fill::Nanos(|r| &mut r.cpu_usage_seconds))];
static CPUACCT_STAT: &[(&str, Fill)] = &[
    ("user", Fill::Ticks(|r| &mut r.cpu_user_seconds)),
    ("system", Fill::Ticks(|r| &mut r.cpu_system_seconds)),
];
static CPU_MAX: &[(&str, Fill)] = &[("", Fill::Cpus(|r| &mut r.cpu_quota_cpus))];
static MEMORY_USAGE: &[(&str, Fill)] = &[("", Fill::Count(|r| &mut r.memory_usage_bytes))];
static MEMORY_LIMIT: &[(&str, Fill)] = &[("", Fill::Count(|r| &mut r.memory_limit_bytes))];
static SWAP_USAGE: &[(&str, Fill)] = &[("", Fill::Count(|r| &mut r.memory_swap_bytes))];
static KMEM_USAGE: &[(&str, Fill)] = &[("", Fill::Count(|r| &mut r.memory_kernel_bytes))];
static MEMORY_STAT_V2: &[(&str, Fill)] = &[
    ("anon", Fill::Count(|r| &mut r.memory_anon_bytes)),
    ("file", Fill::Count(|r| &mut r.memory_file_bytes)),
    ("kernel", Fill::Count(|r| &mut r.memory_kernel_bytes)),
    ("slab", Fill::Count(|r| &mut r.memory_slab_bytes)),
    ("pgfault", Fill::Count(|r| &mut r.memory_page_faults)),
    (
        "pgmajfault",
        Fill::Count(|r| &mut r.memory_major_page_faults),
    ),
];
static MEMORY_STAT_V1: &[(&str, Fill)] = &[
    ("total_rss", Fill::Count(|r| &mut r.memory_anon_bytes)),
    ("total_cache", Fill::Count(|r| &mut r.memory_file_bytes)),
    ("total_swap", Fill::Count(|r| &mut r.memory_swap_bytes)),
    ("total_pgfault", Fill::Count(|r| &mut r.memory_page_faults)),
    (
        "total_pgmajfault",
        Fill::Count(|r| &mut r.memory_major_page_faults),
    ),
];
static MEMORY_EVENTS: &[(&str, Fill)] = &[
    ("max", Fill::Count(|r| &mut r.memory_max_events)),
    ("oom", Fill::Count(|r| &mut r.memory_oom_events)),
    ("oom_kill", Fill::Count(|r| &mut r.memory_oom_kills)),
];
static OOM_CONTROL: &[(&str, Fill)] = &[("oom_kill", Fill::Count(|r| &mut r.memory_oom_kills))];
static CPU_PRESSURE: &[(&str, Fill)] = &[
    ("some", Fill::Micros(|r| &mut r.cpu_pressure_some_seconds)),
    ("full", Fill::Micros(|r| &mut r.cpu_pressure_full_seconds)),
];
static MEMORY_PRESSURE: &[(&str, Fill)] = &[
    (
        "some",
        Fill::Micros(|r| &mut r.memory_pressure_some_seconds),
    ),
    (
        "full",
        Fill::Micros(|r| &mut r.memory_pressure_full_seconds),
    ),
];
static IO_PRESSURE: &[(&str, Fill)] = &[
    ("some", Fill::Micros(|r| &mut r.io_pressure_some_seconds)),
    ("full", Fill::Micros(|r| &mut r.io_pressure_full_seconds)),
];

impl Source {
    /// Whether the file is a setting (a limit) rather than a measurement: read
    /// at each rescan only, not on every tick.
    fn is_setting(self) -> bool {
        matches!(
            self,
            Source::CpuMax
                | Source::MemoryMax
                | Source::CfsQuota
                | Source::CfsPeriod
                | Source::MemoryLimit
        )
    }

    /// Whether the file's values move only when the cgroup's tasks run or its
    /// memory charge moves: page faults, charges, reclaim and throttling all
    /// need one or the other. A quiet cgroup (CPU time and memory usage as at
    /// its last full read) repeats these values instead of reading the file.
    fn follows_usage(self) -> bool {
        matches!(
            self,
            Source::MemoryStatV2
                | Source::MemoryEvents
                | Source::SwapCurrent
                | Source::CpuStatV1
                | Source::CpuacctStat
                | Source::MemoryStatV1
                | Source::OomControl
                | Source::KmemUsage
        )
    }

    /// The keys the file is read by and the field each fills (settings that
    /// are combined later fill none directly).
    fn fills(self) -> &'static [(&'static str, Fill)] {
        match self {
            Source::CpuStatV2 => CPU_STAT_V2,
            Source::CpuMax => CPU_MAX,
            Source::MemoryCurrent | Source::MemoryUsage => MEMORY_USAGE,
            Source::MemoryMax | Source::MemoryLimit => MEMORY_LIMIT,
            Source::MemoryStatV2 => MEMORY_STAT_V2,
            Source::MemoryEvents => MEMORY_EVENTS,
            Source::SwapCurrent => SWAP_USAGE,
            Source::CpuPressure => CPU_PRESSURE,
            Source::MemoryPressure => MEMORY_PRESSURE,
            Source::IoPressure => IO_PRESSURE,
            Source::CpuStatV1 => CPU_STAT_V1,
            Source::CfsQuota | Source::CfsPeriod => &[],
            Source::CpuacctUsage => CPUACCT_USAGE,
            Source::CpuacctStat => CPUACCT_STAT,
            Source::MemoryStatV1 => MEMORY_STAT_V1,
            Source::OomControl => OOM_CONTROL,
            Source::KmemUsage => KMEM_USAGE,
        }
    }

    fn file_name(self) -> &'static str {
        match self {
            Source::CpuStatV2 | Source::CpuStatV1 => "cpu.stat",
            Source::CpuMax => "cpu.max",
            Source::MemoryCurrent => "memory.current",
            Source::MemoryMax => "memory.max",
            Source::MemoryStatV2 | Source::MemoryStatV1 => "memory.stat",
            Source::MemoryEvents => "memory.events",
            Source::SwapCurrent => "memory.swap.current",
            Source::CpuPressure => "cpu.pressure",
            Source::MemoryPressure => "memory.pressure",
            Source::IoPressure => "io.pressure",
            Source::CfsQuota => "cpu.cfs_quota_us",
            Source::CfsPeriod => "cpu.cfs_period_us",
            Source::CpuacctUsage => "cpuacct.usage",
            Source::CpuacctStat => "cpuacct.stat",
            Source::MemoryUsage => "memory.usage_in_bytes",
            Source::MemoryLimit => "memory.limit_in_bytes",
            Source::OomControl => "memory.oom_control",
            Source::KmemUsage => "memory.kmem.usage_in_bytes",
        }
    }
}

/// A hierarchy to walk: v2's root, or one v1 controller mount.
#[derive(Clone, Debug)]
struct Hierarchy {
    /// Its directory under `<sysfs>/fs/cgroup`.
    dir: PathBuf,
    /// Its name for the doctor (`cpu,cpuacct`, `memory`, `unified`).
    name: String,
    /// The files each of its cgroups is read from.
    sources: Vec<Source>,
    /// Whether it is a cgroup filesystem, where a file of a removed cgroup
    /// answers ENODEV; in a plain directory tree (a fixture) a deleted file
    /// stays readable through its descriptor and has to be noticed by `fstat`.
    cgroupfs: bool,
}

/// Whether `dir` is on a cgroup filesystem (v1 or v2).
pub(super) fn on_cgroupfs(dir: &Path) -> bool {
    let Ok(path) = std::ffi::CString::new(dir.as_os_str().as_bytes()) else {
        return false;
    };
    // SAFETY: statfs reads a NUL-terminated path and fills the struct we pass.
    let mut stat: libc::statfs = unsafe { std::mem::zeroed() };
    if unsafe { libc::statfs(path.as_ptr(), &mut stat) } != 0 {
        return false;
    }
    matches!(
        stat.f_type,
        libc::CGROUP_SUPER_MAGIC | libc::CGROUP2_SUPER_MAGIC
    )
}

/// What is mounted under `<sysfs>/fs/cgroup`.
#[derive(Clone, Debug)]
struct Layout {
    /// Whether it is the unified hierarchy (v2).
    unified: bool,
    /// v2: the controllers the root offers.
    controllers: String,
    /// The hierarchies to walk; v2 has one.
    hierarchies: Vec<Hierarchy>,
}

impl Layout {
    /// The names of the limit files read at each walk.
    fn limit_files(&self) -> Vec<&'static str> {
        let mut names: Vec<&'static str> = self
            .hierarchies
            .iter()
            .flat_map(|h| &h.sources)
            .filter(|s| s.is_setting())
            .map(|s| s.file_name())
            .collect();
        names.sort_unstable();
        names.dedup();
        names
    }
}

fn detect(root: &Path) -> Result<Layout, String> {
    let controllers = root.join("cgroup.controllers");
    // Its presence makes the root v2; its text is only shown by the doctor.
    if let Ok(bytes) = std::fs::read(&controllers) {
        let text = String::from_utf8_lossy(&bytes);
        return Ok(Layout {
            unified: true,
            controllers: text.split_ascii_whitespace().collect::<Vec<_>>().join(" "),
            hierarchies: vec![Hierarchy {
                dir: root.to_path_buf(),
                name: "unified".into(),
                sources: V2_SOURCES.to_vec(),
                cgroupfs: on_cgroupfs(root),
            }],
        });
    }
    let entries = std::fs::read_dir(root)
        .map_err(|e| format!("no cgroup filesystem at {}: {e}", root.display()))?;
    // (is a link, name): real mounts before the links to them.
    let mut names: Vec<(bool, String)> = entries
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            let link = e.file_type().is_ok_and(|t| t.is_symlink());
            e.file_name().into_string().ok().map(|n| (link, n))
        })
        .collect();
    names.sort();
    // `cpu` and `cpuacct` are usually links to `cpu,cpuacct`: walk each mount
    // once, with the controllers of every name it goes by.
    let mut mounts: Vec<PathBuf> = Vec::new();
    let mut hierarchies: Vec<Hierarchy> = Vec::new();
    let mut pressure = None;
    for (_, name) in names {
        let dir = root.join(&name);
        if !dir.is_dir() {
            continue;
        }
        if name == "unified" {
            if dir.join("cgroup.controllers").is_file() {
                pressure = Some(Hierarchy {
                    cgroupfs: on_cgroupfs(&dir),
                    dir,
                    name,
                    sources: PRESSURE_SOURCES.to_vec(),
                });
            }
            continue;
        }
        let mut sources = Vec::new();
        for controller in name.split(',') {
            match controller {
                "cpu" => sources.extend_from_slice(CPU_SOURCES),
                "cpuacct" => sources.extend_from_slice(CPUACCT_SOURCES),
                "memory" => sources.extend_from_slice(MEMORY_SOURCES),
                _ => {}
            }
        }
        if sources.is_empty() {
            continue;
        }
        let canonical = std::fs::canonicalize(&dir).unwrap_or_else(|_| dir.clone());
        if let Some(i) = mounts.iter().position(|m| *m == canonical) {
            let known = &mut hierarchies[i].sources;
            for source in sources {
                if !known.contains(&source) {
                    known.push(source);
                }
            }
            continue;
        }
        mounts.push(canonical);
        hierarchies.push(Hierarchy {
            cgroupfs: on_cgroupfs(&dir),
            dir,
            name,
            sources,
        });
    }
    if hierarchies.is_empty() {
        return Err(format!(
            "no cgroup filesystem at {}: neither cgroup.controllers (v2) nor a cpu, cpuacct or memory hierarchy (v1)",
            root.display()
        ));
    }
    hierarchies.extend(pressure);
    Ok(Layout {
        unified: false,
        controllers: String::new(),
        hierarchies,
    })
}

/// A file of a cgroup, and whether it turned out to be absent since the last walk.
#[derive(Debug)]
struct Slot {
    source: Source,
    /// Held open between ticks (measurements) or opened, read and closed at
    /// each rescan (settings).
    file: KeptFile,
    absent: bool,
    /// Whether a read through the held descriptor succeeded: an error after
    /// that may be a cgroup made again at the same path, worth one fresh open.
    kept: bool,
}

/// A cgroup to sample.
#[derive(Debug)]
struct Target {
    path: String,
    workload: &'static str,
    slots: Vec<Slot>,
    /// Whether a deleted file must be noticed with `fstat` (not on cgroupfs).
    check_deleted: bool,
    /// `cpu_quota_cpus` and `memory_limit_bytes` as read at the last rescan.
    quota: Option<f64>,
    limit: Option<u64>,
    /// Whether v1 `cpu.cfs_quota_us` was readable at the last rescan (then
    /// the cgroup has a row even when nothing else is readable).
    quota_read: bool,
    /// The row of the last tick that read every file; `None` until one has,
    /// and after a tick where one of its files read badly.
    last_full: Option<CgroupRow<'static>>,
    /// Whether a limit file read badly at the last settings read: read again
    /// at the next tick rather than at the next walk.
    settings_failed: bool,
}

impl Target {
    /// Whether `row` (read without the usage-following files) shows the cgroup
    /// as it was at its last full read: the same CPU time and memory charge,
    /// both read. Without either there is nothing to tell quiet by.
    fn quiet(&self, row: &Row) -> bool {
        let Some(last) = &self.last_full else {
            return false;
        };
        let now = &row.values;
        now.cpu_usage_seconds.is_some()
            && now.cpu_usage_seconds == last.cpu_usage_seconds
            && now.memory_usage_bytes.is_some()
            && now.memory_usage_bytes == last.memory_usage_bytes
    }
}

/// What a walk found.
#[derive(Debug, Default)]
struct Discovery {
    targets: Vec<Target>,
    /// Cgroups within depth that passed the patterns but were over `max_cgroups`.
    skipped: usize,
}

/// Which cgroups are sampled: those within `max_depth` of the root that pass
/// the include and exclude patterns, at most `max_cgroups` of them, shallowest
/// first then by path. The perf collector selects with the same rules, so its
/// rows name cgroups the cgroups collector names too, under the same bound.
pub(super) struct Selection {
    filter: Filter,
    max_depth: u32,
    max_cgroups: usize,
    rescan_us: i64,
}

impl Selection {
    pub(super) fn new(config: &CgroupsConfig) -> Selection {
        Selection {
            filter: Filter::new(config),
            max_depth: config.max_depth.max(1),
            max_cgroups: config.max_cgroups.max(1) as usize,
            rescan_us: (config.rescan_interval_secs.max(0.0) * 1e6) as i64,
        }
    }

    /// Every cgroup below each of `dirs` (hierarchy roots), down to
    /// `max_depth`: its path relative to the root (`/a/b`) to the indexes of
    /// the dirs that have it. `visit` is shown each directory (the roots and
    /// every cgroup found) before it is listed.
    pub(super) fn list(
        &self,
        dirs: &[&Path],
        visit: &mut dyn FnMut(&Path),
    ) -> BTreeMap<String, Vec<usize>> {
        let mut out: BTreeMap<String, Vec<usize>> = BTreeMap::new();
        for (idx, root) in dirs.iter().enumerate() {
            let mut stack: Vec<(String, PathBuf, u32)> =
                vec![(String::new(), root.to_path_buf(), 0)];
            while let Some((rel, dir, depth)) = stack.pop() {
                visit(&dir);
                if depth > 0 {
                    out.entry(rel.clone()).or_default().push(idx);
                }
                if depth >= self.max_depth {
                    continue;
                }
                // A directory gone since its parent was listed is churn; one we
                // may not read is left out.
                let Ok(entries) = std::fs::read_dir(&dir) else {
                    continue;
                };
                for entry in entries.flatten() {
                    if !entry.file_type().is_ok_and(|t| t.is_dir()) {
                        continue;
                    }
                    let Ok(name) = entry.file_name().into_string() else {
                        continue; // not UTF-8: cannot be a tag
                    };
                    stack.push((format!("{rel}/{name}"), entry.path(), depth + 1));
                }
            }
        }
        out
    }

    /// The listed cgroups the patterns accept, shallowest first then by path,
    /// cut to `max_cgroups` (which keeps slices over the leaves under them,
    /// and the same ones from walk to walk); and how many the cut left out.
    pub(super) fn bound<T>(
        &self,
        listed: impl IntoIterator<Item = (String, T)>,
    ) -> (Vec<(String, T)>, usize) {
        let mut paths: Vec<(String, T)> = listed
            .into_iter()
            .filter(|(path, _)| self.filter.accepts(path))
            .collect();
        paths.sort_by(|a, b| (depth_of(&a.0), &a.0).cmp(&(depth_of(&b.0), &b.0)));
        let skipped = paths.len().saturating_sub(self.max_cgroups);
        paths.truncate(self.max_cgroups);
        (paths, skipped)
    }

    /// Whether a walk is due at `time_us` after one at `walked_at` (`None`:
    /// never walked, or a cgroup vanished since).
    pub(super) fn rescan_due(&self, walked_at: Option<i64>, time_us: i64) -> bool {
        due(walked_at, time_us, self.rescan_us)
    }

    /// `rescan_interval_secs`, as configured (never below 0).
    fn rescan_interval_secs(&self) -> f64 {
        self.rescan_us as f64 / 1e6
    }

    /// Why nothing is sampled, when the patterns do not compile.
    pub(super) fn broken(&self) -> Option<&str> {
        self.filter.broken.as_deref()
    }

    pub(super) fn max_depth(&self) -> u32 {
        self.max_depth
    }

    pub(super) fn max_cgroups(&self) -> usize {
        self.max_cgroups
    }
}

/// Whether something last done at `last` (`None`: never) is due again at
/// `time_us`, every `interval_us`; a clock stepped back makes it due.
fn due(last: Option<i64>, time_us: i64, interval_us: i64) -> bool {
    match last {
        None => true,
        Some(at) => time_us < at || time_us - at >= interval_us,
    }
}

fn depth_of(path: &str) -> usize {
    path.bytes().filter(|&b| b == b'/').count()
}

/// Walks the hierarchies; with a `watch`, every directory listed is watched
/// first. A watch that could not take every directory is dropped (one that
/// misses some would miss their changes) and the reason returned.
fn walk(
    layout: &Layout,
    selection: &Selection,
    watch: &mut Option<CgroupWatch>,
) -> (Discovery, Option<String>) {
    let dirs: Vec<&Path> = layout.hierarchies.iter().map(|h| h.dir.as_path()).collect();
    let mut watch_failed = None;
    let found = selection.list(&dirs, &mut |dir| {
        if let Some(w) = watch.as_mut() {
            if let Err(e) = w.add(dir) {
                watch_failed = Some(e);
                *watch = None;
            }
        }
    });
    // Pressure-only paths (hybrid `unified/`) are not workloads of their own.
    let pressure_only = |idxs: &[usize]| {
        idxs.iter()
            .all(|&i| layout.hierarchies[i].sources.as_slice() == PRESSURE_SOURCES)
    };
    let (paths, skipped) = selection.bound(
        found
            .into_iter()
            .filter(|(_, idxs)| layout.unified || !pressure_only(idxs)),
    );
    let mut targets: Vec<Target> = paths
        .into_iter()
        .map(|(path, idxs)| {
            let mut slots = Vec::new();
            let mut check_deleted = false;
            for i in idxs {
                let hierarchy = &layout.hierarchies[i];
                let dir = hierarchy.dir.join(path.trim_start_matches('/'));
                check_deleted |= !hierarchy.cgroupfs;
                for &source in &hierarchy.sources {
                    slots.push(Slot {
                        source,
                        file: KeptFile::new(dir.join(source.file_name())),
                        absent: false,
                        kept: false,
                    });
                }
            }
            Target {
                workload: classify(&path),
                path,
                slots,
                check_deleted,
                quota: None,
                limit: None,
                quota_read: false,
                last_full: None,
                settings_failed: false,
            }
        })
        .collect();
    // Rows in path order: stable from tick to tick, easy to read.
    targets.sort_by(|a, b| a.path.cmp(&b.path));
    (Discovery { targets, skipped }, watch_failed)
}

/// Moves the descriptors held for `old`'s cgroups into the same files of
/// `new`'s (both in path order), so that a walk opens only what it newly found.
fn keep_open(new: &mut [Target], old: Vec<Target>) {
    let mut old = old.into_iter().peekable();
    for target in new {
        while old.next_if(|o| o.path < target.path).is_some() {}
        let Some(mut prev) = old.next_if(|o| o.path == target.path) else {
            continue;
        };
        for (i, slot) in target.slots.iter_mut().enumerate() {
            if slot.source.is_setting() {
                continue;
            }
            let same = |p: &Slot| p.file.path() == slot.file.path();
            let found = match prev.slots.get(i) {
                Some(p) if same(p) => Some(i),
                _ => prev.slots.iter().position(same),
            };
            if let Some(j) = found {
                std::mem::swap(&mut slot.file, &mut prev.slots[j].file);
                slot.kept = prev.slots[j].kept;
            }
        }
    }
}

/// Include and exclude patterns, compiled once.
struct Filter {
    include: RegexSet,
    exclude: RegexSet,
    /// Set when the patterns did not compile: nothing is sampled.
    broken: Option<String>,
}

impl Filter {
    fn new(config: &CgroupsConfig) -> Filter {
        let include = compile("collectors.cgroups.include", &config.include);
        let exclude = compile("collectors.cgroups.exclude", &config.exclude);
        match (include, exclude) {
            (Ok(include), Ok(exclude)) => Filter {
                include,
                exclude,
                broken: None,
            },
            (Err(e), _) | (_, Err(e)) => Filter {
                include: RegexSet::empty(),
                exclude: RegexSet::empty(),
                broken: Some(e),
            },
        }
    }

    fn accepts(&self, path: &str) -> bool {
        self.broken.is_none()
            && (self.include.is_empty() || self.include.is_match(path))
            && !self.exclude.is_match(path)
    }
}

/// The cgroups among `paths` with no descendant among them: where workloads
/// run, since a parent's usage and stalls hold its children's.
pub fn leaves(paths: &[&str]) -> BTreeSet<String> {
    let sorted: BTreeSet<&str> = paths.iter().copied().collect();
    sorted
        .iter()
        .filter(|p| {
            let prefix = format!("{}/", p.trim_end_matches('/'));
            !sorted
                .range(prefix.as_str()..)
                .next()
                .is_some_and(|next| next.starts_with(&prefix))
        })
        .map(|p| p.to_string())
        .collect()
}

/// How container runtimes name a container's systemd scope:
/// `<prefix><64 hex digits>.scope`.
pub const CONTAINER_SCOPE_PREFIXES: &[&str] = &[
    "docker-",
    "cri-containerd-",
    "crio-",
    "libpod-",
    "containerd-",
];

/// The kind of workload a cgroup holds, from its path alone.
pub fn classify(path: &str) -> &'static str {
    let parts: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
    let Some((&last, ancestors)) = parts.split_last() else {
        return "other";
    };
    let parent = ancestors.last().copied();
    let is_job = |c: &str| {
        c.strip_prefix("job_")
            .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
    };
    if ancestors
        .iter()
        .any(|c| *c == "slurm" || c.starts_with("slurmstepd"))
    {
        if is_job(last) {
            return "slurm_job";
        }
        if ancestors.iter().any(|c| is_job(c)) {
            return "slurm_step";
        }
    }
    let is_pod = |c: &str| {
        (c.starts_with("pod") && c.len() > 3) || (c.contains("-pod") && c.ends_with(".slice"))
    };
    if ancestors.iter().any(|c| c.starts_with("kubepods")) {
        if is_pod(last) {
            return "pod";
        }
        if parent.is_some_and(is_pod) {
            return "container";
        }
    }
    if let Some(scope) = last.strip_suffix(".scope") {
        let runtime = CONTAINER_SCOPE_PREFIXES
            .iter()
            .any(|p| scope.starts_with(p));
        if runtime && !scope.contains("conmon") {
            return "container";
        }
    }
    let is_hex_id = last.len() >= 12 && last.bytes().all(|b| b.is_ascii_hexdigit());
    if is_hex_id
        && matches!(
            parent,
            Some("docker" | "containerd" | "lxc" | "libpod_parent")
        )
    {
        return "container";
    }
    if last.ends_with(".slice") {
        "slice"
    } else if last.ends_with(".service") {
        "service"
    } else {
        "other"
    }
}

/// Values of one row while its files are read.
struct Row {
    /// The fields read so far; the tags are filled when the row is pushed.
    values: CgroupRow<'static>,
    /// v1: cpu.cfs_quota_us and cpu.cfs_period_us, combined once both are read.
    quota_us: Option<i64>,
    period_us: Option<u64>,
}

impl Row {
    fn new() -> Row {
        Row {
            values: CgroupRow::default(),
            quota_us: None,
            period_us: None,
        }
    }

    /// Drops what `source` filled, after it read badly part way.
    fn forget(&mut self, source: Source) {
        for (_, fill) in source.fills() {
            fill.clear(&mut self.values);
        }
        match source {
            Source::CfsQuota => self.quota_us = None,
            Source::CfsPeriod => self.period_us = None,
            _ => {}
        }
    }
}

/// Parses a decimal `u64`, naming the word in the error.
fn number(path: &Path, line: usize, word: &str) -> Result<u64, ParseError> {
    word.parse()
        .map_err(|_| error(path, line, format!("{word:?} is not a number")))
}

/// Parses a file of `key value` lines, each key of `fills` filling its field.
fn keyed(
    text: &str,
    path: &Path,
    fills: &[(&str, Fill)],
    row: &mut Row,
    hz: f64,
) -> Result<(), ParseError> {
    for (n, line) in text.lines().enumerate() {
        if line.is_empty() {
            continue;
        }
        let mut words = line.split_ascii_whitespace();
        let (Some(key), Some(value), None) = (words.next(), words.next(), words.next()) else {
            return Err(error(path, n + 1, format!("{line:?} is not \"key value\"")));
        };
        if let Some((_, fill)) = fills.iter().find(|(k, _)| *k == key) {
            let value = number(path, n + 1, value)?;
            fill.set(&mut row.values, value, hz);
        }
    }
    Ok(())
}

/// The single word of a one-value file.
fn single<'a>(text: &'a str, path: &Path) -> Result<&'a str, ParseError> {
    let mut lines = text.lines().filter(|l| !l.trim().is_empty());
    let (Some(line), None) = (lines.next(), lines.next()) else {
        return Err(error(path, 1, "expected one line"));
    };
    let mut words = line.split_ascii_whitespace();
    match (words.next(), words.next()) {
        (Some(word), None) => Ok(word),
        _ => Err(error(path, 1, format!("{line:?} is not one value"))),
    }
}

/// Reads `total=` of the `some` and `full` lines of a pressure file, in
/// microseconds, into the fields `fills` names for them.
fn pressure(
    text: &str,
    path: &Path,
    fills: &[(&str, Fill)],
    row: &mut Row,
    hz: f64,
) -> Result<(), ParseError> {
    for (n, line) in text.lines().enumerate() {
        let mut words = line.split_ascii_whitespace();
        let Some(kind) = words.next() else {
            continue;
        };
        let Some((_, fill)) = fills.iter().find(|(k, _)| *k == kind) else {
            return Err(error(path, n + 1, format!("unknown line kind {kind:?}")));
        };
        let Some(total) = words.find_map(|w| w.strip_prefix("total=")) else {
            return Err(error(path, n + 1, "no total="));
        };
        let micros = number(path, n + 1, total)?;
        fill.set(&mut row.values, micros, hz);
    }
    Ok(())
}

const MICROS: f64 = 1e6;
const NANOS: f64 = 1e9;

/// Memory limits at or above this are the kernel's "unlimited" (v1 writes
/// `PAGE_COUNTER_MAX` pages: 9223372036854771712 with 4 KiB pages).
const UNLIMITED_BYTES: u64 = 1 << 62;

/// Parses one file's text into `row`.
fn parse(
    source: Source,
    text: &str,
    path: &Path,
    row: &mut Row,
    hz: f64,
) -> Result<(), ParseError> {
    let fills = source.fills();
    // A one-value file's number, into its field.
    let one = |row: &mut Row, n: u64| {
        for (_, fill) in fills {
            fill.set(&mut row.values, n, hz);
        }
    };
    match source {
        Source::CpuStatV2
        | Source::CpuStatV1
        | Source::CpuacctStat
        | Source::MemoryStatV2
        | Source::MemoryStatV1
        | Source::MemoryEvents
        | Source::OomControl => keyed(text, path, fills, row, hz),
        Source::CpuacctUsage
        | Source::MemoryCurrent
        | Source::MemoryUsage
        | Source::SwapCurrent
        | Source::KmemUsage => {
            one(row, number(path, 1, single(text, path)?)?);
            Ok(())
        }
        Source::CpuMax => {
            let mut lines = text.lines();
            let line = lines.next().unwrap_or("");
            let mut words = line.split_ascii_whitespace();
            let (Some(quota), Some(period), None) = (words.next(), words.next(), words.next())
            else {
                return Err(error(path, 1, format!("{line:?} is not \"quota period\"")));
            };
            let period = number(path, 1, period)?;
            if quota != "max" {
                let quota = number(path, 1, quota)?;
                if period == 0 {
                    return Err(error(path, 1, "period 0"));
                }
                row.values.cpu_quota_cpus = Some(quota as f64 / period as f64);
            }
            Ok(())
        }
        Source::CfsQuota => {
            let word = single(text, path)?;
            let quota: i64 = word
                .parse()
                .map_err(|_| error(path, 1, format!("{word:?} is not a number")))?;
            row.quota_us = Some(quota);
            Ok(())
        }
        Source::CfsPeriod => {
            row.period_us = Some(number(path, 1, single(text, path)?)?);
            Ok(())
        }
        Source::MemoryMax => {
            let word = single(text, path)?;
            if word != "max" {
                one(row, number(path, 1, word)?);
            }
            Ok(())
        }
        Source::MemoryLimit => {
            let v = number(path, 1, single(text, path)?)?;
            if v < UNLIMITED_BYTES {
                one(row, v);
            }
            Ok(())
        }
        Source::CpuPressure | Source::MemoryPressure | Source::IoPressure => {
            pressure(text, path, fills, row, hz)
        }
    }
}

/// With the hierarchy watched, the longest time between two walks (or
/// `rescan_interval_secs`, if longer): a net under the watch for changes it
/// cannot see (a cgroup made through a mount of another cgroup namespace,
/// should the kernel not report it here).
pub const WATCHED_WALK_INTERVAL_SECS: f64 = 60.0;

/// The cgroups collector.
pub struct Cgroups {
    root: PathBuf,
    selection: Selection,
    hz: f64,
    layout: Option<Layout>,
    discovery: Discovery,
    /// When the last walk ran; `None` forces one.
    walked_at: Option<i64>,
    /// Whether the next tick reads the settings (limits): set by each walk.
    settings_due: bool,
    /// When the last tick that read every file of every cgroup ran.
    full_read_at: Option<i64>,
    /// Whether walks wait for the watch to see a change (on unless
    /// `rescan_interval_secs` is 0, which walks on every read).
    watch_changes: bool,
    /// The watch over the directories of the last walk; `None` when there is
    /// none (then the hierarchy is walked every `rescan_interval_secs`).
    watch: Option<CgroupWatch>,
    /// Why the hierarchy is not watched, once that is known.
    unwatched: Option<String>,
    /// Walks since the collector was made.
    walks: u64,
    /// One buffer for every file of a tick.
    buf: Vec<u8>,
    /// Files that read badly at the last tick: each costs only its own
    /// fields of its own cgroup's row.
    errors: Vec<ParseError>,
}

impl Cgroups {
    /// A cgroups collector reading under `<sysfs>/fs/cgroup`.
    pub fn new(config: &CgroupsConfig, roots: &Roots) -> Self {
        Cgroups {
            root: roots.sys("fs/cgroup"),
            selection: Selection::new(config),
            hz: super::user_hz(),
            layout: None,
            discovery: Discovery::default(),
            walked_at: None,
            settings_due: true,
            full_read_at: None,
            watch_changes: config.rescan_interval_secs > 0.0,
            watch: None,
            unwatched: None,
            walks: 0,
            buf: vec![0; 8192],
            errors: Vec::new(),
        }
    }

    fn rewalk(&mut self, time_us: i64) -> anyhow::Result<()> {
        if self.layout.is_none() {
            self.layout = Some(detect(&self.root).map_err(anyhow::Error::msg)?);
        }
        let layout = self.layout.as_ref().expect("set above");
        // A fresh watch each walk: closing the old one drops its watches,
        // including those of cgroups gone since.
        self.watch = None;
        let mut watch = None;
        let mut unwatched = None;
        if self.watch_changes {
            match CgroupWatch::new(layout.limit_files()) {
                Ok(w) => watch = Some(w),
                Err(e) => unwatched = Some(e),
            }
        }
        let old = std::mem::take(&mut self.discovery);
        let (discovery, watch_failed) = walk(layout, &self.selection, &mut watch);
        self.discovery = discovery;
        keep_open(&mut self.discovery.targets, old.targets);
        unwatched = unwatched.or(watch_failed);
        if self.watch_changes && unwatched.is_some() && self.unwatched != unwatched {
            tracing::info!(
                reason = unwatched.as_deref().unwrap_or_default(),
                rescan_interval_secs = self.selection.rescan_interval_secs(),
                "Cgroup changes are not watched; the hierarchy is walked every rescan_interval_secs instead."
            );
        }
        self.unwatched = unwatched;
        self.watch = watch;
        self.walked_at = Some(time_us);
        self.settings_due = true;
        self.walks += 1;
        Ok(())
    }

    /// Whether this tick walks: the first, after a cgroup vanished, when the
    /// watch saw a change or has watched for `WATCHED_WALK_INTERVAL_SECS`,
    /// and without a watch every `rescan_interval_secs`.
    fn walk_due(&mut self, time_us: i64) -> bool {
        let Some(watch) = self.watch.as_mut() else {
            return self.selection.rescan_due(self.walked_at, time_us);
        };
        let net_us = self
            .selection
            .rescan_us
            .max((WATCHED_WALK_INTERVAL_SECS * 1e6) as i64);
        // Events are read on every tick, so that they do not pile up.
        watch.changed() || due(self.walked_at, time_us, net_us)
    }

    /// Reads every target into a batch; a vanished cgroup forces a walk next
    /// tick. Measurements are read through descriptors kept open; settings only
    /// on the tick after a walk, their values repeated in between. A quiet
    /// cgroup's usage-following files are skipped, their values repeated from
    /// its last full read; the tick after a walk reads every file of every
    /// cgroup, so no repeated value is older than `rescan_interval_secs`. A
    /// file that reads badly costs only its fields of its cgroup's row and is
    /// kept in `errors`; the tick fails only when no cgroup gave a row.
    fn read_all(&mut self, time_us: i64) -> Result<Batch, ParseError> {
        let mut builder = BatchBuilder::new(&CGROUP);
        let mut vanished = false;
        let settings = self.settings_due;
        // Quiet cgroups are read whole after each walk and every
        // `rescan_interval_secs`, so that no repeated value is older.
        let full = settings || self.selection.rescan_due(self.full_read_at, time_us);
        if full {
            self.full_read_at = Some(time_us);
        }
        let mut pushed = 0;
        for target in &mut self.discovery.targets {
            let mut row = Row::new();
            // A limit that read badly is read again at the next tick, not at
            // the next walk.
            let settings = settings || target.settings_failed;
            let mut setting_failed = false;
            let errors_before = self.errors.len();
            let errors = &mut self.errors;
            // Outside cgroupfs a deleted file stays readable: one fstat per
            // cgroup per tick, on its first file read through a kept descriptor.
            let mut check = target.check_deleted;
            // The usage (CPU time, memory charge), pressure and settings first:
            // they say whether the rest is worth reading.
            let mut read = |target: &mut Target, row: &mut Row, follows_usage: bool| {
                let slots = target.slots.iter_mut();
                for slot in slots.filter(|s| s.source.follows_usage() == follows_usage) {
                    match read_slot(slot, &mut self.buf, row, self.hz, settings, &mut check) {
                        Ok(true) => return true,
                        Ok(false) => {}
                        // A file that reads badly costs its own fields of
                        // this cgroup's row, not the row nor other cgroups'.
                        Err(e) => {
                            row.forget(slot.source);
                            setting_failed |= slot.source.is_setting();
                            errors.push(e);
                        }
                    }
                }
                false
            };
            let mut gone = read(target, &mut row, false);
            let quiet = !gone && !full && target.quiet(&row);
            if quiet {
                let last = target.last_full.as_mut().expect("quiet needs a full read");
                for slot in target.slots.iter().filter(|s| s.source.follows_usage()) {
                    for (_, fill) in slot.source.fills() {
                        fill.copy(last, &mut row.values);
                    }
                }
            } else if !gone {
                gone = read(target, &mut row, true);
            }
            if gone {
                // A cgroup that went mid-read (its container exited) is no
                // error: what its files held before they went is not kept.
                self.errors.truncate(errors_before);
                // Let go of its files: a walk that finds the path again opens them afresh.
                for slot in &mut target.slots {
                    slot.file.close();
                    slot.kept = false;
                }
                vanished = true;
                continue;
            }
            let failed = self.errors.len() > errors_before;
            if settings {
                if let (Some(quota), Some(period)) = (row.quota_us, row.period_us) {
                    if quota > 0 && period > 0 {
                        row.values.cpu_quota_cpus = Some(quota as f64 / period as f64);
                    }
                }
                target.quota = row.values.cpu_quota_cpus;
                target.limit = row.values.memory_limit_bytes;
                target.quota_read = row.quota_us.is_some();
                target.settings_failed = setting_failed;
            } else {
                row.values.cpu_quota_cpus = target.quota;
                row.values.memory_limit_bytes = target.limit;
            }
            if failed {
                // Nulls are not repeated: the next tick reads every file of it.
                target.last_full = None;
            } else if !quiet {
                target.last_full = Some(row.values.clone());
            }
            if row.values == CgroupRow::default() && !target.quota_read {
                continue; // nothing readable: no row rather than a row of nulls
            }
            let values = CgroupRow {
                path: &target.path,
                workload: target.workload,
                ..row.values
            };
            builder
                .push_row(time_us, &values)
                .map_err(|e| error(Path::new(&target.path), 0, e.to_string()))?;
            pushed += 1;
        }
        if vanished {
            self.walked_at = None;
        }
        self.settings_due = false;
        if pushed == 0 && !self.errors.is_empty() {
            // Nothing read well: the hierarchy is bad, not a file of it.
            return Err(self.errors.remove(0));
        }
        Ok(builder.finish())
    }
}

/// Reads one file of a cgroup into `row`; `Ok(true)` when the cgroup is gone.
/// A setting is read only on a `settings` tick and closed after it; a file
/// absent since the last walk is skipped. `check` asks for one `fstat` on the
/// first file read through a kept descriptor (outside cgroupfs, where a
/// deleted file stays readable) and is cleared once it has been done.
fn read_slot(
    slot: &mut Slot,
    buf: &mut Vec<u8>,
    row: &mut Row,
    hz: f64,
    settings: bool,
    check: &mut bool,
) -> Result<bool, ParseError> {
    let setting = slot.source.is_setting();
    if slot.absent || (setting && !settings) {
        return Ok(false);
    }
    let was_kept = slot.kept;
    let mut read = slot.file.read(buf);
    if was_kept && matches!(&read, Err(e) if super::kept::is_gone(e)) {
        // The descriptor was of a cgroup removed since; one made again at the
        // same path (a restarted service) is opened afresh.
        read = slot.file.read(buf);
    }
    if setting {
        slot.file.close(); // read again at the next rescan only
    }
    slot.kept = !setting && read.is_ok();
    match read {
        Ok(n) => {
            if *check && was_kept && slot.kept {
                *check = false;
                if slot.file.is_deleted() {
                    return Ok(true);
                }
            }
            let path = slot.file.path();
            let text =
                std::str::from_utf8(&buf[..n]).map_err(|_| error(path, 0, "not UTF-8 text"))?;
            parse(slot.source, text, path, row, hz)?;
            Ok(false)
        }
        Err(e) if super::kept::is_gone(&e) => {
            if slot.file.path().parent().is_some_and(|d| d.is_dir()) {
                // The cgroup is there, this file is not (controller off, no
                // swap accounting): skip it until the next walk.
                slot.absent = true;
                Ok(false)
            } else {
                Ok(true)
            }
        }
        Err(e) => Err(error(slot.file.path(), 0, e.to_string())),
    }
}

impl Collector for Cgroups {
    fn name(&self) -> &'static str {
        "cgroups"
    }

    fn probe(&mut self) -> Availability {
        self.layout = None;
        if let Err(e) = self.rewalk(0) {
            return Availability::Absent(e.to_string());
        }
        self.walked_at = None; // the first collect walks again, at its own time
        let layout = self.layout.as_ref().expect("rewalk detected it");
        let found = format!(
            "{} cgroups within depth {}{}",
            self.discovery.targets.len(),
            self.selection.max_depth(),
            if self.discovery.skipped > 0 {
                format!(" ({} over max_cgroups skipped)", self.discovery.skipped)
            } else {
                String::new()
            }
        );
        let walks = match (&self.watch, &self.unwatched) {
            (Some(watch), _) => format!(
                "; walked when inotify reports a change ({} directories watched)",
                watch.watched
            ),
            (None, Some(reason)) => format!(
                "; walked every {} s ({reason})",
                self.selection.rescan_interval_secs()
            ),
            (None, None) => "; walked on every read".to_string(),
        };
        Availability::Available(if layout.unified {
            format!(
                "cgroup v2 (controllers: {}), {found}{walks}",
                layout.controllers
            )
        } else {
            let names: Vec<&str> = layout.hierarchies.iter().map(|h| h.name.as_str()).collect();
            format!("cgroup v1 ({}), {found}{walks}", names.join(" "))
        })
    }

    fn collect(&mut self, time_us: i64) -> anyhow::Result<Vec<Batch>> {
        self.errors.clear();
        if self.walk_due(time_us) {
            self.rewalk(time_us)?;
        }
        let batch = self.read_all(time_us)?;
        Ok(if batch.is_empty() {
            Vec::new()
        } else {
            vec![batch]
        })
    }

    fn source_errors(&self) -> Vec<ParseError> {
        self.errors.clone()
    }

    fn problems(&self) -> Vec<String> {
        let mut problems = Vec::new();
        if let Some(broken) = self.selection.broken() {
            problems.push(format!("{broken}: no cgroup is sampled"));
        }
        if self.discovery.skipped > 0 {
            problems.push(format!(
                "{} cgroups over collectors.cgroups.max_cgroups = {} are not sampled: raise it, or narrow include/exclude or max_depth",
                self.discovery.skipped,
                self.selection.max_cgroups()
            ));
        }
        problems
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::collectors::testutil::copy_tree;
    use vtax_store::batch::Values;
    use vtax_store::Value;

    fn fixture(node: &str) -> Roots {
        let base = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../tests/fixtures")
            .join(node);
        Roots {
            procfs: base.join("proc"),
            sysfs: base.join("sys"),
            ..Roots::default()
        }
    }

    fn collector(config: &CgroupsConfig, roots: &Roots) -> Cgroups {
        let mut c = Cgroups::new(config, roots);
        c.hz = 100.0; // USER_HZ on every Linux; fixed so the test does not ask the host
        c
    }

    fn collect_one(c: &mut Cgroups, time_us: i64) -> Batch {
        let mut batches = c.collect(time_us).unwrap();
        assert_eq!(batches.len(), 1);
        batches.pop().unwrap()
    }

    fn paths(batch: &Batch) -> Vec<&str> {
        batch.tags[0]
            .codes
            .iter()
            .map(|&c| batch.tags[0].dict[c as usize].as_str())
            .collect()
    }

    fn row(batch: &Batch, path: &str) -> usize {
        paths(batch)
            .iter()
            .position(|p| *p == path)
            .unwrap_or_else(|| panic!("no row for {path}: {:?}", paths(batch)))
    }

    fn workload<'a>(batch: &'a Batch, path: &str) -> &'a str {
        let code = batch.tags[1].codes[row(batch, path)];
        &batch.tags[1].dict[code as usize]
    }

    fn value(batch: &Batch, path: &str, name: &str) -> Value {
        let i = row(batch, path);
        let column = &batch.fields[CGROUP.field_index(name).expect(name)];
        if !column.is_valid(i) {
            return Value::Null;
        }
        match &column.values {
            Values::F64(v) => Value::F64(v[i]),
            Values::I64(v) => Value::I64(v[i]),
            Values::U64(v) => Value::U64(v[i]),
        }
    }

    fn close(v: Value, want: f64) -> bool {
        matches!(v, Value::F64(x) if (x - want).abs() < 1e-9)
    }

    const POD: &str = "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod7c9a3d2e_5b1f_4c8e_9a6d_2f1e0b3c4d5a.slice";
    const CRI: &str =
        "cri-containerd-8cf99c0bd8a71b2f1b068d6d096278cf4162dbf52d4986c27018e794a8d7befa.scope";
    const DOCKER: &str = "/docker/3df9abf61f01116639c75d725819956b13a05e6b04e94e47886de71811ab243a";
    const JOB_V2: &str = "/system.slice/slurmstepd.scope/job_77";
    const JOB_V1: &str = "/slurm/uid_1000/job_4242";

    /// The fields a file fills, by name, from its declaration.
    fn filled_by(source: Source) -> Vec<&'static str> {
        source
            .fills()
            .iter()
            .map(|(key, fill)| {
                let mut row = CgroupRow::default();
                fill.set(&mut row, 1, 100.0);
                let names = set_fields(&row);
                assert_eq!(names.len(), 1, "{source:?} {key:?}: {names:?}");
                names[0]
            })
            .collect()
    }

    /// The fields of `row` that are not null, by name.
    fn set_fields(row: &CgroupRow) -> Vec<&'static str> {
        let mut rows = BatchBuilder::new(&CGROUP);
        rows.push_row(0, row).unwrap();
        let batch = rows.finish();
        CGROUP
            .fields
            .iter()
            .zip(&batch.fields)
            .filter(|(_, column)| column.is_valid(0))
            .map(|(field, _)| field.name)
            .collect()
    }

    const ALL_SOURCES: [Source; 20] = [
        Source::CpuStatV2,
        Source::CpuMax,
        Source::MemoryCurrent,
        Source::MemoryMax,
        Source::MemoryStatV2,
        Source::MemoryEvents,
        Source::SwapCurrent,
        Source::CpuPressure,
        Source::MemoryPressure,
        Source::IoPressure,
        Source::CpuStatV1,
        Source::CfsQuota,
        Source::CfsPeriod,
        Source::CpuacctUsage,
        Source::CpuacctStat,
        Source::MemoryUsage,
        Source::MemoryLimit,
        Source::MemoryStatV1,
        Source::OomControl,
        Source::KmemUsage,
    ];

    #[test]
    fn each_key_fills_a_field_and_every_field_has_a_file() {
        CGROUP.validate().unwrap();
        assert!(CGROUP.name.starts_with("cgroup"));
        let mut filled = BTreeSet::new();
        for source in ALL_SOURCES {
            let names = filled_by(source);
            let unique: BTreeSet<&str> = names.iter().copied().collect();
            assert_eq!(unique.len(), names.len(), "{source:?} fills {names:?}");
            let keys: BTreeSet<&str> = source.fills().iter().map(|(k, _)| *k).collect();
            assert_eq!(keys.len(), names.len(), "{source:?}: a key twice");
            filled.extend(names);
        }
        let all: BTreeSet<&str> = CGROUP.fields.iter().map(|f| f.name).collect();
        assert_eq!(filled, all);
        // Each layout has its own file for a field, never two of one layout.
        let v1: Vec<&str> = [
            CPU_SOURCES,
            CPUACCT_SOURCES,
            MEMORY_SOURCES,
            PRESSURE_SOURCES,
        ]
        .concat()
        .into_iter()
        .flat_map(filled_by)
        .collect();
        let v2: Vec<&str> = V2_SOURCES.iter().copied().flat_map(filled_by).collect();
        for names in [&v1, &v2] {
            let unique: BTreeSet<&str> = names.iter().copied().collect();
            assert_eq!(unique.len(), names.len(), "{names:?}");
        }
    }

    #[test]
    fn v2_tree_with_a_pod_and_a_slurm_job() {
        let roots = fixture("k8s-node");
        let mut c = collector(&CgroupsConfig::default(), &roots);
        let Availability::Available(summary) = c.probe() else {
            panic!("v2 fixture is absent");
        };
        assert_eq!(
            summary,
            "cgroup v2 (controllers: cpuset cpu io memory hugetlb pids rdma misc), 15 cgroups within depth 4; \
             walked when inotify reports a change (16 directories watched)"
        );
        let batch = collect_one(&mut c, 7);
        assert_eq!(batch.len(), 15, "{:?}", paths(&batch));
        assert!(batch.time_us.iter().all(|&t| t == 7));
        let ctr = format!("{POD}/{CRI}");
        assert_eq!(workload(&batch, &ctr), "container");
        assert_eq!(workload(&batch, POD), "pod");
        assert_eq!(workload(&batch, "/kubepods.slice"), "slice");
        assert_eq!(workload(&batch, "/system.slice/kubelet.service"), "service");
        assert_eq!(workload(&batch, JOB_V2), "slurm_job");
        assert_eq!(workload(&batch, &format!("{JOB_V2}/step_0")), "slurm_step");
        assert_eq!(workload(&batch, "/init.scope"), "other");

        let v = |name| value(&batch, &ctr, name);
        assert!(close(v("cpu_usage_seconds"), 98.765432));
        assert!(close(v("cpu_user_seconds"), 80.0));
        assert!(close(v("cpu_system_seconds"), 18.765432));
        assert_eq!(v("cpu_periods"), Value::U64(40_000));
        assert_eq!(v("cpu_throttled_periods"), Value::U64(1_500));
        assert!(close(v("cpu_throttled_seconds"), 61.5));
        assert!(close(v("cpu_quota_cpus"), 1.5));
        assert_eq!(v("memory_usage_bytes"), Value::U64(402_653_184));
        assert_eq!(v("memory_limit_bytes"), Value::U64(536_870_912));
        assert_eq!(v("memory_anon_bytes"), Value::U64(314_572_800));
        assert_eq!(v("memory_file_bytes"), Value::U64(62_914_560));
        assert_eq!(v("memory_kernel_bytes"), Value::U64(20_971_520));
        assert_eq!(v("memory_slab_bytes"), Value::U64(12_582_912));
        assert_eq!(v("memory_swap_bytes"), Value::U64(0));
        assert_eq!(v("memory_page_faults"), Value::U64(2_500_000));
        assert_eq!(v("memory_major_page_faults"), Value::U64(310));
        assert_eq!(v("memory_max_events"), Value::U64(57));
        assert_eq!(v("memory_oom_events"), Value::U64(2));
        assert_eq!(v("memory_oom_kills"), Value::U64(1));
        assert!(close(v("cpu_pressure_some_seconds"), 45.0));
        assert!(close(v("cpu_pressure_full_seconds"), 30.0));
        assert!(close(v("memory_pressure_some_seconds"), 1.2));
        assert!(close(v("memory_pressure_full_seconds"), 0.8));
        assert!(close(v("io_pressure_some_seconds"), 0.25));
        assert!(close(v("io_pressure_full_seconds"), 0.1));

        // Unlimited: cpu.max "max 100000" and memory.max "max" are null.
        assert_eq!(value(&batch, POD, "cpu_quota_cpus"), Value::Null);
        assert_eq!(value(&batch, POD, "memory_limit_bytes"), Value::Null);
        assert_eq!(
            value(&batch, JOB_V2, "memory_limit_bytes"),
            Value::U64(34_359_738_368)
        );
        // No cpu controller in user.slice: no throttling, no quota; usage still there.
        assert_eq!(value(&batch, "/user.slice", "cpu_periods"), Value::Null);
        assert!(close(
            value(&batch, "/user.slice", "cpu_usage_seconds"),
            55.0
        ));
        // No memory.swap.current in init.scope.
        assert_eq!(
            value(&batch, "/init.scope", "memory_swap_bytes"),
            Value::Null
        );
        // Rows are in path order, and the same on the next tick.
        let order = paths(&batch)
            .iter()
            .map(|s| s.to_string())
            .collect::<Vec<_>>();
        let mut sorted = order.clone();
        sorted.sort();
        assert_eq!(order, sorted);
        let again = collect_one(&mut c, 8);
        assert_eq!(paths(&again), order);
        assert!(c.problems().is_empty());
    }

    #[test]
    fn v1_tree_with_slurm_docker_and_a_service() {
        let roots = fixture("baremetal-node");
        let mut c = collector(&CgroupsConfig::default(), &roots);
        let Availability::Available(summary) = c.probe() else {
            panic!("v1 fixture is absent");
        };
        // `cpu` and `cpuacct` link to `cpu,cpuacct`: walked once.
        assert_eq!(
            summary,
            "cgroup v1 (cpu,cpuacct memory unified), 10 cgroups within depth 4; \
             walked when inotify reports a change (26 directories watched)"
        );
        let batch = collect_one(&mut c, 1);
        assert_eq!(
            paths(&batch),
            [
                "/docker",
                DOCKER,
                "/slurm",
                "/slurm/uid_1000",
                JOB_V1,
                "/slurm/uid_1000/job_4242/step_0",
                "/slurm/uid_1000/job_4242/step_batch",
                "/system.slice",
                "/system.slice/docker.service",
                "/system.slice/slurmd.service",
            ]
        );
        assert_eq!(workload(&batch, DOCKER), "container");
        assert_eq!(workload(&batch, "/docker"), "other");
        assert_eq!(workload(&batch, JOB_V1), "slurm_job");
        assert_eq!(
            workload(&batch, "/slurm/uid_1000/job_4242/step_batch"),
            "slurm_step"
        );
        assert_eq!(workload(&batch, "/system.slice/slurmd.service"), "service");

        let v = |name| value(&batch, DOCKER, name);
        assert!(close(v("cpu_usage_seconds"), 123.456789012));
        assert!(close(v("cpu_user_seconds"), 100.0));
        assert!(close(v("cpu_system_seconds"), 23.45));
        assert_eq!(v("cpu_periods"), Value::U64(5_000));
        assert_eq!(v("cpu_throttled_periods"), Value::U64(120));
        assert!(close(v("cpu_throttled_seconds"), 3.5));
        assert!(close(v("cpu_quota_cpus"), 2.0));
        assert_eq!(v("memory_usage_bytes"), Value::U64(1_073_741_824));
        assert_eq!(v("memory_limit_bytes"), Value::U64(2_147_483_648));
        assert_eq!(v("memory_anon_bytes"), Value::U64(805_306_368));
        assert_eq!(v("memory_file_bytes"), Value::U64(201_326_592));
        assert_eq!(v("memory_kernel_bytes"), Value::U64(52_428_800));
        assert_eq!(v("memory_slab_bytes"), Value::Null);
        assert_eq!(v("memory_swap_bytes"), Value::U64(0));
        assert_eq!(v("memory_page_faults"), Value::U64(1_000_000));
        assert_eq!(v("memory_major_page_faults"), Value::U64(42));
        assert_eq!(v("memory_oom_events"), Value::Null);
        assert_eq!(v("memory_oom_kills"), Value::U64(0));
        assert_eq!(v("cpu_pressure_some_seconds"), Value::Null);

        // The job: unlimited CPU (-1), a 64 GiB limit, one OOM kill.
        assert_eq!(value(&batch, JOB_V1, "cpu_quota_cpus"), Value::Null);
        assert_eq!(
            value(&batch, JOB_V1, "memory_limit_bytes"),
            Value::U64(68_719_476_736)
        );
        assert_eq!(value(&batch, JOB_V1, "memory_oom_kills"), Value::U64(1));
        assert!(close(value(&batch, JOB_V1, "cpu_usage_seconds"), 7200.0));
        // slurmd: the v1 "unlimited" 9223372036854771712 is null; pressure from unified/.
        let slurmd = "/system.slice/slurmd.service";
        assert_eq!(value(&batch, slurmd, "memory_limit_bytes"), Value::Null);
        assert!(close(
            value(&batch, slurmd, "cpu_pressure_some_seconds"),
            1.234567
        ));
        assert!(close(
            value(&batch, slurmd, "io_pressure_full_seconds"),
            0.345678
        ));
    }

    #[test]
    fn vm_node_capture_is_hybrid_v1_with_memory_cgroups() {
        let roots = fixture("vm-node");
        let mut c = collector(&CgroupsConfig::default(), &roots);
        let Availability::Available(summary) = c.probe() else {
            panic!("vm fixture is absent");
        };
        assert!(
            summary.starts_with("cgroup v1 (cpu cpuacct memory unified), "),
            "{summary}"
        );
        let batch = collect_one(&mut c, 1);
        let p = "/process_api/509751c12dfd1497b902bf88fa589d7f";
        assert_eq!(workload(&batch, p), "other");
        assert_eq!(
            value(&batch, p, "memory_usage_bytes"),
            Value::U64(12_464_128)
        );
        assert_eq!(value(&batch, p, "memory_limit_bytes"), Value::Null);
        assert_eq!(value(&batch, p, "memory_anon_bytes"), Value::U64(1_855_488));
        assert_eq!(
            value(&batch, p, "memory_kernel_bytes"),
            Value::U64(1_822_720)
        );
        assert_eq!(value(&batch, p, "cpu_usage_seconds"), Value::Null);
    }

    #[test]
    fn depth_bounds_the_walk() {
        let roots = fixture("k8s-node");
        let shallow = CgroupsConfig {
            max_depth: 1,
            ..CgroupsConfig::default()
        };
        let batch = collect_one(&mut collector(&shallow, &roots), 1);
        assert_eq!(
            paths(&batch),
            [
                "/init.scope",
                "/kubepods.slice",
                "/system.slice",
                "/user.slice"
            ]
        );
        let deep = CgroupsConfig {
            max_depth: 8,
            ..CgroupsConfig::default()
        };
        let batch = collect_one(&mut collector(&deep, &roots), 1);
        assert_eq!(batch.len(), 17);
        assert_eq!(
            workload(&batch, &format!("{JOB_V2}/step_0/user/task_0")),
            "slurm_step"
        );
    }

    #[test]
    fn include_and_exclude_patterns() {
        let roots = fixture("k8s-node");
        let config = CgroupsConfig {
            include: vec!["/job_[0-9]+".into(), r"\.service$".into()],
            exclude: vec!["step_batch$".into(), "^/system.slice/kubelet".into()],
            ..CgroupsConfig::default()
        };
        let batch = collect_one(&mut collector(&config, &roots), 1);
        assert_eq!(
            paths(&batch),
            [
                "/system.slice/containerd.service",
                JOB_V2,
                "/system.slice/slurmstepd.scope/job_77/step_0",
            ]
        );
        // Patterns that match nothing: no rows, no batch, no error.
        let none = CgroupsConfig {
            include: vec!["^/nothing$".into()],
            ..CgroupsConfig::default()
        };
        assert!(collector(&none, &roots).collect(1).unwrap().is_empty());
    }

    #[test]
    fn max_cgroups_keeps_the_shallowest_and_reports_the_rest() {
        let roots = fixture("k8s-node");
        let config = CgroupsConfig {
            max_cgroups: 5,
            ..CgroupsConfig::default()
        };
        let mut c = collector(&config, &roots);
        let batch = collect_one(&mut c, 1);
        assert_eq!(
            paths(&batch),
            [
                "/init.scope",
                "/kubepods.slice",
                "/kubepods.slice/kubepods-besteffort.slice",
                "/system.slice",
                "/user.slice",
            ]
        );
        assert_eq!(
            c.problems(),
            ["10 cgroups over collectors.cgroups.max_cgroups = 5 are not sampled: raise it, or narrow include/exclude or max_depth"]
        );
        let Availability::Available(summary) = c.probe() else {
            panic!()
        };
        assert!(
            summary.contains("5 cgroups within depth 4 (10 over max_cgroups skipped);"),
            "{summary}"
        );
    }

    /// A copy of a fixture's cgroup tree that a test may change.
    fn scratch(node: &str) -> (tempfile::TempDir, Roots) {
        let dir = tempfile::tempdir().unwrap();
        copy_tree(
            &fixture(node).sysfs.join("fs/cgroup"),
            &dir.path().join("sys/fs/cgroup"),
        );
        let roots = Roots {
            procfs: dir.path().join("proc"),
            sysfs: dir.path().join("sys"),
            ..Roots::default()
        };
        (dir, roots)
    }

    #[test]
    fn a_cgroup_removed_between_ticks_is_dropped_silently() {
        for (node, gone) in [("k8s-node", JOB_V2), ("baremetal-node", JOB_V1)] {
            let (_dir, roots) = scratch(node);
            let config = CgroupsConfig {
                rescan_interval_secs: 3600.0,
                ..CgroupsConfig::default()
            };
            let mut c = collector(&config, &roots);
            let before = collect_one(&mut c, 1_000_000);
            assert!(paths(&before).contains(&gone));
            // The job ends: its whole subtree goes, in every hierarchy.
            let cgroup = roots.sys("fs/cgroup");
            for hierarchy in ["", "cpu,cpuacct", "memory"] {
                let dir = cgroup.join(hierarchy).join(gone.trim_start_matches('/'));
                if dir.exists() {
                    std::fs::remove_dir_all(dir).unwrap();
                }
            }
            let after = collect_one(&mut c, 2_000_000);
            assert!(!paths(&after).iter().any(|p| p.starts_with(gone)), "{node}");
            assert_eq!(after.len(), before.len() - 3, "{node}");
            // The vanished job forced a walk: a new cgroup is found on the next tick
            // although the rescan interval is an hour.
            let new = cgroup.join("system.slice/late.service");
            std::fs::create_dir_all(cgroup.join("memory/system.slice/late.service")).unwrap();
            std::fs::create_dir_all(&new).unwrap();
            std::fs::write(new.join("memory.current"), "4096\n").unwrap();
            std::fs::write(
                cgroup.join("memory/system.slice/late.service/memory.usage_in_bytes"),
                "4096\n",
            )
            .unwrap();
            let later = collect_one(&mut c, 3_000_000);
            assert_eq!(
                value(&later, "/system.slice/late.service", "memory_usage_bytes"),
                Value::U64(4096),
                "{node}"
            );
        }
    }

    /// Walks cost 12-15% of the collector's CPU at one every 10 s; with the
    /// hierarchy watched, one runs when a cgroup comes or a limit changes,
    /// and the change is in the next read instead of up to 10 s later.
    #[test]
    fn a_new_cgroup_or_a_changed_limit_is_read_at_the_next_tick_and_quiet_ticks_do_not_walk() {
        let (_dir, roots) = scratch("k8s-node");
        let mut c = collector(&CgroupsConfig::default(), &roots);
        assert_eq!(collect_one(&mut c, 0).len(), 15);
        assert!(c.watch.as_ref().is_some_and(|w| w.watched > 15));
        for second in 1..=30 {
            assert_eq!(collect_one(&mut c, second * 1_000_000).len(), 15);
        }
        assert_eq!(c.walks, 1, "nothing changed, nothing to walk for");

        let new = roots.sys("fs/cgroup/system.slice/late.service");
        std::fs::create_dir_all(&new).unwrap();
        std::fs::write(new.join("memory.current"), "4096\n").unwrap();
        let batch = collect_one(&mut c, 31_000_000);
        assert_eq!(batch.len(), 16);
        assert_eq!(
            value(&batch, "/system.slice/late.service", "memory_usage_bytes"),
            Value::U64(4096)
        );
        assert_eq!(c.walks, 2);

        let pods = "/kubepods.slice/kubepods-burstable.slice";
        std::fs::write(
            roots.sys(format!("fs/cgroup{pods}/memory.max")),
            "1073741824\n",
        )
        .unwrap();
        let batch = collect_one(&mut c, 32_000_000);
        assert_eq!(
            value(&batch, pods, "memory_limit_bytes"),
            Value::U64(1 << 30)
        );
        assert_eq!(c.walks, 3);

        // The net under the watch: a walk a minute after the last.
        collect_one(&mut c, 91_000_000);
        assert_eq!(c.walks, 3);
        collect_one(&mut c, 92_000_000);
        assert_eq!(c.walks, 4);
    }

    #[test]
    fn without_a_watch_new_cgroups_are_found_at_the_rescan_interval() {
        let (_dir, roots) = scratch("k8s-node");
        let mut c = collector(&CgroupsConfig::default(), &roots);
        c.watch_changes = false; // as where inotify cannot be had
        assert_eq!(collect_one(&mut c, 0).len(), 15);
        assert!(c.watch.is_none());
        let new = roots.sys("fs/cgroup/system.slice/late.service");
        std::fs::create_dir_all(&new).unwrap();
        std::fs::write(new.join("memory.current"), "4096\n").unwrap();
        assert_eq!(collect_one(&mut c, 9_000_000).len(), 15);
        assert_eq!(collect_one(&mut c, 10_000_000).len(), 16);
    }

    /// Rewrites the `key value` line of `key` in a cgroup file, in place.
    fn set_key(file: &Path, key: &str, value: u64) {
        let text = std::fs::read_to_string(file).unwrap();
        let lines: Vec<String> = text
            .lines()
            .map(|line| match line.split_once(' ') {
                Some((k, _)) if k == key => format!("{key} {value}"),
                _ => line.to_string(),
            })
            .collect();
        assert!(
            lines.iter().any(|l| l.starts_with(&format!("{key} "))),
            "{key}"
        );
        std::fs::write(file, lines.join("\n") + "\n").unwrap();
    }

    #[test]
    fn a_quiet_cgroup_repeats_what_follows_usage_until_its_usage_moves_or_a_rescan() {
        // (node, cgroup, its directory per hierarchy: cpu, memory, pressure; the
        // memory.stat key behind memory_page_faults)
        for (node, path, cpu_dir, memory_dir, pressure_dir, faults_key) in [
            (
                "k8s-node",
                "/init.scope",
                "init.scope",
                "init.scope",
                "init.scope",
                "pgfault",
            ),
            (
                "baremetal-node",
                "/system.slice/slurmd.service",
                "cpu,cpuacct/system.slice/slurmd.service",
                "memory/system.slice/slurmd.service",
                "unified/system.slice/slurmd.service",
                "total_pgfault",
            ),
        ] {
            let (_dir, roots) = scratch(node);
            let cgroup = roots.sys("fs/cgroup");
            let stat = cgroup.join(memory_dir).join("memory.stat");
            let bump_cpu = |usage: u64| {
                if node == "k8s-node" {
                    set_key(&cgroup.join(cpu_dir).join("cpu.stat"), "usage_usec", usage);
                } else {
                    let file = cgroup.join(cpu_dir).join("cpuacct.usage");
                    std::fs::write(file, format!("{}\n", usage * 1000)).unwrap();
                }
            };
            let bump_memory = |bytes: u64| {
                let file = if node == "k8s-node" {
                    "memory.current"
                } else {
                    "memory.usage_in_bytes"
                };
                std::fs::write(cgroup.join(memory_dir).join(file), format!("{bytes}\n")).unwrap();
            };
            let mut c = collector(&CgroupsConfig::default(), &roots); // rescans every 10 s
            let faults = |batch: &Batch| match value(batch, path, "memory_page_faults") {
                Value::U64(n) => n,
                other => panic!("{node}: {other:?}"),
            };
            let base = faults(&collect_one(&mut c, 0));

            // Nothing ran and no charge moved: memory.stat is not read again,
            // but pressure (which grows for a blocked task) is.
            set_key(&stat, faults_key, base + 5);
            std::fs::write(
                cgroup.join(pressure_dir).join("cpu.pressure"),
                "some avg10=0.00 avg60=0.00 avg300=0.00 total=9000000\n\
                 full avg10=0.00 avg60=0.00 avg300=0.00 total=4000000\n",
            )
            .unwrap();
            let quiet = collect_one(&mut c, 1_000_000);
            assert_eq!(faults(&quiet), base, "{node}");
            assert!(
                close(value(&quiet, path, "cpu_pressure_some_seconds"), 9.0),
                "{node}"
            );

            // Its tasks ran: everything is read.
            bump_cpu(99_000_000);
            assert_eq!(faults(&collect_one(&mut c, 2_000_000)), base + 5, "{node}");
            // Its charge moved (reclaim by someone else, say): everything is read.
            set_key(&stat, faults_key, base + 6);
            assert_eq!(faults(&collect_one(&mut c, 3_000_000)), base + 5, "{node}");
            bump_memory(123_456_789);
            assert_eq!(faults(&collect_one(&mut c, 4_000_000)), base + 6, "{node}");
            // The tick after a walk reads everything, quiet or not.
            set_key(&stat, faults_key, base + 7);
            assert_eq!(faults(&collect_one(&mut c, 9_000_000)), base + 6, "{node}");
            assert_eq!(faults(&collect_one(&mut c, 10_000_000)), base + 7, "{node}");
        }
    }

    #[test]
    fn each_file_fills_only_the_fields_it_declares() {
        // A quiet tick copies a skipped file's declared fields from the last
        // full read: a field it fills but does not declare would go stale.
        let mut seen = BTreeSet::new();
        for node in ["k8s-node", "baremetal-node"] {
            let mut c = collector(&CgroupsConfig::default(), &fixture(node));
            c.rewalk(0).unwrap();
            let buf = &mut c.buf;
            for target in &mut c.discovery.targets {
                for slot in &mut target.slots {
                    let Ok(n) = slot.file.read(buf) else {
                        continue; // a file this cgroup lacks
                    };
                    let mut row = Row::new();
                    let text = std::str::from_utf8(&buf[..n]).unwrap();
                    parse(slot.source, text, slot.file.path(), &mut row, 100.0).unwrap();
                    let declared = filled_by(slot.source);
                    for name in set_fields(&row.values) {
                        assert!(
                            declared.contains(&name),
                            "{:?} filled {name} from {}",
                            slot.source,
                            slot.file.path().display()
                        );
                    }
                    seen.insert(format!("{:?}", slot.source));
                }
            }
        }
        for source in [
            Source::MemoryStatV2,
            Source::MemoryEvents,
            Source::SwapCurrent,
            Source::CpuStatV1,
            Source::CpuacctStat,
            Source::MemoryStatV1,
            Source::OomControl,
            Source::KmemUsage,
        ] {
            assert!(source.follows_usage());
            assert!(
                seen.contains(&format!("{source:?}")),
                "{source:?} not in a fixture"
            );
        }
    }

    #[test]
    fn limits_are_read_at_each_walk_and_measurements_on_every_tick() {
        for (node, usage, limit, quota) in [
            (
                "k8s-node",
                "init.scope/memory.current",
                "init.scope/memory.max",
                vec![("init.scope/cpu.max", "50000 100000\n")],
            ),
            (
                "baremetal-node",
                "memory/docker/memory.usage_in_bytes",
                "memory/docker/memory.limit_in_bytes",
                vec![
                    ("cpu,cpuacct/docker/cpu.cfs_quota_us", "50000\n"),
                    ("cpu,cpuacct/docker/cpu.cfs_period_us", "100000\n"),
                ],
            ),
        ] {
            let (_dir, roots) = scratch(node);
            let cgroup = roots.sys("fs/cgroup");
            let path = if node == "k8s-node" {
                "/init.scope"
            } else {
                "/docker"
            };
            let mut c = collector(&CgroupsConfig::default(), &roots);
            // Without a watch (as where inotify cannot be had) the hierarchy
            // is walked, and limits read, every rescan_interval_secs; the
            // watched case is in the test of the watch.
            c.watch_changes = false;
            let first = collect_one(&mut c, 0);
            let limit_before = value(&first, path, "memory_limit_bytes");
            let quota_before = value(&first, path, "cpu_quota_cpus");
            // Rewritten in place, as the kernel's files are: a measurement is
            // new on the next tick, a limit at the next walk.
            std::fs::write(cgroup.join(usage), "12345\n").unwrap();
            std::fs::write(cgroup.join(limit), "1048576\n").unwrap();
            for (file, text) in &quota {
                std::fs::write(cgroup.join(file), text).unwrap();
            }
            let tick = collect_one(&mut c, 1_000_000);
            let v = |name| value(&tick, path, name);
            assert_eq!(v("memory_usage_bytes"), Value::U64(12345), "{node}");
            assert_eq!(v("memory_limit_bytes"), limit_before, "{node}");
            assert_eq!(v("cpu_quota_cpus"), quota_before, "{node}");
            let rescan = collect_one(&mut c, 10_000_000);
            let v = |name| value(&rescan, path, name);
            assert_eq!(v("memory_usage_bytes"), Value::U64(12345), "{node}");
            assert_eq!(v("memory_limit_bytes"), Value::U64(1_048_576), "{node}");
            assert!(close(v("cpu_quota_cpus"), 0.5), "{node}");
            // The walk kept the descriptors: still fresh values through them.
            std::fs::write(cgroup.join(usage), "23456\n").unwrap();
            let after = collect_one(&mut c, 11_000_000);
            assert_eq!(
                value(&after, path, "memory_usage_bytes"),
                Value::U64(23456),
                "{node}"
            );
            assert_eq!(
                value(&after, path, "memory_limit_bytes"),
                Value::U64(1_048_576),
                "{node}"
            );
        }
    }

    #[test]
    fn a_cgroup_made_again_at_the_same_path_is_read_afresh() {
        let (_dir, roots) = scratch("k8s-node");
        let config = CgroupsConfig {
            rescan_interval_secs: 3600.0,
            ..CgroupsConfig::default()
        };
        let mut c = collector(&config, &roots);
        let path = "/system.slice/kubelet.service";
        let before = collect_one(&mut c, 1_000_000);
        assert!(paths(&before).contains(&path));
        // A restarted service: its directory removed and made again.
        let dir = roots.sys("fs/cgroup").join(path.trim_start_matches('/'));
        std::fs::remove_dir_all(&dir).unwrap();
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("memory.current"), "8192\n").unwrap();
        // Noticed as gone (what ENODEV says on cgroupfs), then found again.
        let gap = collect_one(&mut c, 2_000_000);
        assert!(!paths(&gap).contains(&path));
        let again = collect_one(&mut c, 3_000_000);
        assert_eq!(value(&again, path, "memory_usage_bytes"), Value::U64(8192));
        assert_eq!(value(&again, path, "cpu_usage_seconds"), Value::Null);
        assert_eq!(again.len(), before.len());
    }

    /// Every value of every row of `batch`, by path and field name.
    fn all_values(batch: &Batch) -> BTreeMap<(String, &'static str), Value> {
        let mut out = BTreeMap::new();
        for path in paths(batch) {
            for field in CGROUP.fields {
                out.insert(
                    (path.to_owned(), field.name),
                    value(batch, path, field.name),
                );
            }
        }
        out
    }

    /// Writes `text` into `file` of a copy of `node`'s tree and reads it once:
    /// the tick succeeds, the one error names the file, and every other
    /// value of every cgroup is as read from the intact tree. Returns the
    /// error after the path.
    fn garbage(node: &str, file: &str, text: &str) -> String {
        let (_dir, roots) = scratch(node);
        let intact = collect_one(&mut collector(&CgroupsConfig::default(), &roots), 1);
        let path = roots.sys("fs/cgroup").join(file);
        std::fs::write(&path, text).unwrap();
        let mut c = collector(&CgroupsConfig::default(), &roots);
        let damaged = collect_one(&mut c, 1);
        let errors = c.source_errors();
        assert_eq!(errors.len(), 1, "{file}: {errors:?}");
        let shown = path.display().to_string();
        assert_eq!(errors[0].path, shown, "{file}");
        // The file's own fields of its own cgroup are null; nothing else moved.
        let (want, got) = (all_values(&intact), all_values(&damaged));
        assert_eq!(got.len(), want.len(), "{file}: every cgroup keeps its row");
        let lost: Vec<&(String, &str)> = want.keys().filter(|k| got[*k] != want[*k]).collect();
        for key in &lost {
            assert_eq!(got[*key], Value::Null, "{file}: {key:?}");
        }
        let mut cgroups: Vec<&str> = lost.iter().map(|(p, _)| p.as_str()).collect();
        cgroups.dedup();
        assert!(cgroups.len() <= 1, "{file}: {cgroups:?} lost values");
        errors[0].to_string()[shown.len()..].to_string()
    }

    #[test]
    fn garbage_names_the_file_and_line_and_costs_only_its_fields() {
        let stat = "system.slice/kubelet.service/memory.stat";
        assert_eq!(
            garbage("k8s-node", stat, "anon 1\nfile x\n"),
            ":2: \"x\" is not a number"
        );
        assert_eq!(
            garbage("k8s-node", stat, "anon 1\nfile 99999999999999999999999\n"),
            ":2: \"99999999999999999999999\" is not a number"
        );
        assert_eq!(
            garbage("k8s-node", stat, "anon 1\nfil"),
            ":2: \"fil\" is not \"key value\""
        );
        assert_eq!(
            garbage("k8s-node", "init.scope/cpu.max", "150000\n"),
            ":1: \"150000\" is not \"quota period\""
        );
        assert_eq!(
            garbage("k8s-node", "init.scope/memory.max", "lots\n"),
            ":1: \"lots\" is not a number"
        );
        assert_eq!(
            garbage(
                "k8s-node",
                "init.scope/io.pressure",
                "some avg10=0.00 total=12\nfull avg10=0.00\n"
            ),
            ":2: no total="
        );
        assert_eq!(
            garbage("k8s-node", "init.scope/memory.current", ""),
            ":1: expected one line"
        );
        assert_eq!(
            garbage("baremetal-node", "cpu,cpuacct/docker/cpuacct.usage", "-5\n"),
            ":1: \"-5\" is not a number"
        );
        assert_eq!(
            garbage(
                "baremetal-node",
                "memory/slurm/memory.oom_control",
                "oom_kill_disable 0\nunder_oom 0\noom_kill one\n"
            ),
            ":3: \"one\" is not a number"
        );
        assert_eq!(
            garbage(
                "baremetal-node",
                "memory/slurm/memory.stat",
                "total_rss 1 2\n"
            ),
            ":1: \"total_rss 1 2\" is not \"key value\""
        );
        assert_eq!(
            garbage(
                "baremetal-node",
                "cpu,cpuacct/slurm/cpu.cfs_quota_us",
                "x\n"
            ),
            ":1: \"x\" is not a number"
        );
        assert_eq!(
            garbage("k8s-node", "init.scope/cpu.stat", "\u{0}\u{ff}"),
            ":1: \"\\0\u{ff}\" is not \"key value\""
        );
    }

    /// A pod's `memory.stat` holding junk (issue 36, item 6): that pod keeps
    /// its row with every other field, every other cgroup is read as before,
    /// the file is named in `source_errors`; once mended, the next tick reads
    /// it with no error, without waiting for a walk or a full read.
    #[test]
    fn one_bad_file_costs_its_own_fields_and_mends_at_the_next_tick() {
        let (_dir, roots) = scratch("k8s-node");
        let config = CgroupsConfig {
            rescan_interval_secs: 3600.0,
            ..CgroupsConfig::default()
        };
        let mut c = collector(&config, &roots);
        let intact = collect_one(&mut c, 1_000_000);
        let walks = c.walks;
        let ctr = format!("{POD}/{CRI}");
        let cgroup = roots.sys("fs/cgroup").join(ctr.trim_start_matches('/'));
        let stat = cgroup.join("memory.stat");
        let good = std::fs::read_to_string(&stat).unwrap();
        std::fs::write(&stat, good.replacen("anon 314572800", "anon 3145x2800", 1)).unwrap();
        // Its usage moves, so the tick reads memory.stat.
        set_key(&cgroup.join("cpu.stat"), "usage_usec", 98_765_433);
        let damaged = collect_one(&mut c, 2_000_000);
        let errors: Vec<String> = c.source_errors().iter().map(|e| e.to_string()).collect();
        assert_eq!(
            errors,
            [format!(
                "{}:1: \"3145x2800\" is not a number",
                stat.display()
            )]
        );
        assert_eq!(
            paths(&damaged),
            paths(&intact),
            "every cgroup keeps its row"
        );
        let (want, got) = (all_values(&intact), all_values(&damaged));
        for ((path, field), v) in &want {
            let now = got[&(path.clone(), *field)];
            if *path != ctr {
                assert_eq!(now, *v, "{path} {field}");
            } else if filled_by(Source::MemoryStatV2).contains(field) {
                assert_eq!(now, Value::Null, "{field} comes from the bad file");
            } else if *field == "cpu_usage_seconds" {
                assert!(close(now, 98.765433));
            } else {
                assert_eq!(now, *v, "{field}");
            }
        }
        // Mended: the cgroup's CPU time does not move, yet its memory.stat is
        // read again (a bad file's nulls are never repeated).
        std::fs::write(&stat, &good).unwrap();
        let mended = collect_one(&mut c, 3_000_000);
        assert_eq!(c.walks, walks, "no walk");
        assert!(c.source_errors().is_empty(), "{:?}", c.source_errors());
        assert_eq!(
            value(&mended, &ctr, "memory_anon_bytes"),
            Value::U64(314_572_800)
        );
    }

    /// A limit file that reads badly is read again at the next tick, not at
    /// the next walk (up to a minute away with the watch, an hour here).
    #[test]
    fn a_bad_limit_is_read_again_at_the_next_tick() {
        let (_dir, roots) = scratch("k8s-node");
        let config = CgroupsConfig {
            rescan_interval_secs: 3600.0,
            ..CgroupsConfig::default()
        };
        let max = roots.sys("fs/cgroup/init.scope/memory.max");
        std::fs::write(&max, "lots\n").unwrap();
        let mut c = collector(&config, &roots);
        c.watch_changes = false; // no walk when the file is mended
        let first = collect_one(&mut c, 1_000_000);
        assert_eq!(
            value(&first, "/init.scope", "memory_limit_bytes"),
            Value::Null
        );
        assert_eq!(c.source_errors().len(), 1);
        let walks = c.walks;
        std::fs::write(&max, "1073741824\n").unwrap();
        let second = collect_one(&mut c, 2_000_000);
        assert_eq!(c.walks, walks, "no walk");
        assert!(c.source_errors().is_empty(), "{:?}", c.source_errors());
        assert_eq!(
            value(&second, "/init.scope", "memory_limit_bytes"),
            Value::U64(1 << 30)
        );
        // Read well once, it is read at walks only again.
        std::fs::write(&max, "lots\n").unwrap();
        let third = collect_one(&mut c, 3_000_000);
        assert!(c.source_errors().is_empty());
        assert_eq!(
            value(&third, "/init.scope", "memory_limit_bytes"),
            Value::U64(1 << 30)
        );
    }

    /// Every file of every cgroup bad: the tick fails, naming the first.
    #[test]
    fn a_tick_fails_only_when_no_cgroup_reads_well() {
        let (_dir, roots) = scratch("k8s-node");
        let cgroup = roots.sys("fs/cgroup");
        let mut files = 0;
        let mut dirs = vec![cgroup.clone()];
        while let Some(dir) = dirs.pop() {
            for entry in std::fs::read_dir(&dir).unwrap().flatten() {
                if entry.file_type().unwrap().is_dir() {
                    dirs.push(entry.path());
                } else if V2_SOURCES
                    .iter()
                    .any(|s| entry.file_name().to_str() == Some(s.file_name()))
                {
                    std::fs::write(entry.path(), "junk junk junk\n").unwrap();
                    files += 1;
                }
            }
        }
        assert!(files > 15);
        let mut c = collector(&CgroupsConfig::default(), &roots);
        let err = c.collect(1).unwrap_err().to_string();
        assert!(err.starts_with(&cgroup.display().to_string()), "{err}");
        assert!(!c.source_errors().is_empty(), "the others are named too");
    }

    #[test]
    fn binary_junk_is_an_error_not_a_panic() {
        let (_dir, roots) = scratch("k8s-node");
        let path = roots.sys("fs/cgroup/init.scope/cpu.stat");
        std::fs::write(&path, [0xffu8, 0xfe, 0x00, 0x41]).unwrap();
        let mut c = collector(&CgroupsConfig::default(), &roots);
        assert_eq!(collect_one(&mut c, 1).len(), 15);
        let errors: Vec<String> = c.source_errors().iter().map(|e| e.to_string()).collect();
        assert_eq!(errors, [format!("{}: not UTF-8 text", path.display())]);
    }

    #[test]
    fn no_cgroup_filesystem_is_absent() {
        let dir = tempfile::tempdir().unwrap();
        let roots = Roots {
            procfs: dir.path().join("proc"),
            sysfs: dir.path().join("sys"),
            ..Roots::default()
        };
        let mut c = collector(&CgroupsConfig::default(), &roots);
        let Availability::Absent(why) = c.probe() else {
            panic!("no /sys/fs/cgroup yet available");
        };
        assert!(why.starts_with("no cgroup filesystem at "), "{why}");
        assert!(c.collect(1).is_err());
        // An empty tmpfs at /sys/fs/cgroup (no hierarchy mounted) is absent too.
        std::fs::create_dir_all(roots.sys("fs/cgroup/systemd")).unwrap();
        assert!(matches!(c.probe(), Availability::Absent(_)));
    }

    #[test]
    fn validate_names_the_key() {
        let ok = CgroupsConfig::default();
        ok.validate().unwrap();
        let bad = CgroupsConfig {
            include: vec!["(".into()],
            ..ok.clone()
        };
        assert_eq!(
            bad.validate().unwrap_err().1,
            "collectors.cgroups.include = \"(\": not a regular expression: unclosed group"
        );
        let bad = CgroupsConfig {
            exclude: vec!["a".into(), "[z-a]".into()],
            ..ok.clone()
        };
        assert!(bad
            .validate()
            .unwrap_err()
            .1
            .starts_with("collectors.cgroups.exclude = \"[z-a]\": not a regular expression: "));
        let bad = CgroupsConfig {
            max_depth: 0,
            ..ok.clone()
        };
        assert!(bad
            .validate()
            .unwrap_err()
            .1
            .starts_with("collectors.cgroups.max_depth = 0"));
        let bad = CgroupsConfig {
            max_cgroups: 0,
            ..ok.clone()
        };
        assert!(bad
            .validate()
            .unwrap_err()
            .1
            .starts_with("collectors.cgroups.max_cgroups = 0"));
        let bad = CgroupsConfig {
            rescan_interval_secs: f64::NAN,
            ..ok
        };
        assert!(bad
            .validate()
            .unwrap_err()
            .1
            .starts_with("collectors.cgroups.rescan_interval_secs = NaN"));
    }

    #[test]
    fn config_file_errors_point_at_the_line() {
        let err = crate::config::Config::parse(
            "[collectors.cgroups]\nmax_depth = 3\ninclude = [\"ok\", \"(\"]\n",
            "v.toml",
        )
        .unwrap_err()
        .to_string();
        assert!(
            err.starts_with("v.toml:3: collectors.cgroups.include = \"(\""),
            "{err}"
        );
        let config = crate::config::Config::parse(
            "[collectors.cgroups]\nmax_depth = 6\nexclude = [\"^/user\\\\.slice\"]\nmax_cgroups = 50\n",
            "v.toml",
        )
        .unwrap();
        assert_eq!(config.collectors.cgroups.max_depth, 6);
        assert_eq!(config.collectors.cgroups.exclude, [r"^/user\.slice"]);
        assert!(
            crate::config::Config::parse("[collectors.cgroups]\nmaxdepth = 3\n", "v.toml").is_err()
        );
    }

    #[test]
    fn broken_patterns_sample_nothing_and_say_so() {
        let config = CgroupsConfig {
            include: vec!["(".into()],
            ..CgroupsConfig::default()
        };
        let mut c = collector(&config, &fixture("k8s-node"));
        assert!(c.collect(1).unwrap().is_empty());
        assert!(c.problems()[0].starts_with("collectors.cgroups.include"));
    }

    #[test]
    fn workload_kinds() {
        for (path, kind) in [
            ("/system.slice", "slice"),
            ("/system.slice/sshd.service", "service"),
            ("/system.slice/docker-0123456789ab.scope", "container"),
            ("/machine.slice/libpod-0123456789ab.scope", "container"),
            ("/machine.slice/libpod-conmon-0123456789ab.scope", "other"),
            ("/system.slice/crio-0123456789ab.scope", "container"),
            ("/docker/0123456789abcdef", "container"),
            ("/docker", "other"),
            ("/kubepods/burstable/pod1234-5678", "pod"),
            (
                "/kubepods/burstable/pod1234-5678/0123456789abcdef",
                "container",
            ),
            ("/kubepods/pod1234", "pod"),
            ("/kubepods.slice/kubepods-pod12_34.slice", "pod"),
            ("/kubepods.slice/kubepods-burstable.slice", "slice"),
            ("/slurm/uid_1000/job_12", "slurm_job"),
            ("/slurm/uid_1000/job_12/step_extern", "slurm_step"),
            ("/slurm/uid_1000", "other"),
            (
                "/system.slice/slurmstepd.scope/job_9/step_0/user/task_0",
                "slurm_step",
            ),
            ("/system.slice/slurmstepd.scope", "other"),
            ("/job_12", "other"),
            ("/user.slice/user-1000.slice/session-3.scope", "other"),
            ("/", "other"),
        ] {
            assert_eq!(classify(path), kind, "{path}");
        }
    }

    /// The mean time of one walk (listing, patterns, reopening) over 200.
    fn mean_walk(c: &mut Cgroups) -> std::time::Duration {
        let start = std::time::Instant::now();
        for _ in 0..200 {
            c.rewalk(0).unwrap();
        }
        start.elapsed() / 200
    }

    /// Cost of one tick over each fixture tree and, when there is one, this
    /// machine's own cgroups: `cargo test -p vtax cgroups::tests::timing -- --ignored --nocapture`.
    #[test]
    #[ignore = "a timing measurement, not a test: cargo test --release -p vtax cgroups::tests::timing -- --ignored --nocapture"]
    fn timing() {
        let mut cases: Vec<(String, Roots)> = ["vm-node", "baremetal-node", "k8s-node"]
            .iter()
            .map(|n| (n.to_string(), fixture(n)))
            .collect();
        cases.push(("this machine".into(), Roots::default()));
        for (name, roots) in cases {
            let mut c = Cgroups::new(&CgroupsConfig::default(), &roots);
            if !matches!(c.probe(), Availability::Available(_)) {
                continue;
            }
            let n = 2000;
            let start = std::time::Instant::now();
            let mut rows = 0;
            for i in 0..n {
                rows = c.collect(i).unwrap().first().map_or(0, |b| b.len());
            }
            let tick = start.elapsed() / n as u32;
            let walk = mean_walk(&mut c);
            eprintln!("{name}: {rows} cgroups, one tick {tick:?}, one walk {walk:?}");
        }
    }

    /// Cost of one tick over real cgroupfs cgroups made for the purpose
    /// (`/sys/fs/cgroup/<h>/vtax-bench/jobNN`): `VTAX_BENCH_TICKS=20000 cargo
    /// test --release -p vtax cgroups::tests::timing_bench -- --ignored --nocapture`.
    #[test]
    #[ignore = "a timing measurement over real cgroups under /sys (needs root and the bench cgroups): run with --ignored"]
    fn timing_bench() {
        let roots = Roots {
            sysfs: "/sys".into(),
            ..Roots::default()
        };
        let config = CgroupsConfig {
            include: vec!["^/vtax-bench/job".into()],
            ..CgroupsConfig::default()
        };
        let mut c = Cgroups::new(&config, &roots);
        if !matches!(c.probe(), Availability::Available(_)) {
            return;
        }
        let n: i64 = std::env::var("VTAX_BENCH_TICKS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(2000);
        let mut rows = c.collect(0).unwrap().first().map_or(0, |b| b.len());
        let start = std::time::Instant::now();
        for i in 1..=n {
            rows = c.collect(i).unwrap().first().map_or(0, |b| b.len());
        }
        let tick = start.elapsed() / n as u32;
        let walk = mean_walk(&mut c);
        eprintln!("vtax-bench: {rows} cgroups, {n} ticks, one tick {tick:?}, one walk {walk:?}");
    }
}
