// y = x W^T (+ bias) for the model's projections, over weights packed once at load (float32, bfloat16).
#pragma once

#include <cstdint>
#include <type_traits>

#include "bf16_path.h"
#include "vec.h"

namespace pagedllm {

// Output columns of one packed panel: three vectors of 16 with AVX-512 (48), two of 8 with AVX2 (16): as
// many as the register tile's accumulators hold for its rows (8 x 3 of 32 registers, 6 x 2 of 16).
#if defined(__AVX512F__)
constexpr int kPanelVecs = 3;
#else
constexpr int kPanelVecs = 2;
#endif
constexpr int64_t kPanelCols = kPanelVecs * kLanes;

// Whether this build has the kernel for T: float32 needs AVX-512 or AVX2 with FMA, bfloat16 AVX512-BF16.
// Without it the projections stay on oneDNN.
template <typename T>
bool has_linear_kernel();

// Rows of one panel for k input features: a row holds, for each of the panel's columns, one input (float32) or
// a pair of consecutive inputs (bfloat16, the operand layout of the bf16 dot-product instruction).
template <typename T>
int64_t panel_rows(int64_t k) {
  return std::is_same_v<T, float> ? k : (k + 1) / 2;
}

// A gated weight is an MLP's [gate; up]: 2n rows for n outputs y = silu(x gate^T) * (x up^T). Its panels
// hold half a panel of gate columns and then the same up columns, so that a panel's outputs are all computed in
// registers before the activation is applied to them: the [m, 2n] product is never stored.
constexpr int64_t kGatedPanelOutputs = kPanelCols / 2;

// Output columns of one panel.
inline int64_t panel_outputs(bool gated) { return gated ? kGatedPanelOutputs : kPanelCols; }

// Panels for n outputs (the last one zero-padded).
inline int64_t num_panels(int64_t n, bool gated = false) {
  return (n + panel_outputs(gated) - 1) / panel_outputs(gated);
}

// w: [rows, k] row-major -> panels [num_panels(n, gated), panel_rows(k), kPanelCols * (1 or 2)], for n = rows
// outputs (gated: rows = 2n); what lies past the outputs or the k inputs is zero.
template <typename T>
void pack_linear_weight(const T* w, int64_t rows, int64_t k, bool gated, T* panels);

// y [m, n] = x [m, k] . W^T + bias, accumulated in float32 (gated: silu(gate) * up of the two halves, and
// bias [2n] in W's row order); bias may be null; x and y contiguous. bfloat16 needs an even k (each step
// reads a pair of inputs).
template <typename T>
void linear(const T* x, int64_t m, int64_t k, const T* panels, const T* bias, int64_t n, bool gated, T* y);

}  // namespace pagedllm
