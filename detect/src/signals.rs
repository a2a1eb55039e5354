//! The signals the detector judges: what each measures, the resource it
//! belongs to and the rule it is judged by.

/// A resource a neighbour can take.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Resource {
    Cpu,
    Memory,
    Io,
    Gpu,
    Network,
}

impl Resource {
    pub const ALL: [Resource; 5] = [
        Resource::Cpu,
        Resource::Memory,
        Resource::Io,
        Resource::Gpu,
        Resource::Network,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Resource::Cpu => "cpu",
            Resource::Memory => "memory",
            Resource::Io => "io",
            Resource::Gpu => "gpu",
            Resource::Network => "network",
        }
    }

    pub fn parse(name: &str) -> Option<Resource> {
        Resource::ALL.into_iter().find(|r| r.name() == name)
    }

    /// A suspect usage change that counts as material when ranking: CPUs for
    /// cgroups, SM share for GPU processes, MiB/s of block I/O for cgroups
    /// under an I/O signal (a service's logging moves by less; a job reading
    /// or writing its data by far more).
    pub(super) fn usage_scale(self) -> f64 {
        match self {
            Resource::Io => 1.0,
            _ => 0.05,
        }
    }
}

/// How a signal is judged.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Rule {
    /// Against its learned baseline: abnormal at `z_open` and at least
    /// `min_change` above the median, and at least `min_relative_change`
    /// times the median above it (a latency tail is judged by how many times
    /// it grew: milliseconds of spread are noise on a tail of milliseconds);
    /// `z_floor` bounds the scale from below so that a flat baseline does
    /// not make noise look infinite.
    Baseline {
        min_change: f64,
        min_relative_change: f64,
        z_floor: f64,
    },
    /// Healthy is zero: abnormal above `threshold`, whatever was learned
    /// (a baseline would learn a link that was always trained down as normal).
    Above { threshold: f64 },
}

/// A victim signal's declaration.
#[derive(Debug)]
pub struct Spec {
    pub resource: Resource,
    pub signal: &'static str,
    pub rule: Rule,
    pub help: &'static str,
    /// Only something outside the guest can cause it (steal, the time the
    /// guest cannot explain): the hypervisor is its one suspect, and a
    /// workload of the guest that happened to move with it is not named.
    pub outside_guest: bool,
    /// A window's value is the median of its seconds, not their mean: for a
    /// latency sampled once a second, where one second the host preempted
    /// says nothing of the four around it.
    pub median_of_seconds: bool,
}

impl Spec {
    const fn outside_guest(self) -> Spec {
        Spec {
            outside_guest: true,
            ..self
        }
    }

    const fn median_of_seconds(self) -> Spec {
        Spec {
            median_of_seconds: true,
            ..self
        }
    }
}

const fn baseline(
    resource: Resource,
    signal: &'static str,
    min_change: f64,
    z_floor: f64,
    help: &'static str,
) -> Spec {
    relative_baseline(resource, signal, min_change, 0.0, z_floor, help)
}

const fn relative_baseline(
    resource: Resource,
    signal: &'static str,
    min_change: f64,
    min_relative_change: f64,
    z_floor: f64,
    help: &'static str,
) -> Spec {
    Spec {
        resource,
        signal,
        rule: Rule::Baseline {
            min_change,
            min_relative_change,
            z_floor,
        },
        help,
        outside_guest: false,
        median_of_seconds: false,
    }
}

const fn above(
    resource: Resource,
    signal: &'static str,
    threshold: f64,
    help: &'static str,
) -> Spec {
    Spec {
        resource,
        signal,
        rule: Rule::Above { threshold },
        help,
        outside_guest: false,
        median_of_seconds: false,
    }
}

/// Every victim signal. The thresholds are where a workload notices: 5% of a
/// CPU's time stalled, a wake-up tail 200 µs longer and twice as long, 10 ns
/// more per cache load.
pub static SPECS: &[Spec] = &[
    baseline(
        Resource::Cpu,
        "steal_ratio",
        0.05,
        0.01,
        "CPU time stolen by the hypervisor, mean over CPUs (node).",
    )
    .outside_guest(),
    baseline(
        Resource::Cpu,
        "run_delay_ratio",
        0.05,
        0.01,
        "Time runnable tasks waited for a CPU, per CPU (node, /proc/schedstat).",
    ),
    baseline(
        Resource::Cpu,
        "pressure_some_ratio",
        0.05,
        0.01,
        "CPU pressure: share of time some task waited for a CPU (node and each workload cgroup).",
    ),
    baseline(
        Resource::Cpu,
        "cpi",
        0.2,
        0.05,
        "Cycles per instruction of a workload cgroup, from the PMU (the CPI² method: a neighbour taking caches and memory bandwidth makes each instruction cost more cycles).",
    ),
    // A wake-up tail is judged by how many times it grew: under SCHED_OTHER
    // on a VM it is milliseconds, and moves by milliseconds with nothing
    // wrong; on bare metal under SCHED_FIFO it is tens of microseconds, and
    // the absolute floor decides.
    relative_baseline(
        Resource::Cpu,
        "jitter_p99_seconds",
        200e-6,
        1.0,
        50e-6,
        "Worst CPU's 99th percentile wake-up latency (jitter probe).",
    ),
    // On its default budget the probe spins about 30 ms of each CPU's share
    // of a window, so one 1 ms preemption by the host inside a spin moves
    // that CPU's share by 3 points (on this project's 2-vCPU VM, the node's
    // mean by 1.7), and the 3 ms ones that come in one window in ten there
    // by 5: a change the probe can tell from chance is several of them.
    baseline(
        Resource::Cpu,
        "jitter_unexplained_ratio",
        0.05,
        0.005,
        "Interrupted time the guest cannot explain (jitter probe).",
    )
    .outside_guest(),
    baseline(
        Resource::Memory,
        "pressure_some_ratio",
        0.05,
        0.01,
        "Memory pressure (node and each workload cgroup).",
    ),
    baseline(
        Resource::Memory,
        "cache_latency_seconds",
        10e-9,
        1e-9,
        "Cache canary: seconds per dependent load over a 512 KiB working set.",
    )
    .median_of_seconds(),
    baseline(
        Resource::Memory,
        "llc_misses_per_kilo_instruction",
        2.0,
        0.2,
        "Last-level cache misses per thousand instructions of a workload cgroup, from the PMU.",
    ),
    baseline(
        Resource::Io,
        "pressure_some_ratio",
        0.05,
        0.01,
        "I/O pressure (node and each workload cgroup).",
    ),
    above(
        Resource::Gpu,
        "clock_throttle_ratio",
        0.05,
        "SM clock lost to power or thermal slowdown.",
    ),
    baseline(
        Resource::Gpu,
        "sm_activity_loss_ratio",
        0.15,
        0.03,
        "SMs idle while kernels run: 1 − SM active / utilisation, when busy.",
    ),
    baseline(
        Resource::Gpu,
        "dram_activity_loss_ratio",
        0.15,
        0.03,
        "HBM idle while kernels run: 1 − DRAM bandwidth / utilisation, when busy.",
    ),
    above(
        Resource::Gpu,
        "pcie_bandwidth_loss_ratio",
        0.01,
        "PCIe bandwidth lost to a link trained down, under load.",
    ),
    above(
        Resource::Gpu,
        "nvlink_links_missing_ratio",
        0.01,
        "NVLink links not up against the product's count.",
    ),
    baseline(
        Resource::Network,
        "xmit_wait_ticks_per_second",
        1e6,
        1e4,
        "InfiniBand port_xmit_wait: ticks with data to send and no credit (congestion).",
    ),
    above(
        Resource::Network,
        "errors_per_second",
        0.1,
        "InfiniBand error counters, summed.",
    ),
    above(
        Resource::Network,
        "link_downed_per_second",
        0.0,
        "InfiniBand link downs.",
    ),
];

pub(super) fn spec(resource: Resource, signal: &str) -> Option<&'static Spec> {
    SPECS
        .iter()
        .find(|s| s.resource == resource && s.signal == signal)
}
