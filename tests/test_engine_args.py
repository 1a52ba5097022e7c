"""Every engine option reaches EngineConfig, and every EngineConfig field has an option."""

import argparse
from dataclasses import fields

from pagedllm.config import EngineConfig
from pagedllm.entrypoints.engine_args import add_engine_arguments, engine_config_from_args


def test_each_option_maps_to_its_config_field():
    parser = argparse.ArgumentParser()
    add_engine_arguments(parser)
    args = parser.parse_args(["--block-size", "8", "--allocator", "contiguous", "--no-enable-prefix-caching",
                              "--preemption-mode", "swap", "--max-n", "3", "--kv-cache-memory", "1GiB"])
    config = engine_config_from_args(args)
    assert (config.block_size, config.allocator, config.enable_prefix_caching) == (8, "contiguous", False)
    assert (config.preemption_mode, config.max_n, config.kv_cache_memory) == ("swap", 3, "1GiB")
    defaults = engine_config_from_args(parser.parse_args([]))
    assert defaults == EngineConfig()
    assert {f.name for f in fields(EngineConfig)} <= set(vars(args))
