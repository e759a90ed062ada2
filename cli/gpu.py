"""``engine-advisor calibrate gpu`` and ``calibrate dcp``: GPU kernel calibration commands.

Registered into the ``calibrate`` group by cli/calibrate.py through ``register_calibrate``. PyTorch
is the optional extra ``gpu``; without it, or without a CUDA device, the commands exit with a clear
error. ``python -m engine_advisor.cli.gpu gpu|dcp ...`` runs them on a bare GPU image (no service
dependencies: this module and what it imports at the top are stdlib only).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from engine_advisor.cli.args import int_list
from engine_advisor.cli.errors import CliError, run_handler


def register_calibrate(csub: argparse._SubParsersAction) -> None:
    p = csub.add_parser(
        "gpu", help="measure decode attention, HBM bandwidth and call overhead on this GPU",
        description="Measure decode attention (GQA shapes through PyTorch SDPA, the MLA shape "
                    "through a Triton split-KV kernel) over a grid of batch and context, plain "
                    "HBM reads and the per-call overhead; write a hardware profile (JSON) and "
                    "its raw measurements (CSV beside it). Needs PyTorch with CUDA.")
    p.add_argument("--out", required=True, metavar="PROFILE",
                   help="profile to write, e.g. calibration/profiles/h200.json")
    p.add_argument("--quick", action="store_true", help="a small grid (about a minute)")
    p.add_argument("--device", type=int, default=0, help="CUDA device index (default 0)")
    p.add_argument("--gpu-name", help="GPU type to file the profile under (default: from the "
                                      "device name, e.g. 'NVIDIA H200' -> H200)")
    p.add_argument("--save-raw", metavar="JSON", help="also save the raw measurements here")
    p.add_argument("--from-raw", metavar="JSON",
                   help="build the profile from saved raw measurements instead of measuring")
    p.set_defaults(handler=run_gpu)

    d = csub.add_parser(
        "dcp", help="measure DCP split-KV attention and its combine across GPUs",
        description="One process per GPU (torch.distributed, NCCL): for each DCP size the "
                    "machine allows, time split-KV MLA decode attention, the combine of partial "
                    "outputs and LSEs (all-gather + merge, all-to-all + merge) and the bare "
                    "collectives; check the merged output against full attention; write a DCP "
                    "profile (JSON) and its raw measurements (CSV beside it).")
    d.add_argument("--out", required=True, metavar="PROFILE",
                   help="profile to write, e.g. calibration/profiles/h200-dcp.json")
    d.add_argument("--quick", action="store_true", help="a small grid")
    d.add_argument("--gpus", type=int, help="processes / GPUs to use (default: all visible)")
    d.add_argument("--cpu", type=int, metavar="N",
                   help="run N processes on the CPU with gloo instead (a dry run of the code "
                        "path; times are not GPU times)")
    d.add_argument("--dcp-sizes", type=int_list, help="DCP sizes (default 2, 4, 8 up to --gpus)")
    d.add_argument("--batches", type=int_list, help="batch sizes (default 1..64)")
    d.add_argument("--contexts", type=int_list, help="context lengths (default 1K..256K)")
    d.add_argument("--mla-config", type=int_list, metavar="BH,BN,WARPS,STAGES",
                   help="Triton MLA kernel configuration (default: the tuned one of the GPU "
                        "profile beside --out, else 32,64,4,2)")
    d.add_argument("--gpu-name", help="GPU type to file the profile under")
    d.add_argument("--save-raw", metavar="JSON", help="also save the raw measurements here")
    d.add_argument("--from-raw", metavar="JSON",
                   help="build the profile from saved raw measurements instead of measuring")
    d.set_defaults(handler=run_dcp)


def require_torch_cuda(min_devices: int = 1):
    """Import torch and check CUDA devices, or raise a CliError saying what is missing."""
    try:
        import torch
    except ImportError:
        raise CliError("PyTorch is not installed: GPU calibration needs the 'gpu' extra "
                     "(pip install 'engine-advisor[gpu]')") from None
    if not torch.cuda.is_available():
        raise CliError(f"no CUDA device: PyTorch {torch.__version__} sees no GPU (CUDA build "
                     f"{torch.version.cuda or 'none'}); run this on a machine with an NVIDIA GPU")
    n = torch.cuda.device_count()
    if n < min_devices:
        raise CliError(f"this command needs at least {min_devices} CUDA devices; {n} visible")
    return torch


def _load_raw(path: str, keys: tuple[str, ...]) -> dict:
    """Saved raw measurements holding ``keys`` (those the profile builder reads)."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise CliError(f"--from-raw: cannot read {path}: {exc}") from None
    if not isinstance(data, dict) or "rows" not in data:
        raise CliError(f"--from-raw: {path} holds no raw measurements (no 'rows')")
    missing = [k for k in keys if k not in data]
    if missing:
        raise CliError(f"--from-raw: {path} lacks {', '.join(map(repr, missing))} (raw "
                     "measurements of the other command?)")
    return data


def _save_raw(path: str | None, data: dict) -> None:
    if path:
        try:
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            Path(path).write_text(json.dumps(data))
        except OSError as exc:
            raise CliError(_cannot_write("--save-raw", path, exc)) from None


def _cannot_write(flag: str, path: str | Path, exc: OSError) -> str:
    """``--out: PATH: cannot write (No space left on device)``, naming the file that failed."""
    from engine_advisor.model.errors import (
        DiskError,  # here: --save-raw runs where only torch may be
    )

    if isinstance(exc, DiskError):          # already names the path and the cause
        return f"{flag}: {exc}"
    return f"{flag}: {exc.filename or path}: cannot write ({exc.strerror or exc})"


def _command(args: argparse.Namespace, name: str) -> str:
    parts = [f"engine-advisor calibrate {name} --out {args.out}"]
    if args.quick:
        parts.append("--quick")
    return " ".join(parts)


def run_gpu(args: argparse.Namespace) -> int:
    out = Path(args.out)
    if out.suffix != ".json":
        raise CliError(f"--out: {args.out!r} must be a .json path (the CSV is written beside it)")
    if args.from_raw:
        data = _load_raw(args.from_raw, ("rows", "meta"))
    else:
        require_torch_cuda()
        from engine_advisor.calibration.kernels.gpu_bench import run

        data = run(args.device, args.quick)
        _save_raw(args.save_raw, data)
    from engine_advisor.calibration.kernels.gpu_profile import summary, write_profile

    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        prof = write_profile(out, data["rows"], data["meta"], data.get("command")
                             or _command(args, "gpu"), args.gpu_name)
    except OSError as exc:
        raise CliError(_cannot_write("--out", out, exc)) from None
    except ValueError as exc:
        raise CliError(str(exc)) from None
    print(summary(prof))
    print(f"wrote {out} and {out.with_suffix('.csv')}")
    return 0


def _sibling_mla_config(out: Path) -> list[int] | None:
    if not out.name.endswith("-dcp.json"):
        return None
    sib = out.with_name(out.name[: -len("-dcp.json")] + ".json")
    try:
        cfg = json.loads(sib.read_text())["mla_kernel"]["config"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return list(cfg) if cfg else None


def run_dcp(args: argparse.Namespace) -> int:
    out = Path(args.out)
    if out.suffix != ".json":
        raise CliError(f"--out: {args.out!r} must be a .json path (the CSV is written beside it)")
    if args.from_raw:
        data = _load_raw(args.from_raw, ("rows", "gpu", "world"))
    else:
        if args.cpu is not None:
            try:
                import torch  # noqa: F401
            except ImportError:
                raise CliError("PyTorch is not installed: calibrate dcp needs the 'gpu' extra "
                             "(pip install 'engine-advisor[gpu]')") from None
            world, device = args.cpu, "cpu"
        else:
            torch = require_torch_cuda()
            world, device = args.gpus or torch.cuda.device_count(), "cuda"
            if world > torch.cuda.device_count():
                raise CliError(f"--gpus: {world} requested, {torch.cuda.device_count()} visible")
        if world < 2:
            raise CliError(f"DCP needs at least 2 processes; {world} available "
                         "(--gpus, --cpu)")
        from engine_advisor.calibration.kernels.dcp_bench import run

        try:
            data = run(world, device=device, quick=args.quick, dcps=args.dcp_sizes,
                       batches=args.batches, contexts=args.contexts,
                       mla_config=args.mla_config or _sibling_mla_config(out))
        except ValueError as exc:
            raise CliError(str(exc)) from None
        _save_raw(args.save_raw, data)
    from engine_advisor.calibration.kernels.dcp_profile import summary, write_profile

    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        prof = write_profile(out, data, data.get("command") or _command(args, "dcp"),
                             args.gpu_name)
    except OSError as exc:
        raise CliError(_cannot_write("--out", out, exc)) from None
    except ValueError as exc:
        raise CliError(str(exc)) from None
    print(summary(prof))
    print(f"wrote {out} and {out.with_suffix('.csv')}")
    return 0


def main(argv: list[str] | None = None) -> int:
    """``python -m engine_advisor.cli.gpu gpu|dcp ...`` without the full CLI's dependencies."""
    parser = argparse.ArgumentParser(prog="engine-advisor calibrate")
    register_calibrate(parser.add_subparsers(dest="calibrate_command", required=True))
    return run_handler(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
