// Which way bfloat16 products are computed: the matmul's and attention's many-row loops follow one choice.
#pragma once

namespace pagedllm {

// kDot: vdpbf16ps, the pair dot product. kWiden: bfloat16 widened to float32 in registers for float32 FMAs.
// Some cores issue vdpbf16ps at half their FMA rate and others at twice it, and no CPU flag tells which:
// kAuto times both once, on first use (in linear.cpp, on the matmul's register tile).
enum class Bf16Path { kAuto, kDot, kWiden };

// Ask for a path (kAuto: the measured one) for every later bfloat16 call.
void set_bf16_path(Bf16Path path);

// The path bfloat16 calls take (measured on the first call that needs it when kAuto was asked for). A build
// without AVX512-BF16 has no pair dot product: kWiden, whatever was asked for.
Bf16Path bf16_path();

}  // namespace pagedllm
