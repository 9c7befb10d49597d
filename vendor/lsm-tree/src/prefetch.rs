// Copyright (c) 2024-present, fjall-rs
// This source code is licensed under both the Apache 2.0 and MIT License
// (found in the LICENSE-* files in the repository)

//! eventfold patch: a hint to the CPU to load a cache line (no effect on other
//! architectures).

/// Starts loading the cache line of `ptr` into every cache level, without waiting for it.
/// A hint only: it never faults, whatever `ptr` is.
#[inline]
pub fn read(ptr: *const u8) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: `prefetcht0` is a hint that does not access memory architecturally (it
    // cannot fault), and SSE, which it needs, is part of every x86_64 target.
    unsafe {
        core::arch::x86_64::_mm_prefetch::<{ core::arch::x86_64::_MM_HINT_T0 }>(ptr.cast());
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = ptr;
}
