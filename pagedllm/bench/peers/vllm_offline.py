"""Offline throughput of vLLM (`vllm.LLM.generate`, every request at once) on a JSONL workload.

Runs with the peers venv's python (.venv-peers), which has vLLM but not pagedllm, so it depends on
nothing from this repository. The JSONL is the one `pagedllm bench throughput` and `pagedllm bench
serve` read (written by workloads.save_jsonl): the same token ids, lengths and n, and the same
sampling (greedy for n = 1, temperature 1 seeded seed + i for n > 1, ignore_eos).

    .venv-peers/bin/python pagedllm/bench/peers/vllm_offline.py --model DIR --workload W.jsonl --json out.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True, help="Hugging Face directory")
    p.add_argument("--workload", required=True, help="JSONL: prompt (token ids), max_tokens, n per line")
    p.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-model-len", type=int, default=2048)
    p.add_argument("--enable-prefix-caching", action=argparse.BooleanOptionalAction, default=True)
    p.add_argument("--no-sample-seeds", dest="seed_samples", action="store_false",
                   help="n > 1 requests unseeded (vLLM 0.32 CPU fails on seeded requests whose prefill is chunked)")
    p.add_argument("--label", default=None)
    p.add_argument("--json", required=True, help="where to write the result")
    return p.parse_args(argv)


def load_requests(path: str) -> list[dict[str, Any]]:
    requests = [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
    if any(r.get("beam") for r in requests):
        sys.exit("beam search workloads are not compared with vLLM here")
    if any(not isinstance(r["prompt"], list) for r in requests):
        sys.exit("prompts must be token ids so every engine sees the same tokens")
    return requests


def sampling_params(request: dict[str, Any], seed: int | None):
    from vllm import SamplingParams

    n = int(request.get("n", 1))
    return SamplingParams(n=n, temperature=0.0 if n == 1 else 1.0, seed=seed if n > 1 else None,
                          max_tokens=int(request["max_tokens"]), ignore_eos=True)


def build_llm(args: argparse.Namespace):
    from vllm import LLM

    return LLM(model=args.model, dtype=args.dtype, seed=args.seed, max_model_len=args.max_model_len,
               enable_prefix_caching=args.enable_prefix_caching)


def warm_up(llm) -> None:
    from vllm import SamplingParams

    llm.generate([{"prompt_token_ids": list(range(16, 40))}], SamplingParams(max_tokens=4, ignore_eos=True),
                 use_tqdm=False)


def run(llm, requests: list[dict[str, Any]], seed: int | None) -> tuple[float, list]:
    prompts = [{"prompt_token_ids": r["prompt"]} for r in requests]
    params = [sampling_params(r, None if seed is None else seed + i) for i, r in enumerate(requests)]
    start = time.perf_counter()
    outputs = llm.generate(prompts, params, use_tqdm=False)
    return time.perf_counter() - start, outputs


def result(args: argparse.Namespace, requests: list[dict[str, Any]], elapsed: float, outputs: list) -> dict:
    import torch
    import vllm

    prompt_tokens = sum(len(r["prompt"]) for r in requests)
    output_tokens = sum(len(c.token_ids) for o in outputs for c in o.outputs)
    return {
        "benchmark": "vllm-offline",
        "label": args.label or f"vLLM {vllm.__version__} offline",
        "workload_file": args.workload,
        "model": args.model,
        "dtype": args.dtype,
        "enable_prefix_caching": args.enable_prefix_caching,
        "num_requests": len(requests),
        "prompt_tokens": prompt_tokens,
        "output_tokens": output_tokens,
        "elapsed_s": elapsed,
        "requests_per_s": len(requests) / elapsed,
        "output_tokens_per_s": output_tokens / elapsed,
        "total_tokens_per_s": (prompt_tokens + output_tokens) / elapsed,
        "environment": {"vllm_version": vllm.__version__, "torch_version": torch.__version__,
                        "threads": torch.get_num_threads(), "cpu_count": os.cpu_count(),
                        "python": platform.python_version(),
                        "env": {k: os.environ.get(k) for k in ("VLLM_CPU_KVCACHE_SPACE", "VLLM_CPU_OMP_THREADS_BIND",
                                                               "LD_PRELOAD", "HF_HUB_OFFLINE")}},
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    requests = load_requests(args.workload)
    llm = build_llm(args)
    warm_up(llm)
    elapsed, outputs = run(llm, requests, args.seed if args.seed_samples else None)
    report = result(args, requests, elapsed, outputs)
    Path(args.json).write_text(json.dumps(report, indent=2) + "\n")
    print(f"{report['label']}: {report['output_tokens']} output tokens in {elapsed:.1f} s = "
          f"{report['output_tokens_per_s']:.1f} tok/s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
