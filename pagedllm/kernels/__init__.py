"""Compiled CPU kernels (C++ with OpenMP, built on the machine that runs them): paged attention, KV writes
and block copies, and the fused elementwise ops of a decoder layer. Sources in pagedllm/csrc."""

from pagedllm.kernels.build import build_cpu_kernels, cpu_flags, cpu_isa, cpuinfo, load_cpu_kernels

__all__ = ["build_cpu_kernels", "cpu_flags", "cpu_isa", "cpuinfo", "load_cpu_kernels"]
