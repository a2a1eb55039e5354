//! `[detect]`: the detector's settings, their ranges and their comments in
//! the example config.

use serde::{Deserialize, Serialize};

use super::*;

/// `[detect]`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DetectConfig {
    /// Whether the detector runs.
    pub enabled: bool,
    /// Seconds per judged window.
    pub window_secs: u64,
    /// Abnormal windows in a row that open an event.
    pub open_windows: u32,
    /// Normal windows in a row that close an event.
    pub close_windows: u32,
    /// Windows each baseline remembers.
    pub baseline_windows: u64,
    /// Windows a baseline needs before it judges.
    pub min_baseline_windows: u64,
    /// Abnormal windows in a row after which the baseline learns them too.
    pub learn_abnormal_after_windows: u32,
    /// Robust z that makes a window abnormal.
    pub z_open: f64,
    /// Robust z under which a window is normal.
    pub z_close: f64,
    /// Seconds of history the suspects are ranked over.
    pub lookback_secs: u64,
    /// Whether the cache canary runs (the memory signal where the PMU is hidden).
    pub cache_canary: bool,
}

impl Default for DetectConfig {
    fn default() -> Self {
        DetectConfig {
            enabled: true,
            window_secs: DEFAULT_WINDOW_SECS,
            open_windows: DEFAULT_OPEN_WINDOWS,
            close_windows: DEFAULT_CLOSE_WINDOWS,
            baseline_windows: DEFAULT_BASELINE_WINDOWS,
            min_baseline_windows: DEFAULT_MIN_BASELINE_WINDOWS,
            learn_abnormal_after_windows: DEFAULT_LEARN_ABNORMAL_AFTER_WINDOWS,
            z_open: DEFAULT_Z_OPEN,
            z_close: DEFAULT_Z_CLOSE,
            lookback_secs: DEFAULT_LOOKBACK_SECS,
            cache_canary: true,
        }
    }
}

impl DetectConfig {
    /// Checks what the types cannot; on failure the key and the message.
    pub fn validate(&self) -> Result<(), (String, String)> {
        let fail = |key: &str, message: String| Err((format!("detect.{key}"), message));
        if !(1..=300).contains(&self.window_secs) {
            return fail(
                "window_secs",
                format!(
                    "detect.window_secs = {}: must be 1 to 300",
                    self.window_secs
                ),
            );
        }
        if self.learn_abnormal_after_windows == 0 {
            return fail(
                "learn_abnormal_after_windows",
                "detect.learn_abnormal_after_windows must be at least 1 (1: learn every window)"
                    .into(),
            );
        }
        if self.open_windows == 0 || self.close_windows == 0 {
            return fail(
                "open_windows",
                "detect.open_windows and detect.close_windows must be at least 1".into(),
            );
        }
        if self.min_baseline_windows < 3 || self.baseline_windows < self.min_baseline_windows {
            return fail(
                "baseline_windows",
                format!(
                    "detect.baseline_windows = {} must be at least detect.min_baseline_windows = {}, which must be at least 3",
                    self.baseline_windows, self.min_baseline_windows
                ),
            );
        }
        if !(self.z_close.is_finite()
            && self.z_open.is_finite()
            && 0.0 < self.z_close
            && self.z_close < self.z_open)
        {
            return fail(
                "z_open",
                format!(
                    "detect.z_close = {} must be above 0 and below detect.z_open = {}",
                    self.z_close, self.z_open
                ),
            );
        }
        if self.lookback_secs < self.window_secs * u64::from(self.open_windows) {
            return fail(
                "lookback_secs",
                format!(
                    "detect.lookback_secs = {} must cover the windows that open an event ({} s)",
                    self.lookback_secs,
                    self.window_secs * u64::from(self.open_windows)
                ),
            );
        }
        Ok(())
    }
}

/// Ranges of the numeric keys of `[detect]`: the baselines and the history
/// are held in memory, so their lengths are bounded.
pub const KEY_RANGES: vtax_collectors::keys::KeyRanges = &[
    (
        "window_secs",
        vtax_collectors::keys::KeyRange::between(1.0, 300.0),
    ),
    (
        "open_windows",
        vtax_collectors::keys::KeyRange::between(1.0, 1000.0),
    ),
    (
        "close_windows",
        vtax_collectors::keys::KeyRange::between(1.0, 1000.0),
    ),
    (
        "baseline_windows",
        vtax_collectors::keys::KeyRange::between(3.0, 100_000.0),
    ),
    (
        "min_baseline_windows",
        vtax_collectors::keys::KeyRange::between(3.0, 100_000.0),
    ),
    (
        "learn_abnormal_after_windows",
        vtax_collectors::keys::KeyRange::between(1.0, 1_000_000.0),
    ),
    (
        "z_open",
        vtax_collectors::keys::KeyRange::above(0.0, 1000.0),
    ),
    (
        "z_close",
        vtax_collectors::keys::KeyRange::above(0.0, 1000.0),
    ),
    (
        "lookback_secs",
        vtax_collectors::keys::KeyRange::between(1.0, 86_400.0),
    ),
];

/// Comments for the example config.
pub const KEY_DOCS: &[(&str, &str)] = &[
    ("detect.enabled", "Whether the noisy-neighbour detector and the platform verdict run."),
    ("detect.window_secs", "Seconds per judged window: each signal's mean over a window is compared with its baseline."),
    ("detect.open_windows", "Abnormal windows in a row that open an event: one blip is not an event."),
    ("detect.close_windows", "Normal windows in a row that close an event (hysteresis)."),
    ("detect.baseline_windows", "Windows each signal's baseline (median and MAD) remembers; relearned from the store after a restart."),
    ("detect.min_baseline_windows", "Windows a baseline needs before it can open an event."),
    ("detect.learn_abnormal_after_windows", "Abnormal windows in a row after which the baseline learns them too (the new normal); shorter bursts are not learned, so a neighbour that comes and goes does not widen the baseline it is judged by. 1 learns every window."),
    ("detect.z_open", "Robust z (distance from the median in MAD-derived standard deviations) that makes a window abnormal."),
    ("detect.z_close", "Robust z under which a window counts as normal again."),
    ("detect.lookback_secs", "Seconds of per-second history over which suspects' usage is correlated with the victim signal."),
    ("detect.cache_canary", "Run the cache canary, a 512 KiB pointer chase once a second (0.3 ms of CPU, 512 KiB of resident memory): the memory-interference signal where the PMU is hidden."),
];
