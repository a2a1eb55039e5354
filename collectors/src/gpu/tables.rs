//! The collector's tables: one declaration each gives the schema, the
//! Prometheus names, the help and the typed row the collector fills.

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

vtax_store::table! {
    /// One row per GPU per tick.
    pub static GPU: TableDef, pub struct GpuRow {
        name: "gpu",
        help: "One row per GPU per tick: utilisation and GPM activity, HBM bandwidth against its peak, clocks against their maxima, power, temperatures, memory, ECC, PCIe and NVLink totals. Null where the GPU or driver does not support a value (GPM before Hopper). The power limit, ECC counters, remapped rows and PCIe replays are read every slow_reads_interval_secs (30 s by default) and keep their last value in between. On a quiet GPU (no compute process, utilisation 0, MIG off) so are the GPM figures, the PCIe throughput and the PCIe link, each as the last quiet tick read them; the first tick anything runs reads them again, with null GPM figures that tick (GPM's interval would span the quiet seconds).",
        tags: [
            gpu = GPU_TAG,
            gpu_uuid = UUID_TAG,
        ],
        fields: [
            utilization_ratio: Option<f64> = ratio("Fraction of the last sample period in which a kernel ran (NVML utilization.gpu): busy, not how much of the GPU was used."),
            memory_utilization_ratio: Option<f64> = ratio("Fraction of the last sample period in which device memory was read or written (NVML utilization.memory)."),
            sm_active_ratio: Option<f64> = ratio("GPM: fraction of SMs with a warp resident, averaged over the interval. Hopper and newer."),
            sm_occupancy_ratio: Option<f64> = ratio("GPM: resident warps against the SMs' maximum, averaged over the interval."),
            tensor_active_ratio: Option<f64> = ratio("GPM: fraction of the interval any tensor pipe was busy."),
            dram_bandwidth_ratio: Option<f64> = ratio("GPM: HBM bandwidth used against the peak, over the interval."),
            hbm_bytes_per_second: Option<f64> = rate("HBM bandwidth achieved: dram_bandwidth_ratio times hbm_peak_bytes_per_second."),
            hbm_peak_bytes_per_second: Option<f64> = rate("HBM peak: memory bus width in bytes (NVML gives bits) times the maximum memory clock times two (double data rate); 3.35e12 on an H100 SXM."),
            sm_clock_hertz: Option<f64> = hertz("SM clock now."),
            sm_clock_max_hertz: Option<f64> = hertz("Highest SM clock of the GPU."),
            memory_clock_hertz: Option<f64> = hertz("Memory clock now."),
            memory_clock_max_hertz: Option<f64> = hertz("Highest memory clock of the GPU."),
            clock_event_reasons: Option<u64> = count("NVML clock event (throttle) reasons as a bitmask: 0x1 idle, 0x2 application clocks, 0x4 software power cap, 0x8 hardware slowdown, 0x10 sync boost, 0x20 software thermal, 0x40 hardware thermal, 0x80 power brake, 0x100 display clocks (one series per reason in gpu_clock_event)."),
            power_watts: Option<f64> = FieldDef::gauge(FieldType::F64, Unit::Watts, "Power draw."),
            power_limit_watts: Option<f64> = FieldDef::gauge(FieldType::F64, Unit::Watts, "Power limit the driver enforces now."),
            energy_joules: Option<f64> = FieldDef::counter(FieldType::F64, Unit::Joules, "Energy since the driver loaded (Volta and newer): the driver's exact counter every energy_interval_secs (quiet_energy_interval_secs on a GPU with nothing running), power_watts integrated in between; never goes back."),
            energy_exact_age_seconds: Option<f64> = FieldDef::gauge(FieldType::F64, Unit::Seconds, "Seconds since energy_joules was last the driver's exact counter; null on a GPU without the counter."),
            energy_integration_error_joules: Option<f64> = FieldDef::gauge(FieldType::F64, Unit::Joules, "At the last exact read of the energy counter: the counter as integrated from the power readings minus the exact one, over the interval before it (positive: the integration ran ahead). Null until the second exact read."),
            temperature_celsius: Option<f64> = FieldDef::gauge(FieldType::F64, Unit::Celsius, "GPU die temperature."),
            memory_temperature_celsius: Option<f64> = FieldDef::gauge(FieldType::F64, Unit::Celsius, "HBM temperature."),
            memory_used_bytes: Option<u64> = FieldDef::gauge(FieldType::U64, Unit::Bytes, "Device memory allocated, apart from what the driver reserves for itself; drivers before R510 count that reservation in (vtax doctor --gpu says so)."),
            memory_total_bytes: Option<u64> = FieldDef::gauge(FieldType::U64, Unit::Bytes, "Device memory installed."),
            ecc_corrected_errors: Option<u64> = events("Corrected (single-bit) ECC errors since the driver loaded."),
            ecc_uncorrected_errors: Option<u64> = events("Uncorrected (double-bit) ECC errors since the driver loaded."),
            remapped_rows_correctable: Option<u64> = count("HBM rows remapped after correctable errors."),
            remapped_rows_uncorrectable: Option<u64> = count("HBM rows remapped after uncorrectable errors."),
            remapping_pending: Option<u64> = count("1 when a row remapping waits for a GPU reset."),
            remapping_failed: Option<u64> = count("1 when a row remapping failed: the GPU needs service."),
            pcie_rx_bytes_per_second: Option<f64> = rate("PCIe receive throughput: GPM over the interval where it runs, else NVML's 20 ms sample."),
            pcie_tx_bytes_per_second: Option<f64> = rate("PCIe transmit throughput: GPM over the interval where it runs, else NVML's 20 ms sample."),
            pcie_link_gen: Option<u64> = count("PCIe generation the link trained to now (idle links train down; compare under load)."),
            pcie_link_gen_max: Option<u64> = count("Highest PCIe generation of the GPU and its slot."),
            pcie_link_width: Option<u64> = count("PCIe lanes the link trained to now."),
            pcie_link_width_max: Option<u64> = count("Widest PCIe link of the GPU and its slot."),
            pcie_replays: Option<u64> = events("PCIe replays since the driver loaded: link errors the link recovered from."),
            nvlink_total_rx_bytes_per_second: Option<f64> = rate("GPM: NVLink receive throughput over all links (per link in gpu_nvlink)."),
            nvlink_total_tx_bytes_per_second: Option<f64> = rate("GPM: NVLink transmit throughput over all links (per link in gpu_nvlink)."),
            nvlink_links_up: u64 = count("NVLink links up. Fewer than nvlink_links_product means links are down or hidden (as in most VMs)."),
            nvlink_links_product: Option<u64> = count("NVLink links this product has, from its name; null when unknown."),
            nvlink_peak_bytes_per_second: Option<f64> = rate("NVLink peak, receive plus transmit, over the product's links: links × the generation's rate each way × 2 (9e11 on an H100 SXM); null when the product or architecture is unknown."),
        ],
        exported: true,
    }
}

vtax_store::table! {
    /// Facts about each GPU.
    pub static INFO: TableDef, pub struct GpuInfoRow {
        name: "gpu_info",
        help: "One row per GPU per tick: its facts as tags, and 1.",
        tags: [
            gpu = GPU_TAG,
            gpu_uuid = UUID_TAG,
            name = tag("name", "Product name, e.g. `NVIDIA H100 80GB HBM3`."),
            pci_bus_id = tag("pci_bus_id", "PCI bus id, e.g. `00000000:18:00.0`."),
            architecture = tag("architecture", "`hopper`, `ampere`, `blackwell`, …"),
            virtualization_mode = tag("virtualization_mode", "NVML's virtualization mode: `bare`, `passthrough` (whole GPU in a VM), `vgpu`, `host_vgpu`, `host_vsga`, or `unknown`."),
            mig = tag("mig", "`on` or `off`: whether MIG partitions the GPU."),
            driver_version = tag("driver_version", "NVIDIA driver version."),
            backend = tag("backend", "`nvml`, or `simulated` when the simulated backend runs."),
        ],
        fields: [
            info: u64 = count("Always 1: the facts are in the labels."),
        ],
        exported: true,
    }
}

vtax_store::table! {
    /// Whether each GPU answers.
    pub static HEALTH: TableDef, pub struct GpuHealthRow {
        name: "gpu_health",
        help: "One row per GPU per tick: whether it answered, its failed reads and its last XID (the counts by code are in gpu_xid).",
        tags: [
            gpu = GPU_TAG,
            gpu_uuid = UUID_TAG,
        ],
        fields: [
            up: u64 = count("1 when the GPU answered this tick; 0 when it is lost (fell off the bus) or its read failed."),
            sample_errors: u64 = events("Ticks on which reading the GPU failed, since the agent started."),
            values_left_out: u64 = events("Values the driver reported that were left out as not believed (outside what any GPU can report, or an exact energy read that does not follow the one before), since the agent started; vtax doctor --gpu names them."),
            last_xid: Option<u64> = count("Code of the last XID error since the agent started; null when none."),
        ],
        exported: true,
    }
}

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

vtax_store::table! {
    /// One series per clock event reason.
    pub static CLOCK_EVENT: TableDef, pub struct GpuClockEventRow {
        name: "gpu_clock_event",
        help: "One row per GPU, clock event (throttle) reason and tick: whether that reason holds the clocks down now.",
        tags: [
            gpu = GPU_TAG,
            gpu_uuid = UUID_TAG,
            reason = tag("reason", "`gpu_idle`, `applications_clocks_setting`, `sw_power_cap`, `hw_slowdown`, `sync_boost`, `sw_thermal_slowdown`, `hw_thermal_slowdown`, `hw_power_brake_slowdown`, `display_clock_setting`."),
        ],
        fields: [
            active: u64 = count("1 while the reason holds the clocks down."),
        ],
        exported: true,
    }
}

vtax_store::table! {
    /// Each NVLink link.
    pub static NVLINK: TableDef, pub struct GpuNvlinkRow {
        name: "gpu_nvlink",
        help: "One row per GPU, NVLink link and tick: state, GPM throughput and the data-link error counters. Links NVML does not answer for (absent, or hidden by a hypervisor) have no row. The state and error counters are read every slow_reads_interval_secs (30 s by default) and keep their last value in between; the throughput is each tick's.",
        tags: [
            gpu = GPU_TAG,
            gpu_uuid = UUID_TAG,
            link = tag("link", "Link number, from 0."),
        ],
        fields: [
            up: u64 = count("1 when the link is active."),
            rx_bytes_per_second: Option<f64> = rate("GPM: receive throughput of the link."),
            tx_bytes_per_second: Option<f64> = rate("GPM: transmit throughput of the link."),
            crc_errors: Option<u64> = events("Data-link CRC errors on flits."),
            replay_errors: Option<u64> = events("Data-link replays."),
            recovery_errors: Option<u64> = events("Data-link recoveries: the link retrained."),
        ],
        exported: true,
    }
}

vtax_store::table! {
    /// MIG instances.
    pub static MIG: TableDef, pub struct GpuMigRow {
        name: "gpu_mig",
        help: "One row per MIG device and tick, on GPUs with MIG on: a GPU instance, or each compute instance of one split into several (then each row repeats its GPU instance's memory: sum over distinct gpu_instance).",
        tags: [
            gpu = GPU_TAG,
            gpu_uuid = UUID_TAG,
            gpu_instance = tag("gpu_instance", "MIG GPU instance id, as a process's gpu_instance gives it; `unknown` where the driver did not give it."),
            mig_uuid = tag("mig_uuid", "The MIG device's UUID (MIG-…)."),
            profile = tag("profile", "MIG profile, e.g. `1g.10gb` (NVML's name for the device less the product's)."),
        ],
        fields: [
            memory_used_bytes: Option<u64> = FieldDef::gauge(FieldType::U64, Unit::Bytes, "Memory allocated in the GPU instance; drivers before R510 count the driver's reservation in."),
            memory_total_bytes: Option<u64> = FieldDef::gauge(FieldType::U64, Unit::Bytes, "Memory of the GPU instance."),
            sm_active_ratio: Option<f64> = ratio("GPM: SM activity of the instance. The simulator's only: the NVML backend does not read an instance's GPM yet, and leaves it null."),
        ],
        exported: true,
    }
}

vtax_store::table! {
    /// Processes on each GPU and whose they are.
    pub static PROCESS: TableDef, pub struct GpuProcessRow {
        name: "gpu_process",
        help: "One row per compute process per GPU per tick: its GPU memory and share of SM time, and whose it is, from its cgroup. Under MPS, a row for the server and one for each of its clients.",
        tags: [
            gpu = GPU_TAG,
            gpu_uuid = UUID_TAG,
            pid = tag("pid", "Process id in the agent's PID namespace."),
            command = tag("command", "The process's comm; empty when it is in another PID namespace."),
            workload = tag("workload", "What its cgroup holds: `container`, `pod`, `slurm_job`, `slurm_step`, `service`, `slice`, `other`, or `unknown`."),
            cgroup = tag("cgroup", "Its cgroup path below the cgroup root."),
            container = tag("container", "Container id (12 hex digits) when it runs in one."),
            pod_uid = tag("pod_uid", "Kubernetes pod UID when it runs in a pod."),
            slurm_job = tag("slurm_job", "Slurm job id when it runs in a job."),
        ],
        fields: [
            used_memory_bytes: Option<u64> = FieldDef::gauge(FieldType::U64, Unit::Bytes, "GPU memory the process holds."),
            sm_utilization_ratio: Option<f64> = ratio("Its share of SM time over the last interval."),
            memory_utilization_ratio: Option<f64> = ratio("Its share of memory-controller time over the last interval."),
            gpu_instance: Option<u64> = count("MIG GPU instance it runs in; null without MIG."),
        ],
        exported: true,
    }
}

vtax_store::table! {
    /// XID errors by code.
    pub static XID: TableDef, pub struct GpuXidRow {
        name: "gpu_xid",
        help: "One row per GPU, XID code seen and tick: how many errors of that code the driver reported, counted on across agent restarts (a restarted agent takes the count up from its store when it was stopped for under an hour).",
        tags: [
            gpu = GPU_TAG,
            gpu_uuid = UUID_TAG,
            xid = tag("xid", "XID code (e.g. 79: fell off the bus, 48: double-bit ECC, 13: graphics engine exception)."),
        ],
        fields: [
            errors: u64 = events("XID errors of this code, counted on across agent restarts of under an hour."),
        ],
        exported: true,
    }
}

vtax_store::table! {
    /// Events: each XID, and a GPU lost or back.
    pub static EVENT: TableDef, pub struct GpuEventRow {
        name: "gpu_event",
        help: "One row per event, stored only: an XID error (`xid`, code), a GPU lost (`lost`) or answering again (`recovered`).",
        tags: [
            gpu = GPU_TAG,
            gpu_uuid = UUID_TAG,
            kind = tag("kind", "`xid`, `lost` or `recovered`."),
        ],
        fields: [
            code: u64 = count("The XID code; 0 for other kinds."),
        ],
        exported: false,
    }
}
