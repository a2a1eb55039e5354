//! The vtax time-series store: typed tables, a write-ahead log, and Parquet files
//! that DuckDB, Polars, pandas and Spark read directly.
//!
//! # On-disk layout and its invariants
//!
//! ```text
//! <data_dir>/
//!   LOCK                                   flock held by the one writer; holds its pid
//!   wal/<first_seq>.wal                    CRC-framed segments (see [`wal`])
//!   tables/<table>/date=YYYY-MM-DD/<node>-<first_time_us>-<seq>.parquet
//!   tables/<table>/date=YYYY-MM-DD/.<name>.parquet.pending
//!                                          a merged file whose inputs are being deleted
//!   quarantine/<table>/date=YYYY-MM-DD/... files that failed verification, kept
//! ```
//!
//! 1. **Buckets.** Rows belong to a bucket: one table, one UTC hour. Every WAL frame
//!    holds rows of exactly one bucket and has a sequence number, increasing by one
//!    per frame across the whole log.
//! 2. **Publishing.** A bucket's buffered rows are written as one Parquet file, sorted
//!    by the table's tags then time: temp file, fsync, rename, fsync the directory.
//!    A file records, per bucket it holds, its *watermark*: the highest frame
//!    sequence number of that bucket it contains. Frames are absorbed in sequence
//!    order and a publish takes the whole buffer, so a bucket's published frames are
//!    exactly its frames up to the highest watermark among its files.
//! 3. **Replay.** On open, a frame whose sequence number is at or below its bucket's
//!    watermark is already in a file and is skipped; every other intact frame is
//!    buffered again. A torn tail is cut at the last good frame. So a row acknowledged
//!    by a completed fsync appears exactly once after any crash.
//! 4. **WAL truncation.** A segment is deleted only when every frame in it is below
//!    the lowest sequence number still buffered, i.e. published.
//! 5. **Compaction** merges files (a finished hour's parts into one file, a
//!    finished day's files into one) by a streaming merge, recording the names of
//!    the files it replaces in the new file's metadata. The merged file is
//!    written under a pending name that no `*.parquet` glob matches (temp file,
//!    fsync, rename, fsync the directory), then the inputs are deleted and the
//!    directory fsynced, then it is renamed to its published name and the
//!    directory fsynced. So a plain glob never reads a merged file beside one of
//!    its inputs: it reads each row once, or, between the first deletion and the
//!    rename, misses the deleted inputs' rows. The store's readers take a
//!    merged file, pending or not, in place of every input it names, and a
//!    writer's open deletes the inputs and publishes the pending file, so a kill
//!    at any instant leaves every row visible to them exactly once. A merge may
//!    run on another thread while the writer appends and publishes
//!    ([`Compactor`]); the writer lists and keeps its inputs until it takes the
//!    outcome back.
//! 6. **Retention** deletes whole files, oldest day first; a deletion is atomic.
//! 7. **Quarantine.** A file whose footer cannot be read or describes a layout the
//!    file does not have, at open, or whose pages a merge cannot read, is moved to
//!    `quarantine/`, never deleted; the rest of the store stays readable.
//!
//! Partitions are by date only: a compacted day would have no place in an hour
//! partition, and Hive readers reject files at mixed partition depths. Time filters
//! prune hours inside a day through the row-group and page statistics instead.
#![deny(missing_docs)]

pub mod batch;
mod bucket;
pub mod clock;
mod compaction;
mod conform;
pub mod error;
pub mod files;
pub mod hub;
pub mod log_limit;
mod merge;
pub mod openmetrics;
pub mod regular_file;
pub mod row;
pub mod scan;
pub mod schema;
pub mod segment_log;
mod store;
pub mod tables;
pub mod wal;

pub use batch::{Batch, BatchBuilder, Value};
pub use compaction::{Compactor, CycleReport};
pub use error::{Error, Result};
pub use files::WriteOptions;
pub use scan::{ScanRequest, ScanResult};
pub use schema::{FieldDef, FieldType, MetricKind, TableDef, TagDef, Unit};
pub use store::{
    check_node_name, kept_in_quarantine, node_name, open_for_writing, Deletable, Merge,
    MergeOutcome, Store, StoreOptions, StoreStats, DEFAULT_MAX_PUBLISH_DELAY, NODE_NAME_MAX_CHARS,
};

/// Microseconds in one hour: the width of a bucket.
pub const HOUR_US: i64 = 3_600_000_000;
/// Microseconds in one day: the width of a partition.
pub const DAY_US: i64 = 24 * HOUR_US;

/// The set of tables a store knows, looked up by name.
#[derive(Clone, Debug)]
pub struct Catalog {
    tables: Vec<&'static TableDef>,
}

impl Catalog {
    /// A catalog of `tables`; checks each declaration and that table names,
    /// and the metric names of exported tables, are unique: `gpu` with a field
    /// `nvlink_rx` and `gpu_nvlink` with a field `rx` would both be
    /// `vtax_gpu_nvlink_rx`.
    pub fn new(tables: &[&'static TableDef]) -> Result<Self> {
        let mut names = std::collections::HashSet::new();
        let mut metrics = std::collections::HashMap::new();
        for table in tables {
            table.validate().map_err(Error::Schema)?;
            if !names.insert(table.name) {
                return Err(Error::Schema(format!(
                    "table {} declared twice",
                    table.name
                )));
            }
            for field in table.fields.iter().filter(|f| table.exports(f)) {
                let metric = table.metric_name(field);
                if let Some(other) = metrics.insert(metric.clone(), table.name) {
                    return Err(Error::Schema(format!(
                        "metric {metric} comes from both table {other} and table {}",
                        table.name
                    )));
                }
            }
        }
        Ok(Catalog {
            tables: tables.to_vec(),
        })
    }

    /// The table called `name`.
    pub fn get(&self, name: &str) -> Option<&'static TableDef> {
        self.tables.iter().copied().find(|t| t.name == name)
    }

    /// Every table, in declaration order.
    pub fn tables(&self) -> &[&'static TableDef] {
        &self.tables
    }
}

/// The UTC date `YYYY-MM-DD` of a day number (days since the epoch).
pub fn date_string(day: i64) -> String {
    // Howard Hinnant's days-to-civil algorithm.
    let z = day + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!("{y:04}-{m:02}-{d:02}")
}

/// The day number of a `YYYY-MM-DD` date.
pub fn parse_date(date: &str) -> Option<i64> {
    let mut parts = date.splitn(3, '-');
    let y: i64 = parts.next()?.parse().ok()?;
    let m: i64 = parts.next()?.parse().ok()?;
    let d: i64 = parts.next()?.parse().ok()?;
    if !(1..=12).contains(&m) || !(1..=31).contains(&d) {
        return None;
    }
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y.rem_euclid(400);
    let mp = if m > 2 { m - 3 } else { m + 9 };
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let day = era * 146_097 + doe - 719_468;
    (date_string(day) == date).then_some(day)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dates_round_trip_across_eras_and_leap_days() {
        assert_eq!(date_string(0), "1970-01-01");
        assert_eq!(date_string(-1), "1969-12-31");
        assert_eq!(date_string(11_016), "2000-02-29");
        assert_eq!(date_string(20_413), "2025-11-21");
        for day in (-700_000..800_000).step_by(97) {
            assert_eq!(parse_date(&date_string(day)), Some(day));
        }
        assert_eq!(parse_date("2025-02-30"), None);
        assert_eq!(parse_date("garbage"), None);
    }

    #[test]
    fn builtin_tables_are_valid() {
        Catalog::new(tables::BUILTIN).unwrap();
    }

    #[test]
    fn two_tables_that_make_one_metric_name_are_refused() {
        use schema::{FieldDef, FieldType, TableDef, Unit};
        static OUTER: TableDef = TableDef {
            name: "gpu",
            help: "h",
            tags: &[],
            fields: &[FieldDef::gauge(
                "nvlink_rx_bytes",
                FieldType::F64,
                Unit::Bytes,
                "h",
            )],
            exported: true,
        };
        static INNER: TableDef = TableDef {
            name: "gpu_nvlink",
            help: "h",
            tags: &[],
            fields: &[FieldDef::gauge(
                "rx_bytes",
                FieldType::F64,
                Unit::Bytes,
                "h",
            )],
            exported: true,
        };
        let err = Catalog::new(&[&OUTER, &INNER]).unwrap_err().to_string();
        assert!(err.contains("vtax_gpu_nvlink_rx_bytes"), "{err}");
    }
}
