//! The collector's tables: one declaration each gives the schema, the
//! Prometheus names and the help.

use vtax_store::schema::{FieldDef, FieldType, TableDef, TagDef, Unit};

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
pub(super) mod f {
    pub const COUNT: usize = 40;
}

/// One row per GPU per tick.
pub static GPU: TableDef = TableDef {
    name: "gpu",
    help: "One row per GPU per tick: utilisation and GPM activity, HBM bandwidth against its peak, clocks against their maxima, power, temperatures, memory, ECC, PCIe and NVLink totals. Null where the GPU or driver does not support a value (GPM before Hopper). The power limit, ECC counters, remapped rows and PCIe replays are read every slow_reads_interval_secs (30 s by default) and keep their last value in between.",
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
        FieldDef::counter("energy_joules", FieldType::F64, Unit::Joules, "Energy since the driver loaded (Volta and newer): the driver's exact counter every energy_interval_secs, power_watts integrated in between; never goes back."),
        FieldDef::gauge("energy_exact_age_seconds", FieldType::F64, Unit::Seconds, "Seconds since energy_joules was last the driver's exact counter; null on a GPU without the counter."),
        FieldDef::gauge("energy_integration_error_joules", FieldType::F64, Unit::Joules, "At the last exact read of the energy counter: the counter as integrated from the power readings minus the exact one, over the interval before it (positive: the integration ran ahead). Null until the second exact read."),
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
    help: "One row per GPU, NVLink link and tick: state, GPM throughput and the data-link error counters. Links NVML does not answer for (absent, or hidden by a hypervisor) have no row. The state and error counters are read every slow_reads_interval_secs (30 s by default) and keep their last value in between; the throughput is each tick's.",
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
