//! `vtax run`: sample this node on an interval and keep every sample in the store.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use vtax_store::{Store, StoreOptions};

use crate::collectors;
use crate::timespec::now_us;

/// Default interval between samples.
pub const DEFAULT_INTERVAL_SECS: u64 = 1;
/// How often the store's periodic work (fsync, publishing) runs.
const STORE_TICK: Duration = Duration::from_millis(100);
/// How often finished hours and days are merged and retention applied.
const COMPACT_INTERVAL: Duration = Duration::from_secs(300);

/// Arguments of `vtax run`.
#[derive(clap::Args)]
pub struct RunArgs {
    /// Data directory of the store (default: /var/lib/vtax when it exists, else ./vtax-data).
    #[arg(long, env = "VTAX_DATA_DIR")]
    data_dir: Option<PathBuf>,
    /// procfs mount point.
    #[arg(long = "path.procfs", default_value = "/proc")]
    procfs: PathBuf,
    /// Seconds between samples.
    #[arg(long, default_value_t = DEFAULT_INTERVAL_SECS)]
    interval_secs: u64,
    /// Stop after this many seconds (demos and tests); run until SIGTERM otherwise.
    #[arg(long)]
    duration_secs: Option<u64>,
}

/// Runs the agent until SIGTERM or SIGINT, then publishes what it holds.
pub fn run(args: RunArgs) -> Result<()> {
    let data_dir = args.data_dir.unwrap_or_else(crate::default_data_dir);
    let stop = Arc::new(AtomicBool::new(false));
    for signal in [signal_hook::consts::SIGTERM, signal_hook::consts::SIGINT] {
        signal_hook::flag::register(signal, stop.clone()).context("install signal handler")?;
    }
    let mut store = Store::open(StoreOptions::new(&data_dir), crate::catalog())
        .with_context(|| format!("open store {}", data_dir.display()))?;
    tracing::info!(data_dir = %data_dir.display(), interval_secs = args.interval_secs, "Agent started.");
    let interval = Duration::from_secs(args.interval_secs.max(1));
    let started = Instant::now();
    let mut next_sample = Instant::now();
    let mut cpu_failing = false;
    let mut last_compaction = Instant::now();
    while !stop.load(Ordering::Relaxed) {
        if args
            .duration_secs
            .is_some_and(|d| started.elapsed() >= Duration::from_secs(d))
        {
            break;
        }
        if Instant::now() >= next_sample {
            next_sample += interval;
            match collectors::cpu::collect(&args.procfs, now_us()) {
                Ok(batch) => {
                    cpu_failing = false;
                    if let Err(e) = store.append(&batch) {
                        tracing::error!(error = %e, "Dropped a sample: the store refused it.");
                    }
                }
                Err(e) if !cpu_failing => {
                    cpu_failing = true;
                    tracing::warn!(collector = "cpu", error = %e, "Collector failed; retrying every interval.");
                }
                Err(_) => {}
            }
        }
        if let Err(e) = store.tick(now_us()) {
            tracing::error!(error = %e, "Store maintenance failed; rows stay buffered and are retried.");
        }
        if last_compaction.elapsed() >= COMPACT_INTERVAL {
            last_compaction = Instant::now();
            let result = store
                .compact(now_us())
                .and_then(|_| store.apply_retention(now_us()));
            if let Err(e) = result {
                tracing::warn!(error = %e, "Compaction or retention failed; the inputs stay as they were.");
            }
        }
        std::thread::sleep(STORE_TICK.min(next_sample.saturating_duration_since(Instant::now())));
    }
    tracing::info!("Stopping: publishing buffered rows.");
    store.close().context("publish buffered rows on shutdown")?;
    Ok(())
}

/// Arguments of `vtax compact`.
#[derive(clap::Args)]
pub struct CompactArgs {
    /// Data directory of the store.
    #[arg(long, env = "VTAX_DATA_DIR")]
    data_dir: Option<PathBuf>,
    /// Delete days older than this (e.g. `30d`).
    #[arg(long = "retention.max-age", value_parser = humantime::parse_duration)]
    max_age: Option<Duration>,
    /// Delete the oldest files while the tables hold more bytes than this.
    #[arg(long = "retention.max-bytes")]
    max_bytes: Option<u64>,
    /// Treat every day before this time as finished (default: now). Lets an
    /// import of today's data be compacted at once.
    #[arg(long)]
    now: Option<String>,
}

/// Runs `vtax compact`.
pub fn compact(args: CompactArgs) -> Result<()> {
    let data_dir = args.data_dir.unwrap_or_else(crate::default_data_dir);
    let mut options = StoreOptions::new(&data_dir);
    options.retention_max_age = args.max_age;
    options.retention_max_bytes = args.max_bytes;
    let now = match &args.now {
        Some(t) => crate::timespec::parse_time(t, now_us())?,
        None => now_us(),
    };
    let mut store = Store::open(options, crate::catalog())
        .with_context(|| format!("open store {}", data_dir.display()))?;
    let compacted = store.compact(now)?;
    let removed = store.apply_retention(now)?;
    store.close()?;
    eprintln!("Compacted {compacted} day(s); retention removed {removed} file(s).");
    Ok(())
}
