//! What NVML says about each GPU's links and memory, for the probe's peaks.
//! CUDA and NVML number GPUs differently (`CUDA_VISIBLE_DEVICES`,
//! `CUDA_DEVICE_ORDER`), so the two are matched by PCI bus id.

use std::collections::HashMap;

use nvml_wrapper::enum_wrappers::device::Clock;
use serde::Serialize;

use crate::gpu::backend::{nvlink_links_of_product, GpuIdentity};

/// NVML has at most this many NVLink links per GPU.
const NVLINK_MAX_LINKS: u32 = 18;

/// One GPU's links and memory, as NVML gives them.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct GpuFacts {
    /// NVML's index (what `nvidia-smi` shows).
    pub nvml_index: u32,
    /// `hopper`, `ampere`, …
    pub architecture: String,
    /// Highest PCIe generation of the GPU and the slot together.
    pub pcie_link_gen_max: Option<u32>,
    /// Widest PCIe link of the GPU and the slot together.
    pub pcie_link_width_max: Option<u32>,
    /// PCIe generation the link trained to now (it drops when idle to save power).
    pub pcie_link_gen_current: Option<u32>,
    /// PCIe lanes the link trained to now.
    pub pcie_link_width_current: Option<u32>,
    /// HBM peak (the collector's figure, [`GpuIdentity::hbm_peak_bytes_per_second`]).
    pub hbm_peak_bytes_per_second: Option<f64>,
    /// Each NVLink link that is up: the normalised PCI bus id at its far end
    /// (a GPU's, or an NVSwitch's), `None` where NVML does not say.
    pub nvlinks_up: Vec<Option<String>>,
}

/// A PCI bus id as `dddddddd:bb:dd.f`, lowercase: NVML writes an 8-digit
/// domain in capitals (`00000000:18:00.0`), CUDA a 4-digit one (`0000:18:00.0`).
pub fn normalise_bus_id(id: &str) -> Option<String> {
    let id = id.trim();
    let (domain, rest) = id.split_once(':')?;
    let (bus, rest) = rest.split_once(':')?;
    let (device, function) = rest.split_once('.')?;
    let hex = |s: &str| u32::from_str_radix(s, 16).ok();
    Some(format!(
        "{:08x}:{:02x}:{:02x}.{:x}",
        hex(domain)?,
        hex(bus)?,
        hex(device)?,
        hex(function)?
    ))
}

/// Each GPU NVML sees, by normalised bus id; an error when NVML does not load.
pub fn read_nvml() -> Result<HashMap<String, GpuFacts>, String> {
    let nvml = crate::gpu::nvml::load()?;
    let count = nvml
        .device_count()
        .map_err(|e| format!("NVML could not count the GPUs: {e}"))?;
    let mut facts = HashMap::new();
    for index in 0..count {
        let Ok(d) = nvml.device_by_index(index) else {
            continue;
        };
        let Some(bus) = d.pci_info().ok().and_then(|p| normalise_bus_id(&p.bus_id)) else {
            continue;
        };
        let name = d.name().unwrap_or_default();
        let architecture = d
            .architecture()
            .map(|a| a.to_string().to_ascii_lowercase())
            .unwrap_or_else(|_| "unknown".into());
        // The collector's identity of the GPU, for its HBM peak.
        let identity = GpuIdentity {
            index,
            uuid: String::new(),
            nvlink_links_product: nvlink_links_of_product(&name),
            name,
            pci_bus_id: bus.clone(),
            architecture: architecture.clone(),
            memory_bus_width_bits: d.memory_bus_width().ok(),
            memory_clock_max_hz: d
                .max_clock_info(Clock::Memory)
                .ok()
                .map(|mhz| f64::from(mhz) * 1e6),
            sm_clock_max_hz: None,
            pcie_link_gen_max: None,
            pcie_link_width_max: None,
            gpm_supported: false,
        };
        let nvlinks_up = (0..NVLINK_MAX_LINKS)
            .filter_map(|link| {
                let wrapper = d.link_wrapper_for(link);
                matches!(wrapper.is_active(), Ok(true)).then(|| {
                    wrapper
                        .remote_pci_info()
                        .ok()
                        .and_then(|p| normalise_bus_id(&p.bus_id))
                })
            })
            .collect();
        facts.insert(
            bus,
            GpuFacts {
                nvml_index: index,
                architecture,
                pcie_link_gen_max: d.max_pcie_link_gen().ok(),
                pcie_link_width_max: d.max_pcie_link_width().ok(),
                pcie_link_gen_current: d.current_pcie_link_gen().ok(),
                pcie_link_width_current: d.current_pcie_link_width().ok(),
                hbm_peak_bytes_per_second: identity.hbm_peak_bytes_per_second(),
                nvlinks_up,
            },
        );
    }
    Ok(facts)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nvml_and_cuda_bus_ids_normalise_to_one_form() {
        assert_eq!(
            normalise_bus_id("00000000:18:00.0").as_deref(),
            Some("00000000:18:00.0")
        );
        assert_eq!(
            normalise_bus_id("0000:18:00.0").as_deref(),
            Some("00000000:18:00.0")
        );
        assert_eq!(
            normalise_bus_id("00000001:AB:1F.7").as_deref(),
            Some("00000001:ab:1f.7")
        );
        assert_eq!(normalise_bus_id("0000:18:00"), None);
        assert_eq!(normalise_bus_id("zz:18:00.0"), None);
        assert_eq!(normalise_bus_id(""), None);
    }
}
