//! Label sets: parsed, checked against the limits, and written back in
//! canonical form.

use super::*;

/// Parses `name="value",...}` starting just after `{`. Returns the canonical label string and
/// the index just after `}`. With `limits` (a sample's labels) checks them, before any copy;
/// without (an exemplar's) only validates (returns "").
pub(super) fn parse_labels<'a>(
    line: &'a str,
    start: usize,
    end: usize,
    limits: Option<&Limits>,
) -> Result<(Cow<'a, str>, usize), SampleError> {
    let (close, canonical, stats) = scan_labels(line, start, end, None)?;
    let Some(limits) = limits else {
        return Ok((Cow::Borrowed(""), close + 1));
    };
    if stats.has_name_label {
        // The metric name is the series' `__name__`: a second one would give a label set that
        // Prometheus refuses ("label name is not unique") and that remote write cannot send.
        return Err(
            "label `__name__` in braces: the name before `{` is already the metric name"
                .to_string()
                .into(),
        );
    }
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
pub(super) fn push_canonical_escaped(out: &mut String, raw: &str) {
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

/// What [`scan_labels`] counted, for [`Limits`] (labels with an empty value not among them).
pub(super) struct LabelStats<'a> {
    pub(super) count: usize,
    /// The longest value, unescaped, and its label's name.
    pub(super) longest_value_bytes: usize,
    pub(super) longest_value_name: &'a str,
    /// Whether a label named `__name__` has a value.
    pub(super) has_name_label: bool,
}

/// Scans a label set starting just after `{`. Returns the index of the closing `}`, whether
/// `line[start..close]` is already canonical (sorted strictly by name, no whitespace, no
/// trailing comma, only canonical escapes, no empty value), and the label count and longest
/// value. Pushes `(name, raw value)` pairs when given a Vec. Duplicate names are reported here
/// only when adjacent in the text; when the names are not strictly increasing the set is not
/// canonical and the caller checks after sorting.
///
/// A label whose value is empty is left out, as if it were not written: in Prometheus' data
/// model `a=""` and no `a` are the same series, and Prometheus stores neither the label nor
/// counts it against `label_limit`. Keeping it would split one series in two.
pub(super) fn scan_labels<'a>(
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
        has_name_label: false,
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
        i += 1;
        if raw.is_empty() {
            canonical = false;
        } else {
            stats.count += 1;
            let value_bytes = raw.len() - one_byte_escapes;
            if value_bytes > stats.longest_value_bytes {
                stats.longest_value_bytes = value_bytes;
                stats.longest_value_name = name;
            }
            stats.has_name_label |= name == "__name__";
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
