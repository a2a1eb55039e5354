//! Where a sysfs device hangs in the PCI tree: its PCI address and NUMA node.
//!
//! `/sys/block/<dev>`, `/sys/class/net/<if>` and `/sys/bus/pci/devices/<bdf>`
//! are symlinks into `/sys/devices/pci<domain>:<bus>/<root port>/.../<device>`;
//! the PCI functions on that path are the device's bridges, nearest last.
//! Fixture trees keep the same relative links, so resolving them inside a
//! fixture lands inside the fixture.

use std::path::{Path, PathBuf};

/// Whether `name` is a PCI address: `dddd:bb:dd.f`, lowercase hex.
pub fn is_pci_address(name: &str) -> bool {
    let b = name.as_bytes();
    let hex = |r: std::ops::Range<usize>| {
        b[r].iter()
            .all(|c| c.is_ascii_digit() || (b'a'..=b'f').contains(c))
    };
    b.len() == 12
        && b[4] == b':'
        && b[7] == b':'
        && b[10] == b'.'
        && hex(0..4)
        && hex(5..7)
        && hex(8..10)
        && hex(11..12)
}

/// Where a device sits: its nearest PCI function and that function's NUMA node.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Placement {
    /// The nearest PCI function on the device's path (`0000:17:00.0`); empty
    /// for a device with no PCI parent (virtual, platform bus).
    pub pci_address: String,
    /// The NUMA node the kernel gives that function; empty when it has none
    /// (`-1`: one node, or firmware that did not say) or no PCI parent.
    pub numa_node: String,
}

/// The placement of the device whose sysfs directory (or link to it) is `dir`.
/// Never fails: what cannot be resolved or read is left empty.
pub fn placement(dir: &Path) -> Placement {
    let Ok(resolved) = std::fs::canonicalize(dir) else {
        return Placement::default();
    };
    placement_of_resolved(&resolved)
}

/// [`placement`] of a path already resolved.
pub fn placement_of_resolved(resolved: &Path) -> Placement {
    let mut function: Option<PathBuf> = None;
    for ancestor in resolved.ancestors() {
        if ancestor
            .file_name()
            .and_then(|n| n.to_str())
            .is_some_and(is_pci_address)
        {
            function = Some(ancestor.to_owned());
            break;
        }
    }
    let Some(function) = function else {
        return Placement::default();
    };
    let numa_node = std::fs::read_to_string(function.join("numa_node"))
        .ok()
        .map(|t| t.trim().to_owned())
        .filter(|t| !t.is_empty() && t.bytes().all(|b| b.is_ascii_digit()))
        .unwrap_or_default();
    Placement {
        pci_address: function
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or_default()
            .to_owned(),
        numa_node,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses() {
        assert!(is_pci_address("0000:00:02.0"));
        assert!(is_pci_address("0000:af:1f.7"));
        for bad in [
            "0000:00:02",
            "pci0000:00",
            "0000:AF:00.0",
            "0000-00:02.0",
            "virtio1",
        ] {
            assert!(!is_pci_address(bad), "{bad}");
        }
    }

    #[test]
    fn placement_follows_links_to_the_nearest_function() {
        let dir = tempfile::tempdir().unwrap();
        let function = dir.path().join("devices/pci0000:00/0000:00:03.0");
        std::fs::create_dir_all(function.join("virtio2/net/eth0")).unwrap();
        std::fs::write(function.join("numa_node"), "1\n").unwrap();
        std::fs::create_dir_all(dir.path().join("class/net")).unwrap();
        std::os::unix::fs::symlink(
            "../../devices/pci0000:00/0000:00:03.0/virtio2/net/eth0",
            dir.path().join("class/net/eth0"),
        )
        .unwrap();
        let p = placement(&dir.path().join("class/net/eth0"));
        assert_eq!(p.pci_address, "0000:00:03.0");
        assert_eq!(p.numa_node, "1");
        // -1 (no affinity) and garbage are no node.
        std::fs::write(function.join("numa_node"), "-1\n").unwrap();
        assert_eq!(placement(&function).numa_node, "");
        std::fs::write(function.join("numa_node"), "\u{0}x").unwrap();
        assert_eq!(placement(&function).numa_node, "");
        assert_eq!(
            placement(&dir.path().join("class/net/nope")),
            Placement::default()
        );
        let virt = dir.path().join("devices/virtual/net/lo");
        std::fs::create_dir_all(&virt).unwrap();
        assert_eq!(placement(&virt), Placement::default());
    }
}
