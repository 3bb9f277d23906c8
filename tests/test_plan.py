"""`replayrl plan`: the per-GPU memory of a run from its config (bench/plan.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from replayrl.bench.memory import SHAPES
from replayrl.bench.plan import learner_terms, model_shape, param_counts, plan
from replayrl.cli.main import main
from replayrl.config.schema import load_config

SHARDED = ["train.sharding=fsdp", "runtime=ray"]
MIB = 1 << 20


def _cfg(*overrides: str):
    return load_config("grpo", list(overrides))


def _state(terms: dict[str, int]) -> int:
    return terms["weights"] + terms["grads"] + terms["optimizer"]


def test_qwen_shapes_count_their_published_parameters() -> None:
    # Qwen2.5-1.5B: 1.54B, Qwen2.5-7B: 7.62B (model cards)
    assert param_counts(SHAPES["qwen2.5-1.5b"])["total"] / 1e9 == pytest.approx(1.54, abs=0.01)
    assert param_counts(SHAPES["qwen2.5-7b"])["total"] / 1e9 == pytest.approx(7.62, abs=0.01)


def test_fsdp_over_two_ranks_halves_weights_grads_and_optimizer() -> None:
    c = SHAPES["qwen2.5-1.5b"]
    one = learner_terms(_cfg(), c, 256)
    two = learner_terms(_cfg(*SHARDED, "workers.learners=2"), c, 256)
    assert _state(two) == pytest.approx(_state(one) / 2, rel=1e-3)
    # and the sharded rank pays for the groups it gathers, which one process never does
    assert one["gathered"] == 0 < two["gathered"]


def test_lora_trains_far_fewer_bytes_than_full_fine_tuning() -> None:
    c = SHAPES["qwen2.5-7b"]
    full = learner_terms(_cfg(), c, 256)
    lora = learner_terms(_cfg("model.lora.enabled=true"), c, 256)
    assert lora["grads"] + lora["optimizer"] < 0.01 * (full["grads"] + full["optimizer"])
    # the frozen base stays: weights + grads + AdamW fall from 16 to about 4 bytes a parameter
    assert _state(lora) < 0.3 * _state(full)


def test_reference_and_critic_are_counted_when_the_run_has_them() -> None:
    c = SHAPES["qwen2.5-1.5b"]
    assert learner_terms(_cfg("kl.beta=0.04"), c, 256)["reference"] > 0
    assert learner_terms(_cfg("kl.beta=0.04", "model.lora.enabled=true"), c, 256)["reference"] == 0
    critic = {
        n: learner_terms(load_config("ppo", [*SHARDED, f"workers.learners={n}"]), c, 256)["critic"]
        for n in (2, 4)
    }
    # sharded like the policy: 16 bytes (fp32 weights, grads, AdamW) of every parameter, split
    # over the ranks, plus its activations
    state = 16 * param_counts(c)["total"]
    assert 0.9 * state / 4 < critic[4] < critic[2] < 0.5 * state + critic[4]


@pytest.mark.parametrize("rows,tokens,measured", [(1, 256, 2290), (16, 256, 2442), (8, 1024, 2852)])
def test_head_probe_within_15_percent_of_the_measured_two_rank_peak(rows, tokens, measured) -> None:
    """BENCHMARKS.md "A memory plan": the head probe (Qwen2.5-0.5B's vocabulary, one decoder
    layer, fp32, 2 gloo ranks, rows x tokens after 64 prompt tokens) peaked at 2,290 / 2,442 /
    2,852 MiB (2,760 in a second run) on its largest rank, counted from after the model was
    built and with no optimizer step: the plan's gradient, gathered, activation and head
    terms. The long rows peak in the recomputed layer's backward (plan.py's MLP gradient
    term)."""
    c = dict(SHAPES["qwen2.5-0.5b"], num_hidden_layers=1)
    cfg = _cfg(
        *SHARDED,
        "workers.learners=2",
        "train.sharding_param_dtype=float32",
        f"train.micro_batch_size={rows}",
        f"rollout.max_new_tokens={tokens}",
    )
    t = learner_terms(cfg, c, 64)
    predicted = (t["grads"] + t["gathered"] + t["activations"] + t["head"]) / MIB
    assert measured / predicted == pytest.approx(1.0, abs=0.15)


def test_model_path_config_json_is_read(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps(SHAPES["qwen2.5-1.5b"]))
    cfg = _cfg(f"model.path={tmp_path}")
    assert model_shape(cfg) == SHAPES["qwen2.5-1.5b"]
    assert plan(cfg, None, 256, 80)["parameters"] == param_counts(SHAPES["qwen2.5-1.5b"])["total"]


def test_cli_prints_the_plan_and_exits_2_when_it_does_not_fit(capsys) -> None:
    # 7B fully fine-tuned in fp32 on one GPU: ~16 bytes per parameter, far over 80 GiB
    assert main(["plan", "--config", "grpo", "--shape", "qwen2.5-7b"]) == 2
    out = capsys.readouterr().out
    assert "does NOT fit" in out and "| learner | **total** |" in out
    args = ["plan", "--config", "grpo", "--shape", "qwen2.5-7b", *SHARDED, "workers.learners=8"]
    assert main(args) == 0
    assert "fits on 80 GiB GPUs" in capsys.readouterr().out
    assert main([*args, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["shard_ranks"] == 8
