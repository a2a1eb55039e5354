//! What the detector writes: the verdict, the tax gauges, the suspects, one
//! score per resource, the events, and each signal's window values (from
//! which a restarted agent relearns its baselines).

use vtax_store::{FieldDef, FieldType, TableDef, TagDef, Unit};

const fn tag(name: &'static str, help: &'static str) -> TagDef {
    TagDef { name, help }
}

const fn ratio(name: &'static str, help: &'static str) -> FieldDef {
    FieldDef::gauge(name, FieldType::F64, Unit::Ratio, help)
}

const fn plain(name: &'static str, help: &'static str) -> FieldDef {
    FieldDef::gauge(name, FieldType::F64, Unit::None, help)
}

/// Every table the detector writes.
pub static TABLES: &[&TableDef] = &[
    &PLATFORM,
    &TAX,
    &NEIGHBOR,
    &NEIGHBOR_RESOURCE,
    &NEIGHBOR_EVENTS,
    &DETECTOR_SIGNAL,
];

vtax_store::table! {
    /// The verdict: `vtax_platform_info{verdict=...,...} 1`.
    pub static PLATFORM: TableDef, pub struct PlatformRow {
        name: "platform",
        help: "One row per detector window: the platform verdict and the evidence behind it as \
               tags, and 1. The host facts come from the `platform` collector (`platform_host`), \
               the GPU facts from NVML (`gpu_info`, `gpu`).",
        tags: [
            verdict = tag(
                "verdict",
                "`bare_metal`, `vm_passthrough` (whole GPUs in a VM), `vgpu`, `mig` (a MIG slice), \
                 `vm` (a VM without GPUs), or `unknown` until the host facts are in.",
            ),
            virtualization = tag("virtualization", "`vm`, `none` or `unknown`, as in `platform_host`."),
            hypervisor = tag("hypervisor", "The hypervisor, as in `platform_host` (`kvm`, `none`, ...)."),
            cloud = tag("cloud", "Cloud DMI name, as in `platform_host`."),
            product = tag("product", "DMI vendor and product, as in `platform_host`."),
            gpu_virtualization = tag(
                "gpu_virtualization",
                "NVML virtualization modes of the GPUs, distinct values joined by `,`; `none` without GPUs.",
            ),
            mig = tag("mig", "`on` when any GPU has MIG enabled, `off`, or `none` without GPUs."),
            nvlink = tag(
                "nvlink",
                "NVLink links up against the product's count, summed over GPUs (`18/18`), or `none`.",
            ),
            pcie = tag(
                "pcie",
                "`full` when every busy GPU's link runs at its maximum generation and width, \
                 `degraded` when one does not, `idle` when no GPU was busy enough to tell, or `none`.",
            ),
            iommu = tag("iommu", "`on`, `pt`, `off` or `unknown`, as in `platform_host`."),
            gpudirect_rdma = tag("gpudirect_rdma", "GPUDirect RDMA module, as in `platform_host`."),
        ],
        fields: [info: i64 = FieldDef::gauge(
            FieldType::I64,
            Unit::None,
            "Always 1: the verdict and evidence are in the labels.",
        )],
        exported: true,
    }
}

vtax_store::table! {
    /// The measured tax, node-wide.
    pub static TAX: TableDef, pub struct TaxRow {
        name: "tax",
        help: "One row per detector window: what the platform takes, measured. A field is null \
               when its source is absent or, for the GPU ratios, when no GPU was busy. Steal and the \
               GPU ratios are means over the window's seconds (the GPU ratios over its seconds \
               with a busy GPU); the jitter fields are the last jitter window's (null once \
               two of its lengths pass without another: the probe off or failing), the links \
               missing and the probe's ratios the latest known.",
        tags: [],
        fields: [
            steal_ratio: Option<f64> = ratio("CPU time stolen by the hypervisor, averaged over CPUs and the window's seconds (/proc/stat)."),
            interrupted_ratio: Option<f64> = ratio(
                "Share of the jitter probe's spin time lost to gaps, averaged over probed CPUs (last jitter window).",
            ),
            unexplained_ratio: Option<f64> = ratio(
                "The part of the interrupted time that the guest cannot explain (not run delay, irq or steal): \
                 what the hypervisor or hardware took.",
            ),
            jitter_p99_seconds: Option<f64> = FieldDef::gauge(
                FieldType::F64,
                Unit::Seconds,
                "Worst CPU's 99th percentile wake-up latency in the last jitter window.",
            ),
            jitter_busy_ratio: Option<f64> = ratio(
                "How busy the probed CPUs were while probed, averaged over them (the jitter rows' busy_ratio, \
                 last jitter window): the regime interrupted_ratio and unexplained_ratio were measured in. \
                 Near 0 the CPUs halted between the probe's spins, and a spin then loses more than on a busy CPU: \
                 compare nodes of like busy ratio.",
            ),
            hbm_peak_ratio: Option<f64> = ratio(
                "HBM bytes/s achieved against the peak, averaged over GPUs busier than 50%, then over the window's seconds.",
            ),
            nvlink_peak_ratio: Option<f64> = ratio(
                "NVLink receive plus transmit against the peak of the products' links (hidden links count as lost), \
                 averaged over GPUs busier than 50%, then over the window's seconds.",
            ),
            nvlink_links_missing_ratio: Option<f64> = ratio(
                "NVLink links not up against the links the products have, over all GPUs (hidden in a VM or down).",
            ),
            pcie_bandwidth_loss_ratio: Option<f64> = ratio(
                "Worst busy GPU's PCIe bandwidth lost to a link trained below its generation or width, averaged over the window's seconds.",
            ),
            gpu_clock_throttle_ratio: Option<f64> = ratio(
                "Worst GPU's SM clock below its maximum while a power or thermal slowdown is active, averaged over the window's seconds.",
            ),
            probe_host_to_device_ratio: Option<f64> = ratio(
                "Lowest GPU's host-to-device copy against its PCIe link at its maximum, from the transfer probe's latest run on it (gpu_probe); null until a GPU was probed.",
            ),
            probe_device_to_host_ratio: Option<f64> = ratio(
                "Lowest GPU's device-to-host copy against its PCIe link at its maximum, from the transfer probe's latest run on it.",
            ),
            probe_device_to_device_ratio: Option<f64> = ratio(
                "Lowest GPU's copy within the GPU (HBM traffic) against the HBM peak, from the transfer probe's latest run on it.",
            ),
        ],
        exported: true,
    }
}

vtax_store::table! {
    /// `vtax_neighbor_suspected{resource,victim,suspect}`.
    pub static NEIGHBOR: TableDef, pub struct NeighborRow {
        name: "neighbor",
        help: "One row per detector window for each suspect an open noisy-neighbour event ranks \
               (its top three), per resource and victim: where two events of a victim's resource \
               rank one suspect, its higher score. No row: nothing suspected.",
        tags: [
            resource = tag("resource", "`cpu`, `memory`, `io`, `gpu` or `network`."),
            victim = tag("victim", "`node`, a cgroup path, `gpu<N>`, or an RDMA port `mlx5_0/1`."),
            suspect = tag(
                "suspect",
                "A leaf cgroup path, or a GPU process (its container, pod or job, else `pid:<pid>/<command>`).",
            ),
        ],
        fields: [
            suspected: f64 = plain(
                "Suspect score: correlation of its usage with the victim's signal times how material its usage change was.",
            ),
            correlation: f64 = plain("Pearson correlation of the suspect's usage with the victim signal."),
        ],
        exported: true,
    }
}

vtax_store::table! {
    /// A score per resource.
    pub static NEIGHBOR_RESOURCE: TableDef, pub struct NeighborResourceRow {
        name: "neighbor_resource",
        help: "One row per detector window and resource: how far its worst signal is from normal.",
        tags: [resource = tag("resource", "`cpu`, `memory`, `io`, `gpu` or `network`.")],
        fields: [
            score: f64 = plain(
                "Worst signal's distance from its baseline in robust standard deviations (for fixed-threshold \
                 signals, value / threshold × the open level); 0 when every signal is at or below its baseline.",
            ),
            events_open: i64 = FieldDef::gauge(FieldType::I64, Unit::None, "Noisy-neighbour events open."),
        ],
        exported: true,
    }
}

vtax_store::table! {
    /// One row when an event opens, one when it closes.
    pub static NEIGHBOR_EVENTS: TableDef, pub struct NeighborEventRow {
        name: "neighbor_events",
        help: "Noisy-neighbour events: a row when one opens, a row each time an open event \
               names a suspect it has not named first before, and a row when it closes, with \
               the suspects and the evidence. Stored only.",
        tags: [
            resource = tag("resource", "`cpu`, `memory`, `io`, `gpu` or `network`."),
            victim = tag("victim", "`node`, a cgroup path, `gpu<N>`, or an RDMA port."),
            signal = tag("signal", "The victim signal that held over its threshold, e.g. `pressure_some_ratio`."),
            state = tag("state", "`open`, `updated` (still open, with a new first suspect: an antagonist that arrived while the event was open) or `closed`."),
            suspects = tag(
                "suspects",
                "Ranked suspects, `name score=… r=… effect=…` joined by `; `, a name's `%` and `;` written `%25` and `%3B`; empty when none correlates.",
            ),
            evidence = tag("evidence", "The signal against its baseline, in words and numbers."),
        ],
        fields: [
            start_time_seconds: f64 = FieldDef::gauge(FieldType::F64, Unit::Seconds, "When the event's first abnormal window began, Unix time."),
            end_time_seconds: Option<f64> = FieldDef::gauge(FieldType::F64, Unit::Seconds, "When it closed, Unix time; null while open."),
            score: f64 = plain("Peak distance from the baseline, as in `neighbor_resource`."),
            top_correlation: Option<f64> = plain("Correlation of the first suspect; null without one."),
            effect_size: Option<f64> = plain("First suspect's effect: the signal's mean when it was busy minus when it was quiet."),
        ],
        exported: false,
    }
}

vtax_store::table! {
    /// Each signal's value per window: the baseline's memory.
    pub static DETECTOR_SIGNAL: TableDef, pub struct DetectorSignalRow {
        name: "detector_signal",
        help: "One row per detector window and victim signal: its value, the baseline it was judged \
               against, and whether it was learned. A restarted agent relearns its baselines from \
               these rows. Stored only.",
        tags: [
            resource = tag("resource", "`cpu`, `memory`, `io`, `gpu` or `network`."),
            victim = tag(
                "victim",
                "`node`, a cgroup path, `gpu<N>`, or an RDMA port.",
            ),
            signal = tag("signal", "The signal's name."),
        ],
        fields: [
            value: f64 = plain("The window's mean of the per-second signal."),
            baseline_median: Option<f64> = plain(
                "Median of the baseline before this window; null while empty.",
            ),
            baseline_mad: Option<f64> = plain("Median absolute deviation of the baseline."),
            z: f64 = plain(
                "Robust z of the value against the baseline (or value/threshold × open level).",
            ),
            abnormal: i64 = FieldDef::gauge(
                FieldType::I64,
                Unit::None,
                "1 when this window was far above its baseline or over its threshold: it counts towards an event (once the baseline has min_baseline_windows, held ones included) and is not learned into the baseline.",
            ),
        ],
        exported: false,
    }
}

/// The tables of a store the detector reads back (a replay, its tests): the
/// store's own, the collectors' and the detector's.
pub fn catalog() -> vtax_store::Catalog {
    let mut tables: Vec<&'static TableDef> = vtax_store::tables::BUILTIN.to_vec();
    tables.extend(vtax_collectors::tables());
    tables.extend(TABLES);
    vtax_store::Catalog::new(&tables).expect("the built-in table declarations are valid")
}
