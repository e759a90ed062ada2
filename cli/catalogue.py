"""The flags that name hardware and models: ``--gpu`` / ``--gpu-spec`` (a custom GPU, inline
JSON or a JSON / YAML file) and ``--list-gpus`` / ``--list-presets``, shared by every command
that takes a GPU. Model imports happen when a flag is used, not when the parser is built."""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from pathlib import Path

GPU_HELP = ("GPU type (default {default}): --list-gpus lists the built-in ones, --gpu-spec "
            "describes another")
SPEC_HELP = ("a custom GPU instead of --gpu: inline JSON or a JSON / YAML file with name, "
             "memory_bytes, hbm_bandwidth (bytes/s) and optionally nvlink_bandwidth, "
             "flops_bf16, flops_fp8, flops_fp4, vendor, e.g. '{\"name\": \"A100\", "
             "\"memory_bytes\": 85899345920, \"hbm_bandwidth\": 2.0e12}'")
SPEC_EXAMPLE = ('{"name": "A100", "memory_bytes": 85899345920, "hbm_bandwidth": 2.0e12, '
                '"flops_bf16": 312e12}')


def add_hardware_flags(p: argparse.ArgumentParser, default: str | None = "B300") -> None:
    """--gpu or --gpu-spec (one of them), --list-gpus and --list-presets."""
    g = p.add_mutually_exclusive_group()
    g.add_argument("--gpu", default=default, help=GPU_HELP.format(default=default or "B300"))
    g.add_argument("--gpu-spec", metavar="JSON|FILE", type=gpu_spec, help=SPEC_HELP)
    p.add_argument("--list-gpus", action=_List, lister=gpu_table,
                   help="print the built-in GPUs and exit")
    p.add_argument("--list-presets", action=_List, lister=preset_table,
                   help="print the built-in model presets and exit")


class _List(argparse.Action):
    """A flag that prints a listing and exits 0, like --help (before required flags are
    checked)."""

    def __init__(self, option_strings, dest, lister, help=None):
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, help=help)
        self.lister = lister

    def __call__(self, parser, namespace, values, option_string=None):
        try:
            print(self.lister(), flush=True)
        except BrokenPipeError:          # `| head`: quietly, as run_handler does
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            parser.exit(141)
        parser.exit(0)


def gpu_spec(text: str):
    """``--gpu-spec``: a ``engine_advisor.model.hardware.gpus.GpuSpec`` from inline JSON or a JSON /
    YAML file."""
    from pydantic import ValidationError

    from engine_advisor.model.errors import validation_message
    from engine_advisor.model.hardware.gpus import GpuSpec

    raw = text.strip()
    if raw.startswith("{"):
        data = _parse(raw, "inline JSON", yaml_ok=False)
    else:
        path = Path(raw)
        try:
            body = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise argparse.ArgumentTypeError(
                f"{raw}: neither inline JSON (starting with '{{') nor a readable file "
                f"({getattr(exc, 'strerror', None) or exc})") from None
        data = _parse(body, raw, yaml_ok=path.suffix.lower() != ".json")
    if not isinstance(data, dict):
        raise argparse.ArgumentTypeError(
            "expected an object with name, memory_bytes and hbm_bandwidth, e.g. " + SPEC_EXAMPLE)
    try:
        return GpuSpec.model_validate(data)
    except ValidationError as exc:
        raise argparse.ArgumentTypeError(validation_message(exc)) from None


def _parse(body: str, where: str, yaml_ok: bool):
    try:
        return json.loads(body)
    except json.JSONDecodeError as exc:
        if not yaml_ok:
            raise argparse.ArgumentTypeError(f"{where}: not valid JSON ({exc})") from None
    import yaml
    try:
        data = yaml.safe_load(body)
    except yaml.YAMLError as exc:
        raise argparse.ArgumentTypeError(f"{where}: neither JSON nor YAML ({exc})") from None
    if isinstance(data, dict):   # YAML 1.1 reads 2.0e12 (no exponent sign) as a string
        data = {k: float(v) if isinstance(v, str) and _FLOAT.match(v) else v
                for k, v in data.items()}
    return data


_FLOAT = re.compile(r"^[-+]?(\d+\.?\d*|\.\d+)[eE][-+]?\d+$")


def _tflops(x: float | None) -> str:
    return f"{x / 1e12:,.0f}" if x else "-"


def gpu_table() -> str:
    """The built-in GPU catalogue (``engine_advisor.model.hardware.gpus.BUILTIN_GPUS``), one line
    per GPU."""
    from engine_advisor.model.hardware.gpus import BUILTIN_GPUS, GIB

    head = (f"{'GPU':<8}{'vendor':<8}{'memory':>20}{'HBM':>11}{'NVLink/dir':>12}"
            f"  {'dense TFLOPS bf16 / fp8 / fp4'}")
    lines = [head, "-" * len(head)]
    for g in BUILTIN_GPUS.values():
        mem = f"{g.memory_bytes / GIB:.1f} GiB ({g.memory_bytes / 1e9:.1f} GB)"
        link = f"{g.nvlink_bandwidth / 1e9:.0f} GB/s" if g.nvlink_bandwidth else "-"
        lines.append(f"{g.name:<8}{g.vendor or '-':<8}{mem:>20}"
                     f"{g.hbm_bandwidth / 1e12:>6.2f} TB/s{link:>12}  "
                     f"{_tflops(g.flops_bf16)} / {_tflops(g.flops_fp8)} / {_tflops(g.flops_fp4)}")
    lines += ["", f"another GPU: --gpu-spec '{SPEC_EXAMPLE}' (or a JSON / YAML file)"]
    return "\n".join(lines)


def preset_table() -> str:
    """The built-in model presets (``engine_advisor.model.arch.PRESETS``), one line per preset."""
    from engine_advisor.model.arch import PRESETS
    from engine_advisor.model.physics.shape import preset_shape

    wide = max(map(len, PRESETS)) + 2
    head = (f"{'preset':<{wide}}{'attention':<10}{'layers (full / linear)':>23}"
            f"{'KV B/token bf16':>17}{'weights':>12}  source")
    lines = [head, "-" * len(head)]
    for name in PRESETS:
        s = preset_shape(name, "bf16")
        layers = f"{s.n_layers} ({s.n_full_layers} / {s.n_linear_layers})"
        lines.append(f"{name:<{wide}}{s.attention.upper():<10}{layers:>23}"
                     f"{s.kv_bytes_per_token:>17,.0f}{s.weight_bytes / 1e9:>9,.1f} GB  "
                     f"{_source(name)}")
    lines += ["", "another model: --hf-config config.json (any Hugging Face config), or "
                  "--kv-bytes-per-token"]
    return "\n".join(lines)


def _source(name: str) -> str:
    """The Hugging Face repository a preset's config.json comes from."""
    from engine_advisor.model.arch.presets import preset_source

    words = preset_source(name).split()
    return words[2] if words[:2] == ["Hugging", "Face"] and len(words) > 2 else "-"
