//! `vtax upload`: one pass now, over a store no agent is writing, and a
//! summary of what is left.

use super::*;

/// Arguments of `vtax upload`.
#[derive(clap::Args)]
pub struct UploadArgs {
    /// Data directory of the store.
    #[arg(long, env = "VTAX_DATA_DIR")]
    data_dir: Option<PathBuf>,
    /// Target: s3://bucket/prefix, gs://bucket/prefix, az://container/prefix, file:///path.
    #[arg(long)]
    url: String,
    /// Endpoint of an S3- or Azure-compatible service.
    #[arg(long)]
    endpoint: Option<String>,
    /// S3 region.
    #[arg(long)]
    region: Option<String>,
    /// Allow plain http:// endpoints.
    #[arg(long)]
    allow_http: bool,
    /// Treat this as the current time (default: now): with a time past the
    /// store's last hour, every file is sealed, as for a backfill of a stopped node.
    #[arg(long)]
    now: Option<String>,
}

/// Runs `vtax upload`: one pass, then a summary on stderr. Fails when any
/// file or replaced object is left to do.
pub fn upload(args: UploadArgs) -> Result<()> {
    let data_dir = crate::existing_store_dir(args.data_dir)?;
    #[cfg(not(feature = "object-storage"))]
    let _ = (data_dir, args.now);
    let config = UploadConfig {
        url: Some(args.url),
        endpoint: args.endpoint,
        region: args.region,
        allow_http: args.allow_http,
        ..UploadConfig::default()
    };
    config.validate().map_err(|(_, message)| anyhow!(message))?;
    // Without the "object-storage" feature `validate` refuses every URL.
    #[cfg(feature = "object-storage")]
    {
        use crate::timespec::now_us;
        use anyhow::Context;
        let now = match &args.now {
            Some(t) => crate::timespec::parse_time(t, now_us())?,
            None => now_us(),
        };
        let mut uploader = Uploader::open(&data_dir, Remote::connect(&config)?)?;
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .context("start the upload runtime")?;
        runtime.block_on(uploader.pass(now))?;
        let s = &uploader.stats;
        eprintln!(
            "Uploaded {} file(s), {} bytes; {} merged file(s) already remote; {} replaced object(s) deleted; {}.",
            s.files,
            s.bytes,
            s.covered,
            s.replaced_deleted,
            pending_summary(s)
        );
        if s.failures > 0 {
            bail!("{} upload step(s) failed; run again to retry", s.failures);
        }
        Ok(())
    }
    #[cfg(not(feature = "object-storage"))]
    unreachable!("validate refused the URL")
}

#[cfg(feature = "object-storage")]
/// How many files are not remote, and why: "3 file(s) pending: 2 of hours
/// not ended 5 minutes before --now, 1 after a failed upload".
pub(super) fn pending_summary(s: &UploadStats) -> String {
    let total = s.pending_files + s.pending_open_files;
    let reasons: Vec<String> = [
        (
            s.pending_open_files,
            format!(
                "of hours not ended {} minutes before --now (they go once they have)",
                SETTLE.as_secs() / 60
            ),
        ),
        (
            s.pending_unmerged_files,
            "parts of finished hours the running agent has yet to merge".to_string(),
        ),
        (
            s.pending_failed_files,
            "after a failed upload (run again to retry)".to_string(),
        ),
        (
            s.pending_unreadable_files,
            "that do not read (`vtax verify` names the damage)".to_string(),
        ),
    ]
    .into_iter()
    .filter(|(n, _)| *n > 0)
    .map(|(n, why)| format!("{n} {why}"))
    .collect();
    if reasons.is_empty() {
        format!("{total} file(s) pending")
    } else {
        format!("{total} file(s) pending: {}", reasons.join(", "))
    }
}
