//! Parquet files of the store: how they are encoded, published and described.

use std::collections::{BTreeMap, HashMap};
use std::fs::{self, File};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::Arc;

use arrow_array::types::Int32Type;
use arrow_array::{Array, ArrayRef, DictionaryArray, RecordBatch, StringArray};
use arrow_buffer::Buffer;
use arrow_schema::{FieldRef, Schema};
use parquet::arrow::arrow_reader::{
    ArrowReaderMetadata, ArrowReaderOptions, ParquetRecordBatchReader,
    ParquetRecordBatchReaderBuilder,
};
use parquet::arrow::arrow_writer::{
    compute_leaves, ArrowColumnChunk, ArrowColumnWriter, ArrowRowGroupWriterFactory,
};
use parquet::arrow::{add_encoded_arrow_schema_to_metadata, ArrowSchemaConverter, ArrowWriter};
use parquet::basic::{Compression, Encoding, ZstdLevel};
use parquet::file::metadata::{KeyValue, PageIndexPolicy, ParquetMetaData, SortingColumn};
use parquet::file::properties::{EnabledStatistics, WriterProperties};
use parquet::file::reader::{FileReader, SerializedFileReader};
use parquet::file::writer::SerializedFileWriter;
use parquet::schema::types::ColumnPath;

use crate::error::{Error, Result};
use crate::schema::{FieldType, TableDef, SCHEMA_VERSION, TIME_COLUMN};
use crate::wal::sync_dir;
use crate::{date_string, parse_date, HOUR_US};

/// Metadata keys written into every file.
pub mod keys {
    /// Layout version ([`crate::schema::SCHEMA_VERSION`]).
    pub const SCHEMA_VERSION: &str = "vtax.schema_version";
    /// Table name.
    pub const TABLE: &str = "vtax.table";
    /// Node that wrote the file.
    pub const NODE: &str = "vtax.node";
    /// `hour:seq` pairs: per bucket, the highest WAL frame the file holds.
    pub const WATERMARKS: &str = "vtax.watermarks";
    /// Names of the files a compacted file replaces.
    pub const COMPACTED_FROM: &str = "vtax.compacted_from";
    /// Names among `vtax.compacted_from` of multi-hour merges (a day merged
    /// in rounds) whose own inputs are listed there too: their rows are all
    /// in the other names, so an uploader looks past them.
    pub const COMPACTED_INTERMEDIATES: &str = "vtax.compacted_intermediates";
    /// `column=unit` pairs.
    pub const UNITS: &str = "vtax.units";
    /// `<bytes>:<crc32 in hex>`: the CRC-32 of the file's first `bytes` bytes,
    /// its magic and every page, everything before the page index and footer.
    /// Parquet's own page checksums are optional and this writer's library
    /// never writes them; without one a flipped bit in a compressed page can
    /// decode to a wrong value without an error.
    pub const PAGES_CRC32: &str = "vtax.pages_crc32";
}

/// How files are encoded. The defaults are what `docs/benchmarks.md` measured best.
#[derive(Clone, Debug)]
pub struct WriteOptions {
    /// ZSTD level for every column.
    pub zstd_level: i32,
    /// Encoding of the time column.
    pub time_encoding: Encoding,
    /// Whether f64 fields try a dictionary first (good for values that repeat).
    pub float_dictionary: bool,
    /// Encoding of f64 fields when no dictionary is used or it overflows.
    pub float_encoding: Encoding,
    /// Encoding of integer fields.
    pub integer_encoding: Encoding,
    /// Rows per row group. The writer holds one column of a row group's
    /// encoded pages at a time, and a merge plans a row group's order (up to
    /// 8 bytes a row when its inputs interleave row by row).
    pub row_group_rows: usize,
    /// Target bytes per data page (before compression).
    pub data_page_bytes: usize,
    /// Most rows per data page. ZSTD compresses each page on its own, so longer
    /// pages let it find the timestamp sequence every series of a scrape shares.
    pub data_page_rows: usize,
    /// Most rows per data page in a part of an hour still being written. A
    /// read of the last hour opens every part and decompresses a whole page
    /// of each column it reads from each, so these pages are short; the merge
    /// that seals the hour rewrites them at `data_page_rows`.
    pub running_page_rows: usize,
    /// Per column name, an encoding that overrides the ones above (chosen by
    /// [`choose_encodings`] for the data at hand).
    pub column_encodings: BTreeMap<String, Encoding>,
    /// Whether a publish tries the candidate encodings on a sample of its rows
    /// and keeps the smaller per column.
    pub adaptive: bool,
    /// Most bytes of one column a write buffers to choose that column's
    /// encoding on (and copies once more to sample them): a memory bound for
    /// small residents such as the agent, which sets it far below the default.
    pub encoding_sample_bytes: usize,
}

impl Default for WriteOptions {
    /// Measured with `examples/encoding_study.rs` on a real node_exporter recording
    /// and GPU-node-shaped data (figures in `docs/benchmarks.md`).
    fn default() -> Self {
        WriteOptions {
            zstd_level: 3,
            // The better of PLAIN and DELTA depends on the data: a publish tries
            // both (`adaptive`); this is the fallback.
            time_encoding: Encoding::DELTA_BINARY_PACKED,
            // Counters and fine-grained gauges overflow a dictionary; its page also
            // has to be decoded whole by every point read.
            float_dictionary: false,
            float_encoding: Encoding::PLAIN,
            integer_encoding: Encoding::DELTA_BINARY_PACKED,
            row_group_rows: 1 << 20,
            data_page_bytes: 16 << 20,
            // Long pages give ZSTD the context to find what series of one scrape
            // share (timestamps, values of identical series); a point read
            // decompresses a whole page, so 100k rows (250k: p99 21 ms).
            data_page_rows: 100_000,
            running_page_rows: RUNNING_PAGE_ROWS,
            column_encodings: BTreeMap::new(),
            adaptive: true,
            encoding_sample_bytes: ENCODING_SAMPLE_BUFFER_BYTES,
        }
    }
}

/// Whether a publish picks `column`'s encoding by trial: time and f64 fields.
fn has_encoding_trial(table: &TableDef, column: &str) -> bool {
    column == TIME_COLUMN
        || table
            .fields
            .iter()
            .any(|f| f.name == column && f.ty == FieldType::F64)
}

/// The candidate encoding sets a publish tries: for every f64 field and time.
fn candidates() -> [(Encoding, Encoding); 2] {
    // (f64 fields, time)
    [
        (Encoding::PLAIN, Encoding::PLAIN),
        (Encoding::BYTE_STREAM_SPLIT, Encoding::DELTA_BINARY_PACKED),
    ]
}

/// Most bytes of rows a publish buffers to choose its encodings on, by default.
pub const ENCODING_SAMPLE_BUFFER_BYTES: usize = 16 << 20;

/// Rows sampled to choose encodings: slices spread over the sorted batch, so
/// every kind of series (they sort by name) is represented.
const SAMPLE_SLICES: usize = 16;
const SAMPLE_SLICE_ROWS: usize = 16_384;

/// Per column, the smaller of the candidate encodings on a sample of `batch`.
/// PLAIN suits series that repeat or move by scrape-shaped steps, BYTE_STREAM_SPLIT
/// fine-grained floats; which wins depends on the data (see `docs/benchmarks.md`).
pub fn choose_encodings(
    table: &TableDef,
    batch: &RecordBatch,
    options: &WriteOptions,
) -> Result<BTreeMap<String, Encoding>> {
    let rows = batch.num_rows();
    let slice_rows = SAMPLE_SLICE_ROWS.min(rows.div_ceil(SAMPLE_SLICES).max(1));
    let stride = (rows / SAMPLE_SLICES).max(slice_rows);
    let slices: Vec<RecordBatch> = (0..rows)
        .step_by(stride)
        .map(|start| batch.slice(start, slice_rows.min(rows - start)))
        .collect();
    let mut best: BTreeMap<String, (u64, Encoding)> = BTreeMap::new();
    for (float_encoding, time_encoding) in candidates() {
        let mut trial = options.clone();
        trial.adaptive = false;
        trial.column_encodings.clear();
        trial.float_encoding = float_encoding;
        trial.time_encoding = time_encoding;
        let props = trial.properties(table, Vec::new())?;
        let mut bytes = Vec::new();
        let parquet_err = |source| Error::Parquet {
            path: PathBuf::from("<encoding trial>"),
            source,
        };
        let mut writer =
            ArrowWriter::try_new(&mut bytes, batch.schema(), Some(props)).map_err(parquet_err)?;
        for slice in &slices {
            writer.write(slice).map_err(parquet_err)?;
        }
        let meta = writer.close().map_err(parquet_err)?;
        for rg in meta.row_groups() {
            for column in rg.columns() {
                let name = column.column_path().string();
                if !has_encoding_trial(table, &name) {
                    continue;
                }
                let encoding = if name == TIME_COLUMN {
                    time_encoding
                } else {
                    float_encoding
                };
                let size = column.compressed_size() as u64;
                best.entry(name)
                    .and_modify(|(s, e)| {
                        if size < *s {
                            *s = size;
                            *e = encoding;
                        }
                    })
                    .or_insert((size, encoding));
            }
        }
    }
    Ok(best.into_iter().map(|(k, (_, e))| (k, e)).collect())
}

/// Default [`WriteOptions::running_page_rows`].
pub const RUNNING_PAGE_ROWS: usize = 8 * 1024;

impl WriteOptions {
    /// These options for a part of the hour still being written: pages of at
    /// most `running_page_rows`.
    pub fn for_running_hour(&self) -> WriteOptions {
        WriteOptions {
            data_page_rows: self.running_page_rows.min(self.data_page_rows),
            ..self.clone()
        }
    }

    /// The Parquet writer properties for `table`.
    pub fn properties(
        &self,
        table: &TableDef,
        metadata: Vec<KeyValue>,
    ) -> Result<WriterProperties> {
        let level = ZstdLevel::try_new(self.zstd_level)
            .map_err(|e| Error::Schema(format!("zstd level {}: {e}", self.zstd_level)))?;
        let mut props = WriterProperties::builder()
            .set_compression(Compression::ZSTD(level))
            .set_statistics_enabled(EnabledStatistics::Page)
            .set_max_row_group_row_count(Some(self.row_group_rows))
            .set_data_page_size_limit(self.data_page_bytes)
            .set_data_page_row_count_limit(self.data_page_rows)
            .set_created_by(format!("vtax {}", env!("CARGO_PKG_VERSION")))
            .set_key_value_metadata(Some(metadata));
        let chosen = |name: &str, default: Encoding| {
            self.column_encodings.get(name).copied().unwrap_or(default)
        };
        let time = ColumnPath::from(TIME_COLUMN);
        props = props.set_column_dictionary_enabled(time.clone(), false);
        let time_encoding = chosen(TIME_COLUMN, self.time_encoding);
        if time_encoding != Encoding::PLAIN {
            props = props.set_column_encoding(time, time_encoding);
        }
        let mut sorting = Vec::new();
        for (i, tag) in table.tags.iter().enumerate() {
            props = props.set_column_dictionary_enabled(ColumnPath::from(tag.name), true);
            sorting.push(SortingColumn {
                column_idx: (i + 1) as i32,
                descending: false,
                nulls_first: false,
            });
        }
        sorting.push(SortingColumn {
            column_idx: 0,
            descending: false,
            nulls_first: false,
        });
        props = props.set_sorting_columns(Some(sorting));
        for field in table.fields {
            let path = ColumnPath::from(field.name);
            let (dictionary, encoding) = match field.ty {
                FieldType::F64 if self.column_encodings.contains_key(field.name) => {
                    (false, chosen(field.name, self.float_encoding))
                }
                FieldType::F64 => (self.float_dictionary, self.float_encoding),
                FieldType::I64 | FieldType::U64 => (false, self.integer_encoding),
            };
            props = props.set_column_dictionary_enabled(path.clone(), dictionary);
            if encoding != Encoding::PLAIN {
                props = props.set_column_encoding(path, encoding);
            }
        }
        Ok(props.build())
    }
}

/// What the store knows about one published file, from its name and footer.
#[derive(Clone, Debug)]
pub struct FileInfo {
    /// Full path.
    pub path: PathBuf,
    /// Table.
    pub table: String,
    /// Day number of its partition.
    pub day: i64,
    /// Node that wrote it (`vtax.node`).
    pub node: String,
    /// Bytes on disk.
    pub bytes: u64,
    /// Rows.
    pub rows: u64,
    /// Per bucket hour: highest WAL frame held.
    pub watermarks: BTreeMap<i64, u64>,
    /// File names this file replaces (compaction): the files it merged and,
    /// for those that were multi-hour merges themselves, the files they merged.
    pub compacted_from: Vec<String>,
    /// The names in `compacted_from` whose rows are all in the other names
    /// (`vtax.compacted_intermediates`).
    pub compacted_intermediates: Vec<String>,
    /// Smallest and largest time in the file, from its statistics.
    pub time_range_us: Option<(i64, i64)>,
    /// Bytes from the start that `vtax.pages_crc32` covers, and their CRC-32;
    /// none in files written before it was recorded.
    pub pages_crc32: Option<(u64, u32)>,
}

impl FileInfo {
    /// The file's name within its partition.
    pub fn name(&self) -> &str {
        self.path.file_name().and_then(|n| n.to_str()).unwrap_or("")
    }

    /// Whether the file is a merged file under its pending name
    /// ([`pending_name`]): its merge was interrupted before it was published.
    pub fn is_pending(&self) -> bool {
        published_name(self.name()).is_some()
    }

    /// Whether the file will not change any more, as far as the files tell:
    /// every hour it holds ended at least `settle_us` before `now_us`, and, when
    /// it holds one hour, no other file of its partition (`partition`, which may
    /// include the file itself) holds only that hour, since such parts are still
    /// to be merged into one. Rows a writer still buffers are invisible here, so
    /// `settle_us` should exceed the writer's publish grace. Even then a late row
    /// (WAL replay after a long stop) can make the writer merge a sealed file
    /// into a new one, which lists it in `vtax.compacted_from`.
    pub fn is_sealed(&self, partition: &[FileInfo], now_us: i64, settle_us: i64) -> bool {
        let Some(&last_hour) = self.watermarks.keys().next_back() else {
            return false;
        };
        if (last_hour + 1) * HOUR_US + settle_us > now_us {
            return false;
        }
        if self.watermarks.len() > 1 {
            return true;
        }
        !partition.iter().any(|other| {
            other.path != self.path
                && other.watermarks.len() == 1
                && other.watermarks.contains_key(&last_hour)
        })
    }
}

/// The published files of a store, as a glob of `*.parquet` sees them and
/// without its lock: files that a published merged file replaces are left
/// out, and so are files that vanish or fail to read while being listed (a
/// writer merging them away or quarantining them at that moment). A merged
/// file still under its pending name is not among them, and the inputs it
/// has not yet deleted are: they are what a glob reads until it is published.
pub fn live_files(data_dir: &Path) -> Result<Vec<FileInfo>> {
    let (mut listed, _) = list_files(data_dir)?;
    listed.retain(|f| !f.pending);
    let index = index_files(listed, |_, _| Ok(()))?;
    Ok(index.live.into_values().flatten().collect())
}

/// Ending of a merged file's name while its merge commits, after the
/// published name: see [`pending_name`].
const PENDING_SUFFIX: &str = ".pending";

/// The name a merged file is written under until its inputs are deleted,
/// `.<name>.pending` for the published `<name>`: hidden, and not ending in
/// `.parquet`. The documented globs (`*.parquet`, `**/*.parquet`) never match
/// it, and readers of a whole directory (pyarrow's and pandas' datasets,
/// Spark) pass over hidden files, so the same rows are never read both from
/// it and from its inputs. Renamed to `<name>` once every input is deleted.
pub fn pending_name(name: &str) -> String {
    format!(".{name}{PENDING_SUFFIX}")
}

/// The published name of a pending file's name ([`pending_name`]); `None`
/// for any other name.
pub fn published_name(name: &str) -> Option<&str> {
    name.strip_prefix('.')?
        .strip_suffix(PENDING_SUFFIX)
        .filter(|n| n.ends_with(".parquet") && !n.starts_with('.'))
}

/// Publishes a merged file written under its pending name ([`pending_name`]),
/// once its inputs are deleted: renames it to its published name and fsyncs
/// the directory. Returns its new path.
pub(crate) fn publish_pending(path: &Path) -> Result<PathBuf> {
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
    let Some(published) = published_name(name) else {
        return Err(Error::Corrupt {
            path: path.to_owned(),
            reason: "not the name of a pending merged file".into(),
        });
    };
    let target = path.with_file_name(published);
    fs::rename(path, &target).map_err(Error::io("rename", path))?;
    if let Some(dir) = target.parent() {
        sync_dir(dir)?;
    }
    Ok(target)
}

/// Directory of a table's partition for `day`.
pub fn partition_dir(data_dir: &Path, table: &str, day: i64) -> PathBuf {
    data_dir
        .join("tables")
        .join(table)
        .join(format!("date={}", date_string(day)))
}

/// Rows for [`publish`], handed out a row group at a time and, within it, a
/// column at a time. The writer then holds one column's pages, and a merge
/// one column of each input, never every column of every input at once: with
/// ZSTD each open column costs a (de)compression context and a page buffer,
/// which for a merge of a few dozen-column files came to tens of megabytes.
pub trait ColumnSource {
    /// Starts the next row group of at most `max_rows` rows and returns its
    /// row count; 0 when every row has been handed out.
    fn next_row_group(&mut self, max_rows: usize) -> Result<usize>;

    /// Passes the current row group's values of `column` (an index into the
    /// table's Arrow schema) to `sink` in order, in chunks.
    fn column(&mut self, column: usize, sink: &mut dyn FnMut(ArrayRef) -> Result<()>)
        -> Result<()>;
}

/// Where [`publish`] puts a file once it is written.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PublishAs {
    /// Under its published name, `<name>.parquet`, read by every reader.
    Published,
    /// Under its pending name ([`pending_name`]): a merged file, read by the
    /// store's readers in place of its inputs, and by a glob only once
    /// [`publish_pending`] renames it after the inputs are deleted.
    Pending,
}

/// Writes the rows from `source` (sorted by tags then time, `first_time` the
/// smallest time) as a new file in its partition, atomically: temp file, fsync,
/// rename (to its published or its pending name, as `publish_as` says), fsync
/// the directory. On any error the temp file is removed and nothing is
/// published. The name avoids existing files, published or pending, and any
/// for which `taken` says yes.
#[allow(clippy::too_many_arguments)]
pub fn publish(
    data_dir: &Path,
    node: &str,
    table: &TableDef,
    first_time: i64,
    source: &mut dyn ColumnSource,
    watermarks: &BTreeMap<i64, u64>,
    compacted_from: &[String],
    compacted_intermediates: &[String],
    options: &WriteOptions,
    taken: &dyn Fn(&str) -> bool,
    publish_as: PublishAs,
) -> Result<FileInfo> {
    let day = first_time.div_euclid(crate::DAY_US);
    let dir = partition_dir(data_dir, table.name, day);
    fs::create_dir_all(&dir).map_err(Error::io("create", &dir))?;
    let max_seq = watermarks.values().copied().max().unwrap_or(0);
    // A merge can start and end where one of its inputs does: never reuse a name.
    let mut name = format!("{node}-{first_time}-{max_seq}.parquet");
    let mut n = 1;
    while dir.join(&name).exists() || dir.join(pending_name(&name)).exists() || taken(&name) {
        name = format!("{node}-{first_time}-{max_seq}-{n}.parquet");
        n += 1;
    }
    let path = match publish_as {
        PublishAs::Published => dir.join(&name),
        PublishAs::Pending => dir.join(pending_name(&name)),
    };
    let tmp = dir.join(format!(".{name}.tmp"));

    let mut metadata = vec![
        KeyValue::new(keys::SCHEMA_VERSION.into(), SCHEMA_VERSION.to_string()),
        KeyValue::new(keys::TABLE.into(), table.name.to_string()),
        KeyValue::new(keys::NODE.into(), node.to_string()),
        KeyValue::new(keys::WATERMARKS.into(), format_watermarks(watermarks)),
        KeyValue::new(
            keys::UNITS.into(),
            table
                .fields
                .iter()
                .filter_map(|f| f.unit.suffix().map(|u| format!("{}={u}", f.name)))
                .collect::<Vec<_>>()
                .join(","),
        ),
    ];
    if !compacted_from.is_empty() {
        metadata.push(KeyValue::new(
            keys::COMPACTED_FROM.into(),
            compacted_from.join(","),
        ));
    }
    if !compacted_intermediates.is_empty() {
        metadata.push(KeyValue::new(
            keys::COMPACTED_INTERMEDIATES.into(),
            compacted_intermediates.join(","),
        ));
    }
    let mut rows = 0u64;
    let mut last_time = first_time;
    let write = || -> Result<(u64, (u64, u32))> {
        let parquet_err = |source| Error::Parquet {
            path: tmp.clone(),
            source,
        };
        let schema = table.arrow_schema();
        let mut file_props = options.properties(table, metadata)?;
        add_encoded_arrow_schema_to_metadata(&schema, &mut file_props);
        let parquet_schema = ArrowSchemaConverter::new()
            .convert(&schema)
            .map_err(parquet_err)?;
        let file = File::create(&tmp).map_err(Error::io("create", &tmp))?;
        let file = Checksummed::new(file);
        let mut writer =
            SerializedFileWriter::new(file, parquet_schema.root_schema_ptr(), Arc::new(file_props))
                .map_err(parquet_err)?;
        // Each column's properties, fixed by its first row group (where
        // `adaptive` picks its encoding from the rows being written: a merge's
        // long per-series runs compress differently from the parts it reads).
        let mut column_props: Vec<Option<Arc<WriterProperties>>> =
            vec![None; schema.fields().len()];
        let mut row_group = 0;
        loop {
            let group_rows = source.next_row_group(options.row_group_rows.max(1))?;
            if group_rows == 0 {
                break;
            }
            let mut group = writer.next_row_group().map_err(parquet_err)?;
            for (c, field) in schema.fields().iter().enumerate() {
                let mut column = ColumnWrite {
                    table,
                    options,
                    field,
                    row_group,
                    props: column_props[c].clone(),
                    writer: None,
                    head: Vec::new(),
                    head_bytes: 0,
                    rows: 0,
                };
                source.column(c, &mut |array| {
                    if c == 0 {
                        last_time = last_time.max(max_time(&array).unwrap_or(last_time));
                    }
                    column.push(array)
                })?;
                if column.rows != group_rows {
                    return Err(Error::Schema(format!(
                        "column {} of a row group has {} rows, not {group_rows}",
                        field.name(),
                        column.rows
                    )));
                }
                let (props, chunk) = column.finish()?;
                column_props[c] = Some(props);
                chunk.append_to_row_group(&mut group).map_err(parquet_err)?;
            }
            group.close().map_err(parquet_err)?;
            rows += group_rows as u64;
            row_group += 1;
        }
        if rows == 0 {
            return Err(Error::Schema("publishing an empty file".into()));
        }
        // Every page is out of the writer's buffer now; the page index and
        // the footer, which holds the sum, come after.
        writer.flush().map_err(Error::io("write", &tmp))?;
        let pages_crc32 = writer.inner().sum();
        debug_assert_eq!(pages_crc32.0, writer.bytes_written() as u64);
        writer.append_key_value_metadata(KeyValue::new(
            keys::PAGES_CRC32.into(),
            format!("{}:{:08x}", pages_crc32.0, pages_crc32.1),
        ));
        let file = writer.into_inner().map_err(parquet_err)?.into_inner();
        file.sync_all().map_err(Error::io("fsync", &tmp))?;
        let bytes = file.metadata().map_err(Error::io("stat", &tmp))?.len();
        Ok((bytes, pages_crc32))
    };
    let (bytes, pages_crc32) = match write() {
        Ok(written) => written,
        Err(e) => {
            let _ = fs::remove_file(&tmp);
            return Err(e);
        }
    };
    if let Err(e) = fs::rename(&tmp, &path) {
        let _ = fs::remove_file(&tmp);
        return Err(Error::io("rename", &path)(e));
    }
    sync_dir(&dir)?;
    Ok(FileInfo {
        path,
        table: table.name.to_string(),
        day,
        node: node.to_string(),
        bytes,
        rows,
        watermarks: watermarks.clone(),
        compacted_from: compacted_from.to_vec(),
        compacted_intermediates: compacted_intermediates.to_vec(),
        time_range_us: Some((first_time, last_time)),
        pages_crc32: Some(pages_crc32),
    })
}

/// A file being written, keeping the CRC-32 of what went through it.
struct Checksummed {
    file: File,
    crc: crc32fast::Hasher,
    bytes: u64,
}

impl Checksummed {
    fn new(file: File) -> Self {
        Checksummed {
            file,
            crc: crc32fast::Hasher::new(),
            bytes: 0,
        }
    }

    /// Bytes written so far and their CRC-32.
    fn sum(&self) -> (u64, u32) {
        (self.bytes, self.crc.clone().finalize())
    }

    fn into_inner(self) -> File {
        self.file
    }
}

impl std::io::Write for Checksummed {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.file.write(buf)?;
        self.crc.update(&buf[..n]);
        self.bytes += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.file.flush()
    }
}

/// Checks the file at `path` against its `vtax.pages_crc32`: reads the bytes
/// it covers again and sums them.
pub(crate) fn check_pages_crc32(path: &Path, sum: (u64, u32)) -> Result<()> {
    let file = File::open(path).map_err(Error::io("open", path))?;
    check_pages_crc32_of(&file, path, sum)
}

/// [`check_pages_crc32`] on a file already open (a reader keeps each file
/// open from its footer to its rows, so a merge that removes it meanwhile
/// does not fail the check). Reads at offsets: the handle's position, which
/// its clones share, is left alone.
pub(crate) fn check_pages_crc32_of(
    file: &File,
    path: &Path,
    (bytes, crc): (u64, u32),
) -> Result<()> {
    use std::os::unix::fs::FileExt;
    let mut hasher = crc32fast::Hasher::new();
    let mut buffer = vec![0u8; 256 << 10];
    let mut read = 0u64;
    while read < bytes {
        let want = buffer.len().min((bytes - read) as usize);
        let n = file
            .read_at(&mut buffer[..want], read)
            .map_err(Error::io("read", path))?;
        if n == 0 {
            break;
        }
        hasher.update(&buffer[..n]);
        read += n as u64;
    }
    let found = hasher.finalize();
    if read != bytes || found != crc {
        return Err(Error::Corrupt {
            path: path.to_owned(),
            reason: format!(
                "its first {bytes} bytes (magic and pages) sum to CRC-32 {found:08x} over \
                 {read} bytes read, not the {crc:08x} written: a byte changed since"
            ),
        });
    }
    Ok(())
}

/// One column of one row group being encoded. In a file's first row group a
/// column whose encoding is chosen by trial buffers up to
/// [`WriteOptions::encoding_sample_bytes`] of values to try the candidates on.
struct ColumnWrite<'a> {
    table: &'a TableDef,
    options: &'a WriteOptions,
    field: &'a FieldRef,
    row_group: usize,
    props: Option<Arc<WriterProperties>>,
    writer: Option<ArrowColumnWriter>,
    head: Vec<ArrayRef>,
    head_bytes: usize,
    rows: usize,
}

impl ColumnWrite<'_> {
    fn push(&mut self, array: ArrayRef) -> Result<()> {
        let array = with_readable_string_bytes(array);
        self.rows += array.len();
        if let Some(writer) = &mut self.writer {
            return write_leaves(writer, self.field, &array);
        }
        self.head_bytes += array.get_array_memory_size();
        self.head.push(array);
        if !self.is_trial_candidate() || self.head_bytes >= self.options.encoding_sample_bytes {
            self.start()?;
        }
        Ok(())
    }

    /// Whether this column's encoding is picked by trial in this row group.
    fn is_trial_candidate(&self) -> bool {
        self.options.adaptive
            && self.props.is_none()
            && has_encoding_trial(self.table, self.field.name())
    }

    /// Settles the column's properties and writes the buffered values.
    fn start(&mut self) -> Result<()> {
        let props = match &self.props {
            Some(props) => props.clone(),
            None => {
                let mut options = self.options.clone();
                if self.is_trial_candidate() && !self.head.is_empty() {
                    let heads: Vec<&dyn Array> = self.head.iter().map(|a| a.as_ref()).collect();
                    let sample = arrow_select::concat::concat(&heads)?;
                    let schema = Arc::new(Schema::new(vec![self.field.as_ref().clone()]));
                    let batch = RecordBatch::try_new(schema, vec![sample])?;
                    options.column_encodings = choose_encodings(self.table, &batch, &options)?;
                }
                Arc::new(options.properties(self.table, Vec::new())?)
            }
        };
        let mut writer = column_writer(self.field, props.clone(), self.row_group)?;
        for array in std::mem::take(&mut self.head) {
            write_leaves(&mut writer, self.field, &array)?;
        }
        self.head_bytes = 0;
        self.props = Some(props);
        self.writer = Some(writer);
        Ok(())
    }

    fn finish(mut self) -> Result<(Arc<WriterProperties>, ArrowColumnChunk)> {
        if self.writer.is_none() {
            self.start()?;
        }
        let chunk = self
            .writer
            .take()
            .expect("started")
            .close()
            .map_err(parquet_in_memory)?;
        Ok((self.props.take().expect("started"), chunk))
    }
}

fn parquet_in_memory(source: parquet::errors::ParquetError) -> Error {
    Error::Parquet {
        path: PathBuf::from("<column being encoded>"),
        source,
    }
}

/// `array` with its strings' bytes in allocated memory.
///
/// A string array whose strings are all empty (a tag nobody set, like
/// `scraped`'s `target` on imports) has no bytes, and Arrow points its empty
/// buffer at a dangling address. Parquet compares every row's string for the
/// page statistics, and glibc's AVX-512 `memcmp` of zero bytes at a dangling
/// address takes a microcode assist each time: 1.15 M rows of one such column
/// took 310 ms to write, against 20 ms for a column of real labels.
fn with_readable_string_bytes(array: ArrayRef) -> ArrayRef {
    fn readable(strings: &StringArray) -> Option<StringArray> {
        if !strings.values().is_empty() {
            return None;
        }
        let (offsets, _, nulls) = strings.clone().into_parts();
        Some(StringArray::new(
            offsets,
            Buffer::from(vec![0u8; 64]),
            nulls,
        ))
    }
    if let Some(strings) = array.as_any().downcast_ref::<StringArray>() {
        return readable(strings).map_or(array, |s| Arc::new(s) as ArrayRef);
    }
    if let Some(dictionary) = array.as_any().downcast_ref::<DictionaryArray<Int32Type>>() {
        if let Some(values) = dictionary
            .values()
            .as_any()
            .downcast_ref::<StringArray>()
            .and_then(readable)
        {
            return Arc::new(dictionary.with_values(Arc::new(values)));
        }
    }
    array
}

fn write_leaves(writer: &mut ArrowColumnWriter, field: &FieldRef, array: &ArrayRef) -> Result<()> {
    for leaf in compute_leaves(field, array).map_err(parquet_in_memory)? {
        writer.write(&leaf).map_err(parquet_in_memory)?;
    }
    Ok(())
}

/// A writer for one column with its own properties. Parquet's factory makes a
/// writer, with its codec, for every column of a schema at once; a one-column
/// schema makes just this one. The chunk it produces describes a column equal
/// to the file's column of that name, so the file's row group accepts it.
fn column_writer(
    field: &FieldRef,
    props: Arc<WriterProperties>,
    row_group: usize,
) -> Result<ArrowColumnWriter> {
    let schema = Arc::new(Schema::new(vec![field.as_ref().clone()]));
    let parquet_schema = ArrowSchemaConverter::new()
        .convert(&schema)
        .map_err(parquet_in_memory)?;
    let scratch =
        SerializedFileWriter::new(std::io::sink(), parquet_schema.root_schema_ptr(), props)
            .map_err(parquet_in_memory)?;
    let mut writers = ArrowRowGroupWriterFactory::new(&scratch, schema)
        .create_column_writers(row_group)
        .map_err(parquet_in_memory)?;
    Ok(writers.pop().expect("one column"))
}

fn max_time(times: &ArrayRef) -> Option<i64> {
    times
        .as_any()
        .downcast_ref::<arrow_array::TimestampMicrosecondArray>()?
        .values()
        .iter()
        .copied()
        .max()
}

fn format_watermarks(watermarks: &BTreeMap<i64, u64>) -> String {
    watermarks
        .iter()
        .map(|(hour, seq)| format!("{hour}:{seq}"))
        .collect::<Vec<_>>()
        .join(",")
}

fn parse_watermarks(text: &str) -> Option<BTreeMap<i64, u64>> {
    let mut out = BTreeMap::new();
    for pair in text.split(',').filter(|p| !p.is_empty()) {
        let (hour, seq) = pair.split_once(':')?;
        out.insert(hour.parse().ok()?, seq.parse().ok()?);
    }
    Some(out)
}

/// Reads a file's footer and checks that it is a file of `table` in partition `day`.
pub fn read_info(path: &Path, table: &str, day: i64) -> Result<FileInfo> {
    let file = File::open(path).map_err(Error::io("open", path))?;
    read_info_of(file, path, table, day)
}

fn read_info_of(file: File, path: &Path, table: &str, day: i64) -> Result<FileInfo> {
    let corrupt = |reason: String| Error::Corrupt {
        path: path.to_owned(),
        reason,
    };
    let bytes = file.metadata().map_err(Error::io("stat", path))?.len();
    let reader = SerializedFileReader::new(file).map_err(|e| corrupt(e.to_string()))?;
    let meta = reader.metadata();
    check_layout(meta, bytes).map_err(corrupt)?;
    let kv: BTreeMap<&str, &str> = meta
        .file_metadata()
        .key_value_metadata()
        .map(|kvs| {
            kvs.iter()
                .filter_map(|kv| Some((kv.key.as_str(), kv.value.as_deref()?)))
                .collect()
        })
        .unwrap_or_default();
    if kv.get(keys::TABLE).copied() != Some(table) {
        return Err(corrupt(format!("not a file of table {table}")));
    }
    let watermarks = kv
        .get(keys::WATERMARKS)
        .and_then(|w| parse_watermarks(w))
        .ok_or_else(|| corrupt("missing or bad watermarks".into()))?;
    if watermarks
        .keys()
        .any(|hour| (hour * HOUR_US).div_euclid(crate::DAY_US) != day)
    {
        return Err(corrupt("holds hours outside its date partition".into()));
    }
    let node = kv
        .get(keys::NODE)
        .ok_or_else(|| corrupt("missing node".into()))?
        .to_string();
    let names = |key: &str| -> Vec<String> {
        kv.get(key)
            .map(|s| s.split(',').map(str::to_owned).collect())
            .unwrap_or_default()
    };
    let compacted_from = names(keys::COMPACTED_FROM);
    let compacted_intermediates = names(keys::COMPACTED_INTERMEDIATES);
    let mut time_range_us: Option<(i64, i64)> = None;
    for rg in meta.row_groups() {
        if let Some(parquet::file::statistics::Statistics::Int64(s)) = rg.column(0).statistics() {
            if let (Some(&lo), Some(&hi)) = (s.min_opt(), s.max_opt()) {
                time_range_us = Some(match time_range_us {
                    None => (lo, hi),
                    Some((a, b)) => (a.min(lo), b.max(hi)),
                });
            }
        }
    }
    let pages_crc32 = match kv.get(keys::PAGES_CRC32) {
        None => None,
        Some(text) => Some(
            text.split_once(':')
                .and_then(|(n, crc)| Some((n.parse().ok()?, u32::from_str_radix(crc, 16).ok()?)))
                .filter(|&(n, _)| n <= bytes)
                .ok_or_else(|| corrupt(format!("bad {}: {text:?}", keys::PAGES_CRC32)))?,
        ),
    };
    Ok(FileInfo {
        path: path.to_owned(),
        table: table.to_owned(),
        day,
        node,
        bytes,
        rows: meta.file_metadata().num_rows() as u64,
        watermarks,
        compacted_from,
        compacted_intermediates,
        time_range_us,
        pages_crc32,
    })
}

/// A file in the tables tree, before its footer is read.
pub(crate) struct Listed {
    pub path: PathBuf,
    pub table: String,
    pub day: i64,
    /// A merged file under its pending name ([`pending_name`]).
    pub pending: bool,
}

/// Lists published and pending files (and, separately, strays: temp files,
/// and pending files whose published twin is there too).
pub(crate) fn list_files(data_dir: &Path) -> Result<(Vec<Listed>, Vec<PathBuf>)> {
    list_node_files(data_dir, None)
}

/// Lists published and pending files of one node's store, or with `node`, of
/// that node in a fleet copy (`tables/<table>/node=<node>/date=.../`). The
/// strays, returned apart, are what no reader reads and an open removes:
/// temp files of a publish that did not finish, and a pending file listed
/// beside its own published name (renamed while the directory was read, or
/// copied so by a tool): one file, read under its published name.
pub(crate) fn list_node_files(
    data_dir: &Path,
    node: Option<&str>,
) -> Result<(Vec<Listed>, Vec<PathBuf>)> {
    let mut files = Vec::new();
    let mut temps = Vec::new();
    let tables = data_dir.join("tables");
    let read = |dir: &Path| -> Result<Vec<fs::DirEntry>> {
        match fs::read_dir(dir) {
            Ok(entries) => entries
                .collect::<std::io::Result<Vec<_>>>()
                .map_err(Error::io("list", dir)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Vec::new()),
            Err(e) => Err(Error::io("list", dir)(e)),
        }
    };
    for table in read(&tables)? {
        let Some(table_name) = table.file_name().to_str().map(str::to_owned) else {
            continue;
        };
        let table_dir = match node {
            Some(node) => table.path().join(format!("node={node}")),
            None => table.path(),
        };
        for part in read(&table_dir)? {
            let name = part.file_name();
            let Some(day) = name
                .to_str()
                .and_then(|n| n.strip_prefix("date="))
                .and_then(parse_date)
            else {
                continue;
            };
            let mut names = Vec::new();
            for file in read(&part.path())? {
                if let Ok(name) = file.file_name().into_string() {
                    names.push((name, file.path()));
                }
            }
            let published: std::collections::HashSet<&str> = names
                .iter()
                .map(|(name, _)| name.as_str())
                .filter(|name| name.ends_with(".parquet"))
                .collect();
            for (name, path) in &names {
                let pending = published_name(name);
                if name.ends_with(".tmp") || pending.is_some_and(|p| published.contains(p)) {
                    temps.push(path.clone());
                } else if pending.is_some() || name.ends_with(".parquet") {
                    files.push(Listed {
                        path: path.clone(),
                        table: table_name.clone(),
                        day,
                        pending: pending.is_some(),
                    });
                }
            }
        }
    }
    files.sort_by(|a, b| a.path.cmp(&b.path));
    Ok((files, temps))
}

/// The node that wrote a store, as its newest file's footer (`vtax.node`)
/// names it, for commands that write beside the agent (`vtax compact`) and
/// readers that label a store. `None` for a store without readable files.
///
/// The newest file is the one last written (modification time): file names
/// are `<node>-<first_time_us>-<max_seq>[-<n>].parquet`, and since a node
/// name may hold '-' and end in digits (`gpu-node-17`), a name alone does not
/// say where the node ends, so the footer says which node wrote it.
pub fn node_of_store(data_dir: &Path) -> Result<Option<String>> {
    let (files, _) = list_files(data_dir)?;
    let mut newest: Vec<(std::time::SystemTime, &Listed)> = files
        .iter()
        .filter_map(|f| Some((f.path.metadata().ok()?.modified().ok()?, f)))
        .collect();
    newest.sort_by(|a, b| b.0.cmp(&a.0).then_with(|| b.1.path.cmp(&a.1.path)));
    // A file merged away or damaged since the listing: the next newest says.
    Ok(newest
        .into_iter()
        .find_map(|(_, f)| read_info(&f.path, &f.table, f.day).ok())
        .map(|info| info.node))
}

/// Live files by partition (table, day), and the files that a merged file
/// in the same partition replaces, set aside: those are an interrupted merge's
/// inputs, which a writer deletes and a reader ignores. A merged file under
/// its pending name is live: it holds every row of its inputs, which it
/// replaces from the moment it is there (a glob reads the inputs until it is
/// published, and never both).
pub(crate) struct FileIndex {
    pub live: BTreeMap<(String, i64), Vec<FileInfo>>,
    pub replaced: Vec<FileInfo>,
}

/// Reads the footer of every listed file into a [`FileIndex`]. A file whose
/// footer fails goes to `on_unreadable`, which decides what becomes of it.
pub(crate) fn index_files(
    listed: Vec<Listed>,
    on_unreadable: impl FnMut(&Listed, Error) -> Result<()>,
) -> Result<FileIndex> {
    Ok(index_files_kept(listed, 0, on_unreadable)?.0)
}

/// [`index_files`], and the first `keep_open` files read stay open: a reader
/// beside a writer then reads them even if a merge removes them meanwhile.
pub(crate) fn index_files_kept(
    listed: Vec<Listed>,
    keep_open: usize,
    mut on_unreadable: impl FnMut(&Listed, Error) -> Result<()>,
) -> Result<(FileIndex, HashMap<PathBuf, File>)> {
    let mut infos = Vec::new();
    let mut kept = HashMap::new();
    for file in listed {
        let opened = File::open(&file.path)
            .map_err(Error::io("open", &file.path))
            .and_then(|f| {
                if kept.len() < keep_open {
                    let copy = f.try_clone().map_err(Error::io("open", &file.path))?;
                    kept.insert(file.path.clone(), copy);
                }
                read_info_of(f, &file.path, &file.table, file.day)
            });
        match opened {
            Ok(info) => infos.push(info),
            Err(e) => {
                kept.remove(&file.path);
                on_unreadable(&file, e)?
            }
        }
    }
    let replaced_names: std::collections::HashSet<(String, i64, String)> = infos
        .iter()
        .flat_map(|f| {
            f.compacted_from
                .iter()
                .map(|name| (f.table.clone(), f.day, name.clone()))
        })
        .collect();
    let mut index = FileIndex {
        live: BTreeMap::new(),
        replaced: Vec::new(),
    };
    for info in infos {
        let name = info.path.file_name().and_then(|n| n.to_str()).unwrap_or("");
        if replaced_names.contains(&(info.table.clone(), info.day, name.to_owned())) {
            index.replaced.push(info);
        } else {
            index
                .live
                .entry((info.table.clone(), info.day))
                .or_default()
                .push(info);
        }
    }
    Ok((index, kept))
}

/// Checks that a file's metadata describes a layout that fits the file: every
/// column chunk inside its `file_bytes`, and, where the page index was read,
/// every page inside its column chunk, in order, with a page of statistics
/// for each. The Parquet reader trusts these numbers and panics on some
/// nonsense ones (a negative offset, a page before its chunk), so a file whose
/// footer decoded but was damaged must be caught here, with its reason.
pub fn check_layout(meta: &ParquetMetaData, file_bytes: u64) -> std::result::Result<(), String> {
    // Pages lie after the leading magic and before the footer's length and magic.
    let data_end = file_bytes.saturating_sub(8) as i64;
    let page_index = meta.page_index();
    let mut rows_in_groups: i64 = 0;
    for (g, rg) in meta.row_groups().iter().enumerate() {
        if rg.num_rows() < 0 {
            return Err(format!("row group {g} has {} rows", rg.num_rows()));
        }
        rows_in_groups = rows_in_groups.saturating_add(rg.num_rows());
        for (c, chunk) in rg.columns().iter().enumerate() {
            let at = || format!("row group {g}, column {c}");
            let data = chunk.data_page_offset();
            let start = chunk.dictionary_page_offset().unwrap_or(data);
            let len = chunk.compressed_size();
            let end = start.checked_add(len).unwrap_or(i64::MAX);
            if start < 4 || len < 0 || data < start || data >= end || end > data_end {
                return Err(format!(
                    "{}: bytes {start}..{end} (data pages from {data}) do not fit the \
                     file's {file_bytes} bytes",
                    at()
                ));
            }
            if chunk.num_values() < 0 {
                return Err(format!("{}: {} values", at(), chunk.num_values()));
            }
            let Some(index) = page_index else { continue };
            let offsets = index.offset_index(g, c);
            if let Some(offsets) = offsets {
                let mut next_byte = data;
                let mut next_row = 0;
                for (p, page) in offsets.page_locations().iter().enumerate() {
                    let page_end = page
                        .offset
                        .saturating_add(i64::from(page.compressed_page_size));
                    let first_row_fits = if p == 0 {
                        page.first_row_index == 0
                    } else {
                        page.first_row_index >= next_row && page.first_row_index < rg.num_rows()
                    };
                    if page.offset < next_byte
                        || page.compressed_page_size <= 0
                        || page_end > end
                        || !first_row_fits
                    {
                        return Err(format!(
                            "{}, page {p}: bytes {}..{page_end} from row {} do not fit \
                             the column chunk's bytes {data}..{end} and its {} rows",
                            at(),
                            page.offset,
                            page.first_row_index,
                            rg.num_rows()
                        ));
                    }
                    next_byte = page_end;
                    next_row = page.first_row_index + 1;
                }
            }
            if let (Some(stats), Some(offsets)) = (index.column_index(g, c), offsets) {
                let pages = offsets.page_locations().len() as u64;
                if stats.num_pages() != pages {
                    return Err(format!(
                        "{}: page statistics for {} pages, locations for {pages}",
                        at(),
                        stats.num_pages()
                    ));
                }
            }
        }
    }
    if rows_in_groups != meta.file_metadata().num_rows() {
        return Err(format!(
            "its row groups hold {rows_in_groups} rows, its footer says {}",
            meta.file_metadata().num_rows()
        ));
    }
    Ok(())
}

/// Opens the file at `path` for a reader: its footer and page index, with
/// their layout checked against the file ([`check_layout`]) before the Parquet
/// reader, which trusts them, is given them. Every scan, merge and
/// verification opens a file through here.
pub(crate) fn open_for_reading(path: &Path) -> Result<(File, ArrowReaderMetadata)> {
    load_for_reading(File::open(path).map_err(Error::io("open", path))?, path)
}

/// [`open_for_reading`] of a file already open.
pub(crate) fn load_for_reading(file: File, path: &Path) -> Result<(File, ArrowReaderMetadata)> {
    let file_bytes = file.metadata().map_err(Error::io("stat", path))?.len();
    // The offset index lets a reader that starts mid-file skip whole pages.
    let options = ArrowReaderOptions::new().with_page_index_policy(PageIndexPolicy::Optional);
    let metadata = ArrowReaderMetadata::load(&file, options).map_err(|source| Error::Parquet {
        path: path.to_owned(),
        source,
    })?;
    check_layout(metadata.metadata(), file_bytes).map_err(|reason| Error::Corrupt {
        path: path.to_owned(),
        reason,
    })?;
    Ok((file, metadata))
}

/// Reads every page of every column of the file at `path`, as a scan of all
/// of it would, and checks it holds the `rows` its footer promised. A file
/// whose footer is whole can still hold a damaged page that only a read of
/// that page meets; this finds it before a query does.
pub fn verify_file(info: &FileInfo) -> Result<()> {
    let (path, rows) = (info.path.as_path(), info.rows);
    if let Some(sum) = info.pages_crc32 {
        check_pages_crc32(path, sum)?;
    }
    let (file, metadata) = open_for_reading(path)?;
    let mut reader = FileBatches::new(file, path, metadata, |b| b.with_batch_size(64 * 1024))?;
    let mut read = 0u64;
    while let Some(batch) = reader.next(path) {
        read += batch?.num_rows() as u64;
    }
    if read != rows {
        return Err(Error::Corrupt {
            path: path.to_owned(),
            reason: format!("{read} rows read, its footer says {rows}"),
        });
    }
    Ok(())
}

/// What [`verify_store`] found.
#[derive(Debug)]
pub struct Verified {
    /// Published files read whole without a fault.
    pub sound: usize,
    /// Files that could not be read whole, each as its error (naming it).
    pub damaged: Vec<Error>,
}

/// Reads every live file of the store at `data_dir` whole (published, or
/// merged and still under its pending name): its footer and layout, as
/// opening the store does, then every page ([`verify_file`]). Takes no lock,
/// so it runs beside an agent; a file that a merge removes meanwhile is
/// passed over.
pub fn verify_store(data_dir: &Path) -> Result<Verified> {
    let (listed, _) = list_files(data_dir)?;
    let mut damaged = Vec::new();
    let index = index_files(listed, |_, e| {
        if !e.is_not_found() {
            damaged.push(e);
        }
        Ok(())
    })?;
    let mut sound = 0;
    for info in index.live.values().flatten() {
        match verify_file(info) {
            Ok(()) => sound += 1,
            Err(e) if e.is_not_found() => {}
            Err(e) => damaged.push(e),
        }
    }
    Ok(Verified { sound, damaged })
}

/// Where the Parquet reader reads a file's pages from. The reader passes an
/// OS error on only as text, like a damaged page's; this keeps the OS's error
/// code, so that a disk failing a read is not taken for a damaged file (and
/// the file is not quarantined for it).
pub(crate) struct PageSource {
    file: File,
    os_error: Arc<AtomicI32>,
}

impl PageSource {
    fn note(os_error: &AtomicI32, e: &std::io::Error) {
        if let Some(code) = e.raw_os_error() {
            os_error.store(code, Ordering::Relaxed);
        }
    }

    fn note_parquet(&self, e: &parquet::errors::ParquetError) {
        if let Some(io) = crate::error::os_error(e) {
            Self::note(&self.os_error, io);
        }
    }
}

impl parquet::file::reader::Length for PageSource {
    fn len(&self) -> u64 {
        self.file.len()
    }
}

impl parquet::file::reader::ChunkReader for PageSource {
    type T = WatchedRead<std::io::BufReader<File>>;

    fn get_read(&self, start: u64) -> parquet::errors::Result<Self::T> {
        let inner = self
            .file
            .get_read(start)
            .inspect_err(|e| self.note_parquet(e))?;
        Ok(WatchedRead {
            inner,
            os_error: self.os_error.clone(),
        })
    }

    fn get_bytes(&self, start: u64, length: usize) -> parquet::errors::Result<bytes::Bytes> {
        self.file
            .get_bytes(start, length)
            .inspect_err(|e| self.note_parquet(e))
    }
}

/// A reader of page headers that keeps the OS's error code of a failed read.
pub(crate) struct WatchedRead<R> {
    inner: R,
    os_error: Arc<AtomicI32>,
}

impl<R: std::io::Read> std::io::Read for WatchedRead<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        self.inner
            .read(buf)
            .inspect_err(|e| PageSource::note(&self.os_error, e))
    }
}

/// Batches of one Parquet file, read through a [`PageSource`].
pub(crate) struct FileBatches {
    reader: ParquetRecordBatchReader,
    os_error: Arc<AtomicI32>,
}

impl FileBatches {
    /// A reader of `file` (the file at `path`, whose footer is `metadata`),
    /// set up by `configure`: row groups, selection, projection, batch size.
    pub(crate) fn new(
        file: File,
        path: &Path,
        metadata: ArrowReaderMetadata,
        configure: impl FnOnce(
            ParquetRecordBatchReaderBuilder<PageSource>,
        ) -> ParquetRecordBatchReaderBuilder<PageSource>,
    ) -> Result<FileBatches> {
        let os_error = Arc::new(AtomicI32::new(0));
        let source = PageSource {
            file,
            os_error: os_error.clone(),
        };
        let builder = ParquetRecordBatchReaderBuilder::new_with_metadata(source, metadata);
        let reader = configure(builder)
            .build()
            .map_err(|source| Error::Parquet {
                path: path.to_owned(),
                source,
            })?;
        Ok(FileBatches { reader, os_error })
    }

    /// The next batch of the file at `path`. The Parquet reader trusts each
    /// page's header and panics on some damaged ones (a count that overruns
    /// its page); that panic becomes the file's `Corrupt` error, so a damaged
    /// page fails the scan or merge that met it, naming the file, instead of
    /// taking the agent or `vtax query` down. A failed read of the disk is
    /// an `Io` error, not damage.
    pub(crate) fn next(&mut self, path: &Path) -> Option<Result<RecordBatch>> {
        let reader = &mut self.reader;
        let batch = match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| reader.next())) {
            Ok(None) => return None,
            Ok(Some(batch)) => batch,
            Err(payload) => {
                return Some(Err(Error::Corrupt {
                    path: path.to_owned(),
                    reason: format!(
                        "a page could not be decoded: {}",
                        crate::error::panic_message(payload.as_ref())
                    ),
                }))
            }
        };
        Some(
            batch.map_err(|e| match self.os_error.load(Ordering::Relaxed) {
                0 => Error::Parquet {
                    path: path.to_owned(),
                    source: e.into(),
                },
                code => Error::Io {
                    op: "read pages of",
                    path: path.to_owned(),
                    source: std::io::Error::from_raw_os_error(code),
                },
            }),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A disk that fails a read mid-file: the file's footer was read, then
    /// its pages cannot be (a directory's descriptor stands in: every read of
    /// it fails with EISDIR). That is an OS error, not a damaged file.
    #[test]
    fn a_failed_read_of_pages_is_an_io_error_not_damage() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("one.parquet");
        let values = arrow_array::Int64Array::from_iter_values(0..10_000);
        let batch = RecordBatch::try_from_iter([("v", Arc::new(values) as ArrayRef)]).unwrap();
        let mut writer =
            ArrowWriter::try_new(File::create(&path).unwrap(), batch.schema(), None).unwrap();
        writer.write(&batch).unwrap();
        writer.close().unwrap();
        let (file, metadata) = open_for_reading(&path).unwrap();

        let mut whole =
            FileBatches::new(file, &path, metadata.clone(), |b| b.with_batch_size(10_000)).unwrap();
        assert_eq!(whole.next(&path).unwrap().unwrap().num_rows(), 10_000);

        let failing = File::open(dir.path()).unwrap();
        let mut reader = FileBatches::new(failing, &path, metadata, |b| b).unwrap();
        let error = reader.next(&path).unwrap().unwrap_err();
        assert!(
            matches!(&error, Error::Io { source, .. } if source.raw_os_error() == Some(libc::EISDIR)),
            "{error:?}"
        );
        assert!(error.damaged_file().is_none(), "{error}");
    }

    #[test]
    fn strings_that_are_all_empty_get_bytes_in_allocated_memory_and_keep_their_values() {
        let empty = StringArray::from_iter_values(["", "", ""]);
        assert!(empty.values().is_empty());
        let keys = arrow_array::Int32Array::from(vec![0, 0, 0, 0]);
        let dictionary =
            DictionaryArray::<Int32Type>::try_new(keys, Arc::new(empty.clone())).unwrap();

        let strings = with_readable_string_bytes(Arc::new(empty.clone()));
        let strings = strings.as_any().downcast_ref::<StringArray>().unwrap();
        assert!(!strings.values().is_empty());
        assert_eq!(strings, &empty);

        let fixed = with_readable_string_bytes(Arc::new(dictionary.clone()));
        let fixed = fixed
            .as_any()
            .downcast_ref::<DictionaryArray<Int32Type>>()
            .unwrap();
        let values = fixed
            .values()
            .as_any()
            .downcast_ref::<StringArray>()
            .unwrap();
        assert!(!values.values().is_empty());
        assert_eq!(fixed, &dictionary);

        // Strings with bytes are passed through as they are.
        let labels: ArrayRef = Arc::new(StringArray::from_iter_values(["", "gpu=\"0\""]));
        assert!(Arc::ptr_eq(
            &with_readable_string_bytes(labels.clone()),
            &labels
        ));
    }
}
