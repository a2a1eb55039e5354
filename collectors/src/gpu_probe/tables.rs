//! The transfer probe's tables: one row per GPU per probe, one per ordered
//! pair with peer access, and the probes' outcomes counted per GPU.

use vtax_store::schema::{FieldDef, FieldType, TableDef, TagDef, Unit};

const GPU_TAG: TagDef = TagDef {
    name: "gpu",
    help: "NVML index of the GPU, from 0 (as the gpu collector's).",
};

const PEER_TAG: TagDef = TagDef {
    name: "peer",
    help: "NVML index of the GPU copied to.",
};

const OUTCOME_TAG: TagDef = TagDef {
    name: "outcome",
    help: "measured; busy (the GPU was busy again when its turn came, so it was left alone); no_driver (libcuda.so.1 could not be loaded); failed (a driver call failed).",
};

const fn rate(name: &'static str, help: &'static str) -> FieldDef {
    FieldDef::gauge(name, FieldType::F64, Unit::BytesPerSecond, help)
}

const fn ratio(name: &'static str, help: &'static str) -> FieldDef {
    FieldDef::gauge(name, FieldType::F64, Unit::Ratio, help)
}

const fn seconds(name: &'static str, help: &'static str) -> FieldDef {
    FieldDef::gauge(name, FieldType::F64, Unit::Seconds, help)
}

vtax_store::table! {
    /// One row per GPU per probe that measured it.
    pub static GPU_PROBE: TableDef, pub struct GpuProbeRow {
        name: "gpu_probe",
        help: "One row per GPU each time the transfer probe measured it (only after the GPU had no compute process and 0 utilisation for idle_secs, at most once per period_secs): what copies to, from and within the GPU got, each against its peak, and the launch latency. Each figure is the median of its timed repetitions.",
        tags: [gpu = GPU_TAG],
        fields: [
            host_to_device_bytes_per_second: f64 = rate("Host to device copy from pinned memory: bytes / median copy time."),
            host_to_device_peak_bytes_per_second: Option<f64> = rate("The PCIe link's peak each way at its maximum generation × width (of the GPU and the slot together); absent where NVML does not say."),
            host_to_device_ratio: Option<f64> = ratio("host_to_device_bytes_per_second over its peak: a link trained below its maximum, an IOMMU without ATS or a hypervisor show here."),
            device_to_host_bytes_per_second: f64 = rate("Device to host copy into pinned memory: bytes / median copy time."),
            device_to_host_peak_bytes_per_second: Option<f64> = rate("The PCIe link's peak each way at its maximum generation × width."),
            device_to_host_ratio: Option<f64> = ratio("device_to_host_bytes_per_second over its peak."),
            device_to_device_bytes_per_second: f64 = rate("A copy within the GPU as HBM traffic: 2 × bytes copied / median copy time."),
            device_to_device_peak_bytes_per_second: Option<f64> = rate("The HBM peak (bus width in bytes × memory clock × 2), as the gpu collector computes it."),
            device_to_device_ratio: Option<f64> = ratio("device_to_device_bytes_per_second over the HBM peak."),
            small_copy_round_trip_seconds: f64 = seconds("4 bytes host to device then device to host, synchronised: median, host-timed."),
            kernel_launch_seconds: f64 = seconds("An empty kernel launched and waited for: median, host-timed."),
            kernel_launch_event_seconds: f64 = seconds("The same launch between two events on the stream: median, event-timed."),
            probe_wall_seconds: f64 = seconds("Wall-clock time measuring this GPU took, its context's creation included."),
            probe_gpu_busy_seconds: f64 = seconds("GPU time the measuring took: the sum of its event-timed intervals, warm-ups included."),
            probe_cpu_seconds: f64 = seconds("CPU time of the probing thread while it measured this GPU (CLOCK_THREAD_CPUTIME_ID)."),
        ],
        exported: true,
    }
}

vtax_store::table! {
    /// One row per ordered pair of GPUs per probe, where peer access was allowed.
    pub static GPU_PROBE_PEER: TableDef, pub struct GpuProbePeerRow {
        name: "gpu_probe_peer",
        help: "One row per ordered pair of GPUs measured in the same probe, where the driver allows peer access: what a copy from gpu to peer got, against the NVLink links on the path × the per-link rate, or the slower PCIe link of the two. A pair without peer access has no row.",
        tags: [gpu = GPU_TAG, peer = PEER_TAG],
        fields: [
            peer_to_peer_bytes_per_second: f64 = rate("Peer copy from gpu to peer: bytes / median copy time."),
            peer_to_peer_peak_bytes_per_second: Option<f64> = rate("NVLink links on the path × the per-link rate each way, else the slower PCIe link of the two; absent where NVML does not say."),
            peer_to_peer_ratio: Option<f64> = ratio("peer_to_peer_bytes_per_second over its peak."),
            gpu_busy_seconds: f64 = seconds("GPU time the pair's copies took: the sum of their event-timed intervals."),
        ],
        exported: true,
    }
}

vtax_store::table! {
    /// Probes per GPU by outcome, since the agent started.
    pub static GPU_PROBE_OUTCOME: TableDef, pub struct GpuProbeOutcomeRow {
        name: "gpu_probe_outcome",
        help: "Per GPU and outcome, the probes started on it since the agent started: a probe that could not measure is counted here with its reason and leaves no figure in gpu_probe. The agent's log says why, when the reason starts or changes.",
        tags: [gpu = GPU_TAG, outcome = OUTCOME_TAG],
        fields: [
            probes: u64 = FieldDef::counter(FieldType::U64, Unit::None, "Probes of this GPU with this outcome since the agent started."),
        ],
        exported: true,
    }
}

/// Every table the collector writes.
pub static TABLES: &[&TableDef] = &[&GPU_PROBE, &GPU_PROBE_PEER, &GPU_PROBE_OUTCOME];
