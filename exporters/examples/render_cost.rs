//! Time one render (text + gzip) of N synthetic series.
//! cargo run --release -p vtax-exporters --example render_cost -- 1500
use std::sync::Arc;
use std::time::Instant;
use vtax_exporters::{Exposition, Format};
use vtax_store::schema::{FieldDef, FieldType, MetricKind, TableDef, TagDef, Unit};
use vtax_store::{BatchBuilder, Value};

static T: TableDef = TableDef {
    name: "synthetic",
    help: "Synthetic.",
    tags: &[
        TagDef {
            name: "path",
            help: "p",
        },
        TagDef {
            name: "workload",
            help: "w",
        },
    ],
    fields: &[
        FieldDef {
            name: "usage_seconds",
            ty: FieldType::F64,
            kind: MetricKind::Counter,
            unit: Unit::Seconds,
            help: "u",
        },
        FieldDef {
            name: "memory_bytes",
            ty: FieldType::U64,
            kind: MetricKind::Gauge,
            unit: Unit::Bytes,
            help: "m",
        },
    ],
    exported: true,
};

fn main() {
    let series: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(1500);
    let e = Exposition::new(&[&T]);
    let mut b = BatchBuilder::new(&T);
    for i in 0..series / 2 {
        let path = format!("/system.slice/job{i:04}.service");
        b.push(
            0,
            &[&path, "service"],
            &[
                Value::F64(12345.678 + i as f64 * 0.37),
                Value::U64(1 << 30 | i as u64),
            ],
        )
        .unwrap();
    }
    e.update("s", vec![Arc::new(b.finish())]);
    let _ = e.body(Format::Text, true);
    let n = 200;
    let t = Instant::now();
    for _ in 0..n {
        e.render_pending();
    }
    println!(
        "{series} series: {:.3} ms per render (text + gzip)",
        t.elapsed().as_secs_f64() * 1e3 / n as f64
    );
}
