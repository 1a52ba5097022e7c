"""StructuredOutputsParams: what a request's output must be (vLLM's `structured_outputs`): text that a JSON schema
accepts, any JSON object, a full match of a regex, one of a list of choices, or a sentence of an EBNF grammar.
The engine holds each completion to it token by token (pagedllm/engine/grammar.py)."""

import json
from dataclasses import dataclass
from typing import Any

from pagedllm.errors import InvalidInputError

MAX_CHOICES = 1024
_KINDS = ("json", "regex", "choice", "grammar", "json_object")


@dataclass(slots=True, frozen=True)
class StructuredOutputsParams:
    json: str | dict[str, Any] | None = None  # a JSON schema, as an object or its text
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None  # EBNF (GBNF, as llama.cpp and xgrammar write it)
    json_object: bool | None = None  # True: any JSON object
    # pagedllm's, for thinking models: the constraint holds after a `<think>...</think>` block, which is free text.
    # "open": the answer begins inside the block; "optional": it may begin with one. (The server sets it where a
    # reasoning parser is on; a request body cannot.)
    after_reasoning: str | None = None

    def __post_init__(self) -> None:
        given = [kind for kind in _KINDS if getattr(self, kind) is not None]
        if len(given) != 1:
            raise InvalidInputError(f"structured_outputs must give exactly one of {', '.join(_KINDS)}; got "
                                    f"{', '.join(given) or 'none'}")
        if self.after_reasoning not in (None, "open", "optional"):
            raise InvalidInputError(f'structured_outputs.after_reasoning must be "open" or "optional", got '
                                    f"{self.after_reasoning!r}")
        self._check(given[0])

    def _check(self, kind: str) -> None:
        value = getattr(self, kind)
        if kind == "json":
            schema = _parsed_schema(value)
            object.__setattr__(self, "json", schema)
        elif kind in ("regex", "grammar") and not (isinstance(value, str) and value):
            raise InvalidInputError(f"structured_outputs.{kind} must be a non-empty string, got {value!r}")
        elif kind == "choice" and not (isinstance(value, list) and 0 < len(value) <= MAX_CHOICES
                                       and all(isinstance(c, str) and c for c in value)):
            raise InvalidInputError(f"structured_outputs.choice must be a list of 1 to {MAX_CHOICES} non-empty "
                                    f"strings, got {value!r}")
        elif kind == "json_object" and value is not True:
            raise InvalidInputError(f"structured_outputs.json_object must be true, got {value!r}")

    @property
    def kind(self) -> str:
        """Which of the five fields is given."""
        return next(k for k in _KINDS if getattr(self, k) is not None)

    @classmethod
    def from_value(cls, value: "StructuredOutputsParams | dict[str, Any]") -> "StructuredOutputsParams":
        """The params themselves, or built from a dict of their fields (as a request body gives them)."""
        if isinstance(value, cls):
            return value
        if not isinstance(value, dict):
            raise InvalidInputError(f"structured_outputs must be an object, got {value!r}")
        if unknown := sorted(set(value) - set(_KINDS)):
            raise InvalidInputError(f"structured_outputs has fields this engine does not take: {unknown}")
        return cls(**value)


def _parsed_schema(value: object) -> dict[str, Any]:
    """A JSON schema as an object: given as one, or as its text."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as exc:
            raise InvalidInputError(f"structured_outputs.json is not valid JSON: {exc}") from None
    if not isinstance(value, dict):
        raise InvalidInputError(f"structured_outputs.json must be a JSON schema (an object), got {value!r}")
    return value
