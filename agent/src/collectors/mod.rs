//! Collectors: one per source, each in its own file, each reading through root
//! paths (`--path.procfs`, `--path.sysfs`) that tests point at fixture trees
//! under `tests/fixtures/`.
//!
//! The contract every collector keeps:
//! - `probe` says whether its source exists on this node and what it found,
//!   and tells a source that is absent (no HCA, no driver) from one that is
//!   there but reads badly; neither disables the collector for good: the
//!   runtime probes it again until its source appears or mends;
//! - `collect` reads the source once and returns rows (possibly none this tick)
//!   or an error that names the file and what was wrong; it never panics on
//!   what it reads. Where a tick reads several independent files, one that
//!   reads badly costs only the rows or fields that come from it: the others
//!   are returned, and the bad file is named in `source_errors`;
//! - every table it may write is listed in `tables`, so the catalogue, the store
//!   and `/metrics` know them before the first row.

pub mod block;
mod cgroup_watch;
pub mod cgroups;
#[cfg(test)]
mod damage_tests;
pub mod filesystem;
pub mod gpu;
pub mod gpu_probe;
pub mod host;
pub mod infiniband;
pub mod jitter;
pub mod kept;
pub mod netdev;
pub mod pci;
pub mod perf;
pub mod platform;
pub mod runtime_tables;
pub mod scrape;
#[cfg(test)]
mod testutil;

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use vtax_store::{Batch, TableDef};

/// Where the kernel's pseudo-filesystems are mounted; tests point these at fixtures.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Roots {
    /// procfs mount point (`/proc`).
    pub procfs: PathBuf,
    /// sysfs mount point (`/sys`); cgroups are read under `<sysfs>/fs/cgroup`.
    pub sysfs: PathBuf,
    /// Where the host's root filesystem is seen (`/`; `/host` in a container
    /// that bind-mounts it there): mount points are stat'ed under it.
    pub rootfs: PathBuf,
}

impl Roots {
    /// A path under procfs.
    pub fn proc(&self, rel: impl AsRef<Path>) -> PathBuf {
        self.procfs.join(rel)
    }

    /// A path under sysfs.
    pub fn sys(&self, rel: impl AsRef<Path>) -> PathBuf {
        self.sysfs.join(rel)
    }

    /// Whether the host's root is somewhere other than this process's `/`.
    pub fn rootfs_moved(&self) -> bool {
        self.rootfs != Path::new("/")
    }

    /// Where this process reaches the host's absolute path `host_path`.
    pub fn host_path(&self, host_path: &str) -> PathBuf {
        if self.rootfs_moved() {
            match host_path.trim_start_matches('/') {
                "" => self.rootfs.clone(),
                relative => self.rootfs.join(relative),
            }
        } else {
            PathBuf::from(host_path)
        }
    }
}

impl Default for Roots {
    fn default() -> Self {
        Roots {
            procfs: PathBuf::from(crate::config::DEFAULT_PROCFS),
            sysfs: PathBuf::from(crate::config::DEFAULT_SYSFS),
            rootfs: PathBuf::from(crate::config::DEFAULT_ROOTFS),
        }
    }
}

/// What `probe` learned: the source is there (and what it holds), or why not.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Availability {
    /// The source exists; a one-line summary of what it holds for `vtax doctor`
    /// (e.g. "2 CPUs, pressure: cpu memory io").
    Available(String),
    /// The source is absent on this node (no such device, driver or file);
    /// the reason, for the log and the doctor. The runtime probes again every
    /// [`ABSENT_REPROBE_SECS`], so a source that appears later (a driver
    /// loaded, a device plugged in) is read from then on.
    Absent(String),
    /// The source is there but reads badly (an I/O error, text the parser
    /// refuses); the error, naming the file. The runtime reports the collector
    /// failing and probes again, after [`FAILED_REPROBE_FIRST_SECS`] at first
    /// and backing off to [`FAILED_REPROBE_MAX_SECS`].
    Failed(String),
}

/// Seconds between two probes of a collector whose source is absent.
pub const ABSENT_REPROBE_SECS: u64 = 60;

/// Seconds before the first probe again of a collector whose source failed;
/// each failure after doubles the wait, up to [`FAILED_REPROBE_MAX_SECS`].
pub const FAILED_REPROBE_FIRST_SECS: u64 = 2;

/// The longest wait between two probes of a collector whose source failed.
pub const FAILED_REPROBE_MAX_SECS: u64 = 60;

/// A boxed collector as `Any`, so that the one built on a reload can take
/// over from the one of its own type it replaces ([`Collector::take_over`]).
pub trait IntoAny {
    /// The collector, to downcast.
    fn into_any(self: Box<Self>) -> Box<dyn std::any::Any>;
}

impl<T: std::any::Any> IntoAny for T {
    fn into_any(self: Box<Self>) -> Box<dyn std::any::Any> {
        self
    }
}

/// One source of rows.
pub trait Collector: Send + IntoAny {
    /// The collector's name: its config section, its flags and its label.
    fn name(&self) -> &'static str;
    /// Checks the source; called when the collector is built (at start, and
    /// on a reload that changed its settings), and again on its thread while
    /// it says the source is absent or reads badly.
    fn probe(&mut self) -> Availability;
    /// Reads the source once, stamping every row with `time_us`.
    fn collect(&mut self, time_us: i64) -> anyhow::Result<Vec<Batch>>;
    /// What an operator should know about this source (a port down, IOMMU
    /// off), for `vtax doctor`; asked after a `collect`.
    fn problems(&self) -> Vec<String> {
        Vec::new()
    }
    /// The sources (files, devices) that read badly on the last `collect`
    /// while the others were read: each costs only the rows or fields that
    /// come from it. The runtime counts them in `vtax_collector_failed_sources`
    /// and logs each when it starts failing and when it mends; `vtax doctor`
    /// lists them.
    fn source_errors(&self) -> Vec<ParseError> {
        Vec::new()
    }
    /// Whether rows come once per window rather than every tick (`jitter`):
    /// then a tick without rows keeps the last window's series on `/metrics`
    /// instead of dropping them.
    fn windowed(&self) -> bool {
        false
    }
    /// What `/metrics` shows for this collector, when it is not just this
    /// tick's rows: a collector whose sources report at their own times
    /// (`scrape`'s targets) keeps each source's latest rows on display.
    fn exposed(&self) -> Option<Vec<std::sync::Arc<Batch>>> {
        None
    }
    /// On a reload that changed this collector's settings, the collector
    /// built for the new ones is handed the one it replaces (stopped), before
    /// its probe. One that counts events itself (since the agent started)
    /// carries those counts on, so that no counter on `/metrics` goes back
    /// and no series it had leaves. Counters read from a source (the
    /// kernel's, the driver's) need nothing: the source keeps them.
    fn take_over(&mut self, previous: Box<dyn Collector>) {
        let _ = previous;
    }
}

/// Settings every collector has, under `[collectors.<name>]`.
pub trait CollectorConfig {
    /// Whether the collector runs.
    fn enabled(&self) -> bool;
    /// Seconds between two reads.
    fn interval_secs(&self) -> f64;
}

/// Default seconds between two reads of a collector.
pub const DEFAULT_INTERVAL_SECS: f64 = 1.0;

/// Every collector's settings: the `[collectors]` table of the config file.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct CollectorsConfig {
    /// Host CPU, pressure, load, memory, scheduler.
    pub host: host::HostConfig,
    /// Per-workload cgroups.
    pub cgroups: cgroups::CgroupsConfig,
    /// Per-cgroup hardware counters (CPI) where the PMU is there; its
    /// cgroups are the leaves of what `[collectors.cgroups]` selects.
    pub perf: perf::PerfConfig,
    /// InfiniBand and RoCE HCAs and ports.
    pub infiniband: infiniband::InfinibandConfig,
    /// Virtualisation, kernel, IOMMU, GPUDirect RDMA.
    pub platform: platform::PlatformConfig,
    /// NVIDIA GPUs through NVML, or simulated ones.
    pub gpu: gpu::GpuConfig,
    /// The GPU transfer probe, on idle GPUs.
    pub gpu_probe: gpu_probe::GpuProbeConfig,
    /// Wake-up latency and interruption probes.
    pub jitter: jitter::JitterConfig,
    /// Block devices: /proc/diskstats and /sys/block.
    pub block: block::BlockConfig,
    /// Ethernet and RoCE interfaces: /sys/class/net.
    pub netdev: netdev::NetdevConfig,
    /// Mounts holding checkpoints and data: statvfs, off the collector's thread.
    pub filesystem: filesystem::FilesystemConfig,
    /// Local Prometheus endpoints: the top-level `[[scrape]]` tables.
    pub scrape: scrape::ScrapeConfig,
}

/// Names of every collector, in the order they are built.
pub const NAMES: &[&str] = &[
    "host",
    "cgroups",
    "perf",
    "infiniband",
    "platform",
    "gpu",
    "gpu_probe",
    "jitter",
    "block",
    "netdev",
    "filesystem",
    "scrape",
];

impl CollectorsConfig {
    /// The common settings of the named collector.
    pub fn common(&self, name: &str) -> Option<&dyn CollectorConfig> {
        Some(match name {
            "host" => &self.host,
            "cgroups" => &self.cgroups,
            "perf" => &self.perf,
            "infiniband" => &self.infiniband,
            "platform" => &self.platform,
            "gpu" => &self.gpu,
            "gpu_probe" => &self.gpu_probe,
            "jitter" => &self.jitter,
            "block" => &self.block,
            "netdev" => &self.netdev,
            "filesystem" => &self.filesystem,
            "scrape" => &self.scrape,
            _ => return None,
        })
    }

    /// Whether the named collector is built the same from `other`: its own
    /// section and, for `perf`, the cgroup selection it shares.
    pub fn same_settings(&self, other: &CollectorsConfig, name: &str) -> bool {
        match name {
            "host" => self.host == other.host,
            "cgroups" => self.cgroups == other.cgroups,
            "perf" => self.perf == other.perf && self.cgroups == other.cgroups,
            "infiniband" => self.infiniband == other.infiniband,
            "platform" => self.platform == other.platform,
            "gpu" => self.gpu == other.gpu,
            "gpu_probe" => self.gpu_probe == other.gpu_probe,
            "jitter" => self.jitter == other.jitter,
            "block" => self.block == other.block,
            "netdev" => self.netdev == other.netdev,
            "filesystem" => self.filesystem == other.filesystem,
            "scrape" => self.scrape == other.scrape,
            _ => false,
        }
    }

    /// Turns the named collector on or off (the `--collector.<name>` flags).
    pub fn set_enabled(&mut self, name: &str, enabled: bool) -> bool {
        match name {
            "host" => self.host.enabled = enabled,
            "cgroups" => self.cgroups.enabled = enabled,
            "perf" => self.perf.enabled = enabled,
            "infiniband" => self.infiniband.enabled = enabled,
            "platform" => self.platform.enabled = enabled,
            "gpu" => self.gpu.enabled = enabled,
            "gpu_probe" => self.gpu_probe.enabled = enabled,
            "jitter" => self.jitter.enabled = enabled,
            "block" => self.block.enabled = enabled,
            "netdev" => self.netdev.enabled = enabled,
            "filesystem" => self.filesystem.enabled = enabled,
            "scrape" => self.scrape.enabled = enabled,
            _ => return false,
        }
        true
    }

    /// Builds the named collector from its settings.
    pub fn build(&self, name: &str, roots: &Roots) -> Option<Box<dyn Collector>> {
        Some(match name {
            "host" => Box::new(host::Host::new(&self.host, roots)),
            "cgroups" => Box::new(cgroups::Cgroups::new(&self.cgroups, roots)),
            "perf" => Box::new(perf::Perf::new(&self.perf, &self.cgroups, roots)),
            "infiniband" => Box::new(infiniband::Infiniband::new(&self.infiniband, roots)),
            "platform" => Box::new(platform::Platform::new(&self.platform, roots)),
            "gpu" => Box::new(gpu::Gpu::new(&self.gpu, roots)),
            "gpu_probe" => Box::new(gpu_probe::GpuProbe::new(&self.gpu_probe, roots)),
            "jitter" => Box::new(jitter::Jitter::new(&self.jitter, roots)),
            "block" => Box::new(block::Block::new(&self.block, roots)),
            "netdev" => Box::new(netdev::Netdev::new(&self.netdev, roots)),
            "filesystem" => Box::new(filesystem::Filesystem::new(&self.filesystem, roots)),
            "scrape" => Box::new(scrape::Scrape::new(&self.scrape, roots)),
            _ => return None,
        })
    }

    /// Checks values serde cannot: intervals and collector-specific rules.
    /// On failure returns the dotted key and the message.
    pub fn validate(&self) -> Result<(), (String, String)> {
        for name in NAMES {
            let common = self.common(name).expect("every name has settings");
            let interval = common.interval_secs();
            let key = format!("collectors.{name}.interval_secs");
            let range = crate::config::range_of(&key).expect("interval_secs has a range");
            if !range.contains(interval) {
                return Err((
                    key.clone(),
                    format!("{key} = {interval}: must be {}", range.describe()),
                ));
            }
        }
        self.cgroups.validate()?;
        self.perf.validate()?;
        self.gpu.validate()?;
        self.jitter.validate()?;
        self.block.validate()?;
        self.netdev.validate()?;
        self.filesystem.validate()?;
        scrape::validate_targets(&self.scrape.targets)?;
        Ok(())
    }
}

/// Tables the collectors write: each collector module lists its own.
pub fn tables() -> Vec<&'static TableDef> {
    [
        host::TABLES,
        cgroups::TABLES,
        perf::TABLES,
        infiniband::TABLES,
        platform::TABLES,
        gpu::TABLES,
        gpu_probe::TABLES,
        jitter::TABLES,
        block::TABLES,
        netdev::TABLES,
        filesystem::TABLES,
        scrape::TABLES,
        runtime_tables::TABLES,
    ]
    .concat()
}

/// The comment of a collector-specific key (`collectors.<name>.<key>`) for
/// the example config; each collector module lists its own in `KEY_DOCS`.
pub fn key_doc(path: &str) -> Option<&'static str> {
    let rest = path.strip_prefix("collectors.")?;
    let (name, key) = rest.split_once('.')?;
    let docs: &[(&str, &str)] = match name {
        "host" => host::KEY_DOCS,
        "cgroups" => cgroups::KEY_DOCS,
        "perf" => perf::KEY_DOCS,
        "infiniband" => infiniband::KEY_DOCS,
        "platform" => platform::KEY_DOCS,
        "gpu" => gpu::KEY_DOCS,
        "gpu_probe" => gpu_probe::KEY_DOCS,
        "jitter" => jitter::KEY_DOCS,
        "block" => block::KEY_DOCS,
        "netdev" => netdev::KEY_DOCS,
        "filesystem" => filesystem::KEY_DOCS,
        "scrape" => scrape::KEY_DOCS,
        _ => return None,
    };
    docs.iter().find(|(k, _)| *k == key).map(|(_, d)| *d)
}

/// The declared range of a collector-specific numeric key
/// (`collectors.<name>.<key>`); each collector module lists its own in
/// `KEY_RANGES`. `interval_secs`, every collector's, is in the config's.
pub fn key_range(path: &str) -> Option<crate::config::KeyRange> {
    let rest = path.strip_prefix("collectors.")?;
    let (name, key) = rest.split_once('.')?;
    let ranges: crate::config::KeyRanges = match name {
        "cgroups" => cgroups::KEY_RANGES,
        "perf" => perf::KEY_RANGES,
        "gpu" => gpu::KEY_RANGES,
        "gpu_probe" => gpu_probe::KEY_RANGES,
        "jitter" => jitter::KEY_RANGES,
        "filesystem" => filesystem::KEY_RANGES,
        _ => &[],
    };
    ranges.iter().find(|(k, _)| *k == key).map(|(_, r)| *r)
}

/// Why a read failed: the file, the line (1-based; 0 for the file as a whole)
/// and what was wrong. Collectors return it so every error names its source.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ParseError {
    /// The file.
    pub path: String,
    /// The line, 1-based; 0 when the file as a whole is wrong.
    pub line: usize,
    /// What was wrong.
    pub reason: String,
}

impl std::fmt::Display for ParseError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.line == 0 {
            write!(f, "{}: {}", self.path, self.reason)
        } else {
            write!(f, "{}:{}: {}", self.path, self.line, self.reason)
        }
    }
}

impl std::error::Error for ParseError {}

/// Kernel clock ticks per second (`USER_HZ`): the unit of /proc/stat and
/// cpuacct.stat times.
pub fn user_hz() -> f64 {
    // SAFETY: sysconf has no memory effects.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if hz > 0 {
        hz as f64
    } else {
        100.0
    }
}
