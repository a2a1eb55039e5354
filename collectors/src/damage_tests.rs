//! Every collector over fixture trees with each file damaged in turn: whatever
//! a file in /proc or /sys holds, probing, collecting and listing problems give
//! rows or errors, never a panic. The runtime catches a panic in `collect`, but
//! not in `probe`, which runs at start and on every reload, nor in `vtax doctor`.
//!
//! The collectors that read one file per value, cgroup or port (`cgroups`,
//! `infiniband`, `platform`, and `filesystem` but for its mount table) must
//! also never fail a tick over one damaged file, nor lose more than that
//! file's own row: the rest of the tree still reads.

use std::path::{Path, PathBuf};

use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};

use super::{testutil, CollectorsConfig, NAMES};

/// What a damaged file's numbers may become: empty, not a number, past every
/// integer type, negative where counts are not, and half a pressure line.
const JUNK: &[&str] = &[
    "",
    "abc",
    "-1",
    "18446744073709551616",
    "99999999999999999999999",
    "1e309",
    "NaN",
    "\0",
    "\n\n",
    "-",
    "0x",
    "4294967296",
    ":",
    "=",
    "some avg10=x",
    "full avg10=1.00 avg60=1.00 avg300=1.00 total=",
    "\u{fffd}",
    "-9223372036854775808",
];

/// Collectors that read one file per value, cgroup, port or mount: one
/// damaged file costs at most its own row.
const ISOLATING: &[&str] = &["cgroups", "infiniband", "platform", "filesystem"];

/// Rows in a tick's batches. Not `platform_gpu_affinity`'s: a PCI function
/// whose vendor, class or NUMA node file is damaged is no longer a GPU or no
/// longer near it, so all its rows there go, its own rows but more than one
/// (a damaged vendor or class file is named among the source errors).
fn rows_of(batches: &[vtax_store::Batch]) -> usize {
    batches
        .iter()
        .filter(|b| !std::ptr::eq(b.table, &super::platform::PLATFORM_GPU_AFFINITY))
        .map(|b| b.len())
        .sum()
}

/// Ways `damage` knows.
const DAMAGE_KINDS: usize = 4;

/// `original` damaged the `kind`th of four ways: emptied, cut in half, every
/// number replaced with `junk`, or `junk` in place of one token.
fn damage(original: &[u8], kind: usize, junk: &str, rng: &mut StdRng) -> Vec<u8> {
    let text = String::from_utf8_lossy(original);
    match kind {
        0 => Vec::new(),
        1 => original[..original.len() / 2].to_vec(),
        2 => text
            .split(' ')
            .map(|t| {
                if t.trim().parse::<f64>().is_ok() {
                    junk
                } else {
                    t
                }
            })
            .collect::<Vec<_>>()
            .join(" ")
            .into_bytes(),
        _ => {
            let tokens: Vec<&str> = text.split(char::is_whitespace).collect();
            let k = rng.random_range(0..tokens.len());
            let tokens: Vec<&str> = (0..tokens.len())
                .map(|i| if i == k { junk } else { tokens[i] })
                .collect();
            tokens.join(" ").into_bytes()
        }
    }
}

/// Regular files under `dir`, sorted, without following symlinks: sysfs
/// trees are full of them, some leading back up the tree, so
/// `vtax_tests::all_files`, which follows them, would loop or damage a file
/// twice through its links.
fn files_under(dir: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    let mut dirs = vec![dir.to_owned()];
    while let Some(d) = dirs.pop() {
        for entry in std::fs::read_dir(&d).unwrap().flatten() {
            let kind = entry.file_type().unwrap();
            if kind.is_dir() {
                dirs.push(entry.path());
            } else if kind.is_file() {
                files.push(entry.path());
            }
        }
    }
    files.sort();
    files
}

#[test]
fn damaged_sources_give_errors_never_panics() {
    // Not `gpu` (its simulated backend reads no files), `perf` (the PMU),
    // `jitter` (a probe, not a reader) or `scrape` (HTTP; its parser has its
    // own tests).
    let readers: Vec<&str> = NAMES
        .iter()
        .copied()
        .filter(|n| !matches!(*n, "gpu" | "perf" | "jitter" | "scrape"))
        .collect();
    let nodes = ["baremetal-node", "vm-node", "k8s-node", "nvme-vm-node"];
    // Each tree's files in two halves, a thread each on a copy of its own:
    // a minute's work on one core, and the trees differ tenfold in size.
    let readers = &readers;
    let outcomes: Vec<(usize, Vec<String>)> = std::thread::scope(|scope| {
        let threads: Vec<_> = (0..nodes.len() * 2)
            .map(|job| {
                let (node, half) = (nodes[job / 2], job % 2);
                scope.spawn(move || damage_each_file(node, half, readers, job as u64))
            })
            .collect();
        threads.into_iter().map(|t| t.join().unwrap()).collect()
    });
    let rounds: usize = outcomes.iter().map(|o| o.0).sum();
    let panics: Vec<String> = outcomes.into_iter().flat_map(|o| o.1).collect();
    assert!(
        panics.is_empty(),
        "{} panics or lost reads in {rounds} damaged trees: {panics:#?}",
        panics.len()
    );
}

/// Damages each file of fixture tree `node` in `half` (0: the even-numbered
/// files, 1: the odd) each way in turn, running the `readers` over the tree
/// each time. Returns the trees tried and what panicked, or, for the
/// [`ISOLATING`] collectors, failed a tick or lost more than one row. The
/// junk is seeded, so a failure repeats.
fn damage_each_file(node: &str, half: usize, readers: &[&str], seed: u64) -> (usize, Vec<String>) {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut panics = Vec::new();
    let mut rounds = 0;
    let tree = tempfile::tempdir().unwrap();
    testutil::copy_tree(&testutil::node(node), tree.path());
    let roots = testutil::roots(tree.path());
    // Rows each isolating collector reads from the intact tree.
    let intact: Vec<(&str, usize)> = ISOLATING
        .iter()
        .map(|&name| {
            let mut collector = CollectorsConfig::default().build(name, &roots).unwrap();
            collector.probe();
            let rows = collector
                .collect(1_700_000_000_000_000)
                .map(|b| rows_of(&b));
            (name, rows.unwrap_or(0))
        })
        .collect();
    // Every file, each way: a file left out is a parser left untried.
    for file in files_under(tree.path()).into_iter().skip(half).step_by(2) {
        let original = std::fs::read(&file).unwrap();
        for kind in 0..DAMAGE_KINDS {
            rounds += 1;
            let junk = JUNK[rng.random_range(0..JUNK.len())];
            std::fs::write(&file, damage(&original, kind, junk, &mut rng)).unwrap();
            for &name in readers {
                let rel = file.strip_prefix(tree.path()).unwrap();
                // The mount table is the filesystem collector's one source.
                let isolating = intact
                    .iter()
                    .find(|(n, rows)| *n == name && *rows > 0)
                    .filter(|_| !(name == "filesystem" && rel.ends_with("mountinfo")));
                let outcome = std::panic::catch_unwind(|| {
                    let mut collector = CollectorsConfig::default().build(name, &roots).unwrap();
                    collector.probe();
                    let mut lost = None;
                    // Two ticks: the second takes differences.
                    for tick in 0..2 {
                        let result = collector.collect(1_700_000_000_000_000 + tick * 1_000_000);
                        collector.problems();
                        if let Some((_, rows)) = isolating {
                            match result {
                                Err(e) => lost = Some(format!("the tick failed: {e:#}")),
                                Ok(b) if rows_of(&b) + 1 < *rows => {
                                    lost = Some(format!("{} of {rows} rows", rows_of(&b)))
                                }
                                Ok(_) => {}
                            }
                        }
                    }
                    lost
                });
                match outcome {
                    Err(_) => panics.push(format!(
                        "{node} {name}: {}, damage {kind}, {junk:?}",
                        rel.display()
                    )),
                    Ok(Some(lost)) => panics.push(format!(
                        "{node} {name}: {}, damage {kind}, {junk:?}: {lost}",
                        rel.display()
                    )),
                    Ok(None) => {}
                }
            }
        }
        std::fs::write(&file, original).unwrap();
    }
    (rounds, panics)
}
