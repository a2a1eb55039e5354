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
#[cfg(feature = "object-storage")]
mod transfer;
#[cfg(feature = "object-storage")]
pub use transfer::*;

pub use command::{upload, UploadArgs};

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use anyhow::{anyhow, bail, Result};
use serde::{Deserialize, Serialize};
use vtax_exporters::Exposition;
use vtax_store::files::FileInfo;
use vtax_store::{date_string, Deletable};

use manifest::Manifest;

/// Seconds between two upload passes of the agent.
pub const DEFAULT_UPLOAD_INTERVAL_SECS: u64 = 60;
/// Whether retention waits for a file's upload before deleting it.
pub const DEFAULT_DELETE_LOCAL_AFTER_UPLOAD: bool = true;
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

impl UploadConfig {
    /// The target as the manifest names it: the URL, and the endpoint where
    /// one is set. The same `s3://bucket/prefix` at another S3 service is
    /// another target: taken for the same one, nothing was uploaded to it,
    /// and retention deleted files it never received.
    pub fn target(&self) -> Option<String> {
        let url = self.url.as_ref()?;
        Some(match &self.endpoint {
            Some(endpoint) => format!("{url} at {endpoint}"),
            None => url.clone(),
        })
    }
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
            if !cfg!(feature = "object-storage") {
                return Err(("upload.url".into(), without_object_storage(url)));
            }
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

/// Why `url` cannot be used by a build without the "object-storage" feature.
fn without_object_storage(url: &str) -> String {
    format!(
        "upload.url = {url:?}: this vtax is built without object storage; the .deb and \
         the RPM have it, or build with `cargo build --release -p vtax --features object-storage`"
    )
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
        #[cfg(feature = "object-storage")]
        object_store::path::Path::parse(&prefix)
            .map_err(|e| format!("upload.url = {url:?}: {e}"))?;
        Ok(Target {
            scheme,
            bucket: bucket.to_string(),
            prefix,
        })
    }
}

/// A local file's name in the manifest: `<table>/date=<day>/<name>`.
fn file_id(table: &str, day: i64, name: &str) -> String {
    format!("{table}/date={}/{name}", date_string(day))
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
    let Some(url) = &config.url else {
        return Ok(None);
    };
    #[cfg(not(feature = "object-storage"))]
    {
        let _ = (data_dir, exposition, rows);
        bail!(without_object_storage(url));
    }
    #[cfg(feature = "object-storage")]
    {
        let _ = url;
        transfer::spawn(config, data_dir, exposition, rows)
    }
}

/// Retention's hook for the store in `data_dir` when uploads are configured
/// and `delete_local_after_upload` is on: a file may go once the manifest
/// has it. The manifest is re-read only when it grew.
pub fn retention_guard(config: &UploadConfig, data_dir: &Path) -> Option<Deletable> {
    let url = config.target()?;
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

#[cfg(all(test, feature = "object-storage"))]
mod tests;

#[cfg(all(test, not(feature = "object-storage")))]
mod without_object_storage {
    use super::*;

    #[test]
    fn an_upload_url_is_refused_with_the_way_to_a_build_that_has_it() {
        let config = UploadConfig {
            url: Some("s3://bucket/fleet".into()),
            ..UploadConfig::default()
        };
        let (key, message) = config.validate().unwrap_err();
        assert_eq!(key, "upload.url");
        assert!(
            message.contains("built without object storage")
                && message.contains("--features object-storage"),
            "{message}"
        );
        // No URL, no uploads: a build without the feature runs as before.
        assert!(UploadConfig::default().validate().is_ok());
    }
}
