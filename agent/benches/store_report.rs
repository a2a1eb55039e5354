//! Cost of the `store` table's row, which the main loop builds once a second,
//! over a store of 1,000 files (a month of compacted days of about 30
//! tables), and of the part of it that sums the files' sizes.
//!
//! `cargo bench -p vtax --bench store_report`

use std::time::Instant;

use vtax::store_report::StoreReport;
use vtax_collectors::runtime_tables::{CollectorRow, COLLECTOR};
use vtax_store::{BatchBuilder, Store, StoreOptions, HOUR_US};

/// 2025-11-21T00:00:00Z.
const T0: i64 = 1_763_683_200_000_000;
const FILES: i64 = 1000;
const ROWS: u32 = 1000;

fn main() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let mut options = StoreOptions::new(dir.path());
    options.node = "bench".into();
    options.retention_max_bytes = Some(1 << 30);
    let mut store = Store::open(options, vtax::catalog()).expect("open the store");
    for hour in 0..FILES {
        let mut builder = BatchBuilder::new(&COLLECTOR);
        for i in 0..2 {
            let row = CollectorRow {
                collector: "host",
                duration_seconds: 0.001,
                success: 1,
                failed_sources: 0,
                left_out: 0,
            };
            builder
                .push_row(T0 + hour * HOUR_US + i * 1_000_000, &row)
                .expect("a collector row");
        }
        store.append(&builder.finish()).expect("append");
        store.flush().expect("publish");
    }
    let mut report = StoreReport::new(dir.path().to_owned());
    let started = Instant::now();
    for _ in 0..ROWS {
        std::hint::black_box(report.row(&store, T0));
    }
    let each = started.elapsed() / ROWS;
    let started = Instant::now();
    for _ in 0..ROWS {
        std::hint::black_box(store.table_bytes());
    }
    let sum = started.elapsed() / ROWS;
    println!("{FILES} files: a row costs {each:?}, of which summing the file sizes {sum:?}");
}
