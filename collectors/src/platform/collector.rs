//! The collector and the doctor's lines.

use super::*;

/// The platform collector.
pub struct Platform {
    pub(super) roots: Roots,
    pub(super) cpuid: Box<dyn CpuidSource>,
    pub(super) problems: Vec<String>,
    /// Files that could not be used at the last read.
    pub(super) errors: Vec<ParseError>,
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

    pub(super) fn procfs_readable(&self) -> anyhow::Result<()> {
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
