//! Reads: a table, a time range, tag equality filters and a projection, over
//! published files (pruned by partition, row-group statistics and page index) and
//! rows not yet published (buffered in the writer, or in the WAL for a reader
//! beside a running writer).

use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::types::Int32Type;
use arrow_array::{ArrayRef, BooleanArray, RecordBatch};
use arrow_schema::{Field, Schema};
use parquet::arrow::arrow_reader::RowSelection;
use parquet::arrow::ProjectionMask;
use parquet::file::metadata::ParquetMetaData;
use parquet::file::page_index::column_index::ColumnIndexMetaData;
use parquet::file::statistics::Statistics;

use crate::bucket::Bucket;
use crate::conform::{conform, Projection};
use crate::error::{Error, Result};
use crate::files::{self, FileBatches, FileInfo};
use crate::schema::{TableDef, TIME_COLUMN};
use crate::store::{is_published, watermarks_by_bucket, Store};
use crate::{wal, Catalog, DAY_US};

/// What to read.
#[derive(Clone, Debug, Default)]
pub struct ScanRequest {
    /// Table name.
    pub table: String,
    /// Inclusive lower time bound, microseconds since the epoch.
    pub from_us: Option<i64>,
    /// Exclusive upper time bound.
    pub until_us: Option<i64>,
    /// Tag equality filters, all of which must hold.
    pub tag_equals: Vec<(String, String)>,
    /// Fields to return (all when `None`).
    pub fields: Option<Vec<String>>,
    /// Return only the fields, not time and tags. When no filter needs them
    /// either, they are not even decoded: a single-column scan reads one column.
    pub fields_only: bool,
    /// Leave out a damaged file (its footer, its pages' CRC-32 or a page
    /// fails), naming it in [`ScanResult::damaged_files`], instead of
    /// failing the scan.
    pub skip_damaged: bool,
}

/// What a scan returned and how much it could skip.
#[derive(Debug, Default)]
pub struct ScanResult {
    /// Rows, in batches of the output schema: time, tags, requested fields
    /// (only the fields with [`ScanRequest::fields_only`]).
    pub batches: Vec<RecordBatch>,
    /// The output schema.
    pub schema: Option<Arc<Schema>>,
    /// Files opened.
    pub files_read: usize,
    /// Files skipped by partition or file statistics.
    pub files_skipped: usize,
    /// Row groups skipped by statistics.
    pub row_groups_skipped: usize,
    /// Rows skipped by the page index without decoding.
    pub rows_skipped_by_page_index: usize,
    /// Files left out as damaged with [`ScanRequest::skip_damaged`], with
    /// what was wrong.
    pub damaged_files: Vec<(PathBuf, String)>,
}

impl ScanResult {
    /// Total rows returned.
    pub fn rows(&self) -> usize {
        self.batches.iter().map(RecordBatch::num_rows).sum()
    }
}

struct Plan<'a> {
    table: &'static TableDef,
    request: &'a ScanRequest,
    /// Indices into `table.fields` to return.
    fields: Vec<usize>,
    /// Time, tags and the requested fields: what filters work on.
    schema: Arc<Schema>,
    /// What the scan returns.
    out_schema: Arc<Schema>,
    /// (tag index, value).
    tag_filters: Vec<(usize, &'a str)>,
}

impl<'a> Plan<'a> {
    fn new(catalog: &Catalog, request: &'a ScanRequest) -> Result<Self> {
        let table = catalog.get(&request.table).ok_or_else(|| {
            let known: Vec<_> = catalog.tables().iter().map(|t| t.name).collect();
            Error::Schema(format!(
                "no table {:?} (tables: {})",
                request.table,
                known.join(", ")
            ))
        })?;
        let mut fields: Vec<usize> = match &request.fields {
            None => (0..table.fields.len()).collect(),
            Some(names) => names
                .iter()
                .map(|n| {
                    table.field_index(n).ok_or_else(|| {
                        let known: Vec<_> = table.fields.iter().map(|f| f.name).collect();
                        Error::Schema(format!(
                            "table {} has no field {n:?} (fields: {})",
                            table.name,
                            known.join(", ")
                        ))
                    })
                })
                .collect::<Result<_>>()?,
        };
        // A field asked for twice is read once: the columns a file gives are
        // one per field, and a plan with a field twice indexed past them.
        let mut asked = std::collections::BTreeSet::new();
        fields.retain(|&f| asked.insert(f));
        let tag_filters = request
            .tag_equals
            .iter()
            .map(|(name, value)| {
                table
                    .tag_index(name)
                    .map(|i| (i, value.as_str()))
                    .ok_or_else(|| {
                        let known: Vec<_> = table.tags.iter().map(|t| t.name).collect();
                        Error::Schema(format!(
                            "table {} has no tag {name:?} (tags: {})",
                            table.name,
                            known.join(", ")
                        ))
                    })
            })
            .collect::<Result<_>>()?;
        let full = table.arrow_schema();
        let mut columns: Vec<Field> = vec![full.field(0).clone()];
        columns.extend((0..table.tags.len()).map(|i| full.field(1 + i).clone()));
        columns.extend(
            fields
                .iter()
                .map(|&f| full.field(1 + table.tags.len() + f).clone()),
        );
        let schema = Arc::new(Schema::new(columns));
        let out_schema = if request.fields_only {
            Arc::new(
                schema
                    .project(&(1 + table.tags.len()..schema.fields().len()).collect::<Vec<_>>())?,
            )
        } else {
            schema.clone()
        };
        Ok(Plan {
            table,
            request,
            fields,
            schema,
            out_schema,
            tag_filters,
        })
    }

    fn day_may_match(&self, day: i64) -> bool {
        let start = day * DAY_US;
        self.request.from_us.is_none_or(|f| start + DAY_US > f)
            && self.request.until_us.is_none_or(|u| start < u)
    }

    fn range_may_match(&self, lo: i64, hi: i64) -> bool {
        self.request.from_us.is_none_or(|f| hi >= f) && self.request.until_us.is_none_or(|u| lo < u)
    }

    /// Whether rows from `lo..=hi` need their time and tags read to be filtered.
    fn needs_filter_columns(&self, time_range_us: Option<(i64, i64)>) -> bool {
        let time_inside = time_range_us.is_some_and(|(lo, hi)| {
            self.request.from_us.is_none_or(|f| lo >= f)
                && self.request.until_us.is_none_or(|u| hi < u)
        });
        let time_filtered = self.request.from_us.is_some() || self.request.until_us.is_some();
        !self.request.fields_only || !self.tag_filters.is_empty() || (time_filtered && !time_inside)
    }

    /// Filters a batch in the full schema, then keeps the output columns.
    fn filter_project(&self, batch: RecordBatch) -> Result<Option<RecordBatch>> {
        let Some(batch) = self.filter(batch)? else {
            return Ok(None);
        };
        if !self.request.fields_only {
            return Ok(Some(batch));
        }
        let fields: Vec<usize> = (1 + self.table.tags.len()..batch.num_columns()).collect();
        Ok(Some(batch.project(&fields)?))
    }

    /// Keeps the rows of a batch in the full schema that pass every filter.
    fn filter(&self, batch: RecordBatch) -> Result<Option<RecordBatch>> {
        let n = batch.num_rows();
        let mut keep = vec![true; n];
        let time = batch
            .column(0)
            .as_primitive::<arrow_array::types::TimestampMicrosecondType>();
        if self.request.from_us.is_some() || self.request.until_us.is_some() {
            let (from, until) = (
                self.request.from_us.unwrap_or(i64::MIN),
                self.request.until_us.unwrap_or(i64::MAX),
            );
            for (k, &t) in keep.iter_mut().zip(time.values().iter()) {
                *k &= t >= from && t < until;
            }
        }
        for &(tag, value) in &self.tag_filters {
            let column = batch.column(1 + tag).as_dictionary::<Int32Type>();
            let values = column.values().as_string::<i32>();
            let wanted: Vec<bool> = values.iter().map(|v| v == Some(value)).collect();
            for (k, key) in keep.iter_mut().zip(column.keys().values().iter()) {
                *k &= wanted[*key as usize];
            }
        }
        let selected = keep.iter().filter(|&&k| k).count();
        if selected == 0 {
            return Ok(None);
        }
        if selected == n {
            return Ok(Some(batch));
        }
        Ok(Some(arrow_select::filter::filter_record_batch(
            &batch,
            &BooleanArray::from(keep),
        )?))
    }
}

/// How many times [`scan_dir`] starts over when the store changes under it.
const SCAN_ATTEMPTS: usize = 8;

/// Files [`scan_dir`] keeps open from the read of their footer to the read
/// of their rows: a year of daily files, well inside the usual limit of 1024
/// descriptors. A longer scan opens the rest when it reads them, and starts
/// over if one went meanwhile.
const MAX_KEPT_OPEN: usize = 512;

/// Scans a data directory without opening it for writing: published files plus
/// the rows still in the WAL, so a reader beside the running agent sees them all.
///
/// The writer goes on meanwhile: it publishes files, merges them (removing
/// the inputs) and retires WAL segments once their rows are published. So
/// the WAL's segments are opened before the files are listed (a row no listed
/// file holds yet is in one of them), and each file stays open from the read
/// of its footer to the read of its rows (the first [`MAX_KEPT_OPEN`] files).
/// A file removed before it was opened starts the scan over. Every row is
/// read once.
pub fn scan_dir(data_dir: &Path, catalog: &Catalog, request: &ScanRequest) -> Result<ScanResult> {
    scan_dir_listed_by(data_dir, catalog, request, &mut files::list_files)
}

/// The files of a data directory, as [`files::list_files`] gives them.
type Lister<'a> = dyn FnMut(&Path) -> Result<(Vec<files::Listed>, Vec<PathBuf>)> + 'a;

/// [`scan_dir`] with the directory listed by `list` (tests list it as a
/// racing rename would).
fn scan_dir_listed_by(
    data_dir: &Path,
    catalog: &Catalog,
    request: &ScanRequest,
    list: &mut Lister,
) -> Result<ScanResult> {
    let plan = Plan::new(catalog, request)?;
    let mut attempt = 1;
    loop {
        match scan_dir_once(&plan, data_dir, catalog, list) {
            Ok(result) => return Ok(result),
            Err(e) if e.is_not_found() && attempt < SCAN_ATTEMPTS => {
                tracing::debug!(attempt, error = %e, "A file went under a scan: starting over.");
                // The writer's merges come in bursts: let one finish.
                std::thread::sleep(std::time::Duration::from_millis(1 << attempt));
                attempt += 1;
            }
            Err(e) if e.is_not_found() => {
                return Err(Error::Changing {
                    path: data_dir.to_owned(),
                    attempts: attempt,
                    last: e.to_string(),
                })
            }
            Err(e) => return Err(e),
        }
    }
}

/// One try of [`scan_dir`]: fails with a not-found error when a listed file
/// was removed before it was opened.
fn scan_dir_once(
    plan: &Plan,
    data_dir: &Path,
    catalog: &Catalog,
    list: &mut Lister,
) -> Result<ScanResult> {
    let wal_segments = wal::open_segments(&data_dir.join("wal"))?;
    // A merge renames its file from its pending name once its inputs are
    // gone; a directory read while that happens may show the file under
    // neither name (POSIX lets readdir miss an entry renamed meanwhile), and
    // its rows would be silently left out. A second read right after shows
    // it under its new name: a file is taken from either read, once. Inputs
    // and the file that replaces them, both listed, are read once as ever.
    let (mut listed, _) = list(data_dir)?;
    let (again, _) = list(data_dir)?;
    let mut seen: std::collections::BTreeSet<PathBuf> = listed.iter().map(published_path).collect();
    for file in again {
        if seen.insert(published_path(&file)) {
            listed.push(file);
        }
    }
    // Each file stays open from its footer's read: one a merge removes
    // meanwhile is read all the same.
    let (mut result, index) = scan_listed(plan, listed, MAX_KEPT_OPEN)?;

    let watermarks = watermarks_by_bucket(&index.live);
    let mut buckets: BTreeMap<i64, Bucket> = BTreeMap::new();
    wal::replay_open(wal_segments, catalog, |frame| {
        let table = frame.batch.table;
        if table.name != plan.table.name
            || is_published(&watermarks, table.name, frame.hour, frame.seq)
        {
            return Ok(());
        }
        buckets
            .entry(frame.hour)
            .or_insert_with(|| Bucket::new(table, frame.hour))
            .absorb(frame.seq, &frame.batch);
        Ok(())
    })?;
    for bucket in buckets.values() {
        scan_bucket(plan, bucket, &mut result)?;
    }
    Ok(result)
}

/// The path a listed file is published under: a pending file's published
/// name's.
fn published_path(file: &files::Listed) -> PathBuf {
    let name = file.path.file_name().and_then(|n| n.to_str()).unwrap_or("");
    match files::published_name(name) {
        Some(published) if file.pending => file.path.with_file_name(published),
        _ => file.path.clone(),
    }
}

/// The nodes of a fleet copy: the `node=<name>` directories under any table,
/// sorted. Empty for a single node's store.
pub fn fleet_nodes(root: &Path) -> Result<Vec<String>> {
    let tables = root.join("tables");
    let mut nodes = std::collections::BTreeSet::new();
    let entries = match std::fs::read_dir(&tables) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(Error::io("list", &tables)(e)),
    };
    for table in entries {
        let table = table.map_err(Error::io("list", &tables))?;
        let Ok(parts) = std::fs::read_dir(table.path()) else {
            continue;
        };
        for part in parts.flatten() {
            if let Some(node) = part
                .file_name()
                .to_str()
                .and_then(|n| n.strip_prefix("node="))
            {
                nodes.insert(node.to_owned());
            }
        }
    }
    Ok(nodes.into_iter().collect())
}

/// Scans one node of a fleet copy (`<root>/tables/<table>/node=<node>/date=.../`,
/// as the uploader lays it out): its published files only, since a copy has no WAL.
/// Files that a merged file replaces are ignored, as in a node's own store.
pub fn scan_fleet_node(
    root: &Path,
    node: &str,
    catalog: &Catalog,
    request: &ScanRequest,
) -> Result<ScanResult> {
    let plan = Plan::new(catalog, request)?;
    let (listed, _) = files::list_node_files(root, Some(node))?;
    Ok(scan_listed(&plan, listed, 0)?.0)
}

/// Scans the live files among `listed`, pruned by partition before any footer
/// is read (replaced files are found within their own partition).
fn scan_listed(
    plan: &Plan,
    listed: Vec<files::Listed>,
    keep_open: usize,
) -> Result<(ScanResult, files::FileIndex)> {
    let (listed, pruned): (Vec<_>, Vec<_>) = listed
        .into_iter()
        .filter(|f| f.table == plan.table.name)
        .partition(|f| plan.day_may_match(f.day));
    let mut damaged = Vec::new();
    let mut unreadable = 0;
    let skip_damaged = plan.request.skip_damaged;
    let (index, mut kept) = files::index_files_kept(listed, keep_open, |file, e| {
        // Removed since it was listed: the caller starts over. Any other
        // error fails the scan (a scan that left a file out without being
        // asked to would return a partial answer as a whole one), except
        // damage the request asked to step over.
        if !skip_damaged || e.damaged_file().is_none() {
            return Err(e);
        }
        tracing::warn!(path = %file.path.display(), error = %e, "Left a damaged file out of a scan.");
        unreadable += 1;
        damaged.push((file.path.clone(), e.to_string()));
        Ok(())
    })?;
    let live: Vec<&FileInfo> = index.live.values().flatten().collect();
    let mut result = scan_files(plan, &live, &mut kept)?;
    result.files_skipped += pruned.len() + unreadable;
    damaged.append(&mut result.damaged_files);
    result.damaged_files = damaged;
    Ok((result, index))
}

fn scan_bucket(plan: &Plan, bucket: &Bucket, result: &mut ScanResult) -> Result<()> {
    let hour_start = bucket.hour * crate::HOUR_US;
    if !plan.range_may_match(hour_start, hour_start + crate::HOUR_US - 1) {
        return Ok(());
    }
    let full = bucket.to_record_batch(&plan.table.arrow_schema());
    let mut columns: Vec<ArrayRef> = full.columns()[..1 + plan.table.tags.len()].to_vec();
    for &f in &plan.fields {
        columns.push(full.column(1 + plan.table.tags.len() + f).clone());
    }
    let batch = RecordBatch::try_new(plan.schema.clone(), columns)?;
    if let Some(batch) = plan.filter_project(batch)? {
        result.batches.push(batch);
    }
    Ok(())
}

/// Scans `files`, each through its handle in `kept` if it has one there.
fn scan_files(
    plan: &Plan,
    files: &[&FileInfo],
    kept: &mut HashMap<PathBuf, File>,
) -> Result<ScanResult> {
    let mut result = ScanResult {
        schema: Some(plan.out_schema.clone()),
        ..Default::default()
    };
    for info in files {
        let may_match = plan.day_may_match(info.day)
            && info
                .time_range_us
                .is_none_or(|(lo, hi)| plan.range_may_match(lo, hi));
        if !may_match {
            result.files_skipped += 1;
            continue;
        }
        result.files_read += 1;
        let batches_before = result.batches.len();
        let scanned = scan_file(
            plan,
            info,
            kept.remove(&info.path),
            plan.needs_filter_columns(info.time_range_us),
            &mut result,
        );
        match scanned {
            Ok(()) => {}
            Err(e) if plan.request.skip_damaged && e.damaged_file().is_some() => {
                tracing::warn!(path = %info.path.display(), error = %e, "Left a damaged file out of a scan.");
                result.batches.truncate(batches_before);
                result
                    .damaged_files
                    .push((info.path.clone(), e.to_string()));
            }
            Err(e) => return Err(e),
        }
    }
    Ok(result)
}

fn scan_file(
    plan: &Plan,
    info: &FileInfo,
    kept: Option<File>,
    filtered: bool,
    result: &mut ScanResult,
) -> Result<()> {
    let path = info.path.as_path();
    let (file, reader_metadata) = match kept {
        Some(file) => crate::files::load_for_reading(file, path)?,
        None => crate::files::open_for_reading(path)?,
    };
    let metadata = reader_metadata.metadata().clone();
    let file_schema = reader_metadata.schema().clone();

    // Which columns this file has (a field added later reads as null).
    let target = if filtered {
        &plan.schema
    } else {
        &plan.out_schema
    };
    let Projection { wanted, roots } = Projection::of(target, &file_schema);
    let columns = column_positions(&metadata, plan);
    let mask = ProjectionMask::roots(reader_metadata.parquet_schema(), roots.iter().copied());

    // Parquet's decoders take a flipped bit inside a page for a different
    // value as often as for an error, so every read checks the CRC-32 the
    // writer kept of the file's pages, once, before the first row it
    // returns: a damaged file is named, never read as good.
    let mut pages_checked = info.pages_crc32.is_none();
    for (rg_index, rg) in metadata.row_groups().iter().enumerate() {
        if !row_group_may_match(plan, rg, &columns) {
            result.row_groups_skipped += 1;
            continue;
        }
        let rows = rg.num_rows() as usize;
        let ranges = page_ranges(plan, &metadata, rg_index, rows, &columns);
        let selected: usize = ranges.iter().map(|r| r.len()).sum();
        if selected == 0 {
            result.row_groups_skipped += 1;
            continue;
        }
        result.rows_skipped_by_page_index += rows - selected;
        if let (false, Some(sum)) = (pages_checked, info.pages_crc32) {
            crate::files::check_pages_crc32_of(&file, path, sum)?;
            pages_checked = true;
        }
        // One reader per row group: a batch that crossed into the next row
        // group would meet a new dictionary for each tag column, and the
        // reader would then re-encode every tag value of the batch by hashing
        // (most of a one-series read's time when its pages straddled two).
        let input = file.try_clone().map_err(Error::io("open", path))?;
        let mut reader = FileBatches::new(input, path, reader_metadata.clone(), |builder| {
            builder
                .with_row_groups(vec![rg_index])
                .with_row_selection(RowSelection::from_consecutive_ranges(
                    ranges.into_iter(),
                    rows,
                ))
                .with_projection(mask.clone())
                .with_batch_size(64 * 1024)
        })?;
        while let Some(batch) = reader.next(path) {
            let batch = batch?;
            let batch = conform(target, &batch, &wanted, &roots)?;
            if !filtered {
                result.batches.push(batch);
            } else if let Some(batch) = plan.filter_project(batch)? {
                result.batches.push(batch);
            }
        }
    }
    Ok(())
}

/// Leaf column positions in the file of the time column and each filtered tag.
struct FilterColumns {
    time: Option<usize>,
    tags: Vec<(Option<usize>, Vec<u8>)>,
}

fn column_positions(metadata: &ParquetMetaData, plan: &Plan) -> FilterColumns {
    let schema = metadata.file_metadata().schema_descr();
    let position =
        |name: &str| (0..schema.num_columns()).find(|&i| schema.column(i).name() == name);
    FilterColumns {
        time: position(TIME_COLUMN),
        tags: plan
            .tag_filters
            .iter()
            .map(|&(tag, value)| {
                (
                    position(plan.table.tags[tag].name),
                    value.as_bytes().to_vec(),
                )
            })
            .collect(),
    }
}

fn row_group_may_match(
    plan: &Plan,
    rg: &parquet::file::metadata::RowGroupMetaData,
    columns: &FilterColumns,
) -> bool {
    if let Some(Some(Statistics::Int64(s))) = columns.time.map(|c| rg.column(c).statistics()) {
        if let (Some(&lo), Some(&hi)) = (s.min_opt(), s.max_opt()) {
            if !plan.range_may_match(lo, hi) {
                return false;
            }
        }
    }
    for (column, value) in &columns.tags {
        match column {
            // A tag the file lacks is empty for every row.
            None => {
                if !value.is_empty() {
                    return false;
                }
            }
            Some(c) => {
                if let Some(Statistics::ByteArray(s)) = rg.column(*c).statistics() {
                    if let (Some(lo), Some(hi)) = (s.min_bytes_opt(), s.max_bytes_opt()) {
                        if value.as_slice() < lo || value.as_slice() > hi {
                            return false;
                        }
                    }
                }
            }
        }
    }
    true
}

/// Row ranges of a row group that the page index says may match every filter.
fn page_ranges(
    plan: &Plan,
    metadata: &ParquetMetaData,
    rg_index: usize,
    rows: usize,
    columns: &FilterColumns,
) -> Vec<Range<usize>> {
    let mut ranges: Vec<Range<usize>> = std::iter::once(0..rows).collect();
    let page_index = metadata.page_index_for_row_group(rg_index);
    let mut narrow =
        |column: usize, page_may_match: &dyn Fn(&ColumnIndexMetaData, usize) -> bool| {
            let (Some(index), Some(offsets)) = (
                page_index.column_index(column),
                page_index.offset_index(column),
            ) else {
                return;
            };
            let pages = offsets.page_locations();
            let mut keep = Vec::new();
            for (p, page) in pages.iter().enumerate() {
                let start = page.first_row_index as usize;
                let end = pages
                    .get(p + 1)
                    .map_or(rows, |next| next.first_row_index as usize);
                if page_may_match(index, p) {
                    keep.push(start..end);
                }
            }
            ranges = intersect(&ranges, &keep);
        };
    if let Some(time) = columns.time {
        if plan.request.from_us.is_some() || plan.request.until_us.is_some() {
            narrow(time, &|index, p| match index {
                ColumnIndexMetaData::INT64(ix) => match (ix.min_value(p), ix.max_value(p)) {
                    (Some(&lo), Some(&hi)) => plan.range_may_match(lo, hi),
                    _ => true,
                },
                _ => true,
            });
        }
    }
    for (column, value) in &columns.tags {
        if let Some(c) = column {
            narrow(*c, &|index, p| match index {
                ColumnIndexMetaData::BYTE_ARRAY(ix) => match (ix.min_value(p), ix.max_value(p)) {
                    (Some(lo), Some(hi)) => lo <= value.as_slice() && value.as_slice() <= hi,
                    _ => true,
                },
                _ => true,
            });
        }
    }
    ranges
}

fn intersect(a: &[Range<usize>], b: &[Range<usize>]) -> Vec<Range<usize>> {
    let (mut i, mut j, mut out) = (0, 0, Vec::new());
    while i < a.len() && j < b.len() {
        let start = a[i].start.max(b[j].start);
        let end = a[i].end.min(b[j].end);
        if start < end {
            out.push(start..end);
        }
        if a[i].end < b[j].end {
            i += 1;
        } else {
            j += 1;
        }
    }
    out
}

impl Store {
    /// Scans this store: its files and its buffered rows.
    pub fn scan(&self, request: &ScanRequest) -> Result<ScanResult> {
        let plan = Plan::new(self.catalog(), request)?;
        let files: Vec<&FileInfo> = self.file_infos(plan.table.name).collect();
        let mut result = scan_files(&plan, &files, &mut HashMap::new())?;
        for bucket in self.buffered(plan.table.name) {
            scan_bucket(&plan, bucket, &mut result)?;
        }
        Ok(result)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schema::{FieldDef, FieldType, TagDef, Unit};
    use crate::{BatchBuilder, Store, StoreOptions};

    crate::table! {
        static POWER: TableDef, struct PowerRow {
            name: "power",
            help: "A test table.",
            tags: [gpu = TagDef { name: "gpu", help: "Index." }],
            fields: [power_watts: f64 = FieldDef::gauge(FieldType::F64, Unit::Watts, "Power.")],
            exported: true,
        }
    }

    const T0: i64 = 1_763_683_200_000_000;
    const HOUR: i64 = 3_600_000_000;

    /// A directory read while a merge renames its file can show the file
    /// under neither name: the scan must not return without its rows.
    #[test]
    fn a_file_the_listing_missed_starts_the_scan_over() {
        let dir = tempfile::tempdir().unwrap();
        let catalog = Catalog::new(&[&POWER]).unwrap();
        let mut store = Store::open(StoreOptions::new(dir.path()), catalog.clone()).unwrap();
        // Two hours, so two files.
        for hour in 0..2 {
            let mut rows = BatchBuilder::new(&POWER);
            for s in 0..10 {
                let row = PowerRow {
                    gpu: "0",
                    power_watts: f64::from(s),
                };
                rows.push_row(T0 + hour * HOUR + s as i64 * 1_000_000, &row)
                    .unwrap();
            }
            store.append(&rows.finish()).unwrap();
        }
        store.close().unwrap();
        let request = ScanRequest {
            table: "power".into(),
            ..ScanRequest::default()
        };
        let rows = |r: &ScanResult| r.batches.iter().map(|b| b.num_rows()).sum::<usize>();
        assert_eq!(rows(&scan_dir(dir.path(), &catalog, &request).unwrap()), 20);

        // The first listing misses one file, as a racing rename can make it.
        let mut calls = 0;
        let mut racing = |d: &Path| {
            calls += 1;
            let (mut listed, strays) = files::list_files(d)?;
            if calls == 1 {
                listed.pop();
            }
            Ok((listed, strays))
        };
        let result = scan_dir_listed_by(dir.path(), &catalog, &request, &mut racing).unwrap();
        assert_eq!(rows(&result), 20, "no row left out");
        assert_eq!(calls, 2, "one attempt, the directory read twice");
    }
}
