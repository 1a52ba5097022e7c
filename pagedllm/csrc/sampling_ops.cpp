// One pass for the maximum and its first position and one for the sum of exponentials per row, on vectors. On a
// decode step's [64, 49152] float32 logits and 2 AVX2 cores torch's logsumexp and argmax took 7.5 and 4.7 ms, an
// earlier form of these passes 2.7 ms (docs/engine.md).
#include "sampling_ops.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "parallel.h"
#include "vec.h"

namespace pagedllm {

namespace {

struct RowMax {
  float value;  // NaN when the row holds a NaN
  int64_t at;   // its first position
};

// The row's maximum and where it first occurs, in one pass: kChains chains of vectors, each lane keeping the
// largest value it has seen and where it first saw it (a single chain of compares waits out each one's latency,
// and a second pass to find the maximum cost about as much as the first).
RowMax row_max(const float* x, int64_t vocab) {
  constexpr int64_t kChains = 4, kStep = kChains * kLanes;
  const int64_t whole = vocab / kStep * kStep;
  const ivec lane = __builtin_convertvector(kIota, ivec);
  fvec best[kChains];
  ivec where[kChains];
  for (int64_t c = 0; c < kChains; ++c) best[c] = splat(kNegInf), where[c] = ivec{};
  ivec nan{};
  for (int64_t j = 0; j < whole; j += kStep)
    for (int64_t c = 0; c < kChains; ++c) {
      const fvec v = loadv(x + j + c * kLanes);
      const ivec higher = v > best[c];
      best[c] = higher ? v : best[c];
      where[c] = higher ? lane + static_cast<int32_t>(j + c * kLanes) : where[c];
      nan |= v != v;
    }
  RowMax top{kNegInf, vocab};
  for (int64_t c = 0; c < kChains; ++c) top.value = std::max(top.value, reduce_max(best[c]));
  for (int64_t c = 0; c < kChains; ++c)
    for (int64_t i = 0; i < kLanes; ++i)
      if (best[c][i] == top.value) top.at = std::min<int64_t>(top.at, where[c][i]);
  bool seen_nan = false;
  for (int64_t i = 0; i < kLanes; ++i) seen_nan |= nan[i] != 0;
  for (int64_t j = whole; j < vocab; ++j) {
    if (x[j] > top.value) top = {x[j], j};
    seen_nan |= x[j] != x[j];
  }
  if (seen_nan) top.value = std::numeric_limits<float>::quiet_NaN();
  return top;
}

float sum_exp(const float* x, int64_t vocab, float top) {
  const int64_t whole = vocab / kLanes * kLanes;
  fvec sum{};
  for (int64_t j = 0; j < whole; j += kLanes) sum += fast_exp(loadv(x + j) - top);
  float total = reduce_add(sum);
  for (int64_t j = whole; j < vocab; ++j) total += fast_exp(x[j] - top);
  return total;
}

// Keys of the draw are summed in runs of kRunLength: the scan for a row's token walks the runs' sums, and only the
// run it lands in again key by key (each exponential computed twice at most, never stored).
constexpr int64_t kRunLength = 4 * kLanes;

// x[j] / t (the same division as torch's `logits / temperature`) for the 16 keys from j.
fvec scaled(const float* x, int64_t j, float t) { return loadv(x + j) / t; }

// The largest scaled logit, NaN if any is NaN.
float scaled_max(const float* x, int64_t vocab, float t) {
  const int64_t whole = vocab / kLanes * kLanes;
  fvec best = splat(kNegInf);
  ivec nan{};
  for (int64_t j = 0; j < whole; j += kLanes) {
    const fvec v = scaled(x, j, t);
    best = vmax(best, v);
    nan |= v != v;
  }
  float top = reduce_max(best);
  bool seen_nan = false;
  for (int64_t i = 0; i < kLanes; ++i) seen_nan |= nan[i] != 0;
  for (int64_t j = whole; j < vocab; ++j) {
    const float v = x[j] / t;
    top = std::max(top, v);
    seen_nan |= v != v;
  }
  return seen_nan ? std::numeric_limits<float>::quiet_NaN() : top;
}

// Sum of e^(x[j] / t - top) over keys [begin, end), in float64 from each vector's float32 sum.
double run_sum(const float* x, int64_t begin, int64_t end, float t, float top) {
  fvec sum{};
  int64_t j = begin;
  for (; j + kLanes <= end; j += kLanes) sum += fast_exp(scaled(x, j, t) - top);
  double total = reduce_add(sum);
  for (; j < end; ++j) total += fast_exp(x[j] / t - top);
  return total;
}

int64_t draw_row(const float* x, int64_t vocab, float t, double u, std::vector<double>& runs) {
  const float top = scaled_max(x, vocab, t);
  if (!std::isfinite(top)) return -1;
  const int64_t num_runs = (vocab + kRunLength - 1) / kRunLength;
  runs.resize(num_runs);
  double total = 0.0;
  for (int64_t r = 0; r < num_runs; ++r) {
    runs[r] = run_sum(x, r * kRunLength, std::min(vocab, (r + 1) * kRunLength), t, top);
    total += runs[r];
  }
  // strictly below the total, as the torch path clamps it, so that some key with a probability above 0 is reached
  const double target = std::min(u * total, std::nextafter(total, 0.0));
  double before = 0.0;
  int64_t r = 0;
  while (r + 1 < num_runs && before + runs[r] <= target) before += runs[r++];
  // the run's keys one by one; float rounding may leave the target just past the run's own sum: then its last key
  // with a probability above 0
  int64_t last = -1;
  for (int64_t j = r * kRunLength; j < std::min(vocab, (r + 1) * kRunLength); ++j) {
    const double p = fast_exp(x[j] / t - top);
    if (p <= 0.0) continue;
    last = j;
    before += p;
    if (before > target) return j;
  }
  return last;
}

}  // namespace

void categorical_draws(const float* logits, int64_t stride, int64_t rows, int64_t vocab, const float* temperature,
                       const double* u, int64_t* token) {
  parallel_chunks(rows, 1, [&](int64_t begin, int64_t end) {
    std::vector<double> runs;
    for (int64_t r = begin; r < end; ++r) token[r] = draw_row(logits + r * stride, vocab, temperature[r], u[r], runs);
  });
}

void greedy_summary(const float* logits, int64_t stride, int64_t rows, int64_t vocab, int64_t* argmax, float* log_z) {
  parallel_chunks(rows, 1, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const float* x = logits + r * stride;
      const RowMax top = row_max(x, vocab);
      if (!std::isfinite(top.value)) {
        argmax[r] = 0;
        log_z[r] = std::numeric_limits<float>::quiet_NaN();
        continue;
      }
      argmax[r] = top.at;
      log_z[r] = top.value + std::log(sum_exp(x, vocab, top.value));
    }
  });
}

}  // namespace pagedllm
