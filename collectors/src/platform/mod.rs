//! `platform`: whether this node is a virtual machine and by what, and the
//! platform facts that decide whether GPU and RDMA paths are bare-metal quality:
//! kernel, IOMMU, GPUDirect RDMA and Storage, the NVIDIA driver, NUMA nodes
//! and CPUs, and which NICs and NVMe drives share a PCIe switch or NUMA node
//! with each GPU (`platform_gpu_affinity`).
//!
//! The verdict combines independent evidence, each kept as a line for
//! `vtax doctor`: the CPUID hypervisor-present bit (leaf 1 ECX bit 31) and the
//! hypervisor's vendor leaf 0x40000000 (x86_64 only, through [`CpuidSource`] so
//! tests inject it), the `hypervisor` flag in `/proc/cpuinfo`, DMI under
//! `<sysfs>/class/dmi/id/` and `<sysfs>/hypervisor/type`. Any positive sign
//! makes the node a `vm`; a clear CPUID bit or a cpuinfo without the flag makes
//! it `none`; without either it is `unknown` (other architectures, no DMI).
//!
//! What it reads never fails a tick: a missing file is an unknown fact, and a
//! file that cannot be read or is not text (binary junk) is an unknown fact,
//! named in `source_errors` (so counted in `vtax_collector_failed_sources`,
//! logged and listed by `vtax doctor`); every other fact is read as usual.
//! Only an unreadable procfs fails.

use std::collections::HashSet;
use std::io::Read as _;
use std::path::Path;

use serde::{Deserialize, Serialize};
use vtax_store::schema::{FieldDef, FieldType, TableDef, TagDef, Unit};
use vtax_store::{Batch, BatchBuilder};

use super::pci::{gpu_affinity, Affinity};
use super::{Availability, Collector, ParseError, Roots};

mod cpuid;
mod host_files;
mod facts;
mod collector;

pub use cpuid::*;
pub use host_files::*;
pub use facts::*;
pub use collector::*;

#[cfg(test)]
mod tests;

/// Platform facts rarely change: read them once a minute.
pub const DEFAULT_PLATFORM_INTERVAL_SECS: f64 = 60.0;

/// `[collectors.platform]`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PlatformConfig {
    /// Whether the collector runs.
    pub enabled: bool,
    /// Seconds between two reads.
    pub interval_secs: f64,
}

impl Default for PlatformConfig {
    fn default() -> Self {
        PlatformConfig {
            enabled: true,
            interval_secs: DEFAULT_PLATFORM_INTERVAL_SECS,
        }
    }
}

crate::common_settings!(PlatformConfig);

impl crate::Registered for PlatformConfig {
    fn tables() -> &'static [&'static vtax_store::TableDef] {
        TABLES
    }
    fn key_docs() -> &'static [(&'static str, &'static str)] {
        KEY_DOCS
    }
    fn build(
        &self,
        _all: &crate::CollectorsConfig,
        roots: &crate::Roots,
    ) -> Box<dyn crate::Collector> {
        Box::new(Platform::new(self, roots))
    }
}

/// Comments for this collector's own keys in the example config.
pub static KEY_DOCS: &[(&str, &str)] = &[];

/// Tables of this collector.
pub static TABLES: &[&TableDef] = &[&PLATFORM, &PLATFORM_TOPOLOGY, &PLATFORM_GPU_AFFINITY];

const fn tag(name: &'static str, help: &'static str) -> TagDef {
    TagDef { name, help }
}

const fn count(name: &'static str, help: &'static str) -> FieldDef {
    FieldDef::gauge(name, FieldType::I64, Unit::None, help)
}

vtax_store::table! {
    /// The host facts row: `vtax_platform_host_info{...} 1`. The detector turns
    /// these and the GPUs' facts into the verdict, `vtax_platform_info`.
    pub static PLATFORM: TableDef, pub struct PlatformHostRow {
        name: "platform_host",
        help: "One row per read: the node's platform facts as tags, and 1. Whether the node is a \
               virtual machine and by what, and the kernel, IOMMU and driver facts that decide \
               whether GPU and RDMA paths are bare-metal quality. Read once a minute by default.",
        tags: [
            virtualization = tag(
                "virtualization",
                "`vm`, `none` (bare metal) or `unknown`: from CPUID leaf 1 ECX bit 31, the cpuinfo \
                 `hypervisor` flag, DMI and /sys/hypervisor/type.",
            ),
            hypervisor = tag(
                "hypervisor",
                "`kvm`, `hyperv`, `vmware`, `xen`, `tcg` (QEMU emulation), `qemu` (DMI only), \
                 `parallels`, `acrn`, `bhyve`, `virtualbox`, `qnx`, `other`, `unknown`; `none` on bare metal.",
            ),
            cloud = tag(
                "cloud",
                "Cloud DMI names: `aws`, `gcp`, `azure`, `oci`, `alibaba`, `openstack`, \
                 `digitalocean`, `hetzner`; `none`; `unknown` without DMI.",
            ),
            product = tag(
                "product",
                "DMI vendor and product name, shortened (`QEMU Standard PC`, `Dell PowerEdge XE9680`), or `unknown`.",
            ),
            kernel = tag("kernel", "Kernel release (/proc/sys/kernel/osrelease)."),
            iommu = tag(
                "iommu",
                "`on` (DMA translated), `pt` (passthrough/identity), `off` (no IOMMU groups) or `unknown`.",
            ),
            gpudirect_rdma = tag(
                "gpudirect_rdma",
                "GPUDirect RDMA module loaded: `nvidia_peermem`, `nv_peer_mem`, `none`, or `unknown` \
                 when modules cannot be listed.",
            ),
            gpudirect_storage = tag(
                "gpudirect_storage",
                "GPUDirect Storage module loaded: `nvidia_fs`, `none`, or `unknown` when modules \
                 cannot be listed.",
            ),
            nvidia_driver = tag(
                "nvidia_driver",
                "NVIDIA kernel driver version (/proc/driver/nvidia/version); `none` when not loaded.",
            ),
            cpu_model = tag("cpu_model", "CPU model name from /proc/cpuinfo, shortened."),
        ],
        fields: [info: i64 = count("Always 1: the facts are in the labels.")],
        exported: true,
    }
}

vtax_store::table! {
    /// Counts worth graphing, apart from the info row so they keep one series.
    pub static PLATFORM_TOPOLOGY: TableDef, pub struct PlatformTopologyRow {
        name: "platform_topology",
        help: "One row per read: the node's CPU, NUMA, IOMMU and GPU counts.",
        tags: [],
        fields: [
            cpus: Option<i64> = count("Logical CPUs in /proc/cpuinfo."),
            numa_nodes: Option<i64> = count(
                "NUMA nodes under /sys/devices/system/node; null when the kernel has no NUMA.",
            ),
            iommu_groups: Option<i64> = count(
                "IOMMU groups under /sys/kernel/iommu_groups; 0 when the IOMMU is off.",
            ),
            nvidia_gpus: Option<i64> = count(
                "GPUs the NVIDIA driver drives (/proc/driver/nvidia/gpus); null when it is not loaded.",
            ),
        ],
        exported: true,
    }
}

vtax_store::table! {
    /// Which NICs and NVMe drives are near each GPU.
    pub static PLATFORM_GPU_AFFINITY: TableDef, pub struct GpuAffinityRow {
        name: "platform_gpu_affinity",
        help: "One row per read for each NVIDIA GPU and each RDMA device, network interface or NVMe \
               controller behind the same PCIe switch or on the same NUMA node, from the paths of \
               /sys/bus/pci/devices links. A shared switch is what makes GPUDirect RDMA and Storage \
               peer-to-peer; a shared node only keeps the bounce through host memory local.",
        tags: [
            gpu_pci_address = tag("gpu_pci_address", "The GPU's PCI address."),
            peer = tag(
                "peer",
                "RDMA device (mlx5_0), network interface (ens1f0np0) or NVMe controller (nvme0).",
            ),
            peer_kind = tag("peer_kind", "`rdma`, `netdev` or `nvme`."),
            peer_pci_address = tag("peer_pci_address", "The peer's PCI address."),
        ],
        fields: [
            same_pcie_switch: i64 = count(
                "1 when GPU and peer share a bridge below the root port (a PCIe switch): peer-to-peer DMA stays off the CPU.",
            ),
            same_numa_node: i64 = count("1 when GPU and peer are on the same NUMA node."),
        ],
        exported: true,
    }
}
