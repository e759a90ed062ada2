"""Train the small byte-level BPE tokenizer the compatibility tests share (``data/tokenizer``).

The engines' benchmark clients load a tokenizer with ``transformers.AutoTokenizer`` and the
simulator loads the same ``tokenizer.json`` (``sim --tokenizer``), so prompt counts agree.
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


def corpus(lines: int = 4000, seed: int = 20261130) -> list[str]:
    rng = random.Random(seed)
    out = []
    for _ in range(lines):
        words = rng.choices(WORDS, k=rng.randint(5, 30))
        out.append(" ".join(words).capitalize() + rng.choice([".", ",", "!", "?", ";"]) +
                   f" {rng.randint(0, 9999)}")
    return out


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
    print(f"wrote {OUT} ({tok.get_vocab_size()} tokens)")


if __name__ == "__main__":
    main()
