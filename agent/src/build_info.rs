//! The build the agent runs, as Prometheus exporters give theirs:
//! `vtax_build_info{version,revision,rustc_version} 1`. The version comes from
//! Cargo.toml, the revision and rustc's version from `build.rs`.

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

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use vtax_exporters::{Exposition, Format};

    use super::*;

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
