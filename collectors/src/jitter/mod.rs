//! `jitter`: what the scheduler, the interrupts and the hypervisor take from
//! a thread on this node, measured by the agent itself.
//!
//! A probe thread ([`probe`]) started at the collector's `probe` and stopped
//! when the collector is dropped (agent stop, reload) runs two probes on one
//! CPU at a time, rotating over the configured ones:
//! - wake-up latency, cyclictest's method: `clock_nanosleep(TIMER_ABSTIME)` on
//!   CLOCK_MONOTONIC to a fixed grid of deadlines, lateness into an HDR
//!   histogram and into fixed Prometheus buckets;
//! - interruption, sysjitter's and osnoise's method: right after a wake-up,
//!   when the budget allows, a spin of `slice_us` reading the clock; every gap
//!   above `gap_threshold_us` is time the thread lost. Per window the lost
//!   time is split into what the guest accounts for (the thread's own run
//!   delay while spinning, from `/proc/thread-self/schedstat`; the CPU's
//!   irq, softirq and steal shares from `<procfs>/stat` deltas over the time
//!   probed)
//!   and the unexplained rest: what the hypervisor or the hardware took
//!   without the guest's accounting seeing it.
//!
//! The thread's CPU time (CLOCK_THREAD_CPUTIME_ID) is charged against
//! `cpu_budget_ratio`: spins happen only while the budget has room, and
//! wake-ups are skipped if they alone would exceed it. Each tick the collector
//! harvests finished windows into rows; between windows it has none, and the
//! runtime keeps the last window's series on `/metrics` ([`Collector::windowed`]).

mod probe;
mod procfs;

/// The calling thread's CPU time, for timing other collectors' calls too.
pub(crate) use probe::thread_cpu_ns;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use vtax_store::schema::{FieldDef, FieldType, TableDef, TagDef, Unit, BUCKET_TAG};
use vtax_store::{Batch, BatchBuilder};

pub use probe::BUCKETS;
use probe::{Settings, Shared, Window};

use super::{Availability, Collector, Roots};

/// Name of the probe thread (as `/proc/<pid>/task/<tid>/comm` shows it).
pub const THREAD_NAME: &str = "vtax-jitter";

/// Default period of the wake-up grid. cyclictest's default is 1 ms, but a
/// wake-up costs the thread 30-40 µs of CPU in a KVM guest (the timer's VM
/// exits; measured on the development VM, cyclictest's own cost is the same),
/// so 1 ms alone would take 3-4% of a core against a 1% budget. 10 ms leaves
/// room for the interruption probe's spins.
pub const DEFAULT_INTERVAL_US: u64 = 10_000;
/// Default spin length.
pub const DEFAULT_SLICE_US: u64 = 200;
/// Default gap threshold: sysjitter's and osnoise's.
pub const DEFAULT_GAP_THRESHOLD_US: u64 = 1;
/// Default window.
pub const DEFAULT_WINDOW_SECS: u64 = 10;
/// Default time on one CPU before the probe moves to the next.
pub const DEFAULT_ROTATE_MS: u64 = 1000;
/// Default budget: 1% of one core for both probes together.
pub const DEFAULT_CPU_BUDGET_RATIO: f64 = 0.01;
/// Default SCHED_FIFO priority when `sched_fifo` is on: the lowest, so the
/// probe preempts ordinary threads but no real-time work.
pub const DEFAULT_FIFO_PRIORITY: i32 = 1;
/// Default number of gaps kept per window.
pub const DEFAULT_MAX_GAPS_PER_WINDOW: usize = 32;

/// How long `probe` waits for the thread to say how it runs.
const SETUP_TIMEOUT: Duration = Duration::from_secs(5);

/// Where the probe thread reads its own run delay. The thread is the agent's,
/// so this is the agent's own procfs, whatever `--path.procfs` says: that
/// root is the host's (`/host/proc` in a container, a fixture tree in tests)
/// and serves the host-wide files (`<procfs>/stat`), not this process's tasks.
const OWN_SCHEDSTAT: &str = "/proc/thread-self/schedstat";

/// `[collectors.jitter]`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct JitterConfig {
    /// Whether the collector runs.
    pub enabled: bool,
    /// Seconds between two harvests of finished windows.
    pub interval_secs: f64,
    /// CPUs to probe, in turn; empty rotates over every CPU the agent may use.
    pub cpus: Vec<usize>,
    /// Period of the wake-up grid, microseconds.
    pub interval_us: u64,
    /// Length of one spin of the interruption probe, microseconds; 0 turns it off.
    pub slice_us: u64,
    /// Clock gaps longer than this are interruptions, microseconds.
    pub gap_threshold_us: u64,
    /// Seconds per window (one row per CPU per window).
    pub window_secs: u64,
    /// Milliseconds on one CPU before moving to the next.
    pub rotate_ms: u64,
    /// Share of one core both probes may use together.
    pub cpu_budget_ratio: f64,
    /// Ask for SCHED_FIFO (falls back to SCHED_OTHER when refused).
    pub sched_fifo: bool,
    /// SCHED_FIFO priority.
    pub fifo_priority: i32,
    /// Largest gaps kept per window in `jitter_gap`.
    pub max_gaps_per_window: usize,
}

impl Default for JitterConfig {
    fn default() -> Self {
        JitterConfig {
            enabled: true,
            interval_secs: super::DEFAULT_INTERVAL_SECS,
            cpus: Vec::new(),
            interval_us: DEFAULT_INTERVAL_US,
            slice_us: DEFAULT_SLICE_US,
            gap_threshold_us: DEFAULT_GAP_THRESHOLD_US,
            window_secs: DEFAULT_WINDOW_SECS,
            rotate_ms: DEFAULT_ROTATE_MS,
            cpu_budget_ratio: DEFAULT_CPU_BUDGET_RATIO,
            sched_fifo: false,
            fifo_priority: DEFAULT_FIFO_PRIORITY,
            max_gaps_per_window: DEFAULT_MAX_GAPS_PER_WINDOW,
        }
    }
}

crate::common_settings!(JitterConfig);

impl crate::Registered for JitterConfig {
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
        Box::new(Jitter::new(self, roots))
    }
    fn check(&self) -> Result<(), (String, String)> {
        self.validate()
    }
}

impl JitterConfig {
    /// Checks the ranges serde cannot; on failure the dotted key and the message.
    pub fn validate(&self) -> Result<(), (String, String)> {
        let err = |key: &str, message: String| {
            Err((
                format!("collectors.jitter.{key}"),
                format!("collectors.jitter.{key} = {message}"),
            ))
        };
        if !(50..=1_000_000).contains(&self.interval_us) {
            return err(
                "interval_us",
                format!("{}: must be between 50 and 1000000", self.interval_us),
            );
        }
        if self.slice_us > self.interval_us / 2 {
            return err(
                "slice_us",
                format!(
                    "{}: must be at most half of interval_us ({}), so that a spin ends before the next wake-up",
                    self.slice_us, self.interval_us
                ),
            );
        }
        if !(1..=1_000_000).contains(&self.gap_threshold_us) {
            return err(
                "gap_threshold_us",
                format!("{}: must be between 1 and 1000000", self.gap_threshold_us),
            );
        }
        if !(1..=3600).contains(&self.window_secs) {
            return err(
                "window_secs",
                format!("{}: must be between 1 and 3600", self.window_secs),
            );
        }
        if !(10..=3_600_000).contains(&self.rotate_ms) {
            return err(
                "rotate_ms",
                format!("{}: must be between 10 and 3600000", self.rotate_ms),
            );
        }
        let budget = self.cpu_budget_ratio;
        if !(budget > 0.0 && budget <= 1.0) {
            return err(
                "cpu_budget_ratio",
                format!("{budget}: must be above 0 and at most 1 (one whole core)"),
            );
        }
        if !(1..=99).contains(&self.fifo_priority) {
            return err(
                "fifo_priority",
                format!("{}: must be between 1 and 99", self.fifo_priority),
            );
        }
        if self.max_gaps_per_window > 10_000 {
            return err(
                "max_gaps_per_window",
                format!("{}: must be at most 10000", self.max_gaps_per_window),
            );
        }
        let mut seen = std::collections::HashSet::new();
        for &cpu in &self.cpus {
            if cpu >= libc::CPU_SETSIZE as usize {
                return err(
                    "cpus",
                    format!(
                        "{:?}: CPU {cpu} is beyond the {} CPUs Linux can pin to",
                        self.cpus,
                        libc::CPU_SETSIZE
                    ),
                );
            }
            if !seen.insert(cpu) {
                return err(
                    "cpus",
                    format!("{:?}: CPU {cpu} is listed twice", self.cpus),
                );
            }
        }
        Ok(())
    }
}

/// Ranges of this collector's own numeric keys; `cpus` is each CPU listed (Linux pins to at most 1024).
pub static KEY_RANGES: crate::keys::KeyRanges = &[
    ("cpus", crate::keys::KeyRange::between(0.0, 1023.0)),
    (
        "interval_us",
        crate::keys::KeyRange::between(50.0, 1_000_000.0),
    ),
    ("slice_us", crate::keys::KeyRange::between(0.0, 500_000.0)),
    (
        "gap_threshold_us",
        crate::keys::KeyRange::between(1.0, 1_000_000.0),
    ),
    ("window_secs", crate::keys::KeyRange::between(1.0, 3600.0)),
    (
        "rotate_ms",
        crate::keys::KeyRange::between(10.0, 3_600_000.0),
    ),
    ("cpu_budget_ratio", crate::keys::KeyRange::above(0.0, 1.0)),
    ("fifo_priority", crate::keys::KeyRange::between(1.0, 99.0)),
    (
        "max_gaps_per_window",
        crate::keys::KeyRange::between(0.0, 10_000.0),
    ),
];

/// Comments for this collector's own keys in the example config.
pub static KEY_DOCS: &[(&str, &str)] = &[
    (
        "cpus",
        "CPUs to probe, one at a time in turn (e.g. [2, 3]); empty rotates over every CPU the agent may run on.",
    ),
    (
        "interval_us",
        "Microseconds between two wake-up deadlines (cyclictest's -i). Each wake-up's CPU (30-40 us in a KVM guest, measured) is charged to cpu_budget_ratio: wake-ups the budget cannot pay for are skipped.",
    ),
    (
        "slice_us",
        "Microseconds of one spin of the interruption probe, at most half of interval_us; 0 turns that probe off.",
    ),
    (
        "gap_threshold_us",
        "A clock gap longer than this while spinning is an interruption (osnoise's and sysjitter's threshold).",
    ),
    (
        "window_secs",
        "Seconds per window: one jitter row per CPU probed, on wall-clock multiples of this.",
    ),
    (
        "rotate_ms",
        "Milliseconds on one CPU before the probe moves to the next of cpus.",
    ),
    (
        "cpu_budget_ratio",
        "Share of one core both probes may use together, measured from the probe thread's own CPU time (0.01 = 1%).",
    ),
    (
        "sched_fifo",
        "Run the probe as SCHED_FIFO (measures what a real-time thread would see); when refused it stays SCHED_OTHER and vtax doctor says so.",
    ),
    ("fifo_priority", "SCHED_FIFO priority when sched_fifo is on (1-99)."),
    (
        "max_gaps_per_window",
        "Keep this many of each window's largest gaps in the jitter_gap table.",
    ),
];

/// Tables of this collector.
pub static TABLES: &[&TableDef] = &[&JITTER, &WAKEUP, &GAP];

const CPU_TAG: TagDef = TagDef {
    name: "cpu",
    help: "Logical CPU the probe ran on.",
};

const fn seconds(name: &'static str, help: &'static str) -> FieldDef {
    FieldDef::gauge(name, FieldType::F64, Unit::Seconds, help)
}

const fn ratio(name: &'static str, help: &'static str) -> FieldDef {
    FieldDef::gauge(name, FieldType::F64, Unit::Ratio, help)
}

const fn count(name: &'static str, help: &'static str) -> FieldDef {
    FieldDef::gauge(name, FieldType::U64, Unit::None, help)
}

/// A count of wake-ups over a threshold ([`probe::STALL_NS`]) in the window,
/// kept for per-window queries of the store. A threshold is a histogram
/// bucket in Prometheus's terms: the jitter_wakeup histogram has a bound at
/// each, and counts since the start, which rates and sums across CPUs and
/// nodes take, where a per-window count exported as a gauge is neither.
const fn stalls(name: &'static str, help: &'static str) -> FieldDef {
    FieldDef::stored_only(name, FieldType::U64, Unit::None, help)
}

vtax_store::table! {
    /// One row per window per CPU probed.
    pub static JITTER: TableDef, pub struct JitterRow {
        name: "jitter",
        help: "One row per window (window_secs, on wall-clock multiples) per CPU the probe ran on: wake-up latency percentiles (cyclictest's method), and the interruption probe's lost time split into what the guest accounts for and the unexplained rest. The row's time is the window's end.",
        tags: [cpu = CPU_TAG],
        fields: [
            wakeups: u64 = FieldDef::stored_only(FieldType::U64, Unit::None, "Wake-ups measured on this CPU in the window. Not exported: on /metrics, vtax_jitter_wakeup_latency_seconds_count counts them since the start."),
            wakeup_p50_seconds: Option<f64> = seconds("Median wake-up latency: how late the probe woke after its absolute deadline."),
            wakeup_p90_seconds: Option<f64> = seconds("90th percentile of wake-up latency."),
            wakeup_p99_seconds: Option<f64> = seconds("99th percentile of wake-up latency."),
            wakeup_p999_seconds: Option<f64> = seconds("99.9th percentile of wake-up latency."),
            wakeup_p9999_seconds: Option<f64> = seconds("99.99th percentile of wake-up latency."),
            wakeup_max_seconds: Option<f64> = seconds("Largest wake-up latency."),
            stalls_over_50us: u64 = stalls("Wake-ups later than 50 microseconds in the window. Not exported: on /metrics, vtax_jitter_wakeup_latency_seconds_count minus its bucket le=\"5e-05\" counts them since the start."),
            stalls_over_500us: u64 = stalls("Wake-ups later than 500 microseconds in the window. Not exported: on /metrics, vtax_jitter_wakeup_latency_seconds_count minus its bucket le=\"0.0005\" counts them since the start."),
            probed_seconds: f64 = seconds("Wall time the probe was placed on this CPU in the window."),
            probe_cpu_seconds: f64 = seconds("CPU time the probe thread used while placed on this CPU (CLOCK_THREAD_CPUTIME_ID): the probes' cost against cpu_budget_ratio."),
            spin_seconds: f64 = seconds("Time the interruption probe spun on this CPU."),
            gaps: u64 = count("Clock gaps above gap_threshold_us while spinning."),
            largest_gap_seconds: Option<f64> = seconds("Longest clock gap while spinning; null when the probe did not spin."),
            interrupted_ratio: Option<f64> = ratio("Share of the spin time lost to gaps above the threshold."),
            run_delay_ratio: Option<f64> = ratio("Share of the spin time the probe thread waited runnable for the CPU (other threads of this guest ran), from thread-self/schedstat; null where the kernel lacks it."),
            irq_ratio: Option<f64> = ratio("Share of this CPU's time in irq and softirq while probed, from /proc/stat: the expected share of a spin lost to interrupts the guest handled."),
            steal_ratio: Option<f64> = ratio("Share of this CPU's time stolen by the hypervisor while probed, from /proc/stat."),
            busy_ratio: Option<f64> = ratio("Share of this CPU's time while probed that was neither idle nor iowait, from /proc/stat, the probe's own time included. It says which regime the spins measured: near 1, a CPU that other work keeps running (what a thread running throughout meets); near 0, a vCPU that halts between spins, whose spins lose more than on a CPU kept busy, all through the spin rather than at its start (bench/jitter/vs_oslat.py and spin_length.py measure both). Compare interrupted_ratio and unexplained_ratio between CPUs and nodes of like busy_ratio."),
            unexplained_ratio: Option<f64> = ratio("interrupted_ratio minus run_delay_ratio, irq_ratio and steal_ratio (at least 0): lost time the guest's own accounting does not show, taken by the hypervisor (VM exits) or the hardware (SMIs). It errs high on a CPU that is mostly idle and has steal: a hypervisor steals only from a vCPU that wants to run, so a spin meets steal at its share of the CPU's busy time, but steal_ratio is its share of all the time."),
        ],
        exported: true,
    }
}

vtax_store::table! {
    /// Cumulative wake-up latency histogram per CPU.
    pub static WAKEUP: TableDef, pub struct WakeupRow {
        name: "jitter_wakeup",
        help: "Per CPU per window, the wake-up latency histogram since the collector started, in fixed buckets from 1 microsecond to 0.1 seconds, so that tail latency aggregates across nodes with histogram_quantile.",
        tags: [
            cpu = CPU_TAG,
            le = TagDef {
                name: BUCKET_TAG,
                help: "Bucket upper bound in seconds (+Inf for all).",
            },
        ],
        fields: [
            latency_seconds: u64 = FieldDef::histogram(Unit::Seconds, "Wake-ups whose latency was at most le seconds (cumulative, since the collector started)."),
            latency_seconds_sum: Option<f64> = FieldDef::histogram_sum(Unit::Seconds, "Sum of the wake-up latencies, on the +Inf row."),
        ],
        exported: true,
    }
}

vtax_store::table! {
    /// The largest gaps of each window.
    pub static GAP: TableDef, pub struct GapRow {
        name: "jitter_gap",
        help: "The largest clock gaps of each window (max_gaps_per_window of them), one row per gap at the time it began. Not exported to Prometheus: one sample per event is not a series.",
        tags: [cpu = CPU_TAG],
        fields: [gap_seconds: f64 = seconds("Length of the gap.")],
        exported: false,
    }
}

/// The jitter collector.
pub struct Jitter {
    config: JitterConfig,
    roots: Roots,
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
    /// CPUs configured but not available to the agent.
    missing: Vec<usize>,
    /// CPUs probed.
    cpus: Vec<usize>,
    /// Per CPU: cumulative bucket counts (`+Inf` last) and latency sum.
    histograms: BTreeMap<usize, ([u64; BUCKETS.len() + 1], u64)>,
    dropped_windows: u64,
    /// The kernel charges no time to hard IRQs (`procfs::hard_irq_unaccounted`).
    hard_irq_unaccounted: bool,
    /// When a tick last harvested a window (or the first tick since the
    /// probe started): a probe silent for two windows and more is stuck.
    last_window_at: Option<std::time::Instant>,
    /// The probe thread's own schedstat ([`OWN_SCHEDSTAT`]; tests point it
    /// elsewhere).
    schedstat_path: PathBuf,
}

/// How long a stop waits for the probe thread.
const PROBE_STOP_WAIT: std::time::Duration = std::time::Duration::from_secs(3);

impl Jitter {
    /// A collector that starts its probe at `probe`.
    pub fn new(config: &JitterConfig, roots: &Roots) -> Self {
        Jitter {
            config: config.clone(),
            roots: roots.clone(),
            shared: Arc::new(Shared::default()),
            thread: None,
            missing: Vec::new(),
            cpus: Vec::new(),
            histograms: BTreeMap::new(),
            dropped_windows: 0,
            hard_irq_unaccounted: false,
            last_window_at: None,
            schedstat_path: PathBuf::from(OWN_SCHEDSTAT),
        }
    }

    /// The same collector reading its run delay from `path` instead of the
    /// probe thread's own schedstat.
    #[cfg(test)]
    fn with_schedstat_path(mut self, path: PathBuf) -> Self {
        self.schedstat_path = path;
        self
    }

    /// The probe thread's kernel id once it runs (tests read its CPU time).
    #[cfg(test)]
    pub fn probe_tid(&self) -> Option<i32> {
        let state = self.shared.state.lock().expect("not poisoned");
        match &state.setup {
            Some(Ok(setup)) => Some(setup.tid),
            _ => None,
        }
    }

    fn settings(&self, cpus: Vec<usize>) -> Settings {
        let c = &self.config;
        Settings {
            cpus,
            interval_ns: c.interval_us * 1000,
            slice_ns: c.slice_us * 1000,
            gap_threshold_ns: c.gap_threshold_us * 1000,
            window_secs: c.window_secs,
            dwell_ns: c.rotate_ms * 1_000_000,
            budget_ratio: c.cpu_budget_ratio,
            sched_fifo: c.sched_fifo,
            fifo_priority: c.fifo_priority,
            max_gaps: c.max_gaps_per_window,
            stat_path: self.roots.proc("stat"),
            schedstat_path: self.schedstat_path.clone(),
        }
    }

    fn stop(&mut self) {
        self.shared
            .stop
            .store(true, std::sync::atomic::Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            // A probe stuck in a read (a /proc/stat served by FUSE or lxcfs
            // that hangs) must not hold up the agent's stop or a reload.
            if crate::ticks::join_within(thread, PROBE_STOP_WAIT).is_none() {
                tracing::error!(
                    wait_secs = PROBE_STOP_WAIT.as_secs(),
                    "The jitter probe thread did not stop; left behind (stuck in a read?)."
                );
            }
        }
    }

    fn rows(&mut self, windows: &[Window], time_us: i64) -> anyhow::Result<Vec<Batch>> {
        let hz = super::user_hz();
        let mut jitter = BatchBuilder::new(&JITTER);
        let mut gaps = BatchBuilder::new(&GAP);
        for window in windows {
            for c in &window.cpus {
                let cpu = c.cpu.to_string();
                jitter.push_row(window.end_us, &jitter_row(&cpu, c, hz))?;
                let (buckets, sum) = self
                    .histograms
                    .entry(c.cpu)
                    .or_insert(([0; BUCKETS.len() + 1], 0));
                for (total, n) in buckets.iter_mut().zip(c.buckets) {
                    *total += n;
                }
                *sum += c.latency_sum_ns;
            }
            for gap in &window.gaps {
                let row = GapRow {
                    cpu: &gap.cpu.to_string(),
                    gap_seconds: gap.gap_ns as f64 / 1e9,
                };
                gaps.push_row(gap.time_us, &row)?;
            }
        }
        let mut wakeup = BatchBuilder::new(&WAKEUP);
        if !windows.is_empty() {
            let time = windows.last().map_or(time_us, |w| w.end_us);
            for (cpu, (buckets, sum)) in &self.histograms {
                let cpu = cpu.to_string();
                let mut cumulative = 0;
                for (i, n) in buckets.iter().enumerate() {
                    cumulative += n;
                    let (le, latency_seconds_sum) = match BUCKETS.get(i) {
                        Some((_, le)) => (*le, None),
                        None => ("+Inf", Some(*sum as f64 / 1e9)),
                    };
                    let row = WakeupRow {
                        cpu: &cpu,
                        le,
                        latency_seconds: cumulative,
                        latency_seconds_sum,
                    };
                    wakeup.push_row(time, &row)?;
                }
            }
        }
        Ok(vec![jitter.finish(), wakeup.finish(), gaps.finish()])
    }
}

fn jitter_row<'a>(cpu: &'a str, c: &probe::CpuWindow, hz: f64) -> JitterRow<'a> {
    let secs = |ns: u64| ns as f64 / 1e9;
    let has_wakeups = !c.latency.is_empty();
    // The histogram answers with the top of a quantile's bucket (two
    // significant digits), which can lie above the largest wake-up itself,
    // kept exactly: no quantile is above it.
    let quantile = |q: f64| {
        has_wakeups.then(|| secs(c.latency.value_at_quantile(q).min(c.latency_max_ns)))
    };
    let spun = c.spin_ns > 0;
    let share = |ns: u64| {
        if spun {
            ns as f64 / c.spin_ns as f64
        } else {
            0.0
        }
    };
    let probed = c.probed_ns as f64 / 1e9;
    let tick_share = |ticks: u64| {
        if probed > 0.0 {
            (ticks as f64 / hz / probed).min(1.0)
        } else {
            0.0
        }
    };
    let interrupted = share(c.lost_ns);
    let run_delay = c.run_delay_ns.map(share);
    let irq = tick_share(c.irq_ticks);
    let steal = tick_share(c.steal_ticks);
    let unexplained = (interrupted - run_delay.unwrap_or(0.0) - irq - steal).max(0.0);
    let if_spun = |v: f64| spun.then_some(v);
    let if_probed = |v: f64| (probed > 0.0).then_some(v);
    JitterRow {
        cpu,
        wakeups: c.latency.len(),
        wakeup_p50_seconds: quantile(0.5),
        wakeup_p90_seconds: quantile(0.9),
        wakeup_p99_seconds: quantile(0.99),
        wakeup_p999_seconds: quantile(0.999),
        wakeup_p9999_seconds: quantile(0.9999),
        wakeup_max_seconds: has_wakeups.then(|| secs(c.latency_max_ns)),
        stalls_over_50us: c.stalls[0],
        stalls_over_500us: c.stalls[1],
        probed_seconds: probed,
        probe_cpu_seconds: secs(c.thread_cpu_ns),
        spin_seconds: secs(c.spin_ns),
        gaps: c.gaps,
        largest_gap_seconds: if_spun(secs(c.largest_gap_ns)),
        interrupted_ratio: if_spun(interrupted),
        run_delay_ratio: run_delay.filter(|_| spun),
        irq_ratio: if_probed(irq),
        steal_ratio: if_probed(steal),
        busy_ratio: (c.all_ticks > 0)
            .then(|| c.all_ticks.saturating_sub(c.idle_ticks) as f64 / c.all_ticks as f64),
        unexplained_ratio: if_spun(unexplained),
    }
}

impl Drop for Jitter {
    fn drop(&mut self) {
        self.stop();
    }
}

impl Collector for Jitter {
    fn name(&self) -> &'static str {
        "jitter"
    }

    fn probe(&mut self) -> Availability {
        if self.thread.is_none() {
            let allowed = probe::allowed_cpus();
            let cpus: Vec<usize> = if self.config.cpus.is_empty() {
                allowed.clone()
            } else {
                self.missing = self
                    .config
                    .cpus
                    .iter()
                    .copied()
                    .filter(|c| !allowed.contains(c))
                    .collect();
                self.config
                    .cpus
                    .iter()
                    .copied()
                    .filter(|c| allowed.contains(c))
                    .collect()
            };
            if cpus.is_empty() {
                return Availability::Absent(format!(
                    "none of cpus {:?} is one the agent may run on ({})",
                    self.config.cpus,
                    cpu_list(&allowed)
                ));
            }
            let stat = self.roots.proc("stat");
            if let Err(e) = std::fs::metadata(&stat) {
                return Availability::Absent(format!("{}: {e}", stat.display()));
            }
            // Read once: the kernel's accounting does not change while it runs.
            let mut text = Vec::new();
            self.hard_irq_unaccounted = crate::kept::KeptFile::new(stat.clone())
                .read(&mut text)
                .ok()
                .and_then(|len| {
                    procfs::hard_irq_unaccounted(&text[..len], &stat.display().to_string()).ok()
                })
                .unwrap_or(false);
            self.cpus = cpus.clone();
            let settings = self.settings(cpus);
            // A probe again after a failed start: the stopped thread's stop
            // flag and setup error must not reach the new one.
            self.shared = Arc::new(Shared::default());
            let shared = self.shared.clone();
            match std::thread::Builder::new()
                .name(THREAD_NAME.into())
                .spawn(move || probe::run(settings, &shared))
            {
                Ok(thread) => {
                    self.thread = Some(thread);
                    self.last_window_at = None;
                }
                Err(e) => {
                    return Availability::Absent(format!("cannot start the probe thread: {e}"))
                }
            }
        }
        let setup = match probe::wait_setup(&self.shared, SETUP_TIMEOUT) {
            Some(Ok(setup)) => setup,
            Some(Err(e)) => {
                self.stop();
                return Availability::Absent(e);
            }
            None => {
                self.stop();
                return Availability::Absent("the probe thread did not start in time".into());
            }
        };
        let placement = match self.cpus.len() {
            1 => "pinned".to_string(),
            _ => format!("rotating every {} ms", self.config.rotate_ms),
        };
        let slack = match &setup.timer_slack {
            Ok(ns) => format!("timer slack {ns} ns"),
            Err(e) => {
                format!("timer slack not set ({e}): wake-ups late by up to the default 50 µs")
            }
        };
        Availability::Available(format!(
            "wake-up every {} µs{} on CPUs {} ({placement}), {}, {slack}, budget {}% of one core{}",
            self.config.interval_us,
            if self.config.slice_us > 0 {
                format!(", {} µs spins", self.config.slice_us)
            } else {
                String::new()
            },
            cpu_list(&self.cpus),
            setup.policy,
            self.config.cpu_budget_ratio * 100.0,
            if setup.run_delay {
                String::new()
            } else {
                format!("; no {}: run delay unknown", self.schedstat_path.display())
            },
        ))
    }

    /// Carries on each CPU's cumulative latency histogram: the rebuilt
    /// probe would start them from zero, and
    /// `vtax_jitter_wakeup_latency_seconds` would go back on `/metrics`. The
    /// buckets are fixed ([`BUCKETS`]), so the counts add up whatever
    /// settings changed.
    fn take_over(&mut self, previous: Box<dyn Collector>) {
        let Ok(mut previous) = previous.into_any().downcast::<Jitter>() else {
            return;
        };
        self.histograms = std::mem::take(&mut previous.histograms);
    }

    fn collect(&mut self, time_us: i64) -> anyhow::Result<Vec<Batch>> {
        let windows: Vec<Window> = {
            let mut state = self.shared.state.lock().expect("not poisoned");
            self.dropped_windows = state.dropped_windows;
            state.windows.drain(..).collect()
        };
        // A probe thread that closes no window (stuck in a read of
        // /proc/stat, or never scheduled) is a failing collector, not a
        // quiet one whose last window stays on /metrics as if current.
        let now = std::time::Instant::now();
        let last = *self.last_window_at.get_or_insert(now);
        if !windows.is_empty() {
            self.last_window_at = Some(now);
        } else {
            let silent = now.duration_since(last);
            let limit = std::time::Duration::from_secs(2 * self.config.window_secs + 10);
            if silent > limit {
                anyhow::bail!(
                    "the probe thread has closed no window for {} s (windows of {} s): stuck in a read of {}, or not scheduled",
                    silent.as_secs(),
                    self.config.window_secs,
                    self.roots.proc("stat").display()
                );
            }
        }
        if let Some(error) = windows.iter().find_map(|w| w.error.as_ref()) {
            anyhow::bail!("{error}");
        }
        self.rows(&windows, time_us)
    }

    fn problems(&self) -> Vec<String> {
        let mut problems = Vec::new();
        if !self.missing.is_empty() {
            problems.push(format!(
                "cpus {:?} are not CPUs the agent may run on: not probed",
                self.missing
            ));
        }
        if self.dropped_windows > 0 {
            problems.push(format!(
                "{} windows dropped: the collector did not harvest them in time",
                self.dropped_windows
            ));
        }
        if self.hard_irq_unaccounted {
            problems.push(format!(
                "the kernel accounts no hard-IRQ time (the irq column of {} is 0 on every CPU: CONFIG_IRQ_TIME_ACCOUNTING is off): time in interrupt handlers is charged to what they interrupted, so irq_ratio misses it and unexplained_ratio, the tax's share no accounting shows, includes the guest's own interrupt handling",
                self.roots.proc("stat").display()
            ));
        }
        problems
    }

    fn windowed(&self) -> bool {
        true
    }
}

/// "0-3,8" style, for messages.
fn cpu_list(cpus: &[usize]) -> String {
    let mut out = String::new();
    let mut i = 0;
    while i < cpus.len() {
        let start = cpus[i];
        let mut end = start;
        while i + 1 < cpus.len() && cpus[i + 1] == end + 1 {
            i += 1;
            end = cpus[i];
        }
        if !out.is_empty() {
            out.push(',');
        }
        if start == end {
            out.push_str(&start.to_string());
        } else {
            out.push_str(&format!("{start}-{end}"));
        }
        i += 1;
    }
    out
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use vtax_store::batch::Values;

    use super::*;

    /// Dwells of a tenth of a second: with the default dwell of a whole
    /// window, the rotation and the window boundaries stay nearly in phase,
    /// and a window can hold a CPU visited for a few milliseconds only, so
    /// [`harvest`]'s "every CPU" test would wait on the phase drifting.
    fn config(window_secs: u64) -> JitterConfig {
        JitterConfig {
            window_secs,
            rotate_ms: 100,
            ..JitterConfig::default()
        }
    }

    /// Collects until a window that covers at least `min_wakeups` wake-ups
    /// on every CPU it has, or panics after `timeout`.
    fn harvest(jitter: &mut Jitter, min_wakeups: u64, timeout: Duration) -> Vec<Batch> {
        let deadline = Instant::now() + timeout;
        loop {
            let batches = jitter.collect(0).unwrap();
            let rows = &batches[0];
            let full = !rows.is_empty()
                && (0..rows.len()).all(|r| u64_at(rows, "wakeups", r) >= min_wakeups);
            if full {
                return batches;
            }
            assert!(Instant::now() < deadline, "no full window in {timeout:?}");
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn column<'a>(batch: &'a Batch, name: &str) -> &'a vtax_store::batch::FieldColumn {
        &batch.fields[batch.table.field_index(name).unwrap()]
    }

    fn f64_at(batch: &Batch, name: &str, row: usize) -> Option<f64> {
        let c = column(batch, name);
        match &c.values {
            Values::F64(v) if c.is_valid(row) => Some(v[row]),
            _ => None,
        }
    }

    fn u64_at(batch: &Batch, name: &str, row: usize) -> u64 {
        match &column(batch, name).values {
            Values::U64(v) => v[row],
            _ => panic!("{name} is not u64"),
        }
    }

    fn tag_at(batch: &Batch, tag: usize, row: usize) -> &str {
        &batch.tags[tag].dict[batch.tags[tag].codes[row] as usize]
    }

    fn roots() -> Roots {
        Roots::default()
    }

    #[test]
    fn the_probes_measure_this_machine_on_every_cpu_in_turn() {
        let mut jitter = Jitter::new(
            &JitterConfig {
                max_gaps_per_window: 4,
                // Five times the default budget: under a loaded test run the
                // wake-ups alone can take most of 1%, leaving spins too short
                // to be sure of crossing a timer tick.
                cpu_budget_ratio: 0.05,
                ..config(1)
            },
            &roots(),
        );
        let Availability::Available(found) = jitter.probe() else {
            panic!("the probe runs here");
        };
        assert!(found.contains("SCHED_OTHER"), "{found}");
        let batches = harvest(&mut jitter, 20, Duration::from_secs(20));
        let rows = &batches[0];
        let allowed = probe::allowed_cpus();
        if allowed.len() <= 8 {
            // 100 ms per CPU in a 1 s window reaches each of up to 10 CPUs.
            assert_eq!(rows.len(), allowed.len(), "a row per CPU");
        }
        for r in 0..rows.len() {
            let q = |n| f64_at(rows, n, r).unwrap();
            let (p50, p90, p99) = (
                q("wakeup_p50_seconds"),
                q("wakeup_p90_seconds"),
                q("wakeup_p99_seconds"),
            );
            let (p999, p9999, max) = (
                q("wakeup_p999_seconds"),
                q("wakeup_p9999_seconds"),
                q("wakeup_max_seconds"),
            );
            assert!(p50 > 0.0, "a wake-up is never early: {p50}");
            assert!(
                p50 <= p90 && p90 <= p99 && p99 <= p999 && p999 <= p9999 && p9999 <= max * 1.01,
                "ordered: {p50} {p90} {p99} {p999} {p9999} {max}"
            );
            assert!(max < 1.0, "a wake-up a second late on an idle CPU: {max}");
            assert!(q("probed_seconds") > 0.0 && q("probed_seconds") <= 1.01);
            assert!(q("spin_seconds") > 0.0, "the interruption probe spun");
            let interrupted = q("interrupted_ratio");
            assert!((0.0..=1.0).contains(&interrupted), "{interrupted}");
            assert!(q("unexplained_ratio") <= interrupted);
            let busy = q("busy_ratio");
            assert!((0.0..=1.0).contains(&busy), "{busy}");
            assert!(u64_at(rows, "stalls_over_500us", r) <= u64_at(rows, "stalls_over_50us", r));
        }
        // Gaps: above the threshold, at most max_gaps_per_window per window.
        let gaps = &batches[2];
        let mut windows = rows.time_us.clone();
        windows.dedup();
        assert!(gaps.len() <= 4 * windows.len(), "{} gaps", gaps.len());
        for r in 0..gaps.len() {
            assert!(f64_at(gaps, "gap_seconds", r).unwrap() > 1e-6);
        }
        // Spinning on a CPU that is not isolated (nohz_full) crosses timer
        // ticks; the first window may be a short one, so a few more windows
        // are read before concluding the spin sees nothing.
        let gaps_in = |rows: &Batch| {
            (0..rows.len())
                .map(|r| u64_at(rows, "gaps", r))
                .sum::<u64>()
        };
        let mut seen = gaps_in(rows);
        for _ in 0..5 {
            if seen > 0 {
                break;
            }
            seen += gaps_in(&harvest(&mut jitter, 20, Duration::from_secs(20))[0]);
        }
        assert!(seen > 0, "no interruption seen in six windows of spinning");
        // The histogram's +Inf count is every wake-up harvested so far.
        let hist = &batches[1];
        let total: u64 = (0..hist.len())
            .filter(|&r| tag_at(hist, 1, r) == "+Inf")
            .map(|r| u64_at(hist, "latency_seconds", r))
            .sum();
        let wakeups: u64 = (0..rows.len()).map(|r| u64_at(rows, "wakeups", r)).sum();
        assert!(total >= wakeups && total > 0, "{total} < {wakeups}");
        for r in 1..hist.len() {
            if tag_at(hist, 0, r) == tag_at(hist, 0, r - 1) {
                assert!(
                    u64_at(hist, "latency_seconds", r) >= u64_at(hist, "latency_seconds", r - 1),
                    "cumulative"
                );
            }
        }

        // Rendered as /metrics serves it, promtool accepts it.
        let exposition = vtax_exporters::Exposition::new(TABLES);
        exposition.update("jitter", batches.into_iter().map(Arc::new).collect());
        let text = exposition.body(vtax_exporters::Format::Text, false);
        let text = String::from_utf8(text.to_vec()).unwrap();
        assert!(
            text.contains("vtax_jitter_wakeup_latency_seconds_bucket{cpu=\""),
            "{text}"
        );
        assert!(
            text.contains("vtax_jitter_wakeup_p99_seconds{cpu=\""),
            "{text}"
        );
        assert!(!text.contains("vtax_jitter_gap_"), "gaps are not series");
        assert_eq!(vtax_tests::promtool_complaints(&text), "");
    }

    /// CPU time of a thread of this process, read from outside it
    /// (`/proc/self/task/<tid>/schedstat`, first field: nanoseconds on CPU).
    fn task_cpu_ns(tid: i32) -> u64 {
        let text = std::fs::read_to_string(format!("/proc/self/task/{tid}/schedstat")).unwrap();
        text.split_whitespace().next().unwrap().parse().unwrap()
    }

    fn measured_share(budget: f64, secs: u64) -> f64 {
        let mut jitter = Jitter::new(
            &JitterConfig {
                cpu_budget_ratio: budget,
                // The shipped dwell: each dwell's end reads /proc/stat and
                // moves the thread, which the budget pays for too.
                rotate_ms: DEFAULT_ROTATE_MS,
                ..config(1)
            },
            &roots(),
        );
        assert!(matches!(jitter.probe(), Availability::Available(_)));
        let tid = jitter.probe_tid().unwrap();
        // Past the start-up (thread creation, first reads).
        std::thread::sleep(Duration::from_millis(500));
        let (cpu0, t0) = (task_cpu_ns(tid), Instant::now());
        std::thread::sleep(Duration::from_secs(secs));
        let (cpu1, t1) = (task_cpu_ns(tid), Instant::now());
        (cpu1 - cpu0) as f64 / (t1 - t0).as_nanos() as f64
    }

    #[test]
    fn the_probes_keep_to_their_cpu_budget() {
        // The default 1%: the spins fill it, and the thread stays within.
        let share = measured_share(0.01, 3);
        assert!(
            share <= 0.0125,
            "used {:.3}% of a core for a 1% budget",
            share * 100.0
        );
        assert!(
            share >= 0.002,
            "the probe barely ran: {:.3}%",
            share * 100.0
        );
        // A budget below what wake-ups every millisecond cost alone: the
        // probe skips deadlines rather than exceed it.
        let share = measured_share(0.001, 3);
        assert!(
            share <= 0.0015,
            "used {:.3}% of a core for a 0.1% budget",
            share * 100.0
        );
    }

    #[test]
    fn the_thread_ends_when_the_collector_is_dropped() {
        let mut jitter = Jitter::new(&config(10), &roots());
        assert!(matches!(jitter.probe(), Availability::Available(_)));
        let tid = jitter.probe_tid().unwrap();
        let task = format!("/proc/self/task/{tid}");
        assert_eq!(
            std::fs::read_to_string(format!("{task}/comm"))
                .unwrap()
                .trim(),
            THREAD_NAME
        );
        let started = Instant::now();
        drop(jitter);
        // `join` returns once the thread has run its last line; the kernel
        // releases the task a moment later, longer on a loaded machine.
        while std::path::Path::new(&task).exists() && started.elapsed() < Duration::from_secs(10) {
            std::thread::sleep(Duration::from_millis(5));
        }
        assert!(
            !std::path::Path::new(&task).exists(),
            "the probe thread is gone"
        );
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "stopped promptly"
        );
    }

    #[test]
    fn sched_fifo_when_permitted_and_the_probe_says_which() {
        let mut jitter = Jitter::new(
            &JitterConfig {
                sched_fifo: true,
                fifo_priority: 3,
                cpus: vec![*probe::allowed_cpus().last().unwrap()],
                ..config(10)
            },
            &roots(),
        );
        let Availability::Available(found) = jitter.probe() else {
            panic!("the probe runs here");
        };
        let tid = jitter.probe_tid().unwrap();
        // SAFETY: querying a thread of this process.
        let policy = unsafe { libc::sched_getscheduler(tid) };
        if policy == libc::SCHED_FIFO {
            assert!(found.contains("SCHED_FIFO priority 3"), "{found}");
        } else {
            assert_eq!(policy, libc::SCHED_OTHER);
            assert!(
                found.contains("SCHED_OTHER (SCHED_FIFO refused: "),
                "{found}"
            );
        }
        assert!(found.contains("(pinned)"), "{found}");
    }

    /// A reload that changes the jitter settings rebuilds the collector; its
    /// histogram counts carry on, so no bucket goes back on `/metrics`.
    #[test]
    fn a_rebuilt_collector_carries_on_its_histograms() {
        let plus_inf = |batches: &[Batch]| -> u64 {
            let hist = &batches[1];
            (0..hist.len())
                .filter(|&r| tag_at(hist, 1, r) == "+Inf")
                .map(|r| u64_at(hist, "latency_seconds", r))
                .sum()
        };
        let mut old = Jitter::new(&config(1), &roots());
        assert!(matches!(old.probe(), Availability::Available(_)));
        let before = plus_inf(&harvest(&mut old, 20, Duration::from_secs(20)));
        assert!(before > 0);
        let mut new = Jitter::new(
            &JitterConfig {
                interval_us: 5_000,
                ..config(1)
            },
            &roots(),
        );
        let carried = old.histograms.clone();
        new.take_over(Box::new(old));
        assert_eq!(new.histograms, carried);
        assert!(matches!(new.probe(), Availability::Available(_)));
        let after = plus_inf(&harvest(&mut new, 20, Duration::from_secs(20)));
        assert!(after > before, "{after} after a rebuild, {before} before");
    }

    /// The probe measures the platform's lateness, not the default 50 µs
    /// timer slack a SCHED_OTHER thread's sleeps are allowed to add.
    #[test]
    fn the_probe_thread_sleeps_with_a_timer_slack_of_one_nanosecond() {
        let mut jitter = Jitter::new(&config(10), &roots());
        let Availability::Available(found) = jitter.probe() else {
            panic!("the probe runs here");
        };
        assert!(found.contains("timer slack 1 ns"), "{found}");
        let tid = jitter.probe_tid().unwrap();
        // Reading another thread's slack needs CAP_SYS_NICE (CI runs as
        // root); where refused, the probe's own report above stands.
        match std::fs::read_to_string(format!("/proc/{tid}/timerslack_ns")) {
            Ok(slack) => assert_eq!(slack.trim(), "1"),
            Err(e) => assert_eq!(e.kind(), std::io::ErrorKind::PermissionDenied, "{e}"),
        }
    }

    /// A procfs root in a tempdir with only `stat`.
    fn fake_proc(stat: &str) -> (tempfile::TempDir, Roots) {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("stat"), stat).unwrap();
        let roots = Roots {
            procfs: dir.path().to_path_buf(),
            sysfs: dir.path().to_path_buf(),
            ..Roots::default()
        };
        (dir, roots)
    }

    /// A collector on CPU `allowed_cpus()[0]` with one-second windows.
    fn pinned(roots: &Roots) -> Jitter {
        Jitter::new(
            &JitterConfig {
                cpus: vec![probe::allowed_cpus()[0]],
                ..config(1)
            },
            roots,
        )
    }

    fn first_error(jitter: &mut Jitter) -> String {
        assert!(matches!(jitter.probe(), Availability::Available(_)));
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Err(e) = jitter.collect(0) {
                return format!("{e:#}");
            }
            assert!(Instant::now() < deadline, "no error reported");
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    const GOOD_STAT: &str = "cpu  1 1 1 1 1 1 1 1 0 0\ncpu0 1 1 1 1 1 1 1 1 0 0\n";

    #[test]
    fn garbage_stat_or_schedstat_is_an_error_naming_the_file() {
        let (dir, roots) = fake_proc("cpu0 1 2 3 4 5 six 7 8\n");
        let err = first_error(&mut Jitter::new(&config(1), &roots));
        let path = dir.path().join("stat");
        assert_eq!(
            err,
            format!("{}:1: \"six\" is not a tick count", path.display())
        );

        let (dir, roots) = fake_proc(GOOD_STAT);
        let schedstat = dir.path().join("schedstat");
        std::fs::write(&schedstat, "1 lots 3\n").unwrap();
        let err = first_error(
            &mut Jitter::new(&config(1), &roots).with_schedstat_path(schedstat.clone()),
        );
        assert_eq!(
            err,
            format!(
                "{}:1: \"lots\" is not a run delay in nanoseconds",
                schedstat.display()
            )
        );
    }

    /// `--path.procfs` names the host's procfs, which in a container or a
    /// fixture tree has no `thread-self` of the agent's: the probe reads its
    /// own thread's run delay from the agent's `/proc` all the same.
    #[test]
    fn run_delay_is_measured_when_procfs_is_a_fixture_tree() {
        let fixture = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../tests/fixtures/baremetal-node"
        );
        let roots = Roots {
            procfs: PathBuf::from(fixture).join("proc"),
            sysfs: PathBuf::from(fixture).join("sys"),
            ..Roots::default()
        };
        assert!(
            !roots.proc("thread-self").exists(),
            "the fixture has no thread-self"
        );
        let mut jitter = pinned(&roots);
        let Availability::Available(found) = jitter.probe() else {
            panic!("the probe runs on the fixture");
        };
        assert!(!found.contains("run delay unknown"), "{found}");
        let batches = harvest(&mut jitter, 20, Duration::from_secs(20));
        let run_delay = f64_at(&batches[0], "run_delay_ratio", 0);
        assert!(
            run_delay.is_some_and(|r| (0.0..=1.0).contains(&r)),
            "run_delay_ratio {run_delay:?}"
        );
    }

    #[test]
    fn without_schedstat_run_delay_is_null_and_the_rest_measures() {
        let (dir, roots) = fake_proc(GOOD_STAT);
        let missing = dir.path().join("thread-self/schedstat");
        let mut jitter = pinned(&roots).with_schedstat_path(missing.clone());
        let Availability::Available(found) = jitter.probe() else {
            panic!("runs without schedstat");
        };
        assert!(
            found.contains(&format!("no {}: run delay unknown", missing.display())),
            "{found}"
        );
        let batches = harvest(&mut jitter, 20, Duration::from_secs(20));
        assert_eq!(f64_at(&batches[0], "run_delay_ratio", 0), None);
        assert!(f64_at(&batches[0], "interrupted_ratio", 0).is_some());
        // The fake /proc/stat never moves: how busy the CPU was is unknown,
        // not 0 or 1.
        assert_eq!(f64_at(&batches[0], "busy_ratio", 0), None);
    }

    /// busy_ratio is the share of the CPU's ticks, while probed, that were
    /// neither idle nor iowait.
    #[test]
    fn busy_ratio_is_the_share_of_ticks_not_idle() {
        let mut window = probe::CpuWindow::new(3, false);
        window.probed_ns = 5_000_000_000;
        let row = |w: &probe::CpuWindow| jitter_row("3", w, 100.0).busy_ratio;
        assert_eq!(row(&window), None, "no ticks seen");
        window.all_ticks = 500;
        window.idle_ticks = 495;
        assert_eq!(row(&window), Some(0.01));
        window.idle_ticks = 0;
        assert_eq!(row(&window), Some(1.0));
    }

    /// A CPU that another thread keeps running reads busy: the regime in
    /// which the spins meet what a thread running throughout meets.
    #[test]
    fn a_cpu_another_thread_keeps_running_reads_busy() {
        use std::sync::atomic::{AtomicBool, Ordering};
        let cpu = *probe::allowed_cpus().last().unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let spinner = {
            let stop = stop.clone();
            std::thread::spawn(move || {
                probe::pin(cpu).unwrap();
                while !stop.load(Ordering::Relaxed) {
                    std::hint::spin_loop();
                }
            })
        };
        let mut jitter = Jitter::new(
            &JitterConfig {
                cpus: vec![cpu],
                ..config(1)
            },
            &roots(),
        );
        assert!(matches!(jitter.probe(), Availability::Available(_)));
        let batches = harvest(&mut jitter, 20, Duration::from_secs(20));
        stop.store(true, Ordering::Relaxed);
        spinner.join().unwrap();
        let busy = f64_at(&batches[0], "busy_ratio", 0);
        assert!(busy.is_some_and(|b| b > 0.9), "busy_ratio {busy:?}");
    }

    #[test]
    fn cpus_the_agent_cannot_use_are_absent_or_a_problem() {
        let far = libc::CPU_SETSIZE as usize - 1;
        let mut jitter = Jitter::new(
            &JitterConfig {
                cpus: vec![far],
                ..config(10)
            },
            &roots(),
        );
        match jitter.probe() {
            Availability::Absent(reason) => assert!(
                reason.contains(&format!("none of cpus [{far}]")),
                "{reason}"
            ),
            other => panic!("{other:?}"),
        }
        let mut jitter = Jitter::new(
            &JitterConfig {
                cpus: vec![probe::allowed_cpus()[0], far],
                ..config(10)
            },
            &roots(),
        );
        assert!(matches!(jitter.probe(), Availability::Available(_)));
        assert!(
            jitter.problems()[0].contains(&format!("[{far}]")),
            "{:?}",
            jitter.problems()
        );
    }

    #[test]
    fn cpu_lists_read_like_the_kernels() {
        assert_eq!(cpu_list(&[0, 1, 2, 3, 8, 10, 11]), "0-3,8,10-11");
        assert_eq!(cpu_list(&[5]), "5");
    }

    /// A probe thread that closes no window for two windows and more (stuck
    /// in a read of a /proc/stat served by FUSE, say) fails the collector:
    /// its last window no longer stands on /metrics as if current.
    #[test]
    fn a_probe_that_closes_no_window_fails_the_collector() {
        let config = JitterConfig {
            window_secs: 1,
            ..JitterConfig::default()
        };
        let mut jitter = Jitter::new(&config, &Roots::default());
        assert!(jitter.collect(1).unwrap().iter().all(|b| b.is_empty()));
        jitter.last_window_at = Some(Instant::now() - Duration::from_secs(11));
        assert!(jitter.collect(2).is_ok(), "two windows and ten seconds of slack");
        jitter.last_window_at = Some(Instant::now() - Duration::from_secs(13));
        let error = jitter.collect(3).unwrap_err().to_string();
        assert!(error.contains("closed no window for 13 s"), "{error}");
    }

    /// The largest wake-up is exact, past the histogram's old 10 s reach too,
    /// and no quantile is above it: the histogram's bucket tops (two
    /// significant digits) lie above the largest wake-up itself.
    #[test]
    fn quantiles_never_exceed_the_exact_largest_wake_up() {
        let mut window = probe::CpuWindow::new(0, false);
        for _ in 0..98 {
            window.record_wakeup(50_000);
        }
        window.record_wakeup(17_877_991);
        window.record_wakeup(17_877_991);
        let row = jitter_row("0", &window, 100.0);
        assert_eq!(row.wakeup_max_seconds, Some(0.017_877_991));
        assert_eq!(row.wakeup_p99_seconds, Some(0.017_877_991));
        assert!(row.wakeup_p50_seconds.unwrap() < 0.000_051);

        window.record_wakeup(45_000_000_000);
        let row = jitter_row("0", &window, 100.0);
        assert_eq!(row.wakeup_max_seconds, Some(45.0));
        assert!(row.wakeup_p9999_seconds.unwrap() <= 45.0);
    }
}
