//! Why the store gives all-empty string columns allocated bytes: the time to
//! write 1.15 M rows of one dictionary-encoded tag column (a publish's worth
//! at the default memory bound) with page statistics, as the store writes tags.
//!
//! `cargo run --release -p vtax-store --example empty_string_column`
//!
//! An Arrow string array whose strings are all empty points its empty buffer at
//! a dangling address; Parquet compares every row's string for the page
//! statistics, and an AVX-512 `memcmp` of zero bytes there is slow.

use std::sync::Arc;
use std::time::Instant;

use arrow_array::types::Int32Type;
use arrow_array::{Array, ArrayRef, DictionaryArray, Int32Array, RecordBatch, StringArray};
use arrow_buffer::Buffer;
use arrow_schema::{DataType, Field, Schema};
use parquet::arrow::ArrowWriter;
use parquet::file::properties::{EnabledStatistics, WriterProperties};

const ROWS: usize = 1_150_000;
const CHUNK_ROWS: usize = 16 * 1024;

/// Seconds to write `values` as the dictionary of a column of ROWS rows.
fn write_seconds(values: StringArray) -> f64 {
    let field = Field::new(
        "tag",
        DataType::Dictionary(Box::new(DataType::Int32), Box::new(DataType::Utf8)),
        false,
    );
    let schema = Arc::new(Schema::new(vec![field]));
    let props = WriterProperties::builder()
        .set_statistics_enabled(EnabledStatistics::Page)
        .set_data_page_row_count_limit(8192)
        .build();
    let mut writer = ArrowWriter::try_new(std::io::sink(), schema.clone(), Some(props)).unwrap();
    let values = Arc::new(values);
    let per_value = ROWS.div_ceil(values.len());
    let start = Instant::now();
    for first in (0..ROWS).step_by(CHUNK_ROWS) {
        let keys: Int32Array = (first..ROWS.min(first + CHUNK_ROWS))
            .map(|row| (row / per_value) as i32)
            .collect();
        let column: ArrayRef =
            Arc::new(DictionaryArray::<Int32Type>::try_new(keys, values.clone()).unwrap());
        writer
            .write(&RecordBatch::try_new(schema.clone(), vec![column]).unwrap())
            .unwrap();
    }
    writer.close().unwrap();
    start.elapsed().as_secs_f64()
}

fn main() {
    let empty = StringArray::from_iter_values([""]);
    let (offsets, _, nulls) = empty.clone().into_parts();
    let allocated = StringArray::new(offsets, Buffer::from(vec![0u8; 64]), nulls);
    let labels = StringArray::from_iter_values((0..10_000).map(|i| format!("gpu=\"{i:05}\"")));
    for (name, values) in [
        ("all empty, no bytes", empty),
        ("all empty, 64 allocated bytes", allocated),
        ("10k distinct labels", labels),
    ] {
        println!(
            "{name}: {:.1} ms for {ROWS} rows",
            write_seconds(values) * 1e3
        );
    }
}
