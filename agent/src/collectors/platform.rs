//! `platform`: virtualisation and platform facts. Being written: the skeleton keeps the registry whole.

use serde::{Deserialize, Serialize};
use vtax_store::{Batch, TableDef};

use super::{Availability, Collector, CollectorConfig, Roots};

/// `[collectors.platform]`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PlatformConfig {
    /// Whether the collector runs.
    pub enabled: bool,
    /// Seconds between two reads.
    pub interval_secs: f64,
}

impl Default for PlatformConfig {
    fn default() -> Self {
        PlatformConfig {
            enabled: true,
            interval_secs: super::DEFAULT_INTERVAL_SECS,
        }
    }
}

impl CollectorConfig for PlatformConfig {
    fn enabled(&self) -> bool {
        self.enabled
    }
    fn interval_secs(&self) -> f64 {
        self.interval_secs
    }
}

/// The platform collector.
pub struct Platform {
    _roots: Roots,
}

impl Platform {
    /// A platform collector reading under `roots`.
    pub fn new(_config: &PlatformConfig, roots: &Roots) -> Self {
        Platform {
            _roots: roots.clone(),
        }
    }
}

impl Collector for Platform {
    fn name(&self) -> &'static str {
        "platform"
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
