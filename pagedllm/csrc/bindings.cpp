// Python bindings: tensor checks here, raw-pointer kernels in the other files.
#include <torch/extension.h>

#include <algorithm>
#include <array>
#include <string>
#include <tuple>
#include <utility>

#include "amx_linear.h"
#include "amx_blocks.h"
#include "amx_tiles.h"
#include "cache_ops.h"
#include "decoder_stack.h"
#include "layer_ops.h"
#include "linear.h"
#include "ops.h"
#include "paged_attention.h"
#include "sampling_ops.h"
#include "vec.h"

namespace pagedllm {
namespace {

void check_cpu(const torch::Tensor& t, const char* name) {
  TORCH_CHECK(t.device().is_cpu(), name, " must be a CPU tensor");
}

void check_index(const torch::Tensor& t, const char* name) {
  check_cpu(t, name);
  TORCH_CHECK(t.scalar_type() == torch::kInt64 && t.is_contiguous(), name, " must be a contiguous int64 tensor");
}

void check_float(const torch::Tensor& t, const char* name) {
  check_cpu(t, name);
  TORCH_CHECK(t.scalar_type() == torch::kFloat32 || t.scalar_type() == torch::kBFloat16, name,
              " must be float32 or bfloat16, got ", t.scalar_type());
}

// [rows, heads, head_dim] with each token's heads packed (rows may be further apart, e.g. a view of qkv)
void check_heads(const torch::Tensor& t, const char* name) {
  TORCH_CHECK(t.dim() == 3 && t.stride(2) == 1 && t.stride(1) == t.size(2), name,
              " must be [tokens, heads, head_dim] with contiguous heads");
}

bool is_bf16(const torch::Tensor& t) { return t.scalar_type() == torch::kBFloat16; }

// An optional bfloat16 tensor's data (a bias), or null.
const bf16_t* bf16_data(const c10::optional<torch::Tensor>& t) {
  return t ? static_cast<const bf16_t*>(t->data_ptr()) : nullptr;
}

// The least and the greatest of a non-empty contiguous int64 tensor, in a loop over its values (a torch
// reduction and .item() cost several microseconds a call, and write_kv runs once per layer).
std::pair<int64_t, int64_t> index_range(const torch::Tensor& t) {
  const int64_t* values = t.data_ptr<int64_t>();
  const auto [low, high] = std::minmax_element(values, values + t.numel());
  return {*low, *high};
}

// The kernel trusts the metadata for every address it reads or writes, so all of it is checked here: an
// O(sequences x table width) pass over host integers, negligible beside the attention itself.
void check_batch(const torch::Tensor& query, const torch::Tensor& kv_cache, const torch::Tensor& block_tables,
                 const torch::Tensor& seq_lens, const torch::Tensor& query_start_loc) {
  const int64_t num_seqs = seq_lens.size(0), width = block_tables.size(1);
  const int64_t num_blocks = kv_cache.size(2), block_size = kv_cache.size(3);
  const int64_t* lens = seq_lens.data_ptr<int64_t>();
  const int64_t* starts = query_start_loc.data_ptr<int64_t>();
  const int64_t* tables = block_tables.data_ptr<int64_t>();
  TORCH_CHECK_VALUE(starts[0] == 0 && starts[num_seqs] == query.size(0),
              "query_start_loc must run from 0 to the number of query rows (", query.size(0), ")");
  for (int64_t s = 0; s < num_seqs; ++s) {
    const int64_t query_len = starts[s + 1] - starts[s];
    TORCH_CHECK_VALUE(query_len >= 0 && lens[s] >= query_len, "sequence ", s, ": ", query_len,
                " new tokens but a context of ", lens[s]);
    const int64_t used = lens[s] / block_size + (lens[s] % block_size != 0);  // no overflow near INT64_MAX
    TORCH_CHECK_VALUE(used <= width, "sequence ", s, ": a block table of width ", width, " cannot hold ", lens[s],
                " positions");
    for (int64_t b = 0; b < used; ++b)
      TORCH_CHECK_VALUE(tables[s * width + b] >= 0 && tables[s * width + b] < num_blocks, "sequence ", s,
                  ": block id ", tables[s * width + b], " outside the pool of ", num_blocks, " blocks");
  }
}

}  // namespace

PagedAttentionArgs attention_args(torch::Tensor out, const torch::Tensor& query, const torch::Tensor& kv_cache,
                                  const torch::Tensor& block_tables, const torch::Tensor& seq_lens,
                                  const torch::Tensor& query_start_loc, double scale, int64_t partition_size) {
  check_float(kv_cache, "kv_cache");
  check_heads(query, "query");
  TORCH_CHECK(kv_cache.is_contiguous() && kv_cache.dim() == 5 && kv_cache.size(0) == 2,
              "kv_cache must be a contiguous [2, kv_heads, blocks, block_size, head_dim] tensor");
  TORCH_CHECK(query.scalar_type() == kv_cache.scalar_type() && out.scalar_type() == kv_cache.scalar_type(),
              "query, out and kv_cache must share one dtype");
  TORCH_CHECK(out.is_contiguous() && out.sizes() == query.sizes(), "out must be contiguous and shaped like query");
  check_index(block_tables, "block_tables");
  check_index(seq_lens, "seq_lens");
  check_index(query_start_loc, "query_start_loc");
  TORCH_CHECK(block_tables.dim() == 2 && block_tables.size(0) == seq_lens.size(0) &&
                  query_start_loc.size(0) == seq_lens.size(0) + 1,
              "block_tables, seq_lens and query_start_loc disagree on the number of sequences");
  TORCH_CHECK(query.size(2) == kv_cache.size(4), "query and kv_cache head_dim differ");
  TORCH_CHECK(supports_head_dim(query.size(2)), "paged_attention supports head_dim 16, 32, 64 and 128, got ",
              query.size(2));
  TORCH_CHECK(query.size(1) > 0 && kv_cache.size(1) > 0 && query.size(1) % kv_cache.size(1) == 0,
              "query heads must be a positive multiple of KV heads");
  TORCH_CHECK(kv_cache.size(3) > 0 && seq_lens.dim() == 1, "kv_cache needs a positive block size, seq_lens one dim");
  check_batch(query, kv_cache, block_tables, seq_lens, query_start_loc);
  return {query.data_ptr(), query.stride(0), kv_cache.data_ptr(), out.data_ptr(), block_tables.data_ptr<int64_t>(),
          block_tables.size(1), seq_lens.data_ptr<int64_t>(), query_start_loc.data_ptr<int64_t>(), seq_lens.size(0),
          query.size(1), kv_cache.size(1), kv_cache.size(2), kv_cache.size(3), kv_cache.size(4),
          static_cast<float>(scale), partition_size};
}

void paged_attention(const PagedAttentionArgs& args, bool bf16) {
  if (bf16)
    paged_attention_bf16(args);
  else
    paged_attention_f32(args);
}

void paged_attention_op(torch::Tensor out, const torch::Tensor& query, const torch::Tensor& kv_cache,
                        const torch::Tensor& block_tables, const torch::Tensor& seq_lens,
                        const torch::Tensor& query_start_loc, double scale, int64_t partition_size) {
  paged_attention(attention_args(out, query, kv_cache, block_tables, seq_lens, query_start_loc, scale, partition_size),
                  is_bf16(kv_cache));
}

CacheShape cache_shape(const torch::Tensor& cache) {
  TORCH_CHECK(cache.is_contiguous() && cache.dim() == 5 && cache.size(0) == 2,
              "kv_cache must be a contiguous [2, kv_heads, blocks, block_size, head_dim] tensor");
  TORCH_CHECK(cache.size(1) > 0 && cache.size(3) > 0, "kv_cache needs at least one KV head and a positive block size");
  return {cache.size(1), cache.size(2), cache.size(3), cache.size(4), static_cast<int64_t>(cache.element_size())};
}

CacheShape kv_write_shape(const torch::Tensor& key, const torch::Tensor& value, const torch::Tensor& kv_cache,
                          const torch::Tensor& slot_mapping) {
  check_float(kv_cache, "kv_cache");
  check_heads(key, "key");
  check_heads(value, "value");
  check_index(slot_mapping, "slot_mapping");
  const CacheShape shape = cache_shape(kv_cache);
  TORCH_CHECK(key.scalar_type() == kv_cache.scalar_type() && value.scalar_type() == kv_cache.scalar_type(),
              "key, value and kv_cache must share one dtype");
  TORCH_CHECK(key.size(0) == slot_mapping.size(0) && value.size(0) == slot_mapping.size(0),
              "one slot per token is needed");
  TORCH_CHECK(key.size(1) == shape.num_kv_heads && key.size(2) == shape.head_dim && value.sizes() == key.sizes(),
              "key/value shape does not match kv_cache");
  TORCH_CHECK(slot_mapping.dim() == 1, "slot_mapping must be 1-D");
  if (slot_mapping.numel() > 0) {
    const auto [low, high] = index_range(slot_mapping);
    TORCH_CHECK(low >= -1 && high < shape.num_blocks * shape.block_size, "slot out of range (-1 skips a token)");
  }
  return shape;
}

void write_kv_op(const torch::Tensor& key, const torch::Tensor& value, torch::Tensor kv_cache,
              const torch::Tensor& slot_mapping) {
  const CacheShape shape = kv_write_shape(key, value, kv_cache, slot_mapping);
  write_kv(key.data_ptr(), key.stride(0), value.data_ptr(), value.stride(0), kv_cache.data_ptr(), shape,
           slot_mapping.data_ptr<int64_t>(), slot_mapping.size(0));
}

void copy_blocks_op(const std::vector<torch::Tensor>& caches, const torch::Tensor& src, const torch::Tensor& dst) {
  check_index(src, "src");
  check_index(dst, "dst");
  TORCH_CHECK(src.sizes() == dst.sizes() && src.dim() == 1, "src and dst must be 1-D and of one length");
  std::vector<CacheShape> shapes;
  for (const torch::Tensor& cache : caches) {  // every cache checked before any is written
    check_cpu(cache, "kv_cache");
    shapes.push_back(cache_shape(cache));
  }
  if (src.numel() == 0) return;
  const auto [src_low, src_high] = index_range(src);
  const auto [dst_low, dst_high] = index_range(dst);
  const int64_t lowest = std::min(src_low, dst_low), highest = std::max(src_high, dst_high);
  for (const CacheShape& shape : shapes)
    TORCH_CHECK(lowest >= 0 && highest < shape.num_blocks, "block id out of range");
  for (size_t i = 0; i < caches.size(); ++i)
    copy_blocks(caches[i].data_ptr(), shapes[i], src.data_ptr<int64_t>(), dst.data_ptr<int64_t>(), src.numel());
}

void add_rms_norm_op(torch::Tensor x, const c10::optional<torch::Tensor>& residual, const torch::Tensor& weight,
                  double eps) {
  check_float(x, "x");
  TORCH_CHECK(x.dim() == 2 && x.stride(1) == 1 && weight.is_contiguous() && weight.numel() == x.size(1) &&
                  weight.scalar_type() == x.scalar_type(),
              "x must be [rows, width] with contiguous rows and weight [width] of x's dtype");
  if (residual) TORCH_CHECK(residual->sizes() == x.sizes() && residual->stride(1) == 1 &&
                                residual->scalar_type() == x.scalar_type(),
                            "residual must match x");
  const int64_t res_stride = residual ? residual->stride(0) : 0;
  if (is_bf16(x))
    add_rms_norm<bf16_t>(static_cast<bf16_t*>(x.data_ptr()), x.stride(0),
                         residual ? static_cast<bf16_t*>(residual->data_ptr()) : nullptr, res_stride,
                         static_cast<const bf16_t*>(weight.data_ptr()), x.size(0), x.size(1), eps);
  else
    add_rms_norm<float>(x.data_ptr<float>(), x.stride(0), residual ? residual->data_ptr<float>() : nullptr,
                        res_stride, weight.data_ptr<float>(), x.size(0), x.size(1), eps);
}

void head_rms_norm_op(torch::Tensor x, const torch::Tensor& weight, double eps) {
  check_float(x, "x");
  check_heads(x, "x");
  TORCH_CHECK(weight.is_contiguous() && weight.numel() == x.size(2) && weight.scalar_type() == x.scalar_type(),
              "weight must be [head_dim] of x's dtype");
  if (is_bf16(x))
    head_rms_norm<bf16_t>(static_cast<bf16_t*>(x.data_ptr()), x.stride(0), x.size(0), x.size(1), x.size(2),
                          static_cast<const bf16_t*>(weight.data_ptr()), eps);
  else
    head_rms_norm<float>(x.data_ptr<float>(), x.stride(0), x.size(0), x.size(1), x.size(2), weight.data_ptr<float>(),
                         eps);
}

void rotary_op(torch::Tensor x, const torch::Tensor& cos, const torch::Tensor& sin) {
  check_float(x, "x");
  check_heads(x, "x");
  TORCH_CHECK(cos.is_contiguous() && sin.is_contiguous() && cos.numel() == x.size(0) * x.size(2) &&
                  sin.numel() == cos.numel() && cos.scalar_type() == x.scalar_type() &&
                  sin.scalar_type() == x.scalar_type(),
              "cos and sin must be contiguous [tokens, head_dim] of x's dtype");
  TORCH_CHECK(x.size(2) % 2 == 0, "head_dim must be even");
  if (is_bf16(x))
    rotary<bf16_t>(static_cast<bf16_t*>(x.data_ptr()), x.stride(0), x.size(0), x.size(1), x.size(2),
                   static_cast<const bf16_t*>(cos.data_ptr()), static_cast<const bf16_t*>(sin.data_ptr()));
  else
    rotary<float>(x.data_ptr<float>(), x.stride(0), x.size(0), x.size(1), x.size(2), cos.data_ptr<float>(),
                  sin.data_ptr<float>());
}

// logits [rows, vocab] float32 with contiguous rows -> (argmax int64 [rows], log_z float32 [rows]).
std::tuple<torch::Tensor, torch::Tensor> greedy_summary_op(const torch::Tensor& logits) {
  check_cpu(logits, "logits");
  TORCH_CHECK(logits.scalar_type() == torch::kFloat32 && logits.dim() == 2 && logits.stride(1) == 1,
              "logits must be a float32 [rows, vocab] tensor with contiguous rows");
  TORCH_CHECK(logits.size(1) > 0, "logits must have at least one column");
  auto argmax = torch::empty({logits.size(0)}, logits.options().dtype(torch::kInt64));
  auto log_z = torch::empty({logits.size(0)}, logits.options());
  greedy_summary(logits.data_ptr<float>(), logits.stride(0), logits.size(0), logits.size(1),
                 argmax.data_ptr<int64_t>(), log_z.data_ptr<float>());
  return {argmax, log_z};
}

// logits [rows, vocab] float32 with contiguous rows; per row temperature (float32 > 0), top_k (int64 >= 0), top_p
// (float32 in (0, 1]), min_p (float32 in [0, 1]) and u (float64 in [0, 1)) -> token int64 [rows] (-1 where a row
// has a NaN or no finite maximum).
torch::Tensor categorical_sample_op(const torch::Tensor& logits, const torch::Tensor& temperature,
                                    const torch::Tensor& top_k, const torch::Tensor& top_p, const torch::Tensor& min_p,
                                    const torch::Tensor& u) {
  check_cpu(logits, "logits");
  TORCH_CHECK(logits.scalar_type() == torch::kFloat32 && logits.dim() == 2 && logits.stride(1) == 1,
              "logits must be a float32 [rows, vocab] tensor with contiguous rows");
  TORCH_CHECK(logits.size(1) > 0 && logits.size(1) <= std::numeric_limits<int32_t>::max(),
              "logits must have between 1 and 2^31 - 1 columns");
  const int64_t rows = logits.size(0);
  auto check_column = [&](const torch::Tensor& t, torch::ScalarType dtype, const char* name) {
    check_cpu(t, name);
    TORCH_CHECK(t.scalar_type() == dtype && t.dim() == 1 && t.size(0) == rows && t.is_contiguous(), name,
                " must be a contiguous ", c10::toString(dtype), " tensor of one value per row");
  };
  check_column(temperature, torch::kFloat32, "temperature");
  check_column(top_k, torch::kInt64, "top_k");
  check_column(top_p, torch::kFloat32, "top_p");
  check_column(min_p, torch::kFloat32, "min_p");
  check_column(u, torch::kFloat64, "u");
  std::vector<Truncation> truncation(rows);
  for (int64_t r = 0; r < rows; ++r) {
    const Truncation c{top_k.data_ptr<int64_t>()[r], top_p.data_ptr<float>()[r], min_p.data_ptr<float>()[r]};
    const float t = temperature.data_ptr<float>()[r];
    const double draw = u.data_ptr<double>()[r];
    TORCH_CHECK(t > 0.0f && c.top_k >= 0 && c.top_p > 0.0f && c.top_p <= 1.0f && c.min_p >= 0.0f && c.min_p <= 1.0f &&
                    draw >= 0.0 && draw < 1.0,
                "temperature must be positive, top_k >= 0, top_p in (0, 1], min_p in [0, 1] and u in [0, 1)");
    truncation[r] = c;
  }
  auto token = torch::empty({rows}, logits.options().dtype(torch::kInt64));
  categorical_draws(logits.data_ptr<float>(), logits.stride(0), rows, logits.size(1), temperature.data_ptr<float>(),
                    truncation.data(), u.data_ptr<double>(), token.data_ptr<int64_t>());
  return token;
}

torch::Tensor silu_mul_op(const torch::Tensor& x) {
  check_float(x, "x");
  TORCH_CHECK(x.dim() == 2 && x.is_contiguous() && x.size(1) % 2 == 0, "x must be contiguous [rows, 2 * width]");
  torch::Tensor out = torch::empty({x.size(0), x.size(1) / 2}, x.options());
  if (is_bf16(x))
    silu_mul<bf16_t>(static_cast<const bf16_t*>(x.data_ptr()), static_cast<bf16_t*>(out.data_ptr()), x.size(0),
                     out.size(1));
  else
    silu_mul<float>(x.data_ptr<float>(), out.data_ptr<float>(), x.size(0), out.size(1));
  return out;
}

namespace {

void check_matrix(const torch::Tensor& t, const char* name) {
  check_float(t, name);
  TORCH_CHECK(t.dim() == 2 && t.is_contiguous(), name, " must be a contiguous 2-D tensor");
}

// A matmul's optional bias: a contiguous [size] tensor of x's dtype on the CPU.
void check_bias(const c10::optional<torch::Tensor>& bias, const torch::Tensor& x, int64_t size) {
  if (!bias) return;
  check_cpu(*bias, "bias");
  TORCH_CHECK(bias->scalar_type() == x.scalar_type() && bias->is_contiguous() && bias->dim() == 1 &&
                  bias->size(0) == size,
              "bias must be a contiguous [", size, "] tensor of x's dtype");
}

}  // namespace

bool has_linear_kernel_op(bool bfloat16) { return bfloat16 ? has_linear_kernel<bf16_t>() : has_linear_kernel<float>(); }

namespace {

// The shape pack_linear gives a weight of n outputs and k inputs: [panels, panel rows, values per row].
std::array<int64_t, 3> panel_shape(int64_t n, int64_t k, bool bf16, bool gated) {
  return {num_panels(n, gated), bf16 ? panel_rows<bf16_t>(k) : panel_rows<float>(k), (bf16 ? 2 : 1) * kPanelCols};
}

}  // namespace

torch::Tensor pack_linear_op(const torch::Tensor& weight, bool gated) {
  check_matrix(weight, "weight");
  TORCH_CHECK(has_linear_kernel_op(is_bf16(weight)), "this build has no linear kernel for ", weight.scalar_type());
  const int64_t rows = weight.size(0), k = weight.size(1);
  TORCH_CHECK(!is_bf16(weight) || k % 2 == 0, "a bfloat16 weight needs an even number of input features");
  TORCH_CHECK(!gated || rows % 2 == 0, "a gated weight stacks gate and up: it needs an even number of rows");
  torch::Tensor panels = torch::empty(panel_shape(gated ? rows / 2 : rows, k, is_bf16(weight), gated), weight.options());
  if (is_bf16(weight))
    pack_linear_weight<bf16_t>(static_cast<const bf16_t*>(weight.data_ptr()), rows, k, gated,
                               static_cast<bf16_t*>(panels.data_ptr()));
  else
    pack_linear_weight<float>(weight.data_ptr<float>(), rows, k, gated, panels.data_ptr<float>());
  return panels;
}

torch::Tensor linear_op(const torch::Tensor& x, const torch::Tensor& panels, const c10::optional<torch::Tensor>& bias,
                        int64_t out_features, bool gated) {
  check_matrix(x, "x");
  check_cpu(panels, "panels");
  const bool bf16 = is_bf16(x);
  const int64_t k = x.size(1);
  const std::array<int64_t, 3> expected = panel_shape(out_features, k, bf16, gated);
  TORCH_CHECK(panels.scalar_type() == x.scalar_type() && panels.is_contiguous() && panels.dim() == 3 &&
                  out_features > 0 && panels.size(0) == expected[0] && panels.size(2) == expected[2],
              "panels must come from pack_linear of an [out_features, in_features] weight of x's dtype ",
              "(gated: [2 * out_features, in_features], packed with gated=True)");
  const int64_t bias_size = gated ? 2 * out_features : out_features;
  TORCH_CHECK(panels.size(1) == expected[1] && (!bf16 || k % 2 == 0), "x has ", k, " features, not the weight's");
  check_bias(bias, x, bias_size);
  torch::Tensor y = torch::empty({x.size(0), out_features}, x.options());
  if (x.size(0) == 0) return y;
  if (bf16)
    linear<bf16_t>(static_cast<const bf16_t*>(x.data_ptr()), x.size(0), k, static_cast<const bf16_t*>(panels.data_ptr()),
                   bf16_data(bias), out_features, gated, static_cast<bf16_t*>(y.data_ptr()));
  else
    linear<float>(x.data_ptr<float>(), x.size(0), k, panels.data_ptr<float>(), bias ? bias->data_ptr<float>() : nullptr,
                  out_features, gated, y.data_ptr<float>());
  return y;
}

torch::Tensor pack_amx_linear_op(const torch::Tensor& weight, bool gated) {
  check_matrix(weight, "weight");
  TORCH_CHECK(is_bf16(weight) && amx_tiles_granted(), "the AMX matmul takes bfloat16 weights, on a CPU with AMX-BF16");
  const int64_t n = weight.size(0), k = weight.size(1);
  TORCH_CHECK(k % kAmxDepth == 0, "the AMX matmul needs a multiple of ", kAmxDepth, " input features, not ", k);
  TORCH_CHECK(!gated || n % 2 == 0, "a gated weight stacks gate and up: it needs an even number of rows");
  torch::Tensor panels =
      torch::empty({amx_panels(n, gated), k / kAmxDepth, kAmxDepth / 2, 2 * kAmxPanelCols}, weight.options());
  pack_amx_weight(static_cast<const bf16_t*>(weight.data_ptr()), n, k, gated, static_cast<bf16_t*>(panels.data_ptr()));
  return panels;
}

// A weight's stored blocks (scale, optional low: float16 [out, in / 32]; codes [out, in]: uint8 with low, Q4_1's;
// int8 without, Q8_0's) -> its tiles in amx_blocks.h's form [panels, in / 32, tile bytes].
torch::Tensor pack_amx_blocks_op(const torch::Tensor& scale, const c10::optional<torch::Tensor>& low,
                                 const torch::Tensor& codes, bool gated) {
  check_cpu(codes, "codes");
  const bool q4 = low.has_value();
  TORCH_CHECK(codes.dim() == 2 && codes.is_contiguous() && codes.scalar_type() == (q4 ? torch::kUInt8 : torch::kInt8) &&
                  codes.size(1) % kAmxDepth == 0 && (!gated || codes.size(0) % 2 == 0),
              "codes must be contiguous [out, in], uint8 with low (Q4_1) or int8 without (Q8_0), in a multiple of ",
              kAmxDepth, " (gated: an even number of rows)");
  const int64_t n = codes.size(0), k = codes.size(1);
  for (const torch::Tensor* t : {&scale, q4 ? &*low : &scale}) {
    check_cpu(*t, "scale and low");
    TORCH_CHECK(t->dim() == 2 && t->is_contiguous() && t->scalar_type() == torch::kFloat16 && t->size(0) == n &&
                    t->size(1) == k / kAmxDepth,
                "scale and low must be contiguous float16 [out, in / ", kAmxDepth, "]");
  }
  torch::Tensor out = torch::empty({amx_panels(n, gated), k / kAmxDepth, q4 ? kQ4TileBytes : kQ8TileBytes},
                                   codes.options().dtype(torch::kUInt8));
  const auto* scales = static_cast<const uint16_t*>(scale.data_ptr());
  if (q4)
    pack_amx_q4(scales, static_cast<const uint16_t*>(low->data_ptr()), codes.data_ptr<uint8_t>(), n, k, gated,
                out.data_ptr<uint8_t>());
  else
    pack_amx_q8(scales, codes.data_ptr<int8_t>(), n, k, gated, out.data_ptr<uint8_t>());
  return out;
}

BlockTiles block_tiles(const c10::optional<torch::Tensor>& blocks, const torch::Tensor& panels) {
  if (!blocks) return {};
  check_cpu(*blocks, "blocks");
  TORCH_CHECK(blocks->scalar_type() == torch::kUInt8 && blocks->is_contiguous() && blocks->dim() == 3 &&
                  blocks->size(0) == panels.size(0) && blocks->size(1) == panels.size(1) &&
                  (blocks->size(2) == kQ4TileBytes || blocks->size(2) == kQ8TileBytes),
              "blocks must come from pack_amx_blocks of the weight the panels were packed from");
  return {blocks->data_ptr<uint8_t>(), blocks->size(2)};
}

bool amx_blocks_match_op(const torch::Tensor& blocks, const torch::Tensor& panels) {
  check_cpu(panels, "panels");
  TORCH_CHECK(is_bf16(panels) && panels.is_contiguous() && panels.dim() == 4, "panels must come from pack_amx_linear");
  const BlockTiles tiles = block_tiles(blocks, panels);
  return amx_blocks_match(tiles.data, tiles.tile_bytes, static_cast<const bf16_t*>(panels.data_ptr()),
                          panels.size(0) * panels.size(1));
}

namespace {

// x [rows, in_features] and panels from pack_amx_linear of a bfloat16 weight, for amx_linear and amx_greedy_head.
void check_amx_operands(const torch::Tensor& x, const torch::Tensor& panels, const c10::optional<torch::Tensor>& bias,
                        int64_t out_features, bool gated) {
  check_matrix(x, "x");
  check_cpu(panels, "panels");
  TORCH_CHECK(is_bf16(x) && panels.scalar_type() == x.scalar_type() && panels.is_contiguous() && panels.dim() == 4 &&
                  out_features > 0 && panels.size(0) == amx_panels(gated ? 2 * out_features : out_features, gated) &&
                  panels.size(1) * kAmxDepth == x.size(1),
              "panels must come from pack_amx_linear of an [out_features, in_features] bfloat16 weight (gated: [2 * ",
              "out_features, in_features], packed with gated=True), x [rows, in_features] bfloat16");
  check_bias(bias, x, gated ? 2 * out_features : out_features);
}

}  // namespace

torch::Tensor amx_linear_op(const torch::Tensor& x, const torch::Tensor& panels, const c10::optional<torch::Tensor>& bias,
                            int64_t out_features, bool gated, bool float_output,
                            const c10::optional<torch::Tensor>& blocks) {
  check_amx_operands(x, panels, bias, out_features, gated);
  const BlockTiles tiles = block_tiles(blocks, panels);
  const int64_t k = x.size(1);
  const auto out_dtype = float_output ? torch::kFloat32 : torch::kBFloat16;
  torch::Tensor y = torch::empty({x.size(0), out_features}, x.options().dtype(out_dtype));
  if (x.size(0) == 0) return y;
  const auto* x_data = static_cast<const bf16_t*>(x.data_ptr());
  const auto* panel_data = static_cast<const bf16_t*>(panels.data_ptr());
  const bf16_t* bias_data = bf16_data(bias);
  if (float_output)
    amx_linear(x_data, x.size(0), k, panel_data, tiles, bias_data, out_features, gated, y.data_ptr<float>());
  else
    amx_linear(x_data, x.size(0), k, panel_data, tiles, bias_data, out_features, gated,
               static_cast<bf16_t*>(y.data_ptr()));
  return y;
}

std::tuple<torch::Tensor, torch::Tensor> amx_greedy_head_op(const torch::Tensor& x, const torch::Tensor& panels,
                                                            const c10::optional<torch::Tensor>& bias,
                                                            int64_t out_features,
                                                            const c10::optional<torch::Tensor>& blocks) {
  check_amx_operands(x, panels, bias, out_features, false);
  const BlockTiles tiles = block_tiles(blocks, panels);
  auto argmax = torch::empty({x.size(0)}, x.options().dtype(torch::kInt64));
  auto logprob = torch::empty({x.size(0)}, x.options().dtype(torch::kFloat32));
  if (x.size(0) == 0) return {argmax, logprob};
  amx_greedy_head(static_cast<const bf16_t*>(x.data_ptr()), x.size(0), x.size(1),
                  static_cast<const bf16_t*>(panels.data_ptr()), tiles, bf16_data(bias), out_features,
                  argmax.data_ptr<int64_t>(), logprob.data_ptr<float>());
  return {argmax, logprob};
}

std::string bf16_matmul_path_op() { return bf16_path() == Bf16Path::kWiden ? "widen" : "dot"; }

void set_bf16_matmul_path_op(const std::string& name) {
  TORCH_CHECK(name == "auto" || name == "dot" || name == "widen", "the bfloat16 matmul path is 'auto', 'dot' or 'widen', not '",
              name, "'");
  set_bf16_path(name == "dot" ? Bf16Path::kDot : name == "widen" ? Bf16Path::kWiden : Bf16Path::kAuto);
}

}  // namespace pagedllm

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "pagedllm's compiled CPU kernels";
  m.def("supports_head_dim", &pagedllm::supports_head_dim, "whether paged_attention has a kernel for this head_dim");
  m.def("paged_attention", &pagedllm::paged_attention_op, "attention of a mixed batch through block tables");
  m.def("write_kv", &pagedllm::write_kv_op, "store new K/V rows at their slots (-1 = skip)");
  m.def("copy_blocks", &pagedllm::copy_blocks_op, "copy blocks src[i] -> dst[i] in every cache");
  m.def("add_rms_norm", &pagedllm::add_rms_norm_op, "residual += x; x = rms_norm(residual) * weight (in place)");
  m.def("rotary", &pagedllm::rotary_op, "rotary embedding in place");
  m.def("head_rms_norm", &pagedllm::head_rms_norm_op, "each head of x = rms_norm(head) * weight (in place)");
  m.def("silu_mul", &pagedllm::silu_mul_op, "silu(gate) * up of [rows, 2 * width]");
  m.def("greedy_summary", &pagedllm::greedy_summary_op, "per row of float32 logits: first argmax, logsumexp");
  m.def("categorical_sample", &pagedllm::categorical_sample_op, "per row of float32 logits: an inverse-CDF draw at u "
        "from softmax(logits / temperature) among the tokens top-k, top-p and min-p keep (-1 where the row has a NaN "
        "or no finite maximum)", py::arg("logits"), py::arg("temperature"), py::arg("top_k"), py::arg("top_p"),
        py::arg("min_p"), py::arg("u"));
  m.def("has_linear_kernel", &pagedllm::has_linear_kernel_op, "whether this build has the linear kernel for "
        "float32 (False) or bfloat16 (True)", py::arg("bfloat16"));
  m.def("pack_linear", &pagedllm::pack_linear_op, "an [out, in] weight packed for linear (gated: an MLP's "
        "[gate; up] weight, for silu(gate) * up)", py::arg("weight"), py::arg("gated") = false);
  m.def("bf16_matmul_path", &pagedllm::bf16_matmul_path_op, "how bfloat16 linear calls multiply: 'dot' "
        "(vdpbf16ps) or 'widen' (weights widened to float32 for FMAs), measured once unless set");
  m.def("set_bf16_matmul_path", &pagedllm::set_bf16_matmul_path_op, "'auto' (measure once), 'dot' or 'widen'",
        py::arg("path"));
  m.def("has_amx_tiles", &pagedllm::amx_tiles_granted, "whether this build and OS can multiply on AMX tiles");
  m.def("attention_tiles", &pagedllm::attention_tiles, "whether a bfloat16 cache's many-row attention loops "
        "multiply on AMX tiles (the build and OS allow them and set_attention_tiles did not turn them off)");
  m.def("set_attention_tiles", &pagedllm::set_attention_tiles, "allow (default) or forbid AMX tiles in attention",
        py::arg("on"));
  m.def("pack_amx_linear", &pagedllm::pack_amx_linear_op, "a bfloat16 [out, in] weight packed into AMX tiles (gated: "
        "an MLP's [gate; up], for silu(gate) * up)", py::arg("weight"), py::arg("gated") = false);
  m.def("pack_amx_blocks", &pagedllm::pack_amx_blocks_op, "a weight's stored blocks laid out tile by tile as "
        "pack_amx_linear lays out the bfloat16 weight: Q4_1 (w = scale * code + low per 32 inputs of a row; scale, "
        "low: float16 [out, in / 32]; codes: uint8 [out, in]) or Q8_0 (w = scale * code, no low; codes: int8)",
        py::arg("scale"), py::arg("low"), py::arg("codes"), py::arg("gated") = false);
  m.def("amx_blocks_match", &pagedllm::amx_blocks_match_op, "whether every tile of pack_amx_blocks' form expands to "
        "the bfloat16 tile of pack_amx_linear's", py::arg("blocks"), py::arg("panels"));
  m.def("amx_linear", &pagedllm::amx_linear_op, "x W^T + bias on AMX tiles over a weight from pack_amx_linear (gated: "
        "silu(gate) * up of it), rounded to bfloat16 (float_output: returned as the float32 values of those); "
        "blocks: the same weight from pack_amx_blocks, checked with amx_blocks_match, which small batches stream "
        "instead", py::arg("x"), py::arg("panels"), py::arg("bias"), py::arg("out_features"),
        py::arg("gated") = false, py::arg("float_output") = false, py::arg("blocks") = py::none());
  m.def("amx_greedy_head", &pagedllm::amx_greedy_head_op, "per row of x W^T + bias on AMX tiles (an LM head's "
        "logits, never written out): first argmax, and its log-probability (NaN where a logit is not finite); "
        "blocks as for amx_linear", py::arg("x"), py::arg("panels"), py::arg("bias"), py::arg("out_features"),
        py::arg("blocks") = py::none());
  m.def("linear", &pagedllm::linear_op, "x W^T + bias over a packed weight (gated: silu(gate) * up of it)",
        py::arg("x"), py::arg("panels"), py::arg("bias"), py::arg("out_features"), py::arg("gated") = false);
  pagedllm::bind_decoder_stack(m);
}
