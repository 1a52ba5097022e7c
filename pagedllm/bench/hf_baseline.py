"""The baseline users would pick instead: Hugging Face transformers `generate` with static batches.

The HF model is built from pagedllm's own loaded weights (same values, same dtype), so both sides run
the very same numbers. Each static batch is left-padded to its longest prompt and runs until its
longest request is done (min_new_tokens = max_new_tokens); only the tokens the requests asked for
count as output.
"""

import time

from tqdm import tqdm

from pagedllm.bench.engine_runner import RunResult
from pagedllm.bench.workloads import BenchRequest, Workload
from pagedllm.engine.host_memory import minor_page_faults


def hf_model_from(model, config):
    """A transformers CausalLM holding a copy of a pagedllm model's weights, in the same dtype, on the same device."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from pagedllm.model.hf_config import to_hf_dict

    hf_dict = to_hf_dict(config)
    dtype = next(model.parameters()).dtype
    hf_config = AutoConfig.for_model(hf_dict.pop("model_type"), **hf_dict)
    hf_model = AutoModelForCausalLM.from_config(hf_config, dtype=dtype)
    state = {k: v for k, v in model.state_dict().items() if not (config.tie_word_embeddings and k == "lm_head.weight")}
    with torch.no_grad():
        missing, unexpected = hf_model.load_state_dict(state, strict=False)
    missing = [k for k in missing if not (config.tie_word_embeddings and k == "lm_head.weight")]
    if missing or unexpected:
        raise RuntimeError(f"HF model does not match pagedllm's weights: missing {missing[:3]}, extra {unexpected[:3]}")
    if config.tie_word_embeddings:
        hf_model.tie_weights()
    return hf_model.to(next(model.parameters()).device).eval().requires_grad_(False)


def run_hf(hf_model, workload: Workload, batch_size: int = 16, pad_token_id: int = 0,
           progress: bool = True) -> RunResult:  # fmt: skip
    """Every request of the workload through `generate`, in arrival order, `batch_size` prompts per batch."""
    _warm_up(hf_model, pad_token_id)
    batches = [workload.requests[i : i + batch_size] for i in range(0, len(workload.requests), batch_size)]
    start, cpu_start, faults_start = time.perf_counter(), time.process_time(), minor_page_faults()
    generated = 0
    for batch in tqdm(batches, desc="transformers", unit="batch", disable=not progress, leave=False):
        generated += _run_batch(hf_model, batch, workload.seed, pad_token_id)
    elapsed = time.perf_counter() - start
    return RunResult(
        label=f"transformers (static batches of {batch_size})",
        elapsed_s=elapsed,
        cpu_s=time.process_time() - cpu_start,
        page_faults=minor_page_faults() - faults_start,
        num_requests=len(workload.requests),
        prompt_tokens=sum(len(r.prompt) for r in workload.requests),
        output_tokens=sum(r.num_output_tokens for r in workload.requests),
        config={"batch_size": batch_size, "padding": "left", "generated_tokens_incl_padding": generated},
    )


def _run_batch(hf_model, batch: list[BenchRequest], seed: int, pad_token_id: int) -> int:
    """Run one static batch; returns the tokens generated, padding rows included."""
    import torch

    input_ids, mask = (t.to(hf_model.device) for t in left_pad([r.prompt for r in batch], pad_token_id))
    new = max(r.output_len for r in batch)
    width = max(r.n for r in batch)
    torch.manual_seed(seed)
    with torch.inference_mode():
        out = hf_model.generate(input_ids=input_ids, attention_mask=mask, max_new_tokens=new, min_new_tokens=new,
                                pad_token_id=pad_token_id, **_decoding(batch, width))  # fmt: skip
    return (out.shape[1] - input_ids.shape[1]) * out.shape[0]


def _decoding(batch: list[BenchRequest], width: int) -> dict:
    if any(r.beam for r in batch):
        return {"do_sample": False, "num_beams": width, "num_return_sequences": 1}
    if width > 1:
        return {"do_sample": True, "temperature": 1.0, "top_p": 1.0, "top_k": 0, "num_return_sequences": width}
    return {"do_sample": False}


def left_pad(prompts: list[list[int]], pad_token_id: int):
    """[B, L] input ids padded on the left, and the matching attention mask."""
    import torch

    length = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), length), pad_token_id, dtype=torch.long)
    mask = torch.zeros((len(prompts), length), dtype=torch.long)
    for row, p in enumerate(prompts):
        ids[row, length - len(p) :] = torch.tensor(p, dtype=torch.long)
        mask[row, length - len(p) :] = 1
    return ids, mask


def _warm_up(hf_model, pad_token_id: int) -> None:
    import torch

    with torch.inference_mode():
        hf_model.generate(input_ids=torch.full((1, 8), 20, dtype=torch.long, device=hf_model.device), max_new_tokens=2, min_new_tokens=2,
                          do_sample=False, pad_token_id=pad_token_id)  # fmt: skip
