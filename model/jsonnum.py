"""Request models whose numbers must be JSON numbers: ``true`` or ``"64"`` is refused.

pydantic's lax mode reads ``true`` as 1 and numeric strings as numbers, which the published
schema (``type: integer`` / ``number``) does not allow. Strict mode would also refuse
``2048.0`` and lose the clear messages for NaN and fractions, so ``JsonModel`` refuses only
booleans and strings in its int/float fields (list items included), before the usual
validation runs. One model-level check leaves the JSON schema unchanged.
"""

from __future__ import annotations

import types
from typing import Annotated, Any, Union, get_args, get_origin

from pydantic import BaseModel, ValidationError, model_validator
from pydantic_core import InitErrorDetails, PydanticCustomError

_NUMERIC: dict[type, dict[str, str]] = {}
_PLAIN = frozenset({int, float, type(None)})    # values that need no look (bool is not int)


def _kind(tp: Any) -> str | None:
    """'integer' / 'number' for int / float annotations (optional, annotated or list of)."""
    if tp is int:
        return "integer"
    if tp is float:
        return "number"
    if get_origin(tp) in (Annotated, Union, types.UnionType, list, tuple):
        kinds = [k for k in map(_kind, get_args(tp)) if k]
        return kinds[0] if kinds else None
    return None


def _error(loc: tuple, value: Any, kind: str) -> InitErrorDetails:
    got = "boolean" if isinstance(value, bool) else "string"
    return InitErrorDetails(type=PydanticCustomError(
        f"{kind}_type", "Input should be a valid {kind}, not a JSON {got}",
        {"kind": kind, "got": got}), loc=loc, input=value)


class JsonModel(BaseModel):
    @model_validator(mode="before")
    @classmethod
    def _numbers_are_numbers(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        numeric = _NUMERIC.get(cls)
        if numeric is None:
            numeric = _NUMERIC[cls] = {name: k for name, f in cls.model_fields.items()
                                       if (k := _kind(f.annotation))}
        errors = []
        for name, value in data.items():
            if type(value) in _PLAIN or name not in numeric:   # the usual case, at once
                continue
            kind = numeric[name]
            if isinstance(value, list | tuple):
                errors += [_error((name, i), v, kind) for i, v in enumerate(value)
                           if isinstance(v, bool | str | bytes)]
            elif isinstance(value, bool | str | bytes):
                errors.append(_error((name,), value, kind))
        if errors:
            raise ValidationError.from_exception_data(cls.__name__, errors)
        return data
