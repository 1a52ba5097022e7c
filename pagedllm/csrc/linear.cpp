// The projections' matmul: y = x W^T + bias over W packed into panels of 48 output columns.
//
// Each thread takes a run of panels. For every panel, 8 rows of x at a time are multiplied into 8 x 48
// outputs held in 24 registers: per panel row, three vectors of the panel are loaded and each of the 8 x
// values (bfloat16: pairs of values) is broadcast into three FMAs (bfloat16: pair dot products). A decode
// step streams all of the weights from memory for a few dozen rows, so while a thread works on one panel
// it prefetches the next, a few lines per panel row: the memory reads overlap the arithmetic. oneDNN's
// prepacked matmul does not, and at 1-64 rows this runs 1.2-1.9x faster than it, at the same speed from
// 1024 rows up (docs/models.md). A gated weight (an MLP's [gate; up]) is packed with 24 gate columns and
// the matching 24 up columns in each panel, and its tiles are stored as silu(gate) * up.
#include "linear.h"

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <type_traits>

#include "parallel.h"

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

namespace pagedllm {

namespace {

// The row of a weight of `rows` rows that feeds column j of panel p; -1 where the panel is zero-padded.
int64_t source_row(int64_t p, int64_t j, int64_t rows, bool gated) {
  if (!gated) {
    const int64_t row = p * kPanelCols + j;
    return row < rows ? row : -1;
  }
  const int64_t n = rows / 2, output = p * kGatedPanelOutputs + j % kGatedPanelOutputs;
  return output < n ? output + (j < kGatedPanelOutputs ? 0 : n) : -1;  // gate rows, then up rows
}

}  // namespace

template <typename T>
void pack_linear_weight(const T* w, int64_t rows, int64_t k, bool gated, T* panels) {
  constexpr int64_t per_column = std::is_same_v<T, float> ? 1 : 2;
  const int64_t height = panel_rows<T>(k);
  parallel_chunks(num_panels(gated ? rows / 2 : rows, gated), 1, [&](int64_t begin, int64_t end) {
    for (int64_t p = begin; p < end; ++p)
      for (int64_t j = 0; j < kPanelCols; ++j) {
        const int64_t row = source_row(p, j, rows, gated);
        for (int64_t i = 0; i < height; ++i)
          for (int64_t e = 0; e < per_column; ++e) {
            const int64_t input = i * per_column + e;
            panels[((p * height + i) * kPanelCols + j) * per_column + e] = row >= 0 && input < k ? w[row * k + input] : T{};
          }
      }
  });
}

template void pack_linear_weight<float>(const float*, int64_t, int64_t, bool, float*);
template void pack_linear_weight<bf16_t>(const bf16_t*, int64_t, int64_t, bool, bf16_t*);

#if defined(__AVX512F__)

namespace {

constexpr int64_t kTileRows = 8;     // rows of x per register tile: 8 x 3 accumulators
constexpr int64_t kRowChunk = 512;   // rows per pass over the weights (more: x no longer stays in cache)
constexpr int64_t kPanelRowBytes = kPanelCols * 4;  // 3 cache lines, float32 or bfloat16 pairs alike

// Lanes of vector c (columns 16c .. 16c + 15) that fall inside the panel's `cols` real columns.
__mmask16 column_mask(int64_t cols, int c) {
  const int64_t lanes = std::clamp<int64_t>(cols - 16 * c, 0, 16);
  return static_cast<__mmask16>((1u << lanes) - 1u);
}

void prefetch_row(const void* next, int64_t i) {
  const char* line = static_cast<const char*>(next) + i * kPanelRowBytes;
  for (int c = 0; c < 3; ++c) _mm_prefetch(line + 64 * c, _MM_HINT_T1);
}

// float32: acc[r] += x[r, i] * panel row i, over the k panel rows.
struct F32 {
  using T = float;
  static __m512 load_bias(const float* bias, __mmask16 mask) { return _mm512_maskz_loadu_ps(mask, bias); }
  static void store(float* y, __mmask16 mask, __m512 v) { _mm512_mask_storeu_ps(y, mask, v); }

  // With kPrefetch the lines of `next` are requested too (two loops rather than a test per step: the loop
  // needs every register).
  template <int kRows, bool kPrefetch>
  static void multiply(const float* x, int64_t k, const float* panel, const float* next, __m512 (&acc)[kRows][3]) {
    for (int64_t i = 0; i < k; ++i) {
      const float* w = panel + i * kPanelCols;
      if (kPrefetch) prefetch_row(next, i);
      const __m512 w0 = _mm512_loadu_ps(w), w1 = _mm512_loadu_ps(w + 16), w2 = _mm512_loadu_ps(w + 32);
      for (int r = 0; r < kRows; ++r) {
        const __m512 a = _mm512_set1_ps(x[r * k + i]);
        acc[r][0] = _mm512_fmadd_ps(a, w0, acc[r][0]);
        acc[r][1] = _mm512_fmadd_ps(a, w1, acc[r][1]);
        acc[r][2] = _mm512_fmadd_ps(a, w2, acc[r][2]);
      }
    }
  }
};

#if defined(__AVX512BF16__) && defined(__AVX512BW__) && defined(__AVX512VL__)
// bfloat16: acc[r] += x[r, 2i] * w[2i] + x[r, 2i + 1] * w[2i + 1] per column, over the k / 2 panel rows.
struct BF16 {
  using T = bf16_t;
  static __m512 load_bias(const bf16_t* bias, __mmask16 mask) {
    const __m512i wide = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(mask, bias));
    return _mm512_castsi512_ps(_mm512_slli_epi32(wide, 16));
  }
  static void store(bf16_t* y, __mmask16 mask, __m512 v) {  // rounded to nearest even
    _mm256_mask_storeu_epi16(y, mask, reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(v)));
  }

  template <int kRows, bool kPrefetch>
  static void multiply(const bf16_t* x, int64_t k, const bf16_t* panel, const bf16_t* next,
                       __m512 (&acc)[kRows][3]) {
    for (int64_t i = 0; i < k / 2; ++i) {
      const bf16_t* w = panel + i * 2 * kPanelCols;
      if (kPrefetch) prefetch_row(next, i);
      const __m512bh w0 = reinterpret_cast<__m512bh>(_mm512_loadu_si512(w));
      const __m512bh w1 = reinterpret_cast<__m512bh>(_mm512_loadu_si512(w + 32));
      const __m512bh w2 = reinterpret_cast<__m512bh>(_mm512_loadu_si512(w + 64));
      for (int r = 0; r < kRows; ++r) {
        int32_t pair;
        std::memcpy(&pair, x + r * k + 2 * i, sizeof pair);
        const __m512bh a = reinterpret_cast<__m512bh>(_mm512_set1_epi32(pair));
        acc[r][0] = _mm512_dpbf16_ps(acc[r][0], a, w0);
        acc[r][1] = _mm512_dpbf16_ps(acc[r][1], a, w1);
        acc[r][2] = _mm512_dpbf16_ps(acc[r][2], a, w2);
      }
    }
  }
};
#endif

// The accumulators' start for panel p: its bias columns, in the panel's column order, or zero.
template <typename Op>
void panel_start(const typename Op::T* bias, int64_t p, int64_t n, bool gated, int64_t cols, __m512 (&start)[3]) {
  if (bias == nullptr) {
    for (int c = 0; c < 3; ++c) start[c] = _mm512_setzero_ps();
  } else if (!gated) {
    for (int c = 0; c < 3; ++c) start[c] = Op::load_bias(bias + p * kPanelCols + 16 * c, column_mask(cols, c));
  } else {
    alignas(64) float values[kPanelCols];
    for (int64_t j = 0; j < kPanelCols; ++j) {
      const int64_t row = source_row(p, j, 2 * n, true);
      values[j] = row >= 0 ? to_float(bias[row]) : 0.0f;
    }
    for (int c = 0; c < 3; ++c) start[c] = _mm512_load_ps(values + 16 * c);
  }
}

__m512 silu(__m512 x) {
  const f32x16 v = bit_cast<f32x16>(x);
  return bit_cast<__m512>(v / (1.0f + fast_exp(-v)));
}

// A gated panel's row: gate 0-15 | gate 16-23, up 0-7 | up 8-23 -> y[0 .. cols) = silu(gate) * up.
template <typename Op>
void store_gated(typename Op::T* y, int64_t cols, const __m512 (&acc)[3]) {
  const __m512i up_first = _mm512_setr_epi32(8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23);
  const __m512 up0 = _mm512_permutex2var_ps(acc[1], up_first, acc[2]);               // up 0-15
  const __m512 up1 = _mm512_shuffle_f32x4(acc[2], acc[2], _MM_SHUFFLE(3, 2, 3, 2));  // lanes 0-7: up 16-23
  Op::store(y, column_mask(cols, 0), _mm512_mul_ps(silu(acc[0]), up0));
  Op::store(y + 16, column_mask(cols, 1), _mm512_mul_ps(silu(acc[1]), up1));
}

// y[r, 0 .. cols) for kRows rows (x rows k apart, y rows ldy apart): x[r] . panel + start, or for a gated
// panel silu(gate) * up of that. `next`: the panel this thread reads after this one, or null.
template <typename Op, int kRows>
void tile(const typename Op::T* x, int64_t k, const typename Op::T* panel, const typename Op::T* next,
          const __m512 (&start)[3], bool gated, int64_t cols, typename Op::T* y, int64_t ldy) {
  __m512 acc[kRows][3];
  // unrolled: as loops, GCC turns a zero start into a call to memset (~1% of a decode step)
#pragma GCC unroll 3
  for (int c = 0; c < 3; ++c)
#pragma GCC unroll 8
    for (int r = 0; r < kRows; ++r) acc[r][c] = start[c];
  if (next != nullptr)
    Op::template multiply<kRows, true>(x, k, panel, next, acc);
  else
    Op::template multiply<kRows, false>(x, k, panel, nullptr, acc);
  for (int r = 0; r < kRows; ++r) {
    if (gated) {
      store_gated<Op>(y + r * ldy, cols, acc[r]);
      continue;
    }
    for (int c = 0; c < 3; ++c) Op::store(y + r * ldy + 16 * c, column_mask(cols, c), acc[r][c]);
  }
}

template <typename Op>
void run(const typename Op::T* x, int64_t m, int64_t k, const typename Op::T* panels, const typename Op::T* bias,
         int64_t n, bool gated, typename Op::T* y) {
  using T = typename Op::T;
  using TileFn = void (*)(const T*, int64_t, const T*, const T*, const __m512(&)[3], bool, int64_t, T*, int64_t);
  static constexpr TileFn tiles[kTileRows + 1] = {nullptr,        tile<Op, 1>, tile<Op, 2>, tile<Op, 3>, tile<Op, 4>,
                                                  tile<Op, 5>, tile<Op, 6>, tile<Op, 7>, tile<Op, 8>};
  const int64_t panel_size = panel_rows<T>(k) * kPanelRowBytes / static_cast<int64_t>(sizeof(T));
  const int64_t outputs = panel_outputs(gated);
  for (int64_t m0 = 0; m0 < m; m0 += kRowChunk) {
    const int64_t rows = std::min(kRowChunk, m - m0);
    parallel_chunks(num_panels(n, gated), 1, [&](int64_t begin, int64_t end) {
      for (int64_t p = begin; p < end; ++p) {
        const T* panel = panels + p * panel_size;
        const T* next = p + 1 < end ? panel + panel_size : nullptr;
        const int64_t cols = std::min(outputs, n - p * outputs);
        __m512 start[3];
        panel_start<Op>(bias, p, n, gated, cols, start);
        for (int64_t r = 0; r < rows; r += kTileRows)
          tiles[std::min(kTileRows, rows - r)](x + (m0 + r) * k, k, panel, r == 0 ? next : nullptr, start, gated,
                                               cols, y + (m0 + r) * n + p * outputs, n);
      }
    });
  }
}

}  // namespace

template <>
bool has_linear_kernel<float>() { return true; }

template <>
void linear<float>(const float* x, int64_t m, int64_t k, const float* panels, const float* bias, int64_t n, bool gated,
                   float* y) {
  run<F32>(x, m, k, panels, bias, n, gated, y);
}

#else  // no AVX-512

template <>
bool has_linear_kernel<float>() { return false; }

template <>
void linear<float>(const float*, int64_t, int64_t, const float*, const float*, int64_t, bool, float*) {
  throw std::runtime_error("the float32 linear kernel needs AVX-512; this build has none");
}

#endif

#if defined(__AVX512F__) && defined(__AVX512BF16__) && defined(__AVX512BW__) && defined(__AVX512VL__)

template <>
bool has_linear_kernel<bf16_t>() { return true; }

template <>
void linear<bf16_t>(const bf16_t* x, int64_t m, int64_t k, const bf16_t* panels, const bf16_t* bias, int64_t n,
                    bool gated, bf16_t* y) {
  run<BF16>(x, m, k, panels, bias, n, gated, y);
}

#else  // no AVX512-BF16

template <>
bool has_linear_kernel<bf16_t>() { return false; }

template <>
void linear<bf16_t>(const bf16_t*, int64_t, int64_t, const bf16_t*, const bf16_t*, int64_t, bool, bf16_t*) {
  throw std::runtime_error("the bfloat16 linear kernel needs AVX512-BF16; this build has none");
}

#endif

}  // namespace pagedllm
