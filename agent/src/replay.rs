//! `vtax replay-detector`: a recording played back through a fresh detector
//! (`vtax_detect::replay`), one JSON object per opened event on stdout.

use std::io::Write;
use std::path::PathBuf;

use anyhow::{bail, Result};

use crate::detect::replay::replay;
use crate::detect::DetectConfig;
use crate::timespec::{now_us, parse_time};

/// Arguments of `vtax replay-detector`.
#[derive(clap::Args)]
pub struct ReplayArgs {
    /// Data directory of the recording (a store).
    #[arg(long, env = "VTAX_DATA_DIR")]
    data_dir: Option<PathBuf>,
    /// Earliest time replayed, inclusive: `1h` (ago), RFC 3339, a date, or Unix seconds.
    #[arg(long)]
    since: String,
    /// Latest time replayed, exclusive, in the same forms.
    #[arg(long)]
    until: String,
    /// A config file whose `[detect]` section the replay uses (default: the defaults).
    #[arg(long)]
    config: Option<PathBuf>,
}

/// Runs `vtax replay-detector`: one JSON object per opened event on stdout.
/// `detect_config_of` reads the `[detect]` section of a config file.
pub fn replay_detector(
    args: ReplayArgs,
    detect_config_of: impl FnOnce(&std::path::Path) -> Result<DetectConfig>,
) -> Result<()> {
    let data_dir = args.data_dir.unwrap_or_else(crate::default_data_dir);
    if !data_dir.is_dir() {
        bail!("no store at {} (set --data-dir)", data_dir.display());
    }
    let now = now_us();
    let from_us = parse_time(&args.since, now)?;
    let until_us = parse_time(&args.until, now)?;
    if until_us <= from_us {
        bail!("--until must be after --since");
    }
    let config = match &args.config {
        Some(path) => detect_config_of(path)?,
        None => DetectConfig::default(),
    };
    let events = replay(&data_dir, config, from_us, until_us)?;
    let mut out = crate::Stdout;
    for event in &events {
        serde_json::to_writer(&mut out, event)?;
        writeln!(out)?;
    }
    Ok(())
}
