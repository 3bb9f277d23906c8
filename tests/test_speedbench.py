"""bench speed's pure parts: the bounds arithmetic, the parameter count and the table."""

from __future__ import annotations

import pytest

from replayrl.bench.speed import Row, decode_bound, format_table, matmul_params


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
        Row("generation", "new fp32, 16x1", 100, 4.0, 50.0, "b16"),
        Row("learner", "old fp32, full", 200, 8.0, None, "full"),
        Row("learner", "new bf16, full", 200, 2.0, None, "full"),
    ]
    table = format_table(rows)
    assert "| generation | new fp32, 16x1 | 100 | 4.00 | 25 | 50 | 50% | 2.50x |" in table
    assert "| learner | new bf16, full | 200 | 2.00 | 100 |  |  | 4.00x |" in table
