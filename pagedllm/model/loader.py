"""load_model(path, dtype): a local HF directory or a GGUF file -> (LlamaForCausalLM, ModelConfig)."""

import logging
from collections.abc import Mapping
from pathlib import Path

import torch

from pagedllm.errors import ModelLoadError
from pagedllm.model.config import ModelConfig
from pagedllm.model.llama import LlamaForCausalLM
from pagedllm.model.stored_blocks import EMPTY_BLOCKS, StoredBlocks

logger = logging.getLogger("pagedllm")

SUPPORTED_DTYPES = (torch.float32, torch.bfloat16)
# Keys some checkpoints carry that hold nothing we load (recomputed buffers).
_IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)


def load_model(
    path: str | Path, dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu"
) -> tuple[LlamaForCausalLM, ModelConfig]:
    """The model in eval mode with weights cast to `dtype` on `device`, and its config."""
    if dtype not in SUPPORTED_DTYPES:
        raise ModelLoadError(f"unsupported dtype {dtype}; supported: float32, bfloat16")
    path = existing_model_path(path)
    if path.is_dir():
        from pagedllm.model.hf_loader import read_hf_dir

        config, state_dict = read_hf_dir(path)
        return build_model(config, state_dict, dtype, source=path, device=device), config
    from pagedllm.model.gguf_loader import read_gguf_with_blocks

    config, state_dict, blocks = read_gguf_with_blocks(path, keep_blocks=_blocks_stream(dtype, device))
    return build_model(config, state_dict, dtype, source=path, device=device, blocks=blocks), config


def _blocks_stream(dtype: torch.dtype, device: torch.device | str) -> bool:
    """Whether the weights' stored blocks would be used: only the AMX matmul streams them (bfloat16, CPU)."""
    from pagedllm.model.projection import amx_matmul_kernels

    return dtype == torch.bfloat16 and torch.device(device).type == "cpu" and amx_matmul_kernels() is not None


def existing_model_path(path: str | Path) -> Path:
    """The path, if it names something to load (an HF directory or a GGUF file); else a clear error."""
    path = Path(path).expanduser()
    if not (path.is_dir() or path.is_file()):
        raise ModelLoadError(f"model path {path} does not exist (expected an HF directory or a .gguf file)")
    return path


def build_model(
    config: ModelConfig,
    state_dict: dict[str, torch.Tensor],
    dtype: torch.dtype,
    source: Path | str = "<memory>",
    device: torch.device | str = "cpu",
    blocks: Mapping[str, StoredBlocks] = EMPTY_BLOCKS,
) -> LlamaForCausalLM:
    """Instantiate without allocating (meta device), then adopt the given tensors cast to `dtype` on `device`.
    blocks: the stored blocks of the weights loaded from them (LlamaForCausalLM.fuse_projections)."""
    with torch.device("meta"):
        model = LlamaForCausalLM(config)
    expected = set(model.state_dict())
    if config.tie_word_embeddings:
        _drop_tied_head(state_dict, source)
        expected.discard("lm_head.weight")
    tensors = {k: v for k, v in state_dict.items() if not k.endswith(_IGNORED_SUFFIXES)}
    _check_names(expected, set(tensors), source)
    _check_shapes(model, tensors, source)
    _check_dtypes(tensors, source)
    model.load_state_dict(
        {k: v.to(device=device, dtype=dtype).contiguous() for k, v in tensors.items()}, strict=False, assign=True
    )
    model.rotary.inv_freq = model.rotary.inv_freq.to(device)  # a plain tensor, not a module buffer
    if config.tie_word_embeddings:
        model.lm_head.weight = model.model.embed_tokens.weight
    return model.eval().requires_grad_(False).fuse_projections(blocks)


def _drop_tied_head(state_dict: dict[str, torch.Tensor], source: Path | str) -> None:
    """With tie_word_embeddings the head is the embedding matrix (as in vLLM); a stored head that differs is
    dropped with a warning, since transformers would use it."""
    stored, embeddings = state_dict.pop("lm_head.weight", None), state_dict.get("model.embed_tokens.weight")
    if stored is not None and embeddings is not None and not torch.equal(stored, embeddings.to(stored.dtype)):
        logger.warning("%s: tie_word_embeddings is set but the stored lm_head.weight differs from the embeddings; "
                       "the embeddings are used as the head", source)


def _check_names(expected: set[str], found: set[str], source: Path | str) -> None:
    missing, unexpected = sorted(expected - found), sorted(found - expected)
    if missing:
        raise ModelLoadError(f"{source}: weights missing: {_some(missing)}")
    if unexpected:
        raise ModelLoadError(f"{source}: unexpected weights (unsupported model variant?): {_some(unexpected)}")


def _check_shapes(model: LlamaForCausalLM, tensors: dict[str, torch.Tensor], source: Path | str) -> None:
    own = model.state_dict()
    for name, tensor in tensors.items():
        if tuple(tensor.shape) != tuple(own[name].shape):
            raise ModelLoadError(
                f"{source}: weight {name} has shape {tuple(tensor.shape)}, config implies {tuple(own[name].shape)}"
            )


_WEIGHT_DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)


def _check_dtypes(tensors: dict[str, torch.Tensor], source: Path | str) -> None:
    """Quantized or integer checkpoints would be cast to float without their scales: refuse them."""
    for name, tensor in tensors.items():
        if tensor.dtype not in _WEIGHT_DTYPES:
            raise ModelLoadError(f"{source}: weight {name} is stored as {tensor.dtype} (quantized checkpoints are not "
                                 "supported; weights must be float32, float16, bfloat16 or float64)")


def _some(names: list[str], limit: int = 5) -> str:
    more = f" (+{len(names) - limit} more)" if len(names) > limit else ""
    return ", ".join(names[:limit]) + more
