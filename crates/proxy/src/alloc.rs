//! Allocator settings for the forwarding hot path.
//!
//! Every READ reply and WRITE call carries up to 1 MiB, so a busy proxy
//! allocates and frees megabyte buffers thousands of times a second. glibc's
//! defaults serve those from fresh `mmap`s (or trim them back to the kernel
//! on free), so each call pays for page faults on every page it touches: a
//! third of the proxy's CPU in the throughput benchmark. Keeping such buffers
//! on the heap and not trimming it makes the memory reusable instead.

/// Buffers up to this size come from the heap, not from their own `mmap`.
const MMAP_THRESHOLD: i32 = 8 << 20;
/// Free heap memory above this much is handed back to the kernel.
const TRIM_THRESHOLD: i32 = 128 << 20;

/// Applies the settings; call once at start, before other threads run.
pub fn tune_for_large_buffers() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only changes allocator parameters; it is called before
    // the runtime starts other threads and its arguments are valid options.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, MMAP_THRESHOLD);
        libc::mallopt(libc::M_TRIM_THRESHOLD, TRIM_THRESHOLD);
    }
}
