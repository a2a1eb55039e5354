//! Tables the runtime writes about itself: how each collector fared, and
//! how remote write is keeping up.

use vtax_store::schema::{FieldDef, FieldType, MetricKind, TableDef, TagDef, Unit};

/// One row per collector run.
pub static COLLECTOR: TableDef = TableDef {
    name: "collector",
    help: "One row per collector run: how long it took and whether it succeeded.",
    tags: &[TagDef {
        name: "collector",
        help: "Collector name, as in `[collectors.<name>]`.",
    }],
    fields: &[
        FieldDef {
            name: "duration_seconds",
            ty: FieldType::F64,
            kind: MetricKind::Gauge,
            unit: Unit::Seconds,
            help: "Wall-clock time the collector's last run took.",
        },
        FieldDef {
            name: "success",
            ty: FieldType::I64,
            kind: MetricKind::Gauge,
            unit: Unit::None,
            help: "1 if the collector's last run succeeded, 0 if it failed.",
        },
    ],
    exported: true,
};

/// Tables of this module; `remote_write` is declared beside the code that
/// fills it.
pub static TABLES: &[&TableDef] = &[&COLLECTOR, &vtax_exporters::remote_write::TABLE];
