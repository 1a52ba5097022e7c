// Scalar helpers written so that the compiler vectorizes the loops that use them (-O3 -march=native):
// bfloat16 <-> float conversion by bit shifts, and an exp without library calls.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

namespace pagedllm {

using bf16_t = uint16_t;  // bfloat16 storage: the high half of a float32

inline float to_float(float x) { return x; }

inline float to_float(bf16_t x) {
  const uint32_t bits = static_cast<uint32_t>(x) << 16;
  float out;
  std::memcpy(&out, &bits, sizeof out);
  return out;
}

inline void store(float* dst, float x) { *dst = x; }

inline void store(bf16_t* dst, float x) {
  uint32_t bits;
  std::memcpy(&bits, &x, sizeof bits);
  const uint32_t rounded = (bits + 0x7FFFu + ((bits >> 16) & 1u)) >> 16;  // round to nearest even
  *dst = static_cast<bf16_t>(x != x ? 0x7FC0u : rounded);
}

// e^x within ~2 float ulps for x in [-87, 88]; exactly 0 below -87 (so a masked score of -inf weighs 0).
// e^x = 2^n * e^f with n = round(x / ln 2) and |f| <= ln(2) / 2, e^f by its degree-7 Taylor polynomial.
inline float fast_exp(float x) {
  const float clamped = std::fmin(std::fmax(x, -87.0f), 88.0f);
  const float magic = 12582912.0f;  // 1.5 * 2^23: adding it rounds to an integer kept in the low bits
  const float shifted = clamped * 1.44269504088896341f + magic;
  const float n = shifted - magic;
  int32_t n_int;
  std::memcpy(&n_int, &shifted, sizeof n_int);
  n_int -= 0x4B400000;  // the bit pattern of `magic`
  const float f = (clamped - n * 0.693145751953125f) - n * 1.428606765330187045e-06f;  // ln 2 = hi + lo
  float p = 1.0f / 5040.0f;
  p = p * f + 1.0f / 720.0f;
  p = p * f + 1.0f / 120.0f;
  p = p * f + 1.0f / 24.0f;
  p = p * f + 1.0f / 6.0f;
  p = p * f + 0.5f;
  p = p * f + 1.0f;
  p = p * f + 1.0f;
  const int32_t scale_bits = (n_int + 127) << 23;
  float scale;
  std::memcpy(&scale, &scale_bits, sizeof scale);
  return x < -87.0f ? 0.0f : p * scale;
}

}  // namespace pagedllm
