"""Every engine option reaches EngineConfig, and every EngineConfig field has an option."""

import argparse
from dataclasses import fields

import pytest

from pagedllm.config import EngineConfig
from pagedllm.entrypoints.engine_args import add_engine_arguments, engine_config_from_args
from pagedllm.errors import InvalidInputError


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


def test_options_take_default_help_and_choices_from_the_config_fields():
    parser = argparse.ArgumentParser()
    add_engine_arguments(parser)
    actions = {a.dest: a for a in parser._actions}
    for f in fields(EngineConfig):
        action = actions[f.name]
        assert action.option_strings[0] == "--" + f.name.replace("_", "-")
        assert action.default == f.default
        assert action.help.startswith(f.metadata["help"])
        if f.metadata["choices"]:
            assert tuple(action.choices) == f.metadata["choices"]
    assert actions["block_size"].type is int and actions["kv_cache_memory"].type is None


def test_readme_engine_option_table_matches_the_config():
    """The README's table lists every EngineConfig field with its default, nothing else."""
    import re
    from pathlib import Path

    readme = (Path(__file__).parent.parent / "README.md").read_text()
    table = readme.split("### Engine options", 1)[1].split("\n\n", 2)[2]
    rows = dict(re.findall(r"^\| `(\w+)` \| ([^|]+) \|", table, re.MULTILINE))
    assert list(rows) == [f.name for f in fields(EngineConfig)]
    for f in fields(EngineConfig):
        if f.default is not None:
            assert rows[f.name].strip().strip("`") == str(f.default), f.name


@pytest.mark.parametrize("options", [dict(seed="x"), dict(seed=1.5), dict(block_size=True), dict(num_blocks=True),
                                     dict(kv_cache_memory=1.5e9), dict(kv_cache_memory=None),
                                     dict(enable_prefix_caching="no"), dict(enforce_eager="no"), dict(seed=2**64),
                                     dict(seed=-(2**63) - 1), dict(model=123), dict(model=""),
                                     dict(served_model_name=5), dict(served_model_name=" "), dict(swap_space=-1),
                                     dict(swap_space="lots"), dict(swap_space=float("inf"))],
                         ids=lambda options: f"{next(iter(options))}={next(iter(options.values()))!r}")
def test_a_value_of_the_wrong_type_names_its_field_before_anything_loads(options):
    field = next(iter(options))
    with pytest.raises(InvalidInputError, match=field):
        EngineConfig(**options)


@pytest.mark.parametrize("value,size", [("4GiB", 4 << 30), (4, 4 << 30), ("0.5", 1 << 29), ("512MiB", 1 << 29), (0, 0)])
def test_swap_space_counts_gib_as_vllm_does_or_takes_a_size(value, size):
    assert EngineConfig(swap_space=value).swap_space_bytes == size


def test_a_model_path_may_be_a_path_object(tmp_path):
    assert EngineConfig(model=tmp_path).model == str(tmp_path)
