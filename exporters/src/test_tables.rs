//! Tables the exporters' tests share.

use vtax_store::schema::{FieldDef, TableDef, TagDef, Unit, BUCKET_TAG};

/// A wake-up latency histogram per CPU, shaped like the jitter collector's.
pub static WAKEUP_HISTOGRAM: TableDef = TableDef {
    name: "jitter_wakeup",
    help: "test",
    tags: &[
        TagDef {
            name: "cpu",
            help: "CPU.",
        },
        TagDef {
            name: BUCKET_TAG,
            help: "Bound.",
        },
    ],
    fields: &[
        FieldDef::histogram("latency_seconds", Unit::Seconds, "Wake-ups by lateness."),
        FieldDef::histogram_sum("latency_seconds_sum", Unit::Seconds, "Sum."),
    ],
    exported: true,
};
