//! Tables the store itself defines. Collector tables are declared beside their
//! collectors in the agent and passed to the store with these.

use crate::schema::{FieldDef, FieldType, TableDef, TagDef, Unit};

crate::table! {
    /// Samples read from other Prometheus endpoints or imported from
    /// OpenMetrics and Prometheus text files: one row per sample, stored
    /// losslessly.
    pub static SCRAPED: TableDef, pub struct ScrapedRow {
        name: "scraped",
        help: "One row per sample read from another local Prometheus endpoint or imported \
               with `vtax import`; the value is kept bit for bit. Its time is the sample's own \
               timestamp when it has one (a scrape stores such a sample once), else the \
               scrape's start or, for an import, the file's modification time.",
        tags: [
            target = TagDef {
                name: "target",
                help: "The `[[scrape]]` target the sample was read from; empty for samples \
                       brought in by `vtax import` (and in files written before this tag existed).",
            },
            metric = TagDef {
                name: "metric",
                help: "Metric name as exposed, e.g. `node_cpu_seconds_total`.",
            },
            labels = TagDef {
                name: "labels",
                help: "Label set in canonical form: sorted by name, `name=\"value\"` joined by commas.",
            },
        ],
        fields: [
            value: Option<f64> = FieldDef::gauge(FieldType::F64, Unit::None, "Sample value as exposed (gauge, counter or histogram part alike)."),
        ],
        exported: false,
    }
}

/// Every table the store crate declares.
pub static BUILTIN: &[&TableDef] = &[&SCRAPED];
