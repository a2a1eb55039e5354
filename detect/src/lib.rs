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
mod config;
mod events;
mod observe;
pub mod rank;
pub mod replay;
pub mod restore;
mod signals;
pub mod stored_rows;
pub mod suspect_text;
pub mod tables;
pub mod verdict;
pub mod view;

#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};

use vtax_store::{Batch, BatchBuilder};

use baseline::RollingBaseline;
use rank::Suspect;
use verdict::{Facts, GpuFacts};
use view::View;
use vtax_collectors::cgroups::leaves;

pub use config::{DetectConfig, KEY_DOCS, KEY_RANGES};
use events::{keep_best, named_first};
use signals::spec;
pub use signals::{Resource, Rule, Spec, SPECS};

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
/// Bytes in a MiB: a cgroup's block I/O usage is in MiB/s.
const MIB: f64 = 1_048_576.0;

/// Seconds of per-second history the suspects are ranked over.
pub const DEFAULT_LOOKBACK_SECS: u64 = 90;
/// Seconds after a window ends before it is judged: collectors tick on whole
/// seconds and their rows reach the main thread within its 250 ms tick.
pub const WINDOW_GRACE_SECS: i64 = 2;
/// Seconds before an event's first abnormal window that its suspects are
/// ranked over: enough quiet seconds to see who changed at the onset, few
/// enough that a neighbour who came and went a minute earlier is not in them.
const PRE_ONSET_SECS: i64 = 30;
/// Instructions per second under which a cgroup's CPI and cache misses per
/// instruction are not sampled: a tenth of a core at one instruction per
/// cycle at 1 GHz. An idle cgroup's few instructions are wake-ups on cold
/// caches, whose CPI swings by multiples from second to second.
const PMU_MIN_INSTRUCTIONS_PER_SECOND: f64 = 1e8;
/// Windows of a suspect's usage its usual level is the median of (10
/// minutes at the default window).
const USUAL_WINDOWS: usize = 120;
/// Windows of a suspect's usage before its usual level is known; until then
/// a suspect is ranked on correlation alone.
const MIN_USUAL_WINDOWS: usize = 6;
/// How far above its usual level, in units of the resource's usage scale, a
/// suspect's busy seconds must be for it to be named: a workload that only
/// came back to its own normal (often because the previous antagonist left
/// it room) took nothing new from anyone, however well its recovery lines up
/// with someone else's stall.
const MIN_RISE_OVER_USUAL_SCALES: f64 = 2.0;
/// The score a suspect must reach to be named by an event already open
/// (an `updated` row): well above what a neighbour that switches at random
/// reaches by chance over a look-back (`bench/detect/eval.py`'s decoy).
const MIN_NEW_SUSPECT_SCORE: f64 = 0.5;
/// Suspects ranked per event in `/metrics`.
const SUSPECTS_EXPORTED: usize = 3;
/// Suspects listed in an event's row.
const SUSPECTS_STORED: usize = 5;
/// The suspect that stands for the hypervisor in CPU rankings. Its usage is
/// the guest's steal time in CPUs: time the host gave our vCPUs' physical
/// cores to someone else, counted by the guest kernel itself.
pub const HYPERVISOR_SUSPECT: &str = "hypervisor";
/// The suspect that stands for CPU time the guest spends outside every leaf
/// cgroup the `cgroups` collector samples (processes in the root cgroup,
/// kernel threads, and cgroups include/exclude, max_depth or max_cgroups
/// leave out): the node's busy CPUs less what the sampled leaves used. Named,
/// it says the agent cannot tell whose load it is, rather than blaming the
/// host or a bystander; it does not say the load is in no workload.
pub const OUTSIDE_SUSPECT: &str = "unattributed: load outside the cgroups vtax samples";
/// Share of the node's CPU time the host must steal, over the seconds the
/// steal was high, before the hypervisor is named: the operator takes that
/// accusation to the cloud provider, and a guest loaded by itself sees a
/// little steal rise with its own load on almost any VM.
pub const MIN_HYPERVISOR_STEAL_RATIO: f64 = 0.01;
/// Share of a CPU signal's rise that the steal's rise must match before the
/// hypervisor is named for it: the steal must carry a material part of what
/// the victim lost, not only move with it.
const MIN_HYPERVISOR_SHARE: f64 = 0.25;

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
    /// Windows in a row far above the baseline, abnormal or not (a baseline
    /// still learning cannot call them abnormal): none is learned until
    /// `learn_abnormal_after_windows` of them say the level is the normal.
    deviating_run: u32,
    /// The first window of the current run of those: where an abnormal run
    /// that follows held windows began.
    deviating_since: Option<i64>,
    /// The start of the abnormal run judged the victim's own doing: not
    /// judged again while the run lasts.
    self_inflicted_since: Option<i64>,
    last_second: i64,
}

struct OpenEvent {
    start_second: i64,
    peak_score: f64,
    suspects: Vec<Suspect>,
    /// Every suspect the event has named first in a row of its own, at its
    /// best score while the event was open: the closing row lists them
    /// whatever the last look-back holds.
    named: BTreeMap<String, Suspect>,
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
    /// The suspect each of its `open` and `updated` rows named first, at the
    /// best score a row gave it: what the closing row must still name.
    pub named: Vec<Suspect>,
    pub evidence: String,
}

/// Whose usage a suspect is.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Pool {
    /// A cgroup's CPU time, in CPUs.
    Cgroup,
    /// A cgroup's block I/O, in MiB/s: the usage of I/O signals' suspects.
    /// CPU time would name whichever workload started with the stall,
    /// whatever it did.
    CgroupIo,
    GpuProcess,
    /// The host, through steal time: a suspect for CPU signals only.
    Hypervisor,
    /// CPU time outside every leaf cgroup ([`OUTSIDE_SUSPECT`]).
    Outside,
}

struct SuspectSeries {
    pool: Pool,
    /// The second it appeared: a cgroup's first in the rows (it may have had
    /// children then, and no usage of its own), a process's the second
    /// before its first usage.
    appeared: i64,
    seconds: VecDeque<(i64, f64)>,
    /// Its mean usage per window, learned while no event is open: what it
    /// usually uses. A suspect that appeared while its kind was watched
    /// starts with a zero for each window it did not exist.
    usual: RollingBaseline,
    /// Spans of seconds `[gone, back)` a cgroup was missing from the rows
    /// and then came back under the same path (a systemd timer's service,
    /// a cron job's scope), within its look-back: it used nothing then.
    absences: Vec<(i64, i64)>,
}

/// The detector's state.
pub struct Detector {
    config: DetectConfig,
    signals: BTreeMap<SignalKey, SignalState>,
    suspects: BTreeMap<String, SuspectSeries>,
    /// The same cgroups' block I/O ([`Pool::CgroupIo`]).
    io_suspects: BTreeMap<String, SuspectSeries>,
    /// Cgroups that have no child cgroup: only these are suspects, since a
    /// parent's usage holds its children's.
    leaf_cgroups: BTreeSet<String>,
    counters: HashMap<String, (i64, f64)>,
    open: BTreeMap<SignalKey, OpenEvent>,
    facts: Facts,
    jitter: Option<JitterWindow>,
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
    /// Every cgroup of the latest cgroup rows, with the second it first
    /// appeared in them: a suspect cgroup not among them is gone (its job
    /// ended), still a suspect of what it did. One that was there before it
    /// became a leaf (its children gone, or left out of the rows) is no
    /// newcomer: its seconds before are unknown, not zero.
    present_cgroups: BTreeMap<String, i64>,
    canary: Option<canary::CacheCanary>,
    last_canary_second: i64,
    /// Start of the oldest window not yet judged.
    next_window: Option<i64>,
    /// The tax's GPU ratios of each window not yet judged, by its start
    /// second: the tax gives their means over the window's seconds.
    gpu_tax: BTreeMap<i64, GpuTaxSums>,
    /// Start seconds of the windows not yet judged that some collector's row
    /// fell in: a window without one (the agent stopped, the VM paused) is
    /// judged for its events, but no tax, verdict or score row is written for
    /// it, as if it had been measured.
    observed_windows: BTreeSet<i64>,
    /// The tables of each source's last snapshot: a table its next snapshot
    /// lacks has ended (`Detector::observe_sent`).
    snapshot_tables: HashMap<std::sync::Arc<str>, BTreeSet<&'static str>>,
}

/// Sums of the tax's GPU ratios over a window's seconds.
#[derive(Clone, Copy, Default)]
struct GpuTaxSums {
    hbm_peak: MeanOf,
    nvlink_peak: MeanOf,
    pcie_bandwidth_loss: MeanOf,
    clock_throttle: MeanOf,
}

/// A running mean of the seconds that had a value.
#[derive(Clone, Copy, Default)]
struct MeanOf {
    sum: f64,
    seconds: u32,
}

impl MeanOf {
    fn add(&mut self, value: Option<f64>) {
        if let Some(v) = value {
            self.sum += v;
            self.seconds += 1;
        }
    }

    fn mean(self) -> Option<f64> {
        (self.seconds > 0).then(|| self.sum / f64::from(self.seconds))
    }
}

#[derive(Clone, Copy)]
struct JitterWindow {
    p99_seconds: f64,
    interrupted_ratio: Option<f64>,
    unexplained_ratio: Option<f64>,
    busy_ratio: Option<f64>,
    /// The window's end.
    end_us: i64,
    /// Its length, as the spacing from the window before it; unknown after
    /// the first.
    length_us: Option<i64>,
}

/// A jitter window's length before a second has shown it: the longest the
/// collector allows.
const JITTER_WINDOW_MAX_US: i64 = 3600 * 1_000_000;

impl JitterWindow {
    /// Whether it still speaks for the node at `now_us`: no later window came
    /// in two of its lengths (the probe was turned off, or fails), and the
    /// tax would carry its figures on for as long as the agent runs.
    fn current_at(&self, now_us: i64) -> bool {
        let length = self.length_us.unwrap_or(JITTER_WINDOW_MAX_US).max(1);
        now_us - self.end_us <= 2 * length
    }
}

/// The second a sample measures, by its start: collectors tick just after
/// whole seconds (the host collector a few milliseconds before: see
/// `Collector::lead`), and a tick at about `s` measures the second that
/// ends there, `s - 1` to `s`. So a window `[w, w + length)` of these
/// seconds is the wall time from `w` to `w + length`, which its rows are
/// stamped with: labelled by the nearest second, a tick's second went to
/// the window after, and every row covered the second before its window.
fn second_of(time_us: i64) -> i64 {
    (time_us + 500_000).div_euclid(1_000_000) - 1
}

impl Detector {
    pub fn new(config: DetectConfig) -> Self {
        let canary = config.cache_canary.then(canary::CacheCanary::new);
        Detector {
            config,
            signals: BTreeMap::new(),
            suspects: BTreeMap::new(),
            io_suspects: BTreeMap::new(),
            leaf_cgroups: BTreeSet::new(),
            counters: HashMap::new(),
            open: BTreeMap::new(),
            facts: Facts::default(),
            jitter: None,
            node_cpus: None,
            node_busy: VecDeque::new(),
            leaf_busy: VecDeque::new(),
            cgroups_watched_since: None,
            gpus_watched_since: None,
            present_cgroups: BTreeMap::new(),
            canary,
            last_canary_second: i64::MIN,
            next_window: None,
            gpu_tax: BTreeMap::new(),
            observed_windows: BTreeSet::new(),
            snapshot_tables: HashMap::new(),
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
                named: event.named.into_iter().fold(
                    named_first(&event.suspects),
                    |mut named, suspect| {
                        keep_best(&mut named, suspect);
                        named
                    },
                ),
                suspects: event.suspects,
                evidence: event.evidence,
                last_judged_second: now_second,
            },
        );
        true
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
            deviating_run: 0,
            deviating_since: None,
            self_inflicted_since: None,
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
        let mut deviates = false;
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
                let learned = summary.map_or(0, |s| s.windows as u64);
                // Half a baseline tells a level far above it: a neighbour
                // that arrives while the victim's baseline is still learning
                // is held out of it, not learned as its normal (learned, the
                // stall it caused became the victim's median, and no event
                // ever opened).
                deviates = learned >= (config.min_baseline_windows / 2).max(3)
                    && z >= config.z_open
                    && change >= least;
                // Held windows count towards the baseline's length: the
                // level has lasted as long as a baseline takes to learn.
                let ready = learned >= config.min_baseline_windows
                    || (deviates
                        && learned + u64::from(self.deviating_run) + 1
                            >= config.min_baseline_windows);
                (
                    z,
                    ready && deviates,
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
        // This window is the (deviating_run + 1)-th far above the baseline
        // in a row.
        let learn = !deviates || self.deviating_run + 1 >= config.learn_abnormal_after_windows;
        if matches!(self.spec.rule, Rule::Baseline { .. }) && learn {
            self.baseline.push(value);
        }
        if deviates {
            if self.deviating_run == 0 {
                self.deviating_since = Some(window);
            }
            self.deviating_run += 1;
        } else {
            self.deviating_run = 0;
            self.deviating_since = None;
        }
        if abnormal {
            if self.abnormal_run == 0 {
                // An event starts where its level began, held windows of a
                // baseline still learning included: ranked from a later
                // start, the antagonist's onset fell out of the look-back.
                self.abnormal_since = self.deviating_since.or(Some(window));
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
            // A window held out of a baseline still learning is stored as
            // abnormal too, so a restart's relearning leaves it out as well.
            abnormal: abnormal || deviates,
        })
    }
}

/// The mean of the values of `series` (in second order) whose second falls
/// in `seconds`; `None` when none does.
fn mean_over(series: &VecDeque<(i64, f64)>, seconds: std::ops::Range<i64>) -> Option<f64> {
    let (sum, n) = series
        .iter()
        .rev()
        .take_while(|(second, _)| *second >= seconds.start)
        .filter(|(second, _)| *second < seconds.end)
        .fold((0.0, 0usize), |(sum, n), (_, v)| (sum + v, n + 1));
    (n > 0).then(|| sum / n as f64)
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
