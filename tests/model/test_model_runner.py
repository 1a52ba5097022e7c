"""ModelRunner: step tensors, logits selection, copy-on-write support, memory sizing, input errors."""

import pytest
import torch
from compiled_kernels import require_compiled_kernels

from pagedllm.config import parse_memory_size
from pagedllm.engine.model_runner import ModelRunner, SeqInput
from pagedllm.engine.pool_memory import num_blocks_for_memory
from pagedllm.errors import InvalidInputError
from pagedllm.model.loader import load_model


@pytest.fixture(scope="module")
def loaded(tiny_llama_dir):
    return load_model(tiny_llama_dir)


def _runner(loaded, num_blocks: int = 32) -> ModelRunner:
    model, config = loaded
    return ModelRunner(model, config, num_blocks=num_blocks, block_size=4, dtype=torch.float32, attention_impl="reference")


def test_prepare_builds_flat_positions_and_logit_rows(loaded):
    runner = _runner(loaded)
    step = runner.prepare(
        [SeqInput([7, 8, 9], 5, [3, 4]), SeqInput([1], 0, [9]), SeqInput([4, 5], 10, [0, 1, 2], needs_logits=False)]
    )
    assert step.input_ids.tolist() == [7, 8, 9, 1, 4, 5]
    assert step.positions.tolist() == [5, 6, 7, 0, 10, 11]
    assert step.meta.slot_mapping.tolist() == [17, 18, 19, 36, 10, 11]
    assert step.logits_rows.tolist() == [2, 3]


def test_only_sequences_that_need_logits_get_a_row(loaded):
    runner = _runner(loaded)
    prompt = [5, 17, 200, 33, 9, 100, 101]
    full = _runner(loaded).execute([SeqInput(prompt, 0, [4, 2])])
    first = runner.execute([SeqInput(prompt[:4], 0, [4, 2], needs_logits=False), SeqInput([3], 0, [7])])
    rest = runner.execute([SeqInput(prompt[4:], 4, [4, 2])])
    assert first.shape == (1, loaded[1].vocab_size) and first.dtype == torch.float32
    torch.testing.assert_close(rest, full, atol=1e-5, rtol=0)  # chunked prefill == one-shot prefill


def _require_impl(impl: str) -> None:
    if impl == "compiled":
        require_compiled_kernels()


def _run_last_layer_both_ways(loaded, impl: str, seqs: list[SeqInput]):
    """The step's output rows from the model cut to them in the last layer, and from the whole model indexed
    after it, each on its own KV pool; with both pools after the step."""
    model, config = loaded
    cut, whole = (ModelRunner(model, config, num_blocks=32, block_size=4, dtype=torch.float32, attention_impl=impl)
                  for _ in range(2))
    step = cut.prepare(seqs)
    with torch.inference_mode():
        rows = model(step.input_ids, step.positions, cut.kv_caches, step.meta, cut.attention_impl,
                     step.logits_rows, step.logits_meta)
        every = model(step.input_ids, step.positions, whole.kv_caches, step.meta, whole.attention_impl)
    return rows, every[step.logits_rows], cut.kv_caches, whole.kv_caches


@pytest.mark.parametrize("impl", ["reference", "fast", "compiled"])
def test_last_layer_works_on_the_output_rows_only(loaded, impl):
    _require_impl(impl)
    seqs = [
        SeqInput([7, 8, 9, 10, 11], 0, [3, 4]),  # a whole prompt
        SeqInput([1, 2, 3, 4], 0, [9, 5], needs_logits=False),  # a chunk that is not its prompt's last
        SeqInput([4, 5], 6, [0, 1]),  # a chunk over a cached prefix
        SeqInput([6], 3, [12]),  # a decode
    ]
    step = _runner(loaded).prepare(seqs)
    assert step.logits_meta.query_lens_list == [1, 1, 1] and step.logits_meta.seq_lens_list == [5, 8, 4]
    rows, expected, cut_caches, whole_caches = _run_last_layer_both_ways(loaded, impl, seqs)
    assert rows.shape == (3, loaded[1].hidden_size)
    torch.testing.assert_close(rows, expected, atol=1e-5, rtol=1e-5)
    for cut, whole in zip(cut_caches, whole_caches, strict=True):  # every row's K/V, the last layer's too
        torch.testing.assert_close(cut, whole, atol=1e-6, rtol=0)


@pytest.mark.parametrize("impl", ["reference", "compiled"])
def test_a_step_without_output_rows_still_writes_every_layers_kv(loaded, impl):
    _require_impl(impl)
    seqs = [SeqInput([1, 2, 3, 4, 5], 0, [9, 5], needs_logits=False)]
    rows, expected, cut_caches, whole_caches = _run_last_layer_both_ways(loaded, impl, seqs)
    assert rows.shape == expected.shape == (0, loaded[1].hidden_size)
    for cut, whole in zip(cut_caches, whole_caches, strict=True):
        torch.testing.assert_close(cut, whole, atol=1e-6, rtol=0)


def test_decode_steps_need_no_cut(loaded):
    step = _runner(loaded).prepare([SeqInput([6], 3, [12]), SeqInput([9], 7, [1, 2])])
    assert step.logits_meta is None and step.logits_rows.tolist() == [0, 1]


def test_copied_block_continues_like_the_original(loaded):
    runner = _runner(loaded)
    prompt = [5, 17, 200, 33, 9, 100]  # 6 tokens: block 10 full, block 11 holds 2
    runner.execute([SeqInput(prompt, 0, [10, 11])])
    runner.copy_blocks([(11, 20)])
    original = runner.execute([SeqInput([42], 6, [10, 11])])
    forked = runner.execute([SeqInput([42], 6, [10, 20])])
    torch.testing.assert_close(forked, original, atol=0, rtol=0)


@pytest.mark.parametrize("copies", [[(0, 1), (1, 2)], [(3, 4), (4, 3)], [(5, 5)]])
def test_copies_that_chain_are_refused(loaded, copies):
    """The compiled, torch and Triton paths copy in different orders: a chain would depend on the path."""
    with pytest.raises(InvalidInputError, match="both copied from and copied into"):
        _runner(loaded).copy_blocks(copies)


def test_empty_step_returns_no_logits(loaded):
    assert _runner(loaded).execute([]).shape == (0, loaded[1].vocab_size)


def test_input_errors(loaded):
    runner = _runner(loaded)
    with pytest.raises(InvalidInputError, match="cannot hold 9 tokens"):
        runner.execute([SeqInput([1, 2, 3], 6, [0, 1])])
    with pytest.raises(InvalidInputError, match="at least one"):
        runner.execute([SeqInput([], 0, [0])])
    with pytest.raises(InvalidInputError, match="unknown attention impl"):
        ModelRunner(*loaded, num_blocks=4, block_size=4, dtype=torch.float32, attention_impl="nope")


@pytest.mark.parametrize(
    "text,expected", [("2GiB", 2 * 2**30), ("512MiB", 512 * 2**20), ("1.5GB", int(1.5 * 2**30)), ("4096", 4096)]
)
def test_parse_memory_size(text, expected):
    assert parse_memory_size(text) == expected


@pytest.mark.parametrize("text", ["", "2 parsecs", "GiB", "-1GiB"])
def test_parse_memory_size_rejects(text):
    with pytest.raises(InvalidInputError):
        parse_memory_size(text)


def test_num_blocks_for_memory(loaded):
    config = loaded[1]
    # 3 layers * K,V * 16 slots * 2 kv heads * 16 dims * 4 bytes = 12288 bytes a block
    assert num_blocks_for_memory(config, 16, torch.float32, "1MiB") == 2**20 // 12288
    assert num_blocks_for_memory(config, 16, torch.bfloat16, "1MiB") == 2**20 // 6144
    with pytest.raises(InvalidInputError, match="KV cache budget 1KiB .* smaller than one KV block"):
        num_blocks_for_memory(config, 16, torch.float32, "1KiB")


def test_fused_projections_match_separate_ones(tiny_llama_dir):
    from pagedllm.attention import AttentionMetadata, allocate_kv_caches
    from pagedllm.model.hf_loader import read_hf_dir
    from pagedllm.model.llama import LlamaForCausalLM

    config, state_dict = read_hf_dir(tiny_llama_dir)
    separate = LlamaForCausalLM(config)
    separate.load_state_dict(state_dict)
    fused, _ = load_model(tiny_llama_dir)
    assert fused.model.layers[0].self_attn.qkv is not None and separate.model.layers[0].self_attn.qkv is None
    assert set(fused.state_dict()) == set(separate.state_dict())  # HF names kept
    ids = torch.tensor([5, 17, 200, 33, 9])
    outs = []
    for model in (separate, fused):
        caches = allocate_kv_caches(config.num_layers, 4, 4, config.num_kv_heads, config.head_dim, torch.float32)
        meta = AttentionMetadata.build([[2, 0]], [0], [5], 4)
        with torch.inference_mode():
            outs.append(model.compute_logits(model(ids, torch.arange(5), caches, meta)))
    torch.testing.assert_close(outs[1], outs[0], atol=1e-5, rtol=0)


def test_loading_a_model_does_not_import_torch_dynamo(tiny_llama_dir):
    """Random-initialising the modules on the meta device imported torch._dynamo: over a second of every start."""
    import subprocess
    import sys

    code = ("import sys; from pagedllm.model.loader import load_model; load_model(sys.argv[1]); "
            "print('torch._dynamo' in sys.modules)")
    result = subprocess.run([sys.executable, "-c", code, str(tiny_llama_dir)], capture_output=True, text=True,
                            check=True)
    assert result.stdout.strip() == "False"
