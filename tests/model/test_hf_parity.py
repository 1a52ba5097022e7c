"""The paged model against transformers on tiny random-weight models: same weights, same logits, same tokens."""

import pytest
import torch
from greedy import greedy_paged, hf_greedy
from tiny import TINY_VOCAB, save_tiny_dir

from pagedllm.attention import AttentionMetadata, allocate_kv_caches
from pagedllm.engine.model_runner import ModelRunner
from pagedllm.model.loader import load_model

VARIANTS = {
    "llama_gqa": ("llama", {}),
    "qwen2_bias": ("qwen2", {"num_attention_heads": 4, "num_key_value_heads": 2}),
    "llama3_rope_scaling": (
        "llama",
        {"rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                          "high_freq_factor": 4.0, "original_max_position_embeddings": 32}},
    ),  # fmt: skip
    "linear_rope_scaling": ("llama", {"rope_scaling": {"rope_type": "linear", "factor": 4.0}}),
    "yarn_rope_scaling": ("qwen2", {"rope_scaling": {"rope_type": "yarn", "factor": 4.0,
                                                     "original_max_position_embeddings": 128, "beta_fast": 8.0}}),
    "qwen3_qk_norm": ("qwen3", {"head_dim": 32, "num_key_value_heads": 1, "tie_word_embeddings": True}),
    "mqa_tied": ("llama", {"num_attention_heads": 4, "num_key_value_heads": 1, "tie_word_embeddings": True}),
    "mistral": ("mistral", {"sliding_window": None}),
}
PROMPTS = [[5, 17, 200, 33, 9, 100, 101], [3], [44, 45, 46, 47, 48, 49, 50, 51, 52, 53, 54, 55, 56, 57], [9, 8]]
NEW_TOKENS = 64


IMPLS = ("auto", "reference", "blockwise")
GREEDY_CASES = [(v, i) for v in VARIANTS for i in IMPLS]


@pytest.fixture(scope="module", params=list(VARIANTS))
def variant(request, tmp_path_factory):
    model_type, overrides = VARIANTS[request.param]
    path = save_tiny_dir(tmp_path_factory.mktemp(request.param), model_type, **overrides)
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    return path, hf


_expected: dict[str, list[list[int]]] = {}


def _hf_tokens(name: str, hf) -> list[list[int]]:
    if name not in _expected:
        _expected[name] = [hf_greedy(hf, p, NEW_TOKENS) for p in PROMPTS]
    return _expected[name]


def test_config_matches_variant(variant):
    path, hf = variant
    _, config = load_model(path)
    assert config.num_kv_heads == hf.config.num_key_value_heads
    assert config.attention_bias == (hf.config.model_type == "qwen2")
    assert config.tie_word_embeddings == hf.config.tie_word_embeddings


def test_prefill_logits_match_transformers(variant):
    path, hf = variant
    model, config = load_model(path, torch.float32)
    ids = PROMPTS[2] + PROMPTS[0]
    caches = allocate_kv_caches(config.num_layers, 16, 4, config.num_kv_heads, config.head_dim, torch.float32)
    meta = AttentionMetadata.build([[9, 2, 14, 0, 5, 11]], [0], [len(ids)], 4)
    with torch.inference_mode():
        ours = model.compute_logits(model(torch.tensor(ids), torch.arange(len(ids)), caches, meta))
        ref = hf(torch.tensor([ids])).logits[0]
    assert ours.shape == (len(ids), TINY_VOCAB)
    torch.testing.assert_close(ours, ref, atol=1e-4, rtol=0)


@pytest.mark.parametrize("name,impl", GREEDY_CASES)
def test_batched_paged_greedy_matches_generate(name, impl, tmp_path_factory):
    model_type, overrides = VARIANTS[name]
    path = save_tiny_dir(tmp_path_factory.mktemp(name), model_type, **overrides)
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    model, config = load_model(path, torch.float32)
    runner = ModelRunner(model, config, num_blocks=96, block_size=4, dtype=torch.float32, attention_impl=impl)
    assert greedy_paged(runner, PROMPTS, NEW_TOKENS) == _hf_tokens(name, hf)


def test_sharded_bf16_checkpoint_loads_and_casts(tmp_path):
    from tiny import make_hf_model

    hf = make_hf_model("llama").to(torch.bfloat16)
    hf.save_pretrained(tmp_path, max_shard_size="100KB")
    assert (tmp_path / "model.safetensors.index.json").is_file() and len(list(tmp_path.glob("*.safetensors"))) > 1
    for dtype in (torch.float32, torch.bfloat16):
        model, _ = load_model(tmp_path, dtype)
        theirs = hf.state_dict()
        for name, tensor in model.state_dict().items():
            assert tensor.dtype == dtype and torch.equal(tensor.to(torch.bfloat16), theirs[name]), name
