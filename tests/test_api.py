"""The Python API (replayrl.ReplayTrainer / ReplayConfig): config resolution, objects handed
to the loop (dataset, reward callables, model), callbacks that stop a run, resume, evaluate,
save_model, the CLI giving the same metrics, and `python -c` from a folder outside the repo."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch

import replayrl
from replayrl.api.trainer import ReplayConfig, ReplayTrainer
from replayrl.cli.main import main
from replayrl.config.schema import ConfigError, load_config
from replayrl.rollout.rewards import correctness_reward
from replayrl.rollout.tasks import ArithmeticTask
from replayrl.run.callbacks import ReplayCallback
from replayrl.run.metrics import read_metrics
from tiny import TINY_RUN

SRC = Path(__file__).resolve().parents[1] / "src"
TINY = [*TINY_RUN, "train.threads=1"]


def _rows(n: int = 80, seed: int = 0) -> list[dict]:
    return ArithmeticTask().sample_train(n, np.random.default_rng(seed))


def correctness(prompts, completions, answer, **kwargs):
    """The built-in `correctness` reward under the same name, as a Python callable."""
    return correctness_reward(prompts, completions, answer)


def _comparable(records: list[dict]) -> list[dict]:
    """metrics.jsonl without timings (the only fields that differ between identical runs)."""
    return [
        {k: v for k, v in r.items() if not k.startswith("time/") and k != "wall_seconds"}
        for r in records
    ]


# -- ReplayConfig ----------------------------------------------------------------------------


def test_config_takes_presets_trl_names_section_keys_and_overrides(tmp_path: Path) -> None:
    args = ReplayConfig(
        "remix-grpo",
        output_dir=str(tmp_path / "runs" / "mine"),
        train__steps=7,  # (TRL's max_steps counts updates: ReMix's steps take 3, then 1)
        learning_rate=3e-5,
        num_generations=4,
        generation_batch_size=32,
        max_completion_length=9,
        beta=0.01,
        scale_rewards="none",
        report_to=["wandb"],
        method__remix__utd=3,
        overrides=["eval.every=2"],
    )
    cfg = args.to_config()
    assert (cfg.method.name == "remix") and cfg.method.remix.utd == 3  # preset, then section__key
    assert (cfg.train.steps, cfg.train.lr, cfg.kl.beta) == (7, 3e-5, 0.01)
    assert (cfg.rollout.num_generations, cfg.rollout.prompts_per_step) == (4, 8)
    assert cfg.rollout.max_new_tokens == 9 and cfg.algorithm.scale_rewards is False
    assert cfg.logging.wandb and not cfg.logging.tensorboard
    assert (cfg.logging.run_dir, cfg.logging.name) == (str(tmp_path / "runs"), "mine")
    assert args.output_dir == tmp_path / "runs" / "mine" and cfg.eval.every == 2
    assert args.sets("eval.every") and args.sets("train.steps") and not args.sets("train.lr2")
    # a Config object and a mapping of dotted overrides
    again = ReplayConfig(cfg, overrides={"train.steps": 3}).to_config()
    assert again.train.steps == 3 and again.method.remix.utd == 3
    # the CLI-style strings reproduce the keyword arguments
    assert load_config("remix-grpo", args.override_strings()) == cfg


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"learning_rat": 1e-5}, "unknown argument.*learning_rat .did you mean learning_rate"),
        ({"buffer__kindd": "replay"}, "buffer__kindd .did you mean buffer__kind"),
        ({"generation_batch_size": 10, "num_generations": 4}, "multiple of num_generations=4"),
        ({"generation_batch_size": 12}, "multiple of num_generations=8"),  # the preset's G
        ({"per_device_train_batch_size": 6, "generation_batch_size": 16}, "multiple of per_dev"),
        ({"scale_rewards": "batch"}, "scale_rewards"),
        ({"report_to": "mlflow"}, "report_to"),
        ({"learning_rate": -1.0}, "train.lr"),
        ({"buffer__kind": "lifo"}, "buffer.kind"),
        ({"top_k": 50, "rollout__backend": "vllm"}, "top_k=50: its engine's log-probs"),
        ({"use_vllm": True}, "use rollout__backend='vllm' instead"),
        ({"fp16": True}, "fp16=True: use bf16=True"),
        ({"loss_type": "cispo"}, "loss_type='cispo'.*not implemented"),
        ({"lr_scheduler_type": "polynomial"}, "lr_scheduler_type='polynomial': not supported"),
        ({"importance_sampling_level": "sequence", "algorithm__loss_type": "asymre"}, "GSPO"),
        ({"adam_beta1": 0.8}, "AdamW uses torch's betas"),
        ({"save_strategy": "epoch"}, "save_strategy='epoch'"),
    ],
)
def test_bad_config_arguments_are_clear_errors(kwargs: dict, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        ReplayConfig("grpo", **kwargs).to_config()


def test_bad_trainer_arguments_are_clear_errors(tmp_path: Path, tiny_model) -> None:
    args = ReplayConfig("grpo", output_dir=str(tmp_path / "r"), overrides=TINY)
    with pytest.raises(ValueError, match="processing_class"):
        ReplayTrainer(model=tiny_model, args=args)  # an object without its tokenizer
    with pytest.raises(ValueError, match="reward_weights has 1 values for 2"):
        ReplayTrainer(
            reward_funcs=[correctness, "digits_format"],
            args=ReplayConfig("grpo", reward_weights=[1.0], overrides=TINY),
        )
    with pytest.raises(ValueError, match="unknown reward function 'nope'"):
        ReplayTrainer(reward_funcs=["nope"], args=args)
    with pytest.raises(TypeError, match="neither callable nor a name"):
        ReplayTrainer(reward_funcs=[3], args=args)
    with pytest.raises(ValueError, match="too few rows"):  # to hold out, when asked to
        asked = ReplayConfig(
            "grpo", output_dir=str(tmp_path / "e"), overrides=[*TINY, "eval.every=2"]
        )
        ReplayTrainer(reward_funcs=correctness, args=asked, train_dataset=_rows(5))
    with pytest.raises(ValueError, match="no usable rows"):
        ReplayTrainer(args=args, train_dataset=[{"question": "1+1=", "answer": "2"}] * 20)
    with pytest.raises(ConfigError, match="need runtime=sync"):
        ReplayTrainer(
            reward_funcs=correctness,
            args=ReplayConfig("replay", overrides=[*TINY, "runtime=async-local"]),
        )
    with pytest.raises(TypeError, match="instance, not the class"):
        ReplayTrainer(args=args, callbacks=[ReplayCallback])


def test_public_names_and_docs() -> None:
    for name in ("ReplayTrainer", "ReplayConfig", "ReplayCallback", "Config", "load_config"):
        assert name in replayrl.__all__ and getattr(replayrl, name) is not None
    doc = replayrl.ReplayTrainer.__doc__ or ""
    for word in ("reward_funcs", "train_dataset", "eval_dataset", "callbacks", "model"):
        assert word in doc
    for method in ("train", "evaluate", "save_model", "from_run"):
        assert getattr(replayrl.ReplayTrainer, method).__doc__


# -- end to end ------------------------------------------------------------------------------


class _Recorder(ReplayCallback):
    def __init__(self, stop_at: int | None = None) -> None:
        self.stop_at = stop_at
        self.begun = 0
        self.steps: list[tuple[int, float]] = []
        self.evals: list[tuple[int, float]] = []
        self.checkpoints: list[tuple[int, Path]] = []
        self.ended: dict | None = None

    def on_train_begin(self, config):
        self.begun += 1

    def on_step_end(self, step, metrics):
        self.steps.append((step, metrics["reward/mean"]))
        return step == self.stop_at

    def on_evaluate(self, step, metrics):
        self.evals.append((step, metrics["eval/accuracy"]))

    def on_checkpoint(self, step, path):
        self.checkpoints.append((step, path))

    def on_train_end(self, summary):
        self.ended = summary


def test_objects_in_the_api_train_like_files_and_names_in_the_cli(tmp_path: Path) -> None:
    """The API with a datasets.Dataset, a reward callable and a model object gives exactly the
    metrics of the CLI with the same rows in a file, the reward's name and the model's folder."""
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from replayrl.run.warmstart import ensure_warmstart

    base = load_config("grpo", TINY)
    folder = ensure_warmstart(base.model, base.task, log=lambda _: None)
    rows = _rows(80)
    data = tmp_path / "rows.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    common = [*TINY, "train.steps=3", "eval.every=2", "checkpoint.every=2"]
    cli = [
        "train",
        "--config",
        "grpo",
        *common,
        f"model.path={folder}",
        "task.name=dataset",
        f"task.dataset.path={data}",
        "task.eval_size=8",  # what the API picks for 80 rows: min(200, 10%)
        f"logging.run_dir={tmp_path}",
        "logging.name=cli",
    ]
    assert main(cli) == 0
    rec = _Recorder()
    trainer = ReplayTrainer(
        model=AutoModelForCausalLM.from_pretrained(folder),
        processing_class=AutoTokenizer.from_pretrained(folder),
        reward_funcs=[correctness],
        args=ReplayConfig("grpo", output_dir=str(tmp_path / "api"), overrides=common),
        train_dataset=Dataset.from_list(rows),
        callbacks=[rec],
        log=lambda _: None,
    )
    assert trainer.config.task.eval_size == 8
    # the in-memory rows are copied into the run folder, and config.yaml names the copy
    assert trainer.config.task.settings.path == str(
        (tmp_path / "api" / "data" / "train.jsonl").resolve()
    )
    # a callable named like a built-in reward is recorded by its importable name
    assert trainer.config.rewards[0].name == "test_api:correctness"
    summary = trainer.train()
    cli_metrics = read_metrics(tmp_path / "cli" / "metrics.jsonl")
    api_metrics = trainer.metrics()
    assert [r["step"] for r in api_metrics] == [0, 1, 2, 3]
    # ... and never logs under the built-in's name
    assert "reward/user_correctness" in api_metrics[1] and "train/loss" in api_metrics[1]
    assert "reward/correctness" not in api_metrics[1]
    renamed = [
        {k.replace("/user_correctness", "/correctness"): v for k, v in r.items()}
        for r in api_metrics
    ]
    assert _comparable(renamed) == _comparable(cli_metrics)
    copied = [json.loads(line) for line in (tmp_path / "api" / "data" / "train.jsonl").open()]
    assert copied == rows
    # callbacks saw every step, evaluation and checkpoint
    assert rec.begun == 1 and rec.ended is summary
    assert [s for s, _ in rec.steps] == [1, 2, 3]
    assert [r for _, r in rec.steps] == [r["reward/mean"] for r in api_metrics[1:]]
    assert [s for s, _ in rec.evals] == [0, 2, 3]
    assert [s for s, _ in rec.checkpoints] == [2, 3]
    assert all((p / "manifest.json").is_file() for _, p in rec.checkpoints[-1:])
    # the trained object is the one given (trained in place); evaluate() repeats the final eval
    assert trainer.model is trainer._model
    assert trainer.evaluate() == {k: v for k, v in api_metrics[-1].items() if k.startswith("eval/")}
    saved = trainer.save_model(tmp_path / "exported")
    reloaded = AutoModelForCausalLM.from_pretrained(saved)
    for (n, p), (_, q) in zip(
        trainer.model.named_parameters(), reloaded.named_parameters(), strict=True
    ):
        assert p.detach().equal(q.detach()), n
    # evaluate() on other rows: every usable row is graded
    other = trainer.evaluate(_rows(12, seed=5))
    assert 0.0 <= other["eval/accuracy"] <= 1.0
    # evaluate() generates in the precision the run chose (precision: auto), not always fp32
    import replayrl.rollout.generation as generation
    from replayrl.models import precision

    seen: list[object] = []

    class Spy(generation.HFGenerator):
        def __init__(self, *a, **kw) -> None:
            seen.append(kw.get("dtype"))
            super().__init__(*a, **kw)

    bf16 = precision.PrecisionChoice(torch.bfloat16, None, "forced in the test")
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(generation, "HFGenerator", Spy)
        mp.setattr(precision, "choose_for", lambda p, m: bf16)
        trainer.evaluate(_rows(4, seed=6))
    assert seen == [torch.bfloat16]


def test_same_config_gives_the_same_metrics_from_cli_and_api(tmp_path: Path) -> None:
    common = [*TINY, "train.steps=2", f"logging.run_dir={tmp_path}"]
    assert main(["train", "--config", "replay", *common, "logging.name=cli"]) == 0
    ReplayTrainer(
        args=ReplayConfig("replay", overrides=[*common, "logging.name=api"]), log=lambda _: None
    ).train()
    cli = read_metrics(tmp_path / "cli" / "metrics.jsonl")
    api = read_metrics(tmp_path / "api" / "metrics.jsonl")
    assert len(api) == 3 and _comparable(api) == _comparable(cli)


def exact(completions, answer, **kwargs):
    return [float(c == a) for c, a in zip(completions, answer, strict=True)]


def test_a_callback_stops_the_run_and_train_resumes_it(tmp_path: Path) -> None:
    def make(name: str, callbacks) -> ReplayTrainer:
        args = ReplayConfig("grpo", output_dir=str(tmp_path / name), max_steps=4, overrides=TINY)
        return ReplayTrainer(
            reward_funcs=[exact],
            args=args,
            train_dataset=_rows(40),
            callbacks=callbacks,
            log=lambda _: None,
        )

    full = make("full", []).train()
    rec = _Recorder(stop_at=2)
    stopped = make("stopped", [rec])
    first = stopped.train()
    assert first["steps"] == 2 and [s for s, _ in rec.steps] == [1, 2]
    assert [s for s, _ in rec.checkpoints] == [2]  # the final checkpoint at the stop
    # plain functions are on_step_end callbacks; the resumed run continues at step 3
    seen: list[int] = []
    again = make("stopped", [lambda step, metrics: seen.append(step)])
    second = again.train(resume_from_checkpoint=True)
    assert seen == [3, 4] and second["steps"] == 4
    steps = [r for r in again.metrics() if "reward/mean" in r]
    assert [r["step"] for r in steps] == [1, 2, 3, 4]
    full_steps = [
        r for r in read_metrics(tmp_path / "full" / "metrics.jsonl") if "reward/mean" in r
    ]
    assert _comparable(steps) == _comparable(full_steps)  # stopping + resuming changes nothing
    assert second["final_eval_accuracy"] == full["final_eval_accuracy"]


def test_an_in_memory_run_resumes_from_its_copy_of_the_rows(tmp_path: Path) -> None:
    args = ReplayConfig("grpo", output_dir=str(tmp_path / "r"), max_steps=1, overrides=TINY)
    ReplayTrainer(
        reward_funcs=correctness, args=args, train_dataset=_rows(40), log=lambda _: None
    ).train()
    resumed = ReplayTrainer.from_run(
        tmp_path / "r", ["train.steps=2"], reward_funcs=correctness, log=lambda _: None
    )
    assert resumed.train(resume_from_checkpoint=True)["steps"] == 2


def test_rows_json_cannot_hold_are_not_copied_and_resuming_needs_them(tmp_path: Path) -> None:
    rows = [{**r, "blob": object()} for r in _rows(40)]
    said: list[str] = []
    # in the trainer's process: a worker process could not be sent the object column, every
    # rollout would be dropped and the run, having trained nothing, fail
    overrides = [*TINY, "rollout.reward_isolation=thread"]
    args = ReplayConfig("grpo", output_dir=str(tmp_path / "r"), max_steps=1, overrides=overrides)
    trainer = ReplayTrainer(
        reward_funcs=correctness, args=args, train_dataset=rows, log=said.append
    )
    assert trainer.config.task.settings.path.startswith("<in-memory")
    assert any("not copied into the run folder" in m for m in said)
    trainer.train()
    with pytest.raises(ValueError, match="pass the same train_dataset"):
        ReplayTrainer.from_run(tmp_path / "r", reward_funcs=correctness).train(
            resume_from_checkpoint=True
        )


def test_python_c_from_a_folder_outside_the_repository(tmp_path: Path) -> None:
    """`python -c` with a datasets.Dataset and a lambda reward trains the tiny model."""
    code = textwrap.dedent(
        """
        import json, random
        import replayrl
        from datasets import Dataset

        rng = random.Random(0)
        pairs = [(rng.randrange(10, 100), rng.randrange(10, 100)) for _ in range(60)]
        ds = Dataset.from_list([{"prompt": f"{a}+{b}=", "answer": str(a + b)} for a, b in pairs])
        trainer = replayrl.ReplayTrainer(
            reward_funcs=lambda completions, answer, **kw: [
                float(c.strip()[:1] == a[:1]) for c, a in zip(completions, answer)
            ],
            args=replayrl.ReplayConfig("grpo", output_dir="out/run", max_steps=2, overrides=TINY),
            train_dataset=ds,
        )
        summary = trainer.train()
        path = trainer.save_model()
        print("RESULT", json.dumps({"steps": summary["steps"], "saved": str(path)}))
        """
    ).replace("TINY", repr(TINY))
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.split("RESULT", 1)[1])
    assert result["steps"] == 2
    run = tmp_path / "out" / "run"
    assert (tmp_path / result["saved"] / "config.json").is_file()
    records = read_metrics(run / "metrics.jsonl")
    assert [r["step"] for r in records] == [1, 2]  # no evaluation: none was asked for
    # the lambda's rewards are the run's rewards (one function, weight 1)
    for r in records:
        assert r["reward/reward_0"] == r["reward/mean"]
    saved = load_config(run / "config.yaml")
    assert saved.task.settings.path == str((run / "data" / "train.jsonl").resolve())
    assert len((run / "data" / "train.jsonl").read_text().splitlines()) == 60
    assert saved.rewards[0].name.startswith("<not replayable from the command line")
    assert "it is a lambda" in saved.rewards[0].name
