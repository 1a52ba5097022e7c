"""Typed reads of a model config's fields (config.json, GGUF metadata): a wrong type is a ModelLoadError naming
the field."""

import math
from typing import Any

from pagedllm.checks import is_int
from pagedllm.errors import ModelLoadError

REQUIRED = object()  # a ConfigReader default: the field must be given


class ConfigReader:
    """Typed reads of a config's fields: a value of the wrong type is a ModelLoadError naming the field.
    A field given as null counts as not given."""

    def __init__(self, fields: dict[str, Any], source: str) -> None:
        self.fields, self.source = fields, source

    def _get(self, key: str, default: Any) -> Any:
        value = self.fields.get(key)
        if value is not None:
            return value
        if default is REQUIRED:
            raise ModelLoadError(f"{self.source} lacks required key {key!r}")
        return default

    def _wrong(self, key: str, value: Any, kind: str) -> ModelLoadError:
        return ModelLoadError(f"{self.source}: {key} must be {kind}, got {value!r}")

    def int(self, key: str, default: Any = REQUIRED) -> Any:
        value = self._get(key, default)
        if value is not default and not is_int(value):
            raise self._wrong(key, value, "an integer")
        return value

    def float(self, key: str, default: Any = REQUIRED) -> Any:
        value = self._get(key, default)
        if value is None:  # an optional field left out
            return None
        if not (is_int(value) or isinstance(value, float)) or not math.isfinite(value):
            raise self._wrong(key, value, "a finite number")
        return float(value)

    def str(self, key: str, default: Any = REQUIRED) -> Any:
        value = self._get(key, default)
        if value is not default and not isinstance(value, str):
            raise self._wrong(key, value, "a string")
        return value

    def bool(self, key: str, default: bool) -> bool:
        value = self._get(key, default)
        if not isinstance(value, bool):
            raise self._wrong(key, value, "true or false")
        return value

    def int_list(self, key: str) -> list[int]:
        value = self._get(key, [])
        values = value if isinstance(value, list) else [value]
        if not all(map(is_int, values)):
            raise self._wrong(key, value, "an integer or a list of integers")
        return values
