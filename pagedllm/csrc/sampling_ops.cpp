// The sampler's passes over a step's float32 logits, per row on vectors. greedy_summary: one pass for the maximum and
// its first position and one for the sum of exponentials (on [64, 49152] and 2 AVX2 cores torch's logsumexp and
// argmax took 7.5 and 4.7 ms, an earlier form of these passes 2.7 ms). categorical_draws: a random row's token by
// inverse CDF, truncation included, without writing the row's probabilities (torch's ops took 4-80 ms for 32 rows
// of 49152: docs/engine.md).
#include "sampling_ops.h"

#include <immintrin.h>

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

// The inverse-CDF walk over tokens in vocabulary order: their (unnormalised) probabilities added up to the first
// whose running sum passes u times their total, held strictly below the total as the torch path holds it. Float
// rounding may leave the target unreached: the draw is then the last token of probability above 0.
struct Walk {
  double target, before = 0.0;
  int64_t last = -1;

  Walk(double u, double total) : target(std::min(u * total, std::nextafter(total, 0.0))) {}
  // Adds the token's probability p; whether the running sum has passed the target.
  bool passes(int64_t token, double p) {
    if (p <= 0.0) return false;
    last = token;
    before += p;
    return before > target;
  }
};

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
  Walk walk(u, total);
  int64_t r = 0;
  while (r + 1 < num_runs && walk.before + runs[r] <= walk.target) walk.before += runs[r++];
  for (int64_t j = r * kRunLength; j < std::min(vocab, (r + 1) * kRunLength); ++j)  // the run's keys one by one
    if (walk.passes(j, fast_exp(x[j] / t - top))) return j;
  return walk.last;
}

// A truncated row's tokens fall into bins by how far below the maximum their scaled logit lies, kBinsPerUnit bins
// a unit up to kBins (the last holds everything further, 16 units and more: e^-16 = 1.1e-7 of the top token's
// probability, where most of a model's vocabulary lies): the bins' counts and masses bound which tokens any rule
// may keep, and only those are sorted (torch's sort of a whole row of 49152 took about 2.4 ms).
constexpr int64_t kBins = 1024;
constexpr float kBinsPerUnit = 64.0f;
constexpr int32_t kFirstBins = 512;  // 8 units

struct Candidate {
  float logit;  // scaled
  int32_t at;
  bool operator<(const Candidate& o) const { return logit > o.logit || (logit == o.logit && at < o.at); }  // rank
};

struct TruncationScratch {
  std::vector<int64_t> count;
  std::vector<double> mass;
  std::vector<Candidate> candidates;
};

int64_t bin_of(float distance) { return static_cast<int64_t>(std::min(distance * kBinsPerUnit, kBins - 1.0f)); }
ivec bins_of(fvec distance) {
  const fvec scaled = distance * kBinsPerUnit, limit = splat(static_cast<float>(kBins - 1));
  return __builtin_convertvector(scaled < limit ? scaled : limit, ivec);
}

// The first bin at which the running count reaches n, or the running mass reaches `mass` (the last bin if never).
int64_t bin_reaching(const TruncationScratch& s, int64_t n, double mass) {
  int64_t count = 0;
  double sum = 0.0;
  for (int64_t b = 0; b < kBins; ++b) {
    count += s.count[b];
    sum += s.mass[b];
    if (count >= n || sum >= mass) return b;
  }
  return kBins - 1;
}

// The last bin whose tokens the rules may keep (one further for rounding): min_p's distance passed, top_k's count
// reached, top_p's mass (of every token: at least that of those min_p and top_k leave) reached. Where top_p follows
// min_p or top_k, all the tokens those leave are candidates: their sum normalises the probabilities top_p adds.
int64_t last_bin(const TruncationScratch& s, const Truncation& c, double total) {
  constexpr int64_t kNever = std::numeric_limits<int64_t>::max();
  const int64_t by_ratio = c.min_p > 0.0f ? bin_of(-std::log(c.min_p)) : kBins - 1;
  const int64_t by_count = c.top_k > 0 ? bin_reaching(s, c.top_k, HUGE_VAL) : kBins - 1;
  const int64_t by_mass = c.top_p < 1.0f ? bin_reaching(s, kNever, c.top_p * total) : kBins - 1;
  const int64_t left = std::min(by_ratio, by_count);
  const bool renormalised = c.top_p < 1.0f && (c.min_p > 0.0f || c.top_k > 0);
  return std::min(kBins - 1, (renormalised ? left : std::min(left, by_mass)) + 1);
}

// How many of the ranked candidates the rules keep (at least the first), in vLLM's order: min-p on the whole
// distribution, then top-k, then top-p over the probabilities renormalised among what those two leave.
int64_t kept_count(const std::vector<Candidate>& ranked, const Truncation& c, int64_t vocab, float top, double total) {
  int64_t kept = static_cast<int64_t>(ranked.size());
  if (c.min_p > 0.0f) {
    const double floor = c.min_p * fast_exp(ranked[0].logit - top);
    int64_t above = 1;
    while (above < kept && !(fast_exp(ranked[above].logit - top) < floor)) ++above;
    kept = above;
  }
  if (c.top_k > 0) kept = std::min(kept, c.top_k);
  if (c.top_p >= 1.0f) return kept;
  if (c.min_p > 0.0f || (c.top_k > 0 && c.top_k < vocab)) {
    total = 0.0;
    for (int64_t r = 0; r < kept; ++r) total += fast_exp(ranked[r].logit - top);
  }
  double before = 0.0;
  for (int64_t r = 0; r < kept; ++r) {
    if (!(before < c.top_p)) return std::max<int64_t>(r, 1);
    before += fast_exp(ranked[r].logit - top) / total;
  }
  return kept;
}

// Bit i set where lane i of m is set.
uint32_t lanes_set(ivec m) {
#if defined(__AVX512F__)
  return _mm512_test_epi32_mask(reinterpret_cast<__m512i>(m), reinterpret_cast<__m512i>(m));
#else
  return _mm256_movemask_ps(reinterpret_cast<__m256>(m));
#endif
}

// The row's tokens counted into s's bins, with their mass; the whole row's mass. Tokens of bin `lumped` and beyond
// count for the last bin, summed on vectors; the others one by one (a scalar update for every token was 2/3 of
// the draw's time).
double fill_bins(const float* x, int64_t vocab, float t, float top, int32_t lumped, TruncationScratch& s) {
  s.count.assign(kBins, 0);
  s.mass.assign(kBins, 0.0);
  constexpr int64_t kLast = kBins - 1;
  double near_total = 0.0;
  fvec far_mass{};
  int64_t far_count = 0;
  const int64_t whole = vocab / kLanes * kLanes;
  for (int64_t j = 0; j < whole; j += kLanes) {
    const fvec logit = scaled(x, j, t);
    const fvec e = fast_exp(logit - top);
    const ivec bins = bins_of(top - logit);
    const ivec near = bins < lumped;
    far_mass += near ? fvec{} : e;
    uint32_t bits = lanes_set(near);
    far_count += kLanes - __builtin_popcount(bits);
    for (; bits != 0; bits &= bits - 1) {
      const int lane = __builtin_ctz(bits);
      s.count[bins[lane]] += 1;
      s.mass[bins[lane]] += e[lane];
      near_total += e[lane];
    }
  }
  double far_total = reduce_add(far_mass);
  for (int64_t j = whole; j < vocab; ++j) {
    const int64_t b = bin_of(top - x[j] / t);
    const float e = fast_exp(x[j] / t - top);
    if (b < lumped) {
      s.count[b] += 1;
      s.mass[b] += e;
      near_total += e;
    } else {
      far_count += 1;
      far_total += e;
    }
  }
  s.count[kLast] += far_count;
  s.mass[kLast] += far_total;
  return near_total + far_total;
}

// The tokens of bins up to `last` into s.candidates, ranked.
void rank_candidates(const float* x, int64_t vocab, float t, float top, int64_t last, TruncationScratch& s) {
  s.candidates.clear();
  const int64_t whole = vocab / kLanes * kLanes;
  for (int64_t j = 0; j < whole; j += kLanes) {
    const fvec logit = scaled(x, j, t);
    const ivec in = bins_of(top - logit) <= static_cast<int32_t>(last);
    for (int64_t i = 0; i < kLanes; ++i)
      if (in[i]) s.candidates.push_back({logit[i], static_cast<int32_t>(j + i)});
  }
  for (int64_t j = whole; j < vocab; ++j)
    if (bin_of(top - x[j] / t) <= last) s.candidates.push_back({x[j] / t, static_cast<int32_t>(j)});
  std::sort(s.candidates.begin(), s.candidates.end());
}

// The draw at u among kept[0, n), walked in vocabulary order as the torch path's running sum meets them.
int64_t draw_among(Candidate* kept, int64_t n, float top, double u) {
  std::sort(kept, kept + n, [](const Candidate& a, const Candidate& b) { return a.at < b.at; });
  double total = 0.0;
  for (int64_t r = 0; r < n; ++r) total += fast_exp(kept[r].logit - top);
  Walk walk(u, total);
  for (int64_t r = 0; r < n; ++r)
    if (walk.passes(kept[r].at, fast_exp(kept[r].logit - top))) return kept[r].at;
  return walk.last;
}

int64_t truncated_draw_row(const float* x, int64_t vocab, float t, const Truncation& c, double u, TruncationScratch& s) {
  const float top = scaled_max(x, vocab, t);
  if (!std::isfinite(top)) return -1;
  // first with the bins of the top 8 units alone, where a model's top-p, top-k and min-p cuts mostly fall (about
  // 80 of 49152 tokens there, 12000 within 16 units); where they do not, with every bin
  double total = fill_bins(x, vocab, t, top, kFirstBins, s);
  int64_t last = last_bin(s, c, total);
  if (last > kFirstBins) {
    total = fill_bins(x, vocab, t, top, kBins - 1, s);
    last = last_bin(s, c, total);
  }
  rank_candidates(x, vocab, t, top, last, s);
  return draw_among(s.candidates.data(), kept_count(s.candidates, c, vocab, top, total), top, u);
}

bool truncates(const Truncation& c) { return c.top_k > 0 || c.top_p < 1.0f || c.min_p > 0.0f; }

}  // namespace

void categorical_draws(const float* logits, int64_t stride, int64_t rows, int64_t vocab, const float* temperature,
                       const Truncation* truncation, const double* u, int64_t* token) {
  parallel_chunks(rows, 1, [&](int64_t begin, int64_t end) {
    std::vector<double> runs;
    TruncationScratch scratch;
    for (int64_t r = begin; r < end; ++r) {
      const float* x = logits + r * stride;
      token[r] = truncates(truncation[r]) ? truncated_draw_row(x, vocab, temperature[r], truncation[r], u[r], scratch)
                                          : draw_row(x, vocab, temperature[r], u[r], runs);
    }
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
