//! Tables the exporters' tests share.

use vtax_store::schema::{FieldDef, TagDef, Unit, BUCKET_TAG};

vtax_store::table! {
    /// A wake-up latency histogram per CPU, shaped like the jitter collector's.
    pub static WAKEUP_HISTOGRAM: TableDef, pub struct WakeupHistogramRow {
        name: "jitter_wakeup",
        help: "test",
        tags: [
            cpu = TagDef {
                name: "cpu",
                help: "CPU.",
            },
            le = TagDef {
                name: BUCKET_TAG,
                help: "Bound.",
            },
        ],
        fields: [
            latency_seconds: u64 = FieldDef::histogram(Unit::Seconds, "Wake-ups by lateness."),
            latency_seconds_sum: Option<f64> = FieldDef::histogram_sum(Unit::Seconds, "Sum."),
        ],
        exported: true,
    }
}
