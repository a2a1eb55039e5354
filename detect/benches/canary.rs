//! What the cache canary's working set and loads per sample decide (the
//! figures behind `WORKING_SET_BYTES` and `LOADS_PER_SAMPLE` in
//! `src/canary.rs`): canaries of each shape sampled in turn once a second,
//! quiet, then beside a `stress-ng` memory stream and a cache thrash on the
//! last CPU. Per shape: the median ns/load, its shift beside each stressor,
//! the quiet samples' spread (MAD), the shift in those MADs (what the
//! detector's robust z sees of one second), and the CPU a sample costs.
//!
//! `cargo bench -p vtax-detect --bench canary` (needs stress-ng; about three
//! minutes).

use vtax_detect::canary::CacheCanary;

fn median(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

fn main() {
    let last_cpu = (std::thread::available_parallelism().map_or(1, |n| n.get()) - 1).to_string();
    let seconds = 20;
    let shapes = [
        (2048usize, 8192usize),
        (512, 2048),
        (1024, 4096),
        (1024, 2048),
    ];
    let mut canaries: Vec<CacheCanary> = shapes
        .iter()
        .map(|&(kib, loads)| CacheCanary::with_working_set(kib << 10, loads))
        .collect();
    // samples[phase][shape]: ns per load, one a second.
    let mut samples = vec![vec![Vec::new(); shapes.len()]; 3];
    for (phase, stressor) in [None, Some("--stream"), Some("--cache")].iter().enumerate() {
        let neighbour = stressor.map(|stressor| {
            let child = std::process::Command::new("stress-ng")
                // It ends on its own just after the measurement: killing
                // stress-ng's parent would leave its worker running.
                .args([
                    stressor,
                    "1",
                    "--taskset",
                    &last_cpu,
                    "-t",
                    &(seconds + 2).to_string(),
                ])
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null())
                .spawn()
                .expect("stress-ng is installed");
            std::thread::sleep(std::time::Duration::from_secs(1));
            child
        });
        for _ in 0..seconds {
            for (k, canary) in canaries.iter_mut().enumerate() {
                samples[phase][k].push(canary.sample() * 1e9);
            }
            std::thread::sleep(std::time::Duration::from_secs(1));
        }
        if let Some(mut child) = neighbour {
            let _ = child.wait();
        }
    }
    for (k, &(kib, loads)) in shapes.iter().enumerate() {
        let quiet = median(&mut samples[0][k].clone());
        let mut deviations: Vec<f64> = samples[0][k].iter().map(|ns| (ns - quiet).abs()).collect();
        let mad = median(&mut deviations).max(1e-3);
        let shifts: Vec<String> = ["stream", "cache"]
            .iter()
            .enumerate()
            .map(|(i, name)| {
                let beside = median(&mut samples[i + 1][k].clone());
                format!(
                    "{name} {beside:.0} ({:+.0}%, {:+.1} MAD)",
                    (beside / quiet - 1.0) * 100.0,
                    (beside - quiet) / mad
                )
            })
            .collect();
        println!(
            "{kib} KiB x {loads} loads: quiet {quiet:.0} ns/load (MAD {mad:.1}), {:.0} us a sample; beside {}",
            quiet * loads as f64 / 1e3,
            shifts.join(", ")
        );
    }
}
