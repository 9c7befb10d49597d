//! Process-wide settings a service binary applies at start-up.

/// Turns transparent huge pages off for this process (Linux; elsewhere it does nothing).
///
/// mimalloc asks the kernel for huge pages (`MADV_HUGEPAGE`) on the memory it maps. A
/// service filling memtables, caches and per-entity state takes fresh memory all the time,
/// and the first touch of each 2 MiB huge page has the kernel zero all of it inside one
/// page fault, on whatever thread touched it: measured on the project's 2-core VM with the
/// shop at 64 HTTP clients, page faults were about 19% of the service's CPU samples
/// (`perf record`), and the p99 latency was 21.6-22.9 ms with huge pages against
/// 10.4-12.4 ms without, at about the same throughput. With 4 KiB pages the zeroing is spread thinly over
/// many small faults.
///
/// Call it first thing in `main`: it applies to the memory touched afterwards (also to
/// regions mapped before). Children inherit it. An error (an old kernel) is returned for
/// the caller to log; the process works either way.
pub fn disable_transparent_huge_pages() -> std::io::Result<()> {
    #[cfg(target_os = "linux")]
    {
        nix::sys::prctl::set_thp_disable(true).map_err(std::io::Error::from)
    }
    #[cfg(not(target_os = "linux"))]
    {
        Ok(())
    }
}
