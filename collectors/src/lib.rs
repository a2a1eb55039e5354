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

mod cgroup_watch;
#[cfg(test)]
mod damage_tests;
pub mod kept;
pub mod keys;
pub mod pci;
pub mod runtime_tables;
#[cfg(test)]
mod testutil;
pub mod ticks;

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use vtax_store::{Batch, TableDef};

use crate::keys::{KeyRange, KeyRanges};

/// Where procfs is mounted.
pub const DEFAULT_PROCFS: &str = "/proc";
/// Where sysfs is mounted.
pub const DEFAULT_SYSFS: &str = "/sys";
/// Where the host's root filesystem is seen from the agent.
pub const DEFAULT_ROOTFS: &str = "/";

/// The seconds every collector's `interval_secs` accepts.
pub const INTERVAL_SECS_RANGE: KeyRange = KeyRange::between(0.01, 86_400.0);

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
            procfs: PathBuf::from(DEFAULT_PROCFS),
            sysfs: PathBuf::from(DEFAULT_SYSFS),
            rootfs: PathBuf::from(DEFAULT_ROOTFS),
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
    /// What the source has that the last `collect` left out to stay within a
    /// configured cap (cgroups over `max_cgroups`). The runtime shows it as
    /// `vtax_collector_left_out`, so that a cap reached is a series a rule
    /// reads rather than one log line at the moment it was reached.
    fn left_out(&self) -> u64 {
        0
    }
    /// How long before each grid point the collector reads. Every collector
    /// wakes on the same grid, so for a moment the agent's own threads are
    /// runnable together: a collector that reads how many tasks are runnable
    /// reads ahead of them, or it counts the agent itself.
    fn lead(&self) -> std::time::Duration {
        std::time::Duration::ZERO
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
    /// The table whose stored rows a collector that counts events itself
    /// takes its counts up from when the agent starts (see [`Collector::resume`]).
    fn resumes_from(&self) -> Option<&'static TableDef> {
        None
    }
    /// At the agent's start, before its probe: each series' latest row of
    /// [`Collector::resumes_from`] in the store from the last
    /// [`RESUME_HORIZON_SECS`]. Its counts go on from them, as a kernel's do
    /// across an agent's restart, rather than start again at zero, which a
    /// rule on `increase()` can misread (a count of 1 born again at 1 after a
    /// restart is no increase).
    fn resume(&mut self, _latest: &[LatestRow]) {}
}

/// How far back a collector's counts are taken up at the agent's start:
/// after a longer stop they start again at zero, which Prometheus reads as a
/// reset across the gap.
pub const RESUME_HORIZON_SECS: i64 = 3600;

/// A series' latest stored row, for [`Collector::resume`]: its time, its
/// tags in the table's declaration order and its fields' values (null as
/// `None`).
#[derive(Clone, Debug, PartialEq)]
pub struct LatestRow {
    pub time_us: i64,
    pub tags: Vec<String>,
    pub fields: Vec<Option<f64>>,
}

/// Settings every collector has, under `[collectors.<name>]`.
pub trait CollectorConfig {
    /// Whether the collector runs.
    fn enabled(&self) -> bool;
    /// Seconds between two reads.
    fn interval_secs(&self) -> f64;
    /// Turns it on or off.
    fn set_enabled(&mut self, enabled: bool);
}

/// Default seconds between two reads of a collector.
pub const DEFAULT_INTERVAL_SECS: f64 = 1.0;

/// Implements [`CollectorConfig`] for a settings type whose `enabled` and
/// `interval_secs` fields are the common settings.
macro_rules! common_settings {
    ($config:ty) => {
        impl $crate::CollectorConfig for $config {
            fn enabled(&self) -> bool {
                self.enabled
            }
            fn interval_secs(&self) -> f64 {
                self.interval_secs
            }
            fn set_enabled(&mut self, enabled: bool) {
                self.enabled = enabled;
            }
        }
    };
}
pub(crate) use common_settings;

/// What the registry needs of a collector, implemented by its settings type
/// beside the collector: one that leaves a piece out does not compile.
pub trait Registered: CollectorConfig {
    /// The tables the collector may write, known to the catalogue, the store
    /// and `/metrics` before its first row.
    fn tables() -> &'static [&'static TableDef];
    /// The comment of each of its own keys (`collectors.<name>.<key>`) in the
    /// example config.
    fn key_docs() -> &'static [(&'static str, &'static str)];
    /// The declared range of each of its own numeric keys.
    fn key_ranges() -> KeyRanges {
        &[]
    }
    /// Builds the collector. `all` is every collector's settings, for one
    /// that shares another's (perf counts the cgroups `cgroups` selects).
    fn build(&self, all: &CollectorsConfig, roots: &Roots) -> Box<dyn Collector>;
    /// Checks what serde cannot; on failure the dotted key and the message.
    fn check(&self) -> Result<(), (String, String)> {
        Ok(())
    }
    /// Whether the settings it shares from other sections are the same in
    /// `a` and `b` (its own section is compared apart).
    fn shared_settings_equal(a: &CollectorsConfig, b: &CollectorsConfig) -> bool {
        let _ = (a, b);
        true
    }
}

/// The collector registry. A collector is its module (a file or a folder
/// under `collectors/`) and one line here: its name, which is its module,
/// its `[collectors.<name>]` section, its `--collector.<name>` flag and its
/// label, and its settings type, which implements [`Registered`]. Everything
/// that lists collectors is generated from these lines.
macro_rules! registry {
    ($($(#[$doc:meta])* $name:ident: $config:ident,)*) => {
        $(pub mod $name;)*

        /// Every collector's settings: the `[collectors]` table of the config file.
        #[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
        #[serde(deny_unknown_fields, default)]
        pub struct CollectorsConfig {
            $($(#[$doc])* pub $name: $name::$config,)*
        }

        /// Names of every collector, in the order they are built.
        pub const NAMES: &[&str] = &[$(stringify!($name)),*];

        impl CollectorsConfig {
            /// The common settings of the named collector.
            pub fn common(&self, name: &str) -> Option<&dyn CollectorConfig> {
                match name {
                    $(stringify!($name) => Some(&self.$name),)*
                    _ => None,
                }
            }

            /// Whether the named collector is built the same from `other`:
            /// its own section and what it shares of others.
            pub fn same_settings(&self, other: &CollectorsConfig, name: &str) -> bool {
                match name {
                    $(stringify!($name) => {
                        self.$name == other.$name
                            && <$name::$config as Registered>::shared_settings_equal(self, other)
                    })*
                    _ => false,
                }
            }

            /// Turns the named collector on or off (the `--collector.<name>` flags).
            pub fn set_enabled(&mut self, name: &str, enabled: bool) -> bool {
                match name {
                    $(stringify!($name) => self.$name.set_enabled(enabled),)*
                    _ => return false,
                }
                true
            }

            /// Builds the named collector from its settings.
            pub fn build(&self, name: &str, roots: &Roots) -> Option<Box<dyn Collector>> {
                match name {
                    $(stringify!($name) => Some(Registered::build(&self.$name, self, roots)),)*
                    _ => None,
                }
            }

            /// Checks values serde cannot: intervals and collector-specific rules.
            /// On failure returns the dotted key and the message.
            pub fn validate(&self) -> Result<(), (String, String)> {
                match self.problems().into_iter().next() {
                    Some(problem) => Err(problem),
                    None => Ok(()),
                }
            }

            /// Every collector's problem (its interval's, then its first
            /// other), as (dotted key, message): an operator fixes a file
            /// once, not once per problem.
            pub fn problems(&self) -> Vec<(String, String)> {
                let mut problems = Vec::new();
                $(problems.extend(check_interval(stringify!($name), &self.$name).err());)*
                $(problems.extend(self.$name.check().err());)*
                problems
            }
        }

        /// Tables the collectors write, and the runtime's own.
        pub fn tables() -> Vec<&'static TableDef> {
            [$(<$name::$config as Registered>::tables(),)* runtime_tables::TABLES].concat()
        }

        /// The comment of a collector-specific key (`collectors.<name>.<key>`)
        /// for the example config.
        pub fn key_doc(path: &str) -> Option<&'static str> {
            let rest = path.strip_prefix("collectors.")?;
            let (name, key) = rest.split_once('.')?;
            let docs = match name {
                $(stringify!($name) => <$name::$config as Registered>::key_docs(),)*
                _ => return None,
            };
            docs.iter().find(|(k, _)| *k == key).map(|(_, d)| *d)
        }

        /// The declared range of a collector-specific numeric key
        /// (`collectors.<name>.<key>`). `interval_secs`, every collector's,
        /// is in the config's.
        pub fn key_range(path: &str) -> Option<KeyRange> {
            let rest = path.strip_prefix("collectors.")?;
            let (name, key) = rest.split_once('.')?;
            let ranges = match name {
                $(stringify!($name) => <$name::$config as Registered>::key_ranges(),)*
                _ => return None,
            };
            ranges.iter().find(|(k, _)| *k == key).map(|(_, r)| *r)
        }
    };
}

registry! {
    /// Host CPU, pressure, load, memory, scheduler.
    host: HostConfig,
    /// Per-workload cgroups.
    cgroups: CgroupsConfig,
    /// Per-cgroup hardware counters (CPI) where the PMU is there; its
    /// cgroups are the leaves of what `[collectors.cgroups]` selects.
    perf: PerfConfig,
    /// InfiniBand and RoCE HCAs and ports.
    infiniband: InfinibandConfig,
    /// Virtualisation, kernel, IOMMU, GPUDirect RDMA.
    platform: PlatformConfig,
    /// NVIDIA GPUs through NVML, or simulated ones.
    gpu: GpuConfig,
    /// The GPU transfer probe, on idle GPUs.
    gpu_probe: GpuProbeConfig,
    /// Wake-up latency and interruption probes.
    jitter: JitterConfig,
    /// Block devices: /proc/diskstats and /sys/block.
    block: BlockConfig,
    /// Ethernet and RoCE interfaces: /sys/class/net.
    netdev: NetdevConfig,
    /// Mounts holding checkpoints and data: statvfs, off the collector's thread.
    filesystem: FilesystemConfig,
    /// Local Prometheus endpoints: the top-level `[[scrape]]` tables.
    scrape: ScrapeConfig,
}

/// Checks a collector's `interval_secs` against its declared range.
fn check_interval(name: &str, common: &dyn CollectorConfig) -> Result<(), (String, String)> {
    let interval = common.interval_secs();
    let key = format!("collectors.{name}.interval_secs");
    let range = INTERVAL_SECS_RANGE;
    if range.contains(interval) {
        Ok(())
    } else {
        Err((
            key.clone(),
            format!("{key} = {interval}: must be {}", range.describe()),
        ))
    }
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
