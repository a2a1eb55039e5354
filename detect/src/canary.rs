//! A cache canary: how long one dependent load takes over a working set that
//! fits in the last-level cache. Where the PMU is hidden (most VMs), this is
//! the detector's view of memory-bandwidth and cache interference: a
//! neighbour streaming through memory or thrashing the cache evicts the
//! working set, and more of its loads go to DRAM. It costs about 0.3 ms
//! of CPU per sample.

use std::time::Instant;

use super::baseline::median_in_place;

/// Bytes the chase walks, and loads per sample: a sample walks a quarter of
/// the set, so each line is revisited every 4 s, long enough for a
/// neighbour's traffic in the shared cache to evict it and short enough that
/// a quiet host leaves some of it there. What matters is that revisit time,
/// not the size: a 2 MiB set walked 2048 loads at a time (revisited every
/// 16 s) was evicted quiet or not and saw no neighbour. On this project's
/// 2-vCPU KVM guest, `tests::working_set_under_stress` measured 512 KiB at
/// 2048 loads shifting as far from its quiet median, in quiet MADs, beside a
/// `stress-ng` stream or cache thrash as 2 MiB at 8192 loads (+2.8 to +6.6
/// against +0.1 to +4.0), for a quarter of the CPU (0.3 ms a sample against
/// 1.3 ms) and of the memory: see docs/benchmarks.md.
/// `detect.cache_canary = false` gives both back.
pub const WORKING_SET_BYTES: usize = 512 << 10;
/// See [`WORKING_SET_BYTES`].
const LOADS_PER_SAMPLE: usize = 2048;
/// One slot per 64-byte cache line.
const SLOT_STRIDE: usize = 64 / std::mem::size_of::<u32>();
/// A sample is timed in this many chunks and reads their median. A vCPU the
/// host preempts for a few milliseconds inside a 0.3 ms sample would make the
/// whole sample read ten times slower: that is the host's scheduler, not the
/// cache. It lands in one chunk, and the median passes over it, while a
/// neighbour evicting the working set slows every chunk.
const CHUNKS_PER_SAMPLE: usize = 8;

/// The working set: a single random cycle through every cache line, so the
/// prefetchers cannot guess the next load.
pub struct CacheCanary {
    next: Vec<u32>,
    position: u32,
    loads_per_sample: usize,
}

impl CacheCanary {
    /// Builds the cycle over [`WORKING_SET_BYTES`].
    pub fn new() -> Self {
        Self::with_working_set(WORKING_SET_BYTES, LOADS_PER_SAMPLE)
    }

    /// Builds the cycle (Sattolo's shuffle over the lines, a fixed seed) over
    /// `bytes`, rounded down to whole cache lines, walked `loads_per_sample`
    /// loads at a time.
    pub fn with_working_set(bytes: usize, loads_per_sample: usize) -> Self {
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
        CacheCanary {
            next,
            position: 0,
            loads_per_sample: loads_per_sample.max(1),
        }
    }

    /// Walks the cycle and returns the seconds per load: the median of its
    /// chunks' means (see [`CHUNKS_PER_SAMPLE`]).
    pub fn sample(&mut self) -> f64 {
        let chunk_loads = (self.loads_per_sample / CHUNKS_PER_SAMPLE).max(1);
        let mut per_load = [0.0; CHUNKS_PER_SAMPLE];
        let mut at = self.position;
        for slot in per_load.iter_mut() {
            let started = Instant::now();
            for _ in 0..chunk_loads {
                at = self.next[at as usize];
            }
            // Keeps the loads inside the timed span: the position feeds the
            // next chunk.
            at = std::hint::black_box(at);
            *slot = started.elapsed().as_secs_f64() / chunk_loads as f64;
        }
        self.position = at;
        median_in_place(&mut per_load)
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
    fn a_preempted_chunk_does_not_move_a_sample() {
        let quiet = [
            160e-9, 158e-9, 162e-9, 161e-9, 159e-9, 163e-9, 160e-9, 161e-9,
        ];
        let mut chunks = quiet;
        let undisturbed = median_in_place(&mut chunks);
        // A 3 ms preemption inside one 256-load chunk: 12 µs a load there.
        let mut preempted = quiet;
        preempted[3] = 3e-3 / 256.0;
        assert_eq!(median_in_place(&mut preempted), undisturbed);
        // A neighbour evicting the set slows every chunk: the sample moves.
        let mut evicted = quiet.map(|v| v * 1.3);
        assert!(median_in_place(&mut evicted) > 1.25 * undisturbed);
    }

    #[test]
    fn a_sample_reads_a_plausible_load_time() {
        let mut canary = CacheCanary::new();
        let per_load = canary.sample();
        // From an L1 hit to a DRAM miss on a loaded host: 0.5 ns to 5 µs.
        assert!((0.5e-9..5e-6).contains(&per_load), "{per_load}");
    }

    #[test]
    fn a_sample_is_a_plausible_load_time() {
        let mut canary = CacheCanary::new();
        let seconds = canary.sample();
        // Between a register move and a page fault.
        assert!(seconds > 1e-10 && seconds < 1e-5, "{seconds}");
    }
}
