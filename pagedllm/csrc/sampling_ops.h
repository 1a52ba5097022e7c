// What the sampler needs from a step's logits before any pick: each row's greedy token and its log-normaliser.
#pragma once

#include <cstdint>

namespace pagedllm {

// Per row of logits [rows, vocab] (rows `stride` floats apart): argmax[r], the first index of the row's
// maximum, and log_z[r] = max + log(sum(exp(x - max))). A row holding a NaN or an infinite maximum gets a NaN
// log_z, so that the caller can take another path for it.
void greedy_summary(const float* logits, int64_t stride, int64_t rows, int64_t vocab, int64_t* argmax, float* log_z);

// Per row: a draw from softmax(logits / temperature[r]) by inverse CDF, token[r] the first index whose running sum of
// probabilities passes u[r] (in [0, 1)) times the row's total, as the sampler's torch path finds it. A row whose
// scaled logits hold a NaN or have no finite maximum gets -1, so that the caller can take another path for it.
void categorical_draws(const float* logits, int64_t stride, int64_t rows, int64_t vocab, const float* temperature,
                       const double* u, int64_t* token);

}  // namespace pagedllm
