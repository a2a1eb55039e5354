//! Prometheus remote write 1.0: every sample the agent stores is also queued
//! on disk, per configured remote, and sent from there by a thread per remote.
//!
//! The store's thread encodes each batch once ([`encode`]) and appends it to
//! each remote's queue ([`queue`]); a sender ([`send`]) reads the queue from
//! its acknowledged position in append order, batches records into requests,
//! retries what may succeed later and drops what never will, and acknowledges
//! only after the receiver answered. Its counters go out as the
//! `remote_write` table, one row per remote per second.

pub mod config;
pub mod encode;
pub mod queue;
pub mod send;
mod validate;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use prost::Message as _;
use vtax_store::schema::{FieldDef, FieldType, TagDef, Unit};
use vtax_store::{Batch, BatchBuilder};

pub use config::RemoteWriteConfig;
use queue::Queue;
use send::{Backoff, Client, Outcome};

use crate::Exposition;

/// Where the remotes' queues lie in a data directory: a directory each, by
/// the remote's name.
pub fn queues_dir(data_dir: &Path) -> PathBuf {
    data_dir.join("remote_write")
}

vtax_store::table! {
    /// The counters of every remote, one row per remote per second.
    pub static TABLE: TableDef, pub struct RemoteWriteRow {
        name: "remote_write",
        help: "One row per configured remote write receiver per second: what was sent, retried and dropped, and what waits in its on-disk queue.",
        tags: [remote = TagDef {
            name: "remote",
            help: "The remote's `name` in `[[remote_write]]`.",
        }],
        fields: [
            samples_sent: u64 = FieldDef::counter(FieldType::U64, Unit::None, "Samples the receiver accepted since the agent started."),
            samples_retried: u64 = FieldDef::counter(FieldType::U64, Unit::None, "Samples sent again after a 5xx, a 429 or a connection failure, since the agent started."),
            samples_dropped_queue_full: u64 = FieldDef::counter(FieldType::U64, Unit::None, "Samples dropped unsent because the on-disk queue reached queue_max_bytes (its oldest segment goes), since the agent started."),
            samples_dropped_rejected: u64 = FieldDef::counter(FieldType::U64, Unit::None, "Samples dropped because the receiver refused them for good (a 4xx other than 429), since the agent started."),
            samples_dropped_unwritten: u64 = FieldDef::counter(FieldType::U64, Unit::None, "Samples dropped because they could not be written to the queue (a full or failing disk), since the agent started."),
            queue_damaged_bytes: u64 = FieldDef::counter(FieldType::U64, Unit::Bytes, "Bytes of the on-disk queue found damaged since the agent started (at its start, or read since): records whose checksum fails, whose samples are lost. Each damaged segment is copied to quarantine/ in the queue's directory."),
            requests_failed: u64 = FieldDef::counter(FieldType::U64, Unit::None, "Requests that did not succeed: errors, timeouts and non-2xx answers, since the agent started."),
            queue_bytes: u64 = FieldDef::gauge(FieldType::U64, Unit::Bytes, "Bytes of samples in the on-disk queue not yet acknowledged by the receiver."),
            oldest_pending_age_seconds: f64 = FieldDef::gauge(FieldType::F64, Unit::Seconds, "Age of the oldest sample not yet acknowledged by the receiver; 0 when the queue is empty."),
        ],
        exported: true,
    }
}

/// Why remote write could not start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RemoteWriteError {
    /// The queue directory could not be opened.
    #[error("remote_write {name}: queue {path}: {source}")]
    Queue {
        /// The remote.
        name: String,
        /// Its queue directory.
        path: String,
        /// Why.
        source: std::io::Error,
    },
    /// The configuration does not hold (a bad URL, a TLS file that does not load).
    #[error("remote_write {name}: {message}")]
    Config {
        /// The remote.
        name: String,
        /// What is wrong.
        message: String,
    },
}

#[derive(Default)]
struct Stats {
    sent: AtomicU64,
    retried: AtomicU64,
    dropped_rejected: AtomicU64,
    dropped_unwritten: AtomicU64,
    requests_failed: AtomicU64,
    /// Earliest unacknowledged sample, ms since the epoch; `i64::MAX` when none.
    oldest_pending_ms: AtomicI64,
}

struct Remote {
    config: RemoteWriteConfig,
    /// `instance`, `job` and the external labels, sorted.
    labels: Vec<encode::Label>,
    queue: Arc<Mutex<Queue>>,
    stats: Arc<Stats>,
    wake: Arc<tokio::sync::Notify>,
    stop: tokio::sync::watch::Sender<bool>,
    thread: Option<std::thread::JoinHandle<()>>,
    failing_writes: bool,
    /// The series of each snapshot source's last snapshot, by
    /// [`series_key`], their samples cleared: the ones the next leaves out
    /// are sent a stale marker.
    snapshots: HashMap<Arc<str>, HashMap<u64, encode::TimeSeries>>,
    /// The series of the snapshot being appended.
    building: HashMap<u64, encode::TimeSeries>,
}

impl Remote {
    /// Queues `series` in requests of at most `max_samples_per_send`.
    fn queue_series(&mut self, series: &[encode::TimeSeries]) {
        let chunk = self.config.max_samples_per_send as usize;
        let mut queue = self.queue.lock().expect("not poisoned");
        let mut failed = None;
        for part in series.chunks(chunk) {
            let samples = encode::sample_count(part);
            let min_time_ms = part
                .iter()
                .flat_map(|s| s.samples.iter().map(|x| x.timestamp))
                .min()
                .unwrap_or(0);
            let request = encode::WriteRequest {
                timeseries: part.to_vec(),
            };
            let payload = encode::compress(&request.encode_to_vec());
            if let Err(e) = queue.append(&payload, samples as u32, min_time_ms) {
                self.stats
                    .dropped_unwritten
                    .fetch_add(samples as u64, Ordering::Relaxed);
                failed = Some(e);
            }
        }
        drop(queue);
        match failed {
            Some(e) if !self.failing_writes => {
                self.failing_writes = true;
                tracing::error!(remote = %self.config.name, error = %e, "Remote write queue not writable: samples for this remote are dropped until it is.");
            }
            None if self.failing_writes => {
                self.failing_writes = false;
                tracing::info!(remote = %self.config.name, "Remote write queue writable again.");
            }
            _ => {}
        }
        self.wake.notify_one();
    }
}

/// Prometheus's stale marker: a NaN that no arithmetic produces.
const STALE_NAN_BITS: u64 = 0x7ff0_0000_0000_0002;

/// A series' identity: its labels, `__name__` among them.
fn series_key(series: &encode::TimeSeries) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    for label in &series.labels {
        label.name.hash(&mut hasher);
        label.value.hash(&mut hasher);
    }
    hasher.finish()
}

/// Every configured remote: queues fed from the store's thread, senders on
/// their own threads, and a thread publishing their counters.
pub struct RemoteWriters {
    remotes: Vec<Remote>,
    sync_interval: Duration,
    last_sync: Instant,
    stats_stop: Option<std::sync::mpsc::Sender<()>>,
    stats_thread: Option<std::thread::JoinHandle<()>>,
}

/// How long a stopping agent lets a request in flight finish, so that a clean
/// stop does not leave a sent but unacknowledged request to send again.
const STOP_GRACE: Duration = Duration::from_secs(5);
/// How often the counters are published.
const STATS_INTERVAL: Duration = Duration::from_secs(1);

impl RemoteWriters {
    /// Opens each remote's queue under `<data_dir>/remote_write/<name>/` and
    /// starts its sender. Counters go to `exposition` and, as rows, to `rows`
    /// (the store's channel), so they are stored and sent like any table.
    pub fn start(
        configs: &[RemoteWriteConfig],
        data_dir: &Path,
        sync_interval: Duration,
        exposition: &Arc<Exposition>,
        rows: vtax_store::hub::RowSender,
    ) -> Result<RemoteWriters, RemoteWriteError> {
        let mut remotes = Vec::new();
        let host = host_name();
        for config in configs {
            let config_error = |message: String| RemoteWriteError::Config {
                name: config.name.clone(),
                message,
            };
            let client = Client::new(config).map_err(config_error)?;
            let dir = queues_dir(data_dir).join(&config.name);
            let (queue, report) = Queue::open(&dir, config.queue_max_bytes).map_err(|source| {
                RemoteWriteError::Queue {
                    name: config.name.clone(),
                    path: dir.display().to_string(),
                    source,
                }
            })?;
            tracing::info!(remote = %config.name, url = %config.url, pending_samples = report.pending_samples, segments = report.segments, damaged_segments = report.damaged_segments.len(), "Remote write started.");
            let queue = Arc::new(Mutex::new(queue));
            let stats = Arc::new(Stats {
                oldest_pending_ms: AtomicI64::new(i64::MAX),
                ..Stats::default()
            });
            let wake = Arc::new(tokio::sync::Notify::new());
            let (stop, stopped) = tokio::sync::watch::channel(false);
            let sender = SenderTask {
                config: config.clone(),
                queue: queue.clone(),
                stats: stats.clone(),
                wake: wake.clone(),
                stopped,
                client,
            };
            let thread = std::thread::Builder::new()
                .name(format!("remote-write-{}", config.name))
                .spawn(move || sender.run())
                .map_err(|e| config_error(format!("spawn its sender: {e}")))?;
            remotes.push(Remote {
                config: config.clone(),
                labels: config.series_labels(&host),
                queue,
                stats,
                wake,
                stop,
                thread: Some(thread),
                failing_writes: false,
                snapshots: HashMap::new(),
                building: HashMap::new(),
            });
        }
        let (stats_stop, stats_thread) = if remotes.is_empty() {
            (None, None)
        } else {
            let views: Vec<_> = remotes
                .iter()
                .map(|r| (r.config.name.clone(), r.queue.clone(), r.stats.clone()))
                .collect();
            let exposition = exposition.clone();
            let (stop, stopped) = std::sync::mpsc::channel::<()>();
            let thread = std::thread::Builder::new()
                .name("remote-write-stats".into())
                .spawn(move || {
                    while let Err(std::sync::mpsc::RecvTimeoutError::Timeout) =
                        stopped.recv_timeout(STATS_INTERVAL)
                    {
                        let batch = Arc::new(stats_batch(&views, now_ms() * 1000));
                        exposition.update("remote_write", vec![batch.clone()]);
                        let _ = rows.send(vec![batch]);
                    }
                })
                .map_err(|e| RemoteWriteError::Config {
                    name: "stats".into(),
                    message: format!("spawn a thread: {e}"),
                })?;
            (Some(stop), Some(thread))
        };
        Ok(RemoteWriters {
            remotes,
            sync_interval,
            last_sync: Instant::now(),
            stats_stop,
            stats_thread,
        })
    }

    /// Queues a batch the store took, for every remote. Never blocks on the
    /// network; a queue that cannot be written counts the samples as dropped.
    pub fn append(&mut self, batch: &Batch) {
        self.append_from(false, batch);
    }

    /// [`RemoteWriters::append`] for a batch of a snapshot (see
    /// `vtax_store::hub::Sent`): its series are remembered until
    /// [`RemoteWriters::end_snapshot`].
    pub fn append_to_snapshot(&mut self, batch: &Batch) {
        self.append_from(true, batch);
    }

    fn append_from(&mut self, in_snapshot: bool, batch: &Batch) {
        if self.remotes.is_empty() || !encode::is_sent(batch.table) {
            return;
        }
        for remote in &mut self.remotes {
            if !remote.config.sends(batch.table.name) {
                continue;
            }
            let series = encode::batch_series(batch, &remote.labels);
            if series.is_empty() {
                continue;
            }
            remote.queue_series(&series);
            if in_snapshot {
                for mut one in series {
                    one.samples = Vec::new();
                    remote.building.insert(series_key(&one), one);
                }
            }
        }
        if self.last_sync.elapsed() >= self.sync_interval {
            self.sync();
        }
    }

    /// Forgets the series appended since the last snapshot ended, ending
    /// none: the snapshot was not whole (the store refused some of it).
    pub fn abandon_snapshot(&mut self) {
        for remote in &mut self.remotes {
            remote.building.clear();
        }
    }

    /// Ends the snapshot of `source` whose batches were appended since the
    /// last: each series of its previous snapshot that this one lacks gets
    /// a stale marker at `time_us` (the remote write 1.0 spec's MUST for a
    /// series no longer appended to).
    pub fn end_snapshot(&mut self, source: &Arc<str>, time_us: i64) {
        let timestamp = time_us.div_euclid(1000);
        for remote in &mut self.remotes {
            let now = std::mem::take(&mut remote.building);
            let mut before = remote
                .snapshots
                .insert(source.clone(), now)
                .unwrap_or_default();
            let now = &remote.snapshots[source];
            let ended: Vec<encode::TimeSeries> = before
                .drain()
                .filter(|(key, _)| !now.contains_key(key))
                .map(|(_, mut series)| {
                    series.samples.push(encode::Sample {
                        value: f64::from_bits(STALE_NAN_BITS),
                        timestamp,
                    });
                    series
                })
                .collect();
            // The drained map holds its room for the next snapshot: no
            // map is grown afresh every tick.
            remote.building = before;
            if !ended.is_empty() {
                remote.queue_series(&ended);
            }
        }
    }

    fn sync(&mut self) {
        self.last_sync = Instant::now();
        for remote in &self.remotes {
            if let Err(e) = remote.queue.lock().expect("not poisoned").sync() {
                tracing::warn!(remote = %remote.config.name, error = %e, "Remote write queue fsync failed.");
            }
        }
    }
}

impl Drop for RemoteWriters {
    /// Stops the senders (a request in flight gets [`STOP_GRACE`] to finish)
    /// and makes the queues durable; what is unsent goes at the next start.
    fn drop(&mut self) {
        if let Some(stop) = self.stats_stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.stats_thread.take() {
            let _ = thread.join();
        }
        for remote in &self.remotes {
            let _ = remote.stop.send(true);
        }
        for remote in &mut self.remotes {
            if let Some(thread) = remote.thread.take() {
                let _ = thread.join();
            }
        }
        self.sync();
    }
}

/// The node's host name, the default `instance` label.
fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .ok()
        .filter(|h| !h.is_empty())
        .unwrap_or_else(vtax_store::node_name)
}

/// The agent's clock in ms: the rows' clock, which the batch deadline is
/// measured against.
fn now_ms() -> i64 {
    vtax_store::clock::now_us() / 1000
}

type StatsView = (String, Arc<Mutex<Queue>>, Arc<Stats>);

fn stats_batch(views: &[StatsView], time_us: i64) -> Batch {
    let mut builder = BatchBuilder::new(&TABLE);
    for (name, queue, stats) in views {
        let (queue_bytes, dropped_full, damaged_bytes) = {
            let queue = queue.lock().expect("not poisoned");
            (
                queue.pending_bytes(),
                queue.dropped_samples(),
                queue.damaged_bytes(),
            )
        };
        let oldest = stats.oldest_pending_ms.load(Ordering::Relaxed);
        let age = if oldest == i64::MAX {
            0.0
        } else {
            ((time_us / 1000 - oldest).max(0) as f64) / 1000.0
        };
        let counter = |c: &AtomicU64| c.load(Ordering::Relaxed);
        let row = RemoteWriteRow {
            remote: name,
            samples_sent: counter(&stats.sent),
            samples_retried: counter(&stats.retried),
            samples_dropped_queue_full: dropped_full,
            samples_dropped_rejected: counter(&stats.dropped_rejected),
            samples_dropped_unwritten: counter(&stats.dropped_unwritten),
            queue_damaged_bytes: damaged_bytes,
            requests_failed: counter(&stats.requests_failed),
            queue_bytes,
            oldest_pending_age_seconds: age,
        };
        builder
            .push_row(time_us, &row)
            .expect("a remote's row is for the remote_write table");
    }
    builder.finish()
}

/// One remote's sender thread.
struct SenderTask {
    config: RemoteWriteConfig,
    queue: Arc<Mutex<Queue>>,
    stats: Arc<Stats>,
    wake: Arc<tokio::sync::Notify>,
    stopped: tokio::sync::watch::Receiver<bool>,
    client: Client,
}

impl SenderTask {
    fn run(mut self) {
        let runtime = match tokio::runtime::Builder::new_current_thread()
            .enable_io()
            .enable_time()
            .build()
        {
            Ok(r) => r,
            Err(e) => {
                tracing::error!(remote = %self.config.name, error = %e, "Remote write sender could not start; samples stay queued.");
                return;
            }
        };
        runtime.block_on(self.send_loop());
    }

    fn is_stopped(&self) -> bool {
        *self.stopped.borrow()
    }

    /// Sleeps `duration`, or less when the agent stops; true when stopped.
    async fn pause(&mut self, duration: Duration) -> bool {
        let mut stopped = self.stopped.clone();
        tokio::select! {
            _ = tokio::time::sleep(duration) => {}
            _ = stopped.wait_for(|s| *s) => {}
        }
        self.is_stopped()
    }

    async fn send_loop(&mut self) {
        let max_samples = self.config.max_samples_per_send;
        let deadline = Duration::from_secs_f64(self.config.batch_send_deadline_secs);
        let timeout = Duration::from_secs_f64(self.config.remote_timeout_secs);
        let mut backoff = Backoff::new(
            Duration::from_secs_f64(self.config.min_backoff_secs),
            Duration::from_secs_f64(self.config.max_backoff_secs),
        );
        let mut failing = false;
        // A receiver refusing every request (a 400 for each) logs its reason
        // once a minute per status; `samples_dropped_rejected` counts all.
        let mut refusals = vtax_store::log_limit::Repeats::default();
        while !self.is_stopped() {
            let read = self.queue.lock().expect("not poisoned").read(max_samples);
            let pending = match read {
                Ok(Some(p)) => p,
                Ok(None) => {
                    self.stats
                        .oldest_pending_ms
                        .store(i64::MAX, Ordering::Relaxed);
                    let wake = self.wake.clone();
                    let mut stopped = self.stopped.clone();
                    tokio::select! {
                        _ = wake.notified() => {}
                        _ = stopped.wait_for(|s| *s) => {}
                        _ = tokio::time::sleep(Duration::from_secs(1)) => {}
                    }
                    continue;
                }
                Err(e) => {
                    tracing::error!(remote = %self.config.name, error = %e, "Remote write queue unreadable; retrying.");
                    if self.pause(Duration::from_secs(5)).await {
                        break;
                    }
                    continue;
                }
            };
            if pending.samples == 0 {
                // Only damaged records were read: nothing to send, move past them.
                let acked = self.queue.lock().expect("not poisoned").ack(&pending);
                if let Err(e) = acked {
                    tracing::error!(remote = %self.config.name, error = %e, "Remote write queue: could not record its position; retrying.");
                    if self.pause(Duration::from_secs(5)).await {
                        break;
                    }
                }
                continue;
            }
            self.stats
                .oldest_pending_ms
                .store(pending.min_time_ms, Ordering::Relaxed);
            // A short request waits until its oldest sample is `deadline` old.
            let age = Duration::from_millis((now_ms() - pending.min_time_ms).max(0) as u64);
            if pending.samples < max_samples && age < deadline {
                if self.pause(deadline - age).await {
                    break;
                }
                continue;
            }
            // Whether the receiver may hold this body already: the request in
            // flight when the agent stopped, or one whose answer was lost (a
            // timeout, a connection cut after the body went out, a gateway's
            // 502 or 504 after its backend took it). A receiver that took it refuses
            // the same samples again as out of order or duplicate: no drop.
            let mut resending = {
                let mut queue = self.queue.lock().expect("not poisoned");
                let resending = queue.resending();
                if let Err(e) = queue.mark_in_flight(&pending) {
                    tracing::warn!(remote = %self.config.name, error = %e, "Remote write could not mark its request in flight; a crash now may resend a larger one.");
                }
                resending
            };
            let body = bytes::Bytes::from(encode::compress(&pending.protobuf));
            // Retry the same body until it is taken or refused for good.
            loop {
                let result = self.post(body.clone(), timeout).await;
                let outcome = match &result {
                    Ok(response) => send::classify(response.status),
                    Err(_) => Outcome::Retry,
                };
                if outcome != Outcome::Sent {
                    self.stats.requests_failed.fetch_add(1, Ordering::Relaxed);
                }
                match outcome {
                    Outcome::Sent => {
                        self.stats
                            .sent
                            .fetch_add(pending.samples, Ordering::Relaxed);
                        if failing {
                            tracing::info!(remote = %self.config.name, "Remote write recovered.");
                            failing = false;
                        }
                        backoff.reset();
                        break;
                    }
                    Outcome::Reject if resending => {
                        let response = result.as_ref().expect("a rejection has a response");
                        tracing::info!(remote = %self.config.name, status = response.status, message = %response.message, samples = pending.samples, "Remote write receiver refused a request sent again after its answer was lost (a restart, a timeout, a cut connection, a gateway's 502 or 504): it had taken it before.");
                        break;
                    }
                    Outcome::Reject => {
                        let response = result.as_ref().expect("a rejection has a response");
                        self.stats
                            .dropped_rejected
                            .fetch_add(pending.samples, Ordering::Relaxed);
                        if let Some(not_logged) = refusals.occurred(&response.status.to_string()) {
                            tracing::error!(remote = %self.config.name, status = response.status, message = %response.message, samples = pending.samples, refusals_not_logged = not_logged, "Remote write receiver refused a request for good: its samples are dropped.");
                        }
                        break;
                    }
                    Outcome::Retry => {
                        // A gateway's 502 or 504 may come after its backend
                        // took the body; a 503 or 429 refused it unread.
                        resending |= match &result {
                            Err(_) => true,
                            Ok(response) => matches!(response.status, 502 | 504),
                        };
                        let reason = match &result {
                            Ok(r) => format!("HTTP {}: {}", r.status, r.message),
                            Err(e) => e.clone(),
                        };
                        if !failing {
                            tracing::warn!(remote = %self.config.name, error = %reason, "Remote write failed; retrying with backoff, samples stay queued.");
                            failing = true;
                        } else {
                            tracing::debug!(remote = %self.config.name, error = %reason, "Remote write still failing.");
                        }
                        let asked = result.as_ref().ok().and_then(|r| r.retry_after);
                        let wait = send::retry_wait(backoff.next_delay(), asked);
                        if asked.is_some() {
                            tracing::debug!(remote = %self.config.name, wait_secs = wait.as_secs_f64(), "Remote write waits as the receiver's Retry-After asks.");
                        }
                        if self.pause(wait).await {
                            return;
                        }
                        self.stats
                            .retried
                            .fetch_add(pending.samples, Ordering::Relaxed);
                    }
                }
            }
            if let Err(e) = self.queue.lock().expect("not poisoned").ack(&pending) {
                tracing::warn!(remote = %self.config.name, error = %e, "Remote write could not record its position; a restart sends the last request again.");
            }
        }
    }

    /// One POST within `timeout`; when the agent stops meanwhile, the
    /// request gets [`STOP_GRACE`] more before it is abandoned.
    async fn post(
        &mut self,
        body: bytes::Bytes,
        timeout: Duration,
    ) -> Result<send::Response, String> {
        let mut stopped = self.stopped.clone();
        let post = tokio::time::timeout(timeout, self.client.post(body));
        tokio::pin!(post);
        let result = tokio::select! {
            r = &mut post => r,
            _ = stopped.wait_for(|s| *s) => match tokio::time::timeout(STOP_GRACE, &mut post).await {
                Ok(r) => r,
                Err(_) => return Err("abandoned: the agent is stopping".into()),
            },
        };
        result.unwrap_or_else(|_| Err(format!("no answer within {timeout:?}")))
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::io::{BufRead, BufReader, Read, Write};
    use std::net::TcpListener;
    use std::sync::mpsc;

    use prost::Message;

    use super::*;

    /// A request the fake receiver got: its headers (lower-cased names) and
    /// the decoded write request.
    struct Received {
        /// The request line's path.
        path: String,
        headers: BTreeMap<String, String>,
        request: encode::WriteRequest,
    }

    trait Stream: Read + Write + Send {}
    impl<T: Read + Write + Send> Stream for T {}

    /// An HTTP/1.1 receiver on a real socket that answers with `statuses` in
    /// turn (then 204) and hands over every request it read; a 3xx sends
    /// the client on to `/moved` on the same receiver.
    fn fake_receiver(statuses: Vec<u16>) -> (u16, mpsc::Receiver<Received>) {
        fake_receiver_with(statuses, None)
    }

    /// The same over TLS when `tls` is given.
    fn fake_receiver_with(
        statuses: Vec<u16>,
        tls: Option<Arc<rustls::ServerConfig>>,
    ) -> (u16, mpsc::Receiver<Received>) {
        let answers = statuses.into_iter().map(|s| (s, "")).collect();
        fake_receiver_answering(answers, tls)
    }

    /// A receiver whose answers are a status and header lines
    /// (`"name: value\r\n"` each) in turn, then 204.
    fn fake_receiver_answering(
        answers: Vec<(u16, &'static str)>,
        tls: Option<Arc<rustls::ServerConfig>>,
    ) -> (u16, mpsc::Receiver<Received>) {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let mut answers = answers.into_iter();
            for stream in listener.incoming() {
                let stream = stream.unwrap();
                let stream: Box<dyn Stream> = match &tls {
                    None => Box::new(stream),
                    Some(config) => {
                        let connection = rustls::ServerConnection::new(config.clone()).unwrap();
                        Box::new(rustls::StreamOwned::new(connection, stream))
                    }
                };
                let mut stream = BufReader::new(stream);
                loop {
                    let mut headers = BTreeMap::new();
                    let mut line = String::new();
                    if stream.read_line(&mut line).unwrap_or(0) == 0 {
                        break; // closed, or a TLS handshake the client gave up
                    }
                    let path = line.split(' ').nth(1).unwrap_or("").to_string();
                    loop {
                        line.clear();
                        stream.read_line(&mut line).unwrap();
                        let Some((k, v)) = line.trim_end().split_once(':') else {
                            break;
                        };
                        headers.insert(k.to_ascii_lowercase(), v.trim().to_string());
                    }
                    let len: usize = headers["content-length"].parse().unwrap();
                    let mut body = vec![0; len];
                    stream.read_exact(&mut body).unwrap();
                    let request =
                        encode::WriteRequest::decode(&encode::decompress(&body).unwrap()[..])
                            .unwrap();
                    let (status, extra) = answers.next().unwrap_or((204, ""));
                    let _ = tx.send(Received {
                        path,
                        headers,
                        request,
                    });
                    let location = if (300..400).contains(&status) {
                        "location: /moved\r\n"
                    } else {
                        ""
                    };
                    let answer = format!(
                        "HTTP/1.1 {status} X\r\n{location}{extra}content-length: 2\r\n\r\nno"
                    );
                    stream.get_mut().write_all(answer.as_bytes()).unwrap();
                    stream.get_mut().flush().unwrap();
                }
            }
        });
        (port, rx)
    }

    vtax_store::table! {
        static GAUGE: TableDef, struct GaugeRow {
            name: "t",
            help: "test",
            tags: [n = TagDef { name: "n", help: "row" }],
            fields: [v: f64 = FieldDef::gauge(FieldType::F64, Unit::None, "x")],
            exported: true,
        }
    }

    /// A batch of `samples` rows whose values start at `first`.
    fn batch(first: usize, samples: usize) -> Batch {
        let mut b = BatchBuilder::new(&GAUGE);
        for i in first..first + samples {
            let row = GaugeRow {
                n: &i.to_string(),
                v: i as f64,
            };
            b.push_row(now_ms() * 1000, &row).unwrap();
        }
        b.finish()
    }

    /// Remote write to one remote, its queue in `dir`.
    fn start(dir: &Path, config: &RemoteWriteConfig) -> RemoteWriters {
        let exposition = Exposition::new(&[&TABLE]);
        let (rows, _) = vtax_store::hub::channel(16);
        RemoteWriters::start(
            std::slice::from_ref(config),
            dir,
            Duration::from_secs(1),
            &exposition,
            rows,
        )
        .unwrap()
    }

    /// Queues `rows` samples for a remote that cannot be reached, and checks
    /// the sender keeps retrying (quickly: the backoff is shortened).
    fn queue_while_failing(dir: &Path, config: &RemoteWriteConfig, rows: usize) {
        let mut config = config.clone();
        config.min_backoff_secs = 0.01;
        config.max_backoff_secs = 0.02;
        let mut writers = start(dir, &config);
        writers.append(&batch(0, rows));
        std::thread::sleep(Duration::from_millis(300));
        let stats = &writers.remotes[0].stats;
        assert!(stats.requests_failed.load(Ordering::Relaxed) > 1);
        assert_eq!(stats.sent.load(Ordering::Relaxed), 0);
    }

    fn values(r: &Received) -> Vec<f64> {
        r.request
            .timeseries
            .iter()
            .map(|s| s.samples[0].value)
            .collect()
    }

    /// A remote at the fake receiver on `port`: three samples a request,
    /// retried after 10 to 20 ms.
    fn three_a_request_quick_retries(port: u16) -> RemoteWriteConfig {
        let mut config = RemoteWriteConfig::new("fake", &format!("http://127.0.0.1:{port}/write"));
        config.max_samples_per_send = 3;
        config.min_backoff_secs = 0.01;
        config.max_backoff_secs = 0.02;
        config
    }

    /// Samples 0 to 8, three requests' worth.
    fn append_three_requests(writers: &mut RemoteWriters) {
        writers.append(&batch(0, 3));
        writers.append(&batch(3, 3));
        writers.append(&batch(6, 3));
    }

    /// A receiver that asks for time with `Retry-After` gets it, though
    /// the backoff alone would have come back a hundred times sooner.
    #[test]
    fn a_retry_waits_as_long_as_the_receivers_retry_after_asks() {
        let dir = tempfile::tempdir().unwrap();
        let (port, requests) = fake_receiver_answering(
            vec![(429, "retry-after: 2\r\n"), (503, "retry-after: soon\r\n")],
            None,
        );
        let config = three_a_request_quick_retries(port);
        let mut writers = start(dir.path(), &config);
        writers.append(&batch(0, 3));
        let first = requests.recv_timeout(Duration::from_secs(10)).unwrap();
        let asked_at = Instant::now();
        let second = requests.recv_timeout(Duration::from_secs(10)).unwrap();
        let waited = asked_at.elapsed();
        assert!(
            waited >= Duration::from_millis(1900),
            "came back after {waited:?}, asked for 2 s"
        );
        // An unreadable Retry-After is as none: the backoff's wait.
        let third = requests.recv_timeout(Duration::from_secs(1)).unwrap();
        for r in [&first, &second, &third] {
            assert_eq!(values(r), [0.0, 1.0, 2.0]);
        }
    }

    /// The first remote's stats once it has sent `samples` (10 s at most).
    fn sent_at_least(writers: &RemoteWriters, samples: u64) -> Arc<Stats> {
        let stats = writers.remotes[0].stats.clone();
        let deadline = Instant::now() + Duration::from_secs(10);
        while stats.sent.load(Ordering::Relaxed) < samples {
            assert!(Instant::now() < deadline, "{samples} samples sent");
            std::thread::sleep(Duration::from_millis(10));
        }
        stats
    }

    #[test]
    fn retries_5xx_and_429_drops_other_4xx_and_sends_the_protocol_headers() {
        let dir = tempfile::tempdir().unwrap();
        let (port, requests) = fake_receiver(vec![503, 429, 400]);
        let token = dir.path().join("token");
        std::fs::write(&token, "s3cret\n").unwrap();
        let mut config = three_a_request_quick_retries(port);
        config.bearer_token_file = Some(token);
        let mut writers = start(dir.path(), &config);
        append_three_requests(&mut writers);
        let got: Vec<Received> = (0..5)
            .map(|_| requests.recv_timeout(Duration::from_secs(10)).unwrap())
            .collect();
        let first = &got[0];
        assert_eq!(first.headers["content-encoding"], "snappy");
        assert_eq!(first.headers["content-type"], "application/x-protobuf");
        assert_eq!(first.headers["x-prometheus-remote-write-version"], "0.1.0");
        assert_eq!(first.headers["authorization"], "Bearer s3cret");
        let names: Vec<&str> = first.request.timeseries[0]
            .labels
            .iter()
            .map(|l| l.name.as_str())
            .collect();
        assert_eq!(
            names,
            ["__name__", "instance", "job", "n"],
            "who sent it, sorted"
        );
        // 503 and 429 were retried with the same samples; the 400 dropped
        // the second request, and the third went on.
        let sent: Vec<Vec<f64>> = got.iter().map(values).collect();
        assert_eq!(
            sent,
            [
                vec![0.0, 1.0, 2.0],
                vec![0.0, 1.0, 2.0],
                vec![0.0, 1.0, 2.0],
                vec![3.0, 4.0, 5.0],
                vec![6.0, 7.0, 8.0],
            ]
        );
        let stats = sent_at_least(&writers, 6);
        assert_eq!(stats.retried.load(Ordering::Relaxed), 6);
        assert_eq!(stats.dropped_rejected.load(Ordering::Relaxed), 3);
        assert_eq!(stats.requests_failed.load(Ordering::Relaxed), 3);
        let queue = writers.remotes[0].queue.clone();
        drop(writers);
        assert_eq!(queue.lock().unwrap().pending_samples(), 0);
    }

    /// A gateway that answers 504 after its backend took the samples: the
    /// same body sent again is refused as out of order. The samples are
    /// there, so none is counted dropped; a 400 for a body never answered
    /// otherwise still is.
    #[test]
    fn a_refusal_after_a_lost_answer_is_not_counted_dropped() {
        let dir = tempfile::tempdir().unwrap();
        let (port, requests) = fake_receiver(vec![504, 400, 400]);
        let config = three_a_request_quick_retries(port);
        let mut writers = start(dir.path(), &config);
        append_three_requests(&mut writers);
        let got: Vec<Vec<f64>> = (0..4)
            .map(|_| values(&requests.recv_timeout(Duration::from_secs(10)).unwrap()))
            .collect();
        assert_eq!(
            got,
            [
                vec![0.0, 1.0, 2.0],
                vec![0.0, 1.0, 2.0],
                vec![3.0, 4.0, 5.0],
                vec![6.0, 7.0, 8.0],
            ]
        );
        let stats = sent_at_least(&writers, 3);
        assert_eq!(
            stats.dropped_rejected.load(Ordering::Relaxed),
            3,
            "the second body only"
        );
    }

    /// A receiver that moved (a 307 or 308 to its new path, as a proxy or
    /// an ingress in front of Prometheus answers) gets the same samples at
    /// its new path, as Prometheus's own sender delivers them.
    #[test]
    fn a_temporary_or_permanent_redirect_is_followed_with_the_samples() {
        let dir = tempfile::tempdir().unwrap();
        let (port, requests) = fake_receiver(vec![307, 308]);
        let mut config = RemoteWriteConfig::new("fake", &format!("http://127.0.0.1:{port}/write"));
        config.min_backoff_secs = 0.01;
        config.max_backoff_secs = 0.02;
        let mut writers = start(dir.path(), &config);
        writers.append(&batch(0, 3));
        let got: Vec<Received> = (0..3)
            .map(|_| requests.recv_timeout(Duration::from_secs(10)).unwrap())
            .collect();
        let paths: Vec<&str> = got.iter().map(|r| r.path.as_str()).collect();
        assert_eq!(paths, ["/write", "/moved", "/moved"]);
        for r in &got {
            assert_eq!(values(r), [0.0, 1.0, 2.0]);
            assert_eq!(r.headers["content-encoding"], "snappy");
        }
        let stats = sent_at_least(&writers, 3);
        assert_eq!(stats.dropped_rejected.load(Ordering::Relaxed), 0);
    }

    /// A series a source's snapshot no longer has (a container that left)
    /// is sent Prometheus's stale marker at the snapshot's time, once; one
    /// still there, or appended outside a snapshot, is not.
    #[test]
    fn a_series_a_snapshot_no_longer_has_is_marked_stale() {
        let dir = tempfile::tempdir().unwrap();
        let (port, requests) = fake_receiver(vec![]);
        let mut config = RemoteWriteConfig::new("fake", &format!("http://127.0.0.1:{port}/write"));
        config.batch_send_deadline_secs = 0.01;
        let mut writers = start(dir.path(), &config);
        let source: Arc<str> = "cgroups".into();
        // The stale markers of every request until none comes for a while.
        let stale_markers = || -> Vec<(String, i64)> {
            let mut found = Vec::new();
            while let Ok(got) = requests.recv_timeout(Duration::from_millis(1500)) {
                for series in &got.request.timeseries {
                    let sample = &series.samples[0];
                    if sample.value.to_bits() == STALE_NAN_BITS {
                        let n = series.labels.iter().find(|l| l.name == "n").unwrap();
                        found.push((n.value.clone(), sample.timestamp));
                    }
                }
            }
            found.sort();
            found
        };
        // Series 0, 1, 2; then 0 and 1; then 0 and 1 again.
        let mut times = Vec::new();
        for rows in [3, 2, 2] {
            let b = batch(0, rows);
            writers.append_to_snapshot(&b);
            writers.end_snapshot(&source, b.time_us[0]);
            times.push(b.time_us[0] / 1000);
        }
        assert_eq!(stale_markers(), [("2".to_string(), times[1])]);
        // Outside a snapshot nothing ends; an empty snapshot (the source
        // failed) ends all it had.
        writers.append(&batch(5, 1));
        let failed_ms = now_ms();
        writers.end_snapshot(&source, failed_ms * 1000);
        assert_eq!(
            stale_markers(),
            [("0".to_string(), failed_ms), ("1".to_string(), failed_ms)]
        );
    }

    vtax_store::table! {
        static OTHER: TableDef, struct OtherRow {
            name: "u",
            help: "another test table",
            tags: [],
            fields: [w: f64 = FieldDef::gauge(FieldType::F64, Unit::None, "y")],
            exported: true,
        }
    }

    #[test]
    fn a_remote_with_tables_is_sent_those_tables_only() {
        let dir = tempfile::tempdir().unwrap();
        let (only_port, only_requests) = fake_receiver(vec![]);
        let (all_port, all_requests) = fake_receiver(vec![]);
        let mut only = RemoteWriteConfig::new("only", &format!("http://127.0.0.1:{only_port}/w"));
        only.tables = Some(vec!["u".into()]);
        let all = RemoteWriteConfig::new("all", &format!("http://127.0.0.1:{all_port}/w"));
        for config in [&only, &all] {
            config.validate().unwrap();
        }
        assert!(!only.sends("t") && only.sends("u") && all.sends("t"));
        let exposition = Exposition::new(&[&TABLE]);
        let (rows, _) = vtax_store::hub::channel(16);
        let mut writers = RemoteWriters::start(
            &[only, all],
            dir.path(),
            Duration::from_secs(1),
            &exposition,
            rows,
        )
        .unwrap();
        writers.append(&batch(0, 3));
        let mut other = BatchBuilder::new(&OTHER);
        other
            .push_row(now_ms() * 1000, &OtherRow { w: 42.0 })
            .unwrap();
        writers.append(&other.finish());
        let metric_names = |requests: &mpsc::Receiver<Received>, series: usize| {
            let mut names = Vec::new();
            while names.len() < series {
                let got = requests.recv_timeout(Duration::from_secs(10)).unwrap();
                for s in got.request.timeseries {
                    let name = s.labels.iter().find(|l| l.name == "__name__").unwrap();
                    names.push(name.value.clone());
                }
            }
            names.sort();
            names
        };
        assert_eq!(metric_names(&only_requests, 1), ["vtax_u_w"]);
        assert_eq!(
            metric_names(&all_requests, 4),
            ["vtax_t_v", "vtax_t_v", "vtax_t_v", "vtax_u_w"]
        );
        drop(writers);
        assert!(
            only_requests.try_recv().is_err(),
            "nothing of table t reached the remote that asked for u only"
        );
    }

    #[test]
    fn an_unreachable_receiver_keeps_everything_queued_for_the_next_start() {
        let dir = tempfile::tempdir().unwrap();
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port(); // closed again: connections are refused
        let mut config = RemoteWriteConfig::new("down", &format!("http://127.0.0.1:{port}/write"));
        config.max_samples_per_send = 2;
        config.batch_send_deadline_secs = 0.05;
        queue_while_failing(dir.path(), &config, 5);

        let (port, requests) = fake_receiver(vec![]);
        config.url = format!("http://127.0.0.1:{port}/write");
        let writers = start(dir.path(), &config);
        let got: Vec<f64> = (0..3)
            .flat_map(|_| values(&requests.recv_timeout(Duration::from_secs(10)).unwrap()))
            .collect();
        assert_eq!(got, [0.0, 1.0, 2.0, 3.0, 4.0]);
        drop(writers);
    }

    /// A server config for a self-signed `localhost` certificate, whose PEM
    /// is written to `ca`.
    fn tls_server(ca: &Path) -> Arc<rustls::ServerConfig> {
        let cert = rcgen::generate_simple_self_signed(vec!["localhost".into()]).unwrap();
        std::fs::write(ca, cert.cert.pem()).unwrap();
        let key = pki_types::PrivateKeyDer::Pkcs8(cert.signing_key.serialize_der().into());
        let config = rustls::ServerConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(vec![cert.cert.der().clone()], key)
        .unwrap();
        Arc::new(config)
    }

    #[test]
    fn https_with_a_ca_file_and_basic_auth_from_a_password_file() {
        let dir = tempfile::tempdir().unwrap();
        let ca = dir.path().join("ca.crt");
        let (port, requests) = fake_receiver_with(vec![], Some(tls_server(&ca)));
        let password = dir.path().join("password");
        std::fs::write(&password, "pa55\n").unwrap();
        let mut config = RemoteWriteConfig::new("tls", &format!("https://localhost:{port}/w"));
        config.tls = Some(config::TlsConfig {
            ca_file: Some(ca),
            ..Default::default()
        });
        config.basic_auth = Some(config::BasicAuth {
            username: "vtax".into(),
            password: None,
            password_file: Some(password),
        });
        config.max_samples_per_send = 2;
        config.validate().unwrap();
        let mut writers = start(dir.path(), &config);
        writers.append(&batch(0, 2));
        let got = requests.recv_timeout(Duration::from_secs(10)).unwrap();
        use base64::Engine as _;
        let expected = base64::engine::general_purpose::STANDARD.encode("vtax:pa55");
        assert_eq!(got.headers["authorization"], format!("Basic {expected}"));
        assert_eq!(values(&got), [0.0, 1.0]);
    }

    #[test]
    fn an_untrusted_certificate_is_refused_unless_verification_is_skipped() {
        let dir = tempfile::tempdir().unwrap();
        let (port, requests) =
            fake_receiver_with(vec![], Some(tls_server(&dir.path().join("ca.crt"))));
        let mut config = RemoteWriteConfig::new("tls", &format!("https://localhost:{port}/w"));
        config.max_samples_per_send = 1;
        // Trusting only the system's CAs: the handshake fails, and is retried.
        queue_while_failing(dir.path(), &config, 1);
        assert!(requests.try_recv().is_err());

        config.tls = Some(config::TlsConfig {
            insecure_skip_verify: true,
            ..Default::default()
        });
        let writers = start(dir.path(), &config);
        let got = requests.recv_timeout(Duration::from_secs(10)).unwrap();
        assert_eq!(values(&got), [0.0], "the queued sample went once trusted");
        drop(writers);
    }
}
