"""HTTP client side of a sweep: engine info, exact-length prompts, one streamed request.

Per request it measures what the engines' own benchmark tools measure
(``vllm bench serve``, SGLang ``bench_serving``):
TTFT = request sent -> first streamed token chunk, E2E = request sent -> end of stream,
TPOT = (E2E - TTFT) / (output_tokens - 1), inter-token latencies = gaps between chunks.
"""

from __future__ import annotations

import asyncio
import json
import random
import re
import time
from dataclasses import asdict, dataclass, field
from typing import Any

import httpx

from engine_advisor.calibration.errors import CalibrationError
from engine_advisor.calibration.sweep.engine_endpoints import SERVER_INFO_PARSERS
from engine_advisor.model import engines

OOM_PATTERN = re.compile(r"out of memory|outofmemory|\boom\b|cuda error: out of memory",
                         re.IGNORECASE)
TOKEN_ID_RANGE = (1000, 20000)   # ordinary vocabulary ids: no special tokens, any model
MAX_ERROR_TEXT = 300


def is_oom(text: str | None) -> bool:
    return bool(text) and bool(OOM_PATTERN.search(text))


def describe_http_error(exc: BaseException, url: str, timeout: float | None = None) -> str:
    """A one-line reason for a transport failure."""
    if isinstance(exc, httpx.ConnectError):
        return f"cannot connect to {url} ({_short(exc) or 'connection refused'})"
    if isinstance(exc, httpx.TimeoutException | asyncio.TimeoutError | TimeoutError):
        return f"timeout: no complete response from {url} within {timeout:g} s" if timeout \
            else f"timeout waiting for {url}"
    if isinstance(exc, httpx.RemoteProtocolError):
        return f"connection to {url} broke mid-response ({_short(exc)})"
    return f"{type(exc).__name__} talking to {url}: {_short(exc)}"


def _short(exc: BaseException) -> str:
    return str(exc)[:MAX_ERROR_TEXT]


def error_message(body: bytes | str) -> str:
    """The message of an OpenAI-style error body (nested or flat), else the text itself."""
    text = body.decode("utf-8", errors="replace") if isinstance(body, bytes) else body
    try:
        obj = json.loads(text)
    except json.JSONDecodeError:
        return text.strip()[:MAX_ERROR_TEXT]
    if isinstance(obj, dict):
        err = obj.get("error", obj)
        if isinstance(err, dict) and err.get("message"):
            return str(err["message"])[:MAX_ERROR_TEXT]
        if isinstance(err, str):
            return err[:MAX_ERROR_TEXT]
        if obj.get("detail"):
            return str(obj["detail"])[:MAX_ERROR_TEXT]
    return text.strip()[:MAX_ERROR_TEXT]


# ----------------------------------------------------------------------------- engine info
async def engine_info(client: httpx.AsyncClient, engine: str) -> dict[str, Any]:
    """Version and server arguments where the engine exposes them; ``{}`` parts when not."""
    info: dict[str, Any] = {"version": "", "server_info": None}
    for path in engines.get(engine).info_paths:
        try:
            r = await client.get(path)
        except httpx.HTTPError:
            continue
        if r.status_code != 200:
            continue
        try:
            obj = r.json()
        except ValueError:
            continue
        if isinstance(obj, dict):
            info["version"] = str(obj.get("version", ""))
            info["server_info"] = obj if engine in SERVER_INFO_PARSERS else None
            info["info_path"] = path
            break
    try:
        r = await client.get("/v1/models")
        if r.status_code == 200:
            data = r.json().get("data") or []
            info["models"] = [m.get("id") for m in data if isinstance(m, dict)]
            if data and isinstance(data[0], dict) and "max_model_len" in data[0]:
                info["max_model_len"] = data[0]["max_model_len"]
    except (httpx.HTTPError, ValueError, AttributeError):
        pass
    return info


async def check_health(client: httpx.AsyncClient) -> str | None:
    """None when ``/health`` answers 200, else why not."""
    try:
        r = await client.get("/health")
    except httpx.HTTPError as exc:
        return describe_http_error(exc, str(client.base_url) + "/health")
    if r.status_code != 200:
        return f"{client.base_url}/health answered {r.status_code}: {error_message(r.content)}"
    return None


# ----------------------------------------------------------------------------- prompts
def token_prompt(length: int, seed: str) -> list[int]:
    """A reproducible random token-id prompt of exactly ``length`` tokens; distinct seeds give
    distinct first tokens, so no request hits another's prefix cache."""
    rng = random.Random(seed)
    return [rng.randrange(*TOKEN_ID_RANGE) for _ in range(length)]


class PromptError(CalibrationError, RuntimeError):
    pass


async def _tokenize(client: httpx.AsyncClient, model: str, text: str) -> list[int]:
    r = await client.post("/tokenize", json={"model": model, "prompt": text})
    if r.status_code != 200:
        raise PromptError(f"/tokenize answered {r.status_code}: {error_message(r.content)}")
    obj = r.json()
    tokens = obj.get("tokens")
    if not isinstance(tokens, list):
        raise PromptError("/tokenize answer has no 'tokens' list")
    return tokens


async def _detokenize(client: httpx.AsyncClient, model: str, tokens: list[int]) -> str:
    r = await client.post("/detokenize", json={"model": model, "tokens": tokens})
    if r.status_code != 200:
        raise PromptError(f"/detokenize answered {r.status_code}: {error_message(r.content)}")
    obj = r.json()
    text = obj.get("prompt", obj.get("text"))     # vLLM answers "prompt", SGLang "text"
    if not isinstance(text, str):
        raise PromptError("/detokenize answer has no 'prompt' or 'text'")
    return text


async def text_prompt(client: httpx.AsyncClient, model: str, length: int, seed: str) -> str:
    """Text that the engine's own ``/tokenize`` counts as exactly ``length`` tokens."""
    rng = random.Random(seed)
    words = ["alpha", "river", "stone", "cloud", "ember", "north", "quiet", "maple", "orbit",
             "delta", "lumen", "cedar", "prism", "harbor", "violet", "copper"]
    text = " ".join(rng.choice(words) for _ in range(max(length, 8)))
    tokens = await _tokenize(client, model, text)
    while len(tokens) < length + 8:
        text = text + " " + text
        tokens = await _tokenize(client, model, text)
    target = length
    for _ in range(8):
        candidate = await _detokenize(client, model, tokens[:target])
        got = len(await _tokenize(client, model, candidate))
        if got == length:
            return candidate
        target += length - got
        if target <= 0 or target > len(tokens):
            break
    raise PromptError(f"could not build a text prompt of exactly {length} tokens with this "
                      "engine's /tokenize; use --prompt token-ids")


# ----------------------------------------------------------------------------- one request
@dataclass
class Sample:
    """One request's measurement (times in seconds from its own send time)."""

    index: int
    ok: bool = False
    error: str | None = None
    oom: bool = False
    status: int | None = None
    start_s: float = 0.0          # send time relative to the batch start
    ttft_s: float | None = None
    e2e_s: float | None = None
    tpot_s: float | None = None
    itl_s: list[float] = field(default_factory=list)
    output_tokens: int = 0
    prompt_tokens: int | None = None

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["itl_s"] = [round(x, 6) for x in self.itl_s]
        return d


def request_body(model: str, prompt: list[int] | str, output_tokens: int) -> bytes:
    """The JSON body of one exact-length streamed completion (encoded ahead of the clock)."""
    return json.dumps({"model": model, "prompt": prompt, "max_tokens": output_tokens,
                       "min_tokens": output_tokens, "ignore_eos": True, "temperature": 0.0,
                       "stream": True, "stream_options": {"include_usage": True}},
                      separators=(",", ":")).encode()


async def warm_connections(client: httpx.AsyncClient, n: int) -> None:
    """Open ``n`` keep-alive connections (concurrent ``/health`` calls) so that the timed
    requests do not pay for TCP set-up one after another."""
    async def one() -> None:
        try:
            await client.get("/health")
        except httpx.HTTPError:
            pass
    await asyncio.gather(*(one() for _ in range(n)))


async def send_streaming(client: httpx.AsyncClient, body: bytes, *, output_tokens: int,
                         timeout: float, prompt_tokens: int | None = None, index: int = 0,
                         t_batch: float | None = None) -> Sample:
    """Send a pre-encoded body (``request_body``) and measure the stream."""
    s = Sample(index=index)
    url = str(client.base_url).rstrip("/") + "/v1/completions"
    t0 = time.perf_counter()
    s.start_s = t0 - t_batch if t_batch is not None else 0.0
    try:
        async with asyncio.timeout(timeout):
            await _stream(client, body, s, t0, output_tokens, prompt_tokens)
    except (httpx.HTTPError, TimeoutError) as exc:
        s.ok, s.error = False, describe_http_error(exc, url, timeout)
    s.oom = is_oom(s.error)
    return s


async def _stream(client: httpx.AsyncClient, body: bytes, s: Sample, t0: float, wanted: int,
                  plen: int | None) -> None:
    chunks: list[float] = []
    usage: dict[str, Any] | None = None
    done = False
    headers = {"content-type": "application/json", "accept": "text/event-stream"}
    async with client.stream("POST", "/v1/completions", content=body, headers=headers) as r:
        s.status = r.status_code
        if r.status_code != 200:
            s.error = f"HTTP {r.status_code}: {error_message(await r.aread())}"
            return
        async for line in r.aiter_lines():
            if not line.startswith("data:"):
                continue
            payload = line[5:].strip()
            if payload == "[DONE]":
                done = True
                break
            try:
                obj = json.loads(payload)
            except json.JSONDecodeError:
                s.error = f"unparseable stream event: {payload[:80]!r}"
                return
            if isinstance(obj, dict) and (obj.get("error") or obj.get("object") == "error"):
                s.error = f"engine error mid-stream: {error_message(payload)}"
                return
            if obj.get("choices"):
                chunks.append(time.perf_counter())
            if obj.get("usage"):
                usage = obj["usage"]
    t_end = time.perf_counter()
    if not done:
        s.error = "stream ended without [DONE]"
        return
    if not chunks:
        s.error = "stream carried no tokens"
        return
    n = int(usage.get("completion_tokens", len(chunks))) if usage else len(chunks)
    s.prompt_tokens = int(usage["prompt_tokens"]) if usage and "prompt_tokens" in usage else None
    s.output_tokens = n
    s.ttft_s = chunks[0] - t0
    s.e2e_s = t_end - t0
    s.itl_s = [b - a for a, b in zip(chunks, chunks[1:], strict=False)]
    if n > 1:
        s.tpot_s = (s.e2e_s - s.ttft_s) / (n - 1)
    if n != wanted:
        s.error = f"expected exactly {wanted} output tokens, got {n} (engine ignored ignore_eos?)"
        return
    if plen is not None and s.prompt_tokens is not None and s.prompt_tokens != plen:
        s.error = f"engine counted {s.prompt_tokens} prompt tokens, {plen} were sent"
        return
    s.ok = True
