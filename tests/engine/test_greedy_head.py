"""The LM head's greedy pass in the engine (pagedllm's own matmuls: float32, and bfloat16 with AVX512-BF16 or AMX): a
step whose every logits row needs only its greedy pick takes the tokens and raw logprobs from the head's own pass
(on AMX never making the [rows, vocab] logits; elsewhere without the sampler's Python); the same requests with that
pass turned off (full logits, then the sampler) give the same tokens and logprobs."""

import random
from pathlib import Path

import pytest
import torch

from pagedllm.config import EngineConfig
from pagedllm.engine.llm_engine import LLMEngine
from pagedllm.model.llama import LlamaForCausalLM
from pagedllm.model.projection import amx_matmul_kernels, linear_kernels
from pagedllm.sampling_params import SamplingParams

DTYPES = [dtype for dtype, torch_dtype in (("float32", torch.float32), ("bfloat16", torch.bfloat16))
          if linear_kernels(torch_dtype) is not None or (dtype == "bfloat16" and amx_matmul_kernels() is not None)]
pytestmark = pytest.mark.skipif(not DTYPES, reason="the greedy pass needs pagedllm's compiled matmul")


@pytest.fixture(params=DTYPES)
def dtype(request: pytest.FixtureRequest) -> str:
    return request.param


def run(model_dir: Path, dtype: str, sampled: bool = False) -> tuple[list[list[int]], list[float], int]:
    """Greedy requests over a shared prefix, chunked, and with n=2 (plus, when `sampled`, one request sampled at
    temperature 1, whose steps need full logits): each completion's tokens and cumulative logprob, and how many
    steps the head's greedy pass served."""
    engine = LLMEngine(EngineConfig(model=str(model_dir), dtype=dtype, num_blocks=128, block_size=4,
                                    max_num_batched_tokens=64))  # fmt: skip
    served = []
    head = engine.runner.model.greedy_picks

    def counted(hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
        picks = head(hidden)
        served.append(picks is not None)
        return picks

    engine.runner.model.greedy_picks = counted
    rng = random.Random(0)
    shared = [rng.randrange(5, 384) for _ in range(30)]
    prompts = [shared + [rng.randrange(5, 384) for _ in range(n)] for n in (3, 40, 9)] + [[7, 8, 9]]
    params = [SamplingParams(temperature=0.0, ignore_eos=True, max_tokens=12)] * 3
    params.append(SamplingParams(n=2, temperature=0.0, ignore_eos=True, max_tokens=12))
    if sampled:
        prompts.append([11, 12])
        params.append(SamplingParams(temperature=1.0, seed=3, ignore_eos=True, max_tokens=5))
    ids = [engine.add_request(None, p, sp) for p, sp in zip(prompts, params)]
    done = {}
    while engine.has_unfinished_requests():
        done.update((out.request_id, out) for out in engine.step() if out.finished)
    outputs = [c for i in ids for c in done[i].outputs]
    return [c.token_ids for c in outputs], [c.cumulative_logprob for c in outputs], sum(served)


def without_greedy_pass(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(LlamaForCausalLM, "greedy_picks", lambda self, hidden: None)


@pytest.mark.parametrize("sampled", [False, True])
def test_greedy_pass_gives_the_tokens_and_logprobs_of_the_full_logits(
    tiny_llama_dir: Path, monkeypatch: pytest.MonkeyPatch, dtype: str, sampled: bool
) -> None:
    tokens, logprobs, served = run(tiny_llama_dir, dtype, sampled)
    assert served > 0
    without_greedy_pass(monkeypatch)
    expected_tokens, expected_logprobs, _ = run(tiny_llama_dir, dtype, sampled)
    assert tokens == expected_tokens and all(len(t) in (5, 12) for t in tokens)
    assert logprobs == pytest.approx(expected_logprobs, rel=1e-5, abs=1e-4)


def test_steps_with_a_sampled_row_take_the_full_logits(tiny_llama_dir: Path, dtype: str) -> None:
    """While the temperature-1 request runs (its prompt step and 5 decode steps), no step uses the greedy pass."""
    *_, all_greedy = run(tiny_llama_dir, dtype)
    *_, mixed = run(tiny_llama_dir, dtype, sampled=True)
    assert 0 < mixed <= all_greedy - 5


def test_rows_whose_logits_are_not_finite_take_the_full_logits(
    tiny_llama_dir: Path, monkeypatch: pytest.MonkeyPatch, dtype: str
) -> None:
    """A NaN logprob from the greedy pass (a logit that is not finite) sends the step to the full logits and the
    sampler, whose results are then those of a run without the pass."""
    real = LlamaForCausalLM.greedy_picks

    def unfinished(self, hidden: torch.Tensor):
        tokens, logprobs = real(self, hidden)
        return tokens, torch.full_like(logprobs, float("nan"))

    monkeypatch.setattr(LlamaForCausalLM, "greedy_picks", unfinished)
    tokens, logprobs, served = run(tiny_llama_dir, dtype)
    assert served > 0
    without_greedy_pass(monkeypatch)
    assert (tokens, logprobs) == run(tiny_llama_dir, dtype)[:2]
