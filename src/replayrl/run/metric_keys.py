"""What each key of metrics.jsonl means, and TRL's name for it where `GRPOTrainer` logs one.

The same names reach TensorBoard and W&B (run/metrics.py). docs/metrics.md is generated from
this catalogue (scripts/gen_metrics_doc.py), and tests/test_metrics_doc.py runs short GRPO,
replay, ReMix and PPO runs and fails when they log a key that no entry here covers: a new
metric is documented where it is produced, or the tests say so.

A key with `<...>` is a pattern: `<...>` stands for one or more path parts (a reward
function's name, a worker id, ...). `trl` is TRL 1.16 `GRPOTrainer`'s key for the same
quantity (or transformers `Trainer`'s: `loss`, `learning_rate`, `grad_norm`), "" when TRL
logs none.
"""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class MetricKey:
    key: str
    meaning: str
    trl: str = ""


_STEP = [
    MetricKey("step", "the step of generation this record belongs to (x axis)"),
    MetricKey("policy_version", "the policy's version: training steps applied to it so far"),
    MetricKey("wall_seconds", "seconds since the run started"),
    MetricKey("rollouts_generated", "completions generated so far (cumulative)"),
    MetricKey("tokens_generated", "completion tokens generated so far (cumulative)"),
    MetricKey(
        "tokens_trained",
        "completion tokens trained on so far, once per pass (cumulative; TRL's `num_tokens` "
        "counts prompt and completion tokens once)",
    ),
    MetricKey("flops/estimated", "estimated FLOPs so far: 2N per generated + 6N per trained token"),
    MetricKey("prompts_skipped_too_long", "prompts skipped because they exceed the prompt limit"),
]
_ROLLOUT = [
    MetricKey(
        "reward/mean", "mean combined (weighted) reward of this step's fresh rollouts", "reward"
    ),
    MetricKey(
        "reward/std",
        "standard deviation of the combined reward over this step's fresh rollouts",
        "reward_std",
    ),
    MetricKey(
        "reward/<name>",
        "mean reward of one reward function (its config name) over fresh rollouts",
        "rewards/<name>/mean",
    ),
    MetricKey(
        "reward_std/<name>",
        "standard deviation of one reward function's values over fresh rollouts",
        "rewards/<name>/std",
    ),
    MetricKey("train/accuracy", "share of fresh rollouts the task's verifier marks correct"),
    MetricKey("completion_length", "mean completion length in tokens", "completions/mean_length"),
    MetricKey(
        "completion_length_terminated",
        "mean length of the completions that ended (end of sequence) in tokens; 0: none did",
        "completions/mean_terminated_length",
    ),
    MetricKey(
        "truncated_frac",
        "share of completions cut at the length limit (no end of sequence)",
        "completions/clipped_ratio",
    ),
    MetricKey(
        "reflection_rate", "share of completions with a reflection word (eval.reflection_words)"
    ),
    MetricKey("rollouts/dropped_reward_error", "rollouts dropped because a reward function raised"),
    MetricKey("rollouts/dropped_reward_timeout", "rollouts dropped because a reward timed out"),
    MetricKey(
        "rollouts/dropped_no_reward", "rollouts skipped because every reward function returned None"
    ),
    MetricKey(
        "signal/frac_reward_zero_std",
        "share of groups whose rewards are all equal (no learning signal)",
        "frac_reward_zero_std",
    ),
    MetricKey("signal/no_signal_steps", "consecutive steps without any learning signal"),
    MetricKey("signal/no_signal_total", "steps without any learning signal so far"),
]
_BATCH = [
    MetricKey("buffer/size", "rollouts held in the buffer after the step"),
    MetricKey("batch/batch_size", "rollouts in this step's training batch"),
    MetricKey("batch/age_mean", "mean age of the batch's rollouts, in policy versions"),
    MetricKey("batch/age_max", "oldest rollout in the batch, in policy versions"),
    MetricKey("batch/distinct_frac", "distinct rollouts / batch size (1: no rollout drawn twice)"),
    MetricKey("batch/times_sampled_mean", "mean number of batches each rollout has been in"),
    MetricKey("batch/times_sampled_max", "most batches one rollout of the batch has been in"),
]
_TRAIN = [
    MetricKey("train/loss", "total loss, mean over updates", "loss"),
    MetricKey("train/policy_loss", "the policy-gradient term of the loss", "policy_loss"),
    MetricKey("train/lr", "learning rate of the step", "learning_rate"),
    MetricKey("train/grad_norm", "gradient norm before clipping", "grad_norm"),
    MetricKey("train/entropy", "mean per-token entropy of the policy on the batch", "entropy"),
    MetricKey(
        "train/clip_frac",
        "share of tokens whose ratio is outside the clip range",
        "clip_ratio/region_mean",
    ),
    MetricKey(
        "train/clip_low_frac",
        "share of tokens clipped below (ratio < 1 - epsilon, negative advantage; grpo_clip)",
        "clip_ratio/low_mean",
    ),
    MetricKey(
        "train/clip_high_frac",
        "share of tokens clipped above (ratio > 1 + epsilon_high, positive advantage; grpo_clip)",
        "clip_ratio/high_mean",
    ),
    MetricKey("train/approx_kl", "k3 estimate of KL(behaviour || current) on the batch"),
    MetricKey("train/ratio_mean", "mean importance ratio pi_theta / pi_old"),
    MetricKey("train/ratio_max", "largest importance ratio"),
    MetricKey(
        "train/ess", "effective sample size / N of the sequence importance weights (1: on-policy)"
    ),
    MetricKey(
        "train/<on_policy|off_policy>/<ratio_mean|clip_frac|ess|tokens>",
        "the ratio statistics split into fresh and stale (replayed) tokens",
    ),
    MetricKey("train/off_policy/shaped_ratio_mean", "ExGRPO: mean shaped ratio w / (w + beta)"),
    MetricKey("train/advantage_abs_max", "largest |advantage| in the batch"),
    MetricKey("train/skipped_updates", "updates skipped for a non-finite gradient"),
    MetricKey("train/kl_lambda", "KL-Convex mixing weight lambda of the step"),
    MetricKey("train/kl_coef_base", "KL coefficient towards the base (reference) model"),
    MetricKey("train/kl_coef_prev", "KL coefficient towards the previous policy"),
    MetricKey("train/kl_to_base", "per-token KL to the reference model", "kl"),
    MetricKey("train/kl_to_prev", "per-token KL to the previous policy"),
    MetricKey("train/kl_term_<base|prev>", "coefficient x KL: that term's size in the loss"),
    MetricKey("train/kl_loss", "the KL penalty term of the loss"),
    MetricKey("train/value_loss", "PPO: the value head's clipped loss"),
    MetricKey("train/value_mse", "PPO: mean squared error of the value head"),
    MetricKey("train/value_clip_frac", "PPO: share of tokens whose value was clipped"),
    MetricKey(
        "train/tis/mean_weight",
        "vLLM mismatch correction: mean truncated importance weight (vllm.truncated_is_cap)",
        "sampling/importance_sampling_ratio/mean",
    ),
    MetricKey("train/tis/truncated_share", "vLLM mismatch correction: share of weights capped"),
]
_TIME_EVAL = [
    MetricKey("time/generation_s", "seconds spent generating this step"),
    MetricKey("time/reward_s", "seconds spent in reward functions this step"),
    MetricKey("time/training_s", "seconds spent training this step"),
    MetricKey("async/learner_idle_s", "async runtimes: seconds the learner waited for rollouts"),
    MetricKey("async/rollouts_lost_worker_died", "async: rollouts lost with a dead generator"),
    MetricKey("async/newest_generator_version", "async: newest policy version a generator used"),
    MetricKey("eval/accuracy", "held-out greedy pass@1 (eval.every)", "eval_accuracy"),
    MetricKey(
        "eval/completion_length",
        "mean held-out completion length",
        "eval_completions/mean_length",
    ),
    MetricKey("eval/pass@<k>", "held-out pass@k at eval.temperature (eval.pass_k)"),
]

# (heading, entries) in the order docs/metrics.md shows them
SECTIONS: tuple[tuple[str, tuple[MetricKey, ...]], ...] = (
    ("Progress", tuple(_STEP)),
    ("Fresh rollouts and rewards", tuple(_ROLLOUT)),
    ("Buffer and training batch", tuple(_BATCH)),
    ("Learner", tuple(_TRAIN)),
    ("Timings, async runtimes and evaluation", tuple(_TIME_EVAL)),
)
CATALOGUE: tuple[MetricKey, ...] = tuple(m for _, entries in SECTIONS for m in entries)


def _regex(pattern: str) -> re.Pattern[str]:
    parts = re.split(r"(<[^>]*>)", pattern)
    out = ""
    for p in parts:
        if p.startswith("<") and "|" in p:
            out += "(?:" + "|".join(re.escape(a) for a in p[1:-1].split("|")) + ")"
        elif p.startswith("<"):
            out += r"[^/]+(?:/[^/]+)*"
        else:
            out += re.escape(p)
    return re.compile(out + r"\Z")


def entry_for(key: str) -> MetricKey | None:
    """The catalogue entry of a logged key: the exact one, else the first pattern that
    matches (None: undocumented)."""
    for m in CATALOGUE:
        if m.key == key:
            return m
    return next((m for m in CATALOGUE if "<" in m.key and _regex(m.key).match(key)), None)
