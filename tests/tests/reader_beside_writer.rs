//! A reader (`scan_dir`, what `vtax query` and the detector's replay use)
//! beside a store that publishes, merges and retires WAL segments under it
//! must see every acknowledged row exactly once, however its listing of files
//! and its reading of the WAL fall between the writer's steps.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use vtax_store::{scan, ScanRequest, Store, StoreOptions};
use vtax_tests::{batch, catalog, now_after, sample, value_counts};

/// Rows a writer step appends: about a quarter of an hour of ids, so a
/// running hour gets a few parts before it is over.
const IDS_PER_STEP: u64 = 10;
/// Rows the writer gets to while the reader reads: three days' worth, so
/// hours are sealed and days merged under it.
const ROWS: u64 = 3 * 960;

#[test]
fn every_acknowledged_row_once_while_files_and_wal_segments_come_and_go() {
    let dir = tempfile::tempdir().unwrap();
    let data_dir = dir.path().to_owned();
    let mut options = StoreOptions::new(&data_dir);
    options.node = "beside".into();
    options.sync_interval = Duration::from_secs(3600);
    options.publish_grace = Duration::ZERO;
    // Small segments, so that publishing retires some at most steps.
    options.wal_segment_bytes = 2048;
    let mut store = Store::open(options, catalog()).unwrap();

    // Rows below this were synced: every scan that starts later must see them.
    let acknowledged = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let (acknowledged, stop) = (acknowledged.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut next = 0;
            let mut step = 0u64;
            let mut merges = 0;
            while !stop.load(Ordering::Relaxed) {
                store.append(&batch(next..next + IDS_PER_STEP)).unwrap();
                next += IDS_PER_STEP;
                store.sync().unwrap();
                acknowledged.store(next, Ordering::Release);
                let now = now_after(next);
                store.tick(now).unwrap();
                step += 1;
                if step.is_multiple_of(2) {
                    // A part of the running hour, as the memory bound publishes.
                    store.flush().unwrap();
                }
                // Seals finished hours and days: inputs are removed.
                merges += store.compact(now).unwrap();
                // Still far busier than an agent, which publishes a part
                // every few minutes.
                std::thread::sleep(Duration::from_millis(2));
            }
            store.close().unwrap();
            (next, merges)
        })
    };

    let request = ScanRequest {
        table: "scraped".into(),
        ..Default::default()
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut scans = 0;
    let mut failure = None;
    while acknowledged.load(Ordering::Acquire) < ROWS && Instant::now() < deadline {
        let before = acknowledged.load(Ordering::Acquire);
        let counts = match scan::scan_dir(&data_dir, &catalog(), &request) {
            Ok(result) => value_counts(&result),
            Err(e) => {
                failure = Some(format!("scan {scans} failed: {e}"));
                break;
            }
        };
        scans += 1;
        let missing = counts.missing_in(0..before);
        let duplicates = counts.duplicates();
        if !missing.is_empty() || !duplicates.is_empty() {
            failure = Some(format!(
                "scan {scans} (after {before} acknowledged rows): missing {}, duplicated {duplicates:?}",
                sample(&missing)
            ));
            break;
        }
    }
    stop.store(true, Ordering::Relaxed);
    let (written, merges) = writer.join().unwrap();
    if let Some(failure) = failure {
        panic!("{failure}");
    }
    eprintln!("{scans} scans beside {written} rows written and {merges} merges");
    // Files were replaced under the reader again and again.
    assert!(
        written >= ROWS && merges > 100 && scans > 100,
        "the writer wrote {written} rows and merged {merges} times in {scans} scans"
    );
    let result = scan::scan_dir(&data_dir, &catalog(), &request).unwrap();
    let counts = value_counts(&result);
    assert!(counts.missing_in(0..written).is_empty() && counts.duplicates().is_empty());
}
