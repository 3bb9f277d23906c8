"""What a TRL user sees before and at the start of a run: `args` read as the run will use
them, the settings table, max_steps counted in optimizer updates (or refused), no held-out
rows unless asked, and notes only where they apply."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from replayrl.api.config import ReplayConfig
from replayrl.api.settings import settings
from replayrl.api.trainer import ReplayTrainer
from replayrl.config.schema import ConfigError, ModelConfig
from replayrl.learner.policy_pass import PolicyPass
from replayrl.models.loading import atomic_save_pretrained, build_char_tokenizer, build_tiny_model
from replayrl.rollout.tasks import ArithmeticTask
from tiny import TINY_MODEL

QUIET = ["logging.tensorboard=false", "logging.progress=false", "train.threads=1"]


def _rows(n: int = 40) -> list[dict]:
    return ArithmeticTask().sample_train(n, np.random.default_rng(0))


def first_digit(completions, answer, **kwargs):
    return [float(c.strip()[:1] == a[:1]) for c, a in zip(completions, answer, strict=True)]


@pytest.fixture(scope="module")
def model_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny Llama saved as a model folder: a model of the user's own to the presets."""
    tok = build_char_tokenizer(ArithmeticTask().corpus())
    cfg = ModelConfig.model_validate(
        {"tiny": {"num_layers": 1, "hidden_size": 32, "num_heads": 2, "intermediate_size": 64}}
    )
    dest = tmp_path_factory.mktemp("own") / "model"
    atomic_save_pretrained(build_tiny_model(cfg, vocab_size=len(tok), seed=0), tok, dest)
    return dest


def _trainer(args: ReplayConfig, model: Path | None = None, **kw) -> ReplayTrainer:
    return ReplayTrainer(
        model=str(model) if model else None,
        reward_funcs=first_digit,
        args=args,
        train_dataset=kw.pop("train_dataset", _rows()),
        log=kw.pop("log", lambda _: None),
        **kw,
    )


def test_args_read_what_the_run_uses_before_and_after_the_trainer(tmp_path, model_folder):
    args = ReplayConfig("remix-grpo", output_dir=str(tmp_path / "r"), train__steps=2)
    # before a trainer: a method preset runs with your model on TRL's defaults where it is open
    assert (args.learning_rate, args.per_device_train_batch_size) == (1e-6, 8)
    assert (args.max_completion_length, args.num_generations) == (512, 4)
    trainer = _trainer(args, model_folder)
    assert trainer.args is args and args.learning_rate == trainer.config.train.lr == 1e-6
    assert args.per_device_train_batch_size == trainer.config.train.mini_batch_size == 8
    # the built-in tiny model (model=None) runs the demo's experiment: args follow the run
    tiny = _trainer(ReplayConfig("remix-grpo", output_dir=str(tmp_path / "t"), train__steps=2))
    assert tiny.args.learning_rate == tiny.config.train.lr == 1e-4
    assert tiny.args.max_completion_length == tiny.config.rollout.max_new_tokens == 6


def test_the_settings_table_lists_what_differs_and_who_set_it(tmp_path, model_folder) -> None:
    args = ReplayConfig("grpo", output_dir=str(tmp_path / "r"), learning_rate=3e-6, max_steps=20)
    trainer = _trainer(args, model_folder)
    rows = {r.name: r for r in settings(trainer.args, trainer.config)}
    # passed and used as passed, or at TRL's default: not listed
    assert (
        "learning_rate" not in rows and "temperature" not in rows and "num_generations" not in rows
    )
    # passed, and used otherwise: TRL's 20 updates are 2 whole steps of 16 updates here
    assert (rows["max_steps"].used, rows["max_steps"].passed) == (32, 20)
    # not passed, and unlike TRL's default: the preset's 16 prompts x 8 completions per step
    assert (rows["generation_batch_size"].used, rows["generation_batch_size"].trl_default) == (
        128,
        8,
    )
    assert rows["generation_batch_size"].source == "preset grpo (rollout.prompts_per_step)"
    assert rows["bf16"].used is False and rows["bf16"].passed == "-"
    table = trainer.settings_table()
    assert table.splitlines()[0].startswith("settings that differ from TRL's defaults")
    line = next(ln for ln in table.splitlines() if ln.strip().startswith("max_steps"))
    assert line.split()[:4] == ["max_steps", "32", "-1", "20"]
    # the tiny model's experiment says so
    tiny = _trainer(ReplayConfig("replay", output_dir=str(tmp_path / "t"), max_steps=4))
    lr = {r.name: r for r in settings(tiny.args, tiny.config)}["learning_rate"]
    assert lr.used == 1e-4 and "tiny model" in lr.source


def test_the_table_is_printed_once_when_training_starts(tmp_path) -> None:
    lines: list[str] = []
    args = ReplayConfig(
        "grpo",
        output_dir=str(tmp_path / "r"),
        max_steps=1,
        num_generations=4,
        generation_batch_size=8,
        max_completion_length=4,
        overrides=[*TINY_MODEL, *QUIET],
    )
    _trainer(args, log=lines.append).train()
    titles = [i for i, ln in enumerate(lines) if ln.startswith("settings that differ")]
    assert len(titles) == 1
    assert "learning_rate" in lines[titles[0]] and "0.0001" in lines[titles[0]]


def test_max_steps_counts_optimizer_updates_of_the_presets_batch(tmp_path, monkeypatch) -> None:
    """replay: B = y R = 2 x 8 = 16 rollouts a step in mini-batches of 4 -> 4 updates a step,
    2 in the first (the buffer holds R = 8 then), so TRL's max_steps=10 is 3 steps, and the
    learner takes 10 optimizer updates."""
    updates: list[int] = []
    real = PolicyPass.step

    def counted(self, *a, **k):
        updates.append(1)
        return real(self, *a, **k)

    monkeypatch.setattr(PolicyPass, "step", counted)
    args = ReplayConfig(
        "replay",
        output_dir=str(tmp_path / "r"),
        max_steps=10,
        overrides=[
            *TINY_MODEL,
            *QUIET,
            "rollout.prompts_per_step=2",
            "rollout.num_generations=4",
            "rollout.max_new_tokens=4",
            "train.mini_batch_size=4",
        ],
    )
    trainer = _trainer(args)
    assert trainer.config.train.steps == 3 and trainer.args.max_steps == 10
    assert trainer.train()["steps"] == 3
    assert len(updates) == 10


def test_max_steps_is_refused_where_steps_take_different_numbers_of_updates(tmp_path) -> None:
    args = ReplayConfig("remix-grpo", output_dir=str(tmp_path / "r"), max_steps=2)
    with pytest.raises(
        ConfigError, match=r"method.remix.utd=2 .* method.remix.utd_after=1 .*train__steps=N"
    ):
        _trainer(args)
    # the number of steps itself is accepted, and the table says why max_steps is not a count
    trainer = _trainer(ReplayConfig("remix-grpo", output_dir=str(tmp_path / "s"), train__steps=2))
    assert trainer.args.max_steps is None
    row = {r.name: r for r in settings(trainer.args, trainer.config)}["max_steps"]
    assert row.used == "2 steps" and "utd_after" in row.source


def test_no_rows_are_held_out_unless_evaluation_is_asked_for(tmp_path) -> None:
    rows = _rows(40)

    def make(name: str, **kw) -> ReplayTrainer:
        args = ReplayConfig("grpo", output_dir=str(tmp_path / name), **kw)
        return _trainer(args, train_dataset=rows, eval_dataset=kw.pop("eval_", None))

    plain = make("plain")
    assert plain.config.task.eval_size == 0 and plain.args.eval_strategy == "no"
    assert not any("held out" in n for n in plain.notes)
    with pytest.raises(ValueError, match="holds no rows out.*pass eval_dataset"):
        plain.evaluate()
    assert make("every", eval__every=2).config.task.eval_size == 4  # min(200, 10%)
    assert make("trl", eval_strategy="steps", eval_steps=2).config.task.eval_size == 4
    given = _trainer(
        ReplayConfig("grpo", output_dir=str(tmp_path / "given")),
        train_dataset=rows,
        eval_dataset=_rows(12),
    )
    assert given.config.task.eval_size == 12 and given.args.eval_strategy == "steps"


def test_the_vllm_correction_note_is_said_only_when_vllm_generates(tmp_path) -> None:
    trl_config = {"vllm_importance_sampling_mode": "sequence_mask", "max_steps": 1}
    args = ReplayConfig(output_dir=str(tmp_path / "r"), **trl_config)
    assert args.translation.vllm_notes and not any("vllm" in n for n in args.notes)
    trainer = _trainer(args)
    assert not any("vllm" in n for n in trainer.notes)


def test_a_ported_grpo_config_lists_only_what_replayrl_does_otherwise(tmp_path, model_folder):
    """A TRL GRPOConfig (on a CPU: use_cpu=True, bf16=False) trains with its own values: the
    table shows only what replayrl cannot take from it (TRL keeps every checkpoint)."""
    trl = pytest.importorskip("trl")
    args = trl.GRPOConfig(
        output_dir=str(tmp_path / "q"),
        use_cpu=True,
        bf16=False,
        max_steps=2,
        learning_rate=1e-5,
    )  # (report_to: TRL resolves its "none" to [], the same choice)
    trainer = _trainer(args, model_folder)
    rows = settings(trainer.args, trainer.config)
    assert [(r.name, r.used, r.passed) for r in rows] == [("save_total_limit", 2, None)]
    assert trainer.config.train.device == "cpu" and trainer.args.bf16 is False
