"""Sliding-window layers beside full-attention ones, as each engine pools them (issue 42):
vLLM's groups of pages (a window group's request keeps its window's pages), SGLang's SWA pool
of ``--swa-full-tokens-ratio`` x the full pool's tokens. The numbers are the engines' own
arithmetic (``model/engines/vllm.py``, ``model/engines/sglang.py`` cite the source) on a
gpt-oss-20b-like config (12 full and 12 window layers of 128 tokens, 8 KV heads of 64)."""

from __future__ import annotations

import dataclasses
import math

import pytest

from engine_advisor.model.arch.architecture import from_hf_config
from engine_advisor.model.engines import sglang, vllm
from engine_advisor.model.engines.base import PAGED, SPLIT, HybridShape
from engine_advisor.model.hardware.gpus import builtin_gpu
from engine_advisor.model.physics.capacity import instance_fit, instance_pool
from engine_advisor.model.physics.memory import hybrid_shape
from engine_advisor.model.physics.shape import from_architecture

H200 = builtin_gpu("H200")
LAYER = 2 * 8 * 64 * 2                        # K and V of 8 heads of 64, bf16: one layer's token


def config(window: int = 128, layers: int = 24) -> dict:
    return {"architectures": ["GptOssForCausalLM"], "model_type": "gpt_oss",
            "hidden_size": 2880, "num_hidden_layers": layers, "num_attention_heads": 64,
            "num_key_value_heads": 8, "head_dim": 64, "intermediate_size": 2880,
            "num_local_experts": 32, "num_experts_per_tok": 4, "vocab_size": 201088,
            "sliding_window": window, "max_position_embeddings": 131072,
            "layer_types": ["sliding_attention", "full_attention"] * (layers // 2),
            "torch_dtype": "bfloat16"}


@pytest.fixture(scope="module")
def shape():
    return from_architecture(from_hf_config(config(), name="gpt-oss-like"), "bf16")


def window_shape(n_full=12, n_window=12, window=128, max_len=131072) -> HybridShape:
    return HybridShape(n_full=n_full, n_linear=0, linear_kind="", attention="gqa",
                       attn_token_layer_bytes=LAYER, conv_elems=0.0, ssm_elems=0.0,
                       ssm_dtype=None, ssm_cache_dtype=None, gpu_family="hopper",
                       gpu_memory_gib=139.8, max_model_len=max_len, n_window=n_window,
                       window=window)


def test_the_planner_sees_the_windows(shape):
    h = hybrid_shape(shape, 1, "H200", H200.memory_bytes)
    assert h is not None and h.window_pool
    assert (h.n_full, h.n_window, h.window, h.n_linear) == (12, 12, 128, 0)
    assert h.attn_token_layer_bytes == LAYER
    # without full-attention layers beside them (Mistral-style) nothing is pooled apart
    assert not dataclasses.replace(h, n_full=0).window_pool


@pytest.mark.parametrize("n_full,n_window,group,padding", [
    (12, 12, 12, None),            # equal counts: one group of each
    (6, 30, 6, None),              # 1:5 (Gemma 3): groups of the smaller count
    (8, 9, 9, "Add 1 padding layers"),   # under 1.5 x: groups of the larger count, padded
])
def test_vllm_groups_window_layers_as_its_kv_cache_manager_does(n_full, n_window, group,
                                                                 padding):
    x = vllm.state_layout(window_shape(n_full, n_window))
    assert x.mode == PAGED and x.windows and x.block_tokens == 16
    assert x.unit_bytes == 16 * LAYER * group
    assert x.attn_units == math.ceil(n_full / group)
    groups = math.ceil(n_window / group)
    # running: the last window - 1 tokens plus one page; reported: a whole 8,192-token chunk
    assert x.state_units == groups * (math.ceil(127 / 16) + 1)
    assert x.report_units == groups * (math.ceil((127 + 8192) / 16) + 1)
    assert (padding is None) == (not any(n.startswith("Add ") for n in x.notes))


def test_sglang_splits_its_pools_by_the_swa_ratio():
    x = sglang.state_layout(window_shape())
    assert x.mode == SPLIT and x.windows and x.state_bytes == 0
    assert x.ratio == pytest.approx(0.8)                 # 0.8 x 12 window layers : 12 full
    assert x.unit_bytes == 128 * 12 * LAYER              # one request's window, every layer
    assert sglang.state_layout(window_shape(6, 30)).ratio == pytest.approx(0.8 * 5)


def test_sglang_full_pool_is_the_source_formula(shape):
    """full tokens = rest / (full layers + 0.8 x window layers) / one layer's token, and the
    SWA pool 0.8 x that: the engine counts the windows' memory first. Before, every token of
    the rest went to the full pool (1.8 x as many)."""
    pooled = instance_pool("sglang", 0.9, H200, shape, 1, 1)
    flat = instance_pool("sglang", 0.9, H200,
                         dataclasses.replace(shape, n_window_layers=0, window_tokens=0), 1, 1)
    assert pooled.capacity_tokens == pytest.approx(flat.capacity_tokens / 1.8, rel=1e-3)
    assert pooled.state_slots == pytest.approx(0.8 * pooled.capacity_tokens / 128, rel=1e-3)


def test_vllm_reported_capacity_counts_a_chunk_of_window_pages(shape):
    pool = instance_pool("vllm", 0.9, H200, shape, 1, 1)
    blocks = pool.units + 1                               # the pool less its null block
    per_request = math.ceil(131072 / 16) + math.ceil((127 + 8192) / 16) + 1
    assert pool.capacity_tokens == pytest.approx(blocks / per_request * 131072, rel=1e-6)


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_windows_decide_how_many_long_sequences_run(shape, engine):
    """At 32K tokens each sequence's full-attention KV binds both engines; SGLang's SWA pool
    has taken 0.8 / 1.8 of its memory, vLLM's windows only their pages."""
    fit = instance_fit(engine, 0.9, H200, shape, 1, 1, 4096, 32768, 256)
    full = instance_pool(engine, 0.9, H200, shape, 1, 1)
    assert fit.limit == "kv"
    if engine == "vllm":
        per = math.ceil((32768 + 256) / 16) + math.ceil(127 / 16) + 1
        assert fit.running == (full.units) // per
    else:
        assert fit.running == pytest.approx(full.capacity_tokens / (32768 + 256), abs=1)



def test_the_simulated_sglang_logs_both_pools(shape):
    """The simulator's SGLang states the SWA pool as the engine does, beside the full pool's
    ``#tokens`` (a model served from a config.json; the CLI's presets have no windows)."""
    from types import SimpleNamespace

    from engine_advisor.sim.engines.sglang import Sglang

    pool = instance_pool("sglang", 0.9, H200, shape, 1, 1)
    cfg = SimpleNamespace(model_name="gpt-oss-like", num_gpus=1, dcp_size=1, mem_fraction=0.9,
                          max_running=None, disable_prefix_caching=False, seed=0,
                          max_mamba_cache_size=None, mamba_full_memory_ratio=None,
                          kv_bytes_per_gpu_token=shape.kv_bytes_per_token,
                          kv_cache_dtype="bf16")
    lines: list[str] = []
    Sglang().startup(lambda message, level="INFO": lines.append(message), cfg, pool)
    swa = [line for line in lines if line.startswith("Use sliding window memory pool")]
    assert swa == [f"Use sliding window memory pool. full_layer_tokens={pool.capacity_tokens}, "
                   f"swa_layer_tokens={int(pool.capacity_tokens * 0.8)}"]
    assert not any("Mamba" in line for line in lines)
    assert any(f"#tokens: {pool.capacity_tokens}," in line for line in lines)


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_what_binds_many_short_sequences_is_their_windows_kv(engine):
    """Sequences shorter than a 4K window keep every token in their window layers' pages
    (vLLM) or the SWA pool (SGLang): many of them are bound by that memory, which holds KV,
    not a linear-attention state."""
    wide = from_architecture(from_hf_config(config(window=4096), name="gpt-oss-4k"), "bf16")
    fit = instance_fit(engine, 0.9, H200, wide, 1, 1, 100_000, 1024, 256)
    assert 0 < fit.running < 100_000 and fit.limit == "kv"
