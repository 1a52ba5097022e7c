// Scalar and 16-lane vector helpers: bfloat16 <-> float conversion by bit shifts, and an exp without
// library calls. The vectors are GCC vector extensions of 16 floats; built with -march=native the compiler
// maps each operation to one AVX-512 instruction, or two AVX2 ones, whatever the CPU has.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

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

constexpr int64_t kLanes = 16;
typedef float f32x16 __attribute__((vector_size(64)));
typedef int32_t i32x16 __attribute__((vector_size(64)));
typedef uint32_t u32x16 __attribute__((vector_size(64)));
typedef uint16_t u16x16 __attribute__((vector_size(32)));
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

inline f32x16 splat(float x) { return f32x16{} + x; }

inline f32x16 load16(const float* p) {
  f32x16 v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

inline f32x16 load16(const bf16_t* p) {
#if defined(__AVX512F__)
  // one widening load (GCC splits the generic conversion below into 256-bit halves and re-joins them)
  const __m512i wide = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  return bit_cast<f32x16>(_mm512_slli_epi32(wide, 16));
#else
  u16x16 half;
  std::memcpy(&half, p, sizeof half);
  return bit_cast<f32x16>(__builtin_convertvector(half, u32x16) << 16);
#endif
}

inline void store16(float* p, f32x16 v) { std::memcpy(p, &v, sizeof v); }

// The bfloat16 bits of v (round to nearest even; NaN stays NaN), in the high halves of 32-bit lanes.
inline u32x16 bf16_bits(f32x16 v) {
  const u32x16 bits = bit_cast<u32x16>(v);
  const u32x16 rounded = (bits + 0x7FFFu + ((bits >> 16) & 1u)) & 0xFFFF0000u;
  return v != v ? u32x16{} + 0x7FC00000u : rounded;
}

// v rounded to bfloat16 precision, kept as float.
inline f32x16 round_to_bf16(f32x16 v) { return bit_cast<f32x16>(bf16_bits(v)); }

inline void store16(bf16_t* p, f32x16 v) {
  const u16x16 half = __builtin_convertvector(bf16_bits(v) >> 16, u16x16);
  std::memcpy(p, &half, sizeof half);
}

inline f32x16 vmax(f32x16 a, f32x16 b) { return a > b ? a : b; }
inline f32x8 vmax8(f32x8 a, f32x8 b) { return a > b ? a : b; }
constexpr f32x16 kIota = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};

inline float reduce_add(f32x16 v) {
  const f32x8 a = __builtin_shufflevector(v, v, 0, 1, 2, 3, 4, 5, 6, 7) +
                  __builtin_shufflevector(v, v, 8, 9, 10, 11, 12, 13, 14, 15);
  const f32x4 b = __builtin_shufflevector(a, a, 0, 1, 2, 3) + __builtin_shufflevector(a, a, 4, 5, 6, 7);
  return (b[0] + b[2]) + (b[1] + b[3]);
}

// Sixteen horizontal sums at once: lane j of the result is the sum of the lanes of x[j] (j < 16), by a
// tree of two-vector shuffles (15 steps of 2 shuffles + 1 add) instead of 16 separate reductions.
inline f32x16 transpose_sums(const f32x16* x) {
  f32x16 t[8], u[4], w[2];
  for (int i = 0; i < 8; ++i)  // lanes 0-7: 8 partials of x[2i]; lanes 8-15: of x[2i+1]
    t[i] = __builtin_shufflevector(x[2 * i], x[2 * i + 1], 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23) +
           __builtin_shufflevector(x[2 * i], x[2 * i + 1], 8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31);
  for (int i = 0; i < 4; ++i)  // 4 partials each of 4 consecutive x
    u[i] = __builtin_shufflevector(t[2 * i], t[2 * i + 1], 0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26, 27) +
           __builtin_shufflevector(t[2 * i], t[2 * i + 1], 4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23, 28, 29, 30, 31);
  for (int i = 0; i < 2; ++i)  // 2 partials each of 8 consecutive x
    w[i] = __builtin_shufflevector(u[2 * i], u[2 * i + 1], 0, 1, 4, 5, 8, 9, 12, 13, 16, 17, 20, 21, 24, 25, 28, 29) +
           __builtin_shufflevector(u[2 * i], u[2 * i + 1], 2, 3, 6, 7, 10, 11, 14, 15, 18, 19, 22, 23, 26, 27, 30, 31);
  return __builtin_shufflevector(w[0], w[1], 0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30) +
         __builtin_shufflevector(w[0], w[1], 1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
}

inline float reduce_max(f32x16 v) {
  const f32x8 a = vmax8(__builtin_shufflevector(v, v, 0, 1, 2, 3, 4, 5, 6, 7),
                        __builtin_shufflevector(v, v, 8, 9, 10, 11, 12, 13, 14, 15));
  float out = a[0];
  for (int i = 1; i < 8; ++i) out = out > a[i] ? out : a[i];
  return out;
}

// e^x within ~2 float ulps for x in [-87, 88]; exactly 0 below -87 (so a masked score of -inf weighs 0).
// e^x = 2^n * e^f with n = round(x / ln 2) and |f| <= ln(2) / 2, e^f by its degree-7 Taylor polynomial.
// One body for a float (F = float, I = int32_t) and for 16 lanes (F = f32x16, I = i32x16).
template <typename F, typename I>
inline F exp_approx(F x) {
  const F zero{};
  const F clamped = x < -87.0f ? zero - 87.0f : (x > 88.0f ? zero + 88.0f : x);
  const F shifted = clamped * 1.44269504088896341f + 12582912.0f;  // + 1.5 * 2^23 rounds to an integer
  const F n = shifted - 12582912.0f;
  const I n_int = bit_cast<I>(shifted) - 0x4B400000;  // that integer, from the low bits
  const F f = (clamped - n * 0.693145751953125f) - n * 1.428606765330187045e-06f;  // ln 2 = hi + lo
  F p = zero + 1.0f / 5040.0f;
  p = p * f + 1.0f / 720.0f;
  p = p * f + 1.0f / 120.0f;
  p = p * f + 1.0f / 24.0f;
  p = p * f + 1.0f / 6.0f;
  p = p * f + 0.5f;
  p = p * f + 1.0f;
  p = p * f + 1.0f;
  return x < -87.0f ? zero : p * bit_cast<F>((n_int + 127) << 23);
}

inline float fast_exp(float x) { return exp_approx<float, int32_t>(x); }
inline f32x16 fast_exp(f32x16 x) { return exp_approx<f32x16, i32x16>(x); }

}  // namespace pagedllm
