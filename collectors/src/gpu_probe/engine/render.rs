//! A probe's figures set against their peaks: the report `vtax probe-gpu`
//! prints as a table for a person or as JSON for scripts.

use std::collections::HashMap;
use std::fmt::Write as _;

use serde::Serialize;

use super::facts::GpuFacts;
use super::peaks::{self, Peak};
use super::{GpuFigures, PeerOutcome, Probe, ProbeCost, Sizes};

/// One figure of one GPU.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Measurement {
    /// `host_to_device`, `device_to_host`, `device_to_device`,
    /// `small_copy_round_trip`, `kernel_launch`, `kernel_launch_event`.
    pub what: &'static str,
    /// For a bandwidth.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bytes_per_second: Option<f64>,
    /// For a latency.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub seconds: Option<f64>,
    /// The peak it is set against.
    pub peak: Option<Peak>,
    /// Measured over peak.
    pub ratio: Option<f64>,
    /// In words, as the table prints it.
    pub text: String,
}

/// One GPU's part of the report.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct GpuReport {
    /// NVML's index (what `nvidia-smi` shows), or the CUDA ordinal where NVML does not know the GPU.
    pub gpu: u32,
    /// The CUDA driver's ordinal.
    pub cuda_ordinal: u32,
    /// Product name.
    pub name: String,
    /// PCI bus id.
    pub pci_bus_id: String,
    /// NVML's facts, when NVML knows the GPU.
    pub facts: Option<GpuFacts>,
    /// Why it was not measured.
    pub error: Option<String>,
    /// Its figures.
    pub measurements: Vec<Measurement>,
}

/// One ordered pair's part of the report.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct PeerReport {
    /// GPU copied from ([`GpuReport::gpu`]'s numbering).
    pub src: u32,
    /// GPU copied to.
    pub dst: u32,
    /// `measured`, `no_peer_access` or `error`.
    pub outcome: &'static str,
    /// What the copy got.
    pub bytes_per_second: Option<f64>,
    /// The peak it is set against.
    pub peak: Option<Peak>,
    /// Measured over peak.
    pub ratio: Option<f64>,
    /// Why it was not measured.
    pub error: Option<String>,
    /// In words.
    pub text: String,
}

/// What `vtax probe-gpu` reports.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Report {
    /// The sizes the probe ran with.
    pub sizes: Sizes,
    /// Why there are no peaks, when NVML could not be read.
    pub nvml_error: Option<String>,
    /// Each GPU.
    pub gpus: Vec<GpuReport>,
    /// Each ordered pair.
    pub peers: Vec<PeerReport>,
    /// What the probe cost.
    pub cost: ProbeCost,
}

impl Report {
    /// Sets a probe's figures against the peaks NVML's facts give (by bus id).
    pub fn new(probe: &Probe, facts: &Result<HashMap<String, GpuFacts>, String>) -> Report {
        let empty = HashMap::new();
        let (facts, nvml_error) = match facts {
            Ok(f) => (f, None),
            Err(e) => (&empty, Some(e.clone())),
        };
        let fact = |bus: &str| facts.get(bus);
        let shown = |ordinal: u32| -> u32 {
            probe
                .gpus
                .iter()
                .find(|g| g.gpu.ordinal == ordinal)
                .and_then(|g| fact(&g.gpu.pci_bus_id))
                .map_or(ordinal, |f| f.nvml_index)
        };
        let gpus = probe
            .gpus
            .iter()
            .map(|g| {
                let f = fact(&g.gpu.pci_bus_id);
                GpuReport {
                    gpu: shown(g.gpu.ordinal),
                    cuda_ordinal: g.gpu.ordinal,
                    name: g.gpu.name.clone(),
                    pci_bus_id: g.gpu.pci_bus_id.clone(),
                    facts: f.cloned(),
                    error: g.figures.as_ref().err().map(|e| e.to_string()),
                    measurements: g
                        .figures
                        .as_ref()
                        .map(|fig| measurements(fig, f))
                        .unwrap_or_default(),
                }
            })
            .collect();
        let gpu_buses: Vec<&str> = facts.keys().map(String::as_str).collect();
        let bus_of = |ordinal: u32| {
            probe
                .gpus
                .iter()
                .find(|g| g.gpu.ordinal == ordinal)
                .map(|g| g.gpu.pci_bus_id.as_str())
                .unwrap_or_default()
        };
        let peers = probe
            .peers
            .iter()
            .map(|p| {
                let (src_bus, dst_bus) = (bus_of(p.src), bus_of(p.dst));
                let peak = match (fact(src_bus), fact(dst_bus)) {
                    (Some(s), Some(d)) => peaks::peer_peak(s, d, dst_bus, &gpu_buses),
                    _ => None,
                };
                let mut report = PeerReport {
                    src: shown(p.src),
                    dst: shown(p.dst),
                    outcome: "error",
                    bytes_per_second: None,
                    peak: None,
                    ratio: None,
                    error: None,
                    text: String::new(),
                };
                match &p.outcome {
                    Ok(PeerOutcome::Measured {
                        bytes_per_second, ..
                    }) => {
                        report.outcome = "measured";
                        report.bytes_per_second = Some(*bytes_per_second);
                        report.ratio = peaks::ratio(*bytes_per_second, peak.as_ref());
                        report.text = peaks::describe(*bytes_per_second, peak.as_ref());
                        report.peak = peak;
                    }
                    Ok(PeerOutcome::NoPeerAccess) => {
                        report.outcome = "no_peer_access";
                        report.text = "no peer access".into();
                    }
                    Err(e) => {
                        report.error = Some(e.to_string());
                        report.text = format!("failed: {e}");
                    }
                }
                report
            })
            .collect();
        Report {
            sizes: probe.sizes,
            nvml_error,
            gpus,
            peers,
            cost: probe.cost.clone(),
        }
    }

    /// Whether every GPU and every pair with peer access was measured.
    pub fn complete(&self) -> bool {
        self.gpus.iter().all(|g| g.error.is_none()) && self.peers.iter().all(|p| p.error.is_none())
    }

    /// The table a person reads.
    pub fn table(&self) -> String {
        let mut out = String::new();
        for g in &self.gpus {
            let _ = write!(out, "GPU {}  {}  {}", g.gpu, g.name, g.pci_bus_id);
            if let Some(f) = &g.facts {
                let _ = write!(out, "  {}", link_words(f));
            }
            out.push('\n');
            if let Some(e) = &g.error {
                let _ = writeln!(out, "  not measured: {e}");
            }
            for m in &g.measurements {
                let figure = match (m.bytes_per_second, m.seconds) {
                    (Some(b), _) => format!("{} GB/s", peaks::gigabytes(b)),
                    (None, Some(s)) => format!("{:.1} µs", s * 1e6),
                    (None, None) => String::new(),
                };
                let _ = writeln!(out, "  {:<22}{:>12}   {}", label(m.what), figure, m.text);
            }
        }
        if !self.peers.is_empty() {
            out.push_str("peer to peer (bytes copied / time)\n");
            for p in &self.peers {
                let figure = p
                    .bytes_per_second
                    .map(|b| format!("{} GB/s", peaks::gigabytes(b)))
                    .unwrap_or_default();
                let pair = format!("GPU {} → GPU {}", p.src, p.dst);
                let _ = writeln!(out, "  {pair:<22}{figure:>12}   {}", p.text);
            }
        }
        if let Some(e) = &self.nvml_error {
            let _ = writeln!(out, "no peaks: {e}");
        }
        let s = &self.sizes;
        let _ = writeln!(
            out,
            "each figure the median of its repetitions: {} copies of {} after {} warm-up, {} launches and round trips",
            s.repeats,
            bytes_words(s.copy_bytes),
            s.warmup,
            s.latency_repeats
        );
        let c = &self.cost;
        let _ = writeln!(
            out,
            "cost: {:.2} s wall, {:.3} s GPU busy (event-timed), {:.2} s CPU of the probing thread, {:.2} s of the process",
            c.wall_seconds, c.gpu_busy_seconds, c.thread_cpu_seconds, c.process_cpu_seconds
        );
        out
    }
}

/// One GPU's figures, each against its peak where it has one.
fn measurements(f: &GpuFigures, facts: Option<&GpuFacts>) -> Vec<Measurement> {
    let host = facts.and_then(peaks::host_peak);
    let hbm = facts.and_then(peaks::hbm_peak);
    let bandwidth = |what, b: f64, peak: Option<Peak>, note: &str| Measurement {
        what,
        bytes_per_second: Some(b),
        seconds: None,
        ratio: peaks::ratio(b, peak.as_ref()),
        text: format!("{}{note}", peaks::describe(b, peak.as_ref())),
        peak,
    };
    let latency = |what, s: f64, text: &str| Measurement {
        what,
        bytes_per_second: None,
        seconds: Some(s),
        peak: None,
        ratio: None,
        text: text.into(),
    };
    vec![
        bandwidth(
            "host_to_device",
            f.host_to_device_bytes_per_second,
            host.clone(),
            "",
        ),
        bandwidth(
            "device_to_host",
            f.device_to_host_bytes_per_second,
            host,
            "",
        ),
        bandwidth(
            "device_to_device",
            f.device_to_device_bytes_per_second,
            hbm,
            "; HBM traffic, 2 × bytes copied / time",
        ),
        latency(
            "small_copy_round_trip",
            f.small_copy_round_trip_seconds,
            "4 B host→device then device→host, synchronised, host-timed",
        ),
        latency(
            "kernel_launch",
            f.kernel_launch_seconds,
            "empty kernel, launch then synchronise, host-timed",
        ),
        latency(
            "kernel_launch_event",
            f.kernel_launch_event_seconds,
            "the same between two events on the stream",
        ),
    ]
}

/// The table's name of a measurement.
fn label(what: &str) -> &str {
    match what {
        "host_to_device" => "host→device",
        "device_to_host" => "device→host",
        "device_to_device" => "device→device",
        "small_copy_round_trip" => "small-copy round trip",
        "kernel_launch" => "kernel launch",
        "kernel_launch_event" => "kernel launch (events)",
        other => other,
    }
}

/// "PCIe Gen1 x16 now, Gen5 x16 at most; 18 NVLink links up".
fn link_words(f: &GpuFacts) -> String {
    let gen_width = |g: Option<u32>, w: Option<u32>| match (g, w) {
        (Some(g), Some(w)) => format!("Gen{g} x{w}"),
        _ => "unknown".into(),
    };
    let mut words = format!(
        "PCIe {} now, {} at most",
        gen_width(f.pcie_link_gen_current, f.pcie_link_width_current),
        gen_width(f.pcie_link_gen_max, f.pcie_link_width_max)
    );
    if !f.nvlinks_up.is_empty() {
        let _ = write!(words, "; {} NVLink links up", f.nvlinks_up.len());
    }
    words
}

/// "256 MiB", "4 KiB", "1000 B".
fn bytes_words(bytes: u64) -> String {
    for (unit, size) in [("GiB", 1u64 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)] {
        if bytes >= size && bytes.is_multiple_of(size) {
            return format!("{} {unit}", bytes / size);
        }
    }
    format!("{bytes} B")
}
