//! Streaming k-way merge of sorted files, for compaction: memory holds one batch
//! per input and the output row group, never the whole day.

use std::fs::File;
use std::sync::Arc;

use arrow_array::RecordBatch;
use arrow_row::{RowConverter, Rows, SortField};
use arrow_schema::Schema;
use parquet::arrow::arrow_reader::{ParquetRecordBatchReader, ParquetRecordBatchReaderBuilder};
use parquet::arrow::ProjectionMask;

use crate::error::{Error, Result};
use crate::files::FileInfo;
use crate::scan::{conform, Projection};
use crate::schema::TableDef;

/// Rows per input batch and per output chunk. Memory holds one batch per
/// input, its sort keys and one output chunk: at 16k rows a running-hour merge
/// of four 30-column parts held 10 MB of them (heaptrack, docs/benchmarks.md).
const CHUNK_ROWS: usize = 4 * 1024;

struct Input {
    reader: ParquetRecordBatchReader,
    wanted: Vec<Option<usize>>,
    roots: Vec<usize>,
    path: std::path::PathBuf,
    batch: RecordBatch,
    rows: Rows,
    pos: usize,
}

/// Merges files that are each sorted by tags then time into one sorted stream
/// in the table's current schema.
pub(crate) struct Merge {
    schema: Arc<Schema>,
    converter: RowConverter,
    sort_columns: Vec<usize>,
    inputs: Vec<Input>,
    /// Output rows gathered so far: (input, row) into each input's current batch.
    pending: Vec<(usize, usize)>,
}

impl Merge {
    pub fn open(table: &TableDef, files: &[FileInfo]) -> Result<Self> {
        let schema = table.arrow_schema();
        let mut sort_columns: Vec<usize> = (1..=table.tags.len()).collect();
        sort_columns.push(0);
        let converter = RowConverter::new(
            sort_columns
                .iter()
                .map(|&c| SortField::new(schema.field(c).data_type().clone()))
                .collect(),
        )?;
        let mut merge = Merge {
            schema,
            converter,
            sort_columns,
            inputs: Vec::new(),
            pending: Vec::new(),
        };
        for info in files {
            let path = &info.path;
            let parquet_err = |source| Error::Parquet {
                path: path.clone(),
                source,
            };
            let file = File::open(path).map_err(Error::io("open", path))?;
            let builder = ParquetRecordBatchReaderBuilder::try_new(file).map_err(parquet_err)?;
            let Projection { wanted, roots } = Projection::of(&merge.schema, builder.schema());
            let mask = ProjectionMask::roots(builder.parquet_schema(), roots.iter().copied());
            let reader = builder
                .with_projection(mask)
                .with_batch_size(CHUNK_ROWS)
                .build()
                .map_err(parquet_err)?;
            let mut input = Input {
                reader,
                wanted,
                roots,
                path: path.clone(),
                batch: RecordBatch::new_empty(merge.schema.clone()),
                rows: merge.converter.empty_rows(0, 0),
                pos: 0,
            };
            if merge.load_next(&mut input)? {
                merge.inputs.push(input);
            }
        }
        Ok(merge)
    }

    /// Loads the input's next batch; false when it is exhausted.
    fn load_next(&self, input: &mut Input) -> Result<bool> {
        loop {
            let Some(batch) = input.reader.next() else {
                return Ok(false);
            };
            let batch = batch.map_err(|e| Error::Parquet {
                path: input.path.clone(),
                source: e.into(),
            })?;
            if batch.num_rows() == 0 {
                continue;
            }
            let batch = conform(&self.schema, &batch, &input.wanted, &input.roots)?;
            let keys: Vec<_> = self
                .sort_columns
                .iter()
                .map(|&c| batch.column(c).clone())
                .collect();
            input.rows = self.converter.convert_columns(&keys)?;
            input.batch = batch;
            input.pos = 0;
            return Ok(true);
        }
    }

    fn flush_pending(&mut self) -> Result<Option<RecordBatch>> {
        if self.pending.is_empty() {
            return Ok(None);
        }
        let batches: Vec<&RecordBatch> = self.inputs.iter().map(|i| &i.batch).collect();
        let out = arrow_select::interleave::interleave_record_batch(&batches, &self.pending)?;
        self.pending.clear();
        Ok(Some(out))
    }

    /// The next chunk of merged rows, or `None` at the end.
    pub fn next_chunk(&mut self) -> Result<Option<RecordBatch>> {
        while self.pending.len() < CHUNK_ROWS {
            if self.inputs.is_empty() {
                break;
            }
            // The input with the smallest head, and the runner-up's head.
            let mut best = 0;
            for i in 1..self.inputs.len() {
                let (a, b) = (&self.inputs[i], &self.inputs[best]);
                if a.rows.row(a.pos) < b.rows.row(b.pos) {
                    best = i;
                }
            }
            let mut second: Option<usize> = None;
            for i in 0..self.inputs.len() {
                if i == best {
                    continue;
                }
                let a = &self.inputs[i];
                if second
                    .is_none_or(|s| a.rows.row(a.pos) < self.inputs[s].rows.row(self.inputs[s].pos))
                {
                    second = Some(i);
                }
            }
            // Take the run of rows from `best` that sort before the runner-up's head.
            let input = &self.inputs[best];
            let limit = second.map(|s| self.inputs[s].rows.row(self.inputs[s].pos));
            let mut end = input.pos + 1;
            while end < input.rows.num_rows()
                && self.pending.len() + (end - input.pos) < CHUNK_ROWS
                && limit.is_none_or(|l| input.rows.row(end) <= l)
            {
                end += 1;
            }
            self.pending.extend((input.pos..end).map(|r| (best, r)));
            self.inputs[best].pos = end;
            if end == self.inputs[best].rows.num_rows() {
                // The pending rows point into this batch: emit them before replacing it.
                let out = self.flush_pending()?;
                let mut input = self.inputs.swap_remove(best);
                if self.load_next(&mut input)? {
                    self.inputs.push(input);
                }
                if out.is_some() {
                    return Ok(out);
                }
            }
        }
        self.flush_pending()
    }
}
