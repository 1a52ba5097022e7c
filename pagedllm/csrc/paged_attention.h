// Paged attention over a mixed batch (decode rows, prefill chunks over a cached prefix, whole prompts).
#pragma once

#include <cstdint>
#include <memory>

namespace pagedllm {

struct PagedAttentionArgs {
  const void* query;  // [num_tokens, num_heads, head_dim]; head rows contiguous, tokens query_token_stride apart
  int64_t query_token_stride;
  const void* kv_cache;  // [2, num_kv_heads, num_blocks, block_size, head_dim], contiguous
  void* out;             // [num_tokens, num_heads, head_dim], contiguous
  const int64_t* block_tables;  // [num_seqs, block_table_width]: logical block -> physical block
  int64_t block_table_width;
  const int64_t* seq_lens;         // [num_seqs]: keys after this step (cached + new)
  const int64_t* query_start_loc;  // [num_seqs + 1]: sequence i owns query rows [start[i], start[i+1])
  int64_t num_seqs, num_heads, num_kv_heads, num_blocks, block_size, head_dim;
  float scale;
  int64_t partition_size;  // keys per split of a long key range; 0 = split only when threads would idle
  // The batch's split into work, made by the first call with these args and kept for the calls after it: a
  // decoder stack attends one batch over every layer's cache (made once a layer, it took 9-19 us of each call).
  mutable std::shared_ptr<const void> work;
};

inline bool supports_head_dim(int64_t head_dim) {
  return head_dim == 16 || head_dim == 32 || head_dim == 64 || head_dim == 128;
}

// Whether a bfloat16 cache's many-row loops (prompts, chunks, shared prefixes) multiply on AMX tiles: where the
// build and OS allow them (amx_tiles_granted) unless turned off. Head dims that are no multiple of 32 widen.
void set_attention_tiles(bool on);
bool attention_tiles();

// query, cache and out share one dtype; head_dim must be supported.
void paged_attention_f32(const PagedAttentionArgs& args);
void paged_attention_bf16(const PagedAttentionArgs& args);

}  // namespace pagedllm
