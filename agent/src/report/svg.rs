//! Inline SVG charts, drawn by hand: the report is one file that opens with no
//! network, and these few shapes need no plotting library.

use std::fmt::Write;

/// Plot area size in SVG units; the page scales the SVG to its width.
const WIDTH: f64 = 860.0;
const HEIGHT: f64 = 260.0;
const LEFT: f64 = 78.0;
const RIGHT: f64 = 16.0;
const TOP: f64 = 14.0;
const BOTTOM: f64 = 34.0;

/// Line colours, distinguishable and readable on white.
pub const PALETTE: &[&str] = &[
    "#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf",
    "#7f7f7f", "#bcbd22",
];

/// Stroke patterns that tell apart lines past the palette's length: line
/// `i` is drawn in colour `i % 10` with pattern `i / 10`, so a node of 16
/// GPUs (or a fleet of 40 nodes) has no two lines alike.
const DASHES: &[&str] = &["", "7 3", "2 3", "9 3 2 3"];

/// The colour and stroke pattern (`""` for solid) of line `index`.
pub fn line_style(index: usize) -> (&'static str, &'static str) {
    (
        PALETTE[index % PALETTE.len()],
        DASHES[(index / PALETTE.len()) % DASHES.len()],
    )
}

/// How a value prints on an axis or in a tooltip.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Unit {
    /// A share: 0.25 prints as 25%.
    Ratio,
    /// Bytes per second, decimal prefixes (the GPU vendors' peaks are decimal).
    BytesPerSecond,
    /// Seconds, printed in µs or ms when small.
    Seconds,
    /// A count.
    Count,
    /// Degrees Celsius.
    Celsius,
}

/// Formats a value in its unit, three significant digits or so.
pub fn format_value(v: f64, unit: Unit) -> String {
    match unit {
        Unit::Ratio => format!("{}%", trim(v * 100.0)),
        Unit::BytesPerSecond => si(v, "B/s"),
        Unit::Seconds => {
            let a = v.abs();
            if a == 0.0 {
                "0 s".into()
            } else if a < 1e-3 {
                format!("{} µs", trim(v * 1e6))
            } else if a < 1.0 {
                format!("{} ms", trim(v * 1e3))
            } else {
                format!("{} s", trim(v))
            }
        }
        Unit::Count => si(v, ""),
        Unit::Celsius => format!("{} °C", trim(v)),
    }
}

fn si(v: f64, suffix: &str) -> String {
    let a = v.abs();
    let (scale, prefix) = [(1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")]
        .into_iter()
        .find(|(s, _)| a >= *s)
        .unwrap_or((1.0, ""));
    let space = if suffix.is_empty() && prefix.is_empty() {
        ""
    } else {
        " "
    };
    format!("{}{space}{prefix}{suffix}", trim(v / scale))
}

fn trim(v: f64) -> String {
    let a = v.abs();
    let s = if a >= 100.0 || a == 0.0 {
        format!("{v:.0}")
    } else if a >= 10.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.2}")
    };
    if s.contains('.') {
        s.trim_end_matches('0').trim_end_matches('.').to_owned()
    } else {
        s
    }
}

/// Escapes text for HTML and SVG. A character that would act on the text
/// around it (a direction override in a cgroup's name reverses what
/// follows, the name of the job it accuses included) is shown as its
/// escape, `\u{202e}`.
pub fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c if crate::acts_on_text(c) => out.extend(c.escape_default()),
            c => out.push(c),
        }
    }
    out
}

/// `HH:MM:SS` (UTC) of a time, or the date too when the range spans days.
pub fn format_time(t_us: i64, with_date: bool) -> String {
    let time = std::time::UNIX_EPOCH + std::time::Duration::from_micros(t_us.max(0) as u64);
    let text = humantime::format_rfc3339_seconds(time).to_string(); // 2025-11-21T10:00:00Z
    if with_date {
        text.replace('T', " ").trim_end_matches('Z').to_owned()
    } else {
        text.get(11..19).unwrap_or(&text).to_owned()
    }
}

/// One line on a chart.
#[derive(Clone, Debug)]
pub struct Line {
    /// Legend label.
    pub label: String,
    /// `(time µs, value)` in time order.
    pub points: Vec<(i64, f64)>,
    /// Index into [`PALETTE`]: a GPU's index, so each GPU keeps its colour
    /// from chart to chart.
    pub color: usize,
    /// A count of events, its points where it changed: never broken at a
    /// gap (the count held between them).
    pub events: bool,
}

impl Line {
    /// A line of `points` drawn in colour `color` of the palette.
    pub fn new(label: impl Into<String>, points: Vec<(i64, f64)>, color: usize) -> Line {
        Line {
            label: label.into(),
            points,
            color,
            events: false,
        }
    }

    /// A count of events that happened at `times` (sorted), as steps from
    /// `from` to `until`: flat between events, up by one at each.
    pub fn events(
        label: impl Into<String>,
        times: &[i64],
        from: i64,
        until: i64,
        color: usize,
    ) -> Line {
        let mut points = vec![(from.min(times.first().copied().unwrap_or(from)), 0.0)];
        for (n, &t) in times.iter().enumerate() {
            points.push((t, n as f64));
            points.push((t, n as f64 + 1.0));
        }
        let last = times.last().copied().unwrap_or(from);
        points.push((until.max(last), times.len() as f64));
        Line {
            label: label.into(),
            points,
            color,
            events: true,
        }
    }
}

/// Times its usual spacing two points of a line may be apart and still be
/// joined. Rows come every tick, downsampled to the same step, so a longer
/// gap is time without data (the agent stopped, the GPU was lost).
pub const GAP_SPACINGS: i64 = 3;

/// The longest step between two points of `points` that is no gap: the
/// median step times [`GAP_SPACINGS`].
fn gap_after(points: &[(i64, f64)]) -> i64 {
    let mut steps: Vec<i64> = points.windows(2).map(|w| w[1].0 - w[0].0).collect();
    if steps.is_empty() {
        return i64::MAX;
    }
    let mid = steps.len() / 2;
    let (_, median, _) = steps.select_nth_unstable(mid);
    median.saturating_mul(GAP_SPACINGS).max(1)
}

/// A horizontal reference line, such as a peak.
#[derive(Clone, Debug)]
pub struct Reference {
    /// What it is, e.g. "HBM peak".
    pub label: String,
    /// Its value.
    pub value: f64,
}

/// A time-series line chart: an `<svg class="plot">` and its legend, its time
/// axis `span` (the report's range, so every chart and the timeline share
/// one axis) or, without one, its points'. No lines with points gives a "no
/// data" note instead, never an empty frame. A line without points still has
/// its legend entry (a GPU that stopped answering). A line is broken where
/// its points are more than [`GAP_SPACINGS`] of its usual spacing apart: a
/// straight line across seven minutes without data drew a ramp nobody
/// measured.
pub fn line_chart(
    span: Option<(i64, i64)>,
    id: &str,
    lines: &[Line],
    unit: Unit,
    y_max: Option<f64>,
    references: &[Reference],
) -> String {
    let points = lines.iter().map(|l| l.points.len()).sum::<usize>();
    if points == 0 {
        return no_data(id);
    }
    let all = lines.iter().flat_map(|l| l.points.iter());
    let data = (
        all.clone().map(|p| p.0).min().unwrap_or(0),
        all.clone().map(|p| p.0).max().unwrap_or(0),
    );
    let (t0, t1) = span.map_or(data, |(from, until)| (from.min(data.0), until.max(data.1)));
    let t1 = t1.max(t0 + 1);
    let data_max = all
        .map(|p| p.1)
        .chain(references.iter().map(|r| r.value))
        .fold(0.0f64, f64::max);
    let (y1, step) = nice_scale(y_max.unwrap_or(data_max));
    let (x, y) = scales(t0, t1, 0.0, y1);
    let mut svg = open_svg(id, "line", points);
    axes(&mut svg, t0, t1, y1, step, unit);
    for r in references {
        let py = y(r.value);
        let _ = write!(
            svg,
            r##"<line class="reference" x1="{LEFT}" x2="{:.1}" y1="{py:.1}" y2="{py:.1}" stroke="#444" stroke-dasharray="6 4"><title>{}: {}</title></line><text x="{:.1}" y="{:.1}" font-size="11" text-anchor="end" fill="#444">{}</text>"##,
            WIDTH - RIGHT,
            escape(&r.label),
            format_value(r.value, unit),
            WIDTH - RIGHT - 4.0,
            py - 4.0,
            escape(&r.label),
        );
    }
    for line in lines {
        if line.points.is_empty() {
            continue;
        }
        let (color, dash) = line_style(line.color);
        let dash = if dash.is_empty() {
            String::new()
        } else {
            format!(r#" stroke-dasharray="{dash}""#)
        };
        let mut d = String::new();
        let gap = if line.events {
            i64::MAX
        } else {
            gap_after(&line.points)
        };
        let points = &line.points;
        for (k, &(t, v)) in points.iter().enumerate() {
            let starts = k == 0 || t - points[k - 1].0 > gap;
            let ends = k + 1 == points.len() || points[k + 1].0 - t > gap;
            let _ = write!(
                d,
                "{}{:.1},{:.1}",
                if starts { "M" } else { "L" },
                x(t),
                y(v.min(y1))
            );
            if starts && ends {
                // A sample alone between gaps still shows: a dot instead
                // of a zero-length path.
                let _ = write!(
                    svg,
                    r#"<circle cx="{:.1}" cy="{:.1}" r="3" fill="{color}"/>"#,
                    x(t),
                    y(v.min(y1))
                );
                let _ = write!(d, "h0.5");
            }
        }
        let last = line.points[line.points.len() - 1];
        let _ = write!(
            svg,
            r#"<path class="series" d="{d}" fill="none" stroke="{color}" stroke-width="1.6"{dash}><title>{}: last {} at {}</title></path>"#,
            escape(&line.label),
            format_value(last.1, unit),
            format_time(last.0, false),
        );
    }
    svg.push_str("</svg>");
    svg.push_str(&legend(lines.iter().map(|l| {
        let (color, dash) = line_style(l.color);
        (l.label.as_str(), color, dash)
    })));
    svg
}

/// A bar chart of counts on a log scale: a latency distribution, whose tail
/// of a few late wake-ups would not show beside thousands on a linear one.
pub fn bar_chart(id: &str, bars: &[(String, f64)], unit: Unit) -> String {
    if bars.iter().all(|b| b.1 <= 0.0) {
        return no_data(id);
    }
    let decades = bars
        .iter()
        .map(|b| b.1)
        .fold(1.0, f64::max)
        .log10()
        .ceil()
        .max(1.0);
    let plot_w = WIDTH - LEFT - RIGHT;
    let slot = plot_w / bars.len() as f64;
    // 0 sits on the axis, 1 one step up, then a step per power of ten.
    let y = |v: f64| {
        let level = if v <= 0.0 { 0.0 } else { 1.0 + v.log10() };
        TOP + (HEIGHT - TOP - BOTTOM) * (1.0 - level / (decades + 1.0))
    };
    let mut svg = open_svg(id, "bars", bars.len());
    y_ticks(
        &mut svg,
        (0..=decades as i32).map(|k| 10f64.powi(k)),
        y,
        unit,
    );
    for (i, (label, value)) in bars.iter().enumerate() {
        let x0 = LEFT + slot * i as f64 + slot * 0.1;
        let top = y(*value);
        let _ = write!(
            svg,
            r##"<rect class="bar" x="{x0:.1}" y="{top:.1}" width="{:.1}" height="{:.1}" fill="#1f77b4"><title>{}: {}</title></rect>"##,
            slot * 0.8,
            (HEIGHT - BOTTOM - top).max(0.5),
            escape(label),
            format_value(*value, unit),
        );
        let _ = write!(
            svg,
            r#"<text x="{:.1}" y="{:.1}" font-size="10" text-anchor="middle">{}</text>"#,
            x0 + slot * 0.4,
            HEIGHT - BOTTOM + 14.0,
            escape(label),
        );
    }
    svg.push_str("</svg>");
    svg
}

/// One bar on a timeline: a lane, a time span, a label and a colour index.
#[derive(Clone, Debug)]
pub struct Span {
    /// Lane index.
    pub lane: usize,
    /// Start, µs since the epoch.
    pub start_us: i64,
    /// End, µs since the epoch.
    pub end_us: i64,
    /// Tooltip text.
    pub label: String,
    /// Its kind: an index into the timeline's `kinds`, which give its colour.
    pub kind: usize,
}

/// Characters of a lane's name shown left of the spans; the whole name is
/// its tooltip.
const LANE_LABEL_CHARS: usize = 30;

/// `text` in at most `max` characters: its start and its end, with `…`
/// between. Names that differ tell themselves apart at the end
/// (`…/job_77`, `…/job_78`, a pod's container), which a cut end would hide.
fn elide_middle(text: &str, max: usize) -> String {
    let count = text.chars().count();
    if count <= max {
        return text.to_string();
    }
    let head = (max - 1) / 3;
    let tail = max - 1 - head;
    let mut shown: String = text.chars().take(head).collect();
    shown.push('…');
    shown.extend(text.chars().skip(count - tail));
    shown
}

/// Spans on lanes against time: faults and noisy-neighbour events. `kinds`
/// are `(label, colour)`, each span's colour its kind's, and the legend
/// under the plot lists the kinds that occur.
pub fn timeline(
    id: &str,
    lanes: &[String],
    spans: &[Span],
    kinds: &[(&str, &str)],
    t0: i64,
    t1: i64,
) -> String {
    if spans.is_empty() {
        return no_data(id);
    }
    let t1 = t1.max(t0 + 1);
    let lane_h = 26.0;
    let height = TOP + BOTTOM + lane_h * lanes.len() as f64;
    let x = |t: i64| {
        LEFT + 120.0 + (WIDTH - LEFT - 120.0 - RIGHT) * ((t - t0) as f64 / (t1 - t0) as f64)
    };
    let mut svg = format!(
        r#"<svg class="plot timeline" id="{id}" data-points="{}" viewBox="0 0 {WIDTH} {height}" width="100%" role="img" xmlns="http://www.w3.org/2000/svg">"#,
        spans.len()
    );
    for (i, lane) in lanes.iter().enumerate() {
        let shown = elide_middle(lane, LANE_LABEL_CHARS);
        let _ = write!(
            svg,
            r#"<text x="4" y="{:.1}" font-size="11"><title>{}</title>{}</text>"#,
            TOP + lane_h * i as f64 + 16.0,
            escape(lane),
            escape(&shown)
        );
    }
    for s in spans {
        let (a, b) = (x(s.start_us.clamp(t0, t1)), x(s.end_us.clamp(t0, t1)));
        let _ = write!(
            svg,
            r#"<rect class="span" x="{a:.1}" y="{:.1}" width="{:.1}" height="{:.1}" rx="3" fill="{}"><title>{}</title></rect>"#,
            TOP + lane_h * s.lane as f64 + 4.0,
            (b - a).max(3.0),
            lane_h - 8.0,
            kinds.get(s.kind).map_or("#7f7f7f", |k| k.1),
            escape(&s.label),
        );
    }
    let base = height - BOTTOM;
    for k in 0..=4 {
        let t = t0 + (t1 - t0) * k / 4;
        let _ = write!(
            svg,
            r#"<text x="{:.1}" y="{:.1}" font-size="11" text-anchor="middle">{}</text>"#,
            x(t),
            base + 16.0,
            format_time(t, t1 - t0 > 86_400_000_000)
        );
    }
    svg.push_str("</svg>");
    svg.push_str(&legend(
        kinds
            .iter()
            .enumerate()
            .filter(|(k, _)| spans.iter().any(|s| s.kind == *k))
            .map(|(_, &(label, color))| (label, color, "")),
    ));
    svg
}

fn no_data(id: &str) -> String {
    format!(r#"<p class="no-data" id="{id}">No data in this range.</p>"#)
}

fn open_svg(id: &str, kind: &str, points: usize) -> String {
    format!(
        r#"<svg class="plot {kind}" id="{id}" data-points="{points}" viewBox="0 0 {WIDTH} {HEIGHT}" width="100%" role="img" xmlns="http://www.w3.org/2000/svg">"#
    )
}

fn scales(t0: i64, t1: i64, y0: f64, y1: f64) -> (impl Fn(i64) -> f64, impl Fn(f64) -> f64) {
    let x = move |t: i64| LEFT + (WIDTH - LEFT - RIGHT) * ((t - t0) as f64 / (t1 - t0) as f64);
    let y = move |v: f64| TOP + (HEIGHT - TOP - BOTTOM) * (1.0 - (v - y0) / (y1 - y0));
    (x, y)
}

fn axes(svg: &mut String, t0: i64, t1: i64, y1: f64, step: f64, unit: Unit) {
    y_axis(svg, y1, step, unit);
    let (x, _) = scales(t0, t1, 0.0, y1);
    let with_date = t1 - t0 > 86_400_000_000;
    for k in 0..=5 {
        let t = t0 + (t1 - t0) * k / 5;
        let anchor = match k {
            0 => "start",
            5 => "end",
            _ => "middle",
        };
        let _ = write!(
            svg,
            r#"<text x="{:.1}" y="{:.1}" font-size="11" text-anchor="{anchor}">{}</text>"#,
            x(t),
            HEIGHT - BOTTOM + 16.0,
            format_time(t, with_date)
        );
    }
}

/// A linear y axis from 0 to `y1`, a tick every `step`.
fn y_axis(svg: &mut String, y1: f64, step: f64, unit: Unit) {
    let y = |v: f64| TOP + (HEIGHT - TOP - BOTTOM) * (1.0 - v / y1);
    let steps = (y1 / step).round() as usize;
    y_ticks(svg, (0..=steps).map(|k| step * k as f64), y, unit);
}

/// Grid lines and labels at `values` (placed by `y`), and the axis line.
fn y_ticks(
    svg: &mut String,
    values: impl Iterator<Item = f64>,
    y: impl Fn(f64) -> f64,
    unit: Unit,
) {
    for v in values {
        let py = y(v);
        let _ = write!(
            svg,
            r##"<line x1="{LEFT}" x2="{:.1}" y1="{py:.1}" y2="{py:.1}" stroke="#e3e3e3"/><text x="{:.1}" y="{:.1}" font-size="11" text-anchor="end">{}</text>"##,
            WIDTH - RIGHT,
            LEFT - 6.0,
            py + 4.0,
            format_value(v, unit)
        );
    }
    let _ = write!(
        svg,
        r##"<line x1="{LEFT}" x2="{LEFT}" y1="{TOP}" y2="{:.1}" stroke="#888"/>"##,
        HEIGHT - BOTTOM
    );
}

/// A legend of `(label, colour, stroke pattern)` entries; a patterned
/// entry's swatch is a short line drawn in its pattern.
fn legend<'a>(entries: impl Iterator<Item = (&'a str, &'a str, &'a str)>) -> String {
    let mut out = String::from(r#"<div class="legend">"#);
    for (label, color, dash) in entries {
        if dash.is_empty() {
            let _ = write!(
                out,
                r#"<span><i style="background:{color}"></i>{}</span>"#,
                escape(label)
            );
        } else {
            let _ = write!(
                out,
                r#"<span><svg class="swatch" width="24" height="6"><line x1="0" y1="3" x2="24" y2="3" stroke="{color}" stroke-width="2" stroke-dasharray="{dash}"/></svg>{}</span>"#,
                escape(label)
            );
        }
    }
    out.push_str("</div>");
    out
}

/// The top of an axis for values up to `max`, and its tick step: the step
/// is 1, 2, 2.5 or 5 times a power of ten and the top at most five steps
/// up, so every tick is a round value (20%, 40%, never 18.75%). Nothing
/// above zero gives 0 to 1.
pub fn nice_scale(max: f64) -> (f64, f64) {
    let max = if max.is_finite() && max > 0.0 {
        max
    } else {
        1.0
    };
    let magnitude = 10f64.powf((max / 5.0).log10().floor());
    for m in [1.0, 2.0, 2.5, 5.0] {
        let step = m * magnitude;
        let steps = (max / step * (1.0 - 1e-9)).ceil().max(1.0);
        if steps <= 5.0 {
            return (step * steps, step);
        }
    }
    // max / 5 < 10 × magnitude: five steps of it or fewer reach max.
    let step = 10.0 * magnitude;
    ((max / step * (1.0 - 1e-9)).ceil().max(1.0) * step, step)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sixteen_gpus_have_sixteen_looks_and_the_legend_shows_them() {
        let styles: std::collections::HashSet<_> = (0..40).map(line_style).collect();
        assert_eq!(styles.len(), 40);
        let lines: Vec<Line> = (0..16)
            .map(|g| Line::new(format!("GPU {g}"), vec![(0, 0.5), (1_000_000, 0.6)], g))
            .collect();
        let chart = line_chart(None, "gpus", &lines, Unit::Ratio, Some(1.0), &[]);
        // GPU 0's and GPU 10's paths, and GPU 10's legend swatch.
        assert_eq!(chart.matches(r##"stroke="#1f77b4""##).count(), 2 + 1);
        let dashed = chart.matches(r#"stroke-dasharray="7 3""#).count();
        // GPUs 10-15: each path and each legend swatch.
        assert_eq!(dashed, 6 * 2, "{chart}");
        let legend = &chart[chart.find(r#"<div class="legend">"#).unwrap()..];
        assert!(legend.contains("GPU 15"), "{legend}");
    }

    #[test]
    fn names_that_act_on_text_are_shown_and_long_ones_keep_their_ends() {
        // A direction override would show the accused job's name reversed.
        assert_eq!(
            escape("/user.slice/\u{202e}evil <b>"),
            "/user.slice/\\u{202e}evil &lt;b&gt;"
        );
        assert_eq!(escape("ü日本 🔥"), "ü日本 🔥");
        let a = elide_middle("cpu · /system.slice/slurmstepd.scope/job_77", 30);
        let b = elide_middle("cpu · /system.slice/slurmstepd.scope/job_78", 30);
        assert_eq!(a.chars().count(), 30);
        assert!(a.starts_with("cpu · /s") && a.ends_with("/job_77"), "{a}");
        assert_ne!(a, b);
        assert_eq!(elide_middle("GPU 2", 30), "GPU 2");
    }

    #[test]
    fn values_print_in_their_units() {
        assert_eq!(format_value(0.25, Unit::Ratio), "25%");
        assert_eq!(format_value(3.35e12, Unit::BytesPerSecond), "3.35 TB/s");
        assert_eq!(format_value(42e-6, Unit::Seconds), "42 µs");
        assert_eq!(format_value(0.0015, Unit::Seconds), "1.5 ms");
        assert_eq!(format_value(12.0, Unit::Count), "12");
        assert_eq!(nice_scale(3.35e12), (4e12, 1e12));
        assert_eq!(nice_scale(0.93), (1.0, 0.2));
        assert_eq!(nice_scale(0.0), (1.0, 0.2));
        assert_eq!(format_value(71.5, Unit::Celsius), "71.5 °C");
        assert_eq!(format_time(1_763_719_200_000_000, false), "10:00:00");
    }

    #[test]
    fn bars_use_a_log_scale_so_a_tail_of_one_shows() {
        let bars = [
            ("a".to_string(), 1000.0),
            ("b".to_string(), 1.0),
            ("c".to_string(), 0.0),
        ];
        let svg = bar_chart("d", &bars, Unit::Count);
        let heights: Vec<f64> = svg
            .split(r#"class="bar""#)
            .skip(1)
            .map(|r| {
                let h = &r[r.find("height=\"").unwrap() + 8..];
                h[..h.find('"').unwrap()].parse().unwrap()
            })
            .collect();
        // 1000 is four steps (0, 1, 10, 100, 1000), 1 is one: a quarter, not a thousandth.
        assert!((heights[0] / heights[1] - 4.0).abs() < 0.05, "{heights:?}");
        assert_eq!(heights[2], 0.5, "an empty bucket is a hairline on the axis");
    }

    /// Seven minutes without data are a break in the line, not a ramp, and
    /// a chart given the report's range spans it, not only its points.
    #[test]
    fn a_line_breaks_at_a_gap_and_the_axis_is_the_range() {
        let s = 1_000_000;
        let mut points: Vec<(i64, f64)> = (0..10).map(|i| (i * s, 0.97)).collect();
        points.extend((430..440).map(|i| (i * s, 0.0)));
        points.push((700 * s, 0.5));
        let lines = [Line::new("GPU 0", points, 0)];
        let svg = line_chart(
            Some((-300 * s, 900 * s)),
            "c",
            &lines,
            Unit::Ratio,
            None,
            &[],
        );
        let path = &svg[svg.find(r#"class="series" d=""#).unwrap()..];
        let d = &path[18..path[18..].find('"').unwrap() + 18];
        assert_eq!(d.matches('M').count(), 3, "{d}");
        assert_eq!(
            svg.matches("<circle").count(),
            1,
            "the lone last sample is a dot"
        );
        // The first point is a quarter of the way along, where the range
        // begins 300 s before it.
        let first_x: f64 = d[1..d.find(',').unwrap()].parse().unwrap();
        let (x, _) = scales(-300 * s, 900 * s, 0.0, 1.0);
        assert!((first_x - x(0)).abs() < 0.1, "{first_x} {}", x(0));
        assert!(first_x > LEFT + 100.0, "{first_x}");
    }

    /// XIDs are steps held to the end of what is known: two XIDs ten
    /// seconds apart and nothing for ten minutes after are one unbroken
    /// line, flat at 2 to its end, not a ramp that stops at the last XID.
    #[test]
    fn an_event_count_is_steps_held_to_its_end() {
        let s = 1_000_000;
        let line = Line::events("GPU 7 XID (2)", &[10 * s, 20 * s], 0, 600 * s, 7);
        assert_eq!(
            line.points,
            [
                (0, 0.0),
                (10 * s, 0.0),
                (10 * s, 1.0),
                (20 * s, 1.0),
                (20 * s, 2.0),
                (600 * s, 2.0)
            ]
        );
        let svg = line_chart(Some((0, 600 * s)), "x", &[line], Unit::Count, None, &[]);
        let path = &svg[svg.find(r#"class="series" d=""#).unwrap()..];
        let d = &path[18..path[18..].find('"').unwrap() + 18];
        assert_eq!(d.matches('M').count(), 1, "{d}");
    }

    #[test]
    fn a_chart_draws_a_path_per_line_and_escapes_labels() {
        let lines = [
            Line::new("gpu <0>", vec![(0, 0.1), (1_000_000, 0.9)], 0),
            Line::new("one sample", vec![(500_000, 0.5)], 1),
        ];
        let svg = line_chart(None, "c", &lines, Unit::Ratio, Some(1.0), &[]);
        assert_eq!(svg.matches(r#"class="series""#).count(), 2);
        assert!(svg.contains("<circle"), "a lone sample is a dot");
        assert!(svg.contains("gpu &lt;0&gt;") && !svg.contains("gpu <0>"));
        assert!(svg.contains(r#"data-points="3""#));
        let empty = line_chart(None, "e", &[], Unit::Ratio, None, &[]);
        assert!(empty.contains("no-data") && !empty.contains("<svg"));
    }

    /// The y tick labels of a chart, top to bottom as written.
    fn y_tick_labels(svg: &str) -> Vec<String> {
        svg.split(r#"text-anchor="end">"#)
            .skip(1)
            .map(|t| t[..t.find('<').unwrap()].to_string())
            .filter(|t| !t.contains(':')) // the last time label
            .collect()
    }

    #[test]
    fn axis_ticks_land_on_round_values() {
        // A top of 25% used to be cut in quarters: 6.25%, 12.5%, 18.75%.
        let line = |v: f64| [Line::new("a", vec![(0, 0.0), (1_000_000, v)], 0)];
        let labels = y_tick_labels(&line_chart(None, "c", &line(0.25), Unit::Ratio, None, &[]));
        assert_eq!(labels, ["0%", "5%", "10%", "15%", "20%", "25%"]);
        let labels = y_tick_labels(&line_chart(
            None,
            "c",
            &line(0.5),
            Unit::Ratio,
            Some(1.0),
            &[],
        ));
        assert_eq!(labels, ["0%", "20%", "40%", "60%", "80%", "100%"]);
        for max in [
            0.0007, 0.013, 0.19, 0.25, 0.37, 0.7, 3.35e12, 9.99e11, 123.0, 1.0,
        ] {
            let (top, step) = nice_scale(max);
            assert!(
                top >= max && top <= max + step * 1.000_001,
                "{max}: {top} {step}"
            );
            let mantissa = step / 10f64.powf(step.log10().floor());
            assert!(
                [1.0, 2.0, 2.5, 5.0]
                    .iter()
                    .any(|m| (mantissa - m).abs() < 1e-9),
                "{max}: step {step}"
            );
            assert!((top / step).round() <= 5.0, "{max}: {top} {step}");
        }
    }

    #[test]
    fn a_timeline_has_a_legend_of_the_kinds_it_shows() {
        let span = |kind| Span {
            lane: 0,
            start_us: 0,
            end_us: 1_000_000,
            label: "x".into(),
            kind,
        };
        let kinds = [
            ("fault", "#d62728"),
            ("neighbour", "#1f77b4"),
            ("unused", "#000000"),
        ];
        let svg = timeline(
            "t",
            &["a lane".into()],
            &[span(0), span(1)],
            &kinds,
            0,
            2_000_000,
        );
        let legend = &svg[svg.find(r#"<div class="legend">"#).expect("a legend")..];
        assert!(
            legend.contains("#d62728\"></i>fault") && legend.contains("#1f77b4\"></i>neighbour")
        );
        assert!(!legend.contains("unused"), "only the kinds shown");
        assert!(svg.contains(r##"fill="#d62728""##));
    }
}
