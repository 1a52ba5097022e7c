// The projections' float32 matmul: y = x W^T + bias over W packed into panels of 48 output columns.
//
// Each thread takes a run of panels. For every panel, 8 rows of x at a time are multiplied into 8 x 48
// outputs held in 24 registers: per step of k, three vectors of the panel are loaded and each of the 8 x
// values is broadcast into three FMAs. A decode step streams all of the weights from memory for a few
// dozen rows, so while a thread works on one panel it prefetches the next one, a few lines per step of k:
// the memory reads overlap the FMAs. oneDNN's prepacked matmul does not, and at 1-64 rows this runs
// 1.1-1.6x faster than it, at the same speed from 128 rows up (docs/models.md).
#include "linear.h"

#include <algorithm>
#include <stdexcept>

#include "parallel.h"

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

namespace pagedllm {

void pack_linear_weight(const float* w, int64_t n, int64_t k, float* panels) {
  const int64_t num_panels = (n + kPanelCols - 1) / kPanelCols;
  parallel_chunks(num_panels, 1, [&](int64_t begin, int64_t end) {
    for (int64_t p = begin; p < end; ++p)
      for (int64_t i = 0; i < k; ++i)
        for (int64_t j = 0; j < kPanelCols; ++j) {
          const int64_t row = p * kPanelCols + j;
          panels[(p * k + i) * kPanelCols + j] = row < n ? w[row * k + i] : 0.0f;
        }
  });
}

#if defined(__AVX512F__)

namespace {

constexpr int64_t kTileRows = 8;     // rows of x per register tile: 8 x 3 accumulators
constexpr int64_t kRowChunk = 512;   // rows per pass over the weights (more: x no longer stays in cache)

// Lanes of vector c (columns 16c .. 16c + 15) that fall inside the panel's `cols` real columns.
__mmask16 column_mask(int64_t cols, int c) {
  const int64_t lanes = std::clamp<int64_t>(cols - 16 * c, 0, 16);
  return static_cast<__mmask16>((1u << lanes) - 1u);
}

// acc[r] += x[r] . panel over k, for kRows rows of x (k apart). With kPrefetch, the 3 lines of `next` for each
// step of k are requested too (two loops rather than a test per step: the loop needs every register).
template <int kRows, bool kPrefetch>
inline void multiply(const float* x, int64_t k, const float* panel, const float* next, __m512 (&acc)[kRows][3]) {
  for (int64_t i = 0; i < k; ++i) {
    const float* w = panel + i * kPanelCols;
    if (kPrefetch)
      for (int c = 0; c < 3; ++c)
        _mm_prefetch(reinterpret_cast<const char*>(next + i * kPanelCols + 16 * c), _MM_HINT_T1);
    const __m512 w0 = _mm512_loadu_ps(w), w1 = _mm512_loadu_ps(w + 16), w2 = _mm512_loadu_ps(w + 32);
    for (int r = 0; r < kRows; ++r) {
      const __m512 a = _mm512_set1_ps(x[r * k + i]);
      acc[r][0] = _mm512_fmadd_ps(a, w0, acc[r][0]);
      acc[r][1] = _mm512_fmadd_ps(a, w1, acc[r][1]);
      acc[r][2] = _mm512_fmadd_ps(a, w2, acc[r][2]);
    }
  }
}

// y[r, 0 .. cols) = x[r] . panel + bias for kRows rows (x rows k apart, y rows ldy apart). `next`: the panel
// this thread reads after this one, or null.
template <int kRows>
void tile(const float* x, int64_t k, const float* panel, const float* next, const float* bias, int64_t cols,
          float* y, int64_t ldy) {
  __m512 acc[kRows][3];
  for (int c = 0; c < 3; ++c) {
    const __m512 start = bias ? _mm512_maskz_loadu_ps(column_mask(cols, c), bias + 16 * c) : _mm512_setzero_ps();
    for (int r = 0; r < kRows; ++r) acc[r][c] = start;
  }
  if (next != nullptr)
    multiply<kRows, true>(x, k, panel, next, acc);
  else
    multiply<kRows, false>(x, k, panel, nullptr, acc);
  for (int r = 0; r < kRows; ++r)
    for (int c = 0; c < 3; ++c) _mm512_mask_storeu_ps(y + r * ldy + 16 * c, column_mask(cols, c), acc[r][c]);
}

using TileFn = void (*)(const float*, int64_t, const float*, const float*, const float*, int64_t, float*, int64_t);
constexpr TileFn kTiles[kTileRows + 1] = {nullptr,  tile<1>, tile<2>, tile<3>, tile<4>,
                                          tile<5>, tile<6>, tile<7>, tile<8>};

}  // namespace

bool has_linear_kernel() { return true; }

void linear_f32(const float* x, int64_t m, int64_t k, const float* panels, const float* bias, int64_t n, float* y) {
  const int64_t num_panels = (n + kPanelCols - 1) / kPanelCols;
  for (int64_t m0 = 0; m0 < m; m0 += kRowChunk) {
    const int64_t rows = std::min(kRowChunk, m - m0);
    parallel_chunks(num_panels, 1, [&](int64_t begin, int64_t end) {
      for (int64_t p = begin; p < end; ++p) {
        const float* panel = panels + p * k * kPanelCols;
        const float* next = p + 1 < end ? panel + k * kPanelCols : nullptr;
        const float* panel_bias = bias ? bias + p * kPanelCols : nullptr;
        const int64_t cols = std::min(kPanelCols, n - p * kPanelCols);
        for (int64_t r = 0; r < rows; r += kTileRows) {
          const int64_t tile_rows = std::min(kTileRows, rows - r);
          kTiles[tile_rows](x + (m0 + r) * k, k, panel, r == 0 ? next : nullptr, panel_bias, cols,
                            y + (m0 + r) * n + p * kPanelCols, n);
        }
      }
    });
  }
}

#else  // no AVX-512: the projections stay on oneDNN

bool has_linear_kernel() { return false; }

void linear_f32(const float*, int64_t, int64_t, const float*, const float*, int64_t, float*) {
  throw std::runtime_error("linear_f32 needs AVX-512; this build has none");
}

#endif

}  // namespace pagedllm
