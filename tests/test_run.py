"""End-to-end runs of the synchronous loop on the tiny model: outputs, faults, resume, limits."""

from __future__ import annotations

import json
import math
import os
import signal
from pathlib import Path

import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from replayrl.config.schema import Config, ConfigError, load_config
from replayrl.errors import RunFailed
from replayrl.learner.learner import Learner
from replayrl.models.loading import build_tiny_model
from replayrl.rollout import rewards as rewards_module
from replayrl.rollout.producer import MAX_EMPTY_STEPS
from replayrl.rollout.tasks import ArithmeticTask
from replayrl.run.metrics import read_metrics
from replayrl.run.session import Session
from replayrl.run.start import resume, train
from replayrl.run.warmstart import ensure_warmstart
from replayrl.storage.checkpoint import latest_checkpoint, load_state
from tiny import TINY_MODEL

R = 16  # rollouts per step: 4 prompts x 4 generations
BASE = [
    *TINY_MODEL,
    "model.warmstart.batch_size=8",
    "rollout.prompts_per_step=4",
    "rollout.num_generations=4",
    "rollout.max_new_tokens=6",
    "eval.num_prompts=20",
    # the 5-step warm start is rarely right: the format reward gives GRPO a non-zero signal
    "rewards=[{name: correctness}, {name: digits_format, weight: 0.5}]",
    "train.lr=1e-2",
    "logging.tensorboard=false",
    "logging.progress=false",
]
STEP_KEYS = {
    "reward/mean",
    "reward/correctness",
    "reward/digits_format",
    "train/accuracy",
    "train/loss",
    "train/entropy",
    "train/grad_norm",
    "train/clip_frac",
    "completion_length",
    "truncated_frac",
    "rollouts_generated",
    "tokens_generated",
    "tokens_trained",
    "policy_version",
    "time/generation_s",
    "time/training_s",
    "wall_seconds",
    "buffer/size",
    "prompts_skipped_too_long",
}


def make_cfg(run_dir: Path, name: str, *extra: str) -> Config:
    return load_config(None, [*BASE, f"logging.run_dir={run_dir}", f"logging.name={name}", *extra])


def quiet(_: str) -> None:
    pass


def warm_cache(cfg: Config) -> None:
    """Build the warm start before runs whose trajectories are compared, so that those tests
    do not depend on test_cold_and_warm_cache_runs_are_identical holding."""
    ensure_warmstart(cfg.model, cfg.task, log=quiet)


def step_records(run_dir: Path) -> dict[int, dict]:
    """metrics.jsonl training records by step (eval-only records have no reward/mean)."""
    records = [m for m in read_metrics(run_dir / "metrics.jsonl") if "reward/mean" in m]
    steps = [m["step"] for m in records]
    assert len(steps) == len(set(steps)), f"duplicate step records: {steps}"
    return {m["step"]: m for m in records}


def state_dict_of(path: Path) -> dict[str, torch.Tensor]:
    return AutoModelForCausalLM.from_pretrained(path).state_dict()


# -- (a) a short run ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def short_run(tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("runs")
    cfg = make_cfg(
        root,
        "short",
        "train.steps=3",
        "eval.every=2",
        "checkpoint.every=1",
        "checkpoint.keep_last=2",
    )
    summary = train(cfg, log=quiet)
    return cfg, summary, root / "short"


def test_short_run_metrics_per_step(short_run):
    _, _, run_dir = short_run
    records = step_records(run_dir)
    assert sorted(records) == [1, 2, 3]
    prev_tokens = 0.0
    for step, m in records.items():
        assert STEP_KEYS <= set(m), STEP_KEYS - set(m)
        assert m["rollouts_generated"] == R * step  # R more every step
        assert m["policy_version"] == step
        assert m["tokens_generated"] > prev_tokens
        assert R <= m["tokens_generated"] - prev_tokens <= R * 6  # 1..max_new_tokens each
        prev_tokens = m["tokens_generated"]
        assert m["time/generation_s"] > 0
        assert m["time/training_s"] > 0
        assert m["train/entropy"] > 0
        assert math.isfinite(m["train/loss"])
        assert 0 <= m["reward/mean"] <= 1.5
        assert m["buffer/size"] == 0  # on-policy: everything generated was consumed
    assert records[1]["wall_seconds"] < records[3]["wall_seconds"]
    # evaluation records at the start and at the end
    all_records = read_metrics(run_dir / "metrics.jsonl")
    assert all_records[0]["step"] == 0
    assert "eval/accuracy" in all_records[0]
    assert "eval/accuracy" in records[2]  # eval.every=2
    assert "eval/accuracy" not in records[1]
    assert "eval/accuracy" in records[3]  # and always at the end


def test_short_run_summary(short_run):
    _, summary, run_dir = short_run
    on_disk = json.loads((run_dir / "summary.json").read_text())
    assert on_disk == json.loads(json.dumps(summary, default=str))
    accs = [e["eval/accuracy"] for e in summary["evals"]]
    assert [e["step"] for e in summary["evals"]] == [0, 2, 3]
    assert [e["rollouts_generated"] for e in summary["evals"]] == [0, 2 * R, 3 * R]
    assert summary["initial_eval_accuracy"] == accs[0]
    assert summary["final_eval_accuracy"] == accs[-1]
    assert summary["best_eval_accuracy"] == max(accs)
    assert all(0 <= a <= 1 for a in accs)
    assert summary["steps"] == 3
    assert summary["policy_version"] == 3
    assert summary["rollouts_generated"] == 3 * R
    last = step_records(run_dir)[3]
    assert summary["tokens_generated"] == last["tokens_generated"]
    assert 3 * R <= summary["tokens_generated"] <= 3 * R * 6
    # on-policy, one epoch, nothing dropped: every generated token is trained on once
    assert summary["tokens_trained"] == summary["tokens_generated"]
    assert summary["wall_seconds"] > 0
    assert summary["generation_seconds"] > 0
    assert summary["rollouts_dropped_reward_error"] == 0
    assert summary["first_reward_error"] is None
    assert summary["prompts_skipped_too_long"] == 0
    assert summary["num_eval_prompts"] == 20


def test_short_run_writes_its_config(short_run):
    cfg, _, run_dir = short_run
    assert load_config(run_dir / "config.yaml") == cfg


def test_short_run_checkpoint_is_a_loadable_hf_folder(short_run):
    _, summary, run_dir = short_run
    ckpt = latest_checkpoint(run_dir)
    assert ckpt is not None
    assert ckpt.name == "step_000003"
    # checkpoint.every=1 wrote steps 1, 2 and 3; keep_last=2 kept the newest two
    kept = sorted(p.name for p in (run_dir / "checkpoints").iterdir() if p.is_dir())
    assert kept == ["step_000002", "step_000003"]
    assert (run_dir / "checkpoints" / "latest").read_text().strip() == "step_000003"
    model = AutoModelForCausalLM.from_pretrained(ckpt / "policy")
    tok = AutoTokenizer.from_pretrained(ckpt / "policy")
    assert sum(p.numel() for p in model.parameters()) == summary["num_parameters"]
    ids = tok("12+34=", add_special_tokens=False, return_tensors="pt")["input_ids"]
    assert model(input_ids=ids).logits.shape == (1, 6, len(tok))
    # training moved the weights away from the warm start
    start = state_dict_of(Path(summary["model_path"]))
    trained = model.state_dict()
    assert any(not torch.equal(start[k], trained[k]) for k in start)
    state = load_state(ckpt)
    assert state["step"] == 3
    assert state["counters"]["rollouts_generated"] == 3 * R
    assert state["learner"]["version"] == 3


# -- (b) a faulty reward function -----------------------------------------------------------


def test_reward_errors_are_counted_not_fatal(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    def flaky(prompts, completions, **_):
        if any(len(c) % 2 for c in completions):
            raise RuntimeError("flaky reward cannot score odd-length completions")
        return [1.0] * len(completions)

    rewards_module.REWARDS.add("faulty", flaky)
    try:
        cfg = make_cfg(
            tmp_path, "faulty", "train.steps=3", "rewards=[{name: correctness}, {name: faulty}]"
        )
        logs: list[str] = []
        summary = train(cfg, log=logs.append)
    finally:
        rewards_module.REWARDS.remove("faulty")
    assert summary["steps"] == 3
    dropped = summary["rollouts_dropped_reward_error"]
    assert 0 < dropped < 3 * R
    assert summary["rollouts_generated"] == 3 * R  # dropped rollouts were still generated
    assert "'faulty'" in summary["first_reward_error"]
    assert "odd-length" in summary["first_reward_error"]
    assert any("faulty" in line and "dropped" in line for line in logs)
    # dropped rollouts are not trained on
    assert summary["tokens_trained"] < summary["tokens_generated"]
    records = step_records(tmp_path / "faulty")
    assert records[3]["rollouts/dropped_reward_error"] == dropped
    counts = [records[s]["rollouts/dropped_reward_error"] for s in (1, 2, 3)]
    assert counts == sorted(counts)  # cumulative
    # the per-function mean only averages the items the function could score
    assert all(records[s]["reward/faulty"] == 1.0 for s in (1, 2, 3))


def test_unknown_reward_name_fails_before_training(tmp_path: Path):
    with pytest.raises(ValueError, match="'nosuch'"):  # now when the config is read
        train(make_cfg(tmp_path, "unknown", "rewards=[{name: nosuch}]"), log=quiet)


# -- (c) resume -----------------------------------------------------------------------------

# mini-batches and 2 epochs make the learner draw from its shuffle RNG, which must be restored
RESUME = ["train.mini_batch_size=8", "train.epochs=2", "eval.every=0", "eval.num_prompts=8"]


@pytest.fixture(scope="module")
def resumed_runs(tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("resume")
    warm_cache(make_cfg(root, "A"))
    straight = train(make_cfg(root, "A", *RESUME, "train.steps=4"), log=quiet)
    first = train(make_cfg(root, "B", *RESUME, "train.steps=2"), log=quiet)
    logs: list[str] = []
    resumed = resume(root / "B", ["train.steps=4"], log=logs.append)
    return root, straight, first, resumed, logs


def test_resume_reaches_the_target_step(resumed_runs):
    root, straight, first, resumed, logs = resumed_runs
    assert (first["steps"], first["policy_version"]) == (2, 2)
    assert (resumed["steps"], resumed["policy_version"]) == (4, 4)
    assert any("resumed from" in line and "step 2" in line for line in logs)
    assert load_config(root / "B" / "config.yaml").train.steps == 4
    # cumulative counters carry over the restart
    for key in ("rollouts_generated", "tokens_generated", "tokens_trained"):
        assert resumed[key] == straight[key], key
    assert resumed["rollouts_generated"] == 4 * R
    assert sorted(step_records(root / "B")) == [1, 2, 3, 4]


def test_resume_restores_optimizer_state(resumed_runs):
    root = resumed_runs[0]
    state_a = load_state(latest_checkpoint(root / "A"))
    state_b = load_state(latest_checkpoint(root / "B"))
    assert state_a["step"] == state_b["step"] == 4
    assert state_a["learner"]["version"] == state_b["learner"]["version"] == 4
    # 4 steps x 2 epochs x (16 rollouts / mini-batches of 8) = 16 Adam steps
    assert state_a["learner"]["updates"] == state_b["learner"]["updates"] == 16
    opt_a = state_a["learner"]["optimizer"]["state"]
    opt_b = state_b["learner"]["optimizer"]["state"]
    assert opt_a.keys() == opt_b.keys()
    assert len(opt_a) > 0
    for k in opt_a:
        assert int(opt_a[k]["step"]) == int(opt_b[k]["step"]) == 16
        assert torch.equal(opt_a[k]["exp_avg"], opt_b[k]["exp_avg"]), k
        assert torch.equal(opt_a[k]["exp_avg_sq"], opt_b[k]["exp_avg_sq"]), k
    assert any(bool(opt_a[k]["exp_avg"].abs().sum() > 0) for k in opt_a)  # not trivially 0
    # and so the final policies are the same weights
    wa = state_dict_of(latest_checkpoint(root / "A") / "policy")
    wb = state_dict_of(latest_checkpoint(root / "B") / "policy")
    assert all(torch.equal(wa[k], wb[k]) for k in wa)


def test_resume_continues_the_same_trajectory(resumed_runs):
    root = resumed_runs[0]
    a, b = step_records(root / "A"), step_records(root / "B")
    keys = ("reward/mean", "train/loss", "train/grad_norm", "train/entropy", "tokens_generated")
    for step in (1, 2, 3, 4):
        for key in keys:
            assert a[step][key] == b[step][key], (step, key)
    assert a[3]["train/loss"] != a[4]["train/loss"]  # the compared values are not constants
    assert any(a[s]["train/grad_norm"] > 0 for s in (3, 4))


def test_interrupted_run_resumes_like_an_uninterrupted_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    extra = ["eval.every=0", "eval.num_prompts=8"]
    warm_cache(make_cfg(tmp_path, "straight"))
    straight = train(make_cfg(tmp_path, "straight", *extra, "train.steps=3"), log=quiet)
    original = Learner.train_step
    calls = []

    def interrupted(self, batch, *args, **kwargs):
        calls.append(len(batch))
        if len(calls) == 2:  # a real Ctrl-C while the learner works on step 2
            os.kill(os.getpid(), signal.SIGINT)
        return original(self, batch, *args, **kwargs)

    monkeypatch.setattr(Learner, "train_step", interrupted)
    logs: list[str] = []
    with pytest.raises(KeyboardInterrupt):
        train(make_cfg(tmp_path, "int", *extra, "train.steps=3"), log=logs.append)
    assert any("interrupted" in line and "--resume" in line for line in logs)
    assert latest_checkpoint(tmp_path / "int") is not None
    monkeypatch.setattr(Learner, "train_step", original)
    summary = resume(tmp_path / "int", log=quiet)
    assert summary["steps"] == 3
    assert summary["rollouts_generated"] == 3 * R == straight["rollouts_generated"]
    assert summary["tokens_generated"] == straight["tokens_generated"]
    a, b = step_records(tmp_path / "straight"), step_records(tmp_path / "int")
    for step in (2, 3):
        assert a[step]["reward/mean"] == b[step]["reward/mean"]
        assert a[step]["train/loss"] == b[step]["train/loss"]


def test_cold_and_warm_cache_runs_are_identical(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("REPLAYRL_CACHE", str(tmp_path / "fresh_cache"))
    extra = ["train.steps=2", "eval.every=0", "eval.num_prompts=8"]
    cold = train(make_cfg(tmp_path, "cold", *extra), log=quiet)  # builds the warm start
    warm = train(make_cfg(tmp_path, "warm", *extra), log=quiet)  # finds it cached
    assert cold["model_path"] == warm["model_path"]
    a, b = step_records(tmp_path / "cold"), step_records(tmp_path / "warm")
    for step in (1, 2):
        for key in ("tokens_generated", "reward/mean", "train/loss"):
            assert a[step][key] == b[step][key], (step, key)


def test_resume_after_a_crash_logs_each_step_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    original = Session.checkpoint

    def crash_at_step_3(self):
        if self.counters.step == 3:
            raise RuntimeError("simulated crash")
        return original(self)

    monkeypatch.setattr(Session, "checkpoint", crash_at_step_3)
    cfg = make_cfg(tmp_path, "crash", "train.steps=3", "checkpoint.every=2", "eval.num_prompts=8")
    with pytest.raises(RuntimeError, match="simulated crash"):
        train(cfg, log=quiet)  # step 3 was logged, its checkpoint never written
    assert latest_checkpoint(tmp_path / "crash").name == "step_000002"
    monkeypatch.setattr(Session, "checkpoint", original)
    assert resume(tmp_path / "crash", log=quiet)["steps"] == 3
    assert sorted(step_records(tmp_path / "crash")) == [1, 2, 3]  # no step logged twice


# -- (d) run folder handling ----------------------------------------------------------------


def test_existing_run_folder_needs_resume_or_overwrite(tmp_path: Path):
    run_dir = tmp_path / "taken"
    run_dir.mkdir()
    (run_dir / "notes.txt").write_text("previous run")
    (run_dir / "config.yaml").write_text("train: {}\nlogging: {}\n")  # overwrite: runs only
    with pytest.raises(ConfigError, match="--resume") as info:
        train(make_cfg(tmp_path, "taken", "train.steps=0"), log=quiet)
    assert str(run_dir) in str(info.value)
    assert "logging.overwrite" in str(info.value)
    assert (run_dir / "notes.txt").exists()  # nothing was touched
    # with overwrite the folder is replaced
    summary = train(
        make_cfg(tmp_path, "taken", "train.steps=0", "logging.overwrite=true"), log=quiet
    )
    assert summary["steps"] == 0
    assert not (run_dir / "notes.txt").exists()
    assert (run_dir / "summary.json").is_file()


def test_empty_existing_run_folder_is_fine(tmp_path: Path):
    (tmp_path / "empty").mkdir()
    summary = train(make_cfg(tmp_path, "empty", "train.steps=0"), log=quiet)
    assert summary["steps"] == 0
    assert summary["initial_eval_accuracy"] == summary["final_eval_accuracy"]


def test_failed_start_does_not_block_the_corrected_rerun(tmp_path: Path):
    with pytest.raises(FileNotFoundError, match="model.path"):
        train(make_cfg(tmp_path, "typo", f"model.path={tmp_path / 'no_such_model'}"), log=quiet)
    summary = train(make_cfg(tmp_path, "typo", "train.steps=0"), log=quiet)
    assert summary["steps"] == 0


def test_resume_without_checkpoint(tmp_path: Path):
    run_dir = tmp_path / "nockpt"
    run_dir.mkdir()
    (run_dir / "config.yaml").write_text("train: {steps: 1}\n")
    with pytest.raises(FileNotFoundError, match="no complete checkpoint"):
        resume(run_dir, log=quiet)


# -- (e) prompts longer than the model's context --------------------------------------------

MAX_POS = 10  # positions of the short-context model


@pytest.fixture(scope="module")
def short_context_model(tmp_path_factory, char_tokenizer, tiny_model_config) -> Path:
    folder = tmp_path_factory.mktemp("short_ctx") / "model"
    model = build_tiny_model(tiny_model_config, vocab_size=len(char_tokenizer), seed=0)
    model.config.max_position_embeddings = MAX_POS
    model.save_pretrained(folder)
    char_tokenizer.save_pretrained(folder)
    return folder


def _short_ctx_cfg(tmp_path: Path, folder: Path, name: str, *extra: str) -> Config:
    return make_cfg(
        tmp_path,
        name,
        f"model.path={folder}",
        "rollout.prompts_per_step=8",
        "rollout.num_generations=2",
        "rollout.max_new_tokens=5",
        "eval.num_prompts=4",
        "train.seed=0",
        *extra,
    )


def test_fits_counts_prompt_tokens_plus_new_tokens(tmp_path: Path, short_context_model: Path):
    cfg = _short_ctx_cfg(tmp_path, short_context_model, "fits")
    (tmp_path / "fits").mkdir()
    trainer = Session(cfg, tmp_path / "fits", log=quiet)
    try:
        assert trainer.max_positions == MAX_POS
        assert trainer.producer.fits("1+2=")  # 4 + 5 = 9 <= 10
        assert trainer.producer.fits("1+23=")  # 5 + 5 = 10 <= 10: exactly fills the context
        assert not trainer.producer.fits("12+34=")  # 6 + 5 = 11 > 10
    finally:
        trainer.metrics.close()


def test_too_long_prompts_are_skipped_and_counted(tmp_path: Path, short_context_model: Path):
    cfg = _short_ctx_cfg(tmp_path, short_context_model, "skip", "train.steps=3")
    # replay the prompt stream (the trainer's prompt RNG is seeded with train.seed): a prompt
    # fits when its characters + max_new_tokens <= 10, i.e. unless both operands have 2 digits
    task = ArithmeticTask(digits=2, eval_size=200, seed=0)
    rng = np.random.default_rng(0)
    kept_per_step = [
        sum(len(r["prompt"]) + 5 <= MAX_POS for r in task.sample_train(8, rng)) for _ in range(3)
    ]
    assert all(kept_per_step)  # (precondition: no step where every prompt is too long)
    expected_skipped = 3 * 8 - sum(kept_per_step)
    assert expected_skipped > 0
    summary = train(cfg, log=quiet)
    assert summary["steps"] == 3
    assert summary["prompts_skipped_too_long"] == expected_skipped
    assert summary["rollouts_generated"] == 2 * sum(kept_per_step)
    records = step_records(tmp_path / "skip")
    assert records[3]["prompts_skipped_too_long"] == expected_skipped
    assert records[1]["rollouts_generated"] == 2 * kept_per_step[0]


def test_a_step_whose_prompts_are_all_too_long_is_skipped(
    tmp_path: Path, short_context_model: Path
):
    # max_new_tokens 7: even "1+2=" needs 4 + 7 = 11 > 10 positions; 2 steps < MAX_EMPTY_STEPS
    cfg = _short_ctx_cfg(
        tmp_path, short_context_model, "skipstep", "train.steps=2", "rollout.max_new_tokens=7"
    )
    logs: list[str] = []
    # each step is skipped (no error before MAX_EMPTY_STEPS); as the whole run then trained
    # nothing, its end is an error naming why (after a checkpoint of its state)
    with pytest.raises(RunFailed, match="nothing was trained in 2 step") as info:
        train(cfg, log=logs.append)
    assert "every prompt was longer than the model's 10 positions" in str(info.value)
    assert sum("step skipped" in line for line in logs) == 2
    ckpt = latest_checkpoint(tmp_path / "skipstep")
    assert ckpt is not None and ckpt.name == "step_000002"
    counters = load_state(ckpt)["counters"]
    assert counters["rollouts_generated"] == 0 and counters["prompts_skipped_too_long"] == 2 * 8


def test_every_prompt_too_long_is_an_error(tmp_path: Path, short_context_model: Path):
    cfg = _short_ctx_cfg(
        tmp_path,
        short_context_model,
        "allskip",
        f"train.steps={MAX_EMPTY_STEPS + 1}",
        "rollout.max_new_tokens=7",
        "checkpoint.every=2",
    )
    with pytest.raises(RunFailed, match="longer than the model's 10 positions") as info:
        train(cfg, log=quiet)
    assert "last good checkpoint" in str(info.value) and "step_000004" in str(info.value)
