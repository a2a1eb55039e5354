//! `gpu_probe`: the transfer probe ([`engine`]) run by the agent
//! on GPUs nobody is using, so that what a copy to, from and between GPUs
//! gets is measured on every node without taking from a job.
//!
//! Each tick reads from NVML whether each GPU is idle: no compute process
//! and 0 utilisation. A GPU idle for `idle_secs` (by the ticks' clock), and
//! not probed for `period_secs`, is due. The due GPUs are measured together
//! on a probe thread of their own, never on the tick's: creating contexts
//! and copying takes about a second, the tick is a second. The thread
//! makes its engine (the CUDA driver's contexts, buffers and pinned memory)
//! and drops it when it ends, so between probes the agent holds nothing on
//! any GPU. Just before measuring each GPU, and each pair, the thread asks
//! NVML again: a GPU that became busy since the tick saw it idle is left
//! alone and counted as `busy`. No probe starts while one runs.
//!
//! The next tick after the thread ends turns what it found into rows:
//! `gpu_probe` per GPU, `gpu_probe_peer` per ordered pair with peer access,
//! and `gpu_probe_outcome`, the probes counted by outcome, so that a probe
//! that could not measure shows as a count and a reason (in the log),
//! never as a zero figure. `/metrics` keeps each GPU's latest figures
//! between probes ([`Collector::exposed`]).

pub mod engine;
mod source;
mod tables;

pub use source::{NvmlSource, SimulatedSource, Source};
pub use tables::*;

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Instant;

use serde::{Deserialize, Serialize};
use vtax_store::{Batch, BatchBuilder};

use super::{Availability, Collector, Roots};
use crate::gpu_probe::engine::facts::GpuFacts;
use crate::gpu_probe::engine::{peaks, GpuFigures, PeerOutcome, ProbeError, Sizes};

/// Name of the probe thread.
pub const THREAD_NAME: &str = "vtax-gpu-probe";

/// Default seconds between two idleness reads: NVML's utilisation and
/// process list cost a few hundredths of a millisecond a GPU.
pub const DEFAULT_INTERVAL_SECS: f64 = 5.0;
/// Default idle time before a GPU is probed: long enough that a job between
/// two steps, or a scheduler's health check, is not taken for idle.
pub const DEFAULT_IDLE_SECS: u64 = 300;
/// Default least time between two probes of a GPU.
pub const DEFAULT_PERIOD_SECS: u64 = 3600;

/// `[collectors.gpu_probe]`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct GpuProbeConfig {
    /// Whether the collector runs.
    pub enabled: bool,
    /// Seconds between two reads of whether each GPU is idle.
    pub interval_secs: f64,
    /// Seconds a GPU must have been idle before it is probed.
    pub idle_secs: u64,
    /// Least seconds between two probes of one GPU.
    pub period_secs: u64,
    /// Bytes of each large copy.
    pub copy_bytes: u64,
    /// Timed repetitions of each large copy.
    pub repeats: u32,
    /// Untimed copies before the timed ones.
    pub warmup: u32,
    /// Timed kernel launches and small round trips.
    pub latency_repeats: u32,
    /// Whether each ordered pair of the GPUs probed together is measured too.
    pub peers: bool,
    /// Simulated idle GPUs instead of NVML and the CUDA driver.
    pub simulate_gpus: u32,
}

impl Default for GpuProbeConfig {
    fn default() -> Self {
        let sizes = Sizes::default();
        GpuProbeConfig {
            enabled: false,
            interval_secs: DEFAULT_INTERVAL_SECS,
            idle_secs: DEFAULT_IDLE_SECS,
            period_secs: DEFAULT_PERIOD_SECS,
            copy_bytes: sizes.copy_bytes,
            repeats: sizes.repeats,
            warmup: sizes.warmup,
            latency_repeats: sizes.latency_repeats,
            peers: true,
            simulate_gpus: 0,
        }
    }
}

crate::common_settings!(GpuProbeConfig);

impl crate::Registered for GpuProbeConfig {
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
        Box::new(GpuProbe::new(self, roots))
    }
}

impl GpuProbeConfig {
    /// The probe's sizes.
    pub fn sizes(&self) -> Sizes {
        Sizes {
            copy_bytes: self.copy_bytes,
            repeats: self.repeats,
            warmup: self.warmup,
            latency_repeats: self.latency_repeats,
        }
    }

    fn source(&self) -> Arc<dyn Source> {
        if self.simulate_gpus > 0 {
            Arc::new(SimulatedSource {
                gpus: self.simulate_gpus,
            })
        } else {
            Arc::new(NvmlSource)
        }
    }
}

/// Ranges of this collector's own numeric keys.
pub static KEY_RANGES: crate::keys::KeyRanges = &[
    (
        "idle_secs",
        crate::keys::KeyRange::between(0.0, 604_800.0),
    ),
    (
        "period_secs",
        crate::keys::KeyRange::between(60.0, 2_592_000.0),
    ),
    (
        "copy_bytes",
        crate::keys::KeyRange::between(1_048_576.0, 4_294_967_296.0),
    ),
    ("repeats", crate::keys::KeyRange::between(1.0, 1000.0)),
    ("warmup", crate::keys::KeyRange::between(0.0, 100.0)),
    (
        "latency_repeats",
        crate::keys::KeyRange::between(1.0, 100_000.0),
    ),
    ("simulate_gpus", crate::keys::KeyRange::between(0.0, 64.0)),
];

/// Comments for this collector's own keys in the example config.
pub static KEY_DOCS: &[(&str, &str)] = &[
    (
        "idle_secs",
        "Seconds a GPU must have had no compute process and 0 utilisation, at every read, before it is probed. Off by default (enabled = false): a probe holds about 2 × copy_bytes of GPU memory, pinned host memory and the copy engines for about a second, and a job that starts in that second on a GPU in exclusive-process compute mode fails to get its context.",
    ),
    (
        "period_secs",
        "Least seconds between two probes of one GPU, whatever their outcome.",
    ),
    (
        "copy_bytes",
        "Bytes of each large copy (host to device, device to host, within the GPU, peer to peer): the GPU holds two buffers of it while it is probed.",
    ),
    (
        "repeats",
        "Timed repetitions of each large copy; each figure is their median.",
    ),
    ("warmup", "Uncounted copies before the timed ones."),
    (
        "latency_repeats",
        "Timed empty-kernel launches and small round trips; each figure is their median.",
    ),
    (
        "peers",
        "Also measure each ordered pair of the GPUs probed together, where the driver allows peer access (NVLink or PCIe).",
    ),
    (
        "simulate_gpus",
        "Probe this many simulated, idle H100 SXMs instead of the real GPUs (also --simulate-gpus N); 0 probes the real ones.",
    ),
];

/// Why a GPU due for a probe was not measured.
#[derive(Clone, Debug, PartialEq)]
pub enum Failure {
    /// It was busy again when its turn came.
    Busy(String),
    /// The CUDA driver could not be loaded.
    NoDriver(String),
    /// A driver call failed, or CUDA does not list the GPU.
    Failed(String),
}

impl Failure {
    /// The `outcome` tag.
    pub fn outcome(&self) -> &'static str {
        match self {
            Failure::Busy(_) => "busy",
            Failure::NoDriver(_) => "no_driver",
            Failure::Failed(_) => "failed",
        }
    }

    fn from_error(e: &ProbeError) -> Failure {
        match e {
            ProbeError::NoDriver(_) => Failure::NoDriver(e.to_string()),
            _ => Failure::Failed(e.to_string()),
        }
    }
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Failure::Busy(why) => write!(f, "busy when its turn came ({why}), left alone"),
            Failure::NoDriver(why) | Failure::Failed(why) => f.write_str(why),
        }
    }
}

/// Every `outcome` tag, in the order rows are written.
pub const OUTCOMES: &[&str] = &["measured", "busy", "no_driver", "failed"];

/// What measuring one GPU gave.
#[derive(Clone, Debug, PartialEq)]
pub struct Measured {
    /// The engine's figures.
    pub figures: GpuFigures,
    /// Wall-clock time of the measuring, its context's creation included.
    pub wall_seconds: f64,
    /// CPU time of the probing thread over it.
    pub cpu_seconds: f64,
}

/// One GPU's part of a probe.
#[derive(Clone, Debug, PartialEq)]
pub struct GpuOutcome {
    /// NVML's index.
    pub index: u32,
    /// Its figures, or why there are none.
    pub result: Result<Measured, Failure>,
}

/// One ordered pair's part of a probe.
#[derive(Clone, Debug, PartialEq)]
pub struct PairOutcome {
    /// NVML index of the GPU copied from.
    pub src: u32,
    /// NVML index of the GPU copied to.
    pub dst: u32,
    /// What the copy got (`None`: the pair has no peer access), or why it
    /// was not measured.
    pub result: Result<Option<(f64, f64)>, Failure>,
}

/// What one probe found: every GPU it was started for, in index order.
#[derive(Clone, Debug, PartialEq)]
pub struct Finished {
    /// Each GPU.
    pub gpus: Vec<GpuOutcome>,
    /// Each ordered pair of the GPUs measured.
    pub pairs: Vec<PairOutcome>,
    /// NVML's facts for the peaks, or why there are none.
    pub facts: Result<HashMap<String, GpuFacts>, String>,
    /// Bus ids by NVML index, as the tick saw them.
    pub buses: BTreeMap<u32, String>,
}

/// Measures the GPUs `due` (NVML index and bus id) on the calling thread:
/// makes an engine, asks `source` again whether each GPU is idle just
/// before measuring it, and drops the engine at the end.
pub fn run_probe(
    source: &dyn Source,
    due: &BTreeMap<u32, String>,
    sizes: &Sizes,
    peers: bool,
) -> Finished {
    let facts = source.facts();
    let fail_all = |failure: Failure| Finished {
        gpus: due
            .keys()
            .map(|&index| GpuOutcome {
                index,
                result: Err(failure.clone()),
            })
            .collect(),
        pairs: Vec::new(),
        facts: facts.clone(),
        buses: due.clone(),
    };
    let mut engine = match source.engine() {
        Ok(engine) => engine,
        Err(e) => return fail_all(Failure::from_error(&e)),
    };
    let listed = match engine.gpus() {
        Ok(listed) => listed,
        Err(e) => return fail_all(Failure::from_error(&e)),
    };
    // Idle now? Asked again just before each GPU and pair; an NVML that
    // stopped answering leaves every GPU alone.
    let busy_now = |indices: &[u32]| -> Option<String> {
        let activity = match source.activity() {
            Ok(a) => a,
            Err(e) => return Some(e),
        };
        indices
            .iter()
            .find_map(|i| match activity.iter().find(|a| a.index == *i) {
                Some(a) => a.busy_reason().map(|why| {
                    if indices.len() > 1 {
                        format!("GPU {i}: {why}")
                    } else {
                        why
                    }
                }),
                None => Some(format!("NVML no longer lists GPU {i}")),
            })
    };
    let mut ordinals: BTreeMap<u32, u32> = BTreeMap::new();
    let mut gpus = Vec::with_capacity(due.len());
    for (&index, bus) in due {
        let Some(cuda) = listed.iter().find(|g| &g.pci_bus_id == bus) else {
            gpus.push(GpuOutcome {
                index,
                result: Err(Failure::Failed(format!(
                    "the CUDA driver does not list the GPU at {bus} (CUDA_VISIBLE_DEVICES?)"
                ))),
            });
            continue;
        };
        if let Some(why) = busy_now(&[index]) {
            gpus.push(GpuOutcome {
                index,
                result: Err(Failure::Busy(why)),
            });
            continue;
        }
        let wall = Instant::now();
        let cpu = crate::jitter::thread_cpu_ns();
        let result = engine.measure(cuda.ordinal, sizes);
        let measured = result.map(|figures| Measured {
            figures,
            wall_seconds: wall.elapsed().as_secs_f64(),
            cpu_seconds: crate::jitter::thread_cpu_ns().saturating_sub(cpu) as f64
                / 1e9,
        });
        if measured.is_ok() {
            ordinals.insert(index, cuda.ordinal);
        }
        gpus.push(GpuOutcome {
            index,
            result: measured.map_err(|e| Failure::from_error(&e)),
        });
    }
    let mut pairs = Vec::new();
    if peers {
        let measured: Vec<u32> = ordinals.keys().copied().collect();
        for (src, dst) in crate::gpu_probe::engine::ordered_pairs(&measured) {
            let result = match busy_now(&[src, dst]) {
                Some(why) => Err(Failure::Busy(why)),
                None => match engine.measure_peer(ordinals[&src], ordinals[&dst], sizes) {
                    Ok(PeerOutcome::Measured {
                        bytes_per_second,
                        gpu_busy_seconds,
                    }) => Ok(Some((bytes_per_second, gpu_busy_seconds))),
                    Ok(PeerOutcome::NoPeerAccess) => Ok(None),
                    Err(e) => Err(Failure::from_error(&e)),
                },
            };
            pairs.push(PairOutcome { src, dst, result });
        }
    }
    drop(engine);
    Finished {
        gpus,
        pairs,
        facts,
        buses: due.clone(),
    }
}

/// What the collector remembers of one GPU.
#[derive(Clone, Debug, Default)]
struct GpuState {
    /// When the ticks first saw it idle, this stretch; `None` while busy.
    idle_since_us: Option<i64>,
    /// When a probe last started on it (whatever its outcome, but busy).
    last_probe_us: Option<i64>,
    /// `last_probe_us` before the probe running now started on it.
    previous_probe_us: Option<i64>,
}

/// The `gpu_probe` collector.
pub struct GpuProbe {
    config: GpuProbeConfig,
    source: Arc<dyn Source>,
    gpus: BTreeMap<u32, GpuState>,
    /// The probe running, if one is.
    job: Option<JoinHandle<Finished>>,
    /// Probes by GPU and outcome since the agent started.
    counts: BTreeMap<(u32, &'static str), u64>,
    /// Why each GPU's last probe failed, while it has not measured since.
    failures: BTreeMap<u32, String>,
    /// Each GPU's latest figures and each pair's, for `/metrics`.
    latest: BTreeMap<u32, Arc<Batch>>,
    latest_pairs: BTreeMap<(u32, u32), Arc<Batch>>,
    /// The outcome counters as of the last tick.
    counters: Option<Arc<Batch>>,
    /// A probe thread that could not be started, for the doctor.
    spawn_error: Option<String>,
}

impl GpuProbe {
    /// A collector over NVML and the CUDA driver, or simulated GPUs.
    pub fn new(config: &GpuProbeConfig, _roots: &Roots) -> Self {
        Self::with_source(config, config.source())
    }

    /// A collector over `source`.
    pub fn with_source(config: &GpuProbeConfig, source: Arc<dyn Source>) -> Self {
        GpuProbe {
            config: config.clone(),
            source,
            gpus: BTreeMap::new(),
            job: None,
            counts: BTreeMap::new(),
            failures: BTreeMap::new(),
            latest: BTreeMap::new(),
            latest_pairs: BTreeMap::new(),
            counters: None,
            spawn_error: None,
        }
    }

    /// Whether a probe is running.
    #[cfg(test)]
    pub fn probing(&self) -> bool {
        self.job.is_some()
    }

    /// Waits for the running probe's thread to end, so that the next tick
    /// harvests it (tests; a generous deadline for a loaded machine).
    #[cfg(test)]
    pub fn wait_for_probe(&self) {
        let deadline = Instant::now() + std::time::Duration::from_secs(60);
        while self.job.as_ref().is_some_and(|j| !j.is_finished()) {
            assert!(Instant::now() < deadline, "the probe thread did not end");
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
    }

    /// The rows of a finished probe, counting its outcomes.
    fn harvest(&mut self, finished: Finished, time_us: i64) -> anyhow::Result<Vec<Batch>> {
        let empty = HashMap::new();
        let facts = finished.facts.as_ref().unwrap_or(&empty);
        let fact = |index: u32| finished.buses.get(&index).and_then(|b| facts.get(b));
        let mut out = Vec::new();
        for g in &finished.gpus {
            let outcome = match &g.result {
                Ok(_) => "measured",
                Err(f) => f.outcome(),
            };
            *self.counts.entry((g.index, outcome)).or_default() += 1;
            let m = match &g.result {
                Ok(m) => m,
                Err(failure) => {
                    // Left alone because busy: it waits idle_secs again, not a period.
                    if let (Failure::Busy(_), Some(state)) = (failure, self.gpus.get_mut(&g.index))
                    {
                        state.last_probe_us = state.previous_probe_us;
                        state.idle_since_us = None;
                    }
                    let text = failure.to_string();
                    // Logged when the reason starts or changes, not at every period.
                    if self.failures.get(&g.index) != Some(&text) {
                        match failure {
                            Failure::Busy(_) => {
                                tracing::info!(gpu = g.index, reason = %text, "GPU transfer probe skipped; it waits idle_secs again.")
                            }
                            _ => {
                                tracing::warn!(gpu = g.index, error = %text, "GPU transfer probe failed; tried again after period_secs.")
                            }
                        }
                    }
                    self.failures.insert(g.index, text);
                    continue;
                }
            };
            self.failures.remove(&g.index);
            let f = &m.figures;
            let host = fact(g.index).and_then(peaks::host_peak);
            let hbm = fact(g.index).and_then(peaks::hbm_peak);
            let peak = |p: &Option<peaks::Peak>| p.as_ref().map(|p| p.bytes_per_second);
            let gpu = g.index.to_string();
            let mut rows = BatchBuilder::new(&GPU_PROBE);
            rows.push_row(
                time_us,
                &GpuProbeRow {
                    gpu: &gpu,
                    host_to_device_bytes_per_second: f.host_to_device_bytes_per_second,
                    host_to_device_peak_bytes_per_second: peak(&host),
                    host_to_device_ratio: peaks::ratio(
                        f.host_to_device_bytes_per_second,
                        host.as_ref(),
                    ),
                    device_to_host_bytes_per_second: f.device_to_host_bytes_per_second,
                    device_to_host_peak_bytes_per_second: peak(&host),
                    device_to_host_ratio: peaks::ratio(
                        f.device_to_host_bytes_per_second,
                        host.as_ref(),
                    ),
                    device_to_device_bytes_per_second: f.device_to_device_bytes_per_second,
                    device_to_device_peak_bytes_per_second: peak(&hbm),
                    device_to_device_ratio: peaks::ratio(
                        f.device_to_device_bytes_per_second,
                        hbm.as_ref(),
                    ),
                    small_copy_round_trip_seconds: f.small_copy_round_trip_seconds,
                    kernel_launch_seconds: f.kernel_launch_seconds,
                    kernel_launch_event_seconds: f.kernel_launch_event_seconds,
                    probe_wall_seconds: m.wall_seconds,
                    probe_gpu_busy_seconds: f.gpu_busy_seconds,
                    probe_cpu_seconds: m.cpu_seconds,
                },
            )?;
            let batch = rows.finish();
            self.latest.insert(g.index, Arc::new(batch.clone()));
            out.push(batch);
        }
        let gpu_buses: Vec<&str> = facts.keys().map(String::as_str).collect();
        for p in &finished.pairs {
            let (bytes_per_second, gpu_busy_seconds) = match &p.result {
                Ok(Some(measured)) => *measured,
                Ok(None) => continue,
                Err(failure) => {
                    self.failures.insert(
                        p.src,
                        format!("copies to GPU {} not measured: {failure}", p.dst),
                    );
                    continue;
                }
            };
            let peak = match (fact(p.src), fact(p.dst), finished.buses.get(&p.dst)) {
                (Some(s), Some(d), Some(dst_bus)) => peaks::peer_peak(s, d, dst_bus, &gpu_buses),
                _ => None,
            };
            let (gpu, peer) = (p.src.to_string(), p.dst.to_string());
            let mut rows = BatchBuilder::new(&GPU_PROBE_PEER);
            rows.push_row(
                time_us,
                &GpuProbePeerRow {
                    gpu: &gpu,
                    peer: &peer,
                    peer_to_peer_bytes_per_second: bytes_per_second,
                    peer_to_peer_peak_bytes_per_second: peak.as_ref().map(|p| p.bytes_per_second),
                    peer_to_peer_ratio: peaks::ratio(bytes_per_second, peak.as_ref()),
                    gpu_busy_seconds,
                },
            )?;
            let batch = rows.finish();
            self.latest_pairs
                .insert((p.src, p.dst), Arc::new(batch.clone()));
            out.push(batch);
        }
        Ok(out)
    }

    /// The outcome counters of every GPU seen, every outcome from 0.
    fn counter_rows(&self, time_us: i64) -> anyhow::Result<Batch> {
        let mut rows = BatchBuilder::new(&GPU_PROBE_OUTCOME);
        for &index in self.gpus.keys() {
            let gpu = index.to_string();
            for &outcome in OUTCOMES {
                rows.push_row(
                    time_us,
                    &GpuProbeOutcomeRow {
                        gpu: &gpu,
                        outcome,
                        probes: self.counts.get(&(index, outcome)).copied().unwrap_or(0),
                    },
                )?;
            }
        }
        Ok(rows.finish())
    }
}

impl Collector for GpuProbe {
    fn name(&self) -> &'static str {
        "gpu_probe"
    }

    fn probe(&mut self) -> Availability {
        match self.source.activity() {
            Ok(gpus) if gpus.is_empty() => Availability::Absent("NVML lists no GPU".into()),
            Ok(gpus) => Availability::Available(format!(
                "{} GPU{}, each probed after {} s idle, at most once every {} s",
                gpus.len(),
                if gpus.len() == 1 { "" } else { "s" },
                self.config.idle_secs,
                self.config.period_secs
            )),
            Err(e) => Availability::Absent(e),
        }
    }

    fn collect(&mut self, time_us: i64) -> anyhow::Result<Vec<Batch>> {
        let mut out = Vec::new();
        let mut changed = self.counters.is_none();
        if self.job.as_ref().is_some_and(JoinHandle::is_finished) {
            let job = self.job.take().expect("checked");
            match job.join() {
                Ok(finished) => out.extend(self.harvest(finished, time_us)?),
                Err(_) => {
                    self.spawn_error = Some("the probe thread panicked".into());
                }
            }
            changed = true;
        }
        let activity = self
            .source
            .activity()
            .map_err(|e| anyhow::anyhow!("reading whether the GPUs are idle: {e}"))?;
        let idle_us = self.config.idle_secs as i64 * 1_000_000;
        let period_us = self.config.period_secs as i64 * 1_000_000;
        let mut due = BTreeMap::new();
        let before = self.gpus.len();
        self.gpus
            .retain(|i, _| activity.iter().any(|a| a.index == *i));
        changed |= self.gpus.len() != before;
        for a in &activity {
            let state = self.gpus.entry(a.index).or_insert_with(|| {
                changed = true;
                GpuState::default()
            });
            if a.busy_reason().is_some() {
                state.idle_since_us = None;
                continue;
            }
            let since = *state.idle_since_us.get_or_insert(time_us);
            let idle_long_enough = time_us - since >= idle_us;
            let period_over = state
                .last_probe_us
                .is_none_or(|last| time_us - last >= period_us);
            if idle_long_enough && period_over {
                due.insert(a.index, a.pci_bus_id.clone());
            }
        }
        if !due.is_empty() && self.job.is_none() {
            for index in due.keys() {
                let state = self.gpus.get_mut(index).expect("inserted above");
                state.previous_probe_us = state.last_probe_us;
                state.last_probe_us = Some(time_us);
            }
            let source = Arc::clone(&self.source);
            let sizes = self.config.sizes();
            let peers = self.config.peers;
            let spawned = std::thread::Builder::new()
                .name(THREAD_NAME.into())
                .spawn(move || run_probe(source.as_ref(), &due, &sizes, peers));
            match spawned {
                Ok(job) => {
                    self.job = Some(job);
                    self.spawn_error = None;
                }
                Err(e) => self.spawn_error = Some(format!("could not start the probe thread: {e}")),
            }
        }
        if changed {
            let counters = self.counter_rows(time_us)?;
            self.counters = Some(Arc::new(counters.clone()));
            out.push(counters);
        }
        Ok(out)
    }

    fn problems(&self) -> Vec<String> {
        let mut problems: Vec<String> = self
            .failures
            .iter()
            .map(|(gpu, why)| format!("GPU {gpu}: the transfer probe did not measure: {why}"))
            .collect();
        problems.extend(self.spawn_error.clone());
        problems
    }

    fn exposed(&self) -> Option<Vec<Arc<Batch>>> {
        Some(
            self.latest
                .values()
                .chain(self.latest_pairs.values())
                .chain(self.counters.iter())
                .cloned()
                .collect(),
        )
    }

    fn take_over(&mut self, previous: Box<dyn Collector>) {
        let Ok(previous) = previous.into_any().downcast::<GpuProbe>() else {
            return;
        };
        let previous = *previous;
        self.counts = previous.counts;
        self.failures = previous.failures;
        self.latest = previous.latest;
        self.latest_pairs = previous.latest_pairs;
        self.counters = previous.counters;
        // A probe still running is this collector's to wait for: none starts beside it.
        self.job = previous.job;
        for (index, state) in previous.gpus {
            self.gpus.insert(index, state);
        }
    }
}

#[cfg(test)]
mod tests;
