"""The engine on the real default model (CI): batched greedy equals alone and equals transformers."""

import random

import pytest
import torch

from pagedllm.config import EngineConfig
from pagedllm.engine.llm_engine import LLMEngine
from pagedllm.sampling_params import SamplingParams

pytestmark = pytest.mark.slow
NEW_TOKENS = 16


@pytest.fixture(scope="module")
def engine(default_model_path) -> LLMEngine:
    # float32: the transformers oracle runs in float32 (dtype="auto" may pick bfloat16 on this CPU)
    return LLMEngine(EngineConfig(model=str(default_model_path), dtype="float32", kv_cache_memory="512MiB",
                                  max_model_len=1024))


@pytest.fixture(scope="module")
def hf_model(default_model_path):
    from gguf_oracle import hf_model_from_gguf

    return hf_model_from_gguf(default_model_path)


def _prompts(engine: LLMEngine) -> list[list[int]]:
    """32 chat prompts of mixed lengths (real text, so greedy choices are not near-ties on noise)."""
    rng = random.Random(0)
    words = "the paged cache stores keys and values in blocks of sixteen tokens each one".split()
    prompts = []
    for i in range(32):
        text = " ".join(rng.choice(words) for _ in range(rng.randint(2, 90)))
        prompts.append(engine.apply_chat_template([{"role": "user", "content": f"Summarize: {text}"}])[1])
    return prompts


def _run(engine: LLMEngine, prompts: list[list[int]]) -> list[list[int]]:
    params = SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS, ignore_eos=True)
    ids = [engine.add_request(None, p, params) for p in prompts]
    done = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                done[out.request_id] = out.outputs[0].token_ids
    assert engine.kv.num_used_blocks == 0
    return [done[i] for i in ids]


def test_32_mixed_requests_batched_equal_alone_and_transformers(engine, hf_model):
    prompts = _prompts(engine)
    batched = _run(engine, prompts)
    for i in (0, 13, 31):
        assert _run(engine, [prompts[i]]) == [batched[i]]
    for i, prompt in enumerate(prompts):
        with torch.no_grad():
            out = hf_model.generate(
                torch.tensor([prompt]), max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, do_sample=False,
                eos_token_id=None, pad_token_id=0,
            )
        assert batched[i] == out[0, len(prompt):].tolist(), f"request {i} differs from transformers"


@pytest.mark.parametrize(
    ("max_tokens", "ending"), [(1, ("", "length", None)), (2, ("", "length", None)), (3, ("", "stop", " "))]
)
def test_text_held_back_for_a_character_shows_only_once_the_character_is_whole(engine, max_tokens, ending):
    """The first token here is a space and the first bytes of an emoji, the third token ends the emoji. Cut before
    that, the output drops the space with the bytes, and the stop string " " never shows; with the whole
    character it does. vLLM 0.32 gives these three endings for this prompt."""
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, stop=[" "])
    engine.add_request("flush", "Emoji story: 🐶 🐱 🐭", params)
    done = []
    while engine.has_unfinished_requests():
        done += [o for o in engine.step() if o.finished]
    (completion,) = done[0].outputs
    assert (completion.text, completion.finish_reason, completion.stop_reason) == ending


def test_logprob_texts_join_into_the_text_where_characters_span_tokens(engine):
    """As vLLM's decoded_token: a token that leaves a character unfinished reads "", the one that finishes it the
    whole character, so a completion's entries (and a prompt's) join into its text."""
    prompt = engine.tokenizer.encode("Repeat: 你好世界 🚀🎉 café 日本語", add_special_tokens=False)
    params = SamplingParams(temperature=0.0, max_tokens=24, logprobs=2, prompt_logprobs=1)
    request_id = engine.add_request(None, prompt, params)
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished and out.request_id == request_id:
                final = out
    completion = final.outputs[0]
    texts = [entry[entry.token_id].decoded_token for entry in completion.logprobs]
    assert "".join(texts) == completion.text and "" in texts
    prompt_texts = [entry[entry.token_id].decoded_token for entry in final.prompt_logprobs[1:]]
    assert "".join(prompt_texts) == engine.tokenizer.decode(prompt[1:]) and "" in prompt_texts
