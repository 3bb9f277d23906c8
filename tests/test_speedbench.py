"""bench speed's pure parts: the bounds arithmetic, the parameter count and the table."""

from __future__ import annotations

import pytest
import torch

from replayrl.bench.speed import (
    NEW16,
    NEW32,
    Row,
    _learner,
    _with_bounds,
    decode_bound,
    format_header,
    format_table,
    grpo_bound,
    learner_bound,
    machine_info,
    matmul_params,
)
from replayrl.models import precision


def test_decode_bound_is_memory_or_compute_limited():
    # 100M params fp32 at 40 GB/s: 10 ms per step to read them; 2*100M*16 FLOPs at 320
    # GFLOP/s: 10 ms too -> 16 rows per 10 ms = 1,600 tok/s
    assert decode_bound(100_000_000, 16, 320.0, 40.0, 4) == pytest.approx(1600.0)
    # batch 64: compute-bound (40 ms per step) -> 1,600 tok/s still
    assert decode_bound(100_000_000, 64, 320.0, 40.0, 4) == pytest.approx(1600.0)
    # batch 1: memory-bound, 100 tok/s
    assert decode_bound(100_000_000, 1, 320.0, 40.0, 4) == pytest.approx(100.0)


def test_matmul_params_counts_linear_weights_and_the_head(tiny_model):
    c = tiny_model.config
    h, i, v, layers = c.hidden_size, c.intermediate_size, c.vocab_size, c.num_hidden_layers
    per_layer = 4 * h * h + 3 * h * i  # q, k, v, o (no GQA here) + gate, up, down
    assert matmul_params(tiny_model) == layers * per_layer + v * h


def test_table_speedups_are_against_the_old_row_of_the_same_workload():
    rows = [
        Row("generation", "old fp32, 16x1", 100, 10.0, 50.0, "b16"),
        Row("generation", "new fp32, 16x1", 100, 4.0, 50.0, "b16", cpu_seconds=2.0),
        Row("learner", "old fp32, full", 200, 8.0, None, "full"),
        Row("learner", "new bf16, full", 200, 2.0, None, "full"),
    ]
    table = format_table(rows)
    # 100 tokens in 2 CPU seconds: 50 tok/s, 100% of the bound by CPU time
    assert (
        "| generation | new fp32, 16x1 | 100 | 4.00 | 2.00 | 25 | 50 | 50% | 100% | 2.50x |"
        in table
    )
    assert "| learner | new bf16, full | 200 | 2.00 |  | 100 |  |  |  | 4.00x |" in table


def test_learner_and_grpo_bounds_by_hand():
    # full fine-tune: 6 N FLOPs a token -> 320 GFLOP/s / 600 MFLOP = 533.3 tok/s
    assert learner_bound(100_000_000, 320.0, None) == pytest.approx(320e9 / 6e8)
    # LoRA with 1M adapter parameters: 4 N + 6 n = 406 MFLOP a token
    assert learner_bound(100_000_000, 320.0, 1_000_000) == pytest.approx(320e9 / 4.06e8)
    # 1,600 new tokens at batch 16 (decode bound 1,600 tok/s: 1 s) + 3,200 trained tokens at
    # the LoRA bound (n = 0: 800 tok/s, 4 s) = 5 s -> 320 generated tok/s
    assert grpo_bound(100_000_000, (1600, 16, 3200), 320.0, 40.0, 4, 0) == pytest.approx(320.0)


def test_every_row_gets_a_bound_and_the_table_names_the_machine(tiny_model):
    bounds = {
        "gflops_fp32": 100.0,
        "gflops_fp32_onednn": 200.0,
        "gflops_bf16": 800.0,
        "bandwidth_gbs": 40.0,
    }
    rows = [
        Row("generation", "new fp32, 16x4", 100, 1.0, None, "b64"),
        Row("learner", "new bf16, LoRA", 200, 1.0, None, "LoRA"),
        Row("grpo step", "old fp32, LoRA 4x2", 50, 2.0, None, "gen", (50, 8, 300)),
    ]
    _with_bounds(rows, bounds, tiny_model, 1000)
    assert all(r.bound and r.pct is not None for r in rows)
    n = matmul_params(tiny_model)
    assert rows[2].bound == pytest.approx(grpo_bound(n, (50, 8, 300), 100.0, 40.0, 4, 1000))
    assert "| grpo step | old fp32, LoRA 4x2 | gen | 2.0 |  | 25 |" in format_table(rows)
    machine = {
        "cpu": "Test Xeon",
        "flags": ["avx512_bf16"],
        "cores": 2,
        "threads": 1,
        "torch": "2.x",
        "auto_precision": "bf16 (native)",
        "loadavg_start": 1.5,
        "loadavg_end": 2.0,
    }
    header = format_header(machine, bounds)
    assert "Test Xeon (avx512_bf16)" in header and "1.5 at start, 2.0 at end" in header
    assert "bf16 800.0 GFLOP/s" in header and "precision auto here: bf16" in header


def test_machine_info_and_pinned_learner_precision(monkeypatch, tiny_model, char_tokenizer):
    monkeypatch.setenv(precision.ENV_OVERRIDE, "1")  # bf16 "native": auto would pick it
    monkeypatch.setattr(precision, "BF16_MIN_PARAMS", 0)
    info = machine_info(1)
    assert info["bf16_native"] is True and info["threads"] == 1 and info["cpu"]
    pad = char_tokenizer.pad_token_id
    # the fp32 rows must stay fp32 whatever `auto` would choose; the bf16 rows are bf16
    fp32 = _learner(tiny_model, pad, 8, path=NEW32)
    assert fp32.autocast is None and not fp32.recompute_behaviour
    assert _learner(tiny_model, pad, 8).autocast is None
    bf16 = _learner(tiny_model, pad, 8, path=NEW16)
    assert bf16.autocast == torch.bfloat16 and bf16.recompute_behaviour
