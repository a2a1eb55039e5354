//! Relearning baselines after a restart from the detector's own
//! `detector_signal` rows, so a restarted agent judges at once instead of
//! spending `min_baseline_windows` blind and relearning from nothing.

use std::collections::HashMap;

use anyhow::{Context, Result};
use arrow_array::cast::AsArray;
use arrow_array::{Array, RecordBatch};
use arrow_schema::DataType;
use vtax_store::{ScanRequest, ScanResult, Store};

use super::rank::Suspect;
use super::{Detector, Resource, ResumedEvent};
use crate::stored_rows::Rows;

/// `request` over the store, a damaged file left out and named in the log:
/// one damaged file costs the baselines or events it holds, not all of them.
fn scan_past_damage(store: &Store, request: ScanRequest, what: &str) -> Result<ScanResult> {
    let request = ScanRequest {
        skip_damaged: true,
        ..request
    };
    let result = store
        .scan(&request)
        .with_context(|| format!("scan {}", request.table))?;
    for (path, error) in &result.damaged_files {
        tracing::warn!(path = %path.display(), error = %error, "A damaged file was left out of the {what} read back from the store.");
    }
    Ok(result)
}

/// How far back a restarted agent looks for events it left open. An event
/// opened before a longer outage is resumed only if a later row of it falls
/// in this span; older ones stay as their `open` row says.
const RESUME_HORIZON_SECS: i64 = 24 * 3600;

/// Feeds the baselines the window values stored in their horizon; returns
/// how many windows were relearned. Windows stored as abnormal are left out,
/// as the live baseline left out the bursts it judged.
pub fn relearn(detector: &mut Detector, store: &Store, now_us: i64) -> Result<usize> {
    let horizon_us =
        (detector.config.baseline_windows * detector.config.window_secs) as i64 * 1_000_000;
    let request = ScanRequest {
        table: super::tables::DETECTOR_SIGNAL.name.to_string(),
        from_us: Some(now_us - horizon_us),
        until_us: Some(now_us + 1),
        fields: Some(vec!["value".to_string(), "abnormal".to_string()]),
        ..ScanRequest::default()
    };
    let result = scan_past_damage(store, request, "baselines")?;
    let mut rows = Vec::new();
    for batch in &result.batches {
        read_rows(batch, &mut rows)?;
    }
    // Files hold rows sorted by tags; a baseline must learn in time order.
    rows.sort_by_key(|r| r.0);
    for (_, resource, victim, signal, value) in &rows {
        if let Some(resource) = Resource::parse(resource) {
            detector.relearn(resource, victim, signal, *value);
        }
    }
    Ok(rows.len())
}

/// Takes back the events whose last `neighbor_events` row says `open`: the
/// agent stopped while they were open. Returns how many it resumed.
pub fn resume_open_events(detector: &mut Detector, store: &Store, now_us: i64) -> Result<usize> {
    let request = ScanRequest {
        table: super::tables::NEIGHBOR_EVENTS.name.to_string(),
        from_us: Some(now_us - RESUME_HORIZON_SECS * 1_000_000),
        until_us: Some(now_us + 1),
        ..ScanRequest::default()
    };
    let result = scan_past_damage(store, request, "open events")?;
    let rows = Rows::from_batches(&result.batches);
    let (resource, victim, signal, state, suspects, evidence) = (
        rows.tag("resource"),
        rows.tag("victim"),
        rows.tag("signal"),
        rows.tag("state"),
        rows.tag("suspects"),
        rows.tag("evidence"),
    );
    let (start, score) = (rows.field("start_time_seconds"), rows.field("score"));
    // The last row of each event.
    let last = rows.latest_by(|i| {
        (!victim[i].is_empty() && !signal[i].is_empty() && start[i].is_some())
            .then(|| (resource[i], victim[i], signal[i]))
    });
    // Every suspect an event named first, in its `open` row or an `updated`
    // one, at the best score a row gave it: resumed with only its last row's
    // first, the event lost the others, and its closing row (what the
    // report shows) no longer named an antagonist that left before it.
    let mut named: HashMap<(&str, &str, &str, u64), Vec<Suspect>> = HashMap::new();
    for i in 0..rows.len() {
        let (Some(start), "open" | "updated") = (start[i], state[i]) else {
            continue;
        };
        let Some(first) = parse_suspects(suspects[i])
            .into_iter()
            .next()
            .filter(|s| s.score > 0.0)
        else {
            continue;
        };
        named
            .entry((resource[i], victim[i], signal[i], start.to_bits()))
            .or_default()
            .push(first);
    }
    let now_second = now_us.div_euclid(1_000_000);
    let mut resumed = 0;
    // `updated`: an open event that named a new suspect.
    for i in last
        .into_values()
        .filter(|&i| matches!(state[i], "open" | "updated"))
    {
        let named_before = start[i]
            .and_then(|s| named.remove(&(resource[i], victim[i], signal[i], s.to_bits())))
            .unwrap_or_default();
        let Some(resource) = Resource::parse(resource[i]) else {
            continue;
        };
        let event = ResumedEvent {
            resource,
            victim: victim[i].to_string(),
            signal: signal[i].to_string(),
            start_second: start[i].unwrap_or_default() as i64,
            peak_score: score[i].unwrap_or(0.0),
            suspects: parse_suspects(suspects[i]),
            named: named_before,
            evidence: evidence[i].to_string(),
        };
        if detector.resume(event, now_second) {
            resumed += 1;
        }
    }
    Ok(resumed)
}

/// Reads back the `suspects` tag; a part it cannot read is skipped, since
/// the detector ranks the suspects again once the event's seconds are back
/// in its look-back.
pub(super) fn parse_suspects(text: &str) -> Vec<Suspect> {
    crate::suspect_text::parse(text)
        .into_iter()
        .map(|s| Suspect {
            name: s.name,
            correlation: s.correlation,
            effect: s.effect,
            usage_change: 0.0, // not stored
            busy_usage: 0.0,   // not stored
            score: s.score,
        })
        .collect()
}

type Row = (i64, String, String, String, f64);

fn read_rows(batch: &RecordBatch, out: &mut Vec<Row>) -> Result<()> {
    let column = |name: &str| {
        batch
            .column_by_name(name)
            .with_context(|| format!("detector_signal has no column {name}"))
    };
    let time = arrow_cast::cast(column("time")?, &DataType::Int64)?;
    let time = time.as_primitive::<arrow_array::types::Int64Type>();
    let text = |name: &str| -> Result<arrow_array::ArrayRef> {
        Ok(arrow_cast::cast(column(name)?, &DataType::Utf8)?)
    };
    let (resource, victim, signal) = (text("resource")?, text("victim")?, text("signal")?);
    let (resource, victim, signal) = (
        resource.as_string::<i32>(),
        victim.as_string::<i32>(),
        signal.as_string::<i32>(),
    );
    let value = arrow_cast::cast(column("value")?, &DataType::Float64)?;
    let value = value.as_primitive::<arrow_array::types::Float64Type>();
    let abnormal = arrow_cast::cast(column("abnormal")?, &DataType::Int64)?;
    let abnormal = abnormal.as_primitive::<arrow_array::types::Int64Type>();
    for i in 0..batch.num_rows() {
        if value.is_null(i) || resource.is_null(i) || victim.is_null(i) || signal.is_null(i) {
            continue;
        }
        if abnormal.is_valid(i) && abnormal.value(i) != 0 {
            continue;
        }
        out.push((
            time.value(i),
            resource.value(i).to_string(),
            victim.value(i).to_string(),
            signal.value(i).to_string(),
            value.value(i),
        ));
    }
    Ok(())
}

/// The last `tax` row in a data directory, in words, for `vtax doctor`.
pub fn last_tax(data_dir: &std::path::Path) -> String {
    match read_last_tax(data_dir) {
        Ok(Some(text)) => text,
        Ok(None) => format!(
            "no detector rows in {} in the last hour (a running agent writes one every window)",
            data_dir.display()
        ),
        Err(e) => format!("could not read {}: {e:#}", data_dir.display()),
    }
}

fn read_last_tax(data_dir: &std::path::Path) -> Result<Option<String>> {
    if !data_dir.join("tables").exists() && !data_dir.join("wal").exists() {
        return Ok(None);
    }
    let now_us = vtax_collectors::ticks::now_us();
    let request = ScanRequest {
        table: super::tables::TAX.name.to_string(),
        from_us: Some(now_us - 3_600_000_000),
        ..ScanRequest::default()
    };
    // The detector's own tables are all this scan reads.
    let catalog = vtax_store::Catalog::new(super::tables::TABLES)?;
    let result = vtax_store::scan::scan_dir(data_dir, &catalog, &request)?;
    let mut last: Option<(i64, &RecordBatch, usize)> = None;
    for batch in &result.batches {
        let time = arrow_cast::cast(batch.column(0), &DataType::Int64)?;
        let time = time.as_primitive::<arrow_array::types::Int64Type>();
        for i in 0..batch.num_rows() {
            if last.is_none_or(|(t, _, _)| time.value(i) > t) {
                last = Some((time.value(i), batch, i));
            }
        }
    }
    let Some((time_us, batch, row)) = last else {
        return Ok(None);
    };
    let mut parts = Vec::new();
    for field in super::tables::TAX.fields {
        let Some(column) = batch.column_by_name(field.name) else {
            continue;
        };
        let column = arrow_cast::cast(column, &DataType::Float64)?;
        let column = column.as_primitive::<arrow_array::types::Float64Type>();
        let text = if column.is_null(row) {
            "n/a".to_string()
        } else if field.name.ends_with("_seconds") {
            format!("{:.3} ms", column.value(row) * 1e3)
        } else {
            format!("{:.2}%", column.value(row) * 100.0)
        };
        parts.push(format!(
            "{} {text}",
            field
                .name
                .trim_end_matches("_ratio")
                .trim_end_matches("_seconds")
        ));
    }
    let age_secs = (now_us - time_us) / 1_000_000;
    Ok(Some(format!("{} ({age_secs} s ago)", parts.join(", "))))
}
