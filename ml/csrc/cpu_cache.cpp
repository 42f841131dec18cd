// A CPU allocator for libtorch that keeps large freed blocks for reuse (src/cpu_cache.rs says
// why and when). Freed blocks of `kMinCached` bytes and more are kept, a request takes the
// smallest kept block that fits it with at most a quarter to spare, and before a request takes
// new memory the blocks kept longest are given back until the cache holds at most its limit;
// everything else goes straight to c10::alloc_cpu / free_cpu as before.
#include <c10/core/CPUAllocator.h>
#include <c10/core/impl/alloc_cpu.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <unordered_map>

namespace {

// Below this glibc's own heap reuses freed memory (its mmap threshold adapts up to 32 MiB);
// from 32 MiB up every allocation is a fresh mapping whose pages fault in one by one.
constexpr size_t kMinCached = size_t(1) << 20;

// `n` rounded up to one of eight sizes per power of two (at most an eighth more): blocks come in
// fewer sizes, so one freed by a tensor serves the next that is a little larger (a trace a few
// tokens longer).
size_t size_class(size_t n) {
  size_t top = size_t(1) << (63 - __builtin_clzll(n));
  size_t step = top / 8;
  return (n + step - 1) / step * step;
}

struct Block {
  size_t size;
  bool cached;       // in `free_blocks`, not held by a tensor
  uint64_t freed_at;  // when it was cached (a count of frees): the oldest is dropped first
};

struct Cache {
  std::mutex mu;
  std::multimap<size_t, void*> free_blocks;  // by size
  // Every block of kMinCached bytes or more this allocator handed out and still owns.
  std::unordered_map<void*, Block> blocks;
  size_t cached_bytes = 0;
  size_t limit = 0;
  uint64_t hits = 0, misses = 0, evictions = 0, frees = 0;
};

// Leaked: tensors may be freed during static destruction.
Cache& cache() {
  static Cache* c = new Cache();
  return *c;
}

void release_locked(Cache& c) {
  for (auto& entry : c.free_blocks) {
    c.blocks.erase(entry.second);
    c10::free_cpu(entry.second);
  }
  c.free_blocks.clear();
  c.cached_bytes = 0;
}

// Frees the cached block freed longest ago.
size_t evict_oldest_locked(Cache& c) {
  auto oldest = c.free_blocks.end();
  for (auto it = c.free_blocks.begin(); it != c.free_blocks.end(); ++it) {
    if (oldest == c.free_blocks.end() || c.blocks[it->second].freed_at < c.blocks[oldest->second].freed_at) oldest = it;
  }
  size_t n = oldest->first;
  c.cached_bytes -= n;
  c.blocks.erase(oldest->second);
  c10::free_cpu(oldest->second);
  c.free_blocks.erase(oldest);
  c.evictions++;
  return n;
}

// The deleter of every block this allocator hands out (and its raw deleter): a large block is
// kept (it stays resident either way until the next request for new memory trims the cache).
void give_back(void* p) {
  if (p == nullptr) return;
  Cache& c = cache();
  std::lock_guard<std::mutex> guard(c.mu);
  auto it = c.blocks.find(p);
  if (it == c.blocks.end()) {
    c10::free_cpu(p);  // a small block
    return;
  }
  if (it->second.cached) std::abort();  // freed twice: reusing it would alias two tensors
  size_t n = it->second.size;
  it->second.cached = true;
  it->second.freed_at = ++c.frees;
  c.free_blocks.emplace(n, p);
  c.cached_bytes += n;
}

struct CachingCpuAllocator final : c10::Allocator {
  c10::DataPtr allocate(size_t n) override {
    void* p = nullptr;
    if (n >= kMinCached) {
      n = size_class(n);
      Cache& c = cache();
      {
        std::lock_guard<std::mutex> guard(c.mu);
        // Sizes vary a little between steps (a trace's length): a block up to a quarter larger
        // serves, so at most a fifth of a reused block is idle.
        auto it = c.free_blocks.lower_bound(n);
        if (it != c.free_blocks.end() && it->first <= n + n / 4) {
          p = it->second;
          c.cached_bytes -= it->first;
          c.free_blocks.erase(it);
          c.blocks[p].cached = false;
          c.hits++;
        } else {
          // Before new memory is taken the cache shrinks to its limit: a free moves a block
          // from the tensors to the cache and a hit back, so the process never holds more than
          // its tensors' peak plus the limit (block rounding aside).
          c.misses++;
          while (c.cached_bytes > c.limit) evict_oldest_locked(c);
        }
      }
      if (p == nullptr) {
        p = c10::alloc_cpu(n);
        std::lock_guard<std::mutex> guard(c.mu);
        c.blocks[p] = Block{n, false, 0};
      }
    } else {
      p = c10::alloc_cpu(n);
    }
    return {p, p, &give_back, c10::Device(c10::DeviceType::CPU)};
  }

  c10::DeleterFnPtr raw_deleter() const override { return &give_back; }

  void copy_data(void* dest, const void* src, std::size_t count) const override {
    default_copy_data(dest, src, count);
  }
};

}  // namespace

// Makes the caching allocator libtorch's CPU allocator, trimming the cache to `limit` bytes
// before taking new memory. Call before the first tensor; 0 on success.
extern "C" int rr_cpu_cache_install(uint64_t limit) {
  try {
    static CachingCpuAllocator allocator;
    {
      Cache& c = cache();
      std::lock_guard<std::mutex> guard(c.mu);
      c.limit = limit;
    }
    c10::SetCPUAllocator(&allocator, /*priority=*/1);
    return c10::GetCPUAllocator() == &allocator ? 0 : 1;
  } catch (...) {
    return 1;
  }
}

// Frees every cached block (what a process's end would give back).
extern "C" void rr_cpu_cache_release() {
  Cache& c = cache();
  std::lock_guard<std::mutex> guard(c.mu);
  release_locked(c);
}

// Allocations of cached size served from the cache (`hits`) and not (`misses`), blocks given
// back to trim it to its limit (`evictions`), and the bytes the cache holds now.
extern "C" void rr_cpu_cache_stats(uint64_t* hits, uint64_t* misses, uint64_t* evictions, uint64_t* cached_bytes) {
  Cache& c = cache();
  std::lock_guard<std::mutex> guard(c.mu);
  *hits = c.hits;
  *misses = c.misses;
  *evictions = c.evictions;
  *cached_bytes = c.cached_bytes;
}
