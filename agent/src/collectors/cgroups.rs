//! `cgroups`: per-workload cgroups. Being written: the skeleton keeps the registry whole.

use serde::{Deserialize, Serialize};
use vtax_store::{Batch, TableDef};

use super::{Availability, Collector, CollectorConfig, Roots};

/// `[collectors.cgroups]`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct CgroupsConfig {
    /// Whether the collector runs.
    pub enabled: bool,
    /// Seconds between two reads.
    pub interval_secs: f64,
}

impl Default for CgroupsConfig {
    fn default() -> Self {
        CgroupsConfig {
            enabled: true,
            interval_secs: super::DEFAULT_INTERVAL_SECS,
        }
    }
}

impl CollectorConfig for CgroupsConfig {
    fn enabled(&self) -> bool {
        self.enabled
    }
    fn interval_secs(&self) -> f64 {
        self.interval_secs
    }
}

/// The cgroups collector.
pub struct Cgroups {
    _roots: Roots,
}

impl Cgroups {
    /// A cgroups collector reading under `roots`.
    pub fn new(_config: &CgroupsConfig, roots: &Roots) -> Self {
        Cgroups {
            _roots: roots.clone(),
        }
    }
}

impl Collector for Cgroups {
    fn name(&self) -> &'static str {
        "cgroups"
    }

    fn probe(&mut self) -> Availability {
        Availability::Absent("not built yet".into())
    }

    fn collect(&mut self, _time_us: i64) -> anyhow::Result<Vec<Batch>> {
        Ok(Vec::new())
    }
}

/// Comments for this collector's own keys in the example config.
pub static KEY_DOCS: &[(&str, &str)] = &[];

/// Tables of this collector.
pub static TABLES: &[&TableDef] = &[];

impl CgroupsConfig {
    /// Checks what serde cannot.
    pub fn validate(&self) -> Result<(), String> {
        Ok(())
    }
}
