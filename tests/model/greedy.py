"""A miniature scheduler for tests: greedy decoding of several prompts through ModelRunner, with staggered
arrivals (so steps mix prefill and decode), chunked prefill and shuffled (non-contiguous) physical blocks."""

import random

import torch

from pagedllm.engine.model_runner import ModelRunner, SeqInput


class _Seq:
    def __init__(self, prompt: list[int]) -> None:
        self.tokens = list(prompt)
        self.prompt_len = len(prompt)
        self.num_cached = 0
        self.blocks: list[int] = []


def greedy_paged(
    runner: ModelRunner, prompts: list[list[int]], max_new_tokens: int, prefill_chunk: int = 5, seed: int = 0
) -> list[list[int]]:
    """New tokens per prompt. Prompt i joins at step 2*i; prompts are prefilled `prefill_chunk` tokens a step."""
    free = list(range(runner.num_blocks))
    random.Random(seed).shuffle(free)
    seqs = [_Seq(p) for p in prompts]
    step = 0
    while any(len(s.tokens) - s.prompt_len < max_new_tokens for s in seqs):
        active = [s for i, s in enumerate(seqs[: step // 2 + 1]) if len(s.tokens) - s.prompt_len < max_new_tokens]
        inputs = [_schedule(s, prefill_chunk, runner.block_size, free) for s in active]
        logits = runner.execute(inputs)
        sampled = iter(logits.argmax(-1).tolist())
        for s, inp in zip(active, inputs):
            s.num_cached += len(inp.token_ids)
            if inp.needs_logits:
                s.tokens.append(next(sampled))
        step += 1
    return [s.tokens[s.prompt_len :] for s in seqs]


def _schedule(s: _Seq, chunk: int, block_size: int, free: list[int]) -> SeqInput:
    new = s.tokens[s.num_cached : s.num_cached + chunk]
    end = s.num_cached + len(new)
    while len(s.blocks) * block_size < end:
        s.blocks.append(free.pop())
    return SeqInput(new, s.num_cached, list(s.blocks), needs_logits=end == len(s.tokens))


def hf_greedy(hf_model, prompt: list[int], max_new_tokens: int) -> list[int]:
    """transformers' own greedy generate, eos ignored so every run yields max_new_tokens tokens."""
    hf_model.generation_config.eos_token_id = None
    hf_model.generation_config.pad_token_id = 0
    with torch.no_grad():
        out = hf_model.generate(
            torch.tensor([prompt]), max_new_tokens=max_new_tokens, min_new_tokens=max_new_tokens, do_sample=False
        )
    return out[0, len(prompt) :].tolist()
