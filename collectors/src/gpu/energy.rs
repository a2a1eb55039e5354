//! The energy counter of one GPU, exact every `energy_interval_secs` (on a
//! quiet GPU every `quiet_energy_interval_secs`) and carried on in between
//! by integrating the power readings.
//!
//! NVML's exact counter (`nvmlDeviceGetTotalEnergyConsumption`) costs the
//! driver 3.1-4.9 ms of CPU a read on an H100, the power reading
//! (`nvmlDeviceGetPowerUsage`) a thousandth of that (docs/gpus.md). So the
//! collector reads the counter every `energy_interval_secs` and, each tick
//! in between, adds the trapezoid of the last two power readings:
//! `(P0 + P1) / 2 × Δt`.
//!
//! Reconciliation, at each exact read `E`:
//! - the counter is `E` again whenever `E` is at or above what was
//!   exported: the integration fell short (or was right) and the counter
//!   steps up to the exact value;
//! - when the integration ran ahead (`E` below what was exported, but not
//!   below the exact read before it), the exported counter holds where it
//!   was, and goes on from the larger of that and `E` plus the power
//!   integrated since, so it never goes back; it is exact again at the first
//!   exact read that passes it (the next one, unless the power went almost
//!   to nothing);
//! - an exact read that does not follow from the exact read before it
//!   (below it, or past it by more than any GPU draws in the time between:
//!   [`POWER_WATTS_MAX`] over that time and a second more) is doubted: it is
//!   left out, named as left out, and the counter carries on as between
//!   exact reads. It is a driver's glitch, or the counter starting again
//!   (a GPU reset, a driver reload); the next exact read tells which. One
//!   that follows from the exact read before the doubted one is the counter
//!   as it was, and the doubted read is forgotten; one that follows from the
//!   doubted read is the counter starting again, and the exported counter
//!   starts again with it (Prometheus sees a counter reset when it went
//!   down; when it went up, which only a wrong history can make, as a first
//!   read of nothing, the counter leaps with it once). So a single wrong
//!   read never moves the counter, and a counter that really started again
//!   is followed one exact interval late.
//!
//! So between two exact reads the counter is off the exact one by the
//! integration's error over that interval, and never more than the error of
//! the last interval after a read; the error each exact read found is
//! exported (`energy_integration_error_joules`), with the seconds since the
//! exact read (`energy_exact_age_seconds`).
//!
//! The trapezoid's error over an interval of length L, readings Δt apart:
//! at most `L × Δt² × max|P''| / 12` for a power that varies smoothly, and
//! at most `Δt / 2 × Σ |P_i − P_(i−1)|` for one that changes monotonically
//! between readings (a GPU going from idle to 700 W and back once in an
//! interval, read each second: 0.5 s × 1260 W = 630 J, against 21 kJ in 30 s
//! at 700 W). On Hopper and newer (and Ampere other than GA100) the power
//! reading is the average over the last second (NVML's documentation of
//! `nvmlDeviceGetPowerUsage`), so at 1 s ticks the sum of the readings is
//! the energy, and the trapezoid differs from it by the half-tick at each
//! end: `Δt × |P_n − P_0| / 2`.

use super::plausible::POWER_WATTS_MAX;

/// Microseconds in a second.
const US: f64 = 1e6;

/// Why a doubted exact read is left out, as `plausible::Implausible::why`
/// says it.
pub const DOES_NOT_FOLLOW: &str = "which does not follow from the exact read before it";

/// Whether the exact read `joules` at `time_us` follows from the exact read
/// `from`: not below it, and not past it by more than a GPU can draw in the
/// time between. The second more allows for a driver that updates its
/// counter a little after the read before.
fn follows(from: (i64, f64), time_us: i64, joules: f64) -> bool {
    let (at, before) = from;
    let seconds = ((time_us - at) as f64 / US).max(0.0) + 1.0;
    joules >= before && joules - before <= POWER_WATTS_MAX * seconds
}

/// What one tick exports.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct EnergyReading {
    /// The counter: exact at an exact read, integrated in between; `None`
    /// on a GPU without the exact counter.
    pub joules: Option<f64>,
    /// Seconds since the exact read the counter goes on from.
    pub exact_age_seconds: Option<f64>,
    /// At the last exact read: the integrated counter minus the exact one.
    pub integration_error_joules: Option<f64>,
    /// An exact read this tick that did not follow from the one before it,
    /// left out until the next exact read says what it was.
    pub doubted_joules: Option<f64>,
}

/// One GPU's counter between ticks. It is part of the collector's state of
/// the GPU, so a reload carries it on.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct EnergyCounter {
    /// The last exact read: when (µs) and its value.
    exact: Option<(i64, f64)>,
    /// The exact read plus the power integrated since.
    integrated_joules: f64,
    /// The last power reading: when (µs) and its value.
    power: Option<(i64, f64)>,
    /// What the last tick exported.
    exported_joules: Option<f64>,
    /// At the last exact read, the integrated counter minus the exact one.
    integration_error_joules: Option<f64>,
    /// An exact read that did not follow from `exact`: when and its value.
    doubted: Option<(i64, f64)>,
}

impl EnergyCounter {
    /// Whether the tick at `time_us` reads the exact counter: the first
    /// tick, every tick until a read succeeds (a board without the counter
    /// keeps asking, as every tick did before; the call fails at once
    /// there), and then once `interval_secs` has passed. Half a tick of
    /// slack keeps a tick that comes a little early from slipping the read
    /// to the tick after.
    ///
    /// A doubted read counts as a read here: the read that settles it comes
    /// an interval later, as any other would, not at every tick.
    ///
    /// A clock set back before the last read makes a read due at once: no
    /// read would be due until the clock passed it again (a year, after a
    /// clock set a year ahead and corrected), while the counter went on
    /// integrating.
    pub fn exact_due(&self, time_us: i64, interval_secs: f64, tick_secs: f64) -> bool {
        let last = [self.exact, self.doubted].into_iter().flatten().map(|(at, _)| at).max();
        match last {
            None => true,
            Some(at) => {
                time_us < at || (time_us - at) as f64 / US + tick_secs / 2.0 >= interval_secs
            }
        }
    }

    /// Takes one tick's readings: `power_watts` (each tick, when the GPU
    /// gives it) and `exact_joules` (when the tick read the counter and it
    /// answered).
    pub fn update(
        &mut self,
        time_us: i64,
        power_watts: Option<f64>,
        exact_joules: Option<f64>,
    ) -> EnergyReading {
        let power_watts = power_watts.filter(|p| p.is_finite()).map(|p| p.max(0.0));
        if let (Some((before_us, before)), Some(now)) = (self.power, power_watts) {
            // A clock that went back gives no interval to integrate.
            if time_us > before_us {
                let seconds = (time_us - before_us) as f64 / US;
                self.integrated_joules += (before + now) / 2.0 * seconds;
            }
        }
        if let Some(now) = power_watts {
            self.power = Some((time_us, now));
        }
        let mut exact_joules = exact_joules.filter(|e| e.is_finite() && *e >= 0.0);
        let mut restarted = false;
        let mut doubted_joules = None;
        if let (Some(exact), Some(last)) = (exact_joules, self.exact) {
            if follows(last, time_us, exact) {
                self.doubted = None;
            } else if self.doubted.is_some_and(|d| follows(d, time_us, exact)) {
                self.doubted = None;
                restarted = true;
            } else {
                self.doubted = Some((time_us, exact));
                doubted_joules = Some(exact);
                exact_joules = None;
            }
        }
        let exported = match (exact_joules, self.exact) {
            (Some(exact), previous) => {
                if previous.is_some() && !restarted {
                    self.integration_error_joules = Some(self.integrated_joules - exact);
                } else {
                    self.integration_error_joules = None;
                }
                self.exact = Some((time_us, exact));
                self.integrated_joules = exact;
                match self.exported_joules {
                    Some(held) if !restarted => held.max(exact),
                    _ => exact,
                }
            }
            // No exact read this tick: carried on from the last one.
            (None, Some(_)) => self.exported_joules.map_or(self.integrated_joules, |held| {
                held.max(self.integrated_joules)
            }),
            // The counter never answered: nothing to carry on.
            (None, None) => {
                return EnergyReading::default();
            }
        };
        self.exported_joules = Some(exported);
        EnergyReading {
            joules: Some(exported),
            exact_age_seconds: self.exact.map(|(at, _)| (time_us - at).max(0) as f64 / US),
            integration_error_joules: self.integration_error_joules,
            doubted_joules,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: i64 = 1_000_000;

    #[test]
    fn between_exact_reads_the_power_is_integrated_by_trapezoids() {
        let mut c = EnergyCounter::default();
        assert!(c.exact_due(0, 30.0, 1.0));
        let r = c.update(0, Some(100.0), Some(1000.0));
        assert_eq!(r.joules, Some(1000.0));
        assert_eq!(r.exact_age_seconds, Some(0.0));
        assert_eq!(r.integration_error_joules, None);
        assert!(!c.exact_due(S, 30.0, 1.0));
        // 100 W then 300 W a second later: 200 J.
        let r = c.update(S, Some(300.0), None);
        assert_eq!(r.joules, Some(1200.0));
        assert_eq!(r.exact_age_seconds, Some(1.0));
        // Two seconds at 300 W, one reading missing in between.
        let r = c.update(2 * S, None, None);
        assert_eq!(r.joules, Some(1200.0));
        let r = c.update(3 * S, Some(300.0), None);
        assert_eq!(r.joules, Some(1800.0));
        // Due at 29.5 s already (half a tick early), not at 29.
        assert!(!c.exact_due(29 * S, 30.0, 1.0));
        assert!(c.exact_due(29 * S + S / 2, 30.0, 1.0));
        // A clock set back before the last read: due at once, not once the
        // clock has passed the read again.
        assert!(c.exact_due(-600 * S, 30.0, 1.0));
    }

    #[test]
    fn an_exact_read_above_the_integration_steps_up_to_it() {
        let mut c = EnergyCounter::default();
        c.update(0, Some(100.0), Some(1000.0));
        c.update(S, Some(100.0), None);
        let r = c.update(2 * S, Some(100.0), Some(1250.0));
        assert_eq!(r.joules, Some(1250.0));
        assert_eq!(r.exact_age_seconds, Some(0.0));
        assert_eq!(r.integration_error_joules, Some(-50.0));
        // And goes on from the exact value.
        assert_eq!(c.update(3 * S, Some(100.0), None).joules, Some(1350.0));
    }

    #[test]
    fn an_exact_read_below_the_integration_holds_the_counter_until_it_passes() {
        let mut c = EnergyCounter::default();
        c.update(0, Some(500.0), Some(1000.0));
        assert_eq!(c.update(S, Some(500.0), None).joules, Some(1500.0));
        // The power readings ran ahead: the counter says only 1200 J, where
        // they made it 2000.
        let r = c.update(2 * S, Some(500.0), Some(1200.0));
        assert_eq!(r.joules, Some(1500.0), "held, never back");
        assert_eq!(r.exact_age_seconds, Some(0.0));
        assert_eq!(r.integration_error_joules, Some(800.0));
        // 1200 + 300 = 1500: still held.
        assert_eq!(c.update(3 * S, Some(100.0), None).joules, Some(1500.0));
        // 1600 > 1500: going on from the exact read.
        assert_eq!(c.update(4 * S, Some(100.0), None).joules, Some(1600.0));
        // The next exact read above it: exact again.
        assert_eq!(
            c.update(5 * S, Some(100.0), Some(1750.0)).joules,
            Some(1750.0)
        );
    }

    #[test]
    fn a_counter_that_starts_again_is_followed_at_the_next_exact_read() {
        let mut c = EnergyCounter::default();
        c.update(0, Some(500.0), Some(1_000_000.0));
        c.update(S, Some(500.0), None);
        // The driver reloaded: its counter starts from nothing. Doubted at
        // first, carried on from the power readings.
        let r = c.update(2 * S, Some(500.0), Some(250.0));
        assert_eq!(r.doubted_joules, Some(250.0));
        assert_eq!(r.joules, Some(1_001_000.0));
        assert_eq!(r.exact_age_seconds, Some(2.0));
        // The next exact read comes an interval after the doubted one.
        assert!(!c.exact_due(31 * S, 30.0, 1.0));
        assert!(c.exact_due(32 * S, 30.0, 1.0));
        // It follows from the doubted read: the counter started again.
        let r = c.update(32 * S, Some(500.0), Some(15_250.0));
        assert_eq!(r.doubted_joules, None);
        assert_eq!(r.joules, Some(15_250.0));
        assert_eq!(r.exact_age_seconds, Some(0.0));
        assert_eq!(r.integration_error_joules, None);
        assert_eq!(c.update(33 * S, Some(500.0), None).joules, Some(15_750.0));
    }

    #[test]
    fn one_exact_read_that_does_not_follow_never_moves_the_counter() {
        // A leap of 1e12 J in 30 s, then the counter as it was; then a read
        // of nothing, then the counter as it was again.
        let mut c = EnergyCounter::default();
        c.update(0, Some(700.0), Some(5e8));
        let r = c.update(30 * S, Some(700.0), Some(1e12));
        assert_eq!(r.doubted_joules, Some(1e12));
        assert_eq!(r.joules, Some(5e8 + 21_000.0));
        let r = c.update(60 * S, Some(700.0), Some(5e8 + 42_100.0));
        assert_eq!(r.doubted_joules, None);
        assert_eq!(r.joules, Some(5e8 + 42_100.0));
        assert_eq!(r.integration_error_joules, Some(-100.0));
        let r = c.update(90 * S, Some(700.0), Some(0.0));
        assert_eq!(r.doubted_joules, Some(0.0));
        assert_eq!(r.joules, Some(5e8 + 63_100.0));
        let r = c.update(120 * S, Some(700.0), Some(5e8 + 84_000.0));
        assert_eq!(r.doubted_joules, None);
        assert_eq!(r.joules, Some(5e8 + 84_000.0), "exact again");
        assert_eq!(r.integration_error_joules, Some(100.0));
        // The most a GPU can draw between two reads still follows.
        let most = 5e8 + 84_000.0 + POWER_WATTS_MAX * 31.0;
        let r = c.update(150 * S, Some(700.0), Some(most));
        assert_eq!((r.doubted_joules, r.joules), (None, Some(most)));
    }

    #[test]
    fn without_the_counter_there_is_no_energy() {
        let mut c = EnergyCounter::default();
        for t in 0..5 {
            assert!(c.exact_due(t * S, 30.0, 1.0), "asked every tick");
            assert_eq!(c.update(t * S, Some(200.0), None), EnergyReading::default());
        }
        // A failed exact read after a good one: carried on, and asked again.
        c.update(5 * S, Some(200.0), Some(10.0));
        let r = c.update(36 * S, Some(200.0), None);
        assert_eq!(r.joules, Some(10.0 + 200.0 * 31.0));
        assert!(c.exact_due(37 * S, 30.0, 1.0));
    }

    #[test]
    fn bad_readings_are_left_out() {
        let mut c = EnergyCounter::default();
        c.update(0, Some(100.0), Some(1000.0));
        assert_eq!(c.update(S, Some(f64::NAN), None).joules, Some(1000.0));
        // A negative reading counts as none drawn: 100 W to 0 W over 2 s.
        assert_eq!(c.update(2 * S, Some(-5.0), None).joules, Some(1100.0));
        assert_eq!(
            c.update(3 * S, Some(0.0), Some(f64::INFINITY)).joules,
            Some(1100.0)
        );
        // A clock that went back adds nothing, and integrates from there on.
        assert_eq!(c.update(2 * S, Some(100.0), None).joules, Some(1100.0));
        assert_eq!(c.update(3 * S, Some(100.0), None).joules, Some(1200.0));
    }
}
