//! `vtax doctor` and `vtax check-config`: what the agent would do on this node,
//! for a person, without starting it.

use std::fmt::Write as _;

use anyhow::Result;

use crate::args::AgentArgs;
use crate::collectors::{Availability, ABSENT_REPROBE_SECS, FAILED_REPROBE_MAX_SECS, NAMES};
use crate::config::Config;
use crate::timespec::now_us;

/// Arguments of `vtax check-config`.
#[derive(clap::Args)]
pub struct CheckConfigArgs {
    #[command(flatten)]
    pub agent: AgentArgs,
    /// Print the default config file (what `packaging/vtax.example.toml` holds) and exit.
    #[arg(long)]
    print_defaults: bool,
}

/// Validates the config file and flags, and the web config file they name.
pub fn check_config(args: CheckConfigArgs) -> Result<()> {
    if args.print_defaults {
        return crate::print_stdout(&crate::config::render_example());
    }
    let config = args.agent.resolve()?;
    crate::args::check_beyond_values(&config)?;
    crate::print_stdout(&match args.agent.config_path() {
        Some(path) => format!("{}: valid\n", path.display()),
        None => "no config file: the defaults are valid\n".to_string(),
    })
}

/// Arguments of `vtax doctor`.
#[derive(clap::Args)]
pub struct DoctorArgs {
    #[command(flatten)]
    pub agent: AgentArgs,
    /// Also list every GPU with each metric's value and whether it is supported.
    #[arg(long)]
    pub gpu: bool,
}

/// Prints the doctor's report.
pub fn doctor(args: DoctorArgs) -> Result<()> {
    let config = args.agent.resolve()?;
    let source = match args.agent.config_path() {
        Some(path) => path.display().to_string(),
        None => "none (defaults and flags)".into(),
    };
    let mut out = report(&config, &source);
    if args.gpu {
        out.push_str("\ngpus:\n");
        for line in crate::collectors::gpu::doctor_lines(&config.collectors.gpu, &config.roots()) {
            out.push_str(&format!("  {line}\n"));
        }
    }
    crate::print_stdout(&out)
}

/// How long the doctor waits for one collector's probe and read: one that
/// blocks (NVML's init on a wedged GPU, a file of a hung driver) is named,
/// not waited for, and the other collectors are still examined.
const DOCTOR_WAIT: std::time::Duration = std::time::Duration::from_secs(15);

/// What one collector's probe and read gave.
struct Examined {
    probed: Availability,
    /// The read, when the probe found the source.
    read: Option<Result<Vec<vtax_store::Batch>>>,
    source_errors: Vec<crate::collectors::ParseError>,
    problems: Vec<String>,
}

/// Probes `collector` and, when its source is there, reads it once, on a
/// thread of its own; `None` when that has not returned in [`DOCTOR_WAIT`]
/// (the thread is left behind: the process ends after the report).
fn examine(mut collector: Box<dyn crate::collectors::Collector>) -> Option<Examined> {
    let (done, result) = std::sync::mpsc::channel();
    let thread = std::thread::Builder::new()
        .name(format!("doctor-{}", collector.name()))
        .spawn(move || {
            let probed = collector.probe();
            let read =
                matches!(probed, Availability::Available(_)).then(|| collector.collect(now_us()));
            let _ = done.send(Examined {
                probed,
                read,
                source_errors: collector.source_errors(),
                problems: collector.problems(),
            });
        });
    thread.ok()?;
    result.recv_timeout(DOCTOR_WAIT).ok()
}

/// The report: each collector on or off and why, what it found, and problems.
pub fn report(config: &Config, config_source: &str) -> String {
    let mut out = String::new();
    let roots = config.roots();
    let _ = writeln!(
        out,
        "vtax {} on {}",
        env!("CARGO_PKG_VERSION"),
        config.node_name()
    );
    let _ = writeln!(out, "config: {config_source}");
    let _ = writeln!(
        out,
        "procfs: {}  sysfs: {}  rootfs: {}  data: {}  listen: {}\n",
        roots.procfs.display(),
        roots.sysfs.display(),
        roots.rootfs.display(),
        config.data_dir().display(),
        config.web.listen_address
    );
    // What a start would refuse beyond the values (a web config file, the
    // data directory) is a problem of this node as much as a collector's.
    let mut problems: Vec<String> = crate::args::check_beyond_values(config)
        .err()
        .map(|e| format!("{e:#}"))
        .into_iter()
        .collect();
    let mut facts = crate::detect::verdict::Facts::default();
    let _ = writeln!(out, "collectors:");
    for &name in NAMES {
        let common = config
            .collectors
            .common(name)
            .expect("every name has settings");
        if !common.enabled() {
            let _ = writeln!(out, "  {name:<11} off  disabled by configuration");
            continue;
        }
        let collector = config
            .collectors
            .build(name, &roots)
            .expect("every name builds");
        let Some(examined) = examine(collector) else {
            let _ = writeln!(
                out,
                "  {name:<11} ??   its probe or read did not return in {} s",
                DOCTOR_WAIT.as_secs()
            );
            problems.push(format!(
                "{name}: a read did not return in {} s (a driver or a file that blocks: a wedged GPU, a hung NFS mount); the agent reports this collector stuck and carries on",
                DOCTOR_WAIT.as_secs()
            ));
            continue;
        };
        match examined.probed {
            Availability::Absent(reason) => {
                let _ = writeln!(
                    out,
                    "  {name:<11} off  {reason} (probed again every {ABSENT_REPROBE_SECS} s)"
                );
            }
            Availability::Failed(error) => {
                let _ = writeln!(
                    out,
                    "  {name:<11} off  its source reads badly (probed again, backing off to {FAILED_REPROBE_MAX_SECS} s)"
                );
                problems.push(format!("{name}: {error}"));
            }
            Availability::Available(found) => {
                let _ = writeln!(
                    out,
                    "  {name:<11} on   every {}s: {found}",
                    common.interval_secs()
                );
                match examined.read {
                    Some(Ok(batches)) => {
                        for batch in &batches {
                            facts.observe(batch);
                        }
                        let rows: usize = batches.iter().map(|b| b.len()).sum();
                        let samples: usize = batches.iter().map(|b| b.sample_count()).sum();
                        let _ = writeln!(
                            out,
                            "  {:<11}      one read: {rows} rows, {samples} samples",
                            ""
                        );
                    }
                    Some(Err(e)) => problems.push(format!("{name}: {e:#}")),
                    None => {}
                }
                for error in examined.source_errors {
                    problems.push(format!(
                        "{name}: {error} (this file's rows are left out, the others are read)"
                    ));
                }
                for problem in examined.problems {
                    problems.push(format!("{name}: {problem}"));
                }
            }
        }
    }
    // One verdict, the host and its GPUs together; the evidence under it.
    let verdict = facts.verdict();
    let _ = writeln!(out, "\nplatform:");
    let _ = writeln!(out, "  verdict: {}", verdict.sentence());
    for line in verdict.explain() {
        let _ = writeln!(out, "    {line}");
    }
    if config.collectors.platform.enabled {
        for line in crate::collectors::platform::doctor_lines(&roots) {
            let _ = writeln!(out, "    {line}");
        }
    } else {
        let _ = writeln!(
            out,
            "    the platform collector is off: the host is not known"
        );
    }
    if config.detect.enabled {
        let _ = writeln!(
            out,
            "    measured tax: {}",
            crate::detect::restore::last_tax(&config.data_dir())
        );
    }
    let _ = writeln!(out, "\nproblems:");
    if problems.is_empty() {
        let _ = writeln!(out, "  none found");
    }
    for problem in problems {
        let _ = writeln!(out, "  - {problem}");
    }
    out
}
