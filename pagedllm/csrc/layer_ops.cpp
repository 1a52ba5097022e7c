#include "layer_ops.h"

#include <cmath>

#include "parallel.h"
#include "vec.h"

namespace pagedllm {
namespace {

// x rounded to T's precision, as float (what the reference gets by casting to T and back).
inline float rounded(float x, float*) { return x; }
inline float rounded(float x, bf16_t*) { return to_float(round_to_bf16(x)); }
inline fvec rounded(fvec x, float*) { return x; }
inline fvec rounded(fvec x, bf16_t*) { return round_to_bf16(x); }

// f(i, values at i) over [0, width): a vector's lanes at a time, then the tail one by one.
template <typename VecF, typename ScalarF>
void for_lanes(int64_t width, const VecF& vec_f, const ScalarF& scalar_f) {
  int64_t i = 0;
  for (; i + kLanes <= width; i += kLanes) vec_f(i);
  for (; i < width; ++i) scalar_f(i);
}

template <typename T>
void norm_row(T* x, const T* src, const T* weight, int64_t width, float eps) {
  fvec squares{};
  float tail = 0.0f;
  for_lanes(width, [&](int64_t i) { const fvec v = loadv(src + i); squares += v * v; },
            [&](int64_t i) { tail += to_float(src[i]) * to_float(src[i]); });
  const float inv = 1.0f / std::sqrt((reduce_add(squares) + tail) / static_cast<float>(width) + eps);
  T* tag = nullptr;
  for_lanes(width, [&](int64_t i) { storev(x + i, loadv(weight + i) * rounded(loadv(src + i) * inv, tag)); },
            [&](int64_t i) { store(x + i, to_float(weight[i]) * rounded(to_float(src[i]) * inv, tag)); });
}

}  // namespace

template <typename T>
void add_rms_norm(T* x, int64_t x_stride, T* residual, int64_t residual_stride, const T* weight, int64_t rows,
                  int64_t width, float eps) {
  parallel_chunks(rows, 16, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      T* xr = x + r * x_stride;
      if (residual == nullptr) {
        norm_row(xr, xr, weight, width, eps);
        continue;
      }
      T* res = residual + r * residual_stride;
      for_lanes(width, [&](int64_t i) { storev(res + i, loadv(res + i) + loadv(xr + i)); },
                [&](int64_t i) { store(res + i, to_float(res[i]) + to_float(xr[i])); });
      norm_row(xr, res, weight, width, eps);
    }
  });
}

template <typename T>
void head_rms_norm(T* x, int64_t stride, int64_t rows, int64_t num_heads, int64_t head_dim, const T* weight,
                   float eps) {
  parallel_chunks(rows, 16, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r)
      for (int64_t h = 0; h < num_heads; ++h) {
        T* head = x + r * stride + h * head_dim;
        norm_row(head, head, weight, head_dim, eps);
      }
  });
}

template <typename T>
void rotary(T* x, int64_t stride, int64_t rows, int64_t num_heads, int64_t head_dim, const T* cos, const T* sin) {
  const int64_t half = head_dim / 2;
  parallel_chunks(rows, 16, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const T* c = cos + r * head_dim;
      const T* s = sin + r * head_dim;
      for (int64_t h = 0; h < num_heads; ++h) {
        T* lo = x + r * stride + h * head_dim;
        T* hi = lo + half;
        for_lanes(
            half,
            [&](int64_t i) {
              const fvec a = loadv(lo + i), b = loadv(hi + i);
              storev(lo + i, a * loadv(c + i) - b * loadv(s + i));
              storev(hi + i, b * loadv(c + half + i) + a * loadv(s + half + i));
            },
            [&](int64_t i) {
              const float a = to_float(lo[i]), b = to_float(hi[i]);
              store(lo + i, a * to_float(c[i]) - b * to_float(s[i]));
              store(hi + i, b * to_float(c[half + i]) + a * to_float(s[half + i]));
            });
      }
    }
  });
}

template <typename T>
void silu_mul(const T* x, T* out, int64_t rows, int64_t width) {
  parallel_chunks(rows, 16, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const T* gate = x + r * 2 * width;
      const T* up = gate + width;
      T* dst = out + r * width;
      int64_t i = 0;
      for (; i + kLanes <= width; i += kLanes) {  // in vectors: GCC left the bfloat16 loop scalar
        const fvec g = loadv(gate + i);
        storev(dst + i, g / (1.0f + fast_exp(-g)) * loadv(up + i));
      }
      for (; i < width; ++i) {
        const float g = to_float(gate[i]);
        store(dst + i, g / (1.0f + fast_exp(-g)) * to_float(up[i]));
      }
    }
  });
}

template void add_rms_norm<float>(float*, int64_t, float*, int64_t, const float*, int64_t, int64_t, float);
template void add_rms_norm<bf16_t>(bf16_t*, int64_t, bf16_t*, int64_t, const bf16_t*, int64_t, int64_t, float);
template void head_rms_norm<float>(float*, int64_t, int64_t, int64_t, int64_t, const float*, float);
template void head_rms_norm<bf16_t>(bf16_t*, int64_t, int64_t, int64_t, int64_t, const bf16_t*, float);
template void rotary<float>(float*, int64_t, int64_t, int64_t, int64_t, const float*, const float*);
template void rotary<bf16_t>(bf16_t*, int64_t, int64_t, int64_t, int64_t, const bf16_t*, const bf16_t*);
template void silu_mul<float>(const float*, float*, int64_t, int64_t);
template void silu_mul<bf16_t>(const bf16_t*, bf16_t*, int64_t, int64_t);

}  // namespace pagedllm
