// Writes into the paged KV cache and block copies, dtype-agnostic (rows are moved as bytes).
#pragma once

#include <cstdint>

namespace pagedllm {

struct CacheShape {
  int64_t num_kv_heads, num_blocks, block_size, head_dim, element_size;
  int64_t row_bytes() const { return head_dim * element_size; }
  int64_t block_bytes() const { return block_size * row_bytes(); }
  int64_t half_bytes() const { return num_kv_heads * num_blocks * block_bytes(); }  // all of K (or V)
};

// Token t's K and V rows (kv_heads x head_dim, tokens key_stride / value_stride elements apart) go to flat
// slot slots[t] = block * block_size + offset; a slot of -1 is skipped.
void write_kv(const void* key, int64_t key_stride, const void* value, int64_t value_stride, void* cache,
              const CacheShape& shape, const int64_t* slots, int64_t num_tokens);

// Copy every K and V head of block src[i] into block dst[i].
void copy_blocks(void* cache, const CacheShape& shape, const int64_t* src, const int64_t* dst, int64_t num_pairs);

}  // namespace pagedllm
