//! The table model: one declaration per table is the single source of truth for
//! the Arrow/Parquet schema, the Prometheus metric names and help, and the metric
//! catalogue in `docs/metrics.md`.

use std::fmt::Write as _;
use std::sync::Arc;

use arrow_schema::{DataType, Field, Schema, TimeUnit};

/// Name of the time column every table has: microseconds since the Unix epoch, UTC.
pub const TIME_COLUMN: &str = "time";

/// Time zone of the time column, as an offset: readers need no time zone database.
pub const UTC: &str = "+00:00";

/// Version of the on-disk table layout, written into every Parquet file.
pub const SCHEMA_VERSION: u32 = 1;

/// Prefix of every exported metric name.
pub const METRIC_PREFIX: &str = "vtax";

/// Physical type of a field column.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FieldType {
    /// IEEE 754 double, stored bit for bit.
    F64,
    /// Signed 64-bit integer.
    I64,
    /// Unsigned 64-bit integer.
    U64,
}

impl FieldType {
    /// The Arrow type the field is stored as.
    pub fn arrow_type(self) -> DataType {
        match self {
            FieldType::F64 => DataType::Float64,
            FieldType::I64 => DataType::Int64,
            FieldType::U64 => DataType::UInt64,
        }
    }

    pub(crate) fn code(self) -> u8 {
        match self {
            FieldType::F64 => 1,
            FieldType::I64 => 2,
            FieldType::U64 => 3,
        }
    }

    pub(crate) fn from_code(code: u8) -> Option<Self> {
        match code {
            1 => Some(FieldType::F64),
            2 => Some(FieldType::I64),
            3 => Some(FieldType::U64),
            _ => None,
        }
    }

    fn as_str(self) -> &'static str {
        match self {
            FieldType::F64 => "f64",
            FieldType::I64 => "i64",
            FieldType::U64 => "u64",
        }
    }
}

/// How a field's value evolves, which decides the Prometheus type and name.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MetricKind {
    /// A value that goes up and down; stored as read.
    Gauge,
    /// A monotonic count since some start; stored raw, rates are derived downstream.
    Counter,
    /// A Prometheus histogram's cumulative bucket counts: one row per bucket,
    /// its upper bound in the table's `le` tag (`+Inf` last, whose count is
    /// the histogram's `_count`). Exposed as `<name>_bucket` and `<name>_count`
    /// so that `histogram_quantile` aggregates it across nodes.
    Histogram,
    /// The `_sum` of the histogram field named like this field without its
    /// `_sum` ending; set on the `+Inf` row, null on the others.
    HistogramSum,
    /// A value kept in the store for analysis and never exported: one that the
    /// exported fields already give in Prometheus's terms, as a count of
    /// events over a threshold is a histogram bucket.
    StoredOnly,
}

impl MetricKind {
    /// The Prometheus `# TYPE` word; `None` for a field that is not exported.
    pub fn prometheus_type(self) -> Option<&'static str> {
        match self {
            MetricKind::Gauge => Some("gauge"),
            MetricKind::Counter => Some("counter"),
            MetricKind::Histogram | MetricKind::HistogramSum => Some("histogram"),
            MetricKind::StoredOnly => None,
        }
    }

    /// The word the catalogue gives the kind.
    fn as_str(self) -> &'static str {
        self.prometheus_type().unwrap_or("stored only")
    }
}

/// Base unit of a field. The unit's suffix must end the field's name, so that
/// units live in column names and metric names alike.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unit {
    /// A count or an identifier: no suffix.
    None,
    /// Bytes.
    Bytes,
    /// Seconds.
    Seconds,
    /// A fraction between 0 and 1.
    Ratio,
    /// Degrees Celsius.
    Celsius,
    /// Watts.
    Watts,
    /// Joules.
    Joules,
    /// Hertz.
    Hertz,
    /// Bytes per second.
    BytesPerSecond,
}

impl Unit {
    /// The suffix that names carry, without the leading underscore.
    pub fn suffix(self) -> Option<&'static str> {
        match self {
            Unit::None => None,
            Unit::Bytes => Some("bytes"),
            Unit::Seconds => Some("seconds"),
            Unit::Ratio => Some("ratio"),
            Unit::Celsius => Some("celsius"),
            Unit::Watts => Some("watts"),
            Unit::Joules => Some("joules"),
            Unit::Hertz => Some("hertz"),
            Unit::BytesPerSecond => Some("bytes_per_second"),
        }
    }
}

/// Name of the tag that holds a histogram bucket's upper bound.
pub const BUCKET_TAG: &str = "le";

/// A tag column: a dictionary-encoded string that identifies a series.
#[derive(Debug)]
pub struct TagDef {
    /// Column and label name, e.g. `gpu`, `cpu`, `port`.
    pub name: &'static str,
    /// One sentence for the catalogue.
    pub help: &'static str,
}

/// A field column: one measured value per row. Fields are nullable, so a source
/// that lacks a value leaves a null and a field added later reads as null in
/// files written before it existed.
#[derive(Debug)]
pub struct FieldDef {
    /// Column name, ending with the unit's suffix (`power_watts`), never `_total`.
    pub name: &'static str,
    /// Physical type.
    pub ty: FieldType,
    /// Gauge or counter.
    pub kind: MetricKind,
    /// Base unit.
    pub unit: Unit,
    /// Help text: one or more sentences.
    pub help: &'static str,
}

impl FieldDef {
    /// A gauge field.
    pub const fn gauge(name: &'static str, ty: FieldType, unit: Unit, help: &'static str) -> Self {
        FieldDef {
            name,
            ty,
            kind: MetricKind::Gauge,
            unit,
            help,
        }
    }

    /// A counter field.
    pub const fn counter(
        name: &'static str,
        ty: FieldType,
        unit: Unit,
        help: &'static str,
    ) -> Self {
        FieldDef {
            name,
            ty,
            kind: MetricKind::Counter,
            unit,
            help,
        }
    }

    /// A histogram's cumulative bucket counts; its table needs a `le` tag.
    pub const fn histogram(name: &'static str, unit: Unit, help: &'static str) -> Self {
        FieldDef {
            name,
            ty: FieldType::U64,
            kind: MetricKind::Histogram,
            unit,
            help,
        }
    }

    /// A field kept in the store and not exported ([`MetricKind::StoredOnly`]).
    pub const fn stored_only(
        name: &'static str,
        ty: FieldType,
        unit: Unit,
        help: &'static str,
    ) -> Self {
        FieldDef {
            name,
            ty,
            kind: MetricKind::StoredOnly,
            unit,
            help,
        }
    }

    /// The `_sum` of the histogram `name` without its `_sum` ending.
    pub const fn histogram_sum(name: &'static str, unit: Unit, help: &'static str) -> Self {
        FieldDef {
            name,
            ty: FieldType::F64,
            kind: MetricKind::HistogramSum,
            unit,
            help,
        }
    }
}

/// A table: its name, tags and fields, declared once.
#[derive(Debug)]
pub struct TableDef {
    /// Table name: a directory under `tables/` and the middle of metric names.
    pub name: &'static str,
    /// What one row is.
    pub help: &'static str,
    /// Tag columns, in sort order: rows in a file are sorted by these, then time.
    pub tags: &'static [TagDef],
    /// Field columns.
    pub fields: &'static [FieldDef],
    /// Whether the fields are exported to Prometheus as `vtax_<table>_<field>`.
    /// Tables that hold other systems' samples (`scraped`) are not.
    pub exported: bool,
}

impl TableDef {
    /// Index of a tag column by name.
    pub fn tag_index(&self, name: &str) -> Option<usize> {
        self.tags.iter().position(|t| t.name == name)
    }

    /// Index of a field column by name.
    pub fn field_index(&self, name: &str) -> Option<usize> {
        self.fields.iter().position(|f| f.name == name)
    }

    /// The Arrow schema of the table as stored: time, tags (dictionary-encoded), fields.
    pub fn arrow_schema(&self) -> Arc<Schema> {
        let mut columns = Vec::with_capacity(1 + self.tags.len() + self.fields.len());
        columns.push(Field::new(TIME_COLUMN, time_type(), false));
        for tag in self.tags {
            columns.push(Field::new(tag.name, tag_type(), false));
        }
        for field in self.fields {
            columns.push(Field::new(field.name, field.ty.arrow_type(), true));
        }
        Arc::new(Schema::new(columns))
    }

    /// Whether `field` of this table is exported to Prometheus.
    pub fn exports(&self, field: &FieldDef) -> bool {
        self.exported && field.kind != MetricKind::StoredOnly
    }

    /// Prometheus name of a field: `vtax_<table>_<field>`, with `_total` on
    /// counters. A field whose first word repeats the table's last word, alone
    /// or followed by a number, says it once: `info` of `gpu_info` is
    /// `vtax_gpu_info` (an info metric, as Prometheus names them) and `load1`
    /// of `load` is `vtax_load1` (node_exporter's `node_load1`), not
    /// `vtax_gpu_info_info` and `vtax_load_load1`. The column keeps its name.
    pub fn metric_name(&self, field: &FieldDef) -> String {
        let last_word = self.name.rsplit('_').next().unwrap_or(self.name);
        let first_word = field.name.split('_').next().unwrap_or(field.name);
        let repeated = first_word
            .strip_prefix(last_word)
            .is_some_and(|rest| rest.bytes().all(|b| b.is_ascii_digit()));
        let mut name = if repeated {
            let before = &self.name[..self.name.len() - last_word.len()];
            format!("{METRIC_PREFIX}_{before}{}", field.name)
        } else {
            format!("{METRIC_PREFIX}_{}_{}", self.name, field.name)
        };
        if field.kind == MetricKind::Counter {
            name.push_str("_total");
        }
        name
    }

    /// Checks the naming rules that the rest of the system relies on.
    pub fn validate(&self) -> Result<(), String> {
        let valid_ident = |s: &str| {
            !s.is_empty()
                && s.chars().next().is_some_and(|c| c.is_ascii_lowercase())
                && s.chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
        };
        if !valid_ident(self.name) {
            return Err(format!("table name {:?} is not snake_case", self.name));
        }
        let mut seen = std::collections::HashSet::new();
        seen.insert(TIME_COLUMN);
        for tag in self.tags {
            if !valid_ident(tag.name) || !seen.insert(tag.name) {
                return Err(format!(
                    "table {}: bad or duplicate tag {:?}",
                    self.name, tag.name
                ));
            }
        }
        for field in self.fields {
            if !valid_ident(field.name) || !seen.insert(field.name) {
                return Err(format!(
                    "table {}: bad or duplicate field {:?}",
                    self.name, field.name
                ));
            }
            if field.name.ends_with("_total") {
                return Err(format!(
                    "table {}: field {} must not end in _total: counters get it in the metric name",
                    self.name, field.name
                ));
            }
            if let Some(word) = non_base_unit(field.name).filter(|_| self.exports(field)) {
                return Err(format!(
                    "table {}: field {} names the unit {word:?}: exported names carry base units (seconds, bytes) as their ending",
                    self.name, field.name
                ));
            }
            if field.kind == MetricKind::Histogram && self.tag_index(BUCKET_TAG).is_none() {
                return Err(format!(
                    "table {}: histogram field {} needs a `{BUCKET_TAG}` tag",
                    self.name, field.name
                ));
            }
            if field.kind == MetricKind::HistogramSum {
                let histogram = field.name.strip_suffix("_sum").and_then(|h| {
                    self.fields
                        .iter()
                        .find(|f| f.name == h && f.kind == MetricKind::Histogram)
                });
                if histogram.is_none() {
                    return Err(format!(
                        "table {}: histogram sum {} must be named after a histogram field plus _sum",
                        self.name, field.name
                    ));
                }
            } else if let Some(suffix) = field.unit.suffix() {
                if !field.name.ends_with(&format!("_{suffix}")) {
                    return Err(format!(
                        "table {}: field {} must end with its unit _{suffix}",
                        self.name, field.name
                    ));
                }
            }
            if field.help.trim().is_empty() {
                return Err(format!(
                    "table {}: field {} has no help",
                    self.name, field.name
                ));
            }
        }
        Ok(())
    }
}

/// Units that are not base units, as words of a name: Prometheus names carry
/// their unit in base units, as their ending (`_seconds`, `_bytes`).
const NON_BASE_UNITS: &[&str] = &[
    "ns",
    "us",
    "ms",
    "nanoseconds",
    "microseconds",
    "milliseconds",
    "minutes",
    "hours",
    "days",
    "kb",
    "mb",
    "gb",
    "kib",
    "mib",
    "gib",
    "percent",
];

/// The first word of `name` that names a unit other than a base one, alone
/// or after a number (`50us`).
fn non_base_unit(name: &str) -> Option<&str> {
    name.split('_').find(|word| {
        NON_BASE_UNITS.contains(&word.trim_start_matches(|c: char| c.is_ascii_digit()))
    })
}

/// Arrow type of the time column.
pub fn time_type() -> DataType {
    DataType::Timestamp(TimeUnit::Microsecond, Some(UTC.into()))
}

/// Arrow type of a tag column.
pub fn tag_type() -> DataType {
    DataType::Dictionary(Box::new(DataType::Int32), Box::new(DataType::Utf8))
}

/// Renders the metric catalogue (`docs/metrics.md`) for a set of tables.
pub fn render_catalogue(tables: &[&TableDef]) -> String {
    let mut out = String::new();
    out.push_str("# Metric catalogue\n\n");
    out.push_str(
        "Generated from the table declarations in the code; do not edit by hand.\n\
         Regenerate with `VTAX_UPDATE_GOLDEN=1 cargo test -p vtax catalogue`.\n\n\
         Every table is a directory of Parquet files under `tables/<table>/` with a `time`\n\
         column (TIMESTAMP(MICROS, UTC)), the tag columns (dictionary-encoded strings) and the\n\
         field columns below. Counters are stored raw; gauges as read.\n",
    );
    for table in tables {
        let _ = write!(out, "\n## `{}`\n\n{}\n\n", table.name, table.help);
        if !table.tags.is_empty() {
            out.push_str("| tag | meaning |\n|---|---|\n");
            for tag in table.tags {
                let _ = writeln!(out, "| `{}` | {} |", tag.name, tag.help);
            }
            out.push('\n');
        }
        if table.exported {
            out.push_str(
                "| column | type | kind | Prometheus metric | help |\n|---|---|---|---|---|\n",
            );
        } else {
            out.push_str("| column | type | kind | help |\n|---|---|---|---|\n");
        }
        for field in table.fields {
            if table.exported {
                let name = table.metric_name(field);
                let metric = match field.kind {
                    MetricKind::Histogram => format!("`{name}_bucket`, `{name}_count`"),
                    MetricKind::StoredOnly => "none".to_string(),
                    _ => format!("`{name}`"),
                };
                let _ = writeln!(
                    out,
                    "| `{}` | {} | {} | {metric} | {} |",
                    field.name,
                    field.ty.as_str(),
                    field.kind.as_str(),
                    field.help
                );
            } else {
                let _ = writeln!(
                    out,
                    "| `{}` | {} | {} | {} |",
                    field.name,
                    field.ty.as_str(),
                    field.kind.as_str(),
                    field.help
                );
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    static BAD_UNIT: TableDef = TableDef {
        name: "gpu",
        help: "x",
        tags: &[],
        fields: &[FieldDef {
            name: "power",
            ty: FieldType::F64,
            kind: MetricKind::Gauge,
            unit: Unit::Watts,
            help: "Power draw.",
        }],
        exported: true,
    };

    static GOOD: TableDef = TableDef {
        name: "gpu",
        help: "One row per GPU per tick.",
        tags: &[TagDef {
            name: "gpu",
            help: "GPU index.",
        }],
        fields: &[
            FieldDef {
                name: "power_watts",
                ty: FieldType::F64,
                kind: MetricKind::Gauge,
                unit: Unit::Watts,
                help: "Power draw.",
            },
            FieldDef {
                name: "energy_joules",
                ty: FieldType::U64,
                kind: MetricKind::Counter,
                unit: Unit::Joules,
                help: "Energy since the driver loaded.",
            },
        ],
        exported: true,
    };

    #[test]
    fn a_field_without_its_unit_suffix_is_rejected() {
        let err = BAD_UNIT.validate().unwrap_err();
        assert!(err.contains("_watts"), "{err}");
        GOOD.validate().unwrap();
    }

    static HISTOGRAM: TableDef = TableDef {
        name: "jitter_wakeup",
        help: "x",
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
            FieldDef::histogram("latency_seconds", Unit::Seconds, "Buckets."),
            FieldDef::histogram_sum("latency_seconds_sum", Unit::Seconds, "Sum."),
        ],
        exported: true,
    };

    #[test]
    fn a_histogram_needs_its_le_tag_and_a_sum_its_histogram() {
        HISTOGRAM.validate().unwrap();
        let no_le = TableDef {
            tags: &HISTOGRAM.tags[..1],
            ..HISTOGRAM
        };
        assert!(no_le.validate().unwrap_err().contains("`le` tag"));
        let orphan_sum = TableDef {
            fields: &HISTOGRAM.fields[1..],
            ..HISTOGRAM
        };
        assert!(orphan_sum
            .validate()
            .unwrap_err()
            .contains("named after a histogram field"));
        assert_eq!(
            HISTOGRAM.metric_name(&HISTOGRAM.fields[1]),
            "vtax_jitter_wakeup_latency_seconds_sum"
        );
    }

    #[test]
    fn counters_get_total_and_gauges_do_not() {
        assert_eq!(GOOD.metric_name(&GOOD.fields[0]), "vtax_gpu_power_watts");
        assert_eq!(
            GOOD.metric_name(&GOOD.fields[1]),
            "vtax_gpu_energy_joules_total"
        );
    }

    fn table(name: &'static str, fields: &'static [FieldDef]) -> TableDef {
        TableDef {
            name,
            help: "h",
            tags: &[],
            fields,
            exported: true,
        }
    }

    const fn gauge(name: &'static str) -> FieldDef {
        FieldDef::gauge(name, FieldType::F64, Unit::None, "h")
    }

    #[test]
    fn a_field_that_repeats_its_tables_last_word_says_it_once() {
        static INFO: [FieldDef; 1] = [gauge("info")];
        static LOAD: [FieldDef; 4] = [
            gauge("load1"),
            gauge("load5"),
            gauge("load15"),
            gauge("runnable_tasks"),
        ];
        // The info metric of a table named for its info is `<table>`, not `<table>_info`.
        assert_eq!(
            table("gpu_info", &INFO).metric_name(&INFO[0]),
            "vtax_gpu_info"
        );
        assert_eq!(
            table("block_device", &INFO).metric_name(&INFO[0]),
            "vtax_block_device_info"
        );
        assert_eq!(
            table("platform", &INFO).metric_name(&INFO[0]),
            "vtax_platform_info"
        );
        // A word followed by a number (a window) repeats it too, as node_load1.
        let load = table("load", &LOAD);
        let names: Vec<_> = LOAD.iter().map(|f| load.metric_name(f)).collect();
        assert_eq!(
            names,
            [
                "vtax_load1",
                "vtax_load5",
                "vtax_load15",
                "vtax_load_runnable_tasks"
            ]
        );
        // A longer word that only begins like the table's is another word.
        static UPLOADED: [FieldDef; 1] = [FieldDef::counter(
            "uploaded_bytes",
            FieldType::U64,
            Unit::Bytes,
            "h",
        )];
        assert_eq!(
            table("upload", &UPLOADED).metric_name(&UPLOADED[0]),
            "vtax_upload_uploaded_bytes_total"
        );
        static FILES: [FieldDef; 1] = [gauge("files_free")];
        assert_eq!(
            table("filesystem", &FILES).metric_name(&FILES[0]),
            "vtax_filesystem_files_free"
        );
        // Counters keep their ending after the repeat is dropped.
        static ERRORS: [FieldDef; 1] = [FieldDef::counter(
            "xid_errors",
            FieldType::U64,
            Unit::None,
            "h",
        )];
        assert_eq!(
            table("gpu_xid", &ERRORS).metric_name(&ERRORS[0]),
            "vtax_gpu_xid_errors_total"
        );
    }

    #[test]
    fn an_exported_name_with_a_unit_other_than_a_base_one_is_rejected() {
        static STALLS: [FieldDef; 1] = [FieldDef::gauge(
            "stalls_over_500us",
            FieldType::U64,
            Unit::None,
            "h",
        )];
        let err = table("jitter", &STALLS).validate().unwrap_err();
        assert!(err.contains("\"500us\""), "{err}");
        static DELAY: [FieldDef; 1] =
            [FieldDef::gauge("delay_ms", FieldType::F64, Unit::None, "h")];
        assert!(table("x", &DELAY).validate().is_err());
        // Kept in the store only, the column may keep the name it has.
        static STORED: [FieldDef; 1] = [FieldDef::stored_only(
            "stalls_over_500us",
            FieldType::U64,
            Unit::None,
            "h",
        )];
        let stored = table("jitter", &STORED);
        stored.validate().unwrap();
        assert!(!stored.exports(&STORED[0]));
        // Numbers that are not units pass: windows, percentiles, lanes.
        static FINE: [FieldDef; 3] = [
            gauge("load15"),
            FieldDef::gauge("some_avg10_ratio", FieldType::F64, Unit::Ratio, "h"),
            FieldDef::gauge("wakeup_p9999_seconds", FieldType::F64, Unit::Seconds, "h"),
        ];
        table("x", &FINE).validate().unwrap();
    }

    #[test]
    fn arrow_schema_is_time_tags_fields() {
        let schema = GOOD.arrow_schema();
        let names: Vec<_> = schema.fields().iter().map(|f| f.name().as_str()).collect();
        assert_eq!(names, ["time", "gpu", "power_watts", "energy_joules"]);
        assert_eq!(schema.field(0).data_type(), &time_type());
        assert!(!schema.field(1).is_nullable());
        assert!(schema.field(3).is_nullable());
    }
}
