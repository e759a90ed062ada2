"""``sim --tokenizer PATH``: prompt counts and output tokens of a Hugging Face tokenizer.json."""

from __future__ import annotations

import subprocess
from pathlib import Path

import httpx
import pytest
from simproc import EXE, SimProcess

tokenizers = pytest.importorskip("tokenizers")

TOKENIZER = Path(__file__).parents[1] / "compat" / "data" / "tokenizer" / "tokenizer.json"


@pytest.fixture(scope="module")
def tok():
    return tokenizers.Tokenizer.from_file(str(TOKENIZER))


def test_counts_and_outputs_follow_the_tokenizer(tok):
    prompt = "The model reads the cache of every token in the batch, 42 times."
    expected = tok.encode(prompt, add_special_tokens=False).ids
    with SimProcess("--engine", "sglang", "--time-scale", "0.001",
                    "--tokenizer", str(TOKENIZER)) as s:
        t = httpx.post(s.url + "/v1/tokenize", json={"prompt": prompt}).json()
        assert t["tokens"] == expected
        out = httpx.post(s.url + "/generate", json={
            "text": prompt, "sampling_params": {"max_new_tokens": 30, "ignore_eos": True}}).json()
        completion = s.openai().completions.create(model="kimi-k3", prompt=prompt, max_tokens=5,
                                                   extra_body={"ignore_eos": True})
        info = httpx.get(s.url + "/sim/info").json()
        assert f"tokenizer: {TOKENIZER}" in s.log
    assert out["meta_info"]["prompt_tokens"] == len(expected)
    assert completion.usage.prompt_tokens == len(expected)
    ids = out["output_ids"]
    assert len(ids) == 30 and all(0 <= i < tok.get_vocab_size() for i in ids)
    assert tok.decode(ids) == out["text"]             # output tokens are the tokenizer's own
    assert info["tokenizer"] == str(TOKENIZER)
    back = tok.decode(expected)
    assert back == prompt


def test_bad_tokenizer_paths_are_refused(tmp_path):
    missing = subprocess.run([EXE, "sim", "--engine", "vllm", "--port", "1",
                              "--tokenizer", str(tmp_path / "none.json")],
                             capture_output=True, text=True, timeout=60)
    assert missing.returncode == 2
    assert "engine-advisor: error: --tokenizer:" in missing.stderr and "is not a file" in \
        missing.stderr
    junk = tmp_path / "tokenizer.json"
    junk.write_text("{\"not\": \"a tokenizer\"}")
    bad = subprocess.run([EXE, "sim", "--engine", "vllm", "--port", "1", "--tokenizer",
                          str(junk)], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "--tokenizer: cannot load" in bad.stderr
    assert "Traceback" not in bad.stderr
