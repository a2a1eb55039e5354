//! The platform's facts put together: virtualisation, hypervisor, cloud,
//! product, IOMMU and GPUDirect, with the evidence for each.

use super::*;

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
    let dmi_cloud_hypervisor = dmi.cloud_hypervisor();
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
            match (dmi_hypervisor, dmi_cloud_hypervisor) {
                (Some(h), _) => format!("names hypervisor {h}"),
                (None, Some(h)) => format!(
                    "names a cloud whose VMs run {h} and whose bare metal says the same: a VM where CPUID does not deny a hypervisor"
                ),
                (None, None) => "names no hypervisor".into(),
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

    let negative = cpu.hypervisor_bit == Some(false) || cpuinfo.hypervisor_flag == Some(false);
    // A cloud's name in DMI is a VM's sign only where CPUID does not deny
    // one: the same cloud sells bare metal under it.
    let dmi_hypervisor = dmi_hypervisor.or(if negative { None } else { dmi_cloud_hypervisor });
    let positive = cpu.hypervisor_bit == Some(true)
        || cpuinfo.hypervisor_flag == Some(true)
        || dmi_hypervisor.is_some()
        || sys_hypervisor.is_some();
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
pub(super) fn hypervisor_display(label: &str) -> &str {
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
    pub(super) fn row(&self) -> PlatformHostRow<'_> {
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
