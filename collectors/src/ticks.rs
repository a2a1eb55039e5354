//! The agent's clock (`vtax_store::clock`: the wall clock, a small step of
//! it taken in gradually): the time rows are stamped with, the grid every
//! collector ticks on, and the stop signal their threads sleep on.

use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

/// Microseconds since the epoch now: the time every row is stamped with.
pub fn now_us() -> i64 {
    vtax_store::clock::now_us()
}

/// A stop signal that sleeping threads wake up for.
#[derive(Default)]
pub struct Stopper {
    stopped: Mutex<bool>,
    wake: Condvar,
}

impl Stopper {
    /// Asks every waiting thread to stop.
    pub fn stop(&self) {
        *self.stopped.lock().expect("not poisoned") = true;
        self.wake.notify_all();
    }

    /// Sleeps until `deadline` or a stop; returns whether stopped.
    pub fn sleep_until(&self, deadline: Instant) -> bool {
        let mut stopped = self.stopped.lock().expect("not poisoned");
        while !*stopped {
            let now = Instant::now();
            if now >= deadline {
                return false;
            }
            stopped = self
                .wake
                .wait_timeout(stopped, deadline - now)
                .expect("not poisoned")
                .0;
        }
        true
    }
}

/// Waits for `thread` to finish, at most `limit`: its result, or `None`
/// when it panicked or is still running (stuck in a read that never
/// returns: a wedged driver's file, a FIFO, a FUSE-served procfs). A thread
/// still running is left behind, so a stop or a reload never waits on it
/// for ever; its process ending ends it.
pub fn join_within<T>(thread: std::thread::JoinHandle<T>, limit: Duration) -> Option<T> {
    if !finished_within(&thread, limit) {
        return None;
    }
    thread.join().ok()
}

/// Whether `thread` finishes within `limit` (polled every 10 ms).
pub fn finished_within<T>(thread: &std::thread::JoinHandle<T>, limit: Duration) -> bool {
    let deadline = Instant::now() + limit;
    while !thread.is_finished() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    thread.is_finished()
}

/// The next wall-clock multiple of `interval_us` that a loop ticking on that
/// grid should wake for, given the grid point it last woke for (`last_us`;
/// `i64::MIN` at first): (its time in µs, the instant it falls on).
///
/// Every collector ticks on whole multiples of its interval of wall-clock
/// time, so rows of different tables share timestamps (on every node with a
/// synchronised clock) and the updates of one second land together and cost
/// one render of `/metrics`. The grid is read from the wall clock at every
/// tick rather than stepped on the monotonic clock, so a tick that overran
/// its interval, a stepped clock or a resumed VM lands back on it.
pub fn next_grid(interval_us: i64, last_us: i64) -> (i64, Instant) {
    let now = now_us();
    let next = grid_after(interval_us, last_us, now);
    (
        next,
        Instant::now() + Duration::from_micros((next - now) as u64),
    )
}

/// The grid point to wake for at `now_us`: the first multiple of `interval_us`
/// after now and after `last_us`. A wake-up a hair early must not tick one
/// grid point twice; a clock stepped back by a whole interval or more starts
/// the grid afresh from now instead of waiting until it passes `last_us`.
fn grid_after(interval_us: i64, last_us: i64, now_us: i64) -> i64 {
    let from = if last_us.saturating_sub(now_us) < interval_us {
        now_us.max(last_us)
    } else {
        now_us
    };
    (from.div_euclid(interval_us) + 1) * interval_us
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECOND_US: i64 = 1_000_000;

    #[test]
    fn the_first_grid_point_is_the_next_multiple_of_the_interval() {
        assert_eq!(
            grid_after(SECOND_US, i64::MIN, 10 * SECOND_US + 3),
            11 * SECOND_US
        );
        assert_eq!(
            grid_after(SECOND_US, i64::MIN, 11 * SECOND_US),
            12 * SECOND_US
        );
        assert_eq!(
            grid_after(15 * SECOND_US, i64::MIN, 16 * SECOND_US),
            30 * SECOND_US
        );
    }

    #[test]
    fn a_wake_up_a_hair_early_does_not_tick_its_grid_point_twice() {
        let woke_for = 11 * SECOND_US;
        assert_eq!(
            grid_after(SECOND_US, woke_for, woke_for - 100),
            12 * SECOND_US
        );
    }

    #[test]
    fn an_overrun_skips_the_points_it_missed_and_stays_on_the_grid() {
        let woke_for = 11 * SECOND_US;
        let done = woke_for + 2 * SECOND_US + 700_000;
        assert_eq!(grid_after(SECOND_US, woke_for, done), 14 * SECOND_US);
    }

    #[test]
    fn a_stepped_clock_lands_back_on_the_grid() {
        let woke_for = 3611 * SECOND_US;
        // Back by an hour: the next whole second from now, not in an hour.
        let stepped_back = woke_for - 3600 * SECOND_US + 200_000;
        assert_eq!(
            grid_after(SECOND_US, woke_for, stepped_back),
            12 * SECOND_US
        );
        // Back by less than an interval: the point after the one just ticked.
        assert_eq!(
            grid_after(SECOND_US, woke_for, woke_for - 300_000),
            3612 * SECOND_US
        );
        // Forward by an hour: the next whole second from now.
        let stepped_on = woke_for + 3600 * SECOND_US + 5;
        assert_eq!(
            grid_after(SECOND_US, woke_for, stepped_on),
            7212 * SECOND_US
        );
    }
}
