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

crate::collectors::common_settings!(PlatformConfig);

impl crate::collectors::Registered for PlatformConfig {
    fn tables() -> &'static [&'static vtax_store::TableDef] {
        TABLES
    }
    fn key_docs() -> &'static [(&'static str, &'static str)] {
        KEY_DOCS
    }
    fn build(
        &self,
        _all: &crate::collectors::CollectorsConfig,
        roots: &crate::collectors::Roots,
    ) -> Box<dyn crate::collectors::Collector> {
        Box::new(Platform::new(self, roots))
    }
}

/// The four registers one CPUID leaf returns.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CpuidRegs {
    /// EAX.
    pub eax: u32,
    /// EBX.
    pub ebx: u32,
    /// ECX.
    pub ecx: u32,
    /// EDX.
    pub edx: u32,
}

/// Where CPUID answers come from: the CPU, or fixed answers in tests.
pub trait CpuidSource: Send {
    /// The registers of `leaf` (subleaf 0), or `None` where there is no CPUID
    /// (any architecture but x86_64).
    fn cpuid(&self, leaf: u32) -> Option<CpuidRegs>;
}

/// The CPU this process runs on.
#[derive(Clone, Copy, Debug, Default)]
pub struct HostCpuid;

impl CpuidSource for HostCpuid {
    #[cfg(target_arch = "x86_64")]
    fn cpuid(&self, leaf: u32) -> Option<CpuidRegs> {
        // SAFETY: every x86_64 CPU has CPUID; it only reads identification
        // registers. (`__cpuid` is a safe fn on newer compilers.)
        #[allow(unused_unsafe)]
        let r = unsafe { std::arch::x86_64::__cpuid(leaf) };
        Some(CpuidRegs {
            eax: r.eax,
            ebx: r.ebx,
            ecx: r.ecx,
            edx: r.edx,
        })
    }

    #[cfg(not(target_arch = "x86_64"))]
    fn cpuid(&self, _leaf: u32) -> Option<CpuidRegs> {
        None
    }
}

/// First leaf of the range hypervisors answer in: its EBX, ECX, EDX hold the
/// vendor signature.
const HYPERVISOR_LEAF: u32 = 0x4000_0000;
/// Where KVM moves its own signature when it also offers Hyper-V's interface.
const KVM_BEHIND_HYPERV_LEAF: u32 = 0x4000_0100;

/// Hypervisor vendor signatures of leaf 0x40000000 (NULs trimmed) and their label.
const CPUID_VENDORS: &[(&str, &str)] = &[
    ("KVMKVMKVM", "kvm"),
    ("Microsoft Hv", "hyperv"),
    ("VMwareVMware", "vmware"),
    ("XenVMMXenVMM", "xen"),
    ("TCGTCGTCGTCG", "tcg"),
    (" lrpepyh  vr", "parallels"),
    ("ACRNACRNACRN", "acrn"),
    ("bhyve bhyve ", "bhyve"),
    ("VBoxVBoxVBox", "virtualbox"),
    ("QNXQVMBSQG", "qnx"),
];

/// The label of a leaf 0x40000000 vendor signature: a known hypervisor,
/// `unknown` when empty, `other` for a signature not in the list.
pub fn hypervisor_from_vendor(signature: &str) -> &'static str {
    let trimmed = signature.trim_end_matches('\0');
    if trimmed.trim().is_empty() {
        return "unknown";
    }
    CPUID_VENDORS
        .iter()
        .find(|(s, _)| *s == trimmed)
        .map_or("other", |(_, label)| label)
}

fn vendor_signature(r: CpuidRegs) -> String {
    let mut bytes = Vec::with_capacity(12);
    for reg in [r.ebx, r.ecx, r.edx] {
        bytes.extend_from_slice(&reg.to_le_bytes());
    }
    bytes
        .iter()
        .map(|&b| {
            if b == 0 || b.is_ascii_graphic() || b == b' ' {
                b as char
            } else {
                '?'
            }
        })
        .collect()
}

/// What CPUID says.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct CpuidFacts {
    /// Leaf 1 ECX bit 31; `None` without CPUID.
    hypervisor_bit: Option<bool>,
    /// Leaf 0x40000000's signature, NULs trimmed, when the bit is set.
    vendor: Option<String>,
    /// The hypervisor label the signature maps to.
    hypervisor: Option<&'static str>,
}

fn read_cpuid(source: &dyn CpuidSource, evidence: &mut Vec<String>) -> CpuidFacts {
    let Some(leaf1) = source.cpuid(1) else {
        evidence.push("CPUID: not available on this architecture".into());
        return CpuidFacts::default();
    };
    let bit = leaf1.ecx >> 31 & 1 == 1;
    evidence.push(format!(
        "CPUID leaf 0x1 ECX bit 31 (hypervisor present): {}",
        if bit { "set" } else { "clear" }
    ));
    if !bit {
        // Leaf 0x40000000 on bare metal returns whatever the CPU returns for
        // out-of-range leaves: meaningless, so it is not asked.
        return CpuidFacts {
            hypervisor_bit: Some(false),
            ..CpuidFacts::default()
        };
    }
    let Some(leaf) = source.cpuid(HYPERVISOR_LEAF) else {
        return CpuidFacts {
            hypervisor_bit: Some(true),
            ..CpuidFacts::default()
        };
    };
    let signature = vendor_signature(leaf);
    let mut hypervisor = hypervisor_from_vendor(&signature);
    let shown = signature.trim_end_matches('\0').to_string();
    evidence.push(format!(
        "CPUID leaf 0x40000000 vendor: {shown:?} ({hypervisor})"
    ));
    if hypervisor == "hyperv" && leaf.eax >= KVM_BEHIND_HYPERV_LEAF {
        if let Some(kvm) = source.cpuid(KVM_BEHIND_HYPERV_LEAF) {
            if hypervisor_from_vendor(&vendor_signature(kvm)) == "kvm" {
                hypervisor = "kvm";
                evidence.push(
                    "CPUID leaf 0x40000100 vendor: \"KVMKVMKVM\": KVM offering Hyper-V's interface"
                        .into(),
                );
            }
        }
    }
    CpuidFacts {
        hypervisor_bit: Some(true),
        vendor: Some(shown),
        hypervisor: Some(hypervisor),
    }
}

/// Most bytes read from one file: a junk file cannot take the agent's memory.
const MAX_FILE_BYTES: u64 = 8 << 20;

/// Longest label value.
const MAX_LABEL_CHARS: usize = 64;

/// Reads files for one pass, turning what cannot be used into notes.
struct Reader<'a> {
    roots: &'a Roots,
    /// Files that exist but could not be used, for `source_errors`.
    notes: Vec<ParseError>,
}

/// `path` exists but cannot be used.
fn unusable(path: &Path, reason: impl Into<String>) -> ParseError {
    ParseError {
        path: path.display().to_string(),
        line: 0,
        reason: reason.into(),
    }
}

impl Reader<'_> {
    /// The text of a file; `None` when it is missing (silently) or unreadable
    /// or not text (with a note naming it).
    fn text(&mut self, path: &Path) -> Option<String> {
        let mut bytes = Vec::new();
        let read =
            std::fs::File::open(path).and_then(|f| f.take(MAX_FILE_BYTES).read_to_end(&mut bytes));
        match read {
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return None,
            Err(e) => {
                self.notes.push(unusable(path, e.to_string()));
                return None;
            }
        }
        let text = match String::from_utf8(bytes) {
            Ok(text) => text,
            // A multi-byte character cut at the size cap: keep what precedes it.
            Err(e) if e.utf8_error().error_len().is_none() => {
                let valid = e.utf8_error().valid_up_to();
                let mut bytes = e.into_bytes();
                bytes.truncate(valid);
                String::from_utf8(bytes).unwrap_or_default()
            }
            Err(_) => {
                self.notes.push(unusable(path, "not UTF-8 text"));
                return None;
            }
        };
        if text.contains('\0') {
            self.notes.push(unusable(path, "binary data (NUL bytes)"));
            return None;
        }
        Some(text)
    }

    fn proc(&mut self, rel: &str) -> Option<String> {
        self.text(&self.roots.proc(rel))
    }

    fn sys(&mut self, rel: &str) -> Option<String> {
        self.text(&self.roots.sys(rel))
    }

    /// Names in a directory; `None` when it is missing or unreadable (noted).
    fn dir(&mut self, path: &Path) -> Option<Vec<String>> {
        match std::fs::read_dir(path) {
            Ok(entries) => Some(
                entries
                    .filter_map(|e| e.ok())
                    .filter_map(|e| e.file_name().into_string().ok())
                    .collect(),
            ),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
            Err(e) => {
                self.notes.push(unusable(path, e.to_string()));
                None
            }
        }
    }
}

/// A label value from free text: its first line, printable ASCII only,
/// whitespace collapsed, at most 64 characters; `unknown` when nothing is left.
pub fn label(text: &str) -> String {
    let line = text.lines().next().unwrap_or("");
    let cleaned: String = line
        .chars()
        .map(|c| if c.is_ascii_graphic() { c } else { ' ' })
        .collect();
    let mut out = cleaned.split_whitespace().collect::<Vec<_>>().join(" ");
    if out.len() > MAX_LABEL_CHARS {
        out.truncate(MAX_LABEL_CHARS);
        out.truncate(out.trim_end().len());
    }
    if out.is_empty() {
        "unknown".into()
    } else {
        out
    }
}

/// DMI strings firmware vendors leave unfilled.
const DMI_PLACEHOLDERS: &[&str] = &[
    "to be filled by o.e.m.",
    "to be filled by oem",
    "system manufacturer",
    "system product name",
    "system version",
    "default string",
    "not specified",
    "not applicable",
    "none",
    "o.e.m.",
    "oem",
    "unknown",
    "0123456789",
    "type1productconfigid",
];

/// The DMI strings this collector reads, each `None` when missing or a placeholder.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct Dmi {
    sys_vendor: Option<String>,
    product_name: Option<String>,
    board_vendor: Option<String>,
    board_name: Option<String>,
    bios_vendor: Option<String>,
    bios_version: Option<String>,
    chassis_asset_tag: Option<String>,
}

impl Dmi {
    fn read(reader: &mut Reader) -> Dmi {
        let mut get = |name: &str| {
            let text = reader.sys(&format!("class/dmi/id/{name}"))?;
            let value = label(&text);
            let lower = value.to_ascii_lowercase();
            (value != "unknown" && !DMI_PLACEHOLDERS.contains(&lower.as_str())).then_some(value)
        };
        Dmi {
            sys_vendor: get("sys_vendor"),
            product_name: get("product_name"),
            board_vendor: get("board_vendor"),
            board_name: get("board_name"),
            bios_vendor: get("bios_vendor"),
            bios_version: get("bios_version"),
            chassis_asset_tag: get("chassis_asset_tag"),
        }
    }

    fn is_empty(&self) -> bool {
        *self == Dmi::default()
    }

    fn fields(&self) -> [(&'static str, Option<&str>); 7] {
        [
            ("sys_vendor", self.sys_vendor.as_deref()),
            ("product_name", self.product_name.as_deref()),
            ("board_vendor", self.board_vendor.as_deref()),
            ("board_name", self.board_name.as_deref()),
            ("bios_vendor", self.bios_vendor.as_deref()),
            ("bios_version", self.bios_version.as_deref()),
            ("chassis_asset_tag", self.chassis_asset_tag.as_deref()),
        ]
    }

    /// Whether any vendor string contains `needle`, case-insensitively.
    fn vendor_has(&self, needle: &str) -> bool {
        let needle = needle.to_ascii_lowercase();
        [&self.sys_vendor, &self.board_vendor, &self.bios_vendor]
            .into_iter()
            .flatten()
            .any(|v| v.to_ascii_lowercase().contains(&needle))
    }

    fn product_has(&self, needle: &str) -> bool {
        let needle = needle.to_ascii_lowercase();
        self.product_name
            .as_deref()
            .is_some_and(|p| p.to_ascii_lowercase().contains(&needle))
    }

    /// A bare-metal cloud instance (`p4d.metal`, `c5n.metal`).
    fn is_metal_instance(&self) -> bool {
        self.product_name
            .as_deref()
            .is_some_and(|p| p.ends_with(".metal") || p.contains(".metal-"))
    }

    /// The hypervisor DMI names, if it names one: the sign that a node is a VM
    /// even when CPUID hides it.
    fn hypervisor(&self) -> Option<&'static str> {
        if self.vendor_has("qemu") || self.product_has("qemu") {
            Some("qemu")
        } else if self.vendor_has("vmware") || self.product_has("vmware") {
            Some("vmware")
        } else if self.vendor_has("microsoft") && self.product_has("virtual machine") {
            Some("hyperv")
        } else if self.vendor_has("xen") || self.product_has("hvm domu") {
            Some("xen")
        } else if self.vendor_has("innotek") || self.product_has("virtualbox") {
            Some("virtualbox")
        } else if self.vendor_has("parallels") {
            Some("parallels")
        } else if self.vendor_has("bhyve") {
            Some("bhyve")
        } else if self.product_has("google compute engine")
            || self.product_has("kvm")
            || self.product_has("openstack")
        {
            Some("kvm")
        } else if self.vendor_has("amazon ec2") && !self.is_metal_instance() {
            // Nitro: a KVM-based hypervisor; `.metal` instances have none.
            Some("kvm")
        } else {
            None
        }
    }

    /// The cloud DMI names: `aws`, `gcp`, `azure`, ...; `none` when DMI names
    /// none, `unknown` without DMI.
    fn cloud(&self) -> &'static str {
        let tag = self.chassis_asset_tag.as_deref().unwrap_or("");
        if self.vendor_has("amazon ec2")
            || self
                .bios_version
                .as_deref()
                .is_some_and(|v| v.to_ascii_lowercase().contains("amazon"))
        {
            "aws"
        } else if self.vendor_has("google") || self.product_has("google compute engine") {
            "gcp"
        } else if tag == "7783-7084-3265-9085-8269-3286-77" {
            "azure"
        } else if tag == "OracleCloud.com" {
            "oci"
        } else if self.vendor_has("alibaba") {
            "alibaba"
        } else if self.vendor_has("openstack") || self.product_has("openstack") {
            "openstack"
        } else if self.vendor_has("digitalocean") {
            "digitalocean"
        } else if self.vendor_has("hetzner") {
            "hetzner"
        } else if self.is_empty() {
            "unknown"
        } else {
            "none"
        }
    }

    /// A short product name: vendor and product, legal suffixes and
    /// parenthesised details dropped ("QEMU Standard PC", "Dell PowerEdge XE9680").
    fn product(&self) -> String {
        fn strip_parens(s: &str) -> String {
            let mut out = String::new();
            let mut depth = 0usize;
            for c in s.chars() {
                match c {
                    '(' => depth += 1,
                    ')' => depth = depth.saturating_sub(1),
                    c if depth == 0 => out.push(c),
                    _ => {}
                }
            }
            out.split_whitespace().collect::<Vec<_>>().join(" ")
        }
        fn short_vendor(v: &str) -> String {
            let mut v = strip_parens(v);
            for suffix in [
                ", Inc.",
                " Inc.",
                ", Inc",
                " Inc",
                " Corporation",
                " Corp.",
                " Co., Ltd.",
                " Co.,Ltd.",
                " Ltd.",
                " GmbH",
                " LLC",
                " Computer",
            ] {
                if let Some(s) = v.strip_suffix(suffix) {
                    v = s.trim_end_matches(',').trim().to_string();
                }
            }
            match v.as_str() {
                "Hewlett Packard Enterprise" => "HPE".into(),
                "Super Micro" => "Supermicro".into(),
                _ => v,
            }
        }
        let vendor = self
            .sys_vendor
            .as_deref()
            .or(self.board_vendor.as_deref())
            .map(short_vendor)
            .filter(|v| !v.is_empty());
        let product = self
            .product_name
            .as_deref()
            .or(self.board_name.as_deref())
            .map(strip_parens)
            .filter(|p| !p.is_empty());
        let joined = match (vendor, product) {
            (Some(v), Some(p)) => {
                let first = v
                    .split_whitespace()
                    .next()
                    .unwrap_or(&v)
                    .to_ascii_lowercase();
                if p.to_ascii_lowercase().starts_with(&first) {
                    p
                } else {
                    format!("{v} {p}")
                }
            }
            (Some(v), None) => v,
            (None, Some(p)) => p,
            (None, None) => return "unknown".into(),
        };
        label(&joined)
    }
}

/// What `/proc/cpuinfo` says.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct CpuInfo {
    /// Logical CPUs: `processor` lines.
    cpus: Option<i64>,
    /// The first `model name`, shortened.
    model: Option<String>,
    /// Whether the first `flags` line has `hypervisor`; `None` without one.
    hypervisor_flag: Option<bool>,
}

fn parse_cpuinfo(text: &str) -> CpuInfo {
    let mut info = CpuInfo::default();
    let mut cpus = 0i64;
    for line in text.lines() {
        let Some((key, value)) = line.split_once(':') else {
            continue;
        };
        match key.trim() {
            "processor" => cpus += 1,
            "model name" if info.model.is_none() => info.model = Some(short_cpu_model(value)),
            "flags" if info.hypervisor_flag.is_none() => {
                info.hypervisor_flag = Some(value.split_whitespace().any(|f| f == "hypervisor"))
            }
            _ => {}
        }
    }
    info.cpus = (cpus > 0).then_some(cpus);
    info.model = info.model.filter(|m| m != "unknown");
    info
}

/// "Intel(R) Xeon(R) Platinum 8480+ CPU @ 2.0GHz" -> "Intel Xeon Platinum 8480+".
fn short_cpu_model(model: &str) -> String {
    let mut m = model.to_string();
    for mark in ["(R)", "(r)", "(TM)", "(tm)"] {
        m = m.replace(mark, "");
    }
    if let Some(at) = m.find(" @ ") {
        m.truncate(at);
    }
    let words: Vec<&str> = m.split_whitespace().collect();
    let words = match words.as_slice() {
        [rest @ .., "CPU" | "Processor"] if !rest.is_empty() => rest,
        all => all,
    };
    label(&words.join(" "))
}

/// The IOMMU settings on the kernel command line, in order.
fn iommu_cmdline(cmdline: &str) -> Vec<String> {
    cmdline
        .split_whitespace()
        .take_while(|w| *w != "--") // what follows `--` is init's
        .filter(|w| {
            let key = w.split('=').next().unwrap_or("");
            matches!(
                key,
                "intel_iommu" | "amd_iommu" | "iommu" | "iommu.passthrough" | "iommu.strict"
            )
        })
        .map(String::from)
        .collect()
}

/// The NVIDIA driver version from `/proc/driver/nvidia/version`
/// ("NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.54.15  ...").
fn nvidia_version(text: &str) -> Option<String> {
    let line = text.lines().find(|l| l.starts_with("NVRM version:"))?;
    line.split_whitespace()
        .find(|w| {
            w.starts_with(|c: char| c.is_ascii_digit())
                && w.contains('.')
                && w.chars().all(|c| c.is_ascii_digit() || c == '.')
        })
        .map(String::from)
}

/// Everything one read learned.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Facts {
    /// `vm`, `none` or `unknown`.
    pub virtualization: &'static str,
    /// `kvm`, `hyperv`, `vmware`, `xen`, `tcg`, ...; `none` on bare metal;
    /// `unknown`; `other` for a CPUID signature not in the list.
    pub hypervisor: String,
    /// `aws`, `gcp`, `azure`, ...; `none`; `unknown` without DMI.
    pub cloud: &'static str,
    /// Vendor and product from DMI, or `unknown`.
    pub product: String,
    /// Kernel release, or `unknown`.
    pub kernel: String,
    /// `on` (DMA translation), `pt` (passthrough), `off` (no groups), `unknown`.
    pub iommu: &'static str,
    /// IOMMU groups under `<sysfs>/kernel/iommu_groups`.
    pub iommu_groups: Option<i64>,
    /// IOMMU settings on the kernel command line.
    pub iommu_cmdline: Vec<String>,
    /// Whether the command line was read.
    pub cmdline_read: bool,
    /// `nvidia_peermem`, `nv_peer_mem`, `none`, or `unknown` when modules cannot be listed.
    pub gpudirect_rdma: &'static str,
    /// `nvidia_fs` (GPUDirect Storage), `none`, or `unknown` when modules cannot be listed.
    pub gpudirect_storage: &'static str,
    /// Whether the `nvidia` module is loaded; `None` when modules cannot be listed.
    pub nvidia_loaded: Option<bool>,
    /// The NVIDIA driver version, `none` when the driver is not loaded, or `unknown`.
    pub nvidia_driver: String,
    /// GPUs the NVIDIA driver drives (`<procfs>/driver/nvidia/gpus/*`).
    pub nvidia_gpus: Option<i64>,
    /// CPU model, shortened, or `unknown`.
    pub cpu_model: String,
    /// Logical CPUs.
    pub cpus: Option<i64>,
    /// NUMA nodes.
    pub numa_nodes: Option<i64>,
    /// NICs and NVMe drives near each GPU; empty without GPUs or PCI in sysfs.
    pub gpu_affinity: Vec<Affinity>,
    /// How the verdict was reached: one line per source.
    pub evidence: Vec<String>,
    /// Files that exist but could not be used: each fact they give is
    /// unknown, the others are read.
    pub unreadable: Vec<ParseError>,
    /// CPUID and cpuinfo disagree about a hypervisor, in words.
    pub disagreement: Option<String>,
}

/// Reads every fact under `roots`, with CPUID from `cpuid`.
pub fn read_facts(roots: &Roots, cpuid: &dyn CpuidSource) -> Facts {
    let mut reader = Reader {
        roots,
        notes: Vec::new(),
    };
    let mut evidence = Vec::new();
    let procfs = roots.procfs.display().to_string();
    let sysfs = roots.sysfs.display().to_string();

    // Virtualisation: every source, each a line of evidence.
    let cpu = read_cpuid(cpuid, &mut evidence);
    let cpuinfo = reader
        .proc("cpuinfo")
        .map(|t| parse_cpuinfo(&t))
        .unwrap_or_default();
    evidence.push(match cpuinfo.hypervisor_flag {
        Some(true) => format!("{procfs}/cpuinfo flags: hypervisor"),
        Some(false) => format!("{procfs}/cpuinfo flags: no hypervisor flag"),
        None => format!("{procfs}/cpuinfo: no flags line"),
    });
    let dmi = Dmi::read(&mut reader);
    let dmi_hypervisor = dmi.hypervisor();
    if dmi.is_empty() {
        evidence.push(format!("{sysfs}/class/dmi/id: absent"));
    } else {
        let said: Vec<String> = dmi
            .fields()
            .iter()
            .filter_map(|(k, v)| v.map(|v| format!("{k}={v:?}")))
            .collect();
        evidence.push(format!(
            "{sysfs}/class/dmi/id: {} ({})",
            said.join(" "),
            match dmi_hypervisor {
                Some(h) => format!("names hypervisor {h}"),
                None => "names no hypervisor".into(),
            }
        ));
    }
    let sys_hypervisor = reader
        .sys("hypervisor/type")
        .map(|t| label(&t).to_ascii_lowercase())
        .filter(|t| t != "unknown");
    evidence.push(match &sys_hypervisor {
        Some(t) => format!("{sysfs}/hypervisor/type: {t}"),
        None => format!("{sysfs}/hypervisor/type: absent"),
    });

    let positive = cpu.hypervisor_bit == Some(true)
        || cpuinfo.hypervisor_flag == Some(true)
        || dmi_hypervisor.is_some()
        || sys_hypervisor.is_some();
    let negative = cpu.hypervisor_bit == Some(false) || cpuinfo.hypervisor_flag == Some(false);
    // The kernel sets the flag from the same CPUID bit: when they differ, the
    // procfs read is not this machine's (a fixture, another node's copy).
    let disagreement = match (cpu.hypervisor_bit, cpuinfo.hypervisor_flag) {
        (Some(bit), Some(flag)) if bit != flag => Some(format!(
            "CPUID's hypervisor bit is {} but {procfs}/cpuinfo {} the hypervisor flag: \
             is {procfs} this machine's? (any sign of a hypervisor makes a vm)",
            if bit { "set" } else { "clear" },
            if flag { "has" } else { "lacks" },
        )),
        _ => None,
    };
    let (virtualization, hypervisor) = if positive {
        let name = cpu
            .hypervisor
            .filter(|h| *h != "unknown")
            .map(String::from)
            .or_else(|| sys_hypervisor.clone())
            .or_else(|| dmi_hypervisor.map(String::from))
            .unwrap_or_else(|| "unknown".into());
        ("vm", label(&name))
    } else if negative {
        ("none", "none".to_string())
    } else {
        ("unknown", "unknown".to_string())
    };

    let kernel = reader
        .proc("sys/kernel/osrelease")
        .map(|t| label(&t))
        .unwrap_or_else(|| "unknown".into());

    // IOMMU: groups are the truth; their `type` says translated or identity.
    let groups_dir = roots.sys("kernel/iommu_groups");
    let groups: Option<Vec<String>> = reader.dir(&groups_dir).map(|names| {
        names
            .into_iter()
            .filter(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
            .collect()
    });
    let cmdline = reader.proc("cmdline");
    let cmdline_read = cmdline.is_some();
    let iommu_cmdline = cmdline.as_deref().map(iommu_cmdline).unwrap_or_default();
    let cmdline_pt = iommu_cmdline
        .iter()
        .any(|w| w == "iommu=pt" || w == "iommu.passthrough=1" || w == "iommu.passthrough=on");
    let iommu = match &groups {
        None => "unknown",
        Some(g) if g.is_empty() => "off",
        Some(g) => {
            let mut types = HashSet::new();
            for group in g {
                if let Some(t) = reader.sys(&format!("kernel/iommu_groups/{group}/type")) {
                    types.insert(t.trim().to_string());
                }
            }
            if types.contains("identity") {
                "pt"
            } else if !types.is_empty() || !cmdline_pt {
                "on"
            } else {
                "pt"
            }
        }
    };
    let iommu_groups = groups.as_ref().map(|g| g.len() as i64);

    // Modules: /proc/modules lists loadable ones, /sys/module built-in ones too.
    let modules: Option<HashSet<String>> = reader.proc("modules").map(|t| {
        t.lines()
            .filter_map(|l| l.split_whitespace().next())
            .map(String::from)
            .collect()
    });
    let sys_module_readable = roots.sys("module").is_dir();
    evidence.push(format!(
        "modules: {procfs}/modules {}, {sysfs}/module {}",
        if modules.is_some() { "read" } else { "absent" },
        if sys_module_readable {
            "read"
        } else {
            "absent"
        },
    ));
    let modules_known = modules.is_some() || sys_module_readable;
    let loaded = |name: &str| {
        modules.as_ref().is_some_and(|m| m.contains(name))
            || roots.sys(format!("module/{name}")).is_dir()
    };
    let gpudirect_rdma = if loaded("nvidia_peermem") {
        "nvidia_peermem"
    } else if loaded("nv_peer_mem") {
        "nv_peer_mem"
    } else if modules_known {
        "none"
    } else {
        "unknown"
    };
    let gpudirect_storage = if loaded("nvidia_fs") {
        "nvidia_fs"
    } else if modules_known {
        "none"
    } else {
        "unknown"
    };
    let nvidia_loaded = if loaded("nvidia") {
        Some(true)
    } else if modules_known {
        Some(false)
    } else {
        None
    };
    let version_path = roots.proc("driver/nvidia/version");
    let version_text = reader.text(&version_path);
    let nvidia_driver = match (&version_text, nvidia_loaded) {
        (Some(text), _) => match nvidia_version(text) {
            Some(v) => label(&v),
            None => {
                reader
                    .notes
                    .push(unusable(&version_path, "no NVRM version line"));
                "unknown".into()
            }
        },
        (None, Some(false)) => "none".into(),
        (None, _) => "unknown".into(),
    };
    let nvidia_gpus = reader
        .dir(&roots.proc("driver/nvidia/gpus"))
        .map(|g| g.len() as i64);

    let numa_nodes = reader.dir(&roots.sys("devices/system/node")).map(|names| {
        names
            .iter()
            .filter(|n| {
                n.strip_prefix("node")
                    .is_some_and(|d| !d.is_empty() && d.bytes().all(|b| b.is_ascii_digit()))
            })
            .count() as i64
    });

    // A junk `vendor` or `class` file hides a GPU from the affinity rows:
    // named, as any other file this pass could not use.
    let affinity = gpu_affinity(&roots.sysfs).unwrap_or_default();
    for (path, reason) in &affinity.unusable {
        reader.notes.push(unusable(path, reason.clone()));
    }
    Facts {
        virtualization,
        hypervisor,
        cloud: dmi.cloud(),
        product: dmi.product(),
        kernel,
        iommu,
        iommu_groups,
        iommu_cmdline,
        cmdline_read,
        gpudirect_rdma,
        gpudirect_storage,
        nvidia_loaded,
        nvidia_driver,
        nvidia_gpus,
        cpu_model: cpuinfo.model.unwrap_or_else(|| "unknown".into()),
        cpus: cpuinfo.cpus,
        numa_nodes,
        gpu_affinity: affinity.rows,
        evidence,
        unreadable: reader.notes,
        disagreement,
    }
}

/// How a hypervisor label reads in a sentence.
fn hypervisor_display(label: &str) -> &str {
    match label {
        "kvm" => "KVM",
        "hyperv" => "Hyper-V",
        "vmware" => "VMware",
        "xen" => "Xen",
        "tcg" => "QEMU TCG (emulated)",
        "qemu" => "QEMU",
        "parallels" => "Parallels",
        "acrn" => "ACRN",
        "bhyve" => "bhyve",
        "virtualbox" => "VirtualBox",
        "qnx" => "QNX",
        other => other,
    }
}

/// The host in words, bare metal or a virtual machine and by what, from
/// the `platform_host` labels: "KVM virtual machine (QEMU Standard PC)".
pub fn host_words(virtualization: &str, hypervisor: &str, product: &str, cloud: &str) -> String {
    let what = match virtualization {
        "vm" => match hypervisor {
            "unknown" | "other" => "virtual machine".to_string(),
            h => format!("{} virtual machine", hypervisor_display(h)),
        },
        "none" => "bare metal".to_string(),
        _ => "virtualization unknown".to_string(),
    };
    let mut detail = Vec::new();
    if product != "unknown" {
        detail.push(product);
    }
    if !matches!(cloud, "none" | "unknown") {
        detail.push(cloud);
    }
    if detail.is_empty() {
        what
    } else {
        format!("{what} ({})", detail.join(", "))
    }
}

impl Facts {
    /// The host in words: "KVM virtual machine (QEMU Standard PC)". The
    /// platform verdict, with the GPUs, is `detect::verdict`'s.
    pub fn host(&self) -> String {
        host_words(
            self.virtualization,
            &self.hypervisor,
            &self.product,
            self.cloud,
        )
    }

    /// One line for `vtax doctor` and the probe.
    pub fn summary(&self) -> String {
        let iommu = match self.iommu {
            "on" => "IOMMU on".to_string(),
            "pt" => "IOMMU on (passthrough)".to_string(),
            "off" => "IOMMU off".to_string(),
            _ => "IOMMU unknown".to_string(),
        };
        let nvidia = match self.nvidia_driver.as_str() {
            "none" => None,
            "unknown" if self.nvidia_loaded != Some(true) => None,
            v => Some(format!("NVIDIA driver {v}")),
        };
        let rdma = match self.gpudirect_rdma {
            "none" => "no GPUDirect RDMA".to_string(),
            "unknown" => "GPUDirect RDMA unknown".to_string(),
            m => format!("GPUDirect RDMA ({m})"),
        };
        let mut parts = vec![self.host(), format!("kernel {}", self.kernel), iommu];
        parts.extend(nvidia);
        parts.push(rdma);
        if self.gpudirect_storage == "nvidia_fs" {
            parts.push("GPUDirect Storage (nvidia_fs)".to_string());
        }
        parts.join(", ")
    }

    /// What an operator should know, in order of weight.
    pub fn problems(&self) -> Vec<String> {
        let mut out = Vec::new();
        match (self.virtualization, self.hypervisor.as_str()) {
            ("vm", "tcg") => out.push(
                "virtual machine under QEMU TCG: every instruction is emulated; expect a very large virtualization tax"
                    .to_string(),
            ),
            ("vm", h) => out.push(format!(
                "virtual machine ({h}): expect a virtualization tax; GPUs and HCAs reach it only by passthrough, which needs the host's IOMMU"
            )),
            _ => {}
        }
        if self.nvidia_loaded == Some(true) && self.gpudirect_rdma == "none" {
            out.push(
                "nvidia loaded without nvidia_peermem: GPUDirect RDMA off (unless the application uses DMA-BUF)"
                    .to_string(),
            );
        }
        let asked_on = self
            .iommu_cmdline
            .iter()
            .find(|w| *w == "intel_iommu=on" || *w == "amd_iommu=on");
        if let (Some(asked), "off") = (asked_on, self.iommu) {
            out.push(format!(
                "{asked} on the kernel command line but no IOMMU groups: VT-d/AMD-Vi is off in firmware or absent"
            ));
        }
        if self.virtualization == "none" && self.iommu == "on" && self.nvidia_loaded == Some(true) {
            out.push(
                "IOMMU translates DMA (not iommu=pt): GPU peer-to-peer and GPUDirect RDMA pay for it; boot with iommu=pt"
                    .to_string(),
            );
        }
        let mut gpus: Vec<&str> = self.gpu_affinity.iter().map(|a| a.gpu.as_str()).collect();
        gpus.dedup();
        for gpu in gpus {
            let rdma: Vec<&Affinity> = self
                .gpu_affinity
                .iter()
                .filter(|a| a.gpu == gpu && a.peer_kind == "rdma")
                .collect();
            if !rdma.is_empty() && !rdma.iter().any(|a| a.same_switch) {
                let names: Vec<&str> = rdma.iter().map(|a| a.peer.as_str()).collect();
                out.push(format!(
                    "GPU {gpu} shares no PCIe switch with an RDMA device (on its NUMA node: {}): GPUDirect RDMA between them crosses the CPU's root complex",
                    names.join(" ")
                ));
            }
        }
        if self.nvidia_loaded == Some(true) && self.nvidia_driver == "unknown" {
            out.push("nvidia loaded but its version file is unreadable".to_string());
        }
        out.extend(self.disagreement.iter().cloned());
        out
    }

    /// The `platform_host` row: the facts as tags, and 1.
    fn row(&self) -> PlatformHostRow<'_> {
        PlatformHostRow {
            virtualization: self.virtualization,
            hypervisor: &self.hypervisor,
            cloud: self.cloud,
            product: &self.product,
            kernel: &self.kernel,
            iommu: self.iommu,
            gpudirect_rdma: self.gpudirect_rdma,
            gpudirect_storage: self.gpudirect_storage,
            nvidia_driver: &self.nvidia_driver,
            cpu_model: &self.cpu_model,
            info: 1,
        }
    }
}

/// The platform collector.
pub struct Platform {
    roots: Roots,
    cpuid: Box<dyn CpuidSource>,
    problems: Vec<String>,
    /// Files that could not be used at the last read.
    errors: Vec<ParseError>,
}

impl Platform {
    /// A platform collector reading under `roots`, CPUID from this CPU.
    pub fn new(config: &PlatformConfig, roots: &Roots) -> Self {
        Platform::with_cpuid(config, roots, Box::new(HostCpuid))
    }

    /// A platform collector with CPUID from `cpuid` (tests inject fixed answers).
    pub fn with_cpuid(
        _config: &PlatformConfig,
        roots: &Roots,
        cpuid: Box<dyn CpuidSource>,
    ) -> Self {
        Platform {
            roots: roots.clone(),
            cpuid,
            problems: Vec::new(),
            errors: Vec::new(),
        }
    }

    fn procfs_readable(&self) -> anyhow::Result<()> {
        std::fs::read_dir(&self.roots.procfs)
            .map(|_| ())
            .map_err(|e| anyhow::anyhow!("{}: {e}", self.roots.procfs.display()))
    }

    /// Reads every fact once.
    pub fn facts(&self) -> Facts {
        read_facts(&self.roots, self.cpuid.as_ref())
    }
}

impl Collector for Platform {
    fn name(&self) -> &'static str {
        "platform"
    }

    fn probe(&mut self) -> Availability {
        if let Err(e) = self.procfs_readable() {
            return Availability::Absent(e.to_string());
        }
        Availability::Available(self.facts().summary())
    }

    fn collect(&mut self, time_us: i64) -> anyhow::Result<Vec<Batch>> {
        self.errors.clear();
        self.procfs_readable()?;
        let facts = self.facts();
        self.problems = facts.problems();
        self.errors.clone_from(&facts.unreadable);
        let mut info = BatchBuilder::new(&PLATFORM);
        info.push_row(time_us, &facts.row())?;
        let mut topology = BatchBuilder::new(&PLATFORM_TOPOLOGY);
        topology.push_row(
            time_us,
            &PlatformTopologyRow {
                cpus: facts.cpus,
                numa_nodes: facts.numa_nodes,
                iommu_groups: facts.iommu_groups,
                nvidia_gpus: facts.nvidia_gpus,
            },
        )?;
        let mut batches = vec![info.finish(), topology.finish()];
        if !facts.gpu_affinity.is_empty() {
            let mut near = BatchBuilder::new(&PLATFORM_GPU_AFFINITY);
            for a in &facts.gpu_affinity {
                near.push_row(
                    time_us,
                    &GpuAffinityRow {
                        gpu_pci_address: &a.gpu,
                        peer: &a.peer,
                        peer_kind: a.peer_kind,
                        peer_pci_address: &a.peer_pci_address,
                        same_pcie_switch: i64::from(a.same_switch),
                        same_numa_node: i64::from(a.same_numa_node),
                    },
                )?;
            }
            batches.push(near.finish());
        }
        Ok(batches)
    }

    fn problems(&self) -> Vec<String> {
        self.problems.clone()
    }

    fn source_errors(&self) -> Vec<ParseError> {
        self.errors.clone()
    }
}

/// The doctor's host details under the platform verdict: kernel, IOMMU and
/// drivers, the CPU, the evidence of virtualization, and what is near each GPU.
pub fn doctor_lines(roots: &Roots) -> Vec<String> {
    let facts = read_facts(roots, &HostCpuid);
    let mut lines = vec![
        format!(
            "kernel {}, IOMMU {} ({} groups; command line: {}), GPUDirect RDMA {}, GPUDirect Storage {}, NVIDIA driver {}",
            facts.kernel,
            facts.iommu,
            facts
                .iommu_groups
                .map_or("unknown".to_string(), |g| g.to_string()),
            if facts.iommu_cmdline.is_empty() {
                "no IOMMU settings".to_string()
            } else {
                facts.iommu_cmdline.join(" ")
            },
            facts.gpudirect_rdma,
            facts.gpudirect_storage,
            facts.nvidia_driver
        ),
        format!(
            "CPU {:?}: {} logical CPUs, NUMA nodes: {}",
            facts.cpu_model,
            facts.cpus.map_or("unknown".to_string(), |c| c.to_string()),
            facts
                .numa_nodes
                .map_or("unknown".to_string(), |n| n.to_string())
        ),
        "evidence:".to_string(),
    ];
    lines.extend(facts.evidence.iter().map(|e| format!("  {e}")));
    let mut gpus: Vec<&str> = facts.gpu_affinity.iter().map(|a| a.gpu.as_str()).collect();
    gpus.dedup();
    for gpu in gpus {
        let near = |pick: fn(&Affinity) -> bool| {
            let names: Vec<&str> = facts
                .gpu_affinity
                .iter()
                .filter(|a| a.gpu == gpu && pick(a))
                .map(|a| a.peer.as_str())
                .collect();
            if names.is_empty() {
                "none".to_string()
            } else {
                names.join(" ")
            }
        };
        lines.push(format!(
            "GPU {gpu}: same PCIe switch: {}; same NUMA node only: {}",
            near(|a| a.same_switch),
            near(|a| !a.same_switch)
        ));
    }
    lines
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

#[cfg(test)]
mod tests {
    use std::collections::HashMap;
    use std::path::PathBuf;

    use super::*;
    use vtax_store::batch::Values;

    /// CPUID answers fixed by the test.
    #[derive(Clone, Default)]
    struct FixedCpuid(HashMap<u32, CpuidRegs>);

    impl CpuidSource for FixedCpuid {
        fn cpuid(&self, leaf: u32) -> Option<CpuidRegs> {
            if self.0.is_empty() {
                return None; // no CPUID at all: another architecture
            }
            Some(self.0.get(&leaf).copied().unwrap_or_default())
        }
    }

    fn signature_regs(max_leaf: u32, sig: &[u8; 12]) -> CpuidRegs {
        let word = |i: usize| u32::from_le_bytes(sig[i..i + 4].try_into().unwrap());
        CpuidRegs {
            eax: max_leaf,
            ebx: word(0),
            ecx: word(4),
            edx: word(8),
        }
    }

    impl FixedCpuid {
        /// An x86_64 CPU with no hypervisor.
        fn bare_metal() -> Self {
            let mut m = HashMap::new();
            m.insert(1, CpuidRegs::default());
            FixedCpuid(m)
        }

        /// A guest of the hypervisor whose leaf 0x40000000 signature is `sig`.
        fn guest(sig: &[u8; 12]) -> Self {
            let mut m = HashMap::new();
            m.insert(
                1,
                CpuidRegs {
                    ecx: 1 << 31,
                    ..CpuidRegs::default()
                },
            );
            m.insert(HYPERVISOR_LEAF, signature_regs(0x4000_0001, sig));
            FixedCpuid(m)
        }

        /// Not x86_64.
        fn absent() -> Self {
            FixedCpuid::default()
        }
    }

    fn fixture(name: &str) -> Roots {
        let base = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("../tests/fixtures")
            .join(name);
        Roots {
            procfs: base.join("proc"),
            sysfs: base.join("sys"),
            ..Roots::default()
        }
    }

    /// A tree of files (paths start with `proc/` or `sys/`); `proc/` always exists.
    fn tree(files: &[(&str, &[u8])]) -> (tempfile::TempDir, Roots) {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("proc")).unwrap();
        std::fs::create_dir_all(dir.path().join("sys")).unwrap();
        for (path, bytes) in files {
            let path = dir.path().join(path);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(path, bytes).unwrap();
        }
        let roots = Roots {
            procfs: dir.path().join("proc"),
            sysfs: dir.path().join("sys"),
            ..Roots::default()
        };
        (dir, roots)
    }

    fn tag_values(batch: &Batch) -> Vec<(&'static str, String)> {
        batch
            .table
            .tags
            .iter()
            .zip(&batch.tags)
            .map(|(def, col)| (def.name, col.dict[col.codes[0] as usize].clone()))
            .collect()
    }

    #[test]
    fn vm_node_is_a_kvm_guest_without_iommu_or_gpudirect() {
        let roots = fixture("vm-node");
        let facts = read_facts(&roots, &FixedCpuid::guest(b"KVMKVMKVM\0\0\0"));
        assert_eq!(facts.virtualization, "vm");
        assert_eq!(facts.hypervisor, "kvm");
        // This Firecracker VM has no DMI tables.
        assert_eq!(facts.product, "unknown");
        assert_eq!(facts.cloud, "unknown");
        assert_eq!(facts.kernel, "6.18.44-fc-v445");
        assert_eq!(facts.iommu, "off");
        assert_eq!(facts.iommu_groups, Some(0));
        assert_eq!(facts.gpudirect_rdma, "none");
        assert_eq!(facts.gpudirect_storage, "none");
        assert!(facts.gpu_affinity.is_empty(), "no GPU on this VM");
        assert_eq!(facts.nvidia_loaded, Some(false));
        assert_eq!(facts.nvidia_driver, "none");
        assert_eq!(facts.nvidia_gpus, None);
        assert_eq!(facts.cpu_model, "AMD EPYC");
        assert_eq!(facts.cpus, Some(2));
        assert_eq!(facts.numa_nodes, Some(1));
        assert!(facts.unreadable.is_empty(), "{:?}", facts.unreadable);
        assert_eq!(
            facts.summary(),
            "KVM virtual machine, kernel 6.18.44-fc-v445, IOMMU off, no GPUDirect RDMA"
        );
        let problems = facts.problems();
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert!(problems[0].starts_with("virtual machine (kvm): expect a virtualization tax"));
        assert!(facts
            .evidence
            .iter()
            .any(|e| e.ends_with("cpuinfo flags: hypervisor")));
    }

    #[test]
    fn the_cpuinfo_flag_alone_makes_a_vm_when_cpuid_is_hidden_or_absent() {
        let roots = fixture("vm-node");
        for cpuid in [FixedCpuid::bare_metal(), FixedCpuid::absent()] {
            let facts = read_facts(&roots, &cpuid);
            assert_eq!(facts.virtualization, "vm");
            assert_eq!(facts.hypervisor, "unknown");
            assert!(facts.summary().starts_with("virtual machine, kernel"));
        }
        // CPUID clear but the flag set: the procfs is not this CPU's, and the doctor says so.
        let facts = read_facts(&roots, &FixedCpuid::bare_metal());
        let said = facts.disagreement.as_deref().unwrap();
        assert!(
            said.starts_with("CPUID's hypervisor bit is clear but "),
            "{said}"
        );
        assert!(facts.problems().iter().any(|p| p == said));
        let agree = read_facts(&roots, &FixedCpuid::guest(b"KVMKVMKVM\0\0\0"));
        assert_eq!(agree.disagreement, None);
    }

    #[test]
    fn baremetal_node_has_everything_a_gpu_server_wants() {
        let roots = fixture("baremetal-node");
        let facts = read_facts(&roots, &FixedCpuid::bare_metal());
        assert_eq!(facts.virtualization, "none");
        assert_eq!(facts.hypervisor, "none");
        assert_eq!(facts.cloud, "none");
        assert_eq!(facts.product, "Supermicro SYS-821GE-TNHR");
        assert_eq!(facts.kernel, "5.15.0-105-generic");
        assert_eq!(facts.iommu, "pt");
        assert_eq!(facts.iommu_groups, Some(32));
        assert_eq!(facts.iommu_cmdline, ["intel_iommu=on", "iommu=pt"]);
        assert_eq!(facts.gpudirect_rdma, "nvidia_peermem");
        assert_eq!(facts.nvidia_loaded, Some(true));
        assert_eq!(facts.nvidia_driver, "535.161.08");
        assert_eq!(facts.nvidia_gpus, Some(8));
        assert_eq!(facts.cpu_model, "Intel Xeon Platinum 8468");
        assert_eq!(facts.cpus, Some(8));
        assert_eq!(facts.numa_nodes, Some(2));
        assert_eq!(
            facts.summary(),
            "bare metal (Supermicro SYS-821GE-TNHR), kernel 5.15.0-105-generic, \
             IOMMU on (passthrough), NVIDIA driver 535.161.08, GPUDirect RDMA (nvidia_peermem), \
             GPUDirect Storage (nvidia_fs)"
        );
        assert!(facts.problems().is_empty(), "{:?}", facts.problems());
    }

    #[test]
    fn collect_writes_the_info_row_and_the_counts() {
        let config = PlatformConfig::default();
        let mut platform = Platform::with_cpuid(
            &config,
            &fixture("baremetal-node"),
            Box::new(FixedCpuid::bare_metal()),
        );
        assert!(
            matches!(platform.probe(), Availability::Available(s) if s.starts_with("bare metal"))
        );
        let batches = platform.collect(42).unwrap();
        assert_eq!(batches.len(), 3);
        assert!(std::ptr::eq(batches[2].table, &PLATFORM_GPU_AFFINITY));
        assert_eq!(batches[2].len(), 64);
        let info = &batches[0];
        assert!(std::ptr::eq(info.table, &PLATFORM));
        assert_eq!(info.time_us, [42]);
        assert_eq!(info.fields[0].values, Values::I64(vec![1]));
        let tags = tag_values(info);
        let want = [
            ("virtualization", "none"),
            ("hypervisor", "none"),
            ("cloud", "none"),
            ("product", "Supermicro SYS-821GE-TNHR"),
            ("kernel", "5.15.0-105-generic"),
            ("iommu", "pt"),
            ("gpudirect_rdma", "nvidia_peermem"),
            ("gpudirect_storage", "nvidia_fs"),
            ("nvidia_driver", "535.161.08"),
            ("cpu_model", "Intel Xeon Platinum 8468"),
        ];
        assert_eq!(
            tags,
            want.map(|(k, v)| (k, v.to_string())).to_vec(),
            "tags in declaration order"
        );
        let counts = &batches[1];
        assert!(std::ptr::eq(counts.table, &PLATFORM_TOPOLOGY));
        let values: Vec<_> = counts.fields.iter().map(|f| f.values.clone()).collect();
        assert_eq!(values, [8, 2, 32, 8].map(|v| Values::I64(vec![v])).to_vec());
        assert!(platform.problems().is_empty());
        for table in TABLES {
            table.validate().unwrap();
            assert!(table.name.starts_with("platform"));
        }
        assert_eq!(
            PLATFORM.metric_name(&PLATFORM.fields[0]),
            "vtax_platform_host_info"
        );
    }

    /// One fixture file holding junk (issue 36, item 6): the tick succeeds,
    /// only the fact that file gives is unknown, every other tag and count is
    /// as read from the intact tree, and the file is named in
    /// `source_errors` (counted in `vtax_collector_failed_sources`) until it
    /// is mended.
    #[test]
    fn a_bad_file_costs_only_its_own_fact() {
        let read = |roots: &Roots| {
            let mut platform = Platform::with_cpuid(
                &PlatformConfig::default(),
                roots,
                Box::new(FixedCpuid::bare_metal()),
            );
            assert!(matches!(platform.probe(), Availability::Available(_)));
            let batches = platform.collect(1).unwrap();
            let counts: Vec<Option<Values>> = batches[1]
                .fields
                .iter()
                .map(|f| f.is_valid(0).then(|| f.values.clone()))
                .collect();
            (tag_values(&batches[0]), counts, batches[2].len(), platform)
        };
        let (intact_tags, intact_counts, intact_near, _) = read(&fixture("baremetal-node"));
        let junk: &[u8] = b"\x7fELF\x02\x01\x01\x00\x00\x00\xff\xfe\x00\x80";
        for (file, lost) in [
            ("proc/sys/kernel/osrelease", "kernel"),
            ("proc/cpuinfo", "cpu_model"),
            // The product name alone still names the product.
            ("sys/class/dmi/id/sys_vendor", ""),
            ("proc/driver/nvidia/version", "nvidia_driver"),
        ] {
            let dir = tempfile::tempdir().unwrap();
            crate::collectors::testutil::copy_tree(
                &crate::collectors::testutil::node("baremetal-node"),
                dir.path(),
            );
            let roots = crate::collectors::testutil::roots(dir.path());
            let path = dir.path().join(file);
            std::fs::write(&path, junk).unwrap();
            let (tags, counts, near, mut platform) = read(&roots);
            for ((name, was), (_, now)) in intact_tags.iter().zip(&tags) {
                if *name == lost {
                    assert_eq!(now, "unknown", "{file}: {name}");
                } else {
                    assert_eq!(now, was, "{file}: {name}");
                }
            }
            if file == "proc/cpuinfo" {
                // The CPU count comes from the same file.
                assert_eq!(counts[0], None, "{file}: no CPU count");
                assert_eq!(counts[1..], intact_counts[1..], "{file}");
            } else {
                assert_eq!(counts, intact_counts, "{file}");
            }
            assert_eq!(near, intact_near, "{file}");
            let errors: Vec<String> = platform
                .source_errors()
                .iter()
                .map(|e| e.to_string())
                .collect();
            assert_eq!(errors.len(), 1, "{file}: {errors:?}");
            assert!(
                errors[0].starts_with(&format!("{}: ", path.display())),
                "{file}: {errors:?}"
            );
            assert!(
                !platform.problems().iter().any(|p| p.contains(file)),
                "{file} named once: {:?}",
                platform.problems()
            );
            std::fs::copy(
                crate::collectors::testutil::node("baremetal-node").join(file),
                &path,
            )
            .unwrap();
            platform.collect(2).unwrap();
            assert!(platform.source_errors().is_empty(), "{file} mended");
        }
    }

    /// A GPU's junk `vendor` file: that GPU's affinity rows go (it is not
    /// known to be a GPU), the others stay, and the file is named.
    #[test]
    fn a_junk_gpu_vendor_file_is_named_and_costs_only_that_gpus_rows() {
        let dir = tempfile::tempdir().unwrap();
        crate::collectors::testutil::copy_tree(
            &crate::collectors::testutil::node("baremetal-node"),
            dir.path(),
        );
        let roots = crate::collectors::testutil::roots(dir.path());
        let gpu = dir.path().join("sys/bus/pci/devices/0000:18:00.0");
        let vendor = std::fs::canonicalize(gpu).unwrap().join("vendor");
        std::fs::write(&vendor, "nvidia?\n").unwrap();
        let mut platform = Platform::with_cpuid(
            &PlatformConfig::default(),
            &roots,
            Box::new(FixedCpuid::bare_metal()),
        );
        assert!(matches!(platform.probe(), Availability::Available(_)));
        let batches = platform.collect(1).unwrap();
        assert_eq!(batches[2].len(), 64 - 8, "the other 7 GPUs' 8 peers each");
        let errors: Vec<String> = platform
            .source_errors()
            .iter()
            .map(|e| e.to_string())
            .collect();
        assert_eq!(errors.len(), 1, "{errors:?}");
        assert!(
            errors[0].starts_with(&format!("{}: ", vendor.display()))
                && errors[0].contains("not a hexadecimal number"),
            "{errors:?}"
        );
    }

    #[test]
    fn every_hypervisor_vendor_signature() {
        let cases: &[(&[u8; 12], &str, &str)] = &[
            (b"KVMKVMKVM\0\0\0", "kvm", "KVM virtual machine"),
            (b"Microsoft Hv", "hyperv", "Hyper-V virtual machine"),
            (b"VMwareVMware", "vmware", "VMware virtual machine"),
            (b"XenVMMXenVMM", "xen", "Xen virtual machine"),
            (
                b"TCGTCGTCGTCG",
                "tcg",
                "QEMU TCG (emulated) virtual machine",
            ),
            (b" lrpepyh  vr", "parallels", "Parallels virtual machine"),
            (b"ACRNACRNACRN", "acrn", "ACRN virtual machine"),
            (b"bhyve bhyve ", "bhyve", "bhyve virtual machine"),
            (b"VBoxVBoxVBox", "virtualbox", "VirtualBox virtual machine"),
            (b"SomethingNew", "other", "virtual machine"),
            (b"\0\0\0\0\0\0\0\0\0\0\0\0", "unknown", "virtual machine"),
            (b"\xff\x01junk\x80\x00abcd", "other", "virtual machine"),
        ];
        let (_dir, roots) = tree(&[]);
        for (sig, label, verdict) in cases {
            let facts = read_facts(&roots, &FixedCpuid::guest(sig));
            assert_eq!(facts.virtualization, "vm", "{sig:?}");
            assert_eq!(facts.hypervisor, *label, "{sig:?}");
            assert_eq!(facts.host(), *verdict, "{sig:?}");
        }
        let tcg = read_facts(&roots, &FixedCpuid::guest(b"TCGTCGTCGTCG"));
        assert!(tcg.problems()[0].contains("emulated"));
    }

    #[test]
    fn kvm_offering_hyperv_interface_is_kvm() {
        let mut cpuid = FixedCpuid::guest(b"Microsoft Hv");
        cpuid.0.insert(
            HYPERVISOR_LEAF,
            signature_regs(0x4000_010b, b"Microsoft Hv"),
        );
        cpuid.0.insert(
            KVM_BEHIND_HYPERV_LEAF,
            signature_regs(0x4000_0101, b"KVMKVMKVM\0\0\0"),
        );
        let (_dir, roots) = tree(&[]);
        let facts = read_facts(&roots, &cpuid);
        assert_eq!(facts.hypervisor, "kvm");
        assert!(facts.evidence.iter().any(|e| e.contains("0x40000100")));
    }

    #[test]
    fn cloud_vms_and_metal_instances_from_dmi() {
        let azure: &[(&str, &[u8])] = &[
            ("sys/class/dmi/id/sys_vendor", b"Microsoft Corporation\n"),
            ("sys/class/dmi/id/product_name", b"Virtual Machine\n"),
            ("sys/class/dmi/id/bios_vendor", b"Microsoft Corporation\n"),
            (
                "sys/class/dmi/id/chassis_asset_tag",
                b"7783-7084-3265-9085-8269-3286-77\n",
            ),
        ];
        let (_a, roots) = tree(azure);
        let facts = read_facts(&roots, &FixedCpuid::guest(b"Microsoft Hv"));
        assert_eq!(
            (facts.virtualization, facts.hypervisor.as_str(), facts.cloud),
            ("vm", "hyperv", "azure")
        );
        assert_eq!(facts.product, "Microsoft Virtual Machine");
        assert_eq!(
            facts.host(),
            "Hyper-V virtual machine (Microsoft Virtual Machine, azure)"
        );

        let aws_vm: &[(&str, &[u8])] = &[
            ("sys/class/dmi/id/sys_vendor", b"Amazon EC2\n"),
            ("sys/class/dmi/id/product_name", b"p4d.24xlarge\n"),
            ("sys/class/dmi/id/bios_vendor", b"Amazon EC2\n"),
        ];
        let (_b, roots) = tree(aws_vm);
        // DMI alone, CPUID unavailable: still a VM.
        let facts = read_facts(&roots, &FixedCpuid::absent());
        assert_eq!(
            (facts.virtualization, facts.hypervisor.as_str(), facts.cloud),
            ("vm", "kvm", "aws")
        );
        assert_eq!(facts.product, "Amazon EC2 p4d.24xlarge");

        let aws_metal: &[(&str, &[u8])] = &[
            ("sys/class/dmi/id/sys_vendor", b"Amazon EC2\n"),
            ("sys/class/dmi/id/product_name", b"p4d.metal\n"),
        ];
        let (_c, roots) = tree(aws_metal);
        let facts = read_facts(&roots, &FixedCpuid::bare_metal());
        assert_eq!((facts.virtualization, facts.cloud), ("none", "aws"));

        let qemu: &[(&str, &[u8])] = &[
            ("sys/class/dmi/id/sys_vendor", b"QEMU\n"),
            (
                "sys/class/dmi/id/product_name",
                b"Standard PC (Q35 + ICH9, 2009)\n",
            ),
            ("sys/class/dmi/id/bios_vendor", b"SeaBIOS\n"),
        ];
        let (_d, roots) = tree(qemu);
        // A guest that hides the CPUID bit (for consumer GPU drivers) still has QEMU's DMI.
        let facts = read_facts(&roots, &FixedCpuid::bare_metal());
        assert_eq!(
            (facts.virtualization, facts.hypervisor.as_str()),
            ("vm", "qemu")
        );
        assert_eq!(facts.product, "QEMU Standard PC");
        assert_eq!(facts.cloud, "none");
        // With CPUID, its signature names the hypervisor.
        let facts = read_facts(&roots, &FixedCpuid::guest(b"KVMKVMKVM\0\0\0"));
        assert_eq!(facts.host(), "KVM virtual machine (QEMU Standard PC)");

        let gce: &[(&str, &[u8])] = &[
            ("sys/class/dmi/id/sys_vendor", b"Google\n"),
            ("sys/class/dmi/id/product_name", b"Google Compute Engine\n"),
        ];
        let (_e, roots) = tree(gce);
        let facts = read_facts(&roots, &FixedCpuid::guest(b"KVMKVMKVM\0\0\0"));
        assert_eq!(facts.product, "Google Compute Engine");
        assert_eq!(facts.cloud, "gcp");

        let xen: &[(&str, &[u8])] = &[("sys/hypervisor/type", b"xen\n")];
        let (_f, roots) = tree(xen);
        let facts = read_facts(&roots, &FixedCpuid::absent());
        assert_eq!(
            (facts.virtualization, facts.hypervisor.as_str()),
            ("vm", "xen")
        );
    }

    #[test]
    fn missing_files_are_unknown_not_errors() {
        let (_dir, roots) = tree(&[]);
        let facts = read_facts(&roots, &FixedCpuid::absent());
        assert_eq!(facts.virtualization, "unknown");
        assert_eq!(facts.hypervisor, "unknown");
        assert_eq!(facts.product, "unknown");
        assert_eq!(facts.cloud, "unknown");
        assert_eq!(facts.kernel, "unknown");
        assert_eq!(facts.iommu, "unknown");
        assert_eq!(facts.gpudirect_rdma, "unknown");
        assert_eq!(facts.gpudirect_storage, "unknown");
        assert!(facts.gpu_affinity.is_empty());
        assert_eq!(facts.nvidia_driver, "unknown");
        assert_eq!(facts.cpu_model, "unknown");
        assert_eq!(
            (
                facts.cpus,
                facts.numa_nodes,
                facts.iommu_groups,
                facts.nvidia_gpus
            ),
            (None, None, None, None)
        );
        assert!(facts.unreadable.is_empty());
        assert!(facts.problems().is_empty());
        assert_eq!(
            facts.summary(),
            "virtualization unknown, kernel unknown, IOMMU unknown, GPUDirect RDMA unknown"
        );

        let mut platform = Platform::with_cpuid(
            &PlatformConfig::default(),
            &roots,
            Box::new(FixedCpuid::absent()),
        );
        assert!(matches!(platform.probe(), Availability::Available(_)));
        let batches = platform.collect(1).unwrap();
        assert_eq!(batches[0].len(), 1);
        assert_eq!(batches[1].sample_count(), 0, "every count null");
    }

    #[test]
    fn an_unreadable_procfs_is_absent_and_fails_collect() {
        let roots = Roots {
            procfs: PathBuf::from("/nonexistent/vtax/proc"),
            sysfs: PathBuf::from("/nonexistent/vtax/sys"),
            ..Roots::default()
        };
        let mut platform = Platform::with_cpuid(
            &PlatformConfig::default(),
            &roots,
            Box::new(FixedCpuid::bare_metal()),
        );
        match platform.probe() {
            Availability::Absent(why) => {
                assert!(why.starts_with("/nonexistent/vtax/proc: "), "{why}")
            }
            other => panic!("{other:?}"),
        }
        let err = platform.collect(1).unwrap_err().to_string();
        assert!(err.starts_with("/nonexistent/vtax/proc: "), "{err}");
    }

    #[test]
    fn garbage_is_unknown_and_names_the_file() {
        let junk: &[u8] = b"\x7fELF\x02\x01\x01\x00\x00\x00\xff\xfe\x00\x80";
        let files: &[(&str, &[u8])] = &[
            ("proc/cpuinfo", junk),
            ("proc/sys/kernel/osrelease", junk),
            ("proc/cmdline", b"\xc3\x28 intel_iommu=on"),
            ("proc/modules", junk),
            ("proc/driver/nvidia/version", b"NVRM says hello\n"),
            ("sys/class/dmi/id/sys_vendor", junk),
            ("sys/class/dmi/id/product_name", b"\x01\x02\x03\n"),
            ("sys/hypervisor/type", b"\x00\x00"),
        ];
        let (_dir, roots) = tree(files);
        let facts = read_facts(&roots, &FixedCpuid::bare_metal());
        assert_eq!(facts.virtualization, "none", "CPUID still answers");
        assert_eq!(facts.kernel, "unknown");
        assert_eq!(facts.cpu_model, "unknown");
        assert_eq!(facts.cpus, None);
        assert_eq!(facts.product, "unknown");
        assert_eq!(facts.nvidia_driver, "unknown");
        assert!(!facts.cmdline_read);
        let unreadable: Vec<&str> = facts.unreadable.iter().map(|e| e.path.as_str()).collect();
        for file in [
            "proc/cpuinfo",
            "proc/sys/kernel/osrelease",
            "proc/cmdline",
            "proc/modules",
            "proc/driver/nvidia/version",
            "sys/class/dmi/id/sys_vendor",
            "sys/hypervisor/type",
        ] {
            let named = roots
                .procfs
                .parent()
                .unwrap()
                .join(file)
                .display()
                .to_string();
            assert!(
                unreadable.contains(&named.as_str()),
                "{file} not named in {unreadable:?}"
            );
        }
        // Named once, as a source error, not again among the problems.
        let problems = facts.problems().join("\n");
        assert!(!problems.contains("proc/cpuinfo"), "{problems}");

        // Truncated files: what is there is used.
        let truncated: &[(&str, &[u8])] = &[
            (
                "proc/cpuinfo",
                b"processor\t: 0\nmodel name\t: AMD EPYC 7763 64-Core Processor\nflags\t\t: fpu hyperv",
            ),
            ("proc/driver/nvidia/version", b"NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  550.54"),
            ("sys/class/dmi/id/sys_vendor", b"Dell Inc."),
        ];
        let (_dir, roots) = tree(truncated);
        let facts = read_facts(&roots, &FixedCpuid::absent());
        assert_eq!(facts.cpus, Some(1));
        assert_eq!(facts.cpu_model, "AMD EPYC 7763 64-Core");
        assert_eq!(facts.virtualization, "none", "\"hyperv\" is not the flag");
        assert_eq!(facts.nvidia_driver, "550.54");
        assert_eq!(facts.product, "Dell");
        assert!(facts.unreadable.is_empty());
    }

    #[test]
    fn translated_iommu_and_missing_peermem_are_problems() {
        let files: &[(&str, &[u8])] = &[
            ("proc/cmdline", b"ro amd_iommu=on\n"),
            ("proc/modules", b"nvidia 56664064 0 - Live 0x0000000000000000 (POE)\n"),
            ("sys/kernel/iommu_groups/0/type", b"DMA-FQ\n"),
            ("sys/kernel/iommu_groups/1/type", b"DMA-FQ\n"),
            (
                "proc/driver/nvidia/version",
                b"NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  550.54.15  Release Build  (dvs-builder@U16-I3-B03-4-3)  Tue Mar  5 22:15:33 UTC 2024\n",
            ),
        ];
        let (_dir, roots) = tree(files);
        let facts = read_facts(&roots, &FixedCpuid::bare_metal());
        assert_eq!(facts.iommu, "on");
        assert_eq!(facts.nvidia_driver, "550.54.15");
        assert_eq!(facts.gpudirect_rdma, "none");
        let problems = facts.problems();
        assert_eq!(problems.len(), 2, "{problems:?}");
        assert!(problems[0].starts_with("nvidia loaded without nvidia_peermem: GPUDirect RDMA off"));
        assert!(problems[1].starts_with("IOMMU translates DMA"));

        // Asked for on the command line, but no groups: firmware has it off.
        let files: &[(&str, &[u8])] = &[
            ("proc/cmdline", b"intel_iommu=on iommu=pt\n"),
            ("sys/kernel/iommu_groups/.keep", b""),
            (
                "proc/modules",
                b"nv_peer_mem 16384 0 - Live 0x0\nnvidia 1 1 nv_peer_mem, Live 0x0\n",
            ),
        ];
        let (_dir, roots) = tree(files);
        let facts = read_facts(&roots, &FixedCpuid::bare_metal());
        assert_eq!(facts.iommu, "off");
        assert_eq!(facts.gpudirect_rdma, "nv_peer_mem");
        assert_eq!(facts.nvidia_driver, "unknown");
        let problems = facts.problems().join("\n");
        assert!(problems.contains("intel_iommu=on on the kernel command line but no IOMMU groups"));
        assert!(problems.contains("nvidia loaded but its version file is unreadable"));

        // Groups without `type` files: the command line decides the mode.
        let files: &[(&str, &[u8])] = &[
            ("proc/cmdline", b"iommu.passthrough=1\n"),
            ("sys/kernel/iommu_groups/7/devices/.keep", b""),
        ];
        let (_dir, roots) = tree(files);
        assert_eq!(read_facts(&roots, &FixedCpuid::bare_metal()).iommu, "pt");
    }

    #[test]
    fn a_gpu_without_an_rdma_nic_on_its_switch_is_a_problem() {
        let (_dir, roots) = tree(&[]);
        crate::collectors::testutil::flat_pci_tree(&roots.sysfs);
        let sys = roots.sysfs.join("devices/pci0000:00");
        // Without NUMA nodes nothing is near anything: no rows, no problem.
        let facts = read_facts(&roots, &FixedCpuid::bare_metal());
        assert!(facts.gpu_affinity.is_empty());
        assert!(facts.problems().is_empty(), "{:?}", facts.problems());
        for f in ["0000:00:05.0", "0000:00:06.0"] {
            std::fs::write(sys.join(f).join("numa_node"), "0\n").unwrap();
        }
        let facts = read_facts(&roots, &FixedCpuid::bare_metal());
        assert_eq!(
            facts.problems(),
            ["GPU 0000:00:05.0 shares no PCIe switch with an RDMA device (on its NUMA node: mlx5_0): \
              GPUDirect RDMA between them crosses the CPU's root complex"]
        );
        let lines = doctor_lines(&roots).join("\n");
        assert!(
            lines.contains("GPU 0000:00:05.0: same PCIe switch: none; same NUMA node only: mlx5_0"),
            "{lines}"
        );
    }

    #[test]
    fn labels_are_short_printable_and_stable() {
        assert_eq!(label("  a\tb \x07c \n second line"), "a b c");
        assert_eq!(label("\n"), "unknown");
        assert_eq!(label("é"), "unknown");
        assert_eq!(label(&"x".repeat(100)).len(), 64);
        assert_eq!(
            short_cpu_model(" Intel(R) Xeon(R) Platinum 8480+ CPU @ 2.00GHz"),
            "Intel Xeon Platinum 8480+"
        );
        assert_eq!(
            short_cpu_model("AMD EPYC 9654 96-Core Processor"),
            "AMD EPYC 9654 96-Core"
        );
        assert_eq!(short_cpu_model(""), "unknown");
        assert_eq!(
            iommu_cmdline("BOOT_IMAGE=x iommu=pt quiet -- iommu=off"),
            ["iommu=pt"]
        );
        assert_eq!(nvidia_version("garbage"), None);
    }

    #[test]
    fn config_defaults_to_a_minute_and_rejects_unknown_keys() {
        let config: PlatformConfig = toml::from_str("").unwrap();
        assert_eq!(config.interval_secs, 60.0);
        assert!(config.enabled);
        let err = toml::from_str::<PlatformConfig>("intervall_secs = 5\n").unwrap_err();
        assert!(err.to_string().contains("intervall_secs"), "{err}");
    }
}
