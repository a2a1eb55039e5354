//! Streaming k-way merge of sorted files, for compaction, one row group and one
//! column at a time.
//!
//! For each row group of the output, a pass over the inputs' sort keys (tags
//! and time) plans the order as runs of rows from one input; then each column
//! is read from every input along that plan and handed to the writer. Memory
//! holds the plan, one chunk of the key columns per input during planning, and
//! one column per input while copying: never every column of every input, which
//! with ZSTD costs a decompression context (about 96 KB) and a page buffer per
//! column per input.
//!
//! A merge asked to (`vtax import`'s, through `Store::compact_all`) leaves
//! out a row whose sort key (tags and time) equals the previous row's: a
//! series holds one value per instant, and the same rows imported twice (an
//! import run again after it was killed) merge back into one copy, as a
//! TSDB's compaction drops duplicate samples. The first in the inputs' order
//! is kept, which such a merge's planner makes the order the rows were
//! written in. The agent's own merges keep every row.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use arrow_array::{Array, ArrayRef, RecordBatch, RecordBatchOptions};
use arrow_row::{RowConverter, Rows, SortField};
use arrow_schema::{Schema, SchemaRef};
use parquet::arrow::arrow_reader::{ArrowReaderMetadata, RowSelection, RowSelector};
use parquet::arrow::ProjectionMask;

use crate::conform::{conform, Projection};
use crate::error::{Error, Result};
use crate::files::{ColumnSource, FileBatches, FileInfo};
use crate::schema::TableDef;

/// Rows per batch read from an input and per chunk handed to the writer.
const CHUNK_ROWS: usize = 4 * 1024;

/// Rows per batch of sort keys read from an input while planning. Keys are
/// compared in Arrow's row format, which spells out every tag's string in
/// every row: at 4k rows, eight inputs of cgroup paths held 3.6 MB of it.
const KEY_CHUNK_ROWS: usize = 1024;

/// Rows taken from one input in a row of the plan, or, with `keep` false,
/// read past: duplicates of the row before them.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Run {
    input: u32,
    rows: u32,
    keep: bool,
}

struct Input {
    path: PathBuf,
    metadata: ArrowReaderMetadata,
    rows: usize,
    /// Rows of this input in row groups before the current one.
    start: usize,
    /// Rows of this input in the current row group.
    taken: usize,
}

/// Files that are each sorted by tags then time, merged into one sorted stream
/// in the table's current schema.
pub(crate) struct MergeColumns {
    schema: SchemaRef,
    /// Time and tags: the leading columns of the table's schema.
    key_schema: SchemaRef,
    /// Key columns in sort order (tags, then time), as indices into `key_schema`.
    sort_columns: Vec<usize>,
    converter: RowConverter,
    inputs: Vec<Input>,
    /// The current row group's order.
    plan: Vec<Run>,
    /// Whether rows whose key equals the row before them are left out.
    dedupe: bool,
    /// The sort key of the last row kept, across row groups: a row equal to
    /// it is a duplicate.
    last_kept: Option<arrow_row::OwnedRow>,
    /// Rows left out as duplicates so far.
    duplicates: u64,
}

impl MergeColumns {
    /// Reads the inputs' footers; the rows are read as the writer asks for them.
    pub fn open(table: &TableDef, files: &[FileInfo], dedupe: bool) -> Result<Self> {
        if files.len() > u32::MAX as usize {
            return Err(Error::Schema("too many files to merge at once".into()));
        }
        let schema = table.arrow_schema();
        let key_schema = Arc::new(Schema::new(schema.fields()[..=table.tags.len()].to_vec()));
        let mut sort_columns: Vec<usize> = (1..=table.tags.len()).collect();
        sort_columns.push(0);
        let converter = RowConverter::new(
            sort_columns
                .iter()
                .map(|&c| SortField::new(key_schema.field(c).data_type().clone()))
                .collect(),
        )?;
        let mut inputs = Vec::with_capacity(files.len());
        for info in files {
            let path = &info.path;
            // A flipped bit that still decodes would otherwise go into the
            // merged file, under a checksum of its own.
            if let Some(sum) = info.pages_crc32 {
                crate::files::check_pages_crc32(path, sum)?;
            }
            let (_, metadata) = crate::files::open_for_reading(path)?;
            let rows = metadata.metadata().file_metadata().num_rows().max(0) as usize;
            inputs.push(Input {
                path: path.clone(),
                metadata,
                rows,
                start: 0,
                taken: 0,
            });
        }
        Ok(MergeColumns {
            schema,
            key_schema,
            sort_columns,
            converter,
            inputs,
            plan: Vec::new(),
            dedupe,
            last_kept: None,
            duplicates: 0,
        })
    }

    /// Rows left out as duplicates of the row before them so far.
    pub fn duplicates(&self) -> u64 {
        self.duplicates
    }

    /// A reader of `rows` of `input`'s rows from `start` on, of the columns
    /// `projection` picks.
    fn reader(
        &self,
        input: &Input,
        projection: &Projection,
        rows: usize,
        batch_rows: usize,
    ) -> Result<FileBatches> {
        let file = crate::files::open_regular(&input.path)?;
        FileBatches::new(file, &input.path, input.metadata.clone(), |builder| {
            let mask =
                ProjectionMask::roots(builder.parquet_schema(), projection.roots.iter().copied());
            let selection = RowSelection::from(vec![
                RowSelector::skip(input.start),
                RowSelector::select(rows),
            ]);
            builder
                .with_projection(mask)
                .with_row_selection(selection)
                .with_batch_size(batch_rows)
        })
    }

    /// Plans the next `max_rows` rows of the merged order.
    fn plan(&mut self, max_rows: usize) -> Result<usize> {
        for input in &mut self.inputs {
            input.start += input.taken;
            input.taken = 0;
        }
        self.plan.clear();
        let mut cursors = Vec::new();
        for (i, input) in self.inputs.iter().enumerate() {
            let remaining = input.rows - input.start;
            if remaining == 0 {
                continue;
            }
            let projection = Projection::of(&self.key_schema, input.metadata.schema());
            let mut cursor = KeyCursor {
                input: i,
                reader: self.reader(input, &projection, remaining, KEY_CHUNK_ROWS)?,
                projection,
                rows: self.converter.empty_rows(0, 0),
                pos: 0,
            };
            if cursor.load(self)? {
                cursors.push(cursor);
            }
        }
        let mut planned = 0;
        while planned < max_rows && !cursors.is_empty() {
            // The cursor with the smallest head, and the runner-up's head.
            // Of equal heads the earlier input's goes first, so a merge that
            // keeps one of equal rows keeps the first input's (cursors that
            // ran out are swap-removed: their places say nothing).
            let mut best = 0;
            for i in 1..cursors.len() {
                if (cursors[i].head(), cursors[i].input)
                    < (cursors[best].head(), cursors[best].input)
                {
                    best = i;
                }
            }
            let mut second: Option<usize> = None;
            for i in 0..cursors.len() {
                if i != best
                    && second.is_none_or(|s| {
                        (cursors[i].head(), cursors[i].input)
                            < (cursors[s].head(), cursors[s].input)
                    })
                {
                    second = Some(i);
                }
            }
            // Take the run of rows from `best` that sort before the runner-up's
            // head, or that equal it when `best` is the earlier input (the
            // runner-up's equal row is then a duplicate); within it, rows
            // equal to the row before them are duplicates, read past.
            let cursor = &cursors[best];
            let input = cursor.input;
            let limit = second.map(|s| (cursors[s].head(), input < cursors[s].input));
            let mut end = cursor.pos;
            while end < cursor.rows.num_rows()
                && planned < max_rows
                && (end == cursor.pos
                    || limit.is_none_or(|(l, earlier)| {
                        let row = cursor.rows.row(end);
                        row < l || (earlier && row == l)
                    }))
            {
                let row = cursor.rows.row(end);
                let duplicate = self.dedupe
                    && if end == cursor.pos {
                        self.last_kept.as_ref().is_some_and(|k| k.row() == row)
                    } else {
                        cursor.rows.row(end - 1) == row
                    };
                match self.plan.last_mut() {
                    Some(run) if run.input as usize == input && run.keep != duplicate => {
                        run.rows += 1
                    }
                    _ => self.plan.push(Run {
                        input: input as u32,
                        rows: 1,
                        keep: !duplicate,
                    }),
                }
                if duplicate {
                    self.duplicates += 1;
                } else {
                    planned += 1;
                }
                end += 1;
            }
            if self.dedupe {
                self.last_kept = Some(cursor.rows.row(end - 1).owned());
            }
            self.inputs[input].taken += end - cursor.pos;
            let cursor = &mut cursors[best];
            cursor.pos = end;
            if end == cursor.rows.num_rows() && !cursor.load(self)? {
                cursors.swap_remove(best);
            }
        }
        Ok(planned)
    }
}

/// The sort keys of one input during planning.
struct KeyCursor {
    input: usize,
    reader: FileBatches,
    projection: Projection,
    rows: Rows,
    pos: usize,
}

impl KeyCursor {
    fn head(&self) -> arrow_row::Row<'_> {
        self.rows.row(self.pos)
    }

    /// Loads the next batch of keys; false when the input is exhausted.
    fn load(&mut self, merge: &MergeColumns) -> Result<bool> {
        let path = &merge.inputs[self.input].path;
        loop {
            let Some(batch) = self.reader.next(path) else {
                return Ok(false);
            };
            let batch = batch?;
            if batch.num_rows() == 0 {
                continue;
            }
            let batch = conform(
                &merge.key_schema,
                &batch,
                &self.projection.wanted,
                &self.projection.roots,
            )?;
            let keys: Vec<ArrayRef> = merge
                .sort_columns
                .iter()
                .map(|&c| batch.column(c).clone())
                .collect();
            self.rows = merge.converter.convert_columns(&keys)?;
            self.pos = 0;
            return Ok(true);
        }
    }
}

/// The pieces of one output chunk as one array. A tag column's pieces are
/// slices of dictionary arrays, each holding its whole dictionary: where the
/// inputs hold the same series at interleaved times, a chunk is thousands of
/// one-row slices, and Arrow's concat merged their dictionaries value by
/// value: a chunk's slices times a dictionary of tens of thousands of label
/// values, hundreds of MB and seconds a chunk. Their values are taken out first and
/// the chunk gets a dictionary of its own rows.
fn concat_pieces(pieces: &[ArrayRef]) -> Result<ArrayRef> {
    let parts: Vec<&dyn Array> = pieces.iter().map(|a| a.as_ref()).collect();
    let data_type = pieces[0].data_type();
    let arrow_schema::DataType::Dictionary(_, value_type) = data_type else {
        return Ok(arrow_select::concat::concat(&parts)?);
    };
    let values = pieces
        .iter()
        .map(|piece| arrow_cast::cast(piece.as_ref(), value_type))
        .collect::<std::result::Result<Vec<ArrayRef>, _>>()?;
    let values: Vec<&dyn Array> = values.iter().map(|a| a.as_ref()).collect();
    let plain = arrow_select::concat::concat(&values)?;
    Ok(arrow_cast::cast(&plain, data_type)?)
}

/// One column of one input during a copy.
struct ColumnCursor {
    /// None when the input lacks the column: it reads as nulls (or empty tags).
    reader: Option<FileBatches>,
    projection: Projection,
    remaining: usize,
    array: Option<ArrayRef>,
    pos: usize,
}

impl ColumnCursor {
    /// The next unread values, at most `max` of them.
    fn take(&mut self, target: &SchemaRef, path: &Path, max: usize) -> Result<ArrayRef> {
        if self.array.as_ref().is_none_or(|a| self.pos == a.len()) {
            let batch = match &mut self.reader {
                Some(reader) => reader.next(path).ok_or_else(|| Error::Corrupt {
                    path: path.to_owned(),
                    reason: "fewer rows than its footer says".into(),
                })??,
                None => {
                    let rows = self.remaining.min(CHUNK_ROWS);
                    RecordBatch::try_new_with_options(
                        Arc::new(Schema::empty()),
                        Vec::new(),
                        &RecordBatchOptions::new().with_row_count(Some(rows)),
                    )?
                }
            };
            let batch = conform(
                target,
                &batch,
                &self.projection.wanted,
                &self.projection.roots,
            )?;
            self.array = Some(batch.column(0).clone());
            self.pos = 0;
        }
        let array = self.array.as_ref().expect("loaded");
        let n = max.min(array.len() - self.pos);
        let out = array.slice(self.pos, n);
        self.pos += n;
        self.remaining -= n;
        Ok(out)
    }
}

impl ColumnSource for MergeColumns {
    fn next_row_group(&mut self, max_rows: usize) -> Result<usize> {
        self.plan(max_rows)
    }

    fn column(
        &mut self,
        column: usize,
        sink: &mut dyn FnMut(ArrayRef) -> Result<()>,
    ) -> Result<()> {
        let target: SchemaRef = Arc::new(Schema::new(vec![self.schema.field(column).clone()]));
        let mut cursors = Vec::with_capacity(self.inputs.len());
        for input in &self.inputs {
            let cursor = if input.taken == 0 {
                None
            } else {
                let projection = Projection::of(&target, input.metadata.schema());
                let reader = if projection.roots.is_empty() {
                    None
                } else {
                    Some(self.reader(input, &projection, input.taken, CHUNK_ROWS)?)
                };
                Some(ColumnCursor {
                    reader,
                    projection,
                    remaining: input.taken,
                    array: None,
                    pos: 0,
                })
            };
            cursors.push(cursor);
        }
        let mut pieces: Vec<ArrayRef> = Vec::new();
        let mut piece_rows = 0;
        let mut flush = |pieces: &mut Vec<ArrayRef>| -> Result<()> {
            let chunk = match pieces.len() {
                0 => return Ok(()),
                1 => pieces.pop().expect("one"),
                _ => {
                    let chunk = concat_pieces(pieces)?;
                    pieces.clear();
                    chunk
                }
            };
            sink(chunk)
        };
        for run in &self.plan {
            let input = run.input as usize;
            let path = &self.inputs[input].path;
            let cursor = cursors[input]
                .as_mut()
                .expect("planned inputs have cursors");
            let mut rows = run.rows as usize;
            while rows > 0 && !run.keep {
                rows -= cursor.take(&target, path, rows)?.len();
            }
            while rows > 0 {
                let piece = cursor.take(&target, path, rows.min(CHUNK_ROWS - piece_rows))?;
                rows -= piece.len();
                piece_rows += piece.len();
                pieces.push(piece);
                if piece_rows == CHUNK_ROWS {
                    flush(&mut pieces)?;
                    piece_rows = 0;
                }
            }
        }
        flush(&mut pieces)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow_array::types::Int32Type;
    use arrow_array::{DictionaryArray, StringArray};

    /// A chunk of one-row slices taken in turn from two inputs' tag columns,
    /// each with a dictionary of 10,000 names: the chunk holds its rows'
    /// names only, in order, not the inputs' dictionaries merged.
    #[test]
    fn interleaved_dictionary_slices_make_a_dictionary_of_their_own_rows() {
        let input = |prefix: &str| -> ArrayRef {
            let names: Vec<String> = (0..10_000).map(|i| format!("{prefix}{i}")).collect();
            let array: DictionaryArray<Int32Type> = names.iter().map(String::as_str).collect();
            Arc::new(array)
        };
        let (a, b) = (input("a"), input("b"));
        let pieces: Vec<ArrayRef> = (0..1000)
            .map(|i| {
                if i % 2 == 0 {
                    a.slice(i, 1)
                } else {
                    b.slice(i, 1)
                }
            })
            .collect();
        let chunk = concat_pieces(&pieces).unwrap();
        assert_eq!(chunk.data_type(), a.data_type());
        let dictionary = chunk
            .as_any()
            .downcast_ref::<DictionaryArray<Int32Type>>()
            .unwrap();
        assert!(
            dictionary.values().len() <= 1000,
            "{}",
            dictionary.values().len()
        );
        let names = arrow_cast::cast(&chunk, &arrow_schema::DataType::Utf8).unwrap();
        let names = names.as_any().downcast_ref::<StringArray>().unwrap();
        for i in 0..1000 {
            let want = format!("{}{i}", if i % 2 == 0 { "a" } else { "b" });
            assert_eq!(names.value(i), want);
        }
    }
}
