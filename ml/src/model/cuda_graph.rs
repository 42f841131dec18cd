//! CUDA graphs for the decode loop ([`super::static_decode`]): a step's kernels captured once
//! and replayed, one launch per step. tch has no binding for `at::cuda::CUDAGraph`, so a small
//! C++ shim (`ml/csrc/cuda_graph.cpp`) wraps it; ml/build.rs compiles it when the build asks
//! (`RREDCOT_CUDA_GRAPHS=1`, as `bench/gpu_bundle.sh` does) against a CUDA build of libtorch. In
//! every other build [`AVAILABLE`] is false and the decode runs its steps eagerly; in such a
//! build the decode uses a graph when `RREDCOT_DECODE_GRAPHS=1` (opt-in until it has run on a GPU).
//!
//! As `torch.cuda.graph` does, everything from the warm-up to the last replay runs on a side
//! stream (capture is not allowed on the default one, and libraries set up their per-stream
//! state during the warm-up, outside the capture); the caller's stream waits for the side
//! stream's work when the runner finishes.

use super::error::{ModelError, Result};

/// Whether this build can capture CUDA graphs.
pub const AVAILABLE: bool = cfg!(rredcot_cuda_graphs);

/// Eager steps before the capture.
pub const GRAPH_WARMUP: usize = 2;

thread_local! {
    /// Graphs captured on this thread so far: how a test tells that its decode replayed one
    /// rather than running eagerly (a build or device without graphs falls back without a word).
    /// Per thread, so tests running side by side do not count each other's.
    static CAPTURES: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// How many decode-step graphs this thread has captured.
pub fn captures() -> usize {
    CAPTURES.with(|c| c.get())
}

#[cfg(rredcot_cuda_graphs)]
mod ffi {
    use std::ffi::{c_char, c_void, CStr};

    extern "C" {
        pub fn rr_graph_new() -> *mut c_void;
        pub fn rr_graph_enter(g: *mut c_void) -> i32;
        pub fn rr_graph_capture_begin(g: *mut c_void) -> i32;
        pub fn rr_graph_capture_end(g: *mut c_void) -> i32;
        pub fn rr_graph_replay(g: *mut c_void) -> i32;
        pub fn rr_graph_exit(g: *mut c_void) -> i32;
        pub fn rr_graph_free(g: *mut c_void);
        pub fn rr_empty_cache() -> i32;
        pub fn rr_memory_reserved() -> i64;
        fn rr_graph_last_error() -> *const c_char;
    }

    /// The shim's message for the last call that failed on this thread.
    pub fn last_error() -> String {
        // SAFETY: the shim returns a NUL-terminated thread-local string that lives until the
        // next failing call on this thread; it is copied at once.
        unsafe { CStr::from_ptr(rr_graph_last_error()) }.to_string_lossy().into_owned()
    }
}

/// Gives the CUDA caching allocator's unused blocks back to the driver
/// (`torch.cuda.empty_cache()`): true when done, false in a build without the shim or on failure.
pub fn empty_cache() -> bool {
    #[cfg(rredcot_cuda_graphs)]
    {
        // SAFETY: no arguments; the shim catches every C++ exception.
        let rc = unsafe { ffi::rr_empty_cache() };
        if rc != 0 {
            tracing::warn!("emptying the CUDA cache: {}", ffi::last_error());
        }
        rc == 0
    }
    #[cfg(not(rredcot_cuda_graphs))]
    false
}

/// Bytes the CUDA caching allocator holds from the driver on the current device
/// (`torch.cuda.memory_reserved()`): `None` in a build without the shim or on failure.
pub fn memory_reserved() -> Option<i64> {
    #[cfg(rredcot_cuda_graphs)]
    {
        // SAFETY: no arguments; the shim catches every C++ exception.
        let bytes = unsafe { ffi::rr_memory_reserved() };
        if bytes < 0 {
            tracing::warn!("reading the CUDA allocator's reserved bytes: {}", ffi::last_error());
        }
        (bytes >= 0).then_some(bytes)
    }
    #[cfg(not(rredcot_cuda_graphs))]
    None
}

/// Runs decode steps: eagerly, or (with a graph) [`GRAPH_WARMUP`] eagerly, then one captured
/// and replayed from then on. The step's result must be the same tensor at every replay (it is:
/// the graph's memory), so the runner hands out copies.
pub struct Runner {
    #[cfg(rredcot_cuda_graphs)]
    graph: Option<Graph>,
    /// The captured step's result.
    #[cfg_attr(not(rredcot_cuda_graphs), allow(dead_code))]
    out: Option<tch::Tensor>,
    eager_steps: usize,
}

#[cfg(rredcot_cuda_graphs)]
struct Graph {
    handle: *mut std::ffi::c_void,
    captured: bool,
}

#[cfg(rredcot_cuda_graphs)]
impl Drop for Graph {
    fn drop(&mut self) {
        // SAFETY: `handle` came from rr_graph_new and is freed once, here; the shim restores the
        // caller's stream if it is still on the side stream.
        unsafe { ffi::rr_graph_free(self.handle) }
    }
}

#[cfg(rredcot_cuda_graphs)]
fn check(what: &str, rc: i32) -> Result<()> {
    if rc == 0 {
        Ok(())
    } else {
        Err(ModelError::Request(format!("CUDA graph {what}: {}", ffi::last_error())))
    }
}

impl Runner {
    /// A runner that captures a graph when `graph` (only where [`AVAILABLE`]).
    pub fn new(graph: bool) -> Result<Runner> {
        if graph && !AVAILABLE {
            return Err(ModelError::Request("this build has no CUDA graphs (ml/build.rs: RREDCOT_CUDA_GRAPHS=1)".into()));
        }
        #[cfg(rredcot_cuda_graphs)]
        let graph = if graph {
            // SAFETY: rr_graph_new returns an owned handle or null (then the error is set).
            let handle = unsafe { ffi::rr_graph_new() };
            if handle.is_null() {
                return Err(ModelError::Request(format!("CUDA graph: {}", ffi::last_error())));
            }
            let g = Graph { handle, captured: false };
            // SAFETY: a live handle; switches this thread's current CUDA stream to the side one.
            check("side stream", unsafe { ffi::rr_graph_enter(g.handle) })?;
            Some(g)
        } else {
            None
        };
        Ok(Runner {
            #[cfg(rredcot_cuda_graphs)]
            graph,
            out: None,
            eager_steps: 0,
        })
    }

    /// One step: `run` itself while eager, its capture at the first step after the warm-up,
    /// a replay after that. Returns (a copy of) the step's result.
    pub fn step(&mut self, run: impl FnOnce() -> tch::Tensor) -> Result<tch::Tensor> {
        #[cfg(rredcot_cuda_graphs)]
        if let Some(g) = &mut self.graph {
            if self.eager_steps >= GRAPH_WARMUP {
                if !g.captured {
                    // SAFETY: a live handle on its side stream; nothing in `run` reads back to
                    // the host (static_decode's step), which a capture forbids.
                    check("capture", unsafe { ffi::rr_graph_capture_begin(g.handle) })?;
                    let out = run();
                    check("capture", unsafe { ffi::rr_graph_capture_end(g.handle) })?;
                    g.captured = true;
                    CAPTURES.with(|c| c.set(c.get() + 1));
                    self.out = Some(out);
                }
                // A capture runs nothing: the captured step's first execution is a replay too.
                // SAFETY: a captured graph whose tensors live in `self.out` and the step's state.
                check("replay", unsafe { ffi::rr_graph_replay(g.handle) })?;
                return Ok(self.out.as_ref().expect("captured").copy());
            }
        }
        self.eager_steps += 1;
        Ok(run())
    }

    /// Back on the caller's stream, which waits for the steps' work.
    pub fn finish(self) -> Result<()> {
        #[cfg(rredcot_cuda_graphs)]
        if let Some(g) = &self.graph {
            // SAFETY: a live handle; restores the stream current before `new`.
            check("leaving the side stream", unsafe { ffi::rr_graph_exit(g.handle) })?;
        }
        Ok(())
    }
}
