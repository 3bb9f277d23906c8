"""A TRL user's expectations: TRL's defaults without a preset, batch terms, num_iterations under
ReMix, transformers TrainerCallbacks, TRL keys in log_history, trainer.args, peft_config,
prompt-only datasets, plain vs conversational prompts, differences said once at start, and
resuming from a checkpoint folder."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from replayrl.api.config import ReplayConfig
from replayrl.api.trainer import ReplayTrainer
from replayrl.config.schema import ConfigError, load_config
from replayrl.rollout.tasks import ArithmeticTask
from tiny import TINY_MODEL

# the tiny model, 2 prompts x 4 completions of 4 tokens, one thread
TINY_TRL = {
    "num_generations": 4,
    "per_device_train_batch_size": 8,
    "max_completion_length": 4,
    "report_to": "none",
    "disable_tqdm": True,
    "overrides": [*TINY_MODEL, "train.threads=1"],
}


def _rows(n: int = 40, seed: int = 0) -> list[dict]:
    return ArithmeticTask().sample_train(n, np.random.default_rng(seed))


def first_digit(completions, answer, **kwargs):
    return [float(c.strip()[:1] == a[:1]) for c, a in zip(completions, answer, strict=True)]


def test_trl_names_without_a_preset_start_from_trls_defaults() -> None:
    cfg = ReplayConfig(output_dir="runs/x", max_steps=2).to_config()
    t, r, a = cfg.train, cfg.rollout, cfg.algorithm
    assert (t.lr, t.lr_scheduler, t.warmup_steps, t.seed, t.steps) == (1e-6, "linear", 0, 42, 2)
    assert (r.num_generations, r.prompts_per_step, r.max_new_tokens) == (8, 1, 512)
    assert a.loss_agg == "token_mean" and a.scale_rewards and cfg.kl.beta == 0.0
    assert cfg.precision.learner_autocast == "bfloat16" and cfg.model.gradient_checkpointing
    assert cfg.checkpoint.every == 500 and not cfg.logging.tensorboard
    # a preset keeps its own values; TRL names still map
    preset = ReplayConfig("grpo", max_steps=2, loss_type="grpo").to_config()
    assert preset.train.lr_scheduler == "constant" and preset.train.seed == 0
    assert preset.algorithm.loss_agg == "seq_mean"


def test_batch_terms_and_updates_per_step() -> None:
    # 16 completions per generation (4 prompts x 4), one update per 4 x 2 = 8: 2 updates a step
    args = ReplayConfig(
        "grpo",
        num_generations=4,
        per_device_train_batch_size=4,
        gradient_accumulation_steps=2,
        steps_per_generation=4,
        max_steps=10,
        save_steps=4,
    )
    cfg = args.to_config()
    assert (cfg.rollout.prompts_per_step, cfg.train.mini_batch_size) == (4, 8)
    assert cfg.train.steps == 5 and cfg.checkpoint.every == 2
    assert any("max_steps=10 counts optimizer updates" in n for n in args.notes)
    assert (args.generation_batch_size, args.per_device_train_batch_size) == (16, 4)
    assert args.max_steps == 10 and args.steps_per_generation == 4
    # one update per generation: no mini-batch
    one = ReplayConfig("grpo", num_generations=4, per_device_train_batch_size=8).to_config()
    assert one.rollout.prompts_per_step == 2 and one.train.mini_batch_size is None
    # a replay preset keeps its ratios (x = 4, y = 2): TRL's batch terms set what is generated,
    # B = y R and N = x R follow
    replay = ReplayConfig("replay", num_generations=4, per_device_train_batch_size=32).to_config()
    assert replay.rollouts_per_step == 32
    assert (replay.train.batch_size, replay.buffer.capacity) == (64, 128)


def test_trl_step_counts_use_the_batch_a_replay_preset_trains_on() -> None:
    # replay (y = 2): R = 64 generated, B = 128 trained per step in mini-batches of 8 = 16
    # updates a step (8 in the first: the buffer holds 64 then), so TRL's max_steps=800
    # updates are 51 steps (not 100: B != R)
    common = {"per_device_train_batch_size": 8, "generation_batch_size": 64, "num_generations": 8}
    cfg = ReplayConfig("replay", **common, max_steps=800).to_config()
    assert (cfg.rollouts_per_step, cfg.batch_size, cfg.train.mini_batch_size) == (64, 128, 8)
    assert cfg.train.steps == 51
    # replay_ratio=0.5: B = 32, 4 updates a step -> 200 steps
    half = ReplayConfig("replay", **common, max_steps=800, replay_ratio=0.5).to_config()
    assert (half.batch_size, half.train.steps) == (32, 200)
    # on-policy: B = R = 64, 8 updates a step -> 100 steps
    assert ReplayConfig("grpo", **common, max_steps=800).to_config().train.steps == 100


def test_num_iterations_is_remix_utd_under_remix() -> None:
    remix = ReplayConfig("remix-grpo", num_iterations=3).to_config()
    assert remix.method.remix.utd == 3 and remix.train.epochs == 1
    grpo = ReplayConfig("grpo", num_iterations=3).to_config()
    assert grpo.train.epochs == 3
    assert ReplayConfig("remix-grpo", num_iterations=3).num_iterations == 3


def test_peft_config_and_misspelled_trainer_args(tmp_path: Path) -> None:
    from peft import LoraConfig

    args = ReplayConfig("grpo", output_dir=str(tmp_path / "r"), overrides=TINY_MODEL)
    lora = LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, target_modules=["q_proj", "v_proj"])
    trainer = ReplayTrainer(args=args, peft_config=lora, log=lambda _: None)
    assert trainer.config.model.lora.enabled and trainer.config.model.lora.r == 4
    assert trainer.config.model.lora.alpha == 8
    with pytest.raises(ConfigError, match="target_modules='all-linear'"):
        ReplayTrainer(args=args, peft_config=LoraConfig(r=4, target_modules="all-linear"))
    with pytest.raises(AttributeError, match="did you mean learning_rate"):
        _ = args.learning_rte


def test_prompts_chat_template_like_trl(tmp_path: Path) -> None:
    """TRL templates conversational prompts and sends plain text as it is."""
    conv = [
        {"prompt": [{"role": "user", "content": r["prompt"]}], "answer": r["answer"]}
        for r in _rows(20)
    ]
    common = {"output_dir": str(tmp_path / "r"), "max_steps": 1, **TINY_TRL}
    plain = ReplayTrainer(
        reward_funcs=first_digit,
        args=ReplayConfig(**common),
        train_dataset=_rows(20),
        log=lambda _: None,
    )
    chat = ReplayTrainer(
        reward_funcs=first_digit,
        args=ReplayConfig(**common),
        train_dataset=conv,
        log=lambda _: None,
    )
    assert plain.config.task.chat_template is False and chat.config.task.chat_template is True
    assert plain.config.task.eval_size == 0  # nothing held out without eval_strategy
    # a preset templates plain text too, holds rows out when evaluation is asked for, and
    # says both once
    preset = ReplayTrainer(
        reward_funcs=first_digit,
        args=ReplayConfig("grpo", max_steps=1, eval__every=5, **TINY_TRL),
        train_dataset=_rows(40),
        log=lambda _: None,
    )
    assert preset.config.task.chat_template is True and preset.config.task.eval_size == 4
    text = " ".join(preset.notes)
    assert "chat template" in text and "held out" in text and "constant" in text


def test_a_bf16_model_object_is_recorded_as_bf16(tiny_model, char_tokenizer) -> None:
    model = type(tiny_model)(tiny_model.config).to(torch.bfloat16)
    trainer = ReplayTrainer(
        model=model, processing_class=char_tokenizer, args=ReplayConfig("grpo"), log=lambda _: None
    )
    assert trainer.config.model.dtype == "bfloat16"


class _TRLRecorder:
    """A transformers TrainerCallback that stops at step 2 and records what it saw."""

    def __new__(cls, *args, **kwargs):  # subclass TrainerCallback lazily (import cost)
        from transformers import TrainerCallback

        class Recorder(TrainerCallback):
            def __init__(self) -> None:
                self.events: list[tuple[str, int]] = []
                self.logs: list[dict] = []
                self.lr_seen: float | None = None

            def on_train_begin(self, args, state, control, **kw):
                self.events.append(("begin", state.global_step))
                self.lr_seen = args.learning_rate

            def on_step_end(self, args, state, control, **kw):
                self.events.append(("step", state.global_step))
                if state.global_step == 2:
                    control.should_training_stop = True

            def on_log(self, args, state, control, logs=None, **kw):
                self.logs.append(logs)

            def on_save(self, args, state, control, **kw):
                self.events.append(("save", state.global_step))

            def on_train_end(self, args, state, control, **kw):
                self.events.append(("end", state.global_step))

        return Recorder()


def test_trainer_callbacks_log_history_args_and_resume(tmp_path: Path) -> None:
    run = tmp_path / "run"
    lines: list[str] = []
    rec = _TRLRecorder()
    seen: list[int] = []

    def make(cbs, max_steps):
        args = ReplayConfig(
            output_dir=str(run),
            max_steps=max_steps,
            learning_rate=1e-3,
            save_strategy="no",
            **TINY_TRL,
        )
        return ReplayTrainer(
            reward_funcs=first_digit,
            args=args,
            train_dataset=_rows(40),
            callbacks=cbs,
            log=lines.append,
        )

    trainer = make([rec], 4)
    trainer.add_callback(lambda step, metrics: seen.append(step))
    summary = trainer.train()
    assert summary["steps"] == 2 and seen == [1, 2]  # control.should_training_stop
    assert rec.events == [("begin", 0), ("step", 1), ("step", 2), ("save", 2), ("end", 2)]
    assert rec.lr_seen == 1e-3 and trainer.args.max_steps == 4
    assert [round(g["learning_rate"], 10) for g in rec.logs] == [1e-3, 7.5e-4]  # linear, 4
    assert {"loss", "reward", "grad_norm", "rewards/first_digit/mean"} <= set(rec.logs[0])
    history = trainer.state.log_history
    assert [h["step"] for h in history] == [1, 2]  # no evaluation (TRL's eval_strategy='no')
    assert history[1]["learning_rate"] == history[1]["train/lr"] == 7.5e-4
    notes = [line for line in lines if line.startswith("note (differs from TRL)")]
    assert len(notes) == 1 and "save_strategy='no'" in notes[0]
    # resume from the checkpoint folder itself (TRL's resume_from_checkpoint=<folder>)
    ckpt = run / "checkpoints" / "step_000002"
    assert ckpt.is_dir()
    again = make([], 4).train(resume_from_checkpoint=str(ckpt))
    assert again["steps"] == 4
    with pytest.raises(ValueError, match="newest complete checkpoint"):
        make([], 4).train(resume_from_checkpoint=str(ckpt))  # step 4 is newer now


def test_prompt_only_rows_train_with_a_reward_that_needs_no_answer(tmp_path: Path) -> None:
    rows = [{"prompt": r["prompt"]} for r in _rows(20)]
    calls: list[set] = []

    def short(completions, **kwargs):
        calls.append(set(kwargs))
        return [float(len(c) < 3) for c in completions]

    # `calls` is this process's list: the function runs here, not in a worker process
    args = ReplayConfig(
        output_dir=str(tmp_path / "r"),
        max_steps=1,
        rollout__reward_isolation="thread",
        **TINY_TRL,
    )
    trainer = ReplayTrainer(reward_funcs=short, args=args, train_dataset=rows, log=lambda _: None)
    assert trainer.train()["steps"] == 1
    assert calls and "answer" not in calls[0]
    with pytest.raises(ValueError, match="no usable rows"):  # the verifier needs answers
        ReplayTrainer(reward_funcs="correctness", args=args, train_dataset=rows)


def test_replay_ratio_and_staleness_horizon_by_name() -> None:
    """Paper 1's y = B / R and x = N / R set B and N (R = 8 prompts x 8 completions)."""
    args = ReplayConfig("replay", replay_ratio=1.5, staleness_horizon=3)
    cfg = args.to_config()
    assert cfg.rollouts_per_step == 64 and (cfg.train.batch_size, cfg.buffer.capacity) == (96, 192)
    # the same run through override strings (what a resume passes): the same N and B
    again = load_config("replay", args.override_strings())
    assert (again.train.batch_size, again.buffer.capacity) == (96, 192)
    with pytest.raises(ConfigError, match="need a replay buffer"):
        ReplayConfig("grpo", replay_ratio=2).to_config()
    with pytest.raises(ConfigError, match="positive number"):
        ReplayConfig("replay", staleness_horizon=0).to_config()


def test_help_and_config_docs_list_the_papers_knobs(capsys) -> None:
    from replayrl.cli.main import main

    for doc in (ReplayTrainer.__doc__ or "", ReplayConfig.__doc__ or ""):
        for knob in (
            "buffer__capacity",
            "replay_ratio",
            "staleness_horizon",
            "method__remix__utd",
            "kl__target",
            "2604.08706",
            "2507.06892",
            "num_iterations",
        ):
            assert knob in doc, knob
    assert main(["config", "show", "--doc", "--config", "replay"]) == 0
    lines = capsys.readouterr().out.splitlines()
    by_key = {line.split(" = ", 1)[0]: line for line in lines}
    assert "staleness horizon x = N / R" in by_key["buffer.capacity"]
    assert by_key["buffer.capacity"].startswith("buffer.capacity = 256  # ")
    assert "replay ratio y = B / R" in by_key["train.batch_size"]
    assert "dropout" in by_key["model.lora.dropout"]  # not the comment of the line above
    assert main(["config", "explain", "method.remix.utd"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("method.remix.utd: m: gradient passes") and "default 2" in out
    assert main(["config", "explain", "buffer.capacty"]) == 2
    assert "did you mean buffer.capacity" in capsys.readouterr().err


def test_misspelled_override_keys_get_the_nearest_keys() -> None:
    with pytest.raises(ConfigError, match=r"train\.stpes \(did you mean train\.steps"):
        ReplayConfig("grpo", overrides=["train.stpes=3"])
    with pytest.raises(ConfigError, match=r"buffer\.capacty \(did you mean buffer\.capacity"):
        ReplayConfig("replay", overrides={"buffer.capacty": 3})
    # dict-valued keys and whole sections are keys too
    ReplayConfig("grpo", overrides=["task.reasoning_gym.config.chain_sum.digits=2", "remix={}"])
