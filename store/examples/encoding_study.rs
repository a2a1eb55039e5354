//! Rewrites one store file under several encodings and prints bytes per sample,
//! so the defaults in `WriteOptions` are chosen by measurement.
//!
//! `cargo run --release -p vtax-store --example encoding_study -- FILE.parquet`

use std::fs::File;

use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use parquet::arrow::ArrowWriter;
use parquet::basic::Encoding;
use vtax_store::{tables, WriteOptions};

fn main() {
    let path = std::env::args()
        .nth(1)
        .expect("a .parquet file of the scraped table");
    let reader = ParquetRecordBatchReaderBuilder::try_new(File::open(&path).unwrap())
        .unwrap()
        .with_batch_size(64 * 1024)
        .build()
        .unwrap();
    let batches: Vec<_> = reader.map(|b| b.unwrap()).collect();
    let rows: usize = batches.iter().map(|b| b.num_rows()).sum();
    use Encoding::{BYTE_STREAM_SPLIT as BSS, DELTA_BINARY_PACKED as DELTA, PLAIN};
    // (value dictionary, value encoding, time encoding, rows per page, zstd level)
    let grid = [
        (true, BSS, DELTA, 20_000, 3),
        (false, BSS, DELTA, 20_000, 3),
        (false, PLAIN, DELTA, 20_000, 3),
        (false, PLAIN, PLAIN, 20_000, 3),
        (false, BSS, PLAIN, 100_000, 3),
        (false, PLAIN, PLAIN, 100_000, 3),
        (false, PLAIN, DELTA, 100_000, 3),
        (false, BSS, PLAIN, 250_000, 3),
        (false, PLAIN, PLAIN, 250_000, 3),
        (false, PLAIN, DELTA, 250_000, 3),
        (false, BSS, PLAIN, 500_000, 3),
        (false, PLAIN, PLAIN, 500_000, 3),
        (false, BSS, PLAIN, 1 << 20, 3),
        (false, PLAIN, PLAIN, 1 << 20, 3),
        (false, PLAIN, DELTA, 1 << 20, 3),
        (false, PLAIN, PLAIN, 250_000, 9),
        (false, BSS, PLAIN, 250_000, 9),
    ];
    println!("value dict  value enc  time enc  rows/page  zstd  bytes/sample  M rows/s");
    for (dictionary, value, time, page_rows, level) in grid {
        let options = WriteOptions {
            float_dictionary: dictionary,
            float_encoding: value,
            time_encoding: time,
            data_page_rows: page_rows,
            data_page_bytes: 64 << 20,
            zstd_level: level,
            ..WriteOptions::default()
        };
        let props = options.properties(&tables::SCRAPED, Vec::new()).unwrap();
        let start = std::time::Instant::now();
        let mut out = Vec::new();
        let mut writer = ArrowWriter::try_new(&mut out, batches[0].schema(), Some(props)).unwrap();
        for b in &batches {
            writer.write(b).unwrap();
        }
        writer.close().unwrap();
        println!(
            "{dictionary:10}  {:9}  {:8}  {page_rows:9}  {level:4}  {:12.3}  {:8.1}",
            format!("{value}"),
            format!("{time}"),
            out.len() as f64 / rows as f64,
            rows as f64 / start.elapsed().as_secs_f64() / 1e6
        );
    }
}
