"""Parameters and checkpoint bytes of a decoder, by part, from its layout and quantization.

Parts: ``embed`` (input embedding table), ``lm_head`` (0 when tied to the embedding),
``attention`` (full and sliding attention projections and their norms), ``linear_attention``
(KDA / Gated DeltaNet projections, short convolutions, gates), ``dense_mlp``, ``shared_experts``,
``routed_experts`` (all experts of all MoE layers), ``other`` (layer norms, MoE routers and
their score biases, latent-MoE down/up projections). Shapes follow the Hugging Face modules
(gated MLPs: gate, up and down projections; MLA: q_a/q_b (or q), kv_a_proj_with_mqa, kv_b,
o; Kimi Linear KDA: q, k, v, g (full rank or low rank), b, f_a, f_b, o, three depthwise convs;
Gated DeltaNet: in_proj_qkvz, in_proj_ba, out_proj, one depthwise conv over q, k and v;
Mamba2: in_proj to z, x, B, C and dt, a depthwise conv over x, B and C, out_proj; Nemotron-H's
blocks hold a mixer or a feed-forward, and its MLPs and experts are up and down projections).
Not counted: multi-token-prediction layers (``num_nextn_predict_layers``, loaded only for MTP
speculative decoding) and vision towers.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from engine_advisor.model.arch.layout import DENSE, LINEAR, MOE, NONE, Layout
from engine_advisor.model.arch.quant import Quantization

PARTS = ("embed", "lm_head", "attention", "linear_attention", "dense_mlp", "shared_experts",
         "routed_experts", "other")


@dataclass
class Tally:
    params: dict[str, float] = field(default_factory=lambda: dict.fromkeys(PARTS, 0.0))
    bytes: dict[str, float] = field(default_factory=lambda: dict.fromkeys(PARTS, 0.0))
    matmul: dict[str, float] = field(default_factory=lambda: dict.fromkeys(PARTS, 0.0))
    labels: dict[str, set] = field(default_factory=lambda: {p: set() for p in PARTS})
    quant: Quantization | None = None
    routed_expert_params: float = 0.0
    routed_expert_bytes: float = 0.0

    def add(self, other: Tally, times: int) -> None:
        for part in PARTS:
            self.params[part] += times * other.params[part]
            self.bytes[part] += times * other.bytes[part]
            self.matmul[part] += times * other.matmul[part]
            self.labels[part] |= other.labels[part]
        if other.routed_expert_params:
            self.routed_expert_params = other.routed_expert_params
            self.routed_expert_bytes = other.routed_expert_bytes

    def linear(self, part: str, name: str, out_f: int, in_f: int, bias: bool = False,
               quantizable: bool = True) -> float:
        q = self.quant
        n = out_f * in_f
        b = q.linear_bytes(name, out_f, in_f) if quantizable else n * q.dtype_bytes
        if bias:
            n += out_f
            b += out_f * q.dtype_bytes
        self.params[part] += n
        self.matmul[part] += n
        self.bytes[part] += b
        self.labels[part].add(q.label_for(name) if quantizable else q.dtype_label)
        return b

    def plain(self, part: str, n: float, nbytes: float | None = None) -> None:
        """Parameters that are not matmul weights (norms, biases, conv kernels, tables)."""
        self.params[part] += n
        self.bytes[part] += n * self.quant.dtype_bytes if nbytes is None else nbytes
        self.labels[part].add(self.quant.dtype_label)


def _mla(t: Tally, p: str, lay: Layout, h: int) -> None:
    a = lay.attention
    qk = a.qk_nope_head_dim + a.qk_rope_head_dim
    if a.q_lora_rank:
        t.linear("attention", p + "q_a_proj", a.q_lora_rank, h)
        t.plain("attention", a.q_lora_rank)                        # q_a_layernorm
        t.linear("attention", p + "q_b_proj", a.q_heads * qk, a.q_lora_rank)
    else:
        t.linear("attention", p + "q_proj", a.q_heads * qk, h)
    t.linear("attention", p + "kv_a_proj_with_mqa", a.kv_lora_rank + a.qk_rope_head_dim, h)
    t.plain("attention", a.kv_lora_rank)                           # kv_a_layernorm
    t.linear("attention", p + "kv_b_proj", a.q_heads * (a.qk_nope_head_dim + a.v_head_dim),
             a.kv_lora_rank)
    t.linear("attention", p + "o_proj", h, a.q_heads * a.v_head_dim)
    if a.output_gate:
        t.linear("attention", p + "o_gate_proj", a.q_heads * a.v_head_dim, h)


def _gqa(t: Tally, p: str, lay: Layout, h: int, qk_norm: bool) -> None:
    a = lay.attention
    gate = 2 if a.output_gate else 1                  # attn_output_gate: query and gate
    t.linear("attention", p + "q_proj", gate * a.q_heads * a.head_dim, h, a.bias)
    t.linear("attention", p + "k_proj", a.kv_heads * a.head_dim, h, a.bias)
    t.linear("attention", p + "v_proj", a.kv_heads * a.head_dim, h, a.bias)
    t.linear("attention", p + "o_proj", h, a.q_heads * a.head_dim)
    if qk_norm:
        t.plain("attention", 2 * a.head_dim)


def _gdn(t: Tally, p: str, lay: Layout, h: int) -> None:
    g = lay.linear
    key, value = g.key_heads * g.head_dim, g.heads * g.value_head_dim
    t.linear("linear_attention", p + "in_proj_qkvz", 2 * key + 2 * value, h)
    t.linear("linear_attention", p + "in_proj_ba", 2 * g.heads, h)
    t.linear("linear_attention", p + "out_proj", h, value)
    # depthwise conv over q, k, v; dt_bias and A_log per value head; gated output norm
    t.plain("linear_attention", g.conv_channels * g.conv_kernel + 2 * g.heads + g.value_head_dim)


def _kda(t: Tally, p: str, lay: Layout, h: int) -> None:
    k = lay.linear
    width = k.heads * k.head_dim
    for proj in ("q_proj", "k_proj", "v_proj"):
        t.linear("linear_attention", p + proj, width, h)
    if k.full_rank_gate:
        t.linear("linear_attention", p + "g_proj", width, h)
    else:
        t.linear("linear_attention", p + "g_proj.0", k.head_dim, h)
        t.linear("linear_attention", p + "g_proj.1", width, k.head_dim, bias=True)
    t.linear("linear_attention", p + "b_proj", k.heads, h)
    t.linear("linear_attention", p + "f_proj.0", k.head_dim, h)
    t.linear("linear_attention", p + "f_proj.1", width, k.head_dim)
    t.linear("linear_attention", p + "o_proj", h, width)
    # q/k/v depthwise short convs, A_log per head, dt_bias per channel, output norm
    t.plain("linear_attention", 3 * width * k.conv_kernel + k.heads + width + k.head_dim)


def _mamba2(t: Tally, p: str, lay: Layout, h: int) -> None:
    m = lay.linear
    inner = m.heads * m.value_head_dim
    # z and x (inner each), B and C (groups x state each), dt (one per head)
    t.linear("linear_attention", p + "in_proj", 2 * inner + 2 * m.key_heads * m.head_dim
             + m.heads, h)
    t.linear("linear_attention", p + "out_proj", h, inner)
    # depthwise conv (kernel and bias) over x, B and C; dt_bias, A_log and D per head; the
    # gated output norm
    t.plain("linear_attention", m.conv_channels * (m.conv_kernel + 1) + 3 * m.heads + inner)


def _mlp(t: Tally, part: str, p: str, inner: int, outer: int, gated: bool = True) -> float:
    gate = t.linear(part, p + "gate_proj", inner, outer) if gated else 0.0
    return (gate + t.linear(part, p + "up_proj", inner, outer)
            + t.linear(part, p + "down_proj", outer, inner))


def _moe(t: Tally, p: str, lay: Layout, h: int) -> None:
    m = lay.moe
    t.linear("other", p + "gate", m.n_routed, h, quantizable=False)          # router
    if m.router_bias:
        t.plain("other", m.n_routed, m.n_routed * 4)                        # fp32 bias
    if m.expert_hidden != h:                 # latent MoE: replicated down/up projections
        t.linear("other", p + "latent_down_proj", m.expert_hidden, h, quantizable=False)
        t.linear("other", p + "latent_up_proj", h, m.expert_hidden, quantizable=False)
        t.plain("other", m.expert_hidden)                                   # latent norm
    before_p, before_m = t.params["routed_experts"], t.matmul["routed_experts"]
    one = _mlp(t, "routed_experts", p + "experts.0.", m.expert_intermediate, m.expert_hidden,
               lay.gated_mlp)
    n_one = t.params["routed_experts"] - before_p
    # the other n_routed - 1 experts have the same shape and format as expert 0
    t.params["routed_experts"] += (m.n_routed - 1) * n_one
    t.matmul["routed_experts"] = before_m + m.n_routed * n_one
    t.bytes["routed_experts"] += (m.n_routed - 1) * one
    t.routed_expert_params, t.routed_expert_bytes = n_one, one
    if m.shared_intermediate:
        _mlp(t, "shared_experts", p + "shared_experts.", m.shared_intermediate, h,
             lay.gated_mlp)


def _layer(lay: Layout, quant: Quantization, i: int, hidden: int, qk_norm: bool) -> Tally:
    t = Tally(quant=quant)
    p = f"model.layers.{i}."
    kind, ffn = lay.kinds[i], lay.ffn[i]
    t.plain("other", ((kind != NONE) + (ffn != NONE)) * hidden)     # a norm before each
    if kind == LINEAR and lay.linear.kind == "gdn":
        _gdn(t, p + "linear_attn.", lay, hidden)
    elif kind == LINEAR and lay.linear.kind == "mamba2":
        _mamba2(t, p + "mixer.", lay, hidden)
    elif kind == LINEAR:
        _kda(t, p + "self_attn.", lay, hidden)
    elif kind == NONE:
        pass
    elif lay.attention.kind == "mla":
        _mla(t, p + "self_attn.", lay, hidden)
    else:
        _gqa(t, p + "self_attn.", lay, hidden, qk_norm)
    if ffn == MOE:
        _moe(t, p + "mlp.", lay, hidden)
    elif ffn == DENSE:
        _mlp(t, "dense_mlp", p + "mlp.", lay.dense_intermediate, hidden, lay.gated_mlp)
    return t


def count(lay: Layout, quant: Quantization, hidden: int, vocab: int, tied: bool,
          qk_norm: bool) -> Tally:
    t = Tally(quant=quant)
    t.plain("embed", vocab * hidden)
    if not tied:
        t.linear("lm_head", "lm_head", vocab, hidden)
    t.plain("other", hidden)                                                # final norm
    # Layers of one kind are identical unless the quantization names layers by index.
    groups: dict[object, list[int]] = {}
    for i, kind in enumerate(lay.kinds):
        key = (kind, lay.ffn[i]) if quant.index_free else i
        groups.setdefault(key, []).append(i)
    for members in groups.values():
        one = _layer(lay, quant, members[0], hidden, qk_norm)
        t.add(one, len(members))
    return t
