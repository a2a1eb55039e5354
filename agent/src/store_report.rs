//! The `store` table: how the local store is doing, a row a second from the
//! main loop, so that Prometheus can alert on a store near its byte budget,
//! on a disk filling up, and on writes that fail.

use std::path::PathBuf;
use std::time::{Duration, Instant, UNIX_EPOCH};

use vtax_store::hub::RowSender;
use vtax_store::{Batch, BatchBuilder, Store};

use crate::collectors::filesystem::{FsStat, StatFs, SystemStatFs};
use crate::collectors::runtime_tables::{StoreRow, STORE};

/// Time between two rows: the collectors' usual interval.
pub const STORE_ROW_INTERVAL: Duration = Duration::from_secs(1);

/// Makes the `store` table's rows for one data directory.
pub struct StoreReport {
    data_dir: PathBuf,
    next_row: Instant,
    statvfs_failing: bool,
    /// The hub the rows come through, for what it dropped.
    hub: Option<RowSender>,
    dropped_logged: u64,
    dropped_logged_at: Option<Instant>,
}

/// Time between two warnings that the hub dropped rows.
const DROPPED_LOG_EVERY: Duration = Duration::from_secs(60);

impl StoreReport {
    /// A report whose first row is due at once.
    pub fn new(data_dir: PathBuf) -> Self {
        StoreReport {
            data_dir,
            next_row: Instant::now(),
            statvfs_failing: false,
            hub: None,
            dropped_logged: 0,
            dropped_logged_at: None,
        }
    }

    /// Counts, in each row, what `hub` dropped.
    pub fn with_hub(mut self, hub: RowSender) -> Self {
        self.hub = Some(hub);
        self
    }

    /// Batches the hub dropped since the start; a warning when that grew,
    /// at most once a minute.
    fn dropped_batches(&mut self) -> u64 {
        let dropped = self.hub.as_ref().map_or(0, RowSender::dropped_batches);
        let quiet = self
            .dropped_logged_at
            .is_none_or(|at| at.elapsed() >= DROPPED_LOG_EVERY);
        if dropped > self.dropped_logged && quiet {
            tracing::warn!(
                dropped_batches = dropped,
                since_last_warning = dropped - self.dropped_logged,
                "Rows were dropped: the main thread fell behind the collectors (a slow disk?); they are neither stored nor shown to the detector."
            );
            self.dropped_logged = dropped;
            self.dropped_logged_at = Some(Instant::now());
        }
        dropped
    }

    /// The row, when one is due (a second after the last); `time_us` is
    /// wall-clock time.
    pub fn due(&mut self, store: &Store, time_us: i64) -> Option<Batch> {
        let now = Instant::now();
        if now < self.next_row {
            return None;
        }
        self.next_row += STORE_ROW_INTERVAL;
        if self.next_row < now {
            // The main loop stalled (a slow publish): carry on from now
            // rather than making up the missed rows back to back.
            self.next_row = now + STORE_ROW_INTERVAL;
        }
        Some(self.row(store, time_us))
    }

    /// The row now. Its sizes come from what the store tracks, so its cost is
    /// a sum over the store's list of files and one statvfs; no directory walk.
    pub fn row(&mut self, store: &Store, time_us: i64) -> Batch {
        // On the main thread, like the store's writes: a data directory whose
        // statvfs hangs holds those up as well.
        let filesystem = match SystemStatFs.statvfs(&self.data_dir) {
            Ok(stat) => {
                self.statvfs_failing = false;
                Some(stat)
            }
            Err(e) => {
                if !self.statvfs_failing {
                    tracing::warn!(data_dir = %self.data_dir.display(), error = %e, "statvfs of the data directory failed; its free space is not exported until it succeeds.");
                    self.statvfs_failing = true;
                }
                None
            }
        };
        let bytes = |blocks: u64, stat: &FsStat| blocks.saturating_mul(stat.fragment_size);
        let dropped_batches = self.dropped_batches();
        let stats = store.stats();
        let options = store.options();
        let row = StoreRow {
            dropped_batches,
            table_bytes: store.table_bytes(),
            table_files: store.files().count() as u64,
            wal_bytes: store.wal_bytes(),
            // No budget is no series, so a rule comparing against it
            // cannot fire on a node without one.
            retention_max_bytes: options.retention_max_bytes,
            filesystem_avail_bytes: filesystem.as_ref().map(|s| bytes(s.blocks_available, s)),
            filesystem_size_bytes: filesystem.as_ref().map(|s| bytes(s.blocks, s)),
            rows_appended: stats.rows_appended,
            rows_refused: stats.rows_refused,
            write_errors: stats.write_errors,
            disk_full_errors: stats.disk_full_errors,
            files_written: stats.files_published,
            files_quarantined: stats.files_quarantined,
            files_deleted_by_retention: stats.files_retained_away,
            wal_syncs: stats.wal_syncs,
            last_file_written_time_seconds: stats
                .last_file_written
                .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
                .map(|t| t.as_secs_f64()),
        };
        let mut builder = BatchBuilder::new(&STORE);
        builder
            .push_row(time_us, &row)
            .expect("a store row is for the store table");
        builder.finish()
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::path::Path;
    use std::time::SystemTime;

    use vtax_store::{ScanRequest, StoreOptions, HOUR_US};

    use super::*;
    use crate::collectors::runtime_tables::{CollectorRow, COLLECTOR};

    /// 2025-11-21T00:00:00Z.
    const T0: i64 = 1_763_683_200_000_000;

    fn open(dir: &Path, budget: Option<u64>) -> Store {
        let mut options = StoreOptions::new(dir);
        options.node = "test".into();
        options.retention_max_bytes = budget;
        Store::open(options, crate::catalog()).unwrap()
    }

    /// `rows` collector rows an hour after `T0 + hour`.
    fn append_hour(store: &mut Store, hour: i64, rows: i64) {
        let mut builder = BatchBuilder::new(&COLLECTOR);
        for i in 0..rows {
            let row = CollectorRow {
                collector: "host",
                duration_seconds: 0.001 * i as f64,
                success: 1,
                failed_sources: 0,
                left_out: 0,
            };
            builder
                .push_row(T0 + hour * HOUR_US + i * 1_000_000, &row)
                .unwrap();
        }
        store.append(&builder.finish()).unwrap();
    }

    /// The row as `/metrics` serves it: sample name to value.
    fn exported(row: Batch) -> BTreeMap<String, f64> {
        let exposition = vtax_exporters::Exposition::new(&[&STORE]);
        exposition.update("store", vec![std::sync::Arc::new(row)]);
        let body = exposition.body(vtax_exporters::Format::Text, false);
        String::from_utf8(body.to_vec())
            .unwrap()
            .lines()
            .filter(|l| !l.starts_with('#'))
            .map(|l| {
                let (name, value) = l.split_once(' ').unwrap();
                (name.to_string(), value.parse().unwrap())
            })
            .collect()
    }

    /// Bytes and count of the files under `dir` whose names end with `suffix`.
    fn on_disk(dir: &Path, suffix: &str) -> (f64, f64) {
        let (mut bytes, mut files) = (0, 0);
        let mut stack = vec![dir.to_owned()];
        while let Some(d) = stack.pop() {
            for entry in std::fs::read_dir(&d).into_iter().flatten().flatten() {
                let meta = entry.metadata().unwrap();
                if meta.is_dir() {
                    stack.push(entry.path());
                } else if entry.file_name().to_string_lossy().ends_with(suffix) {
                    bytes += meta.len();
                    files += 1;
                }
            }
        }
        (bytes as f64, files as f64)
    }

    #[test]
    fn the_row_says_what_the_store_holds_on_disk_against_its_budget() {
        let dir = tempfile::tempdir().unwrap();
        let mut store = open(dir.path(), Some(1 << 30));
        let before = SystemTime::now().duration_since(UNIX_EPOCH).unwrap();
        for hour in 0..3 {
            append_hour(&mut store, hour, 600);
            store.flush().unwrap();
        }
        append_hour(&mut store, 3, 50);
        store.sync().unwrap();
        let after = SystemTime::now().duration_since(UNIX_EPOCH).unwrap();

        let mut report = StoreReport::new(dir.path().to_owned());
        let m = exported(report.row(&store, T0));
        let (table_bytes, table_files) = on_disk(&dir.path().join("tables"), ".parquet");
        let (wal_bytes, _) = on_disk(&dir.path().join("wal"), ".wal");
        assert!(table_bytes > 0.0);
        assert_eq!(m["vtax_store_table_bytes"], table_bytes);
        assert_eq!(m["vtax_store_table_files"], table_files);
        assert_eq!(table_files, 3.0);
        assert!(wal_bytes > 0.0, "the last 50 rows are in the WAL");
        assert_eq!(m["vtax_store_wal_bytes"], wal_bytes);
        assert_eq!(m["vtax_store_retention_max_bytes"], (1u64 << 30) as f64);
        assert_eq!(m["vtax_store_rows_appended_total"], 1850.0);
        assert_eq!(m["vtax_store_files_written_total"], 3.0);
        assert_eq!(m["vtax_store_write_errors_total"], 0.0);
        assert_eq!(m["vtax_store_rows_refused_total"], 0.0);
        assert!(m["vtax_store_wal_syncs_total"] >= 4.0);
        let written = m["vtax_store_last_file_written_time_seconds"];
        assert!(
            written >= before.as_secs_f64() && written <= after.as_secs_f64(),
            "{written} not between {before:?} and {after:?}"
        );
        let (avail, size) = (
            m["vtax_store_filesystem_avail_bytes"],
            m["vtax_store_filesystem_size_bytes"],
        );
        assert!(avail > 0.0 && avail <= size, "avail {avail}, size {size}");
    }

    #[test]
    fn no_byte_budget_is_no_budget_series() {
        let dir = tempfile::tempdir().unwrap();
        let store = open(dir.path(), None);
        let m = exported(StoreReport::new(dir.path().to_owned()).row(&store, T0));
        assert!(!m.contains_key("vtax_store_retention_max_bytes"), "{m:?}");
        assert!(
            !m.contains_key("vtax_store_last_file_written_time_seconds"),
            "no file written yet: {m:?}"
        );
        assert_eq!(m["vtax_store_table_bytes"], 0.0);
    }

    #[test]
    fn a_failed_write_is_counted_and_its_rows_kept() {
        let dir = tempfile::tempdir().unwrap();
        let mut store = open(dir.path(), None);
        let mut report = StoreReport::new(dir.path().to_owned());
        append_hour(&mut store, 0, 100);
        // A file where the tables' directory should be: every publish fails,
        // for root too (a read-only mode would not stop root).
        let tables = dir.path().join("tables");
        let _ = std::fs::remove_dir_all(&tables);
        std::fs::write(&tables, b"in the way").unwrap();
        let e = store.flush().expect_err("nowhere to publish");
        assert!(e.to_string().contains("tables"), "{e}");
        let m = exported(report.row(&store, T0));
        assert_eq!(m["vtax_store_write_errors_total"], 1.0);
        assert_eq!(m["vtax_store_disk_full_errors_total"], 0.0);
        assert_eq!(m["vtax_store_rows_refused_total"], 0.0);
        assert_eq!(m["vtax_store_files_written_total"], 0.0);

        std::fs::remove_file(&tables).unwrap();
        store.flush().expect("publishes once the way is clear");
        let m = exported(report.row(&store, T0));
        assert_eq!(m["vtax_store_write_errors_total"], 1.0);
        assert_eq!(m["vtax_store_files_written_total"], 1.0);
        let rows = store
            .scan(&ScanRequest {
                table: "collector".into(),
                ..Default::default()
            })
            .unwrap()
            .rows();
        assert_eq!(rows, 100, "no row was lost");
    }

    #[test]
    fn a_row_is_due_once_a_second() {
        let dir = tempfile::tempdir().unwrap();
        let store = open(dir.path(), None);
        let mut report = StoreReport::new(dir.path().to_owned());
        assert!(
            report.due(&store, T0).is_some(),
            "the first row is due at once"
        );
        assert!(report.due(&store, T0).is_none());
        std::thread::sleep(STORE_ROW_INTERVAL);
        assert!(report.due(&store, T0).is_some());
    }

    /// A hub that was full when a collector sent: what it dropped is in the
    /// row, as a counter.
    #[test]
    fn rows_the_hub_dropped_are_counted_in_the_row() {
        let dir = tempfile::tempdir().unwrap();
        let store = open(dir.path(), None);
        let (hub, _received) = vtax_store::hub::channel(1);
        let mut report = StoreReport::new(dir.path().to_owned()).with_hub(hub.clone());
        assert_eq!(
            exported(report.row(&store, T0))["vtax_store_dropped_batches_total"],
            0.0
        );
        let one = || vec![std::sync::Arc::new(BatchBuilder::new(&STORE).finish())];
        hub.send(one()).unwrap();
        hub.send([one(), one()].concat()).unwrap();
        let row = exported(report.row(&store, T0 + 1_000_000));
        assert_eq!(row["vtax_store_dropped_batches_total"], 2.0);
    }
}
