//! Seeds the store in DATA_DIR with yesterday's (UTC) 24 hours of the
//! `cgroup` table for 50 cgroups, written with the agent's store options and
//! left as the agent leaves a finished day before its day merge (a file an
//! hour, and the last hour's tail). An agent started on that store merges the
//! day at its first compaction pass: `bench/agent/cpu_vs_node_exporter.py
//! --seed-day` measures its resident peak then. Values are those of
//! `store/examples/merge_memory.rs`: counters with random steps, gauges drawn
//! at random (the hard case for a writer that holds a column).
//!
//! `cargo run --release -p vtax --example seed_day -- DATA_DIR`

use std::time::Duration;

use vtax::config::Config;
use vtax::run::store_options;
use vtax_collectors::cgroups::{CgroupRow, CGROUP};
use vtax_collectors::ticks::now_us;
use vtax_store::{BatchBuilder, Store, DAY_US};

fn main() {
    const SERIES: usize = 50;
    let Some(dir) = std::env::args_os().nth(1) else {
        eprintln!("usage: seed_day DATA_DIR");
        std::process::exit(2);
    };
    let mut config = Config::default();
    config.store.data_dir = Some(dir.into());
    let mut options = store_options(&config);
    // A sync a simulated minute keeps the run short; the rows are the same.
    options.sync_interval = Duration::from_secs(3600);
    let mut store = Store::open(options, vtax::catalog()).expect("open the store");
    let paths: Vec<String> = (0..SERIES)
        .map(|i| format!("/vtax-bench/job{i:02}"))
        .collect();
    let mut state: u64 = 0x2545_f491_4f6c_dd1d;
    let mut random = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    fn unit(bits: u64) -> f64 {
        (bits >> 11) as f64 / (1u64 << 53) as f64
    }
    // A counter moves by a random step, a gauge is drawn afresh.
    fn seconds(random: &mut impl FnMut() -> u64, total: &mut Option<f64>) {
        *total = Some(total.unwrap_or(0.0) + unit(random()) * 0.01);
    }
    fn count(random: &mut impl FnMut() -> u64, total: &mut Option<u64>) {
        *total = Some(total.unwrap_or(0) + random() % 100);
    }
    fn bytes(random: &mut impl FnMut() -> u64) -> Option<u64> {
        Some((1 << 28) + (random() % 4096) * 4096)
    }
    let mut series = vec![CgroupRow::default(); SERIES];
    let yesterday = now_us().div_euclid(DAY_US) * DAY_US - DAY_US;
    for second in 0..86_400i64 {
        let now = yesterday + second * 1_000_000;
        let mut rows = BatchBuilder::new(&CGROUP);
        for (path, row) in paths.iter().zip(&mut series) {
            // Drawn in the table's field order, as merge_memory.rs draws them.
            let r = &mut random;
            seconds(r, &mut row.cpu_usage_seconds);
            seconds(r, &mut row.cpu_user_seconds);
            seconds(r, &mut row.cpu_system_seconds);
            count(r, &mut row.cpu_periods);
            count(r, &mut row.cpu_throttled_periods);
            seconds(r, &mut row.cpu_throttled_seconds);
            row.cpu_quota_cpus = Some(unit(r()));
            row.memory_usage_bytes = bytes(r);
            row.memory_limit_bytes = bytes(r);
            row.memory_anon_bytes = bytes(r);
            row.memory_file_bytes = bytes(r);
            row.memory_kernel_bytes = bytes(r);
            row.memory_slab_bytes = bytes(r);
            row.memory_swap_bytes = bytes(r);
            count(r, &mut row.memory_page_faults);
            count(r, &mut row.memory_major_page_faults);
            count(r, &mut row.memory_max_events);
            count(r, &mut row.memory_oom_events);
            count(r, &mut row.memory_oom_kills);
            seconds(r, &mut row.cpu_pressure_some_seconds);
            seconds(r, &mut row.cpu_pressure_full_seconds);
            seconds(r, &mut row.memory_pressure_some_seconds);
            seconds(r, &mut row.memory_pressure_full_seconds);
            seconds(r, &mut row.io_pressure_some_seconds);
            seconds(r, &mut row.io_pressure_full_seconds);
            let row = CgroupRow {
                path,
                workload: "other",
                ..row.clone()
            };
            rows.push_row(now, &row).expect("a row");
        }
        store.append(&rows.finish()).expect("append");
        if second % 60 == 59 {
            store.sync().expect("sync");
            store.tick(now).expect("tick");
        }
        if second % 300 == 299 {
            store.compact(now).expect("compact");
        }
    }
    store.close().expect("close");
}
