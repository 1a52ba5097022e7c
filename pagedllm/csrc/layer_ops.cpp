#include "layer_ops.h"

#include <cmath>

#include "parallel.h"
#include "vec.h"

namespace pagedllm {
namespace {

template <typename T>
T round_to(float x) {
  T out;
  store(&out, x);
  return out;
}

template <typename T>
void norm_row(T* x, const T* src, const T* weight, int64_t width, float eps) {
  float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
  for (int64_t i = 0; i < width; ++i) sum += to_float(src[i]) * to_float(src[i]);
  const float inv = 1.0f / std::sqrt(sum / static_cast<float>(width) + eps);
  for (int64_t i = 0; i < width; ++i)
    store(x + i, to_float(weight[i]) * to_float(round_to<T>(to_float(src[i]) * inv)));
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
      for (int64_t i = 0; i < width; ++i) store(res + i, to_float(res[i]) + to_float(xr[i]));
      norm_row(xr, res, weight, width, eps);
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
        T* head = x + r * stride + h * head_dim;
        for (int64_t i = 0; i < half; ++i) {
          const float lo = to_float(head[i]), hi = to_float(head[i + half]);
          store(head + i, lo * to_float(c[i]) - hi * to_float(s[i]));
          store(head + i + half, hi * to_float(c[i + half]) + lo * to_float(s[i + half]));
        }
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
      for (int64_t i = 0; i < width; ++i) {
        const float g = to_float(gate[i]);
        store(dst + i, g / (1.0f + fast_exp(-g)) * to_float(up[i]));
      }
    }
  });
}

template void add_rms_norm<float>(float*, int64_t, float*, int64_t, const float*, int64_t, int64_t, float);
template void add_rms_norm<bf16_t>(bf16_t*, int64_t, bf16_t*, int64_t, const bf16_t*, int64_t, int64_t, float);
template void rotary<float>(float*, int64_t, int64_t, int64_t, int64_t, const float*, const float*);
template void rotary<bf16_t>(bf16_t*, int64_t, int64_t, int64_t, int64_t, const bf16_t*, const bf16_t*);
template void silu_mul<float>(const float*, float*, int64_t, int64_t);
template void silu_mul<bf16_t>(const bf16_t*, bf16_t*, int64_t, int64_t);

}  // namespace pagedllm
