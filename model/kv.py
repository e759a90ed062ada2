"""KV-cache dtypes the workload and the dataset accept, and their bytes per element."""

from __future__ import annotations

from typing import Literal

KvDtype = Literal["bf16", "fp16", "fp8"]
DTYPE_BYTES: dict[str, int] = {"bf16": 2, "fp16": 2, "fp8": 1}
