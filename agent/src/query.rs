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
    #[arg(long, allow_hyphen_values = true)]
    since: Option<String>,
    /// Latest time, exclusive, in the same forms.
    #[arg(long, allow_hyphen_values = true)]
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
    let data_dir = crate::existing_store_dir(args.data_dir)?;
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
            if batches.is_empty() {
                // arrow's table of no batches is `++`: say what was read.
                let columns = result.schema.as_ref().map(|schema| {
                    let names: Vec<&str> =
                        schema.fields().iter().map(|f| f.name().as_str()).collect();
                    names.join(", ")
                });
                match columns {
                    Some(columns) => writeln!(out, "No rows. Columns: {columns}.")?,
                    None => writeln!(out, "No rows: the table has no data in the store.")?,
                }
                return Ok(());
            }
            let shown = batches
                .iter()
                .map(controls_escaped)
                .collect::<Result<Vec<_>>>()?;
            writeln!(
                out,
                "{}",
                arrow_cast::pretty::pretty_format_batches(&shown)?
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
        OutputFormat::Json => write_json_lines(&batches, &mut out)?,
    }
    Ok(())
}

/// One JSON object a row. JSON has no NaN or infinities, and arrow-json
/// prints them as `null`, the same as a field that holds nothing; so a
/// float that is not finite prints as the string Prometheus's HTTP API
/// gives it (`"NaN"`, `"+Inf"`, `"-Inf"`), and every other as a number.
fn write_json_lines(batches: &[RecordBatch], out: &mut impl Write) -> Result<()> {
    let mut writer = arrow_json::WriterBuilder::new()
        .with_encoder_factory(Arc::new(NonFiniteAsStrings))
        .build::<_, arrow_json::writer::LineDelimited>(out);
    for batch in batches {
        writer.write(batch)?;
    }
    writer.finish()?;
    Ok(())
}

#[derive(Debug)]
struct NonFiniteAsStrings;

impl arrow_json::EncoderFactory for NonFiniteAsStrings {
    fn make_default_encoder<'a>(
        &self,
        _field: &'a arrow_schema::FieldRef,
        array: &'a dyn arrow_array::Array,
        _options: &'a arrow_json::EncoderOptions,
    ) -> Result<Option<arrow_json::writer::NullableEncoder<'a>>, arrow_schema::ArrowError> {
        use arrow_array::cast::AsArray;
        use arrow_array::types::{Float32Type, Float64Type};
        let encoder: Box<dyn arrow_json::Encoder + 'a> =
            if let Some(values) = array.as_primitive_opt::<Float64Type>() {
                Box::new(FloatEncoder(values))
            } else if let Some(values) = array.as_primitive_opt::<Float32Type>() {
                Box::new(FloatEncoder(values))
            } else {
                return Ok(None);
            };
        Ok(Some(arrow_json::writer::NullableEncoder::new(
            encoder,
            array.logical_nulls(),
        )))
    }
}

struct FloatEncoder<'a, T: arrow_array::ArrowPrimitiveType>(&'a arrow_array::PrimitiveArray<T>);

impl<T> arrow_json::Encoder for FloatEncoder<'_, T>
where
    T: arrow_array::ArrowPrimitiveType,
    T::Native: Into<f64> + std::fmt::Debug,
{
    fn encode(&mut self, idx: usize, out: &mut Vec<u8>) {
        let native = self.0.value(idx);
        let _ = match vtax_store::openmetrics::non_finite_text(native.into()) {
            Some(text) => write!(out, "\"{text}\""),
            // Debug is the shortest text that reads back to the same bits,
            // and is valid JSON for a finite value ("0.1", "1e308", "-0.0").
            None => write!(out, "{native:?}"),
        };
    }
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

/// Whether a table writes `c` as its escape: every control character (a
/// newline would break the table's rows) and what else acts on the text
/// around it ([`crate::acts_on_text`]: a direction override).
fn escaped_in_tables(c: char) -> bool {
    c.is_control() || crate::acts_on_text(c)
}

/// `batch` with the control characters of its text written as escapes
/// (`\n`, `\u{1b}`, `\u{202e}`): a name is whatever a cgroup, mount or
/// interface was called, and a table goes to a terminal, where an escape
/// sequence in a name would act and a newline would break the table's rows.
fn controls_escaped(batch: &RecordBatch) -> Result<RecordBatch> {
    use arrow_array::cast::AsArray;
    let columns = batch
        .columns()
        .iter()
        .map(|column| match column.as_string_opt::<i32>() {
            Some(text)
                if text
                    .iter()
                    .flatten()
                    .any(|v| v.chars().any(escaped_in_tables)) =>
            {
                let escaped: arrow_array::StringArray = text
                    .iter()
                    .map(|v| {
                        v.map(|v| {
                            v.chars()
                                .map(|c| {
                                    if escaped_in_tables(c) {
                                        c.escape_default().to_string()
                                    } else {
                                        c.to_string()
                                    }
                                })
                                .collect::<String>()
                        })
                    })
                    .collect();
                Arc::new(escaped) as arrow_array::ArrayRef
            }
            _ => column.clone(),
        })
        .collect();
    Ok(RecordBatch::try_new(batch.schema(), columns)?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow_array::{Float32Array, Float64Array};

    #[test]
    fn a_table_shows_control_characters_as_escapes() {
        let names = arrow_array::StringArray::from(vec![
            Some("/red\u{1b}[31m"),
            Some("/two\nlines"),
            None,
            Some("/plain"),
            Some("/job\u{202e}71_boj"),
        ]);
        let schema = Arc::new(Schema::new(vec![Field::new("path", DataType::Utf8, true)]));
        let batch = RecordBatch::try_new(schema, vec![Arc::new(names)]).unwrap();
        let shown = controls_escaped(&batch).unwrap();
        let text = arrow_cast::pretty::pretty_format_batches(&[shown])
            .unwrap()
            .to_string();
        assert!(!text.contains('\u{1b}'), "{text}");
        assert!(text.contains("/red\\u{1b}[31m"), "{text}");
        assert!(text.contains("/two\\nlines"), "{text}");
        assert!(text.contains("/plain"), "{text}");
        assert!(text.contains("/job\\u{202e}71_boj"), "{text}");
        // Five rows, a header and three rules: no line broken by a name.
        assert_eq!(text.lines().count(), 9, "{text}");
    }

    fn json_lines(batch: RecordBatch) -> Vec<serde_json::Value> {
        let mut out = Vec::new();
        write_json_lines(&[batch], &mut out).unwrap();
        String::from_utf8(out)
            .unwrap()
            .lines()
            .map(|line| serde_json::from_str(line).unwrap())
            .collect()
    }

    #[test]
    fn json_keeps_nan_and_the_infinities_apart_from_a_missing_value() {
        let finite = [0.1, 1e308, -0.0, 5e-324, 1.0 / 3.0];
        let mut values: Vec<Option<f64>> = finite.iter().copied().map(Some).collect();
        values.extend([
            Some(f64::NAN),
            Some(f64::INFINITY),
            Some(f64::NEG_INFINITY),
            None,
        ]);
        let schema = Arc::new(Schema::new(vec![
            Field::new("value", DataType::Float64, true),
            Field::new("ratio", DataType::Float32, true),
        ]));
        let finite_ratios = [0.1f32, 3e38, -0.0, 1e-45, 1.0 / 3.0];
        let mut ratios: Vec<Option<f32>> = finite_ratios.iter().copied().map(Some).collect();
        ratios.extend([
            Some(f32::NAN),
            Some(f32::INFINITY),
            Some(f32::NEG_INFINITY),
            None,
        ]);
        let batch = RecordBatch::try_new(
            schema,
            vec![
                Arc::new(Float64Array::from(values)),
                Arc::new(Float32Array::from(ratios)),
            ],
        )
        .unwrap();
        let rows = json_lines(batch);
        assert_eq!(rows.len(), 9);
        for ((row, value), ratio) in rows.iter().zip(finite).zip(finite_ratios) {
            let got = row["value"].as_f64().unwrap();
            assert_eq!(got.to_bits(), value.to_bits(), "{row}");
            let got = row["ratio"].as_f64().unwrap() as f32;
            assert_eq!(got.to_bits(), ratio.to_bits(), "{row}");
        }
        for (row, text) in rows[5..8].iter().zip(["NaN", "+Inf", "-Inf"]) {
            assert_eq!(row["value"], text);
            assert_eq!(row["ratio"], text);
        }
        assert!(rows[8].get("value").is_none(), "{}", rows[8]);
    }
}
