//! A recording played back through a fresh detector (`vtax replay-detector`).
//! The rows the collectors stored go in second by second, as the agent fed
//! them live, and out come the events the detector would have opened.
//!
//! An evaluation run kept with `bench/detect/eval.py --keep` is a recording of
//! real antagonists on a real machine. Replaying it with another `[detect]`
//! section, or through another build of the detector, says what that would
//! have opened in seconds instead of the run's hour and a half; the harness
//! scores the replayed events like live ones (`--rescore ... --events`). Only
//! the cache canary cannot be replayed sample by sample: the store keeps its
//! window means (`detector_signal`), which go in as every second's sample of
//! their window, so a window's mean is what it was live.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use arrow_array::cast::AsArray;
use arrow_array::types::{Float64Type, Int64Type, TimestampMicrosecondType, UInt64Type};
use arrow_array::{Array, ArrowPrimitiveType, RecordBatch, StringArray};
use arrow_schema::DataType;
use vtax_store::scan::scan_dir;
use vtax_store::{Batch, BatchBuilder, FieldType, ScanRequest, ScanResult, TableDef, Value};

use crate::view::View;
use crate::{DetectConfig, Detector, Resource, WINDOW_GRACE_SECS};

/// The tables the detector reads, in the order one second's batches go in:
/// the facts first, then the signals.
const OBSERVED_TABLES: &[&str] = &[
    "platform_host",
    "gpu_info",
    "cpu",
    "cpu_sched",
    "pressure",
    "cgroup",
    "cgroup_perf",
    "jitter",
    "gpu",
    "gpu_process",
    "infiniband_port",
];

/// An event the replay opened.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct OpenedEvent {
    /// When the agent would have opened it (its last window's end plus the
    /// grace it waits for late rows), Unix seconds.
    pub time: f64,
    /// Where its first abnormal window began, Unix seconds.
    pub start_time: f64,
    pub resource: String,
    pub victim: String,
    pub signal: String,
    /// The first suspect, `none` when no suspect scored.
    pub suspect: String,
    /// Distance from the baseline when it opened.
    pub score: f64,
    /// `open` when it opened, `updated` when an open event named a new
    /// first suspect.
    pub state: String,
}

/// What a replay opened, and what it could not read.
#[derive(Debug, Default)]
pub struct Replayed {
    /// The events it opened, in order.
    pub events: Vec<OpenedEvent>,
    /// The damaged files left out (with `skip_damaged`), each once, with
    /// why: the events lack their rows.
    pub damaged_files: Vec<(PathBuf, String)>,
}

/// Replays `[from_us, until_us)` of the store at `data_dir` through a fresh
/// detector with `config`. A damaged file fails the replay, or with
/// `skip_damaged` is left out and named in [`Replayed::damaged_files`].
pub fn replay(
    data_dir: &Path,
    mut config: DetectConfig,
    from_us: i64,
    until_us: i64,
    skip_damaged: bool,
) -> Result<Replayed> {
    let window_secs = config.window_secs as i64;
    // The canary's samples come from the recording, not from this machine now.
    config.cache_canary = false;
    let tables = vtax_collectors::tables();
    let mut by_second: BTreeMap<i64, Vec<Batch>> = BTreeMap::new();
    let mut damaged = BTreeMap::new();
    for name in OBSERVED_TABLES {
        let Some(table) = tables.iter().find(|t| t.name == *name) else {
            continue;
        };
        let request = ScanRequest {
            table: table.name.to_string(),
            from_us: Some(from_us),
            until_us: Some(until_us),
            skip_damaged,
            ..ScanRequest::default()
        };
        for (time_us, batch) in load(data_dir, table, &request, &mut damaged)? {
            by_second
                .entry(time_us.div_euclid(1_000_000))
                .or_default()
                .push(batch);
        }
    }
    let canary = load_canary(
        data_dir,
        from_us,
        until_us,
        window_secs,
        skip_damaged,
        &mut damaged,
    )?;
    let mut detector = Detector::new(config);
    let mut events = Vec::new();
    let first = from_us.div_euclid(1_000_000);
    let last = (until_us - 1).div_euclid(1_000_000);
    for second in first..=last {
        if let Some(batches) = by_second.get(&second) {
            for batch in batches {
                detector.observe(batch);
            }
        }
        if let Some(value) = canary.get(&second) {
            detector.sample(
                Resource::Memory,
                "node",
                "cache_latency_seconds",
                second * 1_000_000,
                *value,
            );
        }
        for batch in detector.tick((second + 1) * 1_000_000) {
            if batch.table.name == crate::tables::NEIGHBOR_EVENTS.name {
                opened(&batch, &mut events);
            }
        }
    }
    Ok(Replayed {
        events,
        damaged_files: damaged.into_iter().collect(),
    })
}

/// Scans the store as `request` asks, adding the damaged files it left out
/// to `damaged` (a file holds rows of one table, so each is met once).
fn scan(
    data_dir: &Path,
    request: &ScanRequest,
    damaged: &mut BTreeMap<PathBuf, String>,
) -> Result<ScanResult> {
    let mut result = scan_dir(data_dir, &crate::tables::catalog(), request)
        .with_context(|| format!("scan {} in {}", request.table, data_dir.display()))?;
    damaged.extend(result.damaged_files.drain(..));
    Ok(result)
}

/// The rows of `table` in the span, one batch per second, as the collector
/// handed them to the detector.
fn load(
    data_dir: &Path,
    table: &'static TableDef,
    request: &ScanRequest,
    damaged: &mut BTreeMap<PathBuf, String>,
) -> Result<BTreeMap<i64, Batch>> {
    let result = scan(data_dir, request, damaged)?;
    // Files hold rows sorted by tags; the detector takes them second by
    // second, each second's rows in one batch.
    let mut builders: BTreeMap<i64, BatchBuilder> = BTreeMap::new();
    for batch in &result.batches {
        add_rows(table, batch, &mut builders)?;
    }
    Ok(builders
        .into_iter()
        .map(|(time_us, mut builder)| (time_us, builder.finish()))
        .collect())
}

/// Adds one scan batch's rows to the builder of their time, in `table`'s
/// declared order; a tag or field the file lacks (an older schema) is empty
/// or null.
fn add_rows(
    table: &'static TableDef,
    batch: &RecordBatch,
    builders: &mut BTreeMap<i64, BatchBuilder>,
) -> Result<()> {
    let n = batch.num_rows();
    let time = batch
        .column_by_name(vtax_store::schema::TIME_COLUMN)
        .context("a scan without its time column")?;
    let time = time
        .as_primitive_opt::<TimestampMicrosecondType>()
        .context("time is not microseconds")?;
    let mut tags = Vec::with_capacity(table.tags.len());
    for tag in table.tags {
        tags.push(match batch.column_by_name(tag.name) {
            Some(column) => Some(arrow_cast::cast(column, &DataType::Utf8)?),
            None => None,
        });
    }
    let tags: Vec<Option<&StringArray>> = tags
        .iter()
        .map(|column| column.as_ref().map(|c| c.as_string::<i32>()))
        .collect();
    let mut fields: Vec<Vec<Value>> = Vec::with_capacity(table.fields.len());
    for field in table.fields {
        let Some(column) = batch.column_by_name(field.name) else {
            fields.push(vec![Value::Null; n]);
            continue;
        };
        fields.push(match field.ty {
            FieldType::F64 => typed_values::<Float64Type>(column, Value::F64)?,
            FieldType::I64 => typed_values::<Int64Type>(column, Value::I64)?,
            FieldType::U64 => typed_values::<UInt64Type>(column, Value::U64)?,
        });
    }
    let mut row_tags: Vec<&str> = Vec::with_capacity(tags.len());
    let mut row_values: Vec<Value> = Vec::with_capacity(fields.len());
    for i in 0..n {
        row_tags.clear();
        row_tags.extend(tags.iter().map(|column| match column {
            Some(strings) if strings.is_valid(i) => strings.value(i),
            _ => "",
        }));
        row_values.clear();
        row_values.extend(fields.iter().map(|column| column[i]));
        let time_us = time.value(i);
        builders
            .entry(time_us)
            .or_insert_with(|| BatchBuilder::new(table))
            .push(time_us, &row_tags, &row_values)
            .with_context(|| format!("a {} row at {time_us}", table.name))?;
    }
    Ok(())
}

/// A column as `T`'s values, nulls as [`Value::Null`].
fn typed_values<T: ArrowPrimitiveType>(
    column: &dyn Array,
    wrap: fn(T::Native) -> Value,
) -> Result<Vec<Value>> {
    let cast = arrow_cast::cast(column, &T::DATA_TYPE)?;
    Ok(cast
        .as_primitive::<T>()
        .iter()
        .map(|v| v.map_or(Value::Null, wrap))
        .collect())
}

/// The canary's window means, as each second's sample of their window.
fn load_canary(
    data_dir: &Path,
    from_us: i64,
    until_us: i64,
    window_secs: i64,
    skip_damaged: bool,
    damaged: &mut BTreeMap<PathBuf, String>,
) -> Result<BTreeMap<i64, f64>> {
    let request = ScanRequest {
        table: crate::tables::DETECTOR_SIGNAL.name.to_string(),
        from_us: Some(from_us),
        until_us: Some(until_us + window_secs * 1_000_000),
        tag_equals: vec![
            ("resource".into(), "memory".into()),
            ("victim".into(), "node".into()),
            ("signal".into(), "cache_latency_seconds".into()),
        ],
        fields: Some(vec!["value".into()]),
        fields_only: false,
        skip_damaged,
    };
    let result = scan(data_dir, &request, damaged)?;
    let rows = crate::stored_rows::Rows::from_batches(&result.batches);
    let mut seconds = BTreeMap::new();
    for (time_us, value) in rows.time_us.iter().zip(rows.field("value")) {
        let Some(value) = value else {
            continue;
        };
        // A row is stamped with its window's end.
        let end = time_us.div_euclid(1_000_000);
        for second in end - window_secs..end {
            seconds.insert(second, value);
        }
    }
    Ok(seconds)
}

/// The first name in a `neighbor_events` row's `suspects`, `none` when it
/// names none.
pub fn first_suspect(suspects: &str) -> String {
    crate::suspect_text::first_name(suspects).unwrap_or_else(|| "none".into())
}

/// The events `batch` (of `neighbor_events`) opened, and the open events
/// that named a new first suspect.
fn opened(batch: &Batch, events: &mut Vec<OpenedEvent>) {
    let view = View::new(batch);
    for row in 0..view.rows() {
        let state = view.tag(row, "state");
        if !matches!(state, "open" | "updated") {
            continue;
        }
        let suspect = first_suspect(view.tag(row, "suspects"));
        events.push(OpenedEvent {
            time: (view.time_us(row).div_euclid(1_000_000) + WINDOW_GRACE_SECS) as f64,
            start_time: view.value(row, "start_time_seconds").unwrap_or(f64::NAN),
            resource: view.tag(row, "resource").to_string(),
            victim: view.tag(row, "victim").to_string(),
            signal: view.tag(row, "signal").to_string(),
            suspect,
            score: view.value(row, "score").unwrap_or(f64::NAN),
            state: state.to_string(),
        });
    }
}
