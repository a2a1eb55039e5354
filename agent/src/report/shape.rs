//! Shaping rows into what the report plots: columns out of Arrow batches,
//! rates from counters, downsampled series, histogram quantiles.

use std::collections::{BTreeMap, HashMap};

pub use crate::stored_rows::Rows;

/// How a downsampled point sums up the points it stands for.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Reduce {
    /// The mean: for levels (utilisation, bandwidth).
    Mean,
    /// The largest: for tails (latency quantiles), which a mean would hide.
    Max,
}

/// At most `max_points` points for `points` (in time order): the time range
/// cut into equal spans, one point per non-empty span at its mean time.
pub fn downsample(points: &[(i64, f64)], max_points: usize, reduce: Reduce) -> Vec<(i64, f64)> {
    if points.len() <= max_points || max_points == 0 {
        return points.to_vec();
    }
    let (first, last) = (points[0].0, points[points.len() - 1].0);
    let span = ((last - first) / max_points as i64).max(1) + 1;
    let mut out = Vec::with_capacity(max_points);
    let mut current: Option<(i64, i128, f64, f64, usize)> = None; // (slot, time sum, sum, max, n)
    let flush = |slot: (i64, i128, f64, f64, usize), out: &mut Vec<(i64, f64)>| {
        let (_, time_sum, sum, max, n) = slot;
        let value = match reduce {
            Reduce::Mean => sum / n as f64,
            Reduce::Max => max,
        };
        out.push(((time_sum / n as i128) as i64, value));
    };
    for &(t, v) in points {
        let slot = (t - first) / span;
        match &mut current {
            Some(c) if c.0 == slot => {
                c.1 += t as i128;
                c.2 += v;
                c.3 = c.3.max(v);
                c.4 += 1;
            }
            _ => {
                if let Some(c) = current.take() {
                    flush(c, &mut out);
                }
                current = Some((slot, t as i128, v, v, 1));
            }
        }
    }
    if let Some(c) = current {
        flush(c, &mut out);
    }
    out
}

/// Per-second rates of a counter between successive samples (in time order),
/// at the later sample's time. A decrease is a reset (a reboot, a driver
/// reload): that interval has no rate rather than a negative one.
pub fn counter_rates(points: &[(i64, f64)]) -> Vec<(i64, f64)> {
    points
        .windows(2)
        .filter_map(|w| {
            let (dt_us, dv) = (w[1].0 - w[0].0, w[1].1 - w[0].1);
            (dt_us > 0 && dv >= 0.0).then(|| (w[1].0, dv / (dt_us as f64 / 1e6)))
        })
        .collect()
}

/// A counter's mean rate over its samples: its growth over the time the
/// growth took, so that an interval across a gap (the agent down for an
/// hour) weighs its hour, not one sample. Intervals across a reset are left
/// out, as [`counter_rates`] leaves them.
pub fn counter_mean_rate(points: &[(i64, f64)]) -> Option<f64> {
    let (grown, seconds) = points
        .windows(2)
        .map(|w| (w[1].0 - w[0].0, w[1].1 - w[0].1))
        .filter(|&(dt_us, dv)| dt_us > 0 && dv >= 0.0)
        .fold((0.0, 0.0), |(g, s), (dt_us, dv)| {
            (g + dv, s + dt_us as f64 / 1e6)
        });
    (seconds > 0.0).then(|| grown / seconds)
}

/// A counter's growth since its first sample, at each sample (in time
/// order): a decrease is a driver reload, after which the counter starts
/// again from 0, so what it reads then is growth too.
pub fn counter_growth(values: &[f64]) -> Vec<f64> {
    let (mut total, mut previous) = (0.0, None);
    let mut grown = Vec::with_capacity(values.len());
    for &v in values {
        if let Some(p) = previous {
            total += if v >= p { v - p } else { v };
        }
        previous = Some(v);
        grown.push(total);
    }
    grown
}

/// The mean across series at each time that any of them has: series sampled
/// on one tick (every CPU of a node, every GPU) share timestamps.
pub fn mean_by_time<'a>(series: impl IntoIterator<Item = &'a Vec<(i64, f64)>>) -> Vec<(i64, f64)> {
    let mut sums: BTreeMap<i64, (f64, usize)> = BTreeMap::new();
    for points in series {
        for &(t, v) in points {
            let e = sums.entry(t).or_default();
            e.0 += v;
            e.1 += 1;
        }
    }
    sums.into_iter()
        .map(|(t, (sum, n))| (t, sum / n as f64))
        .collect()
}

/// Lowest, median and highest node per time slot: a fleet too large for a
/// line per node. Each node's points are first averaged (or maxed) within
/// `slots` equal slots of the common range, so nodes sampled at different
/// instants still meet in a slot.
pub fn spread_across(
    series: &[&[(i64, f64)]],
    slots: usize,
    reduce: Reduce,
) -> [Vec<(i64, f64)>; 3] {
    let all = series.iter().flat_map(|s| s.iter());
    let (Some(t0), Some(t1)) = (all.clone().map(|p| p.0).min(), all.map(|p| p.0).max()) else {
        return Default::default();
    };
    let slots = slots.max(1);
    let width = ((t1 - t0) / slots as i64).max(1) + 1;
    // slot -> each node's value in it
    let mut per_slot: BTreeMap<i64, Vec<f64>> = BTreeMap::new();
    for points in series {
        let mut node: BTreeMap<i64, (f64, f64, usize)> = BTreeMap::new();
        for &(t, v) in *points {
            let e = node.entry((t - t0) / width).or_insert((0.0, f64::MIN, 0));
            e.0 += v;
            e.1 = e.1.max(v);
            e.2 += 1;
        }
        for (slot, (sum, max, n)) in node {
            let v = match reduce {
                Reduce::Mean => sum / n as f64,
                Reduce::Max => max,
            };
            per_slot.entry(slot).or_default().push(v);
        }
    }
    let mut out: [Vec<(i64, f64)>; 3] = Default::default();
    for (slot, mut values) in per_slot {
        values.sort_by(f64::total_cmp);
        let t = t0 + slot * width + width / 2;
        out[0].push((t, values[0]));
        out[1].push((t, values[values.len() / 2]));
        out[2].push((t, values[values.len() - 1]));
    }
    out
}

/// The mean of the values.
pub fn mean(points: &[(i64, f64)]) -> Option<f64> {
    (!points.is_empty()).then(|| points.iter().map(|p| p.1).sum::<f64>() / points.len() as f64)
}

/// A latency histogram over the report's range: `(upper bound in seconds,
/// count in this bucket)`, bounds ascending, +Inf last.
pub type Histogram = Vec<(f64, f64)>;

/// Builds the range's histogram from cumulative Prometheus-style rows
/// (`le` bucket bounds, counts cumulative over buckets and since the
/// collector started), summed over `series` (CPUs): each series' growth
/// over the range, step by step as [`counter_growth`] adds it, so that an
/// agent restarted in the range (its counts start again from 0) loses
/// neither the counts before the restart nor those after it. The growth
/// starts from the series' last row at or before `from_us` (rows before it
/// are there for that alone; from its first row in the range, the counts of
/// the range's first window were left out). A series with no row before
/// the range grows from its first row in it: its counts since the agent
/// started (which may be days) are not the range's, and a window is the
/// most left out. Over the whole store (`from_us` none), from 0.
pub fn histogram_from_cumulative(
    rows: &[(String, String, i64, f64)],
    from_us: Option<i64>,
) -> Histogram {
    // (series, le) -> its samples in the range.
    let mut samples: HashMap<(&str, &str), Vec<(i64, f64)>> = HashMap::new();
    for (series, le, t, v) in rows {
        samples
            .entry((series.as_str(), le.as_str()))
            .or_default()
            .push((*t, *v));
    }
    let mut by_le: BTreeMap<u64, (f64, f64)> = BTreeMap::new(); // bits of le ordering -> (le, cumulative)
    for ((_, le), mut points) in samples {
        let Some(bound) = parse_le(le) else { continue };
        points.sort_by_key(|&(t, _)| t);
        let values: Vec<f64> = match from_us {
            None => std::iter::once(0.0)
                .chain(points.iter().map(|&(_, v)| v))
                .collect(),
            Some(from) => {
                let before = points.partition_point(|&(t, _)| t <= from);
                points[before.saturating_sub(1)..]
                    .iter()
                    .map(|&(_, v)| v)
                    .collect()
            }
        };
        let count = counter_growth(&values).last().copied().unwrap_or(0.0);
        let e = by_le.entry(order_key(bound)).or_insert((bound, 0.0));
        e.1 += count;
    }
    let mut previous = 0.0;
    by_le
        .into_values()
        .map(|(bound, cumulative)| {
            let in_bucket = (cumulative - previous).max(0.0);
            previous = cumulative;
            (bound, in_bucket)
        })
        .collect()
}

fn parse_le(le: &str) -> Option<f64> {
    match le {
        "+Inf" | "inf" | "Inf" => Some(f64::INFINITY),
        _ => le.parse().ok(),
    }
}

/// A key that sorts non-negative f64 (infinity included) in numeric order.
fn order_key(v: f64) -> u64 {
    v.to_bits()
}

/// Histograms with the same buckets added up (a fleet's from its nodes').
pub fn sum_histograms<'a>(histograms: impl IntoIterator<Item = &'a Histogram>) -> Histogram {
    let mut sum: BTreeMap<u64, (f64, f64)> = BTreeMap::new();
    for h in histograms {
        for &(le, n) in h {
            sum.entry(order_key(le)).or_insert((le, 0.0)).1 += n;
        }
    }
    sum.into_values().collect()
}

/// Where a histogram's quantile lies: inside a finite bucket, or past the
/// last finite bound, where the buckets say only that it is larger.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Quantile {
    /// Interpolated linearly inside the bucket it falls in.
    Within(f64),
    /// In +Inf: more than this, the largest finite bound.
    Above(f64),
}

impl Quantile {
    /// The quantile for a cell: "≈ 1.2 ms" within a bucket (interpolated:
    /// an estimate, not a bound), "> 100 ms" past the last bound.
    pub fn text(self, format: impl Fn(f64) -> String) -> String {
        match self {
            Quantile::Within(v) => format!("≈ {}", format(v)),
            Quantile::Above(v) => format!("> {}", format(v)),
        }
    }
}

/// The q-quantile of a histogram, interpolated linearly inside the bucket
/// it falls in (as Prometheus's histogram_quantile does). Past the largest
/// finite bound it is `Above` that bound, never the bound itself: a tail in
/// +Inf shown as "≤ 100 ms" would point the wrong way. `None` for an empty
/// histogram.
pub fn histogram_quantile(q: f64, histogram: &Histogram) -> Option<Quantile> {
    let total: f64 = histogram.iter().map(|b| b.1).sum();
    if total <= 0.0 {
        return None;
    }
    let rank = q * total;
    let mut seen = 0.0;
    let mut lower = 0.0;
    for &(upper, count) in histogram {
        if seen + count >= rank && count > 0.0 {
            if upper.is_infinite() {
                return Some(Quantile::Above(lower));
            }
            return Some(Quantile::Within(
                lower + (upper - lower) * ((rank - seen) / count),
            ));
        }
        seen += count;
        if upper.is_finite() {
            lower = upper;
        }
    }
    Some(Quantile::Above(lower))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    use arrow_array::{
        Array, DictionaryArray, Float64Array, RecordBatch, TimestampMicrosecondArray, UInt64Array,
    };
    use arrow_schema::{DataType, Field, Schema};

    #[test]
    fn rows_flatten_dictionary_tags_and_numeric_fields() {
        let time = TimestampMicrosecondArray::from(vec![10, 20, 30]).with_timezone("+00:00");
        let gpu: DictionaryArray<arrow_array::types::Int32Type> =
            vec!["0", "1", "0"].into_iter().collect();
        let util = Float64Array::from(vec![Some(0.5), None, Some(0.7)]);
        let mem = UInt64Array::from(vec![1u64, 2, 3]);
        let schema = Arc::new(Schema::new(vec![
            Field::new("time", time.data_type().clone(), false),
            Field::new("gpu", gpu.data_type().clone(), false),
            Field::new("utilization_ratio", DataType::Float64, true),
            Field::new("memory_used_bytes", DataType::UInt64, true),
        ]));
        let batch = RecordBatch::try_new(
            schema,
            vec![Arc::new(time), Arc::new(gpu), Arc::new(util), Arc::new(mem)],
        )
        .unwrap();
        let rows = Rows::from_batches(&[batch.clone(), batch]);
        assert_eq!(rows.len(), 6);
        assert_eq!(rows.tag("gpu"), ["0", "1", "0", "0", "1", "0"]);
        assert_eq!(rows.tag("absent"), [""; 6]);
        assert_eq!(rows.field("memory_used_bytes")[2], Some(3.0));
        let by_gpu = rows.series_by("gpu", "utilization_ratio");
        // Nulls are skipped, and each series comes back in time order.
        assert_eq!(by_gpu["0"], [(10, 0.5), (10, 0.5), (30, 0.7), (30, 0.7)]);
        assert!(!by_gpu.contains_key("1"));
        assert_eq!(rows.latest_tags().unwrap()["gpu"], "0");
    }

    #[test]
    fn downsampling_bounds_points_and_keeps_tails_with_max() {
        let points: Vec<(i64, f64)> = (0..1000)
            .map(|i| (i * 1_000_000, (i % 10) as f64))
            .collect();
        let mean = downsample(&points, 100, Reduce::Mean);
        assert!(mean.len() <= 100 && mean.len() >= 90, "{}", mean.len());
        // Each slot holds whole cycles of 0..9 or nearly: the mean stays near 4.5.
        assert!(mean.iter().all(|p| (3.0..=6.0).contains(&p.1)), "{mean:?}");
        let max = downsample(&points, 100, Reduce::Max);
        assert!(max.iter().all(|p| p.1 == 9.0));
        // Times stay inside the range and in order.
        assert!(max.windows(2).all(|w| w[0].0 < w[1].0));
        assert!(max[0].0 >= 0 && max.last().unwrap().0 <= 999_000_000);
        // Short series pass through untouched.
        assert_eq!(downsample(&points[..5], 100, Reduce::Mean), &points[..5]);
    }

    #[test]
    fn counter_rates_skip_resets() {
        let points = [
            (0, 10.0),
            (1_000_000, 12.0),
            (3_000_000, 13.0),
            (4_000_000, 1.0),
            (5_000_000, 3.0),
        ];
        assert_eq!(
            counter_rates(&points),
            [(1_000_000, 2.0), (3_000_000, 0.5), (5_000_000, 2.0)]
        );
    }

    #[test]
    fn a_counters_mean_rate_weighs_each_interval_by_its_time() {
        // 1 a second for 2 s, then 10 over an hour's gap, then a reset.
        let points = [
            (0, 0.0),
            (1_000_000, 1.0),
            (2_000_000, 2.0),
            (3_602_000_000, 12.0),
            (3_603_000_000, 0.5),
        ];
        let rate = counter_mean_rate(&points).unwrap();
        assert!((rate - 12.0 / 3602.0).abs() < 1e-12, "{rate}");
        // The per-interval rates weigh the hour as one of three.
        let by_sample = mean(&counter_rates(&points)).unwrap();
        assert!(by_sample > 100.0 * rate, "{by_sample}");
        assert_eq!(counter_mean_rate(&points[..1]), None);
    }

    #[test]
    fn mean_by_time_averages_series_sharing_ticks() {
        let a = vec![(1, 1.0), (2, 3.0)];
        let b = vec![(1, 3.0), (3, 5.0)];
        assert_eq!(mean_by_time([&a, &b]), [(1, 2.0), (2, 3.0), (3, 5.0)]);
    }

    #[test]
    fn spread_across_nodes_gives_lowest_median_highest_per_slot() {
        // Three nodes sampled at different instants inside two slots.
        let a = vec![(0, 1.0), (10, 3.0), (100, 5.0)];
        let b = vec![(1, 4.0), (101, 6.0)];
        let c = vec![(2, 9.0), (102, 0.0)];
        let [low, median, high] = spread_across(&[&a, &b, &c], 2, Reduce::Mean);
        assert_eq!(low.iter().map(|p| p.1).collect::<Vec<_>>(), [2.0, 0.0]);
        assert_eq!(median.iter().map(|p| p.1).collect::<Vec<_>>(), [4.0, 5.0]);
        assert_eq!(high.iter().map(|p| p.1).collect::<Vec<_>>(), [9.0, 6.0]);
        assert!(low[0].0 < low[1].0);
        let [max_low, _, _] = spread_across(&[&a], 2, Reduce::Max);
        assert_eq!(max_low[0].1, 3.0);
        assert!(spread_across(&[], 10, Reduce::Mean)[0].is_empty());
    }

    #[test]
    fn histogram_of_a_range_and_its_quantiles() {
        let row = |cpu: &str, le: &str, t: i64, v: f64| (cpu.to_owned(), le.to_owned(), t, v);
        // Two CPUs, cumulative since start; the range (from 0 on) sees the
        // growth from each CPU's last row at or before its start, or from 0
        // for a CPU with none (CPU 1: the agent started in the range).
        let rows = vec![
            row("0", "1e-05", 0, 10.0),
            row("0", "0.0001", 0, 10.0),
            row("0", "+Inf", 0, 10.0),
            row("0", "1e-05", 9, 60.0),
            row("0", "0.0001", 9, 100.0),
            row("0", "+Inf", 9, 110.0),
            row("1", "1e-05", 9, 40.0),
            row("1", "0.0001", 9, 90.0),
            row("1", "+Inf", 9, 90.0),
        ];
        // The whole store: every CPU from 0, 100/190/200 cumulative.
        assert_eq!(
            histogram_from_cumulative(&rows, None),
            [(1e-5, 100.0), (1e-4, 90.0), (f64::INFINITY, 10.0)]
        );
        let h = histogram_from_cumulative(&rows, Some(0));
        // CPU 0 grew by 50/90/100; CPU 1, with no row before the range,
        // from its first row in it (its counts since the agent started are
        // not the range's): per bucket 50, 40, 10.
        assert_eq!(h, [(1e-5, 50.0), (1e-4, 40.0), (f64::INFINITY, 10.0)]);
        assert_eq!(histogram_quantile(0.5, &h), Some(Quantile::Within(1e-5)));
        let Some(Quantile::Within(p70)) = histogram_quantile(0.7, &h) else {
            panic!("p70 is inside a bucket");
        };
        assert!((p70 - (1e-5 + 9e-5 * 0.5)).abs() < 1e-12, "{p70}");
        // A quantile in +Inf is above the largest finite bound, and says so.
        let p99 = histogram_quantile(0.99, &h).unwrap();
        assert_eq!(p99, Quantile::Above(1e-4));
        assert_eq!(p99.text(|v| format!("{v}")), "> 0.0001");
        assert_eq!(histogram_quantile(0.5, &vec![]), None);
    }

    #[test]
    fn a_restart_in_the_range_keeps_the_counts_on_both_sides_of_it() {
        let row = |le: &str, t: i64, v: f64| ("0".to_owned(), le.to_owned(), t, v);
        // Before the restart the CPU woke 1000 times, 10 of them late
        // (past 100 µs); after it, from 0, 500 times and 490 late. The
        // rows come in no particular order, as files of a store do.
        let rows = vec![
            row("0.0001", 20, 10.0),
            row("+Inf", 20, 500.0),
            row("0.0001", 0, 100.0),
            row("+Inf", 0, 100.0),
            row("0.0001", 10, 1090.0),
            row("+Inf", 10, 1100.0),
        ];
        let h = histogram_from_cumulative(&rows, Some(0));
        // In time (0.0001, +Inf): 100, 1090 | 10 and 100, 1100 | 500. Ends
        // alone would give 10 (last below first) and 400 (last less first),
        // a histogram of 10 on time and 390 late, where it is 1000 on time
        // and 500 late.
        assert_eq!(h, [(1e-4, 1000.0), (f64::INFINITY, 500.0)]);
    }
}
