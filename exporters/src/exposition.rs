//! The latest value of every series, kept in memory and rendered ahead of time
//! as Prometheus text (0.0.4) and OpenMetrics (1.0.0), plain and gzipped, so a
//! scrape only copies bytes: it never reads /proc or /sys, and never waits for
//! a render or a compression.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, RwLock};
use std::time::{Duration, Instant};

use vtax_store::batch::Values;
use vtax_store::schema::{FieldDef, MetricKind, TableDef, BUCKET_TAG};
use vtax_store::Batch;

/// Content type of the Prometheus text format.
pub const TEXT_CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";
/// Content type of OpenMetrics text.
pub const OPENMETRICS_CONTENT_TYPE: &str =
    "application/openmetrics-text; version=1.0.0; charset=utf-8";
/// Content type of OpenMetrics text to a scraper that asked for 0.0.1.
pub const OPENMETRICS_0_0_1_CONTENT_TYPE: &str =
    "application/openmetrics-text; version=0.0.1; charset=utf-8";

/// One rendered exposition: the formats and encodings scrapers asked for
/// lately (the others are `None` until someone asks).
#[derive(Debug, Default)]
pub struct Bodies {
    /// Prometheus text format.
    pub text: Option<bytes::Bytes>,
    /// Prometheus text format, gzipped.
    pub text_gzip: Option<bytes::Bytes>,
    /// OpenMetrics.
    pub openmetrics: Option<bytes::Bytes>,
    /// OpenMetrics, gzipped.
    pub openmetrics_gzip: Option<bytes::Bytes>,
    /// Number of samples in each body.
    pub samples: usize,
}

/// Which format a scraper asked for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// `text/plain; version=0.0.4`.
    Text,
    /// `application/openmetrics-text`.
    OpenMetrics,
}

impl Format {
    /// Content negotiation on an `Accept` header: OpenMetrics when the
    /// scraper takes a version of it that is served (1.0.0, or 0.0.1, which
    /// it extends; none named is taken as either) at a quality at least that
    /// of the text format, the text format otherwise. `q=0` refuses a type.
    pub fn negotiate(accept: Option<&str>) -> Format {
        Format::negotiate_media_type(accept).0
    }

    /// [`Format::negotiate`], with the `Content-Type` to answer: OpenMetrics
    /// says the version the scraper asked for, 0.0.1 when it prefers that
    /// one (the same text: 1.0.0 is 0.0.1 standardised). Answered as 1.0.0,
    /// a scraper that asked for 0.0.1 alone was told of a version it had
    /// refused.
    pub fn negotiate_media_type(accept: Option<&str>) -> (Format, &'static str) {
        let Some(accept) = accept else {
            return (Format::Text, TEXT_CONTENT_TYPE);
        };
        // The quality of each OpenMetrics version named, and of the range
        // that names none: a version named has its own quality, whatever the
        // range without one says (`version=1.0.0;q=0, application/
        // openmetrics-text` refuses 1.0.0 and takes 0.0.1), as the most
        // specific range rules a media type in HTTP.
        let (mut latest, mut first, mut any) = (None::<f32>, None::<f32>, None::<f32>);
        let mut text_q = 0.0f32;
        let higher = |kept: Option<f32>, q: f32| Some(kept.map_or(q, |k| k.max(q)));
        for range in accept.split(',') {
            let mut parts = range.split(';').map(str::trim);
            let media = parts.next().unwrap_or("").to_ascii_lowercase();
            let (mut q, mut version) = (Some(1.0f32), None);
            for parameter in parts {
                let Some((name, value)) = parameter.split_once('=') else {
                    continue;
                };
                match name.trim().to_ascii_lowercase().as_str() {
                    // A quality outside 0 to 1 (or none a number) is no
                    // quality: the range is left out.
                    "q" => {
                        q = value
                            .trim()
                            .parse()
                            .ok()
                            .filter(|q| (0.0..=1.0).contains(q))
                    }
                    "version" => version = Some(value.trim().trim_matches('"').to_string()),
                    _ => {}
                }
            }
            let Some(q) = q else {
                continue;
            };
            match (media.as_str(), version.as_deref()) {
                ("application/openmetrics-text", None) => any = higher(any, q),
                ("application/openmetrics-text", Some("1.0.0")) => latest = higher(latest, q),
                ("application/openmetrics-text", Some("0.0.1")) => first = higher(first, q),
                ("text/plain" | "text/*" | "*/*", _) => text_q = text_q.max(q),
                _ => {}
            }
        }
        let latest_q = latest.or(any).unwrap_or(0.0);
        let first_q = first.or(any).unwrap_or(0.0);
        let openmetrics_q = latest_q.max(first_q);
        if openmetrics_q > 0.0 && openmetrics_q >= text_q {
            let content_type = if latest_q >= first_q {
                OPENMETRICS_CONTENT_TYPE
            } else {
                OPENMETRICS_0_0_1_CONTENT_TYPE
            };
            (Format::OpenMetrics, content_type)
        } else {
            (Format::Text, TEXT_CONTENT_TYPE)
        }
    }

    /// The response's `Content-Type`.
    pub fn content_type(self) -> &'static str {
        match self {
            Format::Text => TEXT_CONTENT_TYPE,
            Format::OpenMetrics => OPENMETRICS_CONTENT_TYPE,
        }
    }
}

impl Bodies {
    /// The body for a format, gzipped or not, if rendered.
    pub fn body(&self, format: Format, gzip: bool) -> Option<&bytes::Bytes> {
        match (format, gzip) {
            (Format::Text, false) => self.text.as_ref(),
            (Format::Text, true) => self.text_gzip.as_ref(),
            (Format::OpenMetrics, false) => self.openmetrics.as_ref(),
            (Format::OpenMetrics, true) => self.openmetrics_gzip.as_ref(),
        }
    }
}

/// How long a format and encoding stay rendered ahead after the last scrape
/// that asked for it: longer than any sane scrape interval.
const WANTED_FOR: Duration = Duration::from_secs(600);

fn slot(format: Format, gzip: bool) -> usize {
    match (format, gzip) {
        (Format::Text, false) => 0,
        (Format::Text, true) => 1,
        (Format::OpenMetrics, false) => 2,
        (Format::OpenMetrics, true) => 3,
    }
}

#[derive(Default)]
struct State {
    /// Latest batches per source (a collector, or the runtime's own rows).
    sources: BTreeMap<String, Vec<Arc<Batch>>>,
    /// Bumped on every change; the renderer renders when it moves.
    generation: u64,
    /// Sources whose rows were staged (`stage`) since the last render snapshot.
    staged: BTreeSet<String>,
    closed: bool,
}

/// What renders reuse from one to the next: the bodies' text and the gzip
/// compressor's state: 136 KiB of text for the bar's 1,505 series and zlib's
/// 256 KiB.
/// Allocated afresh each render under the agent's pinned mmap threshold
/// (`agent/src/memory.rs`), they were mapped and zeroed every time: the
/// renderer's CPU went from 0.5 to 0.9 ms a second.
#[derive(Default)]
struct RenderScratch {
    text: String,
    openmetrics: String,
    compressor: Option<flate2::Compress>,
}

/// The latest rows of every source and their rendered bodies.
pub struct Exposition {
    tables: Vec<&'static TableDef>,
    state: Mutex<State>,
    changed: Condvar,
    bodies: RwLock<Arc<Bodies>>,
    rendered_generation: Mutex<u64>,
    rendered: Condvar,
    /// Serialises renders, so a newer snapshot is never overwritten by an older
    /// one, and holds the buffers they reuse.
    render_lock: Mutex<RenderScratch>,
    /// Per format and encoding: when a scrape last asked for it (milliseconds
    /// since `epoch`, plus one; 0 never). Only those asked for lately are
    /// rendered ahead: a render and a gzip nobody reads is most of the
    /// agent's own CPU time per sample.
    wanted: [AtomicU64; 4],
    epoch: Instant,
    renders: AtomicU64,
    /// Whether a scrape was served since the last render. When the renderer
    /// finds a render went unread (scrapes every 15 s, collectors every
    /// second) it stops rendering ahead and the next scrape renders.
    served: AtomicBool,
    /// Set while rendering waits for a scrape instead of running ahead.
    lazy: AtomicBool,
    /// The generation the renderer thread last handled (rendered or left lazy).
    handled: AtomicU64,
}

impl Exposition {
    /// An empty exposition over `tables`, in the order families are rendered.
    /// Tables not marked `exported` are never rendered.
    pub fn new(tables: &[&'static TableDef]) -> Arc<Self> {
        let exposition = Arc::new(Exposition {
            tables: tables.iter().copied().filter(|t| t.exported).collect(),
            state: Mutex::new(State::default()),
            changed: Condvar::new(),
            bodies: RwLock::new(Arc::new(Bodies::default())),
            rendered_generation: Mutex::new(0),
            rendered: Condvar::new(),
            render_lock: Mutex::new(RenderScratch::default()),
            wanted: Default::default(),
            epoch: Instant::now(),
            renders: AtomicU64::new(0),
            served: AtomicBool::new(false),
            lazy: AtomicBool::new(false),
            handled: AtomicU64::new(0),
        });
        exposition
    }

    /// The latest body for a scrape: rendered ahead when this format and
    /// encoding were asked for lately, else rendered now (the first scrape,
    /// or the first after a long pause, pays for one render).
    pub fn body(&self, format: Format, gzip: bool) -> bytes::Bytes {
        let now = self.epoch.elapsed().as_millis() as u64 + 1;
        self.wanted[slot(format, gzip)].store(now, Ordering::Relaxed);
        if self.lazy.swap(false, Ordering::AcqRel) {
            let current = self.state.lock().expect("not poisoned").generation;
            if *self.rendered_generation.lock().expect("not poisoned") < current {
                self.render_pending();
            }
        }
        self.served.store(true, Ordering::Release);
        // A body is in the latest render only if it was asked for before.
        if let Some(body) = self.bodies().body(format, gzip) {
            return body.clone();
        }
        self.render_pending();
        self.bodies()
            .body(format, gzip)
            .cloned()
            .expect("a render includes every wanted body")
    }

    /// Replaces a source's latest rows.
    pub fn update(&self, source: &str, batches: Vec<Arc<Batch>>) {
        let mut state = self.state.lock().expect("not poisoned");
        state.sources.insert(source.to_string(), batches);
        state.generation += 1;
        self.changed.notify_all();
    }

    /// Replaces a source's latest rows without asking for a render of their
    /// own: they go out with the next render another change or a scrape
    /// causes. For rows made off the collectors' whole-second grid (the main
    /// loop's, the web server's), which would otherwise cost a second render
    /// every second when Prometheus scrapes every second. If this source's
    /// rows staged before were never rendered (no collector ticked in
    /// between), this one asks for a render, so staged rows are at most one
    /// call late; other sources' staged rows do not count, so that two
    /// sources staging once a second cost no render of their own.
    pub fn stage(&self, source: &str, batches: Vec<Arc<Batch>>) {
        let mut state = self.state.lock().expect("not poisoned");
        state.sources.insert(source.to_string(), batches);
        if !state.staged.insert(source.to_string()) {
            state.generation += 1;
            self.changed.notify_all();
        }
    }

    /// Drops a source's rows: a failed collector's series disappear, as a
    /// failed node_exporter collector's do.
    pub fn remove(&self, source: &str) {
        let mut state = self.state.lock().expect("not poisoned");
        if state.sources.remove(source).is_some() {
            state.generation += 1;
            self.changed.notify_all();
        }
    }

    /// How many renders ran (each renders every wanted body once).
    pub fn renders(&self) -> u64 {
        self.renders.load(Ordering::Relaxed)
    }

    /// The latest rendered bodies.
    pub fn bodies(&self) -> Arc<Bodies> {
        self.bodies.read().expect("not poisoned").clone()
    }

    /// Renders changes as they come, waiting at least `coalesce` after a change
    /// so that collectors ticking together cost one render. Returns on `close`.
    pub fn run_renderer(&self, coalesce: Duration) {
        let mut seen = 0;
        loop {
            {
                let mut state = self.state.lock().expect("not poisoned");
                while state.generation == seen && !state.closed {
                    state = self.changed.wait(state).expect("not poisoned");
                }
                if state.closed {
                    return;
                }
            }
            std::thread::sleep(coalesce);
            if self.renders() > 0 && !self.served.swap(false, Ordering::AcqRel) {
                // Nobody read the last render: wait for a scrape to ask.
                seen = self.state.lock().expect("not poisoned").generation;
                self.lazy.store(true, Ordering::Release);
                self.handled.store(seen, Ordering::Release);
                continue;
            }
            seen = self.render_pending();
            self.handled.store(seen, Ordering::Release);
        }
    }

    /// Renders synchronously now (tests, and callers without a renderer
    /// thread); returns the generation of the changes it rendered.
    pub fn render_pending(&self) -> u64 {
        let mut scratch = self.render_lock.lock().expect("not poisoned");
        let (generation, sources) = {
            let mut state = self.state.lock().expect("not poisoned");
            state.staged.clear();
            (state.generation, state.sources.clone())
        };
        tracing::trace!(generation, thread = ?std::thread::current().name(), "render");
        let bodies = Arc::new(self.render_now(&sources, &mut scratch));
        *self.bodies.write().expect("not poisoned") = bodies;
        let mut rendered = self.rendered_generation.lock().expect("not poisoned");
        *rendered = (*rendered).max(generation);
        self.rendered.notify_all();
        generation
    }

    /// Waits until every change so far is rendered, up to `timeout`.
    pub fn wait_rendered(&self, timeout: Duration) -> bool {
        let target = self.state.lock().expect("not poisoned").generation;
        let guard = self.rendered_generation.lock().expect("not poisoned");
        let (guard, _) = self
            .rendered
            .wait_timeout_while(guard, timeout, |g| *g < target)
            .expect("not poisoned");
        *guard >= target
    }

    /// Stops the renderer thread.
    pub fn close(&self) {
        let mut state = self.state.lock().expect("not poisoned");
        state.closed = true;
        self.changed.notify_all();
    }

    fn render_now(
        &self,
        sources: &BTreeMap<String, Vec<Arc<Batch>>>,
        scratch: &mut RenderScratch,
    ) -> Bodies {
        let now = self.epoch.elapsed();
        let wanted: Vec<bool> = self
            .wanted
            .iter()
            .map(|w| match w.load(Ordering::Relaxed) {
                0 => false,
                at => now.saturating_sub(Duration::from_millis(at - 1)) < WANTED_FOR,
            })
            .collect();
        let want_text = wanted[0] || wanted[1];
        let want_openmetrics = wanted[2] || wanted[3];
        if !want_text && !want_openmetrics {
            return Bodies::default(); // nobody scrapes: nothing to render
        }
        self.renders.fetch_add(1, Ordering::Relaxed);
        let RenderScratch {
            text,
            openmetrics,
            compressor,
        } = scratch;
        text.clear();
        openmetrics.clear();
        let mut samples = 0;
        for table in &self.tables {
            let batches: Vec<&Batch> = sources
                .values()
                .flatten()
                .filter(|b| std::ptr::eq(b.table, *table))
                .map(|b| b.as_ref())
                .collect();
            samples += render_table(
                table,
                &batches,
                want_text.then_some(&mut *text),
                want_openmetrics.then_some(&mut *openmetrics),
            );
        }
        openmetrics.push_str("# EOF\n");
        Bodies {
            text_gzip: wanted[1].then(|| gzip(compressor, text.as_bytes())),
            openmetrics_gzip: wanted[3].then(|| gzip(compressor, openmetrics.as_bytes())),
            text: wanted[0].then(|| bytes::Bytes::copy_from_slice(text.as_bytes())),
            openmetrics: wanted[2].then(|| bytes::Bytes::copy_from_slice(openmetrics.as_bytes())),
            samples,
        }
    }
}

fn gzip(compressor: &mut Option<flate2::Compress>, data: &[u8]) -> bytes::Bytes {
    // Fast level: the body is rendered about once a second and mostly digits;
    // the ratio barely moves past level 1 while the time triples.
    let compress = compressor
        .get_or_insert_with(|| flate2::Compress::new_gzip(flate2::Compression::fast(), 15));
    compress.reset();
    let mut out = Vec::with_capacity(data.len() / 4 + 64);
    loop {
        let (consumed, written) = (compress.total_in(), compress.total_out());
        let status = compress
            .compress_vec(
                &data[consumed as usize..],
                &mut out,
                flate2::FlushCompress::Finish,
            )
            .expect("deflate into a Vec");
        if status == flate2::Status::StreamEnd {
            return out.into();
        }
        // Short of the end, a call returns when the output is full; a call
        // that moved nothing would loop forever.
        assert!(
            compress.total_in() > consumed || compress.total_out() > written,
            "deflate made no progress"
        );
        out.reserve(out.capacity().max(4096));
    }
}

/// Renders every exported field of `table` from `batches`: one family per
/// field, its series from every batch. Returns the number of samples.
fn render_table(
    table: &TableDef,
    batches: &[&Batch],
    mut text: Option<&mut String>,
    mut openmetrics: Option<&mut String>,
) -> usize {
    let mut samples = 0;
    if batches.iter().all(|b| b.is_empty()) {
        return 0;
    }
    // Each row's label set, rendered once: a table's fields share them. A
    // table of histogram fields only renders its own, without `le`.
    let plain = table
        .fields
        .iter()
        .any(|f| matches!(f.kind, MetricKind::Gauge | MetricKind::Counter));
    let labels: Vec<Vec<String>> = if plain {
        batches.iter().map(|b| label_sets(table, b, None)).collect()
    } else {
        Vec::new()
    };
    let mut value = String::with_capacity(32);
    for (f, field) in table.fields.iter().enumerate() {
        let has_value = batches
            .iter()
            .any(|b| (0..b.len()).any(|row| b.fields[f].is_valid(row)));
        if !has_value {
            continue;
        }
        match field.kind {
            // Rendered with the histogram it belongs to.
            MetricKind::HistogramSum => continue,
            MetricKind::StoredOnly => continue,
            MetricKind::Histogram => {
                samples += render_histogram(
                    table,
                    f,
                    batches,
                    text.as_deref_mut(),
                    openmetrics.as_deref_mut(),
                );
                continue;
            }
            MetricKind::Gauge | MetricKind::Counter => {}
        }
        let name = table.metric_name(field);
        let family = name.strip_suffix("_total").unwrap_or(&name);
        write_headers(
            field,
            &name,
            family,
            text.as_deref_mut(),
            openmetrics.as_deref_mut(),
        );
        for (batch, labels) in batches.iter().zip(&labels) {
            let column = &batch.fields[f];
            for (row, labels) in labels.iter().enumerate() {
                if !column.is_valid(row) {
                    continue;
                }
                format_value(&column.values, row, &mut value);
                for out in [text.as_deref_mut(), openmetrics.as_deref_mut()]
                    .into_iter()
                    .flatten()
                {
                    out.push_str(&name);
                    out.push_str(labels);
                    out.push(' ');
                    out.push_str(&value);
                    out.push('\n');
                }
                samples += 1;
            }
        }
        debug_assert!(field.kind == MetricKind::Gauge || name.ends_with("_total"));
    }
    samples
}

/// The `# HELP` and `# TYPE` lines (and OpenMetrics' `# UNIT`) of a family.
fn write_headers(
    field: &FieldDef,
    name: &str,
    family: &str,
    text: Option<&mut String>,
    openmetrics: Option<&mut String>,
) {
    let kind = field
        .kind
        .prometheus_type()
        .expect("only exported fields are rendered");
    let help = escape_help(field.help);
    if let Some(text) = text {
        let _ = writeln!(text, "# HELP {name} {help}");
        let _ = writeln!(text, "# TYPE {name} {kind}");
    }
    if let Some(openmetrics) = openmetrics {
        let _ = writeln!(openmetrics, "# TYPE {family} {kind}");
        if let Some(unit) = field.unit.suffix() {
            let _ = writeln!(openmetrics, "# UNIT {family} {unit}");
        }
        // OpenMetrics' HELP is an escaped string, where a double quote is
        // escaped too; the text format's HELP escapes only `\` and newline
        // and would show `\"` as it is.
        let _ = writeln!(openmetrics, "# HELP {family} {}", help.replace('"', "\\\""));
    }
}

fn format_value(values: &Values, row: usize, out: &mut String) {
    out.clear();
    match values {
        Values::F64(v) => format_f64(v[row], out),
        Values::I64(v) => {
            let _ = write!(out, "{}", v[row]);
        }
        Values::U64(v) => {
            let _ = write!(out, "{}", v[row]);
        }
    }
}

/// Renders histogram field `f` of `table`: per row a `_bucket` sample with
/// the row's `le`; the `+Inf` row also gives `_count` and, from the
/// histogram's sum field, `_sum`. Rows of one series come in bucket order
/// from the collector, so each series' samples stay together as
/// OpenMetrics requires. Returns the number of samples.
fn render_histogram(
    table: &TableDef,
    f: usize,
    batches: &[&Batch],
    mut text: Option<&mut String>,
    mut openmetrics: Option<&mut String>,
) -> usize {
    let field = &table.fields[f];
    let name = table.metric_name(field);
    let le = table
        .tag_index(BUCKET_TAG)
        .expect("a histogram's table has an le tag (TableDef::validate)");
    let sum_name = format!("{}_sum", field.name);
    let sum = table
        .fields
        .iter()
        .position(|s| s.kind == MetricKind::HistogramSum && s.name == sum_name);
    write_headers(
        field,
        &name,
        &name,
        text.as_deref_mut(),
        openmetrics.as_deref_mut(),
    );
    let mut samples = 0;
    let mut value = String::with_capacity(32);
    let mut lines = String::with_capacity(256);
    let mut bound = String::with_capacity(16);
    for batch in batches {
        let series = label_sets(table, batch, Some(le));
        let column = &batch.fields[f];
        for (row, series) in series.iter().enumerate() {
            if !column.is_valid(row) {
                continue;
            }
            bound.clear();
            escape_label_value(
                &batch.tags[le].dict[batch.tags[le].codes[row] as usize],
                &mut bound,
            );
            format_value(&column.values, row, &mut value);
            lines.clear();
            let open = series.strip_suffix('}').unwrap_or("{");
            let comma = if open.len() > 1 { "," } else { "" };
            let _ = writeln!(lines, "{name}_bucket{open}{comma}le=\"{bound}\"}} {value}");
            samples += 1;
            if bound == "+Inf" {
                let _ = writeln!(lines, "{name}_count{series} {value}");
                samples += 1;
                if let Some(s) = sum.filter(|&s| batch.fields[s].is_valid(row)) {
                    format_value(&batch.fields[s].values, row, &mut value);
                    let _ = writeln!(lines, "{name}_sum{series} {value}");
                    samples += 1;
                }
            }
            for out in [text.as_deref_mut(), openmetrics.as_deref_mut()]
                .into_iter()
                .flatten()
            {
                out.push_str(&lines);
            }
        }
    }
    samples
}

/// `{tag="value",...}` for every row of a batch, leaving out tag `skip` (empty
/// when no tag is left).
fn label_sets(table: &TableDef, batch: &Batch, skip: Option<usize>) -> Vec<String> {
    if table.tags.len() <= usize::from(skip.is_some()) {
        return vec![String::new(); batch.len()];
    }
    // Escape each distinct tag value once, then assemble rows from codes.
    let escaped: Vec<Vec<String>> = batch
        .tags
        .iter()
        .map(|column| {
            column
                .dict
                .iter()
                .map(|v| {
                    let mut out = String::with_capacity(v.len());
                    escape_label_value(v, &mut out);
                    out
                })
                .collect()
        })
        .collect();
    (0..batch.len())
        .map(|row| {
            let mut set = String::with_capacity(64);
            set.push('{');
            for (t, tag) in table.tags.iter().enumerate() {
                if Some(t) == skip {
                    continue;
                }
                if set.len() > 1 {
                    set.push(',');
                }
                set.push_str(tag.name);
                set.push_str("=\"");
                set.push_str(&escaped[t][batch.tags[t].codes[row] as usize]);
                set.push('"');
            }
            set.push('}');
            set
        })
        .collect()
}

fn format_f64(value: f64, out: &mut String) {
    match vtax_store::openmetrics::non_finite_text(value) {
        Some(text) => out.push_str(text),
        // Rust prints the shortest string that reads back to the same double.
        None => {
            let _ = write!(out, "{value}");
        }
    }
}

fn escape_label_value(value: &str, out: &mut String) {
    for c in value.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
}

fn escape_help(help: &str) -> String {
    help.replace('\\', "\\\\").replace('\n', "\\n")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_tables::{WakeupHistogramRow, WAKEUP_HISTOGRAM};
    use vtax_store::schema::{FieldType, TagDef, Unit};
    use vtax_store::BatchBuilder;

    /// Each format's HELP escapes as its parsers read it: `\\` and newline
    /// in both, and a double quote in OpenMetrics only.
    #[test]
    fn help_is_escaped_for_each_format() {
        let field = FieldDef::gauge(
            "load_ratio",
            FieldType::F64,
            Unit::Ratio,
            "The \"busy\" share, C:\\ path,\nsecond line.",
        );
        let (mut text, mut openmetrics) = (String::new(), String::new());
        write_headers(
            &field,
            "vtax_load_ratio",
            "vtax_load_ratio",
            Some(&mut text),
            Some(&mut openmetrics),
        );
        assert!(
            text.contains(
                "# HELP vtax_load_ratio The \"busy\" share, C:\\\\ path,\\nsecond line.\n"
            ),
            "{text}"
        );
        assert!(
            openmetrics.contains(
                "# HELP vtax_load_ratio The \\\"busy\\\" share, C:\\\\ path,\\nsecond line.\n"
            ),
            "{openmetrics}"
        );
    }

    vtax_store::table! {
        static T: TableDef, struct GpuRow {
            name: "gpu",
            help: "test",
            tags: [gpu = TagDef { name: "gpu", help: "index" }],
            fields: [
                energy_joules: Option<f64> = FieldDef::counter(FieldType::F64, Unit::Joules, "Energy \\ since boot."),
                memory_used_bytes: Option<u64> = FieldDef::gauge(FieldType::U64, Unit::Bytes, "Used."),
            ],
            exported: true,
        }
    }

    /// A batch of `T`: per row its gpu, energy and memory used.
    fn batch(rows: &[(&str, Option<f64>, Option<u64>)]) -> Arc<Batch> {
        let mut b = BatchBuilder::new(&T);
        for &(gpu, energy_joules, memory_used_bytes) in rows {
            let row = GpuRow {
                gpu,
                energy_joules,
                memory_used_bytes,
            };
            b.push_row(1, &row).unwrap();
        }
        Arc::new(b.finish())
    }

    #[test]
    fn families_merge_across_sources_and_nulls_are_skipped() {
        let e = Exposition::new(&[&T]);
        e.update("a", vec![batch(&[("0", Some(1.5), None)])]);
        e.update("b", vec![batch(&[("1\"x", Some(f64::NAN), Some(7))])]);
        let text = e.body(Format::Text, false);
        let openmetrics = e.body(Format::OpenMetrics, false);
        let text_gzip = e.body(Format::Text, true);
        assert_eq!(
            std::str::from_utf8(&text).unwrap(),
            "# HELP vtax_gpu_energy_joules_total Energy \\\\ since boot.\n\
             # TYPE vtax_gpu_energy_joules_total counter\n\
             vtax_gpu_energy_joules_total{gpu=\"0\"} 1.5\n\
             vtax_gpu_energy_joules_total{gpu=\"1\\\"x\"} NaN\n\
             # HELP vtax_gpu_memory_used_bytes Used.\n\
             # TYPE vtax_gpu_memory_used_bytes gauge\n\
             vtax_gpu_memory_used_bytes{gpu=\"1\\\"x\"} 7\n"
        );
        assert_eq!(
            std::str::from_utf8(&openmetrics).unwrap(),
            "# TYPE vtax_gpu_energy_joules counter\n\
             # UNIT vtax_gpu_energy_joules joules\n\
             # HELP vtax_gpu_energy_joules Energy \\\\ since boot.\n\
             vtax_gpu_energy_joules_total{gpu=\"0\"} 1.5\n\
             vtax_gpu_energy_joules_total{gpu=\"1\\\"x\"} NaN\n\
             # TYPE vtax_gpu_memory_used_bytes gauge\n\
             # UNIT vtax_gpu_memory_used_bytes bytes\n\
             # HELP vtax_gpu_memory_used_bytes Used.\n\
             vtax_gpu_memory_used_bytes{gpu=\"1\\\"x\"} 7\n\
             # EOF\n"
        );
        assert_eq!(e.bodies().samples, 3);
        assert_eq!(gunzip(&text_gzip).as_bytes(), &text[..]);

        e.remove("b");
        e.render_pending();
        let text = e.body(Format::Text, false);
        assert!(!std::str::from_utf8(&text).unwrap().contains("gpu=\"1"));
    }

    fn gunzip(body: &[u8]) -> String {
        let mut unzipped = String::new();
        std::io::Read::read_to_string(&mut flate2::read::GzDecoder::new(body), &mut unzipped)
            .unwrap();
        unzipped
    }

    #[test]
    fn reused_buffers_and_compressor_give_each_render_its_own_bodies() {
        let e = Exposition::new(&[&T]);
        // Label values from a generator, so the body compresses poorly and the
        // gzip output outgrows its first guess of a quarter of the input.
        let mut state = 0x9e37_79b9_7f4a_7c15_u64;
        let mut noisy_tag = || {
            (0..4)
                .map(|_| {
                    state ^= state << 13;
                    state ^= state >> 7;
                    state ^= state << 17;
                    format!("{state:016x}")
                })
                .collect::<String>()
        };
        let large: Vec<String> = (0..3000).map(|_| noisy_tag()).collect();
        let rows = |tags: &[String], v: f64| {
            let rows: Vec<(&str, Option<f64>, Option<u64>)> = tags
                .iter()
                .map(|t| (t.as_str(), Some(v), Some(1)))
                .collect();
            batch(&rows)
        };
        let small = vec!["0".to_string()];
        for (tags, v) in [(&large, 1.5), (&small, 2.5), (&large, 3.5), (&small, 4.5)] {
            e.update("a", vec![rows(tags, v)]);
            e.render_pending();
            let plain = e.body(Format::Text, false);
            let openmetrics = e.body(Format::OpenMetrics, false);
            let text = std::str::from_utf8(&plain).unwrap();
            assert_eq!(text.matches(&format!("}} {v}\n")).count(), tags.len());
            assert_eq!(
                text.lines().filter(|l| !l.starts_with('#')).count(),
                2 * tags.len(),
                "no lines left over from a larger render"
            );
            assert_eq!(gunzip(&e.body(Format::Text, true)), text);
            assert_eq!(
                gunzip(&e.body(Format::OpenMetrics, true)).as_bytes(),
                &openmetrics[..]
            );
        }
        assert!(
            e.body(Format::Text, true).len() < e.body(Format::Text, false).len(),
            "compressed"
        );
    }

    #[test]
    fn renders_nobody_reads_stop_until_a_scrape_asks() {
        let e = Exposition::new(&[&T]);
        let renderer = {
            let e = e.clone();
            std::thread::spawn(move || e.run_renderer(Duration::from_millis(1)))
        };
        // Each change, then wait until the renderer thread has dealt with it.
        let tick = |v: f64| {
            e.update("a", vec![batch(&[("0", Some(v), Some(1))])]);
            let target = e.state.lock().unwrap().generation;
            let deadline = std::time::Instant::now() + Duration::from_secs(20);
            while e.handled.load(Ordering::Acquire) < target {
                assert!(std::time::Instant::now() < deadline, "renderer stuck");
                std::thread::sleep(Duration::from_millis(1));
            }
        };
        let scrape = || String::from_utf8(e.body(Format::Text, false).to_vec()).unwrap();
        tick(1.0);
        assert!(scrape().contains("} 1\n"));
        let before = e.renders();
        tick(2.0); // read by no one yet, but the last render was: rendered ahead
        tick(3.0); // the render of 2 went unread: not rendered
        tick(4.0);
        assert_eq!(e.renders(), before + 1, "one render ahead, then lazy");
        assert!(
            scrape().contains("} 4\n"),
            "a scrape renders what is pending"
        );
        assert_eq!(e.renders(), before + 2);
        tick(5.0); // the last render was read: ahead again
        assert_eq!(e.renders(), before + 3);
        assert!(scrape().contains("} 5\n"));
        assert_eq!(e.renders(), before + 3, "served from the render ahead");
        e.close();
        renderer.join().unwrap();
    }

    #[test]
    fn staged_rows_ride_along_with_the_next_render() {
        let e = Exposition::new(&[&T]);
        let generation = || e.state.lock().unwrap().generation;
        let text = || String::from_utf8(e.body(Format::Text, false).to_vec()).unwrap();
        e.update("a", vec![batch(&[("0", Some(1.0), Some(1))])]);
        assert!(text().contains("} 1\n"));
        let before = generation();
        e.stage("b", vec![batch(&[("1", Some(7.0), Some(1))])]);
        assert_eq!(generation(), before, "a stage asks for no render");
        e.update("a", vec![batch(&[("0", Some(2.0), Some(1))])]);
        e.render_pending();
        let body = text();
        assert!(
            body.contains("{gpu=\"1\"} 7\n") && body.contains("} 2\n"),
            "{body}"
        );

        // Staged again, then again with no render between: the second asks.
        e.stage("b", vec![batch(&[("1", Some(8.0), Some(1))])]);
        let before = generation();
        e.stage("b", vec![batch(&[("1", Some(9.0), Some(1))])]);
        assert_eq!(
            generation(),
            before + 1,
            "unrendered staged rows ask for a render"
        );
        e.render_pending();
        assert!(text().contains("{gpu=\"1\"} 9\n"));

        // Two sources staged once each between renders: no render asked.
        let before = generation();
        e.stage("b", vec![batch(&[("1", Some(10.0), Some(1))])]);
        e.stage("c", vec![batch(&[("2", Some(1.0), Some(1))])]);
        assert_eq!(
            generation(),
            before,
            "another source's staged rows ask for no render"
        );
        e.stage("c", vec![batch(&[("2", Some(2.0), Some(1))])]);
        assert_eq!(generation(), before + 1);
    }

    #[test]
    fn histograms_render_buckets_count_and_sum_per_series() {
        WAKEUP_HISTOGRAM.validate().unwrap();
        let mut b = BatchBuilder::new(&WAKEUP_HISTOGRAM);
        for (cpu, le, count, sum) in [
            ("0", "5e-05", 3, None),
            ("0", "+Inf", 4, Some(0.5)),
            ("1", "5e-05", 0, None),
            ("1", "+Inf", 0, Some(0.0)),
        ] {
            let row = WakeupHistogramRow {
                cpu,
                le,
                latency_seconds: count,
                latency_seconds_sum: sum,
            };
            b.push_row(1, &row).unwrap();
        }
        let e = Exposition::new(&[&WAKEUP_HISTOGRAM]);
        e.update("jitter", vec![Arc::new(b.finish())]);
        let text = e.body(Format::Text, false);
        assert_eq!(
            std::str::from_utf8(&text).unwrap(),
            "# HELP vtax_jitter_wakeup_latency_seconds Wake-ups by lateness.\n\
             # TYPE vtax_jitter_wakeup_latency_seconds histogram\n\
             vtax_jitter_wakeup_latency_seconds_bucket{cpu=\"0\",le=\"5e-05\"} 3\n\
             vtax_jitter_wakeup_latency_seconds_bucket{cpu=\"0\",le=\"+Inf\"} 4\n\
             vtax_jitter_wakeup_latency_seconds_count{cpu=\"0\"} 4\n\
             vtax_jitter_wakeup_latency_seconds_sum{cpu=\"0\"} 0.5\n\
             vtax_jitter_wakeup_latency_seconds_bucket{cpu=\"1\",le=\"5e-05\"} 0\n\
             vtax_jitter_wakeup_latency_seconds_bucket{cpu=\"1\",le=\"+Inf\"} 0\n\
             vtax_jitter_wakeup_latency_seconds_count{cpu=\"1\"} 0\n\
             vtax_jitter_wakeup_latency_seconds_sum{cpu=\"1\"} 0\n"
        );
        assert_eq!(e.bodies().samples, 8);
        let openmetrics = e.body(Format::OpenMetrics, false);
        assert!(std::str::from_utf8(&openmetrics).unwrap().starts_with(
            "# TYPE vtax_jitter_wakeup_latency_seconds histogram\n\
             # UNIT vtax_jitter_wakeup_latency_seconds seconds\n"
        ));
    }

    #[test]
    fn negotiation() {
        assert_eq!(Format::negotiate(None), Format::Text);
        assert_eq!(
            Format::negotiate(Some(
                "application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5"
            )),
            Format::OpenMetrics
        );
        assert_eq!(Format::negotiate(Some("text/plain")), Format::Text);
        // What Prometheus 2.42 sends.
        assert_eq!(
            Format::negotiate(Some(
                "application/openmetrics-text;version=1.0.0,application/openmetrics-text;\
                 version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1"
            )),
            Format::OpenMetrics
        );
        // Refused with q=0, preferred less than text, or a version not served.
        for accept in [
            "application/openmetrics-text;q=0,text/plain",
            "text/plain;q=1,application/openmetrics-text;q=0.5",
            "application/openmetrics-text; version=9.9.9",
        ] {
            assert_eq!(Format::negotiate(Some(accept)), Format::Text, "{accept}");
        }
        // The answer names the version asked for: 0.0.1 where only it is
        // taken or it is preferred, 1.0.0 where both are taken alike or no
        // version is named.
        let media_type = |accept: &str| Format::negotiate_media_type(Some(accept));
        for (accept, version) in [
            ("application/openmetrics-text;version=0.0.1", "0.0.1"),
            (
                "application/openmetrics-text;version=1.0.0;q=0.5,\
                 application/openmetrics-text;version=0.0.1",
                "0.0.1",
            ),
            (
                "application/openmetrics-text;version=0.0.1,application/openmetrics-text",
                "1.0.0",
            ),
            ("application/openmetrics-text", "1.0.0"),
            // Refused by name, taken by the range without a version.
            (
                "application/openmetrics-text;version=1.0.0;q=0,application/openmetrics-text",
                "0.0.1",
            ),
        ] {
            let (format, content_type) = media_type(accept);
            assert_eq!(format, Format::OpenMetrics, "{accept}");
            assert!(
                content_type.contains(&format!("version={version}")),
                "{accept}: {content_type}"
            );
        }
        assert_eq!(media_type("text/plain"), (Format::Text, TEXT_CONTENT_TYPE));
        // Both refused by name: text. A quality that is no quality (above 1,
        // not a number) leaves its range out.
        for accept in [
            "application/openmetrics-text;version=1.0.0;q=0,\
             application/openmetrics-text;version=0.0.1;q=0,application/openmetrics-text,text/plain",
            "application/openmetrics-text;q=2,text/plain;q=0.5",
            "application/openmetrics-text;q=NaN,text/plain;q=0.5",
        ] {
            assert_eq!(media_type(accept).0, Format::Text, "{accept}");
        }
    }

    #[test]
    fn renderer_thread_catches_up() {
        let e = Exposition::new(&[&T]);
        let renderer = {
            let e = e.clone();
            std::thread::spawn(move || e.run_renderer(Duration::from_millis(1)))
        };
        assert!(
            e.body(Format::Text, true).len() > 10,
            "rendered on first ask"
        );
        e.update("a", vec![batch(&[("0", Some(2.0), Some(1))])]);
        assert!(e.wait_rendered(Duration::from_secs(10)));
        let bodies = e.bodies();
        assert_eq!(bodies.samples, 2);
        assert!(bodies.text_gzip.is_some(), "asked for: rendered ahead");
        assert!(
            bodies.openmetrics.is_none(),
            "never asked for: not rendered"
        );
        e.close();
        renderer.join().unwrap();
    }
}
