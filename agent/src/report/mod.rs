//! `vtax report`: one self-contained HTML file (inline CSS, SVG and a few lines
//! of script, nothing fetched) for a time range of a node's store or of a fleet
//! copy (`tables/<table>/node=<node>/date=.../`): first the verdict, the
//! measured tax and its top causes; then each GPU's health, the faults of
//! the node and the noisy-neighbour events, the platform's evidence, GPU
//! utilisation, HBM and NVLink against their peaks, jitter distributions and
//! quantiles over time, steal and pressure.

mod headline;
mod health;
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
    #[arg(long)]
    since: Option<String>,
    /// Latest time, exclusive, in the same forms.
    #[arg(long)]
    until: Option<String>,
    /// The HTML file to write; `-` writes the page to stdout.
    #[arg(long, short)]
    output: PathBuf,
    /// Points per plotted line at most; longer ranges are averaged (maxima for latency).
    #[arg(long, default_value_t = DEFAULT_MAX_POINTS)]
    max_points: usize,
}

/// What the report reads: one node's store, or a fleet copy of many.
enum Source {
    Node { dir: PathBuf, name: String },
    Fleet { root: PathBuf, nodes: Vec<String> },
}

impl Source {
    fn open(dir: &Path) -> Result<Source> {
        // A young agent's rows are all in its WAL: a store is either.
        if !dir.join("tables").is_dir() && !dir.join("wal").is_dir() {
            bail!(
                "no store at {} (expected {}/tables/ or wal/; set --data-dir)",
                dir.display(),
                dir.display()
            );
        }
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

    fn scan(&self, node: &str, catalog: &Catalog, request: &ScanRequest) -> Result<Rows> {
        let result = match self {
            Source::Node { dir, .. } => scan_dir(dir, catalog, request),
            Source::Fleet { root, .. } => scan_fleet_node(root, node, catalog, request),
        }
        .with_context(|| format!("read table {} of node {node}", request.table))?;
        Ok(Rows::from_batches(&result.batches))
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

/// One node's rows over the range, by table.
struct NodeData {
    name: String,
    tables: BTreeMap<&'static str, Rows>,
}

impl NodeData {
    fn rows(&self, table: &str) -> &Rows {
        static EMPTY: std::sync::OnceLock<Rows> = std::sync::OnceLock::new();
        self.tables
            .get(table)
            .unwrap_or_else(|| EMPTY.get_or_init(Rows::default))
    }
}

/// Reads every node's rows of the tables the report needs, with a progress
/// bar on stderr. A table this build does not know is left out.
fn load(
    source: &Source,
    catalog: &Catalog,
    from_us: Option<i64>,
    until_us: Option<i64>,
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
        let mut tables = BTreeMap::new();
        for (table, fields) in &reads {
            progress.set_message(format!("{node} {table}"));
            let request = ScanRequest {
                table: table.to_string(),
                from_us,
                until_us,
                fields: fields.clone(),
                ..Default::default()
            };
            tables.insert(*table, source.scan(node, catalog, &request)?);
            progress.inc(1);
        }
        data.push(NodeData {
            name: node.clone(),
            tables,
        });
    }
    progress.finish_and_clear();
    Ok(data)
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
    let data = load(&source, &catalog, from_us, until_us)?;
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
    let tmp = args.output.with_extension("html.tmp");
    std::fs::write(&tmp, &html).with_context(|| format!("write {}", tmp.display()))?;
    std::fs::rename(&tmp, &args.output)
        .with_context(|| format!("rename {} to {}", tmp.display(), args.output.display()))?;
    let rows: usize = data
        .iter()
        .flat_map(|n| n.tables.values())
        .map(Rows::len)
        .sum();
    eprintln!(
        "Wrote {} ({} KiB): {} node(s), {rows} rows read.",
        args.output.display(),
        html.len() / 1024,
        data.len()
    );
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
    hbm_ratio: Vec<(i64, f64)>,
    nvlink_ratio: Vec<(i64, f64)>,
    steal_ratio: Vec<(i64, f64)>,
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
fn events(rows: &Rows) -> Vec<Event> {
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
    latest.into_values().map(|(_, e)| e).collect()
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
    let mut gpus: BTreeMap<&str, usize> = BTreeMap::new();
    for (i, g) in gpu_info.tag("gpu").into_iter().enumerate() {
        let e = gpus.entry(g).or_insert(i);
        if gpu_info.time_us[i] >= gpu_info.time_us[*e] {
            *e = i;
        }
    }
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

/// Per GPU: `(time, a / b)` where both have values and b > 0.
fn ratio_by_gpu(
    gpu: &Rows,
    numerator: impl Fn(usize) -> Option<f64>,
    denominator: impl Fn(usize) -> Option<f64>,
) -> BTreeMap<String, Vec<(i64, f64)>> {
    let mut out: BTreeMap<String, Vec<(i64, f64)>> = BTreeMap::new();
    for (i, g) in gpu.tag("gpu").into_iter().enumerate() {
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
    let hbm = ratio_by_gpu(gpu, |i| hbm_bytes[i].filter(|v| v.is_finite()), |i| peak[i]);
    let (nvlink_bytes, nvlink_peak) =
        (nvlink_bytes(gpu), gpu.field("nvlink_peak_bytes_per_second"));
    let nvlink = ratio_by_gpu(gpu, |i| nvlink_bytes[i], |i| nvlink_peak[i]);
    let cpu = node.rows("cpu");
    let steal_rates: Vec<Vec<(i64, f64)>> = cpu
        .series_by("cpu", "steal_seconds")
        .values()
        .map(|p| shape::counter_rates(p))
        .collect();
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
    let (faults, events): (Vec<Event>, Vec<Event>) = events(node.rows(EVENTS_TABLE))
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
        histogram: shape::histogram_from_cumulative(&cumulative),
        faults,
        events,
    }
}

const CSS: &str = r#"
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",sans-serif;margin:0;color:#1d1d1f;background:#f6f7f9}
header{background:#1d2733;color:#fff;padding:18px 28px}header h1{margin:0 0 4px;font-size:22px}
header p{margin:0;color:#c9d1db}main{padding:8px 28px 40px;max-width:1240px}
section{background:#fff;border-radius:8px;box-shadow:0 1px 3px rgba(0,0,0,.08);margin:18px 0;padding:14px 20px}
h2{font-size:18px;margin:4px 0 10px}h3{font-size:15px;margin:16px 0 4px}
table{border-collapse:collapse;margin:6px 0}td,th{padding:4px 10px;border-bottom:1px solid #eee;text-align:left;vertical-align:top;overflow-wrap:break-word}td.text{overflow-wrap:anywhere}
table.wide{width:100%}table.wide td,table.wide th{padding:4px 6px;font-size:13px}
th{font-weight:600;color:#444}td.num{text-align:right;font-variant-numeric:tabular-nums}
.verdict{font-weight:600}details{margin:8px 0}summary{cursor:pointer;padding:4px 0}.legend span{margin-right:14px;font-size:12px;white-space:nowrap}
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
.causes{padding-left:22px;margin:4px 0}.causes li{margin:3px 0}.causes .note{display:block}
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

/// A line per node, or for a fleet with more nodes than colours, the lowest,
/// median and highest node per time slot (labelled with `what` prefixed).
fn node_lines(
    names: &[&str],
    series: &[&[(i64, f64)]],
    max_points: usize,
    reduce: Reduce,
) -> Vec<Line> {
    if names.len() <= svg::PALETTE.len() {
        return names
            .iter()
            .zip(series)
            .enumerate()
            .map(|(i, (name, points))| {
                Line::new(*name, shape::downsample(points, max_points, reduce), i)
            })
            .collect();
    }
    let [low, median, high] = shape::spread_across(series, max_points, reduce);
    [
        ("lowest node", low),
        ("median node", median),
        ("highest node", high),
    ]
    .into_iter()
    .enumerate()
    .map(|(i, (label, points))| Line::new(label, points, i))
    .collect()
}

/// A line per GPU, coloured by its index so it keeps its colour from chart
/// to chart, in index order; a GPU of `summary` without points (lost, or
/// without this metric) keeps its legend entry, which says why.
fn gpu_lines(
    summary: &NodeSummary,
    series: BTreeMap<String, Vec<(i64, f64)>>,
    suffix: &dyn Fn(&GpuHealth) -> String,
    max_points: usize,
) -> Vec<Line> {
    let mut series = series;
    let mut lines: Vec<Line> = summary
        .health
        .iter()
        .map(|g| {
            let points = series.remove(&g.index).unwrap_or_default();
            let why = match (&points.is_empty(), g.lost_since) {
                (_, Some(since)) => format!(" (lost at {})", format_time(since, false)),
                (true, None) => " (no samples)".into(),
                (false, None) => suffix(g),
            };
            Line::new(
                format!("GPU {}{why}", g.index),
                shape::downsample(&points, max_points, Reduce::Mean),
                g.number(),
            )
        })
        .collect();
    // A GPU only this table names.
    for (g, points) in series {
        let color = health::gpu_number(&g);
        lines.push(Line::new(
            format!("GPU {g}"),
            shape::downsample(&points, max_points, Reduce::Mean),
            color,
        ));
    }
    lines.sort_by_key(|l| l.color);
    lines
}

/// The GPU error counters that grew in the range, one line per GPU and
/// kind, each counting from zero at the range's start: XIDs (one step per
/// `gpu_event` row), ECC errors and PCIe replays (a counter's drop, a driver
/// reload, starts it again from there). Counters that did not move are left
/// out, so the chart shows only what happened.
fn error_lines(gpu: &Rows, gpu_event: &Rows, from: i64, max_points: usize) -> Vec<Line> {
    const COUNTERS: &[(&str, &str, usize)] = &[
        ("ecc_uncorrected_errors", "ECC uncorrected", 1),
        ("ecc_corrected_errors", "ECC corrected", 2),
        ("pcie_replays", "PCIe replays", 3),
    ];
    let mut lines = Vec::new();
    let mut xids: BTreeMap<String, Vec<i64>> = BTreeMap::new();
    let (kinds, event_gpus) = (gpu_event.tag("kind"), gpu_event.tag("gpu"));
    for i in 0..gpu_event.time_us.len() {
        if kinds[i] == "xid" {
            xids.entry(event_gpus[i].to_owned())
                .or_default()
                .push(gpu_event.time_us[i]);
        }
    }
    // Kinds are told apart by the line's pattern: GPU g's kind k is
    // colour g with pattern k (svg::line_style).
    let style = |g: &str, kind: usize| {
        health::gpu_number(g) % svg::PALETTE.len() + kind * svg::PALETTE.len()
    };
    for (g, mut times) in xids {
        times.sort_unstable();
        let mut points = vec![(from.min(times[0]), 0.0)];
        for (n, t) in times.iter().enumerate() {
            points.push((*t, n as f64 + 1.0));
        }
        let label = format!("GPU {g} XID ({})", times.len());
        lines.push(Line::new(label, points, style(&g, 0)));
    }
    for &(field, what, kind) in COUNTERS {
        for (g, points) in gpu.series_by("gpu", field) {
            let mut total = 0.0;
            let mut previous: Option<f64> = None;
            let mut grown = Vec::with_capacity(points.len());
            for (t, v) in points {
                if let Some(p) = previous {
                    total += if v >= p { v - p } else { v };
                }
                previous = Some(v);
                grown.push((t, total));
            }
            if total > 0.0 {
                let label = format!("GPU {g} {what} ({total})");
                let grown = shape::downsample(&grown, max_points, Reduce::Max);
                lines.push(Line::new(label, grown, style(&g, kind)));
            }
        }
    }
    lines.sort_by_key(|l| l.color % svg::PALETTE.len());
    lines
}

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
        "no rows in this range".to_string()
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

    /// The summary table per node and each node's verdict with its evidence.
    fn platform(&self, h: &mut String) {
        let (ctx, nodes, summaries, _) = self.parts();
        // Summary and verdicts.
        h.push_str(r#"<section id="platform"><h2>Platform</h2><table class="wide"><tr><th>node</th><th>verdict</th><th>GPUs</th><th>GPU busy</th><th>HBM of peak</th><th>NVLink of peak</th><th>wake-up p99</th><th>steal</th><th>faults</th><th>events</th></tr>"#);
        for (node, s) in nodes.iter().zip(summaries.iter()) {
            let pct = |p: &[(i64, f64)]| {
                shape::mean(p).map_or("–".into(), |v| format_value(v, Unit::Ratio))
            };
            let p99 = shape::histogram_quantile(0.99, &s.histogram)
                .map_or("–".into(), |v| format_value(v, Unit::Seconds));
            let _ = write!(
                h,
                r#"<tr><td>{}</td><td class="verdict-cell">{}</td><td class="num">{}</td><td class="num">{}</td><td class="num">{}</td><td class="num">{}</td><td class="num">{p99}</td><td class="num">{}</td><td class="num">{}</td><td class="num">{}</td></tr>"#,
                escape(&node.name),
                escape(&s.verdict),
                s.gpu_count(),
                pct(&s.utilization),
                pct(&s.hbm_ratio),
                pct(&s.nvlink_ratio),
                pct(&s.steal_ratio),
                s.faults.len(),
                s.events.len(),
            );
        }
        h.push_str("</table>");
        for (node, s) in nodes.iter().zip(summaries.iter()) {
            // A fleet's evidence starts folded: one line per node until asked.
            let _ = write!(
                h,
                r#"<details{}><summary><b>{}</b>: <span class="verdict">{}</span></summary><table class="evidence">"#,
                if ctx.fleet { "" } else { " open" },
                escape(&node.name),
                escape(&s.verdict)
            );
            for (k, v) in &s.evidence {
                let _ = write!(h, "<tr><th>{}</th><td>{}</td></tr>", escape(k), escape(v));
            }
            h.push_str("</table></details>");
        }
        h.push_str("</section>");
    }

    /// Utilisation, HBM and NVLink against peak: per GPU on a node, per node on a fleet.
    fn gpus(&self, h: &mut String) {
        let (ctx, nodes, summaries, names) = self.parts();
        // GPUs.
        h.push_str(r#"<section id="gpus"><h2>GPUs</h2>"#);
        if ctx.fleet {
            h.push_str(if names.len() <= svg::PALETTE.len() {
                r#"<p class="note">Each line is a node: the mean over its GPUs.</p>"#
            } else {
                r#"<p class="note">Each node is the mean over its GPUs; lines are the lowest, median and highest node of each time slot.</p>"#
            });
            let per_node = |f: &dyn Fn(&NodeSummary) -> &Vec<(i64, f64)>| -> Vec<Line> {
                let series: Vec<&[(i64, f64)]> =
                    summaries.iter().map(|s| f(s).as_slice()).collect();
                node_lines(names, &series, ctx.max_points, Reduce::Mean)
            };
            for (id, title, lines) in [
                (
                    "gpu-utilization",
                    "Utilisation (kernel running)",
                    per_node(&|s| &s.utilization),
                ),
                (
                    "gpu-hbm",
                    "HBM bandwidth against peak",
                    per_node(&|s| &s.hbm_ratio),
                ),
                (
                    "gpu-nvlink",
                    "NVLink rx+tx against peak",
                    per_node(&|s| &s.nvlink_ratio),
                ),
            ] {
                let _ = write!(
                    h,
                    "<h3>{title}</h3>{}",
                    svg::line_chart(id, &lines, Unit::Ratio, Some(1.0), &[])
                );
            }
        } else if let (Some(node), Some(summary)) = (nodes.first(), summaries.first()) {
            let gpu = node.rows("gpu");
            h.push_str(r#"<p class="note">A GPU keeps its colour in every chart. A lost GPU has no samples after it went: its legend entry says so.</p>"#);
            let hbm = gpu_lines(
                summary,
                gpu.series_by("gpu", "hbm_bytes_per_second"),
                &|_| String::new(),
                ctx.max_points,
            );
            let util = gpu_lines(
                summary,
                gpu.series_by("gpu", "utilization_ratio"),
                &|_| String::new(),
                ctx.max_points,
            );
            let _ = write!(
                h,
                "<h3>Utilisation (kernel running)</h3>{}",
                svg::line_chart("gpu-utilization", &util, Unit::Ratio, Some(1.0), &[])
            );
            let peak = gpu
                .field("hbm_peak_bytes_per_second")
                .into_iter()
                .flatten()
                .fold(0.0, f64::max);
            let peaks: Vec<Reference> = (peak > 0.0)
                .then(|| Reference {
                    label: "HBM peak".into(),
                    value: peak,
                })
                .into_iter()
                .collect();
            let _ = write!(
                h,
                "<h3>HBM bandwidth against peak</h3>{}",
                svg::line_chart("gpu-hbm", &hbm, Unit::BytesPerSecond, None, &peaks)
            );
            let bytes = nvlink_bytes(gpu);
            let mut nvlink: BTreeMap<String, Vec<(i64, f64)>> = BTreeMap::new();
            for (i, g) in gpu.tag("gpu").into_iter().enumerate() {
                if let Some(b) = bytes[i] {
                    nvlink
                        .entry(g.to_owned())
                        .or_default()
                        .push((gpu.time_us[i], b));
                }
            }
            for v in nvlink.values_mut() {
                v.sort_by_key(|p| p.0);
            }
            let links = gpu
                .field("nvlink_links_product")
                .into_iter()
                .flatten()
                .fold(0.0, f64::max);
            let nvlink_peak = gpu
                .field("nvlink_peak_bytes_per_second")
                .into_iter()
                .flatten()
                .fold(0.0, f64::max);
            let peaks: Vec<Reference> = (nvlink_peak > 0.0)
                .then(|| Reference {
                    label: format!("NVLink peak ({links:.0} links, both ways)"),
                    value: nvlink_peak,
                })
                .into_iter()
                .collect();
            // A GPU with links missing says how many are up, in its label.
            let missing = |g: &GpuHealth| match g.nvlink {
                Some((up, product)) if up < product => format!(" ({up} of {product} links up)"),
                _ => String::new(),
            };
            let _ = write!(
                h,
                "<h3>NVLink rx+tx against peak</h3>{}",
                svg::line_chart(
                    "gpu-nvlink",
                    &gpu_lines(summary, nvlink, &missing, ctx.max_points),
                    Unit::BytesPerSecond,
                    None,
                    &peaks
                )
            );
        }
        h.push_str("</section>");
    }

    /// Wake-up latency over time and over the range, and who took the probe's lost time.
    fn jitter(&self, h: &mut String) {
        let (ctx, nodes, summaries, names) = self.parts();
        let down = |p: &[(i64, f64)], r| shape::downsample(p, ctx.max_points, r);
        // Jitter.
        h.push_str(r#"<section id="jitter"><h2>Scheduling jitter</h2><p class="note">Wake-up latency: how late a thread woke after its absolute deadline (cyclictest's method), per window, the worst CPU of each window.</p>"#);
        let quantile_fields = [
            ("p50", "wakeup_p50_seconds"),
            ("p90", "wakeup_p90_seconds"),
            ("p99", "wakeup_p99_seconds"),
            ("p99.9", "wakeup_p999_seconds"),
            ("max", "wakeup_max_seconds"),
        ];
        let worst_over_cpus = |node: &NodeData, field: &str| -> Vec<(i64, f64)> {
            let jitter = node.rows("jitter");
            let mut worst: BTreeMap<i64, f64> = BTreeMap::new();
            for (t, v) in jitter.time_us.iter().zip(jitter.field(field)) {
                if let Some(v) = v {
                    let e = worst.entry(*t).or_insert(v);
                    *e = e.max(v);
                }
            }
            down(&worst.into_iter().collect::<Vec<_>>(), Reduce::Max)
        };
        if ctx.fleet {
            let p99: Vec<Vec<(i64, f64)>> = nodes
                .iter()
                .map(|n| worst_over_cpus(n, "wakeup_p99_seconds"))
                .collect();
            let p99: Vec<&[(i64, f64)]> = p99.iter().map(Vec::as_slice).collect();
            let lines = node_lines(names, &p99, ctx.max_points, Reduce::Max);
            let _ = write!(
                h,
                "<h3>Wake-up p99 per node</h3>{}",
                svg::line_chart("jitter-p99", &lines, Unit::Seconds, None, &[])
            );
        } else if let Some(node) = nodes.first() {
            let lines: Vec<Line> = quantile_fields
                .iter()
                .enumerate()
                .map(|(i, (label, field))| Line::new(*label, worst_over_cpus(node, field), i))
                .collect();
            let _ = write!(
                h,
                "<h3>Wake-up latency quantiles over time</h3>{}",
                svg::line_chart("jitter-quantiles", &lines, Unit::Seconds, None, &[])
            );
        }
        // Lost time while the interruption probe spun, split by who took it.
        let lost = |node: &NodeData, field: &str| -> Vec<(i64, f64)> {
            shape::mean_by_time(node.rows("jitter").series_by("cpu", field).values())
        };
        let lost_note = "Share of the probe's spin time lost to gaps, mean over CPUs per window. Unexplained: what the guest's own accounting (run delay, irq, steal) does not show, taken by the hypervisor or the firmware.";
        if ctx.fleet {
            let unexplained: Vec<Vec<(i64, f64)>> =
                nodes.iter().map(|n| lost(n, "unexplained_ratio")).collect();
            let unexplained: Vec<&[(i64, f64)]> = unexplained.iter().map(Vec::as_slice).collect();
            let lines = node_lines(names, &unexplained, ctx.max_points, Reduce::Mean);
            let _ = write!(
                h,
                "<h3>Unexplained interruptions per node</h3><p class=\"note\">{lost_note}</p>{}",
                svg::line_chart("jitter-lost", &lines, Unit::Ratio, None, &[])
            );
        } else if let Some(node) = nodes.first() {
            let lines: Vec<Line> = [
                ("run delay", "run_delay_ratio"),
                ("irq", "irq_ratio"),
                ("steal", "steal_ratio"),
                ("unexplained", "unexplained_ratio"),
            ]
            .iter()
            .enumerate()
            .map(|(i, (label, field))| Line::new(*label, down(&lost(node, field), Reduce::Mean), i))
            .collect();
            let _ = write!(
                h,
                "<h3>Interruptions: who took the time</h3><p class=\"note\">{lost_note}</p>{}",
                svg::line_chart("jitter-lost", &lines, Unit::Ratio, None, &[])
            );
        }
        h.push_str(r#"<h3>Wake-up latency distribution over the range</h3><table><tr><th>node</th><th>wake-ups</th><th>p50</th><th>p90</th><th>p99</th><th>p99.9</th></tr>"#);
        for (node, s) in nodes.iter().zip(summaries.iter()) {
            // Folded from +0: an empty sum of f64 is -0, which prints "-0".
            let total: f64 = s.histogram.iter().fold(0.0, |sum, b| sum + b.1);
            let _ = write!(
                h,
                "<tr><td>{}</td><td class=\"num\">{total:.0}</td>",
                escape(&node.name)
            );
            for q in [0.5, 0.9, 0.99, 0.999] {
                let v = shape::histogram_quantile(q, &s.histogram).map_or("–".into(), |v| {
                    format!("≤ {}", format_value(v, Unit::Seconds))
                });
                let _ = write!(h, "<td class=\"num\">{v}</td>");
            }
            h.push_str("</tr>");
        }
        h.push_str("</table><p class=\"note\">Quantiles from the histogram buckets: upper bounds, interpolated within a bucket.</p>");
        // One distribution per node, or the fleet's summed when nodes are many.
        let fleet_histogram;
        let distributions: Vec<(&str, &shape::Histogram)> = if names.len() <= svg::PALETTE.len() {
            names
                .iter()
                .copied()
                .zip(summaries.iter().map(|s| &s.histogram))
                .collect()
        } else {
            fleet_histogram = shape::sum_histograms(summaries.iter().map(|s| &s.histogram));
            vec![("all nodes", &fleet_histogram)]
        };
        for (i, (node, histogram)) in distributions.into_iter().enumerate() {
            let bars: Vec<(String, f64)> = histogram
                .iter()
                .map(|&(le, n)| {
                    let label = if le.is_infinite() {
                        "more".to_string()
                    } else {
                        format!("≤{}", format_value(le, Unit::Seconds))
                    };
                    (label, n)
                })
                .collect();
            let _ = write!(
                h,
                "<h3>Distribution: {}</h3>{}",
                escape(node),
                svg::bar_chart(&format!("jitter-distribution-{i}"), &bars, Unit::Count)
            );
        }
        h.push_str("</section>");
    }

    /// Steal and pressure.
    fn host(&self, h: &mut String) {
        let (ctx, nodes, summaries, names) = self.parts();
        // Steal and pressure.
        h.push_str(r#"<section id="host"><h2>Steal and pressure</h2>"#);
        let steal_series: Vec<&[(i64, f64)]> =
            summaries.iter().map(|s| s.steal_ratio.as_slice()).collect();
        let steal = node_lines(names, &steal_series, ctx.max_points, Reduce::Mean);
        let _ = write!(
            h,
            "<h3>Steal: share of CPU time the hypervisor ran something else</h3>{}",
            svg::line_chart("steal", &steal, Unit::Ratio, None, &[])
        );
        // Pressure: a line per resource, and per node on a fleet (or the lowest,
        // median and highest node on a large one).
        type NodeSeries = (String, Vec<(i64, f64)>);
        let mut by_resource: BTreeMap<String, Vec<NodeSeries>> = BTreeMap::new();
        for n in nodes.iter() {
            for (resource, points) in n.rows("pressure").series_by("resource", "some_avg10_ratio") {
                by_resource
                    .entry(resource)
                    .or_default()
                    .push((n.name.clone(), points));
            }
        }
        let mut pressure = Vec::new();
        for (resource, per_node) in by_resource {
            let node_names: Vec<&str> = per_node.iter().map(|(n, _)| n.as_str()).collect();
            let series: Vec<&[(i64, f64)]> = per_node.iter().map(|(_, p)| p.as_slice()).collect();
            for line in node_lines(&node_names, &series, ctx.max_points, Reduce::Mean) {
                let label = if ctx.fleet {
                    format!("{resource}: {}", line.label)
                } else {
                    resource.clone()
                };
                let color = pressure.len();
                pressure.push(Line {
                    label,
                    color,
                    ..line
                });
            }
        }
        let _ = write!(
            h,
            "<h3>Pressure: share of the last 10 s with a task stalled (PSI some avg10)</h3>{}",
            svg::line_chart("pressure", &pressure, Unit::Ratio, None, &[])
        );
        h.push_str("</section>");
    }

    /// The first screen: the verdict, the tax as figures grouped by who
    /// takes it, and the top causes with their evidence.
    fn headline(&self, h: &mut String) {
        let (ctx, nodes, summaries, _) = self.parts();
        h.push_str(r#"<section id="headline">"#);
        let mut causes = Vec::new();
        if let (false, Some(s)) = (ctx.fleet, summaries.first()) {
            let _ = write!(
                h,
                r#"<h2>Verdict: <span class="verdict">{}</span></h2>"#,
                escape(&s.verdict)
            );
            h.push_str(r#"<ul class="who">"#);
            for (who, what) in who_takes(s) {
                let _ = write!(h, "<li><b>{who}</b>: {}</li>", escape(&what));
            }
            h.push_str(r#"</ul><div class="tiles">"#);
            for taker in Taker::ALL {
                let _ = write!(h, r#"<div class="group"><h3>{}</h3><div>"#, taker.title());
                for (field, figure) in TAX_FIELDS.iter().zip(&s.tax) {
                    if field.taker != taker {
                        continue;
                    }
                    tile(
                        h,
                        field.field,
                        &figure.text(field),
                        field.label,
                        &figure.note(field),
                        field.help,
                        figure.is_bad(field),
                    );
                }
                if taker == Taker::Hardware && !s.health.is_empty() {
                    let lost: Vec<&GpuHealth> = s.lost_gpus().collect();
                    let note = lost
                        .iter()
                        .map(|g| format!("GPU {}", g.index))
                        .collect::<Vec<_>>()
                        .join(", ");
                    tile(
                        h,
                        "gpus_lost",
                        &format!("{} of {}", lost.len(), s.health.len()),
                        "GPUs lost",
                        if lost.is_empty() { "all answering" } else { &note },
                        "GPUs that stopped answering (fell off the bus): their latest health row says so.",
                        !lost.is_empty(),
                    );
                }
                h.push_str("</div></div>");
            }
            h.push_str("</div>");
            causes = headline::causes(None, &s.health, &s.faults, &s.events);
        } else {
            let _ = write!(
                h,
                r#"<h2>Verdicts and tax</h2><p class="note">Per node over the range: the detector's verdict and its tax windows (means; wake-up p99 the median window).</p><table class="wide tax"><tr><th>node</th><th>verdict</th>"#
            );
            for field in TAX_FIELDS {
                let _ = write!(
                    h,
                    r#"<th title="{}">{}</th>"#,
                    escape(field.help),
                    field.label
                );
            }
            h.push_str("<th>GPUs</th></tr>");
            for (node, s) in nodes.iter().zip(summaries) {
                let _ = write!(
                    h,
                    r#"<tr><td>{}</td><td class="verdict-cell">{}</td>"#,
                    escape(&node.name),
                    escape(&s.verdict)
                );
                for (field, figure) in TAX_FIELDS.iter().zip(&s.tax) {
                    let _ = write!(
                        h,
                        r#"<td class="num{}" data-tax="{}">{}</td>"#,
                        if figure.is_bad(field) { " bad" } else { "" },
                        field.field,
                        figure.text(field)
                    );
                }
                let lost = s.lost_gpus().count() > 0;
                let _ = write!(
                    h,
                    r#"<td class="num{}">{}</td></tr>"#,
                    if lost { " bad" } else { "" },
                    s.gpu_count()
                );
                causes.extend(headline::causes(
                    Some(&node.name),
                    &s.health,
                    &s.faults,
                    &s.events,
                ));
            }
            h.push_str("</table>");
            headline::sort_causes(&mut causes);
        }
        h.push_str("<h3>Top causes</h3>");
        if causes.is_empty() {
            h.push_str(r#"<p class="no-events">No fault, lost GPU or noisy-neighbour event in this range.</p>"#);
        } else {
            h.push_str(r#"<ol class="causes">"#);
            for c in causes.iter().take(TOP_CAUSES) {
                let class = match c.kind {
                    CauseKind::Lost => "lost",
                    CauseKind::Fault => "fault",
                    CauseKind::Hypervisor => "hypervisor",
                    CauseKind::Neighbour => "neighbour",
                };
                let _ = write!(
                    h,
                    r#"<li class="cause"><span class="kind {class}">{}</span><b>{}</b>{}<span class="note">{}</span></li>"#,
                    c.kind.name(),
                    escape(&c.title),
                    if c.open { "" } else { " (closed)" },
                    escape(&c.evidence)
                );
            }
            h.push_str("</ol>");
            if causes.len() > TOP_CAUSES {
                let _ = write!(
                    h,
                    r##"<p class="note">{} more below, under <a href="#events">faults and events</a>.</p>"##,
                    causes.len() - TOP_CAUSES
                );
            }
        }
        h.push_str("</section>");
    }

    /// Each GPU's health: answering or lost, XIDs, ECC, clocks, temperature,
    /// PCIe and NVLink; on a node, its clocks and temperature over time.
    fn gpu_health(&self, h: &mut String) {
        let (ctx, nodes, summaries, _) = self.parts();
        if summaries.iter().all(|s| s.health.is_empty()) {
            return;
        }
        h.push_str(r#"<section id="gpu-health"><h2>GPU health</h2>"#);
        if ctx.fleet {
            h.push_str(
                r#"<p class="note">GPUs with anything to look at; the others are healthy.</p>"#,
            );
        }
        h.push_str(r#"<table class="wide health"><tr>"#);
        if ctx.fleet {
            h.push_str("<th>node</th>");
        }
        h.push_str("<th>GPU</th><th>state</th><th>XID</th><th>ECC corrected / uncorrected</th><th>SM clock of max</th><th>temperature</th><th>PCIe link</th><th>NVLink links up</th></tr>");
        let mut healthy = 0;
        for (node, s) in nodes.iter().zip(summaries) {
            for g in &s.health {
                if ctx.fleet && !g.troubled() {
                    healthy += 1;
                    continue;
                }
                health_row(h, ctx.fleet.then_some(node.name.as_str()), g);
            }
        }
        h.push_str("</table>");
        if healthy > 0 {
            let _ = write!(h, r#"<p class="note">{healthy} other GPUs healthy.</p>"#);
        }
        if let (false, Some(node), Some(summary)) = (ctx.fleet, nodes.first(), summaries.first()) {
            let gpu = node.rows("gpu");
            let (clock, max) = (gpu.field("sm_clock_hertz"), gpu.field("sm_clock_max_hertz"));
            let mut clocks: BTreeMap<String, Vec<(i64, f64)>> = BTreeMap::new();
            for (i, g) in gpu.tag("gpu").into_iter().enumerate() {
                if let (Some(c), Some(m)) = (clock[i], max[i]) {
                    if m > 0.0 {
                        clocks
                            .entry(g.to_owned())
                            .or_default()
                            .push((gpu.time_us[i], c / m));
                    }
                }
            }
            for v in clocks.values_mut() {
                v.sort_by_key(|p| p.0);
            }
            let reasons = |g: &GpuHealth| {
                if g.slowdowns.is_empty() {
                    String::new()
                } else {
                    format!(" ({})", g.slowdowns.join(", "))
                }
            };
            let _ = write!(
                h,
                "<h3>SM clock against its maximum</h3>{}",
                svg::line_chart(
                    "gpu-clock",
                    &gpu_lines(summary, clocks, &reasons, ctx.max_points),
                    Unit::Ratio,
                    Some(1.0),
                    &[]
                )
            );
            let temperature = gpu_lines(
                summary,
                gpu.series_by("gpu", "temperature_celsius"),
                &|_| String::new(),
                ctx.max_points,
            );
            let _ = write!(
                h,
                "<h3>Temperature</h3>{}",
                svg::line_chart("gpu-temperature", &temperature, Unit::Celsius, None, &[])
            );
            let errors = error_lines(&gpu, &node.rows("gpu_event"), self.from, ctx.max_points);
            h.push_str("<h3>XID, ECC and PCIe errors counted since the start of the range</h3>");
            if errors.is_empty() {
                h.push_str(r#"<p class="note" id="gpu-errors">No XID, ECC error or PCIe replay in the range.</p>"#);
            } else {
                h.push_str(&svg::line_chart(
                    "gpu-errors",
                    &errors,
                    Unit::Count,
                    None,
                    &[],
                ));
            }
        }
        h.push_str("</section>");
    }

    /// Faults of the node and noisy-neighbour events, on one timeline with
    /// a legend, then a table each.
    fn events(&self, h: &mut String) {
        let (ctx, nodes, summaries, _) = self.parts();
        let (from, until) = (self.from, self.until);
        h.push_str(r#"<section id="events"><h2>Faults and noisy-neighbour events</h2>"#);
        let tagged = |pick: fn(&NodeSummary) -> &Vec<Event>| -> Vec<(&str, &Event)> {
            nodes
                .iter()
                .zip(summaries.iter())
                .flat_map(|(n, s)| pick(s).iter().map(move |e| (n.name.as_str(), e)))
                .collect()
        };
        let faults = tagged(|s| &s.faults);
        let events = tagged(|s| &s.events);
        // Kinds of span, with their colours: the legend under the timeline.
        const KINDS: [(&str, &str); 4] = [
            ("fault, open", "#d62728"),
            ("fault, closed", "#f4a6a6"),
            ("neighbour event, open", "#1f77b4"),
            ("neighbour event, closed", "#a6c8e6"),
        ];
        let mut lanes: Vec<String> = Vec::new();
        let mut spans = Vec::new();
        for (fault, list) in [(true, &faults), (false, &events)] {
            for (node, e) in list {
                let place = headline::place(&e.resource, &e.victim);
                let lane_name = if ctx.fleet {
                    format!("{node} · {place}")
                } else {
                    place
                };
                let lane = lanes
                    .iter()
                    .position(|l| *l == lane_name)
                    .unwrap_or_else(|| {
                        lanes.push(lane_name);
                        lanes.len() - 1
                    });
                let kind = usize::from(!fault) * 2 + usize::from(e.state != "open");
                spans.push(svg::Span {
                    lane,
                    start_us: e.start_us,
                    end_us: e.end_us.unwrap_or(until),
                    label: format!(
                        "{}: {} on {} ({}){}, score {}",
                        KINDS[kind].0,
                        headline::signal_words(&e.signal),
                        e.victim,
                        e.resource,
                        if fault {
                            String::new()
                        } else {
                            format!(", suspects {}", e.suspects)
                        },
                        e.score.map_or("–".into(), |s| format!("{s:.2}"))
                    ),
                    kind,
                });
            }
        }
        if !spans.is_empty() {
            let t0 = from.min(spans.iter().map(|s| s.start_us).min().unwrap_or(from));
            let _ = write!(
                h,
                "{}",
                svg::timeline("events-timeline", &lanes, &spans, &KINDS, t0, until)
            );
        }
        let node_th = if ctx.fleet { "<th>node</th>" } else { "" };
        let node_td = |node: &str| {
            if ctx.fleet {
                format!("<td>{}</td>", escape(node))
            } else {
                String::new()
            }
        };
        let num = |v: Option<f64>| v.map_or("–".into(), |v| format!("{v:.2}"));
        let when = |e: &Event| {
            format!(
                "{} – {}",
                format_time(e.start_us, true),
                e.end_us.map_or("open".into(), |t| format_time(t, false))
            )
        };
        h.push_str(r#"<h3>Faults of the node</h3><p class="note">Hardware and platform faults: a link trained down, NVLink links missing, a clock held down, port errors. No workload is their suspect.</p>"#);
        if faults.is_empty() {
            h.push_str(r#"<p class="no-faults">No faults recorded.</p>"#);
        } else {
            let _ = write!(
                h,
                r#"<table class="wide"><tr>{node_th}<th>when (UTC)</th><th>where</th><th>what</th><th>score</th><th>evidence</th></tr>"#
            );
            for (node, e) in &faults {
                let _ = write!(
                    h,
                    r#"<tr class="fault">{}<td>{}</td><td>{}</td><td>{}<br><code>{}</code></td><td class="num">{}</td><td class="text">{}</td></tr>"#,
                    node_td(node),
                    when(e),
                    escape(&headline::place(&e.resource, &e.victim)),
                    escape(headline::signal_words(&e.signal)),
                    escape(&e.signal),
                    num(e.score),
                    escape(&e.evidence),
                );
            }
            h.push_str("</table>");
        }
        h.push_str("<h3>Noisy-neighbour events</h3>");
        if events.is_empty() {
            let why = if ctx.events_known {
                ""
            } else {
                " (this build of vtax has no detector table)"
            };
            let _ = write!(
                h,
                r#"<p class="no-events">No noisy-neighbour events recorded{why}.</p>"#
            );
        } else {
            let _ = write!(
                h,
                r#"<table class="wide"><tr>{node_th}<th>when (UTC)</th><th>where</th><th>signal</th><th>suspects</th><th>score · r · effect</th><th>evidence</th></tr>"#
            );
            for (node, e) in &events {
                let suspects = if e.suspects.is_empty() {
                    "none correlates".to_string()
                } else {
                    e.suspects
                        .split("; ")
                        .map(escape)
                        .collect::<Vec<_>>()
                        .join("<br>")
                };
                let _ = write!(
                    h,
                    r#"<tr class="event">{}<td>{}</td><td>{}</td><td>{}</td><td class="text">{suspects}</td><td class="num">{} · {} · {}</td><td class="text">{}</td></tr>"#,
                    node_td(node),
                    when(e),
                    escape(&headline::place(&e.resource, &e.victim)),
                    escape(&e.signal),
                    num(e.score),
                    num(e.top_correlation),
                    num(e.effect_size),
                    escape(&e.evidence),
                );
            }
            h.push_str("</table>");
        }
        h.push_str("</section>");
    }
}

/// Causes the headline lists; the rest are in the events section.
const TOP_CAUSES: usize = 5;

/// One figure of the headline.
fn tile(h: &mut String, id: &str, figure: &str, what: &str, note: &str, help: &str, bad: bool) {
    let _ = write!(
        h,
        r#"<div class="tile{}" data-tax="{id}" title="{}"><span class="figure">{}</span><span class="what">{}</span><span class="note">{}</span></div>"#,
        if bad { " bad" } else { "" },
        escape(help),
        escape(figure),
        escape(what),
        escape(note),
    );
}

/// Who takes the difference, in a line each: the hypervisor, the hardware,
/// the neighbours.
fn who_takes(s: &NodeSummary) -> Vec<(&'static str, String)> {
    let figure = |name: &str| {
        TAX_FIELDS
            .iter()
            .position(|f| f.field == name)
            .map(|i| (&TAX_FIELDS[i], s.tax[i]))
    };
    let text = |name: &str| figure(name).map_or("–".into(), |(f, v)| v.text(f));
    let bad = |name: &str| figure(name).is_some_and(|(f, v)| v.is_bad(f));
    let mut out = Vec::new();
    let hypervisor = if s.tax.iter().all(|f| f.windows == 0) {
        "no detector windows in this range (was the detector off?)".to_string()
    } else if bad("steal_ratio") || bad("unexplained_ratio") {
        format!(
            "{} of CPU time stolen, {} of the probe's time lost where the guest cannot see why",
            text("steal_ratio"),
            text("unexplained_ratio")
        )
    } else {
        format!(
            "nothing material (steal {}, unexplained {})",
            text("steal_ratio"),
            text("unexplained_ratio")
        )
    };
    out.push(("The hypervisor", hypervisor));
    let mut hardware = Vec::new();
    let lost: Vec<String> = s.lost_gpus().map(|g| format!("GPU {}", g.index)).collect();
    if !lost.is_empty() {
        hardware.push(format!("{} lost", lost.join(", ")));
    }
    for (field, what) in [
        ("nvlink_links_missing_ratio", "of NVLink links missing"),
        (
            "pcie_bandwidth_loss_ratio",
            "of PCIe bandwidth lost on the worst busy GPU",
        ),
        (
            "gpu_clock_throttle_ratio",
            "of SM clock throttled on the worst GPU",
        ),
    ] {
        if bad(field) {
            hardware.push(format!("{} {what}", text(field)));
        }
    }
    out.push((
        "The hardware",
        if hardware.is_empty() {
            "nothing lost".to_string()
        } else {
            hardware.join("; ")
        },
    ));
    let neighbours = match s.events.len() {
        0 => "no noisy-neighbour events".to_string(),
        n => {
            let open = s.events.iter().filter(|e| e.state == "open").count();
            let mut suspects: Vec<&str> = s
                .events
                .iter()
                .filter_map(|e| headline::first_suspect(&e.suspects))
                .collect();
            suspects.sort();
            suspects.dedup();
            format!(
                "{n} events ({open} open){}",
                if suspects.is_empty() {
                    String::new()
                } else {
                    format!(", suspects {}", suspects.join(", "))
                }
            )
        }
    };
    out.push(("Neighbours", neighbours));
    out
}

/// A row of the GPU health table.
fn health_row(h: &mut String, node: Option<&str>, g: &GpuHealth) {
    let cell = |bad: bool, text: String| {
        format!(
            "<td{}>{text}</td>",
            if bad { r#" class="bad""# } else { "" }
        )
    };
    let lost = g.lost_since.is_some();
    let _ = write!(
        h,
        r#"<tr class="gpu{}" data-gpu="{}" data-state="{}">"#,
        if lost { " lost" } else { "" },
        escape(&g.index),
        if lost { "lost" } else { "up" }
    );
    if let Some(node) = node {
        let _ = write!(h, "<td>{}</td>", escape(node));
    }
    let _ = write!(
        h,
        r#"<td><b style="color:{}">GPU {}</b><br><span class="note">{}</span></td>"#,
        svg::PALETTE[g.number() % svg::PALETTE.len()],
        escape(&g.index),
        escape(&g.bus_id)
    );
    h.push_str(&cell(
        lost,
        match g.lost_since {
            Some(t) => format!("<b>lost</b> at {}", format_time(t, true)),
            None => "up".into(),
        },
    ));
    let xids = if g.xids.is_empty() {
        g.last_xid
            .map_or("none".into(), |x| format!("last {x} (before this range)"))
    } else {
        g.xids
            .iter()
            .map(|(code, n)| format!("{code} ×{n}"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    h.push_str(&cell(!g.xids.is_empty(), xids));
    let counter = |c: Option<health::Counter>| {
        c.map_or("–".into(), |c| {
            if c.increase > 0.0 {
                format!("{:.0} (+{:.0})", c.last, c.increase)
            } else {
                format!("{:.0}", c.last)
            }
        })
    };
    let mut ecc = format!(
        "{} / {}",
        counter(g.ecc_corrected),
        counter(g.ecc_uncorrected)
    );
    if let Some(r) = g.remapping {
        let _ = write!(ecc, "; row remapping {r}");
    }
    h.push_str(&cell(
        g.ecc_uncorrected.is_some_and(|c| c.increase > 0.0) || g.remapping.is_some(),
        ecc,
    ));
    let mut clock = g
        .clock_ratio
        .map_or("–".into(), |r| format_value(r, Unit::Ratio));
    if !g.slowdowns.is_empty() {
        let _ = write!(clock, "<br>{}", g.slowdowns.join(", "));
    }
    h.push_str(&cell(!g.slowdowns.is_empty(), clock));
    h.push_str(&cell(
        false,
        g.temperature_max.map_or("–".into(), |t| {
            format!("max {}", format_value(t, Unit::Celsius))
        }),
    ));
    let pcie = g.pcie.map_or("–".into(), |p| {
        let now = format!("Gen{} x{}", p.gen, p.width);
        let max = format!("Gen{} x{}", p.gen_max, p.width_max);
        let mut text = match (p.degraded(), p.under_load) {
            (true, _) => format!("{now} of {max} under load"),
            (false, true) => now,
            (false, false) => format!("{now} of {max} (idle)"),
        };
        if let Some(r) = g.pcie_replays.filter(|r| r.increase > 0.0) {
            let _ = write!(text, "<br>replays +{:.0}", r.increase);
        }
        text
    });
    h.push_str(&cell(g.pcie.is_some_and(|p| p.degraded()), pcie));
    h.push_str(&cell(
        g.nvlink_missing(),
        g.nvlink.map_or("–".into(), |(up, product)| {
            if up < product {
                format!("{up} of {product}: hidden or down")
            } else {
                format!("{up} of {product}")
            }
        }),
    ));
    h.push_str("</tr>");
}

#[cfg(test)]
mod tests;
