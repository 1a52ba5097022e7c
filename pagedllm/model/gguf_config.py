"""ModelConfig from GGUF metadata (llama.cpp's key names, e.g. `llama.block_count`)."""

from typing import Any

from pagedllm.errors import ModelLoadError
from pagedllm.model.config import SUPPORTED_ARCHITECTURES, ModelConfig
from pagedllm.model.config_reader import ConfigReader


def config_from_gguf_metadata(meta: dict[str, Any]) -> ModelConfig:
    """From GGUF key/values (already decoded to Python values), e.g. `llama.block_count`."""
    arch = meta.get("general.architecture")
    if arch not in SUPPORTED_ARCHITECTURES:
        supported = ", ".join(sorted(SUPPORTED_ARCHITECTURES))
        raise ModelLoadError(f"unsupported GGUF architecture {arch!r}; supported: {supported}")

    read = ConfigReader(meta, "GGUF metadata")
    _check_gguf_rope(meta, arch, read)
    num_heads = read.int(f"{arch}.attention.head_count")
    hidden = read.int(f"{arch}.embedding_length")
    head_dim = read.int(f"{arch}.attention.key_length", hidden // max(num_heads, 1))
    if read.int(f"{arch}.rope.dimension_count", head_dim) != head_dim:
        raise ModelLoadError(f"GGUF metadata: rotary over {meta[f'{arch}.rope.dimension_count']} of the head's "
                             f"{head_dim} dimensions is not supported")
    return ModelConfig(
        architecture=arch,
        vocab_size=read.int(f"{arch}.vocab_size", len(meta.get("tokenizer.ggml.tokens") or [])),
        hidden_size=hidden,
        intermediate_size=read.int(f"{arch}.feed_forward_length"),
        num_layers=read.int(f"{arch}.block_count"),
        num_heads=num_heads,
        num_kv_heads=read.int(f"{arch}.attention.head_count_kv", num_heads),
        head_dim=head_dim,
        rms_norm_eps=read.float(f"{arch}.attention.layer_norm_rms_epsilon", 1e-5),
        rope_theta=read.float(f"{arch}.rope.freq_base", 10000.0),
        max_position_embeddings=read.int(f"{arch}.context_length", 2048),
        tie_word_embeddings=False,  # the loader sets this when the file has no output.weight
        attention_bias=SUPPORTED_ARCHITECTURES[arch],
        sliding_window=read.int(f"{arch}.attention.sliding_window", None),
        bos_token_id=read.int("tokenizer.ggml.bos_token_id", None),
        eos_token_ids=read.int_list("tokenizer.ggml.eos_token_id"),
    )


def _check_gguf_rope(meta: dict[str, Any], arch: str, read: ConfigReader) -> None:
    """No rope scaling: llama.cpp takes a scaling factor without a type as linear scaling, which pagedllm has not."""
    scaling = meta.get(f"{arch}.rope.scaling.type")
    if scaling not in (None, "none"):
        raise ModelLoadError(f"unsupported GGUF rope scaling {scaling!r}")
    for key in (f"{arch}.rope.scaling.factor", f"{arch}.rope.scale_linear"):
        factor = read.float(key, 1.0)
        if scaling is None and factor not in (0.0, 1.0):  # llama.cpp reads 0 as "not set"
            raise ModelLoadError(f"unsupported GGUF rope scaling: {key} = {factor} (linear scaling)")
