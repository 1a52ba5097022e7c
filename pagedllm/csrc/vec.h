// Scalar and vector helpers: bfloat16 <-> float conversion by bit shifts, and an exp without library calls.
// The vectors are GCC vector extensions as wide as the CPU's registers: 16 floats with AVX-512, 8 without.
// (A 16-float vector type on an AVX2 build is kept in memory and copied 8 bytes at a time through general
// registers: the attention kernel ran 10-25x slower than its AVX-512 build instead of about 2x.)
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <utility>

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

namespace pagedllm {

using bf16_t = uint16_t;  // bfloat16 storage: the high half of a float32

inline float to_float(float x) { return x; }

inline float to_float(bf16_t x) {
  const uint32_t bits = static_cast<uint32_t>(x) << 16;
  float out;
  std::memcpy(&out, &bits, sizeof out);
  return out;
}

inline bf16_t round_to_bf16(float x) {
  uint32_t bits;
  std::memcpy(&bits, &x, sizeof bits);
  const uint32_t rounded = (bits + 0x7FFFu + ((bits >> 16) & 1u)) >> 16;  // round to nearest even
  return static_cast<bf16_t>(x != x ? 0x7FC0u : rounded);
}

inline void store(float* dst, float x) { *dst = x; }
inline void store(bf16_t* dst, float x) { *dst = round_to_bf16(x); }

#if defined(__AVX512F__)
constexpr int64_t kLanes = 16;
#else
constexpr int64_t kLanes = 8;
#endif
typedef float fvec __attribute__((vector_size(4 * kLanes)));
typedef int32_t ivec __attribute__((vector_size(4 * kLanes)));
typedef uint32_t uvec __attribute__((vector_size(4 * kLanes)));
typedef uint16_t hvec __attribute__((vector_size(2 * kLanes)));
typedef float f32x8 __attribute__((vector_size(32)));
typedef float f32x4 __attribute__((vector_size(16)));

// Same bits, another type (compiles to nothing).
template <typename To, typename From>
inline To bit_cast(From v) {
  static_assert(sizeof(To) == sizeof(From));
  To out;
  std::memcpy(&out, &v, sizeof out);
  return out;
}

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

inline fvec splat(float x) { return fvec{} + x; }

// v, held in a register: for a vector that feeds several FMAs GCC otherwise folds its load into each of them,
// one load per FMA.
inline fvec in_register(fvec v) {
  asm("" : "+v"(v));
  return v;
}

inline fvec loadv(const float* p) {
  fvec v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

#if defined(__AVX512F__)
// 16 bfloat16 values as float32 (exact: their bits become the high halves).
inline fvec widen_bf16(__m256i halves) { return bit_cast<fvec>(_mm512_slli_epi32(_mm512_cvtepu16_epi32(halves), 16)); }
#endif

inline fvec loadv(const bf16_t* p) {
#if defined(__AVX512F__)
  // one widening load (GCC splits the generic conversion below into 256-bit halves and re-joins them)
  return widen_bf16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
#else
  hvec half;
  std::memcpy(&half, p, sizeof half);
  return bit_cast<fvec>(__builtin_convertvector(half, uvec) << 16);
#endif
}

inline void storev(float* p, fvec v) { std::memcpy(p, &v, sizeof v); }

// The bfloat16 bits of v (round to nearest even; NaN stays NaN), in the high halves of 32-bit lanes.
inline uvec bf16_bits(fvec v) {
  const uvec bits = bit_cast<uvec>(v);
  const uvec rounded = (bits + 0x7FFFu + ((bits >> 16) & 1u)) & 0xFFFF0000u;
  return v != v ? uvec{} + 0x7FC00000u : rounded;
}

// v rounded to bfloat16 precision, kept as float; and v stored as bfloat16. With AVX512-BF16 by the hardware
// conversion, the same round to nearest even in one instruction for the integer steps' ten (a decode step's
// layers 1-3% faster, a prompt's RMSNorm 29%: docs/benchmarks.md); it reads a denormal as zero, and a NaN
// keeps its sign and payload.
#if defined(__AVX512BF16__)
inline __m256i bf16_halves(fvec v) { return reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(bit_cast<__m512>(v))); }

inline fvec round_to_bf16(fvec v) { return widen_bf16(bf16_halves(v)); }

inline void storev(bf16_t* p, fvec v) { _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), bf16_halves(v)); }

#if defined(__AVX512BW__) && defined(__AVX512VL__)
// The lanes of mask only: v stored as bfloat16 at p (the others left as they are), or the bfloat16 at p loaded as
// float32 (the others zero).
inline void storev(bf16_t* p, fvec v, __mmask16 mask) { _mm256_mask_storeu_epi16(p, mask, bf16_halves(v)); }

inline fvec loadv(const bf16_t* p, __mmask16 mask) { return widen_bf16(_mm256_maskz_loadu_epi16(mask, p)); }
#endif
#else
inline fvec round_to_bf16(fvec v) { return bit_cast<fvec>(bf16_bits(v)); }

inline void storev(bf16_t* p, fvec v) {
  const hvec half = __builtin_convertvector(bf16_bits(v) >> 16, hvec);
  std::memcpy(p, &half, sizeof half);
}
#endif

inline fvec vmax(fvec a, fvec b) { return a > b ? a : b; }
inline f32x8 vmax8(f32x8 a, f32x8 b) { return a > b ? a : b; }

#if defined(__AVX512F__)
constexpr fvec kIota = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
inline f32x8 low_half(fvec v) { return __builtin_shufflevector(v, v, 0, 1, 2, 3, 4, 5, 6, 7); }
inline f32x8 high_half(fvec v) { return __builtin_shufflevector(v, v, 8, 9, 10, 11, 12, 13, 14, 15); }
inline f32x8 fold_sum(fvec v) { return low_half(v) + high_half(v); }
inline f32x8 fold_max(fvec v) { return vmax8(low_half(v), high_half(v)); }
#else
constexpr fvec kIota = {0, 1, 2, 3, 4, 5, 6, 7};
inline f32x8 fold_sum(fvec v) { return v; }
inline f32x8 fold_max(fvec v) { return v; }
#endif

inline float reduce_add(fvec v) {
  const f32x8 a = fold_sum(v);
  const f32x4 b = __builtin_shufflevector(a, a, 0, 1, 2, 3) + __builtin_shufflevector(a, a, 4, 5, 6, 7);
  return (b[0] + b[2]) + (b[1] + b[3]);
}

inline float reduce_max(fvec v) {
  const f32x8 a = fold_max(v);
  float out = a[0];
  for (int i = 1; i < 8; ++i) out = out > a[i] ? out : a[i];
  return out;
}

#if defined(__AVX512F__)
// The first kLanes / 2 of transpose_sums' inputs taken as far as one vector (lanes 2j and 2j + 1: two partial sums
// of x[j]); join_sums makes the sums of x[0 .. kLanes / 2) and x[kLanes / 2 .. kLanes) out of two such vectors.
inline fvec half_sums(const fvec* x) {
  fvec t[4], u[2];
  for (int i = 0; i < 4; ++i)  // lanes 0-7: 8 partials of x[2i]; lanes 8-15: of x[2i+1]
    t[i] = __builtin_shufflevector(x[2 * i], x[2 * i + 1], 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23) +
           __builtin_shufflevector(x[2 * i], x[2 * i + 1], 8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31);
  for (int i = 0; i < 2; ++i)  // 4 partials each of 4 consecutive x
    u[i] = __builtin_shufflevector(t[2 * i], t[2 * i + 1], 0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26, 27) +
           __builtin_shufflevector(t[2 * i], t[2 * i + 1], 4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23, 28, 29, 30, 31);
  // 2 partials each of the 8 x
  return __builtin_shufflevector(u[0], u[1], 0, 1, 4, 5, 8, 9, 12, 13, 16, 17, 20, 21, 24, 25, 28, 29) +
         __builtin_shufflevector(u[0], u[1], 2, 3, 6, 7, 10, 11, 14, 15, 18, 19, 22, 23, 26, 27, 30, 31);
}

inline fvec join_sums(fvec low, fvec high) {
  return __builtin_shufflevector(low, high, 0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30) +
         __builtin_shufflevector(low, high, 1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
}
#else
inline fvec half_sums(const fvec* x) {
  fvec t[2];
  for (int i = 0; i < 2; ++i)  // lanes 0-3: 4 partials of x[2i]; lanes 4-7: of x[2i+1]
    t[i] = __builtin_shufflevector(x[2 * i], x[2 * i + 1], 0, 1, 2, 3, 8, 9, 10, 11) +
           __builtin_shufflevector(x[2 * i], x[2 * i + 1], 4, 5, 6, 7, 12, 13, 14, 15);
  // 2 partials each of the 4 x
  return __builtin_shufflevector(t[0], t[1], 0, 1, 4, 5, 8, 9, 12, 13) +
         __builtin_shufflevector(t[0], t[1], 2, 3, 6, 7, 10, 11, 14, 15);
}

inline fvec join_sums(fvec low, fvec high) {
  return __builtin_shufflevector(low, high, 0, 2, 4, 6, 8, 10, 12, 14) +
         __builtin_shufflevector(low, high, 1, 3, 5, 7, 9, 11, 13, 15);
}
#endif

// kLanes horizontal sums at once: lane j of the result is the sum of the lanes of x[j] (j < kLanes), by a
// tree of two-vector shuffles (kLanes - 1 steps of 2 shuffles + 1 add) instead of kLanes reductions.
inline fvec transpose_sums(const fvec* x) { return join_sums(half_sums(x), half_sums(x + kLanes / 2)); }

// A kLanes x kLanes block transposed in registers: x[i] lane j <- x[j] lane i. Stage h (kLanes / 2, ..., 1)
// swaps the off-diagonal h x h blocks of every 2h x 2h block: log2(kLanes) stages of kLanes two-vector shuffles,
// where a scalar transpose takes kLanes^2 loads and stores.
template <int kHalf, bool kUpperRow, int... kLane>
inline fvec swap_off_diagonal(fvec a, fvec b, std::integer_sequence<int, kLane...>) {
  if constexpr (kUpperRow)  // row i: keeps its left half, takes row i + h's left half as its right half
    return __builtin_shufflevector(a, b, ((kLane & kHalf) ? kLanes + kLane - kHalf : kLane)...);
  else  // row i + h: takes row i's right half as its left half, keeps its right half
    return __builtin_shufflevector(a, b, ((kLane & kHalf) ? kLanes + kLane : kLane + kHalf)...);
}

template <int kHalf>
inline void transpose_stage(fvec (&x)[kLanes]) {
  constexpr auto lanes = std::make_integer_sequence<int, kLanes>{};
  for (int i = 0; i < kLanes; ++i)
    if ((i & kHalf) == 0) {
      const fvec a = x[i], b = x[i + kHalf];
      x[i] = swap_off_diagonal<kHalf, true>(a, b, lanes);
      x[i + kHalf] = swap_off_diagonal<kHalf, false>(a, b, lanes);
    }
}

inline void transpose(fvec (&x)[kLanes]) {
  if constexpr (kLanes == 16) transpose_stage<8>(x);
  transpose_stage<4>(x);
  transpose_stage<2>(x);
  transpose_stage<1>(x);
}

// dst rows [0, kLanes) (dst_stride apart) <- the transpose of the kLanes x kLanes block at src (src_stride apart).
inline void transpose_block(const float* src, int64_t src_stride, float* dst, int64_t dst_stride) {
  fvec x[kLanes];
  for (int i = 0; i < kLanes; ++i) x[i] = loadv(src + i * src_stride);
  transpose(x);
  for (int i = 0; i < kLanes; ++i) storev(dst + i * dst_stride, x[i]);
}

// e^f for f = x - n ln 2 (ln 2 = hi + lo, |f| <= ln(2) / 2) by its degree-7 Taylor polynomial.
template <typename F>
inline F exp_reduced(F x, F n) {
  const F f = (x - n * 0.693145751953125f) - n * 1.428606765330187045e-06f;
  F p = f * (1.0f / 5040.0f) + 1.0f / 720.0f;
  p = p * f + 1.0f / 120.0f;
  p = p * f + 1.0f / 24.0f;
  p = p * f + 1.0f / 6.0f;
  p = p * f + 0.5f;
  p = p * f + 1.0f;
  return p * f + 1.0f;
}

// e^x within ~2 float ulps for x in [-87, 88]; exactly 0 below -87 (so a masked score of -inf weighs 0).
// e^x = 2^n * e^f with n = round(x / ln 2) (exp_reduced). One body for a float (F = float, I = int32_t) and
// for a vector (F = fvec, I = ivec).
template <typename F, typename I>
inline F exp_approx(F x) {
  const F zero{};
  const F clamped = x < -87.0f ? zero - 87.0f : (x > 88.0f ? zero + 88.0f : x);
  const F shifted = clamped * 1.44269504088896341f + 12582912.0f;  // + 1.5 * 2^23 rounds to an integer
  const F n = shifted - 12582912.0f;
  const I n_int = bit_cast<I>(shifted) - 0x4B400000;  // that integer, from the low bits
  return x < -87.0f ? zero : exp_reduced(clamped, n) * bit_cast<F>((n_int + 127) << 23);
}

inline float fast_exp(float x) { return exp_approx<float, int32_t>(x); }
#if defined(__AVX512F__)
// exp_approx's values (n, f and the polynomial the same), in two thirds of its instructions: n rounded by
// vroundscaleps, 2^n applied by vscalefps, and no lower clamp (its values are masked to 0 at the end).
inline fvec fast_exp(fvec x) {
  const __m512 clamped = _mm512_min_ps(_mm512_set1_ps(88.0f), bit_cast<__m512>(x));  // a NaN stays a NaN
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(clamped, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const fvec p = exp_reduced(bit_cast<fvec>(clamped), bit_cast<fvec>(n));
  const __mmask16 live = _mm512_cmp_ps_mask(bit_cast<__m512>(x), _mm512_set1_ps(-87.0f), _CMP_NLT_UQ);
  return bit_cast<fvec>(_mm512_maskz_scalef_ps(live, bit_cast<__m512>(p), n));
}
#else
inline fvec fast_exp(fvec x) { return exp_approx<fvec, ivec>(x); }
#endif

#if defined(__AVX512F__)
// 2^x within ~3e-6 relative, for values rounded to bfloat16 next (AMX attention's probabilities): 2^n by
// vscalefps, 2^f (|f| <= 1/2) by its degree-5 Taylor polynomial; 0 below -126, a masked -inf included. About
// half the instructions of fast_exp.
inline fvec coarse_exp2(fvec x) {
  const __m512 v = bit_cast<__m512>(x);
  const __m512 n = _mm512_roundscale_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const fvec f = bit_cast<fvec>(_mm512_sub_ps(v, n));
  fvec p = f * 1.3333558146428443e-3f + 9.618129107628477e-3f;
  p = p * f + 5.550410866482158e-2f;
  p = p * f + 0.2402265069591007f;
  p = p * f + 0.6931471805599453f;
  p = p * f + 1.0f;
  const __mmask16 live = _mm512_cmp_ps_mask(v, _mm512_set1_ps(-126.0f), _CMP_GE_OQ);
  return bit_cast<fvec>(_mm512_maskz_scalef_ps(live, bit_cast<__m512>(p), n));
}
#else
inline fvec coarse_exp2(fvec x) { return fast_exp(x * 0.6931471805599453f); }
#endif

}  // namespace pagedllm
