//! `vtax`: the node agent and the commands that work on its store.

mod collectors;
mod import;
mod query;
mod run;
mod timespec;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// Where the store lives when installed as a package.
pub const INSTALLED_DATA_DIR: &str = "/var/lib/vtax";
/// Where the store lives otherwise: relative to the working directory.
pub const LOCAL_DATA_DIR: &str = "./vtax-data";

/// The default data directory: the installed one when it exists, else a local one.
pub fn default_data_dir() -> PathBuf {
    if std::path::Path::new(INSTALLED_DATA_DIR).is_dir() {
        PathBuf::from(INSTALLED_DATA_DIR)
    } else {
        PathBuf::from(LOCAL_DATA_DIR)
    }
}

#[derive(Parser)]
#[command(
    name = "vtax",
    version,
    about = "Node telemetry agent and Parquet time-series store for GPU servers"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the agent: sample this node and write every sample to the store.
    Run(run::RunArgs),
    /// Import OpenMetrics or Prometheus text files into the `scraped` table.
    Import(import::ImportArgs),
    /// Read rows of a table.
    Query(query::QueryArgs),
    /// Merge each finished day's files into one and apply retention.
    Compact(run::CompactArgs),
    /// Print the metric catalogue generated from the table declarations.
    Catalogue,
}

/// Every table the agent writes: the store's own and the collectors'.
pub fn catalog() -> vtax_store::Catalog {
    let mut tables: Vec<&'static vtax_store::TableDef> = vtax_store::tables::BUILTIN.to_vec();
    tables.extend(collectors::TABLES);
    vtax_store::Catalog::new(&tables).expect("the built-in table declarations are valid")
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("VTAX_LOG")
                .unwrap_or_else(|_| "info".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Run(args) => run::run(args),
        Command::Import(args) => import::import(args),
        Command::Query(args) => query::query(args),
        Command::Compact(args) => run::compact(args),
        Command::Catalogue => {
            print!(
                "{}",
                vtax_store::schema::render_catalogue(catalog().tables())
            );
            Ok(())
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("vtax: error: {e:#}");
            ExitCode::from(1)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `docs/metrics.md` is generated from the declarations; this catches drift.
    #[test]
    fn catalogue_matches_docs() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/metrics.md");
        let generated = vtax_store::schema::render_catalogue(catalog().tables());
        if std::env::var_os("VTAX_UPDATE_GOLDEN").is_some() {
            std::fs::write(path, &generated).unwrap();
        }
        let on_disk = std::fs::read_to_string(path).unwrap_or_default();
        assert!(
            on_disk == generated,
            "docs/metrics.md is stale: run `VTAX_UPDATE_GOLDEN=1 cargo test -p vtax catalogue`"
        );
    }
}
