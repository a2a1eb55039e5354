//! Ways out of the node for vtax's samples: Prometheus exposition (`/metrics`)
//! and Prometheus remote write. Sealed Parquet files go to object storage from
//! the agent (`agent/src/upload/`).
#![deny(missing_docs)]

pub mod exposition;
pub mod remote_write;
pub mod settings_file;
pub mod size;

pub use exposition::{Bodies, Exposition, Format};
#[cfg(test)]
mod test_tables;
pub mod web;

pub use web::{serve, WebServer};
