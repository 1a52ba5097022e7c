"""Read a local Hugging Face model directory: config.json + *.safetensors (sharded or not)."""

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

from pagedllm.checks import is_int
from pagedllm.errors import ModelLoadError
from pagedllm.model.config import ModelConfig, naming
from pagedllm.model.hf_config import from_hf_dict

INDEX_NAME = "model.safetensors.index.json"


def read_hf_dir(path: Path) -> tuple[ModelConfig, dict[str, torch.Tensor]]:
    config = read_hf_config(path)
    state_dict: dict[str, torch.Tensor] = {}
    for shard in safetensors_files(path):
        tensors = _read_safetensors(shard)
        if twice := sorted(state_dict.keys() & tensors.keys()):
            raise ModelLoadError(f"{path}: weights stored in more than one file: {', '.join(twice[:5])}")
        state_dict.update(tensors)
    return config, state_dict


# generation_config.json's keys that are sampling defaults, and their SamplingParams names (vLLM reads the same)
SAMPLING_KEYS = {"temperature": "temperature", "top_p": "top_p", "top_k": "top_k", "min_p": "min_p",
                 "repetition_penalty": "repetition_penalty", "presence_penalty": "presence_penalty",
                 "frequency_penalty": "frequency_penalty", "max_new_tokens": "max_tokens"}


def read_hf_config(path: Path) -> ModelConfig:
    """config.json's model, with generation_config.json's end-of-sequence ids added (instruct models list their
    turn-end tokens there, and transformers' generate stops at them) and its sampling settings as defaults."""
    hf_config = read_config_json(path)
    with naming(path / "config.json"):
        config = from_hf_dict(hf_config)
    if (path / "generation_config.json").is_file():
        generation = read_config_json(path, "generation_config.json")
        for token in _generation_eos(generation, path):
            if token not in config.eos_token_ids:
                config.eos_token_ids.append(token)
        if isinstance(generation, dict):
            config.sampling_defaults = {name: generation[key] for key, name in SAMPLING_KEYS.items()
                                        if generation.get(key) is not None}
    return config


def _generation_eos(generation: Any, path: Path) -> list[int]:
    value = generation.get("eos_token_id") if isinstance(generation, dict) else None
    values = [] if value is None else value if isinstance(value, list) else [value]
    if not all(is_int(v) and v >= 0 for v in values):
        raise ModelLoadError(f"{path / 'generation_config.json'}: eos_token_id must be an integer or a list of "
                             f"integers, got {value!r}")
    return values


def read_config_json(path: Path, name: str = "config.json") -> Any:
    config_path = path / name
    if not config_path.is_file():
        raise ModelLoadError(f"{path} has no {name} (expected a Hugging Face model directory)")
    try:
        return json.loads(config_path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ModelLoadError(f"{config_path} is not valid JSON: {exc}") from None


def safetensors_files(path: Path) -> list[Path]:
    """The shards named by the index when there is one, else every *.safetensors file."""
    index = path / INDEX_NAME
    if index.is_file():
        names = sorted(set(_weight_map(index).values()))
        files = [path / n for n in names]
        if missing := [f.name for f in files if not f.is_file()]:
            raise ModelLoadError(f"{path}: shards named in {INDEX_NAME} are missing: {', '.join(missing)}")
        return files
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise ModelLoadError(f"{path} has no *.safetensors weights (only safetensors checkpoints are supported)")
    return files


def _weight_map(index: Path) -> dict[str, str]:
    try:
        weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
    except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError) as exc:
        raise ModelLoadError(f"{index} is not a valid safetensors index: {exc!r}") from None
    if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
        raise ModelLoadError(f"{index} is not a valid safetensors index: weight_map must map names to files")
    folder = index.parent.resolve()
    if outside := sorted({f for f in weight_map.values() if folder not in (folder / f).resolve().parents}):
        raise ModelLoadError(f"{index} names shard files outside the model directory: {', '.join(outside)}")
    return weight_map


def _read_safetensors(file: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    with reading_safetensors(file):
        return load_file(file)


@contextmanager
def reading_safetensors(file: Path) -> Iterator[None]:
    """Inside: safetensors' errors about `file` become one ModelLoadError that names it."""
    from safetensors import SafetensorError

    try:
        yield
    except (SafetensorError, OSError, ValueError) as exc:
        raise ModelLoadError(f"{file} is not a readable safetensors file (corrupt or truncated?): {exc}") from None
