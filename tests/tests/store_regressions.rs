//! Deterministic reproductions of store bugs that the crash and disk-full proofs
//! (`crash.rs`, `disk_full.rs`) found, kept as regression tests. "Crash" here is
//! dropping the store without `flush`/`close`: like a SIGKILL, it leaves the
//! files as they are and loses only what was in memory.

use std::path::Path;
use std::time::Duration;

use vtax_store::tables::ScrapedRow;
use vtax_store::{scan, ScanRequest, Store, StoreOptions, HOUR_US};
use vtax_tests::{batch, catalog, sample, IdCounts};

fn options(dir: &Path) -> StoreOptions {
    let mut o = StoreOptions::new(dir);
    o.node = "bug".into();
    // Only explicit syncs; nothing published by age.
    o.sync_interval = Duration::from_secs(3600);
    o.publish_grace = Duration::from_secs(3600);
    o
}

/// Rows of `scraped` at `time_us`, one per id, value = id (the row scheme's
/// times do not matter here: these rows need to land in chosen hours).
fn rows_at(time_us: i64, ids: std::ops::Range<u64>) -> vtax_store::Batch {
    let mut b = vtax_store::BatchBuilder::new(&vtax_store::tables::SCRAPED);
    for id in ids {
        let row = ScrapedRow {
            target: "",
            metric: "m",
            labels: &format!("series=\"{}\"", id % 4),
            value: Some(id as f64),
        };
        b.push_row(time_us, &row).unwrap();
    }
    b.finish()
}

fn values(store: &Store) -> IdCounts {
    let req = ScanRequest {
        table: "scraped".into(),
        ..Default::default()
    };
    vtax_tests::value_counts(&store.scan(&req).unwrap())
}

/// A bucket published (by the memory bound, or by `flush` before its `sync`) holds
/// WAL frames that were never written to the WAL. After a crash the WAL restarted
/// its sequence numbers below the file's watermark, so the next frames of that
/// hour got numbers the file already "covers", and replay skipped them: rows
/// acknowledged by a completed `sync` were lost.
#[test]
fn acknowledged_rows_survive_a_crash_after_a_publish_that_ran_ahead_of_the_wal() {
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path();
    let hour = vtax_tests::T0;
    {
        let mut o = options(dir);
        o.max_buffered_bytes = 1; // tick publishes at once
        let mut store = Store::open(o, catalog()).unwrap();
        store.append(&rows_at(hour, 0..10)).unwrap(); // seq 1
        store.sync().unwrap(); // ids 0..10 durable
        store.append(&rows_at(hour + 1, 10..20)).unwrap(); // seq 2, not yet written
        store.append(&rows_at(hour + 2, 20..30)).unwrap(); // seq 3, not yet written
                                                           // Publishes the hour's bucket (watermark 3) before the WAL holds seq 2, 3.
        store.tick(hour + 3).unwrap();
        // Crash before the next sync.
    }
    {
        let mut store = Store::open(options(dir), catalog()).unwrap();
        store.append(&rows_at(hour + 3, 30..40)).unwrap(); // seq 2 again?
        store.append(&rows_at(hour + 4, 40..50)).unwrap(); // seq 3 again?
        store.append(&rows_at(hour + 5, 50..60)).unwrap();
        store.sync().unwrap(); // ids 30..60 acknowledged durable
                               // Crash before the bucket is published.
    }
    let req = ScanRequest {
        table: "scraped".into(),
        ..Default::default()
    };
    let read_only = scan::scan_dir(dir, &catalog(), &req).unwrap();
    let counts = {
        use arrow_array::cast::AsArray;
        let mut ids = Vec::new();
        for batch in &read_only.batches {
            let v = batch
                .column(4)
                .as_primitive::<arrow_array::types::Float64Type>();
            ids.extend(v.values().iter().map(|&x| x as u64));
        }
        IdCounts::new(&ids)
    };
    for (who, counts) in [
        ("a reader", counts),
        (
            "the reopened store",
            values(&Store::open(options(dir), catalog()).unwrap()),
        ),
    ] {
        let lost: Vec<u64> = [0..10, 30..60]
            .into_iter()
            .flat_map(|r| counts.missing_in(r))
            .collect();
        assert!(
            lost.is_empty(),
            "{who} lacks acknowledged ids {}",
            sample(&lost)
        );
        assert!(
            counts.duplicates().is_empty(),
            "{who}: {:?}",
            counts.duplicates()
        );
    }
}

/// When the WAL write of a `sync` fits on the disk but starting the next segment
/// does not, `new_segment` leaves an empty `<next_seq>.wal` behind. The old
/// segment stays open and keeps taking frames, but `remove_segments_below`
/// believes every segment ends where the next name begins, so once space is back
/// it deletes the old segment while it still holds frames of a bucket that is
/// not published: a crash then loses rows whose `sync` succeeded.
#[test]
fn a_failed_segment_rotation_does_not_let_needed_frames_be_deleted() {
    let Some(tmpfs) = vtax_tests::tmpfs::Tmpfs::mount_or_skip("1m") else {
        return;
    };
    let dir = tmpfs.path().join("store");
    let wal_dir = dir.join("wal");
    let mut o = options(&dir);
    o.wal_segment_bytes = 16 << 10;
    o.publish_grace = Duration::ZERO;
    let hour0 = vtax_tests::T0 + 60_000_000;
    let hour1 = hour0 + HOUR_US;
    let mut next = 0;
    let (empty, error) = {
        let mut store = Store::open(o.clone(), catalog()).unwrap();
        let segment = || {
            vtax_store::wal::list_segments(&wal_dir).unwrap()[0]
                .1
                .clone()
        };
        let len = |p: &Path| std::fs::metadata(p).unwrap().len();
        // Fill the first segment to just under its size with synced hour-0 frames.
        let mut frame = 0;
        loop {
            let before = len(&segment());
            if frame > 0 && before + frame >= o.wal_segment_bytes {
                break;
            }
            store.append(&rows_at(hour0, next..next + 100)).unwrap();
            next += 100;
            store.sync().unwrap();
            frame = len(&segment()) - before;
        }
        // Leave exactly the pages the next frame needs, and not one more.
        let page = 4096;
        let l = len(&segment());
        let needed = (l + frame).div_ceil(page) - l.div_ceil(page);
        let ballast = tmpfs.path().join("ballast");
        std::fs::write(
            &ballast,
            vec![1u8; (tmpfs.free_bytes() - needed * page) as usize],
        )
        .unwrap();
        assert_eq!(tmpfs.free_bytes(), needed * page);
        store.append(&rows_at(hour0, next..next + 100)).unwrap();
        next += 100;
        let e = store
            .sync()
            .expect_err("the frame fits, the next segment does not");
        assert!(e.is_disk_full(), "{e}");
        let segments = vtax_store::wal::list_segments(&wal_dir).unwrap();
        let empty: Vec<_> = segments
            .iter()
            .filter(|(_, p)| len(p) < 8)
            .map(|(_, p)| p.clone())
            .collect();
        // Space returns; an hour-1 frame goes into the old segment, which rotates.
        std::fs::remove_file(&ballast).unwrap();
        store.append(&rows_at(hour1, next..next + 100)).unwrap();
        next += 100;
        store.sync().expect("space is back");
        // Publishing hour 0 drops WAL segments below hour 1's first frame.
        store.tick(hour1 + 1_000_000).unwrap();
        // Crash.
        (empty, e.to_string())
    };
    let store = Store::open(o, catalog()).unwrap();
    let counts = values(&store);
    let missing = counts.missing_in(0..next);
    assert!(
        missing.is_empty(),
        "rows acknowledged by a successful sync are lost: {}",
        sample(&missing)
    );
    assert!(
        empty.is_empty(),
        "a failed rotation left partial WAL segments {empty:?} (error: {error})"
    );
}

/// A merged file is named `<node>-<first time>-<highest watermark>`, with a
/// suffix when that name exists. Once a merge's inputs are deleted their names are
/// free again, so a later merge can take the name of a file that an existing
/// merged file lists in `vtax.compacted_from`. If the later merge is killed before
/// it removes its own inputs, the next open (and every reader) takes the new file
/// for a replaced input of the old one and the old one for an input of the new
/// one: both are dropped, and the whole day with them.
///
/// Here: hour 0's two parts merge into `…-3-1` (their own `…-3` was taken by the
/// part holding both the earliest row and the highest watermark); the day merge
/// of `…-3-1` and hour 1's file is then named `…-3`, the deleted part's name.
/// The inputs are put back beside the published day file, as a store did
/// before a merged file kept a pending name until its inputs were gone: such
/// stores are still read, and cleaned at open.
#[test]
fn a_day_merge_killed_before_removing_its_inputs_loses_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path();
    let day = vtax_tests::T0;
    let mut o = options(dir);
    o.publish_grace = Duration::ZERO;
    let mut store = Store::open(o.clone(), catalog()).unwrap();
    store
        .append(&rows_at(day + HOUR_US + 600_000_000, 0..10))
        .unwrap(); // hour 1, seq 1
    store.flush().unwrap();
    store.append(&rows_at(day + 1_800_000_000, 10..20)).unwrap(); // hour 0 at 00:30, seq 2
    store.flush().unwrap();
    store.append(&rows_at(day + 600_000_000, 20..30)).unwrap(); // hour 0 at 00:10, seq 3
    store.flush().unwrap();
    // The day runs on: hour 0's two parts are sealed into one file.
    assert_eq!(store.compact(day + 3 * HOUR_US).unwrap(), 1);
    let before_day_merge: Vec<(std::path::PathBuf, Vec<u8>)> = vtax_tests::table_files(dir)
        .parquet
        .into_iter()
        .map(|p| (p.clone(), std::fs::read(&p).unwrap()))
        .collect();
    // The day is over: its two files are merged into one.
    assert_eq!(store.compact(day + 2 * vtax_store::DAY_US).unwrap(), 1);
    assert!(values(&store).missing_in(0..30).is_empty());
    drop(store);
    // Every row is in a file, so the WAL may be gone (as it is, truncated, in a
    // store that ran on): only the files count.
    std::fs::remove_dir_all(dir.join("wal")).unwrap();
    // A kill after the day's file was published but before its inputs were
    // removed leaves them beside it.
    for (path, bytes) in &before_day_merge {
        std::fs::write(path, bytes).unwrap();
    }
    let on_disk = vtax_tests::table_files(dir).parquet;
    let read_only = {
        let req = ScanRequest {
            table: "scraped".into(),
            ..Default::default()
        };
        scan::scan_dir(dir, &catalog(), &req).unwrap().rows()
    };
    let store = Store::open(o, catalog()).unwrap();
    let counts = values(&store);
    assert!(
        read_only == 30 && counts.missing_in(0..30).is_empty(),
        "rows lost: a reader saw {read_only} of 30, the reopened store lacks {}; files \
         before open: {on_disk:#?}, after: {:#?}",
        sample(&counts.missing_in(0..30)),
        vtax_tests::table_files(dir).parquet
    );
}

/// A crash (or power loss on a filesystem that extends a file before its data
/// lands) can leave zero bytes at the end of a WAL segment. Zeros read as a
/// frame header of length 0 whose CRC (that of nothing) is 0, so the check
/// passes, and decoding the empty frame must not turn a torn tail into a store
/// that cannot open.
#[test]
fn a_zero_filled_wal_tail_is_cut_like_a_torn_one() {
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path();
    {
        let mut store = Store::open(options(dir), catalog()).unwrap();
        store.append(&batch(0..10)).unwrap();
        store.sync().unwrap();
    }
    let segment = vtax_store::wal::list_segments(&dir.join("wal"))
        .unwrap()
        .last()
        .unwrap()
        .1
        .clone();
    let mut bytes = std::fs::read(&segment).unwrap();
    bytes.extend_from_slice(&[0; 64]);
    std::fs::write(&segment, bytes).unwrap();
    let read_only = {
        let req = ScanRequest {
            table: "scraped".into(),
            ..Default::default()
        };
        scan::scan_dir(dir, &catalog(), &req).map(|r| r.rows())
    };
    assert!(matches!(read_only, Ok(10)), "a reader: {read_only:?}");
    let store = Store::open(options(dir), catalog()).expect("open cuts the zeros");
    assert!(values(&store).missing_in(0..10).is_empty());
    assert_eq!(store.stats().wal_torn_bytes, 64);
}

/// Rows of `scraped` with ids in `ids`, one a second from `first_time_us`,
/// value = id, over four series: unique in tags and time, so that an
/// import's merge, which keeps one row per series and instant, keeps each.
fn rows_spread(first_time_us: i64, ids: std::ops::Range<u64>) -> vtax_store::Batch {
    let mut b = vtax_store::BatchBuilder::new(&vtax_store::tables::SCRAPED);
    for id in ids.clone() {
        let row = ScrapedRow {
            target: "",
            metric: "m",
            labels: &format!("series=\"{}\"", id % 4),
            value: Some(id as f64),
        };
        let time_us = first_time_us + (id - ids.start) as i64 * 1_000_000;
        b.push_row(time_us, &row).unwrap();
    }
    b.finish()
}

/// Publishes one file of ten rows at each of `times_us`, ids from `*next` on.
fn publish_parts(store: &mut Store, times_us: &[i64], next: &mut u64) {
    for &time_us in times_us {
        store
            .append(&rows_spread(time_us, *next..*next + 10))
            .unwrap();
        store.flush().unwrap();
        *next += 10;
    }
}

/// One of the ways the store merges files: the files it starts from, and
/// the call that merges them.
struct MergePath {
    what: &'static str,
    max_merge_inputs: usize,
    /// Publishes the files to merge; returns how many ids it wrote (from 0).
    files: fn(&mut Store) -> u64,
    merge: fn(&mut Store),
}

/// An hour of the day after `T0` that is neither its first nor its last.
const HOUR5: i64 = vtax_tests::T0 + 5 * HOUR_US;
/// Ten minutes in seconds, in microseconds.
const MINUTE_US: i64 = 60_000_000;

fn merge_paths() -> Vec<MergePath> {
    vec![
        MergePath {
            what: "the running hour's parts, merged in a tier",
            max_merge_inputs: 8,
            files: |store| {
                let mut next = 0;
                let parts: Vec<i64> = (0..4).map(|i| HOUR5 + i * MINUTE_US).collect();
                publish_parts(store, &parts, &mut next);
                next
            },
            merge: |store| assert_eq!(store.compact(HOUR5 + 30 * MINUTE_US).unwrap(), 1),
        },
        MergePath {
            what: "a finished hour's parts, sealed into one file",
            max_merge_inputs: 8,
            files: |store| {
                let mut next = 0;
                let parts: Vec<i64> = (0..3).map(|i| HOUR5 + i * MINUTE_US).collect();
                publish_parts(store, &parts, &mut next);
                next
            },
            merge: |store| assert_eq!(store.compact(HOUR5 + 3 * HOUR_US).unwrap(), 1),
        },
        MergePath {
            what: "a finished day's hours, merged in rounds (vtax compact)",
            max_merge_inputs: 2,
            files: |store| {
                let mut next = 0;
                let hours: Vec<i64> = (0..4).map(|h| vtax_tests::T0 + h * HOUR_US).collect();
                publish_parts(store, &hours, &mut next);
                next
            },
            merge: |store| {
                assert_eq!(
                    store
                        .compact(vtax_tests::T0 + 2 * vtax_store::DAY_US)
                        .unwrap(),
                    3
                )
            },
        },
        MergePath {
            what: "a merged day that a late row reopens",
            max_merge_inputs: 8,
            files: |store| {
                let mut next = 0;
                let hours: Vec<i64> = (0..2).map(|h| vtax_tests::T0 + h * HOUR_US).collect();
                publish_parts(store, &hours, &mut next);
                let day_over = vtax_tests::T0 + 2 * vtax_store::DAY_US;
                assert_eq!(store.compact(day_over).unwrap(), 1);
                publish_parts(store, &[vtax_tests::T0 + 2 * HOUR_US], &mut next);
                next
            },
            merge: |store| {
                assert_eq!(
                    store
                        .compact(vtax_tests::T0 + 2 * vtax_store::DAY_US)
                        .unwrap(),
                    1
                )
            },
        },
        MergePath {
            what: "vtax import's merge of the hour it wrote",
            max_merge_inputs: 8,
            files: |store| {
                let mut next = 0;
                publish_parts(store, &[HOUR5, HOUR5 + MINUTE_US], &mut next);
                next
            },
            merge: |store| {
                assert_eq!(
                    store
                        .compact_all(HOUR5 + 30 * MINUTE_US, "scraped")
                        .unwrap(),
                    1
                )
            },
        },
        MergePath {
            what: "the agent's compaction thread",
            max_merge_inputs: 8,
            files: |store| {
                let mut next = 0;
                let parts: Vec<i64> = (0..3).map(|i| HOUR5 + i * MINUTE_US).collect();
                publish_parts(store, &parts, &mut next);
                next
            },
            merge: |store| {
                let mut compactor = vtax_store::Compactor::new(Duration::ZERO);
                let deadline = std::time::Instant::now() + Duration::from_secs(120);
                let report = loop {
                    if let Some(report) = compactor.poll(store, HOUR5 + 3 * HOUR_US) {
                        break report;
                    }
                    assert!(std::time::Instant::now() < deadline, "no cycle's end");
                    std::thread::sleep(Duration::from_millis(2));
                };
                // A kill on the compaction thread kills the whole process.
                if let Some(vtax_store::Error::Panicked(message)) = &report.merge_error {
                    panic!("{message}");
                }
                assert!(report.merge_error.is_none(), "{:?}", report.merge_error);
                assert_eq!(report.merges, 1);
            },
        },
    ]
}

/// A kill at any step of a merge, for every way the store merges: while the
/// merged file is written, once it is in place, after each of its inputs is
/// deleted, and before it takes its published name; and a merge let run to
/// its end. After each: (a) a plain glob of `*.parquet`, read file by file
/// as DuckDB's `read_parquet` would, counts every row once, or, between the
/// first deletion and the rename, leaves out the rows of the deleted inputs
/// and only those; (b) `vtax query`'s reader and `vtax verify` on the stopped
/// store read every row once and find nothing damaged; (c) the next open
/// finishes the merge and leaves every row exactly once, for the glob too.
///
/// A merge used to publish its file beside its inputs, then delete them: a
/// kill between the two left both, and a plain DuckDB glob counted a day's
/// rows 1.68 times until the agent's next start (issue 36).
#[test]
fn a_kill_at_any_step_of_any_merge_leaves_each_row_once_for_a_plain_glob() {
    for path in merge_paths() {
        let mut kills = 0;
        for step in 0.. {
            assert!(step < 32, "{}: the merge never ran to its end", path.what);
            let dir = tempfile::tempdir().unwrap();
            let dir = dir.path();
            let mut o = options(dir);
            o.max_merge_inputs = path.max_merge_inputs;
            let mut store = Store::open(o.clone(), catalog()).unwrap();
            let written = (path.files)(&mut store);
            let before: Vec<(std::path::PathBuf, Vec<u64>)> = vtax_tests::glob_values(dir).unwrap();
            store.kill_merges_at(Some(step));
            let killed =
                std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| (path.merge)(&mut store)))
                    .is_err();
            drop(store);
            // Every row is in a file, so the WAL may be gone (as it is,
            // truncated, in a store that ran on): only the files count.
            std::fs::remove_dir_all(dir.join("wal")).unwrap();
            let context = format!(
                "{}, {}",
                path.what,
                if killed {
                    format!("killed at step {step}")
                } else {
                    "run to its end".into()
                }
            );
            check_after_kill(dir, &o, written, &before, killed, &context);
            if !killed {
                break;
            }
            kills += 1;
        }
        // Writing, in place, each of two or more inputs deleted, all deleted.
        assert!(kills >= 4, "{}: {kills} kill points", path.what);
    }
}

/// What [`a_kill_at_any_step_of_any_merge_leaves_each_row_once_for_a_plain_glob`]
/// checks after each kill: ids `0..written` are stored; `before` is what a
/// glob read before the merge, file by file.
fn check_after_kill(
    dir: &Path,
    o: &StoreOptions,
    written: u64,
    before: &[(std::path::PathBuf, Vec<u64>)],
    killed: bool,
    context: &str,
) {
    let on_disk = vtax_tests::table_files(dir);
    let glob: Vec<u64> = vtax_tests::glob_values(dir)
        .unwrap()
        .into_iter()
        .flat_map(|(_, values)| values)
        .collect();
    let glob = IdCounts::new(&glob);
    // (a) Rows of the inputs deleted so far, and only those, are missing
    // from the glob until the merged file is published; none is doubled.
    let deleted: Vec<u64> = before
        .iter()
        .filter(|(path, _)| !path.exists())
        .flat_map(|(_, values)| values.iter().copied())
        .collect();
    let mut left_out: Vec<u64> = if on_disk.pending.is_empty() {
        Vec::new()
    } else {
        deleted
    };
    left_out.sort();
    assert!(
        glob.duplicates().is_empty(),
        "{context}: a plain glob counts rows twice (id, count): {:?}; files: {on_disk:#?}",
        glob.duplicates()
    );
    assert_eq!(
        glob.missing_in(0..written),
        left_out,
        "{context}: a plain glob misses other rows than those of the deleted inputs; \
         files: {on_disk:#?}"
    );
    if !killed {
        assert!(
            on_disk.pending.is_empty() && on_disk.temp.is_empty(),
            "{context}: {on_disk:#?}"
        );
    }
    // (b) The store's reader, as `vtax query` uses it, and `vtax verify`.
    let req = ScanRequest {
        table: "scraped".into(),
        ..Default::default()
    };
    let read_only = vtax_tests::value_counts(&scan::scan_dir(dir, &catalog(), &req).unwrap());
    assert!(
        read_only.duplicates().is_empty() && read_only.missing_in(0..written).is_empty(),
        "{context}: a reader of the stopped store doubles {:?} and misses {}; files: {on_disk:#?}",
        read_only.duplicates(),
        sample(&read_only.missing_in(0..written))
    );
    assert_eq!(read_only.distinct() as u64, written, "{context}");
    let verified = vtax_store::files::verify_store(dir).unwrap();
    assert!(
        verified.damaged.is_empty(),
        "{context}: {:?}",
        verified.damaged
    );
    // (c) The next open finishes the merge: each row once, for every reader.
    let store = Store::open(o.clone(), catalog()).unwrap();
    let counts = values(&store);
    assert!(
        counts.duplicates().is_empty() && counts.missing_in(0..written).is_empty(),
        "{context}: the reopened store doubles {:?} and misses {}",
        counts.duplicates(),
        sample(&counts.missing_in(0..written))
    );
    assert_eq!(store.stats().files_quarantined, 0, "{context}");
    drop(store);
    let after = vtax_tests::table_files(dir);
    assert!(
        after.pending.is_empty() && after.temp.is_empty(),
        "{context}: open left {after:#?}"
    );
    let glob: Vec<u64> = vtax_tests::glob_values(dir)
        .unwrap()
        .into_iter()
        .flat_map(|(_, values)| values)
        .collect();
    let glob = IdCounts::new(&glob);
    assert!(
        glob.duplicates().is_empty() && glob.missing_in(0..written).is_empty(),
        "{context}: after the open, a plain glob doubles {:?} and misses {}",
        glob.duplicates(),
        sample(&glob.missing_in(0..written))
    );
}
