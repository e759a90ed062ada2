"""Prompt token counts for the routing decision.

In order of preference:

1. ``token_ids``: a /v1/completions prompt given as token ids is counted exactly.
2. ``estimate``: UTF-8 bytes of the prompt / ``tokens.bytes_per_token`` (default 4, about right
   for English text with BPE vocabularies), whenever the decision does not depend on the
   count: every context in the estimate's plausible range (``bytes / MAX_BYTES_PER_TOKEN`` ..
   ``bytes``, a token is at least one byte) gets the same decision. Tokenizing a 1M-token
   prompt costs a large share of a CPU-second, so nothing is tokenized that cannot change
   where the request goes.
3. ``tokenizer``: where it does, a local Hugging Face ``tokenizer.json``
   (``tokens.tokenizer_file``; needs the optional ``tokenizers`` package, extra
   ``engine-advisor[tokenizer]``), off the event loop for a long prompt. Chat requests count
   the message contents plus ``CHAT_OVERHEAD`` tokens per message for the template.
4. ``upstream``: else POST ``/tokenize`` of an upstream serving the model (vLLM and SGLang have
   it; TensorRT-LLM's ``trtllm-serve`` has none: an upstream that answers 404 or 405 is not
   asked again); the estimate stands when /tokenize fails.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Protocol

import httpx

from engine_advisor.service.proxy.request import ProxyRequest
from engine_advisor.service.proxy.upstreams import Upstream, UpstreamsError

MAX_BYTES_PER_TOKEN = 16
CHAT_OVERHEAD = 4


class Tokenizer(Protocol):
    """What the proxy uses of a ``tokenizers.Tokenizer`` (an optional dependency)."""

    def encode(self, sequence: str, add_special_tokens: bool = ...) -> object: ...


def load_tokenizer(path: Path):
    try:
        from tokenizers import Tokenizer
    except ImportError:
        raise UpstreamsError(f"tokens.tokenizer_file: {path} needs the 'tokenizers' package "
                             "(pip install 'engine-advisor[tokenizer]')") from None
    try:
        return Tokenizer.from_file(str(path))
    except Exception as exc:    # the library raises its own exception types
        raise UpstreamsError(f"tokens.tokenizer_file: cannot load {path}: {exc}") from None


def local_count(tokenizer: Tokenizer, req: ProxyRequest) -> int:
    if req.chat:
        msgs = [m for m in req.body["messages"] if isinstance(m, dict)]
        text = req.prompt_text()
        return len(tokenizer.encode(text, add_special_tokens=False).ids) \
            + CHAT_OVERHEAD * len(msgs)
    return len(tokenizer.encode(req.prompt_text(), add_special_tokens=True).ids)


async def upstream_count(up: Upstream, req: ProxyRequest, timeout: float) -> int | None:
    """The upstream's /tokenize count, or None when it cannot tell."""
    payload: dict = {"model": up.spec.model}
    if req.chat:
        payload["messages"] = req.body["messages"]
    else:
        prompt = req.body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1:
            prompt = prompt[0]
        if not isinstance(prompt, str):
            return None
        payload["prompt"] = prompt
    headers = {"content-type": "application/json"}
    if up.spec.api_key is not None:
        headers["authorization"] = f"Bearer {up.spec.api_key.get_secret_value()}"
    try:
        r = await up.client.post(up.url + "/tokenize", content=json.dumps(payload).encode(),
                                 headers=headers, timeout=timeout)
        if r.status_code in (404, 405):
            up.tokenize = False         # no such route: never asked again
        if r.status_code != 200:
            return None
        data = r.json()
    except (httpx.HTTPError, ValueError):
        return None
    if isinstance(data, dict):
        count = data.get("count")
        if isinstance(count, int) and count > 0:
            return count
        tokens = data.get("tokens")
        if isinstance(tokens, list) and tokens:
            return len(tokens)
    return None
