#include "amx_q4.h"

#include <cstring>

#include "amx_linear.h"
#include "amx_tiles.h"

namespace pagedllm {

namespace {

// The code of weight row `row` at input i (0 for a zero column past the weight's rows).
uint8_t code(const uint8_t* codes, int64_t row, int64_t k, int64_t i) { return row < 0 ? 0 : codes[row * k + i] & 15; }

}  // namespace

void pack_amx_q4(const uint16_t* scale, const uint16_t* low, const uint8_t* codes, int64_t n, int64_t k, bool gated,
                 uint8_t* out) {
  const int64_t steps = k / kAmxDepth;
  for (int64_t p = 0; p < amx_panels(n, gated); ++p) {
    int64_t rows[kAmxPanelCols];
    for (int64_t j = 0; j < kAmxPanelCols; ++j) rows[j] = amx_panel_row(p, j, n, gated);
    for (int64_t s = 0; s < steps; ++s, out += kQ4TileBytes) {
      auto* scales = reinterpret_cast<uint16_t*>(out);
      for (int64_t j = 0; j < kAmxPanelCols; ++j) {
        scales[j] = rows[j] < 0 ? 0 : scale[rows[j] * steps + s];
        scales[kAmxPanelCols + j] = rows[j] < 0 ? 0 : low[rows[j] * steps + s];
      }
      uint8_t* bytes = out + kQ4ScaleBytes;
      for (int64_t r = 0; r < kAmxTileRows; ++r)
        for (int64_t t = 0; t < kAmxPanelCols; ++t) {
          const int64_t i = s * kAmxDepth + 2 * r + t % 2;
          *bytes++ = code(codes, rows[t / 2], k, i) | code(codes, rows[8 + t / 2], k, i) << 4;
        }
    }
  }
}

#if defined(__AVX512BF16__)

bool amx_q4_matches(const uint8_t* q4, const bf16_t* panels, int64_t num_tiles) {
  alignas(64) bf16_t tile[kAmxTileBytes / 2];
  for (int64_t t = 0; t < num_tiles; ++t) {
    expand_q4_tile(q4 + t * kQ4TileBytes, tile);
    if (std::memcmp(tile, panels + t * (kAmxTileBytes / 2), kAmxTileBytes) != 0) return false;
  }
  return true;
}

#else

bool amx_q4_matches(const uint8_t*, const bf16_t*, int64_t) { return false; }

#endif

}  // namespace pagedllm
