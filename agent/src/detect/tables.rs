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

/// The verdict: `vtax_platform_info{verdict=...,...} 1`.
pub static PLATFORM: TableDef = TableDef {
    name: "platform",
    help: "One row per detector window: the platform verdict and the evidence behind it as \
           tags, and 1. The host facts come from the `platform` collector (`platform_host`), \
           the GPU facts from NVML (`gpu_info`, `gpu`).",
    tags: &[
        tag(
            "verdict",
            "`bare_metal`, `vm_passthrough` (whole GPUs in a VM), `vgpu`, `mig` (a MIG slice), \
             `vm` (a VM without GPUs), or `unknown` until the host facts are in.",
        ),
        tag("virtualization", "`vm`, `none` or `unknown`, as in `platform_host`."),
        tag("hypervisor", "The hypervisor, as in `platform_host` (`kvm`, `none`, ...)."),
        tag("cloud", "Cloud DMI name, as in `platform_host`."),
        tag("product", "DMI vendor and product, as in `platform_host`."),
        tag(
            "gpu_virtualization",
            "NVML virtualization modes of the GPUs, distinct values joined by `,`; `none` without GPUs.",
        ),
        tag("mig", "`on` when any GPU has MIG enabled, `off`, or `none` without GPUs."),
        tag(
            "nvlink",
            "NVLink links up against the product's count, summed over GPUs (`18/18`), or `none`.",
        ),
        tag(
            "pcie",
            "`full` when every busy GPU's link runs at its maximum generation and width, \
             `degraded` when one does not, `idle` when no GPU was busy enough to tell, or `none`.",
        ),
        tag("iommu", "`on`, `pt`, `off` or `unknown`, as in `platform_host`."),
        tag("gpudirect_rdma", "GPUDirect RDMA module, as in `platform_host`."),
    ],
    fields: &[FieldDef::gauge(
        "info",
        FieldType::I64,
        Unit::None,
        "Always 1: the verdict and evidence are in the labels.",
    )],
    exported: true,
};

/// The measured tax, node-wide.
pub static TAX: TableDef = TableDef {
    name: "tax",
    help: "One row per detector window: what the platform takes, measured. A field is null \
           when its source is absent or, for the GPU ratios, when no GPU was busy.",
    tags: &[],
    fields: &[
        ratio("steal_ratio", "CPU time stolen by the hypervisor, averaged over CPUs (/proc/stat)."),
        ratio(
            "interrupted_ratio",
            "Share of the jitter probe's spin time lost to gaps, averaged over probed CPUs (last jitter window).",
        ),
        ratio(
            "unexplained_ratio",
            "The part of the interrupted time that the guest cannot explain (not run delay, irq or steal): \
             what the hypervisor or hardware took.",
        ),
        FieldDef::gauge(
            "jitter_p99_seconds",
            FieldType::F64,
            Unit::Seconds,
            "Worst CPU's 99th percentile wake-up latency in the last jitter window.",
        ),
        ratio(
            "hbm_peak_ratio",
            "HBM bytes/s achieved against the peak, averaged over GPUs busier than 50%.",
        ),
        ratio(
            "nvlink_peak_ratio",
            "NVLink receive plus transmit against the peak of the products' links (hidden links count as lost), \
             averaged over GPUs busier than 50%.",
        ),
        ratio(
            "nvlink_links_missing_ratio",
            "NVLink links not up against the links the products have, over all GPUs (hidden in a VM or down).",
        ),
        ratio(
            "pcie_bandwidth_loss_ratio",
            "Worst busy GPU's PCIe bandwidth lost to a link trained below its generation or width.",
        ),
        ratio(
            "gpu_clock_throttle_ratio",
            "Worst GPU's SM clock below its maximum while a power or thermal slowdown is active.",
        ),
        ratio(
            "probe_host_to_device_ratio",
            "Lowest GPU's host-to-device copy against its PCIe link at its maximum, from the transfer probe's latest run on it (gpu_probe); null until a GPU was probed.",
        ),
        ratio(
            "probe_device_to_host_ratio",
            "Lowest GPU's device-to-host copy against its PCIe link at its maximum, from the transfer probe's latest run on it.",
        ),
        ratio(
            "probe_device_to_device_ratio",
            "Lowest GPU's copy within the GPU (HBM traffic) against the HBM peak, from the transfer probe's latest run on it.",
        ),
    ],
    exported: true,
};

/// `vtax_neighbor_suspected{resource,victim,suspect}`.
pub static NEIGHBOR: TableDef = TableDef {
    name: "neighbor",
    help: "One row per detector window for each ranked suspect of each open noisy-neighbour \
           event (the top three). No row: nothing suspected.",
    tags: &[
        tag("resource", "`cpu`, `memory`, `io`, `gpu` or `network`."),
        tag("victim", "`node`, a cgroup path, `gpu<N>`, or an RDMA port `mlx5_0/1`."),
        tag(
            "suspect",
            "A leaf cgroup path, or a GPU process (its container, pod or job, else `pid:<pid>/<command>`).",
        ),
    ],
    fields: &[
        plain(
            "suspected",
            "Suspect score: correlation of its usage with the victim's signal times how material its usage change was.",
        ),
        plain("correlation", "Pearson correlation of the suspect's usage with the victim signal."),
    ],
    exported: true,
};

/// A score per resource.
pub static NEIGHBOR_RESOURCE: TableDef = TableDef {
    name: "neighbor_resource",
    help: "One row per detector window and resource: how far its worst signal is from normal.",
    tags: &[tag("resource", "`cpu`, `memory`, `io`, `gpu` or `network`.")],
    fields: &[
        plain(
            "score",
            "Worst signal's distance from its baseline in robust standard deviations (for fixed-threshold \
             signals, value / threshold × the open level); 0 when every signal is at or below its baseline.",
        ),
        FieldDef::gauge("events_open", FieldType::I64, Unit::None, "Noisy-neighbour events open."),
    ],
    exported: true,
};

/// One row when an event opens, one when it closes.
pub static NEIGHBOR_EVENTS: TableDef = TableDef {
    name: "neighbor_events",
    help: "Noisy-neighbour events: a row when one opens and a row when it closes, with the \
           suspects and the evidence. Stored only.",
    tags: &[
        tag("resource", "`cpu`, `memory`, `io`, `gpu` or `network`."),
        tag("victim", "`node`, a cgroup path, `gpu<N>`, or an RDMA port."),
        tag("signal", "The victim signal that held over its threshold, e.g. `pressure_some_ratio`."),
        tag("state", "`open` or `closed`."),
        tag(
            "suspects",
            "Ranked suspects, `name score=… r=… effect=…` joined by `; `; empty when none correlates.",
        ),
        tag("evidence", "The signal against its baseline, in words and numbers."),
    ],
    fields: &[
        FieldDef::gauge("start_time_seconds", FieldType::F64, Unit::Seconds, "When the event's first abnormal window began, Unix time."),
        FieldDef::gauge("end_time_seconds", FieldType::F64, Unit::Seconds, "When it closed, Unix time; null while open."),
        plain("score", "Peak distance from the baseline, as in `neighbor_resource`."),
        plain("top_correlation", "Correlation of the first suspect; null without one."),
        plain("effect_size", "First suspect's effect: the signal's mean when it was busy minus when it was quiet."),
    ],
    exported: false,
};

/// Each signal's value per window: the baseline's memory.
pub static DETECTOR_SIGNAL: TableDef = TableDef {
    name: "detector_signal",
    help: "One row per detector window and victim signal: its value, the baseline it was judged \
           against, and whether it was learned. A restarted agent relearns its baselines from \
           these rows. Stored only.",
    tags: &[
        tag("resource", "`cpu`, `memory`, `io`, `gpu` or `network`."),
        tag(
            "victim",
            "`node`, a cgroup path, `gpu<N>`, or an RDMA port.",
        ),
        tag("signal", "The signal's name."),
    ],
    fields: &[
        plain("value", "The window's mean of the per-second signal."),
        plain(
            "baseline_median",
            "Median of the baseline before this window; null while empty.",
        ),
        plain("baseline_mad", "Median absolute deviation of the baseline."),
        plain(
            "z",
            "Robust z of the value against the baseline (or value/threshold × open level).",
        ),
        FieldDef::gauge(
            "abnormal",
            FieldType::I64,
            Unit::None,
            "1 when this window counted towards an event.",
        ),
    ],
    exported: false,
};
