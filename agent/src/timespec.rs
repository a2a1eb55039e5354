//! Times on the command line: `now`, a duration ago (`1h`, `90m`, `2d 3h`), an
//! RFC 3339 time (`2025-11-21T10:00:00Z`), a date (`2025-11-21`, midnight UTC),
//! or Unix seconds.

use std::time::UNIX_EPOCH;

use anyhow::{bail, Context, Result};

pub use vtax_collectors::ticks::now_us;

/// Parses a time argument relative to `now_us`.
pub fn parse_time(text: &str, now_us: i64) -> Result<i64> {
    let text = text.trim();
    if text == "now" {
        return Ok(now_us);
    }
    if let Ok(seconds) = text.parse::<i64>() {
        return seconds
            .checked_mul(1_000_000)
            .with_context(|| format!("{text}: Unix seconds out of range"));
    }
    if let Some(day) = vtax_store::parse_date(text) {
        return Ok(day * vtax_store::DAY_US);
    }
    let ago = text.strip_prefix('-').unwrap_or(text);
    if let Ok(duration) = humantime::parse_duration(ago) {
        return Ok(now_us - duration.as_micros() as i64);
    }
    match humantime::parse_rfc3339_weak(text) {
        Ok(t) => Ok(t
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_micros() as i64)
            .unwrap_or(0)),
        Err(_) => bail!(
            "{text:?} is not a time: use `now`, a duration ago like `1h` or `30m`, \
             an RFC 3339 time like 2025-11-21T10:00:00Z, a date like 2025-11-21, or Unix seconds"
        ),
    }
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
        let err = parse_time("yesterday-ish", NOW).unwrap_err().to_string();
        assert!(err.contains("is not a time"), "{err}");
    }
}
