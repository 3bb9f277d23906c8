"""The Python API: `ReplayTrainer` and `ReplayConfig`, shaped like TRL's GRPOTrainer/GRPOConfig.

Moving a TRL GRPO script over changes the import, the class names and the config::

    from replayrl import ReplayConfig, ReplayTrainer       # was: from trl import GRPO...

    trainer = ReplayTrainer(                               # was: GRPOTrainer(
        model=model,                                       # path, prepared name or object
        reward_funcs=[my_reward],                          # TRL's reward signature
        args=ReplayConfig("replay", output_dir="runs/x"),  # preset + TRL-named knobs
        train_dataset=dataset,                             # datasets.Dataset, list, path
    )
    trainer.train()

The command line (`replayrl train`) is a thin layer over the same two classes, so a config
trains the same way from either. `ReplayConfig` lives in api/config.py.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from os import PathLike
from pathlib import Path
from typing import Any

import torch

from replayrl.algorithms import ADVANTAGES
from replayrl.api import trl_compat
from replayrl.api.config import ReplayConfig
from replayrl.config.registries import BACKENDS, RUNTIMES, runtimes_with
from replayrl.config.schema import (
    Config,
    ConfigError,
    TaskConfig,
    build_config,
    config_value,
    load_config,
)
from replayrl.run.callbacks import ReplayCallback, RunHooks, as_callbacks

Log = Callable[[str], None]
__all__ = ["ReplayCallback", "ReplayConfig", "ReplayTrainer", "TrainerState"]

# config.yaml's task.dataset.path / eval_path for rows given as objects
IN_MEMORY = "<in-memory"
IN_MEMORY_MODEL = "<in-memory model>"
RewardFunc = Callable[..., Sequence[float | None]]


def _used(hooks: RunHooks) -> RunHooks | None:
    """The hooks when they carry anything (the loop then takes them), else None."""
    if hooks.task is None and hooks.rewards is None and hooks.policy is None:
        return hooks if hooks.callbacks else None
    return hooks


def _in_memory(label: str | None) -> str:
    """`<in-memory: Dataset of 64 rows>` from DatasetTask's `<Dataset of 64 rows>`."""
    return f"{IN_MEMORY}: {(label or 'rows').strip('<>')}>"


def _is_path(x: Any) -> bool:
    return isinstance(x, (str, PathLike))


@dataclass
class TrainerState:
    """What TRL scripts read after training: `trainer.state.global_step` (steps trained) and
    `trainer.state.log_history` (metrics.jsonl's records)."""

    global_step: int = 0
    log_history: list[dict[str, Any]] = field(default_factory=list)


class ReplayTrainer:
    """Train a policy with replay / ReMix / GRPO (the counterpart of TRL's `GRPOTrainer`).

    Args:
        model: None (the config's `model.path`, or the built-in tiny demo model), a model
            folder, a name prepared by `replayrl prepare` ("smollm2-135m"), a hub id, or a
            `transformers.PreTrainedModel` object (trained in place; give its tokenizer as
            `processing_class` unless it was loaded from a local folder).
        reward_funcs: one or a list of reward functions with TRL's signature
            `f(prompts, completions, **columns) -> list[float | None]` (every dataset column
            arrives as a keyword list, e.g. `answer`; None = not applicable; lambdas work),
            built-in names ("correctness", "math", "boxed_format", ...),
            "path/to/file.py:function" strings, or reward models (a local folder or a model
            with a sequence-classification head, as in TRL). None: the config's `rewards`.
            Weights: `ReplayConfig(reward_weights=[...])`, else 1.0 each. A function that
            raises or returns a non-finite value drops only the rollouts concerned (counted in
            `rollouts/dropped_reward_error`).
        args: a `ReplayConfig`, a TRL `GRPOConfig` (its fields are read), a `Config`, a preset
            name or a YAML path (None: defaults).
        train_dataset: a `datasets.Dataset`, a list of dicts, a pandas DataFrame, or a local
            JSONL / JSON / parquet / CSV file. Rows need a prompt (text or chat messages) and
            an answer (`task.dataset.prompt_column` / `task.dataset.answer_column`, default
            "prompt" / "answer"); malformed rows are skipped and counted. None: the config's task.
            With reward callables only (no built-in reward names) and no evaluation, rows
            need no answer column (format or judge rewards).
        eval_dataset: the held-out rows (same kinds). None: with a preset, a seeded split of
            train_dataset (`task.eval_size` rows, default min(200, 10%)); with TRL's arguments
            and no preset, as TRL: no evaluation unless `eval_strategy="steps"`.
        processing_class: the tokenizer of a model object.
        callbacks: `ReplayCallback` objects, plain functions `f(step, metrics)` called after
            every step (returning True stops training after the step), or transformers
            `TrainerCallback`s (on_train_begin, on_step_end, on_log with TRL's key names,
            on_evaluate, on_save, on_train_end; `control.should_training_stop` stops).
        log: where progress messages go (default: print).
        peft_config: a peft `LoraConfig` (TRL's argument): trains LoRA adapters.
        reward_processing_classes: the tokenizers of reward models in `reward_funcs` (TRL's
            argument: one, or one per reward function, None for functions). A reward model
            is a local model folder or a loaded model with a sequence-classification head;
            its first logit on prompt + completion is the reward (api/reward_model.py).

    Methods: `train()`, `evaluate()`, `save_model()`, `metrics()`, `add_callback()`;
    attributes `config` (the resolved `Config`), `args` (`args.learning_rate`, ...: the
    resolved values under TRL's names), `run_dir`, `model`, `tokenizer` (alias
    `processing_class`), `notes` (where the run knowingly differs from TRL, printed once when
    training starts), and after training `summary` and `state` (TRL's `state.global_step`,
    `state.log_history` with TRL's key names `loss`, `reward`, `learning_rate`, ... beside
    replayrl's).

    The papers' knobs (`help(ReplayConfig)` has the list; `replayrl config show --doc` every
    key), passed as `ReplayConfig(..., section__key=value)`:

    - `method__name="replay"`, `buffer__capacity` N, `train__batch_size` B: experience replay
      (arXiv 2604.08706); `staleness_horizon` x = N / R and `replay_ratio` y = B / R by name;
    - `buffer__sampler="positive_bias"`, `buffer__delta`: oversample rewarded rollouts;
    - `buffer__max_staleness`: drop rollouts older than this many policy versions;
    - `algorithm__loss_type="asymre"`: AsymRE;
    - `method__name="remix"` (ReMix, arXiv 2507.06892), `method__remix__off_policy_fraction`
      p, `method__remix__num_policies` N_pol, `method__remix__utd` m (TRL's num_iterations),
      `method__remix__reincarnation_step` T; `kl__target="convex"`: KL-Convex;
      `algorithm__entropy_coef`.

    In-memory datasets, model objects, reward callables and callbacks need `runtime: sync`
    (asynchronous workers build their own copies from files and names).

    Example::

        trainer = ReplayTrainer(
            model="smollm2-135m",
            reward_funcs=[lambda completions, answer, **kw: [float(a in c) for c, a in
                                                             zip(completions, answer)]],
            args=ReplayConfig("remix-grpo", output_dir="runs/mine", max_steps=100),
            train_dataset=Dataset.from_list(rows),
        )
        summary = trainer.train()          # summary["final_eval_accuracy"], ...
        trainer.save_model("my-policy")
    """

    def __init__(
        self,
        model: str | PathLike[str] | torch.nn.Module | None = None,
        reward_funcs: RewardFunc | str | Sequence[RewardFunc | str] | None = None,
        args: ReplayConfig | Config | str | PathLike[str] | None = None,
        train_dataset: Any = None,
        eval_dataset: Any = None,
        processing_class: Any = None,
        callbacks: Sequence[Any] | None = None,
        log: Log = print,
        peft_config: Any = None,
        reward_processing_classes: Any = None,
    ) -> None:
        self.args = args if isinstance(args, ReplayConfig) else ReplayConfig(args)
        self.log = log
        self.summary: dict[str, Any] | None = None
        self.state = TrainerState()
        self._hf: tuple[Any, Any] | None = None  # transformers (TrainerState, TrainerControl)
        self.callbacks: list[ReplayCallback] = []
        for cb in callbacks or []:
            self.add_callback(cb)
        self._model: torch.nn.Module | None = None
        self._tokenizer: Any = None
        self._model_path = ""
        self._trained = False
        self._eval_dataset = eval_dataset
        self._run_files: dict[str, str] = {}  # written into the run folder when it starts
        extra: dict[str, Any] = trl_compat.lora_overrides(peft_config)
        self._take_model(model, processing_class, extra)
        self._rewards = self._take_rewards(reward_funcs, extra, reward_processing_classes)
        if train_dataset is not None:  # a dataset task: its columns are read (task.dataset.*)
            extra |= {"task.name": "dataset", "task.dataset.path": _in_memory("train_dataset")}
        self.config = self.args.to_config(extra)  # validate the model and rewards part early
        # differences from TRL's behaviour, said once at start (TRL's step counts are
        # recounted by to_config for the resolved run: its notes are the ones that hold)
        self.notes = self.args.notes
        if BACKENDS.get(self.config.rollout.backend).own_logprobs:
            # TRL's correction of an engine's own log-probs (vLLM's) applies only with one
            self.notes += self.args.translation.vllm_notes
        self._task = self._take_datasets(train_dataset, eval_dataset)
        self._steps_from_epochs()
        self._trl_notes()
        self.args.resolved = self.config
        self._check_injection()

    def add_callback(self, callback: Any) -> None:
        """Add a callback (as in TRL): a `ReplayCallback`, a function `f(step, metrics)`, or a
        transformers `TrainerCallback` (instance or class)."""
        if trl_compat.is_trainer_callback(callback):
            self.callbacks.append(trl_compat.TrainerCallbackAdapter(callback, self._hf_context))
        else:
            self.callbacks.extend(as_callbacks([callback]))

    def _hf_context(self) -> tuple[Any, Any, Any, dict[str, Any]]:
        """(args, state, control, kwargs) for transformers callbacks, shared by all of them."""
        from transformers import TrainerControl
        from transformers import TrainerState as HFState

        if self._hf is None:
            self._hf = (HFState(max_steps=self.config.train.steps), TrainerControl())
        state, control = self._hf
        kwargs = {"model": self._model, "processing_class": self._tokenizer}
        return self.args, state, control, kwargs

    @classmethod
    def from_run(
        cls, run_dir: str | PathLike[str], overrides: Sequence[str] = (), **kwargs: Any
    ) -> ReplayTrainer:
        """A trainer for an existing run folder (its config.yaml + `overrides`), to resume it
        with `.train(resume_from_checkpoint=True)`; `kwargs` as in the constructor (pass the
        same reward callables and datasets when the run was started with objects)."""
        run_dir = Path(run_dir)
        saved = run_dir / "config.yaml"
        if not saved.is_file():
            raise FileNotFoundError(f"{run_dir} is not a run folder (no config.yaml)")
        cfg = load_config(saved, list(overrides))
        cfg.logging.run_dir, cfg.logging.name = str(run_dir.parent), run_dir.name
        return cls(args=ReplayConfig(cfg, overrides=list(overrides)), **kwargs)

    # -- construction ------------------------------------------------------------------------
    def _take_model(self, model: Any, tokenizer: Any, extra: dict[str, Any]) -> None:
        if model is None:
            if tokenizer is not None:
                raise ValueError("processing_class was given without a model object")
            return
        if _is_path(model):
            extra["model.path"] = str(model)
            if tokenizer is not None:
                raise ValueError(
                    "processing_class goes with a model object; a model path brings its own "
                    "tokenizer"
                )
            return
        if not isinstance(model, torch.nn.Module):
            raise TypeError(
                f"model must be a path, a prepared model name or a PreTrainedModel "
                f"(got {type(model).__name__})"
            )
        source = str(getattr(model, "name_or_path", "") or "")
        local = bool(source) and Path(source).expanduser().is_dir()
        if tokenizer is None:
            if not local:
                raise ValueError(
                    "a model object needs its tokenizer: pass processing_class=tokenizer"
                )
            from transformers import AutoTokenizer

            tokenizer = AutoTokenizer.from_pretrained(source)
        if local:
            extra["model.path"] = source  # config.yaml names where the weights came from
        dtype = str(next(model.parameters()).dtype).removeprefix("torch.")
        if dtype in ("float32", "bfloat16", "float16"):
            extra["model.dtype"] = dtype  # config.yaml records the dtype it trains in
        self._model, self._tokenizer = model, tokenizer
        self._model_path = source if local else IN_MEMORY_MODEL
        self.args.real_model = True  # a method preset gets TRL's defaults, not the demo's

    def _take_rewards(
        self, funcs: Any, extra: dict[str, Any], processing_classes: Any = None
    ) -> list[Any] | None:
        """Reward callables and reward models -> WeightedReward objects (injected); names ->
        config only."""
        from replayrl.api.replayable import metric_name, reward_record
        from replayrl.api.reward_model import RewardModel, as_reward_models
        from replayrl.rollout.rewards import REWARDS, WeightedReward, resolve_rewards

        self._named_rewards: list[str] = []
        if funcs is None:
            if self.args.reward_weights is not None:
                raise ValueError("reward_weights given without reward_funcs")
            if processing_classes is not None:
                raise ValueError("reward_processing_classes given without reward_funcs")
            return None
        items = [funcs] if callable(funcs) or isinstance(funcs, str) else list(funcs)
        items = as_reward_models(items, processing_classes)  # model folders and objects
        self._named_rewards = [fn for fn in items if isinstance(fn, str)]
        if not items:
            raise ValueError("reward_funcs: at least one reward function is needed")
        weights = self.args.reward_weights or [1.0] * len(items)
        if len(weights) != len(items):
            raise ValueError(
                f"reward_weights has {len(weights)} values for {len(items)} reward functions"
            )
        names, records, rewards = [], [], []
        for i, (fn, w) in enumerate(zip(items, weights, strict=True)):
            if isinstance(fn, str):
                rewards.append(resolve_rewards([(fn, w)])[0])  # errors now, not mid-run
                names.append(fn)
                records.append(fn)
            elif isinstance(fn, RewardModel):  # in this process: a model is no code to isolate
                name = fn.name if fn.name not in names else f"{fn.name}_{i}"
                rewards.append(WeightedReward(name=name, fn=fn, weight=w, builtin=True))
                names.append(name)
                records.append(fn.record())
            elif callable(fn):
                # never a built-in reward's name: the metrics would pass it off as the built-in
                name = metric_name(fn, i, frozenset(REWARDS))
                while name in names:  # two functions of the same name: keep both apart
                    name = f"{name}_{i}"
                rewards.append(WeightedReward(name=name, fn=fn, weight=w))
                names.append(name)
                # config.yaml: `module:function` when importable, else why it is not
                records.append(reward_record(fn, name))
            else:
                raise TypeError(f"reward_funcs[{i}]: {fn!r} is neither callable nor a name")
        extra["rewards"] = [{"name": n, "weight": w} for n, w in zip(records, weights, strict=True)]
        has_callable = any(callable(f) and not isinstance(f, str) for f in items)
        return rewards if has_callable else None

    def _wants_eval(self, eval_dataset: Any = None) -> bool:
        """As TRL, rows are held out and evaluated only when asked: eval_strategy='steps' (or
        eval_steps), eval__every or task__eval_size set, or (with a preset) an eval_dataset."""
        args = self.args
        every = self.config.eval.every if args.sets("eval.every") else 0
        asked = (
            args.translation.view.get("eval_strategy") == "steps"
            or every > 0
            or bool(args.trl_values.get("eval_steps"))
            or args.sets("task.eval_size")
        )
        return asked or (eval_dataset is not None and not args.trl_mode)

    def _take_datasets(self, train: Any, eval_: Any) -> Any:
        """A DatasetTask over the given rows (or files); the config records where they came
        from and the split size, so a run folder's config.yaml says what was trained on."""
        if train is None:
            if eval_ is not None:
                raise ValueError("eval_dataset needs a train_dataset beside it")
            return None
        from replayrl.rollout.tasks import DatasetTask

        # a one-pass iterator is read twice (the task, the run folder's copy): keep its rows
        train = list(train) if hasattr(train, "__next__") else train
        eval_ = list(eval_) if hasattr(eval_, "__next__") else eval_
        t = self.config.task
        d = t.settings  # task.dataset: the columns and answer format
        explicit = self.args.sets("task.eval_size")
        loop_eval, eval_size = eval_, (t.eval_size if explicit else None)
        if not self._wants_eval(eval_):  # as TRL: no evaluation, nothing held out of training
            loop_eval, eval_size = None, 0
        # reward callables may need no answer (format or judge rewards): prompt-only rows
        prompt_only = self._rewards is not None and not self._named_rewards
        task = DatasetTask(
            train,
            eval_path=loop_eval,
            prompt_column=d.prompt_column,
            answer_column=d.answer_column,
            solution_column=d.solution_column,
            format=d.format,
            eval_size=eval_size,  # None: all of eval_, or min(200, 10%)
            seed=t.seed,
            require_answer=not prompt_only or eval_size != 0,
        )
        if task.num_eval == 0 and eval_size != 0:
            raise ValueError(
                f"train_dataset {task.source_label}: too few rows to hold out an eval split "
                "(needs 10 or more); pass eval_dataset"
            )
        if task.skipped:
            self.log(task.skip_summary())
        label = str(train) if _is_path(train) else self._copy(train, "train", task.source_label)
        eval_label = None
        if loop_eval is not None:
            eval_label = (
                str(eval_) if _is_path(eval_) else self._copy(eval_, "eval", task.eval_label)
            )
        update = {
            "name": "dataset",
            "eval_size": task.num_eval,
            "chat_template": self._chat_template(task, eval_ is None),
            "dataset": {**d.model_dump(), "path": label, "eval_path": eval_label},
        }
        self.config = build_config(
            {**self.config.model_dump(mode="json"), "task": {**t.model_dump(), **update}}
        )
        return task

    def _copy(self, rows: Any, split: str, label: str | None) -> str:
        """config.yaml's path for in-memory rows: their JSONL copy in the run folder (written
        when the run starts), or where they cannot be copied, the in-memory label and why."""
        from replayrl.api.replayable import jsonl_copy

        text, why = jsonl_copy(rows)
        if text is None:
            self.log(
                f"warning: the {split} dataset is not copied into the run folder: {why}; "
                "config.yaml cannot replay this run from the command line"
            )
            return _in_memory(label)
        name = f"data/{split}.jsonl"
        self._run_files[name] = text
        return str((self.run_dir / name).resolve())

    def _chat_template(self, task: Any, no_eval_dataset: bool) -> bool:
        """TRL renders conversational prompts with the chat template and sends plain text as
        it is; a preset templates both (said in the notes when TRL arguments are used)."""
        rows = task.train_rows()
        conversational = bool(rows) and not isinstance(rows[0]["prompt"], str)
        t, trl_used = self.config.task, bool(self.args.trl_values)
        if self.args.trl_mode and not self.args.sets("task.chat_template"):
            return conversational
        if trl_used and t.chat_template and not conversational:
            self.notes.append(
                "plain-text prompts are rendered with the tokenizer's chat template when it has "
                "one (TRL sends them as they are; task__chat_template=False does the same)"
            )
        if trl_used and no_eval_dataset and task.num_eval:
            self.notes.append(
                f"{task.num_eval} rows of train_dataset are held out for a greedy evaluation "
                f"at start, every {self.config.eval.every} steps and at the end (TRL: none "
                "without eval_strategy; task__eval_size=0 and eval__every=0 turn it off)"
            )
        return t.chat_template

    def _steps_from_epochs(self) -> None:
        """max_steps=-1 (TRL's default): num_train_epochs passes over the train rows."""
        tr = self.args.translation
        if tr.epochs_to_steps is None or self.args.sets("train.steps"):
            return
        if self._task is None:
            raise ValueError("max_steps=-1 (epochs) needs a train_dataset: give max_steps")
        prompts = self.config.rollout.prompts_per_step
        steps = max(1, math.ceil(tr.epochs_to_steps * self._task.num_train / prompts))
        self.notes.append(
            f"max_steps not given: {steps} steps = num_train_epochs={tr.epochs_to_steps:g} x "
            f"{self._task.num_train} prompts / {prompts} prompts per step"
        )
        data = self.config.model_dump(mode="json")
        data["train"]["steps"] = steps
        self.config = build_config(data)

    def _trl_notes(self) -> None:
        """Differences from TRL's defaults that a preset keeps (only when TRL names are used)."""
        cfg, tr = self.config, self.args.translation
        if self.args.trl_mode and self._wants_eval():
            self.notes.append(
                "evaluation is greedy pass@1 accuracy with the task's verifier (eval/accuracy), "
                "not TRL's eval loss and reward"
            )
        if not self.args.trl_values or self.args.trl_mode:
            return
        if cfg.train.lr_scheduler == "constant" and "train.lr_scheduler" not in tr.dotted:
            self.notes.append(
                f"learning rate: constant {cfg.train.lr:g} (preset {self.args.preset}; TRL "
                "decays it linearly to 0: lr_scheduler_type='linear' does the same)"
            )
        key = cfg.method_spec.passes_key
        if key != "train.epochs" and "num_iterations" not in self.args.trl_values:
            self.notes.append(
                f"method.name={cfg.method.name}: each batch is trained on "
                f"{key}={config_value(cfg, key)} times (num_iterations sets it)"
            )

    def _check_injection(self) -> None:
        cfg = self.config
        needs_sync = [
            what
            for what, used in (
                ("a model object", self._model is not None),
                ("reward callables", self._rewards is not None),
                ("an in-memory dataset", self._task is not None),
                ("callbacks", bool(self.callbacks)),
            )
            if used
        ]
        if needs_sync and not RUNTIMES.get(cfg.runtime).hooks:
            raise ConfigError(
                f"{' and '.join(needs_sync)} need {runtimes_with('hooks')} "
                f"(got runtime={cfg.runtime}): "
                "asynchronous workers build their own copies from files and names"
            )
        if self._model is not None and self._model_path == IN_MEMORY_MODEL:
            if ADVANTAGES.get(cfg.algorithm.advantage).needs_critic:
                raise ValueError(
                    f"algorithm.advantage={cfg.algorithm.advantage} builds the critic from a "
                    "model folder: save the model (save_pretrained) and pass its path"
                )
            if BACKENDS.get(cfg.rollout.backend).owns_weights:
                raise ValueError(
                    f"rollout.backend={cfg.rollout.backend} loads a model folder: pass a path"
                )

    # -- the model ---------------------------------------------------------------------------
    def _load_policy(self) -> None:
        """The starting policy, loaded once (and then handed to the loop)."""
        from replayrl.models import device
        from replayrl.models.loading import prepare_policy
        from replayrl.run.policy import load_policy

        cfg = self.config
        if self._model is not None:
            if not getattr(self, "_prepared", False):
                self._model, self._tokenizer = prepare_policy(
                    self._model, self._tokenizer, cfg.model, seed=cfg.train.seed
                )
                self._prepared = True
            return
        task_cfg = cfg.task
        demo = TaskConfig()
        if cfg.model.path is None and task_cfg.name != demo.name:
            # the tiny demo model's warm start is built on the default (arithmetic) task
            self.log(
                "model: none given, using the built-in tiny demo model (a character tokenizer "
                "over the arithmetic task's alphabet); pass model=... for real data"
            )
            task_cfg = demo
        where = device.resolve_device(cfg.train.device)
        with torch.random.fork_rng():
            model, self._tokenizer, self._model_path = load_policy(
                cfg.model, task_cfg, log=self.log, seed=cfg.train.seed, device=where
            )
        # loaded here, so placed here: the loop keeps a handed-over object where it is
        self._model = model.to(where)
        self._prepared = True

    def _load_trained(self) -> None:
        from replayrl.run.policy import load_policy
        from replayrl.storage.checkpoint import latest_checkpoint

        ckpt = latest_checkpoint(self.run_dir)
        if ckpt is None:
            raise FileNotFoundError(f"no checkpoint under {self.run_dir}/checkpoints")
        cfg = self.config
        if cfg.model.lora.enabled:
            self._model, self._tokenizer, _ = load_policy(
                cfg.model, cfg.task, log=self.log, adapter=ckpt / "policy"
            )
        else:
            policy = cfg.model.model_copy(update={"path": str(ckpt / "policy")})
            self._model, self._tokenizer, _ = load_policy(policy, cfg.task, log=self.log)
        self._model_path = str(ckpt / "policy")

    @property
    def model(self) -> torch.nn.Module:
        """The policy: the trained one after `train()` (loaded from the last checkpoint when
        the loop loaded it itself), else the starting policy."""
        if self._model is None:
            if self._trained:
                self._load_trained()
            else:
                self._load_policy()
        assert self._model is not None
        return self._model

    @property
    def tokenizer(self) -> Any:
        """The policy's tokenizer (TRL calls it `processing_class`)."""
        self.model  # noqa: B018 - loads it with the model
        return self._tokenizer

    processing_class = tokenizer

    @property
    def run_dir(self) -> Path:
        """The run folder (logging.run_dir / logging.name): metrics, checkpoints, summary."""
        return Path(self.config.logging.run_dir) / self.config.logging.name

    # -- training ----------------------------------------------------------------------------
    def _hooks(self) -> RunHooks:
        return RunHooks(
            task=self._task,
            rewards=self._rewards,
            callbacks=list(self.callbacks),
            run_files=dict(self._run_files),
        )

    def train(
        self, resume_from_checkpoint: bool | str | PathLike[str] | None = None
    ) -> dict[str, Any]:
        """Train; returns the run's summary (also in `summary` and `<run_dir>/summary.json`).

        resume_from_checkpoint: True continues this trainer's run folder from its latest
            checkpoint; a path continues that run folder. The run's own config.yaml is used,
            with this trainer's keyword arguments and overrides applied on top (e.g. a larger
            `max_steps` extends a finished run); the policy comes from the checkpoint.

        Summary keys include initial/final/best_eval_accuracy, steps, rollouts_generated,
        tokens_generated, wall_seconds, run_dir and evals (every evaluation). A callback that
        stops the run early leaves `steps` below the configured `train.steps`.
        """
        from replayrl.run import start as run

        hooks = self._hooks()
        table = self.settings_table()
        if table:  # what the run uses where it is not what was passed or TRL's default
            self.log(table)
        for note in self.notes:  # once, before anything runs
            self.log(f"note (differs from TRL): {note}")
        self._hf = None
        run_dir = self._resume_folder(resume_from_checkpoint) if resume_from_checkpoint else None
        self._preflight(run_dir)
        hooks.train_begin(self.config)
        if run_dir is not None:
            self._check_resumable(run_dir)
            self._model = None  # the checkpoint's policy is trained, not a given object
            self._trained = True
            summary = run.resume(
                run_dir, self.args.override_strings(), log=self.log, hooks=_used(hooks)
            )
            self.config = load_config(run_dir / "config.yaml")
            lg = self.config.logging
            lg.run_dir, lg.name = str(run_dir.parent), run_dir.name
        else:
            if _used(hooks) is not None or self._model is not None:
                self._load_policy()  # once, here: the loop takes this object
                hooks.policy = (self._model, self._tokenizer, self._model_path)
            # nothing handed over: the loop loads everything from the config (the CLI's path)
            summary = run.train(self.config, log=self.log, hooks=_used(hooks))
            self._trained = True
        self.summary = summary
        history = [trl_compat.trl_log(r) for r in self.metrics()]
        self.state = TrainerState(int(summary["steps"]), history)
        if self._hf is not None:
            self._hf[0].log_history = history
        hooks.train_end(summary)
        return summary

    def _preflight(self, run_dir: Path | None) -> None:
        """`train.preflight`: the planned learner memory against the learner GPU, before any
        weights reach it (bench/preflight.py). A policy already loaded or handed over sits
        where it is: its memory is taken, so it is not checked."""
        from replayrl.bench.preflight import preflight

        if run_dir is not None:
            saved = run_dir / "config.yaml"
            if saved.is_file():  # else resume says what is wrong with the folder
                preflight(load_config(saved, self.args.override_strings()), self.log)
        elif self._model is None:
            preflight(self.config, self.log)
        else:
            self.log("train.preflight: the policy is already loaded; its memory is not checked")

    def save_state(self) -> Path:
        """transformers' `Trainer.save_state()`, which TRL scripts call after training:
        `<run_dir>/trainer_state.json` (transformers' TrainerState: `global_step` and
        `max_steps` in replayrl's steps, `log_history` with TRL's key names). The checkpoints'
        own state is `checkpoints/step_N/state.json`."""
        from transformers import TrainerState as HFState

        state = HFState(
            global_step=self.state.global_step,
            max_steps=self.config.train.steps,
            log_history=self.state.log_history,
        )
        path = self.run_dir / "trainer_state.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        state.save_to_json(str(path))
        return path

    def settings_table(self) -> str:
        """Every setting, under TRL's argument names, whose value in this run differs from
        what was passed or (not passed) from TRL's default, with who set it: printed once
        when training starts ('' when nothing differs)."""
        from replayrl.api.settings import settings_table

        return settings_table(self.args, self.config)

    def _resume_folder(self, where: bool | str | PathLike[str]) -> Path:
        """The run folder to resume: this trainer's (True), a run folder, or a checkpoint
        folder inside one (checkpoints/step_N), which must be the newest complete one."""
        from replayrl.storage.checkpoint import latest_checkpoint

        if where is True:
            return self.run_dir
        path = Path(where)
        if path.parent.name != "checkpoints" or (path / "config.yaml").is_file():
            return path
        run_dir = path.parent.parent
        newest = latest_checkpoint(run_dir)
        if newest is None or newest.resolve() != path.resolve():
            raise ValueError(
                f"resume_from_checkpoint={path}: replayrl resumes a run from its newest complete "
                f"checkpoint ({newest}); pass that one or the run folder {run_dir}"
            )
        return run_dir

    def _check_resumable(self, run_dir: Path) -> None:
        saved = run_dir / "config.yaml"
        if not saved.is_file():
            raise FileNotFoundError(f"{run_dir} is not a run folder (no config.yaml)")
        task = load_config(saved).task
        given = [getattr(task.settings, key, None) for key in ("path", "eval_path")]
        paths = [p for p in given if isinstance(p, str) and p.startswith(IN_MEMORY)]
        if paths and self._task is None:
            raise ValueError(
                f"{run_dir} was trained on in-memory rows ({paths[0]}): pass the same "
                "train_dataset (and eval_dataset) to resume it"
            )

    def metrics(self) -> list[dict[str, Any]]:
        """The run's metrics.jsonl records (one per step, plus the step-0 evaluation);
        `state.log_history` holds them with TRL's key names added (`loss`, `reward`, ...)."""
        from replayrl.run.metrics import read_metrics

        return read_metrics(self.run_dir / "metrics.jsonl")

    def evaluate(self, eval_dataset: Any = None) -> dict[str, float]:
        """Greedy pass@1 (and pass@k with `eval.pass_k`) of the current policy.

        eval_dataset: rows to evaluate on (same kinds as the constructor's); None: the run's
        eval split, the first `eval.num_prompts` of it (what the training loop evaluates).
        Returns {"eval/accuracy": ..., "eval/completion_length": ..., ...}.
        """
        from replayrl.models import precision
        from replayrl.models.loading import unwrap_model
        from replayrl.rollout.evaluation import evaluate_policy, held_out_rows
        from replayrl.rollout.generation import HFGenerator
        from replayrl.rollout.prompts import PromptRenderer
        from replayrl.rollout.tasks import DatasetTask, task_from_config

        cfg = self.config
        t = cfg.task
        if eval_dataset is not None:
            task = DatasetTask.to_score(eval_dataset, t)
            rows = task.train_rows()
        else:
            task = self._task if self._task is not None else task_from_config(t)
            rows = held_out_rows(cfg, task)
            if not rows:
                raise ValueError(
                    "evaluate(): this run holds no rows out (none are unless evaluation is "
                    "asked for: eval_strategy='steps', eval__every or task__eval_size): pass "
                    "eval_dataset"
                )
        model, tok = self.model, self.tokenizer  # (loaded once the rows are known)
        gen = HFGenerator(
            unwrap_model(model),
            tok,
            cfg.rollout.decode_batch_size,
            # the precision the run generates (and evaluates) in: precision: auto's choice
            dtype=precision.choose_for(cfg.precision, unwrap_model(model)).generation,
            impl=cfg.rollout.generation_impl,
        )
        render = PromptRenderer(tok, t.chat_template, t.system_prompt)
        metrics = evaluate_policy(cfg, gen, task, rows, render)
        step = int(self.summary["steps"]) if self.summary else 0
        RunHooks(callbacks=list(self.callbacks)).evaluated(step, metrics)
        return metrics

    def save_model(self, output_dir: str | PathLike[str] | None = None) -> Path:
        """Write the policy and tokenizer as a Hugging Face folder (default: <run_dir>/final,
        the folder a run writes at its end), LoRA adapters merged into the weights: a folder
        `from_pretrained` opens without peft."""
        import copy

        from replayrl.models.export import FINAL
        from replayrl.models.loading import atomic_save_pretrained

        dest = Path(output_dir).expanduser() if output_dir is not None else self.run_dir / FINAL
        model = self.model
        if hasattr(model, "merge_and_unload"):  # a peft model: merge a copy, keep training
            model = copy.deepcopy(model).merge_and_unload()
        atomic_save_pretrained(model, self.tokenizer, dest)
        return dest

    def __repr__(self) -> str:
        return f"ReplayTrainer(run_dir={str(self.run_dir)!r}, args={self.args!r})"
