//! Streaming parser for the Prometheus text exposition format (0.0.4) and
//! OpenMetrics 1.0 text, as used by `vtax import`.
//!
//! The parser works one line at a time and never looks back, so a file of any
//! size can be fed through it with constant memory. Each sample line yields a
//! [`Sample`] whose metric name borrows from the line; the label set is put in
//! canonical form (sorted by name, canonical escaping) and borrows from the line
//! too when it was already written that way, which is the common case for
//! exporters. Values are parsed with Rust's correctly rounded float parser, so
//! every f64 written in shortest or full form round-trips bit for bit.
//!
//! What is accepted follows Prometheus' own parsers (`promlex.l`,
//! `openmetricslex.l`, `strconv.ParseFloat` as wrapped by Prometheus) with a
//! few deliberate leniencies, listed on [`Parser::parse_line`].

use std::borrow::Cow;

mod labels;
mod values;

use labels::*;
use values::*;

pub use values::non_finite_text;

#[cfg(test)]
mod tests;

/// One sample line.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample<'a> {
    /// Metric name exactly as written on the line (e.g. `node_cpu_seconds_total`,
    /// `http_request_duration_seconds_bucket`).
    pub metric: &'a str,
    /// Canonical label set: labels sorted by name, rendered `name="value",name2="value2"` with the
    /// value escaped the Prometheus way (backslash, double quote and newline escaped as `\\` `\"`
    /// `\n`). Empty string when there are no labels. A label with an empty value is left out, as
    /// Prometheus does (`m{a=""}` and `m` are one series). The same label set written in any
    /// order or with different escaping of the same value gives the same string. Borrowed from
    /// the line when the line already has it in canonical form.
    pub labels: Cow<'a, str>,
    /// The value. Decimal and exponent forms, `+Inf`/`Inf`/`-Inf`/`infinity` and `NaN` (ASCII
    /// case-insensitive, as Go's `strconv.ParseFloat` accepts them) are accepted; hex floats,
    /// digit separators, signed NaN and decimal numbers that overflow f64 are rejected. `NaN`
    /// gives Prometheus' "normal NaN" bit pattern `0x7ff8000000000001` (what Go's `math.NaN()`
    /// returns and what promtool stores).
    pub value: f64,
    /// Timestamp in microseconds since the epoch, if the line has one. Prometheus text gives
    /// integer milliseconds; OpenMetrics gives seconds with an optional fraction (and optional
    /// exponent). Both are converted without going through a float; OpenMetrics digits below a
    /// microsecond are dropped (truncated toward zero, as Prometheus truncates to milliseconds).
    pub timestamp_us: Option<i64>,
}

/// The text format a file is written in. It decides the timestamp unit (Prometheus text:
/// integer milliseconds; OpenMetrics: seconds) and whether `# EOF` is required.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// Prometheus text exposition format 0.0.4: timestamps are integer milliseconds.
    PrometheusText,
    /// OpenMetrics 1.0 text: timestamps are seconds, the input must end with `# EOF`.
    OpenMetrics,
}

/// Errors carry the 1-based line number and the offending line (truncated to 200 chars) and say
/// what is wrong.
#[derive(Debug, thiserror::Error)]
#[error("line {line}: {reason}: {text:?}")]
pub struct ParseError {
    /// 1-based line number of the offending line (for a missing `# EOF`: the last line).
    pub line: u64,
    /// What is wrong.
    pub reason: String,
    /// The offending line, truncated to 200 chars.
    pub text: String,
    /// Set when the line is well formed but goes past a limit of [`Parser::with_limits`], so
    /// that a caller can tell an oversized exposition from a broken one.
    pub limit: Option<LimitExceeded>,
}

/// Bounds on one sample's label set, as Prometheus' `label_limit` and
/// `label_value_length_limit_bytes` of a scrape config. A line past one is an error (see
/// [`ParseError::limit`]); exemplar labels are not bounded (they are not kept).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Most labels on one sample; one with an empty value is no label and is not counted.
    pub label_limit: usize,
    /// Longest label value, in bytes once unescaped (`\\`, `\"` and `\n` are one byte),
    /// the metric name's (the series' `__name__`) included.
    pub label_value_length_limit_bytes: usize,
}

impl Limits {
    /// No bounds: what [`Parser::new`] applies.
    pub const NONE: Limits = Limits {
        label_limit: usize::MAX,
        label_value_length_limit_bytes: usize::MAX,
    };
}

/// The limit a line went past, with the limit's value.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LimitExceeded {
    /// More labels than [`Limits::label_limit`].
    LabelLimit(usize),
    /// A label value longer than [`Limits::label_value_length_limit_bytes`].
    LabelValueLengthLimit(usize),
}

/// Prometheus' `value.NormalNaN`, the bit pattern of Go's `math.NaN()`.
const NORMAL_NAN_BITS: u64 = 0x7ff8_0000_0000_0001;

/// Longest excerpt of a line kept in a [`ParseError`], in chars.
const MAX_ERROR_TEXT_CHARS: usize = 200;

/// Parses lines one at a time; see [`Parser::parse_line`].
#[derive(Debug, Clone)]
pub struct Parser {
    format: Format,
    /// Number of lines seen so far (= 1-based number of the last line).
    line: u64,
    /// Line number of the first `# EOF` line, if any.
    eof_line: Option<u64>,
    /// Whether a sample with a timestamp has been seen.
    saw_timestamp: bool,
    /// First non-blank line after `# EOF` (OpenMetrics), reported again by `finish`.
    after_eof: Option<(u64, String)>,
    /// Bounds on each sample's labels.
    limits: Limits,
    /// Whether the format was declared (a scrape's Content-Type, a `.prom`
    /// or `.om` file name) rather than guessed from the first bytes: a
    /// declared Prometheus text reads `# EOF` as the comment Prometheus
    /// reads it as, timestamps or not.
    declared: bool,
}

impl Parser {
    /// A parser for input in `format`, guessed from its first bytes
    /// ([`Parser::detect`]), before its first line.
    pub fn new(format: Format) -> Self {
        Parser {
            format,
            line: 0,
            eof_line: None,
            saw_timestamp: false,
            after_eof: None,
            limits: Limits::NONE,
            declared: false,
        }
    }

    /// A parser for input whose format was declared (a Content-Type, a file
    /// name), not guessed: see [`Parser::new`].
    pub fn declared(format: Format) -> Self {
        Parser {
            declared: true,
            ..Parser::new(format)
        }
    }

    /// A parser for a declared format ([`Parser::declared`]) that also refuses a sample
    /// whose labels go past `limits`. The check is made while the label set is scanned,
    /// before anything is copied.
    pub fn with_limits(format: Format, limits: Limits) -> Self {
        Parser {
            limits,
            ..Parser::declared(format)
        }
    }

    /// The format this parser was created with.
    pub fn format(&self) -> Format {
        self.format
    }

    /// Detects the format from the first bytes of a file and its name.
    ///
    /// Prometheus text for a name ending in `.prom` (node_exporter's textfile
    /// collector's, which Prometheus's text parser reads: a `# UNIT` or
    /// `# EOF` line there is a comment). Else OpenMetrics when any of these
    /// holds, otherwise Prometheus text:
    /// - the file name ends in `.om` or `.openmetrics` (ASCII case-insensitive);
    /// - a whole line of `first_chunk` (surrounding whitespace ignored) is `# EOF`;
    /// - a line starts with `# UNIT ` (only OpenMetrics has UNIT metadata);
    /// - a `# TYPE name T` line has a type only OpenMetrics has: `unknown`, `gaugehistogram`,
    ///   `stateset` or `info` (Prometheus text says `untyped`).
    ///
    /// An OpenMetrics file whose first chunk has none of these markers (no UNIT/OM-only TYPE, and
    /// `# EOF` beyond the chunk) is detected as Prometheus text; [`Parser::parse_line`] then
    /// reports an error at its `# EOF` if timestamped samples were read (their unit would be
    /// wrong), so such a misdetection cannot pass silently.
    pub fn detect(first_chunk: &str, file_name: &str) -> Format {
        if let Some(format) = Parser::format_of_name(file_name) {
            return format;
        }
        for line in first_chunk.lines() {
            let t = line.trim_matches(|c: char| c == ' ' || c == '\t' || c == '\r');
            if t == "# EOF" || t.starts_with("# UNIT ") {
                return Format::OpenMetrics;
            }
            if let Some(rest) = t.strip_prefix("# TYPE ") {
                let mut words = rest.split_ascii_whitespace();
                let _name = words.next();
                if let Some(ty) = words.next() {
                    if matches!(ty, "unknown" | "gaugehistogram" | "stateset" | "info") {
                        return Format::OpenMetrics;
                    }
                }
            }
        }
        Format::PrometheusText
    }

    /// The format a file's name declares: Prometheus text for `.prom`,
    /// OpenMetrics for `.om` and `.openmetrics` (ASCII case-insensitive).
    pub fn format_of_name(file_name: &str) -> Option<Format> {
        let name = file_name.as_bytes();
        if ends_with_ignore_case(name, b".prom") {
            Some(Format::PrometheusText)
        } else if ends_with_ignore_case(name, b".om")
            || ends_with_ignore_case(name, b".openmetrics")
        {
            Some(Format::OpenMetrics)
        } else {
            None
        }
    }

    /// Parses the next line (`line` has no trailing `\n`). Returns `Ok(None)` for blank lines,
    /// comments (`# HELP`, `# TYPE`, `# UNIT`, any other `#` line) and `# EOF`.
    ///
    /// Syntax: `name[{label="value",...}] value [timestamp] [# {exemplar labels} value [ts]]`.
    /// Leniencies, in both formats: leading/trailing spaces and tabs and a trailing `\r` are
    /// ignored; one or more spaces/tabs separate the fields; spaces/tabs are allowed around the
    /// label tokens inside braces; a trailing comma inside braces is allowed; an exemplar is
    /// accepted (validated, then ignored) in either format; a UTF-8 byte order mark on line 1
    /// is skipped. An unknown escape such as `\t` in a label value is kept literally (backslash
    /// and `t`), as Prometheus does. Prometheus text timestamps may carry a sign.
    ///
    /// Errors: malformed names, duplicate label names, a `__name__` label on a sample (its name
    /// is the metric name), unterminated quotes or braces, a missing or non-numeric value, a bad
    /// timestamp, trailing garbage, a timestamp out of the range of i64 microseconds, content
    /// after `# EOF` (OpenMetrics), and `# EOF` together with timestamped samples in Prometheus
    /// text (see [`Parser::detect`]).
    pub fn parse_line<'a>(&mut self, line: &'a str) -> Result<Option<Sample<'a>>, ParseError> {
        self.line += 1;
        let b = line.as_bytes();
        let mut end = b.len();
        while end > 0 && matches!(b[end - 1], b' ' | b'\t' | b'\r') {
            end -= 1;
        }
        let mut start = 0;
        if self.line == 1 && b.starts_with("\u{feff}".as_bytes()) {
            start = 3;
        }
        while start < end && matches!(b[start], b' ' | b'\t') {
            start += 1;
        }
        if start == end {
            return Ok(None);
        }
        if self.format == Format::OpenMetrics && self.eof_line.is_some() {
            let err = self.error("content after `# EOF`", line);
            if self.after_eof.is_none() {
                self.after_eof = Some((err.line, err.text.clone()));
            }
            return Err(err);
        }
        if b[start] == b'#' {
            if &b[start..end] == b"# EOF" {
                if self.eof_line.is_none() {
                    self.eof_line = Some(self.line);
                }
                if self.format == Format::PrometheusText && self.saw_timestamp && !self.declared {
                    return Err(self.eof_in_prometheus_text_error(line));
                }
            }
            return Ok(None);
        }
        match parse_sample(line, start, end, self.format, &self.limits) {
            Ok(sample) => {
                if sample.timestamp_us.is_some() && !self.saw_timestamp {
                    self.saw_timestamp = true;
                    if self.format == Format::PrometheusText
                        && self.eof_line.is_some()
                        && !self.declared
                    {
                        return Err(self.eof_in_prometheus_text_error(line));
                    }
                }
                Ok(Some(sample))
            }
            Err(SampleError::Syntax(reason)) => Err(self.error(reason, line)),
            Err(SampleError::Limit(reason, limit)) => Err(ParseError {
                limit: Some(limit),
                ..self.error(reason, line)
            }),
        }
    }

    /// Call after the last line. For OpenMetrics, a missing `# EOF` (a truncated file) and
    /// content after `# EOF` are errors. Prometheus text has no end marker: always Ok.
    pub fn finish(&self) -> Result<(), ParseError> {
        if self.format != Format::OpenMetrics {
            return Ok(());
        }
        if let Some((line, text)) = &self.after_eof {
            return Err(ParseError {
                line: *line,
                reason: "content after `# EOF`".to_string(),
                text: text.clone(),
                limit: None,
            });
        }
        if self.eof_line.is_none() {
            return Err(ParseError {
                line: self.line,
                reason: "OpenMetrics input ends without `# EOF` (truncated file?)".to_string(),
                text: String::new(),
                limit: None,
            });
        }
        Ok(())
    }

    /// Number of lines passed to [`Parser::parse_line`] so far, i.e. the 1-based number of the
    /// last line parsed (0 before the first).
    pub fn line_number(&self) -> u64 {
        self.line
    }

    fn error(&self, reason: impl Into<String>, line: &str) -> ParseError {
        ParseError {
            line: self.line,
            reason: reason.into(),
            text: truncate_chars(line, MAX_ERROR_TEXT_CHARS).to_string(),
            limit: None,
        }
    }

    fn eof_in_prometheus_text_error(&self, line: &str) -> ParseError {
        self.error(
            "OpenMetrics `# EOF` marker in input parsed as Prometheus text with timestamped \
             samples: their timestamps would be read as milliseconds instead of seconds; \
             an OpenMetrics file is read as such when its name ends in .om",
            line,
        )
    }
}

fn truncate_chars(s: &str, n: usize) -> &str {
    match s.char_indices().nth(n) {
        Some((i, _)) => &s[..i],
        None => s,
    }
}

fn ends_with_ignore_case(s: &[u8], suffix: &[u8]) -> bool {
    s.len() >= suffix.len() && s[s.len() - suffix.len()..].eq_ignore_ascii_case(suffix)
}

#[inline]
fn is_ws(c: u8) -> bool {
    c == b' ' || c == b'\t'
}

#[inline]
fn is_metric_start(c: u8) -> bool {
    c.is_ascii_alphabetic() || c == b'_' || c == b':'
}

#[inline]
fn is_metric_char(c: u8) -> bool {
    c.is_ascii_alphanumeric() || c == b'_' || c == b':'
}

#[inline]
fn is_label_start(c: u8) -> bool {
    c.is_ascii_alphabetic() || c == b'_'
}

#[inline]
fn is_label_char(c: u8) -> bool {
    c.is_ascii_alphanumeric() || c == b'_'
}

#[inline]
fn skip_ws(b: &[u8], mut i: usize, end: usize) -> usize {
    while i < end && is_ws(b[i]) {
        i += 1;
    }
    i
}

/// End of the token starting at `i`: the next space/tab or `end`.
#[inline]
fn token_end(b: &[u8], mut i: usize, end: usize) -> usize {
    while i < end && !is_ws(b[i]) {
        i += 1;
    }
    i
}

/// Why a sample line was refused: bad syntax, or a limit of [`Limits`].
enum SampleError {
    Syntax(String),
    Limit(String, LimitExceeded),
}

impl From<String> for SampleError {
    fn from(reason: String) -> Self {
        SampleError::Syntax(reason)
    }
}

impl SampleError {
    fn reason(self) -> String {
        match self {
            SampleError::Syntax(reason) | SampleError::Limit(reason, _) => reason,
        }
    }
}

/// Parses a sample line; `line[start..end]` is the trimmed, non-empty, non-comment content.
fn parse_sample<'a>(
    line: &'a str,
    start: usize,
    end: usize,
    format: Format,
    limits: &Limits,
) -> Result<Sample<'a>, SampleError> {
    let b = line.as_bytes();
    let mut i = start;
    if !is_metric_start(b[i]) {
        return Err(if b[i] == b'{' {
            "expected metric name before `{` (quoted UTF-8 metric names are not supported)"
                .to_string()
        } else {
            "expected metric name".to_string()
        }
        .into());
    }
    i += 1;
    while i < end && is_metric_char(b[i]) {
        i += 1;
    }
    let metric = &line[start..i];
    // The name is the series' `__name__` label, whose value Prometheus's
    // label_value_length_limit bounds too.
    if metric.len() > limits.label_value_length_limit_bytes {
        return Err(SampleError::Limit(
            format!(
                "the metric name is {} bytes, longer than label_value_length_limit_bytes {}",
                metric.len(),
                limits.label_value_length_limit_bytes
            ),
            LimitExceeded::LabelValueLengthLimit(limits.label_value_length_limit_bytes),
        ));
    }
    let after_name = i;
    i = skip_ws(b, i, end);
    let labels = if i < end && b[i] == b'{' {
        let (labels, next) = parse_labels(line, i + 1, end, Some(limits))?;
        i = skip_ws(b, next, end);
        labels
    } else {
        if i == after_name && i < end {
            return Err(format!("invalid character {:?} in metric name", char_at(line, i)).into());
        }
        Cow::Borrowed("")
    };
    if i == end {
        return Err("missing value".to_string().into());
    }
    let value_end = token_end(b, i, end);
    let value = parse_value(&line[i..value_end])
        .map_err(|why| format!("{why} {:?}", &line[i..value_end]))?;
    i = skip_ws(b, value_end, end);
    let mut timestamp_us = None;
    if i < end && b[i] != b'#' {
        let ts_end = token_end(b, i, end);
        let tok = &line[i..ts_end];
        let ts = match format {
            Format::PrometheusText => parse_prom_timestamp_us(tok),
            Format::OpenMetrics => parse_om_timestamp_us(tok),
        };
        timestamp_us = Some(ts.map_err(|why| format!("{why} {tok:?}"))?);
        i = skip_ws(b, ts_end, end);
    }
    if i < end {
        if b[i] == b'#' {
            check_exemplar(line, i + 1, end)?;
        } else {
            return Err(format!("unexpected content after timestamp: {:?}", &line[i..end]).into());
        }
    }
    Ok(Sample {
        metric,
        labels,
        value,
        timestamp_us,
    })
}

fn char_at(s: &str, i: usize) -> char {
    s[i..].chars().next().unwrap_or('\0')
}

/// Validates an exemplar `{labels} value [timestamp]`; `i` is just after its `#`.
fn check_exemplar(line: &str, i: usize, end: usize) -> Result<(), String> {
    let b = line.as_bytes();
    let j = skip_ws(b, i, end);
    if j == i || j == end || b[j] != b'{' {
        return Err("expected exemplar `# {labels} value [timestamp]` after `#`".to_string());
    }
    let (_, next) =
        parse_labels(line, j + 1, end, None).map_err(|e| format!("exemplar: {}", e.reason()))?;
    let mut k = skip_ws(b, next, end);
    if k == end {
        return Err("exemplar: missing value".to_string());
    }
    let v_end = token_end(b, k, end);
    parse_value(&line[k..v_end]).map_err(|why| format!("exemplar: {why} {:?}", &line[k..v_end]))?;
    k = skip_ws(b, v_end, end);
    if k < end {
        let t_end = token_end(b, k, end);
        let tok = &line[k..t_end];
        match parse_value(tok) {
            Ok(t) if t.is_finite() => {}
            _ => return Err(format!("exemplar: invalid timestamp {tok:?}")),
        }
        k = skip_ws(b, t_end, end);
        if k < end {
            return Err(format!(
                "unexpected content after exemplar: {:?}",
                &line[k..end]
            ));
        }
    }
    Ok(())
}
