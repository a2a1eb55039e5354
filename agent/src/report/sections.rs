//! The report's sections of measurements: the platform, GPU utilisation,
//! HBM and NVLink, jitter, steal and pressure.

use super::*;

impl Sections<'_> {
    /// The summary table per node and each node's verdict with its evidence.
    pub(super) fn platform(&self, h: &mut String) {
        let (ctx, nodes, summaries, _) = self.parts();
        // Summary and verdicts.
        h.push_str(r#"<section id="platform"><h2>Platform</h2><table class="wide"><tr><th>node</th><th>verdict</th><th>GPUs</th><th>GPU busy</th><th>HBM of peak, busy</th><th>NVLink of peak, busy</th><th>wake-up p99 over the range</th><th>steal</th><th>faults</th><th>events</th></tr>"#);
        for (node, s) in nodes.iter().zip(summaries.iter()) {
            let pct = |p: &[(i64, f64)]| {
                shape::mean(p).map_or("–".into(), |v| format_value(v, Unit::Ratio))
            };
            let p99 = shape::histogram_quantile(0.99, &s.histogram).map_or("–".into(), |p| match p
            {
                shape::Quantile::Within(v) => format_value(v, Unit::Seconds),
                above => above.text(|v| format_value(v, Unit::Seconds)),
            });
            let _ = write!(
                h,
                r#"<tr><td class="text">{}</td><td class="verdict-cell">{}</td><td class="num">{}</td><td class="num">{}</td><td class="num">{}</td><td class="num">{}</td><td class="num">{p99}</td><td class="num">{}</td><td class="num">{}</td><td class="num">{}</td></tr>"#,
                escape(&node.name),
                escape(&s.verdict),
                s.gpu_count(),
                pct(&s.utilization),
                pct(&s.hbm_ratio),
                pct(&s.nvlink_ratio),
                s.steal_over_range
                    .map_or("–".into(), |v| format_value(v, Unit::Ratio)),
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
    pub(super) fn gpus(&self, h: &mut String) {
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
                    "HBM bandwidth against peak, while busy",
                    per_node(&|s| &s.hbm_ratio),
                ),
                (
                    "gpu-nvlink",
                    "NVLink rx+tx against peak, while busy",
                    per_node(&|s| &s.nvlink_ratio),
                ),
            ] {
                let _ = write!(
                    h,
                    "<h3>{title}</h3>{}",
                    self.chart(id, &lines, Unit::Ratio, Some(1.0), &[])
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
                self.chart("gpu-utilization", &util, Unit::Ratio, Some(1.0), &[])
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
                self.chart("gpu-hbm", &hbm, Unit::BytesPerSecond, None, &peaks)
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
                self.chart(
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
    pub(super) fn jitter(&self, h: &mut String) {
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
                self.chart("jitter-p99", &lines, Unit::Seconds, None, &[])
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
                self.chart("jitter-quantiles", &lines, Unit::Seconds, None, &[])
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
                self.chart("jitter-lost", &lines, Unit::Ratio, None, &[])
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
                self.chart("jitter-lost", &lines, Unit::Ratio, None, &[])
            );
        }
        h.push_str(r#"<h3>Wake-up latency distribution over the range</h3><table><tr><th>node</th><th>wake-ups</th><th>p50</th><th>p90</th><th>p99</th><th>p99.9</th></tr>"#);
        for (node, s) in nodes.iter().zip(summaries.iter()) {
            // Folded from +0: an empty sum of f64 is -0, which prints "-0".
            let total: f64 = s.histogram.iter().fold(0.0, |sum, b| sum + b.1);
            let _ = write!(
                h,
                "<tr><td class=\"text\">{}</td><td class=\"num\">{total:.0}</td>",
                escape(&node.name)
            );
            for q in [0.5, 0.9, 0.99, 0.999] {
                let v = shape::histogram_quantile(q, &s.histogram)
                    .map_or("–".into(), |p| p.text(|v| format_value(v, Unit::Seconds)));
                let _ = write!(h, "<td class=\"num\">{v}</td>");
            }
            h.push_str("</tr>");
        }
        h.push_str("</table><p class=\"note\">Quantiles from the histogram buckets, interpolated within a bucket; past the last bound the buckets say only that a quantile is larger.</p>");
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
    pub(super) fn host(&self, h: &mut String) {
        let (ctx, nodes, summaries, names) = self.parts();
        // Steal and pressure.
        h.push_str(r#"<section id="host"><h2>Steal and pressure</h2>"#);
        let steal_series: Vec<&[(i64, f64)]> =
            summaries.iter().map(|s| s.steal_ratio.as_slice()).collect();
        let steal = node_lines(names, &steal_series, ctx.max_points, Reduce::Mean);
        let _ = write!(
            h,
            "<h3>Steal: share of CPU time the hypervisor ran something else</h3>{}",
            self.chart("steal", &steal, Unit::Ratio, None, &[])
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
            self.chart("pressure", &pressure, Unit::Ratio, None, &[])
        );
        h.push_str("</section>");
    }
}
