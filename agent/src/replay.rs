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
    #[arg(long, allow_hyphen_values = true)]
    since: String,
    /// Latest time replayed, exclusive, in the same forms.
    #[arg(long, allow_hyphen_values = true)]
    until: String,
    /// A config file whose `[detect]` section the replay uses (default: the defaults).
    #[arg(long)]
    config: Option<PathBuf>,
    /// Leave out damaged files (a footer that does not read, pages whose
    /// CRC-32 fails or that do not decode), naming each on stderr, instead
    /// of failing: the events then lack their rows.
    #[arg(long)]
    skip_damaged: bool,
}

/// Runs `vtax replay-detector`: one JSON object per opened event on stdout.
/// `detect_config_of` reads the `[detect]` section of a config file.
pub fn replay_detector(
    args: ReplayArgs,
    detect_config_of: impl FnOnce(&std::path::Path) -> Result<DetectConfig>,
) -> Result<()> {
    let data_dir = crate::existing_store_dir(args.data_dir)?;
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
    let replayed = match replay(&data_dir, config, from_us, until_us, args.skip_damaged) {
        Ok(replayed) => replayed,
        Err(e)
            if e.downcast_ref::<vtax_store::Error>()
                .is_some_and(|e| e.damaged_file().is_some()) =>
        {
            bail!(
                "{e:#}\nThe file is damaged: --skip-damaged replays the rest without it; \
                 `vtax verify --quarantine`, with the agent stopped, finds every damaged file and moves it aside."
            )
        }
        Err(e) => return Err(e),
    };
    if !replayed.damaged_files.is_empty() {
        // The events go to stdout for a harness to read: what they lack goes
        // beside them, on stderr, as the run ends.
        let mut err = std::io::stderr().lock();
        writeln!(
            err,
            "{} damaged file(s) left out (--skip-damaged): the events lack their rows.",
            replayed.damaged_files.len()
        )?;
        for (path, error) in &replayed.damaged_files {
            writeln!(err, "  {}: {error}", path.display())?;
        }
    }
    let mut out = crate::Stdout;
    for event in &replayed.events {
        serde_json::to_writer(&mut out, event)?;
        writeln!(out)?;
    }
    Ok(())
}
