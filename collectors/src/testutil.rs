//! What the collectors' unit tests share: fixture paths, copies that keep
//! symlinks, and reading a batch's columns back.

use std::path::{Path, PathBuf};

use vtax_store::batch::Values;
use vtax_store::Batch;

use super::Roots;

/// A fixture tree under `tests/fixtures/`.
pub fn node(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/fixtures")
        .join(name)
}

/// The roots of a tree holding `proc/` and `sys/`.
pub fn roots(node: &Path) -> Roots {
    Roots {
        procfs: node.join("proc"),
        sysfs: node.join("sys"),
        ..Roots::default()
    }
}

/// Copies a tree, keeping symlinks as links (sysfs is made of them).
pub fn copy_tree(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        let kind = entry.file_type().unwrap();
        if kind.is_symlink() {
            std::os::unix::fs::symlink(std::fs::read_link(entry.path()).unwrap(), target).unwrap();
        } else if kind.is_dir() {
            copy_tree(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), target).unwrap();
        }
    }
}

/// A tag column's values, row by row.
pub fn tags(batch: &Batch, tag: &str) -> Vec<String> {
    let col = &batch.tags[batch.table.tag_index(tag).unwrap()];
    col.codes
        .iter()
        .map(|&c| col.dict[c as usize].clone())
        .collect()
}

/// A u64 field's values, row by row, null as `None`.
pub fn u64s(batch: &Batch, field: &str) -> Vec<Option<u64>> {
    let col = &batch.fields[batch.table.field_index(field).unwrap()];
    let Values::U64(v) = &col.values else {
        panic!("{field} is not u64")
    };
    (0..v.len())
        .map(|i| col.is_valid(i).then_some(v[i]))
        .collect()
}

/// An f64 field's values, row by row, null as `None`.
pub fn f64s(batch: &Batch, field: &str) -> Vec<Option<f64>> {
    let col = &batch.fields[batch.table.field_index(field).unwrap()];
    let Values::F64(v) = &col.values else {
        panic!("{field} is not f64")
    };
    (0..v.len())
        .map(|i| col.is_valid(i).then_some(v[i]))
        .collect()
}

/// A sysfs PCI tree with a GPU (`0000:00:05.0`), an RDMA NIC (`mlx5_0` on
/// `0000:00:06.0`) and an NVMe drive (`nvme0` on `0000:00:07.0`), all on the
/// root bus as a VM with passthrough sees them, `numa_node` -1.
pub fn flat_pci_tree(sys: &Path) {
    for (bdf, vendor, class, sub) in [
        ("0000:00:05.0", "0x10de", "0x030200", None),
        (
            "0000:00:06.0",
            "0x15b3",
            "0x020700",
            Some("infiniband/mlx5_0"),
        ),
        ("0000:00:07.0", "0x1af4", "0x010802", Some("nvme/nvme0")),
    ] {
        let f = sys.join("devices/pci0000:00").join(bdf);
        std::fs::create_dir_all(&f).unwrap();
        std::fs::write(f.join("vendor"), vendor).unwrap();
        std::fs::write(f.join("class"), class).unwrap();
        std::fs::write(f.join("numa_node"), "-1\n").unwrap();
        if let Some(sub) = sub {
            std::fs::create_dir_all(f.join(sub)).unwrap();
        }
        std::fs::create_dir_all(sys.join("bus/pci/devices")).unwrap();
        std::os::unix::fs::symlink(
            format!("../../../devices/pci0000:00/{bdf}"),
            sys.join("bus/pci/devices").join(bdf),
        )
        .unwrap();
    }
}
