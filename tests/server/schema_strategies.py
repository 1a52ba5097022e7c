"""Hypothesis strategies for request bodies, read off the pydantic models' JSON schemas.

`from_schema` draws values the schema allows (small ones: short strings, short lists, integers
near the interesting range); `hostile` draws what a careless or malicious client might put in
any field instead: wrong types, huge integers, NaN and infinities, lone surrogates.
"""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

SMALL_INT = st.integers(-3, 300)
MAX_OPTIONAL = 4
HOSTILE = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**70), 2**70), st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=8), st.sampled_from(["\ud800", "a\udfffb", "", " ", "\x00"]),
    st.lists(st.integers(-2, 2**40), max_size=3), st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
)
JSON_LEAF = st.one_of(st.none(), st.booleans(), SMALL_INT, st.floats(-10, 10), st.text(max_size=6))


def from_schema(schema: dict[str, Any], defs: dict[str, Any]) -> st.SearchStrategy[Any]:
    if "$ref" in schema:
        name = schema["$ref"].rsplit("/", 1)[1]
        return st.deferred(lambda: from_schema(defs[name], defs))
    if "anyOf" in schema:
        return st.one_of([from_schema(option, defs) for option in schema["anyOf"]])
    if "enum" in schema:
        return st.sampled_from(schema["enum"])
    return _typed(schema, defs)


def _typed(schema: dict[str, Any], defs: dict[str, Any]) -> st.SearchStrategy[Any]:
    kind = schema.get("type")
    if kind == "string":
        return st.text(min_size=schema.get("minLength", 0), max_size=12)
    if kind == "integer":
        return _integers(schema)
    if kind == "number":
        return _numbers(schema)
    if kind == "boolean":
        return st.booleans()
    if kind == "null":
        return st.none()
    if kind == "array":
        items = from_schema(schema.get("items", {}), defs)
        return st.lists(items, min_size=schema.get("minItems", 0), max_size=3)
    if kind == "object":
        return _objects(schema, defs)
    return JSON_LEAF


def _integers(schema: dict[str, Any]) -> st.SearchStrategy[int]:
    low, high = schema.get("minimum"), schema.get("maximum")
    bounded = st.integers(low, high)
    return st.one_of(SMALL_INT.filter(lambda v: (low is None or v >= low) and (high is None or v <= high)),
                     bounded)


def _numbers(schema: dict[str, Any]) -> st.SearchStrategy[float]:
    low, high = schema.get("minimum"), schema.get("maximum")
    return st.one_of(st.floats(max(low or -3.0, -3.0), min(high or 3.0, 3.0)),
                     st.floats(low, high, allow_nan=False, allow_infinity=False))


def _objects(schema: dict[str, Any], defs: dict[str, Any]) -> st.SearchStrategy[dict[str, Any]]:
    """The required fields and up to MAX_OPTIONAL others (so that many bodies are valid)."""
    properties = schema.get("properties", {})
    required = [k for k in properties if k in schema.get("required", [])]
    optional = [k for k in properties if k not in required]
    chosen = st.lists(st.sampled_from(optional), max_size=MAX_OPTIONAL, unique=True) if optional else st.just([])
    fixed = chosen.flatmap(lambda keys: st.fixed_dictionaries(
        {k: from_schema(properties[k], defs) for k in required + keys}))
    if not schema.get("additionalProperties"):
        return fixed
    extra = st.dictionaries(st.text(min_size=1, max_size=4), JSON_LEAF, max_size=2)
    return st.tuples(extra, fixed).map(lambda pair: {**pair[0], **pair[1]})


@st.composite
def request_bodies(draw: st.DrawFn, schema: dict[str, Any], model_name: str) -> dict[str, Any]:
    """A body the schema allows, then maybe a few fields made hostile or a required one dropped."""
    body = draw(from_schema(schema, schema.get("$defs", {})))
    if "model" in body and draw(st.booleans()):
        body["model"] = model_name
    if draw(st.integers(0, 2)) == 0:
        for key in draw(st.lists(st.sampled_from(sorted(schema["properties"])), min_size=1, max_size=2, unique=True)):
            body[key] = draw(HOSTILE)
    if body and draw(st.integers(0, 9)) == 0:
        body.pop(draw(st.sampled_from(sorted(body))))
    return body
