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
//! - an exact read below the exact read before it is the driver's counter
//!   starting again (a driver reload): the exported counter starts again with
//!   it, as it did when every tick read the counter.
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

/// Microseconds in a second.
const US: f64 = 1e6;

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
}

impl EnergyCounter {
    /// Whether the tick at `time_us` reads the exact counter: the first
    /// tick, every tick until a read succeeds (a board without the counter
    /// keeps asking, as every tick did before; the call fails at once
    /// there), and then once `interval_secs` has passed. Half a tick of
    /// slack keeps a tick that comes a little early from slipping the read
    /// to the tick after.
    pub fn exact_due(&self, time_us: i64, interval_secs: f64, tick_secs: f64) -> bool {
        match self.exact {
            None => true,
            Some((at, _)) => (time_us - at) as f64 / US + tick_secs / 2.0 >= interval_secs,
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
        let exact_joules = exact_joules.filter(|e| e.is_finite() && *e >= 0.0);
        let exported = match (exact_joules, self.exact) {
            (Some(exact), previous) => {
                let restarted = previous.is_some_and(|(_, before)| exact < before);
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
    fn a_counter_that_starts_again_is_followed() {
        let mut c = EnergyCounter::default();
        c.update(0, Some(500.0), Some(1_000_000.0));
        c.update(S, Some(500.0), None);
        // The driver reloaded: its counter starts from nothing.
        let r = c.update(2 * S, Some(500.0), Some(250.0));
        assert_eq!(r.joules, Some(250.0));
        assert_eq!(r.integration_error_joules, None);
        assert_eq!(c.update(3 * S, Some(500.0), None).joules, Some(750.0));
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
