"""Caller metadata: JSON as it is, not what ``json.dumps`` would make of it
(NaN, an integer no JSON reader holds exactly, a key that is not a string).
The same values are refused in every language, naming where they are."""

from __future__ import annotations

import json
import math
from typing import Any

from ._errors import InvalidArgument

_INT_MIN = -(2**63)
_INT_MAX = 2**64 - 1
_MAX_DEPTH = 100


def _refuse(message: str) -> InvalidArgument:
    return InvalidArgument(f"invalid argument `metadata`: {message}")


def _check(value: Any, where: str, depth: int) -> None:
    if depth > _MAX_DEPTH:
        raise _refuse(f"nests deeper than {_MAX_DEPTH} levels at {where}")
    if value is None or isinstance(value, (str, bool)):
        return
    if isinstance(value, int):
        if not _INT_MIN <= value <= _INT_MAX:
            raise _refuse(f"{where} is an integer outside 64 bits, which JSON readers cannot hold exactly")
        return
    if isinstance(value, float):
        if not math.isfinite(value):
            raise _refuse(f"{where} is {value!r}, which JSON cannot hold")
        return
    if isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            _check(v, f"{where}[{i}]", depth + 1)
        return
    if isinstance(value, dict):
        for k, v in value.items():
            if not isinstance(k, str):
                raise _refuse(f"{where} has the key {k!r}, which is not a string")
            _check(v, f"{where}.{k}", depth + 1)
        return
    raise _refuse(f"{where} is a {type(value).__name__}, not a JSON value")


def dumps(metadata: Any) -> str:
    """The metadata as JSON text, or InvalidArgument naming what is not JSON."""
    _check(metadata, "metadata", 0)
    return json.dumps(metadata, allow_nan=False, separators=(",", ":"))
