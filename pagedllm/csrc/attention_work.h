// How paged attention cuts a step's mixed batch into work: tiles of rows, the parts of keys the threads take,
// and the partial slots that split tiles merge from.
//
// A tile is (sequence, KV head, run of consecutive new tokens); its rows are its tokens times the query heads of
// the KV head's group, so every key row is loaded once for all of them. A prefix of blocks that several
// sequences' tables share (prefix caching, forks) is attended once for all of their rows together, in parts of
// its own, and each of their tiles then walks only its own keys after it. When there are too few tiles to keep
// every thread busy (a few long decodes), a tile's key range is also split into parts that run on different
// threads; the thread that finishes a tile's last part merges its partials.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "paged_attention.h"

namespace pagedllm {

struct Tile {
  int64_t seq, kv_head;
  int64_t token_begin, token_end;  // new tokens of the sequence, counted from its first new token
  int64_t first_key_pos;           // absolute position of token_begin (= the sequence's cached keys + token_begin)
  int64_t own_keys_begin = 0;      // keys below this are attended by a shared-prefix part
  int64_t num_parts = 0, first_slot = -1;  // first_slot: its parts' partials in the scratch buffer (-1: not split)
};

// One unit of work: keys [key_begin, key_end) for the rows of one tile, or, for a shared prefix, for the
// rows of several tiles at once (sequences whose block tables start with the same blocks: the keys are
// loaded once for all of them).
struct Part {
  int64_t first_member, num_members;  // its tiles: WorkList::members[first_member, first_member + num_members)
  int64_t rows;                       // all its tiles' rows together
  int64_t key_begin, key_end;
  int64_t slot;                       // each tile's partial goes to that tile's first_slot + slot; -1: written out
};

struct WorkList {
  std::vector<Tile> tiles;
  std::vector<int64_t> members;
  std::vector<Part> parts;
  int64_t num_slots = 0;
  int64_t max_rows = 0;  // of one tile
};

inline int64_t group_size(const PagedAttentionArgs& a) { return a.num_heads / a.num_kv_heads; }
inline int64_t tile_rows(const Tile& t, int64_t group) { return (t.token_end - t.token_begin) * group; }

// The batch's work list as a.work holds it, made now where no call with these args made it yet.
std::shared_ptr<const WorkList> work_for(const PagedAttentionArgs& a);

}  // namespace pagedllm
