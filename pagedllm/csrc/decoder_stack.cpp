// A model's decoder layers in one call: the Python loop's glue between two kernels cost about 140 us a layer in
// decode steps (pagedllm/model/decoder_stack.py says why). Here the layers run back to back on raw pointers: the
// tensors are checked and the buffers allocated once a call, not once a layer, since with the caches full of
// weights and K/V each tensor op between two kernels took microseconds (docs/models.md).
#include "decoder_stack.h"

#include <type_traits>

#include "amx_linear.h"
#include "layer_ops.h"
#include "linear.h"
#include "ops.h"
#include "vec.h"

namespace pagedllm {

int64_t StackMatmul::in_features() const {
  if (amx) return panels.size(1) * kAmxDepth;  // steps of 32 inputs
  return panels.size(1) * (panels.scalar_type() == torch::kBFloat16 ? 2 : 1);  // rows of one input or a pair
}

template <typename T>
void StackMatmul::operator()(const T* x, int64_t m, T* y) const {
  const T* w = static_cast<const T*>(panels.data_ptr());
  const T* b = bias ? static_cast<const T*>(bias->data_ptr()) : nullptr;
  if constexpr (std::is_same_v<T, bf16_t>) {
    if (amx) {
      const BlockTiles tiles = blocks ? BlockTiles{blocks->data_ptr<uint8_t>(), blocks->size(2)} : BlockTiles{};
      return amx_linear(x, m, in_features(), w, tiles, b, out_features, gated, y);
    }
  }
  linear<T>(x, m, in_features(), w, b, out_features, gated, y);
}

struct DecoderStack::Buffers {
  void* qkv;        // [T, q + k + v heads, head_dim]
  void* attended;   // [T, heads, head_dim]
  void* projected;  // [T, hidden]: the attention's output projection, then its norm (the MLP's input)
  void* gate_up;    // [T, 2 I]: an ungated gate/up projection's output (unused where it is gated)
  void* activated;  // [T, I]
};

DecoderStack::DecoderStack(int64_t num_heads, int64_t num_kv_heads, int64_t head_dim, double eps, double scale)
    : num_heads_(num_heads), num_kv_heads_(num_kv_heads), head_dim_(head_dim), eps_(eps), scale_(scale) {
  TORCH_CHECK(num_heads > 0 && num_kv_heads > 0 && num_heads % num_kv_heads == 0 && head_dim > 0,
              "query heads must be a positive multiple of KV heads");
}

void DecoderStack::add_layer(torch::Tensor input_norm, torch::Tensor post_norm, StackMatmul qkv, StackMatmul out,
                             StackMatmul gate_up, StackMatmul down, c10::optional<torch::Tensor> q_norm,
                             c10::optional<torch::Tensor> k_norm) {
  TORCH_CHECK(qkv.out_features == (num_heads_ + 2 * num_kv_heads_) * head_dim_ && !qkv.gated,
              "qkv must project to the query, key and value heads");
  TORCH_CHECK(!out.gated && !down.gated, "only the MLP's gate/up projection may be gated");
  const int64_t hidden = input_norm.numel();
  const int64_t intermediate = gate_up.gated ? gate_up.out_features : gate_up.out_features / 2;
  TORCH_CHECK(post_norm.numel() == hidden && qkv.in_features() == hidden &&
                  out.in_features() == num_heads_ * head_dim_ && out.out_features == hidden &&
                  gate_up.in_features() == hidden &&
                  (gate_up.gated || gate_up.out_features % 2 == 0) && down.in_features() == intermediate &&
                  down.out_features == hidden,
              "the layer's norms and projections do not chain: hidden ", hidden, ", heads ", num_heads_, " x ",
              head_dim_);
  const auto dtype = input_norm.scalar_type();
  TORCH_CHECK(dtype == torch::kFloat32 || dtype == torch::kBFloat16, "the stack runs float32 or bfloat16 weights");
  TORCH_CHECK(input_norm.is_contiguous() && post_norm.is_contiguous() && post_norm.scalar_type() == dtype,
              "the norms' weights must be contiguous and of one dtype");
  for (const StackMatmul* m : {&qkv, &out, &gate_up, &down})
    TORCH_CHECK(m->panels.scalar_type() == dtype && m->panels.is_contiguous() &&
                    (!m->amx || dtype == torch::kBFloat16) &&
                    (!m->bias || (m->bias->scalar_type() == dtype && m->bias->is_contiguous())) &&
                    (!m->blocks || m->amx),
                "a projection's packed weight and bias must be contiguous and of the norms' dtype (block tiles: for "
                "an AMX weight)");
  for (const StackMatmul* m : {&qkv, &out, &gate_up, &down}) block_tiles(m->blocks, m->panels);
  TORCH_CHECK(q_norm.has_value() == k_norm.has_value(), "q_norm and k_norm come together");
  for (const auto* norm : {&q_norm, &k_norm})
    TORCH_CHECK(!*norm || ((*norm)->numel() == head_dim_ && (*norm)->is_contiguous() &&
                           (*norm)->scalar_type() == dtype),
                "q_norm and k_norm must be contiguous [head_dim] of the norms' dtype");
  if (!layers_.empty()) {  // forward sizes its buffers by the first layer
    const StackLayer& first = layers_[0];
    TORCH_CHECK(dtype == first.input_norm.scalar_type() && hidden == first.input_norm.numel() &&
                    gate_up.gated == first.gate_up.gated && gate_up.out_features == first.gate_up.out_features,
                "every layer must share one dtype and the first layer's sizes");
  }
  layers_.push_back({std::move(input_norm), std::move(post_norm), std::move(qkv), std::move(out),
                     std::move(gate_up), std::move(down), std::move(q_norm), std::move(k_norm)});
}

torch::Tensor DecoderStack::forward(torch::Tensor hidden, torch::Tensor residual, const torch::Tensor& cos,
                                    const torch::Tensor& sin, const std::vector<torch::Tensor>& kv_caches,
                                    const torch::Tensor& slot_mapping, const torch::Tensor& block_tables,
                                    const torch::Tensor& seq_lens, const torch::Tensor& query_start_loc,
                                    int64_t num_layers) const {
  TORCH_CHECK(kv_caches.size() == layers_.size(), "one KV cache per layer is needed: ", layers_.size(), ", got ",
              kv_caches.size());
  const int64_t all = static_cast<int64_t>(layers_.size());
  TORCH_CHECK(num_layers >= -1 && num_layers <= all, "num_layers must be -1 (all) or 0 to ", all, ", got ",
              num_layers);
  const size_t run = static_cast<size_t>(num_layers < 0 ? all : num_layers);
  if (run == 0) return hidden;
  const StackLayer& first = layers_[0];
  const auto options = first.input_norm.options();
  const int64_t tokens = hidden.size(0), width = first.input_norm.numel();
  TORCH_CHECK(hidden.dim() == 2 && hidden.sizes() == residual.sizes() && hidden.size(1) == width &&
                  hidden.is_contiguous() && residual.is_contiguous() && hidden.scalar_type() == options.dtype() &&
                  residual.scalar_type() == options.dtype(),
              "hidden and residual must be contiguous [tokens, hidden] of the weights' dtype");
  TORCH_CHECK(cos.is_contiguous() && sin.is_contiguous() && cos.numel() == tokens * head_dim_ &&
                  sin.numel() == cos.numel() && cos.scalar_type() == options.dtype() &&
                  sin.scalar_type() == options.dtype(),
              "cos and sin must be contiguous [tokens, head_dim] of the weights' dtype");
  const int64_t heads = num_heads_ + 2 * num_kv_heads_;
  torch::Tensor qkv = torch::empty({tokens, heads, head_dim_}, options);
  torch::Tensor attended = torch::empty({tokens, num_heads_, head_dim_}, options);
  // the checks of write_kv_op and paged_attention_op, made once: every layer's call differs only in its cache
  const CacheShape cache = kv_write_shape(qkv.narrow(1, num_heads_, num_kv_heads_),
                                         qkv.narrow(1, num_heads_ + num_kv_heads_, num_kv_heads_), kv_caches[0],
                                         slot_mapping);
  const PagedAttentionArgs attention = attention_args(attended, qkv.narrow(1, 0, num_heads_), kv_caches[0],
                                                      block_tables, seq_lens, query_start_loc, scale_, 0);
  std::vector<void*> caches;
  for (const torch::Tensor& c : kv_caches) {
    TORCH_CHECK(c.device().is_cpu() && c.is_contiguous() && c.sizes() == kv_caches[0].sizes() &&
                    c.scalar_type() == kv_caches[0].scalar_type(),
                "every layer's KV cache must be shaped like the first");
    caches.push_back(c.data_ptr());
  }
  if (tokens == 0) return hidden;
  const int64_t gate_up_width = first.gate_up.out_features, intermediate = first.down.in_features();
  torch::Tensor projected = torch::empty({tokens, width}, options);
  torch::Tensor gate_up = torch::empty({first.gate_up.gated ? 0 : tokens, gate_up_width}, options);
  torch::Tensor activated = torch::empty({tokens, intermediate}, options);
  const Buffers buffers{qkv.data_ptr(), attended.data_ptr(), projected.data_ptr(), gate_up.data_ptr(),
                        activated.data_ptr()};
  const int64_t* slots = slot_mapping.data_ptr<int64_t>();
  if (options.dtype() == torch::kBFloat16)
    run_layers(static_cast<bf16_t*>(hidden.data_ptr()), static_cast<bf16_t*>(residual.data_ptr()), tokens,
               static_cast<const bf16_t*>(cos.data_ptr()), static_cast<const bf16_t*>(sin.data_ptr()), buffers, caches,
               cache, slots, attention, run);
  else
    run_layers(hidden.data_ptr<float>(), residual.data_ptr<float>(), tokens, cos.data_ptr<float>(),
               sin.data_ptr<float>(), buffers, caches, cache, slots, attention, run);
  return hidden;
}

template <typename T>
void DecoderStack::run_layers(T* hidden, T* residual, int64_t tokens, const T* cos, const T* sin,
                              const Buffers& buffers, const std::vector<void*>& caches, const CacheShape& cache,
                              const int64_t* slots, PagedAttentionArgs attention, size_t num_layers) const {
  const int64_t width = layers_[0].input_norm.numel(), intermediate = layers_[0].down.in_features();
  const int64_t qkv_row = (num_heads_ + 2 * num_kv_heads_) * head_dim_;
  T* qkv = static_cast<T*>(buffers.qkv);
  const T* key = qkv + num_heads_ * head_dim_;
  const T* value = key + num_kv_heads_ * head_dim_;
  T* projected = static_cast<T*>(buffers.projected);
  T* activated = static_cast<T*>(buffers.activated);
  for (size_t i = 0; i < num_layers; ++i) {
    const StackLayer& layer = layers_[i];
    add_rms_norm(hidden, width, residual, width, static_cast<const T*>(layer.input_norm.data_ptr()), tokens, width,
                 static_cast<float>(eps_));
    layer.qkv(hidden, tokens, qkv);
    if (layer.q_norm) {
      const float eps = static_cast<float>(eps_);
      head_rms_norm(qkv, qkv_row, tokens, num_heads_, head_dim_, static_cast<const T*>(layer.q_norm->data_ptr()), eps);
      head_rms_norm(qkv + num_heads_ * head_dim_, qkv_row, tokens, num_kv_heads_, head_dim_,
                    static_cast<const T*>(layer.k_norm->data_ptr()), eps);
    }
    rotary(qkv, qkv_row, tokens, num_heads_ + num_kv_heads_, head_dim_, cos, sin);  // q and k: their heads adjacent
    write_kv(key, qkv_row, value, qkv_row, caches[i], cache, slots, tokens);
    attention.kv_cache = caches[i];
    paged_attention(attention, std::is_same_v<T, bf16_t>);
    layer.out(static_cast<const T*>(buffers.attended), tokens, projected);
    add_rms_norm(projected, width, residual, width, static_cast<const T*>(layer.post_norm.data_ptr()), tokens, width,
                 static_cast<float>(eps_));
    if (layer.gate_up.gated) {
      layer.gate_up(projected, tokens, activated);
    } else {
      T* gate_up = static_cast<T*>(buffers.gate_up);
      layer.gate_up(projected, tokens, gate_up);
      silu_mul(gate_up, activated, tokens, intermediate);
    }
    layer.down(activated, tokens, hidden);
  }
}

void bind_decoder_stack(pybind11::module_& m) {
  namespace py = pybind11;
  // module_local: the A/B tools (kernel_ab, linear_ab) load several builds into one process
  py::class_<StackMatmul>(m, "StackMatmul", py::module_local(), "a projection of a DecoderStack over a packed weight")
      .def(py::init<torch::Tensor, c10::optional<torch::Tensor>, int64_t, bool, bool, c10::optional<torch::Tensor>>(),
           py::arg("panels"), py::arg("bias"), py::arg("out_features"), py::arg("amx"), py::arg("gated") = false,
           py::arg("blocks") = py::none())
      .def_readonly("amx", &StackMatmul::amx);
  py::class_<DecoderStack>(m, "DecoderStack", py::module_local(), "a model's decoder layers run in one call")
      .def(py::init<int64_t, int64_t, int64_t, double, double>(), py::arg("num_heads"), py::arg("num_kv_heads"),
           py::arg("head_dim"), py::arg("eps"), py::arg("scale"))
      .def("add_layer", &DecoderStack::add_layer, py::arg("input_norm"), py::arg("post_norm"), py::arg("qkv"),
           py::arg("out"), py::arg("gate_up"), py::arg("down"), py::arg("q_norm") = py::none(),
           py::arg("k_norm") = py::none())
      .def("forward", &DecoderStack::forward, py::arg("hidden"), py::arg("residual"), py::arg("cos"),
           py::arg("sin"), py::arg("kv_caches"), py::arg("slot_mapping"), py::arg("block_tables"),
           py::arg("seq_lens"), py::arg("query_start_loc"), py::arg("num_layers") = -1);
}

}  // namespace pagedllm
