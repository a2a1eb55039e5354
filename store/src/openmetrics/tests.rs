//! Tests of the module.

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
    // At the limits: three labels, a value of four bytes (`\"` is one). A label with an empty
    // value is no label, and is not counted.
    for line in [
        "m{a=\"1\",b=\"x\\\"yz\",c=\"3\"} 1",
        "m{c=\"3\",b=\"x\\\"yz\",a=\"1\"} 1",
        "m{a=\"1\",b=\"x\\\"yz\",c=\"3\",d=\"\",e=\"\"} 1",
        "m{e=\"\",c=\"3\",d=\"\",b=\"x\\\"yz\",a=\"1\"} 1",
    ] {
        let sample = parse(line).unwrap().unwrap();
        assert_eq!(sample.labels, "a=\"1\",b=\"x\\\"yz\",c=\"3\"");
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
    // The metric name is `__name__`'s value: bounded the same way.
    assert!(parse("abcd 1").unwrap().is_some());
    let e = parse("abcde{a=\"1\"} 1").unwrap_err();
    assert_eq!(
        e.limit,
        Some(LimitExceeded::LabelValueLengthLimit(4)),
        "{e}"
    );
    assert!(e.reason.contains("the metric name is 5 bytes"), "{e}");
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
    let canon = "a=\"1\",b=\"x\\\\y\\\"z\\nw\",c=\"3\"";
    let line = format!("m{{{canon}}} 1");
    let s = prom(&line);
    assert_eq!(s.labels, canon);
    assert!(matches!(s.labels, Cow::Borrowed(_)));

    let variants = [
        "m{c=\"3\",b=\"x\\\\y\\\"z\\nw\",a=\"1\"} 1",
        "m{b=\"x\\\\y\\\"z\\nw\",a=\"1\",c=\"3\"} 1",
        "m{a=\"1\",b=\"x\\\\y\\\"z\\nw\",c=\"3\",} 1",
        "m { a = \"1\" , b=\"x\\\\y\\\"z\\nw\",\tc=\"3\" } 1",
        "m{ c=\"3\", a=\"1\", b=\"x\\\\y\\\"z\\nw\", } 1",
        "m{a=\"1\",b=\"x\\\\y\\\"z\\nw\",c=\"3\",d=\"\"} 1",
        "m{_=\"\",a=\"1\",b=\"x\\\\y\\\"z\\nw\",c=\"3\"} 1",
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

/// A label with an empty value is the label's absence, as in Prometheus: `m{a=""}` and `m` are
/// one series, so both give the same label set, and an empty value never makes a duplicate.
#[test]
fn empty_label_values_are_no_labels() {
    let cases: &[(&str, &str)] = &[
        ("m{a=\"\"} 1", ""),
        ("m{a=\"\",} 1", ""),
        ("m{ a = \"\" } 1", ""),
        ("m{a=\"\",b=\"1\"} 1", "b=\"1\""),
        ("m{b=\"1\",a=\"\"} 1", "b=\"1\""),
        ("m{a=\"1\",b=\"\",c=\"3\"} 1", "a=\"1\",c=\"3\""),
        ("m{a=\"1\",a=\"\"} 1", "a=\"1\""),
        ("m{a=\"\",a=\"1\"} 1", "a=\"1\""),
        ("m{a=\"\",a=\"\"} 1", ""),
        ("m{__name__=\"\"} 1", ""),
    ];
    for &(line, want) in cases {
        for format in [Format::PrometheusText, Format::OpenMetrics] {
            let s = one(format, line);
            assert_eq!(s.labels, want, "{line}");
            assert_eq!(s.metric, "m");
        }
    }
    // A value that is only an escape is not empty.
    assert_eq!(prom("m{a=\"\\\\\"} 1").labels, "a=\"\\\\\"");
    // Exemplar labels are validated the same way, and ignored.
    assert_eq!(om("m 1 # {a=\"\",a=\"x\"} 1").labels, "");
}

/// The metric name is the series' `__name__`: one more in braces would give it two names,
/// which Prometheus refuses and remote write cannot send.
#[test]
fn a_name_label_on_a_sample_is_refused() {
    for line in [
        "m{__name__=\"x\"} 1",
        "m{__name__=\"m\"} 1",
        "m{a=\"1\",__name__=\"x\"} 1",
        "m{ __name__ = \"x\" } 1",
    ] {
        for format in [Format::PrometheusText, Format::OpenMetrics] {
            let e = err(format, line);
            assert!(e.reason.contains("`__name__`"), "{line}: {e}");
            assert_eq!(e.limit, None);
        }
    }
    // Other reserved names are kept, as Prometheus keeps them; exemplars may have any.
    assert_eq!(prom("m{__a=\"1\"} 1").labels, "__a=\"1\"");
    assert_eq!(om("m_total 1 # {__name__=\"x\"} 1").labels, "");
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
        "-NaN", "+NaN", "0x10", "0x1p3", "1p3", "1_000", "1e", "1e+", "e1", ".", "+", "-", "-.",
        ".e1", "abc", "1.2.3", "Infx", "in", "infinit", "nanx", "--1", "+-1", "1,5", "1e309",
        "-1e309", "١", "true",
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
        // Digits below a microsecond are truncated toward zero, as Prometheus truncates them to
        // milliseconds.
        ("1.0000001", 1_000_000),
        ("1700000000.1234567", 1_700_000_000_123_456),
        ("1700000000.123456789", 1_700_000_000_123_456),
        ("1700000000.999999999", 1_700_000_000_999_999),
        ("1.7000000001234569e9", 1_700_000_000_123_456),
        ("1234567890.12345678", 1_234_567_890_123_456),
        ("-1700000000.1234567", -1_700_000_000_123_456),
        ("-1700000000.999999999", -1_700_000_000_999_999),
        ("1e-7", 0),
        ("0.0000001", 0),
        ("-0.0000009", 0),
        ("5e-324", 0),
        ("1e-99999999999", 0),
        ("0.0000009e1", 9),
        ("123456789e-9", 123_456),
        ("-9223372036854.7758089", i64::MIN),
        ("9223372036854.7758079", i64::MAX),
    ];
    for &(s, want) in cases {
        assert_eq!(om(&format!("m 1 {s}")).timestamp_us, Some(want), "{s}");
        assert_eq!(parse_om_timestamp_us(s), Ok(want), "{s}");
    }
    // However many digits follow, they do not overflow.
    let long = format!("1700000000.{}", "9".repeat(400));
    assert_eq!(parse_om_timestamp_us(&long), Ok(1_700_000_000_999_999));
    let long = format!("{}1700000000.5{}e-400", "0".repeat(300), "0".repeat(400));
    assert_eq!(parse_om_timestamp_us(&long), Ok(0));
    let long = format!("1{}e-400", "0".repeat(400));
    assert_eq!(parse_om_timestamp_us(&long), Ok(1_000_000));
    for bad in [
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
    let e = err(Format::OpenMetrics, "m 1 9223372036854.775808");
    assert!(e.reason.contains("out of range"), "{e}");
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
    // node_exporter writes the labels it has no value for as `duplex=""`: Prometheus stores the
    // series without them, and so does the parser.
    assert_eq!(
        out[8].labels,
        "address=\"00:00:00:00:00:00\",broadcast=\"00:00:00:00:00:00\",device=\"lo\",operstate=\"unknown\""
    );
    assert_eq!(out[11].value, 1.70000032117e+09);
    assert_eq!(out[14].labels, "handler=\"/metrics\",le=\"+Inf\"");
    assert_eq!(out[16].labels, "handler=\"/metrics\"");
    // The other node_exporter lines are already canonical: nothing allocated.
    assert!(out[..17]
        .iter()
        .enumerate()
        .all(|(i, s)| i == 8 || matches!(s.labels, Cow::Borrowed(_))));
    assert!(matches!(out[8].labels, Cow::Owned(_)));
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
                1 if !bytes.is_empty() => bytes[at] = SPECIAL[rng.random_range(0..SPECIAL.len())],
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
