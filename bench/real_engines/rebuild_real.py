#!/usr/bin/env python3
"""Rebuild the shipped real-engine run folders and write the combined dataset the default
model is fitted from (``model/data/h200_real.csv``).

The folders under ``bench/data/h200-real/runs/`` were measured by ``run.py`` with an older
``calibrate run`` (rows without ``decode_step_s``, ``kv_capacity_tokens``, ``weights``). This
re-derives every row from its samples with the current semantics, per engine and preset: the
same as

    engine-advisor calibrate rebuild bench/data/h200-real/runs/TAG/ctx* --load-format dummy \\
        --engine-log bench/data/h200-real/logs/TAG.log \\
        --metrics bench/data/h200-real/logs/TAG.metrics.txt \\
        [--server-info bench/data/h200-real/logs/TAG.info.json]      # SGLang

(the served model is the preset the engines served it as), then concatenates the folders' rows.
Run from the repository root, with engine-advisor installed:

    python bench/real_engines/rebuild_real.py
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from engine_advisor.calibration.sweep.rebuild import RebuildInputs, rebuild  # noqa: E402
from engine_advisor.model.diskio import atomic_write  # noqa: E402
from engine_advisor.model.fit.dataset import header_csv, read_csv, row_csv  # noqa: E402

DATA = REPO / "bench" / "data" / "h200-real"
COMBINED = REPO / "model" / "data" / "h200_real.csv"
# sglang-deepseek-v2-lite-rerun: that engine and preset's 16,384-token points, measured again on
# 2026-12-02 by the current sweep (its two-chunk warm-up, engine_advisor.calibration.sweep.warmup)
# on a fresh server with the same command; the first measurement is kept under superseded/ (its 1 x
# 16,384 prefill, the server's first chunk over a cached prefix, took 0.95 s; 0.30 s re-measured)
# vllm-qwen3-32b and sglang-qwen3-32b (2026-12-02): a third preset, 64 dense GQA layers, contexts
# 1K-32K (its model length is 40,960): run.py all --only vllm-qwen3-32b sglang-qwen3-32b --grid
# "1024:1,8,32,64;4096:1,16,48;16384:1,4,12;32768:1,2,6" vllm-nemotron-3-nano-30b-a3b and
# sglang-qwen3-next-80b-a3b-fp8 (2026-12-03, both shipped unfitted, below): two hybrids, a Mamba2
# one (vLLM) and a Gated DeltaNet one with FP8 block weights (SGLang), measured by `run.py all
# --only TAG` with the same command as the others on run.py's hybrid grid (HYBRID_GRID: 1,024 x
# 1-192, 16,384 x 1-16, 65,536 x 1-8, 131,072 and 260,000 x 1; Qwen3-Next also 32,768 x 80, more KV
# than SGLang holds), model length 262,144. vLLM was launched with --max-num-seqs 128 (its default
# ran out of memory capturing CUDA graphs for a hybrid; run.py EXTRA_FLAGS), so those rows record
# max_running 128; SGLang ran with its defaults (its scheduler chose 66 running requests from a
# 330-slot state pool), so its rows leave max_running empty; that SGLang run is superseded by
# the one below (its 1,024 x 192 point had lost one request's connection in a first attempt).
# vllm-qwen3-next-80b-a3b-fp8 (2026-12-04 00:09-00:16 UTC): vLLM on the Gated DeltaNet hybrid,
# `run.py all --only TAG` on the same grid, with the CuTe DSL wheels and quack-kernels 0.5.0 in
# its folder, VLLM_USE_DEEP_GEMM=0 (run.py's engine environment) and `--gdn-prefill-backend
# triton` (--engine-cmd): vLLM 0.26.0's default Gated DeltaNet prefill on an H200, FlashInfer's
# CuTe DSL kernel, raised "SM90 GDN prefill DSL kernel is unavailable" at the first request
# (superseded/vllm-qwen3-next-80b-a3b-fp8-flashinfer-gdn-dsl.log); the first start of this model
# (2026-12-03, without the DSL wheels) died the same way (superseded/*-first-start.*). Its FP8
# block GEMMs ran vLLM's Triton kernel with "Using default MoE config" for 512 experts x 512.
TAGS = ("vllm-deepseek-v2-lite", "sglang-deepseek-v2-lite", "sglang-deepseek-v2-lite-rerun",
        "vllm-llama-3.1-8b", "sglang-llama-3.1-8b", "vllm-qwen3-32b", "sglang-qwen3-32b")
# Measured but not fitted (model/data/h200_real_unfitted.csv): vllm-qwen3-30b-a3b and
# sglang-qwen3-30b-a3b (2026-12-02), a second MoE (GQA, 128 experts of which 8 per token in all 48
# layers), with the same command and grid. vLLM's random weights route its batches as a trained
# router would (its steps grow with the batch), not as DeepSeek-V2-Lite's (diversity 0.02), and its
# tuned fused-MoE configuration runs at the kernel tables' floor (V2-Lite's default one at twice
# it). Fitted with the rest, each model at its own routing diversity
# (engine_advisor.model.fit.fitting.choose_diversity), vLLM's stepwise selection stops after one
# term (7.5 % held out, against 1.6 % without them); engine_advisor.model.validation.leave_model_out
# checks them as a model left out. vllm-mixtral-8x7b, sglang-mixtral-8x7b and
# sglang-mixtral-8x7b-rerun (2026-12-02): a third MoE the prior and the fit never saw (32 GQA MoE
# layers, 8 experts of 14,336, 2 per token; 93 GB), shipped unfitted to stay a left-out check. Same
# command and grid, except the longest context: its model length is 32,768, so the 32,768-token
# points became 32,640 (prompt + 128 outputs = the model length). vLLM ran those; SGLang clips a
# request's outputs to its context length - 2 minus the prompt (126 here: scheduler max_req_len =
# context_len - 1, then - 1), so its three 32,640 points failed (bench/data/h200-real/superseded/)
# and ran again at 32,512 on a fresh server with the same command (sglang-mixtral-8x7b-rerun).
# sglang-qwen3-next-80b-a3b-fp8 (2026-12-04 21:29-21:40 UTC) runs SGLang's default block-FP8
# GEMM on Hopper, DeepGEMM, compiled at first use (run.py ENGINE_ENV: no precompile of every M up
# to 16K; 419 s to healthy, most of it compiling during the prefill CUDA-graph captures). Its
# first run (2026-12-03, superseded/sglang-qwen3-next-80b-a3b-fp8-triton-fp8/) had
# SGLANG_ENABLE_JIT_DEEPGEMM=0, so that its FP8 block GEMMs ran SGLang's Triton kernel at an
# untuned default configuration ("Using default W8A8 Block FP8 kernel config. Performance might be
# sub-optimal!" for N=12288/9216 x K=2048 and N=2048 x K=4096): its batch-1 decode step took
# 6.2-7.7 ms against 4.8-6.4 on DeepGEMM, its prefills of 16K-260K tokens 4-8 % longer. DeepGEMM's
# start held 0.09 GB more before the weights, so its pool has 329 state slots (330 before), 65
# running requests and 1,154,717 KV tokens. Its KV capacity, state slots and running limit are
# the engine's own and check the memory
# model; its times check a model left out. vllm-nemotron-3-nano-30b-a3b (2026-12-03), shipped
# unfitted until both engines have run a hybrid on their default kernel paths: fitted with the rest,
# its random-weight MoE (an untuned fused-MoE configuration, its batches routed to the same few
# experts) moves vLLM's per-call MoE cost from 2.6 to 1.8 x its floor and DeepSeek-V2-Lite's
# held-out decode step from 2.4 % to 4.8 %; tests/model/test_real_h200.py checks it both ways
# (fitted with it: batch prefill, decode step and total held out within 10 %; left out: the prior
# and a fit on the others). sglang-nemotron-3-nano-30b-a3b (2026-12-03, second session): the same
# Mamba2 model on SGLang, shipped unfitted like its vLLM twin, run with `run.py all --only TAG
# --grid "1024:1,16,64,192;16384:1,16;65536:1,8;131072:1;260000:1" --startup-timeout 420
# --engine-cmd "<the sglang command> --disable-flashinfer-autotune --moe-runner-backend triton"`.
# With SGLang's defaults the server never became healthy: its bf16 MoE ran FlashInfer's CUTLASS
# fused-MoE path, which first autotuned and then compiled its kernels with nvcc for more than 7 min
# (superseded/sglang-nemotron-3-nano-30b-a3b-*.log); the Triton fused-MoE runner is SGLang's other
# bf16 path and the one vLLM ran. Its 1,024 x 192 point exceeds the running limit (137 of a
# 686-slot state pool): 55 requests queue, and steps above 64 running run without CUDA graphs
# (--cuda-graph-max-bs 64). In both attempts one of its 192 requests lost its connection
# (ReadError, nothing in the engine's log); the row keeps errors = 1 and the second attempt's times.
UNFITTED_TAGS = ("vllm-qwen3-30b-a3b", "sglang-qwen3-30b-a3b", "vllm-mixtral-8x7b",
                 "sglang-mixtral-8x7b", "sglang-mixtral-8x7b-rerun",
                 "sglang-qwen3-next-80b-a3b-fp8", "vllm-nemotron-3-nano-30b-a3b",
                 "sglang-nemotron-3-nano-30b-a3b", "vllm-qwen3-next-80b-a3b-fp8")
UNFITTED = REPO / "model" / "data" / "h200_real_unfitted.csv"
# unfitted folders rebuilt all the same: the hybrids, measured before rows carried max_running
REBUILT_UNFITTED = ("vllm-nemotron-3-nano-30b-a3b",)
COMMAND = "python bench/real_engines/rebuild_real.py"
HEADER = f"""\
# Real vLLM and SGLang on one NVIDIA H200 (141 GB), measured 2026-12-01 on this workplace's GPU
# machine by bench/real_engines/run.py (SGLang's deepseek-v2-lite 16,384-token points again on
# 2026-12-02, after a warm-up of two prefill chunks): vLLM 0.26.0 and SGLang 0.5.16 (both on
# PyTorch 2.11.0, CUDA 13), presets deepseek-v2-lite (MLA MoE), llama-3.1-8b (dense GQA),
# qwen3-32b (dense GQA, 2026-12-02, contexts up to 32,768), served from
# `calibrate model-dir` folders with random weights (--load-format dummy), memory fraction 0.90,
# TP 1, no DCP; closed batches of token-id prompts sent at once, 128 output tokens,
# contexts 1,024-130,000 x batches 1-64. Each row is one point of `calibrate run --url`:
# ttft_s = the batch's prefill (first request sent -> last first token), decode_step_s = the
# median inter-token gap while the whole batch decodes, total_s = the batch's wall time,
# tpot_s = the engines' mean TPOT (comparison only); kv_capacity_tokens from each engine's
# /metrics or server info (equal to its start-up log); max_running = the running-request limit
# as launched (vLLM --max-num-seqs; empty: the engine's default). Raw run folders, start-up
# logs and /metrics: bench/data/h200-real/.
# Left out here (kept in the run folders): {{LEFT_OUT}}
# Regenerate (from the repository root): {COMMAND}
"""
# Points whose prefill a JIT compile hit: their prefill-dependent times (ttft_s, total_s,
# tpot_s) are left out of the combined file; the decode step, measured after every request's
# first token, stays. vLLM logged the compile during the deepseek-v2-lite ctx1024 sweep
# (09:44:19-09:44:25) and only that sweep's batch-8 prefill is out of line (1.25 s; batch 1:
# 0.10 s, batch 32: 0.52 s). On qwen3-30b-a3b the 64 x 1,024 prefill took 2.56 s where 32 x 1,024
# took 0.58 s: all 52 requests already decoding paused at once for 1.50 s, 1.05 s after the
# point began, between the 52nd and the 53rd first token. vLLM's JIT monitor had logged a
# fused_moe_kernel compile during that sweep's warm-up and logs one kernel once, so a second
# compile of it (another token count) would not show in the log. On mixtral-8x7b the 2 x 32,640
# prefill took 5.38 s where 1 x 32,640 took 2.04 s and 6 x 32,640 took 2.03-2.04 s per request:
# one step of the second prompt's third chunk took 1.93 s (the first request's decode paused that
# long at once) where the same chunk took 0.54 s in the 6-request point; the same unlogged
# fused_moe_kernel compile (logged once, in the ctx1024 warm-up at 17:20:44).
JIT_HIT = {
    ("vllm-deepseek-v2-lite", "calibrate:vllm:dcp=1:mem=0.9:ctx=1024:batch=8:out=128:rep=0"):
        "vllm-deepseek-v2-lite 1,024 x 8's ttft_s, total_s and tpot_s: a Triton "
        "fused_moe_kernel JIT compile (log 09:44:21) hit its prefill",
    ("vllm-qwen3-30b-a3b", "calibrate:vllm:dcp=1:mem=0.9:ctx=1024:batch=64:out=128:rep=0"):
        "vllm-qwen3-30b-a3b 1,024 x 64's ttft_s, total_s and tpot_s: every running request "
        "paused 1.50 s at once during its prefill (an unlogged fused_moe_kernel compile)",
    ("vllm-mixtral-8x7b", "calibrate:vllm:dcp=1:mem=0.9:ctx=32640:batch=2:out=128:rep=0"):
        "vllm-mixtral-8x7b 32,640 x 2's ttft_s, total_s and tpot_s: one prefill step took "
        "1.93 s instead of 0.54 s (an unlogged fused_moe_kernel compile)",
}


def inputs(tag: str) -> RebuildInputs:
    """The facts files of one engine-preset's folders."""
    logs = DATA / "logs"
    info = logs / f"{tag}.info.json"
    server_info = json.loads(info.read_text()) if tag.startswith("sglang") else None
    return RebuildInputs(load_format="dummy",
                         engine_log=(logs / f"{tag}.log").read_text(errors="replace"),
                         metrics=(logs / f"{tag}.metrics.txt").read_text(errors="replace"),
                         server_info=server_info)


def folders(tag: str) -> list[Path]:
    return sorted((DATA / "runs" / tag).iterdir(),
                  key=lambda p: int(p.name.removeprefix("ctx")))


def combined(tags: tuple[str, ...], rebuilt: bool) -> list:
    """The rows of ``tags``' run folders (rebuilt first when ``rebuilt``, or when measured
    before rows recorded the running limit as launched: ``REBUILT_UNFITTED``), JIT-hit times
    out."""
    rows = []
    for tag in tags:
        if rebuilt or tag in REBUILT_UNFITTED:
            for done in rebuild(folders(tag), inputs(tag)):
                print(f"rebuilt {done.folder.relative_to(REPO)}: {len(done.rows)} rows, "
                      f"{done.with_decode_step} with a decode step"
                      + "".join(f"; JIT {h.kernel} at {h.log_time}" for h in done.jit))
        for folder in folders(tag):
            for row in read_csv(folder / "dataset.csv"):
                if (tag, row.source) in JIT_HIT:
                    row = row.model_copy(update={"ttft_s": None, "total_s": None,
                                                 "tpot_s": None})
                rows.append(row)
    return rows


def main() -> None:
    rows = combined(TAGS, rebuilt=True)
    header = HEADER.replace("{LEFT_OUT}", "; ".join(v for (tag, _), v in JIT_HIT.items()
                                                     if tag in TAGS))
    atomic_write(COMBINED, (header + header_csv() + "".join(map(row_csv, rows))).encode())
    print(f"wrote {COMBINED.relative_to(REPO)} ({len(rows)} rows)")
    # measured by the current sweep (decode steps and facts recorded): nothing to rebuild
    unfitted = combined(UNFITTED_TAGS, rebuilt=False)
    note = ("# Real runs measured like those of h200_real.csv but not fitted on (the default model"
            " is fitted on that file):\n# " + ", ".join(UNFITTED_TAGS) + " (bench/data/h200-real/"
            "runs/); why: bench/real_engines/rebuild_real.py.\n# Left out here: "
            + "; ".join(v for (tag, _), v in JIT_HIT.items() if tag in UNFITTED_TAGS)
            + f"\n# Regenerate (from the repository root): {COMMAND}\n")
    atomic_write(UNFITTED, (note + header_csv() + "".join(map(row_csv, unfitted))).encode())
    print(f"wrote {UNFITTED.relative_to(REPO)} ({len(unfitted)} rows)")

if __name__ == "__main__":
    main()
