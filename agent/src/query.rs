//! `vtax query`: rows of one table, filtered, as a table, CSV or JSON lines.
//! Reads without taking the writer's lock, so it works beside a running agent,
//! and sees rows still in the WAL.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{bail, Context, Result};
use arrow_array::RecordBatch;
use arrow_schema::{DataType, Field, Schema};
use vtax_store::files::node_of_store;
use vtax_store::scan::{fleet_nodes, scan_dir, scan_fleet_node};
use vtax_store::{ScanRequest, ScanResult};

use crate::timespec::{now_us, parse_time};

/// Output formats.
#[derive(Clone, Copy, clap::ValueEnum)]
pub enum OutputFormat {
    /// An aligned text table.
    Table,
    /// CSV with a header row.
    Csv,
    /// One JSON object per line.
    Json,
}

/// Arguments of `vtax query`.
#[derive(clap::Args)]
pub struct QueryArgs {
    /// Data directory of the store.
    #[arg(long, env = "VTAX_DATA_DIR")]
    data_dir: Option<PathBuf>,
    /// Table to read; without one, the tables are listed with what each holds.
    table: Option<String>,
    /// Earliest time, inclusive: `1h` (ago), RFC 3339, a date, or Unix seconds.
    #[arg(long)]
    since: Option<String>,
    /// Latest time, exclusive, in the same forms.
    #[arg(long)]
    until: Option<String>,
    /// Keep rows whose tag equals a value: `--where gpu=0`. Repeatable; all must hold.
    #[arg(long = "where", value_name = "TAG=VALUE")]
    filters: Vec<String>,
    /// Fields to print, comma-separated (default: all). Time and tags always print.
    #[arg(long, value_delimiter = ',')]
    fields: Option<Vec<String>>,
    /// Output format.
    #[arg(long, value_enum, default_value = "table")]
    format: OutputFormat,
    /// Leave out damaged files (a footer that does not read, pages whose
    /// CRC-32 fails or that do not decode), naming each on stderr, instead
    /// of failing.
    #[arg(long)]
    skip_damaged: bool,
}

/// The tables, one a line: name, then the first sentence of what it holds.
fn list_tables() -> Result<()> {
    let mut out = crate::Stdout;
    let catalog = crate::catalog();
    let width = catalog
        .tables()
        .iter()
        .map(|t| t.name.len())
        .max()
        .unwrap_or(0);
    for table in catalog.tables() {
        let first = table.help.split(". ").next().unwrap_or(table.help);
        let first = first.trim_end_matches('.');
        writeln!(out, "{:width$}  {first}.", table.name)?;
    }
    writeln!(
        out,
        "\nvtax query TABLE prints one; `vtax catalogue` has every field."
    )?;
    Ok(())
}

/// Runs `vtax query`.
pub fn query(args: QueryArgs) -> Result<()> {
    let Some(table) = args.table.clone() else {
        return list_tables();
    };
    let data_dir = args.data_dir.unwrap_or_else(crate::default_data_dir);
    if !data_dir.is_dir() {
        bail!("no store at {} (set --data-dir)", data_dir.display());
    }
    let now = now_us();
    let mut tag_equals = Vec::new();
    for filter in &args.filters {
        let Some((tag, value)) = filter.split_once('=') else {
            bail!("--where {filter:?}: expected TAG=VALUE");
        };
        tag_equals.push((tag.to_string(), value.to_string()));
    }
    // `node` is no table's tag: it names the store, or a fleet copy's partition.
    let (nodes, tag_equals): (Vec<_>, Vec<_>) =
        tag_equals.into_iter().partition(|(tag, _)| tag == NODE_TAG);
    let node = match nodes.as_slice() {
        [] => None,
        [(_, node), rest @ ..] => {
            if let Some((_, other)) = rest.iter().find(|(_, other)| other != node) {
                bail!("--where node={node} and --where node={other}: a query reads one node");
            }
            Some(node.clone())
        }
    };
    let from_us = args
        .since
        .as_deref()
        .map(|s| parse_time(s, now))
        .transpose()?;
    let until_us = args
        .until
        .as_deref()
        .map(|s| parse_time(s, now))
        .transpose()?;
    if let (Some(from), Some(until)) = (from_us, until_us) {
        if from >= until {
            bail!(
                "--since {} is not before --until {}: the range holds nothing (`1h` means an hour ago)",
                args.since.as_deref().unwrap_or_default(),
                args.until.as_deref().unwrap_or_default()
            );
        }
    }
    let request = ScanRequest {
        table: table.clone(),
        from_us,
        until_us,
        tag_equals,
        fields: args.fields,
        fields_only: false,
        skip_damaged: args.skip_damaged,
    };
    let scanning = || format!("scan {table} in {}", data_dir.display());
    let result = match scan_node(&data_dir, node.as_deref(), &request) {
        Ok(result) => result,
        Err(e)
            if e.downcast_ref::<vtax_store::Error>()
                .is_some_and(|e| e.damaged_file().is_some()) =>
        {
            bail!(
            "{}: {e}\nThe file is damaged: --skip-damaged reads the rest without it; \
             `vtax verify --quarantine`, with the agent stopped, finds every damaged file and moves it aside.",
            scanning()
        )
        }
        Err(e) => return Err(e.context(scanning())),
    };
    let batches = plain_batches(&result.batches)?;
    let mut out = crate::Stdout;
    match args.format {
        OutputFormat::Table => {
            writeln!(
                out,
                "{}",
                arrow_cast::pretty::pretty_format_batches(&batches)?
            )?;
        }
        OutputFormat::Csv => {
            let mut writer = arrow_csv::WriterBuilder::new()
                .with_header(true)
                .build(&mut out);
            if batches.is_empty() {
                if let Some(schema) = &result.schema {
                    let names: Vec<&str> =
                        schema.fields().iter().map(|f| f.name().as_str()).collect();
                    drop(writer);
                    writeln!(out, "{}", names.join(","))?;
                    return Ok(());
                }
            }
            for batch in &batches {
                writer.write(batch)?;
            }
        }
        OutputFormat::Json => {
            let mut writer = arrow_json::LineDelimitedWriter::new(&mut out);
            for batch in &batches {
                writer.write(batch)?;
            }
            writer.finish()?;
        }
    }
    Ok(())
}

/// What `--where node=NAME` selects: a node's store, or one node of a fleet copy.
const NODE_TAG: &str = "node";

/// Scans a node's store at `dir`, or with `node`, that node of the fleet copy
/// at `dir` (`tables/<table>/node=<node>/date=.../`). On a node's store,
/// `node` must be the store's own node: the one its files name.
pub(crate) fn scan_node(
    dir: &Path,
    node: Option<&str>,
    request: &ScanRequest,
) -> Result<ScanResult> {
    let catalog = crate::catalog();
    let fleet = fleet_nodes(dir).with_context(|| format!("list {}", dir.display()))?;
    if fleet.is_empty() {
        if let Some(node) = node {
            let own = node_of_store(dir).with_context(|| format!("list {}", dir.display()))?;
            if let Some(own) = own.filter(|own| own != node) {
                bail!(
                    "--where node={node}: the store at {} is node {own}'s",
                    dir.display()
                );
            }
        }
        return Ok(scan_dir(dir, &catalog, request)?);
    }
    let Some(node) = node else {
        bail!(
            "{} is a fleet copy of {} node(s): choose one with --where node=NAME ({})",
            dir.display(),
            fleet.len(),
            fleet.join(", ")
        );
    };
    if !fleet.iter().any(|n| n == node) {
        bail!(
            "--where node={node}: the fleet copy at {} has no such node; it has {}",
            dir.display(),
            fleet.join(", ")
        );
    }
    Ok(scan_fleet_node(dir, node, &catalog, request)?)
}

/// Tags as plain strings: every output format prints those the same way.
fn plain_batches(batches: &[RecordBatch]) -> Result<Vec<RecordBatch>> {
    batches
        .iter()
        .map(|batch| {
            let schema = batch.schema();
            let fields: Vec<Field> = schema
                .fields()
                .iter()
                .map(|f| match f.data_type() {
                    DataType::Dictionary(_, value) => {
                        Field::new(f.name(), (**value).clone(), f.is_nullable())
                    }
                    _ => f.as_ref().clone(),
                })
                .collect();
            let plain = Arc::new(Schema::new(fields));
            let columns = batch
                .columns()
                .iter()
                .zip(plain.fields())
                .map(|(c, f)| arrow_cast::cast(c, f.data_type()))
                .collect::<Result<Vec<_>, _>>()?;
            Ok(RecordBatch::try_new(plain, columns)?)
        })
        .collect()
}
