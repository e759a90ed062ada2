"""The untimed warm-up before a combination's first timed point.

Engines compile kernels the first time they meet a shape: SGLang's first request paid a JIT
compile of several seconds, and a real vLLM compiled Triton's ``fused_moe`` kernel during the
first 1,024 x 8 point (1.25 s of prefill instead of about 0.2 s). Before timing, the sweep sends

- for each batch size of the sweep, one batch of that many short prompts
  (``SHORT_PROMPT_TOKENS``) with a few output tokens (``OUTPUT_TOKENS``): the decode shapes;
- one prompt of two of the engine's prefill chunks (``CHUNK_TOKENS``, or the chunk size the
  engine reports, within its maximum model length): the full-chunk prefill shapes, and a chunk
  whose attention reads the previous chunk's cached KV. That second path has kernels of its
  own: on a real SGLang 0.5.16 serving deepseek-v2-lite (swept before this warm-up existed),
  the first prompt longer than one chunk (16,384 tokens, after every shorter point had run)
  took 0.95 s to its first token, against 0.69 s for a 32,768-token prompt later, and vLLM took
  0.25 s for the same prompt.

Each warm-up's prompts are new (a random nonce in their seed): the sweeps of one server (one
per context, as ``bench/real_engines/run.py`` runs them) would otherwise send the same warm-up
prompts again, and the engine's prefix cache would answer them (vLLM 0.26.0 reported a 9.8 %
prefix-cache hit rate during the second such sweep) instead of running the shapes. Nothing of
it is recorded as a point; ``events.jsonl`` notes each step.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from dataclasses import asdict, dataclass

import httpx

from engine_advisor.calibration.sweep.client import request_body, send_streaming, token_prompt

SHORT_PROMPT_TOKENS = 64
OUTPUT_TOKENS = 4
CHUNK_TOKENS = 8192          # vLLM's max_num_batched_tokens and SGLang's chunked_prefill_size


@dataclass(frozen=True)
class WarmupStep:
    what: str
    requests: int
    ok: int
    seconds: float
    error: str | None = None

    def to_json(self) -> dict:
        return asdict(self)


def long_prompt_tokens(chunk_tokens: int | None, max_model_len: int | None) -> int:
    """Two full prefill chunks, within the engine's maximum model length."""
    n = 2 * max(CHUNK_TOKENS, chunk_tokens or 0)
    if max_model_len:
        n = min(n, max_model_len - OUTPUT_TOKENS)
    return max(1, n)


async def warm_up(client: httpx.AsyncClient, model: str, batch_sizes: list[int], *,
                  long_tokens: int, timeout: float, seed: str) -> list[WarmupStep]:
    """Send the warm-up requests (module docstring); failures are reported, not raised."""
    steps = [(f"batch {b} x {SHORT_PROMPT_TOKENS} tokens", b, SHORT_PROMPT_TOKENS)
             for b in sorted(set(batch_sizes))]
    steps.append((f"one prompt of {long_tokens} tokens", 1, long_tokens))
    out = []
    nonce = secrets.token_hex(8)
    for what, n, tokens in steps:
        bodies = [request_body(model, token_prompt(tokens, f"warmup/{seed}/{nonce}/{what}/{i}"),
                               OUTPUT_TOKENS) for i in range(n)]
        t0 = time.perf_counter()
        samples = await asyncio.gather(*(
            send_streaming(client, body, output_tokens=OUTPUT_TOKENS, timeout=timeout,
                           prompt_tokens=tokens, index=i, t_batch=t0)
            for i, body in enumerate(bodies)))
        bad = [s for s in samples if not s.ok]
        out.append(WarmupStep(what, n, n - len(bad), round(time.perf_counter() - t0, 4),
                              bad[0].error if bad else None))
    return out
