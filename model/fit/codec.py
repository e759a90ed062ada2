"""A fitted ``CostModel`` as plain data: JSON values plus named numpy arrays
(engine_advisor.model.fit.artifact writes them to a ``.json`` and a ``.npz``).

Generic over what the model holds, so that new fields and fitted attributes need no change
here:

- every ``dataclasses.fields(CostModel)`` entry but ``engines``: its value if it is JSON (dicts
  with string keys, lists, strings, numbers, booleans, None, nested) or a numpy array;
- ``engines``: per key, an ``EngineCostModel``'s ``get_params()`` and every fitted attribute
  (a public name ending in ``_`` in ``vars()``) that is JSON or a numpy array. Private
  attributes (``_name``) are caches and are not stored.

Anything else (a tuple, a set, an object, an array of Python objects, a dict with non-string
keys) raises ``CodecError`` naming where it is: saving refuses loudly rather than lose or
pickle it. Decoding builds only ``CostModel`` and ``EngineCostModel``, never a class named in
the data.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any

import numpy as np

from engine_advisor.model.fit.costmodel import CostModel
from engine_advisor.model.fit.estimator import EngineCostModel

ESTIMATOR = "EngineCostModel"
FITTED = re.compile(r"^[A-Za-z]\w*_$")      # a public fitted attribute: coef_, n_samples_fit_
JSON_TYPES = "JSON values (dicts with string keys, lists, str, int, float, bool, None) or " \
             "numpy arrays of numbers"


class CodecError(ValueError):
    """A model that cannot be turned into data, or data that is not a model."""


def _json(value: Any, where: str) -> Any:
    """``value`` as JSON (numpy scalars become Python numbers); else ``CodecError``."""
    if value is None or isinstance(value, bool | str | int):
        return value
    if isinstance(value, float):
        return float(value)
    if isinstance(value, np.generic) and value.dtype.kind in "biuf":
        return value.item()
    if isinstance(value, list):
        return [_json(v, f"{where}[{i}]") for i, v in enumerate(value)]
    if isinstance(value, dict):
        out = {}
        for k, v in value.items():
            if not isinstance(k, str):
                raise CodecError(f"{where} has a key {k!r} of type {type(k).__name__}; "
                                 f"artifacts store {JSON_TYPES}")
            out[k] = _json(v, f"{where}.{k}")
        return out
    raise CodecError(f"{where} holds a {type(value).__module__}.{type(value).__qualname__}; "
                     f"artifacts store {JSON_TYPES}")


def _array(value: np.ndarray, where: str) -> np.ndarray:
    if value.dtype.kind not in "biufcUS":
        raise CodecError(f"{where} is a numpy array of dtype {value.dtype}, which needs "
                         f"pickle; artifacts store {JSON_TYPES}")
    return value


def _value(value: Any, where: str, key: str, arrays: dict[str, np.ndarray],
           out: dict[str, Any], refs: dict[str, str], name: str) -> None:
    """``value`` into ``out[name]`` (JSON) or into ``arrays[key]`` with ``refs[name] = key``."""
    if isinstance(value, np.ndarray):
        arrays[key] = _array(value, where)
        refs[name] = key
    else:
        out[name] = _json(value, where)


def encode_estimator(est: EngineCostModel, where: str, prefix: str,
                     arrays: dict[str, np.ndarray]) -> dict[str, Any]:
    if type(est) is not EngineCostModel:
        raise CodecError(f"{where} is a {type(est).__qualname__}, not an {ESTIMATOR}")
    params = est.get_params(deep=False)
    out: dict[str, Any] = {"class": ESTIMATOR, "params": _json(params, f"{where}.params"),
                           "attributes": {}, "arrays": {}}
    for name, value in vars(est).items():
        if name in params or name.startswith("_"):
            continue
        if not FITTED.match(name):
            raise CodecError(f"{where}.{name} is neither a parameter nor a fitted attribute "
                             "(a name ending in '_'); artifacts store only those")
        _value(value, f"{where}.{name}", f"{prefix}.{name}", arrays, out["attributes"],
               out["arrays"], name)
    return out


def encode_model(model: CostModel) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """(the model's state as JSON, its arrays by name)."""
    arrays: dict[str, np.ndarray] = {}
    fields: dict[str, Any] = {}
    field_arrays: dict[str, str] = {}
    engines: dict[str, Any] = {}
    for f in dataclasses.fields(model):
        value = getattr(model, f.name)
        if f.name == "engines":
            if not isinstance(value, dict):
                raise CodecError(f"CostModel.engines is a {type(value).__name__}, not a dict")
            for i, (key, est) in enumerate(value.items()):
                if not isinstance(key, str):
                    raise CodecError(f"CostModel.engines has a key {key!r}, not a string")
                engines[key] = encode_estimator(est, f"CostModel.engines[{key!r}]",
                                                f"engine{i}", arrays)
        else:
            _value(value, f"CostModel.{f.name}", f"field.{f.name}", arrays, fields,
                   field_arrays, f.name)
    return {"fields": fields, "field_arrays": field_arrays, "engines": engines}, arrays


def _get(d: Any, key: str, kind: type, where: str) -> Any:
    v = d.get(key) if isinstance(d, dict) else None
    if not isinstance(v, kind):
        raise CodecError(f"{where}.{key}: expected a {kind.__name__}")
    return v


def _take(refs: dict[str, Any], arrays: dict[str, Any], where: str) -> dict[str, np.ndarray]:
    out = {}
    for name, key in refs.items():
        value = arrays.get(key) if isinstance(key, str) else None
        if not isinstance(value, np.ndarray):
            raise CodecError(f"{where}.{name}: the arrays file has no array {key!r}")
        out[name] = value
    return out


def decode_estimator(d: Any, arrays: dict[str, Any], where: str) -> EngineCostModel:
    if not isinstance(d, dict) or d.get("class") != ESTIMATOR:
        raise CodecError(f"{where}: not an {ESTIMATOR}")
    try:
        est = EngineCostModel(**_get(d, "params", dict, where))
    except TypeError as exc:
        raise CodecError(f"{where}.params: {exc}") from None
    values = {**_get(d, "attributes", dict, where),
              **_take(_get(d, "arrays", dict, where), arrays, where)}
    for name, value in values.items():
        if not FITTED.match(name):
            raise CodecError(f"{where}: {name!r} is not a fitted attribute's name")
        setattr(est, name, value)
    return est


def decode_model(state: Any, arrays: dict[str, Any]) -> CostModel:
    """The ``CostModel`` of ``encode_model``'s output."""
    fields = {f.name: f for f in dataclasses.fields(CostModel)}
    values = {**_get(state, "fields", dict, "model"),
              **_take(_get(state, "field_arrays", dict, "model"), arrays, "model")}
    unknown = sorted(set(values) - set(fields) | ({"engines"} & set(values)))
    if unknown:
        raise CodecError(f"model: fields {unknown} are unknown to this engine-advisor (an "
                         "artifact of a newer version?)")
    engines = {key: decode_estimator(d, arrays, f"model.engines[{key!r}]")
               for key, d in _get(state, "engines", dict, "model").items()}
    init = {k: v for k, v in values.items() if fields[k].init}
    try:
        model = CostModel(engines=engines, **init)
    except TypeError as exc:
        raise CodecError(f"model: {exc}") from None
    for k, v in values.items():
        if not fields[k].init:
            setattr(model, k, v)
    return model
