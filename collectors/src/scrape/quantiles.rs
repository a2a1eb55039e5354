//! Latency quantiles of the scraped histograms, per window: the buckets'
//! growth between two snapshots and the quantile from it.

use super::*;

/// A histogram series' buckets: (upper bound, cumulative count), sorted by bound.
pub type Buckets = Vec<(f64, f64)>;

/// Histogram series of one scrape, by (family, labels without `le`).
pub type Snapshot = BTreeMap<(String, String), Buckets>;

/// The `q`-quantile of a histogram given as cumulative bucket counts, the way
/// PromQL's `histogram_quantile` computes it: find the bucket the rank falls
/// in and interpolate linearly within it, the first bucket starting at 0
/// (when its bound is positive); a rank in the `+Inf` bucket gives the
/// largest finite bound. Counts that decrease with the bound are raised to
/// the running maximum, as Prometheus does. None where PromQL answers NaN: no
/// observations, no `+Inf` bucket, fewer than two buckets, or a count or
/// bound that is NaN or negative infinity.
pub fn bucket_quantile(q: f64, buckets: &[(f64, f64)]) -> Option<f64> {
    if buckets
        .iter()
        .any(|&(le, n)| le.is_nan() || !n.is_finite() || le == f64::NEG_INFINITY)
    {
        return None;
    }
    let mut b: Buckets = buckets.to_vec();
    b.sort_by(|x, y| x.0.total_cmp(&y.0));
    // Two buckets with one bound (aggregated series) hold the sum of both.
    b.dedup_by(|next, kept| {
        let same = next.0 == kept.0;
        if same {
            kept.1 += next.1;
        }
        same
    });
    if b.len() < 2 || b[b.len() - 1].0 != f64::INFINITY {
        return None;
    }
    let mut running = f64::NEG_INFINITY;
    for bucket in &mut b {
        running = running.max(bucket.1);
        bucket.1 = running;
    }
    let total = b[b.len() - 1].1;
    if total <= 0.0 {
        return None;
    }
    let rank = q.clamp(0.0, 1.0) * total;
    let i = b.iter().position(|&(_, n)| n >= rank)?;
    if i == b.len() - 1 {
        return Some(b[i - 1].0);
    }
    let (end, at_end) = b[i];
    if i == 0 && end <= 0.0 {
        return Some(end);
    }
    let (start, below) = if i == 0 { (0.0, 0.0) } else { b[i - 1] };
    let in_bucket = at_end - below;
    if in_bucket <= 0.0 {
        return Some(end);
    }
    Some(start + (end - start) * (rank - below) / in_bucket)
}

/// The observations a histogram series made between two scrapes: per bucket,
/// the later count minus the earlier. A count that went down (the target
/// restarted) or a changed set of bounds means the series started over: the
/// later counts are the window's, as PromQL's `increase` counts a reset.
pub fn window_delta(before: &[(f64, f64)], after: &[(f64, f64)]) -> Buckets {
    let same_bounds =
        before.len() == after.len() && before.iter().zip(after).all(|(b, a)| b.0 == a.0);
    if !same_bounds || before.iter().zip(after).any(|(b, a)| a.1 < b.1) {
        return after.to_vec();
    }
    before
        .iter()
        .zip(after)
        .map(|(b, a)| (a.0, a.1 - b.1))
        .collect()
}

/// Seconds per unit of a histogram, from its name's unit suffix.
pub(super) fn seconds_per_unit(family: &str) -> f64 {
    if family.ends_with("_milliseconds") || family.ends_with("_ms") {
        1e-3
    } else if family.ends_with("_microseconds") || family.ends_with("_us") {
        1e-6
    } else {
        1.0
    }
}

/// Splits a canonical label set into the value of `le` and the rest, still
/// canonical. None when there is no `le` or the text is not canonical.
pub fn split_le(labels: &str) -> Option<(String, &str)> {
    let mut rest = String::with_capacity(labels.len());
    let mut le = None;
    let bytes = labels.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        let start = i;
        let eq = labels[i..].find("=\"")? + i;
        let name = &labels[i..eq];
        let mut j = eq + 2;
        while j < bytes.len() && bytes[j] != b'"' {
            j += if bytes[j] == b'\\' { 2 } else { 1 };
        }
        if j >= bytes.len() {
            return None;
        }
        let value = &labels[eq + 2..j];
        if name == "le" {
            le = Some(value);
        } else {
            if !rest.is_empty() {
                rest.push(',');
            }
            rest.push_str(&labels[start..=j]);
        }
        i = j + 1;
        if i < bytes.len() {
            if bytes[i] != b',' {
                return None;
            }
            i += 1;
        }
    }
    le.map(|le| (rest, le))
}

/// A target's window: the histogram snapshot of the scrape that opened it.
#[derive(Default)]
pub struct Windows {
    pub(super) window_us: i64,
    pub(super) base: Option<(i64, i64, Snapshot)>,
}

impl Windows {
    /// Windows of `window_secs`, on wall-clock multiples.
    pub fn new(window_secs: u64) -> Self {
        Windows {
            window_us: window_secs as i64 * 1_000_000,
            base: None,
        }
    }

    /// Takes a scrape's snapshot (`grid_us`: the wall-clock instant it was
    /// scheduled for, which decides its window; `time_us`: when it ran).
    /// When the scrape is in a later window than the one open, returns the
    /// closed window's rows: (family, labels, delta buckets, seconds covered).
    pub fn advance(
        &mut self,
        grid_us: i64,
        time_us: i64,
        snapshot: Snapshot,
    ) -> Vec<(String, String, Buckets, f64)> {
        let mut closed = Vec::new();
        match &self.base {
            Some((base_grid, _, _))
                if grid_us.div_euclid(self.window_us) == base_grid.div_euclid(self.window_us) =>
            {
                return closed;
            }
            Some((_, base_time, base)) => {
                let span = (time_us - base_time) as f64 / 1e6;
                for ((family, labels), after) in &snapshot {
                    // A series that appeared within the window has no opening
                    // scrape; PromQL's increase needs two samples too.
                    if let Some(before) = base.get(&(family.clone(), labels.clone())) {
                        closed.push((
                            family.clone(),
                            labels.clone(),
                            window_delta(before, after),
                            span,
                        ));
                    }
                }
            }
            None => {}
        }
        self.base = Some((grid_us, time_us, snapshot));
        closed
    }
}
