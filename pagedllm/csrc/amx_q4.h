// A weight kept as the 4-bit blocks it was stored in (GGUF's Q4_1: w = d q + m over each 32 inputs of a row, d and m
// float16, q in 0..15), laid out tile by tile for the AMX matmul. A decode step streams its weights from memory, and
// this form is 320 bytes a tile against the bfloat16 panels' 1 KB: the matmul expands each tile into bfloat16 in L1
// just before multiplying it. d q is exact in float32 (11 by 4 significant bits), so one fused multiply-add gives
// the float32 weight the file's dequantization gives, and rounding it gives the bfloat16 panel's value; at load
// every tile is expanded once and compared with the panels, and a weight that differs anywhere keeps the panels.
#pragma once

#include <cstdint>

#include "vec.h"

#if defined(__AVX512BF16__)
#include <immintrin.h>
#endif

namespace pagedllm {

// Per tile: the 16 outputs' d (float16), their m (float16), then the tile's 16 rows of 16 bytes. Byte t of row r
// holds, low nibble, the code of output t / 2 at input 2 r + t % 2 of the step, and, high nibble, that of output
// 8 + t / 2: expanded, the low nibbles are the bfloat16 pairs of outputs 0-7 and the high ones those of 8-15, which
// is the row as the tile holds it.
constexpr int64_t kQ4TileBytes = 320;
constexpr int64_t kQ4ScaleBytes = 64;  // the tile's 16 d and 16 m

// scale, low: [n, k / 32] float16 bits; codes: [n, k] in 0..15 -> out [amx_panels(n, gated), k / 32, 320 bytes],
// tile s of panel p holding the outputs pack_amx_weight puts there (zero past the weight's rows).
void pack_amx_q4(const uint16_t* scale, const uint16_t* low, const uint8_t* codes, int64_t n, int64_t k, bool gated,
                 uint8_t* out);

// Whether every one of num_tiles tiles of q4 expands to the same bytes as the same tile of the bfloat16 panels.
bool amx_q4_matches(const uint8_t* q4, const bf16_t* panels, int64_t num_tiles);

#if defined(__AVX512BF16__)
// One tile of pack_amx_q4 -> the 1 KB bfloat16 tile (inline: the matmul expands one or two every tile step).
inline void expand_q4_tile(const uint8_t* tile, bf16_t* out) {
  const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(tile)));
  const __m512 m = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(tile + 32)));
  const __m512i first = _mm512_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7);  // lane -> output
  const __m512i second = _mm512_add_epi32(first, _mm512_set1_epi32(8));
  const __m512 d_lo = _mm512_permutexvar_ps(first, d), m_lo = _mm512_permutexvar_ps(first, m);
  const __m512 d_hi = _mm512_permutexvar_ps(second, d), m_hi = _mm512_permutexvar_ps(second, m);
  const __m512i nibble = _mm512_set1_epi32(15);
  const uint8_t* bytes = tile + kQ4ScaleBytes;
  for (int r = 0; r < 16; ++r) {
    const __m512i v = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(bytes + 16 * r)));
    // d q + m in one rounding, as the file's dequantization gets it in two: d q is exact
    const __m512 lo = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_and_si512(v, nibble)), d_lo, m_lo);
    const __m512 hi = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_srli_epi32(v, 4)), d_hi, m_hi);
    _mm512_storeu_si512(out + 32 * r, reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(hi, lo)));  // lo's, then hi's
  }
}
#endif

}  // namespace pagedllm
