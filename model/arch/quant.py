"""Bytes of one linear layer's weight as a checkpoint stores it, quantization scales included.

Schemes read from ``quantization_config`` (bytes per weight, then the scales):

- none: the checkpoint dtype (``torch_dtype`` / ``dtype``: bf16/fp16 2 B, fp32 4 B).
- ``fp8`` (DeepSeek / Kimi-K2 / Qwen-FP8 style): 1 B per weight; with ``weight_block_size``
  [bo, bi] one fp32 scale per bo x bi block, else one fp32 scale per tensor. lm_head stays at
  the checkpoint dtype; ``modules_to_not_convert`` too.
- ``compressed-tensors``: each ``config_groups`` entry gives ``targets`` (``Linear`` = every
  linear layer, ``re:`` regexes, names) and ``weights`` {num_bits, type, strategy, group_size,
  block_structure}; ``ignore`` lists exempt modules. Group scales: MXFP4 (``format`` mxfp4 or
  uint8 scales) one E8M0 byte per 32 weights; NVFP4 (float, 4 bits) one fp8 byte per 16 weights
  plus an fp32 global scale; integer groups (AWQ/GPTQ-like) a 2-byte scale (+ a 4-bit zero point
  when asymmetric) per group; channel scales 2 B per output row; block scales 4 B per block.
- ``modelopt`` (``quant_algo`` NVFP4 / FP8, ``exclude_modules`` globs; also the
  ``hf_quant_config.json`` form ``{"quantization": {...}}``).
- ``awq`` / ``gptq``: ``bits`` per weight, per ``group_size`` (-1 = whole row) a 2-byte scale and
  a packed zero point; ``modules_to_not_convert``.
- ``mxfp4`` (gpt-oss style): 4 bits per weight, one E8M0 byte per 32; ``modules_to_not_convert``.

Module names follow the Hugging Face layout (``model.layers.3.self_attn.q_proj``,
``model.layers.3.mlp.experts.0.gate_proj``, ``lm_head``); ignore patterns written with a
``language_model.`` prefix (multimodal checkpoints) match the same modules. Embeddings, norms,
MoE routers, latent-MoE projections and convolution kernels are never quantized here.
Other methods (bitsandbytes, GGUF, ...) are refused with an ``ArchConfigError``.
"""

from __future__ import annotations

import fnmatch
import math
import re
from dataclasses import dataclass

from engine_advisor.model.arch.config import ArchConfigError, Config

DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "half": 2, "float32": 4, "float": 4, "bf16": 2,
               "fp16": 2, "fp32": 4}
_WRAPPER_PREFIX = re.compile(r"^(?:model\.)?language_model\.")
_LAYER_INDEX = re.compile(r"\.\d|\\d|\[0-9")     # a pattern that names modules by index


@dataclass(frozen=True)
class Format:
    """How one quantized weight is stored: ``bits`` per element plus scales."""

    label: str
    bits: int
    group: int = 0                # elements per scale along the input dim (0 = none)
    group_scale_bytes: float = 0.0
    block: tuple[int, int] | None = None   # (out, in) block per scale
    block_scale_bytes: float = 0.0
    row_scale_bytes: float = 0.0  # per output row
    tensor_scale_bytes: float = 0.0

    def bytes(self, out_f: int, in_f: int) -> float:
        total = (out_f * in_f * self.bits / 8 + self.tensor_scale_bytes
                 + out_f * self.row_scale_bytes)
        if self.group:
            total += out_f * math.ceil(in_f / self.group) * self.group_scale_bytes
        if self.block:
            total += (math.ceil(out_f / self.block[0]) * math.ceil(in_f / self.block[1])
                      * self.block_scale_bytes)
        return total


def _pattern_regex(patterns: list[str]) -> re.Pattern | None:
    """One regex for a list of module patterns: ``re:...`` regexes as written; plain names and
    globs match a dotted-segment-aligned part of the name (a parent module excludes its
    children), with any multimodal ``language_model.`` prefix dropped."""
    parts = []
    for p in patterns:
        if p.startswith("re:"):
            parts.append(f"(?:{p[3:]})")
        else:
            body = fnmatch.translate(_WRAPPER_PREFIX.sub("", p)).removeprefix("(?s:")
            body = body.removesuffix(")\\Z")
            parts.append(rf"(?:(?:.*\.)?{body}(?:\..*)?)")
    if not parts:
        return None
    try:
        return re.compile(r"^(?:" + "|".join(parts) + r")$")
    except re.error as exc:
        raise ArchConfigError("hf_config.quantization_config",
                              f"bad module pattern: {exc}") from None


class Quantization:
    """Weight storage of a checkpoint: ``linear_bytes(name, out, in)`` for one linear layer."""

    def __init__(self, dtype_bytes: int, dtype_label: str, groups=(), ignore=None,
                 method: str | None = None):
        self.dtype_bytes = dtype_bytes
        self.dtype_label = dtype_label
        self.method = method
        self._groups = list(groups)    # [(target regex or None = every linear, Format)]
        self._ignore = ignore
        # whether any pattern names a layer by index (then layers are counted one by one)
        texts = [rx.pattern for rx, _ in self._groups if rx is not None]
        texts += [ignore.pattern] if ignore is not None else []
        self.index_free = not any(_LAYER_INDEX.search(x) for x in texts)

    def format_for(self, name: str) -> Format | None:
        if self._ignore is not None and self._match(self._ignore, name):
            return None
        for target, fmt in self._groups:
            if target is None or self._match(target, name):
                return fmt
        return None

    @staticmethod
    def _match(rx: re.Pattern, name: str) -> bool:
        return bool(rx.match(name) or rx.match("language_model." + name))

    def linear_bytes(self, name: str, out_f: int, in_f: int) -> float:
        fmt = self.format_for(name)
        return out_f * in_f * self.dtype_bytes if fmt is None else fmt.bytes(out_f, in_f)

    def label_for(self, name: str) -> str:
        fmt = self.format_for(name)
        return self.dtype_label if fmt is None else fmt.label


def checkpoint_dtype(cfg: Config) -> tuple[int, str]:
    for key in ("torch_dtype", "dtype"):
        value = cfg.get(key)
        if value is None:
            continue
        name = str(value).removeprefix("torch.")
        if name not in DTYPE_BYTES:
            raise ArchConfigError(cfg.field(key), f"unknown dtype {value!r}; known: bfloat16, "
                                  "float16, float32")
        label = {"bfloat16": "bf16", "float16": "fp16", "half": "fp16"}.get(name, name)
        return DTYPE_BYTES[name], label if label != "float" else "float32"
    return 2, "bf16"   # configs without a dtype: 16-bit checkpoints are the norm


def parse(cfg: Config) -> Quantization:
    dtype_bytes, dtype_label = checkpoint_dtype(cfg)
    q = cfg.sub("quantization_config")
    if q is None:
        return Quantization(dtype_bytes, dtype_label)
    if q.sub("quantization") is not None:          # hf_quant_config.json form (ModelOpt)
        q = q.sub("quantization")
        method = "modelopt"
    else:
        method = (q.str("quant_method") or ("modelopt" if q.has("quant_algo") else "")).lower()
    reader = _READERS.get(method)
    if reader is None:
        raise ArchConfigError(q.field("quant_method"),
                              f"quantization {method or '(none given)'!r} is not modelled; "
                              f"known: {', '.join(sorted(_READERS))}")
    groups, ignore = reader(q)
    return Quantization(dtype_bytes, dtype_label, groups, ignore, method)


def _not_convert(q: Config, key: str, always=()) -> re.Pattern | None:
    names = list(always) + (q.str_list(key) or [])
    return _pattern_regex(names)


def _fp8(q: Config):
    block = q.int_list("weight_block_size", minimum=1)
    if block is not None:
        if len(block) != 2:
            raise ArchConfigError(q.field("weight_block_size"), "must be [out, in]")
        fmt = Format(f"fp8 block {block[0]}x{block[1]}", 8, block=(block[0], block[1]),
                     block_scale_bytes=4)
    else:
        fmt = Format("fp8", 8, tensor_scale_bytes=4)
    return [(None, fmt)], _not_convert(q, "modules_to_not_convert", ["lm_head"])


def _mx_or_nv_fp4(label: str) -> Format:
    if label == "mxfp4":
        return Format("mxfp4 g32", 4, group=32, group_scale_bytes=1)
    return Format("nvfp4 g16", 4, group=16, group_scale_bytes=1, tensor_scale_bytes=4)


def _compressed_tensors(q: Config):
    groups_cfg = q.sub("config_groups")
    if groups_cfg is None or not groups_cfg.data:
        raise ArchConfigError(q.field("config_groups"), "missing (compressed-tensors needs it)")
    groups = []
    top_format = (q.str("format") or "").lower()
    for gname in groups_cfg.data:
        g = groups_cfg.sub(gname)
        w = g.sub("weights") if g is not None else None
        if g is None or w is None:
            continue
        bits = w.int("num_bits")
        kind = (w.str("type") or "int").lower()
        strategy = (w.str("strategy") or ("group" if w.has("group_size") else "tensor")).lower()
        fmt_name = (g.str("format") or top_format).lower()
        scale_dtype = str(w.get("scale_dtype", "")).lower()
        if bits == 4 and kind == "float":
            fmt = _mx_or_nv_fp4("mxfp4" if ("mxfp4" in fmt_name or "uint8" in scale_dtype)
                                else "nvfp4")
        elif strategy in ("group", "tensor_group"):
            size = w.int("group_size")
            zero = 0.0 if w.bool("symmetric", True) else bits / 8
            fmt = Format(f"{kind}{bits} g{size}", bits, group=size, group_scale_bytes=2 + zero)
        elif strategy == "block":
            block = w.int_list("block_structure", minimum=1) or []
            if len(block) != 2:
                raise ArchConfigError(w.field("block_structure"), "must be [out, in]")
            fmt = Format(f"{kind}{bits} block {block[0]}x{block[1]}", bits,
                         block=(block[0], block[1]), block_scale_bytes=4)
        elif strategy == "channel":
            fmt = Format(f"{kind}{bits} per-channel", bits, row_scale_bytes=2)
        else:
            fmt = Format(f"{kind}{bits}", bits, tensor_scale_bytes=4)
        targets = g.str_list("targets") or ["Linear"]
        rx = None if "Linear" in targets else _pattern_regex(targets)
        groups.append((rx, fmt))
    if not groups:
        raise ArchConfigError(q.field("config_groups"), "no group quantizes weights")
    return groups, _not_convert(q, "ignore")


def _modelopt(q: Config):
    algo = (q.str("quant_algo") or "").upper()
    if algo == "NVFP4":
        fmt = _mx_or_nv_fp4("nvfp4")
    elif algo == "FP8":
        fmt = Format("fp8", 8, tensor_scale_bytes=4)
    else:
        raise ArchConfigError(q.field("quant_algo"), f"ModelOpt algorithm {algo!r} is not "
                              "modelled; known: NVFP4, FP8")
    ignore = q.str_list("exclude_modules") or q.str_list("ignore") or []
    return [(None, fmt)], _pattern_regex(ignore)


def _int_groups(q: Config):
    bits = q.int("bits", 4 if q.str("quant_method") == "awq" else None)
    size = q.int("group_size", 128, minimum=-1)
    if size in (0, -1):
        fmt = Format(f"int{bits} per-channel", bits, row_scale_bytes=2 + bits / 8)
    else:
        fmt = Format(f"int{bits} g{size}", bits, group=size, group_scale_bytes=2 + bits / 8)
    return [(None, fmt)], _not_convert(q, "modules_to_not_convert", ["lm_head"])


def _mxfp4(q: Config):
    return [(None, _mx_or_nv_fp4("mxfp4"))], _not_convert(q, "modules_to_not_convert",
                                                          ["lm_head"])


_READERS = {"fp8": _fp8, "compressed-tensors": _compressed_tensors, "modelopt": _modelopt,
            "awq": _int_groups, "gptq": _int_groups, "mxfp4": _mxfp4}
