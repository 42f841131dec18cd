// The CUDA-graph calls ml/src/model/cuda_graph.rs needs, which tch does not bind:
// `at::cuda::CUDAGraph` captured and replayed on a side stream, as `torch.cuda.graph` does.
// Every function returns 0 on success (or a handle); on failure the message is kept for
// rr_graph_last_error (per thread), a capture under way is abandoned and the caller's stream is
// current again, so later CUDA work on the thread runs (the failed decode itself returns the error).
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAStream.h>

#include <cstdint>
#include <exception>
#include <optional>
#include <string>

namespace {
thread_local std::string last_error;

struct Graph {
  at::cuda::CUDAGraph graph;
  c10::cuda::CUDAStream caller = c10::cuda::getCurrentCUDAStream();
  c10::cuda::CUDAStream side = c10::cuda::getStreamFromPool();
  bool on_side = false;
  // The capture's memory pool (ours, so a failed capture's can be given back) and whether a
  // capture was begun and not yet ended well.
  c10::MempoolId_t pool = at::cuda::graph_pool_handle();
  bool capture_open = false;
};

// Everything queued so far has run (on every stream): how one stream's work comes before the
// other's when switching. Once per generation; an event would do with less waiting, but its calls
// are inline CUDA runtime ones and this shim links libtorch's libraries alone.
void settle() { c10::cuda::device_synchronize(); }

// A capture that did not end well (an op inside it failed, or its end did): ends the stream's
// capture (capture_end calls cudaStreamEndCapture first, whatever follows fails), stops routing
// the allocator to its pool and gives the pool back. Without this, the side stream stays in
// capture mode, every later op on this thread fails, and the allocator keeps the capture as
// underway, so empty_cache asserts. Each call may find its part already done: errors ignored.
void abandon_capture(Graph* g) {
  if (!g->capture_open) return;
  g->capture_open = false;
  try {
    g->graph.capture_end();
    return;  // it ended well after all: the graph is freed with `g`
  } catch (...) {
  }
  auto dev = c10::cuda::current_device();
  try {
    c10::cuda::CUDACachingAllocator::endAllocateToPool(dev, g->pool);
  } catch (...) {
  }
  try {
    c10::cuda::CUDACachingAllocator::releasePool(dev, g->pool);
  } catch (...) {
  }
}

// Back on the caller's stream, even where waiting for the work fails (then rethrown).
void back_to_caller(Graph* g) {
  abandon_capture(g);
  if (g->on_side) {
    g->on_side = false;
    std::exception_ptr failed;
    try {
      settle();
    } catch (...) {
      failed = std::current_exception();
    }
    c10::cuda::setCurrentCUDAStream(g->caller);
    if (failed) std::rethrow_exception(failed);
  }
}

template <typename F>
int guarded(Graph* g, F f) {
  try {
    f();
    return 0;
  } catch (const std::exception& e) {
    last_error = e.what();
  } catch (...) {
    last_error = "unknown C++ exception";
  }
  try {
    if (g) back_to_caller(g);
  } catch (...) {
  }
  return 1;
}
}  // namespace

extern "C" {
const char* rr_graph_last_error() { return last_error.c_str(); }

void* rr_graph_new() {
  Graph* g = nullptr;
  guarded(nullptr, [&] { g = new Graph(); });
  return g;
}

int rr_graph_enter(void* p) {
  auto* g = static_cast<Graph*>(p);
  return guarded(g, [&] {
    settle();
    c10::cuda::setCurrentCUDAStream(g->side);
    g->on_side = true;
  });
}

// Thread-local capture mode: only this thread's unsafe CUDA calls are refused while it captures.
// The default (global) mode would make another thread's cudaMalloc or synchronising copy fail
// meanwhile (tests run side by side in one process; a worker's other threads do no CUDA work).
int rr_graph_capture_begin(void* p) {
  auto* g = static_cast<Graph*>(p);
  return guarded(g, [&] {
    g->capture_open = true;
    g->graph.capture_begin(g->pool, cudaStreamCaptureModeThreadLocal);
  });
}

int rr_graph_capture_end(void* p) {
  auto* g = static_cast<Graph*>(p);
  return guarded(g, [&] {
    g->graph.capture_end();
    g->capture_open = false;
  });
}

int rr_graph_replay(void* p) {
  auto* g = static_cast<Graph*>(p);
  return guarded(g, [&] { g->graph.replay(); });
}

int rr_graph_exit(void* p) {
  auto* g = static_cast<Graph*>(p);
  return guarded(g, [&] { back_to_caller(g); });
}

void rr_graph_free(void* p) {
  auto* g = static_cast<Graph*>(p);
  try {
    back_to_caller(g);
  } catch (...) {
  }
  delete g;
}
}

// `torch.cuda.empty_cache()`: the caching allocator's unused blocks back to the driver (a warm
// stage process between instances, ml/src/stages/mod.rs).
extern "C" int rr_empty_cache() {
  try {
    c10::cuda::CUDACachingAllocator::emptyCache();
    return 0;
  } catch (const std::exception& e) {
    last_error = e.what();
    return 1;
  }
}

// `torch.cuda.memory_reserved()`: bytes the caching allocator holds from the driver on the
// current device (what empty_cache gives back is what this drops by), or -1 on failure.
extern "C" int64_t rr_memory_reserved() {
  try {
    auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(c10::cuda::current_device());
    return stats.reserved_bytes[static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE)].current;
  } catch (const std::exception& e) {
    last_error = e.what();
    return -1;
  }
}
