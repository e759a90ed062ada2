"""Hugging Face model ids that name a preset's architecture.

An engine serves a model under the name it was given (``--served-model-name``) or its path /
Hugging Face id. ``preset_of_model_id`` maps such a name to the preset whose config.json it
is, so that a measurement of ``deepseek-ai/DeepSeek-V2-Lite`` carries the architecture's
physics. Each entry is the repository named in the preset's ``_source`` key, plus variants
that share that config.json's architecture keys (chat / instruct tunes, renamed repositories).
Quantized variants (``-FP8``, ``-AWQ`` ...) are left out: their weights are not the preset's.
"""

from __future__ import annotations

from engine_advisor.model.arch.presets import PRESETS

ALIASES: dict[str, str] = {
    # kimi-k3: moonshotai/Kimi-K3
    "moonshotai/kimi-k3": "kimi-k3",
    # kimi-k2: moonshotai/Kimi-K2-Instruct (same architecture: -Base, -Instruct-0905)
    "moonshotai/kimi-k2-instruct": "kimi-k2",
    "moonshotai/kimi-k2-base": "kimi-k2",
    "moonshotai/kimi-k2-instruct-0905": "kimi-k2",
    # deepseek-v3: deepseek-ai/DeepSeek-V3 (same architecture: -Base, -0324)
    "deepseek-ai/deepseek-v3": "deepseek-v3",
    "deepseek-ai/deepseek-v3-base": "deepseek-v3",
    "deepseek-ai/deepseek-v3-0324": "deepseek-v3",
    # deepseek-v2-lite: deepseek-ai/DeepSeek-V2-Lite (and its chat tune)
    "deepseek-ai/deepseek-v2-lite": "deepseek-v2-lite",
    "deepseek-ai/deepseek-v2-lite-chat": "deepseek-v2-lite",
    # llama-3.1-*: meta-llama/Llama-3.1-*B (formerly Meta-Llama-3.1-*B), base and instruct
    "meta-llama/llama-3.1-8b": "llama-3.1-8b",
    "meta-llama/llama-3.1-8b-instruct": "llama-3.1-8b",
    "meta-llama/meta-llama-3.1-8b": "llama-3.1-8b",
    "meta-llama/meta-llama-3.1-8b-instruct": "llama-3.1-8b",
    "meta-llama/llama-3.1-70b": "llama-3.1-70b",
    "meta-llama/llama-3.1-70b-instruct": "llama-3.1-70b",
    "meta-llama/meta-llama-3.1-70b": "llama-3.1-70b",
    "meta-llama/meta-llama-3.1-70b-instruct": "llama-3.1-70b",
    "meta-llama/llama-3.1-405b": "llama-3.1-405b",
    "meta-llama/llama-3.1-405b-instruct": "llama-3.1-405b",
    "meta-llama/meta-llama-3.1-405b": "llama-3.1-405b",
    "meta-llama/meta-llama-3.1-405b-instruct": "llama-3.1-405b",
    # qwen3-235b-a22b: Qwen/Qwen3-235B-A22B (same architecture: the 2507 tunes)
    "qwen/qwen3-235b-a22b": "qwen3-235b-a22b",
    "qwen/qwen3-235b-a22b-instruct-2507": "qwen3-235b-a22b",
    "qwen/qwen3-235b-a22b-thinking-2507": "qwen3-235b-a22b",
    # qwen3-32b: Qwen/Qwen3-32B
    "qwen/qwen3-32b": "qwen3-32b",
    # qwen3-30b-a3b: Qwen/Qwen3-30B-A3B (same architecture: the 2507 tunes)
    "qwen/qwen3-30b-a3b": "qwen3-30b-a3b",
    "qwen/qwen3-30b-a3b-instruct-2507": "qwen3-30b-a3b",
    "qwen/qwen3-30b-a3b-thinking-2507": "qwen3-30b-a3b",
    # mixtral-8x7b: mistralai/Mixtral-8x7B-v0.1 (same architecture: -Instruct-v0.1)
    "mistralai/mixtral-8x7b-v0.1": "mixtral-8x7b",
    "mistralai/mixtral-8x7b-instruct-v0.1": "mixtral-8x7b",
    # qwen3-next-80b-a3b-fp8: Qwen/Qwen3-Next-80B-A3B-Instruct-FP8 (and the Thinking tune)
    "qwen/qwen3-next-80b-a3b-instruct-fp8": "qwen3-next-80b-a3b-fp8",
    "qwen/qwen3-next-80b-a3b-thinking-fp8": "qwen3-next-80b-a3b-fp8",
    # nemotron-3-nano-30b-a3b: nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-BF16
    "nvidia/nvidia-nemotron-3-nano-30b-a3b-bf16": "nemotron-3-nano-30b-a3b",
}

# the repository part alone ("DeepSeek-V2-Lite", a local folder named like the repository)
_BY_NAME: dict[str, str] = {k.rsplit("/", 1)[1]: v for k, v in ALIASES.items()}


def preset_of_model_id(model_id: str | None) -> str | None:
    """The preset a served model's name names, or None.

    Matches, ignoring case: a preset's own name (``deepseek-v2-lite``), a Hugging Face id of
    ``ALIASES`` (``deepseek-ai/DeepSeek-V2-Lite``), or the last path component of a local path
    or id (``/models/DeepSeek-V2-Lite``, ``hf.co/meta-llama/Llama-3.1-8B-Instruct``).
    """
    text = (model_id or "").strip().rstrip("/").lower()
    if not text:
        return None
    if text in PRESETS:
        return text
    if text in ALIASES:
        return ALIASES[text]
    parts = text.split("/")
    if len(parts) >= 2 and "/".join(parts[-2:]) in ALIASES:
        return ALIASES["/".join(parts[-2:])]
    last = parts[-1]
    if last in PRESETS:
        return last
    return _BY_NAME.get(last)
