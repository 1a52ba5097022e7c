"""Structured outputs side by side: one engine's offline output tokens/s on 32 chat requests held to a JSON schema,
and on the same requests free, in turns (json, free, json, free), the engine warm.

Runs under either virtualenv and imports only the engine it is asked for, so the same requests go to both:

    .venv/bin/python pagedllm/bench/peers/structured_outputs.py pagedllm --model DIR --dtype bfloat16
    .venv-peers/bin/python pagedllm/bench/peers/structured_outputs.py vllm --model DIR --dtype bfloat16

Each run prints one JSON line: engine, dtype, run, tokens, seconds, tok_s, how many completions stopped (the JSON
finished) rather than ran into max_tokens, and the CPU's flags.
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

SCHEMA = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"},
                                           "skills": {"type": "array", "items": {"type": "string"}}},
          "required": ["name", "age", "skills"]}  # fmt: skip
NUM_REQUESTS, MAX_TOKENS = 32, 160


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("engine", choices=["pagedllm", "vllm"])
    p.add_argument("--model", required=True, help="Hugging Face directory (both engines read it)")
    p.add_argument("--dtype", choices=["float32", "bfloat16"], default="bfloat16")
    args = p.parse_args(argv)
    llm, sampling, constraint = _engine(args.engine, args.model, args.dtype)
    chats = [[{"role": "user", "content": f"Describe person number {i} as JSON."}] for i in range(NUM_REQUESTS)]
    llm.chat(chats[:2], sampling(max_tokens=8, structured_outputs=constraint(json=SCHEMA)), use_tqdm=False)
    for run in ("json", "free", "json", "free"):
        so = constraint(json=SCHEMA) if run == "json" else None
        params = [sampling(temperature=0.8, seed=i, max_tokens=MAX_TOKENS, structured_outputs=so)
                  for i in range(NUM_REQUESTS)]  # fmt: skip
        start = time.perf_counter()
        outputs = llm.chat(chats, params, use_tqdm=False)
        seconds = time.perf_counter() - start
        tokens = sum(len(o.outputs[0].token_ids) for o in outputs)
        stopped = sum(o.outputs[0].finish_reason == "stop" for o in outputs)
        print(json.dumps({"engine": args.engine, "dtype": args.dtype, "run": run, "tokens": tokens,
                          "seconds": round(seconds, 2), "tok_s": round(tokens / seconds, 1), "stopped": stopped,
                          "cpu_flags": _cpu_flags()}), flush=True)  # fmt: skip
    return 0


def _engine(name: str, model: str, dtype: str) -> tuple[Any, Any, Any]:
    if name == "vllm":
        from vllm import LLM, SamplingParams
        from vllm.sampling_params import StructuredOutputsParams

        return LLM(model=model, dtype=dtype, max_model_len=2048), SamplingParams, StructuredOutputsParams
    from pagedllm import LLM, SamplingParams, StructuredOutputsParams

    return LLM(model=model, dtype=dtype, max_model_len=2048), SamplingParams, StructuredOutputsParams


def _cpu_flags() -> list[str]:
    wanted = {"avx2", "avx512f", "avx512_bf16", "amx_bf16"}
    try:
        with open("/proc/cpuinfo") as f:
            flags = next((line.split(":", 1)[1].split() for line in f if line.startswith("flags")), [])
    except OSError:
        return []
    return sorted(wanted & set(flags))


if __name__ == "__main__":
    raise SystemExit(main())
