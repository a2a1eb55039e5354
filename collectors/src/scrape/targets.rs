//! A `[[scrape]]` target: its settings and their defaults, comments, ranges
//! and checks, and the example config's commented table.

use super::*;

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

pub(super) fn default_interval() -> f64 {
    DEFAULT_SCRAPE_INTERVAL_SECS
}

pub(super) fn default_timeout() -> f64 {
    DEFAULT_SCRAPE_TIMEOUT_SECS
}

pub(super) fn default_window() -> u64 {
    DEFAULT_SCRAPE_WINDOW_SECS
}

pub(super) fn default_sample_limit() -> u64 {
    DEFAULT_SAMPLE_LIMIT
}

pub(super) fn default_label_limit() -> u64 {
    DEFAULT_LABEL_LIMIT
}

pub(super) fn default_label_value_length_limit_bytes() -> u64 {
    DEFAULT_LABEL_VALUE_LENGTH_LIMIT_BYTES
}

pub(super) fn default_body_size_limit_bytes() -> u64 {
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
    ("label_limit", "Most labels on one sample, its own: Prometheus's label_limit also counts __name__, job and instance, so this is 3 below its equal (default 64); more rejects the scrape the same way."),
    ("label_value_length_limit_bytes", "Longest label value in bytes, unescaped, the metric name's included, as Prometheus's; longer rejects the scrape the same way (default 2048)."),
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
        match ureq::http::Uri::try_from(t.url.as_str()) {
            Err(e) => return err("url", format!("{:?}: {e}", t.url)),
            Ok(uri) if uri.host().is_none_or(str::is_empty) => {
                return err("url", format!("{:?}: no host", t.url));
            }
            Ok(_) => {}
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
