//! Reading the host's own files (DMI, cpuinfo, the kernel command line, the
//! NVIDIA driver's version), bounded and with each bad file named.

use super::*;

/// Most bytes read from one file: a junk file cannot take the agent's memory.
pub(super) const MAX_FILE_BYTES: u64 = 8 << 20;

/// Longest label value.
pub(super) const MAX_LABEL_CHARS: usize = 64;

/// Reads files for one pass, turning what cannot be used into notes.
pub(super) struct Reader<'a> {
    pub(super) roots: &'a Roots,
    /// Files that exist but could not be used, for `source_errors`.
    pub(super) notes: Vec<ParseError>,
}

/// `path` exists but cannot be used.
pub(super) fn unusable(path: &Path, reason: impl Into<String>) -> ParseError {
    ParseError {
        path: path.display().to_string(),
        line: 0,
        reason: reason.into(),
    }
}

impl Reader<'_> {
    /// The text of a file; `None` when it is missing (silently) or unreadable
    /// or not text (with a note naming it).
    pub(super) fn text(&mut self, path: &Path) -> Option<String> {
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

    pub(super) fn proc(&mut self, rel: &str) -> Option<String> {
        self.text(&self.roots.proc(rel))
    }

    pub(super) fn sys(&mut self, rel: &str) -> Option<String> {
        self.text(&self.roots.sys(rel))
    }

    /// Names in a directory; `None` when it is missing or unreadable (noted).
    pub(super) fn dir(&mut self, path: &Path) -> Option<Vec<String>> {
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
pub(super) const DMI_PLACEHOLDERS: &[&str] = &[
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
pub(super) struct Dmi {
    pub(super) sys_vendor: Option<String>,
    pub(super) product_name: Option<String>,
    pub(super) board_vendor: Option<String>,
    pub(super) board_name: Option<String>,
    pub(super) bios_vendor: Option<String>,
    pub(super) bios_version: Option<String>,
    pub(super) chassis_asset_tag: Option<String>,
}

impl Dmi {
    pub(super) fn read(reader: &mut Reader) -> Dmi {
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

    pub(super) fn is_empty(&self) -> bool {
        *self == Dmi::default()
    }

    pub(super) fn fields(&self) -> [(&'static str, Option<&str>); 7] {
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
    pub(super) fn vendor_has(&self, needle: &str) -> bool {
        let needle = needle.to_ascii_lowercase();
        [&self.sys_vendor, &self.board_vendor, &self.bios_vendor]
            .into_iter()
            .flatten()
            .any(|v| v.to_ascii_lowercase().contains(&needle))
    }

    /// Whether any vendor string begins with the word(s) `name`,
    /// case-insensitively: a hypervisor's vendor string begins with its name
    /// ("QEMU", "VMware, Inc.", "Xen"), and a vendor that merely contains one
    /// ("XENON Systems") is not it.
    fn vendor_is(&self, name: &str) -> bool {
        [&self.sys_vendor, &self.board_vendor, &self.bios_vendor]
            .into_iter()
            .flatten()
            .any(|v| begins_with_words(v, name))
    }

    pub(super) fn product_has(&self, needle: &str) -> bool {
        let needle = needle.to_ascii_lowercase();
        self.product_name
            .as_deref()
            .is_some_and(|p| p.to_ascii_lowercase().contains(&needle))
    }

    /// Whether the product name begins with the word(s) `name`.
    fn product_is(&self, name: &str) -> bool {
        self.product_name
            .as_deref()
            .is_some_and(|p| begins_with_words(p, name))
    }

    /// A bare-metal cloud instance (`p4d.metal`, `c5n.metal`).
    pub(super) fn is_metal_instance(&self) -> bool {
        self.product_name
            .as_deref()
            .is_some_and(|p| p.ends_with(".metal") || p.contains(".metal-"))
    }

    /// The hypervisor DMI names, if it names one that only a VM carries: the
    /// sign that a node is a VM even when CPUID hides it.
    pub(super) fn hypervisor(&self) -> Option<&'static str> {
        if self.vendor_is("qemu") || self.product_is("qemu") {
            Some("qemu")
        } else if self.vendor_is("vmware") || self.product_is("vmware") {
            Some("vmware")
        } else if self.vendor_is("microsoft") && self.product_is("virtual machine") {
            Some("hyperv")
        } else if self.vendor_is("xen") || self.product_is("hvm domu") {
            Some("xen")
        } else if self.vendor_is("innotek") || self.product_is("virtualbox") {
            Some("virtualbox")
        } else if self.vendor_is("parallels") {
            Some("parallels")
        } else if self.vendor_is("bhyve") {
            Some("bhyve")
        } else if self.vendor_is("kubevirt") || self.product_is("kubevirt") {
            Some("kvm")
        } else if self.vendor_is("bochs") || self.product_is("bochs") {
            Some("bochs")
        } else if self.product_is("kvm") || self.product_is("openstack") {
            Some("kvm")
        } else {
            None
        }
    }

    /// The hypervisor a cloud's DMI names, on a cloud that also sells bare
    /// metal under the same DMI: Google's bare-metal instances say "Google
    /// Compute Engine" as its VMs do, and an AWS instance whose product
    /// name is unreadable says only "Amazon EC2". A sign of a VM only where
    /// CPUID does not say there is no hypervisor (taken as one, a GCP
    /// bare-metal node was called a KVM guest paying a virtualization tax).
    pub(super) fn cloud_hypervisor(&self) -> Option<&'static str> {
        if self.product_is("google compute engine")
            || (self.vendor_is("amazon ec2") && !self.is_metal_instance())
        {
            // Both run KVM-based hypervisors (Nitro on AWS).
            Some("kvm")
        } else {
            None
        }
    }

    /// The cloud DMI names: `aws`, `gcp`, `azure`, ...; `none` when DMI names
    /// none, `unknown` without DMI.
    pub(super) fn cloud(&self) -> &'static str {
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
    pub(super) fn product(&self) -> String {
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
pub(super) struct CpuInfo {
    /// Logical CPUs: `processor` lines.
    pub(super) cpus: Option<i64>,
    /// The first `model name`, shortened.
    pub(super) model: Option<String>,
    /// Whether the first `flags` line has `hypervisor`; `None` without one.
    pub(super) hypervisor_flag: Option<bool>,
}

pub(super) fn parse_cpuinfo(text: &str) -> CpuInfo {
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
pub(super) fn short_cpu_model(model: &str) -> String {
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
pub(super) fn iommu_cmdline(cmdline: &str) -> Vec<String> {
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
pub(super) fn nvidia_version(text: &str) -> Option<String> {
    let line = text.lines().find(|l| l.starts_with("NVRM version:"))?;
    line.split_whitespace()
        .find(|w| {
            w.starts_with(|c: char| c.is_ascii_digit())
                && w.contains('.')
                && w.chars().all(|c| c.is_ascii_digit() || c == '.')
        })
        .map(String::from)
}

/// Whether `text` begins with `words`, case-insensitively, ending there or
/// at a character that is not a letter or digit.
fn begins_with_words(text: &str, words: &str) -> bool {
    let text = text.trim().as_bytes();
    let words = words.as_bytes();
    text.len() >= words.len()
        && text[..words.len()].eq_ignore_ascii_case(words)
        && text
            .get(words.len())
            .is_none_or(|c| !c.is_ascii_alphanumeric())
}
