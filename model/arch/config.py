"""Reading a Hugging Face config.json: typed look-ups that fail with the field's name.

Every problem is an ``ArchConfigError`` (a ``ValueError``) whose ``field`` is the dotted path
of the culprit, e.g. ``hf_config.num_hidden_layers``; no KeyError or TypeError escapes.
"""

from __future__ import annotations

import math
from typing import Any

# Keys a multimodal wrapper keeps at the top level that describe the text model too.
_INHERITED = ("tie_word_embeddings", "torch_dtype", "dtype", "quantization_config")


class ArchConfigError(ValueError):
    """A config.json (or preset) the architecture cannot be derived from; ``field`` names the
    culprit as a dotted path (``hf_config.linear_attn_config.num_heads``)."""

    def __init__(self, field: str, message: str):
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


class Config:
    """A config dict plus the path it sits at, with look-ups that validate their values."""

    def __init__(self, data: Any, path: str = "hf_config"):
        if not isinstance(data, dict):
            raise ArchConfigError(path, "must be a JSON object (the contents of config.json)")
        self.data = data
        self.path = path

    def field(self, key: str) -> str:
        return f"{self.path}.{key}"

    def has(self, key: str) -> bool:
        return self.data.get(key) is not None

    def get(self, key: str, default: Any = None) -> Any:
        value = self.data.get(key)
        return default if value is None else value

    def int(self, key: str, default: int | None = None, *, minimum: int = 1) -> int:
        value = self.data.get(key)
        if value is None:
            if default is None:
                raise ArchConfigError(self.field(key), "missing")
            return default
        return as_int(value, self.field(key), minimum)

    def opt_int(self, key: str, *, minimum: int = 1) -> int | None:
        value = self.data.get(key)
        return None if value is None else as_int(value, self.field(key), minimum)

    def bool(self, key: str, default: bool) -> bool:
        value = self.data.get(key)
        if value is None:
            return default
        if not isinstance(value, bool):
            raise ArchConfigError(self.field(key), f"must be true or false, got {value!r}")
        return value

    def str(self, key: str, default: str | None = None) -> str | None:
        value = self.data.get(key)
        if value is None:
            return default
        if not isinstance(value, str):
            raise ArchConfigError(self.field(key), f"must be a string, got {value!r}")
        return value

    def int_list(self, key: str, *, minimum: int = 0) -> list[int] | None:
        value = self.data.get(key)
        if value is None:
            return None
        if not isinstance(value, list):
            raise ArchConfigError(self.field(key), "must be a list of integers")
        return [as_int(v, f"{self.field(key)}[{i}]", minimum) for i, v in enumerate(value)]

    def str_list(self, key: str) -> list[str] | None:
        value = self.data.get(key)
        if value is None:
            return None
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise ArchConfigError(self.field(key), "must be a list of strings")
        return value

    def sub(self, key: str) -> Config | None:
        value = self.data.get(key)
        return None if value is None else Config(value, self.field(key))


def as_int(value: Any, field: str, minimum: int = 1) -> int:
    if (isinstance(value, bool) or not isinstance(value, int | float)
            or not math.isfinite(value) or int(value) != value):
        raise ArchConfigError(field, f"must be an integer, got {value!r}")
    if value < minimum:
        raise ArchConfigError(field, f"must be at least {minimum}, got {int(value)}")
    return int(value)


def text_config(cfg: Any) -> Config:
    """The language model's config: ``text_config`` (or ``language_config``) of a multimodal
    wrapper, with the few keys such wrappers keep at the top level filled in; else ``cfg``."""
    top = Config(cfg)
    for key in ("text_config", "language_config"):
        inner = top.data.get(key)
        if inner is None:
            continue
        if not isinstance(inner, dict):
            raise ArchConfigError(top.field(key), "must be a JSON object")
        merged = {k: top.data[k] for k in _INHERITED if top.data.get(k) is not None}
        merged.update({k: v for k, v in inner.items() if v is not None})
        return Config(merged, top.field(key))
    return top
