//! A fake probe engine: configured figures and errors, no driver. It drives
//! the tests and `vtax probe-gpu --simulate-gpus N`, which plays H100 SXMs
//! behind an NVSwitch on PCIe Gen5 x16, with figures of the size a bare
//! machine gives (not a measurement of any).

use std::collections::HashMap;

use super::facts::GpuFacts;
use super::{CudaGpu, Engine, GpuFigures, PeerOutcome, ProbeError, Sizes};

/// What a fake GPU answers.
#[derive(Clone, Debug)]
pub struct FakeGpu {
    /// Its listing.
    pub gpu: CudaGpu,
    /// What measuring it returns.
    pub figures: Result<GpuFigures, ProbeError>,
}

/// A fake engine: GPUs, pairs, and the calls it was asked for. Its GPU
/// time is what the figures would take at the sizes asked.
#[derive(Clone, Debug, Default)]
pub struct FakeEngine {
    /// The GPUs, or the error listing them gives (a missing driver).
    pub gpus: Vec<FakeGpu>,
    /// Set: [`Engine::gpus`] fails with it.
    pub listing_error: Option<ProbeError>,
    /// Each ordered pair's outcome; a pair not here has no peer access.
    pub peers: HashMap<(u32, u32), Result<PeerOutcome, ProbeError>>,
    /// Every measurement asked for, in order: `gpu 0`, `peer 0->1`.
    pub calls: Vec<String>,
    /// The sizes each measurement was asked with.
    pub sizes_seen: Vec<Sizes>,
}

/// The bus id of simulated GPU `i`.
pub fn simulated_bus_id(i: u32) -> String {
    format!("00000000:{:02x}:00.0", 0x18 + 0x10 * (i % 14))
}

/// The bus id of the simulated NVSwitch every simulated GPU's links reach.
const SIMULATED_SWITCH_BUS_ID: &str = "00000000:05:00.0";

/// Figures of an H100 SXM on a bare Gen5 x16 host, for simulation.
pub fn h100_figures() -> GpuFigures {
    GpuFigures {
        host_to_device_bytes_per_second: 53.6e9,
        device_to_host_bytes_per_second: 52.9e9,
        small_copy_round_trip_seconds: 19.5e-6,
        kernel_launch_seconds: 6.8e-6,
        kernel_launch_event_seconds: 2.4e-6,
        device_to_device_bytes_per_second: 2.62e12,
        gpu_busy_seconds: 0.0,
    }
}

/// The GPU time the CUDA engine's event-timed intervals would add up to for
/// these figures and sizes: every copy, warm-ups included, and the
/// event-timed launches.
fn busy_seconds(f: &GpuFigures, sizes: &Sizes) -> f64 {
    let copies = f64::from(sizes.warmup + sizes.repeats);
    let bytes = sizes.copy_bytes as f64;
    let launches = f64::from(sizes.warmup.max(1) * 10 + sizes.latency_repeats);
    copies
        * (bytes / f.host_to_device_bytes_per_second
            + bytes / f.device_to_host_bytes_per_second
            + 2.0 * bytes / f.device_to_device_bytes_per_second)
        + launches * f.kernel_launch_event_seconds
}

impl FakeEngine {
    /// `n` simulated H100 SXMs, every pair with peer access over NVLink.
    pub fn simulated(n: u32) -> FakeEngine {
        let mut engine = FakeEngine::default();
        for ordinal in 0..n {
            engine.gpus.push(FakeGpu {
                gpu: CudaGpu {
                    ordinal,
                    name: "NVIDIA H100 80GB HBM3 (simulated)".into(),
                    pci_bus_id: simulated_bus_id(ordinal),
                },
                figures: Ok(h100_figures()),
            });
        }
        for (src, dst) in super::ordered_pairs(&(0..n).collect::<Vec<_>>()) {
            engine.peers.insert(
                (src, dst),
                Ok(PeerOutcome::Measured {
                    bytes_per_second: 372e9,
                    gpu_busy_seconds: 0.0,
                }),
            );
        }
        engine
    }
}

/// NVML's facts of `n` simulated H100 SXMs: Gen5 x16 (idling at Gen1), the
/// collector's H100 HBM peak, 18 NVLink links to an NVSwitch.
pub fn simulated_facts(n: u32) -> HashMap<String, GpuFacts> {
    (0..n)
        .map(|i| {
            (
                simulated_bus_id(i),
                GpuFacts {
                    nvml_index: i,
                    architecture: "hopper".into(),
                    pcie_link_gen_max: Some(5),
                    pcie_link_width_max: Some(16),
                    pcie_link_gen_current: Some(1),
                    pcie_link_width_current: Some(16),
                    // 5120 bits at 2619 MHz, double data rate: what the collector computes for an H100 SXM.
                    hbm_peak_bytes_per_second: Some(5120.0 / 8.0 * 2619e6 * 2.0),
                    nvlinks_up: vec![Some(SIMULATED_SWITCH_BUS_ID.into()); 18],
                },
            )
        })
        .collect()
}

impl Engine for FakeEngine {
    fn gpus(&mut self) -> Result<Vec<CudaGpu>, ProbeError> {
        if let Some(e) = &self.listing_error {
            return Err(e.clone());
        }
        Ok(self.gpus.iter().map(|g| g.gpu.clone()).collect())
    }

    fn measure(&mut self, ordinal: u32, sizes: &Sizes) -> Result<GpuFigures, ProbeError> {
        self.calls.push(format!("gpu {ordinal}"));
        self.sizes_seen.push(*sizes);
        self.gpus
            .iter()
            .find(|g| g.gpu.ordinal == ordinal)
            .map(|g| g.figures.clone())
            .unwrap_or_else(|| Err(ProbeError::Other(format!("no GPU {ordinal}"))))
            .map(|f| GpuFigures {
                gpu_busy_seconds: busy_seconds(&f, sizes),
                ..f
            })
    }

    fn measure_peer(
        &mut self,
        src: u32,
        dst: u32,
        sizes: &Sizes,
    ) -> Result<PeerOutcome, ProbeError> {
        self.calls.push(format!("peer {src}->{dst}"));
        self.sizes_seen.push(*sizes);
        self.peers
            .get(&(src, dst))
            .cloned()
            .unwrap_or(Ok(PeerOutcome::NoPeerAccess))
            .map(|outcome| match outcome {
                PeerOutcome::Measured {
                    bytes_per_second, ..
                } => PeerOutcome::Measured {
                    bytes_per_second,
                    gpu_busy_seconds: f64::from(sizes.warmup + sizes.repeats)
                        * sizes.copy_bytes as f64
                        / bytes_per_second,
                },
                other => other,
            })
    }
}
