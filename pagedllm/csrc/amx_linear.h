// y = x W^T (+ bias) in bfloat16 on AMX tiles, over weights packed once at load, for batches of up to a few
// hundred rows (decode steps), where the weights are streamed from memory for few rows each.
#pragma once

#include <cstdint>

#include "amx_tiles.h"
#include "vec.h"

namespace pagedllm {

constexpr int64_t kAmxPanelCols = 16;  // outputs per packed panel: one tile of 16 float32 sums per row

// Panels of a weight of n rows: ceil(n / 16), or for a gated weight (an MLP's [gate; up], n = 2 I) a gate panel
// and its up panel for each 16 of the I outputs.
int64_t amx_panels(int64_t n, bool gated);

// The weight row that column j of panel p holds, or -1 for a zero column past the weight's rows.
int64_t amx_panel_row(int64_t p, int64_t j, int64_t n, bool gated);

// w: [n, k] row-major, k a multiple of kAmxDepth -> panels [amx_panels(n, gated), k / 32, 16, 32]: tile s of
// panel p holds, in row r, the input pair (2r, 2r + 1) of step s for each of the panel's 16 outputs (zero past
// the weight's rows). Gated: panel 2j holds gate rows 16j.., panel 2j + 1 the up rows of the same outputs.
void pack_amx_weight(const bf16_t* w, int64_t n, int64_t k, bool gated, bf16_t* panels);

// A weight's tiles in one of amx_blocks.h's forms (tile_bytes says which), checked with amx_blocks_match to expand
// to its panels, or none (data null). Batches of few rows read them instead of the panels: the same results.
struct BlockTiles {
  const uint8_t* data = nullptr;
  int64_t tile_bytes = 0;
};

// y [m, n] = x [m, k] . W^T + bias, summed in float32 and rounded once; bias may be null; x and y contiguous.
// Gated: n is I, and y = silu(gate) * up of the float32 sums of a gated weight's two halves (bias: [2 I]).
void amx_linear(const bf16_t* x, int64_t m, int64_t k, const bf16_t* panels, BlockTiles blocks, const bf16_t* bias,
                int64_t n, bool gated, bf16_t* y);
// The same, y the float32 values of those bfloat16 results (what y.float() gives), written in the same pass.
void amx_linear(const bf16_t* x, int64_t m, int64_t k, const bf16_t* panels, BlockTiles blocks, const bf16_t* bias,
                int64_t n, bool gated, float* y);

// For each row of y = x W^T + bias (rounded to bfloat16, as amx_linear stores it; an LM head's logits): its first
// argmax and that logit's log-probability, y[argmax] - logsumexp(y), from the tiles of sums as they are made, y never
// written out. logprob is NaN for a row with a logit that is not finite.
void amx_greedy_head(const bf16_t* x, int64_t m, int64_t k, const bf16_t* panels, BlockTiles blocks,
                     const bf16_t* bias, int64_t n, int64_t* argmax, float* logprob);

}  // namespace pagedllm
