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

    /// The config file in force: the flag's, else the installed one if
    /// anything is at its path (a directory or a dangling link there is an
    /// error to report, not a reason to run on defaults).
    pub fn config_path(&self) -> Option<PathBuf> {
        self.config_path_in(Path::new(INSTALLED_CONFIG_PATH))
    }

    fn config_path_in(&self, installed: &Path) -> Option<PathBuf> {
        self.config.clone().or_else(|| {
            installed
                .symlink_metadata()
                .is_ok()
                .then(|| installed.to_path_buf())
        })
    }

    /// Loads the config file (if any), applies the flags, and validates the result.
    pub fn resolve(&self) -> Result<Config> {
        self.resolve_from(self.config_path())
    }

    /// [`AgentArgs::resolve`] for a reload of an agent that started on
    /// `started_with`: the installed config it started on is still required
    /// (deleted, the reload is refused rather than run on defaults).
    pub fn resolve_reload(&self, started_with: Option<&Path>) -> Result<Config> {
        self.resolve_reload_in(Path::new(INSTALLED_CONFIG_PATH), started_with)
    }

    fn resolve_reload_in(&self, installed: &Path, started_with: Option<&Path>) -> Result<Config> {
        let config = self.resolve_from(
            self.config_path_in(installed)
                .or_else(|| started_with.map(Path::to_path_buf)),
        )?;
        check_beyond_values(&config)?;
        Ok(config)
    }

    fn resolve_from(&self, path: Option<PathBuf>) -> Result<Config> {
        let mut config = match path {
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

/// What a start refuses beyond the config's values: a `[paths]` root that
/// is not a directory, the web config file (read and its certificates
/// loaded) and a data directory the agent cannot make or write.
/// `check-config`, `doctor` and a reload check it too.
pub fn check_beyond_values(config: &Config) -> Result<()> {
    crate::config::check_paths(&config.paths).map_err(anyhow::Error::msg)?;
    if let Some(web) = &config.web.config_file {
        vtax_exporters::web::check_web_config(web)
            .map_err(|e| anyhow::anyhow!("web.config_file: {e}"))?;
    }
    crate::config::check_data_dir(&config.data_dir())
        .map_err(|e| anyhow::anyhow!("store.data_dir: {e}"))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The agent started on the installed config, found without a flag: a
    /// reload after the file was deleted is refused, not run on defaults;
    /// a directory where the file should be is an error, not "no file".
    #[test]
    fn a_reload_needs_the_installed_config_the_agent_started_on() {
        let dir = tempfile::tempdir().unwrap();
        let installed = dir.path().join("vtax.toml");
        let data = dir.path().join("data");
        std::fs::write(
            &installed,
            format!("[store]\ndata_dir = {:?}\n", data.display().to_string()),
        )
        .unwrap();
        let args = AgentArgs::default();
        let started_with = args.config_path_in(&installed);
        assert_eq!(started_with.as_deref(), Some(installed.as_path()));
        let config = args
            .resolve_reload_in(&installed, started_with.as_deref())
            .unwrap();
        assert_eq!(config.store.data_dir.as_deref(), Some(data.as_path()));
        std::fs::remove_file(&installed).unwrap();
        let e = args
            .resolve_reload_in(&installed, started_with.as_deref())
            .unwrap_err();
        assert!(format!("{e:#}").contains("No such file"), "{e:#}");
        // An agent that started on defaults picks up a file made since.
        assert!(args.resolve_reload_in(&installed, None).is_ok());
        std::fs::create_dir(&installed).unwrap();
        assert_eq!(args.config_path_in(&installed), Some(installed.clone()));
        let e = args.resolve_reload_in(&installed, None).unwrap_err();
        assert!(format!("{e:#}").contains("a directory"), "{e:#}");
    }

    /// A reload checks what check-config and the next start check: a web
    /// config file that is not there is refused, with its key.
    #[test]
    fn a_reload_refuses_what_a_start_would() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("vtax.toml");
        std::fs::write(
            &file,
            format!(
                "[web]\nconfig_file = \"/nonexistent-web.yml\"\n[store]\ndata_dir = {:?}\n",
                dir.path().join("data").display().to_string()
            ),
        )
        .unwrap();
        let args = AgentArgs {
            config: Some(file.clone()),
            ..AgentArgs::default()
        };
        assert!(args.resolve().is_ok(), "the values alone are valid");
        let e = args.resolve_reload(Some(&file)).unwrap_err();
        let text = format!("{e:#}");
        assert!(text.starts_with("web.config_file: "), "{text}");
        assert!(text.contains("/nonexistent-web.yml"), "{text}");
    }
}
