"""Batch sources: where each step's training batch comes from (`groups.source`).

Each reuse method is one module here holding its config section, its check, its builder and
the counts it keeps; the lines below register them (`replayrl.config.registries.BATCH_SOURCES`)
with the keys of its section a resume may not change (`frozen_on_resume`, read by
`replayrl.records.folder`) and the run counters it adds to (`metrics`: their meaning, summary
key and rollout-ledger term, read by `replayrl.run.state` and `replayrl.records.ledger`). The
schema, the run, the resume check, the ledger, `replayrl presets` and docs/metrics.md read
them from the registry.
"""

from __future__ import annotations

from replayrl.config.registries import BATCH_SOURCES, BatchSourceSpec, SourceCounter
from replayrl.data.sources import ar3po, buffer, exgrpo, group_sources, repo

# the counters the sources below add to (`Counters.add`), declared once, registered with each
# source that adds to them
DISCARDED = SourceCounter(
    "rollouts_discarded",
    "rollouts dropped from ReMix's window when the policy is reincarnated",
    summary_key=None,
    ledger=("discarded_at_reincarnation", "discarded at reincarnation"),
    retired=True,
)
NO_SIGNAL = SourceCounter(
    "rollouts_filtered_no_signal",
    "rollouts dropped with their group for lack of reward variance",
    summary_key=None,
    ledger=("filtered_no_signal", "filtered without reward variance"),
)
SURPLUS = SourceCounter(
    "rollouts_filtered_surplus",
    "rollouts of groups generated beyond the batch and dropped",
    summary_key=None,
    ledger=("filtered_surplus", "surplus groups"),
)
# Only replaying sources add to it and only the summary reads it (replayed rollouts are in no
# ledger term), so it is theirs, not a run-wide counter; every summary still reports it (0
# for a source that never replays): results compare reuse across methods by this key.
REUSED = SourceCounter("rollouts_reused", "stored rollouts trained on again beside fresh ones")
ROUNDS = SourceCounter(
    "generation_rounds",
    "extra rounds of generation to fill a batch",
    summary_key="generation_rounds_extra",
)
SHORT_STEPS = SourceCounter("short_steps", "steps that trained on fewer groups than asked for")

BATCH_SOURCES.add(
    "none",
    BatchSourceSpec(
        buffer.build_buffer_source,
        check=buffer.check_buffer_source,
        metrics=(DISCARDED,),
        summary="the buffer's batches: on-policy or replay (arXiv 2604.08706); ReMix's "
        "mix when remix.enabled (arXiv 2507.06892)",
    ),
)
BATCH_SOURCES.add(
    "dynamic_sampling",
    BatchSourceSpec(
        group_sources.build_dynamic_sampling,
        group_sources.DynamicSamplingConfig,
        group_sources.check_dynamic_sampling,
        (NO_SIGNAL, SURPLUS, ROUNDS, SHORT_STEPS),
        "DAPO's dynamic sampling: drop groups without reward variance, generate more "
        "(arXiv 2503.14476)",
        frozen_on_resume=("carry_surplus",),  # the carried groups are in the checkpoint
    ),
)
BATCH_SOURCES.add(
    "group_replay",
    BatchSourceSpec(
        group_sources.build_group_replay,
        group_sources.GroupReplayConfig,
        group_sources.check_group_replay,
        (NO_SIGNAL, REUSED),
        "TRL's former replay trainer: zero-std groups replaced by stored high-spread ones",
        frozen_on_resume=("capacity",),  # the checkpointed group store's size
    ),
)
BATCH_SOURCES.add(
    "ar3po",
    BatchSourceSpec(
        ar3po.build_ar3po,
        ar3po.Ar3poConfig,
        ar3po.check_ar3po,
        (ROUNDS, REUSED),
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
        (ROUNDS, REUSED),
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
        (REUSED,),
        "RePO: per-prompt replay buffers, earlier responses retrieved by a replay strategy "
        "and trained beside the fresh ones (arXiv 2506.09340)",
        # the prompt pool (drawn once, its pass order checkpointed) and the buffers' bounds
        frozen_on_resume=("prompt_pool", "buffer_size", "max_prompts"),
    ),
)
