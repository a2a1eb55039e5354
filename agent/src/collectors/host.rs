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

crate::collectors::common_settings!(HostConfig);

impl crate::collectors::Registered for HostConfig {
    fn tables() -> &'static [&'static vtax_store::TableDef] {
        TABLES
    }
    fn key_docs() -> &'static [(&'static str, &'static str)] {
        KEY_DOCS
    }
    fn build(
        &self,
        _all: &crate::collectors::CollectorsConfig,
        roots: &crate::collectors::Roots,
    ) -> Box<dyn crate::collectors::Collector> {
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
        let stat = self.roots.proc("stat");
        if let Err(e) = std::fs::read_to_string(&stat) {
            let reason = format!("{}: {e}", stat.display());
            return match e.kind() {
                std::io::ErrorKind::NotFound => Availability::Absent(reason),
                _ => Availability::Failed(reason),
            };
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
}

/// Comments for this collector's own keys in the example config.
pub static KEY_DOCS: &[(&str, &str)] = &[];

/// Tables of this collector.
pub static TABLES: &[&TableDef] = &[&CPU, &CPU_SCHED, &PRESSURE, &LOAD, &MEMORY, &KERNEL];

const fn seconds_counter(name: &'static str, help: &'static str) -> FieldDef {
    FieldDef::counter(name, FieldType::F64, Unit::Seconds, help)
}

const fn count_counter(name: &'static str, help: &'static str) -> FieldDef {
    FieldDef::counter(name, FieldType::U64, Unit::None, help)
}

const fn count_gauge(name: &'static str, help: &'static str) -> FieldDef {
    FieldDef::gauge(name, FieldType::U64, Unit::None, help)
}

const fn bytes_gauge(name: &'static str, help: &'static str) -> FieldDef {
    FieldDef::gauge(name, FieldType::U64, Unit::Bytes, help)
}

const CPU_TAG: TagDef = TagDef {
    name: "cpu",
    help: "Logical CPU number.",
};

vtax_store::table! {
    /// The columns of `/proc/stat` cpu lines, in the kernel's order.
    pub static CPU: TableDef, pub struct CpuRow {
        name: "cpu",
        help: "One row per logical CPU per tick: time spent in each mode since boot, from /proc/stat.",
        tags: [cpu = CPU_TAG],
        fields: [
            user_seconds: f64 = seconds_counter("Time in user mode, guest time included."),
            nice_seconds: f64 = seconds_counter("Time in user mode at low priority."),
            system_seconds: f64 = seconds_counter("Time in kernel mode."),
            idle_seconds: f64 = seconds_counter("Time idle."),
            iowait_seconds: Option<f64> = seconds_counter("Time idle with I/O outstanding."),
            irq_seconds: Option<f64> = seconds_counter("Time servicing hardware interrupts."),
            softirq_seconds: Option<f64> = seconds_counter("Time servicing softirqs."),
            steal_seconds: Option<f64> = seconds_counter(
                "Time the hypervisor ran something else while this virtual CPU wanted to run.",
            ),
        ],
        exported: true,
    }
}

vtax_store::table! {
    /// Per-CPU scheduler statistics from `/proc/schedstat` (version 15 and later).
    pub static CPU_SCHED: TableDef, pub struct CpuSchedRow {
        name: "cpu_sched",
        help: "One row per logical CPU per tick: scheduler run queue time since boot, from \
               /proc/schedstat (kernels with CONFIG_SCHEDSTATS, schedstat version 15 and later).",
        tags: [cpu = CPU_TAG],
        fields: [
            running_seconds: f64 = seconds_counter(
                "Time tasks spent running on this CPU (rq_cpu_time, field 7).",
            ),
            run_delay_seconds: f64 = seconds_counter(
                "Time tasks spent runnable but waiting for this CPU (run_delay, field 8): \
                 contention for the CPU, inside the guest or from the hypervisor.",
            ),
            timeslices: u64 = count_counter("Timeslices run on this CPU (pcount, field 9)."),
        ],
        exported: true,
    }
}

vtax_store::table! {
    /// Pressure stall information from `/proc/pressure/<resource>`.
    pub static PRESSURE: TableDef, pub struct PressureRow {
        name: "pressure",
        help: "One row per resource per tick: pressure stall information from /proc/pressure \
               (kernels with PSI enabled). `some`: at least one task stalled on the resource; \
               `full`: all non-idle tasks stalled at once. The kernel's microseconds are divided \
               by 1e6, correctly rounded; node_exporter multiplies by 1e-6 and can differ in the \
               last bit.",
        tags: [resource = TagDef {
            name: "resource",
            help: "Resource: cpu, memory, io, or irq (kernels with IRQ time accounting).",
        }],
        fields: [
            some_stalled_seconds: Option<f64> = seconds_counter(
                "Time at least one task was stalled on the resource (`some` total).",
            ),
            full_stalled_seconds: Option<f64> = seconds_counter(
                "Time all non-idle tasks were stalled on the resource at once (`full` total); \
                 null where the kernel has no `full` line.",
            ),
            some_avg10_ratio: Option<f64> = FieldDef::gauge(
                FieldType::F64,
                Unit::Ratio,
                "Share of the last 10 seconds with at least one task stalled (`some` avg10).",
            ),
            full_avg10_ratio: Option<f64> = FieldDef::gauge(
                FieldType::F64,
                Unit::Ratio,
                "Share of the last 10 seconds with all non-idle tasks stalled (`full` avg10).",
            ),
        ],
        exported: true,
    }
}

vtax_store::table! {
    /// `/proc/loadavg`.
    pub static LOAD: TableDef, pub struct LoadRow {
        name: "load",
        help: "One row per tick: load averages and task counts, from /proc/loadavg.",
        tags: [],
        fields: [
            load1: f64 = FieldDef::gauge(
                FieldType::F64,
                Unit::None,
                "Load average over 1 minute: runnable plus uninterruptible tasks.",
            ),
            load5: f64 = FieldDef::gauge(FieldType::F64, Unit::None, "Load average over 5 minutes."),
            load15: f64 = FieldDef::gauge(FieldType::F64, Unit::None, "Load average over 15 minutes."),
            runnable_tasks: u64 = count_gauge(
                "Tasks (threads) runnable right now, the reader included.",
            ),
            tasks: u64 = count_gauge("Tasks (threads) that exist right now."),
        ],
        exported: true,
    }
}

/// How a `/proc/meminfo` value is written.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum MemUnit {
    /// `<n> kB`: stored as bytes.
    KiB,
    /// A bare count (`HugePages_*`).
    Count,
}

vtax_store::table! {
    /// `/proc/meminfo`; [`MEMINFO`] says which key fills each field.
    pub static MEMORY: TableDef, pub struct MemoryRow {
        name: "memory",
        help: "One row per tick: system memory, from /proc/meminfo (kB there, bytes here).",
        tags: [],
        fields: [
            total_bytes: Option<u64> = bytes_gauge("Usable RAM (MemTotal)."),
            free_bytes: Option<u64> = bytes_gauge("RAM unused (MemFree)."),
            available_bytes: Option<u64> = bytes_gauge(
                "Estimate of RAM available to start new workloads without swapping (MemAvailable).",
            ),
            buffers_bytes: Option<u64> = bytes_gauge("Block device buffers (Buffers)."),
            cached_bytes: Option<u64> = bytes_gauge("Page cache, shmem included (Cached)."),
            swap_cached_bytes: Option<u64> = bytes_gauge(
                "Memory swapped out and back in, still in swap (SwapCached).",
            ),
            active_bytes: Option<u64> = bytes_gauge("Memory used recently (Active)."),
            inactive_bytes: Option<u64> = bytes_gauge("Memory not used recently (Inactive)."),
            unevictable_bytes: Option<u64> = bytes_gauge(
                "Memory that cannot be paged out (Unevictable).",
            ),
            mlocked_bytes: Option<u64> = bytes_gauge(
                "Memory locked with mlock, e.g. pinned for RDMA or GPU transfers (Mlocked).",
            ),
            swap_total_bytes: Option<u64> = bytes_gauge("Swap space (SwapTotal)."),
            swap_free_bytes: Option<u64> = bytes_gauge("Swap space unused (SwapFree)."),
            dirty_bytes: Option<u64> = bytes_gauge("Memory waiting to be written back (Dirty)."),
            writeback_bytes: Option<u64> = bytes_gauge("Memory being written back (Writeback)."),
            anon_bytes: Option<u64> = bytes_gauge(
                "Anonymous pages mapped into user space (AnonPages).",
            ),
            mapped_bytes: Option<u64> = bytes_gauge("Files mapped into memory (Mapped)."),
            shmem_bytes: Option<u64> = bytes_gauge("Shared memory and tmpfs (Shmem)."),
            slab_reclaimable_bytes: Option<u64> = bytes_gauge(
                "Kernel slab memory that can be reclaimed (SReclaimable).",
            ),
            slab_unreclaimable_bytes: Option<u64> = bytes_gauge(
                "Kernel slab memory that cannot be reclaimed (SUnreclaim).",
            ),
            kernel_stack_bytes: Option<u64> = bytes_gauge("Kernel stacks (KernelStack)."),
            page_tables_bytes: Option<u64> = bytes_gauge("Page tables (PageTables)."),
            commit_limit_bytes: Option<u64> = bytes_gauge(
                "Memory that can be committed under strict overcommit (CommitLimit).",
            ),
            committed_bytes: Option<u64> = bytes_gauge(
                "Memory committed by all processes (Committed_AS).",
            ),
            anon_huge_pages_bytes: Option<u64> = bytes_gauge(
                "Anonymous transparent huge pages (AnonHugePages).",
            ),
            huge_pages: Option<u64> = count_gauge(
                "Huge pages of the default size in the pool (HugePages_Total).",
            ),
            huge_pages_free: Option<u64> = count_gauge(
                "Huge pages of the default size not yet allocated (HugePages_Free).",
            ),
            huge_pages_reserved: Option<u64> = count_gauge(
                "Huge pages promised to mappings but not yet faulted in (HugePages_Rsvd).",
            ),
            huge_pages_surplus: Option<u64> = count_gauge(
                "Huge pages above the configured pool size (HugePages_Surp).",
            ),
            huge_page_size_bytes: Option<u64> = bytes_gauge("Default huge page size (Hugepagesize)."),
            hugetlb_bytes: Option<u64> = bytes_gauge("Memory in huge pages of all sizes (Hugetlb)."),
        ],
        exported: true,
    }
}

/// Where a [`MemoryRow`] field is read from: its `/proc/meminfo` key, how
/// the key's value is written, and the field.
type MeminfoSource = (
    &'static str,
    MemUnit,
    fn(&mut MemoryRow) -> &mut Option<u64>,
);

/// The `/proc/meminfo` key each [`MEMORY`] field is read from.
static MEMINFO: &[MeminfoSource] = {
    use MemUnit::{Count, KiB};
    &[
        ("MemTotal", KiB, |r| &mut r.total_bytes),
        ("MemFree", KiB, |r| &mut r.free_bytes),
        ("MemAvailable", KiB, |r| &mut r.available_bytes),
        ("Buffers", KiB, |r| &mut r.buffers_bytes),
        ("Cached", KiB, |r| &mut r.cached_bytes),
        ("SwapCached", KiB, |r| &mut r.swap_cached_bytes),
        ("Active", KiB, |r| &mut r.active_bytes),
        ("Inactive", KiB, |r| &mut r.inactive_bytes),
        ("Unevictable", KiB, |r| &mut r.unevictable_bytes),
        ("Mlocked", KiB, |r| &mut r.mlocked_bytes),
        ("SwapTotal", KiB, |r| &mut r.swap_total_bytes),
        ("SwapFree", KiB, |r| &mut r.swap_free_bytes),
        ("Dirty", KiB, |r| &mut r.dirty_bytes),
        ("Writeback", KiB, |r| &mut r.writeback_bytes),
        ("AnonPages", KiB, |r| &mut r.anon_bytes),
        ("Mapped", KiB, |r| &mut r.mapped_bytes),
        ("Shmem", KiB, |r| &mut r.shmem_bytes),
        ("SReclaimable", KiB, |r| &mut r.slab_reclaimable_bytes),
        ("SUnreclaim", KiB, |r| &mut r.slab_unreclaimable_bytes),
        ("KernelStack", KiB, |r| &mut r.kernel_stack_bytes),
        ("PageTables", KiB, |r| &mut r.page_tables_bytes),
        ("CommitLimit", KiB, |r| &mut r.commit_limit_bytes),
        ("Committed_AS", KiB, |r| &mut r.committed_bytes),
        ("AnonHugePages", KiB, |r| &mut r.anon_huge_pages_bytes),
        ("HugePages_Total", Count, |r| &mut r.huge_pages),
        ("HugePages_Free", Count, |r| &mut r.huge_pages_free),
        ("HugePages_Rsvd", Count, |r| &mut r.huge_pages_reserved),
        ("HugePages_Surp", Count, |r| &mut r.huge_pages_surplus),
        ("Hugepagesize", KiB, |r| &mut r.huge_page_size_bytes),
        ("Hugetlb", KiB, |r| &mut r.hugetlb_bytes),
    ]
};

/// Keys every `/proc/meminfo` has; the others are null where a kernel lacks them.
const MEMINFO_REQUIRED: &[&str] = &["MemTotal", "MemFree"];

vtax_store::table! {
    /// Kernel activity from `/proc/stat`; [`STAT_KEYS`] says which line
    /// fills each field.
    pub static KERNEL: TableDef, pub struct KernelRow {
        name: "kernel",
        help: "One row per tick: kernel activity since boot, from /proc/stat.",
        tags: [],
        fields: [
            context_switches: Option<u64> = count_counter("Context switches (ctxt)."),
            interrupts: Option<u64> = count_counter("Hardware interrupts serviced (intr)."),
            softirqs: Option<u64> = count_counter("Softirqs serviced (softirq)."),
            forks: Option<u64> = count_counter("Processes and threads created (processes)."),
            procs_running: Option<u64> = count_gauge("Tasks runnable right now (procs_running)."),
            procs_blocked: Option<u64> = count_gauge(
                "Tasks blocked waiting for I/O right now (procs_blocked).",
            ),
            boot_time_seconds: Option<u64> = FieldDef::gauge(
                FieldType::U64,
                Unit::Seconds,
                "When the node booted, in seconds since the Unix epoch (btime).",
            ),
        ],
        exported: true,
    }
}

/// Where a [`KernelRow`] field is read from: its `/proc/stat` line, whether
/// every kernel has that line, and the field.
type StatSource = (&'static str, bool, fn(&mut KernelRow) -> &mut Option<u64>);

/// The kernel activity line of `/proc/stat` each [`KERNEL`] field is read from.
static STAT_KEYS: &[StatSource] = &[
    ("ctxt", true, |r| &mut r.context_switches),
    ("intr", true, |r| &mut r.interrupts),
    ("softirq", false, |r| &mut r.softirqs),
    ("processes", true, |r| &mut r.forks),
    ("procs_running", true, |r| &mut r.procs_running),
    ("procs_blocked", true, |r| &mut r.procs_blocked),
    ("btime", true, |r| &mut r.boot_time_seconds),
];

/// PSI resources, in the order their rows are written.
const PRESSURE_RESOURCES: [&str; 4] = ["cpu", "memory", "io", "irq"];

/// The oldest `/proc/schedstat` version whose cpu lines are read (15: Linux
/// 4.x; 16 and 17 changed only the domain lines).
const SCHEDSTAT_MIN_VERSION: u32 = 15;

pub(crate) fn fail(path: &str, line: usize, reason: impl Into<String>) -> ParseError {
    ParseError {
        path: path.to_string(),
        line,
        reason: reason.into(),
    }
}

/// Parses an unsigned decimal, saying what it should have been.
pub(crate) fn parse_u64(word: &str, what: &str) -> Result<u64, String> {
    word.parse::<u64>().map_err(|e| match e.kind() {
        IntErrorKind::PosOverflow => format!("{word:?} overflows a 64-bit {what}"),
        _ => format!("{word:?} is not a {what}"),
    })
}

/// Parses a finite, non-negative decimal (load averages, PSI averages).
fn parse_f64(word: &str, what: &str) -> Result<f64, String> {
    match word.parse::<f64>() {
        Ok(x) if x.is_finite() && x >= 0.0 => Ok(x),
        _ => Err(format!("{word:?} is not a {what}")),
    }
}

/// One read of every host source.
#[derive(Debug)]
pub struct Sample {
    /// Rows, one batch per table that has any.
    pub batches: Vec<Batch>,
    /// What an operator should know (optional sources missing).
    pub problems: Vec<String>,
    /// Files that read badly, one error each: their rows are left out.
    pub errors: Vec<ParseError>,
    cpus: usize,
    pressure: Vec<&'static str>,
    schedstat: Schedstat,
}

/// What `/proc/schedstat` held.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Schedstat {
    Absent,
    Unsupported(u32),
    Read(u32),
}

impl Sample {
    /// One line for `vtax doctor`, e.g. "2 CPUs; pressure: cpu memory io; schedstat v15".
    pub fn summary(&self) -> String {
        let pressure = if self.pressure.is_empty() {
            "none".to_string()
        } else {
            self.pressure.join(" ")
        };
        let schedstat = match self.schedstat {
            Schedstat::Absent => "schedstat: none".to_string(),
            Schedstat::Unsupported(v) => format!("schedstat: v{v} unsupported"),
            Schedstat::Read(v) => format!("schedstat v{v}"),
        };
        format!("{} CPUs; pressure: {pressure}; {schedstat}", self.cpus)
    }
}

/// Reads a required file.
fn read(path: &Path) -> Result<String, ParseError> {
    std::fs::read_to_string(path).map_err(|e| fail(&path.display().to_string(), 0, e.to_string()))
}

/// Reads an optional file: `None` where the kernel lacks it (or refuses it as
/// unsupported); a file we may not read is also `None`, with a problem noted.
fn read_optional(path: &Path, problems: &mut Vec<String>) -> Result<Option<String>, ParseError> {
    match std::fs::read_to_string(path) {
        Ok(text) => Ok(Some(text)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) if e.raw_os_error() == Some(libc::EOPNOTSUPP) => Ok(None),
        Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => {
            problems.push(format!("{}: {e}", path.display()));
            Ok(None)
        }
        Err(e) => Err(fail(&path.display().to_string(), 0, e.to_string())),
    }
}

/// Reads every host source under `roots` once, stamping rows with `time_us`;
/// `hz` is the kernel's `USER_HZ`. Each file is read on its own: one that
/// reads badly is in [`Sample::errors`] and costs only its own rows (for
/// `/proc/stat`, the CPU lines and the kernel lines each). Fails only when
/// no file gave a row, with the first error.
pub fn sample(roots: &Roots, time_us: i64, hz: f64) -> Result<Sample, ParseError> {
    let mut batches = Vec::new();
    let mut problems = Vec::new();
    let mut errors = Vec::new();
    // One error per file: the source the runtime counts and logs.
    fn failed(error: ParseError, errors: &mut Vec<ParseError>) {
        if !errors.iter().any(|e| e.path == error.path) {
            errors.push(error);
        }
    }

    let path = roots.proc("stat");
    let shown = path.display().to_string();
    let mut cpus = 0;
    match read(&path) {
        Ok(text) => {
            match parse(&text, &shown, time_us, hz) {
                Ok(cpu) => {
                    cpus = cpu.len();
                    batches.push(cpu);
                }
                Err(e) => failed(e, &mut errors),
            }
            match parse_kernel(&text, &shown, time_us) {
                Ok(kernel) => batches.push(kernel),
                Err(e) => failed(e, &mut errors),
            }
        }
        Err(e) => failed(e, &mut errors),
    }

    let path = roots.proc("loadavg");
    match read(&path).and_then(|text| parse_loadavg(&text, &path.display().to_string(), time_us)) {
        Ok(load) => batches.push(load),
        Err(e) => failed(e, &mut errors),
    }

    let path = roots.proc("meminfo");
    match read(&path).and_then(|text| parse_meminfo(&text, &path.display().to_string(), time_us)) {
        Ok(memory) => batches.push(memory),
        Err(e) => failed(e, &mut errors),
    }

    // A file we may not read is noted as such, not as a kernel without it.
    let denied_before = problems.len();
    let errors_before = errors.len();
    let mut pressure = Vec::new();
    let mut builder = BatchBuilder::new(&PRESSURE);
    for resource in PRESSURE_RESOURCES {
        let path = roots.proc("pressure").join(resource);
        let shown = path.display().to_string();
        let row = match read_optional(&path, &mut problems) {
            Ok(None) => continue,
            Ok(Some(text)) => parse_pressure(&text, &shown, resource),
            Err(e) => Err(e),
        };
        let pushed = row.and_then(|row| {
            builder
                .push_row(time_us, &row)
                .map_err(|e| fail(&shown, 0, e.to_string()))
        });
        match pushed {
            Ok(()) => pressure.push(resource),
            Err(e) => failed(e, &mut errors),
        }
    }
    if pressure.is_empty() && problems.len() == denied_before && errors.len() == errors_before {
        problems.push(format!(
            "no {}: kernel built without PSI (CONFIG_PSI) or booted with psi=0; no pressure rows",
            roots.proc("pressure").display()
        ));
    } else if !pressure.is_empty() {
        batches.push(builder.finish());
    }

    let path = roots.proc("schedstat");
    let shown = path.display().to_string();
    let denied_before = problems.len();
    let read_schedstat = read_optional(&path, &mut problems).and_then(|text| match text {
        None => Ok(None),
        Some(text) => parse_schedstat(&text, &shown, time_us).map(Some),
    });
    let schedstat = match read_schedstat {
        Err(e) => {
            failed(e, &mut errors);
            Schedstat::Absent
        }
        Ok(None) => {
            if problems.len() == denied_before {
                problems.push(format!(
                    "no {shown}: kernel built without CONFIG_SCHEDSTATS; no per-CPU run delay (cpu_sched rows)"
                ));
            }
            Schedstat::Absent
        }
        Ok(Some((schedstat, batch))) => {
            if let Schedstat::Unsupported(v) = schedstat {
                problems.push(format!(
                    "{shown} is version {v}; only {SCHEDSTAT_MIN_VERSION} and later are read: no cpu_sched rows"
                ));
            }
            batches.extend(batch);
            schedstat
        }
    };

    if batches.is_empty() && !errors.is_empty() {
        return Err(errors.swap_remove(0));
    }
    Ok(Sample {
        batches,
        problems,
        errors,
        cpus,
        pressure,
        schedstat,
    })
}

/// The per-CPU lines of `/proc/stat` (not the all-CPU total): the 0-based
/// line number, the CPU number's text and the words after it.
pub(crate) fn per_cpu_lines(
    text: &str,
) -> impl Iterator<Item = (usize, &str, std::str::SplitAsciiWhitespace<'_>)> {
    text.lines().enumerate().filter_map(|(n, line)| {
        let mut words = line.split_ascii_whitespace();
        let cpu = words.next()?.strip_prefix("cpu")?;
        (!cpu.is_empty()).then_some((n, cpu, words))
    })
}

/// Parses the per-CPU lines of `/proc/stat` into one row per CPU.
fn parse(text: &str, path: &str, time_us: i64, hz: f64) -> Result<Batch, ParseError> {
    let mut builder = BatchBuilder::new(&CPU);
    for (n, cpu, mut words) in per_cpu_lines(text) {
        if cpu.parse::<u32>().is_err() {
            return Err(fail(path, n + 1, format!("bad CPU number {cpu:?}")));
        }
        // The kernel's columns, in its order; older kernels end the line early.
        let mut columns = [None; 8];
        for (slot, word) in columns.iter_mut().zip(words.by_ref()) {
            let ticks = parse_u64(word, "tick count").map_err(|e| fail(path, n + 1, e))?;
            *slot = Some(ticks as f64 / hz);
        }
        let [user, nice, system, idle, iowait, irq, softirq, steal] = columns;
        let (Some(user), Some(nice), Some(system), Some(idle)) = (user, nice, system, idle) else {
            return Err(fail(path, n + 1, "fewer than 4 columns"));
        };
        let row = CpuRow {
            cpu,
            user_seconds: user,
            nice_seconds: nice,
            system_seconds: system,
            idle_seconds: idle,
            iowait_seconds: iowait,
            irq_seconds: irq,
            softirq_seconds: softirq,
            steal_seconds: steal,
        };
        builder
            .push_row(time_us, &row)
            .map_err(|e| fail(path, n + 1, e.to_string()))?;
    }
    if builder.is_empty() {
        return Err(fail(path, 0, "no per-CPU lines"));
    }
    Ok(builder.finish())
}

/// Parses the kernel activity lines of `/proc/stat` into one row.
fn parse_kernel(text: &str, path: &str, time_us: i64) -> Result<Batch, ParseError> {
    let mut row = KernelRow::default();
    for (n, line) in text.lines().enumerate() {
        let mut words = line.split_ascii_whitespace();
        let Some(key) = words.next() else {
            continue;
        };
        let Some((_, _, field)) = STAT_KEYS.iter().find(|(k, _, _)| *k == key) else {
            continue;
        };
        // `intr` and `softirq` lead with the total, then one count per source.
        let word = words
            .next()
            .ok_or_else(|| fail(path, n + 1, format!("{key} has no value")))?;
        let value = parse_u64(word, "count").map_err(|e| fail(path, n + 1, e))?;
        *field(&mut row) = Some(value);
    }
    for (key, required, field) in STAT_KEYS {
        if *required && field(&mut row).is_none() {
            return Err(fail(path, 0, format!("no {key} line")));
        }
    }
    let mut builder = BatchBuilder::new(&KERNEL);
    builder
        .push_row(time_us, &row)
        .map_err(|e| fail(path, 0, e.to_string()))?;
    Ok(builder.finish())
}

/// Parses `/proc/loadavg`: `load1 load5 load15 runnable/total last_pid`.
fn parse_loadavg(text: &str, path: &str, time_us: i64) -> Result<Batch, ParseError> {
    let line = text.lines().next().unwrap_or("");
    let fail = |reason: String| fail(path, 1, reason);
    let mut words = line.split_ascii_whitespace();
    let mut next = |what: &str| {
        words
            .next()
            .ok_or_else(|| fail(format!("truncated: no {what}")))
    };
    let mut load = |what: &str| -> Result<f64, ParseError> {
        parse_f64(next(what)?, "load average").map_err(fail)
    };
    let (load1, load5, load15) = (load("load1")?, load("load5")?, load("load15")?);
    let tasks = next("runnable/total tasks")?;
    let (runnable, total) = tasks
        .split_once('/')
        .ok_or_else(|| fail(format!("{tasks:?} is not runnable/total")))?;
    let row = LoadRow {
        load1,
        load5,
        load15,
        runnable_tasks: parse_u64(runnable, "task count").map_err(fail)?,
        tasks: parse_u64(total, "task count").map_err(fail)?,
    };
    let mut builder = BatchBuilder::new(&LOAD);
    builder
        .push_row(time_us, &row)
        .map_err(|e| fail(e.to_string()))?;
    Ok(builder.finish())
}

/// Parses `/proc/meminfo`: `Key:   <n> kB` lines, or a bare count for huge pages.
fn parse_meminfo(text: &str, path: &str, time_us: i64) -> Result<Batch, ParseError> {
    let mut row = MemoryRow::default();
    for (n, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let fail = |reason: String| fail(path, n + 1, reason);
        let (key, rest) = line
            .split_once(':')
            .ok_or_else(|| fail(format!("{line:?} is not 'Key: value'")))?;
        let mut words = rest.split_ascii_whitespace();
        let word = words
            .next()
            .ok_or_else(|| fail(format!("{key} has no value")))?;
        let number = parse_u64(word, "number").map_err(fail)?;
        let (value, unit) = match words.next() {
            None => (number, MemUnit::Count),
            Some("kB") => (
                number.checked_mul(1024).ok_or_else(|| {
                    fail(format!("{key}: {number} kB overflows 64 bits in bytes"))
                })?,
                MemUnit::KiB,
            ),
            Some(other) => return Err(fail(format!("{key}: unknown unit {other:?}"))),
        };
        if let Some(extra) = words.next() {
            return Err(fail(format!("{key}: unexpected {extra:?} after the value")));
        }
        let Some((_, want, field)) = MEMINFO.iter().find(|(k, _, _)| *k == key) else {
            continue;
        };
        match (want, unit) {
            (MemUnit::KiB, MemUnit::Count) => {
                return Err(fail(format!("{key}: no kB unit after the value")))
            }
            (MemUnit::Count, MemUnit::KiB) => return Err(fail(format!("{key}: a count, not kB"))),
            _ => {}
        }
        *field(&mut row) = Some(value);
    }
    for (key, _, field) in MEMINFO {
        if MEMINFO_REQUIRED.contains(key) && field(&mut row).is_none() {
            return Err(fail(path, 0, format!("no {key} line")));
        }
    }
    let mut builder = BatchBuilder::new(&MEMORY);
    builder
        .push_row(time_us, &row)
        .map_err(|e| fail(path, 0, e.to_string()))?;
    Ok(builder.finish())
}

/// Parses one `/proc/pressure/<resource>` file into a [`PRESSURE`] row:
/// `some avg10=0.00 avg60=0.00 avg300=0.00 total=0` (total in microseconds),
/// then the same for `full` (irq has only `full`; cpu before Linux 5.13 only `some`).
fn parse_pressure<'a>(
    text: &str,
    path: &str,
    resource: &'a str,
) -> Result<PressureRow<'a>, ParseError> {
    let mut row = PressureRow {
        resource,
        ..PressureRow::default()
    };
    let mut lines = 0;
    for (n, line) in text.lines().enumerate() {
        let fail = |reason: String| fail(path, n + 1, reason);
        let mut words = line.split_ascii_whitespace();
        let Some(kind) = words.next() else {
            continue;
        };
        let (total_field, avg10_field) = match kind {
            "some" => (&mut row.some_stalled_seconds, &mut row.some_avg10_ratio),
            "full" => (&mut row.full_stalled_seconds, &mut row.full_avg10_ratio),
            _ => return Err(fail(format!("{kind:?} is neither some nor full"))),
        };
        let (mut avg10, mut total) = (None, None);
        for word in words {
            let (key, value) = word
                .split_once('=')
                .ok_or_else(|| fail(format!("{word:?} is not key=value")))?;
            match key {
                "total" => {
                    let us = parse_u64(value, "microsecond count").map_err(fail)?;
                    total = Some(us as f64 / 1e6);
                }
                "avg10" => avg10 = Some(parse_f64(value, "percentage").map_err(fail)? / 100.0),
                _ => {
                    parse_f64(value, "percentage").map_err(fail)?;
                }
            }
        }
        let total = total.ok_or_else(|| fail(format!("{kind} line has no total=")))?;
        let avg10 = avg10.ok_or_else(|| fail(format!("{kind} line has no avg10=")))?;
        *total_field = Some(total);
        *avg10_field = Some(avg10);
        lines += 1;
    }
    if lines == 0 {
        return Err(fail(path, 0, "no some or full line"));
    }
    Ok(row)
}

/// Parses `/proc/schedstat`: a `version N` line, a `timestamp` line, then per
/// CPU a `cpuN` line of 9 counters followed by its `domainN` lines. Versions
/// before 15 are reported, not read.
fn parse_schedstat(
    text: &str,
    path: &str,
    time_us: i64,
) -> Result<(Schedstat, Option<Batch>), ParseError> {
    let mut lines = text.lines().enumerate();
    let version = loop {
        let Some((n, line)) = lines.next() else {
            return Err(fail(path, 0, "no version line"));
        };
        let mut words = line.split_ascii_whitespace();
        match (words.next(), words.next(), words.next()) {
            (None, _, _) => continue,
            (Some("version"), Some(v), None) => {
                break parse_u64(v, "version")
                    .ok()
                    .and_then(|v| u32::try_from(v).ok())
                    .ok_or_else(|| fail(path, n + 1, format!("{v:?} is not a version")))?;
            }
            _ => return Err(fail(path, n + 1, format!("{line:?} is not 'version N'"))),
        }
    };
    if version < SCHEDSTAT_MIN_VERSION {
        return Ok((Schedstat::Unsupported(version), None));
    }
    let mut builder = BatchBuilder::new(&CPU_SCHED);
    for (n, line) in lines {
        let fail = |reason: String| fail(path, n + 1, reason);
        let mut words = line.split_ascii_whitespace();
        let Some(cpu) = words.next().and_then(|w| w.strip_prefix("cpu")) else {
            continue; // timestamp and domain lines
        };
        if cpu.parse::<u32>().is_err() {
            return Err(fail(format!("bad CPU number {cpu:?}")));
        }
        let mut counters = [0u64; 9];
        let mut count = 0;
        for (slot, word) in counters.iter_mut().zip(words.by_ref()) {
            *slot = parse_u64(word, "counter").map_err(fail)?;
            count += 1;
        }
        if count < counters.len() {
            return Err(fail(format!(
                "{count} counters, version {version} has {}",
                counters.len()
            )));
        }
        for word in words {
            parse_u64(word, "counter").map_err(fail)?;
        }
        let [_, _, _, _, _, _, running_ns, delay_ns, slices] = counters;
        let row = CpuSchedRow {
            cpu,
            running_seconds: running_ns as f64 / 1e9,
            run_delay_seconds: delay_ns as f64 / 1e9,
            timeslices: slices,
        };
        builder
            .push_row(time_us, &row)
            .map_err(|e| fail(e.to_string()))?;
    }
    if builder.is_empty() {
        return Err(fail(path, 0, "no cpu lines"));
    }
    Ok((Schedstat::Read(version), Some(builder.finish())))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;
    use vtax_store::batch::Values;
    use vtax_store::Value;

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

    // ---- helpers ----

    fn fixture(node: &str) -> Roots {
        let base = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures");
        Roots {
            procfs: base.join(node).join("proc"),
            sysfs: base.join(node).join("sys"),
            ..Roots::default()
        }
    }

    fn table<'a>(sample: &'a Sample, table: &TableDef) -> Option<&'a Batch> {
        sample.batches.iter().find(|b| b.table.name == table.name)
    }

    /// The value of `field` in the row whose first tag is `tag` (or row 0 for
    /// untagged tables); `None` when null.
    fn value(batch: &Batch, tag: Option<&str>, field: &str) -> Option<Value> {
        let row = match tag {
            None => 0,
            Some(tag) => {
                let column = &batch.tags[0];
                let code = column.dict.iter().position(|d| d == tag)? as u32;
                column.codes.iter().position(|&c| c == code)?
            }
        };
        let f = batch.table.field_index(field).expect("known field");
        let column = &batch.fields[f];
        if !column.is_valid(row) {
            return None;
        }
        Some(match &column.values {
            Values::F64(v) => Value::F64(v[row]),
            Values::I64(v) => Value::I64(v[row]),
            Values::U64(v) => Value::U64(v[row]),
        })
    }

    fn f64_of(batch: &Batch, tag: Option<&str>, field: &str) -> f64 {
        match value(batch, tag, field) {
            Some(Value::F64(x)) => x,
            other => panic!("{field}: {other:?}"),
        }
    }

    fn u64_of(batch: &Batch, tag: Option<&str>, field: &str) -> u64 {
        match value(batch, tag, field) {
            Some(Value::U64(x)) => x,
            other => panic!("{field}: {other:?}"),
        }
    }

    /// A procfs tree in a tempdir holding copies of `node`'s host files.
    fn copy_of(node: &str, files: &[&str]) -> (tempfile::TempDir, Roots) {
        let dir = tempfile::tempdir().unwrap();
        let from = fixture(node).procfs;
        for file in files {
            let to = dir.path().join("proc").join(file);
            std::fs::create_dir_all(to.parent().unwrap()).unwrap();
            std::fs::copy(from.join(file), &to).unwrap();
        }
        let roots = Roots {
            procfs: dir.path().join("proc"),
            sysfs: dir.path().join("sys"),
            ..Roots::default()
        };
        (dir, roots)
    }

    const VM_FILES: &[&str] = &[
        "stat",
        "loadavg",
        "meminfo",
        "pressure/cpu",
        "pressure/memory",
        "pressure/io",
    ];

    // ---- declarations ----

    #[test]
    fn tables_are_valid_and_unique() {
        vtax_store::Catalog::new(TABLES).unwrap();
        // Each source fills a field of its own, every field has a source,
        // and a kB key fills a bytes field.
        let filled = |table: &'static TableDef, push: &dyn Fn(&mut BatchBuilder)| {
            let mut rows = BatchBuilder::new(table);
            push(&mut rows);
            let batch = rows.finish();
            let filled: Vec<usize> = (0..table.fields.len())
                .filter(|&i| batch.fields[i].is_valid(0))
                .collect();
            assert_eq!(filled.len(), 1, "{}: {filled:?}", table.name);
            &table.fields[filled[0]]
        };
        let mut seen = std::collections::HashSet::new();
        for (key, unit, field) in MEMINFO {
            let def = filled(&MEMORY, &|rows| {
                let mut row = MemoryRow::default();
                *field(&mut row) = Some(1);
                rows.push_row(0, &row).unwrap();
            });
            assert!(seen.insert(def.name), "{key} fills {} again", def.name);
            let bytes = def.unit == Unit::Bytes;
            assert_eq!(bytes, *unit == MemUnit::KiB, "{key} -> {}", def.name);
        }
        assert_eq!(seen.len(), MEMORY.fields.len());
        for key in MEMINFO_REQUIRED {
            assert!(MEMINFO.iter().any(|(k, _, _)| k == key));
        }
        let mut seen = std::collections::HashSet::new();
        for (key, _, field) in STAT_KEYS {
            let def = filled(&KERNEL, &|rows| {
                let mut row = KernelRow::default();
                *field(&mut row) = Some(1);
                rows.push_row(0, &row).unwrap();
            });
            assert!(seen.insert(def.name), "{key} fills {} again", def.name);
        }
        assert_eq!(seen.len(), KERNEL.fields.len());
    }

    // ---- fixtures ----

    #[test]
    fn vm_node_fixture() {
        let sample = sample(&fixture("vm-node"), 7, 100.0).unwrap();

        let cpu = table(&sample, &CPU).unwrap();
        assert_eq!(cpu.len(), 2);
        assert!(cpu.time_us.iter().all(|&t| t == 7));
        assert_eq!(f64_of(cpu, Some("0"), "user_seconds"), 286839.0 / 100.0);
        assert_eq!(f64_of(cpu, Some("1"), "steal_seconds"), 554.0 / 100.0);
        assert_eq!(f64_of(cpu, Some("1"), "iowait_seconds"), 5121.0 / 100.0);

        let kernel = table(&sample, &KERNEL).unwrap();
        assert_eq!(u64_of(kernel, None, "context_switches"), 39801158);
        assert_eq!(u64_of(kernel, None, "interrupts"), 10114051);
        assert_eq!(u64_of(kernel, None, "softirqs"), 2926486);
        assert_eq!(u64_of(kernel, None, "forks"), 132112);
        assert_eq!(u64_of(kernel, None, "procs_running"), 3);
        assert_eq!(u64_of(kernel, None, "procs_blocked"), 0);
        assert_eq!(u64_of(kernel, None, "boot_time_seconds"), 1795257729);

        let pressure = table(&sample, &PRESSURE).unwrap();
        assert_eq!(pressure.tags[0].dict, ["cpu", "memory", "io"]);
        assert_eq!(
            f64_of(pressure, Some("cpu"), "some_stalled_seconds"),
            538397385.0 / 1e6
        );
        assert_eq!(
            f64_of(pressure, Some("cpu"), "some_avg10_ratio"),
            2.85 / 100.0
        );
        assert_eq!(
            f64_of(pressure, Some("io"), "full_stalled_seconds"),
            46094966.0 / 1e6
        );
        assert_eq!(
            f64_of(pressure, Some("io"), "full_avg10_ratio"),
            0.02 / 100.0
        );
        assert_eq!(
            f64_of(pressure, Some("memory"), "full_stalled_seconds"),
            0.0
        );

        let load = table(&sample, &LOAD).unwrap();
        assert_eq!(f64_of(load, None, "load1"), 0.55);
        assert_eq!(f64_of(load, None, "load5"), 1.04);
        assert_eq!(f64_of(load, None, "load15"), 1.27);
        assert_eq!(u64_of(load, None, "runnable_tasks"), 3);
        assert_eq!(u64_of(load, None, "tasks"), 105);

        let memory = table(&sample, &MEMORY).unwrap();
        assert_eq!(u64_of(memory, None, "total_bytes"), 24682416 * 1024);
        assert_eq!(u64_of(memory, None, "available_bytes"), 23811616 * 1024);
        assert_eq!(u64_of(memory, None, "dirty_bytes"), 43740 * 1024);
        assert_eq!(u64_of(memory, None, "swap_total_bytes"), 0);
        assert_eq!(u64_of(memory, None, "huge_pages"), 0);
        assert_eq!(u64_of(memory, None, "huge_page_size_bytes"), 2048 * 1024);

        // This VM's kernel has no CONFIG_SCHEDSTATS.
        assert!(table(&sample, &CPU_SCHED).is_none());
        assert_eq!(
            sample.summary(),
            "2 CPUs; pressure: cpu memory io; schedstat: none"
        );
        assert_eq!(sample.problems.len(), 1, "{:?}", sample.problems);
        assert!(sample.problems[0].contains("CONFIG_SCHEDSTATS"));
    }

    #[test]
    fn baremetal_node_fixture() {
        let sample = sample(&fixture("baremetal-node"), 7, 100.0).unwrap();
        assert!(sample.problems.is_empty(), "{:?}", sample.problems);
        assert_eq!(
            sample.summary(),
            "8 CPUs; pressure: cpu memory io; schedstat v15"
        );

        let cpu = table(&sample, &CPU).unwrap();
        assert_eq!(cpu.len(), 8);
        for n in 0..8 {
            assert_eq!(f64_of(cpu, Some(&n.to_string()), "steal_seconds"), 0.0);
        }
        assert_eq!(f64_of(cpu, Some("7"), "user_seconds"), 44641969.0 / 100.0);
        assert_eq!(f64_of(cpu, Some("0"), "softirq_seconds"), 910000.0 / 100.0);

        let kernel = table(&sample, &KERNEL).unwrap();
        assert_eq!(u64_of(kernel, None, "context_switches"), 48213377104);
        assert_eq!(u64_of(kernel, None, "interrupts"), 9876543210);
        assert_eq!(u64_of(kernel, None, "softirqs"), 3456789012);
        assert_eq!(u64_of(kernel, None, "forks"), 61234567);
        assert_eq!(u64_of(kernel, None, "procs_running"), 9);
        assert_eq!(u64_of(kernel, None, "procs_blocked"), 2);
        assert_eq!(u64_of(kernel, None, "boot_time_seconds"), 1794048000);

        // Linux 5.15: no irq pressure (Linux 6.1 and later).
        let pressure = table(&sample, &PRESSURE).unwrap();
        assert_eq!(pressure.tags[0].dict, ["cpu", "memory", "io"]);
        assert_eq!(
            f64_of(pressure, Some("cpu"), "some_stalled_seconds"),
            98765432109.0 / 1e6
        );
        assert_eq!(
            f64_of(pressure, Some("cpu"), "some_avg10_ratio"),
            12.34 / 100.0
        );
        assert_eq!(f64_of(pressure, Some("cpu"), "full_stalled_seconds"), 0.0);
        assert_eq!(
            f64_of(pressure, Some("memory"), "full_avg10_ratio"),
            0.25 / 100.0
        );

        let load = table(&sample, &LOAD).unwrap();
        assert_eq!(f64_of(load, None, "load1"), 7.42);
        assert_eq!(u64_of(load, None, "runnable_tasks"), 9);
        assert_eq!(u64_of(load, None, "tasks"), 1843);

        let memory = table(&sample, &MEMORY).unwrap();
        assert_eq!(u64_of(memory, None, "total_bytes"), 65842688 * 1024);
        assert_eq!(u64_of(memory, None, "swap_free_bytes"), 8126460 * 1024);
        assert_eq!(u64_of(memory, None, "mlocked_bytes"), 4190208 * 1024);
        assert_eq!(u64_of(memory, None, "huge_pages"), 4096);
        assert_eq!(u64_of(memory, None, "huge_pages_free"), 1024);
        assert_eq!(u64_of(memory, None, "huge_pages_reserved"), 512);
        assert_eq!(u64_of(memory, None, "huge_pages_surplus"), 0);
        assert_eq!(u64_of(memory, None, "hugetlb_bytes"), 8388608 * 1024);

        let sched = table(&sample, &CPU_SCHED).unwrap();
        assert_eq!(sched.len(), 8);
        assert_eq!(
            f64_of(sched, Some("3"), "run_delay_seconds"),
            (9_876_543_210_987u64 + 3 * 1_000_000_007) as f64 / 1e9
        );
        assert_eq!(
            f64_of(sched, Some("0"), "running_seconds"),
            362_345_678_901_234.0 / 1e9
        );
        assert_eq!(
            u64_of(sched, Some("7"), "timeslices"),
            2_345_678_901 + 7 * 12_345
        );
    }

    #[test]
    fn collector_probes_and_collects_through_roots() {
        let mut host = Host::new(&HostConfig::default(), &fixture("baremetal-node"));
        host.hz = 100.0;
        assert_eq!(
            host.probe(),
            Availability::Available("8 CPUs; pressure: cpu memory io; schedstat v15".into())
        );
        let batches = host.collect(42).unwrap();
        assert_eq!(batches.len(), TABLES.len());
        assert!(batches.iter().all(|b| b.time_us.iter().all(|&t| t == 42)));
        assert!(host.problems().is_empty());

        let mut nowhere = Host::new(
            &HostConfig::default(),
            &Roots {
                procfs: "/nonexistent/proc".into(),
                sysfs: "/nonexistent/sys".into(),
                ..Roots::default()
            },
        );
        match nowhere.probe() {
            Availability::Absent(reason) => assert!(reason.contains("/nonexistent/proc/stat")),
            other => panic!("{other:?}"),
        }
        assert!(nowhere.collect(1).is_err());
    }

    #[test]
    fn a_kernel_without_pressure_or_schedstat_is_not_a_failure() {
        let (_dir, roots) = copy_of("vm-node", &["stat", "loadavg", "meminfo"]);
        let sample = sample(&roots, 7, 100.0).unwrap();
        assert!(table(&sample, &PRESSURE).is_none());
        assert!(table(&sample, &CPU_SCHED).is_none());
        assert_eq!(sample.summary(), "2 CPUs; pressure: none; schedstat: none");
        assert_eq!(sample.problems.len(), 2, "{:?}", sample.problems);
        assert!(sample.problems[0].contains("psi=0"));
        assert!(sample.problems[1].contains("CONFIG_SCHEDSTATS"));
    }

    #[test]
    fn schedstat_versions() {
        // Version 17 names the domain in its domain lines; cpu lines are unchanged.
        let v17 = "version 17\ntimestamp 4295\n\
            cpu0 0 0 5 1 9 3 2000000000 500000000 77\n\
            domain0 MC 03 1 2 3\n\
            cpu1 0 0 5 1 9 3 1000000000 250000000 66\n";
        let (version, batch) = parse_schedstat(v17, "schedstat", 7).unwrap();
        assert_eq!(version, Schedstat::Read(17));
        let batch = batch.unwrap();
        assert_eq!(f64_of(&batch, Some("0"), "running_seconds"), 2.0);
        assert_eq!(f64_of(&batch, Some("1"), "run_delay_seconds"), 0.25);
        assert_eq!(u64_of(&batch, Some("1"), "timeslices"), 66);

        // Version 14 had three more yield counters in front: not read, reported.
        let v14 = "version 14\ntimestamp 1\ncpu0 0 0 0 0 0 0 0 0 0 1 2 3\n";
        assert_eq!(
            parse_schedstat(v14, "schedstat", 7).unwrap(),
            (Schedstat::Unsupported(14), None)
        );
        let (dir, roots) = copy_of("vm-node", VM_FILES);
        std::fs::write(dir.path().join("proc/schedstat"), v14).unwrap();
        let sample = sample(&roots, 7, 100.0).unwrap();
        assert!(table(&sample, &CPU_SCHED).is_none());
        assert!(sample.summary().ends_with("schedstat: v14 unsupported"));
        assert!(
            sample.problems[0].contains("version 14"),
            "{:?}",
            sample.problems
        );

        for bad in [
            "",
            "timestamp 1\ncpu0 1\n",
            "version x\n",
            "version 15\ntimestamp 1\n",
        ] {
            assert!(parse_schedstat(bad, "schedstat", 7).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn pressure_lines() {
        // cpu before Linux 5.13: only `some`.
        let row = parse_pressure(
            "some avg10=1.00 avg60=0.50 avg300=0.25 total=1500000\n",
            "cpu",
            "cpu",
        )
        .unwrap();
        let expected = PressureRow {
            resource: "cpu",
            some_stalled_seconds: Some(1.5),
            full_stalled_seconds: None,
            some_avg10_ratio: Some(0.01),
            full_avg10_ratio: None,
        };
        assert_eq!(row, expected);
    }

    #[test]
    fn irq_pressure_where_the_kernel_has_it() {
        // Linux 6.1+ with CONFIG_IRQ_TIME_ACCOUNTING: irq has only a `full` line.
        let (dir, roots) = copy_of(
            "baremetal-node",
            &[
                "stat",
                "loadavg",
                "meminfo",
                "schedstat",
                "pressure/cpu",
                "pressure/memory",
                "pressure/io",
            ],
        );
        std::fs::write(
            dir.path().join("proc/pressure/irq"),
            "full avg10=0.07 avg60=0.05 avg300=0.04 total=456789012\n",
        )
        .unwrap();
        let sample = sample(&roots, 7, 100.0).unwrap();
        assert_eq!(
            sample.summary(),
            "8 CPUs; pressure: cpu memory io irq; schedstat v15"
        );
        let pressure = table(&sample, &PRESSURE).unwrap();
        assert_eq!(pressure.tags[0].dict, ["cpu", "memory", "io", "irq"]);
        assert_eq!(
            f64_of(pressure, Some("irq"), "full_stalled_seconds"),
            456789012.0 / 1e6
        );
        assert_eq!(
            f64_of(pressure, Some("irq"), "full_avg10_ratio"),
            0.07 / 100.0
        );
        assert_eq!(value(pressure, Some("irq"), "some_stalled_seconds"), None);
        assert_eq!(value(pressure, Some("irq"), "some_avg10_ratio"), None);
    }

    // ---- garbage ----

    /// Writes `content` over `file` in a copy of the vm-node tree and checks
    /// that the read names the file (and the line) in its one error, and
    /// that the file costs only its own rows: every other table is there,
    /// the CPU rows with their steal time unless the CPU lines are the bad ones.
    fn assert_garbage(file: &str, content: &str, want: &str) {
        let (dir, roots) = copy_of("vm-node", VM_FILES);
        let path = dir.path().join("proc").join(file);
        std::fs::write(&path, content).unwrap();
        let sample = sample(&roots, 7, 100.0)
            .unwrap_or_else(|e| panic!("{file} {content:?}: the whole read failed: {e}"));
        let errors: Vec<String> = sample.errors.iter().map(ToString::to_string).collect();
        let expected = format!("{}{want}", path.display());
        assert!(
            errors.len() == 1 && errors[0].starts_with(&expected),
            "{file} {content:?}: {errors:?} is not one error starting with {expected:?}"
        );
        let from_file: &[&TableDef] = match file {
            "stat" => &[&CPU, &KERNEL],
            "loadavg" => &[&LOAD],
            "meminfo" => &[&MEMORY],
            "schedstat" => &[&CPU_SCHED],
            _ => &[],
        };
        for def in [&CPU, &KERNEL, &LOAD, &MEMORY, &PRESSURE] {
            if !from_file.iter().any(|d| d.name == def.name) {
                assert!(
                    table(&sample, def).is_some(),
                    "{file} {content:?}: no {} rows",
                    def.name
                );
            }
        }
        if let Some(resource) = file.strip_prefix("pressure/") {
            let pressure = table(&sample, &PRESSURE).unwrap();
            assert!(!pressure.tags[0].dict.iter().any(|r| r == resource));
            assert_eq!(pressure.len(), 2, "the other two resources' rows");
        }
        if file != "stat" {
            assert_eq!(
                f64_of(table(&sample, &CPU).unwrap(), Some("1"), "steal_seconds"),
                554.0 / 100.0
            );
        }
    }

    /// An empty `pressure/cpu`, junk in `meminfo` or in `loadavg` on the
    /// bare-metal tree: the CPU rows (steal included) and every other
    /// table's rows are still written, the collector's tick succeeds, and
    /// the bad file is its one source error until it mends.
    #[test]
    fn one_bad_file_costs_only_its_own_rows() {
        let files = [
            "stat",
            "loadavg",
            "meminfo",
            "schedstat",
            "pressure/cpu",
            "pressure/memory",
            "pressure/io",
        ];
        let damage = [
            ("pressure/cpu", "", PRESSURE.name),
            ("meminfo", "MemTotal: junk kB\nMemFree: 1 kB\n", MEMORY.name),
            ("loadavg", "0.5 zz\n", LOAD.name),
        ];
        for (file, junk, lost) in damage {
            let (dir, roots) = copy_of("baremetal-node", &files);
            let path = dir.path().join("proc").join(file);
            let good = std::fs::read(&path).unwrap();
            let mut host = Host::new(&HostConfig::default(), &roots);
            host.hz = 100.0;
            std::fs::write(&path, junk).unwrap();
            assert!(matches!(host.probe(), Availability::Available(_)), "{file}");
            let batches = host.collect(42).unwrap();
            let names: Vec<&str> = batches.iter().map(|b| b.table.name).collect();
            let cpu = batches.iter().find(|b| b.table.name == "cpu").unwrap();
            assert_eq!(cpu.len(), 8, "{file}");
            assert_eq!(f64_of(cpu, Some("7"), "steal_seconds"), 0.0, "{file}");
            for def in TABLES {
                let pressure_row_left = def.name == "pressure" && file == "pressure/cpu";
                assert_eq!(
                    names.contains(&def.name),
                    def.name != lost || pressure_row_left,
                    "{file}: {names:?}"
                );
            }
            if file == "pressure/cpu" {
                let pressure = batches.iter().find(|b| b.table.name == "pressure").unwrap();
                assert_eq!(pressure.tags[0].dict, ["memory", "io"]);
            }
            let errors = host.source_errors();
            assert_eq!(errors.len(), 1, "{file}: {errors:?}");
            assert_eq!(errors[0].path, path.display().to_string());

            std::fs::write(&path, good).unwrap();
            assert_eq!(host.collect(43).unwrap().len(), TABLES.len(), "{file}");
            assert!(host.source_errors().is_empty(), "{file} mended");
        }
    }

    /// Only when no file gives a row does the tick fail, and the probe then
    /// says the source reads badly rather than that it is absent.
    #[test]
    fn every_file_bad_fails_the_tick_and_the_probe() {
        let (dir, roots) = copy_of("vm-node", VM_FILES);
        for file in VM_FILES {
            std::fs::write(dir.path().join("proc").join(file), "junk\n").unwrap();
        }
        let mut host = Host::new(&HostConfig::default(), &roots);
        match host.probe() {
            Availability::Failed(error) => {
                assert!(error.ends_with("proc/stat: no per-CPU lines"), "{error}")
            }
            other => panic!("{other:?}"),
        }
        assert!(host.collect(1).is_err());
    }

    #[test]
    fn truncated_lines_fail_naming_file_and_line() {
        assert_garbage(
            "stat",
            "cpu  1 2 3 4\ncpu0 1 2\n",
            ":2: fewer than 4 columns",
        );
        assert_garbage("stat", "cpu0 1 2 3 4\nctxt\n", ":2: ctxt has no value");
        assert_garbage("loadavg", "0.55 1.04\n", ":1: truncated: no load15");
        assert_garbage(
            "loadavg",
            "0.55 1.04 1.27 3\n",
            ":1: \"3\" is not runnable/total",
        );
        assert_garbage("meminfo", "MemTotal:       24682416 kB\nMemFr", ":2: ");
        assert_garbage("meminfo", "MemTotal:\n", ":1: MemTotal has no value");
        assert_garbage(
            "pressure/cpu",
            "some avg10=4.50 avg60=3.74 avg300=3.71 total=537802659\nfull avg10=0.00 avg6",
            ":2: \"avg6\" is not key=value",
        );
        assert_garbage(
            "pressure/io",
            "some avg10=4.50 avg60=3.74\n",
            ":1: some line has no total=",
        );
        assert_garbage(
            "schedstat",
            "version 15\ntimestamp 1\ncpu0 0 0 1 2 3 4 5\n",
            ":3: 7 counters",
        );
    }

    #[test]
    fn non_numbers_fail_naming_file_and_line() {
        assert_garbage("stat", "cpu0 1 2 3 4\ncpuX 1 2 3 4\n", ":2: bad CPU number");
        let stat = std::fs::read_to_string(fixture("vm-node").proc("stat")).unwrap();
        assert_garbage(
            "stat",
            &stat.replace("procs_running 3", "procs_running three"),
            ":8: \"three\" is not a count",
        );
        assert_garbage(
            "loadavg",
            "0.55 NaN 1.27 3/105 2265\n",
            ":1: \"NaN\" is not a load average",
        );
        assert_garbage(
            "loadavg",
            "0.55 1.04 1.27 3/-1 2265\n",
            ":1: \"-1\" is not a task count",
        );
        assert_garbage(
            "meminfo",
            "MemTotal:       2468x416 kB\n",
            ":1: \"2468x416\" is not a number",
        );
        assert_garbage(
            "meminfo",
            "MemTotal:       1 MB\n",
            ":1: MemTotal: unknown unit",
        );
        assert_garbage("meminfo", "MemTotal:       1\n", ":1: MemTotal: no kB unit");
        assert_garbage(
            "pressure/memory",
            "some avg10=inf avg60=0.00 avg300=0.00 total=0\n",
            ":1: \"inf\" is not a percentage",
        );
        assert_garbage(
            "pressure/memory",
            "partial avg10=0.00 avg60=0.00 avg300=0.00 total=0\n",
            ":1: \"partial\" is neither some nor full",
        );
        assert_garbage(
            "schedstat",
            "version 16\ntimestamp 1\ncpu0 0 0 0 0 0 0 1 x 1\n",
            ":3: \"x\" is not a counter",
        );
        assert_garbage(
            "schedstat",
            "version sixteen\n",
            ":1: \"sixteen\" is not a version",
        );
        assert_garbage(
            "schedstat",
            "timestamp 1\n",
            ":1: \"timestamp 1\" is not 'version N'",
        );
    }

    #[test]
    fn overflows_fail_naming_file_and_line() {
        let huge = "18446744073709551616"; // u64::MAX + 1
        assert_garbage(
            "stat",
            &format!("cpu0 1 2 3 {huge}\n"),
            &format!(":1: \"{huge}\" overflows a 64-bit tick count"),
        );
        assert_garbage(
            "loadavg",
            &format!("0.1 0.2 0.3 1/{huge} 5\n"),
            ":1: \"18446744073709551616\" overflows",
        );
        // Fits in kB, not in bytes.
        assert_garbage(
            "meminfo",
            "MemTotal:       18446744073709551615 kB\n",
            ":1: MemTotal: 18446744073709551615 kB overflows",
        );
        assert_garbage(
            "pressure/cpu",
            &format!("some avg10=0.00 avg60=0.00 avg300=0.00 total={huge}\n"),
            ":1: \"18446744073709551616\" overflows a 64-bit microsecond count",
        );
        assert_garbage(
            "schedstat",
            &format!("version 15\ncpu0 0 0 0 0 0 0 {huge} 1 1\n"),
            ":2: \"18446744073709551616\" overflows",
        );
        assert_garbage("schedstat", "version 99999999999\n", ":1: ");
    }

    #[test]
    fn empty_files_fail_naming_the_file() {
        assert_garbage("stat", "", ": no per-CPU lines");
        assert_garbage("loadavg", "", ":1: truncated: no load1");
        assert_garbage("meminfo", "", ": no MemTotal line");
        assert_garbage("pressure/io", "", ": no some or full line");
        assert_garbage("schedstat", "", ": no version line");
        // /proc/stat with CPUs but none of the kernel lines.
        assert_garbage("stat", "cpu0 1 2 3 4\n", ": no ctxt line");
    }

    /// Every prefix of every fixture file parses or fails, never panics.
    #[test]
    fn truncation_at_every_byte_never_panics() {
        for node in ["vm-node", "baremetal-node"] {
            let procfs = fixture(node).procfs;
            let read = |f: &str| std::fs::read_to_string(procfs.join(f)).ok();
            type Parses = dyn Fn(&str) -> bool;
            let parsers: [(&str, &Parses); 8] = [
                ("stat", &|t| parse(t, "p", 0, 100.0).is_ok()),
                ("stat", &|t| parse_kernel(t, "p", 0).is_ok()),
                ("loadavg", &|t| parse_loadavg(t, "p", 0).is_ok()),
                ("meminfo", &|t| parse_meminfo(t, "p", 0).is_ok()),
                ("pressure/cpu", &|t| parse_pressure(t, "p", "cpu").is_ok()),
                ("pressure/io", &|t| parse_pressure(t, "p", "io").is_ok()),
                ("pressure/memory", &|t| {
                    parse_pressure(t, "p", "memory").is_ok()
                }),
                ("schedstat", &|t| parse_schedstat(t, "p", 0).is_ok()),
            ];
            for (file, parser) in parsers {
                let Some(text) = read(file) else {
                    continue;
                };
                assert!(parser(&text), "{node}/{file} as a whole");
                for end in (0..text.len()).filter(|&i| text.is_char_boundary(i)) {
                    let _ = parser(&text[..end]);
                }
            }
        }
    }
}
