//! The ranges numeric settings accept, declared beside each section's keys
//! (the config's own, each collector's, the detector's) and checked when the
//! file is read.

/// A table of numeric keys and their ranges.
pub type KeyRanges = &'static [(&'static str, KeyRange)];

/// The values a numeric key accepts: from `min` (or above it) to `max`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct KeyRange {
    min: f64,
    max: f64,
    above_min: bool,
}

impl KeyRange {
    /// From `min` to `max`, both included.
    pub const fn between(min: f64, max: f64) -> KeyRange {
        KeyRange {
            min,
            max,
            above_min: false,
        }
    }

    /// Above `min` (excluded), at most `max`.
    pub const fn above(min: f64, max: f64) -> KeyRange {
        KeyRange {
            min,
            max,
            above_min: true,
        }
    }

    /// Whether `value` is in the range (never NaN).
    pub fn contains(&self, value: f64) -> bool {
        let low = if self.above_min {
            value > self.min
        } else {
            value >= self.min
        };
        low && value <= self.max
    }

    /// "between 1 and 86400", "above 0 and at most 3600".
    pub fn describe(&self) -> String {
        if self.above_min {
            format!("above {} and at most {}", self.min, self.max)
        } else {
            format!("between {} and {}", self.min, self.max)
        }
    }
}
