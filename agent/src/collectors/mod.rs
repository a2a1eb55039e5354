//! Collectors: one per source, each reading through a root path that tests point
//! at a fixture tree.

pub mod cpu;

use vtax_store::TableDef;

/// Tables the collectors write.
pub static TABLES: &[&TableDef] = &[&cpu::CPU];
