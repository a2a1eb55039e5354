//! Deterministic reproductions of store bugs that the crash and disk-full proofs
//! (`crash.rs`, `disk_full.rs`) found, kept as regression tests. "Crash" here is
//! dropping the store without `flush`/`close`: like a SIGKILL, it leaves the
//! files as they are and loses only what was in memory.

use std::path::Path;
use std::time::Duration;

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
        b.push(
            time_us,
            &["", "m", &format!("series=\"{}\"", id % 4)],
            &[vtax_store::Value::F64(id as f64)],
        )
        .unwrap();
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
