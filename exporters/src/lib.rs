//! Ways out of the node for vtax's samples: Prometheus exposition (`/metrics`),
//! Prometheus remote write, and sealed Parquet files to object storage.
//!
//! Nothing lives here yet: the metric names and help these will use are already
//! generated from the table declarations (`vtax_store::TableDef::metric_name`),
//! and the exporters themselves arrive with the agent runtime (issue 3) and the
//! fleet work (issue 8).
#![deny(missing_docs)]
