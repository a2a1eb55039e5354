//! `gpu`: every NVIDIA GPU through NVML (or the simulated backend): how much
//! of its peak the workload gets — utilisation and GPM activity, HBM bytes/s
//! against the peak, clocks against their maxima and why they are held down,
//! PCIe and NVLink against what the links should carry, power, temperatures,
//! ECC and remapped rows, XIDs, MIG instances, and whose processes run there.
//!
//! A GPU that errors or falls off the bus gets `up` 0, an event row and a log
//! line, and is skipped; the other GPUs go on. No driver: the collector is
//! off, with the loader's reason.

pub mod backend;
pub mod nvml;
pub mod owner;
pub mod sim;

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use vtax_store::schema::{FieldDef, FieldType, TableDef, TagDef, Unit};
use vtax_store::{Batch, BatchBuilder, Value};

use self::backend::{GpuBackend, GpuIdentity, GpuSample, SampleError};
use self::owner::Owners;
use super::{Availability, Collector, CollectorConfig, Roots};

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
    /// Simulated GPUs instead of NVML; 0 uses NVML.
    pub simulate_gpus: u32,
    /// Profile of the simulated GPUs.
    pub simulate_profile: String,
    /// Scenario of each simulated GPU, in turn.
    pub simulate_scenarios: Vec<String>,
}

impl Default for GpuConfig {
    fn default() -> Self {
        GpuConfig {
            enabled: true,
            interval_secs: super::DEFAULT_INTERVAL_SECS,
            gpm: true,
            processes: true,
            simulate_gpus: 0,
            simulate_profile: "h100".into(),
            simulate_scenarios: vec!["training".into()],
        }
    }
}

impl CollectorConfig for GpuConfig {
    fn enabled(&self) -> bool {
        self.enabled
    }
    fn interval_secs(&self) -> f64 {
        self.interval_secs
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
    fn same_backend(&self, other: &GpuConfig) -> bool {
        self.simulate_gpus == other.simulate_gpus
            && self.simulate_profile == other.simulate_profile
            && self.simulate_scenarios == other.simulate_scenarios
            && self.gpm == other.gpm
    }

    fn backend(&self) -> Result<Box<dyn GpuBackend>, String> {
        if self.simulate_gpus > 0 {
            let profile = sim::profile(&self.simulate_profile)
                .ok_or_else(|| format!("unknown profile {:?}", self.simulate_profile))?;
            let scenarios = self
                .simulate_scenarios
                .iter()
                .filter_map(|s| sim::Scenario::parse(s))
                .collect();
            return Ok(Box::new(sim::SimBackend::new(
                self.simulate_gpus,
                profile,
                scenarios,
            )));
        }
        Ok(Box::new(nvml::NvmlBackend::new(self.gpm)?))
    }
}

/// Ranges of this collector's own numeric keys.
pub static KEY_RANGES: crate::config::KeyRanges =
    &[("simulate_gpus", crate::config::KeyRange::between(0.0, 64.0))];

/// Comments for this collector's own keys in the example config.
pub static KEY_DOCS: &[(&str, &str)] = &[
    (
        "gpm",
        "Read GPM metrics on Hopper and newer (SM activity and occupancy, tensor activity, DRAM bandwidth, per-link NVLink throughput). GPM does not take the profiling lock that DCGM's profiling fields take, so it can stay on while people run Nsight.",
    ),
    (
        "processes",
        "List the processes on each GPU with their memory and SM share, and map each to its cgroup: container, Kubernetes pod UID or Slurm job.",
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
        "What the simulated GPUs do, GPU i playing scenarios[i % len]: idle, training, memory-bound, thermal-throttle, power-throttle, pcie-degraded, nvlink-hidden, xid, gpu-lost, mig.",
    ),
];

/// Tables of this collector.
pub static TABLES: &[&TableDef] = &[
    &GPU,
    &INFO,
    &HEALTH,
    &CLOCK_EVENT,
    &NVLINK,
    &MIG,
    &PROCESS,
    &XID,
    &EVENT,
];

const fn tag(name: &'static str, help: &'static str) -> TagDef {
    TagDef { name, help }
}

const GPU_TAG: TagDef = tag("gpu", "NVML index of the GPU, from 0.");
const UUID_TAG: TagDef = tag(
    "gpu_uuid",
    "The GPU's UUID (GPU-…), stable across reboots and index changes.",
);

const fn ratio(name: &'static str, help: &'static str) -> FieldDef {
    FieldDef::gauge(name, FieldType::F64, Unit::Ratio, help)
}
const fn rate(name: &'static str, help: &'static str) -> FieldDef {
    FieldDef::gauge(name, FieldType::F64, Unit::BytesPerSecond, help)
}
const fn hertz(name: &'static str, help: &'static str) -> FieldDef {
    FieldDef::gauge(name, FieldType::F64, Unit::Hertz, help)
}
const fn count(name: &'static str, help: &'static str) -> FieldDef {
    FieldDef::gauge(name, FieldType::U64, Unit::None, help)
}
const fn events(name: &'static str, help: &'static str) -> FieldDef {
    FieldDef::counter(name, FieldType::U64, Unit::None, help)
}

/// Fields of [`GPU`].
mod f {
    pub const COUNT: usize = 38;
}

/// One row per GPU per tick.
pub static GPU: TableDef = TableDef {
    name: "gpu",
    help: "One row per GPU per tick: utilisation and GPM activity, HBM bandwidth against its peak, clocks against their maxima, power, temperatures, memory, ECC, PCIe and NVLink totals. Null where the GPU or driver does not support a value (GPM before Hopper).",
    tags: &[GPU_TAG, UUID_TAG],
    fields: &[
        ratio("utilization_ratio", "Fraction of the last sample period in which a kernel ran (NVML utilization.gpu): busy, not how much of the GPU was used."),
        ratio("memory_utilization_ratio", "Fraction of the last sample period in which device memory was read or written (NVML utilization.memory)."),
        ratio("sm_active_ratio", "GPM: fraction of SMs with a warp resident, averaged over the interval. Hopper and newer."),
        ratio("sm_occupancy_ratio", "GPM: resident warps against the SMs' maximum, averaged over the interval."),
        ratio("tensor_active_ratio", "GPM: fraction of the interval any tensor pipe was busy."),
        ratio("dram_bandwidth_ratio", "GPM: HBM bandwidth used against the peak, over the interval."),
        rate("hbm_bytes_per_second", "HBM bandwidth achieved: dram_bandwidth_ratio times hbm_peak_bytes_per_second."),
        rate("hbm_peak_bytes_per_second", "HBM peak: memory bus width times the maximum memory clock times two (double data rate); 3.35e12 on an H100 SXM."),
        hertz("sm_clock_hertz", "SM clock now."),
        hertz("sm_clock_max_hertz", "Highest SM clock of the GPU."),
        hertz("memory_clock_hertz", "Memory clock now."),
        hertz("memory_clock_max_hertz", "Highest memory clock of the GPU."),
        count("clock_event_reasons", "NVML clock event (throttle) reasons as a bitmask: 0x1 idle, 0x2 application clocks, 0x4 software power cap, 0x8 hardware slowdown, 0x10 sync boost, 0x20 software thermal, 0x40 hardware thermal, 0x80 power brake, 0x100 display clocks (one series per reason in gpu_clock_event)."),
        FieldDef::gauge("power_watts", FieldType::F64, Unit::Watts, "Power draw."),
        FieldDef::gauge("power_limit_watts", FieldType::F64, Unit::Watts, "Power limit the driver enforces now."),
        FieldDef::counter("energy_joules", FieldType::F64, Unit::Joules, "Energy since the driver loaded (Volta and newer)."),
        FieldDef::gauge("temperature_celsius", FieldType::F64, Unit::Celsius, "GPU die temperature."),
        FieldDef::gauge("memory_temperature_celsius", FieldType::F64, Unit::Celsius, "HBM temperature."),
        FieldDef::gauge("memory_used_bytes", FieldType::U64, Unit::Bytes, "Device memory allocated."),
        FieldDef::gauge("memory_total_bytes", FieldType::U64, Unit::Bytes, "Device memory installed."),
        events("ecc_corrected_errors", "Corrected (single-bit) ECC errors since the driver loaded."),
        events("ecc_uncorrected_errors", "Uncorrected (double-bit) ECC errors since the driver loaded."),
        count("remapped_rows_correctable", "HBM rows remapped after correctable errors."),
        count("remapped_rows_uncorrectable", "HBM rows remapped after uncorrectable errors."),
        count("remapping_pending", "1 when a row remapping waits for a GPU reset."),
        count("remapping_failed", "1 when a row remapping failed: the GPU needs service."),
        rate("pcie_rx_bytes_per_second", "PCIe receive throughput: GPM over the interval where it runs, else NVML's 20 ms sample."),
        rate("pcie_tx_bytes_per_second", "PCIe transmit throughput: GPM over the interval where it runs, else NVML's 20 ms sample."),
        count("pcie_link_gen", "PCIe generation the link trained to now (idle links train down; compare under load)."),
        count("pcie_link_gen_max", "Highest PCIe generation of the GPU and its slot."),
        count("pcie_link_width", "PCIe lanes the link trained to now."),
        count("pcie_link_width_max", "Widest PCIe link of the GPU and its slot."),
        events("pcie_replays", "PCIe replays since the driver loaded: link errors the link recovered from."),
        rate("nvlink_total_rx_bytes_per_second", "GPM: NVLink receive throughput over all links (per link in gpu_nvlink)."),
        rate("nvlink_total_tx_bytes_per_second", "GPM: NVLink transmit throughput over all links (per link in gpu_nvlink)."),
        count("nvlink_links_up", "NVLink links up. Fewer than nvlink_links_product means links are down or hidden (as in most VMs)."),
        count("nvlink_links_product", "NVLink links this product has, from its name; null when unknown."),
        rate("nvlink_peak_bytes_per_second", "NVLink peak, receive plus transmit, over the product's links: links × the generation's rate each way × 2 (9e11 on an H100 SXM); null when the product or architecture is unknown."),
    ],
    exported: true,
};

/// Facts about each GPU.
pub static INFO: TableDef = TableDef {
    name: "gpu_info",
    help: "One row per GPU per tick: its facts as tags, and 1.",
    tags: &[
        GPU_TAG,
        UUID_TAG,
        tag("name", "Product name, e.g. `NVIDIA H100 80GB HBM3`."),
        tag("pci_bus_id", "PCI bus id, e.g. `00000000:18:00.0`."),
        tag("architecture", "`hopper`, `ampere`, `blackwell`, …"),
        tag("virtualization_mode", "NVML's virtualization mode: `bare`, `passthrough` (whole GPU in a VM), `vgpu`, `host_vgpu`, `host_vsga`, or `unknown`."),
        tag("mig", "`on` or `off`: whether MIG partitions the GPU."),
        tag("driver_version", "NVIDIA driver version."),
        tag("backend", "`nvml`, or `simulated` when the simulated backend runs."),
    ],
    fields: &[count("info", "Always 1: the facts are in the labels.")],
    exported: true,
};

/// Whether each GPU answers.
pub static HEALTH: TableDef = TableDef {
    name: "gpu_health",
    help: "One row per GPU per tick: whether it answered, its failed reads and its last XID (the counts by code are in gpu_xid).",
    tags: &[GPU_TAG, UUID_TAG],
    fields: &[
        count("up", "1 when the GPU answered this tick; 0 when it is lost (fell off the bus) or its read failed."),
        events("sample_errors", "Ticks on which reading the GPU failed, since the agent started."),
        count("last_xid", "Code of the last XID error since the agent started; null when none."),
    ],
    exported: true,
};

/// The clock event reasons NVML reports, by bit.
pub const CLOCK_EVENT_REASONS: &[(&str, u64)] = &[
    ("gpu_idle", 0x1),
    ("applications_clocks_setting", 0x2),
    ("sw_power_cap", 0x4),
    ("hw_slowdown", 0x8),
    ("sync_boost", 0x10),
    ("sw_thermal_slowdown", 0x20),
    ("hw_thermal_slowdown", 0x40),
    ("hw_power_brake_slowdown", 0x80),
    ("display_clock_setting", 0x100),
];

/// One series per clock event reason.
pub static CLOCK_EVENT: TableDef = TableDef {
    name: "gpu_clock_event",
    help: "One row per GPU, clock event (throttle) reason and tick: whether that reason holds the clocks down now.",
    tags: &[
        GPU_TAG,
        UUID_TAG,
        tag("reason", "`gpu_idle`, `applications_clocks_setting`, `sw_power_cap`, `hw_slowdown`, `sync_boost`, `sw_thermal_slowdown`, `hw_thermal_slowdown`, `hw_power_brake_slowdown`, `display_clock_setting`."),
    ],
    fields: &[count("active", "1 while the reason holds the clocks down.")],
    exported: true,
};

/// Each NVLink link.
pub static NVLINK: TableDef = TableDef {
    name: "gpu_nvlink",
    help: "One row per GPU, NVLink link and tick: state, GPM throughput and the data-link error counters. Links NVML does not answer for (absent, or hidden by a hypervisor) have no row.",
    tags: &[GPU_TAG, UUID_TAG, tag("link", "Link number, from 0.")],
    fields: &[
        count("up", "1 when the link is active."),
        rate("rx_bytes_per_second", "GPM: receive throughput of the link."),
        rate("tx_bytes_per_second", "GPM: transmit throughput of the link."),
        events("crc_errors", "Data-link CRC errors on flits."),
        events("replay_errors", "Data-link replays."),
        events("recovery_errors", "Data-link recoveries: the link retrained."),
    ],
    exported: true,
};

/// MIG instances.
pub static MIG: TableDef = TableDef {
    name: "gpu_mig",
    help: "One row per MIG GPU instance and tick, on GPUs with MIG on.",
    tags: &[
        GPU_TAG,
        UUID_TAG,
        tag("gpu_instance", "MIG GPU instance id."),
        tag("mig_uuid", "The instance's UUID (MIG-…)."),
        tag("profile", "MIG profile, e.g. `1g.10gb`."),
    ],
    fields: &[
        FieldDef::gauge(
            "memory_used_bytes",
            FieldType::U64,
            Unit::Bytes,
            "Memory allocated in the instance.",
        ),
        FieldDef::gauge(
            "memory_total_bytes",
            FieldType::U64,
            Unit::Bytes,
            "Memory of the instance.",
        ),
        ratio("sm_active_ratio", "GPM: SM activity of the instance."),
    ],
    exported: true,
};

/// Processes on each GPU and whose they are.
pub static PROCESS: TableDef = TableDef {
    name: "gpu_process",
    help: "One row per compute process per GPU per tick: its GPU memory and share of SM time, and whose it is, from its cgroup.",
    tags: &[
        GPU_TAG,
        UUID_TAG,
        tag("pid", "Process id in the agent's PID namespace."),
        tag("command", "The process's comm; empty when it is in another PID namespace."),
        tag("workload", "What its cgroup holds: `container`, `pod`, `slurm_job`, `slurm_step`, `service`, `slice`, `other`, or `unknown`."),
        tag("cgroup", "Its cgroup path below the cgroup root."),
        tag("container", "Container id (12 hex digits) when it runs in one."),
        tag("pod_uid", "Kubernetes pod UID when it runs in a pod."),
        tag("slurm_job", "Slurm job id when it runs in a job."),
    ],
    fields: &[
        FieldDef::gauge("used_memory_bytes", FieldType::U64, Unit::Bytes, "GPU memory the process holds."),
        ratio("sm_utilization_ratio", "Its share of SM time over the last interval."),
        ratio("memory_utilization_ratio", "Its share of memory-controller time over the last interval."),
        count("gpu_instance", "MIG GPU instance it runs in; null without MIG."),
    ],
    exported: true,
};

/// XID errors by code.
pub static XID: TableDef = TableDef {
    name: "gpu_xid",
    help: "One row per GPU, XID code seen and tick: how many errors of that code the driver reported since the agent started.",
    tags: &[GPU_TAG, UUID_TAG, tag("xid", "XID code (e.g. 79: fell off the bus, 48: double-bit ECC, 13: graphics engine exception).")],
    fields: &[events("errors", "XID errors of this code since the agent started.")],
    exported: true,
};

/// Events: each XID, and a GPU lost or back.
pub static EVENT: TableDef = TableDef {
    name: "gpu_event",
    help: "One row per event, stored only: an XID error (`xid`, code), a GPU lost (`lost`) or answering again (`recovered`).",
    tags: &[
        GPU_TAG,
        UUID_TAG,
        tag("kind", "`xid`, `lost` or `recovered`."),
    ],
    fields: &[count("code", "The XID code; 0 for other kinds.")],
    exported: false,
};

/// What the collector remembers of one GPU between ticks.
#[derive(Default)]
struct GpuState {
    lost: bool,
    /// From the last sample, for the info row of a GPU that stopped answering.
    virtualization_mode: &'static str,
    mig: &'static str,
    sample_errors: u64,
    last_xid: Option<u64>,
    xid_by_code: BTreeMap<u64, u64>,
    problems: Vec<String>,
}

/// The collector.
pub struct Gpu {
    config: GpuConfig,
    backend: Option<Box<dyn GpuBackend>>,
    gpus: Vec<GpuIdentity>,
    states: Vec<GpuState>,
    driver_version: String,
    owners: Owners,
    /// What the collector this one replaced on a reload knew of each GPU,
    /// by UUID, until the probe finds the GPUs again.
    carried: BTreeMap<String, GpuState>,
}

impl Gpu {
    /// The collector on the backend its config names (NVML or simulated).
    pub fn new(config: &GpuConfig, roots: &Roots) -> Gpu {
        Gpu {
            config: config.clone(),
            backend: None,
            gpus: Vec::new(),
            states: Vec::new(),
            driver_version: String::new(),
            owners: Owners::new(roots),
            carried: BTreeMap::new(),
        }
    }
}

fn f64v(v: Option<f64>) -> Value {
    v.map_or(Value::Null, Value::F64)
}
fn u64v(v: Option<u64>) -> Value {
    v.map_or(Value::Null, Value::U64)
}
fn u32v(v: Option<u32>) -> Value {
    u64v(v.map(u64::from))
}
fn flag(v: Option<bool>) -> Value {
    u64v(v.map(u64::from))
}

/// Builders of every table, one tick's rows.
struct Rows {
    gpu: BatchBuilder,
    info: BatchBuilder,
    health: BatchBuilder,
    clock_event: BatchBuilder,
    nvlink: BatchBuilder,
    mig: BatchBuilder,
    process: BatchBuilder,
    xid: BatchBuilder,
    event: BatchBuilder,
}

impl Rows {
    fn new() -> Rows {
        Rows {
            gpu: BatchBuilder::new(&GPU),
            info: BatchBuilder::new(&INFO),
            health: BatchBuilder::new(&HEALTH),
            clock_event: BatchBuilder::new(&CLOCK_EVENT),
            nvlink: BatchBuilder::new(&NVLINK),
            mig: BatchBuilder::new(&MIG),
            process: BatchBuilder::new(&PROCESS),
            xid: BatchBuilder::new(&XID),
            event: BatchBuilder::new(&EVENT),
        }
    }

    fn finish(mut self) -> Vec<Batch> {
        [
            &mut self.gpu,
            &mut self.info,
            &mut self.health,
            &mut self.clock_event,
            &mut self.nvlink,
            &mut self.mig,
            &mut self.process,
            &mut self.xid,
            &mut self.event,
        ]
        .into_iter()
        .map(BatchBuilder::finish)
        .filter(|b| !b.is_empty())
        .collect()
    }
}

impl Gpu {
    fn push_sample(
        &mut self,
        rows: &mut Rows,
        at: usize,
        s: &GpuSample,
        time_us: i64,
    ) -> anyhow::Result<()> {
        let g = &self.gpus[at];
        let index = g.index.to_string();
        let ids = [index.as_str(), g.uuid.as_str()];
        let gpm = s.gpm.clone().unwrap_or_default();
        let peak = g.hbm_peak_bytes_per_second();
        let links_up = s.links.iter().filter(|l| l.active).count() as u64;
        let values: [Value; f::COUNT] = [
            f64v(s.utilization_gpu_ratio),
            f64v(s.utilization_memory_ratio),
            f64v(gpm.sm_active_ratio),
            f64v(gpm.sm_occupancy_ratio),
            f64v(gpm.tensor_active_ratio),
            f64v(gpm.dram_bandwidth_ratio),
            f64v(gpm.dram_bandwidth_ratio.zip(peak).map(|(r, p)| r * p)),
            f64v(peak),
            f64v(s.sm_clock_hz),
            f64v(g.sm_clock_max_hz),
            f64v(s.memory_clock_hz),
            f64v(g.memory_clock_max_hz),
            u64v(s.clock_event_reasons),
            f64v(s.power_watts),
            f64v(s.power_limit_watts),
            f64v(s.energy_joules),
            f64v(s.temperature_celsius),
            f64v(s.memory_temperature_celsius),
            u64v(s.memory_used_bytes),
            u64v(s.memory_total_bytes),
            u64v(s.ecc_corrected_errors),
            u64v(s.ecc_uncorrected_errors),
            u64v(s.remapped_rows_correctable),
            u64v(s.remapped_rows_uncorrectable),
            flag(s.remapping_pending),
            flag(s.remapping_failed),
            f64v(gpm.pcie_rx_bytes_per_second.or(s.pcie_rx_bytes_per_second)),
            f64v(gpm.pcie_tx_bytes_per_second.or(s.pcie_tx_bytes_per_second)),
            u32v(s.pcie_link_gen),
            u32v(g.pcie_link_gen_max),
            u32v(s.pcie_link_width),
            u32v(g.pcie_link_width_max),
            u64v(s.pcie_replays),
            f64v(gpm.nvlink_rx_bytes_per_second),
            f64v(gpm.nvlink_tx_bytes_per_second),
            Value::U64(links_up),
            u32v(g.nvlink_links_product),
            f64v(g.nvlink_peak_bytes_per_second()),
        ];
        rows.gpu.push(time_us, &ids, &values)?;

        let state = &mut self.states[at];
        state.virtualization_mode = s.virtualization_mode.map_or("unknown", |m| m.as_str());
        state.mig = match s.mig_enabled {
            Some(true) => "on",
            Some(false) => "off",
            None => "unknown",
        };
        if let Some(reasons) = s.clock_event_reasons {
            for (reason, bit) in CLOCK_EVENT_REASONS {
                rows.clock_event.push(
                    time_us,
                    &[&index, &g.uuid, reason],
                    &[Value::U64(u64::from(reasons & bit != 0))],
                )?;
            }
        }
        for l in &s.links {
            rows.nvlink.push(
                time_us,
                &[&index, &g.uuid, &l.link.to_string()],
                &[
                    Value::U64(u64::from(l.active)),
                    f64v(l.rx_bytes_per_second),
                    f64v(l.tx_bytes_per_second),
                    u64v(l.crc_errors),
                    u64v(l.replay_errors),
                    u64v(l.recovery_errors),
                ],
            )?;
        }
        for m in &s.mig {
            rows.mig.push(
                time_us,
                &[
                    &index,
                    &g.uuid,
                    &m.gpu_instance.to_string(),
                    &m.uuid,
                    &m.profile,
                ],
                &[
                    u64v(m.memory_used_bytes),
                    u64v(m.memory_total_bytes),
                    f64v(m.sm_active_ratio),
                ],
            )?;
        }
        if self.config.processes {
            for p in &s.processes {
                let owner = self.owners.of(p.pid);
                rows.process.push(
                    time_us,
                    &[
                        &index,
                        &g.uuid,
                        &p.pid.to_string(),
                        &owner.command,
                        owner.workload,
                        &owner.cgroup,
                        &owner.container,
                        &owner.pod_uid,
                        &owner.slurm_job,
                    ],
                    &[
                        u64v(p.used_memory_bytes),
                        f64v(p.sm_utilization_ratio),
                        f64v(p.memory_utilization_ratio),
                        u32v(p.gpu_instance),
                    ],
                )?;
            }
        }
        self.states[at].problems = problems_of(g, s, links_up);
        Ok(())
    }
}

/// What an operator should look at on one GPU, from one sample.
fn problems_of(g: &GpuIdentity, s: &GpuSample, links_up: u64) -> Vec<String> {
    let mut problems = Vec::new();
    let who = format!("GPU {} ({})", g.index, g.uuid);
    let busy = s.utilization_gpu_ratio.unwrap_or(0.0) >= 0.5;
    if let (true, Some(gen), Some(gen_max), Some(width), Some(width_max)) = (
        busy,
        s.pcie_link_gen,
        g.pcie_link_gen_max,
        s.pcie_link_width,
        g.pcie_link_width_max,
    ) {
        if gen < gen_max || width < width_max {
            problems.push(format!(
                "{who}: PCIe link at Gen{gen} x{width} under load; it can do Gen{gen_max} x{width_max}"
            ));
        }
    }
    if let Some(product) = g.nvlink_links_product.filter(|&n| n > 0) {
        if links_up < u64::from(product) {
            problems.push(format!(
                "{who}: {links_up} of {product} NVLink links up (down, or hidden by a hypervisor)"
            ));
        }
    }
    let held: Vec<&str> = CLOCK_EVENT_REASONS
        .iter()
        .filter(|(name, bit)| {
            s.clock_event_reasons.unwrap_or(0) & bit != 0
                && !matches!(
                    *name,
                    "gpu_idle" | "applications_clocks_setting" | "display_clock_setting"
                )
        })
        .map(|(name, _)| *name)
        .collect();
    if !held.is_empty() {
        problems.push(format!("{who}: clocks held down by {}", held.join(", ")));
    }
    if s.remapping_pending == Some(true) {
        problems.push(format!("{who}: an HBM row remapping waits for a GPU reset"));
    }
    if s.remapping_failed == Some(true) {
        problems.push(format!(
            "{who}: an HBM row remapping failed: the GPU needs service"
        ));
    }
    problems
}

impl Collector for Gpu {
    fn name(&self) -> &'static str {
        "gpu"
    }

    fn probe(&mut self) -> Availability {
        // The backend taken over on a reload goes on (its XID thread with
        // the XIDs it holds, the simulator's clock); otherwise a new one.
        let backend = match self
            .backend
            .take()
            .map_or_else(|| self.config.backend(), Ok)
        {
            Ok(b) => self.backend.insert(b),
            Err(reason) => return Availability::Absent(reason),
        };
        self.gpus = match backend.identities() {
            Ok(gpus) if gpus.is_empty() => {
                return Availability::Absent("the NVIDIA driver is loaded but sees no GPU".into())
            }
            Ok(gpus) => gpus,
            Err(reason) => return Availability::Absent(reason),
        };
        self.driver_version = backend.driver_version();
        let mut carried = std::mem::take(&mut self.carried);
        self.states = self
            .gpus
            .iter()
            .map(|g| {
                carried.remove(&g.uuid).unwrap_or_else(|| GpuState {
                    virtualization_mode: "unknown",
                    mig: "unknown",
                    ..GpuState::default()
                })
            })
            .collect();
        let mut names: BTreeMap<&str, usize> = BTreeMap::new();
        for g in &self.gpus {
            *names.entry(g.name.as_str()).or_default() += 1;
        }
        let models: Vec<String> = names.iter().map(|(n, c)| format!("{c} × {n}")).collect();
        let gpm = self.gpus.iter().filter(|g| g.gpm_supported).count();
        Availability::Available(format!(
            "{} ({}, driver {}), GPM on {gpm} of {}",
            models.join(", "),
            backend.kind(),
            self.driver_version,
            self.gpus.len()
        ))
    }

    fn collect(&mut self, time_us: i64) -> anyhow::Result<Vec<Batch>> {
        let mut rows = Rows::new();
        let mut answered = vec![false; self.gpus.len()];
        for (at, answered_at) in answered.iter_mut().enumerate() {
            let backend = self
                .backend
                .as_mut()
                .ok_or_else(|| anyhow::anyhow!("the GPU collector was not probed"))?;
            let g = &self.gpus[at];
            let result = backend.sample(g, time_us);
            let (index, uuid) = (g.index.to_string(), g.uuid.clone());
            match result {
                Ok(sample) => {
                    if self.states[at].lost {
                        tracing::info!(gpu = g.index, uuid = %uuid, "GPU answers again.");
                        rows.event.push(
                            time_us,
                            &[&index, &uuid, "recovered"],
                            &[Value::U64(0)],
                        )?;
                        self.states[at].lost = false;
                    }
                    *answered_at = true;
                    self.push_sample(&mut rows, at, &sample, time_us)?;
                }
                Err(SampleError::Lost(why)) => {
                    let state = &mut self.states[at];
                    if !state.lost {
                        tracing::warn!(gpu = g.index, uuid = %uuid, reason = %why, "GPU lost; skipped until it answers again, the other GPUs go on.");
                        rows.event
                            .push(time_us, &[&index, &uuid, "lost"], &[Value::U64(0)])?;
                        state.lost = true;
                    }
                    state.sample_errors += 1;
                    state.problems = vec![format!("GPU {index} ({uuid}): lost: {why}")];
                }
                Err(SampleError::Failed(why)) => {
                    let state = &mut self.states[at];
                    if state.sample_errors == 0 {
                        tracing::warn!(gpu = g.index, uuid = %uuid, reason = %why, "Reading a GPU failed; retried every tick.");
                    }
                    state.sample_errors += 1;
                    state.problems = vec![format!("GPU {index} ({uuid}): read failed: {why}")];
                }
            }
        }
        if self.config.processes {
            self.owners.retain_seen();
        }
        let xids = self
            .backend
            .as_mut()
            .map(|b| b.take_xids())
            .unwrap_or_default();
        for x in xids {
            let Some(at) = self.gpus.iter().position(|g| g.uuid == x.uuid) else {
                continue;
            };
            let index = self.gpus[at].index.to_string();
            tracing::warn!(gpu = %index, uuid = %x.uuid, xid = x.xid, "XID error.");
            rows.event
                .push(x.time_us, &[&index, &x.uuid, "xid"], &[Value::U64(x.xid)])?;
            let state = &mut self.states[at];
            state.last_xid = Some(x.xid);
            *state.xid_by_code.entry(x.xid).or_default() += 1;
        }
        let backend = self.backend.as_ref().map_or("", |b| b.kind());
        for (at, g) in self.gpus.iter().enumerate() {
            let state = &self.states[at];
            let index = g.index.to_string();
            // Every GPU found keeps its info row, a lost one too: its facts
            // are what an operator needs to find it.
            rows.info.push(
                time_us,
                &[
                    &index,
                    &g.uuid,
                    &g.name,
                    &g.pci_bus_id,
                    &g.architecture,
                    state.virtualization_mode,
                    state.mig,
                    &self.driver_version,
                    backend,
                ],
                &[Value::U64(1)],
            )?;
            rows.health.push(
                time_us,
                &[&index, &g.uuid],
                &[
                    Value::U64(u64::from(answered[at])),
                    Value::U64(state.sample_errors),
                    u64v(state.last_xid),
                ],
            )?;
            for (code, n) in &state.xid_by_code {
                rows.xid.push(
                    time_us,
                    &[&index, &g.uuid, &code.to_string()],
                    &[Value::U64(*n)],
                )?;
            }
        }
        Ok(rows.finish())
    }

    /// Carries on each GPU's counts (failed reads, XIDs by code) and, when
    /// the backend settings are the same, the backend itself: a new one
    /// would start its counts, and the simulator its clock, from zero.
    fn take_over(&mut self, previous: Box<dyn Collector>) {
        let Ok(previous) = previous.into_any().downcast::<Gpu>() else {
            return;
        };
        let Gpu {
            config,
            backend,
            gpus,
            states,
            ..
        } = *previous;
        if config.same_backend(&self.config) {
            self.backend = backend;
        }
        self.carried = gpus.into_iter().map(|g| g.uuid).zip(states).collect();
    }

    fn problems(&self) -> Vec<String> {
        let mut problems: Vec<String> = self
            .states
            .iter()
            .flat_map(|s| s.problems.iter().cloned())
            .collect();
        for (g, s) in self.gpus.iter().zip(&self.states) {
            if let Some(code) = s.last_xid {
                problems.push(format!(
                    "GPU {} ({}): {} XID error(s), the last XID {code}",
                    g.index,
                    g.uuid,
                    s.xid_by_code.values().sum::<u64>()
                ));
            }
        }
        problems
    }
}

/// The reads `vtax doctor --gpu` makes, a second apart; the last is timed
/// and shown. GPM's first tick has no earlier sample to difference against,
/// and its first computation of metrics in a process carries the driver's
/// one-time setup (5.0 ms of CPU on an H100, against 0.3-0.5 ms a tick
/// after it: `bench/agent/nvml_call_costs.py --first-ticks 5`), so only the
/// third read costs what every tick of a running agent will.
const DOCTOR_GPU_READS: usize = 3;

/// `vtax doctor --gpu`: every GPU with each metric's value in its unit, or
/// that it is not supported there, a lost one as lost, and what each driver
/// read cost in the last of `DOCTOR_GPU_READS` reads a second apart.
pub fn doctor_lines(config: &GpuConfig, roots: &Roots) -> Vec<String> {
    doctor_report(config, roots, std::time::Duration::from_secs(1))
}

/// [`doctor_lines`] with its reads `pause` apart.
fn doctor_report(config: &GpuConfig, roots: &Roots, pause: std::time::Duration) -> Vec<String> {
    let mut collector = Gpu::new(config, roots);
    let found = match collector.probe() {
        Availability::Absent(reason) | Availability::Failed(reason) => {
            return vec![format!("no GPU: {reason}")]
        }
        Availability::Available(found) => found,
    };
    let mut lines = vec![found];
    let batches = match doctor_reads(&mut collector, pause) {
        Ok(batches) => batches,
        Err(e) => return vec![format!("reading the GPUs failed: {e:#}")],
    };
    let samples = batches.iter().find(|b| std::ptr::eq(b.table, &GPU));
    let tag = |batch: &Batch, t: usize, row: usize| -> String {
        let column = &batch.tags[t];
        column.dict[column.codes[row] as usize].clone()
    };
    for (gpu, state) in collector.gpus.iter().zip(&collector.states) {
        let head = format!("GPU {} {} {}", gpu.index, gpu.uuid, gpu.name);
        let sample = samples.and_then(|batch| {
            (0..batch.len())
                .find(|&row| tag(batch, 1, row) == gpu.uuid)
                .map(|row| (batch, row))
        });
        let Some((batch, row)) = sample else {
            // No sample: lost, or its read failed; the problem says which.
            let prefix = format!("GPU {} ({}): ", gpu.index, gpu.uuid);
            let why = state
                .problems
                .first()
                .map_or("no sample", |p| p.strip_prefix(&prefix).unwrap_or(p));
            lines.push(format!("{head}: {why}; no values until it answers again"));
            continue;
        };
        lines.push(format!("{head}: up"));
        for (field, column) in GPU.fields.iter().zip(&batch.fields) {
            let value = if !column.is_valid(row) {
                "not supported".to_string()
            } else {
                match &column.values {
                    vtax_store::batch::Values::F64(v) => human(field, v[row]),
                    vtax_store::batch::Values::I64(v) => human(field, v[row] as f64),
                    vtax_store::batch::Values::U64(v) if field.name == "clock_event_reasons" => {
                        clock_event_reasons(v[row])
                    }
                    vtax_store::batch::Values::U64(v) if field.unit == Unit::None => {
                        v[row].to_string()
                    }
                    vtax_store::batch::Values::U64(v) => human(field, v[row] as f64),
                }
            };
            lines.push(format!("  {:<34} {value}", field.name));
        }
        lines.extend(read_time_lines(collector.backend.as_deref(), gpu.index));
    }
    for problem in collector.problems() {
        lines.push(format!("problem: {problem}"));
    }
    lines
}

/// A value as a person reads it, in its field's unit: 93.1%, 412.0 W,
/// 67 °C, 1980 MHz, 79.6 GiB, 3352.3 GB/s (decimal, as the vendors quote
/// bandwidth; memory sizes are binary, as NVML and nvidia-smi give them).
fn human(field: &FieldDef, value: f64) -> String {
    const GIB: f64 = (1u64 << 30) as f64;
    const MIB: f64 = (1u64 << 20) as f64;
    match field.unit {
        Unit::Ratio => format!("{:.1}%", value * 100.0),
        Unit::Watts => format!("{value:.1} W"),
        Unit::Celsius => format!("{value:.0} °C"),
        Unit::Hertz => format!("{:.0} MHz", value / 1e6),
        Unit::Bytes if value.abs() >= GIB => format!("{:.1} GiB", value / GIB),
        Unit::Bytes => format!("{:.1} MiB", value / MIB),
        Unit::BytesPerSecond if value.abs() >= 1e8 || value == 0.0 => {
            format!("{:.1} GB/s", value / 1e9)
        }
        Unit::BytesPerSecond => format!("{:.1} MB/s", value / 1e6),
        Unit::Joules if value.abs() >= 1e6 => format!("{:.2} MJ", value / 1e6),
        Unit::Joules => format!("{:.1} kJ", value / 1e3),
        Unit::Seconds => format!("{value:.3} s"),
        Unit::None if value.fract() == 0.0 => format!("{value:.0}"),
        Unit::None => value.to_string(),
    }
}

/// NVML's clock event reasons bitmask, with the reasons it holds by name.
fn clock_event_reasons(mask: u64) -> String {
    let held: Vec<&str> = CLOCK_EVENT_REASONS
        .iter()
        .filter(|(_, bit)| mask & bit != 0)
        .map(|(reason, _)| *reason)
        .collect();
    if held.is_empty() {
        format!("{mask:#x}: none")
    } else {
        format!("{mask:#x}: {}", held.join(", "))
    }
}

/// Reads every GPU `DOCTOR_GPU_READS` times, `pause` apart, with the driver
/// reads of the last one timed; that read's rows.
fn doctor_reads(collector: &mut Gpu, pause: std::time::Duration) -> anyhow::Result<Vec<Batch>> {
    let mut read = collector.collect(crate::timespec::now_us())?;
    for done in 1..DOCTOR_GPU_READS {
        std::thread::sleep(pause);
        if done + 1 == DOCTOR_GPU_READS {
            if let Some(backend) = collector.backend.as_mut() {
                backend.time_reads();
            }
        }
        read = collector.collect(crate::timespec::now_us())?;
    }
    Ok(read)
}

/// The doctor's table of what each driver read of one GPU cost, slowest first.
fn read_time_lines(backend: Option<&dyn GpuBackend>, gpu: u32) -> Vec<String> {
    let mut times = backend.map(|b| b.read_times(gpu)).unwrap_or_default();
    if times.is_empty() {
        return Vec::new();
    }
    times.sort_by(|a, b| b.wall_seconds.total_cmp(&a.wall_seconds));
    let row = |read: &str, wall_seconds: f64, cpu_seconds: f64| {
        format!(
            "    {read:<46} {:>9.3} {:>9.3}",
            wall_seconds * 1e3,
            cpu_seconds * 1e3
        )
    };
    let mut lines = vec![format!(
        "  {:<48} {:>9} {:>9}",
        "driver reads, slowest first", "wall ms", "CPU ms"
    )];
    lines.extend(
        times
            .iter()
            .map(|t| row(t.read, t.wall_seconds, t.cpu_seconds)),
    );
    let (wall, cpu) = times.iter().fold((0.0, 0.0), |(w, c), t| {
        (w + t.wall_seconds, c + t.cpu_seconds)
    });
    lines.push(row("all reads", wall, cpu));
    lines
}

#[cfg(test)]
mod tests {
    use super::*;
    use vtax_store::batch::Values;

    fn simulated(scenarios: &[&str]) -> Gpu {
        let config = GpuConfig {
            simulate_gpus: scenarios.len() as u32,
            simulate_scenarios: scenarios.iter().map(|s| s.to_string()).collect(),
            ..GpuConfig::default()
        };
        let roots = Roots {
            procfs: "/nonexistent/proc".into(),
            sysfs: "/nonexistent/sys".into(),
            ..Roots::default()
        };
        let mut gpu = Gpu::new(&config, &roots);
        assert!(matches!(gpu.probe(), Availability::Available(_)));
        gpu
    }

    fn table<'a>(batches: &'a [Batch], table: &TableDef) -> Option<&'a Batch> {
        batches.iter().find(|b| std::ptr::eq(b.table, table))
    }

    /// The value of `field` in the row whose first tags are `tags`.
    fn value(batches: &[Batch], table_def: &TableDef, tags: &[&str], field: &str) -> Option<f64> {
        let batch = table(batches, table_def)?;
        let column = &batch.fields[table_def.field_index(field).expect("field exists")];
        let row = (0..batch.len()).find(|&r| {
            tags.iter().enumerate().all(|(t, want)| {
                let c = &batch.tags[t];
                c.dict[c.codes[r] as usize] == *want
            })
        })?;
        column.is_valid(row).then(|| match &column.values {
            Values::F64(v) => v[row],
            Values::I64(v) => v[row] as f64,
            Values::U64(v) => v[row] as f64,
        })
    }

    #[test]
    fn a_lost_gpu_is_reported_and_the_others_go_on() {
        let mut gpu = simulated(&["training", "gpu-lost", "training"]);
        let batches = gpu.collect(1_000_000).unwrap();
        let rows = table(&batches, &GPU).unwrap();
        assert_eq!(rows.tags[0].dict, vec!["0", "2"], "GPU 1 has no sample row");
        assert_eq!(value(&batches, &HEALTH, &["1"], "up"), Some(0.0));
        assert_eq!(value(&batches, &HEALTH, &["2"], "up"), Some(1.0));
        assert_eq!(
            value(&batches, &XID, &["1", &gpu.gpus[1].uuid, "79"], "errors"),
            Some(1.0)
        );
        let events = table(&batches, &EVENT).unwrap();
        let kinds: Vec<&str> = events.tags[2]
            .codes
            .iter()
            .map(|&c| events.tags[2].dict[c as usize].as_str())
            .collect();
        assert_eq!(kinds, vec!["lost", "xid"]);
        // The info row stays, so the operator knows which board to pull.
        assert_eq!(table(&batches, &INFO).unwrap().len(), 3);
        assert!(gpu
            .problems()
            .iter()
            .any(|p| p.contains("GPU 1") && p.contains("lost")));

        // The next tick: still down, counted, but no second "lost" event.
        let batches = gpu.collect(2_000_000).unwrap();
        assert_eq!(value(&batches, &HEALTH, &["1"], "sample_errors"), Some(2.0));
        assert!(table(&batches, &EVENT).is_none());
    }

    #[test]
    fn doctor_lists_a_lost_gpu_as_lost_and_values_in_their_units() {
        let config = GpuConfig {
            simulate_gpus: 2,
            simulate_scenarios: vec!["training".into(), "gpu-lost".into()],
            ..GpuConfig::default()
        };
        let roots = Roots {
            procfs: "/nonexistent/proc".into(),
            sysfs: "/nonexistent/sys".into(),
            ..Roots::default()
        };
        let lines = doctor_report(&config, &roots, std::time::Duration::ZERO);
        let text = lines.join("\n");
        let uuid = |i: u32| format!("GPU-5a1e0000-0000-4000-8000-00000000000{i}");
        let head = |i: u32| format!("GPU {i} {} NVIDIA H100 80GB HBM3: ", uuid(i));
        assert!(text.contains(&format!("{}up", head(0))), "{text}");
        assert!(
            text.contains(&format!(
                "{}lost: GPU has fallen off the bus (simulated XID 79); no values until it answers again",
                head(1)
            )),
            "{text}"
        );
        // The lost GPU lists no values: its line is followed by the problems.
        let after_lost = lines
            .iter()
            .skip_while(|l| !l.starts_with(&head(1)))
            .nth(1)
            .unwrap();
        assert!(after_lost.starts_with("problem: "), "{after_lost}");
        let value = |field: &str| {
            lines
                .iter()
                .find_map(|l| l.trim_start().strip_prefix(field))
                .unwrap_or_else(|| panic!("no {field}:\n{text}"))
                .trim()
                .to_string()
        };
        assert_eq!(value("memory_total_bytes"), "79.6 GiB");
        assert_eq!(value("hbm_peak_bytes_per_second"), "3352.3 GB/s");
        assert_eq!(value("nvlink_peak_bytes_per_second"), "900.0 GB/s");
        assert_eq!(value("sm_clock_max_hertz"), "1980 MHz");
        assert_eq!(value("power_limit_watts"), "700.0 W");
        assert_eq!(value("pcie_link_width_max"), "16");
        assert_eq!(value("clock_event_reasons"), "0x0: none");
        assert!(value("temperature_celsius").ends_with(" °C"), "{text}");
        let utilization = value("utilization_ratio");
        let percent: f64 = utilization.strip_suffix('%').unwrap().parse().unwrap();
        assert!(percent > 50.0 && percent <= 100.0, "{utilization}");
    }

    #[test]
    fn doctor_values_read_in_their_units() {
        let field = |unit| FieldDef::gauge("x", FieldType::F64, unit, "");
        assert_eq!(human(&field(Unit::Ratio), 0.9312), "93.1%");
        assert_eq!(human(&field(Unit::Watts), 412.04), "412.0 W");
        assert_eq!(human(&field(Unit::Celsius), 66.6), "67 °C");
        assert_eq!(human(&field(Unit::Hertz), 1.98e9), "1980 MHz");
        assert_eq!(
            human(&field(Unit::Bytes), (81_559u64 << 20) as f64),
            "79.6 GiB"
        );
        assert_eq!(
            human(&field(Unit::Bytes), (512u64 << 20) as f64),
            "512.0 MiB"
        );
        assert_eq!(
            human(&field(Unit::BytesPerSecond), 3.35232e12),
            "3352.3 GB/s"
        );
        assert_eq!(human(&field(Unit::BytesPerSecond), 2.5e7), "25.0 MB/s");
        assert_eq!(human(&field(Unit::BytesPerSecond), 0.0), "0.0 GB/s");
        assert_eq!(human(&field(Unit::Joules), 1.234e6), "1.23 MJ");
        assert_eq!(human(&field(Unit::None), 18.0), "18");
        assert_eq!(
            clock_event_reasons(0x60),
            "0x60: sw_thermal_slowdown, hw_thermal_slowdown"
        );
    }

    #[test]
    fn scenarios_show_in_the_metrics_that_reveal_them() {
        let mut gpu = simulated(&[
            "training",
            "thermal-throttle",
            "pcie-degraded",
            "nvlink-hidden",
            "power-throttle",
        ]);
        gpu.collect(0).unwrap();
        let b = gpu.collect(10_000_000).unwrap();
        // Training: HBM bytes/s is the DRAM ratio times the H100's 3.35 TB/s peak.
        let ratio = value(&b, &GPU, &["0"], "dram_bandwidth_ratio").unwrap();
        let hbm = value(&b, &GPU, &["0"], "hbm_bytes_per_second").unwrap();
        assert!((hbm - ratio * 3.35232e12).abs() < 1e6, "{hbm} vs {ratio}");
        assert_eq!(value(&b, &GPU, &["0"], "clock_event_reasons"), Some(0.0));
        // Thermal: both thermal reasons, and the SM clock below its maximum.
        let uuid1 = gpu.gpus[1].uuid.clone();
        for reason in ["sw_thermal_slowdown", "hw_thermal_slowdown"] {
            assert_eq!(
                value(&b, &CLOCK_EVENT, &["1", &uuid1, reason], "active"),
                Some(1.0)
            );
        }
        assert_eq!(
            value(&b, &CLOCK_EVENT, &["1", &uuid1, "sw_power_cap"], "active"),
            Some(0.0)
        );
        assert!(
            value(&b, &GPU, &["1"], "sm_clock_hertz")
                < value(&b, &GPU, &["1"], "sm_clock_max_hertz")
        );
        // PCIe trained down under load, and replays counting.
        assert_eq!(value(&b, &GPU, &["2"], "pcie_link_gen"), Some(3.0));
        assert_eq!(value(&b, &GPU, &["2"], "pcie_link_width"), Some(8.0));
        assert!(value(&b, &GPU, &["2"], "pcie_replays").unwrap() > 0.0);
        // NVLink hidden: 0 links up of the product's 18, passthrough.
        assert_eq!(value(&b, &GPU, &["3"], "nvlink_links_up"), Some(0.0));
        assert_eq!(value(&b, &GPU, &["3"], "nvlink_links_product"), Some(18.0));
        assert_eq!(
            value(&b, &GPU, &["3"], "nvlink_total_rx_bytes_per_second"),
            None
        );
        // Power: at the limit with the power-cap reason.
        assert_eq!(
            value(&b, &GPU, &["4"], "power_watts"),
            value(&b, &GPU, &["4"], "power_limit_watts")
        );
        let problems = gpu.problems().join("\n");
        for needle in [
            "GPU 1 (",
            "sw_thermal_slowdown",
            "Gen3 x8 under load",
            "0 of 18 NVLink links up",
            "sw_power_cap",
        ] {
            assert!(problems.contains(needle), "{needle} in:\n{problems}");
        }
        assert!(
            !problems.contains("GPU 0 ("),
            "a healthy GPU has no problem:\n{problems}"
        );
    }

    /// Every counter series of `batches` as (table, tags, field) → value.
    fn counters(batches: &[Batch]) -> BTreeMap<String, f64> {
        let mut out = BTreeMap::new();
        for b in batches.iter().filter(|b| b.table.exported) {
            for (f, field) in b.table.fields.iter().enumerate() {
                if field.kind != vtax_store::MetricKind::Counter {
                    continue;
                }
                for row in (0..b.len()).filter(|&r| b.fields[f].is_valid(r)) {
                    let tags: Vec<&str> = b
                        .tags
                        .iter()
                        .map(|c| c.dict[c.codes[row] as usize].as_str())
                        .collect();
                    let v = match &b.fields[f].values {
                        Values::F64(v) => v[row],
                        Values::I64(v) => v[row] as f64,
                        Values::U64(v) => v[row] as f64,
                    };
                    out.insert(format!("{} {tags:?} {}", b.table.name, field.name), v);
                }
            }
        }
        out
    }

    /// A reload that changes the collector's settings builds it anew; the
    /// new one carries on the counts of the old, so none goes back or
    /// leaves (an XID counter once fell from 6 to 1 on SIGHUP).
    #[test]
    fn a_rebuilt_collector_takes_over_the_counts_of_the_old() {
        let mut old = simulated(&["xid", "gpu-lost", "training"]);
        old.collect(1_000_000).unwrap();
        let before = counters(&old.collect(122_000_000).unwrap());
        assert_eq!(
            before
                .iter()
                .filter(|(k, _)| k.starts_with("gpu_xid "))
                .count(),
            3,
            "31 and 13 on GPU 0, 79 on GPU 1: {before:?}"
        );
        let roots = Roots {
            procfs: "/nonexistent/proc".into(),
            sysfs: "/nonexistent/sys".into(),
            ..Roots::default()
        };
        // The same backend settings (the backend goes on), then other ones
        // (a new simulator, whose clock starts again).
        let changes: [fn(&mut GpuConfig); 2] = [
            |c| c.processes = false,
            |c| c.simulate_profile = "h200".into(),
        ];
        for change in changes {
            let mut config = old.config.clone();
            change(&mut config);
            let mut new = Gpu::new(&config, &roots);
            new.take_over(Box::new(old));
            assert!(matches!(new.probe(), Availability::Available(_)));
            let after = counters(&new.collect(123_000_000).unwrap());
            for (series, value) in &before {
                let now = after.get(series);
                // The driver's own counters, which a new simulator starts
                // again as a reloaded driver would.
                let kept_by_the_backend =
                    series.starts_with("gpu ") || series.starts_with("gpu_nvlink ");
                if kept_by_the_backend && config.simulate_profile == "h200" {
                    continue;
                }
                assert!(
                    now.is_some_and(|now| now >= value),
                    "{series}: {value} before, {now:?} after ({config:?})"
                );
            }
            old = new;
        }
    }

    #[test]
    fn counters_are_monotonic_across_ticks() {
        let mut gpu = simulated(&["xid"]);
        let a = gpu.collect(0).unwrap();
        let b = gpu.collect(61_000_000).unwrap();
        for field in ["energy_joules", "ecc_corrected_errors"] {
            assert!(
                value(&b, &GPU, &["0"], field) > value(&a, &GPU, &["0"], field),
                "{field}"
            );
        }
        let uuid = gpu.gpus[0].uuid.clone();
        assert_eq!(value(&b, &XID, &["0", &uuid, "31"], "errors"), Some(1.0));
        assert_eq!(value(&b, &XID, &["0", &uuid, "13"], "errors"), Some(1.0));
        assert_eq!(value(&b, &HEALTH, &["0"], "last_xid"), Some(13.0));
    }

    #[test]
    fn mig_instances_are_rows_of_their_own() {
        let mut gpu = simulated(&["mig"]);
        let b = gpu.collect(0).unwrap();
        let mig = table(&b, &MIG).unwrap();
        assert_eq!(mig.len(), 3);
        assert_eq!(mig.tags[4].dict, vec!["3g.40gb", "2g.20gb", "1g.10gb"]);
        let processes = table(&b, &PROCESS).unwrap();
        assert_eq!(processes.len(), 3, "one process per instance");
    }

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

    #[test]
    fn without_a_driver_the_collector_is_off_with_the_reason() {
        let mut gpu = Gpu::new(&GpuConfig::default(), &Roots::default());
        // CI has no driver; on a GPU machine the same probe must find NVML.
        match (nvml::load(), gpu.probe()) {
            (Err(_), Availability::Absent(reason)) => {
                assert!(reason.contains("libnvidia-ml"), "{reason}")
            }
            (Ok(_), Availability::Available(found)) => assert!(found.contains("nvml"), "{found}"),
            (Ok(_), Availability::Absent(reason)) => {
                assert!(reason.contains("sees no GPU"), "{reason}")
            }
            (Err(e), Availability::Available(found)) => panic!("found {found} without NVML: {e}"),
            (_, Availability::Failed(reason)) => panic!("a driver read failed: {reason}"),
        }
    }

    /// A backend whose only driver reads are the times it was given.
    struct TimedReads(Vec<backend::ReadTime>);

    impl GpuBackend for TimedReads {
        fn kind(&self) -> &'static str {
            "timed"
        }
        fn driver_version(&self) -> String {
            String::new()
        }
        fn identities(&mut self) -> Result<Vec<GpuIdentity>, String> {
            Ok(Vec::new())
        }
        fn sample(&mut self, _: &GpuIdentity, _: i64) -> Result<GpuSample, SampleError> {
            Err(SampleError::Failed("no GPU".into()))
        }
        fn take_xids(&mut self) -> Vec<backend::XidEvent> {
            Vec::new()
        }
        fn read_times(&self, gpu: u32) -> Vec<backend::ReadTime> {
            if gpu == 0 {
                self.0.clone()
            } else {
                Vec::new()
            }
        }
    }

    /// Reads of the simulator so far, and how many came before the doctor
    /// turned timing on.
    #[derive(Default)]
    struct ReadCount {
        reads: u32,
        timed_after: Option<u32>,
    }

    /// The simulator, counting its reads into a count the test keeps.
    struct CountedReads {
        inner: Box<dyn GpuBackend>,
        count: std::sync::Arc<std::sync::Mutex<ReadCount>>,
    }

    impl GpuBackend for CountedReads {
        fn kind(&self) -> &'static str {
            "counted"
        }
        fn driver_version(&self) -> String {
            self.inner.driver_version()
        }
        fn identities(&mut self) -> Result<Vec<GpuIdentity>, String> {
            self.inner.identities()
        }
        fn sample(&mut self, gpu: &GpuIdentity, time_us: i64) -> Result<GpuSample, SampleError> {
            self.count.lock().unwrap().reads += 1;
            self.inner.sample(gpu, time_us)
        }
        fn take_xids(&mut self) -> Vec<backend::XidEvent> {
            self.inner.take_xids()
        }
        fn time_reads(&mut self) {
            let mut count = self.count.lock().unwrap();
            count.timed_after = Some(count.reads);
        }
    }

    /// GPM's first metrics of a process cost the driver ten times a later
    /// tick's (5.0 against 0.3-0.5 ms on an H100), and the second read is the
    /// first with metrics: the doctor must time a later one.
    #[test]
    fn doctor_times_the_third_read_not_the_one_with_gpm_setup() {
        let mut gpu = simulated(&["training"]);
        let count = std::sync::Arc::default();
        gpu.backend = Some(Box::new(CountedReads {
            inner: gpu.backend.take().expect("probed"),
            count: std::sync::Arc::clone(&count),
        }));
        let batches = doctor_reads(&mut gpu, std::time::Duration::ZERO).unwrap();
        assert!(batches
            .iter()
            .any(|b| std::ptr::eq(b.table, &GPU) && b.len() == 1));
        let count = count.lock().unwrap();
        assert_eq!(count.reads, 3);
        assert_eq!(
            count.timed_after,
            Some(2),
            "timing must start after the second read"
        );
    }

    #[test]
    fn doctor_lists_driver_reads_slowest_first_with_their_sum() {
        let read = |read, wall_seconds, cpu_seconds| backend::ReadTime {
            read,
            wall_seconds,
            cpu_seconds,
        };
        let backend = TimedReads(vec![
            read("memory_info", 0.000_050, 0.000_010),
            read("pcie_throughput(rx)", 0.020_100, 0.000_200),
            read("power_usage", 0.000_400, 0.000_300),
        ]);
        let lines = read_time_lines(Some(&backend), 0);
        let names: Vec<&str> = lines[1..]
            .iter()
            .map(|l| l.split_whitespace().next().unwrap())
            .collect();
        assert_eq!(
            names,
            ["pcie_throughput(rx)", "power_usage", "memory_info", "all"]
        );
        assert!(lines[1].ends_with("   20.100     0.200"), "{}", lines[1]);
        assert!(lines[4].ends_with("   20.550     0.510"), "{}", lines[4]);
        // A GPU that was not timed, and the simulator, print nothing.
        assert!(read_time_lines(Some(&backend), 1).is_empty());
        assert!(read_time_lines(None, 0).is_empty());
    }
}
