//! The collector's idleness rule, rows and counters, on a fake source and
//! the probe's fake engine: no GPU, no driver.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};

use super::source::Activity;
use super::*;
use crate::testutil::{f64s, tags, u64s};
use crate::gpu_probe::engine::fake::{simulated_facts, FakeEngine};
use crate::gpu_probe::engine::{CudaGpu, Engine};
use vtax_store::TableDef;

const SECOND: i64 = 1_000_000;
const START: i64 = 1_763_766_000 * SECOND;

/// A gate the fake engine waits at before measuring, while closed.
#[derive(Default)]
struct Gate {
    closed: Mutex<bool>,
    opened: Condvar,
}

impl Gate {
    fn set(&self, closed: bool) {
        *self.closed.lock().unwrap() = closed;
        self.opened.notify_all();
    }

    fn pass(&self) {
        let mut closed = self.closed.lock().unwrap();
        while *closed {
            closed = self.opened.wait(closed).unwrap();
        }
    }
}

/// What the fake source's engines saw, shared with the test.
#[derive(Default)]
struct Seen {
    /// Engines made so far.
    made: AtomicUsize,
    /// Engines not yet dropped.
    live: AtomicUsize,
    /// Every measurement asked for: `gpu 0`, `peer 0->1` (driver ordinals).
    calls: Mutex<Vec<String>>,
}

/// The fake engine, counted, and waiting at the gate.
struct CountedEngine {
    inner: FakeEngine,
    seen: Arc<Seen>,
    gate: Arc<Gate>,
}

impl Engine for CountedEngine {
    fn gpus(&mut self) -> Result<Vec<CudaGpu>, ProbeError> {
        self.inner.gpus()
    }
    fn measure(&mut self, ordinal: u32, sizes: &Sizes) -> Result<GpuFigures, ProbeError> {
        self.gate.pass();
        self.seen
            .calls
            .lock()
            .unwrap()
            .push(format!("gpu {ordinal}"));
        self.inner.measure(ordinal, sizes)
    }
    fn measure_peer(
        &mut self,
        src: u32,
        dst: u32,
        sizes: &Sizes,
    ) -> Result<PeerOutcome, ProbeError> {
        self.seen
            .calls
            .lock()
            .unwrap()
            .push(format!("peer {src}->{dst}"));
        self.inner.measure_peer(src, dst, sizes)
    }
}

impl Drop for CountedEngine {
    fn drop(&mut self) {
        self.seen.live.fetch_sub(1, Ordering::SeqCst);
    }
}

type Hook = Box<dyn FnMut(&mut Vec<Activity>) + Send>;

/// Simulated H100s whose activity the test sets, with a hook run when the
/// probe thread makes its engine: what changes between the tick that saw a
/// GPU idle and the probe's start.
struct FakeSource {
    activity: Mutex<Vec<Activity>>,
    engine: FakeEngine,
    engine_error: Option<ProbeError>,
    facts: HashMap<String, GpuFacts>,
    on_engine: Mutex<Option<Hook>>,
    seen: Arc<Seen>,
    gate: Arc<Gate>,
}

impl FakeSource {
    fn new(n: u32) -> Arc<FakeSource> {
        Arc::new(FakeSource {
            activity: Mutex::new(SimulatedSource { gpus: n }.activity().unwrap()),
            engine: FakeEngine::simulated(n),
            engine_error: None,
            facts: simulated_facts(n),
            on_engine: Mutex::new(None),
            seen: Arc::default(),
            gate: Arc::default(),
        })
    }

    fn set_busy(&self, index: u32, processes: usize, utilization: f64) {
        let mut activity = self.activity.lock().unwrap();
        let a = activity.iter_mut().find(|a| a.index == index).unwrap();
        a.compute_processes = Some(processes);
        a.utilization_ratio = Some(utilization);
    }

    fn made(&self) -> usize {
        self.seen.made.load(Ordering::SeqCst)
    }

    fn calls(&self) -> Vec<String> {
        self.seen.calls.lock().unwrap().clone()
    }
}

impl Source for FakeSource {
    fn activity(&self) -> Result<Vec<Activity>, String> {
        Ok(self.activity.lock().unwrap().clone())
    }

    fn engine(&self) -> Result<Box<dyn Engine>, ProbeError> {
        if let Some(hook) = self.on_engine.lock().unwrap().as_mut() {
            hook(&mut self.activity.lock().unwrap());
        }
        if let Some(e) = &self.engine_error {
            return Err(e.clone());
        }
        self.seen.made.fetch_add(1, Ordering::SeqCst);
        self.seen.live.fetch_add(1, Ordering::SeqCst);
        Ok(Box::new(CountedEngine {
            inner: self.engine.clone(),
            seen: Arc::clone(&self.seen),
            gate: Arc::clone(&self.gate),
        }))
    }

    fn facts(&self) -> Result<HashMap<String, GpuFacts>, String> {
        Ok(self.facts.clone())
    }
}

fn config() -> GpuProbeConfig {
    GpuProbeConfig {
        enabled: true,
        idle_secs: 300,
        period_secs: 3600,
        ..GpuProbeConfig::default()
    }
}

fn collector(source: &Arc<FakeSource>, config: &GpuProbeConfig) -> GpuProbe {
    let mut c = GpuProbe::with_source(config, Arc::clone(source) as Arc<dyn Source>);
    assert!(matches!(c.probe(), Availability::Available(_)));
    c
}

fn table<'a>(batches: &'a [Batch], def: &TableDef) -> Vec<&'a Batch> {
    batches
        .iter()
        .filter(|b| b.table.name == def.name)
        .collect()
}

/// Probes counted by `gpu/outcome`, non-zero only, from a tick's rows.
fn counted(batches: &[Batch]) -> Vec<String> {
    let mut out = Vec::new();
    for b in table(batches, &GPU_PROBE_OUTCOME) {
        let (gpus, outcomes, n) = (tags(b, "gpu"), tags(b, "outcome"), u64s(b, "probes"));
        for i in 0..b.len() {
            if n[i] != Some(0) {
                out.push(format!("{}/{} {}", gpus[i], outcomes[i], n[i].unwrap()));
            }
        }
    }
    out
}

/// Waits for `done`, with a deadline generous for a loaded machine.
fn wait_until(done: impl Fn() -> bool) {
    let deadline = Instant::now() + std::time::Duration::from_secs(60);
    while !done() {
        assert!(Instant::now() < deadline, "not done in 60 s");
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
}

/// Ticks every `step` seconds from `from` to `to` (both included), waiting
/// for each probe started to end so the next tick harvests it; every row.
fn tick(c: &mut GpuProbe, from: i64, to: i64, step: i64) -> Vec<Batch> {
    let mut out = Vec::new();
    let mut t = from;
    while t <= to {
        out.extend(c.collect(START + t * SECOND).unwrap());
        c.wait_for_probe();
        t += step;
    }
    out
}

#[test]
fn a_busy_gpu_is_never_probed() {
    let source = FakeSource::new(2);
    source.set_busy(0, 1, 0.0);
    source.set_busy(1, 0, 0.37);
    let mut c = collector(&source, &config());
    let rows = tick(&mut c, 0, 3 * 3600, 60);
    assert_eq!(source.made(), 0, "no engine, no context on a busy GPU");
    assert!(source.calls().is_empty());
    assert!(table(&rows, &GPU_PROBE).is_empty());
    assert!(counted(&rows).is_empty(), "{:?}", counted(&rows));
    // Both GPUs' counters are there, at 0, from the first tick.
    let first = c.collect(START).unwrap();
    assert!(first.is_empty(), "counters are written when they change");
    let shown = c.exposed().unwrap();
    let counters: Vec<&Arc<Batch>> = shown
        .iter()
        .filter(|b| b.table.name == "gpu_probe_outcome")
        .collect();
    assert_eq!(counters.len(), 1);
    assert_eq!(counters[0].len(), 2 * OUTCOMES.len());
}

#[test]
fn an_idle_gpu_is_probed_once_after_idle_secs_and_not_again_before_the_period() {
    let source = FakeSource::new(1);
    let mut c = collector(&source, &config());
    // Idle from the first tick on: not yet at 299 s.
    let rows = tick(&mut c, 0, 299, 1);
    assert_eq!(source.made(), 0);
    assert!(table(&rows, &GPU_PROBE).is_empty());
    // Due at 300 s: measured on the probe thread, harvested at the next tick.
    assert!(c.collect(START + 300 * SECOND).unwrap().is_empty());
    assert!(c.probing());
    c.wait_for_probe();
    let rows = c.collect(START + 301 * SECOND).unwrap();
    assert_eq!(source.made(), 1);
    assert_eq!(
        source.seen.live.load(Ordering::SeqCst),
        0,
        "the engine and its contexts are dropped after the probe"
    );
    assert_eq!(source.calls(), ["gpu 0"]);
    assert_eq!(table(&rows, &GPU_PROBE).len(), 1);
    assert_eq!(counted(&rows), ["0/measured 1"]);
    // Still idle, but the period (from the probe's start) is not over.
    let rows = tick(&mut c, 302, 300 + 3599, 1);
    assert_eq!(source.made(), 1, "not again before period_secs");
    assert!(table(&rows, &GPU_PROBE).is_empty());
    let rows = tick(&mut c, 300 + 3600, 300 + 3601, 1);
    assert_eq!(source.made(), 2);
    assert_eq!(table(&rows, &GPU_PROBE).len(), 1);
    assert_eq!(counted(&rows), ["0/measured 2"]);
}

#[test]
fn busy_for_a_moment_restarts_the_idle_wait() {
    let source = FakeSource::new(1);
    let mut c = collector(&source, &config());
    tick(&mut c, 0, 200, 10);
    source.set_busy(0, 0, 0.05);
    tick(&mut c, 210, 210, 10);
    source.set_busy(0, 0, 0.0);
    // Idle again from 220 s: due at 520 s, not at 300 s.
    tick(&mut c, 220, 510, 10);
    assert_eq!(source.made(), 0);
    tick(&mut c, 520, 530, 10);
    assert_eq!(source.made(), 1);
}

#[test]
fn a_gpu_turning_busy_just_before_the_start_is_left_alone() {
    let source = FakeSource::new(2);
    *source.on_engine.lock().unwrap() = Some(Box::new(|activity: &mut Vec<Activity>| {
        activity[0].compute_processes = Some(1);
    }));
    let mut c = collector(&source, &config());
    let rows = tick(&mut c, 0, 301, 1);
    assert_eq!(
        source.calls(),
        ["gpu 1"],
        "GPU 0 is not measured, nor its pairs"
    );
    let probed = table(&rows, &GPU_PROBE);
    assert_eq!(probed.len(), 1);
    assert_eq!(tags(probed[0], "gpu"), ["1"]);
    assert_eq!(counted(&rows), ["0/busy 1", "1/measured 1"]);
    let problems = c.problems();
    assert_eq!(problems.len(), 1, "{problems:?}");
    assert!(
        problems[0].contains("GPU 0") && problems[0].contains("1 compute process"),
        "{problems:?}"
    );
    // Left alone, it waits idle_secs again once idle, not a whole period.
    *source.on_engine.lock().unwrap() = None;
    source.set_busy(0, 0, 0.0);
    tick(&mut c, 302, 601, 1);
    assert_eq!(source.calls(), ["gpu 1"], "idle again only from 302 s");
    let rows = tick(&mut c, 602, 603, 1);
    assert_eq!(source.calls(), ["gpu 1", "gpu 0"]);
    assert_eq!(counted(&rows), ["0/measured 1", "0/busy 1", "1/measured 1"]);
    assert!(c.problems().is_empty(), "{:?}", c.problems());
}

#[test]
fn no_probe_starts_while_one_runs() {
    let source = FakeSource::new(2);
    source.set_busy(1, 1, 1.0);
    source.gate.set(true);
    let mut c = collector(&source, &config());
    tick(&mut c, 0, 299, 10);
    c.collect(START + 300 * SECOND).unwrap();
    assert!(c.probing());
    wait_until(|| source.made() == 1);
    // GPU 1 goes idle and becomes due while GPU 0's probe is held at the gate.
    source.set_busy(1, 0, 0.0);
    for t in (310..=700).step_by(10) {
        c.collect(START + t * SECOND).unwrap();
    }
    assert_eq!(source.made(), 1, "no second probe beside the running one");
    source.gate.set(false);
    c.wait_for_probe();
    let rows = c.collect(START + 710 * SECOND).unwrap();
    assert_eq!(counted(&rows), ["0/measured 1"]);
    assert!(
        c.probing(),
        "GPU 1's probe starts at the tick that harvested"
    );
    c.wait_for_probe();
    let rows = c.collect(START + 720 * SECOND).unwrap();
    assert_eq!(source.made(), 2);
    assert_eq!(counted(&rows), ["0/measured 1", "1/measured 1"]);
    assert_eq!(source.calls(), ["gpu 0", "gpu 1"]);
}

#[test]
fn rows_hold_each_figure_against_its_peak() {
    let source = FakeSource::new(2);
    let mut c = collector(&source, &config());
    let rows = tick(&mut c, 0, 301, 1);
    let probed = table(&rows, &GPU_PROBE);
    assert_eq!(probed.len(), 2);
    let row = probed[0];
    assert_eq!(tags(row, "gpu"), ["0"]);
    let one = |field: &str| f64s(row, field)[0];
    let gen5_x16 = 16.0 * 3.938e9;
    let hbm = 5120.0 / 8.0 * 2619e6 * 2.0;
    let close = |a: Option<f64>, b: f64| a.is_some_and(|a| (a - b).abs() <= 1e-9 * b.abs());
    assert!(close(one("host_to_device_bytes_per_second"), 53.6e9));
    assert!(close(one("host_to_device_peak_bytes_per_second"), gen5_x16));
    assert!(close(one("host_to_device_ratio"), 53.6e9 / gen5_x16));
    assert!(close(one("device_to_host_ratio"), 52.9e9 / gen5_x16));
    assert!(close(one("device_to_device_peak_bytes_per_second"), hbm));
    assert!(close(one("device_to_device_ratio"), 2.62e12 / hbm));
    assert!(close(one("kernel_launch_seconds"), 6.8e-6));
    assert!(close(one("small_copy_round_trip_seconds"), 19.5e-6));
    assert!(one("probe_gpu_busy_seconds").unwrap() > 0.0);
    assert!(one("probe_wall_seconds").unwrap() >= 0.0);
    assert!(one("probe_cpu_seconds").unwrap() >= 0.0);
    // Both ordered pairs, over 18 NVLink links to the switch at 25 GB/s each way.
    let peers = table(&rows, &GPU_PROBE_PEER);
    assert_eq!(peers.len(), 2);
    assert_eq!(tags(peers[0], "gpu"), ["0"]);
    assert_eq!(tags(peers[0], "peer"), ["1"]);
    assert!(close(
        f64s(peers[0], "peer_to_peer_peak_bytes_per_second")[0],
        450e9
    ));
    assert!(close(
        f64s(peers[0], "peer_to_peer_ratio")[0],
        372e9 / 450e9
    ));
    assert_eq!(source.calls(), ["gpu 0", "gpu 1", "peer 0->1", "peer 1->0"]);
}

#[test]
fn figures_without_a_peak_have_no_ratio_and_no_peer_access_has_no_row() {
    let mut source = FakeSource::new(2);
    let s = Arc::get_mut(&mut source).unwrap();
    s.facts.clear();
    s.engine.peers.clear();
    let mut c = collector(&source, &config());
    let rows = tick(&mut c, 0, 301, 1);
    let row = table(&rows, &GPU_PROBE)[0];
    assert_eq!(f64s(row, "host_to_device_ratio"), [None]);
    assert_eq!(f64s(row, "host_to_device_peak_bytes_per_second"), [None]);
    assert!(f64s(row, "host_to_device_bytes_per_second")[0].is_some());
    assert!(table(&rows, &GPU_PROBE_PEER).is_empty());
    assert_eq!(source.calls(), ["gpu 0", "gpu 1", "peer 0->1", "peer 1->0"]);
    assert!(c.problems().is_empty());
}

#[test]
fn a_probe_that_cannot_run_is_counted_with_its_reason_and_leaves_no_figure() {
    let mut source = FakeSource::new(1);
    Arc::get_mut(&mut source).unwrap().engine_error = Some(ProbeError::NoDriver(
        "libcuda.so.1: cannot open shared object file".into(),
    ));
    let mut c = collector(&source, &config());
    let rows = tick(&mut c, 0, 301, 1);
    assert!(table(&rows, &GPU_PROBE).is_empty());
    assert_eq!(counted(&rows), ["0/no_driver 1"]);
    let problems = c.problems();
    assert!(
        problems.len() == 1 && problems[0].contains("no CUDA driver: libcuda.so.1"),
        "{problems:?}"
    );
    // Tried again a period later, not at every tick.
    tick(&mut c, 302, 3899, 1);
    assert_eq!(
        counted(&c.collect(START + 3900 * SECOND).unwrap()),
        Vec::<String>::new()
    );
    c.wait_for_probe();
    assert_eq!(
        counted(&c.collect(START + 3901 * SECOND).unwrap()),
        ["0/no_driver 2"]
    );

    // A GPU failing half-way counts as failed; the other is measured.
    let mut source = FakeSource::new(2);
    Arc::get_mut(&mut source).unwrap().engine.gpus[1].figures = Err(ProbeError::Call {
        call: "cuMemAlloc_v2",
        name: "CUDA_ERROR_OUT_OF_MEMORY".into(),
        description: "out of memory".into(),
    });
    let mut c = collector(&source, &config());
    let rows = tick(&mut c, 0, 301, 1);
    assert_eq!(counted(&rows), ["0/measured 1", "1/failed 1"]);
    assert_eq!(table(&rows, &GPU_PROBE).len(), 1);
    assert!(
        c.problems()[0].contains("CUDA_ERROR_OUT_OF_MEMORY"),
        "{:?}",
        c.problems()
    );
}

#[test]
fn metrics_keep_the_latest_figures_between_probes() {
    let source = FakeSource::new(2);
    let mut c = collector(&source, &config());
    tick(&mut c, 0, 301, 1);
    let rows = tick(&mut c, 302, 400, 1);
    assert!(rows.is_empty(), "nothing new to store");
    let shown = c.exposed().unwrap();
    let names: Vec<&str> = shown.iter().map(|b| b.table.name).collect();
    assert_eq!(
        names,
        [
            "gpu_probe",
            "gpu_probe",
            "gpu_probe_peer",
            "gpu_probe_peer",
            "gpu_probe_outcome"
        ]
    );
}

#[test]
fn metrics_carry_their_units_and_promtool_accepts_them() {
    let source = FakeSource::new(2);
    let mut c = collector(&source, &config());
    tick(&mut c, 0, 301, 1);
    let exposition = vtax_exporters::Exposition::new(TABLES);
    exposition.update("gpu_probe", c.exposed().unwrap());
    let text = exposition.body(vtax_exporters::Format::Text, false);
    let text = String::from_utf8(text.to_vec()).unwrap();
    for name in [
        "vtax_gpu_probe_host_to_device_bytes_per_second{gpu=\"0\"} 53600000000",
        "vtax_gpu_probe_host_to_device_ratio{gpu=\"0\"} 0.85",
        "vtax_gpu_probe_device_to_host_peak_bytes_per_second{gpu=\"1\"} 63008000000",
        "vtax_gpu_probe_device_to_device_ratio{gpu=\"0\"} 0.",
        "vtax_gpu_probe_kernel_launch_seconds{gpu=\"0\"} 0.0000068",
        "vtax_gpu_probe_wall_seconds{gpu=\"0\"} ",
        "vtax_gpu_probe_gpu_busy_seconds{gpu=\"0\"} ",
        "vtax_gpu_probe_cpu_seconds{gpu=\"0\"} ",
        "vtax_gpu_probe_peer_to_peer_bytes_per_second{gpu=\"0\",peer=\"1\"} 372000000000",
        "vtax_gpu_probe_peer_to_peer_ratio{gpu=\"1\",peer=\"0\"} 0.82",
        "vtax_gpu_probe_outcome_probes_total{gpu=\"0\",outcome=\"measured\"} 1",
        "vtax_gpu_probe_outcome_probes_total{gpu=\"1\",outcome=\"busy\"} 0",
    ] {
        assert!(text.contains(name), "{name} missing from:\n{text}");
    }
    assert_eq!(vtax_tests::promtool_complaints(&text), "");
}

#[test]
fn a_reload_carries_counts_figures_and_schedule_on() {
    let source = FakeSource::new(1);
    let mut old = collector(&source, &config());
    tick(&mut old, 0, 301, 1);
    let mut new = collector(&source, &config());
    new.take_over(Box::new(old));
    let rows = tick(&mut new, 302, 3000, 10);
    assert_eq!(source.made(), 1, "the period runs on across the reload");
    assert!(rows.is_empty());
    let shown = new.exposed().unwrap();
    assert_eq!(shown[0].table.name, "gpu_probe");
    let counters = shown
        .iter()
        .find(|b| b.table.name == "gpu_probe_outcome")
        .unwrap();
    assert_eq!(counted(&[(**counters).clone()]), ["0/measured 1"]);
}

#[test]
fn simulated_gpus_are_probed_through_the_built_collector() {
    let mut config = crate::CollectorsConfig::default();
    config.gpu_probe.simulate_gpus = 2;
    config.gpu_probe.idle_secs = 0;
    let mut c = config
        .build("gpu_probe", &crate::Roots::default())
        .unwrap();
    assert!(matches!(c.probe(), Availability::Available(_)));
    c.collect(START).unwrap();
    // The thread is the collector's own; wait on what it leaves.
    let deadline = Instant::now() + std::time::Duration::from_secs(60);
    let mut rows = Vec::new();
    let mut t = START;
    while table(&rows, &GPU_PROBE).is_empty() {
        assert!(
            Instant::now() < deadline,
            "no rows from the simulated probe"
        );
        std::thread::sleep(std::time::Duration::from_millis(10));
        t += SECOND;
        rows.extend(c.collect(t).unwrap());
    }
    assert_eq!(table(&rows, &GPU_PROBE).len(), 2);
    assert_eq!(table(&rows, &GPU_PROBE_PEER).len(), 2);
}
