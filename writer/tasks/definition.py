"""A task's definition (kind, version label, params, budget) and its deterministic hash.

`definition_hash` is the SHA-256 (hex) of the definition as canonical JSON: object keys
sorted, no whitespace, strings as JSON escapes of their code points (`ensure_ascii`), and
numbers normalised so that one value has one spelling:

- an integral number is written as an integer, whatever its spelling: `1`, `1.0`, `1e0` and
  `10e-1` are all `1`;
- any other number is written as Python's shortest round-trip form of the IEEE-754 double the
  JSON parser read (`0.5`, `5e-1` and `0.50` are all `0.5`), the same rule as RFC 8785 (JCS)
  for numbers. So two literals that name the same double hash alike;
- refused (400), because no one spelling could stand for them: NaN and ±Infinity (Python's
  JSON parser accepts them), and numbers written with a fraction or exponent whose magnitude
  is 2^53 or more: the double read may not be the value written (`1e23` is read as
  99999999999999991611392); write such a value as an integer;
- integers are exact, up to ±2^63 (beyond that PostgreSQL's jsonb and most clients round).

Strings must be valid Unicode without NUL (PostgreSQL's jsonb refuses `\\u0000` and lone
surrogates): refused with 400 here rather than failing later in the database.

`canonical` also returns the normalised value, which is what the task stores, so the stored
params hash to the stored hash.
"""

from __future__ import annotations

import hashlib
import json
import math
from typing import Any

from arkvory.shared.errors import InvalidInput

MAX_EXACT_FLOAT = 2**53  # every integer below this is exactly one double
MAX_INTEGER = 2**63


def normalise(value: Any, where: str = "definition") -> Any:
    """`value` (parsed JSON) with its numbers in canonical form; InvalidInput when it holds
    something that has no one canonical spelling or that the database cannot store."""
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, int):
        if abs(value) > MAX_INTEGER:
            raise InvalidInput(f"{where}: integers must be within ±2^63")
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            raise InvalidInput(f"{where}: NaN and Infinity are not JSON numbers")
        if value.is_integer():
            if abs(value) >= MAX_EXACT_FLOAT:
                raise InvalidInput(
                    f"{where}: a number of magnitude 2^53 or more must be written as an integer"
                )
            return int(value)
        return value
    if isinstance(value, str):
        _check_text(value, where)
        return value
    if isinstance(value, list):
        return [normalise(item, f"{where}[{index}]") for index, item in enumerate(value)]
    if isinstance(value, dict):
        out = {}
        for key, item in value.items():
            if not isinstance(key, str):
                raise InvalidInput(f"{where}: object keys must be strings")
            _check_text(key, where)
            out[key] = normalise(item, f"{where}.{key}")
        return out
    raise InvalidInput(f"{where}: {type(value).__name__} is not a JSON value")


def _check_text(text: str, where: str) -> None:
    if "\x00" in text:
        raise InvalidInput(f"{where}: text must not contain NUL")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidInput(f"{where}: text must be valid Unicode (no lone surrogates)") from None


def canonical_json(value: Any) -> str:
    """The canonical text of an already normalised value."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False)


def definition_hash(kind: str, version: str | None, params: Any, budget: Any) -> str:
    """SHA-256 hex of the canonical definition; inputs are normalised first, so a caller
    may pass what it parsed."""
    definition = normalise({"kind": kind, "version": version, "params": params, "budget": budget})
    return hashlib.sha256(canonical_json(definition).encode("ascii")).hexdigest()
