"""EngineConfig: every option checked when the engine is configured, naming the option; memory sizes in any
case, with or without the i."""

import pytest

from pagedllm.config import EngineConfig, parse_memory_size
from pagedllm.errors import InvalidInputError


@pytest.mark.parametrize("text,size", [("2GB", 2 << 30), ("512MB", 512 << 20), ("2gib", 2 << 30), ("512mib", 512 << 20),
                                       ("1.5g", 3 << 29), ("1 KiB", 1024), ("64", 64)])
def test_memory_sizes_read_units_in_any_case_with_or_without_i(text, size):
    assert parse_memory_size(text) == size


@pytest.mark.parametrize("options", [dict(swap_space=True), dict(swap_space=False), dict(kv_cache_memory=0),
                                     dict(kv_cache_memory="0GiB"), dict(preemption_mode="swapp"),
                                     dict(allocator="pagd"), dict(gpu_memory_utilization=0.0),
                                     dict(gpu_memory_utilization=1.5), dict(gpu_memory_utilization=True),
                                     dict(max_model_len=0), dict(tensor_parallel_size=0), dict(max_n=0),
                                     dict(num_blocks=0), dict(device="cuda:"), dict(device="gpu"),
                                     dict(dtype="float16"), dict(seed=2**64)],
                         ids=lambda options: f"{next(iter(options))}={next(iter(options.values()))!r}")
def test_bad_engine_options_are_refused_naming_the_field(options):
    field = next(iter(options))
    with pytest.raises(InvalidInputError, match=field):
        EngineConfig(**options)


@pytest.mark.parametrize("options", [dict(seed=2**64 - 1), dict(seed=-(2**63)), dict(gpu_memory_utilization=1),
                                     dict(device="cuda:1"), dict(kv_cache_memory=1), dict(swap_space="0")])
def test_boundary_engine_options_are_taken(options):
    EngineConfig(**options)



@pytest.mark.parametrize("value", [True, False])
def test_a_bool_is_no_memory_size(value):
    with pytest.raises(InvalidInputError, match="kv_cache_memory"):
        EngineConfig(kv_cache_memory=value)
