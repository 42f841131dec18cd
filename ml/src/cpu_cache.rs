//! A caching CPU allocator for libtorch (`ml/csrc/cpu_cache.cpp`), installed by `rredcot-worker`
//! at its start. Why: libtorch's CPU allocator takes every tensor's memory from glibc, which maps
//! each block of 32 MiB or more anew and unmaps it when it is freed, so all its pages fault in
//! again on the next use. A decode step over a real vocabulary makes several such tensors (the
//! `[B, V]` logits and the sampler's passes: 58 MB each at 96 rows of Qwen's 151,936 tokens), as do
//! σ scoring and the update; on the CPU most of a rollout's time went to page faults.
//!
//! The cache keeps freed blocks of 1 MiB or more (sizes rounded up to eight classes per power of
//! two) and hands each to the next tensor that fits it with at most a quarter to spare. Before a
//! tensor takes new memory, the blocks kept longest are given back until the cache holds at most
//! its limit; a free only moves a block from a tensor to the cache, so the process never holds
//! more than its tensors' own peak plus the limit (block rounding aside). A tensor's numbers do
//! not depend on where its memory comes from: rollout, segment, score and update write the same
//! bytes with and without the cache (bench/cpu_alloc.sh).
//!
//! `RREDCOT_CPU_CACHE_MB` sets the limit (default: 512, or a sixteenth of the machine's memory
//! if less; 0 = libtorch's own allocator). A warm stage process empties the cache after each
//! instance.

/// The limit in bytes: `RREDCOT_CPU_CACHE_MB`, else the default; `None` for 0 (no cache).
pub fn limit_from_env() -> Result<Option<u64>, String> {
    let mb = match std::env::var("RREDCOT_CPU_CACHE_MB") {
        Err(_) => return Ok(Some(default_limit())),
        Ok(v) => v
            .trim()
            .parse::<u64>()
            .map_err(|_| format!("RREDCOT_CPU_CACHE_MB={v:?}: expected a number of MiB (0 = no cache)"))?,
    };
    Ok((mb > 0).then_some(mb << 20))
}

/// 512 MiB, or a sixteenth of the physical memory where that is less.
fn default_limit() -> u64 {
    // SAFETY: sysconf reads two system constants.
    let (pages, page) = unsafe { (libc::sysconf(libc::_SC_PHYS_PAGES), libc::sysconf(libc::_SC_PAGESIZE)) };
    let sixteenth = if pages > 0 && page > 0 { pages as u64 * page as u64 / 16 } else { u64::MAX };
    sixteenth.min(512 << 20)
}

#[cfg(rredcot_cpu_cache)]
mod ffi {
    extern "C" {
        pub fn rr_cpu_cache_install(limit: u64) -> i32;
        pub fn rr_cpu_cache_release();
        pub fn rr_cpu_cache_stats(hits: *mut u64, misses: *mut u64, evictions: *mut u64, cached_bytes: *mut u64);
    }
}

/// Makes the cache libtorch's CPU allocator, trimmed to `limit` bytes before new memory is taken. Call before the
/// first tensor (tensors made before keep their own allocator, which frees them). False where
/// this build has no cache or libtorch refused it.
pub fn install(limit: u64) -> bool {
    #[cfg(rredcot_cpu_cache)]
    {
        // SAFETY: no pointers; the shim catches every C++ exception.
        unsafe { ffi::rr_cpu_cache_install(limit) == 0 }
    }
    #[cfg(not(rredcot_cpu_cache))]
    {
        let _ = limit;
        false
    }
}

/// How [`install_from_env`] left libtorch's CPU allocator.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Setup {
    /// The cache is libtorch's CPU allocator.
    Installed,
    /// `RREDCOT_CPU_CACHE_MB=0`: libtorch's own, as asked.
    Off,
    /// libtorch's own: this build has no cache or libtorch refused it.
    Unavailable,
}

impl Setup {
    /// The allocator libtorch's CPU tensors come from, as benchmarks record it.
    pub fn allocator(self) -> &'static str {
        match self {
            Setup::Installed => "rredcot cpu_cache",
            Setup::Off | Setup::Unavailable => "libtorch",
        }
    }
}

/// What a process that runs stages does before its first tensor: the cache installed with the
/// limit [`limit_from_env`] reads; `Err` for a bad setting.
pub fn install_from_env() -> Result<Setup, String> {
    Ok(match limit_from_env()? {
        Some(limit) if install(limit) => Setup::Installed,
        Some(_) => Setup::Unavailable,
        None => Setup::Off,
    })
}

/// Frees every cached block.
pub fn release() {
    #[cfg(rredcot_cpu_cache)]
    // SAFETY: no arguments; frees only blocks no tensor holds.
    unsafe {
        ffi::rr_cpu_cache_release()
    }
}

/// Allocations of a cached size served from the cache and not, blocks given back to trim it to
/// its limit, and the bytes it holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Stats {
    pub hits: u64,
    pub misses: u64,
    pub evictions: u64,
    pub cached_bytes: u64,
}

/// The cache's counters (all 0 where this build has none).
pub fn stats() -> Stats {
    let mut s = Stats::default();
    #[cfg(rredcot_cpu_cache)]
    // SAFETY: four valid out-pointers for the duration of the call.
    unsafe {
        ffi::rr_cpu_cache_stats(&mut s.hits, &mut s.misses, &mut s.evictions, &mut s.cached_bytes)
    };
    s
}
