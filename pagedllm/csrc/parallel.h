// Work sharing on torch's own intra-op thread pool (so torch.set_num_threads governs the kernels too).
#pragma once

#include <ATen/Parallel.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <memory>

namespace pagedllm {

// How many workers on_shared_counter and on_runs start for n items: one per thread, no more than the items.
inline int64_t workers_for(int64_t n) { return std::min<int64_t>(n, at::get_num_threads()); }

// body(next) on each of min(n, threads) threads, `next` a counter from 0 that they share to take items of
// [0, n) in turn.
template <typename Body>
void on_shared_counter(int64_t n, const Body& body) {
  if (n <= 0) return;
  std::atomic<int64_t> next{0};
  const int64_t workers = workers_for(n);
  at::parallel_for(0, workers, 1, [&](int64_t, int64_t) { body(next); });
}

// Items [0, n) dealt as one run of consecutive items per thread. Each thread takes its own run from the
// front, in order, and then what is left of the others' runs from their backs, so a thread's reads stay one
// forward stream until the very end (threads taking alternate items of a weight streamed it at 10.7 ms a
// decode step's 30 layers at 32 rows, against 7.8-8.1 ms in runs: docs/models.md).
class Runs {
 public:
  Runs(int64_t n, int64_t threads) : runs_(new Run[threads]), threads_(threads) {
    for (int64_t t = 0; t < threads; ++t) runs_[t].pack(n * t / threads, n * (t + 1) / threads);
  }

  // The next item for thread `self`, or -1 when no run has any left.
  int64_t take(int64_t self) {
    for (int64_t i = 0; i < threads_; ++i) {
      const int64_t item = runs_[(self + i) % threads_].take(/*front=*/i == 0);
      if (item >= 0) return item;
    }
    return -1;
  }

 private:
  struct alignas(64) Run {
    std::atomic<uint64_t> bounds;  // [front, back) as two 32-bit halves, front low
    void pack(uint64_t front, uint64_t back) { bounds.store(front | back << 32, std::memory_order_relaxed); }
    int64_t take(bool front) {
      uint64_t now = bounds.load(std::memory_order_relaxed);
      for (;;) {
        const uint64_t lo = now & 0xFFFFFFFFu, hi = now >> 32;
        if (lo >= hi) return -1;
        const uint64_t next = front ? (lo + 1) | hi << 32 : lo | (hi - 1) << 32;
        if (bounds.compare_exchange_weak(now, next, std::memory_order_relaxed))
          return static_cast<int64_t>(front ? lo : hi - 1);
      }
    }
  };
  std::unique_ptr<Run[]> runs_;
  int64_t threads_;
};

// body(take, worker) for each worker of min(n, threads), on a thread of its own, take() giving that worker's next
// item of [0, n) (-1: none left), dealt as Runs; worker: its index, for state of its own.
template <typename Body>
void on_runs(int64_t n, const Body& body) {
  if (n <= 0) return;
  const int64_t workers = workers_for(n);
  Runs runs(n, workers);
  at::parallel_for(0, workers, 1, [&](int64_t begin, int64_t end) {
    for (int64_t self = begin; self < end; ++self) body([&] { return runs.take(self); }, self);
  });
}

// f(i, next) for every i in [0, n), each thread taking the next index as soon as it is free (items of very
// different cost stay balanced); f also learns the index `next` that this thread takes after i (-1: none),
// so that it can prefetch that item's data while it works on i: a thread claims its next item as it starts one.
template <typename F>
void parallel_dynamic_ahead(int64_t n, const F& f) {
  on_shared_counter(n, [&](std::atomic<int64_t>& next) {
    for (int64_t i = next++; i < n;) {
      const int64_t after = next++;
      f(i, after < n ? after : -1);
      i = after;
    }
  });
}

// f(begin, end) over contiguous chunks of [0, n), for cheap uniform items such as tokens.
template <typename F>
void parallel_chunks(int64_t n, int64_t grain, const F& f) {
  at::parallel_for(0, n, grain, f);
}

}  // namespace pagedllm
