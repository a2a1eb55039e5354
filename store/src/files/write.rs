//! Writing a Parquet file: the writer's settings, each column's encoding
//! chosen by trial, the pages checksummed as they are written, and the
//! publish that makes the file visible whole or not at all.

use super::*;

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
pub(super) fn has_encoding_trial(table: &TableDef, column: &str) -> bool {
    column == TIME_COLUMN
        || table
            .fields
            .iter()
            .any(|f| f.name == column && f.ty == FieldType::F64)
}

/// The candidate encoding sets a publish tries: for every f64 field and time.
pub(super) fn candidates() -> [(Encoding, Encoding); 2] {
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
pub(super) const SAMPLE_SLICES: usize = 16;

pub(super) const SAMPLE_SLICE_ROWS: usize = 16_384;

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
    // Through one descriptor of the partition, opened from the data
    // directory without following a link: a table or partition that is a
    // link (or becomes one while the file is written) takes nothing.
    let dir_fd = crate::regular_file::open_dirs_below(data_dir, &dir, true)
        .map_err(Error::io("create", &dir))?;
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
    let c_name = |path: &Path| {
        crate::regular_file::c_name(path.file_name().unwrap_or_default())
            .map_err(Error::io("name", path))
    };
    let (tmp_name, final_name) = (c_name(&tmp)?, c_name(&path)?);

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
        let file = crate::regular_file::create_fresh_at(&dir_fd, &tmp_name)
            .map_err(Error::io("create", &tmp))?;
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
            let _ = crate::regular_file::remove_at(&dir_fd, &tmp_name);
            return Err(e);
        }
    };
    if let Err(e) = crate::regular_file::rename_at(&dir_fd, &tmp_name, &dir_fd, &final_name) {
        let _ = crate::regular_file::remove_at(&dir_fd, &tmp_name);
        return Err(Error::io("rename", &path)(e));
    }
    dir_fd.sync_all().map_err(Error::io("fsync", &dir))?;
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
pub(super) struct Checksummed {
    pub(super) file: File,
    pub(super) crc: crc32fast::Hasher,
    pub(super) bytes: u64,
}

impl Checksummed {
    pub(super) fn new(file: File) -> Self {
        Checksummed {
            file,
            crc: crc32fast::Hasher::new(),
            bytes: 0,
        }
    }

    /// Bytes written so far and their CRC-32.
    pub(super) fn sum(&self) -> (u64, u32) {
        (self.bytes, self.crc.clone().finalize())
    }

    pub(super) fn into_inner(self) -> File {
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

/// One column of one row group being encoded. In a file's first row group a
/// column whose encoding is chosen by trial buffers up to
/// [`WriteOptions::encoding_sample_bytes`] of values to try the candidates on.
pub(super) struct ColumnWrite<'a> {
    pub(super) table: &'a TableDef,
    pub(super) options: &'a WriteOptions,
    pub(super) field: &'a FieldRef,
    pub(super) row_group: usize,
    pub(super) props: Option<Arc<WriterProperties>>,
    pub(super) writer: Option<ArrowColumnWriter>,
    pub(super) head: Vec<ArrayRef>,
    pub(super) head_bytes: usize,
    pub(super) rows: usize,
}

impl ColumnWrite<'_> {
    pub(super) fn push(&mut self, array: ArrayRef) -> Result<()> {
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
    pub(super) fn is_trial_candidate(&self) -> bool {
        self.options.adaptive
            && self.props.is_none()
            && has_encoding_trial(self.table, self.field.name())
    }

    /// Settles the column's properties and writes the buffered values.
    pub(super) fn start(&mut self) -> Result<()> {
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

    pub(super) fn finish(mut self) -> Result<(Arc<WriterProperties>, ArrowColumnChunk)> {
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

pub(super) fn parquet_in_memory(source: parquet::errors::ParquetError) -> Error {
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
pub(super) fn with_readable_string_bytes(array: ArrayRef) -> ArrayRef {
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

pub(super) fn write_leaves(
    writer: &mut ArrowColumnWriter,
    field: &FieldRef,
    array: &ArrayRef,
) -> Result<()> {
    for leaf in compute_leaves(field, array).map_err(parquet_in_memory)? {
        writer.write(&leaf).map_err(parquet_in_memory)?;
    }
    Ok(())
}

/// A writer for one column with its own properties. Parquet's factory makes a
/// writer, with its codec, for every column of a schema at once; a one-column
/// schema makes just this one. The chunk it produces describes a column equal
/// to the file's column of that name, so the file's row group accepts it.
pub(super) fn column_writer(
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

pub(super) fn max_time(times: &ArrayRef) -> Option<i64> {
    times
        .as_any()
        .downcast_ref::<arrow_array::TimestampMicrosecondArray>()?
        .values()
        .iter()
        .copied()
        .max()
}

pub(super) fn format_watermarks(watermarks: &BTreeMap<i64, u64>) -> String {
    watermarks
        .iter()
        .map(|(hour, seq)| format!("{hour}:{seq}"))
        .collect::<Vec<_>>()
        .join(",")
}
