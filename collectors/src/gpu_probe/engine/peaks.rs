//! Each probe figure's peak and the ratio to it: pure arithmetic, tested
//! here, fed by NVML's facts ([`super::facts`]).
//!
//! - Host↔device against the PCIe link's *maximum* generation × width (of
//!   the GPU and the slot together): the current one drops when the GPU
//!   idles, and a link trained below its maximum is what the ratio should show.
//! - Device→device against the HBM peak the `gpu` collector computes.
//! - Peer-to-peer against the NVLink links on the path × the per-link rate
//!   when NVLink links are up, else against the slower of the two PCIe links.

use serde::Serialize;

use super::facts::GpuFacts;
use crate::gpu::backend::{
    nvlink_link_bytes_per_second_each_way, pcie_lane_bytes_per_second,
};

/// A peak and what it is, in words ("Gen5 x16", "HBM peak").
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Peak {
    /// What the peak is.
    pub label: String,
    /// Its bytes per second.
    pub bytes_per_second: f64,
}

/// A PCIe link's peak each way: lanes × the generation's lane rate.
pub fn pcie_peak(gen: Option<u32>, width: Option<u32>) -> Option<Peak> {
    let (gen, width) = (gen?, width?);
    let lane = pcie_lane_bytes_per_second(gen)?;
    (width > 0).then(|| Peak {
        label: format!("Gen{gen} x{width}"),
        bytes_per_second: lane * f64::from(width),
    })
}

/// The host↔device peak of a GPU: its link at its maximum.
pub fn host_peak(facts: &GpuFacts) -> Option<Peak> {
    pcie_peak(facts.pcie_link_gen_max, facts.pcie_link_width_max)
}

/// The device→device peak: the HBM peak.
pub fn hbm_peak(facts: &GpuFacts) -> Option<Peak> {
    facts.hbm_peak_bytes_per_second.map(|b| Peak {
        label: "HBM peak".into(),
        bytes_per_second: b,
    })
}

/// NVLink links that carry a copy from `src` to the GPU at `dst_bus`: those
/// whose far end is that GPU (a direct link); without any, those whose far
/// end is not a GPU (an NVSwitch, through which every GPU is reached); where
/// NVML names no far end at all, every link up. `gpu_buses` are the bus ids
/// of every GPU NVML sees.
pub fn nvlink_links_to(src: &GpuFacts, dst_bus: &str, gpu_buses: &[&str]) -> u32 {
    let direct = src
        .nvlinks_up
        .iter()
        .filter(|r| r.as_deref() == Some(dst_bus))
        .count();
    if direct > 0 {
        return direct as u32;
    }
    let switched = src
        .nvlinks_up
        .iter()
        .filter(|r| matches!(r.as_deref(), Some(b) if !gpu_buses.contains(&b)))
        .count();
    if switched > 0 {
        return switched as u32;
    }
    if src.nvlinks_up.iter().all(Option::is_none) {
        return src.nvlinks_up.len() as u32;
    }
    0
}

/// The peer-to-peer peak from `src` to `dst`, one way: the NVLink links on
/// the path × the per-link rate of the architecture's NVLink generation
/// (NVIDIA gives an H100 SXM 18 fourth-generation links and 900 GB/s both
/// ways together: 25 GB/s a link each way; `nvlink_link_bytes_per_second_each_way`
/// keeps the table), else the slower PCIe link of the two.
pub fn peer_peak(
    src: &GpuFacts,
    dst: &GpuFacts,
    dst_bus: &str,
    gpu_buses: &[&str],
) -> Option<Peak> {
    let links = nvlink_links_to(src, dst_bus, gpu_buses);
    if links > 0 {
        if let Some(rate) = nvlink_link_bytes_per_second_each_way(&src.architecture) {
            return Some(Peak {
                label: format!(
                    "{links} NVLink link{} × {:.0} GB/s",
                    if links == 1 { "" } else { "s" },
                    rate / 1e9
                ),
                bytes_per_second: f64::from(links) * rate,
            });
        }
    }
    match (host_peak(src), host_peak(dst)) {
        (Some(a), Some(b)) => Some(if a.bytes_per_second <= b.bytes_per_second {
            a
        } else {
            b
        }),
        (a, b) => a.or(b),
    }
    .map(|p| Peak {
        label: format!("PCIe {}", p.label),
        ..p
    })
}

/// Measured against peak; `None` without a peak or with a peak of zero.
pub fn ratio(measured_bytes_per_second: f64, peak: Option<&Peak>) -> Option<f64> {
    let peak = peak?.bytes_per_second;
    (peak > 0.0 && measured_bytes_per_second.is_finite()).then(|| measured_bytes_per_second / peak)
}

/// Above this share of its peak a figure says more of the peak than of the
/// transfer: no copy beats its link or its memory, so the peak NVML's
/// figures gave is too low (a link NVML reports narrower than it is, a
/// product whose memory clock it gives wrong). Above 1 by the timing's own
/// spread, so that a copy at its peak is not flagged.
pub const ABOVE_PEAK_RATIO: f64 = 1.05;

/// The figure against its peak, in words: "0.38 of Gen5 x16 (24.1 of 63.0
/// GB/s)", with a word when it is above [`ABOVE_PEAK_RATIO`], or "24.1
/// GB/s, no peak known".
pub fn describe(measured_bytes_per_second: f64, peak: Option<&Peak>) -> String {
    match (peak, ratio(measured_bytes_per_second, peak)) {
        (Some(p), Some(r)) => format!(
            "{r:.2} of {} ({} of {} GB/s){}",
            p.label,
            gigabytes(measured_bytes_per_second),
            gigabytes(p.bytes_per_second),
            if r > ABOVE_PEAK_RATIO {
                ": above the peak, which NVML's figures must understate"
            } else {
                ""
            }
        ),
        _ => format!(
            "{} GB/s, no peak known",
            gigabytes(measured_bytes_per_second)
        ),
    }
}

/// Decimal GB/s with a precision that suits its size: 24.1, 2650.
pub fn gigabytes(bytes_per_second: f64) -> String {
    let gb = bytes_per_second / 1e9;
    if gb >= 1000.0 {
        format!("{gb:.0}")
    } else {
        format!("{gb:.1}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn h100(links: Vec<Option<String>>) -> GpuFacts {
        GpuFacts {
            nvml_index: 0,
            architecture: "hopper".into(),
            pcie_link_gen_max: Some(5),
            pcie_link_width_max: Some(16),
            pcie_link_gen_current: Some(1),
            pcie_link_width_current: Some(16),
            hbm_peak_bytes_per_second: Some(3.352e12),
            nvlinks_up: links,
        }
    }

    #[test]
    fn pcie_peaks_are_lanes_times_the_encoded_lane_rate() {
        let gen5 = pcie_peak(Some(5), Some(16)).unwrap();
        assert_eq!(gen5.label, "Gen5 x16");
        assert!((gen5.bytes_per_second - 63.008e9).abs() < 1e6);
        let gen4 = pcie_peak(Some(4), Some(8)).unwrap();
        assert!((gen4.bytes_per_second - 15.752e9).abs() < 1e6);
        assert!((pcie_peak(Some(1), Some(1)).unwrap().bytes_per_second - 0.25e9).abs() < 1.0);
        assert!((pcie_peak(Some(6), Some(16)).unwrap().bytes_per_second - 121.0e9).abs() < 1e6);
        assert_eq!(pcie_peak(Some(8), Some(16)), None);
        assert_eq!(pcie_peak(Some(5), None), None);
        assert_eq!(pcie_peak(Some(5), Some(0)), None);
    }

    #[test]
    fn host_transfers_are_set_against_the_maximum_link_not_the_current() {
        let facts = h100(vec![]);
        let peak = host_peak(&facts).unwrap();
        assert_eq!(peak.label, "Gen5 x16");
        assert_eq!(
            describe(24.1e9, Some(&peak)),
            "0.38 of Gen5 x16 (24.1 of 63.0 GB/s)"
        );
    }

    #[test]
    fn device_to_device_is_set_against_the_hbm_peak() {
        let peak = hbm_peak(&h100(vec![])).unwrap();
        let r = ratio(2.65e12, Some(&peak)).unwrap();
        assert!((r - 0.7906).abs() < 1e-3, "{r}");
        assert_eq!(
            describe(2.65e12, Some(&peak)),
            "0.79 of HBM peak (2650 of 3352 GB/s)"
        );
        let no_hbm = GpuFacts {
            hbm_peak_bytes_per_second: None,
            ..h100(vec![])
        };
        assert_eq!(hbm_peak(&no_hbm), None);
        assert_eq!(describe(2.65e12, None), "2650 GB/s, no peak known");
    }

    #[test]
    fn a_figure_above_its_peak_says_the_peak_is_too_low() {
        let gen4 = pcie_peak(Some(4), Some(16)).unwrap();
        assert_eq!(
            describe(34.0e9, Some(&gen4)),
            "1.08 of Gen4 x16 (34.0 of 31.5 GB/s): above the peak, which NVML's figures must understate"
        );
        // At its peak, within the timing's spread: no word.
        assert_eq!(
            describe(32.5e9, Some(&gen4)),
            "1.03 of Gen4 x16 (32.5 of 31.5 GB/s)"
        );
    }

    #[test]
    fn peers_through_an_nvswitch_count_every_switch_link() {
        let switch = Some("00000000:05:00.0".to_string());
        let src = h100(vec![switch; 18]);
        let dst = h100(vec![]);
        let gpus = ["00000000:18:00.0", "00000000:2a:00.0"];
        assert_eq!(nvlink_links_to(&src, gpus[1], &gpus), 18);
        let peak = peer_peak(&src, &dst, gpus[1], &gpus).unwrap();
        assert_eq!(peak.label, "18 NVLink links × 25 GB/s");
        assert_eq!(peak.bytes_per_second, 450e9);
    }

    #[test]
    fn peers_with_direct_links_count_only_the_links_to_that_peer() {
        let to_b = Some("00000000:2a:00.0".to_string());
        let to_c = Some("00000000:3a:00.0".to_string());
        let mut links = vec![to_b.clone(); 4];
        links.extend(vec![to_c; 8]);
        let src = h100(links);
        let gpus = ["00000000:18:00.0", "00000000:2a:00.0", "00000000:3a:00.0"];
        assert_eq!(nvlink_links_to(&src, gpus[1], &gpus), 4);
        assert_eq!(nvlink_links_to(&src, gpus[2], &gpus), 8);
        // No link to a fourth GPU and no switch: PCIe it is.
        assert_eq!(nvlink_links_to(&src, "00000000:4a:00.0", &gpus), 0);
        let peak = peer_peak(&src, &h100(vec![]), "00000000:4a:00.0", &gpus).unwrap();
        assert_eq!(peak.label, "PCIe Gen5 x16");
    }

    #[test]
    fn links_without_a_known_far_end_all_count() {
        let src = h100(vec![None; 12]);
        assert_eq!(nvlink_links_to(&src, "00000000:2a:00.0", &[]), 12);
    }

    #[test]
    fn without_nvlink_peers_are_set_against_the_slower_pcie_link() {
        let src = h100(vec![]);
        let dst = GpuFacts {
            pcie_link_gen_max: Some(4),
            ..h100(vec![])
        };
        let peak = peer_peak(&src, &dst, "00000000:2a:00.0", &[]).unwrap();
        assert_eq!(peak.label, "PCIe Gen4 x16");
        assert!((peak.bytes_per_second - 31.504e9).abs() < 1e6);
        // An architecture whose NVLink rate is unknown falls back to PCIe too.
        let unknown = GpuFacts {
            architecture: "unknown".into(),
            ..h100(vec![None; 4])
        };
        let peak = peer_peak(&unknown, &src, "x", &[]).unwrap();
        assert_eq!(peak.label, "PCIe Gen5 x16");
        let nothing = GpuFacts::default();
        assert_eq!(peer_peak(&nothing, &nothing, "x", &[]), None);
    }

    #[test]
    fn a_ratio_needs_a_positive_peak_and_a_finite_figure() {
        let zero = Peak {
            label: "zero".into(),
            bytes_per_second: 0.0,
        };
        assert_eq!(ratio(1e9, Some(&zero)), None);
        assert_eq!(ratio(1e9, None), None);
        let one = Peak {
            label: "one".into(),
            bytes_per_second: 2e9,
        };
        assert_eq!(ratio(f64::INFINITY, Some(&one)), None);
        assert_eq!(ratio(1e9, Some(&one)), Some(0.5));
    }
}
