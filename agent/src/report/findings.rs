//! The report's findings: the headline (verdict, tax, top causes), each
//! GPU's health, and the faults and noisy-neighbour events.

use super::*;

impl Sections<'_> {
    /// The first screen: the verdict, the tax as figures grouped by who
    /// takes it, and the top causes with their evidence.
    pub(super) fn headline(&self, h: &mut String) {
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
                    r#"<tr><td class="text">{}</td><td class="verdict-cell">{}</td>"#,
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
    pub(super) fn gpu_health(&self, h: &mut String) {
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
                self.chart(
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
                self.chart("gpu-temperature", &temperature, Unit::Celsius, None, &[])
            );
            // XIDs apart from the ECC and PCIe counts: on one axis with
            // hundreds of replays, an XID 79 (a GPU off the bus) was a line
            // under a pixel high.
            let known_until = node.known_until(self.until);
            let (xids, errors) = error_lines(
                gpu,
                node.rows("gpu_event"),
                (self.from, known_until),
                ctx.max_points,
            );
            for (title, id, lines, none) in [
                (
                    "XIDs counted since the start of the range",
                    "gpu-xids",
                    &xids,
                    "No XID in the range.",
                ),
                (
                    "ECC errors and PCIe replays counted since the start of the range",
                    "gpu-errors",
                    &errors,
                    "No ECC error or PCIe replay in the range.",
                ),
            ] {
                let _ = write!(h, "<h3>{title}</h3>");
                if lines.is_empty() {
                    let _ = write!(h, r#"<p class="note" id="{id}">{none}</p>"#);
                } else {
                    h.push_str(&self.chart(id, lines, Unit::Count, None, &[]));
                }
            }
        }
        h.push_str("</section>");
    }

    /// Faults of the node and noisy-neighbour events, on one timeline with
    /// a legend, then a table each.
    pub(super) fn events(&self, h: &mut String) {
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
        // An open event is drawn to its node's last row, not to the range's
        // end: past it nothing says the event went on (an agent stopped at
        // 10:47 drew its open faults to 11:00).
        let known_until: BTreeMap<&str, i64> = nodes
            .iter()
            .map(|n| (n.name.as_str(), n.known_until(until)))
            .collect();
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
                let kind = usize::from(!fault) * 2 + usize::from(!e.is_open());
                spans.push(svg::Span {
                    lane,
                    start_us: e.start_us,
                    end_us: e
                        .end_us
                        .unwrap_or_else(|| known_until.get(node).copied().unwrap_or(until))
                        .max(e.start_us),
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
                format!(r#"<td class="text">{}</td>"#, escape(node))
            } else {
                String::new()
            }
        };
        let num = |v: Option<f64>| v.map_or("–".into(), |v| format!("{v:.2}"));
        let when = |e: &Event| {
            // The end's date where it is not the start's: a day-long event
            // read "10:49:58 – 10:50:06", eight seconds.
            let day = |t: i64| t.div_euclid(vtax_store::DAY_US);
            format!(
                "{} – {}",
                format_time(e.start_us, true),
                e.end_us
                    .map_or("open".into(), |t| format_time(t, day(t) != day(e.start_us)))
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
                    r#"<tr class="fault">{}<td>{}</td><td class="text">{}</td><td>{}<br><code>{}</code></td><td class="num">{}</td><td class="text">{}</td></tr>"#,
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
                    match crate::detect::suspect_text::parse(&e.suspects) {
                        parsed if parsed.is_empty() => escape(&e.suspects),
                        parsed => parsed
                            .iter()
                            .map(|s| escape(&crate::detect::suspect_text::display(s)))
                            .collect::<Vec<_>>()
                            .join("<br>"),
                    }
                };
                let _ = write!(
                    h,
                    r#"<tr class="event">{}<td>{}</td><td class="text">{}</td><td>{}</td><td class="text">{suspects}</td><td class="num">{} · {} · {}</td><td class="text">{}</td></tr>"#,
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
pub(super) fn tile(
    h: &mut String,
    id: &str,
    figure: &str,
    what: &str,
    note: &str,
    help: &str,
    bad: bool,
) {
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
pub(super) fn who_takes(s: &NodeSummary) -> Vec<(&'static str, String)> {
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
        // A probe on CPUs that halt between its spins loses more than one on
        // busy CPUs (bench/jitter/vs_oslat.py): say which it was.
        let regime = match figure("jitter_busy_ratio") {
            Some((field, busy)) if busy.value.is_some() => {
                format!(", on probed CPUs {} busy", busy.text(field))
            }
            _ => String::new(),
        };
        format!(
            "{} of CPU time stolen, {} of the probe's time lost where the guest cannot see why{regime}",
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
    let no_windows = s.tax.iter().all(|f| f.windows == 0);
    out.push((
        "The hardware",
        if hardware.is_empty() && no_windows {
            // Nothing to judge by is not nothing lost (a range in a gap).
            "no detector windows in this range to judge it by".to_string()
        } else if hardware.is_empty() {
            "nothing lost".to_string()
        } else {
            hardware.join("; ")
        },
    ));
    let neighbours = match s.events.len() {
        // No event where the detector did not run is no evidence of none.
        0 if no_windows => "no detector windows in this range to judge them by".to_string(),
        0 => "no noisy-neighbour events".to_string(),
        n => {
            let open = s.events.iter().filter(|e| e.is_open()).count();
            let mut suspects: Vec<String> = s
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
pub(super) fn health_row(h: &mut String, node: Option<&str>, g: &GpuHealth) {
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
        let _ = write!(h, r#"<td class="text">{}</td>"#, escape(node));
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
            Some(t) if g.lost_before => {
                format!("<b>lost</b> at or before {}", format_time(t, true))
            }
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
