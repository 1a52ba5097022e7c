// The tensor-level ops of bindings.cpp (their checks, then the raw kernels), for C++ callers as well as Python
// (decoder_stack.cpp composes them).
#pragma once

#include <torch/extension.h>

#include "amx_linear.h"
#include "cache_ops.h"
#include "paged_attention.h"

namespace pagedllm {

// The checked arguments of paged_attention_op, and the call itself (bf16: the cache's dtype), for callers that
// make the same call on several layers' caches.
PagedAttentionArgs attention_args(torch::Tensor out, const torch::Tensor& query, const torch::Tensor& kv_cache,
                                  const torch::Tensor& block_tables, const torch::Tensor& seq_lens,
                                  const torch::Tensor& query_start_loc, double scale, int64_t partition_size);
void paged_attention(const PagedAttentionArgs& args, bool bf16);
void paged_attention_op(torch::Tensor out, const torch::Tensor& query, const torch::Tensor& kv_cache,
                        const torch::Tensor& block_tables, const torch::Tensor& seq_lens,
                        const torch::Tensor& query_start_loc, double scale, int64_t partition_size);
// write_kv_op's checks; the cache's shape.
CacheShape kv_write_shape(const torch::Tensor& key, const torch::Tensor& value, const torch::Tensor& kv_cache,
                          const torch::Tensor& slot_mapping);
void write_kv_op(const torch::Tensor& key, const torch::Tensor& value, torch::Tensor kv_cache,
                 const torch::Tensor& slot_mapping);
void add_rms_norm_op(torch::Tensor x, const c10::optional<torch::Tensor>& residual, const torch::Tensor& weight,
                     double eps);
void rotary_op(torch::Tensor x, const torch::Tensor& cos, const torch::Tensor& sin);
void head_rms_norm_op(torch::Tensor x, const torch::Tensor& weight, double eps);
torch::Tensor silu_mul_op(const torch::Tensor& x);
torch::Tensor linear_op(const torch::Tensor& x, const torch::Tensor& panels, const c10::optional<torch::Tensor>& bias,
                        int64_t out_features, bool gated);
// Block tiles from pack_amx_blocks of the weight whose pack_amx_linear panels are `panels`, checked (none: none).
BlockTiles block_tiles(const c10::optional<torch::Tensor>& blocks, const torch::Tensor& panels);
torch::Tensor amx_linear_op(const torch::Tensor& x, const torch::Tensor& panels,
                            const c10::optional<torch::Tensor>& bias, int64_t out_features, bool gated,
                            bool float_output = false, const c10::optional<torch::Tensor>& blocks = c10::nullopt);

}  // namespace pagedllm
