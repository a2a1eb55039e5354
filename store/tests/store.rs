//! Behaviour of the store through its public API.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};

use arrow_array::cast::AsArray;
use arrow_array::types::{Float64Type, Int32Type, TimestampMicrosecondType};
use arrow_array::Array;
use std::sync::atomic::AtomicBool;
use std::time::Duration;
use vtax_store::schema::{FieldDef, FieldType, MetricKind, TableDef, TagDef, Unit};

use vtax_store::{
    scan, tables, BatchBuilder, Catalog, Compactor, Error, ScanRequest, Store, StoreOptions, Value,
    DAY_US, HOUR_US,
};

/// 2025-11-21T00:00:00Z.
const T0: i64 = 1_763_683_200_000_000;

static GPU_V1: TableDef = TableDef {
    name: "gpu",
    help: "Test table.",
    tags: &[TagDef {
        name: "gpu",
        help: "Index.",
    }],
    fields: &[FieldDef {
        name: "power_watts",
        ty: FieldType::F64,
        kind: MetricKind::Gauge,
        unit: Unit::Watts,
        help: "Power.",
    }],
    exported: true,
};

static GPU_V2: TableDef = TableDef {
    name: "gpu",
    help: "Test table with a field added.",
    tags: &[TagDef {
        name: "gpu",
        help: "Index.",
    }],
    fields: &[
        FieldDef {
            name: "power_watts",
            ty: FieldType::F64,
            kind: MetricKind::Gauge,
            unit: Unit::Watts,
            help: "Power.",
        },
        FieldDef {
            name: "energy_joules",
            ty: FieldType::U64,
            kind: MetricKind::Counter,
            unit: Unit::Joules,
            help: "Energy.",
        },
    ],
    exported: true,
};

fn options(dir: &Path) -> StoreOptions {
    let mut o = StoreOptions::new(dir);
    o.node = "test".into();
    o
}

fn open(dir: &Path) -> Store {
    Store::open(
        options(dir),
        Catalog::new(&[&tables::SCRAPED, &GPU_V1]).unwrap(),
    )
    .unwrap()
}

/// Appends `n` rows of `scraped` from `start`, one per second, over 4 series,
/// with values whose bits are awkward (negative zero, subnormal, NaN payload).
fn append_scraped(store: &mut Store, start: i64, n: usize) -> Vec<(i64, String, u64)> {
    let mut b = BatchBuilder::new(&tables::SCRAPED);
    let mut rows = Vec::new();
    for i in 0..n {
        let t = start + (i as i64 / 4) * 1_000_000;
        let labels = format!("cpu=\"{}\"", i % 4);
        let v = match i % 5 {
            0 => -0.0,
            1 => f64::from_bits(1),
            2 => f64::from_bits(0x7ff8_0000_0000_0abc),
            _ => i as f64 * 1.1,
        };
        b.push(
            t,
            &["", "node_cpu_seconds_total", &labels],
            &[Value::F64(v)],
        )
        .unwrap();
        rows.push((t, labels, v.to_bits()));
    }
    store.append(&b.finish()).unwrap();
    rows
}

fn scraped_rows(result: &vtax_store::ScanResult) -> Vec<(i64, String, u64)> {
    let mut out = Vec::new();
    for batch in &result.batches {
        let time = batch.column(0).as_primitive::<TimestampMicrosecondType>();
        let labels = batch.column(3).as_dictionary::<Int32Type>();
        let label_values = labels.values().as_string::<i32>();
        let value = batch.column(4).as_primitive::<Float64Type>();
        for i in 0..batch.num_rows() {
            let l = label_values
                .value(labels.keys().value(i) as usize)
                .to_string();
            out.push((time.value(i), l, value.value(i).to_bits()));
        }
    }
    out.sort();
    out
}

fn all_scraped(store: &Store) -> Vec<(i64, String, u64)> {
    scraped_rows(
        &store
            .scan(&ScanRequest {
                table: "scraped".into(),
                ..Default::default()
            })
            .unwrap(),
    )
}

/// Files under `dir`, at any depth, whose names end in `.extension`, sorted.
fn files_under(dir: &Path, extension: &str) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_owned()];
    while let Some(d) = stack.pop() {
        for e in fs::read_dir(&d).into_iter().flatten().flatten() {
            if e.file_type().unwrap().is_dir() {
                stack.push(e.path());
            } else if e.path().extension().is_some_and(|x| x == extension) {
                out.push(e.path());
            }
        }
    }
    out.sort();
    out
}

fn parquet_files(dir: &Path) -> Vec<std::path::PathBuf> {
    files_under(&dir.join("tables"), "parquet")
}

#[test]
fn rows_come_back_bit_for_bit_from_memory_and_from_files() {
    let dir = tempfile::tempdir().unwrap();
    let mut store = open(dir.path());
    let mut expected = append_scraped(&mut store, T0, 1000);
    expected.sort();
    assert_eq!(all_scraped(&store), expected, "buffered rows are visible");
    store.flush().unwrap();
    assert_eq!(store.buffered_rows(), 0);
    assert_eq!(
        all_scraped(&store),
        expected,
        "published rows read back exactly"
    );
    let files = parquet_files(dir.path());
    assert_eq!(files.len(), 1);
    assert!(files[0]
        .to_string_lossy()
        .contains("tables/scraped/date=2025-11-21/test-"));
}

#[test]
fn rows_spanning_hours_become_one_file_per_hour() {
    let dir = tempfile::tempdir().unwrap();
    let mut store = open(dir.path());
    // 3 hours of 1 s samples across 4 series, in one batch.
    append_scraped(&mut store, T0, 4 * 3 * 3600);
    store.flush().unwrap();
    assert_eq!(parquet_files(dir.path()).len(), 3);
    let one_hour = store
        .scan(&ScanRequest {
            table: "scraped".into(),
            from_us: Some(T0 + HOUR_US),
            until_us: Some(T0 + 2 * HOUR_US),
            tag_equals: vec![("labels".into(), "cpu=\"2\"".into())],
            fields: None,
            fields_only: false,
            skip_damaged: false,
        })
        .unwrap();
    assert_eq!(one_hour.rows(), 3600);
    assert_eq!(
        one_hour.files_skipped, 2,
        "the other hours' files are pruned by statistics"
    );
}

#[test]
fn a_crash_after_sync_loses_nothing_and_duplicates_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let mut expected;
    {
        let mut store = open(dir.path());
        expected = append_scraped(&mut store, T0, 400);
        store.sync().unwrap();
        // Dropped without flush: as if killed after the fsync.
    }
    {
        let mut store = open(dir.path());
        assert_eq!(store.stats().rows_replayed, 400);
        expected.extend(append_scraped(&mut store, T0 + 500_000_000, 400));
        // Publish this hour, then "crash" before the WAL is truncated: replay must
        // not put the published rows back.
        store.flush().unwrap();
    }
    expected.sort();
    let store = open(dir.path());
    assert_eq!(store.stats().rows_replayed, 0);
    assert_eq!(all_scraped(&store), expected);
}

#[test]
fn replay_skips_frames_already_in_files_even_when_the_wal_was_kept() {
    let dir = tempfile::tempdir().unwrap();
    let expected;
    {
        let mut store = open(dir.path());
        expected = append_scraped(&mut store, T0, 100);
        store.sync().unwrap();
        let wal_copy: Vec<_> = fs::read_dir(dir.path().join("wal"))
            .unwrap()
            .map(|e| {
                let p = e.unwrap().path();
                (p.clone(), fs::read(&p).unwrap())
            })
            .collect();
        store.flush().unwrap();
        // Put the WAL back as it was before publishing: a crash between rename and truncation.
        for (p, bytes) in wal_copy {
            fs::write(p, bytes).unwrap();
        }
    }
    let store = open(dir.path());
    let mut expected = expected;
    expected.sort();
    assert_eq!(all_scraped(&store), expected);
}

#[test]
fn a_field_added_later_reads_as_null_in_old_files() {
    let dir = tempfile::tempdir().unwrap();
    {
        let mut store = open(dir.path());
        let mut b = BatchBuilder::new(&GPU_V1);
        for g in 0..3 {
            b.push(T0, &[&g.to_string()], &[Value::F64(100.0 + g as f64)])
                .unwrap();
        }
        store.append(&b.finish()).unwrap();
        store.close().unwrap();
    }
    let mut store = Store::open(
        options(dir.path()),
        Catalog::new(&[&tables::SCRAPED, &GPU_V2]).unwrap(),
    )
    .unwrap();
    let mut b = BatchBuilder::new(&GPU_V2);
    b.push(T0 + 1_000_000, &["0"], &[Value::F64(1.5), Value::U64(42)])
        .unwrap();
    store.append(&b.finish()).unwrap();
    let result = store
        .scan(&ScanRequest {
            table: "gpu".into(),
            ..Default::default()
        })
        .unwrap();
    assert_eq!(result.rows(), 4);
    let energies = sorted_energies(&result);
    assert_eq!(energies, vec![None, None, None, Some(42)]);

    // Merged into one file, the old rows still lack the field.
    store.flush().unwrap();
    assert_eq!(store.compact(T0 + 2 * DAY_US).unwrap(), 1);
    let gpu_files: Vec<_> = store.files().filter(|f| f.table == "gpu").collect();
    assert_eq!(gpu_files.len(), 1);
    let result = store
        .scan(&ScanRequest {
            table: "gpu".into(),
            ..Default::default()
        })
        .unwrap();
    assert_eq!(sorted_energies(&result), energies);
}

/// The `energy` column of a `gpu` scan, sorted, nulls first.
fn sorted_energies(result: &vtax_store::ScanResult) -> Vec<Option<u64>> {
    let mut energies = Vec::new();
    for batch in &result.batches {
        let e = batch
            .column(3)
            .as_primitive::<arrow_array::types::UInt64Type>();
        for i in 0..batch.num_rows() {
            energies.push(e.is_valid(i).then(|| e.value(i)));
        }
    }
    energies.sort();
    energies
}

#[test]
fn a_day_of_hour_files_merges_at_most_eight_at_a_time() {
    // 24 to 3 to 1: each merge holds the keys of eight inputs open, not 24.
    let (merges, file) = merge_a_day_of_hour_files(|_| {});
    assert_eq!(merges, 3 + 1);
    // It merged three files, and names the hours those merged too.
    assert_eq!(file.compacted_intermediates.len(), 3);
    assert_eq!(file.compacted_from.len(), 3 + 24);
}

#[test]
fn a_smaller_fan_in_merges_a_day_in_more_rounds() {
    // 24 to 6 to 2 to 1: fewer inputs held at once, one more round.
    let (merges, file) = merge_a_day_of_hour_files(|o| o.max_merge_inputs = 4);
    assert_eq!(merges, 6 + 2 + 1);
    assert_eq!(file.compacted_intermediates.len(), 6 + 2);
    assert_eq!(file.compacted_from.len(), 6 + 2 + 24);
}

/// Writes an hour file for each hour of a day with `configure`'s options and
/// compacts the day; checks that one file holding every row of every hour is
/// left. Returns the merges it took and that file.
fn merge_a_day_of_hour_files(
    configure: impl Fn(&mut StoreOptions),
) -> (usize, vtax_store::files::FileInfo) {
    let dir = tempfile::tempdir().unwrap();
    let mut o = options(dir.path());
    configure(&mut o);
    let mut store = Store::open(o, Catalog::new(&[&tables::SCRAPED]).unwrap()).unwrap();
    let expected = hour_files(&mut store, 24);
    assert_eq!(parquet_files(dir.path()).len(), 24);
    let merges = store.compact(T0 + 2 * DAY_US).unwrap();
    let files: Vec<_> = store.files().cloned().collect();
    assert_eq!(files.len(), 1);
    assert_eq!(files[0].watermarks.len(), 24, "it holds every hour");
    assert_eq!(all_scraped(&store), expected);
    (merges, files.into_iter().next().unwrap())
}

#[test]
fn a_corrupt_file_is_quarantined_and_the_rest_stays_readable() {
    let dir = tempfile::tempdir().unwrap();
    {
        let mut store = open(dir.path());
        append_scraped(&mut store, T0, 40);
        store.flush().unwrap();
        append_scraped(&mut store, T0 + HOUR_US, 40);
        // Killed after publishing: the WAL still holds both hours' frames.
        store.flush().unwrap();
    }
    let files = parquet_files(dir.path());
    assert_eq!(files.len(), 2);
    let bad = &files[0];
    let mut bytes = fs::read(bad).unwrap();
    let n = bytes.len();
    bytes[n - 12..n - 4].fill(0xff); // smash the footer
    fs::write(bad, bytes).unwrap();
    // With the WAL gone (long since truncated), the other file is still read.
    let wal = dir.path().join("wal");
    let saved_wal = dir.path().join("wal.saved");
    fs::rename(&wal, &saved_wal).unwrap();
    // A reader beside the store fails, naming it; told to, it leaves it
    // out and names it.
    let catalog = Catalog::new(&[&tables::SCRAPED, &GPU_V1]).unwrap();
    let mut request = ScanRequest {
        table: "scraped".into(),
        ..Default::default()
    };
    let error = scan::scan_dir(dir.path(), &catalog, &request).unwrap_err();
    assert_eq!(error.damaged_file(), Some(bad.as_path()), "{error}");
    request.skip_damaged = true;
    let beside = scan::scan_dir(dir.path(), &catalog, &request).unwrap();
    assert_eq!(beside.rows(), 40);
    assert_eq!(beside.damaged_files.len(), 1);
    assert_eq!(&beside.damaged_files[0].0, bad);
    {
        let store = open(dir.path());
        assert_eq!(store.stats().files_quarantined, 1);
        assert_eq!(all_scraped(&store).len(), 40);
    }
    let quarantined = dir
        .path()
        .join("quarantine/scraped/date=2025-11-21")
        .join(bad.file_name().unwrap());
    assert!(quarantined.exists(), "kept, not deleted");
    // While the WAL still holds the rows of a quarantined file, replay restores them.
    let other = parquet_files(dir.path());
    fs::remove_dir_all(&wal).unwrap();
    fs::rename(&saved_wal, &wal).unwrap();
    let store = open(dir.path());
    assert_eq!(all_scraped(&store).len(), 80);
    assert_eq!(parquet_files(dir.path()), other);
}

/// Five hour files merged into one day file, the store closed.
struct MergedDay {
    /// Its rows, sorted.
    rows: Vec<(i64, String, u64)>,
    /// Each input as it was.
    inputs: Vec<(PathBuf, Vec<u8>)>,
    /// The merged file.
    merged: PathBuf,
}

fn a_merged_day(dir: &Path) -> MergedDay {
    let mut expected = Vec::new();
    let mut store = open(dir);
    for h in 0..5 {
        expected.extend(append_scraped(&mut store, T0 + h * HOUR_US, 80));
        store.flush().unwrap();
    }
    let inputs: Vec<(PathBuf, Vec<u8>)> = parquet_files(dir)
        .into_iter()
        .map(|p| (p.clone(), fs::read(&p).unwrap()))
        .collect();
    assert_eq!(inputs.len(), 5);
    assert_eq!(
        store.compact(T0 + DAY_US / 2).unwrap(),
        0,
        "a day still running is left alone"
    );
    assert_eq!(store.compact(T0 + 2 * DAY_US).unwrap(), 1);
    let merged = parquet_files(dir);
    assert_eq!(merged.len(), 1);
    expected.sort();
    assert_eq!(all_scraped(&store), expected);
    store.close().unwrap();
    MergedDay {
        rows: expected,
        inputs,
        merged: merged[0].clone(),
    }
}

/// Writes the inputs of a merge back beside it, as a kill after the merged
/// file was published and before its inputs were removed leaves them.
fn put_back(inputs: &[(PathBuf, Vec<u8>)]) {
    for (path, bytes) in inputs {
        fs::write(path, bytes).unwrap();
    }
}

#[test]
fn compaction_merges_a_day_and_an_interrupted_one_finishes_on_open() {
    let dir = tempfile::tempdir().unwrap();
    let MergedDay {
        rows: expected,
        inputs,
        ..
    } = a_merged_day(dir.path());
    put_back(&inputs);
    assert_eq!(parquet_files(dir.path()).len(), 6);
    assert_eq!(
        scraped_on_disk(dir.path()),
        expected,
        "a reader ignores the replaced files"
    );
    let store = open(dir.path());
    assert_eq!(
        parquet_files(dir.path()).len(),
        1,
        "open removes the replaced files"
    );
    assert_eq!(all_scraped(&store), expected);
}

/// A kill left a merged file beside its inputs, and the merged file was
/// damaged since (a zeroed block, a failing disk) with its footer intact:
/// open used to delete the inputs on the strength of the footer, leaving
/// only pages that do not decode. It reads the merged file whole first: the
/// damaged one goes to quarantine, and the inputs stay with every row.
#[test]
fn a_damaged_merged_file_does_not_replace_its_inputs() {
    let dir = tempfile::tempdir().unwrap();
    let MergedDay {
        rows: expected,
        inputs,
        merged,
    } = a_merged_day(dir.path());
    let mut bytes = fs::read(&merged).unwrap();
    // A data page of the first column, the footer left whole.
    bytes[8..40].fill(0);
    fs::write(&merged, bytes).unwrap();
    put_back(&inputs);
    let store = open(dir.path());
    assert_eq!(store.stats().files_quarantined, 1);
    assert_eq!(all_scraped(&store), expected, "every input's row is kept");
    let live = parquet_files(dir.path());
    assert_eq!(live.len(), 5, "{live:?}");
    assert!(inputs.iter().all(|(p, _)| live.contains(p)));
    let quarantined = dir
        .path()
        .join("quarantine/scraped/date=2025-11-21")
        .join(merged.file_name().unwrap());
    assert!(quarantined.exists(), "kept for whoever looks into it");
    drop(store);
    // A second open finds nothing left to do, and the rows are all there.
    let store = open(dir.path());
    assert_eq!(store.stats().files_quarantined, 0);
    assert_eq!(all_scraped(&store), expected);
}

fn mkfifo(path: &Path) {
    let c_path = std::ffi::CString::new(path.to_str().unwrap()).unwrap();
    // SAFETY: a valid C string; mkfifo touches no memory of ours.
    assert_eq!(
        unsafe { libc::mkfifo(c_path.as_ptr(), 0o600) },
        0,
        "{path:?}"
    );
}

/// Runs `body` on a thread of its own and fails if it has not returned in
/// 20 s: an open that waits on a FIFO never returns.
fn within_20s<T: Send + 'static>(what: &str, body: impl FnOnce() -> T + Send + 'static) -> T {
    let (sender, receiver) = std::sync::mpsc::channel();
    std::thread::spawn(move || sender.send(body()));
    receiver
        .recv_timeout(Duration::from_secs(20))
        .unwrap_or_else(|_| panic!("{what} waited on a FIFO"))
}

/// A FIFO under the name of a WAL segment, a Parquet file or the lock: its
/// open waited for a writer for ever, so the agent never started (deaf to
/// SIGTERM) and query, verify and compact hung. None is waited on: a
/// segment or a file that is no regular file is left out, a lock that is
/// none is an error naming it.
#[test]
fn a_fifo_under_a_store_files_name_is_never_waited_on() {
    let dir = tempfile::tempdir().unwrap();
    let expected = {
        let mut store = open(dir.path());
        let rows = append_scraped(&mut store, T0, 40);
        store.flush().unwrap();
        store.close().unwrap();
        rows
    };
    let files = parquet_files(dir.path());
    mkfifo(&dir.path().join("wal/00000000000000099999.wal"));
    let partition = files[0].parent().unwrap().to_path_buf();
    mkfifo(&partition.join(".vm-1763683200000000-1.parquet"));
    let path = dir.path().to_path_buf();
    let node = within_20s("node_of_store", move || {
        vtax_store::files::node_of_store(&path)
    });
    assert!(node.unwrap().is_some());
    let path = dir.path().to_path_buf();
    let rows = within_20s("open", move || {
        let store = open(&path);
        let rows = all_scraped(&store);
        (rows, store.stats().files_quarantined)
    });
    assert_eq!(rows, (expected, 1), "the FIFO file goes to quarantine");
    let lock = dir.path().join("LOCK");
    fs::remove_file(&lock).unwrap();
    mkfifo(&lock);
    let path = dir.path().to_path_buf();
    let error = within_20s("open with a FIFO lock", move || {
        vtax_store::Store::open(options(&path), Catalog::new(&[&tables::SCRAPED]).unwrap())
            .err()
            .map(|e| e.to_string())
    });
    let error = error.expect("a lock that is no file is an error");
    assert!(
        error.contains("LOCK") && error.contains("not a regular file"),
        "{error}"
    );
}

/// A link that leads nowhere under a Parquet file's name read as a file a
/// merge had just removed: every scan of its table retried until it gave up
/// ("changed under the read"), with or without `skip_damaged`. It is a
/// damaged file: left out and named, and quarantined at open.
#[test]
fn a_dangling_link_under_a_file_name_is_damage_not_a_race() {
    let dir = tempfile::tempdir().unwrap();
    let expected = {
        let mut store = open(dir.path());
        let rows = append_scraped(&mut store, T0, 40);
        store.flush().unwrap();
        store.close().unwrap();
        rows
    };
    let partition = parquet_files(dir.path())[0].parent().unwrap().to_path_buf();
    let link = partition.join(".vm-1763683200000000-9.parquet");
    std::os::unix::fs::symlink(dir.path().join("nowhere.parquet"), &link).unwrap();
    let catalog = Catalog::new(&[&tables::SCRAPED]).unwrap();
    let mut request = ScanRequest {
        table: "scraped".into(),
        ..Default::default()
    };
    let error = scan::scan_dir(dir.path(), &catalog, &request).unwrap_err();
    assert_eq!(error.damaged_file(), Some(link.as_path()), "{error}");
    request.skip_damaged = true;
    let beside = scan::scan_dir(dir.path(), &catalog, &request).unwrap();
    assert_eq!(scraped_rows(&beside), expected);
    assert_eq!(beside.damaged_files.len(), 1);
    let store = open(dir.path());
    assert_eq!(store.stats().files_quarantined, 1);
    assert_eq!(all_scraped(&store), expected);
}

/// A damaged WAL segment is copied to quarantine at open; a FIFO under the
/// copy's partial name made that copy wait for a reader, and the start with
/// it, and a directory where the copy goes failed the start. The copy is a
/// courtesy: neither stops the open, which replays every intact frame.
#[test]
fn what_lies_in_quarantines_way_does_not_stop_an_open() {
    for in_the_way in ["fifo", "directory"] {
        let dir = tempfile::tempdir().unwrap();
        let mut expected = Vec::new();
        {
            let mut store = open(dir.path());
            for i in 0..3 {
                expected.extend(append_scraped(&mut store, T0 + i * 1_000_000, 40));
                store.sync().unwrap();
            }
        }
        let segment = files_under(&dir.path().join("wal"), "wal")[0].clone();
        let mut bytes = fs::read(&segment).unwrap();
        // A byte of the first frame's rows: the frames after it are intact.
        bytes[40] ^= 0x10;
        fs::write(&segment, &bytes).unwrap();
        let target = dir
            .path()
            .join("quarantine/wal")
            .join(segment.file_name().unwrap());
        fs::create_dir_all(target.parent().unwrap()).unwrap();
        match in_the_way {
            "fifo" => mkfifo(&target.with_extension("copying")),
            _ => fs::create_dir(&target).unwrap(),
        }
        let path = dir.path().to_path_buf();
        let rows = within_20s(in_the_way, move || all_scraped(&open(&path)));
        assert_eq!(rows.len(), 80, "{in_the_way}: the intact frames' rows");
        assert!(rows.iter().all(|row| expected.contains(row)));
    }
}

/// A README under `tables/`, or a file under a partition's name, holds
/// nothing of the store: the listing failed on it (not a directory), and
/// with it the agent's start and every command, query and verify included.
#[test]
fn a_stray_file_among_the_tables_is_passed_over() {
    let dir = tempfile::tempdir().unwrap();
    let expected = {
        let mut store = open(dir.path());
        let rows = append_scraped(&mut store, T0, 40);
        store.flush().unwrap();
        store.close().unwrap();
        rows
    };
    fs::write(dir.path().join("tables/README"), "notes").unwrap();
    fs::write(dir.path().join("tables/scraped/date=2025-11-22"), "x").unwrap();
    let catalog = Catalog::new(&[&tables::SCRAPED]).unwrap();
    let request = ScanRequest {
        table: "scraped".into(),
        ..Default::default()
    };
    let beside = scan::scan_dir(dir.path(), &catalog, &request).unwrap();
    assert_eq!(scraped_rows(&beside), expected);
    let store = open(dir.path());
    assert_eq!(all_scraped(&store), expected);
    assert_eq!(store.stats().files_quarantined, 0);
}

#[test]
fn retention_deletes_oldest_days_by_age_and_by_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let mut o = options(dir.path());
    let mut store = Store::open(o.clone(), Catalog::new(&[&tables::SCRAPED]).unwrap()).unwrap();
    for d in 0..4 {
        append_scraped(&mut store, T0 + d * DAY_US, 400);
        store.flush().unwrap();
    }
    store.close().unwrap();
    o.retention_max_age = Some(std::time::Duration::from_secs(2 * 86_400));
    let mut store = Store::open(o.clone(), Catalog::new(&[&tables::SCRAPED]).unwrap()).unwrap();
    // Now is the start of day 4: days 0 and 1 ended 2 or more days ago.
    assert_eq!(store.apply_retention(T0 + 4 * DAY_US).unwrap(), 2);
    let days: BTreeMap<String, usize> = parquet_files(dir.path())
        .iter()
        .map(|p| {
            (
                p.parent()
                    .unwrap()
                    .file_name()
                    .unwrap()
                    .to_string_lossy()
                    .into_owned(),
                1,
            )
        })
        .collect();
    assert_eq!(
        days.keys().cloned().collect::<Vec<_>>(),
        ["date=2025-11-23", "date=2025-11-24"]
    );
    let newest = fs::metadata(&parquet_files(dir.path())[1]).unwrap().len();
    store.close().unwrap();
    o.retention_max_age = None;
    o.retention_max_bytes = Some(newest);
    let mut store = Store::open(o, Catalog::new(&[&tables::SCRAPED]).unwrap()).unwrap();
    assert_eq!(store.apply_retention(T0 + 4 * DAY_US).unwrap(), 1);
    assert_eq!(store.stats().files_retained_away, 1);
    let left = parquet_files(dir.path());
    assert_eq!(left.len(), 1);
    assert!(
        left[0].to_string_lossy().contains("2025-11-24"),
        "the newest day stays"
    );
}

vtax_store::table! {
    static EARLY_NAME: TableDef, struct EarlyNameRow {
        name: "aaa_gauge",
        help: "A table whose name sorts before every other.",
        tags: [n = TagDef { name: "n", help: "row" }],
        fields: [v: f64 = FieldDef::gauge(FieldType::F64, Unit::None, "x")],
        exported: true,
    }
}

/// Over its byte budget, the store gives up its oldest rows whichever table
/// holds them: a partition at a time in table-name order, a table whose name
/// sorts first lost its newest file before an older file of another.
#[test]
fn retention_by_bytes_deletes_the_oldest_file_of_any_table() {
    let dir = tempfile::tempdir().unwrap();
    let mut o = options(dir.path());
    let catalog = || Catalog::new(&[&tables::SCRAPED, &EARLY_NAME]).unwrap();
    let mut store = Store::open(o.clone(), catalog()).unwrap();
    append_scraped(&mut store, T0, 400);
    store.flush().unwrap();
    let mut newer = BatchBuilder::new(&EARLY_NAME);
    for i in 0..400 {
        let row = EarlyNameRow {
            n: "1",
            v: i as f64,
        };
        newer
            .push_row(T0 + 10 * HOUR_US + i * 1_000_000, &row)
            .unwrap();
    }
    store.append(&newer.finish()).unwrap();
    store.flush().unwrap();
    store.close().unwrap();
    let files = parquet_files(dir.path());
    assert_eq!(files.len(), 2, "{files:?}");
    let newest = files
        .iter()
        .find(|p| p.to_string_lossy().contains("aaa_gauge"))
        .unwrap();
    o.retention_max_bytes = Some(fs::metadata(newest).unwrap().len());
    let mut store = Store::open(o, catalog()).unwrap();
    assert_eq!(store.apply_retention(T0 + DAY_US).unwrap(), 1);
    let left = parquet_files(dir.path());
    assert_eq!(left.len(), 1);
    assert!(
        left[0].to_string_lossy().contains("aaa_gauge"),
        "the newer file stays: {left:?}"
    );
}

#[test]
fn a_second_writer_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let _store = open(dir.path());
    let err = Store::open(
        options(dir.path()),
        Catalog::new(&[&tables::SCRAPED]).unwrap(),
    )
    .err()
    .unwrap();
    assert!(
        err.to_string()
            .contains("open for writing by another process"),
        "{err}"
    );
}

#[test]
fn a_reader_beside_the_writer_sees_rows_still_in_the_wal() {
    let dir = tempfile::tempdir().unwrap();
    let mut store = open(dir.path());
    let mut first = append_scraped(&mut store, T0, 100);
    store.flush().unwrap();
    first.extend(append_scraped(&mut store, T0 + 1_000_000_000, 100));
    store.sync().unwrap();
    first.sort();
    let catalog = Catalog::new(&[&tables::SCRAPED, &GPU_V1]).unwrap();
    let result = scan::scan_dir(
        dir.path(),
        &catalog,
        &ScanRequest {
            table: "scraped".into(),
            ..Default::default()
        },
    )
    .unwrap();
    assert_eq!(scraped_rows(&result), first);
}

#[test]
fn files_carry_the_metadata_readers_rely_on() {
    use parquet::file::reader::{FileReader, SerializedFileReader};
    let dir = tempfile::tempdir().unwrap();
    let mut store = open(dir.path());
    append_scraped(&mut store, T0, 100);
    store.close().unwrap();
    let file = fs::File::open(&parquet_files(dir.path())[0]).unwrap();
    let reader = SerializedFileReader::new(file).unwrap();
    let meta = reader.metadata();
    let kv: BTreeMap<_, _> = meta
        .file_metadata()
        .key_value_metadata()
        .unwrap()
        .iter()
        .map(|kv| (kv.key.clone(), kv.value.clone().unwrap_or_default()))
        .collect();
    assert_eq!(kv["vtax.schema_version"], "1");
    assert_eq!(kv["vtax.table"], "scraped");
    let rg = meta.row_group(0);
    let sorting: Vec<i32> = rg
        .sorting_columns()
        .unwrap()
        .iter()
        .map(|c| c.column_idx)
        .collect();
    assert_eq!(sorting, vec![1, 2, 3, 0], "tags then time");
    let time = meta.file_metadata().schema_descr().column(0);
    let logical = format!("{:?}", time.logical_type_ref());
    assert!(
        logical.contains("is_adjusted_to_u_t_c: true") && logical.contains("MICROS"),
        "{logical}"
    );
    assert!(
        rg.column(0).column_index_range().is_some(),
        "page index written"
    );
    let encodings = |c: usize| format!("{:?}", rg.column(c).encodings().collect::<Vec<_>>());
    // Time and values: one of the candidates a publish tries, never a dictionary.
    assert!(encodings(0).contains("PLAIN") || encodings(0).contains("DELTA_BINARY_PACKED"));
    assert!(!encodings(0).contains("DICTIONARY") && !encodings(4).contains("DICTIONARY"));
    assert!(encodings(2).contains("RLE_DICTIONARY"), "tags: dictionary");
    for c in 0..5 {
        assert!(format!("{:?}", rg.column(c).compression()).contains("ZSTD"));
    }
}

#[test]
fn a_fields_only_scan_returns_just_the_values() {
    let dir = tempfile::tempdir().unwrap();
    let mut store = open(dir.path());
    let rows = append_scraped(&mut store, T0, 4 * 3600 * 2);
    store.flush().unwrap();
    let request = ScanRequest {
        table: "scraped".into(),
        fields: Some(vec!["value".into()]),
        fields_only: true,
        ..Default::default()
    };
    let result = store.scan(&request).unwrap();
    assert_eq!(result.schema.as_ref().unwrap().fields().len(), 1);
    let mut got: Vec<u64> = result
        .batches
        .iter()
        .flat_map(|b| {
            b.column(0)
                .as_primitive::<Float64Type>()
                .values()
                .iter()
                .map(|v| v.to_bits())
                .collect::<Vec<_>>()
        })
        .collect();
    let mut want: Vec<u64> = rows.iter().map(|r| r.2).collect();
    got.sort();
    want.sort();
    assert_eq!(got, want);
    // With a time filter that cuts a file, rows are still filtered exactly.
    let filtered = store
        .scan(&ScanRequest {
            from_us: Some(T0 + HOUR_US / 2),
            until_us: Some(T0 + HOUR_US),
            ..request.clone()
        })
        .unwrap();
    assert_eq!(filtered.rows(), 4 * 1800);
    assert_eq!(filtered.batches[0].num_columns(), 1);
    // A field asked for twice (`vtax query --fields value,value`) is read
    // once; it panicked, reading past the file's columns.
    let twice = store
        .scan(&ScanRequest {
            fields: Some(vec!["value".into(), "value".into()]),
            ..request
        })
        .unwrap();
    assert_eq!(twice.rows(), rows.len());
    assert_eq!(twice.batches[0].num_columns(), 1);
}

#[test]
fn an_unknown_table_or_field_names_what_there_is() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    let scan_error = |request: ScanRequest| store.scan(&request).unwrap_err().to_string();
    let table_error = scan_error(ScanRequest {
        table: "scrapped".into(),
        ..Default::default()
    });
    assert!(
        table_error.contains("no table \"scrapped\"") && table_error.contains("scraped"),
        "{table_error}"
    );
    let field_error = scan_error(ScanRequest {
        table: "scraped".into(),
        fields: Some(vec!["valu".into()]),
        ..Default::default()
    });
    assert!(
        field_error.contains("no field \"valu\"") && field_error.contains("value"),
        "{field_error}"
    );
}

#[test]
fn a_finished_hours_parts_are_sealed_into_one_file_while_the_day_runs() {
    let dir = tempfile::tempdir().unwrap();
    let mut store = open(dir.path());
    let mut expected = Vec::new();
    // Three parts of hour 0 (as a memory-bound publish or restarts would leave),
    // and one part of hour 1, still running.
    for part in 0..3 {
        expected.extend(append_scraped(&mut store, T0 + part * 600_000_000, 400));
        store.flush().unwrap();
    }
    expected.extend(append_scraped(&mut store, T0 + HOUR_US, 40));
    store.flush().unwrap();
    expected.extend(append_scraped(&mut store, T0 + HOUR_US + 1_000_000_000, 40));
    store.flush().unwrap();
    assert_eq!(parquet_files(dir.path()).len(), 5);
    // Just after hour 1 started: hour 0 is finished, hour 1 is not.
    assert_eq!(store.compact(T0 + HOUR_US + 120_000_000).unwrap(), 1);
    assert_eq!(
        parquet_files(dir.path()).len(),
        3,
        "hour 0 sealed, hour 1's two parts kept"
    );
    expected.sort();
    assert_eq!(all_scraped(&store), expected);
    let hour0 = store
        .scan(&ScanRequest {
            table: "scraped".into(),
            until_us: Some(T0 + HOUR_US),
            tag_equals: vec![("labels".into(), "cpu=\"1\"".into())],
            ..Default::default()
        })
        .unwrap();
    assert_eq!(hour0.files_read, 1, "a past hour is one file");
    assert_eq!(hour0.rows(), 300);
}

#[test]
fn a_merge_of_many_interleaved_files_keeps_every_row_in_order() {
    merge_interleaved_files(None);
}

#[test]
fn a_merge_into_many_small_row_groups_keeps_every_row_in_order() {
    // Row groups end mid-run and mid-batch, so each one's plan resumes every
    // input where the last left off.
    let row_groups = merge_interleaved_files(Some(97));
    assert!(row_groups > 10, "{row_groups} row groups");
}

/// Merges 40 small files whose series interleave; checks every row and the
/// order. Returns the merged file's row groups.
fn merge_interleaved_files(row_group_rows: Option<usize>) -> usize {
    let dir = tempfile::tempdir().unwrap();
    let mut o = options(dir.path());
    // A tiny memory bound: many small files whose series interleave.
    o.max_buffered_bytes = 20_000;
    if let Some(rows) = row_group_rows {
        o.write.row_group_rows = rows;
    }
    let mut store = Store::open(o, Catalog::new(&[&tables::SCRAPED]).unwrap()).unwrap();
    let mut expected = Vec::new();
    for k in 0..40 {
        expected.extend(append_scraped(&mut store, T0 + k * 30_000_000, 200));
        store.publish_over_budget().unwrap();
    }
    store.flush().unwrap();
    let before = parquet_files(dir.path()).len();
    assert!(before > 5, "{before} files");
    store.compact(T0 + 2 * DAY_US).unwrap();
    let after = parquet_files(dir.path());
    assert_eq!(after.len(), 1);
    expected.sort();
    assert_eq!(all_scraped(&store), expected);
    // The merged file is sorted by tags then time, as its metadata claims.
    let file = fs::File::open(&after[0]).unwrap();
    let builder =
        parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder::try_new(file).unwrap();
    let row_groups = builder.metadata().num_row_groups();
    let reader = builder.build().unwrap();
    let mut last: Option<(String, String, i64)> = None;
    for batch in reader {
        let batch = batch.unwrap();
        let time = batch.column(0).as_primitive::<TimestampMicrosecondType>();
        let metric = batch.column(2).as_dictionary::<Int32Type>();
        let labels = batch.column(3).as_dictionary::<Int32Type>();
        for i in 0..batch.num_rows() {
            let key = (
                metric
                    .values()
                    .as_string::<i32>()
                    .value(metric.keys().value(i) as usize)
                    .to_string(),
                labels
                    .values()
                    .as_string::<i32>()
                    .value(labels.keys().value(i) as usize)
                    .to_string(),
                time.value(i),
            );
            if let Some(prev) = &last {
                assert!(prev <= &key, "{prev:?} then {key:?}");
            }
            last = Some(key);
        }
    }
    row_groups
}

#[test]
fn the_running_hours_parts_merge_in_tiers_of_like_size() {
    let dir = tempfile::tempdir().unwrap();
    let mut store = open(dir.path());
    let mut expected = Vec::new();
    // Five like-sized parts of an hour that is still running.
    for part in 0..5 {
        expected.extend(append_scraped(&mut store, T0 + part * 60_000_000, 400));
        store.flush().unwrap();
    }
    assert_eq!(parquet_files(dir.path()).len(), 5);
    assert_eq!(store.compact(T0 + 10 * 60_000_000).unwrap(), 1);
    assert_eq!(
        parquet_files(dir.path()).len(),
        2,
        "four parts merged, one left"
    );
    // The merged file is four times bigger: not like-sized with the last part.
    assert_eq!(store.compact(T0 + 11 * 60_000_000).unwrap(), 0);
    expected.sort();
    assert_eq!(all_scraped(&store), expected);
}

/// The most rows any data page of `path` holds, over every column.
fn longest_page_rows(path: &Path) -> usize {
    use parquet::arrow::arrow_reader::{ArrowReaderOptions, ParquetRecordBatchReaderBuilder};
    use parquet::file::metadata::PageIndexPolicy;
    let options = ArrowReaderOptions::new().with_page_index_policy(PageIndexPolicy::Required);
    let builder = ParquetRecordBatchReaderBuilder::try_new_with_options(
        fs::File::open(path).unwrap(),
        options,
    )
    .unwrap();
    let meta = builder.metadata();
    let mut longest = 0;
    for (rg, group) in meta.row_groups().iter().enumerate() {
        let rows = group.num_rows() as usize;
        let index = meta.page_index_for_row_group(rg);
        for column in 0..group.num_columns() {
            let pages = index
                .offset_index(column)
                .expect("an offset index")
                .page_locations();
            for (p, page) in pages.iter().enumerate() {
                let end = pages
                    .get(p + 1)
                    .map_or(rows, |next| next.first_row_index as usize);
                longest = longest.max(end - page.first_row_index as usize);
            }
        }
    }
    longest
}

#[test]
fn the_running_hour_is_written_in_short_pages_and_sealed_in_long_ones() {
    let dir = tempfile::tempdir().unwrap();
    let mut o = options(dir.path());
    // The writer checks a page's length every 1024 rows (its write batch).
    o.write.running_page_rows = 1024;
    let mut store = Store::open(o, Catalog::new(&[&tables::SCRAPED, &GPU_V1]).unwrap()).unwrap();
    let mut expected = Vec::new();
    // Four like-sized parts of hour 0 while it runs, merged as a tier.
    for part in 0..4 {
        expected.extend(append_scraped(&mut store, T0 + part * 600_000_000, 2000));
        store.tick(T0 + part * 600_000_000 + 300_000_000).unwrap();
        store.flush().unwrap();
    }
    for file in parquet_files(dir.path()) {
        assert!(longest_page_rows(&file) <= 1024, "{}", file.display());
    }
    assert_eq!(store.compact(T0 + 40 * 60_000_000).unwrap(), 1);
    let parts = parquet_files(dir.path());
    assert_eq!(parts.len(), 1, "the tier merged");
    assert!(
        longest_page_rows(&parts[0]) <= 1024,
        "a running hour's merge"
    );
    // One more part, then the hour is over: the seal writes long pages.
    expected.extend(append_scraped(&mut store, T0 + 50 * 60_000_000, 2000));
    store.flush().unwrap();
    assert_eq!(store.compact(T0 + HOUR_US + 120_000_000).unwrap(), 1);
    let sealed = parquet_files(dir.path());
    assert_eq!(sealed.len(), 1);
    assert_eq!(longest_page_rows(&sealed[0]), 10_000, "one page per column");
    expected.sort();
    assert_eq!(all_scraped(&store), expected);
}

/// Which of PLAIN and BYTE_STREAM_SPLIT is smaller depends on the data (a real
/// node_exporter recording prefers PLAIN, GPU-shaped data BYTE_STREAM_SPLIT: see
/// docs/benchmarks.md). A publish tries both on a sample and keeps the smaller per
/// column, so a file is never much bigger than under either fixed choice.
#[test]
fn each_file_keeps_the_smaller_value_encoding_for_its_data() {
    use parquet::basic::Encoding;
    use parquet::file::reader::{FileReader, SerializedFileReader};
    // (value encoding written, file bytes) for `values` under `fixed`, or adaptive.
    let write = |values: &dyn Fn(usize, usize) -> f64, fixed: Option<Encoding>| {
        let dir = tempfile::tempdir().unwrap();
        let mut o = options(dir.path());
        if let Some(e) = fixed {
            o.write.adaptive = false;
            o.write.float_encoding = e;
        }
        let mut store = Store::open(o, Catalog::new(&[&tables::SCRAPED]).unwrap()).unwrap();
        let mut b = BatchBuilder::new(&tables::SCRAPED);
        for series in 0..100 {
            for k in 0..1000 {
                let labels = format!("s=\"{series}\"");
                b.push(
                    T0 + k as i64 * 1_000_000,
                    &["", "m", &labels],
                    &[Value::F64(values(series, k))],
                )
                .unwrap();
            }
        }
        store.append(&b.finish()).unwrap();
        store.close().unwrap();
        let path = &parquet_files(dir.path())[0];
        let reader = SerializedFileReader::new(fs::File::open(path).unwrap()).unwrap();
        let encodings: Vec<_> = reader
            .metadata()
            .row_group(0)
            .column(4)
            .encodings()
            .collect();
        let chosen = if encodings.contains(&Encoding::BYTE_STREAM_SPLIT) {
            Encoding::BYTE_STREAM_SPLIT
        } else {
            Encoding::PLAIN
        };
        (chosen, fs::metadata(path).unwrap().len())
    };
    let durations = |s: usize, k: usize| {
        let mut x = (s * 1_000_003 + k) as u64 ^ 0x9e37_79b9_7f4a_7c15;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        (x % 1_000_000_007) as f64 * 1.234_567_891e-13
    };
    let counts = |s: usize, k: usize| ((k * (s + 1) * 37) % 100_000 + k * 1000) as f64;
    let constant = |s: usize, _: usize| s as f64 * 0.1;
    for values in [
        &durations as &dyn Fn(usize, usize) -> f64,
        &counts,
        &constant,
    ] {
        let (chosen, adaptive) = write(values, None);
        let (_, plain) = write(values, Some(Encoding::PLAIN));
        let (_, bss) = write(values, Some(Encoding::BYTE_STREAM_SPLIT));
        assert!(
            adaptive as f64 <= plain.min(bss) as f64 * 1.02,
            "chose {chosen}: {adaptive} bytes; PLAIN {plain}, BYTE_STREAM_SPLIT {bss}"
        );
    }
}

#[test]
fn a_closed_store_is_its_parquet_files() {
    let dir = tempfile::tempdir().unwrap();
    let mut store = open(dir.path());
    let expected = append_scraped(&mut store, T0, 4000);
    store.close().unwrap();
    let wal_bytes: u64 = fs::read_dir(dir.path().join("wal"))
        .unwrap()
        .map(|e| e.unwrap().metadata().unwrap().len())
        .sum();
    assert!(
        wal_bytes <= 8,
        "only an empty segment is left: {wal_bytes} bytes"
    );
    let store = open(dir.path());
    let mut expected = expected;
    expected.sort();
    assert_eq!(all_scraped(&store), expected);
}

#[test]
fn a_reader_prunes_other_days_before_opening_their_files() {
    let dir = tempfile::tempdir().unwrap();
    let mut store = open(dir.path());
    append_scraped(&mut store, T0, 400);
    let second_day = append_scraped(&mut store, T0 + DAY_US, 400);
    store.close().unwrap();
    // Make the first day's file unreadable: a reader that opened it would say so.
    let first = parquet_files(dir.path())
        .into_iter()
        .find(|p| p.to_string_lossy().contains("2025-11-21"))
        .unwrap();
    fs::write(&first, b"not parquet").unwrap();
    let catalog = Catalog::new(&[&tables::SCRAPED]).unwrap();
    let request = ScanRequest {
        table: "scraped".into(),
        from_us: Some(T0 + DAY_US),
        ..Default::default()
    };
    let result = scan::scan_dir(dir.path(), &catalog, &request).unwrap();
    assert_eq!(
        result.files_skipped, 1,
        "pruned by its partition, never opened"
    );
    let mut expected = second_day;
    expected.sort();
    assert_eq!(scraped_rows(&result), expected);
}

#[test]
fn retention_keeps_files_the_deletable_hook_refuses() {
    let dir = tempfile::tempdir().unwrap();
    let mut o = options(dir.path());
    let mut store = Store::open(o.clone(), Catalog::new(&[&tables::SCRAPED]).unwrap()).unwrap();
    for d in 0..3 {
        append_scraped(&mut store, T0 + d * DAY_US, 400);
        store.flush().unwrap();
    }
    store.close().unwrap();
    // Day 0's file is "not uploaded yet": every day is past the age bound.
    let keep = "date=2025-11-21";
    o.retention_max_age = Some(std::time::Duration::from_secs(3600));
    o.retention_deletable = Some(vtax_store::Deletable(std::sync::Arc::new(
        move |f: &vtax_store::files::FileInfo| !f.path.to_string_lossy().contains(keep),
    )));
    let mut store = Store::open(o, Catalog::new(&[&tables::SCRAPED]).unwrap()).unwrap();
    assert_eq!(store.apply_retention(T0 + 10 * DAY_US).unwrap(), 2);
    let left = parquet_files(dir.path());
    assert_eq!(left.len(), 1);
    assert!(left[0].to_string_lossy().contains(keep), "{left:?}");
    assert_eq!(store.files().count(), 1, "the kept file stays readable");
}

#[test]
fn a_file_is_sealed_once_its_hour_settled_and_its_parts_are_merged() {
    let dir = tempfile::tempdir().unwrap();
    let mut store = open(dir.path());
    let settle = 300_000_000;
    for part in 0..2 {
        append_scraped(&mut store, T0 + part * 600_000_000, 100);
        store.flush().unwrap();
    }
    append_scraped(&mut store, T0 + 3 * HOUR_US, 100);
    store.flush().unwrap();
    let sealed = |now: i64| {
        let files = vtax_store::files::live_files(dir.path()).unwrap();
        let mut hours: Vec<i64> = files
            .iter()
            .filter(|f| f.is_sealed(&files, now, settle))
            .map(|f| (f.time_range_us.unwrap().0 - T0) / HOUR_US)
            .collect();
        hours.sort();
        hours
    };
    let after_hour_3 = T0 + 4 * HOUR_US + settle;
    assert_eq!(sealed(T0 + HOUR_US + settle - 1), Vec::<i64>::new());
    assert_eq!(sealed(after_hour_3), [3], "hour 0 still has two parts");
    store.compact(after_hour_3).unwrap();
    assert_eq!(sealed(after_hour_3), [0, 3]);
    assert_eq!(
        vtax_store::files::live_files(dir.path()).unwrap()[0].node,
        "test"
    );
    // The finished day is compacted into one file of two hours: sealed too.
    store.compact(T0 + 2 * DAY_US).unwrap();
    let files = vtax_store::files::live_files(dir.path()).unwrap();
    assert_eq!(files.len(), 1);
    assert_eq!(files[0].watermarks.len(), 2);
    assert!(files[0].is_sealed(&files, T0 + 2 * DAY_US, settle));
}

fn bytes_under(dir: &Path, extension: &str) -> u64 {
    files_under(dir, extension)
        .iter()
        .map(|p| fs::metadata(p).unwrap().len())
        .sum()
}

#[test]
fn the_store_reports_the_bytes_it_holds_on_disk() {
    let dir = tempfile::tempdir().unwrap();
    let mut o = options(dir.path());
    let catalog = || Catalog::new(&[&tables::SCRAPED]).unwrap();
    let mut store = Store::open(o.clone(), catalog()).unwrap();
    let on_disk = |store: &Store, context: &str| {
        assert_eq!(
            store.table_bytes(),
            bytes_under(&dir.path().join("tables"), "parquet"),
            "table bytes {context}"
        );
        assert_eq!(
            store.files().count(),
            parquet_files(dir.path()).len(),
            "files {context}"
        );
        assert_eq!(
            store.wal_bytes(),
            bytes_under(&dir.path().join("wal"), "wal"),
            "WAL bytes {context}"
        );
    };
    assert_eq!(store.table_bytes(), 0);
    assert!(store.stats().last_file_written.is_none());
    on_disk(&store, "when empty");

    append_scraped(&mut store, T0, 400);
    store.sync().unwrap();
    assert!(store.wal_bytes() > 1000, "400 rows are in the WAL");
    on_disk(&store, "after a sync");

    let before = std::time::SystemTime::now();
    for h in 1..4 {
        append_scraped(&mut store, T0 + h * HOUR_US, 400);
        store.flush().unwrap();
    }
    let written = store.stats().last_file_written.expect("files were written");
    assert!(written >= before && written <= std::time::SystemTime::now());
    assert_eq!(store.files().count(), 4);
    assert!(store.table_bytes() > 0);
    on_disk(&store, "after flushes");

    assert_eq!(store.compact(T0 + 2 * DAY_US).unwrap(), 1);
    on_disk(&store, "after compaction");
    store.close().unwrap();

    // Reopened: the sizes come from the files' footers, and retention to half
    // the bytes deletes and subtracts.
    let mut store = Store::open(o.clone(), catalog()).unwrap();
    on_disk(&store, "after reopening");
    for d in 1..4 {
        append_scraped(&mut store, T0 + d * DAY_US, 400);
        store.flush().unwrap();
    }
    on_disk(&store, "after three more days");
    store.close().unwrap();
    let total = bytes_under(&dir.path().join("tables"), "parquet");
    o.retention_max_bytes = Some(total / 2);
    let mut store = Store::open(o, catalog()).unwrap();
    assert!(store.apply_retention(T0 + 4 * DAY_US).unwrap() > 0);
    assert!(store.table_bytes() <= total / 2);
    on_disk(&store, "after retention");
}

#[test]
fn rows_the_store_refuses_are_counted() {
    let dir = tempfile::tempdir().unwrap();
    let mut store = Store::open(
        options(dir.path()),
        Catalog::new(&[&tables::SCRAPED]).unwrap(),
    )
    .unwrap();
    append_scraped(&mut store, T0, 10);
    let mut unknown = BatchBuilder::new(&GPU_V1);
    for gpu in ["0", "1", "2"] {
        unknown.push(T0, &[gpu], &[Value::F64(300.0)]).unwrap();
    }
    let e = store.append(&unknown.finish()).unwrap_err();
    assert!(e.to_string().contains("not in this store's catalog"), "{e}");
    assert_eq!(store.stats().rows_appended, 10);
    assert_eq!(store.stats().rows_refused, 3);
}

/// Rows of `scraped` as another process reading the directory sees them.
fn scraped_on_disk(dir: &Path) -> Vec<(i64, String, u64)> {
    let catalog = Catalog::new(&[&tables::SCRAPED, &GPU_V1]).unwrap();
    let request = ScanRequest {
        table: "scraped".into(),
        ..Default::default()
    };
    scraped_rows(&scan::scan_dir(dir, &catalog, &request).unwrap())
}

/// What a merge left half written.
fn temp_files(dir: &Path) -> Vec<std::path::PathBuf> {
    files_under(dir, "tmp")
}

/// Publishes an hour file for each of `hours` hours of day 0; returns the
/// rows, sorted as `scraped_rows` gives them.
fn hour_files(store: &mut Store, hours: i64) -> Vec<(i64, String, u64)> {
    let mut expected = Vec::new();
    for h in 0..hours {
        expected.extend(append_scraped(store, T0 + h * HOUR_US, 8));
        store.flush().unwrap();
    }
    expected.sort();
    expected
}

#[test]
fn a_merge_runs_beside_appends_and_publishes_and_every_row_reads_once() {
    let dir = tempfile::tempdir().unwrap();
    let mut store = open(dir.path());
    let mut expected = hour_files(&mut store, 5);
    let merges = store.plan_merges(T0 + 2 * DAY_US).unwrap();
    assert_eq!(merges.len(), 1);
    assert_eq!(merges[0].inputs().len(), 5);
    let merge = merges.into_iter().next().unwrap();
    let outcome = std::thread::scope(|s| {
        let worker = s.spawn(move || merge.run(&AtomicBool::new(true)));
        // A late row of the day being merged is published into its partition
        // while the merge runs.
        expected.extend(append_scraped(
            &mut store,
            T0 + 3 * HOUR_US + HOUR_US / 2,
            8,
        ));
        store.flush().unwrap();
        worker.join().unwrap()
    });
    assert!(outcome.error().is_none(), "{:?}", outcome.error());
    expected.sort();
    // Merged but not handed back: the store still lists the inputs, and the
    // output, which names them, is on disk beside them under its pending
    // name, which no `*.parquet` glob matches.
    assert_eq!(store.files().count(), 6);
    assert_eq!(parquet_files(dir.path()).len(), 6);
    assert_eq!(files_under(&dir.path().join("tables"), "pending").len(), 1);
    assert_eq!(all_scraped(&store), expected);
    assert_eq!(scraped_on_disk(dir.path()), expected);

    store.finish_merge(outcome).unwrap();
    assert_eq!(
        parquet_files(dir.path()).len(),
        2,
        "the merged file and the late one"
    );
    assert_eq!(store.files().count(), 2);
    assert_eq!(all_scraped(&store), expected);
    assert_eq!(store.compact(T0 + 2 * DAY_US).unwrap(), 1);
    assert_eq!(parquet_files(dir.path()).len(), 1);
    store.close().unwrap();
    assert_eq!(all_scraped(&open(dir.path())), expected);
}

#[test]
fn a_stopped_merge_publishes_nothing_and_its_inputs_merge_later() {
    let dir = tempfile::tempdir().unwrap();
    let mut store = open(dir.path());
    let expected = hour_files(&mut store, 5);
    let before = parquet_files(dir.path());
    let merge = store.plan_merges(T0 + 2 * DAY_US).unwrap().remove(0);
    let outcome = merge.run(&AtomicBool::new(false));
    assert!(matches!(outcome.error(), Some(Error::Stopped)));
    assert!(matches!(store.finish_merge(outcome), Err(Error::Stopped)));
    assert_eq!(
        store.stats().write_errors,
        0,
        "a stop is not a failed write"
    );
    assert_eq!(parquet_files(dir.path()), before);
    assert_eq!(temp_files(dir.path()), Vec::<std::path::PathBuf>::new());
    assert_eq!(all_scraped(&store), expected);
    assert_eq!(store.compact(T0 + 2 * DAY_US).unwrap(), 1);
    assert_eq!(all_scraped(&store), expected);
}

/// A store of `scraped` at `dir` whose retention deletes days that ended
/// `days` or more days ago.
fn open_keeping_days(dir: &Path, days: u64) -> Store {
    let mut o = options(dir);
    o.retention_max_age = Some(Duration::from_secs(days * 86_400));
    Store::open(o, Catalog::new(&[&tables::SCRAPED]).unwrap()).unwrap()
}

#[test]
fn the_compactor_merges_off_the_callers_thread_then_applies_retention() {
    let dir = tempfile::tempdir().unwrap();
    let mut store = open_keeping_days(dir.path(), 3);
    append_scraped(&mut store, T0 - 5 * DAY_US, 8);
    store.flush().unwrap();
    let mut expected = hour_files(&mut store, 24);
    let now = T0 + 2 * DAY_US;
    let mut compactor = Compactor::new(Duration::ZERO);
    assert!(compactor.poll(&mut store, now).is_none());
    assert!(compactor.busy(), "the first round runs on its own thread");
    let mut turns = 0;
    let report = loop {
        // The store takes rows and syncs its WAL while the merges run.
        expected.extend(append_scraped(&mut store, now + turns * 10_000_000, 4));
        store.tick(now).unwrap();
        turns += 1;
        if let Some(report) = compactor.poll(&mut store, now) {
            break report;
        }
        assert!(turns < 60_000, "the compaction never finished");
        std::thread::sleep(Duration::from_millis(1));
    };
    assert!(!compactor.busy());
    assert!(report.merge_error.is_none(), "{:?}", report.merge_error);
    assert_eq!(report.merges, 3 + 1, "24 to 3 to 1, in two rounds");
    assert_eq!(report.retention.unwrap(), 1, "the day past the age bound");
    let files: Vec<_> = store.files().cloned().collect();
    assert_eq!(files.len(), 1);
    assert_eq!(files[0].watermarks.len(), 24);
    expected.sort();
    assert_eq!(all_scraped(&store), expected);
    // With nothing to merge, a cycle ends in the call that starts it.
    let idle = compactor.poll(&mut store, now).expect("an empty cycle");
    assert_eq!((idle.merges, idle.retention.unwrap()), (0, 0));
}

#[test]
fn a_compactor_stopped_mid_merge_leaves_every_row_once() {
    let dir = tempfile::tempdir().unwrap();
    let mut store = open(dir.path());
    let expected = hour_files(&mut store, 24);
    let mut compactor = Compactor::new(Duration::ZERO);
    assert!(compactor.poll(&mut store, T0 + 2 * DAY_US).is_none());
    compactor.stop(&mut store);
    // Whether the merges finished or stopped, the store lists what is on disk.
    let mut listed: Vec<_> = store.files().map(|f| f.path.clone()).collect();
    listed.sort();
    assert_eq!(listed, parquet_files(dir.path()));
    assert_eq!(temp_files(dir.path()), Vec::<std::path::PathBuf>::new());
    assert_eq!(all_scraped(&store), expected);
    store.close().unwrap();
    let mut store = open(dir.path());
    assert_eq!(all_scraped(&store), expected);
    store.compact(T0 + 2 * DAY_US).unwrap();
    assert_eq!(parquet_files(dir.path()).len(), 1);
}

#[test]
fn retention_runs_even_when_a_merge_fails() {
    let dir = tempfile::tempdir().unwrap();
    let mut store = open_keeping_days(dir.path(), 2);
    append_scraped(&mut store, T0, 8);
    store.flush().unwrap();
    for h in 0..2 {
        append_scraped(&mut store, T0 + 3 * DAY_US + h * HOUR_US, 8);
        store.flush().unwrap();
    }
    // One of day 3's files goes bad under the running store.
    let bad = parquet_files(dir.path())
        .into_iter()
        .find(|p| p.to_string_lossy().contains("date=2025-11-24"))
        .unwrap();
    let mut bytes = fs::read(&bad).unwrap();
    let n = bytes.len();
    bytes[n - 12..n - 4].fill(0xff);
    fs::write(&bad, bytes).unwrap();
    let mut compactor = Compactor::new(Duration::ZERO);
    let report = loop {
        if let Some(report) = compactor.poll(&mut store, T0 + 5 * DAY_US) {
            break report;
        }
        std::thread::sleep(Duration::from_millis(1));
    };
    let error = report.merge_error.expect("the merge of day 3 fails");
    assert!(
        error.to_string().contains(&*bad.to_string_lossy()),
        "{error}"
    );
    assert_eq!(report.merges, 0);
    assert_eq!(report.retention.unwrap(), 1, "day 0 goes all the same");
    assert_eq!(
        store.stats().write_errors,
        0,
        "a bad input is not a failed write"
    );
    // The bad file goes to quarantine, so the next pass merges the rest.
    assert_eq!(
        parquet_files(dir.path()).len(),
        1,
        "day 3's good file stays"
    );
    assert!(!bad.exists());
    assert_eq!(store.stats().files_quarantined, 1);
}

/// Publishes `hours` hours of `rows_per_hour` rows of `scraped` in a store at
/// `dir`, one file each, and removes its WAL, so that a file's rows exist only
/// in the file. Returns each hour's rows.
fn published_hours_without_wal(
    dir: &Path,
    hours: i64,
    rows_per_hour: usize,
) -> Vec<Vec<(i64, String, u64)>> {
    let mut store = open(dir);
    let rows = (0..hours)
        .map(|hour| {
            let rows = append_scraped(&mut store, T0 + hour * HOUR_US, rows_per_hour);
            store.flush().unwrap();
            rows
        })
        .collect();
    store.close().unwrap();
    fs::remove_dir_all(dir.join("wal")).unwrap();
    rows
}

/// Rewrites the footer of the Parquet file at `path` with `edit` applied to
/// the first row group's first column chunk: a footer that decodes but
/// describes a layout the file does not have.
fn rewrite_first_column_chunk(
    path: &Path,
    edit: impl FnOnce(
        parquet::file::metadata::ColumnChunkMetaDataBuilder,
    ) -> parquet::file::metadata::ColumnChunkMetaDataBuilder,
) {
    use parquet::file::metadata::{ParquetMetaDataReader, ParquetMetaDataWriter};
    let bytes = fs::read(path).unwrap();
    let n = bytes.len();
    let footer_len = u32::from_le_bytes(bytes[n - 8..n - 4].try_into().unwrap()) as usize;
    let metadata = ParquetMetaDataReader::new()
        .parse_and_finish(&fs::File::open(path).unwrap())
        .unwrap();
    let mut row_groups = metadata.row_groups().to_vec();
    let mut columns = row_groups[0].columns().to_vec();
    columns[0] = edit(columns[0].clone().into_builder()).build().unwrap();
    row_groups[0] = row_groups[0]
        .clone()
        .into_builder()
        .set_column_metadata(columns)
        .build()
        .unwrap();
    let metadata = metadata.into_builder().set_row_groups(row_groups).build();
    let mut out = bytes[..n - 8 - footer_len].to_vec();
    ParquetMetaDataWriter::new(&mut out, &metadata)
        .finish()
        .unwrap();
    fs::write(path, out).unwrap();
}

#[test]
fn a_file_whose_footer_places_pages_outside_it_is_quarantined_at_open() {
    let dir = tempfile::tempdir().unwrap();
    published_hours_without_wal(dir.path(), 2, 40);
    let files = parquet_files(dir.path());
    // A negative offset is what made the Parquet reader panic.
    rewrite_first_column_chunk(&files[0], |chunk| {
        chunk
            .set_dictionary_page_offset(Some(-1))
            .set_data_page_offset(-1)
    });
    let file_bytes = fs::metadata(&files[1]).unwrap().len() as i64;
    rewrite_first_column_chunk(&files[1], |chunk| {
        chunk.set_data_page_offset(file_bytes + 100)
    });
    let store = open(dir.path());
    assert_eq!(store.stats().files_quarantined, 2);
    assert!(parquet_files(dir.path()).is_empty());
    assert_eq!(all_scraped(&store), Vec::new());
    let quarantined = files_under(&dir.path().join("quarantine"), "parquet");
    assert_eq!(quarantined.len(), 2, "kept, not deleted");
}

/// Overwrites bytes of the first data page of `path`'s first row group's
/// `column`: the footer stays whole and the page cannot be read.
fn damage_a_page(path: &Path, column: usize) {
    use parquet::file::reader::{FileReader, SerializedFileReader};
    let reader = SerializedFileReader::new(fs::File::open(path).unwrap()).unwrap();
    let chunk = reader.metadata().row_group(0).column(column);
    let at = chunk.data_page_offset() as usize;
    let mut bytes = fs::read(path).unwrap();
    bytes[at..at + 24].fill(0xff);
    fs::write(path, bytes).unwrap();
}

#[test]
fn a_damaged_page_fails_a_scan_naming_its_file_and_a_merge_quarantines_it() {
    let dir = tempfile::tempdir().unwrap();
    let mut hours = published_hours_without_wal(dir.path(), 4, 40);
    hours.remove(1);
    let mut kept: Vec<_> = hours.into_iter().flatten().collect();
    let damaged = parquet_files(dir.path())[1].clone();
    damage_a_page(&damaged, 3);

    let mut store = open(dir.path());
    assert_eq!(store.stats().files_quarantined, 0, "its footer is whole");
    let error = store
        .scan(&ScanRequest {
            table: "scraped".into(),
            ..Default::default()
        })
        .unwrap_err();
    assert!(
        error.to_string().contains(&*damaged.to_string_lossy()),
        "{error}"
    );
    // Told to, a scan leaves the file out, names it, and returns the rest
    // whole: the writer's and a reader's beside it alike.
    kept.sort();
    let request = ScanRequest {
        table: "scraped".into(),
        skip_damaged: true,
        ..Default::default()
    };
    for (who, result) in [
        ("writer", store.scan(&request).unwrap()),
        (
            "reader",
            scan::scan_dir(
                dir.path(),
                &Catalog::new(&[&tables::SCRAPED, &GPU_V1]).unwrap(),
                &request,
            )
            .unwrap(),
        ),
    ] {
        assert_eq!(scraped_rows(&result), kept, "{who}");
        assert_eq!(result.damaged_files.len(), 1, "{who}");
        assert_eq!(result.damaged_files[0].0, damaged, "{who}");
    }

    // The day's merge meets the page, moves the file aside and merges the
    // rest in the same pass (a later round), then fails naming the file.
    let error = store.compact(T0 + 2 * DAY_US).unwrap_err();
    assert!(
        error.to_string().contains(&*damaged.to_string_lossy()),
        "{error}"
    );
    assert_eq!(store.stats().files_quarantined, 1);
    assert_eq!(store.stats().write_errors, 0, "not the writer's failure");
    assert!(!damaged.exists());
    assert_eq!(
        files_under(&dir.path().join("quarantine"), "parquet").len(),
        1
    );
    assert_eq!(parquet_files(dir.path()).len(), 1, "the rest merged");
    assert_eq!(store.compact(T0 + 2 * DAY_US).unwrap(), 0);
    assert_eq!(all_scraped(&store), kept);
}

/// Sixteen bytes flipped in the middle of a column chunk: whether or not
/// the page still decodes (a flipped bit in a value is another value), every
/// read checks the file's CRC-32 of its pages and fails naming the file; a
/// merge (the day's compaction) quarantines it rather than carry the damage
/// into a merged file under a checksum of its own.
#[test]
fn flipped_bytes_in_a_page_fail_every_read_instead_of_returning_other_values() {
    use parquet::file::reader::{FileReader, SerializedFileReader};
    let dir = tempfile::tempdir().unwrap();
    let mut hours = published_hours_without_wal(dir.path(), 3, 40);
    hours.remove(1);
    let mut kept: Vec<_> = hours.into_iter().flatten().collect();
    kept.sort();
    let damaged = parquet_files(dir.path())[1].clone();
    {
        let reader = SerializedFileReader::new(fs::File::open(&damaged).unwrap()).unwrap();
        let columns = reader.metadata().row_group(0).num_columns();
        let chunk = reader.metadata().row_group(0).column(columns - 1);
        let (start, len) = chunk.byte_range();
        let mut bytes = fs::read(&damaged).unwrap();
        let at = (start + len / 2) as usize;
        for b in &mut bytes[at..at + 16] {
            *b ^= 0x01;
        }
        fs::write(&damaged, bytes).unwrap();
    }
    let catalog = Catalog::new(&[&tables::SCRAPED, &GPU_V1]).unwrap();
    let mut request = ScanRequest {
        table: "scraped".into(),
        ..Default::default()
    };
    let named = |error: &vtax_store::Error| {
        assert_eq!(error.damaged_file(), Some(damaged.as_path()), "{error}");
        assert!(error.to_string().contains("CRC-32"), "{error}");
    };
    named(&scan::scan_dir(dir.path(), &catalog, &request).unwrap_err());
    let mut store = open(dir.path());
    named(&store.scan(&request).unwrap_err());
    // Only the damaged column asked for: still the whole file's check.
    request.fields = Some(vec!["value".into()]);
    named(&scan::scan_dir(dir.path(), &catalog, &request).unwrap_err());
    request.fields = None;
    request.skip_damaged = true;
    for result in [
        store.scan(&request).unwrap(),
        scan::scan_dir(dir.path(), &catalog, &request).unwrap(),
    ] {
        assert_eq!(scraped_rows(&result), kept);
        assert_eq!(result.damaged_files.len(), 1);
        assert_eq!(result.damaged_files[0].0, damaged);
    }
    let error = store.compact(T0 + 2 * DAY_US).unwrap_err();
    named(&error);
    assert_eq!(store.stats().files_quarantined, 1);
    store.compact(T0 + 2 * DAY_US).unwrap();
    assert_eq!(all_scraped(&store), kept);
}

/// Flips, overwrites and truncates bytes of one of a store's files at random
/// (a seeded generator, so a failure repeats): opening the store, scanning
/// and merging each give a result or an error, never a panic.
#[test]
fn damaged_files_give_errors_never_panics() {
    use rand::{RngExt, SeedableRng};
    let pristine = tempfile::tempdir().unwrap();
    published_hours_without_wal(pristine.path(), 2, 400);
    let files: Vec<(std::path::PathBuf, Vec<u8>)> = parquet_files(pristine.path())
        .into_iter()
        .map(|p| {
            let bytes = fs::read(&p).unwrap();
            (p.strip_prefix(pristine.path()).unwrap().to_owned(), bytes)
        })
        .collect();
    let mut rng = rand::rngs::StdRng::seed_from_u64(18);
    let (mut errors, mut panics) = (0, Vec::new());
    for round in 0..1500 {
        let dir = tempfile::tempdir().unwrap();
        for (relative, bytes) in &files {
            let path = dir.path().join(relative);
            fs::create_dir_all(path.parent().unwrap()).unwrap();
            fs::write(&path, bytes).unwrap();
        }
        let (relative, pristine_bytes) = &files[rng.random_range(0..files.len())];
        let mut bytes = pristine_bytes.clone();
        let n = bytes.len();
        for _ in 0..rng.random_range(1..5) {
            // Half the damage lands in the footer and page index at the end.
            let at = if rng.random_range(0..2) == 0 {
                n - 1 - rng.random_range(0..600.min(n))
            } else {
                rng.random_range(0..n)
            };
            bytes[at] = match rng.random_range(0..3) {
                0 => bytes[at] ^ (1 << rng.random_range(0..8)),
                1 => 0xff,
                _ => rng.random_range(0..=255),
            };
        }
        if rng.random_range(0..10) == 0 {
            bytes.truncate(rng.random_range(0..n));
        }
        fs::write(dir.path().join(relative), &bytes).unwrap();
        let path = dir.path().to_owned();
        let outcome = std::panic::catch_unwind(move || -> vtax_store::Result<()> {
            let mut store = Store::open(
                options(&path),
                Catalog::new(&[&tables::SCRAPED, &GPU_V1]).unwrap(),
            )?;
            store.scan(&ScanRequest {
                table: "scraped".into(),
                ..Default::default()
            })?;
            store.compact(T0 + 2 * DAY_US)?;
            Ok(())
        });
        match outcome {
            Ok(Ok(())) => {}
            Ok(Err(_)) => errors += 1,
            Err(_) => panics.push(round),
        }
    }
    eprintln!(
        "1500 damaged stores: {errors} errors, {} panics",
        panics.len()
    );
    assert!(errors > 100, "the damage was seen: {errors} errors");
    assert!(panics.is_empty(), "panicked in rounds {panics:?}");
}

#[test]
fn verifying_finds_a_damaged_page_that_opening_does_not_and_quarantines_it() {
    let dir = tempfile::tempdir().unwrap();
    let mut hours = published_hours_without_wal(dir.path(), 3, 40);
    let damaged = parquet_files(dir.path())[2].clone();
    damage_a_page(&damaged, 2);
    hours.remove(2);
    let mut kept: Vec<_> = hours.into_iter().flatten().collect();
    kept.sort();

    // Read-only, beside a writer: it names the file and moves nothing.
    let verified = vtax_store::files::verify_store(dir.path()).unwrap();
    assert_eq!(verified.sound, 2);
    assert_eq!(verified.damaged.len(), 1);
    let named = verified.damaged[0].to_string();
    assert!(named.contains(&*damaged.to_string_lossy()), "{named}");
    assert!(damaged.exists());

    let mut store = open(dir.path());
    assert_eq!(store.stats().files_quarantined, 0, "its footer is whole");
    let moved = store.quarantine_damaged().unwrap();
    assert_eq!(moved.len(), 1);
    assert_eq!(moved[0].0, damaged);
    assert_eq!(store.stats().files_quarantined, 1);
    assert_eq!(all_scraped(&store), kept);
    assert!(store.quarantine_damaged().unwrap().is_empty());
    assert_eq!(
        files_under(&dir.path().join("quarantine"), "parquet").len(),
        1
    );
}

#[test]
fn a_changed_byte_that_still_decodes_is_caught_by_the_pages_checksum() {
    let dir = tempfile::tempdir().unwrap();
    let hours = published_hours_without_wal(dir.path(), 2, 40);
    let changed = parquet_files(dir.path())[0].clone();
    // The Parquet reader never reads the leading magic: a flip there stands
    // for one inside a page that still decodes, to a wrong value.
    let mut bytes = fs::read(&changed).unwrap();
    bytes[1] ^= 0x10;
    fs::write(&changed, bytes).unwrap();

    let mut store = open(dir.path());
    // The Parquet reader would see nothing wrong; every read checks the sum.
    let error = store
        .scan(&ScanRequest {
            table: "scraped".into(),
            ..Default::default()
        })
        .unwrap_err();
    assert!(error.to_string().contains("CRC-32"), "{error}");
    let verified = vtax_store::files::verify_store(dir.path()).unwrap();
    assert_eq!(verified.sound, 1);
    let named = verified.damaged[0].to_string();
    assert!(named.contains(&*changed.to_string_lossy()), "{named}");
    assert!(named.contains("CRC-32"), "{named}");

    // A merge checks its inputs before copying them into a file of its own.
    let error = store.compact(T0 + 2 * DAY_US).unwrap_err();
    assert!(error.to_string().contains("CRC-32"), "{error}");
    assert_eq!(store.stats().files_quarantined, 1);
    let mut kept = hours[1].clone();
    kept.sort();
    assert_eq!(all_scraped(&store), kept);
}

/// Frames of a WAL segment as the test reads its documented layout (an 8-byte
/// magic, then `[len: u32][crc: u32][payload]`): each frame's byte range.
fn wal_frames(bytes: &[u8]) -> Vec<std::ops::Range<usize>> {
    let mut frames = Vec::new();
    let mut at = 8;
    while at + 8 <= bytes.len() {
        let len = u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap()) as usize;
        frames.push(at..at + 8 + len);
        at += 8 + len;
    }
    assert_eq!(at, bytes.len(), "a pristine segment holds whole frames");
    frames
}

/// Damages one WAL segment of a store whose rows are all in the WAL, one frame
/// an append, at random (flipped or overwritten bytes, a run of zeros, a cut):
/// opening never fails or panics, no row comes back that was not appended,
/// every frame before the damage comes back, and a frame damaged alone (its
/// length intact) costs only its own rows. A segment with damage is copied to
/// quarantine and left in place, and opening again gives the same rows.
#[test]
fn damaged_wal_segments_lose_only_their_damaged_frames() {
    use rand::{RngExt, SeedableRng};
    const BATCHES: i64 = 60;
    let pristine = tempfile::tempdir().unwrap();
    let mut appended = Vec::new();
    {
        let mut o = options(pristine.path());
        o.wal_segment_bytes = 4096;
        let mut store =
            Store::open(o, Catalog::new(&[&tables::SCRAPED, &GPU_V1]).unwrap()).unwrap();
        for i in 0..BATCHES {
            appended.push(append_scraped(&mut store, T0 + i * 1_000_000, 4));
            store.sync().unwrap();
        }
        // Dropped without a close: every row is in the WAL only.
    }
    let segments = files_under(&pristine.path().join("wal"), "wal");
    assert!(segments.len() >= 4, "{} segments", segments.len());
    let segments: Vec<(String, Vec<u8>)> = segments
        .iter()
        .map(|p| {
            let name = p.file_name().unwrap().to_str().unwrap().to_owned();
            (name, fs::read(p).unwrap())
        })
        .collect();
    // The batch each frame holds, in append order across segments.
    let mut frames_before = Vec::new();
    let mut total = 0;
    for (_, bytes) in &segments {
        frames_before.push(total);
        total += wal_frames(bytes).len();
    }
    assert_eq!(total as i64, BATCHES, "one frame an append");

    let mut rng = rand::rngs::StdRng::seed_from_u64(19);
    let mut frames_lost = 0;
    for round in 0..400 {
        let dir = tempfile::tempdir().unwrap();
        fs::create_dir(dir.path().join("wal")).unwrap();
        for (name, bytes) in &segments {
            fs::write(dir.path().join("wal").join(name), bytes).unwrap();
        }
        let target = rng.random_range(0..segments.len());
        let (name, pristine_bytes) = &segments[target];
        let mut bytes = pristine_bytes.clone();
        let n = bytes.len();
        let mut touched = Vec::new();
        match rng.random_range(0..4) {
            0 | 1 => {
                for _ in 0..rng.random_range(1..4) {
                    let at = rng.random_range(0..n);
                    bytes[at] ^= 1 << rng.random_range(0..8);
                    touched.push(at);
                }
            }
            2 => {
                let at = rng.random_range(0..n);
                let end = (at + rng.random_range(1..200)).min(n);
                bytes[at..end].fill(0);
                touched.extend(at..end);
            }
            _ => {
                let at = rng.random_range(0..n);
                bytes.truncate(at);
                touched.extend(at..n);
            }
        }
        fs::write(dir.path().join("wal").join(name), &bytes).unwrap();

        let frames = wal_frames(pristine_bytes);
        let hit: Vec<usize> = (0..frames.len())
            .filter(|&f| touched.iter().any(|at| frames[f].contains(at)))
            .collect();
        let first_hit = hit.first().copied().unwrap_or(frames.len());
        let mut must_have: Vec<usize> = (0..total)
            .filter(|&k| {
                let k_here = k as isize - frames_before[target] as isize;
                !(0..frames.len() as isize).contains(&k_here) || (k_here as usize) < first_hit
            })
            .collect();
        let one_frame_hit_in_its_payload = hit.len() == 1
            && touched.len() < 8
            && touched
                .iter()
                .all(|&at| at >= frames[first_hit].start + 4 && at < n);
        if one_frame_hit_in_its_payload {
            must_have = (0..total)
                .filter(|&k| k != frames_before[target] + first_hit)
                .collect();
        }

        let opened = std::panic::catch_unwind(|| open(dir.path()));
        let store = opened.unwrap_or_else(|_| panic!("round {round}: open panicked"));
        let rows = all_scraped(&store);
        let mut by_batch: BTreeMap<i64, usize> = BTreeMap::new();
        for row in &rows {
            *by_batch.entry((row.0 - T0) / 1_000_000).or_default() += 1;
        }
        for (&batch, &count) in &by_batch {
            let mut expected = appended[batch as usize].clone();
            expected.sort();
            let got: Vec<_> = rows
                .iter()
                .filter(|r| (r.0 - T0) / 1_000_000 == batch)
                .cloned()
                .collect();
            assert_eq!(count, 4, "round {round}: batch {batch} whole or not at all");
            assert_eq!(got, expected, "round {round}: batch {batch} as appended");
        }
        for k in &must_have {
            assert!(
                by_batch.contains_key(&(*k as i64)),
                "round {round}: frame {k} lost (damage in segment {target}, frames {hit:?} hit)"
            );
        }
        frames_lost += total - by_batch.len();
        let quarantined = dir.path().join("quarantine/wal").join(name);
        let damage_seen = store.stats().files_quarantined > 0;
        assert_eq!(quarantined.exists(), damage_seen, "round {round}");
        drop(store);
        let again = open(dir.path());
        assert_eq!(
            all_scraped(&again),
            rows,
            "round {round}: the same rows again"
        );
        assert_eq!(
            again.stats().files_quarantined,
            0,
            "round {round}: copied once"
        );
    }
    eprintln!(
        "400 damaged WALs: {frames_lost} of {} frames lost",
        400 * total
    );
}

/// A WAL written by a build whose `gpu` table has a field more (a downgrade
/// went back to one without it): the store opens, replays the rows as far as
/// its tables hold them (the field dropped) and keeps a copy of the segment in
/// quarantine. A build without the table at all skips its frames, the same way.
#[test]
fn wal_rows_of_another_build_are_replayed_as_far_as_they_fit_and_kept_in_quarantine() {
    let newer = [&tables::SCRAPED, &GPU_V2];
    for (older, gpu_rows) in [
        (vec![&tables::SCRAPED, &GPU_V1], 3),
        (vec![&tables::SCRAPED], 0),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let scraped;
        {
            let mut store =
                Store::open(options(dir.path()), Catalog::new(&newer).unwrap()).unwrap();
            scraped = append_scraped(&mut store, T0, 8);
            let mut b = BatchBuilder::new(&GPU_V2);
            for g in 0..3u64 {
                b.push(T0, &[&g.to_string()], &[Value::F64(1.5), Value::U64(g)])
                    .unwrap();
            }
            store.append(&b.finish()).unwrap();
            store.sync().unwrap();
            // Killed: the rows are in the WAL only.
        }
        let catalog = Catalog::new(&older).unwrap();
        let store = Store::open(options(dir.path()), catalog).unwrap();
        let mut scraped = scraped;
        scraped.sort();
        assert_eq!(all_scraped(&store), scraped);
        if gpu_rows > 0 {
            let gpu = store
                .scan(&ScanRequest {
                    table: "gpu".into(),
                    ..Default::default()
                })
                .unwrap();
            assert_eq!(gpu.rows(), gpu_rows);
        }
        assert_eq!(store.stats().files_quarantined, 1);
        let kept = files_under(&dir.path().join("quarantine/wal"), "wal");
        assert_eq!(kept.len(), 1);
        assert!(
            dir.path()
                .join("wal")
                .join(kept[0].file_name().unwrap())
                .exists(),
            "the segment stays until its rows are published"
        );
        drop(store);
        // The newer build, back again, finds every row of the segment.
        let store = Store::open(options(dir.path()), Catalog::new(&newer).unwrap()).unwrap();
        let gpu = store
            .scan(&ScanRequest {
                table: "gpu".into(),
                ..Default::default()
            })
            .unwrap();
        assert_eq!(gpu.rows(), 3);
        assert_eq!(store.stats().files_quarantined, 0, "copied once");
    }
}

/// The same rows written twice (an import run again after a kill) merge back
/// into one copy in `vtax import`'s merges (`compact_all`): a series holds
/// one value per instant. Equal keys within one file, across files and
/// across the merge's row groups are all dropped, and the first copy's
/// values are kept. The agent's merges (`compact`) keep every row.
#[test]
fn an_import_merge_keeps_one_row_per_series_and_instant() {
    let dir = tempfile::tempdir().unwrap();
    let mut store = open(dir.path());
    let mut rows = append_scraped(&mut store, T0, 400);
    store.flush().unwrap();
    // Again, as another part of the same hour, and a third time in one part
    // with itself twice.
    append_scraped(&mut store, T0, 400);
    store.flush().unwrap();
    append_scraped(&mut store, T0, 400);
    append_scraped(&mut store, T0, 400);
    store.flush().unwrap();
    assert!(parquet_files(dir.path()).len() >= 3);
    assert_eq!(all_scraped(&store).len(), 1600, "duplicates until merged");
    store.compact(T0 + 2 * DAY_US).unwrap();
    assert_eq!(parquet_files(dir.path()).len(), 1);
    assert_eq!(
        all_scraped(&store).len(),
        1600,
        "the agent's merge keeps them"
    );
    append_scraped(&mut store, T0, 400);
    store.flush().unwrap();
    store.compact_all(T0 + 2 * DAY_US, "scraped").unwrap();
    assert_eq!(parquet_files(dir.path()).len(), 1);
    rows.sort();
    assert_eq!(all_scraped(&store), rows);
    // A second series at the same instants is no duplicate.
    let mut b = BatchBuilder::new(&tables::SCRAPED);
    b.push(
        T0,
        &["", "node_cpu_seconds_total", "cpu=\"9\""],
        &[Value::F64(1.0)],
    )
    .unwrap();
    store.append(&b.finish()).unwrap();
    store.flush().unwrap();
    store.compact_all(T0 + 2 * DAY_US, "scraped").unwrap();
    assert_eq!(all_scraped(&store).len(), rows.len() + 1);
}

/// One `scraped` row of the series `s` at `time_us`.
fn row_of_s(time_us: i64, value: f64) -> vtax_store::Batch {
    let mut b = BatchBuilder::new(&tables::SCRAPED);
    b.push(time_us, &["", "s", ""], &[Value::F64(value)])
        .unwrap();
    b.finish()
}

/// Every `scraped` row's time and value.
fn rows_of_s(store: &Store) -> Vec<(i64, f64)> {
    all_scraped(store)
        .into_iter()
        .map(|(t, _, bits)| (t, f64::from_bits(bits)))
        .collect()
}

/// An import's merge keeps the first written of equal keys, whatever the
/// files' times or names: a later import that repeats a sample the store
/// holds (and starts earlier, or lands in a file whose name sorts first)
/// leaves the stored value. Other tables keep every row, as the agent's
/// merges do: two of the agent's rows at one instant (a clock stepped back)
/// are both evidence.
#[test]
fn an_import_merge_keeps_the_first_written_and_only_in_its_table() {
    let dir = tempfile::tempdir().unwrap();
    let mut store = open(dir.path());
    let half_hour = T0 + 30 * 60_000_000;
    store.append(&row_of_s(half_hour, 1.0)).unwrap();
    store.flush().unwrap();
    // Agent rows of another table with one key twice.
    for power in [100.0, 200.0] {
        let mut b = BatchBuilder::new(&GPU_V1);
        b.push(T0, &["0"], &[Value::F64(power)]).unwrap();
        store.append(&b.finish()).unwrap();
        store.flush().unwrap();
    }
    store.compact_all(T0 + 40 * 60_000_000, "scraped").unwrap();
    // A later import: an earlier sample, then the stored one repeated.
    let mut b = BatchBuilder::new(&tables::SCRAPED);
    b.push(T0, &["", "s", ""], &[Value::F64(5.0)]).unwrap();
    b.push(half_hour, &["", "s", ""], &[Value::F64(2.0)])
        .unwrap();
    store.append(&b.finish()).unwrap();
    store.flush().unwrap();
    // Ten more imports of the stored sample, each its own part.
    for value in 3..13 {
        store.append(&row_of_s(half_hour, value as f64)).unwrap();
        store.flush().unwrap();
    }
    store.compact_all(T0 + 40 * 60_000_000, "scraped").unwrap();
    let values = rows_of_s(&store);
    assert_eq!(values, [(T0, 5.0), (half_hour, 1.0)]);
    let gpu = store
        .scan(&ScanRequest {
            table: "gpu".into(),
            ..Default::default()
        })
        .unwrap();
    assert_eq!(gpu.batches.iter().map(|b| b.num_rows()).sum::<usize>(), 2);
}

/// A killed import's repeats merged by the agent's own merge (which keeps
/// every row) beside the value the store held, then an import run again:
/// the value written first is still the one kept. The agent's merge ordered
/// its inputs by time and name, so the killed import's file, starting
/// earlier, put its repeat first in the merged file.
#[test]
fn the_agents_merge_keeps_repeats_in_the_order_they_were_written() {
    let dir = tempfile::tempdir().unwrap();
    let mut store = open(dir.path());
    let half_hour = T0 + 30 * 60_000_000;
    store.append(&row_of_s(half_hour, 1.0)).unwrap();
    store.flush().unwrap();
    let mut killed = BatchBuilder::new(&tables::SCRAPED);
    killed.push(T0, &["", "s", ""], &[Value::F64(5.0)]).unwrap();
    killed
        .push(half_hour, &["", "s", ""], &[Value::F64(2.0)])
        .unwrap();
    store.append(&killed.finish()).unwrap();
    store.flush().unwrap();
    store.compact(T0 + 2 * DAY_US).unwrap();
    assert_eq!(all_scraped(&store).len(), 3, "the agent's merge keeps both");
    store.append(&row_of_s(half_hour, 3.0)).unwrap();
    store.flush().unwrap();
    store.compact_all(T0 + 2 * DAY_US, "scraped").unwrap();
    let values = rows_of_s(&store);
    assert_eq!(values, [(T0, 5.0), (half_hour, 1.0)]);
}

/// Rows of the running hour reach a Parquet file once they waited
/// `max_publish_delay`, not at the hour's end: a plain reader of the files
/// (DuckDB's glob) sees them, and a reader beside the store sees each once.
#[test]
fn rows_of_the_running_hour_are_published_after_the_delay() {
    let dir = tempfile::tempdir().unwrap();
    let mut o = options(dir.path());
    o.max_publish_delay = Some(std::time::Duration::from_millis(200));
    let mut store = Store::open(o, Catalog::new(&[&tables::SCRAPED, &GPU_V1]).unwrap()).unwrap();
    let mut rows = append_scraped(&mut store, T0, 40);
    let running = T0 + 60_000_000;
    store.tick(running).unwrap();
    assert!(
        parquet_files(dir.path()).is_empty(),
        "not yet: it just arrived"
    );
    std::thread::sleep(std::time::Duration::from_millis(250));
    store.tick(running).unwrap();
    assert_eq!(
        parquet_files(dir.path()).len(),
        1,
        "published while the hour runs"
    );
    assert_eq!(store.buffered_rows(), 0);
    // Later rows wait their own delay.
    rows.extend(append_scraped(&mut store, T0 + 10_000_000, 40));
    store.tick(running).unwrap();
    assert_eq!(parquet_files(dir.path()).len(), 1);
    std::thread::sleep(std::time::Duration::from_millis(250));
    store.tick(running).unwrap();
    assert_eq!(parquet_files(dir.path()).len(), 2);
    rows.sort();
    let beside = scan::scan_dir(
        dir.path(),
        &Catalog::new(&[&tables::SCRAPED, &GPU_V1]).unwrap(),
        &ScanRequest {
            table: "scraped".into(),
            ..Default::default()
        },
    )
    .unwrap();
    assert_eq!(scraped_rows(&beside), rows);

    // Without a delay, the running hour stays in memory and the WAL.
    let dir = tempfile::tempdir().unwrap();
    let mut o = options(dir.path());
    o.max_publish_delay = None;
    let mut store = Store::open(o, Catalog::new(&[&tables::SCRAPED, &GPU_V1]).unwrap()).unwrap();
    append_scraped(&mut store, T0, 40);
    store.tick(running).unwrap();
    std::thread::sleep(std::time::Duration::from_millis(250));
    store.tick(running).unwrap();
    assert!(parquet_files(dir.path()).is_empty());
}

/// A partition that cannot be written (here a file where its directory
/// goes; in the field an immutable or read-only directory) holds back its
/// own table's rows only: the tables that sort after it are published on
/// time, and its rows are published once it can be written.
#[test]
fn an_unwritable_partition_holds_back_only_its_own_table() {
    let dir = tempfile::tempdir().unwrap();
    let mut store = open(dir.path());
    let mut gpu = BatchBuilder::new(&GPU_V1);
    gpu.push(T0, &["0"], &[Value::F64(300.0)]).unwrap();
    store.append(&gpu.finish()).unwrap();
    append_scraped(&mut store, T0, 8);
    // "gpu" sorts before "scraped".
    let blocked = dir.path().join("tables/gpu/date=2025-11-21");
    fs::create_dir_all(blocked.parent().unwrap()).unwrap();
    fs::write(&blocked, "not a directory").unwrap();
    let after_the_hour = T0 + HOUR_US + 10 * 60 * 1_000_000;
    assert!(store.tick(after_the_hour).is_err(), "the failure is said");
    let published = parquet_files(dir.path());
    assert_eq!(published.len(), 1, "{published:?}");
    assert!(published[0].starts_with(dir.path().join("tables/scraped")));
    fs::remove_file(&blocked).unwrap();
    store.tick(after_the_hour + 1_000_000).unwrap();
    assert_eq!(parquet_files(dir.path()).len(), 2);
}

/// Something other than a file under a store file's name is moved aside at
/// open, never waited on: a FIFO's open would wait for a writer.
#[test]
fn a_fifo_or_directory_named_as_a_store_file_is_quarantined_not_waited_on() {
    let dir = tempfile::tempdir().unwrap();
    let mut store = open(dir.path());
    let rows = append_scraped(&mut store, T0, 8);
    store.close().unwrap();
    let partition = parquet_files(dir.path())[0].parent().unwrap().to_owned();
    let fifo = partition.join("audit.parquet");
    let name = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    // SAFETY: mkfifo reads the NUL-terminated path only.
    assert_eq!(unsafe { libc::mkfifo(name.as_ptr(), 0o600) }, 0);
    fs::create_dir(partition.join("dir.parquet")).unwrap();
    let started = std::time::Instant::now();
    let store = open(dir.path());
    assert!(started.elapsed() < Duration::from_secs(10));
    assert_eq!(store.stats().files_quarantined, 2);
    assert!(!fifo.exists() && !partition.join("dir.parquet").exists());
    assert_eq!(all_scraped(&store).len(), rows.len());
}

/// A merge stopped between removing its inputs and publishing its output
/// leaves the day's rows under a name that DuckDB and the other readers do
/// not read: verify names it; a merge under way (its inputs still there)
/// is not named.
#[test]
fn verify_names_a_merge_that_did_not_finish() {
    let dir = tempfile::tempdir().unwrap();
    let mut store = open(dir.path());
    for h in 0..3 {
        append_scraped(&mut store, T0 + h * HOUR_US, 8);
        store.flush().unwrap();
    }
    let inputs: Vec<(std::path::PathBuf, Vec<u8>)> = parquet_files(dir.path())
        .into_iter()
        .map(|p| (p.clone(), fs::read(&p).unwrap()))
        .collect();
    assert_eq!(store.compact(T0 + 2 * DAY_US).unwrap(), 1);
    store.close().unwrap();
    let merged = parquet_files(dir.path()).remove(0);
    let name = merged.file_name().unwrap().to_str().unwrap();
    let pending = merged.with_file_name(vtax_store::files::pending_name(name));
    fs::rename(&merged, &pending).unwrap();
    let verified = vtax_store::files::verify_store(dir.path()).unwrap();
    assert!(verified.damaged.is_empty());
    assert_eq!(verified.unfinished_merges, [pending]);
    // Its inputs back: a merge under way, not one that stopped.
    for (path, bytes) in &inputs {
        fs::write(path, bytes).unwrap();
    }
    let verified = vtax_store::files::verify_store(dir.path()).unwrap();
    assert!(verified.unfinished_merges.is_empty());
}

/// A command run as root on a store that its agent's user can write must
/// not act through links planted in it: the `LOCK`, a WAL segment, a
/// partition, `quarantine/`. Each is refused or left out, and what it
/// points to outside the store stays as it was.
#[test]
fn links_planted_in_the_store_are_not_followed() {
    let dir = tempfile::tempdir().unwrap();
    let store_dir = dir.path().join("store");
    let outside = dir.path().join("outside");
    fs::create_dir_all(&outside).unwrap();
    let decoy = outside.join("decoy.txt");
    fs::write(&decoy, "operator's notes\n".repeat(100)).unwrap();
    let decoy_bytes = fs::read(&decoy).unwrap();
    let mut o = options(&store_dir);
    let catalog = || Catalog::new(&[&tables::SCRAPED]).unwrap();
    let expected = {
        let mut store = Store::open(o.clone(), catalog()).unwrap();
        let mut rows = Vec::new();
        for d in 0..3 {
            rows.extend(append_scraped(&mut store, T0 + d * DAY_US, 40));
            store.flush().unwrap();
        }
        store.close().unwrap();
        rows
    };

    // The LOCK: refused, naming the link; the decoy is not cut to a pid.
    let lock = store_dir.join("LOCK");
    let _ = fs::remove_file(&lock);
    std::os::unix::fs::symlink(&decoy, &lock).unwrap();
    let error = Store::open(o.clone(), catalog())
        .err()
        .expect("a linked LOCK");
    assert!(error.to_string().contains("symbolic link"), "{error}");
    assert_eq!(fs::read(&decoy).unwrap(), decoy_bytes);
    fs::remove_file(&lock).unwrap();

    // A WAL segment that is a link (newest, so a torn tail would be cut)
    // is left out of the log; the decoy keeps every byte.
    let segment = store_dir.join("wal/99999999999999999999.wal");
    std::os::unix::fs::symlink(&decoy, &segment).unwrap();
    // A partition that is a link to a directory of someone else's files,
    // dated to expire; and a day's partition moved aside for a linked
    // quarantine/ to be tested below.
    let linked_day = store_dir.join("tables/scraped/date=2025-11-01");
    let elsewhere = outside.join("dataset");
    fs::create_dir_all(&elsewhere).unwrap();
    fs::write(
        elsewhere.join("test-1761955200000000-1.parquet"),
        b"not ours",
    )
    .unwrap();
    std::os::unix::fs::symlink(&elsewhere, &linked_day).unwrap();
    // An operator's own `.tmp` file in a partition, and a directory under
    // such a name: neither is a stray of a publish.
    let first_day = parquet_files(&store_dir)[0].parent().unwrap().to_path_buf();
    fs::write(first_day.join("export.tmp"), b"mine").unwrap();
    fs::create_dir(first_day.join("scratch.tmp")).unwrap();

    o.retention_max_age = Some(std::time::Duration::from_secs(400 * 86_400));
    let mut store = Store::open(o.clone(), catalog()).unwrap();
    assert_eq!(
        all_scraped(&store),
        expected,
        "every row, none from the link"
    );
    assert_eq!(store.stats().files_quarantined, 0);
    assert_eq!(store.apply_retention(T0 + 3 * DAY_US).unwrap(), 0);
    store.close().unwrap();
    assert_eq!(fs::read(&decoy).unwrap(), decoy_bytes);
    assert!(segment.symlink_metadata().unwrap().file_type().is_symlink());
    assert_eq!(
        fs::read(elsewhere.join("test-1761955200000000-1.parquet")).unwrap(),
        b"not ours"
    );
    assert_eq!(fs::read(first_day.join("export.tmp")).unwrap(), b"mine");
    assert!(first_day.join("scratch.tmp").is_dir());
    let foreign = vtax_store::files::foreign_partitions(&store_dir);
    assert_eq!(
        foreign,
        [vtax_store::files::ForeignDir {
            path: linked_day.clone(),
            parquet_files: 1,
            linked: true,
        }]
    );
    fs::remove_file(&linked_day).unwrap();

    // quarantine/ a link: a damaged file is not moved where it points, and
    // stays where it is, counted.
    let damaged = parquet_files(&store_dir)[0].clone();
    fs::write(&damaged, b"garbage").unwrap();
    std::os::unix::fs::symlink(&outside, store_dir.join("quarantine")).unwrap();
    let store = Store::open(o.clone(), catalog()).unwrap();
    assert_eq!(store.stats().files_quarantined, 0);
    assert_eq!(store.stats().files_damaged_in_place, 1);
    drop(store);
    assert_eq!(fs::read(&damaged).unwrap(), b"garbage");
    assert_eq!(
        fs::read_dir(&outside).unwrap().count(),
        2,
        "the decoy and the dataset only"
    );
}

/// A table directory that is a link (a store owner's, to a directory of
/// root's) takes no file: the flush fails naming the link, nothing is made
/// where it points, the rows wait in the WAL, synced, and once the link is
/// gone they are published.
/// (The partition was made with create_dir_all, which followed it, and
/// `vtax import` as root wrote its files there.)
#[test]
fn a_table_directory_that_is_a_link_takes_no_file() {
    let dir = tempfile::tempdir().unwrap();
    let store_dir = dir.path().join("store");
    let outside = dir.path().join("outside");
    fs::create_dir_all(&outside).unwrap();
    fs::create_dir_all(store_dir.join("tables")).unwrap();
    std::os::unix::fs::symlink(&outside, store_dir.join("tables/scraped")).unwrap();
    let mut store = open(&store_dir);
    let rows = append_scraped(&mut store, T0, 40);
    let error = store.flush().expect_err("a linked table takes no file");
    assert!(error.to_string().contains("symbolic link"), "{error}");
    assert_eq!(fs::read_dir(&outside).unwrap().count(), 0);
    // The process ends there (a stop whose last flush failed): the rows are
    // in the WAL, synced before the publish was tried, not lost with it.
    drop(store);
    fs::remove_file(store_dir.join("tables/scraped")).unwrap();
    let mut store = open(&store_dir);
    store.flush().unwrap();
    assert_eq!(all_scraped(&store), rows);
    let more = append_scraped(&mut store, T0 + HOUR_US, 40);
    store.close().unwrap();
    let store = open(&store_dir);
    assert_eq!(all_scraped(&store), [rows, more].concat());
    drop(store);
    assert_eq!(fs::read_dir(&outside).unwrap().count(), 0);
    // `tables/` itself a link: the store does not open, and says why.
    let moved = dir.path().join("tables-elsewhere");
    fs::rename(store_dir.join("tables"), &moved).unwrap();
    std::os::unix::fs::symlink(&moved, store_dir.join("tables")).unwrap();
    let error = Store::open(
        options(&store_dir),
        Catalog::new(&[&tables::SCRAPED]).unwrap(),
    )
    .err()
    .expect("a linked tables/")
    .to_string();
    assert!(
        error.contains("tables")
            && error.contains("a symbolic link")
            && error.contains("make the data directory itself the link"),
        "{error}"
    );
}

/// A file moved to quarantine never replaces an earlier copy of its name.
#[test]
fn quarantine_keeps_an_earlier_copy_of_the_same_name() {
    let dir = tempfile::tempdir().unwrap();
    {
        let mut store = open(dir.path());
        append_scraped(&mut store, T0, 40);
        store.close().unwrap();
    }
    let file = parquet_files(dir.path())[0].clone();
    let good = fs::read(&file).unwrap();
    for damage in [&b"first"[..], b"second"] {
        fs::write(&file, damage).unwrap();
        let store = open(dir.path());
        assert_eq!(store.stats().files_quarantined, 1);
        drop(store);
        fs::write(&file, &good).unwrap();
    }
    let mut kept = std::collections::BTreeSet::new();
    let mut stack = vec![dir.path().join("quarantine")];
    while let Some(d) = stack.pop() {
        for e in fs::read_dir(&d).unwrap().flatten() {
            if e.file_type().unwrap().is_dir() {
                stack.push(e.path());
            } else {
                kept.insert(fs::read(e.path()).unwrap());
            }
        }
    }
    assert!(kept.contains(&b"first"[..]) && kept.contains(&b"second"[..]));
}
