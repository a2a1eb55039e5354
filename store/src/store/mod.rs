//! The writable store: WAL, buckets, publishing, compaction, retention.

use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use crate::batch::Batch;
use crate::bucket::Bucket;
use crate::error::{Error, Result};
use crate::files::{self, FileInfo, WriteOptions};
use crate::log_limit::Repeats;
use crate::wal::{self, WalWriter};
use crate::{Catalog, DAY_US, HOUR_US};

mod maintenance;

pub use maintenance::*;

/// Default interval between WAL fsyncs (group commit).
pub const DEFAULT_SYNC_INTERVAL: Duration = Duration::from_secs(1);
/// Default bound on rows buffered in memory before the largest bucket is published early.
pub const DEFAULT_MAX_BUFFERED_BYTES: usize = 32 << 20;
/// Default wait after an hour ends before its buckets are published, for late rows.
pub const DEFAULT_PUBLISH_GRACE: Duration = Duration::from_secs(60);

/// Default of [`StoreOptions::max_publish_delay`]: rows reach the Parquet
/// files that DuckDB, Polars or Spark read within five minutes, and the
/// running hour's parts (twelve an hour at most, per table) merge in tiers.
pub const DEFAULT_MAX_PUBLISH_DELAY: Duration = Duration::from_secs(300);

/// How to open a store.
#[derive(Clone, Debug)]
pub struct StoreOptions {
    /// The data directory.
    pub data_dir: PathBuf,
    /// Node name written into file names and metadata.
    pub node: String,
    /// Interval between WAL fsyncs.
    pub sync_interval: Duration,
    /// Memory bound on buffered rows.
    pub max_buffered_bytes: usize,
    /// Wait after an hour ends before publishing it.
    pub publish_grace: Duration,
    /// Most time a row waits in memory (and the WAL) before [`Store::tick`]
    /// publishes its bucket as a part file, so that readers of the files see
    /// it; `None` waits for the hour's end (or the memory bound).
    pub max_publish_delay: Option<Duration>,
    /// Delete files whose whole day is older than this.
    pub retention_max_age: Option<Duration>,
    /// Delete the oldest files while the tables hold more bytes than this.
    pub retention_max_bytes: Option<u64>,
    /// When set, retention deletes only files it says yes to (the agent's
    /// uploader: files whose upload is confirmed); the others are kept, even
    /// past the age or byte bound.
    pub retention_deletable: Option<Deletable>,
    /// Parquet encoding choices.
    pub write: WriteOptions,
    /// WAL segment size.
    pub wal_segment_bytes: u64,
    /// Bytes the WAL buffers in memory after writes fail before rejecting rows.
    pub wal_max_backlog_bytes: usize,
    /// Most files one merge reads (at least 2). A merge holds every input's
    /// footer, a ZSTD context and a decompressed page each; fewer inputs cost
    /// more rounds (a day's 24 hours: 24 to 3 to 1 at 8, 24 to 6 to 2 to 1 at 4).
    pub max_merge_inputs: usize,
    /// The table (`vtax import`'s `scraped`) whose rows are published one per
    /// series and instant, the first to arrive, as an import's merges keep
    /// them (`Store::compact_all`): an hour an import wrote in one part is
    /// not merged, and two files of one import that share samples would
    /// leave that part with each of them twice. Every other table keeps
    /// every row: the agent's own rows found in the WAL are published as the
    /// agent wrote them.
    pub one_row_per_instant: Option<&'static str>,
}

impl StoreOptions {
    /// Defaults for a data directory.
    pub fn new(data_dir: impl Into<PathBuf>) -> Self {
        StoreOptions {
            data_dir: data_dir.into(),
            node: node_name(),
            sync_interval: DEFAULT_SYNC_INTERVAL,
            max_buffered_bytes: DEFAULT_MAX_BUFFERED_BYTES,
            publish_grace: DEFAULT_PUBLISH_GRACE,
            max_publish_delay: Some(DEFAULT_MAX_PUBLISH_DELAY),
            retention_max_age: None,
            retention_max_bytes: None,
            retention_deletable: None,
            write: WriteOptions::default(),
            wal_segment_bytes: wal::DEFAULT_SEGMENT_BYTES,
            wal_max_backlog_bytes: wal::DEFAULT_MAX_BACKLOG_BYTES,
            max_merge_inputs: DEFAULT_MAX_MERGE_INPUTS,
            one_row_per_instant: None,
        }
    }
}

/// Says whether retention may delete a file; see [`StoreOptions::retention_deletable`].
#[derive(Clone)]
pub struct Deletable(pub Arc<dyn Fn(&FileInfo) -> bool + Send + Sync>);

impl std::fmt::Debug for Deletable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Deletable(..)")
    }
}

/// Most characters in a node name: what leaves the longest file name it
/// makes (`.<node>-<first_time_us>-<max_seq>-<n>.parquet.pending`, 64
/// characters besides the name at most) within the 255 bytes a filesystem
/// allows. A DNS name may have 253, but with over 191 the store could
/// write no file and lost what it held at the first flush.
pub const NODE_NAME_MAX_CHARS: usize = 190;

/// Checks a node name, which names the store's files
/// (`<node>-<first_time_us>-<max_seq>.parquet`), a fleet copy's `node=`
/// partition and, by default, remote write's `instance` label: 1 to 190 ASCII
/// letters, digits, '-', '.' and '_', starting and ending with a letter or
/// digit. Host names and Kubernetes node names (RFC 1123: lower-case letters,
/// digits, '-' and '.') pass as they are, and so do names of the earlier rule
/// (letters, digits, '.' and '_'), which already name files on disk. The
/// message says what is wrong.
pub fn check_node_name(name: &str) -> std::result::Result<(), String> {
    let allowed = |c: char| c.is_ascii_alphanumeric() || matches!(c, '-' | '.' | '_');
    if name.is_empty() {
        return Err("a node name cannot be empty".into());
    }
    if name.len() > NODE_NAME_MAX_CHARS {
        return Err(format!(
            "{} characters, more than {NODE_NAME_MAX_CHARS} (a file named after it would pass the filesystem's 255 bytes)",
            name.len()
        ));
    }
    if let Some(bad) = name.chars().find(|&c| !allowed(c)) {
        return Err(format!(
            "{bad:?} is not allowed: use letters, digits, '-', '.' and '_' (it names files and the node= partition)"
        ));
    }
    let alnum = |c: Option<char>| c.is_some_and(|c| c.is_ascii_alphanumeric());
    if !alnum(name.chars().next()) || !alnum(name.chars().next_back()) {
        return Err("it must start and end with a letter or digit".into());
    }
    Ok(())
}

/// The host name, the node's name unless one is configured. A host name that
/// [`check_node_name`] refuses (rare: the kernel takes any bytes) has each
/// character outside the rule replaced with '-' and its ends trimmed to a
/// letter or digit; "node" when nothing is left.
pub fn node_name() -> String {
    let raw = fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
    node_name_from_host(&raw)
}

fn node_name_from_host(raw: &str) -> String {
    let raw = raw.trim();
    if check_node_name(raw).is_ok() {
        return raw.to_string();
    }
    let clean: String = raw
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '.' | '_') {
                c
            } else {
                '-'
            }
        })
        .take(NODE_NAME_MAX_CHARS)
        .collect();
    let clean = clean.trim_matches(|c: char| !c.is_ascii_alphanumeric());
    if clean.is_empty() {
        "node".into()
    } else {
        clean.to_string()
    }
}

/// Counters the store keeps; the agent exports them.
#[derive(Clone, Debug, Default)]
pub struct StoreStats {
    /// Rows accepted by `append`.
    pub rows_appended: u64,
    /// Rows `append` refused (the WAL's backlog bound reached after failed
    /// writes, or a table not in the catalog): they are in no file and no WAL.
    pub rows_refused: u64,
    /// Rows restored from the WAL on open.
    pub rows_replayed: u64,
    /// Rows left out of a file, by table, as publishes that keep one row per
    /// series and instant (an import's) and merges leave them: they repeated
    /// a series and time already held, whose first row was kept.
    pub rows_repeated: BTreeMap<&'static str, u64>,
    /// Files published (including compactions).
    pub files_published: u64,
    /// Files put in quarantine: Parquet files moved there, damaged WAL segments
    /// copied there.
    pub files_quarantined: u64,
    /// Files the store could not read at open for an OS error (permissions,
    /// a failing disk): left where they are, out of the index.
    pub files_unreadable: u64,
    /// Damaged files the open could not move to quarantine (something in
    /// the way there, a link): left where they are, out of the index.
    pub files_damaged_in_place: u64,
    /// Failed writes (WAL or Parquet), e.g. disk full.
    pub write_errors: u64,
    /// Failed writes that were the disk being full.
    pub disk_full_errors: u64,
    /// Files deleted by retention.
    pub files_retained_away: u64,
    /// Bytes cut off a torn WAL tail on open.
    pub wal_torn_bytes: u64,
    /// Completed WAL fsyncs.
    pub wal_syncs: u64,
    /// When the last Parquet file (a publish or a merge) was written and
    /// renamed into place; none since open.
    pub last_file_written: Option<SystemTime>,
}

/// A store open for writing. One per data directory (a lock file enforces it).
pub struct Store {
    options: StoreOptions,
    catalog: Catalog,
    wal: WalWriter,
    buckets: BTreeMap<(&'static str, i64), Bucket>,
    /// When [`Self::tick`] first saw each bucket: its oldest row has waited
    /// at least since then.
    buffered_since: HashMap<(&'static str, i64), Instant>,
    /// Published files, by table then day.
    files: BTreeMap<(String, i64), Vec<FileInfo>>,
    stats: StoreStats,
    last_sync: Instant,
    /// The wall-clock time of the last `tick` or `compact`: what tells a
    /// part of the running hour from a finished hour's. `None` (an importer
    /// that never ticks) takes every hour for finished.
    clock_us: Option<i64>,
    /// Failed WAL fsyncs logged: a failing disk fails one every sync.
    fsync_failures_logged: Repeats,
    /// Where a merge stops dead, for tests ([`Self::kill_merges_at`]).
    merge_kill_step: Option<usize>,
    _lock: File,
}

impl Store {
    /// Opens (creating if needed) the store: takes the lock, removes stray temp
    /// files, verifies every file's footer (quarantining failures), finishes any
    /// interrupted merge (see [`Self::finish_merge`]), and replays the WAL.
    pub fn open(options: StoreOptions, catalog: Catalog) -> Result<Self> {
        check_node_name(&options.node).map_err(|reason| Error::NodeName {
            name: options.node.clone(),
            reason,
        })?;
        let dir = options.data_dir.clone();
        crate::regular_file::create_dirs(&dir).map_err(Error::io("create", &dir))?;
        let lock = lock(&dir)?;
        // `tables/` a link: every file would be read through it and none
        // written (a publish opens its partition without following one), so
        // rows piled up in the WAL and memory, said once a minute after the
        // first publish. Said at once instead.
        let tables = dir.join("tables");
        if tables
            .symlink_metadata()
            .is_ok_and(|m| m.file_type().is_symlink())
        {
            return Err(Error::io("open", &tables)(io::Error::new(
                io::ErrorKind::InvalidData,
                "a symbolic link: the store neither reads nor writes below a link, which a \
                 command run as root would follow wherever it points; move the tables in, or \
                 make the data directory itself the link",
            )));
        }
        let mut stats = StoreStats::default();
        let (listed, strays) = files::list_files(&dir)?;
        for foreign in files::foreign_partitions(&dir) {
            let (path, parquet_files) = (foreign.path.display(), foreign.parquet_files);
            if foreign.linked {
                tracing::warn!(path = %path, "A table or partition of the store is a symbolic link: the store neither reads nor writes below it (retention, quarantine and compaction would act where it points, outside the store), while a glob of the table follows it. Move its files in, or make the data directory itself the link.");
            } else {
                tracing::warn!(path = %path, parquet_files, "A directory under a table is not named as a partition (date=YYYY-MM-DD): the store reads none of its files, while a glob of the table reads them all. Rename it to its date or move it out of tables/.");
            }
        }
        for stray in strays {
            // A stray that cannot go (its permissions) is read by no one:
            // it stays, named, rather than keep the store from opening.
            if let Err(e) = fs::remove_file(&stray) {
                tracing::warn!(path = %stray.display(), error = %e, "A stray temporary file of a publish could not be removed; readers pass over it.");
            }
        }
        let mut index = files::index_files(listed, |file, e| {
            if e.damaged_file().is_none() {
                // An OS error (permissions, a failing disk) says nothing of
                // the file's bytes: it stays where it is, out of the index
                // until a start can read it.
                stats.files_unreadable += 1;
                tracing::error!(path = %file.path.display(), error = %e, "A file could not be read; it stays where it is, its rows unread until it can be.");
                return Ok(());
            }
            // A move that cannot be made (something in the way under
            // quarantine/) leaves the file where it is and out of the index:
            // it costs the move, not the start.
            if let Err(moving) = quarantine(&dir, &file.path) {
                stats.files_damaged_in_place += 1;
                tracing::error!(path = %file.path.display(), error = %e, moving = %moving, "A file failed verification and could not be moved to quarantine; it stays where it is, its rows unread.");
                return Ok(());
            }
            stats.files_quarantined += 1;
            tracing::error!(path = %file.path.display(), error = %e, "Moved a file that failed verification to quarantine.");
            Ok(())
        })?;
        for merged in keep_inputs_of_damaged_merges(&mut index) {
            stats.files_quarantined += 1;
            quarantine(&dir, &merged.path)?;
        }
        let mut by_partition = index.live;
        finish_interrupted_merges(&dir, &index.replaced, &mut by_partition)?;

        let wal_dir = dir.join("wal");
        let watermarks = watermarks_by_bucket(&by_partition);
        let mut buckets: BTreeMap<(&'static str, i64), Bucket> = BTreeMap::new();
        let report = wal::replay(&wal_dir, &catalog, true, |frame| {
            let table = frame.batch.table;
            if is_published(&watermarks, table.name, frame.hour, frame.seq) {
                return Ok(());
            }
            stats.rows_replayed += frame.batch.len() as u64;
            buckets
                .entry((table.name, frame.hour))
                .or_insert_with(|| Bucket::new(table, frame.hour))
                .absorb(frame.seq, &frame.batch);
            Ok(())
        })?;
        stats.wal_torn_bytes = report.torn_bytes;
        let set_aside = report.set_aside_segments.iter().map(|(path, _)| path);
        let mut met_before = Vec::new();
        let segments: std::collections::BTreeSet<&PathBuf> =
            report.damaged_segments.iter().chain(set_aside).collect();
        for path in segments {
            // The segment stays where it is until its intact frames are
            // published; the copy keeps the damage for whoever looks into it.
            // A copy that cannot be made (something in the way under
            // quarantine/, a full disk) costs the copy, not the start.
            match copy_to_quarantine(&dir, path) {
                Ok(true) => {
                    stats.files_quarantined += 1;
                    tracing::error!(path = %path.display(), "Copied a WAL segment to quarantine.");
                }
                Ok(false) => met_before.push(path),
                Err(e) => {
                    tracing::error!(path = %path.display(), error = %e, "A damaged WAL segment could not be copied to quarantine; it stays in place, its intact frames replayed.");
                }
            }
        }
        // A segment copied at an earlier start was reported then: it stays
        // until its hour is published, and is only noted again.
        let new_damage = report
            .damaged_segments
            .iter()
            .filter(|p| !met_before.contains(p))
            .count();
        if new_damage > 0 {
            tracing::error!(
                segments = new_damage,
                damaged_bytes = report.damaged_bytes,
                "WAL segments are damaged: the rows of their damaged frames are lost; every intact frame was replayed."
            );
        }
        for (path, reason) in &report.set_aside_segments {
            if !met_before.contains(&path) {
                tracing::error!(path = %path.display(), reason = %reason, frames_skipped = report.frames_skipped, "A WAL segment holds rows this build's tables cannot hold in full (written by another vtax?); a copy is kept in quarantine.");
            }
        }
        for path in met_before {
            tracing::info!(path = %path.display(), "A WAL segment still holds the damage (or other build's rows) copied to quarantine at an earlier start; its intact frames were replayed.");
        }
        // A publish can run ahead of the WAL (rows appended, published, never
        // written to the log before a crash), so sequence numbers resume above
        // every watermark too: a new frame must never look already published.
        let highest_published = watermarks
            .values()
            .flat_map(|h| h.values())
            .copied()
            .max()
            .unwrap_or(0);
        let next_seq = report.next_seq.max(highest_published + 1);
        let wal = WalWriter::create(
            &wal_dir,
            next_seq,
            options.wal_segment_bytes,
            options.wal_max_backlog_bytes,
        )?;
        if stats.rows_replayed > 0 {
            tracing::info!(
                rows = stats.rows_replayed,
                frames = report.frames,
                "Replayed rows from the WAL."
            );
        }
        Ok(Store {
            options,
            catalog,
            wal,
            buckets,
            buffered_since: HashMap::new(),
            files: by_partition,
            stats,
            last_sync: Instant::now(),
            clock_us: None,
            fsync_failures_logged: Repeats::default(),
            merge_kill_step: None,
            _lock: lock,
        })
    }

    /// Makes every merge from now on stop dead at `step` of its commit, by
    /// panicking there, as a kill at that instant would stop it: 0 while its
    /// file is being written; 1 once the file is in place under its pending
    /// name; 1 + k once k of its n inputs are deleted; n + 1 once all are,
    /// before the file takes its published name. For tests of what each
    /// instant leaves on disk; `None` (the default) stops nothing.
    #[doc(hidden)]
    pub fn kill_merges_at(&mut self, step: Option<usize>) {
        self.merge_kill_step = step;
    }

    /// The tables this store knows.
    pub fn catalog(&self) -> &Catalog {
        &self.catalog
    }

    /// The options it was opened with.
    pub fn options(&self) -> &StoreOptions {
        &self.options
    }

    /// Counters.
    pub fn stats(&self) -> &StoreStats {
        &self.stats
    }

    /// Rows buffered in memory, not yet in a file.
    pub fn buffered_rows(&self) -> usize {
        self.buckets.values().map(Bucket::rows).sum()
    }

    /// Appends rows. They are visible to scans at once and durable after the next
    /// completed [`Self::sync`]. Returns the highest WAL sequence number used.
    pub fn append(&mut self, batch: &Batch) -> Result<u64> {
        let appended = self.append_rows(batch);
        if appended.is_err() {
            self.stats.rows_refused += batch.len() as u64;
        }
        appended
    }

    fn append_rows(&mut self, batch: &Batch) -> Result<u64> {
        if self.catalog.get(batch.table.name).is_none() {
            return Err(Error::Schema(format!(
                "table {} is not in this store's catalog",
                batch.table.name
            )));
        }
        if batch.is_empty() {
            return Ok(self.wal.next_seq().saturating_sub(1));
        }
        // Once for the batch: refused part way through its hours, a batch
        // would be kept in part and reported refused in full.
        if let Err(e) = self.wal.admit() {
            self.count_error(&e);
            return Err(e);
        }
        let mut last = 0;
        for (hour, part) in split_by_hour(batch) {
            let part = part.as_ref().unwrap_or(batch);
            let seq = self.wal.append(hour, part);
            self.buckets
                .entry((batch.table.name, hour))
                .or_insert_with(|| Bucket::new(batch.table, hour))
                .absorb(seq, part);
            last = seq;
        }
        self.stats.rows_appended += batch.len() as u64;
        Ok(last)
    }

    /// Writes and fsyncs the WAL. Returns the sequence number below which every
    /// frame is durable.
    pub fn sync(&mut self) -> Result<u64> {
        self.last_sync = Instant::now();
        match self.wal.sync() {
            Ok(durable) => {
                self.stats.wal_syncs += 1;
                Ok(durable)
            }
            Err(e) => {
                self.count_error(&e);
                if self.wal.fsync_failed() {
                    if let Some(not_logged) = self.fsync_failures_logged.occurred(&e.kind()) {
                        tracing::error!(error = %e, repeats_not_logged = not_logged, "A WAL fsync failed; publishing every buffered row to Parquet and starting a new WAL segment.");
                    }
                    // Each published file is fsynced on its own, so once every bucket
                    // is out, no row depends on the suspect segment any more.
                    self.publish_all()?;
                    self.wal.abandon_segment()?;
                    return Ok(self.wal.durable_below());
                }
                Err(e)
            }
        }
    }

    /// Every WAL frame below this sequence number is durable.
    pub fn durable_below(&self) -> u64 {
        self.wal.durable_below()
    }

    /// Periodic work: fsync when the interval is due, publish buckets whose hour
    /// is over (after the grace), that waited [`StoreOptions::max_publish_delay`]
    /// or that push memory over its bound, and drop WAL segments that are fully
    /// published. `now_us` is wall-clock time.
    pub fn tick(&mut self, now_us: i64) -> Result<()> {
        self.clock_us = Some(now_us);
        if self.last_sync.elapsed() >= self.options.sync_interval {
            self.sync()?;
        }
        let now = Instant::now();
        for key in self.buckets.keys() {
            self.buffered_since.entry(*key).or_insert(now);
        }
        let waited_enough = |key: &(&'static str, i64)| {
            self.options.max_publish_delay.is_some_and(|delay| {
                self.buffered_since
                    .get(key)
                    .is_some_and(|since| now.duration_since(*since) >= delay)
            })
        };
        let due: Vec<_> = self
            .buckets
            .iter()
            .filter(|(k, b)| self.hour_over(b.hour, now_us) || waited_enough(k))
            .map(|(k, _)| *k)
            .collect();
        // A bucket that cannot be published (its partition unwritable) waits
        // for the next tick; the others go on to their files.
        let mut failed = Vec::new();
        let mut first_error = None;
        for key in due {
            if let Err(e) = self.publish_bucket(key) {
                failed.push(key);
                first_error.get_or_insert(e);
            }
        }
        let over_budget = self.publish_over_budget_but(failed);
        match first_error {
            Some(e) => Err(e),
            None => over_budget,
        }
    }

    /// Publishes the largest buckets until buffered rows fit the memory bound.
    /// Importers call this instead of [`Self::tick`], which would publish every
    /// past hour at once and leave many small files.
    pub fn publish_over_budget(&mut self) -> Result<()> {
        self.publish_over_budget_but(Vec::new())
    }

    /// [`Self::publish_over_budget`], not trying again the buckets that
    /// `failed` to publish this tick.
    fn publish_over_budget_but(&mut self, mut failed: Vec<(&'static str, i64)>) -> Result<()> {
        let mut first_error = None;
        while self.buckets.values().map(Bucket::bytes).sum::<usize>()
            > self.options.max_buffered_bytes
        {
            // The largest bucket not failed already: one that cannot be
            // published leaves the bound to the others.
            let Some(key) = self
                .buckets
                .iter()
                .filter(|(k, _)| !failed.contains(*k))
                .max_by_key(|(_, b)| b.bytes())
                .map(|(k, _)| *k)
            else {
                break;
            };
            if let Err(e) = self.publish_bucket(key) {
                failed.push(key);
                first_error.get_or_insert(e);
            }
        }
        first_error.map_or(Ok(()), Err)
    }

    /// Fsyncs the WAL, then publishes every buffered row (a partial hour
    /// becomes a file of its own), so that the files are complete for other
    /// readers. The WAL first: a table that cannot be published (a full
    /// disk, a partition that is a link) keeps its rows in the WAL, synced,
    /// for the next try or the next start. Published first, the failure
    /// returned before the sync, and at a stop the rows since the last sync
    /// went with the process. Where both fail (a full disk), the publish's
    /// error is the one returned: it names the file the flush was writing.
    pub fn flush(&mut self) -> Result<()> {
        let synced = self.sync().map(drop);
        let published = self.publish_all();
        published.and(synced)
    }

    fn publish_all(&mut self) -> Result<()> {
        let keys: Vec<_> = self.buckets.keys().copied().collect();
        let mut first_error = None;
        for key in keys {
            if let Err(e) = self.publish_bucket(key) {
                first_error.get_or_insert(e);
            }
        }
        first_error.map_or(Ok(()), Err)
    }

    /// Flushes and releases the store. Every row is then in a published file, so
    /// the WAL is retired too: a stopped store is its Parquet files.
    pub fn close(mut self) -> Result<()> {
        self.flush()?;
        self.wal.rotate()?;
        self.drop_published_wal()
    }

    fn publish_bucket(&mut self, key: (&'static str, i64)) -> Result<()> {
        let Some(bucket) = self.buckets.get(&key) else {
            return Ok(());
        };
        if bucket.rows() == 0 {
            self.buckets.remove(&key);
            self.buffered_since.remove(&key);
            return Ok(());
        }
        let first_time = bucket.min_time().expect("a bucket with rows has a time");
        let watermarks = BTreeMap::from([(bucket.hour, bucket.last_seq)]);
        let running = self
            .clock_us
            .is_some_and(|now| !self.hour_over(bucket.hour, now));
        let options = self.write_options(running);
        let one_row_per_instant = self.options.one_row_per_instant == Some(bucket.table.name);
        let mut columns = crate::bucket::BucketColumns::new(bucket, one_row_per_instant);
        let repeats = bucket.rows() - columns.rows();
        let published = files::publish(
            &self.options.data_dir,
            &self.options.node,
            bucket.table,
            first_time,
            &mut columns,
            &watermarks,
            &[],
            &[],
            &options,
            &|_| false,
            files::PublishAs::Published,
        );
        let info = match published {
            Ok(info) => info,
            Err(e) => {
                self.count_error(&e);
                return Err(e);
            }
        };
        if repeats > 0 {
            *self
                .stats
                .rows_repeated
                .entry(bucket.table.name)
                .or_default() += repeats as u64;
            tracing::info!(path = %info.path.display(), duplicates = repeats, "Published rows that repeat a series and time: the first kept.");
        }
        self.stats.files_published += 1;
        self.stats.last_file_written = Some(SystemTime::now());
        self.files
            .entry((info.table.clone(), info.day))
            .or_default()
            .push(info);
        self.buckets.remove(&key);
        self.buffered_since.remove(&key);
        self.drop_published_wal()
    }

    /// Whether `hour` has been over for longer than the publish grace at
    /// `now_us`: no row of it is expected any more.
    fn hour_over(&self, hour: i64, now_us: i64) -> bool {
        let grace_us = self.options.publish_grace.as_micros() as i64;
        (hour + 1) * HOUR_US + grace_us <= now_us
    }

    /// The write options for a part of the running hour (short pages) or
    /// for a finished hour's file.
    fn write_options(&self, running: bool) -> Cow<'_, WriteOptions> {
        if running {
            Cow::Owned(self.options.write.for_running_hour())
        } else {
            Cow::Borrowed(&self.options.write)
        }
    }

    fn drop_published_wal(&mut self) -> Result<()> {
        let lowest_buffered = self
            .buckets
            .values()
            .map(|b| b.first_seq)
            .min()
            .unwrap_or(u64::MAX)
            .min(self.wal.durable_below());
        self.wal.remove_segments_below(lowest_buffered)?;
        Ok(())
    }

    fn count_error(&mut self, e: &Error) {
        self.stats.write_errors += 1;
        if e.is_disk_full() {
            self.stats.disk_full_errors += 1;
        }
    }

    /// Published files of every table, oldest partition first.
    pub fn files(&self) -> impl Iterator<Item = &FileInfo> {
        self.files.values().flatten()
    }

    /// Bytes of the published files of every table: what
    /// [`StoreOptions::retention_max_bytes`] bounds. Summed from what the store
    /// recorded at each publish, not from a walk of the directory.
    pub fn table_bytes(&self) -> u64 {
        self.files().map(|f| f.bytes).sum()
    }

    /// Bytes of the WAL's segments on disk.
    pub fn wal_bytes(&self) -> u64 {
        self.wal.disk_bytes()
    }

    /// Bytes of WAL frames appended but not yet written: after failed writes
    /// (a full disk), the backlog that each sync writes what fits of.
    pub fn wal_backlog_bytes(&self) -> usize {
        self.wal.pending_bytes()
    }

    /// Buffered rows of `table`, for scans.
    pub(crate) fn buffered<'a>(&'a self, table: &'a str) -> impl Iterator<Item = &'a Bucket> {
        self.buckets
            .iter()
            .filter(move |((t, _), _)| *t == table)
            .map(|(_, b)| b)
    }

    pub(crate) fn file_infos<'a>(&'a self, table: &'a str) -> impl Iterator<Item = &'a FileInfo> {
        self.files
            .iter()
            .filter(move |((t, _), _)| t == table)
            .flat_map(|(_, f)| f)
    }
}

/// Bound on merge rounds in one `compact` call or one cycle of the agent's
/// background compaction.
pub(crate) const MAX_MERGE_ROUNDS: usize = 8;

/// Per table, per bucket hour, the highest watermark among the files: frames at or
/// below it are published.
pub(crate) type Watermarks = HashMap<String, HashMap<i64, u64>>;

pub(crate) fn watermarks_by_bucket(files: &BTreeMap<(String, i64), Vec<FileInfo>>) -> Watermarks {
    let mut out: Watermarks = HashMap::new();
    for info in files.values().flatten() {
        let table = out.entry(info.table.clone()).or_default();
        for (&hour, &seq) in &info.watermarks {
            let w = table.entry(hour).or_insert(0);
            *w = seq.max(*w);
        }
    }
    out
}

/// Whether a WAL frame is already in a published file.
pub(crate) fn is_published(watermarks: &Watermarks, table: &str, hour: i64, seq: u64) -> bool {
    watermarks
        .get(table)
        .and_then(|hours| hours.get(&hour))
        .is_some_and(|&w| seq <= w)
}

/// Splits a batch into one part per UTC hour; `None` when it already lies in one.
fn split_by_hour(batch: &Batch) -> Vec<(i64, Option<Batch>)> {
    let hour_of = |t: i64| t.div_euclid(HOUR_US);
    let first = hour_of(batch.time_us[0]);
    if batch.time_us.iter().all(|&t| hour_of(t) == first) {
        return vec![(first, None)];
    }
    let mut by_hour: BTreeMap<i64, Vec<usize>> = BTreeMap::new();
    for (i, &t) in batch.time_us.iter().enumerate() {
        by_hour.entry(hour_of(t)).or_default().push(i);
    }
    by_hour
        .into_iter()
        .map(|(hour, rows)| (hour, Some(select_rows(batch, &rows))))
        .collect()
}

fn select_rows(batch: &Batch, rows: &[usize]) -> Batch {
    let mut out = Batch::new(batch.table);
    out.time_us = rows.iter().map(|&i| batch.time_us[i]).collect();
    for (mine, theirs) in out.tags.iter_mut().zip(&batch.tags) {
        mine.dict = theirs.dict.clone();
        mine.codes = rows.iter().map(|&i| theirs.codes[i]).collect();
    }
    for (mine, theirs) in out.fields.iter_mut().zip(&batch.fields) {
        for &i in rows {
            mine.extend_from(theirs, i..i + 1);
        }
    }
    out
}

/// Whether a process holds the store at `dir` open for writing (its lock is
/// taken), without taking it. A reader that finds no writer knows that
/// nothing will publish, merge or delete files until one starts.
pub fn open_for_writing(dir: &Path) -> Result<bool> {
    let path = dir.join("LOCK");
    let file = match crate::regular_file::open_read(&path) {
        Ok(file) => file,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(false),
        Err(e) => return Err(Error::io("open lock file", &path)(e)),
    };
    // SAFETY: flock on an fd we own; no memory is touched. A shared lock
    // fails only against the writer's exclusive one, and goes with the fd.
    let rc = unsafe {
        libc::flock(
            std::os::fd::AsRawFd::as_raw_fd(&file),
            libc::LOCK_SH | libc::LOCK_NB,
        )
    };
    if rc == 0 {
        return Ok(false);
    }
    let e = std::io::Error::last_os_error();
    if e.kind() == std::io::ErrorKind::WouldBlock {
        Ok(true)
    } else {
        Err(Error::io("probe lock file", &path)(e))
    }
}

fn lock(dir: &Path) -> Result<File> {
    let path = dir.join("LOCK");
    let mut file = crate::regular_file::open_or_create(
        &path,
        OpenOptions::new()
            .create(true)
            .truncate(false)
            .read(true)
            .write(true),
    )
    .map_err(Error::io("open lock file", &path))?;
    // SAFETY: flock on an fd we own; no memory is touched.
    let rc = unsafe {
        libc::flock(
            std::os::fd::AsRawFd::as_raw_fd(&file),
            libc::LOCK_EX | libc::LOCK_NB,
        )
    };
    if rc != 0 {
        let holder = crate::regular_file::read_to_string(&path).unwrap_or_default();
        return Err(Error::Locked {
            path: dir.to_owned(),
            holder: format!("pid {}", holder.trim()),
        });
    }
    file.set_len(0)
        .map_err(Error::io("write lock file", &path))?;
    write!(file, "{}", std::process::id()).map_err(Error::io("write lock file", &path))?;
    Ok(file)
}

/// Copies `path` to where [`quarantine`] would move it, unless a copy of the
/// same length is there already (an earlier open copied it). True when copied.
fn copy_to_quarantine(data_dir: &Path, path: &Path) -> Result<bool> {
    let target = quarantine_path(data_dir, path);
    crate::segment_log::copy_to_quarantine(path, data_dir, &target)
        .map_err(Error::io("copy to quarantine", &target))
}

/// Whether a copy of `path` (a WAL segment or a file of the store at
/// `data_dir`) as long as it is now lies in `quarantine/`: its damage was
/// found and kept for whoever looks into it.
pub fn kept_in_quarantine(data_dir: &Path, path: &Path) -> bool {
    let target = quarantine_path(data_dir, path);
    matches!(
        (fs::metadata(path), fs::metadata(target)),
        (Ok(now), Ok(copy)) if now.len() == copy.len()
    )
}

fn quarantine_path(data_dir: &Path, path: &Path) -> PathBuf {
    let relative = path.strip_prefix(data_dir).unwrap_or(path);
    let relative = relative.strip_prefix("tables").unwrap_or(relative);
    data_dir.join("quarantine").join(relative)
}

fn quarantine(data_dir: &Path, path: &Path) -> Result<()> {
    use crate::regular_file::{c_name, open_dirs_below, rename_at, stat_at};
    let target = quarantine_path(data_dir, path);
    // Both directories opened from the data directory without following a
    // link, and the file moved between their descriptors: by path, the
    // owner of the store could swap `quarantine/<table>/date=…` for a link
    // after its check, and root moved the damaged file (any bytes that
    // owner chose) over a file of root's outside the store.
    let moved = || -> io::Result<()> {
        let (Some(from_parent), Some(name), Some(to_parent)) =
            (path.parent(), path.file_name(), target.parent())
        else {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "no file name"));
        };
        let from_dir = open_dirs_below(data_dir, from_parent, false)?;
        let to_dir = open_dirs_below(data_dir, to_parent, true)?;
        // An earlier copy of the same name (quarantined, restored, damaged
        // again) stays: the new one takes the next free suffix.
        let mut chosen = name.to_os_string();
        let mut n = 1;
        while stat_at(&to_dir, &c_name(&chosen)?).is_ok() {
            chosen = name.to_os_string();
            chosen.push(format!(".{n}"));
            n += 1;
        }
        rename_at(&from_dir, &c_name(name)?, &to_dir, &c_name(&chosen)?)?;
        to_dir.sync_all()?;
        from_dir.sync_all()
    };
    moved().map_err(Error::io("move to quarantine", &target))
}

#[cfg(test)]
mod node_name_tests {
    use super::*;

    #[test]
    fn a_host_name_names_the_node_as_it_is() {
        assert_eq!(node_name_from_host("gpu-node-17\n"), "gpu-node-17");
        assert_eq!(
            node_name_from_host("ip-10-0-1-17.ec2.internal\n"),
            "ip-10-0-1-17.ec2.internal"
        );
        assert_eq!(node_name_from_host("GPU-Node-17"), "GPU-Node-17");
    }

    #[test]
    fn a_host_name_the_rule_refuses_is_made_to_fit() {
        assert_eq!(node_name_from_host("rack 3/gpu 7"), "rack-3-gpu-7");
        assert_eq!(node_name_from_host("-gpü-"), "gp");
        assert_eq!(node_name_from_host(""), "node");
        assert_eq!(node_name_from_host("..."), "node");
        let long = node_name_from_host(&format!("{}!", "a".repeat(300)));
        assert_eq!(long.len(), NODE_NAME_MAX_CHARS);
        for name in ["rack-3-gpu-7", "gp", "node", long.as_str()] {
            assert_eq!(check_node_name(name), Ok(()), "{name}");
        }
    }
}
