//! Shared pieces of the end-to-end proofs in `tests/tests/`: the row scheme that
//! the crash writer (`src/bin/crash_writer.rs`) and its checker agree on, and
//! readers that check what a data directory holds against it.
//!
//! Every row carries a unique id. Everything else about the row is a function of
//! the id, so a checker can tell a row that was stored intact from one that was
//! not, and count how often each id is present:
//!
//! * `value` is the id as an `f64` (exact below 2^53);
//! * the metric says whether the row is *late*: every eighth row is stamped
//!   [`LATE_LAG_US`] in the past, so it lands in an older hour than its
//!   neighbours, as rows from a slow exporter do;
//! * `labels` spreads rows over [`SERIES`] series;
//! * the time is [`T0`] plus [`STEP_US`] per id (minus the lag for late rows), so
//!   a few thousand ids cross hours and days and make the store publish, drop
//!   WAL segments and compact as it goes.

use std::collections::BTreeMap;
use std::fs::{self, File};
use std::ops::Range;
use std::path::{Path, PathBuf};

use arrow_array::cast::AsArray;
use arrow_array::types::{Float64Type, Int32Type, TimestampMicrosecondType};
use arrow_array::{Array, RecordBatch};
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use vtax_store::files::keys;
use vtax_store::tables::{self, ScrapedRow};
use vtax_store::{Batch, BatchBuilder, Catalog, ScanResult, StoreOptions};

/// 2025-11-21T00:00:00Z, where id 0 lies.
pub const T0: i64 = 1_763_683_200_000_000;
/// Time between consecutive ids: 40 ids an hour, 960 a day, so that a writer
/// crosses hours every few appends and days every few dozen.
pub const STEP_US: i64 = 90_000_000;
/// How far in the past a late row is stamped.
pub const LATE_LAG_US: i64 = 30 * 60 * 1_000_000;
/// Number of series (label sets) rows are spread over.
pub const SERIES: u64 = 4;
/// Metric of rows stamped on time.
pub const METRIC_ON_TIME: &str = "crash_on_time";
/// Metric of rows stamped [`LATE_LAG_US`] in the past.
pub const METRIC_LATE: &str = "crash_late";

/// Whether row `id` is a late one.
pub fn is_late(id: u64) -> bool {
    id % 8 == 7
}

/// The time of row `id`.
pub fn row_time(id: u64) -> i64 {
    T0 + id as i64 * STEP_US - if is_late(id) { LATE_LAG_US } else { 0 }
}

/// The metric of row `id`.
pub fn row_metric(id: u64) -> &'static str {
    if is_late(id) {
        METRIC_LATE
    } else {
        METRIC_ON_TIME
    }
}

/// The label set of row `id`.
pub fn row_labels(id: u64) -> String {
    format!("series=\"{}\"", id % SERIES)
}

/// The wall-clock time a writer that has just written up to `next_id` pretends
/// it is: the on-time stamp of the next row.
pub fn now_after(next_id: u64) -> i64 {
    T0 + next_id as i64 * STEP_US
}

/// A `scraped` batch of the rows with ids in `ids`.
pub fn batch(ids: Range<u64>) -> Batch {
    let mut b = BatchBuilder::new(&tables::SCRAPED);
    for id in ids {
        let row = ScrapedRow {
            target: "",
            metric: row_metric(id),
            labels: &row_labels(id),
            value: Some(id as f64),
        };
        b.push_row(row_time(id), &row)
            .expect("rows follow the scraped table");
    }
    b.finish()
}

/// The catalog the writer and the checkers open the store with.
pub fn catalog() -> Catalog {
    Catalog::new(&[&tables::SCRAPED]).expect("builtin tables are valid")
}

/// A row as stored: time, metric, labels, value.
#[derive(Clone, Debug, PartialEq)]
pub struct StoredRow {
    /// Microseconds since the epoch.
    pub time_us: i64,
    /// The `metric` tag.
    pub metric: String,
    /// The `labels` tag.
    pub labels: String,
    /// The `value` field (`None` when null).
    pub value: Option<f64>,
}

impl StoredRow {
    /// The id this row carries, when every column agrees with the row scheme.
    pub fn id(&self) -> Result<u64, String> {
        let value = self
            .value
            .ok_or_else(|| format!("null value in {self:?}"))?;
        if !(value >= 0.0 && value.fract() == 0.0 && value < (1u64 << 53) as f64) {
            return Err(format!("value is not a row id in {self:?}"));
        }
        let id = value as u64;
        if self.time_us != row_time(id)
            || self.metric != row_metric(id)
            || self.labels != row_labels(id)
        {
            return Err(format!(
                "row {id} is damaged: stored {self:?}, expected time {} metric {} labels {}",
                row_time(id),
                row_metric(id),
                row_labels(id)
            ));
        }
        Ok(id)
    }
}

/// Rows of `scraped` batches (time, target, metric, labels, value in that order), as the
/// store's scans and its files both lay them out.
pub fn stored_rows(batches: &[RecordBatch]) -> Result<Vec<StoredRow>, String> {
    let mut out = Vec::new();
    for batch in batches {
        if batch.num_columns() < 5 {
            return Err(format!(
                "a batch has {} columns, not 5",
                batch.num_columns()
            ));
        }
        let time = batch
            .column(0)
            .as_primitive_opt::<TimestampMicrosecondType>()
            .ok_or("column 0 is not a microsecond timestamp")?;
        let metric = batch
            .column(2)
            .as_dictionary_opt::<Int32Type>()
            .ok_or("column 2 is not a dictionary")?;
        let metric_values = metric.values().as_string::<i32>();
        let labels = batch
            .column(3)
            .as_dictionary_opt::<Int32Type>()
            .ok_or("column 3 is not a dictionary")?;
        let label_values = labels.values().as_string::<i32>();
        let value = batch
            .column(4)
            .as_primitive_opt::<Float64Type>()
            .ok_or("column 4 is not f64")?;
        for i in 0..batch.num_rows() {
            out.push(StoredRow {
                time_us: time.value(i),
                metric: metric_values
                    .value(metric.keys().value(i) as usize)
                    .to_string(),
                labels: label_values
                    .value(labels.keys().value(i) as usize)
                    .to_string(),
                value: value.is_valid(i).then(|| value.value(i)),
            });
        }
    }
    Ok(out)
}

/// The ids of every row a scan returned, checking each row against the scheme.
pub fn scanned_ids(result: &ScanResult) -> Result<Vec<u64>, String> {
    stored_rows(&result.batches)?
        .iter()
        .map(StoredRow::id)
        .collect()
}

/// How often each value of scanned `scraped` rows is present, whatever their
/// times and tags (rows written outside the row scheme).
pub fn value_counts(result: &ScanResult) -> IdCounts {
    let mut ids = Vec::new();
    for batch in &result.batches {
        let v = batch
            .column_by_name("value")
            .expect("a scraped scan has a value column")
            .as_primitive::<Float64Type>();
        ids.extend(v.values().iter().map(|&x| x as u64));
    }
    IdCounts::new(&ids)
}

/// How often each id is present.
#[derive(Clone, Debug, Default)]
pub struct IdCounts {
    counts: Vec<u32>,
}

impl IdCounts {
    /// Counts `ids`.
    pub fn new(ids: &[u64]) -> Self {
        let mut c = IdCounts::default();
        for &id in ids {
            let i = id as usize;
            if c.counts.len() <= i {
                c.counts.resize(i + 1, 0);
            }
            c.counts[i] += 1;
        }
        c
    }

    /// How often `id` is present.
    pub fn count(&self, id: u64) -> u32 {
        self.counts.get(id as usize).copied().unwrap_or(0)
    }

    /// Ids present more than once, with their counts.
    pub fn duplicates(&self) -> Vec<(u64, u32)> {
        self.counts
            .iter()
            .enumerate()
            .filter(|(_, &n)| n > 1)
            .map(|(id, &n)| (id as u64, n))
            .collect()
    }

    /// Ids in `range` that are absent.
    pub fn missing_in(&self, range: Range<u64>) -> Vec<u64> {
        range.filter(|&id| self.count(id) == 0).collect()
    }

    /// Every id present at least once, ascending.
    pub fn present(&self) -> impl Iterator<Item = u64> + '_ {
        self.counts
            .iter()
            .enumerate()
            .filter(|(_, &n)| n > 0)
            .map(|(id, _)| id as u64)
    }

    /// The highest id present.
    pub fn max(&self) -> Option<u64> {
        self.counts.iter().rposition(|&n| n > 0).map(|i| i as u64)
    }

    /// Number of distinct ids present.
    pub fn distinct(&self) -> usize {
        self.counts.iter().filter(|&&n| n > 0).count()
    }
}

/// Shortens a list of ids for a failure message: the first few, and how many.
pub fn sample(ids: &[u64]) -> String {
    let shown: Vec<String> = ids.iter().take(12).map(u64::to_string).collect();
    if ids.len() > shown.len() {
        format!("{} … ({} in all)", shown.join(", "), ids.len())
    } else {
        shown.join(", ")
    }
}

/// Files under a data directory's `tables/`.
#[derive(Debug, Default)]
pub struct TableFiles {
    /// Published files (`*.parquet`): what a glob of `*.parquet` reads.
    pub parquet: Vec<PathBuf>,
    /// Temp files (`*.tmp`): a publish that did not finish.
    pub temp: Vec<PathBuf>,
    /// Merged files under their pending name (`.<name>.pending`): a merge
    /// whose inputs were not all deleted yet.
    pub pending: Vec<PathBuf>,
}

/// Walks `<data_dir>/tables`.
pub fn table_files(data_dir: &Path) -> TableFiles {
    let mut out = TableFiles::default();
    let mut stack = vec![data_dir.join("tables")];
    while let Some(dir) = stack.pop() {
        let Ok(entries) = fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            let name = entry.file_name().to_string_lossy().into_owned();
            if path.is_dir() {
                stack.push(path);
            } else if name.ends_with(".tmp") {
                out.temp.push(path);
            } else if name.ends_with(".pending") {
                out.pending.push(path);
            } else if name.ends_with(".parquet") {
                out.parquet.push(path);
            }
        }
    }
    out.parquet.sort();
    out.temp.sort();
    out.pending.sort();
    out
}

/// Per file that a glob of `*.parquet` under `<data_dir>/tables` matches (as
/// DuckDB's `read_parquet('.../*/*.parquet')`, Polars' and pyarrow's do), the
/// `value` of each of its rows, read with the parquet crate directly: what
/// such a glob counts, file by file.
pub fn glob_values(data_dir: &Path) -> Result<Vec<(PathBuf, Vec<u64>)>, String> {
    let mut out = Vec::new();
    for path in table_files(data_dir).parquet {
        let file = read_parquet(&path)?;
        let values = file
            .rows
            .iter()
            .map(|row| {
                row.value
                    .map(|v| v as u64)
                    .ok_or_else(|| format!("{}: a null value", path.display()))
            })
            .collect::<Result<Vec<u64>, String>>()?;
        out.push((path, values));
    }
    Ok(out)
}

/// Every file under `dir`, recursively (for the quarantine check).
pub fn all_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_owned()];
    while let Some(dir) = stack.pop() {
        let Ok(entries) = fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            if path.is_dir() {
                stack.push(path);
            } else {
                out.push(path);
            }
        }
    }
    out.sort();
    out
}

/// What reading one Parquet file from end to end found.
#[derive(Debug)]
pub struct ParquetFile {
    /// The file.
    pub path: PathBuf,
    /// Rows the footer declares.
    pub footer_rows: u64,
    /// The file's rows, decoded.
    pub rows: Vec<StoredRow>,
    /// The store's key-value metadata.
    pub metadata: BTreeMap<String, String>,
}

impl ParquetFile {
    /// Names of the files this one replaces (compaction), from its metadata.
    pub fn compacted_from(&self) -> Vec<String> {
        self.metadata
            .get(keys::COMPACTED_FROM)
            .map(|s| s.split(',').map(str::to_owned).collect())
            .unwrap_or_default()
    }
}

/// Opens a Parquet file with the parquet crate directly (not through the store)
/// and decodes every row of every column, checking that the footer's row count
/// is what comes out.
pub fn read_parquet(path: &Path) -> Result<ParquetFile, String> {
    let err = |what: &str, e: &dyn std::fmt::Display| format!("{}: {what}: {e}", path.display());
    let file = File::open(path).map_err(|e| err("open", &e))?;
    let builder =
        ParquetRecordBatchReaderBuilder::try_new(file).map_err(|e| err("read footer", &e))?;
    let meta = builder.metadata().clone();
    let footer_rows = meta.file_metadata().num_rows() as u64;
    let metadata = meta
        .file_metadata()
        .key_value_metadata()
        .map(|kvs| {
            kvs.iter()
                .map(|kv| (kv.key.clone(), kv.value.clone().unwrap_or_default()))
                .collect()
        })
        .unwrap_or_default();
    let reader = builder.build().map_err(|e| err("build reader", &e))?;
    let mut batches = Vec::new();
    for batch in reader {
        batches.push(batch.map_err(|e| err("decode", &e))?);
    }
    let rows = stored_rows(&batches).map_err(|e| err("columns", &e))?;
    if rows.len() as u64 != footer_rows {
        return Err(format!(
            "{}: footer declares {footer_rows} rows, {} decoded",
            path.display(),
            rows.len()
        ));
    }
    Ok(ParquetFile {
        path: path.to_owned(),
        footer_rows,
        rows,
        metadata,
    })
}

/// Store options that make a small writer do everything often: a tiny memory
/// bound (size-bound publishes), tiny WAL segments (rotation and deletion), and a
/// publish grace longer than the late rows' lag, so that hours are published
/// whole once their late rows are in.
pub fn busy_options(data_dir: &Path) -> StoreOptions {
    let mut o = StoreOptions::new(data_dir);
    o.node = "crash".into();
    o.max_buffered_bytes = 4 << 10;
    o.wal_segment_bytes = 4 << 10;
    o.publish_grace = std::time::Duration::from_secs(45 * 60);
    o.sync_interval = std::time::Duration::from_millis(3);
    o.write.zstd_level = 1;
    o
}

/// A small tmpfs for disk-full tests.
/// What `promtool check metrics` says of an exposition body: empty when it
/// finds nothing wrong.
pub fn promtool_complaints(body: &str) -> String {
    use std::io::Write;
    let mut child = std::process::Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("promtool is installed (scripts/test.sh installs Debian's prometheus)");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(body.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

pub mod tmpfs {
    use std::ffi::CString;
    use std::os::unix::ffi::OsStrExt;
    use std::path::Path;

    /// A tmpfs mounted on a fresh temp directory, unmounted on drop (panics too).
    pub struct Tmpfs {
        dir: tempfile::TempDir,
    }

    impl Tmpfs {
        /// Mounts a tmpfs of `size` (as `mount -o size=` takes it), or says why not.
        pub fn mount(size: &str) -> Result<Tmpfs, String> {
            let dir = tempfile::tempdir().map_err(|e| format!("create a mount point: {e}"))?;
            if let Err(e) = mount(dir.path(), 0, &format!("size={size},mode=0700")) {
                return Err(format!(
                    "cannot mount a tmpfs on {}: {e}. The disk-full tests need root or \
                     CAP_SYS_ADMIN (mount -t tmpfs); set VTAX_SKIP_TMPFS_TEST=1 to skip them",
                    dir.path().display()
                ));
            }
            Ok(Tmpfs { dir })
        }

        /// Mounts one, or, where that is not permitted, panics saying why, unless
        /// `VTAX_SKIP_TMPFS_TEST=1` is set: then it prints why the test is skipped
        /// and returns `None`.
        pub fn mount_or_skip(size: &str) -> Option<Tmpfs> {
            match Tmpfs::mount(size) {
                Ok(t) => Some(t),
                Err(why) if std::env::var("VTAX_SKIP_TMPFS_TEST").is_ok_and(|v| v == "1") => {
                    eprintln!("SKIPPED (VTAX_SKIP_TMPFS_TEST=1): {why}");
                    None
                }
                Err(why) => panic!("{why}"),
            }
        }

        /// Changes the size (`mount -o remount,size=`): room returning.
        pub fn resize(&self, size: &str) -> Result<(), String> {
            mount(self.path(), libc::MS_REMOUNT, &format!("size={size}"))
                .map_err(|e| format!("remount {} with size={size}: {e}", self.path().display()))
        }

        /// The mount point.
        pub fn path(&self) -> &Path {
            self.dir.path()
        }

        /// Free bytes, as statvfs counts them.
        pub fn free_bytes(&self) -> u64 {
            let path = cstring(self.path());
            // SAFETY: statvfs is plain data, for which all zeroes is a valid value.
            let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
            // SAFETY: a NUL-terminated path and a statvfs to fill.
            let rc = unsafe { libc::statvfs(path.as_ptr(), &mut st) };
            assert_eq!(rc, 0, "statvfs {}", self.path().display());
            st.f_bavail as u64 * st.f_frsize as u64
        }
    }

    impl Drop for Tmpfs {
        fn drop(&mut self) {
            let target = cstring(self.path());
            // Lazy: works even while something still holds a file open in it.
            // SAFETY: a NUL-terminated path.
            let rc = unsafe { libc::umount2(target.as_ptr(), libc::MNT_DETACH) };
            if rc != 0 {
                eprintln!(
                    "could not unmount {}: {}",
                    self.path().display(),
                    std::io::Error::last_os_error()
                );
            }
            // Then the TempDir removes the (now empty) mount point.
        }
    }

    fn mount(target: &Path, flags: libc::c_ulong, options: &str) -> std::io::Result<()> {
        let target = cstring(target);
        let data = CString::new(options).expect("no NUL in mount options");
        // SAFETY: every pointer is a NUL-terminated string that outlives the call.
        let rc = unsafe {
            libc::mount(
                c"vtax-test".as_ptr(),
                target.as_ptr(),
                c"tmpfs".as_ptr(),
                flags,
                data.as_ptr().cast(),
            )
        };
        if rc == 0 {
            Ok(())
        } else {
            Err(std::io::Error::last_os_error())
        }
    }

    fn cstring(path: &Path) -> CString {
        CString::new(path.as_os_str().as_bytes()).expect("no NUL in a path")
    }
}
