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
//! the increase of the cumulative buckets between the scrapes that open and
//! close the window ([`bucket_quantile`], [`window_delta`]).

use std::collections::BTreeMap;
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
use crate::timespec::now_us;

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

/// One `[[scrape]]` table of the config file.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScrapeTarget {
    /// The target's name: the `target` tag of its rows.
    pub name: String,
    /// `http://host:port/path` of a Prometheus endpoint on this node.
    pub url: String,
    /// Seconds between two scrapes, on wall-clock multiples.
    #[serde(default = "default_interval")]
    pub interval_secs: f64,
    /// Limit of one scrape, end to end.
    #[serde(default = "default_timeout")]
    pub timeout_secs: f64,
    /// Histogram families (names without `_bucket`) turned into quantiles.
    #[serde(default)]
    pub histograms: Vec<String>,
    /// Seconds per quantile window, on wall-clock multiples.
    #[serde(default = "default_window")]
    pub window_secs: u64,
    /// Most samples in one scrape; more rejects the scrape whole.
    #[serde(default = "default_sample_limit")]
    pub sample_limit: u64,
    /// Most labels on one sample; more rejects the scrape whole.
    #[serde(default = "default_label_limit")]
    pub label_limit: u64,
    /// Longest label value in bytes; longer rejects the scrape whole.
    #[serde(
        default = "default_label_value_length_limit_bytes",
        deserialize_with = "vtax_exporters::size::deserialize_bytes"
    )]
    pub label_value_length_limit_bytes: u64,
    /// Largest response body in bytes; larger rejects the scrape whole.
    #[serde(
        default = "default_body_size_limit_bytes",
        deserialize_with = "vtax_exporters::size::deserialize_bytes"
    )]
    pub body_size_limit_bytes: u64,
}

impl ScrapeTarget {
    /// A target with every optional key at its default.
    pub fn new(name: &str, url: &str) -> Self {
        ScrapeTarget {
            name: name.into(),
            url: url.into(),
            interval_secs: DEFAULT_SCRAPE_INTERVAL_SECS,
            timeout_secs: DEFAULT_SCRAPE_TIMEOUT_SECS,
            histograms: Vec::new(),
            window_secs: DEFAULT_SCRAPE_WINDOW_SECS,
            sample_limit: DEFAULT_SAMPLE_LIMIT,
            label_limit: DEFAULT_LABEL_LIMIT,
            label_value_length_limit_bytes: DEFAULT_LABEL_VALUE_LENGTH_LIMIT_BYTES,
            body_size_limit_bytes: DEFAULT_BODY_SIZE_LIMIT_BYTES,
        }
    }
}

fn default_interval() -> f64 {
    DEFAULT_SCRAPE_INTERVAL_SECS
}
fn default_timeout() -> f64 {
    DEFAULT_SCRAPE_TIMEOUT_SECS
}
fn default_window() -> u64 {
    DEFAULT_SCRAPE_WINDOW_SECS
}
fn default_sample_limit() -> u64 {
    DEFAULT_SAMPLE_LIMIT
}
fn default_label_limit() -> u64 {
    DEFAULT_LABEL_LIMIT
}
fn default_label_value_length_limit_bytes() -> u64 {
    DEFAULT_LABEL_VALUE_LENGTH_LIMIT_BYTES
}
fn default_body_size_limit_bytes() -> u64 {
    DEFAULT_BODY_SIZE_LIMIT_BYTES
}

/// Comments for the example config's commented `[[scrape]]` table.
pub static TARGET_KEY_DOCS: &[(&str, &str)] = &[
    ("name", "Name of the target: the `target` tag of its rows and label of its metrics."),
    ("url", "A Prometheus endpoint on this node, plain http:// only (no TLS, no auth)."),
    ("interval_secs", "Seconds between two scrapes, on wall-clock multiples (default 10)."),
    ("timeout_secs", "Limit of one scrape, connect to last byte; later is a `timeout` failure (default 2, must be under interval_secs)."),
    ("histograms", "Histogram families (without _bucket) whose p50/p99/p99.9 go to service_latency."),
    ("window_secs", "Seconds per quantile window, on wall-clock multiples like the jitter windows (default 10, at least interval_secs)."),
    ("sample_limit", "Most samples in one scrape; a scrape with more stores nothing and counts a `limit` failure (default 50000)."),
    ("label_limit", "Most labels on one sample; more rejects the scrape the same way (default 64)."),
    ("label_value_length_limit_bytes", "Longest label value in bytes, unescaped; longer rejects the scrape the same way (default 2048)."),
    ("body_size_limit_bytes", "Largest response body in bytes, parsed as it arrives; larger rejects the scrape the same way (default 8 MiB). Counts towards the agent's memory bound (see store.wal_max_backlog_bytes)."),
];

/// The example's commented-out `[[scrape]]` table; `with_range` adds a
/// key's declared range to its comment (`scrape.<key>`).
pub fn example_target(with_range: impl Fn(&str, &str) -> String) -> String {
    let example = ScrapeTarget {
        histograms: vec![
            "vllm:e2e_request_latency_seconds".into(),
            "vllm:time_to_first_token_seconds".into(),
        ],
        ..ScrapeTarget::new("vllm", "http://127.0.0.1:8000/metrics")
    };
    let table = toml::Table::try_from(&example).expect("a target serialises");
    let mut out = String::from(
        "\n# Local Prometheus endpoints to scrape, one [[scrape]] table each (none by default).\n\
         # Samples go to the `scraped` table (stored, not re-exported); histograms listed\n\
         # become per-window quantiles in `service_latency`.\n# [[scrape]]\n",
    );
    for (key, value) in &table {
        let doc = TARGET_KEY_DOCS
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, d)| *d)
            .unwrap_or_else(|| panic!("scrape.{key} has no comment"));
        let doc = with_range(doc, &format!("scrape.{key}"));
        out.push_str(&format!("# {doc}\n# {key} = {value}\n"));
    }
    out
}

/// Checks the targets; on failure the key (`scrape[i].key`, 0-based like the
/// tables in the file) and the message.
pub fn validate_targets(targets: &[ScrapeTarget]) -> Result<(), (String, String)> {
    let mut names = std::collections::HashSet::new();
    for (i, t) in targets.iter().enumerate() {
        let err = |key: &str, message: String| {
            Err((
                format!("scrape[{i}].{key}"),
                format!("[[scrape]] {:?}: {key} = {message}", t.name),
            ))
        };
        let name_ok = !t.name.is_empty()
            && t.name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.' | ':'));
        if !name_ok {
            return err(
                "name",
                format!("{:?}: must be non-empty letters, digits, _ - . :", t.name),
            );
        }
        if !names.insert(&t.name) {
            return err(
                "name",
                format!("{:?}: another target has this name", t.name),
            );
        }
        if !t.url.starts_with("http://") {
            return err(
                "url",
                format!("{:?}: only plain http:// endpoints are scraped", t.url),
            );
        }
        if let Err(e) = ureq::http::Uri::try_from(t.url.as_str()) {
            return err("url", format!("{:?}: {e}", t.url));
        }
        if !(t.interval_secs.is_finite() && (0.1..=86_400.0).contains(&t.interval_secs)) {
            return err(
                "interval_secs",
                format!("{}: must be between 0.1 and 86400", t.interval_secs),
            );
        }
        if !(t.timeout_secs.is_finite() && t.timeout_secs > 0.0 && t.timeout_secs < t.interval_secs)
        {
            return err(
                "timeout_secs",
                format!(
                    "{}: must be above 0 and under interval_secs ({})",
                    t.timeout_secs, t.interval_secs
                ),
            );
        }
        if !(1..=86_400).contains(&t.window_secs) || (t.window_secs as f64) < t.interval_secs {
            return err(
                "window_secs",
                format!(
                    "{}: must be between 1 and 86400 and at least interval_secs ({}): a window needs a scrape at each end",
                    t.window_secs, t.interval_secs
                ),
            );
        }
        for h in &t.histograms {
            let ok = h
                .chars()
                .next()
                .is_some_and(|c| c.is_ascii_alphabetic() || c == '_' || c == ':')
                && h.chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':');
            if !ok || h.ends_with("_bucket") {
                return err(
                    "histograms",
                    format!("{h:?}: must be a metric family name, without _bucket"),
                );
            }
        }
    }
    Ok(())
}

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

crate::collectors::common_settings!(ScrapeConfig);

impl crate::collectors::Registered for ScrapeConfig {
    fn tables() -> &'static [&'static vtax_store::TableDef] {
        TABLES
    }
    fn key_docs() -> &'static [(&'static str, &'static str)] {
        KEY_DOCS
    }
    fn build(
        &self,
        _all: &crate::collectors::CollectorsConfig,
        roots: &crate::collectors::Roots,
    ) -> Box<dyn crate::collectors::Collector> {
        Box::new(Scrape::new(self, roots))
    }
    fn check(&self) -> Result<(), (String, String)> {
        validate_targets(&self.targets)
    }
}

/// Ranges of the numeric keys of each `[[scrape]]` table (`timeout_secs`
/// must also be under `interval_secs`, and `window_secs` at least it).
pub static TARGET_KEY_RANGES: crate::keys::KeyRanges = &[
    (
        "interval_secs",
        crate::keys::KeyRange::between(0.1, 86_400.0),
    ),
    (
        "timeout_secs",
        crate::keys::KeyRange::above(0.0, 86_400.0),
    ),
    (
        "window_secs",
        crate::keys::KeyRange::between(1.0, 86_400.0),
    ),
    (
        "sample_limit",
        crate::keys::KeyRange::between(1.0, 1_000_000.0),
    ),
    ("label_limit", crate::keys::KeyRange::between(1.0, 1024.0)),
    (
        "label_value_length_limit_bytes",
        crate::keys::KeyRange::between(16.0, 1_048_576.0),
    ),
    (
        "body_size_limit_bytes",
        crate::keys::KeyRange::between(4096.0, 67_108_864.0),
    ),
];

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
        help: "One row per window (window_secs, on wall-clock multiples) per series of each histogram a [[scrape]] target lists: quantiles of the observations made in the window, from the increase of the cumulative buckets between the scrapes that open and close it, interpolated within a bucket as PromQL's histogram_quantile does. A histogram named _milliseconds or _microseconds is converted to seconds. The row's time is the closing scrape's.",
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
            window_seconds: f64 = seconds("Time between the scrapes that open and close the window."),
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
            samples: Option<u64> = FieldDef::gauge(FieldType::U64, Unit::None, "Samples in the last valid scrape."),
            scrapes: u64 = FieldDef::counter(FieldType::U64, Unit::None, "Scrapes attempted."),
            failures_connect: u64 = failures("Scrapes that failed because the target could not be reached (refused, reset, no such host): it is down."),
            failures_timeout: u64 = failures("Scrapes that did not finish within timeout_secs: the target is slow or hangs."),
            failures_http: u64 = failures("Scrapes answered with an HTTP status other than 2xx."),
            failures_invalid: u64 = failures("Scrapes whose body was not a valid exposition (not UTF-8, or a line the parser rejects)."),
            failures_limit: u64 = failures("Scrapes rejected whole, nothing stored, for going past one of the target's limits: sample_limit, label_limit, label_value_length_limit_bytes or body_size_limit_bytes."),
        ],
        exported: true,
    }
}

/// Why a scrape failed: the reasons counted in `scrape_target`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reason {
    /// Not reachable.
    Connect,
    /// Past its timeout.
    Timeout,
    /// Not a 2xx status.
    Http,
    /// Not a valid exposition.
    Invalid,
    /// Past one of the target's limits.
    Limit,
}

impl Reason {
    /// The reason as logs and field names say it.
    pub fn as_str(self) -> &'static str {
        match self {
            Reason::Connect => "connect",
            Reason::Timeout => "timeout",
            Reason::Http => "http",
            Reason::Invalid => "invalid",
            Reason::Limit => "limit",
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

/// A failed scrape: the reason and what happened.
#[derive(Clone, Debug)]
pub struct Failure {
    /// The counted reason.
    pub reason: Reason,
    /// The error, for the log.
    pub message: String,
}

fn fail(reason: Reason, message: impl Into<String>) -> Failure {
    Failure {
        reason,
        message: message.into(),
    }
}

/// A histogram series' buckets: (upper bound, cumulative count), sorted by bound.
pub type Buckets = Vec<(f64, f64)>;
/// Histogram series of one scrape, by (family, labels without `le`).
pub type Snapshot = BTreeMap<(String, String), Buckets>;

/// The `q`-quantile of a histogram given as cumulative bucket counts, the way
/// PromQL's `histogram_quantile` computes it: find the bucket the rank falls
/// in and interpolate linearly within it, the first bucket starting at 0
/// (when its bound is positive); a rank in the `+Inf` bucket gives the
/// largest finite bound. Counts that decrease with the bound are raised to
/// the running maximum, as Prometheus does. None where PromQL answers NaN: no
/// observations, no `+Inf` bucket, fewer than two buckets, or a count or
/// bound that is NaN or negative infinity.
pub fn bucket_quantile(q: f64, buckets: &[(f64, f64)]) -> Option<f64> {
    if buckets
        .iter()
        .any(|&(le, n)| le.is_nan() || !n.is_finite() || le == f64::NEG_INFINITY)
    {
        return None;
    }
    let mut b: Buckets = buckets.to_vec();
    b.sort_by(|x, y| x.0.total_cmp(&y.0));
    // Two buckets with one bound (aggregated series) hold the sum of both.
    b.dedup_by(|next, kept| {
        let same = next.0 == kept.0;
        if same {
            kept.1 += next.1;
        }
        same
    });
    if b.len() < 2 || b[b.len() - 1].0 != f64::INFINITY {
        return None;
    }
    let mut running = f64::NEG_INFINITY;
    for bucket in &mut b {
        running = running.max(bucket.1);
        bucket.1 = running;
    }
    let total = b[b.len() - 1].1;
    if total <= 0.0 {
        return None;
    }
    let rank = q.clamp(0.0, 1.0) * total;
    let i = b.iter().position(|&(_, n)| n >= rank)?;
    if i == b.len() - 1 {
        return Some(b[i - 1].0);
    }
    let (end, at_end) = b[i];
    if i == 0 && end <= 0.0 {
        return Some(end);
    }
    let (start, below) = if i == 0 { (0.0, 0.0) } else { b[i - 1] };
    let in_bucket = at_end - below;
    if in_bucket <= 0.0 {
        return Some(end);
    }
    Some(start + (end - start) * (rank - below) / in_bucket)
}

/// The observations a histogram series made between two scrapes: per bucket,
/// the later count minus the earlier. A count that went down (the target
/// restarted) or a changed set of bounds means the series started over: the
/// later counts are the window's, as PromQL's `increase` counts a reset.
pub fn window_delta(before: &[(f64, f64)], after: &[(f64, f64)]) -> Buckets {
    let same_bounds =
        before.len() == after.len() && before.iter().zip(after).all(|(b, a)| b.0 == a.0);
    if !same_bounds || before.iter().zip(after).any(|(b, a)| a.1 < b.1) {
        return after.to_vec();
    }
    before
        .iter()
        .zip(after)
        .map(|(b, a)| (a.0, a.1 - b.1))
        .collect()
}

/// Seconds per unit of a histogram, from its name's unit suffix.
fn seconds_per_unit(family: &str) -> f64 {
    if family.ends_with("_milliseconds") || family.ends_with("_ms") {
        1e-3
    } else if family.ends_with("_microseconds") || family.ends_with("_us") {
        1e-6
    } else {
        1.0
    }
}

/// Splits a canonical label set into the value of `le` and the rest, still
/// canonical. None when there is no `le` or the text is not canonical.
pub fn split_le(labels: &str) -> Option<(String, &str)> {
    let mut rest = String::with_capacity(labels.len());
    let mut le = None;
    let bytes = labels.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        let start = i;
        let eq = labels[i..].find("=\"")? + i;
        let name = &labels[i..eq];
        let mut j = eq + 2;
        while j < bytes.len() && bytes[j] != b'"' {
            j += if bytes[j] == b'\\' { 2 } else { 1 };
        }
        if j >= bytes.len() {
            return None;
        }
        let value = &labels[eq + 2..j];
        if name == "le" {
            le = Some(value);
        } else {
            if !rest.is_empty() {
                rest.push(',');
            }
            rest.push_str(&labels[start..=j]);
        }
        i = j + 1;
        if i < bytes.len() {
            if bytes[i] != b',' {
                return None;
            }
            i += 1;
        }
    }
    le.map(|le| (rest, le))
}

/// One parsed scrape: its rows and the histogram series asked for.
pub struct Scraped {
    /// One `scraped` row per sample.
    pub rows: Batch,
    /// The series of the `histograms` families.
    pub histograms: Snapshot,
}

/// Parses an exposition as it is read, into `scraped` rows of `target` at
/// `time_us`, picking out the histogram series `target` lists. Memory holds
/// one line and the rows so far; the first line past one of the target's
/// limits ends the parse (a `limit` failure), as does the first invalid one
/// (`invalid`). A read error is classified as a fetch's would be.
pub fn parse_stream(
    mut body: impl BufRead,
    format: Format,
    target: &ScrapeTarget,
    time_us: i64,
) -> Result<Scraped, Failure> {
    let limits = Limits {
        label_limit: usize::try_from(target.label_limit).unwrap_or(usize::MAX),
        label_value_length_limit_bytes: usize::try_from(target.label_value_length_limit_bytes)
            .unwrap_or(usize::MAX),
    };
    let mut parser = Parser::with_limits(format, limits);
    let mut rows = BatchBuilder::new(&tables::SCRAPED);
    let mut series: Snapshot = BTreeMap::new();
    let mut line = Vec::new();
    let mut offset_bytes = 0u64;
    loop {
        line.clear();
        let read = body
            .read_until(b'\n', &mut line)
            .map_err(|e| classify(ureq::Error::from(e)))?;
        if read == 0 {
            break;
        }
        let text = std::str::from_utf8(&line).map_err(|e| {
            fail(
                Reason::Invalid,
                format!(
                    "body is not UTF-8 (at byte {})",
                    offset_bytes + e.valid_up_to() as u64
                ),
            )
        })?;
        offset_bytes += read as u64;
        let text = text.strip_suffix('\n').unwrap_or(text);
        let sample = match parser.parse_line(text) {
            Ok(Some(sample)) => sample,
            Ok(None) => continue,
            Err(e) => {
                let reason = match e.limit {
                    Some(_) => Reason::Limit,
                    None => Reason::Invalid,
                };
                return Err(fail(reason, e.to_string()));
            }
        };
        if rows.len() as u64 >= target.sample_limit {
            return Err(fail(
                Reason::Limit,
                format!(
                    "more than sample_limit {} samples (line {})",
                    target.sample_limit,
                    parser.line_number()
                ),
            ));
        }
        if let Some(family) = sample.metric.strip_suffix("_bucket") {
            if target.histograms.iter().any(|h| h == family) {
                let (rest, le) = split_le(&sample.labels).ok_or_else(|| {
                    fail(
                        Reason::Invalid,
                        format!(
                            "line {}: bucket without a valid le label",
                            parser.line_number()
                        ),
                    )
                })?;
                let bound: f64 = le.parse().map_err(|_| {
                    fail(
                        Reason::Invalid,
                        format!("line {}: le={le:?} is not a number", parser.line_number()),
                    )
                })?;
                series
                    .entry((family.to_string(), rest))
                    .or_default()
                    .push((bound, sample.value));
            }
        }
        let row = ScrapedRow {
            target: &target.name,
            metric: sample.metric,
            labels: &sample.labels,
            value: Some(sample.value),
        };
        rows.push_row(time_us, &row)
            .expect("a scraped row is for the scraped table");
    }
    parser
        .finish()
        .map_err(|e| fail(Reason::Invalid, e.to_string()))?;
    for buckets in series.values_mut() {
        buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
    }
    Ok(Scraped {
        rows: rows.finish(),
        histograms: series,
    })
}

/// Scrapes a target once: fetches it and parses the body as it arrives.
fn scrape(agent: &ureq::Agent, target: &ScrapeTarget, time_us: i64) -> Result<Scraped, Failure> {
    let mut response = agent
        .get(&target.url)
        .header("Accept", ACCEPT)
        .call()
        .map_err(classify)?;
    let status = response.status();
    if !status.is_success() {
        return Err(fail(Reason::Http, format!("HTTP status {status}")));
    }
    let format = match response.headers().get("content-type") {
        Some(v) if v.as_bytes().starts_with(b"application/openmetrics-text") => Format::OpenMetrics,
        _ => Format::PrometheusText,
    };
    // A declared length past the limit is refused before a byte is read.
    let declared_bytes = response
        .headers()
        .get("content-length")
        .and_then(|v| v.to_str().ok()?.trim().parse::<u64>().ok());
    if let Some(bytes) = declared_bytes.filter(|&b| b > target.body_size_limit_bytes) {
        return Err(body_too_large(bytes, target.body_size_limit_bytes));
    }
    // ureq's limit errs on the read after `limit` bytes even at the body's
    // end: one byte more lets a body of exactly the limit read to its end.
    let reader = response
        .body_mut()
        .with_config()
        .limit(target.body_size_limit_bytes.saturating_add(1))
        .reader();
    parse_stream(
        std::io::BufReader::with_capacity(64 << 10, reader),
        format,
        target,
        time_us,
    )
}

fn body_too_large(bytes: u64, limit_bytes: u64) -> Failure {
    fail(
        Reason::Limit,
        format!("body of {bytes} bytes or more, larger than body_size_limit_bytes {limit_bytes}"),
    )
}

fn classify(e: ureq::Error) -> Failure {
    use std::io::ErrorKind;
    let reason = match &e {
        ureq::Error::Timeout(_) => Reason::Timeout,
        ureq::Error::Io(io) if matches!(io.kind(), ErrorKind::TimedOut | ErrorKind::WouldBlock) => {
            Reason::Timeout
        }
        ureq::Error::Io(_) | ureq::Error::HostNotFound | ureq::Error::ConnectionFailed => {
            Reason::Connect
        }
        ureq::Error::StatusCode(_) => Reason::Http,
        // The reader was given the limit plus one byte (see `scrape`).
        ureq::Error::BodyExceedsLimit(read_bytes) => {
            return body_too_large(*read_bytes, read_bytes.saturating_sub(1))
        }
        _ => Reason::Invalid,
    };
    fail(reason, e.to_string())
}

/// A target's window: the histogram snapshot of the scrape that opened it.
#[derive(Default)]
pub struct Windows {
    window_us: i64,
    base: Option<(i64, i64, Snapshot)>,
}

impl Windows {
    /// Windows of `window_secs`, on wall-clock multiples.
    pub fn new(window_secs: u64) -> Self {
        Windows {
            window_us: window_secs as i64 * 1_000_000,
            base: None,
        }
    }

    /// Takes a scrape's snapshot (`grid_us`: the wall-clock instant it was
    /// scheduled for, which decides its window; `time_us`: when it ran).
    /// When the scrape is in a later window than the one open, returns the
    /// closed window's rows: (family, labels, delta buckets, seconds covered).
    pub fn advance(
        &mut self,
        grid_us: i64,
        time_us: i64,
        snapshot: Snapshot,
    ) -> Vec<(String, String, Buckets, f64)> {
        let mut closed = Vec::new();
        match &self.base {
            Some((base_grid, _, _))
                if grid_us.div_euclid(self.window_us) == base_grid.div_euclid(self.window_us) =>
            {
                return closed;
            }
            Some((_, base_time, base)) => {
                let span = (time_us - base_time) as f64 / 1e6;
                for ((family, labels), after) in &snapshot {
                    // A series that appeared within the window has no opening
                    // scrape; PromQL's increase needs two samples too.
                    if let Some(before) = base.get(&(family.clone(), labels.clone())) {
                        closed.push((
                            family.clone(),
                            labels.clone(),
                            window_delta(before, after),
                            span,
                        ));
                    }
                }
            }
            None => {}
        }
        self.base = Some((grid_us, time_us, snapshot));
        closed
    }
}

/// What a target's thread shares with the collector.
#[derive(Default)]
struct TargetShared {
    /// Rows for the store, oldest first.
    pending: Vec<Arc<Batch>>,
    /// The last status row and the last window's rows, for `/metrics`.
    status: Option<Arc<Batch>>,
    latency: Option<Arc<Batch>>,
    /// Histogram families asked for but absent from the last valid scrape.
    missing: Vec<String>,
    /// The failure the target is in, if any.
    failing: Option<Failure>,
    dropped: u64,
    /// The target's counters as of its last scrape.
    counts: Counts,
}

/// A target's counters since the agent started: scrapes, and failures by
/// reason.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
struct Counts {
    scrapes: u64,
    failures: [u64; 5],
}

#[derive(Default)]
struct Shared {
    stopper: Stopper,
    targets: Mutex<BTreeMap<String, TargetShared>>,
    /// Counters a target's thread starts from, by target name: those of the
    /// collector this one replaced at a reload.
    carried: Mutex<BTreeMap<String, Counts>>,
}

/// The scrape collector.
pub struct Scrape {
    config: ScrapeConfig,
    shared: Arc<Shared>,
    started: bool,
}

impl Scrape {
    /// A collector whose targets' threads start at `probe`.
    pub fn new(config: &ScrapeConfig, _roots: &Roots) -> Self {
        Scrape {
            config: config.clone(),
            shared: Arc::new(Shared::default()),
            started: false,
        }
    }
}

impl Drop for Scrape {
    fn drop(&mut self) {
        // The threads are not joined: one blocked on a hung target would hold
        // up a stop or reload for its timeout. They see the flag and exit.
        self.shared.stopper.stop();
    }
}

impl Collector for Scrape {
    fn name(&self) -> &'static str {
        "scrape"
    }

    fn probe(&mut self) -> Availability {
        if self.config.targets.is_empty() {
            return Availability::Absent("no [[scrape]] targets configured".into());
        }
        if !self.started {
            self.started = true;
            for target in &self.config.targets {
                self.shared
                    .targets
                    .lock()
                    .expect("not poisoned")
                    .insert(target.name.clone(), TargetShared::default());
                let (target, shared) = (target.clone(), self.shared.clone());
                let spawned = std::thread::Builder::new()
                    .name(format!("vtax-scrape-{}", target.name))
                    .spawn(move || target_loop(&target, &shared));
                if let Err(e) = spawned {
                    return Availability::Absent(format!("cannot start a scrape thread: {e}"));
                }
            }
        }
        let names: Vec<&str> = self
            .config
            .targets
            .iter()
            .map(|t| t.name.as_str())
            .collect();
        Availability::Available(format!("{} target(s): {}", names.len(), names.join(", ")))
    }

    /// Carries on each target's scrape and failure counts: the rebuilt
    /// collector's threads would start them from zero, and
    /// `vtax_scrape_target_scrapes_total` would go back on `/metrics`.
    fn take_over(&mut self, previous: Box<dyn Collector>) {
        let Ok(previous) = previous.into_any().downcast::<Scrape>() else {
            return;
        };
        let targets = previous.shared.targets.lock().expect("not poisoned");
        let mut carried = self.shared.carried.lock().expect("not poisoned");
        for (name, target) in targets.iter() {
            carried.insert(name.clone(), target.counts);
        }
    }

    fn collect(&mut self, _time_us: i64) -> anyhow::Result<Vec<Batch>> {
        let mut targets = self.shared.targets.lock().expect("not poisoned");
        let mut out = Vec::new();
        for target in targets.values_mut() {
            out.extend(
                target
                    .pending
                    .drain(..)
                    .map(|b| Arc::try_unwrap(b).unwrap_or_else(|b| (*b).clone())),
            );
        }
        Ok(out)
    }

    fn problems(&self) -> Vec<String> {
        let targets = self.shared.targets.lock().expect("not poisoned");
        let mut out = Vec::new();
        for (name, t) in targets.iter() {
            if let Some(f) = &t.failing {
                out.push(format!(
                    "scrape target {name} failing ({}): {}",
                    f.reason.as_str(),
                    f.message
                ));
            }
            for family in &t.missing {
                out.push(format!(
                    "scrape target {name}: histogram {family} not in its last scrape"
                ));
            }
            if t.dropped > 0 {
                out.push(format!(
                    "scrape target {name}: {} scrapes dropped, not harvested in time",
                    t.dropped
                ));
            }
        }
        out
    }

    fn exposed(&self) -> Option<Vec<Arc<Batch>>> {
        let targets = self.shared.targets.lock().expect("not poisoned");
        Some(
            targets
                .values()
                .flat_map(|t| t.status.iter().chain(t.latency.iter()).cloned())
                .collect(),
        )
    }
}

/// One target's thread: scrape on its grid until stopped.
fn target_loop(target: &ScrapeTarget, shared: &Shared) {
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .timeout_global(Some(Duration::from_secs_f64(target.timeout_secs)))
        .http_status_as_error(false)
        .user_agent(format!("vtax/{}", env!("CARGO_PKG_VERSION")))
        .build()
        .into();
    let interval_us = ((target.interval_secs * 1e6) as i64).max(1);
    let mut windows = Windows::new(target.window_secs);
    let Counts {
        mut scrapes,
        mut failures,
    } = shared
        .carried
        .lock()
        .expect("not poisoned")
        .remove(&target.name)
        .unwrap_or_default();
    let mut log = TransitionLog::default();
    let scale = |family: &str| seconds_per_unit(family);
    let mut last_grid_us = i64::MIN;
    loop {
        let (grid_us, at) = next_grid(interval_us, last_grid_us);
        last_grid_us = grid_us;
        if shared.stopper.sleep_until(at) {
            return;
        }
        let time_us = now_us();
        let started = Instant::now();
        let result = scrape(&agent, target, time_us);
        let duration = started.elapsed().as_secs_f64();
        scrapes += 1;
        let mut batches: Vec<Batch> = Vec::new();
        let mut latency = None;
        let (up, samples, missing, failure) = match result {
            Ok(scraped) => {
                let samples = scraped.rows.len() as u64;
                batches.push(scraped.rows);
                let missing: Vec<String> = target
                    .histograms
                    .iter()
                    .filter(|h| !scraped.histograms.keys().any(|(f, _)| f == *h))
                    .cloned()
                    .collect();
                let closed = windows.advance(grid_us, time_us, scraped.histograms);
                if !closed.is_empty() {
                    let mut rows = BatchBuilder::new(&SERVICE_LATENCY);
                    for (family, labels, delta, span) in &closed {
                        let unit = scale(family);
                        let observations = delta.last().map_or(0.0, |b| b.1);
                        let quantile = |q: f64| bucket_quantile(q, delta).map(|v| v * unit);
                        let row = ServiceLatencyRow {
                            target: &target.name,
                            metric: family,
                            labels,
                            p50_seconds: quantile(0.5),
                            p99_seconds: quantile(0.99),
                            p999_seconds: quantile(0.999),
                            observations,
                            observations_per_second: (*span > 0.0).then(|| observations / span),
                            window_seconds: *span,
                        };
                        rows.push_row(time_us, &row)
                            .expect("a latency row is for the service_latency table");
                    }
                    let rows = rows.finish();
                    latency = Some(rows.clone());
                    batches.push(rows);
                }
                (1, Some(samples), missing, None)
            }
            Err(f) => {
                failures[f.reason.index()] += 1;
                (0, None, Vec::new(), Some(f))
            }
        };
        let mut status = BatchBuilder::new(&SCRAPE_TARGET);
        let failed = |reason: Reason| failures[reason.index()];
        let row = ScrapeTargetRow {
            target: &target.name,
            up,
            duration_seconds: duration,
            samples,
            scrapes,
            failures_connect: failed(Reason::Connect),
            failures_timeout: failed(Reason::Timeout),
            failures_http: failed(Reason::Http),
            failures_invalid: failed(Reason::Invalid),
            failures_limit: failed(Reason::Limit),
        };
        status
            .push_row(time_us, &row)
            .expect("a status row is for the scrape_target table");
        let status = Arc::new(status.finish());

        let mut all = shared.targets.lock().expect("not poisoned");
        let Some(state) = all.get_mut(&target.name) else {
            return;
        };
        log.transition(&target.name, &state.failing, failure.as_ref());
        state.counts = Counts { scrapes, failures };
        state.failing = failure;
        state.missing = missing;
        state.status = Some(status.clone());
        match latency {
            Some(rows) => state.latency = Some(Arc::new(rows)),
            // A failing target's last quantiles leave /metrics with it.
            None if up == 0 => state.latency = None,
            None => {}
        }
        let this_scrape = batches.len() + 1;
        state.pending.extend(batches.into_iter().map(Arc::new));
        state.pending.push(status);
        // Oldest first, never this scrape's: by count, and by rows so that
        // scrapes at the sample limit cannot pile up in memory.
        let max_rows = target
            .sample_limit
            .saturating_mul(MAX_PENDING_SCRAPES_AT_LIMIT);
        let mut rows: u64 = state.pending.iter().map(|b| b.len() as u64).sum();
        let mut excess = 0;
        while state.pending.len() - excess > this_scrape
            && (state.pending.len() - excess > MAX_PENDING_PER_TARGET * 3 || rows > max_rows)
        {
            rows -= state.pending[excess].len() as u64;
            excess += 1;
        }
        state.pending.drain(..excess);
        state.dropped += excess as u64;
    }
}

/// A target's log lines: one when its state changes (failing, another
/// reason, recovered), but at most one warning per [`LOG_INTERVAL`] (a target
/// flapping around its sample_limit), the next one saying how many changes
/// went unlogged. A failure that was not logged has no recovery line.
#[derive(Default)]
struct TransitionLog {
    last_warning: Option<Instant>,
    /// Whether the failure going on was logged.
    failure_logged: bool,
    /// Warnings not logged since the last one.
    unlogged: u64,
}

impl TransitionLog {
    fn transition(&mut self, name: &str, before: &Option<Failure>, now: Option<&Failure>) {
        let f = match (before, now) {
            (Some(_), None) => {
                if self.failure_logged {
                    tracing::info!(target_name = name, "Scrape target recovered.");
                }
                self.failure_logged = false;
                return;
            }
            (None, Some(f)) => f,
            (Some(old), Some(f)) if old.reason != f.reason => f,
            _ => return,
        };
        if self
            .last_warning
            .is_some_and(|at| at.elapsed() < LOG_INTERVAL)
        {
            if before.is_none() {
                self.failure_logged = false;
            }
            self.unlogged += 1;
            return;
        }
        let unlogged = std::mem::take(&mut self.unlogged);
        self.last_warning = Some(Instant::now());
        self.failure_logged = true;
        if before.is_none() {
            tracing::warn!(
                target_name = name,
                reason = f.reason.as_str(),
                error = %f.message,
                unlogged_changes = unlogged,
                "Scrape target failing; counted in vtax_scrape_target_failures_*, retried every interval."
            );
        } else {
            tracing::warn!(
                target_name = name,
                reason = f.reason.as_str(),
                error = %f.message,
                unlogged_changes = unlogged,
                "Scrape target still failing, for another reason."
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const INF: f64 = f64::INFINITY;

    fn close(a: Option<f64>, b: f64) {
        let a = a.expect("a quantile");
        assert!((a - b).abs() < 1e-12, "{a} != {b}");
    }

    /// Values worked by hand the way PromQL's bucketQuantile interpolates.
    #[test]
    fn quantiles_interpolate_within_the_bucket() {
        // 100 observations: 50 at or under 0.1, 40 in (0.1, 0.2], 9 in (0.2, 0.4], 1 above.
        let b = [(0.1, 50.0), (0.2, 90.0), (0.4, 99.0), (INF, 100.0)];
        // rank 50 falls at the end of the first bucket, which starts at 0.
        close(bucket_quantile(0.5, &b), 0.1);
        // rank 25: half of the first bucket.
        close(bucket_quantile(0.25, &b), 0.05);
        // rank 70: 20 of 40 into (0.1, 0.2].
        close(bucket_quantile(0.7, &b), 0.15);
        // rank 99: the end of (0.2, 0.4].
        close(bucket_quantile(0.99, &b), 0.4);
        // rank 99.9 is in +Inf: the largest finite bound.
        close(bucket_quantile(0.999, &b), 0.4);
        // Order of the input does not matter.
        let shuffled = [(INF, 100.0), (0.2, 90.0), (0.1, 50.0), (0.4, 99.0)];
        close(bucket_quantile(0.7, &shuffled), 0.15);
    }

    #[test]
    fn quantiles_match_promql_for_a_prometheus_shaped_histogram() {
        // prometheus_http_request_duration_seconds' bounds; 1000 requests.
        let b = [
            (0.1, 985.0),
            (0.2, 991.0),
            (0.4, 995.0),
            (1.0, 999.0),
            (3.0, 1000.0),
            (8.0, 1000.0),
            (INF, 1000.0),
        ];
        // rank 990: 5 of 6 into (0.1, 0.2].
        close(bucket_quantile(0.99, &b), 0.1 + 0.1 * 5.0 / 6.0);
        // rank 999: the end of (0.4, 1].
        close(bucket_quantile(0.999, &b), 1.0);
        // rank 500: 500/985 of the first bucket.
        close(bucket_quantile(0.5, &b), 0.1 * 500.0 / 985.0);
    }

    #[test]
    fn empty_window_has_no_quantiles() {
        let b = [(0.1, 0.0), (1.0, 0.0), (INF, 0.0)];
        assert_eq!(bucket_quantile(0.99, &b), None);
        assert_eq!(bucket_quantile(0.5, &[]), None);
    }

    #[test]
    fn inf_only_or_no_inf_has_no_quantiles() {
        assert_eq!(bucket_quantile(0.5, &[(INF, 10.0)]), None);
        assert_eq!(bucket_quantile(0.5, &[(0.1, 5.0), (1.0, 10.0)]), None);
        // Everything in +Inf: the largest finite bound, as PromQL says.
        close(bucket_quantile(0.5, &[(0.1, 0.0), (INF, 7.0)]), 0.1);
    }

    #[test]
    fn garbage_counts_give_no_quantile_and_no_panic() {
        assert_eq!(bucket_quantile(0.5, &[(0.1, f64::NAN), (INF, 1.0)]), None);
        assert_eq!(bucket_quantile(0.5, &[(f64::NAN, 1.0), (INF, 1.0)]), None);
        assert_eq!(bucket_quantile(0.5, &[(0.1, 1.0), (INF, INF)]), None);
        assert_eq!(bucket_quantile(0.5, &[(0.1, -3.0), (INF, -1.0)]), None);
        // Non-monotonic counts are raised to the running maximum.
        close(
            bucket_quantile(0.5, &[(0.1, 10.0), (0.2, 4.0), (INF, 10.0)]),
            0.05,
        );
        // A first bucket with a negative bound answers that bound.
        close(
            bucket_quantile(0.1, &[(-1.0, 5.0), (0.0, 10.0), (INF, 10.0)]),
            -1.0,
        );
    }

    #[test]
    fn deltas_between_window_ends_and_resets() {
        let before = [(0.1, 10.0), (1.0, 15.0), (INF, 16.0)];
        let after = [(0.1, 12.0), (1.0, 25.0), (INF, 26.0)];
        assert_eq!(
            window_delta(&before, &after),
            vec![(0.1, 2.0), (1.0, 10.0), (INF, 10.0)]
        );
        // rank 5 of 10: 3 of 8 into (0.1, 1].
        close(
            bucket_quantile(0.5, &window_delta(&before, &after)),
            0.1 + 0.9 * 3.0 / 8.0,
        );
        // The target restarted: counts went down, the later ones are the window's.
        let restarted = [(0.1, 1.0), (1.0, 3.0), (INF, 3.0)];
        assert_eq!(window_delta(&after, &restarted), restarted.to_vec());
        // Bounds changed: the same.
        let rebucketed = [(0.5, 30.0), (INF, 40.0)];
        assert_eq!(window_delta(&after, &rebucketed), rebucketed.to_vec());
        // No observations in the window: no quantiles, zero count.
        let idle = window_delta(&after, &after);
        assert_eq!(idle.last().unwrap().1, 0.0);
        assert_eq!(bucket_quantile(0.99, &idle), None);
    }

    #[test]
    fn le_is_split_from_canonical_labels() {
        assert_eq!(
            split_le(r#"code="200",handler="/a,\"b\"",le="0.1""#),
            Some((r#"code="200",handler="/a,\"b\"""#.to_string(), "0.1"))
        );
        assert_eq!(split_le(r#"le="+Inf""#), Some((String::new(), "+Inf")));
        assert_eq!(split_le(r#"a="1""#), None);
        assert_eq!(split_le(r#"a="1"#), None);
    }

    const BODY: &str = "\
# TYPE req_seconds histogram
req_seconds_bucket{path=\"/a\",le=\"0.1\"} 3
req_seconds_bucket{path=\"/a\",le=\"1\"} 4
req_seconds_bucket{le=\"+Inf\",path=\"/a\"} 5
req_seconds_sum{path=\"/a\"} 2.5
req_seconds_count{path=\"/a\"} 5
other_total 7
";

    /// A reload that changes `[[scrape]]` rebuilds the collector; each
    /// target's scrape and failure counts carry on from the old one's.
    #[test]
    fn a_rebuilt_collector_carries_on_each_targets_counts() {
        // Nothing listens on port 1: every scrape is a connect failure.
        let fast = |timeout_secs| ScrapeTarget {
            interval_secs: 0.02,
            timeout_secs,
            ..ScrapeTarget::new("down", "http://127.0.0.1:1/metrics")
        };
        let config = |timeout_secs| ScrapeConfig {
            targets: vec![fast(timeout_secs)],
            ..ScrapeConfig::default()
        };
        let counts = |scrape: &Scrape| scrape.shared.targets.lock().unwrap()["down"].counts;
        let wait_for = |scrape: &Scrape, scrapes: u64| {
            let deadline = Instant::now() + Duration::from_secs(20);
            while counts(scrape).scrapes < scrapes {
                assert!(Instant::now() < deadline, "{:?}", counts(scrape));
                std::thread::sleep(Duration::from_millis(10));
            }
            counts(scrape)
        };
        let mut old = Scrape::new(&config(1.0), &Roots::default());
        assert!(matches!(old.probe(), Availability::Available(_)));
        let before = wait_for(&old, 5);
        assert!(before.failures.iter().sum::<u64>() >= 5, "{before:?}");
        let mut new = Scrape::new(&config(2.0), &Roots::default());
        new.take_over(Box::new(old));
        assert!(matches!(new.probe(), Availability::Available(_)));
        // Its first scrape goes on from the old counts, not from zero.
        let after = wait_for(&new, 1);
        assert!(after.scrapes > before.scrapes, "{after:?} after {before:?}");
        for (a, b) in after.failures.iter().zip(before.failures) {
            assert!(*a >= b, "{after:?} after {before:?}");
        }
    }

    fn target(histograms: &[&str]) -> ScrapeTarget {
        ScrapeTarget {
            histograms: histograms.iter().map(|h| h.to_string()).collect(),
            ..ScrapeTarget::new("t", "http://127.0.0.1:1/metrics")
        }
    }

    fn parse(body: &str, format: Format, target: &ScrapeTarget) -> Result<Scraped, Failure> {
        parse_stream(body.as_bytes(), format, target, 7)
    }

    /// (metric, labels, value) of row `i`.
    fn row(rows: &Batch, i: usize) -> (String, String, f64) {
        let tag = |t: usize| rows.tags[t].dict[rows.tags[t].codes[i] as usize].clone();
        let vtax_store::batch::Values::F64(values) = &rows.fields[0].values else {
            panic!("value is f64");
        };
        (tag(1), tag(2), values[i])
    }

    #[test]
    fn bodies_are_parsed_and_histograms_picked_out() {
        let scraped = parse(BODY, Format::PrometheusText, &target(&["req_seconds"])).unwrap();
        assert_eq!(scraped.rows.len(), 6);
        assert_eq!(scraped.rows.time_us, vec![7; 6]);
        assert_eq!(
            row(&scraped.rows, 2),
            (
                "req_seconds_bucket".to_string(),
                r#"le="+Inf",path="/a""#.to_string(),
                5.0
            )
        );
        let series = &scraped.histograms[&("req_seconds".to_string(), r#"path="/a""#.to_string())];
        assert_eq!(series, &vec![(0.1, 3.0), (1.0, 4.0), (INF, 5.0)]);
        let invalid = |body: &str, format, t: &ScrapeTarget| {
            let f = parse(body, format, t).err().expect("a failure");
            assert_eq!(f.reason, Reason::Invalid, "{}", f.message);
            f.message
        };
        invalid("<html>oops</html>\n", Format::PrometheusText, &target(&[]));
        invalid(
            "x_bucket{le=\"fast\"} 1\n",
            Format::PrometheusText,
            &target(&["x"]),
        );
        invalid("x 1\n", Format::OpenMetrics, &target(&[]));
        let not_utf8 = parse_stream(
            &b"x 1\ny{a=\"\xc3\xa9\xff\"} 2\n"[..],
            Format::PrometheusText,
            &target(&[]),
            7,
        );
        let message = not_utf8.err().expect("a failure").message;
        assert!(message.contains("at byte 11"), "{message}");
        // Without a final newline the last line counts all the same.
        assert_eq!(
            parse("a 1\nb 2", Format::PrometheusText, &target(&[]))
                .unwrap()
                .rows
                .len(),
            2
        );
    }

    /// A 1M-series target drove the agent past the unit's MemoryMax=256M: a
    /// scrape past a limit is now refused whole, at the first line past it.
    #[test]
    fn a_scrape_past_a_limit_is_refused_whole() {
        let lines =
            |n: usize| -> String { (0..n).map(|i| format!("m{{i=\"{i}\"}} {i}\n")).collect() };
        let t = ScrapeTarget {
            sample_limit: 100,
            label_limit: 3,
            label_value_length_limit_bytes: 16,
            ..target(&[])
        };
        // At every limit: accepted.
        let at_limit = format!(
            "{}big{{a=\"{}\",b=\"\",c=\"\"}} 1\n# EOF\n",
            lines(99),
            "x".repeat(16)
        );
        assert_eq!(
            parse(&at_limit, Format::OpenMetrics, &t)
                .unwrap()
                .rows
                .len(),
            100
        );
        let limit = |body: &str| {
            let f = parse(body, Format::PrometheusText, &t)
                .err()
                .expect("a failure");
            assert_eq!(f.reason, Reason::Limit, "{}", f.message);
            f.message
        };
        let message = limit(&lines(1_000_000));
        assert!(
            message.contains("more than sample_limit 100 samples (line 101)"),
            "{message}"
        );
        let message = limit(&format!(
            "{}m{{a=\"1\",b=\"2\",c=\"3\",d=\"4\"}} 1\n",
            lines(5)
        ));
        assert!(
            message.contains("line 6: 4 labels, more than label_limit 3"),
            "{message}"
        );
        let message = limit(&format!("m{{a=\"{}\"}} 1\n", "x".repeat(8 << 20)));
        assert!(
            message.contains("label \"a\" has a value of 8388608 bytes"),
            "{message}"
        );
        // A bad line before the limit is still `invalid`.
        let f = parse(&format!("{}oops\n", lines(5)), Format::PrometheusText, &t)
            .err()
            .unwrap();
        assert_eq!(f.reason, Reason::Invalid);
    }

    #[test]
    fn windows_close_on_wall_clock_multiples() {
        let snap = |n: f64| -> Snapshot {
            [(("h".to_string(), String::new()), vec![(0.1, n), (INF, n)])]
                .into_iter()
                .collect()
        };
        let mut w = Windows::new(10);
        let s = 1_000_000;
        assert!(w.advance(100 * s, 100 * s + 3, snap(1.0)).is_empty());
        // A second scrape in the same window does not close it.
        assert!(w.advance(105 * s, 105 * s, snap(2.0)).is_empty());
        let closed = w.advance(110 * s, 110 * s + 3, snap(5.0));
        assert_eq!(closed.len(), 1);
        assert_eq!(closed[0].2, vec![(0.1, 4.0), (INF, 4.0)]);
        assert!((closed[0].3 - 10.0).abs() < 1e-9);
        // A series new in this window is left for the next.
        let mut two = snap(9.0);
        two.insert(("h".into(), "x=\"1\"".into()), vec![(INF, 1.0)]);
        let closed = w.advance(120 * s, 120 * s, two);
        assert_eq!(closed.len(), 1);
    }

    #[test]
    fn targets_are_validated() {
        let t = ScrapeTarget {
            histograms: vec!["x_seconds".into()],
            ..ScrapeTarget::new("a", "http://127.0.0.1:1/metrics")
        };
        assert!(validate_targets(std::slice::from_ref(&t)).is_ok());
        let with = |f: &dyn Fn(&mut ScrapeTarget)| {
            let mut t = t.clone();
            f(&mut t);
            validate_targets(&[t]).unwrap_err()
        };
        assert_eq!(with(&|t| t.url = "https://x/".into()).0, "scrape[0].url");
        assert_eq!(with(&|t| t.timeout_secs = 10.0).0, "scrape[0].timeout_secs");
        assert_eq!(with(&|t| t.window_secs = 5).0, "scrape[0].window_secs");
        assert_eq!(
            with(&|t| t.histograms = vec!["x_bucket".into()]).0,
            "scrape[0].histograms"
        );
        assert_eq!(with(&|t| t.name = "a b".into()).0, "scrape[0].name");
        let err = validate_targets(&[t.clone(), t]).unwrap_err();
        assert_eq!(err.0, "scrape[1].name");
    }
}
