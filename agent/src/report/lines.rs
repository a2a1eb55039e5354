//! Chart lines from rows: one per node (or a fleet's spread), one per GPU, and
//! the GPU error counters that moved.

use super::*;

/// A line per node, or for a fleet with more nodes than colours, the lowest,
/// median and highest node per time slot (labelled with `what` prefixed).
pub(super) fn node_lines(
    names: &[&str],
    series: &[&[(i64, f64)]],
    max_points: usize,
    reduce: Reduce,
) -> Vec<Line> {
    if names.len() <= svg::PALETTE.len() {
        return names
            .iter()
            .zip(series)
            .enumerate()
            .map(|(i, (name, points))| {
                Line::new(*name, shape::downsample(points, max_points, reduce), i)
            })
            .collect();
    }
    let [low, median, high] = shape::spread_across(series, max_points, reduce);
    [
        ("lowest node", low),
        ("median node", median),
        ("highest node", high),
    ]
    .into_iter()
    .enumerate()
    .map(|(i, (label, points))| Line::new(label, points, i))
    .collect()
}

/// A line per GPU, coloured by its index so it keeps its colour from chart
/// to chart, in index order; a GPU of `summary` without points (lost, or
/// without this metric) keeps its legend entry, which says why.
pub(super) fn gpu_lines(
    summary: &NodeSummary,
    series: BTreeMap<String, Vec<(i64, f64)>>,
    suffix: &dyn Fn(&GpuHealth) -> String,
    max_points: usize,
) -> Vec<Line> {
    let mut series = series;
    let mut lines: Vec<Line> = summary
        .health
        .iter()
        .map(|g| {
            let points = series.remove(&g.index).unwrap_or_default();
            let why = match (&points.is_empty(), g.lost_since) {
                (_, Some(since)) => format!(" (lost at {})", format_time(since, false)),
                (true, None) => " (no samples)".into(),
                (false, None) => suffix(g),
            };
            Line::new(
                format!("GPU {}{why}", g.index),
                shape::downsample(&points, max_points, Reduce::Mean),
                g.number(),
            )
        })
        .collect();
    // A GPU only this table names.
    for (g, points) in series {
        let color = health::gpu_number(&g);
        lines.push(Line::new(
            format!("GPU {g}"),
            shape::downsample(&points, max_points, Reduce::Mean),
            color,
        ));
    }
    lines.sort_by_key(|l| l.color);
    lines
}

/// The GPU error counters that grew in the range, one line per GPU and
/// kind, each counting from zero at the range's start: XIDs (one step per
/// `gpu_event` row), ECC errors and PCIe replays (a counter's drop, a driver
/// reload, starts it again from there). Counters that did not move are left
/// out, so the chart shows only what happened.
pub(super) fn error_lines(
    gpu: &Rows,
    gpu_event: &Rows,
    (from, until): (i64, i64),
    max_points: usize,
) -> (Vec<Line>, Vec<Line>) {
    const COUNTERS: &[(&str, &str, usize)] = &[
        ("ecc_uncorrected_errors", "ECC uncorrected", 1),
        ("ecc_corrected_errors", "ECC corrected", 2),
        ("pcie_replays", "PCIe replays", 3),
    ];
    let mut lines = Vec::new();
    let mut xids: BTreeMap<String, Vec<i64>> = BTreeMap::new();
    let (kinds, event_gpus) = (gpu_event.tag("kind"), gpu_event.tag("gpu"));
    for i in 0..gpu_event.time_us.len() {
        if kinds[i] == "xid" {
            xids.entry(event_gpus[i].to_owned())
                .or_default()
                .push(gpu_event.time_us[i]);
        }
    }
    // Kinds are told apart by the line's pattern: GPU g's kind k is
    // colour g with pattern k (svg::line_style).
    let style = |g: &str, kind: usize| {
        health::gpu_number(g) % svg::PALETTE.len() + kind * svg::PALETTE.len()
    };
    let mut xid_lines = Vec::new();
    for (g, mut times) in xids {
        times.sort_unstable();
        let label = format!("GPU {g} XID ({})", times.len());
        xid_lines.push(Line::events(label, &times, from, until, style(&g, 0)));
    }
    for &(field, what, kind) in COUNTERS {
        for (g, points) in gpu.series_by("gpu", field) {
            let values: Vec<f64> = points.iter().map(|p| p.1).collect();
            let grown: Vec<(i64, f64)> = points
                .iter()
                .map(|p| p.0)
                .zip(shape::counter_growth(&values))
                .collect();
            let total = grown.last().map_or(0.0, |g| g.1);
            if total > 0.0 {
                let label = format!("GPU {g} {what} ({total})");
                let grown = shape::downsample(&grown, max_points, Reduce::Max);
                lines.push(Line::new(label, grown, style(&g, kind)));
            }
        }
    }
    lines.sort_by_key(|l| l.color % svg::PALETTE.len());
    (xid_lines, lines)
}
