//! The agent's configuration: one TOML file, every key optional, unknown keys
//! rejected. Defaults are the constants below; `packaging/vtax.example.toml` is
//! generated from them (`vtax check-config --print-defaults`) and a test keeps it
//! in step.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use vtax_exporters::remote_write::config as remote_write;
use vtax_exporters::remote_write::RemoteWriteConfig;

use crate::collectors::{CollectorsConfig, Roots};

/// Where the installed agent looks for its config file.
pub const INSTALLED_CONFIG_PATH: &str = "/etc/vtax/vtax.toml";
/// Address `/metrics` listens on: all interfaces, port 9433.
pub const DEFAULT_LISTEN_ADDRESS: &str = ":9433";
pub use crate::collectors::{DEFAULT_PROCFS, DEFAULT_ROOTFS, DEFAULT_SYSFS};
pub use crate::keys::{KeyRange, KeyRanges};
/// Seconds between two fsyncs of the write-ahead log.
pub const DEFAULT_SYNC_INTERVAL_SECS: f64 = 1.0;
/// Rows held in memory before they are published early as a part file. The
/// agent keeps this small (the store's own default suits imports) so that it
/// stays a small resident on the node.
pub const DEFAULT_MAX_BUFFERED_BYTES: u64 = 2 << 20;
/// Seconds between two compaction and retention passes.
pub const DEFAULT_COMPACT_INTERVAL_SECS: u64 = 300;
/// Bytes of rows the write-ahead log holds in memory while writes fail (a
/// full disk) before new rows are refused. The store's own default (256 MiB)
/// is the whole of the shipped unit's `MemoryMax=256M`: the agent would be
/// killed before it refused a row.
pub const DEFAULT_WAL_MAX_BACKLOG_BYTES: u64 = 32 << 20;
/// What the memory bounds of the file may add up to:
/// `store.wal_max_backlog_bytes + store.max_buffered_bytes` and, per
/// `[[scrape]]` target, `body_size_limit_bytes +` [`SCRAPE_BYTES_PER_SAMPLE`]
/// `x sample_limit`. The shipped unit's `MemoryMax=256M` less 64 MiB for the
/// rest of the agent: about 30 MiB resident with every collector, a merge's
/// 8 MiB, the exposition and the allocator's slack (docs/benchmarks.md).
pub const MEMORY_BOUNDS_MAX_BYTES: u64 = 192 << 20;
/// Memory one scraped sample takes on its way to the store (its row, its
/// interned label text, the store's buffer and WAL frame): a 50,000-sample
/// scrape every 2 s peaked 19 MiB above the agent's own 25 MiB (debug build,
/// docs/benchmarks.md), about 400 bytes a sample.
pub const SCRAPE_BYTES_PER_SAMPLE: u64 = 384;

/// The whole config file.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    /// `/metrics`.
    pub web: WebConfig,
    /// Where the kernel's pseudo-filesystems are.
    pub paths: PathsConfig,
    /// The Parquet store.
    pub store: StoreConfig,
    /// The collectors, one table each.
    pub collectors: CollectorsConfig,
    /// The noisy-neighbour detector and the platform verdict.
    pub detect: crate::detect::DetectConfig,
    /// `[[scrape]]`: local Prometheus endpoints for the `scrape` collector.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub scrape: Vec<crate::collectors::scrape::ScrapeTarget>,
    /// `[[remote_write]]`: receivers that every stored sample is also sent to.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub remote_write: Vec<RemoteWriteConfig>,
    /// Sealed Parquet files to object storage.
    pub upload: crate::upload::UploadConfig,
}

/// `[web]`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct WebConfig {
    /// `host:port` or `:port` to serve `/metrics` on.
    pub listen_address: String,
    /// A Prometheus exporter web config file (TLS, basic auth), as
    /// `--web.config.file` takes; none serves plain HTTP without auth.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub config_file: Option<PathBuf>,
}

impl Default for WebConfig {
    fn default() -> Self {
        WebConfig {
            listen_address: DEFAULT_LISTEN_ADDRESS.into(),
            config_file: None,
        }
    }
}

/// `[paths]`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PathsConfig {
    /// procfs mount point.
    pub procfs: PathBuf,
    /// sysfs mount point.
    pub sysfs: PathBuf,
    /// Where the host's root filesystem is mounted.
    pub rootfs: PathBuf,
}

impl Default for PathsConfig {
    fn default() -> Self {
        PathsConfig {
            procfs: DEFAULT_PROCFS.into(),
            sysfs: DEFAULT_SYSFS.into(),
            rootfs: DEFAULT_ROOTFS.into(),
        }
    }
}

/// `[store]`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct StoreConfig {
    /// Data directory; none picks /var/lib/vtax when it exists, else ./vtax-data.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub data_dir: Option<PathBuf>,
    /// Node name in file names and metadata (and a fleet copy's `node=`
    /// partition); none takes the host name.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    /// Seconds between two fsyncs of the write-ahead log.
    pub sync_interval_secs: f64,
    /// Bytes of rows held in memory before they are published early.
    #[serde(deserialize_with = "vtax_exporters::size::deserialize_bytes")]
    pub max_buffered_bytes: u64,
    /// Most seconds a row waits before it is in a Parquet file; 0 waits for
    /// its hour's end.
    pub max_publish_delay_secs: u64,
    /// Bytes of rows held in memory while WAL writes fail, before new rows
    /// are refused.
    #[serde(deserialize_with = "vtax_exporters::size::deserialize_bytes")]
    pub wal_max_backlog_bytes: u64,
    /// Seconds between two compaction and retention passes.
    pub compact_interval_secs: u64,
    /// Delete days older than this many days; 0 keeps them.
    pub retention_max_age_days: u64,
    /// Delete the oldest files while the tables hold more bytes; 0 for no bound.
    #[serde(deserialize_with = "vtax_exporters::size::deserialize_bytes")]
    pub retention_max_bytes: u64,
}

impl Default for StoreConfig {
    fn default() -> Self {
        StoreConfig {
            data_dir: None,
            node: None,
            sync_interval_secs: DEFAULT_SYNC_INTERVAL_SECS,
            max_buffered_bytes: DEFAULT_MAX_BUFFERED_BYTES,
            max_publish_delay_secs: vtax_store::DEFAULT_MAX_PUBLISH_DELAY.as_secs(),
            wal_max_backlog_bytes: DEFAULT_WAL_MAX_BACKLOG_BYTES,
            compact_interval_secs: DEFAULT_COMPACT_INTERVAL_SECS,
            retention_max_age_days: 0,
            retention_max_bytes: 0,
        }
    }
}

/// Comments for the example file, one per key (a test checks none is missing),
/// and the keys that have no default, shown commented out with an example.
const KEY_DOCS: &[(&str, &str)] = &[
    ("web.listen_address", "Address /metrics listens on: \"host:port\" or \":port\" for every interface."),
    ("web.config_file", "Prometheus exporter web config (TLS, basic auth with bcrypt hashes), the file --web.config.file takes. Unset: plain HTTP, no auth."),
    ("paths.procfs", "procfs mount point; tests point it at a fixture tree."),
    ("paths.sysfs", "sysfs mount point; cgroups are read under <sysfs>/fs/cgroup."),
    ("paths.rootfs", "Where the host's root filesystem is mounted (/host when the agent runs in a container with the host's / bind-mounted there and the host's PID namespace): the filesystem collector then reads the host's mounts from <procfs>/1/mountinfo and stats each under this path."),
    ("store.data_dir", "Where the store lives. --data-dir or VTAX_DATA_DIR overrides it. Unset: /var/lib/vtax when it exists, else ./vtax-data."),
    ("store.node", "The node's name, one identity everywhere: the store's file names and metadata, the node= partition of a fleet copy, remote write's instance label (unless external_labels sets one), vtax report and vtax query --where node=. 1 to 190 letters, digits, '-', '.' and '_', starting and ending with a letter or digit, so host names and Kubernetes node names fit as they are. --store.node or VTAX_NODE overrides it. Unset: the host name."),
    ("store.sync_interval_secs", "Seconds between fsyncs of the write-ahead log: the most a power cut can lose while the disk takes writes (with the disk full, rows wait in memory, up to wal_max_backlog_bytes, and a stop or a crash then loses them)."),
    ("store.max_buffered_bytes", "Bytes of rows held in memory before they are published early as a part file."),
    ("store.max_publish_delay_secs", "Most seconds a row waits in memory and the write-ahead log before it is in a Parquet file that DuckDB, Polars or Spark read (a part of the running hour; parts merge as the hour goes on and into one when it ends). 0 waits for the hour's end."),
    ("store.wal_max_backlog_bytes", "Bytes of rows held in memory while write-ahead log writes fail (a full disk) before new rows are refused and counted. With max_buffered_bytes and each [[scrape]] target's body_size_limit_bytes + 384 x sample_limit it must fit in 201326592 bytes (192 MiB): the systemd unit's MemoryMax=256M less the rest of the agent."),
    ("store.compact_interval_secs", "Seconds between passes that merge finished hours and days and apply retention."),
    ("store.retention_max_age_days", "Delete days older than this; 0 keeps everything."),
    ("store.retention_max_bytes", "Delete the oldest files while the tables hold more bytes than this; 0 for no bound."),
    ("upload.url", "Where sealed Parquet files go: s3://bucket/prefix, gs://bucket/prefix, az://container/prefix or file:///mounted/path, under <prefix>/tables/<table>/node=<node>/date=YYYY-MM-DD/. Unset: nothing is uploaded. Credentials come from the environment (AWS_*, GOOGLE_*, AZURE_*). Needs a build with the object-storage feature, as the packages are."),
    ("upload.interval_secs", "Seconds between two upload passes."),
    ("upload.delete_local_after_upload", "Whether retention deletes a local file only once its upload is confirmed (else retention ignores uploads)."),
    ("upload.endpoint", "Endpoint of an S3- or Azure-compatible service (MinIO, Ceph, an emulator). Unset: the service's own."),
    ("upload.region", "S3 region. Unset: AWS_REGION, else us-east-1."),
    ("upload.allow_http", "Whether a plain http:// endpoint is allowed (a local S3)."),
    ("enabled", "Whether this collector runs (flags: --collector.<name>, --no-collector.<name>)."),
    ("interval_secs", "Seconds between two reads of this collector's source."),
];

/// The range of every numeric key of the file outside the collectors' and
/// the detector's own tables (each of those declares its keys' ranges beside
/// its `KEY_DOCS`). `interval_secs` is every collector's; `scrape.*` and
/// `remote_write.*` are the keys of each such table. `Config::validate`
/// checks each value against its key's range, at start, on SIGHUP and in
/// `vtax check-config`; the example config states them; a test fails on a
/// numeric key that has none.
const KEY_RANGES: KeyRanges = &[
    ("store.sync_interval_secs", KeyRange::above(0.0, 3600.0)),
    (
        "store.max_buffered_bytes",
        KeyRange::between(65_536.0, 1_073_741_824.0),
    ),
    (
        "store.max_publish_delay_secs",
        KeyRange::between(0.0, 3_600.0),
    ),
    (
        "store.wal_max_backlog_bytes",
        KeyRange::between(1_048_576.0, 134_217_728.0),
    ),
    (
        "store.compact_interval_secs",
        KeyRange::between(1.0, 86_400.0),
    ),
    (
        "store.retention_max_age_days",
        KeyRange::between(0.0, 36_500.0),
    ),
    ("store.retention_max_bytes", KeyRange::between(0.0, 1e18)),
    ("upload.interval_secs", KeyRange::between(1.0, 86_400.0)),
    ("interval_secs", crate::collectors::INTERVAL_SECS_RANGE),
    (
        "remote_write.queue_max_bytes",
        KeyRange::between(
            remote_write::MIN_QUEUE_MAX_BYTES as f64,
            1_099_511_627_776.0,
        ),
    ),
    (
        "remote_write.max_samples_per_send",
        KeyRange::between(1.0, 1_000_000.0),
    ),
    (
        "remote_write.batch_send_deadline_secs",
        KeyRange::above(0.0, 3600.0),
    ),
    (
        "remote_write.min_backoff_secs",
        KeyRange::above(0.0, 3600.0),
    ),
    (
        "remote_write.max_backoff_secs",
        KeyRange::above(0.0, 3600.0),
    ),
    (
        "remote_write.remote_timeout_secs",
        KeyRange::above(0.0, 3600.0),
    ),
];

/// The declared range of a numeric key (`store.max_buffered_bytes`,
/// `collectors.jitter.interval_us`, `remote_write[0].queue_max_bytes`).
pub fn range_of(key: &str) -> Option<KeyRange> {
    // `scrape[1].timeout_secs` is `scrape.timeout_secs`.
    let key: String = {
        let mut plain = String::with_capacity(key.len());
        let mut in_index = false;
        for c in key.chars() {
            match c {
                '[' => in_index = true,
                ']' => in_index = false,
                c if !in_index => plain.push(c),
                _ => {}
            }
        }
        plain
    };
    let find =
        |ranges: KeyRanges, key: &str| ranges.iter().find(|(k, _)| *k == key).map(|(_, r)| *r);
    if let Some(rest) = key.strip_prefix("collectors.") {
        let (_, leaf) = rest.split_once('.')?;
        return crate::collectors::key_range(&key).or_else(|| find(KEY_RANGES, leaf));
    }
    if let Some(leaf) = key.strip_prefix("detect.") {
        return find(crate::detect::KEY_RANGES, leaf);
    }
    if let Some(leaf) = key.strip_prefix("scrape.") {
        return find(crate::collectors::scrape::TARGET_KEY_RANGES, leaf);
    }
    find(KEY_RANGES, &key)
}

/// Checks every numeric value of `config` against its key's declared range;
/// on failure returns the key and a message naming the key, the value and
/// the range. Values are read from the config's serialised form, so that no
/// key can be missed.
/// Every numeric value outside its key's range, as (key, message).
fn range_problems(config: &Config) -> Vec<(String, String)> {
    // A path that is not UTF-8 (a flag or variable of bytes) does not
    // serialise: named, it is refused, where the serialising panicked.
    let paths = [
        ("store.data_dir", config.store.data_dir.as_deref()),
        ("web.config_file", config.web.config_file.as_deref()),
        ("paths.procfs", Some(config.paths.procfs.as_path())),
        ("paths.sysfs", Some(config.paths.sysfs.as_path())),
        ("paths.rootfs", Some(config.paths.rootfs.as_path())),
    ];
    let not_utf8: Vec<(String, String)> = paths
        .into_iter()
        .filter_map(|(key, path)| {
            let path = path.filter(|p| p.to_str().is_none())?;
            Some((
                key.to_string(),
                format!(
                    "{key} = {:?}: not UTF-8 text; give the path in UTF-8",
                    path.to_string_lossy()
                ),
            ))
        })
        .collect();
    if !not_utf8.is_empty() {
        return not_utf8;
    }
    let value = match serde_json::to_value(config) {
        Ok(value) => value,
        Err(e) => {
            return vec![(
                String::new(),
                format!("the configuration does not serialise: {e}"),
            )]
        }
    };
    let mut problems = Vec::new();
    check_value_ranges("", &value, &mut problems);
    problems
}

fn check_value_ranges(key: &str, value: &serde_json::Value, problems: &mut Vec<(String, String)>) {
    use serde_json::Value;
    match value {
        Value::Object(table) => {
            for (k, v) in table {
                check_value_ranges(&join(key, k), v, problems);
            }
        }
        Value::Array(items) if items.iter().all(Value::is_object) => {
            for (i, v) in items.iter().enumerate() {
                check_value_ranges(&format!("{key}[{i}]"), v, problems);
            }
        }
        Value::Array(items) => {
            for v in items {
                check_value_ranges(key, v, problems);
            }
        }
        // A float that is NaN or infinite serialises as null.
        Value::Number(_) | Value::Null => {
            let Some(range) = range_of(key) else {
                return;
            };
            let shown = match value {
                // Display writes 1e300 out in 301 digits: past a short
                // width, the exponent form the file is likely to hold.
                Value::Number(n) if n.is_f64() => n.as_f64().map(|f| {
                    let plain = f.to_string();
                    if plain.len() > 24 {
                        format!("{f:e}")
                    } else {
                        plain
                    }
                }),
                Value::Number(n) => Some(n.to_string()),
                _ => None,
            };
            match (shown, value.as_f64()) {
                (Some(_), Some(v)) if range.contains(v) => {}
                (Some(shown), _) => problems.push((
                    key.to_string(),
                    format!("{key} = {shown}: must be {}", range.describe()),
                )),
                (None, _) => problems.push((
                    key.to_string(),
                    format!("{key} is not a finite number: must be {}", range.describe()),
                )),
            }
        }
        _ => {}
    }
}

/// `doc` with the range of `key`, if it has one, for the example config.
pub fn doc_with_range(doc: &str, key: &str) -> String {
    match range_of(key) {
        Some(range) => format!("{doc} Range: {}.", range.describe()),
        None => doc.to_string(),
    }
}

/// Keys without a default value, shown commented out in the example.
const UNSET_EXAMPLES: &[(&str, &str, &str)] = &[
    ("web", "config_file", "\"/etc/vtax/web-config.yml\""),
    ("store", "data_dir", "\"/var/lib/vtax\""),
    ("store", "node", "\"gpu-node-17\""),
    ("upload", "url", "\"s3://bucket/fleet\""),
    ("upload", "endpoint", "\"http://127.0.0.1:9000\""),
    ("upload", "region", "\"eu-west-1\""),
];

fn key_doc(path: &str) -> Option<&'static str> {
    let leaf = path.rsplit('.').next().unwrap_or(path);
    KEY_DOCS
        .iter()
        .chain(crate::detect::KEY_DOCS)
        .find(|(k, _)| *k == path)
        .or_else(|| {
            // Collector keys: documented by their full path, else by their leaf
            // when every collector shares the key.
            KEY_DOCS.iter().find(|(k, _)| *k == leaf)
        })
        .map(|(_, doc)| *doc)
}

/// Collector keys that document themselves: the collector modules give their
/// own comments through `KEY_DOCS`-like tables.
fn collector_key_doc(path: &str) -> Option<&'static str> {
    key_doc(path).or_else(|| crate::collectors::key_doc(path))
}

/// The first key of `doc` whose place in the config is a table (a section,
/// a collector's settings, a `[[scrape]]` or `[[remote_write]]` entry, its
/// `tls` and `basic_auth`) but that holds something else, with what it holds.
fn not_a_table(doc: &toml::Table) -> Option<(String, &'static str)> {
    fn walk(
        user: &toml::Table,
        shape: &toml::Table,
        prefix: &str,
    ) -> Option<(String, &'static str)> {
        for (key, value) in user {
            let path = format!("{prefix}{key}");
            let Some(toml::Value::Table(sub_shape)) = shape.get(key) else {
                continue;
            };
            match value {
                toml::Value::Table(sub) => {
                    if let Some(found) = walk(sub, sub_shape, &format!("{path}.")) {
                        return Some(found);
                    }
                }
                other => return Some((path, other.type_str())),
            }
        }
        None
    }
    let defaults = toml::Table::try_from(Config::default()).expect("defaults serialise");
    if let Some(found) = walk(doc, &defaults, "") {
        return Some(found);
    }
    for (list, nested) in [
        ("scrape", &[][..]),
        ("remote_write", &["tls", "basic_auth"][..]),
    ] {
        let Some(toml::Value::Array(entries)) = doc.get(list) else {
            continue;
        };
        for (i, entry) in entries.iter().enumerate() {
            let toml::Value::Table(entry) = entry else {
                return Some((format!("{list}[{i}]"), entry.type_str()));
            };
            for key in nested {
                match entry.get(*key) {
                    None | Some(toml::Value::Table(_)) => {}
                    Some(other) => return Some((format!("{list}[{i}].{key}"), other.type_str())),
                }
            }
        }
    }
    None
}

/// A config error: what is wrong, where.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("{path}: {error}")]
    Read {
        /// The file.
        path: String,
        /// Why; in the message, not also as its source, or a chain of
        /// causes says it twice.
        error: std::io::Error,
    },
    /// The file is not valid TOML, or a key is unknown or of the wrong type.
    #[error("{path}: {message}")]
    Parse {
        /// The file.
        path: String,
        /// The parser's message, which names the line, column and key.
        message: String,
    },
    /// A value is out of range.
    #[error("{path}{line}: {message}")]
    Invalid {
        /// The file.
        path: String,
        /// `:<line>` when the key was found in the file.
        line: String,
        /// Which key, and what is wrong.
        message: String,
    },
}

impl Config {
    /// Parses a config file's text; `path` only names the file in errors.
    pub fn parse(text: &str, path: &str) -> Result<Config, ConfigError> {
        // serde reads a struct from an array too, by position
        // (`web = ["127.0.0.1:9"]` set the listen address): a table's place
        // takes a table only.
        if let Ok(doc) = toml::from_str::<toml::Table>(text) {
            if let Some((key, found)) = not_a_table(&doc) {
                return Err(ConfigError::Invalid {
                    path: path.to_string(),
                    line: line_of_key(text, &key)
                        .map(|l| format!(":{l}"))
                        .unwrap_or_default(),
                    message: format!("{key} must be a table, not {found}"),
                });
            }
        }
        let mut config: Config = toml::from_str(text).map_err(|e| ConfigError::Parse {
            path: path.to_string(),
            message: e.to_string().trim_end().to_string(),
        })?;
        // The collector is built from `[collectors]` alone; the targets are
        // top-level tables in the file, so that they read as a list.
        config.collectors.scrape.targets = config.scrape.clone();
        for remote in &mut config.remote_write {
            if remote.name.is_empty() {
                remote.name = RemoteWriteConfig::derived_name(&remote.url);
            }
        }
        // Every problem, not the first: an operator fixes a file once.
        let key_lines = key_lines(text);
        let at = |key: &str| {
            key_lines
                .get(key)
                .map(|l| format!(":{l}"))
                .unwrap_or_default()
        };
        let mut problems = config.problems().into_iter();
        if let Some((key, first)) = problems.next() {
            let mut message = first;
            for (key, more) in problems {
                message.push_str(&format!("\n{path}{}: {more}", at(&key)));
            }
            return Err(ConfigError::Invalid {
                path: path.to_string(),
                line: at(&key),
                message,
            });
        }
        Ok(config)
    }

    /// Reads and parses a config file.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let text =
            vtax_exporters::settings_file::read(path).map_err(|error| ConfigError::Read {
                path: path.display().to_string(),
                error,
            })?;
        Config::parse(&text, &path.display().to_string())
    }

    /// Checks values the types cannot; on failure returns the key and the
    /// message of the first problem.
    pub fn validate(&self) -> Result<(), (String, String)> {
        match self.problems().into_iter().next() {
            Some(problem) => Err(problem),
            None => Ok(()),
        }
    }

    /// Every value the types cannot check that is wrong, as (key, message):
    /// each range, then each section's own rules.
    pub fn problems(&self) -> Vec<(String, String)> {
        let mut problems = range_problems(self);
        let mut check = |result: Result<(), (String, String)>| {
            if let Err(problem) = result {
                problems.push(problem);
            }
        };
        check(
            parse_listen_address(&self.web.listen_address)
                .map(|_| ())
                .map_err(|e| ("web.listen_address".to_string(), e)),
        );
        if self
            .store
            .data_dir
            .as_ref()
            .is_some_and(|d| d.as_os_str().is_empty())
        {
            // An empty path is the working directory: the store would be
            // made wherever the agent happened to start.
            check(Err((
                "store.data_dir".to_string(),
                "store.data_dir is empty: give a directory, or leave the key out for the default"
                    .to_string(),
            )));
        }
        if let Some(node) = &self.store.node {
            check(vtax_store::check_node_name(node).map_err(|e| {
                (
                    "store.node".to_string(),
                    format!("store.node = {node:?}: {e}"),
                )
            }));
        }
        check(self.check_memory_bounds());
        check(self.upload.validate());
        for problem in self.collectors.problems() {
            check(Err(problem));
        }
        check(self.detect.validate());
        let mut remote_names = std::collections::HashSet::new();
        for (i, remote) in self.remote_write.iter().enumerate() {
            check(
                remote
                    .validate()
                    .map_err(|(key, message)| (format!("remote_write[{i}].{key}"), message)),
            );
            check(
                remote_tables_exist(remote)
                    .map_err(|message| (format!("remote_write[{i}].tables"), message)),
            );
            if !remote_names.insert(remote.name.as_str()) {
                check(Err((
                    format!("remote_write[{i}].name"),
                    format!(
                        "remote_write name {:?} is used twice: each remote needs its own queue",
                        remote.name
                    ),
                )));
            }
        }
        // A range problem makes the section's own rule say it again.
        let mut seen = std::collections::HashSet::new();
        problems.retain(|(key, _)| seen.insert(key.clone()));
        problems
    }

    /// The memory bounds together must fit under [`MEMORY_BOUNDS_MAX_BYTES`].
    fn check_memory_bounds(&self) -> Result<(), (String, String)> {
        let scrape_bytes: u64 = self
            .scrape
            .iter()
            .map(|t| {
                t.sample_limit
                    .saturating_mul(SCRAPE_BYTES_PER_SAMPLE)
                    .saturating_add(t.body_size_limit_bytes)
            })
            .fold(0, u64::saturating_add);
        let total_bytes = self
            .store
            .wal_max_backlog_bytes
            .saturating_add(self.store.max_buffered_bytes)
            .saturating_add(scrape_bytes);
        if total_bytes <= MEMORY_BOUNDS_MAX_BYTES {
            return Ok(());
        }
        Err((
            "store.wal_max_backlog_bytes".to_string(),
            format!(
                "store.wal_max_backlog_bytes = {} + store.max_buffered_bytes = {} + the {} [[scrape]] targets' body_size_limit_bytes + {SCRAPE_BYTES_PER_SAMPLE} x sample_limit ({}) = {total_bytes} bytes: \
                 must be at most {MEMORY_BOUNDS_MAX_BYTES} (192 MiB), to stay under the systemd unit's MemoryMax=256M with the rest of the agent; lower one of them",
                self.store.wal_max_backlog_bytes,
                self.store.max_buffered_bytes,
                self.scrape.len(),
                scrape_bytes,
            ),
        ))
    }

    /// The pseudo-filesystem roots.
    pub fn roots(&self) -> Roots {
        Roots {
            procfs: self.paths.procfs.clone(),
            sysfs: self.paths.sysfs.clone(),
            rootfs: self.paths.rootfs.clone(),
        }
    }

    /// The node's name: `store.node`, else the host name. It names the
    /// store's files, the fleet copy's `node=` partition and remote write's
    /// default `instance` label.
    pub fn node_name(&self) -> String {
        self.store
            .node
            .clone()
            .unwrap_or_else(vtax_store::node_name)
    }

    /// The data directory: the configured one, else the default.
    pub fn data_dir(&self) -> PathBuf {
        self.store
            .data_dir
            .clone()
            .unwrap_or_else(crate::default_data_dir)
    }
}

/// Each `[paths]` root must be a directory: a root that is not there (the
/// host's /proc not mounted into the agent's container, a typo) would
/// otherwise start the agent with every collector reading it off, each
/// for a missing file, and nothing saying the path is the cause.
pub fn check_paths(paths: &PathsConfig) -> Result<(), String> {
    for (key, path) in [
        ("paths.procfs", &paths.procfs),
        ("paths.sysfs", &paths.sysfs),
        ("paths.rootfs", &paths.rootfs),
    ] {
        match std::fs::metadata(path) {
            Ok(meta) if meta.is_dir() => {}
            Ok(_) => return Err(format!("{key}: {} is not a directory", path.display())),
            Err(e) => return Err(format!("{key}: {}: {e}", path.display())),
        }
    }
    Ok(())
}

/// Whether `dir` can hold a store: a directory the agent may write, or a
/// path it can create one at (its nearest existing ancestor a writable
/// directory). Says what is wrong otherwise: a file where the directory
/// should be passed `check-config` and then failed `run` with
/// `create <dir>: File exists`.
pub fn check_data_dir(dir: &Path) -> Result<(), String> {
    use nix::unistd::{access, AccessFlags};
    // Why a directory cannot be written: a read-only filesystem is no
    // matter of this user's rights.
    let why_not_writable = |d: &Path| match access(d, AccessFlags::W_OK | AccessFlags::X_OK) {
        Ok(()) => None,
        Err(nix::errno::Errno::EROFS) => Some("is on a read-only filesystem"),
        Err(_) => Some("is not writable by this user"),
    };
    let mut at = dir;
    loop {
        // A link that points nowhere would be followed into NotFound and
        // its parent checked; making the directory then fails on the link.
        if let Ok(link) = std::fs::symlink_metadata(at) {
            if link.file_type().is_symlink() && std::fs::metadata(at).is_err() {
                return Err(format!(
                    "data directory {}: {} is a link to {}, which is not there",
                    dir.display(),
                    at.display(),
                    std::fs::read_link(at)
                        .map(|t| t.display().to_string())
                        .unwrap_or_else(|_| "?".into())
                ));
            }
        }
        match std::fs::metadata(at) {
            Ok(meta) if meta.is_dir() => {
                let Some(why) = why_not_writable(at) else {
                    return Ok(());
                };
                return Err(if at == dir {
                    format!("data directory {}: {why}", dir.display())
                } else {
                    format!(
                        "data directory {}: cannot be made, {} {why}",
                        dir.display(),
                        at.display()
                    )
                });
            }
            Ok(_) => {
                return Err(format!(
                    "data directory {}: {} is a file, not a directory",
                    dir.display(),
                    at.display()
                ))
            }
            // ENOTDIR: an ancestor is a file, which the next step names.
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::NotFound | std::io::ErrorKind::NotADirectory
                ) =>
            {
                at = match at.parent() {
                    Some(p) if !p.as_os_str().is_empty() => p,
                    _ => Path::new("."),
                };
            }
            Err(e) => return Err(format!("data directory {}: {e}", dir.display())),
        }
    }
}

/// Parses `host:port` or `:port` into a socket address (`:port` is every interface).
pub fn parse_listen_address(address: &str) -> Result<std::net::SocketAddr, String> {
    use std::net::ToSocketAddrs;
    let full = if address.starts_with(':') {
        format!("[::]{address}")
    } else {
        address.to_string()
    };
    full.to_socket_addrs()
        .map_err(|e| format!("listen address {address:?}: {e}"))?
        .next()
        .ok_or_else(|| format!("listen address {address:?} resolves to nothing"))
}

/// The 1-based line where `key` (dotted: `collectors.host.interval_secs`) is set.
/// The n-th table of an array of tables is `<array>[<n>]` (`remote_write[0].url`).
fn line_of_key(text: &str, key: &str) -> Option<usize> {
    key_lines(text).get(key).copied()
}

/// The 1-based line where each key of `text` is first set, from the spans
/// the TOML parser gives its keys, in one pass: looked up a problem at a
/// time, a file of many `[[remote_write]]` tables with a problem each was
/// read once per problem; and read line by line, a line inside a
/// multi-line array that looked like a key (`"interval_secs = 5",`) was
/// taken for the key, and a key in an inline table or under a header with a
/// comment had no line. Nothing for a file that does not parse: its parse
/// error has its own.
fn key_lines(text: &str) -> std::collections::HashMap<String, usize> {
    use toml::de::{DeTable, DeValue};
    fn walk(
        table: &DeTable<'_>,
        prefix: &str,
        line_of: &dyn Fn(usize) -> usize,
        lines: &mut std::collections::HashMap<String, usize>,
    ) {
        for (key, value) in table.iter() {
            let name: &str = key.get_ref();
            let path = if prefix.is_empty() {
                name.to_string()
            } else {
                format!("{prefix}.{name}")
            };
            lines
                .entry(path.clone())
                .or_insert_with(|| line_of(key.span().start));
            match value.get_ref() {
                DeValue::Table(inner) => walk(inner, &path, line_of, lines),
                // `[[scrape]]`: the i-th such table is `scrape[i]` in keys.
                DeValue::Array(items) => {
                    for (i, item) in items.iter().enumerate() {
                        if let DeValue::Table(inner) = item.get_ref() {
                            let indexed = format!("{path}[{i}]");
                            lines
                                .entry(indexed.clone())
                                .or_insert_with(|| line_of(item.span().start));
                            walk(inner, &indexed, line_of, lines);
                        }
                    }
                }
                _ => {}
            }
        }
    }
    let mut lines = std::collections::HashMap::new();
    let Ok(document) = DeTable::parse(text) else {
        return lines;
    };
    let newlines: Vec<usize> = text.match_indices('\n').map(|(at, _)| at).collect();
    let line_of = |offset: usize| newlines.partition_point(|&at| at < offset) + 1;
    walk(document.get_ref(), "", &line_of, &mut lines);
    lines
}

/// Renders the example config file: every default, each key with its comment.
pub fn render_example() -> String {
    let table = toml::Table::try_from(Config::default()).expect("defaults serialise");
    let mut out = String::from(
        "# vtax agent configuration: every key is optional and shows its default.\n\
         # Installed as /etc/vtax/vtax.toml; flags override it; SIGHUP reloads it.\n\
         # Edit it as you need: a key left out takes the default shown here, and\n\
         # `vtax check-config` checks the file. `vtax check-config --print-defaults`\n\
         # prints it afresh.\n\
         # Sizes (keys ending in _bytes) take bytes or a unit: \"512MiB\", \"10GB\".\n",
    );
    render_table(&mut out, "", &table);
    out.push_str(&crate::collectors::scrape::example_target(doc_with_range));
    out.push_str(&remote_write_example());
    out
}

/// A remote's `tables` must name tables the agent exports: a misspelt one
/// would send nothing of what was meant, silently.
fn remote_tables_exist(remote: &RemoteWriteConfig) -> Result<(), String> {
    let catalog = crate::catalog();
    let exported: Vec<&str> = catalog
        .tables()
        .iter()
        .filter(|t| t.exported)
        .map(|t| t.name)
        .collect();
    for name in remote.tables.iter().flatten() {
        if !exported.contains(&name.as_str()) {
            let why = if catalog.get(name).is_some() {
                "is stored but not exported"
            } else {
                "is no table"
            };
            return Err(format!(
                "remote_write {}: tables: {name:?} {why}; the exported tables are {}",
                remote.name,
                exported.join(", ")
            ));
        }
    }
    Ok(())
}

/// The commented `[[remote_write]]` example: there is none by default.
fn remote_write_example() -> String {
    format!(
        "\n# Prometheus remote write 1.0: every sample the agent stores is also sent to the\n\
         # receiver of each [[remote_write]] table, through an on-disk queue under\n\
         # <data_dir>/remote_write/<name>/ that outlives receiver outages and agent restarts.\n\
         # None by default; one looks like:\n\
         # [[remote_write]]\n\
         # Names the queue directory and the `remote` label of vtax_remote_write_* metrics.\n\
         # Unset: derived from url (host, port and path, e.g. prometheus-example-9090-api-v1-write).\n\
         # name = \"central\"\n\
         # The receiver's endpoint (Prometheus with --web.enable-remote-write-receiver, Mimir, ...).\n\
         # Reached through the proxy that HTTPS_PROXY or HTTP_PROXY names, unless NO_PROXY lists its host.\n\
         # url = \"https://prometheus.example:9090/api/v1/write\"\n\
         # At most one of basic_auth, bearer_token, bearer_token_file; files are read per request.\n\
         # basic_auth = {{ username = \"vtax\", password_file = \"/etc/vtax/remote-password\" }}\n\
         # bearer_token_file = \"/etc/vtax/remote-token\"\n\
         # Labels on every series sent; instance (the node's name, store.node) and job (vtax) unless set here.\n\
         # external_labels = {{ cluster = \"train-a\", instance = \"gpu-node-17\" }}\n\
         # Only these tables' series are sent (docs/metrics.md); unset: every exported table.\n\
         # tables = [\"gpu\", \"gpu_info\", \"jitter\", \"cpu\"]\n\
         # TLS for https: CAs to trust (unset: the system's), a client certificate if asked for.\n\
         # tls = {{ ca_file = \"/etc/vtax/ca.crt\", cert_file = \"/etc/vtax/client.crt\", key_file = \"/etc/vtax/client.key\", insecure_skip_verify = false }}\n\
         # Bytes the queue may hold; past that its oldest samples are dropped, and counted. {queue_range}\n\
         # queue_max_bytes = {}\n\
         # Most samples in one request. {samples_range}\n\
         # max_samples_per_send = {}\n\
         # Seconds a sample waits for its request to fill before it is sent anyway. {secs_range}\n\
         # batch_send_deadline_secs = {:?}\n\
         # Retries after a 5xx, a 429 or a connection error wait from min to max, doubling,\n\
         # each at a random point of its upper half, so a fleet does not retry in step. {secs_range}\n\
         # min_backoff_secs = {:?}\n\
         # max_backoff_secs = {:?}\n\
         # Seconds a request may take before it is abandoned and retried. {secs_range}\n\
         # remote_timeout_secs = {:?}\n",
        remote_write::DEFAULT_QUEUE_MAX_BYTES,
        remote_write::DEFAULT_MAX_SAMPLES_PER_SEND,
        remote_write::DEFAULT_BATCH_SEND_DEADLINE_SECS,
        remote_write::DEFAULT_MIN_BACKOFF_SECS,
        remote_write::DEFAULT_MAX_BACKOFF_SECS,
        remote_write::DEFAULT_REMOTE_TIMEOUT_SECS,
        queue_range = doc_with_range("", "remote_write.queue_max_bytes").trim(),
        samples_range = doc_with_range("", "remote_write.max_samples_per_send").trim(),
        secs_range = doc_with_range("", "remote_write.remote_timeout_secs").trim(),
    )
}

fn render_table(out: &mut String, prefix: &str, table: &toml::Table) {
    let (leaves, subtables): (Vec<_>, Vec<_>) = table.iter().partition(|(_, v)| !v.is_table());
    if !prefix.is_empty() && (!leaves.is_empty() || subtables.is_empty()) {
        out.push_str(&format!("\n[{prefix}]\n"));
    }
    for (key, value) in &leaves {
        let path = join(prefix, key);
        let doc = collector_key_doc(&path).unwrap_or_else(|| panic!("{path} has no comment"));
        let doc = doc_with_range(doc, &path);
        out.push_str(&format!("# {doc}\n{key} = {value}\n"));
    }
    for (section, key, example) in UNSET_EXAMPLES {
        if *section == prefix {
            let path = join(prefix, key);
            let doc = key_doc(&path).unwrap_or_else(|| panic!("{path} has no comment"));
            out.push_str(&format!("# {doc}\n# {key} = {example}\n"));
        }
    }
    for (key, value) in subtables {
        let toml::Value::Table(sub) = value else {
            continue;
        };
        render_table(out, &join(prefix, key), sub);
    }
}

fn join(prefix: &str, key: &str) -> String {
    if prefix.is_empty() {
        key.to_string()
    } else {
        format!("{prefix}.{key}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_file_is_all_defaults() {
        assert_eq!(Config::parse("", "x.toml").unwrap(), Config::default());
    }

    /// What a start can tell before it makes the store: a file in the way,
    /// and a link to nowhere (made, it would fail with "File exists").
    #[test]
    fn a_data_dir_that_cannot_be_made_says_why() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(check_data_dir(&dir.path().join("new/store")), Ok(()));
        let file = dir.path().join("file");
        std::fs::write(&file, "").unwrap();
        let e = check_data_dir(&file.join("store")).unwrap_err();
        assert!(e.ends_with("is a file, not a directory"), "{e}");
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(dir.path().join("gone"), &link).unwrap();
        let e = check_data_dir(&link).unwrap_err();
        assert!(e.contains("which is not there"), "{e}");
    }

    /// A `[paths]` root that is not there (the host's /proc not mounted
    /// into the container) or is a file is refused with its key.
    #[test]
    fn a_paths_root_that_is_not_a_directory_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(check_paths(&PathsConfig::default()), Ok(()));
        let missing = PathsConfig {
            procfs: dir.path().join("host/proc"),
            ..PathsConfig::default()
        };
        let e = check_paths(&missing).unwrap_err();
        assert!(e.starts_with("paths.procfs: "), "{e}");
        assert!(e.contains("No such file"), "{e}");
        let file = dir.path().join("sys");
        std::fs::write(&file, "").unwrap();
        let e = check_paths(&PathsConfig {
            sysfs: file,
            ..PathsConfig::default()
        })
        .unwrap_err();
        assert!(
            e.starts_with("paths.sysfs: ") && e.ends_with("is not a directory"),
            "{e}"
        );
    }

    /// Problems of several collectors are all named, each with its line.
    #[test]
    fn every_collectors_problem_is_named_at_once() {
        let err = Config::parse(
            "[collectors.block]\ninterval_secs = 0\n[collectors.netdev]\ninterface_exclude = \"(\"\n",
            "v.toml",
        )
        .unwrap_err()
        .to_string();
        assert!(
            err.starts_with("v.toml:2: collectors.block.interval_secs"),
            "{err}"
        );
        assert!(
            err.contains("\nv.toml:4: collectors.netdev.interface_exclude"),
            "{err}"
        );
    }

    /// serde would read a struct from an array, by position: a table's
    /// place takes a table only.
    #[test]
    fn an_array_where_a_table_goes_is_refused() {
        for (text, key) in [
            (
                "web = [\"127.0.0.1:9\"]\n",
                "web must be a table, not array",
            ),
            ("store = []\n", "store must be a table, not array"),
            (
                "collectors = { gpu = [false, 0.5] }\n",
                "collectors.gpu must be a table, not array",
            ),
            (
                "scrape = [[\"a\", \"http://x/\"]]\n",
                "scrape[0] must be a table",
            ),
            (
                "[[remote_write]]\nurl = \"https://x/w\"\ntls = [true]\n",
                "remote_write[0].tls must be a table",
            ),
        ] {
            let err = Config::parse(text, "v.toml").unwrap_err().to_string();
            assert!(err.contains(key), "{text}: {err}");
        }
        assert!(Config::parse("[web]\n[collectors.gpu]\nenabled = false\n", "v.toml").is_ok());
    }

    /// An empty data directory is the working directory: refused, named.
    #[test]
    fn an_empty_data_dir_is_refused() {
        let err = Config::parse("[store]\ndata_dir = \"\"\n", "v.toml")
            .unwrap_err()
            .to_string();
        assert!(
            err.starts_with("v.toml:2: store.data_dir is empty"),
            "{err}"
        );
    }

    #[test]
    fn unknown_key_names_the_key_and_line() {
        let err = Config::parse(
            "[web]\nlisten_address = \":1\"\nlisten_adress = \":2\"\n",
            "v.toml",
        )
        .unwrap_err()
        .to_string();
        assert!(err.starts_with("v.toml: "), "{err}");
        assert!(err.contains("line 3"), "{err}");
        assert!(err.contains("listen_adress"), "{err}");
        let err = Config::parse("[collectors.host]\nintervall_secs = 2\n", "v.toml")
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("line 2") && err.contains("intervall_secs"),
            "{err}"
        );
    }

    #[test]
    fn wrong_type_names_the_key_and_line() {
        let err = Config::parse("\n[collectors.host]\nenabled = \"yes\"\n", "v.toml")
            .unwrap_err()
            .to_string();
        assert!(err.contains("line 3"), "{err}");
    }

    /// The store's WAL backlog bound (256 MiB) was the whole of the unit's
    /// MemoryMax=256M; with the scrape bodies the bounds must fit under it.
    #[test]
    fn memory_bounds_together_fit_the_unit() {
        use crate::collectors::scrape::{DEFAULT_BODY_SIZE_LIMIT_BYTES, DEFAULT_SAMPLE_LIMIT};
        let defaults = Config::default();
        let target_bytes =
            DEFAULT_BODY_SIZE_LIMIT_BYTES + SCRAPE_BYTES_PER_SAMPLE * DEFAULT_SAMPLE_LIMIT;
        // Defaults leave room for six targets.
        assert!(
            defaults.store.wal_max_backlog_bytes
                + defaults.store.max_buffered_bytes
                + 6 * target_bytes
                <= MEMORY_BOUNDS_MAX_BYTES
        );
        let targets = |n: usize| -> String {
            (0..n)
                .map(|i| format!("[[scrape]]\nname = \"t{i}\"\nurl = \"http://127.0.0.1:1/\"\n"))
                .collect()
        };
        let file = |n| format!("[store]\nwal_max_backlog_bytes = 134217728\n{}", targets(n));
        // 128 + 2 MiB and two default targets fit; a third does not.
        Config::parse(&file(2), "v.toml").unwrap();
        let err = Config::parse(&file(3), "v.toml").unwrap_err().to_string();
        assert!(
            err.starts_with("v.toml:2: store.wal_max_backlog_bytes = 134217728 + store.max_buffered_bytes = 2097152 + the 3 [[scrape]] targets' body_size_limit_bytes + 384 x sample_limit (82765824) = 219080704 bytes: must be at most 201326592"),
            "{err}"
        );
        // Lowering a target's bounds is another way to fit.
        let smaller = format!(
            "{}sample_limit = 1000\nbody_size_limit_bytes = 1048576\n",
            file(3)
        );
        Config::parse(&smaller, "v.toml").unwrap();
        let err = Config::parse("[store]\nwal_max_backlog_bytes = 268435456\n", "v.toml")
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("must be between 1048576 and 134217728"),
            "{err}"
        );
    }

    #[test]
    fn out_of_range_values_name_the_key_and_line() {
        let err = Config::parse("[collectors.cgroups]\n\ninterval_secs = 0\n", "v.toml")
            .unwrap_err()
            .to_string();
        assert_eq!(
            err,
            "v.toml:3: collectors.cgroups.interval_secs = 0: must be between 0.01 and 86400"
        );
        let err = Config::parse("[web]\nlisten_address = \"nonsense\"\n", "v.toml")
            .unwrap_err()
            .to_string();
        assert!(
            err.starts_with("v.toml:2: listen address \"nonsense\""),
            "{err}"
        );
    }

    /// The line named is the key's own, however the file sets it: a line
    /// inside a multi-line array that reads like a key is no key; a key in
    /// an inline table, under a header with a comment, or dotted has its line.
    #[test]
    fn a_problem_names_the_line_of_its_key_however_it_is_written() {
        let line = |text: &str| {
            let err = Config::parse(text, "v.toml").unwrap_err().to_string();
            err.split(':').nth(1).unwrap_or_default().to_string()
        };
        let in_array = "[collectors.cgroups]\nexclude = [\n  \"interval_secs = 5\",\n]\n\
                        interval_secs = 0\n";
        assert_eq!(line(in_array), "5");
        let inline = "[collectors]\n\ncgroups = { enabled = true,\n  interval_secs = 0 }\n";
        assert_eq!(line(inline), "4");
        let commented = "[collectors.cgroups] # the jobs\n\ninterval_secs = 0\n";
        assert_eq!(line(commented), "3");
        let dotted = "[collectors]\nhost.enabled = true\ncgroups.interval_secs = 0\n";
        assert_eq!(line(dotted), "3");
    }

    #[test]
    fn listen_addresses() {
        assert_eq!(parse_listen_address(":9433").unwrap().port(), 9433);
        assert!(parse_listen_address(":9433").unwrap().ip().is_unspecified());
        assert_eq!(
            parse_listen_address("127.0.0.1:80").unwrap().to_string(),
            "127.0.0.1:80"
        );
    }

    /// The shipped example is exactly what the defaults render to, and parses back to them.
    #[test]
    fn example_file_matches_defaults() {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../packaging/vtax.example.toml"
        );
        let rendered = render_example();
        if std::env::var_os("VTAX_UPDATE_GOLDEN").is_some() {
            std::fs::write(path, &rendered).unwrap();
        }
        assert_eq!(
            Config::parse(&rendered, "example").unwrap(),
            Config::default()
        );
        let on_disk = std::fs::read_to_string(path).unwrap_or_default();
        assert!(
            on_disk == rendered,
            "packaging/vtax.example.toml is stale: run `VTAX_UPDATE_GOLDEN=1 cargo test -p vtax example_file`"
        );
    }

    #[test]
    fn scrape_targets_parse_with_defaults_and_errors_name_the_line() {
        let config = Config::parse(
            "[[scrape]]\nname = \"a\"\nurl = \"http://127.0.0.1:9/metrics\"\n\
             [[scrape]]\nname = \"b\"\nurl = \"http://127.0.0.1:8/m\"\nhistograms = [\"h_seconds\"]\n",
            "v.toml",
        )
        .unwrap();
        assert_eq!(config.scrape.len(), 2);
        assert_eq!(config.collectors.scrape.targets, config.scrape);
        let b = &config.scrape[1];
        assert_eq!(
            b.interval_secs,
            crate::collectors::scrape::DEFAULT_SCRAPE_INTERVAL_SECS
        );
        assert_eq!(
            b.timeout_secs,
            crate::collectors::scrape::DEFAULT_SCRAPE_TIMEOUT_SECS
        );
        assert_eq!(
            b.window_secs,
            crate::collectors::scrape::DEFAULT_SCRAPE_WINDOW_SECS
        );
        let err = Config::parse(
            "[[scrape]]\nname = \"a\"\nurl = \"http://x/\"\n\n[[scrape]]\nname = \"b\"\nurl = \"https://x/\"\n",
            "v.toml",
        )
        .unwrap_err()
        .to_string();
        assert!(
            err.starts_with("v.toml:7: [[scrape]] \"b\": url = "),
            "{err}"
        );
        let err = Config::parse(
            "[[scrape]]\nname = \"a\"\nurl = \"http://x/\"\ntimeout = 3\n",
            "v.toml",
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("line 4") && err.contains("timeout"), "{err}");
        let err = Config::parse("[[scrape]]\nname = \"a\"\n", "v.toml")
            .unwrap_err()
            .to_string();
        assert!(err.contains("url"), "{err}");
    }

    /// The example's commented [[scrape]] table, uncommented, is a valid target.
    #[test]
    fn scrape_example_parses() {
        let example = crate::collectors::scrape::example_target(doc_with_range);
        let uncommented: String = example
            .lines()
            .filter(|l| l.starts_with("# [[") || l.contains(" = "))
            .map(|l| format!("{}\n", l.trim_start_matches("# ")))
            .collect();
        let config = Config::parse(&uncommented, "example").unwrap();
        assert_eq!(config.scrape.len(), 1, "{uncommented}");
    }

    /// The commented remote write example parses, once uncommented (but for
    /// the lines that exclude each other), to the documented defaults.
    #[test]
    fn remote_write_example_parses_to_the_defaults() {
        let dir = tempfile::tempdir().unwrap();
        let ca = dir.path().join("ca.crt");
        let cert = rcgen::generate_simple_self_signed(vec!["localhost".into()]).unwrap();
        std::fs::write(&ca, cert.cert.pem()).unwrap();
        let uncommented: String = remote_write_example()
            .lines()
            .filter(|l| !l.starts_with("# bearer_token_file") && !l.starts_with("# tls"))
            .map(|l| match l.strip_prefix("# ") {
                Some(rest) if rest.starts_with('[') || rest.contains(" = ") => format!("{rest}\n"),
                _ => format!("{l}\n"),
            })
            .collect();
        let config = Config::parse(&uncommented, "example").unwrap();
        let remote = &config.remote_write[0];
        let mut expected =
            RemoteWriteConfig::new("central", "https://prometheus.example:9090/api/v1/write");
        expected.basic_auth = remote.basic_auth.clone();
        expected.external_labels = remote.external_labels.clone();
        expected.tables = remote.tables.clone();
        assert_eq!(remote.external_labels["cluster"], "train-a");
        assert!(remote.sends("jitter") && !remote.sends("netdev"));
        assert_eq!(remote, &expected);
        assert_eq!(remote.basic_auth.as_ref().unwrap().username, "vtax");
        let with_tls = format!(
            "[[remote_write]]\nname = \"a\"\nurl = \"https://localhost/w\"\ntls = {{ ca_file = {ca:?} }}\n"
        );
        assert_eq!(
            Config::parse(&with_tls, "v.toml").unwrap().remote_write[0]
                .tls
                .as_ref()
                .unwrap()
                .ca_file
                .as_deref(),
            Some(ca.as_path())
        );
    }

    /// `tables` sends some tables only: each must be one the agent exports,
    /// and an empty list, which would send nothing, is refused.
    #[test]
    fn a_remote_sends_the_tables_it_names_and_no_misspelt_one() {
        let remote = |tables: &str| {
            Config::parse(
                &format!("[[remote_write]]\nurl = \"http://p/w\"\ntables = {tables}\n"),
                "v.toml",
            )
        };
        let config = remote(r#"["gpu", "jitter", "cpu"]"#).unwrap();
        let sent = &config.remote_write[0];
        assert!(sent.sends("jitter") && !sent.sends("memory"));
        let err = remote(r#"["gpu", "jiter"]"#).unwrap_err().to_string();
        assert!(
            err.contains("v.toml:3:")
                && err.contains(r#"tables: "jiter" is no table"#)
                && err.contains("the exported tables are "),
            "{err}"
        );
        // jitter_gap is stored, one row per gap, but not exported.
        let err = remote(r#"["jitter_gap"]"#).unwrap_err().to_string();
        assert!(err.contains("is stored but not exported"), "{err}");
        let err = remote("[]").unwrap_err().to_string();
        assert!(err.contains("leave it unset to send every table"), "{err}");
    }

    /// A `[[remote_write]]` table needs only its url: the name, which names
    /// the queue directory, comes from it, the same at every start.
    #[test]
    fn a_remote_write_without_a_name_is_named_after_its_url() {
        let config = Config::parse(
            "[[remote_write]]\nurl = \"http://prometheus:9090/api/v1/write\"\n\n\
             [[remote_write]]\nurl = \"https://user:pw@mimir.example/api/v1/push?tenant=a\"\n",
            "v.toml",
        )
        .unwrap();
        let names: Vec<&str> = config
            .remote_write
            .iter()
            .map(|r| r.name.as_str())
            .collect();
        assert_eq!(
            names,
            ["prometheus-9090-api-v1-write", "mimir-example-api-v1-push"]
        );
        // The same url twice is the same queue: refused, as for a name given twice.
        let err = Config::parse(
            "[[remote_write]]\nurl = \"http://p/w\"\n\n[[remote_write]]\nurl = \"http://p/w\"\n",
            "v.toml",
        )
        .unwrap_err()
        .to_string();
        assert!(
            err.contains("remote_write name \"p-w\" is used twice"),
            "{err}"
        );
    }

    #[test]
    fn remote_write_errors_name_the_key_and_line() {
        let two = "[[remote_write]]\nname = \"a\"\nurl = \"http://x/w\"\n\n[[remote_write]]\nname = \"b\"\nurl = \"http://x/w\"\nmax_samples_per_send = 0\n";
        let err = Config::parse(two, "v.toml").unwrap_err().to_string();
        assert_eq!(
            err,
            "v.toml:8: remote_write[1].max_samples_per_send = 0: must be between 1 and 1000000"
        );
        let same = two
            .replace("\"b\"", "\"a\"")
            .replace("max_samples_per_send = 0\n", "");
        let err = Config::parse(&same, "v.toml").unwrap_err().to_string();
        assert!(
            err.starts_with("v.toml:6: remote_write name \"a\" is used twice"),
            "{err}"
        );
        let err = Config::parse(
            "[[remote_write]]\nname = \"a\"\nurl = \"ftp://x/w\"\n",
            "v.toml",
        )
        .unwrap_err()
        .to_string();
        assert!(
            err.starts_with("v.toml:3: remote_write a: url") && err.contains("http or https"),
            "{err}"
        );
        let err = Config::parse(
            "[[remote_write]]\nname = \"a\"\nurl = \"http://x/w\"\nqueue_max_byte = 5\n",
            "v.toml",
        )
        .unwrap_err()
        .to_string();
        assert!(
            err.contains("line 4") && err.contains("queue_max_byte"),
            "{err}"
        );
        let err = Config::parse(
            "[[remote_write]]\nname = \"a\"\nurl = \"http://x/w\"\nbearer_token = \"t\"\nbasic_auth = { username = \"u\", password = \"p\" }\n",
            "v.toml",
        )
        .unwrap_err()
        .to_string();
        assert!(
            err.starts_with("v.toml:4: remote_write a: set one of"),
            "{err}"
        );
        let err = Config::parse("[[remote_write]]\nname = \"a\"\n", "v.toml")
            .unwrap_err()
            .to_string();
        assert!(err.contains("url"), "{err}");
        // Settings that would be silently unused or fail at every send.
        for (table, key) in [
            ("bearer_token = \"\"", "bearer_token is empty"),
            (
                "basic_auth = { username = \"\", password = \"p\" }",
                "basic_auth is empty",
            ),
            (
                "tls = { insecure_skip_verify = true }",
                "on an http:// url is never used",
            ),
            (&format!("name = \"{}\"", "n".repeat(300)), "at most 64"),
        ] {
            let err = Config::parse(
                &format!("[[remote_write]]\nurl = \"http://x/w\"\n{table}\n"),
                "v.toml",
            )
            .unwrap_err()
            .to_string();
            assert!(err.contains(key), "{table}: {err}");
        }
        let err = Config::parse(
            "[[scrape]]\nname = \"app\"\nurl = \"http://:80/metrics\"\n",
            "v.toml",
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("no host"), "{err}");
    }

    /// Every numeric key of the file, [[scrape]] and [[remote_write]]
    /// tables included, as `(table, key)`, from the serialised defaults.
    fn numeric_keys() -> Vec<(String, String)> {
        let mut config = Config::parse(
            "[[scrape]]\nname = \"a\"\nurl = \"http://127.0.0.1:9/m\"\n",
            "x",
        )
        .unwrap();
        config.remote_write = vec![RemoteWriteConfig::new("a", "http://127.0.0.1:9/w")];
        config.collectors.jitter.cpus = vec![0];
        fn walk(table: &str, value: &serde_json::Value, out: &mut Vec<(String, String)>) {
            let serde_json::Value::Object(map) = value else {
                return;
            };
            for (k, v) in map {
                match v {
                    serde_json::Value::Object(_) => walk(&join(table, k), v, out),
                    serde_json::Value::Array(items) if items.iter().all(|i| i.is_object()) => {
                        for item in items {
                            walk(&format!("[[{}]]", join(table, k)), item, out);
                        }
                    }
                    serde_json::Value::Number(_) => out.push((table.to_string(), k.clone())),
                    serde_json::Value::Array(items) if items.iter().all(|i| i.is_number()) => {
                        out.push((table.to_string(), k.clone()))
                    }
                    _ => {}
                }
            }
        }
        let mut keys = Vec::new();
        walk("", &serde_json::to_value(&config).unwrap(), &mut keys);
        keys
    }

    /// The dotted key `range_of` takes for a key of `numeric_keys`.
    fn dotted(table: &str, key: &str) -> String {
        join(table.trim_start_matches('[').trim_end_matches(']'), key)
    }

    /// A numeric key without a declared range would take any value: each has
    /// one, the default is inside it, and the example config states it.
    #[test]
    fn every_numeric_key_has_a_range_holding_its_default() {
        let keys = numeric_keys();
        assert!(keys.len() > 40, "{keys:?}");
        let example = render_example();
        for (table, key) in &keys {
            let path = dotted(table, key);
            let range = range_of(&path).unwrap_or_else(|| panic!("{path} has no range"));
            assert!(
                example.contains(&format!("Range: {}.", range.describe())),
                "{path}: its range is not in the example"
            );
        }
        Config::default().validate().unwrap();
    }

    /// The findings that passed check-config and crashed `vtax run`.
    #[test]
    fn values_past_a_range_name_the_key_the_value_and_the_range() {
        let err = Config::parse(
            "[store]\ncompact_interval_secs = 18446744073709551615\n",
            "v.toml",
        )
        .unwrap_err()
        .to_string();
        assert_eq!(
            err,
            "v.toml:2: store.compact_interval_secs = 18446744073709551615: must be between 1 and 86400"
        );
        let err = Config::parse("[store]\nmax_buffered_bytes = 0\n", "v.toml")
            .unwrap_err()
            .to_string();
        assert_eq!(
            err,
            "v.toml:2: store.max_buffered_bytes = 0: must be between 65536 and 1073741824"
        );
        for (written, shown) in [
            ("1e300", "1e300"),
            ("-1e-300", "-1e-300"),
            ("0.001", "0.001"),
        ] {
            let err = Config::parse(
                &format!("[collectors.host]\ninterval_secs = {written}\n"),
                "v.toml",
            )
            .unwrap_err()
            .to_string();
            assert_eq!(
                err,
                format!("v.toml:2: collectors.host.interval_secs = {shown}: must be between 0.01 and 86400")
            );
        }
        let err = Config::parse("[detect]\nz_open = nan\n", "v.toml")
            .unwrap_err()
            .to_string();
        assert_eq!(
            err,
            "v.toml:2: detect.z_open is not a finite number: must be above 0 and at most 1000"
        );
        let err = Config::parse("[collectors.jitter]\ncpus = [1, 5000]\n", "v.toml")
            .unwrap_err()
            .to_string();
        assert_eq!(
            err,
            "v.toml:2: collectors.jitter.cpus = 5000: must be between 0 and 1023"
        );
    }

    /// Random configs, keys from the real key set with extreme and random
    /// values: parsing never panics, a refusal names the file and a key, and
    /// every value of an accepted config is inside its key's range, so that
    /// the Duration arithmetic at start cannot overflow.
    #[test]
    fn random_configs_are_refused_with_a_key_or_accepted_in_range() {
        use rand::rngs::StdRng;
        use rand::{RngExt, SeedableRng};
        let keys = numeric_keys();
        let mut rng = StdRng::seed_from_u64(0x7a7);
        let extremes = [
            "0",
            "1",
            "-1",
            "2",
            "18446744073709551615",
            "9223372036854775807",
            "-9223372036854775808",
            "1e308",
            "-1e308",
            "inf",
            "-inf",
            "nan",
            "0.000001",
            "0.5",
            "\"x\"",
            "[]",
            "true",
            "[1, 2]",
            "1e-320",
        ];
        let mut accepted = 0;
        let started = std::time::Instant::now();
        for _ in 0..3000 {
            let mut tables: std::collections::BTreeMap<String, Vec<String>> = Default::default();
            for _ in 0..rng.random_range(1..4) {
                let (table, key) = &keys[rng.random_range(0..keys.len())];
                let value = match rng.random_range(0..4) {
                    0 => rng.random_range(0..100_000u64).to_string(),
                    1 => format!("{:?}", rng.random_range(0.0..100_000.0f64)),
                    _ => extremes[rng.random_range(0..extremes.len())].to_string(),
                };
                let value = if key == "cpus" && !value.starts_with('[') {
                    format!("[{value}]")
                } else {
                    value
                };
                tables
                    .entry(table.clone())
                    .or_default()
                    .push(format!("{key} = {value}"));
            }
            let mut text = String::new();
            for (table, lines) in &tables {
                if table.starts_with("[[") {
                    text.push_str(&format!("{table}\n"));
                } else {
                    text.push_str(&format!("[{table}]\n"));
                }
                match table.as_str() {
                    "[[scrape]]" => text.push_str("name = \"a\"\nurl = \"http://127.0.0.1:9/m\"\n"),
                    "[[remote_write]]" => {
                        text.push_str("name = \"a\"\nurl = \"http://127.0.0.1:9/w\"\n")
                    }
                    _ => {}
                }
                // A key set twice is a TOML error; keep the first.
                let mut seen = std::collections::HashSet::new();
                for line in lines {
                    if seen.insert(line.split(' ').next().unwrap().to_string()) {
                        text.push_str(line);
                        text.push('\n');
                    }
                }
            }
            match Config::parse(&text, "fuzz.toml") {
                Ok(config) => {
                    accepted += 1;
                    assert!(range_problems(&config).is_empty());
                }
                Err(e) => {
                    let e = e.to_string();
                    assert!(e.starts_with("fuzz.toml"), "{e}\n{text}");
                    assert!(
                        tables
                            .values()
                            .flatten()
                            .any(|line| e.contains(line.split(' ').next().unwrap()))
                            || e.contains("listen address"),
                        "{e}\n{text}"
                    );
                }
            }
        }
        assert!(accepted > 100, "{accepted} accepted");
        // Each check is a parse and range checks: a hang, not a slow machine.
        assert!(started.elapsed() < std::time::Duration::from_secs(120));
    }

    /// Every size key takes a unit, a range still applies to the bytes it
    /// means, and a string that is no size names the key and its line.
    #[test]
    fn sizes_take_units_in_every_size_key() {
        let config = Config::parse(
            "[store]\nmax_buffered_bytes = \"4MiB\"\nwal_max_backlog_bytes = \"64 MB\"\n\
             retention_max_bytes = \"1.5TB\"\n\
             [[scrape]]\nname = \"a\"\nurl = \"http://127.0.0.1:9/m\"\nbody_size_limit_bytes = \"1MiB\"\n\
             label_value_length_limit_bytes = \"4KiB\"\n\
             [[remote_write]]\nurl = \"http://127.0.0.1:9/w\"\nqueue_max_bytes = \"1GiB\"\n",
            "v.toml",
        )
        .unwrap();
        assert_eq!(config.store.max_buffered_bytes, 4 << 20);
        assert_eq!(config.store.wal_max_backlog_bytes, 64_000_000);
        assert_eq!(config.store.retention_max_bytes, 1_500_000_000_000);
        assert_eq!(config.scrape[0].body_size_limit_bytes, 1 << 20);
        assert_eq!(config.scrape[0].label_value_length_limit_bytes, 4096);
        assert_eq!(config.remote_write[0].queue_max_bytes, 1 << 30);

        let err = Config::parse("[store]\nmax_buffered_bytes = \"32KiB\"\n", "v.toml")
            .unwrap_err()
            .to_string();
        assert!(
            err.starts_with("v.toml:2: store.max_buffered_bytes") && err.contains("32768"),
            "{err}"
        );
        let err = Config::parse("[store]\n\nmax_buffered_bytes = \"2 MiBs\"\n", "v.toml")
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("line 3")
                && err.contains("is not a size")
                && err.contains("max_buffered_bytes"),
            "{err}"
        );
    }

    /// Uncommenting the unset examples gives a valid file too.
    #[test]
    fn unset_examples_parse() {
        let uncommented = render_example()
            .replace("\n# config_file", "\nconfig_file")
            .replace("\n# data_dir", "\ndata_dir");
        let config = Config::parse(&uncommented, "example").unwrap();
        assert_eq!(
            config.store.data_dir.as_deref(),
            Some(Path::new("/var/lib/vtax"))
        );
    }
}
