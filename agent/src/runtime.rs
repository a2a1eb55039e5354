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

/// The running collectors of one configuration.
pub struct CollectorSet {
    stopper: Arc<Stopper>,
    threads: Vec<JoinHandle<()>>,
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
        let stopper = Arc::new(Stopper::default());
        let first_tick = next_whole_second();
        let mut threads = Vec::new();
        let mut running = Vec::new();
        for &name in NAMES {
            let common = config.common(name).expect("every name has settings");
            if !common.enabled() {
                tracing::info!(collector = name, "Collector disabled by configuration.");
                continue;
            }
            let mut collector = config.build(name, roots).expect("every name builds");
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
            let (stopper, exposition, rows) = (stopper.clone(), exposition.clone(), rows.clone());
            let thread = std::thread::Builder::new()
                .name(format!("collector-{name}"))
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
                .expect("spawn a collector thread");
            threads.push(thread);
            running.push(name);
        }
        CollectorSet {
            stopper,
            threads,
            running,
        }
    }

    /// Stops every collector thread and waits for them; their series leave `/metrics`.
    pub fn stop(self, exposition: &Exposition) {
        self.stopper.stop();
        for thread in self.threads {
            let _ = thread.join();
        }
        for name in self.running {
            exposition.remove(name);
            exposition.remove(&status_source(name));
        }
    }
}

fn status_source(name: &str) -> String {
    format!("collector/{name}")
}

/// The instant of the next whole second of wall-clock time. Every collector
/// ticks on that grid: rows of different tables share timestamps near whole
/// seconds (on every node with a synchronised clock), and the updates of one
/// second land together, so `/metrics` is rendered once for all of them.
fn next_whole_second() -> Instant {
    let since_epoch = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    let into_second = Duration::from_nanos(u64::from(since_epoch.subsec_nanos()));
    Instant::now() + (Duration::from_secs(1) - into_second)
}

fn collector_loop(
    mut collector: Box<dyn Collector>,
    first_tick: Instant,
    interval: Duration,
    stopper: &Stopper,
    exposition: &Exposition,
    rows: &Sender<Rows>,
) {
    let name = collector.name();
    let mut failing = false;
    let mut next = first_tick;
    if stopper.sleep_until(next) {
        return;
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

        next += interval;
        let now = Instant::now();
        if next < now {
            // Overran its interval (a slow source): skip the missed ticks rather
            // than firing them back to back.
            next = now + interval;
        }
        if stopper.sleep_until(next) {
            return;
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
