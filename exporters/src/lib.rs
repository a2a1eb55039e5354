//! Ways out of the node for vtax's samples: Prometheus exposition (`/metrics`)
//! and Prometheus remote write; sealed Parquet files to object storage arrive
//! with the fleet work (issue 8).
#![deny(missing_docs)]

pub mod exposition;
pub mod remote_write;

pub use exposition::{Bodies, Exposition, Format};
pub mod web;

pub use web::{serve, WebServer};
