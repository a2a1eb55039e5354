//! Cost of one collect through the public collector interface, as the
//! runtime calls it: the InfiniBand collector over the fixture node's nine
//! ports, the cgroups collector over each fixture tree and this machine's own
//! cgroups, and, when they exist, over real cgroups made for the purpose
//! under `<hierarchy>/vtax-bench/jobNN` (as `bench/agent/` makes them).
//!
//! `cargo bench -p vtax-collectors --bench collect [-- --ticks N]`
//!
//! The figures go to `docs/benchmarks.md` with this command.

use std::path::Path;
use std::time::{Duration, Instant};

use vtax_collectors::{Availability, Collector, CollectorsConfig, Roots};

fn ticks() -> i64 {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == "--ticks")
        .and_then(|i| args.get(i + 1))
        .map(|v| v.parse().expect("--ticks takes a number"))
        .unwrap_or(2000)
}

fn fixture(node: &str) -> Roots {
    let base = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/fixtures")
        .join(node);
    Roots {
        procfs: base.join("proc"),
        sysfs: base.join("sys"),
        ..Roots::default()
    }
}

/// The mean time of one collect over `ticks` collects after a first one,
/// and the rows of the last; `None` where the source is not there.
fn time_collects(mut collector: Box<dyn Collector>, ticks: i64) -> Option<(Duration, usize)> {
    if !matches!(collector.probe(), Availability::Available(_)) {
        return None;
    }
    let rows = |batches: Vec<vtax_store::Batch>| batches.iter().map(|b| b.len()).sum::<usize>();
    let mut last = rows(collector.collect(0).ok()?);
    let start = Instant::now();
    for tick in 1..=ticks {
        last = rows(std::hint::black_box(collector.collect(tick).ok()?));
    }
    Some((start.elapsed() / ticks as u32, last))
}

fn main() {
    let ticks = ticks();
    let config = CollectorsConfig::default();
    let infiniband = config
        .build("infiniband", &fixture("baremetal-node"))
        .expect("infiniband is registered");
    if let Some((per, rows)) = time_collects(infiniband, ticks) {
        println!("infiniband, fixture baremetal-node: {rows} rows, one collect {per:?}");
    }
    let mut cases: Vec<(&str, Roots, CollectorsConfig)> = ["vm-node", "baremetal-node", "k8s-node"]
        .into_iter()
        .map(|node| (node, fixture(node), CollectorsConfig::default()))
        .collect();
    cases.push((
        "this machine",
        Roots::default(),
        CollectorsConfig::default(),
    ));
    let mut bench_cgroups = CollectorsConfig::default();
    bench_cgroups.cgroups.include = vec!["^/vtax-bench/job".into()];
    cases.push((
        "this machine's vtax-bench/ cgroups",
        Roots::default(),
        bench_cgroups,
    ));
    for (name, roots, config) in cases {
        let cgroups = config
            .build("cgroups", &roots)
            .expect("cgroups is registered");
        match time_collects(cgroups, ticks) {
            Some((per, rows)) if rows > 0 => {
                println!("cgroups, {name}: {rows} rows, one collect {per:?}")
            }
            _ => println!("cgroups, {name}: no cgroups to read"),
        }
    }
}
