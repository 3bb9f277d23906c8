"""`replayrl bench memory`: the CLI runs a measurement in a fresh process and writes its
figures; the formula's head term does not grow with the vocabulary times the rows."""

from __future__ import annotations

import json

from replayrl.bench import memory
from replayrl.cli.main import main as cli_main


def test_formula_head_term_is_flat_across_rows():
    spec = {"model": "qwen2.5-0.5b", "kind": "full", "layers": 2, "tokens": 1024}
    heads = [memory.formula({**spec, "rows": r})["head"] for r in (1, 8, 32)]
    vocab, hidden = 151936, 896
    # rows x tokens x vocab would add ~19 GB from 1 to 32 rows; only states x hidden grow
    assert heads[2] - heads[0] < 32 * 1024 * hidden * 4 * 3 + 1
    assert heads[0] > 2 * vocab * hidden * 4  # the weight-gradient temporaries
    full = memory.formula({**spec, "rows": 1})
    lora = memory.formula({**spec, "kind": "lora", "rows": 1})
    assert lora["optimizer"] < full["optimizer"] / 50  # adapters only


def test_bench_memory_cli_measures_in_a_subprocess(tmp_path):
    out = tmp_path / "mem.json"
    argv = ["bench", "memory", "--kinds", "head", "--tokens", "8", "--rows", "1"]
    assert cli_main([*argv, "--device", "cpu", "--json", str(out)]) == 0
    (r,) = json.loads(out.read_text())
    assert r["kind"] == "head" and r["rows"] == 1 and r["counter"] == "VmHWM - VmRSS"
    # the head's weight gradient alone (vocab x hidden fp32) is ~108 MiB
    assert r["peak_step"] > 49152 * 576 * 4 * 0.9
    assert set(r["formula"]) == {"weights", "grads", "optimizer", "activations", "head"}


def test_bench_memory_is_a_bench_subcommand():
    from replayrl.cli import main as cli

    argv = ["bench", "memory", "--model", "qwen2.5-0.5b", "--rows", "1", "8", "--checkpointing"]
    args = cli.build_parser().parse_args(cli.legacy_bench_form(argv))
    assert args.func is cli._cmd_bench_memory
    assert (args.model, args.rows, args.checkpointing) == ("qwen2.5-0.5b", [1, 8], True)


def test_lm_head_kind_measures_the_head_function_on_given_states(tmp_path):
    out = tmp_path / "mem.json"
    argv = ["bench", "memory", "--kinds", "lm-head", "--tokens", "8", "--rows", "1", "2"]
    assert cli_main([*argv, "--device", "cpu", "--json", str(out)]) == 0
    one, two = json.loads(out.read_text())
    assert (one["kind"], one["rows"], two["rows"]) == ("lm-head", 1, 2)
    # the weight gradient (vocab x hidden fp32, ~108 MiB) is the head's own, every row count
    assert one["peak_step"] > 49152 * 576 * 4 * 0.9
    assert set(one["formula"]) == {"weight_grad", "chunk", "states_grad"}
    # the formula's only row-dependent term is the states' gradient
    f1, f2 = memory.formula(one), memory.formula(two)
    assert f1["weight_grad"] == f2["weight_grad"]
    assert f2["states_grad"] == 2 * f1["states_grad"] == 2 * 7 * 576 * 4
