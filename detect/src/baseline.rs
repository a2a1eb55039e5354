//! A robust baseline learned online: the median and the median absolute
//! deviation (MAD) of a signal's recent window values. Median and MAD, not
//! mean and standard deviation, so one burst or one outage does not drag the
//! baseline towards itself.

use std::collections::VecDeque;

/// Scales a MAD to a standard deviation for normally distributed values, so a
/// robust z of 3 means what a z-score of 3 does.
const MAD_TO_SIGMA: f64 = 1.4826;

/// The rolling window of one signal's past window values.
#[derive(Clone, Debug)]
pub struct RollingBaseline {
    values: VecDeque<f64>,
    capacity: usize,
}

/// What the baseline says about the signal now.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Summary {
    pub median: f64,
    pub mad: f64,
    pub windows: usize,
}

impl RollingBaseline {
    /// A baseline over at most `capacity` windows.
    pub fn new(capacity: usize) -> Self {
        RollingBaseline {
            values: VecDeque::with_capacity(capacity.min(1024)),
            capacity: capacity.max(1),
        }
    }

    /// Learns one window's value; the oldest leaves once the window is full.
    /// Non-finite values are not learned.
    pub fn push(&mut self, value: f64) {
        if !value.is_finite() {
            return;
        }
        if self.values.len() == self.capacity {
            self.values.pop_front();
        }
        self.values.push_back(value);
    }

    /// The baseline's median and MAD; None before the first value.
    pub fn summary(&self) -> Option<Summary> {
        if self.values.is_empty() {
            return None;
        }
        let mut sorted: Vec<f64> = self.values.iter().copied().collect();
        let median = median_in_place(&mut sorted);
        let mut deviations: Vec<f64> = sorted.iter().map(|v| (v - median).abs()).collect();
        let mad = median_in_place(&mut deviations);
        Some(Summary {
            median,
            mad,
            windows: self.values.len(),
        })
    }
}

impl Summary {
    /// How far `value` is from the median, in robust standard deviations.
    /// `floor` keeps a flat baseline (MAD 0: an idle counter) from turning a
    /// change of one unit in the last digit into an infinite z.
    pub fn robust_z(&self, value: f64, floor: f64) -> f64 {
        let scale = (self.mad * MAD_TO_SIGMA).max(floor).max(f64::MIN_POSITIVE);
        (value - self.median) / scale
    }
}

/// The median of `values` (the mean of the middle two when even), sorting them.
pub(super) fn median_in_place(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    let n = values.len();
    if n % 2 == 1 {
        values[n / 2]
    } else {
        (values[n / 2 - 1] + values[n / 2]) / 2.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_and_mad_of_known_values() {
        let mut b = RollingBaseline::new(10);
        for v in [1.0, 2.0, 3.0, 4.0, 100.0] {
            b.push(v);
        }
        let s = b.summary().unwrap();
        assert_eq!(s.median, 3.0);
        // deviations 2,1,0,1,97 -> median 1
        assert_eq!(s.mad, 1.0);
        assert_eq!(s.windows, 5);
    }

    #[test]
    fn the_oldest_value_leaves_a_full_window() {
        let mut b = RollingBaseline::new(3);
        for v in [50.0, 1.0, 2.0, 3.0] {
            b.push(v);
        }
        assert_eq!(b.summary().unwrap().windows, 3);
        assert_eq!(b.summary().unwrap().median, 2.0);
    }

    #[test]
    fn an_outlier_moves_the_median_little() {
        let mut b = RollingBaseline::new(100);
        for i in 0..99 {
            b.push(10.0 + (i % 3) as f64);
        }
        let before = b.summary().unwrap();
        b.push(1e9);
        let after = b.summary().unwrap();
        assert_eq!(before.median, after.median);
        assert!(after.robust_z(1e9, 0.0) > 1e6);
    }

    #[test]
    fn a_flat_baseline_uses_the_floor() {
        let mut b = RollingBaseline::new(10);
        for _ in 0..10 {
            b.push(0.0);
        }
        let s = b.summary().unwrap();
        assert_eq!(s.mad, 0.0);
        assert_eq!(s.robust_z(0.05, 0.01), 5.0);
        assert!(s.robust_z(0.05, 0.0).is_finite());
    }

    #[test]
    fn non_finite_values_are_not_learned() {
        let mut b = RollingBaseline::new(10);
        b.push(f64::NAN);
        b.push(f64::INFINITY);
        assert!(b.summary().is_none());
    }
}
