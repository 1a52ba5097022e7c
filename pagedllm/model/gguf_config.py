"""ModelConfig from GGUF metadata (llama.cpp's key names, e.g. `llama.block_count`)."""

from typing import Any

from pagedllm.errors import ModelLoadError
from pagedllm.model.config import SUPPORTED_ARCHITECTURES, ModelConfig
from pagedllm.model.config_reader import ConfigReader
from pagedllm.model.rope import FrequencyFactorsRope, LinearRope, RopeScaling, YarnRope, yarn_attention_factor

# llama.cpp's YaRN settings beyond factor, original context and betas (DeepSeek's and others' variants)
_YARN_VARIANT_KEYS = ("attn_factor", "yarn_attn_factor", "yarn_log_multiplier", "yarn_ext_factor")


def config_from_gguf_metadata(meta: dict[str, Any], rope_freqs: tuple[float, ...] | None = None) -> ModelConfig:
    """From GGUF key/values (already decoded to Python values), e.g. `llama.block_count`; `rope_freqs`: the file's
    rope_freqs tensor, if it has one."""
    arch = meta.get("general.architecture")
    if arch not in SUPPORTED_ARCHITECTURES:
        supported = ", ".join(sorted(SUPPORTED_ARCHITECTURES))
        raise ModelLoadError(f"unsupported GGUF architecture {arch!r}; supported: {supported}")

    read = ConfigReader(meta, "GGUF metadata")
    num_heads = read.int(f"{arch}.attention.head_count")
    hidden = read.int(f"{arch}.embedding_length")
    head_dim = read.int(f"{arch}.attention.key_length", hidden // max(num_heads, 1))
    if read.int(f"{arch}.rope.dimension_count", head_dim) != head_dim:
        raise ModelLoadError(f"GGUF metadata: rotary over {meta[f'{arch}.rope.dimension_count']} of the head's "
                             f"{head_dim} dimensions is not supported")
    if rope_freqs is not None and len(rope_freqs) != head_dim // 2:
        raise ModelLoadError(f"rope_freqs holds {len(rope_freqs)} factors; the head's rotary has {head_dim // 2} "
                             "frequencies")
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
        rope_scaling=_gguf_rope_scaling(meta, arch, read, rope_freqs),
        max_position_embeddings=read.int(f"{arch}.context_length", 2048),
        tie_word_embeddings=False,  # the loader sets this when the file has no output.weight
        attention_bias=SUPPORTED_ARCHITECTURES[arch],
        sliding_window=read.int(f"{arch}.attention.sliding_window", None),
        bos_token_id=read.int("tokenizer.ggml.bos_token_id", None),
        eos_token_ids=read.int_list("tokenizer.ggml.eos_token_id"),
    )


def _gguf_rope_scaling(meta: dict[str, Any], arch: str, read: ConfigReader,
                       rope_freqs: tuple[float, ...] | None) -> RopeScaling | None:
    """As llama.cpp reads it: per-frequency factors from a rope_freqs tensor (Llama 3.1+), or `rope.scaling.type`
    linear (also a factor given without a type, or the older `rope.scale_linear`) or yarn."""
    kind = read.str(f"{arch}.rope.scaling.type", None)
    factor = _gguf_rope_factor(arch, read)
    if kind in (None, "none") and factor == 1.0:
        return None if rope_freqs is None or set(rope_freqs) == {1.0} else FrequencyFactorsRope(rope_freqs)
    if rope_freqs is not None:
        raise ModelLoadError(f"GGUF metadata: a rope_freqs tensor together with rope scaling {kind or 'linear'!r} is "
                             "not supported")
    if kind in (None, "linear"):
        return LinearRope(factor)
    if kind != "yarn":
        raise ModelLoadError(f"unsupported GGUF rope scaling {kind!r}; supported: linear, yarn")
    if variant := [key for key in _YARN_VARIANT_KEYS if f"{arch}.rope.scaling.{key}" in meta]:
        raise ModelLoadError(f"GGUF metadata: unsupported yarn rope scaling setting {arch}.rope.scaling.{variant[0]}")
    original = read.int(f"{arch}.rope.scaling.original_context_length", read.int(f"{arch}.context_length", 2048))
    beta_fast = read.float(f"{arch}.rope.scaling.yarn_beta_fast", 32.0)
    beta_slow = read.float(f"{arch}.rope.scaling.yarn_beta_slow", 1.0)
    return YarnRope(factor, original, yarn_attention_factor(factor), beta_fast, beta_slow)


def _gguf_rope_factor(arch: str, read: ConfigReader) -> float:
    """llama.cpp's rope scaling factor: `rope.scaling.factor`, else the older `rope.scale_linear` (0 reads as
    not set); 1 where neither is."""
    for key in ("rope.scaling.factor", "rope.scale_linear"):
        factor = read.float(f"{arch}.{key}", 0.0)
        if factor not in (0.0, 1.0):
            return factor
    return 1.0
