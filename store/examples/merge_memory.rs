//! Resident memory of publishing and compaction, the way the agent drives them:
//! a cgroup-shaped table (2 tags, 24 fields) of `--series` rows a second,
//! appended second by second over `--hours` simulated hours, with the agent's
//! write options, `tick` every minute and `compact` every five. Before each
//! compaction the process's peak (`VmHWM`) is reset, so each line is what that
//! pass alone added to resident memory.
//!
//! `cargo run --release -p vtax-store --example merge_memory -- [--series 50] [--hours 24] [--page-rows N] [--row-group-rows N] [--encoding-sample-bytes N] [--merge-inputs N] [--dir DIR]`
//!
//! Figures go to `docs/benchmarks.md` with this command.

use std::time::{Duration, Instant};

use vtax_store::{
    BatchBuilder, Catalog, FieldDef, FieldType, Store, StoreOptions, TableDef, TagDef, Unit, Value,
    HOUR_US,
};

/// 2025-11-21T00:00:00Z.
const T0: i64 = 1_763_683_200_000_000;

macro_rules! fields {
    ($($name:literal => $ty:ident $unit:ident $kind:ident),* $(,)?) => {
        &[$(FieldDef::$kind($name, FieldType::$ty, Unit::$unit, "synthetic")),*]
    };
}

/// The shape of the agent's `cgroup` table: counters of CPU time, byte gauges
/// and pressure ratios.
static CGROUP_LIKE: TableDef = TableDef {
    name: "cgroup_like",
    help: "Synthetic rows shaped like the agent's cgroup table.",
    tags: &[
        TagDef {
            name: "path",
            help: "cgroup path",
        },
        TagDef {
            name: "workload",
            help: "kind",
        },
    ],
    fields: fields![
        "usage_seconds" => F64 Seconds counter, "user_seconds" => F64 Seconds counter,
        "system_seconds" => F64 Seconds counter, "throttled_seconds" => F64 Seconds counter,
        "periods" => U64 None counter, "throttled_periods" => U64 None counter,
        "cpu_pressure_some_seconds" => F64 Seconds counter, "cpu_pressure_full_seconds" => F64 Seconds counter,
        "memory_bytes" => U64 Bytes gauge, "memory_limit_bytes" => U64 Bytes gauge,
        "anon_bytes" => U64 Bytes gauge, "file_bytes" => U64 Bytes gauge,
        "kernel_bytes" => U64 Bytes gauge, "shmem_bytes" => U64 Bytes gauge,
        "swap_bytes" => U64 Bytes gauge, "oom_kills" => U64 None counter,
        "memory_pressure_some_seconds" => F64 Seconds counter, "memory_pressure_full_seconds" => F64 Seconds counter,
        "io_pressure_some_seconds" => F64 Seconds counter, "io_pressure_full_seconds" => F64 Seconds counter,
        "pgfault" => U64 None counter, "pgmajfault" => U64 None counter,
        "cpu_quota_ratio" => F64 Ratio gauge, "procs" => I64 None gauge,
    ],
    exported: false,
};

fn arg(name: &str) -> Option<String> {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .cloned()
}

fn status_kib(key: &str) -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").expect("procfs");
    status
        .lines()
        .find_map(|l| l.strip_prefix(key)?.strip_prefix(':'))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

fn reset_peak() {
    // Writing 5 to clear_refs resets VmHWM to the current resident size.
    std::fs::write("/proc/self/clear_refs", "5").expect("procfs clear_refs");
}

fn trim() {
    // The agent returns freed memory after every publish and merge (agent/src/memory.rs).
    // SAFETY: malloc_trim only releases memory the allocator holds free.
    unsafe {
        libc::malloc_trim(0);
    }
}

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
}

fn main() {
    let series: usize = arg("--series").map_or(50, |v| v.parse().expect("a number"));
    let hours: i64 = arg("--hours").map_or(24, |v| v.parse().expect("a number"));
    let dir = arg("--dir").map_or_else(
        || std::env::temp_dir().join(format!("vtax-merge-memory-{}", std::process::id())),
        std::path::PathBuf::from,
    );
    let _ = std::fs::remove_dir_all(&dir);

    let mut options = StoreOptions::new(&dir);
    options.node = "bench".into();
    // What agent/src/run.rs and agent/src/config.rs set; the flags try others.
    options.write.data_page_rows =
        arg("--page-rows").map_or(16 * 1024, |v| v.parse().expect("a number"));
    options.max_buffered_bytes = 2 << 20;
    options.write.encoding_sample_bytes =
        arg("--encoding-sample-bytes").map_or(256 << 10, |v| v.parse().expect("a number"));
    options.write.row_group_rows =
        arg("--row-group-rows").map_or(128 << 10, |v| v.parse().expect("a number"));
    options.max_merge_inputs = arg("--merge-inputs").map_or(8, |v| v.parse().expect("a number"));
    options.sync_interval = Duration::from_secs(3600);
    let catalog = Catalog::new(&[&CGROUP_LIKE]).expect("catalog");
    let mut store = Store::open(options, catalog).expect("open store");

    let paths: Vec<String> = (0..series)
        .map(|i| format!("/system.slice/vtax-bench-{i}.service"))
        .collect();
    let mut rng = Rng(0x2545_f491_4f6c_dd1d);
    let mut counters = vec![[0f64; 24]; series];
    let started = Instant::now();
    let end_us = T0 + hours * HOUR_US;
    // Past the last hour's publish grace and the next compaction pass after it.
    let stop_us = end_us + store.options().publish_grace.as_micros() as i64 + 600_000_000;
    let mut passes: Vec<(u64, i64)> = Vec::new();
    let baseline_kib = status_kib("VmRSS");
    let mut second = 0i64;
    let mut publish_peak_kib = 0;
    loop {
        let now = T0 + second * 1_000_000;
        if now < end_us {
            let mut rows = BatchBuilder::new(&CGROUP_LIKE);
            for (i, path) in paths.iter().enumerate() {
                let c = &mut counters[i];
                let mut values = Vec::with_capacity(24);
                for (f, field) in CGROUP_LIKE.fields.iter().enumerate() {
                    let value = match (field.ty, field.kind) {
                        (FieldType::F64, vtax_store::MetricKind::Counter) => {
                            c[f] += rng.unit() * 0.01;
                            Value::F64(c[f])
                        }
                        (FieldType::F64, _) => Value::F64(rng.unit()),
                        (_, vtax_store::MetricKind::Counter) => {
                            c[f] += (rng.next() % 100) as f64;
                            Value::U64(c[f] as u64)
                        }
                        (FieldType::U64, _) => Value::U64((1 << 28) + (rng.next() % 4096) * 4096),
                        _ => Value::I64((rng.next() % 8) as i64),
                    };
                    values.push(value);
                }
                rows.push(now, &[path, "service"], &values).expect("row");
            }
            store.append(&rows.finish()).expect("append");
        }
        if second % 60 == 0 {
            // The agent syncs the WAL every second; every minute keeps the
            // simulation quick and the WAL's buffer at a minute of rows.
            store.sync().expect("sync");
            reset_peak();
            let before = status_kib("VmRSS");
            let files_before = store.stats().files_published;
            store.tick(now).expect("tick");
            trim();
            if store.stats().files_published > files_before {
                let added = status_kib("VmHWM").saturating_sub(before);
                publish_peak_kib = publish_peak_kib.max(added);
            }
        }
        if second % 300 == 0 {
            reset_peak();
            let before = status_kib("VmRSS");
            let merges = store.compact(now).expect("compact");
            trim();
            if merges > 0 {
                let added = status_kib("VmHWM").saturating_sub(before);
                passes.push((added, now));
            }
        }
        if now >= stop_us {
            break;
        }
        second += 1;
    }
    let files = store.files().count();
    let bytes = store.table_bytes();
    store.close().expect("close");
    println!(
        "{series} series x 24 fields, {hours} h simulated in {:.0} s; {files} file(s) left, {bytes} bytes; resident before any merge {:.1} MiB",
        started.elapsed().as_secs_f64(),
        baseline_kib as f64 / 1024.0
    );
    println!(
        "publishing buffered rows: largest rise of the peak over resident +{:.1} MiB",
        publish_peak_kib as f64 / 1024.0
    );
    // The pass at five past an hour seals the hour before; the one after the
    // last hour also merges the day; the others merge the running hour's parts.
    let mut by_kind: std::collections::BTreeMap<&str, u64> = Default::default();
    for (added, at) in &passes {
        let secs = (at - T0) / 1_000_000;
        let kind = if *at >= end_us {
            "day merge (and the last hour's seal)"
        } else if secs % 3600 == 300 {
            "sealing an hour"
        } else {
            "running-hour merge"
        };
        let peak = by_kind.entry(kind).or_default();
        *peak = (*peak).max(*added);
    }
    println!("compaction passes, largest rise of the peak over resident by kind:");
    for (kind, added) in &by_kind {
        println!("  {kind}: +{:.1} MiB", *added as f64 / 1024.0);
    }
    let _ = std::fs::remove_dir_all(&dir);
}
