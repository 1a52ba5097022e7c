// A weight kept in the quantized blocks it was stored in (GGUF's Q4_1 and Q8_0, over each 32 inputs of a row), laid
// out tile by tile for the AMX matmul. A decode step streams its weights from memory, and these forms take 320
// (Q4_1) or 544 (Q8_0) bytes a tile against the bfloat16 panels' 1 KB: the matmul expands each tile into bfloat16 in
// L1 just before multiplying it. The products d q are exact in float32 (11 by 4 or 8 significant bits), so one
// fused multiply-add gives the float32 weight the file's dequantization gives, and rounding it the bfloat16 panel's
// value; at load every tile is expanded once and compared with the panels, and a weight that differs anywhere keeps
// the panels.
#pragma once

#include <cstdint>

#include "vec.h"

#if defined(__AVX512BF16__)
#include <immintrin.h>
#endif

namespace pagedllm {

// Q4_1 (w = d q + m, q in 0..15), per tile: the 16 outputs' d (float16), their m (float16), then one row of 16
// bytes per output: byte i holds, low nibble, the code of input i of the step and, high nibble, that of input 16 + i.
// Unlike the other forms it expands to the tile's transpose, the 16 outputs' rows of 32 inputs (the left operand of
// a tile product, the rows of x then on the right): each row then has a single d and m.
constexpr int64_t kQ4TileBytes = 320;
// Q8_0 (w = d q, q in -128..127), per tile: the 16 outputs' d (float16), then 16 rows of 32 signed bytes: byte t
// the code of output t / 2 at input 2 r + t % 2, byte 16 + t that of output 8 + t / 2.
constexpr int64_t kQ8TileBytes = 544;
constexpr int64_t kScalesBytes = 32;  // 16 float16 scales

// Whether a form's tiles expand to their outputs' rows (Q4_1's) rather than to the panels' tiles.
constexpr bool expands_to_rows(int64_t tile_bytes) { return tile_bytes == kQ4TileBytes; }

// scale, low: [n, k / 32] float16 bits; codes: [n, k] in 0..15 -> out [amx_panels(n, gated), k / 32, 320 bytes],
// tile s of panel p holding the outputs pack_amx_weight puts there (zero past the weight's rows).
void pack_amx_q4(const uint16_t* scale, const uint16_t* low, const uint8_t* codes, int64_t n, int64_t k, bool gated,
                 uint8_t* out);
// scale: [n, k / 32] float16 bits; codes: [n, k] -> out [amx_panels(n, gated), k / 32, 544 bytes], as pack_amx_q4.
void pack_amx_q8(const uint16_t* scale, const int8_t* codes, int64_t n, int64_t k, bool gated, uint8_t* out);

// Whether every one of num_tiles tiles of `tiles` (tile_bytes each: one of the forms above) expands to the same
// bytes as the same tile of the bfloat16 panels (transposed, for a form that expands to rows).
bool amx_blocks_match(const uint8_t* tiles, int64_t tile_bytes, const bf16_t* panels, int64_t num_tiles);

#if defined(__AVX512BF16__)
namespace blocks_detail {

// Lane i of the first (second) vector of a tile row is a value of output i / 2 (8 + i / 2).
inline __m512i outputs_of_lanes(int half) {
  return _mm512_add_epi32(_mm512_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7), _mm512_set1_epi32(8 * half));
}

inline __m512 scales(const uint8_t* tile, int half) {  // the 16 float16 at tile, spread to the half's lanes
  return _mm512_permutexvar_ps(outputs_of_lanes(half),
                               _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(tile))));
}

}  // namespace blocks_detail

// One tile of pack_amx_q4 -> its 16 outputs' bfloat16 rows, 1 KB. An output's 16 possible values d q + m are made
// once (one rounding each, as the file's dequantization gets them: d q is exact) and its codes look them up
// (vpermw, two outputs' values in one vector). This keeps port 0, which the tile products need too, mostly free:
// with two tile products a tile, 38.7 ns against 50.3 for converting and scaling each code (docs/models.md).
inline void expand_q4_tile(const uint8_t* tile, bf16_t* out) {
  alignas(64) float d[16], m[16];
  _mm512_store_ps(d, _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(tile))));
  _mm512_store_ps(m, _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(tile + kScalesBytes))));
  asm volatile("" ::: "memory");  // read d[j] and m[j] back from memory: broadcasts by the load ports, not port 5
  const __m512 codes = _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  const __m512i high_nibbles = _mm512_set_epi64(0x0004000400040004, 0x0004000400040004, 0x0004000400040004,
                                                0x0004000400040004, 0, 0, 0, 0);  // words 16-31 shifted by 4
  const __m512i low4 = _mm512_set1_epi16(15), second = _mm512_set1_epi16(16);
  const uint8_t* bytes = tile + 2 * kScalesBytes;
  for (int j = 0; j < 16; j += 2) {
    const __m512 first_values = _mm512_fmadd_ps(codes, _mm512_set1_ps(d[j]), _mm512_set1_ps(m[j]));
    const __m512 second_values = _mm512_fmadd_ps(codes, _mm512_set1_ps(d[j + 1]), _mm512_set1_ps(m[j + 1]));
    const __m512i values = reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(second_values, first_values));
    for (int u = 0; u < 2; ++u) {  // words 0-15: the row's bytes (low nibble: inputs 0-15), 16-31: its high nibbles
      const auto* row = reinterpret_cast<const __m128i*>(bytes + 16 * (j + u));
      const __m256i twice = _mm256_broadcastsi128_si256(_mm_loadu_si128(row));
      const __m512i nibbles = _mm512_srlv_epi16(_mm512_cvtepu8_epi16(twice), high_nibbles);
      const __m512i index =  // nibble | 16 u: output j + u's values
          u == 0 ? _mm512_and_si512(nibbles, low4) : _mm512_ternarylogic_epi32(nibbles, low4, second, 0xEA);
      _mm512_storeu_si512(out + 32 * (j + u), _mm512_permutexvar_epi16(index, values));
    }
  }
}

// One tile of pack_amx_q8 -> the 1 KB bfloat16 tile.
inline void expand_q8_tile(const uint8_t* tile, bf16_t* out) {
  using blocks_detail::scales;
  const __m512 d_lo = scales(tile, 0), d_hi = scales(tile, 1);
  const uint8_t* bytes = tile + kScalesBytes;
  for (int r = 0; r < 16; ++r) {
    const auto* row = reinterpret_cast<const __m128i*>(bytes + 32 * r);
    const __m512 lo = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(row))), d_lo);
    const __m512 hi = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(row + 1))), d_hi);
    _mm512_storeu_si512(out + 32 * r, reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(hi, lo)));
  }
}

// A tile of either form (tile_bytes says which) -> the 1 KB bfloat16 tile (of rows: expands_to_rows).
inline void expand_tile(const uint8_t* tile, int64_t tile_bytes, bf16_t* out) {
  if (tile_bytes == kQ4TileBytes)
    expand_q4_tile(tile, out);
  else
    expand_q8_tile(tile, out);
}
#endif

}  // namespace pagedllm
