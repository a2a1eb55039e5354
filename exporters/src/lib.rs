//! Ways out of the node for vtax's samples: Prometheus exposition (`/metrics`)
//! now; Prometheus remote write and sealed Parquet files to object storage
//! arrive with the fleet work (issue 8).
#![deny(missing_docs)]

pub mod exposition;

pub use exposition::{Bodies, Exposition, Format};
pub mod web;

pub use web::{serve, WebServer};
