"""The docs test's machinery catches what it is for: a changed output or figure (and rewrites
it), a flag that no longer exists, an unmarked example, a wrong KV figure, a dead link, a
command the README's install does not provide, a module that does not exist; and it runs an
example as a user types it."""

from __future__ import annotations

import json
import os
import sys

import pytest

from .check import Context, check_page
from .compare import dumps, json_problems, text_problems
from .markers import ROOT
from .run import Server

LIST_GPUS = "<!--example-->\n```bash\n.venv/bin/engine-advisor recommend --list-gpus\n```\n"


@pytest.fixture
def ctx():
    ctx = Context(Server())     # the server never started by these pages (no curl example)
    yield ctx
    ctx.close()


def page(tmp_path, text: str):
    p = tmp_path / "page.md"
    p.write_text(text, encoding="utf-8")
    return p


def test_a_changed_output_line_is_named_by_its_figure_and_rewritten(tmp_path, ctx):
    from engine_advisor.cli.catalogue import gpu_table

    h100 = next(x for x in gpu_table().splitlines() if x.startswith("H100"))
    wrong = h100.replace("3.35 TB/s", "3.36 TB/s")
    p = page(tmp_path, LIST_GPUS + f"\n<!--output:abridged-->\n```text\n{wrong}\n```\n")
    rep = check_page(p, ctx)
    assert len(rep.problems) == 1 and not rep.manual
    assert "3.36 -> 3.35" in rep.problems[0] and "page.md:7" in rep.problems[0]
    assert "engine-advisor recommend --list-gpus" in rep.problems[0]
    p.write_text(rep.text, encoding="utf-8")
    assert check_page(p, ctx).problems == []
    assert h100 in p.read_text()


def test_a_line_the_output_no_longer_has_needs_a_hand(tmp_path, ctx):
    p = page(tmp_path, LIST_GPUS + "\n<!--output:abridged-->\n```text\nA100 nvidia\n```\n")
    rep = check_page(p, ctx)
    assert rep.manual and "documented line not in the output: 'A100 nvidia'" in rep.manual[0]


def test_a_figure_is_checked_and_rewritten(tmp_path, ctx):
    p = page(tmp_path, "KV: <!--fig:arch.k3.kv_bf16-->70,272<!--/fig--> B per token.\n")
    rep = check_page(p, ctx)
    assert rep.problems == [f"{p}:1: figure 'arch.k3.kv_bf16': documented '70,272', "
                            "now '27,648'"]
    assert "<!--fig:arch.k3.kv_bf16-->27,648<!--/fig-->" in rep.text
    unknown = check_page(page(tmp_path, "<!--fig:no.such-->1<!--/fig-->\n"), ctx)
    assert unknown.manual and "no figure 'no.such'" in unknown.manual[0]


def test_a_generated_table_is_checked(tmp_path, ctx):
    p = page(tmp_path, "<!--gen:arch.gpus-->\n| GPU |\n<!--/gen-->\n")
    rep = check_page(p, ctx)
    assert "generated 'arch.gpus' differs" in rep.problems[0]
    assert "| H20 | 103,079,215,104 |" in rep.text


@pytest.mark.parametrize("text, needle", [
    ("```bash\nengine-advisor recommend --preset kimi-k3\n```\n", "needs <!--example--> or"),
    ("<!--illustrative:x-->\n```bash\nengine-advisor recommend --gpu-count 8\n```\n",
     "no longer parses: engine-advisor recommend: error: unrecognized argument: --gpu-count "
     "(did you mean --num-gpus?)"),
    ("<!--illustrative:x-->\n```bash\nengine-advisor calibrate run --model kimi-k3 "
     "--kv-bytes-per-token 70272\n```\n", "--kv-bytes-per-token 70272 is not kimi-k3's 27,648"),
    ("See [the proxy](proxy.md#no-such-heading).\n", "no heading #no-such-heading"),
    ("See [nothing](missing.md).\n", "missing.md does not exist"),
    ("<!--example-->\n```bash\n.venv/bin/engine-advisor recommend --preset kimi-k3 "
     "--context-tokens 0 --output-tokens 1\n```\n", "engine-advisor: error: --context-tokens"),
    # what the README's install does not put on PATH, in a block of any kind (comments too)
    ("<!--illustrative:x-->\n```bash\n.venv/bin/engine-advisor serve   # or: engine-advisor "
     "serve\n```\n", "`engine-advisor` is not on PATH after the README's install"),
    ("```bash\npip install -e .\n```\n", "`pip` is not the project's environment after the "
     "README's install (`python3 -m venv .venv && .venv/bin/pip install -e .`): write "
     ".venv/bin/pip"),
    ("<!--example-->\n```bash\npython3 -m venv /tmp/x && python -c 1\n```\n",
     "`python` is not the project's environment"),
    ("```python\nprint(1)\n```\n", "a block a user would run needs <!--example--> or"),
    ("<!--illustrative:x-->\n```bash\n.venv/bin/python -m engine_advisor.model.no_such\n```\n",
     "`python -m engine_advisor.model.no_such`: no such module"),
    ("<!--illustrative:x-->\n```python\nfrom engine_advisor.model.arch import no_such\n```\n",
     "from engine_advisor.model.arch import no_such: no such name"),
    ("Run `python -m engine_advisor.model.fit.seedcheck`.\n", "write .venv/bin/python"),
    ("Build it: `pip install -e '.[docs]' && .venv/bin/mkdocs build`.\n", "write .venv/bin/pip"),
    ("Run `.venv/bin/python -c 'from engine_advisor.model.arch import nope'`.\n",
     "import nope: no such name"),
])
def test_what_only_a_hand_can_fix_is_reported(tmp_path, ctx, text, needle):
    (tmp_path / "proxy.md").write_text("# Proxy\n\n## The pools file\n")
    rep = check_page(page(tmp_path, text), ctx)
    assert any(needle in m for m in rep.manual), rep.problems


def test_an_example_runs_as_typed_from_the_root_with_the_tests_venv(tmp_path, ctx):
    """A bare engine-advisor fails as it would after the README's install (not on PATH); the
    page's .venv is the test's environment; what an example writes stays out of the checkout."""
    rep = check_page(page(tmp_path, "<!--example-->\n```bash\nengine-advisor --help\n```\n"),
                     ctx)
    assert any("failed (exit 127)" in m and "engine-advisor: command not found" in m
               for m in rep.manual), rep.problems
    prefix = os.path.realpath(sys.prefix)
    where = "import os, sys; print(os.path.realpath(sys.prefix))"
    text = (f"<!--example-->\n```bash\n.venv/bin/python -c '{where}' > docs-test-prefix.txt "
            "&& cat docs-test-prefix.txt && test -f pyproject.toml\n```\n"
            f"\n<!--output-->\n```text\n{prefix}\n```\n"
            "\n<!--example-->\n```python\nfrom engine_advisor.model.arch import preset\n"
            "print(preset('kimi-k3').kv_bytes_per_token('bf16'))\n```\n"
            "\n<!--output-->\n```text\n27648\n```\n")
    rep = check_page(page(tmp_path, text), ctx)
    assert rep.problems == []
    assert not (ROOT / "docs-test-prefix.txt").exists()
    assert (ctx.workspace.root() / "docs-test-prefix.txt").read_text().strip() == prefix


def test_an_illustrative_synopsis_and_elisions_parse():
    from .run import parses, unwrap_optional

    assert parses(unwrap_optional(["engine-advisor", "serve", "[--host", "127.0.0.1]",
                                   "[--port", "8000]"])) is None
    assert "unrecognized" in parses(["engine-advisor", "serve", "--hots", "x"])


def test_json_outputs_compare_as_data_at_the_digits_shown():
    act = {"engine": "sglang", "total_s": 944.8412, "predictions": [
        {"engine": "vllm", "dcp_size": 1, "total_s": 1029.41},
        {"engine": "sglang", "dcp_size": 8, "total_s": 944.8412}],
        "reasons": ["a 1.09x b", "mem 0.92 x", "last"], "extra": 1}
    doc = {"total_s": 944.84, "predictions": [{"engine": "sglang", "dcp_size": 8,
                                               "total_s": 944.84}],
           "reasons": ["a 1.09x b", "last"]}
    assert json_problems(json.dumps(doc), json.dumps(act), abridged=True)[0] == []
    act["predictions"][1]["total_s"] = 950.123
    act["reasons"][0] = "a 1.12x b"
    problems, new = json_problems(json.dumps(doc), json.dumps(act), abridged=True)
    assert problems == ["predictions[0].total_s: documented 944.84, now 950.12",
                        "reasons[0]: 1.09 -> 1.12 in 'a 1.09x b'"]
    assert json.loads(new)["predictions"] == [{"engine": "sglang", "dcp_size": 8,
                                               "total_s": 950.12}]
    full = json_problems(json.dumps(doc), json.dumps(act), abridged=False)[0]
    assert "extra: not documented" in full


def test_text_outputs_pair_lines_up_to_their_numbers():
    act = "head\nRecommendation: vllm 1.12x\nmiddle\nLaunch: --tp 8\n"
    assert text_problems("Recommendation: vllm 1.12x\nLaunch: --tp 8", act, True)[0] == []
    problems, new = text_problems("Recommendation: vllm 1.09x\nLaunch: --tp 8", act, True)
    assert problems == ["1.09 -> 1.12 in 'Recommendation: vllm 1.09x'"]
    assert new == "Recommendation: vllm 1.12x\nLaunch: --tp 8"
    assert text_problems("head\nx", act, False)[0][0].startswith("line 2: documented 'x'")


def test_the_json_layout_round_trips():
    v = {"a": [{"engine": "x" * 30, "dcp_size": 8, "total_s": 1.5, "step": {"k": 0.1} }],
         "launch": ["python", "-m", "sglang.launch_server"] * 6, "reasons": ["r" * 120]}
    text = dumps(v)
    assert json.loads(text) == v
    assert max(len(x) for x in text.splitlines() if '"r' not in x) <= 100
