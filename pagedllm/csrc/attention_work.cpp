#include "attention_work.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <map>

namespace pagedllm {
namespace {

// Target rows (tokens x group heads) of one tile. Each tile reads the K and V of every key before its tokens,
// so 4x the rows read a quarter as much: on AMX tiles, which copy some keys, prefill of 2048 tokens 2.46 ->
// 2.10 ms a layer against 48 rows; elsewhere float32 and bfloat16 prefill 2% and 5% faster (docs/attention.md).
constexpr int64_t kRowsPerTile = 192;
// A sequence with at most this many rows (decodes, short chunks) may join a shared prefix's parts.
constexpr int64_t kSharedMemberRows = 48;
constexpr int64_t kAutoPartition = 256;   // keys per part when splitting for idle threads
constexpr int64_t kMinSharedKeys = 64;    // the shortest common prefix worth attending once for its sequences
constexpr int64_t kSharedRows = 96;       // most rows (sequences x group heads) of one shared-prefix part
constexpr int64_t kSharedPiece = 1024;    // keys per shared-prefix part (fewer partials to merge: docs/attention.md)

// Sequences attended together over their common first `keys` keys.
struct SharedPrefix {
  std::vector<int64_t> seqs;
  int64_t keys;
};

int64_t tokens_per_tile(const PagedAttentionArgs& a, int64_t rows) {
  return std::max<int64_t>(1, rows / group_size(a));
}
int64_t query_len(const PagedAttentionArgs& a, int64_t s) { return a.query_start_loc[s + 1] - a.query_start_loc[s]; }
int64_t num_cached(const PagedAttentionArgs& a, int64_t s) { return a.seq_lens[s] - query_len(a, s); }
const int64_t* table_of(const PagedAttentionArgs& a, int64_t s) { return a.block_tables + s * a.block_table_width; }

// tiles[first_tile[s] + h] is sequence s's first tile of KV head h (tiles of one token run, then the next)
std::vector<Tile> make_tiles(const PagedAttentionArgs& a, int64_t run, std::vector<int64_t>& first_tile) {
  std::vector<Tile> tiles;
  first_tile.assign(a.num_seqs, 0);
  for (int64_t s = 0; s < a.num_seqs; ++s) {
    first_tile[s] = static_cast<int64_t>(tiles.size());
    const int64_t n = query_len(a, s), cached = num_cached(a, s);
    for (int64_t t0 = 0; t0 < n; t0 += run) {
      const int64_t t1 = std::min(n, t0 + run);
      for (int64_t h = 0; h < a.num_kv_heads; ++h) tiles.push_back({s, h, t0, t1, cached + t0});
    }
  }
  return tiles;
}

// Sequences with one tile per KV head (decodes, short chunks) whose tables begin with the same physical
// blocks. Keys in a shared block are the same for every sequence holding it, so their common cached
// prefix can be attended once for all of them. Grouped by first block; a group's prefix is the shortest
// run of equal block ids, capped by every member's cached keys (all of its rows see them).
std::vector<SharedPrefix> find_shared_prefixes(const PagedAttentionArgs& a) {
  std::map<int64_t, std::vector<int64_t>> by_first_block;
  for (int64_t s = 0; s < a.num_seqs; ++s)
    if (query_len(a, s) > 0 && query_len(a, s) <= tokens_per_tile(a, kSharedMemberRows) &&
        num_cached(a, s) >= kMinSharedKeys)  // a sequence without rows has no tiles to share into
      by_first_block[table_of(a, s)[0]].push_back(s);
  std::vector<SharedPrefix> shared;
  for (auto& [block, seqs] : by_first_block) {
    if (seqs.size() < 2) continue;
    const int64_t* first = table_of(a, seqs[0]);
    int64_t keys = num_cached(a, seqs[0]);
    for (int64_t s : seqs) {
      keys = std::min(keys, num_cached(a, s));
      const int64_t* table = table_of(a, s);
      int64_t equal = 0;
      while (equal * a.block_size < keys && table[equal] == first[equal]) ++equal;
      keys = std::min(keys, equal * a.block_size);
    }
    if (keys >= kMinSharedKeys) shared.push_back({std::move(seqs), keys});
  }
  return shared;
}

int64_t choose_partition(const PagedAttentionArgs& a, int64_t num_tiles) {
  if (a.partition_size > 0) return a.partition_size;
  if (num_tiles >= 4 * static_cast<int64_t>(at::get_num_threads())) return 0;  // enough tiles already
  return std::max<int64_t>(a.block_size, kAutoPartition / a.block_size * a.block_size);
}

// Parts over each shared prefix: per KV head, members in runs of at most kSharedRows rows, keys in pieces of
// kSharedPiece (so that threads share a long prefix). Each member tile's first partial slots are these pieces.
void add_shared_parts(const PagedAttentionArgs& a, const std::vector<int64_t>& first_tile, WorkList& w) {
  const int64_t group = group_size(a);
  for (const SharedPrefix& prefix : find_shared_prefixes(a)) {
    const int64_t pieces = (prefix.keys + kSharedPiece - 1) / kSharedPiece;
    for (int64_t h = 0; h < a.num_kv_heads; ++h) {
      for (size_t i = 0; i < prefix.seqs.size();) {
        const int64_t first_member = static_cast<int64_t>(w.members.size());
        int64_t rows = 0;
        for (; i < prefix.seqs.size(); ++i) {
          const int64_t tile = first_tile[prefix.seqs[i]] + h;
          const int64_t r = tile_rows(w.tiles[tile], group);
          if (rows > 0 && rows + r > kSharedRows) break;
          w.members.push_back(tile);
          w.tiles[tile].own_keys_begin = prefix.keys;
          w.tiles[tile].num_parts = pieces;  // its own keys' parts are added later
          rows += r;
        }
        const int64_t count = static_cast<int64_t>(w.members.size()) - first_member;
        for (int64_t p = 0; p < pieces; ++p)
          w.parts.push_back({first_member, count, rows, p * kSharedPiece,
                             std::min(prefix.keys, (p + 1) * kSharedPiece), p});
      }
    }
  }
}

int64_t count_tiles(const PagedAttentionArgs& a, int64_t run) {
  int64_t runs = 0;
  for (int64_t s = 0; s < a.num_seqs; ++s) runs += (query_len(a, s) + run - 1) / run;
  return runs * a.num_kv_heads;
}

// Tokens per tile: kRowsPerTile rows' worth, halved while that leaves fewer than 8 tiles a thread, down to
// kSharedMemberRows rows' worth (a shared prefix's members must be one tile each). A prompt's tiles are uneven
// (the first see the fewest keys): with 4 a thread, one 128-token prompt or a chunk of 96 after 1024 ran 3-6%
// slower than in tiles of 48 rows, and with 8 they take those.
int64_t choose_tile_run(const PagedAttentionArgs& a) {
  static_assert(kRowsPerTile >= kSharedMemberRows, "a shared prefix's member is one tile");
  const int64_t least = tokens_per_tile(a, kSharedMemberRows);
  const int64_t enough = 8 * static_cast<int64_t>(at::get_num_threads());
  int64_t run = tokens_per_tile(a, kRowsPerTile);
  while (run / 2 >= least && count_tiles(a, run) < enough) run /= 2;
  return run;
}

WorkList make_work(const PagedAttentionArgs& a) {
  WorkList w;
  std::vector<int64_t> first_tile;
  w.tiles = make_tiles(a, choose_tile_run(a), first_tile);
  add_shared_parts(a, first_tile, w);
  const int64_t partition = choose_partition(a, static_cast<int64_t>(w.tiles.size()));
  const int64_t group = group_size(a);
  for (int64_t i = 0; i < static_cast<int64_t>(w.tiles.size()); ++i) {
    Tile& t = w.tiles[i];
    const int64_t rows = tile_rows(t, group);
    w.max_rows = std::max(w.max_rows, rows);
    const int64_t begin = t.own_keys_begin, end = t.first_key_pos + (t.token_end - t.token_begin);
    const int64_t own = partition > 0 ? (end - begin + partition - 1) / partition : 1;
    const int64_t shared = t.num_parts;
    t.num_parts += own;
    w.members.push_back(i);
    const int64_t member = static_cast<int64_t>(w.members.size()) - 1;
    if (t.num_parts == 1) {
      w.parts.push_back({member, 1, rows, begin, end, -1});
      continue;
    }
    t.first_slot = w.num_slots;
    w.num_slots += t.num_parts;
    for (int64_t p = 0; p < own; ++p)
      w.parts.push_back({member, 1, rows, begin + p * partition,
                         own == 1 ? end : std::min(end, begin + (p + 1) * partition), shared + p});
  }
  // Most work first, so that no thread is left with one long part at the end.
  std::stable_sort(w.parts.begin(), w.parts.end(), [](const Part& x, const Part& y) {
    return (x.key_end - x.key_begin) * x.rows > (y.key_end - y.key_begin) * y.rows;
  });
  return w;
}

}  // namespace

std::shared_ptr<const WorkList> work_for(const PagedAttentionArgs& a) {
  auto made = std::static_pointer_cast<const WorkList>(a.work);
  if (made == nullptr) {
    made = std::make_shared<const WorkList>(make_work(a));
    a.work = made;
  }
  return made;
}

}  // namespace pagedllm
