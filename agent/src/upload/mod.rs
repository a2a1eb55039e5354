//! Sealed Parquet files to object storage (S3, GCS, Azure, or a mounted path),
//! under `<prefix>/tables/<table>/node=<node>/date=YYYY-MM-DD/<file>.parquet`.
//!
//! Only sealed files go ([`vtax_store::files::FileInfo::is_sealed`]): a finished
//! hour merged into one file, or a compacted day whose hours are not all remote
//! yet. A merged file whose every input is remote is only recorded (`cover`),
//! so a compacted day does not put its rows there twice. When a late row makes
//! the store merge an uploaded file into a new one, the new one is uploaded and
//! the objects it replaces are deleted afterwards. Every confirmed step is a
//! fsynced line in the manifest (`manifest.rs`); each put writes a file's bytes
//! to a key named after it, so doing a step again after a crash is harmless.
//! See `docs/design/object-storage.md`.

mod command;
pub mod manifest;

pub use command::{upload, UploadArgs};

use std::collections::BTreeMap;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use object_store::path::Path as ObjectPath;
use object_store::{ObjectStore, WriteMultipart};
use serde::{Deserialize, Serialize};
use vtax_exporters::Exposition;
use vtax_store::files::FileInfo;
use vtax_store::{date_string, BatchBuilder, Deletable, HOUR_US};

use crate::timespec::now_us;
use manifest::{Manifest, Record};

/// Seconds between two upload passes of the agent.
pub const DEFAULT_UPLOAD_INTERVAL_SECS: u64 = 60;
/// Whether retention waits for a file's upload before deleting it.
pub const DEFAULT_DELETE_LOCAL_AFTER_UPLOAD: bool = true;
/// How long after its last hour ends a file may count as sealed. The store
/// publishes an hour's last rows one minute after it (its publish grace) and
/// merges its parts at the next compaction pass; a file alone in its hour
/// after this long is final unless a late row arrives.
pub const SETTLE: Duration = Duration::from_secs(300);
/// Files up to this size go in one request; larger ones in parts of
/// [`MULTIPART_CHUNK_BYTES`], so the agent never holds a large file in memory.
pub const SINGLE_PUT_MAX_BYTES: u64 = 16 << 20;
/// Part size of a multipart upload (S3 wants at least 5 MiB).
pub const MULTIPART_CHUNK_BYTES: usize = 8 << 20;
/// The manifest is rewritten without the lines of files long gone once it
/// is larger than this and twice its size after the last rewrite.
pub const MANIFEST_REWRITE_ABOVE_BYTES: u64 = 1 << 20;

/// `[upload]`: where sealed files go. Credentials come from the environment,
/// as each service's own tools read them (`AWS_ACCESS_KEY_ID`, ...,
/// `GOOGLE_SERVICE_ACCOUNT`, `AZURE_STORAGE_ACCOUNT_NAME`, ...).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct UploadConfig {
    /// `s3://bucket/prefix`, `gs://bucket/prefix`, `az://container/prefix`, or
    /// `file:///mounted/path`; none uploads nothing.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    /// Seconds between two upload passes.
    pub interval_secs: u64,
    /// Whether retention deletes a local file only once its upload is confirmed.
    pub delete_local_after_upload: bool,
    /// Endpoint of an S3-compatible or Azure-compatible service (MinIO, Ceph, a local emulator).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub endpoint: Option<String>,
    /// S3 region; none takes `AWS_REGION` or us-east-1.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub region: Option<String>,
    /// Whether plain http:// endpoints are allowed (a local S3).
    pub allow_http: bool,
}

impl Default for UploadConfig {
    fn default() -> Self {
        UploadConfig {
            url: None,
            interval_secs: DEFAULT_UPLOAD_INTERVAL_SECS,
            delete_local_after_upload: DEFAULT_DELETE_LOCAL_AFTER_UPLOAD,
            endpoint: None,
            region: None,
            allow_http: false,
        }
    }
}

impl UploadConfig {
    /// Checks values the types cannot; on failure the key and the message.
    pub fn validate(&self) -> Result<(), (String, String)> {
        if let Some(url) = &self.url {
            let target = Target::parse(url).map_err(|e| ("upload.url".to_string(), e))?;
            if self.region.is_some() && target.scheme != "s3" {
                return Err((
                    "upload.region".into(),
                    format!("upload.region applies to s3:// URLs only, not {url}"),
                ));
            }
            if self.endpoint.is_some() && !matches!(target.scheme.as_str(), "s3" | "az") {
                return Err((
                    "upload.endpoint".into(),
                    format!("upload.endpoint applies to s3:// and az:// URLs only, not {url}"),
                ));
            }
        }
        if self.interval_secs == 0 {
            return Err((
                "upload.interval_secs".into(),
                "upload.interval_secs must be at least 1".into(),
            ));
        }
        Ok(())
    }
}

/// An upload URL taken apart.
#[derive(Clone, Debug, PartialEq)]
struct Target {
    scheme: String,
    /// Bucket or container; for `file://`, the directory.
    bucket: String,
    /// Object key prefix, without leading or trailing `/`.
    prefix: String,
}

impl Target {
    fn parse(url: &str) -> Result<Target, String> {
        let (scheme, rest) = url
            .split_once("://")
            .ok_or_else(|| format!("upload.url = {url:?}: expected scheme://bucket/prefix"))?;
        let scheme = scheme.to_ascii_lowercase();
        if scheme == "file" {
            if !rest.starts_with('/') {
                return Err(format!(
                    "upload.url = {url:?}: a file:// URL needs an absolute path, as in file:///mnt/vtax"
                ));
            }
            return Ok(Target {
                scheme,
                bucket: rest.to_string(),
                prefix: String::new(),
            });
        }
        if !matches!(scheme.as_str(), "s3" | "gs" | "az") {
            return Err(format!(
                "upload.url = {url:?}: scheme {scheme}:// is not one of s3, gs, az, file"
            ));
        }
        let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
        if bucket.is_empty() {
            return Err(format!("upload.url = {url:?}: no bucket"));
        }
        let prefix = prefix.trim_matches('/').to_string();
        ObjectPath::parse(&prefix).map_err(|e| format!("upload.url = {url:?}: {e}"))?;
        Ok(Target {
            scheme,
            bucket: bucket.to_string(),
            prefix,
        })
    }
}

/// An object store and the key prefix under it.
#[derive(Clone)]
pub struct Remote {
    store: Arc<dyn ObjectStore>,
    prefix: String,
    url: String,
}

impl Remote {
    /// Connects to the target `config.url` names (no request is made yet).
    pub fn connect(config: &UploadConfig) -> Result<Remote> {
        let url = config
            .url
            .clone()
            .ok_or_else(|| anyhow!("no upload URL configured"))?;
        let target = Target::parse(&url).map_err(|e| anyhow!(e))?;
        let client = object_store::ClientOptions::new().with_allow_http(config.allow_http);
        let bucket_url = format!("{}://{}", target.scheme, target.bucket);
        let store: Arc<dyn ObjectStore> = match target.scheme.as_str() {
            "file" => {
                let dir = PathBuf::from(&target.bucket);
                if !dir.is_dir() {
                    bail!(
                        "{url}: {} is not a directory (is it mounted?)",
                        dir.display()
                    );
                }
                Arc::new(object_store::local::LocalFileSystem::new_with_prefix(&dir)?)
            }
            "s3" => {
                let mut builder = object_store::aws::AmazonS3Builder::from_env()
                    .with_url(&bucket_url)
                    .with_client_options(client);
                if let Some(endpoint) = &config.endpoint {
                    builder = builder.with_endpoint(endpoint);
                }
                if let Some(region) = &config.region {
                    builder = builder.with_region(region);
                }
                Arc::new(builder.build().with_context(|| url.clone())?)
            }
            "gs" => Arc::new(
                object_store::gcp::GoogleCloudStorageBuilder::from_env()
                    .with_url(&bucket_url)
                    .with_client_options(client)
                    .build()
                    .with_context(|| url.clone())?,
            ),
            "az" => {
                let mut builder = object_store::azure::MicrosoftAzureBuilder::from_env()
                    .with_url(&bucket_url)
                    .with_client_options(client);
                if let Some(endpoint) = &config.endpoint {
                    builder = builder.with_endpoint(endpoint.clone());
                }
                Arc::new(builder.build().with_context(|| url.clone())?)
            }
            other => bail!("{url}: unsupported scheme {other}"),
        };
        Ok(Remote {
            store,
            prefix: target.prefix,
            url,
        })
    }

    /// The object key of a local file.
    fn key(&self, file: &FileInfo) -> String {
        let key = format!(
            "tables/{}/node={}/date={}/{}",
            file.table,
            file.node,
            date_string(file.day),
            file.name()
        );
        if self.prefix.is_empty() {
            key
        } else {
            format!("{}/{key}", self.prefix)
        }
    }
}

/// Whether every hour a file holds ended at least `settle_us` before
/// `now_us` (its watermarks' hours, else its rows' times), as
/// [`FileInfo::is_sealed`] asks first.
fn hours_ended(file: &FileInfo, now_us: i64, settle_us: i64) -> bool {
    let last_hour = file
        .watermarks
        .keys()
        .next_back()
        .copied()
        .or_else(|| file.time_range_us.map(|(_, last)| last.div_euclid(HOUR_US)));
    last_hour.is_none_or(|hour| (hour + 1) * HOUR_US + settle_us <= now_us)
}

/// A local file's name in the manifest: `<table>/date=<day>/<name>`.
fn file_id(table: &str, day: i64, name: &str) -> String {
    format!("{table}/date={}/{name}", date_string(day))
}

/// Counters and gauges of the uploader, as in table `upload`.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct UploadStats {
    /// Files uploaded and confirmed.
    pub files: u64,
    /// Bytes of those files.
    pub bytes: u64,
    /// Merged files recorded as remote without an upload (their inputs are).
    pub covered: u64,
    /// Replaced objects deleted.
    pub replaced_deleted: u64,
    /// Failed puts, checks and deletes.
    pub failures: u64,
    /// Files of finished hours not yet remote after the last pass: those of
    /// `pending_failed_files` and `pending_unmerged_files`.
    pub pending_files: u64,
    /// Seconds since the oldest of those was written.
    pub oldest_pending_age_seconds: f64,
    /// Of `pending_files`: files whose put failed, or came after a failed one.
    pub pending_failed_files: u64,
    /// Of `pending_files`: parts of a finished hour that the running writer
    /// has yet to merge into one file (its next compaction pass).
    pub pending_unmerged_files: u64,
    /// Files of hours not yet ended [`SETTLE`] before the pass's time: they
    /// go once they have. Not in `pending_files`.
    pub pending_open_files: u64,
}

/// Uploads a data directory's sealed files to one target.
pub struct Uploader {
    remote: Remote,
    data_dir: PathBuf,
    manifest: Manifest,
    settle_us: i64,
    /// [`SINGLE_PUT_MAX_BYTES`] and [`MULTIPART_CHUNK_BYTES`]; tests lower them.
    single_put_max_bytes: u64,
    multipart_chunk_bytes: usize,
    /// [`MANIFEST_REWRITE_ABOVE_BYTES`]; tests lower it.
    manifest_rewrite_above_bytes: u64,
    manifest_bytes_after_rewrite: u64,
    /// Totals since start.
    pub stats: UploadStats,
}

impl Uploader {
    /// Takes the data directory's upload lock and reads its manifest.
    pub fn open(data_dir: &Path, remote: Remote) -> Result<Uploader> {
        let manifest = Manifest::open(data_dir, &remote.url)?;
        Ok(Uploader {
            remote,
            data_dir: data_dir.to_owned(),
            manifest,
            settle_us: SETTLE.as_micros() as i64,
            single_put_max_bytes: SINGLE_PUT_MAX_BYTES,
            multipart_chunk_bytes: MULTIPART_CHUNK_BYTES,
            manifest_rewrite_above_bytes: MANIFEST_REWRITE_ABOVE_BYTES,
            manifest_bytes_after_rewrite: 0,
            stats: UploadStats::default(),
        })
    }

    /// One pass: uploads every sealed file not yet remote, oldest first, then
    /// deletes the objects that uploads replaced. Stops uploading at the first
    /// failure (the target is likely down; the next pass retries). Errors only
    /// when the store cannot be listed or the manifest cannot be written.
    pub async fn pass(&mut self, now_us: i64) -> Result<()> {
        let before = self.stats.clone();
        let files = vtax_store::files::live_files(&self.data_dir)
            .with_context(|| format!("list files of {}", self.data_dir.display()))?;
        let mut partitions: BTreeMap<(i64, String), Vec<FileInfo>> = BTreeMap::new();
        for file in files {
            partitions
                .entry((file.day, file.table.clone()))
                .or_default()
                .push(file);
        }
        // Parts of a finished hour wait for the writer to merge them into
        // one file; with no writer (a stopped store, `vtax upload` on a
        // backfill) nothing ever will, so they go as they are. Should a writer
        // merge them later, the merged file only covers their objects.
        let writer_running = vtax_store::open_for_writing(&self.data_dir)
            .with_context(|| format!("check whether {} is open", self.data_dir.display()))?;
        let mut sealed: Vec<&FileInfo> = Vec::new();
        let (mut open_files, mut unmerged_files) = (Vec::new(), Vec::new());
        for files in partitions.values() {
            for file in files {
                if file.is_sealed(files, now_us, self.settle_us) {
                    sealed.push(file);
                } else if self.remote_has(file) {
                    // An open hour's file from a pass with a later `now`.
                } else if !hours_ended(file, now_us, self.settle_us) {
                    open_files.push(file);
                } else if writer_running && file.watermarks.len() == 1 {
                    unmerged_files.push(file);
                } else {
                    sealed.push(file);
                }
            }
        }
        sealed.sort_by_key(|f| (f.day, f.time_range_us, f.path.clone()));
        // What the manifest may be asked about again: live files and the
        // inputs their compaction names.
        let live_ids: std::collections::HashSet<String> = partitions
            .values()
            .flatten()
            .flat_map(|f| {
                std::iter::once(f.name())
                    .chain(f.compacted_from.iter().map(String::as_str))
                    .map(|name| file_id(&f.table, f.day, name))
            })
            .collect();
        let mut pending = Vec::new();
        for file in sealed {
            if !pending.is_empty() {
                // After a failed put the target is likely down.
                pending.push(file);
                continue;
            }
            if let Err(e) = self.ship(file, now_us).await {
                if !file.path.exists() {
                    // Merged away or retained away while being read: its
                    // replacement, if any, comes in a later pass.
                    tracing::debug!(path = %file.path.display(), "A file vanished before its upload.");
                    continue;
                }
                self.stats.failures += 1;
                tracing::warn!(path = %file.path.display(), target = %self.remote.url, error = %format!("{e:#}"), "Upload failed; retried at the next pass.");
                pending.push(file);
            }
        }
        for key in self.manifest.pending_deletes() {
            let path = ObjectPath::parse(&key)?;
            match self.remote.store.delete(&path).await {
                Ok(()) | Err(object_store::Error::NotFound { .. }) => {
                    self.manifest.append(Record::Delete {
                        target: self.remote.url.clone(),
                        key,
                        time_us: now_us,
                    })?;
                    self.stats.replaced_deleted += 1;
                }
                Err(e) => {
                    self.stats.failures += 1;
                    tracing::warn!(key, target = %self.remote.url, error = %e, "Deleting a replaced object failed; retried at the next pass.");
                }
            }
        }
        let len = self.manifest.len_bytes();
        if len
            > self
                .manifest_rewrite_above_bytes
                .max(2 * self.manifest_bytes_after_rewrite)
        {
            self.manifest
                .rewrite(|id| live_ids.contains(id), now_us)
                .context("rewrite the upload manifest")?;
            self.manifest_bytes_after_rewrite = self.manifest.len_bytes();
            tracing::info!(
                before_bytes = len,
                after_bytes = self.manifest_bytes_after_rewrite,
                "Rewrote the upload manifest without the files long gone."
            );
        }
        if self.stats.files != before.files
            || self.stats.replaced_deleted != before.replaced_deleted
        {
            tracing::info!(
                files = self.stats.files - before.files,
                bytes = self.stats.bytes - before.bytes,
                replaced_deleted = self.stats.replaced_deleted - before.replaced_deleted,
                target = %self.remote.url,
                "Uploaded sealed files."
            );
        }
        self.stats.pending_failed_files = pending.len() as u64;
        self.stats.pending_unmerged_files = unmerged_files.len() as u64;
        self.stats.pending_open_files = open_files.len() as u64;
        self.stats.pending_files = (pending.len() + unmerged_files.len()) as u64;
        let now = std::time::SystemTime::now();
        self.stats.oldest_pending_age_seconds = pending
            .iter()
            .chain(&unmerged_files)
            .filter_map(|f| f.path.metadata().ok()?.modified().ok())
            .filter_map(|written| now.duration_since(written).ok())
            .map(|age| age.as_secs_f64())
            .fold(0.0, f64::max);
        Ok(())
    }

    /// Whether the manifest has the file, as it is now, at this target.
    fn remote_has(&self, file: &FileInfo) -> bool {
        self.manifest
            .covered(&file_id(&file.table, file.day, file.name()))
            .is_some_and(|c| c.bytes == file.bytes)
    }

    /// Makes one sealed file remote: nothing when the manifest has it, a
    /// `cover` line when it merges files that are all remote, else a put
    /// and a `put` line that lists the objects it replaces.
    async fn ship(&mut self, file: &FileInfo, now_us: i64) -> Result<()> {
        let id = file_id(&file.table, file.day, file.name());
        if self.remote_has(file) {
            return Ok(());
        }
        let covered = |name: &String| self.manifest.covered(&file_id(&file.table, file.day, name));
        // Every remote object of a name it lists holds rows that are now here;
        // the rows are all remote already when every name but the
        // intermediates (multi-hour merges of the other names) is.
        let mut known: Vec<String> = file
            .compacted_from
            .iter()
            .filter_map(covered)
            .flat_map(|c| c.keys.clone())
            .collect();
        known.sort();
        known.dedup();
        let mut leaves = file
            .compacted_from
            .iter()
            .filter(|name| !file.compacted_intermediates.contains(name))
            .peekable();
        let all_remote = leaves.peek().is_some() && leaves.all(|name| covered(name).is_some());
        if all_remote {
            self.manifest.append(Record::Cover {
                target: self.remote.url.clone(),
                file: id,
                bytes: file.bytes,
                keys: known,
                time_us: now_us,
            })?;
            self.stats.covered += 1;
            return Ok(());
        }
        let key = self.remote.key(file);
        let e_tag = self.put(file, &key).await?;
        crash_point();
        known.retain(|k| *k != key);
        self.manifest.append(Record::Put {
            target: self.remote.url.clone(),
            file: id,
            bytes: file.bytes,
            key,
            e_tag,
            replaces: known,
            time_us: now_us,
        })?;
        self.stats.files += 1;
        self.stats.bytes += file.bytes;
        Ok(())
    }

    /// Writes a file to `key` and checks the object: its size, and its ETag
    /// against the one the put answered. Returns the ETag.
    async fn put(&self, file: &FileInfo, key: &str) -> Result<Option<String>> {
        let path = ObjectPath::parse(key)?;
        let mut local = std::fs::File::open(&file.path)
            .with_context(|| format!("open {}", file.path.display()))?;
        let store = &self.remote.store;
        let put = if file.bytes <= self.single_put_max_bytes {
            let mut bytes = Vec::with_capacity(file.bytes as usize);
            local
                .read_to_end(&mut bytes)
                .with_context(|| format!("read {}", file.path.display()))?;
            store.put(&path, bytes.into()).await
        } else {
            let upload = store.put_multipart(&path).await?;
            let mut writer =
                WriteMultipart::new_with_chunk_size(upload, self.multipart_chunk_bytes);
            let mut chunk = vec![0u8; self.multipart_chunk_bytes];
            loop {
                let n = local
                    .read(&mut chunk)
                    .with_context(|| format!("read {}", file.path.display()))?;
                if n == 0 {
                    break;
                }
                writer.wait_for_capacity(2).await?;
                writer.write(&chunk[..n]);
            }
            writer.finish().await
        }
        .with_context(|| format!("put {key}"))?;
        let head = store
            .head(&path)
            .await
            .with_context(|| format!("check {key}"))?;
        if head.size != file.bytes {
            bail!(
                "{key} holds {} bytes after the put, the file {}",
                head.size,
                file.bytes
            );
        }
        if let (Some(sent), Some(stored)) = (&put.e_tag, &head.e_tag) {
            if sent != stored {
                bail!("{key}: ETag {stored} after a put that answered {sent}");
            }
        }
        Ok(head.e_tag.or(put.e_tag))
    }
}

/// Test builds only: `VTAX_UPLOAD_CRASH_AFTER_PUTS=N` ends the process at
/// once after the Nth confirmed put and before its manifest line, the
/// instant a crash could double-upload a file.
fn crash_point() {
    #[cfg(debug_assertions)]
    {
        use std::sync::atomic::AtomicU64;
        static PUTS: AtomicU64 = AtomicU64::new(0);
        if let Some(n) = std::env::var("VTAX_UPLOAD_CRASH_AFTER_PUTS")
            .ok()
            .and_then(|v| v.parse::<u64>().ok())
        {
            if PUTS.fetch_add(1, Ordering::SeqCst) + 1 == n {
                // SAFETY: ends the process without unwinding, like a SIGKILL.
                unsafe { libc::_exit(86) };
            }
        }
    }
}

fn stats_row(stats: &UploadStats, time_us: i64) -> vtax_store::Batch {
    use crate::collectors::runtime_tables::{UploadRow, UPLOAD};
    let row = UploadRow {
        files: stats.files,
        file_bytes: stats.bytes,
        covered_files: stats.covered,
        replaced_objects_deleted: stats.replaced_deleted,
        failures: stats.failures,
        pending_files: stats.pending_files,
        oldest_pending_age_seconds: stats.oldest_pending_age_seconds,
    };
    let mut builder = BatchBuilder::new(&UPLOAD);
    builder
        .push_row(time_us, &row)
        .expect("an upload row is for the upload table");
    builder.finish()
}

/// The running uploader thread; dropping this asks it to stop. It is not
/// joined: a pass cut short is redone, to the same keys, at the next start.
pub struct Handle {
    stop: Arc<AtomicBool>,
}

impl Drop for Handle {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// Starts the uploader thread for the store in `data_dir` when `[upload]
/// url` is set; its rows go to `rows` and `/metrics`. A target that cannot
/// be configured is an error now; one that fails later is logged, counted
/// and retried every pass.
pub fn spawn(
    config: &UploadConfig,
    data_dir: &Path,
    exposition: &Arc<Exposition>,
    rows: &vtax_store::hub::RowSender,
) -> Result<Option<Handle>> {
    if config.url.is_none() {
        return Ok(None);
    }
    let remote = Remote::connect(config)?;
    let data_dir = data_dir.to_path_buf();
    let interval = Duration::from_secs(config.interval_secs);
    let stop = Arc::new(AtomicBool::new(false));
    let (exposition, rows, stopped) = (exposition.clone(), rows.clone(), stop.clone());
    std::thread::Builder::new()
        .name("upload".into())
        .spawn(move || upload_loop(remote, &data_dir, interval, &stopped, &exposition, &rows))
        .context("spawn the uploader")?;
    Ok(Some(Handle { stop }))
}

fn upload_loop(
    remote: Remote,
    data_dir: &Path,
    interval: Duration,
    stop: &AtomicBool,
    exposition: &Exposition,
    rows: &vtax_store::hub::RowSender,
) {
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            tracing::error!(error = %e, "The uploader could not start its runtime; nothing is uploaded.");
            return;
        }
    };
    let sleep = |until: Instant| {
        while Instant::now() < until {
            if stop.load(Ordering::Relaxed) {
                return false;
            }
            std::thread::sleep(Duration::from_millis(250).min(until - Instant::now()));
        }
        !stop.load(Ordering::Relaxed)
    };
    let mut uploader: Option<Uploader> = None;
    let mut next = Instant::now();
    loop {
        if !sleep(next) {
            return;
        }
        next += interval;
        if uploader.is_none() {
            // The lock may be held by a one-shot `vtax upload`: wait it out.
            match Uploader::open(data_dir, remote.clone()) {
                Ok(u) => uploader = Some(u),
                Err(e) => {
                    tracing::warn!(error = %format!("{e:#}"), "The uploader waits for its manifest; retried at the next pass.");
                    continue;
                }
            }
        }
        let uploader = uploader.as_mut().expect("opened above");
        if let Err(e) = runtime.block_on(uploader.pass(now_us())) {
            uploader.stats.failures += 1;
            tracing::error!(error = %format!("{e:#}"), "An upload pass failed; retried at the next pass.");
        }
        let row = Arc::new(stats_row(&uploader.stats, now_us()));
        exposition.update("upload", vec![row.clone()]);
        let _ = rows.send(vec![row]);
    }
}

/// Retention's hook for the store in `data_dir` when uploads are configured
/// and `delete_local_after_upload` is on: a file may go once the manifest
/// has it. The manifest is re-read only when it grew.
pub fn retention_guard(config: &UploadConfig, data_dir: &Path) -> Option<Deletable> {
    let url = config.url.clone()?;
    if !config.delete_local_after_upload {
        return None;
    }
    let data_dir = data_dir.to_path_buf();
    let path = manifest::dir(&data_dir).join(manifest::MANIFEST_FILE);
    let cache: Mutex<Option<(u64, Manifest)>> = Mutex::new(None);
    Some(Deletable(Arc::new(move |file: &FileInfo| {
        let len = std::fs::metadata(&path).map(|m| m.len()).unwrap_or(0);
        let mut cache = cache.lock().unwrap_or_else(|e| e.into_inner());
        if cache.as_ref().is_none_or(|(seen, _)| *seen != len) {
            match Manifest::read(&data_dir, &url) {
                Ok(m) => *cache = Some((len, m)),
                Err(e) => {
                    tracing::warn!(error = %format!("{e:#}"), "Retention keeps every file: the upload manifest is unreadable.");
                    return false;
                }
            }
        }
        let id = file_id(&file.table, file.day, file.name());
        cache
            .as_ref()
            .and_then(|(_, m)| m.covered(&id))
            .is_some_and(|c| c.bytes == file.bytes)
    })))
}

#[cfg(test)]
mod tests;
