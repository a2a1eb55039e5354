//! Tests of the module.

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
        crate::testutil::copy_tree(
            &crate::testutil::node("baremetal-node"),
            dir.path(),
        );
        let roots = crate::testutil::roots(dir.path());
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
            crate::testutil::node("baremetal-node").join(file),
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
    crate::testutil::copy_tree(
        &crate::testutil::node("baremetal-node"),
        dir.path(),
    );
    let roots = crate::testutil::roots(dir.path());
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
    // Google's bare-metal instances carry the same DMI; CPUID says there is
    // no hypervisor, and that decides (it was called a KVM guest).
    let facts = read_facts(&roots, &FixedCpuid::bare_metal());
    assert_eq!(
        (facts.virtualization, facts.hypervisor.as_str(), facts.cloud),
        ("none", "none", "gcp")
    );
    // So for an AWS instance whose product name does not read.
    let (_g, roots) = tree(&[
        ("sys/class/dmi/id/sys_vendor", b"Amazon EC2\n"),
        ("sys/class/dmi/id/product_name", b"Not Specified\n"),
    ]);
    let facts = read_facts(&roots, &FixedCpuid::bare_metal());
    assert_eq!(facts.virtualization, "none");
    // A vendor whose name merely contains a hypervisor's is not it.
    let (_h, roots) = tree(&[
        ("sys/class/dmi/id/sys_vendor", b"XENON Systems\n"),
        ("sys/class/dmi/id/board_vendor", b"Supermicro\n"),
    ]);
    let facts = read_facts(&roots, &FixedCpuid::bare_metal());
    assert_eq!(facts.virtualization, "none");
    // KubeVirt hiding the CPUID bit still names itself.
    let (_i, roots) = tree(&[("sys/class/dmi/id/sys_vendor", b"KubeVirt\n")]);
    let facts = read_facts(&roots, &FixedCpuid::bare_metal());
    assert_eq!((facts.virtualization, facts.hypervisor.as_str()), ("vm", "kvm"));

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
    crate::testutil::flat_pci_tree(&roots.sysfs);
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
