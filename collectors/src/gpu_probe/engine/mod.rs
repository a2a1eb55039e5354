//! The GPU transfer probe: what a copy to, from and between GPUs actually
//! gets, and how long an empty kernel takes to launch, each set against its
//! peak. NVML reports the link a GPU trained to; a hypervisor, an IOMMU
//! without ATS or a PCIe fallback shows only in what a transfer achieves.
//!
//! The measuring is an [`Engine`]: [`cuda::CudaEngine`] loads the CUDA driver
//! (`libcuda.so.1`) at run time, so the agent builds and runs without a CUDA
//! toolkit or a GPU; [`fake::FakeEngine`] returns configured timings and
//! errors, for the tests and `vtax probe-gpu --simulate-gpus N`. The peaks come
//! from NVML ([`facts`]) and the ratios from pure functions ([`peaks`]).
//!
//! Every figure is the median of its repetitions, after warm-up ones that are
//! not counted; a bandwidth is the bytes copied over the median copy time,
//! except device to device, which counts the HBM traffic: a copy reads and
//! writes every byte, so 2 × bytes over the time, comparable with the HBM
//! peak. `bench/gpu/probe_vs_torch.py` times the same copies the same way
//! with PyTorch.
//!
//! [`probe`] measures one GPU at a time and then each ordered pair, and a GPU
//! that fails (a driver call failing half-way) is reported with its error
//! while the others are measured: a collector can call [`Engine::measure`]
//! for one GPU with its own sizes and store the plain [`GpuFigures`].

pub mod cuda;
pub mod facts;
pub mod fake;
pub mod peaks;
pub mod render;

use serde::Serialize;

/// How much the probe copies and how often.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Sizes {
    /// Bytes of each large copy (host↔device, device→device, peer).
    pub copy_bytes: u64,
    /// Timed repetitions of each large copy.
    pub repeats: u32,
    /// Untimed (uncounted) copies before the timed ones.
    pub warmup: u32,
    /// Timed repetitions of the small round trip and of the kernel launch.
    pub latency_repeats: u32,
}

/// 256 MiB a copy: long enough (milliseconds at PCIe speeds, 0.1 ms at HBM
/// speeds) that the copy's fixed cost is under 1% of its time.
pub const DEFAULT_COPY_BYTES: u64 = 256 << 20;
/// Timed repetitions of each large copy.
pub const DEFAULT_REPEATS: u32 = 10;
/// Warm-up copies before the timed ones.
pub const DEFAULT_WARMUP: u32 = 2;
/// Timed launches and round trips.
pub const DEFAULT_LATENCY_REPEATS: u32 = 200;
/// Bytes of the small round trip's copy each way.
pub const SMALL_COPY_BYTES: u64 = 4;

impl Default for Sizes {
    fn default() -> Self {
        Sizes {
            copy_bytes: DEFAULT_COPY_BYTES,
            repeats: DEFAULT_REPEATS,
            warmup: DEFAULT_WARMUP,
            latency_repeats: DEFAULT_LATENCY_REPEATS,
        }
    }
}

/// A GPU as the CUDA driver lists it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct CudaGpu {
    /// The driver's ordinal (affected by `CUDA_VISIBLE_DEVICES` and
    /// `CUDA_DEVICE_ORDER`; NVML's index is not).
    pub ordinal: u32,
    /// Product name.
    pub name: String,
    /// PCI bus id, normalised by [`facts::normalise_bus_id`].
    pub pci_bus_id: String,
}

/// What one GPU's measurements gave.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct GpuFigures {
    /// Host→device, pinned host memory: bytes / median copy time.
    pub host_to_device_bytes_per_second: f64,
    /// Device→host, pinned host memory.
    pub device_to_host_bytes_per_second: f64,
    /// 4 bytes host→device then device→host, synchronised: median, host-timed.
    pub small_copy_round_trip_seconds: f64,
    /// One empty kernel launched and waited for: median, host-timed.
    pub kernel_launch_seconds: f64,
    /// The same launch between two events on the stream: median, event-timed.
    pub kernel_launch_event_seconds: f64,
    /// Device→device within the GPU as HBM traffic: 2 × bytes / median copy time.
    pub device_to_device_bytes_per_second: f64,
    /// Sum of the event-timed intervals, warm-ups included.
    pub gpu_busy_seconds: f64,
}

/// A copy from one GPU to another.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(tag = "outcome", rename_all = "snake_case")]
pub enum PeerOutcome {
    /// Measured: bytes / median copy time.
    Measured {
        /// The bandwidth.
        bytes_per_second: f64,
        /// Sum of its event-timed intervals.
        gpu_busy_seconds: f64,
    },
    /// The driver does not allow peer access between them (a copy would be
    /// staged through host memory, which is not what this measures).
    NoPeerAccess,
}

/// Why the probe could not measure.
#[derive(Debug, thiserror::Error, Clone, PartialEq)]
pub enum ProbeError {
    /// `libcuda.so.1` is not there or lacks an entry point.
    #[error("no CUDA driver: {0}")]
    NoDriver(String),
    /// A driver call returned an error.
    #[error("{call} failed: {name} ({description})")]
    Call {
        /// The entry point, e.g. `cuMemAlloc_v2`.
        call: &'static str,
        /// The driver's error name, e.g. `CUDA_ERROR_OUT_OF_MEMORY`.
        name: String,
        /// The driver's sentence for it.
        description: String,
    },
    /// Anything else (a GPU that is not there, a size too large).
    #[error("{0}")]
    Other(String),
}

/// What measures: the CUDA driver, or a fake.
pub trait Engine {
    /// The GPUs the driver sees. An error here is the whole probe's.
    fn gpus(&mut self) -> Result<Vec<CudaGpu>, ProbeError>;
    /// Measures one GPU (by driver ordinal).
    fn measure(&mut self, ordinal: u32, sizes: &Sizes) -> Result<GpuFigures, ProbeError>;
    /// Measures copies from `src` to `dst` (driver ordinals).
    fn measure_peer(
        &mut self,
        src: u32,
        dst: u32,
        sizes: &Sizes,
    ) -> Result<PeerOutcome, ProbeError>;
}

/// One GPU's result.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct GpuResult {
    /// The GPU.
    pub gpu: CudaGpu,
    /// Its figures, or why there are none.
    #[serde(serialize_with = "ser_result")]
    pub figures: Result<GpuFigures, ProbeError>,
}

/// One ordered pair's result.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct PeerResult {
    /// Driver ordinal of the GPU copied from.
    pub src: u32,
    /// Driver ordinal of the GPU copied to.
    pub dst: u32,
    /// What the copy got, or why it was not measured.
    #[serde(serialize_with = "ser_result")]
    pub outcome: Result<PeerOutcome, ProbeError>,
}

/// What the probe cost the node.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct ProbeCost {
    /// Wall-clock time of the whole probe.
    pub wall_seconds: f64,
    /// Sum of the event-timed intervals of every GPU and pair.
    pub gpu_busy_seconds: f64,
    /// CPU time of the probing thread (`CLOCK_THREAD_CPUTIME_ID`): waits
    /// on the GPU spin or sleep as the driver chooses.
    pub thread_cpu_seconds: f64,
    /// CPU time of the whole process over the probe, the driver's own
    /// threads included.
    pub process_cpu_seconds: f64,
}

/// Everything one probe found.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Probe {
    /// The sizes it ran with.
    pub sizes: Sizes,
    /// Each GPU measured.
    pub gpus: Vec<GpuResult>,
    /// Each ordered pair of the GPUs measured.
    pub peers: Vec<PeerResult>,
    /// What it cost.
    pub cost: ProbeCost,
}

fn ser_result<T: Serialize, S: serde::Serializer>(
    r: &Result<T, ProbeError>,
    s: S,
) -> Result<S::Ok, S::Error> {
    #[derive(Serialize)]
    struct Failed<'a> {
        error: &'a str,
    }
    match r {
        Ok(v) => v.serialize(s),
        Err(e) => Failed {
            error: &e.to_string(),
        }
        .serialize(s),
    }
}

/// Measures the chosen GPUs (driver ordinals; all when `None`), then each
/// ordered pair of them. A GPU whose measuring fails keeps its error and the
/// rest go on.
pub fn probe(
    engine: &mut dyn Engine,
    only: Option<&[u32]>,
    sizes: &Sizes,
) -> Result<Probe, ProbeError> {
    let wall = std::time::Instant::now();
    let thread_cpu = crate::jitter::thread_cpu_ns();
    let process_cpu = process_cpu_ns();
    let listed = engine.gpus()?;
    let chosen: Vec<CudaGpu> = match only {
        None => listed,
        Some(ordinals) => {
            for o in ordinals {
                if !listed.iter().any(|g| g.ordinal == *o) {
                    return Err(ProbeError::Other(format!(
                        "no GPU {o}: the driver lists {}",
                        listed.len()
                    )));
                }
            }
            listed
                .into_iter()
                .filter(|g| ordinals.contains(&g.ordinal))
                .collect()
        }
    };
    let mut gpus = Vec::with_capacity(chosen.len());
    for gpu in chosen {
        let figures = engine.measure(gpu.ordinal, sizes);
        gpus.push(GpuResult { gpu, figures });
    }
    // Pairs only between GPUs that measured: a failed GPU would fail each of its pairs again.
    let good: Vec<u32> = gpus
        .iter()
        .filter(|g| g.figures.is_ok())
        .map(|g| g.gpu.ordinal)
        .collect();
    let mut peers = Vec::new();
    for (src, dst) in ordered_pairs(&good) {
        let outcome = engine.measure_peer(src, dst, sizes);
        peers.push(PeerResult { src, dst, outcome });
    }
    let gpu_busy_seconds = gpus
        .iter()
        .filter_map(|g| g.figures.as_ref().ok())
        .map(|f| f.gpu_busy_seconds)
        .chain(peers.iter().filter_map(|p| match &p.outcome {
            Ok(PeerOutcome::Measured {
                gpu_busy_seconds, ..
            }) => Some(*gpu_busy_seconds),
            _ => None,
        }))
        .sum();
    let cost = ProbeCost {
        wall_seconds: wall.elapsed().as_secs_f64(),
        gpu_busy_seconds,
        thread_cpu_seconds: seconds_between(thread_cpu, crate::jitter::thread_cpu_ns()),
        process_cpu_seconds: seconds_between(process_cpu, process_cpu_ns()),
    };
    Ok(Probe {
        sizes: *sizes,
        gpus,
        peers,
        cost,
    })
}

/// Every ordered pair of distinct GPUs, in order: (0,1), (0,2), (1,0), …
pub fn ordered_pairs(ordinals: &[u32]) -> Vec<(u32, u32)> {
    let mut pairs = Vec::new();
    for &src in ordinals {
        for &dst in ordinals {
            if src != dst {
                pairs.push((src, dst));
            }
        }
    }
    pairs
}

/// The median: the middle value, or the mean of the two middle ones. `None` for none.
pub fn median(values: &[f64]) -> Option<f64> {
    if values.is_empty() {
        return None;
    }
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    let mid = sorted.len() / 2;
    Some(if sorted.len() % 2 == 1 {
        sorted[mid]
    } else {
        (sorted[mid - 1] + sorted[mid]) / 2.0
    })
}

fn seconds_between(start_ns: u64, end_ns: u64) -> f64 {
    end_ns.saturating_sub(start_ns) as f64 / 1e9
}

/// CPU time of the whole process.
fn process_cpu_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: ts is a valid timespec to write to.
    unsafe { libc::clock_gettime(libc::CLOCK_PROCESS_CPUTIME_ID, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// Probes the GPUs asked for (by the report's numbering: NVML's index where
/// NVML knows the GPU) and sets the figures against their peaks.
pub fn probe_and_report(
    engine: &mut dyn Engine,
    facts: Result<std::collections::HashMap<String, facts::GpuFacts>, String>,
    only: Option<&[u32]>,
    sizes: &Sizes,
) -> anyhow::Result<render::Report> {
    let ordinals = match only {
        None => None,
        Some(wanted) => {
            let listed = engine.gpus()?;
            let shown = |g: &CudaGpu| {
                facts
                    .as_ref()
                    .ok()
                    .and_then(|f| f.get(&g.pci_bus_id))
                    .map_or(g.ordinal, |f| f.nvml_index)
            };
            let mut ordinals = Vec::new();
            for w in wanted {
                match listed.iter().find(|g| shown(g) == *w) {
                    Some(g) => ordinals.push(g.ordinal),
                    None if listed.is_empty() => {
                        anyhow::bail!("no GPU {w}: the CUDA driver sees no GPU")
                    }
                    None => anyhow::bail!(
                        "no GPU {w}: the CUDA driver sees GPU {}",
                        listed
                            .iter()
                            .map(|g| shown(g).to_string())
                            .collect::<Vec<_>>()
                            .join(", ")
                    ),
                }
            }
            Some(ordinals)
        }
    };
    let probe = probe(engine, ordinals.as_deref(), sizes)?;
    Ok(render::Report::new(&probe, &facts))
}

#[cfg(test)]
mod tests;
