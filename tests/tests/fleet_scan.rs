//! Scans of a fleet copy (`tables/<table>/node=<node>/date=.../`): each node read
//! on its own, and files that a merged file replaces, copied along by an upload
//! made between a merge and its clean-up, read once, not twice.

use std::path::Path;
use std::time::Duration;

use vtax_store::scan::{fleet_nodes, scan_fleet_node};
use vtax_store::tables::ScrapedRow;
use vtax_store::{ScanRequest, Store, StoreOptions, DAY_US, HOUR_US};
use vtax_tests::{catalog, value_counts, T0};

fn rows_at(time_us: i64, ids: std::ops::Range<u64>) -> vtax_store::Batch {
    let mut b = vtax_store::BatchBuilder::new(&vtax_store::tables::SCRAPED);
    for id in ids {
        let row = ScrapedRow {
            target: "",
            metric: "m",
            labels: "l=\"x\"",
            value: Some(id as f64),
        };
        b.push_row(time_us, &row).unwrap();
    }
    b.finish()
}

/// Copies a node's `tables/` into the fleet layout under `root`.
fn upload(store_dir: &Path, node: &str, root: &Path) {
    for table in std::fs::read_dir(store_dir.join("tables")).unwrap() {
        let table = table.unwrap();
        for part in std::fs::read_dir(table.path()).unwrap() {
            let part = part.unwrap();
            let to = root
                .join("tables")
                .join(table.file_name())
                .join(format!("node={node}"))
                .join(part.file_name());
            std::fs::create_dir_all(&to).unwrap();
            for file in std::fs::read_dir(part.path()).unwrap() {
                let file = file.unwrap();
                std::fs::copy(file.path(), to.join(file.file_name())).unwrap();
            }
        }
    }
}

#[test]
fn each_node_of_a_fleet_copy_reads_once_with_replaced_files_ignored() {
    let fleet = tempfile::tempdir().unwrap();
    // Node a: two hours of rows, then its day merged into one file; the merge's
    // inputs are put back beside it, as a kill before their removal leaves them.
    let a = tempfile::tempdir().unwrap();
    let mut options = StoreOptions::new(a.path());
    options.node = "a".into();
    options.publish_grace = Duration::ZERO;
    let mut store = Store::open(options, catalog()).unwrap();
    store.append(&rows_at(T0 + 600_000_000, 0..10)).unwrap();
    store.flush().unwrap();
    store
        .append(&rows_at(T0 + HOUR_US + 600_000_000, 10..30))
        .unwrap();
    store.flush().unwrap();
    let inputs: Vec<_> = vtax_tests::table_files(a.path())
        .parquet
        .into_iter()
        .map(|p| (p.clone(), std::fs::read(&p).unwrap()))
        .collect();
    assert_eq!(inputs.len(), 2);
    assert_eq!(store.compact(T0 + 2 * DAY_US).unwrap(), 1);
    store.close().unwrap();
    for (path, bytes) in &inputs {
        std::fs::write(path, bytes).unwrap();
    }
    upload(a.path(), "a", fleet.path());
    // Node b: ten rows in hour 0.
    let b = tempfile::tempdir().unwrap();
    let mut options = StoreOptions::new(b.path());
    options.node = "b".into();
    let mut store = Store::open(options, catalog()).unwrap();
    store.append(&rows_at(T0 + 60_000_000, 100..110)).unwrap();
    store.close().unwrap();
    upload(b.path(), "b", fleet.path());

    assert_eq!(fleet_nodes(fleet.path()).unwrap(), ["a", "b"]);
    assert_eq!(
        vtax_store::files::node_of_store(a.path())
            .unwrap()
            .as_deref(),
        Some("a")
    );
    assert_eq!(
        vtax_store::files::node_of_store(fleet.path()).unwrap(),
        None,
        "no date= level"
    );
    assert!(
        fleet_nodes(a.path()).unwrap().is_empty(),
        "a node's store has no node= level"
    );
    let scan = |node: &str, from_us: Option<i64>| {
        let request = ScanRequest {
            table: "scraped".into(),
            from_us,
            ..Default::default()
        };
        scan_fleet_node(fleet.path(), node, &catalog(), &request).unwrap()
    };
    let counts = value_counts(&scan("a", None));
    assert!(
        counts.missing_in(0..30).is_empty()
            && counts.duplicates().is_empty()
            && counts.distinct() == 30,
        "node a: missing {:?}, duplicated {:?}",
        counts.missing_in(0..30),
        counts.duplicates()
    );
    let counts = value_counts(&scan("b", None));
    assert!(counts.missing_in(100..110).is_empty() && counts.distinct() == 10);
    // A time filter: node a's second hour only.
    assert_eq!(scan("a", Some(T0 + HOUR_US)).rows(), 20);
    // A node not in the copy reads as empty, not as an error.
    assert_eq!(scan("c", None).rows(), 0);
}
