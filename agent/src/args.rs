//! Flags shared by `vtax run`, `vtax check-config` and `vtax doctor`: they name
//! the config file and override it, after the Prometheus exporters' conventions.

use std::path::{Path, PathBuf};

use anyhow::{bail, Result};
use clap::{Arg, ArgAction, ArgMatches};

use crate::collectors::NAMES;
use crate::config::{Config, INSTALLED_CONFIG_PATH};

/// The agent's flags. Each one, when given, overrides the config file.
#[derive(clap::Args, Clone, Debug, Default)]
pub struct AgentArgs {
    /// Config file (default: /etc/vtax/vtax.toml when it exists; none is needed).
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Data directory of the store (default: /var/lib/vtax when it exists, else ./vtax-data).
    #[arg(long, env = "VTAX_DATA_DIR")]
    pub data_dir: Option<PathBuf>,
    /// The node's name in the store's files, a fleet copy and remote write's
    /// instance label (default: the host name).
    #[arg(long = "store.node", value_name = "NAME", env = "VTAX_NODE")]
    pub node: Option<String>,
    /// Address to serve /metrics on (default :9433).
    #[arg(long = "web.listen-address")]
    pub listen_address: Option<String>,
    /// Web config file for TLS and basic auth (the Prometheus exporters' format).
    #[arg(long = "web.config.file")]
    pub web_config_file: Option<PathBuf>,
    /// procfs mount point (default /proc).
    #[arg(long = "path.procfs")]
    pub procfs: Option<PathBuf>,
    /// sysfs mount point (default /sys).
    #[arg(long = "path.sysfs")]
    pub sysfs: Option<PathBuf>,
    /// Where the host's root filesystem is mounted (default /; /host in a container).
    #[arg(long = "path.rootfs")]
    pub rootfs: Option<PathBuf>,
    /// Simulate this many GPUs instead of reading NVML (tests, dashboards, demos).
    #[arg(long = "simulate-gpus", value_name = "N")]
    pub simulate_gpus: Option<u32>,
    /// What the simulated GPUs do, GPU i playing the i-th (in turn), e.g.
    /// `training,memory-bound,gpu-lost`.
    #[arg(
        long = "simulate-gpu-scenarios",
        value_name = "LIST",
        value_delimiter = ',',
        value_parser = scenario_names()
    )]
    pub simulate_gpu_scenarios: Option<Vec<String>>,
    /// `--collector.<name>` (true) and `--no-collector.<name>` (false), from the
    /// flags added by `add_collector_flags`.
    #[arg(skip)]
    pub collector_flags: Vec<(String, bool)>,
}

/// The simulator's scenarios as the flag's possible values, each with its
/// line of help: `--help` lists them, and a misspelt one is refused with them.
fn scenario_names() -> clap::builder::PossibleValuesParser {
    use crate::collectors::gpu::sim::SCENARIOS;
    SCENARIOS
        .iter()
        .map(|(name, scenario)| clap::builder::PossibleValue::new(*name).help(scenario.help()))
        .collect::<Vec<_>>()
        .into()
}

/// Adds `--collector.<name>` and `--no-collector.<name>` for every collector.
pub fn add_collector_flags(command: clap::Command) -> clap::Command {
    let mut command = command;
    for name in NAMES {
        let on = format!("collector.{name}");
        let off = format!("no-collector.{name}");
        command = command
            .arg(
                Arg::new(on.clone())
                    .long(on.clone())
                    .action(ArgAction::SetTrue)
                    .overrides_with(off.clone())
                    .help(format!("Enable the {name} collector")),
            )
            .arg(
                Arg::new(off.clone())
                    .long(off)
                    .action(ArgAction::SetTrue)
                    .overrides_with(on)
                    .help(format!("Disable the {name} collector")),
            );
    }
    command
}

impl AgentArgs {
    /// Picks the collector flags out of parsed matches.
    pub fn take_collector_flags(&mut self, matches: &ArgMatches) {
        for name in NAMES {
            if matches.get_flag(&format!("collector.{name}")) {
                self.collector_flags.push((name.to_string(), true));
            }
            if matches.get_flag(&format!("no-collector.{name}")) {
                self.collector_flags.push((name.to_string(), false));
            }
        }
    }

    /// The config file in force: the flag's, else the installed one if present.
    pub fn config_path(&self) -> Option<PathBuf> {
        self.config.clone().or_else(|| {
            Path::new(INSTALLED_CONFIG_PATH)
                .is_file()
                .then(|| PathBuf::from(INSTALLED_CONFIG_PATH))
        })
    }

    /// Loads the config file (if any), applies the flags, and validates the result.
    pub fn resolve(&self) -> Result<Config> {
        let mut config = match self.config_path() {
            Some(path) => Config::load(&path)?,
            None => Config::default(),
        };
        if let Some(dir) = &self.data_dir {
            config.store.data_dir = Some(dir.clone());
        }
        if let Some(node) = &self.node {
            config.store.node = Some(node.clone());
        }
        if let Some(address) = &self.listen_address {
            config.web.listen_address = address.clone();
        }
        if let Some(file) = &self.web_config_file {
            config.web.config_file = Some(file.clone());
        }
        if let Some(procfs) = &self.procfs {
            config.paths.procfs = procfs.clone();
        }
        if let Some(sysfs) = &self.sysfs {
            config.paths.sysfs = sysfs.clone();
        }
        if let Some(rootfs) = &self.rootfs {
            config.paths.rootfs = rootfs.clone();
        }
        if let Some(n) = self.simulate_gpus {
            config.collectors.gpu.simulate_gpus = n;
            config.collectors.gpu_probe.simulate_gpus = n;
        }
        if let Some(scenarios) = &self.simulate_gpu_scenarios {
            config.collectors.gpu.simulate_scenarios = scenarios.clone();
        }
        for (name, enabled) in &self.collector_flags {
            config.collectors.set_enabled(name, *enabled);
        }
        if let Err((_, message)) = config.validate() {
            bail!("{message}");
        }
        Ok(config)
    }
}
