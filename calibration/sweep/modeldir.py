"""A model folder an engine can serve without the weights: ``calibrate model-dir``.

Real engines time real kernels on random weights (vLLM and SGLang ``--load-format dummy``): what
they need from the model folder is the architecture (``config.json``) and a tokenizer. This writes
both from a preset or a Hugging Face config.json, with no download:

- ``config.json``: the architecture keys, plus ``bos_token_id`` / ``eos_token_id`` (and
  ``max_position_embeddings`` raised to ``--max-model-len`` when given);
- ``tokenizer.json``: a word-level tokenizer with exactly the model's ``vocab_size`` entries
  (``<unk>``, ``<s>``, ``</s>``, then ``w3``, ``w4``, ...), split on white space; calibration sends
  token-id prompts, so the tokenizer only has to turn generated ids back into text;
- ``tokenizer_config.json`` and ``generation_config.json`` that point the engines at them.

What random weights do not capture: a trained router's choice of experts (a random router may
spread or concentrate tokens differently), and speculative decoding's acceptance rates.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from engine_advisor.calibration.errors import CalibrationError
from engine_advisor.model.diskio import atomic_write

SPECIAL = ("<unk>", "<s>", "</s>")
UNK, BOS, EOS = 0, 1, 2


class ModelDirError(CalibrationError, ValueError):
    """A config that cannot become a servable folder; the message names the key."""


def text_config(config: dict[str, Any]) -> dict[str, Any]:
    """The language model's part of a config (multimodal configs nest it under ``text_config``)."""
    inner = config.get("text_config")
    return inner if isinstance(inner, dict) and "vocab_size" in inner else config


def tokenizer_json(vocab_size: int) -> dict[str, Any]:
    """A word-level tokenizer of ``vocab_size`` ids (the format of the ``tokenizers`` library)."""
    if vocab_size < len(SPECIAL) + 1:
        raise ModelDirError(f"vocab_size: {vocab_size} leaves no room for ordinary tokens")
    vocab = {tok: i for i, tok in enumerate(SPECIAL)}
    vocab.update({f"w{i}": i for i in range(len(SPECIAL), vocab_size)})
    return {
        "version": "1.0", "truncation": None, "padding": None,
        "added_tokens": [{"id": i, "content": tok, "single_word": False, "lstrip": False,
                          "rstrip": False, "normalized": False, "special": True}
                         for i, tok in enumerate(SPECIAL)],
        "normalizer": None, "pre_tokenizer": {"type": "WhitespaceSplit"},
        "post_processor": None, "decoder": None,
        "model": {"type": "WordLevel", "vocab": vocab, "unk_token": SPECIAL[UNK]},
    }


def write_model_dir(config: dict[str, Any], out: str | Path, *,
                    max_model_len: int | None = None) -> Path:
    """Write a servable folder for ``config`` (config.json contents) under ``out``."""
    cfg = {k: v for k, v in config.items() if not k.startswith("_")}
    text = text_config(cfg)
    vocab = text.get("vocab_size")
    if not isinstance(vocab, int) or isinstance(vocab, bool):
        raise ModelDirError("vocab_size: the config has no integer vocab_size")
    if not cfg.get("architectures"):
        raise ModelDirError("architectures: the config names no architecture class")
    for c in {id(cfg): cfg, id(text): text}.values():
        c["bos_token_id"], c["eos_token_id"] = BOS, EOS
        c.pop("pad_token_id", None)
    if max_model_len is not None and text.get("max_position_embeddings", 0) < max_model_len:
        text["max_position_embeddings"] = max_model_len
    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)

    def dump(name: str, obj: dict[str, Any]) -> None:
        atomic_write(folder / name, (json.dumps(obj, indent=1) + "\n").encode())

    dump("config.json", cfg)
    dump("tokenizer.json", tokenizer_json(vocab))
    dump("tokenizer_config.json", {
        "tokenizer_class": "PreTrainedTokenizerFast", "unk_token": SPECIAL[UNK],
        "bos_token": SPECIAL[BOS], "eos_token": SPECIAL[EOS], "add_bos_token": False,
        "add_eos_token": False, "clean_up_tokenization_spaces": False,
        "model_max_length": max_model_len or text.get("max_position_embeddings", 131072)})
    dump("special_tokens_map.json", {"unk_token": SPECIAL[UNK], "bos_token": SPECIAL[BOS],
                                     "eos_token": SPECIAL[EOS]})
    dump("generation_config.json", {"bos_token_id": BOS, "eos_token_id": EOS})
    return folder
