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

/// One sample line.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample<'a> {
    /// Metric name exactly as written on the line (e.g. `node_cpu_seconds_total`,
    /// `http_request_duration_seconds_bucket`).
    pub metric: &'a str,
    /// Canonical label set: labels sorted by name, rendered `name="value",name2="value2"` with the
    /// value escaped the Prometheus way (backslash, double quote and newline escaped as `\\` `\"`
    /// `\n`). Empty string when there are no labels. The same label set written in any order or
    /// with different escaping of the same value gives the same string. Borrowed from the line
    /// when the line already has it in canonical form.
    pub labels: Cow<'a, str>,
    /// The value. Decimal and exponent forms, `+Inf`/`Inf`/`-Inf`/`infinity` and `NaN` (ASCII
    /// case-insensitive, as Go's `strconv.ParseFloat` accepts them) are accepted; hex floats,
    /// digit separators, signed NaN and decimal numbers that overflow f64 are rejected. `NaN`
    /// gives Prometheus' "normal NaN" bit pattern `0x7ff8000000000001` (what Go's `math.NaN()`
    /// returns and what promtool stores).
    pub value: f64,
    /// Timestamp in microseconds since the epoch, if the line has one. Prometheus text gives
    /// integer milliseconds; OpenMetrics gives seconds with an optional fraction (and optional
    /// exponent). Both are converted exactly, without going through a float.
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
    /// Most labels on one sample.
    pub label_limit: usize,
    /// Longest label value, in bytes once unescaped (`\\`, `\"` and `\n` are one byte).
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
}

impl Parser {
    /// A parser for input in `format`, before its first line.
    pub fn new(format: Format) -> Self {
        Parser {
            format,
            line: 0,
            eof_line: None,
            saw_timestamp: false,
            after_eof: None,
            limits: Limits::NONE,
        }
    }

    /// A parser that also refuses a sample whose labels go past `limits`. The check is made
    /// while the label set is scanned, before anything is copied.
    pub fn with_limits(format: Format, limits: Limits) -> Self {
        Parser {
            limits,
            ..Parser::new(format)
        }
    }

    /// The format this parser was created with.
    pub fn format(&self) -> Format {
        self.format
    }

    /// Detects the format from the first bytes of a file and its name.
    ///
    /// OpenMetrics when any of these holds, otherwise Prometheus text:
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
        let name = file_name.as_bytes();
        if ends_with_ignore_case(name, b".om") || ends_with_ignore_case(name, b".openmetrics") {
            return Format::OpenMetrics;
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
    /// Errors: malformed names, duplicate label names, unterminated quotes or braces, a missing
    /// or non-numeric value, a bad timestamp, trailing garbage, a timestamp that cannot be held
    /// exactly in microseconds, content after `# EOF` (OpenMetrics), and `# EOF` together with
    /// timestamped samples in Prometheus text (see [`Parser::detect`]).
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
                if self.format == Format::PrometheusText && self.saw_timestamp {
                    return Err(self.eof_in_prometheus_text_error(line));
                }
            }
            return Ok(None);
        }
        match parse_sample(line, start, end, self.format, &self.limits) {
            Ok(sample) => {
                if sample.timestamp_us.is_some() && !self.saw_timestamp {
                    self.saw_timestamp = true;
                    if self.format == Format::PrometheusText && self.eof_line.is_some() {
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
             parse it as OpenMetrics",
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

/// Parses `name="value",...}` starting just after `{`. Returns the canonical label string and
/// the index just after `}`. With `limits` (a sample's labels) checks them, before any copy;
/// without (an exemplar's) only validates (returns "").
fn parse_labels<'a>(
    line: &'a str,
    start: usize,
    end: usize,
    limits: Option<&Limits>,
) -> Result<(Cow<'a, str>, usize), SampleError> {
    let (close, canonical, stats) = scan_labels(line, start, end, None)?;
    let Some(limits) = limits else {
        return Ok((Cow::Borrowed(""), close + 1));
    };
    if stats.count > limits.label_limit {
        return Err(SampleError::Limit(
            format!(
                "{} labels, more than label_limit {}",
                stats.count, limits.label_limit
            ),
            LimitExceeded::LabelLimit(limits.label_limit),
        ));
    }
    if stats.longest_value_bytes > limits.label_value_length_limit_bytes {
        return Err(SampleError::Limit(
            format!(
                "label {:?} has a value of {} bytes, longer than label_value_length_limit_bytes {}",
                stats.longest_value_name,
                stats.longest_value_bytes,
                limits.label_value_length_limit_bytes
            ),
            LimitExceeded::LabelValueLengthLimit(limits.label_value_length_limit_bytes),
        ));
    }
    if canonical {
        return Ok((Cow::Borrowed(&line[start..close]), close + 1));
    }
    let mut pairs: Vec<(&str, &str)> = Vec::with_capacity(8);
    scan_labels(line, start, end, Some(&mut pairs))?;
    pairs.sort_unstable_by_key(|&(name, _)| name);
    for w in pairs.windows(2) {
        if w[0].0 == w[1].0 {
            return Err(format!("duplicate label name {:?}", w[0].0).into());
        }
    }
    let mut out = String::with_capacity(close - start + 4);
    for (k, (name, raw)) in pairs.iter().enumerate() {
        if k > 0 {
            out.push(',');
        }
        out.push_str(name);
        out.push_str("=\"");
        push_canonical_escaped(&mut out, raw);
        out.push('"');
    }
    Ok((Cow::Owned(out), close + 1))
}

/// Appends a raw (still escaped) label value in canonical escaping: `\\`, `\"`, `\n` stay as
/// they are; a backslash starting any other escape is a literal backslash and becomes `\\`.
fn push_canonical_escaped(out: &mut String, raw: &str) {
    let rb = raw.as_bytes();
    let mut run = 0;
    let mut j = 0;
    while j < rb.len() {
        if rb[j] == b'\\' {
            out.push_str(&raw[run..j]);
            // The scanner guarantees a byte after every backslash inside a value.
            match rb[j + 1] {
                c @ (b'\\' | b'"' | b'n') => {
                    out.push('\\');
                    out.push(c as char);
                    j += 2;
                }
                _ => {
                    out.push_str("\\\\");
                    j += 1;
                }
            }
            run = j;
        } else {
            j += 1;
        }
    }
    out.push_str(&raw[run..]);
}

/// What [`scan_labels`] counted, for [`Limits`].
struct LabelStats<'a> {
    count: usize,
    /// The longest value, unescaped, and its label's name.
    longest_value_bytes: usize,
    longest_value_name: &'a str,
}

/// Scans a label set starting just after `{`. Returns the index of the closing `}`, whether
/// `line[start..close]` is already canonical (sorted strictly by name, no whitespace, no
/// trailing comma, only canonical escapes), and the label count and longest value. Pushes
/// `(name, raw value)` pairs when given a Vec. Duplicate names are reported here only when
/// adjacent in the text; when the names are not strictly increasing the set is not canonical
/// and the caller checks after sorting.
fn scan_labels<'a>(
    line: &'a str,
    start: usize,
    end: usize,
    mut pairs: Option<&mut Vec<(&'a str, &'a str)>>,
) -> Result<(usize, bool, LabelStats<'a>), String> {
    let b = line.as_bytes();
    let mut i = start;
    let mut canonical = true;
    let mut prev_name: &str = "";
    let mut after_comma = false;
    let mut stats = LabelStats {
        count: 0,
        longest_value_bytes: 0,
        longest_value_name: "",
    };
    loop {
        let j = skip_ws(b, i, end);
        canonical &= j == i;
        i = j;
        if i == end {
            return Err("unterminated label set (missing `}`)".to_string());
        }
        if b[i] == b'}' {
            canonical &= !after_comma;
            return Ok((i, canonical, stats));
        }
        // Label name.
        let name_start = i;
        if !is_label_start(b[i]) {
            return Err(format!("expected label name, found {:?}", char_at(line, i)));
        }
        i += 1;
        while i < end && is_label_char(b[i]) {
            i += 1;
        }
        let name = &line[name_start..i];
        let j = skip_ws(b, i, end);
        canonical &= j == i;
        i = j;
        if i == end || b[i] != b'=' {
            return Err(format!("expected `=` after label name {name:?}"));
        }
        i += 1;
        let j = skip_ws(b, i, end);
        canonical &= j == i;
        i = j;
        if i == end || b[i] != b'"' {
            return Err(format!("expected `\"` to open the value of label {name:?}"));
        }
        i += 1;
        let value_start = i;
        // Escapes that stand for one byte; any other backslash is a byte of its own.
        let mut one_byte_escapes = 0;
        loop {
            if i >= end {
                return Err(format!("unterminated value of label {name:?}"));
            }
            match b[i] {
                b'"' => break,
                b'\\' => {
                    if i + 1 >= end {
                        return Err(format!("unterminated value of label {name:?}"));
                    }
                    let known = matches!(b[i + 1], b'\\' | b'"' | b'n');
                    canonical &= known;
                    one_byte_escapes += usize::from(known);
                    i += 2;
                }
                b'\n' => return Err(format!("raw newline in value of label {name:?}")),
                _ => i += 1,
            }
        }
        let raw = &line[value_start..i];
        stats.count += 1;
        let value_bytes = raw.len() - one_byte_escapes;
        if value_bytes > stats.longest_value_bytes {
            stats.longest_value_bytes = value_bytes;
            stats.longest_value_name = name;
        }
        i += 1;
        if name.as_bytes() <= prev_name.as_bytes() {
            if name == prev_name {
                return Err(format!("duplicate label name {name:?}"));
            }
            canonical = false;
        }
        prev_name = name;
        if let Some(p) = pairs.as_deref_mut() {
            p.push((name, raw));
        }
        let j = skip_ws(b, i, end);
        canonical &= j == i;
        i = j;
        if i == end {
            return Err("unterminated label set (missing `}`)".to_string());
        }
        match b[i] {
            b',' => {
                i += 1;
                after_comma = true;
            }
            b'}' => {
                after_comma = false;
            }
            _ => {
                return Err(format!(
                    "expected `,` or `}}` after value of label {name:?}, found {:?}",
                    char_at(line, i)
                ))
            }
        }
    }
}

/// Parses a sample value the way Prometheus does (Go's `strconv.ParseFloat` minus hex floats and
/// underscores): decimal with optional fraction and exponent, `[+-]inf`/`[+-]infinity`, `nan`
/// (ASCII case-insensitive). Finite decimals that overflow f64 are an error, as in Go.
fn parse_value(s: &str) -> Result<f64, &'static str> {
    let b = s.as_bytes();
    let (neg, rest) = match b.first() {
        Some(b'+') => (false, &s[1..]),
        Some(b'-') => (true, &s[1..]),
        _ => (false, s),
    };
    match rest.as_bytes().first() {
        Some(c) if c.is_ascii_digit() || *c == b'.' => {
            // Rust's grammar for what follows a sign and starts with a digit or '.' is exactly
            // `(digits [. digits*] | . digits) [(e|E) [+-] digits]`, the same as Go's decimal form.
            match s.parse::<f64>() {
                Ok(v) if v.is_finite() => Ok(v),
                Ok(_) => Err("value out of range for f64"),
                Err(_) => Err("invalid value"),
            }
        }
        Some(b'i' | b'I')
            if rest.eq_ignore_ascii_case("inf") || rest.eq_ignore_ascii_case("infinity") =>
        {
            Ok(if neg {
                f64::NEG_INFINITY
            } else {
                f64::INFINITY
            })
        }
        Some(b'n' | b'N') if rest.len() == s.len() && rest.eq_ignore_ascii_case("nan") => {
            Ok(f64::from_bits(NORMAL_NAN_BITS))
        }
        None => Err("missing value"),
        _ => Err("invalid value"),
    }
}

/// Prometheus text timestamp: integer milliseconds (optional sign) → microseconds.
fn parse_prom_timestamp_us(s: &str) -> Result<i64, &'static str> {
    let b = s.as_bytes();
    let digits = match b.first() {
        Some(b'+' | b'-') => &b[1..],
        _ => b,
    };
    if digits.is_empty() || !digits.iter().all(u8::is_ascii_digit) {
        return Err("invalid timestamp (Prometheus text wants integer milliseconds)");
    }
    s.parse::<i64>()
        .ok()
        .and_then(|ms| ms.checked_mul(1000))
        .ok_or("timestamp out of range")
}

/// OpenMetrics timestamp: seconds as `[+-]digits[.digits][(e|E)[+-]digits]` → microseconds,
/// exactly. Trailing zeros beyond microseconds are fine; any non-zero digit below a
/// microsecond is an error (no rounding).
fn parse_om_timestamp_us(s: &str) -> Result<i64, &'static str> {
    const INVALID: &str = "invalid timestamp (OpenMetrics wants seconds, e.g. 1700000000.123)";
    const RANGE: &str = "timestamp out of range";
    let b = s.as_bytes();
    let mut i = 0;
    let neg = match b.first() {
        Some(b'-') => {
            i = 1;
            true
        }
        Some(b'+') => {
            i = 1;
            false
        }
        _ => false,
    };
    // Significant digits without trailing zeros; zeros not yet folded in are `pending_zeros`.
    let mut mant: u128 = 0;
    let mut pending_zeros: i64 = 0;
    let mut frac_digits: i64 = 0;
    let mut n_digits = 0usize;
    let mut seen_dot = false;
    while i < b.len() {
        let c = b[i];
        if c.is_ascii_digit() {
            n_digits += 1;
            if seen_dot {
                frac_digits += 1;
            }
            if c == b'0' {
                if mant != 0 {
                    pending_zeros += 1;
                }
            } else {
                for _ in 0..=pending_zeros {
                    mant = mant.checked_mul(10).ok_or(RANGE)?;
                }
                mant = mant.checked_add(u128::from(c - b'0')).ok_or(RANGE)?;
                pending_zeros = 0;
            }
        } else if c == b'.' && !seen_dot {
            seen_dot = true;
        } else {
            break;
        }
        i += 1;
    }
    if n_digits == 0 {
        return Err(INVALID);
    }
    let mut exp: i64 = 0;
    if i < b.len() && (b[i] == b'e' || b[i] == b'E') {
        i += 1;
        let exp_neg = match b.get(i) {
            Some(b'-') => {
                i += 1;
                true
            }
            Some(b'+') => {
                i += 1;
                false
            }
            _ => false,
        };
        let exp_start = i;
        while i < b.len() && b[i].is_ascii_digit() {
            // Saturate: anything this large is out of range or sub-microsecond anyway.
            exp = (exp * 10 + i64::from(b[i] - b'0')).min(1_000_000);
            i += 1;
        }
        if i == exp_start {
            return Err(INVALID);
        }
        if exp_neg {
            exp = -exp;
        }
    }
    if i != b.len() {
        return Err(INVALID);
    }
    if mant == 0 {
        return Ok(0);
    }
    // value_us = mant * 10^(pending_zeros + exp - frac_digits + 6)
    let shift = pending_zeros + exp - frac_digits + 6;
    if shift < 0 {
        return Err("timestamp has sub-microsecond digits (more than 6 fractional digits)");
    }
    if shift > 38 {
        return Err(RANGE);
    }
    let mag = mant.checked_mul(10u128.pow(shift as u32)).ok_or(RANGE)?;
    if neg {
        if mag > 1u128 << 63 {
            return Err(RANGE);
        }
        Ok((mag as i128).wrapping_neg() as i64)
    } else {
        i64::try_from(mag).map_err(|_| RANGE)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn one(format: Format, line: &str) -> Sample<'_> {
        let mut p = Parser::new(format);
        p.parse_line(line)
            .unwrap_or_else(|e| panic!("{line:?}: {e}"))
            .unwrap_or_else(|| panic!("{line:?}: not a sample"))
    }

    fn prom(line: &str) -> Sample<'_> {
        one(Format::PrometheusText, line)
    }

    fn om(line: &str) -> Sample<'_> {
        one(Format::OpenMetrics, line)
    }

    fn err(format: Format, line: &str) -> ParseError {
        let mut p = Parser::new(format);
        match p.parse_line(line) {
            Err(e) => e,
            Ok(s) => panic!("{line:?} should fail, got {s:?}"),
        }
    }

    fn value(s: &str) -> f64 {
        prom(&format!("m {s}")).value
    }

    #[test]
    fn simple_sample() {
        let s = prom("node_cpu_seconds_total{cpu=\"0\",mode=\"idle\"} 12345.67");
        assert_eq!(s.metric, "node_cpu_seconds_total");
        assert_eq!(s.labels, "cpu=\"0\",mode=\"idle\"");
        assert!(matches!(s.labels, Cow::Borrowed(_)));
        assert_eq!(s.value, 12345.67);
        assert_eq!(s.timestamp_us, None);

        let s = prom("up 1");
        assert_eq!((s.metric, &*s.labels, s.value), ("up", "", 1.0));
        assert!(matches!(s.labels, Cow::Borrowed("")));
        let s = prom("up{} 1");
        assert_eq!((s.metric, &*s.labels), ("up", ""));
        let s = prom("ns:rule:rate5m 0.5");
        assert_eq!(s.metric, "ns:rule:rate5m");
    }

    /// Scrape limits: a label set past `label_limit` or a value past
    /// `label_value_length_limit_bytes` is a limit error, in any label order and with escapes
    /// counted as the bytes they stand for; a set at the limits parses as before.
    #[test]
    fn label_limits_are_errors_of_their_own() {
        let limits = Limits {
            label_limit: 3,
            label_value_length_limit_bytes: 4,
        };
        fn parse(limits: Limits, line: &str) -> Result<Option<Sample<'_>>, ParseError> {
            Parser::with_limits(Format::PrometheusText, limits).parse_line(line)
        }
        let parse = |line| parse(limits, line);
        // At the limits: three labels, a value of four bytes (`\"` is one).
        for line in [
            "m{a=\"1\",b=\"x\\\"yz\",c=\"\"} 1",
            "m{c=\"\",b=\"x\\\"yz\",a=\"1\"} 1",
        ] {
            let sample = parse(line).unwrap().unwrap();
            assert_eq!(sample.labels, "a=\"1\",b=\"x\\\"yz\",c=\"\"");
        }
        for line in [
            "m{a=\"1\",b=\"2\",c=\"3\",d=\"4\"} 1",
            "m{d=\"4\",c=\"3\",b=\"2\",a=\"1\"} 1",
        ] {
            let e = parse(line).unwrap_err();
            assert_eq!(e.limit, Some(LimitExceeded::LabelLimit(3)), "{e}");
            assert!(
                e.reason.contains("4 labels, more than label_limit 3"),
                "{e}"
            );
        }
        // An unknown escape is two bytes (a literal backslash and the letter).
        for line in ["m{b=\"12345\"} 1", "m{z=\"\\t123\",a=\"1\"} 1"] {
            let e = parse(line).unwrap_err();
            assert_eq!(
                e.limit,
                Some(LimitExceeded::LabelValueLengthLimit(4)),
                "{e}"
            );
            assert!(
                e.reason
                    .contains("longer than label_value_length_limit_bytes 4"),
                "{e}"
            );
        }
        // Syntax errors stay syntax errors; exemplars are not bounded.
        assert_eq!(parse("m{a=\"1\"").unwrap_err().limit, None);
        assert!(parse("m 1 # {a=\"1\",b=\"2\",c=\"3\",d=\"123456\"} 1")
            .unwrap()
            .is_some());
        // Without limits, as for `vtax import`, nothing is bounded.
        let long = format!("m{{a=\"{}\"}} 1", "x".repeat(1 << 20));
        assert!(Parser::new(Format::PrometheusText)
            .parse_line(&long)
            .is_ok());
    }

    #[test]
    fn canonical_order_and_escaping() {
        let canon = "a=\"1\",b=\"x\\\\y\\\"z\\nw\",c=\"\"";
        let line = format!("m{{{canon}}} 1");
        let s = prom(&line);
        assert_eq!(s.labels, canon);
        assert!(matches!(s.labels, Cow::Borrowed(_)));

        let variants = [
            "m{c=\"\",b=\"x\\\\y\\\"z\\nw\",a=\"1\"} 1",
            "m{b=\"x\\\\y\\\"z\\nw\",a=\"1\",c=\"\"} 1",
            "m{a=\"1\",b=\"x\\\\y\\\"z\\nw\",c=\"\",} 1",
            "m { a = \"1\" , b=\"x\\\\y\\\"z\\nw\",\tc=\"\" } 1",
            "m{ c=\"\", a=\"1\", b=\"x\\\\y\\\"z\\nw\", } 1",
        ];
        for v in variants {
            let s = prom(v);
            assert_eq!(s.labels, canon, "{v}");
            assert!(matches!(s.labels, Cow::Owned(_)), "{v}");
            assert_eq!(s.metric, "m");
            let s = om(v);
            assert_eq!(s.labels, canon, "{v}");
        }

        // Unknown escapes keep the backslash literally (as Prometheus does), so `\t` and `\\t`
        // denote the same value and canonicalise to `\\t`.
        assert_eq!(prom("m{a=\"x\\ty\"} 1").labels, "a=\"x\\\\ty\"");
        assert_eq!(prom("m{a=\"x\\\\ty\"} 1").labels, "a=\"x\\\\ty\"");
        assert!(matches!(
            prom("m{a=\"x\\\\ty\"} 1").labels,
            Cow::Borrowed(_)
        ));
        // Non-ASCII values are kept intact, including after a literal backslash.
        assert_eq!(
            prom("m{b=\"é\\ü\",a=\"ß\"} 1").labels,
            "a=\"ß\",b=\"é\\\\ü\""
        );
        // Escaped `}` `,` `=` inside values do not confuse the scanner.
        let s = prom("m{z=\"}\",y=\",\",x=\"=\\\"}\"} 2");
        assert_eq!(s.labels, "x=\"=\\\"}\",y=\",\",z=\"}\"");
        assert_eq!(s.value, 2.0);
        // Byte order of names: uppercase sorts before lowercase, `_` between.
        assert_eq!(
            prom("m{b=\"1\",_a=\"2\",B=\"3\",a_=\"4\",a=\"5\"} 1").labels,
            "B=\"3\",_a=\"2\",a=\"5\",a_=\"4\",b=\"1\""
        );
        // A name that is a prefix of another.
        assert_eq!(
            prom("m{job_name=\"1\",job=\"2\"} 1").labels,
            "job=\"2\",job_name=\"1\""
        );
    }

    #[test]
    fn duplicate_labels() {
        for line in [
            "m{a=\"1\",a=\"2\"} 1",
            "m{a=\"1\",b=\"2\",a=\"3\"} 1",
            "m{b=\"1\",a=\"2\",b=\"1\"} 1",
        ] {
            let e = err(Format::PrometheusText, line);
            assert!(e.reason.contains("duplicate label name"), "{line}: {e}");
        }
    }

    #[test]
    fn value_spellings() {
        let cases: &[(&str, f64)] = &[
            ("1", 1.0),
            ("-1", -1.0),
            ("+1", 1.0),
            ("1.", 1.0),
            (".5", 0.5),
            ("-.5", -0.5),
            ("0.1", 0.1),
            ("1e3", 1000.0),
            ("1E3", 1000.0),
            ("1e+3", 1000.0),
            ("1.5e-3", 0.0015),
            ("007", 7.0),
            ("12345.67", 12345.67),
            ("1e308", 1e308),
            ("1.7976931348623157e308", f64::MAX),
            ("-1.7976931348623157e308", f64::MIN),
            ("2.2250738585072014e-308", f64::MIN_POSITIVE),
            ("1e-400", 0.0),
            ("+Inf", f64::INFINITY),
            ("Inf", f64::INFINITY),
            ("inf", f64::INFINITY),
            ("INF", f64::INFINITY),
            ("+infinity", f64::INFINITY),
            ("Infinity", f64::INFINITY),
            ("-Inf", f64::NEG_INFINITY),
            ("-inf", f64::NEG_INFINITY),
            ("-Infinity", f64::NEG_INFINITY),
        ];
        for &(s, want) in cases {
            assert_eq!(value(s).to_bits(), want.to_bits(), "{s}");
            assert_eq!(om(&format!("m {s}")).value.to_bits(), want.to_bits(), "{s}");
        }
        // Negative zero keeps its sign.
        assert_eq!(value("-0").to_bits(), (-0.0f64).to_bits());
        assert_eq!(value("-0.0e5").to_bits(), (-0.0f64).to_bits());
        assert_eq!(value("0").to_bits(), 0);
        // Subnormals.
        assert_eq!(value("5e-324").to_bits(), 1);
        assert_eq!(value("4.9406564584124654e-324").to_bits(), 1);
        assert_eq!(value("-5e-324").to_bits(), 1 | (1 << 63));
        assert_eq!(
            value("2.225073858507201e-308").to_bits(),
            0x000f_ffff_ffff_ffff
        );
        // NaN spellings give Prometheus' normal NaN.
        for s in ["NaN", "nan", "NAN", "nAn"] {
            assert_eq!(value(s).to_bits(), NORMAL_NAN_BITS, "{s}");
        }
    }

    #[test]
    fn invalid_values() {
        for s in [
            "-NaN", "+NaN", "0x10", "0x1p3", "1p3", "1_000", "1e", "1e+", "e1", ".", "+", "-",
            "-.", ".e1", "abc", "1.2.3", "Infx", "in", "infinit", "nanx", "--1", "+-1", "1,5",
            "1e309", "-1e309", "١", "true",
        ] {
            let e = err(Format::PrometheusText, &format!("m {s}"));
            assert_eq!(e.line, 1);
            assert!(
                e.reason.contains("value"),
                "{s}: reason should mention the value: {e}"
            );
            err(Format::OpenMetrics, &format!("m {s}"));
        }
        let e = err(Format::PrometheusText, "m 1e309");
        assert!(e.reason.contains("out of range"), "{e}");
    }

    /// xorshift64* — deterministic randomness without a dependency.
    struct XorShift(u64);
    impl XorShift {
        fn next(&mut self) -> u64 {
            let mut x = self.0;
            x ^= x >> 12;
            x ^= x << 25;
            x ^= x >> 27;
            self.0 = x;
            x.wrapping_mul(0x2545_f491_4f6c_dd1d)
        }
    }

    #[test]
    fn random_f64_round_trip() {
        let mut rng = XorShift(0x9e37_79b9_7f4a_7c15);
        let mut p = Parser::new(Format::PrometheusText);
        let mut checked = 0;
        let mut lines = 0;
        for k in 0..20_000u64 {
            let mut bits = rng.next();
            // Bias some draws towards subnormals and tiny/huge exponents.
            match k % 4 {
                1 => bits &= 0x800f_ffff_ffff_ffff,
                2 => bits = (bits & 0x800f_ffff_ffff_ffff) | (0x7fe << 52),
                _ => {}
            }
            let f = f64::from_bits(bits);
            if f.is_nan() {
                continue;
            }
            for text in [format!("{f:?}"), format!("{f}"), format!("{f:e}")] {
                let line = format!("m{{i=\"{k}\"}} {text}");
                let s = p.parse_line(&line).unwrap().unwrap();
                assert_eq!(s.value.to_bits(), bits, "{text}");
                checked += 1;
                lines += 1;
            }
            let line = format!("m {f:?} 1700000000000");
            let s = p.parse_line(&line).unwrap().unwrap();
            assert_eq!(s.value.to_bits(), bits);
            lines += 1;
        }
        assert!(checked > 50_000);
        assert_eq!(p.line_number(), lines);
    }

    #[test]
    fn prometheus_timestamps() {
        let s = prom("m 1 1700000000123");
        assert_eq!(s.timestamp_us, Some(1_700_000_000_123_000));
        assert_eq!(prom("m 1 0").timestamp_us, Some(0));
        assert_eq!(prom("m 1 -1000").timestamp_us, Some(-1_000_000));
        assert_eq!(prom("m 1 +5").timestamp_us, Some(5_000));
        assert_eq!(
            prom("m 1 9223372036854775").timestamp_us,
            Some(9_223_372_036_854_775_000)
        );
        for bad in [
            "1.5",
            "1700000000.123",
            "1e3",
            "abc",
            "-",
            "+",
            "0x10",
            "9223372036854776",
            "99999999999999999999999",
        ] {
            let e = err(Format::PrometheusText, &format!("m 1 {bad}"));
            assert!(e.reason.contains("timestamp"), "{bad}: {e}");
        }
    }

    #[test]
    fn openmetrics_timestamps() {
        let cases: &[(&str, i64)] = &[
            ("1700000000.5", 1_700_000_000_500_000),
            ("1.000001", 1_000_001),
            ("1700000000", 1_700_000_000_000_000),
            ("1700000000.123", 1_700_000_000_123_000),
            ("1700000000.123456", 1_700_000_000_123_456),
            ("1700000000.123456000", 1_700_000_000_123_456),
            ("1700000000.000000000", 1_700_000_000_000_000),
            ("-1.5", -1_500_000),
            ("-0.000001", -1),
            ("+2", 2_000_000),
            ("0", 0),
            ("-0", 0),
            ("0.0", 0),
            (".5", 500_000),
            ("5.", 5_000_000),
            ("0001.5", 1_500_000),
            ("1.7e9", 1_700_000_000_000_000),
            ("1.700000000123e+09", 1_700_000_000_123_000),
            ("1E3", 1_000_000_000),
            ("1500e-3", 1_500_000),
            ("1e-6", 1),
            ("0e-99", 0),
            ("100000000000000000000e-20", 1_000_000),
            ("-9223372036854.775808", i64::MIN),
            ("9223372036854.775807", i64::MAX),
        ];
        for &(s, want) in cases {
            assert_eq!(om(&format!("m 1 {s}")).timestamp_us, Some(want), "{s}");
            assert_eq!(parse_om_timestamp_us(s), Ok(want), "{s}");
        }
        for bad in [
            "1.0000001",
            "1700000000.1234567",
            "1e-7",
            "0.0000001",
            "9223372036854.775808",
            "-9223372036854.775809",
            "1e300",
            "1e99999999999",
            "NaN",
            "Inf",
            "+Inf",
            "abc",
            "1.2.3",
            "1e",
            "1e+",
            ".",
            "-",
            "1_0",
            "0x10",
        ] {
            let e = err(Format::OpenMetrics, &format!("m 1 {bad}"));
            assert!(e.reason.contains("timestamp"), "{bad}: {e}");
        }
        let e = err(Format::OpenMetrics, "m 1 1.0000001");
        assert!(e.reason.contains("sub-microsecond"), "{e}");
    }

    #[test]
    fn exemplars() {
        let s = om("foo_bucket{le=\"0.5\"} 3 # {trace_id=\"oHg5SJYRHA0\"} 0.3 1520879607.789");
        assert_eq!(
            (s.metric, &*s.labels, s.value),
            ("foo_bucket", "le=\"0.5\"", 3.0)
        );
        assert_eq!(s.timestamp_us, None);
        let s = om("foo_total 17 1520879607.789 # {trace_id=\"KOO5S4vxi0o\"} 0.67");
        assert_eq!(s.value, 17.0);
        assert_eq!(s.timestamp_us, Some(1_520_879_607_789_000));
        let s = om("foo_bucket{le=\"+Inf\"} 5 # {} 1");
        assert_eq!(s.labels, "le=\"+Inf\"");
        let s = prom("foo_bucket{le=\"1\"} 5 1700000000000 # {a=\"b\",c=\"d\"} 1.5 1700000000.5");
        assert_eq!(s.timestamp_us, Some(1_700_000_000_000_000));

        for bad in [
            "foo 1 # {a=\"b\"}",
            "foo 1 # {a=\"b\"} x",
            "foo 1 # {a=\"b\"} 1 2 3",
            "foo 1 # {a=\"b\"} 1 NaN",
            "foo 1 # {a=\"b\" 1",
            "foo 1 # {a=b} 1",
            "foo 1 # garbage",
            "foo 1 #{a=\"b\"} 1",
            "foo 1 #",
            "foo 1 2 # ",
        ] {
            let e = err(Format::OpenMetrics, bad);
            assert!(e.reason.contains("exemplar"), "{bad}: {e}");
        }
    }

    #[test]
    fn whitespace_and_comments() {
        let mut p = Parser::new(Format::PrometheusText);
        assert!(p.parse_line("").unwrap().is_none());
        assert!(p.parse_line("   \t").unwrap().is_none());
        assert!(p.parse_line("# HELP m Some help.").unwrap().is_none());
        assert!(p.parse_line("# TYPE m gauge").unwrap().is_none());
        assert!(p.parse_line("#plain comment").unwrap().is_none());
        assert!(p.parse_line("  # indented comment").unwrap().is_none());
        let s = p.parse_line("  m{a=\"1\"}\t \t2   3  \r").unwrap().unwrap();
        assert_eq!((s.metric, &*s.labels, s.value), ("m", "a=\"1\"", 2.0));
        assert_eq!(s.timestamp_us, Some(3000));
        let s = p.parse_line("m{a=\"1\"}2").unwrap().unwrap();
        assert_eq!(s.value, 2.0);
        assert_eq!(p.line_number(), 8);

        let mut p = Parser::new(Format::OpenMetrics);
        let s = p.parse_line("\u{feff}m 1").unwrap().unwrap();
        assert_eq!(s.metric, "m");
    }

    #[test]
    fn malformed_lines() {
        let cases: &[(&str, &str)] = &[
            ("m", "missing value"),
            ("m{a=\"1\"}", "missing value"),
            ("m{a=\"1\"}   ", "missing value"),
            ("m{a=\"1\"", "missing `}`"),
            ("m{a=\"1\",", "missing `}`"),
            ("m{a=\"1", "unterminated"),
            ("m{a=\"1\\\"} 1", "unterminated"),
            ("m{a=\"1\\", "unterminated"),
            ("m{a=1} 1", "expected `\"`"),
            ("m{a} 1", "expected `=`"),
            ("m{a=\"1\" b=\"2\"} 1", "expected `,` or `}`"),
            ("m{,} 1", "expected label name"),
            ("m{a=\"1\",,b=\"2\"} 1", "expected label name"),
            ("m{1a=\"1\"} 1", "expected label name"),
            ("m{a:b=\"1\"} 1", "expected `=`"),
            ("m{a.b=\"1\"} 1", "expected `=`"),
            ("1m 1", "expected metric name"),
            ("{__name__=\"m\"} 1", "expected metric name"),
            ("m.x 1", "invalid character '.' in metric name"),
            ("m-x 1", "invalid character '-' in metric name"),
            ("m 1 2 3", "unexpected content"),
            ("m 1 2 x", "unexpected content"),
            ("m abc", "invalid value"),
            ("m 1x", "invalid value"),
        ];
        for &(line, want) in cases {
            let e = err(Format::PrometheusText, line);
            assert!(e.reason.contains(want), "{line:?}: got {e}, want {want:?}");
            assert_eq!(e.text, line);
            let e = err(Format::OpenMetrics, line);
            assert!(e.reason.contains(want), "{line:?}: got {e}, want {want:?}");
        }
    }

    #[test]
    fn error_line_numbers_and_text() {
        let input = "# HELP m help\n# TYPE m gauge\nm{a=\"1\"} 1\n\nm{a=\"2\"} zzz\nm 3";
        let mut p = Parser::new(Format::PrometheusText);
        let mut errors = vec![];
        let mut samples = 0;
        for line in input.split('\n') {
            match p.parse_line(line) {
                Ok(Some(_)) => samples += 1,
                Ok(None) => {}
                Err(e) => errors.push(e),
            }
        }
        assert_eq!(samples, 2);
        assert_eq!(errors.len(), 1);
        assert_eq!(errors[0].line, 5);
        assert_eq!(errors[0].text, "m{a=\"2\"} zzz");
        assert!(errors[0].reason.contains("invalid value \"zzz\""));
        let msg = errors[0].to_string();
        assert!(msg.starts_with("line 5: invalid value"), "{msg}");
        assert_eq!(p.line_number(), 6);

        // Long lines are truncated to 200 chars (not bytes) in the error.
        let long = format!("m{{a=\"{}\"}} nope", "é".repeat(500));
        let e = err(Format::PrometheusText, &long);
        assert_eq!(e.text.chars().count(), 200);
        assert!(long.starts_with(&e.text));
    }

    #[test]
    fn openmetrics_eof() {
        let mut p = Parser::new(Format::OpenMetrics);
        for line in [
            "# TYPE foo counter",
            "# UNIT foo seconds",
            "# HELP foo Help.",
            "foo_total 1 1700000000",
            "foo_total 2 1700000015.5",
            "# EOF",
            "",
        ] {
            p.parse_line(line).unwrap();
        }
        p.finish().unwrap();
        assert_eq!(p.line_number(), 7);

        // Truncated: no `# EOF`.
        let mut p = Parser::new(Format::OpenMetrics);
        p.parse_line("foo_total 1 1700000000").unwrap();
        let e = p.finish().unwrap_err();
        assert!(e.reason.contains("# EOF"), "{e}");
        assert_eq!(e.line, 1);
        // Empty input is truncated too.
        assert!(Parser::new(Format::OpenMetrics).finish().is_err());

        // Content after `# EOF`: an error at that line, and again from finish().
        let mut p = Parser::new(Format::OpenMetrics);
        p.parse_line("foo_total 1 1700000000").unwrap();
        assert!(p.parse_line("# EOF").unwrap().is_none());
        assert!(p.parse_line("").unwrap().is_none());
        let e = p.parse_line("foo_total 2 1700000001").unwrap_err();
        assert_eq!(e.line, 4);
        assert!(e.reason.contains("after `# EOF`"));
        let e = p.parse_line("# EOF").unwrap_err();
        assert_eq!(e.line, 5);
        let e = p.finish().unwrap_err();
        assert_eq!(e.line, 4);
        assert_eq!(e.text, "foo_total 2 1700000001");

        // `# EOF` with trailing `\r` / spaces is still EOF.
        let mut p = Parser::new(Format::OpenMetrics);
        p.parse_line("# EOF\r").unwrap();
        p.finish().unwrap();

        // Prometheus text has no end marker.
        let mut p = Parser::new(Format::PrometheusText);
        p.parse_line("m 1").unwrap();
        p.finish().unwrap();
        // `# EOF` in Prometheus text without timestamps is a harmless comment...
        p.parse_line("# EOF").unwrap();
        p.finish().unwrap();
        // ...but with timestamped samples the unit would be wrong: refuse.
        let mut p = Parser::new(Format::PrometheusText);
        p.parse_line("m 1 1700000000").unwrap();
        let e = p.parse_line("# EOF").unwrap_err();
        assert_eq!(e.line, 2);
        assert!(e.reason.contains("OpenMetrics"));
        let mut p = Parser::new(Format::PrometheusText);
        p.parse_line("# EOF").unwrap();
        assert!(p.parse_line("m 1 1700000000").is_err());
    }

    #[test]
    fn detect_format() {
        use Format::*;
        assert_eq!(Parser::detect("m 1\n", "metrics.txt"), PrometheusText);
        assert_eq!(Parser::detect("m 1\n", "metrics.om"), OpenMetrics);
        assert_eq!(Parser::detect("m 1\n", "/x/dump.OpenMetrics"), OpenMetrics);
        assert_eq!(Parser::detect("m 1 1\n# EOF\n", "x"), OpenMetrics);
        assert_eq!(Parser::detect("m 1 1\r\n# EOF\r\n", "x"), OpenMetrics);
        assert_eq!(Parser::detect("m 1 1\n# EOF", "x"), OpenMetrics);
        assert_eq!(
            Parser::detect("# TYPE a counter\n# UNIT a seconds\na_total 1\n", "x"),
            OpenMetrics
        );
        assert_eq!(Parser::detect("# TYPE a unknown\na 1\n", "x"), OpenMetrics);
        assert_eq!(
            Parser::detect("# TYPE a info\na_info 1\n", "x"),
            OpenMetrics
        );
        assert_eq!(
            Parser::detect("# TYPE a untyped\na 1\n", "x"),
            PrometheusText
        );
        assert_eq!(
            Parser::detect("# HELP a mentions # EOF\na 1\n", "x"),
            PrometheusText
        );
        assert_eq!(Parser::detect("", ""), PrometheusText);
        assert_eq!(Parser::new(OpenMetrics).format(), OpenMetrics);
    }

    #[test]
    fn node_exporter_file() {
        let text = r#"# HELP go_gc_duration_seconds A summary of the pause duration of garbage collection cycles.
# TYPE go_gc_duration_seconds summary
go_gc_duration_seconds{quantile="0"} 2.4458e-05
go_gc_duration_seconds{quantile="0.25"} 3.1839e-05
go_gc_duration_seconds_sum 0.017370247
go_gc_duration_seconds_count 371
# HELP node_cpu_seconds_total Seconds the CPUs spent in each mode.
# TYPE node_cpu_seconds_total counter
node_cpu_seconds_total{cpu="0",mode="idle"} 12345.67
node_cpu_seconds_total{cpu="0",mode="iowait"} 6.96
node_cpu_seconds_total{cpu="1",mode="user"} 1133.24
# HELP node_filesystem_avail_bytes Filesystem space available to non-root users in bytes.
# TYPE node_filesystem_avail_bytes gauge
node_filesystem_avail_bytes{device="/dev/nvme0n1p2",fstype="ext4",mountpoint="/"} 3.0470553088e+11
# HELP node_network_info Non-numeric data from /sys/class/net/<iface>, value is always 1.
# TYPE node_network_info gauge
node_network_info{address="00:00:00:00:00:00",broadcast="00:00:00:00:00:00",device="lo",duplex="",ifalias="",operstate="unknown"} 1
# HELP node_scrape_collector_duration_seconds node_exporter: Duration of a collector scrape.
# TYPE node_scrape_collector_duration_seconds gauge
node_scrape_collector_duration_seconds{collector="cpu"} 0.000262914
# HELP node_textfile_scrape_error 1 if there was an error opening or reading a file, 0 otherwise
# TYPE node_textfile_scrape_error gauge
node_textfile_scrape_error 0
# HELP process_start_time_seconds Start time of the process since unix epoch in seconds.
# TYPE process_start_time_seconds gauge
process_start_time_seconds 1.70000032117e+09
# HELP promhttp_metric_handler_requests_total Total number of scrapes by HTTP status code.
# TYPE promhttp_metric_handler_requests_total counter
promhttp_metric_handler_requests_total{code="200"} 4
# HELP http_request_duration_seconds A histogram.
# TYPE http_request_duration_seconds histogram
http_request_duration_seconds_bucket{handler="/metrics",le="0.1"} 10
http_request_duration_seconds_bucket{handler="/metrics",le="+Inf"} 12
http_request_duration_seconds_sum{handler="/metrics"} 0.75
http_request_duration_seconds_count{handler="/metrics"} 12
weird_metric{mode="idle",cpu="0"} NaN
"#;
        assert_eq!(Parser::detect(text, "node.prom"), Format::PrometheusText);
        let mut p = Parser::new(Format::PrometheusText);
        let mut out = vec![];
        for line in text.lines() {
            if let Some(s) = p.parse_line(line).unwrap() {
                out.push(s);
            }
        }
        p.finish().unwrap();
        assert_eq!(out.len(), 18);
        assert_eq!(p.line_number(), text.lines().count() as u64);
        assert!(out.iter().all(|s| s.timestamp_us.is_none()));
        let cpu = &out[4];
        assert_eq!(cpu.metric, "node_cpu_seconds_total");
        assert_eq!(cpu.labels, "cpu=\"0\",mode=\"idle\"");
        assert_eq!(cpu.value, 12345.67);
        assert_eq!(out[0].value, 2.4458e-05);
        assert_eq!(out[3].value, 371.0);
        assert_eq!(out[7].value, 3.0470553088e+11);
        assert_eq!(
            out[8].labels,
            "address=\"00:00:00:00:00:00\",broadcast=\"00:00:00:00:00:00\",device=\"lo\",duplex=\"\",ifalias=\"\",operstate=\"unknown\""
        );
        assert_eq!(out[11].value, 1.70000032117e+09);
        assert_eq!(out[14].labels, "handler=\"/metrics\",le=\"+Inf\"");
        assert_eq!(out[16].labels, "handler=\"/metrics\"");
        // All node_exporter lines are already canonical: nothing allocated.
        assert!(out[..17]
            .iter()
            .all(|s| matches!(s.labels, Cow::Borrowed(_))));
        let weird = &out[17];
        assert_eq!(weird.labels, "cpu=\"0\",mode=\"idle\"");
        assert!(matches!(weird.labels, Cow::Owned(_)));
        assert_eq!(weird.value.to_bits(), NORMAL_NAN_BITS);
    }

    #[test]
    fn openmetrics_file() {
        let text = "# TYPE acme_http_router_request_seconds summary\n\
# UNIT acme_http_router_request_seconds seconds\n\
# HELP acme_http_router_request_seconds Latency though all of ACME's HTTP request router.\n\
acme_http_router_request_seconds_sum{path=\"/api/v1\",method=\"GET\"} 9036.32 1700000000.000\n\
acme_http_router_request_seconds_count{path=\"/api/v1\",method=\"GET\"} 807283.0 1700000000.000\n\
acme_http_router_request_seconds_created{path=\"/api/v1\",method=\"GET\"} 1605281325.0 1700000000.000\n\
acme_http_router_request_seconds_sum{path=\"/api/v1\",method=\"GET\"} 9037.5 1700000015.25\n\
# TYPE go_goroutines gauge\n\
go_goroutines 69 1700000000\n\
# TYPE foo histogram\n\
foo_bucket{le=\"0.01\"} 0 1700000000.5\n\
foo_bucket{le=\"+Inf\"} 17 1700000000.5 # {trace_id=\"KOO5S4vxi0o\"} 0.67 1700000000.4\n\
# EOF\n";
        assert_eq!(Parser::detect(text, "dump.txt"), Format::OpenMetrics);
        let mut p = Parser::new(Format::OpenMetrics);
        let mut out = vec![];
        for line in text.split('\n') {
            if let Some(s) = p.parse_line(line).unwrap() {
                out.push(s);
            }
        }
        p.finish().unwrap();
        assert_eq!(out.len(), 7);
        assert_eq!(out[0].labels, "method=\"GET\",path=\"/api/v1\"");
        assert_eq!(out[0].timestamp_us, Some(1_700_000_000_000_000));
        assert_eq!(out[3].value, 9037.5);
        assert_eq!(out[3].timestamp_us, Some(1_700_000_015_250_000));
        assert_eq!(out[4].metric, "go_goroutines");
        assert_eq!(out[6].value, 17.0);
        assert_eq!(out[6].timestamp_us, Some(1_700_000_000_500_000));
    }

    /// Real expositions damaged at random, 3,000 times a format: bytes
    /// flipped or set to the characters the grammar turns on, lines cut,
    /// spans repeated or removed. Parsing never panics; every error names a
    /// line that exists and quotes at most 200 characters of it; every
    /// sample's name and canonical labels read back as the same.
    #[test]
    fn damaged_expositions_give_errors_with_line_numbers_never_panics() {
        use rand::{RngExt, SeedableRng};
        let golden = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../tests/golden/baremetal-node.prom"
        );
        let golden = std::fs::read_to_string(golden).unwrap();
        let seeds = [
            golden.as_str(),
            "# TYPE a counter\na_total{x=\"1\",y=\"\\\"q\\n\"} 1.5e3 1700000000.25 # {t=\"z\"} 1 1700000000\nb +Inf\nc NaN\n# EOF\n",
            "m{le=\"0.5\"} -0.0 -1700000000000\nn 0x1p3\no{a=\"b\",} 7\n",
        ];
        const SPECIAL: &[u8] = b"{}\"\\=,# \t\ne+-.09NIa_:\r";
        let mut rng = rand::rngs::StdRng::seed_from_u64(19);
        let (mut errors, mut samples) = (0, 0);
        for round in 0..6000 {
            let format = if round % 2 == 0 {
                Format::PrometheusText
            } else {
                Format::OpenMetrics
            };
            let mut bytes = seeds[rng.random_range(0..seeds.len())].as_bytes().to_vec();
            for _ in 0..rng.random_range(1..6) {
                let n = bytes.len().max(1);
                let at = rng.random_range(0..n).min(bytes.len().saturating_sub(1));
                match rng.random_range(0..5) {
                    0 if !bytes.is_empty() => bytes[at] ^= 1 << rng.random_range(0..8),
                    1 if !bytes.is_empty() => {
                        bytes[at] = SPECIAL[rng.random_range(0..SPECIAL.len())]
                    }
                    2 => bytes.truncate(at),
                    3 => {
                        let end = (at + rng.random_range(1..80)).min(bytes.len());
                        let span = bytes[at..end].to_vec();
                        bytes.splice(at..at, span);
                    }
                    _ => {
                        let end = (at + rng.random_range(1..80)).min(bytes.len());
                        bytes.drain(at..end);
                    }
                }
            }
            let text = String::from_utf8_lossy(&bytes);
            let lines: Vec<&str> = text.split('\n').collect();
            let mut parser = Parser::new(format);
            for (i, line) in lines.iter().enumerate() {
                let parsed = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    parser
                        .parse_line(line)
                        .map(|s| s.map(|s| (s.metric.to_owned(), s.labels.into_owned())))
                }))
                .unwrap_or_else(|_| panic!("round {round}: line {line:?} panicked"));
                match parsed {
                    Ok(None) => {}
                    Ok(Some((metric, labels))) => {
                        samples += 1;
                        let again = format!("{metric}{{{labels}}} 1");
                        let reparsed = Parser::new(Format::PrometheusText).parse_line(&again);
                        assert!(
                            matches!(&reparsed, Ok(Some(s)) if s.metric == metric && s.labels == labels),
                            "round {round}: {line:?} gave a sample that does not read back: {again:?} {reparsed:?}"
                        );
                    }
                    Err(e) => {
                        errors += 1;
                        assert_eq!(e.line, i as u64 + 1, "round {round}");
                        assert!(
                            e.text.chars().count() <= MAX_ERROR_TEXT_CHARS,
                            "round {round}"
                        );
                        assert!(!e.reason.is_empty());
                    }
                }
            }
            if let Err(e) = parser.finish() {
                assert!(e.line <= lines.len() as u64, "round {round}: {e}");
            }
        }
        eprintln!("6000 damaged expositions: {errors} errors, {samples} samples");
        assert!(errors > 1000, "the damage was seen: {errors} errors");
        assert!(samples > 100_000, "{samples} samples");
    }
}
