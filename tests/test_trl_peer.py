"""The TRL peer: GRPOConfig settings mirror ours, and a tiny run trains and logs our format."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from replayrl.config.schema import load_config
from replayrl.run.metrics import read_metrics
from tiny import TINY_RUN

pytest.importorskip("trl")

from replayrl.bench.peers.trl_grpo import (  # noqa: E402
    ROW_COLUMN,
    _make_trainer,
    _Recorder,
    _train_rows,
    run_trl_grpo,
    trl_grpo_settings,
)


def _tiny_cfg(*extra: str):
    """tests/tiny.py's run (R = 2 x 4), 2 steps, an eval after every step."""
    return load_config(None, [*TINY_RUN, "train.steps=2", "eval.every=1", *extra])


def test_settings_mirror_the_grpo_preset() -> None:
    from trl import GRPOConfig

    cfg = load_config("grpo", ["train.steps=10"])
    kw, unmatched = trl_grpo_settings(cfg)
    R = cfg.rollouts_per_step  # 16 prompts x 8 completions
    # one optimizer step == one generation batch of R rollouts, each used once
    assert kw["per_device_train_batch_size"] * kw["gradient_accumulation_steps"] == R
    assert kw["steps_per_generation"] == kw["gradient_accumulation_steps"]
    assert kw["per_device_train_batch_size"] <= cfg.train.micro_batch_size
    assert kw["num_iterations"] == 1 and kw["num_generations"] == cfg.rollout.num_generations
    assert kw["loss_type"] == "dapo"  # token_mean: sum over all tokens / tokens in the batch
    assert kw["scale_rewards"] == "group" and kw["beta"] == 0.0
    assert kw["learning_rate"] == cfg.train.lr and kw["lr_scheduler_type"] == "constant"
    assert kw["epsilon"] == kw["epsilon_high"] == cfg.algorithm.epsilon
    assert kw["temperature"] == cfg.rollout.temperature and kw["top_k"] == 0
    assert kw["max_completion_length"] == cfg.rollout.max_new_tokens
    assert kw["shuffle_dataset"] is False and kw["use_vllm"] is False
    args = GRPOConfig(output_dir="unused", **kw)
    assert args.generation_batch_size == R and args.steps_per_generation == R // 64
    assert unmatched and all(isinstance(u, str) for u in unmatched)

    seq = load_config(None, ["algorithm.loss_agg=seq_mean", "algorithm.scale_rewards=false"])
    kw, _ = trl_grpo_settings(seq)
    assert kw["loss_type"] == "grpo" and kw["scale_rewards"] == "none"


def test_rejects_what_trl_grpo_cannot_run() -> None:
    replay = load_config("replay")
    with pytest.raises(ValueError, match="method.name=replay"):
        trl_grpo_settings(replay)
    with pytest.raises(ValueError, match="train.epochs=2"):
        trl_grpo_settings(load_config(None, ["train.epochs=2"]))


def test_missing_trl_names_the_extra(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setitem(sys.modules, "trl", None)  # `import trl` now raises ImportError
    with pytest.raises(ImportError, match=r"replayrl\[bench\]"):
        run_trl_grpo(_tiny_cfg(), tmp_path)


def test_tiny_run_trains_and_logs_our_format(tmp_path: Path) -> None:
    # digits_format next to correctness: the 5-step warm start is never right, so without it
    # every group's rewards are equal, advantages are 0 and nothing would move
    cfg = _tiny_cfg("rewards=[{name: correctness}, {name: digits_format, weight: 0.5}]")
    run_dir = tmp_path / "trl"
    summary = run_trl_grpo(cfg, run_dir, log=lambda _: None)

    on_disk = json.loads((run_dir / "summary.json").read_text())
    assert on_disk["rollouts_generated"] == summary["rollouts_generated"] == 2 * 2 * 4
    assert on_disk["peer"] == "trl" and on_disk["trl_version"]
    assert on_disk["steps"] == 2 and on_disk["num_eval_prompts"] == 8
    assert isinstance(on_disk["unmatched_settings"], list)
    for key in ("initial_eval_accuracy", "final_eval_accuracy", "best_eval_accuracy"):
        assert 0.0 <= on_disk[key] <= 1.0
    assert on_disk["tokens_generated"] >= 16 and on_disk["wall_seconds"] > 0

    evals = on_disk["evals"]
    assert [e["step"] for e in evals] == [0, 1, 2]
    assert [e["rollouts_generated"] for e in evals] == [0, 8, 16]
    assert all(0.0 <= e["eval/accuracy"] <= 1.0 for e in evals)
    walls = [e["wall_seconds"] for e in evals]
    assert walls[0] == 0.0 and walls == sorted(walls)

    records = read_metrics(run_dir / "metrics.jsonl")
    assert [r["step"] for r in records] == [0, 1, 2]  # the initial eval, then one per step
    for r in records[1:]:
        for key in ("reward/mean", "rollouts_generated", "wall_seconds", "train/entropy"):
            assert r[key] is not None, key
        assert "eval/accuracy" in r  # eval.every=1
    assert records[2]["rollouts_generated"] == 16

    # TRL took real optimizer steps on non-zero gradients
    assert any(r["train/grad_norm"] > 0 for r in records[1:])
    assert summary["param_update_norm"] > 0
    assert not (run_dir / "trl").exists()  # no checkpoints written


@pytest.mark.filterwarnings("ignore:.*is_gradient_checkpointing:FutureWarning")
@pytest.mark.parametrize("loss_agg", ["token_mean", "seq_mean"])
def test_trl_gradient_equals_our_learners(tmp_path: Path, loss_agg: str) -> None:
    """On TRL's own generation batch, over 4 micro-batches, TRL's policy gradient (dapo /
    grpo loss) equals our Learner's (token_mean / seq_mean) with the same advantages."""
    import copy

    import numpy as np
    import torch
    from transformers import TrainerCallback

    from replayrl.data.rollout_record import Rollout
    from replayrl.learner.learner import Learner, collate, token_logprobs
    from replayrl.rollout.tasks import make_task
    from replayrl.run.metrics import MetricsLogger
    from replayrl.run.policy import load_policy

    cfg = _tiny_cfg(
        "rewards=[{name: correctness}, {name: digits_format, weight: 0.5}]",
        "train.steps=1",
        "rollout.prompts_per_step=4",
        "rollout.max_new_tokens=6",  # completions of several lengths
        "train.micro_batch_size=4",  # R = 16 -> 4 micro-batches
        "train.max_grad_norm=null",
        "eval.num_prompts=2",
        f"algorithm.loss_agg={loss_agg}",
    )
    model, tok, _ = load_policy(cfg.model, cfg.task, log=lambda _: None)
    ours = copy.deepcopy(model)
    task = make_task("arithmetic")
    metrics = MetricsLogger(tmp_path, tensorboard=False)
    recorder = _Recorder(cfg, task, task.eval_rows()[:2], tok, metrics, 1, lambda _: None)
    seen: dict = {}

    class GrabGrads(TrainerCallback):
        def on_pre_optimizer_step(self, args, state, control, model=None, **kwargs):
            seen["grads"] = {n: p.grad.clone() for n, p in model.named_parameters()}

    trainer = _make_trainer(
        cfg, model, tok, _train_rows(cfg, task), recorder, tmp_path / "trl", (GrabGrads(),)
    )
    assert trainer.args.gradient_accumulation_steps == 4
    generate = trainer._generate_and_score_completions

    def keep_batch(inputs):
        seen["batch"] = out = generate(inputs)
        return out

    trainer._generate_and_score_completions = keep_batch
    trainer.train()
    metrics.close()
    micro_tokens = [int(m["completion_mask"].sum()) for m in trainer._buffered_inputs]
    assert len(set(micro_tokens)) > 1, micro_tokens  # else bnpo and dapo would agree too

    b = seen["batch"]
    rollouts = []
    for i in range(b["prompt_ids"].size(0)):
        prompt = b["prompt_ids"][i][b["prompt_mask"][i].bool()]
        completion = b["completion_ids"][i][b["completion_mask"][i].bool()]
        adv, old = float(b["advantages"][i]), torch.zeros(completion.numel())
        rollouts.append(Rollout(prompt, completion, old, 0.0, adv, False, i // 4, 0, 0))
    with torch.no_grad():  # behaviour = current policy: ratio 1, as in TRL's single pass
        for r in rollouts:
            one = collate([r], tok.pad_token_id)
            r.behaviour_logprobs = token_logprobs(ours, one, 1.0)[0][0][one.mask[0].bool()]
    learner = Learner(ours, tok.pad_token_id, cfg)
    learner.optimizer.step = lambda *a, **k: None  # keep the gradient, skip the update
    learner.train_step(rollouts, np.random.default_rng(0))
    ref = torch.cat([g.flatten() for g in seen["grads"].values()])
    got = torch.cat([p.grad.flatten() for _, p in ours.named_parameters()])
    assert ref.norm() > 0  # the batch carries signal (rewards differ within a group)
    assert torch.allclose(got, ref, rtol=1e-4, atol=1e-6), float((got - ref).norm() / ref.norm())


TEMPLATE = (
    "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<assistant>{% endif %}"
)


@pytest.mark.parametrize("template", [True, False])
@pytest.mark.parametrize("system_prompt", [None, "Be brief."])
def test_trl_gets_the_prompt_text_our_runner_generates_from(
    char_tokenizer, template: bool, system_prompt: str | None
) -> None:
    """What TRL makes of each training prompt (chat template over messages with the
    generation prompt; plain text as is) is exactly our renderer's text, for plain and
    conversational rows, with and without a system prompt and a template."""
    import copy

    from replayrl.bench.peers.trl_grpo import trl_prompts
    from replayrl.rollout.prompts import PromptRenderer

    tok = copy.deepcopy(char_tokenizer)
    tok.chat_template = TEMPLATE if template else None
    render = PromptRenderer(tok, True, system_prompt)
    rows = [
        {"prompt": "12+5=", "answer": "17"},
        {"prompt": [{"role": "user", "content": "3+4="}], "answer": "7"},
        {"prompt": [{"role": "system", "content": "own"}, {"role": "user", "content": "1+1="}]},
    ]
    for i, (row, sent) in enumerate(zip(rows, trl_prompts(rows, render), strict=True)):
        assert {k: v for k, v in sent.items() if k not in ("prompt", ROW_COLUMN)} == {
            k: v for k, v in row.items() if k != "prompt"
        }
        assert sent[ROW_COLUMN] == i
        if isinstance(sent["prompt"], str):  # TRL passes plain text through
            assert not template
            trl_text = sent["prompt"]
        else:  # TRL applies the template to messages, adding the generation prompt
            assert template
            trl_text = tok.apply_chat_template(
                sent["prompt"], tokenize=False, add_generation_prompt=True
            )
        assert trl_text == render(row["prompt"])
    assert rows[0]["prompt"] == "12+5="  # the caller's rows are left as they were


def test_recorder_evaluates_conversational_prompts_through_the_template(
    tmp_path: Path, tiny_model, char_tokenizer
) -> None:
    """Evaluation of a task whose prompts are messages (reasoning-gym's) renders them as
    our runner does (it crashed in the tokenizer before)."""
    import copy

    from replayrl.rollout.tasks import make_task
    from replayrl.run.metrics import MetricsLogger

    tok = copy.deepcopy(char_tokenizer)
    tok.chat_template = TEMPLATE
    cfg = _tiny_cfg("eval.num_prompts=3", "task.system_prompt=Add.")
    task = make_task("arithmetic")
    rows = [{**r, "prompt": [{"role": "user", "content": r["prompt"]}]} for r in task.eval_rows()]
    metrics = MetricsLogger(tmp_path, tensorboard=False)
    recorder = _Recorder(cfg, task, rows[:3], tok, metrics, 1, lambda _: None)
    res = recorder.evaluate(tiny_model)
    metrics.close()
    assert 0.0 <= res["eval/accuracy"] <= 1.0
    assert recorder.evals[-1]["eval/accuracy"] == res["eval/accuracy"]


@pytest.mark.parametrize("conversational", [False, True])
def test_rewards_get_the_rows_prompt_and_completion_as_our_runner_gives_them(
    tmp_path: Path, char_tokenizer, conversational: bool
) -> None:
    """TRL sees rewritten prompts (messages with the system prompt, or rendered text) and
    may hand completions over as messages; the reward functions must still receive the row's
    own prompt and the completion as our runner gives it (text, or one assistant message
    for a conversational prompt), and train accuracy must score the completion text."""
    import copy

    from replayrl.bench.peers.trl_grpo import trl_prompts
    from replayrl.rollout.rewards import WeightedReward
    from replayrl.rollout.tasks import make_task
    from replayrl.run.metrics import MetricsLogger

    tok = copy.deepcopy(char_tokenizer)
    tok.chat_template = TEMPLATE
    cfg = _tiny_cfg("task.system_prompt=Add.")
    task = make_task("arithmetic")
    rows = task.eval_rows()[:2]
    if conversational:
        rows = [{**r, "prompt": [{"role": "user", "content": r["prompt"]}]} for r in rows]
    metrics = MetricsLogger(tmp_path, tensorboard=False)
    recorder = _Recorder(cfg, task, rows, tok, metrics, 1, lambda _: None)
    seen: dict = {}

    def spy(prompts, completions, **kw):
        seen["prompts"], seen["completions"], seen["answer"] = prompts, completions, kw["answer"]
        return [1.0] * len(completions)

    recorder.rewards = [WeightedReward(name="spy", fn=spy, weight=1.0)]
    recorder.train_rows = rows
    sent = trl_prompts(rows, recorder.render)
    texts = [rows[0]["answer"], "9"]  # the first completion is right, the second wrong
    # TRL's side: its prompts, completions as assistant messages (its prompts are messages)
    trl_completions = [[{"role": "assistant", "content": t}] for t in texts]
    columns = [k for k in sent[0] if k != "prompt"]
    kw = {c: [s[c] for s in sent] for c in columns}
    logged: dict = {}
    fn = recorder.reward_function(columns)
    fn(
        [s["prompt"] for s in sent],
        trl_completions,
        log_metric=lambda k, v: logged.__setitem__(k, v),
        **kw,
    )
    metrics.close()
    assert seen["prompts"] == [r["prompt"] for r in rows]
    expect = [[{"role": "assistant", "content": t}] for t in texts] if conversational else texts
    assert seen["completions"] == expect
    assert seen["answer"] == [r["answer"] for r in rows]
    right = [task.is_correct(t, r) for t, r in zip(texts, rows, strict=True)]
    assert logged["train/accuracy"] == sum(right) / 2 and right[0]
