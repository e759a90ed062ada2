"""A long body's routing facts, skimmed (engine_advisor.service.proxy.skim), are the ones a whole
decode finds; a body of another shape is decoded whole, with the same answer or 400."""

import json
import random

import pytest

from engine_advisor.service.errors import ApiError
from engine_advisor.service.proxy.request import CHAT, COMPLETIONS, parse
from engine_advisor.service.proxy.skim import SKIM_BYTES, skim

LONG = SKIM_BYTES * 2


def facts(req):
    return (req.model, req.stream, req.max_tokens, req.prompt_token_ids, req.prompt_bytes)


def decoded(raw: bytes, path: str):
    return parse(raw, path, json.loads(raw))


def text(rng: random.Random, n: int) -> str:
    """Text with everything a JSON string escapes or carries: quotes, backslashes, newlines,
    tabs, brackets and braces, non-ASCII letters and an emoji (a surrogate pair as \\u)."""
    pieces = ["word", '"', "\\", "\n", "\t", "[", "]", "{", "}", ",", ":", "é", "中", "😀",
              "\\n", "\\\\", " "]
    return "".join(rng.choice(pieces) for _ in range(n))


def dumps(obj, rng: random.Random) -> bytes:
    """As different clients write JSON: compact or spaced, non-ASCII raw or escaped."""
    ascii_only = rng.random() < 0.5
    sep = rng.choice([(",", ":"), (", ", ": "), (" ,\n", " :\t")])
    return json.dumps(obj, ensure_ascii=ascii_only, separators=sep).encode()


def chat_body(rng: random.Random) -> dict:
    msgs = []
    for i in range(rng.randint(1, 4)):
        kind = rng.random()
        if kind < 0.6:
            content = text(rng, rng.randint(0, LONG // 4))
        elif kind < 0.8:
            content = [{"type": "text", "text": text(rng, rng.randint(0, LONG // 8))},
                       {"type": "image_url", "image_url": {"url": "data:x]}\"["}},
                       {"type": "text", "text": text(rng, 50)}]
        else:
            content = None
        msgs.append({"role": ["system", "user", "assistant"][i % 3], "content": content,
                     "name": "n\"]"})
    body = {"model": "kimi-k3", "messages": msgs, "stream": rng.random() < 0.5,
            "tools": [{"type": "function", "function": {"name": "f", "parameters": {
                "type": "object", "properties": {"a": {"type": ["string", "null"]}}}}}],
            "stop": ["]", "}"], "temperature": 0.5, "n": 1, "logit_bias": {"50256": -100}}
    if rng.random() < 0.5:
        body["max_completion_tokens"] = rng.randint(1, 4096)
    if rng.random() < 0.5:
        body["max_tokens"] = rng.randint(1, 4096)
    return body


@pytest.mark.parametrize("seed", range(40))
def test_a_skimmed_chat_body_has_the_facts_of_a_decoded_one(seed):
    rng = random.Random(seed)
    raw = dumps(chat_body(rng), rng)
    if len(raw) < SKIM_BYTES:        # pad with a long system message
        body = json.loads(raw)
        body["messages"].insert(0, {"role": "system", "content": "p" * SKIM_BYTES})
        raw = dumps(body, rng)
    req = parse(raw, CHAT)
    assert req.decoded is None, "a long chat body of the usual shape is skimmed"
    assert facts(req) == facts(decoded(raw, CHAT))
    assert req.body == json.loads(raw)      # decoded on demand
    assert req.decoded is not None


@pytest.mark.parametrize("seed", range(20))
def test_a_skimmed_completions_body_has_the_facts_of_a_decoded_one(seed):
    rng = random.Random(seed)
    if seed % 2:
        prompt = [rng.randrange(-5, 200_000) for _ in range(rng.randint(10_000, 40_000))]
    else:
        prompt = text(rng, LONG)
    body = {"prompt": prompt, "model": "m", "max_tokens": rng.randint(1, 99),
            "stream": bool(seed % 3), "echo": False, "suffix": "]"}
    raw = dumps(body, rng)
    req = parse(raw, COMPLETIONS)
    assert req.decoded is None
    assert facts(req) == facts(decoded(raw, COMPLETIONS))


@pytest.mark.parametrize("raw", [
    # a batch of prompts, a nested token list, a list of strings: decoded whole
    json.dumps({"prompt": ["a" * LONG, "b"]}).encode(),
    json.dumps({"prompt": [list(range(20_000))]}).encode(),
    json.dumps({"prompt": ["x"] * 20_000}).encode(),
    # a message that is not an object (the decoder skips it)
    json.dumps({"messages": ["loose", {"role": "user", "content": "c" * LONG}]}).encode(),
], ids=["batch", "nested-ids", "strings", "loose-message"])
def test_other_shapes_are_decoded_whole(raw):
    path = CHAT if b'"messages"' in raw else COMPLETIONS
    assert skim(raw) is None or path == COMPLETIONS and skim(raw).has_prompt is False
    req = parse(raw, path)
    assert req.decoded is not None
    assert facts(req) == facts(decoded(raw, path))


@pytest.mark.parametrize("raw,says", [
    (b'{"messages": [], "pad": "' + b"x" * LONG + b'"}', "messages"),
    (b'{"model": 7, "messages": [{"content": "' + b"x" * LONG + b'"}]}', "model"),
    (b'{"stream": "yes", "prompt": "' + b"x" * LONG + b'"}', "stream"),
    (b'{"max_tokens": 0, "prompt": "' + b"x" * LONG + b'"}', "max_tokens"),
    (b'{"prompt": "' + b"x" * LONG + b'"} trailing', "invalid JSON"),
    (b'{"prompt": "' + b"x" * LONG, "invalid JSON"),
    (b'{"messages": ' + b"[" * LONG + b"]" * LONG + b"}", "nested too deeply"),
    (b'{"model": ' + b"[" * LONG + b"]" * LONG + b', "prompt": "x"}', "nested too deeply"),
], ids=["no-messages", "model", "stream", "max-tokens", "trailing",
        "truncated", "deep-messages", "deep-model"])
def test_a_long_body_the_decoder_refuses_is_a_400_naming_the_problem(raw, says):
    path = CHAT if b'"messages"' in raw else COMPLETIONS
    with pytest.raises(ApiError) as exc:
        parse(raw, path)
    assert exc.value.status == 400 and says in exc.value.message


def test_escapes_count_as_the_bytes_they_stand_for():
    # \" \\ \n \t \/ each one byte; \\n is a backslash and an n; \u00e9 two bytes, \ud83d\ude00
    # four
    content = '"\\\n\t/\\n' + "é😀"
    for ascii_only in (True, False):
        raw = json.dumps({"messages": [{"role": "user", "content": content * 20_000}]},
                         ensure_ascii=ascii_only).encode()
        req = parse(raw, CHAT)
        assert req.decoded is None
        assert req.prompt_bytes == len((content * 20_000).encode())


@pytest.mark.parametrize("raw", [
    b'{"prompt": [1, 2,, 3' + b", 4" * LONG + b"]}",
    b'{"messages": [{"content": "a\x01b\\q' + b"x" * LONG + b'"}]}',
    b'{"prompt": "\xff' + b"x" * LONG + b'"}',
], ids=["empty-token-id", "control-character-and-bad-escape", "not-utf8"])
def test_what_skimming_leaves_to_the_engine_is_still_refused_if_decoded(raw):
    """Inside a long prompt skimming does not check each token id's form, nor control
    characters, escapes and UTF-8 (the engine refuses them with its own 400, which the proxy
    relays); the body decoded on demand still answers 400."""
    path = CHAT if b'"messages"' in raw else COMPLETIONS
    req = parse(raw, path)
    assert req.decoded is None
    with pytest.raises(ApiError) as exc:
        _ = req.body
    assert exc.value.status == 400 and "invalid JSON" in exc.value.message
