//! Keeping the agent a small resident under glibc's allocator.
//!
//! glibc gives each thread that allocates its own arena, up to eight per core,
//! and keeps freed memory in them; with a dozen threads the agent's resident
//! size drifted up to the sum of every arena's high-water mark. Two arenas are
//! plenty for threads that mostly sleep, and after a publish or a merge (the
//! only moments that allocate megabytes) the freed memory goes back to the OS.

/// Caps glibc's malloc arenas; call before starting threads.
pub fn limit_arenas() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only changes allocator tuning; called before threads start.
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, 2);
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
