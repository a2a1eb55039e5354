//! Noisy-neighbour detection and the platform verdict.
//!
//! The detector reads every batch the collectors produce (on the main thread,
//! as the store does), turns them into per-second victim signals (stall and
//! delay ratios, jitter tails, a cache canary, per-cgroup CPI and cache misses
//! per instruction where the PMU is there, GPU clock and activity losses,
//! InfiniBand congestion) and per-second usage of every suspect (leaf
//! cgroups, GPU processes). Each window (default 5 s) it judges each signal's
//! mean against a robust baseline (median and MAD of its past windows) or,
//! where healthy is zero, against a fixed threshold. An event opens after
//! `open_windows` abnormal windows in a row and closes after `close_windows`
//! normal ones; between the two thresholds nothing changes, so one blip is
//! not an event and one quiet window does not end one. While an event is
//! open the suspects are ranked by how their usage moved with the signal.

pub mod baseline;
pub mod canary;
pub mod rank;
pub mod replay;
pub mod restore;
pub mod tables;
pub mod verdict;
pub mod view;

#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};

use serde::{Deserialize, Serialize};
use vtax_store::{Batch, BatchBuilder};

use crate::collectors::cgroups::leaves;
use baseline::RollingBaseline;
use rank::Suspect;
use verdict::{Facts, GpuFacts};
use view::View;

/// Seconds per judged window.
pub const DEFAULT_WINDOW_SECS: u64 = 5;
/// Abnormal windows in a row that open an event (15 s at the default window).
pub const DEFAULT_OPEN_WINDOWS: u32 = 3;
/// Normal windows in a row that close one.
pub const DEFAULT_CLOSE_WINDOWS: u32 = 6;
/// Windows a baseline remembers (30 minutes at the default window).
pub const DEFAULT_BASELINE_WINDOWS: u64 = 360;
/// Windows a baseline needs before it can open an event.
pub const DEFAULT_MIN_BASELINE_WINDOWS: u64 = 12;
/// Abnormal windows in a row after which a baseline learns them too: a
/// level that held for 15 minutes is the new normal; a shorter burst is
/// not learned, so bursts do not widen the baseline they are judged by.
pub const DEFAULT_LEARN_ABNORMAL_AFTER_WINDOWS: u32 = 180;
/// Robust z at which a window counts as abnormal.
pub const DEFAULT_Z_OPEN: f64 = 4.0;
/// Robust z below which a window counts as normal again.
pub const DEFAULT_Z_CLOSE: f64 = 2.0;
/// Seconds of per-second history the suspects are ranked over.
pub const DEFAULT_LOOKBACK_SECS: u64 = 90;
/// Seconds after a window ends before it is judged: collectors tick on whole
/// seconds and their rows reach the main thread within its 250 ms tick.
const WINDOW_GRACE_SECS: i64 = 2;
/// Seconds before an event's first abnormal window that its suspects are
/// ranked over: enough quiet seconds to see who changed at the onset, few
/// enough that a neighbour who came and went a minute earlier is not in them.
const PRE_ONSET_SECS: i64 = 30;
/// Instructions per second under which a cgroup's CPI and cache misses per
/// instruction are not sampled: a tenth of a core at one instruction per
/// cycle at 1 GHz. An idle cgroup's few instructions are wake-ups on cold
/// caches, whose CPI swings by multiples from second to second.
const PMU_MIN_INSTRUCTIONS_PER_SECOND: f64 = 1e8;
/// Suspects ranked per event in `/metrics`.
const SUSPECTS_EXPORTED: usize = 3;
/// Suspects listed in an event's row.
const SUSPECTS_STORED: usize = 5;
/// The suspect that stands for the hypervisor in CPU rankings. Its usage is
/// the guest's steal time in CPUs: time the host gave our vCPUs' physical
/// cores to someone else, counted by the guest kernel itself.
pub const HYPERVISOR_SUSPECT: &str = "hypervisor";
/// The suspect that stands for CPU time the guest spends outside every leaf
/// workload cgroup (processes in the root cgroup, kernel threads): the node's
/// busy CPUs less what the leaf cgroups used. Named, it says the guest cannot
/// tell whose load it is, rather than blaming the host or a bystander.
pub const OUTSIDE_SUSPECT: &str = "unattributed: load outside any workload cgroup";
/// Share of the node's CPU time the host must steal, over the seconds the
/// steal was high, before the hypervisor is named: the operator takes that
/// accusation to the cloud provider, and a guest loaded by itself sees a
/// little steal rise with its own load on almost any VM.
pub const MIN_HYPERVISOR_STEAL_RATIO: f64 = 0.01;
/// Share of a CPU signal's rise that the steal's rise must match before the
/// hypervisor is named for it: the steal must carry a material part of what
/// the victim lost, not only move with it.
const MIN_HYPERVISOR_SHARE: f64 = 0.25;

/// `[detect]`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DetectConfig {
    /// Whether the detector runs.
    pub enabled: bool,
    /// Seconds per judged window.
    pub window_secs: u64,
    /// Abnormal windows in a row that open an event.
    pub open_windows: u32,
    /// Normal windows in a row that close an event.
    pub close_windows: u32,
    /// Windows each baseline remembers.
    pub baseline_windows: u64,
    /// Windows a baseline needs before it judges.
    pub min_baseline_windows: u64,
    /// Abnormal windows in a row after which the baseline learns them too.
    pub learn_abnormal_after_windows: u32,
    /// Robust z that makes a window abnormal.
    pub z_open: f64,
    /// Robust z under which a window is normal.
    pub z_close: f64,
    /// Seconds of history the suspects are ranked over.
    pub lookback_secs: u64,
    /// Whether the cache canary runs (the memory signal where the PMU is hidden).
    pub cache_canary: bool,
}

impl Default for DetectConfig {
    fn default() -> Self {
        DetectConfig {
            enabled: true,
            window_secs: DEFAULT_WINDOW_SECS,
            open_windows: DEFAULT_OPEN_WINDOWS,
            close_windows: DEFAULT_CLOSE_WINDOWS,
            baseline_windows: DEFAULT_BASELINE_WINDOWS,
            min_baseline_windows: DEFAULT_MIN_BASELINE_WINDOWS,
            learn_abnormal_after_windows: DEFAULT_LEARN_ABNORMAL_AFTER_WINDOWS,
            z_open: DEFAULT_Z_OPEN,
            z_close: DEFAULT_Z_CLOSE,
            lookback_secs: DEFAULT_LOOKBACK_SECS,
            cache_canary: true,
        }
    }
}

impl DetectConfig {
    /// Checks what the types cannot; on failure the key and the message.
    pub fn validate(&self) -> Result<(), (String, String)> {
        let fail = |key: &str, message: String| Err((format!("detect.{key}"), message));
        if !(1..=300).contains(&self.window_secs) {
            return fail(
                "window_secs",
                format!(
                    "detect.window_secs = {}: must be 1 to 300",
                    self.window_secs
                ),
            );
        }
        if self.learn_abnormal_after_windows == 0 {
            return fail(
                "learn_abnormal_after_windows",
                "detect.learn_abnormal_after_windows must be at least 1 (1: learn every window)"
                    .into(),
            );
        }
        if self.open_windows == 0 || self.close_windows == 0 {
            return fail(
                "open_windows",
                "detect.open_windows and detect.close_windows must be at least 1".into(),
            );
        }
        if self.min_baseline_windows < 3 || self.baseline_windows < self.min_baseline_windows {
            return fail(
                "baseline_windows",
                format!(
                    "detect.baseline_windows = {} must be at least detect.min_baseline_windows = {}, which must be at least 3",
                    self.baseline_windows, self.min_baseline_windows
                ),
            );
        }
        if !(self.z_close.is_finite()
            && self.z_open.is_finite()
            && 0.0 < self.z_close
            && self.z_close < self.z_open)
        {
            return fail(
                "z_open",
                format!(
                    "detect.z_close = {} must be above 0 and below detect.z_open = {}",
                    self.z_close, self.z_open
                ),
            );
        }
        if self.lookback_secs < self.window_secs * u64::from(self.open_windows) {
            return fail(
                "lookback_secs",
                format!(
                    "detect.lookback_secs = {} must cover the windows that open an event ({} s)",
                    self.lookback_secs,
                    self.window_secs * u64::from(self.open_windows)
                ),
            );
        }
        Ok(())
    }
}

/// Ranges of the numeric keys of `[detect]`: the baselines and the history
/// are held in memory, so their lengths are bounded.
pub const KEY_RANGES: crate::config::KeyRanges = &[
    ("window_secs", crate::config::KeyRange::between(1.0, 300.0)),
    (
        "open_windows",
        crate::config::KeyRange::between(1.0, 1000.0),
    ),
    (
        "close_windows",
        crate::config::KeyRange::between(1.0, 1000.0),
    ),
    (
        "baseline_windows",
        crate::config::KeyRange::between(3.0, 100_000.0),
    ),
    (
        "min_baseline_windows",
        crate::config::KeyRange::between(3.0, 100_000.0),
    ),
    (
        "learn_abnormal_after_windows",
        crate::config::KeyRange::between(1.0, 1_000_000.0),
    ),
    ("z_open", crate::config::KeyRange::above(0.0, 1000.0)),
    ("z_close", crate::config::KeyRange::above(0.0, 1000.0)),
    (
        "lookback_secs",
        crate::config::KeyRange::between(1.0, 86_400.0),
    ),
];

/// Comments for the example config.
pub const KEY_DOCS: &[(&str, &str)] = &[
    ("detect.enabled", "Whether the noisy-neighbour detector and the platform verdict run."),
    ("detect.window_secs", "Seconds per judged window: each signal's mean over a window is compared with its baseline."),
    ("detect.open_windows", "Abnormal windows in a row that open an event: one blip is not an event."),
    ("detect.close_windows", "Normal windows in a row that close an event (hysteresis)."),
    ("detect.baseline_windows", "Windows each signal's baseline (median and MAD) remembers; relearned from the store after a restart."),
    ("detect.min_baseline_windows", "Windows a baseline needs before it can open an event."),
    ("detect.learn_abnormal_after_windows", "Abnormal windows in a row after which the baseline learns them too (the new normal); shorter bursts are not learned, so a neighbour that comes and goes does not widen the baseline it is judged by. 1 learns every window."),
    ("detect.z_open", "Robust z (distance from the median in MAD-derived standard deviations) that makes a window abnormal."),
    ("detect.z_close", "Robust z under which a window counts as normal again."),
    ("detect.lookback_secs", "Seconds of per-second history over which suspects' usage is correlated with the victim signal."),
    ("detect.cache_canary", "Run the cache canary, a 512 KiB pointer chase once a second (0.3 ms of CPU, 512 KiB of resident memory): the memory-interference signal where the PMU is hidden."),
];

/// A resource a neighbour can take.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Resource {
    Cpu,
    Memory,
    Io,
    Gpu,
    Network,
}

impl Resource {
    pub const ALL: [Resource; 5] = [
        Resource::Cpu,
        Resource::Memory,
        Resource::Io,
        Resource::Gpu,
        Resource::Network,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Resource::Cpu => "cpu",
            Resource::Memory => "memory",
            Resource::Io => "io",
            Resource::Gpu => "gpu",
            Resource::Network => "network",
        }
    }

    pub fn parse(name: &str) -> Option<Resource> {
        Resource::ALL.into_iter().find(|r| r.name() == name)
    }

    /// A suspect usage change that counts as material when ranking: CPUs for
    /// cgroups, SM share for GPU processes.
    fn usage_scale(self) -> f64 {
        0.05
    }
}

/// How a signal is judged.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Rule {
    /// Against its learned baseline: abnormal at `z_open` and at least
    /// `min_change` above the median, and at least `min_relative_change`
    /// times the median above it (a latency tail is judged by how many times
    /// it grew: milliseconds of spread are noise on a tail of milliseconds);
    /// `z_floor` bounds the scale from below so that a flat baseline does
    /// not make noise look infinite.
    Baseline {
        min_change: f64,
        min_relative_change: f64,
        z_floor: f64,
    },
    /// Healthy is zero: abnormal above `threshold`, whatever was learned
    /// (a baseline would learn a link that was always trained down as normal).
    Above { threshold: f64 },
}

/// A victim signal's declaration.
#[derive(Debug)]
pub struct Spec {
    pub resource: Resource,
    pub signal: &'static str,
    pub rule: Rule,
    pub help: &'static str,
    /// Only something outside the guest can cause it (steal, the time the
    /// guest cannot explain): the hypervisor is its one suspect, and a
    /// workload of the guest that happened to move with it is not named.
    pub outside_guest: bool,
    /// A window's value is the median of its seconds, not their mean: for a
    /// latency sampled once a second, where one second the host preempted
    /// says nothing of the four around it.
    pub median_of_seconds: bool,
}

impl Spec {
    const fn outside_guest(self) -> Spec {
        Spec {
            outside_guest: true,
            ..self
        }
    }

    const fn median_of_seconds(self) -> Spec {
        Spec {
            median_of_seconds: true,
            ..self
        }
    }
}

const fn baseline(
    resource: Resource,
    signal: &'static str,
    min_change: f64,
    z_floor: f64,
    help: &'static str,
) -> Spec {
    relative_baseline(resource, signal, min_change, 0.0, z_floor, help)
}

const fn relative_baseline(
    resource: Resource,
    signal: &'static str,
    min_change: f64,
    min_relative_change: f64,
    z_floor: f64,
    help: &'static str,
) -> Spec {
    Spec {
        resource,
        signal,
        rule: Rule::Baseline {
            min_change,
            min_relative_change,
            z_floor,
        },
        help,
        outside_guest: false,
        median_of_seconds: false,
    }
}

const fn above(
    resource: Resource,
    signal: &'static str,
    threshold: f64,
    help: &'static str,
) -> Spec {
    Spec {
        resource,
        signal,
        rule: Rule::Above { threshold },
        help,
        outside_guest: false,
        median_of_seconds: false,
    }
}

/// Every victim signal. The thresholds are where a workload notices: 5% of a
/// CPU's time stalled, a wake-up tail 200 µs longer and twice as long, 10 ns
/// more per cache load.
pub static SPECS: &[Spec] = &[
    baseline(
        Resource::Cpu,
        "steal_ratio",
        0.05,
        0.01,
        "CPU time stolen by the hypervisor, mean over CPUs (node).",
    )
    .outside_guest(),
    baseline(
        Resource::Cpu,
        "run_delay_ratio",
        0.05,
        0.01,
        "Time runnable tasks waited for a CPU, per CPU (node, /proc/schedstat).",
    ),
    baseline(
        Resource::Cpu,
        "pressure_some_ratio",
        0.05,
        0.01,
        "CPU pressure: share of time some task waited for a CPU (node and each workload cgroup).",
    ),
    baseline(
        Resource::Cpu,
        "cpi",
        0.2,
        0.05,
        "Cycles per instruction of a workload cgroup, from the PMU (the CPI² method: a neighbour taking caches and memory bandwidth makes each instruction cost more cycles).",
    ),
    // A wake-up tail is judged by how many times it grew: under SCHED_OTHER
    // on a VM it is milliseconds, and moves by milliseconds with nothing
    // wrong; on bare metal under SCHED_FIFO it is tens of microseconds, and
    // the absolute floor decides.
    relative_baseline(
        Resource::Cpu,
        "jitter_p99_seconds",
        200e-6,
        1.0,
        50e-6,
        "Worst CPU's 99th percentile wake-up latency (jitter probe).",
    ),
    // On its default budget the probe spins about 30 ms of each CPU's share
    // of a window, so one 1 ms preemption by the host inside a spin moves
    // that CPU's share by 3 points (on this project's 2-vCPU VM, the node's
    // mean by 1.7), and the 3 ms ones that come in one window in ten there
    // by 5: a change the probe can tell from chance is several of them.
    baseline(
        Resource::Cpu,
        "jitter_unexplained_ratio",
        0.05,
        0.005,
        "Interrupted time the guest cannot explain (jitter probe).",
    )
    .outside_guest(),
    baseline(
        Resource::Memory,
        "pressure_some_ratio",
        0.05,
        0.01,
        "Memory pressure (node and each workload cgroup).",
    ),
    baseline(
        Resource::Memory,
        "cache_latency_seconds",
        10e-9,
        1e-9,
        "Cache canary: seconds per dependent load over a 512 KiB working set.",
    )
    .median_of_seconds(),
    baseline(
        Resource::Memory,
        "llc_misses_per_kilo_instruction",
        2.0,
        0.2,
        "Last-level cache misses per thousand instructions of a workload cgroup, from the PMU.",
    ),
    baseline(
        Resource::Io,
        "pressure_some_ratio",
        0.05,
        0.01,
        "I/O pressure (node and each workload cgroup).",
    ),
    above(
        Resource::Gpu,
        "clock_throttle_ratio",
        0.05,
        "SM clock lost to power or thermal slowdown.",
    ),
    baseline(
        Resource::Gpu,
        "sm_activity_loss_ratio",
        0.15,
        0.03,
        "SMs idle while kernels run: 1 − SM active / utilisation, when busy.",
    ),
    baseline(
        Resource::Gpu,
        "dram_activity_loss_ratio",
        0.15,
        0.03,
        "HBM idle while kernels run: 1 − DRAM bandwidth / utilisation, when busy.",
    ),
    above(
        Resource::Gpu,
        "pcie_bandwidth_loss_ratio",
        0.01,
        "PCIe bandwidth lost to a link trained down, under load.",
    ),
    above(
        Resource::Gpu,
        "nvlink_links_missing_ratio",
        0.01,
        "NVLink links not up against the product's count.",
    ),
    baseline(
        Resource::Network,
        "xmit_wait_ticks_per_second",
        1e6,
        1e4,
        "InfiniBand port_xmit_wait: ticks with data to send and no credit (congestion).",
    ),
    above(
        Resource::Network,
        "errors_per_second",
        0.1,
        "InfiniBand error counters, summed.",
    ),
    above(
        Resource::Network,
        "link_downed_per_second",
        0.0,
        "InfiniBand link downs.",
    ),
];

fn spec(resource: Resource, signal: &str) -> Option<&'static Spec> {
    SPECS
        .iter()
        .find(|s| s.resource == resource && s.signal == signal)
}

/// A victim signal's identity.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct SignalKey {
    pub resource: Resource,
    pub victim: String,
    pub signal: &'static str,
}

struct SignalState {
    spec: &'static Spec,
    /// Per-second values, the last `lookback_secs`.
    seconds: VecDeque<(i64, f64)>,
    /// The seconds' values per window start, until judged.
    pending: BTreeMap<i64, Vec<f64>>,
    baseline: RollingBaseline,
    abnormal_run: u32,
    /// The first window of the current run of abnormal windows: where an
    /// event starts, however long a cgroup's own rise kept it from opening.
    abnormal_since: Option<i64>,
    normal_run: u32,
    last_second: i64,
}

struct OpenEvent {
    start_second: i64,
    peak_score: f64,
    suspects: Vec<Suspect>,
    evidence: String,
    /// The end of the last window that judged the victim signal (or when a
    /// restarted agent resumed the event): an event whose victim is gone,
    /// a removed cgroup say, closes here instead of staying open forever.
    last_judged_second: i64,
}

/// An event that was open when the agent stopped, read back from
/// `neighbor_events` (see `restore::resume_open_events`).
pub struct ResumedEvent {
    pub resource: Resource,
    pub victim: String,
    pub signal: String,
    pub start_second: i64,
    pub peak_score: f64,
    pub suspects: Vec<Suspect>,
    pub evidence: String,
}

/// Whose usage a suspect is.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Pool {
    Cgroup,
    GpuProcess,
    /// The host, through steal time: a suspect for CPU signals only.
    Hypervisor,
    /// CPU time outside every leaf cgroup ([`OUTSIDE_SUSPECT`]).
    Outside,
}

struct SuspectSeries {
    pool: Pool,
    seconds: VecDeque<(i64, f64)>,
}

/// The detector's state.
pub struct Detector {
    config: DetectConfig,
    signals: BTreeMap<SignalKey, SignalState>,
    suspects: BTreeMap<String, SuspectSeries>,
    /// Cgroups that have no child cgroup: only these are suspects, since a
    /// parent's usage holds its children's.
    leaf_cgroups: BTreeSet<String>,
    counters: HashMap<String, (i64, f64)>,
    open: BTreeMap<SignalKey, OpenEvent>,
    facts: Facts,
    jitter: Option<JitterWindow>,
    steal_ratio: Option<f64>,
    /// CPUs the steal ratio was taken over.
    node_cpus: Option<usize>,
    /// CPUs the node's CPUs were busy (not idle, iowait or stolen) each second.
    node_busy: VecDeque<(i64, f64)>,
    /// CPUs the leaf cgroups used each second, summed.
    leaf_busy: VecDeque<(i64, f64)>,
    /// The first second the detector saw the cgroups' rows, and the GPUs'
    /// rows (whose processes it then sees too): from then on, a suspect
    /// that has no usage in a second did not exist, which is no usage.
    cgroups_watched_since: Option<i64>,
    gpus_watched_since: Option<i64>,
    canary: Option<canary::CacheCanary>,
    last_canary_second: i64,
    /// Start of the oldest window not yet judged.
    next_window: Option<i64>,
}

#[derive(Clone, Copy)]
struct JitterWindow {
    p99_seconds: f64,
    interrupted_ratio: Option<f64>,
    unexplained_ratio: Option<f64>,
}

/// The second a sample belongs to (collectors tick just after whole seconds).
fn second_of(time_us: i64) -> i64 {
    (time_us + 500_000).div_euclid(1_000_000)
}

impl Detector {
    pub fn new(config: DetectConfig) -> Self {
        let canary = config.cache_canary.then(canary::CacheCanary::new);
        Detector {
            config,
            signals: BTreeMap::new(),
            suspects: BTreeMap::new(),
            leaf_cgroups: BTreeSet::new(),
            counters: HashMap::new(),
            open: BTreeMap::new(),
            facts: Facts::default(),
            jitter: None,
            steal_ratio: None,
            node_cpus: None,
            node_busy: VecDeque::new(),
            leaf_busy: VecDeque::new(),
            cgroups_watched_since: None,
            gpus_watched_since: None,
            canary,
            last_canary_second: i64::MIN,
            next_window: None,
        }
    }

    /// Teaches a baseline a window value it learned before a restart.
    pub fn relearn(&mut self, resource: Resource, victim: &str, signal: &str, value: f64) {
        let Some(spec) = spec(resource, signal) else {
            return;
        };
        let capacity = self.config.baseline_windows as usize;
        let key = SignalKey {
            resource,
            victim: victim.to_string(),
            signal: spec.signal,
        };
        self.signals
            .entry(key)
            .or_insert_with(|| SignalState::new(spec, capacity))
            .baseline
            .push(value);
    }

    /// Takes back an event that was open when the agent stopped, so a
    /// restart neither opens it a second time nor leaves its `open` row
    /// without a `closed` one. Returns false for a signal this build does
    /// not judge.
    pub fn resume(&mut self, event: ResumedEvent, now_second: i64) -> bool {
        let Some(spec) = spec(event.resource, &event.signal) else {
            return false;
        };
        let key = SignalKey {
            resource: event.resource,
            victim: event.victim,
            signal: spec.signal,
        };
        self.open.insert(
            key,
            OpenEvent {
                start_second: event.start_second,
                peak_score: event.peak_score,
                suspects: event.suspects,
                evidence: event.evidence,
                last_judged_second: now_second,
            },
        );
        true
    }

    /// Reads one collector batch.
    pub fn observe(&mut self, batch: &Batch) {
        let view = View::new(batch);
        if view.rows() == 0 {
            return;
        }
        match batch.table.name {
            "cpu" => self.observe_cpu(&view),
            "cpu_sched" => {
                self.observe_node_mean(
                    &view,
                    "cpu",
                    "run_delay_seconds",
                    Resource::Cpu,
                    "run_delay_ratio",
                );
            }
            "pressure" => self.observe_pressure(&view),
            "cgroup" => self.observe_cgroups(&view),
            "cgroup_perf" => self.observe_cgroup_perf(&view),
            "jitter" => self.observe_jitter(&view),
            "platform_host" => self.facts.observe_host(&view),
            "gpu_info" => {
                self.facts.observe_gpu_info(&view);
                let present: Vec<String> = (0..view.rows())
                    .map(|r| view.tag(r, "gpu").to_string())
                    .collect();
                self.facts.retain_gpus(&present);
            }
            "gpu" => self.observe_gpus(&view),
            "gpu_process" => self.observe_gpu_processes(&view),
            "gpu_probe" => self.facts.observe_gpu_probe(&view),
            "infiniband_port" => self.observe_infiniband(&view),
            _ => {}
        }
    }

    fn rate(&mut self, key: String, time_us: i64, value: f64) -> Option<f64> {
        let previous = self.counters.insert(key, (time_us, value));
        let (t0, v0) = previous?;
        let dt = (time_us - t0) as f64 / 1e6;
        // A reset (reboot of the source, a new cgroup under an old name) is no rate.
        (dt > 0.0 && value >= v0).then(|| (value - v0) / dt)
    }

    /// A counter's rate as a sample of `signal` (the first reading and a
    /// reset give none).
    fn sample_rate(
        &mut self,
        key: String,
        (resource, victim, signal): (Resource, &str, &'static str),
        time_us: i64,
        counter: Option<f64>,
    ) {
        let Some(counter) = counter else {
            return;
        };
        if let Some(rate) = self.rate(key, time_us, counter) {
            self.sample(resource, victim, signal, time_us, rate);
        }
    }

    fn sample(
        &mut self,
        resource: Resource,
        victim: &str,
        signal: &'static str,
        time_us: i64,
        value: f64,
    ) {
        if !value.is_finite() {
            return;
        }
        let Some(spec) = spec(resource, signal) else {
            debug_assert!(false, "undeclared signal {signal}");
            return;
        };
        let capacity = self.config.baseline_windows as usize;
        let (window_secs, lookback) = (
            self.config.window_secs as i64,
            self.config.lookback_secs as i64,
        );
        let key = SignalKey {
            resource,
            victim: victim.to_string(),
            signal: spec.signal,
        };
        let state = self
            .signals
            .entry(key)
            .or_insert_with(|| SignalState::new(spec, capacity));
        let second = second_of(time_us);
        push_second(&mut state.seconds, second, value, lookback);
        let window = second.div_euclid(window_secs) * window_secs;
        state.pending.entry(window).or_default().push(value);
        state.last_second = state.last_second.max(second);
    }

    fn usage(&mut self, name: &str, pool: Pool, time_us: i64, value: f64) {
        let lookback = self.config.lookback_secs as i64;
        let series = self
            .suspects
            .entry(name.to_string())
            .or_insert_with(|| SuspectSeries {
                pool,
                seconds: VecDeque::new(),
            });
        push_second(&mut series.seconds, second_of(time_us), value, lookback);
    }

    /// Mean over the rows (CPUs) of a counter's rate, as one node signal;
    /// returns the mean and the number of rows it was taken over.
    fn observe_node_mean(
        &mut self,
        view: &View,
        key_tag: &str,
        field: &str,
        resource: Resource,
        signal: &'static str,
    ) -> Option<(f64, usize)> {
        let (tag, column) = (view.tag_column(key_tag)?, view.field_column(field)?);
        let (mut sum, mut n) = (0.0, 0usize);
        let time_us = view.time_us(0);
        for row in 0..view.rows() {
            let Some(v) = view.value_at(column, row) else {
                continue;
            };
            let key = format!("{}|{}|{field}", view.table_name(), view.tag_at(tag, row));
            if let Some(r) = self.rate(key, view.time_us(row), v) {
                sum += r;
                n += 1;
            }
        }
        if n == 0 {
            return None;
        }
        let mean = sum / n as f64;
        self.sample(resource, "node", signal, time_us, mean);
        Some((mean, n))
    }

    fn observe_cpu(&mut self, view: &View) {
        self.observe_node_busy(view);
        if let Some((steal, cpus)) =
            self.observe_node_mean(view, "cpu", "steal_seconds", Resource::Cpu, "steal_ratio")
        {
            self.steal_ratio = Some(steal);
            self.node_cpus = Some(cpus);
            self.usage(
                HYPERVISOR_SUSPECT,
                Pool::Hypervisor,
                view.time_us(0),
                steal * cpus as f64,
            );
        }
    }

    /// The node's busy CPUs this second: the rate of every CPU's non-idle,
    /// non-stolen time, summed. Seconds where any CPU lacks a field are left
    /// out rather than undercounted.
    fn observe_node_busy(&mut self, view: &View) {
        // user_seconds holds guest time already.
        const BUSY: [&str; 5] = [
            "user_seconds",
            "nice_seconds",
            "system_seconds",
            "irq_seconds",
            "softirq_seconds",
        ];
        let Some(cpu) = view.tag_column("cpu") else {
            return;
        };
        let (mut total, mut complete) = (0.0, true);
        for row in 0..view.rows() {
            let busy: Option<f64> = BUSY.iter().map(|f| view.value(row, f)).sum();
            let key = format!("cpu|{}|busy", view.tag_at(cpu, row));
            match busy.and_then(|b| self.rate(key, view.time_us(row), b)) {
                Some(r) => total += r,
                None => complete = false,
            }
        }
        if complete {
            let lookback = self.config.lookback_secs as i64;
            push_second(
                &mut self.node_busy,
                second_of(view.time_us(0)),
                total,
                lookback,
            );
        }
    }

    fn observe_pressure(&mut self, view: &View) {
        for row in 0..view.rows() {
            let resource = match view.tag(row, "resource") {
                "cpu" => Resource::Cpu,
                "memory" => Resource::Memory,
                "io" => Resource::Io,
                _ => continue,
            };
            self.sample_rate(
                format!("pressure|{}", resource.name()),
                (resource, "node", "pressure_some_ratio"),
                view.time_us(row),
                view.value(row, "some_stalled_seconds"),
            );
        }
    }

    fn observe_cgroups(&mut self, view: &View) {
        let Some((paths, workloads)) = cgroup_rows(view) else {
            return;
        };
        self.leaf_cgroups = leaves(&paths);
        self.cgroups_watched_since
            .get_or_insert(second_of(view.time_us(0)));
        let mut leaf_busy = Some(0.0);
        const PRESSURES: [(&str, Resource); 3] = [
            ("cpu_pressure_some_seconds", Resource::Cpu),
            ("memory_pressure_some_seconds", Resource::Memory),
            ("io_pressure_some_seconds", Resource::Io),
        ];
        for (row, path) in paths.iter().enumerate() {
            let time_us = view.time_us(row);
            let rate = view
                .value(row, "cpu_usage_seconds")
                .and_then(|usage| self.rate(format!("cgroup|{path}|cpu"), time_us, usage));
            if self.leaf_cgroups.contains(*path) {
                match rate {
                    Some(r) => {
                        self.usage(path, Pool::Cgroup, time_us, r);
                        leaf_busy = leaf_busy.map(|sum| sum + r);
                    }
                    // A leaf seen for the first time (no rate yet) or
                    // without its usage: the sum is unknown this second.
                    None => leaf_busy = None,
                }
            }
            if !is_victim(path, workloads[row], &self.leaf_cgroups) {
                continue;
            }
            for (field, resource) in PRESSURES {
                self.sample_rate(
                    format!("cgroup|{path}|{field}"),
                    (resource, path, "pressure_some_ratio"),
                    time_us,
                    view.value(row, field),
                );
            }
        }
        if let Some(sum) = leaf_busy {
            let lookback = self.config.lookback_secs as i64;
            push_second(
                &mut self.leaf_busy,
                second_of(view.time_us(0)),
                sum,
                lookback,
            );
        }
    }

    /// CPI and LLC misses per thousand instructions of each leaf workload
    /// cgroup, from the perf collector's counters: ratios of two rates over
    /// the same second, sampled only when the cgroup ran enough instructions.
    fn observe_cgroup_perf(&mut self, view: &View) {
        let Some((paths, workloads)) = cgroup_rows(view) else {
            return;
        };
        let leaf = leaves(&paths);
        for (row, path) in paths.iter().enumerate() {
            let time_us = view.time_us(row);
            // Every counter's rate is taken each row, so the next second's
            // rate spans one second whatever this one decided.
            let mut rate = |field: &str| {
                let counter = view.value(row, field)?;
                self.rate(format!("cgroup_perf|{path}|{field}"), time_us, counter)
            };
            let (cycles, instructions, llc_misses) =
                (rate("cycles"), rate("instructions"), rate("llc_misses"));
            if !is_victim(path, workloads[row], &leaf) {
                continue;
            }
            let Some(instructions) = instructions.filter(|i| *i >= PMU_MIN_INSTRUCTIONS_PER_SECOND)
            else {
                continue;
            };
            if let Some(cycles) = cycles {
                self.sample(Resource::Cpu, path, "cpi", time_us, cycles / instructions);
            }
            if let Some(misses) = llc_misses {
                self.sample(
                    Resource::Memory,
                    path,
                    "llc_misses_per_kilo_instruction",
                    time_us,
                    1000.0 * misses / instructions,
                );
            }
        }
    }

    fn observe_jitter(&mut self, view: &View) {
        let mut p99: Option<f64> = None;
        let (mut interrupted, mut unexplained) = (Vec::new(), Vec::new());
        for row in 0..view.rows() {
            if let Some(v) = view.value(row, "wakeup_p99_seconds") {
                p99 = Some(p99.map_or(v, |p: f64| p.max(v)));
            }
            interrupted.extend(view.value(row, "interrupted_ratio"));
            unexplained.extend(view.value(row, "unexplained_ratio"));
        }
        let mean = |v: &[f64]| (!v.is_empty()).then(|| v.iter().sum::<f64>() / v.len() as f64);
        let time_us = view.time_us(0);
        if let Some(p99) = p99 {
            self.sample(Resource::Cpu, "node", "jitter_p99_seconds", time_us, p99);
            self.jitter = Some(JitterWindow {
                p99_seconds: p99,
                interrupted_ratio: mean(&interrupted),
                unexplained_ratio: mean(&unexplained),
            });
        }
        if let Some(u) = mean(&unexplained) {
            self.sample(
                Resource::Cpu,
                "node",
                "jitter_unexplained_ratio",
                time_us,
                u,
            );
        }
    }

    fn observe_gpus(&mut self, view: &View) {
        self.gpus_watched_since
            .get_or_insert(second_of(view.time_us(0)));
        let seen = self.facts.observe_gpu(view);
        let time_us = view.time_us(0);
        type Derived = fn(&GpuFacts) -> Option<f64>;
        const DERIVED: [(&str, Derived); 5] = [
            ("clock_throttle_ratio", GpuFacts::clock_throttle_ratio),
            ("sm_activity_loss_ratio", GpuFacts::sm_activity_loss_ratio),
            (
                "dram_activity_loss_ratio",
                GpuFacts::dram_activity_loss_ratio,
            ),
            (
                "pcie_bandwidth_loss_ratio",
                GpuFacts::pcie_bandwidth_loss_ratio,
            ),
            (
                "nvlink_links_missing_ratio",
                GpuFacts::nvlink_links_missing_ratio,
            ),
        ];
        for index in seen {
            let Some(gpu) = self.facts.gpus.get(&index) else {
                continue;
            };
            let values: Vec<(&'static str, f64)> = DERIVED
                .iter()
                .filter_map(|(signal, f)| f(gpu).map(|v| (*signal, v)))
                .collect();
            let victim = format!("gpu{index}");
            for (signal, v) in values {
                self.sample(Resource::Gpu, &victim, signal, time_us, v);
            }
        }
    }

    fn observe_gpu_processes(&mut self, view: &View) {
        for row in 0..view.rows() {
            let Some(sm) = view.value(row, "sm_utilization_ratio") else {
                continue;
            };
            let name = gpu_process_name(view, row);
            self.usage(&name, Pool::GpuProcess, view.time_us(row), sm);
        }
    }

    fn observe_infiniband(&mut self, view: &View) {
        const ERRORS: [&str; 7] = [
            "symbol_error",
            "rcv_errors",
            "link_error_recovery",
            "local_link_integrity_errors",
            "excessive_buffer_overrun_errors",
            "xmit_discards",
            "rcv_remote_physical_errors",
        ];
        for row in 0..view.rows() {
            let port = format!("{}/{}", view.tag(row, "device"), view.tag(row, "port"));
            let time_us = view.time_us(row);
            let errors: Option<f64> = ERRORS.iter().map(|f| view.value(row, f)).sum();
            for (what, signal, counter) in [
                (
                    "xmit_wait",
                    "xmit_wait_ticks_per_second",
                    view.value(row, "xmit_wait"),
                ),
                ("errors", "errors_per_second", errors),
                (
                    "link_downed",
                    "link_downed_per_second",
                    view.value(row, "link_downed"),
                ),
            ] {
                self.sample_rate(
                    format!("ib|{port}|{what}"),
                    (Resource::Network, &port, signal),
                    time_us,
                    counter,
                );
            }
        }
    }

    /// Runs the cache canary once per second; the main loop calls this on
    /// each of its ticks.
    fn run_canary(&mut self, now_us: i64) {
        let second = second_of(now_us);
        if second == self.last_canary_second {
            return;
        }
        let Some(canary) = self.canary.as_mut() else {
            return;
        };
        self.last_canary_second = second;
        let seconds_per_load = canary.sample();
        self.sample(
            Resource::Memory,
            "node",
            "cache_latency_seconds",
            now_us,
            seconds_per_load,
        );
    }

    /// Judges every window that has ended; returns the rows to store and export.
    pub fn tick(&mut self, now_us: i64) -> Vec<Batch> {
        self.run_canary(now_us);
        let window_secs = self.config.window_secs as i64;
        let now_second = now_us.div_euclid(1_000_000);
        let current = now_second.div_euclid(window_secs) * window_secs;
        let mut next = *self.next_window.get_or_insert(current);
        // After a long stall, judge only the last window that has ended.
        if current - next > 100 * window_secs {
            next = current - window_secs;
        }
        let mut out = Vec::new();
        while next + window_secs + WINDOW_GRACE_SECS <= now_second {
            out.extend(self.judge_window(next));
            next += window_secs;
        }
        self.next_window = Some(next);
        out
    }

    fn judge_window(&mut self, window: i64) -> Vec<Batch> {
        let config = self.config.clone();
        let window_end = window + config.window_secs as i64;
        let time_us = window_end * 1_000_000;
        let mut signal_rows = BatchBuilder::new(&tables::DETECTOR_SIGNAL);
        let mut event_rows = BatchBuilder::new(&tables::NEIGHBOR_EVENTS);
        let mut resource_scores: BTreeMap<Resource, f64> = BTreeMap::new();
        let mut opened = Vec::new();
        let mut closed = Vec::new();
        for (key, state) in self.signals.iter_mut() {
            let judged = state.judge(window, &config);
            let Some(judged) = judged else { continue };
            let score = resource_scores.entry(key.resource).or_insert(0.0);
            *score = score.max(judged.score.max(0.0));
            let summary = judged.summary;
            let row = tables::DetectorSignalRow {
                resource: key.resource.name(),
                victim: &key.victim,
                signal: key.signal,
                value: judged.value,
                baseline_median: summary.map(|s| s.median),
                baseline_mad: summary.map(|s| s.mad),
                z: judged.score,
                abnormal: i64::from(judged.abnormal),
            };
            signal_rows
                .push_row(time_us, &row)
                .expect("a signal row is for the detector_signal table");
            let open = match self.open.get_mut(key) {
                Some(event) => {
                    event.last_judged_second = window_end;
                    true
                }
                None => false,
            };
            if !open && state.abnormal_run >= config.open_windows {
                let start_second = state.abnormal_since.unwrap_or(window);
                opened.push((
                    key.clone(),
                    start_second,
                    judged.score,
                    evidence(key, state, &judged),
                ));
            } else if open && state.normal_run >= config.close_windows {
                let end_second =
                    window_end - i64::from(config.close_windows) * config.window_secs as i64;
                closed.push((
                    key.clone(),
                    end_second,
                    "the signal returned to its baseline",
                ));
            } else if let Some(event) = self.open.get_mut(key) {
                event.peak_score = event.peak_score.max(judged.score);
            }
        }
        for (key, start_second, score, evidence) in opened {
            let since_second = start_second - PRE_ONSET_SECS;
            if self.self_inflicted(&key, since_second) {
                tracing::debug!(victim = %key.victim, signal = key.signal, "Not an event: the cgroup's own usage rose with its stall.");
                continue;
            }
            let suspects = self.rank(&key, since_second);
            tracing::warn!(
                resource = key.resource.name(),
                victim = %key.victim,
                signal = key.signal,
                suspect = top_suspect(&suspects),
                score = format!("{score:.1}"),
                %evidence,
                "Noisy-neighbour event opened."
            );
            let event = OpenEvent {
                start_second,
                peak_score: score,
                suspects,
                evidence,
                last_judged_second: window_end,
            };
            push_event_row(&mut event_rows, time_us, &key, &event, "open", None);
            self.open.insert(key, event);
        }
        // Suspects are ranked again every window: the more seconds of the
        // event the look-back holds, the clearer the correlation.
        let keys: Vec<SignalKey> = self.open.keys().cloned().collect();
        for key in keys {
            let Some(since_second) = self.open.get(&key).map(|e| e.start_second - PRE_ONSET_SECS)
            else {
                continue;
            };
            let suspects = self.rank(&key, since_second);
            if let Some(event) = self.open.get_mut(&key) {
                if !suspects.is_empty() && event.start_second < window {
                    // The event's row is written when it closes: say in the
                    // log when the answer to "who" changes meanwhile.
                    let (before, now) = (top_suspect(&event.suspects), top_suspect(&suspects));
                    if before != now {
                        tracing::info!(
                            resource = key.resource.name(),
                            victim = %key.victim,
                            signal = key.signal,
                            was = before,
                            suspect = now,
                            score = format!("{:.2}", suspects[0].score),
                            "Noisy-neighbour event's top suspect changed."
                        );
                    }
                    event.suspects = suspects;
                }
            }
        }
        // A victim that stopped reporting (its cgroup was removed, its GPU
        // fell off the bus) cannot return to normal: close its event where
        // it was last judged.
        let silent_since = window_end - 2 * config.lookback_secs as i64;
        for (key, event) in &self.open {
            if event.last_judged_second < silent_since {
                closed.push((
                    key.clone(),
                    event.last_judged_second,
                    "the victim signal stopped reporting",
                ));
            }
        }
        for (key, end_second, why) in closed {
            let Some(event) = self.open.remove(&key) else {
                continue;
            };
            tracing::info!(
                resource = key.resource.name(),
                victim = %key.victim,
                signal = key.signal,
                duration_secs = end_second - event.start_second,
                suspect = top_suspect(&event.suspects),
                why,
                "Noisy-neighbour event closed."
            );
            push_event_row(
                &mut event_rows,
                time_us,
                &key,
                &event,
                "closed",
                Some(end_second),
            );
        }
        self.forget_stale(window);

        let mut out = vec![signal_rows.finish(), event_rows.finish()];
        out.push(self.neighbor_rows(time_us));
        out.push(self.resource_rows(time_us, &resource_scores));
        out.push(self.tax_row(time_us));
        out.push(self.platform_row(time_us));
        out.retain(|b| !b.is_empty());
        out
    }

    /// Ranks the suspects of `key` over the seconds from `since_second`.
    fn rank(&self, key: &SignalKey, since_second: i64) -> Vec<Suspect> {
        let Some(state) = self.signals.get(key) else {
            return Vec::new();
        };
        let guest = !state.spec.outside_guest;
        let eligible = |name: &str, pool: Pool| match pool {
            Pool::GpuProcess => {
                guest && key.resource == Resource::Gpu && !same_lineage(name, &key.victim)
            }
            Pool::Cgroup => {
                guest
                    && key.resource != Resource::Gpu
                    && self.leaf_cgroups.contains(name)
                    && !same_lineage(name, &key.victim)
            }
            Pool::Hypervisor => key.resource == Resource::Cpu,
            Pool::Outside => guest && key.resource == Resource::Cpu,
        };
        let victim = state.seconds_since(since_second);
        let mut suspects: BTreeMap<String, BTreeMap<i64, f64>> = self
            .suspects
            .iter()
            .filter(|(name, s)| eligible(name, s.pool))
            .map(|(name, s)| (name.clone(), self.observed_usage(s, &victim)))
            .collect();
        if eligible(OUTSIDE_SUSPECT, Pool::Outside) {
            suspects.insert(OUTSIDE_SUSPECT.to_string(), self.outside_usage());
        }
        let mut ranked = rank::rank(&victim, &suspects, key.resource.usage_scale());
        for suspect in &mut ranked {
            if suspect.name == HYPERVISOR_SUSPECT && !self.steal_is_material(suspect, key) {
                suspect.score = 0.0;
            }
        }
        rank::sort(&mut ranked);
        ranked
    }

    /// A suspect's per-second usage, with the seconds before it first
    /// appeared, while the detector was already watching its kind, as zero:
    /// a container or job started at the onset did not exist before it, so
    /// it used nothing then. Counting only the seconds it existed would see
    /// a newcomer busy throughout, flat, and uncorrelated with the onset.
    fn observed_usage(
        &self,
        suspect: &SuspectSeries,
        victim: &BTreeMap<i64, f64>,
    ) -> BTreeMap<i64, f64> {
        let mut usage: BTreeMap<i64, f64> = suspect.seconds.iter().copied().collect();
        let watched_since = match suspect.pool {
            Pool::Cgroup => self.cgroups_watched_since,
            Pool::GpuProcess => self.gpus_watched_since,
            Pool::Hypervisor | Pool::Outside => None,
        };
        if let (Some(watched), Some(&first)) = (watched_since, usage.keys().next()) {
            // A usage is a rate: the first comes a second after the first
            // sight, in the first second watched as in a newcomer's. The
            // second before the first usage is when it appeared: unknown.
            for &second in victim.keys() {
                if second > watched && second < first - 1 {
                    usage.insert(second, 0.0);
                }
            }
        }
        usage
    }

    /// CPUs busy outside every leaf cgroup, per second both are known.
    fn outside_usage(&self) -> BTreeMap<i64, f64> {
        let leaves: BTreeMap<i64, f64> = self.leaf_busy.iter().copied().collect();
        self.node_busy
            .iter()
            .filter_map(|(second, busy)| leaves.get(second).map(|l| (*second, (busy - l).max(0.0))))
            .collect()
    }

    /// Whether the host's steal is a material cause of `key`'s signal, as
    /// the hypervisor's ranking found it: the steal, in the seconds it was
    /// high, reaches [`MIN_HYPERVISOR_STEAL_RATIO`] of the node's CPU time,
    /// and for a ratio signal its rise is at least [`MIN_HYPERVISOR_SHARE`]
    /// of the signal's. Steal that merely rises a little with the guest's
    /// own load (a busy loop makes the host preempt the vCPU more often)
    /// correlates well and explains nothing.
    fn steal_is_material(&self, hypervisor: &Suspect, key: &SignalKey) -> bool {
        let Some(series) = self.suspects.get(HYPERVISOR_SUSPECT) else {
            return false;
        };
        let cpus = self.node_cpus.unwrap_or(1).max(1) as f64;
        let stolen: Vec<f64> = series.seconds.iter().map(|(_, v)| v / cpus).collect();
        let Some(peak_quarter) = upper_quartile_mean(&stolen) else {
            return false;
        };
        if peak_quarter < MIN_HYPERVISOR_STEAL_RATIO {
            return false;
        }
        let ratio_signal = key.signal.ends_with("_ratio");
        !ratio_signal || hypervisor.usage_change / cpus >= MIN_HYPERVISOR_SHARE * hypervisor.effect
    }

    /// Whether a cgroup's own usage rose with its signal: a workload that
    /// starts (or starts working harder) stalls on what it now competes for,
    /// and is the neighbour, not the victim.
    fn self_inflicted(&self, key: &SignalKey, since_second: i64) -> bool {
        let (Some(state), Some(own)) = (self.signals.get(key), self.suspects.get(&key.victim))
        else {
            return false;
        };
        let victim = state.seconds_since(since_second);
        let own: BTreeMap<String, BTreeMap<i64, f64>> =
            [(key.victim.clone(), own.seconds.iter().copied().collect())].into();
        rank::rank(&victim, &own, key.resource.usage_scale())
            .first()
            .is_some_and(|s| s.correlation > 0.5 && s.usage_change > key.resource.usage_scale())
    }

    /// Drops the state of victims and suspects that left (a finished
    /// container's cgroup), unless an event still refers to them.
    fn forget_stale(&mut self, window: i64) {
        let horizon = window - 2 * self.config.lookback_secs as i64;
        let open = &self.open;
        self.signals.retain(|key, state| {
            state.last_second >= horizon || open.contains_key(key) || key.victim == "node"
        });
        self.suspects.retain(|_, s| {
            s.seconds
                .back()
                .is_some_and(|(second, _)| *second >= horizon)
        });
        self.counters
            .retain(|_, (time_us, _)| second_of(*time_us) >= horizon);
    }

    fn neighbor_rows(&self, time_us: i64) -> Batch {
        let mut rows = BatchBuilder::new(&tables::NEIGHBOR);
        for (key, event) in &self.open {
            for suspect in event
                .suspects
                .iter()
                .filter(|s| s.score > 0.0)
                .take(SUSPECTS_EXPORTED)
            {
                let row = tables::NeighborRow {
                    resource: key.resource.name(),
                    victim: &key.victim,
                    suspect: &suspect.name,
                    suspected: suspect.score,
                    correlation: suspect.correlation,
                };
                rows.push_row(time_us, &row)
                    .expect("a suspect row is for the neighbor table");
            }
        }
        rows.finish()
    }

    fn resource_rows(&self, time_us: i64, scores: &BTreeMap<Resource, f64>) -> Batch {
        let mut rows = BatchBuilder::new(&tables::NEIGHBOR_RESOURCE);
        for (resource, score) in scores {
            let open = self.open.keys().filter(|k| k.resource == *resource).count();
            let row = tables::NeighborResourceRow {
                resource: resource.name(),
                score: *score,
                events_open: open as i64,
            };
            rows.push_row(time_us, &row)
                .expect("a resource row is for the neighbor_resource table");
        }
        rows.finish()
    }

    fn tax_row(&self, time_us: i64) -> Batch {
        let jitter = self.jitter;
        let facts = &self.facts;
        let row = tables::TaxRow {
            steal_ratio: self.steal_ratio,
            interrupted_ratio: jitter.and_then(|j| j.interrupted_ratio),
            unexplained_ratio: jitter.and_then(|j| j.unexplained_ratio),
            jitter_p99_seconds: jitter.map(|j| j.p99_seconds),
            hbm_peak_ratio: facts.hbm_peak_ratio(),
            nvlink_peak_ratio: facts.nvlink_peak_ratio(),
            nvlink_links_missing_ratio: facts.nvlink_links_missing_ratio(),
            pcie_bandwidth_loss_ratio: facts.worst(GpuFacts::pcie_bandwidth_loss_ratio),
            gpu_clock_throttle_ratio: facts.worst(GpuFacts::clock_throttle_ratio),
            probe_host_to_device_ratio: facts.lowest(|g| g.probe.host_to_device.ratio()),
            probe_device_to_host_ratio: facts.lowest(|g| g.probe.device_to_host.ratio()),
            probe_device_to_device_ratio: facts.lowest(|g| g.probe.device_to_device.ratio()),
        };
        let mut rows = BatchBuilder::new(&tables::TAX);
        rows.push_row(time_us, &row)
            .expect("a tax row is for the tax table");
        rows.finish()
    }

    fn platform_row(&self, time_us: i64) -> Batch {
        let verdict = self.facts.verdict();
        let mut rows = BatchBuilder::new(&tables::PLATFORM);
        rows.push_row(time_us, &verdict.row())
            .expect("a verdict row is for the platform table");
        rows.finish()
    }
}

/// What one window said about one signal.
struct Judged {
    value: f64,
    summary: Option<baseline::Summary>,
    score: f64,
    abnormal: bool,
}

impl SignalState {
    /// Its per-second values from `since_second` on.
    fn seconds_since(&self, since_second: i64) -> BTreeMap<i64, f64> {
        self.seconds
            .iter()
            .copied()
            .filter(|(second, _)| *second >= since_second)
            .collect()
    }

    fn new(spec: &'static Spec, capacity: usize) -> Self {
        SignalState {
            spec,
            seconds: VecDeque::new(),
            pending: BTreeMap::new(),
            baseline: RollingBaseline::new(match spec.rule {
                Rule::Baseline { .. } => capacity,
                Rule::Above { .. } => 1,
            }),
            abnormal_run: 0,
            abnormal_since: None,
            normal_run: 0,
            last_second: i64::MIN,
        }
    }

    /// Judges `window` if it has samples; a window without any (a jitter
    /// window is 10 s) changes nothing.
    fn judge(&mut self, window: i64, config: &DetectConfig) -> Option<Judged> {
        let mut seconds = None;
        while let Some(entry) = self.pending.first_entry() {
            if *entry.key() > window {
                break;
            }
            let (key, v) = entry.remove_entry();
            if key == window {
                seconds = Some(v);
            }
        }
        let mut seconds = seconds.filter(|v| !v.is_empty())?;
        let value = if self.spec.median_of_seconds {
            baseline::median_in_place(&mut seconds)
        } else {
            seconds.iter().sum::<f64>() / seconds.len() as f64
        };
        let summary = self.baseline.summary();
        let (score, abnormal, normal) = match self.spec.rule {
            Rule::Baseline {
                min_change,
                min_relative_change,
                z_floor,
            } => {
                let z = summary.map_or(0.0, |s| s.robust_z(value, z_floor));
                let change = summary.map_or(0.0, |s| value - s.median);
                let least = summary.map_or(min_change, |s| {
                    min_change.max(min_relative_change * s.median.abs())
                });
                let ready =
                    summary.is_some_and(|s| s.windows as u64 >= config.min_baseline_windows);
                (
                    z,
                    ready && z >= config.z_open && change >= least,
                    z < config.z_close || change < least / 2.0,
                )
            }
            Rule::Above { threshold } => {
                let score = if threshold > 0.0 {
                    config.z_open * value / threshold
                } else if value > 0.0 {
                    config.z_open * 2.0
                } else {
                    0.0
                };
                (score, value > threshold, value <= threshold / 2.0)
            }
        };
        // This window is the (abnormal_run + 1)-th abnormal one in a row.
        let learn = !abnormal || self.abnormal_run + 1 >= config.learn_abnormal_after_windows;
        if matches!(self.spec.rule, Rule::Baseline { .. }) && learn {
            self.baseline.push(value);
        }
        if abnormal {
            if self.abnormal_run == 0 {
                self.abnormal_since = Some(window);
            }
            self.abnormal_run += 1;
            self.normal_run = 0;
        } else if normal {
            self.normal_run += 1;
            self.abnormal_run = 0;
        } else {
            // Between the thresholds: neither opens nor closes.
            self.abnormal_run = 0;
            self.normal_run = 0;
        }
        Some(Judged {
            value,
            summary,
            score,
            abnormal,
        })
    }
}

fn push_second(series: &mut VecDeque<(i64, f64)>, second: i64, value: f64, lookback: i64) {
    match series.back_mut() {
        // Two samples in one second (a collector caught up): keep the later.
        Some(last) if last.0 == second => last.1 = value,
        _ => series.push_back((second, value)),
    }
    while series.front().is_some_and(|(s, _)| *s <= second - lookback) {
        series.pop_front();
    }
}

/// The first suspect with a positive score, for the log.
/// The mean of the largest quarter of `values` (at least one); `None` when
/// there are none.
fn upper_quartile_mean(values: &[f64]) -> Option<f64> {
    if values.is_empty() {
        return None;
    }
    let mut sorted = values.to_vec();
    sorted.sort_by(|a, b| b.total_cmp(a));
    let top = &sorted[..sorted.len().div_ceil(4)];
    Some(top.iter().sum::<f64>() / top.len() as f64)
}

fn top_suspect(suspects: &[Suspect]) -> &str {
    suspects
        .first()
        .filter(|s| s.score > 0.0)
        .map_or("none", |s| s.name.as_str())
}

/// The `path` and `workload` tags of a batch of per-cgroup rows, row by row.
fn cgroup_rows<'a>(view: &View<'a>) -> Option<(Vec<&'a str>, Vec<&'a str>)> {
    let (path, workload) = (view.tag_column("path")?, view.tag_column("workload")?);
    let rows = 0..view.rows();
    Some((
        rows.clone().map(|r| view.tag_at(path, r)).collect(),
        rows.map(|r| view.tag_at(workload, r)).collect(),
    ))
}

/// Whether a cgroup's signals are a victim's. Slices and job steps aggregate
/// or subdivide a workload, and a parent's stall holds its children's: the
/// workload's own leaf cgroup is the victim.
fn is_victim(path: &str, workload: &str, leaves: &BTreeSet<String>) -> bool {
    !matches!(workload, "slice" | "slurm_step") && leaves.contains(path)
}

/// Whether one cgroup path is the other or holds it.
fn same_lineage(a: &str, b: &str) -> bool {
    let within = |inner: &str, outer: &str| {
        inner == outer
            || inner
                .strip_prefix(outer)
                .is_some_and(|rest| rest.starts_with('/'))
    };
    within(a, b) || within(b, a)
}

/// A GPU process as a suspect: its workload when it has one, else its pid.
fn gpu_process_name(view: &View, row: usize) -> String {
    for (tag, label) in [
        ("pod_uid", "pod"),
        ("container", "container"),
        ("slurm_job", "slurm_job"),
    ] {
        let v = view.tag(row, tag);
        if !v.is_empty() {
            return format!("{label}:{v}");
        }
    }
    format!("pid:{}/{}", view.tag(row, "pid"), view.tag(row, "command"))
}

fn evidence(key: &SignalKey, state: &SignalState, judged: &Judged) -> String {
    let q = |value: f64| quantity(key.signal, value);
    match (state.spec.rule, judged.summary) {
        (Rule::Baseline { .. }, Some(s)) => format!(
            "{} {} of {} ({}): {} against a baseline median {} (MAD {}, {} windows), z {:.1}, {} windows in a row",
            key.resource.name(),
            key.signal,
            key.victim,
            state.spec.help,
            q(judged.value),
            q(s.median),
            q(s.mad),
            s.windows,
            judged.score,
            state.abnormal_run
        ),
        (Rule::Above { threshold }, _) | (Rule::Baseline { min_change: threshold, .. }, None) => format!(
            "{} {} of {} ({}): {} above the threshold {}, {} windows in a row",
            key.resource.name(),
            key.signal,
            key.victim,
            state.spec.help,
            q(judged.value),
            q(threshold),
            state.abnormal_run
        ),
    }
}

/// A signal's value for a person: durations in the unit that keeps them
/// readable (a cache load is nanoseconds, a wake-up tail microseconds).
fn quantity(signal: &str, value: f64) -> String {
    if !signal.ends_with("_seconds") || value == 0.0 || !value.is_finite() {
        return format!("{value:.4}");
    }
    let magnitude = value.abs();
    let (scale, unit) = if magnitude < 1e-6 {
        (1e9, "ns")
    } else if magnitude < 1e-3 {
        (1e6, "µs")
    } else if magnitude < 1.0 {
        (1e3, "ms")
    } else {
        (1.0, "s")
    };
    format!("{:.1} {unit}", value * scale)
}

fn push_event_row(
    rows: &mut BatchBuilder,
    time_us: i64,
    key: &SignalKey,
    event: &OpenEvent,
    state: &str,
    end_second: Option<i64>,
) {
    let suspects = event
        .suspects
        .iter()
        .filter(|s| s.score > 0.0)
        .take(SUSPECTS_STORED)
        .map(|s| {
            format!(
                "{} score={:.2} r={:.2} effect={:.4}",
                s.name, s.score, s.correlation, s.effect
            )
        })
        .collect::<Vec<_>>()
        .join("; ");
    let top = event.suspects.first().filter(|s| s.score > 0.0);
    let row = tables::NeighborEventRow {
        resource: key.resource.name(),
        victim: &key.victim,
        signal: key.signal,
        state,
        suspects: &suspects,
        evidence: &event.evidence,
        start_time_seconds: event.start_second as f64,
        end_time_seconds: end_second.map(|s| s as f64),
        score: event.peak_score,
        top_correlation: top.map(|s| s.correlation),
        effect_size: top.map(|s| s.effect),
    };
    rows.push_row(time_us, &row)
        .expect("an event row is for the neighbor_events table");
}
