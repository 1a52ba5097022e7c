"""The real default model (SmolLM2-135M-Instruct Q4_1 GGUF) against transformers reading the same file."""

import pytest
import torch
from gguf_oracle import hf_model_from_gguf
from greedy import greedy_paged, hf_greedy

from pagedllm.engine.model_runner import ModelRunner, SeqInput
from pagedllm.model.loader import load_model
from pagedllm.model.tokenizer import load_tokenizer

pytestmark = pytest.mark.slow

QUESTIONS = ["What is the capital of France?", "Write a haiku about memory pages.", "Count from one to ten."]
NEW_TOKENS = 64
# fp32, same dequantized weights; differences are summation order only (measured max |diff| ~1e-4 on logits ~40)
LOGIT_ATOL = 1e-3


@pytest.fixture(scope="module")
def models(default_model_path):
    ours, config = load_model(default_model_path, torch.float32)
    return ours, config, hf_model_from_gguf(default_model_path)


@pytest.fixture(scope="module")
def prompts(default_model_path):
    tokenizer = load_tokenizer(default_model_path)
    return [_chat_ids(tokenizer, q) for q in QUESTIONS]


def _chat_ids(tokenizer, question: str) -> list[int]:
    ids = tokenizer.apply_chat_template([{"role": "user", "content": question}], add_generation_prompt=True)
    return list(ids["input_ids"] if hasattr(ids, "keys") else ids)


def test_config_is_smollm2(models):
    _, config, _ = models
    assert (config.num_layers, config.num_heads, config.num_kv_heads, config.head_dim) == (30, 9, 3, 64)
    assert config.vocab_size == 49152 and config.tie_word_embeddings


def test_weights_equal_transformers_dequantization(models):
    ours, _, hf = models
    theirs = hf.state_dict()
    for name, tensor in ours.state_dict().items():
        assert torch.equal(tensor, theirs[name]), name


def test_prefill_logits_close(models, prompts):
    ours, config, hf = models
    runner = ModelRunner(ours, config, num_blocks=64, block_size=16, dtype=torch.float32)
    tables = [[3 * i + 2, 3 * i, 3 * i + 1] for i in range(len(prompts))]
    logits = runner.execute([SeqInput(p, 0, t) for p, t in zip(prompts, tables)])
    with torch.no_grad():
        ref = torch.stack([hf(torch.tensor([p])).logits[0, -1] for p in prompts])
    print(f"fp32 prefill: max |logit diff| {(logits - ref).abs().max():.2e}, max |logit| {ref.abs().max():.1f}")
    torch.testing.assert_close(logits, ref, atol=LOGIT_ATOL, rtol=0)


def test_batched_greedy_equals_transformers_generate(models, prompts):
    ours, config, hf = models
    runner = ModelRunner(ours, config, num_blocks=64, block_size=16, dtype=torch.float32)
    got = greedy_paged(runner, prompts, NEW_TOKENS, prefill_chunk=16)
    assert got == [hf_greedy(hf, p, NEW_TOKENS) for p in prompts]


def test_bfloat16_agrees_on_the_next_token(default_model_path, models, prompts):
    model, config = load_model(default_model_path, torch.bfloat16)
    runner = ModelRunner(model, config, num_blocks=64, block_size=16, dtype=torch.bfloat16)
    logits = runner.execute([SeqInput(p, 0, [3 * i + 2, 3 * i + 1, 3 * i]) for i, p in enumerate(prompts)])
    with torch.no_grad():
        ref = torch.stack([models[2](torch.tensor([p])).logits[0, -1] for p in prompts])
    print(f"bf16 prefill: max |logit diff| vs fp32 transformers {(logits - ref).abs().max():.3f}")
    assert logits.argmax(-1).tolist() == ref.argmax(-1).tolist()
