//! `vtax import` against Prometheus' own OpenMetrics parser. The same files go through
//! `promtool tsdb create-blocks-from openmetrics` (read back with `promtool tsdb dump`) and
//! through the import (read back from the store), and each must store the same series, the
//! same value bits and the same timestamps: Prometheus' milliseconds are vtax's microseconds
//! truncated toward zero, as Prometheus truncates the seconds it reads.
//!
//! promtool's backfill needs a timestamp on every sample, so every sample here has one.

mod common;

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;
use std::process::Command;

use vtax_store::scan::scan_dir;
use vtax_store::{tables, Catalog, ScanRequest};

use common::{require_program, VTAX};

/// A sample's timestamp, in seconds, where one is not the point of the case.
const T: &str = "1700000000";

/// Prometheus' `value.NormalNaN`: what Go's `strconv.ParseFloat("NaN")` gives, and what the
/// dump prints as `NaN`.
const NORMAL_NAN_BITS: u64 = 0x7ff8_0000_0000_0001;

/// Label pairs, `__name__` among them, values unescaped, sorted by name.
type Series = Vec<(String, String)>;

/// What one side stored: per series and millisecond, the value bits of each sample there.
type Stored = BTreeMap<(Series, i64), Vec<u64>>;

#[derive(Debug)]
enum Outcome {
    Stored(Stored),
    Refused(String),
}

/// Runs promtool's backfill on `file` and dumps what it stored.
fn promtool(file: &Path, work: &Path) -> Outcome {
    let promtool = require_program("promtool");
    let blocks = work.join("promtool");
    let out = Command::new(&promtool)
        .args(["tsdb", "create-blocks-from", "openmetrics"])
        .arg(file)
        .arg(&blocks)
        .output()
        .unwrap();
    if !out.status.success() {
        return Outcome::Refused(format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    // The dump opens the blocks as a database, which wants a WAL folder.
    std::fs::create_dir_all(blocks.join("wal")).unwrap();
    let dump = Command::new(&promtool)
        .args(["tsdb", "dump"])
        .arg(&blocks)
        .output()
        .unwrap();
    assert!(
        dump.status.success(),
        "promtool tsdb dump: {}",
        String::from_utf8_lossy(&dump.stderr)
    );
    let mut stored = Stored::new();
    for line in String::from_utf8(dump.stdout).unwrap().lines() {
        let (series, value, ms) =
            parse_dump_line(line).unwrap_or_else(|e| panic!("dump line {line:?}: {e}"));
        stored.entry((series, ms)).or_default().push(value);
    }
    for values in stored.values_mut() {
        values.sort_unstable();
    }
    Outcome::Stored(stored)
}

/// Imports `file` into a data directory of its own and reads back every row.
fn vtax(file: &Path, work: &Path) -> Outcome {
    let data = work.join("vtax");
    let out = Command::new(VTAX)
        .args(["import", "--no-progress", "--data-dir"])
        .arg(&data)
        .arg(file)
        .output()
        .unwrap();
    if !out.status.success() {
        return Outcome::Refused(String::from_utf8_lossy(&out.stderr).into_owned());
    }
    let catalog = Catalog::new(tables::BUILTIN).unwrap();
    let request = ScanRequest {
        table: "scraped".into(),
        ..Default::default()
    };
    let result = scan_dir(&data, &catalog, &request).unwrap();
    let mut stored = Stored::new();
    for row in vtax_tests::stored_rows(&result.batches).unwrap() {
        let mut series = vec![("__name__".to_string(), row.metric.clone())];
        series.extend(
            parse_canonical_labels(&row.labels)
                .unwrap_or_else(|e| panic!("stored labels {:?}: {e}", row.labels)),
        );
        series.sort();
        // Integer division truncates toward zero, as Go's int64() does in Prometheus.
        let ms = row.time_us / 1000;
        let bits = row.value.expect("an imported value").to_bits();
        stored.entry((series, ms)).or_default().push(bits);
    }
    for values in stored.values_mut() {
        values.sort_unstable();
    }
    Outcome::Stored(stored)
}

/// `{__name__="m", a="x\n"} 1.5 1700000000123`: labels as Go's `strconv.Quote` writes
/// them, the value as Go's `%g`, the timestamp in milliseconds.
fn parse_dump_line(line: &str) -> Result<(Series, u64, i64), String> {
    if !line.starts_with('{') {
        return Err("no `{`".into());
    }
    let mut series = Series::new();
    let mut i = 1;
    while !line[i..].starts_with('}') {
        let eq = line[i..].find('=').ok_or("no `=`")? + i;
        let (value, next) = go_unquote(line, eq + 1)?;
        series.push((line[i..eq].to_string(), value));
        i = next;
        if line[i..].starts_with(", ") {
            i += 2;
        }
    }
    let mut fields = line[i + 1..].split_whitespace();
    let value = fields.next().ok_or("no value")?;
    let bits = if value == "NaN" {
        NORMAL_NAN_BITS
    } else {
        value
            .parse::<f64>()
            .map_err(|e| format!("value: {e}"))?
            .to_bits()
    };
    let ms = fields
        .next()
        .ok_or("no timestamp")?
        .parse::<i64>()
        .map_err(|e| format!("timestamp: {e}"))?;
    series.sort();
    Ok((series, bits, ms))
}

/// Reads the Go-quoted string starting at `s[at]` (a `"`); returns it and the index after it.
fn go_unquote(s: &str, at: usize) -> Result<(String, usize), String> {
    let b = s.as_bytes();
    if b.get(at) != Some(&b'"') {
        return Err(format!("no quoted value at {at}"));
    }
    let hex = |from: usize, n: usize| -> Result<u32, String> {
        s.get(from..from + n)
            .and_then(|h| u32::from_str_radix(h, 16).ok())
            .ok_or_else(|| format!("bad escape at {from}"))
    };
    let mut out = Vec::new();
    let mut i = at + 1;
    loop {
        match *b.get(i).ok_or("unterminated value")? {
            b'"' => {
                let value = String::from_utf8(out).map_err(|e| e.to_string())?;
                return Ok((value, i + 1));
            }
            b'\\' => {
                let e = *b.get(i + 1).ok_or("unterminated escape")?;
                let simple = match e {
                    b'a' => Some(7),
                    b'b' => Some(8),
                    b'f' => Some(12),
                    b'n' => Some(b'\n'),
                    b'r' => Some(b'\r'),
                    b't' => Some(b'\t'),
                    b'v' => Some(11),
                    b'\\' | b'"' | b'\'' => Some(e),
                    _ => None,
                };
                if let Some(byte) = simple {
                    out.push(byte);
                    i += 2;
                    continue;
                }
                let (code, len) = match e {
                    b'x' => (hex(i + 2, 2)?, 4),
                    b'u' => (hex(i + 2, 4)?, 6),
                    b'U' => (hex(i + 2, 8)?, 10),
                    _ => return Err(format!("unknown escape \\{}", e as char)),
                };
                if e == b'x' {
                    out.push(code as u8);
                } else {
                    let c = char::from_u32(code).ok_or("bad code point")?;
                    out.extend_from_slice(c.encode_utf8(&mut [0; 4]).as_bytes());
                }
                i += len;
            }
            byte => {
                out.push(byte);
                i += 1;
            }
        }
    }
}

/// Reads vtax's canonical label set: `a="x",b="y\"z"`, escaped `\\`, `\"`, `\n`.
fn parse_canonical_labels(s: &str) -> Result<Series, String> {
    let mut out = Series::new();
    let mut rest = s;
    while !rest.is_empty() {
        let eq = rest.find("=\"").ok_or("no `=\"`")?;
        let name = rest[..eq].to_string();
        let mut value = String::new();
        let mut chars = rest[eq + 2..].char_indices();
        let end = loop {
            match chars.next().ok_or("unterminated value")? {
                (i, '"') => break eq + 2 + i + 1,
                (_, '\\') => match chars.next().ok_or("unterminated escape")?.1 {
                    '\\' => value.push('\\'),
                    '"' => value.push('"'),
                    'n' => value.push('\n'),
                    c => return Err(format!("not canonical: \\{c}")),
                },
                (_, c) => value.push(c),
            }
        };
        out.push((name, value));
        rest = &rest[end..];
        if let Some(after) = rest.strip_prefix(',') {
            rest = after;
        } else if !rest.is_empty() {
            return Err(format!("expected `,` at {rest:?}"));
        }
    }
    Ok(out)
}

/// Runs both sides on `text`.
fn both(text: &[u8]) -> (Outcome, Outcome) {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("input.om");
    std::fs::write(&file, text).unwrap();
    (promtool(&file, dir.path()), vtax(&file, dir.path()))
}

/// Where two stores differ, for a failure message.
fn differences(prom: &Stored, vtax: &Stored) -> String {
    let mut out = String::new();
    for (key, values) in prom {
        if vtax.get(key) != Some(values) {
            let _ = writeln!(
                out,
                "  promtool {key:?} {values:x?}, vtax {:x?}",
                vtax.get(key)
            );
        }
    }
    for (key, values) in vtax {
        if !prom.contains_key(key) {
            let _ = writeln!(out, "  vtax only {key:?} {values:x?}");
        }
    }
    out
}

fn om(lines: &[String]) -> Vec<u8> {
    let mut text: String = lines.iter().map(|l| format!("{l}\n")).collect();
    text.push_str("# EOF\n");
    text.into_bytes()
}

/// One sample line per item, written by `line`, each its own series (a `case` label).
fn one_per_case(metric: &str, items: &[&str], line: impl Fn(&str, &str) -> String) -> Vec<u8> {
    let lines: Vec<String> = items
        .iter()
        .enumerate()
        .map(|(i, item)| line(&format!("{metric}{{case=\"{i}\"}}"), item))
        .collect();
    om(&lines)
}

/// Files that both parsers read, each a spread of edge cases; the two stores must be equal.
fn agreed_corpus() -> Vec<(&'static str, Vec<u8>)> {
    let values = [
        "1",
        "-1",
        "+1",
        "1e3",
        "1E3",
        "1e+3",
        "1e-3",
        "1.5e+10",
        "1e0003",
        "007",
        "00.5",
        "-007.50",
        ".5",
        "5.",
        "-.5",
        "+.5",
        "-5.",
        "1e308",
        "1.7976931348623157e308",
        "-1.7976931348623157e308",
        "1.7976931348623158e308",
        "1e-400",
        "-1e-400",
        "4.9e-324",
        "2.4703282292062328e-324",
        "2.225073858507201e-308",
        "2.2250738585072014e-308",
        "-0",
        "-0.0",
        "+0",
        "0e0",
        "-0e-5",
        "0.1000000000000000055511151231257827021181583404541015625",
        "9007199254740993",
        "123456789012345678901234567890",
        "0.30000000000000004",
    ];
    let long_fraction = format!("0.{}1e400", "0".repeat(400));
    let long_integer = format!("1{}e-400", "0".repeat(400));
    let mut values: Vec<&str> = values.to_vec();
    values.extend([long_fraction.as_str(), long_integer.as_str()]);
    let non_finite = [
        "+Inf",
        "-Inf",
        "Inf",
        "inf",
        "INF",
        "+inf",
        "-inf",
        "infinity",
        "+Infinity",
        "-infinity",
        "INFINITY",
        "NaN",
        "nan",
        "NAN",
        "nAn",
    ];
    // None of these is one that Go's float reading moves into another millisecond.
    let timestamps = [
        T,
        "1700000000.5",
        "1700000000.123",
        "1700000000.123456",
        "1.7e9",
        "1.700000000123e9",
        "1.700000000123e+09",
        "1E9",
        "17e8",
        "+1700000000",
        "1700000000.",
        "00001700000000",
        "1700000000e0",
        "17000000005e-1",
        "0",
        "-0",
        "0.001",
        "1.0e-6",
        "1700000000.001",
        "1700000000.009",
        "1699999999.999",
        "1699999999.9999",
        "1700000000.0005",
        "1700000000.9995",
        "1700000000.1239",
        "1700000000.5678",
        // Digits below a microsecond, as exporters write nanoseconds: truncated.
        "1700000000.1234567",
        "1700000000.123456789",
        "1700000001.000000001",
        "1234567890.12345678",
        "1700000000.7777777",
        "1700000000.0000001",
        "1700000000.000000000001",
        "1e-7",
        "5e-324",
    ];
    let labels = [
        r#"a="x""#,
        r#"a="x\\y""#,
        r#"a="x\"y""#,
        r#"a="x\ny""#,
        r#"a="x\ty""#,
        r#"a="x\\""#,
        r#"a="\\\\""#,
        r#"a="x\\n""#,
        r#"a="x\u0041""#,
        r#"a="x\by""#,
        r#"a="\\""#,
        r#"a="x\\\"y""#,
        r#"a="\n\n""#,
        r#"a="\x41""#,
        r#"a="\ü""#,
        "a=\"ü日本\u{1F600}\"",
        "a=\"x\ty\"",
        "a=\"\u{7f}\"",
        "a=\"\r\"",
        r#"a="}""#,
        r#"a=",""#,
        r#"a="x # y""#,
        r#"a="{""#,
        r#"b="1",a="2""#,
        r#"c="3",a="1",b="2""#,
        r#"_a="1""#,
        r#"__a="1""#,
        r#"A="1",a="2""#,
    ];
    let labels: Vec<String> = labels.iter().map(|l| l.to_string()).collect();
    let lines_labels: Vec<String> = labels
        .iter()
        .enumerate()
        .map(|(i, l)| format!("l{i}{{{l}}} 1 {T}"))
        .collect();
    vec![
        ("values", one_per_case("v", &values, |s, v| format!("{s} {v} {T}"))),
        (
            "non-finite values",
            one_per_case("n", &non_finite, |s, v| format!("{s} {v} {T}")),
        ),
        (
            "timestamps",
            one_per_case("t", &timestamps, |s, t| format!("{s} 1 {t}")),
        ),
        ("label escapes and order", om(&lines_labels)),
        (
            // node_exporter writes the labels it has no value for as empty: Prometheus keeps
            // the series without them, so `a=""` and no `a` are one series.
            "empty label values",
            om(&[
                "# TYPE node_network_info gauge".into(),
                format!(
                    "node_network_info{{address=\"00:00:00:00:00:00\",broadcast=\"00:00:00:00:00:00\",\
                     device=\"lo\",duplex=\"\",ifalias=\"\",operstate=\"unknown\"}} 1 {T}"
                ),
                format!("e{{a=\"\"}} 1 {T}"),
                format!("e 2 {T}.5"),
                format!("e{{a=\"\",b=\"1\"}} 3 {T}"),
                format!("e{{b=\"1\",a=\"\"}} 4 {T}.5"),
                format!("e{{z=\"\",b=\"1\"}} 5 {T}.75"),
            ]),
        ),
        (
            "metric names",
            om(&["a:b:c", ":m", "_m", "__m", "m_", "M", "m:", &"a".repeat(300)]
                .iter()
                .map(|n| format!("{n} 1 {T}"))
                .collect::<Vec<_>>()),
        ),
        (
            "metric families",
            om(&[
                "# HELP g_seconds A gauge, with \\\\ and \\n in its help".into(),
                "# TYPE g_seconds gauge".into(),
                "# UNIT g_seconds seconds".into(),
                format!("g_seconds 1 {T}"),
                "# TYPE c counter".into(),
                "# HELP c A counter".into(),
                format!("c_total 5 {T} # {{trace_id=\"abc\"}} 1 {T}"),
                format!("c_created 1699999000 {T}"),
                "# TYPE h histogram".into(),
                format!("h_bucket{{le=\"0.25\"}} 1 {T}"),
                format!("h_bucket{{le=\"1.0\"}} 2 {T} # {{trace_id=\"a\"}} 0.5 {T}.1"),
                format!("h_bucket{{le=\"+Inf\"}} 3 {T} # {{trace_id=\"b\"}} 5"),
                format!("h_count 3 {T}"),
                format!("h_sum 5.75 {T}"),
                format!("h_created 1699999000.5 {T}"),
                "# TYPE s summary".into(),
                format!("s{{quantile=\"0.5\"}} 1 {T}"),
                format!("s{{quantile=\"0.99\"}} NaN {T}"),
                format!("s_count 3 {T}"),
                format!("s_sum 4 {T}"),
                "# TYPE gh gaugehistogram".into(),
                format!("gh_bucket{{le=\"+Inf\"}} 3 {T}"),
                format!("gh_gcount 3 {T}"),
                format!("gh_gsum 2 {T}"),
                "# TYPE st stateset".into(),
                format!("st{{st=\"a\"}} 1 {T}"),
                format!("st{{st=\"b\"}} 0 {T}"),
                "# TYPE i info".into(),
                format!("i_info{{version=\"1.2\"}} 1 {T}"),
                "# TYPE u unknown".into(),
                format!("u 7 {T}"),
            ]),
        ),
        (
            "series and order",
            om(&[
                format!("a{{x=\"1\",y=\"2\"}} 1 {T}"),
                format!("b 1 {T}"),
                format!("a{{y=\"2\",x=\"1\"}} 2 {T}.5"),
                format!("b 2 {T}.5"),
                format!("a{{y=\"2\",x=\"1\"}} 3 {T}.75"),
            ]),
        ),
        (
            "many hours",
            om(&(0..30)
                .map(|h| format!("hourly 0.{h} {}", 1_700_000_000 + h * 3_600))
                .collect::<Vec<_>>()),
        ),
        (
            "many samples",
            om(&(0..3000)
                .map(|i| format!("many{{i=\"{i}\"}} {} {T}.{:03}", i as f64 * 0.1, i % 1000))
                .collect::<Vec<_>>()),
        ),
        (
            "long lines",
            om(&[
                format!("long{{a=\"{}\"}} 1 {T}", "y".repeat(1 << 20)),
                format!("{} 1 {T}", "m".repeat(100_000)),
                format!(
                    "wide{{{}}} 1 {T}",
                    (0..2000)
                        .map(|i| format!("l{i:04}=\"{i}\""))
                        .collect::<Vec<_>>()
                        .join(",")
                ),
            ]),
        ),
    ]
}

#[test]
fn files_both_read_store_the_same_samples() {
    let mut failures = String::new();
    for (name, text) in agreed_corpus() {
        match both(&text) {
            (Outcome::Stored(prom), Outcome::Stored(vtax)) => {
                assert!(!prom.is_empty(), "{name}: promtool stored nothing");
                if prom != vtax {
                    let _ = write!(failures, "{name}:\n{}", differences(&prom, &vtax));
                }
            }
            (prom, vtax) => {
                let _ = writeln!(failures, "{name}: promtool {prom:?}\n  vtax {vtax:?}");
            }
        }
    }
    assert!(failures.is_empty(), "the stores differ:\n{failures}");
}

/// Inputs that both refuse: neither stores anything from a file with one of these lines.
#[test]
fn files_both_refuse() {
    let one = |line: String| om(&[format!("ok 1 {T}"), line]);
    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("hex value", one(format!("m 0x10 {T}"))),
        ("hex float value", one(format!("m 0x1p3 {T}"))),
        ("digit separators", one(format!("m 1_000 {T}"))),
        ("signed NaN", one(format!("m -NaN {T}"))),
        ("value past f64", one(format!("m 1e309 {T}"))),
        ("a lone dot", one(format!("m . {T}"))),
        ("a lone sign", one(format!("m - {T}"))),
        ("NaN timestamp", one("m 1 NaN".into())),
        ("Inf timestamp", one("m 1 +Inf".into())),
        ("hex timestamp", one("m 1 0x10".into())),
        (
            "duplicate label names",
            one(format!("m{{a=\"1\",a=\"2\"}} 1 {T}")),
        ),
        (
            "__name__ in braces",
            one(format!("m{{__name__=\"x\"}} 1 {T}")),
        ),
        (
            "__name__ in braces, same name",
            one(format!("m{{a=\"1\",__name__=\"m\"}} 1 {T}")),
        ),
        ("unterminated value", one(format!("m{{a=\"x\\\"}} 1 {T}"))),
        (
            "label name with a dot",
            one(format!("m{{a.b=\"1\"}} 1 {T}")),
        ),
        ("metric name with a digit first", one(format!("1m 1 {T}"))),
        ("quoted metric name", one(format!("{{\"m\"}} 1 {T}"))),
        ("extra field", one(format!("m 1 {T} 5"))),
        ("missing value", one("m".into())),
        ("exemplar without braces", one(format!("c_total 1 {T} # 1"))),
        (
            "content after # EOF",
            [om(&[format!("m 1 {T}")]), format!("n 1 {T}\n").into_bytes()].concat(),
        ),
        ("missing # EOF", format!("m 1 {T}\n").into_bytes()),
        (
            "invalid UTF-8",
            [b"m{a=\"\xff\"} 1 ".as_slice(), T.as_bytes(), b"\n# EOF\n"].concat(),
        ),
    ];
    let mut failures = String::new();
    for (name, text) in cases {
        match both(&text) {
            // vtax's error names the file, so that an import of many says which.
            (Outcome::Refused(_), Outcome::Refused(why)) if why.contains("input.om:") => {}
            (prom, vtax) => {
                let _ = writeln!(failures, "{name}: promtool {prom:?}\n  vtax {vtax:?}");
            }
        }
    }
    assert!(failures.is_empty(), "not refused by both:\n{failures}");
}

/// The parser's documented leniencies (whitespace, `\r`, blank lines, a trailing comma, a byte
/// order mark, comment lines, exemplars on any sample), which promtool refuses: what vtax
/// stores from the lenient form is what promtool stores from the strict one.
#[test]
fn leniencies_store_what_the_strict_form_stores() {
    let strict = om(&[
        "# TYPE a gauge".into(),
        format!("a{{x=\"1\",y=\"2\"}} 1.5 {T}"),
        format!("b 2 {T}.25"),
        format!("c{{z=\"\\\\\"}} -3 {T}.5"),
    ]);
    let lenient: Vec<(&str, Vec<u8>)> = vec![
        (
            "CRLF line ends",
            String::from_utf8(strict.clone())
                .unwrap()
                .replace('\n', "\r\n")
                .into_bytes(),
        ),
        (
            "whitespace",
            format!(
                "  # TYPE a gauge\n\ta{{ x = \"1\" ,\ty=\"2\" , }}  1.5\t{T}  \n\nb 2 {T}.25\t\n   \n\
                 c {{z=\"\\\\\"}} -3 {T}.5\n# EOF \n\n"
            )
            .into_bytes(),
        ),
        (
            "byte order mark and comments",
            [
                "\u{feff}".as_bytes(),
                format!(
                    "# a comment\n#TYPE a gauge\na{{x=\"1\",y=\"2\"}} 1.5 {T} # {{t=\"1\"}} 1\n\
                     b 2 {T}.25\nc{{z=\"\\\\\"}} -3 {T}.5\n# EOF\n"
                )
                .as_bytes(),
            ]
            .concat(),
        ),
    ];
    let (prom, vtax_strict) = both(&strict);
    let Outcome::Stored(prom) = prom else {
        panic!("promtool refuses the strict form: {prom:?}");
    };
    let Outcome::Stored(vtax_strict) = vtax_strict else {
        panic!("vtax refuses the strict form: {vtax_strict:?}");
    };
    assert_eq!(prom, vtax_strict, "{}", differences(&prom, &vtax_strict));
    let mut failures = String::new();
    for (name, text) in lenient {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("input.om");
        std::fs::write(&file, &text).unwrap();
        match vtax(&file, dir.path()) {
            Outcome::Stored(stored) if stored == prom => {}
            Outcome::Stored(stored) => {
                let _ = write!(failures, "{name}:\n{}", differences(&prom, &stored));
            }
            refused => {
                let _ = writeln!(failures, "{name}: vtax {refused:?}");
            }
        }
    }
    assert!(
        failures.is_empty(),
        "leniencies change what is stored:\n{failures}"
    );
}

/// Prometheus reads an OpenMetrics timestamp as a float before it takes milliseconds, so a
/// timestamp with more digits than a float holds can land in the next millisecond; vtax reads
/// the digits. Each of these differs by that alone: promtool's millisecond is Go's
/// `int64(float * 1000)`, vtax's the exact one.
#[test]
fn timestamps_differ_only_by_prometheus_float_reading() {
    let cases = [
        ("1700000000.999999999", 1_700_000_000_999_999_i64),
        ("1700000000.0009999", 1_700_000_000_000_999),
        ("1700000000.123999999", 1_700_000_000_123_999),
    ];
    let text = one_per_case("f", &cases.map(|c| c.0), |s, t| format!("{s} 1 {t}"));
    let (Outcome::Stored(prom), Outcome::Stored(vtax)) = both(&text) else {
        panic!("both should read {:?}", String::from_utf8_lossy(&text));
    };
    for (i, (text, exact_us)) in cases.iter().enumerate() {
        let series = vec![
            ("__name__".to_string(), "f".to_string()),
            ("case".to_string(), i.to_string()),
        ];
        let float_ms = (text.parse::<f64>().unwrap() * 1000.0) as i64;
        let exact_ms = exact_us / 1000;
        assert_ne!(float_ms, exact_ms, "{text}: not a case of float rounding");
        let one = vec![1f64.to_bits()];
        assert_eq!(
            prom.get(&(series.clone(), float_ms)),
            Some(&one),
            "{text}: promtool {prom:?}"
        );
        assert_eq!(
            vtax.get(&(series, exact_ms)),
            Some(&one),
            "{text}: vtax {vtax:?}"
        );
    }
    assert_eq!(prom.len(), cases.len());
    assert_eq!(vtax.len(), cases.len());
}

/// A timestamp more than a day ahead (milliseconds written where OpenMetrics wants seconds,
/// the year 55 840) or before 1970 is no measurement's time: promtool's backfill stores it
/// (or, before 1970, stores nothing and says nothing), and vtax refuses the file, naming the
/// line, rather than filing rows under a day that no query or retention looks at.
#[test]
fn timestamps_no_measurement_has_are_refused_where_promtool_stores_them() {
    for (stamp, year) in [("1700000000000", "55840"), ("1e11", "5138")] {
        let text = om(&[format!("m 1 {T}"), format!("m 2 {stamp}")]);
        let (prom, vtax) = both(&text);
        let Outcome::Stored(prom) = prom else {
            panic!("promtool refuses {stamp}: {prom:?}");
        };
        assert_eq!(prom.len(), 2, "{stamp}: {prom:?}");
        let Outcome::Refused(why) = vtax else {
            panic!("vtax stores {stamp}: {vtax:?}");
        };
        assert!(
            why.contains("input.om:line 2: its timestamp is more than a day ahead of now")
                && why.contains(&format!("(the year {year})")),
            "{stamp}: {why}"
        );
    }
    let text = om(&[format!("m 1 {T}"), "m 2 -1".into()]);
    let Outcome::Refused(why) = both(&text).1 else {
        panic!("vtax stores a time before 1970");
    };
    assert!(
        why.contains("line 2: its timestamp is before 1970"),
        "{why}"
    );
}
