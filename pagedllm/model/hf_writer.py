"""Write a loaded model as a Hugging Face directory that transformers and vLLM load as is."""

import json
from pathlib import Path
from typing import Any

import torch

from pagedllm.model.config import ModelConfig
from pagedllm.model.hf_config import to_hf_dict
from pagedllm.model.hf_loader import INDEX_NAME, SAMPLING_KEYS


def save_hf_dir(model: torch.nn.Module, config: ModelConfig, out: Path, tokenizer: Any | None = None) -> list[Path]:
    """config.json, generation_config.json, model.safetensors (+ tokenizer files); returns the files written.
    Weights of a model that was in `out` before (other shards, their index) are removed, since a loader would
    read them instead; config.json comes last, so that a conversion that failed midway leaves none."""
    from safetensors.torch import save_file

    hf_config = to_hf_dict(config)  # first: a config that config.json cannot hold leaves nothing written
    out.mkdir(parents=True, exist_ok=True)
    _remove_old_weights(out)
    # clone: fused q/k/v and gate/up parameters are views into one tensor, which safetensors refuses
    tensors = {k: v.clone() for k, v in model.state_dict().items()}
    if config.tie_word_embeddings:
        tensors.pop("lm_head.weight", None)  # shared with embed_tokens; safetensors stores no aliases
    written = [out / "model.safetensors", out / "generation_config.json"]
    save_file(tensors, written[0], metadata={"format": "pt"})
    _write_json(written[1], _generation_config(config, tokenizer))
    if tokenizer is not None:
        written += [Path(p) for p in tokenizer.save_pretrained(out) if Path(p).is_file()]
    written.append(out / "config.json")
    _write_json(written[-1], hf_config | {"torch_dtype": _dtype_name(next(iter(tensors.values())).dtype)})
    return sorted(set(written))


def _remove_old_weights(out: Path) -> None:
    for old in [*out.glob("*.safetensors"), out / INDEX_NAME, out / "config.json"]:
        old.unlink(missing_ok=True)


def _generation_config(config: ModelConfig, tokenizer: Any | None) -> dict[str, Any]:
    eos = list(config.eos_token_ids)
    tok_eos = getattr(tokenizer, "eos_token_id", None)
    if tok_eos is not None and tok_eos not in eos:
        eos.append(tok_eos)
    sampling = {key: config.sampling_defaults[name] for key, name in SAMPLING_KEYS.items()
                if name in config.sampling_defaults}
    return {"bos_token_id": config.bos_token_id, "eos_token_id": eos[0] if len(eos) == 1 else eos or None,
            **sampling}


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _write_json(path: Path, data: dict[str, Any]) -> None:
    path.write_text(json.dumps(data, indent=2) + "\n")
