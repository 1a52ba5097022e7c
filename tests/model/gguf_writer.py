"""Write a tiny HF model as a GGUF file the way llama.cpp's converter does (names, Q/K row reorder, metadata)."""

from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType, GGUFWriter
from gguf.quants import quantize

from pagedllm.model.gguf_loader import gguf_name, permute_qk


def write_gguf(hf_model, path: Path, qtype: GGMLQuantizationType = GGMLQuantizationType.F32, tokenizer=None,
               arch: str | None = None, rope_freqs: np.ndarray | None = None) -> Path:
    """2-D weights stored as `qtype` (F32, F16 or a quantized type such as Q8_0); norms and biases as F32. `arch`:
    the file's general.architecture (by default llama's, where llama.cpp files Mistral too; qwen2's own);
    `rope_freqs`: a rope_freqs tensor of one's own."""
    cfg = hf_model.config
    arch = arch or (cfg.model_type if cfg.model_type in ("qwen2", "qwen3") else "llama")
    writer = GGUFWriter(path, arch)
    _write_metadata(writer, cfg)
    if tokenizer is not None:
        _write_tokenizer(writer, tokenizer)
    _write_rope_scaling(writer, hf_model)
    if rope_freqs is not None:
        writer.add_tensor("rope_freqs.weight", rope_freqs.astype(np.float32))
    for name, tensor in hf_model.state_dict().items():
        if name == "lm_head.weight" and cfg.tie_word_embeddings:
            continue
        array = tensor.float().numpy()
        permuted = arch not in ("qwen2", "qwen3")  # llama.cpp's rotary layout for the Llama family
        if permuted and ".q_proj." in name:
            array = permute_qk(array, cfg.num_attention_heads)
        elif permuted and ".k_proj." in name:
            array = permute_qk(array, cfg.num_key_value_heads)
        _add(writer, gguf_name(name), array, qtype if array.ndim == 2 else GGMLQuantizationType.F32)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def _add(writer: GGUFWriter, name: str, array: np.ndarray, qtype: GGMLQuantizationType) -> None:
    if qtype == GGMLQuantizationType.F32:
        writer.add_tensor(name, np.ascontiguousarray(array, np.float32))
    elif qtype == GGMLQuantizationType.F16:
        writer.add_tensor(name, array.astype(np.float16))
    else:
        data = quantize(np.ascontiguousarray(array, np.float32), qtype)
        writer.add_tensor(name, data, raw_shape=data.shape, raw_dtype=qtype)


def _write_metadata(writer: GGUFWriter, cfg) -> None:
    writer.add_name("tiny-test-model")
    writer.add_block_count(cfg.num_hidden_layers)
    writer.add_context_length(cfg.max_position_embeddings)
    writer.add_embedding_length(cfg.hidden_size)
    writer.add_feed_forward_length(cfg.intermediate_size)
    writer.add_head_count(cfg.num_attention_heads)
    writer.add_head_count_kv(cfg.num_key_value_heads)
    writer.add_rope_freq_base(cfg.rope_parameters["rope_theta"])
    writer.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    writer.add_vocab_size(cfg.vocab_size)
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    writer.add_rope_dimension_count(head_dim)
    writer.add_key_length(head_dim)
    writer.add_value_length(head_dim)
    writer.add_bos_token_id(cfg.bos_token_id)
    writer.add_eos_token_id(cfg.eos_token_id)


def _write_rope_scaling(writer: GGUFWriter, hf_model) -> None:
    """As llama.cpp's converter writes them: llama3 as a rope_freqs tensor of per-frequency divisors (transformers'
    plain frequencies over its scaled ones), linear and yarn as metadata."""
    from gguf import RopeScalingType
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    cfg = hf_model.config
    rope = cfg.rope_parameters
    kind = rope["rope_type"]
    if kind == "llama3":
        scaled, _ = ROPE_INIT_FUNCTIONS["llama3"](cfg, "cpu")
        exponents = np.arange(0, cfg.head_dim, 2, dtype=np.int64).astype(np.float32) / cfg.head_dim
        plain = 1.0 / (rope["rope_theta"] ** exponents)
        writer.add_tensor("rope_freqs.weight", (plain / scaled.numpy()).astype(np.float32))
    elif kind in ("linear", "yarn"):
        writer.add_rope_scaling_type(RopeScalingType.LINEAR if kind == "linear" else RopeScalingType.YARN)
        writer.add_rope_scaling_factor(rope["factor"])
        if kind == "yarn":
            writer.add_rope_scaling_orig_ctx_len(rope["original_max_position_embeddings"])
    elif kind != "default":
        raise ValueError(f"no GGUF form for rope scaling {kind!r}")


def _write_tokenizer(writer: GGUFWriter, tokenizer) -> None:
    """A byte-level BPE vocabulary in llama.cpp's "gpt2" tokenizer form."""
    import json

    model = json.loads(tokenizer.backend_tokenizer.to_str())["model"]
    tokens = [t for t, _ in sorted(model["vocab"].items(), key=lambda kv: kv[1])]
    merges = [m if isinstance(m, str) else " ".join(m) for m in model["merges"]]
    specials = set(tokenizer.all_special_tokens)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_types([3 if t in specials else 1 for t in tokens])  # 3 = control, 1 = normal
    writer.add_token_merges(merges)
    if tokenizer.chat_template:
        writer.add_chat_template(tokenizer.chat_template)
