"""Train the small byte-level BPE tokenizer the compatibility tests share (``data/tokenizer``),
and write the prompts of SGLang's client's text datasets (``data/prompts.json``).

The engines' benchmark clients load a tokenizer with ``transformers.AutoTokenizer`` and the
simulator loads the same ``tokenizer.json`` (``sim --tokenizer``), so prompt counts agree.
``prompts.json`` is in ShareGPT's layout (``sglang.bench_serving --dataset-name random
--dataset-path``): prompts of words that are each one token with their leading space, so
however the client cuts or repeats their token ids, the text it decodes and sends encodes back
to exactly as many tokens as it records (its ``random-ids`` text, consecutive vocabulary ids
decoded, does not: the simulator counted 2,334 tokens for 2,048).
Deterministic: the corpus is generated from a fixed word list and seed. Run it with a Python
that has ``tokenizers``:

    .venv/bin/python tests/compat/make_tokenizer.py
"""

from __future__ import annotations

import json
import random
from pathlib import Path

WORDS = """the of and to in is it for on was as at by an be are or has not but can all one we
you new now may way use two who its out day get see him how our set old big end why let put say
own few run low far top key GPU KV HBM DCP tok model token cache memory engine batch decode
prefill context length request server client latency throughput time first output input
prompt fraction parallel tensor layer attention expert router proxy sequence window
long short fast slow measure bench result file line value number data point size""".split()
VOCAB_SIZE = 2000
OUT = Path(__file__).parent / "data" / "tokenizer"
PROMPTS = Path(__file__).parent / "data" / "prompts.json"


def corpus(lines: int = 4000, seed: int = 20261130) -> list[str]:
    rng = random.Random(seed)
    out = []
    for _ in range(lines):
        words = rng.choices(WORDS, k=rng.randint(5, 30))
        out.append(" ".join(words).capitalize() + rng.choice([".", ",", "!", "?", ";"]) +
                   f" {rng.randint(0, 9999)}")
    return out


def write_prompts(tok, n: int = 16, words: int = 300, seed: int = 20261130) -> None:
    """ShareGPT-style conversations whose prompts are single-token words (with the space)."""
    single = [w for w in WORDS if len(tok.encode(" " + w).ids) == 1]
    rng = random.Random(seed)
    convs = []
    for i in range(n):
        text = " " + " ".join(rng.choices(single, k=words))
        assert len(tok.encode(text).ids) == words
        convs.append({"id": f"compat-{i}", "conversations": [
            {"from": "human", "value": text}, {"from": "gpt", "value": " ok"}]})
    PROMPTS.write_text(json.dumps(convs, indent=0) + "\n")


def main() -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB_SIZE, special_tokens=["<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(corpus(), trainer)
    OUT.mkdir(parents=True, exist_ok=True)
    tok.save(str(OUT / "tokenizer.json"))
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "<|endoftext|>",
              "bos_token": None, "unk_token": None, "pad_token": "<|endoftext|>",
              "model_max_length": 1_048_576, "add_bos_token": False, "add_eos_token": False,
              "clean_up_tokenization_spaces": False}
    (OUT / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")
    write_prompts(tok)
    print(f"wrote {OUT} ({tok.get_vocab_size()} tokens) and {PROMPTS}")


if __name__ == "__main__":
    main()
