// y = x W^T (+ bias) in float32 for the model's projections, over weights packed once at load.
#pragma once

#include <cstdint>

namespace pagedllm {

constexpr int64_t kPanelCols = 48;  // output columns of one packed panel: three 16-float vectors

// Whether this build has the kernel (it needs AVX-512; without it the projections stay on oneDNN).
bool has_linear_kernel();

// w: [n, k] row-major -> panels: [ceil(n / 48), k, 48], column j of panel p = row p * 48 + j of w; the
// columns past n are zero.
void pack_linear_weight(const float* w, int64_t n, int64_t k, float* panels);

// y [m, n] = x [m, k] . W^T + bias (bias may be null); x and y contiguous.
void linear_f32(const float* x, int64_t m, int64_t k, const float* panels, const float* bias, int64_t n, float* y);

}  // namespace pagedllm
