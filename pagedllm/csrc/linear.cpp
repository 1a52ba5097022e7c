// The projections' matmul: y = x W^T + bias over W packed into panels of kPanelCols output columns.
//
// Threads take work items, two panels (at the end of a float32 matmul, one) for up to 128 rows, from a shared
// counter, in one parallel region for all of a prefill's rows (with a static split, the thread that finished
// first waited at the end of each matmul whenever the other core had been slowed; with whole panels for all of a
// prefill's rows, it still waited up to one such item). For every panel, a few rows of x at a time are multiplied
// into a register tile: with AVX-512, 8 rows x 48 columns in 24 registers; with AVX2, 6 rows x 16 columns in 12
// of its 16. Per panel row, the panel's vectors are loaded once and each x value (bfloat16: pair of values) is
// broadcast into one FMA per vector (bfloat16: pair dot products). A decode step streams all of the weights from
// memory for a few dozen rows, so while a thread works on one panel it prefetches the next one it will take
// (claimed as it starts the last panel of its item), its lines shared out over the panel's row tiles (a prefill's
// first tile requests them all): the memory reads overlap the arithmetic. oneDNN's prepacked matmul does not, and
// at 1-64 rows this runs 1.2-1.9x faster than it, at about the same speed from 1024 rows up (docs/models.md). A
// gated weight (an MLP's [gate; up]) is packed with half a panel of gate columns and the matching up columns in
// each panel, and its tiles are stored as silu(gate) * up.
#include "linear.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <stdexcept>
#include <type_traits>
#include <utility>
#include <vector>

#include "parallel.h"

#if defined(__AVX2__) || defined(__AVX512F__)
#include <immintrin.h>
#endif

namespace pagedllm {

namespace {

// The row of a weight of `rows` rows that feeds column j of panel p; -1 where the panel is zero-padded.
int64_t source_row(int64_t p, int64_t j, int64_t rows, bool gated) {
  if (!gated) {
    const int64_t row = p * kPanelCols + j;
    return row < rows ? row : -1;
  }
  const int64_t n = rows / 2, output = p * kGatedPanelOutputs + j % kGatedPanelOutputs;
  return output < n ? output + (j < kGatedPanelOutputs ? 0 : n) : -1;  // gate rows, then up rows
}

}  // namespace

template <typename T>
void pack_linear_weight(const T* w, int64_t rows, int64_t k, bool gated, T* panels) {
  constexpr int64_t per_column = std::is_same_v<T, float> ? 1 : 2;
  const int64_t height = panel_rows<T>(k);
  parallel_chunks(num_panels(gated ? rows / 2 : rows, gated), 1, [&](int64_t begin, int64_t end) {
    for (int64_t p = begin; p < end; ++p)
      for (int64_t j = 0; j < kPanelCols; ++j) {
        const int64_t row = source_row(p, j, rows, gated);
        for (int64_t i = 0; i < height; ++i)
          for (int64_t e = 0; e < per_column; ++e) {
            const int64_t input = i * per_column + e;
            panels[((p * height + i) * kPanelCols + j) * per_column + e] = row >= 0 && input < k ? w[row * k + input] : T{};
          }
      }
  });
}

template void pack_linear_weight<float>(const float*, int64_t, int64_t, bool, float*);
template void pack_linear_weight<bf16_t>(const bf16_t*, int64_t, int64_t, bool, bf16_t*);

#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__))

namespace {

constexpr int64_t kRowChunk = 512;   // rows per pass over the weights (more: x no longer stays in cache)
// A thread's work item: a claim of panels for a block of at most kRowBlock of a pass's rows. Claims are pairs of
// panels, so that with 96-byte panel rows (bfloat16, or float32 gated outputs) no two threads write one cache
// line of y; where a panel's part of a y row fills whole cache lines (float32, not gated), the last kTailSingles
// claims per thread are single panels, so that the threads finish a matmul closer together. Blocks of rows, so
// that a prefill's items are small enough for threads slowed by other work to even out.
constexpr int64_t kRowBlock = 128;
constexpr int64_t kTailSingles = 2;

struct Claims {
  int64_t count, pairs;  // panels; claims [0, pairs) take two panels each, the others one
  int64_t size() const { return pairs + (count - 2 * pairs); }
  int64_t begin(int64_t c) const { return c < pairs ? 2 * c : pairs + c; }
  int64_t end(int64_t c) const { return c < pairs ? 2 * c + 2 : pairs + c + 1; }
};

// The claims of `count` panels whose part of a y row is `row_bytes` long.
Claims make_claims(int64_t count, int64_t row_bytes) {
  if (row_bytes < 128) return {count, count / 2};
  const int64_t tail = std::min<int64_t>(count, kTailSingles * at::get_num_threads());
  return {count, (count - tail) / 2};
}

constexpr int64_t kPanelRowBytes = kPanelCols * 4;  // float32 or bfloat16 pairs alike
// Up to this many row tiles per panel (64 rows with AVX-512) share the next panel's prefetch, a line or so per
// step of each: all in the first tile, the reads came in a burst and the other tiles ran with the memory idle
// (37 rows: +10% on a Xeon). With more tiles (a prefill's items) sharing it measured slower (512 rows -4%).
constexpr int64_t kSpreadTiles = 8;

// The register type of one panel vector (kLanes floats) and the few operations the tiles use on it.
#if defined(__AVX512F__)
using Reg = __m512;
using Mask = __mmask16;
constexpr int kTileRows = 8;  // rows of x per register tile: 8 x 3 accumulators of the 32 registers

inline Reg reg_zero() { return _mm512_setzero_ps(); }
inline Reg reg_load(const float* p) { return _mm512_loadu_ps(p); }
inline Reg reg_broadcast(const float* p) { return _mm512_set1_ps(*p); }
inline Reg reg_fma(Reg a, Reg b, Reg c) { return _mm512_fmadd_ps(a, b, c); }
inline Reg reg_load_masked(Mask mask, const float* p) { return _mm512_maskz_loadu_ps(mask, p); }
inline void reg_store(float* p, Reg v) { _mm512_storeu_ps(p, v); }
inline void reg_store_masked(float* p, Mask mask, Reg v) { _mm512_mask_storeu_ps(p, mask, v); }

// Lanes of vector c (columns 16c .. 16c + 15) that fall inside the panel's `cols` real columns.
Mask column_mask(int64_t cols, int c) {
  const int64_t lanes = std::clamp<int64_t>(cols - kLanes * c, 0, kLanes);
  return static_cast<Mask>((1u << lanes) - 1u);
}

// A gated panel's row of accumulators holds gate 0-15 | gate 16-23, up 0-7 | up 8-23: gate[v] and up[v]
// are the matching vectors of outputs 0-15 and 16-23 (lanes 0-7).
constexpr int kGatedVecs = 2;
inline void split_gated(const Reg (&acc)[kPanelVecs], Reg (&gate)[kGatedVecs], Reg (&up)[kGatedVecs]) {
  const __m512i up_first = _mm512_setr_epi32(8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23);
  gate[0] = acc[0];
  gate[1] = acc[1];
  up[0] = _mm512_permutex2var_ps(acc[1], up_first, acc[2]);
  up[1] = _mm512_shuffle_f32x4(acc[2], acc[2], _MM_SHUFFLE(3, 2, 3, 2));
}
#else
using Reg = __m256;
using Mask = __m256i;
constexpr int kTileRows = 6;  // rows of x per register tile: 6 x 2 accumulators of the 16 registers

inline Reg reg_zero() { return _mm256_setzero_ps(); }
inline Reg reg_load(const float* p) { return _mm256_loadu_ps(p); }
inline Reg reg_broadcast(const float* p) { return _mm256_broadcast_ss(p); }
inline Reg reg_fma(Reg a, Reg b, Reg c) { return _mm256_fmadd_ps(a, b, c); }
inline Reg reg_load_masked(Mask mask, const float* p) { return _mm256_maskload_ps(p, mask); }
inline void reg_store(float* p, Reg v) { _mm256_storeu_ps(p, v); }
inline void reg_store_masked(float* p, Mask mask, Reg v) { _mm256_maskstore_ps(p, mask, v); }

// Lanes of vector c (columns 8c .. 8c + 7) that fall inside the panel's `cols` real columns.
Mask column_mask(int64_t cols, int c) {
  const int lanes = static_cast<int>(std::clamp<int64_t>(cols - kLanes * c, 0, kLanes));
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(lanes), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

// A gated panel's row of accumulators holds gate 0-7 | up 0-7.
constexpr int kGatedVecs = 1;
inline void split_gated(const Reg (&acc)[kPanelVecs], Reg (&gate)[kGatedVecs], Reg (&up)[kGatedVecs]) {
  gate[0] = acc[0];
  up[0] = acc[1];
}
#endif

// A tile's share of the next panel: `lines` cache lines from `begin`, requested into L2 `per_step` at a time,
// one request per step of its multiply until they are done.
struct Share {
  const char* begin = nullptr;
  int64_t lines = 0;
  int64_t per_step = 1;
};

inline void prefetch_share(const Share& share, int64_t i) {
  if (i * share.per_step >= share.lines) return;
  for (int64_t l = 0; l < share.per_step; ++l) _mm_prefetch(share.begin + (i * share.per_step + l) * 64, _MM_HINT_T1);
}

// Tile t's share of the next panel (null: none) when `tiles` tiles over k inputs multiply the current one.
template <typename T>
Share share_of_next(const T* next, int64_t k, int64_t tiles, int64_t t) {
  const int64_t steps = panel_rows<T>(k), total = steps * kPanelRowBytes / 64;
  const int64_t sharing = tiles <= kSpreadTiles ? tiles : 1;
  const int64_t per_tile = (total + sharing - 1) / sharing;
  if (next == nullptr || t >= sharing) return {};
  return {reinterpret_cast<const char*>(next) + t * per_tile * 64, std::min(per_tile, total - t * per_tile),
          (per_tile + steps - 1) / steps};
}

// float32: acc[r] += x[r, i] * panel row i, over the k panel rows.
struct F32 {
  using T = float;
  using X = float;  // x's type as multiply reads it
  static Reg load_bias(const float* bias, Mask mask) { return reg_load_masked(mask, bias); }
  static void store(float* y, Reg v) { reg_store(y, v); }
  static void store(float* y, Mask mask, Reg v) { reg_store_masked(y, mask, v); }

  // With kPrefetch this tile's share of the next panel is requested too (two loops rather than a test per
  // step: the loop needs every register).
  template <int kRows, bool kPrefetch>
  static void multiply(const float* x, int64_t k, const float* panel, const Share& next,
                       Reg (&acc)[kRows][kPanelVecs]) {
    for (int64_t i = 0; i < k; ++i) {
      const float* w = panel + i * kPanelCols;
      if (kPrefetch) prefetch_share(next, i);
      Reg row[kPanelVecs];
      for (int c = 0; c < kPanelVecs; ++c) row[c] = reg_load(w + kLanes * c);
      for (int r = 0; r < kRows; ++r) {
        const Reg a = reg_broadcast(x + r * k + i);
        for (int c = 0; c < kPanelVecs; ++c) acc[r][c] = reg_fma(a, row[c], acc[r][c]);
      }
    }
  }
};

#if defined(__AVX512F__) && defined(__AVX512BF16__) && defined(__AVX512BW__) && defined(__AVX512VL__)
// bfloat16: acc[r] += x[r, 2i] * w[2i] + x[r, 2i + 1] * w[2i + 1] per column, over the k / 2 panel rows.
struct BF16 {
  using T = bf16_t;
  using X = bf16_t;
  static __m512 load_bias(const bf16_t* bias, __mmask16 mask) { return bit_cast<__m512>(loadv(bias, mask)); }
  static void store(bf16_t* y, __m512 v) { storev(y, bit_cast<fvec>(v)); }  // rounded to nearest even
  static void store(bf16_t* y, __mmask16 mask, __m512 v) { storev(y, bit_cast<fvec>(v), mask); }

  template <int kRows, bool kPrefetch>
  static void multiply(const bf16_t* x, int64_t k, const bf16_t* panel, const Share& next,
                       __m512 (&acc)[kRows][kPanelVecs]) {
    for (int64_t i = 0; i < k / 2; ++i) {
      const bf16_t* w = panel + i * 2 * kPanelCols;
      if (kPrefetch) prefetch_share(next, i);
      const __m512bh w0 = reinterpret_cast<__m512bh>(_mm512_loadu_si512(w));
      const __m512bh w1 = reinterpret_cast<__m512bh>(_mm512_loadu_si512(w + 32));
      const __m512bh w2 = reinterpret_cast<__m512bh>(_mm512_loadu_si512(w + 64));
      for (int r = 0; r < kRows; ++r) {
        int32_t pair;
        std::memcpy(&pair, x + r * k + 2 * i, sizeof pair);
        const __m512bh a = reinterpret_cast<__m512bh>(_mm512_set1_epi32(pair));
        acc[r][0] = _mm512_dpbf16_ps(acc[r][0], a, w0);
        acc[r][1] = _mm512_dpbf16_ps(acc[r][1], a, w1);
        acc[r][2] = _mm512_dpbf16_ps(acc[r][2], a, w2);
      }
    }
  }
};

// bfloat16 weights widened to float32 in registers (a bfloat16 is the upper half of a float32: the even input
// of each pair is its 32-bit lane shifted left, the odd one the lane with the lower half cleared), then float32
// FMAs with x widened once per row chunk. Some cores issue vdpbf16ps at half their FMA rate; on them this runs
// faster than BF16 while still reading half the bytes of float32 weights.
struct BF16Widened : BF16 {
  using X = float;

  template <int kRows, bool kPrefetch>
  static void multiply(const float* x, int64_t k, const bf16_t* panel, const Share& next,
                       __m512 (&acc)[kRows][kPanelVecs]) {
    const __m512i upper = _mm512_set1_epi32(static_cast<int>(0xFFFF0000u));
    for (int64_t i = 0; i < k / 2; ++i) {
      const bf16_t* w = panel + i * 2 * kPanelCols;
      if (kPrefetch) prefetch_share(next, i);
      __m512 even[kPanelVecs], odd[kPanelVecs];
      for (int c = 0; c < kPanelVecs; ++c) {
        const __m512i pairs = _mm512_loadu_si512(w + 2 * kLanes * c);
        even[c] = _mm512_castsi512_ps(_mm512_slli_epi32(pairs, 16));
        odd[c] = _mm512_castsi512_ps(_mm512_and_si512(pairs, upper));
      }
      for (int r = 0; r < kRows; ++r) {
        const __m512 a = _mm512_set1_ps(x[r * k + 2 * i]), b = _mm512_set1_ps(x[r * k + 2 * i + 1]);
        for (int c = 0; c < kPanelVecs; ++c) acc[r][c] = _mm512_fmadd_ps(b, odd[c], _mm512_fmadd_ps(a, even[c], acc[r][c]));
      }
    }
  }
};
#endif

// The accumulators' start for panel p: its bias columns, in the panel's column order, or zero.
template <typename Op>
void panel_start(const typename Op::T* bias, int64_t p, int64_t n, bool gated, int64_t cols,
                 Reg (&start)[kPanelVecs]) {
  if (bias == nullptr) {
    for (int c = 0; c < kPanelVecs; ++c) start[c] = reg_zero();
  } else if (!gated) {
    for (int c = 0; c < kPanelVecs; ++c)
      start[c] = Op::load_bias(bias + p * kPanelCols + kLanes * c, column_mask(cols, c));
  } else {
    alignas(64) float values[kPanelCols];
    for (int64_t j = 0; j < kPanelCols; ++j) {
      const int64_t row = source_row(p, j, 2 * n, true);
      values[j] = row >= 0 ? to_float(bias[row]) : 0.0f;
    }
    for (int c = 0; c < kPanelVecs; ++c) start[c] = reg_load(values + kLanes * c);
  }
}

Reg silu(Reg x) {
  const fvec v = bit_cast<fvec>(x);
  return bit_cast<Reg>(v / (1.0f + fast_exp(-v)));
}

// Vector c of a tile row: a plain store where all of its lanes are real columns, a masked one where some are
// not (a last, partial panel; with AVX-512 the second vector of a gated panel's 24 outputs, whose upper half
// is the next panel's). (AVX2's masked store is microcoded on AMD's cores: as the only kind of store it held
// about 8% of a prefill matmul's samples.)
template <typename Op>
__attribute__((always_inline)) inline void store_vector(typename Op::T* y, int64_t cols, int c, Reg v) {
  if (kLanes * (c + 1) <= cols)
    Op::store(y + kLanes * c, v);
  else
    Op::store(y + kLanes * c, column_mask(cols, c), v);
}

// A row of a tile's accumulators -> y[0 .. cols): as they are, or for a gated panel silu(gate) * up.
// (Inlined: a reference into the tile that stays a call keeps the accumulators in memory.)
template <typename Op>
__attribute__((always_inline)) inline void store_row(typename Op::T* y, int64_t cols, bool gated,
                                                     const Reg (&acc)[kPanelVecs]) {
  if (!gated) {
#pragma GCC unroll 3
    for (int c = 0; c < kPanelVecs; ++c) store_vector<Op>(y, cols, c, acc[c]);
    return;
  }
  Reg gate[kGatedVecs], up[kGatedVecs];
  split_gated(acc, gate, up);
#pragma GCC unroll 2
  for (int c = 0; c < kGatedVecs; ++c) store_vector<Op>(y, cols, c, silu(gate[c]) * up[c]);
}

// y[r, 0 .. cols) for kRows rows (x rows k apart, y rows ldy apart): x[r] . panel + start, or for a gated
// panel silu(gate) * up of that. `next`: this tile's share of the panel this thread reads after this one.
template <typename Op, int kRows>
void tile(const typename Op::X* x, int64_t k, const typename Op::T* panel, const Share& next,
          const Reg (&start)[kPanelVecs], bool gated, int64_t cols, typename Op::T* y, int64_t ldy) {
  Reg acc[kRows][kPanelVecs];
  // unrolled: as loops, GCC turns a zero start into a call to memset (~1% of a decode step)
#pragma GCC unroll 3
  for (int c = 0; c < kPanelVecs; ++c)
#pragma GCC unroll 8
    for (int r = 0; r < kRows; ++r) acc[r][c] = start[c];
  if (next.lines > 0)
    Op::template multiply<kRows, true>(x, k, panel, next, acc);
  else
    Op::template multiply<kRows, false>(x, k, panel, next, acc);
#pragma GCC unroll 8
  for (int r = 0; r < kRows; ++r) store_row<Op>(y + r * ldy, cols, gated, acc[r]);
}

template <typename Op, typename T = typename Op::T>
using TileFn = void (*)(const typename Op::X*, int64_t, const T*, const Share&, const Reg (&)[kPanelVecs], bool,
                        int64_t, T*, int64_t);

// fns[r] = tile<Op, r> for r = 1 .. kTileRows.
template <typename Op, typename Rows = std::make_integer_sequence<int, kTileRows + 1>>
struct TileTable;
template <typename Op, int... kRows>
struct TileTable<Op, std::integer_sequence<int, 0, kRows...>> {
  static constexpr TileFn<Op> fns[kTileRows + 1] = {nullptr, tile<Op, kRows>...};
};

// One block of a pass's rows under one claim: a thread's work item.
struct Item {
  int64_t claim, first_row, rows;
};

// The items of y's rows in passes of kRowChunk, each pass cut into blocks of at most kRowBlock rows, numbered
// pass by pass and, within a pass, claim by claim (a thread's next item is mostly the same panels' next rows,
// still cached). All passes share one parallel region: a thread that finishes its share of one pass goes on
// to the next instead of waiting for the other threads at its end.
class Items {
 public:
  Items(int64_t m, int64_t claims) : claims_(claims) {
    for (int64_t m0 = 0, item = 0; m0 < m; m0 += kRowChunk) {
      const int64_t rows = std::min(kRowChunk, m - m0);
      passes_.push_back({m0, rows, (rows + kRowBlock - 1) / kRowBlock, item});
      item += claims * passes_.back().blocks;
    }
  }

  int64_t size() const { return passes_.empty() ? 0 : passes_.back().first_item + claims_ * passes_.back().blocks; }

  Item operator[](int64_t i) const {
    auto pass = passes_.rbegin();
    while (pass->first_item > i) ++pass;
    const int64_t local = i - pass->first_item, block = local % pass->blocks;
    const int64_t first = pass->first_row + block * pass->rows / pass->blocks;
    return {local / pass->blocks, first, pass->first_row + (block + 1) * pass->rows / pass->blocks - first};
  }

 private:
  struct Pass {
    int64_t first_row, rows, blocks, first_item;
  };
  int64_t claims_;
  std::vector<Pass> passes_;
};

template <typename Op>
void run(const typename Op::X* x, int64_t m, int64_t k, const typename Op::T* panels, const typename Op::T* bias,
         int64_t n, bool gated, typename Op::T* y) {
  using T = typename Op::T;
  constexpr const auto& tiles = TileTable<Op>::fns;
  const int64_t panel_size = panel_rows<T>(k) * kPanelRowBytes / static_cast<int64_t>(sizeof(T));
  const int64_t outputs = panel_outputs(gated);
  const Claims claims = make_claims(num_panels(n, gated), outputs * static_cast<int64_t>(sizeof(T)));
  const Items items(m, claims.size());
  parallel_dynamic_ahead(items.size(), [&](int64_t i, int64_t next_i) {
    const Item item = items[i];
    const int64_t claim_after = next_i < 0 ? -1 : items[next_i].claim;
    const int64_t next_claim = claim_after == item.claim ? -1 : claim_after;
    const int64_t end = claims.end(item.claim);
    for (int64_t p = claims.begin(item.claim); p < end; ++p) {
      const int64_t after = p + 1 < end ? p + 1 : (next_claim >= 0 ? claims.begin(next_claim) : -1);
      const T* panel = panels + p * panel_size;
      const T* next = after >= 0 ? panels + after * panel_size : nullptr;
      const int64_t cols = std::min(outputs, n - p * outputs);
      Reg start[kPanelVecs];
      panel_start<Op>(bias, p, n, gated, cols, start);
      // as few tiles as kTileRows allows, of sizes that differ by one at most: a small last tile would read
      // the panel for few rows
      const int64_t count_tiles = (item.rows + kTileRows - 1) / kTileRows;
      for (int64_t t = 0, r = item.first_row; t < count_tiles; ++t) {
        const int64_t size = item.rows / count_tiles + (t < item.rows % count_tiles ? 1 : 0);
        tiles[size](x + r * k, k, panel, share_of_next(next, k, count_tiles, t), start, gated, cols,
                    y + r * n + p * outputs, n);
        r += size;
      }
    }
  });
}

}  // namespace

template <>
bool has_linear_kernel<float>() { return true; }

template <>
void linear<float>(const float* x, int64_t m, int64_t k, const float* panels, const float* bias, int64_t n, bool gated,
                   float* y) {
  run<F32>(x, m, k, panels, bias, n, gated, y);
}

#else  // neither AVX-512 nor AVX2 with FMA

template <>
bool has_linear_kernel<float>() { return false; }

template <>
void linear<float>(const float*, int64_t, int64_t, const float*, const float*, int64_t, bool, float*) {
  throw std::runtime_error("the float32 linear kernel needs AVX-512 or AVX2 with FMA; this build has neither");
}

#endif

#if defined(__AVX512F__) && defined(__AVX512BF16__) && defined(__AVX512BW__) && defined(__AVX512VL__)

namespace {

std::atomic<Bf16Path> requested_bf16_path{Bf16Path::kAuto}, measured_bf16_path{Bf16Path::kAuto};

// Seconds for `reps` register tiles of 8 rows over one panel of k inputs held in the caches: the arithmetic's
// rate alone.
template <typename Op>
double time_tiles(const typename Op::X* x, int64_t k, const bf16_t* panel, bf16_t* y, int reps) {
  const Reg start[kPanelVecs] = {};
  const auto begin = std::chrono::steady_clock::now();
  for (int i = 0; i < reps; ++i) tile<Op, kTileRows>(x, k, panel, Share{}, start, false, kPanelCols, y, kPanelCols);
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - begin).count();
}

// The faster of the two bfloat16 paths on this core, by timing both on the same small cached problem (a few ms,
// best of five alternating rounds).
Bf16Path measure_bf16_path() {
  constexpr int64_t k = 512;
  constexpr int reps = 200;
  const std::vector<bf16_t> x(kTileRows * k, bf16_t{0x3f80}), panel(k * kPanelCols, bf16_t{0x3f80});
  const std::vector<float> x_wide(kTileRows * k, 1.0f);
  std::vector<bf16_t> y(kTileRows * kPanelCols);
  double dot = 1e30, widened = 1e30;
  for (int round = 0; round < 5; ++round) {
    dot = std::min(dot, time_tiles<BF16>(x.data(), k, panel.data(), y.data(), reps));
    widened = std::min(widened, time_tiles<BF16Widened>(x_wide.data(), k, panel.data(), y.data(), reps));
  }
  return widened < dot ? Bf16Path::kWiden : Bf16Path::kDot;
}

// x's rows [0, rows) widened to float32 into `out` (a bfloat16 is the upper half of a float32).
void widen_rows(const bf16_t* x, int64_t rows, int64_t k, float* out) {
  parallel_chunks(rows, 16, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin * k; i < end * k; ++i) out[i] = to_float(x[i]);
  });
}

}  // namespace

void set_bf16_path(Bf16Path path) { requested_bf16_path = path; }

Bf16Path bf16_path() {
  if (requested_bf16_path != Bf16Path::kAuto) return requested_bf16_path;
  if (measured_bf16_path == Bf16Path::kAuto) measured_bf16_path = measure_bf16_path();
  return measured_bf16_path;
}

template <>
bool has_linear_kernel<bf16_t>() { return true; }

template <>
void linear<bf16_t>(const bf16_t* x, int64_t m, int64_t k, const bf16_t* panels, const bf16_t* bias, int64_t n,
                    bool gated, bf16_t* y) {
  if (bf16_path() == Bf16Path::kDot) return run<BF16>(x, m, k, panels, bias, n, gated, y);
  thread_local std::vector<float> wide;  // one row chunk of x in float32
  for (int64_t m0 = 0; m0 < m; m0 += kRowChunk) {
    const int64_t rows = std::min(kRowChunk, m - m0);
    if (static_cast<int64_t>(wide.size()) < rows * k) wide.resize(rows * k);
    widen_rows(x + m0 * k, rows, k, wide.data());
    run<BF16Widened>(wide.data(), rows, k, panels, bias, n, gated, y + m0 * n);
  }
}

#else  // no AVX512-BF16

void set_bf16_path(Bf16Path) {}

Bf16Path bf16_path() { return Bf16Path::kWiden; }

template <>
bool has_linear_kernel<bf16_t>() { return false; }

template <>
void linear<bf16_t>(const bf16_t*, int64_t, int64_t, const bf16_t*, const bf16_t*, int64_t, bool, bf16_t*) {
  throw std::runtime_error("the bfloat16 linear kernel needs AVX512-BF16; this build has none");
}

#endif

}  // namespace pagedllm
