//! `vtax report`: one self-contained HTML file (inline CSS, SVG and a few lines
//! of script, nothing fetched) for a time range of a node's store or of a fleet
//! copy (`tables/<table>/node=<node>/date=.../`): first the verdict, the
//! measured tax and its top causes; then each GPU's health, the faults of
//! the node and the noisy-neighbour events, the platform's evidence, GPU
//! utilisation, HBM and NVLink against their peaks, jitter distributions and
//! quantiles over time, steal and pressure.

mod findings;
mod headline;
mod health;
mod lines;
mod sections;
pub(crate) mod shape;
mod svg;

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use indicatif::{ProgressBar, ProgressStyle};
use vtax_store::scan::{fleet_nodes, scan_dir, scan_fleet_node};
use vtax_store::{Catalog, ScanRequest};

use crate::timespec::{now_us, parse_time};
use headline::{CauseKind, Taker, TAX_FIELDS};
use health::GpuHealth;
use lines::{error_lines, gpu_lines, node_lines};
use shape::{Reduce, Rows};
use svg::{escape, format_time, format_value, Line, Reference, Unit};

/// Points per line at most: a chart 860 units wide shows no more.
pub const DEFAULT_MAX_POINTS: usize = 400;

/// The detector's table, read when this build knows it.
const EVENTS_TABLE: &str = "neighbor_events";

/// Arguments of `vtax report`.
#[derive(clap::Args)]
pub struct ReportArgs {
    /// A node's data directory, or the root of a fleet copy (with `node=` partitions).
    #[arg(long, env = "VTAX_DATA_DIR")]
    data_dir: Option<PathBuf>,
    /// Earliest time, inclusive: `1h` (ago), RFC 3339, a date, or Unix seconds.
    #[arg(long, allow_hyphen_values = true)]
    since: Option<String>,
    /// Latest time, exclusive, in the same forms.
    #[arg(long, allow_hyphen_values = true)]
    until: Option<String>,
    /// The HTML file to write; `-` writes the page to stdout.
    #[arg(long, short)]
    output: PathBuf,
    /// Points per plotted line at most; longer ranges are averaged (maxima for latency).
    #[arg(long, default_value_t = DEFAULT_MAX_POINTS)]
    max_points: usize,
    /// Leave out a damaged file (its footer, its pages' CRC-32 or a page
    /// fails), naming it at the top of the page and on stderr, instead of
    /// writing no report.
    #[arg(long)]
    skip_damaged: bool,
}

/// What the report reads: one node's store, or a fleet copy of many.
enum Source {
    Node { dir: PathBuf, name: String },
    Fleet { root: PathBuf, nodes: Vec<String> },
}

impl Source {
    fn open(dir: &Path) -> Result<Source> {
        // A young agent's rows are all in its WAL: a store is either.
        crate::check_store_dir(dir)?;
        let nodes = fleet_nodes(dir).with_context(|| format!("list {}", dir.display()))?;
        Ok(if nodes.is_empty() {
            Source::Node {
                dir: dir.to_owned(),
                name: node_of_store(dir),
            }
        } else {
            Source::Fleet {
                root: dir.to_owned(),
                nodes,
            }
        })
    }

    fn nodes(&self) -> Vec<String> {
        match self {
            Source::Node { name, .. } => vec![name.clone()],
            Source::Fleet { nodes, .. } => nodes.clone(),
        }
    }

    /// A table's rows of `node`, and the files left out as damaged (with
    /// [`ScanRequest::skip_damaged`]).
    fn scan(
        &self,
        node: &str,
        catalog: &Catalog,
        request: &ScanRequest,
    ) -> Result<(Rows, Vec<(PathBuf, String)>)> {
        let reading = || format!("read table {} of node {node}", request.table);
        let result = match self {
            Source::Node { dir, .. } => scan_dir(dir, catalog, request),
            Source::Fleet { root, .. } => scan_fleet_node(root, node, catalog, request),
        };
        let result = match result {
            Ok(result) => result,
            Err(e) if e.damaged_file().is_some() => bail!(
                "{}: {e}\nThe file is damaged: --skip-damaged writes the report without it, \
                 naming it on the page; `vtax verify --quarantine`, with the agent stopped, \
                 finds every damaged file of a node's store and moves it aside.",
                reading()
            ),
            Err(e) => return Err(anyhow::Error::new(e).context(reading())),
        };
        Ok((Rows::from_batches(&result.batches), result.damaged_files))
    }
}

/// The node a store belongs to, from its newest file's name, else the
/// directory's name.
fn node_of_store(dir: &Path) -> String {
    vtax_store::files::node_of_store(dir)
        .ok()
        .flatten()
        .unwrap_or_else(|| {
            dir.file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_else(|| "node".into())
        })
}

/// Tables and the fields the report reads (`None`: all of them).
const READS: &[(&str, Option<&[&str]>)] = &[
    ("platform_host", Some(&["info"])),
    ("platform", Some(&["info"])),
    ("gpu_info", Some(&["info"])),
    (
        "gpu",
        Some(&[
            "utilization_ratio",
            "hbm_bytes_per_second",
            "hbm_peak_bytes_per_second",
            "nvlink_total_rx_bytes_per_second",
            "nvlink_total_tx_bytes_per_second",
            "nvlink_links_up",
            "nvlink_links_product",
            "nvlink_peak_bytes_per_second",
            "sm_clock_hertz",
            "sm_clock_max_hertz",
            "clock_event_reasons",
            "temperature_celsius",
            "ecc_corrected_errors",
            "ecc_uncorrected_errors",
            "remapping_pending",
            "remapping_failed",
            "pcie_link_gen",
            "pcie_link_gen_max",
            "pcie_link_width",
            "pcie_link_width_max",
            "pcie_replays",
        ]),
    ),
    ("gpu_health", Some(&["up", "last_xid"])),
    ("gpu_event", Some(&["code"])),
    ("tax", None),
    (
        "jitter",
        Some(&[
            "wakeup_p50_seconds",
            "wakeup_p90_seconds",
            "wakeup_p99_seconds",
            "wakeup_p999_seconds",
            "wakeup_max_seconds",
            "run_delay_ratio",
            "irq_ratio",
            "steal_ratio",
            "unexplained_ratio",
        ]),
    ),
    ("jitter_wakeup", Some(&["latency_seconds"])),
    ("cpu", Some(&["steal_seconds"])),
    ("pressure", Some(&["some_avg10_ratio"])),
    (EVENTS_TABLE, None),
];

/// Tables whose rows are stamped with the end of the window they sum up
/// (the detector's and the jitter probe's): a row is of the range when its
/// window is, so they are read over (since, until], not [since, until), which
/// took the window before the range and left out its last.
const WINDOW_END_TABLES: &[&str] = &["tax", "jitter", "jitter_wakeup", "platform", EVENTS_TABLE];

/// How far before the range the wake-up histogram's counters are read: the
/// last row at or before its start is what the range's counts grow from.
const WAKEUP_BASELINE_LOOKBACK_US: i64 = 600 * 1_000_000;

/// How far before the range events are read: an event open at its start
/// has its rows there (open, new suspects), as far back as the agent
/// resumes open events after a restart.
const EVENTS_LOOKBACK_US: i64 = 24 * 3600 * 1_000_000;

/// One node's rows over the range, by table.
struct NodeData {
    name: String,
    /// The range's start, when it has one: `jitter_wakeup` and the events
    /// table hold rows from before it (see [`load`]).
    from_us: Option<i64>,
    tables: BTreeMap<&'static str, Rows>,
    /// Files of this node left out as damaged, with what was wrong.
    damaged_files: Vec<(PathBuf, String)>,
}

impl NodeData {
    /// The time of the node's last row of any table: as far as what the
    /// store knows of it goes.
    fn last_row_us(&self) -> Option<i64> {
        self.tables
            .values()
            .filter_map(|rows| rows.time_us.iter().copied().max())
            .max()
    }

    /// How far what the store says of the node goes within a range ending
    /// at `until`: its last row, or `until` when it has none.
    fn known_until(&self, until: i64) -> i64 {
        self.last_row_us().unwrap_or(until).min(until)
    }

    fn rows(&self, table: &str) -> &Rows {
        static EMPTY: std::sync::OnceLock<Rows> = std::sync::OnceLock::new();
        self.tables
            .get(table)
            .unwrap_or_else(|| EMPTY.get_or_init(Rows::default))
    }
}

/// Reads every node's rows of the tables the report needs, with a progress
/// bar on stderr. A table this build does not know is left out; a damaged
/// file fails the read, or with `skip_damaged` is left out and named.
fn load(
    source: &Source,
    catalog: &Catalog,
    from_us: Option<i64>,
    until_us: Option<i64>,
    skip_damaged: bool,
) -> Result<Vec<NodeData>> {
    let nodes = source.nodes();
    // A table or field this build does not know is left out.
    let reads: Vec<(&str, Option<Vec<String>>)> = READS
        .iter()
        .filter_map(|(t, fields)| {
            let def = catalog.get(t)?;
            let fields = fields.map(|f| {
                f.iter()
                    .filter(|n| def.fields.iter().any(|d| d.name == **n))
                    .map(|n| n.to_string())
                    .collect()
            });
            Some((*t, fields))
        })
        .collect();
    let progress = progress_bar((nodes.len() * reads.len()) as u64);
    let mut data = Vec::new();
    for node in &nodes {
        let (mut tables, mut damaged_files) = (BTreeMap::new(), Vec::new());
        for (table, fields) in &reads {
            progress.set_message(format!("{node} {table}"));
            let (mut from_us, mut until_us) = (from_us, until_us);
            if WINDOW_END_TABLES.contains(table) {
                from_us = from_us.map(|t| t.saturating_add(1));
                until_us = until_us.map(|t| t.saturating_add(1));
            }
            if *table == "jitter_wakeup" {
                from_us = from_us.map(|t| t.saturating_sub(WAKEUP_BASELINE_LOOKBACK_US));
            }
            if *table == EVENTS_TABLE {
                from_us = from_us.map(|t| t.saturating_sub(EVENTS_LOOKBACK_US));
            }
            let request = ScanRequest {
                table: table.to_string(),
                from_us,
                until_us,
                fields: fields.clone(),
                skip_damaged,
                ..Default::default()
            };
            let (rows, mut damaged) = source.scan(node, catalog, &request)?;
            tables.insert(*table, rows);
            damaged_files.append(&mut damaged);
            progress.inc(1);
        }
        data.push(NodeData {
            name: node.clone(),
            from_us,
            tables,
            damaged_files,
        });
    }
    progress.finish_and_clear();
    Ok(data)
}

/// Writes the page to `path`. A regular file, new or old (or the one a
/// symbolic link names, so the link stays), is replaced whole through a
/// temporary file beside it: a browser or web server never reads half a page.
/// Anything else there (`/dev/null`, `/dev/stdout`, a FIFO) is opened and
/// written as a shell's `>` would: renaming over it would put the page in its
/// place, and as root would leave `/dev/null` a regular file that every
/// program then reads back what others wrote to it.
fn write_page(path: &Path, page: &[u8]) -> Result<()> {
    use std::io::Write;
    let write_into = |path: &Path| -> Result<()> {
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .open(path)
            .with_context(|| format!("open {}", path.display()))?;
        file.write_all(page)
            .with_context(|| format!("write {}", path.display()))
    };
    let existing = match std::fs::metadata(path) {
        Ok(meta) if meta.is_dir() => {
            bail!("{} is a directory; name the file to write", path.display())
        }
        Ok(meta) if !meta.is_file() => return write_into(path),
        Ok(meta) => Some(meta),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            if path.symlink_metadata().is_ok() {
                // A link to nothing yet: create what it names.
                return std::fs::write(path, page)
                    .with_context(|| format!("write {}", path.display()));
            }
            None
        }
        Err(e) => return Err(e).with_context(|| format!("read {}", path.display())),
    };
    let target = match existing {
        Some(_) => {
            std::fs::canonicalize(path).with_context(|| format!("resolve {}", path.display()))?
        }
        None => path.to_owned(),
    };
    let name = target
        .file_name()
        .with_context(|| format!("{} names no file", path.display()))?;
    let mut tmp_name = std::ffi::OsString::from(".");
    tmp_name.push(name);
    tmp_name.push(format!(".{}.tmp", std::process::id()));
    let tmp = target.with_file_name(tmp_name);
    let replaced = (|| -> Result<()> {
        // Made afresh: a link planted under the temporary name is replaced,
        // not written through.
        let mut file = vtax_store::regular_file::create_fresh(&tmp)
            .with_context(|| format!("create {}", tmp.display()))?;
        file.write_all(page)
            .with_context(|| format!("write {}", tmp.display()))?;
        if let Some(meta) = &existing {
            use std::os::unix::fs::MetadataExt;
            file.set_permissions(meta.permissions())
                .with_context(|| format!("set the mode of {}", tmp.display()))?;
            // Run as root over a user's page, the page stays the user's.
            let made = file.metadata()?;
            if (meta.uid(), meta.gid()) != (made.uid(), made.gid()) {
                let _ = std::os::unix::fs::fchown(&file, Some(meta.uid()), Some(meta.gid()));
            }
        }
        std::fs::rename(&tmp, &target)
            .with_context(|| format!("rename {} to {}", tmp.display(), target.display()))
    })();
    if replaced.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    replaced
}

/// Runs `vtax report`.
pub fn report(args: ReportArgs) -> Result<()> {
    let dir = args.data_dir.unwrap_or_else(crate::default_data_dir);
    let source = Source::open(&dir)?;
    let now = now_us();
    let parse = |s: &Option<String>| s.as_deref().map(|s| parse_time(s, now)).transpose();
    let (from_us, until_us) = (parse(&args.since)?, parse(&args.until)?);
    if let (Some(f), Some(u)) = (from_us, until_us) {
        if f >= u {
            bail!("--since must come before --until");
        }
    }
    let catalog = crate::catalog();
    let data = load(&source, &catalog, from_us, until_us, args.skip_damaged)?;
    let context = Page {
        source: &dir,
        fleet: matches!(source, Source::Fleet { .. }),
        from_us,
        until_us,
        generated_us: now,
        max_points: args.max_points.max(2),
        events_known: catalog.get(EVENTS_TABLE).is_some(),
    };
    let html = render(&context, &data);
    if args.output.as_os_str() == "-" {
        return crate::print_stdout(&html);
    }
    write_page(&args.output, html.as_bytes())?;
    let rows: usize = data
        .iter()
        .flat_map(|n| n.tables.values())
        .map(Rows::len)
        .sum();
    let damaged: Vec<&(PathBuf, String)> = data.iter().flat_map(|n| &n.damaged_files).collect();
    eprintln!(
        "Wrote {} ({} KiB): {} node(s), {rows} rows read{}.",
        args.output.display(),
        html.len() / 1024,
        data.len(),
        match damaged.len() {
            0 => String::new(),
            n => format!(", {n} damaged file(s) left out"),
        }
    );
    for (path, why) in damaged {
        eprintln!("  left out: {}", naming_the_file(path, why));
    }
    Ok(())
}

fn progress_bar(total: u64) -> ProgressBar {
    // indicatif draws nothing when stderr is not a terminal.
    let bar = ProgressBar::new(total);
    bar.set_style(
        ProgressStyle::with_template("reading {msg:<28} [{bar:40}] {pos}/{len} tables ({elapsed})")
            .expect("static template")
            .progress_chars("=> "),
    );
    bar
}

struct Page<'a> {
    source: &'a Path,
    fleet: bool,
    from_us: Option<i64>,
    until_us: Option<i64>,
    generated_us: i64,
    max_points: usize,
    events_known: bool,
}

/// What the report says about one node, shaped from its rows.
struct NodeSummary {
    verdict: String,
    evidence: Vec<(String, String)>,
    /// The detector's tax over the range, one per [`TAX_FIELDS`].
    tax: Vec<headline::Figure>,
    /// Every GPU the tables name, lost ones included.
    health: Vec<GpuHealth>,
    utilization: Vec<(i64, f64)>,
    /// HBM and NVLink against their peaks, while busy.
    hbm_ratio: Vec<(i64, f64)>,
    nvlink_ratio: Vec<(i64, f64)>,
    steal_ratio: Vec<(i64, f64)>,
    /// Steal over the range: each CPU's stolen time over the time it was
    /// counted over, gaps included, averaged over CPUs.
    steal_over_range: Option<f64>,
    histogram: shape::Histogram,
    /// Faults of the node: the detector's events on signals where healthy
    /// is zero (a link trained down, links missing, a clock held down).
    faults: Vec<Event>,
    /// Noisy-neighbour events: the others.
    events: Vec<Event>,
}

impl NodeSummary {
    fn lost_gpus(&self) -> impl Iterator<Item = &GpuHealth> {
        self.health.iter().filter(|g| g.lost_since.is_some())
    }

    /// `8`, or `8 (1 lost)`.
    fn gpu_count(&self) -> String {
        match self.lost_gpus().count() {
            0 => self.health.len().to_string(),
            lost => format!("{} ({lost} lost)", self.health.len()),
        }
    }
}

/// A noisy-neighbour event or a fault, as the detector writes it.
#[derive(Clone, Debug, PartialEq)]
struct Event {
    resource: String,
    victim: String,
    signal: String,
    suspects: String,
    evidence: String,
    state: String,
    start_us: i64,
    end_us: Option<i64>,
    score: Option<f64>,
    top_correlation: Option<f64>,
    effect_size: Option<f64>,
}

impl Event {
    /// Whether the event was still open at its latest row: `open`, or
    /// `updated` (it named a new suspect), not `closed`.
    fn is_open(&self) -> bool {
        self.state != "closed"
    }

    /// A fault of the node, not a neighbour: the detector judges its signal
    /// against a fixed threshold where healthy is zero (a PCIe link trained
    /// down, NVLink links missing, a clock held down, InfiniBand errors), so
    /// no workload of the node is its suspect.
    fn is_fault(&self) -> bool {
        crate::detect::Resource::parse(&self.resource)
            .and_then(|r| {
                crate::detect::SPECS
                    .iter()
                    .find(|s| s.resource == r && s.signal == self.signal)
            })
            .is_some_and(|s| matches!(s.rule, crate::detect::Rule::Above { .. }))
    }
}

/// Events of the detector's rows: each event once (its latest row), by start.
/// The events of the range, each as its latest row says: those that began
/// in it, and those that began before it and were still open at its start
/// (`rows` reaches back [`EVENTS_LOOKBACK_US`] before `from_us`). An event
/// open for the whole range has no row in it, and had been left out.
fn events(rows: &Rows, from_us: Option<i64>) -> Vec<Event> {
    let (resource, victim, signal) = (rows.tag("resource"), rows.tag("victim"), rows.tag("signal"));
    let (suspects, evidence, state) = (
        rows.tag("suspects"),
        rows.tag("evidence"),
        rows.tag("state"),
    );
    let (start, end) = (
        rows.field("start_time_seconds"),
        rows.field("end_time_seconds"),
    );
    let (score, corr, effect) = (
        rows.field("score"),
        rows.field("top_correlation"),
        rows.field("effect_size"),
    );
    let mut latest: BTreeMap<(i64, String, String, String), (i64, Event)> = BTreeMap::new();
    for i in 0..rows.len() {
        let start_us = start[i]
            .map(|s| (s * 1e6) as i64)
            .unwrap_or(rows.time_us[i]);
        let event = Event {
            resource: resource[i].to_owned(),
            victim: victim[i].to_owned(),
            signal: signal[i].to_owned(),
            suspects: suspects[i].to_owned(),
            evidence: evidence[i].to_owned(),
            state: state[i].to_owned(),
            start_us,
            end_us: end[i].filter(|e| *e > 0.0).map(|e| (e * 1e6) as i64),
            score: score[i],
            top_correlation: corr[i],
            effect_size: effect[i],
        };
        let key = (
            start_us,
            event.resource.clone(),
            event.victim.clone(),
            event.signal.clone(),
        );
        let t = rows.time_us[i];
        if latest.get(&key).is_none_or(|(seen, _)| *seen <= t) {
            latest.insert(key, (t, event));
        }
    }
    latest
        .into_values()
        .map(|(_, e)| e)
        .filter(|e| match (from_us, e.end_us) {
            (Some(from), Some(end)) => end >= from,
            (Some(from), None) => e.state != "closed" || e.start_us >= from,
            (None, _) => true,
        })
        .collect()
}

/// The platform verdict and its evidence. The verdict is the detector's
/// (the latest `platform` row, the same `vtax_platform_info` Prometheus
/// shows), so the report and the alerts never disagree; the host facts and
/// the GPU names are shown beside it as evidence.
fn platform_verdict(
    platform_host: &Rows,
    platform: &Rows,
    gpu_info: &Rows,
) -> (String, Vec<(String, String)>) {
    let mut evidence = Vec::new();
    let judged = platform.latest_tags().unwrap_or_default();
    let tag = |k: &str| judged.get(k).map(String::as_str).unwrap_or("unknown");
    let by = match tag("hypervisor") {
        "unknown" | "other" | "none" => String::new(),
        h => format!(" ({h})"),
    };
    let verdict = match tag("verdict") {
        _ if judged.is_empty() => {
            "Unknown: no verdict rows in this range (was the detector off?)".to_string()
        }
        "bare_metal" => "Bare metal".to_string(),
        "vm_passthrough" => format!("VM with GPU passthrough{by}"),
        "vgpu" => format!("VM with vGPU{by}"),
        "mig" if tag("virtualization") == "vm" => format!("MIG slices in a VM{by}"),
        "mig" => "MIG slices".to_string(),
        "vm" => format!("VM{by}, no GPU seen"),
        other => format!("Unknown ({other})"),
    };
    let facts = platform_host.latest_tags().unwrap_or_default();
    for key in [
        "virtualization",
        "hypervisor",
        "cloud",
        "product",
        "cpu_model",
        "kernel",
        "iommu",
        "gpudirect_rdma",
        "gpudirect_storage",
        "nvidia_driver",
    ] {
        if let Some(v) = facts.get(key) {
            evidence.push((key.to_string(), v.clone()));
        }
    }
    // The latest row of each GPU, for the names.
    let gpu_column = gpu_info.tag("gpu");
    let gpus = gpu_info.latest_by(|i| Some(gpu_column[i]));
    let pick = |tag: &str| -> Vec<String> {
        let column = gpu_info.tag(tag);
        let mut v: Vec<String> = gpus.values().map(|&i| column[i].to_owned()).collect();
        v.sort();
        v.dedup();
        v
    };
    if !gpus.is_empty() {
        evidence.push((
            "GPUs".into(),
            format!("{} × {}", gpus.len(), pick("name").join(", ")),
        ));
        if pick("backend").iter().any(|b| b == "simulated") {
            evidence.push(("GPU backend".into(), "simulated (not real hardware)".into()));
        }
    }
    if !judged.is_empty() && tag("gpu_virtualization") != "none" {
        evidence.push((
            "GPU virtualization mode".into(),
            tag("gpu_virtualization").into(),
        ));
        evidence.push(("MIG".into(), tag("mig").into()));
        evidence.push(("NVLink links up".into(), tag("nvlink").replace('/', " of ")));
        evidence.push(("PCIe links under load".into(), tag("pcie").into()));
    }
    (verdict, evidence)
}

/// Per GPU: `(time, a / b)` where both have values, b > 0 and the GPU was
/// busy ([`health::BUSY`]): an idle GPU moves no bytes by design, and its
/// seconds would read as bandwidth lost (the tax and the fleet recipes
/// take busy GPUs only too).
fn busy_ratio_by_gpu(
    gpu: &Rows,
    numerator: impl Fn(usize) -> Option<f64>,
    denominator: impl Fn(usize) -> Option<f64>,
) -> BTreeMap<String, Vec<(i64, f64)>> {
    let utilization = gpu.field("utilization_ratio");
    let mut out: BTreeMap<String, Vec<(i64, f64)>> = BTreeMap::new();
    for (i, g) in gpu.tag("gpu").into_iter().enumerate() {
        if !utilization[i].is_some_and(|u| u >= health::BUSY) {
            continue;
        }
        if let (Some(n), Some(d)) = (numerator(i), denominator(i)) {
            if d > 0.0 && n.is_finite() {
                out.entry(g.to_owned())
                    .or_default()
                    .push((gpu.time_us[i], n / d));
            }
        }
    }
    for v in out.values_mut() {
        v.sort_by_key(|p| p.0);
    }
    out
}

/// NVLink rx+tx of each `gpu` row; 0 where every link of the product is
/// hidden or down (NVML then has no throughput to give): such a GPU has
/// lost all of its NVLink, and leaving it out would hide it.
fn nvlink_bytes(gpu: &Rows) -> Vec<Option<f64>> {
    let (rx, tx) = (
        gpu.field("nvlink_total_rx_bytes_per_second"),
        gpu.field("nvlink_total_tx_bytes_per_second"),
    );
    let (up, product) = (
        gpu.field("nvlink_links_up"),
        gpu.field("nvlink_links_product"),
    );
    (0..gpu.len())
        .map(|i| match (rx[i], tx[i]) {
            (Some(r), Some(t)) if (r + t).is_finite() => Some(r + t),
            _ if up[i] == Some(0.0) && product[i].is_some_and(|p| p > 0.0) => Some(0.0),
            _ => None,
        })
        .collect()
}

fn summarize(node: &NodeData) -> NodeSummary {
    let gpu = node.rows("gpu");
    let gpu_info = node.rows("gpu_info");
    let (verdict, evidence) =
        platform_verdict(node.rows("platform_host"), node.rows("platform"), gpu_info);
    let utilization_by_gpu = gpu.series_by("gpu", "utilization_ratio");
    let (hbm_bytes, peak) = (
        gpu.field("hbm_bytes_per_second"),
        gpu.field("hbm_peak_bytes_per_second"),
    );
    let hbm = busy_ratio_by_gpu(gpu, |i| hbm_bytes[i].filter(|v| v.is_finite()), |i| peak[i]);
    let (nvlink_bytes, nvlink_peak) =
        (nvlink_bytes(gpu), gpu.field("nvlink_peak_bytes_per_second"));
    let nvlink = busy_ratio_by_gpu(gpu, |i| nvlink_bytes[i], |i| nvlink_peak[i]);
    let cpu = node.rows("cpu");
    let steal_by_cpu = cpu.series_by("cpu", "steal_seconds");
    let steal_rates: Vec<Vec<(i64, f64)>> = steal_by_cpu
        .values()
        .map(|p| shape::counter_rates(p))
        .collect();
    let steal_by_cpu_over_range: Vec<f64> = steal_by_cpu
        .values()
        .filter_map(|p| shape::counter_mean_rate(p))
        .collect();
    let steal_over_range = (!steal_by_cpu_over_range.is_empty()).then(|| {
        steal_by_cpu_over_range.iter().sum::<f64>() / steal_by_cpu_over_range.len() as f64
    });
    let wakeup = node.rows("jitter_wakeup");
    let (cpus, les, counts) = (
        wakeup.tag("cpu"),
        wakeup.tag("le"),
        wakeup.field("latency_seconds"),
    );
    let cumulative: Vec<(String, String, i64, f64)> = (0..wakeup.len())
        .filter_map(|i| {
            counts[i].map(|c| (cpus[i].to_owned(), les[i].to_owned(), wakeup.time_us[i], c))
        })
        .collect();
    let (faults, events): (Vec<Event>, Vec<Event>) = events(node.rows(EVENTS_TABLE), node.from_us)
        .into_iter()
        .partition(Event::is_fault);
    NodeSummary {
        verdict,
        evidence,
        tax: headline::tax(node.rows("tax")),
        health: health::gpu_health(
            gpu,
            gpu_info,
            node.rows("gpu_health"),
            node.rows("gpu_event"),
        ),
        utilization: shape::mean_by_time(utilization_by_gpu.values()),
        hbm_ratio: shape::mean_by_time(hbm.values()),
        nvlink_ratio: shape::mean_by_time(nvlink.values()),
        steal_ratio: shape::mean_by_time(&steal_rates),
        steal_over_range,
        histogram: shape::histogram_from_cumulative(&cumulative, node.from_us),
        faults,
        events,
    }
}

const CSS: &str = r#"
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",sans-serif;margin:0;color:#1d1d1f;background:#f6f7f9}
header{background:#1d2733;color:#fff;padding:18px 28px;overflow-wrap:anywhere}header h1{margin:0 0 4px;font-size:22px}
header p{margin:0;color:#c9d1db}main{padding:8px 28px 40px;max-width:1240px}
section{background:#fff;border-radius:8px;box-shadow:0 1px 3px rgba(0,0,0,.08);margin:18px 0;padding:14px 20px}
h2{font-size:18px;margin:4px 0 10px}h3{font-size:15px;margin:16px 0 4px}
table{border-collapse:collapse;margin:6px 0}td,th{padding:4px 10px;border-bottom:1px solid #eee;text-align:left;vertical-align:top;overflow-wrap:break-word}td.text{overflow-wrap:anywhere}
table.wide{width:100%}table.wide td,table.wide th{padding:4px 6px;font-size:13px}
th{font-weight:600;color:#444}td.num{text-align:right;font-variant-numeric:tabular-nums}
.verdict{font-weight:600}details{margin:8px 0}summary{cursor:pointer;padding:4px 0}.legend span{margin-right:14px;font-size:12px;display:inline-block;max-width:100%;overflow-wrap:anywhere}
.legend i{display:inline-block;width:12px;height:3px;margin:0 5px 3px 0;vertical-align:middle}.legend .swatch{margin:0 5px 1px 0;vertical-align:middle}
.note{color:#666;font-size:12px}.no-data,.no-events,.no-faults{color:#666;font-style:italic}
svg.plot{display:block;background:#fff;overflow:visible}svg text{fill:#333}
#headline h2{font-size:20px}.who{margin:6px 0 10px;padding-left:20px}.who li{margin:2px 0}
.tiles{display:flex;flex-wrap:wrap;gap:10px 18px}.group{flex:1 1 auto}.group h3{margin:6px 0}
.group>div{display:flex;flex-wrap:wrap;gap:8px}
.tile{border:1px solid #dde1e6;border-radius:6px;padding:5px 10px;min-width:92px}
.tile .figure{display:block;font-size:21px;font-weight:600;font-variant-numeric:tabular-nums}
.tile .what{display:block;font-size:12px;color:#333}.tile .note{display:block;font-size:11px}
.tile.bad,td.bad{background:#fff3f2}.tile.bad{border-color:#d62728}.bad,.tile.bad .figure{color:#b3261e}
.causes{padding-left:22px;margin:4px 0}.causes li{margin:3px 0;overflow-wrap:anywhere}.causes .note{display:block}
.kind{display:inline-block;font-size:11px;font-weight:600;border-radius:3px;padding:0 5px;margin-right:4px;color:#fff;background:#1f77b4}
.kind.fault,.kind.lost{background:#d62728}.kind.hypervisor{background:#9467bd}
tr.lost td{background:#fff3f2}
"#;

/// Marks each plot as rendered when the browser laid out at least one of its
/// marks, so a headless browser's DOM says whether every plot drew.
const CHECK_SCRIPT: &str = r#"
(function(){
  var plots=document.querySelectorAll('svg.plot'),ok=0;
  plots.forEach(function(p){
    var drawn=0;
    p.querySelectorAll('path.series,rect.bar,rect.span,circle').forEach(function(m){
      var b=m.getBBox(); if(b.width>0||b.height>0) drawn++;
    });
    p.setAttribute('data-rendered', drawn>0?'yes':'no');
    if(drawn>0) ok++; else p.classList.add('plot-error');
  });
  document.body.setAttribute('data-plots', plots.length);
  document.body.setAttribute('data-plots-rendered', ok);
  // Whatever sticks out of its section: wider than its box, or past the
  // section's right edge.
  var over=[];
  document.querySelectorAll('section').forEach(function(s){
    var edge=s.getBoundingClientRect().right+0.5;
    s.querySelectorAll('*').forEach(function(e){
      if(e.closest('svg')&&e.tagName.toLowerCase()!=='svg') return;
      var r=e.getBoundingClientRect();
      if(r.width===0&&r.height===0) return;
      if(e.scrollWidth>e.clientWidth+1&&e.clientWidth>0||r.right>edge)
        over.push(s.id+' '+e.tagName.toLowerCase()+(e.id?'#'+e.id:''));
    });
  });
  document.body.setAttribute('data-overflowing', over.length);
  document.body.setAttribute('data-overflowing-elements', over.slice(0,20).join(', '));
})();
"#;

fn render(ctx: &Page, nodes: &[NodeData]) -> String {
    let summaries: Vec<NodeSummary> = nodes.iter().map(summarize).collect();
    let mut t_min = i64::MAX;
    let mut t_max = i64::MIN;
    for node in nodes {
        for rows in node.tables.values() {
            for &t in &rows.time_us {
                t_min = t_min.min(t);
                t_max = t_max.max(t);
            }
        }
    }
    let (from, until) = (
        ctx.from_us.unwrap_or(t_min),
        ctx.until_us.unwrap_or(t_max.saturating_add(1)),
    );
    let range = if t_min > t_max {
        // Say which range holds nothing: a past, a future or a mistyped one.
        match (ctx.from_us, ctx.until_us) {
            (Some(from), Some(until)) => format!(
                "no rows from {} to {} UTC",
                format_time(from, true),
                format_time(until, true)
            ),
            (Some(from), None) => format!("no rows since {} UTC", format_time(from, true)),
            (None, Some(until)) => format!("no rows until {} UTC", format_time(until, true)),
            (None, None) => "no rows".to_string(),
        }
    } else {
        format!(
            "{} to {} UTC",
            format_time(from, true),
            format_time(until, true)
        )
    };
    let mut h = String::new();
    let title = if ctx.fleet {
        format!("vtax report: fleet of {} nodes", nodes.len())
    } else {
        format!(
            "vtax report: {}",
            nodes.first().map_or("", |n| n.name.as_str())
        )
    };
    let _ = write!(
        h,
        "<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\"><meta name=\"viewport\" content=\"width=device-width\"><title>{}</title><style>{CSS}</style></head><body><header><h1>{}</h1><p>{} · {} · generated {} UTC</p></header><main>",
        escape(&title),
        escape(&title),
        escape(&ctx.source.display().to_string()),
        escape(&range),
        format_time(ctx.generated_us, true),
    );
    let sections = Sections {
        ctx,
        nodes,
        names: nodes.iter().map(|n| n.name.as_str()).collect(),
        summaries,
        from,
        until,
    };
    damaged_files(&mut h, nodes);
    sections.headline(&mut h);
    sections.gpu_health(&mut h);
    sections.events(&mut h);
    sections.platform(&mut h);
    sections.gpus(&mut h);
    sections.jitter(&mut h);
    sections.host(&mut h);
    h.push_str("</main>");
    let _ = writeln!(h, "<script>{CHECK_SCRIPT}</script></body></html>");
    h
}

/// What was wrong with a damaged file, with its path unless the store's
/// error names it already.
fn naming_the_file(path: &Path, why: &str) -> String {
    let path = path.display().to_string();
    if why.contains(&path) {
        why.to_owned()
    } else {
        format!("{path}: {why}")
    }
}

/// The files left out as damaged, first on the page: every figure below
/// lacks their rows.
fn damaged_files(h: &mut String, nodes: &[NodeData]) {
    let damaged: Vec<(&str, &(PathBuf, String))> = nodes
        .iter()
        .flat_map(|n| n.damaged_files.iter().map(move |d| (n.name.as_str(), d)))
        .collect();
    if damaged.is_empty() {
        return;
    }
    let _ = write!(
        h,
        r#"<section id="damaged"><h2>Files left out</h2><p class="note">{} damaged file(s) could not be read and were left out (--skip-damaged): what follows lacks their rows.</p><ul>"#,
        damaged.len()
    );
    for (node, (path, why)) in damaged {
        let _ = write!(
            h,
            "<li><b>{}</b> {}</li>",
            escape(node),
            escape(&naming_the_file(path, why))
        );
    }
    h.push_str("</ul></section>");
}

/// What every section of the page draws from.
struct Sections<'a> {
    ctx: &'a Page<'a>,
    nodes: &'a [NodeData],
    names: Vec<&'a str>,
    summaries: Vec<NodeSummary>,
    /// The range shown: the requested bounds, else the data's.
    from: i64,
    until: i64,
}

impl Sections<'_> {
    /// The page settings, nodes, their summaries and names.
    fn parts(&self) -> (&Page<'_>, &[NodeData], &[NodeSummary], &[&str]) {
        (self.ctx, self.nodes, &self.summaries, &self.names)
    }

    /// A line chart over the report's range, the time axis every chart and
    /// the timeline share.
    fn chart(
        &self,
        id: &str,
        lines: &[Line],
        unit: Unit,
        y_max: Option<f64>,
        references: &[svg::Reference],
    ) -> String {
        svg::line_chart(
            Some((self.from, self.until)),
            id,
            lines,
            unit,
            y_max,
            references,
        )
    }
}

#[cfg(test)]
mod tests;
