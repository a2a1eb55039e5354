//! The agent's runtime: one thread per enabled collector on its own interval,
//! the store on the main thread, a renderer keeping `/metrics` ready, and the
//! HTTP server. Collectors hand rows to the store over a channel and to the
//! exposition directly; a collector that fails loses only its own tick.

use std::sync::mpsc::Sender;
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use vtax_exporters::Exposition;
use vtax_store::{Batch, BatchBuilder, Value};

use crate::collectors::{runtime_tables, Availability, Collector, CollectorsConfig, Roots, NAMES};
use crate::timespec::now_us;

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

/// Rows on their way from a collector to the store.
pub type Rows = Vec<Arc<Batch>>;

/// One collector's thread, which hands the collector back when it stops.
struct Running {
    name: &'static str,
    stopper: Arc<Stopper>,
    thread: JoinHandle<Box<dyn Collector>>,
}

impl Running {
    /// Stops the thread and waits for it; the collector, unless it panicked.
    fn stop(self) -> Option<Box<dyn Collector>> {
        self.stopper.stop();
        self.thread.join().ok()
    }
}

/// The running collectors of one configuration.
pub struct CollectorSet {
    collectors: Vec<Running>,
    /// Names of the collectors running.
    pub running: Vec<&'static str>,
}

impl CollectorSet {
    /// Probes every enabled collector and starts a thread for each one whose
    /// source exists; the others are logged once, with the reason.
    pub fn start(
        config: &CollectorsConfig,
        roots: &Roots,
        exposition: &Arc<Exposition>,
        rows: &Sender<Rows>,
    ) -> CollectorSet {
        let mut set = CollectorSet {
            collectors: Vec::new(),
            running: Vec::new(),
        };
        set.start_missing(config, roots, exposition, rows, Vec::new());
        set
    }

    /// Applies a reloaded configuration. A collector whose settings (and the
    /// root paths) did not change keeps running untouched: its thread, its
    /// open files, the counts it keeps and its series on `/metrics`. One
    /// whose settings changed is stopped and built anew, taking over from
    /// the old one (`Collector::take_over`); its series stay on `/metrics`
    /// until its first tick replaces them, so a scrape in between sees no
    /// gap. Only a collector now disabled, or whose source is gone, leaves.
    pub fn reload(
        mut self,
        old: (&CollectorsConfig, &Roots),
        new: (&CollectorsConfig, &Roots),
        exposition: &Arc<Exposition>,
        rows: &Sender<Rows>,
    ) -> CollectorSet {
        let (old_config, old_roots) = old;
        let (config, roots) = new;
        let mut replaced = Vec::new();
        let mut kept = Vec::new();
        for running in std::mem::take(&mut self.collectors) {
            let name = running.name;
            let unchanged = old_roots == roots
                && config.same_settings(old_config, name)
                && config.common(name).is_some_and(|c| c.enabled());
            if unchanged {
                tracing::debug!(
                    collector = name,
                    "Collector unchanged by the reload: it keeps running."
                );
                kept.push(running);
            } else if let Some(previous) = running.stop() {
                replaced.push(previous);
            }
        }
        self.running = kept.iter().map(|r| r.name).collect();
        self.collectors = kept;
        let was_running: Vec<&'static str> = replaced.iter().map(|c| c.name()).collect();
        self.start_missing(config, roots, exposition, rows, replaced);
        for name in was_running {
            if !self.running.contains(&name) {
                remove_series(exposition, name);
            }
        }
        self
    }

    /// Starts every enabled collector not running yet; each takes over from
    /// its entry in `previous`, if any.
    fn start_missing(
        &mut self,
        config: &CollectorsConfig,
        roots: &Roots,
        exposition: &Arc<Exposition>,
        rows: &Sender<Rows>,
        mut previous: Vec<Box<dyn Collector>>,
    ) {
        // Every collector's first tick is on the next whole second, whatever
        // its interval, so each starts with data at once and on one render.
        let first_tick = next_grid(1_000_000, i64::MIN);
        for &name in NAMES {
            if self.running.contains(&name) {
                continue;
            }
            let common = config.common(name).expect("every name has settings");
            if !common.enabled() {
                tracing::info!(collector = name, "Collector disabled by configuration.");
                continue;
            }
            let mut collector = config.build(name, roots).expect("every name builds");
            if let Some(at) = previous.iter().position(|p| p.name() == name) {
                collector.take_over(previous.swap_remove(at));
            }
            match collector.probe() {
                Availability::Absent(reason) => {
                    tracing::info!(collector = name, %reason, "Collector disabled: its source is absent.");
                    continue;
                }
                Availability::Available(found) => {
                    tracing::info!(collector = name, %found, "Collector enabled.");
                }
            }
            let interval = Duration::from_secs_f64(common.interval_secs());
            let stopper = Arc::new(Stopper::default());
            let thread = spawn_collector(
                collector,
                first_tick,
                interval,
                stopper.clone(),
                exposition.clone(),
                rows.clone(),
            );
            self.collectors.push(Running {
                name,
                stopper,
                thread,
            });
            self.running.push(name);
        }
    }

    /// Stops every collector thread and waits for them; their series leave `/metrics`.
    pub fn stop(self, exposition: &Exposition) {
        for running in &self.collectors {
            running.stopper.stop();
        }
        for running in self.collectors {
            let name = running.name;
            let _ = running.thread.join();
            remove_series(exposition, name);
        }
    }
}

/// Takes a collector's series, and its status row, off `/metrics`.
fn remove_series(exposition: &Exposition, name: &str) {
    exposition.remove(name);
    exposition.remove(&status_source(name));
}

fn status_source(name: &str) -> String {
    format!("collector/{name}")
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
pub(crate) fn next_grid(interval_us: i64, last_us: i64) -> (i64, Instant) {
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

/// Runs `collector` on its own thread, named after it, until `stopper` stops.
fn spawn_collector(
    collector: Box<dyn Collector>,
    first_tick: (i64, Instant),
    interval: Duration,
    stopper: Arc<Stopper>,
    exposition: Arc<Exposition>,
    rows: Sender<Rows>,
) -> JoinHandle<Box<dyn Collector>> {
    std::thread::Builder::new()
        .name(format!("collector-{}", collector.name()))
        .spawn(move || {
            collector_loop(
                collector,
                first_tick,
                interval,
                &stopper,
                &exposition,
                &rows,
            )
        })
        .expect("spawn a collector thread")
}

/// Ticks `collector` until `stopper` stops; hands it back.
fn collector_loop(
    mut collector: Box<dyn Collector>,
    first_tick: (i64, Instant),
    interval: Duration,
    stopper: &Stopper,
    exposition: &Exposition,
    rows: &Sender<Rows>,
) -> Box<dyn Collector> {
    let name = collector.name();
    let mut failing = false;
    let interval_us = (interval.as_micros() as i64).max(1);
    let (mut grid_us, first) = first_tick;
    if stopper.sleep_until(first) {
        return collector;
    }
    loop {
        let time_us = now_us();
        let started = Instant::now();
        // A collector must not panic on what it reads; if one does anyway, the
        // agent keeps running and reports the tick as failed.
        let result =
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| collector.collect(time_us)))
                .unwrap_or_else(|_| Err(anyhow::anyhow!("the collector panicked")));
        let duration = started.elapsed();
        let success = match result {
            Ok(batches) => {
                if failing {
                    tracing::info!(collector = name, "Collector recovered.");
                    failing = false;
                }
                let batches: Rows = batches
                    .into_iter()
                    .filter(|b| !b.is_empty())
                    .map(Arc::new)
                    .collect();
                // Between two windows a windowed collector's last rows stay.
                let exposed = collector.exposed();
                if exposed.is_some() || !(batches.is_empty() && collector.windowed()) {
                    exposition.update(name, exposed.unwrap_or_else(|| batches.clone()));
                    let _ = rows.send(batches);
                }
                true
            }
            Err(e) => {
                if !failing {
                    tracing::warn!(collector = name, error = %format!("{e:#}"), "Collector failed; it is retried every interval, the rest of the agent carries on.");
                    failing = true;
                } else {
                    tracing::debug!(collector = name, error = %format!("{e:#}"), "Collector still failing.");
                }
                exposition.remove(name);
                false
            }
        };
        let status = Arc::new(status_row(name, time_us, duration, success));
        exposition.update(&status_source(name), vec![status.clone()]);
        let _ = rows.send(vec![status]);

        // A tick that overran its interval (a slow source) skips the grid
        // points it missed rather than firing them back to back.
        let next;
        (grid_us, next) = next_grid(interval_us, grid_us);
        if stopper.sleep_until(next) {
            return collector;
        }
    }
}

fn status_row(name: &str, time_us: i64, duration: Duration, success: bool) -> Batch {
    let mut builder = BatchBuilder::new(&runtime_tables::COLLECTOR);
    builder
        .push(
            time_us,
            &[name],
            &[
                Value::F64(duration.as_secs_f64()),
                Value::I64(i64::from(success)),
            ],
        )
        .expect("the row matches the declaration");
    builder.finish()
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

    /// A reload keeps a collector running only when nothing it is built
    /// from changed: every name is compared, and perf with the cgroup
    /// selection it shares.
    #[test]
    fn a_reload_rebuilds_only_the_collectors_whose_settings_changed() {
        let old = CollectorsConfig::default();
        assert!(NAMES.iter().all(|name| old.same_settings(&old, name)));
        let mut new = old.clone();
        new.cgroups.interval_secs = 5.0;
        let changed: Vec<&str> = NAMES
            .iter()
            .copied()
            .filter(|name| !new.same_settings(&old, name))
            .collect();
        assert_eq!(changed, ["cgroups", "perf"]);
        let mut new = old.clone();
        new.gpu.processes = false;
        assert!(!new.same_settings(&old, "gpu") && new.same_settings(&old, "perf"));
    }

    /// Ticks every 200 ms, and its second tick takes 550 ms: a loop that
    /// stepped on from where the overrun ended would tick 150 ms off the grid.
    struct Overrunning {
        ticks_us: Arc<Mutex<Vec<i64>>>,
    }

    impl Collector for Overrunning {
        fn name(&self) -> &'static str {
            "overrunning"
        }
        fn probe(&mut self) -> Availability {
            Availability::Available(String::new())
        }
        fn collect(&mut self, time_us: i64) -> anyhow::Result<Vec<Batch>> {
            let mut ticks = self.ticks_us.lock().unwrap();
            ticks.push(time_us);
            if ticks.len() == 2 {
                std::thread::sleep(Duration::from_millis(550));
            }
            Ok(Vec::new())
        }
    }

    #[test]
    fn a_collector_that_overran_its_interval_ticks_on_the_grid_again() {
        let ticks_us = Arc::new(Mutex::new(Vec::new()));
        let collector = Box::new(Overrunning {
            ticks_us: ticks_us.clone(),
        });
        let stopper = Arc::new(Stopper::default());
        let (rows, _received) = std::sync::mpsc::channel();
        let first_tick = next_grid(1_000_000, i64::MIN);
        let thread = spawn_collector(
            collector,
            first_tick,
            Duration::from_millis(200),
            stopper.clone(),
            Exposition::new(&[]),
            rows,
        );
        while ticks_us.lock().unwrap().len() < 8 {
            std::thread::sleep(Duration::from_millis(20));
        }
        stopper.stop();
        thread.join().unwrap();

        let ticks_us = ticks_us.lock().unwrap().clone();
        let interval_us = 200_000;
        // How late each tick came after its grid point: the wake-up's and the
        // scheduler's delay only, before the overrun and after it.
        let lateness_ms: Vec<i64> = ticks_us
            .iter()
            .map(|t| t.rem_euclid(interval_us) / 1000)
            .collect();
        assert!(
            lateness_ms.iter().all(|&late| late < 100),
            "ticks off the 200 ms grid, ms after a grid point: {lateness_ms:?}"
        );
        // The overrun skipped the points it missed, and fired none twice.
        let points: Vec<i64> = ticks_us.iter().map(|t| t / interval_us).collect();
        assert!(
            points.windows(2).all(|p| p[1] > p[0]),
            "grid points ticked: {points:?}"
        );
        assert!(points[2] - points[1] >= 3, "grid points ticked: {points:?}");
    }
}
