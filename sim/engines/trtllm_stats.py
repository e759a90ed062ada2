"""TensorRT-LLM's per-iteration statistics, as its ``GET /metrics`` answers them.

``trtllm-serve`` answers ``GET /metrics`` with a JSON list of the iteration-stats objects its
executor queued since the last call (``OpenAIServer.get_iteration_stats`` drains
``get_stats_async``), one per executor iteration, the object's keys those of the executor's
``IterationStats`` JSON (``cpp/tensorrt_llm/executor/jsonSerialization.cpp``): ``timestamp``,
``iter``, ``iterLatencyMS``, ``numActiveRequests``, ``numQueuedRequests``,
``numCompletedRequests``, ``maxNumActiveRequests``, the static and runtime batch and token
limits, ``gpuMemUsage`` ..., and the nested ``kvCacheStats`` (``maxNumBlocks``,
``freeNumBlocks``, ``usedNumBlocks``, ``tokensPerBlock``, ``allocTotalBlocks``,
``allocNewBlocks``, ``reusedBlocks``, ``missedBlocks``, ``cacheHitRate``) and
``inflightBatchingStats``. The PyTorch backend queues them only with ``enable_iter_perf_stats:
true`` in the ``--config`` file (off by default: then the answer is ``[]``); the simulator
answers as a server launched with it, as ``engine_advisor.model.engines.trtllm.config_file``
writes it. The queue holds the last ``MAX_ITERATIONS``.

Blocks in use are the tokens the running requests hold (prompt and output so far) in blocks of
``tokensPerBlock``. One simulator iteration (a prefill of the requests admitted together, or a
decode step of every running request; several decode steps when the process runs behind) is
one object; its latency is the cost model's step time as scaled by ``--time-scale``.
"""

from __future__ import annotations

import datetime as dt
import math
from collections import deque
from typing import Any

MAX_ITERATIONS = 1000      # the executor's iteration-stats queue (iter_stats_max_iterations)


class IterationLog:
    """The queued iteration records of one engine core; ``drain`` turns them into objects."""

    def __init__(self, max_running: int, max_num_tokens: int, tokens_per_block: int,
                 capacity_tokens: int, gpu_bytes: int):
        self.max_running = max_running
        self.max_num_tokens = max_num_tokens
        self.block = tokens_per_block
        self.max_blocks = capacity_tokens // tokens_per_block
        self.gpu_bytes = gpu_bytes
        self.iter = 0
        self.records: deque[tuple] = deque(maxlen=MAX_ITERATIONS)

    def record(self, core: Any, kind: str, steps: int, step_s: float, batch: int,
               finished: int, prompt_tokens: int) -> None:
        """One iteration of ``core`` (``EngineCore.on_step``): a cheap tuple now, the JSON
        object when drained."""
        self.iter += steps
        s = core.stats
        self.records.append((dt.datetime.now(), self.iter, step_s * 1e3, kind, batch,
                             core.num_running, core.num_waiting, finished, core.kv_used_tokens(),
                             prompt_tokens, s.prompt_tokens, s.cached_prompt_tokens))

    def drain(self) -> list[dict[str, Any]]:
        """The iteration-stats objects queued since the last call (and empties the queue)."""
        out = [self._object(r) for r in self.records]
        self.records.clear()
        return out

    def _object(self, r: tuple) -> dict[str, Any]:
        (when, it, latency_ms, kind, batch, active, queued, finished, tokens, ctx_tokens,
         prompt_total, cached_total) = r
        used = min(math.ceil(tokens / self.block), self.max_blocks)
        reused = cached_total // self.block
        alloc = math.ceil(prompt_total / self.block) if prompt_total else 0
        missed = max(alloc - reused, 0)
        prefill = kind == "prefill"
        return {
            "timestamp": when.strftime("%m-%d-%Y %H:%M:%S"),
            "iter": it,
            "iterLatencyMS": latency_ms,
            "newActiveRequestsQueueLatencyMS": 0.0,
            "numNewActiveRequests": batch if prefill else 0,
            "numActiveRequests": active,
            "numQueuedRequests": queued,
            "numCompletedRequests": finished,
            "maxNumActiveRequests": self.max_running,
            "maxBatchSizeStatic": self.max_running,
            "maxBatchSizeTunerRecommended": self.max_running,
            "maxBatchSizeRuntime": self.max_running,
            "maxNumTokensStatic": self.max_num_tokens,
            "maxNumTokensTunerRecommended": self.max_num_tokens,
            "maxNumTokensRuntime": self.max_num_tokens,
            "gpuMemUsage": self.gpu_bytes,
            "cpuMemUsage": 0,
            "pinnedMemUsage": 0,
            "kvCacheStats": {
                "maxNumBlocks": self.max_blocks,
                "freeNumBlocks": self.max_blocks - used,
                "usedNumBlocks": used,
                "tokensPerBlock": self.block,
                "allocTotalBlocks": alloc,
                "allocNewBlocks": missed,
                "reusedBlocks": reused,
                "missedBlocks": missed,
                "cacheHitRate": reused / alloc if alloc else 0.0,
            },
            "staticBatchingStats": None,
            "inflightBatchingStats": {
                "numScheduledRequests": batch,
                "numContextRequests": batch if prefill else 0,
                "numGenRequests": 0 if prefill else batch,
                "numPausedRequests": 0,
                "numCtxTokens": ctx_tokens,
                "microBatchId": 0,
                "avgNumDecodedTokensPerIter": 0.0 if prefill else 1.0,
            },
            "specDecodingStats": None,
        }
