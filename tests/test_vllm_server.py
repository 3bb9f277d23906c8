"""rollout.backend=vllm_server against vLLM's real OpenAI server (CPU build, `make test-vllm`;
skipped where vLLM is not installed), started once for the module as `replayrl serve-vllm`
would start it: its samples reproduce and their log-probs are the learner's, a weight push
makes it compute with the pushed weights, and a run that pushes after every step samples from
the learner's policy at every step."""

from __future__ import annotations

import copy
import os
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest
import torch

pytest.importorskip("vllm", reason="the real-engine tier needs vllm (make test-vllm)")

from replayrl.config.schema import ModelConfig, load_config  # noqa: E402
from replayrl.learner.batching import collate  # noqa: E402
from replayrl.learner.logprobs import token_logprobs  # noqa: E402
from replayrl.models.loading import build_tiny_model  # noqa: E402
from replayrl.rollout.generation import Sample, SamplingParams  # noqa: E402
from replayrl.rollout.generation.vllm_server import (  # noqa: E402
    VLLMServerGenerator,
    server_command,
)
from replayrl.rollout.generation.vllm_settings import VLLMConfig  # noqa: E402
from tiny import TINY_RUN, as_rollouts  # noqa: E402

pytestmark = pytest.mark.vllm

# head size 32: the smallest the CPU build's attention takes (16 is refused at generate)
ENGINE_TINY = {"num_layers": 2, "hidden_size": 64, "num_heads": 2, "intermediate_size": 128}
PROMPTS = ["1+2=", "12+34=", "7+80="]
SAMPLE = SamplingParams(temperature=1.0, top_p=1.0, max_new_tokens=8)
TOL = 1e-4  # server vs learner fp32 log-probs
START_S = 400  # a loaded 2-core machine starts the server in 1-3 minutes


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def served(char_tokenizer, tmp_path_factory):
    """(the server's config, its model folder, the policy in it): one server for the module,
    in a process group of its own that is ended (SIGTERM, then SIGKILL) afterwards."""
    folder = tmp_path_factory.mktemp("served") / "model"
    model = build_tiny_model(
        ModelConfig.model_validate({"tiny": ENGINE_TINY}), len(char_tokenizer), 0
    ).eval()
    model.config.max_position_embeddings = 256
    model.save_pretrained(folder)
    char_tokenizer.save_pretrained(folder)
    cfg = VLLMConfig.model_validate(
        {
            "enforce_eager": True,
            "max_model_len": 192,
            "server": {"port": free_port(), "connect_timeout_s": START_S},
        }
    )
    argv, env = server_command(cfg, str(folder), "float32", seed=0)
    log = open(folder.parent / "server.log", "wb")  # noqa: SIM115 (closed at teardown)
    proc = subprocess.Popen(
        argv,
        env={**os.environ, **env, "VLLM_CPU_KVCACHE_SPACE": "1"},
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,  # its own process group: the engine core goes with it
    )
    try:
        yield cfg, folder, model, proc
    finally:
        for sig, wait in ((signal.SIGTERM, 30), (signal.SIGKILL, 10)):
            if proc.poll() is not None:
                break
            os.killpg(proc.pid, sig)
            try:
                proc.wait(wait)
            except subprocess.TimeoutExpired:
                pass
        log.close()


@pytest.fixture(scope="module")
def gen(served, char_tokenizer) -> VLLMServerGenerator:
    cfg, folder, _, proc = served
    t0 = time.monotonic()
    try:
        out = VLLMServerGenerator(char_tokenizer, cfg, [str(folder)], seed=0, tied_head=True)
    except Exception:
        tail = (folder.parent / "server.log").read_text(errors="replace")[-3000:]
        pytest.fail(f"the server did not start (exit {proc.poll()}):\n{tail}")
    print(f"server ready after {time.monotonic() - t0:.1f} s")
    return out


def learner_logprobs(model: torch.nn.Module, samples: list[Sample]) -> list[torch.Tensor]:
    """The learner's fp32 log pi(token) of each sample's completion (temperature 1)."""
    batch = collate(as_rollouts(samples, [0.0] * len(samples)), pad_id=0)
    with torch.no_grad():
        lp, _ = token_logprobs(model, batch, 1.0)
    mask = batch.mask.bool()
    return [lp[i][mask[i]] for i in range(len(samples))]


def max_gap(gen: VLLMServerGenerator, model: torch.nn.Module) -> float:
    """Largest |server - learner| log-prob over sampled completions of every prompt."""
    samples = gen.generate(PROMPTS, 4, SAMPLE)
    assert sum(s.completion_ids.numel() for s in samples) > 12
    learner = learner_logprobs(model, samples)
    return max((s.logprobs - lp).abs().max().item() for s, lp in zip(samples, learner, strict=True))


def perturbed(model: torch.nn.Module, scale: float = 0.3, seed: int = 1) -> torch.nn.Module:
    out = copy.deepcopy(model)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in out.parameters():
            p.add_(scale * torch.randn(p.shape, generator=g))
    return out


def test_samples_reproduce_and_their_logprobs_are_the_learners(gen, served):
    _, _, model, _ = served
    gen.policy_version = 3
    first = gen.generate(PROMPTS, 4, SAMPLE)
    gen.policy_version = 4
    other = gen.generate(PROMPTS, 4, SAMPLE)
    gen.policy_version = 3  # a resumed run at version 3: the same draws again
    again = gen.generate(PROMPTS, 4, SAMPLE)
    ids = [[s.completion_ids.tolist() for s in out] for out in (first, other, again)]
    assert ids[0] == ids[2] and ids[0] != ids[1]
    assert len({tuple(x) for x in ids[0][:4]}) > 1  # four samples, not one four times
    learner = learner_logprobs(model, first)
    gap = max((s.logprobs - lp).abs().max().item() for s, lp in zip(first, learner, strict=True))
    print(f"server vs learner log-prob gap {gap:.2e}")
    assert gap < TOL


def test_greedy_is_the_argmax(gen, served):
    _, _, model, _ = served
    for s in gen.generate(PROMPTS, 1, SamplingParams(max_new_tokens=6, greedy=True)):
        ids = torch.cat([s.prompt_ids, s.completion_ids])[None]
        with torch.no_grad():
            logits = model(ids).logits[0, s.prompt_ids.numel() - 1 : -1]
        assert torch.equal(logits.argmax(-1), s.completion_ids)


def test_pushed_weights_are_the_ones_it_samples_with(gen, served):
    _, _, model, _ = served
    new = perturbed(model)
    t0 = time.monotonic()
    gen.load_weights(new.named_parameters(), 5)
    print(f"weight push {time.monotonic() - t0:.2f} s")
    assert gen.policy_version == 5
    assert max_gap(gen, new) < TOL  # the server computes with the pushed weights...
    assert max_gap(gen, model) > 0.1  # ...not the ones it started with
    gen.load_weights(model.named_parameters(), 6)  # back, for the next test
    assert max_gap(gen, model) < TOL


def test_a_lora_policy_pushes_its_merged_weights(gen, served):
    pytest.importorskip("peft")
    from replayrl.models.loading import apply_lora, unwrap_model

    _, _, model, _ = served
    lora_cfg = ModelConfig.model_validate(
        {"tiny": ENGINE_TINY, "lora": {"enabled": True, "r": 2, "alpha": 8}}
    )
    policy = apply_lora(copy.deepcopy(model), lora_cfg, seed=0)
    with torch.no_grad():  # trained adapters: B != 0
        for name, p in policy.named_parameters():
            if "lora_B" in name:
                p.copy_(0.5 * torch.randn_like(p))
    assert max_gap(gen, policy) > 0.1
    gen.lora_scaling = lora_cfg.lora.alpha / lora_cfg.lora.r
    try:
        gen.load_weights(unwrap_model(policy).named_parameters(), 1)
        assert max_gap(gen, policy) < TOL
    finally:
        gen.lora_scaling = None
        gen.load_weights(model.named_parameters(), 0)


def test_a_push_drops_keys_and_values_cached_with_the_old_weights(gen, served):
    _, _, model, _ = served
    long = ["+".join(str(i) for i in range(50)) + "="]  # 140 tokens: a full block is cached
    gen.generate(long, 1, SAMPLE)
    stepped = perturbed(model, seed=6)
    gen.load_weights(stepped.named_parameters(), 8)
    samples = gen.generate(long, 4, SAMPLE)
    learner = learner_logprobs(stepped, samples)
    gap = max((s.logprobs - lp).abs().max().item() for s, lp in zip(samples, learner, strict=True))
    gen.load_weights(model.named_parameters(), 0)
    assert gap < TOL


def test_a_run_samples_from_the_learners_policy_after_every_push(served, tmp_path):
    """A 3-step GRPO run on the server's model: the learner's recomputed log pi_old of each
    step's fresh rollouts equals the server's log-probs, so each push reached the server."""
    from replayrl.run.metrics import read_metrics
    from replayrl.run.start import train

    cfg_v, folder, _, _ = served

    cfg = load_config(
        "grpo",
        [
            *TINY_RUN,
            f"model.path={folder}",
            "rollout.backend=vllm_server",
            f"vllm.server.port={cfg_v.server.port}",
            "rollout.max_new_tokens=6",
            "precision.generation=float32",
            "train.device=cpu",
            "train.threads=1",
            "train.steps=3",
            "train.lr=0.01",  # steps that move the policy well past the tolerance
            "eval.num_prompts=4",
            f"logging.run_dir={tmp_path}",
            "rewards=[{name: digits_format}]",  # some groups vary: the tiny model is never right
        ],
    )
    summary = train(cfg)
    rows = [
        r for r in read_metrics(Path(summary["run_dir"]) / "metrics.jsonl") if "reward/mean" in r
    ]
    assert len(rows) == 3
    for row in rows:
        assert row["train/behaviour_mismatch_max"] < TOL, row
    assert sum(row["train/grad_norm"] > 0 for row in rows) >= 1  # it trained
