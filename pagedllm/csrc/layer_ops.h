// The elementwise work between a decoder layer's matmuls, one pass over memory each.
#pragma once

#include <cstdint>

namespace pagedllm {

// All tensors [rows, width] with rows `stride` elements apart (weight: [width]); T = float or bf16_t.
// residual += x, then x = rms_norm(residual) * weight (normalised in float32, rounded to T before the
// weight multiplies it, as the reference module does). residual == nullptr: x = rms_norm(x) * weight.
template <typename T>
void add_rms_norm(T* x, int64_t x_stride, T* residual, int64_t residual_stride, const T* weight, int64_t rows,
                  int64_t width, float eps);

// In place on heads [rows, num_heads, head_dim] (rows `stride` elements apart): each head = rms_norm(head) *
// weight [head_dim], rounded as add_rms_norm rounds (Qwen3's q and k norms).
template <typename T>
void head_rms_norm(T* x, int64_t stride, int64_t rows, int64_t num_heads, int64_t head_dim, const T* weight,
                   float eps);

// In place on heads [rows, num_heads, head_dim] (rows `stride` elements apart), HF's half-split rotation:
// x[i] = x[i] cos[i] - x[i + d/2] sin[i],  x[i + d/2] = x[i + d/2] cos[i + d/2] + x[i] sin[i + d/2].
// cos, sin: [rows, head_dim] contiguous.
template <typename T>
void rotary(T* x, int64_t stride, int64_t rows, int64_t num_heads, int64_t head_dim, const T* cos, const T* sin);

// out[r, i] = silu(x[r, i]) * x[r, width + i]; x: [rows, 2 * width] contiguous, out: [rows, width].
template <typename T>
void silu_mul(const T* x, T* out, int64_t rows, int64_t width);

}  // namespace pagedllm
