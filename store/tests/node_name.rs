//! The node name names the store's files; names with '-' (host names,
//! Kubernetes node names) must write, read back and name the store.

use std::path::{Path, PathBuf};

use vtax_store::files::node_of_store;
use vtax_store::{
    scan, tables, BatchBuilder, Catalog, Error, ScanRequest, Store, StoreOptions, Value, DAY_US,
    HOUR_US,
};

/// 2025-11-21T00:00:00Z.
const T0: i64 = 1_763_683_200_000_000;

fn open(dir: &Path, node: &str) -> Result<Store, Error> {
    let mut options = StoreOptions::new(dir);
    options.node = node.into();
    Store::open(options, Catalog::new(&[&tables::SCRAPED]).unwrap())
}

/// Appends `n` rows of `scraped`, one a second from `start`, and publishes them.
fn append(store: &mut Store, start: i64, n: i64) {
    let mut b = BatchBuilder::new(&tables::SCRAPED);
    for i in 0..n {
        b.push(
            start + i * 1_000_000,
            &["", "up", ""],
            &[Value::F64(i as f64)],
        )
        .unwrap();
    }
    store.append(&b.finish()).unwrap();
    store.flush().unwrap();
}

fn parquet_names(dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    let mut stack: Vec<PathBuf> = vec![dir.join("tables")];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap().flatten() {
            if e.file_type().unwrap().is_dir() {
                stack.push(e.path());
            } else if e.path().extension().is_some_and(|x| x == "parquet") {
                out.push(e.file_name().to_string_lossy().into_owned());
            }
        }
    }
    out.sort();
    out
}

fn rows_on_disk(dir: &Path) -> usize {
    scan::scan_dir(
        dir,
        &Catalog::new(&[&tables::SCRAPED]).unwrap(),
        &ScanRequest {
            table: "scraped".into(),
            ..Default::default()
        },
    )
    .unwrap()
    .rows()
}

#[test]
fn a_node_name_with_dashes_and_digits_names_files_and_the_store() {
    for node in ["gpu-node-17", "ip-10-0-1-17.ec2.internal"] {
        let dir = tempfile::tempdir().unwrap();
        let mut store = open(dir.path(), node).unwrap();
        for h in 0..3 {
            append(&mut store, T0 + h * HOUR_US, 10);
        }
        let names = parquet_names(dir.path());
        assert_eq!(names.len(), 3, "{names:?}");
        for name in &names {
            let rest = name.strip_prefix(&format!("{node}-")).unwrap();
            let numbers: Vec<&str> = rest.strip_suffix(".parquet").unwrap().split('-').collect();
            assert_eq!(numbers.len(), 2, "{name}: <node>-<first_time_us>-<max_seq>");
            assert!(numbers.iter().all(|n| n.parse::<u64>().is_ok()), "{name}");
        }
        assert_eq!(node_of_store(dir.path()).unwrap().as_deref(), Some(node));
        // The day merge writes under the same name.
        assert_eq!(store.compact(T0 + 2 * DAY_US).unwrap(), 1);
        let names = parquet_names(dir.path());
        assert_eq!(names.len(), 1);
        assert!(names[0].starts_with(&format!("{node}-")), "{names:?}");
        assert_eq!(node_of_store(dir.path()).unwrap().as_deref(), Some(node));
        store.close().unwrap();
        assert_eq!(rows_on_disk(dir.path()), 30);
    }
}

#[test]
fn a_store_written_under_the_earlier_rule_still_reads_and_names_its_node() {
    // Before names kept their '-', the host gpu-node-17 wrote gpu_node_17-*.
    let dir = tempfile::tempdir().unwrap();
    let mut store = open(dir.path(), "gpu_node_17").unwrap();
    append(&mut store, T0, 10);
    append(&mut store, T0 + HOUR_US, 10);
    store.close().unwrap();
    assert!(parquet_names(dir.path())
        .iter()
        .all(|n| n.starts_with("gpu_node_17-")));
    assert_eq!(
        node_of_store(dir.path()).unwrap().as_deref(),
        Some("gpu_node_17")
    );
    assert_eq!(rows_on_disk(dir.path()), 20);
    // The store reopens under its old name and keeps writing.
    let mut store = open(dir.path(), "gpu_node_17").unwrap();
    append(&mut store, T0 + 2 * HOUR_US, 10);
    store.close().unwrap();
    assert_eq!(rows_on_disk(dir.path()), 30);
}

#[test]
fn the_newest_file_names_the_store_after_a_rename() {
    let dir = tempfile::tempdir().unwrap();
    let mut store = open(dir.path(), "gpu_node_17").unwrap();
    append(&mut store, T0, 10);
    store.close().unwrap();
    // Modification times of files written in the same instant can tie.
    std::thread::sleep(std::time::Duration::from_millis(20));
    let mut store = open(dir.path(), "gpu-node-17").unwrap();
    append(&mut store, T0 + HOUR_US, 10);
    store.close().unwrap();
    assert_eq!(
        node_of_store(dir.path()).unwrap().as_deref(),
        Some("gpu-node-17")
    );
}

#[test]
fn a_node_name_that_cannot_name_files_is_refused_before_anything_is_written() {
    for (node, says) in [
        ("", "cannot be empty"),
        ("rack/gpu-7", "'/' is not allowed"),
        ("..", "must start and end with a letter or digit"),
        ("gpu node 7", "' ' is not allowed"),
        ("-gpu7", "must start and end with a letter or digit"),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path().join("data");
        let err = open(&data, node).err().expect(node);
        assert!(matches!(err, Error::NodeName { .. }), "{node:?}: {err}");
        let message = err.to_string();
        assert!(message.contains(says), "{node:?}: {message}");
        assert!(!data.exists(), "{node:?}: nothing is created");
    }
    let long = "a".repeat(vtax_store::NODE_NAME_MAX_CHARS + 1);
    assert!(open(tempfile::tempdir().unwrap().path(), &long).is_err());
}

/// The longest name the rule takes names every file the store writes: the
/// pending and temporary ones of a day merge included. A 228-character name
/// passed the rule and no file could be written (ENAMETOOLONG).
#[test]
fn the_longest_node_name_names_files() {
    let node = format!("gpu-{}", "a".repeat(vtax_store::NODE_NAME_MAX_CHARS - 4));
    let dir = tempfile::tempdir().unwrap();
    let mut store = open(dir.path(), &node).unwrap();
    for h in 0..3 {
        append(&mut store, T0 + h * HOUR_US, 10);
    }
    assert_eq!(parquet_names(dir.path()).len(), 3);
    assert_eq!(store.compact(T0 + 2 * DAY_US).unwrap(), 1);
    store.close().unwrap();
    assert_eq!(rows_on_disk(dir.path()), 30);
}
