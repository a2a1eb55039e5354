//! Store benchmark: ingest through WAL and Parquet encoding, one-series reads,
//! and a full-table single-column scan, on a GPU-node-shaped narrow table.
//!
//! `cargo bench -p vtax-store --bench store -- [--series N] [--seconds N] [--dir DIR]`
//!
//! Everything runs on one thread, so samples per second are per core. The figures
//! go to `docs/benchmarks.md` with this command.

use std::time::Instant;

use vtax_store::batch::Values;
use vtax_store::{tables, BatchBuilder, Catalog, ScanRequest, Store, StoreOptions, Value, HOUR_US};

/// One-series reads measured per layout.
const READS: usize = 200;

/// 2025-11-21T00:00:00Z.
const T0: i64 = 1_763_683_200_000_000;

fn arg(name: &str, default: u64) -> u64 {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .map(|v| v.parse().expect("a number"))
        .unwrap_or(default)
}

fn cpu_seconds() -> f64 {
    // SAFETY: getrusage fills the struct we pass.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut usage) };
    let tv = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    tv(usage.ru_utime) + tv(usage.ru_stime)
}

/// The series of a GPU node: 8 GPUs × ~40 per-GPU metrics, 8 × 18 NVLink links × 6
/// counters, IB ports, and per-CPU host counters, up to `n`.
fn series(n: usize) -> Vec<(String, String)> {
    let mut out = Vec::new();
    'outer: for round in 0.. {
        for gpu in 0..8 {
            for m in 0..40 {
                out.push((
                    format!("gpu_field_{m}"),
                    format!("gpu=\"{gpu}\",round=\"{round}\""),
                ));
                if out.len() == n {
                    break 'outer;
                }
            }
            for link in 0..18 {
                for c in [
                    "rx_bytes",
                    "tx_bytes",
                    "crc_errors",
                    "replay_errors",
                    "recovery_errors",
                    "state",
                ] {
                    out.push((
                        format!("nvlink_{c}"),
                        format!("gpu=\"{gpu}\",link=\"{link}\",round=\"{round}\""),
                    ));
                    if out.len() == n {
                        break 'outer;
                    }
                }
            }
        }
        for cpu in 0..192 {
            for mode in ["user", "system", "idle", "steal", "irq", "softirq"] {
                out.push((
                    "cpu_seconds".into(),
                    format!("cpu=\"{cpu}\",mode=\"{mode}\",round=\"{round}\""),
                ));
                if out.len() == n {
                    break 'outer;
                }
            }
        }
    }
    out
}

/// Advances each series' value one tick: counters climb, gauges sit on plateaus.
fn next_value(series: usize, tick: u64, state: &mut u64) -> f64 {
    *state ^= *state << 13;
    *state ^= *state >> 7;
    *state ^= *state << 17;
    match series % 4 {
        0 => (tick * (series as u64 % 1000 + 1)) as f64, // counter
        1 => ((tick / 60 + series as u64) % 101) as f64, // utilisation plateau
        2 => 300.0 + (*state % 100_000) as f64 / 1000.0, // power, 3 decimals
        _ => 0.0,                                        // error counter at rest
    }
}

fn main() {
    let n_series = arg("--series", 10_000) as usize;
    let seconds = arg("--seconds", 3_600);
    let dir = tempfile::Builder::new()
        .prefix("vtax-bench")
        .tempdir_in(std::env::temp_dir())
        .unwrap();
    let data_dir = dir.path().to_path_buf();
    let catalog = Catalog::new(tables::BUILTIN).unwrap();
    let mut options = StoreOptions::new(&data_dir);
    options.node = "bench".into();
    options.write.data_page_bytes =
        arg("--page-bytes", options.write.data_page_bytes as u64) as usize;
    options.write.zstd_level = arg("--zstd-level", options.write.zstd_level as u64) as i32;
    options.write.running_page_rows = arg(
        "--running-page-rows",
        options.write.running_page_rows as u64,
    ) as usize;
    let keep = std::env::args().any(|a| a == "--keep");
    let mut store = Store::open(options, catalog.clone()).unwrap();

    let names = series(n_series);
    let mut builder = BatchBuilder::new(&tables::SCRAPED);
    for (metric, labels) in &names {
        builder
            .push(T0, &["", metric, labels], &[Value::F64(0.0)])
            .unwrap();
    }
    let mut batch = builder.finish();
    let mut rng = 0x9e37_79b9_7f4a_7c15u64;

    // Ingest: one batch per tick, as a collector would hand them over.
    let wall = Instant::now();
    let cpu = cpu_seconds();
    for tick in 0..seconds {
        let t = T0 + tick as i64 * 1_000_000 + (rng % 5000) as i64;
        batch.time_us.iter_mut().for_each(|x| *x = t);
        if let Values::F64(values) = &mut batch.fields[0].values {
            for (i, v) in values.iter_mut().enumerate() {
                *v = next_value(i, tick, &mut rng);
            }
        }
        store.append(&batch).unwrap();
        store.tick(t).unwrap();
        // As `vtax run` does every 5 minutes: tiers of the running hour merge.
        if tick % 300 == 299 {
            store.compact(t).unwrap();
        }
    }
    store.flush().unwrap();
    store.compact(T0 + seconds as i64 * 1_000_000 - 1).unwrap();
    let ingest_wall = wall.elapsed().as_secs_f64();
    let ingest_cpu = cpu_seconds() - cpu;
    let samples = n_series as u64 * seconds;
    let bytes: u64 = store.files().map(|f| f.bytes).sum();
    let files = store.files().count();
    println!(
        "ingest: {samples} samples ({n_series} series x {seconds} s) in {ingest_wall:.2} s wall, {ingest_cpu:.2} s CPU \
         (running-hour merges included) = {:.2} M samples/s per core; {files} files, {bytes} bytes, {:.3} bytes/sample",
        samples as f64 / ingest_cpu / 1e6,
        bytes as f64 / samples as f64
    );

    let read_series = |store: &Store, label: &str| {
        let mut latencies = Vec::new();
        for k in 0..READS {
            let (metric, labels) = &names[(k * 7919) % names.len()];
            let request = ScanRequest {
                table: "scraped".into(),
                from_us: Some(T0),
                until_us: Some(T0 + HOUR_US),
                tag_equals: vec![
                    ("metric".into(), metric.clone()),
                    ("labels".into(), labels.clone()),
                ],
                fields: None,
                fields_only: false,
                skip_damaged: false,
            };
            let start = Instant::now();
            let result = store.scan(&request).unwrap();
            latencies.push(start.elapsed());
            assert_eq!(
                result.rows() as u64,
                seconds.min(3600),
                "one row per second of the hour"
            );
        }
        latencies.sort();
        let ms =
            |q: f64| latencies[((READS as f64 * q) as usize).min(READS - 1)].as_secs_f64() * 1e3;
        println!(
            "read one series over one hour ({label}): p50 {:.2} ms, p90 {:.2} ms, p99 {:.2} ms, max {:.2} ms over {READS} series",
            ms(0.5),
            ms(0.9),
            ms(0.99),
            ms(1.0)
        );
    };
    let scan_column = |store: &Store, label: &str| {
        let request = ScanRequest {
            table: "scraped".into(),
            fields: Some(vec!["value".into()]),
            fields_only: true,
            ..Default::default()
        };
        let cpu = cpu_seconds();
        let result = store.scan(&request).unwrap();
        let cpu = cpu_seconds() - cpu;
        assert_eq!(result.rows() as u64, samples);
        println!(
            "full-table single-column scan ({label}): {samples} samples in {cpu:.2} s CPU = {:.1} M samples/s",
            samples as f64 / cpu / 1e6
        );
    };
    read_series(&store, &format!("running hour, {files} files"));
    scan_column(&store, &format!("running hour, {files} files"));

    if std::env::args().any(|a| a == "--skip-compaction") {
        println!("kept {}", dir.keep().display());
        return;
    }
    let start = Instant::now();
    store.compact(T0 + 3 * 24 * HOUR_US).unwrap();
    let compact_s = start.elapsed().as_secs_f64();
    let bytes: u64 = store.files().map(|f| f.bytes).sum();
    let files = store.files().count();
    println!(
        "compaction: {compact_s:.2} s; {files} files, {bytes} bytes, {:.3} bytes/sample",
        bytes as f64 / samples as f64
    );
    read_series(&store, "sealed, one file");
    scan_column(&store, "sealed, one file");
    if keep {
        println!("kept {}", dir.keep().display());
    }
}
