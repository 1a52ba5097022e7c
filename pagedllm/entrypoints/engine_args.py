"""Command-line options shared by every command that builds an engine (generate, serve, bench).

Derived from EngineConfig's fields: the option's name, type, default, help and choices are the
field's, so adding a field to EngineConfig is all it takes to add an option."""

import argparse
import types
from dataclasses import MISSING, Field, fields

from pagedllm.config import EngineConfig


def add_engine_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("engine")
    for f in fields(EngineConfig):
        group.add_argument("--" + f.name.replace("_", "-"), **_option(f))


def engine_config_from_args(args: argparse.Namespace) -> EngineConfig:
    """Every EngineConfig field comes from the option of the same name (e.g. --block-size -> block_size)."""
    return EngineConfig(**{f.name: getattr(args, f.name) for f in fields(EngineConfig)})


def _option(f: Field) -> dict:
    if f.default is MISSING:
        raise TypeError(f"EngineConfig.{f.name} needs a default to become an option")
    kwargs = {"default": f.default, "help": f.metadata.get("help")}
    if f.type is bool:
        return kwargs | {"action": argparse.BooleanOptionalAction}
    if f.metadata.get("choices"):
        kwargs["choices"] = list(f.metadata["choices"])
    if _is_int(f.type):
        kwargs["type"] = int
    elif f.type is float:
        kwargs["type"] = float
    if f.default is not None and "default:" not in (kwargs["help"] or ""):
        kwargs["help"] = f"{kwargs['help']} (default: %(default)s)"
    return kwargs


def _is_int(annotation: object) -> bool:
    """int or int | None; a field that also takes text (e.g. str | int sizes) is read as text."""
    kinds = set(annotation.__args__) if isinstance(annotation, types.UnionType) else {annotation}
    return int in kinds and str not in kinds
