//! The agent's runtime: one thread per enabled collector on its own interval,
//! the store on the main thread, a renderer keeping `/metrics` ready, and the
//! HTTP server. Collectors hand rows to the store over a channel and to the
//! exposition directly; a collector that fails loses only its own tick.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use vtax_exporters::Exposition;
use vtax_store::{Batch, BatchBuilder, TableDef};

use crate::collectors::{
    runtime_tables, Availability, Collector, CollectorsConfig, LatestRow, ParseError, Roots,
    ABSENT_REPROBE_SECS, FAILED_REPROBE_FIRST_SECS, FAILED_REPROBE_MAX_SECS, NAMES,
};
use crate::ticks::{finished_within, next_grid, Stopper};
use crate::timespec::now_us;

/// Rows on their way from a collector to the store.
pub use vtax_store::hub::{RowSender, Rows};

/// One collector's thread, which hands the collector back when it stops.
struct Running {
    name: &'static str,
    stopper: Arc<Stopper>,
    thread: JoinHandle<Box<dyn Collector>>,
    watch: Arc<Watch>,
    interval: Duration,
    /// When it was last reported stuck ([`CollectorSet::check_stuck`]), while it is.
    stuck_reported: Option<Instant>,
}

impl Running {
    /// Stops the thread and waits for it, at most [`STOP_WAIT`]; the
    /// collector, unless it panicked or is stuck in a read (it is then left
    /// behind, and what that read returns is dropped).
    fn stop(self) -> Option<Box<dyn Collector>> {
        self.stopper.stop();
        if !finished_within(&self.thread, STOP_WAIT) {
            self.watch.abandoned.store(true, Ordering::SeqCst);
            tracing::error!(
                collector = self.name,
                wait_secs = STOP_WAIT.as_secs(),
                "Collector stuck in a read did not stop; left behind (a read of a source that never returns: a driver, a FIFO)."
            );
            return None;
        }
        self.thread.join().ok()
    }
}

/// How long a stop waits for a collector's thread: a read that never
/// returns (a sysfs file of a wedged driver, NVML's init on a GPU that
/// fell off the bus) must not keep the agent from stopping, publishing its
/// rows, or reloading.
const STOP_WAIT: Duration = Duration::from_secs(5);

/// A collector in one call (probe or tick) for this long, and at least
/// [`STUCK_INTERVALS`] of its intervals, is stuck: a tick that overruns is
/// slow, one that does not return is not a reading.
const STUCK_AFTER: Duration = Duration::from_secs(10);
const STUCK_INTERVALS: u32 = 3;

/// What the agent sees of a collector's thread from outside.
struct Watch {
    /// When the probe or tick it is in began; `None` between them.
    busy_since: Mutex<Option<Instant>>,
    /// Left behind by a stop that could not wait for it: what its call
    /// returns is dropped, since another collector may have taken its place.
    abandoned: AtomicBool,
    /// A call this long is stuck: [`STUCK_AFTER`], and at least
    /// [`STUCK_INTERVALS`] of its intervals.
    stuck_after: Duration,
}

impl Watch {
    fn new(interval: Duration) -> Watch {
        Watch {
            busy_since: Mutex::new(None),
            abandoned: AtomicBool::new(false),
            stuck_after: STUCK_AFTER.max(interval * STUCK_INTERVALS),
        }
    }

    /// Runs one probe or tick, marked busy meanwhile; `None` when the
    /// thread was left behind during it.
    fn call<T>(&self, f: impl FnOnce() -> T) -> Option<T> {
        *self.busy_since.lock().expect("not poisoned") = Some(Instant::now());
        let out = f();
        // Cleared before anything is published: `check_stuck` takes a
        // collector's series off `/metrics` while holding this lock, so
        // fresh values are never taken off after the call returned.
        *self.busy_since.lock().expect("not poisoned") = None;
        (!self.abandoned.load(Ordering::SeqCst)).then_some(out)
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
        // Stopped, and left behind stuck in a read: no collector to take
        // over from, but series on /metrics all the same.
        let mut left_behind = Vec::new();
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
            } else {
                match running.stop() {
                    Some(previous) => replaced.push(previous),
                    None => left_behind.push(name),
                }
            }
        }
        self.running = kept.iter().map(|r| r.name).collect();
        self.collectors = kept;
        let was_running: Vec<&'static str> = replaced
            .iter()
            .map(|c| c.name())
            .chain(left_behind)
            .collect();
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
            let interval = Duration::from_secs_f64(common.interval_secs());
            let stopper = Arc::new(Stopper::default());
            let watch = Arc::new(Watch::new(interval));
            // Probed on its own thread: a probe that never returns (NVML's
            // init on a wedged GPU) holds up only its own collector.
            let thread = spawn_collector(
                collector,
                None,
                first_tick,
                interval,
                stopper.clone(),
                watch.clone(),
                exposition.clone(),
                rows.clone(),
            );
            self.collectors.push(Running {
                name,
                stopper,
                thread,
                watch,
                interval,
                stuck_reported: None,
            });
            self.running.push(name);
        }
    }

    /// Stops every collector thread and waits for them, each at most
    /// [`STOP_WAIT`] from now; their series leave `/metrics`.
    pub fn stop(self, exposition: &Exposition) {
        for running in &self.collectors {
            running.stopper.stop();
        }
        for running in self.collectors {
            let name = running.name;
            let _ = running.stop();
            remove_series(exposition, name);
        }
    }

    /// Reports each collector whose probe or tick has not returned for
    /// [`STUCK_AFTER`] (and [`STUCK_INTERVALS`] of its intervals): its
    /// series leave `/metrics` (the values there are from before the read,
    /// not of now; remote write ends them), and a status row with
    /// `success` 0 says it is failing, again every interval while it is.
    /// Logged once when it sticks and once when it returns. Call it often
    /// (the main loop does, every store tick).
    pub fn check_stuck(&mut self, exposition: &Exposition, rows: &RowSender) {
        for running in &mut self.collectors {
            let name = running.name;
            let busy_since = running.watch.busy_since.lock().expect("not poisoned");
            match *busy_since {
                Some(since) if since.elapsed() >= running.watch.stuck_after => {
                    let due = running
                        .stuck_reported
                        .is_none_or(|at| at.elapsed() >= running.interval);
                    if !due {
                        continue;
                    }
                    if running.stuck_reported.is_none() {
                        tracing::error!(
                            collector = name,
                            stuck_secs = since.elapsed().as_secs(),
                            "Collector stuck: a read has not returned (a driver or a file that blocks); its series are off /metrics and it reports failing until it returns."
                        );
                        exposition.remove(name);
                        end_series(rows, name);
                    }
                    let status = status_row(name, now_us(), since.elapsed(), false, 0, 0);
                    publish_status(exposition, rows, name, status);
                    running.stuck_reported = Some(Instant::now());
                }
                None if running.stuck_reported.is_some() => {
                    tracing::info!(collector = name, "Collector's stuck read returned.");
                    running.stuck_reported = None;
                }
                _ => {}
            }
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
/// `probed` is what its probe said, `None` to probe it first on the thread:
/// a collector whose source was not there waits for it first.
#[allow(clippy::too_many_arguments)]
fn spawn_collector(
    collector: Box<dyn Collector>,
    probed: Option<Availability>,
    first_tick: (i64, Instant),
    interval: Duration,
    stopper: Arc<Stopper>,
    watch: Arc<Watch>,
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
                &watch,
                &exposition,
                &rows,
            )
        })
        .expect("spawn a collector thread")
}

/// A collector's first probe, logged; a source that reads badly is failing
/// on `/metrics` at once.
fn first_probe(
    collector: &mut dyn Collector,
    watch: &Watch,
    exposition: &Exposition,
    rows: &RowSender,
) -> Option<Availability> {
    let name = collector.name();
    let time_us = now_us();
    let started = Instant::now();
    let probed = watch.call(|| probe(collector))?;
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
                status_row(name, time_us, started.elapsed(), false, 0, 0),
            );
        }
    }
    Some(probed)
}

/// Probes `collector`; a panic is a probe that failed.
fn probe(collector: &mut dyn Collector) -> Availability {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| collector.probe()))
        .unwrap_or_else(|_| Availability::Failed("the collector panicked while probing".into()))
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
    watch: &Watch,
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
        let Some(now) = watch.call(|| probe(collector)) else {
            return true;
        };
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
                let status = status_row(name, time_us, started.elapsed(), false, 0, 0);
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
#[allow(clippy::too_many_arguments)]
fn collector_loop(
    mut collector: Box<dyn Collector>,
    probed: Option<Availability>,
    first_tick: (i64, Instant),
    interval: Duration,
    stopper: &Stopper,
    watch: &Watch,
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
    let probed = match probed {
        Some(probed) => probed,
        None => match first_probe(collector.as_mut(), watch, exposition, rows) {
            Some(probed) => probed,
            None => return collector,
        },
    };
    if !matches!(probed, Availability::Available(_)) {
        if wait_for_source(collector.as_mut(), probed, stopper, watch, exposition, rows) {
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
        let tick = watch.call(|| {
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| collector.collect(time_us)))
                .unwrap_or_else(|_| Err(anyhow::anyhow!("the collector panicked")))
        });
        let Some(result) = tick else {
            return collector;
        };
        let duration = started.elapsed();
        if duration >= watch.stuck_after {
            // Its rows hold values read at its end under its start's time
            // (a rate into them as wrong as the read was long), and its status row
            // would come before the failing ones sent meanwhile: the next
            // tick reads afresh.
            tracing::warn!(
                collector = name,
                seconds = duration.as_secs_f64(),
                "A stuck tick returned; its rows are dropped, the next tick reads afresh."
            );
            let (next_grid_us, next) = next_grid(interval_us, grid_us);
            grid_us = next_grid_us;
            if stopper.sleep_until(ahead(next)) {
                return collector;
            }
            continue;
        }
        let (mut failed_sources, mut left_out) = (0, 0);
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
                left_out = collector.left_out();
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
        let status = status_row(name, time_us, duration, success, failed_sources, left_out);
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
    left_out: u64,
) -> Batch {
    let mut builder = BatchBuilder::new(&runtime_tables::COLLECTOR);
    let row = runtime_tables::CollectorRow {
        collector: name,
        duration_seconds: duration.as_secs_f64(),
        success: i64::from(success),
        failed_sources: failed_sources as u64,
        left_out,
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
            Some(Availability::Available(String::new())),
            next_grid(200_000, i64::MIN),
            Duration::from_millis(200),
            stopper.clone(),
            Arc::new(Watch::new(Duration::from_millis(200))),
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
            Some(probed),
            next_grid(1_000_000, i64::MIN),
            Duration::from_millis(100),
            stopper.clone(),
            Arc::new(Watch::new(Duration::from_millis(200))),
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

    /// Its second tick blocks until `release` is sent (a read of a wedged
    /// driver's file, a FIFO), then returns a row.
    struct Blocking {
        ticks: usize,
        release: std::sync::mpsc::Receiver<()>,
    }

    impl Collector for Blocking {
        fn name(&self) -> &'static str {
            "blocking"
        }
        fn probe(&mut self) -> Availability {
            Availability::Available(String::new())
        }
        fn collect(&mut self, time_us: i64) -> anyhow::Result<Vec<Batch>> {
            self.ticks += 1;
            if self.ticks == 2 {
                let _ = self.release.recv();
            }
            Ok(vec![status_row(
                "blocking-data",
                time_us,
                Duration::ZERO,
                true,
                0,
                0,
            )])
        }
    }

    /// Waits (20 s at most) until the watched collector has been in one
    /// call for `at_least`.
    fn wait_blocked(watch: &Watch, at_least: Duration) {
        let deadline = Instant::now() + Duration::from_secs(20);
        while watch
            .busy_since
            .lock()
            .unwrap()
            .is_none_or(|s| s.elapsed() < at_least)
        {
            assert!(Instant::now() < deadline, "never blocked");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// A tick that never returns: the collector's values leave `/metrics`
    /// (they are of before the read), it reports failing, a stop does not
    /// wait for it for ever, and what the read returns once it does is
    /// dropped.
    #[test]
    fn a_collector_stuck_in_a_read_is_reported_and_left_behind_at_stop() {
        let (release, blocked) = std::sync::mpsc::channel();
        let exposition = Exposition::new(&[&runtime_tables::COLLECTOR]);
        let renderer = {
            let exposition = exposition.clone();
            std::thread::spawn(move || exposition.run_renderer(Duration::from_millis(1)))
        };
        let stopper = Arc::new(Stopper::default());
        let watch = Arc::new(Watch {
            stuck_after: Duration::from_millis(500),
            ..Watch::new(Duration::from_millis(100))
        });
        let (rows, received) = vtax_store::hub::channel(64);
        let interval = Duration::from_millis(100);
        let thread = spawn_collector(
            Box::new(Blocking {
                ticks: 0,
                release: blocked,
            }),
            None,
            next_grid(100_000, i64::MIN),
            interval,
            stopper.clone(),
            watch.clone(),
            exposition.clone(),
            rows.clone(),
        );
        let mut set = CollectorSet {
            collectors: vec![Running {
                name: "blocking",
                stopper,
                thread,
                watch: watch.clone(),
                interval,
                stuck_reported: None,
            }],
            running: vec!["blocking"],
        };
        // Whether /metrics shows it succeeding, and failing, within 10 s.
        let shows = |succeeding: bool, failing: bool| {
            let deadline = Instant::now() + Duration::from_secs(10);
            loop {
                let body = exposition.body(vtax_exporters::Format::Text, false);
                let text = String::from_utf8_lossy(&body);
                let now = (
                    text.contains("vtax_collector_success{collector=\"blocking\"} 1"),
                    text.contains("vtax_collector_success{collector=\"blocking\"} 0"),
                );
                if now == (succeeding, failing) || Instant::now() >= deadline {
                    return now == (succeeding, failing);
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        };
        assert!(shows(true, false), "never showed its first tick");
        // Blocked in its second tick: still shown as it was, until stuck.
        wait_blocked(&watch, Duration::from_millis(600));
        set.check_stuck(&exposition, &rows);
        assert!(shows(false, true), "stale values taken off, failing");
        let failing = received
            .try_iter()
            .flat_map(|sent| sent.rows)
            .filter(|b| b.table.name == "collector")
            .any(|b| matches!(&b.fields[1].values, vtax_store::batch::Values::I64(v) if v[0] == 0));
        assert!(failing, "a status row with success 0 for the store");

        let stopping = Instant::now();
        set.stop(&exposition);
        let waited = stopping.elapsed();
        assert!(
            waited >= STOP_WAIT && waited < STOP_WAIT + Duration::from_secs(5),
            "{waited:?}"
        );
        assert!(watch.abandoned.load(Ordering::SeqCst));
        // The read returns after all: its row is dropped, not shown.
        release.send(()).unwrap();
        std::thread::sleep(Duration::from_millis(300));
        assert!(shows(false, false));
        assert!(
            received.try_iter().all(|sent| sent.rows.is_empty()),
            "nothing sent after it was left behind"
        );
        exposition.close();
        renderer.join().unwrap();
    }

    /// A tick that was stuck and then returns: its rows, read at its end and
    /// stamped with its start, are dropped, and the next tick reads afresh.
    #[test]
    fn a_stuck_tick_that_returns_is_dropped() {
        let (release, blocked) = std::sync::mpsc::channel();
        let stopper = Arc::new(Stopper::default());
        let watch = Arc::new(Watch {
            stuck_after: Duration::from_millis(400),
            ..Watch::new(Duration::from_millis(100))
        });
        let (rows, received) = vtax_store::hub::channel(256);
        let thread = spawn_collector(
            Box::new(Blocking {
                ticks: 0,
                release: blocked,
            }),
            None,
            next_grid(100_000, i64::MIN),
            Duration::from_millis(100),
            stopper.clone(),
            watch.clone(),
            Exposition::new(&[&runtime_tables::COLLECTOR]),
            rows,
        );
        wait_blocked(&watch, Duration::from_millis(600));
        release.send(()).unwrap();
        std::thread::sleep(Duration::from_millis(600));
        stopper.stop();
        thread.join().unwrap();
        let data_times: Vec<i64> = received
            .try_iter()
            .flat_map(|sent| sent.rows)
            .filter(|b| b.tags[0].dict.iter().any(|c| c == "blocking-data"))
            .map(|b| b.time_us[0])
            .collect();
        assert!(data_times.len() >= 3, "{data_times:?}");
        // The first tick's, then none until the ticks after the stuck one.
        assert!(
            data_times[1] - data_times[0] >= 500_000,
            "the stuck tick's rows were sent: {data_times:?}"
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
            Some(Availability::Available(String::new())),
            first_tick,
            Duration::from_millis(200),
            stopper.clone(),
            Arc::new(Watch::new(Duration::from_millis(200))),
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
