//! What the CPU says of the hypervisor: the CPUID leaves, behind a source
//! tests can script.


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
pub(super) const HYPERVISOR_LEAF: u32 = 0x4000_0000;

/// Where KVM moves its own signature when it also offers Hyper-V's interface.
pub(super) const KVM_BEHIND_HYPERV_LEAF: u32 = 0x4000_0100;

/// Hypervisor vendor signatures of leaf 0x40000000 (NULs trimmed) and their label.
pub(super) const CPUID_VENDORS: &[(&str, &str)] = &[
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

pub(super) fn vendor_signature(r: CpuidRegs) -> String {
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
pub(super) struct CpuidFacts {
    /// Leaf 1 ECX bit 31; `None` without CPUID.
    pub(super) hypervisor_bit: Option<bool>,
    /// Leaf 0x40000000's signature, NULs trimmed, when the bit is set.
    pub(super) vendor: Option<String>,
    /// The hypervisor label the signature maps to.
    pub(super) hypervisor: Option<&'static str>,
}

pub(super) fn read_cpuid(source: &dyn CpuidSource, evidence: &mut Vec<String>) -> CpuidFacts {
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
