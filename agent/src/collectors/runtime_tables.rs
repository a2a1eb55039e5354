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

/// One row per pass of the uploader (`agent/src/upload/`).
pub static UPLOAD: TableDef = TableDef {
    name: "upload",
    help: "One row per pass of the uploader that copies sealed Parquet files to object storage.",
    tags: &[],
    fields: &[
        FieldDef::counter(
            "files",
            FieldType::U64,
            Unit::None,
            "Files uploaded and confirmed (size and ETag checked) since the agent started.",
        ),
        FieldDef::counter(
            "uploaded_bytes",
            FieldType::U64,
            Unit::Bytes,
            "Bytes of the files uploaded since the agent started.",
        ),
        FieldDef::counter(
            "covered_files",
            FieldType::U64,
            Unit::None,
            "Merged files recorded as uploaded without a put, since every file they merge is remote.",
        ),
        FieldDef::counter(
            "replaced_objects_deleted",
            FieldType::U64,
            Unit::None,
            "Remote objects deleted because an uploaded file that merges them replaced them.",
        ),
        FieldDef::counter(
            "failures",
            FieldType::U64,
            Unit::None,
            "Failed puts, checks and deletes since the agent started; each is retried at the next pass.",
        ),
        FieldDef::gauge(
            "pending_files",
            FieldType::U64,
            Unit::None,
            "Sealed files not yet uploaded after the last pass.",
        ),
        FieldDef::gauge(
            "oldest_pending_age_seconds",
            FieldType::F64,
            Unit::Seconds,
            "Seconds since the oldest file not yet uploaded was written; 0 when none waits.",
        ),
    ],
    exported: true,
};

/// Tables of this module; `remote_write` is declared beside the code that
/// fills it.
pub static TABLES: &[&TableDef] = &[&COLLECTOR, &UPLOAD, &vtax_exporters::remote_write::TABLE];
