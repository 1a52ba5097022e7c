// The bfloat16 matmul on AMX tiles. A tile product multiplies 16 rows of x by 32 inputs of 16 outputs into 16 x 16
// float32 sums in one instruction, so a decode step's few dozen rows cost little to multiply and the step is
// bound by streaming the weights. A weight is packed into panels of 16 outputs, each the 1 KB tiles of its
// 32-input steps in order. Each thread takes a run of consecutive pairs of panels (parallel.h's Runs) and
// multiplies each pair by 32 rows of x at a time (two row tiles, four tiles of sums), so that each tile loaded
// feeds two products; a batch of more rows goes over the same two panels again, from the cache. A thread's
// panels are read in order, one stream. The first pass over an item requests its weight tiles into L1 four steps
// ahead (a decode step's 30 layers 3-6% faster); requesting each thread's next pair of panels into L2 during this
// one was 10-19% slower at 8-64 rows (docs/models.md). An MLP's [gate; up] weight is
// packed gated: each pair of panels is 16 outputs' gate and up columns, stored as silu(gate) * up, so that the
// [rows, 2 I] product is never written out and read back by a separate activation. A pass's sums are stored a
// slice per tile step of the thread's next pass, so that the stores' vector work overlaps its stream (an LM
// head's picks 15% faster, the projections 7%: docs/models.md). A weight loaded from quantized blocks may also
// come as those blocks' tiles (amx_blocks.h), which small batches stream and expand in L1 instead; Q4_1's expand to
// their outputs' rows, which multiply x's pairs of inputs (the sums come out transposed and are turned back).
#include "amx_linear.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "amx_blocks.h"
#include "amx_tiles.h"
#include "parallel.h"

namespace pagedllm {

int64_t amx_panels(int64_t n, bool gated) {
  return gated ? 2 * ((n / 2 + kAmxPanelCols - 1) / kAmxPanelCols) : (n + kAmxPanelCols - 1) / kAmxPanelCols;
}

int64_t amx_panel_row(int64_t p, int64_t j, int64_t n, bool gated) {
  if (!gated) return p * kAmxPanelCols + j < n ? p * kAmxPanelCols + j : -1;
  const int64_t outputs = n / 2, output = p / 2 * kAmxPanelCols + j;
  return output < outputs ? output + (p % 2) * outputs : -1;  // gate panel, then the up panel of its outputs
}

void pack_amx_weight(const bf16_t* w, int64_t n, int64_t k, bool gated, bf16_t* panels) {
  const int64_t steps = k / kAmxDepth, panel_size = steps * kAmxDepth * kAmxPanelCols;
  for (int64_t p = 0; p < amx_panels(n, gated); ++p)
    for (int64_t j = 0; j < kAmxPanelCols; ++j) {
      const int64_t row = amx_panel_row(p, j, n, gated);
      for (int64_t s = 0; s < steps; ++s)
        for (int64_t r = 0; r < kAmxDepth / 2; ++r)
          for (int64_t t = 0; t < 2; ++t)
            panels[p * panel_size + (s * kAmxDepth / 2 + r) * 2 * kAmxPanelCols + 2 * j + t] =
                row >= 0 ? w[row * k + s * kAmxDepth + 2 * r + t] : bf16_t{0};
    }
}

#if defined(PAGEDLLM_AMX)

namespace {

// Tiles: sums 0-3 (row tile i, panel j in tile 2i + j), x 4-5 (row tiles), weights 6-7 (panels). The tile
// intrinsics take literal tile numbers.
constexpr int64_t kItemRows = 2 * kAmxTileRows;  // rows of x per pass over an item's two panels
constexpr int64_t kPrefetchSteps = 4;             // how far ahead a first pass requests its weight tiles
constexpr int64_t kRowBlockBytes = 384 * 1024;    // most bytes of x rows per block of a large batch
constexpr int64_t kBlocksAhead = 8;                // how far ahead a pass expanding block tiles requests them
// Most rows of a batch that reads a weight's block tiles: the default model's 30 layers' projections from memory,
// panels / blocks, 32 rows 9.4 / 6.6 ms, 128 rows 20.9 / 14.5, 256 rows 28.2 / 26.0, 512 rows 50.0 / 51.9.
constexpr int64_t kBlocksMaxRows = 256;

// The weight tiles of step `ahead` of an item (past its last step: of the next item, which follows it) into L1.
template <int kPanels>
void prefetch_weights(const char* panel, int64_t panel_bytes, int64_t steps, int64_t ahead) {
  const char* tile = panel + (ahead < steps ? ahead : ahead + steps) * kAmxTileBytes;  // next item: 2 panels on
  for (int64_t line = 0; line < kAmxTileBytes; line += 64) {
    _mm_prefetch(tile + line, _MM_HINT_T0);
    if constexpr (kPanels > 1) _mm_prefetch(tile + panel_bytes + line, _MM_HINT_T0);
  }
}

// Lanes [0, n - col) of 16 (all of them where n - col >= 16).
__mmask16 column_mask(int64_t col, int64_t n) {
  return static_cast<__mmask16>((1u << std::min<int64_t>(16, n - col)) - 1);
}

// bias[col ..] under the mask as float32 (zero without a bias).
__m512 load_bias(const bf16_t* bias, int64_t col, __mmask16 mask) {
  if (bias == nullptr) return _mm512_setzero_ps();
  return bit_cast<__m512>(loadv(bias + col, mask));
}

// A row of 16 outputs rounded to bfloat16, into y as bfloat16 or as the float32 values of those bfloat16.
void store_row(bf16_t* y, __mmask16 mask, __m512 row) { storev(y, bit_cast<fvec>(row), mask); }

void store_row(float* y, __mmask16 mask, __m512 row) {
  _mm512_mask_storeu_ps(y, mask, bit_cast<__m512>(round_to_bf16(bit_cast<fvec>(row))));
}

// A row of 16 float32 sums (+ bias) -> y's 16 columns from col (fewer where n ends), rounded to bfloat16.
template <typename Out>
void store_sums_row(const float* sums, const bf16_t* bias, int64_t col, int64_t n, Out* y) {
  const __mmask16 mask = column_mask(col, n);
  store_row(y + col, mask, _mm512_add_ps(_mm512_loadu_ps(sums), load_bias(bias, col, mask)));
}

// A row of a gated weight's 16 gate sums and the same outputs' 16 up sums -> silu(gate) * up in y's columns from
// col, as pagedllm's other matmul stores its gated panels (bias: [2 n], the gate's then the up's).
template <typename Out>
void store_gated_row(const float* gate, const float* up, const bf16_t* bias, int64_t col, int64_t n, Out* y) {
  const __mmask16 mask = column_mask(col, n);
  const fvec g = bit_cast<fvec>(_mm512_add_ps(_mm512_loadu_ps(gate), load_bias(bias, col, mask)));
  const fvec u = bit_cast<fvec>(
      _mm512_add_ps(_mm512_loadu_ps(up), load_bias(bias == nullptr ? nullptr : bias + n, col, mask)));
  store_row(y + col, mask, bit_cast<__m512>(g / (1.0f + fast_exp(-g)) * u));
}

using Sums = float[4][kAmxTileRows * kAmxPanelCols];

// Where a pass finds an item's weight tiles: tile(j, s) is panel j's tile of step s, in the bfloat16 panels or in the
// thread's buffer. A first pass over the item either requests the panels' tiles ahead (`prefetch`) or, where
// `blocks` is set (the item's first panel in one of amx_blocks.h's forms, the next blocks_panel_bytes on), expands
// them into the buffer two steps ahead of their products, so that the stores are done when the tile loads read them
// back. An item's only pass (batches of up to 32 rows) expands into a ring of kRingSteps steps, which stays in L1;
// the whole item's tiles, kept for a batch's later passes over them, did not (a decode step's tile loads then read
// them from L2, and the expansion's stores waited for their lines).
struct ItemWeights {
  const char* panel;
  int64_t panel_bytes;  // from one panel's tiles to the next's
  bool prefetch = false;
  const uint8_t* blocks = nullptr;
  int64_t tile_bytes = 0, blocks_panel_bytes = 0;
  int64_t step_bytes = kAmxTileBytes, step_mask = -1;  // step s's tiles at (s & step_mask) * step_bytes

  static constexpr int64_t kRingSteps = 4;  // steps s - 1 (read), s, s + 1 and s + 2 (being expanded)

  // The tiles of an item's only pass, expanded from its blocks into a ring in buffer.
  static ItemWeights ring(char* buffer, const uint8_t* blocks, int64_t tile_bytes, int64_t blocks_panel_bytes) {
    return {buffer, kAmxTileBytes, false, blocks, tile_bytes, blocks_panel_bytes, 2 * kAmxTileBytes, kRingSteps - 1};
  }

  const char* tile(int64_t j, int64_t s) const { return panel + (s & step_mask) * step_bytes + j * panel_bytes; }

  template <int kPanels>
  void expand(int64_t s) const {
    for (int64_t j = 0; j < kPanels; ++j)
      expand_tile(blocks + j * blocks_panel_bytes + s * tile_bytes, tile_bytes,
                  reinterpret_cast<bf16_t*>(const_cast<char*>(tile(j, s))));
  }

  // Before step s's products: its tiles in place, and the requests for the tiles to come.
  template <int kPanels>
  void prepare(int64_t s, int64_t steps) const {
    if (blocks != nullptr) {
      if (s == 0) expand<kPanels>(0);
      if (s == 0 && steps > 1) expand<kPanels>(1);
      if (s + 2 < steps) expand<kPanels>(s + 2);
      const int64_t ahead = s + kBlocksAhead;  // past the item's last step: the next item, which follows it
      const uint8_t* tile = blocks + (ahead < steps ? ahead : ahead + steps) * tile_bytes;
      for (int64_t line = 0; line < tile_bytes; line += 64) {
        _mm_prefetch(tile + line, _MM_HINT_T0);
        if constexpr (kPanels > 1) _mm_prefetch(tile + blocks_panel_bytes + line, _MM_HINT_T0);
      }
    } else if (prefetch) {
      prefetch_weights<kPanels>(panel, panel_bytes, steps, s + kPrefetchSteps);
    }
  }
};

// Where a pass reads its (up to two) row tiles of x: row tile i's step s at tiles[i] + s * step_bytes, rows `stride`
// bytes apart. Either x's rows (the tile products' left operand) or, beside weight tiles expanded to rows, x's
// pairs of inputs (make_x_pairs), then the right operand.
struct RowTiles {
  const char* tiles[2];
  int64_t stride, step_bytes;

  const char* at(int i, int64_t s) const { return tiles[i] + s * step_bytes; }
};

// Tile sum += the product of x tile xt and weight tile wt, the weight on the left where its tiles are rows (a macro:
// the tile intrinsics take literal tile numbers).
#define PAGEDLLM_MULTIPLY_PAIR(sum, xt, wt) \
  if constexpr (kWeightRows)                \
    _tile_dpbf16ps(sum, wt, xt);            \
  else                                      \
    _tile_dpbf16ps(sum, xt, wt)

// kRows row tiles of x times kPanels panels of w into sums; during(s) after step s's products are issued (vector work
// that overlaps the tile loads). kWeightRows: w's tiles are its outputs' rows (amx_blocks.h's expands_to_rows) and the
// x tiles pairs of inputs, so that the products make the sums transposed, turned back at the end.
template <int kRows, int kPanels, bool kWeightRows, typename During>
void multiply_tiles(const RowTiles& x, int64_t steps, const ItemWeights& w, Sums& sums, const During& during) {
  _tile_zero(0);
  if constexpr (kPanels > 1) _tile_zero(1);
  if constexpr (kRows > 1) _tile_zero(2);
  if constexpr (kRows > 1 && kPanels > 1) _tile_zero(3);
  for (int64_t s = 0; s < steps; ++s) {
    w.prepare<kPanels>(s, steps);
    _tile_loadd(4, x.at(0, s), x.stride);
    _tile_loadd(6, w.tile(0, s), 64);
    PAGEDLLM_MULTIPLY_PAIR(0, 4, 6);
    if constexpr (kPanels > 1) {
      _tile_loadd(7, w.tile(1, s), 64);
      PAGEDLLM_MULTIPLY_PAIR(1, 4, 7);
    }
    if constexpr (kRows > 1) {
      _tile_loadd(5, x.at(1, s), x.stride);
      PAGEDLLM_MULTIPLY_PAIR(2, 5, 6);
      if constexpr (kPanels > 1) {
        PAGEDLLM_MULTIPLY_PAIR(3, 5, 7);
      }
    }
    during(s);
  }
  _tile_stored(0, sums[0], 64);
  if constexpr (kPanels > 1) _tile_stored(1, sums[1], 64);
  if constexpr (kRows > 1) _tile_stored(2, sums[2], 64);
  if constexpr (kRows > 1 && kPanels > 1) _tile_stored(3, sums[3], 64);
  if constexpr (kWeightRows)
    for (int t = 0; t < 4; ++t)
      if ((kPanels > 1 || t % 2 == 0) && (kRows > 1 || t < 2)) transpose_block(sums[t], 16, sums[t], 16);
}

#undef PAGEDLLM_MULTIPLY_PAIR

template <bool kWeightRows, typename During>
void multiply_item(int64_t row_tiles, int64_t item_panels, const RowTiles& x, int64_t steps, const ItemWeights& w,
                   Sums& sums, const During& during) {
  if (row_tiles == 1 && item_panels == 1)
    multiply_tiles<1, 1, kWeightRows>(x, steps, w, sums, during);
  else if (row_tiles == 1)
    multiply_tiles<1, 2, kWeightRows>(x, steps, w, sums, during);
  else if (item_panels == 1)
    multiply_tiles<2, 1, kWeightRows>(x, steps, w, sums, during);
  else
    multiply_tiles<2, 2, kWeightRows>(x, steps, w, sums, during);
}

// The m rows of x [m, k] (row tile i's first row at row_tile(16 i)) as the right operand of tile products: for
// row tile i and step s, the 1 KB tile at the result + (i * steps + s) KB, whose row r holds the input pair
// (2r, 2r + 1) of the step of each of the 16 rows. A buffer per thread, which each thread makes for itself.
template <typename RowTile>
const char* make_x_pairs(int64_t m, int64_t k, const RowTile& row_tile) {
  thread_local std::vector<char> buffer;
  const int64_t steps = k / kAmxDepth, row_tiles = (m + kAmxTileRows - 1) / kAmxTileRows;
  buffer.resize(row_tiles * steps * kAmxTileBytes + 64);
  char* pairs = reinterpret_cast<char*>((reinterpret_cast<uintptr_t>(buffer.data()) + 63) & ~uintptr_t{63});
  for (int64_t i = 0; i < row_tiles; ++i)
    for (int64_t s = 0; s < steps; ++s)  // 16 rows of 16 pairs (32 bits each) transposed
      transpose_block(reinterpret_cast<const float*>(row_tile(i * kAmxTileRows) + s * kAmxDepth * 2), k / 2,
                      reinterpret_cast<float*>(pairs + (i * steps + s) * kAmxTileBytes), kAmxPanelCols);
  return pairs;
}

// A thread's buffer for the bfloat16 tiles of one item expanded from its block tiles: two panels of `steps` tiles.
char* expansion_buffer(int64_t steps) {
  thread_local std::vector<char> buffer;
  const size_t bytes = 2 * steps * kAmxTileBytes + 64;
  if (buffer.size() < bytes) buffer.resize(bytes);
  return reinterpret_cast<char*>((reinterpret_cast<uintptr_t>(buffer.data()) + 63) & ~uintptr_t{63});
}

// A pass of 32 rows or fewer over one item whose sums wait for their store.
struct Pass {
  int64_t item = -1, row0 = 0, rows = 0;
};

}  // namespace

// Rows [row_begin, row_begin + m) of x times the num_panels panels of a packed weight, item (pair of panels) by
// item, 32 rows at a time: the tiles of sums of each pass go to store(sums, row0, item, worker, first, end) on the
// thread that made them, sums[2 i + j] holding row tile i (rows row0 + 16 i ..) of the item's panel j, for the
// pass's rows [first, end); worker: that thread's index among the call's. A pass's rows are stored a slice per tile
// step of the thread's next pass, so that their vector work (bias, rounding, an activation, an LM head's softmax
// sums) runs while that pass's weight tiles stream in rather than between two streams.
template <typename Store>
void multiply_rows(const bf16_t* x, int64_t row_begin, int64_t m, int64_t k, const bf16_t* panels,
                   BlockTiles blocks, int64_t num_panels, const Store& store) {
  x += row_begin * k;
  const bool weight_rows = blocks.data != nullptr && expands_to_rows(blocks.tile_bytes);
  // tile loads read 16 rows (m of them below 16): a last partial row tile of a larger batch is read from a copy
  // of its rows padded with zero rows (copying all of x into a padded buffer instead cost 10-15 us a call at
  // 33-63 rows); x's pairs for weight rows are made of whole row tiles
  const int64_t whole_rows = m / kAmxTileRows * kAmxTileRows;
  const int64_t direct_rows = m <= kAmxTileRows && !weight_rows ? m : whole_rows;  // read where they lie
  thread_local std::vector<bf16_t> tail;
  if (direct_rows != m) {
    tail.resize(kAmxTileRows * k);
    std::memcpy(tail.data(), x + direct_rows * k, (m - direct_rows) * k * sizeof(bf16_t));
    std::fill(tail.begin() + (m - direct_rows) * k, tail.end(), bf16_t{0});
  }
  const bf16_t* tail_rows = tail.data();
  auto row_tile = [&](int64_t row) {  // the first row of a row tile -> where the tile loads read it
    return reinterpret_cast<const char*>(row < direct_rows ? x + row * k : tail_rows);
  };
  const int64_t num_items = (num_panels + 1) / 2;
  const int64_t steps = k / kAmxDepth, panel_bytes = steps * kAmxTileBytes;
  const char* base = reinterpret_cast<const char*>(panels);
  // one tile shape for the whole call: 16 rows (whole tiles, a partial last one padded), or all of them below 16
  // (sums and x tiles 0-5; the weight tiles 6-7 always have 16 full rows)
  const TileConfig config = tile_config(weight_rows ? kAmxTileRows : static_cast<int>(std::min(m, kAmxTileRows)), 6);
  const int64_t blocks_panel_bytes = steps * blocks.tile_bytes;
  on_runs(num_items, [&](const auto& take, int64_t worker) {
    _tile_loadconfig(&config);  // the tile shapes are per thread
    const char* x_pairs = weight_rows ? make_x_pairs(m, k, row_tile) : nullptr;
    alignas(64) Sums sums[2];  // the pass being multiplied, and the one being stored
    Pass waiting;
    int current = 0;
    char* expanded = blocks.data != nullptr ? expansion_buffer(steps) : nullptr;
    for (int64_t item = take(); item >= 0; item = take()) {
      const int64_t panel0 = 2 * item, item_panels = std::min<int64_t>(2, num_panels - panel0);
      for (int64_t row0 = 0; row0 < m; row0 += kItemRows) {
        ItemWeights w{base + panel0 * panel_bytes, panel_bytes, row0 == 0};
        if (blocks.data != nullptr) {
          const uint8_t* item_blocks = blocks.data + panel0 * blocks_panel_bytes;
          w = m <= kItemRows ? ItemWeights::ring(expanded, item_blocks, blocks.tile_bytes, blocks_panel_bytes)
                             : ItemWeights{expanded, panel_bytes, false, row0 == 0 ? item_blocks : nullptr,
                                           blocks.tile_bytes, blocks_panel_bytes};
        }
        const int64_t rows = std::min(kItemRows, m - row0), row_tiles = (rows + kAmxTileRows - 1) / kAmxTileRows;
        int64_t stored = 0;
        auto store_slice = [&](int64_t s) {  // the waiting pass's rows up to step s's share of them
          const int64_t end = waiting.rows * (s + 1) / steps;
          if (waiting.item < 0 || end <= stored) return;
          store(sums[current ^ 1], row_begin + waiting.row0, waiting.item, worker, stored, end);
          stored = end;
        };
        if (weight_rows) {
          const char* pairs = x_pairs + row0 / kAmxTileRows * panel_bytes;  // a row tile's pairs: a panel's bytes
          const RowTiles x_pass{{pairs, pairs + panel_bytes}, 64, kAmxTileBytes};
          multiply_item<true>(row_tiles, item_panels, x_pass, steps, w, sums[current], store_slice);
        } else {
          const RowTiles x_pass{{row_tile(row0), row_tile(row0 + kAmxTileRows)}, k * 2, kAmxDepth * 2};
          multiply_item<false>(row_tiles, item_panels, x_pass, steps, w, sums[current], store_slice);
        }
        waiting = {item, row0, rows};
        current ^= 1;
      }
    }
    if (waiting.item >= 0) store(sums[current ^ 1], row_begin + waiting.row0, waiting.item, worker, 0, waiting.rows);
    _tile_release();
  });
}

// x [m, k] times a packed weight (multiply_rows) in blocks of rows that stay in the L2 while every item's panels
// pass over them: a thread reads all of a block's rows again for each of its items, so a prompt step's 2048 rows,
// read whole, came from beyond the L2 once per item (1.6-1.7 TFLOP/s on a Xeon's two cores, against 2.7-3.5 in
// blocks of 384 KB: docs/models.md). Decode steps' few rows are one block. `blocks` (the same weight in one of
// amx_blocks.h's forms, or none) are read instead of the panels by batches of up to kBlocksMaxRows rows, whose time
// goes to streaming the weights rather than multiplying them.
template <typename Store>
void amx_multiply(const bf16_t* x, int64_t m, int64_t k, const bf16_t* panels, BlockTiles blocks, int64_t num_panels,
                  const Store& store) {
  const int64_t block = std::max<int64_t>(kItemRows, kRowBlockBytes / (k * 2) / kItemRows * kItemRows);
  if (m > kBlocksMaxRows) blocks = {};
  for (int64_t row0 = 0; row0 < m; row0 += block)
    multiply_rows(x, row0, std::min(block, m - row0), k, panels, blocks, num_panels, store);
}

template <typename Out>
void amx_linear_into(const bf16_t* x, int64_t m, int64_t k, const bf16_t* panels, BlockTiles blocks,
                     const bf16_t* bias, int64_t n, bool gated, Out* y) {
  const int64_t num_panels = amx_panels(gated ? 2 * n : n, gated);
  amx_multiply(x, m, k, panels, blocks, num_panels, [&](const Sums& sums, int64_t row0, int64_t item, int64_t,
                                                        int64_t first, int64_t end) {
    const int64_t panel0 = 2 * item, item_panels = std::min<int64_t>(2, num_panels - panel0);
    for (int64_t r = first; r < end; ++r) {
      const int64_t at = r / kAmxTileRows * 2, offset = r % kAmxTileRows * kAmxPanelCols;  // sums of row tile r / 16
      Out* y_row = y + (row0 + r) * n;
      if (gated) {  // the item is one gate panel and its up panel
        store_gated_row(sums[at] + offset, sums[at + 1] + offset, bias, item * kAmxPanelCols, n, y_row);
        continue;
      }
      for (int64_t j = 0; j < item_panels; ++j)
        store_sums_row(sums[at + j] + offset, bias, (panel0 + j) * kAmxPanelCols, n, y_row);
    }
  });
}

// One row's logits seen so far by one thread, lane by lane (lane i: the columns 16 c + i): the largest (rounded to
// bfloat16, as the matmul stores them), the column where it first was, and the sum of e^(logit - that largest).
struct LaneBest {
  fvec max = splat(kNegInf), sum{};
  ivec at{};

  // The 16 logits from column col (those from n on are past the vocabulary). A logit above the lane's max makes
  // it the new max, its sum rescaled by e^(old - new) plus 1; any other adds e^(logit - max): one exponential.
  void add(const float* sums, const bf16_t* bias, int64_t col, int64_t n) {
    const __mmask16 live = column_mask(col, n);
    const __m512 sum_row = _mm512_add_ps(_mm512_loadu_ps(sums), load_bias(bias, col, live));
    const fvec logit = round_to_bf16(bit_cast<fvec>(sum_row));
    const ivec in_vocab = bit_cast<ivec>(_mm512_movm_epi32(live));
    const ivec higher = (logit > max) & in_vocab;
    const fvec distance = logit > max ? logit - max : max - logit;  // max = -inf: +inf, e^-inf = 0
    const fvec e = fast_exp(-distance);
    sum = higher ? sum * e + 1.0f : (in_vocab != 0 ? sum + e : sum);
    max = higher ? logit : max;
    at = higher ? __builtin_convertvector(kIota, ivec) + static_cast<int32_t>(col) : at;
  }
};

// Row r's pick over every worker's lanes: the largest logit (its first column on a tie) and its log-probability,
// largest - (largest + log sum_lanes sum e^(lane max - largest)); NaN where a logit was not finite.
void pick(const LaneBest* workers, int64_t num_workers, int64_t m, int64_t r, int64_t* argmax, float* logprob) {
  float top = kNegInf;
  for (int64_t w = 0; w < num_workers; ++w) top = std::max(top, reduce_max(workers[w * m + r].max));
  float total = 0.0f;
  int64_t at = std::numeric_limits<int64_t>::max();
  for (int64_t w = 0; w < num_workers; ++w) {
    const LaneBest& lanes = workers[w * m + r];
    total += reduce_add(lanes.sum * fast_exp(lanes.max - top));
    for (int64_t i = 0; i < kLanes; ++i)
      if (lanes.max[i] == top) at = std::min<int64_t>(at, lanes.at[i]);
  }
  const bool finite = std::isfinite(top) && std::isfinite(total);
  argmax[r] = finite ? at : 0;
  logprob[r] = finite ? top - (top + std::log(total)) : std::numeric_limits<float>::quiet_NaN();
}

void amx_greedy_into(const bf16_t* x, int64_t m, int64_t k, const bf16_t* panels, BlockTiles blocks,
                     const bf16_t* bias, int64_t n, int64_t* argmax, float* logprob) {
  const int64_t num_panels = amx_panels(n, false), num_workers = workers_for((num_panels + 1) / 2);  // as amx_multiply
  std::vector<LaneBest> workers(num_workers * m);  // per worker, per row
  amx_multiply(x, m, k, panels, blocks, num_panels, [&](const Sums& sums, int64_t row0, int64_t item, int64_t worker,
                                                int64_t first, int64_t end) {
    LaneBest* mine = workers.data() + worker * m + row0;
    for (int64_t j = 0; j < 2 && 2 * item + j < num_panels; ++j)
      for (int64_t r = first; r < end; ++r)
        mine[r].add(sums[2 * (r / kAmxTileRows) + j] + r % kAmxTileRows * kAmxPanelCols, bias,
                    (2 * item + j) * kAmxPanelCols, n);
  });
  for (int64_t r = 0; r < m; ++r) pick(workers.data(), num_workers, m, r, argmax, logprob);
}

#else

template <typename Out>
void amx_linear_into(const bf16_t*, int64_t, int64_t, const bf16_t*, BlockTiles, const bf16_t*, int64_t, bool, Out*) {}
void amx_greedy_into(const bf16_t*, int64_t, int64_t, const bf16_t*, BlockTiles, const bf16_t*, int64_t, int64_t*,
                     float*) {}

#endif

void amx_linear(const bf16_t* x, int64_t m, int64_t k, const bf16_t* panels, BlockTiles blocks, const bf16_t* bias,
                int64_t n, bool gated, bf16_t* y) {
  amx_linear_into(x, m, k, panels, blocks, bias, n, gated, y);
}

void amx_linear(const bf16_t* x, int64_t m, int64_t k, const bf16_t* panels, BlockTiles blocks, const bf16_t* bias,
                int64_t n, bool gated, float* y) {
  amx_linear_into(x, m, k, panels, blocks, bias, n, gated, y);
}

void amx_greedy_head(const bf16_t* x, int64_t m, int64_t k, const bf16_t* panels, BlockTiles blocks,
                     const bf16_t* bias, int64_t n, int64_t* argmax, float* logprob) {
  amx_greedy_into(x, m, k, panels, blocks, bias, n, argmax, logprob);
}

}  // namespace pagedllm
