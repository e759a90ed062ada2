"""An independent OpenAI-compatible upstream for bench_proxy.py: a small aiohttp server.

Not the project's simulator (a different HTTP stack: aiohttp's own parser and writer, its
default headers, its keep-alive handling), so the proxy is measured against a server it was not
tuned on. Answers at once (a long body is read whole but not parsed: ``fields``): POST
/v1/completions and /v1/chat/completions (JSON, or an SSE stream of ``max_tokens`` events then
``data: [DONE]``), POST /tokenize (a word count), GET /health and /v1/models.

aiohttp is not a dependency of this project; run it from its own environment:
``python3 -m venv /tmp/aiohttp-up && /tmp/aiohttp-up/bin/pip install aiohttp``, then
``/tmp/aiohttp-up/bin/python bench/aiohttp_upstream.py --port 8100``.
"""

from __future__ import annotations

import argparse
import json
import re
import time

from aiohttp import web

MODEL = "kimi-k3"


def _choice(chat: bool, text: str, finish: str | None) -> dict:
    if chat:
        return {"index": 0, "message": {"role": "assistant", "content": text},
                "finish_reason": finish}
    return {"index": 0, "text": text, "finish_reason": finish}


# a long body's few fields are looked for around its prompt, not parsed out of it (below)
LONG_BODY = 64 << 10
EDGE = 1024
FIELDS = {"max_tokens": re.compile(rb'"max_(?:completion_)?tokens"\s*:\s*(\d+)'),
          "stream": re.compile(rb'"stream"\s*:\s*(true|false)'),
          "model": re.compile(rb'"model"\s*:\s*"([^"\\]{1,200})"')}


def fields(raw: bytes) -> dict:
    """What the answer needs of a request: ``max_tokens``, ``stream``, ``model``. A body of
    ``LONG_BODY`` bytes or more is one long prompt with a few small fields before or after it
    (whatever a router in front re-serialised): they are read from its first and last ``EDGE``
    bytes, so that the upstream answers at once whatever the prompt's size (a real engine
    parses it, but here what is measured is the router's cost). Else, or when a field is not
    found there, the body is parsed."""
    if len(raw) >= LONG_BODY:
        edges = raw[:EDGE] + b" " + raw[-EDGE:]
        found = {k: rx.search(edges) for k, rx in FIELDS.items()}
        if found["max_tokens"] and found["stream"]:
            return {"max_tokens": int(found["max_tokens"].group(1)),
                    "stream": found["stream"].group(1) == b"true",
                    "model": found["model"].group(1).decode() if found["model"] else MODEL}
    return json.loads(raw)


async def completions(request: web.Request) -> web.StreamResponse:
    body = fields(await request.read())
    chat = request.path.endswith("/chat/completions")
    n = int(body.get("max_tokens") or body.get("max_completion_tokens") or 16)
    rid = f"cmpl-{time.monotonic_ns()}"
    usage = {"prompt_tokens": 3, "completion_tokens": n, "total_tokens": n + 3}
    if not body.get("stream"):
        return web.json_response({
            "id": rid, "object": "chat.completion" if chat else "text_completion",
            "created": int(time.time()), "model": body.get("model", MODEL),
            "choices": [_choice(chat, " hi" * n, "length")], "usage": usage})
    resp = web.StreamResponse(headers={"content-type": "text/event-stream"})
    await resp.prepare(request)
    obj = "chat.completion.chunk" if chat else "text_completion"
    for i in range(n):
        delta = ({"index": 0, "delta": {"content": " hi"}, "finish_reason": None} if chat
                 else _choice(False, " hi", None))
        if i == n - 1:
            delta["finish_reason"] = "length"
        event = {"id": rid, "object": obj, "model": MODEL, "choices": [delta]}
        if i == n - 1:
            event["usage"] = usage
        await resp.write(b"data: " + json.dumps(event).encode() + b"\n\n")
    await resp.write(b"data: [DONE]\n\n")
    await resp.write_eof()
    return resp


async def tokenize(request: web.Request) -> web.Response:
    """vLLM's and SGLang's /tokenize, counting white-space separated words."""
    body = await request.json()
    if "messages" in body:
        text = "\n".join(m.get("content") or "" for m in body["messages"]
                         if isinstance(m.get("content"), str))
    else:
        text = body.get("prompt") or ""
    return web.json_response({"count": len(text.split()), "max_model_len": 1 << 21})


async def health(request: web.Request) -> web.Response:
    return web.Response(text="")


async def models(request: web.Request) -> web.Response:
    return web.json_response({"object": "list", "data": [{"id": MODEL, "object": "model"}]})


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8100)
    ap.add_argument("--max-body-mb", type=float, default=1.0,
                    help="largest request body (aiohttp's own default: 1 MB)")
    args = ap.parse_args()
    app = web.Application(client_max_size=int(args.max_body_mb * (1 << 20)))
    app.router.add_post("/v1/completions", completions)
    app.router.add_post("/v1/chat/completions", completions)
    app.router.add_post("/tokenize", tokenize)
    app.router.add_get("/health", health)
    app.router.add_get("/v1/models", models)
    web.run_app(app, host=args.host, port=args.port, access_log=None, print=None)


if __name__ == "__main__":
    main()
