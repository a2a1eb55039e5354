//! `vtax import`: OpenMetrics / Prometheus text files into the `scraped` table.
//!
//! Every file is parsed once in full before anything is written, so a malformed
//! line is reported with its file and line number and leaves the store untouched.
//!
//! An import is idempotent: run again (after it was killed, or by mistake), a
//! file adds nothing it already added. A series holds one value per instant:
//! before it exits, the import merges every hour it wrote keeping one copy of
//! rows whose tags and time are equal (`Store::compact_all`), and a sample
//! without a timestamp gets its file's modification time, the same at every
//! run.

use std::fs::File;
use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use indicatif::{ProgressBar, ProgressStyle};
use vtax_store::openmetrics::{Format, Parser};
use vtax_store::tables::{self, ScrapedRow};
use vtax_store::{BatchBuilder, Store, StoreOptions};

/// Rows handed to the store per batch.
const IMPORT_BATCH_ROWS: usize = 1 << 16;

/// The longest line an import reads. An exporter's lines are under a few
/// KiB; a file with no newline for gigabytes (a binary file, a label value
/// made to exhaust memory) would otherwise be held whole in memory.
const IMPORT_MAX_LINE_BYTES: usize = 16 << 20;

/// Arguments of `vtax import`.
#[derive(clap::Args)]
pub struct ImportArgs {
    /// Data directory of the store.
    #[arg(long, env = "VTAX_DATA_DIR")]
    data_dir: Option<PathBuf>,
    /// Do not draw a progress bar even on a terminal.
    #[arg(long)]
    no_progress: bool,
    /// OpenMetrics (`# EOF`-terminated, timestamps in seconds) or Prometheus text
    /// (timestamps in milliseconds) files. Samples without a timestamp get the
    /// file's modification time. A time before 1970 (in Prometheus text,
    /// before 1971) or more than a day ahead (a timestamp in the wrong unit)
    /// is refused, with its line. Importing a
    /// file again adds nothing it already added (after a killed import, run
    /// it again).
    #[arg(required = true)]
    files: Vec<PathBuf>,
}

/// How far past the import's start a sample's time may lie: a clock a
/// little ahead, not a unit off by a thousand.
const IMPORT_FUTURE_SLACK_US: i64 = 24 * 3600 * 1_000_000;

/// The first microsecond of 1971: Unix seconds written where Prometheus text
/// takes milliseconds land before it (today's, in the January of 1970; any
/// until the year 2286, by April).
const YEAR_1971_US: i64 = 365 * 24 * 3600 * 1_000_000;

/// Why a sample's time cannot be a measurement's, or None: before 1970, in
/// 1970 unless `may_be_1970`, or more than a day after `now_us`. Each is what
/// a timestamp in the wrong unit gives (Unix seconds where Prometheus text
/// wants milliseconds land in January 1970, microseconds tens of millennia
/// ahead), and a store would file the rows under a day no query or
/// retention looks at. OpenMetrics takes seconds, so no slip lands its
/// timestamps in 1970, and they are kept there as Prometheus keeps them; a
/// file's modification time in 1970 (a Nix store's, a reproducible
/// archive's) is no sample's time in either format.
fn implausible_time(time_us: i64, now_us: i64, may_be_1970: bool) -> Option<String> {
    const YEAR_US: f64 = 365.2425 * 24.0 * 3600.0 * 1e6;
    let year = (1970.0 + time_us as f64 / YEAR_US).floor();
    if time_us < 0 {
        Some(format!("before 1970 (the year {year:.0})"))
    } else if time_us < YEAR_1971_US && !may_be_1970 {
        let day = time_us / vtax_store::DAY_US + 1;
        Some(format!("in 1970 (its day {day})"))
    } else if time_us > now_us.saturating_add(IMPORT_FUTURE_SLACK_US) {
        Some(format!("more than a day ahead of now (the year {year:.0})"))
    } else {
        None
    }
}

/// What says a file is the one that was checked: its inode, size and
/// modification time.
#[derive(Debug, PartialEq)]
struct Identity {
    device: u64,
    inode: u64,
    len: u64,
    modified: Option<std::time::SystemTime>,
}

/// `path`'s identity; an error unless it is a regular file.
fn identity(path: &Path) -> Result<Identity> {
    use std::os::unix::fs::MetadataExt;
    let meta = std::fs::metadata(path).with_context(|| format!("stat {}", path.display()))?;
    if !meta.is_file() {
        bail!(
            "{}: not a regular file (a pipe or a device): an import reads each file twice, \
             to check it and then to write it; save it to a file first",
            path.display()
        );
    }
    Ok(Identity {
        device: meta.dev(),
        inode: meta.ino(),
        len: meta.len(),
        modified: meta.modified().ok(),
    })
}

/// Calls `on_sample(metric, labels, value, time_us)` for each sample of `path`.
fn for_each_sample(
    path: &Path,
    default_time_us: i64,
    progress: &ProgressBar,
    mut on_sample: impl FnMut(&str, &str, f64, i64) -> Result<()>,
) -> Result<u64> {
    let now_us = crate::timespec::now_us();
    let mut file = File::open(path).with_context(|| format!("open {}", path.display()))?;
    let mut head = vec![0u8; 64 * 1024];
    let n = read_up_to(&mut file, &mut head).with_context(|| format!("read {}", path.display()))?;
    head.truncate(n);
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
    let format: Format = Parser::detect(&String::from_utf8_lossy(&head), name);
    // A name that says the format declares it (`# EOF` in a `.prom` file is a
    // comment, as Prometheus reads it); one guessed from the content is
    // held to it.
    let mut parser = if Parser::format_of_name(name).is_some() {
        Parser::declared(format)
    } else {
        Parser::new(format)
    };
    let mut reader = BufReader::with_capacity(1 << 20, head.chain(file));
    let mut line = Vec::with_capacity(4096);
    let mut samples = 0u64;
    let mut since_progress = 0usize;
    loop {
        line.clear();
        let read = (&mut reader)
            .take(IMPORT_MAX_LINE_BYTES as u64 + 1)
            .read_until(b'\n', &mut line)
            .with_context(|| format!("read {}", path.display()))?;
        if read == 0 {
            break;
        }
        if read > IMPORT_MAX_LINE_BYTES && line.last() != Some(&b'\n') {
            bail!(
                "{}:line {}: longer than {} MiB: not OpenMetrics or Prometheus text as \
                 exporters write it",
                path.display(),
                parser.line_number() + 1,
                IMPORT_MAX_LINE_BYTES >> 20
            );
        }
        since_progress += read;
        if since_progress > (1 << 20) {
            progress.inc(since_progress as u64);
            since_progress = 0;
        }
        if line.last() == Some(&b'\n') {
            line.pop();
        }
        let text = match std::str::from_utf8(&line) {
            Ok(text) => text,
            // A plain comment is skipped unread, whatever its bytes, as
            // Prometheus and the scrape skip it.
            Err(_) if is_plain_comment(&line) => "#",
            Err(_) => bail!(
                "{}:line {}: not UTF-8",
                path.display(),
                parser.line_number() + 1
            ),
        };
        match parser.parse_line(text) {
            Ok(Some(sample)) => {
                let time_us = sample.timestamp_us.unwrap_or(default_time_us);
                let may_be_1970 = format == Format::OpenMetrics && sample.timestamp_us.is_some();
                if let Some(when) = implausible_time(time_us, now_us, may_be_1970) {
                    let why = match sample.timestamp_us {
                        Some(_) if time_us < 0 => {
                            format!("its timestamp is {when}, no measurement's time")
                        }
                        Some(_) if time_us < YEAR_1971_US => format!(
                            "its timestamp is {when}: Prometheus text gives milliseconds, and \
                             Unix seconds written for them land in the first months of 1970"
                        ),
                        Some(_) => format!(
                            "its timestamp is {when}: Prometheus text gives milliseconds, \
                             OpenMetrics seconds, and microseconds or nanoseconds written for \
                             either land this far ahead"
                        ),
                        None => format!(
                            "it has no timestamp, and the file's modification time, which it \
                             would take, is {when}"
                        ),
                    };
                    bail!("{}:line {}: {why}", path.display(), parser.line_number());
                }
                on_sample(sample.metric, &sample.labels, sample.value, time_us)?;
                samples += 1;
            }
            Ok(None) => {}
            Err(e) => bail!("{}:{e}", path.display()),
        }
    }
    progress.inc(since_progress as u64);
    parser
        .finish()
        .map_err(|e| anyhow::anyhow!("{}:{e}", path.display()))?;
    Ok(samples)
}

/// Whether a line is a comment that says nothing to a parser: `#` but not
/// `# HELP`, `# TYPE` or `# UNIT` (a line that is `# EOF` is UTF-8, and one
/// that only starts so is a comment).
fn is_plain_comment(line: &[u8]) -> bool {
    let line = line.trim_ascii_start();
    line.starts_with(b"#")
        && !["# HELP ", "# TYPE ", "# UNIT "]
            .iter()
            .any(|marker| line.starts_with(marker.as_bytes()))
}

fn read_up_to(file: &mut File, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut filled = 0;
    while filled < buf.len() {
        match file.read(&mut buf[filled..])? {
            0 => break,
            n => filled += n,
        }
    }
    Ok(filled)
}

fn progress_bar(total_bytes: u64, hidden: bool, what: &str) -> ProgressBar {
    if hidden {
        return ProgressBar::hidden();
    }
    // indicatif draws nothing when stderr is not a terminal.
    let bar = ProgressBar::new(total_bytes);
    bar.set_style(
        ProgressStyle::with_template(
            "{msg:>9} [{bar:40}] {bytes}/{total_bytes} ({bytes_per_sec}, {eta})",
        )
        .expect("static template")
        .progress_chars("=> "),
    );
    bar.set_message(what.to_string());
    bar
}

/// The time of a file's samples that carry none: its modification time, so
/// that importing it again gives them the same time.
fn default_time_us(path: &Path) -> Result<i64> {
    let modified = std::fs::metadata(path)
        .and_then(|m| m.modified())
        .with_context(|| format!("stat {}", path.display()))?;
    Ok(match modified.duration_since(std::time::UNIX_EPOCH) {
        Ok(d) => d.as_micros() as i64,
        Err(e) => -(e.duration().as_micros() as i64),
    })
}

/// Runs `vtax import`.
pub fn import(args: ImportArgs) -> Result<()> {
    let data_dir = args.data_dir.unwrap_or_else(crate::default_data_dir);

    // Each file is read twice, checked then written: a pipe would give its
    // text to the check and nothing to the write, and a file changed between
    // the two would be written unchecked.
    let identities = args
        .files
        .iter()
        .map(|f| identity(f))
        .collect::<Result<Vec<_>>>()?;
    let total_bytes: u64 = identities.iter().map(|i| i.len).sum();

    // Pass 1: parse everything, write nothing.
    let bar = progress_bar(total_bytes, args.no_progress, "checking");
    let mut expected = 0;
    for path in &args.files {
        expected += for_each_sample(path, default_time_us(path)?, &bar, |_, _, _, _| Ok(()))?;
    }
    bar.finish_and_clear();

    for (path, checked) in args.files.iter().zip(&identities) {
        if identity(path)? != *checked {
            bail!(
                "{}: changed since it was checked; nothing was written. Import a file \
                 nobody writes to.",
                path.display()
            );
        }
    }

    // Pass 2: write.
    // A series holds one value per instant: what two files of one import
    // share is published once, as the merges below keep it once.
    let options = StoreOptions {
        one_row_per_instant: Some(tables::SCRAPED.name),
        ..StoreOptions::new(&data_dir)
    };
    let mut store = match Store::open(options, crate::catalog()) {
        Ok(store) => store,
        Err(e @ vtax_store::Error::Locked { .. }) => bail!(
            "{e}: a store has one writer. Stop the agent for the import (systemctl stop vtax, \
             then start it again), or import into a data directory of its own (--data-dir) \
             and read it with vtax query --data-dir"
        ),
        Err(e) => return Err(e).with_context(|| format!("open store {}", data_dir.display())),
    };
    // Rows a killed agent or import left in the WAL are published first, so
    // that the table's rows before and after say what the import added.
    store.flush().context("publish the rows the WAL held")?;
    let scraped_before = scraped_rows(&store);
    let bar = progress_bar(total_bytes, args.no_progress, "importing");
    let mut builder = BatchBuilder::new(&tables::SCRAPED);
    let mut last_sync = Instant::now();
    let started = Instant::now();
    let mut imported = 0;
    for path in &args.files {
        imported += for_each_sample(
            path,
            default_time_us(path)?,
            &bar,
            |metric, labels, value, time_us| {
                let row = ScrapedRow {
                    target: "",
                    metric,
                    labels,
                    value: Some(value),
                };
                builder.push_row(time_us, &row)?;
                if builder.len() >= IMPORT_BATCH_ROWS {
                    store.append(&builder.finish())?;
                    store.publish_over_budget()?;
                    if last_sync.elapsed() >= Duration::from_secs(1) {
                        store.sync()?;
                        last_sync = Instant::now();
                    }
                }
                Ok(())
            },
        )?;
    }
    if !builder.is_empty() {
        store.append(&builder.finish())?;
    }
    // Imported history is mostly finished hours and days: publish what is
    // buffered, then merge them as the running agent would, so the store is in its
    // steady shape at once.
    store.flush().context("publish imported rows")?;
    store
        .compact_all(crate::timespec::now_us(), tables::SCRAPED.name)
        .context("merge imported hours")?;
    let repeated = store
        .stats()
        .rows_repeated
        .get(tables::SCRAPED.name)
        .copied()
        .unwrap_or(0);
    let scraped_after = scraped_rows(&store);
    store.close().context("close the store")?;
    bar.finish_and_clear();
    if imported != expected {
        bail!(
            "the files changed while they were imported: {imported} samples written where the \
             check read {expected}; import them again from files nobody writes to"
        );
    }
    let seconds = started.elapsed().as_secs_f64();
    let files = args.files.len();
    let rate = format!(
        "in {seconds:.2} s ({:.0} samples/s, peak resident {} MiB)",
        imported as f64 / seconds.max(1e-9),
        peak_resident_bytes().map_or("?".into(), |b| (b >> 20).to_string()),
    );
    // The merges that keep one row per series and instant may also leave
    // out the store's own repeats (a killed import's rows, an agent's
    // timestamped scrape read again after a restart): only a store that held
    // no `scraped` row before says which of them were this import's.
    if repeated == 0 || scraped_before == 0 {
        eprintln!(
            "Imported {} samples from {files} file(s) into {} {rate}.",
            imported - repeated.min(imported),
            data_dir.display(),
        );
        if repeated > 0 {
            eprintln!(
                "{repeated} of the {imported} samples read repeated a series and time (in these \
                 files) and were left out: a series holds one value per instant, the first \
                 written kept."
            );
        }
    } else {
        eprintln!(
            "Read {imported} samples from {files} file(s) into {} {rate}; its scraped table \
             went from {scraped_before} to {scraped_after} rows.",
            data_dir.display(),
        );
        eprintln!(
            "{repeated} rows that repeated a series and time the store already held were left \
             out (samples of these files, of an earlier import, or the store's own rows: a \
             killed import's, an agent's scrape read again after a restart): a series holds \
             one value per instant, the first written kept."
        );
    }
    Ok(())
}

/// Rows of the `scraped` table in the store's files (nothing is buffered
/// when it is called).
fn scraped_rows(store: &Store) -> u64 {
    store
        .files()
        .filter(|f| f.table == tables::SCRAPED.name)
        .map(|f| f.rows)
        .sum()
}

/// Peak resident set size of this process (`VmHWM`).
fn peak_resident_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}
