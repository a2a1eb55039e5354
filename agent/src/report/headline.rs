//! The first screen: the verdict, what the platform takes as figures (the
//! detector's `tax` table, what `vtax doctor` prints), who takes it, and the
//! top causes with their evidence.

use super::health::GpuHealth;
use super::shape::Rows;
use super::svg::{format_time, format_value, Unit};
use super::Event;

/// Who a figure says takes the difference: the headline groups them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Taker {
    /// The hypervisor and the host: steal, the time the guest cannot explain.
    Hypervisor,
    /// What busy GPUs reach of their peaks.
    Peak,
    /// The hardware: links missing or trained down, clocks held down.
    Hardware,
}

impl Taker {
    pub const ALL: [Taker; 3] = [Taker::Hypervisor, Taker::Peak, Taker::Hardware];

    pub fn title(self) -> &'static str {
        match self {
            Taker::Hypervisor => "The hypervisor and the host",
            Taker::Peak => "Busy GPUs against their peak",
            Taker::Hardware => "The hardware",
        }
    }
}

/// Which way a `tax` figure gets worse: what its tile's worst window is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Worse {
    /// A loss: the worst window is the highest.
    Higher,
    /// A share of a peak reached: the worst window is the lowest.
    Lower,
    /// Context for the others, neither good nor bad: the tile gives the range.
    Neither,
}

/// A `tax` field the headline shows.
pub struct TaxField {
    pub field: &'static str,
    pub label: &'static str,
    pub unit: Unit,
    pub taker: Taker,
    pub worse: Worse,
    /// Above this the figure is marked: where a workload notices (the
    /// detector's thresholds for the hardware signals).
    pub bad_above: Option<f64>,
    /// What the figure means, for its tooltip.
    pub help: &'static str,
}

/// The `tax` fields in the order the headline shows them.
pub const TAX_FIELDS: &[TaxField] = &[
    TaxField {
        field: "steal_ratio",
        label: "steal",
        unit: Unit::Ratio,
        taker: Taker::Hypervisor,
        worse: Worse::Higher,
        bad_above: Some(0.01),
        help: "CPU time the hypervisor ran something else, mean over CPUs.",
    },
    TaxField {
        field: "interrupted_ratio",
        label: "interrupted",
        unit: Unit::Ratio,
        taker: Taker::Hypervisor,
        worse: Worse::Higher,
        bad_above: None,
        help: "Share of the jitter probe's spin time lost to gaps, whoever took it.",
    },
    TaxField {
        field: "unexplained_ratio",
        label: "unexplained",
        unit: Unit::Ratio,
        taker: Taker::Hypervisor,
        worse: Worse::Higher,
        bad_above: Some(0.005),
        help: "Interrupted time the guest's accounting does not show: the hypervisor or the firmware took it.",
    },
    TaxField {
        field: "jitter_p99_seconds",
        label: "wake-up p99",
        unit: Unit::Seconds,
        taker: Taker::Hypervisor,
        worse: Worse::Higher,
        bad_above: Some(200e-6),
        help: "Worst CPU's 99th percentile wake-up latency (the median window; the note gives the worst).",
    },
    TaxField {
        field: "jitter_busy_ratio",
        label: "probed CPUs busy",
        unit: Unit::Ratio,
        taker: Taker::Hypervisor,
        worse: Worse::Neither,
        bad_above: None,
        help: "How busy the jitter probe's CPUs were while it measured, mean over them: near 0 they halted between its spins, and a spin then loses more than on a busy CPU, so compare nodes of like busy share.",
    },
    TaxField {
        field: "hbm_peak_ratio",
        label: "HBM of peak",
        unit: Unit::Ratio,
        taker: Taker::Peak,
        worse: Worse::Lower,
        bad_above: None,
        help: "HBM bandwidth against its peak, mean over GPUs busier than 50%.",
    },
    TaxField {
        field: "nvlink_peak_ratio",
        label: "NVLink of peak",
        unit: Unit::Ratio,
        taker: Taker::Peak,
        worse: Worse::Lower,
        bad_above: None,
        help: "NVLink rx+tx against the product's links' peak (hidden links count as lost), mean over busy GPUs.",
    },
    TaxField {
        field: "nvlink_links_missing_ratio",
        label: "NVLink links missing",
        unit: Unit::Ratio,
        taker: Taker::Hardware,
        worse: Worse::Higher,
        bad_above: Some(0.0),
        help: "NVLink links not up against the links the products have: hidden in a VM, or down.",
    },
    TaxField {
        field: "pcie_bandwidth_loss_ratio",
        label: "PCIe bandwidth lost",
        unit: Unit::Ratio,
        taker: Taker::Hardware,
        worse: Worse::Higher,
        bad_above: Some(0.01),
        help: "Worst busy GPU's PCIe bandwidth lost to a link trained below its generation or width.",
    },
    TaxField {
        field: "gpu_clock_throttle_ratio",
        label: "SM clock throttled",
        unit: Unit::Ratio,
        taker: Taker::Hardware,
        worse: Worse::Higher,
        bad_above: Some(0.05),
        help: "Worst GPU's SM clock below its maximum while a power or thermal slowdown holds it.",
    },
];

/// A tax figure over the range: the mean of its windows (the median for a
/// latency, which one bad window would drag), and its lowest and highest
/// windows.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Figure {
    pub value: Option<f64>,
    pub lowest: Option<f64>,
    pub highest: Option<f64>,
    /// Windows in the range, null or not.
    pub windows: usize,
}

impl Figure {
    pub fn is_bad(&self, field: &TaxField) -> bool {
        match (self.value, field.bad_above) {
            (Some(v), Some(limit)) => v > limit,
            _ => false,
        }
    }

    /// The figure in its unit, or why there is none.
    pub fn text(&self, field: &TaxField) -> String {
        match self.value {
            Some(v) => format_value(v, field.unit),
            None => "–".into(),
        }
    }

    /// The worst window: the highest of a loss, the lowest of a share of a
    /// peak; none for a figure that is context.
    pub fn worst(&self, field: &TaxField) -> Option<f64> {
        match field.worse {
            Worse::Higher => self.highest,
            Worse::Lower => self.lowest,
            Worse::Neither => None,
        }
    }

    /// The line under the figure.
    pub fn note(&self, field: &TaxField) -> String {
        let text = |v: f64| format_value(v, field.unit);
        match self.value {
            _ if self.windows == 0 => "no detector windows".into(),
            None if field.taker != Taker::Hypervisor => "no busy GPU".into(),
            None => "no source".into(),
            Some(_) => match (field.worse, self.lowest, self.highest) {
                (Worse::Neither, Some(lo), Some(hi)) => {
                    format!("windows {}–{}", text(lo), text(hi))
                }
                _ => self
                    .worst(field)
                    .map_or(String::new(), |w| format!("worst window {}", text(w))),
            },
        }
    }
}

/// Each of [`TAX_FIELDS`] over the `tax` rows of the range.
pub fn tax(rows: &Rows) -> Vec<Figure> {
    TAX_FIELDS
        .iter()
        .map(|f| {
            let mut values: Vec<f64> = rows
                .field(f.field)
                .into_iter()
                .flatten()
                .filter(|v| v.is_finite())
                .collect();
            values.sort_by(f64::total_cmp);
            let value = if values.is_empty() {
                None
            } else if f.unit == Unit::Seconds {
                Some(values[values.len() / 2])
            } else {
                Some(values.iter().sum::<f64>() / values.len() as f64)
            };
            Figure {
                value,
                lowest: values.first().copied(),
                highest: values.last().copied(),
                windows: rows.len(),
            }
        })
        .collect()
}

/// A detector signal in words, for the signals an operator meets most.
pub fn signal_words(signal: &str) -> &str {
    match signal {
        "clock_throttle_ratio" => "SM clock throttled",
        "pcie_bandwidth_loss_ratio" => "PCIe link trained down",
        "nvlink_links_missing_ratio" => "NVLink links missing",
        "errors_per_second" => "InfiniBand errors",
        "link_downed_per_second" => "InfiniBand link down",
        "steal_ratio" => "CPU steal",
        "jitter_unexplained_ratio" => "unexplained interruptions",
        "jitter_p99_seconds" => "wake-up p99",
        "wakeup_p99_seconds" => "wake-up p99",
        "pressure_some_ratio" => "pressure",
        "run_delay_ratio" => "run delay",
        "cache_latency_seconds" => "cache latency",
        other => other,
    }
}

/// Where an event is: `GPU 5` for a GPU's own signal, else the resource
/// and the victim (`cpu · node`, `memory · /batch.slice`).
pub fn place(resource: &str, victim: &str) -> String {
    match victim.strip_prefix("gpu") {
        Some(n) if resource == "gpu" && n.parse::<u32>().is_ok() => format!("GPU {n}"),
        _ => format!("{resource} · {victim}"),
    }
}

/// The first suspect's name of an event's `suspects` tag.
pub fn first_suspect(suspects: &str) -> Option<String> {
    crate::detect::suspect_text::first_name(suspects)
}

/// What a cause is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum CauseKind {
    /// A GPU stopped answering.
    Lost,
    /// A fault of the node: a link, a clock, a port.
    Fault,
    /// The hypervisor, named by the detector as the suspect.
    Hypervisor,
    /// A neighbour: another workload on the node.
    Neighbour,
}

impl CauseKind {
    pub fn name(self) -> &'static str {
        match self {
            CauseKind::Lost => "GPU lost",
            CauseKind::Fault => "fault",
            CauseKind::Hypervisor => "hypervisor",
            CauseKind::Neighbour => "neighbour",
        }
    }
}

/// One line of the top causes.
#[derive(Clone, Debug, PartialEq)]
pub struct Cause {
    pub kind: CauseKind,
    pub open: bool,
    pub score: f64,
    /// What and where, e.g. `gpu5: NVLink links missing`.
    pub title: String,
    /// The evidence, in the detector's words.
    pub evidence: String,
}

/// The causes of one node: its lost GPUs, its faults and its events, the
/// gravest first (lost, then open before closed, then by score).
pub fn causes(
    node: Option<&str>,
    gpus: &[GpuHealth],
    faults: &[Event],
    events: &[Event],
) -> Vec<Cause> {
    let prefix = node.map_or(String::new(), |n| format!("{n} · "));
    let mut out = Vec::new();
    for g in gpus {
        if let Some(since) = g.lost_since {
            let xid = g
                .last_xid
                .map_or(String::new(), |x| format!(", last XID {x}"));
            out.push(Cause {
                kind: CauseKind::Lost,
                open: true,
                score: f64::INFINITY,
                title: format!("{prefix}GPU {}: lost", g.index),
                evidence: format!(
                    "GPU {} ({}) stopped answering {} {} UTC{xid}; no samples since.",
                    g.index,
                    if g.bus_id.is_empty() {
                        "bus id unknown"
                    } else {
                        &g.bus_id
                    },
                    if g.lost_before { "at or before" } else { "at" },
                    format_time(since, true)
                ),
            });
        }
    }
    for (kind, list) in [(CauseKind::Fault, faults), (CauseKind::Neighbour, events)] {
        for e in list {
            let suspect = first_suspect(&e.suspects);
            let kind = match (kind, suspect.as_deref()) {
                (CauseKind::Neighbour, Some(crate::detect::HYPERVISOR_SUSPECT)) => {
                    CauseKind::Hypervisor
                }
                _ => kind,
            };
            let who = match (kind, suspect) {
                (CauseKind::Fault, _) => String::new(),
                (_, Some(s)) => format!(", suspect {s}"),
                (_, None) => ", no suspect correlates".into(),
            };
            out.push(Cause {
                kind,
                open: e.is_open(),
                score: e.score.unwrap_or(0.0),
                title: format!(
                    "{prefix}{}: {}{who}",
                    place(&e.resource, &e.victim),
                    signal_words(&e.signal)
                ),
                evidence: e.evidence.clone(),
            });
        }
    }
    sort_causes(&mut out);
    out
}

/// Lost GPUs first, then open before closed, then the higher score.
pub fn sort_causes(causes: &mut [Cause]) {
    causes.sort_by(|a, b| {
        (a.kind != CauseKind::Lost)
            .cmp(&(b.kind != CauseKind::Lost))
            .then(b.open.cmp(&a.open))
            .then(b.score.total_cmp(&a.score))
    });
}
