//! The host's tables, and which line of /proc/meminfo and /proc/stat fills
//! which field.

use super::*;

pub(super) const fn seconds_counter(name: &'static str, help: &'static str) -> FieldDef {
    FieldDef::counter(name, FieldType::F64, Unit::Seconds, help)
}

pub(super) const fn count_counter(name: &'static str, help: &'static str) -> FieldDef {
    FieldDef::counter(name, FieldType::U64, Unit::None, help)
}

pub(super) const fn count_gauge(name: &'static str, help: &'static str) -> FieldDef {
    FieldDef::gauge(name, FieldType::U64, Unit::None, help)
}

pub(super) const fn bytes_gauge(name: &'static str, help: &'static str) -> FieldDef {
    FieldDef::gauge(name, FieldType::U64, Unit::Bytes, help)
}

pub(super) const CPU_TAG: TagDef = TagDef {
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
pub(super) enum MemUnit {
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
pub(super) type MeminfoSource = (
    &'static str,
    MemUnit,
    fn(&mut MemoryRow) -> &mut Option<u64>,
);

/// The `/proc/meminfo` key each [`MEMORY`] field is read from.
pub(super) static MEMINFO: &[MeminfoSource] = {
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
pub(super) const MEMINFO_REQUIRED: &[&str] = &["MemTotal", "MemFree"];

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
pub(super) type StatSource = (&'static str, bool, fn(&mut KernelRow) -> &mut Option<u64>);

/// The kernel activity line of `/proc/stat` each [`KERNEL`] field is read from.
pub(super) static STAT_KEYS: &[StatSource] = &[
    ("ctxt", true, |r| &mut r.context_switches),
    ("intr", true, |r| &mut r.interrupts),
    ("softirq", false, |r| &mut r.softirqs),
    ("processes", true, |r| &mut r.forks),
    ("procs_running", true, |r| &mut r.procs_running),
    ("procs_blocked", true, |r| &mut r.procs_blocked),
    ("btime", true, |r| &mut r.boot_time_seconds),
];
