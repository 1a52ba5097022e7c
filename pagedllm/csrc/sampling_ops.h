// What the sampler needs from a step's logits before any pick: each row's greedy token and its log-normaliser.
#pragma once

#include <cstdint>

namespace pagedllm {

// Per row of logits [rows, vocab] (rows `stride` floats apart): argmax[r], the first index of the row's
// maximum, and log_z[r] = max + log(sum(exp(x - max))). A row holding a NaN or an infinite maximum gets a NaN
// log_z, so that the caller can take another path for it.
void greedy_summary(const float* logits, int64_t stride, int64_t rows, int64_t vocab, int64_t* argmax, float* log_z);

// What a row keeps of its tokens before its draw, as the sampler's torch path decides it: ranked by scaled logit
// (ties by position), the first top_k (0: all), then of those, normalised among themselves, each token whose
// higher-ranked tokens hold less than top_p of the mass (1: all), then those with at least min_p times the
// largest probability (0: all).
struct Truncation {
  int64_t top_k;
  float top_p, min_p;
};

// Per row: a draw from softmax(logits / temperature[r]) among the tokens truncation[r] keeps, by inverse CDF:
// token[r] the first kept token, in vocabulary order, whose running sum of probabilities passes u[r] (in [0, 1))
// times the kept tokens' total, as the sampler's torch path finds it. A row whose scaled logits hold a NaN or have
// no finite maximum gets -1, so that the caller can take another path for it.
void categorical_draws(const float* logits, int64_t stride, int64_t rows, int64_t vocab, const float* temperature,
                       const Truncation* truncation, const double* u, int64_t* token);

}  // namespace pagedllm
