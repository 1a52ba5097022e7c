// AMX tiles: whether this build and process may use them, and the operand of ldtilecfg. The matmul
// (amx_linear.cpp) and the attention's many-row loops (paged_attention.cpp) both multiply on them.
#pragma once

#include <cstdint>

#if defined(__AMX_TILE__) && defined(__AMX_BF16__) && defined(__AVX512BF16__)
#define PAGEDLLM_AMX 1
#include <immintrin.h>
#endif

namespace pagedllm {

constexpr int64_t kAmxTileRows = 16;    // rows of a tile
constexpr int64_t kAmxTileBytes = 1024;  // 16 rows of 64 bytes: 16 float32 sums, or 16 pairs of bfloat16, per row
constexpr int64_t kAmxDepth = 32;       // inputs per tile product: 16 pairs of bfloat16

// Whether this build has AMX-BF16 (a compiler and CPU with it) and Linux lets this process use the tiles
// (asked once).
bool amx_tiles_granted();

// The 64-byte operand of ldtilecfg (palette 1).
struct alignas(64) TileConfig {
  uint8_t palette = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t bytes_per_row[16] = {};
  uint8_t rows[16] = {};
};

// Tiles 0-7 with `rows` rows of 64 bytes each (tiles from `full_from` on with all 16).
inline TileConfig tile_config(int rows, int full_from = 8) {
  TileConfig config;
  for (int t = 0; t < 8; ++t) config.rows[t] = t < full_from ? rows : kAmxTileRows, config.bytes_per_row[t] = 64;
  return config;
}

}  // namespace pagedllm
