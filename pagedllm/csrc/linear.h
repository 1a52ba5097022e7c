// y = x W^T (+ bias) for the model's projections, over weights packed once at load (float32, bfloat16).
#pragma once

#include <cstdint>
#include <type_traits>

#include "vec.h"

namespace pagedllm {

constexpr int64_t kPanelCols = 48;  // output columns of one packed panel: three vectors of 16

// Whether this build has the kernel for T: float32 needs AVX-512, bfloat16 AVX512-BF16 as well. Without
// it the projections stay on oneDNN.
template <typename T>
bool has_linear_kernel();

// Rows of one panel for k input features: a row holds, for each of the 48 columns, one input (float32) or
// a pair of consecutive inputs (bfloat16, the operand layout of the bf16 dot-product instruction).
template <typename T>
int64_t panel_rows(int64_t k) {
  return std::is_same_v<T, float> ? k : (k + 1) / 2;
}

// Panels for n output columns (the last one zero-padded).
inline int64_t num_panels(int64_t n) { return (n + kPanelCols - 1) / kPanelCols; }

// w: [n, k] row-major -> panels [ceil(n / 48), panel_rows(k), 48 * (1 or 2)]; what lies past n columns or
// k inputs is zero.
template <typename T>
void pack_linear_weight(const T* w, int64_t n, int64_t k, T* panels);

// y [m, n] = x [m, k] . W^T + bias (bias may be null), accumulated in float32; x and y contiguous. bfloat16
// needs an even k (each step reads a pair of inputs).
template <typename T>
void linear(const T* x, int64_t m, int64_t k, const T* panels, const T* bias, int64_t n, T* y);

}  // namespace pagedllm
