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
    let table = &tables::SCRAPED;
    let base = WriteOptions::default();
    let variants: Vec<(&str, WriteOptions)> = vec![
        ("default", base.clone()),
        (
            "value: dictionary off, BSS",
            WriteOptions {
                float_dictionary: false,
                ..base.clone()
            },
        ),
        (
            "value: dictionary off, PLAIN",
            WriteOptions {
                float_dictionary: false,
                float_encoding: Encoding::PLAIN,
                ..base.clone()
            },
        ),
        (
            "+ time PLAIN",
            WriteOptions {
                float_dictionary: false,
                time_encoding: Encoding::PLAIN,
                ..base.clone()
            },
        ),
        (
            "+ 100k rows/page",
            WriteOptions {
                float_dictionary: false,
                time_encoding: Encoding::PLAIN,
                data_page_rows: 100_000,
                data_page_bytes: 8 << 20,
                ..base.clone()
            },
        ),
        (
            "+ 1M rows/page",
            WriteOptions {
                float_dictionary: false,
                time_encoding: Encoding::PLAIN,
                data_page_rows: 1 << 20,
                data_page_bytes: 16 << 20,
                ..base.clone()
            },
        ),
        (
            "+ 100k rows/page, zstd 9",
            WriteOptions {
                float_dictionary: false,
                time_encoding: Encoding::PLAIN,
                data_page_rows: 100_000,
                data_page_bytes: 8 << 20,
                zstd_level: 9,
                ..base.clone()
            },
        ),
        (
            "+ 100k rows/page, zstd 15",
            WriteOptions {
                float_dictionary: false,
                time_encoding: Encoding::PLAIN,
                data_page_rows: 100_000,
                data_page_bytes: 8 << 20,
                zstd_level: 15,
                ..base.clone()
            },
        ),
        (
            "+ 100k rows/page, zstd 19",
            WriteOptions {
                float_dictionary: false,
                time_encoding: Encoding::PLAIN,
                data_page_rows: 100_000,
                data_page_bytes: 8 << 20,
                zstd_level: 19,
                ..base.clone()
            },
        ),
    ];
    for (name, options) in variants {
        let props = options.properties(table, Vec::new()).unwrap();
        let start = std::time::Instant::now();
        let mut out = Vec::new();
        let mut writer = ArrowWriter::try_new(&mut out, batches[0].schema(), Some(props)).unwrap();
        for b in &batches {
            writer.write(b).unwrap();
        }
        writer.close().unwrap();
        println!(
            "{name:32} {:.3} bytes/sample  ({:.1} M rows/s)",
            out.len() as f64 / rows as f64,
            rows as f64 / start.elapsed().as_secs_f64() / 1e6
        );
    }
}
