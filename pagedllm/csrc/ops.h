// The tensor-level ops of bindings.cpp (their checks, then the raw kernels), for C++ callers as well as Python
// (decoder_stack.cpp composes them).
#pragma once

#include <torch/extension.h>

namespace pagedllm {

void paged_attention_op(torch::Tensor out, const torch::Tensor& query, const torch::Tensor& kv_cache,
                        const torch::Tensor& block_tables, const torch::Tensor& seq_lens,
                        const torch::Tensor& query_start_loc, double scale, int64_t partition_size);
void write_kv_op(const torch::Tensor& key, const torch::Tensor& value, torch::Tensor kv_cache,
                 const torch::Tensor& slot_mapping);
void add_rms_norm_op(torch::Tensor x, const c10::optional<torch::Tensor>& residual, const torch::Tensor& weight,
                     double eps);
void rotary_op(torch::Tensor x, const torch::Tensor& cos, const torch::Tensor& sin);
torch::Tensor silu_mul_op(const torch::Tensor& x);
torch::Tensor linear_op(const torch::Tensor& x, const torch::Tensor& panels, const c10::optional<torch::Tensor>& bias,
                        int64_t out_features, bool gated);
torch::Tensor amx_linear_op(const torch::Tensor& x, const torch::Tensor& panels,
                            const c10::optional<torch::Tensor>& bias, int64_t out_features, bool gated,
                            bool float_output = false);

}  // namespace pagedllm
