//! `[collectors.gpu]`: the collector's settings, their ranges and their
//! comments in the example config.

use std::path::Path;

use serde::{Deserialize, Serialize};

use super::backend::GpuBackend;
use super::{nvml, sim};

/// `[collectors.gpu]`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct GpuConfig {
    /// Whether the collector runs.
    pub enabled: bool,
    /// Seconds between two reads.
    pub interval_secs: f64,
    /// Whether to read GPM metrics (Hopper and newer).
    pub gpm: bool,
    /// Whether to list the processes on each GPU and their owners.
    pub processes: bool,
    /// Seconds between two reads of the exact energy counter; the power
    /// readings are integrated in between. At or below `interval_secs`:
    /// every tick.
    pub energy_interval_secs: f64,
    /// Seconds between two reads of the exact energy counter on a GPU that
    /// has been quiet since the last one; at or below
    /// `energy_interval_secs`: the same cadence as a GPU at work.
    pub quiet_energy_interval_secs: f64,
    /// Seconds between two reads of the per-process shares of a GPU; each
    /// process keeps its last shares in between. 0: every tick.
    pub process_shares_interval_secs: f64,
    /// Seconds between two reads of the values that change rarely or are
    /// counters read for their increase (MIG and virtualisation mode, the
    /// enforced power limit, NVLink link state and error counters, PCIe
    /// replays, ECC counters, remapped rows), and on a quiet GPU of GPM,
    /// the PCIe throughput and the PCIe link; each keeps its last value in
    /// between. 0: every tick.
    pub slow_reads_interval_secs: f64,
    /// Seconds a GPU under load holds a PCIe link read that found the link
    /// at its maximum generation and width, while every tick stays under
    /// load. 0: every tick.
    pub loaded_link_interval_secs: f64,
    /// Whether the one compute process of a GPU without MIG takes the GPU's
    /// utilisation as its shares, with no per-process read.
    pub single_process_shares_from_utilization: bool,
    /// Simulated GPUs instead of NVML; 0 uses NVML.
    pub simulate_gpus: u32,
    /// Profile of the simulated GPUs.
    pub simulate_profile: String,
    /// Scenario of each simulated GPU, in turn.
    pub simulate_scenarios: Vec<String>,
    /// A file of scenarios that replaces `simulate_scenarios` whenever it
    /// changes; empty: none.
    pub simulate_scenarios_file: String,
    /// Whether the simulated GPUs' reads spend the CPU that NVML's cost on an
    /// H100, for benches.
    pub simulate_nvml_costs: bool,
}

/// Default of `energy_interval_secs`: one exact read every 30 ticks at the
/// default interval saves 29 of 30 of the driver's dearest read of an idle
/// GPU, and leaves the counter off the exact one by the integration's error
/// over 30 s at most.
pub const DEFAULT_ENERGY_INTERVAL_SECS: f64 = 30.0;

/// Default of `quiet_energy_interval_secs`: a quiet GPU draws a steady
/// idle power, so the integration between exact reads stays close to the
/// counter, while the exact read is the dearest part of an idle GPU's
/// second (docs/gpus.md, "Choices" and the H200's read-by-read costs).
pub const DEFAULT_QUIET_ENERGY_INTERVAL_SECS: f64 = 300.0;

/// Default of `process_shares_interval_secs`.
pub const DEFAULT_PROCESS_SHARES_INTERVAL_SECS: f64 = 10.0;

/// Default of `slow_reads_interval_secs`: the values it spaces out change
/// on an operator's action, a fault or a reset, and their counters are
/// read for their increase over minutes (alert rules look at 10 minutes),
/// so 30 s late at most costs an alert nothing it would act on.
pub const DEFAULT_SLOW_READS_INTERVAL_SECS: f64 = 30.0;

/// Default of `loaded_link_interval_secs`: a link that trains down under
/// load makes a straggler that the fleet's rules must find within half a
/// minute (`bench/fleet/evaluate.py`), so it may show a few seconds late
/// but not the slow reads' interval late; a read every 5 s still leaves
/// out four fifths of a busy GPU's link reads.
pub const DEFAULT_LOADED_LINK_INTERVAL_SECS: f64 = 5.0;

impl Default for GpuConfig {
    fn default() -> Self {
        GpuConfig {
            enabled: true,
            interval_secs: crate::DEFAULT_INTERVAL_SECS,
            gpm: true,
            processes: true,
            energy_interval_secs: DEFAULT_ENERGY_INTERVAL_SECS,
            quiet_energy_interval_secs: DEFAULT_QUIET_ENERGY_INTERVAL_SECS,
            process_shares_interval_secs: DEFAULT_PROCESS_SHARES_INTERVAL_SECS,
            slow_reads_interval_secs: DEFAULT_SLOW_READS_INTERVAL_SECS,
            loaded_link_interval_secs: DEFAULT_LOADED_LINK_INTERVAL_SECS,
            single_process_shares_from_utilization: true,
            simulate_gpus: 0,
            simulate_profile: "h100".into(),
            simulate_scenarios: vec!["training".into()],
            simulate_scenarios_file: String::new(),
            simulate_nvml_costs: false,
        }
    }
}

crate::common_settings!(GpuConfig);

impl crate::Registered for GpuConfig {
    fn tables() -> &'static [&'static vtax_store::TableDef] {
        super::TABLES
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
        Box::new(super::Gpu::new(self, roots))
    }
    fn check(&self) -> Result<(), (String, String)> {
        self.validate()
    }
}

impl GpuConfig {
    /// Checks the simulated backend's names and count.
    pub fn validate(&self) -> Result<(), (String, String)> {
        if self.simulate_gpus > 64 {
            return Err((
                "collectors.gpu.simulate_gpus".into(),
                format!(
                    "collectors.gpu.simulate_gpus = {}: at most 64",
                    self.simulate_gpus
                ),
            ));
        }
        if sim::profile(&self.simulate_profile).is_none() {
            let known: Vec<&str> = sim::PROFILES.iter().map(|p| p.key).collect();
            return Err((
                "collectors.gpu.simulate_profile".into(),
                format!(
                    "collectors.gpu.simulate_profile = {:?}: not a profile (one of {})",
                    self.simulate_profile,
                    known.join(", ")
                ),
            ));
        }
        for name in &self.simulate_scenarios {
            if sim::Scenario::parse(name).is_none() {
                let known: Vec<&str> = sim::SCENARIOS.iter().map(|(k, _)| *k).collect();
                return Err((
                    "collectors.gpu.simulate_scenarios".into(),
                    format!(
                        "collectors.gpu.simulate_scenarios: {name:?} is not a scenario (one of {})",
                        known.join(", ")
                    ),
                ));
            }
        }
        Ok(())
    }

    /// Whether `other` builds the same backend: the same simulated GPUs, or
    /// NVML read the same way.
    pub(super) fn same_backend(&self, other: &GpuConfig) -> bool {
        self.simulate_gpus == other.simulate_gpus
            && self.simulate_profile == other.simulate_profile
            && self.simulate_scenarios == other.simulate_scenarios
            && self.simulate_scenarios_file == other.simulate_scenarios_file
            && self.gpm == other.gpm
            && self.simulate_nvml_costs == other.simulate_nvml_costs
    }

    /// The backend: simulated GPUs when the config asks, else NVML, which
    /// looks under `procfs` for MPS servers.
    pub(super) fn backend(&self, procfs: &Path) -> Result<Box<dyn GpuBackend>, String> {
        if self.simulate_gpus > 0 {
            let profile = sim::profile(&self.simulate_profile)
                .ok_or_else(|| format!("unknown profile {:?}", self.simulate_profile))?;
            let scenarios = self
                .simulate_scenarios
                .iter()
                .filter_map(|s| sim::Scenario::parse(s))
                .collect();
            let mut backend = sim::SimBackend::new(self.simulate_gpus, profile, scenarios)
                .charging_nvml_costs(self.simulate_nvml_costs);
            if !self.simulate_scenarios_file.is_empty() {
                backend = backend.with_scenarios_file(self.simulate_scenarios_file.clone().into());
            }
            return Ok(Box::new(backend));
        }
        Ok(Box::new(nvml::NvmlBackend::new(self.gpm, procfs)?))
    }
}

/// Ranges of this collector's own numeric keys.
pub static KEY_RANGES: crate::keys::KeyRanges = &[
    ("simulate_gpus", crate::keys::KeyRange::between(0.0, 64.0)),
    (
        "energy_interval_secs",
        crate::keys::KeyRange::between(0.0, 86_400.0),
    ),
    (
        "quiet_energy_interval_secs",
        crate::keys::KeyRange::between(0.0, 86_400.0),
    ),
    (
        "process_shares_interval_secs",
        crate::keys::KeyRange::between(0.0, 86_400.0),
    ),
    (
        "slow_reads_interval_secs",
        crate::keys::KeyRange::between(0.0, 86_400.0),
    ),
    (
        "loaded_link_interval_secs",
        crate::keys::KeyRange::between(0.0, 86_400.0),
    ),
];

/// Comments for this collector's own keys in the example config.
pub static KEY_DOCS: &[(&str, &str)] = &[
    (
        "gpm",
        "Read GPM metrics on Hopper and newer (SM activity and occupancy, tensor activity, DRAM bandwidth, per-link NVLink throughput). GPM does not take the profiling lock that DCGM's profiling fields take, so it can stay on while people run Nsight. Turning it off costs more CPU, not less: the PCIe rates then come from NVML's own throughput read, which holds the collector 20 ms per direction (about three times the collector's CPU on an idle H200, docs/gpus.md).",
    ),
    (
        "processes",
        "List the processes on each GPU with their memory and SM share, and map each to its cgroup: container, Kubernetes pod UID or Slurm job.",
    ),
    (
        "energy_interval_secs",
        "Seconds between two reads of the exact energy counter (nvmlDeviceGetTotalEnergyConsumption: 3-5 ms of the driver's CPU a read on an H100, the dearest read of an idle tick). In between, energy_joules goes on by integrating the power readings (trapezoids a tick wide) and is reconciled at each exact read: it steps up to the exact counter, or holds where it was until the counter passes it, so it never goes back. vtax_gpu_energy_exact_age_seconds says how old the exact read is, vtax_gpu_energy_integration_error_joules what the integration got wrong over the interval before it. 0 (or anything at or below interval_secs): the exact counter every tick, on every GPU.",
    ),
    (
        "quiet_energy_interval_secs",
        "Seconds between two reads of the exact energy counter on a GPU that has been quiet (no compute process, utilisation 0, MIG off) at every tick since the last one. A quiet GPU's power hardly moves, so the integration stays within a few joules of the counter over minutes. The first tick anything runs on the GPU reads the counter if energy_interval_secs has passed since the last read, and the work's cadence holds from then on. At or below energy_interval_secs: the same cadence as a GPU at work.",
    ),
    (
        "process_shares_interval_secs",
        "Seconds between two reads of the processes' SM and memory shares on a GPU that more than one process shares (nvmlDeviceGetProcessUtilization: 2.5-6 ms of the driver's CPU a read on an H100); each process keeps its last shares in between. 0: every tick. The process list itself and its memory are read every tick.",
    ),
    (
        "slow_reads_interval_secs",
        "Seconds between two reads of the values that change rarely or are counters read for their increase: MIG mode, virtualisation mode, the enforced power limit, NVLink link state and error counters, the PCIe replay counter (mig_mode and the replay counter cost the driver about 0.4-0.5 ms of CPU each a read on an H100 or H200), ECC counters and remapped rows. Each keeps its last value in between, and all are read at the first tick and when a GPU answers again. On a quiet GPU (no compute process, utilisation 0, MIG off) GPM, the PCIe throughput and the PCIe link generation and width (0.5 ms of the driver's CPU a tick on an idle H200) are read on this cadence too, each held as the last quiet tick read it; the first tick anything runs on the GPU reads them again. On a GPU at work they are read every tick, but for the link under load: see loaded_link_interval_secs. XIDs arrive as events at once. 0: every tick.",
    ),
    (
        "loaded_link_interval_secs",
        "Seconds a GPU under load (utilisation at least 0.5) holds a PCIe link generation and width that a read under load found at their maxima (the two reads cost 0.23 ms of the driver's CPU a tick on a busy H200). A tick below 0.5 reads the link again, since an idle link trains down by design, and a link below its maximum under load is read every tick, so its recovery shows at once; a link that trains down under load shows up to this long late. 0: every tick.",
    ),
    (
        "single_process_shares_from_utilization",
        "Give the one compute process of a GPU without MIG the GPU's utilisation as its shares, every tick and without the per-process read: it had the GPU to itself. false: the per-process read for it too.",
    ),
    (
        "simulate_gpus",
        "Simulate this many GPUs instead of reading NVML (also --simulate-gpus N); 0 reads the real GPUs. For tests, dashboards and demos.",
    ),
    (
        "simulate_profile",
        "Profile of the simulated GPUs: \"h100\" (H100 SXM 80 GB) or \"h200\".",
    ),
    (
        "simulate_scenarios",
        "What the simulated GPUs do, GPU i playing scenarios[i % len]: idle, training, memory-bound, thermal-throttle, power-throttle, pcie-degraded, nvlink-hidden, hbm-degraded, xid, gpu-lost, mig.",
    ),
    (
        "simulate_scenarios_file",
        "A file of scenario names (separated by commas, spaces or lines) that replaces simulate_scenarios whenever it changes, looked at twice a second: a demo or an evaluation degrades and restores a simulated GPU of a running agent by writing it. A file that is missing or names something else leaves the scenarios as they were, with a warning in the log. Empty: none.",
    ),
    (
        "simulate_nvml_costs",
        "Make each read of a simulated GPU spend the CPU that the same NVML reads cost on an H100 (bench/agent/gpu_driver_costs.py). For benches only.",
    ),
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_simulator_settings_name_their_key() {
        let bad = GpuConfig {
            simulate_scenarios: vec!["training".into(), "on-fire".into()],
            ..GpuConfig::default()
        };
        let (key, message) = bad.validate().unwrap_err();
        assert_eq!(key, "collectors.gpu.simulate_scenarios");
        assert!(
            message.contains("\"on-fire\"") && message.contains("gpu-lost"),
            "{message}"
        );
        let bad = GpuConfig {
            simulate_profile: "a100".into(),
            ..GpuConfig::default()
        };
        assert_eq!(
            bad.validate().unwrap_err().0,
            "collectors.gpu.simulate_profile"
        );
        assert!(GpuConfig::default().validate().is_ok());
    }

}
