//! A full disk: the store runs on a 2 MiB tmpfs until writes fail. It must say so
//! clearly (an error that is a disk-full error and names the path, and a counter),
//! leave no partial or corrupt file, keep a WAL that replays cleanly, keep every
//! row it accepted, and write again once space returns.
//!
//! Mounting a tmpfs needs root (CAP_SYS_ADMIN). Without it the test fails with a
//! message saying so, unless `VTAX_SKIP_TMPFS_TEST=1` is set, in which case it
//! says why it is skipped and passes.

use std::fs;
use std::path::{Path, PathBuf};
use std::time::Duration;

use vtax_store::{scan, wal, Error, ScanRequest, Store, StoreOptions};
use vtax_tests::tmpfs::Tmpfs;
use vtax_tests::{batch, catalog, read_parquet, sample, scanned_ids, table_files, IdCounts};

fn options(dir: &Path) -> StoreOptions {
    let mut o = StoreOptions::new(dir);
    o.node = "full".into();
    o.sync_interval = Duration::from_secs(3600);
    o.publish_grace = Duration::from_secs(3600);
    o.wal_segment_bytes = 64 << 10;
    o
}

fn scan_all() -> ScanRequest {
    ScanRequest {
        table: "scraped".into(),
        ..Default::default()
    }
}

/// Asserts the ids present are exactly `expected`, each once.
fn assert_exactly_once(ids: &[u64], expected: &[u64], context: &str) {
    let counts = IdCounts::new(ids);
    let duplicates = counts.duplicates();
    assert!(
        duplicates.is_empty(),
        "{context}: ids present more than once: {:?}",
        &duplicates[..duplicates.len().min(12)]
    );
    let expected_counts = IdCounts::new(expected);
    let missing: Vec<u64> = expected_counts
        .present()
        .filter(|&id| counts.count(id) == 0)
        .collect();
    assert!(
        missing.is_empty(),
        "{context}: accepted ids missing: {}",
        sample(&missing)
    );
    let extra: Vec<u64> = counts
        .present()
        .filter(|&id| expected_counts.count(id) == 0)
        .collect();
    assert!(
        extra.is_empty(),
        "{context}: ids never appended: {}",
        sample(&extra)
    );
}

/// No temp file is left, and every published file reads from end to end.
fn assert_files_whole(data_dir: &Path, context: &str) -> usize {
    let files = table_files(data_dir);
    assert!(
        files.temp.is_empty(),
        "{context}: partial files left: {:?}",
        files.temp
    );
    for path in &files.parquet {
        let file = read_parquet(path).unwrap_or_else(|e| panic!("{context}: {e}"));
        for row in &file.rows {
            row.id()
                .unwrap_or_else(|e| panic!("{context}: {}: {e}", path.display()));
        }
    }
    files.parquet.len()
}

/// Checks a disk-full error: what it is, and that it names where.
fn assert_disk_full_error(e: &Error, mount: &Path, what: &str) {
    let message = e.to_string();
    assert!(
        e.is_disk_full(),
        "{what} failed, but not as a full disk: {message}"
    );
    assert!(
        message.contains(&*mount.to_string_lossy()),
        "{what}: the error does not name the path: {message}"
    );
}

/// Checks that what the store reports of its size (for `/metrics`) is what
/// the files on disk hold.
fn assert_sizes_match_disk(store: &Store, data_dir: &Path, context: &str) {
    let size =
        |paths: &[PathBuf]| -> u64 { paths.iter().map(|p| fs::metadata(p).unwrap().len()).sum() };
    let segments: Vec<PathBuf> = wal::list_segments(&data_dir.join("wal"))
        .unwrap()
        .into_iter()
        .map(|(_, path)| path)
        .collect();
    assert_eq!(store.wal_bytes(), size(&segments), "{context}: WAL bytes");
    assert_eq!(
        store.table_bytes(),
        size(&table_files(data_dir).parquet),
        "{context}: table bytes"
    );
}

/// Checks the WAL as a reader (or the next open) would replay it: whole frames
/// only, nothing torn, nothing corrupt, no error.
fn assert_wal_replays_cleanly(data_dir: &Path, context: &str) {
    match wal::replay(&data_dir.join("wal"), &catalog(), false, |_| Ok(())) {
        Ok(report) => assert!(
            report.torn_bytes == 0 && report.damaged_segments.is_empty(),
            "{context}: the WAL holds partial or corrupt frames: {report:?}"
        ),
        Err(e) => panic!("{context}: the WAL does not replay: {e}"),
    }
}

/// Checks what a reader beside the writer sees: every row acknowledged by a
/// completed sync, once; later rows may be there (a publish that succeeded) or
/// not, but never twice and never one that was not appended.
fn assert_reader_sees(data_dir: &Path, accepted: &[u64], durable_len: usize, context: &str) {
    let read_only = scan::scan_dir(data_dir, &catalog(), &scan_all())
        .unwrap_or_else(|e| panic!("{context}: a reader fails: {e}"));
    let counts = IdCounts::new(&scanned_ids(&read_only).unwrap());
    assert!(
        counts.duplicates().is_empty(),
        "{context}: a reader sees ids twice: {:?}",
        counts.duplicates()
    );
    let lost: Vec<u64> = accepted[..durable_len]
        .iter()
        .copied()
        .filter(|&id| counts.count(id) == 0)
        .collect();
    assert!(
        lost.is_empty(),
        "{context}: acknowledged rows missing for a reader: {}",
        sample(&lost)
    );
    let accepted_counts = IdCounts::new(accepted);
    assert!(
        counts.present().all(|id| accepted_counts.count(id) == 1),
        "{context}: a reader sees ids that were never appended"
    );
}

#[test]
fn a_full_disk_is_reported_leaves_no_partial_file_and_writing_resumes() {
    let Some(tmpfs) = Tmpfs::mount_or_skip("2m") else {
        return;
    };
    let mount = tmpfs.path().to_owned();
    let data_dir: PathBuf = mount.join("store");

    // Ballast takes most of the space; deleting it (and growing the tmpfs) later
    // is the space returning.
    let ballast = mount.join("ballast");
    fs::write(&ballast, vec![0x5a; 1280 << 10]).unwrap();

    let mut store = Store::open(options(&data_dir), catalog()).unwrap();
    let mut accepted: Vec<u64> = Vec::new();
    // Rows up to here were acknowledged by a successful sync (or flush).
    let mut durable_len = 0;
    let append = |store: &mut Store, accepted: &mut Vec<u64>, rows: u64| {
        let from = accepted.len() as u64;
        store
            .append(&batch(from..from + rows))
            .map(|_| accepted.extend(from..from + rows))
    };

    // 1. Files and WAL fill the disk to within 64 KiB: append and sync, flushing
    //    while there is room for a round of small files.
    let mut rounds = 0;
    while tmpfs.free_bytes() >= 64 << 10 {
        rounds += 1;
        assert!(rounds < 5_000, "the tmpfs never filled");
        append(&mut store, &mut accepted, 200).expect("append while there is room");
        store.sync().expect("sync while there is room");
        durable_len = accepted.len();
        if rounds % 5 == 0 && tmpfs.free_bytes() > 256 << 10 {
            store.flush().expect("flush while there is room");
        }
    }
    let files_before = assert_files_whole(&data_dir, "before the disk filled");
    assert!(
        files_before > 0,
        "files were published before the disk filled"
    );

    // 2. A WAL write larger than the room left: part of it lands, then the disk
    //    is full. The error says so and where; the part that landed is cut back.
    let free = tmpfs.free_bytes();
    assert!(free > 0);
    append(&mut store, &mut accepted, 4_000).expect("append is in memory");
    let sync_error = store.sync().expect_err("4,000 rows of frames do not fit");
    assert_disk_full_error(&sync_error, &mount, "sync");
    assert!(
        sync_error.to_string().contains("wal"),
        "the sync error names the WAL segment: {sync_error}"
    );
    assert_wal_replays_cleanly(&data_dir, "after a WAL write failed partway");

    // 3. A publish meets the full disk: some of the ~100 small files a flush
    //    writes land, then one does not. No partial file stays.
    let flush_error = store
        .flush()
        .expect_err("a flush of 100 hours does not fit");
    assert_disk_full_error(&flush_error, &mount, "flush");
    assert!(
        flush_error.to_string().contains("tables"),
        "the flush error names the file it was publishing: {flush_error}"
    );
    eprintln!(
        "full after {rounds} rounds ({} rows, {free} bytes were free):\n  sync: {sync_error}\n  flush: {flush_error}",
        accepted.len()
    );

    // 4. Rows keep being accepted while the disk is full: held in memory, visible.
    let held_from = accepted.len();
    for _ in 0..5 {
        append(&mut store, &mut accepted, 200).expect("append holds rows while the disk is full");
    }
    let e = store.sync().expect_err("sync fails while the disk is full");
    assert_disk_full_error(&e, &mount, "sync while full");
    let e = store
        .flush()
        .expect_err("flush fails while the disk is full");
    assert_disk_full_error(&e, &mount, "flush while full");
    let visible = scanned_ids(&store.scan(&scan_all()).unwrap()).unwrap();
    assert_exactly_once(&visible, &accepted, "scan of the writer while full");

    // A counter says so.
    let stats = store.stats().clone();
    assert!(stats.disk_full_errors >= 4, "{stats:?}");
    assert!(stats.write_errors >= stats.disk_full_errors, "{stats:?}");
    assert_eq!(stats.rows_refused, 0, "rows are held, not refused");
    // The sizes it reports are what is on disk, the writes cut back included.
    assert_sizes_match_disk(&store, &data_dir, "while full");

    // Nothing partial or corrupt on disk; the WAL replays cleanly; a reader
    // (files plus WAL replay, read-only) sees every acknowledged row once.
    assert_files_whole(&data_dir, "while full");
    assert_wal_replays_cleanly(&data_dir, "while full");
    assert_reader_sees(&data_dir, &accepted, durable_len, "while full");

    // 5. Space returns. The held rows are written and fsynced by the next sync:
    //    whole frames after whole frames.
    fs::remove_file(&ballast).unwrap();
    tmpfs.resize("64m").unwrap();
    store.sync().expect("sync succeeds once space returns");
    assert_wal_replays_cleanly(&data_dir, "after the first sync with room again");
    assert_reader_sees(
        &data_dir,
        &accepted,
        accepted.len(),
        "after a sync with room again",
    );
    store.flush().expect("flush succeeds once space returns");
    assert_eq!(
        store.stats().disk_full_errors,
        stats.disk_full_errors,
        "no new errors once space returned"
    );
    let ids = scanned_ids(&store.scan(&scan_all()).unwrap()).unwrap();
    assert_exactly_once(&ids, &accepted, "the writer after space returned");
    let read_only =
        scanned_ids(&scan::scan_dir(&data_dir, &catalog(), &scan_all()).unwrap()).unwrap();
    assert_exactly_once(&read_only, &accepted, "a reader after space returned");
    assert_files_whole(&data_dir, "after space returned");

    // And it all survives a restart.
    store.close().unwrap();
    let store = Store::open(options(&data_dir), catalog()).unwrap();
    let ids = scanned_ids(&store.scan(&scan_all()).unwrap()).unwrap();
    assert_exactly_once(&ids, &accepted, "after reopening");
    drop(store);
    eprintln!(
        "{} rows accepted ({} while full) all read back exactly once; {stats:?}",
        accepted.len(),
        accepted.len() - held_from
    );
}

/// The WAL hands frames to the OS once a few MiB are pending, inside `append`,
/// before any `sync`. When that write meets a full disk, `append` still takes the
/// rows (held in memory), the partial write is cut back to a frame boundary, the
/// next `sync` reports the full disk, and once the tmpfs grows every row is
/// written and read back exactly once.
#[test]
fn a_wal_write_through_that_meets_a_full_disk_keeps_every_row() {
    let Some(tmpfs) = Tmpfs::mount_or_skip("6m") else {
        return;
    };
    let mount = tmpfs.path().to_owned();
    let data_dir = mount.join("store");
    let mut o = options(&data_dir);
    o.wal_segment_bytes = 64 << 20;
    let mut store = Store::open(o.clone(), catalog()).unwrap();
    let segment = wal::list_segments(&data_dir.join("wal")).unwrap()[0]
        .1
        .clone();
    let segment_len = || fs::metadata(&segment).unwrap().len();

    // About 11 MiB of frames without a sync: the first write-through (at 4 MiB
    // pending) fits, the second does not.
    let mut accepted = Vec::new();
    let mut lengths = Vec::new();
    let mut next = 0;
    while next < 400_000 {
        let ids = next..next + 20_000;
        store
            .append(&batch(ids.clone()))
            .expect("append takes rows; a failed write-through is reported by sync");
        accepted.extend(ids);
        next += 20_000;
        lengths.push(segment_len());
    }
    let written: Vec<u64> = {
        let mut l = lengths.clone();
        l.dedup();
        l
    };
    assert!(
        written.len() >= 2 && written[0] == 8,
        "the WAL wrote frames through before any sync: segment lengths {lengths:?}"
    );
    let through = *written.last().unwrap();
    assert!(
        tmpfs.free_bytes() < 4 << 20,
        "the second write-through cannot have fit: {} bytes free, segment lengths {lengths:?}",
        tmpfs.free_bytes()
    );
    // Cut back to whole frames: the WAL replays with nothing torn.
    assert_wal_replays_cleanly(&data_dir, "after a write-through failed partway");
    assert_eq!(segment_len(), through);

    let e = store.sync().expect_err("the rest does not fit");
    assert_disk_full_error(&e, &mount, "sync after a failed write-through");
    assert!(store.stats().disk_full_errors > 0);
    let visible = scanned_ids(&store.scan(&scan_all()).unwrap()).unwrap();
    assert_exactly_once(&visible, &accepted, "the writer while full");
    assert!(table_files(&data_dir).temp.is_empty());

    tmpfs.resize("64m").unwrap();
    store.sync().expect("sync succeeds once the tmpfs grew");
    assert_wal_replays_cleanly(&data_dir, "after the first sync with room again");
    let read_only =
        scanned_ids(&scan::scan_dir(&data_dir, &catalog(), &scan_all()).unwrap()).unwrap();
    assert_exactly_once(&read_only, &accepted, "a reader after the tmpfs grew");
    // Rows that were only in memory while the disk was full are durable now.
    drop(store);
    let store = Store::open(o, catalog()).unwrap();
    let ids = scanned_ids(&store.scan(&scan_all()).unwrap()).unwrap();
    assert_exactly_once(&ids, &accepted, "after reopening");
}

/// Past `wal_max_backlog_bytes` of rows held after a failed write, `append`
/// refuses rows with an error that says why; the store counts them, and the
/// rows it took before are still all kept.
#[test]
fn rows_past_the_backlog_bound_are_refused_and_counted() {
    let Some(tmpfs) = Tmpfs::mount_or_skip("1m") else {
        return;
    };
    let mount = tmpfs.path().to_owned();
    let data_dir = mount.join("store");
    let mut o = options(&data_dir);
    o.wal_max_backlog_bytes = 64 << 10;
    let mut store = Store::open(o.clone(), catalog()).unwrap();
    let ballast = mount.join("ballast");
    let room = tmpfs.free_bytes() - (16 << 10);
    fs::write(&ballast, vec![0x5a; room as usize]).unwrap();

    let mut accepted: Vec<u64> = Vec::new();
    let mut refused = 0;
    let mut next = 0;
    let mut first_refusal = None;
    while next < 20_000 {
        match store.append(&batch(next..next + 500)) {
            Ok(_) => accepted.extend(next..next + 500),
            Err(e) => {
                refused += 500;
                first_refusal.get_or_insert(e);
            }
        }
        next += 500;
        // Each failed sync is a write error; the rows stay held.
        let _ = store.sync();
    }
    let e = first_refusal.expect("rows were refused once the backlog bound was reached");
    assert!(e.is_disk_full(), "{e}");
    assert!(
        e.to_string()
            .contains("rejecting rows until the disk takes them"),
        "the error says why: {e}"
    );
    assert!(!accepted.is_empty(), "rows were held before the bound");
    let stats = store.stats().clone();
    assert_eq!(stats.rows_refused, refused, "{stats:?}");
    assert_eq!(stats.rows_appended, accepted.len() as u64, "{stats:?}");
    assert!(
        stats.write_errors > 0 && stats.disk_full_errors > 0,
        "{stats:?}"
    );
    assert_sizes_match_disk(&store, &data_dir, "while refusing");

    fs::remove_file(&ballast).unwrap();
    store.flush().expect("flush succeeds once space returns");
    assert_sizes_match_disk(&store, &data_dir, "after space returned");
    let ids = scanned_ids(&store.scan(&scan_all()).unwrap()).unwrap();
    assert_exactly_once(&ids, &accepted, "every row taken before the refusals");
}

/// A backlog drains by what the disk takes: once a little space is freed
/// (less than the backlog, more than a few frames), the next sync writes the
/// whole frames that fit and fsyncs them, so acknowledged rows and WAL bytes
/// grow and the backlog shrinks at once, though the sync still reports the
/// full disk; no partial frame is ever left in the segment. Once enough is
/// freed the backlog is written in full, and after a clean close every row
/// taken is there exactly once.
#[test]
fn a_backlog_drains_by_what_the_disk_takes_as_space_is_freed() {
    let Some(tmpfs) = Tmpfs::mount_or_skip("2m") else {
        return;
    };
    let mount = tmpfs.path().to_owned();
    let data_dir = mount.join("store");
    let mut o = options(&data_dir);
    o.wal_segment_bytes = 64 << 20;
    let mut store = Store::open(o.clone(), catalog()).unwrap();
    let ballast_path = mount.join("ballast");
    let mut ballast_bytes = tmpfs.free_bytes() - (32 << 10);
    fs::write(&ballast_path, vec![0x5a; ballast_bytes as usize]).unwrap();
    let ballast = fs::OpenOptions::new()
        .write(true)
        .open(&ballast_path)
        .unwrap();
    // Frees `bytes` of the ballast (all of it if fewer are left): space
    // appearing while the store runs.
    let mut free_some = |bytes: u64| {
        ballast_bytes = ballast_bytes.saturating_sub(bytes);
        ballast.set_len(ballast_bytes).unwrap();
    };

    // Each append's last sequence number and the rows it took.
    let mut appends: Vec<(u64, std::ops::Range<u64>)> = Vec::new();
    let mut next = 0;
    let mut append_and_sync = |store: &mut Store, appends: &mut Vec<(u64, _)>| {
        let ids = next..next + 500;
        let seq = store.append(&batch(ids.clone())).expect("rows are held");
        appends.push((seq, ids));
        next += 500;
        store.sync()
    };
    // Rows whose every frame is below `durable_below`: acknowledged.
    let acknowledged = |appends: &[(u64, std::ops::Range<u64>)], durable_below: u64| -> Vec<u64> {
        appends
            .iter()
            .filter(|(seq, _)| *seq < durable_below)
            .flat_map(|(_, ids)| ids.clone())
            .collect()
    };
    let all = |appends: &[(u64, std::ops::Range<u64>)]| -> Vec<u64> {
        appends.iter().flat_map(|(_, ids)| ids.clone()).collect()
    };

    // 1. The disk fills and a backlog of more than 512 KiB builds up.
    while store.wal_backlog_bytes() < 512 << 10 {
        assert!(appends.len() < 2_000, "no backlog built up");
        if let Err(e) = append_and_sync(&mut store, &mut appends) {
            assert_disk_full_error(&e, &mount, "sync on a full disk");
        }
    }
    let e = append_and_sync(&mut store, &mut appends).expect_err("the disk is full");
    assert_disk_full_error(&e, &mount, "sync on a full disk");
    assert_wal_replays_cleanly(&data_dir, "with a backlog");

    // 2. A little space appears, three times: each time the next sync writes
    //    what fits, whole frames only, and fsyncs it.
    for round in 1..=3 {
        let context = format!("after freeing 96 KiB, round {round}");
        let (durable, backlog, wal_bytes) = (
            store.durable_below(),
            store.wal_backlog_bytes(),
            store.wal_bytes(),
        );
        free_some(96 << 10);
        let e = store
            .sync()
            .expect_err("96 KiB freed is less than the backlog");
        assert_disk_full_error(&e, &mount, &context);
        assert!(
            store.durable_below() > durable,
            "{context}: no frame was written: durable below {durable} then {}",
            store.durable_below()
        );
        let drained = backlog - store.wal_backlog_bytes();
        assert!(
            drained >= 48 << 10,
            "{context}: the backlog fell from {backlog} to {} bytes only",
            store.wal_backlog_bytes()
        );
        assert_eq!(
            store.wal_bytes() - wal_bytes,
            drained as u64,
            "{context}: what left the backlog is in the WAL"
        );
        assert_sizes_match_disk(&store, &data_dir, &context);
        assert_wal_replays_cleanly(&data_dir, &context);
        // Nothing is published here: the WAL holds every frame below
        // `durable_below` and no other, each once (a batch that spans two
        // hours is two frames, so a batch may be half acknowledged).
        let acked = acknowledged(&appends, store.durable_below());
        assert_reader_sees(&data_dir, &all(&appends), acked.len(), &context);
        let mut seqs = Vec::new();
        wal::replay(&data_dir.join("wal"), &catalog(), false, |frame| {
            seqs.push(frame.seq);
            Ok(())
        })
        .unwrap();
        let expected: Vec<u64> = (1..store.durable_below()).collect();
        assert_eq!(seqs, expected, "{context}: frames in the WAL");
        eprintln!(
            "{context}: {drained} bytes of the backlog written, {} left",
            store.wal_backlog_bytes()
        );
        // Rows keep coming while the disk is still full.
        let _ = append_and_sync(&mut store, &mut appends);
    }

    // 3. Enough is freed: the backlog is written in full by the next sync.
    free_some(u64::MAX);
    store.sync().expect("sync succeeds once the backlog fits");
    assert_eq!(store.wal_backlog_bytes(), 0);
    assert_wal_replays_cleanly(&data_dir, "after the backlog drained");
    let accepted = all(&appends);
    assert_reader_sees(
        &data_dir,
        &accepted,
        accepted.len(),
        "after the backlog drained",
    );
    // Publishing a file per hour of rows needs more than the 2 MiB.
    tmpfs.resize("64m").unwrap();
    store.close().unwrap();
    let store = Store::open(o, catalog()).unwrap();
    let ids = scanned_ids(&store.scan(&scan_all()).unwrap()).unwrap();
    assert_exactly_once(&ids, &accepted, "after a clean close and reopening");
}

/// Writes zeros to `path` until the disk refuses more.
fn fill(path: &Path) {
    use std::io::Write;
    let mut file = fs::File::create(path).unwrap();
    for size in [64 << 10, 4 << 10, 1] {
        let chunk = vec![0u8; size];
        while file.write_all(&chunk).is_ok() {}
    }
    let _ = file.sync_all();
}

/// A kill on a full disk leaves rows in the WAL and no room for a new
/// segment. The store still opens (an agent that restarts then collects,
/// serves and detects rather than failing at every restart), keeps the
/// WAL's rows and takes new ones in memory, and writes them all once space
/// returns.
#[test]
fn a_store_opens_on_a_full_disk_and_writes_once_space_returns() {
    let Some(tmpfs) = Tmpfs::mount_or_skip("6m") else {
        return;
    };
    let mount = tmpfs.path().to_owned();
    let data_dir = mount.join("store");
    let mut o = options(&data_dir);
    // One segment, holding frames: no empty one to reuse at the next open.
    o.wal_segment_bytes = 64 << 20;
    let mut store = Store::open(o.clone(), catalog()).unwrap();
    store.append(&batch(0..20_000)).unwrap();
    store.sync().unwrap();
    // As a kill: the rows are in the WAL only.
    drop(store);
    let filler = mount.join("filler");
    fill(&filler);

    let mut store = Store::open(o.clone(), catalog()).expect("the store opens on a full disk");
    store.append(&batch(20_000..21_000)).unwrap();
    let e = store.sync().expect_err("nothing fits");
    assert_disk_full_error(&e, &mount, "sync on a full disk");
    let accepted: Vec<u64> = (0..21_000).collect();
    let visible = scanned_ids(&store.scan(&scan_all()).unwrap()).unwrap();
    assert_exactly_once(&visible, &accepted, "the store opened on a full disk");

    fs::remove_file(&filler).unwrap();
    store.sync().expect("sync succeeds once space returns");
    assert_wal_replays_cleanly(&data_dir, "after space returned");
    drop(store);
    let store = Store::open(o, catalog()).unwrap();
    let ids = scanned_ids(&store.scan(&scan_all()).unwrap()).unwrap();
    assert_exactly_once(&ids, &accepted, "after reopening");
}
