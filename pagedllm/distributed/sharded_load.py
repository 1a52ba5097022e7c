"""Load one rank's slices of a model: from safetensors only the slices (never the whole tensor), from GGUF
dequantized once, then sliced."""

from pathlib import Path

import torch

from pagedllm.distributed.sharding import Shard, SliceSpec, check_shardable, local_config, slice_spec
from pagedllm.model.config import ModelConfig
from pagedllm.model.llama import LlamaForCausalLM
from pagedllm.model.loader import build_model, existing_model_path


def read_model_config(path: str | Path) -> ModelConfig:
    """The model's config alone (cheap for an HF directory; GGUF reads only its metadata)."""
    path = existing_model_path(path)
    if path.is_dir():
        from pagedllm.model.hf_loader import read_hf_config

        return read_hf_config(path)
    from pagedllm.model.gguf_loader import open_gguf, read_gguf_config

    return read_gguf_config(open_gguf(path), path)


def load_shard(
    path: str | Path, dtype: torch.dtype, shard: Shard, device: torch.device | str = "cpu"
) -> tuple[LlamaForCausalLM, ModelConfig]:
    """This rank's model (local shapes, weights cast to `dtype` on `device`) and the full model's config."""
    path = existing_model_path(path)
    if path.is_dir():
        from pagedllm.model.hf_loader import read_hf_config

        config = read_hf_config(path)
        check_shardable(config, shard.size)
        tensors = _read_hf_slices(path, config, shard)
    else:
        from pagedllm.model.gguf_loader import read_gguf

        config, whole = read_gguf(path)
        check_shardable(config, shard.size)
        tensors = {name: take_slice(t, slice_spec(name, config, shard)) for name, t in whole.items()}
    model = build_model(local_config(config, shard.size), tensors, dtype, source=path, device=device)
    return model, config


def take_slice(tensor: torch.Tensor, spec: SliceSpec | None) -> torch.Tensor:
    if spec is None:
        return tensor
    return _pad(tensor.narrow(spec.dim, spec.start, spec.stop - spec.start), spec)


def _read_hf_slices(path: Path, config: ModelConfig, shard: Shard) -> dict[str, torch.Tensor]:
    from safetensors import safe_open

    from pagedllm.model.hf_loader import reading_safetensors, safetensors_files

    tensors: dict[str, torch.Tensor] = {}
    for file in safetensors_files(path):
        with reading_safetensors(file), safe_open(file, framework="pt") as f:
            for name in f.keys():
                tensors[name] = _read_slice(f, name, slice_spec(name, config, shard))
    return tensors


def _read_slice(f, name: str, spec: SliceSpec | None) -> torch.Tensor:
    if spec is None:
        return f.get_tensor(name)
    part = f.get_slice(name)
    window = slice(spec.start, spec.stop)
    return _pad(part[window] if spec.dim == 0 else part[:, window], spec)


def _pad(tensor: torch.Tensor, spec: SliceSpec) -> torch.Tensor:
    missing = spec.padded_len - tensor.shape[spec.dim]
    if missing == 0:
        return tensor.contiguous()
    shape = list(tensor.shape)
    shape[spec.dim] = missing
    return torch.cat([tensor, tensor.new_zeros(shape)], dim=spec.dim)
