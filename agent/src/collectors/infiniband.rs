//! `infiniband`: InfiniBand and RoCE ports. Being written: the skeleton keeps the registry whole.

use serde::{Deserialize, Serialize};
use vtax_store::{Batch, TableDef};

use super::{Availability, Collector, CollectorConfig, Roots};

/// `[collectors.infiniband]`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct InfinibandConfig {
    /// Whether the collector runs.
    pub enabled: bool,
    /// Seconds between two reads.
    pub interval_secs: f64,
}

impl Default for InfinibandConfig {
    fn default() -> Self {
        InfinibandConfig {
            enabled: true,
            interval_secs: super::DEFAULT_INTERVAL_SECS,
        }
    }
}

impl CollectorConfig for InfinibandConfig {
    fn enabled(&self) -> bool {
        self.enabled
    }
    fn interval_secs(&self) -> f64 {
        self.interval_secs
    }
}

/// The infiniband collector.
pub struct Infiniband {
    _roots: Roots,
}

impl Infiniband {
    /// A infiniband collector reading under `roots`.
    pub fn new(_config: &InfinibandConfig, roots: &Roots) -> Self {
        Infiniband {
            _roots: roots.clone(),
        }
    }
}

impl Collector for Infiniband {
    fn name(&self) -> &'static str {
        "infiniband"
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
