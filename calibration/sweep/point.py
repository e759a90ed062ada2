"""One point of a sweep: its batch of streamed requests, sent at once and timed, and the dataset
row made of the answers.

A point sends ``batch_size`` streamed requests at once (each a prompt of exactly the point's
context, engine_advisor.calibration.sweep.client). Its dataset row holds what the cost model
predicts (engine_advisor.calibration.sweep.pointtimes): ``ttft_s`` = first request sent -> the last
first token (the batch's prefill), ``decode_step_s`` = the median inter-token gap while the whole
batch decodes (no prefill in the step), ``total_s`` = wall time of the whole batch; ``tpot_s`` (the
engines' mean per-request TPOT) is kept for comparison. Retries, outcomes and where rows are
written: engine_advisor.calibration.sweep.driver.
"""

from __future__ import annotations

import asyncio
import time

import httpx

from engine_advisor.calibration.sweep.client import (
    Sample,
    request_body,
    send_streaming,
    text_prompt,
    token_prompt,
    warm_connections,
)
from engine_advisor.calibration.sweep.config import SweepConfig
from engine_advisor.calibration.sweep.engine_facts import EngineFacts
from engine_advisor.calibration.sweep.pointtimes import RequestTimes, point_times
from engine_advisor.calibration.sweep.runstore import PointKey
from engine_advisor.calibration.sweep.served_model import ServedModel, resolve_served_model
from engine_advisor.model.fit.dataset import Measurement


async def send_batch(client: httpx.AsyncClient, cfg: SweepConfig, model: str, key: PointKey,
                     attempt: int) -> tuple[list[Sample], float]:
    """The point's requests (prompts seeded by the point and ``attempt``), sent at once once the
    connections are open: their samples and the batch's wall time."""
    prompts = []
    for i in range(key.batch_size):
        seed = f"{cfg.seed}/{key.text()}/{i}/{attempt}"
        if cfg.prompt == "text":
            prompts.append(await text_prompt(client, model, key.context_tokens, seed))
        else:
            prompts.append(token_prompt(key.context_tokens, seed))
    bodies = [request_body(model, p, key.output_tokens) for p in prompts]
    await warm_connections(client, key.batch_size)
    t0 = time.perf_counter()
    samples = await asyncio.gather(*(
        send_streaming(client, b, output_tokens=key.output_tokens,
                       timeout=cfg.request_timeout, prompt_tokens=key.context_tokens,
                       index=i, t_batch=t0)
        for i, b in enumerate(bodies)))
    wall = time.perf_counter() - t0
    return list(samples), wall


def point_row(cfg: SweepConfig, key: PointKey, ok: list[Sample], wall: float | None, *,
              errors: int, oom_retries: int, version: str, facts: EngineFacts, weights: str,
              served: ServedModel | None) -> Measurement:
    """The point's dataset row: the times of its successful requests ``ok`` (none: a row
    without times), the engine's version, facts and weights of its combination, and the served
    model (None: a launch that failed before the engine named its model)."""
    t = point_times([RequestTimes.of(s) for s in ok], batch_size=key.batch_size,
                    prompt_tokens=key.context_tokens, wall_s=wall)
    if served is None:
        served = resolve_served_model(kv_bytes_per_token=cfg.kv_bytes_per_token,
                                      kv_cache_dtype=cfg.kv_cache_dtype,
                                      kv_shards=cfg.kv_shards)
    return Measurement(
        engine=key.engine, engine_version=version, gpu=cfg.gpu, num_gpus=cfg.num_gpus,
        dcp_size=key.dcp_size, mem_fraction=key.mem_fraction,
        context_tokens=key.context_tokens, output_tokens=key.output_tokens,
        batch_size=key.batch_size, kv_bytes_per_token=served.kv_bytes_per_token,
        kv_shards=served.kv_shards, ttft_s=t.ttft_s, tpot_s=t.tpot_s, total_s=t.total_s,
        oom_retries=oom_retries, errors=errors, source=key.source(), model=served.key,
        kv_cache_dtype=served.kv_cache_dtype, decode_step_s=t.decode_step_s,
        kv_capacity_tokens=facts.kv_capacity_tokens, weights=weights,
        max_running=facts.max_running_requested)
