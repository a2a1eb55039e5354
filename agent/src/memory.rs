//! Keeping the agent a small resident under glibc's allocator.
//!
//! glibc gives each thread that allocates its own arena, up to eight per core,
//! and keeps freed memory in them; with a dozen threads the agent's resident
//! size drifted up to the sum of every arena's high-water mark. Two arenas are
//! plenty for threads that mostly sleep, and after a publish or a merge (the
//! only moments that allocate megabytes) the freed memory goes back to the OS.
//!
//! glibc also raises its mmap threshold to the size of each mapped block freed,
//! up to 32 MiB. A publish or a merge frees blocks of 128 KiB to 1 MiB by the
//! thousand (ZSTD's workspaces, one per column chunk; growing buffers),
//! so after the first one every such block comes from the heap, where the
//! holes they leave keep the heap large until the next trim. Pinned at glibc's
//! starting value, they are mapped and unmapped whole: about 1 MiB less
//! anonymous memory at a day merge's peak and between merges, for up to 1.3 s
//! more CPU per day merge (the kernel zeroing fresh pages; `docs/benchmarks.md`,
//! glibc's mmap threshold pinned, measured by `bench/agent/day_merge_peak.py`).

/// glibc's starting mmap threshold, kept for the agent's lifetime.
pub const MMAP_THRESHOLD_BYTES: i32 = 128 * 1024;

/// Caps glibc's malloc arenas and pins its mmap threshold; call before
/// starting threads.
pub fn tune_allocator() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only changes allocator tuning; called before threads start.
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, 2);
        libc::mallopt(libc::M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES);
    }
}

/// Returns freed heap memory to the OS after a burst of allocation.
pub fn release_free_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only releases memory the allocator holds free.
    unsafe {
        libc::malloc_trim(0);
    }
}

#[cfg(all(test, target_os = "linux", target_env = "gnu"))]
mod tests {
    const CHILD: &str = "VTAX_ALLOCATOR_TEST_CHILD";

    /// Bytes glibc holds in mapped blocks, across arenas.
    fn mapped_bytes() -> usize {
        // SAFETY: mallinfo2 only reads the allocator's counters.
        unsafe { libc::mallinfo2().hblkhd }
    }

    /// Frees a mapped 512 KiB block, then holds a 160 KiB one: whether that one
    /// was mapped too, or came from the heap.
    fn mid_sized_block_is_mapped_after_a_larger_one_is_freed() -> bool {
        drop(std::hint::black_box(vec![1u8; 512 * 1024]));
        let before = mapped_bytes();
        let block = std::hint::black_box(vec![1u8; 160 * 1024]);
        let mapped = mapped_bytes().saturating_sub(before) >= block.len();
        drop(block);
        mapped
    }

    #[test]
    fn a_pinned_threshold_keeps_mapping_blocks_glibc_would_put_on_the_heap() {
        // The threshold is process-wide and other tests' threads move the
        // counters, so each case runs in a child process of this test binary.
        if let Some(case) = std::env::var_os(CHILD) {
            if case == "tuned" {
                super::tune_allocator();
            }
            let mapped = mid_sized_block_is_mapped_after_a_larger_one_is_freed();
            std::process::exit(if mapped { 10 } else { 20 });
        }
        let run = |case: &str| {
            std::process::Command::new(std::env::current_exe().unwrap())
                .args([
                    "--exact",
                    "memory::tests::a_pinned_threshold_keeps_mapping_blocks_glibc_would_put_on_the_heap",
                    "--test-threads=1",
                ])
                .env(CHILD, case)
                .output()
                .unwrap()
                .status
                .code()
        };
        assert_eq!(run("tuned"), Some(10), "mapped with the threshold pinned");
        assert_eq!(
            run("glibc default"),
            Some(20),
            "glibc's own threshold rose past it: from the heap"
        );
    }
}
