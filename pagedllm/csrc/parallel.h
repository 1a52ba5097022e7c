// Work sharing on torch's own intra-op thread pool (so torch.set_num_threads governs the kernels too).
#pragma once

#include <ATen/Parallel.h>

#include <algorithm>
#include <atomic>
#include <cstdint>

namespace pagedllm {

// body(next) on each of min(n, threads) threads, `next` a counter from 0 that they share to take items of
// [0, n) in turn.
template <typename Body>
void on_shared_counter(int64_t n, const Body& body) {
  if (n <= 0) return;
  std::atomic<int64_t> next{0};
  const int64_t workers = std::min<int64_t>(n, at::get_num_threads());
  at::parallel_for(0, workers, 1, [&](int64_t, int64_t) { body(next); });
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
