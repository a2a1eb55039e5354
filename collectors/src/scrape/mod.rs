//! `scrape`: local Prometheus endpoints (an inference server's or a training
//! job's own `/metrics`), so that the application's tail latency and the
//! node's jitter sit on one time axis.
//!
//! Each `[[scrape]]` target gets a thread of its own (`vtax-scrape-<name>`),
//! started at the collector's `probe` and told to stop when the collector is
//! dropped. It fetches the target on wall-clock multiples of `interval_secs`
//! (plain HTTP through `ureq`, bounded end to end by `timeout_secs`), parses
//! the body with the store's OpenMetrics / Prometheus text parser, and queues
//! rows: every sample into `scraped`, a `scrape_target` status row, and, when
//! a window of `window_secs` has closed, one `service_latency` row per
//! configured histogram series. The collector's tick only harvests the queue,
//! so a target that is down, hangs or answers garbage costs its own thread a
//! timeout, never the other targets or the other collectors: it becomes a
//! failure counter (by reason) and one log line when its state changes.
//!
//! A target is bounded as Prometheus bounds one (`sample_limit`, `label_limit`,
//! `label_value_length_limit_bytes`, `body_size_limit_bytes`): the body is
//! parsed line by line as it arrives, samples go straight into the batch, and
//! the first line past a limit ends the scrape. Such a scrape is rejected
//! whole (no rows) and counted as a `limit` failure, so that a target with a
//! million series costs one line buffer and at most `sample_limit` rows, not
//! the agent's memory.
//!
//! Quantiles are computed as PromQL's `histogram_quantile` computes them, over
//! the increase of the cumulative buckets in the window, added up scrape by
//! scrape as `increase` takes each bucket ([`bucket_quantile`], [`scrape_delta`]).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::io::BufRead;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use vtax_store::openmetrics::{Format, Limits, Parser};
use vtax_store::schema::{FieldDef, FieldType, TableDef, TagDef, Unit};
use vtax_store::tables::{self, ScrapedRow};
use vtax_store::{Batch, BatchBuilder};

use super::{Availability, Collector, Roots};
use crate::ticks::{next_grid, Stopper};
use crate::ticks::now_us;

mod targets;
mod fetch;
mod quantiles;
mod collector;

pub use targets::*;
pub use fetch::*;
pub use quantiles::*;
pub use collector::*;

#[cfg(test)]
mod tests;

/// Default seconds between two scrapes of a target.
pub const DEFAULT_SCRAPE_INTERVAL_SECS: f64 = 10.0;
/// Default end-to-end limit of one scrape (connect, request, whole body).
/// Well under the interval: a target that answers this late is counted as
/// slow rather than allowed to push its next scrape back.
pub const DEFAULT_SCRAPE_TIMEOUT_SECS: f64 = 2.0;
/// Default quantile window: the jitter collector's, so both line up.
pub const DEFAULT_SCRAPE_WINDOW_SECS: u64 = super::jitter::DEFAULT_WINDOW_SECS;
/// Default most samples in one scrape; a scrape with more is rejected whole.
/// An inference server's own `/metrics` holds hundreds to a few thousand
/// series (vLLM with every histogram: about 1,500 per model), so this leaves
/// room for many models or adapters while bounding what one scrape holds in
/// memory (about 16 MiB of rows at 300 bytes a sample) and writes per interval.
pub const DEFAULT_SAMPLE_LIMIT: u64 = 50_000;
/// Default most labels on one sample.
pub const DEFAULT_LABEL_LIMIT: u64 = 64;
/// Default longest label value, in bytes.
pub const DEFAULT_LABEL_VALUE_LENGTH_LIMIT_BYTES: u64 = 2048;
/// Default largest response body: 50,000 samples of 160 bytes. The body is
/// parsed as it arrives, never held whole; this bounds the label text one
/// scrape can hold and the time it takes.
pub const DEFAULT_BODY_SIZE_LIMIT_BYTES: u64 = 8 << 20;
/// Scrapes queued for the store per target before the oldest are dropped
/// (only if the collector thread stopped harvesting); drops are counted.
const MAX_PENDING_PER_TARGET: usize = 64;
/// Least time between two warnings of one target.
const LOG_INTERVAL: Duration = Duration::from_secs(60);
/// Rows queued per target, in units of its `sample_limit`, before the oldest
/// scrapes are dropped: so that what waits for the store stays a few scrapes'
/// worth of memory even when each is at the limit.
const MAX_PENDING_SCRAPES_AT_LIMIT: u64 = 4;
/// What the agent asks for: Prometheus text first, OpenMetrics accepted.
const ACCEPT: &str =
    "text/plain;version=0.0.4;q=1,application/openmetrics-text;version=1.0.0;q=0.5,*/*;q=0.1";

/// `[collectors.scrape]`: the harvest of the targets' threads. The targets
/// themselves are the top-level `[[scrape]]` tables, copied here when the
/// config is read.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ScrapeConfig {
    /// Whether the collector runs (it also needs targets).
    pub enabled: bool,
    /// Seconds between two harvests of finished scrapes.
    pub interval_secs: f64,
    /// The `[[scrape]]` tables.
    #[serde(skip)]
    pub targets: Vec<ScrapeTarget>,
}

impl Default for ScrapeConfig {
    fn default() -> Self {
        ScrapeConfig {
            enabled: true,
            interval_secs: super::DEFAULT_INTERVAL_SECS,
            targets: Vec::new(),
        }
    }
}

crate::common_settings!(ScrapeConfig);

impl crate::Registered for ScrapeConfig {
    fn tables() -> &'static [&'static vtax_store::TableDef] {
        TABLES
    }
    fn key_docs() -> &'static [(&'static str, &'static str)] {
        KEY_DOCS
    }
    fn build(
        &self,
        _all: &crate::CollectorsConfig,
        roots: &crate::Roots,
    ) -> Box<dyn crate::Collector> {
        Box::new(Scrape::new(self, roots))
    }
    fn check(&self) -> Result<(), (String, String)> {
        validate_targets(&self.targets)
    }
}

/// Comments for this collector's own keys in the example config.
pub static KEY_DOCS: &[(&str, &str)] = &[(
    "interval_secs",
    "Seconds between two harvests of what the [[scrape]] targets' threads fetched (each target keeps its own interval).",
)];

/// Tables of this collector (`scraped` is the store's own, shared with `vtax import`).
pub static TABLES: &[&TableDef] = &[&SERVICE_LATENCY, &SCRAPE_TARGET];

const TARGET_TAG: TagDef = TagDef {
    name: "target",
    help: "The [[scrape]] target's name.",
};

const fn seconds(name: &'static str, help: &'static str) -> FieldDef {
    FieldDef::gauge(name, FieldType::F64, Unit::Seconds, help)
}

const fn failures(name: &'static str, help: &'static str) -> FieldDef {
    FieldDef::counter(name, FieldType::U64, Unit::None, help)
}

vtax_store::table! {
    /// Per window, per target histogram series: quantiles of what it observed.
    pub static SERVICE_LATENCY: TableDef, pub struct ServiceLatencyRow {
        name: "service_latency",
        help: "One row per window (window_secs, on wall-clock multiples) per series of each histogram a [[scrape]] target lists: quantiles of the observations made in the window, from the increase of the cumulative buckets in it (each scrape's over the one before, a count that went down read as a restart), interpolated within a bucket as PromQL's histogram_quantile does. A histogram named _milliseconds or _microseconds is converted to seconds. The row's time is the closing scrape's.",
        tags: [
            target = TARGET_TAG,
            metric = TagDef {
                name: "metric",
                help: "Histogram family name, without _bucket.",
            },
            labels = TagDef {
                name: "labels",
                help: "The series' label set without le, canonical: sorted, name=\"value\" joined by commas.",
            },
        ],
        fields: [
            p50_seconds: Option<f64> = seconds("Median of the window's observations; null when it had none."),
            p99_seconds: Option<f64> = seconds("99th percentile of the window's observations; null when it had none."),
            p999_seconds: Option<f64> = seconds("99.9th percentile of the window's observations; null when it had none."),
            observations: f64 = FieldDef::stored_only(FieldType::F64, Unit::None, "Observations in the window (the increase of the +Inf bucket). Not exported: a count per window is no gauge; on /metrics, observations_per_second times window_seconds gives it."),
            observations_per_second: Option<f64> = FieldDef::gauge(FieldType::F64, Unit::None, "Observations per second over the window."),
            window_seconds: f64 = seconds("Time the window's increase covers: from the scrape before the series' first growth in it to its last sample (the closing scrape for a series still there)."),
        ],
        exported: true,
    }
}

vtax_store::table! {
    /// One row per scrape per target.
    pub static SCRAPE_TARGET: TableDef, pub struct ScrapeTargetRow {
        name: "scrape_target",
        help: "One row per scrape of a [[scrape]] target: whether it answered with a valid exposition, how long it took, and failures by reason since the collector started.",
        tags: [target = TARGET_TAG],
        fields: [
            up: i64 = FieldDef::gauge(FieldType::I64, Unit::None, "1 when the last scrape returned a valid exposition, else 0."),
            duration_seconds: f64 = seconds("Time the last scrape took, connect to last byte parsed."),
            samples: Option<u64> = FieldDef::gauge(FieldType::U64, Unit::None, "Samples stored from the last valid scrape."),
            scrapes: u64 = FieldDef::counter(FieldType::U64, Unit::None, "Scrapes attempted."),
            failures_connect: u64 = failures("Scrapes that failed because the target could not be reached (refused, reset, no such host): it is down."),
            failures_timeout: u64 = failures("Scrapes that did not finish within timeout_secs: the target is slow or hangs."),
            failures_http: u64 = failures("Scrapes answered with an HTTP status other than 2xx."),
            failures_invalid: u64 = failures("Scrapes whose body was not a valid exposition (not UTF-8, a line the parser rejects, or a body the target broke off before its end)."),
            failures_limit: u64 = failures("Scrapes rejected whole, nothing stored, for going past one of the target's limits: sample_limit, label_limit, label_value_length_limit_bytes or body_size_limit_bytes."),
            scrapes_dropped: u64 = FieldDef::counter(FieldType::U64, Unit::None, "Scrapes made whose rows were dropped before the store took them (the collector's harvest fell behind; the oldest go first), since the agent started."),
            samples_dropped: Option<u64> = FieldDef::gauge(FieldType::U64, Unit::None, "Samples of the last valid scrape not stored: a series met again in the scrape (its first sample is kept, as Prometheus keeps it), or a sample whose own timestamp is not newer than the one stored before for its series, or more than an hour before the scrape or ten minutes after it."),
        ],
        exported: true,
    }
}
