#include "amx_blocks.h"

#include <cstring>

#include "amx_linear.h"
#include "amx_tiles.h"

namespace pagedllm {

namespace {

// tile(rows, s, out) for each tile of a weight of n rows and k inputs, in the panels' order, `out` advancing by
// tile_bytes: rows, the weight rows of the panel's 16 outputs (-1: a zero column past the weight's rows).
template <typename Tile>
void for_each_tile(int64_t n, int64_t k, bool gated, int64_t tile_bytes, uint8_t* out, const Tile& tile) {
  int64_t rows[kAmxPanelCols];
  for (int64_t p = 0; p < amx_panels(n, gated); ++p) {
    for (int64_t j = 0; j < kAmxPanelCols; ++j) rows[j] = amx_panel_row(p, j, n, gated);
    for (int64_t s = 0; s < k / kAmxDepth; ++s, out += tile_bytes) tile(rows, s, out);
  }
}

// The 16 outputs' float16 values of block s (0 for a zero column).
void pack_scales(const uint16_t* values, const int64_t* rows, int64_t steps, int64_t s, uint8_t* out) {
  auto* halves = reinterpret_cast<uint16_t*>(out);
  for (int64_t j = 0; j < kAmxPanelCols; ++j) halves[j] = rows[j] < 0 ? 0 : values[rows[j] * steps + s];
}

// The code of weight row `row` at input i (0 for a zero column).
template <typename Code>
Code code(const Code* codes, int64_t row, int64_t k, int64_t i) {
  return row < 0 ? Code{0} : codes[row * k + i];
}

}  // namespace

void pack_amx_q4(const uint16_t* scale, const uint16_t* low, const uint8_t* codes, int64_t n, int64_t k, bool gated,
                 uint8_t* out) {
  const int64_t steps = k / kAmxDepth;
  for_each_tile(n, k, gated, kQ4TileBytes, out, [&](const int64_t* rows, int64_t s, uint8_t* tile) {
    pack_scales(scale, rows, steps, s, tile);
    pack_scales(low, rows, steps, s, tile + kScalesBytes);
    uint8_t* bytes = tile + 2 * kScalesBytes;
    for (int64_t j = 0; j < kAmxPanelCols; ++j)
      for (int64_t i = s * kAmxDepth; i < s * kAmxDepth + kAmxDepth / 2; ++i)
        *bytes++ = (code(codes, rows[j], k, i) & 15) | (code(codes, rows[j], k, i + kAmxDepth / 2) & 15) << 4;
  });
}

void pack_amx_q8(const uint16_t* scale, const int8_t* codes, int64_t n, int64_t k, bool gated, uint8_t* out) {
  const int64_t steps = k / kAmxDepth;
  for_each_tile(n, k, gated, kQ8TileBytes, out, [&](const int64_t* rows, int64_t s, uint8_t* tile) {
    pack_scales(scale, rows, steps, s, tile);
    auto* bytes = reinterpret_cast<int8_t*>(tile + kScalesBytes);
    for (int64_t r = 0; r < kAmxTileRows; ++r, bytes += 32)
      for (int64_t t = 0; t < kAmxPanelCols; ++t) {
        const int64_t i = s * kAmxDepth + 2 * r + t % 2;
        bytes[t] = code(codes, rows[t / 2], k, i);
        bytes[16 + t] = code(codes, rows[8 + t / 2], k, i);
      }
  });
}

#if defined(__AVX512BF16__)

namespace {

// A panel's tile (row r: the input pair 2r, 2r + 1 of each of 16 outputs) -> its outputs' rows of 32 inputs.
void panel_tile_rows(const bf16_t* panel_tile, bf16_t* rows) {
  for (int64_t r = 0; r < kAmxDepth / 2; ++r)
    for (int64_t j = 0; j < kAmxPanelCols; ++j)
      for (int64_t t = 0; t < 2; ++t) rows[j * kAmxDepth + 2 * r + t] = panel_tile[r * 2 * kAmxPanelCols + 2 * j + t];
}

}  // namespace

bool amx_blocks_match(const uint8_t* tiles, int64_t tile_bytes, const bf16_t* panels, int64_t num_tiles) {
  alignas(64) bf16_t tile[kAmxTileBytes / 2], expected[kAmxTileBytes / 2];
  for (int64_t t = 0; t < num_tiles; ++t) {
    expand_tile(tiles + t * tile_bytes, tile_bytes, tile);
    const bf16_t* panel_tile = panels + t * (kAmxTileBytes / 2);
    if (expands_to_rows(tile_bytes)) panel_tile_rows(panel_tile, expected);
    if (std::memcmp(tile, expands_to_rows(tile_bytes) ? expected : panel_tile, kAmxTileBytes) != 0) return false;
  }
  return true;
}

#else

bool amx_blocks_match(const uint8_t*, int64_t, const bf16_t*, int64_t) { return false; }

#endif

}  // namespace pagedllm
