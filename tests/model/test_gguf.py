"""GGUF loading: names, dequantization and llama.cpp's Q/K reorder round-trip against the HF weights."""

import json

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as Q
from gguf_oracle import hf_model_from_gguf
from gguf_writer import write_gguf
from tiny import make_hf_model, make_tiny_tokenizer

from pagedllm.model.gguf_loader import permute_qk, unpermute_qk
from pagedllm.model.loader import load_model
from pagedllm.model.tokenizer import load_tokenizer

IDS = [5, 17, 200, 33, 9, 100, 101, 44, 45, 46, 47, 3]


def _logits(model, ids: list[int]) -> torch.Tensor:
    from pagedllm.attention import AttentionMetadata, allocate_kv_caches

    cfg = model.config
    caches = allocate_kv_caches(cfg.num_layers, 8, 4, cfg.num_kv_heads, cfg.head_dim, torch.float32)
    meta = AttentionMetadata.build([[6, 1, 3]], [0], [len(ids)], 4)
    with torch.inference_mode():
        return model.compute_logits(model(torch.tensor(ids), torch.arange(len(ids)), caches, meta))


def test_unpermute_inverts_permute():
    rows = np.arange(6 * 16 * 3, dtype=np.float32).reshape(6 * 16, 3)
    assert np.array_equal(unpermute_qk(permute_qk(rows, 6), 6), rows)
    assert not np.array_equal(permute_qk(rows, 6), rows)


ROPE_SCALINGS = [
    ("llama", {"rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                "original_max_position_embeddings": 32}}),  # a rope_freqs tensor
    ("llama", {"rope_scaling": {"rope_type": "linear", "factor": 4.0}}),
    ("qwen2", {"rope_scaling": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 128}}),
]  # fmt: skip


@pytest.mark.parametrize("model_type,overrides",
                         [("llama", {}), ("qwen2", {}), ("qwen3", {"head_dim": 32}),
                          ("llama", {"num_key_value_heads": 1}), *ROPE_SCALINGS])  # fmt: skip
def test_f32_gguf_equals_hf_weights(tmp_path, model_type, overrides):
    hf = make_hf_model(model_type, **overrides)
    model, config = load_model(write_gguf(hf, tmp_path / "m.gguf"))
    assert config.architecture == model_type and config.num_kv_heads == hf.config.num_key_value_heads
    theirs = hf.state_dict()
    for name, tensor in model.state_dict().items():
        assert torch.equal(tensor, theirs[name]), name
    with torch.no_grad():
        torch.testing.assert_close(_logits(model, IDS), hf(torch.tensor([IDS])).logits[0], atol=1e-4, rtol=0)


def test_a_gguf_filed_under_mistral_loads_as_one_filed_under_llama(tmp_path):
    hf = make_hf_model("mistral")
    model, config = load_model(write_gguf(hf, tmp_path / "m.gguf", arch="mistral"))
    assert config.architecture == "mistral"
    with torch.no_grad():
        torch.testing.assert_close(_logits(model, IDS), hf(torch.tensor([IDS])).logits[0], atol=1e-4, rtol=0)


def test_tied_embeddings_from_missing_output_tensor(tmp_path):
    hf = make_hf_model("llama", tie_word_embeddings=True)
    model, config = load_model(write_gguf(hf, tmp_path / "tied.gguf"))
    assert config.tie_word_embeddings
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()


@pytest.mark.parametrize("qtype", [Q.F16, Q.Q8_0])
def test_quantized_gguf_matches_transformers_gguf_reader(tmp_path, qtype):
    hf = make_hf_model("llama")
    path = write_gguf(hf, tmp_path / f"m-{qtype.name}.gguf", qtype)
    model, _ = load_model(path)
    oracle = hf_model_from_gguf(path)
    with torch.no_grad():
        torch.testing.assert_close(_logits(model, IDS), oracle(torch.tensor([IDS])).logits[0], atol=1e-4, rtol=0)
        # and the quantized model is still close to the float original
        ref = hf(torch.tensor([IDS])).logits[0]
        drift = (_logits(model, IDS) - ref).abs().max()
    print(f"{qtype.name}: max |logit drift| {drift:.4f} of max |logit| {ref.abs().max():.2f}")
    assert drift < 0.05 * ref.abs().max()  # Q8_0 measured 2.8%, F16 0.13%


@pytest.mark.parametrize("qtype", [Q.Q4_1, Q.Q8_0])
def test_block_types_dequantize_as_gguf_does_bit_for_bit(tmp_path, qtype):
    """Q4_1 and Q8_0 weights are dequantized from their blocks (faster than gguf.quants): the same floats."""
    from gguf import GGUFReader
    from gguf.quants import dequantize

    from pagedllm.model.gguf_loader import _restore_rows, hf_name, read_gguf

    path = write_gguf(make_hf_model("llama"), tmp_path / "m.gguf", qtype)
    config, state_dict = read_gguf(path)
    checked = 0
    for tensor in GGUFReader(path).tensors:
        if tensor.tensor_type == qtype:
            expected = dequantize(tensor.data, qtype).reshape(tuple(reversed(tensor.shape.tolist())))
            name = hf_name(tensor.name)
            assert np.array_equal(state_dict[name].numpy(), _restore_rows(name, expected, config)), name
            checked += 1
    assert checked > 0


def test_bfloat16_load(tmp_path):
    hf = make_hf_model("llama")
    model, _ = load_model(write_gguf(hf, tmp_path / "m.gguf"), torch.bfloat16)
    assert all(p.dtype == torch.bfloat16 for p in model.parameters())
    with torch.no_grad():
        ref = hf(torch.tensor([IDS])).logits[0]
    assert (_logits_bf16(model) - ref).abs().max() < 0.15 * ref.abs().max()


def _logits_bf16(model) -> torch.Tensor:
    from pagedllm.attention import AttentionMetadata, allocate_kv_caches

    cfg = model.config
    caches = allocate_kv_caches(cfg.num_layers, 8, 4, cfg.num_kv_heads, cfg.head_dim, torch.bfloat16)
    meta = AttentionMetadata.build([[6, 1, 3]], [0], [len(IDS)], 4)
    with torch.inference_mode():
        return model.compute_logits(model(torch.tensor(IDS), torch.arange(len(IDS)), caches, meta))


def test_a_damaged_cached_tokenizer_is_built_again(tmp_path, monkeypatch):
    monkeypatch.setenv("PAGEDLLM_CACHE_DIR", str(tmp_path / "cache"))
    reference = make_tiny_tokenizer()
    path = write_gguf(make_hf_model("llama"), tmp_path / "tok.gguf", tokenizer=reference)
    load_tokenizer(path)
    (entry,) = (tmp_path / "cache" / "tokenizers").iterdir()
    (entry / "tokenizer.json").write_text("{not json")
    assert load_tokenizer(path)("Hello!").input_ids == reference("Hello!").input_ids
    assert json.loads((entry / "tokenizer.json").read_text())  # rebuilt in place


@pytest.mark.parametrize("model_type", ["llama", "qwen2"])
def test_tokenizer_built_from_gguf_and_cached(tmp_path, monkeypatch, model_type):
    from transformers import AutoTokenizer

    monkeypatch.setenv("PAGEDLLM_CACHE_DIR", str(tmp_path / "cache"))
    reference = make_tiny_tokenizer()
    path = write_gguf(make_hf_model(model_type), tmp_path / "tok.gguf", tokenizer=reference)
    first = load_tokenizer(path)
    assert list((tmp_path / "cache" / "tokenizers").iterdir())  # converted once, then reused
    second = load_tokenizer(path)
    text = "Each sequence owns a block table. Hello!"
    assert first(text).input_ids == second(text).input_ids == reference(text).input_ids
    # combining marks: the cached copy once came back as Qwen2's class with an NFC normalizer of its own
    combining = "cafe\u0301 e\u0301"
    from_gguf = AutoTokenizer.from_pretrained(tmp_path, gguf_file="tok.gguf")(combining).input_ids
    assert first(combining).input_ids == second(combining).input_ids == from_gguf
    msgs = [{"role": "user", "content": "hi"}]
    assert second.apply_chat_template(msgs, tokenize=False) == reference.apply_chat_template(msgs, tokenize=False)
