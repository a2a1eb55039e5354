//! Moving files to object storage: the connection to a target, the passes
//! that upload sealed files and delete the objects merges replaced, and the
//! agent's uploader thread. Built with the "object-storage" feature only.

use super::*;

use std::collections::BTreeMap;
use std::io::Read;
use std::time::{Duration, Instant};

use anyhow::Context;
use vtax_store::{BatchBuilder, HOUR_US};

use crate::timespec::now_us;
use manifest::Record;

use object_store::path::Path as ObjectPath;
use object_store::ObjectStore;

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
    /// `pending_failed_files`, `pending_unmerged_files` and
    /// `pending_unreadable_files`.
    pub pending_files: u64,
    /// Seconds since the oldest of those was written.
    pub oldest_pending_age_seconds: f64,
    /// Of `pending_files`: files whose put failed, or came after a failed one.
    pub pending_failed_files: u64,
    /// Of `pending_files`: parts of a finished hour that the running writer
    /// has yet to merge into one file (its next compaction pass).
    pub pending_unmerged_files: u64,
    /// Of `pending_files`: files whose footer does not read, or whose bytes
    /// do not sum to the CRC-32 written with them (damage, which `vtax
    /// verify` names and quarantines): never put, as no reader could read
    /// them, or one would read wrong values.
    pub pending_unreadable_files: u64,
    /// Files of hours not yet ended [`SETTLE`] before the pass's time: they
    /// go once they have. Not in `pending_files`.
    pub pending_open_files: u64,
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

/// An object store and the key prefix under it.
#[derive(Clone)]
pub struct Remote {
    pub(super) store: Arc<dyn ObjectStore>,
    pub(super) prefix: String,
    pub(super) url: String,
    /// Where credentials are set when the environment holds none, for a
    /// failure of the cloud's instance metadata service (see [`Remote::explain`]).
    pub(super) credentials_from: Option<&'static str>,
}

/// The link-local address of the instance metadata service of AWS, Google
/// Cloud and Azure alike: each client asks it for credentials when the
/// environment holds none.
const INSTANCE_METADATA_ADDRESS: &str = "169.254.169.254";

/// The variables each client reads credentials from before it asks the
/// instance metadata service; `None` when one of them is set.
fn credentials_from(scheme: &str) -> Option<&'static str> {
    let (variables, advice): (&[&str], &'static str) = match scheme {
        "s3" => (
            &[
                "AWS_ACCESS_KEY_ID",
                "AWS_WEB_IDENTITY_TOKEN_FILE",
                "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
                "AWS_CONTAINER_CREDENTIALS_FULL_URI",
            ],
            "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, AWS_WEB_IDENTITY_TOKEN_FILE, \
             or AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
        ),
        "gs" => (
            &[
                "GOOGLE_SERVICE_ACCOUNT",
                "GOOGLE_SERVICE_ACCOUNT_PATH",
                "GOOGLE_SERVICE_ACCOUNT_KEY",
                "GOOGLE_APPLICATION_CREDENTIALS",
            ],
            "GOOGLE_SERVICE_ACCOUNT (a key file) or GOOGLE_APPLICATION_CREDENTIALS",
        ),
        "az" => (
            &[
                "AZURE_STORAGE_ACCOUNT_KEY",
                "AZURE_STORAGE_ACCESS_KEY",
                "AZURE_STORAGE_SAS_KEY",
                "AZURE_CLIENT_SECRET",
                "AZURE_FEDERATED_TOKEN_FILE",
                "AZURE_STORAGE_TOKEN",
            ],
            "AZURE_STORAGE_ACCOUNT_KEY, AZURE_STORAGE_SAS_KEY, or AZURE_CLIENT_ID with \
             AZURE_CLIENT_SECRET and AZURE_TENANT_ID",
        ),
        _ => return None,
    };
    let set = variables
        .iter()
        .any(|v| std::env::var_os(v).is_some_and(|value| !value.is_empty()));
    (!set).then_some(advice)
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
            url: config.target().unwrap_or(url),
            credentials_from: credentials_from(&target.scheme),
        })
    }

    /// A failure as the log says it: one of the instance metadata service
    /// (off a cloud instance, or with the service blocked) is a node without
    /// credentials, which the client's own error does not say.
    pub(super) fn explain(&self, e: &dyn std::fmt::Display) -> String {
        let text = format!("{e:#}");
        match self.credentials_from {
            Some(advice) if text.contains(INSTANCE_METADATA_ADDRESS) => format!(
                "no credentials: the environment sets none ({advice}), and the instance \
                 metadata service at {INSTANCE_METADATA_ADDRESS} gave none: {text}"
            ),
            _ => text,
        }
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

/// Uploads a data directory's sealed files to one target.
pub struct Uploader {
    pub(super) remote: Remote,
    pub(super) data_dir: PathBuf,
    pub(super) manifest: Manifest,
    pub(super) settle_us: i64,
    /// [`SINGLE_PUT_MAX_BYTES`] and [`MULTIPART_CHUNK_BYTES`]; tests lower them.
    pub(super) single_put_max_bytes: u64,
    pub(super) multipart_chunk_bytes: usize,
    /// [`MANIFEST_REWRITE_ABOVE_BYTES`]; tests lower it.
    pub(super) manifest_rewrite_above_bytes: u64,
    pub(super) manifest_bytes_after_rewrite: u64,
    /// Totals since start.
    pub stats: UploadStats,
    /// The files found unreadable or damaged at the last pass, each logged
    /// then: logged once while it stays so.
    pub(super) logged_unreadable: std::collections::HashSet<PathBuf>,
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
            logged_unreadable: Default::default(),
        })
    }

    /// One pass: uploads every sealed file not yet remote, oldest first, then
    /// deletes the objects that uploads replaced. Stops uploading at the first
    /// failure (the target is likely down; the next pass retries). Errors only
    /// when the store cannot be listed or the manifest cannot be written.
    pub async fn pass(&mut self, now_us: i64) -> Result<()> {
        let before = self.stats.clone();
        let (files, unreadable) = vtax_store::files::live_and_unreadable_files(&self.data_dir)
            .with_context(|| format!("list files of {}", self.data_dir.display()))?;
        for (path, error) in &unreadable {
            if !self.logged_unreadable.contains(path) {
                tracing::warn!(path = %path.display(), %error, "A store file does not read and is not uploaded; `vtax verify` names the damage and quarantines it.");
            }
        }
        let mut damaged: Vec<PathBuf> = Vec::new();
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
                if is_damage(&e) {
                    // The file, not the target, failed: the others still go.
                    if !self.logged_unreadable.contains(&file.path) {
                        tracing::warn!(path = %file.path.display(), error = %format!("{e:#}"), "A store file does not read and is not uploaded; `vtax verify` names the damage and quarantines it.");
                    }
                    damaged.push(file.path.clone());
                    continue;
                }
                if !file.path.exists() {
                    // Merged away or retained away while being read: its
                    // replacement, if any, comes in a later pass.
                    tracing::debug!(path = %file.path.display(), "A file vanished before its upload.");
                    continue;
                }
                self.stats.failures += 1;
                tracing::warn!(path = %file.path.display(), target = %self.remote.url, error = %self.remote.explain(&e), "Upload failed; retried at the next pass.");
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
                    tracing::warn!(key, target = %self.remote.url, error = %self.remote.explain(&e), "Deleting a replaced object failed; retried at the next pass.");
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
        damaged.extend(unreadable.into_iter().map(|(path, _)| path));
        self.logged_unreadable = damaged.iter().cloned().collect();
        self.stats.pending_unreadable_files = damaged.len() as u64;
        self.stats.pending_files = (pending.len() + unmerged_files.len() + damaged.len()) as u64;
        let now = std::time::SystemTime::now();
        self.stats.oldest_pending_age_seconds = pending
            .iter()
            .chain(&unmerged_files)
            .map(|f| &f.path)
            .chain(&damaged)
            .filter_map(|path| path.metadata().ok()?.modified().ok())
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
        // So does any object a put of one of them may have left without
        // its `put` line: the answer lost, the check failed, a crash.
        let mut known: Vec<String> = file
            .compacted_from
            .iter()
            .filter_map(covered)
            .flat_map(|c| c.keys.clone())
            .chain(file.compacted_from.iter().flat_map(|name| {
                self.manifest
                    .attempted(&file_id(&file.table, file.day, name))
                    .cloned()
            }))
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
        self.manifest.append(Record::Attempt {
            target: self.remote.url.clone(),
            file: id.clone(),
            key: key.clone(),
        })?;
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
        let mut local = vtax_store::regular_file::open_read(&file.path)
            .with_context(|| format!("open {}", file.path.display()))?;
        let store = &self.remote.store;
        // The bytes sent are checked against the sum written with them: a
        // file damaged on this disk is not made the fleet's copy.
        let mut pages = vtax_store::files::PagesSum::new(&file.path, file.pages_crc32);
        let put = if file.bytes <= self.single_put_max_bytes {
            let mut bytes = Vec::with_capacity(file.bytes as usize);
            local
                .read_to_end(&mut bytes)
                .with_context(|| format!("read {}", file.path.display()))?;
            pages.update(&bytes);
            pages.finish()?;
            store.put(&path, bytes.into()).await.map_err(anyhow::Error::from)
        } else {
            // A multipart upload that fails is aborted: left, its parts stay
            // in the bucket, billed and never listed, one more each pass that
            // retries it.
            let mut upload = store.put_multipart(&path).await?;
            let mut chunk = vec![0u8; self.multipart_chunk_bytes];
            let sent: Result<object_store::PutResult> = async {
                loop {
                    let n = fill(&mut local, &mut chunk)
                        .with_context(|| format!("read {}", file.path.display()))?;
                    if n == 0 {
                        break;
                    }
                    pages.update(&chunk[..n]);
                    upload.put_part(chunk[..n].to_vec().into()).await?;
                }
                pages.finish()?;
                Ok(upload.complete().await?)
            }
            .await;
            if sent.is_err() {
                if let Err(e) = upload.abort().await {
                    tracing::warn!(key, error = %self.remote.explain(&e), "Aborting a failed multipart upload failed: its parts stay in the bucket until its lifecycle rule removes them.");
                }
            }
            sent
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

/// Reads into `buf` until it is full or the file ends: every part of a
/// multipart upload but the last must be whole (S3 refuses parts under
/// 5 MiB), and a read may return less than asked.
fn fill(file: &mut std::fs::File, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match file.read(&mut buf[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(n)
}

/// Test builds only: `VTAX_UPLOAD_CRASH_AFTER_PUTS=N` ends the process at
/// once after the Nth confirmed put and before its manifest line, the
/// instant a crash could double-upload a file.
/// Whether an upload failed on the file itself (its bytes are not those
/// written), not on the target.
fn is_damage(e: &anyhow::Error) -> bool {
    e.chain().any(|cause| {
        matches!(
            cause.downcast_ref::<vtax_store::Error>(),
            Some(vtax_store::Error::Corrupt { .. })
        )
    })
}

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

/// [`super::spawn`] for a configured target.
pub(super) fn spawn(
    config: &UploadConfig,
    data_dir: &Path,
    exposition: &Arc<Exposition>,
    rows: &vtax_store::hub::RowSender,
) -> Result<Option<Handle>> {
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
