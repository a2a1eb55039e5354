//! Times on the command line: `now`, a duration ago (`1h`, `90m`, `2d 3h`), an
//! RFC 3339 time (`2025-11-21T10:00:00Z`, `2025-11-21T11:00:00+01:00`; one
//! without a zone, `2025-11-21 10:00:00`, is UTC, not the local zone), a date
//! (`2025-11-21`, midnight UTC), or Unix seconds (ten digits, or 0).

use std::time::UNIX_EPOCH;

use anyhow::{bail, Context, Result};

pub use vtax_collectors::ticks::now_us;

/// Unix seconds taken as such: from 2001-09-09 (ten digits) to before the
/// year 5138 (eleven). A number outside is another unit or a date written
/// without dashes, and read as seconds it would quietly mean another time:
/// milliseconds far in the future, `20261206` a day of August 1970.
const UNIX_SECONDS: std::ops::Range<i64> = 1_000_000_000..100_000_000_000;

/// Parses a time argument relative to `now_us`. Fractions below a
/// microsecond round up, so that `--since` keeps no time before it and
/// `--until` every time before it.
pub fn parse_time(text: &str, now_us: i64) -> Result<i64> {
    let text = text.trim();
    if text == "now" {
        return Ok(now_us);
    }
    if let Ok(seconds) = text.parse::<i64>() {
        return unix_seconds(text, seconds);
    }
    if let Some(day) = vtax_store::parse_date(text) {
        return Ok(day * vtax_store::DAY_US);
    }
    let ago = text.strip_prefix('-').unwrap_or(text);
    if let Ok(duration) = humantime::parse_duration(ago) {
        return Ok(now_us - duration.as_micros() as i64);
    }
    if let Ok(t) = chrono::DateTime::parse_from_rfc3339(text) {
        return Ok(micros_rounded_up(t.timestamp(), t.timestamp_subsec_nanos()));
    }
    match humantime::parse_rfc3339_weak(text) {
        Ok(t) => Ok(t
            .duration_since(UNIX_EPOCH)
            .map(|d| micros_rounded_up(d.as_secs() as i64, d.subsec_nanos()))
            .unwrap_or(0)),
        Err(_) => bail!(
            "{text:?} is not a time: use `now`, a duration ago like `1h` or `30m`, \
             an RFC 3339 time like 2025-11-21T10:00:00Z or 2025-11-21T11:00:00+01:00 \
             (without a zone, UTC), a date like 2025-11-21, or Unix seconds"
        ),
    }
}

fn micros_rounded_up(seconds: i64, nanos: u32) -> i64 {
    seconds * 1_000_000 + i64::from(nanos.div_ceil(1000))
}

/// A number as Unix seconds, when it can be: 0 (the epoch: everything) or
/// ten digits' worth; otherwise an error that says what it more likely is.
fn unix_seconds(text: &str, seconds: i64) -> Result<i64> {
    if seconds == 0 || UNIX_SECONDS.contains(&seconds) {
        return seconds
            .checked_mul(1_000_000)
            .with_context(|| format!("{text}: Unix seconds out of range"));
    }
    let digits = text.trim_start_matches(['-', '+']).len();
    let likely = if seconds >= UNIX_SECONDS.end {
        format!("{digits} digits: milliseconds or microseconds? Unix seconds now have 10")
    } else if digits == 8 {
        let (y, rest) = text.split_at(4);
        let (m, d) = rest.split_at(2);
        format!("a date without dashes? write it {y}-{m}-{d}")
    } else {
        "as Unix seconds, before 2001".to_string()
    };
    bail!("{text:?} is not a time vtax reads as Unix seconds ({likely})")
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: i64 = 1_763_726_400_000_000; // 2025-11-21T12:00:00Z

    #[test]
    fn every_spelling_parses() {
        assert_eq!(parse_time("now", NOW).unwrap(), NOW);
        assert_eq!(parse_time("1h", NOW).unwrap(), NOW - 3_600_000_000);
        assert_eq!(parse_time("-90m", NOW).unwrap(), NOW - 5_400_000_000);
        assert_eq!(
            parse_time("2025-11-21", NOW).unwrap(),
            NOW - 12 * 3_600_000_000
        );
        assert_eq!(parse_time("2025-11-21T12:00:00Z", NOW).unwrap(), NOW);
        assert_eq!(parse_time("1763726400", NOW).unwrap(), NOW);
        assert_eq!(parse_time("0", NOW).unwrap(), 0);
        let err = parse_time("yesterday-ish", NOW).unwrap_err().to_string();
        assert!(err.contains("is not a time"), "{err}");
    }

    /// An offset is the time it names; a time without a zone is UTC.
    #[test]
    fn an_rfc3339_offset_is_taken_and_no_zone_is_utc() {
        for text in [
            "2025-11-21T13:00:00+01:00",
            "2025-11-21t12:00:00z",
            "2025-11-21T07:00:00-05:00",
            "2025-11-21T12:00:00",
            "2025-11-21 12:00:00",
        ] {
            assert_eq!(parse_time(text, NOW).unwrap(), NOW, "{text}");
        }
    }

    /// Read as seconds, a time in milliseconds is millennia ahead and a date
    /// without dashes is in 1970: refused, saying what it more likely is.
    #[test]
    fn a_number_in_another_unit_is_refused_not_read_as_seconds() {
        let err = |text: &str| parse_time(text, NOW).unwrap_err().to_string();
        assert!(
            err("1763726400000").contains("13 digits: milliseconds or microseconds?"),
            "{}",
            err("1763726400000")
        );
        assert!(
            err("20251121").contains("write it 2025-11-21"),
            "{}",
            err("20251121")
        );
        assert!(err("2025").contains("before 2001"), "{}", err("2025"));
        assert!(err("-90").contains("not a time"), "{}", err("-90"));
    }

    /// Below a microsecond a time rounds up: a row at .999999 s is before
    /// `--since ….9999995` and before `--until ….9999995` alike.
    #[test]
    fn a_fraction_below_a_microsecond_rounds_up() {
        assert_eq!(
            parse_time("2025-11-21T11:59:59.9999995Z", NOW).unwrap(),
            NOW
        );
        assert_eq!(
            parse_time("2025-11-21T11:59:59.999999Z", NOW).unwrap(),
            NOW - 1
        );
    }
}
