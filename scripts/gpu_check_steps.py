"""The Python steps of scripts/gpu_check.sh: `python scripts/gpu_check_steps.py STEP [options]`.

  make-model DIR     a seeded random-weight Llama of the default model's shape (SmolLM2-135M), float32
                     safetensors, with a word-level tokenizer that has one token per id
  greedy DIR         engine greedy tokens (CUDA graphs on, then enforce_eager) == transformers generate
  bandwidth          decode attention's achieved bandwidth vs a measured device-to-device copy
  imports            `import pagedllm` and the engine path pull in none of the server's or GGUF's packages
  graphs OUT_DIR     CUDA graphs on vs off, from the bench step's bench_graphs.json and bench_eager.json

--device cpu with --small runs the same code on the CPU (a dry run of the script, not a measurement).
Nothing is downloaded; only torch, triton, transformers, tokenizers and safetensors are needed.
"""

import argparse
import json
import random
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

DEFAULT_SHAPE = dict(  # SmolLM2-135M-Instruct
    hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9, num_key_value_heads=3,
    vocab_size=49152, max_position_embeddings=8192, rope_theta=100000.0, tie_word_embeddings=True,
)
SMALL_SHAPE = dict(
    hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
    vocab_size=512, max_position_embeddings=1024, rope_theta=10000.0, tie_word_embeddings=True,
)
NOT_NEEDED = ("fastapi", "starlette", "uvicorn", "pydantic", "gguf", "openai")


def make_model(out: Path, small: bool, seed: int = 0) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    shape = SMALL_SHAPE if small else DEFAULT_SHAPE
    torch.manual_seed(seed)
    # a wider init than the default 0.02 makes the logits peaked, so greedy ties (float noise) are unlikely
    config = LlamaConfig(**shape, rms_norm_eps=1e-5, bos_token_id=1, eos_token_id=2, initializer_range=0.08)
    LlamaForCausalLM(config).save_pretrained(out)
    words = Tokenizer(models.WordLevel({f"<t{i}>": i for i in range(shape["vocab_size"])}, unk_token="<t0>"))
    words.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=words, unk_token="<t0>", bos_token="<t1>", eos_token="<t2>", pad_token="<t0>"
    )
    tokenizer.save_pretrained(out)
    print(f"wrote {out}: {sum(p.stat().st_size for p in out.iterdir()) / 2**20:.0f} MiB")


def engine_greedy(model_dir: Path, device: str, prompts: list[list[int]], new_tokens: int, eager: bool):
    from pagedllm.config import EngineConfig
    from pagedllm.engine.llm_engine import LLMEngine
    from pagedllm.sampling_params import SamplingParams

    # a fixed pool (64k tokens): two engines live in this process one after the other, and a profile
    # would count the first one's memory (the bench step sizes its pool from gpu_memory_utilization)
    config = EngineConfig(model=str(model_dir), device=device, dtype="float32", enforce_eager=eager,
                          num_blocks=4096, max_model_len=1024)  # fmt: skip
    engine = LLMEngine(config)
    params = SamplingParams(max_tokens=new_tokens, temperature=0.0, ignore_eos=True)
    ids = [engine.add_request(None, p, params) for p in prompts]
    done = {}
    start = time.perf_counter()
    while engine.has_unfinished_requests():
        done.update({o.request_id: o for o in engine.step() if o.finished})
    print(f"  engine ({'eager' if eager else 'CUDA graphs where they apply'}, attention "
          f"{engine.runner.attention_impl}): {time.perf_counter() - start:.2f} s")  # fmt: skip
    return engine, [done[i].outputs[0].token_ids for i in ids]


def hf_greedy(hf_model, prompt: list[int], new_tokens: int) -> list[int]:
    ids = torch.tensor([prompt], device=hf_model.device)
    with torch.inference_mode():
        out = hf_model.generate(input_ids=ids, max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                                do_sample=False, pad_token_id=0, eos_token_id=None)  # fmt: skip
    return out[0, len(prompt):].tolist()


def top2_gap(hf_model, prompt: list[int], tokens: list[int], at: int) -> float:
    """The top-1 minus top-2 logit where the two runs part: near 0 means a tie that float noise can flip."""
    ids = torch.tensor([prompt + tokens[:at]], device=hf_model.device)
    with torch.inference_mode():
        top = hf_model(ids).logits[0, -1].float().topk(2).values
    return float(top[0] - top[1])


def greedy(model_dir: Path, device: str, num_prompts: int, new_tokens: int) -> int:
    from pagedllm.bench.hf_baseline import hf_model_from

    rng = random.Random(0)
    vocab = json.loads((model_dir / "config.json").read_text())["vocab_size"]
    prompts = [[rng.randrange(3, vocab) for _ in range(rng.randint(4, 300))] for _ in range(num_prompts)]
    total_failures = 0
    for eager in (False, True):
        failures = 0
        engine, got = engine_greedy(model_dir, device, prompts, new_tokens, eager)
        hf_model = hf_model_from(engine.model, engine.model_config)
        for i, (prompt, tokens) in enumerate(zip(prompts, got)):
            want = hf_greedy(hf_model, prompt, new_tokens)
            if tokens != want:
                at = next(j for j, (a, b) in enumerate(zip(tokens, want)) if a != b)
                gap = top2_gap(hf_model, prompt, want, at)
                print(f"  prompt {i} ({len(prompt)} tokens): differs at token {at}; transformers' top-2 gap {gap:.2e}")
                failures += 1
        del engine, hf_model
        equal = num_prompts - failures
        print(f"  enforce_eager={eager}: {equal} of {num_prompts} prompts equal, {new_tokens} tokens each")
        total_failures += failures
    return 1 if total_failures else 0


def time_cuda(fn, repeats: int = 20) -> float:
    """Seconds per call, from CUDA events after a warm-up call."""
    fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(repeats):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / 1000 / repeats


def copy_bandwidth(nbytes: int = 1 << 30) -> float:
    src = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    return 2 * nbytes / time_cuda(lambda: dst.copy_(src))  # each byte read once and written once


def decode_bandwidth(num_seqs: int, context: int, heads: int, kv_heads: int, head_dim: int, block_size: int) -> float:
    """KV bytes read per second by one decode step's attention (every K and V row of every sequence once)."""
    from pagedllm.attention import AttentionMetadata
    from pagedllm.attention.triton import triton_attention

    dtype, per_seq = torch.bfloat16, -(-context // block_size)
    blocks = torch.randperm(num_seqs * per_seq).view(num_seqs, per_seq).tolist()  # scattered, like a real pool
    kv = torch.randn(2, kv_heads, num_seqs * per_seq, block_size, head_dim, dtype=dtype, device="cuda")
    query = torch.randn(num_seqs, heads, head_dim, dtype=dtype, device="cuda")
    meta = AttentionMetadata.build(blocks, [context - 1] * num_seqs, [1] * num_seqs, block_size, device="cuda")
    seconds = time_cuda(lambda: triton_attention(query, kv, meta, head_dim**-0.5))
    return 2 * num_seqs * context * kv_heads * head_dim * kv.element_size() / seconds


def bandwidth() -> int:
    copy = copy_bandwidth()
    print(f"  device-to-device copy: {copy / 1e9:.0f} GB/s (read + write)")
    shapes = [("default model (9 heads, 3 KV heads, d 64)", 9, 3, 64),
              ("8B-like (32 heads, 8 KV heads, d 128)", 32, 8, 128)]
    for name, heads, kv_heads, head_dim in shapes:
        for num_seqs, context in ((64, 4096), (256, 1024), (8, 32768)):
            achieved = decode_bandwidth(num_seqs, context, heads, kv_heads, head_dim, block_size=16)
            print(f"  decode attention, {name}, {num_seqs} seqs x {context} tokens, bf16, blocks of 16: "
                  f"{achieved / 1e9:.0f} GB/s = {achieved / copy:.2f} of the copy")  # fmt: skip
    return 0


def compare_graphs(out_dir: Path) -> int:
    """The engine's throughput with CUDA graphs (the default) over enforce_eager, same workload and GPU."""
    on, off = (json.loads((out_dir / f"bench_{name}.json").read_text())["runs"][0] for name in ("graphs", "eager"))
    ratio = on["output_tokens_per_s"] / off["output_tokens_per_s"]
    for label, run in (("CUDA graphs on", on), ("enforce_eager", off)):
        print(f"  {label}: {run['output_tokens_per_s']:.0f} output tok/s, {run['elapsed_s']:.2f} s, "
              f"TTFT p50 {run['ttft_s']['p50'] * 1e3:.0f} ms, TPOT p50 {run['tpot_s']['p50'] * 1e3:.1f} ms")
    print(f"  graphs on / off: {ratio:.2f}x")
    return 0


def imports() -> int:
    import pagedllm  # noqa: F401
    import pagedllm.bench.throughput  # noqa: F401
    import pagedllm.engine.llm_engine  # noqa: F401
    import pagedllm.entrypoints.llm  # noqa: F401
    from pagedllm.entrypoints.cli import build_parser

    build_parser()  # every subcommand's arguments, as `python -m pagedllm bench ...` builds them
    loaded = sorted({m.split(".")[0] for m in sys.modules} & set(NOT_NEEDED))
    print(f"  server/GGUF packages imported by the engine path: {loaded or 'none'}")
    return 1 if loaded else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("step", choices=["make-model", "greedy", "bandwidth", "imports", "graphs"])
    parser.add_argument("model_dir", nargs="?", type=Path, help="the model directory (graphs: the output directory)")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--small", action="store_true", help="a tiny model (CPU dry run)")
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--new-tokens", type=int, default=32)
    args = parser.parse_args()
    if args.step == "make-model":
        make_model(args.model_dir, args.small)
        return 0
    if args.step == "greedy":
        return greedy(args.model_dir, args.device, args.prompts, args.new_tokens)
    if args.step == "graphs":
        return compare_graphs(args.model_dir)
    if args.step == "bandwidth":
        if not args.device.startswith("cuda"):
            print("bandwidth times the GPU's copies and Triton kernels: it runs with --device cuda only",
                  file=sys.stderr)
            return 2
        return bandwidth()
    return imports()


if __name__ == "__main__":
    sys.exit(main())
