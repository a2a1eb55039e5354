//! A cache canary: how long one dependent load takes over a working set that
//! fits in the last-level cache. Where the PMU is hidden (most VMs), this is
//! the detector's view of memory-bandwidth and cache interference: a
//! neighbour streaming through memory or thrashing the cache evicts the
//! working set, and more of its loads go to DRAM. It costs one or two
//! milliseconds per sample.

use std::time::Instant;

/// Bytes the chase walks: above the per-core L2 of current server CPUs and
/// within their shared L3. Measured on this project's 2-vCPU KVM guest (an
/// EPYC with 32 MiB of L3 shared with other tenants): over 2 MiB a quiet
/// guest already waits ~170 ns a load and a neighbour's stream changed
/// nothing; over 8 MiB a stream or cache-thrash neighbour on the other vCPU
/// raised it from ~190 to ~250 ns (+33%). The canary is 8 MiB of the agent's
/// resident memory; `detect.cache_canary = false` gives it back.
pub const WORKING_SET_BYTES: usize = 8 << 20;
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
    /// Builds the cycle (Sattolo's shuffle over the lines, a fixed seed).
    pub fn new() -> Self {
        let lines = WORKING_SET_BYTES / 64;
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

    #[test]
    fn a_sample_is_a_plausible_load_time() {
        let mut canary = CacheCanary::new();
        let seconds = canary.sample();
        // Between a register move and a page fault.
        assert!(seconds > 1e-10 && seconds < 1e-5, "{seconds}");
    }
}
