//! Process-wide settings a service binary applies at start-up.

/// Turns transparent huge pages off for this process (Linux; elsewhere it does nothing).
///
/// mimalloc asks the kernel for huge pages (`MADV_HUGEPAGE`) on the memory it maps. A
/// service filling memtables, caches and per-entity state takes fresh memory all the time,
/// and the first touch of each 2 MiB huge page has the kernel zero all of it inside one
/// page fault, on whatever thread touched it, which showed in the p99 latency
/// (bench/FINDINGS.md, "Moved from code comments"). With 4 KiB pages the zeroing is
/// spread thinly over many small faults.
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
