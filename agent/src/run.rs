//! `vtax run`: sample this node with every enabled collector, keep every sample
//! in the store, and serve the latest values on `/metrics`.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use vtax_exporters::remote_write::{RemoteWriteConfig, RemoteWriters};
use vtax_exporters::Exposition;
use vtax_store::log_limit::Repeats;
use vtax_store::{Batch, Compactor, Store, StoreOptions};

use crate::args::AgentArgs;
use crate::config::Config;
use crate::config_status::{take_reload, ConfigStatus};
use crate::detect::Detector;
use crate::runtime::CollectorSet;
use crate::store_report::StoreReport;
use crate::timespec::now_us;

/// How often the main thread wakes to hand collected rows to the store and
/// run its periodic work (fsync, publishing). Rows wait in the channel until
/// then: waking for every batch cost more context switches than the appends.
const STORE_TICK: Duration = Duration::from_millis(250);
/// How long the renderer waits after a change for collectors ticking together.
const RENDER_COALESCE: Duration = Duration::from_millis(20);
/// Sends the hub holds for the main thread. Each source sends once a tick:
/// a dozen sources at 1 s (a node with every collector, and the web
/// server's stats) fill it in 32 s of a main thread held up (a publish on a
/// slow disk) before rows are dropped and counted (`dropped_batches` in the
/// `store` table), and it bounds the memory they hold meanwhile.
const HUB_CAPACITY: usize = 384;

/// Arguments of `vtax run`.
#[derive(clap::Args)]
pub struct RunArgs {
    #[command(flatten)]
    pub agent: AgentArgs,
    /// Stop after this many seconds (demos and tests); run until SIGTERM otherwise.
    #[arg(long)]
    duration_secs: Option<u64>,
}

/// Rows per Parquet data page in the files the agent writes. A merge holds a
/// decompressed page of each input for the column it copies, and the writer a
/// page of raw values: at 16k rows an f64 page is 128 KiB. From 32k, this took
/// a day merge's rise in resident memory from 8.1 to 6.3 MiB
/// (`store/examples/merge_memory.rs --page-rows`) for files 1% larger. Imports
/// keep the store's 100k rows, which compress a little better.
const AGENT_DATA_PAGE_ROWS: usize = 16 * 1024;

/// Bytes of one column a publish or merge buffers (and copies once) to choose
/// its encoding on: 32k f64 values, the same choice as 1 MiB on the merge
/// benchmark's files and 1.2 MiB less at a day merge's peak. The store's
/// default is 16 MiB.
const AGENT_ENCODING_SAMPLE_BYTES: usize = 256 << 10;

/// Rows per row group in the files the agent writes. The writer holds one
/// column of a row group's encoded pages until the column is done: at the
/// store's 1M rows, a column of noisy values is several megabytes, and the day
/// merge's resident peak rose by 14 MiB (`store/examples/merge_memory.rs`).
const AGENT_ROW_GROUP_ROWS: usize = 128 * 1024;

/// The store options `vtax run` opens its store with, from `config`.
pub fn store_options(config: &Config) -> StoreOptions {
    let mut options = StoreOptions::new(config.data_dir());
    options.node = config.node_name();
    options.write.data_page_rows = AGENT_DATA_PAGE_ROWS;
    options.write.row_group_rows = AGENT_ROW_GROUP_ROWS;
    options.write.encoding_sample_bytes = AGENT_ENCODING_SAMPLE_BYTES;
    options.sync_interval = Duration::from_secs_f64(config.store.sync_interval_secs);
    options.max_buffered_bytes = config.store.max_buffered_bytes as usize;
    options.max_publish_delay = match config.store.max_publish_delay_secs {
        0 => None,
        secs => Some(std::time::Duration::from_secs(secs)),
    };
    options.wal_max_backlog_bytes = config.store.wal_max_backlog_bytes as usize;
    options.retention_max_age = (config.store.retention_max_age_days > 0)
        .then(|| Duration::from_secs(config.store.retention_max_age_days * 86_400));
    options.retention_max_bytes =
        (config.store.retention_max_bytes > 0).then_some(config.store.retention_max_bytes);
    options.retention_deletable =
        crate::upload::retention_guard(&config.upload, &config.data_dir());
    options
}

/// Runs the agent until SIGTERM or SIGINT, then publishes what it holds.
/// SIGHUP reloads the config file; a config that does not validate is
/// refused with its error and the running one is kept.
pub fn run(args: RunArgs) -> Result<()> {
    // A reload reads the file the agent started on, even once the
    // installed one is gone (then the reload is refused).
    let started_with = args.agent.config_path();
    let mut config = args.agent.resolve()?;
    let stop = Arc::new(AtomicBool::new(false));
    let reload = Arc::new(AtomicBool::new(false));
    for signal in [signal_hook::consts::SIGTERM, signal_hook::consts::SIGINT] {
        signal_hook::flag::register(signal, stop.clone()).context("install signal handler")?;
    }
    signal_hook::flag::register(signal_hook::consts::SIGHUP, reload.clone())
        .context("install signal handler")?;

    crate::memory::tune_allocator();
    let open_files = crate::collectors::kept::raise_open_file_limit();
    tracing::debug!(open_files, "Open-file limit.");
    let data_dir = config.data_dir();
    crate::args::check_beyond_values(&config)?;
    let mut store = Store::open(store_options(&config), crate::catalog())
        .with_context(|| format!("open store {}", data_dir.display()))?;
    let exposition = Exposition::new(crate::catalog().tables());
    let renderer = {
        let exposition = exposition.clone();
        std::thread::Builder::new()
            .name("renderer".into())
            .spawn(move || exposition.run_renderer(RENDER_COALESCE))
            .context("spawn the renderer")?
    };
    let (sender, receiver) = vtax_store::hub::channel(HUB_CAPACITY);
    // `vtax_build_info`: served for as long as the agent runs, kept now and
    // every `build_info::ROW_INTERVAL` for the remote-write receivers.
    let build = Arc::new(crate::build_info::row(now_us()));
    exposition.update(BUILD_SOURCE, vec![build.clone()]);
    let _ = sender.send(vec![build]);
    let mut build_rows = crate::build_info::BuildRows::new(Instant::now());
    let mut config_status = ConfigStatus::started(now_us());
    let config_row = Arc::new(config_status.row(now_us()));
    exposition.update(CONFIG_SOURCE, vec![config_row.clone()]);
    let _ = sender.send(vec![config_row]);
    let web = crate::web::start(&config.web, exposition.clone(), sender.clone())?;
    let started_us = now_us();
    let mut collectors = CollectorSet::start(
        &config.collectors,
        &config.roots(),
        &exposition,
        &sender,
        &|table| latest_rows(&store, table, started_us),
    );
    let sync_interval = Duration::from_secs_f64(config.store.sync_interval_secs);
    let mut remote = RemoteWriters::start(
        &remote_write_configs(&config),
        &data_dir,
        sync_interval,
        &exposition,
        sender.clone(),
    )?;
    let _uploader = crate::upload::spawn(&config.upload, &config.data_dir(), &exposition, &sender)?;
    tracing::info!(
        data_dir = %data_dir.display(),
        listen_address = %web.local_addr(),
        collectors = ?collectors.running,
        "Agent started."
    );

    // systemd (Type=notify): ready once /metrics listens and the collectors
    // run; the watchdog is fed from this loop, so a wedged store or main
    // thread gets the agent restarted. Without NOTIFY_SOCKET these are no-ops.
    let _ = sd_notify::notify(&[sd_notify::NotifyState::Ready]);
    let watchdog_interval = sd_notify::watchdog_enabled().map(|timeout| timeout / 2);
    let mut last_watchdog = Instant::now();

    let mut detector = start_detector(&config, &store);

    let started = Instant::now();
    let mut compactor = Compactor::new(Duration::from_secs(config.store.compact_interval_secs));
    let mut store_report = StoreReport::new(data_dir.clone()).with_hub(sender.clone());
    let mut failures = FailureLogs::default();
    while !stop.load(Ordering::Relaxed) {
        if args
            .duration_secs
            .is_some_and(|d| started.elapsed() >= Duration::from_secs(d))
        {
            break;
        }
        if reload.swap(false, Ordering::Relaxed) {
            match args.agent.resolve_reload(started_with.as_deref()) {
                Ok(new) => {
                    let (new, restart_pending) = take_reload(&config, new);
                    if restart_pending {
                        tracing::warn!(
                            "Reloaded: [web], [store], [[remote_write]] and [upload] changes take effect at the next restart."
                        );
                    }
                    config_status.taken(now_us(), restart_pending);
                    collectors = collectors.reload(
                        (&config.collectors, &config.roots()),
                        (&new.collectors, &new.roots()),
                        &exposition,
                        &sender,
                        &|table| latest_rows(&store, table, now_us()),
                    );
                    if new.detect != config.detect {
                        exposition.remove(DETECTOR_SOURCE);
                        detector = start_detector(&new, &store);
                    }
                    tracing::info!(collectors = ?collectors.running, "Configuration reloaded.");
                    config = new;
                }
                Err(e) => {
                    tracing::error!(error = %format!("{e:#}"), "Reload refused: the running configuration stays.");
                    config_status.refused();
                }
            }
            let row = Arc::new(config_status.row(now_us()));
            exposition.update(CONFIG_SOURCE, vec![row.clone()]);
            keep(&mut store, &mut remote, &mut failures.refused, &row);
        }
        std::thread::sleep(STORE_TICK);
        collectors.check_stuck(&exposition, &sender);
        if watchdog_interval.is_some_and(|every| last_watchdog.elapsed() >= every) {
            let _ = sd_notify::notify(&[sd_notify::NotifyState::Watchdog]);
            last_watchdog = Instant::now();
        }
        for sent in receiver.try_iter() {
            if let Some(detector) = detector.as_mut() {
                detector.observe_sent(&sent);
            }
            keep_sent(&mut store, &mut remote, &mut failures.refused, &sent);
        }
        if let Some(detector) = detector.as_mut() {
            let judged = detector.tick(now_us());
            if !judged.is_empty() {
                // A window's rows are every series the detector shows: an
                // event that closed has no suspect series any more.
                let judged = vtax_store::hub::Sent {
                    rows: judged.into_iter().map(Arc::new).collect(),
                    snapshot_of: Some(DETECTOR_SOURCE.into()),
                };
                keep_sent(&mut store, &mut remote, &mut failures.refused, &judged);
                let exported = judged
                    .rows
                    .into_iter()
                    .filter(|b| b.table.exported)
                    .collect();
                exposition.update(DETECTOR_SOURCE, exported);
            }
        }
        let published = store.stats().files_published;
        if let Err(e) = store.tick(now_us()) {
            if let Some(not_logged) = failures.maintenance.occurred(&e.kind()) {
                tracing::error!(error = %e, repeats_not_logged = not_logged, backlog_bytes = store.wal_backlog_bytes(), "Store maintenance failed; rows stay buffered and are retried.");
            }
        }
        if store.stats().files_published != published {
            crate::memory::release_free_memory();
        }
        if let Some(row) = store_report.due(&store, now_us()) {
            let row = Arc::new(row);
            // Off the collectors' grid: shown with their next render.
            exposition.stage(STORE_SOURCE, vec![row.clone()]);
            keep(&mut store, &mut remote, &mut failures.refused, &row);
        }
        if let Some(row) = build_rows.due(Instant::now(), now_us()) {
            keep(&mut store, &mut remote, &mut failures.refused, &row);
            // Kept as often, for the same look-back; /metrics shows it
            // unchanged since the last reload, with no render of its own.
            let row = config_status.row(now_us());
            keep(&mut store, &mut remote, &mut failures.refused, &row);
        }
        if let Some(report) = compactor.poll(&mut store, now_us()) {
            let retained_away = report.retention.as_ref().copied().unwrap_or(0);
            // Routine merges of the running hour take milliseconds: only a
            // day's merge, a slow disk or a deletion is worth a line at info.
            if report.took >= Duration::from_secs(1) || retained_away > 0 {
                tracing::info!(
                    merges = report.merges,
                    files_retained_away = retained_away,
                    seconds = report.took.as_secs_f64(),
                    "Compaction and retention done."
                );
            } else if report.merges > 0 {
                tracing::debug!(
                    merges = report.merges,
                    seconds = report.took.as_secs_f64(),
                    "Compaction done."
                );
            }
            if let Some(e) = &report.merge_error {
                if let Some(not_logged) = failures.compaction.occurred(&e.kind()) {
                    tracing::warn!(error = %e, merges = report.merges, repeats_not_logged = not_logged, "Compaction failed; its inputs are merged at a later pass, less any the store found damaged and moved to quarantine.");
                }
            }
            if let Err(e) = &report.retention {
                if let Some(not_logged) = failures.retention.occurred(&e.kind()) {
                    tracing::warn!(error = %e, repeats_not_logged = not_logged, "Retention failed; the files it did not delete stay.");
                }
            }
            crate::memory::release_free_memory();
        }
    }
    tracing::info!(
        renders = exposition.renders(),
        uptime_secs = started.elapsed().as_secs(),
        "Stopping: publishing buffered rows."
    );
    let _ = sd_notify::notify(&[sd_notify::NotifyState::Stopping]);
    compactor.stop(&mut store);
    collectors.stop(&exposition);
    drop(sender);
    // Every collector thread has joined, so everything they sent is queued.
    for sent in receiver.try_iter() {
        keep_sent(&mut store, &mut remote, &mut failures.refused, &sent);
    }
    drop(remote); // stops the senders; what they did not send goes at the next start
    web.stop();
    exposition.close();
    let _ = renderer.join();
    // Rows still waiting for the WAL (a full disk) are in memory only.
    let backlog_bytes = store.wal_backlog_bytes();
    store.close().with_context(|| {
        if backlog_bytes > 0 {
            format!(
                "publish buffered rows on shutdown ({backlog_bytes} bytes of rows that never \
                 reached the write-ahead log are lost)"
            )
        } else {
            "publish buffered rows on shutdown (rows in the write-ahead log are published \
             at the next start)"
                .to_string()
        }
    })?;
    Ok(())
}

/// The main loop's log lines for failures of the store, each rate-limited
/// (`vtax_store::log_limit`): a full disk fails every sync and publish, every
/// merge, and every append once the WAL's backlog bound is reached.
#[derive(Default)]
struct FailureLogs {
    maintenance: Repeats,
    refused: Repeats,
    compaction: Repeats,
    retention: Repeats,
}

/// [`keep`] for each batch of `sent`; a snapshot's series that its source
/// no longer has are then ended for remote write.
fn keep_sent(
    store: &mut Store,
    remote: &mut RemoteWriters,
    refused: &mut Repeats,
    sent: &vtax_store::hub::Sent,
) {
    let Some(source) = &sent.snapshot_of else {
        for batch in &sent.rows {
            keep(store, remote, refused, batch);
        }
        return;
    };
    let mut all_stored = true;
    for batch in &sent.rows {
        if store_batch(store, refused, batch) {
            remote.append_to_snapshot(batch);
        } else {
            all_stored = false;
        }
    }
    if !all_stored {
        // Rows the store refused (a full disk's backlog) are series the
        // source still has: not a snapshot to end anything by.
        remote.abandon_snapshot();
        return;
    }
    // The snapshot's time: its rows' newest, or now for a source whose
    // series all ended (a collector that failed).
    let time_us = sent
        .rows
        .iter()
        .flat_map(|b| b.time_us.iter().copied())
        .max()
        .unwrap_or_else(now_us);
    remote.end_snapshot(source, time_us);
}

/// Appends a batch to the store and, once stored, queues it for remote write;
/// rows the store refuses are logged (the store counts them: `rows_refused`;
/// `refused` rate-limits the lines), and go nowhere else.
fn keep(store: &mut Store, remote: &mut RemoteWriters, refused: &mut Repeats, batch: &Batch) {
    if store_batch(store, refused, batch) {
        remote.append(batch);
    }
}

/// Appends a batch to the store; whether it took it.
fn store_batch(store: &mut Store, refused: &mut Repeats, batch: &Batch) -> bool {
    match store.append(batch) {
        Ok(_) => true,
        Err(e) => {
            if let Some(not_logged) = refused.occurred(&e.kind()) {
                tracing::error!(error = %e, table = batch.table.name, rows_refused = store.stats().rows_refused, repeats_not_logged = not_logged, "Dropped rows: the store refused them.");
            }
            false
        }
    }
}

/// The exposition source of the `build` table's row.
const BUILD_SOURCE: &str = "build";

/// The exposition source of the `config` table's row.
const CONFIG_SOURCE: &str = "config";

/// The exposition source of the `store` table's row.
const STORE_SOURCE: &str = "store";

/// The exposition source of the detector's rows.
const DETECTOR_SOURCE: &str = "detect";

/// Each series' latest row of `table` in the store over the last
/// `RESUME_HORIZON_SECS` before `now_us`, for a collector to take its counts
/// up from. A store that cannot be read gives none: the counts start at zero,
/// as they did before there was a store to read.
fn latest_rows(
    store: &Store,
    table: &'static vtax_store::TableDef,
    now_us: i64,
) -> Vec<crate::collectors::LatestRow> {
    let request = vtax_store::ScanRequest {
        table: table.name.to_string(),
        from_us: Some(now_us - crate::collectors::RESUME_HORIZON_SECS * 1_000_000),
        until_us: Some(now_us + 1),
        skip_damaged: true,
        ..vtax_store::ScanRequest::default()
    };
    let result = match store.scan(&request) {
        Ok(result) => result,
        Err(e) => {
            tracing::warn!(table = table.name, error = %format!("{e:#}"), "Could not read the store's latest counts; they start again at zero.");
            return Vec::new();
        }
    };
    // Batch by batch: an hour of a table (`scraped` at its sample limit)
    // flattened at once into strings would hold every row; this holds one
    // batch and a row a series.
    let mut latest: std::collections::BTreeMap<Vec<String>, crate::collectors::LatestRow> =
        Default::default();
    for batch in &result.batches {
        let rows = crate::detect::stored_rows::Rows::from_batches(std::slice::from_ref(batch));
        let tags: Vec<Vec<&str>> = table.tags.iter().map(|t| rows.tag(t.name)).collect();
        let fields: Vec<Vec<Option<f64>>> =
            table.fields.iter().map(|f| rows.field(f.name)).collect();
        for (key, i) in rows.latest_by(|i| Some(tags.iter().map(|t| t[i]).collect::<Vec<&str>>())) {
            let time_us = rows.time_us[i];
            let key: Vec<String> = key.into_iter().map(str::to_string).collect();
            if latest.get(&key).is_some_and(|kept| kept.time_us > time_us) {
                continue;
            }
            let row = crate::collectors::LatestRow {
                time_us,
                tags: key.clone(),
                fields: fields.iter().map(|f| f[i]).collect(),
            };
            latest.insert(key, row);
        }
    }
    latest.into_values().collect()
}

/// The detector, with its baselines relearned from the store; none when disabled.
fn start_detector(config: &Config, store: &Store) -> Option<Detector> {
    if !config.detect.enabled {
        tracing::info!("Detector disabled by configuration.");
        return None;
    }
    let mut detector = Detector::new(config.detect.clone());
    match crate::detect::restore::relearn(&mut detector, store, now_us()) {
        Ok(windows) => tracing::info!(
            windows,
            "Detector started; baselines relearned from the store."
        ),
        Err(e) => {
            tracing::warn!(error = %format!("{e:#}"), "Detector started without its baselines: they could not be read back.")
        }
    }
    match crate::detect::restore::resume_open_events(&mut detector, store, now_us()) {
        Ok(0) => {}
        Ok(events) => tracing::info!(
            events,
            "Resumed the noisy-neighbour events that were open when the agent stopped."
        ),
        Err(e) => {
            tracing::warn!(error = %format!("{e:#}"), "Could not read back the events open at the last stop; a lasting one opens again.")
        }
    }
    Some(detector)
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
    /// Delete the oldest files while the tables hold more bytes than this
    /// (bytes, or with a unit: `500GB`, `1TiB`).
    #[arg(long = "retention.max-bytes", value_parser = vtax_exporters::size::parse_bytes)]
    max_bytes: Option<u64>,
    /// Treat every day before this time as finished (default: now). Lets an
    /// import of today's data be compacted at once.
    #[arg(long)]
    now: Option<String>,
}

/// The remote write targets, each with the node's name as its `instance`
/// label unless `external_labels` sets one (or removes it, set empty): the
/// name the node's files and fleet copy carry, not the pod's host name that
/// changes at every rollout.
fn remote_write_configs(config: &Config) -> Vec<RemoteWriteConfig> {
    let node = config.node_name();
    let mut configs = config.remote_write.clone();
    for remote in &mut configs {
        remote
            .external_labels
            .entry("instance".into())
            .or_insert_with(|| node.clone());
    }
    configs
}

/// Options for a command that opens the store at `data_dir` for writing while
/// the agent is stopped. Files it writes keep the name the agent gave
/// (`store.node`), not the host's.
fn offline_store_options(data_dir: &Path) -> Result<StoreOptions> {
    let mut options = StoreOptions::new(data_dir);
    if let Some(node) = vtax_store::files::node_of_store(data_dir)? {
        options.node = node;
    }
    Ok(options)
}

/// Runs `vtax compact`.
pub fn compact(args: CompactArgs) -> Result<()> {
    let data_dir = crate::existing_store_dir(args.data_dir)?;
    let mut options = offline_store_options(&data_dir)?;
    options.retention_max_age = args.max_age;
    options.retention_max_bytes = args.max_bytes;
    let now = match &args.now {
        Some(t) => crate::timespec::parse_time(t, now_us())?,
        None => now_us(),
    };
    let mut store = Store::open(options, crate::catalog())
        .with_context(|| format!("open store {}", data_dir.display()))?;
    // Rows of a killed agent come back from the WAL buffered, and merges and
    // retention pass over a day or hour that holds buffered rows: published
    // first, they are merged and retained as the rest of their day. On a
    // full disk they cannot be, and retention is what makes room: it goes on
    // without them, and the close publishes them if it did.
    if let Err(e) = store.flush() {
        tracing::warn!(error = %e, "The rows the WAL held could not be published first; merging and retention go on without them.");
    }
    // A damaged input (moved to quarantine) fails its own merge only: the
    // other merges and retention still run, and the command fails after.
    let merged = store.compact(now);
    let removed = store.apply_retention(now)?;
    store.close()?;
    let merges = merged.context(
        "a merge met a damaged file, moved to quarantine/ (the other merges and retention ran)",
    )?;
    eprintln!("Merged files {merges} time(s); retention removed {removed} file(s).");
    Ok(())
}

/// Arguments of `vtax verify`.
#[derive(clap::Args)]
pub struct VerifyArgs {
    /// Data directory of the store.
    #[arg(long, env = "VTAX_DATA_DIR")]
    data_dir: Option<PathBuf>,
    /// Move damaged files to `<data_dir>/quarantine/`. Takes the store's lock,
    /// so the agent must be stopped; without it, verifying works beside one.
    #[arg(long)]
    quarantine: bool,
}

/// Runs `vtax verify`: every published file read whole, every WAL frame and
/// every remote-write queue record checked. Fails while damage is left, so
/// that a script notices.
pub fn verify(args: VerifyArgs) -> Result<()> {
    let data_dir = crate::existing_store_dir(args.data_dir)?;
    if args.quarantine {
        return quarantine(&data_dir);
    }
    let damaged = verify_tables(&data_dir)? + verify_wal(&data_dir)? + verify_queues(&data_dir)?;
    if damaged > 0 {
        anyhow::bail!(
            "{damaged} damaged or unreadable file(s) or unread partition(s) in {}. `vtax verify --quarantine`, with \
             the agent stopped, moves damaged Parquet files to quarantine/ and copies damaged \
             WAL and queue segments there, keeping every intact frame and record (the agent \
             does the same for segments when it starts); an unreadable file stays where it is.",
            data_dir.display()
        );
    }
    Ok(())
}

/// Reads every published file whole; the number damaged.
fn verify_tables(data_dir: &Path) -> Result<usize> {
    let verified = vtax_store::files::verify_store(data_dir)
        .with_context(|| format!("verify the store at {}", data_dir.display()))?;
    // An OS error says nothing of a file's bytes: it is unreadable, not
    // damaged, and quarantine would not move it.
    let (damaged, unreadable): (Vec<_>, Vec<_>) = verified
        .damaged
        .iter()
        .partition(|e| e.damaged_file().is_some());
    for e in &damaged {
        eprintln!("damaged: {e}");
    }
    for e in &unreadable {
        eprintln!("unreadable (an OS error, not damage; fix it and verify again): {e}");
    }
    eprintln!(
        "{} file(s) sound, {} damaged, {} unreadable.",
        verified.sound,
        damaged.len(),
        unreadable.len()
    );
    for (table, date) in future_partitions(data_dir, now_us()) {
        eprintln!(
            "dated after today: tables/{table}/date={date}, written while the clock was ahead; \
             retention by bytes keeps it longest and a report reads it as the newest. Delete \
             it if its times are wrong."
        );
    }
    let foreign = vtax_store::files::foreign_partitions(data_dir);
    for dir in &foreign {
        if dir.linked {
            eprintln!(
                "symbolic link: {} stands for a table or partition: vtax neither reads nor \
                 writes below it (retention and quarantine would act where it points, outside \
                 the store), a glob of the table follows it. Move its files in, or make the \
                 data directory itself the link.",
                dir.path.display()
            );
        } else {
            eprintln!(
                "not a partition: {} holds {} Parquet file(s) under a name that is not \
                 date=YYYY-MM-DD: vtax reads none of their rows, a glob of the table reads them \
                 all. Rename it to its date or move it out of tables/.",
                dir.path.display(),
                dir.parquet_files
            );
        }
    }
    for path in &verified.unfinished_merges {
        eprintln!(
            "merge not finished: {} holds its rows under its pending name, which DuckDB, \
             Polars and Spark do not read; the agent's next start or `vtax compact` publishes it.",
            path.display()
        );
    }
    Ok(damaged.len() + unreadable.len() + foreign.len())
}

/// The store's partitions (table, date) dated after tomorrow at `now_us`:
/// rows written while the clock ran ahead.
fn future_partitions(data_dir: &Path, now_us: i64) -> Vec<(String, String)> {
    let today = now_us.div_euclid(vtax_store::DAY_US);
    vtax_store::files::partition_dirs(data_dir)
        .into_iter()
        .filter_map(|(table, name, _)| {
            let date = name.strip_prefix("date=")?;
            vtax_store::parse_date(date)
                .is_some_and(|day| day > today + 1)
                .then(|| (table, date.to_string()))
        })
        .collect()
}

/// Names a damaged segment. Damage the agent has met already (it copies the
/// segment to quarantine when it starts, and keeps it until its intact
/// frames or records are used) is reported but not counted: 0 or 1.
fn damaged_segment(what: &str, path: &Path, kept_in_quarantine: bool, detail: &str) -> usize {
    if kept_in_quarantine {
        eprintln!(
            "damaged, a copy kept in quarantine: {what} {}{detail}",
            path.display()
        );
        0
    } else {
        eprintln!("damaged: {what} {}{detail}", path.display());
        1
    }
}

/// Checks every WAL frame; the number of damaged segments no copy holds.
fn verify_wal(data_dir: &Path) -> Result<usize> {
    let wal_dir = data_dir.join("wal");
    let segments = vtax_store::wal::open_segments(&wal_dir)
        .with_context(|| format!("list the WAL at {}", wal_dir.display()))?;
    let opened = segments.len();
    let wal = vtax_store::wal::replay_open(segments, &crate::catalog(), |_| Ok(()))
        .with_context(|| format!("read the WAL at {}", wal_dir.display()))?;
    eprintln!(
        "wal: {opened} segment(s), {} intact frame(s).",
        wal.frames + wal.frames_skipped
    );
    let damaged = wal
        .damaged_segments
        .iter()
        .map(|path| {
            let kept = vtax_store::kept_in_quarantine(data_dir, path);
            damaged_segment("WAL segment", path, kept, "")
        })
        .sum();
    if !wal.damaged_segments.is_empty() {
        eprintln!(
            "wal: {} byte(s) of those segments hold no intact frame: their rows are lost.",
            wal.damaged_bytes
        );
    }
    for (path, reason) in &wal.set_aside_segments {
        eprintln!(
            "wal: {} holds rows this build's tables cannot hold in full ({reason}): written \
             by another vtax?",
            path.display()
        );
    }
    if wal.torn_bytes > 0 {
        eprintln!(
            "wal: {} byte(s) after the newest segment's last intact frame: a frame being \
             written, or one torn by a crash (cut at the next start).",
            wal.torn_bytes
        );
    }
    Ok(damaged)
}

/// Checks every record of each remote's queue; the number of damaged
/// segments no copy holds.
fn verify_queues(data_dir: &Path) -> Result<usize> {
    let mut damaged = 0;
    for (name, dir) in remote_write_queues(data_dir)? {
        let queue = vtax_exporters::remote_write::queue::verify(&dir)
            .with_context(|| format!("verify the remote write queue at {}", dir.display()))?;
        eprintln!(
            "remote_write/{name}: {} segment(s), {} intact record(s), {} sample(s) not yet \
             acknowledged by the receiver.",
            queue.segments, queue.records, queue.pending_samples
        );
        for segment in &queue.damaged {
            let detail = format!(
                ": {} byte(s) hold no intact record; their samples are lost.",
                segment.bytes
            );
            damaged += damaged_segment(
                "remote write queue segment",
                &segment.path,
                segment.kept_in_quarantine,
                &detail,
            );
        }
        if queue.tail_bytes > 0 {
            eprintln!(
                "remote_write/{name}: {} byte(s) after the newest segment's last intact \
                 record: a record being appended, or one torn by a crash (cut at the next \
                 start).",
                queue.tail_bytes
            );
        }
    }
    Ok(damaged)
}

/// `vtax verify --quarantine`: the store opened (which moves files whose
/// footer or layout is damaged and copies damaged WAL segments), every page
/// read, and each remote-write queue opened (which copies damaged segments
/// and cuts what cannot be read).
fn quarantine(data_dir: &Path) -> Result<()> {
    let mut store = Store::open(offline_store_options(data_dir)?, crate::catalog())
        .with_context(|| format!("open store {}", data_dir.display()))?;
    let at_open = store.stats().files_quarantined;
    let store_unreadable = store.stats().files_unreadable;
    let damaged_in_place = store.stats().files_damaged_in_place;
    let moved = store.quarantine_damaged()?;
    let sound = store.files().count();
    store.close()?;
    for (_, e) in &moved {
        eprintln!("damaged, moved to quarantine: {e}");
    }
    eprintln!(
        "{sound} file(s) sound; {} damaged moved or copied to {} ({at_open} of them on opening \
         the store, named in the log above).",
        at_open + moved.len() as u64,
        data_dir.join("quarantine").display()
    );
    if store_unreadable > 0 {
        eprintln!(
            "{store_unreadable} file(s) could not be read (an OS error: permissions, a failing disk, \
             named in the log above): left where they are, not moved."
        );
    }
    if damaged_in_place > 0 {
        eprintln!(
            "{damaged_in_place} damaged file(s) could not be moved to quarantine (named in the log \
             above with why): left where they are, their rows unread."
        );
    }
    for (name, dir) in remote_write_queues(data_dir)? {
        let (_, report) = vtax_exporters::remote_write::queue::Queue::open(&dir, u64::MAX)
            .with_context(|| format!("open the remote write queue at {}", dir.display()))?;
        eprintln!(
            "remote_write/{name}: {} segment(s), {} sample(s) to send; {} damaged segment(s) \
             copied to {}.",
            report.segments,
            report.pending_samples,
            report.damaged_segments.len(),
            dir.join("quarantine").display()
        );
    }
    if damaged_in_place > 0 {
        anyhow::bail!(
            "{damaged_in_place} damaged file(s) left in {}: see why above.",
            data_dir.display()
        );
    }
    Ok(())
}

/// Each remote's queue directory under `<data_dir>/remote_write/`, by name.
fn remote_write_queues(data_dir: &Path) -> Result<Vec<(String, PathBuf)>> {
    let root = vtax_exporters::remote_write::queues_dir(data_dir);
    let entries = match std::fs::read_dir(&root) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e).with_context(|| format!("list {}", root.display())),
    };
    let mut queues = Vec::new();
    for entry in entries {
        let entry = entry.with_context(|| format!("list {}", root.display()))?;
        if entry.file_type().is_ok_and(|t| t.is_dir()) {
            queues.push((
                entry.file_name().to_string_lossy().into_owned(),
                entry.path(),
            ));
        }
    }
    queues.sort();
    Ok(queues)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Partitions dated after tomorrow (a clock that ran ahead) are named;
    /// today's and tomorrow's (a node east of UTC) are not.
    #[test]
    fn partitions_dated_after_tomorrow_are_named() {
        let dir = tempfile::tempdir().unwrap();
        let today_us = vtax_store::parse_date("2026-12-07").unwrap() * vtax_store::DAY_US;
        for date in ["2026-12-07", "2026-12-08", "2030-01-01"] {
            std::fs::create_dir_all(dir.path().join(format!("tables/cpu/date={date}"))).unwrap();
        }
        assert_eq!(
            future_partitions(dir.path(), today_us + 3_600_000_000),
            [("cpu".to_string(), "2030-01-01".to_string())]
        );
    }

    #[test]
    fn remote_write_says_instance_with_the_node_name_the_files_carry() {
        let mut config = Config::default();
        config.store.node = Some("ip-10-0-1-17.ec2.internal".into());
        let mut own = RemoteWriteConfig::new("central", "https://prom.example/api/v1/write");
        own.external_labels
            .insert("instance".into(), "rack3-gpu7".into());
        let mut removed = RemoteWriteConfig::new("other", "https://prom.example/api/v1/write");
        removed.external_labels.insert("instance".into(), "".into());
        config.remote_write = vec![
            RemoteWriteConfig::new("plain", "https://prom.example/api/v1/write"),
            own,
            removed,
        ];
        let instance = |c: &RemoteWriteConfig| {
            c.series_labels("pod-name-abc12")
                .into_iter()
                .find(|l| l.name == "instance")
                .map(|l| l.value)
        };
        let configs = remote_write_configs(&config);
        assert_eq!(
            instance(&configs[0]).as_deref(),
            Some("ip-10-0-1-17.ec2.internal"),
            "the node's name, not the pod's host name"
        );
        assert_eq!(instance(&configs[1]).as_deref(), Some("rack3-gpu7"));
        assert_eq!(instance(&configs[2]), None, "an empty value removes it");
        assert_eq!(store_options(&config).node, "ip-10-0-1-17.ec2.internal");
    }
}
