//! Tests of the module.

use super::*;

const INF: f64 = f64::INFINITY;

fn close(a: Option<f64>, b: f64) {
    let a = a.expect("a quantile");
    assert!((a - b).abs() < 1e-12, "{a} != {b}");
}

/// Values worked by hand the way PromQL's bucketQuantile interpolates.
#[test]
fn quantiles_interpolate_within_the_bucket() {
    // 100 observations: 50 at or under 0.1, 40 in (0.1, 0.2], 9 in (0.2, 0.4], 1 above.
    let b = [(0.1, 50.0), (0.2, 90.0), (0.4, 99.0), (INF, 100.0)];
    // rank 50 falls at the end of the first bucket, which starts at 0.
    close(bucket_quantile(0.5, &b), 0.1);
    // rank 25: half of the first bucket.
    close(bucket_quantile(0.25, &b), 0.05);
    // rank 70: 20 of 40 into (0.1, 0.2].
    close(bucket_quantile(0.7, &b), 0.15);
    // rank 99: the end of (0.2, 0.4].
    close(bucket_quantile(0.99, &b), 0.4);
    // rank 99.9 is in +Inf: the largest finite bound.
    close(bucket_quantile(0.999, &b), 0.4);
    // Order of the input does not matter.
    let shuffled = [(INF, 100.0), (0.2, 90.0), (0.1, 50.0), (0.4, 99.0)];
    close(bucket_quantile(0.7, &shuffled), 0.15);
}

#[test]
fn quantiles_match_promql_for_a_prometheus_shaped_histogram() {
    // prometheus_http_request_duration_seconds' bounds; 1000 requests.
    let b = [
        (0.1, 985.0),
        (0.2, 991.0),
        (0.4, 995.0),
        (1.0, 999.0),
        (3.0, 1000.0),
        (8.0, 1000.0),
        (INF, 1000.0),
    ];
    // rank 990: 5 of 6 into (0.1, 0.2].
    close(bucket_quantile(0.99, &b), 0.1 + 0.1 * 5.0 / 6.0);
    // rank 999: the end of (0.4, 1].
    close(bucket_quantile(0.999, &b), 1.0);
    // rank 500: 500/985 of the first bucket.
    close(bucket_quantile(0.5, &b), 0.1 * 500.0 / 985.0);
}

#[test]
fn empty_window_has_no_quantiles() {
    let b = [(0.1, 0.0), (1.0, 0.0), (INF, 0.0)];
    assert_eq!(bucket_quantile(0.99, &b), None);
    assert_eq!(bucket_quantile(0.5, &[]), None);
}

#[test]
fn inf_only_or_no_inf_has_no_quantiles() {
    assert_eq!(bucket_quantile(0.5, &[(INF, 10.0)]), None);
    assert_eq!(bucket_quantile(0.5, &[(0.1, 5.0), (1.0, 10.0)]), None);
    // Everything in +Inf: the largest finite bound, as PromQL says.
    close(bucket_quantile(0.5, &[(0.1, 0.0), (INF, 7.0)]), 0.1);
}

#[test]
fn garbage_counts_give_no_quantile_and_no_panic() {
    assert_eq!(bucket_quantile(0.5, &[(0.1, f64::NAN), (INF, 1.0)]), None);
    assert_eq!(bucket_quantile(0.5, &[(f64::NAN, 1.0), (INF, 1.0)]), None);
    assert_eq!(bucket_quantile(0.5, &[(0.1, 1.0), (INF, INF)]), None);
    assert_eq!(bucket_quantile(0.5, &[(0.1, -3.0), (INF, -1.0)]), None);
    // Non-monotonic counts are raised to the running maximum.
    close(
        bucket_quantile(0.5, &[(0.1, 10.0), (0.2, 4.0), (INF, 10.0)]),
        0.05,
    );
    // A first bucket with a negative bound answers that bound.
    close(
        bucket_quantile(0.1, &[(-1.0, 5.0), (0.0, 10.0), (INF, 10.0)]),
        -1.0,
    );
}

#[test]
fn deltas_between_scrapes_and_resets() {
    let before = [(0.1, 10.0), (1.0, 15.0), (INF, 16.0)];
    let after = [(0.1, 12.0), (1.0, 25.0), (INF, 26.0)];
    assert_eq!(
        scrape_delta(&before, &after),
        vec![(0.1, 2.0), (1.0, 10.0), (INF, 10.0)]
    );
    // rank 5 of 10: 3 of 8 into (0.1, 1].
    close(
        bucket_quantile(0.5, &scrape_delta(&before, &after)),
        0.1 + 0.9 * 3.0 / 8.0,
    );
    // The target restarted: counts went down, what it counted since is new.
    let restarted = [(0.1, 1.0), (1.0, 3.0), (INF, 3.0)];
    assert_eq!(scrape_delta(&after, &restarted), restarted.to_vec());
    // A bound new to this scrape adds nothing yet; the others go on.
    let rebucketed = [(0.1, 13.0), (0.5, 30.0), (INF, 40.0)];
    assert_eq!(
        scrape_delta(&after, &rebucketed),
        vec![(0.1, 1.0), (0.5, 0.0), (INF, 14.0)]
    );
    // No observations: no quantiles, zero count.
    let idle = scrape_delta(&after, &after);
    assert_eq!(idle.last().unwrap().1, 0.0);
    assert_eq!(bucket_quantile(0.99, &idle), None);
}

#[test]
fn le_is_split_from_canonical_labels() {
    assert_eq!(
        split_le(r#"code="200",handler="/a,\"b\"",le="0.1""#),
        Some((r#"code="200",handler="/a,\"b\"""#.to_string(), "0.1"))
    );
    assert_eq!(split_le(r#"le="+Inf""#), Some((String::new(), "+Inf")));
    assert_eq!(split_le(r#"a="1""#), None);
    assert_eq!(split_le(r#"a="1"#), None);
}

const BODY: &str = "\
# TYPE req_seconds histogram
req_seconds_bucket{path=\"/a\",le=\"0.1\"} 3
req_seconds_bucket{path=\"/a\",le=\"1\"} 4
req_seconds_bucket{le=\"+Inf\",path=\"/a\"} 5
req_seconds_sum{path=\"/a\"} 2.5
req_seconds_count{path=\"/a\"} 5
other_total 7
";

/// A reload that changes `[[scrape]]` rebuilds the collector; each
/// target's scrape and failure counts carry on from the old one's.
#[test]
fn a_rebuilt_collector_carries_on_each_targets_counts() {
    // Nothing listens on port 1: every scrape is a connect failure.
    let fast = |timeout_secs| ScrapeTarget {
        interval_secs: 0.02,
        timeout_secs,
        ..ScrapeTarget::new("down", "http://127.0.0.1:1/metrics")
    };
    let config = |timeout_secs| ScrapeConfig {
        targets: vec![fast(timeout_secs)],
        ..ScrapeConfig::default()
    };
    let counts = |scrape: &Scrape| scrape.shared.targets.lock().unwrap()["down"].counts;
    let wait_for = |scrape: &Scrape, scrapes: u64| {
        let deadline = Instant::now() + Duration::from_secs(20);
        while counts(scrape).scrapes < scrapes {
            assert!(Instant::now() < deadline, "{:?}", counts(scrape));
            std::thread::sleep(Duration::from_millis(10));
        }
        counts(scrape)
    };
    let mut old = Scrape::new(&config(1.0), &Roots::default());
    assert!(matches!(old.probe(), Availability::Available(_)));
    let before = wait_for(&old, 5);
    assert!(before.failures.iter().sum::<u64>() >= 5, "{before:?}");
    let mut new = Scrape::new(&config(2.0), &Roots::default());
    new.take_over(Box::new(old));
    assert!(matches!(new.probe(), Availability::Available(_)));
    // Its first scrape goes on from the old counts, not from zero.
    let after = wait_for(&new, 1);
    assert!(after.scrapes > before.scrapes, "{after:?} after {before:?}");
    for (a, b) in after.failures.iter().zip(before.failures) {
        assert!(*a >= b, "{after:?} after {before:?}");
    }
}

fn target(histograms: &[&str]) -> ScrapeTarget {
    ScrapeTarget {
        histograms: histograms.iter().map(|h| h.to_string()).collect(),
        ..ScrapeTarget::new("t", "http://127.0.0.1:1/metrics")
    }
}

fn parse(body: &str, format: Format, target: &ScrapeTarget) -> Result<Scraped, Failure> {
    parse_stream(body.as_bytes(), format, target, 7, &Timestamps::new())
}

/// (metric, labels, value) of row `i`.
fn row(rows: &Batch, i: usize) -> (String, String, f64) {
    let tag = |t: usize| rows.tags[t].dict[rows.tags[t].codes[i] as usize].clone();
    let vtax_store::batch::Values::F64(values) = &rows.fields[0].values else {
        panic!("value is f64");
    };
    (tag(1), tag(2), values[i])
}

#[test]
fn bodies_are_parsed_and_histograms_picked_out() {
    let scraped = parse(BODY, Format::PrometheusText, &target(&["req_seconds"])).unwrap();
    assert_eq!(scraped.rows.len(), 6);
    assert_eq!(scraped.rows.time_us, vec![7; 6]);
    assert_eq!(
        row(&scraped.rows, 2),
        (
            "req_seconds_bucket".to_string(),
            r#"le="+Inf",path="/a""#.to_string(),
            5.0
        )
    );
    let series = &scraped.histograms[&("req_seconds".to_string(), r#"path="/a""#.to_string())];
    assert_eq!(series, &vec![(0.1, 3.0), (1.0, 4.0), (INF, 5.0)]);
    let invalid = |body: &str, format, t: &ScrapeTarget| {
        let f = parse(body, format, t).err().expect("a failure");
        assert_eq!(f.reason, Reason::Invalid, "{}", f.message);
        f.message
    };
    invalid("<html>oops</html>\n", Format::PrometheusText, &target(&[]));
    // A bucket whose le does not read is left out of the quantiles only:
    // it failed the whole scrape, every sample of the target lost.
    let odd_le = parse(
        "x_bucket{le=\"fast\"} 1\nx_bucket{le=\"+Inf\"} 2\ny 3\n",
        Format::PrometheusText,
        &target(&["x"]),
    )
    .unwrap();
    assert_eq!(odd_le.rows.len(), 3);
    assert_eq!(
        odd_le.histograms[&("x".to_string(), String::new())],
        vec![(INF, 2.0)]
    );
    invalid("x 1\n", Format::OpenMetrics, &target(&[]));
    let not_utf8 = parse_stream(
        &b"x 1\ny{a=\"\xc3\xa9\xff\"} 2\n"[..],
        Format::PrometheusText,
        &target(&[]),
        7,
        &Timestamps::new(),
    );
    let message = not_utf8.err().expect("a failure").message;
    assert!(message.contains("line 2: not UTF-8 (at byte 11"), "{message}");
    // A plain comment's bytes are passed over, as Prometheus passes them.
    let comment = parse_stream(
        &b"# built on \xff\xfe\nx 1\n"[..],
        Format::PrometheusText,
        &target(&[]),
        7,
        &Timestamps::new(),
    );
    assert_eq!(comment.unwrap().rows.len(), 1);
    let help = parse_stream(
        &b"# HELP x \xff\nx 1\n"[..],
        Format::PrometheusText,
        &target(&[]),
        7,
        &Timestamps::new(),
    );
    assert!(help.is_err(), "HELP text must be UTF-8");
    // Served as text/plain, `# EOF` is a comment, timestamps or not, as
    // Prometheus reads it.
    let eof = parse(
        "a 1 0\n# EOF\nb 2 0\n",
        Format::PrometheusText,
        &target(&[]),
    );
    assert_eq!(eof.unwrap().rows.len(), 2);
    // Without a final newline the last line counts all the same.
    assert_eq!(
        parse("a 1\nb 2", Format::PrometheusText, &target(&[]))
            .unwrap()
            .rows
            .len(),
        2
    );
}

/// A 1M-series target drove the agent past the unit's MemoryMax=256M: a
/// scrape past a limit is now refused whole, at the first line past it.
#[test]
fn a_scrape_past_a_limit_is_refused_whole() {
    let lines =
        |n: usize| -> String { (0..n).map(|i| format!("m{{i=\"{i}\"}} {i}\n")).collect() };
    let t = ScrapeTarget {
        sample_limit: 100,
        label_limit: 3,
        label_value_length_limit_bytes: 16,
        ..target(&[])
    };
    // At every limit: accepted. A label with an empty value is no label.
    let at_limit = format!(
        "{}big{{a=\"{}\",b=\"2\",c=\"3\",d=\"\"}} 1\n# EOF\n",
        lines(99),
        "x".repeat(16)
    );
    assert_eq!(
        parse(&at_limit, Format::OpenMetrics, &t)
            .unwrap()
            .rows
            .len(),
        100
    );
    let limit = |body: &str| {
        let f = parse(body, Format::PrometheusText, &t)
            .err()
            .expect("a failure");
        assert_eq!(f.reason, Reason::Limit, "{}", f.message);
        f.message
    };
    let message = limit(&lines(1_000_000));
    assert!(
        message.contains("more than sample_limit 100 samples (line 101)"),
        "{message}"
    );
    let message = limit(&format!(
        "{}m{{a=\"1\",b=\"2\",c=\"3\",d=\"4\"}} 1\n",
        lines(5)
    ));
    assert!(
        message.contains("line 6: 4 labels, more than label_limit 3"),
        "{message}"
    );
    let message = limit(&format!("m{{a=\"{}\"}} 1\n", "x".repeat(8 << 20)));
    assert!(
        message.contains("label \"a\" has a value of 8388608 bytes"),
        "{message}"
    );
    // A bad line before the limit is still `invalid`.
    let f = parse(&format!("{}oops\n", lines(5)), Format::PrometheusText, &t)
        .err()
        .unwrap();
    assert_eq!(f.reason, Reason::Invalid);
}

#[test]
fn windows_close_on_wall_clock_multiples() {
    let snap = |n: f64| -> Snapshot {
        [(("h".to_string(), String::new()), vec![(0.1, n), (INF, n)])]
            .into_iter()
            .collect()
    };
    let mut w = Windows::new(10);
    let s = 1_000_000;
    assert!(w.advance(100 * s, 100 * s + 3, snap(1.0)).is_empty());
    // A second scrape in the same window does not close it.
    assert!(w.advance(105 * s, 105 * s, snap(2.0)).is_empty());
    let closed = w.advance(110 * s, 110 * s + 3, snap(5.0));
    assert_eq!(closed.len(), 1);
    assert_eq!(closed[0].2, vec![(0.1, 4.0), (INF, 4.0)]);
    assert!((closed[0].3 - 10.0).abs() < 1e-9);
    // A series new in this window counts from its second sample, over the
    // span since its first.
    let with = |n: f64, x: f64| {
        let mut two = snap(n);
        two.insert(("h".into(), "x=\"1\"".into()), vec![(INF, x)]);
        two
    };
    assert!(w.advance(113 * s, 113 * s, with(6.0, 1.0)).is_empty());
    assert!(w.advance(116 * s, 116 * s, with(7.0, 4.0)).is_empty());
    let closed = w.advance(120 * s, 120 * s, with(9.0, 5.0));
    assert_eq!(closed.len(), 2);
    let new = closed.iter().find(|c| !c.1.is_empty()).unwrap();
    assert_eq!(new.2, vec![(INF, 4.0)]);
    assert!((new.3 - 7.0).abs() < 1e-9, "{}", new.3);
}

/// What a window holds is every scrape's growth over the one before, as
/// PromQL's increase adds it: a restart inside the window keeps what came
/// before it and after it; a restart whose counts came back above the
/// window's opening ones is seen (the ends alone read it as a small growth);
/// new bounds without a restart are not the target's whole lifetime; a
/// series missing from a scrape goes on from where it was seen.
#[test]
fn a_window_adds_up_each_scrapes_growth() {
    let s = 1_000_000;
    let key = ("lat_seconds".to_string(), String::new());
    let snap = |buckets: &[(f64, f64)]| -> Snapshot {
        [(key.clone(), buckets.to_vec())].into_iter().collect()
    };
    let mut w = Windows::new(10);
    w.advance(100 * s, 100 * s, snap(&[(0.1, 100.0), (1.0, 150.0), (INF, 160.0)]));
    w.advance(103 * s, 103 * s, snap(&[(0.1, 110.0), (1.0, 170.0), (INF, 180.0)]));
    // Restarted at +104: at +107 its counts are above those at +103, so
    // the window's ends alone read it as growth; the scrape at +105 shows
    // the restart.
    w.advance(105 * s, 105 * s, snap(&[(0.1, 1.0), (1.0, 30.0), (INF, 40.0)]));
    w.advance(107 * s, 107 * s, snap(&[(0.1, 200.0), (1.0, 210.0), (INF, 215.0)]));
    let closed = w.advance(110 * s, 110 * s, snap(&[(0.1, 220.0), (1.0, 235.0), (INF, 240.0)]));
    // 10/20/20, then 1/30/40 counted since the restart, 199/180/175, then
    // 20/25/25. The ends alone gave 110/65/60.
    assert_eq!(
        closed[0].2,
        vec![(0.1, 230.0), (1.0, 255.0), (INF, 260.0)],
        "{closed:?}"
    );
    // A new bucket at +113 without a restart; the series absent at +116.
    w.advance(113 * s, 113 * s, snap(&[(0.1, 230.0), (0.5, 240.0), (1.0, 245.0), (INF, 250.0)]));
    w.advance(116 * s, 116 * s, Snapshot::new());
    let closed = w.advance(
        120 * s,
        120 * s,
        snap(&[(0.1, 240.0), (0.5, 252.0), (1.0, 260.0), (INF, 266.0)]),
    );
    assert_eq!(
        closed[0].2,
        vec![(0.1, 20.0), (0.5, 12.0), (1.0, 25.0), (INF, 26.0)],
        "{closed:?}"
    );
    assert!((closed[0].3 - 10.0).abs() < 1e-9);
    // A series gone before the window closes covers the time it was there:
    // its rate is not spread over the window's rest.
    w.advance(123 * s, 123 * s, snap(&[(INF, 276.0)]));
    w.advance(125 * s, 125 * s, Snapshot::new());
    let closed = w.advance(130 * s, 130 * s, Snapshot::new());
    assert_eq!(closed[0].2, vec![(INF, 10.0)]);
    assert!((closed[0].3 - 3.0).abs() < 1e-9, "{}", closed[0].3);
}

#[test]
fn targets_are_validated() {
    let t = ScrapeTarget {
        histograms: vec!["x_seconds".into()],
        ..ScrapeTarget::new("a", "http://127.0.0.1:1/metrics")
    };
    assert!(validate_targets(std::slice::from_ref(&t)).is_ok());
    let with = |f: &dyn Fn(&mut ScrapeTarget)| {
        let mut t = t.clone();
        f(&mut t);
        validate_targets(&[t]).unwrap_err()
    };
    assert_eq!(with(&|t| t.url = "https://x/".into()).0, "scrape[0].url");
    assert_eq!(with(&|t| t.timeout_secs = 10.0).0, "scrape[0].timeout_secs");
    assert_eq!(with(&|t| t.window_secs = 5).0, "scrape[0].window_secs");
    assert_eq!(
        with(&|t| t.histograms = vec!["x_bucket".into()]).0,
        "scrape[0].histograms"
    );
    assert_eq!(with(&|t| t.name = "a b".into()).0, "scrape[0].name");
    let err = validate_targets(&[t.clone(), t]).unwrap_err();
    assert_eq!(err.0, "scrape[1].name");
}

/// A series met twice in one exposition keeps its first sample, as
/// Prometheus keeps it, whatever order its labels came in.
#[test]
fn a_series_repeated_in_a_scrape_keeps_its_first_sample() {
    let body = "m 1\nm 2\nesc{b=\"2\",a=\"1\"} 9\nesc{a=\"1\",b=\"2\",} 10\n";
    let scraped = parse(body, Format::PrometheusText, &target(&[])).unwrap();
    assert_eq!(scraped.rows.len(), 2);
    assert_eq!(row(&scraped.rows, 0).2, 1.0);
    assert_eq!(row(&scraped.rows, 1).2, 9.0);
    assert_eq!(scraped.samples_dropped, 2);
}

/// A sample's own timestamp is its time, as Prometheus honours it, and a
/// series that repeats the sample of an earlier scrape is stored once.
#[test]
fn a_samples_own_timestamp_is_its_time_and_is_stored_once() {
    let now_ms: i64 = 1_800_000_000_000;
    let hour_ago_ms = now_ms - 3_599_000;
    let body = format!("fresh 1\nold 2 {hour_ago_ms}\n");
    let t = target(&[]);
    // The target's timestamps, as its thread keeps them from scrape to scrape.
    let mut known = Timestamps::new();
    let scrape = |body: &str, t: &ScrapeTarget, time_us: i64, known: &mut Timestamps| {
        let scraped = parse_stream(body.as_bytes(), Format::PrometheusText, t, time_us, known).unwrap();
        remember(known, scraped.timestamped.clone(), time_us, 1, 50_000);
        scraped
    };
    let first = scrape(&body, &t, now_ms * 1000, &mut known);
    assert_eq!(first.rows.time_us, [now_ms * 1000, hour_ago_ms * 1000]);
    let later_us = (now_ms + 1000) * 1000;
    let second = scrape(&body, &t, later_us, &mut known);
    assert_eq!(second.rows.time_us, [later_us], "the old sample once only");
    assert_eq!(second.samples_dropped, 1);
    // Its timestamp moves on: stored again.
    let body = format!("fresh 1\nold 3 {}\n", hour_ago_ms + 1);
    let third = scrape(&body, &t, later_us, &mut known);
    assert_eq!(third.rows.len(), 2);
    // A series that skips a scrape and comes back with the same sample is
    // still stored once.
    let gone = scrape("fresh 1\n", &t, later_us, &mut known);
    assert_eq!(gone.rows.len(), 1);
    let back = scrape(&body, &t, later_us, &mut known);
    assert_eq!(back.rows.len(), 1, "the old sample came back: not stored again");
    assert_eq!(back.samples_dropped, 1);
    // A histogram's buckets that repeat their timestamp are not stored
    // again, but still say where the series stands for its quantiles.
    let h = target(&["h"]);
    let body = format!("h_bucket{{le=\"+Inf\"}} 4 {hour_ago_ms}\n");
    let once = scrape(&body, &h, now_ms * 1000, &mut known);
    let again = scrape(&body, &h, later_us, &mut known);
    assert_eq!((once.rows.len(), again.rows.len()), (1, 0));
    assert_eq!(again.histograms[&("h".to_string(), String::new())], vec![(INF, 4.0)]);
    // Far from the scrape (0, or a clock years ahead): left out, counted.
    let body = format!("zero 1 0\nahead 2 {}\nnow 3\n", now_ms + 86_400_000);
    let far = parse_stream(body.as_bytes(), Format::PrometheusText, &t, now_ms * 1000, &Timestamps::new()).unwrap();
    assert_eq!(far.rows.len(), 1);
    assert_eq!(far.samples_dropped, 2);
}

/// A target's timestamps are kept in place, pruned of those too old to
/// take a sample at, and held to its sample_limit, the oldest going first.
#[test]
fn a_targets_timestamps_are_bounded() {
    let key = |i: i64| (format!("m{i}"), String::new());
    let hour_us = 3_600_000_000;
    let now = 10 * hour_us;
    let mut known = Timestamps::new();
    remember(&mut known, (0..10).map(|i| (key(i), now - 2 * hour_us + i)).collect(), now, 1, 100);
    assert_eq!(known.len(), 10, "pruned only every few scrapes");
    remember(&mut known, vec![(key(10), now)], now, 64, 100);
    assert_eq!(known.len(), 1, "older than an hour: gone at the pruning");
    remember(&mut known, (11..20).map(|i| (key(i), now + i)).collect(), now, 65, 5);
    assert_eq!(known.len(), 5);
    assert!(known.contains_key(&key(19)) && !known.contains_key(&key(10)));
}

/// A target that answers and then breaks off its body (fewer bytes than
/// its Content-Length) fails as `invalid`, saying so: it was reached, so
/// `connect` would send an operator to look at the network.
#[test]
fn a_body_cut_short_is_invalid_not_a_connect_failure() {
    use std::io::{Read, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let server = std::thread::spawn(move || {
        let (mut stream, _) = listener.accept().unwrap();
        let mut request = [0u8; 4096];
        let _ = stream.read(&mut request);
        stream
            .write_all(
                b"HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4\r\n\
                  Content-Length: 1000\r\n\r\nup 1\nother_metric{a=\"",
            )
            .unwrap();
    });
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .timeout_global(Some(Duration::from_secs(10)))
        .http_status_as_error(false)
        .build()
        .into();
    let mut target = target(&[]);
    target.url = format!("http://127.0.0.1:{port}/metrics");
    let failure = match super::fetch::scrape(&agent, &target, 1_000_000, &Timestamps::new()) {
        Err(failure) => failure,
        Ok(_) => panic!("a body cut short was taken whole"),
    };
    server.join().unwrap();
    assert_eq!(failure.reason, Reason::Invalid, "{}", failure.message);
    assert!(
        failure.message.starts_with("body cut short after 5 bytes"),
        "{}",
        failure.message
    );
}

/// A target answering `body` to every request, until the test ends.
fn serve_forever(body: String) -> u16 {
    use std::io::{Read, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            let body = body.clone();
            std::thread::spawn(move || {
                let mut request = [0u8; 4096];
                while matches!(stream.read(&mut request), Ok(n) if n > 0) {
                    let head = format!(
                        "HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4\r\n\
                         Content-Length: {}\r\n\r\n",
                        body.len()
                    );
                    if stream.write_all(head.as_bytes()).is_err()
                        || stream.write_all(body.as_bytes()).is_err()
                    {
                        return;
                    }
                }
            });
        }
    });
    port
}

/// A target scraped ten times between two harvests, each scrape at its
/// sample limit, loses no scrape (the bound was four scrapes at the limit:
/// a target every 0.2 s harvested every second lost one in five, unsaid);
/// one whose harvests stop loses its oldest, and counts every one.
#[test]
fn scrapes_wait_for_the_harvest_and_those_dropped_are_counted() {
    let body: String = (0..1000).map(|i| format!("m{{i=\"{i}\"}} 1\n")).collect();
    let port = serve_forever(body);
    let target = ScrapeTarget {
        interval_secs: 0.05,
        sample_limit: 1000,
        ..ScrapeTarget::new("fast", &format!("http://127.0.0.1:{port}/metrics"))
    };
    let config = ScrapeConfig {
        interval_secs: 0.5,
        targets: vec![target],
        ..ScrapeConfig::default()
    };
    let mut scrape = Scrape::new(&config, &Roots::default());
    assert!(matches!(scrape.probe(), Availability::Available(_)));
    let status_rows = |batches: &[Batch]| {
        batches
            .iter()
            .filter(|b| std::ptr::eq(b.table, &SCRAPE_TARGET))
            .map(|b| b.len() as u64)
            .sum::<u64>()
    };
    let counts = |scrape: &Scrape| scrape.shared.targets.lock().unwrap()["fast"].counts;
    let mut harvested = 0;
    for _ in 0..6 {
        std::thread::sleep(Duration::from_millis(500));
        harvested += status_rows(&scrape.collect(0).unwrap());
    }
    let now = counts(&scrape);
    assert!(now.scrapes >= 20, "{now:?}");
    assert_eq!(now.dropped, 0, "harvested in time: {now:?}");
    // The harvests stop for 2 s: 40 scrapes at the limit, past the bound.
    std::thread::sleep(Duration::from_secs(2));
    harvested += status_rows(&scrape.collect(0).unwrap());
    // The counts and what waits, read at one instant.
    let (now, pending_statuses) = {
        let targets = scrape.shared.targets.lock().unwrap();
        let fast = &targets["fast"];
        let waiting = fast
            .pending
            .iter()
            .filter(|b| std::ptr::eq(b.table, &SCRAPE_TARGET))
            .count() as u64;
        (fast.counts, waiting)
    };
    scrape.shared.stopper.stop();
    assert!(now.dropped > 0, "{now:?}");
    assert_eq!(
        harvested + now.dropped + pending_statuses,
        now.scrapes,
        "every scrape stored or counted as dropped: {now:?}"
    );
    assert!(scrape
        .problems()
        .iter()
        .any(|p| p.contains("scrapes dropped, not harvested in time")));
}

/// A sample carrying its own timestamp, stored before the agent stopped or
/// before a reload, is not stored again by the first scrape after either:
/// the agent's start hands the collector each series' newest stored time
/// ([`Collector::resume`]), a reload the threads' own. The series without
/// one are stored at every scrape.
#[test]
fn a_timestamped_sample_is_stored_once_across_a_restart_and_a_reload() {
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64;
    let stamped_us = (now_ms - 10_000) * 1000;
    let port = serve_forever(format!("fresh 1\nstamped{{a=\"1\"}} 2 {}\n", now_ms - 10_000));
    let config = ScrapeConfig {
        interval_secs: 0.1,
        targets: vec![ScrapeTarget {
            interval_secs: 0.1,
            ..ScrapeTarget::new("t", &format!("http://127.0.0.1:{port}/metrics"))
        }],
        ..ScrapeConfig::default()
    };
    // Every scraped row harvested within a second: (metric, time).
    let harvest = |scrape: &mut Scrape| {
        std::thread::sleep(Duration::from_millis(1000));
        let mut rows = Vec::new();
        for batch in scrape.collect(0).unwrap() {
            if !std::ptr::eq(batch.table, &tables::SCRAPED) {
                continue;
            }
            for i in 0..batch.len() {
                rows.push((row(&batch, i).0, batch.time_us[i]));
            }
        }
        rows
    };
    let stamped = |rows: &[(String, i64)]| rows.iter().filter(|(m, _)| m == "stamped").count();
    let mut first = Scrape::new(&config, &Roots::default());
    assert_eq!(first.resumes_from().map(|t| t.name), Some("scraped"));
    assert!(matches!(first.probe(), Availability::Available(_)));
    let rows = harvest(&mut first);
    assert_eq!(stamped(&rows), 1, "{rows:?}");
    assert!(rows.iter().filter(|(m, _)| m == "fresh").count() > 2);
    assert!(rows.contains(&("stamped".to_string(), stamped_us)));

    // A reload: the new collector takes over the stopped one.
    first.shared.stopper.stop();
    std::thread::sleep(Duration::from_millis(300));
    let mut reloaded = Scrape::new(&config, &Roots::default());
    reloaded.take_over(Box::new(first));
    assert!(matches!(reloaded.probe(), Availability::Available(_)));
    let rows = harvest(&mut reloaded);
    assert_eq!(stamped(&rows), 0, "{rows:?}");
    assert!(rows.iter().any(|(m, _)| m == "fresh"));
    reloaded.shared.stopper.stop();

    // A restart: the store's newest row of each series, as the agent reads it.
    let stored = |time_us: i64, metric: &str, labels: &str| crate::LatestRow {
        time_us,
        tags: vec!["t".into(), metric.into(), labels.into()],
        fields: vec![Some(2.0)],
    };
    let mut restarted = Scrape::new(&config, &Roots::default());
    restarted.resume(&[
        stored(stamped_us, "stamped", "a=\"1\""),
        stored(stamped_us, "other_target_series", ""),
    ]);
    assert!(matches!(restarted.probe(), Availability::Available(_)));
    let rows = harvest(&mut restarted);
    assert_eq!(stamped(&rows), 0, "{rows:?}");
    assert!(rows.iter().any(|(m, _)| m == "fresh"));
    restarted.shared.stopper.stop();

    // Without the store's rows the first scrape stores it again, once.
    let mut bare = Scrape::new(&config, &Roots::default());
    assert!(matches!(bare.probe(), Availability::Available(_)));
    assert_eq!(stamped(&harvest(&mut bare)), 1);
    bare.shared.stopper.stop();
}
