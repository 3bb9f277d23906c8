"""The registries that the config's method and task names are checked against.

`METHODS` (method.name: the reuse method that decides each step's training batch: on-policy,
replay, ReMix, DAPO's dynamic sampling, AR3PO, ExGRPO, RePO, ...) and `TASKS` (task.name)
live here, at the config's layer, so the schema can list and validate what they hold. Their
entries are added by the layers that implement them (`replayrl.methods`,
`replayrl.rollout.tasks`): the arrow of registration points down. The registry imports those
provider packages by name the first time it is asked (`replayrl.registry`, which also loads
installed plugins' entry points), so a config is never checked against a half-filled registry.

A task declares its settings the same way, under `task.<name>`. Generation backends and
runtimes declare theirs as top-level sections (`vllm`, `ray`: `BackendSpec.section`,
`RuntimeSpec.section`), so nothing central names an engine or a cluster.

A new reuse method is one module that defines its config section (a `Section`), its check
over the whole config, its builder and its counters, and one `METHODS.add(...)` line.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from replayrl.config.section import Section
from replayrl.registry import Registry


@dataclass(frozen=True)
class SourceCounter:
    """A run counter a method adds to (`Counters.add(name, n)`; saved in checkpoints).

    name: what the method adds to, and the run reads (`Counters.count(name)`).
    meaning: one line for docs/metrics.md.
    summary_key: its key at summary.json's top level ("": its name; None: reported only as
        its ledger term). Every summary has the counters of every registered method (0 where
        the run's method has none), so runs of different methods compare key by key.
    ledger: (term, phrase) when it counts rollouts that are in no buffer: its term in the
        rollout ledger and its phrase in the end-of-run report, so the ledger balances.
    retired: with `ledger`, the rollouts it counts were pushed to a buffer the method then
        dropped (`Counters.retire`); otherwise they were generated and never pushed.
    """

    name: str
    meaning: str
    summary_key: str | None = ""
    ledger: tuple[str, str] | None = None
    retired: bool = False

    def __post_init__(self) -> None:
        if self.summary_key is None and self.ledger is None:
            raise ValueError(f"counter {self.name!r}: summary_key=None needs a ledger term")
        if self.retired and self.ledger is None:
            raise ValueError(f"counter {self.name!r}: retired=True needs a ledger term")

    @property
    def reported_as(self) -> str | None:
        """Its summary.json key (None: only its ledger term)."""
        return self.name if self.summary_key == "" else self.summary_key


@dataclass(frozen=True)
class MethodSpec:
    """A reuse method as the run sees it: everything the run, the schema, the resume check,
    the ledger and the benchmarks need to know of it, so that nothing central names it.

    build: `(SourceContext) -> BatchSource` (`replayrl.methods.base`).
    config: its section, under `method.<name>` (None: it has no settings of its own).
    check: `(Config) -> None`, raising ValueError for settings it cannot run with (the
        runtime, the batch size...); called when the config selects it.
    metrics: the run counters it adds to (`SourceCounter`s: the one place that lists them;
        the run refuses a count of any other name), reported in summary.json and listed by
        `replayrl presets`.
    summary: one line for `replayrl presets`, the docs and error messages.
    frozen_on_resume: the keys its checkpointed state depends on (a store's bounds, a prompt
        pool's size), which a resume may not change: names in its `method.<name>` section,
        or full dotted keys. Any other key of its section must resume and train.
    buffer: the kind of buffer its rollouts go through (`make_buffer`): "onpolicy" (the
        freshest, removed once trained on) or "replay" (a FIFO sampled without removal,
        `buffer.capacity` rollouts).
    loss: the policy loss it is built for (`algorithm.loss_type`): used when the config
        gives none; another one is refused when `loss_strict`, else trained with a warning.
    advantage: the advantage estimator it needs (`algorithm.advantage`; None: any).
    lockstep: it decides a step's batch from that step's fresh groups, so it needs a runtime
        whose generation and training alternate (`RuntimeSpec.lockstep`).
    single_learner: it keeps one state beside the learner (a window of recent policies'
        rollouts) and so runs one learner (workers.learners=1).
    varying_generation: it generates more than R rollouts in some steps (extra rounds,
        replayed questions' fresh completions): a benchmark must say why its rollout budget
        is its own.
    budget_is_steps: `(Config) -> bool`, whether train.steps x R is the run's generated
        budget (None: always); False e.g. when mixing steps generate fewer than R.
    passes_key: the dotted key of its passes over each batch (TRL's `num_iterations`).
    steady_batch: `(Config) -> bool`, whether every step trains on the same number of
        rollouts, B (None: never; its batch is built from the groups it keeps), so that TRL's
        step counts, which count optimizer updates, follow from the config.
    passes_change: `(Config) -> str | None`, why its passes over each batch change during a
        run (None: they never do), e.g. ReMix's after policy reincarnation.
    """

    build: Callable[[Any], Any]
    config: type[Section] | None = None
    check: Callable[[Any], None] | None = None
    metrics: tuple[SourceCounter, ...] = ()
    summary: str = ""
    frozen_on_resume: tuple[str, ...] = ()
    buffer: Literal["onpolicy", "replay"] = "onpolicy"
    loss: str | None = None
    loss_strict: bool = False
    advantage: str | None = None
    lockstep: bool = False
    single_learner: bool = False
    varying_generation: bool = False
    budget_is_steps: Callable[[Any], bool] | None = None
    passes_key: str = "train.epochs"
    steady_batch: Callable[[Any], bool] | None = None
    passes_change: Callable[[Any], str | None] | None = None

    def __post_init__(self) -> None:
        bad = [m for m in self.metrics if not isinstance(m, SourceCounter)]
        if bad:
            raise TypeError(
                f"MethodSpec.metrics takes SourceCounter entries (a name and its "
                f"meaning), not {bad[0]!r}"
            )


@dataclass(frozen=True)
class TaskSpec:
    """A task as the run sees it: `build(TaskConfig) -> Task`; `make(**kwargs) -> Task` for
    `make_task`; `check(TaskConfig)` raises ValueError for settings it cannot run with.
    `config`: its settings section, under `task.<name>` (None: only the settings every task
    has: seed, eval_size, chat_template, system_prompt), read as `TaskConfig.settings`.

    For the built-in tiny model's warm start (run/warmstart.py): `warmstart_fields`, the
    keys its cached warm start depends on, by name: the common `task.*` ones and those of its
    own section (None: all of them), and `tiny_check`, which refuses settings that warm start
    cannot give a usable start policy for.
    `frozen_on_resume`: the keys a resume may not change (its checkpointed state depends on
    them): names in its `task.<name>` section, or full dotted keys.

    For reports (`replayrl eval`, bench reports): `describe(TaskConfig) -> str`, its settings in
    a few words (None: its name), and `data_file(TaskConfig) -> str | None`, the file of the
    user's it reads (None: a built-in generated task)."""

    build: Callable[[Any], Any]
    make: Callable[..., Any]
    check: Callable[[Any], None] | None = None
    summary: str = ""
    config: type[Section] | None = None
    warmstart_fields: frozenset[str] | None = None
    tiny_check: Callable[[Any], None] | None = None
    frozen_on_resume: tuple[str, ...] = ()
    describe: Callable[[Any], str] | None = None
    data_file: Callable[[Any], str | None] | None = None


@dataclass(frozen=True)
class BackendSpec:
    """A generation backend (`rollout.backend`) as the run sees it.

    build: `(cfg, model, tokenizer, model_path, *, max_prompt_len, worker_offset, stop_ids)
        -> Generator` (`replayrl.rollout.generation.base`); `model` is the transformers model.
    own_logprobs: it samples with its own kernels (and dtype), so its log-probs are never the
        learner's: under precision.recompute_behaviour_logprobs=auto the learner recomputes
        log pi_old in its own precision.
    truncated_is_cap: `(Config) -> float | None`, the truncated-IS cap C that applies when
        precision.truncated_is_cap is unset (None: no default correction).
    needs_gpu: it runs only on a CUDA GPU (a Ray generator actor must be given one).
    owns_weights: it holds its own copy of the weights, loaded from the model folder (so it
        needs a path, not an in-memory model); a process that only trains builds `fallback`
        (a backend name) for its evaluations instead.
    context_bound: `(Config) -> bool`, whether the run measures the longest prompt it keeps
        and passes it as `max_prompt_len` (None: never).
    frames: path fragments of the code that runs its generation (and its device memory): an
        out-of-memory error raised in one of them is reported as generation's.
    memory_knobs: the settings that lower its memory, for that report.
    check: `(Config) -> None`, raising ValueError for settings it cannot run with (the
        runtime, the number of generator workers...); called when the config selects it.
    section: `(name, model)`, its settings as a top-level section of the config (`vllm`),
        validated by `model` (a `Section`) in every config, selected or not, so a preset
        can carry them; backends that share one section give the same pair. None: it has
        no settings of its own.
    summary: one line for the docs and error messages.
    """

    build: Callable[..., Any]
    own_logprobs: bool = False
    truncated_is_cap: Callable[[Any], float | None] | None = None
    owns_weights: bool = False
    needs_gpu: bool = False
    fallback: str | None = None
    context_bound: Callable[[Any], bool] | None = None
    frames: tuple[str, ...] = ("/rollout/generation/",)
    memory_knobs: str = "rollout.decode_batch_size (generation)"
    check: Callable[[Any], None] | None = None
    section: tuple[str, type[Section]] | None = None
    summary: str = ""


@dataclass(frozen=True)
class RuntimeSpec:
    """A runtime (`runtime`) as the run sees it.

    start: `(cfg, run_dir, log, resume, hooks) -> (() -> summary)`: builds the run's session
        and returns the call that runs its loop.
    lockstep: generation and training alternate in one process (the synchronous loop): what
        needs a step's fresh rollouts before its update (a rollout budget, `auto` design, the
        fixed ReMix composition, group-level methods) needs it; otherwise generators
        run beside learners (`workers.*`) and their clocks are measured.
    hooks: it takes objects from the Python API (a model, a dataset, reward callables,
        callbacks); otherwise its workers build their own from files and names.
    multi_learner: it runs workers.learners > 1 data-parallel learners.
    section: `(name, model)`, its settings as a top-level section of the config (`ray`), as
        `BackendSpec.section`.
    summary: one line for the docs and error messages.
    """

    start: Callable[..., Callable[[], dict[str, Any]]]
    lockstep: bool = False
    hooks: bool = False
    multi_learner: bool = False
    section: tuple[str, type[Section]] | None = None
    summary: str = ""


@dataclass(frozen=True)
class SamplerSpec:
    """A replay buffer's sampler (`buffer.sampler`): `build(delta) -> Sampler`
    (`replayrl.data.buffer.samplers`: how many of the buffer's N slots form a reserve).
    uses_delta: buffer.delta is its parameter (else a nonzero delta is refused)."""

    build: Callable[[float], Any]
    uses_delta: bool = False
    summary: str = ""


METHODS: Registry[MethodSpec] = Registry("method", "method.name", ("replayrl.methods",))
TASKS: Registry[TaskSpec] = Registry("task", "task.name", ("replayrl.rollout.tasks",))
BACKENDS: Registry[BackendSpec] = Registry(
    "generation backend", "rollout.backend", ("replayrl.rollout.generation.backends",)
)
SAMPLERS: Registry[SamplerSpec] = Registry(
    "sampler", "buffer.sampler", ("replayrl.data.buffer.samplers",)
)
# reward functions by name, TRL's signature `f(prompts, completions, **columns)`
REWARDS: Registry[Callable[..., Any]] = Registry(
    "reward function",
    "rewards.name",
    ("replayrl.rollout.rewards.builtin",),
    hint="; or give your own as path/to/file.py:function",
)
RUNTIMES: Registry[RuntimeSpec] = Registry("runtime", "runtime", ("replayrl.run.runtimes",))


def owned_sections() -> dict[str, type[Section]]:
    """The top-level config sections the registered backends and runtimes declare (`vllm`,
    `ray`), by name; TypeError for one name declared with two models."""
    out: dict[str, type[Section]] = {}
    owners: dict[str, str] = {}
    entries = [(f"rollout.backend={n}", s.section) for n, s in BACKENDS.items()]
    entries += [(f"runtime={n}", s.section) for n, s in RUNTIMES.items()]
    for owner, section in entries:
        if section is None:
            continue
        name, model = section
        if out.setdefault(name, model) is not model:
            raise TypeError(
                f"{owner} declares the config section {name!r} with {model.__name__}, but "
                f"{owners[name]} declares it with {out[name].__name__}: one section, one model"
            )
        owners.setdefault(name, owner)
    return out


def runtimes_with(feature: str) -> str:
    """'runtime=sync' (or 'runtime=a or runtime=b'): the runtimes whose spec has `feature`
    (lockstep, hooks, multi_learner), for error messages."""
    names = [name for name, spec in RUNTIMES.items() if getattr(spec, feature)]
    return " or ".join(f"runtime={name}" for name in names) or f"a runtime with {feature}"
