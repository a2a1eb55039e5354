//! `[[remote_write]]` tables of the agent's config file, named as Prometheus
//! names them where it has a name (`basic_auth`, `bearer_token_file`,
//! `tls.ca_file`, `insecure_skip_verify`, `max_samples_per_send`, ...).

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// Default bound on a remote's on-disk queue: at a few thousand samples a
/// second, hours of a receiver outage.
pub const DEFAULT_QUEUE_MAX_BYTES: u64 = 256 << 20;
/// Default most samples in one request: Prometheus's `max_samples_per_send`.
pub const DEFAULT_MAX_SAMPLES_PER_SEND: u64 = 2000;
/// Default longest a sample waits for its request to fill before it is sent
/// anyway: Prometheus's `batch_send_deadline`.
pub const DEFAULT_BATCH_SEND_DEADLINE_SECS: f64 = 5.0;
/// Default first wait before a retry: Prometheus's `min_backoff`.
pub const DEFAULT_MIN_BACKOFF_SECS: f64 = 0.03;
/// Default longest wait between retries: Prometheus's `max_backoff`.
pub const DEFAULT_MAX_BACKOFF_SECS: f64 = 5.0;
/// Default time a request may take before it counts as failed: Prometheus's
/// `remote_timeout`.
pub const DEFAULT_REMOTE_TIMEOUT_SECS: f64 = 30.0;
/// Smallest queue bound accepted: room for a few segments.
pub const MIN_QUEUE_MAX_BYTES: u64 = 1 << 20;

/// One `[[remote_write]]` table.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RemoteWriteConfig {
    /// Names the queue directory and the `remote` label of the counters;
    /// empty in the file, it is derived from `url` ([`Self::derived_name`]).
    #[serde(default)]
    pub name: String,
    /// The receiver's endpoint, e.g. `http://prometheus:9090/api/v1/write`.
    pub url: String,
    /// HTTP basic auth.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub basic_auth: Option<BasicAuth>,
    /// A bearer token sent as `Authorization: Bearer`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bearer_token: Option<String>,
    /// A file holding the bearer token, read on every request.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bearer_token_file: Option<PathBuf>,
    /// TLS for `https` URLs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls: Option<TlsConfig>,
    /// Labels added to every series sent, as Prometheus's `external_labels`:
    /// they say which node a series came from. `instance` (the host name) and
    /// `job = "vtax"` are there unless set here; an empty value removes one.
    /// A table's own tag of the same name wins.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub external_labels: BTreeMap<String, String>,
    /// Only these tables' series are sent (names as in docs/metrics.md);
    /// unset, every exported table's. A fleet that remote-writes every
    /// second to one receiver can send what its dashboards and rules read
    /// and keep the rest in each node's store.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tables: Option<Vec<String>>,
    /// Bytes the on-disk queue may hold before its oldest samples are dropped.
    #[serde(
        default = "default_queue_max_bytes",
        deserialize_with = "crate::size::deserialize_bytes"
    )]
    pub queue_max_bytes: u64,
    /// Most samples in one request.
    #[serde(default = "default_max_samples_per_send")]
    pub max_samples_per_send: u64,
    /// Seconds a sample waits for its request to fill before it goes anyway.
    #[serde(default = "default_batch_send_deadline_secs")]
    pub batch_send_deadline_secs: f64,
    /// Seconds before the first retry; each next one waits twice as long.
    #[serde(default = "default_min_backoff_secs")]
    pub min_backoff_secs: f64,
    /// Longest wait between two retries, in seconds.
    #[serde(default = "default_max_backoff_secs")]
    pub max_backoff_secs: f64,
    /// Seconds a request may take before it is abandoned and retried.
    #[serde(default = "default_remote_timeout_secs")]
    pub remote_timeout_secs: f64,
}

/// `basic_auth = { username, password | password_file }`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BasicAuth {
    /// User name.
    pub username: String,
    /// Password, in the config file.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub password: Option<String>,
    /// A file holding the password, read on every request.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub password_file: Option<PathBuf>,
}

/// `tls = { ca_file, cert_file, key_file, insecure_skip_verify }`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TlsConfig {
    /// CAs to trust for the receiver's certificate; unset: the system's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca_file: Option<PathBuf>,
    /// Client certificate, for receivers that ask for one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cert_file: Option<PathBuf>,
    /// The client certificate's key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key_file: Option<PathBuf>,
    /// Accept any server certificate (tests, and nothing else).
    #[serde(default)]
    pub insecure_skip_verify: bool,
}

fn default_queue_max_bytes() -> u64 {
    DEFAULT_QUEUE_MAX_BYTES
}
fn default_max_samples_per_send() -> u64 {
    DEFAULT_MAX_SAMPLES_PER_SEND
}
fn default_batch_send_deadline_secs() -> f64 {
    DEFAULT_BATCH_SEND_DEADLINE_SECS
}
fn default_min_backoff_secs() -> f64 {
    DEFAULT_MIN_BACKOFF_SECS
}
fn default_max_backoff_secs() -> f64 {
    DEFAULT_MAX_BACKOFF_SECS
}
fn default_remote_timeout_secs() -> f64 {
    DEFAULT_REMOTE_TIMEOUT_SECS
}

impl RemoteWriteConfig {
    /// A remote with every default: only a name and a URL.
    pub fn new(name: &str, url: &str) -> Self {
        RemoteWriteConfig {
            name: name.into(),
            url: url.into(),
            basic_auth: None,
            bearer_token: None,
            bearer_token_file: None,
            tls: None,
            external_labels: BTreeMap::new(),
            tables: None,
            queue_max_bytes: DEFAULT_QUEUE_MAX_BYTES,
            max_samples_per_send: DEFAULT_MAX_SAMPLES_PER_SEND,
            batch_send_deadline_secs: DEFAULT_BATCH_SEND_DEADLINE_SECS,
            min_backoff_secs: DEFAULT_MIN_BACKOFF_SECS,
            max_backoff_secs: DEFAULT_MAX_BACKOFF_SECS,
            remote_timeout_secs: DEFAULT_REMOTE_TIMEOUT_SECS,
        }
    }

    /// The labels every series gets: `instance` and `job` by default, then
    /// `external_labels`, less those set empty; sorted by name.
    pub fn series_labels(&self, host: &str) -> Vec<super::encode::Label> {
        let mut labels = BTreeMap::from([
            ("instance".to_string(), host.to_string()),
            ("job".to_string(), "vtax".to_string()),
        ]);
        labels.extend(self.external_labels.clone());
        labels
            .into_iter()
            .filter(|(_, value)| !value.is_empty())
            .map(|(name, value)| super::encode::Label { name, value })
            .collect()
    }

    /// Whether this remote is sent the series of `table`.
    pub fn sends(&self, table: &str) -> bool {
        self.tables
            .as_ref()
            .is_none_or(|tables| tables.iter().any(|t| t == table))
    }

    /// The name of a remote whose table gives only its `url`, as Prometheus
    /// names one it is not told the name of: from the URL, so the same
    /// remote keeps the same queue across restarts. Its host, port and path
    /// with every other character as `-` (`http://prometheus:9090/api/v1/write`
    /// is `prometheus-9090-api-v1-write`), at most 64 characters.
    pub fn derived_name(url: &str) -> String {
        let rest = url.split_once("://").map_or(url, |(_, rest)| rest);
        // Credentials in the URL name nothing.
        let rest = rest.rsplit_once('@').map_or(rest, |(_, host)| host);
        let rest = rest.split(['?', '#']).next().unwrap_or(rest);
        let mut name = String::new();
        for c in rest.chars() {
            let c = if c.is_ascii_alphanumeric() || c == '_' {
                c
            } else {
                '-'
            };
            if !(c == '-' && (name.is_empty() || name.ends_with('-'))) {
                name.push(c);
            }
        }
        let mut name: String = name.trim_end_matches('-').chars().take(64).collect();
        if name.is_empty() {
            name.push_str("remote");
        }
        name
    }
}
