"""List the tuned fused-MoE kernel configurations an SGLang wheel ships, per GPU, into
``model/data/sglang_moe_configs.json`` (what ``engine_advisor.model.engines.sglang`` reads to
tell a tuned Triton fused-MoE kernel from one at SGLang's default configuration).

SGLang looks its Triton fused-MoE configuration up by file name,
``E=<experts>,N=<intermediate per TP rank>,device_name=<GPU>[,dtype=<dtype>][,block_shape=[..]]
.json``, in ``sglang/srt/layers/moe/moe_runner/triton_utils/configs/triton_<version>/``, any
Triton version's folder; without one its log says "Using default MoE kernel config".

Usage:  python bench/real_engines/moe_configs.py sglang-0.5.16-*.whl
"""

from __future__ import annotations

import json
import re
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "model" / "data" / "sglang_moe_configs.json"
FOLDER = "sglang/srt/layers/moe/moe_runner/triton_utils/configs/"
NAME = re.compile(r"E=(\d+),N=(\d+),device_name=([^,]+?)(?:,dtype=([^,]+?))?"
                  r"(?:,block_shape=\[(\d+), ?(\d+)\])?(?:_down)?\.json$")


def tuned(wheel: Path) -> dict[str, list[str]]:
    """Per device name, the ``E,N,dtype`` keys of the configurations the wheel ships (dtype
    ``bf16`` where the file names none; ``fp8_w8a8_block`` with a block shape)."""
    out: dict[str, set[str]] = {}
    with zipfile.ZipFile(wheel) as z:
        for name in z.namelist():
            if not name.startswith(FOLDER):
                continue
            m = NAME.search(name.rsplit("/", 1)[-1])
            if m is None:
                continue
            e, n, device, dtype, block = m.group(1), m.group(2), m.group(3), m.group(4), m.group(5)
            kind = (dtype or "bf16") + ("_block" if block else "")
            out.setdefault(device, set()).add(f"{e},{n},{kind}")

    def order(key: str) -> list:
        return [int(x) if x.isdigit() else x for x in key.split(",")]

    return {d: sorted(keys, key=order) for d, keys in sorted(out.items())}


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__, file=sys.stderr)
        return 2
    wheel = Path(argv[0])
    version = wheel.name.split("-")[1]
    doc = {"_source": f"file names under {FOLDER} in {wheel.name} "
                      "(bench/real_engines/moe_configs.py)",
           "engine": "sglang", "version": version, "configs": tuned(wheel)}
    OUT.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"{OUT}: {sum(len(v) for v in doc['configs'].values())} configurations, "
          f"{len(doc['configs'])} devices")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
