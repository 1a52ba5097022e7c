// A model's decoder layers in one call: the Python loop's glue between two kernels cost about 140 us a layer in
// decode steps (pagedllm/model/decoder_stack.py says why); here the same ops run back to back.
#include "decoder_stack.h"

#include "ops.h"

namespace pagedllm {

torch::Tensor StackMatmul::operator()(const torch::Tensor& x) const {
  return amx ? amx_linear_op(x, panels, bias, out_features, gated) : linear_op(x, panels, bias, out_features, gated);
}

DecoderStack::DecoderStack(int64_t num_heads, int64_t num_kv_heads, int64_t head_dim, double eps, double scale)
    : num_heads_(num_heads), num_kv_heads_(num_kv_heads), head_dim_(head_dim), eps_(eps), scale_(scale) {
  TORCH_CHECK(num_heads > 0 && num_kv_heads > 0 && num_heads % num_kv_heads == 0 && head_dim > 0,
              "query heads must be a positive multiple of KV heads");
}

void DecoderStack::add_layer(torch::Tensor input_norm, torch::Tensor post_norm, StackMatmul qkv, StackMatmul out,
                             StackMatmul gate_up, StackMatmul down) {
  TORCH_CHECK(qkv.out_features == (num_heads_ + 2 * num_kv_heads_) * head_dim_ && !qkv.gated,
              "qkv must project to the query, key and value heads");
  TORCH_CHECK(!out.gated && !down.gated, "only the MLP's gate/up projection may be gated");
  layers_.push_back({std::move(input_norm), std::move(post_norm), std::move(qkv), std::move(out),
                     std::move(gate_up), std::move(down)});
}

torch::Tensor DecoderStack::forward(torch::Tensor hidden, torch::Tensor residual, const torch::Tensor& cos,
                                    const torch::Tensor& sin, const std::vector<torch::Tensor>& kv_caches,
                                    const torch::Tensor& slot_mapping, const torch::Tensor& block_tables,
                                    const torch::Tensor& seq_lens, const torch::Tensor& query_start_loc) const {
  TORCH_CHECK(kv_caches.size() == layers_.size(), "one KV cache per layer is needed: ", layers_.size(), ", got ",
              kv_caches.size());
  TORCH_CHECK(hidden.dim() == 2 && hidden.sizes() == residual.sizes(), "hidden and residual must be [tokens, hidden]");
  const int64_t tokens = hidden.size(0), heads = num_heads_ + 2 * num_kv_heads_;
  for (size_t i = 0; i < layers_.size(); ++i) {
    const StackLayer& layer = layers_[i];
    add_rms_norm_op(hidden, residual, layer.input_norm, eps_);
    const torch::Tensor qkv = layer.qkv(hidden).view({tokens, heads, head_dim_});
    const torch::Tensor q = qkv.narrow(1, 0, num_heads_), k = qkv.narrow(1, num_heads_, num_kv_heads_);
    const torch::Tensor v = qkv.narrow(1, num_heads_ + num_kv_heads_, num_kv_heads_);
    rotary_op(qkv.narrow(1, 0, num_heads_ + num_kv_heads_), cos, sin);  // q and k: one call, their heads adjacent
    write_kv_op(k, v, kv_caches[i], slot_mapping);
    torch::Tensor attended = torch::empty({tokens, num_heads_, head_dim_}, hidden.options());
    paged_attention_op(attended, q, kv_caches[i], block_tables, seq_lens, query_start_loc, scale_, 0);
    hidden = layer.out(attended.view({tokens, num_heads_ * head_dim_}));
    add_rms_norm_op(hidden, residual, layer.post_norm, eps_);
    torch::Tensor activated = layer.gate_up(hidden);
    if (!layer.gate_up.gated) activated = silu_mul_op(activated);
    hidden = layer.down(activated);
  }
  return hidden;
}

void bind_decoder_stack(pybind11::module_& m) {
  namespace py = pybind11;
  // module_local: the A/B tools (kernel_ab, linear_ab) load several builds into one process
  py::class_<StackMatmul>(m, "StackMatmul", py::module_local(), "a projection of a DecoderStack over a packed weight")
      .def(py::init<torch::Tensor, c10::optional<torch::Tensor>, int64_t, bool, bool>(), py::arg("panels"),
           py::arg("bias"), py::arg("out_features"), py::arg("amx"), py::arg("gated") = false)
      .def_readonly("amx", &StackMatmul::amx);
  py::class_<DecoderStack>(m, "DecoderStack", py::module_local(), "a model's decoder layers run in one call")
      .def(py::init<int64_t, int64_t, int64_t, double, double>(), py::arg("num_heads"), py::arg("num_kv_heads"),
           py::arg("head_dim"), py::arg("eps"), py::arg("scale"))
      .def("add_layer", &DecoderStack::add_layer, py::arg("input_norm"), py::arg("post_norm"), py::arg("qkv"),
           py::arg("out"), py::arg("gate_up"), py::arg("down"))
      .def("forward", &DecoderStack::forward, py::arg("hidden"), py::arg("residual"), py::arg("cos"),
           py::arg("sin"), py::arg("kv_caches"), py::arg("slot_mapping"), py::arg("block_tables"),
           py::arg("seq_lens"), py::arg("query_start_loc"));
}

}  // namespace pagedllm
