"""transformers' own GGUF reading (dequantize + its Q/K un-permutation) as the oracle for our GGUF loader.

AutoModelForCausalLM.from_pretrained(dir, gguf_file=...) needs `accelerate`, which the project does not
depend on; this goes one level lower through the same transformers code path, without it.
"""

from pathlib import Path

import torch


def hf_model_from_gguf(path: Path):
    from transformers import AutoConfig, AutoModelForCausalLM
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    config = AutoConfig.from_pretrained(path.parent, gguf_file=path.name)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    tensors = load_gguf_checkpoint(str(path), return_tensors=True, model_to_load=model)["tensors"]
    missing, unexpected = model.load_state_dict(tensors, strict=False)
    assert not unexpected and set(missing) <= {"lm_head.weight"}, (missing, unexpected)
    model.tie_weights()
    return model.eval()
