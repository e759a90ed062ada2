"""What the proxy reads from an OpenAI request body; the body itself is forwarded unchanged."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from starlette.requests import ClientDisconnect
from starlette.types import Receive

from engine_advisor.model.jsontext import PARSE_ERRORS, check_text, reason
from engine_advisor.service.errors import ApiError
from engine_advisor.service.middleware import body_too_large
from engine_advisor.service.proxy.skim import SKIM_BYTES, Facts, skim

CHAT, COMPLETIONS = "/v1/chat/completions", "/v1/completions"


@dataclass(slots=True)
class ProxyRequest:
    path: str
    raw: bytes
    decoded: dict[str, Any] | None    # the body as JSON, or None until ``body`` asks for it
    model: str | None
    stream: bool
    max_tokens: int | None
    prompt_token_ids: int | None      # length of a token-id prompt (exact count)
    prompt_bytes: int                 # UTF-8 bytes of the prompt text

    @property
    def chat(self) -> bool:
        return self.path == CHAT

    @property
    def body(self) -> dict[str, Any]:
        """The body as JSON: a skimmed long body (engine_advisor.service.proxy.skim) is
        decoded the first time something reads it."""
        if self.decoded is None:
            self.decoded = decode(self.raw)
        return self.decoded

    def prompt_text(self) -> str:
        """The prompt as text (chat: message contents joined by newlines)."""
        if self.chat:
            return "\n".join(_content_text(m.get("content")) for m in self.body["messages"]
                             if isinstance(m, dict))
        p = self.body.get("prompt")
        if isinstance(p, list) and len(p) == 1:
            p = p[0]
        return p if isinstance(p, str) else ""


def _content_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(p["text"] for p in content
                         if isinstance(p, dict) and isinstance(p.get("text"), str))
    return ""


def _int(body: dict, name: str) -> int | None:
    v = body.get(name)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise ApiError(400, f"{name}: expected a positive integer, got {v!r}", param=name)
    return v


def _prompt_size(prompt: Any) -> tuple[int | None, int]:
    """(token-id count or None, text bytes) of a /v1/completions prompt."""
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str | list):
        prompt = prompt[0]
    if isinstance(prompt, str):
        return None, len(prompt.encode("utf-8", errors="replace"))
    if isinstance(prompt, list) and prompt:
        if all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
            return len(prompt), 0
        if all(isinstance(p, str) for p in prompt):     # a batch of prompts: the longest
            return None, max(len(p.encode("utf-8", errors="replace")) for p in prompt)
        if all(isinstance(p, list) for p in prompt):
            return max(len(p) for p in prompt), 0
    raise ApiError(400, "prompt: expected a string, a list of token ids, or a list of either",
                   param="prompt")


async def read_body(receive: Receive, limit: int | None = None) -> bytes:
    """The whole request body (Starlette's ``Request.body()`` costs a few times more); more
    than ``limit`` bytes: 413, as engine_advisor.service.middleware.BodyLimitMiddleware answers."""
    message = await receive()
    if message["type"] != "http.request":
        raise ClientDisconnect()
    body = message.get("body", b"")
    if limit is not None and len(body) > limit:
        raise ApiError(413, body_too_large(limit, len(body), streamed=True))
    if not message.get("more_body", False):
        return body
    chunks = [body]
    size = len(body)
    while True:
        message = await receive()
        if message["type"] != "http.request":
            raise ClientDisconnect()
        chunk = message.get("body", b"")
        size += len(chunk)
        if limit is not None and size > limit:
            raise ApiError(413, body_too_large(limit, size, streamed=True))
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)


_SCAN = json.JSONDecoder().scan_once
_WS = " \t\n\r"


def decode(raw: bytes) -> Any:
    """The body as JSON; any refusal (syntax, not text, nested too deeply, an integer of too
    many digits, a lone surrogate: engine_advisor.model.jsontext) is a 400."""
    try:
        if raw[:1] == b"{" and raw[1:2] != b"\x00":
            # what json.loads does for such bytes (UTF-8, no leading whitespace), without its
            # encoding detection and JSONDecoder's Python-level wrappers around the scanner
            s = raw.decode("utf-8", "surrogatepass")
            try:
                obj, end = _SCAN(s, 0)
            except StopIteration as exc:
                raise json.JSONDecodeError("Expecting value", s, exc.value) from None
            if end != len(s):
                rest = s[end:].lstrip(_WS)
                if rest:
                    raise json.JSONDecodeError("Extra data", s, len(s) - len(rest))
        else:
            obj = json.loads(raw)
        # maybe a lone surrogate (engine_advisor.model.jsontext); find, not ``in``:
        # bytes.__contains__ tries the argument as an integer first and raises (then clears) a
        # TypeError for a bytes
        if raw.find(b"\\u") >= 0 or raw.find(b"\xed") >= 0:
            check_text(raw, obj)
        return obj
    except PARSE_ERRORS as exc:
        raise ApiError(400, f"request body: invalid JSON ({reason(exc)})") from None


def parse(raw: bytes, path: str, body: Any = None) -> ProxyRequest:
    """``body``: ``raw`` already decoded, when the caller has it. A long body is skimmed,
    not decoded (engine_advisor.service.proxy.skim), where it has the usual shape."""
    if body is None and len(raw) >= SKIM_BYTES:
        facts = skim(raw)
        if facts is not None and (facts.messages if path == CHAT else facts.has_prompt):
            short = _small(facts)
            model, stream = _head(short)
            return ProxyRequest(path, raw, None, model, stream, _max_tokens(short, path),
                                facts.prompt_ids, facts.prompt_bytes)
    if body is None:
        body = decode(raw)
    if not isinstance(body, dict):
        raise ApiError(400, "request body: expected a JSON object")
    model, stream = _head(body)
    if path == CHAT:
        msgs = body.get("messages")
        if not isinstance(msgs, list) or not msgs:
            raise ApiError(400, "messages: expected a non-empty list of messages",
                           param="messages")
        ids = None
        size = 0
        for m in msgs:
            if isinstance(m, dict):
                size += len(_content_text(m.get("content")).encode("utf-8", errors="replace"))
    else:
        if "prompt" not in body:
            raise ApiError(400, "prompt: field required", param="prompt")
        ids, size = _prompt_size(body["prompt"])
    return ProxyRequest(path, raw, body, model, stream, _max_tokens(body, path), ids, size)


def _small(facts: Facts) -> dict[str, Any]:
    """The short fields of a skimmed body, as a decoded body holds them."""
    return {k: v for k in ("model", "stream", "max_tokens", "max_completion_tokens")
            if (v := getattr(facts, k)) is not None}


def _head(body: dict[str, Any]) -> tuple[str | None, bool]:
    """The model and ``stream`` of a body (decoded, or a skimmed one's short fields)."""
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise ApiError(400, f"model: expected a string, got {model!r}", param="model")
    stream = body.get("stream", False)
    if stream is not None and stream is not True and stream is not False:
        raise ApiError(400, f"stream: expected true or false, got {stream!r}", param="stream")
    return model, bool(stream)


def _max_tokens(body: dict[str, Any], path: str) -> int | None:
    if path == CHAT:
        return _int(body, "max_completion_tokens") or _int(body, "max_tokens")
    return _int(body, "max_tokens")
