// Paged attention for a mixed batch, reading K and V through the block tables where they lie.
//
// The batch is cut into tiles of rows and parts of keys (attention_work.h). A part walks its keys in runs of
// kLaneKeys positions (few rows: of a copy of keys, 32 in float32 and 64 in bfloat16), keeping an online softmax
// per row in float32: running max m, running sum l, unnormalised output acc. Rows only see keys up to their own
// position (causal over the cached prefix plus the new tokens).
//
// Two shapes of loop: with half a vector of rows or more (prefill, shared prefixes) rows sit in the lanes
// of a vector, for the scores, the softmax and the output alike (in bfloat16 with AVX512-BF16, as pair dot
// products of bfloat16, and with AMX as tile products over whole copies of keys); with fewer (decodes) one dot
// product per (row, key), the keys of a tile in the lanes. A vector is 16 floats with AVX-512 and 8 with AVX2
// (vec.h).
//
// Every part of a split tile leaves (m, l, acc), and the thread that finishes a tile's last part merges them
// with the exact rule of pagedllm/attention/merge.py: M = max m_p, w_p = exp(m_p - M),
// out = sum_p w_p acc_p / sum_p w_p l_p.
#include "paged_attention.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <memory>
#include <new>
#include <stdexcept>
#include <type_traits>
#include <vector>

#include "amx_tiles.h"
#include "attention_work.h"
#include "bf16_path.h"
#include "parallel.h"
#include "vec.h"

namespace pagedllm {
namespace {

constexpr int64_t kKeyTile = kLanes;      // keys scored together (one vector of them, for few rows)
constexpr int64_t kCopyKeys = 64;         // most keys read together (a copy of keys; AMX tiles copy some)
constexpr int64_t kCopyStride = 16;       // ... in the order 0, 16, 32, 48, 1, 17, ...: four streams of K and V
// Keys per softmax step of many rows: each step rescales every output accumulator and sets up the row
// vectors' masks once, so 32 keys spread that over twice (AVX-512) or four times (AVX2) the keys of one
// vector (AVX2 prefill of 3 prompts -12%, docs/attention.md).
constexpr int64_t kLaneKeys = 32;
static_assert(kCopyKeys % kKeyTile == 0 && kCopyKeys % kLaneKeys == 0 && kCopyKeys % kCopyStride == 0,
              "a copy holds whole key tiles and runs");
constexpr float kLazyMax = 8.0f;          // how far past a row's running max a score moves it, on tiles

// bfloat16 pair dot products (vdpbf16ps): with them a bfloat16 cache's many-row loops multiply pairs of
// bfloat16 values into float32 sums, twice the work per instruction of widening to float32 first. They are
// used where bf16_path() found vdpbf16ps the faster (some cores issue it at half their FMA rate).
#if defined(__AVX512BF16__) && defined(__AVX512BW__) && defined(__AVX512VL__)
constexpr bool kHasPairDot = true;
// acc + a[2i] b[2i] + a[2i+1] b[2i+1] in lane i, for a and b holding a pair of bfloat16 per lane
inline fvec pair_dot(fvec acc, uvec a, uvec b) {
  return bit_cast<fvec>(_mm512_dpbf16_ps(bit_cast<__m512>(acc), bit_cast<__m512bh>(a), bit_cast<__m512bh>(b)));
}
// The 32 values of lo and hi rounded to bfloat16, as pairs in order: lane i holds values 2i and 2i + 1.
inline uvec bf16_pairs(fvec lo, fvec hi) {
  return bit_cast<uvec>(_mm512_cvtne2ps_pbh(bit_cast<__m512>(hi), bit_cast<__m512>(lo)));
}
// Two rows of 32 bfloat16 values as pairs (a value of a, the same dim's of b): lanes 4i .. 4i+3 of lo hold dims
// 8i .. 8i+3, of hi dims 8i+4 .. 8i+7 (vpunpck*wd work within 128-bit lanes).
inline void interleave_rows(uvec a, uvec b, uvec& lo, uvec& hi) {
  lo = bit_cast<uvec>(_mm512_unpacklo_epi16(bit_cast<__m512i>(a), bit_cast<__m512i>(b)));
  hi = bit_cast<uvec>(_mm512_unpackhi_epi16(bit_cast<__m512i>(a), bit_cast<__m512i>(b)));
}
// Sums over interleave_rows' pairs, back in dim order: dims 0-15 in lo, 16-31 in hi.
inline void natural_dims(fvec& lo, fvec& hi) {
  const __m512i first = _mm512_setr_epi32(0, 1, 2, 3, 16, 17, 18, 19, 4, 5, 6, 7, 20, 21, 22, 23);
  const __m512i second = _mm512_setr_epi32(8, 9, 10, 11, 24, 25, 26, 27, 12, 13, 14, 15, 28, 29, 30, 31);
  const __m512 a = bit_cast<__m512>(lo), b = bit_cast<__m512>(hi);
  lo = bit_cast<fvec>(_mm512_permutex2var_ps(a, first, b));
  hi = bit_cast<fvec>(_mm512_permutex2var_ps(a, second, b));
}
#else  // never called: kHasPairDot is false
constexpr bool kHasPairDot = false;
inline fvec pair_dot(fvec acc, uvec, uvec) { return acc; }
inline uvec bf16_pairs(fvec, fvec) { return uvec{}; }
inline void interleave_rows(uvec, uvec, uvec&, uvec&) {}
inline void natural_dims(fvec&, fvec&) {}
#endif

#if defined(PAGEDLLM_AMX)
constexpr bool kHasTiles = true;
#else
constexpr bool kHasTiles = false;
#endif

// How the many-row loops multiply: float32 FMAs (a bfloat16 cache widened first), vdpbf16ps pair dot products,
// or AMX tile products (bfloat16 caches where the CPU has AMX and head_dim is a multiple of 32).
enum class ManyRows { kWiden, kPairDots, kTiles };

std::atomic<bool> tiles_requested{true};

// The pair (lo, hi) of two bfloat16 values as one 32-bit word, lo in the low half (the order in memory).
inline uint32_t load_pair(const bf16_t* p) {
  uint32_t word;
  std::memcpy(&word, p, sizeof word);
  return word;
}

// Lane i: the bfloat16 of lo[i] in the low half, of hi[i] in the high half; lo and hi already hold
// bfloat16 values (their low 16 bits are zero), so this truncation is exact.
inline uvec pair_up(fvec lo, fvec hi) {
  return (bit_cast<uvec>(lo) >> 16) | (bit_cast<uvec>(hi) & 0xFFFF0000u);
}

// Lane i: lo[i] and hi[i] rounded to bfloat16 as one pair (lo in the low half), and the rounded values as float32
// in lo, hi. With AVX512-BF16 from the same hardware conversion as round_to_bf16, two shifts fewer than two of its
// calls and pair_up.
inline uvec round_pair(fvec& lo, fvec& hi) {
#if defined(__AVX512BF16__)
  auto widened = [](fvec v) { return _mm512_cvtepu16_epi32(bf16_halves(v)); };  // bits in the low halves
  const __m512i low = widened(lo), high = _mm512_slli_epi32(widened(hi), 16);
  lo = bit_cast<fvec>(_mm512_slli_epi32(low, 16));
  hi = bit_cast<fvec>(high);
  return bit_cast<uvec>(_mm512_or_si512(low, high));
#else
  lo = round_to_bf16(lo);
  hi = round_to_bf16(hi);
  return pair_up(lo, hi);
#endif
}

// Keys [key0, key_end) of a tile's sequence and KV head (tile null: none).
struct Keys {
  const Tile* tile = nullptr;
  int64_t key0 = 0, key_end = 0;
};

// Scratch rows are whole 64-byte lines: malloc's 16-byte alignment let every vector load of a row straddle
// two cache lines or not depending on where the heap put the buffer, which moved the kernel's prefill
// time by 10-16% from one build to the next.
template <typename T>
struct LineAligned {
  using value_type = T;
  static constexpr std::align_val_t kAlign{64};
  LineAligned() = default;
  template <typename U>
  LineAligned(const LineAligned<U>&) {}
  T* allocate(size_t n) { return static_cast<T*>(::operator new(n * sizeof(T), kAlign)); }
  void deallocate(T* p, size_t) { ::operator delete(p, kAlign); }
  template <typename U>
  bool operator==(const LineAligned<U>&) const { return true; }
};
template <typename T>
using line_vector = std::vector<T, LineAligned<T>>;

struct Scratch {
  line_vector<float> q_rows;    // [padded rows][dim], scaled (pair dot products: the bfloat16 rows, unscaled)
  line_vector<float> q_lanes;   // [dim][padded rows]: the same, rows in vector lanes
  line_vector<float> scores;    // scores, then probabilities: [key][padded rows], or [row][copy key] for few rows
  line_vector<float> acc;       // [padded rows][dim]: unnormalised output
  line_vector<float> acc_lanes; // [dim][padded rows]: the same while many rows are worked on, rows in lanes
  // pair dot products (bfloat16): query pairs [dim / 2][padded rows], unscaled; probability pairs of
  // consecutive keys [key / 2][padded rows]; value pairs of consecutive keys [key / 2][dim]
  line_vector<uint32_t> q_pairs, p_pairs, v_pairs;
  line_vector<bf16_t> v_columns;  // AMX tiles: the V rows of a copy as columns, [dim][copy key]
  line_vector<float> m, l, alpha, limit;  // [padded rows]; limit: the last key position a row may see
  line_vector<unsigned char> kv_copy;  // AMX tiles: K rows of runs of keys that cross blocks (cache dtype)
  // where the rows of the keys being scored lie in the cache: their K rows; on AMX tiles, their V rows
  const void* rows[kCopyKeys] = {};
  // few rows: the K rows of the next copy (V is value_offset_ further), requested into L2 while this copy's keys
  // are scored and accumulated; next_count of them (0 for many rows: load_keys requests them all)
  const void* next_rows[kCopyKeys] = {};
  int64_t next_count = 0;
  // AMX tiles: each run of 16 keys' K rows, head_dim apart (in their block, or copied into kv_copy)
  const void* key_runs[kCopyKeys / kAmxTileRows] = {};
  int64_t at = 0;  // the current key tile's first key: its index in `rows`

  void resize(int64_t padded, int64_t dim, int64_t copy_bytes) {
    kv_copy.resize(copy_bytes);
    q_rows.resize(padded * dim);  // padded: the many-row loops transpose whole blocks of kLanes rows
    q_lanes.resize(dim * padded);
    scores.resize(kCopyKeys * padded);  // [key][row] many rows, [row][copy key] few (padded >= kLanes rows)
    acc.resize(padded * dim);
    acc_lanes.resize(dim * padded);
    q_pairs.resize(dim / 2 * padded);
    p_pairs.resize(kCopyKeys / 2 * padded);
    v_pairs.resize(kLaneKeys / 2 * dim);
    v_columns.resize(dim * kCopyKeys);
    for (auto* v : {&m, &l, &alpha, &limit}) v->resize(padded);
  }
};

// A split tile's count of parts still running, alone on its cache line: the threads finishing parts of
// neighbouring tiles would otherwise pass one line back and forth.
struct alignas(64) PendingParts {
  std::atomic<int64_t> count;
};

// Not inlined: the caller keeps the address instead of recomputing it, which in a shared library is a
// call to __tls_get_addr (the compiler put one, with vector register spills, inside the output loop).
__attribute__((noinline)) Scratch& thread_scratch() {
  thread_local Scratch s;
  return s;
}

// One instantiation per cache dtype T, head dim (kChunks vectors) and, for bfloat16, how the many-row loops
// multiply (attention_tiles() and bf16_path() pick).
template <typename T, int kChunks, ManyRows kMode>
class Kernel {
 public:
  static constexpr int64_t kDim = kChunks * kLanes;
  // Few rows (decodes): rows whose one-vector output slices stay in registers together while the value rows
  // stream past: 8 for bfloat16, whose rows cost a widening per load, 4 for float32.
  static constexpr int64_t kRowBlock = std::is_same_v<T, float> ? 4 : 8;
  // The many-row loops' register blocks: row vectors per pass, keys per score pass and head dims per value
  // pass. AVX-512's 32 registers hold 3 x 8 accumulators, AVX2's 16 hold 3 x 4.
#if defined(__AVX512F__)
  static constexpr int64_t kMaxScoreVecs = 3, kPassKeys = 8, kPassDims = 8;
#else  // 3 x 4 measured as fast as 1 x 8 in float32 and 1.5x as fast in bfloat16 (prefill, chunks)
  static constexpr int64_t kMaxScoreVecs = 3, kPassKeys = 4, kPassDims = 4;
#endif
  static constexpr int64_t kScoreRows = 4;     // few-row scores: rows sharing each key load
  static constexpr bool kPairs = std::is_same_v<T, bf16_t> && kHasPairDot && kMode == ManyRows::kPairDots;
  static constexpr bool kTiles =
      std::is_same_v<T, bf16_t> && kHasTiles && kMode == ManyRows::kTiles && kDim % kAmxDepth == 0;
  static constexpr bool kPairBlocks = kDim / 2 % kLanes == 0;  // query pairs in whole transposable blocks
  // Few rows multiply by pair dot products too: the scores (unscaled bfloat16 queries as they are, the scale after
  // the sums), where widening a key row took four loads and four shifts, and the values (two keys at a time).
  static constexpr bool kFewRowPairs = kPairs && kPairBlocks;
  // Keys read together: a float32 copy of 64 keys' K and V rows (head_dim 64) fills a 32 KiB L1; copies of 32
  // took decodes 2-3% and prefill 1.5% less time on an AVX-512 EPYC, where bfloat16 ones of 32 took decodes 7% more.
  static constexpr int64_t kCopy = std::is_same_v<T, float> ? kCopyKeys / 2 : kCopyKeys;
  static_assert(kCopy % kKeyTile == 0 && kCopy % kLaneKeys == 0 && kCopy % kCopyStride == 0,
                "a copy is whole key tiles, softmax steps and streams");
  // keys per softmax step of many rows: on tiles a whole copy, which halves the output tiles' loads and stores
  static constexpr int64_t kManyRowKeys = kTiles ? kCopy : kLaneKeys;

  explicit Kernel(const PagedAttentionArgs& a)
      : a_(a), group_(group_size(a)), cache_(static_cast<const T*>(a.kv_cache)),
        value_offset_(a.num_kv_heads * a.num_blocks * a.block_size * kDim) {}

  void run() {
    const std::shared_ptr<const WorkList> made = work_for(a_);
    const WorkList& w = *made;
    const int64_t slot_stride = w.max_rows * (kDim + 2);
    // not zeroed: every row a merge reads was written by its part (zeroing it was 0.5-1% of a step)
    const std::unique_ptr<float[]> partials(new float[w.num_slots * slot_stride]);
    // parts of each split tile still running: the thread that finishes its last one merges it (no second
    // parallel region, and merges overlap the parts still running)
    const std::unique_ptr<PendingParts[]> pending(w.num_slots > 0 ? new PendingParts[w.tiles.size()] : nullptr);
    for (size_t i = 0; pending && i < w.tiles.size(); ++i)
      pending[i].count.store(w.tiles[i].num_parts, std::memory_order_relaxed);
    parallel_dynamic_ahead(static_cast<int64_t>(w.parts.size()), [&](int64_t i, int64_t next) {
      const Part& part = w.parts[i];
      run_part(w, part, next >= 0 ? &w.parts[next] : nullptr, partials.get(), slot_stride);
      if (part.slot < 0) return;
      for (int64_t m = 0; m < part.num_members; ++m) {
        const int64_t tile = w.members[part.first_member + m];
        // acq_rel: the merging thread sees every other part's partial of this tile
        if (pending[tile].count.fetch_sub(1, std::memory_order_acq_rel) != 1) continue;
        const Tile& t = w.tiles[tile];
        merge_parts(t, partials.get() + t.first_slot * slot_stride, slot_stride);
      }
    });
  }

 private:
  const PagedAttentionArgs& a_;
  const int64_t group_;
  const T* cache_;
  const int64_t value_offset_;

  int64_t rows(const Tile& t) const { return tile_rows(t, group_); }
  static Keys first_keys(const WorkList& w, const Part& part) {
    return {&w.tiles[w.members[part.first_member]], part.key_begin, part.key_end};
  }
  static int64_t padded(int64_t rows) { return (rows + kLanes - 1) / kLanes * kLanes; }
  int64_t token_index(const Tile& t, int64_t r) const {
    return a_.query_start_loc[t.seq] + t.token_begin + r / group_;
  }
  int64_t head_index(const Tile& t, int64_t r) const { return t.kv_head * group_ + r % group_; }

  // A part's rows are its member tiles' rows one after another; its keys lie in the first member's blocks
  // (for a shared prefix, the same blocks as every other member's). `next_part`: the one this thread takes
  // after it (null: none), whose first keys are prefetched while this part's last copy is read.
  void run_part(const WorkList& w, const Part& part, const Part* next_part, float* partials,
                int64_t slot_stride) const {
    const int64_t* members = w.members.data() + part.first_member;
    const Tile& t = w.tiles[members[0]];
    const int64_t key_begin = part.key_begin, key_end = part.key_end;
    const int64_t num_rows = part.rows, width = padded(num_rows);
    const bool lanes = num_rows >= kLanes / 2;  // enough rows to fill vector lanes: score rows x one key
    Scratch& s = thread_scratch();
    s.resize(width, kDim, kTiles ? kCopyKeys * kDim * static_cast<int64_t>(sizeof(T)) : 0);
    load_queries(w, part, s, width, lanes);
    // Few rows take a whole copy of keys at a time (one softmax step per row per copy); many rows kManyRowKeys.
    const int64_t step = lanes ? kManyRowKeys : kCopy;
    if (kTiles && lanes) load_tile_config();
    for (int64_t key0 = key_begin; key0 < key_end; key0 += step) {
      // rows are ordered by position: rows before `first` see no key from key0 on (a shared prefix lies
      // before every member's own positions: all rows see it)
      const int64_t first = part.num_members > 1 ? 0 : std::max<int64_t>(0, key0 - t.first_key_pos) * group_;
      if (first >= num_rows) break;
      const int64_t n = std::min(step, key_end - key0);
      // the keys this thread reads after this copy: the part's next copy, or the next part's first
      const Keys after = key0 + kCopy < key_end ? Keys{&t, key0 + kCopy, key_end}
                         : next_part != nullptr    ? first_keys(w, *next_part)
                                                   : Keys{};
      load_keys(t, key0, key_begin, key_end, after, s, !lanes);
      if (key0 + step >= key_end) prefetch_ends(w, part, next_part);
      if (lanes && kTiles) {  // scores [key][row] as for lanes, multiplied on tiles
        attend_tiles(s, width, first / kLanes, key0, n);
      } else if (lanes) {  // scores [key][row]: rows in vector lanes
        const int64_t first_vec = first / kLanes;
        score_lanes(s, width, first_vec, n);
        softmax_lanes(s, width, first_vec, key0, n);
        accumulate_lanes(s, width, first_vec, n);
      } else {  // scores [row][key]: keys in vector lanes
        score_rows(s, first, num_rows, n);
        for (int64_t r = first; r < num_rows; ++r) softmax_row(s, r, key0, n);
        accumulate(s, first, num_rows, n);
      }
    }
    if (kTiles && lanes) release_tiles();
    if (lanes) rows_from_lanes(s, width);
    else if constexpr (kFewRowPairs) natural_order(s, num_rows);
    if (part.slot < 0) {
      write_rows(t, s.acc.data(), s.l.data(), num_rows);
      return;
    }
    for (int64_t i = 0, row = 0; i < part.num_members; row += rows(w.tiles[members[i]]), ++i) {
      const Tile& member = w.tiles[members[i]];
      save_partial(s, row, rows(member), partials + (member.first_slot + part.slot) * slot_stride);
    }
  }

  // In a part's last softmax step: its output rows requested for writing, and the next part's query rows into
  // L2. Loaded and stored only when a part starts and ends, they missed the caches: the prefill's queries and
  // output stores held about a tenth of its time (`perf annotate`).
  void prefetch_ends(const WorkList& w, const Part& part, const Part* next_part) const {
    if (part.slot < 0) {
      const Tile& t = w.tiles[w.members[part.first_member]];
      for (int64_t r = 0; r < rows(t); ++r) prefetch_row<1>(output_row(t, r));
    }
    if (next_part == nullptr) return;
    for (int64_t i = 0; i < next_part->num_members; ++i) {
      const Tile& t = w.tiles[w.members[next_part->first_member + i]];
      for (int64_t r = 0; r < rows(t); ++r) prefetch_row(query_row(t, r));
    }
  }

  void load_queries(const WorkList& w, const Part& part, Scratch& s, int64_t width, bool lanes) const {
    const int64_t num_rows = part.rows;
    std::fill(s.limit.begin() + num_rows, s.limit.begin() + width, -1.0f);  // -1: padding
    std::fill(s.m.begin(), s.m.begin() + width, kNegInf);
    std::fill(s.l.begin(), s.l.begin() + width, 0.0f);
    const float scale = a_.scale;
    float* q_rows = s.q_rows.data();
    // rows by token, then by the query heads of the group (row r: token r / group, head r % group)
    for (int64_t i = 0, row = 0; i < part.num_members; ++i) {
      const Tile& t = w.tiles[w.members[part.first_member + i]];
      const T* token_query = query_row(t, 0);
      for (int64_t token = 0; token < t.token_end - t.token_begin; ++token, token_query += a_.query_token_stride)
        for (int64_t h = 0; h < group_; ++h, ++row) {
          s.limit[row] = static_cast<float>(t.first_key_pos + token);
          const T* src = token_query + h * kDim;
          if constexpr (kPairs || kTiles) {
            if (lanes) {  // pairs of unscaled queries; whole blocks of them transposed below, from q_rows' memory
              if constexpr (kPairBlocks) std::memcpy(q_rows + row * kDim / 2, src, kDim * sizeof(T));
              else for (int64_t d = 0; d < kDim; d += 2) s.q_pairs[d / 2 * width + row] = load_pair(src + d);
              continue;
            }
          }
          if constexpr (kFewRowPairs) {  // few rows: the row's pairs of dims where score_block reads them
            std::memcpy(q_rows + row * kDim / 2, src, kDim * sizeof(T));
            continue;
          }
          for (int64_t c = 0; c < kChunks; ++c)
            storev(q_rows + row * kDim + c * kLanes, loadv(src + c * kLanes) * scale);
        }
    }
    if (!lanes) {
      std::fill(s.acc.begin(), s.acc.begin() + num_rows * kDim, 0.0f);
      return;
    }
    std::fill(s.acc_lanes.begin(), s.acc_lanes.begin() + kDim * width, 0.0f);
    if (kPairs || kTiles) {
      if constexpr (kPairBlocks) {  // [row][dim / 2] -> [dim / 2][row], padding rows zero
        float* pair_rows = s.q_rows.data();  // the pairs' bits, moved as floats
        std::fill(pair_rows + num_rows * kDim / 2, pair_rows + width * kDim / 2, 0.0f);
        for (int64_t r = 0; r < width; r += kLanes)
          for (int64_t d = 0; d < kDim / 2; d += kLanes)
            transpose_block(pair_rows + r * kDim / 2 + d, kDim / 2,
                            reinterpret_cast<float*>(s.q_pairs.data()) + d * width + r, width);
        return;
      }
      for (int64_t d = 0; d < kDim; d += 2)
        std::fill(s.q_pairs.begin() + d / 2 * width + num_rows, s.q_pairs.begin() + (d / 2 + 1) * width, 0u);
      return;
    }
    std::fill(s.q_rows.begin() + num_rows * kDim, s.q_rows.begin() + width * kDim, 0.0f);
    for (int64_t r = 0; r < width; r += kLanes)
      for (int64_t d = 0; d < kDim; d += kLanes)
        transpose_block(s.q_rows.data() + r * kDim + d, kDim, s.q_lanes.data() + d * width + r, width);
  }

  // f(j, K row of position key0 + j) for j < n; V is value_offset_ further. A block's rows follow each other: one
  // table lookup a block, not a key (the lookups were a tenth of a decode's instructions).
  template <typename F>
  void for_each_key(const Tile& t, int64_t key0, int64_t n, const F& f) const {
    const int64_t* table = a_.block_tables + t.seq * a_.block_table_width;
    int64_t block = key0 / a_.block_size, offset = key0 % a_.block_size;
    const T* head = cache_ + t.kv_head * a_.num_blocks * a_.block_size * kDim;
    for (int64_t j = 0; j < n; offset = 0, ++block) {
      const T* row = head + (table[block] * a_.block_size + offset) * kDim;
      for (const int64_t run_end = std::min(n, j + a_.block_size - offset); j < run_end; ++j, row += kDim) f(j, row);
    }
  }

  // The K and V rows of the next kCopy keys (a "copy" of keys: on AMX tiles some are copied) are read in one
  // tight loop before the key tiles among them are scored: the blocks lie anywhere in the pool, and a loop that
  // reads several blocks in turn keeps more reads in flight than loads spread through the score and output loops
  // (docs/attention.md). The vector loops then read the rows where they lie, now in L1: copied into the thread's
  // buffer first, as they were, the copy's stores held back the loop's reads (decodes of 40 sequences over 30
  // layers 9% faster without them on a Xeon, float32 prefill 4% on an EPYC). On AMX tiles many rows take
  // keys_in_place.
  void load_keys(const Tile& t, int64_t key0, int64_t key_begin, int64_t key_end, const Keys& after,
                 Scratch& s, bool few) const {
    s.at = (key0 - key_begin) % kCopy;  // key0's row in the copy
    if (s.at != 0) return;
    const int64_t count = std::min(kCopy, key_end - key0);
    const T* src[kCopyKeys];
    const T* next[kCopyKeys];
    for_each_key(t, key0, count, [&](int64_t j, const T* k) { src[j] = k; });
    const int64_t next_count = after.tile == nullptr ? 0 : std::min(kCopy, after.key_end - after.key0);
    if (next_count > 0)
      for_each_key(*after.tile, after.key0, next_count, [&](int64_t j, const T* k) { next[j] = k; });
    if (kTiles && !few) {
      keys_in_place(src, count, next, next_count, s);
      return;
    }
    // rows in the order j = 0, 16, 32, 48, 1, ...: with blocks of 16, four blocks' K and V streams in flight,
    // each read in order. The same rows of the next copy are requested into L2: for many rows with each row
    // here; for few, only the first row of each stream here, the rest while this copy is scored (K) and
    // accumulated (V), so that those requests go out while the arithmetic runs (docs/attention.md).
    Chunk touched{};
    for (int64_t r = 0; r < kCopyStride; ++r)
      for (int64_t j = r; j < count; j += kCopyStride) {
        if (j < next_count && (!few || r == 0)) {
          prefetch_row(next[j]);
          prefetch_row(next[j] + value_offset_);
        }
        s.rows[j] = src[j];
        touch_row(src[j], touched);
        touch_row(src[j] + value_offset_, touched);
      }
    keep(touched);
    s.next_count = few ? next_count : 0;
    for (int64_t j = 0; j < s.next_count; ++j) s.next_rows[j] = next[j];
  }

  // AMX tiles: the tile loads read a run of 16 keys' K rows where they lie when they follow each other in one
  // block, and make_value_columns reads the V rows where they lie; only runs that cross blocks or end early are
  // copied (copying every row measured slower: docs/attention.md). The next copy's rows are requested into L2
  // while this one is worked on.
  void keys_in_place(const T* const* src, int64_t count, const T* const* next, int64_t next_count, Scratch& s) const {
    T* k_copy = reinterpret_cast<T*>(s.kv_copy.data());
    for (int64_t j = 0; j < next_count; ++j) {
      prefetch_row(next[j]);
      prefetch_row(next[j] + value_offset_);
    }
    for (int64_t j0 = 0; j0 < kCopyKeys; j0 += kAmxTileRows) {
      const int64_t run_end = j0 + kAmxTileRows;
      bool follow = run_end <= count;  // every row head_dim after the one before
      for (int64_t j = j0 + 1; follow && j < run_end; ++j) follow = src[j] == src[j - 1] + kDim;
      if (!follow)
        for (int64_t j = j0; j < std::min(run_end, count); ++j) copy_row(k_copy + j * kDim, src[j]);
      s.key_runs[j0 / kAmxTileRows] = follow ? src[j0] : k_copy + j0 * kDim;
    }
    for (int64_t j = 0; j < count; ++j) s.rows[j] = src[j] + value_offset_;
  }

  // One K row (AMX tiles: of a run that crosses blocks), in 64-byte vectors (AVX-512; else 32-byte ones) written
  // out here: as a call to the library's memcpy (GCC does not inline one of 128-256 bytes) the copy took about
  // half of a decode's time on AVX2, when every K and V row was copied. Vectors of 64 bytes halve the stores.
  typedef char Chunk32 __attribute__((vector_size(32)));
#if defined(__AVX512F__)
  typedef char Chunk64 __attribute__((vector_size(64)));
  using Chunk = std::conditional_t<kDim * sizeof(T) % 64 == 0, Chunk64, Chunk32>;
#else
  using Chunk = Chunk32;
#endif
  static_assert(kDim * sizeof(T) % sizeof(Chunk) == 0, "rows are whole chunks");

  static void copy_row(T* dst, const T* src) {
    for (size_t i = 0; i < kDim * sizeof(T); i += sizeof(Chunk)) {
      Chunk c;
      std::memcpy(&c, reinterpret_cast<const char*>(src) + i, sizeof c);
      std::memcpy(reinterpret_cast<char*>(dst) + i, &c, sizeof c);
    }
  }

  // One K or V row's lines loaded into L1, one load each, OR-ed into `touched` so that `keep` keeps the loads.
  static void touch_row(const T* src, Chunk& touched) {
    for (size_t i = 0; i < kDim * sizeof(T); i += 64) {
      Chunk c;
      std::memcpy(&c, reinterpret_cast<const char*>(src) + i, sizeof c);
      touched |= c;
    }
  }
  static void keep(const Chunk& touched) { asm volatile("" : : "x"(touched)); }

  // One row requested into L2 (locality 2: prefetcht1 on x86); for writing (prefetchw), into L1.
  template <int kWrite = 0>
  static void prefetch_row(const T* row) {
    for (size_t i = 0; i < kDim * sizeof(T); i += 64)
      __builtin_prefetch(reinterpret_cast<const char*>(row) + i, kWrite, 2);
  }

  // Key j of the current key tile: its K row where it lies in the cache (V is value_offset_ further).
  static const T* key_row(const Scratch& s, int64_t j) { return static_cast<const T*>(s.rows[s.at + j]); }
  const T* value_row(const Scratch& s, int64_t j) const { return key_row(s, j) + value_offset_; }

  // Many rows: a vector of rows, one key element broadcast at a time (no horizontal sums).
  void score_lanes(Scratch& s, int64_t width, int64_t first_vec, int64_t n) const {
    for_row_vectors(width, first_vec, [&](auto vecs, int64_t vec) {
      score_lanes_block<decltype(vecs)::value>(s, width, vec, n);
    });
  }

  // f(std::integral_constant<int, kVecs>, first vector) over the row vectors from first_vec on, up to
  // kMaxScoreVecs at a time (the many-row loops keep that many row vectors in registers).
  template <typename F>
  static void for_row_vectors(int64_t width, int64_t first_vec, const F& f) {
    const int64_t vecs = width / kLanes - first_vec;
    for (int64_t v = 0; v < vecs; v += kMaxScoreVecs) {
      switch (std::min(kMaxScoreVecs, vecs - v)) {
        case 1: f(std::integral_constant<int, 1>{}, first_vec + v); break;
        case 2: f(std::integral_constant<int, 2>{}, first_vec + v); break;
        default: f(std::integral_constant<int, kMaxScoreVecs>{}, first_vec + v); break;
      }
    }
  }

  // kVecs row vectors x kPassKeys keys per pass: each query load and each key broadcast feeds several FMAs.
  // With pair dot products a step takes a pair of dims: a pair of query values times a broadcast pair of
  // key values; the queries are unscaled bfloat16 then, and the scale comes last.
  template <int kVecs>
  void score_lanes_block(Scratch& s, int64_t width, int64_t vec, int64_t n) const {
    for (int64_t j = 0; j < n; j += kPassKeys) {
      const T* k[kPassKeys];
      for (int64_t i = 0; i < kPassKeys; ++i) k[i] = key_row(s, std::min(j + i, n - 1));
      fvec acc[kVecs][kPassKeys] = {};
      if constexpr (kPairs) {
        const uint32_t* q = s.q_pairs.data() + vec * kLanes;
        for (int64_t d = 0; d < kDim; d += 2) {
          uvec qd[kVecs];
          for (int64_t v = 0; v < kVecs; ++v) std::memcpy(&qd[v], q + d / 2 * width + v * kLanes, sizeof qd[v]);
          for (int64_t i = 0; i < kPassKeys; ++i) {
            const uvec kd = uvec{} + load_pair(k[i] + d);
            for (int64_t v = 0; v < kVecs; ++v) acc[v][i] = pair_dot(acc[v][i], qd[v], kd);
          }
        }
      } else {
        const float* q = s.q_lanes.data() + vec * kLanes;
        for (int64_t d = 0; d < kDim; ++d) {
          fvec qd[kVecs];
          for (int64_t v = 0; v < kVecs; ++v) qd[v] = in_register(loadv(q + d * width + v * kLanes));
          for (int64_t i = 0; i < kPassKeys; ++i) {
            const float kd = to_float(k[i][d]);
            for (int64_t v = 0; v < kVecs; ++v) acc[v][i] += qd[v] * kd;
          }
        }
      }
      for (int64_t i = 0; i < kPassKeys && j + i < n; ++i)
        for (int64_t v = 0; v < kVecs; ++v) {
          if constexpr (kPairs) acc[v][i] *= a_.scale;
          storev(s.scores.data() + (j + i) * width + (vec + v) * kLanes, acc[v][i]);
        }
    }
  }

  // Few rows (decodes): the scores of a copy's n keys, kKeyTile dot products per row at a time reduced together
  // into one vector (keys in lanes), into scores[row][key]. Rows go kScoreRows at a time so that each key row
  // is loaded (and widened, for bfloat16) once for all of them. The first block of rows requests the next
  // copy's K rows into L2, one per key scored.
  void score_rows(Scratch& s, int64_t first, int64_t num_rows, int64_t n) const {
    for (int64_t r0 = first; r0 < num_rows; r0 += kScoreRows) {
      const int64_t requests = r0 == first ? s.next_count : 0;  // next rows to request
      switch (std::min(kScoreRows, num_rows - r0)) {
        case 1: score_block<1>(s, r0, n, requests); break;
        case 2: score_block<2>(s, r0, n, requests); break;
        case 3: score_block<3>(s, r0, n, requests); break;
        default: score_block<kScoreRows>(s, r0, n, requests); break;
      }
    }
  }

  template <int kRows>
  void score_block(Scratch& s, int64_t r0, int64_t n, int64_t requests) const {
    if constexpr (kFewRowPairs) return score_pairs_block<kRows>(s, r0, n, requests);
    const float* q = s.q_rows.data() + r0 * kDim;
    for (int64_t j0 = 0; j0 < n; j0 += kKeyTile) {
      fvec dots[kRows][kKeyTile];
      for (int64_t j = 0; j < kKeyTile; ++j) {
        if (j0 + j < requests) prefetch_row(static_cast<const T*>(s.next_rows[j0 + j]));
        const T* k = key_row(s, std::min(j0 + j, n - 1));
        fvec key[kChunks];
        for (int64_t c = 0; c < kChunks; ++c) key[c] = loadv(k + c * kLanes);
        for (int64_t b = 0; b < kRows; ++b) {
          fvec dot = loadv(q + b * kDim) * key[0];
          for (int64_t c = 1; c < kChunks; ++c) dot += loadv(q + b * kDim + c * kLanes) * key[c];
          dots[b][j] = dot;
        }
      }
      for (int64_t b = 0; b < kRows; ++b) storev(s.scores.data() + (r0 + b) * kCopyKeys + j0, transpose_sums(dots[b]));
    }
  }

  // score_block by pair dot products, half a key tile at a time taken as far as half_sums: so few instructions
  // a key that a whole tile's dot products (kRows x kKeyTile vectors) went through the stack.
  template <int kRows>
  void score_pairs_block(Scratch& s, int64_t r0, int64_t n, int64_t requests) const {
    constexpr int64_t kHalf = kKeyTile / 2, kPairVecs = kDim / 2 / kLanes;
    const uint32_t* q = reinterpret_cast<const uint32_t*>(s.q_rows.data()) + r0 * kDim / 2;
    for (int64_t j0 = 0; j0 < n; j0 += kKeyTile) {
      fvec halves[kRows][2];
      for (int64_t h = 0; h < 2; ++h) {
        fvec dots[kRows][kHalf];
        for (int64_t i = 0; i < kHalf; ++i) {
          const int64_t j = j0 + h * kHalf + i;
          if (j < requests) prefetch_row(static_cast<const T*>(s.next_rows[j]));
          const T* k = key_row(s, std::min(j, n - 1));
          uvec key[kPairVecs];
          for (int64_t c = 0; c < kPairVecs; ++c) std::memcpy(&key[c], k + 2 * c * kLanes, sizeof key[c]);
          for (int64_t b = 0; b < kRows; ++b) {
            fvec dot{};
            for (int64_t c = 0; c < kPairVecs; ++c) {
              uvec query;
              std::memcpy(&query, q + b * kDim / 2 + c * kLanes, sizeof query);
              dot = pair_dot(dot, query, key[c]);
            }
            dots[b][i] = dot;
          }
        }
        for (int64_t b = 0; b < kRows; ++b) halves[b][h] = half_sums(dots[b]);
      }
      for (int64_t b = 0; b < kRows; ++b)
        storev(s.scores.data() + (r0 + b) * kCopyKeys + j0, join_sums(halves[b][0], halves[b][1]) * a_.scale);
    }
  }

  // The online softmax step of row r over the scores of keys key0 .. key0+n-1 (keys past n or past the row's
  // position are masked): one running-max update per copy of keys, not per key tile.
  static void softmax_row(Scratch& s, int64_t r, int64_t key0, int64_t n) {
    const float valid = static_cast<float>(std::min(n, static_cast<int64_t>(s.limit[r]) - key0 + 1));
    float* p = s.scores.data() + r * kCopyKeys;
    fvec tile_max = splat(kNegInf);
    for (int64_t j = 0; j < n; j += kLanes) {
      const fvec scores = kIota + static_cast<float>(j) < valid ? loadv(p + j) : splat(kNegInf);
      storev(p + j, scores);
      tile_max = vmax(tile_max, scores);
    }
    const float new_max = std::max(s.m[r], reduce_max(tile_max));  // finite: row r sees key0
    fvec sum{};
    for (int64_t j = 0; j < n; j += kLanes) {
      fvec e = fast_exp(loadv(p + j) - new_max);
      if constexpr (kFewRowPairs) e = round_to_bf16(e);  // the value pass multiplies them as bfloat16: l sums the same
      storev(p + j, e);
      sum += e;
    }
    s.alpha[r] = fast_exp(s.m[r] - new_max);
    s.l[r] = s.l[r] * s.alpha[r] + reduce_add(sum);
    s.m[r] = new_max;
  }

  // Online softmax over keys key0 .. key0+n-1 for a vector of rows at a time; scores become probabilities.
  void softmax_lanes(Scratch& s, int64_t width, int64_t first_vec, int64_t key0, int64_t n) const {
    for (int64_t v = first_vec; v < width / kLanes; ++v) softmax_vector(s, width, v, key0, n);
  }

  // The online softmax step of row vector v. Scores from tiles are unscaled: max(scale x) = scale max(x), so the
  // scale joins at the max and the exponent.
  void softmax_vector(Scratch& s, int64_t width, int64_t v, int64_t key0, int64_t n) const {
    const float scale = kTiles ? a_.scale : 1.0f;
    const int64_t at = v * kLanes;
    const fvec limit = loadv(s.limit.data() + at);
    // below the diagonal every real row sees every key of the tile (padding rows, limit -1, are not read)
    const float first_limit = -reduce_max(limit < 0.0f ? splat(kNegInf) : -limit);
    const bool all_visible = static_cast<float>(key0 + n - 1) <= first_limit;
    auto visible_score = [&](int64_t j) {  // key j's scores, masked (and stored so) where past a row's position
      float* p = s.scores.data() + j * width + at;
      if (all_visible) return loadv(p);
      const fvec masked = splat(static_cast<float>(key0 + j)) <= limit ? loadv(p) : splat(kNegInf);
      storev(p, masked);
      return masked;
    };
    // four running maxima: one chain of vmaxps would wait out each one's latency (prefill 5% faster)
    fvec maxima[4] = {splat(kNegInf), splat(kNegInf), splat(kNegInf), splat(kNegInf)};
    int64_t j = 0;
    for (; j + 4 <= n; j += 4)
      for (int64_t i = 0; i < 4; ++i) maxima[i] = vmax(maxima[i], visible_score(j + i));
    for (; j < n; ++j) maxima[0] = vmax(maxima[0], visible_score(j));
    const fvec tile_max = vmax(vmax(maxima[0], maxima[1]), vmax(maxima[2], maxima[3]));
    const fvec old_max = loadv(s.m.data() + at);
    fvec new_max = vmax(old_max, tile_max * scale);
    // On tiles, where rescaling the outputs is a pass of its own, a row keeps its running max until a score
    // passes it by kLazyMax: its probabilities stay below e^kLazyMax (far from overflow; bfloat16 rounds them
    // relative to their size), and out = acc / l holds for any reference (docs/attention.md).
    if constexpr (kTiles) new_max = new_max > old_max + kLazyMax ? new_max : old_max;
    const fvec shift = new_max == kNegInf ? fvec{} : new_max;  // a row with no key yet stays empty
    // 1 for a row with no key before: its acc and l are still zero
    const fvec alpha = old_max == kNegInf ? splat(1.0f) : fast_exp(old_max - shift);
    fvec sum{};
    if constexpr (kTiles || kPairs) {  // straight to the probability pairs the values multiply (zero from n on)
      // on tiles e^(scale x - shift) = 2^(x scale log2(e) - shift log2(e))
      const float scale2 = scale * 1.4426950408889634f;
      const fvec shift2 = shift * 1.4426950408889634f;
      auto probability = [&](int64_t j) {
        if (j >= n) return fvec{};
        const fvec x = loadv(s.scores.data() + j * width + at);
        return kTiles ? coarse_exp2(x * scale2 - shift2) : fast_exp(x - shift);
      };
      fvec odd_sum{};  // a second chain of additions: one would wait out each one's latency
      // tiles multiply whole copies of keys; the vector loops the keys there are
      for (int64_t j = 0; j < (kTiles ? kCopyKeys : n); j += 2) {
        fvec lo = probability(j), hi = probability(j + 1);
        const uvec pair = round_pair(lo, hi);  // the values are multiplied by them as bfloat16: l sums the same
        sum += lo;
        odd_sum += hi;
        std::memcpy(s.p_pairs.data() + j / 2 * width + at, &pair, sizeof pair);
      }
      sum += odd_sum;
    } else {
      for (int64_t j = 0; j < n; ++j) {
        float* p = s.scores.data() + j * width + at;
        const fvec e = fast_exp(loadv(p) * scale - shift);
        storev(p, e);
        sum += e;
      }
    }
    storev(s.l.data() + at, loadv(s.l.data() + at) * alpha + sum);
    storev(s.m.data() + at, new_max);
    storev(s.alpha.data() + at, alpha);
  }

  // acc_r = alpha_r acc_r + sum_j p_rj v_j, up to kRowBlock rows at a time with their outputs in registers.
  // p_rj = s.scores[r * kCopyKeys + j]. The first block of rows requests the next copy's V rows into L2, one per
  // key accumulated.
  void accumulate(Scratch& s, int64_t first, int64_t num_rows, int64_t n) const {
    for (int64_t r0 = first; r0 < num_rows; r0 += kRowBlock) {
      const int64_t requests = r0 == first ? s.next_count : 0;  // next rows to request
      switch (std::min(kRowBlock, num_rows - r0)) {
        case 1: accumulate_rows<1>(s, r0, n, requests); break;
        case 2: accumulate_rows<2>(s, r0, n, requests); break;
        case 3: accumulate_rows<3>(s, r0, n, requests); break;
        case 4: accumulate_rows<4>(s, r0, n, requests); break;
        case 5: accumulate_rows<5>(s, r0, n, requests); break;
        case 6: accumulate_rows<6>(s, r0, n, requests); break;
        case 7: accumulate_rows<7>(s, r0, n, requests); break;
        default: accumulate_rows<kRowBlock>(s, r0, n, requests); break;
      }
    }
  }

  // Several slices of the head at a time where the registers allow: a copy's keys make each accumulator a chain
  // of as many FMAs, and with one slice the out-of-order window does not reach the next. With AVX-512 the whole
  // head (head_dim 64) for up to 4 rows, so that each key's row pointer and probabilities are loaded once, and
  // two slices for up to 8.
  template <int kRows>
  void accumulate_rows(Scratch& s, int64_t r0, int64_t n, int64_t requests) const {
    if constexpr (kFewRowPairs) return accumulate_pairs<kRows>(s, r0, n, requests);
#if defined(__AVX512F__)
    constexpr int64_t kSlices = kChunks % 4 == 0 && kRows <= 4 ? 4 : kChunks % 2 == 0 ? 2 : 1;
#else
    constexpr int64_t kSlices = kChunks % 2 == 0 && kRows <= 4 ? 2 : 1;
#endif
    const float* p = s.scores.data() + r0 * kCopyKeys;
    for (int64_t c0 = 0; c0 < kChunks; c0 += kSlices) {
      fvec out[kRows][kSlices];
      for (int64_t b = 0; b < kRows; ++b)
        for (int64_t c = 0; c < kSlices; ++c)
          out[b][c] = loadv(s.acc.data() + (r0 + b) * kDim + (c0 + c) * kLanes) * s.alpha[r0 + b];
      for (int64_t j = 0; j < n; ++j) {
        if (c0 == 0 && j < requests) prefetch_row(static_cast<const T*>(s.next_rows[j]) + value_offset_);
        fvec v[kSlices];
        for (int64_t c = 0; c < kSlices; ++c) v[c] = loadv(value_row(s, j) + (c0 + c) * kLanes);
        for (int64_t b = 0; b < kRows; ++b) {
          const float pj = p[b * kCopyKeys + j];
          for (int64_t c = 0; c < kSlices; ++c) out[b][c] += v[c] * pj;
        }
      }
      for (int64_t b = 0; b < kRows; ++b)
        for (int64_t c = 0; c < kSlices; ++c) storev(s.acc.data() + (r0 + b) * kDim + (c0 + c) * kLanes, out[b][c]);
    }
  }

  // accumulate_rows by pair dot products: each row's probabilities of two keys times the two keys' value rows
  // interleaved (interleave_rows), so that s.acc holds the dims in its order until natural_order. Up to 4 rows
  // two 32-dim slices at a time (head_dim 64: the whole head), beyond that one.
  template <int kRows>
  void accumulate_pairs(Scratch& s, int64_t r0, int64_t n, int64_t requests) const {
    // slices of one vector of pairs (2 kLanes dims; whole ones: kPairBlocks)
    constexpr int64_t kSlices = kDim / (2 * kLanes), kAtOnce = kRows <= 4 && kSlices % 2 == 0 ? 2 : 1;
    constexpr int64_t kStride = kCopyKeys / 2;  // of a row's probability pairs
    uint32_t* pairs = s.p_pairs.data();
    for (int64_t b = 0; b < kRows; ++b)
      for (int64_t j = 0; j < n; j += 2 * kLanes) {
        const float* p = s.scores.data() + (r0 + b) * kCopyKeys + j;  // rounded already: converted exactly
        const uvec pair = bf16_pairs(loadv(p), loadv(p + kLanes));
        std::memcpy(pairs + b * kStride + j / 2, &pair, sizeof pair);
      }
    for (int64_t c0 = 0; c0 < kSlices; c0 += kAtOnce) {
      fvec out[kRows][2 * kAtOnce];
      for (int64_t b = 0; b < kRows; ++b)
        for (int64_t c = 0; c < 2 * kAtOnce; ++c)
          out[b][c] = loadv(s.acc.data() + (r0 + b) * kDim + (2 * c0 + c) * kLanes) * s.alpha[r0 + b];
      for (int64_t j = 0; j < n; j += 2) {
        for (int64_t i = j; c0 == 0 && i < std::min(j + 2, requests); ++i)
          prefetch_row(static_cast<const T*>(s.next_rows[i]) + value_offset_);
        // an odd n's last partner: its probability is zero (softmax_row), its value row any finite one
        const T* first = value_row(s, j);
        const T* second = value_row(s, std::min(j + 1, n - 1));
        uvec lo[kAtOnce], hi[kAtOnce];
        for (int64_t c = 0; c < kAtOnce; ++c) {
          uvec a, b;
          std::memcpy(&a, first + (c0 + c) * 2 * kLanes, sizeof a);
          std::memcpy(&b, second + (c0 + c) * 2 * kLanes, sizeof b);
          interleave_rows(a, b, lo[c], hi[c]);
        }
        for (int64_t b = 0; b < kRows; ++b) {
          const uvec pj = uvec{} + pairs[b * kStride + j / 2];
          for (int64_t c = 0; c < kAtOnce; ++c) {
            out[b][2 * c] = pair_dot(out[b][2 * c], pj, lo[c]);
            out[b][2 * c + 1] = pair_dot(out[b][2 * c + 1], pj, hi[c]);
          }
        }
      }
      for (int64_t b = 0; b < kRows; ++b)
        for (int64_t c = 0; c < 2 * kAtOnce; ++c)
          storev(s.acc.data() + (r0 + b) * kDim + (2 * c0 + c) * kLanes, out[b][c]);
    }
  }

  // A part's few-row outputs, accumulated by accumulate_pairs, back in dim order.
  static void natural_order(Scratch& s, int64_t num_rows) {
    for (int64_t r = 0; r < num_rows; ++r)
      for (int64_t d = 0; d < kDim; d += 2 * kLanes) {
        float* row = s.acc.data() + r * kDim + d;
        fvec lo = loadv(row), hi = loadv(row + kLanes);
        natural_dims(lo, hi);
        storev(row, lo);
        storev(row + kLanes, hi);
      }
  }

  // Many rows: acc_lanes[d] (a vector of rows) = alpha acc_lanes[d] + sum_j p_j v_jd, with the probabilities
  // of a vector of rows together and each value element broadcast (the transpose of `accumulate`: every load
  // feeds several FMAs, where there one value slice feeds as many FMAs as rows it holds in registers).
  void accumulate_lanes(Scratch& s, int64_t width, int64_t first_vec, int64_t n) const {
    if constexpr (kPairs) make_value_pairs(s, n);  // the probability pairs: from softmax_vector
    for_row_vectors(width, first_vec, [&](auto vecs, int64_t vec) {
      accumulate_lanes_block<decltype(vecs)::value>(s, width, vec, n);
    });
  }

  // kPassDims dims x kVecs row vectors per pass; with pair dot products a step takes two consecutive keys
  // (their probability pairs per row times a broadcast pair of value elements, from make_*_pairs).
  template <int kVecs>
  void accumulate_lanes_block(Scratch& s, int64_t width, int64_t vec, int64_t n) const {
    float* acc = s.acc_lanes.data() + vec * kLanes;
    fvec alpha[kVecs];
    for (int64_t v = 0; v < kVecs; ++v) alpha[v] = loadv(s.alpha.data() + (vec + v) * kLanes);
    for (int64_t d0 = 0; d0 < kDim; d0 += kPassDims) {
      fvec out[kPassDims][kVecs];
      for (int64_t i = 0; i < kPassDims; ++i)
        for (int64_t v = 0; v < kVecs; ++v) out[i][v] = loadv(acc + (d0 + i) * width + v * kLanes) * alpha[v];
      if constexpr (kPairs) {
        const uint32_t* p = s.p_pairs.data() + vec * kLanes;
        for (int64_t j = 0; j < n; j += 2) {
          uvec pj[kVecs];
          for (int64_t v = 0; v < kVecs; ++v) std::memcpy(&pj[v], p + j / 2 * width + v * kLanes, sizeof pj[v]);
          const uint32_t* value = s.v_pairs.data() + j / 2 * kDim + d0;
          for (int64_t i = 0; i < kPassDims; ++i) {
            const uvec vd = uvec{} + value[i];
            for (int64_t v = 0; v < kVecs; ++v) out[i][v] = pair_dot(out[i][v], pj[v], vd);
          }
        }
      } else {
        const float* p = s.scores.data() + vec * kLanes;
        for (int64_t j = 0; j < n; ++j) {
          fvec pj[kVecs];
          for (int64_t v = 0; v < kVecs; ++v) pj[v] = in_register(loadv(p + j * width + v * kLanes));
          const T* value = value_row(s, j) + d0;
          for (int64_t i = 0; i < kPassDims; ++i) {
            const float vd = to_float(value[i]);
            for (int64_t v = 0; v < kVecs; ++v) out[i][v] += pj[v] * vd;
          }
        }
      }
      for (int64_t i = 0; i < kPassDims; ++i)
        for (int64_t v = 0; v < kVecs; ++v) storev(acc + (d0 + i) * width + v * kLanes, out[i][v]);
    }
  }

  // Pairs of consecutive keys' values, per dim, for the pair dot products; a missing last partner (odd n) is zero.
  void make_value_pairs(Scratch& s, int64_t n) const {
    for (int64_t j = 0; j < n; j += 2) {
      const bool partner = j + 1 < n;
      for (int64_t c = 0; c < kChunks; ++c) {
        const fvec lo = loadv(value_row(s, j) + c * kLanes);
        const uvec pair = pair_up(lo, partner ? loadv(value_row(s, j + 1) + c * kLanes) : fvec{});
        std::memcpy(s.v_pairs.data() + j / 2 * kDim + c * kLanes, &pair, sizeof pair);
      }
    }
  }

#if defined(PAGEDLLM_AMX)
  // Many rows on AMX tiles, every tile 16 rows of 64 bytes. Scores: tiles 0-3 the sums of a copy's four runs of
  // 16 keys, 4 and 6 their K rows in turn, 5 and 7 query pairs in turn. Values: tiles 0-3 four 16-dim slices of
  // the output, 4 and 6 value columns in turn, 5 and 7 the probability pairs of the copy's two halves.
  static void load_tile_config() {
    static const TileConfig config = tile_config(kAmxTileRows);
    _tile_loadconfig(&config);
  }
  static void release_tiles() { _tile_release(); }

  // One copy of keys for the rows from vector first_vec on, a vector of rows at a time through scores, softmax and
  // values, so that its scores (64 lines) stay in the L1 between the three (all vectors' scores of one phase
  // before the next: the L2's).
  void attend_tiles(Scratch& s, int64_t width, int64_t first_vec, int64_t key0, int64_t n) const {
    make_value_columns(s, n);
    for (int64_t v = first_vec; v < width / kLanes; ++v) {
      score_tiles(s, width, v);
      softmax_vector(s, width, v, key0, n);
      accumulate_tiles(s, width, v);
    }
  }

  // scores [key][row] = K Q^T (unscaled) for every key of the copy (past n the copy's stale rows: never read),
  // for row vector v: each K tile is one run of 16 keys x 32 dims (Scratch::key_runs), and each query tile
  // 16 dim pairs x the vector's 16 rows.
  void score_tiles(Scratch& s, int64_t width, int64_t v) const {
    static_assert(kCopyKeys == 4 * kAmxTileRows, "a copy is four runs of 16 keys");
    const char* runs[4];
    for (int r = 0; r < 4; ++r) runs[r] = reinterpret_cast<const char*>(s.key_runs[r]);
    const int64_t width_bytes = width * 4;
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
    for (int64_t c = 0; c < kDim / kAmxDepth; c += 2) {  // query tiles 5 and 7 in turn
      score_runs<5>(runs, c * kAmxDepth * 2, s.q_pairs.data() + c * kAmxDepth / 2 * width + v * kLanes, width);
      if (c + 1 < kDim / kAmxDepth)
        score_runs<7>(runs, (c + 1) * kAmxDepth * 2,
                      s.q_pairs.data() + (c + 1) * kAmxDepth / 2 * width + v * kLanes, width);
    }
    float* scores = s.scores.data() + v * kLanes;
    _tile_stored(0, scores, width_bytes);
    _tile_stored(1, scores + kAmxTileRows * width, width_bytes);
    _tile_stored(2, scores + 2 * kAmxTileRows * width, width_bytes);
    _tile_stored(3, scores + 3 * kAmxTileRows * width, width_bytes);
  }

  // Sums 0-3 (the copy's four runs of 16 keys) += those runs' K rows at `keys` (32 dims) times query tile kQuery
  // (5 or 7), loaded from `queries`. (The tile intrinsics write their tile numbers into the instruction text:
  // they must be literals.)
  template <int kQuery>
  static void score_runs(const char* const* runs, int64_t offset, const uint32_t* queries, int64_t width) {
    constexpr int64_t kKeyBytes = kDim * 2;
#define PAGEDLLM_SCORE_RUNS(query)                      \
    _tile_loadd(query, queries, width * 4);             \
    _tile_loadd(4, runs[0] + offset, kKeyBytes);        \
    _tile_dpbf16ps(0, 4, query);                        \
    _tile_loadd(6, runs[1] + offset, kKeyBytes);        \
    _tile_dpbf16ps(1, 6, query);                        \
    _tile_loadd(4, runs[2] + offset, kKeyBytes);        \
    _tile_dpbf16ps(2, 4, query);                        \
    _tile_loadd(6, runs[3] + offset, kKeyBytes);        \
    _tile_dpbf16ps(3, 6, query);
    if constexpr (kQuery == 5) {
      PAGEDLLM_SCORE_RUNS(5)
    } else {
      PAGEDLLM_SCORE_RUNS(7)
    }
#undef PAGEDLLM_SCORE_RUNS
  }

  // acc_lanes [dim][row] = alpha acc_lanes + V^T P over the copy's keys for row vector v: value columns (keys past
  // n zero) times probability pairs (zero past n), four 16-dim slices at a time. The four slices' sums are
  // independent, so their products are issued in turn: two in a row into one tile wait for each other.
  void accumulate_tiles(Scratch& s, int64_t width, int64_t v) const {
    const int64_t width_bytes = width * 4;
    rescale_outputs(s, width, v);
    _tile_loadd(5, s.p_pairs.data() + v * kLanes, width_bytes);
    _tile_loadd(7, s.p_pairs.data() + kCopyKeys / 4 * width + v * kLanes, width_bytes);
    for (int64_t d0 = 0; d0 < kDim; d0 += 4 * kAmxTileRows) {
      float* acc = s.acc_lanes.data() + d0 * width + v * kLanes;
      const bf16_t* columns = s.v_columns.data() + d0 * kCopyKeys;
      const int64_t slice = kAmxTileRows * width;  // floats from one 16-dim slice of acc to the next
      _tile_loadd(0, acc, width_bytes);
      _tile_loadd(1, acc + slice, width_bytes);
      if constexpr (kDim >= 4 * kAmxTileRows) {
        _tile_loadd(2, acc + 2 * slice, width_bytes);
        _tile_loadd(3, acc + 3 * slice, width_bytes);
      }
      multiply_value_slices<5>(columns);
      multiply_value_slices<7>(columns + kCopyKeys / 2);
      _tile_stored(0, acc, width_bytes);
      _tile_stored(1, acc + slice, width_bytes);
      if constexpr (kDim >= 4 * kAmxTileRows) {
        _tile_stored(2, acc + 2 * slice, width_bytes);
        _tile_stored(3, acc + 3 * slice, width_bytes);
      }
    }
  }

  // Sums 0-3 (two where the head has only 32 dims) += the 16-dim slices of value columns from `columns` (half a
  // copy of keys) times probability pairs tile kProbabilities (5 or 7).
  template <int kProbabilities>
  static void multiply_value_slices(const bf16_t* columns) {
    constexpr int64_t kColumnBytes = kCopyKeys * 2, kSlice = kAmxTileRows * kCopyKeys;
#define PAGEDLLM_VALUE_SLICES(pairs)                        \
    _tile_loadd(4, columns, kColumnBytes);                  \
    _tile_dpbf16ps(0, 4, pairs);                            \
    _tile_loadd(6, columns + kSlice, kColumnBytes);         \
    _tile_dpbf16ps(1, 6, pairs);                            \
    if constexpr (kDim >= 4 * kAmxTileRows) {               \
      _tile_loadd(4, columns + 2 * kSlice, kColumnBytes);   \
      _tile_dpbf16ps(2, 4, pairs);                          \
      _tile_loadd(6, columns + 3 * kSlice, kColumnBytes);   \
      _tile_dpbf16ps(3, 6, pairs);                          \
    }
    if constexpr (kProbabilities == 5) {
      PAGEDLLM_VALUE_SLICES(5)
    } else {
      PAGEDLLM_VALUE_SLICES(7)
    }
#undef PAGEDLLM_VALUE_SLICES
  }

  // The vector v of rows' outputs times their alpha (skipped where no row's running max moved).
  static void rescale_outputs(Scratch& s, int64_t width, int64_t v) {
    const fvec alpha = loadv(s.alpha.data() + v * kLanes);
    if (_mm512_cmpneq_ps_mask(bit_cast<__m512>(alpha), _mm512_set1_ps(1.0f)) == 0) return;
    float* acc = s.acc_lanes.data() + v * kLanes;
    for (int64_t d = 0; d < kDim; ++d) storev(acc + d * width, loadv(acc + d * width) * alpha);
  }

  // The copy's V rows, read where they lie, as columns: v_columns [dim][key] (the tiles' first operand is
  // row-major), keys from n on zero. 16 keys x 16 dim pairs at a time: a 32-bit transpose puts a dim pair of 16
  // keys in one vector, whose low halves are one dim's column and high halves the next's.
  void make_value_columns(Scratch& s, int64_t n) const {
    alignas(64) static const bf16_t zeros[kDim] = {};
    const bf16_t* rows[kCopyKeys];  // a tile step is one whole copy; keys from n on zero
    for (int64_t j = 0; j < kCopyKeys; ++j) rows[j] = j < n ? static_cast<const bf16_t*>(s.rows[j]) : zeros;
    for (int64_t k0 = 0; k0 < kCopyKeys; k0 += kLanes)
      for (int64_t p0 = 0; p0 < kDim / 2; p0 += kLanes) {
        fvec x[kLanes];
        for (int64_t r = 0; r < kLanes; ++r)
          std::memcpy(&x[r], rows[k0 + r] + 2 * p0, sizeof x[r]);
        transpose(x);
        for (int64_t r = 0; r < kLanes; ++r) {
          const __m512i pairs = bit_cast<__m512i>(x[r]);
          bf16_t* column = s.v_columns.data() + 2 * (p0 + r) * kCopyKeys + k0;
          _mm256_storeu_si256(reinterpret_cast<__m256i*>(column), _mm512_cvtepi32_epi16(pairs));
          _mm256_storeu_si256(reinterpret_cast<__m256i*>(column + kCopyKeys),
                              _mm512_cvtepi32_epi16(_mm512_srli_epi32(pairs, 16)));
        }
      }
  }
#else
  static void load_tile_config() {}
  static void release_tiles() {}
  void attend_tiles(Scratch&, int64_t, int64_t, int64_t, int64_t) const {}
#endif

  static void rows_from_lanes(Scratch& s, int64_t width) {
    for (int64_t d = 0; d < kDim; d += kLanes)
      for (int64_t r = 0; r < width; r += kLanes)
        transpose_block(s.acc_lanes.data() + d * width + r, width, s.acc.data() + r * kDim + d, kDim);
  }

  // rows [first, first + num_rows) of the scratch into one tile's partial; per row: acc [dim], then m, then l
  void save_partial(const Scratch& s, int64_t first, int64_t num_rows, float* partial) const {
    for (int64_t r = 0; r < num_rows; ++r) {
      float* dst = partial + r * (kDim + 2);
      std::copy(s.acc.begin() + (first + r) * kDim, s.acc.begin() + (first + r + 1) * kDim, dst);
      dst[kDim] = s.m[first + r];
      dst[kDim + 1] = s.l[first + r];
    }
  }

  // Row by row, in registers: M = max m_p, w_p = e^(m_p - M), out = (sum_p w_p acc_p) / (sum_p w_p l_p).
  void merge_parts(const Tile& t, const float* partials, int64_t slot_stride) const {
    for (int64_t r = 0; r < rows(t); ++r) {
      const float* row = partials + r * (kDim + 2);
      float big_m = kNegInf;
      for (int64_t p = 0; p < t.num_parts; ++p) big_m = std::max(big_m, row[p * slot_stride + kDim]);
      fvec acc[kChunks] = {};
      float sum = 0.0f;
      for (int64_t p = 0; p < t.num_parts; ++p) {
        const float* part = row + p * slot_stride;
        const float w = fast_exp(part[kDim] - big_m);  // 0 for a part the row saw no key of (m = -inf)
        sum += w * part[kDim + 1];
        for (int64_t c = 0; c < kChunks; ++c) acc[c] += splat(w) * loadv(part + c * kLanes);
      }
      const float inv = 1.0f / sum;  // every row sees at least its own key, so sum > 0
      T* dst = output_row(t, r);
      for (int64_t c = 0; c < kChunks; ++c) storev(dst + c * kLanes, acc[c] * inv);
    }
  }

  // Where row r of tile t (its token and query head) lies in the query.
  const T* query_row(const Tile& t, int64_t r) const {
    return static_cast<const T*>(a_.query) + token_index(t, r) * a_.query_token_stride + head_index(t, r) * kDim;
  }

  // Where row r of tile t (its token and query head) goes in the output.
  T* output_row(const Tile& t, int64_t r) const {
    return static_cast<T*>(a_.out) + (token_index(t, r) * a_.num_heads + head_index(t, r)) * kDim;
  }

  void write_rows(const Tile& t, const float* acc, const float* sums, int64_t num_rows) const {
    for (int64_t r = 0; r < num_rows; ++r) {
      T* dst = output_row(t, r);
      const float inv = 1.0f / sums[r];  // every row sees at least its own key, so sums[r] > 0
      for (int64_t c = 0; c < kChunks; ++c) storev(dst + c * kLanes, loadv(acc + r * kDim + c * kLanes) * inv);
    }
  }
};

template <typename T, ManyRows kMode>
void dispatch_head_dim(const PagedAttentionArgs& a) {
  switch (a.head_dim) {
    case 16: Kernel<T, 16 / kLanes, kMode>(a).run(); break;
    case 32: Kernel<T, 32 / kLanes, kMode>(a).run(); break;
    case 64: Kernel<T, 64 / kLanes, kMode>(a).run(); break;
    case 128: Kernel<T, 128 / kLanes, kMode>(a).run(); break;
    default: throw std::invalid_argument("paged_attention supports head_dim 16, 32, 64 and 128");
  }
}

template <typename T>
void dispatch(const PagedAttentionArgs& a) {
  if constexpr (std::is_same_v<T, bf16_t>) {
    if (attention_tiles()) return dispatch_head_dim<T, ManyRows::kTiles>(a);  // head_dim 16: widens
    if (kHasPairDot && bf16_path() == Bf16Path::kDot) return dispatch_head_dim<T, ManyRows::kPairDots>(a);
  }
  dispatch_head_dim<T, ManyRows::kWiden>(a);
}

}  // namespace

void set_attention_tiles(bool on) { tiles_requested = on; }
bool attention_tiles() { return tiles_requested && amx_tiles_granted(); }

void paged_attention_f32(const PagedAttentionArgs& args) { dispatch<float>(args); }
void paged_attention_bf16(const PagedAttentionArgs& args) { dispatch<bf16_t>(args); }

}  // namespace pagedllm
