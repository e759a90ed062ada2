"""Where each quantity sits in the arrays the formulas share: a row's fields
(``ROW_FIELDS``), a model's constants on one GPU and TP size (``K``), and the columns of the
prefill and decode terms in a row of features."""

from __future__ import annotations

PREFILL_TERMS = ("pf_gemm", "pf_moe", "pf_attn", "pf_mla", "pf_linear", "pf_ssd", "pf_comm",
                 "pf_fixed", "pf_moe_fixed", "pf_batch")
DECODE_TERMS = ("gemm", "moe", "kv_read", "mla_read", "dcp_read", "state", "tp_comm", "dcp_comm",
                "dcp_fixed", "kernel_fixed", "moe_fixed", "seq_fixed", "step_fixed")
N_PREFILL = len(PREFILL_TERMS)
N_DECODE = len(DECODE_TERMS)
N_TERMS = N_PREFILL + N_DECODE
FIRST_PREFILL = N_TERMS            # a row of features: total terms | first prefill | one step
STEP = N_TERMS + N_PREFILL
ROW_FIELDS = ("reserve", "fraction", "batch", "context", "output", "dcp", "share", "diversity",
              "activations", "graph_tokens",
              # the engine's memory layout for this model
              # (engine_advisor.model.engines.base.StateLayout)
              "mem_mode", "unit_bytes", "block_tokens", "state_units", "attn_units",
              "default_running", "state_ratio", "state_bytes",
              # the memory knobs as launched (engine_advisor.model.engines.base.MemoryKnobs; 0: the
              # default), and whether to choose them for the workload (a recommendation's rows)
              "max_running", "state_slots", "no_prefix_cache", "advise",
              # the fixed units of one request in the capacity the engine reports (its own
              # admission bound: vLLM's window pages of a whole prefill chunk)
              "report_units")
N_ROW_FIELDS = len(ROW_FIELDS)
(R_MODE, R_UNIT, R_BLOCK, R_STATE_UNITS, R_ATTN_UNITS, R_DEFAULT_RUNNING, R_RATIO, R_STATE,
 R_MAX_RUNNING, R_SLOTS, R_NO_PREFIX, R_ADVISE, R_REPORT_UNITS) = range(10, N_ROW_FIELDS)

# Positions in engine_advisor.model.physics.terms.Physics.K, the constants of one model on one GPU
# and TP size (a tuple of floats: unlike an array, passing it on costs no reference counting)
(W_DENSE, LOG_Q_MISS, W_EXPERTS, MM, N_FULL, KV_CALL, ATTN_CALL, STATE, N_LAYERS, ACT, Q_GATHER,
 O_GATHER, WEIGHTS_PASS, ATTN_PF, ATTN_PF_LINEAR, MEMORY, WEIGHT_BYTES, TP, KV_GPU_TOKEN,
 WINDOW_GPU, READ_T0, READ_ASYM, READ_BPS, MM_MOE, IS_MLA, ACT_PEAK, N_MOE_LAYERS,
 MOE_CALLS, ACT_SEQ, HBM_BPS, MAX_LEN, LIN_PF, LIN_STEP, IS_SSD) = range(34)
N_CONSTANTS = 34
# Columns of the prefill terms (offsets into PREFILL_TERMS) that prefill_into writes
(P_GEMM, P_MOE, P_ATTN, P_MLA, P_LINEAR, P_SSD, P_COMM, P_FIXED, P_MOE_FIXED,
 P_BATCH) = range(10)
# Columns of the decode terms (offsets into DECODE_TERMS) that decode_into writes
(D_GEMM, D_MOE, D_KV, D_MLA, D_DCP_READ, D_STATE, D_TP, D_DCP_COMM, D_DCP_FIXED, D_KERNELS,
 D_MOE_FIXED, D_SEQ, D_STEP) = range(13)


def fill_sizes(rows, batch, context, output, share, diversity) -> None:
    """Write a query's sizes into the ``ROW_FIELDS`` rows its configurations' fields were
    filled in (``engine_advisor.model.physics.features.static_rows``)."""
    rows[2] = batch
    rows[3] = context
    rows[4] = output
    rows[6] = share
    rows[7] = diversity
