"""Batch sources: where each step's training batch comes from (`groups.source`).

Each reuse method is one module here holding its config section, its check, its builder and
its metrics (the run's counters it adds to: `replayrl.run.state.Counters`); the lines below
register them (`replayrl.config.registries.BATCH_SOURCES`) with the keys of its section a
resume may not change (`frozen_on_resume`, read by `replayrl.records.folder`) and its
rollout-ledger terms (`ledger`, read by `replayrl.records.ledger`). The schema, the run, the
resume check, the ledger and `replayrl presets` read them from the registry.
"""

from __future__ import annotations

from replayrl.config.registries import BATCH_SOURCES, BatchSourceSpec
from replayrl.data.sources import ar3po, buffer, exgrpo, group_sources, repo

BATCH_SOURCES.add(
    "none",
    BatchSourceSpec(
        buffer.build_buffer_source,
        check=buffer.check_buffer_source,
        metrics=("rollouts_discarded",),  # ReMix's window, dropped at reincarnation
        summary="the buffer's batches: on-policy or replay (arXiv 2604.08706); ReMix's "
        "mix when remix.enabled (arXiv 2507.06892)",
    ),
)
# the ledger terms of rollouts a group source generates but never pushes to a buffer
NO_SIGNAL = (
    "rollouts_filtered_no_signal",
    "filtered_no_signal",
    "filtered without reward variance",
)
SURPLUS = ("rollouts_filtered_surplus", "filtered_surplus", "surplus groups")

BATCH_SOURCES.add(
    "dynamic_sampling",
    BatchSourceSpec(
        group_sources.build_dynamic_sampling,
        group_sources.DynamicSamplingConfig,
        group_sources.check_dynamic_sampling,
        (
            "rollouts_filtered_no_signal",
            "rollouts_filtered_surplus",
            "generation_rounds",
            "short_steps",
        ),
        "DAPO's dynamic sampling: drop groups without reward variance, generate more "
        "(arXiv 2503.14476)",
        frozen_on_resume=("carry_surplus",),  # the carried groups are in the checkpoint
        ledger=(NO_SIGNAL, SURPLUS),
    ),
)
BATCH_SOURCES.add(
    "group_replay",
    BatchSourceSpec(
        group_sources.build_group_replay,
        group_sources.GroupReplayConfig,
        group_sources.check_group_replay,
        ("rollouts_filtered_no_signal", "rollouts_reused"),
        "TRL's former replay trainer: zero-std groups replaced by stored high-spread ones",
        frozen_on_resume=("capacity",),  # the checkpointed group store's size
        ledger=(NO_SIGNAL,),
    ),
)
BATCH_SOURCES.add(
    "ar3po",
    BatchSourceSpec(
        ar3po.build_ar3po,
        ar3po.Ar3poConfig,
        ar3po.check_ar3po,
        ("generation_rounds", "rollouts_reused"),
        "AR3PO: adaptive rollout in rounds and reuse of stored correct responses "
        "(arXiv 2509.25808)",
        # the checkpointed store's bounds: a smaller one would keep more than it allows
        frozen_on_resume=("store_per_prompt", "store_prompts"),
    ),
)
BATCH_SOURCES.add(
    "exgrpo",
    BatchSourceSpec(
        exgrpo.build_exgrpo,
        exgrpo.ExgrpoConfig,
        exgrpo.check_exgrpo,
        ("generation_rounds", "rollouts_reused"),
        "ExGRPO: bucketed replay of successful trajectories, lowest entropy first "
        "(arXiv 2510.02245)",
        # the checkpointed store's bounds: a smaller one would keep more than it allows
        frozen_on_resume=("store_per_question", "store_questions"),
    ),
)
BATCH_SOURCES.add(
    "repo",
    BatchSourceSpec(
        repo.build_repo,
        repo.RepoConfig,
        repo.check_repo,
        ("rollouts_reused",),
        "RePO: per-prompt replay buffers, earlier responses retrieved by a replay strategy "
        "and trained beside the fresh ones (arXiv 2506.09340)",
        # the prompt pool (drawn once, its pass order checkpointed) and the buffers' bounds
        frozen_on_resume=("prompt_pool", "buffer_size", "max_prompts"),
    ),
)
