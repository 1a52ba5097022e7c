"""Read a GGUF file (llama.cpp's format): metadata -> ModelConfig, tensors dequantized -> HF-named state dict."""

import re
from pathlib import Path
from typing import Any

import numpy as np
import torch

from pagedllm.errors import ModelLoadError
from pagedllm.model.config import ModelConfig, naming
from pagedllm.model.gguf_config import config_from_gguf_metadata
from pagedllm.model.gguf_file import GGUFFile, GGUFTensor
from pagedllm.model.stored_blocks import StoredBlocks

# GGUF tensor name -> HF name; "{n}" is the layer index.
_GLOBAL_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
_LAYER_NAMES = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    "attn_q_norm": "self_attn.q_norm",  # qwen3
    "attn_k_norm": "self_attn.k_norm",
}
_LAYER_RE = re.compile(r"blk\.(\d+)\.(\w+)\.(weight|bias)")
# llama.cpp permutes the Q/K rows of these architectures for its interleaved rotary; qwen2 and qwen3 it leaves alone.
_PERMUTED_ARCHS = ("llama", "mistral")
_ROPE_FREQS = "rope_freqs.weight"  # Llama 3.1+'s rope scaling as llama.cpp stores it: a divisor per frequency


def hf_name(gguf_name: str) -> str | None:
    if gguf_name in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[gguf_name]
    m = _LAYER_RE.fullmatch(gguf_name)
    if m and m.group(2) in _LAYER_NAMES:
        return f"model.layers.{m.group(1)}.{_LAYER_NAMES[m.group(2)]}.{m.group(3)}"
    return None


def gguf_name(hf: str) -> str:
    """Inverse of hf_name (used when writing GGUF files, e.g. in tests)."""
    inverse_global = {v: k for k, v in _GLOBAL_NAMES.items()}
    if hf in inverse_global:
        return inverse_global[hf]
    _, _, layer, rest = hf.split(".", 3)
    module, kind = rest.rsplit(".", 1)
    short = {v: k for k, v in _LAYER_NAMES.items()}[module]
    return f"blk.{layer}.{short}.{kind}"


def permute_qk(rows: np.ndarray, num_heads: int) -> np.ndarray:
    """llama.cpp's reorder: per head, rows [first half | second half] -> interleaved pairs. Leading dim = rows."""
    head_rows = rows.shape[0] // num_heads
    return rows.reshape(num_heads, 2, head_rows // 2, *rows.shape[1:]).swapaxes(1, 2).reshape(rows.shape)


def unpermute_qk(rows: np.ndarray, num_heads: int) -> np.ndarray:
    """Inverse of permute_qk: interleaved pairs back to HF's half-split rotary layout."""
    head_rows = rows.shape[0] // num_heads
    return rows.reshape(num_heads, head_rows // 2, 2, *rows.shape[1:]).swapaxes(1, 2).reshape(rows.shape)


def read_gguf(path: Path) -> tuple[ModelConfig, dict[str, torch.Tensor]]:
    config, state_dict, _ = read_gguf_with_blocks(path, keep_blocks=False)
    return config, state_dict


def read_gguf_with_blocks(
    path: Path, keep_blocks: bool = True
) -> tuple[ModelConfig, dict[str, torch.Tensor], dict[str, StoredBlocks]]:
    """read_gguf, and (keep_blocks) the blocks of every weight stored as Q4_1 or Q8_0 (HF names, rows in HF
    order)."""
    from gguf import GGMLQuantizationType as Q

    reader = open_gguf(path)
    config = read_gguf_config(reader, Path(path))
    state_dict: dict[str, torch.Tensor] = {}
    blocks: dict[str, StoredBlocks] = {}
    for tensor in reader.tensors:
        name = hf_name(tensor.name)
        if tensor.name == _ROPE_FREQS:
            continue  # in the config
        if name is None:
            raise ModelLoadError(f"{path}: unsupported tensor {tensor.name!r} for architecture {config.architecture}")
        kind = {Q.Q4_1: "q4_1", Q.Q8_0: "q8_0"}.get(tensor.tensor_type)
        if kind is not None and len(tensor.shape) == 2:  # the blocks' own dequantization: gguf's, in half the time
            stored = StoredBlocks.from_gguf(tensor.data, kind, tensor.shape[1], tensor.shape[0])
            array = stored.dequantized().numpy()
            if keep_blocks:
                blocks[name] = stored.take_rows(_restore_rows(name, np.arange(array.shape[0]), config))
        else:
            array = dequantize(tensor, path)
        state_dict[name] = torch.from_numpy(_restore_rows(name, array, config))
    return config, state_dict, blocks


def read_gguf_config(reader: GGUFFile, path: Path) -> ModelConfig:
    """The model's config from the file's metadata, its rope_freqs tensor and whether it has an output tensor."""
    tensors = {t.name: t for t in reader.tensors}
    rope_freqs = None
    if _ROPE_FREQS in tensors:
        factors = dequantize(tensors[_ROPE_FREQS], path).reshape(-1)
        rope_freqs = tuple(float(f) for f in factors)
    with naming(path):
        config = config_from_gguf_metadata(read_metadata(reader), rope_freqs)
    config.tie_word_embeddings = "output.weight" not in tensors
    return config


def open_gguf(path: Path) -> GGUFFile:
    with open(path, "rb") as f:
        if f.read(4) != b"GGUF":
            raise ModelLoadError(f"{path} is not a GGUF file (no GGUF magic) and not a model directory")
    try:
        reader = GGUFFile(path)
    except Exception as exc:  # ValueError, UnicodeDecodeError... on bad files
        size = path.stat().st_size
        raise ModelLoadError(
            f"{path} ({size} bytes) is a corrupt or truncated GGUF file; re-download it (reader said: {exc})"
        ) from None
    for tensor in reader.tensors:  # the reader does not check this, and a shifted tensor reads wrong values
        if (tensor.data_offset - reader.data_offset) % reader.alignment:
            raise ModelLoadError(f"{path}: tensor {tensor.name} is not aligned to {reader.alignment} bytes "
                                 "(a corrupt file)")
    return reader


def read_metadata(reader: GGUFFile) -> dict[str, Any]:
    """Scalar and string fields as Python values; arrays as lists except the big tokenizer tables (lengths)."""
    return {key: range(len(value)) if key.startswith("tokenizer.ggml.") and isinstance(value, list) else value
            for key, value in reader.metadata.items()}  # only the tables' lengths are needed here


def dequantize(tensor: GGUFTensor, path: Path) -> np.ndarray:
    """float32 array in PyTorch order [out, in] (GGUF lists dims innermost first)."""
    from gguf.quants import dequantize as gguf_dequantize

    shape = tuple(reversed(tensor.shape))
    try:
        array = gguf_dequantize(tensor.data, tensor.tensor_type).reshape(shape)
        return np.require(array, np.float32, ["C_CONTIGUOUS", "WRITEABLE"])  # F32 tensors arrive as read-only views
    except (NotImplementedError, ValueError) as exc:
        raise ModelLoadError(f"{path}: cannot dequantize {tensor.name} ({tensor.tensor_type.name}): {exc}") from None


def _restore_rows(name: str, array: np.ndarray, config: ModelConfig) -> np.ndarray:
    if config.architecture not in _PERMUTED_ARCHS:
        return array
    if ".self_attn.q_proj." in name:
        return unpermute_qk(array, config.num_heads)
    if ".self_attn.k_proj." in name:
        return unpermute_qk(array, config.num_kv_heads)
    return array
