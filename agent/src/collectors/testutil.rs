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
