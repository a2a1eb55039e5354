//! The build the agent runs, as Prometheus exporters give theirs:
//! `vtax_build_info{version,revision,rustc_version} 1`. The version comes from
//! Cargo.toml, the revision and rustc's version from `build.rs`.

use std::time::{Duration, Instant};

use vtax_store::{Batch, BatchBuilder};

use crate::collectors::runtime_tables::{BuildRow, BUILD};

/// The agent's version.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");
/// The git commit the agent was built from, or `unknown`.
pub const REVISION: &str = env!("VTAX_BUILD_REVISION");
/// Version of the rustc that built the agent, or `unknown`.
pub const RUSTC_VERSION: &str = env!("VTAX_BUILD_RUSTC_VERSION");

/// The `build` table's one row, at `time_us`.
pub fn row(time_us: i64) -> Batch {
    let row = BuildRow {
        version: VERSION,
        revision: REVISION,
        rustc_version: RUSTC_VERSION,
        info: 1,
    };
    let mut rows = BatchBuilder::new(&BUILD);
    rows.push_row(time_us, &row)
        .expect("a build row is for the build table");
    rows.finish()
}

/// How often the row is kept again while the agent runs. Rows reach a
/// remote-write receiver only as they are kept, and Prometheus's instant
/// queries look back 5 minutes: a row kept once at the start left
/// `vtax_build_info` out of the receiver's answers 5 minutes later, and a
/// fleet's versions were no longer one query there.
pub const ROW_INTERVAL: Duration = Duration::from_secs(60);

/// When the row is due again.
pub struct BuildRows {
    next: Instant,
}

impl BuildRows {
    /// The row was kept at `kept`.
    pub fn new(kept: Instant) -> Self {
        BuildRows {
            next: kept + ROW_INTERVAL,
        }
    }

    /// The row at `time_us` (wall clock) when one is due at `now`: one per
    /// [`ROW_INTERVAL`], and one only after a stall of the main loop.
    pub fn due(&mut self, now: Instant, time_us: i64) -> Option<Batch> {
        if now < self.next {
            return None;
        }
        self.next = (self.next + ROW_INTERVAL).max(now + ROW_INTERVAL / 2);
        Some(row(time_us))
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use vtax_exporters::{Exposition, Format};

    use super::*;

    #[test]
    fn the_row_is_kept_again_every_interval_and_once_after_a_stall() {
        let start = Instant::now();
        let mut rows = BuildRows::new(start);
        let due = |rows: &mut BuildRows, after: Duration| rows.due(start + after, 7).is_some();
        assert!(!due(&mut rows, Duration::ZERO));
        assert!(!due(&mut rows, ROW_INTERVAL - Duration::from_millis(1)));
        assert!(due(&mut rows, ROW_INTERVAL));
        assert!(!due(&mut rows, ROW_INTERVAL + Duration::from_secs(1)));
        assert!(due(&mut rows, 2 * ROW_INTERVAL));
        // Under Prometheus's 5-minute look-back with room for a lost request.
        assert!(ROW_INTERVAL <= Duration::from_secs(150));
        // A main loop held up for ten intervals: one row, not ten.
        let after_stall = 12 * ROW_INTERVAL;
        assert!(due(&mut rows, after_stall));
        assert!(!due(&mut rows, after_stall + Duration::from_secs(1)));
        let row = rows
            .due(start + after_stall + ROW_INTERVAL, 7)
            .expect("due");
        assert_eq!(row.len(), 1);
        assert!(std::ptr::eq(row.table, &BUILD));
    }

    #[test]
    fn metrics_give_the_build_as_labels_of_a_constant_1() {
        let exposition = Exposition::new(&[&BUILD]);
        exposition.update("build", vec![Arc::new(row(1_763_766_000_000_000))]);
        let body = exposition.body(Format::Text, false);
        let body = std::str::from_utf8(&body).unwrap();
        assert!(body.contains("# TYPE vtax_build_info gauge\n"), "{body}");
        let line = body
            .lines()
            .find(|l| l.starts_with("vtax_build_info{"))
            .unwrap_or_else(|| panic!("no vtax_build_info sample in {body}"));
        let expected = format!(
            "vtax_build_info{{version=\"{}\",revision=\"{REVISION}\",rustc_version=\"{RUSTC_VERSION}\"}} 1",
            env!("CARGO_PKG_VERSION")
        );
        assert_eq!(line, expected);
        assert!(
            REVISION == "unknown"
                || (!REVISION.is_empty() && REVISION.bytes().all(|b| b.is_ascii_hexdigit())),
            "{REVISION}"
        );
        // `rustc 1.85.0 (4d91de4e4 2025-02-17)` gives `1.85.0`.
        let numbers: Vec<&str> = RUSTC_VERSION.split(['.', '-']).take(3).collect();
        assert!(
            numbers.len() == 3 && numbers.iter().all(|n| n.parse::<u32>().is_ok()),
            "{RUSTC_VERSION}"
        );
        assert_eq!(crate::golden::promtool_complaints(body), "");
    }
}
