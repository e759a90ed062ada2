"""OpenAI request validation and response shapes as vLLM and SGLang produce them.

Validation is hand-written (no pydantic per request: the hot path must stay cheap) and raises
``ApiError`` naming the field; the app turns it into the engine's error envelope.
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from engine_advisor.sim.textgen import OutputPlan
from engine_advisor.sim.tokenizer import BUILTIN, Tokenizer

if TYPE_CHECKING:
    from engine_advisor.sim.engines import SimEngine

ERROR_TYPES = {400: "BadRequestError", 401: "AuthenticationError", 403: "PermissionDeniedError",
               404: "NotFoundError", 408: "TimeoutError", 409: "ConflictError",
               413: "RequestTooLargeError", 422: "UnprocessableEntityError",
               429: "RateLimitError", 500: "InternalServerError", 501: "NotImplementedError",
               502: "BadGatewayError", 503: "ServiceUnavailableError", 504: "GatewayTimeoutError"}
COMPLETIONS_DEFAULT_MAX_TOKENS = 16       # OpenAI's (and vLLM's) default for /v1/completions
UNSUPPORTED = ("logprobs", "top_logprobs", "prompt_logprobs", "tools", "guided_json",
               "guided_regex", "guided_choice", "suffix")


class ApiError(Exception):
    def __init__(self, status: int, message: str, param: str | None = None,
                 err_type: str | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.type = err_type or ERROR_TYPES.get(status, "InternalServerError" if status >= 500
                                                else "BadRequestError")


def error_body(engine: SimEngine, err: ApiError, *, stream: bool = False) -> dict[str, Any]:
    """{"error": {...}} (vLLM); the flat {"object": "error", ...} of an engine with
    ``flat_errors`` (SGLang) when not streaming."""
    info = {"message": err.message, "type": err.type, "param": err.param, "code": err.status}
    if engine.flat_errors and not stream:
        return {"object": "error", **info}
    return {"error": info}


@dataclass
class GenParams:
    """A validated generation request."""

    chat: bool
    prompt_ids: list[int]
    max_tokens: int
    min_tokens: int
    ignore_eos: bool
    stream: bool
    include_usage: bool
    continuous_usage: bool
    seed: int | None


# ----------------------------------------------------------------------------- validation
def _get_int(body: dict, name: str, default: int | None, lo: int,
             hi: int | None = None) -> int | None:
    v = body.get(name, default)
    if v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, int):
        raise ApiError(400, f"{name}: expected an integer, got {v!r}", name)
    if v < lo or (hi is not None and v > hi):
        bound = f">= {lo}" if hi is None else f"in {lo} .. {hi}"
        raise ApiError(400, f"{name}: must be {bound}, got {v}", name)
    return v


def _get_bool(body: dict, name: str, default: bool = False) -> bool:
    v = body.get(name, default)
    if v is None:
        return default
    if not isinstance(v, bool):
        raise ApiError(400, f"{name}: expected true or false, got {v!r}", name)
    return v


def check_model(body: dict, served: str, engine: SimEngine) -> None:
    name = body.get("model")
    if name is not None and not isinstance(name, str):
        raise ApiError(400, f"model: expected a string, got {name!r}", "model")
    # vLLM refuses names it does not serve; SGLang serves its one model whatever the name.
    if engine.checks_model_name and name is not None and name != served:
        raise ApiError(404, f"The model `{name}` does not exist.", "model")


def render_chat(messages: Any) -> str:
    """The prompt text of chat messages under the simulator's ChatML-like template."""
    if not isinstance(messages, list) or not messages:
        raise ApiError(400, "messages: expected a non-empty list of messages", "messages")
    parts = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict):
            raise ApiError(400, f"messages[{i}]: expected an object", "messages")
        role = m.get("role")
        if not isinstance(role, str) or not role:
            raise ApiError(400, f"messages[{i}].role: expected a non-empty string", "messages")
        content = m.get("content")
        if content is None:
            text = ""
        elif isinstance(content, str):
            text = content
        elif isinstance(content, list):
            texts = []
            for j, part in enumerate(content):
                if not isinstance(part, dict) or part.get("type") != "text" \
                        or not isinstance(part.get("text"), str):
                    raise ApiError(400, f"messages[{i}].content[{j}]: only text parts "
                                        "({\"type\": \"text\", \"text\": ...}) are supported",
                                   "messages")
                texts.append(part["text"])
            text = "\n".join(texts)
        else:
            raise ApiError(400, f"messages[{i}].content: expected a string or a list of parts",
                           "messages")
        parts.append(f"<|im_start|>{role}\n{text}<|im_end|>\n")
    parts.append("<|im_start|>assistant\n")
    return "".join(parts)


def prompt_ids(prompt: Any, tok: Tokenizer = BUILTIN) -> list[int]:
    """Token ids of a /v1/completions prompt: text, token ids, or a one-element list of either."""
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str | list):
        prompt = prompt[0]
    if isinstance(prompt, str):
        return tok.encode(prompt)
    if isinstance(prompt, list) and prompt and all(isinstance(p, str | list) for p in prompt):
        raise ApiError(400, "prompt: the simulator serves one prompt per request "
                            f"(got a batch of {len(prompt)})", "prompt")
    if isinstance(prompt, list) and prompt:
        why = tok.check_ids(prompt)
        if why:
            raise ApiError(400, f"prompt: {why}", "prompt")
        return prompt
    raise ApiError(400, "prompt: expected a non-empty string or list of token ids", "prompt")


def parse_generation(body: Any, *, chat: bool, max_model_len: int,
                     tok: Tokenizer = BUILTIN) -> GenParams:
    if not isinstance(body, dict):
        raise ApiError(400, "request body: expected a JSON object")
    for name in UNSUPPORTED:
        if body.get(name) not in (None, False, [], 0):
            raise ApiError(400, f"{name}: not supported by the simulator", name)
    if _get_bool(body, "echo"):
        raise ApiError(400, "echo: not supported by the simulator", "echo")
    n = _get_int(body, "n", 1, 1)
    if n != 1:
        raise ApiError(400, f"n: the simulator generates one choice per request (n=1), got {n}",
                       "n")
    if chat:
        if "prompt" in body:
            raise ApiError(400, "prompt: not a chat field; send messages", "prompt")
        ids = tok.encode(render_chat(body.get("messages")))
        max_tokens = _get_int(body, "max_completion_tokens", None, 1)
        if max_tokens is None:
            max_tokens = _get_int(body, "max_tokens", None, 1)
    else:
        if "prompt" not in body:
            raise ApiError(400, "prompt: field required", "prompt")
        ids = prompt_ids(body["prompt"], tok)
        max_tokens = _get_int(body, "max_tokens", COMPLETIONS_DEFAULT_MAX_TOKENS, 1)
    if len(ids) >= max_model_len:
        raise ApiError(400, f"This model's maximum context length is {max_model_len} tokens. "
                            f"However, your request has {len(ids)} input tokens. Please reduce "
                            "the length of the input messages.", "messages" if chat else "prompt")
    if max_tokens is None:
        max_tokens = max_model_len - len(ids)
    elif len(ids) + max_tokens > max_model_len:
        raise ApiError(400, f"This model's maximum context length is {max_model_len} tokens. "
                            f"However, you requested {len(ids) + max_tokens} tokens ({len(ids)} "
                            f"in the input, {max_tokens} in the completion). Please reduce the "
                            "length of the input or completion.", "max_tokens")
    min_tokens = _get_int(body, "min_tokens", 0, 0)
    if min_tokens > max_tokens:
        raise ApiError(400, f"min_tokens: must be less than or equal to max_tokens={max_tokens}, "
                            f"got {min_tokens}", "min_tokens")
    stream = _get_bool(body, "stream")
    opts = body.get("stream_options")
    if opts is not None:
        if not isinstance(opts, dict):
            raise ApiError(400, "stream_options: expected an object", "stream_options")
        if not stream:
            raise ApiError(400, "stream_options: only allowed when stream is true",
                           "stream_options")
    opts = opts or {}
    seed = body.get("seed")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        raise ApiError(400, f"seed: expected an integer, got {seed!r}", "seed")
    return GenParams(chat=chat, prompt_ids=ids, max_tokens=max_tokens, min_tokens=min_tokens,
                     ignore_eos=_get_bool(body, "ignore_eos"), stream=stream,
                     include_usage=_get_bool(opts, "include_usage"),
                     continuous_usage=_get_bool(opts, "continuous_usage_stats"), seed=seed)


# ----------------------------------------------------------------------------- responses
def usage(prompt: int, completion: int) -> dict[str, int]:
    return {"prompt_tokens": prompt, "total_tokens": prompt + completion,
            "completion_tokens": completion}


def new_id(engine: SimEngine, chat: bool) -> str:
    hexid = uuid.uuid4().hex
    if not engine.prefixed_ids:
        return hexid
    return f"{'chatcmpl' if chat else 'cmpl'}-{hexid}"


def full_response(p: GenParams, rid: str, model: str, plan: OutputPlan) -> dict[str, Any]:
    n, reason = plan.n, plan.finish_reason
    text = plan.text(0, n)
    created = int(time.time())
    u = usage(len(p.prompt_ids), n)
    if p.chat:
        choice = {"index": 0, "message": {"role": "assistant", "content": text,
                                          "reasoning_content": None, "tool_calls": []},
                  "logprobs": None, "finish_reason": reason, "stop_reason": None}
        obj = "chat.completion"
    else:
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": reason,
                  "stop_reason": None, "prompt_logprobs": None}
        obj = "text_completion"
    return {"id": rid, "object": obj, "created": created, "model": model, "choices": [choice],
            "usage": u}


class ChunkWriter:
    """SSE events of one streamed request, built from string templates (cheap per token)."""

    def __init__(self, p: GenParams, rid: str, model: str, plan: OutputPlan):
        self.p = p
        self.plan = plan
        created = int(time.time())
        self.obj = "chat.completion.chunk" if p.chat else "text_completion"
        self.head = (f'data: {{"id":"{rid}","object":"{self.obj}","created":{created},'
                     f'"model":{json.dumps(model)},"choices":[{{"index":0,')
        if p.chat:
            self.open = '"delta":{"content":"'
            self.close = '"},"logprobs":null,"finish_reason":'
        else:
            self.open = '"text":"'
            self.close = '","logprobs":null,"finish_reason":'
        self.usage_head = (f'data: {{"id":"{rid}","object":"{self.obj}","created":{created},'
                           f'"model":{json.dumps(model)},"choices":[],"usage":')

    def _usage(self, completion: int) -> str:
        return json.dumps(usage(len(self.p.prompt_ids), completion), separators=(",", ":"))

    def events(self, start: int, stop: int, finish: str | None) -> str:
        """Events for output tokens ``start .. stop - 1``; the last carries ``finish``."""
        words = self.plan.indices(start, stop)
        out = []
        if start == 0 and self.p.chat:
            role = ('"delta":{"role":"assistant","content":""},"logprobs":null,'
                    '"finish_reason":null}]')
            out.append(self.head + role + self._tail(0) + "\n\n")
        mid = self.close + 'null,"stop_reason":null}]'
        escaped = self.plan.vocab.json
        cont = self.p.continuous_usage
        for i, w in enumerate(words):
            last = finish is not None and i == len(words) - 1
            fin = (self.close + f'"{finish}","stop_reason":null}}]') if last else mid
            tail = self._tail(start + i + 1) if cont else "}"
            out.append(self.head + self.open + escaped[w] + fin + tail + "\n\n")
        return "".join(out)

    def _tail(self, completion: int) -> str:
        if self.p.continuous_usage:
            return ',"usage":' + self._usage(completion) + "}"
        return "}"

    def usage_event(self, completion: int) -> str:
        return self.usage_head + self._usage(completion) + "}\n\n"


DONE_EVENT = "data: [DONE]\n\n"
