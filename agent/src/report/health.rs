//! Each GPU's health over the range: answering or lost, its XIDs, ECC
//! errors, SM clock against its maximum, temperature, PCIe link and NVLink
//! links. A GPU that fell off the bus has no `gpu` rows after it went, so
//! the list of GPUs is every GPU any GPU table names, and a GPU whose latest
//! `gpu_health` row says it did not answer is lost.

use std::collections::{BTreeMap, BTreeSet};

use super::shape::Rows;
use crate::collectors::gpu::CLOCK_EVENT_REASONS;

/// A GPU is busy, for the PCIe link and for HBM and NVLink against their
/// peaks, at this utilisation (the detector's tax uses the same bar).
pub const BUSY: f64 = 0.5;

/// Clock event reasons that slow a busy GPU down (not idle, not a setting).
const SLOWDOWN_REASONS: &[&str] = &[
    "sw_power_cap",
    "hw_slowdown",
    "sw_thermal_slowdown",
    "hw_thermal_slowdown",
    "hw_power_brake_slowdown",
];

/// A counter's latest value and how much it grew over the range.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Counter {
    pub last: f64,
    pub increase: f64,
}

/// A PCIe link: generation and width.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PcieLink {
    pub gen: u64,
    pub width: u64,
    pub gen_max: u64,
    pub width_max: u64,
    /// Seen while the GPU was busy: an idle link trains down by design.
    pub under_load: bool,
}

impl PcieLink {
    /// What the link carries each way, in bytes/s (0 for a generation we
    /// do not know): lanes differ by generation, so Gen4 x4 carries twice
    /// Gen1 x16 though generation times width is 16 for both.
    pub fn bytes_per_second(&self) -> f64 {
        let lane = crate::collectors::gpu::backend::pcie_lane_bytes_per_second(self.gen as u32);
        lane.unwrap_or(0.0) * self.width as f64
    }

    /// Trained below its generation or width while busy.
    pub fn degraded(&self) -> bool {
        self.under_load && (self.gen < self.gen_max || self.width < self.width_max)
    }
}

/// One GPU over the range.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct GpuHealth {
    /// NVML index, as the tables tag it.
    pub index: String,
    pub name: String,
    pub bus_id: String,
    /// When it stopped answering, when its latest health row says it has.
    pub lost_since: Option<i64>,
    /// Whether it had stopped answering at its first health row here: it
    /// was lost at or before `lost_since`, not then.
    pub lost_before: bool,
    /// The code of the last XID since the agent started.
    pub last_xid: Option<u64>,
    /// XID errors in the range, by code (`gpu_event`).
    pub xids: BTreeMap<u64, usize>,
    pub ecc_corrected: Option<Counter>,
    pub ecc_uncorrected: Option<Counter>,
    /// A row remapping waits for a reset, or failed.
    pub remapping: Option<&'static str>,
    /// Mean SM clock against its maximum over the samples with no idle reason.
    pub clock_ratio: Option<f64>,
    /// Slowdown reasons seen at least once.
    pub slowdowns: Vec<&'static str>,
    pub temperature_max: Option<f64>,
    /// The narrowest link seen under load (the fewest bytes/s), else the latest.
    pub pcie: Option<PcieLink>,
    pub pcie_replays: Option<Counter>,
    /// NVLink links up and the product's count, at the latest sample.
    pub nvlink: Option<(u64, u64)>,
}

impl GpuHealth {
    /// The index as a number, for the colour and the order.
    pub fn number(&self) -> usize {
        gpu_number(&self.index)
    }

    /// NVLink links the product has that are not up (hidden in a VM or down).
    pub fn nvlink_missing(&self) -> bool {
        self.nvlink.is_some_and(|(up, product)| up < product)
    }

    /// Anything an operator should look at.
    pub fn troubled(&self) -> bool {
        self.lost_since.is_some()
            || !self.xids.is_empty()
            || self.ecc_uncorrected.is_some_and(|c| c.increase > 0.0)
            || self.remapping.is_some()
            || !self.slowdowns.is_empty()
            || self.pcie.is_some_and(|p| p.degraded())
            || self.nvlink_missing()
    }
}

/// A GPU tag as a number: its colour and its place in order; a tag that is
/// not a number sorts last.
pub fn gpu_number(index: &str) -> usize {
    index.parse().unwrap_or(usize::MAX)
}

/// Each GPU any of the GPU tables names, in index order.
pub fn gpu_health(gpu: &Rows, gpu_info: &Rows, health: &Rows, gpu_event: &Rows) -> Vec<GpuHealth> {
    let mut indices: BTreeSet<(usize, String)> = BTreeSet::new();
    for rows in [gpu, gpu_info, health] {
        for g in rows.tag("gpu") {
            if !g.is_empty() {
                indices.insert((gpu_number(g), g.to_owned()));
            }
        }
    }
    indices
        .into_iter()
        .map(|(_, index)| one_gpu(index, gpu, gpu_info, health, gpu_event))
        .collect()
}

/// Row indices of `rows` whose `gpu` tag is `index`, in time order.
fn rows_of(rows: &Rows, index: &str) -> Vec<usize> {
    let mut picked: Vec<usize> = rows
        .tag("gpu")
        .into_iter()
        .enumerate()
        .filter(|(_, g)| *g == index)
        .map(|(i, _)| i)
        .collect();
    picked.sort_by_key(|&i| rows.time_us[i]);
    picked
}

fn counter(rows: &Rows, picked: &[usize], field: &str) -> Option<Counter> {
    let column = rows.field(field);
    let values: Vec<f64> = picked.iter().filter_map(|&i| column[i]).collect();
    let last = *values.last()?;
    let increase = *super::shape::counter_growth(&values).last()?;
    Some(Counter { last, increase })
}

fn one_gpu(
    index: String,
    gpu: &Rows,
    gpu_info: &Rows,
    health: &Rows,
    gpu_event: &Rows,
) -> GpuHealth {
    let mut out = GpuHealth {
        index: index.clone(),
        ..GpuHealth::default()
    };
    if let Some(&last) = rows_of(gpu_info, &index).last() {
        out.name = gpu_info.tag("name")[last].to_owned();
        out.bus_id = gpu_info.tag("pci_bus_id")[last].to_owned();
    }
    // Lost: the latest health row says it did not answer; since the first
    // row of that run.
    let picked = rows_of(health, &index);
    let up = health.field("up");
    if picked.last().is_some_and(|&i| up[i] == Some(0.0)) {
        let run = picked
            .iter()
            .rev()
            .take_while(|&&i| up[i] == Some(0.0))
            .count();
        out.lost_since = Some(health.time_us[picked[picked.len() - run]]);
        out.lost_before = run == picked.len();
    }
    let last_xid = health.field("last_xid");
    out.last_xid = picked
        .iter()
        .rev()
        .find_map(|&i| last_xid[i])
        .map(|v| v as u64);
    let (kinds, codes) = (gpu_event.tag("kind"), gpu_event.field("code"));
    for i in rows_of(gpu_event, &index) {
        if kinds[i] == "xid" {
            if let Some(code) = codes[i] {
                *out.xids.entry(code as u64).or_default() += 1;
            }
        }
    }

    let picked = rows_of(gpu, &index);
    out.ecc_corrected = counter(gpu, &picked, "ecc_corrected_errors");
    out.ecc_uncorrected = counter(gpu, &picked, "ecc_uncorrected_errors");
    out.pcie_replays = counter(gpu, &picked, "pcie_replays");
    let latest = |field: &str| {
        let column = gpu.field(field);
        picked.iter().rev().find_map(|&i| column[i])
    };
    if latest("remapping_failed").is_some_and(|v| v > 0.0) {
        out.remapping = Some("failed");
    } else if latest("remapping_pending").is_some_and(|v| v > 0.0) {
        out.remapping = Some("pending");
    }
    let (clock, clock_max, reasons) = (
        gpu.field("sm_clock_hertz"),
        gpu.field("sm_clock_max_hertz"),
        gpu.field("clock_event_reasons"),
    );
    let idle_bit = CLOCK_EVENT_REASONS
        .iter()
        .find(|(n, _)| *n == "gpu_idle")
        .map_or(0x1, |r| r.1);
    let mut ratios = Vec::new();
    let mut seen_bits = 0u64;
    for &i in &picked {
        let bits = reasons[i].map_or(0, |r| r as u64);
        seen_bits |= bits;
        if bits & idle_bit != 0 {
            continue;
        }
        if let (Some(c), Some(m)) = (clock[i], clock_max[i]) {
            if m > 0.0 {
                ratios.push(c / m);
            }
        }
    }
    out.clock_ratio =
        (!ratios.is_empty()).then(|| ratios.iter().sum::<f64>() / ratios.len() as f64);
    out.slowdowns = CLOCK_EVENT_REASONS
        .iter()
        .filter(|(name, bit)| SLOWDOWN_REASONS.contains(name) && seen_bits & bit != 0)
        .map(|(name, _)| *name)
        .collect();
    let temperature = gpu.field("temperature_celsius");
    out.temperature_max = picked
        .iter()
        .filter_map(|&i| temperature[i])
        .fold(None, |m: Option<f64>, v| Some(m.map_or(v, |m| m.max(v))));
    let columns = [
        gpu.field("pcie_link_gen"),
        gpu.field("pcie_link_width"),
        gpu.field("pcie_link_gen_max"),
        gpu.field("pcie_link_width_max"),
    ];
    let utilization = gpu.field("utilization_ratio");
    let link_at = |i: usize| -> Option<PcieLink> {
        let v = |c: usize| columns[c][i].map(|v| v as u64);
        Some(PcieLink {
            gen: v(0)?,
            width: v(1)?,
            gen_max: v(2)?,
            width_max: v(3)?,
            under_load: utilization[i].is_some_and(|u| u >= BUSY),
        })
    };
    let links: Vec<PcieLink> = picked.iter().filter_map(|&i| link_at(i)).collect();
    out.pcie = narrowest_under_load(&links).or(links.last().copied());
    if let (Some(up), Some(product)) = (latest("nvlink_links_up"), latest("nvlink_links_product")) {
        out.nvlink = Some((up as u64, product as u64));
    }
    out
}

/// The link seen under load that carried the fewest bytes/s.
fn narrowest_under_load(links: &[PcieLink]) -> Option<PcieLink> {
    links
        .iter()
        .filter(|l| l.under_load)
        .min_by(|a, b| a.bytes_per_second().total_cmp(&b.bytes_per_second()))
        .copied()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The narrowest link is the one that carries least: Gen1 x16 carries
    /// half of Gen4 x4, though generation times width is 16 for both.
    #[test]
    fn links_are_ranked_by_what_they_carry() {
        let link = |gen, width| PcieLink {
            gen,
            width,
            gen_max: 5,
            width_max: 16,
            under_load: true,
        };
        let (gen1_x16, gen4_x4) = (link(1, 16), link(4, 4));
        assert_eq!(gen1_x16.bytes_per_second(), 4e9);
        assert!((gen4_x4.bytes_per_second() - 7.876e9).abs() < 1.0);
        assert_eq!(narrowest_under_load(&[gen4_x4, gen1_x16]), Some(gen1_x16));
        assert_eq!(narrowest_under_load(&[gen1_x16, gen4_x4]), Some(gen1_x16));
    }
}
