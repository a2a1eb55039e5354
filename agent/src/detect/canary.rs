//! A cache canary: how long one dependent load takes over a working set that
//! fits in the last-level cache. Where the PMU is hidden (most VMs), this is
//! the detector's view of memory-bandwidth and cache interference: a
//! neighbour streaming through memory or thrashing the cache evicts the
//! working set, and more of its loads go to DRAM. It costs one or two
//! milliseconds per sample.

use std::time::Instant;

/// Bytes the chase walks: at or above the per-core L2 of current server CPUs
/// and well within their shared L3, so a neighbour's traffic in the L3
/// evicts it. On this project's 2-vCPU KVM guest (32 MiB of L3 shared with
/// other tenants), `tests::working_set_under_stress` measured 2 MiB moving
/// more under a neighbour's stream or cache thrash (+10% to +29%) than
/// 8 MiB (-4% to +8%): see docs/benchmarks.md. The canary is this much of
/// the agent's resident memory; `detect.cache_canary = false` gives it back.
pub const WORKING_SET_BYTES: usize = 2 << 20;
/// Loads per sample: enough to average out one interrupt, few enough to cost
/// under a millisecond even when every load misses.
const LOADS_PER_SAMPLE: usize = 8192;
/// One slot per 64-byte cache line.
const SLOT_STRIDE: usize = 64 / std::mem::size_of::<u32>();

/// The working set: a single random cycle through every cache line, so the
/// prefetchers cannot guess the next load.
pub struct CacheCanary {
    next: Vec<u32>,
    position: u32,
}

impl CacheCanary {
    /// Builds the cycle over [`WORKING_SET_BYTES`].
    pub fn new() -> Self {
        Self::with_working_set(WORKING_SET_BYTES)
    }

    /// Builds the cycle (Sattolo's shuffle over the lines, a fixed seed) over
    /// `bytes`, rounded down to whole cache lines.
    fn with_working_set(bytes: usize) -> Self {
        let lines = (bytes / 64).max(2);
        let mut order: Vec<u32> = (0..lines as u32).collect();
        let mut state: u64 = 0x9e37_79b9_7f4a_7c15;
        for i in (1..lines).rev() {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            let j = (state % i as u64) as usize;
            order.swap(i, j);
        }
        let mut next = vec![0u32; lines * SLOT_STRIDE];
        for k in 0..lines {
            let from = order[k] as usize;
            let to = order[(k + 1) % lines];
            next[from * SLOT_STRIDE] = to * SLOT_STRIDE as u32;
        }
        CacheCanary { next, position: 0 }
    }

    /// Walks the cycle and returns the mean seconds per load.
    pub fn sample(&mut self) -> f64 {
        let started = Instant::now();
        let mut at = self.position;
        for _ in 0..LOADS_PER_SAMPLE {
            at = self.next[at as usize];
        }
        let elapsed = started.elapsed();
        // Keeps the loads: the position feeds the next sample.
        self.position = std::hint::black_box(at);
        elapsed.as_secs_f64() / LOADS_PER_SAMPLE as f64
    }
}

impl Default for CacheCanary {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_chase_visits_every_line_once_per_cycle() {
        let canary = CacheCanary::new();
        let lines = WORKING_SET_BYTES / 64;
        let mut seen = vec![false; lines];
        let mut at = 0u32;
        for _ in 0..lines {
            let line = at as usize / SLOT_STRIDE;
            assert!(!seen[line], "line {line} visited twice");
            seen[line] = true;
            at = canary.next[at as usize];
        }
        assert_eq!(at, 0, "the walk is one cycle");
        assert!(seen.iter().all(|s| *s));
    }

    /// Mean nanoseconds per load over `seconds` one-a-second samples.
    fn mean_load_ns(canary: &mut CacheCanary, seconds: u32) -> f64 {
        let mut total = 0.0;
        for _ in 0..seconds {
            total += canary.sample();
            std::thread::sleep(std::time::Duration::from_secs(1));
        }
        total / f64::from(seconds) * 1e9
    }

    /// How the working set's size decides what the canary sees: each size
    /// quiet, then beside a `stress-ng` memory stream and a cache thrash on
    /// the last CPU. The figures behind WORKING_SET_BYTES.
    #[test]
    #[ignore = "a measurement, not a test: cargo test --release -p vtax canary::tests::working_set_under_stress -- --ignored --nocapture (needs stress-ng)"]
    fn working_set_under_stress() {
        let last_cpu =
            (std::thread::available_parallelism().map_or(1, |n| n.get()) - 1).to_string();
        let seconds = 12;
        for mib in [2, 8] {
            let mut canary = CacheCanary::with_working_set(mib << 20);
            let quiet = mean_load_ns(&mut canary, seconds);
            let mut beside = Vec::new();
            for stressor in ["--stream", "--cache"] {
                let mut neighbour = std::process::Command::new("stress-ng")
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
                beside.push((stressor, mean_load_ns(&mut canary, seconds)));
                let _ = neighbour.wait();
            }
            println!(
                "{mib} MiB: quiet {quiet:.0} ns/load; {}",
                beside
                    .iter()
                    .map(|(s, ns)| format!(
                        "beside {s} {ns:.0} ns/load ({:+.0}%)",
                        (ns / quiet - 1.0) * 100.0
                    ))
                    .collect::<Vec<_>>()
                    .join("; ")
            );
        }
    }

    #[test]
    fn a_sample_is_a_plausible_load_time() {
        let mut canary = CacheCanary::new();
        let seconds = canary.sample();
        // Between a register move and a page fault.
        assert!(seconds > 1e-10 && seconds < 1e-5, "{seconds}");
    }
}
