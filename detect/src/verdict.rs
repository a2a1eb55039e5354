//! The platform verdict: bare metal, a VM with whole GPUs passed through, a
//! vGPU, or a MIG slice, from the host facts (`platform_host`) and what NVML
//! says about each GPU; and the GPU half of the measured tax.

use std::collections::BTreeMap;

use super::view::View;

/// NVML clock event reasons that take clock away from a busy GPU: software
/// power cap, hardware slowdown, software and hardware thermal slowdown,
/// power brake. Idle, application clocks, sync boost and display clocks are
/// choices, not a tax.
pub const THROTTLE_REASONS_MASK: u64 = 0x4 | 0x8 | 0x20 | 0x40 | 0x80;
/// A GPU counts as busy, for the checks that need load, above this utilisation.
pub const BUSY_UTILIZATION: f64 = 0.5;

/// Host facts, as the platform collector's row tags carry them.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct HostFacts {
    pub virtualization: String,
    pub hypervisor: String,
    pub cloud: String,
    pub product: String,
    pub iommu: String,
    pub gpudirect_rdma: String,
}

/// The latest facts and sample of one GPU.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct GpuFacts {
    pub virtualization_mode: String,
    pub mig: String,
    pub utilization: Option<f64>,
    pub hbm_bytes_per_second: Option<f64>,
    pub hbm_peak_bytes_per_second: Option<f64>,
    pub sm_clock_hertz: Option<f64>,
    pub sm_clock_max_hertz: Option<f64>,
    pub clock_event_reasons: Option<u64>,
    pub pcie_gen: Option<f64>,
    pub pcie_gen_max: Option<f64>,
    pub pcie_width: Option<f64>,
    pub pcie_width_max: Option<f64>,
    pub nvlink_links_up: Option<f64>,
    pub nvlink_links_product: Option<f64>,
    /// NVLink receive plus transmit, and its peak over the product's links.
    pub nvlink_bytes_per_second: Option<f64>,
    pub nvlink_peak_bytes_per_second: Option<f64>,
    pub sm_active: Option<f64>,
    pub dram_bandwidth: Option<f64>,
    pub memory_utilization: Option<f64>,
    /// What the transfer probe's latest run on it measured.
    pub probe: ProbedTransfers,
}

/// Below this share of its peak, a transfer the probe measured is evidence
/// of a tax: on bare metal and through a passed-through link alike a large
/// copy gets 0.85-0.9 of PCIe's encoded rate and of the HBM peak
/// (docs/gpus.md), so 0.7 leaves room for a slower host without calling it one.
pub const LOW_TRANSFER_RATIO: f64 = 0.7;

/// One bandwidth the probe measured and its peak.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Transfer {
    pub bytes_per_second: Option<f64>,
    pub peak_bytes_per_second: Option<f64>,
}

impl Transfer {
    /// Measured over peak, where both are known and the peak is positive.
    pub fn ratio(&self) -> Option<f64> {
        let (b, peak) = (self.bytes_per_second?, self.peak_bytes_per_second?);
        (peak > 0.0).then(|| b / peak)
    }
}

/// A GPU's latest `gpu_probe` row.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct ProbedTransfers {
    pub host_to_device: Transfer,
    pub device_to_host: Transfer,
    pub device_to_device: Transfer,
}

impl GpuFacts {
    fn busy(&self) -> bool {
        self.utilization.is_some_and(|u| u >= BUSY_UTILIZATION)
    }

    /// SM clock lost to a throttle reason: 1 − clock/max while one is active, else 0.
    pub fn clock_throttle_ratio(&self) -> Option<f64> {
        let reasons = self.clock_event_reasons?;
        if reasons & THROTTLE_REASONS_MASK == 0 {
            return Some(0.0);
        }
        let (clock, max) = (self.sm_clock_hertz?, self.sm_clock_max_hertz?);
        (max > 0.0).then(|| (1.0 - clock / max).clamp(0.0, 1.0))
    }

    /// PCIe bandwidth lost to a link trained below its generation or width,
    /// judged only under load: idle links train down to save power.
    pub fn pcie_bandwidth_loss_ratio(&self) -> Option<f64> {
        if !self.busy() {
            return None;
        }
        let lane = |gen: f64| vtax_collectors::gpu::backend::pcie_lane_bytes_per_second(gen as u32);
        let now = lane(self.pcie_gen?)? * self.pcie_width?;
        let max = lane(self.pcie_gen_max?)? * self.pcie_width_max?;
        (max > 0.0).then(|| (1.0 - now / max).clamp(0.0, 1.0))
    }

    /// NVLink links missing against the product's count.
    pub fn nvlink_links_missing_ratio(&self) -> Option<f64> {
        let (product, up) = (self.nvlink_links_product?, self.nvlink_links_up?);
        (product > 0.0).then(|| ((product - up) / product).clamp(0.0, 1.0))
    }

    /// SM activity lost while kernels keep running: 1 − SM active / utilisation.
    /// The workload's demand is the utilisation (a kernel resident); a
    /// neighbour or a throttle shows as SMs idling inside that time.
    pub fn sm_activity_loss_ratio(&self) -> Option<f64> {
        activity_loss(self.sm_active?, self.utilization?)
    }

    /// HBM bandwidth lost while kernels keep running: 1 − DRAM bandwidth / utilisation.
    pub fn dram_activity_loss_ratio(&self) -> Option<f64> {
        activity_loss(self.dram_bandwidth?, self.utilization?)
    }
}

fn activity_loss(activity: f64, utilization: f64) -> Option<f64> {
    (utilization >= BUSY_UTILIZATION).then(|| (1.0 - activity / utilization).clamp(0.0, 1.0))
}

/// Everything the verdict is made of.
#[derive(Clone, Debug, Default)]
pub struct Facts {
    pub host: Option<HostFacts>,
    /// By NVML index.
    pub gpus: BTreeMap<String, GpuFacts>,
}

/// The verdict and its evidence, as the `platform` table's tags.
#[derive(Clone, Debug, PartialEq)]
pub struct Verdict {
    pub verdict: &'static str,
    pub host: HostFacts,
    pub gpu_virtualization: String,
    pub mig: String,
    pub nvlink: String,
    pub pcie: String,
    /// GPUs whose facts are known, a lost one included; those with MIG on;
    /// those NVML calls a vGPU.
    pub gpus: usize,
    pub mig_gpus: usize,
    pub vgpu_gpus: usize,
    /// Transfers the probe measured below [`LOW_TRANSFER_RATIO`] of their
    /// peak, in words: "GPU 0: host→device at 0.38 of Gen5 x16 (24.1 of 63.0 GB/s)".
    pub transfers: Vec<String>,
}

impl Verdict {
    /// The verdict as a row of the `platform` table.
    pub fn row(&self) -> super::tables::PlatformRow<'_> {
        super::tables::PlatformRow {
            verdict: self.verdict,
            virtualization: &self.host.virtualization,
            hypervisor: &self.host.hypervisor,
            cloud: &self.host.cloud,
            product: &self.host.product,
            gpu_virtualization: &self.gpu_virtualization,
            mig: &self.mig,
            nvlink: &self.nvlink,
            pcie: &self.pcie,
            iommu: &self.host.iommu,
            gpudirect_rdma: &self.host.gpudirect_rdma,
            info: 1,
        }
    }

    /// The verdict in one sentence for a person: bare metal or a virtual
    /// machine and by what, and how its GPUs reach it, e.g. "KVM virtual
    /// machine, 8 GPUs passed through, MIG on 3 of 8".
    pub fn sentence(&self) -> String {
        let host = &self.host;
        let machine = vtax_collectors::platform::host_words(
            &host.virtualization,
            &host.hypervisor,
            &host.product,
            &host.cloud,
        );
        let n = self.gpus;
        let gpus = |n: usize| match n {
            1 => "1 GPU".to_string(),
            n => format!("{n} GPUs"),
        };
        let of_them = |k: usize| {
            if k == n {
                "all".to_string()
            } else {
                format!("{k} of {n}")
            }
        };
        let in_vm = host.virtualization == "vm";
        let how = match self.verdict {
            "mig" if in_vm => format!(
                "{} passed through, MIG on {}",
                gpus(n),
                of_them(self.mig_gpus)
            ),
            "mig" => format!("{}, MIG on {}", gpus(n), of_them(self.mig_gpus)),
            "vgpu" => format!("{}, vGPU on {}", gpus(n), of_them(self.vgpu_gpus)),
            "vm_passthrough" => format!("{} passed through", gpus(n)),
            "bare_metal" if n > 0 => format!("{}, not virtualized", gpus(n)),
            _ if n > 0 => gpus(n),
            _ => "no GPU read".to_string(),
        };
        format!("{machine}, {how}")
    }

    /// The evidence under the verdict, for `vtax doctor`: the label the
    /// verdict carries on `/metrics`, the host facts and the GPUs'.
    pub fn explain(&self) -> Vec<String> {
        let mut lines = vec![
            format!(
                "{}{{verdict=\"{}\"}}",
                super::tables::PLATFORM.metric_name(&super::tables::PLATFORM.fields[0]),
                self.verdict
            ),
            format!(
                "host: virtualization {} (hypervisor {}, cloud {}, product {}), IOMMU {}, GPUDirect RDMA {}",
                self.host.virtualization,
                self.host.hypervisor,
                self.host.cloud,
                self.host.product,
                self.host.iommu,
                self.host.gpudirect_rdma
            ),
        ];
        if self.gpu_virtualization == "none" {
            lines.push("GPUs: none read".into());
        } else {
            lines.push(format!(
                "GPUs: NVML virtualization mode {}, MIG {}, NVLink links up {}, PCIe {}",
                self.gpu_virtualization, self.mig, self.nvlink, self.pcie
            ));
        }
        lines.extend(self.transfers.iter().cloned());
        lines
    }
}

impl Facts {
    /// Reads whichever of the verdict's source tables `batch` is.
    pub fn observe(&mut self, batch: &vtax_store::Batch) {
        let view = View::new(batch);
        match batch.table.name {
            "platform_host" => self.observe_host(&view),
            "gpu_info" => self.observe_gpu_info(&view),
            "gpu" => {
                self.observe_gpu(&view);
            }
            "gpu_probe" => self.observe_gpu_probe(&view),
            _ => {}
        }
    }

    /// Reads a `platform_host` batch's last row.
    pub fn observe_host(&mut self, view: &View) {
        let Some(row) = view.rows().checked_sub(1) else {
            return;
        };
        self.host = Some(HostFacts {
            virtualization: view.tag(row, "virtualization").to_string(),
            hypervisor: view.tag(row, "hypervisor").to_string(),
            cloud: view.tag(row, "cloud").to_string(),
            product: view.tag(row, "product").to_string(),
            iommu: view.tag(row, "iommu").to_string(),
            gpudirect_rdma: view.tag(row, "gpudirect_rdma").to_string(),
        });
    }

    /// Reads a `gpu_info` batch.
    pub fn observe_gpu_info(&mut self, view: &View) {
        for row in 0..view.rows() {
            let gpu = self
                .gpus
                .entry(view.tag(row, "gpu").to_string())
                .or_default();
            gpu.virtualization_mode = view.tag(row, "virtualization_mode").to_string();
            gpu.mig = view.tag(row, "mig").to_string();
        }
    }

    /// Reads a `gpu` batch; returns the GPUs it held.
    pub fn observe_gpu(&mut self, view: &View) -> Vec<String> {
        let mut seen = Vec::with_capacity(view.rows());
        for row in 0..view.rows() {
            let index = view.tag(row, "gpu").to_string();
            let gpu = self.gpus.entry(index.clone()).or_default();
            gpu.utilization = view.value(row, "utilization_ratio");
            gpu.memory_utilization = view.value(row, "memory_utilization_ratio");
            gpu.sm_active = view.value(row, "sm_active_ratio");
            gpu.dram_bandwidth = view.value(row, "dram_bandwidth_ratio");
            gpu.hbm_bytes_per_second = view.value(row, "hbm_bytes_per_second");
            gpu.hbm_peak_bytes_per_second = view.value(row, "hbm_peak_bytes_per_second");
            gpu.sm_clock_hertz = view.value(row, "sm_clock_hertz");
            gpu.sm_clock_max_hertz = view.value(row, "sm_clock_max_hertz");
            gpu.clock_event_reasons = view.value(row, "clock_event_reasons").map(|v| v as u64);
            gpu.pcie_gen = view.value(row, "pcie_link_gen");
            gpu.pcie_gen_max = view.value(row, "pcie_link_gen_max");
            gpu.pcie_width = view.value(row, "pcie_link_width");
            gpu.pcie_width_max = view.value(row, "pcie_link_width_max");
            gpu.nvlink_links_up = view.value(row, "nvlink_links_up");
            gpu.nvlink_links_product = view.value(row, "nvlink_links_product");
            gpu.nvlink_bytes_per_second = view
                .value(row, "nvlink_total_rx_bytes_per_second")
                .zip(view.value(row, "nvlink_total_tx_bytes_per_second"))
                .map(|(rx, tx)| rx + tx);
            gpu.nvlink_peak_bytes_per_second = view.value(row, "nvlink_peak_bytes_per_second");
            seen.push(index);
        }
        seen
    }

    /// Reads a `gpu_probe` batch: each GPU's latest transfers.
    pub fn observe_gpu_probe(&mut self, view: &View) {
        for row in 0..view.rows() {
            let gpu = self
                .gpus
                .entry(view.tag(row, "gpu").to_string())
                .or_default();
            let transfer = |what: &str| Transfer {
                bytes_per_second: view.value(row, &format!("{what}_bytes_per_second")),
                peak_bytes_per_second: view.value(row, &format!("{what}_peak_bytes_per_second")),
            };
            gpu.probe = ProbedTransfers {
                host_to_device: transfer("host_to_device"),
                device_to_host: transfer("device_to_host"),
                device_to_device: transfer("device_to_device"),
            };
        }
    }

    /// Forgets GPUs that fell off the bus (no longer in `gpu_info`).
    pub fn retain_gpus(&mut self, present: &[String]) {
        self.gpus.retain(|k, _| present.contains(k));
    }

    /// The verdict from what is known now.
    pub fn verdict(&self) -> Verdict {
        let host = self.host.clone().unwrap_or_else(|| HostFacts {
            virtualization: "unknown".into(),
            hypervisor: "unknown".into(),
            cloud: "unknown".into(),
            product: "unknown".into(),
            iommu: "unknown".into(),
            gpudirect_rdma: "unknown".into(),
        });
        let gpus: Vec<&GpuFacts> = self
            .gpus
            .values()
            .filter(|g| !g.virtualization_mode.is_empty())
            .collect();
        let mut modes: Vec<&str> = gpus
            .iter()
            .map(|g| g.virtualization_mode.as_str())
            .collect();
        modes.sort_unstable();
        modes.dedup();
        let has = |mode: &str| modes.contains(&mode);
        let mig_on = gpus.iter().any(|g| g.mig == "on");
        let in_vm = host.virtualization == "vm";
        let verdict = if mig_on {
            "mig"
        } else if has("vgpu") {
            "vgpu"
        } else if !gpus.is_empty() && (has("passthrough") || in_vm) {
            "vm_passthrough"
        } else if in_vm {
            "vm"
        } else if host.virtualization == "none" {
            "bare_metal"
        } else {
            "unknown"
        };
        let (up, product) = self.nvlink_totals();
        let busy: Vec<f64> = gpus
            .iter()
            .filter_map(|g| g.pcie_bandwidth_loss_ratio())
            .collect();
        let none_if_no_gpus = |s: String| if gpus.is_empty() { "none".into() } else { s };
        Verdict {
            verdict,
            gpus: gpus.len(),
            mig_gpus: gpus.iter().filter(|g| g.mig == "on").count(),
            vgpu_gpus: gpus
                .iter()
                .filter(|g| g.virtualization_mode == "vgpu")
                .count(),
            transfers: self.low_transfers(),
            host,
            gpu_virtualization: none_if_no_gpus(modes.join(",")),
            mig: none_if_no_gpus(if mig_on { "on" } else { "off" }.into()),
            nvlink: if product > 0.0 {
                format!("{up}/{product}")
            } else {
                "none".into()
            },
            pcie: none_if_no_gpus(
                if busy.is_empty() {
                    "idle"
                } else if busy.iter().any(|l| *l > 0.0) {
                    "degraded"
                } else {
                    "full"
                }
                .into(),
            ),
        }
    }

    /// HBM achieved against peak, over the busy GPUs.
    pub fn hbm_peak_ratio(&self) -> Option<f64> {
        mean(self.gpus.values().filter(|g| g.busy()).filter_map(|g| {
            let peak = g.hbm_peak_bytes_per_second?;
            let achieved = g.hbm_bytes_per_second?;
            (peak > 0.0).then(|| achieved / peak)
        }))
    }

    /// NVLink receive plus transmit against the peak of the product's links,
    /// over the busy GPUs. A GPU with every link of its product hidden or
    /// down has no throughput to read and has lost all of its NVLink: it
    /// counts as 0, as the report counts it, not left out (which made a node
    /// with half its GPUs' links hidden read as twice what it got).
    pub fn nvlink_peak_ratio(&self) -> Option<f64> {
        mean(self.gpus.values().filter(|g| g.busy()).filter_map(|g| {
            let peak = g.nvlink_peak_bytes_per_second?;
            let achieved = match g.nvlink_bytes_per_second {
                Some(bytes) => bytes,
                None if g.nvlink_links_up == Some(0.0)
                    && g.nvlink_links_product.is_some_and(|links| links > 0.0) =>
                {
                    0.0
                }
                None => return None,
            };
            (peak > 0.0).then(|| achieved / peak)
        }))
    }

    /// Links missing over all GPUs with NVLink.
    pub fn nvlink_links_missing_ratio(&self) -> Option<f64> {
        let (up, product) = self.nvlink_totals();
        (product > 0.0).then(|| ((product - up) / product).clamp(0.0, 1.0))
    }

    /// NVLink links up and links the products have, over the GPUs that report both.
    fn nvlink_totals(&self) -> (f64, f64) {
        self.gpus
            .values()
            .filter_map(|g| Some((g.nvlink_links_up?, g.nvlink_links_product?)))
            .fold((0.0, 0.0), |(u, p), (gu, gp)| (u + gu, p + gp))
    }

    /// The lowest GPU's value of `f`.
    pub fn lowest(&self, f: impl Fn(&GpuFacts) -> Option<f64>) -> Option<f64> {
        self.gpus.values().filter_map(f).reduce(f64::min)
    }

    /// The probe's transfers below [`LOW_TRANSFER_RATIO`] of their peak, in words.
    fn low_transfers(&self) -> Vec<String> {
        let mut lines = Vec::new();
        for (index, g) in &self.gpus {
            let pcie = match (g.pcie_gen_max, g.pcie_width_max) {
                (Some(gen), Some(width)) => format!("Gen{gen} x{width}"),
                _ => "its PCIe link".into(),
            };
            let p = &g.probe;
            for (what, t, peak) in [
                ("host→device", p.host_to_device, pcie.as_str()),
                ("device→host", p.device_to_host, pcie.as_str()),
                ("device→device", p.device_to_device, "the HBM peak"),
            ] {
                let (Some(ratio), Some(b), Some(max)) =
                    (t.ratio(), t.bytes_per_second, t.peak_bytes_per_second)
                else {
                    continue;
                };
                if ratio < LOW_TRANSFER_RATIO {
                    lines.push(format!(
                        "GPU {index}: {what} at {ratio:.2} of {peak} ({} of {} GB/s), measured by the transfer probe",
                        vtax_collectors::gpu_probe::engine::peaks::gigabytes(b),
                        vtax_collectors::gpu_probe::engine::peaks::gigabytes(max)
                    ));
                }
            }
        }
        lines
    }

    /// The worst GPU's value of `f`.
    pub fn worst(&self, f: impl Fn(&GpuFacts) -> Option<f64>) -> Option<f64> {
        self.gpus.values().filter_map(f).reduce(f64::max)
    }
}

fn mean(values: impl Iterator<Item = f64>) -> Option<f64> {
    let (sum, n) = values.fold((0.0, 0usize), |(s, n), v| (s + v, n + 1));
    (n > 0).then(|| sum / n as f64)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn host(virtualization: &str) -> HostFacts {
        HostFacts {
            virtualization: virtualization.into(),
            hypervisor: if virtualization == "vm" {
                "kvm"
            } else {
                "none"
            }
            .into(),
            cloud: "none".into(),
            product: "test".into(),
            iommu: "on".into(),
            gpudirect_rdma: "none".into(),
        }
    }

    fn gpu(mode: &str, mig: &str) -> GpuFacts {
        GpuFacts {
            virtualization_mode: mode.into(),
            mig: mig.into(),
            utilization: Some(0.9),
            pcie_gen: Some(5.0),
            pcie_gen_max: Some(5.0),
            pcie_width: Some(16.0),
            pcie_width_max: Some(16.0),
            nvlink_links_up: Some(18.0),
            nvlink_links_product: Some(18.0),
            ..GpuFacts::default()
        }
    }

    fn facts(host_virt: &str, gpus: Vec<GpuFacts>) -> Facts {
        Facts {
            host: Some(host(host_virt)),
            gpus: gpus
                .into_iter()
                .enumerate()
                .map(|(i, g)| (i.to_string(), g))
                .collect(),
        }
    }

    #[test]
    fn nvlink_throughput_against_peak_counts_busy_gpus_only() {
        let busy = GpuFacts {
            nvlink_bytes_per_second: Some(450e9),
            nvlink_peak_bytes_per_second: Some(900e9),
            ..gpu("passthrough", "off")
        };
        let idle = GpuFacts {
            utilization: Some(0.1),
            nvlink_bytes_per_second: Some(0.0),
            ..busy.clone()
        };
        let unknown_peak = GpuFacts {
            nvlink_peak_bytes_per_second: None,
            ..busy.clone()
        };
        let node = facts("vm", vec![busy.clone(), idle, unknown_peak]);
        assert_eq!(node.nvlink_peak_ratio(), Some(0.5));
        // Links hidden (a VM that does not pass them): none to read, all lost.
        let hidden = GpuFacts {
            nvlink_bytes_per_second: None,
            nvlink_links_up: Some(0.0),
            nvlink_links_product: Some(18.0),
            ..busy.clone()
        };
        assert_eq!(
            facts("vm", vec![busy.clone(), hidden]).nvlink_peak_ratio(),
            Some(0.25)
        );
        let unread = GpuFacts {
            nvlink_bytes_per_second: None,
            ..busy.clone()
        };
        assert_eq!(
            facts("vm", vec![busy, unread]).nvlink_peak_ratio(),
            Some(0.5)
        );
        assert_eq!(
            facts("vm", vec![gpu("passthrough", "off")]).nvlink_peak_ratio(),
            None
        );
    }

    #[test]
    fn verdicts_from_the_evidence() {
        assert_eq!(
            facts("none", vec![gpu("bare", "off")]).verdict().verdict,
            "bare_metal"
        );
        assert_eq!(
            facts("vm", vec![gpu("passthrough", "off")])
                .verdict()
                .verdict,
            "vm_passthrough"
        );
        // NVML may say bare inside a VM that hides itself poorly; the host facts decide.
        assert_eq!(
            facts("vm", vec![gpu("bare", "off")]).verdict().verdict,
            "vm_passthrough"
        );
        assert_eq!(
            facts("vm", vec![gpu("vgpu", "off")]).verdict().verdict,
            "vgpu"
        );
        assert_eq!(
            facts("none", vec![gpu("bare", "on")]).verdict().verdict,
            "mig"
        );
        assert_eq!(facts("vm", vec![]).verdict().verdict, "vm");
        assert_eq!(facts("none", vec![]).verdict().verdict, "bare_metal");
        assert_eq!(Facts::default().verdict().verdict, "unknown");
        assert_eq!(facts("none", vec![]).verdict().gpu_virtualization, "none");
    }

    /// One sentence says bare metal or a VM and by what, and how the GPUs
    /// reach it: `vtax doctor` prints it as its one verdict line.
    #[test]
    fn the_verdict_in_one_sentence() {
        let sentence =
            |host_virt: &str, gpus: Vec<GpuFacts>| facts(host_virt, gpus).verdict().sentence();
        assert_eq!(
            sentence("none", vec![gpu("bare", "off"); 8]),
            "bare metal (test), 8 GPUs, not virtualized"
        );
        assert_eq!(
            sentence("vm", vec![gpu("passthrough", "off"); 8]),
            "KVM virtual machine (test), 8 GPUs passed through"
        );
        let mut mixed = vec![gpu("passthrough", "off"); 8];
        mixed[2].mig = "on".into();
        mixed[5].mig = "on".into();
        assert_eq!(
            sentence("vm", mixed),
            "KVM virtual machine (test), 8 GPUs passed through, MIG on 2 of 8"
        );
        assert_eq!(
            sentence("none", vec![gpu("bare", "on")]),
            "bare metal (test), 1 GPU, MIG on all"
        );
        assert_eq!(
            sentence("vm", vec![gpu("vgpu", "off"); 4]),
            "KVM virtual machine (test), 4 GPUs, vGPU on all"
        );
        assert_eq!(
            sentence("vm", vec![]),
            "KVM virtual machine (test), no GPU read"
        );
        assert_eq!(
            Facts::default().verdict().sentence(),
            "virtualization unknown, no GPU read"
        );
        let explained = facts("vm", vec![gpu("bare", "on")]).verdict().explain();
        assert!(explained[0].ends_with("{verdict=\"mig\"}"), "{explained:?}");
    }

    #[test]
    fn hidden_nvlink_and_a_narrow_pcie_link_show_in_the_evidence() {
        let mut hidden = gpu("passthrough", "off");
        hidden.nvlink_links_up = Some(0.0);
        hidden.pcie_width = Some(8.0);
        let f = facts("vm", vec![hidden, gpu("passthrough", "off")]);
        let v = f.verdict();
        assert_eq!(v.nvlink, "18/36");
        assert_eq!(v.pcie, "degraded");
        assert_eq!(f.nvlink_links_missing_ratio(), Some(0.5));
        assert_eq!(f.worst(GpuFacts::pcie_bandwidth_loss_ratio), Some(0.5));
    }

    #[test]
    fn pcie_is_judged_only_under_load() {
        let mut idle = gpu("bare", "off");
        idle.utilization = Some(0.0);
        idle.pcie_gen = Some(1.0);
        assert_eq!(idle.pcie_bandwidth_loss_ratio(), None);
        assert_eq!(facts("none", vec![idle]).verdict().pcie, "idle");
        let mut gen4 = gpu("bare", "off");
        gen4.pcie_gen = Some(4.0);
        let loss = gen4.pcie_bandwidth_loss_ratio().unwrap();
        assert!((loss - (1.0 - 1.969 / 3.938)).abs() < 1e-9);
    }

    #[test]
    fn only_throttle_reasons_count_as_clock_lost() {
        let mut g = gpu("bare", "off");
        g.sm_clock_hertz = Some(1.5e9);
        g.sm_clock_max_hertz = Some(2.0e9);
        g.clock_event_reasons = Some(0x1 | 0x2); // idle, application clocks
        assert_eq!(g.clock_throttle_ratio(), Some(0.0));
        g.clock_event_reasons = Some(0x40); // hardware thermal slowdown
        assert_eq!(g.clock_throttle_ratio(), Some(0.25));
    }

    #[test]
    fn activity_loss_needs_demand() {
        let mut g = gpu("bare", "off");
        g.sm_active = Some(0.45);
        assert!((g.sm_activity_loss_ratio().unwrap() - 0.5).abs() < 1e-9);
        g.utilization = Some(0.1);
        assert_eq!(g.sm_activity_loss_ratio(), None);
    }
}
