//! `vtax`: the node agent and the commands that work on its store. The
//! binary (`src/main.rs`) calls [`main`]; the library is there so that
//! benches and examples (`benches/`, `examples/`) reach the agent's parts.

mod args;
mod build_info;
#[cfg(test)]
mod collector_config_tests;
pub mod config;
mod config_status;
mod doctor;
#[cfg(test)]
mod golden;
#[cfg(test)]
mod hot_text;
mod import;
mod memory;
mod probe_gpu;
mod query;
mod replay;
mod report;
pub mod run;
mod runtime;
pub mod store_report;
mod timespec;
mod upload;
mod web;

use std::path::PathBuf;
use std::process::ExitCode;

// The collectors are their own crate, which depends on none of the runtime,
// the config loader or the detector; the agent names them as before.
use vtax_collectors as collectors;
use vtax_collectors::{keys, ticks};
// The detector is its own crate too: rows in, events and the verdict out.
use vtax_detect as detect;
use vtax_detect::stored_rows;

use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};

/// Where the store lives when installed as a package.
pub const INSTALLED_DATA_DIR: &str = "/var/lib/vtax";
/// Where the store lives otherwise: relative to the working directory.
pub const LOCAL_DATA_DIR: &str = "./vtax-data";

/// The default data directory: the installed one when it exists, else a local one.
pub fn default_data_dir() -> PathBuf {
    if std::path::Path::new(INSTALLED_DATA_DIR).is_dir() {
        PathBuf::from(INSTALLED_DATA_DIR)
    } else {
        PathBuf::from(LOCAL_DATA_DIR)
    }
}

/// The store a command reads: `--data-dir`, else the default, which must
/// exist. Only `vtax run` and `vtax import` create a store: a mistyped path
/// is an error here, not an empty store that verifies or compacts clean.
pub fn existing_store_dir(data_dir: Option<PathBuf>) -> anyhow::Result<PathBuf> {
    let dir = data_dir.unwrap_or_else(default_data_dir);
    check_store_dir(&dir)?;
    Ok(dir)
}

/// Whether `dir` is a store (or a fleet copy): it holds `tables/` or, for
/// a young agent's, `wal/`. Any other directory (`/var/lib` for
/// `/var/lib/vtax`) verified as sound with 0 files and queried as empty;
/// one this user may not read said "no store" or "no rows".
pub fn check_store_dir(dir: &std::path::Path) -> anyhow::Result<()> {
    use std::io::ErrorKind;
    let denied = |e: &std::io::Error| {
        anyhow::anyhow!(
            "cannot read the store at {}: {e} (run as its owner, the vtax user on a packaged \
             node, or as root)",
            dir.display()
        )
    };
    let holds = |name: &str| match std::fs::metadata(dir.join(name)) {
        Ok(meta) => Ok(meta.is_dir()),
        Err(e) if e.kind() == ErrorKind::PermissionDenied => Err(denied(&e)),
        Err(_) => Ok(false),
    };
    match std::fs::metadata(dir) {
        Ok(meta) if meta.is_dir() => {}
        Err(e) if e.kind() == ErrorKind::PermissionDenied => return Err(denied(&e)),
        _ => anyhow::bail!("no store at {} (set --data-dir)", dir.display()),
    }
    if !holds("tables")? && !holds("wal")? {
        anyhow::bail!(
            "no store at {} (a store holds tables/ or wal/; set --data-dir)",
            dir.display()
        );
    }
    Ok(())
}

/// Set once a write to stdout found its reader gone (`vtax catalogue |
/// head`): `main` then ends quietly, whatever error the write became on its
/// way up (a CSV writer keeps only the text of the I/O error).
static STDOUT_CLOSED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Stdout for the commands' output: where `print!` would panic on a closed
/// pipe, its writes return the error and note it in [`STDOUT_CLOSED`].
pub struct Stdout;

impl Stdout {
    fn note<T>(result: std::io::Result<T>) -> std::io::Result<T> {
        if let Err(e) = &result {
            if e.kind() == std::io::ErrorKind::BrokenPipe {
                STDOUT_CLOSED.store(true, std::sync::atomic::Ordering::Relaxed);
            }
        }
        result
    }
}

impl std::io::Write for Stdout {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        Self::note(std::io::stdout().lock().write(buf))
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Self::note(std::io::stdout().lock().flush())
    }
}

/// Whether a character in a name acts on the text around it instead of
/// showing: a control character (but the newline and the tab), or a
/// Unicode direction or invisible formatting mark. A cgroup named
/// `job\u{202e}71_boj` shows as another job's name, its letters reversed.
pub fn acts_on_text(c: char) -> bool {
    (c.is_control() && c != '\n' && c != '\t')
        || matches!(c,
            '\u{061c}' | '\u{200b}'..='\u{200f}' | '\u{202a}'..='\u{202e}'
            | '\u{2060}'..='\u{2064}' | '\u{2066}'..='\u{2069}' | '\u{feff}')
}

/// `text` with the characters that act on text ([`acts_on_text`]) written
/// as escapes (`\u{1b}`, `\u{202e}`): the doctor's problems, errors and
/// tables carry what a cgroup, mount, interface or file was named, and an
/// escape sequence in such a name would act on the terminal that shows it.
pub fn for_terminal(text: &str) -> std::borrow::Cow<'_, str> {
    let acts = acts_on_text;
    if !text.chars().any(acts) {
        return std::borrow::Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        if acts(c) {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    std::borrow::Cow::Owned(out)
}

/// Writes a command's output to stdout, through [`Stdout`], with its
/// control characters escaped ([`for_terminal`]).
pub fn print_stdout(text: &str) -> anyhow::Result<()> {
    use std::io::Write;
    Stdout.write_all(for_terminal(text).as_bytes())?;
    Stdout.flush()?;
    Ok(())
}

#[derive(Parser)]
#[command(
    name = "vtax",
    version,
    about = "Node telemetry agent and Parquet time-series store for GPU servers"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the agent: sample this node, write every sample to the store, serve /metrics.
    Run(run::RunArgs),
    /// Validate the config file and flags without starting.
    CheckConfig(doctor::CheckConfigArgs),
    /// Report on this node: each collector on or off and why, what it found, problems.
    Doctor(doctor::DoctorArgs),
    /// Import OpenMetrics or Prometheus text files into the `scraped` table.
    ///
    /// The store has one writer: beside a running agent on the same data
    /// directory this is refused. Stop the agent for the import
    /// (`systemctl stop vtax`, then start it again), or import into a data
    /// directory of its own and read it with `vtax query --data-dir`.
    Import(import::ImportArgs),
    /// Read rows of a table.
    Query(query::QueryArgs),
    /// Write a self-contained HTML report of a node's store or a fleet copy.
    Report(report::ReportArgs),
    /// Merge each finished day's files into one and apply retention.
    Compact(run::CompactArgs),
    /// Read every page of the store's files; report (or quarantine) damaged ones.
    Verify(run::VerifyArgs),
    /// Upload the store's sealed Parquet files to object storage, once.
    Upload(upload::UploadArgs),
    /// Print the metric catalogue generated from the table declarations.
    Catalogue,
    /// Replay a store's recorded rows through a fresh detector; print the events it opens.
    ReplayDetector(replay::ReplayArgs),
    /// Measure what transfers to, from and between GPUs get, and an empty
    /// kernel's launch, each against its peak (PCIe, HBM, NVLink).
    ///
    /// Loads the CUDA driver (libcuda.so.1) and copies 256 MiB at a time:
    /// run it on idle GPUs, as it takes GPU time from anything running.
    ProbeGpu(probe_gpu::ProbeGpuArgs),
}

/// Every table the agent writes: the store's own and the collectors'.
pub fn catalog() -> vtax_store::Catalog {
    let mut tables: Vec<&'static vtax_store::TableDef> = vtax_store::tables::BUILTIN.to_vec();
    tables.extend(collectors::tables());
    tables.push(&vtax_exporters::web::TABLE);
    tables.extend(detect::tables::TABLES);
    vtax_store::Catalog::new(&tables).expect("the built-in table declarations are valid")
}

/// Subcommands that take the agent's flags, `--collector.<name>` included.
const AGENT_SUBCOMMANDS: &[&str] = &["run", "check-config", "doctor"];

/// Parses the command line; the per-collector flags are added at run time
/// from the collector registry, so a new collector brings its own flags.
fn parse_cli() -> Result<Cli, clap::Error> {
    let mut command = Cli::command();
    for name in AGENT_SUBCOMMANDS {
        command = command.mut_subcommand(*name, args::add_collector_flags);
    }
    let matches = command.get_matches();
    let mut cli = Cli::from_arg_matches(&matches)?;
    if let Some((_, sub)) = matches.subcommand() {
        match &mut cli.command {
            Command::Run(a) => a.agent.take_collector_flags(sub),
            Command::CheckConfig(a) => a.agent.take_collector_flags(sub),
            Command::Doctor(a) => a.agent.take_collector_flags(sub),
            _ => {}
        }
    }
    Ok(cli)
}

/// The log level when `VTAX_LOG` is not set: `info`, but `error` for `vtax
/// doctor`, whose report already says what the collectors' warnings would
/// (a lost GPU, a file that reads badly), and says it once.
fn default_log_level(command: &Command) -> &'static str {
    match command {
        Command::Doctor(_) => "error",
        _ => "info",
    }
}

/// Runs the command line: what the `vtax` binary does.
pub fn main() -> ExitCode {
    let cli = match parse_cli() {
        Ok(cli) => cli,
        Err(e) => e.exit(),
    };
    // Logs go to stderr, always: stdout is the commands' output.
    let (filter, refused) = match tracing_subscriber::EnvFilter::try_from_env("VTAX_LOG") {
        Ok(filter) => (filter, None),
        Err(e) => {
            // Unset is the default; a value that does not parse is said,
            // once logging is up, rather than dropped in silence.
            let refused = std::env::var_os("VTAX_LOG").map(|_| e.to_string());
            (default_log_level(&cli.command).into(), refused)
        }
    };
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    if let Some(error) = refused {
        tracing::warn!(%error, "VTAX_LOG does not parse: logging at the default level.");
    }
    let result = match cli.command {
        Command::Run(args) => run::run(args),
        Command::CheckConfig(args) => doctor::check_config(args),
        Command::Doctor(args) => doctor::doctor(args),
        Command::Import(args) => import::import(args),
        Command::Query(args) => query::query(args),
        Command::Compact(args) => run::compact(args),
        Command::Verify(args) => run::verify(args),
        Command::Report(args) => report::report(args),
        Command::Upload(args) => upload::upload(args),
        Command::ReplayDetector(args) => {
            replay::replay_detector(args, |path| Ok(config::Config::load(path)?.detect))
        }
        Command::ProbeGpu(args) => probe_gpu::probe_gpu(args),
        Command::Catalogue => {
            print_stdout(&vtax_store::schema::render_catalogue(catalog().tables()))
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        // The reader of stdout closed it: what it did not read is not wanted.
        Err(_) if STDOUT_CLOSED.load(std::sync::atomic::Ordering::Relaxed) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("vtax: error: {}", for_terminal(&error_chain(&e)));
            ExitCode::from(1)
        }
    }
}

/// An error and its causes, joined by ": " as `{:#}` joins them, less each
/// cause whose text is already in the line: libraries that print their cause
/// in their own message (the Parquet reader's errors do) would otherwise
/// repeat it once for every level.
fn error_chain(e: &anyhow::Error) -> String {
    let mut line = String::new();
    for cause in e.chain() {
        let text = cause.to_string();
        if line.contains(&text) {
            continue;
        }
        if !line.is_empty() {
            line.push_str(": ");
        }
        line.push_str(&text);
    }
    line
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An error that prints its cause in its own message and also gives it
    /// as its source, as the Parquet reader's `External` errors do.
    #[derive(Debug)]
    struct External(std::io::Error);

    impl std::fmt::Display for External {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            write!(f, "External: {}", self.0)
        }
    }

    impl std::error::Error for External {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            Some(&self.0)
        }
    }

    #[test]
    fn an_error_chain_names_each_cause_once() {
        let cause = External(std::io::Error::other("Unexpected struct field type 15"));
        let e = anyhow::Error::new(cause).context("scan cpu in /data");
        assert_eq!(
            format!("{e:#}"),
            "scan cpu in /data: External: Unexpected struct field type 15: \
             Unexpected struct field type 15"
        );
        assert_eq!(
            error_chain(&e),
            "scan cpu in /data: External: Unexpected struct field type 15"
        );
        let plain = anyhow::anyhow!("no such table").context("query");
        assert_eq!(error_chain(&plain), "query: no such table");
    }

    /// `--help` of each command that simulates GPUs lists every scenario
    /// with its line of help.
    #[test]
    fn help_lists_every_simulated_gpu_scenario() {
        for name in AGENT_SUBCOMMANDS {
            let help = Cli::command()
                .find_subcommand_mut(name)
                .expect("an agent subcommand")
                .render_long_help()
                .to_string();
            for (scenario, what) in collectors::gpu::sim::SCENARIOS {
                assert!(
                    help.lines()
                        .any(|l| l.trim_start().starts_with(&format!("- {scenario}:"))
                            && l.ends_with(what.help())),
                    "vtax {name} --help lacks {scenario}:\n{help}"
                );
            }
        }
    }

    /// `docs/metrics.md` is generated from the declarations; this catches drift.
    #[test]
    fn catalogue_matches_docs() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/metrics.md");
        let generated = vtax_store::schema::render_catalogue(catalog().tables());
        if std::env::var_os("VTAX_UPDATE_GOLDEN").is_some() {
            std::fs::write(path, &generated).unwrap();
        }
        let on_disk = std::fs::read_to_string(path).unwrap_or_default();
        assert!(
            on_disk == generated,
            "docs/metrics.md is stale: run `VTAX_UPDATE_GOLDEN=1 cargo test -p vtax catalogue`"
        );
    }
}
