"""Reuse methods: each step's training batch, one registry entry per method (`method.name`).

Each method is one module here holding its config section, its check, its builder and the
counts it keeps; the lines below register them (`replayrl.config.registries.METHODS`) with
what the rest of the run reads from the entry alone: the buffer its rollouts go through, the
loss and advantage it needs, the keys of its section a resume may not change
(`frozen_on_resume`, read by `replayrl.run.records.folder`), the run counters it adds to
(`metrics`: their meaning, summary key and rollout-ledger term, read by `replayrl.run.state`
and `replayrl.run.records.ledger`) and its budget rule (read by the benchmarks). The schema, the
run, the resume check, the ledger, `replayrl presets` and docs/metrics.md read them from the
registry; nothing outside this package names a method.
"""

from __future__ import annotations

from replayrl.config.registries import METHODS, MethodSpec, SourceCounter
from replayrl.methods import ar3po, buffer, exgrpo, group_sources, remix, repo, signal_replay

# the counters the methods below add to (`Counters.add`), declared once, registered with each
# method that adds to them
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
# Only replaying methods add to it and only the summary reads it (replayed rollouts are in no
# ledger term), so it is theirs, not a run-wide counter; every summary still reports it (0
# for a method that never replays): results compare reuse across methods by this key.
REUSED = SourceCounter("rollouts_reused", "stored rollouts trained on again beside fresh ones")
ROUNDS = SourceCounter(
    "generation_rounds",
    "extra rounds of generation to fill a batch",
    summary_key="generation_rounds_extra",
)
SHORT_STEPS = SourceCounter("short_steps", "steps that trained on fewer groups than asked for")

METHODS.add(
    "onpolicy",
    MethodSpec(
        buffer.build_buffer_source,
        summary="on-policy GRPO / PPO: each step trains on its fresh rollouts, train.epochs passes",
        steady_batch=lambda cfg: True,
    ),
)
METHODS.add(
    "replay",
    MethodSpec(
        buffer.build_buffer_source,
        summary="experience replay: a FIFO buffer of the last N rollouts, B sampled each step "
        "(arXiv 2604.08706)",
        buffer="replay",
        steady_batch=lambda cfg: True,
    ),
)
METHODS.add(
    "remix",
    MethodSpec(
        remix.build_remix,
        remix.RemixConfig,
        remix.check_remix,
        (DISCARDED,),
        "ReMix: Mix-PPG over fresh and recent policies' rollouts, then policy reincarnation "
        "(arXiv 2507.06892)",
        # the window's size and staleness bound are the checkpointed window's
        frozen_on_resume=("num_policies",),
        loss="mix_ppg",
        loss_strict=True,
        single_learner=True,  # one window of recent policies' rollouts, beside one learner
        budget_is_steps=remix.steps_budget,
        passes_key="method.remix.utd",
        steady_batch=remix.steady_batch,
        passes_change=remix.passes_change,
    ),
)
METHODS.add(
    "dynamic_sampling",
    MethodSpec(
        group_sources.build_dynamic_sampling,
        group_sources.DynamicSamplingConfig,
        group_sources.check_dynamic_sampling,
        (NO_SIGNAL, SURPLUS, ROUNDS, SHORT_STEPS),
        "DAPO's dynamic sampling: drop groups without reward variance, generate more "
        "(arXiv 2503.14476)",
        frozen_on_resume=("carry_surplus",),  # the carried groups are in the checkpoint
        varying_generation=True,
        lockstep=True,  # the batch is decided from the step's fresh groups
        advantage="grpo",  # with GRPO's group advantages
    ),
)
METHODS.add(
    "group_replay",
    MethodSpec(
        group_sources.build_group_replay,
        group_sources.GroupReplayConfig,
        group_sources.check_group_replay,
        (NO_SIGNAL, REUSED),
        "TRL's former replay trainer: zero-std groups replaced by stored high-spread ones",
        frozen_on_resume=("capacity",),  # the checkpointed group store's size
        lockstep=True,  # the batch is decided from the step's fresh groups
        advantage="grpo",  # with GRPO's group advantages
    ),
)
METHODS.add(
    "ar3po",
    MethodSpec(
        ar3po.build_ar3po,
        ar3po.Ar3poConfig,
        ar3po.check_ar3po,
        (ROUNDS, REUSED),
        "AR3PO: adaptive rollout in rounds and reuse of stored correct responses "
        "(arXiv 2509.25808)",
        # the checkpointed store's bounds: a smaller one would keep more than it allows
        frozen_on_resume=("store_per_prompt", "store_prompts"),
        varying_generation=True,
        lockstep=True,  # the batch is decided from the step's fresh groups
        advantage="grpo",  # with GRPO's group advantages
    ),
)
METHODS.add(
    "exgrpo",
    MethodSpec(
        exgrpo.build_exgrpo,
        exgrpo.ExgrpoConfig,
        exgrpo.check_exgrpo,
        (ROUNDS, REUSED),
        "ExGRPO: bucketed replay of successful trajectories, lowest entropy first "
        "(arXiv 2510.02245)",
        # the checkpointed store's bounds: a smaller one would keep more than it allows
        frozen_on_resume=("store_per_question", "store_questions"),
        loss="exgrpo",  # another loss trains replayed trajectories without policy shaping
        varying_generation=True,
        lockstep=True,  # the batch is decided from the step's fresh groups
        advantage="grpo",  # with GRPO's group advantages
    ),
)
METHODS.add(
    "repo",
    MethodSpec(
        repo.build_repo,
        repo.RepoConfig,
        repo.check_repo,
        (REUSED,),
        "RePO: per-prompt replay buffers, earlier responses retrieved by a replay strategy "
        "and trained beside the fresh ones (arXiv 2506.09340)",
        # the prompt pool (drawn once, its pass order checkpointed) and the buffers' bounds
        frozen_on_resume=("prompt_pool", "buffer_size", "max_prompts"),
        loss="grpo_clip",  # its off-policy term: GRPO's clipped ratio to the stored policy
        lockstep=True,  # the batch is decided from the step's fresh groups
        advantage="grpo",  # with GRPO's group advantages
    ),
)
METHODS.add(
    "signal_replay",
    MethodSpec(
        signal_replay.build_signal_replay,
        signal_replay.SignalReplayConfig,
        signal_replay.check_signal_replay,
        (
            NO_SIGNAL,
            REUSED,
            SourceCounter(
                "signal_fill_steps", "steps whose batch was filled with stored signal groups"
            ),
            SourceCounter(
                "signal_evicted_age",
                "stored signal groups evicted past method.signal_replay.window versions old",
            ),
            SourceCounter(
                "signal_evicted_uses",
                "stored signal groups evicted after method.signal_replay.max_uses trainings",
            ),
            SourceCounter(
                "signal_evicted_ess",
                "stored signal groups evicted for a sequence ESS below "
                "method.signal_replay.min_ess",
            ),
            SourceCounter(
                "signal_skipped_steps",
                "steps with nothing to train: no fresh group with reward variance, none stored",
            ),
        ),
        "signal replay: groups without reward variance dropped, stored signal groups replayed "
        "while fresh signal is below a target (arXiv 2503.14476, 2507.06892)",
        # the store's contents: each group's age and remaining uses were decided under these
        frozen_on_resume=("window", "max_uses"),
        loss="mix_ppg",  # replayed groups clipped around pi_k / pi_beh (ReMix's Mix-PPG)
        loss_strict=True,
        single_learner=True,  # one store beside one learner, its ESS from that learner
        lockstep=True,  # the batch is decided from the step's fresh groups
        advantage="grpo",  # with GRPO's group advantages, stored with each group
    ),
)
