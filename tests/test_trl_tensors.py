"""replayrl's losses against TRL 1.16 GRPOTrainer's own loss code on identical tensors.

TRL's `_compute_loss` runs unchanged on a stand-in trainer that hands it fixed per-token
log-probs (its model forward is the only part replaced), so a difference in the ratio, the
clipping or the aggregation shows up as a different loss or gradient."""

from __future__ import annotations

from collections import defaultdict
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from replayrl.algorithms.losses import grpo_clip_loss

trl = pytest.importorskip("trl")


class _Accelerator:
    num_processes = 1

    def gather(self, x: torch.Tensor) -> torch.Tensor:
        return x

    gather_for_metrics = gather

    def reduce(self, x: torch.Tensor, reduction: str = "sum") -> torch.Tensor:
        return x


class _TRL:
    """The attributes TRL's `_compute_loss` reads, with the forward replaced by `logprobs`."""

    def __init__(self, logprobs: torch.Tensor, level: str, eps: float, eps_high: float) -> None:
        self.logprobs = logprobs
        self.importance_sampling_level = level
        self.loss_type = "grpo"
        self.epsilon_low, self.epsilon_high = eps, eps_high
        self.beta = 0.0
        self.top_entropy_quantile = 1.0
        self.aux_loss_enabled = False
        self.off_policy_mask_threshold = None
        self.use_vllm = False
        self._entropy_bonus_enabled = False
        self.current_gradient_accumulation_steps = 1
        self.model = SimpleNamespace(training=True)
        self.args = SimpleNamespace(delta=None, use_bias_correction_kl=False)
        self.accelerator = _Accelerator()
        self._metrics: dict[str, Any] = defaultdict(lambda: defaultdict(list))

    def _get_per_token_logps_and_entropies(self, *a: Any, **k: Any):
        return self.logprobs, torch.zeros_like(self.logprobs), None


def _tensors(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    B, T = 6, 7
    old = -torch.rand(B, T, generator=g) * 2
    # ratios far enough from 1, per token and per sequence, that both levels clip somewhere
    drift = torch.randn(B, T, generator=g) * 0.4 + torch.randn(B, 1, generator=g) * 0.3
    logprobs = (old + drift).requires_grad_(True)
    mask = torch.ones(B, T)
    for i, n in enumerate([7, 3, 5, 1, 6, 4]):  # completions of different lengths
        mask[i, n:] = 0
    adv = torch.randn(B, generator=g)
    return logprobs, old, adv, mask


def _trl_loss(level: str, logprobs, old, adv, mask, eps=0.2, eps_high=0.28):
    B, T = mask.shape
    inputs = {
        "prompt_ids": torch.zeros(B, 2, dtype=torch.long),
        "prompt_mask": torch.ones(B, 2, dtype=torch.long),
        "completion_ids": torch.zeros(B, T, dtype=torch.long),
        "completion_mask": mask,
        "advantages": adv,
        "old_per_token_logps": old,
    }
    stub = _TRL(logprobs, level, eps, eps_high)
    return trl.GRPOTrainer._compute_loss(stub, None, inputs), stub._metrics["train"]


@pytest.mark.parametrize("level", ["token", "sequence"])
def test_grpo_clip_matches_trls_loss_and_gradient(level: str) -> None:
    """TRL's loss_type='grpo' (mean over each sequence's tokens, then over sequences) is
    loss_agg=seq_mean; importance_sampling_level='sequence' is GSPO's ratio."""
    logprobs, old, adv, mask = _tensors()
    theirs, metrics = _trl_loss(level, logprobs, old, adv, mask)
    (g_theirs,) = torch.autograd.grad(theirs, logprobs)
    ours, _ = grpo_clip_loss(
        logprobs,
        old,
        adv,
        mask,
        epsilon=0.2,
        epsilon_high=0.28,
        importance_sampling_level=level,
        loss_agg="seq_mean",
    )
    (g_ours,) = torch.autograd.grad(ours, logprobs)
    torch.testing.assert_close(ours, theirs, rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(g_ours, g_theirs, rtol=1e-5, atol=1e-7)
    assert metrics["clip_ratio/region_mean"][0] > 0  # the tensors exercise the clipping
    if level == "token":  # TRL's clip_ratio/* (per token; at sequence level per sequence)
        _, mine = grpo_clip_loss(logprobs, old, adv, mask, epsilon=0.2, epsilon_high=0.28)
        for ours_key, trl_key in (
            ("clip_frac", "clip_ratio/region_mean"),
            ("clip_low_frac", "clip_ratio/low_mean"),
            ("clip_high_frac", "clip_ratio/high_mean"),
        ):
            assert mine[ours_key] == pytest.approx(metrics[trl_key][0], abs=1e-7), ours_key
        assert mine["clip_low_frac"] > 0 and mine["clip_high_frac"] > 0


def test_the_sequence_ratio_differs_from_the_token_ratio_on_these_tensors() -> None:
    """(Else the parity above would hold with the level ignored.)"""
    logprobs, old, adv, mask = _tensors()
    token, _ = grpo_clip_loss(logprobs, old, adv, mask, loss_agg="seq_mean")
    seq, _ = grpo_clip_loss(
        logprobs, old, adv, mask, loss_agg="seq_mean", importance_sampling_level="sequence"
    )
    assert abs(float(token) - float(seq)) > 1e-3


# -- sampling: top_k, min_p, repetition_penalty ------------------------------------------------
@pytest.mark.parametrize(
    "knobs",
    [
        {"top_k": 5},
        {"min_p": 0.15},
        {"repetition_penalty": 1.7},
        {"temperature": 0.7, "top_k": 9, "top_p": 0.8, "min_p": 0.05, "repetition_penalty": 1.3},
    ],
)
def test_the_sampled_distribution_is_transformers_generates(tiny_model, knobs: dict) -> None:
    """TRL samples with transformers' generate: its logits processors for these settings,
    built by transformers itself, give the distribution `sampling_probs` draws from."""
    from transformers import GenerationConfig

    from replayrl.rollout.generation.sampling import sampling_probs

    g = torch.Generator().manual_seed(3)
    vocab = tiny_model.config.vocab_size
    ids = torch.randint(0, vocab, (4, 6), generator=g)  # prompt and completion so far
    logits = torch.randn(4, vocab, generator=g) * 3
    gen_cfg = GenerationConfig(do_sample=True, **{"top_k": 0, **knobs})
    processors = tiny_model._get_logits_processor(gen_cfg, input_ids_seq_length=6, device="cpu")
    theirs = torch.softmax(processors(ids, logits.clone()), dim=1)
    seen = torch.zeros(4, vocab, dtype=torch.bool).scatter_(1, ids, True)
    ours = sampling_probs(
        logits,
        knobs.get("temperature", 1.0),
        knobs.get("top_p", 1.0),
        knobs.get("top_k", 0),
        knobs.get("min_p", 0.0),
        knobs.get("repetition_penalty", 1.0),
        seen,
    )
    ours = ours / ours.sum(1, keepdim=True)
    torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-7)
    assert ((theirs > 0).sum(1) < vocab).all() or "repetition_penalty" in knobs  # it filtered


@pytest.mark.parametrize("impl", ["fast", "fast_hf", "generate"])
def test_each_decoder_applies_the_filters_and_tracks_seen_tokens(
    tiny_model, char_tokenizer, impl: str
) -> None:
    """top_k=1 and min_p=1 keep only the most likely token: greedy's completions; a huge
    repetition penalty with top_k=1 never picks a token of the prompt or one already
    picked, through the decoder's compaction of finished rows too."""
    from replayrl.rollout.generation import HFGenerator, SamplingParams

    gen = HFGenerator(tiny_model, char_tokenizer, impl=impl)
    prompts = ["12+34=", "7+80=", "99+1="]
    greedy = gen.generate(prompts, 1, SamplingParams(max_new_tokens=6, greedy=True))
    for knobs in ({"top_k": 1}, {"min_p": 1.0}):
        got = gen.generate(prompts, 2, SamplingParams(max_new_tokens=6, **knobs))
        assert [s.completion_ids.tolist() for s in got[::2]] == [
            s.completion_ids.tolist() for s in greedy
        ]
    # (the stored log-prob stays the untruncated policy's: below 0, not log 1)
    assert all(float(s.logprobs.max()) < 0 for s in got)
    fresh = gen.generate(
        prompts, 2, SamplingParams(max_new_tokens=6, top_k=1, repetition_penalty=1e4)
    )
    for s in fresh:
        toks = s.completion_ids.tolist()
        stops = set(gen.stop_ids)
        body = [t for t in toks if t not in stops]
        assert len(set(body)) == len(body), toks
        assert not set(body) & set(s.prompt_ids.tolist()), (toks, s.prompt_ids.tolist())


def _one_step(run: Any, **kw: Any) -> Any:
    """One step of 2 prompts x 4 completions of up to 3 tokens on the tiny model."""
    from replayrl.api.config import ReplayConfig
    from tiny import TINY_MODEL

    quiet = ["logging.tensorboard=false", "logging.progress=false"]
    return ReplayConfig(
        "grpo",
        output_dir=str(run),
        max_steps=1,
        num_generations=4,
        generation_batch_size=8,
        max_completion_length=3,
        overrides=[*TINY_MODEL, *quiet],
        **kw,
    )


def test_log_history_has_trls_metric_names_with_trls_values(tmp_path) -> None:
    """A run's records under TRL's names (trainer.state.log_history): the completions'
    clipped ratio and terminated length, the reward's and each function's std, the clip
    ratios, the share of groups without signal."""
    import statistics

    from replayrl.api.trainer import ReplayTrainer
    from replayrl.rollout.tasks import ArithmeticTask

    rows = ArithmeticTask().sample_train(20, __import__("numpy").random.default_rng(0))
    seen: list[list[float]] = []

    def half(completions, **kwargs):
        out = [float(len(c) % 2) for c in completions]
        seen.append(out)
        return out

    args = _one_step(tmp_path / "r", rollout__reward_isolation="thread")
    trainer = ReplayTrainer(reward_funcs=half, args=args, train_dataset=rows, log=lambda _: None)
    trainer.train()
    (log,) = trainer.state.log_history
    for key in (
        "completions/clipped_ratio",
        "completions/mean_terminated_length",
        "clip_ratio/region_mean",
        "clip_ratio/low_mean",
        "clip_ratio/high_mean",
        "frac_reward_zero_std",
        "reward_std",
        "rewards/half/mean",
        "rewards/half/std",
    ):
        assert key in log, key
    (values,) = seen
    assert log["reward_std"] == pytest.approx(statistics.stdev(values))  # n - 1, as TRL
    # transformers' save_state(): trainer_state.json, which transformers reads back
    from transformers import TrainerState

    saved = TrainerState.load_from_json(str(trainer.save_state()))
    assert (saved.global_step, saved.max_steps) == (1, 1)
    assert saved.log_history == trainer.state.log_history
    assert log["rewards/half/std"] == pytest.approx(statistics.stdev(values))
    assert log["rewards/half/mean"] == pytest.approx(statistics.mean(values))


# -- a reward model as a reward function ----------------------------------------------------------
@pytest.fixture(scope="module")
def reward_model_folder(tmp_path_factory: pytest.TempPathFactory, char_tokenizer):
    """A tiny Llama with a one-logit sequence-classification head, saved with its tokenizer
    (and a chat template): a reward model folder built here, nothing downloaded."""
    from transformers import LlamaConfig, LlamaForSequenceClassification

    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=len(char_tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=2,
        num_labels=1,
        pad_token_id=char_tokenizer.pad_token_id,
    )
    model = LlamaForSequenceClassification(cfg)
    tok = __import__("copy").deepcopy(char_tokenizer)
    tok.chat_template = "{% for m in messages %}{{ m['content'] }}|{% endfor %}"
    dest = tmp_path_factory.mktemp("rm") / "tiny-rm"
    model.save_pretrained(dest)
    tok.save_pretrained(dest)
    return dest


def test_a_reward_model_scores_like_trl(reward_model_folder) -> None:
    """TRL's scoring of a reward model: the first logit on prompt + completion (on the chat
    template's rendering for messages), batched with right padding, no special tokens: each
    row's score equals the model's on that row alone, so padding never moves a score."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    from replayrl.api.reward_model import RewardModel

    rm = RewardModel(reward_model_folder)
    prompts, completions = ["12+34=", "7+8=", "1+1="], ["46", "15000", "2"]
    got = rm(prompts, completions, answer=["46", "15", "2"])
    model = AutoModelForSequenceClassification.from_pretrained(reward_model_folder).eval()
    tok = AutoTokenizer.from_pretrained(reward_model_folder)
    for p, c, score in zip(prompts, completions, got, strict=True):
        ids = tok(p + c, return_tensors="pt", add_special_tokens=False)
        with torch.no_grad():
            assert score == pytest.approx(float(model(**ids).logits[0, 0]), abs=1e-5)
    assert len(set(got)) == 3  # the head reads each row's own last token
    chat = rm([[{"role": "user", "content": "12+34="}]], [[{"role": "assistant", "content": "46"}]])
    ids = tok("12+34=|46|", return_tensors="pt", add_special_tokens=False)
    with torch.no_grad():
        assert chat[0] == pytest.approx(float(model(**ids).logits[0, 0]), abs=1e-5)


def test_a_reward_model_folder_or_object_trains_as_a_reward_function(
    tmp_path, reward_model_folder
) -> None:
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    from replayrl.api.config import ReplayConfig
    from replayrl.api.trainer import ReplayTrainer
    from replayrl.rollout.tasks import ArithmeticTask
    from tiny import TINY_MODEL

    rows = ArithmeticTask().sample_train(20, __import__("numpy").random.default_rng(0))
    args = _one_step(tmp_path / "r")
    trainer = ReplayTrainer(
        reward_funcs=[str(reward_model_folder)], args=args, train_dataset=rows, log=lambda _: None
    )
    trainer.train()
    (log,) = trainer.state.log_history
    assert "rewards/tiny-rm/mean" in log and log["reward"] == log["rewards/tiny-rm/mean"]
    assert log["reward_std"] > 0  # the model's scores differ between completions
    assert "reward model" in trainer.config.rewards[0].name
    # a loaded model with its tokenizer given as TRL's reward_processing_classes
    model = AutoModelForSequenceClassification.from_pretrained(reward_model_folder)
    tok = AutoTokenizer.from_pretrained(reward_model_folder)
    args2 = ReplayConfig("grpo", output_dir=str(tmp_path / "o"), max_steps=1, overrides=TINY_MODEL)
    again = ReplayTrainer(
        reward_funcs=[model], reward_processing_classes=[tok], args=args2, train_dataset=rows
    )
    assert again._rewards[0].fn.tokenizer is tok
    with pytest.raises(ValueError, match="reward_processing_classes has 2 entries for 1"):
        ReplayTrainer(reward_funcs=[model], reward_processing_classes=[tok, tok], args=args2)
