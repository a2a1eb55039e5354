//! The agent's clock: wall-clock time that never steps back by a little.
//!
//! Rows are stamped with the wall clock, and their readers take rates over
//! the stamps: a counter's growth over the time between two rows. When NTP
//! or a leap second steps the wall clock back by a second, a row taken just
//! after the step is stamped microseconds after the one before while its
//! counters grew by a whole second: the detector read shares of time far
//! above 1 and opened events, and a window of the jitter probe was written
//! twice. So the clock here follows the wall clock through the boot
//! clock (`CLOCK_BOOTTIME`, never stepped, counting a suspend) and takes a
//! difference of up to [`SLEW_LIMIT_US`] in gradually, at most
//! [`SLEW_RATE`] of the time passing, as NTP's own slew does: stamps keep
//! their order, and their spacing is the time that passed within a
//! thousandth, which no rate taken over them can tell from noise (at a tenth,
//! rates read a ninth high for ten times the step, enough for a saturated
//! cgroup's CPU pressure to read above 1 and open an event). A larger difference (a clock set minutes,
//! an hour or a year off, or corrected) is taken at once, as a step.
//!
//! When the wall clock keeps time, this clock is the wall clock.

use std::sync::Mutex;
use std::time::{SystemTime, UNIX_EPOCH};

/// Largest difference from the wall clock taken in gradually: a leap second,
/// an NTP step (NTP steps at 128 ms).
pub const SLEW_LIMIT_US: i64 = 2_000_000;

/// Share of the time passing by which the clock may run fast or slow while
/// it takes in a difference: a leap second is taken in over 17 minutes,
/// whose stamps are 0.999 s apart a second.
pub const SLEW_RATE: f64 = 0.001;

/// The clock's state between two readings.
#[derive(Clone, Copy, Debug)]
pub struct Slewed {
    /// The last time read, and the boot clock then, in µs.
    last: (i64, i64),
}

impl Slewed {
    /// A clock that starts at the wall time `wall_us`, boot clock `boot_us`.
    pub fn new(wall_us: i64, boot_us: i64) -> Slewed {
        Slewed {
            last: (wall_us, boot_us),
        }
    }

    /// The time now, the wall clock reading `wall_us` and the boot clock
    /// `boot_us`: the last time plus the boot clock's advance, moved towards
    /// the wall clock by at most [`SLEW_RATE`] of that advance, or the wall
    /// clock itself when it is more than [`SLEW_LIMIT_US`] away.
    pub fn at(&mut self, wall_us: i64, boot_us: i64) -> i64 {
        let (last_us, last_boot_us) = self.last;
        let passed = (boot_us - last_boot_us).max(0);
        let steady = last_us + passed;
        let off = wall_us - steady;
        let now = if off.abs() > SLEW_LIMIT_US {
            tracing::warn!(
                step_secs = off as f64 / 1e6,
                "The wall clock stepped: rows are stamped from the new time on."
            );
            wall_us
        } else {
            let most = ((passed as f64) * SLEW_RATE) as i64;
            steady + off.clamp(-most, most)
        };
        self.last = (now, boot_us);
        now
    }
}

static CLOCK: Mutex<Option<Slewed>> = Mutex::new(None);

/// The agent's time in µs since the Unix epoch (see the module's doc).
pub fn now_us() -> i64 {
    // Both clocks are read under the lock: a thread held up between its
    // reading and the lock would set the clock back to an older boot time,
    // and the next reading would run ahead by the delay.
    let mut clock = CLOCK.lock().unwrap_or_else(|e| e.into_inner());
    let wall = wall_us();
    let Some(boot) = boot_us() else {
        return wall;
    };
    match clock.as_mut() {
        Some(slewed) => slewed.at(wall, boot),
        None => {
            *clock = Some(Slewed::new(wall, boot));
            wall
        }
    }
}

/// The wall clock in µs since the Unix epoch.
pub fn wall_us() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_micros() as i64)
        .unwrap_or(0)
}

/// `CLOCK_BOOTTIME` in µs.
pub fn boot_us() -> Option<i64> {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes the timespec we pass it.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_BOOTTIME, &mut ts) };
    (rc == 0).then(|| ts.tv_sec * 1_000_000 + ts.tv_nsec / 1_000)
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: i64 = 1_000_000;
    const T: i64 = 1_796_640_000 * S;

    /// Readings a second apart of a wall clock `wall(i)`: the stamps.
    fn stamps(wall: impl Fn(i64) -> i64, seconds: i64) -> Vec<i64> {
        let mut clock = Slewed::new(wall(0), 0);
        (1..=seconds).map(|i| clock.at(wall(i), i * S)).collect()
    }

    #[test]
    fn a_clock_that_keeps_time_is_the_wall_clock() {
        let t = stamps(|i| T + i * S + 7, 100);
        assert!(t
            .iter()
            .enumerate()
            .all(|(i, &t)| t == T + (i as i64 + 1) * S + 7));
    }

    /// A leap second: the stamps stay in order and 0.999 s apart or more,
    /// and are the wall clock again after 1000 seconds.
    #[test]
    fn a_second_back_is_taken_in_over_a_thousand_seconds() {
        let wall = |i: i64| T + i * S - if i >= 5 { S } else { 0 };
        let t = stamps(wall, 1100);
        for w in t.windows(2) {
            let step = w[1] - w[0];
            assert!((999_000..=1_000_000).contains(&step), "{step}");
        }
        assert_eq!(t[1099], wall(1100));
        assert_eq!(t[3], wall(4));
        assert!(t[500] > wall(501), "still taking it in at 500 s");
    }

    #[test]
    fn a_step_of_an_hour_either_way_is_taken_at_once() {
        let ahead = stamps(|i| T + i * S + if i >= 5 { 3600 * S } else { 0 }, 10);
        assert_eq!(ahead[4], T + 5 * S + 3600 * S);
        let back = stamps(|i| T + i * S - if i >= 5 { 3600 * S } else { 0 }, 10);
        assert_eq!(back[4], T + 5 * S - 3600 * S);
        assert_eq!(back[5], T + 6 * S - 3600 * S);
    }
}
