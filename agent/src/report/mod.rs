//! `vtax report`: one self-contained HTML file (inline CSS, SVG and a few lines
//! of script, nothing fetched) for a time range of a node's store or of a fleet
//! copy (`tables/<table>/node=<node>/date=.../`): the platform verdict, GPU
//! utilisation, HBM and NVLink against their peaks, jitter distributions and
//! quantiles over time, steal and pressure, and noisy-neighbour events.

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
        ]),
    ),
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
    let reads: Vec<_> = READS
        .iter()
        .filter(|(t, _)| catalog.get(t).is_some())
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
                fields: fields.map(|f| f.iter().map(|s| s.to_string()).collect()),
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
    gpus: usize,
    utilization: Vec<(i64, f64)>,
    hbm_ratio: Vec<(i64, f64)>,
    nvlink_ratio: Vec<(i64, f64)>,
    steal_ratio: Vec<(i64, f64)>,
    histogram: shape::Histogram,
    events: Vec<Event>,
}

/// A noisy-neighbour event as the detector writes it.
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

/// Per GPU: `(time, a / b)` where both columns have values and b > 0.
fn ratio_by_gpu(
    gpu: &Rows,
    numerator: &[&str],
    denominator: impl Fn(usize) -> Option<f64>,
) -> BTreeMap<String, Vec<(i64, f64)>> {
    let columns: Vec<_> = numerator.iter().map(|f| gpu.field(f)).collect();
    let mut out: BTreeMap<String, Vec<(i64, f64)>> = BTreeMap::new();
    for (i, g) in gpu.tag("gpu").into_iter().enumerate() {
        let sum: Option<f64> = columns.iter().map(|c| c[i]).sum();
        if let (Some(n), Some(d)) = (sum, denominator(i)) {
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

fn summarize(node: &NodeData) -> NodeSummary {
    let gpu = node.rows("gpu");
    let gpu_info = node.rows("gpu_info");
    let (verdict, evidence) =
        platform_verdict(node.rows("platform_host"), node.rows("platform"), gpu_info);
    let utilization_by_gpu = gpu.series_by("gpu", "utilization_ratio");
    let peak = gpu.field("hbm_peak_bytes_per_second");
    let hbm = ratio_by_gpu(gpu, &["hbm_bytes_per_second"], |i| peak[i]);
    let nvlink_peak = gpu.field("nvlink_peak_bytes_per_second");
    let nvlink = ratio_by_gpu(
        gpu,
        &[
            "nvlink_total_rx_bytes_per_second",
            "nvlink_total_tx_bytes_per_second",
        ],
        |i| nvlink_peak[i],
    );
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
    NodeSummary {
        verdict,
        evidence,
        gpus: utilization_by_gpu.len().max(hbm.len()),
        utilization: shape::mean_by_time(utilization_by_gpu.values()),
        hbm_ratio: shape::mean_by_time(hbm.values()),
        nvlink_ratio: shape::mean_by_time(nvlink.values()),
        steal_ratio: shape::mean_by_time(&steal_rates),
        histogram: shape::histogram_from_cumulative(&cumulative),
        events: events(node.rows(EVENTS_TABLE)),
    }
}

const CSS: &str = r#"
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",sans-serif;margin:0;color:#1d1d1f;background:#f6f7f9}
header{background:#1d2733;color:#fff;padding:18px 28px}header h1{margin:0 0 4px;font-size:22px}
header p{margin:0;color:#c9d1db}main{padding:8px 28px 40px;max-width:1100px}
section{background:#fff;border-radius:8px;box-shadow:0 1px 3px rgba(0,0,0,.08);margin:18px 0;padding:14px 20px}
h2{font-size:18px;margin:4px 0 10px}h3{font-size:15px;margin:16px 0 4px}
table{border-collapse:collapse;margin:6px 0}td,th{padding:4px 10px;border-bottom:1px solid #eee;text-align:left;vertical-align:top}
th{font-weight:600;color:#444}td.num{text-align:right;font-variant-numeric:tabular-nums}
.verdict{font-weight:600}details{margin:8px 0}summary{cursor:pointer;padding:4px 0}.legend span{margin-right:14px;font-size:12px;white-space:nowrap}
.legend i{display:inline-block;width:12px;height:3px;margin:0 5px 3px 0;vertical-align:middle}
.note{color:#666;font-size:12px}.no-data,.no-events{color:#666;font-style:italic}
svg.plot{display:block;background:#fff;overflow:visible}svg text{fill:#333}
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
            .map(|(name, points)| Line {
                label: name.to_string(),
                points: shape::downsample(points, max_points, reduce),
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
    .map(|(label, points)| Line {
        label: label.into(),
        points,
    })
    .collect()
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
    sections.platform(&mut h);
    sections.gpus(&mut h);
    sections.jitter(&mut h);
    sections.host(&mut h);
    sections.events(&mut h);
    h.push_str("</section></main>");
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
        h.push_str(r#"<section id="platform"><h2>Platform</h2><table><tr><th>node</th><th>verdict</th><th>GPUs</th><th>GPU busy</th><th>HBM of peak</th><th>NVLink of peak</th><th>wake-up p99</th><th>steal</th><th>events</th></tr>"#);
        for (node, s) in nodes.iter().zip(summaries.iter()) {
            let pct = |p: &[(i64, f64)]| {
                shape::mean(p).map_or("–".into(), |v| format_value(v, Unit::Ratio))
            };
            let p99 = shape::histogram_quantile(0.99, &s.histogram)
                .map_or("–".into(), |v| format_value(v, Unit::Seconds));
            let _ = write!(
                h,
                r#"<tr><td>{}</td><td class="verdict-cell">{}</td><td class="num">{}</td><td class="num">{}</td><td class="num">{}</td><td class="num">{}</td><td class="num">{p99}</td><td class="num">{}</td><td class="num">{}</td></tr>"#,
                escape(&node.name),
                escape(&s.verdict),
                s.gpus,
                pct(&s.utilization),
                pct(&s.hbm_ratio),
                pct(&s.nvlink_ratio),
                pct(&s.steal_ratio),
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
        let down = |p: &[(i64, f64)], r| shape::downsample(p, ctx.max_points, r);
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
        } else if let Some(node) = nodes.first() {
            let gpu = node.rows("gpu");
            let lines_of = |series: BTreeMap<String, Vec<(i64, f64)>>| -> Vec<Line> {
                series
                    .into_iter()
                    .map(|(g, p)| Line {
                        label: format!("GPU {g}"),
                        points: down(&p, Reduce::Mean),
                    })
                    .collect()
            };
            let util = lines_of(gpu.series_by("gpu", "utilization_ratio"));
            let _ = write!(
                h,
                "<h3>Utilisation (kernel running)</h3>{}",
                svg::line_chart("gpu-utilization", &util, Unit::Ratio, Some(1.0), &[])
            );
            let hbm = lines_of(gpu.series_by("gpu", "hbm_bytes_per_second"));
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
            let (rx, tx) = (
                gpu.field("nvlink_total_rx_bytes_per_second"),
                gpu.field("nvlink_total_tx_bytes_per_second"),
            );
            let mut nvlink: BTreeMap<String, Vec<(i64, f64)>> = BTreeMap::new();
            for (i, g) in gpu.tag("gpu").into_iter().enumerate() {
                if let (Some(r), Some(t)) = (rx[i], tx[i]) {
                    nvlink
                        .entry(g.to_owned())
                        .or_default()
                        .push((gpu.time_us[i], r + t));
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
            let _ = write!(
                h,
                "<h3>NVLink rx+tx against peak</h3>{}",
                svg::line_chart(
                    "gpu-nvlink",
                    &lines_of(nvlink),
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
                .map(|(label, field)| Line {
                    label: label.to_string(),
                    points: worst_over_cpus(node, field),
                })
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
            .map(|(label, field)| Line {
                label: label.to_string(),
                points: down(&lost(node, field), Reduce::Mean),
            })
            .collect();
            let _ = write!(
                h,
                "<h3>Interruptions: who took the time</h3><p class=\"note\">{lost_note}</p>{}",
                svg::line_chart("jitter-lost", &lines, Unit::Ratio, None, &[])
            );
        }
        h.push_str(r#"<h3>Wake-up latency distribution over the range</h3><table><tr><th>node</th><th>wake-ups</th><th>p50</th><th>p90</th><th>p99</th><th>p99.9</th></tr>"#);
        for (node, s) in nodes.iter().zip(summaries.iter()) {
            let total: f64 = s.histogram.iter().map(|b| b.1).sum();
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
                pressure.push(Line { label, ..line });
            }
        }
        let _ = write!(
            h,
            "<h3>Pressure: share of the last 10 s with a task stalled (PSI some avg10)</h3>{}",
            svg::line_chart("pressure", &pressure, Unit::Ratio, None, &[])
        );
        h.push_str("</section>");
    }

    /// Noisy-neighbour events on a timeline and in a table.
    fn events(&self, h: &mut String) {
        let (ctx, nodes, summaries, _) = self.parts();
        let (from, until) = (self.from, self.until);
        // Noisy neighbours.
        h.push_str(r#"<section id="events"><h2>Noisy-neighbour events</h2>"#);
        let all_events: Vec<(&str, &Event)> = nodes
            .iter()
            .zip(summaries.iter())
            .flat_map(|(n, s)| s.events.iter().map(move |e| (n.name.as_str(), e)))
            .collect();
        if all_events.is_empty() {
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
            let mut lanes: Vec<String> = Vec::new();
            let mut spans = Vec::new();
            for (node, e) in &all_events {
                let lane_name = format!("{node} · {} · {}", e.resource, e.victim);
                let lane = lanes
                    .iter()
                    .position(|l| *l == lane_name)
                    .unwrap_or_else(|| {
                        lanes.push(lane_name);
                        lanes.len() - 1
                    });
                spans.push(svg::Span {
                    lane,
                    start_us: e.start_us,
                    end_us: e.end_us.unwrap_or(until),
                    label: format!(
                        "{}: {} on {} ({}), suspects {}, score {}",
                        e.state,
                        e.signal,
                        e.victim,
                        e.resource,
                        e.suspects,
                        e.score.map_or("–".into(), |s| format!("{s:.2}"))
                    ),
                    color: if e.state == "open" { 1 } else { 0 },
                });
            }
            let t0 = from.min(spans.iter().map(|s| s.start_us).min().unwrap_or(from));
            let _ = write!(
                h,
                "{}",
                svg::timeline("events-timeline", &lanes, &spans, t0, until)
            );
            h.push_str("<table><tr><th>node</th><th>start</th><th>end</th><th>resource</th><th>victim</th><th>signal</th><th>suspects</th><th>score</th><th>top correlation</th><th>effect size</th><th>state</th><th>evidence</th></tr>");
            let num = |v: Option<f64>| v.map_or("–".into(), |v| format!("{v:.2}"));
            for (node, e) in &all_events {
                let _ = write!(
                    h,
                    r#"<tr class="event"><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td class="num">{}</td><td class="num">{}</td><td class="num">{}</td><td>{}</td><td>{}</td></tr>"#,
                    escape(node),
                    format_time(e.start_us, true),
                    e.end_us.map_or("open".into(), |t| format_time(t, true)),
                    escape(&e.resource),
                    escape(&e.victim),
                    escape(&e.signal),
                    escape(&e.suspects),
                    num(e.score),
                    num(e.top_correlation),
                    num(e.effect_size),
                    escape(&e.state),
                    escape(&e.evidence),
                );
            }
            h.push_str("</table>");
        }
    }
}

#[cfg(test)]
mod tests;
