//! Where the collector learns whether a GPU is idle, and what measures it:
//! NVML and the CUDA driver on a real node, the probe's fake engine on
//! simulated GPUs and in the tests.

use std::collections::HashMap;

use crate::gpu;

use crate::gpu_probe::engine::facts::{self, GpuFacts};
use crate::gpu_probe::engine::fake::{simulated_bus_id, simulated_facts, FakeEngine};
use crate::gpu_probe::engine::{Engine, ProbeError};

/// What one GPU is doing now, as NVML says.
#[derive(Clone, Debug, PartialEq)]
pub struct Activity {
    /// NVML's index.
    pub index: u32,
    /// Normalised PCI bus id ([`facts::normalise_bus_id`]): how CUDA's
    /// GPUs are matched to NVML's.
    pub pci_bus_id: String,
    /// Utilisation over NVML's last sample period, 0 to 1; `None` when the
    /// read failed.
    pub utilization_ratio: Option<f64>,
    /// Compute processes holding a context on it; `None` when the read failed.
    pub compute_processes: Option<usize>,
}

impl Activity {
    /// Why the GPU is not idle, or `None` when it is: no compute process and
    /// 0 utilisation, both read. A read that failed counts as busy.
    pub fn busy_reason(&self) -> Option<String> {
        match (self.compute_processes, self.utilization_ratio) {
            (Some(0), Some(0.0)) => None,
            (Some(n), _) if n > 0 => Some(format!(
                "{n} compute process{} on it",
                if n == 1 { "" } else { "es" }
            )),
            (None, _) => Some("its compute processes could not be read".into()),
            (_, Some(u)) => Some(format!("{:.0}% utilised", u * 100.0)),
            (_, None) => Some("its utilisation could not be read".into()),
        }
    }
}

/// The GPUs the collector watches and probes. Shared with the probe
/// thread, which asks again just before measuring each GPU.
pub trait Source: Send + Sync {
    /// Every GPU with what it is doing; an error when NVML is not there.
    fn activity(&self) -> Result<Vec<Activity>, String>;
    /// A measuring engine, made on the probe thread and dropped at its end
    /// (its contexts and memory with it).
    fn engine(&self) -> Result<Box<dyn Engine>, ProbeError>;
    /// The links and memory each GPU's peaks come from, by bus id.
    fn facts(&self) -> Result<HashMap<String, GpuFacts>, String>;
}

/// NVML for activity and facts, the CUDA driver for measuring.
pub struct NvmlSource;

impl Source for NvmlSource {
    fn activity(&self) -> Result<Vec<Activity>, String> {
        let nvml = crate::gpu::nvml::load()?;
        let count = nvml
            .device_count()
            .map_err(|e| format!("NVML could not count the GPUs: {e}"))?;
        let mut gpus = Vec::with_capacity(count as usize);
        for index in 0..count {
            let Ok(d) = nvml.device_by_index(index) else {
                continue;
            };
            let Some(pci_bus_id) = d
                .pci_info()
                .ok()
                .and_then(|p| facts::normalise_bus_id(&p.bus_id))
            else {
                continue;
            };
            gpus.push(Activity {
                index,
                pci_bus_id,
                utilization_ratio: d.utilization_rates().ok().map(|u| f64::from(u.gpu) / 100.0),
                compute_processes: gpu::nvml_fallback::processes(nvml, &d, gpu::nvml_fallback::ProcessList::Compute)
                    .ok()
                    .map(|p| p.len()),
            });
        }
        Ok(gpus)
    }

    fn engine(&self) -> Result<Box<dyn Engine>, ProbeError> {
        Ok(Box::new(crate::gpu_probe::engine::cuda::CudaEngine::new()?))
    }

    fn facts(&self) -> Result<HashMap<String, GpuFacts>, String> {
        facts::read_nvml()
    }
}

/// `n` simulated H100 SXMs, idle, measured by the probe's fake engine
/// (`--simulate-gpus N`).
pub struct SimulatedSource {
    /// How many.
    pub gpus: u32,
}

impl Source for SimulatedSource {
    fn activity(&self) -> Result<Vec<Activity>, String> {
        Ok((0..self.gpus)
            .map(|index| Activity {
                index,
                pci_bus_id: simulated_bus_id(index),
                utilization_ratio: Some(0.0),
                compute_processes: Some(0),
            })
            .collect())
    }

    fn engine(&self) -> Result<Box<dyn Engine>, ProbeError> {
        Ok(Box::new(FakeEngine::simulated(self.gpus)))
    }

    fn facts(&self) -> Result<HashMap<String, GpuFacts>, String> {
        Ok(simulated_facts(self.gpus))
    }
}
