//! The agent's runtime: one thread per enabled collector on its own interval,
//! the store on the main thread, a renderer keeping `/metrics` ready, and the
//! HTTP server. Collectors hand rows to the store over a channel and to the
//! exposition directly; a collector that fails loses only its own tick.

use std::collections::HashMap;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use vtax_exporters::Exposition;
use vtax_store::{Batch, BatchBuilder, TableDef};

use crate::collectors::{
    runtime_tables, Availability, Collector, CollectorsConfig, LatestRow, ParseError, Roots,
    ABSENT_REPROBE_SECS, FAILED_REPROBE_FIRST_SECS, FAILED_REPROBE_MAX_SECS, NAMES,
};
use crate::ticks::{next_grid, Stopper};
use crate::timespec::now_us;

/// Rows on their way from a collector to the store.
pub use vtax_store::hub::{RowSender, Rows};

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

/// Each series' latest row of a table in the store, for a collector to take
/// its counts up from (`Collector::resume`).
pub type StoredRows<'a> = &'a dyn Fn(&'static TableDef) -> Vec<LatestRow>;

/// The running collectors of one configuration.
pub struct CollectorSet {
    collectors: Vec<Running>,
    /// Names of the collectors with a thread: reading their source, or
    /// waiting for it to appear or mend (probed again on their thread).
    pub running: Vec<&'static str>,
}

impl CollectorSet {
    /// Probes every enabled collector and starts a thread for each: one whose
    /// source is there reads it; one whose source is absent or reads badly
    /// is logged with the reason and probed again on its thread until it is
    /// there (`wait_for_source`), so no source is given up until a restart.
    ///
    /// A collector that counts events itself takes its counts up from
    /// `stored`: each series' latest row of a table from the store
    /// (`Collector::resume`).
    pub fn start(
        config: &CollectorsConfig,
        roots: &Roots,
        exposition: &Arc<Exposition>,
        rows: &RowSender,
        stored: StoredRows,
    ) -> CollectorSet {
        let mut set = CollectorSet {
            collectors: Vec::new(),
            running: Vec::new(),
        };
        set.start_missing(config, roots, exposition, rows, Vec::new(), stored);
        set
    }

    /// Applies a reloaded configuration. A collector whose settings (and the
    /// root paths) did not change keeps running untouched: its thread, its
    /// open files, the counts it keeps and its series on `/metrics`. One
    /// whose settings changed is stopped and built anew, taking over from
    /// the old one (`Collector::take_over`); its series stay on `/metrics`
    /// until its first tick replaces them, so a scrape in between sees no
    /// gap. Only a collector now disabled, or whose source is gone (it then
    /// waits for it), leaves. One the reload turns on takes its counts up
    /// from `stored`, as at the agent's start: an XID counted before it was
    /// turned off is not counted again from zero.
    pub fn reload(
        mut self,
        old: (&CollectorsConfig, &Roots),
        new: (&CollectorsConfig, &Roots),
        exposition: &Arc<Exposition>,
        rows: &RowSender,
        stored: StoredRows,
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
        self.start_missing(config, roots, exposition, rows, replaced, stored);
        for name in was_running {
            if !self.running.contains(&name) {
                remove_series(exposition, name);
                end_series(rows, name);
            }
        }
        self
    }

    /// Starts every enabled collector not running yet: one that replaces a
    /// collector of a reload (`previous`) takes over from it; any other
    /// resumes its counts from the store.
    fn start_missing(
        &mut self,
        config: &CollectorsConfig,
        roots: &Roots,
        exposition: &Arc<Exposition>,
        rows: &RowSender,
        mut previous: Vec<Box<dyn Collector>>,
        stored: StoredRows,
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
            } else if let Some(table) = collector.resumes_from() {
                let latest = stored(table);
                if !latest.is_empty() {
                    tracing::info!(
                        collector = name,
                        series = latest.len(),
                        "Counts taken up from the store."
                    );
                }
                collector.resume(&latest);
            }
            let time_us = now_us();
            let started = Instant::now();
            let probed = collector.probe();
            match &probed {
                Availability::Available(found) => {
                    tracing::info!(collector = name, %found, "Collector enabled.");
                }
                Availability::Absent(reason) => {
                    remove_series(exposition, name);
                    end_series(rows, name);
                    tracing::info!(
                        collector = name,
                        %reason,
                        reprobe_secs = ABSENT_REPROBE_SECS,
                        "Collector waiting: its source is absent; it is probed again every reprobe_secs."
                    );
                }
                Availability::Failed(error) => {
                    exposition.remove(name);
                    end_series(rows, name);
                    tracing::warn!(
                        collector = name,
                        %error,
                        reprobe_max_secs = FAILED_REPROBE_MAX_SECS,
                        "Collector's source reads badly; it is probed again, backing off to reprobe_max_secs, the rest of the agent carries on."
                    );
                    publish_status(
                        exposition,
                        rows,
                        name,
                        status_row(name, time_us, started.elapsed(), false, 0),
                    );
                }
            }
            let interval = Duration::from_secs_f64(common.interval_secs());
            let stopper = Arc::new(Stopper::default());
            let thread = spawn_collector(
                collector,
                probed,
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

/// Ends a collector's series for remote write as they leave `/metrics`: an
/// empty snapshot of its source (a collector disabled by a reload, or whose
/// source went at a reload). Not at a stop: the series end with the agent.
fn end_series(rows: &RowSender, name: &str) {
    let _ = rows.send_snapshot(&Arc::from(name), Vec::new());
}

fn status_source(name: &str) -> String {
    format!("collector/{name}")
}

/// Puts a collector's status row on `/metrics` and sends it to the store.
fn publish_status(exposition: &Exposition, rows: &RowSender, name: &str, status: Batch) {
    let status = Arc::new(status);
    exposition.update(&status_source(name), vec![status.clone()]);
    let _ = rows.send(vec![status]);
}

/// Runs `collector` on its own thread, named after it, until `stopper` stops;
/// `probed` is what its probe said: a collector whose source was not there
/// waits for it first.
fn spawn_collector(
    collector: Box<dyn Collector>,
    probed: Availability,
    first_tick: (i64, Instant),
    interval: Duration,
    stopper: Arc<Stopper>,
    exposition: Arc<Exposition>,
    rows: RowSender,
) -> JoinHandle<Box<dyn Collector>> {
    std::thread::Builder::new()
        .name(format!("collector-{}", collector.name()))
        .spawn(move || {
            collector_loop(
                collector,
                probed,
                first_tick,
                interval,
                &stopper,
                &exposition,
                &rows,
            )
        })
        .expect("spawn a collector thread")
}

/// How long to wait before probing again a collector whose probe said
/// `probed`, the last wait for a failed source having been `failed_wait`.
fn reprobe_wait(probed: &Availability, failed_wait: Duration) -> Duration {
    match probed {
        Availability::Available(_) => Duration::ZERO,
        Availability::Absent(_) => Duration::from_secs(ABSENT_REPROBE_SECS),
        Availability::Failed(_) => failed_wait,
    }
}

/// The wait after `wait` before probing again a source that still fails.
fn next_failed_wait(wait: Duration) -> Duration {
    (wait * 2).min(Duration::from_secs(FAILED_REPROBE_MAX_SECS))
}

/// Probes `collector`, whose source was absent or read badly (`probed`),
/// again until it is there: every [`ABSENT_REPROBE_SECS`] while absent (a
/// probe of nothing costs next to nothing), and while it fails after
/// [`FAILED_REPROBE_FIRST_SECS`], doubling to [`FAILED_REPROBE_MAX_SECS`]
/// (a source that broke at start is often mended within seconds; one that
/// stays broken costs a probe a minute). A failing source writes a status
/// row with `success` 0 at each probe, so `vtax_collector_success` says the
/// collector is failing; an absent one writes none. Returns whether stopped.
fn wait_for_source(
    collector: &mut dyn Collector,
    mut probed: Availability,
    stopper: &Stopper,
    exposition: &Exposition,
    rows: &RowSender,
) -> bool {
    let name = collector.name();
    let first = Duration::from_secs(FAILED_REPROBE_FIRST_SECS);
    let mut failed_wait = first;
    loop {
        let wait = reprobe_wait(&probed, failed_wait);
        failed_wait = match probed {
            Availability::Failed(_) => next_failed_wait(failed_wait),
            _ => first,
        };
        if stopper.sleep_until(Instant::now() + wait) {
            return true;
        }
        let time_us = now_us();
        let started = Instant::now();
        let now = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| collector.probe()))
            .unwrap_or_else(|_| {
                Availability::Failed("the collector panicked while probing".into())
            });
        match (&probed, &now) {
            (_, Availability::Available(found)) => {
                tracing::info!(collector = name, %found, "Collector enabled: its source is there and reads well.");
                return false;
            }
            (Availability::Failed(_), Availability::Absent(reason)) => {
                exposition.remove(&status_source(name));
                tracing::info!(collector = name, %reason, "Collector waiting: its source is now absent.");
            }
            (_, Availability::Failed(error)) => {
                if matches!(probed, Availability::Failed(_)) {
                    tracing::debug!(collector = name, %error, "Collector's source still reads badly.");
                } else {
                    tracing::warn!(collector = name, %error, "Collector's source appeared but reads badly; it is probed again.");
                }
                let status = status_row(name, time_us, started.elapsed(), false, 0);
                publish_status(exposition, rows, name, status);
            }
            (_, Availability::Absent(reason)) => {
                tracing::debug!(collector = name, %reason, "Collector's source still absent.");
            }
        }
        probed = now;
    }
}

/// Ticks `collector` until `stopper` stops; hands it back.
fn collector_loop(
    mut collector: Box<dyn Collector>,
    probed: Availability,
    first_tick: (i64, Instant),
    interval: Duration,
    stopper: &Stopper,
    exposition: &Exposition,
    rows: &RowSender,
) -> Box<dyn Collector> {
    let name = collector.name();
    // The source its ticks' snapshots are of, for remote write's staleness.
    let source: Arc<str> = name.into();
    let mut failing = false;
    let mut sources = SourceLog::default();
    let interval_us = (interval.as_micros() as i64).max(1);
    let (mut grid_us, mut first) = first_tick;
    if !matches!(probed, Availability::Available(_)) {
        if wait_for_source(collector.as_mut(), probed, stopper, exposition, rows) {
            return collector;
        }
        (grid_us, first) = next_grid(1_000_000, i64::MIN);
    }
    // Ahead of the grid by the collector's lead, never by a whole interval.
    let lead = collector.lead().min(interval / 2);
    let ahead = |at: Instant| at.checked_sub(lead).unwrap_or(at);
    if stopper.sleep_until(ahead(first)) {
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
        let mut failed_sources = 0;
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
                match exposed {
                    // Its sources report at their own times: a tick's rows are
                    // some of its series, and those it shows stay.
                    Some(exposed) => {
                        exposition.update(name, exposed);
                        let _ = rows.send(batches);
                    }
                    None if batches.is_empty() && collector.windowed() => {}
                    // A tick's rows are every series it has now, as /metrics
                    // shows them: one that is gone has ended.
                    None => {
                        exposition.update(name, batches.clone());
                        let _ = rows.send_snapshot(&source, batches);
                    }
                }
                let errors = collector.source_errors();
                failed_sources = errors.len();
                sources.note(name, &errors, Instant::now());
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
                if collector.exposed().is_none() {
                    // Its series are gone from /metrics, and end for remote
                    // write too, as a failed scrape ends a target's.
                    let _ = rows.send_snapshot(&source, Vec::new());
                }
                false
            }
        };
        let status = status_row(name, time_us, duration, success, failed_sources);
        publish_status(exposition, rows, name, status);

        // A tick that overran its interval (a slow source) skips the grid
        // points it missed rather than firing them back to back.
        let next;
        (grid_us, next) = next_grid(interval_us, grid_us);
        if stopper.sleep_until(ahead(next)) {
            return collector;
        }
    }
}

fn status_row(
    name: &str,
    time_us: i64,
    duration: Duration,
    success: bool,
    failed_sources: usize,
) -> Batch {
    let mut builder = BatchBuilder::new(&runtime_tables::COLLECTOR);
    let row = runtime_tables::CollectorRow {
        collector: name,
        duration_seconds: duration.as_secs_f64(),
        success: i64::from(success),
        failed_sources: failed_sources as u64,
    };
    builder
        .push_row(time_us, &row)
        .expect("a collector row is for the collector table");
    builder.finish()
}

/// The longest a source that flaps (fails, mends, fails again) goes between
/// two log lines about its failing.
const SOURCE_LOG_EVERY: Duration = Duration::from_secs(60);

/// Which of a collector's sources read badly, so that each is logged when
/// it starts failing and when it mends, not at every tick: a source that
/// flaps is logged failing at most once every [`SOURCE_LOG_EVERY`].
#[derive(Default)]
struct SourceLog {
    sources: HashMap<String, SourceState>,
}

struct SourceState {
    /// Whether it failed at the last tick.
    failing: bool,
    /// Whether its failing was logged and its mending is to be.
    announced: bool,
    /// When its failing was last logged.
    warned_at: Option<Instant>,
}

impl SourceLog {
    /// Notes the sources that failed at a tick at `now`; returns what was
    /// logged: each source, and whether it was logged failing or mended.
    fn note(
        &mut self,
        collector: &str,
        errors: &[ParseError],
        now: Instant,
    ) -> Vec<(String, bool)> {
        let mut logged = Vec::new();
        for error in errors {
            let state = self
                .sources
                .entry(error.path.clone())
                .or_insert(SourceState {
                    failing: false,
                    announced: false,
                    warned_at: None,
                });
            if state.failing {
                continue;
            }
            state.failing = true;
            if state
                .warned_at
                .is_none_or(|at| now.duration_since(at) >= SOURCE_LOG_EVERY)
            {
                tracing::warn!(collector, source = %error.path, error = %error, "Source reads badly: what did not read is left out (a line, a value or the file, as the error says where), the collector's other values are written.");
                state.warned_at = Some(now);
                state.announced = true;
                logged.push((error.path.clone(), true));
            } else {
                tracing::debug!(collector, source = %error.path, error = %error, "Source reads badly again.");
            }
        }
        for (path, state) in &mut self.sources {
            if state.failing && !errors.iter().any(|e| &e.path == path) {
                state.failing = false;
                if std::mem::take(&mut state.announced) {
                    tracing::info!(collector, source = %path, "Source reads well again.");
                    logged.push((path.clone(), false));
                }
            }
        }
        self.sources.retain(|_, s| {
            s.failing
                || s.warned_at
                    .is_some_and(|at| now.duration_since(at) < SOURCE_LOG_EVERY)
        });
        logged
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use super::*;

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

    /// Records when it ticks, and reads 100 ms ahead of the grid (half the
    /// test's interval: room for a loaded machine's late wake-ups).
    struct Leading {
        ticks_us: Arc<Mutex<Vec<i64>>>,
    }

    impl Collector for Leading {
        fn name(&self) -> &'static str {
            "leading"
        }
        fn probe(&mut self) -> Availability {
            Availability::Available(String::new())
        }
        fn collect(&mut self, time_us: i64) -> anyhow::Result<Vec<Batch>> {
            self.ticks_us.lock().unwrap().push(time_us);
            Ok(Vec::new())
        }
        fn lead(&self) -> Duration {
            Duration::from_millis(100)
        }
    }

    /// A collector with a lead ticks that far ahead of each grid point, once
    /// a point, while the others tick just after it.
    #[test]
    fn a_collector_with_a_lead_ticks_ahead_of_the_grid() {
        let ticks_us = Arc::new(Mutex::new(Vec::new()));
        let stopper = Arc::new(Stopper::default());
        let (rows, _received) = vtax_store::hub::channel(64);
        let thread = spawn_collector(
            Box::new(Leading {
                ticks_us: ticks_us.clone(),
            }),
            Availability::Available(String::new()),
            next_grid(200_000, i64::MIN),
            Duration::from_millis(200),
            stopper.clone(),
            Exposition::new(&[]),
            rows,
        );
        while ticks_us.lock().unwrap().len() < 6 {
            std::thread::sleep(Duration::from_millis(20));
        }
        stopper.stop();
        thread.join().unwrap();
        let ticks_us = ticks_us.lock().unwrap().clone();
        // Ms before the next grid point; the first tick may come at once.
        let ahead_ms: Vec<i64> = ticks_us[1..]
            .iter()
            .map(|t| (200_000 - t.rem_euclid(200_000)) / 1000)
            .collect();
        assert!(
            ahead_ms.iter().all(|&ms| (1..=100).contains(&ms)),
            "ms ahead of a grid point: {ahead_ms:?}"
        );
        let points: Vec<i64> = ticks_us[1..]
            .iter()
            .map(|t| (t + 100_000) / 200_000)
            .collect();
        assert!(
            points.windows(2).all(|p| p[1] == p[0] + 1),
            "grid points ticked: {points:?}"
        );
    }

    #[test]
    fn an_absent_source_is_probed_every_minute_a_failed_one_backing_off() {
        let absent = Availability::Absent(String::new());
        let failed = Availability::Failed(String::new());
        let mut wait = Duration::from_secs(FAILED_REPROBE_FIRST_SECS);
        let mut waits = Vec::new();
        for _ in 0..7 {
            assert_eq!(reprobe_wait(&absent, wait), Duration::from_secs(60));
            waits.push(reprobe_wait(&failed, wait).as_secs());
            wait = next_failed_wait(wait);
        }
        assert_eq!(waits, [2, 4, 8, 16, 32, 60, 60]);
    }

    /// Its source reads badly at the first `failing` probes, then well.
    struct Mending {
        probes: usize,
        failing: usize,
        ticks: Arc<Mutex<usize>>,
    }

    impl Collector for Mending {
        fn name(&self) -> &'static str {
            "mending"
        }
        fn probe(&mut self) -> Availability {
            self.probes += 1;
            if self.probes <= self.failing {
                Availability::Failed("/proc/mending:1: junk".into())
            } else {
                Availability::Available(String::new())
            }
        }
        fn collect(&mut self, _time_us: i64) -> anyhow::Result<Vec<Batch>> {
            *self.ticks.lock().unwrap() += 1;
            Ok(Vec::new())
        }
    }

    /// A collector whose source failed at start is not off for good: it is
    /// failing on `/metrics` meanwhile, is probed again on its own thread,
    /// and reads from the probe that finds its source mended.
    #[test]
    fn a_source_that_failed_at_start_is_read_once_it_mends() {
        let ticks = Arc::new(Mutex::new(0));
        let mut collector = Box::new(Mending {
            probes: 0,
            failing: 2,
            ticks: ticks.clone(),
        });
        let probed = collector.probe();
        assert!(matches!(probed, Availability::Failed(_)));
        let exposition = Exposition::new(&[&runtime_tables::COLLECTOR]);
        let stopper = Arc::new(Stopper::default());
        let (rows, received) = vtax_store::hub::channel(64);
        let thread = spawn_collector(
            collector,
            probed,
            next_grid(1_000_000, i64::MIN),
            Duration::from_millis(100),
            stopper.clone(),
            exposition.clone(),
            rows,
        );
        let deadline = Instant::now() + Duration::from_secs(20);
        while *ticks.lock().unwrap() < 3 {
            assert!(Instant::now() < deadline, "never read after it mended");
            std::thread::sleep(Duration::from_millis(20));
        }
        stopper.stop();
        thread.join().unwrap();
        let successes: Vec<i64> = received
            .try_iter()
            .flat_map(|sent| sent.rows)
            .filter(|b| b.table.name == "collector")
            .map(|b| match &b.fields[1].values {
                vtax_store::batch::Values::I64(v) => v[0],
                other => panic!("{other:?}"),
            })
            .collect();
        // The second probe (after 2 s) still failed; the third (4 s later) found it.
        assert_eq!(successes[0], 0, "{successes:?}");
        assert!(successes.ends_with(&[1, 1, 1]), "{successes:?}");
    }

    #[test]
    fn a_bad_source_is_logged_when_it_fails_and_mends_not_every_tick() {
        let bad = |path: &str| ParseError {
            path: path.into(),
            line: 1,
            reason: "junk".into(),
        };
        let mut log = SourceLog::default();
        let start = Instant::now();
        let at = |secs: u64| start + Duration::from_secs(secs);
        let failing = |p: &str| vec![(p.to_string(), true)];
        let mended = |p: &str| vec![(p.to_string(), false)];
        assert_eq!(
            log.note("host", &[bad("/proc/meminfo")], at(0)),
            failing("/proc/meminfo")
        );
        for s in 1..100 {
            assert!(log.note("host", &[bad("/proc/meminfo")], at(s)).is_empty());
        }
        assert_eq!(log.note("host", &[], at(100)), mended("/proc/meminfo"));
        assert!(log.note("host", &[], at(101)).is_empty());
        // Flapping: failing again within a minute of the last line is quiet,
        // and so is its mending; a minute on, it is logged again.
        assert_eq!(
            log.note("host", &[bad("/proc/loadavg")], at(102)),
            failing("/proc/loadavg")
        );
        assert_eq!(log.note("host", &[], at(103)), mended("/proc/loadavg"));
        for s in (104..160).step_by(2) {
            assert!(log.note("host", &[bad("/proc/loadavg")], at(s)).is_empty());
            assert!(log.note("host", &[], at(s + 1)).is_empty());
        }
        assert_eq!(
            log.note("host", &[bad("/proc/loadavg")], at(163)),
            failing("/proc/loadavg")
        );
    }

    #[test]
    fn a_collector_that_overran_its_interval_ticks_on_the_grid_again() {
        let ticks_us = Arc::new(Mutex::new(Vec::new()));
        let collector = Box::new(Overrunning {
            ticks_us: ticks_us.clone(),
        });
        let stopper = Arc::new(Stopper::default());
        let (rows, _received) = vtax_store::hub::channel(64);
        let first_tick = next_grid(1_000_000, i64::MIN);
        let thread = spawn_collector(
            collector,
            Availability::Available(String::new()),
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
