// y = x W^T (+ bias) in bfloat16 on AMX tiles, over weights packed once at load, for batches of up to a few
// hundred rows (decode steps), where the weights are streamed from memory for few rows each.
#pragma once

#include <cstdint>

#include "amx_tiles.h"
#include "vec.h"

namespace pagedllm {

constexpr int64_t kAmxPanelCols = 16;  // outputs per packed panel: one tile of 16 float32 sums per row

// w: [n, k] row-major, k a multiple of kAmxDepth -> panels [ceil(n / 16), k / 32, 16, 32]: tile s of panel p
// holds, in row r, the input pair (2r, 2r + 1) of step s for each of the panel's 16 outputs (zero past n).
void pack_amx_weight(const bf16_t* w, int64_t n, int64_t k, bf16_t* panels);

// y [m, n] = x [m, k] . W^T + bias, summed in float32 and rounded once; bias may be null; x and y contiguous.
void amx_linear(const bf16_t* x, int64_t m, int64_t k, const bf16_t* panels, const bf16_t* bias, int64_t n, bf16_t* y);

}  // namespace pagedllm
