"""The decoder layers in one compiled call (pagedllm/model/decoder_stack.py) against the compiled path's Python
loop: the same ops in the same order, so the same logits to the bit, and the same K/V written."""

import dataclasses

import pytest
import torch
from compiled_kernels import require_compiled_kernels
from tiny import save_tiny_dir

from pagedllm.engine.model_runner import ModelRunner, SeqInput
from pagedllm.model.dtype import has_native_bf16
from pagedllm.model.loader import load_model
from pagedllm.model.projection import AMX_OWN_MAX_ROWS

# llama: head_dim 16, GQA 2, no biases; qwen2: head_dim 64, GQA 3, q/k/v biases; qwen3: head_dim 32, q/k norms
MODELS = {"llama": ("llama", {}),
          "qwen2": ("qwen2", {"hidden_size": 192, "num_attention_heads": 3, "num_key_value_heads": 1}),
          "qwen3": ("qwen3", {"head_dim": 32})}  # fmt: skip
DTYPES = [torch.float32, torch.bfloat16]


@pytest.fixture(autouse=True, scope="module")
def require_kernels() -> None:
    require_compiled_kernels()


@pytest.fixture(scope="module", params=list(MODELS))
def model_dir(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory):
    model_type, overrides = MODELS[request.param]
    return save_tiny_dir(tmp_path_factory.mktemp(request.param), model_type, **overrides)


def load(model_dir, dtype: torch.dtype):
    if dtype == torch.bfloat16 and not has_native_bf16():
        pytest.skip("bfloat16 matmuls are emulated on this CPU: no packed projections, no stack")
    return load_model(model_dir, dtype)


class CountingStack:
    """The model's stack, recording how many layers each of its calls ran (None: every layer)."""

    def __init__(self, stack) -> None:
        self.stack, self.calls = stack, []

    def covers(self, num_tokens: int) -> bool:
        return self.stack.covers(num_tokens)

    def __call__(self, *args, num_layers=None):
        self.calls.append(num_layers)
        return self.stack(*args, num_layers=num_layers)


def steps() -> list[list[SeqInput]]:
    """A prompt and the first chunk of another, then the rest with a decode, then decodes of both (the stack
    runs every layer of the steps whose every token needs logits, the decode steps, and all but the last layer
    of the others, whose last layer runs on the rows that need logits alone)."""
    a, b = [5, 17, 200, 33, 9, 100, 101, 7, 8, 9, 10], [44, 45, 46, 47, 48, 49, 50, 51, 52, 53, 54, 55, 56]
    table_a, table_b = [63 - 2 * i for i in range(2)], [2 * i for i in range(2)]
    batches = [[SeqInput(a, 0, table_a), SeqInput(b[:6], 0, table_b, needs_logits=False)],
               [SeqInput([42], len(a), table_a), SeqInput(b[6:], 6, table_b)]]  # fmt: skip
    for i in range(5):
        batches.append([SeqInput([100 + i], len(a) + 1 + i, table_a), SeqInput([200 + i], len(b) + i, table_b)])
    return batches


def run(model_and_config, dtype: torch.dtype, batches: list[list[SeqInput]] | None = None):
    """(each step's logits, the KV caches after the last)."""
    model, config = model_and_config
    runner = ModelRunner(model, config, num_blocks=64, block_size=16, dtype=dtype, attention_impl="compiled")
    return [runner.execute(step) for step in batches or steps()], runner.kv_caches


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_stack_gives_the_python_loops_logits_and_kv(model_dir, dtype: torch.dtype) -> None:
    with_stack, without = load(model_dir, dtype), load(model_dir, dtype)
    assert with_stack[0].stack is not None
    counting = CountingStack(with_stack[0].stack)
    with_stack[0].stack, without[0].stack = counting, None
    logits, caches = run(with_stack, dtype)
    expected_logits, expected_caches = run(without, dtype)
    last = with_stack[1].num_layers - 1
    assert counting.calls == [last, last] + [None] * 5  # all but the last layer of the prompt steps; decodes
    for got, expected in zip(logits, expected_logits, strict=True):
        assert torch.equal(got, expected)
    for got, expected in zip(caches, expected_caches, strict=True):
        assert torch.equal(got, expected)


def shared_prefix_steps() -> list[list[SeqInput]]:
    """A 64-token prompt, then a second sequence whose table starts with its four blocks (a prefix-cache hit),
    then decodes of both: the kernel attends their common prefix once for both (shared-prefix parts), in every
    layer of the stack's one call."""
    prefix = [(7 * i) % 250 + 3 for i in range(64)]
    table_a, table_b = [10, 11, 12, 13, 14], [10, 11, 12, 13, 20]
    batches = [[SeqInput(prefix + [5, 6], 0, table_a)], [SeqInput([42], 66, table_a), SeqInput([8, 9, 10], 64, table_b)]]
    for i in range(4):
        batches.append([SeqInput([100 + i], 67 + i, table_a), SeqInput([200 + i], 67 + i, table_b)])
    return batches


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_stack_attends_a_shared_prefix_as_the_python_loop_does(model_dir, dtype: torch.dtype) -> None:
    with_stack, without = load(model_dir, dtype), load(model_dir, dtype)
    counting = CountingStack(with_stack[0].stack)
    with_stack[0].stack, without[0].stack = counting, None
    got, expected = run(with_stack, dtype, shared_prefix_steps()), run(without, dtype, shared_prefix_steps())
    assert counting.calls == [with_stack[1].num_layers - 1] * 2 + [None] * 4
    for logits, expected_logits in zip(got[0], expected[0], strict=True):
        assert torch.equal(logits, expected_logits)


def test_stack_covers_what_its_matmuls_run(model_dir) -> None:
    stack = load(model_dir, torch.float32)[0].stack
    assert stack.max_tokens is None and stack.covers(10_000)  # pagedllm's float32 matmul runs any batch
    if not has_native_bf16():
        return
    stack = load(model_dir, torch.bfloat16)[0].stack
    if stack.max_tokens is not None:  # AMX: oneDNN runs the larger batches
        assert stack.max_tokens == AMX_OWN_MAX_ROWS
        assert stack.covers(AMX_OWN_MAX_ROWS) and not stack.covers(AMX_OWN_MAX_ROWS + 1)


def test_stack_rejects_a_wrong_number_of_caches(model_dir) -> None:
    model, config = load(model_dir, torch.float32)
    hidden = torch.zeros(1, config.hidden_size)
    cos_sin = model.rotary.cos_sin(torch.tensor([0]), torch.float32)
    runner = ModelRunner(model, config, num_blocks=4, block_size=16, dtype=torch.float32, attention_impl="compiled")
    meta = runner.prepare([SeqInput([5], 0, [0])]).meta
    for caches in (runner.kv_caches[:-1], runner.kv_caches + runner.kv_caches[:1]):  # one too few, one too many
        with pytest.raises(RuntimeError, match="one KV cache per layer"):
            model.stack(hidden, hidden.clone(), cos_sin, caches, meta)


def test_stack_runs_the_first_layers_it_is_asked_for(model_dir) -> None:
    """num_layers runs that many layers from the first (the caches of the others untouched); out of range it is
    refused before anything runs."""
    model, config = load(model_dir, torch.float32)
    runner = ModelRunner(model, config, num_blocks=4, block_size=16, dtype=torch.float32, attention_impl="compiled")
    meta = runner.prepare([SeqInput([5, 6], 0, [0])]).meta
    cos_sin = model.rotary.cos_sin(torch.tensor([0, 1]), torch.float32)
    embedded = torch.randn(2, config.hidden_size)
    hidden, residual = torch.zeros_like(embedded), embedded.clone()
    assert torch.equal(model.stack(hidden, residual, cos_sin, runner.kv_caches, meta, num_layers=0), hidden)
    assert torch.equal(residual, embedded) and all(not cache.any() for cache in runner.kv_caches)
    model.stack(hidden, residual, cos_sin, runner.kv_caches, meta, num_layers=1)
    assert runner.kv_caches[0].any() and not runner.kv_caches[1].any()
    for wrong in (-2, config.num_layers + 1):
        with pytest.raises(RuntimeError, match="num_layers must be"):
            model.stack(hidden, residual, cos_sin, runner.kv_caches, meta, num_layers=wrong)


def test_stack_checks_its_inputs_once_for_every_layer(model_dir) -> None:
    """The stack checks the tensors once a call and then runs every layer on raw pointers: a cache shaped unlike
    the first, a slot outside the pool, a block id outside it and a hidden state of another dtype are refused
    before anything is written."""
    model, config = load(model_dir, torch.float32)
    runner = ModelRunner(model, config, num_blocks=4, block_size=16, dtype=torch.float32, attention_impl="compiled")
    meta = runner.prepare([SeqInput([5], 0, [0])]).meta
    hidden = torch.zeros(1, config.hidden_size)
    cos_sin = model.rotary.cos_sin(torch.tensor([0]), torch.float32)
    before = [cache.clone() for cache in runner.kv_caches]

    def call(caches=runner.kv_caches, meta=meta, hidden=hidden):
        return model.stack(hidden, hidden.clone(), cos_sin, caches, meta)

    with pytest.raises(RuntimeError, match="shaped like the first"):
        call(caches=runner.kv_caches[:-1] + [runner.kv_caches[-1][:, :, :2].contiguous()])
    with pytest.raises(RuntimeError, match="slot out of range"):
        call(meta=dataclasses.replace(meta, slot_mapping=torch.tensor([4 * 16])))
    with pytest.raises(ValueError, match="outside the pool"):
        call(meta=dataclasses.replace(meta, block_tables=torch.tensor([[4]])))
    with pytest.raises(RuntimeError, match="weights' dtype"):
        call(hidden=hidden.double())
    assert all(torch.equal(a, b) for a, b in zip(runner.kv_caches, before, strict=True))
    call()  # and the step itself runs


def test_stack_refuses_layers_whose_sizes_differ_from_the_first() -> None:
    """forward sizes its buffers by the first layer: a layer with another MLP width is refused as it is added."""
    from pagedllm.kernels import load_cpu_kernels

    kernels = load_cpu_kernels()
    hidden, heads, kv_heads, head_dim = 32, 2, 1, 16

    def matmul(out: int, features: int, gated: bool = False):
        panels = kernels.pack_linear(torch.randn(out, features), gated)
        return kernels.StackMatmul(panels, None, out // 2 if gated else out, amx=False, gated=gated)

    def add_layer(stack, intermediate: int) -> None:
        norm = torch.ones(hidden)
        stack.add_layer(norm, norm, matmul((heads + 2 * kv_heads) * head_dim, hidden), matmul(hidden, heads * head_dim),
                        matmul(2 * intermediate, hidden, gated=True), matmul(hidden, intermediate))  # fmt: skip

    stack = kernels.DecoderStack(heads, kv_heads, head_dim, 1e-5, head_dim**-0.5)
    add_layer(stack, 64)
    with pytest.raises(RuntimeError, match="first layer's sizes"):
        add_layer(stack, 96)
