"""``POST /generate``: SGLang's native API, forwarded to the SGLang pools.

Only SGLang serves ``/generate``, so only its groups are candidates; among them the cost model
picks the DCP size as for the OpenAI routes. The prompt size comes from ``input_ids`` (exact)
or the ``text`` (the local tokenizer, else the bytes estimate), the output from
``sampling_params.max_new_tokens``; a batch (lists of prompts) is sized by its longest prompt,
as SGLang's own router routes a request by its text or ids. The body is forwarded unchanged and
the answer (JSON, or SGLang's ``data:`` event stream ending in ``[DONE]``) passed through.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Any

from engine_advisor.service.errors import ApiError
from engine_advisor.service.holder import LoadedModel
from engine_advisor.service.proxy.decision import Choice, choose, pick
from engine_advisor.service.proxy.request import ProxyRequest, decode
from engine_advisor.service.proxy.upstreams import Pools

if TYPE_CHECKING:
    from engine_advisor.service.proxy.state import ProxyState

GENERATE = "/generate"
ENGINE = "sglang"
GENERATE_BODY = {"requestBody": {"required": True, "content": {"application/json": {"schema": {
    "type": "object", "additionalProperties": True,
    "description": "an SGLang /generate request (text or input_ids, sampling_params, stream), "
                   "forwarded unchanged to the chosen SGLang upstream"}}}}}


class GenerateRequest(ProxyRequest):
    """A /generate request; its prompt text is the (longest) ``text``."""

    def prompt_text(self) -> str:
        text = self.body.get("text")
        if isinstance(text, list):
            return max((t for t in text if isinstance(t, str)), key=len, default="")
        return text if isinstance(text, str) else ""


def _ids_len(ids: Any) -> int:
    if not isinstance(ids, list) or not ids:
        raise ApiError(400, "input_ids: expected a non-empty list of token ids, or of lists",
                       param="input_ids")
    if all(isinstance(t, int) and not isinstance(t, bool) for t in ids):
        return len(ids)
    if all(isinstance(x, list) and x for x in ids):
        return max(len(x) for x in ids)
    raise ApiError(400, "input_ids: expected a list of token ids, or a list of such lists",
                   param="input_ids")


def _text_bytes(text: Any) -> int:
    if isinstance(text, str):
        return len(text.encode("utf-8", errors="replace"))
    if isinstance(text, list) and text and all(isinstance(t, str) for t in text):
        return max(len(t.encode("utf-8", errors="replace")) for t in text)
    raise ApiError(400, "text: expected a string or a non-empty list of strings", param="text")


def _max_new_tokens(sp: Any) -> int | None:
    """The largest ``max_new_tokens`` of the sampling parameters (one object or a list)."""
    items = sp if isinstance(sp, list) else [sp]
    found = []
    for one in items:
        if one is None:
            continue
        if not isinstance(one, dict):
            raise ApiError(400, "sampling_params: expected an object or a list of objects",
                           param="sampling_params")
        v = one.get("max_new_tokens")
        if v is None:
            continue
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise ApiError(400, f"sampling_params.max_new_tokens: expected an integer >= 0, "
                                f"got {v!r}", param="sampling_params")
        found.append(v)
    return max(found) if found else None


def parse_generate(raw: bytes) -> GenerateRequest:
    body = decode(raw)
    if not isinstance(body, dict):
        raise ApiError(400, "request body: expected a JSON object")
    text, ids = body.get("text"), body.get("input_ids")
    if (text is None) == (ids is None):
        raise ApiError(400, "give one of text or input_ids", param="text")
    stream = body.get("stream", False)
    if not isinstance(stream, bool | None):
        raise ApiError(400, f"stream: expected true or false, got {stream!r}", param="stream")
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise ApiError(400, f"model: expected a string, got {model!r}", param="model")
    n_ids = _ids_len(ids) if ids is not None else None
    size = _text_bytes(text) if text is not None else 0
    out = _max_new_tokens(body.get("sampling_params")) or None
    return GenerateRequest(GENERATE, raw, body, model, bool(stream), out, n_ids, size)


async def choose_generate(st: ProxyState, pools: Pools, loaded: LoadedModel,
                          raw: bytes) -> tuple[GenerateRequest, Choice]:
    """The request and its choice among the SGLang groups only."""
    req = parse_generate(raw)
    if not any(u.engine == ENGINE for u in pools.serving(req.model)):
        raise ApiError(404, "/generate is SGLang's native API and no SGLang pool serves "
                            f"model {req.model or pools.models[0]!r}", param="model",
                       type="model_not_found")
    chosen = await choose(st, pools, loaded, req)
    ranked = [g for g in chosen.decision.ranked if g[0] == ENGINE]
    ranked += sorted(g for g in pools.groups if g[0] == ENGINE and g not in ranked)
    decision = replace(chosen.decision, ranked=tuple(ranked))
    first = chosen.first if chosen.first.engine == ENGINE else \
        pick(pools, decision, req.model, [], ENGINE, st.seq)
    if first is None or not decision.ranked:
        raise ApiError(503, "no SGLang upstream is available for /generate")
    return req, replace(chosen, decision=decision, first=first)
