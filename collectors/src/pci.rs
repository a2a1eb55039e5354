//! Where a sysfs device hangs in the PCI tree: its PCI address and NUMA node.
//!
//! `/sys/block/<dev>`, `/sys/class/net/<if>` and `/sys/bus/pci/devices/<bdf>`
//! are symlinks into `/sys/devices/pci<domain>:<bus>/<root port>/.../<device>`;
//! the PCI functions on that path are the device's bridges, nearest last.
//! Fixture trees keep the same relative links, so resolving them inside a
//! fixture lands inside the fixture.

use std::path::{Path, PathBuf};

use vtax_store::schema::{FieldDef, FieldType, TagDef, Unit};

/// The `pci_address` tag of tables that place a device.
pub const PCI_ADDRESS_TAG: TagDef = TagDef {
    name: "pci_address",
    help: "The nearest PCI function on the device's sysfs path (for NVMe, the controller); empty without one.",
};

/// The `numa_node` tag of tables that place a device.
pub const NUMA_NODE_TAG: TagDef = TagDef {
    name: "numa_node",
    help: "NUMA node of that PCI function; empty when the kernel says -1 or there is none.",
};

/// The one field of an info row, `info` (in a table declaration,
/// `info: u64 = info_field()`).
pub const fn info_field(name: &'static str) -> FieldDef {
    FieldDef::gauge(
        name,
        FieldType::U64,
        Unit::None,
        "Always 1; the row's tags carry the information.",
    )
}

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

/// The PCI functions on a resolved sysfs path, root port first, the device
/// itself (when it is one) last.
pub fn pci_chain(resolved: &Path) -> Vec<String> {
    resolved
        .components()
        .filter_map(|c| c.as_os_str().to_str())
        .filter(|c| is_pci_address(c))
        .map(str::to_owned)
        .collect()
}

/// A GPU and a NIC or NVMe drive near it: behind the same PCIe switch, on the
/// same NUMA node, or both.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Affinity {
    /// The GPU's PCI address.
    pub gpu: String,
    /// The peer's name: RDMA device (`mlx5_0`), interface (`ens1np0`) or NVMe controller (`nvme0`).
    pub peer: String,
    /// `rdma`, `netdev` or `nvme`.
    pub peer_kind: &'static str,
    /// The peer's PCI address.
    pub peer_pci_address: String,
    /// Whether the two share a bridge below the root port: a PCIe switch, so
    /// peer-to-peer DMA between them need not cross the CPU.
    pub same_switch: bool,
    /// Whether the two are on the same NUMA node.
    pub same_numa_node: bool,
}

/// A PCI function as the topology needs it.
struct Function {
    address: String,
    /// Bridges above it, root port first (itself left out).
    bridges: Vec<String>,
    numa_node: String,
    is_gpu: bool,
    peers: Vec<(&'static str, String)>,
}

/// A hex number in a sysfs file (`vendor`, `class`): `Ok(None)` when the
/// file is not there, an error naming what is wrong when it cannot be used.
fn hex_file(path: &Path) -> Result<Option<u32>, String> {
    let text = match std::fs::read_to_string(path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e.to_string()),
    };
    let digits = text.trim().trim_start_matches("0x");
    u32::from_str_radix(digits, 16)
        .map(Some)
        .map_err(|_| format!("{:?} is not a hexadecimal number", text.trim()))
}

fn names_in(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .filter_map(|e| e.ok())
                .filter_map(|e| e.file_name().into_string().ok())
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names
}

/// NVIDIA's PCI vendor ID.
const NVIDIA: u32 = 0x10de;

/// What [`gpu_affinity`] found, and the files it could not use.
#[derive(Debug, Default, PartialEq)]
pub struct Affinities {
    /// Sorted by GPU, then kind, then name.
    pub rows: Vec<Affinity>,
    /// A `vendor` or `class` file that is there but unreadable or junk, and
    /// why: its function is taken for no GPU, so a GPU's rows may be missing.
    pub unusable: Vec<(PathBuf, String)>,
}

/// For every NVIDIA GPU under `<sysfs>/bus/pci/devices` (class 3D or VGA
/// controller), the RDMA devices, interfaces and NVMe controllers that share
/// its PCIe switch or its NUMA node, from the links' paths into
/// `/sys/devices`. `None` when the directory is not there; functions that
/// cannot be read are left out, and a `vendor` or `class` file that cannot
/// be used is named.
pub fn gpu_affinity(sysfs: &Path) -> Option<Affinities> {
    let dir = sysfs.join("bus/pci/devices");
    if !dir.is_dir() {
        return None;
    }
    let mut unusable = Vec::new();
    let mut hex = |path: PathBuf| match hex_file(&path) {
        Ok(value) => value,
        Err(reason) => {
            unusable.push((path, reason));
            None
        }
    };
    let mut functions = Vec::new();
    for address in names_in(&dir) {
        let link = dir.join(&address);
        let Ok(resolved) = std::fs::canonicalize(&link) else {
            continue;
        };
        let mut bridges = pci_chain(&resolved);
        if bridges.pop().as_deref() != Some(address.as_str()) {
            continue; // not where a PCI function lives
        }
        let class = hex(resolved.join("class")).unwrap_or(0);
        let is_gpu = is_nvidia_gpu(hex(resolved.join("vendor")), class);
        let mut peers = Vec::new();
        for (sub, kind) in [("infiniband", "rdma"), ("net", "netdev"), ("nvme", "nvme")] {
            peers.extend(names_in(&resolved.join(sub)).into_iter().map(|n| (kind, n)));
        }
        if !is_gpu && peers.is_empty() {
            continue;
        }
        functions.push(Function {
            numa_node: placement_of_resolved(&resolved).numa_node,
            address,
            bridges,
            is_gpu,
            peers,
        });
    }
    let mut out = Vec::new();
    for gpu in functions.iter().filter(|f| f.is_gpu) {
        let mut near = Vec::new();
        for f in functions.iter().filter(|f| f.address != gpu.address) {
            let shared = gpu
                .bridges
                .iter()
                .zip(&f.bridges)
                .take_while(|(a, b)| a == b)
                .count();
            // The root port alone is the CPU's root complex, not a switch.
            let same_switch = shared >= 2;
            let same_numa_node = !gpu.numa_node.is_empty() && gpu.numa_node == f.numa_node;
            if !(same_switch || same_numa_node) {
                continue;
            }
            for (kind, name) in &f.peers {
                near.push(Affinity {
                    gpu: gpu.address.clone(),
                    peer: name.clone(),
                    peer_kind: kind,
                    peer_pci_address: f.address.clone(),
                    same_switch,
                    same_numa_node,
                });
            }
        }
        near.sort_by(|a, b| (a.peer_kind, natural(&a.peer)).cmp(&(b.peer_kind, natural(&b.peer))));
        out.extend(near);
    }
    Some(Affinities {
        rows: out,
        unusable,
    })
}

/// A 3D or VGA controller of NVIDIA's.
fn is_nvidia_gpu(vendor: Option<u32>, class: u32) -> bool {
    vendor == Some(NVIDIA) && matches!(class >> 8, 0x0302 | 0x0300)
}

/// A PCI function of the kind a collector looks for (an NVIDIA GPU, an
/// InfiniBand controller), and what the kernel made of it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PciFunction {
    /// Its PCI address, `0000:17:00.0`.
    pub address: String,
    /// The bound driver (`nvidia`, `mlx5_core`, `vfio-pci`); `None` when none is.
    pub driver: Option<String>,
    /// An SR-IOV virtual function (it has a `physfn` link): one of the
    /// slices a physical function hands out, idle until something takes it.
    pub virtual_function: bool,
    /// The RDMA devices the kernel made of it (`infiniband/mlx5_0`).
    pub rdma_devices: Vec<String>,
}

impl PciFunction {
    /// Bound to a driver that hands the device to a virtual machine
    /// (`vfio-pci`, `pci-stub`): the host has given it away, and reads
    /// nothing of it.
    pub fn given_to_a_vm(&self) -> bool {
        matches!(self.driver.as_deref(), Some("vfio-pci" | "pci-stub"))
    }

    /// `0000:17:00.0 (bound to nvidia)`, or `(bound to no driver)`.
    pub fn describe(&self) -> String {
        match &self.driver {
            Some(driver) => format!("{} (bound to {driver})", self.address),
            None => format!("{} (bound to no driver)", self.address),
        }
    }
}

/// The functions under `<sysfs>/bus/pci/devices` whose vendor and class
/// `wanted` takes, in address order; `None` when the directory is not
/// there. A function whose `vendor` or `class` cannot be read is not
/// taken. Two small reads a function: cheap enough for a probe or a walk,
/// not meant for every tick.
fn functions_where(
    sysfs: &Path,
    wanted: impl Fn(Option<u32>, u32) -> bool,
) -> Option<Vec<PciFunction>> {
    let dir = sysfs.join("bus/pci/devices");
    if !dir.is_dir() {
        return None;
    }
    let found = names_in(&dir)
        .into_iter()
        .filter(|address| is_pci_address(address))
        .filter_map(|address| {
            let function = dir.join(&address);
            let vendor = hex_file(&function.join("vendor")).ok().flatten();
            let class = hex_file(&function.join("class"))
                .ok()
                .flatten()
                .unwrap_or(0);
            wanted(vendor, class).then(|| PciFunction {
                driver: std::fs::read_link(function.join("driver"))
                    .ok()
                    .and_then(|to| Some(to.file_name()?.to_str()?.to_owned())),
                virtual_function: function.join("physfn").symlink_metadata().is_ok(),
                rdma_devices: names_in(&function.join("infiniband")),
                address,
            })
        })
        .collect();
    Some(found)
}

/// The NVIDIA GPUs (3D or VGA controllers) on the PCI bus, whatever driver
/// they are bound to.
pub fn nvidia_gpus(sysfs: &Path) -> Option<Vec<PciFunction>> {
    functions_where(sysfs, is_nvidia_gpu)
}

/// The InfiniBand controllers (class 0x0207, any vendor) on the PCI bus.
/// An HCA in Ethernet mode (RoCE) is a network controller (0x0200) and is
/// not one: without RDMA it is an Ethernet NIC, which is the netdev
/// collector's.
pub fn infiniband_controllers(sysfs: &Path) -> Option<Vec<PciFunction>> {
    functions_where(sysfs, |_, class| class >> 8 == 0x0207)
}

/// Whether NVML's bus id (`00000000:17:00.0`, an 8-digit domain, upper
/// case) and a sysfs address (`0000:17:00.0`) name the same function.
pub fn same_pci_function(nvml_bus_id: &str, sysfs_address: &str) -> bool {
    fn parts(id: &str) -> Option<[u32; 4]> {
        let (domain, rest) = id.trim().split_once(':')?;
        let (bus, rest) = rest.split_once(':')?;
        let (device, function) = rest.split_once('.')?;
        let hex = |t: &str| u32::from_str_radix(t, 16).ok();
        Some([hex(domain)?, hex(bus)?, hex(device)?, hex(function)?])
    }
    parts(nvml_bus_id).is_some_and(|a| parts(sysfs_address) == Some(a))
}

/// Sorts `mlx5_2` before `mlx5_10`.
fn natural(name: &str) -> (&str, u64) {
    let digits = name.len() - name.trim_end_matches(|c: char| c.is_ascii_digit()).len();
    let (stem, number) = name.split_at(name.len() - digits);
    (stem, number.parse().unwrap_or(0))
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

    #[test]
    fn baremetal_gpus_share_switches_with_their_nic_and_nvme() {
        let sysfs = crate::testutil::node("baremetal-node").join("sys");
        let found = gpu_affinity(&sysfs).unwrap();
        assert_eq!(found.unusable, []);
        let all = found.rows;
        assert_eq!(all.len(), 64, "8 GPUs x 8 peers on their NUMA node");
        let first: Vec<_> = all
            .iter()
            .filter(|a| a.gpu == "0000:18:00.0")
            .map(|a| {
                (
                    a.peer.as_str(),
                    a.peer_kind,
                    a.same_switch,
                    a.same_numa_node,
                )
            })
            .collect();
        assert_eq!(
            first,
            [
                ("eno1", "netdev", false, true),
                ("eno2", "netdev", false, true),
                ("nvme0", "nvme", true, true),
                ("nvme1", "nvme", false, true),
                ("mlx5_0", "rdma", true, true),
                ("mlx5_1", "rdma", false, true),
                ("mlx5_2", "rdma", false, true),
                ("mlx5_3", "rdma", false, true),
            ]
        );
        let last: Vec<_> = all
            .iter()
            .filter(|a| a.gpu == "0000:db:00.0")
            .filter(|a| a.same_switch || a.peer_kind == "netdev")
            .map(|a| (a.peer.as_str(), a.peer_pci_address.as_str(), a.same_switch))
            .collect();
        assert_eq!(
            last,
            [
                ("ens22f0np0", "0000:c6:00.0", false),
                ("mlx5_7", "0000:dc:00.0", true)
            ]
        );
        assert_eq!(gpu_affinity(Path::new("/nonexistent/vtax/sys")), None);
    }

    #[test]
    fn a_flat_topology_shares_no_switch() {
        // A VM with passthrough: every device on the root bus, no NUMA node.
        let dir = tempfile::tempdir().unwrap();
        let sys = dir.path();
        crate::testutil::flat_pci_tree(sys);
        assert_eq!(
            gpu_affinity(sys),
            Some(Affinities::default()),
            "no switch, no NUMA node"
        );
        std::fs::write(sys.join("devices/pci0000:00/0000:00:05.0/numa_node"), "0\n").unwrap();
        std::fs::write(sys.join("devices/pci0000:00/0000:00:06.0/numa_node"), "0\n").unwrap();
        let near = gpu_affinity(sys).unwrap().rows;
        assert_eq!(near.len(), 1);
        assert_eq!(
            (near[0].peer.as_str(), near[0].same_switch),
            ("mlx5_0", false)
        );
        // Garbage in vendor: not taken for a GPU, never a panic, and named,
        // since the GPU's rows are missing because of it.
        let vendor = sys.join("devices/pci0000:00/0000:00:05.0/vendor");
        std::fs::write(&vendor, "\u{0}zz").unwrap();
        let found = gpu_affinity(sys).unwrap();
        assert_eq!(found.rows, []);
        assert_eq!(found.unusable.len(), 1, "{:?}", found.unusable);
        assert_eq!(found.unusable[0].0, vendor);
        assert!(found.unusable[0].1.contains("not a hexadecimal number"));
        // A function without a class file is simply no GPU.
        std::fs::remove_file(&vendor).unwrap();
        assert_eq!(gpu_affinity(sys).unwrap().unusable, []);
    }

    #[test]
    fn nvidia_gpus_are_listed_with_the_driver_bound_to_each() {
        let dir = tempfile::tempdir().unwrap();
        let sys = dir.path();
        // One GPU bound to no driver, an HCA and an NVMe drive.
        crate::testutil::flat_pci_tree(sys);
        // One bound to nvidia, one to vfio-pci, an NVSwitch (a bridge, not a
        // GPU) and a VGA controller of NVIDIA's.
        for (bdf, class, driver) in [
            ("0000:00:08.0", "0x030200", Some("nvidia")),
            ("0000:00:09.0", "0x030200", Some("vfio-pci")),
            ("0000:00:0a.0", "0x068000", Some("nvidia")),
            ("0000:00:0b.0", "0x030000", Some("nvidia")),
        ] {
            let f = sys.join("devices/pci0000:00").join(bdf);
            std::fs::create_dir_all(&f).unwrap();
            std::fs::write(f.join("vendor"), "0x10de\n").unwrap();
            std::fs::write(f.join("class"), class).unwrap();
            if let Some(driver) = driver {
                std::os::unix::fs::symlink(
                    format!("../../../bus/pci/drivers/{driver}"),
                    f.join("driver"),
                )
                .unwrap();
            }
            std::os::unix::fs::symlink(
                format!("../../../devices/pci0000:00/{bdf}"),
                sys.join("bus/pci/devices").join(bdf),
            )
            .unwrap();
        }
        let gpus = nvidia_gpus(sys).unwrap();
        let found: Vec<(&str, Option<&str>, bool)> = gpus
            .iter()
            .map(|g| (g.address.as_str(), g.driver.as_deref(), g.given_to_a_vm()))
            .collect();
        assert!(gpus
            .iter()
            .all(|g| !g.virtual_function && g.rdma_devices.is_empty()));
        assert_eq!(
            found,
            [
                ("0000:00:05.0", None, false),
                ("0000:00:08.0", Some("nvidia"), false),
                ("0000:00:09.0", Some("vfio-pci"), true),
                ("0000:00:0b.0", Some("nvidia"), false),
            ]
        );
        assert_eq!(gpus[0].describe(), "0000:00:05.0 (bound to no driver)");
        assert_eq!(gpus[1].describe(), "0000:00:08.0 (bound to nvidia)");
        assert_eq!(nvidia_gpus(&sys.join("nonexistent")), None);
        // The tree's HCA (class 0x020700, an InfiniBand controller), with
        // its RDMA device.
        let hcas = infiniband_controllers(sys).unwrap();
        assert_eq!(hcas.len(), 1);
        assert_eq!(hcas[0].address, "0000:00:06.0");
        assert_eq!(hcas[0].rdma_devices, ["mlx5_0"]);
    }

    #[test]
    fn nvml_bus_ids_name_sysfs_functions() {
        assert!(same_pci_function("00000000:3B:00.0", "0000:3b:00.0"));
        assert!(same_pci_function("00000001:3B:00.1", "0001:3b:00.1"));
        assert!(!same_pci_function("00000000:3B:00.0", "0000:3b:00.1"));
        assert!(!same_pci_function("00000000:3B:00.0", "0001:3b:00.0"));
        assert!(!same_pci_function("", "0000:3b:00.0"));
        assert!(!same_pci_function("garbage", "garbage"));
    }
}
