//! One scrape: the request, the limits on what comes back, and the parse of
//! the body as it arrives; a failure says why.

use super::*;

/// Why a scrape failed: the reasons counted in `scrape_target`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reason {
    /// Not reachable.
    Connect,
    /// Past its timeout.
    Timeout,
    /// Not a 2xx status.
    Http,
    /// Not a valid exposition.
    Invalid,
    /// Past one of the target's limits.
    Limit,
}

impl Reason {
    /// The reason as logs and field names say it.
    pub fn as_str(self) -> &'static str {
        match self {
            Reason::Connect => "connect",
            Reason::Timeout => "timeout",
            Reason::Http => "http",
            Reason::Invalid => "invalid",
            Reason::Limit => "limit",
        }
    }

    pub(super) fn index(self) -> usize {
        self as usize
    }
}

/// A failed scrape: the reason and what happened.
#[derive(Clone, Debug)]
pub struct Failure {
    /// The counted reason.
    pub reason: Reason,
    /// The error, for the log.
    pub message: String,
}

pub(super) fn fail(reason: Reason, message: impl Into<String>) -> Failure {
    Failure {
        reason,
        message: message.into(),
    }
}

/// One parsed scrape: its rows and the histogram series asked for.
pub struct Scraped {
    /// One `scraped` row per sample.
    pub rows: Batch,
    /// The series of the `histograms` families.
    pub histograms: Snapshot,
    /// The series that carried their own timestamp in this scrape, with the
    /// newest it has stored: taken into the target's [`Timestamps`] by
    /// [`remember`] once the scrape is kept.
    pub timestamped: Vec<((String, String), i64)>,
    /// Samples left out: a series met again in the same scrape (the first
    /// is kept, as Prometheus keeps it), or one whose own timestamp is not
    /// newer than the one the previous scrape stored.
    pub samples_dropped: u64,
}

/// How far before its scrape a sample's own timestamp may be, and after.
const MAX_TIMESTAMP_AGE_US: i64 = 3_600_000_000;
const MAX_TIMESTAMP_AHEAD_US: i64 = 600_000_000;

/// Series (metric, canonical labels) and the newest timestamp of theirs
/// stored: kept from scrape to scrape, so that a series repeating an old
/// sample, or absent from a scrape and back with it, is stored once.
pub type Timestamps = HashMap<(String, String), i64>;

/// Scrapes between two prunings of a target's [`Timestamps`].
const PRUNE_EVERY_SCRAPES: u64 = 64;

/// Takes a kept scrape's timestamped series into the target's `known`
/// ones. Entries older than a sample may be are pruned every few scrapes;
/// past `limit` entries (the target's `sample_limit`), the oldest go. The
/// map is updated in place: rebuilding it every scrape copied every entry,
/// and a target whose timestamped labels never repeat made each scrape cost
/// `sample_limit` copies.
pub fn remember(
    known: &mut Timestamps,
    scraped: Vec<((String, String), i64)>,
    time_us: i64,
    scrapes: u64,
    limit: usize,
) {
    known.extend(scraped);
    if scrapes.is_multiple_of(PRUNE_EVERY_SCRAPES) || known.len() > limit {
        let horizon = time_us - MAX_TIMESTAMP_AGE_US;
        known.retain(|_, t| *t >= horizon);
    }
    if known.len() > limit {
        let mut times: Vec<i64> = known.values().copied().collect();
        let cut = times.len() - limit;
        let (_, &mut oldest_kept, _) = times.select_nth_unstable(cut);
        known.retain(|_, t| *t >= oldest_kept);
    }
}

/// Parses an exposition as it is read, into `scraped` rows of `target` at
/// `time_us`, picking out the histogram series `target` lists. A sample that
/// carries its own timestamp is stored at it, as Prometheus honours it, once:
/// not again while `earlier` (the target's [`Timestamps`]) holds it as
/// recent. A
/// series met twice keeps its first sample. Memory holds one line and the
/// rows so far; the first line past one of the target's limits ends the
/// parse (a `limit` failure), as does the first invalid one (`invalid`). A
/// read error is classified as a fetch's would be.
pub fn parse_stream(
    mut body: impl BufRead,
    format: Format,
    target: &ScrapeTarget,
    time_us: i64,
    earlier: &Timestamps,
) -> Result<Scraped, Failure> {
    let limits = Limits {
        label_limit: usize::try_from(target.label_limit).unwrap_or(usize::MAX),
        label_value_length_limit_bytes: usize::try_from(target.label_value_length_limit_bytes)
            .unwrap_or(usize::MAX),
    };
    let mut parser = Parser::with_limits(format, limits);
    let mut rows = BatchBuilder::new(&tables::SCRAPED);
    let mut series: Snapshot = BTreeMap::new();
    let mut seen: HashSet<(String, String)> = HashSet::new();
    let mut timestamped = Vec::new();
    let mut samples_dropped = 0;
    let mut line = Vec::new();
    let mut offset_bytes = 0u64;
    loop {
        line.clear();
        let read = body
            .read_until(b'\n', &mut line)
            .map_err(|e| body_read_failure(e, offset_bytes))?;
        if read == 0 {
            break;
        }
        let text = match std::str::from_utf8(&line) {
            Ok(text) => text,
            // A plain comment is passed over by every reader, Prometheus's
            // too: its bytes need not be text. HELP, TYPE, UNIT and EOF must.
            Err(_) if is_plain_comment(&line) => "#",
            Err(e) => {
                return Err(fail(
                    Reason::Invalid,
                    format!(
                        "line {}: not UTF-8 (at byte {} of the body)",
                        parser.line_number() + 1,
                        offset_bytes + e.valid_up_to() as u64
                    ),
                ))
            }
        };
        offset_bytes += read as u64;
        let text = text.strip_suffix('\n').unwrap_or(text);
        let sample = match parser.parse_line(text) {
            Ok(Some(sample)) => sample,
            Ok(None) => continue,
            Err(e) => {
                let reason = match e.limit {
                    Some(_) => Reason::Limit,
                    None => Reason::Invalid,
                };
                return Err(fail(reason, e.to_string()));
            }
        };
        if rows.len() as u64 >= target.sample_limit {
            return Err(fail(
                Reason::Limit,
                format!(
                    "more than sample_limit {} samples (line {})",
                    target.sample_limit,
                    parser.line_number()
                ),
            ));
        }
        let key = (sample.metric.to_string(), sample.labels.to_string());
        let sample_time_us = match sample.timestamp_us {
            None => time_us,
            // A timestamp far from the scrape (0, a clock years off) would
            // file the sample in another day's partition, and a receiver
            // refuses it out of bounds, with the whole request it is in.
            // Prometheus's head refuses what is that old too.
            Some(t) if !(time_us - MAX_TIMESTAMP_AGE_US..=time_us + MAX_TIMESTAMP_AHEAD_US).contains(&t) => {
                samples_dropped += 1;
                continue;
            }
            Some(t) => t,
        };
        if seen.contains(&key) {
            samples_dropped += 1;
            continue;
        }
        // A bucket of a histogram asked for, whether its row is stored or
        // not: one repeating its old timestamp still says where the series
        // stands, and left out it dropped the series from the window. A
        // bucket whose `le` does not read is left out of the quantiles only,
        // as PromQL leaves it out of `histogram_quantile`.
        if let Some(family) = sample.metric.strip_suffix("_bucket") {
            if target.histograms.iter().any(|h| h == family) {
                let bucket = split_le(&sample.labels)
                    .and_then(|(rest, le)| Some((rest, le.parse::<f64>().ok()?)));
                if let Some((rest, bound)) = bucket {
                    series
                        .entry((family.to_string(), rest))
                        .or_default()
                        .push((bound, sample.value));
                }
            }
        }
        if sample.timestamp_us.is_some() {
            let before = earlier.get(&key).copied();
            // Kept for the next scrape whether stored now or not: a series
            // that repeats its sample is stored once.
            timestamped.push((key.clone(), before.map_or(sample_time_us, |b| b.max(sample_time_us))));
            if before.is_some_and(|before| sample_time_us <= before) {
                samples_dropped += 1;
                seen.insert(key);
                continue;
            }
        }
        seen.insert(key);
        let row = ScrapedRow {
            target: &target.name,
            metric: sample.metric,
            labels: &sample.labels,
            value: Some(sample.value),
        };
        rows.push_row(sample_time_us, &row)
            .expect("a scraped row is for the scraped table");
    }
    parser
        .finish()
        .map_err(|e| fail(Reason::Invalid, e.to_string()))?;
    for buckets in series.values_mut() {
        buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
    }
    Ok(Scraped {
        rows: rows.finish(),
        histograms: series,
        timestamped,
        samples_dropped,
    })
}

/// Whether `line` is a comment that says nothing to a parser: not HELP,
/// TYPE, UNIT or EOF.
fn is_plain_comment(line: &[u8]) -> bool {
    line.starts_with(b"#")
        && ![&b"# HELP "[..], b"# TYPE ", b"# UNIT ", b"# EOF"]
            .iter()
            .any(|keyword| line.starts_with(keyword))
}

/// Scrapes a target once: fetches it and parses the body as it arrives.
pub(super) fn scrape(
    agent: &ureq::Agent,
    target: &ScrapeTarget,
    time_us: i64,
    earlier: &Timestamps,
) -> Result<Scraped, Failure> {
    let mut response = agent
        .get(&target.url)
        .header("Accept", ACCEPT)
        .call()
        .map_err(classify)?;
    let status = response.status();
    if !status.is_success() {
        return Err(fail(Reason::Http, format!("HTTP status {status}")));
    }
    let format = match response.headers().get("content-type") {
        Some(v) if v.as_bytes().starts_with(b"application/openmetrics-text") => Format::OpenMetrics,
        _ => Format::PrometheusText,
    };
    // A declared length past the limit is refused before a byte is read.
    let declared_bytes = response
        .headers()
        .get("content-length")
        .and_then(|v| v.to_str().ok()?.trim().parse::<u64>().ok());
    if let Some(bytes) = declared_bytes.filter(|&b| b > target.body_size_limit_bytes) {
        return Err(body_too_large(bytes, target.body_size_limit_bytes));
    }
    // ureq's limit errs on the read after `limit` bytes even at the body's
    // end: one byte more lets a body of exactly the limit read to its end.
    let reader = response
        .body_mut()
        .with_config()
        .limit(target.body_size_limit_bytes.saturating_add(1))
        .reader();
    parse_stream(
        std::io::BufReader::with_capacity(64 << 10, reader),
        format,
        target,
        time_us,
        earlier,
    )
}

pub(super) fn body_too_large(bytes: u64, limit_bytes: u64) -> Failure {
    fail(
        Reason::Limit,
        format!("body of {bytes} bytes or more, larger than body_size_limit_bytes {limit_bytes}"),
    )
}

/// A read of the body that failed: past the limit or the timeout as a
/// fetch's would be; otherwise the target answered and its body broke off
/// (the connection closed before the declared length, a chunk cut), which
/// is an exposition that is not whole, not a target out of reach.
fn body_read_failure(e: std::io::Error, read_bytes: u64) -> Failure {
    let failure = classify(ureq::Error::from(e));
    match failure.reason {
        Reason::Connect => fail(
            Reason::Invalid,
            format!(
                "body cut short after {read_bytes} bytes: {}",
                failure.message
            ),
        ),
        _ => failure,
    }
}

pub(super) fn classify(e: ureq::Error) -> Failure {
    use std::io::ErrorKind;
    let reason = match &e {
        ureq::Error::Timeout(_) => Reason::Timeout,
        ureq::Error::Io(io) if matches!(io.kind(), ErrorKind::TimedOut | ErrorKind::WouldBlock) => {
            Reason::Timeout
        }
        ureq::Error::Io(_) | ureq::Error::HostNotFound | ureq::Error::ConnectionFailed => {
            Reason::Connect
        }
        ureq::Error::StatusCode(_) => Reason::Http,
        // The reader was given the limit plus one byte (see `scrape`).
        ureq::Error::BodyExceedsLimit(read_bytes) => {
            return body_too_large(*read_bytes, read_bytes.saturating_sub(1))
        }
        _ => Reason::Invalid,
    };
    fail(reason, e.to_string())
}
