"""GPU code paths checked on CPU: tensors that act like CUDA ones where it matters (no
`.numpy()` without `.cpu()`), bf16 parameters, gloo ranks standing in for NCCL ones."""

from __future__ import annotations

import sys

import numpy as np
import pytest
import torch

from replayrl.run.distributed.ddp import weights_digest
from tiny import tiny_config


class DeviceTensor(torch.Tensor):
    """A CPU tensor that refuses `.numpy()` as a CUDA tensor does; `.cpu()` gives a plain one."""

    def numpy(self, *args, **kwargs):  # type: ignore[override]
        raise TypeError("can't convert cuda:0 device type tensor to numpy")

    def cpu(self, *args, **kwargs):  # type: ignore[override]
        return self.as_subclass(torch.Tensor)


def test_weights_digest_of_bf16_weights_hashes_their_bytes():
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3).to(torch.bfloat16)
    before = weights_digest(model)
    assert before == weights_digest(model)
    with torch.no_grad():
        model.bias[0] += 1
    assert weights_digest(model) != before


def test_grad_probe_moves_device_gradients_to_the_host(monkeypatch, tiny_model, char_tokenizer):
    import copy

    from replayrl.config.schema import load_config
    from replayrl.data.rollout_record import Rollout
    from replayrl.learner.grad_probe import sample_gradients
    from replayrl.learner.learner import Learner

    real_cat = torch.cat

    def cat(*args, **kwargs):
        out = real_cat(*args, **kwargs)
        caller = sys._getframe(1).f_globals.get("__name__", "")
        return out.as_subclass(DeviceTensor) if caller.endswith("grad_probe") else out

    monkeypatch.setattr(torch, "cat", cat)
    ids = char_tokenizer("12+34=", add_special_tokens=False)["input_ids"]
    row = Rollout(torch.tensor(ids), torch.tensor(ids[:3]), torch.zeros(3), 1, 1, True, 0, 0, 0)
    learner = Learner(copy.deepcopy(tiny_model), char_tokenizer.pad_token_id, load_config(None))
    g = sample_gradients(learner, [row, row], dims=16)
    assert g.shape == (2, 16) and abs(g[0]).max() > 0


def test_ray_followers_freeze_the_policy_when_rank_zero_does(monkeypatch):
    """Rank 0 trains only the critic during `critic.warmup_steps`; a follower that trains the
    policy there makes an extra all-reduce and NCCL hangs."""
    from types import SimpleNamespace

    from replayrl.config.schema import load_config
    from replayrl.run.distributed import ray_runtime

    cfg = load_config(None, ["algorithm.advantage=gae", "critic.warmup_steps=2"])
    calls: list[bool] = []
    learner = SimpleNamespace(
        cfg=cfg,
        critic=object(),
        version=0,
        train_step=lambda batch, rng, **kw: calls.append(kw.get("policy_frozen", False)),
    )
    follower = ray_runtime.FollowerActor.__new__(ray_runtime.FollowerActor)
    follower.learner, follower.rng, follower.epochs = learner, None, 1
    monkeypatch.setattr(ray_runtime, "_ray", lambda: SimpleNamespace(get=lambda ref: ref))
    shard = SimpleNamespace(call=SimpleNamespace(remote=lambda *a: []))
    for step in (1, 2, 3):
        follower.train_step(shard, 2, 0, step)
    assert calls == [True, True, False]


def test_fp16_learning_is_refused_at_config_load_and_points_to_bf16():
    """fp16 gradients underflow without a loss scaler, which the learner does not run."""
    from replayrl.api.trainer import ReplayConfig
    from replayrl.config.schema import ConfigError, load_config

    with pytest.raises(ConfigError, match="learner_autocast=bfloat16"):
        load_config(None, ["precision.learner_autocast=float16"])
    with pytest.raises(ConfigError) as refused:
        ReplayConfig("grpo", fp16=True).to_config()
    assert "bf16=True" in str(refused.value) and "float16" not in str(refused.value)


def test_a_policy_the_trainer_loads_itself_goes_to_train_device(monkeypatch):
    """model="path" (or none) with rewards or a dataset: the trainer loads the policy and
    hands it to the loop, which keeps a handed-over object where it is, so the trainer must
    place it (a stand-in device, meta, plays the GPU)."""
    from replayrl.api.config import ReplayConfig
    from replayrl.api.trainer import ReplayTrainer
    from replayrl.models import device
    from replayrl.models.device import model_device
    from tiny import TINY_MODEL

    asked: list[str] = []

    def resolve(spec: str) -> torch.device:
        asked.append(spec)
        return torch.device("meta")

    args = ReplayConfig("grpo", overrides=[*TINY_MODEL, "train.device=auto"])
    ReplayTrainer(args=args, log=lambda _: None)._load_policy()  # its warm start, cached on CPU
    monkeypatch.setattr(device, "resolve_device", resolve)
    trainer = ReplayTrainer(args=args, log=lambda _: None)
    trainer._load_policy()
    assert asked == ["auto"] and trainer._model is not None
    assert model_device(trainer._model).type == "meta"


def test_the_run_says_where_its_policy_trains(tmp_path):
    from replayrl.run.components import place_policy

    model = torch.nn.Linear(2, 2)
    lines: list[str] = []
    cfg = tiny_config(tmp_path, "train.device=auto")
    out, _, _ = place_policy(cfg, torch.device("cuda"), lines.append, policy=(model, None, ""))
    assert out is model and lines == ["policy trains on cpu (train.device=auto)"]


def test_each_async_local_engine_sees_only_its_own_gpu(monkeypatch, tmp_path, char_tokenizer):
    """A worker on cuda:2 is pinned (CUDA_VISIBLE_DEVICES=2) before CUDA starts, so its vLLM
    engine, which takes the first GPU it sees, runs on GPU 2, not GPU 0; the stand-in records
    what the engine sees. Pinning maps through the GPUs the parent already sees."""
    import fake_vllm
    from replayrl.rollout.generation.vllm import VLLMGenerator
    from replayrl.rollout.generation.vllm_settings import VLLMConfig
    from replayrl.run.distributed.gpus import pin_process_to
    from replayrl.run.distributed.local import pinned_to_own_gpu

    fake_vllm.install(monkeypatch)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    cfg = pinned_to_own_gpu(tiny_config(tmp_path, "rollout.backend=vllm", "train.device=cuda:2"))
    assert cfg.train.device == "cuda:0"
    VLLMGenerator("/m", char_tokenizer, VLLMConfig(), device=torch.device(cfg.train.device))
    assert fake_vllm.LLM.instances[-1].visible_devices == "2"
    env = {"CUDA_VISIBLE_DEVICES": "4,5,6"}
    assert pin_process_to("cuda:1", env) == "cuda:0" and env["CUDA_VISIBLE_DEVICES"] == "5"
    assert pin_process_to("cpu", env) == "cpu" and env["CUDA_VISIBLE_DEVICES"] == "5"
    for unpinned in ("auto", "cuda"):  # names no single GPU: the worker's default (auto)
        assert pin_process_to(unpinned, env) == unpinned and env["CUDA_VISIBLE_DEVICES"] == "5"
    with pytest.raises(ValueError, match="sees only GPUs 4,5,6"):
        pin_process_to("cuda:3", {"CUDA_VISIBLE_DEVICES": "4,5,6"})


def test_an_engine_beside_a_policy_on_another_gpu_is_refused(monkeypatch, char_tokenizer):
    """Sync mode with train.device=cuda:1: the engine would take GPU 0; refused with the fix."""
    import fake_vllm
    from replayrl.rollout.generation.vllm import VLLMGenerator
    from replayrl.rollout.generation.vllm_settings import VLLMConfig

    fake_vllm.install(monkeypatch)
    with pytest.raises(ValueError, match="CUDA_VISIBLE_DEVICES=1 and train.device=cuda"):
        VLLMGenerator("/m", char_tokenizer, VLLMConfig(), device=torch.device("cuda:1"))
    assert not fake_vllm.LLM.instances


def test_ray_gpu_requests_take_one_gpu_per_actor_or_refuse():
    from replayrl.run.distributed.gpus import ray_gpu_requests

    lines: list[str] = []

    def ask(device, backend="hf", learners=1, generators=2, req=(0.0, 0.0), gpus=4.0):
        return ray_gpu_requests(device, backend, learners, generators, req, gpus, lines.append)

    assert ask("auto") == (1.0, 1.0) and "taking ray.learner_num_gpus=1" in lines[0]
    assert ask("auto", gpus=0) == (0.0, 0.0)  # a CPU cluster: nothing to ask for
    assert ask("cpu") == (0.0, 0.0)
    with pytest.raises(ValueError, match="set ray.generator_num_gpus=1 "):
        ask("cpu", backend="vllm")  # vLLM needs a GPU even when the learner needs none
    assert ask("cuda", req=(1.0, 0.5)) == (1.0, 0.5)
    with pytest.raises(ValueError, match="ray.learner_num_gpus=1 ray.generator_num_gpus=1"):
        ask("cuda")
    with pytest.raises(ValueError, match="generator actors ask for none"):
        ask("auto", backend="vllm", req=(1.0, 0.0), gpus=2)  # 1 + 2 GPUs wanted, 2 there
    with pytest.raises(ValueError, match="NCCL group"):
        ask("cuda", learners=2, req=(0.5, 1.0))


def test_ray_run_asks_for_the_gpus_it_trains_on(monkeypatch, tmp_path):
    """On a cluster with GPUs, `auto` with the default 0 GPUs asks Ray for 1 per actor, in
    the learner actor's request and in the config every actor reads."""
    from types import SimpleNamespace

    import yaml

    from replayrl.run.distributed import ray_runtime

    class Started(Exception):
        pass

    asked: list[dict] = []

    def remote(**kwargs):
        asked.append(kwargs)

        def start(cfg_yaml, *_):
            asked.append(yaml.safe_load(cfg_yaml)["ray"])
            raise Started

        actor = SimpleNamespace(remote=start)
        return lambda cls: SimpleNamespace(options=lambda **_: actor)

    fake = SimpleNamespace(
        is_initialized=lambda: True,
        cluster_resources=lambda: {"GPU": 8.0},
        nodes=lambda: [{"Alive": True, "Resources": {"CPU": 8.0, "GPU": 8.0}}],
        remote=remote,
    )
    monkeypatch.setattr(ray_runtime, "_ray", lambda: fake)
    cfg = tiny_config(tmp_path, "runtime=ray", "train.device=auto")
    with pytest.raises(Started):
        ray_runtime.RayDriver(cfg, tmp_path, log=lambda _: None).run()
    assert asked[0]["num_gpus"] == 1.0
    assert asked[1]["learner_num_gpus"] == 1.0 and asked[1]["generator_num_gpus"] == 1.0


def test_warm_ups_train_on_the_runs_device(monkeypatch):
    """The tiny model's warm start (and model.sft's warm-up, same path) trains on the device
    load_policy is given (train.device), not on the CPU of a GPU machine."""
    from replayrl.config.schema import ModelConfig, TaskConfig
    from replayrl.run import policy, warmstart

    seen: list[torch.device] = []

    def spy(*args, **kwargs) -> float:
        seen.append(kwargs["device"])
        return 0.0

    monkeypatch.setattr(warmstart, "_sft_phase", spy)
    cfg = ModelConfig.model_validate(
        {"tiny": {"num_layers": 1, "hidden_size": 32, "num_heads": 2, "intermediate_size": 64},
         "warmstart": {"steps": 3, "mistake_steps": 2, "seed": 9876}}
    )  # fmt: skip
    policy.load_policy(cfg, TaskConfig(), log=lambda _: None, device="meta")
    assert seen == [torch.device("meta")] * 2


def test_sft_phase_moves_the_model_and_batches_to_its_device(
    monkeypatch, tiny_model, char_tokenizer
):
    from replayrl.run.warmstart import _sft_phase

    class Teacher:
        def sft_pairs(self, n, rng, error_rate):
            return [("1+2=", "3")] * n

    inputs: list[torch.device] = []
    moved: list[torch.device] = []
    model = __import__("copy").deepcopy(tiny_model)
    real_to = type(model).to
    monkeypatch.setattr(
        type(model), "to", lambda m, d: moved.append(torch.device(d)) or real_to(m, d)
    )
    model.register_forward_pre_hook(
        lambda m, a, kw: inputs.append(kw["input_ids"].device), with_kwargs=True
    )
    loss = _sft_phase(
        model,
        char_tokenizer,
        Teacher(),
        np.random.default_rng(0),
        2,
        2,
        1e-3,
        0.0,
        device=torch.device("cpu"),
    )
    assert (
        np.isfinite(loss) and moved == [torch.device("cpu")] and inputs == [torch.device("cpu")] * 2
    )


def test_the_critic_runs_under_the_learners_autocast(tmp_path):
    import numpy as np

    from replayrl.run.components import build_components

    cfg = tiny_config(
        tmp_path, "algorithm.advantage=gae", "precision.learner_autocast=bfloat16",
        "train.device=cpu",
    )  # fmt: skip
    parts = build_components(cfg, log=lambda _: None)
    seen: list[bool] = []
    parts.learner.critic.backbone.register_forward_hook(
        lambda *_: seen.append(torch.is_autocast_enabled("cpu"))
    )
    rollouts = parts.producer.produce(0, step=0, group_base=0).rollouts
    metrics = parts.learner.train_step(rollouts, np.random.default_rng(0), step=1)
    assert np.isfinite(metrics["loss"]) and seen and all(seen)


def test_ported_trl_config_gets_trls_is_default_with_a_note_and_server_keys_are_refused():
    from replayrl.api.trl_args import translate
    from replayrl.config.schema import ConfigError

    t = translate(
        {"vllm_importance_sampling_mode": "sequence_mask", "vllm_importance_sampling_cap": 3.0},
        {},
    )  # fmt: skip
    assert t.dotted["precision.importance_sampling_mode"] == "sequence_mask"
    assert t.dotted["vllm.truncated_is_cap"] == 3.0
    assert any("sequence_mask" in n and "token_truncate at 2.0" in n for n in t.vllm_notes)
    bare = translate({"vllm_importance_sampling_mode": "token_mask"}, {})
    assert bare.dotted["vllm.truncated_is_cap"] == 3.0  # TRL's default cap
    assert "precision.importance_sampling_mode" not in translate({}, {}).dotted
    for bad in (
        {"vllm_model_impl": "transformers"},
        {"vllm_group_port": 9000},
    ):
        with pytest.raises(ConfigError, match="not supported"):
            translate(bad, {})


def test_learner_weighs_tokens_in_the_configured_is_mode(tmp_path):
    """sequence_mask: a rollout whose sampler/learner sequence ratio passes C gets weight 0."""
    import dataclasses

    from replayrl.run.components import build_components

    cfg = tiny_config(
        tmp_path, "precision.recompute_behaviour_logprobs=always", "train.device=cpu",
        "precision.truncated_is_cap=3.0", "precision.importance_sampling_mode=sequence_mask",
    )  # fmt: skip
    parts = build_components(cfg, log=lambda _: None)
    rollouts = parts.producer.produce(0, step=0, group_base=0).rollouts
    far = dataclasses.replace(
        rollouts[0], extras={"sampler_logprobs": rollouts[0].behaviour_logprobs - 5.0}
    )
    batch = [far, rollouts[1]]
    b, lengths = parts.learner.assembly.collate(batch)
    b = parts.learner.frozen.fields(batch, b, lengths, [False, False], step=1)
    w, mask = b.tis_weights, b.mask.bool()
    assert w is not None
    assert torch.equal(w[0][mask[0]], torch.zeros_like(far.behaviour_logprobs))
    assert torch.equal(w[1][mask[1]], torch.ones_like(rollouts[1].behaviour_logprobs))
    assert not bool(w[~mask].any())  # zero off the completion tokens


def test_hf_decoding_reads_the_device_once_every_k_tokens(monkeypatch, tiny_model, char_tokenizer):
    """On a GPU the decode loop looks at which rows finished every 8 tokens, not twice per
    token (each look is a host sync); the samples are still cut at their first stop."""
    from replayrl.rollout.generation import HFGenerator, SamplingParams, hf

    assert hf.host_check_every(torch.device("cuda")) == 8
    assert hf.host_check_every(torch.device("cpu")) == 1
    monkeypatch.setattr(hf, "host_check_every", lambda device: 8)
    reads = {"n": 0}
    for name in ("__bool__", "__int__", "item"):
        real = getattr(torch.Tensor, name)

        def counted(self, *a, _real=real, **k):
            reads["n"] += 1
            return _real(self, *a, **k)

        monkeypatch.setattr(torch.Tensor, name, counted)
    gen = HFGenerator(tiny_model, char_tokenizer, 8, impl="fast")
    gen.stop_ids = [char_tokenizer.eos_token_id, char_tokenizer("3")["input_ids"][-1]]
    real_samples, loop_reads = gen._samples, []

    def samples_of(*args):
        loop_reads.append(reads["n"])  # the decode loop's reads, before the host-side cut
        return real_samples(*args)

    monkeypatch.setattr(gen, "_samples", samples_of)
    torch.manual_seed(0)
    reads["n"] = 0
    samples = gen._generate_batch_fast(
        tiny_model, [(0, char_tokenizer("1+2=")["input_ids"], 4)], SamplingParams(max_new_tokens=32)
    )
    assert loop_reads[0] <= 32 // 8 and len(samples) == 4
    for s in samples:
        hits = [i for i, t in enumerate(s.completion_ids.tolist()) if t in gen.stop_ids]
        assert hits == ([] if s.truncated else [len(s.completion_ids) - 1])


def test_documented_gpu_check_commands_are_the_ones_the_check_runs():
    import re
    import subprocess
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    page = (root / "docs" / "gpu.md").read_text()
    section = page.split("## Checking a GPU machine", 1)[1].split("\n## ", 1)[0]
    block = re.findall(r"```bash\n(.*?)```", section, re.S)[-1]
    lines = [ln.split("#")[0].split() for ln in block.splitlines()]
    script = (root / "scripts" / "gpu_check.sh").read_text()
    marked = subprocess.run(
        ["grep", "-l", "^@pytest.mark.gpu", *sorted(map(str, (root / "tests").glob("test_*.py")))],
        capture_output=True, text=True, check=True,
    ).stdout.split()  # fmt: skip
    pytest_line = next(ln for ln in lines if ln[:3] == ["python", "-m", "pytest"])
    assert pytest_line[3:6] == ["-q", "-m", "gpu"] and "-m pytest -q -m gpu" in script
    assert sorted(pytest_line[6:]) == sorted(str(Path(m).relative_to(root)) for m in marked)
    check_line = next(ln for ln in lines if ln[:2] == ["python", "scripts/gpu_check.py"])
    assert " ".join(check_line[1:3]) + ' "$OUT"' in script and "--steps 10" in script
    assert ["make", "gpu-bundle", "PY=3.12"] in lines and [
        "bash",
        "scripts/gpu_check.sh",
        "out",
    ] in lines


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_broadcast_and_object_store_syncs_give_generators_identical_weights(dtype):
    """The learner (rank 0) broadcasts over gloo to two generator processes; the object-store
    path serialises a host copy. Both send the generation dtype and leave the same weights."""
    import copy

    from replayrl.run.distributed.broadcast import broadcast_sync_figures, object_store_sync
    from replayrl.run.distributed.weights import trainable_state

    torch.manual_seed(0)
    learner = torch.nn.Sequential(torch.nn.Linear(5, 7), torch.nn.Linear(7, 3))
    learner[1].bias.requires_grad_(False)  # frozen: not sent, left as the generators have it
    stale = [copy.deepcopy(learner) for _ in range(3)]
    for m in stale:
        with torch.no_grad():
            for p in m.parameters():
                p.mul_(0.5)
    figures, received = broadcast_sync_figures(learner, stale[:2], dtype, repeats=2)
    object_store_sync(learner, stale[2], dtype)
    via_store = trainable_state(stale[2])
    want = {
        n: p.detach().to(dtype).float() for n, p in learner.named_parameters() if p.requires_grad
    }
    assert len(received) == 2 and set(via_store) == set(want)
    for got in received:
        assert set(got) == set(want)
        for n in want:
            assert torch.equal(got[n], via_store[n]) and torch.equal(got[n], want[n])
    assert figures["bytes"] == sum(t.numel() for t in want.values()) * torch.finfo(dtype).bits // 8
    assert figures["seconds"] > 0


def test_ray_weight_sync_sends_the_generation_dtype(tmp_path):
    from types import SimpleNamespace

    from replayrl.run.distributed import ray_runtime

    put: list[dict] = []
    pool = ray_runtime.RayGeneratorPool.__new__(ray_runtime.RayGeneratorPool)
    pool.cfg = tiny_config(tmp_path, "precision.generation=bfloat16")
    pool.ray = SimpleNamespace(put=lambda state: put.append(state) or "ref")
    pool.sync_path = "object_store"
    model = torch.nn.Linear(3, 2)
    pool.publish(model, 4)
    assert pool.weights == "ref" and pool.version == 4
    assert {t.dtype for t in put[0].values()} == {torch.bfloat16}
    assert torch.equal(put[0]["weight"], model.weight.detach().to(torch.bfloat16))
    # the broadcast path snapshots the same version, packed, in the same dtype
    from replayrl.run.distributed.broadcast import unpack
    from replayrl.run.distributed.weight_sync import BroadcastSender

    pool.sync_path, pool.sender = "broadcast", BroadcastSender(pool.ray, 1)
    pool.publish(model, 5)
    assert len(put) == 1 and pool.version == 5  # nothing through the object store
    before = model.weight.detach().clone()
    with torch.no_grad():
        model.weight.add_(1.0)  # the learner trains on; the snapshot keeps version 5
    sent = unpack(pool.sender.flat, pool.sender.layout)
    assert pool.sender.flat.dtype == torch.bfloat16
    assert torch.equal(sent["weight"], before.to(torch.bfloat16))


@pytest.mark.slow
def test_bench_speed_weight_sync_reports_bytes_and_seconds_of_both_paths(capsys):
    from types import SimpleNamespace

    from replayrl.bench.speed import main

    args = SimpleNamespace(
        sections=["weight_sync"], model="tiny", threads=1, repeats=1, samples=None, json=None
    )
    assert main(args) == 0
    out = capsys.readouterr().out
    rows = [ln.split() for ln in out.splitlines() if "MiB" in ln]
    assert {r[1] for r in rows} == {"object_store", "broadcast_gloo"}
    for dtype in {r[0] for r in rows}:  # the same weights cross both paths
        sizes = {r[1]: float(r[2]) for r in rows if r[0] == dtype}
        assert sizes["broadcast_gloo"] > 0
        assert abs(sizes["object_store"] - sizes["broadcast_gloo"]) < 0.1 * sizes["broadcast_gloo"]
    assert all(float(r[4]) > 0 for r in rows)
