// A model's decoder layers in one call: the same ops, in the same order, as the compiled path's Python loop
// (pagedllm/model/llama.py), without going back to Python between them.
#pragma once

#include <torch/extension.h>

#include <vector>

#include "cache_ops.h"
#include "paged_attention.h"

namespace pagedllm {

// One projection over a weight packed by pack_amx_linear (amx) or pack_linear (gated, either: an MLP's [gate; up]
// weight, silu(gate) * up applied as the outputs are stored); blocks: for amx, optionally the same weight from
// pack_amx_blocks (see amx_linear).
struct StackMatmul {
  torch::Tensor panels;
  c10::optional<torch::Tensor> bias;
  int64_t out_features;
  bool amx, gated;
  c10::optional<torch::Tensor> blocks;

  int64_t in_features() const;
  // y [m, out_features] = x [m, in_features] W^T (+ bias), both contiguous, of the weight's dtype T.
  template <typename T>
  void operator()(const T* x, int64_t m, T* y) const;
};

struct StackLayer {
  torch::Tensor input_norm, post_norm;  // RMSNorm weights [hidden]
  StackMatmul qkv, out, gate_up, down;   // qkv: fused [q; k; v] rows; gate_up: fused [gate; up] rows
  c10::optional<torch::Tensor> q_norm, k_norm;  // RMSNorm weights [head_dim] of each q and k head (Qwen3), or none
};

class DecoderStack {
 public:
  DecoderStack(int64_t num_heads, int64_t num_kv_heads, int64_t head_dim, double eps, double scale);

  void add_layer(torch::Tensor input_norm, torch::Tensor post_norm, StackMatmul qkv, StackMatmul out,
                 StackMatmul gate_up, StackMatmul down, c10::optional<torch::Tensor> q_norm = c10::nullopt,
                 c10::optional<torch::Tensor> k_norm = c10::nullopt);

  // hidden: the embeddings' sublayer output so far, residual: the residual stream, both [T, hidden]; both are
  // updated in place, and hidden, holding the last layer's MLP output, returned (the final norm is the caller's).
  // Every layer writes its new K/V at slot_mapping and attends through the block tables, as the Python loop does.
  // num_layers: the first that many layers only (-1: all); kv_caches holds one cache per layer either way.
  torch::Tensor forward(torch::Tensor hidden, torch::Tensor residual, const torch::Tensor& cos,
                        const torch::Tensor& sin, const std::vector<torch::Tensor>& kv_caches,
                        const torch::Tensor& slot_mapping, const torch::Tensor& block_tables,
                        const torch::Tensor& seq_lens, const torch::Tensor& query_start_loc,
                        int64_t num_layers = -1) const;

 private:
  struct Buffers;  // one step's activations between the kernels
  template <typename T>
  void run_layers(T* hidden, T* residual, int64_t tokens, const T* cos, const T* sin, const Buffers& buffers,
                  const std::vector<void*>& caches, const CacheShape& cache, const int64_t* slots,
                  PagedAttentionArgs attention, size_t num_layers) const;

  int64_t num_heads_, num_kv_heads_, head_dim_;
  double eps_, scale_;
  std::vector<StackLayer> layers_;
};

void bind_decoder_stack(pybind11::module_& m);

}  // namespace pagedllm
